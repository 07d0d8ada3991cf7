"""The replay's report: one run as text (:func:`format_result`), hit rate and tokens saved
against pool size as a PNG (:func:`plot_results`), and the atomic write the CLI's
outputs go through."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .config import parse_placement
from .errors import ReplayError
from .result import ReplayResult

__all__ = ["format_result", "plot_results"]


def _pct(x: float) -> str:
    return f"{100.0 * x:.2f}%"


def _occupancy_line(r: ReplayResult) -> str:
    """Mean and peak shares of the pool over the run's occupancy samples."""
    samples = r.occupancy
    units = int(r.geometry["pool_units"])
    if not samples or not units:
        return "  pool occupancy: no samples"
    cols = list(zip(*samples, strict=True))
    kv, ckpt, cached = cols[1], cols[2], cols[3]

    def mean(xs: Sequence[float]) -> float:
        return sum(xs) / len(xs) / units

    return (
        f"  pool occupancy ({len(samples)} samples): running KV {_pct(mean(kv))} mean,"
        f" checkpoint images {_pct(mean(ckpt))} mean / {_pct(max(ckpt) / units)} peak,"
        f" cached KV {_pct(mean(cached))} mean"
    )


def format_result(r: ReplayResult) -> str:
    """A human-readable report of one run."""
    cfg, g, c, f = r.config, r.geometry, r.counters, r.fates
    s = r.summary()
    t = r.timings_us["overall"]
    lines = [
        f"{cfg['model_id']}  pool {cfg['pool_gib']:g} GiB = {g['pool_units']:,} units of"
        f" {g['unit_bytes']:,} B ({cfg['kv_block_tokens']} tokens)  image {g['image_bytes']:,} B"
        f" = {g['image_units']} units  placement {cfg['placement']}"
        + ("  offload" if cfg["offload"] else "")
        + (f"  abort-rate {cfg['abort_rate']:g}" if cfg["abort_rate"] else ""),
        f"  requests {c['requests']:,}: completed {c['completed']:,}, aborted {c['aborted']:,},"
        f" rejected {c['rejected']:,}; peak running {c['peak_running']}; passes {c['passes']:,}",
        f"  hit rate: {_pct(s['hit_rate_blocks'])} of prompt blocks"
        f" (HBM {_pct(s['hbm_hit_rate_blocks'])}, CPU tier {_pct(s['cpu_hit_rate_blocks'])};"
        f" KV prefix alone {_pct(s['kv_hit_rate_blocks'])}), {_pct(s['hit_rate_tokens'])} of"
        f" prompt tokens",
        f"  prefill tokens saved: {c['saved_tokens']:,} of {c['prompt_tokens']:,}",
        f"  checkpoints: filed {c['checkpoints_filed']:,}, kept {f['checkpoints_kept']:,},"
        f" dropped {f['checkpoints_dropped']:,}, evicted {f['checkpoints_evicted']:,},"
        f" orphaned {f['checkpoints_orphaned']:,}, forfeited (offload pins reclaimed)"
        f" {f['offload_pins_reclaimed']:,}",
        f"  restores: HBM {c['hits']:,}, CPU tier {c['cpu_hits']:,}"
        + (
            f"; run on {r.executor.get('kind', '?')} tensors, {c['restores_checked']:,} checked"
            " bit-exact"
            if r.executor
            else ""
        ),
        _occupancy_line(r),
        f"  store calls {int(t['calls']):,}: {t['mean']:.2f} us/call mean, p50 {t['p50']:.2f},"
        f" p99 {t['p99']:.2f}; wall {r.wall_s:.1f} s"
        + ("; verified against the reference" if r.verified else ""),
    ]
    return "\n".join(lines)


def plot_results(results: Sequence[ReplayResult], out: Path) -> None:
    """Hit rate and prefill tokens saved against pool size, one line per placement.

    Raises:
        ReplayError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReplayError("--plot needs matplotlib: pip install 'pagedstate[plot]'") from None
    by: dict[str, list[ReplayResult]] = {}

    # a fixed order (end, anchor, then the grids by K), so a placement keeps its colour
    # from one plot to the next
    def order(r: ReplayResult) -> tuple[int, int]:
        kind, k = parse_placement(r.config["placement"])
        return ({"end": 0, "anchor": 1}.get(kind, 2), k)

    for r in sorted(results, key=order):
        by.setdefault(r.config["placement"], []).append(r)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for placement, rs in by.items():
        rs = sorted(rs, key=lambda r: r.config["pool_gib"])
        xs = [r.config["pool_gib"] for r in rs]
        a.plot(xs, [100 * r.summary()["hit_rate_tokens"] for r in rs], marker="o", label=placement)
        b.plot(xs, [r.counters["saved_tokens"] / 1e6 for r in rs], marker="o", label=placement)
    first = results[0]
    model = first.config["model_id"]
    n = first.counters["requests"]
    for ax, label in (
        (a, "prompt tokens served from a checkpoint (%)"),
        (b, "prefill tokens saved (millions)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r.config["pool_gib"] for r in results}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("unit pool (GiB)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(title="placement")
    fig.suptitle(f"{model}: {n:,} requests, {first.config['kv_block_tokens']}-token KV pages")
    fig.tight_layout()
    _atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write ``path`` through a temporary file in its folder, renamed at the end."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        mask = os.umask(0)  # mkstemp made it 0600: give it the mode a plain open would
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
