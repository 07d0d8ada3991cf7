"""The copy executors on real (CPU) tensors: op validation and the hazard check (F61, every
refusal writes nothing), the live-bytes round trip (F62), scrubs (SPEC G10),
``free_dirty_units`` against the production pool, and the two executors agreeing.

Every test runs against :class:`~pagedstate.gpu.TorchCopyExecutor` and, when Triton is
installed, :class:`~pagedstate.gpu.triton_copy.TritonCopyExecutor` under the Triton
interpreter (``gpu_helpers`` sets ``TRITON_INTERPRET=1`` before Triton is imported).
"""

from __future__ import annotations

import importlib.util
import os
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from gpu_helpers import (  # noqa: E402 - after the torch check
    executor_names,
    fill_random,
    make_executor,
    mini_layout,
    same_bytes,
    small_layout,
    snapshot,
    tiny_layout,
    triton_interpreted,
)
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from plant_helpers import edited_method  # noqa: E402

from pagedstate.gpu import StateTensors  # noqa: E402
from pagedstate.gpu import validation as validation_module  # noqa: E402
from pagedstate.gpu.executor import free_dirty_units, validate_batch  # noqa: E402
from pagedstate.gpu.geometry import CheckpointLayout  # noqa: E402
from pagedstate.gpu.validation import _fast_batch, _layout_key, _one_op_batch  # noqa: E402
from pagedstate.impl import PageUnitCheckpointStore, UnitPool  # noqa: E402
from pagedstate.spec.errors import (  # noqa: E402
    BatchHazardError,
    BatchTooLargeError,
    CopyOpError,
    InvalidArgumentError,
)
from pagedstate.spec.ops import unit_runs  # noqa: E402
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp  # noqa: E402

EXECUTORS = executor_names()
SLOTS, BLOCKS = 4, 16


@pytest.fixture(params=EXECUTORS)
def ex_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def store(layout: CheckpointLayout, slot: int, units: tuple[int, ...]) -> CheckpointStoreOp:
    return CheckpointStoreOp(slot, units, layout.image_bytes, layout.layout_id)


def restore(layout: CheckpointLayout, slot: int, units: tuple[int, ...]) -> CheckpointRestoreOp:
    return CheckpointRestoreOp(slot, units, layout.image_bytes, layout.layout_id)


def setup(name: str, layout: CheckpointLayout | None = None, max_ops: int = 4, **kw: Any):
    layout = layout or small_layout()
    t = StateTensors(layout, SLOTS, BLOCKS)
    fill_random(t, 7)
    return layout, t, make_executor(name, t, max_ops, **kw)


def test_the_triton_executor_is_not_silently_left_out() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is not 1 (a CUDA machine): test_gpu_cuda.py runs Triton")
    assert triton_interpreted(), "triton imports but its kernel is not the interpreter's"
    assert EXECUTORS == ["torch", "triton"]


# -- F61: op validation, the whole batch refused, nothing written ---------------------------


def _bad_batches(layout: CheckpointLayout) -> list[tuple[str, list[Any], list[Any], list[Any]]]:
    u = layout.units_per_checkpoint
    ok_units = tuple(range(u))
    good = store(layout, 0, ok_units)
    rest = tuple(range(u, 2 * u))
    img, lid = layout.image_bytes, layout.layout_id
    return [
        ("layout_id", [good, CheckpointStoreOp(1, rest, img, lid + "-v2")], [], []),
        ("restore layout_id", [good], [CheckpointRestoreOp(1, rest, img, "dsv4-v2")], []),
        ("total_bytes", [good], [CheckpointRestoreOp(1, rest, img - 1, lid)], []),
        ("total_bytes slot", [good, CheckpointStoreOp(1, rest, layout.slot_bytes, lid)], [], []),
        ("too few units", [good, store(layout, 1, rest[:-1])], [], []),
        ("too many units", [good], [restore(layout, 1, (*rest, 2 * u))], []),
        ("unit >= num_blocks", [good, store(layout, 1, (*rest[:-1], BLOCKS))], [], []),
        ("negative unit", [good], [restore(layout, 1, (-1, *rest[1:]))], []),
        ("bool unit", [good], [restore(layout, 1, (True, *rest[1:]))], []),
        ("units as a list", [good], [CheckpointRestoreOp(1, list(rest), img, lid)], []),  # type: ignore[arg-type]
        ("duplicate unit", [good, store(layout, 1, (rest[0], *rest[:-1]))], [], []),
        ("store slot >= num_slots", [good, store(layout, SLOTS, rest)], [], []),
        ("negative store slot", [good, store(layout, -1, rest)], [], []),
        ("restore slot >= num_slots", [good], [restore(layout, SLOTS, rest)], []),
        ("negative restore slot", [good], [restore(layout, -1, rest)], []),
        ("a restore as a store", [good, restore(layout, 1, rest)], [], []),
        ("a store as a restore", [good], [store(layout, 1, rest)], []),
        ("scrub unit out of range", [good], [], [BLOCKS]),
        ("negative scrub unit", [good], [], [-1]),
    ]


