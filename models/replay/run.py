"""Replay a real request trace through the checkpoint store (``pagedstate replay``).

The engine model here is what a user runs to see what prefix caching of recurrent state buys
on a real workload, and to check a store under it. It drives the production store (taken by
module name at run time, ``pagedstate.impl`` by default) through the calls an engine makes
(SPEC D.1), on a simulated clock that respects the trace's timestamps, and optionally runs the
reference model in lockstep (``verify``): every call is made on both and the first
disagreement stops the run with the step, the call and both answers.

What it models
--------------
- **Geometry.** A model of ``model_geometries.json`` (through ``pagedstate.gpu``'s geometry
  loader) sets the bytes of one unit (``kv_block_tokens`` tokens of KV in every attention
  layer) and of one checkpoint image (every recurrent layer's conv and SSM state); the pool
  holds ``pool_bytes // unit_bytes`` units and an image takes ``ceil(image / unit)`` of them.
  KV pages and checkpoint images share that one pool (the point of the design: SPEC A).
- **Clock and arrivals.** Requests arrive at their trace ``timestamp`` (ms). One scheduler
  pass takes ``pass_ms`` of simulated time and decodes one token per decoding request (a fixed
  decode rate of ``1000 / pass_ms`` tokens per second). When no request is prefilling, none
  waits and the pass filed no checkpoint, the passes until the next event (an arrival, a
  request finishing, an offload report or reclaim) are taken as one long pass: they would
  make the same store calls (empty drains and completions) at different times, which only
  the CPU tier's pin stamps could see.
- **Admission** (FIFO, up to ``max_running`` state slots, head-of-line): the KV hit is the
  leading prompt blocks the KV prefix index holds, capped so that at least one prompt token
  is computed (a resume point is never at or past the prompt's end, SPEC S5);
  ``r = resumable_hit(seq, hit, hashes)``; the gate ``has_available_units`` protects
  ``hashes[r-1]``; when the image is in the store, ``begin_restore`` queues it into the slot
  only if ``restore_queued_for(slot)`` says a restore will write the slot (S9; the next drain
  must then deliver it, or the run stops); when only the CPU tier has it, the host copy is
  the engine's, not the store's. A resume counts (hits, tokens saved) at the request's first
  forward, once its restore ran: an abort before that counts none. A store answering a resume
  point past the KV hit it was given stops the run. Then ``ensure_free_units`` and the
  request's KV reservation (every page of prompt and output, reserved at once). If nothing
  runs and the request only fits by evicting the image it would resume from, it resumes from
  nothing (``resumes_given_up``); if it does not fit even so, it waits while an offload pin
  holds room (reclaimed after its timeout), else it is ``rejected``.
- **Prefill** in chunks of ``chunk_tokens`` per pass, resumed after block ``r``; a chunk also
  ends at each checkpoint boundary of the placement policy, where ``checkpoint`` is filed:
  ``end`` (the prompt's last full block), ``grid:K`` (every K blocks), ``anchor`` (the deepest
  boundary the prompt shares with an earlier request, plus the prompt's end).
- **Each pass** (SPEC D.1): ``complete_previous_batch``; offload reports due; admission; the
  drain ``take_checkpoint_ops`` (its ops run on the copy executor, if any); the CPU tier takes
  nominated stores; the forward (prefill chunks, decode tokens); completions
  (``forget_pending``, the KV pages go back, the prompt's blocks stay cached in the KV prefix
  index while the pool has room). When the prefix index drops a block, ``unindex`` reports it.
- **Aborts**: each request is drawn for an abort with probability ``abort_rate``, at a random
  point: between the hit and the allocation, before the drain of the pass that admitted it,
  or after 1 to 4 prefill chunks (after its last one if it has fewer). Every drawn abort
  happens. An abort is ``forget_pending`` (it cancels a queued restore and drops a filed
  boundary) and the KV pages go back.
- **CPU tier** (``offload``): a capacity-bounded LRU index of prefix hashes
  (``could_serve``); each pass hands nominated images over (``take_offload_stores``), each
  report arrives ``offload_delay_ms`` later (``release_offload_store_source`` then
  ``settle_offload_store``) except a ``offload_loss_rate`` share, which is lost: the pin is
  reclaimed after ``offload_timeout_s`` (``reclaim_stale_offload_pins``, a forfeit); the run
  goes on until every pin is settled or reclaimed. A CPU-tier load costs nothing here (no
  transfer reservation, no delay), so CPU-tier hit rates are an upper bound.

What it leaves out (and why the figures are still meaningful): KV pages a running request
shares with another running request are charged twice (the pool's tags have one owner), and
the KV prefix index is block-granular (a hash block of 512 tokens is cached or not; its pages
are charged as ``512 / kv_block_tokens`` units of the free count). No decode-time checkpoints
(decoded tokens have no trace hashes), no preemption, no speculative decoding.
"""

