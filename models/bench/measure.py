"""The store benchmark's measurements: replays that take, call by call, the fastest of
several (:func:`_replay`), the figures read off a result, the locality control, the
provenance of the measured code, and :func:`measure`, every run of one benchmark."""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import numpy as np

from pagedstate.models.replay.engine import (
    Engine,
    EngineConfig,
    EngineResult,
    TraceRequest,
    load_trace,
    resolve_impl,
    timer_floor_ns,
)

from .workload import BenchOptions, _config, _one_pool

#: Not a store operation: the engine model reads it for its own KV-cache bookkeeping.
_NOT_STORE_OPS = frozenset({"pool.num_free"})


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


@dataclass
class Measured:
    """Every run of one benchmark (:func:`measure`), for its report."""

    #: The options as run: with no production store, ``repeat`` is ``ref_repeat``.
    o: BenchOptions
    #: Why no production store was measured (the reference stood in), or None.
    stand_in: str | None
    prod_label: str
    prod_from: str
    ref_from: str
    trace: list[TraceRequest]
    floor: float
    one_pool: int
    conc: dict[int, tuple[EngineResult, EngineResult]]
    lo_conc: int
    hi_conc: int
    grown: dict[int, EngineResult]
    locality: dict[int, dict[str, float]]
    full: dict[int, EngineResult]
    rec_runs: list[tuple[str, int, EngineResult]]


def measure(o: BenchOptions) -> Measured:
    """Every run of the benchmark (progress goes to stderr)."""

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

    return Measured(
        o=o,
        stand_in=stand_in,
        prod_label=prod_label,
        prod_from=prod_from,
        ref_from=ref_from,
        trace=trace,
        floor=floor,
        one_pool=one_pool,
        conc=conc,
        lo_conc=lo_conc,
        hi_conc=hi_conc,
        grown=grown,
        locality=locality,
        full=full,
        rec_runs=rec_runs,
    )
