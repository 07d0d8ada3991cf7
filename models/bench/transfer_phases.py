"""``python -m pagedstate.models.bench.transfer_phases``: the transfer's device-local
phases on one device, the driver's per-image path against the copy engine's one launch per
round, each against a device-to-device copy of the same bytes in the same run.

The two-rank benchmark (:mod:`pagedstate.models.bench.transfer`) needs two GPUs. The
sender's **gather** (an image's unit regions into its staging buffer) and the receiver's
**landing** (the buffer into the reserved units) are device-local and were a third of its
time per image on two H200s (docs/transfer.md, the phase table): they are measured here on
one device, with the driver's own objects (a :class:`~pagedstate.impl.transfer.Sender` and
a :class:`~pagedstate.impl.transfer.Receiver` on one device, their pools, coordinators and
tensors), per round of ``window`` images:

- **index**: ``Sender.gather_round`` and ``Receiver.land_round`` of the driver with
  ``copy_engine="index"``, the staged path as the two-GPU run of docs/transfer.md ran it,
  per image: the unit ids to the device (a blocking host-to-device copy), one
  ``index_select`` per region into a scratch and one strided copy into the staging
  buffer, and for the landing one ``index_copy_`` per region;
- **engine**: the same calls with ``copy_engine="triton"`` (``--engine``; the CUDA
  default), :class:`~pagedstate.impl.transfer.staging.StagingRows`: the round's images
  gathered by one batch of restore ops into the staging rows and landed by one batch of
  store ops, one Triton launch each;
- **D2D**: one ``copy_`` of ``window x image_bytes`` bytes between two device buffers.

Each is timed on the host from before the first call to after a device synchronize (the
median of ``--repeat`` rounds after ``--warmup`` untimed ones), in one process, paths
interleaved round by round. ``host us`` is the time until the calls returned, before the
synchronize. Every path's bytes are checked once against the image regenerated from its seed (the
gathered bytes and the landed units); a mismatch fails the run.

``--device cpu`` (with ``--quick``: a slice of the geometry) is a smoke run; the figures
that matter are CUDA's.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pagedstate.models._provenance import commit

from .transfer import _ints

__all__ = ["main", "measure", "render"]

_driver: Any = importlib.import_module("pagedstate.impl.transfer")
_staging: Any = importlib.import_module("pagedstate.impl.transfer.staging")

MODEL = "Qwen/Qwen3-Next-80B-A3B-Instruct"
QUICK_SLICE = (1, 2, 32)


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(torch: Any, device: Any, fn: Callable[[], None]) -> tuple[float, float]:
    """``fn()`` then a device synchronize: (host seconds until fn returned, seconds until
    the device finished)."""
    _sync(torch, device)
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    _sync(torch, device)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0


def _gather_into(snd: Any, outs: Sequence[Any], wires: list[Any]) -> None:
    wires.extend(snd.gather_round(outs))


def _one_config(
    block_tokens: int,
    window: int,
    device: str,
    engine: str,
    warmup: int,
    repeat: int,
    slice_: tuple[int, int, int] | None,
    model: str,
) -> dict[str, Any]:
    torch = importlib.import_module("torch")
    upi = _driver.image_units(model, slice_, block_tokens)
    on_cuda = device.startswith("cuda")
    if engine == "auto":
        engine = "triton" if on_cuda else "torch"

    def side_pair(copy_engine: str) -> tuple[Any, Any]:
        cfg = _driver.TransferConfig(
            model=model,
            block_tokens=block_tokens,
            slice=slice_,
            images=window,
            window=window,
            slots=window,
            units=window * upi,
            receiver_units=window * upi,
            local_restore=False,
            copy_engine=copy_engine,
            backend="nccl" if on_cuda else "gloo",
            device="cuda" if on_cuda else "cpu",
        )
        # One device for both sides: the driver's classes take the device per rank.
        snd, rcv = _driver.Sender(cfg, device), _driver.Receiver(cfg, device)
        snd.prefill()
        return snd, rcv

    # The same driver, two ways (module doc): its per-image index path and the copy engine.
    sides = {"index": side_pair("index"), "engine": side_pair(engine)}
    s, r = sides["engine"]
    if s.rows is None:
        raise RuntimeError(f"copy engine {engine!r} gave no staging rows on {device}")
    dev = s.device
    n = s.layout.image_bytes
    src = torch.empty(window * n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    src.random_(0, 256)

    def accept_all(rcv: Any, outs: Sequence[Any]) -> list[Any]:
        incs = []
        for k, o in enumerate(outs):
            got = rcv.accept(o.header, k)
            if not isinstance(got, _driver.Incoming):
                raise RuntimeError(f"the receiver refused image {k}: {got}")
            incs.append(got)
        return incs

    samples: dict[str, list[tuple[float, float]]] = {
        k: [] for k in ("index gather", "engine gather", "index land", "engine land", "d2d")
    }
    mismatches = 0
    for it in range(warmup + repeat):
        keep = it >= warmup
        for path, (snd, rcv) in sides.items():
            outs = [snd.lease(i) for i in range(window)]
            wires: list[Any] = []
            g = _timed(torch, dev, functools.partial(_gather_into, snd, outs, wires))
            for o in outs:
                snd.finish(o)
            incs = accept_all(rcv, outs)
            for k, w in enumerate(wires):  # the wire, in one process (untimed)
                rcv.buffers(incs[k], rcv.staging[k])[0].copy_(w)
            land_t = _timed(torch, dev, functools.partial(rcv.land_round, incs))
            if it == 0:  # check the bytes once per path
                for k, inc in enumerate(incs):
                    want = snd.image(snd.keys[k])
                    landed = rcv.tensors.read_units(list(inc.units)).view(torch.uint8)[:n]
                    mismatches += int(not torch.equal(wires[k], want))
                    mismatches += int(not torch.equal(landed, want))
            for inc in incs:
                rcv.abort(inc)
            if keep:
                samples[f"{path} gather"].append(g)
                samples[f"{path} land"].append(land_t)
        d = _timed(torch, dev, lambda: dst.copy_(src))
        if keep:
            samples["d2d"].append(d)
    for snd, rcv in sides.values():
        if rcv.accounting()["transfers"] or snd.accounting()["offload_pins"]:
            raise RuntimeError(f"the benchmark leaked a reservation or a lease: {rcv.accounting()}")
    med = {
        k: (statistics.median(h for h, _ in v), statistics.median(w for _, w in v))
        for k, v in samples.items()
    }
    d2d = med["d2d"][1]
    out: dict[str, Any] = {
        "model": model,
        "block_tokens": block_tokens,
        "window": window,
        "image_bytes": n,
        "units": upi,
        "pieces": len(s.pieces),
        "engine": s.copy_engine,
        "d2d_s": d2d,
        "mismatches": mismatches,
        "samples": {k: [list(x) for x in v] for k, v in samples.items()},
    }
    for name in ("index gather", "engine gather", "index land", "engine land"):
        host, wall = med[name]
        out[name] = {
            "round_s": wall,
            "host_s": host,
            "per_image_ms": wall / window * 1e3,
            "gb_s": window * n / wall / 1e9,
            "vs_d2d": d2d / wall,
        }
    return out


def measure(
    block_tokens: Sequence[int],
    windows: Sequence[int],
    device: str,
    engine: str = "auto",
    warmup: int = 3,
    repeat: int = 10,
    slice_: tuple[int, int, int] | None = None,
    model: str = MODEL,
    say: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every (page size, window) row (module doc): per path, ``round_s`` and ``host_s``
    (seconds per round: until the device finished, until the calls returned),
    ``per_image_ms``, ``gb_s`` (10^9 bytes per second) and ``vs_d2d`` (the D2D copy's
    seconds over the path's), with ``image_bytes`` (bytes), ``units``, ``pieces`` and the
    raw ``samples``. ``block_tokens`` are tokens per KV page; ``windows`` images per round.

    Raises:
        RuntimeError: a mismatched image, a leaked reservation or lease, or no staging
            rows for ``engine`` on ``device``.
        InvalidArgumentError: a page size or window no ``TransferConfig`` takes."""
    rows = []
    for bt in block_tokens:
        for w in windows:
            t0 = time.perf_counter()
            row = _one_config(bt, w, device, engine, warmup, repeat, slice_, model)
            say(
                f"  {bt}-token pages, window {w}: index gather"
                f" {row['index gather']['per_image_ms']:.3f} ms/image, engine"
                f" {row['engine gather']['per_image_ms']:.3f}; land"
                f" {row['index land']['per_image_ms']:.3f}"
                f" / {row['engine land']['per_image_ms']:.3f}"
                f" ({time.perf_counter() - t0:.1f} s)"
            )
            if row["mismatches"]:
                raise RuntimeError(f"{row['mismatches']} mismatched images at {bt}, {w}")
            rows.append(row)
    return rows


