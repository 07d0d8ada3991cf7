"""The worker side of the vLLM connector: the tier's pool memory and the copies of a step.

The pool's units live here, one tensor per attention layer (``[num_units, page_bytes / 2]``
bf16, pagedstate's KV page layout). vLLM's own cache is reached through the tensors
``register_kv_caches`` hands over: on the CPU build every layer is a view over one buffer,
a recurrent layer as ``int8 [num_blocks, ..., state_bytes]`` (conv state at byte 0, SSM
state after it) and an attention layer as its ``[num_blocks, ...]`` page tensor, each block
``page_size_padded`` bytes apart (docs/vllm.md).

:class:`VllmStateTensors` is the adapter: a :class:`~pagedstate.gpu.tensors.StateTensors`
whose slot tensor ``2 i`` / ``2 i + 1`` rows are layer ``i``'s conv / SSM ranges of every
vLLM block, and whose slots are the connector's slot ids, translated per step into each
recurrent group's state block (:attr:`~.plan.StepPlan.slot_blocks`). :class:`VllmCopyExecutor`
is pagedstate's torch executor over it: the same validation (layout id, sizes, unit and slot
ranges, the whole-batch hazard check, SPEC E.4-E.5), the same plan, one vectorized pass per
span, with each slot tensor indexed by the vLLM block of its layer's group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedstate.gpu.executor import TorchCopyExecutor
from pagedstate.gpu.tensors import StateTensors, _torch
from pagedstate.spec.errors import InvalidArgumentError

from .layout import TierLayout
from .plan import StepPlan

__all__ = ["TierWorker", "VllmCopyExecutor", "VllmStateTensors", "byte_rows"]


def byte_rows(t: Any, offset: int, nbytes: int) -> Any:
    """``t``'s bytes ``[offset, offset + nbytes)`` of every block as a uint8 view
    ``[num_blocks, nbytes]``, blocks ``t.stride(0) * itemsize`` bytes apart (writes go to
    ``t``'s memory).

    Raises:
        InvalidArgumentError: the range does not fit in one block."""
    torch = _torch()
    item = t.element_size()
    stride = t.stride(0) * item
    if offset < 0 or offset + nbytes > stride:
        raise InvalidArgumentError(
            f"bytes [{offset}, {offset + nbytes}) do not fit in a block of {stride} B"
        )
    raw = torch.empty(0, dtype=torch.uint8, device=t.device)
    raw.set_(t.untyped_storage())
    return raw.as_strided((t.shape[0], nbytes), (stride, 1), t.storage_offset() * item + offset)


class VllmStateTensors(StateTensors):
    """pagedstate's tensors over vLLM's registered caches (see the module doc).

    Args:
        tl: the tier layout.
        kv_caches: ``register_kv_caches``' dict, layer name -> tensor (a recurrent layer's
            entry may also be a ``[conv, ssm]`` pair of views).
        num_units: the tier's pool size; its unit tensors are allocated here.
        num_slots: connector slots.

    Raises:
        InvalidArgumentError: a layer of the layout is missing, or its blocks are too small.
    """

    def __init__(
        self, tl: TierLayout, kv_caches: Mapping[str, Any], num_units: int, num_slots: int
    ) -> None:
        torch = _torch()
        layout = tl.layout
        self.tl = tl
        self.layout = layout
        self.num_slots = num_slots
        self.num_blocks = num_units
        rows: list[Any] = []
        self.slot_group: list[int] = []  # slot tensor -> index into tl.recurrent_groups
        device = None
        for layer in tl.recurrent:
            t = kv_caches.get(layer.name)
            if t is None:
                raise InvalidArgumentError(f"vLLM registered no cache for layer {layer.name}")
            if isinstance(t, (list, tuple)):
                conv = byte_rows(t[0], 0, layer.conv_bytes)
                ssm = byte_rows(t[1], 0, layer.ssm_bytes)
            else:
                conv = byte_rows(t, layer.conv_offset, layer.conv_bytes)
                ssm = byte_rows(t, layer.ssm_offset, layer.ssm_bytes)
            device = conv.device
            rows += [conv, ssm]
            self.slot_group += [tl.recurrent_groups.index(layer.group)] * 2
        self.vllm_pages: list[Any] = []
        for name in tl.attention_layers:
            t = kv_caches.get(name)
            if t is None:
                raise InvalidArgumentError(f"vLLM registered no cache for layer {name}")
            self.vllm_pages.append(byte_rows(t, 0, tl.page_bytes))
        self.device = torch.device(device)
        self.slot_tensors = []
        self.kv_tensors = [
            torch.zeros((num_units, b // 2), dtype=torch.bfloat16, device=self.device)
            for b in layout.region_bytes
        ]
        self._slot_rows = rows
        self._kv_rows = [x.view(torch.uint8) for x in self.kv_tensors]
        self._carried = [s.carried_bytes for s in layout.slot_tensors]
        #: connector slot -> vLLM state block per recurrent group (-1: unmapped)
        self.slot_blocks = torch.full(
            (num_slots, len(tl.recurrent_groups)), -1, dtype=torch.int64, device=self.device
        )

    def map_slots(self, slot_blocks: Mapping[int, tuple[int, ...]]) -> None:
        """Point connector slots at this step's state blocks (every other slot unmapped).

        Raises:
            InvalidArgumentError: a slot out of range, a wrong number of groups, or two
                slots naming one block of a group (the hazard check reasons about slots)."""
        torch = _torch()
        self.check_slots(slot_blocks)
        self.slot_blocks.fill_(-1)
        for slot, blocks in slot_blocks.items():
            self.slot_blocks[slot] = torch.as_tensor(blocks, dtype=torch.int64)

    def check_slots(self, slot_blocks: Mapping[int, tuple[int, ...]]) -> None:
        """:meth:`map_slots`' checks alone (nothing changes).

        Raises:
            InvalidArgumentError: as :meth:`map_slots`."""
        groups = len(self.tl.recurrent_groups)
        blocks_in_vllm = self._slot_rows[0].shape[0] if self._slot_rows else 0
        seen: set[tuple[int, int]] = set()
        for slot, blocks in slot_blocks.items():
            if type(slot) is not int or not 0 <= slot < self.num_slots or len(blocks) != groups:
                raise InvalidArgumentError(f"bad slot mapping {slot!r} -> {blocks!r}")
            for g, b in enumerate(blocks):
                if type(b) is not int or not 0 <= b < blocks_in_vllm:
                    raise InvalidArgumentError(f"state block {b!r} is not a vLLM block id")
                if (g, b) in seen:
                    raise InvalidArgumentError(f"two slots name state block {b} of group {g}")
                seen.add((g, b))


class VllmCopyExecutor(TorchCopyExecutor):
    """pagedstate's torch executor over :class:`VllmStateTensors`: the same copy, with each
    slot tensor's rows taken from the vLLM state block of its layer's group for the batch's
    slots (:meth:`TorchCopyExecutor._slot_index`).

    Raises (from ``execute``): as :class:`TorchCopyExecutor`, and
    :class:`~pagedstate.spec.errors.InvalidArgumentError` for an op on a slot the step did
    not map (``TierWorker.run`` refuses such a plan before copying anything)."""

    name = "torch-vllm"

    def _slot_index(self, tensor: int, slots: Any) -> Any:
        t = self.tensors
        assert isinstance(t, VllmStateTensors)
        blocks = t.slot_blocks[slots][:, t.slot_group[tensor]]
        if bool((blocks < 0).any()):
            raise InvalidArgumentError("an op names a slot this step did not map")
        return blocks


class TierWorker:
    """Runs :class:`~.plan.StepPlan` s on the worker (see the module doc).

    Args:
        tl: the tier layout.
        kv_caches: ``register_kv_caches``' dict.
        num_units, num_slots: as the scheduler side's :class:`~.tier.PrefixTier`.
    """

    def __init__(
        self, tl: TierLayout, kv_caches: Mapping[str, Any], num_units: int, num_slots: int
    ) -> None:
        self.tensors = VllmStateTensors(tl, kv_caches, num_units, num_slots)
        self.executor = VllmCopyExecutor(self.tensors)
        self.steps_run: list[int] = []
        self.received: set[str] = set()
        self.copies = {"kv_saves": 0, "kv_loads": 0, "stores": 0, "restores": 0}

    def run(self, plan: StepPlan) -> None:
        """Run a step's copies (after its forward): KV pages saved (one page of
        ``page_bytes`` per attention layer per pair), then the drain's stores, restores and
        scrub, then KV pages loaded. The whole plan is checked before anything is copied.

        Raises:
            InvalidArgumentError: a slot mapping that is out of range or names one block
                twice, an op on a slot the plan does not map, or a KV page pair out of
                range; nothing copied.
            CopyOpError, BatchHazardError, BatchTooLargeError: the drain's ops fail
                pagedstate's batch validation (SPEC E.4-E.5); nothing copied."""
        torch = _torch()
        t = self.tensors
        dev = t.device
        # the whole plan is checked before anything is copied
        t.check_slots(plan.slot_blocks)
        for op_slot in [op.src_slot for op in plan.stores] + [op.dst_slot for op in plan.restores]:
            if op_slot not in plan.slot_blocks:
                raise InvalidArgumentError(
                    f"an op names slot {op_slot!r}, which the plan does not map"
                )
        self.executor.check(plan.stores, plan.restores, plan.scrub)
        vllm_blocks = t.vllm_pages[0].shape[0] if t.vllm_pages else 0
        for pairs, ub in ((plan.kv_saves, 1), (plan.kv_loads, 0)):
            for pair in pairs:
                unit, block = pair[ub], pair[1 - ub]
                if not (0 <= unit < t.num_blocks and 0 <= block < vllm_blocks):
                    raise InvalidArgumentError(f"a KV page copy names {pair!r}: out of range")
        if plan.kv_saves:
            src = torch.as_tensor([b for b, _ in plan.kv_saves], device=dev)
            dst = torch.as_tensor([u for _, u in plan.kv_saves], device=dev)
            for page, unit_rows in zip(t.vllm_pages, t._kv_rows, strict=True):
                unit_rows[dst] = page[src]
        if plan.stores or plan.restores or plan.scrub:
            t.map_slots(plan.slot_blocks)
            self.executor.execute(plan.stores, plan.restores, plan.scrub)
        if plan.kv_loads:
            src = torch.as_tensor([u for u, _ in plan.kv_loads], device=dev)
            dst = torch.as_tensor([b for _, b in plan.kv_loads], device=dev)
            for page, unit_rows in zip(t.vllm_pages, t._kv_rows, strict=True):
                page[dst] = unit_rows[src]
        self.copies["kv_saves"] += len(plan.kv_saves)
        self.copies["kv_loads"] += len(plan.kv_loads)
        self.copies["stores"] += len(plan.stores)
        self.copies["restores"] += len(plan.restores)
        self.steps_run.append(plan.step)
        self.received.update(plan.loaded)
