"""``make bench``: microseconds per store call on a replayed trace, measured in one run.

It replays the first ``--requests`` requests of the Mooncake conversation trace through the
engine model of :mod:`pagedstate.models.engine`, once per implementation and concurrency
(64, 256 and 1,024 running requests by default), and prints the mean microseconds per call
of every method the engine called and overall. It then replays the same workload at 256
running requests on stores pre-populated with 10^3 and 10^6 READY records (the reference at
10^3 and 10^4: it walks every unit on each reservation, so filling it with 10^6 records
would take hours), and reports the resident memory. Finally it checks the three targets of
issue 3 ("Measured, not timed") and writes everything between its markers in
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
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .engine import (
    DEFAULT_TRACE,
    UNINDEX_MISS,
    Engine,
    EngineConfig,
    EngineResult,
    TraceRequest,
    load_trace,
    resolve_impl,
    timer_floor_ns,
)

__all__ = ["BenchOptions", "main", "run"]

_MARK_BEGIN = "<!-- bench-trace:begin -->"
_MARK_END = "<!-- bench-trace:end -->"

#: Issue 3's targets.
TARGET_US_AT_256 = 3.0
TARGET_CONCURRENCY_RATIO = 1.1
TARGET_RECORDS_RATIO = 1.2
#: The levels issue 3's ratio targets compare (lower, higher); other levels are not judged.
TARGET_CONCURRENCY_LEVELS = (64, 1024)
TARGET_RECORDS_LEVELS = (1_000, 1_000_000)
#: Not a store operation: the engine model reads it for its own KV-cache bookkeeping.
_NOT_STORE_OPS = frozenset({"pool.num_free"})


@dataclass(frozen=True)
class BenchOptions:
    """What one benchmark run does."""

    impl: str = "pagedstate.impl"
    ref: str = "pagedstate.models.reference"
    trace: Path = DEFAULT_TRACE
    requests: int = 3000
    concurrency: tuple[int, ...] = (64, 256, 1024)
    #: Pool units per slot of the highest concurrency level (the one-pool runs), and per slot
    #: of every level in the grown-pool runs.
    units_per_slot: int = 40
    #: Pool units of every concurrency run; 0: ``units_per_slot`` x the highest level.
    pool_units: int = 0
    chunk_blocks: int = 4
    units_per_checkpoint: int = 2
    records: tuple[int, ...] = (1000, 1_000_000)
    ref_records: tuple[int, ...] = (1000, 10_000)
    records_concurrency: int = 256
    #: Large enough that the replay at ``records_concurrency`` evicts nothing, so the runs
    #: with few and with many live records make exactly the same calls.
    records_units_per_slot: int = 56
    #: Replays per production measurement (figures: per call, the fastest replay).
    repeat: int = 3
    #: Replays per reference measurement (the reference is slow; one replay by default).
    ref_repeat: int = 1


QUICK = BenchOptions(
    requests=300,
    concurrency=(16, 64),
    records=(100, 2000),
    ref_records=(100, 1000),
    records_concurrency=16,
    records_units_per_slot=160,
    repeat=2,
)


def _rss_mib() -> float:
    """Current resident set size (Linux ``/proc``; the peak elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return _peak_rss_mib()


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def _one_pool(o: BenchOptions) -> int:
    """Units of the pool every concurrency level shares (``BenchOptions.pool_units``)."""
    return o.pool_units or max(o.concurrency) * o.units_per_slot


def _config(
    o: BenchOptions,
    concurrency: int,
    extra_units: int = 0,
    units_per_slot: int | None = None,
    *,
    pool_units: int | None = None,
) -> EngineConfig:
    """The engine configuration of one run: ``pool_units`` units, or else
    ``units_per_slot`` (default ``o.units_per_slot``) per slot, plus ``extra_units``."""
    per_slot = o.units_per_slot if units_per_slot is None else units_per_slot
    units = concurrency * per_slot if pool_units is None else pool_units
    return EngineConfig(
        max_running=concurrency,
        pool_units=units + extra_units,
        units_per_checkpoint=o.units_per_checkpoint,
        chunk_blocks=o.chunk_blocks,
        decode_tokens_per_pass=max(1, 1024 // concurrency),
        arrival_scale=0.0,
        stop_when_drained=True,
    )


def _replay(
    module: ModuleType,
    cfg: EngineConfig,
    trace: list[TraceRequest],
    prepopulate: int = 0,
    repeat: int = 1,
) -> EngineResult:
    """Replay ``repeat`` times (deterministic, so the calls are the same each time) and
    return the first replay's result with ``timings`` replaced, call by call, by the fastest
    of the replays: a call that was preempted in one replay is measured by another. The
    first replay's own overall figure is kept as ``extra["plain_us"]``."""
    results: list[EngineResult] = []
    for i in range(max(1, repeat)):
        gc.collect()
        was = gc.isenabled()
        gc.disable()  # also while pre-populating: millions of objects, no cycles
        try:
            rss0 = _rss_mib()
            t0 = time.perf_counter()
            engine = Engine(cfg, trace, module, prepopulate=prepopulate, keep_samples=repeat > 1)
            populate_s = time.perf_counter() - t0
            rss1 = _rss_mib()
            result = engine.run(disable_gc=True)
            if i == 0:
                result.extra.update(
                    populate_s=populate_s,
                    rss_before_mib=rss0,
                    rss_populated_mib=rss1,
                    rss_after_mib=_rss_mib(),
                )
            del engine
        finally:
            if was:
                gc.enable()
        results.append(result)
    first = results[0]
    first.extra["plain_us"] = _us(first)
    first.extra["repeats"] = float(len(results))
    first.extra["paired"] = 0.0
    if len(results) > 1:
        ids = [np.frombuffer(r.sample_methods, dtype=np.uint16) for r in results]
        if all(
            r.methods == first.methods and np.array_equal(i, ids[0])
            for r, i in zip(results, ids, strict=True)
        ):
            best = np.minimum.reduce([np.frombuffer(r.samples, dtype=np.int64) for r in results])
            sums = np.bincount(ids[0], weights=best, minlength=len(first.methods))
            first.timings = {
                m: [int(sums[k]), first.timings[m][1]]
                for k, m in enumerate(first.methods)
                if m in first.timings  # not a name relabel_last moved every call away from
            }
            first.extra["paired"] = 1.0
        else:  # not the same calls: fall back to the fastest replay per method
            first.timings = {
                m: min((r.timings[m] for r in results if m in r.timings), key=lambda t: t[0])
                for m in first.timings
            }
        first.extra["cpu_share_min"] = min(r.cpu_s / r.wall_s for r in results if r.wall_s)
    first.samples = first.samples[:0]
    first.sample_methods = first.sample_methods[:0]
    return first


def _us(r: EngineResult, method: str | None = None) -> float:
    if method is None:
        return r.us_per_call([m for m in r.timings if m not in _NOT_STORE_OPS])
    return r.us_per_call([method])


def _store_calls(r: EngineResult) -> int:
    return sum(c for m, (_, c) in r.timings.items() if m not in _NOT_STORE_OPS)


def _store_ns(r: EngineResult) -> int:
    """Nanoseconds in store calls (every timed call but :data:`_NOT_STORE_OPS`)."""
    return sum(ns for m, (ns, _) in r.timings.items() if m not in _NOT_STORE_OPS)


def _fixed_mix_us(r: EngineResult, mix: EngineResult) -> float:
    """``r``'s per-method costs weighted by ``mix``'s call counts (store ops only)."""
    num = den = 0.0
    for m, (_, n) in mix.timings.items():
        if m in _NOT_STORE_OPS or m not in r.timings:
            continue
        num += n * _us(r, m)
        den += n
    return num / den if den else 0.0


def _work(r: EngineResult, m: str) -> int:
    return r.work.get(m, r.timings[m][1]) if m in r.timings else 0


def _fixed_work_ratio(r: EngineResult, base: EngineResult) -> float:
    """Cost per unit of work, ``r`` against ``base``, over ``base``'s work mix: each store
    method's ns per unit of work in ``r`` (see ``CallTimer.extra_work``), weighted by the
    units of work ``base`` did in it, over ``base``'s own time. 1.0 when every kind of work
    costs the same in both runs, whatever the number of calls or the work per call."""
    num = den = 0.0
    for m, (ns, _) in base.timings.items():
        if m in _NOT_STORE_OPS or m not in r.timings or not _work(r, m):
            continue
        num += _work(base, m) * r.timings[m][0] / _work(r, m)
        den += ns
    return num / den if den else 0.0


class _Seq:
    """A minimal sequence for the locality control (``SequenceLike``)."""

    __slots__ = ("state_slot", "has_per_req_cache")

    def __init__(self, slot: int) -> None:
        self.state_slot = slot
        self.has_per_req_cache = True


class _Obj:
    __slots__ = ("h", "units")

    def __init__(self, h: int) -> None:
        self.h = h
        self.units = (h, h + 1)


def _median(xs: list[int]) -> float:
    xs = sorted(xs)
    return float(xs[len(xs) // 2])


def _locality_control(
    module: ModuleType, o: BenchOptions, concurrency: int, *, repeat: int = 3
) -> dict[str, float]:
    """Median ns of one ``unindex`` that releases a READY record, with the records touched
    in filing order and in a shuffled order, in a store sized like the concurrency run
    (``units_per_slot`` units per slot, ``8 * concurrency`` records filed through
    ``checkpoint``, the drain and the completion), and of a plain ``dict.pop`` + attribute
    read over as many small objects in the same two orders (no store at all: the machine's
    own cost of reaching scattered objects). The fastest of ``repeat`` builds."""
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    n = 8 * concurrency
    for order in ("filing", "shuffled"):
        best_store = best_dict = float("inf")
        for _ in range(repeat):
            pool = module.UnitPool(concurrency * o.units_per_slot)
            coord = module.PagedStateCheckpointCoordinator(
                pool, _config(o, concurrency).spec(), True
            )
            seqs = [_Seq(i) for i in range(concurrency)]
            hashes: list[int] = []
            for r in range(8):
                for i, s in enumerate(seqs):
                    h = (1 << 40) + r * concurrency + i
                    coord.checkpoint(s, 1, h)
                    hashes.append(h)
                coord.take_checkpoint_ops()
                coord.complete_previous_batch()
            if order == "shuffled":
                hashes = [hashes[i] for i in rng.permutation(len(hashes))]
            objs = {h: _Obj(h) for h in range(n)}
            keys = list(range(n)) if order == "filing" else [int(k) for k in rng.permutation(n)]
            was = gc.isenabled()
            gc.disable()
            try:
                times: list[int] = []
                unindex = coord.unindex
                for h in hashes:
                    t0 = time.perf_counter_ns()
                    unindex(h)
                    times.append(time.perf_counter_ns() - t0)
                plain: list[int] = []
                pop = objs.pop
                sink = 0
                for k in keys:
                    t0 = time.perf_counter_ns()
                    sink += len(pop(k).units)
                    plain.append(time.perf_counter_ns() - t0)
                if sink != 2 * n:
                    raise RuntimeError("locality control: the plain baseline lost objects")
            finally:
                if was:
                    gc.enable()
            if len(coord.store.records) != 0:
                raise RuntimeError("locality control: a record survived its unindex")
            best_store = min(best_store, _median(times))
            best_dict = min(best_dict, _median(plain))
        out[f"store {order}"] = best_store
        out[f"dict {order}"] = best_dict
    return out


def _locality_verdict(sf: float, ss: float, df: float, ds: float) -> str:
    """What the locality control shows, from the growth (higher level / lower level) of the
    store's ``unindex`` and of a plain ``dict.pop``, in filing (``sf``, ``df``) and shuffled
    (``ss``, ``ds``) order. The store is suspect only when it grows more than 15% beyond the
    plain dict in either order."""
    if sf > 1.15 * df or ss > 1.15 * ds:
        return (
            "In this run the store grows more than 15% beyond the plain dict: look for per-call"
            " work that scales with the number of records."
        )
    if sf < ss and abs(ss - ds) <= 0.15 * ds:
        return (
            "The store grows less in filing order than shuffled, and shuffled about as"
            " much as the plain dict (within 15%): in this run the growth follows the"
            " memory hierarchy (objects spread over more cache lines and pages), not"
            " per-call work that scales with the number of records."
        )
    return (
        "In this run the store grows no more than 15% beyond the plain dict in either order:"
        " no sign of per-call work that scales with the number of records."
    )


def _fmt(x: float) -> str:
    return f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def _contended(r: EngineResult) -> str:
    return f"{r.wall_s:.1f} s ({r.cpu_s / r.wall_s:.0%} CPU)" if r.wall_s > 0 else "-"


def _same_calls(a: EngineResult, b: EngineResult) -> bool:
    """Same calls of every method, same engine counters, and the same checkpoint fates (the
    pre-populated records' stores aside)."""

    def fates(r: EngineResult) -> dict[str, int]:
        f = dict(r.fates)
        f["checkpoints_kept"] = f.get("checkpoints_kept", 0) - r.prepopulated
        return f

    return (
        {m: c for m, (_, c) in a.timings.items()} == {m: c for m, (_, c) in b.timings.items()}
        and a.counters == b.counters
        and fates(a) == fates(b)
    )


def _provenance(module: ModuleType) -> str:
    """Which commit the measured module came from, and whether it (a package: its folder)
    had uncommitted changes (best effort: empty outside a git checkout)."""
    file = Path(getattr(module, "__file__", "") or ".").resolve()
    path = file.parent
    what = "." if file.name == "__init__.py" else file.name  # a package: its whole folder
    try:
        head = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--", what],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    if not head:
        return ""
    n = len(dirty.splitlines())
    return f"commit {head}" + (f" plus {n} uncommitted file(s)" if n else "")


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "not met")


def run(o: BenchOptions, *, quick: bool = False) -> str:
    """Run the benchmark and return its Markdown section (progress goes to stderr)."""

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    ref_mod = resolve_impl(o.ref)
    stand_in: str | None = None
    try:
        prod_mod = resolve_impl(o.impl)
    except ImportError as exc:
        stand_in = str(exc)
        prod_mod = ref_mod
        o = replace(o, repeat=o.ref_repeat)
    prod_label = o.impl if stand_in is None else f"{o.ref} (standing in for {o.impl})"
    prod_from, ref_from = _provenance(prod_mod), _provenance(ref_mod)  # before any replay
    trace = load_trace(o.trace, o.requests)
    floor = timer_floor_ns()
    say(f"production: {prod_label}; reference: {o.ref}; {len(trace)} requests")
    if stand_in is not None:
        say(f"NOTE: {stand_in}; the reference stands in for the production store")

    # Every level on one pool: the pool and the trace stay, the running requests change.
    one_pool = _one_pool(o)
    conc: dict[int, tuple[EngineResult, EngineResult]] = {}
    for c in o.concurrency:
        cfg = _config(o, c, pool_units=one_pool)
        say(f"concurrency {c}, pool of {one_pool:,} units: production ...")
        p = _replay(prod_mod, cfg, trace, repeat=o.repeat)
        if stand_in is None:
            say(f"concurrency {c}: reference ...")
            r = _replay(ref_mod, cfg, trace, repeat=o.ref_repeat)
        else:
            r = p
        conc[c] = (p, r)
        say(f"  production {_us(p):.2f} us/call, reference {_us(r):.2f} us/call")

    lo_conc, hi_conc = min(o.concurrency), max(o.concurrency)
    # Context: a pool that grows with the slots (``units_per_slot`` per slot). Its KV prefix
    # cache, and with it the call mix, changes with the concurrency as well.
    grown: dict[int, EngineResult] = {}
    if stand_in is None and lo_conc != hi_conc:
        for c in o.concurrency:
            say(f"concurrency {c}, pool of {o.units_per_slot} units per slot: production ...")
            grown[c] = _replay(prod_mod, _config(o, c), trace, repeat=o.repeat)

    locality: dict[int, dict[str, float]] = {}
    if stand_in is None and lo_conc != hi_conc:
        for c in (lo_conc, hi_conc):
            say(f"locality control at {c} ...")
            locality[c] = _locality_control(prod_mod, o, c)

    # The same requests served to the end at the lowest and highest concurrency (grown
    # pools): the store time each request costs, whatever number of calls it takes.
    full: dict[int, EngineResult] = {}
    if stand_in is None and lo_conc != hi_conc:
        for c in (lo_conc, hi_conc):
            say(f"concurrency {c}, grown pool, run to completion: production ...")
            full[c] = _replay(
                prod_mod, replace(_config(o, c), stop_when_drained=False), trace, repeat=o.repeat
            )

    rec_runs: list[tuple[str, int, EngineResult]] = []
    rec_plan = [(prod_label, prod_mod, n, o.repeat) for n in o.records] if stand_in is None else []
    rec_plan += [(o.ref, ref_mod, n, o.ref_repeat) for n in o.ref_records]
    for label, mod, n, k in rec_plan:
        say(f"{n:,} live records, {label} ...")
        cfg = _config(
            o, o.records_concurrency, n * o.units_per_checkpoint, o.records_units_per_slot
        )
        rr = _replay(mod, cfg, trace, n, repeat=k)
        rec_runs.append((label, n, rr))
        say(
            f"  {_us(rr):.2f} us/call; populate {rr.extra['populate_s']:.1f} s;"
            f" RSS {rr.extra['rss_populated_mib']:.0f} MiB"
        )

    # -- the section ----------------------------------------------------------------------
    lines = [
        _MARK_BEGIN,
        "## Store calls on a replayed trace (`make bench`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()},"
        f" {os.cpu_count()} cores, Python {platform.python_version()}, in one run"
        + (" (quick mode)" if quick else "")
        + f". Production: `{prod_label}`"
        + (f" ({prod_from})" if prod_from else "")
        + f"; reference: `{o.ref}`"
        + (f" ({ref_from})" if ref_from else "")
        + ".",
        "",
    ]
    if stand_in is not None:
        lines += [
            f"**No production store was measured**: {stand_in}. The reference stood in for"
            " it, so the production columns repeat the reference and no target is judged.",
            "",
        ]
    lines += [
        f"Workload: the first {len(trace):,} requests of `{o.trace.name}`, all arriving at"
        f" once; the engine model of `pagedstate.models.engine` (admission with"
        f" `resumable_hit` and `begin_restore`, chunked prefill of {o.chunk_blocks} blocks"
        f" filing a checkpoint at every chunk end, KV units reserved per running request,"
        f" one drain and the completions per pass, `unindex` when the KV prefix cache model"
        " drops a hash, timed in two rows: `unindex (orphaned)` when the call dropped a"
        " checkpoint, pending boundary or queued scratch store (the engine counters' orphaned"
        " column) and `unindex (found nothing)` otherwise);"
        f" every level on one pool of {one_pool:,} units"
        + (
            f" ({o.units_per_slot} per slot of the highest level)"
            if one_pool == hi_conc * o.units_per_slot
            else ""
        )
        + ", as an engine on one GPU runs when only the scheduler's limit on running requests"
        f" changes; {o.units_per_checkpoint} units per image, `1024 // concurrency` decode"
        " tokens per request per pass (a pass decodes as many tokens at every level); the"
        " replay stops when nothing is left waiting."
        + (
            " A pool that grows with the slots changes the KV prefix cache, and with it the"
            " call mix, together with the concurrency: those runs are context, further down."
            if grown
            else ""
        ),
        "",
        "How it is measured: `perf_counter_ns` is read just before and after every call"
        " (the bookkeeping comes after the second read); the timer's own floor, measured as"
        f" {floor:.0f} ns per call on a no-op, is included in every figure and not"
        " subtracted. The replay is deterministic, so repeating it repeats every call exactly:"
        f" production figures take, call by call, the fastest of {o.repeat} replays"
        f" ({'one replay' if o.ref_repeat == 1 else f'{o.ref_repeat} replays'} for the"
        " reference), which removes the time a call spent preempted when another program had"
        " the CPU; the first replay's plain mean is shown beside it. Overall figures are over"
        " store calls: every coordinator and pool call except `pool.num_free`, a property the"
        " engine model reads for its own KV-cache bookkeeping (listed per method). Wall time"
        " is the first replay's, with the share of it this process spent on a CPU (below 100%"
        " means the machine was shared and plain means are inflated).",
        "",
        "### Overall, by concurrency",
        "",
        f"| running requests | peak running | pool units | requests completed | store calls"
        " | production"
        f" µs/call (fastest of"
        f" {o.repeat}) | production, one replay | reference µs/call | reference / production"
        " (one replay each) | production wall | reference wall | same calls |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c, (p, r) in conc.items():
        pp, rp = p.extra["plain_us"], r.extra["plain_us"]
        lines.append(
            f"| {c:,} | {p.counters['peak_running']:,} | {p.config.pool_units:,} |"
            f" {p.counters['completed']:,} |"
            f" {_store_calls(p):,} | {_fmt(_us(p))} |"
            f" {_fmt(pp)} | {_fmt(_us(r))} | {rp / pp if pp else 0.0:,.1f}x |"
            f" {_contended(p)} | {_contended(r)} | {'yes' if _same_calls(p, r) else 'no'} |"
        )
    lines += [
        "",
        '"Same calls": production and reference made the same number of calls of every'
        " method, the engine counted the same hits, restores and unindexes, and the"
        " checkpoint fates agree. Every replay stops when nothing is left waiting, so the"
        " levels complete different numbers of requests"
        + (" (the same requests served to the end are further down)" if full else "")
        + ': what the levels compare is the cost per call. "Peak running": the most'
        " requests that ran at once; a level the pool cannot hold is not reached, and no"
        " target is judged on it.",
        "",
        "### Per method (µs per call; calls from the production run)",
        "",
        f"prod: the fastest of {o.repeat} replays per call; ref: "
        + ("one replay." if o.ref_repeat == 1 else f"the fastest of {o.ref_repeat}.")
        + " `coordinator.unindex` has two rows, by outcome: `unindex (orphaned)`, a call that"
        " dropped something (a checkpoint, pending boundaries, queued scratch stores), and"
        " `unindex (found nothing)`, the many calls for evicted prefixes that had none.",
        "",
    ]
    methods = sorted({m for p, r in conc.values() for m in (*p.timings, *r.timings)})
    lo_c, hi_c = min(conc), max(conc)
    growth = lo_c != hi_c
    head = "| method |" + "".join(f" calls @{c} | prod @{c} | ref @{c} |" for c in conc)
    head += f" prod @{hi_c} / @{lo_c} |" if growth else ""
    lines += [head, "|---|" + "---:|---:|---:|" * len(conc) + ("---:|" if growth else "")]
    for m in methods:
        row = f"| `{m}` |"
        for p, r in conc.values():
            n = p.timings.get(m, [0, 0])[1]
            row += (
                f" {n:,} | {_fmt(_us(p, m)) if m in p.timings else '-'} |"
                f" {_fmt(_us(r, m)) if m in r.timings else '-'} |"
            )
        if growth:
            a, b = conc[lo_c][0], conc[hi_c][0]
            ok = m in a.timings and m in b.timings and _us(a, m) > 0
            row += f" {_us(b, m) / _us(a, m):.2f} |" if ok else " - |"
        lines.append(row)
    lines += [
        "",
        "The pool is the same at every level, but a call's work still moves with the"
        " concurrency: a drain or a completion handles as many ops as the pass filed, and"
        " more running requests file more per pass (the per-unit-of-work table below); the"
        " live-records runs further down repeat one identical call sequence and isolate how"
        " the store scales with what it holds.",
        "",
        "### Per unit of work (production)",
        "",
        "A call's work is one unit plus: for `pool.reserve_units` / `pool.release_units`,"
        " the units beyond the first; for `take_checkpoint_ops`, the ops it returns and the"
        " records it evicts; for `complete_previous_batch`, the ops of the batch it"
        " completes; for `ensure_free_units`, the records it evicts; for `unindex (orphaned)`,"
        " one more (what it dropped). The engine credits it after the call, outside the"
        " timed region. µs per unit of work, and units of work per call:",
        "",
    ]
    head = "| method |" + "".join(f" work/call @{c} | µs/work @{c} |" for c in conc)
    head += f" µs/work @{hi_c} / @{lo_c} |" if growth else ""
    lines += [head, "|---|" + "---:|---:|" * len(conc) + ("---:|" if growth else "")]
    for m in methods:
        if m in _NOT_STORE_OPS:
            continue
        row = f"| `{m}` |"
        for p, _r in conc.values():
            if m in p.timings and _work(p, m):
                ns, n = p.timings[m]
                row += f" {_work(p, m) / n:.2f} | {_fmt(ns / _work(p, m) / 1000)} |"
            else:
                row += " - | - |"
        if growth:
            a, b = conc[lo_c][0], conc[hi_c][0]
            if m in a.timings and m in b.timings and _work(a, m) and _work(b, m):
                ca = a.timings[m][0] / _work(a, m)
                cb = b.timings[m][0] / _work(b, m)
                row += f" {cb / ca:.2f} |" if ca else " - |"
            else:
                row += " - |"
        lines.append(row)
    lines += [
        "",
        "### Engine counters (production, one pool)",
        "",
        "| running requests | passes | admitted | completed | KV hits | resumable hits"
        " (restores) | blocks resumed | checkpoints filed | kept | dropped | evicted | orphaned"
        " | unindex calls |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, (p, _r) in conc.items():
        cn, f = p.counters, p.fates
        lines.append(
            f"| {c:,} | {cn['passes']:,} | {cn['admitted']:,} | {cn['completed']:,} |"
            f" {cn['kv_hits']:,} | {cn['restores']:,} | {cn['hit_blocks']:,} |"
            f" {cn['checkpoints_filed']:,} | {f['checkpoints_kept']:,} |"
            f" {f['checkpoints_dropped']:,} | {f['checkpoints_evicted']:,} |"
            f" {f['checkpoints_orphaned']:,} | {cn['unindexed']:,} |"
        )
    if grown:
        gl, gh = grown[lo_conc], grown[hi_conc]
        g_ratio = _us(gh) / _us(gl) if _us(gl) else 0.0
        g_mix = _fixed_mix_us(gh, gl) / _us(gl) if _us(gl) else 0.0
        g_work = _fixed_work_ratio(gh, gl)
        lines += [
            "",
            "### When the pool grows with the slots (production)",
            "",
            f"The same replay with a pool of {o.units_per_slot} units per slot at every level,"
            " so the pool (and the KV prefix cache in it) grows with the concurrency. A"
            " smaller pool drops more prefixes, nearly all through cheap `unindex (found"
            " nothing)` calls, and those pull the mean per call down: the levels make"
            " different calls, so their mean per call compares call mixes as much as the"
            f" store. Fastest of {o.repeat} replays call by call. Context, not a target:",
            "",
            "| running requests | pool units | store calls | `unindex (found nothing)` calls |"
            " µs/call | one replay | completed |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c, gr in grown.items():
            misses = gr.timings.get(UNINDEX_MISS, [0, 0])[1]
            lines.append(
                f"| {c:,} | {gr.config.pool_units:,} | {_store_calls(gr):,} | {misses:,} |"
                f" {_fmt(_us(gr))} | {_fmt(gr.extra['plain_us'])} |"
                f" {gr.counters['completed']:,} |"
            )
        lines += [
            "",
            f"Per method (calls, µs per call) at {lo_conc:,} and {hi_conc:,} running requests:",
            "",
            f"| method | calls @{lo_conc} | µs @{lo_conc} | calls @{hi_conc} | µs @{hi_conc} |"
            f" µs @{hi_conc} / @{lo_conc} |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for m in sorted({*gl.timings, *gh.timings}):
            cells = ""
            for gr in (gl, gh):
                if m in gr.timings:
                    cells += f" {gr.timings[m][1]:,} | {_fmt(_us(gr, m))} |"
                else:
                    cells += " 0 | - |"
            ok = m in gl.timings and m in gh.timings and _us(gl, m) > 0
            cells += f" {_us(gh, m) / _us(gl, m):.2f} |" if ok else " - |"
            lines.append(f"| `{m}` |" + cells)
        lines += [
            "",
            f"µs per call with the pool grown with the slots, {hi_conc:,} / {lo_conc:,} running"
            f" requests: {g_ratio:.2f}; with the {hi_conc:,} run's per-method costs weighted"
            f" by the {lo_conc:,} run's call counts: {g_mix:.2f};"
            f" per unit of work, over the {lo_conc:,} run's work mix: {g_work:.2f}.",
        ]
    lines += [
        "",
        "### Locality control (production)",
        "",
    ]
    if locality:
        lc, hc = lo_conc, hi_conc
        lines += [
            "Why a method's cost per call can grow with the store's size although no call"
            " walks the records: a larger working set is slower to reach on this machine. The"
            " same"
            f" operation, an `unindex` that releases a READY record, in stores sized like the"
            f" grown-pool {lc} and {hc} runs ({8 * lc:,} and {8 * hc:,} records filed through"
            " `checkpoint`, the drain and the completion), with the records touched in"
            " filing order and in a shuffled order; and, without any store, a plain"
            " `dict.pop` plus one attribute read over as many small objects in the same two"
            " orders. Median ns per operation, the fastest of 3 builds; each figure includes"
            " the timer floor above. Context for the per-method growth in the grown-pool"
            " runs, not a target:",
            "",
            f"| order | store `unindex` @{lc} | @{hc} | @{hc} / @{lc} | plain `dict.pop`"
            f" @{lc} | @{hc} | @{hc} / @{lc} |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for order in ("filing", "shuffled"):
            s0, s1 = locality[lc][f"store {order}"], locality[hc][f"store {order}"]
            d0, d1 = locality[lc][f"dict {order}"], locality[hc][f"dict {order}"]
            lines.append(
                f"| {order} | {s0:,.0f} | {s1:,.0f} | {s1 / s0:.2f} | {d0:,.0f} | {d1:,.0f} |"
                f" {d1 / d0:.2f} |"
            )
        sf = locality[hc]["store filing"] / locality[lc]["store filing"]
        ss = locality[hc]["store shuffled"] / locality[lc]["store shuffled"]
        df = locality[hc]["dict filing"] / locality[lc]["dict filing"]
        ds = locality[hc]["dict shuffled"] / locality[lc]["dict shuffled"]
        lines += ["", _locality_verdict(sf, ss, df, ds)]
    else:
        lines.append("Not run (one concurrency level, or no production store).")
    if full:
        lines += [
            "",
            "### The same requests, served to the end (production)",
            "",
            "The grown-pool runs above stop when nothing is left waiting, so they serve"
            " different requests at each concurrency, and their call mix differs (a smaller"
            " pool drops more KV prefixes, most of which have no checkpoint: many cheap"
            " `unindex (found nothing)` calls). Here, on the same grown pools, the replay goes"
            " on until every request is done at the lowest and the highest concurrency, so"
            " both runs serve the same requests unless the pool rejected some (the requests"
            " served column); store time is the sum of the timed store calls (fastest of"
            f" {o.repeat} replays, call by call). Context, not a target:",
            "",
            "| running requests | requests served | store calls | calls per request |"
            " µs/call | store ms | store µs per request |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        per_req: dict[int, float] = {}
        for c, fr in full.items():
            calls = _store_calls(fr)
            total_ns = _store_ns(fr)
            served = fr.counters["completed"]
            per_req[c] = total_ns / 1000.0 / served if served else 0.0
            lines.append(
                f"| {c:,} | {served:,} | {calls:,} | {calls / served if served else 0:.1f} |"
                f" {_fmt(_us(fr))} | {total_ns / 1e6:,.1f} | {per_req[c]:,.1f} |"
            )
        lo_r, hi_r = per_req[lo_conc], per_req[hi_conc]
        lines += [
            "",
            f"Store time per request served, {hi_conc:,} / {lo_conc:,} running requests:"
            f" {hi_r / lo_r if lo_r else 0.0:.2f}; µs per call:"
            f" {_us(full[hi_conc]) / _us(full[lo_conc]) if _us(full[lo_conc]) else 0.0:.2f}.",
        ]
    lines += [
        "",
        f"### Live records ({o.records_concurrency} running requests)",
        "",
        "Before the replay the store is filled with READY records under hashes no request"
        " has (through `checkpoint`, the drain and `complete_previous_batch`, untimed), in a"
        " pool grown by their units. The replay's own part of the pool is"
        f" {o.records_units_per_slot} units per slot, "
        + (
            "chosen so that the replay evicts nothing: then the runs make the same calls"
            ' ("same calls", against the first run of the same implementation) and differ'
            " only in how many records the store holds."
            if all(rr.fates["checkpoints_evicted"] == 0 for _, _, rr in rec_runs)
            else "meant to be enough that the replay evicts nothing; in this run some replays"
            " evicted records (the evicted column), so the runs did not all make the same calls"
            ' ("same calls", against the first run of the same implementation).'
        )
        + " Eviction itself is measured in the concurrency runs above.",
        "",
        "| implementation | live records | store calls | µs/call | evicted | same calls"
        " | populate s | RSS MiB before | RSS MiB populated | replay wall |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    first: dict[str, EngineResult] = {}
    for label, n, rr in rec_runs:
        x = rr.extra
        base = first.setdefault(label, rr)
        lines.append(
            f"| `{label}` | {n:,} | {_store_calls(rr):,} | {_fmt(_us(rr))} |"
            f" {rr.fates['checkpoints_evicted']:,} | {'yes' if _same_calls(base, rr) else 'no'} |"
            f" {x['populate_s']:.1f} | {x['rss_before_mib']:.0f} |"
            f" {x['rss_populated_mib']:.0f} | {_contended(rr)} |"
        )
    if rec_runs:
        lines += ["", "Per method (µs per call):", ""]
        rec_methods = sorted({m for _, _, rr in rec_runs for m in rr.timings})
        lines.append(
            "| method | calls |"
            + "".join(f" `{label.split()[0]}` {n:,} |" for label, n, _ in rec_runs)
        )
        lines.append("|---|---:|" + "---:|" * len(rec_runs))
        for m in rec_methods:
            calls = rec_runs[0][2].timings.get(m, [0, 0])[1]
            lines.append(
                f"| `{m}` | {calls:,} |"
                + "".join(
                    f" {_fmt(_us(rr, m)) if m in rr.timings else '-'} |" for _, _, rr in rec_runs
                )
            )
    lines += ["", f"Peak RSS of the whole run: {_peak_rss_mib():.0f} MiB.", ""]

    # -- targets --------------------------------------------------------------------------
    judged = stand_in is None
    lines += [
        "### Targets (issue 3)",
        "",
        "Issue 3 (the production store) sets three targets on this benchmark: at most"
        f" {TARGET_US_AT_256:g} µs per store call at 256 running requests; the per-call cost at"
        f" 1,024 running requests at most {TARGET_CONCURRENCY_RATIO:g}x the cost at 64; the"
        f" per-call cost with 10^6 live records at most {TARGET_RECORDS_RATIO:g}x the cost with"
        " 10^3. The concurrency figures are the one-pool runs (the first table): the same"
        " trace and pool at every level, the number of running requests changed. A target"
        " is judged only at its own levels, on runs that made store calls, reached their"
        " level (peak running) and, for the live records, made the same calls. Every other"
        " figure in this section is context.",
        "",
    ]
    ps = {c: p for c, (p, _) in conc.items()}

    def unreached(*levels: int) -> str | None:
        """Why runs at ``levels`` cannot be judged (no calls, or fewer running requests
        than the level), or None."""
        for c in levels:
            if not _store_calls(ps[c]):
                return f"no store calls at {c:,} running requests"
            peak = ps[c].counters["peak_running"]
            if peak < c and len(trace) < c:
                return f"{len(trace):,} requests cannot fill a level of {c:,}"
            if peak < c:
                return (
                    f"the pool of {ps[c].config.pool_units:,} units ran at most {peak:,}"
                    f" requests at once at the level of {c:,}"
                )
        return None

    if 256 in ps:
        v = _us(ps[256])
        why_not = "no production store" if not judged else unreached(256)
        verdict = (
            f"**n/a** ({why_not}; measured: {v:.2f})"
            if why_not
            else f"{v:.2f} (target <= {TARGET_US_AT_256:g}): **{_verdict(v <= TARGET_US_AT_256)}**"
        )
        lines.append(
            f"- Overall µs per call at 256 running requests: {verdict}"
            f" (one replay's plain mean: {ps[256].extra['plain_us']:.2f})."
        )
    else:
        lines.append(
            "- Overall µs per call at 256 running requests: **n/a** (no run at 256 running"
            f" requests; levels run: {', '.join(f'{c:,}' for c in ps)})."
        )
    lo, hi = min(ps), max(ps)
    if lo != hi:
        raw = _us(ps[hi]) / _us(ps[lo]) if _us(ps[lo]) else 0.0
        mixed = _fixed_mix_us(ps[hi], ps[lo]) / _us(ps[lo]) if _us(ps[lo]) else 0.0
        per_work = _fixed_work_ratio(ps[hi], ps[lo])
        # the target compares these two levels; a run at others (--quick) is not judged
        levels = (lo, hi) == TARGET_CONCURRENCY_LEVELS
        why_not = unreached(lo, hi)
        if not judged:
            figure = f"**n/a** (no production store; the reference against itself: {raw:.2f})"
        elif not levels:
            figure = (
                f"**n/a** (the target compares {TARGET_CONCURRENCY_LEVELS[1]:,} with"
                f" {TARGET_CONCURRENCY_LEVELS[0]:,} running requests; at these levels: {raw:.2f})"
            )
        elif why_not:
            figure = f"**n/a** ({why_not}; measured: {raw:.2f})"
        else:
            ok = raw <= TARGET_CONCURRENCY_RATIO
            figure = f"{raw:.2f} (target <= {TARGET_CONCURRENCY_RATIO:g}): **{_verdict(ok)}**"
        lines.append(
            f"- Cost per call at {hi:,} / at {lo:,} running requests, one pool of"
            f" {ps[hi].config.pool_units:,} units: {figure}."
            " Context, not the target: per unit of work, over the"
            f" {lo:,} run's work mix: {per_work:.2f}; with the {hi:,} run's per-method costs"
            f" weighted by the {lo:,} run's call counts (methods, and `unindex` by outcome):"
            f" {mixed:.2f}, a weighting that holds the number of calls but not their work (a"
            f" drain or a completion at {hi:,} handles the ops of more running requests)."
        )
    if full:
        a, b = full[lo_conc], full[hi_conc]
        ta, tb = _store_ns(a), _store_ns(b)
        na, nb = a.counters["completed"], b.counters["completed"]
        if ta and na and nb:
            same = na == nb == len(trace)
            serving = (
                f"serving the same {na:,} requests to the end"
                if same
                else f"serving {na:,} and {nb:,} of {len(trace):,} requests (the others were"
                " rejected: not the same requests)"
            )
            lines.append(
                f"- Context, not the target: on pools grown with the slots ({o.units_per_slot}"
                f" units per slot), {serving}, the store spends {(tb / nb) / (ta / na):.2f}x the"
                f" time per request at {hi_conc:,} running requests as at {lo_conc:,} (per call:"
                f" {_us(b) / _us(a):.2f}x)."
            )
    if grown and _us(gl):
        lines.append(
            f"- Context, not the target: with a pool of {o.units_per_slot} units per slot"
            " at every level (the pool and its KV prefix cache grow with the concurrency, so"
            " the call mix moves with it), the cost per call at"
            f" {hi_conc:,} / at {lo_conc:,} running requests is {g_ratio:.2f}"
            f" (µs per call: {_us(gl):.2f} at {lo_conc:,}, {_us(gh):.2f} at {hi_conc:,});"
            f" at the same call mix: {g_mix:.2f}; per unit of work: {g_work:.2f}."
        )
    prod_recs = [(n, rr) for label, n, rr in rec_runs if label == prod_label and judged]
    if len(prod_recs) >= 2:
        (n0, r0), (n1, r1) = min(prod_recs, key=lambda t: t[0]), max(prod_recs, key=lambda t: t[0])
        raw = _us(r1) / _us(r0) if _us(r0) else 0.0
        levels = (n0, n1) == TARGET_RECORDS_LEVELS
        same = _same_calls(r0, r1) and _store_calls(r0) > 0
        if not levels:
            figure = (
                f"**n/a** (the target compares {TARGET_RECORDS_LEVELS[1]:,} with"
                f" {TARGET_RECORDS_LEVELS[0]:,} live records; at these: {raw:.2f})"
            )
        elif not same:
            figure = f"**n/a** (the two runs did not make the same calls; measured: {raw:.2f})"
        else:
            ok = raw <= TARGET_RECORDS_RATIO
            figure = f"{raw:.2f} (target <= {TARGET_RECORDS_RATIO:g}): **{_verdict(ok)}**"
        lines.append(
            f"- Cost per call with {n1:,} / with {n0:,} live records: {figure}."
            + (
                " The two runs make the same calls, so their call mix is the same already (per"
                f" unit of work: {_fixed_work_ratio(r1, r0):.2f})."
                if same
                else " The two runs made different calls (the live-records table's"
                ' "same calls" column), so the ratio compares different work.'
            )
        )
    elif not judged:
        lines.append(
            "- Cost per call with 10^6 / 10^3 live records: **n/a** (no production store)."
        )
    ref_recs = [(n, rr) for label, n, rr in rec_runs if label == o.ref]
    if len(ref_recs) >= 2:
        (n0, r0), (n1, r1) = ref_recs[0], ref_recs[-1]
        lines.append(
            f"- For comparison, the reference with {n1:,} / {n0:,} live records:"
            f" {_us(r1) / _us(r0) if _us(r0) else 0.0:.2f}."
        )
    lines += ["", _MARK_END]
    return "\n".join(lines)


def _split_markers(text: str) -> tuple[str, str] | None:
    """``(head, tail)`` around this benchmark's section of ``text``, or None when the file
    has no section yet.

    Raises:
        ValueError: the markers are not one begin marker followed by one end marker.
    """
    nb, ne = text.count(_MARK_BEGIN), text.count(_MARK_END)
    if nb == ne == 0:
        return None
    if nb != 1 or ne != 1 or text.index(_MARK_BEGIN) > text.index(_MARK_END):
        raise ValueError(
            f"expected one {_MARK_BEGIN} followed by one {_MARK_END}; found {nb} begin and"
            f" {ne} end marker(s){' in the wrong order' if nb == ne == 1 else ''}"
        )
    head, rest = text.split(_MARK_BEGIN, 1)
    _, tail = rest.split(_MARK_END, 1)
    return head, tail


def _write(out: Path, section: str) -> None:
    old = out.read_text(encoding="utf-8") if out.exists() else "# Benchmarks\n"
    parts = _split_markers(old)
    if parts is not None:
        new = parts[0] + section + parts[1]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(new, encoding="utf-8")


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
    ap = argparse.ArgumentParser(prog="python -m pagedstate.models.bench")
    pos = _at_least(1)
    ap.add_argument("--impl", default=d.impl, help="production module (default %(default)s)")
    ap.add_argument("--ref", default=d.ref, help="reference module (default %(default)s)")
    ap.add_argument(
        "--trace", type=_trace_file, default=d.trace, help="Mooncake-format jsonl trace"
    )
    ap.add_argument("--requests", type=pos, default=None, help=f"trace prefix ({d.requests})")
    ap.add_argument("--concurrency", type=_positive_ints, default=None, help="e.g. 64,256,1024")
    ap.add_argument(
        "--records", type=_positive_ints, default=None, help="live records, production (, none)"
    )
    ap.add_argument(
        "--ref-records", type=_positive_ints, default=None, help="live records, reference"
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
        "--records-concurrency", type=pos, default=None, help=f"({d.records_concurrency})"
    )
    ap.add_argument("--chunk-blocks", type=pos, default=d.chunk_blocks)
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


if __name__ == "__main__":
    sys.exit(main())
