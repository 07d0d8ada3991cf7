"""``make bench-explore``: explorer throughput, measured in one run, written to docs/benchmarks.md.

For each named configuration it runs the exhaustive search once sequentially and, for
``default``, once over two worker processes, and prints distinct states, states generated,
depth, wall seconds and distinct states per second, plus the ratio of the parallel to the
sequential rate from the same run. Numbers are what this machine measured; nothing here is a
timed test.

Usage: ``python -m pagedstate.models.bench_explore [--out docs/benchmarks.md] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from .explorer import Report, explore, explore_parallel

__all__ = ["main", "run"]

_MARK_BEGIN = "<!-- bench-explore:begin -->"
_MARK_END = "<!-- bench-explore:end -->"


def _row(label: str, r: Report) -> str:
    verdict = "ok" if r.ok else ("violation" if r.violation else "incomplete coverage")
    return (
        f"| {label} | {r.distinct:,} | {r.generated:,} | {r.depth} | "
        f"{'yes' if r.complete else 'no'} | {r.seconds:.1f} | {r.states_per_second:,.0f} | "
        f"{verdict} |"
    )


def run(quick: bool = False) -> str:
    """Run the benchmark and return its Markdown section (also printed as it goes)."""
    lines = [
        _MARK_BEGIN,
        "## Explorer throughput (`make bench-explore`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}; one run, every check on (invariants, step"
        " invariants, atomicity of refused calls, drain from every state).",
        "",
        "| run | distinct states | generated | depth | complete | seconds | distinct/s | result |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    results: dict[str, Report] = {}
    plan: list[tuple[str, str, int]] = [("tiny", "tiny, 1 process", 1)]
    if not quick:
        plan += [("default", "default, 1 process", 1), ("default", "default, 2 processes", 2)]
    else:
        plan += [("default", "default (quick: 20k states), 2 processes", 2)]
    for name, label, workers in plan:
        cap = 20_000 if quick and name == "default" else None
        print(f"running {label} ...", file=sys.stderr, flush=True)
        if workers == 1:
            r = explore(name, max_states=cap)
        else:
            r = explore_parallel(name, workers=workers, max_states=cap)
        results[label] = r
        lines.append(_row(label, r))
        print(lines[-1], flush=True)
    lines.append("")
    seq = [r for k, r in results.items() if k.startswith("default, 1")]
    par = [r for k, r in results.items() if k.startswith("default, 2")]
    if seq and par and seq[0].states_per_second > 0:
        ratio = par[0].states_per_second / seq[0].states_per_second
        lines.append(
            f"Two processes against one on `default`: {ratio:.2f}x the distinct states per"
            " second, measured in the same run."
        )
        lines.append("")
    if par:
        p = par[0]
        lines.append(
            f"Target (issue 2): `default` explores >= 1,000,000 distinct states in <= 300 s on"
            f" 2 cores: measured {p.distinct:,} in {p.seconds:.0f} s"
            f" ({'met' if p.distinct >= 1_000_000 and p.seconds <= 300 else 'not met'})."
        )
        per_core = max(r.states_per_second for r in results.values() if r is not p)
        lines.append(
            f"Target: >= 20,000 distinct states per second per core: measured at most"
            f" {per_core:,.0f} on one core ({'met' if per_core >= 20_000 else 'not met'})."
        )
        lines.append("")
    lines.append(_MARK_END)
    return "\n".join(lines)


def _write(out: Path, section: str) -> None:
    old = out.read_text(encoding="utf-8") if out.exists() else "# Benchmarks\n"
    if _MARK_BEGIN in old and _MARK_END in old:
        head, rest = old.split(_MARK_BEGIN, 1)
        _, tail = rest.split(_MARK_END, 1)
        new = head + section + tail
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(new, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run, print, and (with ``--out``) replace this benchmark's section of the file."""
    parser = argparse.ArgumentParser(prog="python -m pagedstate.models.bench_explore")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file to update")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    args = parser.parse_args(argv)
    section = run(quick=args.quick)
    if args.out is not None:
        _write(args.out, section)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
