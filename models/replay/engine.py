"""A simple engine loop that replays a request trace through a checkpoint coordinator.

This is a *workload model*, written to drive the store's public calls in the order and mix an
engine would (SPEC D.1), so that their cost can be measured (``make bench``) and so that the
reference model can be checked on a long, realistic call sequence (``tests/test_engine.py``).
It computes nothing and runs no device work.

What it models
--------------
- **Arrivals.** Trace requests (Mooncake ``jsonl``: ``timestamp`` ms, ``input_length``,
  ``output_length``, ``hash_ids``, one hash per 512-token block) arrive at
  ``timestamp * arrival_scale`` ms of simulated time (``arrival_scale=0``: all at once, a
  saturated queue). A pass takes ``pass_ms`` of simulated time; when nothing runs or waits,
  the clock jumps to the next arrival. The replay ends when every request has finished, or
  (``stop_when_drained``) at the first pass with nothing left to arrive or waiting, so that a
  benchmark covers only the part where the queue keeps every slot busy.
- **One pass** (SPEC D.1, in order):

  1. ``complete_previous_batch()`` (publishes the last drain's stores, releases its restore
     pins);
  2. admission, FIFO, while a state slot is free (``max_running`` slots = the concurrency) and
     the pool can take the request's KV units; the first request that does not fit stops
     admission for this pass (head-of-line). A request is admitted as:

     - ``hit`` = leading prompt blocks whose hash the KV prefix index holds (capped so at
       least one prompt token is computed); ``r = resumable_hit(seq, hit, hashes)``;
     - gate: ``has_available_units(kv_blocks, protected_hash=hashes[r-1])``;
     - on ``r > 0``: ``begin_restore(hashes[r-1], slot)``, *before* any fresh KV unit, so the
       source is pinned;
     - ``ensure_free_units(kv_blocks)`` then ``pool.reserve_units(kv_blocks, ("live-kv",
       rid))``: the request holds every KV block of its prompt and output, reserved at once
       (this may evict unpinned READY checkpoints, SPEC A.4);

  3. the drain ``take_checkpoint_ops()``, when the batch (the running requests) is
     non-empty;
  4. the forward's progress: every request in prefill computes one chunk (``chunk_blocks``
     blocks, resuming after block ``r``; chunks end on block boundaries, and a prompt's
     partial last block is a short chunk of its own), publishes the chunk's full-block hashes
     in the KV prefix index and files ``checkpoint(seq, boundary_blocks, hashes[boundary-1])``
     at the chunk end (block-aligned ends only); every request in decode generates
     ``decode_tokens_per_pass`` tokens (the prefill pass yields the first);
  5. completion: ``forget_pending(seq)``, the slot is freed, ``pool.release_units`` returns
     the KV units, and the request's prompt hashes go back to the prefix index as cached.

- **KV prefix index (the model of the engine's prefix cache).** A hash is *live* while a
  running request holds its block (reference counted) and *cached* once no running request
  does; cached hashes sit in an LRU. Cached blocks occupy free pool units, so the LRU is
  trimmed to ``min(pool.num_free, kv_cache_blocks)`` after every call that can shrink the
  free count (admission, drain); every hash it drops is evicted from the prefix cache and
  reported with ``coordinator.unindex(h)`` (SPEC D.1 step 9). A hit claims cached blocks
  (they become live). Trace hash ids are already prefix-chained (equal id at equal position
  means equal prefix), so an id is used as the prefix hash ``h`` directly.

What it leaves out
------------------
- No device work and no data: stores and restores are ops handed back and dropped.
- KV sharing between *running* requests is not reflected in unit accounting: every running
  request is charged all its blocks (a hit on a block another running request holds still
  costs a unit), so the pool is slightly more loaded than in an engine that shares.
- ``unindex`` is called after the call that shrank the free count, never re-entrantly from
  inside ``reserve_units`` (an engine's own pool fires it inside allocation, SPEC A.4).
- No decode-time checkpoints (decoded blocks carry no trace hashes), no midstep scratch
  stores (a partial last block is never checkpointed), no CPU offload tier, no external
  transfers, no preemption (KV is reserved whole at admission, so a running request never
  runs out), no token budget per pass beyond one chunk per prefilling request.
- A request that cannot fit an empty pool is rejected (counted), never admitted.

How the per-call cost is measured
---------------------------------
Every call into the implementation (coordinator methods and the pool's ``reserve_units``,
``release_units`` and ``num_free``) goes through one place, :meth:`CallTimer.call` (the
engine's ``_call``), which reads ``time.perf_counter_ns()`` immediately before and after the
call and adds the difference to that method's total; the bookkeeping (dictionary update,
counting) happens outside the timed interval. A timed interval therefore contains the call
itself (argument passing, the method's body, the return) plus part of one
``perf_counter_ns`` call: :func:`timer_floor_ns` measures
that floor (the same wrapper around a no-op), which is reported beside the figures and not
subtracted. Time spent in the engine's own bookkeeping is ``wall - timed``. With
``keep_samples`` the timer also keeps every call's duration in call order; the loop is
deterministic (no randomness, FIFO admission, lowest free slot first, insertion-ordered maps),
so two replays make the same calls in the same order and :mod:`pagedstate.models.bench`
pairs them call by call to drop time a call spent preempted. The end-of-run
``checkpoint_fates()`` and the tests' ``snapshot()`` are not timed.
"""

