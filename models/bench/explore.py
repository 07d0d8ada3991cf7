"""``make bench-explore``: explorer throughput, measured in one run, written to docs/benchmarks.md.

It runs ``tiny`` to its depth bound with and without symmetry reduction, ``default`` on
one process for 60 s (the per-core rate), ``default`` to depth 10 on two processes with and
without symmetry reduction (the reduction factor comes from this one run), and ``default``
to depth 12 with symmetry over two processes within 300 s and 8 GiB (the issue's target;
the memory bound stops the search before the machine runs out: unbounded, that run takes
more than 20 GiB),
printing distinct states, states generated, depth, wall seconds, distinct states per second
and the peak resident set. Numbers are what this
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
_MEMORY_MB = 8192.0  # the bound, and safe on a 24 GiB machine
_MARK_END = "<!-- bench-explore:end -->"


def _row(label: str, r: Report) -> str:
    verdict = "ok" if r.ok else ("violation" if r.violation else "incomplete coverage")
    return (
        f"| {label} | {r.distinct:,} | {r.generated:,} | {r.depth} | "
        f"{r.stopped} | {r.seconds:.1f} | {r.states_per_second:,.0f} | "
        f"{verdict} |"
    )


def _peak_rss_mib() -> float:
    """The largest resident set of this process and of any child it waited for (MiB)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024  # Linux: KiB


def run(quick: bool = False) -> str:
    """Run the benchmark and return its Markdown section (also printed as it goes)."""
    lines = [
        _MARK_BEGIN,
        "## Explorer throughput (`make bench-explore`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}; one run, every check on (invariants, step"
        " invariants, atomicity of refused calls, drain from every state). `symmetry`:"
        " states identified up to a renaming of the sequences (`Config.symmetry`).",
        "",
        "| run | distinct states | generated | depth | stopped by | seconds | distinct/s"
        " | result |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    results: dict[str, Report] = {}
    default = CONFIGS["default"]
    sym = attrs.evolve(default, symmetry=True)
    deep = attrs.evolve(default, max_depth=12, symmetry=True)
    tiny_sym = attrs.evolve(CONFIGS["tiny"], symmetry=True)
    # (key, label, config, workers, seconds); the depth-12 run is held to 8 GiB
    plan: list[tuple[str, str, Config | str, int, float | None]] = [
        ("tiny", "tiny (depth 7), 1 process", "tiny", 1, None),
        ("tiny-sym", "tiny (depth 7), 1 process, symmetry", tiny_sym, 1, None),
        ("one", "default, 1 process, first 60 s", "default", 1, 60.0),
        ("d10", "default to depth 10, 2 processes", default, 2, None),
        ("d10-sym", "default to depth 10, 2 processes, symmetry", sym, 2, None),
        ("d12-sym", "default to depth 12, 2 processes, symmetry, 300 s, 8 GiB", deep, 2, 300.0),
    ]
    if quick:
        small = attrs.evolve(default, max_depth=6)
        plan = [
            ("tiny", "tiny (depth 7), 1 process", "tiny", 1, None),
            ("tiny-sym", "tiny (depth 7), 1 process, symmetry", tiny_sym, 1, None),
            ("one", "default, 1 process, first 5 s", "default", 1, 5.0),
            ("d10", "default to depth 6, 2 processes", small, 2, None),
            (
                "d10-sym",
                "default to depth 6, 2 processes, symmetry",
                attrs.evolve(small, symmetry=True),
                2,
                None,
            ),
        ]
    rss: dict[str, float] = {}
    for key, label, cfg, workers, seconds in plan:
        print(f"running {label} ...", file=sys.stderr, flush=True)
        if workers == 1:
            r = explore(cfg, max_seconds=seconds)
        else:
            bound = _MEMORY_MB if key == "d12-sym" else None
            r = explore_parallel(cfg, workers=workers, max_seconds=seconds, max_memory_mb=bound)
        results[key] = r
        rss[key] = _peak_rss_mib()
        lines.append(_row(label, r))
        print(lines[-1], flush=True)
    lines.append("")
    for plain, reduced, what in (("tiny", "tiny-sym", "`tiny`"), ("d10", "d10-sym", "`default`")):
        a, b = results.get(plain), results.get(reduced)
        if a is not None and b is not None and b.distinct and b.seconds:
            lines.append(
                f"Symmetry reduction on {what} to the same depth: {a.distinct / b.distinct:.2f}x"
                f" fewer distinct states, {a.seconds / b.seconds:.2f}x less time"
                f" ({a.distinct:,} -> {b.distinct:,} states, {a.seconds:.0f} -> {b.seconds:.0f} s)."
            )
    lines.append("")
    d12 = results.get("d12-sym")
    if d12 is not None:
        reached = d12.depth if d12.stopped != "depth bound" else 12
        met = d12.stopped == "depth bound" and d12.seconds <= 300 * 1.05
        lines.append(
            f"Target: `default` at depth >= 12 in <= 300 s on 2 cores, memory <= 8 GiB:"
            f" measured with symmetry {d12.distinct:,} distinct states, depth {reached}"
            f" ({d12.stopped}) in {d12.seconds:.0f} s, within {_MEMORY_MB / 1024:.0f} GiB (peak"
            f" RSS of the largest process so far {rss['d12-sym'] / 1024:.1f} GiB)"
            f" ({'met' if met else 'not met'})."
        )
    per_core = max(
        (results[k].states_per_second for k in ("tiny", "one") if k in results), default=0.0
    )
    lines.append(
        f"Target: >= 20,000 distinct states per second per core on `tiny` and `default`:"
        f" measured at most {per_core:,.0f} on one core"
        f" ({'met' if per_core >= 20_000 else 'not met'})."
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
