"""The reference coordinator's midstep scratch stores (SPEC D.1 steps 4-6, G5, G12, D.13):
borrowing scratch slots for a forward's interior boundaries, publishing them (with the
forward that writes them), cancelling, issuing them at the drain within the per-batch
budget, and orphaning them when their hash goes. A mixin of
:class:`~.coordinator.PagedStateCheckpointCoordinator`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    InvalidArgumentError,
    SlotBusyError,
    StaleReservationError,
    UnknownOperationError,
)
from pagedstate.spec.protocols import need_forward, need_scratch_pool
from pagedstate.spec.sequences import need_sequence
from pagedstate.spec.types import CheckpointStoreOp, ScratchSlotPool, SequenceLike

from ._common import _is_int, _need_int, _Stepper
from .store import PageUnitCheckpointStore


class _Scratch(_Stepper):
    """Midstep scratch (SPEC D.1 steps 4-6, G5, G12); the state is the coordinator's."""

    store: PageUnitCheckpointStore
    readable_midstep: bool
    checkpoints_kept: int
    checkpoints_dropped: int
    _scratch: ScratchSlotPool | None
    _max_ops_per_batch: int
    _scratch_reserved: dict[int, tuple[int, int]]
    _scratch_queued: list[tuple[int, int]]
    _scratch_issued: list[int]
    _scratch_forward: dict[int, int]
    _store_ops: list[CheckpointStoreOp]

    if TYPE_CHECKING:

        def _applies(self, seq: SequenceLike) -> bool: ...  # the coordinator's

    def attach_midstep_scratch(self, slot_pool: ScratchSlotPool, max_ops_per_batch: int) -> None:
        """Where scratch slots come from, and the per-batch copy budget
        (``checkpoint_copy_ops_per_batch(max_num_seqs)``).

        Raises:
            InvalidArgumentError: ``max_ops_per_batch`` is not a non-negative int,
                ``slot_pool`` lacks ``has_free``, ``pop`` or ``release``, or it is another
                pool than the attached one while slots of that one are out (reserved,
                queued or issued: they go back to the pool they came from). Re-attaching
                the same pool (a new budget) is always allowed.
        """
        _need_int("max_ops_per_batch", max_ops_per_batch, 0)
        out = len(self._scratch_reserved) + len(self._scratch_queued) + len(self._scratch_issued)
        need_scratch_pool(slot_pool, self._scratch, out)
        self._scratch = slot_pool
        self._max_ops_per_batch = max_ops_per_batch

    def reserve_midstep(
        self, seq: SequenceLike, positions: list[tuple[int, int]]
    ) -> list[tuple[int, int, int]]:
        """Borrow a scratch slot per ``(position, hash)``; returns ``(slot, pos, h)`` triples,
        order-preserving, stopping (and counting one drop) at the first position with no
        free slot. Hashes already queued, READY or pending are skipped (SPEC D.1 step 4).

        Raises:
            InvalidArgumentError: ``positions`` is not a list or tuple of ``(int, int)``
                pairs, or ``seq`` is not a sequence.
            SlotBusyError: a slot popped is a queued, in-flight or suspended restore's
                destination (G12): every slot this call popped goes back, in reverse pop
                order, and nothing else changed.
        """
        if not isinstance(positions, (list, tuple)):
            raise InvalidArgumentError(
                f"positions must be a list or tuple of (int, int) pairs, got {positions!r}"
            )
        for item in positions:
            if not (isinstance(item, tuple) and len(item) == 2 and all(map(_is_int, item))):
                raise InvalidArgumentError(f"positions must be (int, int) pairs, got {item!r}")
        need_sequence(seq)
        if not (self.readable_midstep and self._applies(seq)) or self._scratch is None:
            return []
        queued = {h for h, _ in self._scratch_queued}
        out = []
        dropped = False
        for pos, h in positions:
            if h in queued or self.store.contains_or_pending(h):
                continue
            if not self._scratch.has_free():
                dropped = True
                break
            slot = self._scratch.pop()
            out.append((slot, pos, h))
            if self.store._slot_busy(slot):  # G12: the slot is a restore's destination
                for popped, _pos, _h in reversed(out):
                    self._scratch.release(popped)
                raise SlotBusyError(
                    f"scratch slot {slot} is the destination of a queued, in-flight or"
                    " suspended restore; a slot is one buffer whoever lends it (G12)"
                )
        # Rows and counters only once the whole call succeeded.
        for slot, pos, h in out:
            self._step(T.SCRATCH, T.FREE, "reserve", to=T.S_RESERVED)
            self._scratch_reserved[slot] = (pos, h)
        if dropped:
            self.checkpoints_dropped += 1
        return out

    def _need_reservations(self, reservations: list[tuple[int, int, int]]) -> None:
        if not isinstance(reservations, (list, tuple)):
            raise InvalidArgumentError(
                f"reservations must be a list or tuple of (slot, pos, h), got {reservations!r}"
            )
        slots = []
        for r in reservations:
            if not (isinstance(r, tuple) and len(r) == 3 and all(map(_is_int, r))):
                raise InvalidArgumentError(f"a reservation is (slot, pos, h) of ints, got {r!r}")
            slots.append(r[0])
        if len(set(slots)) != len(slots) or not set(slots) <= self._scratch_reserved.keys():
            raise UnknownOperationError(
                f"scratch slots {slots} are not all outstanding reservations of this coordinator"
            )
        for slot, pos, h in reservations:
            if self._scratch_reserved[slot] != (pos, h):
                raise StaleReservationError(
                    f"scratch slot {slot} is reserved as {(slot, *self._scratch_reserved[slot])},"
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
        """The forward wrote the scratch slots: queue ``(h, slot)`` for the next drain (SPEC
        D.1 step 5). With ``forward``, for the first drain after forward ``forward`` (one
        whose previous forward id is at least it, D.13); never stale.

        Raises:
            InvalidArgumentError: not a list or tuple of ``(slot, pos, h)`` int triples, or
                ``forward`` neither None nor an int >= 0.
            UnknownOperationError: a slot is not an outstanding reservation, or repeats.
            StaleReservationError: a triple is not the one outstanding for its slot (an
                earlier reservation of a slot lent again).
        """
        del seq
        fwd = need_forward("forward", forward)
        self._need_reservations(reservations)
        for slot, _pos, h in reservations:
            self._step(T.SCRATCH, T.S_RESERVED, "publish", to=T.S_QUEUED)
            del self._scratch_reserved[slot]
            self._scratch_queued.append((h, slot))
            if fwd is not None:
                self._scratch_forward[slot] = fwd

    def cancel_midstep(self, reservations: list[tuple[int, int, int]]) -> None:
        """The forward never ran: return the scratch slots.

        Raises:
            InvalidArgumentError, UnknownOperationError, StaleReservationError: as
                :meth:`publish_midstep`.
        """
        self._need_reservations(reservations)
        for slot, _pos, _h in reservations:
            self._step(T.SCRATCH, T.S_RESERVED, "cancel", to=T.FREE)
            del self._scratch_reserved[slot]
            assert self._scratch is not None
            self._scratch.release(slot)

    def _take_scratch_stores(self, budget: int, prev: int | None) -> None:
        """D.1 step 6.3. A store published with forward ``F`` is issuable only when ``prev``
        (the forward before this drain) is at least ``F`` (D.13); one that is not stays
        queued in its place, takes no budget and no row."""
        queued, self._scratch_queued = self._scratch_queued, []
        keep: list[tuple[int, int]] = []
        for h, slot in queued:
            fwd = self._scratch_forward.get(slot)
            if fwd is not None and (prev is None or fwd > prev):
                keep.append((h, slot))  # its forward has not run yet
                continue
            if budget <= 0:
                self._step(T.SCRATCH, T.S_QUEUED, "issue", "over_budget", to=T.S_QUEUED)
                keep.append((h, slot))
                continue
            self._scratch_forward.pop(slot, None)
            op = None
            if not self.store.contains_or_pending(h):
                op = self.store.begin_store(h, slot)
            if op is None:
                self._step(T.SCRATCH, T.S_QUEUED, "issue", "refused", to=T.FREE)
                assert self._scratch is not None
                self._scratch.release(slot)
                self.checkpoints_dropped += 1
                continue
            self._step(T.SCRATCH, T.S_QUEUED, "issue", "begun", to=T.ISSUED)
            self._store_ops.append(op)
            self._scratch_issued.append(slot)
            self.checkpoints_kept += 1
            budget -= 1
        self._scratch_queued = keep

    def _scratch_held(self, slot: int) -> bool:
        """Whether ``slot`` is lent as midstep scratch: reserved, queued or issued (G12)."""
        return (
            slot in self._scratch_reserved
            or any(s == slot for _h, s in self._scratch_queued)
            or slot in self._scratch_issued
        )

    def _orphan_scratch(self, match: Callable[[int], bool]) -> int:
        keep = []
        dropped = 0
        for h, slot in self._scratch_queued:
            if match(h):
                self._step(T.SCRATCH, T.S_QUEUED, "orphan", to=T.FREE)
                self._scratch_forward.pop(slot, None)
                assert self._scratch is not None
                self._scratch.release(slot)
                dropped += 1
            else:
                keep.append((h, slot))
        self._scratch_queued = keep
        return dropped
