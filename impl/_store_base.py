"""What the production store's modules share: the record and offload-pin entries, the row
hook types, the store's two adapters for pools (the production pool's calls where a pool
offers them), and :class:`_StoreBase`, the typed base of the store's topic mixins
(:mod:`._store_restores`, :mod:`._store_offload`, :mod:`._store_completions`,
:mod:`._store_views`): the store's attributes and the record-machine calls of
:mod:`.store` they make, declared for mypy."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from pagedstate.spec.ops import UnitRuns, run_units
from pagedstate.spec.tables import Row, Table
from pagedstate.spec.types import (
    CheckpointRestoreOp,
    CompletionToken,
    PagedStateCheckpointSpec,
    StateStoreOperationId,
)

from .pool import UnitPool

#: Where row hits are recorded: a set of ``(machine, row index)``.
RowSink = set[tuple[str, int]]
#: ``on_transition(machine, row, subject)``: called after each applied table row (its
#: effects done, and a begun store already in flight). The store is in the middle of a
#: call: the hook must neither raise nor call the store (the event log only records).
TransitionHook = Callable[[str, Row, object], None]


#: An outstanding completion (SPEC D.13, B.3 row 24): the batch's token and the checkpoint
#: ids it published unsettled, in publish order (ids of records released since are kept;
#: the settle skips them).
_Completion = tuple[CompletionToken, list[int]]


class _Record:
    __slots__ = ("prefix_hash", "runs", "phase", "pin_count", "stamp", "settled")

    def __init__(
        self,
        prefix_hash: int,
        runs: UnitRuns,
        phase: str,
        pin_count: int = 0,
        settled: bool = True,
    ) -> None:
        self.prefix_hash = prefix_hash
        #: The image's units as maximal runs in piece order (SPEC A.5).
        self.runs = runs
        self.phase = phase
        self.pin_count = pin_count
        #: LRU recency stamp (see ``_CID_BITS`` in :mod:`.store`); meaningful while READY
        #: (larger is more recent).
        self.stamp = 0  # pragma: no mutate (the row to READY stamps it before it is read)
        #: Whether the copy that made the image is known done (SPEC D.13): False while
        #: COPYING and while an outstanding completion lists the record.
        self.settled = settled

    @property
    def unit_ids(self) -> tuple[int, ...]:
        """The image's unit ids in piece order. O(units)."""
        return run_units(self.runs)

    def copy(self) -> _Record:
        c = _Record(self.prefix_hash, self.runs, self.phase, self.pin_count, self.settled)
        c.stamp = self.stamp
        return c


class _OffloadPin:
    __slots__ = ("checkpoint_id", "pinned_at", "source_released", "reclaimable")

    def __init__(
        self, cid: int, pinned_at: float, source_released: bool, reclaimable: bool
    ) -> None:
        self.checkpoint_id = cid
        self.pinned_at = pinned_at
        self.source_released = source_released
        self.reclaimable = reclaimable

    def copy(self) -> _OffloadPin:
        return _OffloadPin(
            self.checkpoint_id, self.pinned_at, self.source_released, self.reclaimable
        )


def _deferring(pool: Any, *, undo_on_error: bool = False) -> AbstractContextManager[Any]:
    """``pool.deferred_evictions()`` where the pool offers it (see :mod:`.pool`)."""
    # equivalent mutants: the general path does the same, slower
    if type(pool) is UnitPool and not undo_on_error:  # pragma: no mutate
        return pool._deferral
    defer = getattr(pool, "deferred_evictions", None)
    if defer is None:
        return nullcontext()
    context: AbstractContextManager[Any] = defer(undo_on_error=True) if undo_on_error else defer()
    return context


def _as_store(pool: Any) -> AbstractContextManager[Any]:
    """``pool._as_store()`` where the pool offers it: the store is calling, so the pool
    accepts store owners (SPEC A.3; see :mod:`.pool`)."""
    access = getattr(pool, "_as_store", None)
    if access is None:
        return nullcontext()
    context: AbstractContextManager[Any] = access()
    return context


class _StoreBase:
    """The attributes of :class:`~.store.PageUnitCheckpointStore` (its constructor sets and
    explains them) and the calls of :mod:`.store` that its mixins make, declared for mypy
    only: nothing here exists at run time."""

    pool: UnitPool
    spec: PagedStateCheckpointSpec
    _units: int
    clock: Callable[[], float]
    row_sink: RowSink | None
    on_transition: TransitionHook | None
    records: dict[int, _Record]
    hash_to_checkpoint: dict[int, int]
    _pending_by_hash: dict[int, int]
    _lru: OrderedDict[int, None]
    _stamp: int
    _victims: list[int]
    _num_evictable: int
    _inflight_stores: list[int]
    _queued_restores: dict[int, tuple[int, CheckpointRestoreOp]]
    _inflight_restores: list[tuple[int, CheckpointRestoreOp]]
    _inflight_slots: set[int]
    _suspended: dict[int, tuple[int, CheckpointRestoreOp]]
    _suspended_slots: dict[int, int]
    _next_lease_id: int
    _next_checkpoint_id: int
    _transfer_grant: bool
    evictions: int
    generation: int
    _change_log_size: int
    _changes: deque[tuple[int, int | None]]
    _offload_sink: bool
    _offload_ready: deque[int]
    _offload_backlog_cap: int
    offload_nominations_dropped: int
    _offload_pins: dict[StateStoreOperationId, _OffloadPin]
    _op_hashes: set[int]
    _reclaimable: OrderedDict[StateStoreOperationId, None]
    _reclaim_in_order: bool
    _offload_generation: int
    offload_pins_reclaimed: int
    _forfeited: dict[StateStoreOperationId, None]
    _forfeit_heap: list[tuple[int, StateStoreOperationId]]
    _forfeit_bound: int
    _forfeit_watermark: int
    _completions: list[_Completion]

    if TYPE_CHECKING:

        def lookup(self, prefix_hash: int) -> int: ...

        def contains_or_pending(self, prefix_hash: int) -> bool: ...

        def _took(self, table: Table, row: Row, subject: object) -> None: ...

        def _apply(self, cid: int, rec: _Record, row: Row) -> None: ...

        def _refresh(self, cid: int, rec: _Record) -> None: ...

        def _unpin(self, cid: int, kind: str) -> None: ...

        def _poll(self) -> list[bool]: ...

        def _settle(self, answers: list[bool]) -> int: ...

        def _will_settle(self, cid: int, rec: _Record, answers: list[bool]) -> bool: ...

        def _queue_offload_store(self, cid: int) -> None: ...
