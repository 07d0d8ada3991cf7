"""What the scheduler side of the connector sends the worker side for one vLLM step, and
what the worker sends back. Plain attrs classes of ints and pagedstate ops: they are pickled
with vLLM's ``SchedulerOutput`` when the engine runs in several processes.
"""

from __future__ import annotations

import attrs

from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp

__all__ = ["StepPlan", "StepReport"]


@attrs.frozen
class StepPlan:
    """The copies that ride one vLLM step, run by the worker after the step's forward
    (``wait_for_save``), in this order: KV pages saved, the drain's image stores and
    restores (and the scrub), KV pages loaded.

    Attributes:
        step: the step's id (0, 1, ...), reported back when the copies ran.
        stores: the drain's store ops (connector slot -> pool units).
        restores: the drain's restore ops (pool units -> connector slot).
        slot_blocks: for each connector slot an op of this step names, vLLM's state block
            id in each recurrent group (in :attr:`TierLayout.recurrent_groups` order).
        kv_saves: ``(vllm_block, unit)`` pairs: the attention block's page of every
            attention layer is copied into pool unit ``unit``.
        kv_loads: ``(unit, vllm_block)`` pairs: pool unit into the attention block.
        scrub: pool units to zero (SPEC G10: freed image units).
        loaded: request ids whose loads (restore and KV pages) are all in this plan; the
            worker reports them as received once the copies ran.
    """

    step: int
    stores: tuple[CheckpointStoreOp, ...] = ()
    restores: tuple[CheckpointRestoreOp, ...] = ()
    slot_blocks: dict[int, tuple[int, ...]] = attrs.field(factory=dict)
    kv_saves: tuple[tuple[int, int], ...] = ()
    kv_loads: tuple[tuple[int, int], ...] = ()
    scrub: tuple[int, ...] = ()
    loaded: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing to copy and nothing to report."""
        return not (
            self.stores
            or self.restores
            or self.kv_saves
            or self.kv_loads
            or self.scrub
            or self.loaded
        )


@attrs.frozen
class StepReport:
    """What the worker ran: the step ids whose copies were issued, in order."""

    steps: tuple[int, ...] = ()
