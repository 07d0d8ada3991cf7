"""The Triton executor: one kernel launch per batch of stores, restores and scrubs.

The host builds one descriptor for the whole batch with
:func:`~pagedstate.gpu.plan.write_descriptor`: stores first (``forward=True``), then
restores (the same plan, ``forward=False``), then scrub rows; each row is
``(src_addr, dst_addr, length)`` in bytes, and a scrub row has ``src_addr == 0`` (zero
fill). The rows are written straight into a pinned host buffer and copied to a static
device buffer with a non-blocking copy on the current stream, so building and uploading
never synchronizes the compute stream; the row count travels in the same upload, so a
launch is also usable under CUDA graph capture (the grid is then the buffer's capacity and
programs past the count return at once).

The kernel runs one program per row **chunk**: a row of ``length`` bytes is cut into
chunks of at most ``chunk_bytes`` (a static table per batch shape, uploaded with the
descriptor), and each program copies its chunk in vector loads and stores. Addresses are
turned into offsets from the lowest-addressed tensor of the :class:`StateTensors` (passed
as the kernel's base pointer), so every offset is >= 0 and Triton's pointer arithmetic
stays typed. When every address and length of the batch is a multiple of 16 (true for
every shipped geometry: rows and pages are multiples of 16 bytes and torch allocations
are 256-byte aligned) the kernel moves 16-byte words (``int64`` pairs, hinted aligned);
otherwise it falls back to bytes.

Set ``TRITON_INTERPRET=1`` to run the kernel on a CPU (the data-integrity tests do, when
Triton is installed).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pagedstate.spec.errors import InvalidArgumentError

from .executor import CheckedBatch, CopyExecutorBase
from .plan import write_descriptor
from .tensors import StateTensors, _torch

__all__ = ["TritonCopyExecutor", "triton_available"]

try:  # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except ImportError:  # pragma: no cover
    _HAVE_TRITON = False


def triton_available() -> bool:
    """Whether Triton can be imported (a CUDA device, or ``TRITON_INTERPRET=1``, is needed
    to run the kernel)."""
    return _HAVE_TRITON


if _HAVE_TRITON:

    @triton.jit
    def _copy_chunks_kernel(  # pragma: no cover - runs on the device or the interpreter
        base_ptr,  # the lowest-addressed tensor, as int64 (WIDE) or uint8 elements
        desc_ptr,  # (rows, 3) int64: src offset, dst offset, length, in elements
        chunk_ptr,  # (chunks, 2) int64: row, start element
        count_ptr,  # (1,) int64: chunks in use (programs past it return)
        CHUNK: tl.constexpr,  # elements per chunk (a multiple of BLOCK)
        BLOCK: tl.constexpr,  # elements per vector step
        WIDE: tl.constexpr,  # elements are int64 and offsets even (16-byte words)
    ):
        pid = tl.program_id(0).to(tl.int64)
        if pid < tl.load(count_ptr):
            row = tl.load(chunk_ptr + 2 * pid)
            start = tl.load(chunk_ptr + 2 * pid + 1)
            src = tl.load(desc_ptr + 3 * row)
            dst = tl.load(desc_ptr + 3 * row + 1)
            length = tl.load(desc_ptr + 3 * row + 2)
            if WIDE:
                src = tl.multiple_of(src, 2)
                dst = tl.multiple_of(dst, 2)
                start = tl.multiple_of(start, 2)
            end = tl.minimum(length, start + CHUNK)
            offs = tl.arange(0, BLOCK)
            for k in range(0, CHUNK, BLOCK):
                idx = start + k + offs
                mask = idx < end
                if src < 0:
                    tl.store(
                        base_ptr + dst + idx,
                        tl.zeros([BLOCK], dtype=base_ptr.dtype.element_ty),
                        mask=mask,
                    )
                else:
                    v = tl.load(base_ptr + src + idx, mask=mask)
                    tl.store(base_ptr + dst + idx, v, mask=mask)


class TritonCopyExecutor(CopyExecutorBase):
    """One Triton kernel launch per batch (see the module doc). CUDA tensors, or any
    device under ``TRITON_INTERPRET=1``.

    Args:
        tensors: the slot and KV tensors (CUDA, or CPU under the interpreter).
        max_ops_per_batch: descriptor capacity in copies (SPEC E.5: ``2 *
            max_num_seqs``); required: the static buffers are sized from it.
        chunk_bytes: bytes one program copies at most (a multiple of 16 * ``block``).
        block: elements per vector step of a program (a power of two).
        num_warps: warps per program.
        max_scrub_units: the most units one batch may scrub (sizes the buffers).

    Raises:
        ImportError: Triton is not installed.
        InvalidArgumentError: bad sizes.
    """

    name = "triton"

    def __init__(
        self,
        tensors: StateTensors,
        max_ops_per_batch: int,
        *,
        chunk_bytes: int = 32768,
        block: int = 1024,
        num_warps: int = 4,
        max_scrub_units: int = 256,
    ) -> None:
        if not _HAVE_TRITON:
            raise ImportError("TritonCopyExecutor needs triton (a CUDA build of torch ships it)")
        if type(max_ops_per_batch) is not int or max_ops_per_batch < 1:
            raise InvalidArgumentError(
                f"max_ops_per_batch must be an int >= 1, got {max_ops_per_batch!r}"
            )
        for name, v in (("chunk_bytes", chunk_bytes), ("block", block), ("num_warps", num_warps)):
            if type(v) is not int or v < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {v!r}")
        if block & (block - 1) or chunk_bytes % (16 * block):
            raise InvalidArgumentError(
                f"block must be a power of two and chunk_bytes a multiple of 16 * block,"
                f" got block={block}, chunk_bytes={chunk_bytes}"
            )
        super().__init__(tensors, max_ops_per_batch)
        torch = _torch()
        self.chunk_bytes, self.block, self.num_warps = chunk_bytes, block, num_warps
        self.max_scrub_units = max_scrub_units
        dev = tensors.device
        r = len(self.layout.region_bytes)
        self._rows_cap = max_ops_per_batch * self.plan.num_spans + max_scrub_units * r
        region_max = max(self.layout.region_bytes)
        span_max = int(self.plan.length.max()) if self.plan.num_spans else 0
        per_row = -(-max(region_max, span_max) // chunk_bytes)
        self._chunks_cap = self._rows_cap * per_row
        pin = dev.type == "cuda"
        # Two pinned staging buffers, used in turn; an event per buffer says when the
        # device has read it, so the host only waits for its own upload from two batches
        # ago, never for the compute stream's kernels.
        self._stage = [
            torch.empty(
                1 + 3 * self._rows_cap + 2 * self._chunks_cap, dtype=torch.int64, pin_memory=pin
            )
            for _ in range(2)
        ]
        self._uploaded: list[Any] = [None, None]
        self._turn = 0
        self._dev = torch.empty(
            1 + 3 * self._rows_cap + 2 * self._chunks_cap, dtype=torch.int64, device=dev
        )
        # The lowest-addressed tensor is the kernel's base: every offset is >= 0.
        everything = tensors.all_tensors()
        self._base_tensor = min(everything, key=lambda x: x.data_ptr())
        self._base_addr = self._base_tensor.data_ptr()
        self._base_wide = self._base_tensor.view(-1).view(torch.uint8)
        self._aligned_tensors = all(x.data_ptr() % 16 == 0 for x in everything)

    def _rows(self, batch: CheckedBatch) -> np.ndarray:
        t, plan = self.tensors, self.plan
        parts = []
        if len(batch.store_slots):
            out = np.empty((len(batch.store_slots) * plan.num_spans, 3), dtype=np.int64)
            parts.append(
                write_descriptor(
                    out, plan, t.slot_bases(batch.store_slots), t.unit_bases(batch.store_units)
                )
            )
        if len(batch.restore_slots):
            out = np.empty((len(batch.restore_slots) * plan.num_spans, 3), dtype=np.int64)
            parts.append(
                write_descriptor(
                    out,
                    plan,
                    t.slot_bases(batch.restore_slots),
                    t.unit_bases(batch.restore_units),
                    forward=False,
                )
            )
        if len(batch.scrub_units):
            bases = t.unit_bases(batch.scrub_units.reshape(-1, 1)).reshape(-1)
            lengths = np.tile(
                np.asarray(self.layout.region_bytes, np.int64), len(batch.scrub_units)
            )
            parts.append(np.stack((np.zeros_like(bases), bases, lengths), axis=1))
        return np.concatenate(parts) if parts else np.empty((0, 3), np.int64)

    def _run(self, batch: CheckedBatch) -> None:
        torch = _torch()
        if len(batch.scrub_units) > self.max_scrub_units:
            raise InvalidArgumentError(
                f"{len(batch.scrub_units)} scrub units, more than max_scrub_units="
                f"{self.max_scrub_units}"
            )
        rows = self._rows(batch)
        zero = rows[:, 0] == 0
        wide = self._aligned_tensors and not (rows % 16).any()
        unit = 8 if wide else 1
        # Offsets from the base, in elements; a zero-fill row gets source -1.
        desc = rows.copy()
        desc[:, 0] = np.where(zero, -unit, rows[:, 0] - self._base_addr) // unit
        desc[:, 1] = (rows[:, 1] - self._base_addr) // unit
        desc[:, 2] = rows[:, 2] // unit
        chunk = self.chunk_bytes // unit
        per_row = -(-desc[:, 2] // chunk)
        row_of = np.repeat(np.arange(len(desc), dtype=np.int64), per_row)
        first = np.concatenate((np.zeros(1, np.int64), np.cumsum(per_row)[:-1]))
        start = (np.arange(len(row_of), dtype=np.int64) - first[row_of]) * chunk
        n_rows, n_chunks = len(desc), len(row_of)
        if n_rows > self._rows_cap or n_chunks > self._chunks_cap:  # pragma: no cover
            raise InvalidArgumentError("batch exceeds the executor's static buffers")
        i = self._turn
        self._turn ^= 1
        if self._uploaded[i] is not None:
            self._uploaded[i].synchronize()  # the upload from two batches ago has been read
        stage = self._stage[i].numpy()
        stage[0] = n_chunks
        d0, c0 = 1, 1 + 3 * self._rows_cap
        stage[d0 : d0 + 3 * n_rows] = desc.reshape(-1)
        stage[c0 : c0 + 2 * n_chunks] = np.stack((row_of, start), axis=1).reshape(-1)
        used = c0 + 2 * n_chunks
        dev = self._dev
        if self.tensors.device.type == "cuda":
            dev[:used].copy_(self._stage[i][:used], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._uploaded[i] = ev
        else:
            dev[:used].copy_(self._stage[i][:used])
        capturing = self.tensors.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        grid = (self._chunks_cap if capturing else n_chunks,)
        base = self._base_wide.view(torch.int64) if wide else self._base_wide
        if wide and self._base_wide.numel() % 8:  # pragma: no cover - tensors are 16-aligned
            base = self._base_wide[: self._base_wide.numel() // 8 * 8].view(torch.int64)
        _copy_chunks_kernel[grid](
            base,
            dev[d0:],
            dev[c0:],
            dev[:1],
            CHUNK=chunk,
            BLOCK=min(self.block, chunk),
            WIDE=wide,
            num_warps=self.num_warps,
        )


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set (the kernel then runs on the CPU)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"
