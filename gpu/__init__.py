"""Device side: model geometries, address-free copy plans, and executors that copy
checkpoint images between slot tensors and KV pages (SPEC section E).

``geometry`` and ``plan`` need only NumPy. ``tensors``, ``executor`` (the torch executor,
CPU or CUDA) need torch (the ``gpu`` extra); ``triton_copy`` (one kernel launch per batch)
needs Triton and a CUDA device, or ``TRITON_INTERPRET=1`` on a CPU.

Typical use in an engine (one call per pass, after the drain)::

    from pagedstate.gpu import load_geometry, StateTensors
    from pagedstate.gpu.executor import free_dirty_units
    from pagedstate.gpu.triton_copy import TritonCopyExecutor

    layout = load_geometry("Qwen/Qwen3-Next-80B-A3B-Instruct").layout(block_tokens=16)
    spec = layout.spec()                      # the store's PagedStateCheckpointSpec
    tensors = StateTensors(layout, num_slots, num_blocks, "cuda")
    executor = TritonCopyExecutor(tensors, max_ops_per_batch=2 * max_num_seqs)
    ...
    stores, restores = coordinator.take_checkpoint_ops()
    dirty = free_dirty_units(pool, executor.max_scrub_units)  # pagedstate.gpu.executor
    executor.execute(stores, restores, scrub_units=dirty)   # one launch
    pool.mark_clean(dirty)
"""

from typing import TYPE_CHECKING

from .geometry import CheckpointLayout, ModelGeometry, geometry_ids, load_geometry
from .plan import CopyPlan, plan_segmented_copy, write_descriptor

if TYPE_CHECKING:
    # Type checkers see the real classes; at run time they load on first use (below), so
    # importing pagedstate.gpu needs no torch.
    from .executor import TorchCopyExecutor
    from .tensors import StateTensors

__all__ = [
    "CheckpointLayout",
    "CopyPlan",
    "ModelGeometry",
    "StateTensors",
    "TorchCopyExecutor",
    "geometry_ids",
    "load_geometry",
    "plan_segmented_copy",
    "write_descriptor",
]


def __getattr__(name: str) -> object:
    # torch is optional: the torch-backed names load on first use, and stay bound in the
    # module afterwards (so ``vars(pagedstate.gpu)`` and documentation tools see them).
    value: object
    if name == "StateTensors":
        from .tensors import StateTensors as value
    elif name == "TorchCopyExecutor":
        from .executor import TorchCopyExecutor as value
    else:
        raise AttributeError(f"module 'pagedstate.gpu' has no attribute {name!r}")
    globals()[name] = value
    return value
