"""The Triton executor: one kernel launch per batch of stores, restores and scrubs.

The host builds one descriptor for the whole batch with
:func:`~pagedstate.gpu.plan.write_descriptor`, written straight into a pinned staging
buffer: stores first (``forward=True``), then restores (the same plan, ``forward=False``),
then scrub rows; each row is ``(src_addr, dst_addr, length)`` in bytes, and a scrub row has
``src_addr == 0`` (zero fill). The row count and the rows go to a static device buffer in
one non-blocking copy on the current stream, so building and uploading never synchronize
the compute stream (two staging buffers are used in turn; the host only waits for its own
upload from two batches ago), and the launch is usable under CUDA graph capture: the grid
is then the buffer's capacity and programs past the row count return at once.

The kernel runs one program per row: it turns the row's addresses into offsets from the
lowest-addressed tensor of the :class:`StateTensors` (the kernel's base pointer, so every
offset is >= 0 and pointer arithmetic stays typed) and copies the row in steps of
``block`` elements. A row is one span of the plan, at most one KV region long (SPEC E.3),
or one region of a scrubbed unit. When every address and length the layout can produce is
a multiple of 16 bytes (true for every shipped geometry: rows and pages are multiples of 16
bytes and allocations are 256-byte aligned; checked once per executor) the elements are
``int64`` pairs hinted 16-byte aligned, so loads and stores are 16-byte vectors; otherwise
bytes.

Set ``TRITON_INTERPRET=1`` to run the kernel on a CPU (the tests do, when Triton is
installed).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pagedstate.spec.errors import InvalidArgumentError

from .executor import CheckedBatch, CopyExecutorBase
from .plan import write_descriptor
from .tensors import StateTensors, _torch

__all__ = ["TritonCopyExecutor", "interpreting", "triton_available"]

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


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set (the kernel then runs on the CPU)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


if _HAVE_TRITON:

    @triton.jit
    def _copy_rows_kernel(  # pragma: no cover - runs on the device or the interpreter
        base_ptr,  # the lowest-addressed tensor: int64 elements (WIDE) or uint8
        base_addr,  # its address in bytes
        desc_ptr,  # (rows, 3) int64: src_addr (0: zero fill), dst_addr, length, in bytes
        count_ptr,  # (1,) int64: rows in use (programs past it return)
        BLOCK: tl.constexpr,  # elements per step
        WIDE: tl.constexpr,  # 8-byte elements, offsets even (16-byte vectors)
        FOR_LOOP: tl.constexpr,  # a counted loop (compiled only) instead of a while loop
        ALIGN: tl.constexpr,  # WIDE: every offset and length is a multiple of ALIGN elements
    ):
        row = tl.program_id(0).to(tl.int64)
        if row < tl.load(count_ptr):
            src = tl.load(desc_ptr + 3 * row)
            dst = tl.load(desc_ptr + 3 * row + 1)
            length = tl.load(desc_ptr + 3 * row + 2)
            if WIDE:
                d = tl.multiple_of((dst - base_addr) >> 3, ALIGN)
                s = tl.multiple_of((src - base_addr) >> 3, ALIGN)
                n = tl.multiple_of(length >> 3, ALIGN)
            else:
                d = dst - base_addr
                s = src - base_addr
                n = length
            offs = tl.arange(0, BLOCK)
            zero = src == 0
            if FOR_LOOP:
                for k in range(0, n, BLOCK):
                    idx = k + offs
                    m = idx < n
                    v = tl.load(base_ptr + s + idx, mask=m & (not zero), other=0)
                    tl.store(base_ptr + d + idx, v, mask=m)
            else:
                # A while loop: Triton's interpreter cannot take a loaded value as a
                # range() bound (it converts a 1-element array with int()).
                k = n * 0
                while k < n:
                    idx = k + offs
                    m = idx < n
                    v = tl.load(base_ptr + s + idx, mask=m & (not zero), other=0)
                    tl.store(base_ptr + d + idx, v, mask=m)
                    k += BLOCK


class TritonCopyExecutor(CopyExecutorBase):
    """One Triton kernel launch per batch (see the module doc). CUDA tensors, or any
    device under ``TRITON_INTERPRET=1``.

    Args:
        tensors: the slot and KV tensors (CUDA, or CPU under the interpreter).
        max_ops_per_batch: descriptor capacity in copies (SPEC E.5: ``2 *
            max_num_seqs``); the static buffers are sized from it.
        block: elements a program copies per step (a power of two; 8-byte elements on the
            16-byte path, bytes otherwise).
        num_warps: warps per program.
        max_scrub_units: the most units one batch may scrub (sizes the buffers).
        wide: force the 16-byte path on (True: refused unless the layout allows it) or off
            (False); None picks it when allowed.
        for_loop: copy a row with a counted loop instead of a while loop (the compiler may
            pipeline it; not runnable under the interpreter).

    Raises:
        ImportError: Triton is not installed.
        InvalidArgumentError: bad sizes, or ``wide=True`` on a layout that is not 16-byte
            aligned.
    """

    name = "triton"

    def __init__(
        self,
        tensors: StateTensors,
        max_ops_per_batch: int,
        *,
        block: int = 1024,
        num_warps: int = 4,
        max_scrub_units: int = 256,
        wide: bool | None = None,
        for_loop: bool = False,
    ) -> None:
        if not _HAVE_TRITON:
            raise ImportError("TritonCopyExecutor needs triton (a CUDA build of torch ships it)")
        if type(max_ops_per_batch) is not int or max_ops_per_batch < 1:
            raise InvalidArgumentError(
                f"max_ops_per_batch must be an int >= 1, got {max_ops_per_batch!r}"
            )
        for name, v in (
            ("block", block),
            ("num_warps", num_warps),
            ("max_scrub_units", max_scrub_units),
        ):
            if type(v) is not int or v < 0 or (v == 0 and name != "max_scrub_units"):
                raise InvalidArgumentError(f"{name} must be a positive int, got {v!r}")
        if block & (block - 1):
            raise InvalidArgumentError(f"block must be a power of two, got {block}")
        super().__init__(tensors, max_ops_per_batch)
        torch = _torch()
        self.block, self.num_warps, self.max_scrub_units = block, num_warps, max_scrub_units
        self.for_loop = bool(for_loop)
        dev = tensors.device
        r = len(self.layout.region_bytes)
        self._rows_cap = max_ops_per_batch * self.plan.num_spans + max_scrub_units * r
        size = 1 + 3 * self._rows_cap
        pin = dev.type == "cuda"
        self._stage = [torch.empty(size, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._stage_np = [x.numpy() for x in self._stage]
        self._uploaded: list[Any] = [None, None]
        self._captured: list[Any] = []  # staging buffers owned by captured graphs
        self._turn = 0
        self._dev = torch.empty(size, dtype=torch.int64, device=dev)
        everything = tensors.all_tensors()
        base = min(everything, key=lambda x: x.data_ptr())
        self._base_addr = int(base.data_ptr())
        # Every address the layout produces is a tensor's base plus multiples of row
        # strides, region strides and plan offsets and lengths: 16-byte alignment of all of
        # them makes every row 16-byte aligned.
        p = self.plan
        aligned = (
            all(x.data_ptr() % 16 == 0 for x in everything)
            and all(x.stride(0) % 16 == 0 for x in tensors._slot_rows + tensors._kv_rows)
            and not (np.concatenate((p.src_off, p.dst_off, p.length)) % 16).any()
            and all(b % 16 == 0 for b in self.layout.region_bytes)
        )
        if wide and not aligned:
            raise InvalidArgumentError("wide=True needs a layout whose rows are 16-byte aligned")
        self.wide = aligned if wide is None else wide
        # The largest power of two (in 8-byte elements, at most 16) dividing every offset
        # and length a row can have: the kernel's alignment hint on the 16-byte path.
        g = int(np.gcd.reduce(np.concatenate((p.src_off, p.dst_off, p.length, [0]))))
        for x in everything:
            g = int(np.gcd(g, x.data_ptr() - self._base_addr))
        for x in tensors._slot_rows + tensors._kv_rows:
            g = int(np.gcd(g, x.stride(0)))
        for b in self.layout.region_bytes:
            g = int(np.gcd(g, b))
        self.align = 1
        while self.align < 16 and g % (16 * self.align) == 0:
            self.align *= 2
        flat = base.view(-1).view(torch.uint8)
        self._base = flat[: flat.numel() // 8 * 8].view(torch.int64) if self.wide else flat

    def _write_rows(self, out: np.ndarray, batch: CheckedBatch) -> int:
        """Write the batch's rows into ``out`` ((capacity, 3) int64); returns the count."""
        t, plan = self.tensors, self.plan
        n = 0
        k = len(batch.store_slots) * plan.num_spans
        if k:
            write_descriptor(
                out[n : n + k],
                plan,
                t.slot_bases(batch.store_slots),
                t.unit_bases(batch.store_units),
            )
            n += k
        k = len(batch.restore_slots) * plan.num_spans
        if k:
            write_descriptor(
                out[n : n + k],
                plan,
                t.slot_bases(batch.restore_slots),
                t.unit_bases(batch.restore_units),
                forward=False,
            )
            n += k
        if len(batch.scrub_units):
            bases = t.unit_bases(batch.scrub_units.reshape(-1, 1)).reshape(-1)
            k = len(bases)
            out[n : n + k, 0] = 0
            out[n : n + k, 1] = bases
            out[n : n + k, 2] = np.tile(
                np.asarray(self.layout.region_bytes), len(batch.scrub_units)
            )
            n += k
        return n

    def _run(self, batch: CheckedBatch) -> None:
        torch = _torch()
        if len(batch.scrub_units) > self.max_scrub_units:
            raise InvalidArgumentError(
                f"{len(batch.scrub_units)} scrub units, more than max_scrub_units="
                f"{self.max_scrub_units}"
            )
        cuda = self.tensors.device.type == "cuda"
        capturing = cuda and torch.cuda.is_current_stream_capturing()
        if capturing:
            # A captured upload reads its pinned buffer at every replay: give the graph a
            # buffer of its own, never rewritten, and take no event (no sync in capture).
            buf = torch.empty_like(self._stage[0], pin_memory=True)
            self._captured.append(buf)
            stage_t = buf
        else:
            i = self._turn
            self._turn ^= 1
            if self._uploaded[i] is not None:
                self._uploaded[i].synchronize()  # our upload from two batches ago was read
            stage_t = self._stage[i]
        stage = stage_t.numpy()
        rows = self._write_rows(stage[1:].reshape(-1, 3), batch)
        stage[0] = rows
        used = 1 + 3 * rows
        timed = self.record_events and cuda and not capturing
        if timed:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        if cuda:
            self._dev[:used].copy_(stage_t[:used], non_blocking=True)
            if not capturing:
                ev = torch.cuda.Event()
                ev.record()
                self._uploaded[i] = ev
        else:
            self._dev[:used].copy_(stage_t[:used])
        grid = (self._rows_cap if capturing else rows,)
        _copy_rows_kernel[grid](
            self._base,
            self._base_addr,
            self._dev[1:],
            self._dev[:1],
            BLOCK=self.block,
            WIDE=self.wide,
            FOR_LOOP=self.for_loop,
            ALIGN=2 * self.align if self.wide else 1,
            num_warps=self.num_warps,
        )
        if timed:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.last_events = (start, end)
