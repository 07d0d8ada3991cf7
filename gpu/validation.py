"""Checking a batch of checkpoint copies before anything is written (SPEC E.5 step 1, F61):
:func:`validate_batch` and the :class:`CheckedBatch` it returns, the arrays every executor
copies from (:mod:`.executor`).

Three paths give the same answer: a batch of one op and no scrub in one pass over its runs
(:func:`_one_op_batch`), a few runs in plain Python (:func:`_small_batch`), more with NumPy
(:func:`_numpy_batch`); when any of them refuses, the per-op check (:func:`_slow_batch`)
names the first problem. An op's ``unit_ids`` is never expanded unless the batch is
refused (SPEC A.5).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import attrs
import numpy as np

from pagedstate.spec.errors import (
    BatchHazardError,
    BatchTooLargeError,
    CopyOpError,
    InvalidArgumentError,
)
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp

from .geometry import CheckpointLayout

__all__ = ["CheckedBatch", "PACKED_HEADER", "SMALL_BATCH", "validate_batch"]

_EMPTY = np.zeros(0, dtype=np.int64)

#: Integers at the head of :attr:`CheckedBatch.packed`: copies, stores, scrub units, runs.
PACKED_HEADER = 4


@attrs.frozen(eq=False)
class CheckedBatch:
    """A batch that passed :func:`validate_batch`, as arrays for the copy (SPEC E.5 step 1).

    The ops are numbered stores first, then restores: op ``i < S`` is store ``i``, op
    ``S + j`` is restore ``j``. Each op's units are its runs (SPEC A.5), kept flat for the
    whole batch: op ``i``'s runs are ``op_runs[i] <= m < op_runs[i + 1]``, run ``m`` the
    units ``run_first[m] .. run_first[m] + run_count[m] - 1``, holding pieces
    ``run_piece[m] ..`` of its op's image. O(ops + runs) integers.

    Attributes:
        packed: every integer below in one int64 array, laid out as the Triton executor
            uploads it (SPEC E.4): ``[N, S, K, M]``, the ``N`` slots (stores first), the
            ``N + 1`` values of ``op_runs``, ``run_first`` (``M``), ``run_piece`` (``M``),
            ``scrub_units`` (``K``), then ``run_count`` (``M``, not uploaded). The arrays
            below are views into it.
        store_slots: ``(S,)`` int64, each store's source slot.
        restore_slots: ``(R,)`` int64, each restore's destination slot (``N = S + R``).
        scrub_units: ``(K,)`` int64, the units to zero-fill, ascending.
        op_runs: ``(N + 1,)`` int64, the first run of each op, then the run count ``M``.
        run_first: ``(M,)`` int64, the first unit of each run.
        run_piece: ``(M,)`` int64, the image piece each run starts at (0 for an op's first).
        run_count: ``(M,)`` int64, units per run (>= 1; an op's counts sum to ``U``).
        units_per_op: ``U``, the layout's units per image.

    :attr:`store_units` and :attr:`restore_units` (``(S, U)`` and ``(R, U)`` unit ids in
    piece order) are expanded from the runs on first use (O(units), NumPy), unless given
    (``store_units=`` / ``restore_units=``: the torch executor then copies those; the
    Triton executor reads :attr:`packed` and refuses a batch whose slots disagree with it).
    """

    packed: np.ndarray
    store_slots: np.ndarray
    restore_slots: np.ndarray
    scrub_units: np.ndarray
    op_runs: np.ndarray
    run_first: np.ndarray
    run_piece: np.ndarray
    run_count: np.ndarray
    units_per_op: int
    # Per-op unit arrays given explicitly (``attrs.evolve(batch, store_slots=...,
    # store_units=...)``, as tests planting an executor bug do); None: from the runs.
    _store_units: np.ndarray | None = attrs.field(default=None, repr=False)
    _restore_units: np.ndarray | None = attrs.field(default=None, repr=False)
    _cache: dict[str, np.ndarray] = attrs.field(init=False, factory=dict, repr=False)

    @classmethod
    def of_packed(cls, packed: np.ndarray, units_per_op: int) -> CheckedBatch:
        """The batch over ``packed`` (see :attr:`packed`; its header gives the sizes)."""
        n, s, k, m = (int(x) for x in packed[:PACKED_HEADER])
        o = PACKED_HEADER
        return cls(
            packed,
            packed[o : o + s],
            packed[o + s : o + n],
            packed[o + 2 * n + 1 + 2 * m : o + 2 * n + 1 + 2 * m + k],
            packed[o + n : o + 2 * n + 1],
            packed[o + 2 * n + 1 : o + 2 * n + 1 + m],
            packed[o + 2 * n + 1 + m : o + 2 * n + 1 + 2 * m],
            packed[o + 2 * n + 1 + 2 * m + k :],
            units_per_op,
        )

    @property
    def upload(self) -> np.ndarray:
        """What the Triton executor uploads: :attr:`packed` without ``run_count``
        (``4 + 2 * N + 1 + 2 * M + K`` integers)."""
        return self.packed[: len(self.packed) - len(self.run_count)]

    @property
    def copies(self) -> int:
        """Stores plus restores."""
        return len(self.store_slots) + len(self.restore_slots)

    @property
    def runs(self) -> int:
        """Runs of the whole batch (``M``)."""
        return len(self.run_first)

    def _units(self, lo: int, hi: int) -> np.ndarray:
        """``(hi - lo, U)`` unit ids of ops ``lo .. hi - 1``, expanded from their runs."""
        u = self.units_per_op
        a, b = int(self.op_runs[lo]), int(self.op_runs[hi])
        n = hi - lo
        op_of_run = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.op_runs[lo : hi + 1]))
        start = op_of_run * u + self.run_piece[a:b]
        flat = np.repeat(self.run_first[a:b] - start, self.run_count[a:b])
        flat += np.arange(n * u, dtype=np.int64)
        return flat.reshape(n, u)

    @property
    def store_units(self) -> np.ndarray:
        """``(S, U)`` int64: each store's unit ids in piece order (expanded once)."""
        if self._store_units is not None:
            return self._store_units
        got = self._cache.get("store")
        if got is None:  # the runs' own numbering of the ops (packed's header)
            got = self._cache["store"] = self._units(0, int(self.packed[1]))
        return got

    @property
    def restore_units(self) -> np.ndarray:
        """``(R, U)`` int64: each restore's unit ids in piece order (expanded once)."""
        if self._restore_units is not None:
            return self._restore_units
        got = self._cache.get("restore")
        if got is None:
            s, n = int(self.packed[1]), int(self.packed[0])
            got = self._cache["restore"] = self._units(s, n)
        return got


def _check_runs(kind: str, i: int, runs: object) -> None:
    """An op built from runs (``op._runs`` set) must carry ``(first, count)`` int pairs,
    ``first >= 0``, ``count >= 1`` (what :meth:`CheckpointStoreOp.from_runs` checks; the
    store's own constructor does not)."""
    ok = type(runs) is tuple and all(
        type(r) is tuple
        and len(r) == 2
        and type(r[0]) is int
        and type(r[1]) is int
        and r[0] >= 0
        and r[1] >= 1
        for r in runs
    )
    if not ok:
        raise CopyOpError(
            f"{kind} {i}: runs must be (first, count) int pairs, first >= 0, count >= 1;"
            f" got {runs!r}"
        )


def _check_op(
    kind: str,
    i: int,
    op: object,
    cls: type,
    layout_id: str,
    image_bytes: int,
    units: int,
    num_slots: int,
    num_blocks: int,
) -> tuple[int, tuple[int, ...]]:
    if type(op) is not cls:  # exactly the store's op classes, as the vectorized path
        raise CopyOpError(f"{kind} {i}: expected a {cls.__name__}, got {type(op).__name__}")
    if op.layout_id != layout_id:  # type: ignore[attr-defined]
        raise CopyOpError(
            f"{kind} {i}: layout_id {op.layout_id!r} is not this worker's {layout_id!r}"  # type: ignore[attr-defined]
            " (an image of another layout cannot be read or written here)"
        )
    if type(op.total_bytes) is not int:  # type: ignore[attr-defined]
        raise CopyOpError(
            f"{kind} {i}: total_bytes must be an int, got {op.total_bytes!r}"  # type: ignore[attr-defined]
        )
    if op.total_bytes != image_bytes:  # type: ignore[attr-defined]
        raise CopyOpError(
            f"{kind} {i}: total_bytes {op.total_bytes} != image_bytes {image_bytes}"  # type: ignore[attr-defined]
        )
    runs = op._runs  # type: ignore[attr-defined]
    if runs is not None:
        _check_runs(kind, i, runs)
        # decided from the runs before any id is expanded (a huge run is refused, not built)
        if sum(c for _, c in runs) != units:
            raise CopyOpError(
                f"{kind} {i}: a tuple of {units} unit ids expected, got the runs {runs!r}"
            )
        for first, count in runs:
            if first + count > num_blocks:
                raise CopyOpError(
                    f"{kind} {i}: run {(first, count)!r} reaches outside [0, {num_blocks})"
                )
    ids = op.unit_ids  # type: ignore[attr-defined]
    if type(ids) is not tuple:
        raise CopyOpError(
            f"{kind} {i}: unit_ids must be a tuple, got {type(ids).__name__} {_short(ids)}"
        )
    if len(ids) != units:
        raise CopyOpError(f"{kind} {i}: a tuple of {units} unit ids expected, got {len(ids)}")
    for u in ids:
        if type(u) is not int or not 0 <= u < num_blocks:
            raise CopyOpError(f"{kind} {i}: unit {u!r} outside [0, {num_blocks})")
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        twice = next(u for u in ids if u in seen or seen.add(u))  # type: ignore[func-returns-value]
        raise CopyOpError(f"{kind} {i}: unit {twice} is named twice")
    slot = op.src_slot if kind == "store" else op.dst_slot  # type: ignore[attr-defined]
    if type(slot) is not int:
        raise CopyOpError(f"{kind} {i}: a slot must be an int, got {slot!r}")
    if not 0 <= slot < num_slots:
        raise CopyOpError(f"{kind} {i}: slot {slot!r} outside [0, {num_slots})")
    return slot, ids


def _short(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (an image may name hundreds of units)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: Batches of at most this many runs plus scrub units are checked in plain Python
#: (:func:`_small_batch`: no NumPy call overhead); larger ones with NumPy.
SMALL_BATCH = 96


def _of_layout(
    op: Any, cls: type[CheckpointStoreOp] | type[CheckpointRestoreOp], lid: str, img: int
) -> bool:
    """Whether ``op`` is exactly a ``cls`` op (no subclass) of layout ``lid`` copying
    ``img`` bytes."""
    return (
        type(op) is cls
        and op.layout_id == lid
        and type(op.total_bytes) is int
        and op.total_bytes == img
    )


def _gather(
    key: tuple[str, int, int], stores: list[Any], restores: list[Any]
) -> tuple[list[Any], list[Any]] | None:
    """Each op's runs and slot, or None when an op is not exactly a store / restore op of
    this layout and image size, or its unit ids are not a tuple of ints >= 0. One
    attribute pass per op; ``unit_ids`` is never expanded (SPEC A.5)."""
    lid, img, _ = key
    runs_of: list[Any] = []
    slots: list[Any] = []
    for ops, cls in ((stores, CheckpointStoreOp), (restores, CheckpointRestoreOp)):
        for op in ops:
            if not _of_layout(op, cls, lid, img):
                return None
            r = op._runs
            if r is None:
                try:
                    r = op.runs
                except InvalidArgumentError:  # unit ids that are not a tuple of ints >= 0
                    return None
            runs_of.append(r)
            slots.append(op._slot)
    return runs_of, slots


def _fast_batch(
    key: tuple[str, int, int],
    stores: list[Any],
    restores: list[Any],
    scrub: list[int],
    num_slots: int,
    num_blocks: int,
) -> CheckedBatch | None:
    """The whole batch checked on its runs, or None when anything is off (then
    :func:`_slow_batch` finds and names the first problem). O(ops + runs + scrub) Python
    steps (one attribute pass per op, C-level passes over the runs) and, for batches of
    more than :data:`SMALL_BATCH` runs and scrub units, NumPy passes of O((ops + runs +
    scrub) log) over intervals; an op's ``unit_ids`` is never expanded.

    Intervals: a run ``(first, count)`` is the units ``[first, first + count)``. The
    written intervals (store runs, scrub units) must be pairwise disjoint (sorted, each
    starts at or after its predecessor's end); no restore run may meet one (a binary
    search finds the written interval starting last before the run's end); a restore's
    own runs must be disjoint (sorted by op, then first, neighbours compared)."""
    got = _gather(key, stores, restores)
    if got is None:
        return None
    runs_of, slots = got
    if not set(map(type, chain(slots, scrub))) <= {int}:  # bools and floats fail here
        return None
    if sum(map(len, runs_of)) + len(scrub) <= SMALL_BATCH:
        return _small_batch(key[2], runs_of, slots, len(stores), scrub, num_slots, num_blocks)
    return _numpy_batch(key[2], runs_of, slots, len(stores), scrub, num_slots, num_blocks)


def _one_op_batch(
    key: tuple[str, int, int],
    stores: Sequence[Any],
    restores: Sequence[Any],
    num_slots: int,
    num_blocks: int,
) -> CheckedBatch | None:
    """:func:`_fast_batch` for a batch of one op and no scrub (a batch of one image, an
    engine's most common small batch), in one pass over its runs; None when anything is
    off or unusual (the general path then decides, and names the problem). The same
    checks and the same :attr:`CheckedBatch.packed` as the general path (a test holds
    the two to it): the op is exactly a store / restore op of this layout and image size,
    its slot an int in range, its runs ints ``first >= 0``, ``count >= 1``, inside the
    pool, summing to the image's units and pairwise disjoint (nothing else in the batch
    to race with). O(runs)."""
    lid, img, u = key
    cls: type[CheckpointStoreOp] | type[CheckpointRestoreOp]
    if stores:
        op, cls, s = stores[0], CheckpointStoreOp, 1
    else:
        op, cls, s = restores[0], CheckpointRestoreOp, 0
    if not _of_layout(op, cls, lid, img):
        return None
    runs = op._runs
    slot = op._slot
    if type(runs) is not tuple or type(slot) is not int or not 0 <= slot < num_slots:
        return None
    firsts: list[int] = []
    pieces: list[int] = []
    counts: list[int] = []
    piece = 0
    for r in runs:
        if type(r) is not tuple or len(r) != 2:
            return None
        f, c = r
        if type(f) is not int or type(c) is not int or f < 0 or c < 1 or f + c > num_blocks:
            return None
        firsts.append(f)
        pieces.append(piece)
        counts.append(c)
        piece += c
    if piece != u:
        return None
    m = len(firsts)
    if m > 1:  # the op's own runs must not overlap (a unit named twice)
        own = sorted(zip(firsts, counts, strict=True))
        if any(b[0] < a[0] + a[1] for a, b in zip(own, own[1:], strict=False)):
            return None
    packed = np.array([1, s, 0, m, slot, 0, m, *firsts, *pieces, *counts], dtype=np.int64)
    return CheckedBatch.of_packed(packed, u)


def _small_batch(
    u: int,
    runs_of: list[Any],
    slots: list[int],
    s: int,
    scrub: list[int],
    num_slots: int,
    num_blocks: int,
) -> CheckedBatch | None:
    """:func:`_fast_batch`'s checks in plain Python, for a few runs."""
    n = len(slots)
    op_runs = [0]
    firsts: list[int] = []
    pieces: list[int] = []
    counts: list[int] = []
    written: list[tuple[int, int]] = []
    for i, runs in enumerate(runs_of):
        piece = 0
        own: list[tuple[int, int]] = []
        try:
            for f, c in runs:
                if type(f) is not int or type(c) is not int or f < 0 or c < 1:
                    return None
                if f + c > num_blocks:
                    return None
                firsts.append(f)
                pieces.append(piece)
                counts.append(c)
                own.append((f, f + c))
                piece += c
        except (TypeError, ValueError):  # runs that are not pairs (an op built unchecked)
            return None
        if piece != u:
            return None
        op_runs.append(len(firsts))
        if i < s:
            written += own
        elif len(own) > 1:  # a restore names a unit twice
            own.sort()
            if any(b[0] < a[1] for a, b in zip(own, own[1:], strict=False)):
                return None
    for x in slots:
        if not 0 <= x < num_slots:
            return None
    sc = sorted(scrub)
    if sc and (sc[0] < 0 or sc[-1] >= num_blocks):
        return None
    written += [(x, x + 1) for x in sc]
    written.sort()
    if any(b[0] < a[1] for a, b in zip(written, written[1:], strict=False)):
        return None
    if s < n:
        starts = [a for a, _ in written]
        for m in range(op_runs[s], len(firsts)):
            f = firsts[m]
            k = bisect_left(starts, f + counts[m]) - 1
            if k >= 0 and written[k][1] > f:  # a restore reads a written unit
                return None
        rs = slots[s:]
        if len(set(rs)) != len(rs) or not set(rs).isdisjoint(slots[:s]):
            return None
    m_all = len(firsts)
    packed = np.array(
        [n, s, len(sc), m_all, *slots, *op_runs, *firsts, *pieces, *sc, *counts],
        dtype=np.int64,
    )
    return CheckedBatch.of_packed(packed, u)


def _numpy_batch(
    u: int,
    runs_of: list[Any],
    slots: list[int],
    s: int,
    scrub: list[int],
    num_slots: int,
    num_blocks: int,
) -> CheckedBatch | None:
    """:func:`_fast_batch`'s checks with NumPy, for many runs."""
    n = len(slots)
    try:
        pairs = list(chain.from_iterable(runs_of))
        flat = list(chain.from_iterable(pairs))
        lens = set(map(len, pairs))
    except TypeError:  # runs that are not tuples of pairs (an op built unchecked)
        return None
    if not lens <= {2} or not set(map(type, flat)) <= {int}:
        return None
    try:
        rr = np.array(flat, dtype=np.int64).reshape(-1, 2)
        sl = np.array(slots, dtype=np.int64)
        sc = np.array(sorted(scrub), dtype=np.int64) if scrub else _EMPTY
    except OverflowError:  # an int beyond int64: out of range, named by the per-op pass
        return None
    first, count = rr[:, 0], rr[:, 1]
    nruns = np.fromiter(map(len, runs_of), dtype=np.int64, count=n)
    op_runs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nruns, out=op_runs[1:])
    m = len(first)
    if m:
        if (
            int(first.min()) < 0
            or int(count.min()) < 1
            or int(first.max()) >= num_blocks
            or int(count.max()) > num_blocks
        ):
            return None
        end = first + count
        if int(end.max()) > num_blocks:
            return None
    else:
        end = _EMPTY
    # Units per op: the counts of each op's runs sum to U (an op of no runs sums to 0).
    csum = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(count, out=csum[1:])
    if n and (np.diff(csum[op_runs]) != u).any():
        return None
    if n and (int(sl.min()) < 0 or int(sl.max()) >= num_slots):
        return None
    if len(sc) and (int(sc[0]) < 0 or int(sc[-1]) >= num_blocks):
        return None
    op_of_run = np.repeat(np.arange(n, dtype=np.int64), nruns)
    run_piece = csum[:-1] - op_of_run * u
    ms = int(op_runs[s])
    # Written intervals (store runs and scrub units): pairwise disjoint.
    if len(sc):
        ws = np.concatenate((first[:ms], sc))
        we = np.concatenate((end[:ms], sc + 1))
    else:
        ws, we = first[:ms], end[:ms]
    if len(ws) > 1:
        order = np.argsort(ws, kind="stable")
        ws, we = ws[order], we[order]
        if (ws[1:] < we[:-1]).any():
            return None
    if ms < m:
        rf, re_ = first[ms:], end[ms:]
        # A restore run meets a written interval.
        if len(ws):
            k = np.searchsorted(ws, re_, side="left") - 1
            if ((k >= 0) & (we[np.maximum(k, 0)] > rf)).any():
                return None
        # A restore names a unit twice (its own runs overlap).
        if m - ms > 1:
            ro = op_of_run[ms:]
            order = np.lexsort((rf, ro))
            f, e, o = rf[order], re_[order], ro[order]
            if ((o[1:] == o[:-1]) & (f[1:] < e[:-1])).any():
                return None
    # A slot written twice, or written and read (Python sets: O(ops), cheaper than NumPy
    # at these sizes).
    if n > s:
        rs = slots[s:]
        if len(set(rs)) != len(rs) or not set(rs).isdisjoint(slots[:s]):
            return None
    head = np.array([n, s, len(sc), m], dtype=np.int64)
    packed = np.concatenate((head, sl, op_runs, first, run_piece, sc, count))
    return CheckedBatch.of_packed(packed, u)


def validate_batch(
    layout: CheckpointLayout,
    stores: Sequence[CheckpointStoreOp],
    restores: Sequence[CheckpointRestoreOp],
    scrub_units: Iterable[int] = (),
    *,
    num_slots: int,
    num_blocks: int,
    max_ops: int | None = None,
) -> CheckedBatch:
    """Check a whole batch before anything is written (SPEC E.5 step 1, F61, and the
    hazard check below). O(ops + runs) host steps, vectorized over the runs (SPEC A.5):
    an op's ``unit_ids`` is not expanded unless the batch is refused (then a per-op pass
    names the first problem, O(units)).

    Hazards refused (the launch has no order, so any of these would race):
    a restore's destination slot is a store's source slot or another restore's
    destination; a store's units are another store's units, a restore's source units,
    or scrubbed; a restore's source units are scrubbed. Two stores reading one slot, or
    two restores reading one image, are reads only and allowed.

    Args:
        layout: this worker's layout (``layout_id``, ``image_bytes``, units per image).
        stores, restores: the ops of the batch.
        scrub_units: units to zero-fill in the same launch (G10).
        num_slots, num_blocks: the tensors' slot and unit counts.
        max_ops: the most copies a batch may hold (the descriptor's capacity).

    Raises:
        CopyOpError: an op is malformed or out of range (first offending op named).
        BatchHazardError: two ops touch the same bytes.
        BatchTooLargeError: more than ``max_ops`` copies.
        InvalidArgumentError: ``scrub_units`` is not an iterable of ints.
    """
    return _validate(
        _layout_key(layout), stores, restores, scrub_units, num_slots, num_blocks, max_ops
    )


def _layout_key(layout: CheckpointLayout) -> tuple[str, int, int]:
    """``(layout_id, image_bytes, units_per_checkpoint)``: the layout's numbers that
    validation compares against (computed properties: an executor keeps them)."""
    return layout.layout_id, layout.image_bytes, layout.units_per_checkpoint


def _validate(
    key: tuple[str, int, int],
    stores: Sequence[CheckpointStoreOp],
    restores: Sequence[CheckpointRestoreOp],
    scrub_units: Iterable[int],
    num_slots: int,
    num_blocks: int,
    max_ops: int | None,
) -> CheckedBatch:
    """:func:`validate_batch` with the layout's numbers given (:func:`_layout_key`)."""
    if (
        type(scrub_units) is tuple
        and not scrub_units
        and type(stores) in (list, tuple)
        and type(restores) in (list, tuple)
        and len(stores) + len(restores) == 1
    ):
        one = _one_op_batch(key, stores, restores, num_slots, num_blocks)
        if one is not None:
            return one
    try:
        stores, restores = list(stores), list(restores)
    except TypeError:
        raise CopyOpError(
            f"stores and restores must be sequences of ops, got {stores!r} and {restores!r}"
        ) from None
    n = len(stores) + len(restores)
    if max_ops is not None and n > max_ops:
        raise BatchTooLargeError(
            f"a batch asked to copy {n} checkpoints, more than the {max_ops} its descriptor"
            " was sized for (max_ops_per_batch); nothing was copied, and the ops were already"
            " drained from the coordinator: size the executor for the largest drain,"
            " checkpoint_copy_ops_per_batch(max_num_seqs)"
        )
    try:
        scrub_given = list(scrub_units)
    except TypeError:
        raise InvalidArgumentError(
            f"scrub_units must be an iterable of ints, got {scrub_units!r}"
        ) from None
    # Types first: a set would fold True and 1.0 into an int 1 beside it.
    bad = next((x for x in scrub_given if type(x) is not int), None)
    if bad is not None or any(type(x) is not int for x in scrub_given):
        raise CopyOpError(f"scrub units must be ints, got {bad!r}")
    scrub = list(set(scrub_given))
    fast = _fast_batch(key, stores, restores, scrub, num_slots, num_blocks)
    if fast is not None:
        return fast
    _slow_batch(key, stores, restores, scrub, num_slots, num_blocks)
    raise AssertionError(  # pragma: no cover - the two paths disagree: a bug here
        "validate_batch: the vectorized check refused a batch the per-op check accepts"
    )


def _slow_batch(
    key: tuple[str, int, int],
    stores: list[Any],
    restores: list[Any],
    scrub_list: list[Any],
    num_slots: int,
    num_blocks: int,
) -> None:
    """The per-op check: raises naming the first problem of the batch. ``key`` is
    :func:`_layout_key`'s. O(units)."""
    lid, img, u = key
    s_slots: list[int] = []
    s_units: list[tuple[int, ...]] = []
    for i, op in enumerate(stores):
        slot, ids = _check_op("store", i, op, CheckpointStoreOp, lid, img, u, num_slots, num_blocks)
        s_slots.append(slot)
        s_units.append(ids)
    r_slots: list[int] = []
    r_units: list[tuple[int, ...]] = []
    for i, rop in enumerate(restores):
        slot, ids = _check_op(
            "restore", i, rop, CheckpointRestoreOp, lid, img, u, num_slots, num_blocks
        )
        r_slots.append(slot)
        r_units.append(ids)
    try:
        scrub = sorted(scrub_list)
    except TypeError:
        raise CopyOpError(f"scrub units must be ints, got {scrub_list!r}") from None
    for x in scrub:
        if type(x) is not int or not 0 <= x < num_blocks:
            raise CopyOpError(f"scrub unit {x!r} outside [0, {num_blocks})")

    written_units: dict[int, str] = {}
    for i, ids in enumerate(s_units):
        for x in ids:
            if x in written_units:
                raise BatchHazardError(
                    f"store {i} writes unit {x}, which {written_units[x]} writes"
                )
            written_units[x] = f"store {i}"
    for x in scrub:
        if x in written_units:
            raise BatchHazardError(f"scrub zeroes unit {x}, which {written_units[x]} writes")
        written_units[x] = "the scrub"
    for i, ids in enumerate(r_units):
        for x in ids:
            if x in written_units:
                raise BatchHazardError(
                    f"restore {i} reads unit {x}, which {written_units[x]} writes"
                )
    read_slots = {s: i for i, s in enumerate(s_slots)}
    written_slots: dict[int, int] = {}
    for i, s in enumerate(r_slots):
        if s in written_slots:
            raise BatchHazardError(f"restores {written_slots[s]} and {i} both write slot {s}")
        if s in read_slots:
            raise BatchHazardError(
                f"restore {i} writes slot {s}, which store {read_slots[s]} reads"
            )
        written_slots[s] = i