@pytest.mark.parametrize("case", range(19))
def test_f61_a_bad_op_refuses_the_whole_batch_and_writes_nothing(ex_name: str, case: int) -> None:
    layout, t, ex = setup(ex_name)
    cases = _bad_batches(layout)
    assert len(cases) == 19
    what, stores, restores, scrub = cases[case]
    before = snapshot(t)
    with pytest.raises(CopyOpError) as info:
        ex.execute(stores, restores, scrub)
    assert isinstance(info.value, RuntimeError), what
    assert not isinstance(info.value, BatchHazardError), what
    assert same_bytes(before, snapshot(t)), f"{what}: a refused batch wrote bytes"
    assert ex.batches == 0


def test_f61_more_ops_than_the_batch_bound(ex_name: str) -> None:
    layout, t, ex = setup(ex_name, max_ops=2)
    u = layout.units_per_checkpoint
    ops = [store(layout, 0, tuple(range(u))), store(layout, 1, tuple(range(u, 2 * u)))]
    before = snapshot(t)
    with pytest.raises(BatchTooLargeError) as info:
        ex.execute(ops, [restore(layout, 2, tuple(range(2 * u, 3 * u)))])
    assert isinstance(info.value, RuntimeError)
    assert same_bytes(before, snapshot(t))
    ex.execute(ops)  # two copies fit
    assert ex.batches == 1


def test_scrub_units_that_are_not_ints_are_refused(ex_name: str) -> None:
    layout, t, ex = setup(ex_name)
    before = snapshot(t)
    for bad in ([1, "2"], [1.0], [None]):
        with pytest.raises((InvalidArgumentError, CopyOpError)):
            ex.execute([], [], bad)
    assert same_bytes(before, snapshot(t))


# -- the hazard check ---------------------------------------------------------------------


def _hazards(layout: CheckpointLayout) -> list[tuple[str, list[Any], list[Any], list[int]]]:
    u = layout.units_per_checkpoint
    a = tuple(range(u))
    b = tuple(range(u, 2 * u))
    c = tuple(range(2 * u, 3 * u))
    shared = (b[0], *c[1:])  # one unit of b
    return [
        (
            "two stores write one unit",
            [store(layout, 0, a), store(layout, 1, (*b[:-1], a[-1]))],
            [],
            [],
        ),
        (
            "store writes a unit a restore reads",
            [store(layout, 0, b)],
            [restore(layout, 2, shared)],
            [],
        ),
        ("scrub zeroes a unit a store writes", [store(layout, 0, a)], [], [a[1]]),
        ("scrub zeroes a unit a restore reads", [], [restore(layout, 1, b)], [b[-1]]),
        ("two restores write one slot", [], [restore(layout, 1, b), restore(layout, 1, c)], []),
        ("restore writes a slot a store reads", [store(layout, 2, a)], [restore(layout, 2, b)], []),
    ]


@pytest.mark.parametrize("case", range(6))
def test_every_hazard_refuses_the_whole_batch_and_writes_nothing(ex_name: str, case: int) -> None:
    layout, t, ex = setup(ex_name)
    what, stores, restores, scrub = _hazards(layout)[case]
    before = snapshot(t)
    with pytest.raises(BatchHazardError) as info:
        ex.execute(stores, restores, scrub)
    assert isinstance(info.value, CopyOpError) and isinstance(info.value, RuntimeError), what
    assert same_bytes(before, snapshot(t)), f"{what}: a refused batch wrote bytes"


