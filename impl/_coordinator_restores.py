"""The production coordinator's restores (SPEC D.1 steps 3, 8, D.12, G12, G15): queueing a
restore into a request slot (refused over a slot lent as midstep scratch, G12), the memory
of which sequence each queued restore was begun for (so that ``forget_pending`` cancels by
identity, G15), and the suspended-restore leases of a transfer load. A mixin of
:class:`~.coordinator.PagedStateCheckpointCoordinator`.

Restore owners are kept per sequence in the order begun, ``id(seq) -> (dst_slot, the
store's queued entry, seq)``, plus the latest owner per slot. An owner is valid while the
store's queue holds that very entry (object identity) for the slot: a drain, a cancel or a
suspension takes the entry off the queue, and a resumed restore is queued as a new entry,
so a remembered restore never becomes valid again once it left the queue, and a slot has at
most one valid owner, the latest one begun into it. Each check is O(1).
"""

from __future__ import annotations

from pagedstate.spec.errors import SlotBusyError
from pagedstate.spec.sequences import need_sequence
from pagedstate.spec.types import SequenceLike, SuspendedCheckpointRestore

from ._args import need_int
from ._coordinator_base import _CoordinatorBase, _RestoreOwner


def _scratch_busy(slot: int) -> SlotBusyError:
    return SlotBusyError(
        f"slot {slot} is lent as midstep scratch; a slot is one buffer whoever lends it (G12)"
    )


class _Restores(_CoordinatorBase):
    """Restores into request slots, their owners (G15) and leases (SPEC D.1 step 3, D.12)."""

    def restore_queued_for(self, dst_slot: int) -> bool:
        """Whether a queued restore will write ``dst_slot`` (evidence for a claimed hit,
        S9). O(1)."""
        return self.store.restore_queued_for(dst_slot)

    def _lent_as_scratch(self, slot: int) -> bool:
        """Whether ``slot`` is held as midstep scratch: reserved, queued or issued. O(1)."""
        return (
            slot in self._scratch_reserved
            or slot in self._scratch_queued
            or slot in self._scratch_issued
        )

    def _owner_valid(self, owner: _RestoreOwner) -> bool:
        """Whether the store still has ``owner``'s restore queued into its slot. O(1)."""
        return self.store._queued_restores.get(owner[0]) is owner[1]

    def begin_restore(self, h: int, dst_slot: int, *, seq: SequenceLike | None = None) -> bool:
        """Queue a restore of ``h`` into ``dst_slot`` (SPEC B.3 row 4, D.1 step 3); False
        when ``h`` is not READY. With ``seq``, the restore is remembered for that sequence
        until a drain takes it (or the coordinator cancels or suspends it), so that
        ``forget_pending(seq)`` cancels this restore, into whatever slot it names (G15).
        O(1).

        Raises:
            InvalidArgumentError: ``h`` not an int, ``dst_slot`` not an int >= 0, ``seq``
                neither None nor a sequence.
            SlotBusyError: ``dst_slot`` is lent as midstep scratch (reserved, queued or
                issued, G12); ``seq`` already has a restore queued (G15); or ``dst_slot``
                already has a queued, in-flight or suspended restore (G4). Nothing changed.
        """
        if type(h) is not int:
            need_int("prefix_hash", h)
        if type(dst_slot) is not int or dst_slot < 0:
            need_int("dst_slot", dst_slot, 0)
        if seq is not None:
            need_sequence(seq)
        if self._lent_as_scratch(dst_slot):
            raise _scratch_busy(dst_slot)
        owners = self._restore_owners
        sid = id(seq)
        if seq is not None:
            mine = owners.get(sid)
            if mine is not None and self._owner_valid(mine):
                raise SlotBusyError(
                    "the sequence already has a queued restore (begin_restore with seq=); forget or"
                    " take it first (G15)"
                )
        store = self.store
        if store.begin_restore(h, dst_slot) is None:
            return False
        if seq is not None:
            of_slot = self._restore_owner_of_slot
            old = owners.pop(sid, None)
            if old is not None and of_slot.get(old[0]) == sid:
                del of_slot[old[0]]
            owners[sid] = (dst_slot, store._queued_restores[dst_slot], seq)
            of_slot[dst_slot] = sid
        return True

    def _forget_restore_of(self, seq: SequenceLike, slot: int) -> None:
        """``forget_pending``'s restore part (SPEC D.1 step 8, G15): cancel the restore
        remembered for ``seq`` if it is still queued; else the queued restore into
        ``slot`` (``seq.state_slot``) when that is ``>= 0`` and no other sequence owns it.
        ``seq``'s memory goes. O(1)."""
        store = self.store
        sid = id(seq)
        of_slot = self._restore_owner_of_slot
        mine = self._restore_owners.pop(sid, None)
        if mine is not None:
            if of_slot.get(mine[0]) == sid:
                del of_slot[mine[0]]
            if self._owner_valid(mine):
                store.cancel_queued_restore(mine[0])
                return
        if slot < 0:
            return
        entry = store._queued_restores.get(slot)
        if entry is None:
            return
        other = of_slot.get(slot)
        if other is not None:
            owner = self._restore_owners.get(other)
            if owner is not None and owner[1] is entry:
                return  # another sequence's restore (G15)
        store.cancel_queued_restore(slot)

    def _clear_restore_owners(self) -> None:
        """A drain took every queued restore: no remembered restore is valid any more."""
        if self._restore_owners:
            self._restore_owners = {}
            self._restore_owner_of_slot = {}

    def _restore_owner_pairs(self) -> tuple[tuple[int, int], ...]:
        """``(id(seq), dst_slot)`` of the valid restore owners, in the order begun (the
        snapshot's ``restore_owners``). O(owners)."""
        return tuple(
            (sid, owner[0])
            for sid, owner in self._restore_owners.items()
            if self._owner_valid(owner)
        )

    # -- suspended restores (SPEC D.12 steps 2, 4) -----------------------------------------

    def suspend_queued_restore(self, dst_slot: int) -> SuspendedCheckpointRestore | None:
        """See :meth:`PageUnitCheckpointStore.suspend_queued_restore`; the restore's owner
        (G15) is forgotten. O(1)."""
        lease = self.store.suspend_queued_restore(dst_slot)
        if lease is not None:
            sid = self._restore_owner_of_slot.pop(dst_slot, None)
            if sid is not None:
                self._restore_owners.pop(sid, None)
        return lease

    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """See :meth:`PageUnitCheckpointStore.resume_suspended_restore`; first, a lease
        whose slot is lent as midstep scratch is refused (G12). O(1).

        Raises:
            SlotBusyError: the lease's slot is lent as midstep scratch (G12, checked before
                the lease itself), or as the store's call.
            InvalidArgumentError, LeaseReusedError, UnknownOperationError,
                SourcePinLostError: as the store's call.
        """
        if isinstance(restore, SuspendedCheckpointRestore):
            slot = getattr(restore.op, "dst_slot", None)
            # isinstance, as the reference model's check (a bool slot reads as 0 or 1)
            if isinstance(slot, int) and self._lent_as_scratch(slot):
                raise _scratch_busy(slot)
        self.store.resume_suspended_restore(restore)

    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """See :meth:`PageUnitCheckpointStore.release_suspended_restore`."""
        self.store.release_suspended_restore(restore)