from __future__ import annotations

import gc
import heapq
import importlib
import json
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pagedstate.spec.types import PagedStateCheckpointSpec

from .timing import CallTimer, timer_floor_ns
from .trace import DEFAULT_TRACE, prefix_hash

__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_TRACE",
    "EngineConfig",
    "EngineResult",
    "Engine",
    "CallTimer",
    "TraceRequest",
    "load_trace",
    "prefix_hash",
    "resolve_impl",
    "run_trace",
    "timer_floor_ns",
]

#: Tokens per hash block in the Mooncake traces (their README).
BLOCK_TOKENS = 512
#: Owner-tag prefix of a running request's KV reservation (SPEC A.3).
KV_OWNER = "live-kv"

#: The timer's names for ``coordinator.unindex``: a call that found nothing to drop (most
#: evicted prefixes have no checkpoint, pending boundary or queued scratch store), and one
#: that dropped something (counted as an orphan). Timed apart: the two cost very different
#: amounts, and their mix moves with the pool size.
UNINDEX_MISS = "unindex (found nothing)"
UNINDEX_DROP = "unindex (orphaned)"
#: Prefix hashes of records a run pre-populates: far above any trace id.
PREPOP_HASH_BASE = 1 << 40


@dataclass(frozen=True)
class TraceRequest:
    """One trace line."""

    index: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: Path | str = DEFAULT_TRACE, limit: int | None = None) -> list[TraceRequest]:
    """The first ``limit`` requests (all when ``None``) of a Mooncake-format ``jsonl`` trace."""
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            d = json.loads(line)
            out.append(
                TraceRequest(
                    index=len(out),
                    timestamp_ms=int(d["timestamp"]),
                    input_length=int(d["input_length"]),
                    output_length=int(d["output_length"]),
                    hash_ids=tuple(int(h) for h in d["hash_ids"]),
                )
            )
    return out


def resolve_impl(name: str) -> ModuleType:
    """Import the implementation module ``name`` at run time; it must offer ``UnitPool`` and
    ``PagedStateCheckpointCoordinator`` with the reference model's constructors.

    Raises:
        ImportError: the module or one of the two classes is missing.
    """
    mod = importlib.import_module(name)
    missing = [a for a in ("UnitPool", "PagedStateCheckpointCoordinator") if not hasattr(mod, a)]
    if missing:
        raise ImportError(f"{name} has no {' or '.join(missing)}")
    return mod