def test_reads_only_sharing_is_allowed(ex_name: str) -> None:
    """Two stores of one slot, and two restores of one image, only read the shared bytes."""
    layout, t, ex = setup(ex_name)
    u = layout.units_per_checkpoint
    a, b = tuple(range(u)), tuple(range(u, 2 * u))
    img0 = t.read_image(0)
    ex.execute([store(layout, 0, a), store(layout, 0, b)])
    assert torch.equal(t.read_units(a)[: layout.image_bytes], img0)
    assert torch.equal(t.read_units(b)[: layout.image_bytes], img0)
    ex.execute([], [restore(layout, 1, b), restore(layout, 2, b)], list(a))
    assert torch.equal(t.read_image(1), img0) and torch.equal(t.read_image(2), img0)
    assert (t.read_units(a) == 0).all()


# -- F62: the round trip carries live bytes only -------------------------------------------


def _non_image(t: StateTensors, slot: int) -> list[Any]:
    return [
        t.slot_row(i, slot)[info.carried_bytes :].clone()
        for i, info in enumerate(t.layout.slot_tensors)
    ]


@pytest.mark.parametrize("defaults", [False, True], ids=["small-chunks", "default-chunks"])
def test_f62_round_trip_of_live_bytes_only(ex_name: str, defaults: bool) -> None:
    if defaults and ex_name == "torch":
        pytest.skip("block settings are the Triton executor's")
    kw = {"block": 1024, "rows_per_program": 4} if defaults else {}
    layout, t, ex = setup(ex_name, **kw)
    assert layout.spec_tokens >= 1 and layout.slot_bytes > layout.image_bytes
    u = layout.units_per_checkpoint
    units = (11, 2, 7, 0, 14)[:u]  # non-contiguous, out of order
    assert len(units) == u
    img0 = t.read_image(0)
    before = snapshot(t)
    others = [x for x in range(BLOCKS) if x not in units]
    other_units = t.read_units(others).clone()
    slot1_rest = _non_image(t, 1)
    tail = t.read_units(units)[layout.image_bytes :].clone()
    assert len(tail) == u * layout.page_unit_bytes - layout.image_bytes > 0
    ex.execute([store(layout, 0, units)])
    stream = t.read_units(units)
    assert torch.equal(stream[: layout.image_bytes], img0)
    assert torch.equal(stream[layout.image_bytes :], tail), "the last unit's tail was written"
    assert torch.equal(t.read_units(others), other_units)
    for s in range(SLOTS):
        assert torch.equal(t.read_slot(s), before_slot(before, t, s)), f"slot {s} changed"
    ex.execute([], [restore(layout, 1, units)])
    assert torch.equal(t.read_image(1), img0), "the carried ranges differ"
    for got, want in zip(_non_image(t, 1), slot1_rest, strict=True):
        assert torch.equal(got, want), "a restore wrote slot 1's non-image bytes"
    assert torch.equal(t.read_units(units)[layout.image_bytes :], tail)
    for s in (0, 2, 3):
        assert torch.equal(t.read_slot(s), before_slot(before, t, s))


def before_slot(before: list[Any], t: StateTensors, slot: int) -> Any:
    """Slot ``slot``'s bytes in a :func:`snapshot` taken earlier (slot tensors come first)."""
    parts = []
    for i, info in enumerate(t.layout.slot_tensors):
        parts.append(before[i].view(t.num_slots, info.row_bytes)[slot])
    return torch.cat(parts)


@pytest.mark.parametrize(
    ("dtype", "elems", "region"),
    [("uint8", 13, 6), ("float16", 13, 10)],
    ids=["13B-into-6B-units", "26B-into-10B-units"],
)
def test_f59_round_trip_leaves_the_tail_at_its_sentinel(
    ex_name: str, dtype: str, elems: int, region: int
) -> None:
    """F59 on both executors (13 bytes: Triton's byte path, not its 16-byte words)."""
    layout = tiny_layout([(dtype, (elems,), None)], (region,))
    image = layout.image_bytes
    t = StateTensors(layout, 2, 5)
    for x in t.all_tensors():
        x.view(torch.uint8).fill_(0xEE)
    data = torch.arange(1, image + 1, dtype=torch.uint8)
    t.write_image(0, data)
    ex = (
        make_executor(ex_name, t, block=2, rows_per_program=2)
        if ex_name == "triton"
        else (make_executor(ex_name, t))
    )
    units = (4, 1, 2)
    ex.execute([store(layout, 0, units)])
    stream = t.read_units(units)
    assert torch.equal(stream[:image], data)
    assert (stream[image:] == 0xEE).all() and len(stream) == 3 * region
    assert (t.read_units([0, 3]) == 0xEE).all()
    ex.execute([], [restore(layout, 1, units)])
    assert torch.equal(t.read_image(1), data)


