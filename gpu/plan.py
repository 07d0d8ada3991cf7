"""Address-free copy plans and the descriptors built from them (SPEC E.4, F57-F60, F63).

A checkpoint image is one byte stream cut two ways: into the slot's carried ranges (the
source segments) and into unit regions (the destination segments, unit-major and
region-minor). :func:`plan_segmented_copy` intersects the two cuttings once per geometry:
every *span* is a maximal run of bytes inside one source segment and one destination
segment, given as ``(src_seg, src_off, dst_seg, dst_off, length)``. The plan holds no
addresses, so one plan serves every store and every restore of that geometry: a restore
is the store plan read backwards (source and destination columns swapped).

:func:`write_descriptor` turns a plan and per-copy base addresses into descriptor rows
``(src_addr, dst_addr, length)`` for a whole batch in one vectorized NumPy call;
:func:`tile_rows` cuts rows into tiles of at most ``tile_bytes`` for a kernel grid.

The range builders (:func:`checkpoint_ranges_for`, :func:`merge_abutting`,
:func:`assert_ratios_divide_alignment`) build a slot's carried ranges from field extents,
as ATOM's DeepSeek-V4 layout does (SPEC E.2): a layout with fields that are not carried
(padding, recomputed fields) states its image with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from pagedstate.spec.errors import BadCopyPlanError

__all__ = [
    "DEFAULT_TILE_BYTES",
    "CopyPlan",
    "Field",
    "assert_ratios_divide_alignment",
    "checkpoint_ranges_for",
    "merge_abutting",
    "plan_segmented_copy",
    "tile_rows",
    "write_descriptor",
]

#: Tile size of SPEC E.4's plan (ATOM's kernel copies at most this many bytes per program).
DEFAULT_TILE_BYTES = 4096

I64 = npt.NDArray[np.int64]


def _int_array(name: str, values: object) -> I64:
    """``values`` as a 1-D int64 array: a 1-D NumPy integer array, or a sequence of
    Python ints (bools, floats, strings and ints beyond int64 are refused, not converted).

    Raises:
        BadCopyPlanError: anything else.
    """
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise BadCopyPlanError(
                f"{name} must be a 1-D integer array, got {values.dtype} of shape {values.shape}"
            )
        return values.astype(np.int64)
    try:
        items = list(values)  # type: ignore[call-overload]
    except TypeError:
        raise BadCopyPlanError(f"{name} must be a sequence of ints, got {values!r}") from None
    bad = next((x for x in items if type(x) is not int), None)
    if bad is not None:
        raise BadCopyPlanError(
            f"{name} must be a one-dimensional sequence of ints, got {bad!r} in it"
        )
    try:
        return np.array(items, dtype=np.int64).reshape(-1)
    except OverflowError:
        raise BadCopyPlanError(f"{name} has a value beyond int64: {values!r}") from None


def _sizes(name: str, sizes: Sequence[int]) -> I64:
    arr = _int_array(name, sizes)
    if len(arr) and int(arr.min()) <= 0:
        raise BadCopyPlanError(f"{name} has a segment of size <= 0 (empty segments are illegal)")
    return arr


@attrs.frozen(eq=False)
class CopyPlan:
    """The spans of one image copy (SPEC E.4), as parallel int64 arrays of equal length.

    Attributes:
        src_seg, src_off: source segment index and byte offset in it, per span.
        dst_seg, dst_off: destination segment index and byte offset in it, per span.
        length: bytes per span (> 0).
        total: bytes of the image (the sum of ``length``).
        src_sizes, dst_sizes: the two segmentations the plan was made from.
        tile_bytes: the tile size of :attr:`span_of_tile` / :attr:`tile_start`.
        span_of_tile, tile_start: tile ``t`` copies bytes ``[tile_start[t], +tile_bytes)``
            of span ``span_of_tile[t]`` (clipped to the span): every span's tile starts are
            ``range(0, length, tile_bytes)`` (F60).
    """

    src_seg: I64
    src_off: I64
    dst_seg: I64
    dst_off: I64
    length: I64
    total: int
    src_sizes: tuple[int, ...]
    dst_sizes: tuple[int, ...]
    tile_bytes: int
    span_of_tile: I64
    tile_start: I64

    @property
    def num_spans(self) -> int:
        """Spans per image."""
        return len(self.length)

    @property
    def num_tiles(self) -> int:
        """Tiles per image."""
        return len(self.span_of_tile)

    def rows(self) -> list[tuple[int, int, int, int, int]]:
        """The spans as tuples ``(src_seg, src_off, dst_seg, dst_off, length)``."""
        return list(
            zip(
                self.src_seg.tolist(),
                self.src_off.tolist(),
                self.dst_seg.tolist(),
                self.dst_off.tolist(),
                self.length.tolist(),
                strict=True,
            )
        )


def plan_segmented_copy(
    src_sizes: Sequence[int],
    dst_sizes: Sequence[int],
    total: int,
    tile_bytes: int = DEFAULT_TILE_BYTES,
) -> CopyPlan:
    """Intersect two segmentations of the first ``total`` bytes of a stream (SPEC E.4).

    Walks both streams and cuts a span at every boundary of either, so byte ``k`` of the
    source stream lands on byte ``k`` of the destination stream for ``k < total``; bytes
    of either stream past ``total`` are in no span (the last unit's tail is never written,
    F59). ``total == 0`` gives an empty plan (0 spans, 0 tiles). O(segments).

    Example (F57): ``plan_segmented_copy([5, 7], [3, 4, 5], 12).rows()`` is
    ``[(0, 0, 0, 0, 3), (0, 3, 1, 0, 2), (1, 0, 1, 2, 2), (1, 2, 2, 0, 5)]``.

    Args:
        src_sizes: bytes of each source segment (the slot's carried ranges), each > 0.
        dst_sizes: bytes of each destination segment (unit regions, unit-major), each > 0.
        total: bytes to copy, ``0 <= total <= min(sum(src_sizes), sum(dst_sizes))``.
        tile_bytes: tile size for :attr:`CopyPlan.span_of_tile` (> 0; default 4096).

    Raises:
        BadCopyPlanError: ``total < 0``, a stream shorter than ``total``, a segment of size
            <= 0, or ``tile_bytes <= 0``.
    """
    if type(total) is not int or total < 0:
        raise BadCopyPlanError(f"total must be an int >= 0, got {total!r}")
    if type(tile_bytes) is not int or tile_bytes <= 0:
        raise BadCopyPlanError(f"tile_bytes must be an int > 0, got {tile_bytes!r}")
    src = _sizes("src_sizes", src_sizes)
    dst = _sizes("dst_sizes", dst_sizes)
    for name, arr in (("source", src), ("destination", dst)):
        if int(arr.sum()) < total:
            raise BadCopyPlanError(
                f"the {name} stream holds {int(arr.sum())} bytes, fewer than total={total}"
            )
    # Every boundary of either stream below total, plus 0 and total: the span cuts.
    src_ends = np.cumsum(src)
    dst_ends = np.cumsum(dst)
    cuts = np.unique(
        np.concatenate(
            (
                np.array([0, total], dtype=np.int64),
                src_ends[src_ends < total],
                dst_ends[dst_ends < total],
            )
        )
    )
    starts = cuts[:-1]
    length = np.diff(cuts)
    src_seg = np.searchsorted(src_ends, starts, side="right").astype(np.int64)
    dst_seg = np.searchsorted(dst_ends, starts, side="right").astype(np.int64)
    src_begin = np.concatenate((np.zeros(1, np.int64), src_ends))
    dst_begin = np.concatenate((np.zeros(1, np.int64), dst_ends))
    src_off = starts - src_begin[src_seg]
    dst_off = starts - dst_begin[dst_seg]
    tiles_per_span = -(-length // tile_bytes)
    span_of_tile = np.repeat(np.arange(len(length), dtype=np.int64), tiles_per_span)
    first_tile = np.concatenate((np.zeros(1, np.int64), np.cumsum(tiles_per_span)[:-1]))
    tile_start = (np.arange(len(span_of_tile), dtype=np.int64) - first_tile[span_of_tile]) * (
        tile_bytes
    )
    return CopyPlan(
        src_seg=src_seg,
        src_off=src_off.astype(np.int64),
        dst_seg=dst_seg,
        dst_off=dst_off.astype(np.int64),
        length=length.astype(np.int64),
        total=total,
        src_sizes=tuple(int(x) for x in src),
        dst_sizes=tuple(int(x) for x in dst),
        tile_bytes=tile_bytes,
        span_of_tile=span_of_tile,
        tile_start=tile_start.astype(np.int64),
    )


def _bases(name: str, bases: object, copies: int | None, width: int) -> I64:
    arr = np.asarray(bases)
    if arr.ndim != 2 or (copies is not None and arr.shape[0] != copies):
        raise BadCopyPlanError(
            f"one row of bases per copy: {name} has shape {arr.shape}"
            + (f", expected ({copies}, {width})" if copies is not None else "")
        )
    if arr.shape[1] != width:
        raise BadCopyPlanError(
            f"{name} has {arr.shape[1]} bases per copy, the plan has {width} segments"
        )
    if arr.dtype.kind not in "iu":
        raise BadCopyPlanError(f"{name} must hold integer addresses, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def write_descriptor(
    out: I64,
    plan: CopyPlan,
    src_bases: npt.ArrayLike,
    dst_bases: npt.ArrayLike,
    forward: bool = True,
) -> I64:
    """Fill ``out`` with one ``(src_addr, dst_addr, length)`` row per span per copy.

    Copy ``c``'s span ``s`` is row ``c * num_spans + s``: ``src_bases[c, src_seg[s]] +
    src_off[s]``, ``dst_bases[c, dst_seg[s]] + dst_off[s]``, ``length[s]``. With
    ``forward=False`` columns 0 and 1 are swapped: a restore is the store plan read
    backwards (the store's source bases are the restore's destination slot). Returns
    ``out``. One vectorized pass, O(copies * spans).

    Args:
        out: C-contiguous int64 array of shape exactly ``(copies * num_spans, 3)``.
        plan: the image's plan.
        src_bases: ``(copies, len(plan.src_sizes))`` byte addresses of each copy's source
            segments (for a store: the slot's carried ranges).
        dst_bases: ``(copies, len(plan.dst_sizes))`` byte addresses of each copy's
            destination segments (for a store: its units' regions, unit-major).

    Raises:
        BadCopyPlanError: a base array is not 2-D with one row per copy ("one row of bases
            per copy": NumPy broadcasting would aim every copy at image 0, F58), the two
            disagree on the number of copies, or ``out`` has the wrong shape or dtype.
    """
    s = np.asarray(src_bases)
    if s.ndim != 2:
        raise BadCopyPlanError(f"one row of bases per copy: src_bases has shape {s.shape}")
    copies = s.shape[0]
    sb = _bases("src_bases", s, copies, len(plan.src_sizes))
    db = _bases("dst_bases", dst_bases, copies, len(plan.dst_sizes))
    rows = copies * plan.num_spans
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != np.int64
        or out.shape != (rows, 3)
        or not out.flags.c_contiguous
    ):
        got = (out.dtype, out.shape) if isinstance(out, np.ndarray) else type(out)
        raise BadCopyPlanError(f"out must be C-contiguous int64 of shape ({rows}, 3), got {got}")
    a, b = (0, 1) if forward else (1, 0)
    rows3 = out.reshape(copies, plan.num_spans, 3)
    # Gathers written straight into the strided columns: no temporaries of the batch's
    # size (about 6x faster than building the columns and assigning them).
    np.add(np.take(sb, plan.src_seg, axis=1), plan.src_off, out=rows3[:, :, a])
    np.add(np.take(db, plan.dst_seg, axis=1), plan.dst_off, out=rows3[:, :, b])
    rows3[:, :, 2] = plan.length
    return out


def tile_rows(lengths: npt.ArrayLike, tile_bytes: int) -> tuple[I64, I64]:
    """Cut descriptor rows of ``lengths`` bytes into tiles of at most ``tile_bytes``:
    returns ``(row_of_tile, tile_start)``; row ``r``'s tile starts are
    ``range(0, lengths[r], tile_bytes)``. A zero-length row has no tile.

    Raises:
        BadCopyPlanError: ``tile_bytes <= 0``, a negative length, or lengths that are not a
            1-D sequence of ints.
    """
    if type(tile_bytes) is not int or tile_bytes <= 0:
        raise BadCopyPlanError(f"tile_bytes must be an int > 0, got {tile_bytes!r}")
    ln = _int_array("lengths", lengths)
    if len(ln) and int(ln.min()) < 0:
        raise BadCopyPlanError("a descriptor row has a negative length")
    per_row = -(-ln // tile_bytes)
    row_of_tile = np.repeat(np.arange(len(ln), dtype=np.int64), per_row)
    first = np.concatenate((np.zeros(1, np.int64), np.cumsum(per_row)[:-1]))
    start = (np.arange(len(row_of_tile), dtype=np.int64) - first[row_of_tile]) * tile_bytes
    return row_of_tile, start.astype(np.int64)


# -- range builders (SPEC E.2, F63) -----------------------------------------------------


@attrs.frozen
class Field:
    """One field of a slot entry: ``size`` bytes at ``offset``; ``in_checkpoint`` says
    whether the image carries it."""

    offset: int
    size: int
    in_checkpoint: bool = True


def checkpoint_ranges_for(fields: Iterable[Field]) -> list[tuple[int, int]]:
    """The carried byte ranges ``(offset, size)`` of a slot entry: maximal runs of
    consecutive carried fields, the padding between them included; a field that is not
    carried ends a run. Zero-byte runs are omitted (empty segments are illegal in a
    plan, F63).

    Raises:
        BadCopyPlanError: fields out of order or overlapping, or a negative offset/size.
    """
    runs: list[tuple[int, int]] = []
    start: int | None = None
    end = 0
    prev_end = 0
    for f in fields:
        if f.offset < 0 or f.size < 0:
            raise BadCopyPlanError(f"field {f!r} has a negative offset or size")
        if f.offset < prev_end:
            raise BadCopyPlanError(f"field {f!r} starts before the previous field ends")
        prev_end = f.offset + f.size
        if f.in_checkpoint:
            if start is None:
                start = f.offset
            end = prev_end
        elif start is not None:
            if end > start:
                runs.append((start, end - start))
            start = None
    if start is not None and end > start:
        runs.append((start, end - start))
    return runs


def merge_abutting(runs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge ascending, non-overlapping ``(offset, size)`` runs where one ends exactly where
    the next begins.

    Raises:
        BadCopyPlanError: a run starts before the previous one ends (out of order or
            overlapping: merging it would count bytes twice, F63) or has size <= 0.
    """
    out: list[tuple[int, int]] = []
    for off, size in runs:
        if size <= 0:
            raise BadCopyPlanError(f"run ({off}, {size}) is empty")
        if out:
            last_off, last_size = out[-1]
            last_end = last_off + last_size
            if off < last_end:
                raise BadCopyPlanError(
                    f"run ({off}, {size}) starts before the previous run ends at {last_end}:"
                    " runs must be ascending and non-overlapping"
                )
            if off == last_end:
                out[-1] = (last_off, last_size + size)
                continue
        out.append((off, size))
    return out


def assert_ratios_divide_alignment(
    block_size: int, dcp_size: int, compress_ratios: Iterable[int]
) -> None:
    """The window alignment ``block_size * dcp_size`` must be > 0 and every compress ratio
    must divide it (SPEC E.2, F63), or an image boundary would fall inside a compressed
    group.

    Raises:
        BadCopyPlanError: the alignment is 0 or negative, or a ratio does not divide it.
    """
    align = block_size * dcp_size
    if align <= 0:
        raise BadCopyPlanError(
            f"kv_cache_block_size * dcp_size must be > 0, got {block_size} * {dcp_size}"
        )
    for r in compress_ratios:
        if r <= 0 or align % r:
            raise BadCopyPlanError(f"compress ratio {r} does not divide the alignment {align}")
