"""The production coordinator's midstep scratch (SPEC D.1 steps 4-6, D.13, G5, G12):
borrowing a scratch slot per interior position the forward will expose (never a slot a
restore writes, G12), publishing (naming the forward that writes them) or cancelling those
reservations, and the drain's issue of queued scratch stores within the per-batch copy
budget. Queued scratch stores are kept in queue order keyed by slot, plus the slots queued
per hash and the forward ids of those published with one, so ``reserve_midstep``'s
"already queued" test and ``unindex``'s orphaning (G5) are O(1) per entry. A mixin of
:class:`~.coordinator.PagedStateCheckpointCoordinator`."""

from __future__ import annotations

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    InvalidArgumentError,
    SlotBusyError,
    StaleReservationError,
    UnknownOperationError,
)
from pagedstate.spec.protocols import need_forward, need_scratch_pool
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

        A slot the scratch pool hands out that is the destination of a queued, in-flight or
        suspended restore (G12) is refused: every slot this call borrowed goes back to the
        scratch pool (in reverse order) and nothing else changes (no reservation, row or
        counter).

        Raises:
            InvalidArgumentError: ``positions`` is not a list or tuple of ``(int, int)``
                pairs, or ``seq`` is not a sequence.
            SlotBusyError: the scratch pool lent a slot a restore writes (G12).
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
        short = False
        for pos, h in positions:
            if h in queued or store.contains_or_pending(h):
                continue
            if not scratch.has_free():
                short = True
                break
            slot = scratch.pop()
            out.append((slot, pos, h))
            if store._slot_busy(slot):
                for lent, _pos, _h in reversed(out):
                    scratch.release(lent)
                raise SlotBusyError(
                    f"scratch slot {slot} is the destination of a queued, in-flight or"
                    " suspended restore; a slot is one buffer whoever lends it (G12)"
                )
        if out:
            row = T.SCRATCH.step(T.FREE, "reserve")
            reserved = self._scratch_reserved
            for slot, pos, h in out:
                reserved[slot] = (pos, h)
                self._took(T.SCRATCH, row, slot)
        if short:
            self.checkpoints_dropped += 1
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

    def publish_midstep(
        self,
        reservations: list[tuple[int, int, int]],
        seq: object = None,
        *,
        forward: int | None = None,
    ) -> None:
        """The forward wrote the scratch slots: queue ``(h, slot)`` for the next drain; with
        ``forward=F``, for the first drain after forward ``F`` (``last_forward >= F``,
        D.13: the drain before forward ``F`` would read the slot before it was written).
        O(len(reservations)).

        Raises:
            InvalidArgumentError: ``forward`` is neither None nor an int >= 0; not a list or
                tuple of ``(slot, pos, h)`` int triples.
            UnknownOperationError: a slot is not an outstanding reservation, or repeats.
            StaleReservationError: a triple is not the one outstanding for its slot (an
                earlier reservation of a slot lent again).
        """
        del seq
        fwd = None if forward is None else need_forward("forward", forward)
        self._need_reservations(reservations)
        row = T.SCRATCH.step(T.S_RESERVED, "publish")
        for slot, _pos, h in reservations:
            del self._scratch_reserved[slot]
            self._scratch_queued[slot] = h
            self._scratch_by_hash.setdefault(h, {})[slot] = None
            if fwd is not None:
                self._scratch_forwards[slot] = fwd
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
        if self._scratch_forwards:
            self._scratch_forwards.pop(slot, None)
        slots = self._scratch_by_hash[h]
        del slots[slot]
        if not slots:
            del self._scratch_by_hash[h]

    def _take_scratch_stores(self, budget: int, prev: int | None) -> None:
        """The drain's scratch stores (SPEC D.1 step 6.3, D.13), ``prev`` the forward id of
        the drain before this one. In queue order: an entry published with a forward later
        than ``prev`` waits in its place (no budget, no row); with no budget left, the
        over-budget row is taken once, for the first issuable entry left, and the rest stays
        queued where it is; otherwise its store is begun (issued) or refused (the slot
        returns, one drop).

        Waiting entries are passed by moving each to the end of the queue as it is met, and
        all are moved back to the front, in order, before the call returns or raises: the
        queue is then the original order without what was issued or refused, at a cost of
        O(issued + refused + waiting entries), never the over-budget remainder."""
        scratch = self._scratch
        assert scratch is not None
        store = self.store
        forwards = self._scratch_forwards
        waiting: list[int] = []
        passed: set[int] = set()
        try:
            # The queue is read afresh each time: a re-entrant ``clear_index`` (from an
            # on_evict callback of a store begun here) replaces it.
            while self._scratch_queued:
                queued = self._scratch_queued
                slot = next(iter(queued))
                if forwards:
                    if slot in passed:
                        return  # every entry left is one that waits
                    f = forwards.get(slot)
                    if f is not None and (prev is None or f > prev):
                        queued.move_to_end(slot)
                        waiting.append(slot)
                        passed.add(slot)
                        continue
                if budget <= 0:
                    row = T.SCRATCH.step(T.S_QUEUED, "issue", "over_budget")
                    self._took(T.SCRATCH, row, slot)
                    return
                h = queued.pop(slot)
                self._unqueue_scratch(slot, h)
                op = None
                if not store.contains_or_pending(h):
                    filed = len(store._inflight_stores)
                    self._attempt = True
                    try:
                        op = store.begin_store(h, slot)
                    except BaseException:
                        # The drain is given up (take_checkpoint_ops), this attempt counted
                        # as dropped there. A record filed before the callback failed (or
                        # was interrupted) is given up with the others: the slot is issued
                        # like theirs and returns at the next completion; else it returns
                        # now, as for a refused store.
                        begun = len(store._inflight_stores) > filed
                        row = T.SCRATCH.step(
                            T.S_QUEUED, "issue", "begun" if begun else "refused"
                        )
                        if begun:
                            self._scratch_issued[slot] = None
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
                self._scratch_issued[slot] = None
                self.checkpoints_kept += 1
                budget -= 1
                self._took(T.SCRATCH, row, slot)
        finally:
            if waiting:
                queued = self._scratch_queued
                for slot in reversed(waiting):
                    if slot in queued:  # not orphaned by a re-entrant unindex meanwhile
                        queued.move_to_end(slot, last=False)
