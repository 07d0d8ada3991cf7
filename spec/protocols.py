"""The interfaces through which :mod:`pagedstate.models` drives a store it checks.

``models`` never imports ``impl`` or ``gpu``: the explorer, the conformance kit and the
trace validator take any object satisfying these protocols (the reference model, the
production store, or an engine's own integration). Method names, arguments and return
shapes are ATOM's (``atom/model_engine/page_unit_checkpoint.py``), so an engine can swap
implementations.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from .errors import InvalidArgumentError
from .snapshot import Snapshot
from .types import (
    CheckpointRestoreOp,
    CheckpointStoreOp,
    CompletionToken,
    OffloadIndex,
    ScratchSlotPool,
    SequenceLike,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)

__all__ = [
    "UnitPoolProtocol",
    "CheckpointStoreProtocol",
    "CoordinatorProtocol",
    "CopyExecutorProtocol",
    "need_pool",
    "need_coordinator_args",
    "need_scratch_pool",
    "need_completion",
    "need_forward",
    "need_offload_index",
    "need_slots",
]


@runtime_checkable
class UnitPoolProtocol(Protocol):
    """A pool of raw units tagged ``(owner, piece)`` (SPEC A.2, G9, G10)."""

    num_units: int

    @property
    def num_free(self) -> int: ...

    def has_free(self, n: int) -> bool: ...

    def owner_of(self, unit: int) -> tuple[Hashable, int] | None: ...

    def is_dirty(self, unit: int) -> bool: ...

    def dirty_units(self) -> frozenset[int]: ...

    def mark_clean(self, unit_ids: Iterable[int]) -> None: ...

    def reserve_units(self, count: int, owner: Hashable) -> list[int] | None: ...

    def release_units(self, unit_ids: Sequence[int], owner: Hashable) -> None: ...

    def rekey_units(
        self, unit_ids: Sequence[int], old_owner: Hashable, new_owner: Hashable
    ) -> None: ...


@runtime_checkable
class CheckpointStoreProtocol(Protocol):
    """The checkpoint store (SPEC B)."""

    @property
    def pool(self) -> UnitPoolProtocol: ...

    @property
    def units_per_checkpoint(self) -> int: ...

    def lookup(self, prefix_hash: int) -> int: ...

    def contains(self, prefix_hash: int) -> bool: ...

    def contains_or_pending(self, prefix_hash: int) -> bool: ...

    def has_available_units(self, count: int, protected_hash: int | None = None) -> bool: ...

    def ensure_free_units(self, count: int) -> bool: ...

    def begin_store(self, prefix_hash: int, src_slot: int) -> CheckpointStoreOp | None: ...

    def complete_inflight(self, completion: CompletionToken | None = None) -> None: ...

    def begin_restore(self, prefix_hash: int, dst_slot: int) -> CheckpointRestoreOp | None: ...

    def take_restore_ops(self) -> tuple[CheckpointRestoreOp, ...]: ...

    def cancel_queued_restore(self, dst_slot: int) -> None: ...

    def restore_queued_for(self, dst_slot: int) -> bool: ...

    def suspend_queued_restore(self, dst_slot: int) -> SuspendedCheckpointRestore | None: ...

    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None: ...

    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None: ...

    def unindex(self, prefix_hash: int) -> bool: ...

    def clear(self) -> None: ...

    def adopt_units(self, unit_ids: tuple[int, ...], owner: Hashable, prefix_hash: int) -> bool: ...

    def changed_since(self, generation: int) -> set[int] | None: ...

    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]: ...

    def acquire_checkpoint_source(
        self, prefix_hash: int, *, max_inflight: int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None: ...

    def release_offload_store_source(self, op: StateStoreOperationId) -> None: ...

    def settle_offload_store(self, op: StateStoreOperationId) -> None: ...

    def has_offload_pins(self) -> bool: ...

    def reclaim_stale_offload_pins(self, timeout_s: float) -> int: ...

    def was_reclaimed(self, op: StateStoreOperationId) -> bool: ...

    def settle_completions(self, wait: bool = False) -> int: ...

    def outstanding(self) -> dict[str, int]: ...

    def snapshot(self) -> Snapshot: ...


@runtime_checkable
class CoordinatorProtocol(Protocol):
    """The coordinator (SPEC D): everything both coordinators expose to an engine.

    Store-level calls that ATOM's coordinator does not forward (``lookup``,
    ``contains_or_pending``, ``changed_since``, ``cancel_queued_restore``, ...) are reached
    through :attr:`store`; the pool (KV reservations, dirty units) through :attr:`pool`.
    Not listed: ``clone``, ``row_sink`` and ``store_class``, hooks for the checkers.
    """

    @property
    def pool(self) -> UnitPoolProtocol:
        """The unit pool the store reserves from (shared with the engine's KV)."""
        ...

    @property
    def store(self) -> CheckpointStoreProtocol:
        """The checkpoint store (SPEC B)."""
        ...

    @property
    def enabled(self) -> bool:
        """Prefix caching is on and the model has per-request state."""
        ...

    @property
    def readable_midstep(self) -> bool:
        """The backend exposes interior states (midstep scratch stores)."""
        ...

    @property
    def offload(self) -> Any:
        """The CPU tier's index (``could_serve(h)``), or None (``attach_offload``)."""
        ...

    @property
    def successor_room(self) -> float:
        """Room a copy needs in a successor forward: 0.0 (SPEC D)."""
        ...

    @property
    def checkpoints_kept(self) -> int:
        """Stores begun (SPEC D.1 step 13)."""
        ...

    @property
    def checkpoints_dropped(self) -> int:
        """Stores refused or superseded (SPEC D.1 step 13)."""
        ...

    @property
    def checkpoints_orphaned(self) -> int:
        """``unindex`` calls that removed something (SPEC D.1 step 13)."""
        ...

    def applies(self, seq: SequenceLike) -> bool: ...

    def attach_midstep_scratch(
        self, slot_pool: ScratchSlotPool, max_ops_per_batch: int
    ) -> None: ...

    def reserve_midstep(
        self, seq: SequenceLike, positions: list[tuple[int, int]]
    ) -> list[tuple[int, int, int]]: ...

    def publish_midstep(
        self,
        reservations: list[tuple[int, int, int]],
        seq: Any = None,
        *,
        forward: int | None = None,
    ) -> None: ...

    def cancel_midstep(self, reservations: list[tuple[int, int, int]]) -> None: ...

    def resumable_hit(
        self,
        seq: SequenceLike,
        hit: int,
        block_hashes: list[int] | tuple[int, ...],
        assume_checkpointed: bool = False,
    ) -> int: ...

    def checkpoint(
        self,
        seq: SequenceLike,
        boundary_blocks: int,
        h: int,
        *,
        forward: int | None = None,
        computed_blocks: int | None = None,
    ) -> None: ...

    def forget_pending(self, seq: SequenceLike) -> None: ...

    def restore_queued_for(self, dst_slot: int) -> bool: ...

    def begin_restore(self, h: int, dst_slot: int, *, seq: SequenceLike | None = None) -> bool: ...

    def take_checkpoint_ops(
        self, *, forward: int | None = None
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]: ...

    def complete_previous_batch(self, completion: CompletionToken | None = None) -> None: ...

    @property
    def last_forward(self) -> int | None:
        """The forward id of the latest drain (None before the first), SPEC D.13."""
        ...

    @property
    def next_forward(self) -> int:
        """The forward id a drain without ``forward=`` takes: ``last_forward + 1``, or 0."""
        ...

    def settle_completions(self, wait: bool = False) -> int: ...

    def outstanding(self) -> dict[str, int]: ...

    def is_idle(self) -> bool: ...

    def has_available_units(self, count: int, protected_hash: int | None = None) -> bool: ...

    def ensure_free_units(self, count: int) -> bool: ...

    def reserve_transfer_units(self, owner: Hashable) -> tuple[int, ...] | None: ...

    def release_transfer_units(self, owner: Hashable) -> None: ...

    def adopt_transfer_units(self, owner: Hashable, prefix_hash: int) -> bool: ...

    def suspend_queued_restore(self, dst_slot: int) -> SuspendedCheckpointRestore | None: ...

    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None: ...

    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None: ...

    def contains(self, h: int) -> bool: ...

    def attach_offload(self, index: Any, *, sink: bool = True) -> None: ...

    def take_offload_stores(
        self, max_inflight: int
    ) -> list[tuple[StateStoreOperationId, tuple[int, ...]]]: ...

    def acquire_checkpoint_source(
        self, prefix_hash: int, *, max_inflight: int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None: ...

    def release_offload_store_source(self, op: StateStoreOperationId) -> None: ...

    def settle_offload_store(self, op: StateStoreOperationId) -> None: ...

    def has_offload_pins(self) -> bool: ...

    def reclaim_stale_offload_pins(self, timeout_s: float) -> int: ...

    def was_reclaimed(self, op: StateStoreOperationId) -> bool: ...

    def unindex(self, h: int) -> None: ...

    def clear_index(self) -> None: ...

    def checkpoint_fates(self) -> dict[str, int]: ...

    def snapshot(self) -> Snapshot: ...


def need_pool(pool: object) -> None:
    """Check, at construction, that ``pool`` is a unit pool (:class:`UnitPoolProtocol`):
    both stores call it, so a wrong object fails there and not at the first drain.

    Raises:
        InvalidArgumentError: ``pool`` lacks a member of :class:`UnitPoolProtocol`.
    """
    if not isinstance(pool, UnitPoolProtocol):
        raise InvalidArgumentError(
            f"pool must be a unit pool (num_units, num_free, has_free, reserve_units,"
            f" release_units, rekey_units, owner_of, is_dirty, dirty_units, mark_clean),"
            f" got {pool!r}"
        )


def need_scratch_pool(slot_pool: object, attached: object, slots_out: int) -> None:
    """Check an ``attach_midstep_scratch`` argument: ``slot_pool`` is a scratch slot pool
    (:class:`~pagedstate.spec.types.ScratchSlotPool`), and it is the ``attached`` pool
    unless none of that pool's slots are out (``slots_out``: reserved, queued or issued;
    they go back to the pool they came from). Both coordinators call it, so they refuse
    with the same message.

    Raises:
        InvalidArgumentError: ``slot_pool`` lacks ``has_free``, ``pop`` or ``release``, or
            is another pool while ``slots_out > 0``.
    """
    if not isinstance(slot_pool, ScratchSlotPool):
        raise InvalidArgumentError(
            f"slot_pool must offer has_free, pop and release, got {slot_pool!r}"
        )
    if slot_pool is not attached and slots_out:
        raise InvalidArgumentError(
            f"slot_pool: {slots_out} scratch slot(s) of the attached pool are out (reserved,"
            " queued or issued); they must go back to it before another pool is attached"
            " (complete the batch, cancel the reservations)"
        )


@runtime_checkable
class CopyExecutorProtocol(Protocol):
    """What copies a batch's images on real tensors (``pagedstate.gpu``'s executors, or an
    engine's own): the ops one drain returned, executed together (SPEC E.5).

    ``execute`` validates the whole batch before writing anything (layout id, total bytes,
    unit count, unit and slot ranges, duplicate units, and that no two ops touch the same
    bytes) and raises :class:`~pagedstate.spec.errors.CopyOpError` (a ``RuntimeError``),
    :class:`~pagedstate.spec.errors.BatchHazardError` or
    :class:`~pagedstate.spec.errors.BatchTooLargeError` with nothing written. Stores copy
    a slot's carried bytes into its units (unit-major, region-minor); restores copy them
    back; ``scrub_units`` are zero-filled in the same batch (SPEC G10).
    """

    def execute(
        self,
        stores: Sequence[CheckpointStoreOp] = (),
        restores: Sequence[CheckpointRestoreOp] = (),
        scrub_units: Iterable[int] = (),
    ) -> None: ...


def need_coordinator_args(enabled: object, offload: object, readable_midstep: object) -> None:
    """Check a coordinator's constructor arguments (both coordinators call it).

    Raises:
        InvalidArgumentError: ``enabled`` or ``readable_midstep`` is not a bool, or
            ``offload`` is neither None nor an :class:`~pagedstate.spec.types.OffloadIndex`
            (it must have ``could_serve(prefix_hash)``).
    """
    for name, value in (("enabled", enabled), ("readable_midstep", readable_midstep)):
        if type(value) is not bool:
            raise InvalidArgumentError(f"{name} must be a bool, got {value!r}")
    need_offload_index("offload", offload)


def need_offload_index(name: str, index: object) -> None:
    """Check an offload index argument (the constructor's ``offload``, ``attach_offload``'s
    ``index``): ``None`` or an :class:`~pagedstate.spec.types.OffloadIndex`.

    Raises:
        InvalidArgumentError: it is neither.
    """
    if index is not None and not isinstance(index, OffloadIndex):
        raise InvalidArgumentError(
            f"{name} must be None or have could_serve(prefix_hash) (OffloadIndex), got {index!r}"
        )


def need_slots(slots: object) -> list[int]:
    """Check a slot pool's slots (both ``SlotPool`` classes): an iterable of distinct ints
    ``>= 0`` (not bools). Returns them as a list.

    Raises:
        InvalidArgumentError: not iterable, an entry that is no int ``>= 0``, or a repeat.
    """
    try:
        items = list(slots)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidArgumentError(
            f"slots must be an iterable of ints >= 0, got {slots!r}"
        ) from None
    for s in items:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise InvalidArgumentError(f"a slot must be an int >= 0, got {s!r}")
    if len(set(items)) != len(items):
        raise InvalidArgumentError(f"slots repeat: {sorted(items)}")
    return [int(s) for s in items]


def need_completion(completion: object) -> None:
    """Check a completion token argument (SPEC D.13): ``None`` or a
    :class:`~pagedstate.spec.types.CompletionToken` (callable ``query`` and
    ``synchronize``). Both stores call it before anything changes.

    Raises:
        InvalidArgumentError: ``completion`` is neither.
    """
    if completion is not None and not (
        callable(getattr(completion, "query", None))
        and callable(getattr(completion, "synchronize", None))
    ):
        raise InvalidArgumentError(
            "completion must be None or have query() and synchronize() (a CUDA event, or"
            f" pagedstate.spec.ManualCompletion), got {completion!r}"
        )


def need_forward(name: str, forward: object) -> int | None:
    """Check a forward id argument (SPEC D.13): ``None`` or an int >= 0 (not a bool; an
    integer type such as a NumPy integer is converted). Returns it as a plain int.

    Raises:
        InvalidArgumentError: ``forward`` is neither.
    """
    if forward is None:
        return None
    try:
        value = -1 if isinstance(forward, bool) else operator.index(forward)  # type: ignore[arg-type]
    except TypeError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(f"{name} must be None or an int >= 0, got {forward!r}")
    return value
