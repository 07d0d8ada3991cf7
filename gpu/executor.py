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
from typing import Any

from pagedstate.spec.errors import BatchTooLargeError, InvalidArgumentError
from pagedstate.spec.protocols import UnitPoolProtocol
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp

from .geometry import CheckpointLayout
from .plan import CopyPlan, plan_segmented_copy
from .tensors import StateTensors, _torch
from .validation import CheckedBatch, _layout_key, _validate, validate_batch

__all__ = [
    "CheckedBatch",
    "CopyExecutorBase",
    "TorchCopyExecutor",
    "free_dirty_units",
    "validate_batch",
]


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
        self._layout_key = _layout_key(self.layout)
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
        batch = _validate(
            self._layout_key,
            stores,
            restores,
            scrub_units,
            t.num_slots,
            t.num_blocks,
            self.max_ops_per_batch,
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
