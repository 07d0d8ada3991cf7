"""Production checkpoint store: SPEC B over indexes, with every phase change a table row.

Same public calls, arguments, return values, errors and :class:`Snapshot` as the reference
model (:mod:`pagedstate.models.reference`); where SPEC section G differs from ATOM's module,
this store follows G. Every record, restore, lease and offload operation moves only through
``Table.step`` of :mod:`pagedstate.spec.tables`, and the row's effects (phase, pin delta,
index, units) are applied by one function, :meth:`_apply`, with one exception: a store on
the production pool (``_begin_fast``) applies the effects of its two rows (the LRU victims'
evict, the begin) inline, and the module checks at import that those rows are the ones it
applies (``_FAST_ROWS``; otherwise every store takes ``_apply``).

Guards and arithmetic are pure helpers of :mod:`pagedstate.spec` that ``make contracts``
checks with CrossHair (their contracts, and ``crosshair diffbehavior`` against the
reference model's own formulations of the same computations): the guard of a record step
is computed by the helper ``record_guard`` dispatches its event to (``store_guard`` for
evict and an EVICTING publish, ``index_guard`` for unindex and clear, ``unpin_guard`` for
the unpins), the LRU victim predicate (victim heap, evictable count) is ``is_evictable``,
``has_available_units`` is ``units_available``, ``was_reclaimed`` is ``forfeit_untrusted``
and ``changed_since`` is ``pagedstate.spec.changelog.changed_since`` over the store's
deque. Each is one call, O(1) (``changed_since``: O(changes reported)), with no
allocation beyond its answer.

Indexes instead of walks (each kept exact by the differential tests in ``tests/``):

- **LRU** (SPEC B.1 ``_lru``): an ordered map of READY checkpoint ids, oldest first, plus a
  recency stamp per record (one int that also carries the record's id, see ``_CID_BITS``).
  A min-heap of stamps holds every READY unpinned record (stale entries skipped lazily, the
  heap rebuilt when it outgrows twice the LRU), so the next LRU victim is the heap's first
  valid entry: exactly the reference's "first evictable record in LRU order", however many
  pinned records crowd the cold end.
- **Evictable count**: the number of READY unpinned records, so ``has_available_units`` is
  arithmetic (the answer depends on the eligible set only, SPEC row 22).
- **Queued restores** keyed by destination slot (G4 makes a slot hold at most one restore),
  in queue order; in-flight and suspended restores keep per-slot counts.
- **Offload operations**: a per-hash operation count (``_hash_in_flight``); reclaimable
  operations in pin order, so a reclaim reads only the expired prefix when the clock is
  monotonic (a clock that went backwards makes it fall back to a walk over the reclaimable
  operations, to keep the reference's order and effects); forfeits in a generation
  min-heap, so trimming the forfeit memory to its bound is O(log n) (G7).
- **Change log**: a bounded deque; ``changed_since`` reads it backwards from the newest
  entry, so it costs the number of changes it reports.
- **Completions** (SPEC D.13): the outstanding completion tokens in call order, each with
  the checkpoint ids it published unsettled, and a ``settled`` flag per record, so the host
  readers' test (``take_offload_stores``, ``acquire_checkpoint_source``) is O(1) per record
  and a settle costs the outstanding tokens plus the records it settles.

Bounds: the change log (``change_log_size``), the nomination backlog
(``offload_backlog_cap``) and the exact forfeit memory (``forfeit_bound``, then a
watermark) are bounded; every other structure is bounded by the live records, operations,
restores and leases (an outstanding completion lists at least one record it published, and
is kept until its token reports done).

Hooks: ``row_sink`` (a set of ``(machine, row index)``, as the reference's) records every
row taken; ``on_transition(machine, row, subject)`` is called after each applied row
(``None`` by default, one attribute test per row when unset), once the row's effects are
done (a begun store already in flight). It runs in the middle of a store call: it must
not raise and must not call the store or its coordinator (record only, as
:mod:`.eventlog` does). Subjects: the checkpoint id
for ``record``; the :class:`StateStoreOperationId` for ``offload``; ``(cid, dst_slot)``
for ``restore``; the lease id for ``lease``.

Modules: this one holds the class with its constructor, the queries, the record machine
(the effects of every record row), the stores and the index changes; its topic mixins hold
the restores (:mod:`._store_restores`), the CPU tier, transfer leases and adoption
(:mod:`._store_offload`), the completion with its tokens, the settle and ``outstanding``
(:mod:`._store_completions`), and ``clone``, ``snapshot`` and ``self_check``
(:mod:`._store_views`). The record entries and the mixins' typed base are in
:mod:`._store_base`.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from pagedstate.spec import tables as T
from pagedstate.spec.changelog import changed_since as _changed_since
from pagedstate.spec.errors import InvalidArgumentError, PinUnderflowError
from pagedstate.spec.guards import (
    forfeit_untrusted,
    index_guard,
    is_evictable,
    record_step,
    store_guard,
    units_available,
    unpin_guard,
)
from pagedstate.spec.ops import UnitRuns, unit_runs
from pagedstate.spec.protocols import need_pool
from pagedstate.spec.tables import Row, Table
from pagedstate.spec.types import (
    CHECKPOINT_OWNER,
    CheckpointRestoreOp,
    CheckpointStoreOp,
    PagedStateCheckpointSpec,
    StateStoreOperationId,
)

from ._args import need_int
from ._store_base import RowSink, TransitionHook, _Completion, _OffloadPin, _Record
from ._store_base import _as_store as _as_store
from ._store_base import _deferring as _deferring
from ._store_completions import _Completions
from ._store_offload import _Offload
from ._store_restores import _Restores
from ._store_views import _Views
from .pool import UnitPool

#: The store's op constructors: its runs are maximal and well formed (SPEC A.5).
_store_op = CheckpointStoreOp._of_runs

__all__ = [
    "PageUnitCheckpointStore",
    "RowSink",
    "TransitionHook",
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

_READY = T.READY
_ABSENT = T.ABSENT
_COPYING = T.COPYING
_EVICTING = T.EVICTING
_HEAP_SLACK = 32
#: A record's recency stamp is ``n << _CID_BITS | cid`` for its n-th stamping: stamps order
#: by ``n`` (checkpoint ids count up from 0 and stay far below 2**64), and the victim heap
#: holds the stamps themselves, ``stamp & _CID_MASK`` naming the record. One int per entry
#: instead of a ``(stamp, cid)`` tuple: fewer objects to compare and to fetch from memory
#: while the heap sifts.
_CID_BITS = 64
_CID_MASK = (1 << _CID_BITS) - 1
#: Rows whose key is constant, looked up once in their table (which still decides them:
#: a missing row fails here, at import).
_BEGIN_STORE = T.RECORD.step(T.ABSENT, "begin_store")
_EVICT_UNPINNED = T.RECORD.step(T.READY, "evict", store_guard(0))
#: Whether the two rows a store on the production pool takes in its steady state (evict the
#: LRU victim, begin the copy) have the effects :meth:`PageUnitCheckpointStore._begin_fast`
#: applies inline; when the table says otherwise the store takes the general path
#: (``_make_room`` / ``_apply``), so the shortcut can never disagree with the table.
_FAST_ROWS = (
    _BEGIN_STORE.next == T.COPYING
    and _BEGIN_STORE.pin_delta == 0
    and _BEGIN_STORE.index == "pending"
    and _BEGIN_STORE.units == "reserve"
    and not is_evictable(T.COPYING, 0)
    and _EVICT_UNPINNED.pin_delta == 0
    and _EVICT_UNPINNED.index == "remove"
    and _EVICT_UNPINNED.units == "release"
    and not is_evictable(_EVICT_UNPINNED.next, 0)
)


class PageUnitCheckpointStore(_Restores, _Offload, _Completions, _Views):
    """Production checkpoint store (SPEC B.1-B.4 with section G).

    Args:
        pool: the unit pool checkpoints reserve from (:class:`~pagedstate.impl.UnitPool`,
            or anything with its raw-unit calls).
        spec: the image geometry; ``units_per_checkpoint`` units per record.
        offload_sink: nominate READY records for the CPU tier (SPEC B.3 row 20).
        clock: seconds, monotonic; stamps offload pins (default ``time.monotonic``).
        offload_backlog_cap: most READY records waiting to be handed to the CPU tier, in
            records (SPEC B.1; the oldest nomination is dropped past it).
        forfeit_bound: reclaimed offload operations remembered exactly, in operations
            (G7; past it, a generation watermark that fails closed).
        change_log_size: READY-state changes ``changed_since`` can report, in changes
            (older generations answer ``None``: unknown).

    Raises:
        InvalidArgumentError: ``spec`` is not a :class:`PagedStateCheckpointSpec`, a bound
            is not a positive int, or ``pool`` lacks a unit pool's calls.

    Complexity is given per method; ``n`` is the number of live records. Every call is O(1)
    amortized (or O(log n) where a heap is involved) except ``clear`` (O(records): every
    record changes phase), ``snapshot`` / ``clone`` (O(state)) and calls whose cost is the
    size of what they return or release.
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
        need_int("offload_backlog_cap", offload_backlog_cap, 1)
        need_int("forfeit_bound", forfeit_bound, 1)
        need_int("change_log_size", change_log_size, 1)
        need_pool(pool)
        self.pool = pool
        self.spec = spec
        self._units = spec.units_per_checkpoint
        if clock is not None and not callable(clock):
            raise InvalidArgumentError(f"clock must be callable or None, got {clock!r}")
        self.clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self.row_sink: RowSink | None = None
        self.on_transition: TransitionHook | None = None
        self.records: dict[int, _Record] = {}
        self.hash_to_checkpoint: dict[int, int] = {}
        self._pending_by_hash: dict[int, int] = {}
        # LRU of READY records (oldest first) and the evictable heap over it.
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._stamp = 0  # pragma: no mutate (stamps are only compared)
        self._victims: list[int] = []
        self._num_evictable = 0
        self._inflight_stores: list[int] = []
        # Queued restores by destination slot, in queue order (G4: one per slot).
        self._queued_restores: dict[int, tuple[int, CheckpointRestoreOp]] = {}
        self._inflight_restores: list[tuple[int, CheckpointRestoreOp]] = []
        self._inflight_slots: set[int] = set()
        self._suspended: dict[int, tuple[int, CheckpointRestoreOp]] = {}
        self._suspended_slots: dict[int, int] = {}
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
        self._changes: deque[tuple[int, int | None]] = deque(maxlen=change_log_size)
        self._offload_sink = bool(offload_sink)
        self._offload_ready: deque[int] = deque()
        self._offload_backlog_cap = offload_backlog_cap
        self.offload_nominations_dropped = 0
        self._offload_pins: dict[StateStoreOperationId, _OffloadPin] = {}
        # Hashes with an offload operation awaiting its report: at most one per hash (both
        # ways to start one check this first).
        self._op_hashes: set[int] = set()
        self._reclaimable: OrderedDict[StateStoreOperationId, None] = OrderedDict()
        self._reclaim_in_order = True  # pragma: no mutate (False only makes reclaim read every pin)
        self._offload_generation = 0
        self.offload_pins_reclaimed = 0
        self._forfeited: dict[StateStoreOperationId, None] = {}
        self._forfeit_heap: list[tuple[int, StateStoreOperationId]] = []
        self._forfeit_bound = forfeit_bound
        self._forfeit_watermark = 0
        # Outstanding completions (SPEC D.13): (token, checkpoint ids it published
        # unsettled), in the order the completions were called.
        self._completions: list[_Completion] = []

    # -- reading --------------------------------------------------------------------------

    @property
    def units_per_checkpoint(self) -> int:
        """Units per image, ``ceil(image_bytes / page_unit_bytes)`` (SPEC A.1). O(1)."""
        return self._units

    def lookup(self, prefix_hash: int) -> int:
        """The READY record's checkpoint id for ``prefix_hash``, or -1. O(1).

        Raises:
            InvalidArgumentError: ``prefix_hash`` is not an int.
        """
        if type(prefix_hash) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("prefix_hash", prefix_hash)
        # The index holds READY records only: a record enters it on the row to READY and
        # leaves it on every row out of READY (SPEC B.3).
        return self.hash_to_checkpoint.get(prefix_hash, -1)

    def contains(self, prefix_hash: int) -> bool:
        """Whether a READY image of ``prefix_hash`` exists. O(1).

        Raises:
            InvalidArgumentError: ``prefix_hash`` is not an int.
        """
        return self.lookup(prefix_hash) >= 0

    def contains_or_pending(self, prefix_hash: int) -> bool:
        """READY, or COPYING (a store is on its way). O(1).

        Raises:
            InvalidArgumentError: ``prefix_hash`` is not an int.
        """
        return self.lookup(prefix_hash) >= 0 or prefix_hash in self._pending_by_hash

    def _is_evictable(self, cid: int) -> bool:
        """SPEC B.3: READY and unpinned (the caller leaves out a protected record). O(1)."""
        rec = self.records.get(cid)
        return rec is not None and is_evictable(rec.phase, rec.pin_count)

    def _next_victim(self) -> int:
        """The first evictable record in LRU order, or -1 (the only place eviction policy
        lives; no caller protects a record here: ``has_available_units`` discounts its
        protected record from the count instead). O(log n) amortized: the top of the victim
        heap, stale entries popped."""
        heap = self._victims
        records = self.records
        while heap:
            stamp = heap[0]
            cid = stamp & _CID_MASK
            rec = records.get(cid)
            if (
                rec is None
                or not is_evictable(rec.phase, rec.pin_count)
                or rec.stamp != stamp
            ):
                heapq.heappop(heap)
                continue
            return cid
        return -1  # pragma: no mutate (callers test < 0; unreachable after units_available)

    def has_available_units(self, count: int, protected_hash: int | None = None) -> bool:
        """Whether ``count`` units are free or could be freed by evicting unpinned READY
        records other than ``protected_hash``'s (SPEC B.3 row 22). Pure. O(1): the evictable
        count times the image size, against the shortfall.

        Raises:
            InvalidArgumentError: ``count`` is not a non-negative int, or ``protected_hash``
                is neither None nor an int.
        """
        if type(count) is not int or count < 0:  # pragma: no mutate (need_int re-checks)
            need_int("count", count, 0)
        if protected_hash is not None:
            if type(protected_hash) is not int:  # pragma: no mutate (need_int re-checks)
                need_int("protected_hash", protected_hash)
        spendable = self._num_evictable
        if protected_hash is not None:
            protected = self.lookup(protected_hash)
            if protected >= 0 and self._is_evictable(protected):
                spendable -= 1
        return units_available(count, self.pool.num_free, spendable, self._units)

    def changed_since(self, generation: int) -> set[int] | None:
        """Hashes whose READY state changed after ``generation``; ``None`` when unknown (the
        log does not reach back, or a clear happened). SPEC B.3 row 23, G6. O(changes since
        ``generation``), at most ``change_log_size``.

        Raises:
            InvalidArgumentError: ``generation`` is not an int.
        """
        if type(generation) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("generation", generation)
        return _changed_since(self.generation, self._changes, generation)

    def was_reclaimed(self, op: StateStoreOperationId) -> bool:
        """Whether ``op``'s source was taken back before it reported (G7: fails closed past
        the exact memory). O(1).

        Raises:
            InvalidArgumentError: ``op`` is not a :class:`StateStoreOperationId`.
        """
        self._need_op(op)
        return forfeit_untrusted(
            op in self._forfeited,
            op.generation,
            self._forfeit_watermark,
            op in self._offload_pins,
        )

    # -- internal effects -----------------------------------------------------------------

    def _took(self, table: Table, row: Row, subject: object) -> None:
        """Record a row that was applied: into ``row_sink`` and ``on_transition``."""
        sink = self.row_sink
        if sink is not None:
            sink.add((table.machine, table.row_id(row)))
        hook = self.on_transition
        if hook is not None:
            hook(table.machine, row, subject)

    def _note_change(self, prefix_hash: int | None) -> None:
        self.generation += 1
        self._changes.append((self.generation, prefix_hash))

    def _push_victim(self, rec: _Record) -> None:
        """Enter ``rec`` (just made evictable, or re-stamped) in the victim heap by its
        recency stamp, which carries its id; stale entries are skipped when popped."""
        heap = self._victims
        heapq.heappush(heap, rec.stamp)
        # equivalent mutants: when to compact: speed only
        if len(heap) > 2 * len(self._lru) + _HEAP_SLACK:  # pragma: no mutate
            records = self.records
            fresh = []
            for c in self._lru:
                r = records[c]
                if is_evictable(r.phase, r.pin_count):
                    fresh.append(r.stamp)
            heapq.heapify(fresh)
            self._victims = fresh

    def _refresh(self, cid: int, rec: _Record) -> None:
        """Give ``rec`` (record ``cid``) the newest recency stamp (it is at the end of the
        LRU)."""
        self._stamp += 1
        rec.stamp = self._stamp << _CID_BITS | cid

    def _apply(self, cid: int, rec: _Record, row: Row) -> None:
        """Apply a record row's effects (phase, pins, index, units), then record the row."""
        h = rec.prefix_hash
        was = is_evictable(rec.phase, rec.pin_count)
        phase = rec.phase = row.next
        delta = row.pin_delta
        if delta:
            rec.pin_count += delta
        now = is_evictable(phase, rec.pin_count)
        index = row.index
        if index != "none":  # pragma: no mutate (a shortcut: no branch below matches)
            if index == "pending":
                self._pending_by_hash[h] = cid
            elif index == "unpending":
                pending = self._pending_by_hash
                if pending.get(h) == cid:
                    del pending[h]
            elif index == "add":
                pending = self._pending_by_hash
                if pending.get(h) == cid:
                    del pending[h]
                self.hash_to_checkpoint[h] = cid
                self._lru[cid] = None  # pragma: no mutate (an ordered set: values unread)
                self._stamp += 1
                rec.stamp = self._stamp << _CID_BITS | cid
                self.generation += 1
                self._changes.append((self.generation, h))
            elif index == "remove":
                index_map = self.hash_to_checkpoint
                if index_map.get(h) == cid:
                    del index_map[h]
                self._lru.pop(cid, None)  # pragma: no mutate (a READY record is in the LRU)
                self.generation += 1
                self._changes.append((self.generation, h))
        if was != now:
            self._num_evictable += 1 if now else -1
        # equivalent mutants: extra heap entries are skipped as stale
        if now and (not was or index == "add"):  # pragma: no mutate
            self._push_victim(rec)
        if row.units == "release":
            self._release_record(cid)
        if self.row_sink is not None or self.on_transition is not None:
            self._took(T.RECORD, row, cid)

    def _release_record(self, cid: int) -> None:
        """Drop the record and return its units to the pool (SPEC B.3 "rel")."""
        rec = self.records.pop(cid)
        # Not in the index, the pending map or the LRU any more: every row that releases
        # units leaves READY with "remove", leaves COPYING with "unpending", or starts from
        # EVICTING (which those rows made), and ``clear`` empties all three first.
        pool = self.pool
        if type(pool) is UnitPool:  # pragma: no mutate (the general path does the same, slower)
            pool._release_runs(rec.runs, (CHECKPOINT_OWNER, cid))
        else:
            with _as_store(pool):
                pool.release_units(rec.unit_ids, (CHECKPOINT_OWNER, cid))

    def _pin(self, cid: int, kind: str) -> None:
        """Take a pin of ``kind`` (restore, offload, lease) through the record table; only a
        READY record has pin rows (G11), and a host reader's pin (offload, lease) only a
        settled one (D.13), so pinning anything else raises with nothing changed. O(1).

        Raises:
            IllegalTransitionError: the record is not READY, or not settled for a host pin.
        """
        rec = self.records[cid]
        row = record_step(rec.phase, f"pin_{kind}", rec.pin_count, rec.settled)
        self._apply(cid, rec, row)

    def _unpin(self, cid: int, kind: str) -> None:
        """Release a pin of ``kind``; the last pin of an EVICTING record releases it. O(1)
        (plus the units released).

        Raises:
            PinUnderflowError: the record holds no pin (nothing changed).
        """
        rec = self.records.get(cid)
        if rec is None:
            return
        try:
            guard = unpin_guard(rec.phase, rec.pin_count)
        except PinUnderflowError as exc:
            raise PinUnderflowError(f"checkpoint {cid} {kind} {exc}") from None
        row = T.RECORD.step(rec.phase, f"unpin_{kind}", guard)
        self._apply(cid, rec, row)

    def _evict(self, cid: int) -> None:
        """Spend an unpinned READY record (SPEC B.3 row 12), counting an eviction. O(log n).

        Raises:
            IllegalTransitionError: the record is pinned or not READY (nothing changed).
        """
        rec = self.records[cid]
        row = T.RECORD.step(rec.phase, "evict", store_guard(rec.pin_count))
        self._apply(cid, rec, row)
        self.evictions += 1

    # -- stores ---------------------------------------------------------------------------

    def ensure_free_units(self, count: int) -> bool:
        """Evict unpinned READY records, oldest first, until ``count`` units are free.

        Returns False and spends nothing when ``has_available_units(count)`` is False
        (SPEC B.3 row 14). O(1 + evictions * log n).

        Raises:
            InvalidArgumentError: ``count`` is not a non-negative int.
        """
        if type(count) is not int or count < 0:  # pragma: no mutate (need_int re-checks)
            need_int("count", count, 0)
        return self._make_room(count)

    def _make_room(self, count: int) -> bool:
        """``ensure_free_units`` past argument checks."""
        pool = self.pool
        free = pool.num_free
        if count <= free:  # pragma: no mutate (the loop below returns True at once)
            return True
        if not units_available(count, free, self._num_evictable, self._units):
            return False
        while pool.num_free < count:
            victim = self._next_victim()
            if victim < 0:
                return False  # pragma: no mutate (unreachable: units_available counted the victims)
            self._evict(victim)
        return True

    def begin_store(self, prefix_hash: int, src_slot: int) -> CheckpointStoreOp | None:
        """Begin copying ``src_slot``'s image under ``prefix_hash`` (SPEC B.3 row 1).

        Returns the op for this batch's copy launch (``unit_ids`` in piece order,
        ``total_bytes == image_bytes``), or ``None`` (nothing changed beyond LRU evictions
        that made room) when the hash is READY or pending or no units can be had. The record
        is COPYING, invisible to lookup, until the next ``complete_inflight``.

        Re-entrancy (SPEC A.4): the reservation may overwrite cached KV blocks, and the
        engine then calls ``unindex`` (which may release other records' units, or make this
        very record EVICTING if its own prefix was evicted) before this call returns. The
        production pool holds those callbacks until the record is filed
        (``deferred_evictions``); a pool that fires inside ``reserve_units`` is tolerated
        too: the checkpoint id is taken before the reservation (and given back if the pool
        refuses), so a nested store cannot reuse it. O(1 + units + evictions * log n).

        Raises:
            InvalidArgumentError: ``prefix_hash`` is not an int or ``src_slot`` not an int >= 0.
        """
        if type(prefix_hash) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("prefix_hash", prefix_hash)
        if type(src_slot) is not int or src_slot < 0:  # pragma: no mutate (need_int re-checks)
            need_int("src_slot", src_slot, 0)
        if self.lookup(prefix_hash) >= 0 or prefix_hash in self._pending_by_hash:
            return None
        return self._begin(prefix_hash, src_slot)

    def _begin(self, prefix_hash: int, src_slot: int) -> CheckpointStoreOp | None:
        """``begin_store`` past its argument checks and with the hash neither READY nor
        pending (the caller checked)."""
        u = self._units
        pool = self.pool
        production = type(pool) is UnitPool
        if production and _FAST_ROWS:  # pragma: no mutate (the general path does the same, slower)
            return self._begin_fast(prefix_hash, src_slot, u, pool)
        # _make_room(u), which answers at once when u units are free; the production pool's
        # free count (num_free) is read directly.
        if not (production and pool._ext.count + len(pool._cached) >= u):
            if not self._make_room(u):
                return None
        cid = self._next_checkpoint_id
        self._next_checkpoint_id = cid + 1
        if production and pool.on_evict is None:
            # The production pool with no eviction callback: nothing can call back into the
            # store during the reservation, so the deferral block (which would hold nothing)
            # is skipped.
            got = pool._reserve_runs(u, (CHECKPOINT_OWNER, cid))
            if got is None:
                # equivalent mutants: unreachable: _make_room(u) or the free count above
                # made room for u units, and no callback can take it back in between
                self._next_checkpoint_id = cid  # pragma: no mutate
                return None
            runs = tuple(got)
            # equivalent mutants: the row sets the phase
            rec = _Record(prefix_hash, runs, _ABSENT, settled=False)  # pragma: no mutate
            self.records[cid] = rec
            # in flight before the row's hook runs (every path: the hook sees one state)
            self._inflight_stores.append(cid)
            self._apply(cid, rec, _BEGIN_STORE)
        else:
            begun = self._begin_deferred(prefix_hash, cid, pool)
            if begun is None:
                return None
            runs = begun
        spec = self.spec
        return _store_op(src_slot, runs, spec.image_bytes, spec.layout_id)

    def _begin_fast(
        self, prefix_hash: int, src_slot: int, u: int, pool: UnitPool
    ) -> CheckpointStoreOp | None:
        """``_begin`` on the production pool, the effects of its two rows inline (SPEC A.5:
        O(runs) Python steps per image, few calls): each LRU victim's evict row (B.3 row 12:
        READY unpinned -> released, index remove, units released) and the begin row (B.3
        row 1: -> COPYING, pending). Same effects, rows and order as ``_make_room`` then
        ``_apply`` (``_FAST_ROWS`` checks the rows are the ones it applies). When the
        reservation needs cached KV units (whose ``on_evict`` callbacks may call back into
        the store) it is made inside the pool's deferral block (``_begin_deferred``); when
        vacant units suffice no callback can fire, so the block is skipped."""
        ext = pool._ext
        cached = pool._cached
        # equivalent mutants: a shortcut (the loop below tests the free count again)
        if ext.count + len(cached) < u:  # pragma: no mutate
            if not units_available(u, ext.count + len(cached), self._num_evictable, u):
                return None
            records = self.records
            index = self.hash_to_checkpoint
            lru = self._lru
            changes = self._changes
            # equivalent mutants: _took records nothing with neither hook set
            sink, hook = self.row_sink, self.on_transition
            hooked = sink is not None or hook is not None  # pragma: no mutate
            while ext.count + len(cached) < u:
                cid = self._next_victim()
                if cid < 0:
                    return None  # pragma: no mutate (unreachable: units_available counted it)
                # _evict(cid): the victim is READY and unpinned (the victim heap's invariant);
                # its guard still comes from the checked helper, and the table decides if not
                rec = records[cid]  # dropped below: its phase is never read again
                if store_guard(rec.pin_count) != _EVICT_UNPINNED.guard:  # pragma: no mutate
                    self._evict(cid)  # pragma: no mutate (unreachable: raises, as before)
                    continue  # pragma: no mutate
                h = rec.prefix_hash
                if index.get(h) == cid:
                    del index[h]
                lru.pop(cid, None)  # pragma: no mutate (a READY record is in the LRU)
                self.generation += 1
                changes.append((self.generation, h))
                self._num_evictable -= 1
                del records[cid]
                pool._release_ckpt(rec.runs, cid)
                if hooked:
                    self._took(T.RECORD, _EVICT_UNPINNED, cid)
                self.evictions += 1
        cid = self._next_checkpoint_id
        self._next_checkpoint_id = cid + 1
        got: list[tuple[int, int]] | None
        # equivalent mutants: the other branches reserve the same units, slower (u >= 1)
        if ext.count >= u > 0:  # pragma: no mutate
            # vacant units suffice: no cached unit is taken, so no callback fires and the
            # deferral block would hold nothing
            got = pool._reserve_vacant_ckpt(u, cid)
        elif pool.on_evict is None:
            # no callback is wired: the deferral block would hold nothing either
            got = pool._reserve_runs(u, (CHECKPOINT_OWNER, cid))
            if got is None:
                # equivalent mutants: unreachable: room for u units was made above and no
                # callback can take it back in between
                self._next_checkpoint_id = cid  # pragma: no mutate
                return None
        else:
            begun = self._begin_deferred(prefix_hash, cid, pool)
            if begun is None:
                return None
            spec = self.spec
            return _store_op(src_slot, begun, spec.image_bytes, spec.layout_id)
        runs = tuple(got)
        # equivalent mutants: the row sets the phase
        rec = _Record(prefix_hash, runs, _COPYING, settled=False)  # pragma: no mutate
        self.records[cid] = rec
        self._pending_by_hash[prefix_hash] = cid
        self._inflight_stores.append(cid)
        if self.row_sink is not None or self.on_transition is not None:
            self._took(T.RECORD, _BEGIN_STORE, cid)
        spec = self.spec
        return _store_op(src_slot, runs, spec.image_bytes, spec.layout_id)

    def _begin_deferred(self, prefix_hash: int, cid: int, pool: Any) -> UnitRuns | None:
        """``_begin``'s reservation and filing of record ``cid`` inside the pool's deferral
        block (callbacks fire once the record is filed); its runs, or ``None`` (the identity
        given back) when the pool refused."""
        with _deferring(pool):
            units: Any
            if type(pool) is UnitPool:  # pragma: no mutate (the general path does the same, slower)
                units = pool._reserve_runs(self._units, (CHECKPOINT_OWNER, cid))
            else:
                with _as_store(pool):
                    units = pool.reserve_units(self._units, (CHECKPOINT_OWNER, cid))
                if units is not None:
                    units = unit_runs(units)
            if units is None:
                # The pool refused before changing anything (no callback ran): the
                # identity was not consumed.
                self._next_checkpoint_id = cid
                return None
            runs = tuple(units)
            # equivalent mutants: the row sets the phase
            rec = _Record(prefix_hash, runs, _ABSENT, settled=False)  # pragma: no mutate
            self.records[cid] = rec
            # in flight before the row's hook runs (every path: the hook sees one state)
            self._inflight_stores.append(cid)
            self._apply(cid, rec, _BEGIN_STORE)
        return runs

    # -- index changes --------------------------------------------------------------------

    def unindex(self, prefix_hash: int) -> bool:
        """The KV prefix ``prefix_hash`` was evicted: make its checkpoint unfindable (SPEC
        B.3 row 10). READY unpinned records are released; pinned or COPYING ones become
        EVICTING and keep their units until the last reader or writer is done. Returns
        whether a record was found. Safe to call re-entrantly from the pool's ``on_evict``.
        O(1) (+ log n for the LRU heap).

        Raises:
            InvalidArgumentError: ``prefix_hash`` is not an int.
        """
        if type(prefix_hash) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("prefix_hash", prefix_hash)
        cid = self.hash_to_checkpoint.get(prefix_hash)
        if cid is None:
            cid = self._pending_by_hash.get(prefix_hash)
        if cid is None:
            return False
        rec = self.records.get(cid)
        if rec is None:
            return False  # pragma: no mutate (unreachable: the index names live records)
        guard = index_guard(rec.phase, rec.pin_count)
        # a COPYING record that becomes EVICTING stays unsettled: its copy has not run, and
        # it is released when its batch completes (C.26)
        self._apply(cid, rec, T.RECORD.step(rec.phase, "unindex", guard))
        return True

    def clear(self) -> None:
        """Unindex everything (SPEC B.3 row 11). Pinned and in-flight records become
        EVICTING; the rest are released. Queued restores, offload pins, nominations and
        transfer reservations survive. The change log records one ``None`` bump when the
        READY set was not empty (G6). O(records): every record changes phase."""
        plan = []
        for cid, rec in self.records.items():
            guard = index_guard(rec.phase, rec.pin_count)
            plan.append((cid, rec, T.RECORD.step(rec.phase, "clear", guard)))
        had_ready = bool(self.hash_to_checkpoint)
        for _cid, rec, row in plan:
            rec.phase = row.next
            rec.pin_count += row.pin_delta  # pragma: no mutate (clear rows move no pins)
        self.hash_to_checkpoint.clear()
        self._pending_by_hash.clear()
        self._lru.clear()
        self._victims = []
        self._num_evictable = 0
        for cid, _rec, row in plan:
            if row.units == "release":
                self._release_record(cid)
        if had_ready:
            self._note_change(None)
        for cid, _rec, row in plan:
            self._took(T.RECORD, row, cid)
