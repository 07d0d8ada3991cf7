"""``make bench-explore``: explorer throughput, measured in one run, written to docs/benchmarks.md.

It runs ``tiny`` to its depth bound, ``default`` for the same time budget on one and on two
processes (the ratio of their rates comes from this one run), and ``default`` over two
processes with a 300 s budget (the issue's target), printing distinct states, states
generated, depth, wall seconds and distinct states per second. Numbers are what this
machine measured; nothing here is a timed test.

Usage: ``python -m pagedstate.models.bench.explore [--out docs/benchmarks.md] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import attrs

from pagedstate.models.explorer import CONFIGS, Report, explore, explore_parallel
from pagedstate.models.world import Config

__all__ = ["main", "run"]

_MARK_BEGIN = "<!-- bench-explore:begin -->"
_MARK_END = "<!-- bench-explore:end -->"


def _row(label: str, r: Report) -> str:
    verdict = "ok" if r.ok else ("violation" if r.violation else "incomplete coverage")
    return (
        f"| {label} | {r.distinct:,} | {r.generated:,} | {r.depth} | "
        f"{r.stopped} | {r.seconds:.1f} | {r.states_per_second:,.0f} | "
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
        "| run | distinct states | generated | depth | stopped by | seconds | distinct/s"
        " | result |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    results: dict[str, Report] = {}
    deep = attrs.evolve(CONFIGS["default"], max_depth=11)
    # (label, config, workers, seconds)
    plan: list[tuple[str, Config | str, int, float | None]] = [
        ("tiny (depth 7), 1 process", "tiny", 1, None),
        ("default, 1 process, first 60 s", "default", 1, 60.0),
        ("default, 2 processes, first 60 s", "default", 2, 60.0),
        ("default to depth 11, 2 processes, 300 s budget", deep, 2, 300.0),
    ]
    if quick:
        plan = [
            ("tiny (depth 7), 1 process", "tiny", 1, None),
            ("default, 1 process, first 5 s", "default", 1, 5.0),
            ("default, 2 processes, first 5 s", "default", 2, 5.0),
        ]
    for label, cfg, workers, seconds in plan:
        print(f"running {label} ...", file=sys.stderr, flush=True)
        if workers == 1:
            r = explore(cfg, max_seconds=seconds)
        else:
            r = explore_parallel(cfg, workers=workers, max_seconds=seconds)
        results[label] = r
        lines.append(_row(label, r))
        print(lines[-1], flush=True)
    lines.append("")
    one = [r for k, r in results.items() if k.startswith("default, 1")]
    two = [r for k, r in results.items() if k.startswith("default, 2")]
    if one and two and one[0].states_per_second > 0:
        ratio = two[0].states_per_second / one[0].states_per_second
        lines.append(
            f"Two processes against one on `default`, same run, same time budget: {ratio:.2f}x"
            " the distinct states per second."
        )
        lines.append("")
    budget = [r for k, r in results.items() if "300 s" in k]
    if budget:
        b = budget[0]
        met = b.distinct >= 1_000_000 and b.seconds <= 300 * 1.05
        lines.append(
            f"Target: `default` explores >= 1,000,000 distinct states in <= 300 s on"
            f" 2 cores: measured {b.distinct:,} distinct states in {b.seconds:.0f} s"
            f" ({'met' if met else 'not met'})."
        )
    per_core = max(
        (r.states_per_second for k, r in results.items() if "1 process" in k), default=0.0
    )
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
    parser = argparse.ArgumentParser(prog="python -m pagedstate.models.bench.explore")
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
