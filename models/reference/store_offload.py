"""The reference store's CPU-tier side (SPEC B.3 rows 15-21, G7): nominations, offload stores
and leases pinned while the tier reads them (settled images only, D.13), their two-phase
reports, the stale-pin reclaimer and the forfeit memory ``was_reclaimed`` answers from. A mixin of
:class:`~.store.PageUnitCheckpointStore`."""

from __future__ import annotations

from collections import deque

from pagedstate.spec import tables as T
from pagedstate.spec.errors import InvalidArgumentError, need_timeout, read_clock
from pagedstate.spec.guards import reclaimed_by_cases
from pagedstate.spec.types import StateStoreOperationId

from ._common import _is_int, _need_int
from .store_core import _OffloadPin, _StoreCore


class _Offload(_StoreCore):
    """Offload stores and leases (SPEC B.3 rows 15-21, G7)."""

    # -- reading --------------------------------------------------------------------------

    @property
    def offload_sink(self) -> bool:
        """Whether READY records are nominated for the CPU tier."""
        return self._offload_sink

    @offload_sink.setter
    def offload_sink(self, on: bool) -> None:
        self._offload_sink = bool(on)
        if not self._offload_sink:
            # C16: no sink, no nominations. Handed-out pins stay until their report.
            self._offload_ready.clear()

    @property
    def store_backlog(self) -> deque[int]:
        """Nominations waiting to be handed to the tier (a copy)."""
        return deque(self._offload_ready)

    def has_offload_pins(self) -> bool:
        """True from dispatch of an offload store or lease until its terminal report."""
        return bool(self._offload_pins)

    def _hash_in_flight(self, prefix_hash: int) -> bool:
        return any(op.prefix_hash == prefix_hash for op in self._offload_pins)

    def was_reclaimed(self, op: StateStoreOperationId) -> bool:
        """Whether ``op``'s source was taken back before it reported (G7: fails closed)."""
        self._need_op(op)
        return reclaimed_by_cases(
            op in self._forfeited,
            op.generation,
            self._forfeit_watermark,
            op in self._offload_pins,
        )

    # -- offload (SPEC B.3 rows 15-21, G7) -------------------------------------------------

    def _queue_offload_store(self, cid: int) -> None:
        self._offload_ready.append(cid)
        while len(self._offload_ready) > self._offload_backlog_cap:
            self._offload_ready.popleft()
            self.offload_nominations_dropped += 1

    def _pin_offload_source(
        self, cid: int, *, timeout_reclaimable: bool, now: float
    ) -> tuple[StateStoreOperationId, tuple[int, ...]]:
        rec = self.records[cid]
        self._step(T.OFFLOAD, T.OP_NONE, "take" if timeout_reclaimable else "acquire", to=T.PINNED)
        self._pin(cid, "offload" if timeout_reclaimable else "lease")
        self._offload_generation += 1
        op = StateStoreOperationId(rec.prefix_hash, self._offload_generation)
        self._offload_pins[op] = _OffloadPin(cid, now, False, timeout_reclaimable)
        return op, rec.unit_ids

    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]:
        """Hand nominated READY images to the CPU tier, pinning each, while fewer than
        ``max_inflight`` operations are outstanding (SPEC B.3 row 15). Settles first (row
        24). A nominee whose hash already has an operation, or whose record is not settled
        (D.13), is deferred to the front of the queue, in order.

        Raises:
            InvalidArgumentError: ``max_inflight`` is not an int >= 0.
            Whatever a completion token's ``query()`` or the clock raises; nothing changed.
        """
        _need_int("max_inflight", max_inflight, 0)
        done = self._poll_completions()
        # Read once, before any nominee is taken: a failing clock changes nothing (the
        # settle has not run yet either; it changes neither the backlog nor the operations).
        busy = self._offload_ready and len(self._offload_pins) < max_inflight
        now = read_clock(self.clock) if busy else 0.0
        self._settle(done)
        out = []
        deferred: list[int] = []
        while self._offload_ready and len(self._offload_pins) < max_inflight:
            cid = self._offload_ready.popleft()
            rec = self.records.get(cid)
            if rec is None or rec.phase != T.READY:
                continue
            if self._hash_in_flight(rec.prefix_hash) or not rec.settled:
                deferred.append(cid)
                continue
            out.append(self._pin_offload_source(cid, timeout_reclaimable=True, now=now))
        self._offload_ready.extendleft(reversed(deferred))
        return out

    def acquire_checkpoint_source(
        self, prefix_hash: int, *, max_inflight: int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        """Lease ``prefix_hash``'s READY image for an external transfer (SPEC B.3 row 16).
        Never timed out; release and settle it like an offload store. Settles first (row
        24). ``None`` when over ``max_inflight`` outstanding operations, not READY, not
        settled (D.13), or the hash has an operation.

        Raises:
            InvalidArgumentError: ``prefix_hash`` not an int, ``max_inflight`` neither None
                nor an int >= 0.
            Whatever a completion token's ``query()`` or the clock raises; nothing changed.
        """
        _need_int("prefix_hash", prefix_hash)
        if max_inflight is not None:
            _need_int("max_inflight", max_inflight, 0)
        done = self._poll_completions()
        cid = self.lookup(prefix_hash)
        will_settle = {
            c
            for (_token, cids), ok in zip(self._completions, done, strict=True)
            if ok
            for c in cids
        }
        if (
            (max_inflight is not None and len(self._offload_pins) >= max_inflight)
            or cid < 0
            or not (self.records[cid].settled or cid in will_settle)
            or self._hash_in_flight(prefix_hash)
        ):
            self._settle(done)
            return None
        now = read_clock(self.clock)  # before any change: a failing clock changes nothing
        self._settle(done)
        return self._pin_offload_source(cid, timeout_reclaimable=False, now=now)

    def _need_op(self, op: object) -> StateStoreOperationId:
        if not isinstance(op, StateStoreOperationId):
            raise InvalidArgumentError(f"op must be a StateStoreOperationId, got {op!r}")
        if not (_is_int(op.prefix_hash) and _is_int(op.generation)):
            raise InvalidArgumentError(f"an operation's fields must be ints, got {op!r}")
        return op

    def release_offload_store_source(self, op: StateStoreOperationId) -> None:
        """Phase 1 report: the gather drained; drop the source pin, keep the op until its
        terminal report (SPEC B.3 row 18). Unknown or repeated ops are ignored."""
        self._need_op(op)
        pin = self._offload_pins.get(op)
        if pin is None:
            return
        if pin.source_released:
            self._step(T.OFFLOAD, T.SOURCE_RELEASED, "release_source", to=T.SOURCE_RELEASED)
            return
        self._step(T.OFFLOAD, T.PINNED, "release_source", to=T.SOURCE_RELEASED)
        pin.source_released = True
        self._unpin(pin.checkpoint_id, "offload" if pin.reclaimable else "lease")

    def settle_offload_store(self, op: StateStoreOperationId) -> None:
        """Phase 2 report (stored ok or failed): retire the op, releasing its pin if phase 1
        never came (SPEC B.3 row 19). Unknown, late or repeated ops are ignored."""
        self._need_op(op)
        pin = self._offload_pins.get(op)
        if pin is None:
            return
        phase = T.SOURCE_RELEASED if pin.source_released else T.PINNED
        self._step(T.OFFLOAD, phase, "settle", to=T.SETTLED)
        del self._offload_pins[op]
        if not pin.source_released:
            self._unpin(pin.checkpoint_id, "offload" if pin.reclaimable else "lease")

    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        """Retire reclaimable offload ops older than ``timeout_s`` seconds (SPEC B.3 row 21).

        An op whose source was never released is forfeited: its pin is dropped and
        ``was_reclaimed(op)`` answers True for good (G7). Leases are never reclaimed.
        Returns the number of ops retired; ``timeout_s <= 0`` disables reclaim (returns 0).
        """
        need_timeout(timeout_s)
        if timeout_s <= 0 or not self._offload_pins:
            return 0
        now = read_clock(self.clock)
        stale = [
            (op, pin)
            for op, pin in self._offload_pins.items()
            if pin.reclaimable and pin.pinned_at <= now - timeout_s
        ]
        for op, pin in stale:
            phase = T.SOURCE_RELEASED if pin.source_released else T.PINNED
            self._step(
                T.OFFLOAD,
                phase,
                "reclaim",
                "reclaimable",
                to=T.LOST_REPORT if pin.source_released else T.RECLAIMED,
            )
            del self._offload_pins[op]
            self.offload_pins_reclaimed += 1
            if not pin.source_released:
                self._unpin(pin.checkpoint_id, "offload")
                self._remember_forfeit(op)
        return len(stale)

    def _remember_forfeit(self, op: StateStoreOperationId) -> None:
        self._forfeited[op] = None
        while len(self._forfeited) > self._forfeit_bound:
            oldest = min(self._forfeited, key=lambda o: o.generation)
            del self._forfeited[oldest]
            self._forfeit_watermark = max(self._forfeit_watermark, oldest.generation)
