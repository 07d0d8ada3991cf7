"""A replayed request's life (the mixin :class:`_RequestLife` of
:class:`~pagedstate.models.replay.run.ReplayEngine`): the KV prefix index, the checkpoint
placement policies, admission with resumable hits and restores, chunked prefill filing
checkpoints, completion and aborts, and the CPU tier's offload reports."""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from typing import Any

from .config import ReplayConfig
from .errors import Divergence, _text
from .lockstep import _LockstepCalls
from .parts import ReplayExecutor, _Clock, _CpuTier, _fresh_key, _mid_key, _Req
from .trace import TRACE_BLOCK_TOKENS, TraceRequest

#: Owner-tag prefix of a running request's KV reservation (SPEC A.3).
KV_OWNER = "live-kv"


class _RequestLife(_LockstepCalls):
    """The request sections of :class:`~pagedstate.models.replay.run.ReplayEngine` (which
    sets every attribute declared here)."""

    config: ReplayConfig
    executor: ReplayExecutor | None
    tier: _CpuTier | None
    clock: _Clock
    loss_rng: random.Random
    block_units: int
    placement_kind: str
    grid: int
    _live: dict[int, int]
    _cached: OrderedDict[int, None]
    _seen: set[int]
    _free_slots: list[int]
    _offload_due: deque[tuple[float, Any, bool]]
    _filed: bool
    _expect: dict[int, int]

    # -- sizes and the KV prefix index ------------------------------------------------------

    def _kv_units(self, t: TraceRequest) -> int:
        return -(-(t.input_length + max(1, t.output_length)) // self.config.kv_block_tokens)

    def _num_free(self) -> int:
        return int(self._call("pool.num_free"))

    def _trim_cache(self) -> None:
        cap = self._num_free() // self.block_units
        cached = self._cached
        while len(cached) > cap:
            h, _ = cached.popitem(last=False)
            self.c["unindexed"] += 1
            self._call("unindex", h)

    def _kv_hit(self, req: _Req) -> int:
        cap = (req.t.input_length - 1) // TRACE_BLOCK_TOKENS  # S5: never the prompt's end
        n = 0
        live, cached = self._live, self._cached
        for h in req.hashes[:cap]:
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
        """One holder fewer; the last one parks ``h`` as cached at the recently used end.
        Callers drop a prompt's blocks last block first (as vLLM frees them), so the LRU
        evicts a cached prefix from its tail and its head stays reachable longest."""
        left = self._live[h] - 1
        if left:
            self._live[h] = left
        else:
            del self._live[h]
            self._cached[h] = None

    # -- placement ----------------------------------------------------------------------------

    def _boundaries(self, req: _Req, resumed: int) -> list[int]:
        """Checkpoint boundaries (in 512-token blocks) past ``resumed``, ascending."""
        full = req.t.input_length // TRACE_BLOCK_TOKENS
        if self.placement_kind == "end":
            out = [full]
        elif self.placement_kind == "grid":
            out = list(range(self.grid, full + 1, self.grid))
        else:
            seen = self._seen
            deepest = 0
            for i in range(full - 1, -1, -1):
                if req.t.hash_ids[i] in seen:
                    deepest = i + 1
                    break
            out = [deepest, full] if deepest < full else [full]
        return [b for b in out if b > resumed]

    # -- a request's life -------------------------------------------------------------------

    def _abort(self, req: _Req, where: str) -> None:
        self._call("forget_pending", req)
        if req.kv_units:
            self._call("pool.release_units", req.kv_units, (KV_OWNER, req.t.index))
            req.kv_units = []
        for h in reversed(req.hashes[: req.published]):
            self._drop(h)
        self._release_slot(req)
        self.c["aborted"] += 1
        self.c[f"aborted_{where}"] += 1

    def _release_slot(self, req: _Req) -> None:
        if req.state_slot >= 0:
            self._expect.pop(req.state_slot, None)
            self._free_slots.append(req.state_slot)
            self._free_slots.sort(reverse=True)
            req.state_slot = -1

    def _admit(self, req: _Req, idle: bool) -> str:
        """``"ok"``, ``"blocked"`` (no room now) or ``"aborted"``. ``idle``: nothing runs, so
        waiting frees nothing; the request then gives up its resume point if protecting it
        is what keeps it out (the image is evicted instead)."""
        hit = self._kv_hit(req)
        r = self._call("resumable_hit", req, hit, req.hashes) if hit else 0
        if type(r) is not int or not 0 <= r <= hit:
            # S5 rests on this: the KV hit is capped below the prompt's end, and a resume
            # point past it would skip computing the prompt's last tokens
            raise Divergence(
                self.step - 1,
                self._call_text("resumable_hit", (req, hit, req.hashes)),
                _text(r),
                f"an int in [0, {hit}] (the KV hit, capped below the prompt's end: S5)",
            )
        need = self._kv_units(req.t)
        protected = req.hashes[r - 1] if r else None
        if not self._call("has_available_units", need, protected):
            if not (idle and r and self._call("has_available_units", need, None)):
                return "blocked"
            r, protected = 0, None
            self.c["resumes_given_up"] += 1
        slot = self._free_slots.pop()
        req.state_slot = slot
        cpu = False
        if r:
            h = req.hashes[r - 1]
            if self._call("begin_restore", h, slot):
                if self._call("restore_queued_for", slot):  # S9: evidence before counting
                    self.c["restores_queued"] += 1
                    self._expect[slot] = h
                else:
                    self.c["restores_missing"] += 1
                    r = 0
            elif self.tier is not None and self.tier.could_serve(h):
                cpu = True  # the engine copies it from host memory itself
                self.tier.touch(h)
            else:
                self.c["restores_missing"] += 1
                r = 0
        if req.abort_at is not None and req.abort_at[0] == "after_hit":
            self._abort(req, "after_hit")
            return "aborted"
        if not self._call("ensure_free_units", need):
            raise RuntimeError("ensure_free_units refused after a passing gate")
        units = self._call("pool.reserve_units", need, (KV_OWNER, req.t.index))
        if units is None:
            raise RuntimeError("reserve_units refused after ensure_free_units")
        req.kv_units = list(units)
        for h in req.hashes[:r]:
            self._hold(h)
        req.published = r
        req.computed = r * TRACE_BLOCK_TOKENS
        req.boundaries = self._boundaries(req, r)
        c = self.c
        if hit:
            c["kv_hit_blocks"] += hit
        req.resumed, req.resumed_cpu = r, cpu
        if r:
            if self.executor is not None:
                # the restore (HBM: this pass's drain; CPU tier: the engine) leaves the slot
                # at the boundary; a CPU-tier restore is modelled by writing the state
                if cpu:
                    self.executor.set_state(slot, req.hashes[r - 1])
        elif self.executor is not None:
            self.executor.set_state(slot, _fresh_key(req))
        return "ok"

    def _count_resume(self, req: _Req) -> None:
        c, r = self.c, req.resumed
        if req.resumed_cpu:
            c["cpu_hits"] += 1
            c["cpu_hit_blocks"] += r
        else:
            c["hits"] += 1
            c["hit_blocks"] += r
        c["saved_tokens"] += r * TRACE_BLOCK_TOKENS

    def _prefill_chunk(self, req: _Req) -> None:
        n_in = req.t.input_length
        start = req.computed
        end = min(start + self.config.chunk_tokens, n_in)
        bs = req.boundaries
        while req.next_boundary < len(bs) and bs[req.next_boundary] * TRACE_BLOCK_TOKENS <= start:
            req.next_boundary += 1
        if req.next_boundary < len(bs):
            end = min(end, bs[req.next_boundary] * TRACE_BLOCK_TOKENS)
        req.computed = end
        req.chunks += 1
        full = end // TRACE_BLOCK_TOKENS
        for i in range(req.published, full):
            self._hold(req.hashes[i])
        req.published = max(req.published, full)
        at_boundary = (
            req.next_boundary < len(bs) and end == bs[req.next_boundary] * TRACE_BLOCK_TOKENS
        )
        if self.executor is not None:
            self.executor.set_state(
                req.state_slot,
                req.hashes[full - 1]
                if end % TRACE_BLOCK_TOKENS == 0 and full
                else _mid_key(req, end),
            )
        if at_boundary:
            b = bs[req.next_boundary]
            req.next_boundary += 1
            self.c["checkpoints_filed"] += 1
            self._filed = True
            self._call("checkpoint", req, b * self.block_units, req.hashes[b - 1])
        if end == n_in:
            req.generated = 1  # the last prefill chunk yields the first token
            for i in range(n_in // TRACE_BLOCK_TOKENS):
                self._seen.add(req.t.hash_ids[i])

    def _complete(self, req: _Req) -> None:
        self._call("forget_pending", req)
        self._release_slot(req)
        self._call("pool.release_units", req.kv_units, (KV_OWNER, req.t.index))
        req.kv_units = []
        for h in reversed(req.hashes[: req.published]):
            self._drop(h)
        self.c["completed"] += 1

    # -- offload ------------------------------------------------------------------------------

    def _offload_reports(self) -> None:
        due = self._offload_due
        now = self.clock.now_ms
        while due and due[0][0] <= now:
            _, op, lost = due.popleft()
            if lost:
                self.c["offload_reports_lost"] += 1
                continue
            self._call("release_offload_store_source", op)
            self._call("settle_offload_store", op)
            self.c["offload_reports"] += 1
            assert self.tier is not None
            self.tier.add(op.prefix_hash)
        self.c["offload_reclaimed"] += int(
            self._call("reclaim_stale_offload_pins", self.config.offload_timeout_s)
        )

    def _offload_take(self) -> None:
        cfg = self.config
        ops = self._call("take_offload_stores", cfg.offload_max_inflight)
        for op, _units in ops:
            self.c["offload_stores"] += 1
            lost = self.loss_rng.random() < cfg.offload_loss_rate
            self._offload_due.append((self.clock.now_ms + cfg.offload_delay_ms, op, lost))
