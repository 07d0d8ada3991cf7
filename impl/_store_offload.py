"""The production store's traffic beyond HBM (SPEC B.3 rows 13, 15-21, G7): nominations for
the CPU tier, offload stores and leases for external transfers (pinned while they read a
READY image, retired by their two-phase reports or by the stale-pin reclaimer, with the
forfeit memory behind ``was_reclaimed``), and the adoption of a completed external image as
a READY record. A mixin of :class:`~.store.PageUnitCheckpointStore`.

Offload operations are indexed by a per-hash operation set (``_hash_in_flight``), the
reclaimable operations in pin order, and the forfeits in a generation min-heap (see the
module docstring of :mod:`.store`)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    InvalidArgumentError,
    StoreOwnedUnitsError,
    need_timeout,
    read_clock,
)
from pagedstate.spec.guards import record_step
from pagedstate.spec.ops import unit_runs
from pagedstate.spec.types import CHECKPOINT_OWNER, StateStoreOperationId

from ._args import is_checkpoint_owner, is_dirtying, is_int, need_int
from ._store_base import _as_store, _OffloadPin, _Record, _StoreBase

_READY = T.READY


class _Offload(_StoreBase):
    """Offload stores, transfer leases and adoption (SPEC B.3 rows 13, 15-21, G7)."""

    # -- reading --------------------------------------------------------------------------

    @property
    def offload_sink(self) -> bool:
        """Whether READY records are nominated for the CPU tier. Switching it off drops the
        backlog (C16: no sink, no nominations); handed-out pins stay until their report."""
        return self._offload_sink

    @offload_sink.setter
    def offload_sink(self, on: bool) -> None:
        self._offload_sink = bool(on)
        if not self._offload_sink:
            self._offload_ready.clear()

    @property
    def store_backlog(self) -> deque[int]:
        """Nominations waiting to be handed to the tier (a copy). O(backlog)."""
        return deque(self._offload_ready)

    def has_offload_pins(self) -> bool:
        """True from dispatch of an offload store or lease until its terminal report. O(1)."""
        return bool(self._offload_pins)

    def _hash_in_flight(self, prefix_hash: int) -> bool:
        """Whether any operation of ``prefix_hash`` awaits its report. O(1)."""
        return prefix_hash in self._op_hashes

    # -- offload (SPEC B.3 rows 15-21, G7) -------------------------------------------------

    def _queue_offload_store(self, cid: int) -> None:
        """Nominate ``cid`` without pinning it (SPEC B.3 row 20). O(1) amortized."""
        ready = self._offload_ready
        ready.append(cid)
        while len(ready) > self._offload_backlog_cap:
            ready.popleft()
            self.offload_nominations_dropped += 1

    def _pin_offload_source(
        self, cid: int, *, timeout_reclaimable: bool, now: float
    ) -> tuple[StateStoreOperationId, tuple[int, ...]]:
        rec = self.records[cid]
        orow = T.OFFLOAD.step(T.OP_NONE, "take" if timeout_reclaimable else "acquire")
        event = "pin_offload" if timeout_reclaimable else "pin_lease"
        # a host reader's pin carries the settled guard (D.13): no row for an unsettled image
        prow = record_step(rec.phase, event, rec.pin_count, rec.settled)
        self._apply(cid, rec, prow)
        self._offload_generation += 1
        op = StateStoreOperationId(rec.prefix_hash, self._offload_generation)
        self._offload_pins[op] = _OffloadPin(cid, now, False, timeout_reclaimable)
        self._op_hashes.add(rec.prefix_hash)
        if timeout_reclaimable:
            rec_ops = self._reclaimable
            if rec_ops:
                last = self._offload_pins[next(reversed(rec_ops))].pinned_at
                if not now >= last:
                    self._reclaim_in_order = False
            rec_ops[op] = None  # pragma: no mutate (an ordered set: values unread)
        self._took(T.OFFLOAD, orow, op)
        return op, rec.unit_ids

    def _retire_op(self, op: StateStoreOperationId, pin: _OffloadPin) -> None:
        """Remove ``op`` from the operation map and its indexes."""
        del self._offload_pins[op]
        self._op_hashes.remove(op.prefix_hash)
        if pin.reclaimable:
            del self._reclaimable[op]
            if not self._reclaimable:
                # equivalent mutants: False only makes reclaim read every pin
                self._reclaim_in_order = True  # pragma: no mutate

    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]:
        """Hand nominated READY images to the CPU tier, pinning each, while fewer than
        ``max_inflight`` operations are outstanding (SPEC B.3 row 15). Settles first (B.3
        row 24: every outstanding completion token is queried). A nominee whose hash
        already has an operation, or whose record is not settled (its batch's token has not
        reported done, D.13), is deferred to the front of the queue, in order; a spent
        nominee is dropped for good. Returns ``[(op, unit_ids)]``.

        O(outstanding tokens + records settled + handed out + dropped + deferred): deferred
        nominees have a distinct hash with an operation outstanding (fewer than
        ``max_inflight``) or an unsettled record (listed by an outstanding token); dropped
        ones are paid for by their nomination.

        Raises:
            InvalidArgumentError: ``max_inflight`` is not a non-negative int.
            Whatever a token's ``query()`` or the clock raises: propagated, nothing changed.
        """
        # equivalent mutants: need_int re-checks
        if type(max_inflight) is not int or max_inflight < 0:  # pragma: no mutate
            need_int("max_inflight", max_inflight, 0)
        answers = self._poll() if self._completions else []
        out = []
        deferred: list[int] = []
        ready = self._offload_ready
        pins = self._offload_pins
        records = self.records
        # Read once, before any nominee is taken (and before the settle): a failing clock
        # changes nothing.
        now = read_clock(self.clock) if ready and len(pins) < max_inflight else 0.0
        if answers:
            self._settle(answers)
        while ready and len(pins) < max_inflight:
            cid = ready.popleft()
            rec = records.get(cid)
            if rec is None or rec.phase != _READY:
                continue
            if rec.prefix_hash in self._op_hashes or not rec.settled:
                deferred.append(cid)
                continue
            out.append(self._pin_offload_source(cid, timeout_reclaimable=True, now=now))
        if deferred:
            ready.extendleft(reversed(deferred))
        return out

    def acquire_checkpoint_source(
        self, prefix_hash: int, *, max_inflight: int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        """Lease ``prefix_hash``'s READY image for an external transfer (SPEC B.3 row 16).
        Never timed out; release and settle it like an offload store. Settles first (B.3
        row 24). ``None`` when over ``max_inflight`` outstanding operations, not READY, not
        settled (its batch's completion token has not reported done, D.13), or the hash has
        an operation. O(1) (+ outstanding tokens and the records they settle).

        Raises:
            InvalidArgumentError: ``prefix_hash`` not an int, ``max_inflight`` neither None
                nor a non-negative int.
            Whatever a token's ``query()`` or the clock raises: propagated, nothing changed.
        """
        if type(prefix_hash) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("prefix_hash", prefix_hash)
        if max_inflight is not None:
            # equivalent mutants: need_int re-checks
            if type(max_inflight) is not int or max_inflight < 0:  # pragma: no mutate
                need_int("max_inflight", max_inflight, 0)
        answers = self._poll() if self._completions else []
        if max_inflight is not None and len(self._offload_pins) >= max_inflight:
            self._settle(answers)
            return None
        cid = self.lookup(prefix_hash)
        if (
            cid < 0
            or prefix_hash in self._op_hashes
            or not self._will_settle(cid, self.records[cid], answers)
        ):
            self._settle(answers)
            return None
        now = read_clock(self.clock)  # before any change: a failing clock changes nothing
        self._settle(answers)
        return self._pin_offload_source(cid, timeout_reclaimable=False, now=now)

    def _need_op(self, op: object) -> StateStoreOperationId:
        if not isinstance(op, StateStoreOperationId):
            raise InvalidArgumentError(f"op must be a StateStoreOperationId, got {op!r}")
        if not (is_int(op.prefix_hash) and is_int(op.generation)):
            raise InvalidArgumentError(f"an operation's fields must be ints, got {op!r}")
        return op

    def release_offload_store_source(self, op: StateStoreOperationId) -> None:
        """Phase 1 report: the gather drained; drop the source pin, keep the op until its
        terminal report (SPEC B.3 row 18). Unknown or repeated ops are ignored. O(1).

        Raises:
            InvalidArgumentError: ``op`` is not a :class:`StateStoreOperationId`.
        """
        self._need_op(op)
        pin = self._offload_pins.get(op)
        if pin is None:
            return
        if pin.source_released:
            self._took(T.OFFLOAD, T.OFFLOAD.step(T.SOURCE_RELEASED, "release_source"), op)
            return
        row = T.OFFLOAD.step(T.PINNED, "release_source")
        pin.source_released = True
        self._took(T.OFFLOAD, row, op)
        self._unpin(pin.checkpoint_id, "offload" if pin.reclaimable else "lease")

    def settle_offload_store(self, op: StateStoreOperationId) -> None:
        """Phase 2 report (stored ok or failed): retire the op, releasing its pin if phase 1
        never came (SPEC B.3 row 19). Unknown, late or repeated ops are ignored. O(1).

        Raises:
            InvalidArgumentError: ``op`` is not a :class:`StateStoreOperationId`.
        """
        self._need_op(op)
        pin = self._offload_pins.get(op)
        if pin is None:
            return
        phase = T.SOURCE_RELEASED if pin.source_released else T.PINNED
        row = T.OFFLOAD.step(phase, "settle")
        self._retire_op(op, pin)
        self._took(T.OFFLOAD, row, op)
        if not pin.source_released:
            self._unpin(pin.checkpoint_id, "offload" if pin.reclaimable else "lease")

    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        """Retire reclaimable offload ops pinned at or before ``now - timeout_s`` (SPEC B.3
        row 21), in pin order.

        An op whose source was never released is forfeited: its pin is dropped and
        ``was_reclaimed(op)`` answers True for good (G7). Leases are never reclaimed.
        Returns the number of ops retired; ``timeout_s <= 0`` disables reclaim (returns 0).
        O(1 + retired) with a monotonic clock: only the expired prefix of the reclaimable
        ops (in pin order) is read; if the clock ever went backwards while reclaimable ops
        were outstanding, O(reclaimable ops) until they are all gone.

        Raises:
            InvalidArgumentError: ``timeout_s`` is not a real number of seconds (or is NaN).
        """
        need_timeout(timeout_s)
        if timeout_s <= 0 or not self._offload_pins:
            return 0
        now = read_clock(self.clock)
        pins = self._offload_pins
        stale: list[StateStoreOperationId] = []
        if self._reclaim_in_order:
            for op in self._reclaimable:
                if not pins[op].pinned_at <= now - timeout_s:
                    break
                stale.append(op)
        else:
            stale = [op for op in self._reclaimable if pins[op].pinned_at <= now - timeout_s]
        for op in stale:
            pin = pins[op]
            phase = T.SOURCE_RELEASED if pin.source_released else T.PINNED
            row = T.OFFLOAD.step(phase, "reclaim", "reclaimable")
            self._retire_op(op, pin)
            self.offload_pins_reclaimed += 1
            self._took(T.OFFLOAD, row, op)
            if not pin.source_released:
                self._unpin(pin.checkpoint_id, "offload")
                self._remember_forfeit(op)
        return len(stale)

    def _remember_forfeit(self, op: StateStoreOperationId) -> None:
        """Remember ``op`` as forfeited; past the bound, forget the lowest generation and
        raise the watermark to it (G7). O(log bound)."""
        self._forfeited[op] = None  # pragma: no mutate (a set: values unread)
        heapq.heappush(self._forfeit_heap, (op.generation, op))
        while len(self._forfeited) > self._forfeit_bound:
            gen, oldest = heapq.heappop(self._forfeit_heap)
            del self._forfeited[oldest]
            self._forfeit_watermark = max(self._forfeit_watermark, gen)

    # -- adoption (SPEC B.3 row 13) -------------------------------------------------------

    def adopt_units(self, unit_ids: tuple[int, ...], owner: Hashable, prefix_hash: int) -> bool:
        """Make a completed external image the READY record of ``prefix_hash`` by retagging
        ``owner``'s units, with no window in which they are free (SPEC B.3 row 13). If the
        hash is READY or pending, the units are released and False returned. Not nominated
        for offload. The image is settled at once (D.13: the receiver waited for its
        transfer). The identity is taken only after the rekey succeeded (G8). O(units).

        Raises:
            InvalidArgumentError: wrong unit count or argument types.
            StoreOwnedUnitsError: ``owner`` is a checkpoint's own tag (its units are not
                adoptable), or a transfer reservation ``("state-transfer", o)`` and the
                caller is not the coordinator (``adopt_transfer_units``), which would still
                name the units.
            WrongOwnerError, PartialReleaseError, DuplicateUnitError: the units are not
                exactly ``owner``'s whole reservation.
        """

        if type(prefix_hash) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("prefix_hash", prefix_hash)
        if not isinstance(unit_ids, (list, tuple)) or len(unit_ids) != self._units:
            raise InvalidArgumentError(
                f"adoption needs exactly {self._units} units, got {unit_ids!r}"
            )
        if is_checkpoint_owner(owner):
            raise StoreOwnedUnitsError.for_owner(owner)
        if is_dirtying(owner):
            if not self._transfer_grant:
                raise StoreOwnedUnitsError.for_transfer_adoption(owner)
            self._transfer_grant = False  # spent: it serves this call alone
        if self.contains_or_pending(prefix_hash):
            with _as_store(self.pool):
                self.pool.release_units(unit_ids, owner)
            return False
        row = T.RECORD.step(T.ABSENT, "adopt")
        cid = self._next_checkpoint_id
        with _as_store(self.pool):
            self.pool.rekey_units(unit_ids, owner, (CHECKPOINT_OWNER, cid))
        self._next_checkpoint_id += 1
        # equivalent mutants: the row sets the phase
        rec = _Record(prefix_hash, unit_runs(unit_ids), T.ABSENT)  # pragma: no mutate
        self.records[cid] = rec
        self._apply(cid, rec, row)
        return True
