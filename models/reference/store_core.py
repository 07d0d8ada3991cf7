"""The reference store's state and record machine (SPEC B.1, B.3): :class:`_StoreCore`, the
base of :class:`~.store.PageUnitCheckpointStore` and of its topic mixins
(:mod:`.store_restores`, :mod:`.store_offload`). It holds the constructor and the copy,
the lookups, the LRU walk for room, the effects every record row applies (phase, pins,
index, units), the completion tokens and their settle (SPEC B.3 row 24, D.13), and
``outstanding()`` (G17), with the record and offload-pin entries :class:`_Record` and
:class:`_OffloadPin`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Self

from pagedstate.spec import tables as T
from pagedstate.spec.changelog import changed_since_by_scan
from pagedstate.spec.errors import InvalidArgumentError, PinUnderflowError
from pagedstate.spec.guards import (
    UNDERFLOW_MESSAGE,
    evictable_by_table,
    guard_by_table,
    units_available_by_walk,
)
from pagedstate.spec.protocols import need_pool
from pagedstate.spec.tables import Row
from pagedstate.spec.types import (
    CHECKPOINT_OWNER,
    CheckpointRestoreOp,
    CompletionToken,
    PagedStateCheckpointSpec,
    StateStoreOperationId,
)

from ._common import (
    DEFAULT_CHANGE_LOG_SIZE,
    DEFAULT_FORFEIT_BOUND,
    DEFAULT_OFFLOAD_BACKLOG_CAP,
    _need_int,
    _Stepper,
)
from .pool import UnitPool

# ---------------------------------------------------------------------------------------
# The store (SPEC B)
# ---------------------------------------------------------------------------------------


class _Record:
    """A record: ``settled`` is whether the copy that made its image is known done (SPEC
    D.13): false while COPYING and while its completion token has not reported done."""

    __slots__ = ("prefix_hash", "unit_ids", "phase", "pin_count", "settled")

    def __init__(
        self,
        prefix_hash: int,
        unit_ids: tuple[int, ...],
        phase: str,
        pin_count: int = 0,
        settled: bool = False,
    ):
        self.prefix_hash = prefix_hash
        self.unit_ids = unit_ids
        self.phase = phase
        self.pin_count = pin_count
        self.settled = settled

    def copy(self) -> _Record:
        return _Record(self.prefix_hash, self.unit_ids, self.phase, self.pin_count, self.settled)


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


class _StoreCore(_Stepper):
    """The store's state and its record machine; the arguments are
    :class:`~.store.PageUnitCheckpointStore`'s."""

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
        # SPEC D.13: per completion token not yet seen done, in the order the completions
        # were called, the cids it published (in publish order; stale cids are skipped).
        self._completions: list[tuple[CompletionToken, list[int]]] = []

    # -- copying (for the explorer) -------------------------------------------------------

    def clone(self, pool: UnitPool | None = None) -> Self:
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
        c._completions = [(token, list(cids)) for token, cids in self._completions]  # shared
        return c

    # -- reading --------------------------------------------------------------------------

    @property
    def units_per_checkpoint(self) -> int:
        """Units per image (SPEC A.1)."""
        return self.spec.units_per_checkpoint

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

    def changed_since(self, generation: int) -> set[int] | None:
        """Hashes whose READY state changed after ``generation``; ``None`` when unknown (the
        log does not reach back, or a clear happened). SPEC B.3 row 23, G6."""
        _need_int("generation", generation)
        return changed_since_by_scan(self.generation, tuple(self._changes), generation)

    # -- internal effects -----------------------------------------------------------------

    def _note_change(self, prefix_hash: int | None) -> None:
        self.generation += 1
        self._changes.append((self.generation, prefix_hash))
        while len(self._changes) > self._change_log_size:
            self._changes.popleft()

    def _apply(self, cid: int, rec: _Record, row: Row) -> None:
        """Apply a record row's effects: phase, pins, index, units."""
        h = rec.prefix_hash
        self._set_phase(rec, row)
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

    @staticmethod
    def _set_phase(rec: _Record, row: Row) -> None:
        """A row's phase and pin change. A COPYING record that becomes EVICTING (unindexed
        or cleared in flight) stays unsettled: its copy has not run, no completion will list
        it (it is released when its batch completes) and no reader can pin it (C.26)."""
        rec.phase = row.next
        rec.pin_count += row.pin_delta

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
        """The record row ``event`` takes on ``rec``, its guard read off the table (pins, and
        for a host reader's pin the ``settled`` flag, SPEC D.13)."""
        guard = guard_by_table(rec.phase, event, rec.pin_count, rec.settled)
        return self._step(T.RECORD, rec.phase, event, guard)

    def _pin(self, cid: int, kind: str) -> None:
        """Pin ``cid`` for a reader of ``kind`` (restore, offload, lease).

        Raises:
            IllegalTransitionError: no row: the record is not READY (G11), or a host
                reader's pin on an unsettled image (D.13).
        """
        rec = self.records[cid]
        row = self._guarded_step(rec, f"pin_{kind}")
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

    # -- completion tokens (SPEC B.3 row 24, D.13) ---------------------------------------

    def _poll_completions(self, wait: bool = False) -> list[bool]:
        """Ask every outstanding token, in order, whether it is done (with ``wait``,
        ``synchronize()`` each first). Changes nothing in the store; an error propagates."""
        tokens = [token for token, _cids in self._completions]
        if wait:
            for token in tokens:
                token.synchronize()
        return [bool(token.query()) for token in tokens]

    def _settle(self, done: list[bool]) -> int:
        """Settle what the first ``len(done)`` outstanding tokens that answered done listed
        (READY/EVICTING + settle, a self-loop; no generation bump) and forget those tokens;
        later entries are kept. Returns the number of records settled (B.3 row 24)."""
        polled, rest = self._completions[: len(done)], self._completions[len(done) :]
        keep: list[tuple[CompletionToken, list[int]]] = []
        settled = 0
        for (token, cids), is_done in zip(polled, done, strict=True):
            if not is_done:
                keep.append((token, cids))
                continue
            for cid in cids:
                rec = self.records.get(cid)
                if rec is None or rec.settled:
                    continue  # gone meanwhile
                self._apply(cid, rec, self._step(T.RECORD, rec.phase, "settle"))
                rec.settled = True
                settled += 1
        self._completions = keep + rest
        return settled

    def settle_completions(self, wait: bool = False) -> int:
        """Settle every record whose completion token reports done (SPEC B.3 row 24, D.13):
        with ``wait``, ``synchronize()`` every outstanding token first, in order; then ask
        each ``query()``, all before any change. Tokens may report done in any order.
        Returns the number of records settled.

        Raises:
            Whatever a token's ``query()`` or ``synchronize()`` raises; nothing settled.
        """
        return self._settle(self._poll_completions(bool(wait)))

    def outstanding(self) -> dict[str, int]:
        """What the store still holds, in O(1) (SPEC D.13, G17): queued, in-flight and
        suspended restores, in-flight stores, offload and lease operations (source-released
        ones included) and the completion tokens not yet seen done."""
        return {
            "queued_restores": len(self._queued_restores),
            "inflight_restores": len(self._inflight_restores),
            "suspended_restores": len(self._suspended),
            "inflight_stores": len(self._inflight_stores),
            "offload_operations": len(self._offload_pins),
            "completions": len(self._completions),
        }
