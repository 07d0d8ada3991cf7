"""The reference coordinator, :class:`PagedStateCheckpointCoordinator` (SPEC D with G1 and
G5): pending boundaries and the per-pass drain, admission, transfers, midstep scratch, the
offload wiring, index changes and fates, over one :class:`~.store.PageUnitCheckpointStore`."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    InvalidArgumentError,
    StaleReservationError,
    UnknownOperationError,
)
from pagedstate.spec.protocols import need_coordinator_args, need_scratch_pool
from pagedstate.spec.sequences import need_sequence, sequence_slot
from pagedstate.spec.snapshot import Snapshot
from pagedstate.spec.types import (
    TRANSFER_OWNER,
    CheckpointRestoreOp,
    CheckpointStoreOp,
    PagedStateCheckpointSpec,
    ScratchSlotPool,
    SequenceLike,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)

from ._common import (
    DEFAULT_CHANGE_LOG_SIZE,
    DEFAULT_FORFEIT_BOUND,
    DEFAULT_OFFLOAD_BACKLOG_CAP,
    RowSink,
    _free_slots,
    _is_int,
    _need_int,
    _need_transfer_owner,
    _Stepper,
)
from .pool import UnitPool
from .store import PageUnitCheckpointStore

# ---------------------------------------------------------------------------------------
# The coordinator (SPEC D)
# ---------------------------------------------------------------------------------------


class PagedStateCheckpointCoordinator(_Stepper):
    """Reference coordinator: pending boundaries, the per-pass drain, transfers, midstep
    scratch and fates (SPEC D with G1 and G5).

    Args:
        pool: the unit pool.
        spec: image geometry.
        enabled: prefix caching on and the model has per-request state.
        offload: the CPU tier's index (anything with ``could_serve(h)``), or None.
        readable_midstep: the backend exposes interior states (midstep scratch stores).
        clock, offload_backlog_cap, forfeit_bound, change_log_size: passed to the store.
    """

    successor_room = 0.0
    #: The store class the coordinator builds (a subclass, for planted-bug tests).
    store_class: type[PageUnitCheckpointStore] = PageUnitCheckpointStore

    def __init__(
        self,
        pool: UnitPool,
        spec: PagedStateCheckpointSpec,
        enabled: bool,
        offload: Any = None,
        readable_midstep: bool = False,
        *,
        clock: Callable[[], float] | None = None,
        offload_backlog_cap: int = DEFAULT_OFFLOAD_BACKLOG_CAP,
        forfeit_bound: int = DEFAULT_FORFEIT_BOUND,
        change_log_size: int = DEFAULT_CHANGE_LOG_SIZE,
    ) -> None:
        need_coordinator_args(enabled, offload, readable_midstep)
        self.enabled = enabled
        self.readable_midstep = bool(readable_midstep)
        self.offload = offload
        self.store = self.store_class(
            pool,
            spec,
            offload_sink=offload is not None,
            clock=clock,
            offload_backlog_cap=offload_backlog_cap,
            forfeit_bound=forfeit_bound,
            change_log_size=change_log_size,
        )
        self._scratch: ScratchSlotPool | None = None
        self._max_ops_per_batch = 0
        # Outstanding scratch reservations: slot -> (pos, h) of the triple handed out.
        self._scratch_reserved: dict[int, tuple[int, int]] = {}
        self._scratch_queued: list[tuple[int, int]] = []
        self._scratch_issued: list[int] = []
        self._pending: dict[tuple[int, int], tuple[SequenceLike, int]] = {}
        self._store_ops: list[CheckpointStoreOp] = []
        self._transfer_units: dict[Hashable, tuple[int, ...]] = {}
        self.checkpoints_kept = 0
        self.checkpoints_dropped = 0
        self.checkpoints_orphaned = 0

    @property
    def row_sink(self) -> RowSink | None:
        return self.store.row_sink

    @row_sink.setter
    def row_sink(self, sink: RowSink | None) -> None:
        self.store.row_sink = sink

    def clone(self) -> PagedStateCheckpointCoordinator:
        """A deep copy (the scratch pool must offer ``clone()``; the offload index, clock and
        row sink are shared)."""
        c = type(self).__new__(type(self))
        c.__dict__.update(self.__dict__)
        c.store = self.store.clone()
        if self._scratch is not None:
            c._scratch = self._scratch.clone()  # type: ignore[attr-defined]
        c._scratch_reserved = dict(self._scratch_reserved)
        c._scratch_queued = list(self._scratch_queued)
        c._scratch_issued = list(self._scratch_issued)
        c._pending = dict(self._pending)
        c._store_ops = list(self._store_ops)
        c._transfer_units = dict(self._transfer_units)
        return c

    @property
    def pool(self) -> UnitPool:
        return self.store.pool

    def applies(self, seq: SequenceLike) -> bool:
        """Whether checkpoints apply to ``seq`` at all.

        Raises:
            InvalidArgumentError: ``seq`` is not a sequence (an int ``state_slot`` and a
                ``has_per_req_cache``), as for every call taking one.
        """
        need_sequence(seq)
        return self._applies(seq)

    def _applies(self, seq: SequenceLike) -> bool:
        return self.enabled and bool(seq.has_per_req_cache)

    # -- midstep scratch (SPEC D.1 steps 4-6, G5) -----------------------------------------

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
        free slot. Hashes already queued, READY or pending are skipped.

        Raises:
            InvalidArgumentError: ``positions`` is not a list or tuple of ``(int, int)``
                pairs, or ``seq`` is not a sequence.
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
        for pos, h in positions:
            if h in queued or self.store.contains_or_pending(h):
                continue
            if not self._scratch.has_free():
                self.checkpoints_dropped += 1
                break
            slot = self._scratch.pop()
            self._step(T.SCRATCH, T.FREE, "reserve", to=T.S_RESERVED)
            self._scratch_reserved[slot] = (pos, h)
            out.append((slot, pos, h))
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

    def publish_midstep(self, reservations: list[tuple[int, int, int]], seq: object = None) -> None:
        """The forward wrote the scratch slots: queue ``(h, slot)`` for the next drain.

        Raises:
            InvalidArgumentError: not a list or tuple of ``(slot, pos, h)`` int triples.
            UnknownOperationError: a slot is not an outstanding reservation, or repeats.
            StaleReservationError: a triple is not the one outstanding for its slot (an
                earlier reservation of a slot lent again).
        """
        del seq
        self._need_reservations(reservations)
        for slot, _pos, h in reservations:
            self._step(T.SCRATCH, T.S_RESERVED, "publish", to=T.S_QUEUED)
            del self._scratch_reserved[slot]
            self._scratch_queued.append((h, slot))

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

    def _take_scratch_stores(self, budget: int) -> None:
        queued, self._scratch_queued = self._scratch_queued, []
        for i, (h, slot) in enumerate(queued):
            if budget <= 0:
                for _ in queued[i:]:
                    self._step(T.SCRATCH, T.S_QUEUED, "issue", "over_budget", to=T.S_QUEUED)
                self._scratch_queued = queued[i:]
                return
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

    # -- admission ------------------------------------------------------------------------

    def resumable_hit(
        self,
        seq: SequenceLike,
        hit: int,
        block_hashes: list[int],
        assume_checkpointed: bool = False,
    ) -> int:
        """Longest prefix (in blocks, ``<= hit``) whose boundary state can be produced, in HBM
        or (optimistically) from the CPU tier; 0 when none (SPEC D.1 step 2).

        Raises:
            InvalidArgumentError: ``hit`` negative or beyond ``len(block_hashes)``;
                ``block_hashes`` not a list or tuple, or one of its first ``hit`` entries
                not an int; ``seq`` not a sequence.
        """
        _need_int("hit", hit, 0)
        if not isinstance(block_hashes, (list, tuple)):
            raise InvalidArgumentError(
                "block_hashes must be a list or tuple of ints, got"
                f" {type(block_hashes).__qualname__}"
            )
        if hit > len(block_hashes):
            raise InvalidArgumentError(f"hit {hit} exceeds the {len(block_hashes)} block hashes")
        for h in block_hashes[:hit]:
            if not _is_int(h):
                raise InvalidArgumentError(f"a block hash must be an int, got {h!r}")
        need_sequence(seq)
        if not self._applies(seq):
            return hit
        for i in range(hit - 1, -1, -1):
            if assume_checkpointed or self._reachable(block_hashes[i]):
                return i + 1
        return 0

    def _reachable(self, h: int) -> bool:
        if self.store.contains(h):
            return True
        return self.offload is not None and bool(self.offload.could_serve(h))

    # -- pending boundaries (SPEC D.1 steps 5, 6, 8, G1) ----------------------------------

    def checkpoint(self, seq: SequenceLike, boundary_blocks: int, h: int) -> None:
        """File boundary ``h`` of ``seq`` to be stored at the next drain from its slot.

        At most one pending boundary per sequence survives: a different ``h`` supersedes
        (and counts as dropped) every earlier one; re-filing the same ``h`` changes nothing
        (G1). Ignored when checkpoints do not apply or ``seq.state_slot < 0``.

        Raises:
            InvalidArgumentError: ``boundary_blocks`` not an int >= 0, ``h`` not an int, or
                ``seq`` not a sequence.
        """
        _need_int("boundary_blocks", boundary_blocks, 0)
        _need_int("h", h)
        if need_sequence(seq) < 0 or not self._applies(seq):
            return
        key = (id(seq), h)
        if key in self._pending:
            return
        stale = [k for k in self._pending if k[0] == id(seq)]
        for k in stale:
            del self._pending[k]
        self.checkpoints_dropped += len(stale)
        self._pending[key] = (seq, h)

    def forget_pending(self, seq: SequenceLike) -> None:
        """``seq`` is leaving its slot: drop its pending boundaries (not counted) and cancel
        the queued restore into its slot.

        Raises:
            InvalidArgumentError: ``seq`` is not a sequence (``state_slot`` not an int,
                nothing changed, G8).
        """
        slot = need_sequence(seq)
        for k in [k for k in self._pending if k[0] == id(seq)]:
            del self._pending[k]
        if slot >= 0:
            self.store.cancel_queued_restore(slot)

    def restore_queued_for(self, dst_slot: int) -> bool:
        """Whether a queued restore will write ``dst_slot`` (evidence for a claimed hit, S9)."""
        return self.store.restore_queued_for(dst_slot)

    def begin_restore(self, h: int, dst_slot: int) -> bool:
        """Queue a restore of ``h`` into ``dst_slot``; False when ``h`` is not READY."""
        return self.store.begin_restore(h, dst_slot) is not None

    def take_checkpoint_ops(
        self,
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        """The drain of a non-empty batch: begin the pending boundary stores, take the queued
        restores, then begin queued scratch stores within the per-batch budget (SPEC D.1 step 6).
        Returns ``(stores, restores)`` for this batch's copy launch."""
        for seq, _h in self._pending.values():
            sequence_slot(seq)  # every slot is read before anything changes (G8)
        pending, self._pending = self._pending, {}
        for seq, h in pending.values():
            src = sequence_slot(seq)
            if src < 0 or self.store.contains_or_pending(h):
                continue
            op = self.store.begin_store(h, src)
            if op is None:
                self.checkpoints_dropped += 1
                continue
            self._store_ops.append(op)
            self.checkpoints_kept += 1
        restores = self.store.take_restore_ops()
        if self._scratch_queued:
            self._take_scratch_stores(
                self._max_ops_per_batch - len(self._store_ops) - len(restores)
            )
        stores, self._store_ops = self._store_ops, []
        return tuple(stores), restores

    def complete_previous_batch(self) -> None:
        """Top of a pass: the last drain's batch was issued. Publish its stores, release its
        restore pins and return its scratch slots (SPEC D.1 step 1)."""
        self.store.complete_inflight()
        issued, self._scratch_issued = self._scratch_issued, []
        for slot in issued:
            self._step(T.SCRATCH, T.ISSUED, "complete", to=T.FREE)
            assert self._scratch is not None
            self._scratch.release(slot)

    def has_available_units(self, count: int, protected_hash: int | None = None) -> bool:
        """See :meth:`PageUnitCheckpointStore.has_available_units`."""
        return self.store.has_available_units(count, protected_hash)

    def ensure_free_units(self, count: int) -> bool:
        """See :meth:`PageUnitCheckpointStore.ensure_free_units`."""
        return self.store.ensure_free_units(count)

    # -- transfers (SPEC D.1 step 12) -----------------------------------------------------

    def reserve_transfer_units(self, owner: Hashable) -> tuple[int, ...] | None:
        """Reserve one image's units for an external load, tagged ``("state-transfer",
        owner)``. ``owner`` must include a generation. ``None`` for a duplicate active owner
        or when no room can be made (evicting only unpinned READY records).

        Raises:
            InvalidArgumentError: ``owner`` is None or unhashable.
        """
        _need_transfer_owner(owner)
        if owner in self._transfer_units:
            return None
        u = self.store.units_per_checkpoint
        if not self.store.ensure_free_units(u):
            return None
        with self.pool._as_store():
            units = self.pool.reserve_units(u, (TRANSFER_OWNER, owner))
        if units is None:
            return None
        self._step(T.TRANSFER, T.T_NONE, "reserve", to=T.RESERVED)
        self._transfer_units[owner] = tuple(units)
        return self._transfer_units[owner]

    def release_transfer_units(self, owner: Hashable) -> None:
        """Release a reservation, once; unknown owners (another generation) are ignored.

        Raises:
            InvalidArgumentError: ``owner`` is None or unhashable.
        """
        _need_transfer_owner(owner)
        units = self._transfer_units.get(owner)
        if units is None:
            return
        self._step(T.TRANSFER, T.RESERVED, "release", to=T.T_RELEASED)
        with self.pool._as_store():
            self.pool.release_units(units, (TRANSFER_OWNER, owner))
        del self._transfer_units[owner]

    def adopt_transfer_units(self, owner: Hashable, prefix_hash: int) -> bool:
        """Publish a completed external image as ``prefix_hash``'s READY record, with no free
        window; False (units released) if the hash is READY or pending, or the owner has no
        reservation. The reservation is dropped only after adoption returned.

        Raises:
            InvalidArgumentError: ``prefix_hash`` is not an int; ``owner`` is None or
                unhashable.
        """
        _need_int("prefix_hash", prefix_hash)
        _need_transfer_owner(owner)
        units = self._transfer_units.get(owner)
        if units is None:
            return False
        store = self.store
        store._transfer_grant = True  # the one caller that may adopt a transfer reservation
        try:
            adopted = store.adopt_units(units, (TRANSFER_OWNER, owner), prefix_hash)
        finally:
            store._transfer_grant = False  # unspent if adopt_units refused before its check
        self._step(
            T.TRANSFER,
            T.RESERVED,
            "adopt",
            "fresh" if adopted else "duplicate",
            to=T.ADOPTED if adopted else T.DEDUPED,
        )
        del self._transfer_units[owner]
        return adopted

    def suspend_queued_restore(self, dst_slot: int) -> SuspendedCheckpointRestore | None:
        """See :meth:`PageUnitCheckpointStore.suspend_queued_restore`."""
        return self.store.suspend_queued_restore(dst_slot)

    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """See :meth:`PageUnitCheckpointStore.resume_suspended_restore`."""
        self.store.resume_suspended_restore(restore)

    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """See :meth:`PageUnitCheckpointStore.release_suspended_restore`."""
        self.store.release_suspended_restore(restore)

    def contains(self, h: int) -> bool:
        """Whether HBM holds a READY image of ``h`` now."""
        return self.store.contains(h)

    # -- offload --------------------------------------------------------------------------

    def attach_offload(self, index: Any, *, sink: bool = True) -> None:
        """Wire the CPU tier in: the vote (``resumable_hit``) and the sink (nominations)
        together; ``sink=False`` for a load-only role."""
        self.offload = index
        self.store.offload_sink = index is not None and bool(sink)

    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]:
        """See :meth:`PageUnitCheckpointStore.take_offload_stores`."""
        return self.store.take_offload_stores(max_inflight)

    def acquire_checkpoint_source(
        self, prefix_hash: int, *, max_inflight: int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        """See :meth:`PageUnitCheckpointStore.acquire_checkpoint_source`."""
        return self.store.acquire_checkpoint_source(prefix_hash, max_inflight=max_inflight)

    def release_offload_store_source(self, op: StateStoreOperationId) -> None:
        """See :meth:`PageUnitCheckpointStore.release_offload_store_source`."""
        self.store.release_offload_store_source(op)

    def settle_offload_store(self, op: StateStoreOperationId) -> None:
        """See :meth:`PageUnitCheckpointStore.settle_offload_store`."""
        self.store.settle_offload_store(op)

    def has_offload_pins(self) -> bool:
        """See :meth:`PageUnitCheckpointStore.has_offload_pins`."""
        return self.store.has_offload_pins()

    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        """See :meth:`PageUnitCheckpointStore.reclaim_stale_offload_pins`."""
        return self.store.reclaim_stale_offload_pins(timeout_s)

    def was_reclaimed(self, op: StateStoreOperationId) -> bool:
        """See :meth:`PageUnitCheckpointStore.was_reclaimed`."""
        return self.store.was_reclaimed(op)

    # -- index changes (SPEC D.1 steps 9, 10, G5) -----------------------------------------

    def _orphan_scratch(self, match: Callable[[int], bool]) -> int:
        keep = []
        dropped = 0
        for h, slot in self._scratch_queued:
            if match(h):
                self._step(T.SCRATCH, T.S_QUEUED, "orphan", to=T.FREE)
                assert self._scratch is not None
                self._scratch.release(slot)
                dropped += 1
            else:
                keep.append((h, slot))
        self._scratch_queued = keep
        return dropped

    def unindex(self, h: int) -> None:
        """The KV prefix ``h`` was evicted: drop every pending boundary and queued scratch
        store of ``h`` (G5) and unindex its checkpoint; counts one orphan if anything went."""
        _need_int("h", h)
        stale = [k for k, (_, ph) in self._pending.items() if ph == h]
        for k in stale:
            del self._pending[k]
        scratch = self._orphan_scratch(lambda qh: qh == h)
        removed = self.store.unindex(h)
        if stale or scratch or removed:
            self.checkpoints_orphaned += 1

    def clear_index(self) -> None:
        """Admin reset: drop pending boundaries and queued scratch stores (their slots return,
        one orphan counted if any, G5) and clear the store. Transfers and leases survive."""
        self._pending.clear()
        if self._orphan_scratch(lambda _h: True):
            self.checkpoints_orphaned += 1
        self.store.clear()

    def checkpoint_fates(self) -> dict[str, int]:
        """What became of the checkpoints (SPEC D.1 step 13)."""
        fates = {
            "checkpoints_kept": self.checkpoints_kept,
            "checkpoints_dropped": self.checkpoints_dropped,
            "checkpoints_evicted": self.store.evictions,
            "offload_pins_reclaimed": self.store.offload_pins_reclaimed,
            "checkpoints_orphaned": self.checkpoints_orphaned,
        }
        stats = getattr(self.offload, "stats", None) if self.offload is not None else None
        if callable(stats):
            fates.update((f"state_offload_{k}", v) for k, v in stats().items())
        fates["state_offload_store_backlog"] = len(self.store._offload_ready)
        fates["state_offload_nominations_dropped"] = self.store.offload_nominations_dropped
        return fates

    def snapshot(self) -> Snapshot:
        """The store's snapshot plus the coordinator's structures."""
        return self.store.snapshot(
            pending_boundaries=tuple((k[0], h) for k, (_, h) in self._pending.items()),
            transfers=dict(self._transfer_units),
            scratch_reserved=frozenset(self._scratch_reserved),
            scratch_queued=tuple(self._scratch_queued),
            scratch_issued=tuple(self._scratch_issued),
            checkpoints_kept=self.checkpoints_kept,
            checkpoints_dropped=self.checkpoints_dropped,
            checkpoints_orphaned=self.checkpoints_orphaned,
            scratch_free=_free_slots(self._scratch),
        )


if TYPE_CHECKING:
    from pagedstate.spec.protocols import CoordinatorProtocol

    def _is_a_coordinator(c: PagedStateCheckpointCoordinator) -> CoordinatorProtocol:
        """mypy checks that the reference coordinator (with its store and pool) has the
        whole surface :class:`CoordinatorProtocol` promises engines."""
        return c
