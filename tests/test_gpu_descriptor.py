"""Descriptors on the device (SPEC E.4, E.5): the Triton executor uploads O(ops + runs)
integers per batch and its kernel derives every address from them and from per-span
affine tables uploaded once. Checked against :func:`pagedstate.gpu.plan.write_descriptor`
(the specification of the addresses):

- on the host: :meth:`TritonCopyExecutor.rows_of_upload` (a NumPy model of the kernel's
  address arithmetic, applied to the very integers staged for upload) gives exactly the
  rows ``write_descriptor`` gives over the tensors' base tables, for stores, restores
  (columns swapped) and scrubs, with images in one run, in many runs, runs out of order;
- on the tensors (the kernel under ``TRITON_INTERPRET=1``): the bytes the kernel writes are
  the bytes a plain row-by-row copy of ``write_descriptor``'s rows writes, for mixed
  batches of fragmented stores, restores and scrubs, on the 16-byte and the byte path, and
  with the grid of a CUDA graph capture (the capacity's programs, the extra ones exiting);
- validation on runs (SPEC E.5 step 1): the vectorized interval check and the per-op check
  agree on random batches, hazards found on runs, ops built from runs never expanded.
"""

from __future__ import annotations

import random
from typing import Any
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gpu_helpers import fill_random, small_layout, snapshot, triton_interpreted  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pagedstate.gpu import validation as validation_module  # noqa: E402
from pagedstate.gpu.executor import TorchCopyExecutor  # noqa: E402
from pagedstate.gpu.geometry import CheckpointLayout, load_geometry  # noqa: E402
from pagedstate.gpu.plan import write_descriptor  # noqa: E402
from pagedstate.gpu.tensors import StateTensors  # noqa: E402
from pagedstate.gpu.triton_copy import TritonCopyExecutor  # noqa: E402
from pagedstate.gpu.validation import (  # noqa: E402
    CheckedBatch,
    _layout_key,
    _slow_batch,
    validate_batch,
)
from pagedstate.spec.errors import (  # noqa: E402
    BatchHazardError,
    CopyOpError,
    PagedStateError,
)
from pagedstate.spec.ops import unit_runs  # noqa: E402
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp  # noqa: E402

needs_kernel = pytest.mark.skipif(
    not triton_interpreted(), reason="the kernel runs here only under TRITON_INTERPRET=1"
)


def _fragments(units: list[int], rng: random.Random, pieces: int) -> tuple[int, ...]:
    """``units`` cut into about ``pieces`` stretches, the stretches shuffled: an image in
    many runs, out of order."""
    cuts = sorted(rng.sample(range(1, len(units)), min(pieces, len(units)) - 1))
    parts = [units[a:b] for a, b in zip([0, *cuts], [*cuts, len(units)], strict=True)]
    rng.shuffle(parts)
    return tuple(x for p in parts for x in p)


def _op(cls: type, layout: CheckpointLayout, slot: int, ids: tuple[int, ...], how: str) -> Any:
    """An op over ``ids`` built from unit ids, from checked runs, or as the store builds
    it (``_of_runs``, unchecked, ``unit_ids`` not expanded)."""
    img, lid = layout.image_bytes, layout.layout_id
    if how == "ids":
        return cls(slot, ids, img, lid)
    runs = unit_runs(ids)
    if how == "runs":
        return cls.from_runs(slot, runs, img, lid)
    return cls._of_runs(slot, runs, img, lid)


