"""``make bench``: microseconds per store call on a replayed trace, measured in one run.

It replays the first ``--requests`` requests of the Mooncake conversation trace through the
engine model of :mod:`pagedstate.models.replay.engine`, once per implementation and concurrency
(64, 256 and 1,024 running requests by default), and prints the mean microseconds per call
of every method the engine called and overall. It then replays the same workload at 256
running requests on stores pre-populated with 10^3 and 10^6 READY records (the reference at
10^3 and 10^4: it walks every unit on each reservation, so filling it with 10^6 records
would take hours), and reports the resident memory. Finally it checks the three targets of
the project's rule ("measured, not timed") and writes everything between its markers in
``docs/benchmarks.md`` (other sections of that file are left as they are).

The implementations are module names resolved at run time: ``--impl`` (the production
store, default ``pagedstate.impl``) and ``--ref`` (default ``pagedstate.models.reference``).
When ``--impl`` cannot be imported or lacks ``UnitPool`` / ``PagedStateCheckpointCoordinator``,
the reference stands in for it, the output says so on every table, and no target is judged.

Workload, the same trace and pool at every concurrency level, so that what changes is the
number of running requests (and with it the decode tokens per request per pass, below, so
that a pass decodes as many tokens at every level): every request arrives at time 0 (a
saturated queue); every level runs on one pool of ``--pool-units`` units (default:
``--units-per-slot`` units for each slot of the highest level, 40 x 1,024), as one GPU's KV
pool does when only the scheduler's limit on running requests is changed; decode advances
``1024 // concurrency`` tokens per request per pass; chunks of ``--chunk-blocks`` blocks;
two units per checkpoint image. The replay stops when no request is left waiting, so the
figures cover the saturated part of the run only. The cyclic garbage collector is off
during each replay. A second set of production runs gives each level a pool of
``--units-per-slot`` units per slot instead (the pool grows with the concurrency): context
that shows how the call mix moves with the pool, not a target.

Each production measurement replays ``--repeat`` times (3) and takes, call by call, the
fastest replay: the replay is deterministic, so the i-th call is the same call every time,
and a call that was preempted by another program in one replay is measured by another. The
first replay's plain mean is printed beside it, and the reference (``--ref-repeat``, 1 by
default: it is slow) is one plain replay. Numbers are what this machine measured in one
run; nothing here is a timed test.

Usage: ``python -m pagedstate.models.bench [--impl M] [--ref M] [--requests N]
[--out docs/benchmarks.md] [--quick]``.

The parts: :mod:`.workload` (what is replayed), :mod:`.measure` (the replays and what they
measure), :mod:`.report` (the Markdown section) and :mod:`.targets` (the verdicts).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pagedstate.models.replay.engine import resolve_impl

from .measure import measure
from .report import _split_markers, _write, section
from .workload import QUICK, BenchOptions

__all__ = ["BenchOptions", "main", "run"]


def run(o: BenchOptions, *, quick: bool = False) -> str:
    """Run the benchmark and return its Markdown section (progress goes to stderr)."""
    return section(measure(o), quick=quick)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text!r}") from None


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an int: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {v}")
        return v

    parse.__name__ = f"int >= {low}"  # argparse names the type in its message
    return parse


def _positive_ints(text: str) -> tuple[int, ...]:
    """A comma-separated list of distinct positive ints (may be empty: ``,``)."""
    values = _ints(text)
    bad = [v for v in values if v < 1]
    if bad:
        raise argparse.ArgumentTypeError(f"every value must be at least 1, got {bad}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"values repeat: {list(values)}")
    return values


def _trace_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such trace file: {text}")
    return path


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the section, and (with ``--out``) replace it in the file.

    Bad arguments (a level, count or size below 1, a trace that is no file, a reference
    module that cannot be imported, an ``--out`` that is a directory or whose markers are
    out of order) exit with argparse's usage error (status 2) before anything runs."""
    d = BenchOptions()
    ap = argparse.ArgumentParser(
        prog="python -m pagedstate.models.bench",
        description="Store calls on a replayed trace: the production store against the"
        " reference model, microseconds per call (docs/benchmarks.md).",
    )
    pos = _at_least(1)
    ap.add_argument("--impl", default=d.impl, help="production module (default %(default)s)")
    ap.add_argument("--ref", default=d.ref, help="reference module (default %(default)s)")
    ap.add_argument(
        "--trace",
        type=_trace_file,
        default=d.trace,
        help="Mooncake-format jsonl trace (default: the shipped one, %(default)s)",
    )
    ap.add_argument(
        "--requests",
        type=pos,
        default=None,
        help=f"replay the first N requests of the trace ({d.requests})",
    )
    ap.add_argument(
        "--concurrency",
        type=_positive_ints,
        default=None,
        help=f"running-request levels, comma-separated ({','.join(map(str, d.concurrency))})",
    )
    ap.add_argument(
        "--records",
        type=_positive_ints,
        default=None,
        help="live-record levels of the production runs, comma-separated; ',' for none"
        f" ({','.join(map(str, d.records))})",
    )
    ap.add_argument(
        "--ref-records",
        type=_positive_ints,
        default=None,
        help=f"live-record levels of the reference runs ({','.join(map(str, d.ref_records))})",
    )
    ap.add_argument(
        "--units-per-slot",
        type=pos,
        default=None,
        help=f"pool units per slot of the highest level; grown-pool runs: of every level"
        f" ({d.units_per_slot})",
    )
    ap.add_argument(
        "--pool-units",
        type=pos,
        default=None,
        help="pool units of every concurrency run (default: units per slot x highest level)",
    )
    ap.add_argument(
        "--records-units-per-slot",
        type=pos,
        default=None,
        help=f"pool units per slot in the live-records runs ({d.records_units_per_slot})",
    )
    ap.add_argument(
        "--records-concurrency",
        type=pos,
        default=None,
        help=f"running requests in the live-records runs ({d.records_concurrency})",
    )
    ap.add_argument(
        "--chunk-blocks",
        type=pos,
        default=d.chunk_blocks,
        help="KV blocks a request in prefill computes per pass (chunked prefill; %(default)s)",
    )
    ap.add_argument(
        "--repeat", type=pos, default=None, help=f"replays per production run ({d.repeat})"
    )
    ap.add_argument(
        "--ref-repeat", type=pos, default=None, help=f"replays per reference run ({d.ref_repeat})"
    )
    ap.add_argument("--out", type=Path, default=None, help="Markdown file to update")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"a short smoke run: {QUICK.requests} requests at"
        f" {' and '.join(map(str, QUICK.concurrency))} running requests,"
        f" {' / '.join(map(str, QUICK.records))} live records (reference"
        f" {' / '.join(map(str, QUICK.ref_records))}) at {QUICK.records_concurrency},"
        f" {QUICK.records_units_per_slot} units per slot there, {QUICK.repeat} replays; the"
        " targets' levels are not run, so nothing is judged (other flags still override)",
    )
    a = ap.parse_args(argv)
    base = QUICK if a.quick else d
    concurrency = _pick(a.concurrency, base.concurrency)
    if not concurrency:
        ap.error("--concurrency: at least one level")
    try:
        resolve_impl(a.ref)
    except ImportError as exc:
        ap.error(f"--ref: {exc}")
    if a.out is not None:
        if a.out.is_dir():
            ap.error(f"--out: {a.out} is a directory")
        if a.out.exists():
            try:
                _split_markers(a.out.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                ap.error(f"--out: {a.out}: {exc}")
    o = BenchOptions(
        impl=a.impl,
        ref=a.ref,
        trace=a.trace,
        requests=_pick(a.requests, base.requests),
        concurrency=concurrency,
        units_per_slot=_pick(a.units_per_slot, base.units_per_slot),
        pool_units=_pick(a.pool_units, base.pool_units),
        chunk_blocks=a.chunk_blocks,
        records=_pick(a.records, base.records),
        ref_records=_pick(a.ref_records, base.ref_records),
        records_concurrency=_pick(a.records_concurrency, base.records_concurrency),
        records_units_per_slot=_pick(a.records_units_per_slot, base.records_units_per_slot),
        repeat=_pick(a.repeat, base.repeat),
        ref_repeat=_pick(a.ref_repeat, base.ref_repeat),
    )
    section = run(o, quick=a.quick)
    print(section)
    if a.out is not None:
        _write(a.out, section)
        print(f"wrote {a.out}", file=sys.stderr)
    return 0
