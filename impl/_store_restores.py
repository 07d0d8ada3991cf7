"""The production store's restores (SPEC B.3 rows 4-9, G3, G4): queueing one into a slot
(pinning its record), the drain taking the queue in flight, cancelling, and suspending one
under a single-use lease that is resumed or released. Queued restores are keyed by
destination slot (G4 makes a slot hold at most one restore), in queue order; in-flight and
suspended restores keep per-slot counts. A mixin of :class:`~.store.PageUnitCheckpointStore`.
"""

from __future__ import annotations

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    InvalidArgumentError,
    LeaseReusedError,
    SlotBusyError,
    SourcePinLostError,
    UnknownOperationError,
)
from pagedstate.spec.types import CheckpointRestoreOp, SuspendedCheckpointRestore

from ._args import need_int
from ._store_base import _StoreBase

#: The store's restore op constructor: its runs are maximal and well formed (SPEC A.5).
_restore_op = CheckpointRestoreOp._of_runs

#: The row of a new restore, its key constant, looked up once in its table (which still
#: decides it: a missing row fails here, at import).
_BEGIN_RESTORE = T.RESTORE.step(T.R_NONE, "begin_restore")


def _count_add(counts: dict[int, int], key: int, n: int) -> None:
    left = counts.get(key, 0) + n
    if left:
        counts[key] = left
    else:
        del counts[key]


