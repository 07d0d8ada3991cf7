"""What the production coordinator's modules share: the pending-boundary key and
:class:`_CoordinatorBase`, the typed base of the coordinator's mixins
(:mod:`._coordinator_scratch`, :mod:`._coordinator_drain`): the coordinator's attributes and
the calls of the other modules they make, declared for mypy."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from pagedstate.spec import tables as T
from pagedstate.spec.types import CheckpointStoreOp, ScratchSlotPool, SequenceLike

from .store import PageUnitCheckpointStore

#: A pending boundary's key: ``(id(seq), h)``.
_PendingKey = tuple[int, int]


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
    _scratch_issued: list[int]
    _pending: dict[_PendingKey, tuple[SequenceLike, int]]
    _pending_of_seq: dict[int, _PendingKey]
    _pending_by_hash: dict[int, dict[int, None]]
    _store_ops: list[CheckpointStoreOp]
    _attempt: bool
    _busy: str | None
    _transfer_units: dict[Hashable, tuple[int, ...]]
    checkpoints_kept: int
    checkpoints_dropped: int
    checkpoints_orphaned: int

    if TYPE_CHECKING:

        def _took(self, table: T.Table, row: T.Row, subject: object) -> None: ...

        def _take_scratch_stores(self, budget: int) -> None: ...
