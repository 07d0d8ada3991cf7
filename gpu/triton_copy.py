"""The Triton executor: one kernel launch per batch of stores, restores and scrubs.

The host builds one descriptor for the whole batch (the rows
:func:`~pagedstate.gpu.plan.write_descriptor` gives, computed from per-span affine tables
made once per executor), written straight into a pinned staging buffer: stores first, then
restores (the same plan read backwards: source and destination swapped), then scrub rows;
each row is ``(src_addr, dst_addr, length)`` in bytes, and a scrub row has ``src_addr == 0``
(zero fill). The row count and the rows go to a device buffer in one non-blocking copy on a
side stream; the compute stream waits for it on the device, so building and uploading never
synchronize the compute stream and the upload overlaps the previous batch's kernel. Two
staging and two device buffers are used in turn: the side stream waits (on the device) for
the kernel that last read its device buffer, and the host waits only for its own upload from
two batches ago. Under CUDA graph capture the launch gets buffers of its own and stays on
the capturing stream; the grid is then sized for the buffer's capacity and rows past the
count are skipped.

The kernel gives each program ``rows_per_program`` rows, copied side by side as a 2-D tile
(``rows x block`` elements per step), so the descriptor loads of several rows are paid
together and many bytes are in flight per program. Addresses become offsets from the lowest-
addressed tensor of the :class:`StateTensors` (the kernel's base pointer, so every offset is
>= 0 and pointer arithmetic stays typed). A row is one span of the plan, at most one KV
region long (SPEC E.3), or one region of a scrubbed unit. When every address and length the
layout can produce is a multiple of 16 bytes (true for every shipped geometry: rows and
pages are multiples of 16 bytes and allocations are 256-byte aligned; checked once per
executor) the elements are ``int64``, hinted aligned, so loads and stores are 16-byte
vectors; otherwise bytes.

Set ``TRITON_INTERPRET=1`` to run the kernel on a CPU (the tests do, when Triton is
installed).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pagedstate.spec.errors import InvalidArgumentError

from .executor import CheckedBatch, CopyExecutorBase
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
        count_ptr,  # (1,) int64: rows in use (rows past it are skipped)
        ROWS: tl.constexpr,  # rows per program, copied side by side
        BLOCK: tl.constexpr,  # elements per row per step
        WIDE: tl.constexpr,  # 8-byte elements, offsets even (16-byte vectors)
        FOR_LOOP: tl.constexpr,  # a counted loop (compiled only) instead of a while loop
        ALIGN: tl.constexpr,  # WIDE: every offset and length is a multiple of ALIGN elements
    ):
        r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        live = r < tl.load(count_ptr)
        src = tl.load(desc_ptr + 3 * r, mask=live, other=0)
        dst = tl.load(desc_ptr + 3 * r + 1, mask=live, other=0)
        length = tl.load(desc_ptr + 3 * r + 2, mask=live, other=0)
        if WIDE:
            d = tl.multiple_of((dst - base_addr) >> 3, ALIGN)
            s = tl.multiple_of((src - base_addr) >> 3, ALIGN)
            n = tl.multiple_of(length >> 3, ALIGN)
        else:
            d = dst - base_addr
            s = src - base_addr
            n = length
        copy = (src != 0)[:, None]  # a zero source means: fill with zeros
        s2 = s[:, None]
        d2 = d[:, None]
        n2 = n[:, None]
        offs = tl.arange(0, BLOCK)[None, :]
        longest = tl.max(n, axis=0)
        if FOR_LOOP:
            for k in range(0, longest, BLOCK):
                idx = k + offs
                m = idx < n2
                v = tl.load(base_ptr + s2 + idx, mask=m & copy, other=0)
                tl.store(base_ptr + d2 + idx, v, mask=m)
        else:
            # A while loop: Triton's interpreter cannot take a loaded value as a range()
            # bound (it converts a 1-element array with int()).
            k = longest * 0
            while k < longest:
                idx = k + offs
                m = idx < n2
                v = tl.load(base_ptr + s2 + idx, mask=m & copy, other=0)
                tl.store(base_ptr + d2 + idx, v, mask=m)
                k += BLOCK


class TritonCopyExecutor(CopyExecutorBase):
    """One Triton kernel launch per batch (see the module doc). CUDA tensors, or any
    device under ``TRITON_INTERPRET=1``.

    Args:
        tensors: the slot and KV tensors (CUDA, or CPU under the interpreter).
        max_ops_per_batch: descriptor capacity in copies (SPEC E.5: ``2 *
            max_num_seqs``); the static buffers are sized from it.
        block: elements a program copies per row per step (a power of two; 8-byte elements
            on the 16-byte path, bytes otherwise).
        rows_per_program: descriptor rows one program copies side by side (a power of two).
        num_warps: warps per program.
        max_scrub_units: the most units one batch may scrub (sizes the buffers; more is
            refused with ``BatchTooLargeError``: pass the rest to the next batch).
        wide: force the 16-byte path on (True: refused unless the layout allows it) or off
            (False); None picks it when allowed.
        for_loop: copy a row with a counted loop instead of a while loop (the compiler may
            pipeline it; not runnable under the interpreter). None: counted on CUDA, while
            under ``TRITON_INTERPRET=1``.

    The defaults (``block=512, rows_per_program=4, num_warps=4``, counted loop) are the
    variant that met the copy engine's target (>= 0.90x a device-to-device copy of the same
    bytes for batches >= 8) on every geometry in docs/gpu-benchmarks.md.

    Raises:
        ImportError: Triton is not installed.
        InvalidArgumentError: bad sizes, ``wide=True`` on a layout that is not 16-byte
            aligned, or tensors not on CUDA while ``TRITON_INTERPRET=1`` is unset.
    """

    name = "triton"

    def __init__(
        self,
        tensors: StateTensors,
        max_ops_per_batch: int,
        *,
        block: int = 512,
        rows_per_program: int = 4,
        num_warps: int = 4,
        max_scrub_units: int = 256,
        wide: bool | None = None,
        for_loop: bool | None = None,
    ) -> None:
        if not _HAVE_TRITON:
            raise ImportError("TritonCopyExecutor needs triton (a CUDA build of torch ships it)")
        if type(max_ops_per_batch) is not int or max_ops_per_batch < 1:
            raise InvalidArgumentError(
                f"max_ops_per_batch must be an int >= 1, got {max_ops_per_batch!r}"
            )
        for name, v in (
            ("block", block),
            ("rows_per_program", rows_per_program),
            ("num_warps", num_warps),
            ("max_scrub_units", max_scrub_units),
        ):
            if type(v) is not int or v < 0 or (v == 0 and name != "max_scrub_units"):
                raise InvalidArgumentError(f"{name} must be a positive int, got {v!r}")
        if (
            block & (block - 1)
            or rows_per_program & (rows_per_program - 1)
            or num_warps & (num_warps - 1)
            or block * rows_per_program > 1 << 20
            or num_warps > 32
        ):
            raise InvalidArgumentError(
                f"block, rows_per_program and num_warps must be powers of two (block *"
                f" rows_per_program <= 2**20, num_warps <= 32), got {block},"
                f" {rows_per_program}, {num_warps}"
            )
        if for_loop is not None and type(for_loop) is not bool:
            raise InvalidArgumentError(f"for_loop must be None or a bool, got {for_loop!r}")
        if tensors.device.type != "cuda" and not interpreting():
            raise InvalidArgumentError(
                f"TritonCopyExecutor needs CUDA tensors, or TRITON_INTERPRET=1 to run the kernel"
                f" on the CPU; these are on {tensors.device}"
            )
        super().__init__(tensors, max_ops_per_batch, max_scrub_units=max_scrub_units)
        torch = _torch()
        self.block, self.num_warps = block, num_warps
        self.rows_per_program = rows_per_program
        self.for_loop = (not interpreting()) if for_loop is None else bool(for_loop)
        dev = tensors.device
        r = len(self.layout.region_bytes)
        self._rows_cap = max_ops_per_batch * self.plan.num_spans + max_scrub_units * r
        size = 1 + 3 * self._rows_cap
        pin = dev.type == "cuda"
        # Two pinned staging buffers and two device buffers, used in turn. The upload runs
        # on a side stream that waits (on the device) for the kernel that last read its
        # device buffer; the compute stream waits (on the device) for the upload. The host
        # waits only for its own upload from two batches ago, before rewriting that
        # staging buffer: never for the compute stream.
        self._stage = [torch.empty(size, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._dev = [torch.empty(size, dtype=torch.int64, device=dev) for _ in range(2)]
        self._uploaded: list[Any] = [None, None]
        self._kernel_done: list[Any] = [None, None]
        self._copy_stream = torch.cuda.Stream(device=dev) if pin else None
        self._captured: list[Any] = []  # buffers owned by captured graphs
        self._turn = 0
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
        self._affine_tables()
        flat = base.view(-1).view(torch.uint8)
        self._base = flat[: flat.numel() // 8 * 8].view(torch.int64) if self.wide else flat

    def _affine_tables(self) -> None:
        """Per span, the affine maps from a copy's slot and units to the span's addresses:
        ``slot_addr = slot * s_mult + s_const`` and ``unit_addr = units[piece] * d_mult +
        d_const`` (a tensor's base plus a row stride times the index plus the span's
        offset), so a batch's rows are two broadcasts and one gather, with no per-copy
        base tables. The same rows as :func:`~pagedstate.gpu.plan.write_descriptor` over
        :meth:`StateTensors.slot_bases` / :meth:`StateTensors.unit_bases` (tested)."""
        t, p = self.tensors, self.plan
        r = len(self.layout.region_bytes)
        s_base = np.array([x.data_ptr() for x in t._slot_rows], dtype=np.int64)
        s_stride = np.array([x.stride(0) for x in t._slot_rows], dtype=np.int64)
        d_base = np.array([x.data_ptr() for x in t._kv_rows], dtype=np.int64)
        d_stride = np.array([x.stride(0) for x in t._kv_rows], dtype=np.int64)
        region = p.dst_seg % r
        self._s_mult = s_stride[p.src_seg]
        self._s_const = s_base[p.src_seg] + p.src_off
        self._piece = (p.dst_seg // r).astype(np.int64)
        self._d_mult = d_stride[region]
        self._d_const = d_base[region] + p.dst_off
        self._scrub_base = d_base
        self._scrub_stride = d_stride
        self._scrub_len = np.asarray(self.layout.region_bytes, dtype=np.int64)

    def _write_rows(self, out: np.ndarray, batch: CheckedBatch) -> int:
        """Write the batch's rows into ``out`` ((capacity, 3) int64); returns the count.
        Stores first, then restores (columns swapped: the store plan read backwards),
        then scrub rows (source 0)."""
        spans = self.plan.num_spans
        n = 0
        for slots, units, slot_col in (
            (batch.store_slots, batch.store_units, 0),
            (batch.restore_slots, batch.restore_units, 1),
        ):
            c = len(slots)
            if not c:
                continue
            rows3 = out[n : n + c * spans].reshape(c, spans, 3)
            col = rows3[:, :, slot_col]
            np.multiply(slots[:, None], self._s_mult, out=col)
            col += self._s_const
            col = rows3[:, :, 1 - slot_col]
            np.multiply(np.take(units, self._piece, axis=1), self._d_mult, out=col)
            col += self._d_const
            rows3[:, :, 2] = self.plan.length
            n += c * spans
        k = len(batch.scrub_units)
        if k:
            r = len(self._scrub_len)
            rows3 = out[n : n + k * r].reshape(k, r, 3)
            rows3[:, :, 0] = 0
            np.multiply(batch.scrub_units[:, None], self._scrub_stride, out=rows3[:, :, 1])
            rows3[:, :, 1] += self._scrub_base
            rows3[:, :, 2] = self._scrub_len
            n += k * r
        return n

    def _run(self, batch: CheckedBatch) -> None:
        torch = _torch()
        cuda = self.tensors.device.type == "cuda"
        capturing = cuda and torch.cuda.is_current_stream_capturing()
        i = self._turn
        if capturing:
            # A captured upload reads its pinned buffer, and the captured kernel its device
            # buffer, at every replay: the graph gets buffers of its own, never rewritten,
            # and everything stays on the capturing stream (no events, no side stream).
            stage_t = torch.empty_like(self._stage[0], pin_memory=True)
            dev = torch.empty_like(self._dev[0])
            self._captured.append((stage_t, dev))
        else:
            self._turn ^= 1
            if self._uploaded[i] is not None:
                self._uploaded[i].synchronize()  # our upload from two batches ago is done
            stage_t, dev = self._stage[i], self._dev[i]
        stage = stage_t.numpy()
        rows = self._write_rows(stage[1:].reshape(-1, 3), batch)
        stage[0] = rows
        used = 1 + 3 * rows
        compute = torch.cuda.current_stream() if cuda else None
        if not cuda:
            dev[:used].copy_(stage_t[:used])
        elif capturing:
            dev[:used].copy_(stage_t[:used], non_blocking=True)
        else:
            side = self._copy_stream
            assert side is not None and compute is not None
            if self._kernel_done[i] is not None:
                side.wait_event(self._kernel_done[i])
            with torch.cuda.stream(side):
                dev[:used].copy_(stage_t[:used], non_blocking=True)
                up = torch.cuda.Event()
                up.record(side)
            self._uploaded[i] = up
            compute.wait_event(up)
        timed = self.record_events and cuda and not capturing
        if timed:
            if self.hold_cycles:
                # Keep the stream busy while the host enqueues the launch below, so the
                # events time the device's work, not the host's launch overhead.
                torch.cuda._sleep(self.hold_cycles)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        cap = self._rows_cap if capturing else rows
        grid = (-(-cap // self.rows_per_program),)
        _copy_rows_kernel[grid](
            self._base,
            self._base_addr,
            dev[1:],
            dev[:1],
            ROWS=self.rows_per_program,
            BLOCK=self.block,
            WIDE=self.wide,
            FOR_LOOP=self.for_loop,
            ALIGN=2 * self.align if self.wide else 1,
            num_warps=self.num_warps,
        )
        if cuda and not capturing:
            done = torch.cuda.Event()
            done.record()
            self._kernel_done[i] = done
        if timed:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.last_events = (start, end)