class _Restores(_StoreBase):
    """Restores into state slots and suspended-restore leases (SPEC B.3 rows 4-9)."""

    # -- restores -------------------------------------------------------------------------

    def restore_queued_for(self, dst_slot: int) -> bool:
        """Whether a queued restore will write ``dst_slot`` on the next batch. O(1).

        Raises:
            InvalidArgumentError: ``dst_slot`` is not an int.
        """
        if type(dst_slot) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("dst_slot", dst_slot)
        return dst_slot in self._queued_restores

    def _slot_busy(self, dst_slot: int) -> bool:
        return (
            dst_slot in self._queued_restores
            or dst_slot in self._inflight_slots
            or dst_slot in self._suspended_slots
        )

    def begin_restore(self, prefix_hash: int, dst_slot: int) -> CheckpointRestoreOp | None:
        """Queue a restore of ``prefix_hash``'s READY image into ``dst_slot`` and pin it
        (SPEC B.3 row 4); the record moves to the hot end of the LRU. Takes no units.
        ``None`` when no READY image exists. O(1).

        Raises:
            InvalidArgumentError: ``prefix_hash`` not an int, ``dst_slot`` not an int >= 0.
            SlotBusyError: ``dst_slot`` already has a queued, in-flight or suspended
                restore (G4).
        """
        if type(prefix_hash) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("prefix_hash", prefix_hash)
        if type(dst_slot) is not int or dst_slot < 0:  # pragma: no mutate (need_int re-checks)
            need_int("dst_slot", dst_slot, 0)
        cid = self.lookup(prefix_hash)
        if cid < 0:
            return None
        if self._slot_busy(dst_slot):
            raise SlotBusyError(
                f"slot {dst_slot} already has a restore queued, in flight or suspended (G4)"
            )
        rrow = _BEGIN_RESTORE
        rec = self.records[cid]
        self._apply(cid, rec, T.RECORD.step(rec.phase, "pin_restore"))
        self._lru.move_to_end(cid)
        self._refresh(cid, rec)
        op = _restore_op(dst_slot, rec.runs, self.spec.image_bytes, self.spec.layout_id)
        self._queued_restores[dst_slot] = (cid, op)
        if self.row_sink is not None or self.on_transition is not None:
            self._took(T.RESTORE, rrow, (cid, dst_slot))
        return op

    def take_restore_ops(self) -> tuple[CheckpointRestoreOp, ...]:
        """Move every queued restore in flight, in queue order (SPEC B.3 row 5); pins
        unchanged. O(restores taken)."""
        queued = self._queued_restores
        if not queued:
            return ()
        self._queued_restores = {}
        row = T.RESTORE.step(T.QUEUED, "take")
        inflight = self._inflight_restores
        slots = self._inflight_slots
        ops = []
        for slot, entry in queued.items():
            inflight.append(entry)
            slots.add(slot)
            ops.append(entry[1])
            if self.row_sink is not None or self.on_transition is not None:
                self._took(T.RESTORE, row, (entry[0], slot))
        return tuple(ops)

    def cancel_queued_restore(self, dst_slot: int) -> None:
        """Drop the queued restore into ``dst_slot`` and release its pin (SPEC B.3 row 6).
        O(1).

        Raises:
            InvalidArgumentError: ``dst_slot`` is not an int.
        """
        if type(dst_slot) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("dst_slot", dst_slot)
        entry = self._queued_restores.get(dst_slot)
        if entry is None:
            return
        row = T.RESTORE.step(T.QUEUED, "cancel")
        del self._queued_restores[dst_slot]
        self._took(T.RESTORE, row, (entry[0], dst_slot))
        self._unpin(entry[0], "restore")

    def suspend_queued_restore(self, dst_slot: int) -> SuspendedCheckpointRestore | None:
        """Take the queued restore into ``dst_slot`` off the queue, keeping its pin, and
        return a single-use lease on it (SPEC B.3 row 7, G3); ``None`` if none is queued.
        O(1).

        Raises:
            InvalidArgumentError: ``dst_slot`` is not an int.
            AmbiguousSuspendError: never here: the queue holds one restore per slot (G4).
        """
        if type(dst_slot) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("dst_slot", dst_slot)
        entry = self._queued_restores.get(dst_slot)
        if entry is None:
            return None
        rrow = T.RESTORE.step(T.QUEUED, "suspend")
        lrow = T.LEASE.step(T.L_NONE, "suspend")
        del self._queued_restores[dst_slot]
        lease_id = self._next_lease_id
        self._next_lease_id += 1
        self._suspended[lease_id] = entry
        _count_add(self._suspended_slots, dst_slot, 1)
        self._took(T.RESTORE, rrow, (entry[0], dst_slot))
        self._took(T.LEASE, lrow, lease_id)
        return SuspendedCheckpointRestore(entry[0], entry[1], lease_id)

    def _live_lease(self, restore: SuspendedCheckpointRestore) -> tuple[int, CheckpointRestoreOp]:
        if not isinstance(restore, SuspendedCheckpointRestore):
            raise InvalidArgumentError(f"expected a SuspendedCheckpointRestore, got {restore!r}")
        if type(restore.lease_id) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("lease_id", restore.lease_id)
        entry = self._suspended.get(restore.lease_id)
        if entry is None:
            if 0 <= restore.lease_id < self._next_lease_id:
                raise LeaseReusedError(
                    f"suspended restore lease {restore.lease_id} was already resumed or"
                    " released; a lease is single-use (G3)"
                )
            raise UnknownOperationError(f"lease {restore.lease_id} was not issued by this store")
        if entry != (restore.checkpoint_id, restore.op):
            raise UnknownOperationError(f"lease {restore.lease_id} does not match what was issued")
        return entry

    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Put a suspended restore back at the end of the queue (SPEC B.3 row 8), spending
        the lease. O(1).

        Raises:
            InvalidArgumentError: ``restore`` is not a :class:`SuspendedCheckpointRestore`.
            LeaseReusedError: the lease was already resumed or released (G3).
            UnknownOperationError: the lease was not issued by this store.
            SourcePinLostError: its record holds no pin (SPEC row 8).
            SlotBusyError: another restore into the slot is queued or in flight (G4).
        """
        cid, op = self._live_lease(restore)
        rec = self.records.get(cid)
        if rec is None or rec.pin_count <= 0:
            raise SourcePinLostError(f"suspended restore of checkpoint {cid} lost its source pin")
        slot = op.dst_slot
        if slot in self._queued_restores or slot in self._inflight_slots:
            raise SlotBusyError(f"slot {slot} already has a restore queued or in flight (G4)")
        lrow = T.LEASE.step(T.LIVE, "resume")
        rrow = T.RESTORE.step(T.SUSPENDED, "resume")
        del self._suspended[restore.lease_id]
        _count_add(self._suspended_slots, slot, -1)
        self._queued_restores[slot] = (cid, op)
        self._took(T.LEASE, lrow, restore.lease_id)
        self._took(T.RESTORE, rrow, (cid, slot))

    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Drop a suspended restore and its pin (SPEC B.3 row 9), spending the lease. O(1).

        Raises:
            InvalidArgumentError, LeaseReusedError, UnknownOperationError: as
                :meth:`resume_suspended_restore`.
        """
        cid, op = self._live_lease(restore)
        lrow = T.LEASE.step(T.LIVE, "release")
        rrow = T.RESTORE.step(T.SUSPENDED, "release")
        del self._suspended[restore.lease_id]
        _count_add(self._suspended_slots, op.dst_slot, -1)
        self._took(T.LEASE, lrow, restore.lease_id)
        self._took(T.RESTORE, rrow, (cid, op.dst_slot))
        self._unpin(cid, "restore")