# -- scrubs (SPEC G10) --------------------------------------------------------------------


def test_scrub_zero_fills_exactly_the_named_units(ex_name: str) -> None:
    layout, t, ex = setup(ex_name)
    before = snapshot(t)
    scrub = [9, 3, 15, 3]
    ex.execute([], [], scrub)
    for unit in range(BLOCKS):
        got = t.read_units([unit])
        if unit in scrub:
            assert (got == 0).all(), unit
        else:
            k = len(t.layout.slot_tensors)
            want = torch.cat(
                [before[k + r].view(BLOCKS, -1)[unit] for r in range(len(layout.region_bytes))]
            )
            assert torch.equal(got, want), f"unit {unit} changed"
    for s in range(SLOTS):
        assert torch.equal(t.read_slot(s), before_slot(before, t, s))


def test_scrub_with_copies_in_one_batch(ex_name: str) -> None:
    layout, t, ex = setup(ex_name)
    u = layout.units_per_checkpoint
    a, b = tuple(range(u)), tuple(range(u, 2 * u))
    ex.execute([store(layout, 0, a)])
    img0 = t.read_image(0)
    ex.execute([store(layout, 3, b)], [restore(layout, 1, a)], [15, 14])
    assert torch.equal(t.read_image(1), img0)
    assert torch.equal(t.read_units(b)[: layout.image_bytes], t.read_image(3))
    assert (t.read_units([14, 15]) == 0).all()


def test_max_scrub_units_refuses_with_nothing_written(ex_name: str) -> None:
    layout, t, ex = setup(ex_name, max_scrub_units=2)
    u = layout.units_per_checkpoint
    before = snapshot(t)
    with pytest.raises(BatchTooLargeError):
        ex.execute([store(layout, 0, tuple(range(u)))], [], [10, 11, 12])
    assert same_bytes(before, snapshot(t))
    ex.execute([], [], [10, 11])
    assert (t.read_units([10, 11]) == 0).all()


def test_free_dirty_units_against_the_production_pool() -> None:
    layout = mini_layout()
    pool = UnitPool(10)
    st = PageUnitCheckpointStore(pool, layout.spec())
    u = layout.units_per_checkpoint
    assert st.begin_store(1, 0) is not None and st.begin_store(2, 1) is not None
    st.complete_inflight()
    units1, units2 = st.records[st.lookup(1)].unit_ids, st.records[st.lookup(2)].unit_ids
    assert free_dirty_units(pool) == []  # reserved checkpoint units are not dirty
    st.unindex(1)  # released: dirty and free
    assert free_dirty_units(pool) == sorted(units1)
    kv = pool.reserve_units(2, ("live-kv", 1))  # a tenant takes two of them back
    assert kv is not None and set(kv) <= set(units1)
    assert free_dirty_units(pool) == sorted(set(units1) - set(kv))
    assert all(pool.is_dirty(x) for x in kv)  # reserved again: still dirty, not offered
    st.unindex(2)
    want = sorted((set(units1) - set(kv)) | set(units2))
    assert free_dirty_units(pool) == want
    t = StateTensors(layout, 2, 10)
    fill_random(t, 3)
    make_executor("torch", t).execute([], [], free_dirty_units(pool))
    assert (t.read_units(want) == 0).all()
    pool.mark_clean(want)
    assert free_dirty_units(pool) == [] and pool.dirty_units() == frozenset(kv)
    assert u == len(units1)


def test_free_dirty_units_leaves_cached_kv_blocks_alone() -> None:
    """A dirty unit (released from a checkpoint) that a KV tenant reserved, wrote and then
    parked as a cached prefix block is free but holds the tenant's KV: scrubbing it would
    zero a block the engine's prefix cache may hit (claim_cached_units) later."""
    layout = mini_layout()
    pool = UnitPool(6)
    st = PageUnitCheckpointStore(pool, layout.spec())
    assert st.begin_store(1, 0) is not None
    st.complete_inflight()
    units = st.records[st.lookup(1)].unit_ids
    st.unindex(1)
    assert free_dirty_units(pool) == sorted(units)
    kv = pool.reserve_units(len(units), ("live-kv", 1))
    assert kv is not None and sorted(kv) == sorted(units)
    t = StateTensors(layout, 1, 6)
    fill_random(t, 5)
    kv_bytes = t.read_units(kv).clone()  # the tenant's KV
    pool.cache_units(kv, ("live-kv", 1), [101, 102, None])  # two blocks stay cached
    assert pool.cached_hash(kv[0]) == 101 and pool.owner_of(kv[0]) is None
    scrub = free_dirty_units(pool)
    assert scrub == [kv[2]], "a cached KV block was offered for scrubbing"
    make_executor("torch", t).execute([], [], scrub)
    pool.mark_clean(scrub)
    pool.claim_cached_units([kv[0], kv[1]], ("live-kv", 2))  # a prefix hit
    n = layout.page_unit_bytes
    assert torch.equal(t.read_units([kv[0], kv[1]]), kv_bytes[: 2 * n])


