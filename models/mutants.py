"""Planted bugs: small mutants of the reference model that the checks must catch.

Each mutant is a subclass of the reference coordinator (and, where the bug lives in the
store or pool, of those) that differs in one rule. Most restate a bug a public engine
shipped (SPEC section S, SPEC section G). ``tests/test_mutants.py`` runs the explorer on each
and asserts the exact shortest trace that exposes it: a checker that cannot fail checks
nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

import attrs

from pagedstate.spec import tables as T
from pagedstate.spec.types import (
    CheckpointRestoreOp,
    CheckpointStoreOp,
    SequenceLike,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)

from .reference import (
    PagedStateCheckpointCoordinator,
    PageUnitCheckpointStore,
    UnitPool,
    _Record,
)

__all__ = ["Mutant", "MUTANTS"]


@attrs.frozen
class Mutant:
    """A planted bug: its name, what it breaks, and the coordinator class that carries it."""

    name: str
    description: str
    coordinator: type[PagedStateCheckpointCoordinator]


def _coordinator(store_cls: type[PageUnitCheckpointStore]) -> type[PagedStateCheckpointCoordinator]:
    name = f"Coordinator{store_cls.__name__}"
    cls = type(name, (PagedStateCheckpointCoordinator,), {"store_class": store_cls})
    # A module-level name, so worlds over a mutant pickle (the parallel explorer sends them
    # between processes).
    globals()[name] = cls
    return cls


# 1. SPEC S1 / SPEC F.1: the record is READY (findable) before its batch ran.
class _PublishAtBegin(PageUnitCheckpointStore):
    def begin_store(self, prefix_hash: int, src_slot: int) -> CheckpointStoreOp | None:
        op = super().begin_store(prefix_hash, src_slot)
        if op is not None:
            cid = self._inflight_stores.pop()
            rec = self.records[cid]
            self._apply(cid, rec, self._step(T.RECORD, T.COPYING, "publish"))
        return op


# 2. SPEC B.3 row 3: restore pins dropped when the drain takes the restore, not when the
#    batch that carries it completed (the gather would read units already handed out).
class _UnpinAtTake(PageUnitCheckpointStore):
    def take_restore_ops(self) -> tuple[CheckpointRestoreOp, ...]:
        ops = super().take_restore_ops()
        taken, self._inflight_restores = self._inflight_restores, []
        for cid, _op in taken:
            self._unpin(cid, "restore")
        return ops


# 3. C.11: eviction ignores pins (vLLM 47282: a unit reused while a gather reads it).
class _EvictPinned(PageUnitCheckpointStore):
    def _is_evictable(self, cid: int, protected: int = -1) -> bool:
        rec = self.records.get(cid)
        return cid != protected and rec is not None and rec.phase == T.READY

    def _evict(self, cid: int) -> None:
        rec = self.records[cid]
        self._apply(cid, rec, self._step(T.RECORD, T.READY, "evict", "unpinned"))
        self.evictions += 1


# 4. SPEC S6: a COPYING record is nominated (and then handed to the tier).
class _NominateCopying(PageUnitCheckpointStore):
    def begin_store(self, prefix_hash: int, src_slot: int) -> CheckpointStoreOp | None:
        op = super().begin_store(prefix_hash, src_slot)
        if op is not None and self._offload_sink:
            self._queue_offload_store(self._inflight_stores[-1])
        return op

    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]:
        out = []
        while self._offload_ready and len(self._offload_pins) < max_inflight:
            cid = self._offload_ready.popleft()
            rec = self.records.get(cid)
            if rec is None or self._hash_in_flight(rec.prefix_hash):
                continue
            out.append(self._pin_offload_source(cid, timeout_reclaimable=True, now=self.clock()))
        return out


# 5. SPEC F.40/F.41: offload reports settled by bare hash, so a late report of an older
#    attempt retires the live one.
class _SettleByHash(PageUnitCheckpointStore):
    def settle_offload_store(self, op: StateStoreOperationId) -> None:
        for live in list(self._offload_pins):
            if live.prefix_hash == op.prefix_hash:
                super().settle_offload_store(live)
                return


# 6. C.17: the stale-pin reclaimer also reclaims explicit leases.
class _ReclaimLease(PageUnitCheckpointStore):
    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        for pin in self._offload_pins.values():
            pin.reclaimable = True
        return super().reclaim_stale_offload_pins(timeout_s)


# 7. SPEC F.35: a deferred nomination (its hash has an operation, or, D.13, its image is
#    not settled) is dropped instead of put back at the front.
class _DropDeferred(PageUnitCheckpointStore):
    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]:
        self.settle_completions()
        out = []
        while self._offload_ready and len(self._offload_pins) < max_inflight:
            cid = self._offload_ready.popleft()
            rec = self.records.get(cid)
            if rec is None or rec.phase != T.READY or self._hash_in_flight(rec.prefix_hash):
                continue
            if not rec.settled:
                continue
            out.append(self._pin_offload_source(cid, timeout_reclaimable=True, now=self.clock()))
        return out


# 8. SPEC S4 / SPEC F.25: a new boundary does not supersede the older one, so both
#    would be stored from the slot's latest state.
class _KeepOlderBoundary(PagedStateCheckpointCoordinator):
    def checkpoint(
        self,
        seq: SequenceLike,
        boundary_blocks: int,
        h: int,
        *,
        forward: int | None = None,
        computed_blocks: int | None = None,
    ) -> None:
        if self.applies(seq) and seq.state_slot >= 0:
            self._pending[(id(seq), h)] = (seq, h)
            if forward is not None:
                self._pending_forward[(id(seq), h)] = forward


# 9. SPEC F.47 / C.10: a lease takes no pin, so its image can be evicted under the reader.
class _LeaseWithoutPin(PageUnitCheckpointStore):
    def _pin(self, cid: int, kind: str) -> None:
        if kind == "lease":
            return
        super()._pin(cid, kind)

    def _unpin(self, cid: int, kind: str) -> None:
        if kind == "lease":
            return
        super()._unpin(cid, kind)


# 10. SPEC G9: the pool accepts a release naming only part of a reservation.
class _PartialReleasePool(UnitPool):
    def release_units(self, unit_ids: Any, owner: Hashable) -> None:
        for u in list(unit_ids):
            tag = self._tags.get(u)
            if tag is None or tag[0] != owner:
                super().release_units(unit_ids, owner)
                return
        for u in list(unit_ids):
            del self._tags[u]
            self._free.add(u)


class _PartialReleaseCoordinator(PagedStateCheckpointCoordinator):
    def __init__(self, pool: UnitPool, *args: Any, **kwargs: Any) -> None:
        mutant = _PartialReleasePool(pool.num_units)
        super().__init__(mutant, *args, **kwargs)


# 11. SPEC G3: a suspended-restore lease can be released twice (spending another pin).
class _ReusableLease(PageUnitCheckpointStore):
    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        entry = self._suspended.pop(restore.lease_id, None)
        if entry is None:
            if restore.checkpoint_id in self.records:
                self._unpin(restore.checkpoint_id, "restore")
            return
        self._unpin(entry[0], "restore")


# 12. SPEC G4: begin_restore does not check the destination slot.
class _TwoRestoresOneSlot(PageUnitCheckpointStore):
    def _slot_busy(self, dst_slot: int) -> bool:
        return False


# 13. SPEC B.3 row 6: cancelling a queued restore forgets to release its pin.
class _CancelKeepsPin(PageUnitCheckpointStore):
    def cancel_queued_restore(self, dst_slot: int) -> None:
        self._queued_restores = [
            (c, op) for c, op in self._queued_restores if op.dst_slot != dst_slot
        ]


# 14. SPEC B.3 row 10: unindex releases a pinned READY record at once.
class _UnindexReleasesPinned(PageUnitCheckpointStore):
    def unindex(self, prefix_hash: int) -> bool:
        cid = self.hash_to_checkpoint.get(prefix_hash)
        if cid is not None:
            rec: _Record = self.records[cid]
            if rec.phase == T.READY and rec.pin_count > 0:
                rec.pin_count = 0
                self._apply(cid, rec, self._step(T.RECORD, T.READY, "unindex", "unpinned"))
                return True
        return super().unindex(prefix_hash)


# 15. SPEC S14 (LMCache 5090): the terminal report releases the source pin again even
#     though phase 1 already released it (a double unpin).
class _DoubleUnpin(PageUnitCheckpointStore):
    def settle_offload_store(self, op: StateStoreOperationId) -> None:
        pin = self._offload_pins.get(op)
        if pin is None:
            return
        del self._offload_pins[op]
        self._unpin(pin.checkpoint_id, "offload" if pin.reclaimable else "lease")


# 16. SPEC D.13: the drain stores a boundary at once whatever forward it names: filed for
#     the forward about to run, it is copied from the slot as the previous forward left it
#     (a wrong-slot store under overlap: the older state under the newer hash).
class _IgnoreBoundaryForward(PagedStateCheckpointCoordinator):
    def take_checkpoint_ops(
        self, *, forward: int | None = None
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        self._pending_forward.clear()
        return super().take_checkpoint_ops(forward=forward)


# 17. SPEC D.13, C.27: host readers (the CPU tier's take, a transfer's lease) pin an image
#     whose batch's completion token has not reported done: the settled guard is bypassed
#     (the image is treated as settled for the call), so the host reads bytes a copy on the
#     device may still be writing.
class _PinUnsettled(PageUnitCheckpointStore):
    @contextlib.contextmanager
    def _as_if_settled(self) -> Iterator[None]:
        flipped = [c for c, r in self.records.items() if r.phase == T.READY and not r.settled]
        for cid in flipped:
            self.records[cid].settled = True
        try:
            yield
        finally:
            listed = {c for _token, cids in self._completions for c in cids}
            for cid in flipped:
                if cid in listed and cid in self.records:
                    self.records[cid].settled = False

    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]:
        with self._as_if_settled():
            return super().take_offload_stores(max_inflight)

    def acquire_checkpoint_source(
        self, prefix_hash: int, *, max_inflight: int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        with self._as_if_settled():
            return super().acquire_checkpoint_source(prefix_hash, max_inflight=max_inflight)


# 18. SPEC G12 (C.25): begin_restore checks the destination only against other restores
#     (as ATOM does), so a restore may target a slot lent as midstep scratch.
class _RestoreIntoLentScratch(PagedStateCheckpointCoordinator):
    def _scratch_held(self, slot: int) -> bool:
        return False


MUTANTS: Mapping[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "publish_at_begin",
            "READY at begin_store, before its batch ran (S1, F.1)",
            _coordinator(_PublishAtBegin),
        ),
        Mutant(
            "unpin_restore_at_take",
            "restore pins released at take, not at completion (B.3 r3)",
            _coordinator(_UnpinAtTake),
        ),
        Mutant("evict_pinned", "LRU eviction ignores pins (C.11, S7)", _coordinator(_EvictPinned)),
        Mutant(
            "nominate_copying",
            "a COPYING record nominated and handed out (S6)",
            _coordinator(_NominateCopying),
        ),
        Mutant(
            "settle_by_bare_hash",
            "reports matched by hash, not operation (F.40, F.41)",
            _coordinator(_SettleByHash),
        ),
        Mutant(
            "reclaim_lease",
            "the stale-pin reclaimer takes leases too (C.17, F.47)",
            _coordinator(_ReclaimLease),
        ),
        Mutant(
            "drop_deferred_nomination",
            "a deferred nomination is lost (F.35)",
            _coordinator(_DropDeferred),
        ),
        Mutant(
            "supersede_keeps_older",
            "an older pending boundary survives a newer one (S4, F.25)",
            _KeepOlderBoundary,
        ),
        Mutant(
            "lease_without_pin",
            "a lease takes no pin; its image is evictable (F.47, C.10)",
            _coordinator(_LeaseWithoutPin),
        ),
        Mutant(
            "partial_release_accepted",
            "release_units accepts part of a reservation (G9)",
            _PartialReleaseCoordinator,
        ),
        Mutant(
            "lease_reusable",
            "a suspended-restore lease can be released twice (G3)",
            _coordinator(_ReusableLease),
        ),
        Mutant(
            "two_restores_one_slot",
            "begin_restore ignores a busy destination slot (G4)",
            _coordinator(_TwoRestoresOneSlot),
        ),
        Mutant(
            "cancel_keeps_pin",
            "cancel_queued_restore keeps the pin (B.3 r6, S11)",
            _coordinator(_CancelKeepsPin),
        ),
        Mutant(
            "unindex_releases_pinned",
            "unindex frees a pinned READY record (B.3 r10, S7)",
            _coordinator(_UnindexReleasesPinned),
        ),
        Mutant(
            "double_unpin_on_settle",
            "settle releases a source pin that phase 1 already released (S14)",
            _coordinator(_DoubleUnpin),
        ),
        Mutant(
            "boundary_forward_ignored",
            "a boundary is stored at the first drain whatever forward it names (D.13)",
            _IgnoreBoundaryForward,
        ),
        Mutant(
            "host_pin_unsettled",
            "a lease or offload take pins an unsettled image (D.13, C.27)",
            _coordinator(_PinUnsettled),
        ),
        Mutant(
            "restore_into_lent_scratch",
            "begin_restore targets a slot lent as midstep scratch (G12, C.25)",
            _RestoreIntoLentScratch,
        ),
    )
}
