"""Executing a batch of checkpoint copies on real tensors (SPEC E.4-E.5, G10).

A batch is the ops one drain handed out: ``CheckpointStoreOp`` (slot -> units) and
``CheckpointRestoreOp`` (units -> slot), plus dirty units to zero-fill (G10). Every
executor does the same three things in the same order:

1. **Validate** every op before anything is written (:func:`validate_batch`): the layout id,
   ``total_bytes``, the unit count, unit and slot ranges, units named twice in one op
   (:class:`~pagedstate.spec.errors.CopyOpError`, a ``RuntimeError`` as in ATOM), the batch
   size (:class:`~pagedstate.spec.errors.BatchTooLargeError`), and the **hazard check**: no
   two ops of the batch touch the same bytes with at least one of them writing
   (:class:`~pagedstate.spec.errors.BatchHazardError`). A bad batch is refused whole.
2. **Plan**: the geometry's :class:`~pagedstate.gpu.plan.CopyPlan`, computed once; a restore
   is the store plan read backwards.
3. **Copy** in one launch (the Triton executor) or one vectorized pass per span (the torch
   executor), stores, restores and scrubs together: within a batch there is no order, which
   the hazard check makes safe.

Executors: :class:`TorchCopyExecutor` (CPU or CUDA, torch only) here, and
``pagedstate.gpu.triton_copy.TritonCopyExecutor`` (CUDA, one kernel launch per batch).
Both satisfy :class:`~pagedstate.spec.protocols.CopyExecutorProtocol`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import attrs
import numpy as np

from pagedstate.spec.errors import (
    BatchHazardError,
    BatchTooLargeError,
    CopyOpError,
    InvalidArgumentError,
)
from pagedstate.spec.protocols import UnitPoolProtocol
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp

from .geometry import CheckpointLayout
from .plan import CopyPlan, plan_segmented_copy
from .tensors import StateTensors, _torch

__all__ = [
    "CheckedBatch",
    "CopyExecutorBase",
    "TorchCopyExecutor",
    "free_dirty_units",
    "validate_batch",
]


@attrs.frozen
class CheckedBatch:
    """A batch that passed :func:`validate_batch`, as arrays for the copy.

    Attributes:
        store_slots, store_units: per store, its source slot and ``(U,)`` units.
        restore_slots, restore_units: per restore, its destination slot and units.
        scrub_units: the units to zero-fill, ascending.
    """

    store_slots: np.ndarray
    store_units: np.ndarray
    restore_slots: np.ndarray
    restore_units: np.ndarray
    scrub_units: np.ndarray

    @property
    def copies(self) -> int:
        """Stores plus restores."""
        return len(self.store_slots) + len(self.restore_slots)


def _check_op(
    kind: str,
    i: int,
    op: object,
    cls: type,
    layout_id: str,
    image_bytes: int,
    units: int,
    num_slots: int,
    num_blocks: int,
) -> tuple[int, tuple[int, ...]]:
    if type(op) is not cls:  # exactly the store's op classes, as the vectorized path
        raise CopyOpError(f"{kind} {i}: expected a {cls.__name__}, got {type(op).__name__}")
    if op.layout_id != layout_id:  # type: ignore[attr-defined]
        raise CopyOpError(
            f"{kind} {i}: layout_id {op.layout_id!r} is not this worker's {layout_id!r}"  # type: ignore[attr-defined]
            " (an image of another layout cannot be read or written here)"
        )
    if type(op.total_bytes) is not int or op.total_bytes != image_bytes:  # type: ignore[attr-defined]
        raise CopyOpError(
            f"{kind} {i}: total_bytes {op.total_bytes} != image_bytes {image_bytes}"  # type: ignore[attr-defined]
        )
    ids = op.unit_ids  # type: ignore[attr-defined]
    if type(ids) is not tuple or len(ids) != units:
        raise CopyOpError(f"{kind} {i}: a tuple of {units} unit ids expected, got {ids!r}")
    for u in ids:
        if type(u) is not int or not 0 <= u < num_blocks:
            raise CopyOpError(f"{kind} {i}: unit {u!r} outside [0, {num_blocks})")
    if len(set(ids)) != len(ids):
        raise CopyOpError(f"{kind} {i}: a unit is named twice in {ids!r}")
    slot = op.src_slot if kind == "store" else op.dst_slot  # type: ignore[attr-defined]
    if type(slot) is not int or not 0 <= slot < num_slots:
        raise CopyOpError(f"{kind} {i}: slot {slot!r} outside [0, {num_slots})")
    return slot, ids


def _fast_batch(
    layout: CheckpointLayout,
    stores: list[Any],
    restores: list[Any],
    scrub: list[int],
    num_slots: int,
    num_blocks: int,
) -> CheckedBatch | None:
    """The whole batch checked with NumPy, or None when anything is off (then
    :func:`_slow_batch` finds and names the first problem). O(ops) Python steps plus
    O(units) C-level passes: a batch of 256 images of 100 units checks in about a
    millisecond."""
    u = layout.units_per_checkpoint
    lid, img = layout.layout_id, layout.image_bytes
    for ops, cls in ((stores, CheckpointStoreOp), (restores, CheckpointRestoreOp)):
        for op in ops:
            if (
                type(op) is not cls
                or op.layout_id != lid
                or type(op.total_bytes) is not int
                or op.total_bytes != img
                or type(op.unit_ids) is not tuple
                or len(op.unit_ids) != u
            ):
                return None
    s_ids = [op.unit_ids for op in stores]
    r_ids = [op.unit_ids for op in restores]
    s_slots = [op.src_slot for op in stores]
    r_slots = [op.dst_slot for op in restores]
    every = chain(s_slots, r_slots, scrub, chain.from_iterable(s_ids), chain.from_iterable(r_ids))
    if not set(map(type, every)) <= {int}:  # one C-level pass; bools and floats fail here
        return None
    try:
        su = np.array(s_ids, dtype=np.int64).reshape(-1, u)
        ru = np.array(r_ids, dtype=np.int64).reshape(-1, u)
        ss = np.array(s_slots, dtype=np.int64)
        rs = np.array(r_slots, dtype=np.int64)
        sc = np.array(sorted(scrub), dtype=np.int64)
    except OverflowError:  # an int beyond int64: out of range, named by the per-op pass
        return None
    for arr, top in (
        (su, num_blocks),
        (ru, num_blocks),
        (sc, num_blocks),
        (ss, num_slots),
        (rs, num_slots),
    ):
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= top):
            return None
    # A unit named twice inside one op, written twice, or written and read.
    if len(ru) and (np.diff(np.sort(ru, axis=1), axis=1) == 0).any():
        return None
    written = np.bincount(np.concatenate((su.reshape(-1), sc)), minlength=num_blocks)
    if (written > 1).any() or (len(ru) and written[ru.reshape(-1)].any()):
        return None
    # A slot written twice, or written and read.
    if len(rs):
        if len(np.unique(rs)) != len(rs) or np.isin(rs, ss).any():
            return None
    return CheckedBatch(ss, su, rs, ru, sc)


def validate_batch(
    layout: CheckpointLayout,
    stores: Sequence[CheckpointStoreOp],
    restores: Sequence[CheckpointRestoreOp],
    scrub_units: Iterable[int] = (),
    *,
    num_slots: int,
    num_blocks: int,
    max_ops: int | None = None,
) -> CheckedBatch:
    """Check a whole batch before anything is written (SPEC E.5 step 1, F61, and the
    hazard check below). O(ops * units), vectorized.

    Hazards refused (the launch has no order, so any of these would race):
    a restore's destination slot is a store's source slot or another restore's
    destination; a store's units are another store's units, a restore's source units,
    or scrubbed; a restore's source units are scrubbed. Two stores reading one slot, or
    two restores reading one image, are reads only and allowed.

    Args:
        layout: this worker's layout (``layout_id``, ``image_bytes``, units per image).
        stores, restores: the ops of the batch.
        scrub_units: units to zero-fill in the same launch (G10).
        num_slots, num_blocks: the tensors' slot and unit counts.
        max_ops: the most copies a batch may hold (the descriptor's capacity).

    Raises:
        CopyOpError: an op is malformed or out of range (first offending op named).
        BatchHazardError: two ops touch the same bytes.
        BatchTooLargeError: more than ``max_ops`` copies.
        InvalidArgumentError: ``scrub_units`` is not an iterable of ints.
    """
    try:
        stores, restores = list(stores), list(restores)
    except TypeError:
        raise CopyOpError(
            f"stores and restores must be sequences of ops, got {stores!r} and {restores!r}"
        ) from None
    n = len(stores) + len(restores)
    if max_ops is not None and n > max_ops:
        raise BatchTooLargeError(
            f"a batch asked to copy {n} checkpoints, more than the {max_ops} its descriptor"
            " was sized for (max_ops_per_batch); nothing was copied, and the ops were already"
            " drained from the coordinator: size the executor for the largest drain,"
            " checkpoint_copy_ops_per_batch(max_num_seqs)"
        )
    try:
        scrub_given = list(scrub_units)
    except TypeError:
        raise InvalidArgumentError(
            f"scrub_units must be an iterable of ints, got {scrub_units!r}"
        ) from None
    # Types first: a set would fold True and 1.0 into an int 1 beside it.
    bad = next((x for x in scrub_given if type(x) is not int), None)
    if bad is not None or any(type(x) is not int for x in scrub_given):
        raise CopyOpError(f"scrub units must be ints, got {bad!r}")
    scrub = list(set(scrub_given))
    fast = _fast_batch(layout, stores, restores, scrub, num_slots, num_blocks)
    if fast is not None:
        return fast
    _slow_batch(layout, stores, restores, scrub, num_slots, num_blocks)
    raise AssertionError(  # pragma: no cover - the two paths disagree: a bug here
        "validate_batch: the vectorized check refused a batch the per-op check accepts"
    )


def _slow_batch(
    layout: CheckpointLayout,
    stores: list[Any],
    restores: list[Any],
    scrub_list: list[Any],
    num_slots: int,
    num_blocks: int,
) -> None:
    """The per-op check: raises naming the first problem of the batch."""
    lid, img, u = layout.layout_id, layout.image_bytes, layout.units_per_checkpoint
    s_slots: list[int] = []
    s_units: list[tuple[int, ...]] = []
    for i, op in enumerate(stores):
        slot, ids = _check_op("store", i, op, CheckpointStoreOp, lid, img, u, num_slots, num_blocks)
        s_slots.append(slot)
        s_units.append(ids)
    r_slots: list[int] = []
    r_units: list[tuple[int, ...]] = []
    for i, rop in enumerate(restores):
        slot, ids = _check_op(
            "restore", i, rop, CheckpointRestoreOp, lid, img, u, num_slots, num_blocks
        )
        r_slots.append(slot)
        r_units.append(ids)
    try:
        scrub = sorted(scrub_list)
    except TypeError:
        raise CopyOpError(f"scrub units must be ints, got {scrub_list!r}") from None
    for x in scrub:
        if type(x) is not int or not 0 <= x < num_blocks:
            raise CopyOpError(f"scrub unit {x!r} outside [0, {num_blocks})")

    written_units: dict[int, str] = {}
    for i, ids in enumerate(s_units):
        for x in ids:
            if x in written_units:
                raise BatchHazardError(
                    f"store {i} writes unit {x}, which {written_units[x]} writes"
                )
            written_units[x] = f"store {i}"
    for x in scrub:
        if x in written_units:
            raise BatchHazardError(f"scrub zeroes unit {x}, which {written_units[x]} writes")
        written_units[x] = "the scrub"
    for i, ids in enumerate(r_units):
        for x in ids:
            if x in written_units:
                raise BatchHazardError(
                    f"restore {i} reads unit {x}, which {written_units[x]} writes"
                )
    read_slots = {s: i for i, s in enumerate(s_slots)}
    written_slots: dict[int, int] = {}
    for i, s in enumerate(r_slots):
        if s in written_slots:
            raise BatchHazardError(f"restores {written_slots[s]} and {i} both write slot {s}")
        if s in read_slots:
            raise BatchHazardError(
                f"restore {i} writes slot {s}, which store {read_slots[s]} reads"
            )
        written_slots[s] = i


def free_dirty_units(pool: UnitPoolProtocol, limit: int | None = None) -> list[int]:
    """The units to scrub in the next launch (SPEC G10): dirty units that are free now, so
    they hold nobody's bytes and nobody reads them in this batch; at most ``limit`` of
    them, lowest first (pass the executor's ``max_scrub_units``: the rest stay dirty for
    the next batch). A dirty unit that was
    reserved again before its scrub keeps its flag; its new owner writes it before reading
    (a store) or asks ``pool.is_dirty(unit)`` before its first read (KV). A free unit
    parked as a cached KV block (``pool.cached_hash(unit)`` is not None, when the pool has
    ``cached_hash``) is left out: it holds a KV tenant's bytes that a prefix hit may claim
    back. Call ``pool.mark_clean(units)`` once the launch is queued. O(dirty units).

    Raises:
        InvalidArgumentError: ``limit`` is not None or an int >= 0."""
    if limit is not None and (type(limit) is not int or limit < 0):
        raise InvalidArgumentError(f"limit must be None or an int >= 0, got {limit!r}")
    cached_hash = getattr(pool, "cached_hash", None)
    units = sorted(
        u
        for u in pool.dirty_units()
        if pool.owner_of(u) is None and (cached_hash is None or cached_hash(u) is None)
    )
    return units if limit is None else units[:limit]


class CopyExecutorBase(ABC):
    """What every executor shares: the layout, the tensors, the plan, validation.

    Args:
        tensors: the slot and KV tensors to copy between.
        max_ops_per_batch: the most copies one batch may hold (SPEC E.5: ``2 *
            max_num_seqs``); None for no bound.
        tile_bytes: the plan's tile size (reported; executors choose their own grid).
        max_scrub_units: the most units one batch may scrub; None for no bound.

    Raises:
        InvalidArgumentError: ``max_ops_per_batch`` is not None or an int >= 1, or
            ``max_scrub_units`` not None or an int >= 0.
    """

    name = "base"

    def __init__(
        self,
        tensors: StateTensors,
        max_ops_per_batch: int | None = None,
        tile_bytes: int = 4096,
        *,
        max_scrub_units: int | None = None,
    ) -> None:
        if not isinstance(tensors, StateTensors):
            raise InvalidArgumentError(f"tensors must be a StateTensors, got {tensors!r}")
        if max_scrub_units is not None and (
            type(max_scrub_units) is not int or max_scrub_units < 0
        ):
            raise InvalidArgumentError(
                f"max_scrub_units must be None or an int >= 0, got {max_scrub_units!r}"
            )
        if max_ops_per_batch is not None and (
            type(max_ops_per_batch) is not int or max_ops_per_batch < 1
        ):
            raise InvalidArgumentError(
                f"max_ops_per_batch must be None or an int >= 1, got {max_ops_per_batch!r}"
            )
        self.tensors = tensors
        self.layout: CheckpointLayout = tensors.layout
        self.max_ops_per_batch = max_ops_per_batch
        self.max_scrub_units = max_scrub_units
        self.plan: CopyPlan = plan_segmented_copy(
            self.layout.src_sizes, self.layout.dst_sizes(), self.layout.image_bytes, tile_bytes
        )
        self.batches = 0
        #: When True (CUDA only), each launch records a pair of timing events around the
        #: device work in :attr:`last_events` (``make bench-gpu`` reads them).
        self.record_events = False
        self.last_events: tuple[Any, Any] | None = None
        #: With :attr:`record_events`: GPU cycles to keep the stream busy (a sleep kernel)
        #: before the start event, so that the events time device work only (benchmarks).
        self.hold_cycles = 0

    def check(
        self,
        stores: Sequence[CheckpointStoreOp],
        restores: Sequence[CheckpointRestoreOp],
        scrub_units: Iterable[int] = (),
    ) -> CheckedBatch:
        """:func:`validate_batch` against this executor's layout and tensors."""
        t = self.tensors
        batch = validate_batch(
            self.layout,
            stores,
            restores,
            scrub_units,
            num_slots=t.num_slots,
            num_blocks=t.num_blocks,
            max_ops=self.max_ops_per_batch,
        )
        cap = self.max_scrub_units
        if cap is not None and len(batch.scrub_units) > cap:
            raise BatchTooLargeError(
                f"a batch asked to scrub {len(batch.scrub_units)} units, more than the {cap}"
                " its descriptor was sized for (scrub the rest in the next batch)"
            )
        return batch

    def execute(
        self,
        stores: Sequence[CheckpointStoreOp] = (),
        restores: Sequence[CheckpointRestoreOp] = (),
        scrub_units: Iterable[int] = (),
    ) -> None:
        """Copy a batch: every store's carried slot bytes into its units, every restore's
        units into its slot's carried ranges, and zero every scrub unit's regions. Refuses
        the whole batch, writing nothing, when :meth:`check` raises. Asynchronous on CUDA
        (queued on the current stream).

        Raises:
            CopyOpError, BatchHazardError, BatchTooLargeError: see :func:`validate_batch`.
        """
        batch = self.check(stores, restores, scrub_units)
        if batch.copies or len(batch.scrub_units):
            self._run(batch)
            self.batches += 1

    @abstractmethod
    def _run(self, batch: CheckedBatch) -> None:
        """Copy a batch that passed :meth:`check` (each executor's own launch)."""


class TorchCopyExecutor(CopyExecutorBase):
    """The torch executor: CPU or CUDA, no Triton. For each span of the plan, one gather
    from the sources and one scatter into the destinations of every copy of the batch
    (advanced indexing over the batch), so its cost is O(spans) tensor operations per
    batch whatever the batch size; scrubs are one indexed fill per attention layer. It is
    the reference executor of the data-integrity tests and the "straightforward torch"
    baseline of ``make bench-gpu``.
    """

    name = "torch"

    def __init__(
        self,
        tensors: StateTensors,
        max_ops_per_batch: int | None = None,
        tile_bytes: int = 4096,
        *,
        max_scrub_units: int | None = None,
    ) -> None:
        super().__init__(tensors, max_ops_per_batch, tile_bytes, max_scrub_units=max_scrub_units)
        r = len(self.layout.region_bytes)
        p = self.plan
        self._spans = [
            (int(ss), int(so), int(ds) // r, int(ds) % r, int(do), int(ln))
            for ss, so, ds, do, ln in p.rows()
        ]

    def _slot_index(self, tensor: int, slots: Any) -> Any:
        """The rows of slot tensor ``tensor`` that hold ``slots`` (a tensor of slot ids):
        the slots themselves here; an adapter whose slots live at other rows per tensor
        (an engine's per-layer block tables) overrides this."""
        return slots

    def _run(self, batch: CheckedBatch) -> None:
        torch = _torch()
        t = self.tensors
        dev = t.device
        timed = self.record_events and dev.type == "cuda"
        if timed:
            if self.hold_cycles:
                torch.cuda._sleep(self.hold_cycles)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        slot_rows, kv_rows = t._slot_rows, t._kv_rows
        if len(batch.store_slots):
            slots = torch.as_tensor(batch.store_slots, device=dev)
            units = torch.as_tensor(batch.store_units, device=dev)
            for ss, so, piece, region, do, ln in self._spans:
                src = slot_rows[ss][self._slot_index(ss, slots), so : so + ln]
                kv_rows[region][units[:, piece], do : do + ln] = src
        if len(batch.restore_slots):
            slots = torch.as_tensor(batch.restore_slots, device=dev)
            units = torch.as_tensor(batch.restore_units, device=dev)
            for ss, so, piece, region, do, ln in self._spans:
                src = kv_rows[region][units[:, piece], do : do + ln]
                slot_rows[ss][self._slot_index(ss, slots), so : so + ln] = src
        if len(batch.scrub_units):
            idx = torch.as_tensor(batch.scrub_units, device=dev)
            for rows in kv_rows:
                rows.index_fill_(0, idx, 0)
        if timed:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.last_events = (start, end)
