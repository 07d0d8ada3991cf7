"""Adversarial review of pagedstate.gpu (issue 4): each test names the expected behaviour
and fails on the current code."""

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
    return all(torch.equal(a, x.view(torch.uint8)) for a, x in zip(before, t.all_tensors()))


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
