"""The reference coordinator, :class:`PagedStateCheckpointCoordinator` (SPEC D with G1, G5
and G12-G17): pending boundaries and the per-pass drain with its forward ids, completions
and their tokens (D.13), admission, restores remembered per sequence (G15), transfers,
midstep scratch, the offload wiring, index changes, fates and ``outstanding()``, over one
:class:`~.store.PageUnitCheckpointStore`."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    BoundaryRangeError,
    InvalidArgumentError,
    SlotBusyError,
    StaleBoundaryError,
)
from pagedstate.spec.protocols import (
    need_completion,
    need_coordinator_args,
    need_forward,
    need_offload_index,
)
from pagedstate.spec.sequences import need_sequence, sequence_slot
from pagedstate.spec.snapshot import Snapshot
from pagedstate.spec.types import (
    TRANSFER_OWNER,
    CheckpointRestoreOp,
    CheckpointStoreOp,
    CompletionToken,
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
)
from .coordinator_scratch import _Scratch
from .pool import UnitPool
from .store import PageUnitCheckpointStore

# ---------------------------------------------------------------------------------------
# The coordinator (SPEC D)
# ---------------------------------------------------------------------------------------


class PagedStateCheckpointCoordinator(_Scratch):
    """Reference coordinator: pending boundaries, the per-pass drain, completions, transfers,
    midstep scratch and fates (SPEC D with G1, G5 and G12-G17; forward ids and completion
    tokens, D.13).

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
        # SPEC D.13: the forward id a pending boundary or queued scratch store was filed
        # with (absent: the synchronous meaning), and the latest drain's forward id.
        self._pending_forward: dict[tuple[int, int], int] = {}
        self._scratch_forward: dict[int, int] = {}
        self._last_forward: int | None = None
        # G15: restores begun for a sequence, (seq, slot, the store's queued entry), in the
        # order begun; one is valid while the store still has that very entry queued.
        self._restore_owners: list[tuple[SequenceLike, int, object]] = []
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
        c._pending_forward = dict(self._pending_forward)
        c._scratch_forward = dict(self._scratch_forward)
        # The store's copy shares its queued entries (immutable tuples), so identity holds.
        c._restore_owners = list(self._restore_owners)
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

    # -- admission ------------------------------------------------------------------------

    def resumable_hit(
        self,
        seq: SequenceLike,
        hit: int,
        block_hashes: list[int] | tuple[int, ...],
        assume_checkpointed: bool = False,
    ) -> int:
        """Longest prefix (in blocks, ``<= hit``) whose boundary state can be produced, in HBM
        or (optimistically) from the CPU tier; 0 when none (SPEC D.1 step 2). ``hit`` for a
        sequence without per-request state; 0 for one with it when the coordinator is
        disabled, since nothing could restore its slot (G14).

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
        if not seq.has_per_req_cache:
            return hit
        if not self.enabled:
            return 0  # G14: fail closed
        for i in range(hit - 1, -1, -1):
            if assume_checkpointed or self._reachable(block_hashes[i]):
                return i + 1
        return 0

    def _reachable(self, h: int) -> bool:
        if self.store.contains(h):
            return True
        return self.offload is not None and bool(self.offload.could_serve(h))

    # -- pending boundaries (SPEC D.1 steps 5, 6, 8, G1) ----------------------------------

    def checkpoint(
        self,
        seq: SequenceLike,
        boundary_blocks: int,
        h: int,
        *,
        forward: int | None = None,
        computed_blocks: int | None = None,
    ) -> None:
        """File boundary ``h`` of ``seq`` to be stored from its slot (SPEC D.1 step 5): at the
        next drain, or with ``forward``, by the drain right after forward ``forward`` (D.13).

        At most one pending boundary per sequence survives: a different ``h`` supersedes
        (and counts as dropped) every earlier one, and its forward replaces theirs;
        re-filing the same ``h`` changes nothing, the first forward stays (G1). Ignored,
        after every check, when checkpoints do not apply or ``seq.state_slot < 0``.

        Raises:
            InvalidArgumentError: ``boundary_blocks`` not an int >= 0, ``computed_blocks``
                neither None nor an int >= 0, ``forward`` neither None nor an int >= 0,
                ``h`` not an int, or ``seq`` not a sequence.
            BoundaryRangeError: ``boundary_blocks`` is 0, or beyond ``computed_blocks``
                (G13).
            StaleBoundaryError: ``forward`` is below the latest drain's forward id: its
                slot has been handed to a later forward (D.13).
        """
        _need_int("boundary_blocks", boundary_blocks, 0)
        if boundary_blocks == 0:
            raise BoundaryRangeError(
                "boundary_blocks must be >= 1: a boundary of 0 blocks names no computed state (G13)"
            )
        if computed_blocks is not None:
            _need_int("computed_blocks", computed_blocks, 0)
            if boundary_blocks > computed_blocks:
                raise BoundaryRangeError(
                    f"boundary_blocks {boundary_blocks} is beyond the {computed_blocks}"
                    " blocks computed (G13)"
                )
        fwd = need_forward("forward", forward)
        _need_int("h", h)
        slot = need_sequence(seq)
        last = self._last_forward
        if fwd is not None and last is not None and fwd < last:
            raise StaleBoundaryError(
                f"boundary {h} names forward {fwd}, but the latest drain was for forward"
                f" {last}: its slot has been handed to a later forward (D.13)"
            )
        if slot < 0 or not self._applies(seq):
            return
        key = (id(seq), h)
        if key in self._pending:
            return
        stale = [k for k in self._pending if k[0] == id(seq)]
        for k in stale:
            del self._pending[k]
            self._pending_forward.pop(k, None)
        self.checkpoints_dropped += len(stale)
        self._pending[key] = (seq, h)
        if fwd is not None:
            self._pending_forward[key] = fwd

    def _owned_restore(self, seq: SequenceLike) -> int | None:
        """The slot of ``seq``'s remembered restore while it is still valid (G15), else None."""
        for owner, slot, entry in self._restore_owners:
            if owner is seq and self.store._queued_entry(slot) is entry:
                return slot
        return None

    def _slot_owned_by_other(self, slot: int, seq: SequenceLike) -> bool:
        entry = self.store._queued_entry(slot)
        return entry is not None and any(
            owner is not seq and s == slot and e is entry for owner, s, e in self._restore_owners
        )

    def _valid_owners(self) -> list[tuple[SequenceLike, int, object]]:
        return [
            (owner, slot, entry)
            for owner, slot, entry in self._restore_owners
            if self.store._queued_entry(slot) is entry
        ]

    def forget_pending(self, seq: SequenceLike) -> None:
        """``seq`` is leaving its slot (SPEC D.1 step 8): drop its pending boundary (not
        counted) and cancel its queued restore: the one ``begin_restore(..., seq=seq)``
        queued, into whatever slot it names (G15); with none, the queued restore into
        ``seq.state_slot`` when that is ``>= 0`` and no other sequence's restore it is.

        Raises:
            InvalidArgumentError: ``seq`` is not a sequence (``state_slot`` not an int,
                nothing changed, G8).
        """
        slot = need_sequence(seq)
        for k in [k for k in self._pending if k[0] == id(seq)]:
            del self._pending[k]
            self._pending_forward.pop(k, None)
        owned = self._owned_restore(seq)
        self._restore_owners = [
            (owner, s, e) for owner, s, e in self._valid_owners() if owner is not seq
        ]
        if owned is not None:
            self.store.cancel_queued_restore(owned)
        elif slot >= 0 and not self._slot_owned_by_other(slot, seq):
            self.store.cancel_queued_restore(slot)

    def restore_queued_for(self, dst_slot: int) -> bool:
        """Whether a queued restore will write ``dst_slot`` (evidence for a claimed hit, S9)."""
        return self.store.restore_queued_for(dst_slot)

    def begin_restore(self, h: int, dst_slot: int, *, seq: SequenceLike | None = None) -> bool:
        """Queue a restore of ``h`` into ``dst_slot`` (SPEC D.1 step 3, B.3 row 4); False
        when ``h`` is not READY. With ``seq``, the restore is remembered for it until a
        drain takes it, or it is cancelled or suspended (G15).

        Raises:
            InvalidArgumentError: ``h`` not an int, ``dst_slot`` not an int >= 0, ``seq``
                neither None nor a sequence.
            SlotBusyError: ``dst_slot`` is lent as midstep scratch (G12); ``seq`` already
                has a queued restore remembered (G15); ``dst_slot`` already has a queued,
                in-flight or suspended restore (G4).
        """
        _need_int("prefix_hash", h)
        _need_int("dst_slot", dst_slot, 0)
        if seq is not None:
            need_sequence(seq)
        if self._scratch_held(dst_slot):
            raise SlotBusyError(
                f"slot {dst_slot} is lent as midstep scratch; a slot is one buffer whoever"
                " lends it (G12)"
            )
        if seq is not None and self._owned_restore(seq) is not None:
            raise SlotBusyError(
                "the sequence already has a queued restore (begin_restore with seq=); forget or"
                " take it first (G15)"
            )
        if self.store.begin_restore(h, dst_slot) is None:
            return False
        if seq is not None:
            self._restore_owners = self._valid_owners()
            self._restore_owners.append((seq, dst_slot, self.store._queued_entry(dst_slot)))
        return True

    @property
    def last_forward(self) -> int | None:
        """The forward id of the latest drain, None before the first (SPEC D.13)."""
        return self._last_forward

    @property
    def next_forward(self) -> int:
        """The forward id a drain without ``forward=`` takes: ``last_forward + 1``, 0 for the
        first drain (SPEC D.13)."""
        return 0 if self._last_forward is None else self._last_forward + 1

    def take_checkpoint_ops(
        self, *, forward: int | None = None
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        """The drain of a non-empty batch, before forward ``forward`` (``next_forward`` when
        not given): begin the pending boundary stores, take the queued restores, then begin
        queued scratch stores within the per-batch budget (SPEC D.1 step 6, D.13). A
        boundary filed with a forward is stored only when that forward is the one drained
        last before this drain; a later one stays pending, an earlier one is dropped
        (counted). Returns ``(stores, restores)`` for this batch's copy launch.

        Raises:
            InvalidArgumentError: ``forward`` is not an int >= 0 greater than
                ``last_forward``, or a pending sequence's ``state_slot`` is not an int;
                nothing changed.
        """
        fwd = need_forward("forward", forward)
        prev = self._last_forward
        if fwd is not None and prev is not None and fwd <= prev:
            raise InvalidArgumentError(
                f"forward {fwd} must be greater than the latest drain's forward {prev} (D.13)"
            )
        for seq, _h in self._pending.values():
            sequence_slot(seq)  # every slot is read before anything changes (G8)
        self._last_forward = fwd if fwd is not None else self.next_forward
        pending, self._pending = self._pending, {}
        forwards, self._pending_forward = self._pending_forward, {}
        for key, (seq, h) in pending.items():
            f = forwards.get(key)
            if f is not None and (prev is None or f > prev):
                self._pending[key] = (seq, h)  # its forward has not run yet
                self._pending_forward[key] = f
                continue
            if f is not None and prev is not None and f < prev:
                self.checkpoints_dropped += 1  # its slot went to a later forward
                continue
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
        self._restore_owners = []  # every queued restore was taken
        if self._scratch_queued:
            self._take_scratch_stores(
                self._max_ops_per_batch - len(self._store_ops) - len(restores), prev
            )
        stores, self._store_ops = self._store_ops, []
        return tuple(stores), restores

    def complete_previous_batch(self, completion: CompletionToken | None = None) -> None:
        """Top of a pass: the last drain's batch was issued. Publish its stores (unsettled
        until ``completion`` reports done, settled at once without one, D.13), release its
        restore pins and return its scratch slots (SPEC D.1 step 1).

        Raises:
            InvalidArgumentError: ``completion`` is neither None nor a token.
            Whatever a token's ``query()`` raises; nothing changed.
        """
        need_completion(completion)
        self.store.complete_inflight(completion)
        issued, self._scratch_issued = self._scratch_issued, []
        for slot in issued:
            self._step(T.SCRATCH, T.ISSUED, "complete", to=T.FREE)
            assert self._scratch is not None
            self._scratch.release(slot)

    def settle_completions(self, wait: bool = False) -> int:
        """See :meth:`PageUnitCheckpointStore.settle_completions` (SPEC B.3 row 24, D.13)."""
        return self.store.settle_completions(wait)

    def outstanding(self) -> dict[str, int]:
        """What the store and the coordinator still hold, in O(1) (SPEC D.13, G17): the
        store's counts plus pending boundaries, transfer reservations and scratch slots
        reserved, queued and issued."""
        out = self.store.outstanding()
        out.update(
            pending_boundaries=len(self._pending),
            transfers=len(self._transfer_units),
            scratch_reserved=len(self._scratch_reserved),
            scratch_queued=len(self._scratch_queued),
            scratch_issued=len(self._scratch_issued),
        )
        return out

    def is_idle(self) -> bool:
        """Whether nothing but completion tokens is outstanding (SPEC D.13, G17): an image
        waiting for its token is not work the engine owes."""
        return all(n == 0 for k, n in self.outstanding().items() if k != "completions")

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
        """See :meth:`PageUnitCheckpointStore.suspend_queued_restore`. A restore remembered
        for a sequence is forgotten (G15): resumed, it is nobody's."""
        lease = self.store.suspend_queued_restore(dst_slot)
        if lease is not None:
            self._restore_owners = self._valid_owners()
        return lease

    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """See :meth:`PageUnitCheckpointStore.resume_suspended_restore`.

        Raises:
            SlotBusyError: first, the lease's slot is lent as midstep scratch (G12),
                nothing changed; then as the store's.
        """
        if isinstance(restore, SuspendedCheckpointRestore):
            slot = getattr(restore.op, "dst_slot", None)
            if isinstance(slot, int) and self._scratch_held(slot):
                raise SlotBusyError(
                    f"slot {slot} is lent as midstep scratch; a slot is one buffer whoever"
                    " lends it (G12)"
                )
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
        together; ``sink=False`` for a load-only role.

        Raises:
            InvalidArgumentError: ``index`` is neither None nor an offload index (it must
                have ``could_serve(prefix_hash)``), or ``sink`` is not a bool; nothing
                changed.
        """
        need_offload_index("index", index)
        if type(sink) is not bool:
            raise InvalidArgumentError(f"sink must be a bool, got {sink!r}")
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

    def unindex(self, h: int) -> None:
        """The KV prefix ``h`` was evicted: drop every pending boundary and queued scratch
        store of ``h`` (G5) and unindex its checkpoint; counts one orphan if anything went."""
        _need_int("h", h)
        stale = [k for k, (_, ph) in self._pending.items() if ph == h]
        for k in stale:
            del self._pending[k]
            self._pending_forward.pop(k, None)
        scratch = self._orphan_scratch(lambda qh: qh == h)
        removed = self.store.unindex(h)
        if stale or scratch or removed:
            self.checkpoints_orphaned += 1

    def clear_index(self) -> None:
        """Admin reset: drop pending boundaries and queued scratch stores (their slots return,
        one orphan counted if any, G5) and clear the store. Transfers and leases survive."""
        self._pending.clear()
        self._pending_forward.clear()
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
            last_forward=self._last_forward,
            boundary_forwards=tuple(
                (k[0], self._pending_forward[k])
                for k in self._pending
                if k in self._pending_forward
            ),
            scratch_forwards=tuple(
                (slot, self._scratch_forward[slot])
                for _h, slot in self._scratch_queued
                if slot in self._scratch_forward
            ),
            restore_owners=tuple((id(seq), slot) for seq, slot, _e in self._valid_owners()),
        )


if TYPE_CHECKING:
    from pagedstate.spec.protocols import CoordinatorProtocol

    def _is_a_coordinator(c: PagedStateCheckpointCoordinator) -> CoordinatorProtocol:
        """mypy checks that the reference coordinator (with its store and pool) has the
        whole surface :class:`CoordinatorProtocol` promises engines."""
        return c
