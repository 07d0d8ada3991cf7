"""The reference model: SPEC sections A, B and D read literally over plain dicts, lists and sets.

This is the oracle every other check compares against. It is written to be obvious, not
fast: lookups walk lists, and every phase change is a row of :mod:`pagedstate.spec.tables`
found by ``Table.step``. Where SPEC section G differs from ATOM's module, this model follows
section G.

Public names and signatures are ATOM's (``atom/model_engine/page_unit_checkpoint.py``), so
tests written against this model run unchanged against :mod:`pagedstate.impl`.

Every public call validates its arguments first and, on bad input, raises a specific
:class:`~pagedstate.spec.errors.PagedStateError` with nothing changed.

Guards and arithmetic use the spec's *reference formulations*, never the helpers the
production store calls: a record's guard is read off the table (``guard_by_table``), an LRU
victim is a record the table has an ``evict`` row for (``evictable_by_table``),
``has_available_units`` walks the LRU (``units_available_by_walk``), ``changed_since``
looks every generation up (``changed_since_by_scan``) and ``was_reclaimed`` reads G7 case
by case (``reclaimed_by_cases``). ``make contracts`` compares each with its production
counterpart under ``crosshair diffbehavior`` (:mod:`pagedstate.spec.guards`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from pagedstate.spec import tables as T
from pagedstate.spec.changelog import changed_since_by_scan
from pagedstate.spec.errors import (
    AmbiguousSuspendError,
    DuplicateUnitError,
    IllegalTransitionError,
    InvalidArgumentError,
    LeaseReusedError,
    PartialReleaseError,
    PinUnderflowError,
    SlotBusyError,
    SourcePinLostError,
    StaleReservationError,
    StoreOwnedUnitsError,
    UnknownOperationError,
    WrongOwnerError,
    need_hashable,
    need_timeout,
    read_clock,
)
from pagedstate.spec.guards import (
    UNDERFLOW_MESSAGE,
    evictable_by_table,
    guard_by_table,
    reclaimed_by_cases,
    units_available_by_walk,
)
from pagedstate.spec.protocols import need_coordinator_args, need_pool, need_scratch_pool
from pagedstate.spec.sequences import need_sequence, sequence_slot
from pagedstate.spec.snapshot import OffloadPinView, RecordView, Snapshot
from pagedstate.spec.tables import Row, Table
from pagedstate.spec.types import (
    CHECKPOINT_OWNER,
    TRANSFER_OWNER,
    CheckpointRestoreOp,
    CheckpointStoreOp,
    PagedStateCheckpointSpec,
    ScratchSlotPool,
    SequenceLike,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)

__all__ = [
    "UnitPool",
    "SlotPool",
    "PageUnitCheckpointStore",
    "PagedStateCheckpointCoordinator",
    "RowSink",
    "DEFAULT_OFFLOAD_BACKLOG_CAP",
    "DEFAULT_FORFEIT_BOUND",
    "DEFAULT_CHANGE_LOG_SIZE",
]

#: SPEC B.1: nominations are capped at 8192; overflow drops the oldest.
DEFAULT_OFFLOAD_BACKLOG_CAP = 8192
#: SPEC B.1 / G7: reclaimed operations remembered exactly, beyond which a watermark answers.
DEFAULT_FORFEIT_BOUND = 4096
#: SPEC B.1: the change log keeps the last 4096 bumps.
DEFAULT_CHANGE_LOG_SIZE = 4096

#: Where row hits are recorded: a set of ``(machine, row index)``.
RowSink = set[tuple[str, int]]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need_int(name: str, value: object, minimum: int | None = None) -> None:
    if not _is_int(value):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    assert isinstance(value, int)
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")


def _is_checkpoint_owner(owner: Hashable) -> bool:
    return isinstance(owner, tuple) and len(owner) == 2 and owner[0] == CHECKPOINT_OWNER


def _free_slots(scratch: object) -> frozenset[int] | None:
    free = getattr(scratch, "free_slots", None)
    return None if free is None else frozenset(free)


def _need_transfer_owner(owner: Hashable) -> None:
    if owner is None:
        raise InvalidArgumentError("a transfer reservation needs an owner, got None")
    need_hashable("owner", owner)


def _is_dirtying(owner: Hashable) -> bool:
    return (
        isinstance(owner, tuple)
        and len(owner) == 2
        and owner[0]
        in (
            CHECKPOINT_OWNER,
            TRANSFER_OWNER,
        )
    )


def _owner_kind(owner: Hashable) -> str | None:
    """The store kind of an owner shaped as a store owner's tag, else None (an engine's)."""
    if isinstance(owner, tuple) and len(owner) == 2:
        if owner[0] == CHECKPOINT_OWNER:
            return CHECKPOINT_OWNER
        if owner[0] == TRANSFER_OWNER:
            return TRANSFER_OWNER
    return None


def _same_owner(held_by: Hashable, owner: Hashable) -> bool:
    """Whether a unit tagged by ``held_by`` is ``owner``'s (SPEC A.3, G9): the same object,
    or equal and of the same kind (equal store owners' tags are equal item by item: a
    checkpoint's by its id). An engine owner that only compares equal to a store owner's tag
    is another owner."""
    if held_by is not owner and not held_by == owner:
        return False
    return _owner_kind(held_by) == _owner_kind(owner)


class _Stepper:
    """Looks rows up and records which ones were taken."""

    row_sink: RowSink | None = None

    def _step(
        self,
        table: Table,
        phase: str,
        event: str,
        guard: str = T.NO_GUARD,
        *,
        to: str | None = None,
    ) -> Row:
        """The row for ``(phase, event, guard)``. ``to`` is the phase the model's structures
        put the subject in (an auxiliary machine's phase is where its entry lives: a queue, a
        list, a map); the table must agree, so its ``next`` column binds too.

        Raises:
            IllegalTransitionError: no such row, or the row's next phase is not ``to``.
        """
        row = table.step(phase, event, guard)
        if to is not None and row.next != to:
            raise IllegalTransitionError(
                table.machine,
                phase,
                event,
                guard,
                f"the model moves the {table.machine} to {to}, the table says {row.next}",
            )
        if self.row_sink is not None:
            self.row_sink.add((table.machine, table.row_id(row)))
        return row


# ---------------------------------------------------------------------------------------
# Unit pool (SPEC A.2, A.3, G9, G10)
# ---------------------------------------------------------------------------------------


class UnitPool:
    """Reference pool of ``num_units`` raw units, ids ``[0, num_units)``.

    A unit is free or tagged ``(owner, piece)``. ``reserve_units`` hands out the lowest free
    ids. Units released from a checkpoint or transfer owner are marked dirty until
    :meth:`mark_clean` (G10). Owners are hashable; the store owners ``("state-checkpoint",
    cid)`` and ``("state-transfer", owner)`` are accepted only from the store itself, which
    calls inside ``with pool._as_store():`` (SPEC A.3); anyone else naming one gets
    :class:`StoreOwnedUnitsError`. A unit is ``owner``'s when its tag's owner is the same
    owner (``_same_owner``): the same kind (an object only equal to a store owner's tag is
    an engine owner) and the same object or equal (a checkpoint's tag: the same id).
    """

    def __init__(self, num_units: int) -> None:
        _need_int("num_units", num_units, 0)
        self.num_units = num_units
        self._free: set[int] = set(range(num_units))
        self._tags: dict[int, tuple[Hashable, int]] = {}
        self._dirty: set[int] = set()
        self._store_calls = 0

    def clone(self) -> UnitPool:
        c = type(self).__new__(type(self))
        c.num_units = self.num_units
        c._free = set(self._free)
        c._tags = dict(self._tags)
        c._dirty = set(self._dirty)
        c._store_calls = self._store_calls
        return c

    def _as_store(self) -> _StoreAccess:
        """The store is calling: store owners are accepted inside the block."""
        return _StoreAccess(self)

    def _need_owner(self, name: str, owner: Hashable) -> None:
        need_hashable(name, owner)
        if not self._store_calls and _is_dirtying(owner):
            raise StoreOwnedUnitsError.for_owner(owner)

    def _held(self, owner: Hashable) -> int:
        """How many units are ``owner``'s (``_same_owner``, with the kind read once)."""
        kind = _owner_kind(owner)
        return sum(
            1
            for held_by, _piece in self._tags.values()
            if (held_by is owner or held_by == owner) and _owner_kind(held_by) == kind
        )

    def _need_unit(self, unit: int) -> None:
        _need_int("unit id", unit, 0)
        if unit >= self.num_units:
            raise InvalidArgumentError(f"unit {unit} is outside the pool of {self.num_units}")

    @property
    def num_free(self) -> int:
        """Free units."""
        return len(self._free)

    def has_free(self, n: int) -> bool:
        """Whether at least ``n`` units are free.

        Raises:
            InvalidArgumentError: ``n`` is not a non-negative int.
        """
        _need_int("n", n, 0)
        return len(self._free) >= n

    def owner_of(self, unit: int) -> tuple[Hashable, int] | None:
        """``(owner, piece)`` of a reserved unit, ``None`` for a free one.

        Raises:
            InvalidArgumentError: ``unit`` is not an int in ``[0, num_units)``.
        """
        self._need_unit(unit)
        return self._tags.get(unit)

    def is_dirty(self, unit: int) -> bool:
        """Whether ``unit`` last held checkpoint or transfer bytes and was not scrubbed (G10).

        Raises:
            InvalidArgumentError: ``unit`` is not an int in ``[0, num_units)``.
        """
        self._need_unit(unit)
        return unit in self._dirty

    def cached_units(self) -> tuple[tuple[int, int], ...]:
        """Cached KV units: none (the reference pool caches no KV)."""
        return ()

    def dirty_units(self) -> frozenset[int]:
        """Every dirty unit."""
        return frozenset(self._dirty)

    def mark_clean(self, unit_ids: Iterable[int]) -> None:
        """Record that the executor scrubbed these units (G10)."""
        try:
            ids = list(unit_ids)
        except TypeError as exc:
            raise InvalidArgumentError(
                f"unit_ids must be an iterable of unit ids, got {unit_ids!r}"
            ) from exc
        for u in ids:
            _need_int("unit id", u, 0)
            if u >= self.num_units:
                raise InvalidArgumentError(f"unit {u} is outside the pool of {self.num_units}")
        self._dirty.difference_update(ids)

    def reserve_units(self, count: int, owner: Hashable) -> list[int] | None:
        """Reserve ``count`` units tagged ``(owner, piece)`` in piece order; ``None`` (nothing
        changed) when fewer are free. ``count == 0`` returns ``[]``."""
        _need_int("count", count, 0)
        if owner is None:
            raise InvalidArgumentError("a reservation needs an owner, got None")
        self._need_owner("owner", owner)
        if self._held(owner):
            raise InvalidArgumentError(
                f"owner {owner!r} already holds units: one reservation per owner (G9)"
            )
        if len(self._free) < count:
            return None
        units = sorted(self._free)[:count]
        for piece, u in enumerate(units):
            self._free.discard(u)
            self._tags[u] = (owner, piece)
        return units

    def _validate_whole(self, unit_ids: Any, owner: Hashable) -> tuple[int, ...]:
        if not isinstance(unit_ids, (list, tuple)):
            raise InvalidArgumentError(
                f"unit_ids must be a list or tuple, got {type(unit_ids).__qualname__}"
            )
        ids = tuple(unit_ids)
        for u in ids:
            _need_int("unit id", u, 0)
        if len(set(ids)) != len(ids):
            raise DuplicateUnitError(f"unit ids repeat: {list(ids)}")
        if owner is None:
            raise InvalidArgumentError("owner must not be None")
        self._need_owner("owner", owner)
        for piece, u in enumerate(ids):
            tag = self._tags.get(u)
            if tag is None or not _same_owner(tag[0], owner) or tag[1] != piece:
                raise WrongOwnerError.for_unit(u, tag, owner, piece)
        held = self._held(owner)
        if held != len(ids):
            raise PartialReleaseError(
                f"owner {owner!r} holds {held} units but the call names {len(ids)}; name the"
                " whole reservation (SPEC G9)"
            )
        return ids

    def release_units(self, unit_ids: Any, owner: Hashable) -> None:
        """Release a whole reservation, every unit in piece order (G9).

        Raises:
            DuplicateUnitError, InvalidArgumentError: malformed ids or owner (None or
                unhashable).
            StoreOwnedUnitsError: ``owner`` is a store owner and the store is not calling.
            WrongOwnerError: a unit is not tagged ``(owner, position)``.
            PartialReleaseError: the owner holds more units than named.
        """
        ids = self._validate_whole(unit_ids, owner)
        dirty = _is_dirtying(owner)
        for u in ids:
            del self._tags[u]
            self._free.add(u)
            if dirty:
                self._dirty.add(u)

    def rekey_units(self, unit_ids: Any, old_owner: Hashable, new_owner: Hashable) -> None:
        """Retag a whole reservation from ``old_owner`` to ``new_owner`` atomically; the units
        never pass through the free list (SPEC A.2)."""
        if new_owner is None:
            raise InvalidArgumentError("new_owner must not be None")
        ids = self._validate_whole(unit_ids, old_owner)
        self._need_owner("new_owner", new_owner)
        if self._held(new_owner):
            raise InvalidArgumentError(f"owner {new_owner!r} already holds units")
        for piece, u in enumerate(ids):
            self._tags[u] = (new_owner, piece)

    def snapshot_parts(
        self,
    ) -> tuple[frozenset[int], frozenset[int], dict[int, tuple[Hashable, int]]]:
        return frozenset(self._free), frozenset(self._dirty), dict(self._tags)


class _StoreAccess:
    """``UnitPool._as_store()``: the store is calling; store owners are accepted."""

    def __init__(self, pool: UnitPool) -> None:
        self._pool = pool

    def __enter__(self) -> None:
        self._pool._store_calls += 1

    def __exit__(self, *exc: object) -> None:
        self._pool._store_calls -= 1


class SlotPool:
    """A reference state-slot pool for midstep scratch: hands out the lowest free slot."""

    def __init__(self, slots: Iterable[int]) -> None:
        self._all = frozenset(slots)
        self._free: set[int] = set(self._all)

    def clone(self) -> SlotPool:
        c = SlotPool.__new__(SlotPool)
        c._all = self._all
        c._free = set(self._free)
        return c

    def has_free(self) -> bool:
        return bool(self._free)

    def pop(self) -> int:
        if not self._free:
            raise InvalidArgumentError("no free scratch slot")
        s = min(self._free)
        self._free.discard(s)
        return s

    def release(self, slot: int) -> None:
        if slot not in self._all or slot in self._free:
            raise InvalidArgumentError(f"slot {slot} is not a borrowed scratch slot")
        self._free.add(slot)

    @property
    def free_slots(self) -> frozenset[int]:
        return frozenset(self._free)


# ---------------------------------------------------------------------------------------
# The store (SPEC B)
# ---------------------------------------------------------------------------------------


class _Record:
    __slots__ = ("prefix_hash", "unit_ids", "phase", "pin_count")

    def __init__(self, prefix_hash: int, unit_ids: tuple[int, ...], phase: str, pin_count: int = 0):
        self.prefix_hash = prefix_hash
        self.unit_ids = unit_ids
        self.phase = phase
        self.pin_count = pin_count

    def copy(self) -> _Record:
        return _Record(self.prefix_hash, self.unit_ids, self.phase, self.pin_count)


class _OffloadPin:
    __slots__ = ("checkpoint_id", "pinned_at", "source_released", "reclaimable")

    def __init__(self, cid: int, pinned_at: float, source_released: bool, reclaimable: bool):
        self.checkpoint_id = cid
        self.pinned_at = pinned_at
        self.source_released = source_released
        self.reclaimable = reclaimable

    def copy(self) -> _OffloadPin:
        return _OffloadPin(
            self.checkpoint_id, self.pinned_at, self.source_released, self.reclaimable
        )


class PageUnitCheckpointStore(_Stepper):
    """Reference checkpoint store (SPEC B.1-B.4 with section G).

    Args:
        pool: the unit pool checkpoints reserve from.
        spec: the image geometry; ``units_per_checkpoint`` units per record.
        offload_sink: nominate READY records for the CPU tier (SPEC B.3 row 20).
        clock: seconds, monotonic; used to stamp offload pins (default ``time.monotonic``).
        offload_backlog_cap, forfeit_bound, change_log_size: the bounds of SPEC B.1 / G7.
    """

    def __init__(
        self,
        pool: UnitPool,
        spec: PagedStateCheckpointSpec,
        offload_sink: bool = False,
        *,
        clock: Callable[[], float] | None = None,
        offload_backlog_cap: int = DEFAULT_OFFLOAD_BACKLOG_CAP,
        forfeit_bound: int = DEFAULT_FORFEIT_BOUND,
        change_log_size: int = DEFAULT_CHANGE_LOG_SIZE,
    ) -> None:
        if not isinstance(spec, PagedStateCheckpointSpec):
            raise InvalidArgumentError(f"spec must be a PagedStateCheckpointSpec, got {spec!r}")
        _need_int("offload_backlog_cap", offload_backlog_cap, 1)
        _need_int("forfeit_bound", forfeit_bound, 1)
        _need_int("change_log_size", change_log_size, 1)
        need_pool(pool)
        self.pool = pool
        self.spec = spec
        if clock is not None and not callable(clock):
            raise InvalidArgumentError(f"clock must be callable or None, got {clock!r}")
        self.clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self.records: dict[int, _Record] = {}
        self.hash_to_checkpoint: dict[int, int] = {}
        self._pending_by_hash: dict[int, int] = {}
        self._lru: list[int] = []
        self._inflight_stores: list[int] = []
        self._queued_restores: list[tuple[int, CheckpointRestoreOp]] = []
        self._inflight_restores: list[tuple[int, CheckpointRestoreOp]] = []
        self._suspended: dict[int, tuple[int, CheckpointRestoreOp]] = {}
        self._next_lease_id = 0
        self._next_checkpoint_id = 0
        # Set by the coordinator's adopt_transfer_units for its adopt_units call, and spent
        # by that call: only then may adopt_units name a transfer owner. (Not a depth held
        # for the call's duration: code the adoption runs, an owner's or an int subclass's
        # __hash__, could then adopt another reservation behind the coordinator's back.)
        self._transfer_grant = False
        self.evictions = 0
        self.generation = 0
        self._change_log_size = change_log_size
        self._changes: deque[tuple[int, int | None]] = deque()
        self._offload_sink = bool(offload_sink)
        self._offload_ready: deque[int] = deque()
        self._offload_backlog_cap = offload_backlog_cap
        self.offload_nominations_dropped = 0
        self._offload_pins: dict[StateStoreOperationId, _OffloadPin] = {}
        self._offload_generation = 0
        self.offload_pins_reclaimed = 0
        self._forfeited: dict[StateStoreOperationId, None] = {}
        self._forfeit_bound = forfeit_bound
        self._forfeit_watermark = 0

    # -- copying (for the explorer) -------------------------------------------------------

    def clone(self, pool: UnitPool | None = None) -> PageUnitCheckpointStore:
        """A deep copy sharing nothing mutable (the clock and row sink are shared)."""
        c = type(self).__new__(type(self))
        c.__dict__.update(self.__dict__)
        c.pool = pool if pool is not None else self.pool.clone()
        c.records = {k: r.copy() for k, r in self.records.items()}
        c.hash_to_checkpoint = dict(self.hash_to_checkpoint)
        c._pending_by_hash = dict(self._pending_by_hash)
        c._lru = list(self._lru)
        c._inflight_stores = list(self._inflight_stores)
        c._queued_restores = list(self._queued_restores)
        c._inflight_restores = list(self._inflight_restores)
        c._suspended = dict(self._suspended)
        c._changes = deque(self._changes)
        c._offload_ready = deque(self._offload_ready)
        c._offload_pins = {k: p.copy() for k, p in self._offload_pins.items()}
        c._forfeited = dict(self._forfeited)
        return c

    # -- reading --------------------------------------------------------------------------

    @property
    def units_per_checkpoint(self) -> int:
        """Units per image (SPEC A.1)."""
        return self.spec.units_per_checkpoint

    @property
    def offload_sink(self) -> bool:
        """Whether READY records are nominated for the CPU tier."""
        return self._offload_sink

    @offload_sink.setter
    def offload_sink(self, on: bool) -> None:
        self._offload_sink = bool(on)
        if not self._offload_sink:
            # C16: no sink, no nominations. Handed-out pins stay until their report.
            self._offload_ready.clear()

    @property
    def store_backlog(self) -> deque[int]:
        """Nominations waiting to be handed to the tier (a copy)."""
        return deque(self._offload_ready)

    def lookup(self, prefix_hash: int) -> int:
        """The READY record's checkpoint id for ``prefix_hash``, or -1.

        Raises:
            InvalidArgumentError: ``prefix_hash`` is not an int (for ``contains`` and
                ``contains_or_pending`` too).
        """
        _need_int("prefix_hash", prefix_hash)
        cid = self.hash_to_checkpoint.get(prefix_hash)
        if cid is None:
            return -1
        rec = self.records.get(cid)
        if rec is None or rec.phase != T.READY:
            return -1
        return cid

    def contains(self, prefix_hash: int) -> bool:
        """Whether a READY image of ``prefix_hash`` exists."""
        return self.lookup(prefix_hash) >= 0

    def contains_or_pending(self, prefix_hash: int) -> bool:
        """READY, or COPYING (a store is on its way)."""
        return self.lookup(prefix_hash) >= 0 or prefix_hash in self._pending_by_hash

    def _is_evictable(self, cid: int, protected: int = -1) -> bool:
        rec = self.records.get(cid)
        return rec is not None and evictable_by_table(rec.phase, rec.pin_count, cid == protected)

    def _next_victim(self, protected: int = -1) -> int:
        for cid in self._lru:
            if self._is_evictable(cid, protected):
                return cid
        return -1

    def has_available_units(self, count: int, protected_hash: int | None = None) -> bool:
        """Whether ``count`` units are free or could be freed by evicting unpinned READY
        records other than ``protected_hash``'s (SPEC B.3 row 22). Pure."""
        _need_int("count", count, 0)
        if protected_hash is not None:
            _need_int("protected_hash", protected_hash)
        protected = self.lookup(protected_hash) if protected_hash is not None else -1
        images = (self._is_evictable(cid, protected) for cid in self._lru)
        upc = self.units_per_checkpoint
        return units_available_by_walk(count, self.pool.num_free, images, upc)

    def restore_queued_for(self, dst_slot: int) -> bool:
        """Whether a queued restore will write ``dst_slot`` on the next batch."""
        _need_int("dst_slot", dst_slot)
        return any(op.dst_slot == dst_slot for _, op in self._queued_restores)

    def changed_since(self, generation: int) -> set[int] | None:
        """Hashes whose READY state changed after ``generation``; ``None`` when unknown (the
        log does not reach back, or a clear happened). SPEC B.3 row 23, G6."""
        _need_int("generation", generation)
        return changed_since_by_scan(self.generation, tuple(self._changes), generation)

    def has_offload_pins(self) -> bool:
        """True from dispatch of an offload store or lease until its terminal report."""
        return bool(self._offload_pins)

    def _hash_in_flight(self, prefix_hash: int) -> bool:
        return any(op.prefix_hash == prefix_hash for op in self._offload_pins)

    def was_reclaimed(self, op: StateStoreOperationId) -> bool:
        """Whether ``op``'s source was taken back before it reported (G7: fails closed)."""
        self._need_op(op)
        return reclaimed_by_cases(
            op in self._forfeited,
            op.generation,
            self._forfeit_watermark,
            op in self._offload_pins,
        )

    # -- internal effects -----------------------------------------------------------------

    def _note_change(self, prefix_hash: int | None) -> None:
        self.generation += 1
        self._changes.append((self.generation, prefix_hash))
        while len(self._changes) > self._change_log_size:
            self._changes.popleft()

    def _apply(self, cid: int, rec: _Record, row: Row) -> None:
        """Apply a record row's effects: phase, pins, index, units."""
        h = rec.prefix_hash
        rec.phase = row.next
        rec.pin_count += row.pin_delta
        if row.index == "pending":
            self._pending_by_hash[h] = cid
        elif row.index == "unpending":
            if self._pending_by_hash.get(h) == cid:
                del self._pending_by_hash[h]
        elif row.index == "add":
            if self._pending_by_hash.get(h) == cid:
                del self._pending_by_hash[h]
            self.hash_to_checkpoint[h] = cid
            self._lru.append(cid)
            self._note_change(h)
        elif row.index == "remove":
            if self.hash_to_checkpoint.get(h) == cid:
                del self.hash_to_checkpoint[h]
            if cid in self._lru:
                self._lru.remove(cid)
            self._note_change(h)
        if row.units == "release":
            self._release_record(cid)

    def _release_record(self, cid: int) -> None:
        rec = self.records.pop(cid)
        if cid in self._lru:
            self._lru.remove(cid)
        if self.hash_to_checkpoint.get(rec.prefix_hash) == cid:
            del self.hash_to_checkpoint[rec.prefix_hash]
        if self._pending_by_hash.get(rec.prefix_hash) == cid:
            del self._pending_by_hash[rec.prefix_hash]
        with self.pool._as_store():
            self.pool.release_units(rec.unit_ids, (CHECKPOINT_OWNER, cid))

    def _guarded_step(self, rec: _Record, event: str) -> Row:
        """The record row ``event`` takes on ``rec``, its guard read off the table."""
        guard = guard_by_table(rec.phase, event, rec.pin_count)
        return self._step(T.RECORD, rec.phase, event, guard)

    def _pin(self, cid: int, kind: str) -> None:
        rec = self.records[cid]
        row = self._step(T.RECORD, rec.phase, f"pin_{kind}")
        self._apply(cid, rec, row)

    def _unpin(self, cid: int, kind: str) -> None:
        rec = self.records.get(cid)
        if rec is None:
            return
        if rec.pin_count <= 0:
            raise PinUnderflowError(f"checkpoint {cid} {kind} {UNDERFLOW_MESSAGE}")
        row = self._guarded_step(rec, f"unpin_{kind}")
        self._apply(cid, rec, row)

    def _evict(self, cid: int) -> None:
        rec = self.records[cid]
        row = self._guarded_step(rec, "evict")
        self._apply(cid, rec, row)
        self.evictions += 1

    def _slot_busy(self, dst_slot: int) -> bool:
        return (
            any(op.dst_slot == dst_slot for _, op in self._queued_restores)
            or any(op.dst_slot == dst_slot for _, op in self._inflight_restores)
            or any(op.dst_slot == dst_slot for _, op in self._suspended.values())
        )

    # -- stores ---------------------------------------------------------------------------

    def ensure_free_units(self, count: int) -> bool:
        """Evict unpinned READY records, oldest first, until ``count`` units are free.

        Returns False and spends nothing when ``has_available_units(count)`` is False
        (SPEC B.3 row 14)."""
        _need_int("count", count, 0)
        if not self.has_available_units(count):
            return False
        while self.pool.num_free < count:
            victim = self._next_victim()
            if victim < 0:
                return False
            self._evict(victim)
        return True

    def begin_store(self, prefix_hash: int, src_slot: int) -> CheckpointStoreOp | None:
        """Begin copying ``src_slot``'s image under ``prefix_hash`` (SPEC B.3 row 1).

        Returns the op for this batch's copy launch, or ``None`` (nothing changed beyond LRU
        evictions that made room) when the hash is READY or pending or no units can be had.
        The record is COPYING, invisible to lookup, until the next ``complete_inflight``.
        """
        _need_int("prefix_hash", prefix_hash)
        _need_int("src_slot", src_slot, 0)
        if self.lookup(prefix_hash) >= 0 or prefix_hash in self._pending_by_hash:
            return None
        u = self.units_per_checkpoint
        if not self.ensure_free_units(u):
            return None
        cid = self._next_checkpoint_id
        with self.pool._as_store():
            units = self.pool.reserve_units(u, (CHECKPOINT_OWNER, cid))
        if units is None:
            return None
        self._next_checkpoint_id += 1
        row = self._step(T.RECORD, T.ABSENT, "begin_store")
        rec = _Record(prefix_hash, tuple(units), T.ABSENT)
        self.records[cid] = rec
        self._apply(cid, rec, row)
        self._inflight_stores.append(cid)
        return CheckpointStoreOp(src_slot, tuple(units), self.spec.image_bytes, self.spec.layout_id)

    def complete_inflight(self) -> None:
        """The batch that carried the last drain's ops has been issued: publish its stores
        (COPYING -> READY, or release EVICTING and duplicates) and release its restore pins
        (SPEC B.3 rows 2, 3)."""
        inflight, self._inflight_stores = self._inflight_stores, []
        for cid in inflight:
            rec = self.records.get(cid)
            if rec is None:
                continue
            if rec.phase == T.EVICTING:
                self._apply(cid, rec, self._guarded_step(rec, "publish"))
            elif rec.phase != T.COPYING:
                continue
            elif self.lookup(rec.prefix_hash) >= 0:
                self._apply(cid, rec, self._step(T.RECORD, T.COPYING, "dedup"))
            else:
                self._apply(cid, rec, self._step(T.RECORD, T.COPYING, "publish"))
                if self._offload_sink:
                    self._queue_offload_store(cid)
        restores, self._inflight_restores = self._inflight_restores, []
        for cid, _op in restores:
            self._step(T.RESTORE, T.IN_FLIGHT, "complete", to=T.DONE)
            self._unpin(cid, "restore")

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
        for cid, op in self._queued_restores:
            (drop if op.dst_slot == dst_slot else keep).append((cid, op))
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

    # -- index changes --------------------------------------------------------------------

    def unindex(self, prefix_hash: int) -> bool:
        """The KV prefix ``prefix_hash`` was evicted: make its checkpoint unfindable (SPEC B.3
        row 10). READY unpinned records are released; pinned or COPYING ones become EVICTING
        and keep their units until the last reader or writer is done. Returns whether a
        record was found."""
        _need_int("prefix_hash", prefix_hash)
        cid = self.hash_to_checkpoint.get(prefix_hash)
        if cid is None:
            cid = self._pending_by_hash.get(prefix_hash)
        if cid is None:
            return False
        rec = self.records.get(cid)
        if rec is None:
            return False
        self._apply(cid, rec, self._guarded_step(rec, "unindex"))
        return True

    def clear(self) -> None:
        """Unindex everything (SPEC B.3 row 11). Pinned and in-flight records become EVICTING;
        the rest are released. Queued restores, offload pins, nominations and transfer
        reservations survive. The change log records one ``None`` bump when the READY set
        was not empty (G6)."""
        plan = []
        for cid, rec in self.records.items():
            plan.append((cid, rec, self._guarded_step(rec, "clear")))
        had_ready = bool(self.hash_to_checkpoint)
        for _cid, rec, row in plan:
            rec.phase = row.next
            rec.pin_count += row.pin_delta
        self.hash_to_checkpoint.clear()
        self._pending_by_hash.clear()
        self._lru.clear()
        for cid, _rec, row in plan:
            if row.units == "release":
                self._release_record(cid)
        if had_ready:
            self._note_change(None)

    def adopt_units(self, unit_ids: tuple[int, ...], owner: Hashable, prefix_hash: int) -> bool:
        """Make a completed external image the READY record of ``prefix_hash`` by retagging
        ``owner``'s units, with no window in which they are free (SPEC B.3 row 13). If the
        hash is READY or pending, the units are released and False returned. Not nominated
        for offload. Identities are taken only after nothing can fail (G8).

        Raises:
            InvalidArgumentError: wrong unit count or argument types.
            StoreOwnedUnitsError: ``owner`` is a checkpoint's own tag (its units are not
                adoptable), or a transfer reservation and the caller is not the
                coordinator's ``adopt_transfer_units``.
            WrongOwnerError, PartialReleaseError, DuplicateUnitError: the units are not
                exactly ``owner``'s whole reservation.
        """

        _need_int("prefix_hash", prefix_hash)
        if not isinstance(unit_ids, (list, tuple)) or len(unit_ids) != self.units_per_checkpoint:
            raise InvalidArgumentError(
                f"adoption needs exactly {self.units_per_checkpoint} units, got {unit_ids!r}"
            )
        if _is_checkpoint_owner(owner):
            raise StoreOwnedUnitsError.for_owner(owner)
        if _is_dirtying(owner):
            if not self._transfer_grant:
                raise StoreOwnedUnitsError.for_transfer_adoption(owner)
            self._transfer_grant = False  # spent: it serves this call alone
        if self.contains_or_pending(prefix_hash):
            with self.pool._as_store():
                self.pool.release_units(unit_ids, owner)
            return False
        cid = self._next_checkpoint_id
        with self.pool._as_store():
            self.pool.rekey_units(unit_ids, owner, (CHECKPOINT_OWNER, cid))
        self._next_checkpoint_id += 1
        row = self._step(T.RECORD, T.ABSENT, "adopt")
        rec = _Record(prefix_hash, tuple(unit_ids), T.ABSENT)
        self.records[cid] = rec
        self._apply(cid, rec, row)
        return True

    # -- offload (SPEC B.3 rows 15-21, G7) -------------------------------------------------

    def _queue_offload_store(self, cid: int) -> None:
        self._offload_ready.append(cid)
        while len(self._offload_ready) > self._offload_backlog_cap:
            self._offload_ready.popleft()
            self.offload_nominations_dropped += 1

    def _pin_offload_source(
        self, cid: int, *, timeout_reclaimable: bool, now: float
    ) -> tuple[StateStoreOperationId, tuple[int, ...]]:
        rec = self.records[cid]
        self._step(T.OFFLOAD, T.OP_NONE, "take" if timeout_reclaimable else "acquire", to=T.PINNED)
        self._pin(cid, "offload" if timeout_reclaimable else "lease")
        self._offload_generation += 1
        op = StateStoreOperationId(rec.prefix_hash, self._offload_generation)
        self._offload_pins[op] = _OffloadPin(cid, now, False, timeout_reclaimable)
        return op, rec.unit_ids

    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]:
        """Hand nominated READY images to the CPU tier, pinning each, while fewer than
        ``max_inflight`` operations are outstanding (SPEC B.3 row 15). A nominee whose hash
        already has an operation is deferred to the front of the queue, in order."""
        _need_int("max_inflight", max_inflight, 0)
        out = []
        deferred: list[int] = []
        # Read once, before any nominee is taken: a failing clock changes nothing.
        busy = self._offload_ready and len(self._offload_pins) < max_inflight
        now = read_clock(self.clock) if busy else 0.0
        while self._offload_ready and len(self._offload_pins) < max_inflight:
            cid = self._offload_ready.popleft()
            rec = self.records.get(cid)
            if rec is None or rec.phase != T.READY:
                continue
            if self._hash_in_flight(rec.prefix_hash):
                deferred.append(cid)
                continue
            out.append(self._pin_offload_source(cid, timeout_reclaimable=True, now=now))
        self._offload_ready.extendleft(reversed(deferred))
        return out

    def acquire_checkpoint_source(
        self, prefix_hash: int, *, max_inflight: int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        """Lease ``prefix_hash``'s READY image for an external transfer (SPEC B.3 row 16).
        Never timed out; release and settle it like an offload store. ``None`` when over
        ``max_inflight`` outstanding operations, not READY, or the hash has an operation."""
        _need_int("prefix_hash", prefix_hash)
        if max_inflight is not None:
            _need_int("max_inflight", max_inflight, 0)
            if len(self._offload_pins) >= max_inflight:
                return None
        cid = self.lookup(prefix_hash)
        if cid < 0 or self._hash_in_flight(prefix_hash):
            return None
        now = read_clock(self.clock)  # before any change: a failing clock changes nothing
        return self._pin_offload_source(cid, timeout_reclaimable=False, now=now)

    def _need_op(self, op: object) -> StateStoreOperationId:
        if not isinstance(op, StateStoreOperationId):
            raise InvalidArgumentError(f"op must be a StateStoreOperationId, got {op!r}")
        if not (_is_int(op.prefix_hash) and _is_int(op.generation)):
            raise InvalidArgumentError(f"an operation's fields must be ints, got {op!r}")
        return op

    def release_offload_store_source(self, op: StateStoreOperationId) -> None:
        """Phase 1 report: the gather drained; drop the source pin, keep the op until its
        terminal report (SPEC B.3 row 18). Unknown or repeated ops are ignored."""
        self._need_op(op)
        pin = self._offload_pins.get(op)
        if pin is None:
            return
        if pin.source_released:
            self._step(T.OFFLOAD, T.SOURCE_RELEASED, "release_source", to=T.SOURCE_RELEASED)
            return
        self._step(T.OFFLOAD, T.PINNED, "release_source", to=T.SOURCE_RELEASED)
        pin.source_released = True
        self._unpin(pin.checkpoint_id, "offload" if pin.reclaimable else "lease")

    def settle_offload_store(self, op: StateStoreOperationId) -> None:
        """Phase 2 report (stored ok or failed): retire the op, releasing its pin if phase 1
        never came (SPEC B.3 row 19). Unknown, late or repeated ops are ignored."""
        self._need_op(op)
        pin = self._offload_pins.get(op)
        if pin is None:
            return
        phase = T.SOURCE_RELEASED if pin.source_released else T.PINNED
        self._step(T.OFFLOAD, phase, "settle", to=T.SETTLED)
        del self._offload_pins[op]
        if not pin.source_released:
            self._unpin(pin.checkpoint_id, "offload" if pin.reclaimable else "lease")

    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        """Retire reclaimable offload ops older than ``timeout_s`` seconds (SPEC B.3 row 21).

        An op whose source was never released is forfeited: its pin is dropped and
        ``was_reclaimed(op)`` answers True for good (G7). Leases are never reclaimed.
        Returns the number of ops retired; ``timeout_s <= 0`` disables reclaim (returns 0).
        """
        need_timeout(timeout_s)
        if timeout_s <= 0 or not self._offload_pins:
            return 0
        now = read_clock(self.clock)
        stale = [
            (op, pin)
            for op, pin in self._offload_pins.items()
            if pin.reclaimable and pin.pinned_at <= now - timeout_s
        ]
        for op, pin in stale:
            phase = T.SOURCE_RELEASED if pin.source_released else T.PINNED
            self._step(
                T.OFFLOAD,
                phase,
                "reclaim",
                "reclaimable",
                to=T.LOST_REPORT if pin.source_released else T.RECLAIMED,
            )
            del self._offload_pins[op]
            self.offload_pins_reclaimed += 1
            if not pin.source_released:
                self._unpin(pin.checkpoint_id, "offload")
                self._remember_forfeit(op)
        return len(stale)

    def _remember_forfeit(self, op: StateStoreOperationId) -> None:
        self._forfeited[op] = None
        while len(self._forfeited) > self._forfeit_bound:
            oldest = min(self._forfeited, key=lambda o: o.generation)
            del self._forfeited[oldest]
            self._forfeit_watermark = max(self._forfeit_watermark, oldest.generation)

    # -- snapshot -------------------------------------------------------------------------

    def snapshot(self, **coordinator_fields: Any) -> Snapshot:
        """Everything observable, as the spec's :class:`Snapshot` (a coordinator passes its
        own fields through ``coordinator_fields``)."""
        free, dirty, tags = self.pool.snapshot_parts()
        return Snapshot(
            num_units=self.pool.num_units,
            units_per_checkpoint=self.units_per_checkpoint,
            free=free,
            dirty=dirty,
            tags=tags,
            cached=self.pool.cached_units(),
            records={
                c: RecordView(r.prefix_hash, r.unit_ids, r.phase, r.pin_count)
                for c, r in self.records.items()
            },
            index=dict(self.hash_to_checkpoint),
            pending=dict(self._pending_by_hash),
            lru=tuple(self._lru),
            inflight_stores=tuple(self._inflight_stores),
            queued_restores=tuple((c, op.dst_slot) for c, op in self._queued_restores),
            inflight_restores=tuple((c, op.dst_slot) for c, op in self._inflight_restores),
            suspended=tuple(
                sorted((lid, c, op.dst_slot) for lid, (c, op) in self._suspended.items())
            ),
            offload_sink=self._offload_sink,
            offload_ready=tuple(self._offload_ready),
            offload_backlog_cap=self._offload_backlog_cap,
            offload_pins={
                op: OffloadPinView(p.checkpoint_id, p.source_released, p.reclaimable, p.pinned_at)
                for op, p in self._offload_pins.items()
            },
            forfeited=frozenset(self._forfeited),
            forfeit_watermark=self._forfeit_watermark,
            forfeit_bound=self._forfeit_bound,
            generation=self.generation,
            changes=tuple(self._changes),
            next_checkpoint_id=self._next_checkpoint_id,
            next_lease_id=self._next_lease_id,
            offload_generation=self._offload_generation,
            evictions=self.evictions,
            offload_pins_reclaimed=self.offload_pins_reclaimed,
            offload_nominations_dropped=self.offload_nominations_dropped,
            **coordinator_fields,
        )


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