@dataclass(frozen=True)
class EngineConfig:
    """The engine model's knobs (see the module docstring for what each one models)."""

    max_running: int = 64
    pool_units: int = 4096
    units_per_checkpoint: int = 2
    chunk_blocks: int = 4
    decode_tokens_per_pass: int = 1
    pass_ms: float = 10.0
    arrival_scale: float = 1.0
    kv_cache_blocks: int | None = None
    block_tokens: int = BLOCK_TOKENS
    #: End the replay at the first pass that finds no request waiting or still to arrive,
    #: leaving the tail running (a benchmark measures the saturated part only).
    stop_when_drained: bool = False

    def spec(self) -> PagedStateCheckpointSpec:
        """An image of ``units_per_checkpoint`` pages of 4 KiB (the byte sizes are nominal)."""
        page = 4096
        image = self.units_per_checkpoint * page
        return PagedStateCheckpointSpec(
            page_unit_bytes=page, slot_bytes=image, layout_id="bench-v1", image_bytes=image
        )


class Request:
    """A running or waiting request; the coordinator's ``SequenceLike``."""

    __slots__ = (
        "rid",
        "trace",
        "hashes",
        "state_slot",
        "has_per_req_cache",
        "computed",
        "checkpointed_blocks",
        "published_blocks",
        "generated",
        "kv_units",
    )

    def __init__(self, trace: TraceRequest) -> None:
        self.rid = trace.index
        self.trace = trace
        self.hashes = [prefix_hash(h) for h in trace.hash_ids]
        self.state_slot = -1
        self.has_per_req_cache = True
        self.computed = 0  # prompt tokens whose state exists
        self.checkpointed_blocks = 0
        self.published_blocks = 0  # prompt blocks whose hash this request holds live
        self.generated = 0
        self.kv_units: list[int] = []


class _Seq:
    """A stand-in sequence for pre-populating records."""

    __slots__ = ("state_slot", "has_per_req_cache")

    def __init__(self) -> None:
        self.state_slot = 0
        self.has_per_req_cache = True


@dataclass
class EngineResult:
    """What one replay measured."""

    impl: str
    config: EngineConfig
    requests: int
    counters: dict[str, int]
    fates: dict[str, int]
    #: method name -> [total ns, calls]
    timings: dict[str, list[int]]
    wall_s: float
    #: CPU seconds of this process over the replay; well below ``wall_s`` means the machine
    #: was shared and the timings are inflated by preemption.
    cpu_s: float
    prepopulated: int = 0
    running_at_end: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    #: Per-call durations and method ids (into ``methods``), in call order, when the engine
    #: was asked to keep them (see :class:`CallTimer`); empty otherwise.
    samples: array[int] = field(default_factory=lambda: array("q"))
    sample_methods: array[int] = field(default_factory=lambda: array("H"))
    methods: list[str] = field(default_factory=list)
    #: method name -> units of work its calls did (see :class:`CallTimer`, ``work``).
    work: dict[str, int] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        return sum(c for _, c in self.timings.values())

    @property
    def timed_ns(self) -> int:
        return sum(ns for ns, _ in self.timings.values())

    def us_per_call(self, methods: Iterable[str] | None = None) -> float:
        """Mean microseconds per call over ``methods`` (all timed methods when ``None``)."""
        names = list(self.timings) if methods is None else [m for m in methods]
        ns = sum(self.timings[m][0] for m in names if m in self.timings)
        calls = sum(self.timings[m][1] for m in names if m in self.timings)
        return ns / calls / 1000.0 if calls else 0.0


