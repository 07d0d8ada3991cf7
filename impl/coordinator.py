"""Production coordinator: pending boundaries, the per-pass drain, completions, restores,
transfers, midstep scratch and fates (SPEC D with G1, G5 and G12-G17; forward ids and
completion tokens, D.13), over indexes.

Same public calls, arguments, return values, errors and :class:`Snapshot` as the reference
model's coordinator. Scratch slots and transfer reservations move only through the
``scratch`` and ``transfer`` tables of :mod:`pagedstate.spec.tables`.

Indexes instead of walks:

- pending boundaries in filing order, plus the one pending key per sequence (G1 / C20:
  at most one survives per sequence) and the sequences pending per hash, so ``checkpoint``,
  ``forget_pending`` and ``unindex`` touch only the entries they remove;
- queued scratch stores in queue order keyed by slot, plus the slots queued per hash, so
  ``reserve_midstep``'s "already queued" test and ``unindex``'s orphaning (G5) are O(1)
  per entry; a drain leaves the over-budget remainder in place instead of copying it, and
  passes a store waiting for its forward (D.13) in place at O(1) each;
- the forward ids of pending boundaries and queued scratch stores filed with one (D.13),
  by key and by slot;
- the issued scratch slots as an ordered set and the reserved ones by slot, so the G12
  test "is this slot lent as scratch" is O(1);
- the restores begun for a sequence (G15), by sequence in the order begun plus the latest
  owner per slot, so ``begin_restore(..., seq=)`` and ``forget_pending`` are O(1);
- ``outstanding()`` and ``is_idle()`` are counts of these structures, O(1) (G17).

Transition hook subjects (see :mod:`pagedstate.impl.store`): the scratch slot for
``scratch`` (for the over-budget self-loop, recorded once per drain, the first slot left
queued); the owner for ``transfer``.

Modules: this one holds the class with its constructor, admission, transfers, the calls
passed to the store, the index changes, fates, ``outstanding``, ``self_check`` and the
snapshot; its mixins hold the midstep scratch (:mod:`._coordinator_scratch`), the pending
boundaries with the drain and completion (:mod:`._coordinator_drain`) and the restores with
their owners and leases (:mod:`._coordinator_restores`); their typed base is in
:mod:`._coordinator_base`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from pagedstate.spec import tables as T
from pagedstate.spec.errors import EvictionCallbackError, InvalidArgumentError
from pagedstate.spec.protocols import need_coordinator_args, need_offload_index
from pagedstate.spec.sequences import need_sequence
from pagedstate.spec.snapshot import Snapshot
from pagedstate.spec.types import (
    TRANSFER_OWNER,
    CheckpointStoreOp,
    PagedStateCheckpointSpec,
    ScratchSlotPool,
    SequenceLike,
    StateStoreOperationId,
)

from ._args import is_int, need_hashable, need_int
from ._coordinator_base import _PendingKey, _RestoreOwner
from ._coordinator_drain import _Drain
from ._coordinator_restores import _Restores
from ._coordinator_scratch import _Scratch
from .pool import UnitPool
from .store import (
    DEFAULT_CHANGE_LOG_SIZE,
    DEFAULT_FORFEIT_BOUND,
    DEFAULT_OFFLOAD_BACKLOG_CAP,
    PageUnitCheckpointStore,
    RowSink,
    TransitionHook,
    _as_store,
    _deferring,
)

__all__ = ["PagedStateCheckpointCoordinator"]


def _need_transfer_owner(owner: Hashable) -> None:
    if owner is None:
        raise InvalidArgumentError("a transfer reservation needs an owner, got None")
    need_hashable("owner", owner)


def _free_slots(scratch: object) -> frozenset[int] | None:
    free = getattr(scratch, "free_slots", None)
    return None if free is None else frozenset(free)


def _by_hash(pairs: Iterable[tuple[int, int]]) -> dict[int, dict[int, None]]:
    """``(key, h)`` pairs grouped as ``{h: {key: None}}``, in order (the shape of the
    coordinator's per-hash indexes)."""
    out: dict[int, dict[int, None]] = {}
    for key, h in pairs:
        out.setdefault(h, {})[key] = None
    return out


class PagedStateCheckpointCoordinator(_Scratch, _Drain, _Restores):
    """Production coordinator (SPEC D).

    Args:
        pool: the unit pool (shared with the engine's KV side; see :mod:`pagedstate.impl.pool`).
        spec: image geometry.
        enabled: prefix caching on and the model has per-request state.
        offload: the CPU tier's index (anything with ``could_serve(h)``), or None; also
            switches the store's offload sink on.
        readable_midstep: the backend exposes interior states (midstep scratch stores).
        clock, offload_backlog_cap, forfeit_bound, change_log_size: passed to the store.

    Raises:
        InvalidArgumentError: as :class:`PageUnitCheckpointStore`.

    Every call is O(1) amortized (plus O(log n) where the store's LRU heap is involved),
    except where noted: the drain and completion cost what they hand out, release or skip
    (and a completion or settle the outstanding completion tokens), ``clear_index`` is
    O(records + queued scratch), ``resumable_hit`` O(hit).
    """

    successor_room = 0.0
    #: The store class the coordinator builds.
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
        # Queued scratch stores: slot -> hash, in queue order; and the slots per hash.
        self._scratch_queued: OrderedDict[int, int] = OrderedDict()
        self._scratch_by_hash: dict[int, dict[int, None]] = {}
        # Issued scratch slots (an ordered set), until the next completion.
        self._scratch_issued: dict[int, None] = {}
        # Forward ids of queued scratch stores published with one (SPEC D.13): slot -> F.
        self._scratch_forwards: dict[int, int] = {}
        # Pending boundaries: (id(seq), h) -> (seq, h) in filing order; the key per
        # sequence; the sequence ids per hash.
        self._pending: dict[_PendingKey, tuple[SequenceLike, int]] = {}
        self._pending_of_seq: dict[int, _PendingKey] = {}
        self._pending_by_hash: dict[int, dict[int, None]] = {}
        # Forward ids of pending boundaries filed with one (SPEC D.13): key -> F.
        self._boundary_forwards: dict[_PendingKey, int] = {}
        # The forward id of the latest drain (SPEC D.13), None before the first.
        self._last_forward: int | None = None
        # Restores begun for a sequence (G15): id(seq) -> (slot, queued entry, seq), in the
        # order begun, and the latest owner per slot (see :mod:`._coordinator_restores`).
        self._restore_owners: dict[int, _RestoreOwner] = {}
        self._restore_owner_of_slot: dict[int, int] = {}
        self._store_ops: list[CheckpointStoreOp] = []
        # A store attempt of the drain is under way (its outcome not yet counted).
        self._attempt = False
        # The drain or completion running now (re-entrancy guard), else None.
        self._busy: str | None = None
        self._transfer_units: dict[Hashable, tuple[int, ...]] = {}
        self.checkpoints_kept = 0
        self.checkpoints_dropped = 0
        self.checkpoints_orphaned = 0

    @property
    def row_sink(self) -> RowSink | None:
        """The store's row sink (coordinator rows are recorded there too)."""
        return self.store.row_sink

    @row_sink.setter
    def row_sink(self, sink: RowSink | None) -> None:
        self.store.row_sink = sink

    @property
    def on_transition(self) -> TransitionHook | None:
        """The store's transition hook (coordinator rows are reported there too)."""
        return self.store.on_transition

    @on_transition.setter
    def on_transition(self, hook: TransitionHook | None) -> None:
        self.store.on_transition = hook

    def clone(self) -> PagedStateCheckpointCoordinator:
        """A deep copy (the scratch pool must offer ``clone()``; the offload index, clock,
        row sink, hook and completion tokens are shared; restore owners keep naming the
        same queued restores, whose entries the store's copy shares). O(state)."""
        c = type(self).__new__(type(self))
        c.__dict__.update(self.__dict__)
        c.store = self.store.clone()
        if self._scratch is not None:
            c._scratch = self._scratch.clone()  # type: ignore[attr-defined]
        c._scratch_reserved = dict(self._scratch_reserved)
        c._scratch_queued = OrderedDict(self._scratch_queued)
        c._scratch_by_hash = {h: dict(s) for h, s in self._scratch_by_hash.items()}
        c._scratch_issued = dict(self._scratch_issued)
        c._scratch_forwards = dict(self._scratch_forwards)
        c._pending = dict(self._pending)
        c._pending_of_seq = dict(self._pending_of_seq)
        c._pending_by_hash = {h: dict(s) for h, s in self._pending_by_hash.items()}
        c._boundary_forwards = dict(self._boundary_forwards)
        c._restore_owners = dict(self._restore_owners)  # entries are immutable tuples
        c._restore_owner_of_slot = dict(self._restore_owner_of_slot)
        c._store_ops = list(self._store_ops)
        c._transfer_units = dict(self._transfer_units)
        return c

    @property
    def pool(self) -> UnitPool:
        """The store's unit pool."""
        return self.store.pool

    def applies(self, seq: SequenceLike) -> bool:
        """Whether checkpoints apply to ``seq`` at all. O(1).

        Raises:
            InvalidArgumentError: ``seq`` is not a sequence (an int ``state_slot`` and a
                ``has_per_req_cache``), as for every call taking one.
        """
        need_sequence(seq)
        return self.enabled and bool(seq.has_per_req_cache)

    def _took(self, table: T.Table, row: T.Row, subject: object) -> None:
        self.store._took(table, row, subject)

    # -- admission ------------------------------------------------------------------------

    def resumable_hit(
        self,
        seq: SequenceLike,
        hit: int,
        block_hashes: list[int] | tuple[int, ...],
        assume_checkpointed: bool = False,
    ) -> int:
        """Longest prefix (in blocks, ``<= hit``) whose boundary state can be produced, in HBM
        or (optimistically) from the CPU tier; 0 when none (SPEC D.1 step 2). O(hit): one
        lookup per block scanned, newest first. A sequence without per-request state gets
        ``hit``; a disabled coordinator returns 0 for one with it, since nothing could
        restore its slot (G14).

        Raises:
            InvalidArgumentError: ``hit`` negative or beyond ``len(block_hashes)``;
                ``block_hashes`` not a list or tuple, or one of its first ``hit`` entries
                not an int; ``seq`` not a sequence.
        """
        if type(hit) is not int or hit < 0:
            need_int("hit", hit, 0)
        if not isinstance(block_hashes, (list, tuple)):
            raise InvalidArgumentError(
                "block_hashes must be a list or tuple of ints, got"
                f" {type(block_hashes).__qualname__}"
            )
        if hit > len(block_hashes):
            raise InvalidArgumentError(f"hit {hit} exceeds the {len(block_hashes)} block hashes")
        for h in block_hashes[:hit]:
            if type(h) is not int and not is_int(h):
                raise InvalidArgumentError(f"a block hash must be an int, got {h!r}")
        need_sequence(seq)
        if not seq.has_per_req_cache:
            return hit
        if not self.enabled:
            return 0  # G14: fails closed
        for i in range(hit - 1, -1, -1):
            if assume_checkpointed or self._reachable(block_hashes[i]):
                return i + 1
        return 0

    def _reachable(self, h: int) -> bool:
        if self.store.contains(h):
            return True
        return self.offload is not None and bool(self.offload.could_serve(h))

    def has_available_units(self, count: int, protected_hash: int | None = None) -> bool:
        """See :meth:`PageUnitCheckpointStore.has_available_units`. O(1)."""
        return self.store.has_available_units(count, protected_hash)

    def ensure_free_units(self, count: int) -> bool:
        """See :meth:`PageUnitCheckpointStore.ensure_free_units`."""
        return self.store.ensure_free_units(count)

    # -- transfers (SPEC D.1 step 12) -----------------------------------------------------

    def reserve_transfer_units(self, owner: Hashable) -> tuple[int, ...] | None:
        """Reserve one image's units for an external load, tagged ``("state-transfer",
        owner)``. ``owner`` must include a generation. ``None`` for a duplicate active owner
        or when no room can be made (evicting only unpinned READY records). O(1 + units +
        evictions).

        The reservation may overwrite cached KV blocks: the pool calls the engine's
        ``on_evict`` once the reservation is filed (SPEC A.4). If a callback raises, the
        reservation is undone (its units back where they were, cached blocks under their
        hashes, nothing filed, no row taken) and :class:`EvictionCallbackError` is raised
        from the callback's exception (G8). (A cached block is reused only when no vacant
        unit is left, and then ``ensure_free_units`` evicted nothing, so nothing else moved.)
        What the engine's callbacks did before raising is theirs.

        Raises:
            InvalidArgumentError: ``owner`` is None or unhashable.
            EvictionCallbackError: ``on_evict`` raised; nothing changed (see above).
        """
        _need_transfer_owner(owner)
        if owner in self._transfer_units:
            return None
        store = self.store
        u = store.units_per_checkpoint
        if not store.ensure_free_units(u):
            return None
        row = T.TRANSFER.step(T.T_NONE, "reserve")
        pool = self.pool
        tag = (TRANSFER_OWNER, owner)
        held: tuple[int, ...] = ()
        try:
            with _deferring(pool, undo_on_error=True):
                with _as_store(pool):
                    units = pool.reserve_units(u, tag)
                if units is None:
                    return None
                held = tuple(units)
                self._transfer_units[owner] = held
        except EvictionCallbackError:
            # The pool undid the reservation unless a callback itself took it over (then
            # the entry went with it, or stays with the units it still names).
            if held and self._transfer_units.get(owner) == held and pool.owner_of(held[0]) != (
                tag,
                0,
            ):
                del self._transfer_units[owner]
            raise
        self._took(T.TRANSFER, row, owner)
        return held

    def release_transfer_units(self, owner: Hashable) -> None:
        """Release a reservation, once; unknown owners (another generation) are ignored.
        O(units).

        Raises:
            InvalidArgumentError: ``owner`` is None or unhashable.
        """
        _need_transfer_owner(owner)
        units = self._transfer_units.get(owner)
        if units is None:
            return
        row = T.TRANSFER.step(T.RESERVED, "release")
        with _as_store(self.pool):
            self.pool.release_units(units, (TRANSFER_OWNER, owner))
        del self._transfer_units[owner]
        self._took(T.TRANSFER, row, owner)

    def adopt_transfer_units(self, owner: Hashable, prefix_hash: int) -> bool:
        """Publish a completed external image as ``prefix_hash``'s READY record, with no free
        window; False (units released) if the hash is READY or pending, or the owner has no
        reservation. The reservation is dropped only after adoption returned. O(units).

        Raises:
            InvalidArgumentError: ``prefix_hash`` is not an int; ``owner`` is None or
                unhashable.
        """
        if type(prefix_hash) is not int:
            need_int("prefix_hash", prefix_hash)
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
        row = T.TRANSFER.step(T.RESERVED, "adopt", "fresh" if adopted else "duplicate")
        del self._transfer_units[owner]
        self._took(T.TRANSFER, row, owner)
        return adopted

    def contains(self, h: int) -> bool:
        """Whether HBM holds a READY image of ``h`` now. O(1)."""
        return self.store.contains(h)

    # -- offload --------------------------------------------------------------------------

    def attach_offload(self, index: Any, *, sink: bool = True) -> None:
        """Wire the CPU tier in: the vote (``resumable_hit``) and the sink (nominations)
        together; ``sink=False`` for a load-only role. O(1) (O(backlog) to drop it).

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
        store of ``h`` (G5) and unindex its checkpoint; counts one orphan if anything went.
        Safe to call re-entrantly from the pool's ``on_evict`` (SPEC A.4). O(entries
        removed) (+ log n for the store's LRU heap).

        Raises:
            InvalidArgumentError: ``h`` is not an int.
        """
        if type(h) is not int:
            need_int("h", h)
        store = self.store
        if (
            h not in self._pending_by_hash
            and h not in self._scratch_by_hash
            and h not in store.hash_to_checkpoint
            and h not in store._pending_by_hash
        ):
            # Most evicted prefixes have nothing here: no pending boundary, no queued
            # scratch store, no record (the store's unindex would find none and return
            # False), so nothing is dropped or counted.
            return
        seqs = self._pending_by_hash.pop(h, None)
        if seqs:
            forwards = self._boundary_forwards
            for sid in seqs:
                del self._pending[(sid, h)]
                del self._pending_of_seq[sid]
                if forwards:
                    forwards.pop((sid, h), None)
        scratch = 0
        slots = self._scratch_by_hash.pop(h, None)
        if slots:
            row = T.SCRATCH.step(T.S_QUEUED, "orphan")
            pool = self._scratch
            assert pool is not None
            for slot in slots:
                del self._scratch_queued[slot]
                self._scratch_forwards.pop(slot, None)
                pool.release(slot)
                scratch += 1
                self._took(T.SCRATCH, row, slot)
        removed = store.unindex(h)
        if seqs or scratch or removed:
            self.checkpoints_orphaned += 1

    def clear_index(self) -> None:
        """Admin reset: drop pending boundaries and queued scratch stores (their slots return,
        one orphan counted if any, G5) and clear the store. Transfers and leases survive.
        O(records + pending + queued scratch)."""
        self._pending.clear()
        self._pending_of_seq.clear()
        self._pending_by_hash.clear()
        self._boundary_forwards.clear()
        queued = self._scratch_queued
        if queued:
            row = T.SCRATCH.step(T.S_QUEUED, "orphan")
            pool = self._scratch
            assert pool is not None
            self._scratch_queued = OrderedDict()
            self._scratch_by_hash = {}
            self._scratch_forwards = {}
            for slot in queued:
                pool.release(slot)
                self._took(T.SCRATCH, row, slot)
            self.checkpoints_orphaned += 1
        self.store.clear()

    def checkpoint_fates(self) -> dict[str, int]:
        """What became of the checkpoints (SPEC D.1 step 13). O(1) (+ the tier's stats)."""
        store = self.store
        fates = {
            "checkpoints_kept": self.checkpoints_kept,
            "checkpoints_dropped": self.checkpoints_dropped,
            "checkpoints_evicted": store.evictions,
            "offload_pins_reclaimed": store.offload_pins_reclaimed,
            "checkpoints_orphaned": self.checkpoints_orphaned,
        }
        stats = getattr(self.offload, "stats", None) if self.offload is not None else None
        if callable(stats):
            fates.update((f"state_offload_{k}", v) for k, v in stats().items())
        fates["state_offload_store_backlog"] = len(store._offload_ready)
        fates["state_offload_nominations_dropped"] = store.offload_nominations_dropped
        return fates

    def self_check(self) -> list[str]:
        """Problems with the coordinator's own indexes and the store's (and its pool's), as
        sentences (empty: none): the pending boundaries' per-sequence and per-hash indexes
        match the boundaries, the queued scratch stores' per-hash index matches the queue,
        the forward ids name pending boundaries and queued scratch stores, the last forward
        is an int >= 0 or None (D.13), the restore owners' per-slot index names the valid
        owner of each slot (G15), no issued scratch slot is also queued or reserved, and no
        drain or completion is running between calls. For tests and the conformance
        kit, which calls a ``self_check`` of the store under test after every step. Never
        raises. O(state + num_units)."""
        out: list[str] = []
        of_seq = {key[0]: key for key in self._pending}
        if self._pending_of_seq != of_seq:
            out.append("the pending key per sequence does not match the pending boundaries")
        if self._pending_by_hash != _by_hash((sid, h) for sid, h in self._pending):
            out.append("the pending sequences per hash do not match the pending boundaries")
        if self._scratch_by_hash != _by_hash(self._scratch_queued.items()):
            out.append("the queued scratch slots per hash do not match the queue")
        out += self._check_overlap()
        if self._busy is not None or self._store_ops or self._attempt:
            out.append("a drain or completion is still open between calls")
        return out + self.store.self_check()

    def snapshot(self) -> Snapshot:
        """The store's snapshot plus the coordinator's structures. O(state)."""
        return self.store.snapshot(
            pending_boundaries=tuple((k[0], h) for k, (_, h) in self._pending.items()),
            transfers=dict(self._transfer_units),
            scratch_reserved=frozenset(self._scratch_reserved),
            scratch_queued=tuple((h, slot) for slot, h in self._scratch_queued.items()),
            scratch_issued=tuple(self._scratch_issued),
            checkpoints_kept=self.checkpoints_kept,
            checkpoints_dropped=self.checkpoints_dropped,
            checkpoints_orphaned=self.checkpoints_orphaned,
            scratch_free=_free_slots(self._scratch),
            last_forward=self._last_forward,
            boundary_forwards=self._boundary_forward_pairs(),
            scratch_forwards=self._scratch_forward_pairs(),
            restore_owners=self._restore_owner_pairs(),
        )

    def _boundary_forward_pairs(self) -> tuple[tuple[int, int], ...]:
        forwards = self._boundary_forwards
        if not forwards:
            return ()
        return tuple((key[0], forwards[key]) for key in self._pending if key in forwards)

    def _scratch_forward_pairs(self) -> tuple[tuple[int, int], ...]:
        forwards = self._scratch_forwards
        if not forwards:
            return ()
        return tuple((slot, forwards[slot]) for slot in self._scratch_queued if slot in forwards)

    def _check_overlap(self) -> list[str]:
        """``self_check``'s part for the overlap indexes (SPEC D.13, G12, G15)."""
        out: list[str] = []
        if not self._boundary_forwards.keys() <= self._pending.keys():
            out.append("a boundary forward names no pending boundary")
        if not self._scratch_forwards.keys() <= self._scratch_queued.keys():
            out.append("a scratch forward names no queued scratch store")
        last = self._last_forward
        if last is not None and not (is_int(last) and last >= 0):
            out.append(f"the last forward is {last!r}, not an int >= 0")
        owners, of_slot = self._restore_owners, self._restore_owner_of_slot
        for slot, sid in of_slot.items():
            owner = owners.get(sid)
            if owner is None or owner[0] != slot:
                out.append(f"the restore owner of slot {slot} is not a remembered restore")
        for sid, owner in owners.items():
            if sid != id(owner[2]):
                out.append(f"a restore owner is filed under {sid}, not its sequence's id")
            if self._owner_valid(owner) and of_slot.get(owner[0]) != sid:
                out.append(f"the valid restore owner of slot {owner[0]} is not indexed")
        issued = self._scratch_issued.keys()
        if issued & self._scratch_queued.keys() or issued & self._scratch_reserved.keys():
            out.append("a scratch slot is issued and queued or reserved")
        return out

    # -- overlapped scheduling (SPEC D.13, G17) -------------------------------------------

    @property
    def last_forward(self) -> int | None:
        """The forward id of the latest drain (None before the first), SPEC D.13. O(1)."""
        return self._last_forward

    @property
    def next_forward(self) -> int:
        """The forward id a drain without ``forward=`` takes: ``last_forward + 1``, or 0
        before the first drain (SPEC D.13). O(1)."""
        last = self._last_forward
        return 0 if last is None else last + 1

    def settle_completions(self, wait: bool = False) -> int:
        """See :meth:`PageUnitCheckpointStore.settle_completions` (SPEC B.3 row 24)."""
        return self.store.settle_completions(wait)

    def outstanding(self) -> dict[str, int]:
        """What the store and coordinator still hold (SPEC D.13, G17), in O(1) without a
        snapshot: the store's counts (:meth:`PageUnitCheckpointStore.outstanding`) plus
        pending boundaries, transfer reservations and scratch slots reserved, queued and
        issued. Counts, each an int >= 0."""
        out = self.store.outstanding()
        out["pending_boundaries"] = len(self._pending)
        out["transfers"] = len(self._transfer_units)
        out["scratch_reserved"] = len(self._scratch_reserved)
        out["scratch_queued"] = len(self._scratch_queued)
        out["scratch_issued"] = len(self._scratch_issued)
        return out

    def is_idle(self) -> bool:
        """True when nothing is outstanding but completions (SPEC D.13, G17): an image
        waiting for its completion token is not work the engine owes. O(1)."""
        return not any(n for k, n in self.outstanding().items() if k != "completions")


if TYPE_CHECKING:
    from pagedstate.spec.protocols import CoordinatorProtocol

    def _is_a_coordinator(c: PagedStateCheckpointCoordinator) -> CoordinatorProtocol:
        """mypy checks that the production coordinator (with its store and pool) has the
        whole surface :class:`CoordinatorProtocol` promises engines."""
        return c
