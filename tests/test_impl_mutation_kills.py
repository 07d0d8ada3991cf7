"""Tests added to kill surviving mutants of impl/store.py and impl/pool.py (docs/mutation.md).

Each test compares the production store with the reference model, in lockstep, on a
behaviour that the rest of the suite did not observe closely enough for mutation testing
to notice a change.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import test_atomicity_reference
from test_impl_atomicity import bad_calls
from test_impl_lockstep import Lockstep

from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec import PagedStateError


def _refusal(obj: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        value = getattr(obj, name)(*args, **kwargs)
    except PagedStateError as exc:
        return type(exc), str(exc)
    return "returned", value


@pytest.mark.parametrize("seed", range(6))
def test_refused_calls_carry_the_reference_message(seed: int) -> None:
    """impl/_args.py: "The messages match the reference model's, so an engine sees the same
    text from either implementation." Every bad call of the atomicity catalogue, made on both
    models in a reachable state, raises the same class with the same message."""
    ls = Lockstep(random.Random(seed))
    for _ in range(40 * seed):
        ls.step()
    for target, name, args, kwargs in bad_calls(ls):
        r, i = ({"c": c, "s": c.store, "p": c.pool}[target] for c in (ls.r, ls.i))
        assert _refusal(i, name, args, kwargs) == _refusal(r, name, args, kwargs), (
            f"{target}.{name}{args}{kwargs or ''}"
        )


def test_claiming_cached_units_without_an_owner_says_what_reserving_does() -> None:
    """``claim_cached_units`` (engine-only, no reference counterpart) makes a reservation; a
    None owner is refused with the reference's ``reserve_units`` message for the same fault."""
    expected = _refusal(R.UnitPool(4), "reserve_units", (1, None), {})
    assert expected[0] != "returned"
    assert _refusal(I.UnitPool(4), "claim_cached_units", ([0],), {"owner": None}) == expected
    assert _refusal(I.UnitPool(4), "reserve_units", (1, None), {}) == expected


def _world(monkeypatch: pytest.MonkeyPatch, models: Any) -> Any:
    """The reference atomicity suite's world, built from ``models``' classes."""
    for name in ("PagedStateCheckpointCoordinator", "UnitPool", "SlotPool"):
        monkeypatch.setattr(test_atomicity_reference, name, getattr(models, name))
    return test_atomicity_reference.build_world()


@pytest.mark.parametrize(
    "case", test_atomicity_reference.CASES, ids=[c[0] for c in test_atomicity_reference.CASES]
)
def test_refusals_in_the_atomicity_world_carry_the_reference_message(
    case: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each refusal of the reference atomicity suite (a world with records in every phase,
    queued, in-flight and suspended restores, leases, offload pins, transfers, midstep
    scratch), made on a reference world and on a production world built the same way, raises
    the same class with the same message."""
    _, call, error = case

    def outcome(models: Any) -> Any:
        w = _world(monkeypatch, models)
        try:
            value = call(w)
        except PagedStateError as exc:
            return type(exc), str(exc)
        return "returned", value

    expected = outcome(R)
    assert expected[0] is error
    assert outcome(I) == expected


def test_resume_reports_the_lease_and_the_restore_it_requeues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``on_transition`` (production only) names each row's subject: resuming a suspended
    restore reports the lease and the ``(checkpoint id, slot)`` restore, after which the
    restore is queued again in both models."""
    w = _world(monkeypatch, I)
    seen: list[tuple[str, object]] = []
    w.c.on_transition = lambda machine, row, subject: seen.append((machine, subject))
    lease = w.lease
    w.s.resume_suspended_restore(lease)
    assert ("lease", lease.lease_id) in seen
    assert ("restore", (lease.checkpoint_id, lease.op.dst_slot)) in seen
    r = _world(monkeypatch, R)
    r.s.resume_suspended_restore(r.lease)
    assert w.s.restore_queued_for(lease.op.dst_slot) is r.s.restore_queued_for(r.lease.op.dst_slot)
    assert w.s.restore_queued_for(lease.op.dst_slot)