from __future__ import annotations

import math
import random
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from .config import ReplayConfig, _geometry, parse_placement
from .errors import Divergence, ReplayError
from .lifecycle import _RequestLife
from .lockstep import _ExecutorPool
from .parts import ReplayExecutor, _Clock, _CpuTier, _Req, _Side, _store_module
from .result import ReplayResult, _percentiles
from .trace import TRACE_BLOCK_TOKENS, TraceRequest, load_trace

__all__ = ["MAX_POOL_UNITS", "ReplayEngine", "replay"]

#: The largest pool the replay models, in units (the pools are Python lists of units).
MAX_POOL_UNITS = 1 << 24
_GIB = 1 << 30


class ReplayEngine(_RequestLife):
    """The engine model (module docstring) over one trace and one configuration.

    Its store calls are :class:`~.lockstep._LockstepCalls`' and a request's life (the KV
    prefix index, placement, admission, prefill, completion, aborts, offload reports)
    :class:`~.lifecycle._RequestLife`'s; here: the set-up, the pass and the run.

    Args:
        config: the knobs.
        trace: the requests, in arrival order (:func:`load_trace`).
        impl: the production module (``UnitPool``, ``PagedStateCheckpointCoordinator``).
        reference: the reference module, used when ``config.verify``.
        executor_factory: builds the copy executor from ``(layout, pool_units, slots,
            pool)``; None runs no device work.
        progress: called with ``(requests finished, total)`` after every pass.

    Raises:
        ReplayError: unknown model, a pool too small for one image or for a request of the
            trace (naming its line), bad knobs.
    """

    def __init__(
        self,
        config: ReplayConfig,
        trace: Sequence[TraceRequest],
        impl: ModuleType | str = "pagedstate.impl",
        reference: ModuleType | str = "pagedstate.models.reference",
        executor_factory: Callable[..., ReplayExecutor] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        if not trace:
            raise ReplayError("the trace has no requests")
        self.config = config
        self.trace = list(trace)
        self.layout = _geometry(config.model_id, config.kv_block_tokens)
        spec = self.layout.spec()
        self.unit_bytes = int(self.layout.page_unit_bytes)
        self.image_units = int(spec.units_per_checkpoint)
        self.units = int(config.pool_gib * _GIB) // self.unit_bytes
        gib = config.pool_gib
        if self.units > MAX_POOL_UNITS:
            raise ReplayError(
                f"a pool of {gib:g} GiB is {self.units:,} units of {self.unit_bytes:,} bytes;"
                f" the replay models at most {MAX_POOL_UNITS:,} units (a smaller pool, or"
                " larger --kv-block-tokens)"
            )
        if self.units < self.image_units:
            raise ReplayError(
                f"a pool of {gib:g} GiB is {self.units} units of {self.unit_bytes:,} bytes;"
                f" one checkpoint image of {config.model_id} needs {self.image_units}"
            )
        self.block_units = TRACE_BLOCK_TOKENS // config.kv_block_tokens
        for t in self.trace:
            need = self._kv_units(t)
            if need > self.units:
                raise ReplayError(
                    f"a pool of {gib:g} GiB ({self.units} units) cannot hold the request at"
                    f" trace line {t.line}: {t.input_length}+{t.output_length} tokens need"
                    f" {need} units of {config.kv_block_tokens} tokens"
                )
        kind, k = parse_placement(config.placement)
        self.placement_kind, self.grid = kind, k
        self.clock = _Clock()
        self.tier: _CpuTier | None = None
        if config.offload:
            cap = max(1, int(config.offload_gib * _GIB) // max(1, int(self.layout.image_bytes)))
            self.tier = _CpuTier(cap)
        mod = _store_module(impl)
        self.prod = _Side(mod, self.units, spec, self.tier, self.clock)
        self.ref: _Side | None = None
        if config.verify:
            self.ref = _Side(_store_module(reference), self.units, spec, self.tier, self.clock)
        self.executor = (
            executor_factory(self.layout, self.units, config.max_running, _ExecutorPool(self))
            if executor_factory is not None
            else None
        )
        self.progress = progress
        self.rng = random.Random(config.seed)
        self.loss_rng = random.Random(config.seed ^ 0x5EED)
        self.step = 0
        #: the store method of the latest call (named when a run stops on an error)
        self.last_call = ""
        #: method -> per-call ns (production), in call order.
        self.samples: dict[str, array[int]] = {}
        self.c: dict[str, int] = dict.fromkeys(
            (
                "requests",
                "completed",
                "aborted",
                "aborted_after_hit",
                "aborted_before_drain",
                "aborted_mid_prefill",
                "rejected",
                "passes",
                "skipped_passes",
                "drains",
                "admission_blocked",
                "prompt_blocks",
                "prompt_tokens",
                "kv_hit_blocks",
                "hits",
                "hit_blocks",
                "cpu_hits",
                "cpu_hit_blocks",
                "saved_tokens",
                "restores_queued",
                "restores_missing",
                "resumes_given_up",
                "restores_checked",
                "checkpoints_filed",
                "unindexed",
                "offload_stores",
                "offload_reports",
                "offload_reports_lost",
                "offload_reclaimed",
                "peak_running",
                "snapshots_compared",
            ),
            0,
        )
        self.c["requests"] = len(self.trace)
        # KV prefix index: live hash -> holders; cached hashes, LRU (oldest first).
        self._live: dict[int, int] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._seen: set[int] = set()  # full-block ids of earlier requests (anchor)
        self._free_slots = list(range(config.max_running))
        self._offload_due: deque[tuple[float, Any, bool]] = deque()
        self._filed = False  # a checkpoint was filed this pass: the next pass drains it
        #: slot -> the prefix hash a queued restore will write into it (executor checks)
        self._expect: dict[int, int] = {}
        self.occupancy: list[list[float]] = []
        self._occ_every_ms = 1.0

    # -- the pass ---------------------------------------------------------------------------

    def _pass(self, waiting: deque[_Req], running: list[_Req]) -> None:
        c = self.c
        c["passes"] += 1
        self._filed = False
        self._call("complete_previous_batch")
        if self.tier is not None:
            self._offload_reports()
        admitted: list[_Req] = []
        while waiting and self._free_slots:
            req = waiting[0]
            got = self._admit(req, not running and not admitted)
            if got == "blocked":
                c["admission_blocked"] += 1
                if not running and not admitted:
                    if self.tier is not None and self.prod.coordinator.has_offload_pins():
                        break  # an offload pin holds the room: reclaimed after its timeout
                    # Nothing runs and nothing will free room: the request needs more than
                    # the pool can give even with every unpinned image evicted.
                    waiting.popleft()
                    c["rejected"] += 1
                    continue
                break
            waiting.popleft()
            if got == "ok":
                req.admitted_pass = c["passes"]
                running.append(req)
                admitted.append(req)
            self._trim_cache()
        if any(r.abort_at is not None and r.abort_at[0] == "before_drain" for r in admitted):
            keep = []
            for r in running:
                if r.abort_at is not None and r.abort_at[0] == "before_drain":
                    self._abort(r, "before_drain")
                else:
                    keep.append(r)
            running[:] = keep
        c["peak_running"] = max(c["peak_running"], len(running))
        if running:
            c["drains"] += 1
            stores, restores = self._call("take_checkpoint_ops")
            expect = self._expect
            if self.executor is not None and (stores or restores):
                self.executor.run_batch(stores, restores)
                for op in restores:
                    self.executor.check_restored(op.dst_slot, expect[op.dst_slot])
                    c["restores_checked"] += 1
            for op in restores:
                if expect.pop(op.dst_slot, None) is None:
                    raise Divergence(
                        self.step - 1,
                        "take_checkpoint_ops()",
                        f"a restore into slot {op.dst_slot}, which no admission queued",
                        "only the restores begin_restore queued",
                    )
            if expect:
                # S9: restore_queued_for promised these, and the drain did not deliver them
                raise Divergence(
                    self.step - 1,
                    "take_checkpoint_ops()",
                    f"no restore into slots {sorted(expect)}",
                    "the restores restore_queued_for reported queued",
                )
            self._trim_cache()
        if self.tier is not None:
            self._offload_take()
        finished: list[_Req] = []
        aborted: list[_Req] = []
        for req in running:
            if req.computed < req.t.input_length:
                if req.chunks == 0 and req.resumed:
                    self._count_resume(req)  # the drain above restored it (or the host did)
                self._prefill_chunk(req)
                a = req.abort_at
                # after its a[1]-th chunk, or its last one if it has fewer
                if (
                    a is not None
                    and a[0] == "mid_prefill"
                    and (req.chunks >= a[1] or req.computed >= req.t.input_length)
                ):
                    aborted.append(req)
                    continue
            else:
                req.generated += 1
            if req.computed >= req.t.input_length and req.generated >= req.t.output_length:
                finished.append(req)
        if finished or aborted:
            gone = {id(r) for r in finished} | {id(r) for r in aborted}
            running[:] = [r for r in running if id(r) not in gone]
            for req in aborted:
                self._abort(req, "mid_prefill")
            for req in finished:
                self._complete(req)
            self._trim_cache()

    def _skip(self, arrivals: deque[_Req], waiting: deque[_Req], running: list[_Req]) -> None:
        """Take the passes until the next event as one (see the module docstring)."""
        if self._filed or waiting or any(r.computed < r.t.input_length for r in running):
            return
        step = self.config.pass_ms
        horizon = math.inf
        if arrivals:
            horizon = arrivals[0].t.timestamp_ms - self.clock.now_ms
        if running:
            left = min(r.t.output_length - r.generated for r in running)
            horizon = min(horizon, max(0, left - 1) * step)
        if self._offload_due:
            horizon = min(horizon, self._offload_due[0][0] - self.clock.now_ms)
        if self.tier is not None and self.prod.coordinator.has_offload_pins():
            horizon = min(horizon, self.config.offload_timeout_s * 1000.0)
        if not running:
            if math.isfinite(horizon) and horizon > 0:
                self.clock.now_ms += horizon
            return
        k = int(horizon // step) - 1
        if k >= 1:
            self.clock.now_ms += k * step
            for r in running:
                r.generated += k
            self.c["skipped_passes"] += k

    def _sample_occupancy(self) -> None:
        free = self.prod.pool.num_free
        store = self.prod.coordinator.store
        ckpt = len(store.records) * self.image_units if hasattr(store, "records") else 0
        kv = self.units - free - ckpt
        self.occupancy.append(
            [
                round(self.clock.now_ms / 1000.0, 3),
                kv,
                ckpt,
                min(free, len(self._cached) * self.block_units),
                free,
            ]
        )

    def run(self) -> ReplayResult:
        """Replay the whole trace (every request completes or aborts).

        Raises:
            Divergence: ``verify`` found the production store and the reference
                disagreeing, or an invariant broken (or the executor found a restore that
                is not bit-exact).
        """
        cfg = self.config
        arrivals: deque[_Req] = deque()
        for t in self.trace:
            req = _Req(t)
            if cfg.abort_rate and self.rng.random() < cfg.abort_rate:
                where = self.rng.choice(("after_hit", "before_drain", "mid_prefill"))
                req.abort_at = (where, self.rng.randint(1, 4))
            self.c["prompt_blocks"] += len(t.hash_ids)
            self.c["prompt_tokens"] += t.input_length
            arrivals.append(req)
        span_ms = max(1.0, float(self.trace[-1].timestamp_ms))
        self._occ_every_ms = span_ms / (cfg.occupancy_points // 2)
        next_occ = 0.0
        waiting: deque[_Req] = deque()
        running: list[_Req] = []
        self._free_slots.sort(reverse=True)
        total = len(self.trace)
        t_start = time.perf_counter()
        tier = self.tier
        coordinator = self.prod.coordinator
        # Lost offload reports leave pins the store reclaims after a timeout: the run goes on
        # (passes with nothing to run) until they are (SPEC D.1 step 11).
        while (
            arrivals
            or waiting
            or running
            or self._offload_due
            or (tier is not None and coordinator.has_offload_pins())
        ):
            clock = self.clock
            if not waiting and not running and arrivals:
                wake = float(arrivals[0].t.timestamp_ms)
                if self._offload_due:
                    wake = min(wake, self._offload_due[0][0])
                clock.now_ms = max(clock.now_ms, wake)
            while arrivals and arrivals[0].t.timestamp_ms <= clock.now_ms:
                waiting.append(arrivals.popleft())
            self._pass(waiting, running)
            if self.ref is not None and self.c["passes"] % cfg.snapshot_every == 0:
                self._compare_snapshots()
            if clock.now_ms >= next_occ:
                self._sample_occupancy()
                if len(self.occupancy) >= cfg.occupancy_points:
                    # keep the whole run in view: every other sample, twice the interval
                    del self.occupancy[1::2]
                    self._occ_every_ms *= 2
                next_occ = clock.now_ms + self._occ_every_ms
            if self.progress is not None:
                self.progress(self.c["completed"] + self.c["aborted"] + self.c["rejected"], total)
            clock.now_ms += cfg.pass_ms
            self._skip(arrivals, waiting, running)
        # the last drain's stores are published by one more completion
        self._call("complete_previous_batch")
        self._sample_occupancy()
        wall = time.perf_counter() - t_start
        if self.ref is not None:
            self._compare_snapshots()
        fates = {k: int(v) for k, v in self.prod.coordinator.checkpoint_fates().items()}
        timings: dict[str, dict[str, float]] = {}
        every: array[int] = array("q")
        for name, s in sorted(self.samples.items()):
            p50, p99 = _percentiles(s)
            timings[name] = {
                "calls": len(s),
                "mean": sum(s) / len(s) / 1000.0 if s else 0.0,
                "p50": p50,
                "p99": p99,
            }
            if name not in ("pool.num_free", "pool.mark_clean"):
                every.extend(s)
        p50, p99 = _percentiles(every)
        timings["overall"] = {
            "calls": len(every),
            "mean": sum(every) / len(every) / 1000.0 if every else 0.0,
            "p50": p50,
            "p99": p99,
        }
        geometry = dict(self.layout.describe())
        geometry.update(
            unit_bytes=self.unit_bytes,
            image_units=self.image_units,
            pool_units=self.units,
            slots=cfg.max_running,
        )
        return ReplayResult(
            config=attrs.asdict(cfg),
            geometry=geometry,
            counters=dict(self.c),
            fates=fates,
            timings_us=timings,
            occupancy=self.occupancy,
            wall_s=wall,
            verified=self.ref is not None,
            executor=self.executor.stats() if self.executor is not None else {},
        )


def replay(
    trace: Sequence[TraceRequest] | Path | str,
    config: ReplayConfig,
    *,
    limit: int | None = None,
    impl: ModuleType | str = "pagedstate.impl",
    executor_factory: Callable[..., ReplayExecutor] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Load ``trace`` (a path, or requests) and replay it once under ``config``.

    Raises:
        ReplayError, TraceError: bad input (nothing was written).
        Divergence: with ``config.verify``, the stores disagreed.
    """
    reqs = load_trace(trace, limit) if isinstance(trace, (str, Path)) else list(trace)[:limit]
    engine = ReplayEngine(config, reqs, impl, executor_factory=executor_factory, progress=progress)
    return engine.run()
