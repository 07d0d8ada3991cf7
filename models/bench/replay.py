"""``make bench-replay``: wall time of ``pagedstate replay`` on the full shipped traces.

The replay's budget: the full conversation trace (12,031 requests) with executor none in at most
60 s on a 2-core machine, and with ``--verify`` (the reference in lockstep) at most 5x that.
This replays each shipped trace (``data/traces/``) once plain and once verified, in one
process, and writes the figures, with the hit rates found, into their section of
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path

from pagedstate.models._provenance import commit
from pagedstate.models.replay import ReplayConfig, ReplayResult, load_trace, replay

_BEGIN = "<!-- bench-replay:begin -->"
_END = "<!-- bench-replay:end -->"
#: ``data/traces`` of the checkout (this file is ``models/bench/replay.py``).
_TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pagedstate.models.bench.replay")
    ap.add_argument(
        "--traces",
        type=Path,
        default=_TRACES,
        help="folder of the traces (default: the checkout's data/traces)",
    )
    ap.add_argument("--model", default="Qwen/Qwen3-Next-80B-A3B-Instruct")
    ap.add_argument("--pool-gib", type=float, default=16.0)
    ap.add_argument("--placement", default="anchor")
    ap.add_argument("--limit", type=int, default=None, help="first N requests (smoke test)")
    ap.add_argument("--out", type=Path, default=None, help="Markdown file to update")
    args = ap.parse_args(argv)
    rows = []
    for name in ("conversation_trace.jsonl", "synthetic_trace.jsonl"):
        path = args.traces / name
        t0 = time.perf_counter()
        trace = load_trace(path, args.limit)
        load_s = time.perf_counter() - t0
        got: dict[bool, tuple[float, ReplayResult]] = {}
        for verify in (False, True):
            cfg = ReplayConfig(
                model_id=args.model,
                pool_gib=args.pool_gib,
                placement=args.placement,
                verify=verify,
            )
            t0 = time.perf_counter()
            r = replay(trace, cfg)
            got[verify] = (time.perf_counter() - t0, r)
            print(f"{name} verify={verify}: {got[verify][0]:.1f} s", file=sys.stderr)
        plain, checked = got[False], got[True]
        same = {k: v for k, v in checked[1].counters.items() if k != "snapshots_compared"}
        if plain[1].counters != {**same, "snapshots_compared": 0}:
            raise SystemExit("the verified replay made different calls from the plain one")
        rows.append((name, len(trace), load_s, plain, checked))
    lines = [
        _BEGIN,
        "## Trace replay (`make bench-replay`)",
        "",
        f"Measured {date.today().isoformat()} on {platform.machine()}, Python"
        f" {platform.python_version()}, commit {commit()}: `pagedstate replay` of each"
        f" whole shipped trace, {args.model} with a {args.pool_gib:g} GiB pool, placement"
        f" `{args.placement}`, 64 running requests, executor none; once plain and once with"
        " `--verify` (the reference model in lockstep, snapshots compared every 256 passes),"
        " in one process. Wall time of the replay (set-up included, trace loading shown apart)."
        " The replay's budget: the conversation trace in at most 60 s plain, and `--verify` at"
        " most 5x that.",
        "",
        "| trace | requests | load s | plain s | verify s | verify / plain | store calls |"
        " µs/call p50 | p99 | hit rate (blocks) | hit rate (tokens) | KV prefix alone |"
        " prefill tokens saved |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, n, load_s, (ps, pr), (vs, _vr) in rows:
        s = pr.summary()
        t = pr.timings_us["overall"]
        lines.append(
            f"| `{name}` | {n:,} | {load_s:.1f} | {ps:.1f} | {vs:.1f} | {vs / ps:.1f}x |"
            f" {int(t['calls']):,} | {t['p50']:.2f} | {t['p99']:.2f} |"
            f" {_pct(s['hit_rate_blocks'])} | {_pct(s['hit_rate_tokens'])} |"
            f" {_pct(s['kv_hit_rate_blocks'])} | {int(s['prefill_tokens_saved']):,} |"
        )
    conv = rows[0]
    within = "met" if conv[4][0] <= 5 * conv[3][0] else "NOT met"
    lines += [
        "",
        f"Budget: conversation trace plain {conv[3][0]:.1f} s (<= 60 s:"
        f" {'met' if conv[3][0] <= 60 else 'NOT met'}); verify / plain"
        f" {conv[4][0] / conv[3][0]:.1f}x (<= 5x: {within}).",
        "The verified run made exactly the calls of the plain one (same counters).",
        _END,
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        doc = args.out.read_text(encoding="utf-8") if args.out.exists() else "# Benchmarks\n"
        if _BEGIN in doc and _END in doc:
            a, b = doc.index(_BEGIN), doc.index(_END) + len(_END)
            doc = doc[:a] + text + doc[b:]
        else:
            doc = doc.rstrip("\n") + "\n\n" + text + "\n"
        args.out.write_text(doc, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
