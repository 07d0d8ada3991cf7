"""Shared helpers of the ``pagedstate.gpu`` tests (test_gpu_*.py).

tests/conftest.py sets ``TRITON_INTERPRET=1`` (on a machine without an NVIDIA device)
before anything imports Triton, so the Triton executor runs its kernel on the CPU tensors
of these tests. :func:`executor_names` lists ``"torch"`` and, when Triton imports and its
kernel really is the interpreter's, ``"triton"``.

Sizes are kept tiny: the interpreter runs one Python loop per program, and CI has 2 cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedstate.gpu.geometry import (
    CheckpointLayout,
    ModelGeometry,
    SlotTensorInfo,
    load_geometry,
)

try:
    import torch as _torch

    # One intra-op thread: these tensors are a few KiB, and on a loaded 2-core machine a
    # second OpenMP thread turns a 34 KB torch.equal from microseconds into tens of ms.
    _torch.set_num_threads(1)
except ImportError:  # pragma: no cover - the NumPy-only tests still run
    pass

#: Triton executor settings for the interpreter, by image size: a block small enough that
#: the longest rows take several steps of the kernel's loop (exercised), large enough to
#: keep the interpreter's Python loops short. The executor's defaults run in
#: test_gpu_executor's F62 test.
TRITON_LARGE = {"block": 256, "rows_per_program": 4}
TRITON_SMALL = {"block": 8, "rows_per_program": 2}


def tiny_layout(
    tensors: Sequence[tuple[str, tuple[int, ...], int | None]], regions: Sequence[int]
) -> CheckpointLayout:
    """A hand-made layout: slot tensors ``(dtype, shape, carried_bytes or None for the whole
    row)`` and unit regions of ``regions`` bytes (even: KV pages are bf16 rows)."""
    infos = []
    for i, (dtype, shape, carried) in enumerate(tensors):
        itemsize = {"uint8": 1, "float16": 2, "bfloat16": 2, "float32": 4}[dtype]
        row = itemsize
        for d in shape:
            row *= d
        infos.append(
            SlotTensorInfo(f"t{i}", shape, dtype, row, row if carried is None else carried)
        )
    g = ModelGeometry(
        model_id=f"tiny{len(infos)}x{len(regions)}",
        recurrent_kind="test",
        num_recurrent_layers=len(infos),
        num_attention_layers=len(regions),
        conv_shape=(),
        conv_dtype="bfloat16",
        ssm_shape=(sum(i.row_bytes for i in infos),),
        ssm_dtype="bfloat16",
        kv_bytes_per_token=sum(regions),
    )
    return CheckpointLayout(g, 1, 0, tuple(infos), tuple(regions))


def small_layout(recurrent_layers: int = 2, spec_tokens: int = 1) -> CheckpointLayout:
    """A slice of a real geometry: Qwen3-Next, 1 or 2 recurrent layers, 2 attention layers,
    conv_dim and heads / 32, 128-token pages. With 2 layers: image 68,608 B in 5 units of
    16,384 B (2 regions each); with 1: 34,304 B in 3 units. With ``spec_tokens`` the conv
    states have rows that are not carried."""
    g = load_geometry("Qwen3-Next").sliced(recurrent_layers, 2, 32)
    return g.layout(128, spec_tokens=spec_tokens)


def mini_layout() -> CheckpointLayout:
    """A much smaller slice, for many Triton interpreter launches: Jamba, 2 recurrent and 2
    attention layers, / 512, 32-token pages: image 1,216 B in 3 units of 512 B (Mamba1's
    conv state has no speculative rows, so the image is the whole slot)."""
    return load_geometry("Jamba").sliced(2, 2, 512).layout(32)


def triton_interpreted() -> bool:
    """Whether the Triton executor can run here: Triton imports and its kernel was made
    by the interpreter."""
    try:
        from pagedstate.gpu import triton_copy
    except ImportError:  # pragma: no cover
        return False
    if not triton_copy.triton_available():
        return False
    return type(triton_copy._copy_rows_kernel).__name__ == "InterpretedFunction"


def executor_names() -> list[str]:
    """``["torch"]`` plus ``"triton"`` when :func:`triton_interpreted`."""
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover
        return []
    return ["torch", "triton"] if triton_interpreted() else ["torch"]


def make_executor(name: str, tensors: Any, max_ops: int | None = 8, **kwargs: Any) -> Any:
    """A ``torch`` or ``triton`` executor over ``tensors`` (Triton with the chunk sizes
    above unless ``kwargs`` say otherwise)."""
    if name == "torch":
        from pagedstate.gpu import TorchCopyExecutor

        return TorchCopyExecutor(tensors, max_ops, **kwargs)
    from pagedstate.gpu.triton_copy import TritonCopyExecutor

    sizes = TRITON_LARGE if tensors.layout.image_bytes >= 16384 else TRITON_SMALL
    return TritonCopyExecutor(tensors, max_ops or 8, **{**sizes, **kwargs})


def fill_random(tensors: Any, seed: int) -> None:
    """Every byte of every tensor random (uint8 views; bit patterns, not numbers)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    for t in tensors.all_tensors():
        b = t.view(-1).view(torch.uint8)
        b.copy_(torch.randint(0, 256, b.shape, dtype=torch.uint8, generator=gen))


def snapshot(tensors: Any) -> list[Any]:
    """A copy of every tensor's bytes."""
    import torch

    return [t.view(-1).view(torch.uint8).clone() for t in tensors.all_tensors()]


def same_bytes(a: list[Any], b: list[Any]) -> bool:
    """Whether two :func:`snapshot` results are equal byte for byte."""
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
