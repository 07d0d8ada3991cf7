"""What the production coordinator's modules share: the pending-boundary key and
:class:`_CoordinatorBase`, the typed base of the coordinator's mixins
(:mod:`._coordinator_scratch`, :mod:`._coordinator_drain`): the coordinator's attributes and
the calls of the other modules they make, declared for mypy."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from pagedstate.spec import tables as T
from pagedstate.spec.types import (
    CheckpointRestoreOp,
    CheckpointStoreOp,
    ScratchSlotPool,
    SequenceLike,
)

from .store import PageUnitCheckpointStore

#: A pending boundary's key: ``(id(seq), h)``.
_PendingKey = tuple[int, int]
#: A restore begun on behalf of a sequence (G15): ``(dst_slot, the store's queued entry,
#: seq)``. It is valid while the store's queue holds that very entry for the slot.
_RestoreOwner = tuple[int, tuple[int, CheckpointRestoreOp], SequenceLike]


class _CoordinatorBase:
    """The attributes of :class:`~.coordinator.PagedStateCheckpointCoordinator` (its
    constructor sets and explains them) and the calls its mixins make of one another,
    declared for mypy only: nothing here exists at run time."""

    enabled: bool
    readable_midstep: bool
    offload: Any
    store: PageUnitCheckpointStore
    _scratch: ScratchSlotPool | None
    _max_ops_per_batch: int
    _scratch_reserved: dict[int, tuple[int, int]]
    _scratch_queued: OrderedDict[int, int]
    _scratch_by_hash: dict[int, dict[int, None]]
    _scratch_issued: dict[int, None]
    _scratch_forwards: dict[int, int]
    _pending: dict[_PendingKey, tuple[SequenceLike, int]]
    _pending_of_seq: dict[int, _PendingKey]
    _pending_by_hash: dict[int, dict[int, None]]
    _boundary_forwards: dict[_PendingKey, int]
    _last_forward: int | None
    _restore_owners: dict[int, _RestoreOwner]
    _restore_owner_of_slot: dict[int, int]
    _store_ops: list[CheckpointStoreOp]
    _attempt: bool
    _busy: str | None
    _transfer_units: dict[Hashable, tuple[int, ...]]
    checkpoints_kept: int
    checkpoints_dropped: int
    checkpoints_orphaned: int

    if TYPE_CHECKING:

        def _took(self, table: T.Table, row: T.Row, subject: object) -> None: ...

        def _take_scratch_stores(self, budget: int, prev: int | None) -> None: ...

        def _lent_as_scratch(self, slot: int) -> bool: ...

        def _forget_restore_of(self, seq: SequenceLike, slot: int) -> None: ...

        def _clear_restore_owners(self) -> None: ...
