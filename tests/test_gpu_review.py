"""Hostile inputs to pagedstate.gpu: each test names the expected behaviour (each failed
before its fix)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pagedstate.gpu import StateTensors, TorchCopyExecutor, load_geometry  # noqa: E402
from pagedstate.spec.errors import CopyOpError, PagedStateError  # noqa: E402
from pagedstate.spec.types import CheckpointStoreOp  # noqa: E402

L = load_geometry("Qwen3-Next").sliced(2, 1, 32).layout(16, spec_tokens=1)
U = L.units_per_checkpoint
GOOD = tuple(range(U))


def _executor() -> tuple[StateTensors, TorchCopyExecutor]:
    t = StateTensors(L, 4, 3 * U + 2)
    g = torch.Generator().manual_seed(0)
    for x in t.all_tensors():
        b = x.view(torch.uint8)
        b.copy_(torch.randint(0, 256, b.shape, dtype=torch.uint8, generator=g))
    return t, TorchCopyExecutor(t, max_ops_per_batch=4, max_scrub_units=3)


def _bytes(t: StateTensors) -> list:
    return [x.view(torch.uint8).clone() for x in t.all_tensors()]


def _same(before: list, t: StateTensors) -> bool:
    return all(
        torch.equal(a, x.view(torch.uint8)) for a, x in zip(before, t.all_tensors(), strict=True)
    )


class _StoreSub(CheckpointStoreOp):
    pass


def test_subclass_of_store_op_is_handled_consistently_not_assertion_error() -> None:
    # _fast_batch uses `type(op) is not cls`, _slow_batch uses isinstance: a subclass is
    # refused by the fast path and accepted by the slow one -> AssertionError.
    t, e = _executor()
    op = _StoreSub(0, GOOD, L.image_bytes, L.layout_id)
    try:
        e.execute([op])
    except AssertionError as exc:
        pytest.fail(f"fast and slow paths disagree on a subclass: {exc}")
    except PagedStateError:
        pass


@pytest.mark.parametrize("where", ["slot", "unit", "neg_unit", "scrub"])
def test_ints_beyond_int64_get_a_specific_error_and_change_nothing(where: str) -> None:
    # np.array(..., dtype=np.int64) raises a raw OverflowError on ints >= 2**63.
    t, e = _executor()
    before = _bytes(t)
    huge = -(2**70) if where == "neg_unit" else 2**70
    stores, scrub = [], []
    if where == "slot":
        stores = [CheckpointStoreOp(huge, GOOD, L.image_bytes, L.layout_id)]
    elif where in ("unit", "neg_unit"):
        stores = [CheckpointStoreOp(0, (huge, *GOOD[1:]), L.image_bytes, L.layout_id)]
    else:
        scrub = [huge]
    with pytest.raises(CopyOpError):
        e.execute(stores, [], scrub)
    assert _same(before, t)
    assert e.batches == 0


@pytest.mark.parametrize("bad", [True, 1.0])
def test_a_bool_or_float_scrub_unit_is_refused_even_beside_an_equal_int(bad: object) -> None:
    # validate_batch does list(set(scrub_units)) first: {1, True} == {1}, so the bad
    # element vanishes and the batch is accepted (a lone True or 1.0 is refused).
    t, e = _executor()
    before = _bytes(t)
    with pytest.raises(CopyOpError):
        e.execute([], [], [1, bad])
    assert _same(before, t)


def test_a_float_total_bytes_is_refused() -> None:
    # `op.total_bytes != image_bytes` accepts 68608.0; the units and slot are type-checked
    # (`type(x) is int`) but total_bytes is not.
    t, e = _executor()
    before = _bytes(t)
    op = CheckpointStoreOp(0, GOOD, float(L.image_bytes), L.layout_id)
    with pytest.raises(CopyOpError):
        e.execute([op])
    assert _same(before, t)


class _TupleSub(tuple):
    pass


def test_a_tuple_subclass_of_unit_ids_is_handled_consistently_not_assertion_error() -> None:
    # _fast_batch: `type(op.unit_ids) is not tuple`; _check_op: isinstance(ids, tuple).
    t, e = _executor()
    op = CheckpointStoreOp(0, _TupleSub(GOOD), L.image_bytes, L.layout_id)
    try:
        e.execute([op])
    except AssertionError as exc:
        pytest.fail(f"fast and slow paths disagree on a tuple subclass: {exc}")
    except PagedStateError:
        pass


def test_state_tensors_refuses_given_tensors_that_alias_each_other() -> None:
    # The hazard check assumes every slot and KV tensor is distinct memory. Given slot
    # tensors that share storage (layer1's tensors are layer0's) are accepted, so one
    # restore writes the same bytes twice (from different units) in one unordered launch.
    from pagedstate.spec.errors import InvalidArgumentError

    t0 = StateTensors(L, 2, U)
    sl = list(t0.slot_tensors)
    assert tuple(sl[0].shape) == tuple(sl[2].shape) and tuple(sl[1].shape) == tuple(sl[3].shape)
    with pytest.raises(InvalidArgumentError):
        StateTensors(L, 2, U, slot_tensors=[sl[0], sl[1], sl[0], sl[1]])


@pytest.mark.parametrize("given", [[1], 5])
def test_state_tensors_non_tensor_given_gets_invalid_argument(given: object) -> None:
    # kv_tensors=[1] -> raw AttributeError; kv_tensors=5 -> raw TypeError.
    from pagedstate.spec.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        StateTensors(L, 2, U, kv_tensors=given)  # type: ignore[arg-type]


@pytest.mark.parametrize("src", [[5.9, 7], ["5", "7"], [True, 11]])
def test_plan_segmented_copy_refuses_non_int_sizes(src: list) -> None:
    # _sizes does np.asarray(sizes, dtype=np.int64): 5.9 becomes 5, "5" becomes 5, True 1,
    # and a plan is returned for segments nobody asked for.
    from pagedstate.gpu.plan import plan_segmented_copy
    from pagedstate.spec.errors import BadCopyPlanError

    with pytest.raises(BadCopyPlanError):
        plan_segmented_copy(src, [3, 4, 5], 12)


@pytest.mark.parametrize("lengths", [[1.7, 2.2], ["a"], [2**70], [[1, 2], [3, 4]]])
def test_tile_rows_refuses_non_int_or_non_1d_lengths(lengths: list) -> None:
    # floats are truncated and 2-D is flattened silently; "a" gives a raw ValueError and
    # 2**70 a raw OverflowError.
    from pagedstate.gpu.plan import tile_rows
    from pagedstate.spec.errors import BadCopyPlanError

    with pytest.raises(BadCopyPlanError):
        tile_rows(lengths, 2)


def test_documented_batch_recipe_survives_more_dirty_units_than_max_scrub_units() -> None:
    # docs/gpu.md "One batch": scrub = free_dirty_units(pool, executor.max_scrub_units);
    # executor.execute(stores, restores, scrub). Without the cap the executor refuses the
    # WHOLE batch (the drain's stores and restores too) with BatchTooLargeError once more
    # units are dirty than max_scrub_units (256 by default on the Triton executor); with
    # it, the rest stay dirty for the next batch.
    from pagedstate.gpu.executor import free_dirty_units

    class _Pool:  # four free dirty units, as after releasing a checkpoint's units
        def __init__(self) -> None:
            self.dirty = {U, U + 1, U + 2, U + 3}

        def dirty_units(self) -> frozenset[int]:
            return frozenset(self.dirty)

        def owner_of(self, unit: int) -> None:
            return None

        def mark_clean(self, units: list[int]) -> None:
            self.dirty -= set(units)

    t, e = _executor()  # max_scrub_units=3
    pool = _Pool()
    assert len(free_dirty_units(pool)) == 4
    scrub = free_dirty_units(pool, e.max_scrub_units)
    assert scrub == [U, U + 1, U + 2]
    store = CheckpointStoreOp(0, GOOD, L.image_bytes, L.layout_id)
    e.execute([store], [], scrub)
    pool.mark_clean(scrub)
    assert free_dirty_units(pool, e.max_scrub_units) == [U + 3]  # scrubbed next batch


@pytest.mark.parametrize("stores, restores", [(None, ()), (5, ()), ((), None)])
def test_execute_with_non_iterable_op_lists_gets_a_specific_error(
    stores: object, restores: object
) -> None:
    # validate_batch does list(stores), list(restores) unguarded: a raw TypeError.
    t, e = _executor()
    before = _bytes(t)
    with pytest.raises(PagedStateError):
        e.execute(stores, restores)  # type: ignore[arg-type]
    assert _same(before, t)


def test_write_image_of_the_wrong_size_is_refused_before_writing_anything() -> None:
    # write_image copies range by range: data one byte short writes the first ranges,
    # then a raw RuntimeError from copy_ leaves the slot half-overwritten.
    from pagedstate.spec.errors import InvalidArgumentError

    t = StateTensors(L, 2, U)
    for x in t.all_tensors():
        x.view(torch.uint8).zero_()
    before = _bytes(t)
    with pytest.raises(InvalidArgumentError):
        t.write_image(0, torch.ones(L.image_bytes - 1, dtype=torch.uint8))
    assert _same(before, t)


@pytest.mark.parametrize("slot", [-1, 2, True])
def test_image_views_refuse_slots_outside_range(slot: object) -> None:
    # read_image(-1) silently reads the last slot (write_image(-1, ...) writes it);
    # read_image(2) is a raw IndexError, read_image(True) a raw RuntimeError.
    from pagedstate.spec.errors import InvalidArgumentError

    t = StateTensors(L, 2, U)
    with pytest.raises(InvalidArgumentError):
        t.read_image(slot)  # type: ignore[arg-type]


def test_executor_arguments_are_checked() -> None:
    """An executor needs StateTensors; the Triton executor's kernel shape must be powers of
    two and ``for_loop`` a bool (a string is not read as True)."""
    from pagedstate.spec.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        TorchCopyExecutor(None)  # type: ignore[arg-type]
    triton_copy = pytest.importorskip("pagedstate.gpu.triton_copy")
    if not triton_copy.triton_available():
        pytest.skip("needs triton")
    t = StateTensors(L, 2, U)
    for kwargs in ({"num_warps": 3}, {"block": 2**40}, {"for_loop": "no"}, {"block": 3}):
        with pytest.raises(InvalidArgumentError):
            triton_copy.TritonCopyExecutor(t, 2, **kwargs)


def test_triton_executor_refuses_cpu_tensors_without_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CPU tensors the kernel can only run under TRITON_INTERPRET=1: without it the
    constructor refuses, instead of the first execute failing inside Triton."""
    from pagedstate.spec.errors import InvalidArgumentError

    triton_copy = pytest.importorskip("pagedstate.gpu.triton_copy")
    if not triton_copy.triton_available():
        pytest.skip("needs triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(InvalidArgumentError, match="TRITON_INTERPRET"):
        triton_copy.TritonCopyExecutor(StateTensors(L, 2, U), 2)
