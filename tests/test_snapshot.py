"""The snapshot's fields and invariants for what a refused call must leave alone (SPEC G8):
it is visible in ``snapshot()``, and the step invariant on nominations handles the offload
sink being switched off."""

from __future__ import annotations

import attrs
import pytest
from conftest import FakeOffload, Seq, ready, spec

from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec import check_invariants, check_step_invariants
from pagedstate.spec.snapshot import (
    identities_ahead,
    nominations_accounted,
    scratch_disjoint,
    unit_conservation,
)

MODELS = [pytest.param(R, id="reference"), pytest.param(I, id="impl")]


def _coord(M, offload=None):
    c = M.PagedStateCheckpointCoordinator(
        M.UnitPool(20), spec(10, 25), True, offload=offload, readable_midstep=True
    )
    c.attach_midstep_scratch(M.SlotPool([90, 91]), 8)
    return c


@pytest.mark.parametrize("M", MODELS)
def test_the_snapshot_shows_lease_ids_the_change_log_and_scratch_slots(M):
    c = _coord(M)
    s0 = c.snapshot()
    assert (s0.next_lease_id, s0.changes, s0.scratch_free) == (0, (), frozenset({90, 91}))
    ready(c.store, 101)
    c.begin_restore(101, 4)
    lease = c.suspend_queued_restore(4)
    c.release_suspended_restore(lease)
    c.reserve_midstep(Seq(0), [(16, 555)])
    s1 = c.snapshot()
    assert s1.next_lease_id == 1
    assert s1.changes == ((1, 101),) and s1.generation == 1
    assert s1.scratch_free == frozenset({91})
    assert s1.cached == ()
    assert check_invariants(s1) == []


def test_the_snapshot_shows_every_new_field_of_the_production_store():
    """Each field changes the snapshot when its structure changes (if one did not move
    ``snapshot()``, a refused call could change it unseen)."""
    mutations = [
        ("cached", lambda c: c.pool._cached.__setitem__(19, 7)),
        ("next_lease_id", lambda c: setattr(c.store, "_next_lease_id", 5)),
        ("changes", lambda c: c.store._changes.append((1, 9))),
        ("scratch_free", lambda c: c._scratch._free.discard(90)),
    ]
    for name, mutate in mutations:
        c = _coord(I)
        before = c.snapshot()
        mutate(c)
        after = c.snapshot()
        assert [d.split(":")[0] for d in before.diff(after)] == [name]


def test_cached_units_are_shown_in_reuse_order():
    pool = I.UnitPool(4)
    kv = pool.reserve_units(3, ("kv", 0))
    pool.cache_units(kv, ("kv", 0), [11, None, 13])
    c = I.PagedStateCheckpointCoordinator(pool, spec(10, 25), True)
    snap = c.snapshot()
    assert snap.cached == ((0, 11), (2, 13))
    assert check_invariants(snap) == []


def _base():
    return _coord(R).snapshot()


def test_new_state_invariants_catch_inconsistent_snapshots():
    s = _base()
    assert unit_conservation(attrs.evolve(s, cached=((0, 5),), free=s.free - {0})) != []
    assert unit_conservation(attrs.evolve(s, cached=((0, 5), (0, 6)))) != []
    assert identities_ahead(attrs.evolve(s, suspended=((0, 1, 4),), next_lease_id=0)) != []
    assert identities_ahead(attrs.evolve(s, changes=((2, 1), (2, 3)), generation=2)) != []
    assert identities_ahead(attrs.evolve(s, changes=((1, 1),), generation=2)) != []
    assert identities_ahead(attrs.evolve(s, changes=((1, 1), (2, None)), generation=2)) == []
    assert scratch_disjoint(attrs.evolve(s, scratch_reserved=frozenset({90}))) != []
    assert scratch_disjoint(attrs.evolve(s, scratch_reserved=frozenset({90}),
                                         scratch_free=None)) == []
    lease_back = attrs.evolve(s, next_lease_id=3)
    assert [n for n, _ in check_step_invariants(lease_back, s)] == ["monotone_identities"]


@pytest.mark.parametrize("M", MODELS)
@pytest.mark.parametrize("how", ["detach", "load_only"])
def test_switching_the_sink_off_accounts_for_the_dropped_backlog(M, how):
    """C16: no sink, no nominations: switching the sink off empties the backlog, and
    ``nominations_accounted`` counts that as a way out (the conformance kit used to exempt
    such calls from the invariant instead)."""
    c = _coord(M, offload=FakeOffload())
    ready(c.store, 101)
    ready(c.store, 202)
    before = c.snapshot()
    assert before.offload_sink and before.offload_ready
    if how == "detach":
        c.attach_offload(None)
    else:
        c.attach_offload(FakeOffload(), sink=False)
    after = c.snapshot()
    assert not after.offload_sink and after.offload_ready == ()
    assert nominations_accounted(before, after) == []
    assert check_step_invariants(before, after) == []
    assert check_invariants(after) == []


def test_a_nomination_lost_while_the_sink_stays_on_is_still_reported():
    c = _coord(R, offload=FakeOffload())
    ready(c.store, 101)
    before = c.snapshot()
    after = attrs.evolve(before, offload_ready=())
    assert nominations_accounted(before, after) != []