# -- the executors agree ------------------------------------------------------------------


def _random_batch(
    layout: CheckpointLayout, rng: random.Random
) -> tuple[list[CheckpointStoreOp], list[CheckpointRestoreOp], list[int]]:
    """A valid, hazard-free random batch over SLOTS slots and BLOCKS units."""
    u = layout.units_per_checkpoint
    units = list(range(BLOCKS))
    rng.shuffle(units)
    slots = list(range(SLOTS))
    rng.shuffle(slots)
    n_store, n_restore = rng.randint(0, 2), rng.randint(0, 2)
    stores = [store(layout, slots[0], tuple(units[i * u : (i + 1) * u])) for i in range(n_store)]
    pos = n_store * u
    restores = []
    for i in range(n_restore):
        restores.append(restore(layout, slots[1 + i], tuple(units[pos : pos + u])))
        pos += u
    scrub = units[pos : pos + rng.randint(0, 3)]
    return stores, restores, scrub


def test_both_executors_give_identical_tensors_and_the_expected_bytes() -> None:
    if "triton" not in EXECUTORS:
        pytest.skip("triton is not installed")
    layout = mini_layout()
    rng = random.Random(4)
    tensors = [StateTensors(layout, SLOTS, BLOCKS) for _ in range(3)]
    for x in tensors:
        fill_random(x, 11)
    torch_ex = make_executor("torch", tensors[0])
    triton_ex = make_executor("triton", tensors[1])
    model = tensors[2]  # by hand, from read_image/read_units
    for _ in range(6):
        stores, restores, scrub = _random_batch(layout, rng)
        torch_ex.execute(stores, restores, scrub)
        triton_ex.execute(stores, restores, scrub)
        images = {op.src_slot: model.read_image(op.src_slot) for op in stores}
        loaded = {
            op.dst_slot: model.read_units(op.unit_ids)[: layout.image_bytes] for op in restores
        }
        for op in stores:
            stream = model.read_units(op.unit_ids)
            stream[: layout.image_bytes] = images[op.src_slot]
            _write_units(model, op.unit_ids, stream)
        for slot, data in loaded.items():
            model.write_image(slot, data)
        for unit in scrub:
            model.fill_unit(unit, torch.zeros(layout.page_unit_bytes, dtype=torch.uint8))
        a, b, c = snapshot(tensors[0]), snapshot(tensors[1]), snapshot(model)
        assert same_bytes(a, b), "torch and triton executors differ"
        assert same_bytes(a, c), "the executors differ from the byte model"


def _write_units(t: StateTensors, units: tuple[int, ...], stream: Any) -> None:
    n = t.layout.page_unit_bytes
    for i, unit in enumerate(units):
        t.fill_unit(unit, stream[i * n : (i + 1) * n])


def test_validate_batch_returns_arrays_in_op_order() -> None:
    layout = mini_layout()
    b = validate_batch(
        layout,
        [store(layout, 2, (5, 1, 3))],
        [restore(layout, 0, (7, 6, 4))],
        [9, 8, 9],
        num_slots=3,
        num_blocks=10,
    )
    assert b.store_slots.tolist() == [2] and b.store_units.tolist() == [[5, 1, 3]]
    assert b.restore_slots.tolist() == [0] and b.restore_units.tolist() == [[7, 6, 4]]
    assert b.scrub_units.tolist() == [8, 9] and b.copies == 2


# -- the one-op validation path --------------------------------------------------------------

_ONE_LAYOUT = small_layout()  # 5 units per image


