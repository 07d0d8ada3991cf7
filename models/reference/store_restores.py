"""The reference store's restores (SPEC B.3 rows 4-9, G3, G4): queueing one into a slot,
the drain taking them, cancelling, and suspending one under a single-use lease that is
resumed or released. A mixin of :class:`~.store.PageUnitCheckpointStore`."""

from __future__ import annotations

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    AmbiguousSuspendError,
    InvalidArgumentError,
    LeaseReusedError,
    SlotBusyError,
    SourcePinLostError,
    UnknownOperationError,
)
from pagedstate.spec.types import CheckpointRestoreOp, SuspendedCheckpointRestore

from ._common import _need_int
from .store_core import _StoreCore


class _Restores(_StoreCore):
    """Restores and their leases (SPEC B.3 rows 4-9, G3, G4)."""

    # -- reading --------------------------------------------------------------------------

    def restore_queued_for(self, dst_slot: int) -> bool:
        """Whether a queued restore will write ``dst_slot`` on the next batch."""
        _need_int("dst_slot", dst_slot)
        return any(op.dst_slot == dst_slot for _, op in self._queued_restores)

    def _queued_entry(self, dst_slot: int) -> tuple[int, CheckpointRestoreOp] | None:
        """The queued restore entry into ``dst_slot`` (an object the coordinator remembers
        by identity, G15; a resumed restore is a new entry), or None."""
        for entry in self._queued_restores:
            if entry[1].dst_slot == dst_slot:
                return entry
        return None

    def _slot_busy(self, dst_slot: int) -> bool:
        return (
            any(op.dst_slot == dst_slot for _, op in self._queued_restores)
            or any(op.dst_slot == dst_slot for _, op in self._inflight_restores)
            or any(op.dst_slot == dst_slot for _, op in self._suspended.values())
        )

    # -- restores -------------------------------------------------------------------------

    def begin_restore(self, prefix_hash: int, dst_slot: int) -> CheckpointRestoreOp | None:
        """Queue a restore of ``prefix_hash``'s READY image into ``dst_slot`` and pin it
        (SPEC B.3 row 4). Takes no units. ``None`` when no READY image exists.

        Raises:
            SlotBusyError: ``dst_slot`` already has a queued, in-flight or suspended restore (G4).
        """
        _need_int("prefix_hash", prefix_hash)
        _need_int("dst_slot", dst_slot, 0)
        cid = self.lookup(prefix_hash)
        if cid < 0:
            return None
        if self._slot_busy(dst_slot):
            raise SlotBusyError(
                f"slot {dst_slot} already has a restore queued, in flight or suspended (G4)"
            )
        self._step(T.RESTORE, T.R_NONE, "begin_restore", to=T.QUEUED)
        self._pin(cid, "restore")
        self._lru.remove(cid)
        self._lru.append(cid)
        rec = self.records[cid]
        op = CheckpointRestoreOp(dst_slot, rec.unit_ids, self.spec.image_bytes, self.spec.layout_id)
        self._queued_restores.append((cid, op))
        return op

    def take_restore_ops(self) -> tuple[CheckpointRestoreOp, ...]:
        """Move every queued restore in flight (SPEC B.3 row 5); pins unchanged."""
        queued, self._queued_restores = self._queued_restores, []
        for _ in queued:
            self._step(T.RESTORE, T.QUEUED, "take", to=T.IN_FLIGHT)
        self._inflight_restores.extend(queued)
        return tuple(op for _, op in queued)

    def cancel_queued_restore(self, dst_slot: int) -> None:
        """Drop every queued restore into ``dst_slot`` and release its pin (SPEC B.3 row 6)."""
        _need_int("dst_slot", dst_slot)
        keep: list[tuple[int, CheckpointRestoreOp]] = []
        drop: list[tuple[int, CheckpointRestoreOp]] = []
        for entry in self._queued_restores:  # the entries themselves: G15 knows them by identity
            (drop if entry[1].dst_slot == dst_slot else keep).append(entry)
        self._queued_restores = keep
        for cid, _op in drop:
            self._step(T.RESTORE, T.QUEUED, "cancel", to=T.CANCELLED)
            self._unpin(cid, "restore")

    def suspend_queued_restore(self, dst_slot: int) -> SuspendedCheckpointRestore | None:
        """Take the queued restore into ``dst_slot`` off the queue, keeping its pin, and
        return a single-use lease on it (SPEC B.3 row 7, G3); ``None`` if none is queued.

        Raises:
            AmbiguousSuspendError: more than one restore is queued for the slot.
        """
        _need_int("dst_slot", dst_slot)
        matches = [i for i, (_, op) in enumerate(self._queued_restores) if op.dst_slot == dst_slot]
        if len(matches) > 1:
            raise AmbiguousSuspendError(f"{len(matches)} restores are queued for slot {dst_slot}")
        if not matches:
            return None
        self._step(T.RESTORE, T.QUEUED, "suspend", to=T.SUSPENDED)
        self._step(T.LEASE, T.L_NONE, "suspend", to=T.LIVE)
        cid, op = self._queued_restores.pop(matches[0])
        lease_id = self._next_lease_id
        self._next_lease_id += 1
        self._suspended[lease_id] = (cid, op)
        return SuspendedCheckpointRestore(cid, op, lease_id)

    def _live_lease(self, restore: SuspendedCheckpointRestore) -> tuple[int, CheckpointRestoreOp]:
        if not isinstance(restore, SuspendedCheckpointRestore):
            raise InvalidArgumentError(f"expected a SuspendedCheckpointRestore, got {restore!r}")
        _need_int("lease_id", restore.lease_id)
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
        """Put a suspended restore back on the queue (SPEC B.3 row 8), spending the lease.

        Raises:
            LeaseReusedError: the lease was already resumed or released (G3).
            UnknownOperationError: the lease was not issued by this store.
            SourcePinLostError: its record holds no pin (SPEC row 8).
            SlotBusyError: another restore into the slot is queued or in flight (G4).
        """
        cid, op = self._live_lease(restore)
        rec = self.records.get(cid)
        if rec is None or rec.pin_count <= 0:
            raise SourcePinLostError(f"suspended restore of checkpoint {cid} lost its source pin")
        if any(o.dst_slot == op.dst_slot for _, o in self._queued_restores) or any(
            o.dst_slot == op.dst_slot for _, o in self._inflight_restores
        ):
            raise SlotBusyError(
                f"slot {op.dst_slot} already has a restore queued or in flight (G4)"
            )
        self._step(T.LEASE, T.LIVE, "resume", to=T.RESUMED)
        self._step(T.RESTORE, T.SUSPENDED, "resume", to=T.QUEUED)
        del self._suspended[restore.lease_id]
        self._queued_restores.append((cid, op))

    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Drop a suspended restore and its pin (SPEC B.3 row 9), spending the lease.

        Raises:
            LeaseReusedError, UnknownOperationError: as :meth:`resume_suspended_restore`.
        """
        cid, _op = self._live_lease(restore)
        self._step(T.LEASE, T.LIVE, "release", to=T.L_RELEASED)
        self._step(T.RESTORE, T.SUSPENDED, "release", to=T.DONE)
        del self._suspended[restore.lease_id]
        self._unpin(cid, "restore")
