"""``python -m pagedstate.models.bench.units``: the store's host cost against the number of
units per image, measured in one run (issue 19).

An image spans ``units_per_checkpoint`` pool units: 101 for Qwen3-Next, 337 for Kimi-Linear
and 390 for Nemotron-H at 16-token pages. This benchmark runs an engine-like loop over the
matrix units per image ``U`` x running requests ``R`` x two pools, and reports how the store
calls' cost grows with ``U``. It drives the implementation (``--impl``, default
``pagedstate.impl``) through its public calls only, so the same command measures the store
before and after a change of its internals.

The loop, per pass (SPEC D.1 order, docs/integration.md):

1. ``complete_previous_batch()``: the last drain's stores become READY, its restore pins go;
2. admission: each slot freed at the end of the last pass gets a new request, which looks up
   the newest image of another request (``contains``) and queues its restore into its slot
   (``begin_restore(h, slot, seq=)``), a lookup hit restored; on the fragmented pool it then
   reserves its KV (``ensure_free_units`` and the engine's ``pool.reserve_units``);
3. the drain ``take_checkpoint_ops()``: one image store begun for every request that filed a
   boundary last pass (the pool is full, so each store evicts the least recently used
   unpinned images to make room), and the queued restores handed out;
4. postprocess: every request files one boundary (``checkpoint(seq, blocks, h)``, a new
   prefix hash each time), except one in ``--restore-every`` (by slot, rotating), which
   finishes instead: ``forget_pending(seq)`` and its slot is freed (on the fragmented pool its
   KV units go to the prefix cache with ``pool.cache_units``).

Pools: ``R x U x --images-per-slot`` units for images plus ``R x --kv-units`` of live KV,
so that in steady state the pool is full and every pass evicts about one pass's images.

- **fresh**: the live KV is reserved first (the lowest ids) and never moves; the pool holds
  nothing but checkpoint images and those reservations.
- **fragmented**: before anything else the whole pool is reserved in blocks of
  ``--frag-block`` units, and every other block (the first, third, ...) is released into the
  KV prefix cache with ``cache_units`` under distinct prefix hashes, the others released
  vacant; the live KV is then reserved (from the vacant blocks). Reservations take vacant
  units first, lowest id first, so images are built from broken-up vacant extents, and then
  cached units in LRU order, which fires ``on_evict`` (wired to ``coordinator.unindex``, as
  an engine does). Requests that finish return their KV to the prefix cache, so cached units
  keep being interleaved with the images and consumed in steady state.

Measurement: ``time.perf_counter_ns`` is read just before and after every call into the
coordinator (the store calls) and, separately, every engine KV call on the pool
(``pool.reserve_units``, ``pool.cache_units``; reported in their own column, not in the
store figures; ``on_evict`` callbacks fired inside them run there too). The driver's own
bookkeeping is outside the timed intervals, and the garbage collector is off from the end of
the first set-up of a (pool, R) to its last repeat. Every U of one (pool, R) is set up and
warmed up (``--warmup`` passes: the pool full and evicting); then ``--repeat`` repeats of
``--passes`` passes run interleaved, the first repeat of every U, then the second of every
U, and so on, so that a busy spell of the machine falls on every U alike. The loop is
deterministic and a repeat of a multiple of ``--restore-every`` passes makes the same calls
in the same order as the others, so, as :mod:`.measure` pairs replays, each call's figure is
its fastest repeat's (the time it spent preempted by another program drops out); a cell
whose repeats differ takes its fastest repeat whole (the section names it). Figures: µs per
store call (every coordinator call); µs per image op (store time over images stored +
restored + released); store host time per pass (ms). Nothing here is a timed test: the
targets are printed as met or not met and never fail the run.

Default matrix: U in 2, 4, 8, 32, 101, 390 x R in 64, 256, 1,024 x both pools, 6 warm-up
passes and 7 repeats of 16 passes per cell. ``--quick`` (a smoke run for the tests): U 2, 4,
390 at R 16 and 32, one request in 4 finishing per pass, 4 warm-up passes and 2 repeats of
4. The measured code is named by its commit and the number of uncommitted files in the
implementation's folder (``git``), or by the ``COMMIT`` environment variable when it is set
(a copy of the tree whose history is missing or stale).

Usage: ``python -m pagedstate.models.bench.units [--out docs/benchmarks.md] [--json PATH]
[--quick]``; ``--out`` replaces the section between ``<!-- bench-units:begin -->`` and
``<!-- bench-units:end -->`` (appended when the file has none; other sections are left as
they are); ``--json`` writes the raw figures (every cell, every repeat's store time, every
method's ns and calls).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pagedstate.models.replay.engine import resolve_impl
from pagedstate.spec.types import PagedStateCheckpointSpec

from .measure import _provenance
from .store import _at_least, _positive_ints
from .units_report import (  # the report's constants, re-exported: callers read them here
    _MARK_BEGIN as _MARK_BEGIN,
)
from .units_report import _MARK_END as _MARK_END
from .units_report import (
    KV_METHODS,
    POOLS,
    STORE_METHODS,
    _split_markers,
    ratio_rows,
    section,
    write_json,
    write_section,
)
from .units_report import MODEL_UNITS as MODEL_UNITS
from .units_report import PASS_TARGET_AT as PASS_TARGET_AT
from .units_report import RATIO_UNITS as RATIO_UNITS
from .units_report import TARGET_PASS_MS as TARGET_PASS_MS
from .units_report import TARGET_RATIO as TARGET_RATIO

__all__ = [
    "UnitsOptions",
    "Cell",
    "QUICK",
    "measure",
    "ratio_rows",
    "section",
    "write_json",
    "write_section",
    "main",
]

#: Bytes per unit of the benchmark's spec; the store never reads bytes, only unit counts.
PAGE_BYTES = 4096
_M = {m: i for i, m in enumerate(STORE_METHODS + KV_METHODS)}
_COMPLETE, _CONTAINS, _RESTORE, _ENSURE, _DRAIN, _CHECKPOINT, _FORGET = range(7)
_KV_RESERVE, _KV_CACHE = 7, 8


@dataclass(frozen=True)
class UnitsOptions:
    """What one run measures (the command's flags; see the module docstring)."""

    impl: str = "pagedstate.impl"
    units: tuple[int, ...] = (2, 4, 8, 32, 101, 390)
    running: tuple[int, ...] = (64, 256, 1024)
    pools: tuple[str, ...] = POOLS
    #: Image capacity of the pool, in images per running request.
    images_per_slot: int = 2
    #: Live KV units per running request.
    kv_units: int = 64
    #: Block length of the fragmented pool's set-up, in units.
    frag_block: int = 64
    #: Each pass, one request in this many (by slot, rotating) finishes and its successor
    #: restores an image.
    restore_every: int = 16
    warmup: int = 6
    #: Timed passes per repeat; a multiple of ``restore_every`` makes the repeats' calls
    #: the same, so that they pair call by call.
    passes: int = 16
    repeat: int = 7
    #: Run the coordinator's ``self_check`` after each cell (O(pool); for tests).
    check: bool = False


#: ``--quick``: a smoke run of every figure on a small matrix (no target's level is run
#: except the U ratio).
QUICK = UnitsOptions(
    units=(2, 4, 390), running=(16, 32), restore_every=4, warmup=4, passes=4, repeat=2
)


@dataclass
class Cell:
    """One (pool, running requests, units per image) measurement over ``passes`` passes:
    ``timings`` maps a method to ``[ns, calls]``, each call at its fastest repeat when the
    repeats are ``paired``, else the fastest repeat's; the image counts are one repeat's."""

    pool: str
    running: int
    units: int
    pool_units: int
    passes: int
    #: Whether every repeat made the same calls (then each call's figure is its fastest).
    paired: bool
    #: Store ns of each repeat, unpaired.
    repeat_store_ns: list[int]
    timings: dict[str, list[int]]
    stored: int
    restored: int
    released: int
    on_evict: int
    runs_per_image: float
    setup_s: float
    wall_s: float
    errors: list[str] = field(default_factory=list)

    @property
    def store_ns(self) -> int:
        return sum(self.timings[m][0] for m in STORE_METHODS)

    @property
    def store_calls(self) -> int:
        return sum(self.timings[m][1] for m in STORE_METHODS)

    @property
    def kv_ns(self) -> int:
        return sum(self.timings[m][0] for m in KV_METHODS)

    @property
    def image_ops(self) -> int:
        return self.stored + self.restored + self.released

    @property
    def us_per_call(self) -> float:
        return self.store_ns / 1000.0 / self.store_calls if self.store_calls else 0.0

    @property
    def us_per_image_op(self) -> float:
        return self.store_ns / 1000.0 / self.image_ops if self.image_ops else 0.0

    @property
    def ms_per_pass(self) -> float:
        return self.store_ns / 1e6 / self.passes

    @property
    def median_repeat_ms_per_pass(self) -> float:
        """Store ms per pass of the median repeat, unpaired (how noisy the machine was)."""
        xs = sorted(self.repeat_store_ns)
        return xs[len(xs) // 2] / 1e6 / self.passes if xs else 0.0

    def us_of(self, method: str) -> float | None:
        ns, n = self.timings[method]
        return ns / 1000.0 / n if n else None

    def figures(self) -> dict[str, Any]:
        """Every field plus the derived figures (the JSON record)."""
        out = asdict(self)
        out.update(
            store_ns=self.store_ns,
            store_calls=self.store_calls,
            kv_ns=self.kv_ns,
            image_ops=self.image_ops,
            us_per_store_call=self.us_per_call,
            us_per_image_op=self.us_per_image_op,
            store_ms_per_pass=self.ms_per_pass,
            median_repeat_store_ms_per_pass=self.median_repeat_ms_per_pass,
        )
        return out


class _Seq:
    """A running request as the coordinator reads it (``SequenceLike``)."""

    __slots__ = ("state_slot", "has_per_req_cache")

    def __init__(self, slot: int) -> None:
        self.state_slot = slot
        self.has_per_req_cache = True


def _runs(ids: Sequence[int]) -> int:
    """Runs of consecutive ids in ``ids`` (in piece order)."""
    n = 1 if ids else 0
    for a, b in zip(ids, ids[1:], strict=False):
        if b != a + 1:
            n += 1
    return n


class _Loop:
    """The engine-like loop of one cell: its pool, coordinator, requests and counters."""

    def __init__(self, mod: ModuleType, o: UnitsOptions, pool_kind: str, R: int, U: int) -> None:
        self.R, self.U, self.o = R, U, o
        self.fragmented = pool_kind == "fragmented"
        self.num_units = R * U * o.images_per_slot + R * o.kv_units
        self.pool: Any = mod.UnitPool(self.num_units)
        spec = PagedStateCheckpointSpec(
            page_unit_bytes=PAGE_BYTES,
            slot_bytes=U * PAGE_BYTES,
            layout_id=f"bench-units-{U}",
            image_bytes=U * PAGE_BYTES,
        )
        self.coord: Any = mod.PagedStateCheckpointCoordinator(self.pool, spec, True)
        self.pool.on_evict = self.coord.unindex  # the checkpoint dies with its prefix (A.4)
        self._kv_hash = 1 << 50  # cached KV prefix hashes; checkpoint hashes below
        self._ckpt_hash = 1 << 40
        self._rid = 0
        self.cached_added = 0
        if self.fragmented:
            self._fragment()
        self.kv: list[tuple[tuple[str, int], list[int]]] = [self._reserve_kv() for _ in range(R)]
        self.seqs = [_Seq(s) for s in range(R)]
        self.pending: list[int | None] = [None] * R  # filed last postprocess, by slot
        self.drained: list[int | None] = [None] * R  # stores begun by the last drain
        self.admit: list[int] = []  # slots freed at the last postprocess
        self.p = 0  # passes run
        self.stored = self.restored = 0
        self.runs = self.run_images = 0
        self.count_runs = False
        self.clear_samples()

    def _kv_hashes(self, n: int) -> list[int]:
        h = self._kv_hash
        self._kv_hash = h + n
        self.cached_added += n
        return list(range(h, h + n))

    def _fragment(self) -> None:
        """The fragmented pool's set-up (module docstring): blocks of ``frag_block`` units,
        every other one cached under distinct hashes, the rest vacant."""
        pool, L, n = self.pool, self.o.frag_block, self.num_units
        blocks: list[tuple[tuple[str, int], list[int]]] = []
        start = 0
        while start < n:
            m = min(L, n - start)
            owner = ("frag-kv", len(blocks))
            ids = pool.reserve_units(m, owner)
            if ids is None:
                raise RuntimeError("fragmented set-up: the pool refused a block")
            blocks.append((owner, ids))
            start += m
        for b, (owner, ids) in enumerate(blocks):
            if b % 2 == 0:
                pool.cache_units(ids, owner, self._kv_hashes(len(ids)))
            else:
                pool.release_units(ids, owner)

    def _reserve_kv(self) -> tuple[tuple[str, int], list[int]]:
        """Set-up only: a request's live KV (untimed)."""
        owner = ("live-kv", self._rid)
        self._rid += 1
        ids = self.pool.reserve_units(self.o.kv_units, owner)
        if ids is None:
            raise RuntimeError("set-up: no room for a request's live KV")
        return owner, ids

    def released(self) -> int:
        """Images released so far (evicted, or unindexed with their prefix). Untimed."""
        f = self.coord.checkpoint_fates()
        return int(f["checkpoints_evicted"]) + int(f["checkpoints_orphaned"])

    def on_evict_fired(self) -> int:
        """Cached KV units a reservation overwrote so far (each fired ``on_evict``)."""
        return self.cached_added - int(self.pool.num_cached)

    def clear_samples(self) -> None:
        """Forget the calls recorded so far (the warm-up's, a finished repeat's)."""
        self.samples = array("q")
        self.sample_ids = array("B")

    def run_pass(self) -> None:
        """One pass (module docstring). Each timed call's ns go to ``samples`` and its
        method (an index of :data:`_M`) to ``sample_ids``, in call order, after the second
        clock read."""
        now = time.perf_counter_ns
        add, add_id = self.samples.append, self.sample_ids.append
        coord, pool, R = self.coord, self.pool, self.R
        kv_units = self.o.kv_units
        t0 = now()
        coord.complete_previous_batch()
        add(now() - t0)
        add_id(_COMPLETE)
        drained = self.drained
        for slot in self.admit:  # 2. admission
            seq = _Seq(slot)
            self.seqs[slot] = seq
            for j in range(1, R):
                h = drained[(slot + j) % R]
                if h is None:
                    continue
                t0 = now()
                hit = coord.contains(h)
                add(now() - t0)
                add_id(_CONTAINS)
                if hit:
                    t0 = now()
                    coord.begin_restore(h, slot, seq=seq)
                    add(now() - t0)
                    add_id(_RESTORE)
                    break
            if self.fragmented:
                owner = ("live-kv", self._rid)
                self._rid += 1
                t0 = now()
                ok = coord.ensure_free_units(kv_units)
                add(now() - t0)
                add_id(_ENSURE)
                t0 = now()
                ids = pool.reserve_units(kv_units, owner)
                add(now() - t0)
                add_id(_KV_RESERVE)
                if not ok or ids is None:
                    raise RuntimeError("no room for a new request's KV")
                self.kv[slot] = (owner, ids)
        self.admit = []
        t0 = now()  # 3. the drain
        stores, restores = coord.take_checkpoint_ops()
        add(now() - t0)
        add_id(_DRAIN)
        self.stored += len(stores)
        self.restored += len(restores)
        if self.count_runs:
            for op in stores:
                self.runs += _runs(op.unit_ids)
            self.run_images += len(stores)
        self.drained, self.pending = self.pending, [None] * R
        pending, seqs = self.pending, self.seqs
        every, p = self.o.restore_every, self.p
        blocks = p + 1
        for slot in range(R):  # 4. postprocess
            seq = seqs[slot]
            if (slot + p) % every == 0:  # finishes: its slot goes to a new request
                t0 = now()
                coord.forget_pending(seq)
                add(now() - t0)
                add_id(_FORGET)
                if self.fragmented:
                    owner, ids = self.kv[slot]
                    hashes = self._kv_hashes(len(ids))
                    t0 = now()
                    pool.cache_units(ids, owner, hashes)
                    add(now() - t0)
                    add_id(_KV_CACHE)
                self.admit.append(slot)
            else:
                h = self._ckpt_hash
                self._ckpt_hash = h + 1
                t0 = now()
                coord.checkpoint(seq, blocks, h)
                add(now() - t0)
                add_id(_CHECKPOINT)
                pending[slot] = h
        self.p = p + 1


def _timer_floor_ns(samples: int = 100_000) -> float:
    """Median ns of a timed no-op call, timed as the loop times its calls."""
    now = time.perf_counter_ns

    def noop() -> None:
        return None

    out = []
    for _ in range(samples):
        t0 = now()
        noop()
        out.append(now() - t0)
    out.sort()
    return float(out[len(out) // 2])


_Repeat = tuple[np.ndarray, np.ndarray, tuple[int, int, int, int]]


def _one_repeat(loop: _Loop, o: UnitsOptions, tick: Callable[[str], None], where: str) -> _Repeat:
    """``o.passes`` timed passes: the calls' ns and methods, and the images stored,
    restored and released and the ``on_evict`` callbacks fired meanwhile (progress through
    ``tick``, prefixed with ``where``)."""
    loop.clear_samples()
    s0, r0, x0, e0 = loop.stored, loop.restored, loop.released(), loop.on_evict_fired()
    loop.count_runs = True
    for i in range(o.passes):
        loop.run_pass()
        tick(f"{where}, pass {i + 1}/{o.passes}")
    loop.count_runs = False
    counts = (
        loop.stored - s0,
        loop.restored - r0,
        loop.released() - x0,
        loop.on_evict_fired() - e0,
    )
    samples = np.frombuffer(loop.samples, dtype=np.int64).copy()
    ids = np.frombuffer(loop.sample_ids, dtype=np.uint8).copy()
    loop.clear_samples()
    return samples, ids, counts


def _cell_of(
    loop: _Loop, o: UnitsOptions, pool_kind: str, reps: list[_Repeat], setup_s: float, wall_s: float
) -> Cell:
    """A cell's figures from its repeats: paired call by call when every repeat made the
    same calls in the same order (each call at its fastest repeat, as :mod:`.measure` pairs
    replays), else the fastest repeat whole."""
    n_store = len(STORE_METHODS)
    totals = [int(s[ids < n_store].sum()) for s, ids, _ in reps]
    fastest = min(range(len(reps)), key=totals.__getitem__)
    samples, ids, counts = reps[fastest]
    paired = all(np.array_equal(r[1], reps[0][1]) and r[2] == reps[0][2] for r in reps)
    if paired:
        samples = np.minimum.reduce([r[0] for r in reps])
    ns = np.bincount(ids, weights=samples, minlength=len(_M))
    calls = np.bincount(ids, minlength=len(_M))
    stored, restored, released, fired = counts
    errors: list[str] = []
    if released == 0:
        errors.append("no image was released: the pool was not full")
    if o.check:
        errors += loop.coord.self_check()
    return Cell(
        pool=pool_kind,
        running=loop.R,
        units=loop.U,
        pool_units=loop.num_units,
        passes=o.passes,
        paired=paired,
        repeat_store_ns=totals,
        timings={m: [int(ns[i]), int(calls[i])] for m, i in _M.items()},
        stored=stored,
        restored=restored,
        released=released,
        on_evict=fired,
        runs_per_image=loop.runs / loop.run_images if loop.run_images else 0.0,
        setup_s=setup_s,
        wall_s=wall_s,
        errors=errors,
    )


def _group(
    mod: ModuleType, o: UnitsOptions, pool_kind: str, R: int, say: Callable[[str], None]
) -> list[Cell]:
    """Every U of one (pool, R), measured interleaved: each loop is set up and warmed up,
    then repeat after repeat runs each U's loop in turn, so that a busy spell of the machine
    falls on every U alike rather than on one cell. The garbage collector is off from the
    end of the first set-up."""
    last = [time.monotonic()]

    def tick(where: str) -> None:
        if time.monotonic() - last[0] > 5.0:
            say(f"  {pool_kind} R={R}: {where}")
            last[0] = time.monotonic()

    loops: list[_Loop] = []
    setup: list[float] = []
    wall: list[float] = []
    reps: list[list[_Repeat]] = []
    gc.collect()
    was = gc.isenabled()
    try:
        for U in o.units:
            t0 = time.perf_counter()
            loop = _Loop(mod, o, pool_kind, R, U)
            setup.append(time.perf_counter() - t0)
            gc.collect()
            gc.disable()
            for i in range(o.warmup):
                loop.run_pass()
                tick(f"U={U}, warm-up pass {i + 1}/{o.warmup}")
            loop.clear_samples()
            loops.append(loop)
            wall.append(time.perf_counter() - t0)
            reps.append([])
        for rep in range(o.repeat):
            for k, loop in enumerate(loops):
                t0 = time.perf_counter()
                where = f"repeat {rep + 1}/{o.repeat}, U={loop.U}"
                reps[k].append(_one_repeat(loop, o, tick, where))
                wall[k] += time.perf_counter() - t0
    finally:
        if was:
            gc.enable()
    cells = [
        _cell_of(loop, o, pool_kind, reps[k], setup[k], wall[k]) for k, loop in enumerate(loops)
    ]
    del loops
    return cells


def _machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg": [round(x, 2) for x in load],
    }


@dataclass
class Measured:
    """Every cell of one run, with the machine and the measured code."""

    o: UnitsOptions
    cells: list[Cell]
    machine_start: dict[str, Any]
    machine_end: dict[str, Any]
    provenance: str
    floor_ns: float
    date: str
    wall_s: float


def measure(o: UnitsOptions, say: Callable[[str], None] | None = None) -> Measured:
    """Run every cell of the matrix (progress through ``say``, default stderr).

    Raises:
        ImportError: ``o.impl`` cannot be imported or lacks the pool and coordinator.
    """
    if say is None:

        def say(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)

    mod = resolve_impl(o.impl)
    if os.environ.get("COMMIT"):
        # named by the caller: a copy of the tree whose git history may be missing or stale
        # (the device machine's copy reported its first commit as HEAD)
        provenance = f"commit {os.environ['COMMIT']}"
    else:
        provenance = _provenance(mod)
    start = _machine()
    t0 = time.perf_counter()
    say(
        f"bench-units: {o.impl} ({provenance or 'no git'}); {start['platform']},"
        f" {start['cpu_count']} CPUs, load average {start['load_avg']}"
    )
    floor = _timer_floor_ns()
    cells: list[Cell] = []
    n = len(o.pools) * len(o.running) * len(o.units)
    for pool_kind in o.pools:
        for R in o.running:
            for c in _group(mod, o, pool_kind, R, say):
                cells.append(c)
                say(
                    f"[{len(cells)}/{n}] {pool_kind:10s} R={R:<5} U={c.units:<4}"
                    f" {c.us_per_call:7.2f} us/call {c.us_per_image_op:7.2f} us/image-op"
                    f" {c.ms_per_pass:8.3f} ms/pass  runs/image {c.runs_per_image:.1f}"
                    f"  ({c.wall_s:.1f} s)" + (f"  PROBLEM: {c.errors}" if c.errors else "")
                )
    return Measured(
        o=o,
        cells=cells,
        machine_start=start,
        machine_end=_machine(),
        provenance=provenance,
        floor_ns=floor,
        date=time.strftime("%Y-%m-%d %H:%M"),
        wall_s=time.perf_counter() - t0,
    )


def _pools(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in POOLS]
    if bad or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"pools are a list of distinct {POOLS}, got {text!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the section, and write ``--out`` / ``--json`` when given.

    Bad arguments (an empty or non-positive list, an unknown pool, an implementation that
    cannot be imported, an ``--out`` that is a directory or whose markers are out of order)
    exit with argparse's usage error (status 2) before anything runs."""
    d = UnitsOptions()
    pos = _at_least(1)
    ap = argparse.ArgumentParser(
        prog="python -m pagedstate.models.bench.units",
        description="Store host cost against units per image (issue 19).",
    )
    ap.add_argument("--impl", default=d.impl, help="implementation module (%(default)s)")
    ap.add_argument(
        "--units",
        type=_positive_ints,
        default=None,
        help="units per image, e.g. 2,4,390 (" + ",".join(map(str, d.units)) + ")",
    )
    ap.add_argument(
        "--running",
        type=_positive_ints,
        default=None,
        help="running requests (" + ",".join(map(str, d.running)) + ")",
    )
    ap.add_argument("--pools", type=_pools, default=None, help="fresh and/or fragmented (both)")
    ap.add_argument(
        "--images-per-slot",
        type=pos,
        default=None,
        help=f"pool images per request ({d.images_per_slot})",
    )
    ap.add_argument(
        "--kv-units", type=pos, default=None, help=f"live KV per request ({d.kv_units})"
    )
    ap.add_argument(
        "--frag-block",
        type=pos,
        default=None,
        help=f"fragmented set-up block, units ({d.frag_block})",
    )
    ap.add_argument(
        "--restore-every",
        type=pos,
        default=None,
        help=f"one request in N finishes each pass; its successor restores ({d.restore_every})",
    )
    ap.add_argument(
        "--warmup", type=_at_least(0), default=None, help=f"warm-up passes ({d.warmup})"
    )
    ap.add_argument(
        "--passes",
        type=pos,
        default=None,
        help=f"timed passes per repeat ({d.passes}); a multiple of --restore-every pairs the"
        " repeats call by call",
    )
    ap.add_argument(
        "--repeat", type=pos, default=None, help=f"repeats, paired call by call ({d.repeat})"
    )
    ap.add_argument("--check", action="store_true", help="self_check after each cell")
    ap.add_argument("--out", type=Path, default=None, help="Markdown file to update")
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: U {QUICK.units}, R {QUICK.running}, {QUICK.passes} passes x"
        f" {QUICK.repeat}, --restore-every {QUICK.restore_every} (other flags still override)",
    )
    a = ap.parse_args(argv)
    base = QUICK if a.quick else d
    pick: Callable[[Any, Any], Any] = lambda v, dflt: dflt if v is None else v  # noqa: E731
    o = replace(
        base,
        impl=a.impl,
        units=pick(a.units, base.units),
        running=pick(a.running, base.running),
        pools=pick(a.pools, base.pools),
        images_per_slot=pick(a.images_per_slot, base.images_per_slot),
        kv_units=pick(a.kv_units, base.kv_units),
        frag_block=pick(a.frag_block, base.frag_block),
        restore_every=pick(a.restore_every, base.restore_every),
        warmup=pick(a.warmup, base.warmup),
        passes=pick(a.passes, base.passes),
        repeat=pick(a.repeat, base.repeat),
        check=a.check or base.check,
    )
    if not o.units or not o.running:
        ap.error("--units and --running need at least one value each")
    try:
        resolve_impl(o.impl)
    except ImportError as exc:
        ap.error(f"--impl: {exc}")
    if a.out is not None:
        if a.out.is_dir():
            ap.error(f"--out: {a.out} is a directory")
        if a.out.exists():
            try:
                _split_markers(a.out.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                ap.error(f"--out: {a.out}: {exc}")
    if a.json is not None and a.json.is_dir():
        ap.error(f"--json: {a.json} is a directory")
    meas = measure(o)
    text = section(meas, quick=a.quick)
    print(text, flush=True)
    if a.out is not None:
        write_section(a.out, text)
        print(f"wrote {a.out}", file=sys.stderr)
    if a.json is not None:
        write_json(a.json, meas)
        print(f"wrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