class Engine:
    """The engine loop over one implementation module (see the module docstring).

    Args:
        config: the engine model's knobs.
        trace: the requests, in arrival order.
        impl: the implementation module, or its name for :func:`resolve_impl`.
        on_pass: called after every pass with the engine (for invariant checks; untimed).
        prepopulate: READY records filed before the replay under hashes no trace request
            has (through the coordinator's own calls, untimed).
    """

    def __init__(
        self,
        config: EngineConfig,
        trace: list[TraceRequest],
        impl: ModuleType | str = "pagedstate.models.reference",
        on_pass: Callable[[Engine], None] | None = None,
        prepopulate: int = 0,
        keep_samples: bool = False,
    ) -> None:
        if config.max_running < 1 or config.chunk_blocks < 1 or config.decode_tokens_per_pass < 1:
            raise ValueError("max_running, chunk_blocks and decode_tokens_per_pass must be >= 1")
        self.config = config
        self.trace = trace
        self.module = resolve_impl(impl) if isinstance(impl, str) else impl
        self.impl_name = self.module.__name__
        self.pool: Any = self.module.UnitPool(config.pool_units)
        self.coordinator: Any = self.module.PagedStateCheckpointCoordinator(
            self.pool, config.spec(), True
        )
        self.on_pass = on_pass
        self.timer = CallTimer(keep_samples)
        self.timings = self.timer.timings
        #: The one place every implementation call goes through (see the module docstring).
        self._call = self.timer.call
        self._last_drain_ops = 0  # ops of the last drain, published by the next completion
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "passes",
                "drains",
                "admitted",
                "completed",
                "rejected",
                "admission_blocked",
                "kv_hits",
                "kv_hit_blocks",
                "hits",
                "hit_blocks",
                "restores",
                "checkpoints_filed",
                "unindexed",
                "prefill_chunks",
                "peak_running",
            ),
            0,
        )
        # KV prefix index: live hash -> holders; cached hashes in LRU order (oldest first).
        self._live: dict[int, int] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()
        #: Admitted and not finished, in admission order; and arrived, not yet admitted.
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self._free_slots = list(range(config.max_running))
        heapq.heapify(self._free_slots)
        self.prepopulated = self._prepopulate(prepopulate) if prepopulate else 0

    def _num_free(self) -> int:
        return int(self._call("pool.num_free", _read_num_free, self.pool))

    # -- set-up ---------------------------------------------------------------------------

    def _prepopulate(self, n: int, batch: int = 1024) -> int:
        """File ``n`` READY records through checkpoint / drain / complete (untimed)."""
        c = self.coordinator
        made = 0
        while made < n:
            k = min(batch, n - made)
            seqs = [_Seq() for _ in range(k)]
            for i, s in enumerate(seqs):
                c.checkpoint(s, 1, prefix_hash(PREPOP_HASH_BASE + made + i))
            stores, _ = c.take_checkpoint_ops()
            c.complete_previous_batch()
            if len(stores) != k:
                raise RuntimeError(
                    f"pre-populating: {len(stores)} of {k} stores begun (pool too small?)"
                )
            made += k
        return made

    # -- KV prefix index ------------------------------------------------------------------

    def _evictions(self) -> int:
        return int(self.coordinator.store.evictions)

    def _trim_cache(self) -> None:
        cap = self._num_free()
        if self.config.kv_cache_blocks is not None:
            cap = min(cap, self.config.kv_cache_blocks)
        cached = self._cached
        while len(cached) > max(0, cap):
            h, _ = cached.popitem(last=False)
            self.counters["unindexed"] += 1
            c = self.coordinator
            gone = c.checkpoints_orphaned
            self._call(UNINDEX_MISS, c.unindex, h)
            if c.checkpoints_orphaned != gone:
                # dropped something (a checkpoint, pending boundaries, queued scratch
                # stores): a different kind of call from the many that find nothing
                self.timer.relabel_last(UNINDEX_MISS, UNINDEX_DROP)
                self.timer.credit(UNINDEX_DROP, c.checkpoints_orphaned - gone)

    def _kv_hit(self, req: Request) -> int:
        cap = (req.trace.input_length - 1) // self.config.block_tokens
        n = 0
        live, cached = self._live, self._cached
        for h in req.hashes[: max(0, cap)]:
            if h in live or h in cached:
                n += 1
            else:
                break
        return n

    def _hold(self, h: int) -> None:
        if h in self._cached:
            del self._cached[h]
        self._live[h] = self._live.get(h, 0) + 1

    def _drop(self, h: int) -> None:
        left = self._live[h] - 1
        if left:
            self._live[h] = left
        else:
            del self._live[h]
            self._cached[h] = None  # most recently used end

    @property
    def cached_blocks(self) -> int:
        """Hashes the KV prefix index holds as cached (in free units)."""
        return len(self._cached)

    # -- admission, progress, completion --------------------------------------------------

    def _kv_blocks(self, t: TraceRequest) -> int:
        b = self.config.block_tokens
        return -(-(t.input_length + max(1, t.output_length)) // b)

    def _admit(self, req: Request) -> bool:
        c = self.coordinator
        hit = self._kv_hit(req)
        r = self._call("resumable_hit", c.resumable_hit, req, hit, req.hashes) if hit else 0
        need = self._kv_blocks(req.trace)
        protected = req.hashes[r - 1] if r else None
        if not self._call("has_available_units", c.has_available_units, need, protected):
            return False
        slot = heapq.heappop(self._free_slots)
        req.state_slot = slot
        if r:
            if not self._call("begin_restore", c.begin_restore, req.hashes[r - 1], slot):
                raise RuntimeError("gated checkpoint disappeared before state attach")
            self.counters["restores"] += 1
        spent = self._evictions()
        room = self._call("ensure_free_units", c.ensure_free_units, need)
        self.timer.credit("ensure_free_units", self._evictions() - spent)
        if not room:
            raise RuntimeError("ensure_free_units refused after a passing gate")
        units = self._call("pool.reserve_units", self.pool.reserve_units, need, (KV_OWNER, req.rid))
        self.timer.credit("pool.reserve_units", max(need, 1) - 1)
        if units is None:
            raise RuntimeError("reserve_units refused after ensure_free_units")
        req.kv_units = list(units)
        for h in req.hashes[:r]:
            self._hold(h)
        req.published_blocks = r
        req.checkpointed_blocks = r
        req.computed = r * self.config.block_tokens
        cnt = self.counters
        cnt["admitted"] += 1
        if hit:
            cnt["kv_hits"] += 1
            cnt["kv_hit_blocks"] += hit
        if r:
            cnt["hits"] += 1
            cnt["hit_blocks"] += r
        return True

    def _prefill_chunk(self, req: Request) -> None:
        b = self.config.block_tokens
        n_in = req.trace.input_length
        aligned = (n_in // b) * b
        start = req.computed
        if start < aligned:
            end = min(start + self.config.chunk_blocks * b, aligned)
        else:
            end = n_in
        req.computed = end
        self.counters["prefill_chunks"] += 1
        full = end // b
        for i in range(req.published_blocks, full):
            self._hold(req.hashes[i])
        req.published_blocks = max(req.published_blocks, full)
        if end % b == 0 and full > req.checkpointed_blocks:
            req.checkpointed_blocks = full
            self.counters["checkpoints_filed"] += 1
            self._call("checkpoint", self.coordinator.checkpoint, req, full, req.hashes[full - 1])
        if end == n_in:
            req.generated = 1  # the last prefill chunk yields the first token

    def _complete(self, req: Request) -> None:
        self._call("forget_pending", self.coordinator.forget_pending, req)
        heapq.heappush(self._free_slots, req.state_slot)
        req.state_slot = -1
        self._call("pool.release_units", self.pool.release_units, req.kv_units, (KV_OWNER, req.rid))
        self.timer.credit("pool.release_units", max(len(req.kv_units), 1) - 1)
        req.kv_units = []
        for h in req.hashes[: req.published_blocks]:
            self._drop(h)
        self.counters["completed"] += 1

    def _pass(self, waiting: deque[Request], running: list[Request]) -> None:
        """One scheduler pass (SPEC D.1): complete, admit, drain, progress, complete."""
        c = self.coordinator
        cnt = self.counters
        cnt["passes"] += 1
        self._call("complete_previous_batch", c.complete_previous_batch)
        self.timer.credit("complete_previous_batch", self._last_drain_ops)
        self._last_drain_ops = 0
        admitted = False
        while waiting and self._free_slots:
            if not self._admit(waiting[0]):
                cnt["admission_blocked"] += 1
                if not running and not admitted:
                    waiting.popleft()  # cannot fit even an idle pool
                    cnt["rejected"] += 1
                    continue
                break
            running.append(waiting.popleft())
            admitted = True
            self._trim_cache()
        cnt["peak_running"] = max(cnt["peak_running"], len(running))
        if running:
            cnt["drains"] += 1
            spent = self._evictions()
            stores, restores = self._call("take_checkpoint_ops", c.take_checkpoint_ops)
            self._last_drain_ops = len(stores) + len(restores)
            self.timer.credit(
                "take_checkpoint_ops", self._last_drain_ops + self._evictions() - spent
            )
            self._trim_cache()
        finished: list[Request] = []
        d = self.config.decode_tokens_per_pass
        for req in running:
            if req.computed < req.trace.input_length:
                self._prefill_chunk(req)
            else:
                req.generated += d
            if req.computed >= req.trace.input_length and req.generated >= req.trace.output_length:
                finished.append(req)
        if finished:
            done = {id(r) for r in finished}
            running[:] = [r for r in running if id(r) not in done]
            for req in finished:
                self._complete(req)

    # -- the replay -----------------------------------------------------------------------

    def run(self, *, disable_gc: bool = True) -> EngineResult:
        """Replay the whole trace; returns counters, fates and per-method timings.

        With ``disable_gc`` the cyclic garbage collector is off during the replay (after a
        full collection), so its pauses are not charged to whichever call they land in."""
        cfg = self.config
        arrivals = deque(self.trace)
        waiting, running = self.waiting, self.running
        now = 0.0
        was_enabled = gc.isenabled()
        if disable_gc:
            gc.collect()
            gc.disable()
        t_start = time.perf_counter()
        c_start = time.process_time()
        try:
            while arrivals or waiting or running:
                if cfg.stop_when_drained and not arrivals and not waiting:
                    break
                if not waiting and not running:
                    now = max(now, arrivals[0].timestamp_ms * cfg.arrival_scale)
                while arrivals and arrivals[0].timestamp_ms * cfg.arrival_scale <= now:
                    waiting.append(Request(arrivals.popleft()))
                self._pass(waiting, running)
                if self.on_pass is not None:
                    self.on_pass(self)
                now += cfg.pass_ms
        finally:
            wall = time.perf_counter() - t_start
            cpu = time.process_time() - c_start
            if disable_gc and was_enabled:
                gc.enable()
        fates = dict(self.coordinator.checkpoint_fates())
        return EngineResult(
            impl=self.impl_name,
            config=cfg,
            requests=len(self.trace),
            counters=dict(self.counters),
            fates=fates,
            timings={k: list(v) for k, v in self.timings.items()},
            work={k: v[1] + self.timer.extra_work.get(k, 0) for k, v in self.timings.items()},
            wall_s=wall,
            cpu_s=cpu,
            prepopulated=self.prepopulated,
            running_at_end=len(running),
            samples=self.timer.samples,
            sample_methods=self.timer.sample_methods,
            methods=list(self.timer.methods),
        )


def _read_num_free(pool: Any) -> int:
    return int(pool.num_free)


def run_trace(
    config: EngineConfig,
    trace: list[TraceRequest],
    impl: ModuleType | str = "pagedstate.models.reference",
    *,
    prepopulate: int = 0,
    on_pass: Callable[[Engine], None] | None = None,
    keep_samples: bool = False,
) -> EngineResult:
    """Build an :class:`Engine` and replay ``trace`` once."""
    engine = Engine(
        config, trace, impl, on_pass=on_pass, prepopulate=prepopulate, keep_samples=keep_samples
    )
    return engine.run()