def render(rows: Sequence[dict[str, Any]], head: str) -> str:
    """The Markdown table of ``rows`` under ``head``."""
    lines = [
        head,
        "",
        "| page tokens | units (pieces) | window | image MiB | engine | D2D ms/round |"
        " index gather ms/image | engine gather ms/image | gather: index / engine vs D2D |"
        " engine gather host us/round | index land ms/image | engine land ms/image |"
        " land: index / engine vs D2D | engine land host us/round | checked (mismatches) |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ig, eg, il, el = (
            r[k] for k in ("index gather", "engine gather", "index land", "engine land")
        )
        lines.append(
            f"| {r['block_tokens']} | {r['units']} ({r['pieces']}) | {r['window']} |"
            f" {r['image_bytes'] / 2**20:.2f} | {r['engine']} | {r['d2d_s'] * 1e3:.3f} |"
            f" {ig['per_image_ms']:.3f} | {eg['per_image_ms']:.3f} |"
            f" {ig['vs_d2d']:.2f} / {eg['vs_d2d']:.2f} | {eg['host_s'] * 1e6:.0f} |"
            f" {il['per_image_ms']:.3f} | {el['per_image_ms']:.3f} |"
            f" {il['vs_d2d']:.2f} / {el['vs_d2d']:.2f} | {el['host_s'] * 1e6:.0f} |"
            f" {2 * r['window']} ({r['mismatches']}) |"
        )
    return "\n".join(lines) + "\n"