@st.composite
def _one_op(draw: Any) -> tuple[list[Any], list[Any]]:
    """One store or restore op: an image's units drawn as distinct ids in a random order
    (their maximal runs), then at times one corruption: a run moved by one (it may overlap
    another or leave the pool), a count off by one, a run named twice, a bad slot."""
    layout = _ONE_LAYOUT
    u = layout.units_per_checkpoint
    ids = draw(st.permutations(range(BLOCKS)))[:u]
    runs = list(unit_runs(tuple(ids)))
    slot: Any = draw(st.integers(0, SLOTS - 1))
    corrupt = draw(st.sampled_from(["none", "none", "move", "count", "twice", "slot"]))
    k = draw(st.integers(0, len(runs) - 1))
    if corrupt == "move":
        f, c = runs[k]
        runs[k] = (f + draw(st.sampled_from([-1, 1])), c)
    elif corrupt == "count":
        f, c = runs[k]
        runs[k] = (f, c + draw(st.sampled_from([-1, 1])))
    elif corrupt == "twice":
        runs.append(runs[k])
    elif corrupt == "slot":
        slot = draw(st.sampled_from([SLOTS, -1, True]))
    cls = draw(st.sampled_from([CheckpointStoreOp, CheckpointRestoreOp]))
    op = cls._of_runs(slot, tuple(runs), layout.image_bytes, layout.layout_id)
    return ([op], []) if cls is CheckpointStoreOp else ([], [op])


def _agrees(one_op: Any, stores: list[Any], restores: list[Any]) -> bool:
    """The one-op path accepts only what the general path accepts, with the same packed
    integers."""
    key = _layout_key(_ONE_LAYOUT)
    one = one_op(key, stores, restores, SLOTS, BLOCKS)
    general = _fast_batch(key, stores, restores, [], SLOTS, BLOCKS)
    if one is None:
        return True
    return general is not None and np.array_equal(one.packed, general.packed)


@given(_one_op())
def test_the_one_op_path_checks_what_the_general_path_checks(ops: Any) -> None:
    """A batch of one op and no scrub takes :func:`_one_op_batch`; whatever it accepts the
    general path accepts too, with the same :attr:`CheckedBatch.packed`."""
    assert _agrees(_one_op_batch, *ops)


def test_the_one_op_path_is_taken_and_refuses_a_unit_named_twice() -> None:
    """A well-formed one-op batch is accepted by the one-op path; with its overlap test
    planted out, a store naming a unit twice is accepted there and refused by the general
    path (the property above would fail)."""
    layout = _ONE_LAYOUT
    good = CheckpointStoreOp._of_runs(1, ((3, 2), (9, 3)), layout.image_bytes, layout.layout_id)
    key = _layout_key(layout)
    assert _one_op_batch(key, [good], [], SLOTS, BLOCKS) is not None
    assert np.array_equal(
        validate_batch(layout, [good], [], num_slots=SLOTS, num_blocks=BLOCKS).packed,
        _fast_batch(key, [good], [], [], SLOTS, BLOCKS).packed,  # type: ignore[union-attr]
    )
    twice = CheckpointStoreOp._of_runs(1, ((3, 3), (4, 2)), layout.image_bytes, layout.layout_id)
    assert _agrees(_one_op_batch, [twice], [])
    planted = edited_method(
        validation_module, "_one_op_batch", "    if m > 1:  # the op's own", "    if False:  #"
    )
    assert not _agrees(planted, [twice], [])
    with pytest.raises(CopyOpError):  # the per-op check names the unit named twice
        validate_batch(layout, [twice], [], num_slots=SLOTS, num_blocks=BLOCKS)


def test_host_read_ints_refuses_a_bad_value_and_keeps_the_old() -> None:
    """``TritonCopyExecutor.host_read_ints`` takes an int >= 0; anything else raises
    ``InvalidArgumentError`` and leaves the setting as it was (no Triton needed: the
    property alone)."""
    from pagedstate.gpu.triton_copy import DEFAULT_HOST_READ_INTS, TritonCopyExecutor

    ex = object.__new__(TritonCopyExecutor)
    ex._host_read_ints = DEFAULT_HOST_READ_INTS
    for bad in (-1, None, 1.5, True, "64"):
        with pytest.raises(InvalidArgumentError):
            ex.host_read_ints = bad  # type: ignore[assignment]
        assert ex.host_read_ints == DEFAULT_HOST_READ_INTS
    ex.host_read_ints = 0
    assert ex.host_read_ints == 0
