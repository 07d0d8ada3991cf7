"""The Triton executor: one kernel launch per batch of stores, restores and scrubs.

**Descriptors on the device** (SPEC E.4, E.5 step 3). Every address a copy touches is an
affine function of the copy's slot or of one of its units, per span of the plan:
``slot_addr = slot * s_mult + s_const`` and ``unit_addr = units[piece] * d_mult +
d_const`` (a tensor's base plus a row stride times the index plus the span's offset). The
executor uploads these per-span tables, and per KV region the scrub's base, stride and
length, to the device **once**. Per batch the host uploads only the batch itself, O(ops +
runs + scrub units) integers (:meth:`TritonCopyExecutor._stage_batch`): a 4-integer
header (copies, stores, scrub units, runs), per op its slot and its first run, per run
(SPEC A.5: the maximal stretches of consecutive unit ids an op's image lies in) its first
unit and the image piece it starts at, and the scrub units. For 256 Kimi-Linear images of
one run each that is about 1,000 integers where a row descriptor had 612,000 rows.

The kernel gives each copy ``ceil(spans / rows_per_program)`` programs, so a program finds
its op by one division; each of its ``rows_per_program`` spans looks up its piece's run
(a binary search over the op's runs: no step for an op of one run), hence its unit and
both addresses, and the spans are copied side by side as a 2-D tile (``rows x block``
elements per step). Programs after the copies' zero-fill ``rows_per_program`` (unit,
region) pairs of the scrub each. :meth:`TritonCopyExecutor.rows_of_upload` is a NumPy
model of that arithmetic, tested against :func:`~pagedstate.gpu.plan.write_descriptor`
(the specification of the addresses), and the kernel's bytes against those rows.

The upload goes into a pinned staging buffer and to a device buffer in one non-blocking
copy on a side stream; the compute stream waits for it on the device, so building and
uploading never synchronize the compute stream and the upload overlaps the previous
batch's kernel. Two staging and two device buffers are used in turn: the side stream waits
(on the device) for the kernel that last read its device buffer, and the host waits only
for its own upload from two batches ago. Under CUDA graph capture the launch gets buffers
of its own and stays on the capturing stream; the grid is then sized for the capacity
(``max_ops_per_batch`` copies and ``max_scrub_units`` scrubs) and programs past the
batch's count find nothing to copy.

**Small uploads read from host memory.** An upload of at most
:attr:`TritonCopyExecutor.host_read_ints` integers (a batch of a few images: 9 integers for
one image of one run) is not copied at all: the kernel reads it straight from the pinned
staging buffer, which CUDA maps into the device's address space (unified addressing: the
device reads page-locked host memory through the same pointer). That saves the side
stream's copy and its two events (about 20 us of host time on the H200 machine's host
for one image) for a few reads over the bus in the kernel. The host then waits, before
rewriting that staging buffer two batches later, for the kernel that read it (its event,
normally long done).

Addresses are offsets from the lowest-addressed tensor of the :class:`StateTensors` (the
kernel's base pointer, so every offset is >= 0 and pointer arithmetic stays typed). A span
is at most one KV region long (SPEC E.3). When every address and length the layout can
produce is a multiple of 16 bytes (true for every shipped geometry: rows and pages are
multiples of 16 bytes and allocations are 256-byte aligned; checked once per executor) the
elements are ``int64``, hinted aligned, so loads and stores are 16-byte vectors; otherwise
bytes.

Set ``TRITON_INTERPRET=1`` to run the kernel on a CPU (the tests do, when Triton is
installed).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pagedstate.spec.errors import InvalidArgumentError

from .executor import CopyExecutorBase
from .tensors import StateTensors, _torch
from .validation import PACKED_HEADER, CheckedBatch

__all__ = ["TritonCopyExecutor", "interpreting", "triton_available", "DEFAULT_HOST_READ_INTS"]

#: :attr:`TritonCopyExecutor.host_read_ints`'s default: the largest upload (integers) the
#: kernel reads from pinned host memory instead of a copy to the device.
DEFAULT_HOST_READ_INTS = 64

try:  # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except ImportError:  # pragma: no cover
    _HAVE_TRITON = False
try:  # pragma: no cover - Triton 3.4 and later: the launch hooks the raw launch respects
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover
    _knobs = None


def triton_available() -> bool:
    """Whether Triton can be imported (a CUDA device, or ``TRITON_INTERPRET=1``, is needed
    to run the kernel)."""
    return _HAVE_TRITON


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set (the kernel then runs on the CPU)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


if _HAVE_TRITON:

    @triton.jit
    def _copy_runs_kernel(  # pragma: no cover - runs on the device or the interpreter
        base_ptr,  # the lowest-addressed tensor: int64 elements (WIDE) or uint8
        buf_ptr,  # the batch's upload, int64 (see _HEADER and TritonCopyExecutor._stage_batch)
        span_ptr,  # (6, P) int64: s_mult, s_const, piece, d_mult, d_const, length per span
        scrub_ptr,  # (3, R) int64: base, stride, length of each KV region
        P: tl.constexpr,  # spans per image
        PP: tl.constexpr,  # programs per copy: ceil(P / ROWS)
        R: tl.constexpr,  # KV regions per unit
        ROWS: tl.constexpr,  # spans (or scrub regions) per program, copied side by side
        BLOCK: tl.constexpr,  # elements per span per step
        WIDE: tl.constexpr,  # 8-byte elements, offsets even (16-byte vectors)
        FOR_LOOP: tl.constexpr,  # a counted loop (compiled only) instead of a while loop
        ALIGN: tl.constexpr,  # WIDE: every offset and length is a multiple of ALIGN elements
    ):
        pid = tl.program_id(0).to(tl.int64)
        n_ops = tl.load(buf_ptr)
        n_stores = tl.load(buf_ptr + 1)
        n_scrub = tl.load(buf_ptr + 2)
        n_runs = tl.load(buf_ptr + 3)
        lanes = tl.arange(0, ROWS)
        zero = lanes.to(tl.int64) * 0
        # Both kinds of program in one straight line, selected by masks (no `if`: the
        # alignment hints below do not survive an if's results).
        # A copy program: spans [sp, sp + ROWS) of op `op`.
        is_copy = pid < n_ops * PP
        op = pid // PP
        sp = (pid - op * PP) * ROWS + lanes
        c_live = (sp < P) & is_copy
        slot = tl.load(buf_ptr + 4 + op, mask=is_copy, other=0)
        lo = tl.load(buf_ptr + 4 + n_ops + op, mask=is_copy, other=0)
        hi = tl.load(buf_ptr + 5 + n_ops + op, mask=is_copy, other=0)
        first_ptr = buf_ptr + 5 + 2 * n_ops
        piece_ptr = first_ptr + n_runs
        piece = tl.load(span_ptr + 2 * P + sp, mask=c_live, other=0)
        # The run holding each span's piece: the last of the op's runs [lo, hi) that starts
        # at or before it (a binary search; no step for an op of one run, or a scrub).
        a = zero + lo
        b = zero + hi
        width = hi - lo
        while width > 1:
            mid = (a + b) >> 1
            go = tl.load(piece_ptr + mid) <= piece
            a = tl.where(go, mid, a)
            b = tl.where(go, b, mid)
            width = (width + 1) >> 1
        unit = tl.load(first_ptr + a, mask=c_live, other=0) + (
            piece - tl.load(piece_ptr + a, mask=c_live, other=0)
        )
        s_mult = tl.load(span_ptr + sp, mask=c_live, other=0)
        s_const = tl.load(span_ptr + P + sp, mask=c_live, other=0)
        d_mult = tl.load(span_ptr + 3 * P + sp, mask=c_live, other=0)
        d_const = tl.load(span_ptr + 4 * P + sp, mask=c_live, other=0)
        c_n = tl.load(span_ptr + 5 * P + sp, mask=c_live, other=0)
        slot_at = slot * s_mult + s_const
        unit_at = unit * d_mult + d_const
        is_store = op < n_stores
        # A scrub program: (unit, region) pairs [j, j + ROWS) of the scrub, zero-filled.
        j = (pid - n_ops * PP) * ROWS + lanes
        z_live = (j >= 0) & (j < n_scrub * R)
        k = j // R
        reg = j - k * R
        z_unit = tl.load(buf_ptr + 5 + 2 * n_ops + 2 * n_runs + k, mask=z_live, other=0)
        z_base = tl.load(scrub_ptr + reg, mask=z_live, other=0)
        z_stride = tl.load(scrub_ptr + R + reg, mask=z_live, other=0)
        z_n = tl.load(scrub_ptr + 2 * R + reg, mask=z_live, other=0)
        z_at = z_unit * z_stride + z_base
        src = tl.where(is_store, slot_at, unit_at)
        dst = tl.where(is_copy, tl.where(is_store, unit_at, slot_at), z_at)
        n = c_n + z_n  # each is 0 where its kind's lanes are dead
        flag = zero + is_copy.to(tl.int64)
        if WIDE:
            d = tl.multiple_of(dst, ALIGN)
            s = tl.multiple_of(src, ALIGN)
            n = tl.multiple_of(n, ALIGN)
        else:
            d = dst
            s = src
        copy = (flag != 0)[:, None]  # zero: fill with zeros
        s2 = s[:, None]
        d2 = d[:, None]
        n2 = n[:, None]
        offs = tl.arange(0, BLOCK)[None, :]
        longest = tl.max(n, axis=0)
        if FOR_LOOP:
            for kk in range(0, longest, BLOCK):
                idx = kk + offs
                m = idx < n2
                v = tl.load(base_ptr + s2 + idx, mask=m & copy, other=0)
                tl.store(base_ptr + d2 + idx, v, mask=m)
        else:
            # A while loop: Triton's interpreter cannot take a loaded value as a range()
            # bound (it converts a 1-element array with int()).
            kk = longest * 0
            while kk < longest:
                idx = kk + offs
                m = idx < n2
                v = tl.load(base_ptr + s2 + idx, mask=m & copy, other=0)
                tl.store(base_ptr + d2 + idx, v, mask=m)
                kk += BLOCK


#: The kernel under the name tests/gpu_helpers.py looks for (``triton_interpreted``).
_copy_rows_kernel = _copy_runs_kernel if _HAVE_TRITON else None

#: Integers at the head of a batch's upload: copies, stores, scrub units, runs.
_HEADER = PACKED_HEADER


class TritonCopyExecutor(CopyExecutorBase):
    """One Triton kernel launch per batch (see the module doc). CUDA tensors, or any
    device under ``TRITON_INTERPRET=1``.

    Args:
        tensors: the slot and KV tensors (CUDA, or CPU under the interpreter).
        max_ops_per_batch: descriptor capacity in copies (SPEC E.5: ``2 *
            max_num_seqs``); the static buffers are sized from it.
        block: elements a program copies per span per step (a power of two; 8-byte
            elements on the 16-byte path, bytes otherwise).
        rows_per_program: spans one program copies side by side (a power of two).
        num_warps: warps per program.
        max_scrub_units: the most units one batch may scrub (sizes the buffers; more is
            refused with ``BatchTooLargeError``: pass the rest to the next batch).
        wide: force the 16-byte path on (True: refused unless the layout allows it) or off
            (False); None picks it when allowed.
        for_loop: copy a span with a counted loop instead of a while loop (the compiler may
            pipeline it; not runnable under the interpreter). None: counted on CUDA, while
            under ``TRITON_INTERPRET=1``.

    The defaults (``block=512, rows_per_program=4, num_warps=4``, counted loop) are the
    variant that met the copy engine's device-time target (>= 0.90x a device-to-device
    copy of the same bytes for batches >= 8) on every geometry in docs/gpu-benchmarks.md.

    Attributes:
        last_upload_ints: the int64 values the last batch uploaded (header, per op, per
            run, per scrub unit: ``4 + 2 * ops + 1 + 2 * runs + scrub units``).
        host_read_ints: uploads of at most this many integers are read by the kernel from
            pinned host memory instead of copied to the device (default
            :data:`DEFAULT_HOST_READ_INTS`; 0 copies every upload). CUDA only, not under
            CUDA graph capture; may be changed between batches. Setting anything but an
            int >= 0 raises ``InvalidArgumentError``.
        host_read_batches: the batches whose upload the kernel read from host memory,
            counted since construction (the others were copied to the device).
        direct_launch: after the first (compiling) launch of a grid, launch through the
            compiled kernel (its ``run``, or Triton's launcher when a launch hook is set)
            instead of Triton's JIT dispatch; default True.

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
        u = self.layout.units_per_checkpoint
        r = len(self.layout.region_bytes)
        spans = self.plan.num_spans
        self._programs_per_copy = max(1, -(-spans // rows_per_program))
        self._grid_cap = max_ops_per_batch * self._programs_per_copy + -(
            -(max_scrub_units * r) // rows_per_program
        )  # the capacity's grid (CUDA graph capture)
        # Header, per op (slot, first run; one more run offset), per run (first unit, first
        # piece; at most U runs per op), per scrub unit.
        size = _HEADER + 2 * max_ops_per_batch + 1 + 2 * max_ops_per_batch * u + max_scrub_units
        pin = dev.type == "cuda"
        # Two pinned staging buffers and two device buffers, used in turn. The upload runs
        # on a side stream that waits (on the device) for the kernel that last read its
        # device buffer; the compute stream waits (on the device) for the upload. The host
        # waits only for its own upload from two batches ago, before rewriting that
        # staging buffer: never for the compute stream.
        self._stage = [torch.empty(size, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._stage_np = [x.numpy() for x in self._stage]
        self._dev = [torch.empty(size, dtype=torch.int64, device=dev) for _ in range(2)]
        self._size = size
        # Per buffer: the event of its last upload (side stream) and of the last kernel that
        # read it (compute stream), made once and recorded again each batch, and whether
        # each was recorded yet.
        self._uploaded = [torch.cuda.Event() for _ in range(2)] if pin else []
        self._kernel_done = [torch.cuda.Event() for _ in range(2)] if pin else []
        self._up_pending = [False, False]
        self._done_pending = [False, False]
        self._copy_stream = torch.cuda.Stream(device=dev) if pin else None
        self._dev_index = -1
        if pin:
            self._dev_index = dev.index if dev.index is not None else torch.cuda.current_device()
        # The compute streams seen, by raw handle (``torch.cuda.current_stream()`` builds a
        # new object each call: about 8 us on the H200 machine's host).
        self._streams: dict[int, Any] = {}
        # Views of the staging and device buffers, by (buffer, length rounded up to a
        # power of two): an upload copies a cached view pair, never slices (the integers
        # past the batch's are not read).
        self._views: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._captured: list[Any] = []  # buffers owned by captured graphs
        self._turn = 0
        self.last_upload_ints = 0
        #: Launch through Triton's compiled kernel once the first launch compiled it (its
        #: launcher, about 9 us on the H200 machine's host, where Triton's JIT dispatch of
        #: ``kernel[grid](...)`` binds and specializes every argument again: about 26 us).
        #: The arguments never change their specialization: the pointers are this
        #: executor's own tensors (whole allocations) and the rest are constants. False:
        #: every launch through the JIT dispatch.
        self.direct_launch = True
        # Uploads of at most this many integers are read by the kernel from the pinned
        # staging buffer itself (module doc, "Small uploads read from host memory"); 0:
        # every upload is copied to the device (the ``host_read_ints`` property).
        self._host_read_ints = DEFAULT_HOST_READ_INTS
        # Per buffer: whether the last kernel that used it read the staging buffer itself
        # (the host then waits for that kernel before rewriting it).
        self._host_read = [False, False]
        #: Batches whose upload the kernel read from host memory (the rest were copied).
        self.host_read_batches = 0
        self._constants: tuple[Any, ...] = ()
        # grid -> (compiled kernel, its launcher for that grid)
        self._runners: dict[int, tuple[Any, Any]] = {}
        self._raw_stream = 0  # the raw handle of the last compute stream looked up
        everything = tensors.all_tensors()
        base = min(everything, key=lambda x: x.data_ptr())
        self._base_addr = int(base.data_ptr())
        # Every address the layout produces is a tensor's base plus multiples of row
        # strides, region strides and plan offsets and lengths: 16-byte alignment of all of
        # them makes every span 16-byte aligned.
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
        # and length a span can have: the kernel's alignment hint on the 16-byte path.
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
        unit = 8 if self.wide else 1
        span_tab = np.stack(
            (
                self._s_mult,
                self._s_const - self._base_addr,
                self._piece,
                self._d_mult,
                self._d_const - self._base_addr,
                p.length,
            )
        )
        span_tab[[0, 1, 3, 4, 5]] //= unit
        scrub_tab = np.stack(
            (self._scrub_base - self._base_addr, self._scrub_stride, self._scrub_len)
        )
        scrub_tab //= unit
        # Uploaded once: the kernel derives every address from these and the batch's runs.
        self._span_tab = torch.as_tensor(
            np.ascontiguousarray(span_tab if spans else np.zeros((6, 1), np.int64))
        ).to(dev)
        self._scrub_tab = torch.as_tensor(
            np.ascontiguousarray(scrub_tab if r else np.zeros((3, 1), np.int64))
        ).to(dev)
        flat = base.view(-1).view(torch.uint8)
        self._base = flat[: flat.numel() // 8 * 8].view(torch.int64) if self.wide else flat

    @property
    def host_read_ints(self) -> int:
        """Uploads of at most this many integers are read by the kernel from pinned host
        memory (class doc, Attributes)."""
        return self._host_read_ints

    @host_read_ints.setter
    def host_read_ints(self, value: int) -> None:
        if type(value) is not int or value < 0:
            raise InvalidArgumentError(f"host_read_ints must be an int >= 0, got {value!r}")
        self._host_read_ints = value

    def _affine_tables(self) -> None:
        """Per span, the affine maps from a copy's slot and unit to the span's addresses:
        ``slot_addr = slot * s_mult + s_const`` and ``unit_addr = unit * d_mult + d_const``
        with ``unit`` the op's unit holding piece ``piece`` (a tensor's base plus a row
        stride times the index plus the span's offset); per KV region the scrub's base,
        stride and length. The kernel reads them (relative to its base pointer) from
        device tables made once; :meth:`rows_of_upload` applies them on the host. The same
        rows as :func:`~pagedstate.gpu.plan.write_descriptor` over
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

    def _stage_batch(self, out: np.ndarray, batch: CheckedBatch) -> int:
        """Write the batch's upload into ``out`` (int64, the staging buffer); returns the
        count of integers written, ``4 + 2 * N + 1 + 2 * M + K``:
        :attr:`CheckedBatch.upload`, laid out by validation (one copy here).

        Raises:
            InvalidArgumentError: the batch was changed after validation (its slots or
                per-op units no longer those its packed integers describe).

        ``[N, S, K, M]`` (copies, stores, scrub units, runs), then each op's slot (``N``,
        stores first), each op's first run and the run count (``N + 1``), each run's first
        unit (``M``), each run's first piece (``M``), the scrub units (``K``)."""
        up = batch.upload
        if (
            int(up[0]) != batch.copies
            or int(up[1]) != len(batch.store_slots)
            or batch._store_units is not None
            or batch._restore_units is not None
        ):
            raise InvalidArgumentError(
                "this CheckedBatch's arrays were changed after validation (attrs.evolve):"
                " the Triton executor uploads the integers validation packed"
            )
        n = len(up)
        out[:n] = up
        return n

    def rows_of_upload(self, ints: np.ndarray) -> np.ndarray:
        """The descriptor rows ``(src_addr, dst_addr, length)`` in bytes that the kernel
        derives from an upload (:meth:`_stage_batch`'s integers): one row per span per copy
        (stores, then restores with the columns swapped), then one per region per scrub
        unit (source 0: zero fill). A NumPy model of the kernel's address arithmetic, for
        tests against :func:`~pagedstate.gpu.plan.write_descriptor`. O(copies * spans)."""
        v = np.asarray(ints, dtype=np.int64)
        n, n_st, k, m = (int(x) for x in v[:_HEADER])
        o = _HEADER
        slots = v[o : o + n]
        op_runs = v[o + n : o + 2 * n + 1]
        first = v[o + 2 * n + 1 : o + 2 * n + 1 + m]
        piece0 = v[o + 2 * n + 1 + m : o + 2 * n + 1 + 2 * m]
        scrub = v[o + 2 * n + 1 + 2 * m : o + 2 * n + 1 + 2 * m + k]
        rows = []
        for i in range(n):
            lo, hi = int(op_runs[i]), int(op_runs[i + 1])
            at = lo + np.searchsorted(piece0[lo:hi], self._piece, side="right") - 1
            unit = first[at] + (self._piece - piece0[at])
            slot_addr = slots[i] * self._s_mult + self._s_const
            unit_addr = unit * self._d_mult + self._d_const
            pair = (slot_addr, unit_addr) if i < n_st else (unit_addr, slot_addr)
            rows.append(np.stack((pair[0], pair[1], self.plan.length), axis=1))
        for x in scrub:
            addr = x * self._scrub_stride + self._scrub_base
            rows.append(np.stack((np.zeros_like(addr), addr, self._scrub_len), axis=1))
        return np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)

    def programs(self, copies: int, scrub_units: int) -> int:
        """The grid of a batch: ``ceil(spans / rows_per_program)`` programs per copy, then
        ``ceil(scrub_units * regions / rows_per_program)``. Under CUDA graph capture the
        grid is the capacity's (``max_ops_per_batch`` copies, ``max_scrub_units``)."""
        rows = self.rows_per_program
        return copies * self._programs_per_copy + -(-(scrub_units * len(self._scrub_len)) // rows)

    def _launch(self, dev: Any, programs: int, stream: int | None = None) -> None:
        """One launch of ``programs`` programs over the upload in ``dev`` (a device int64
        buffer holding :meth:`_stage_batch`'s integers). Programs past the upload's copies
        and scrubs exit without touching memory, so any grid from :meth:`programs` up to
        the capacity's copies the same bytes. The first launch goes through Triton's JIT
        dispatch (it compiles); with :attr:`direct_launch` the later ones call the compiled
        kernel's launcher for the grid (one launcher a grid size, kept); given the raw
        ``stream`` handle and no launch hook set (``triton.knobs.runtime``), the compiled
        kernel's ``run`` itself, without the launcher's per-call lookups (the stream, the
        hooks' metadata)."""
        got = self._runners.get(programs) if self.direct_launch else None
        if got is not None:
            compiled, runner = got
            rt = _knobs.runtime if _knobs is not None else None
            if (
                stream is not None
                and rt is not None
                and rt.launch_enter_hook is None
                and rt.launch_exit_hook is None
            ):
                compiled.run(
                    programs,
                    1,
                    1,
                    stream,
                    compiled.function,
                    compiled.packed_metadata,
                    None,
                    None,
                    None,
                    self._base,
                    dev,
                    self._span_tab,
                    self._scrub_tab,
                    *self._constants,
                )
            else:
                runner(self._base, dev, self._span_tab, self._scrub_tab, *self._constants)
            return
        compiled = _copy_runs_kernel[(programs,)](
            self._base,
            dev,
            self._span_tab,
            self._scrub_tab,
            P=self.plan.num_spans,
            PP=self._programs_per_copy,
            R=len(self._scrub_len),
            ROWS=self.rows_per_program,
            BLOCK=self.block,
            WIDE=self.wide,
            FOR_LOOP=self.for_loop,
            ALIGN=2 * self.align if self.wide else 1,
            num_warps=self.num_warps,
        )
        if self.direct_launch and not interpreting() and hasattr(compiled, "__getitem__"):
            # the compiled kernel's launcher takes every argument in the kernel's order,
            # the constant ones included (as the JIT dispatch passes them)
            self._constants = (
                self.plan.num_spans,
                self._programs_per_copy,
                len(self._scrub_len),
                self.rows_per_program,
                self.block,
                self.wide,
                self.for_loop,
                2 * self.align if self.wide else 1,
            )
            if len(self._runners) >= 64:  # pragma: no mutate (any bound keeps it small)
                self._runners.clear()
            self._runners[programs] = (compiled, compiled[(programs, 1, 1)])

    def _views_of(self, i: int, used: int) -> tuple[Any, Any]:
        """Buffer ``i``'s device and staging views holding at least ``used`` integers (a
        power of two of them, at least 64, at most the buffers' size), made once."""
        n = min(self._size, max(64, 1 << (used - 1).bit_length()))
        got = self._views.get((i, n))
        if got is None:
            got = self._views[(i, n)] = (self._dev[i][:n], self._stage[i][:n])
        return got

    def _compute_stream(self) -> Any:
        """The current stream of this executor's device (cached by its raw handle)."""
        torch = _torch()
        raw = torch._C._cuda_getCurrentRawStream(self._dev_index)
        self._raw_stream = raw
        got = self._streams.get(raw)
        if got is None:
            got = torch.cuda.current_stream(self._dev_index)
            if len(self._streams) >= 64:  # pragma: no mutate (any bound keeps it small)
                self._streams.clear()
            self._streams[raw] = got
        return got

    def _run(self, batch: CheckedBatch) -> None:
        torch = _torch()
        cuda = self.tensors.device.type == "cuda"
        if cuda and torch.cuda.is_current_stream_capturing():
            self._run_captured(batch)
            return
        i = self._turn
        self._turn ^= 1
        if not cuda:
            stage_t, dev = self._stage[i], self._dev[i]
            used = self._stage_batch(self._stage_np[i], batch)
            self.last_upload_ints = used
            dev[:used].copy_(stage_t[:used])
            self._launch(dev, self.programs(batch.copies, len(batch.scrub_units)))
            return
        if self._up_pending[i]:
            self._uploaded[i].synchronize()  # our upload from two batches ago is done
            self._up_pending[i] = False
        if self._host_read[i]:
            self._kernel_done[i].synchronize()  # the kernel that read this staging buffer
            self._host_read[i] = False
        used = self._stage_batch(self._stage_np[i], batch)
        self.last_upload_ints = used
        compute = self._compute_stream()
        if used <= self._host_read_ints:
            # the kernel reads the pinned staging buffer through its mapped address
            buf = self._stage[i]
            self._host_read[i] = True
            self.host_read_batches += 1
        else:
            self._upload(i, used, compute)
            buf = self._dev[i]
        timed = self.record_events
        if timed:
            if self.hold_cycles:
                # Keep the stream busy while the host enqueues the launch below, so the
                # events time the device's work, not the host's launch overhead.
                torch.cuda._sleep(self.hold_cycles)
            start = torch.cuda.Event(enable_timing=True)
            start.record(compute)
        self._launch(buf, self.programs(batch.copies, len(batch.scrub_units)), self._raw_stream)
        self._kernel_done[i].record(compute)
        self._done_pending[i] = True
        if timed:
            end = torch.cuda.Event(enable_timing=True)
            end.record(compute)
            self.last_events = (start, end)

    def _upload(self, i: int, used: int, compute: Any) -> None:
        """Copy staging buffer ``i``'s first ``used`` integers to device buffer ``i`` on the
        side stream, after the kernel that last read that device buffer, and make the
        ``compute`` stream wait for the copy (on the device)."""
        torch = _torch()
        dev_view, stage_view = self._views_of(i, used)
        side = self._copy_stream
        assert side is not None
        up = self._uploaded[i]
        if self._done_pending[i]:
            side.wait_event(self._kernel_done[i])
        if torch.cuda.current_device() == self._dev_index:
            # the upload on the side stream (set_stream rather than the stream context: the
            # context manager costs about 20 us more on the H200 machine's host)
            torch.cuda.set_stream(side)
            try:
                dev_view.copy_(stage_view, non_blocking=True)
                up.record(side)
            finally:
                torch.cuda.set_stream(compute)
        else:  # set_stream would also change the current device
            with torch.cuda.stream(side):
                dev_view.copy_(stage_view, non_blocking=True)
                up.record(side)
        self._up_pending[i] = True
        compute.wait_event(up)

    def _run_captured(self, batch: CheckedBatch) -> None:
        """``_run`` under CUDA graph capture: a captured upload reads its pinned buffer,
        and the captured kernel its device buffer, at every replay, so the graph gets
        buffers of its own, never rewritten, and everything stays on the capturing stream
        (no events, no side stream); the grid is the capacity's (programs past the batch's
        count find nothing to do)."""
        torch = _torch()
        stage_t = torch.empty_like(self._stage[0], pin_memory=True)
        dev = torch.empty_like(self._dev[0])
        self._captured.append((stage_t, dev))
        used = self._stage_batch(stage_t.numpy(), batch)
        self.last_upload_ints = used
        dev[:used].copy_(stage_t[:used], non_blocking=True)
        self._launch(dev, self._grid_cap)