def _machine(device: str) -> str:
    torch = importlib.import_module("torch")
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(0)
    else:
        name = platform.processor() or platform.machine()
    return f"{name}, torch {torch.__version__}, Python {platform.python_version()}"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module doc). Exit 0 when every row ran and checked, 2 on a usage
    error."""
    p = argparse.ArgumentParser(
        prog="python -m pagedstate.models.bench.transfer_phases",
        description="Gather and landing of transfer rounds on one device: the driver's"
        " per-image index path against the copy engine's one launch per round, each against"
        " a device-to-device copy of the same bytes (docs/transfer.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument(
        "--block-tokens", type=_ints, default=[16, 128, 512], help="page sizes, e.g. 16,512"
    )
    p.add_argument("--window", type=_ints, default=[8, 32], help="images per round, e.g. 8,32")
    p.add_argument(
        "--engine",
        choices=_staging.ENGINES,
        default="auto",
        help="the copy engine measured against the index path (auto here: triton on CUDA,"
        " torch on CPU; the driver's own copy_engine='auto' keeps the index path on CPU)",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds per configuration")
    p.add_argument("--repeat", type=int, default=10, help="timed rounds (the median is shown)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a slice of the geometry, 1 warm-up and 2 timed rounds: a smoke run (its figures"
        " are noise)",
    )
    p.add_argument("--json", type=Path, help="write the raw rows here (checked first)")
    a = p.parse_args(argv)
    if a.device not in ("cuda", "cpu"):
        p.error(f"--device must be cuda or cpu, got {a.device!r}")
    if a.warmup < 0 or a.repeat < 1:
        p.error("--warmup must be >= 0 and --repeat >= 1")
    torch = importlib.import_module("torch")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a CUDA device (use --device cpu for a smoke run)")
    if a.engine == "triton" and a.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        p.error("--engine triton on --device cpu needs TRITON_INTERPRET=1 (Triton's interpreter)")
    if a.json is not None:
        try:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            with open(a.json, "a"):
                pass
        except OSError as e:
            p.error(f"--json {a.json}: {e}")
    slice_ = QUICK_SLICE if a.quick else None
    if a.quick:
        a.warmup, a.repeat = min(a.warmup, 1), min(a.repeat, 2)
    print(f"transfer phases on {a.device}: pages {a.block_tokens}, windows {a.window}", flush=True)
    rows = measure(a.block_tokens, a.window, a.device, a.engine, a.warmup, a.repeat, slice_)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"Measured {when} at commit `{commit()}` on {_machine(a.device)}, {MODEL}"
        f"{' (slice ' + str(QUICK_SLICE) + ')' if a.quick else ''};"
        f" `python -m pagedstate.models.bench.transfer_phases {' '.join(argv or sys.argv[1:])}`."
        f" Median of {a.repeat} rounds after {a.warmup} untimed, paths interleaved."
    )
    text = render(rows, head) + (
        "\nvs D2D: the D2D copy's time over the path's for the same bytes (1.00: as fast as"
        " a device-to-device copy). host us: until the calls returned, before the device"
        " synchronize.\n" + ("smoke run (--quick): the figures are noise.\n" if a.quick else "")
    )
    print(text)
    if a.json:
        a.json.write_text(json.dumps({"head": head, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