def _mixed_batch(
    layout: CheckpointLayout,
    blocks: int,
    slots: int,
    seed: int,
    n_store: int,
    n_restore: int,
    n_scrub: int,
    how: str = "of_runs",
) -> tuple[list[Any], list[Any], list[int]]:
    """A hazard-free batch: stores and restores on disjoint stretches of ``U`` units (in
    turn one run, a few runs out of order, ``U`` single-unit runs descending), stores from
    two slots, restores into other slots, ``n_scrub`` units of a free stretch scrubbed."""
    rng = random.Random(seed)
    u = layout.units_per_checkpoint
    chunks = [list(range(i * u, (i + 1) * u)) for i in range(blocks // u)]
    rng.shuffle(chunks)
    order = list(range(slots))
    rng.shuffle(order)
    stores, restores = [], []
    for i in range(n_store + n_restore):
        chunk = chunks[i]
        kind = i % 3
        if kind == 0:
            ids = tuple(chunk)
        elif kind == 1:
            ids = _fragments(chunk, rng, 3)
        else:
            ids = tuple(reversed(chunk))
        if i < n_store:
            stores.append(_op(CheckpointStoreOp, layout, order[i % 2], ids, how))
        else:
            restores.append(_op(CheckpointRestoreOp, layout, order[2 + i - n_store], ids, how))
    return stores, restores, sorted(rng.sample(chunks[n_store + n_restore], n_scrub))


def _want_rows(
    t: StateTensors, plan: Any, stores: list[Any], restores: list[Any], scrub: list[int]
) -> np.ndarray:
    """``write_descriptor``'s rows for the batch over ``t``'s base tables (stores, then
    restores backwards, then one zero-fill row per region per scrub unit)."""
    parts = []
    for ops, fwd in ((stores, True), (restores, False)):
        if not ops:
            continue
        slots = [op.src_slot if fwd else op.dst_slot for op in ops]
        units = np.array([op.unit_ids for op in ops], dtype=np.int64)
        out = np.empty((len(ops) * plan.num_spans, 3), np.int64)
        write_descriptor(out, plan, t.slot_bases(slots), t.unit_bases(units), forward=fwd)
        parts.append(out)
    if scrub:
        addr = t.unit_bases(np.array(scrub).reshape(-1, 1)).reshape(-1)
        r = len(t.layout.region_bytes)
        lens = np.tile(np.asarray(t.layout.region_bytes, np.int64), len(scrub))
        parts.append(np.stack((np.zeros_like(addr), addr, lens), axis=1))
        assert len(addr) == r * len(scrub)
    return np.concatenate(parts)


def _staged(ex: TritonCopyExecutor, batch: CheckedBatch) -> np.ndarray:
    out = np.full(ex._stage_np[0].shape, -7, dtype=np.int64)
    n = ex._stage_batch(out, batch)
    assert (out[n:] == -7).all()  # nothing past the count
    return out[:n]


@pytest.mark.parametrize("how", ["ids", "runs", "of_runs"])
@pytest.mark.parametrize("model", ["Qwen3-Next", "Kimi-Linear", "MiniMax"])
def test_rows_of_upload_equal_write_descriptor(
    model: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CPU tensors: the executor is only built (no kernel runs), which it allows under the
    # interpreter's variable, also on a machine with a GPU.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    layout = load_geometry(model).sliced(2, 2, 16).layout(16, spec_tokens=1)
    u = layout.units_per_checkpoint
    blocks = 9 * u
    t = StateTensors(layout, 6, blocks)
    ex = TritonCopyExecutor(t, 6, max_scrub_units=5)
    stores, restores, scrub = _mixed_batch(layout, blocks, 6, 3, 2, 3, 5, how)
    batch = ex.check(stores, restores, scrub)
    ints = _staged(ex, batch)
    n, m = 5, batch.runs
    assert len(ints) == 4 + 2 * n + 1 + 2 * m + 5
    assert m == sum(len(op.runs) for op in [*stores, *restores]) and m > n  # fragmented
    if how == "of_runs":  # the check and the staging never expanded the ops' unit ids
        assert all(op._ids is None for op in [*stores, *restores])
    got = ex.rows_of_upload(ints)
    want = _want_rows(t, ex.plan, stores, restores, scrub)
    assert got.shape == want.shape == (5 * ex.plan.num_spans + 5 * len(layout.region_bytes), 3)
    assert np.array_equal(got, want)


def test_upload_is_o_ops_plus_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 Kimi-Linear images of one run each: 4 + 2 * 256 + 1 + 2 * 256 integers (a row
    descriptor had 256 * 2,390 rows of 3)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    layout = load_geometry("Kimi-Linear").sliced(2, 2, 16).layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 256, 256 * u)
    ex = TritonCopyExecutor(t, 256, max_scrub_units=0)
    img, lid = layout.image_bytes, layout.layout_id
    ops = [CheckpointStoreOp._of_runs(i, ((i * u, u),), img, lid) for i in range(256)]
    batch = ex.check(ops, [])
    assert len(_staged(ex, batch)) == 4 + 512 + 1 + 512
    assert all(op._ids is None for op in ops)


# -- the kernel's bytes against write_descriptor's rows ----------------------------------


def _apply_rows(t: StateTensors, rows: np.ndarray) -> None:
    """Copy ``rows`` (absolute addresses; source 0: zero fill) byte by byte into the
    tensors, by finding the tensor each address lies in: the reference for the kernel."""
    views = [(x.data_ptr(), x.view(-1).view(torch.uint8)) for x in t.all_tensors()]

    def at(addr: int, n: int) -> Any:
        for base, v in views:
            if base <= addr and addr + n <= base + v.numel():
                return v[addr - base : addr - base + n]
        raise AssertionError(f"address {addr} (+{n}) is in no tensor")

    reads = [None if s == 0 else at(int(s), int(n)).clone() for s, _, n in rows]
    for (_, d, n), data in zip(rows, reads, strict=True):
        dst = at(int(d), int(n))
        dst.copy_(torch.zeros_like(dst) if data is None else data)


@needs_kernel
@pytest.mark.parametrize("wide", [True, False], ids=["16-byte", "bytes"])
@pytest.mark.parametrize("capacity_grid", [False, True], ids=["batch-grid", "capture-grid"])
def test_kernel_writes_exactly_the_rows_bytes(wide: bool, capacity_grid: bool) -> None:
    layout = small_layout()  # 5 units of 2 regions, conv rows not carried
    u = layout.units_per_checkpoint
    blocks, slots = 8 * u, 6
    tensors = [StateTensors(layout, slots, blocks) for _ in range(2)]
    for x in tensors:
        fill_random(x, 5)
    ex = TritonCopyExecutor(
        tensors[0], 6, block=256, rows_per_program=4, max_scrub_units=4, wide=wide
    )
    assert ex.wide is wide
    stores, restores, scrub = _mixed_batch(layout, blocks, slots, 11, 2, 3, 4)
    assert sum(len(op.runs) for op in [*stores, *restores]) > 5  # fragmented
    batch = ex.check(stores, restores, scrub)
    if capacity_grid:
        ints = _staged(ex, batch)
        dev = torch.as_tensor(ints.copy())
        assert ex._grid_cap > ex.programs(batch.copies, len(batch.scrub_units))
        ex._launch(dev, ex._grid_cap)
    else:
        ex.execute(stores, restores, scrub)
        assert ex.last_upload_ints == 4 + 2 * 5 + 1 + 2 * batch.runs + 4
    assert all(op._ids is None for op in [*stores, *restores])  # runs all the way
    _apply_rows(tensors[1], _want_rows(tensors[1], ex.plan, stores, restores, scrub))
    a, b = snapshot(tensors[0]), snapshot(tensors[1])
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@needs_kernel
def test_kernel_round_trip_of_single_unit_runs_in_reverse() -> None:
    """An image whose every unit is its own run, in descending order (the longest binary
    search), stored and restored; the torch executor over the same ops agrees."""
    layout = small_layout()
    u = layout.units_per_checkpoint
    blocks = 4 * u
    ts = [StateTensors(layout, 4, blocks) for _ in range(2)]
    for x in ts:
        fill_random(x, 9)
    tri = TritonCopyExecutor(ts[0], 4, block=256, rows_per_program=2)
    tor = TorchCopyExecutor(ts[1], 4)
    ids = tuple(range(blocks - 1, blocks - 1 - 2 * u, -2))
    assert len(unit_runs(ids)) == u
    img0 = ts[0].read_image(0).clone()
    img, lid = layout.image_bytes, layout.layout_id
    for ex in (tri, tor):
        ex.execute([CheckpointStoreOp._of_runs(0, unit_runs(ids), img, lid)])
        ex.execute([], [CheckpointRestoreOp._of_runs(3, unit_runs(ids), img, lid)])
    assert torch.equal(ts[0].read_image(3), img0)
    assert torch.equal(ts[0].read_units(ids)[: layout.image_bytes], img0)
    a, b = snapshot(ts[0]), snapshot(ts[1])
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# -- validation on runs (SPEC E.5 step 1) -------------------------------------------------

L = small_layout()
U = L.units_per_checkpoint
BLOCKS, SLOTS = 8 * U, 6


def _st(slot: int, runs: tuple[tuple[int, int], ...]) -> CheckpointStoreOp:
    return CheckpointStoreOp._of_runs(slot, runs, L.image_bytes, L.layout_id)


def _rs(slot: int, runs: tuple[tuple[int, int], ...]) -> CheckpointRestoreOp:
    return CheckpointRestoreOp._of_runs(slot, runs, L.image_bytes, L.layout_id)


def _validate(stores: list[Any], restores: list[Any], scrub: list[int] = ()) -> CheckedBatch:
    return validate_batch(L, stores, restores, scrub, num_slots=SLOTS, num_blocks=BLOCKS)


def test_checked_batch_carries_the_runs_and_expands_units_lazily() -> None:
    s = _st(2, ((7, 2), (0, 3)))
    r = _rs(0, ((12, 1), (10, 2), (19, 1), (15, 1)))
    b = _validate([s], [r], [5, 6])
    assert b.store_slots.tolist() == [2] and b.restore_slots.tolist() == [0]
    assert b.op_runs.tolist() == [0, 2, 6]
    assert b.run_first.tolist() == [7, 0, 12, 10, 19, 15]
    assert b.run_piece.tolist() == [0, 2, 0, 1, 3, 4]
    assert b.run_count.tolist() == [2, 3, 1, 2, 1, 1]
    assert b.store_units.tolist() == [[7, 8, 0, 1, 2]]
    assert b.restore_units.tolist() == [[12, 10, 11, 19, 15]]
    assert b.scrub_units.tolist() == [5, 6] and b.copies == 2 and b.runs == 6
    assert s._ids is None and r._ids is None  # never expanded by the check


@pytest.mark.parametrize(
    ("what", "stores", "restores", "scrub", "err"),
    [
        ("runs of one store overlap", [_st(0, ((0, 3), (1, 2)))], [], [], CopyOpError),
        ("runs of one restore overlap", [], [_rs(0, ((4, 2), (8, 2), (5, 1)))], [], CopyOpError),
        ("a run ends past the pool", [_st(0, ((BLOCKS - 2, 5),))], [], [], CopyOpError),
        ("a run of count 0", [_st(0, ((0, 0), (1, 5)))], [], [], CopyOpError),
        ("a negative first unit", [], [_rs(0, ((-1, 5),))], [], CopyOpError),
        ("counts sum past U", [_st(0, ((0, 3), (9, 3)))], [], [], CopyOpError),
        ("a float count", [_st(0, ((0, 5.0),))], [], [], CopyOpError),
        ("a run that is no pair", [_st(0, ((0, 4, 1), (9,)))], [], [], CopyOpError),
        (
            "stores' runs overlap in the middle",
            [_st(0, ((0, 5),)), _st(1, ((9, 2), (3, 3)))],
            [],
            [],
            BatchHazardError,
        ),
        (
            "a restore's run meets a store's",
            [_st(0, ((0, 5),))],
            [_rs(1, ((5, 4), (4, 1)))],
            [],
            BatchHazardError,
        ),
        ("a restore's run holds a scrub unit", [], [_rs(1, ((10, 5),))], [14], BatchHazardError),
        ("a store's run holds a scrub unit", [_st(1, ((10, 5),))], [], [10], BatchHazardError),
    ],
)
def test_refusals_on_runs(
    what: str, stores: list[Any], restores: list[Any], scrub: list[int], err: type
) -> None:
    with pytest.raises(err) as info:
        _validate(stores, restores, scrub)
    if err is CopyOpError:
        assert not isinstance(info.value, BatchHazardError), what


def test_neighbouring_runs_that_touch_are_no_hazard() -> None:
    """Intervals are half-open: a run ending where another op's begins shares no unit."""
    b = _validate([_st(0, ((0, 5),)), _st(0, ((5, 2), (12, 3)))], [_rs(1, ((7, 5),))], [15, 16])
    assert b.store_units.tolist() == [[0, 1, 2, 3, 4], [5, 6, 12, 13, 14]]
    assert b.restore_units.tolist() == [[7, 8, 9, 10, 11]]


@st.composite
def _batches(draw: Any) -> tuple[list[Any], list[Any], list[int]]:
    """Mostly valid batches (ops on disjoint stretches of a shuffled pool, as one run,
    sorted or shuffled; distinct restore slots; free units scrubbed), some with one defect
    (a unit out of range, named twice or shared, a unit too many or too few, a slot out of
    range or shared, a bool): both outcomes are common."""
    perm = list(draw(st.permutations(range(BLOCKS))))
    n_st, n_rs = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    ops = []
    for i in range(n_st + n_rs):
        chunk = perm[i * U : (i + 1) * U]
        mode = draw(st.sampled_from(["shuffled", "sorted", "one run"]))
        if mode == "sorted":
            chunk = sorted(chunk)
        elif mode == "one run":
            first = min(chunk)
            chunk = list(range(first, min(first + U, BLOCKS)))
        ops.append(chunk)
    slots = [draw(st.integers(0, SLOTS - 1)) for _ in range(n_st)]
    slots += list(draw(st.permutations(range(SLOTS))))[:n_rs]
    free = perm[(n_st + n_rs) * U :]
    scrub = draw(st.lists(st.sampled_from(free), max_size=4)) if free else []
    if ops and draw(st.booleans()):
        i = draw(st.integers(0, len(ops) - 1))
        units = ops[i]
        defect = draw(st.integers(0, 7))
        if defect == 0:
            units[draw(st.integers(0, len(units) - 1))] = draw(st.sampled_from([-1, BLOCKS]))
        elif defect == 1:
            units[-1] = units[0]
        elif defect == 2:
            units.pop()
        elif defect == 3:
            units.append(draw(st.integers(0, BLOCKS - 1)))
        elif defect == 4:
            slots[i] = draw(st.sampled_from([-1, SLOTS, True]))
        elif defect == 5 and len(ops) > 1:  # a unit of another op
            units[0] = ops[(i + 1) % len(ops)][-1]
        elif defect == 6 and len(slots) > 1:
            slots[i] = slots[(i + 1) % len(slots)]
        elif defect == 7:
            scrub.append(units[-1])
    built = []
    for i, (units, slot) in enumerate(zip(ops, slots, strict=True)):
        cls = CheckpointStoreOp if i < n_st else CheckpointRestoreOp
        how = draw(st.sampled_from(["ids", "of_runs"]))
        if how == "of_runs" and min(units, default=0) >= 0:
            built.append(cls._of_runs(slot, unit_runs(units), L.image_bytes, L.layout_id))
        else:
            built.append(cls(slot, tuple(units), L.image_bytes, L.layout_id))
    return built[:n_st], built[n_st:], scrub


@settings(max_examples=400, deadline=None)
@given(_batches())
def test_vectorized_and_per_op_checks_agree(batch: tuple[list[Any], list[Any], list[int]]) -> None:
    """validate_batch (the interval check, in plain Python for a few runs and with NumPy
    for many, then the per-op one on refusal) accepts exactly the batches the per-op check
    accepts, and then carries every op's units; both interval checks give the same
    arrays."""
    stores, restores, scrub = batch
    try:
        _slow_batch(_layout_key(L), stores, restores, list(set(scrub)), SLOTS, BLOCKS)
        slow_ok = True
    except PagedStateError:
        slow_ok = False
    got = []
    for small in (validation_module.SMALL_BATCH, 0):
        with mock.patch.object(validation_module, "SMALL_BATCH", small):
            try:
                got.append(_validate(stores, restores, scrub))
            except PagedStateError:
                got.append(None)
    for b in got:
        assert (b is not None) == slow_ok
        if b is None:
            continue
        assert b.store_units.tolist() == [list(op.unit_ids) for op in stores]
        assert b.restore_units.tolist() == [list(op.unit_ids) for op in restores]
        assert b.scrub_units.tolist() == sorted(set(scrub))
    if slow_ok:
        assert np.array_equal(got[0].packed, got[1].packed)


def test_an_evolved_batch_drives_torch_and_is_refused_by_triton(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``attrs.evolve(batch, store_slots=..., store_units=...)`` (tests planting a dropped
    copy do this): the torch executor copies the arrays given; the Triton executor, which
    uploads the integers validation packed, refuses the changed batch instead of copying
    what the arrays no longer say."""
    import attrs

    from pagedstate.spec.errors import InvalidArgumentError

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    t = StateTensors(L, SLOTS, BLOCKS)
    fill_random(t, 2)
    b = _validate([_st(0, ((0, U),))], [_rs(1, ((U, U),))])
    dropped = attrs.evolve(
        b, store_slots=np.zeros(0, np.int64), store_units=np.zeros((0, U), np.int64)
    )
    assert dropped.copies == 1 and dropped.restore_units.tolist() == [list(range(U, 2 * U))]
    before = snapshot(t)
    TorchCopyExecutor(t, 4)._run(dropped)
    after, k = snapshot(t), len(L.slot_tensors)
    for r in range(len(L.region_bytes)):  # the dropped store's units: untouched
        assert torch.equal(before[k + r].view(BLOCKS, -1)[:U], after[k + r].view(BLOCKS, -1)[:U])
    assert torch.equal(t.read_image(1), t.read_units(list(range(U, 2 * U)))[: L.image_bytes])
    with pytest.raises(InvalidArgumentError):
        TritonCopyExecutor(t, 4)._run(dropped)
