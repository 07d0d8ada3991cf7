"""The production coordinator's midstep scratch (SPEC D.1 steps 4-6, G5): borrowing a scratch
slot per interior position the forward will expose, publishing or cancelling those
reservations, and the drain's issue of queued scratch stores within the per-batch copy
budget. Queued scratch stores are kept in queue order keyed by slot, plus the slots queued
per hash, so ``reserve_midstep``'s "already queued" test and ``unindex``'s orphaning (G5)
are O(1) per entry. A mixin of :class:`~.coordinator.PagedStateCheckpointCoordinator`."""

from __future__ import annotations

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    InvalidArgumentError,
    StaleReservationError,
    UnknownOperationError,
)
from pagedstate.spec.protocols import need_scratch_pool
from pagedstate.spec.sequences import need_sequence
from pagedstate.spec.types import ScratchSlotPool, SequenceLike

from ._args import is_int, need_int
from ._coordinator_base import _CoordinatorBase


class _Scratch(_CoordinatorBase):
    """Midstep scratch slots and their stores (SPEC D.1 steps 4-6, G5)."""

    # -- midstep scratch (SPEC D.1 steps 4-6, G5) -----------------------------------------

    def attach_midstep_scratch(self, slot_pool: ScratchSlotPool, max_ops_per_batch: int) -> None:
        """Where scratch slots come from, and the per-batch copy budget
        (``checkpoint_copy_ops_per_batch(max_num_seqs)``). O(1).

        Raises:
            InvalidArgumentError: ``max_ops_per_batch`` is not a non-negative int,
                ``slot_pool`` lacks ``has_free``, ``pop`` or ``release``, or it is another
                pool than the attached one while slots of that one are out (reserved,
                queued or issued: they go back to the pool they came from). Re-attaching
                the same pool (a new budget) is always allowed.
        """
        need_int("max_ops_per_batch", max_ops_per_batch, 0)
        out = len(self._scratch_reserved) + len(self._scratch_queued) + len(self._scratch_issued)
        need_scratch_pool(slot_pool, self._scratch, out)
        self._scratch = slot_pool
        self._max_ops_per_batch = max_ops_per_batch

    def reserve_midstep(
        self, seq: SequenceLike, positions: list[tuple[int, int]]
    ) -> list[tuple[int, int, int]]:
        """Borrow a scratch slot per ``(position, hash)``; returns ``(slot, pos, h)`` triples,
        order-preserving, stopping (and counting one drop) at the first position with no
        free slot. Hashes already queued, READY or pending are skipped. O(len(positions)).

        Raises:
            InvalidArgumentError: ``positions`` is not a list or tuple of ``(int, int)``
                pairs, or ``seq`` is not a sequence.
        """
        if not isinstance(positions, (list, tuple)):
            raise InvalidArgumentError(
                f"positions must be a list or tuple of (int, int) pairs, got {positions!r}"
            )
        for item in positions:
            if not (isinstance(item, tuple) and len(item) == 2 and all(map(is_int, item))):
                raise InvalidArgumentError(f"positions must be (int, int) pairs, got {item!r}")
        need_sequence(seq)
        scratch = self._scratch
        if not (self.readable_midstep and self.enabled and seq.has_per_req_cache):
            return []
        if scratch is None:
            return []
        queued = self._scratch_by_hash
        store = self.store
        out = []
        for pos, h in positions:
            if h in queued or store.contains_or_pending(h):
                continue
            if not scratch.has_free():
                self.checkpoints_dropped += 1
                break
            row = T.SCRATCH.step(T.FREE, "reserve")
            slot = scratch.pop()
            self._scratch_reserved[slot] = (pos, h)
            out.append((slot, pos, h))
            self._took(T.SCRATCH, row, slot)
        return out

    def _need_reservations(self, reservations: list[tuple[int, int, int]]) -> None:
        if not isinstance(reservations, (list, tuple)):
            raise InvalidArgumentError(
                f"reservations must be a list or tuple of (slot, pos, h), got {reservations!r}"
            )
        slots = []
        for r in reservations:
            if not (isinstance(r, tuple) and len(r) == 3 and all(map(is_int, r))):
                raise InvalidArgumentError(f"a reservation is (slot, pos, h) of ints, got {r!r}")
            slots.append(r[0])
        reserved = self._scratch_reserved
        if len(set(slots)) != len(slots) or not set(slots) <= reserved.keys():
            raise UnknownOperationError(
                f"scratch slots {slots} are not all outstanding reservations of this coordinator"
            )
        for slot, pos, h in reservations:
            if reserved[slot] != (pos, h):
                raise StaleReservationError(
                    f"scratch slot {slot} is reserved as {(slot, *reserved[slot])},"
                    f" not {(slot, pos, h)}: that reservation is stale (already published or"
                    " cancelled, and the slot lent again); use the triple the latest"
                    " reserve_midstep returned"
                )

    def publish_midstep(self, reservations: list[tuple[int, int, int]], seq: object = None) -> None:
        """The forward wrote the scratch slots: queue ``(h, slot)`` for the next drain.
        O(len(reservations)).

        Raises:
            InvalidArgumentError: not a list or tuple of ``(slot, pos, h)`` int triples.
            UnknownOperationError: a slot is not an outstanding reservation, or repeats.
            StaleReservationError: a triple is not the one outstanding for its slot (an
                earlier reservation of a slot lent again).
        """
        del seq
        self._need_reservations(reservations)
        row = T.SCRATCH.step(T.S_RESERVED, "publish")
        for slot, _pos, h in reservations:
            del self._scratch_reserved[slot]
            self._scratch_queued[slot] = h
            self._scratch_by_hash.setdefault(h, {})[slot] = None
            self._took(T.SCRATCH, row, slot)

    def cancel_midstep(self, reservations: list[tuple[int, int, int]]) -> None:
        """The forward never ran: return the scratch slots. O(len(reservations)).

        Raises:
            InvalidArgumentError, UnknownOperationError, StaleReservationError: as
                :meth:`publish_midstep`.
        """
        self._need_reservations(reservations)
        if not reservations:
            return
        row = T.SCRATCH.step(T.S_RESERVED, "cancel")
        scratch = self._scratch
        assert scratch is not None
        for slot, _pos, _h in reservations:
            del self._scratch_reserved[slot]
            scratch.release(slot)
            self._took(T.SCRATCH, row, slot)

    def _unqueue_scratch(self, slot: int, h: int) -> None:
        slots = self._scratch_by_hash[h]
        del slots[slot]
        if not slots:
            del self._scratch_by_hash[h]

    def _take_scratch_stores(self, budget: int) -> None:
        scratch = self._scratch
        assert scratch is not None
        store = self.store
        # The queue is read afresh each time: a re-entrant ``clear_index`` (from an on_evict
        # callback of a store begun here) replaces it.
        while self._scratch_queued:
            queued = self._scratch_queued
            if budget <= 0:
                row = T.SCRATCH.step(T.S_QUEUED, "issue", "over_budget")
                self._took(T.SCRATCH, row, next(iter(queued)))
                return
            slot, h = queued.popitem(last=False)
            self._unqueue_scratch(slot, h)
            op = None
            if not store.contains_or_pending(h):
                filed = len(store._inflight_stores)
                self._attempt = True
                try:
                    op = store.begin_store(h, slot)
                except BaseException:
                    # The drain is given up (take_checkpoint_ops), this attempt counted as
                    # dropped there. A record filed before the callback failed (or was
                    # interrupted) is given up with the others: the slot is issued like
                    # theirs and returns at the next completion; else it returns now, as
                    # for a refused store.
                    begun = len(store._inflight_stores) > filed
                    row = T.SCRATCH.step(T.S_QUEUED, "issue", "begun" if begun else "refused")
                    if begun:
                        self._scratch_issued.append(slot)
                    else:
                        scratch.release(slot)
                    self._took(T.SCRATCH, row, slot)
                    raise
                self._attempt = False
            if op is None:
                row = T.SCRATCH.step(T.S_QUEUED, "issue", "refused")
                scratch.release(slot)
                self.checkpoints_dropped += 1
                self._took(T.SCRATCH, row, slot)
                continue
            row = T.SCRATCH.step(T.S_QUEUED, "issue", "begun")
            self._store_ops.append(op)
            self._scratch_issued.append(slot)
            self.checkpoints_kept += 1
            budget -= 1
            self._took(T.SCRATCH, row, slot)

