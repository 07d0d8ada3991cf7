"""An engine's ``on_evict`` callback that fails or calls back into a drain (each test
failed before its fix): the production coordinator gives the drain up cleanly,
and refuses nested drains and completions."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Seq, spec

from pagedstate import impl as I
from pagedstate.spec import (
    EvictionCallbackError,
    ReentrantCallError,
    check_invariants,
)


def _world(on_evict: Any, vacant: int = 10, cached: tuple[int, ...] = (301, 302)) -> Any:
    """A coordinator (3-unit images) over a pool with ``vacant`` vacant units and one cached
    KV block per hash in ``cached`` (the last to be handed out)."""
    n = vacant + len(cached)
    pool = I.UnitPool(n)
    coord = I.PagedStateCheckpointCoordinator(pool, spec(10, 25), True)
    kv = pool.reserve_units(n, ("kv", 0))
    pool.cache_units(kv, ("kv", 0), [None] * vacant + list(cached))
    pool.on_evict = on_evict
    return coord, pool


def test_a_failing_callback_gives_the_drain_up() -> None:
    def boom(h: int) -> None:
        raise KeyError(h)

    coord, pool = _world(boom)
    hashes = (101, 202, 303, 404, 505)
    for k, h in enumerate(hashes):
        coord.checkpoint(Seq(k + 1), 1, h)
    with pytest.raises(EvictionCallbackError):
        coord.take_checkpoint_ops()
    assert check_invariants(coord.snapshot()) == []
    assert coord._store_ops == []
    coord.complete_previous_batch()  # no copy ran: nothing may be published
    assert not any(coord.contains(h) for h in hashes)
    assert check_invariants(coord.snapshot()) == []
    pool.on_evict = None
    # Nothing of the given-up drain comes back: the next drain stores only the boundary it
    # never reached (505), into units nobody else holds.
    left = [h for _, h in coord.snapshot().pending_boundaries]
    assert left == [505]
    stores, restores = coord.take_checkpoint_ops()
    assert len(stores) == 1 and restores == ()
    assert all(pool.owner_of(u)[0][0] == "state-checkpoint" for u in stores[0].unit_ids)
    coord.complete_previous_batch()
    assert [h for h in hashes if coord.contains(h)] == [505]
    assert check_invariants(coord.snapshot()) == []


@pytest.mark.parametrize("nested", ["take_checkpoint_ops", "complete_previous_batch"])
def test_a_callback_cannot_nest_a_drain_or_a_completion(nested: str) -> None:
    seen: list[BaseException] = []
    coord: Any = None

    def reenter(h: int) -> None:
        try:
            getattr(coord, nested)()
        except ReentrantCallError as exc:
            seen.append(exc)

    coord, pool = _world(reenter, vacant=2)
    coord.checkpoint(Seq(1), 1, 101)  # 3 units: 2 vacant, then the block of 301
    stores, _ = coord.take_checkpoint_ops()
    assert len(seen) == 1 and nested in str(seen[0])
    assert len(stores) == 1
    assert check_invariants(coord.snapshot()) == []
    coord.complete_previous_batch()
    assert coord.contains(101)


# -- more failing and re-entrant callbacks -----------------------------------------------------


def test_the_conformance_kit_passes_the_production_store() -> None:
    """The kit run on ``pagedstate.impl`` itself (the rest of tests/test_conformance.py
    runs it on the reference and on planted mutants)."""
    from hypothesis import HealthCheck, settings

    from pagedstate.engines.conformance import run_conformance

    report = run_conformance(
        I.PagedStateCheckpointCoordinator,
        pool_factory=I.UnitPool,
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None,
                          derandomize=True, database=None,
                          suppress_health_check=list(HealthCheck)),
    )
    assert report is not None


def test_a_clock_that_steps_back_reclaims_as_the_reference() -> None:
    """Pins taken at t=100 then t=50 (the clock stepped back); at t=65 a 10 s timeout
    retires the t=50 pin in both stores (the production store's in-order fast path must
    notice the step back)."""
    from conftest import FakeOffload

    from pagedstate.models import reference as R

    class Clock:
        t = 100.0

        def __call__(self) -> float:
            return self.t

    got = []
    for models in (R, I):
        clk = Clock()
        c = models.PagedStateCheckpointCoordinator(
            models.UnitPool(20), spec(10, 25), True, offload=FakeOffload(), clock=clk
        )
        for k, h in enumerate((101, 202)):
            c.checkpoint(Seq(k), 1, h)
        c.take_checkpoint_ops()
        c.complete_previous_batch()
        c.take_offload_stores(1)
        clk.t = 50.0
        c.take_offload_stores(2)
        clk.t = 65.0
        got.append((c.reclaim_stale_offload_pins(10), c.reclaim_stale_offload_pins(16)))
    assert got[0] == got[1] == (1, 0)


def test_a_clock_that_fails_changes_nothing() -> None:
    from conftest import FakeOffload

    from pagedstate.models import reference as R
    from pagedstate.spec import InvalidArgumentError

    for models in (R, I):
        answers: list[Any] = [1.0]

        def clock(answers: list[Any] = answers) -> Any:
            return answers[0]

        c = models.PagedStateCheckpointCoordinator(
            models.UnitPool(20), spec(10, 25), True, offload=FakeOffload(), clock=clock
        )
        answers[0] = 1.0
        c.checkpoint(Seq(0), 1, 101)
        c.take_checkpoint_ops()
        c.complete_previous_batch()
        for bad in (float("nan"), "soon", None):
            answers[0] = bad
            before = c.snapshot()
            with pytest.raises(InvalidArgumentError, match="clock"):
                c.take_offload_stores(1)
            assert c.snapshot() == before
        answers[0] = 2.0
        assert len(c.take_offload_stores(1)) == 1
        with pytest.raises(InvalidArgumentError, match="too large"):
            c.reclaim_stale_offload_pins(10**400)
        with pytest.raises(InvalidArgumentError, match="clock must be callable"):
            models.PageUnitCheckpointStore(models.UnitPool(4), spec(10, 25), clock=5)


def test_an_owner_holding_units_cannot_reserve_again() -> None:
    from pagedstate.models import reference as R
    from pagedstate.spec import InvalidArgumentError

    for models in (R, I):
        pool = models.UnitPool(4)
        pool.reserve_units(2, ("kv", 0))
        before = pool.snapshot_parts()
        with pytest.raises(InvalidArgumentError, match="already holds units"):
            pool.reserve_units(1, ("kv", 0))
        assert pool.snapshot_parts() == before


def test_a_duplicate_transfer_owner_evicts_nothing() -> None:
    from pagedstate.models import reference as R

    for models in (R, I):
        c = models.PagedStateCheckpointCoordinator(models.UnitPool(6), spec(10, 25), True)
        c.checkpoint(Seq(0), 1, 101)
        c.take_checkpoint_ops()
        c.complete_previous_batch()
        assert c.reserve_transfer_units(("peer", 1)) is not None  # 3 + 3 units: pool full
        assert c.reserve_transfer_units(("peer", 1)) is None
        assert c.contains(101) and c.store.evictions == 0


def test_the_protected_record_counts_only_if_evictable() -> None:
    """has_available_units(count, protected): the protected record is discounted only when
    it could be evicted at all; a restore-pinned one was never counted."""
    from pagedstate.models import reference as R

    got = []
    for models in (R, I):
        c = models.PagedStateCheckpointCoordinator(models.UnitPool(6), spec(10, 25), True)
        for k, h in enumerate((101, 202)):
            c.checkpoint(Seq(k), 1, h)
        c.take_checkpoint_ops()
        c.complete_previous_batch()
        assert c.begin_restore(101, 5)
        got.append((c.has_available_units(3, 101), c.has_available_units(3, 202),
                    c.has_available_units(4, 101)))
    assert got[0] == got[1] == (True, False, False)


def test_a_given_up_drain_keeps_the_overlap_state() -> None:
    """D.13, G15 on a failing callback: the drain's forward id stays ``last_forward``, the
    scratch stores waiting for a later forward stay queued in their places (they were
    passed over by moving them to the end of the queue, and are put back), and the restore
    begun for a sequence stays queued and remembered (the restores were not taken)."""

    def boom(h: int) -> None:
        raise KeyError(h)

    pool = I.UnitPool(6)
    coord = I.PagedStateCheckpointCoordinator(pool, spec(10, 25), True, readable_midstep=True)
    coord.attach_midstep_scratch(I.SlotPool([90, 91, 92, 93]), 4)
    coord.checkpoint(Seq(0), 1, 101)
    coord.take_checkpoint_ops()  # forward 0
    coord.complete_previous_batch()  # 101 READY, units 0-2
    kv = pool.reserve_units(3, ("kv", 0))
    pool.cache_units(kv, ("kv", 0), [301, 302, 303])  # the only free units: cached KV
    pool.on_evict = boom
    owner = Seq(1)
    assert coord.begin_restore(101, 1, seq=owner)
    seq = Seq(2)
    coord.publish_midstep(coord.reserve_midstep(seq, [(0, 501)]), forward=9)  # waits
    coord.publish_midstep(coord.reserve_midstep(seq, [(1, 502)]))  # its store fails
    coord.publish_midstep(coord.reserve_midstep(seq, [(2, 503)]), forward=9)  # waits
    queued = coord.snapshot().scratch_queued
    assert [h for h, _ in queued] == [501, 502, 503]
    with pytest.raises(EvictionCallbackError):
        coord.take_checkpoint_ops(forward=4)
    snap = coord.snapshot()
    assert coord.last_forward == 4 and coord.next_forward == 5
    assert snap.scratch_queued == (queued[0], queued[2])  # in place, 502 gone
    assert snap.scratch_forwards == ((queued[0][1], 9), (queued[2][1], 9))
    assert snap.restore_owners == ((id(owner), 1),) and snap.queued_restores
    assert check_invariants(snap) == [] and coord.self_check() == []
    coord.forget_pending(owner)  # by identity: its restore goes (G15)
    assert coord.snapshot().queued_restores == ()
    assert coord.outstanding()["inflight_stores"] == 1  # given up: released at completion
    coord.complete_previous_batch()
    assert coord.self_check() == [] and not coord.contains(502)
