"""Structural complexity of the production store: no per-call walk. Counted, never timed.

Each test builds the same situation at two sizes (``SMALL`` and ``BIG = 10**4`` records,
pins, pending boundaries, queued restores, offload operations, scratch stores or owners)
and counts the Python lines the production modules execute during one call
(:class:`LineCounter`, a ``sys.settrace`` hook restricted to ``impl/``). A walk over the
crowd would execute lines per element; an indexed call executes the same number of lines
at both sizes. The heap-backed calls are O(log n) in C (``heapq``), which the line count
does not see: they are asserted constant in Python-level work.

Calls that are amortized (the LRU victim heap pops each stale entry once) are measured
after the one call that pays for the stale entries, and their total cost over a whole
lifecycle is asserted linear in the number of records.

The counter is shown to see walks: the reference model's ``has_available_units`` and
``_hash_in_flight`` execute lines in proportion to the crowd.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
from conftest import FakeClock, FakeOffload, Seq, spec

from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec import ManualCompletion

SMALL = 100
BIG = 10_000
IMPL_DIR = os.path.dirname(os.path.abspath(I.__file__))
REFERENCE_FILE = os.path.dirname(os.path.abspath(R.__file__))  # the package folder


class LineCounter:
    """Counts lines executed in files under ``root`` (a directory or one file)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.lines = 0

    def _mine(self, filename: str) -> bool:
        return os.path.abspath(filename).startswith(self.root)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self._mine(frame.f_code.co_filename):
            return None
        if event == "line":
            self.lines += 1
        return self._trace

    def count(self, fn: Callable[[], Any]) -> int:
        self.lines = 0
        old = sys.gettrace()
        sys.settrace(self._trace)
        try:
            fn()
        finally:
            sys.settrace(old)
        return self.lines


def lines(fn: Callable[[], Any], root: str = IMPL_DIR) -> int:
    """Lines of ``root`` executed by ``fn()``."""
    return LineCounter(root).count(fn)


def same_cost(build: Callable[[int], Any], call: Callable[[Any], Any], slack: int = 0) -> None:
    """``call`` costs the same number of production lines on ``build(SMALL)`` and
    ``build(BIG)`` (within ``slack`` lines)."""
    small = _count_call(build(SMALL), call)
    big = _count_call(build(BIG), call)
    assert big <= small + slack, f"{big} lines at {BIG} vs {small} at {SMALL}"


def _count_call(world: Any, call: Callable[[Any], Any]) -> int:
    return lines(lambda: call(world))


U = 2  # spec(10, 20)


def _coord(units: int, offload: Any = None, **kw: Any) -> I.PagedStateCheckpointCoordinator:
    return I.PagedStateCheckpointCoordinator(I.UnitPool(units), spec(10, 20), True, offload,
                                             **kw)


def _ready_many(c: I.PagedStateCheckpointCoordinator, hashes: range) -> None:
    for h in hashes:
        assert c.store.begin_store(h, 0) is not None
    c.complete_previous_batch()


# -- the LRU: pinned records crowding the cold end ---------------------------------------


def _pinned_cold_end(n: int) -> I.PagedStateCheckpointCoordinator:
    """``n`` READY records pinned by in-flight restores at the cold end of the LRU, three
    unpinned ones at the hot end, and no free unit."""
    c = _coord((n + 3) * U)
    _ready_many(c, range(n))
    for h in range(n):
        assert c.begin_restore(h, h)
    c.take_checkpoint_ops()  # in flight: pinned until the next completion
    _ready_many(c, range(n, n + 3))
    assert c.pool.num_free == 0
    c.store._next_victim()  # pays once for the stale heap entries of the pinned records
    return c


def test_has_available_units_does_not_walk_pinned_records() -> None:
    same_cost(_pinned_cold_end, lambda c: c.has_available_units(3 * U))
    # Protecting the hottest unpinned record (hash n + 2).
    same_cost(_pinned_cold_end,
              lambda c: c.has_available_units(3 * U, protected_hash=c.pool.num_units // U - 1))


def test_the_lru_victim_is_found_without_a_walk() -> None:
    def evict_one(c: I.PagedStateCheckpointCoordinator) -> None:
        assert c.ensure_free_units(1) is True
        assert c.store.evictions == 1

    same_cost(_pinned_cold_end, evict_one)
    same_cost(_pinned_cold_end, lambda c: c.store.begin_store(10**6, 0))


def test_lru_lifecycle_is_linear_overall() -> None:
    """Publish ``n`` records, pin and unpin them all, then evict them all: the total line
    count per record is the same at both sizes (the amortized bound, stale entries
    included)."""

    def lifecycle(n: int) -> int:
        c = _coord(n * U)

        def run() -> None:
            _ready_many(c, range(n))
            for h in range(n):
                c.begin_restore(h, h)
            c.take_checkpoint_ops()
            c.complete_previous_batch()
            assert c.ensure_free_units(n * U)

        return lines(run)

    small, big = lifecycle(1_000), lifecycle(5_000)
    assert big / 5_000 <= 1.05 * small / 1_000, (small, big)


# -- pending boundaries ------------------------------------------------------------------


def _pending_crowd(n: int) -> tuple[I.PagedStateCheckpointCoordinator, list[Seq]]:
    c = _coord(8)
    seqs = [Seq(k) for k in range(n)]
    for k, s in enumerate(seqs):
        c.checkpoint(s, 1, 1_000_000 + k)
    return c, seqs


def test_pending_boundaries_are_indexed() -> None:
    same_cost(_pending_crowd, lambda w: w[0].checkpoint(Seq(5), 1, 7))  # a new sequence
    same_cost(_pending_crowd, lambda w: w[0].checkpoint(w[1][3], 1, 7))  # supersede
    same_cost(_pending_crowd, lambda w: w[0].checkpoint(w[1][3], 1, 1_000_003))  # G1
    same_cost(_pending_crowd, lambda w: w[0].forget_pending(w[1][4]))
    same_cost(_pending_crowd, lambda w: w[0].unindex(1_000_009))
    same_cost(_pending_crowd, lambda w: w[0].unindex(7))  # a miss


# -- queued restores ---------------------------------------------------------------------


def _restore_crowd(n: int) -> I.PagedStateCheckpointCoordinator:
    c = _coord((n + 1) * U)
    _ready_many(c, range(n + 1))
    for h in range(n):
        assert c.begin_restore(h, h)
    return c


def test_queued_restores_are_indexed_by_slot() -> None:
    same_cost(_restore_crowd, lambda c: c.restore_queued_for(5))
    same_cost(_restore_crowd, lambda c: c.restore_queued_for(-5))
    same_cost(_restore_crowd, lambda c: c.store.cancel_queued_restore(5))
    same_cost(_restore_crowd, lambda c: c.suspend_queued_restore(6))
    same_cost(_restore_crowd, lambda c: c.begin_restore(BIG + 7, BIG + 7))  # G4 check

    def suspend_resume(c: I.PagedStateCheckpointCoordinator) -> None:
        lease = c.suspend_queued_restore(8)
        assert lease is not None
        c.resume_suspended_restore(lease)

    same_cost(_restore_crowd, suspend_resume)


# -- offload operations and leases -------------------------------------------------------


def _offload_crowd(n: int) -> tuple[I.PagedStateCheckpointCoordinator, FakeClock, list[Any]]:
    """``n`` leases and one offload store pinned at t=0, ``n`` offload stores pinned at
    t=100; now t=120. Hashes ``2n+1 .. 2n+5`` are READY and have no operation."""
    clock = FakeClock(0.0)
    c = _coord((2 * n + 6) * U, offload=FakeOffload(), clock=clock, offload_backlog_cap=10**6)
    c.attach_offload(FakeOffload(), sink=False)  # publish without nominating
    _ready_many(c, range(2 * n + 6))
    ops: list[Any] = []
    for h in range(n):
        lease = c.acquire_checkpoint_source(h)
        assert lease is not None
        ops.append(lease[0])
    c.attach_offload(FakeOffload(), sink=True)
    c.store._queue_offload_store(c.store.lookup(2 * n))
    ops += [op for op, _ in c.take_offload_stores(10**9)]  # the early store, at t=0
    clock.advance(100)
    for h in range(n, 2 * n):
        c.store._queue_offload_store(c.store.lookup(h))
    ops += [op for op, _ in c.take_offload_stores(10**9)]
    assert len(ops) == 2 * n + 1
    clock.advance(20)
    return c, clock, ops


def test_offload_operations_are_indexed_by_hash() -> None:
    def acquire(h: Callable[[int], int], got: bool) -> Callable[[Any], None]:
        def call(w: Any) -> None:
            n = (len(w[2]) - 1) // 2
            assert (w[0].acquire_checkpoint_source(h(n)) is not None) is got

        return call

    same_cost(_offload_crowd, acquire(lambda n: 2 * n + 1, True))
    same_cost(_offload_crowd, acquire(lambda n: 10**7, False))  # not READY
    same_cost(_offload_crowd, acquire(lambda n: 3, False))  # leased: in flight
    same_cost(_offload_crowd, acquire(lambda n: n + 3, False))  # offloading: in flight
    same_cost(_offload_crowd, lambda w: w[0].release_offload_store_source(w[2][-1]))
    same_cost(_offload_crowd, lambda w: w[0].settle_offload_store(w[2][-1]))
    same_cost(_offload_crowd, lambda w: w[0].settle_offload_store(w[2][0]))
    same_cost(_offload_crowd, lambda w: w[0].was_reclaimed(w[2][0]))

    def take_one(w: Any) -> None:
        c = w[0]
        n = (len(w[2]) - 1) // 2
        c.store._queue_offload_store(c.store.lookup(2 * n + 2))
        assert len(c.take_offload_stores(10**9)) == 1

    same_cost(_offload_crowd, take_one)


def test_reclaim_reads_only_the_expired_prefix() -> None:
    """Leases are never read and unexpired stores are not walked: the scan stops at the
    first reclaimable store that is not due."""

    def reclaim(timeout: float, due: int) -> Callable[[Any], None]:
        def call(w: Any) -> None:
            assert w[0].reclaim_stale_offload_pins(timeout) == due

        return call

    same_cost(_offload_crowd, reclaim(200.0, 0))  # nothing due
    same_cost(_offload_crowd, reclaim(50.0, 1))  # the early store only


# -- midstep scratch ---------------------------------------------------------------------


def _scratch_crowd(n: int) -> I.PagedStateCheckpointCoordinator:
    c = I.PagedStateCheckpointCoordinator(I.UnitPool(8), spec(10, 20), True,
                                          readable_midstep=True)
    c.attach_midstep_scratch(I.SlotPool(range(100, 100 + n + 2)), 0)  # no budget: all wait
    seq = Seq(1)
    for k in range(n):
        c.publish_midstep(c.reserve_midstep(seq, [(0, 5_000_000 + k)]))
    return c


def test_scratch_queue_is_indexed_by_hash() -> None:
    same_cost(_scratch_crowd, lambda c: c.unindex(5_000_007))
    same_cost(_scratch_crowd, lambda c: c.reserve_midstep(Seq(1), [(0, 5_000_003)]))  # queued
    same_cost(_scratch_crowd, lambda c: c.reserve_midstep(Seq(1), [(0, 7)]))
    same_cost(_scratch_crowd, lambda c: c.take_checkpoint_ops())  # over budget: stays put


# -- the pool ------------------------------------------------------------------------------


def _owner_crowd(n: int) -> I.UnitPool:
    pool = I.UnitPool(n + 4)
    for k in range(n):
        pool.reserve_units(1, ("kv", k))
    pool.reserve_units(2, ("mine", 0))
    return pool


def test_pool_calls_do_not_walk_tags() -> None:
    same_cost(_owner_crowd, lambda p: p.release_units([p.num_units - 4, p.num_units - 3],
                                                      ("mine", 0)))
    same_cost(_owner_crowd, lambda p: p.rekey_units([p.num_units - 4, p.num_units - 3],
                                                    ("mine", 0), ("yours", 0)))
    same_cost(_owner_crowd, lambda p: p.reserve_units(2, ("new", 0)))

    def partial(p: I.UnitPool) -> None:
        with pytest.raises(AssertionError):
            p.release_units([p.num_units - 4], ("mine", 0))  # G9, from the owner count

    same_cost(_owner_crowd, partial)


def test_change_log_reads_only_what_changed() -> None:
    def log(n: int) -> I.PageUnitCheckpointStore:
        s = I.PageUnitCheckpointStore(I.UnitPool(4), spec(10, 20), change_log_size=n)
        for _ in range(n):
            s.begin_store(1, 0)
            s.complete_inflight()
            s.unindex(1)
        return s

    same_cost(log, lambda s: s.changed_since(s.generation - 3))


def test_forfeit_memory_trims_without_a_walk() -> None:
    def forfeits(n: int) -> I.PageUnitCheckpointStore:
        clock = FakeClock(0.0)
        s = I.PageUnitCheckpointStore(I.UnitPool(4), spec(10, 20), offload_sink=True,
                                      clock=clock, forfeit_bound=n)
        for _ in range(n + 1):
            s.begin_store(1, 0)
            s.complete_inflight()
            s.take_offload_stores(1)
            clock.advance(10)
            assert s.reclaim_stale_offload_pins(5) == 1
            s.unindex(1)
        return s

    def one_more(s: I.PageUnitCheckpointStore) -> None:
        s.begin_store(1, 0)
        s.complete_inflight()
        s.take_offload_stores(1)
        s.clock.advance(10)  # type: ignore[attr-defined]
        assert s.reclaim_stale_offload_pins(5) == 1

    same_cost(forfeits, one_more)


# -- the counter sees walks ----------------------------------------------------------------


def test_the_counter_sees_the_reference_walks() -> None:
    def ref_pinned(n: int) -> R.PagedStateCheckpointCoordinator:
        c = R.PagedStateCheckpointCoordinator(R.UnitPool((n + 3) * U), spec(10, 20), True)
        for h in range(n):
            c.store.begin_store(h, 0)
        c.complete_previous_batch()
        for h in range(n):
            c.begin_restore(h, h)
        for h in range(n, n + 3):
            c.store.begin_store(h, 0)
        c.complete_previous_batch()
        return c

    def cost(n: int, call: Callable[[Any], Any]) -> int:
        c = ref_pinned(n)
        return lines(lambda: call(c), REFERENCE_FILE)

    for call in (lambda c: c.has_available_units(3 * U),
                 lambda c: c.restore_queued_for(-1),
                 lambda c: c.store._next_victim()):
        small, big = cost(200, call), cost(400, call)
        assert big > small + 150, (small, big)


# -- overlapped scheduling (SPEC D.13, G12, G15, G17) ------------------------------------


def _owner_crowd_coord(n: int) -> tuple[I.PagedStateCheckpointCoordinator, list[Seq]]:
    """``n`` restores queued, each remembered for its own sequence (G15), and ``n`` pending
    boundaries filed with forwards still to come."""
    c = _coord((n + 2) * U)
    _ready_many(c, range(n + 2))
    seqs = [Seq(k) for k in range(n)]
    for k, s in enumerate(seqs):
        assert c.begin_restore(k, k, seq=s)
        c.checkpoint(s, 1, 1_000_000 + k, forward=10 + k)
    return c, seqs


def test_restore_owners_are_indexed() -> None:
    """G15: beginning a restore for a sequence, refusing a second one, and forgetting it by
    identity (or the slot's restore of another sequence) touch only that restore."""
    def begin(w: Any) -> None:
        assert w[0].begin_restore(len(w[1]) + 1, BIG + 1, seq=Seq(1))  # READY, slot free

    same_cost(_owner_crowd_coord, begin)

    def refused(w: Any) -> None:
        with pytest.raises(AssertionError):  # SlotBusyError: a restore is queued for it
            w[0].begin_restore(len(w[1]) + 1, BIG + 1, seq=w[1][3])

    same_cost(_owner_crowd_coord, refused)
    same_cost(_owner_crowd_coord, lambda w: w[0].forget_pending(w[1][4]))

    def moved_slot(w: Any) -> None:
        s = w[1][5]
        s.state_slot = 6  # slot 6's restore is another sequence's: not cancelled
        w[0].forget_pending(s)
        assert w[0].restore_queued_for(6) and not w[0].restore_queued_for(5)

    same_cost(_owner_crowd_coord, moved_slot)
    same_cost(_owner_crowd_coord, lambda w: w[0].suspend_queued_restore(7))


def test_outstanding_and_is_idle_do_not_walk() -> None:
    """G17: ``outstanding()`` and ``is_idle()`` are counts, whatever the crowd."""
    for call in (lambda w: w[0].outstanding(), lambda w: w[0].is_idle(),
                 lambda w: w[0].store.outstanding()):
        same_cost(_owner_crowd_coord, call)
        same_cost(_pending_crowd, call)
        same_cost(_offload_crowd, call)
    same_cost(_scratch_crowd, lambda c: c.is_idle())


def _scratch_lent_crowd(n: int) -> I.PagedStateCheckpointCoordinator:
    """``_scratch_crowd`` with one READY record: restores aimed at scratch slots (G12)."""
    c = _scratch_crowd(n)
    assert c.store.begin_store(7, 0) is not None
    c.complete_previous_batch()
    return c


def test_the_slot_lender_checks_do_not_walk() -> None:
    """G12: a restore into a slot lent as scratch is refused by an index lookup, and a
    reservation checks its slot against the restores by slot."""

    def refused(c: Any) -> None:
        with pytest.raises(AssertionError):  # SlotBusyError
            c.begin_restore(7, 100 + 5)

    same_cost(_scratch_lent_crowd, refused)
    same_cost(_restore_crowd, lambda c: c.reserve_midstep(Seq(1), [(0, 10**8)]))


def _waiting_scratch_front(n: int) -> I.PagedStateCheckpointCoordinator:
    """One scratch store waiting for a forward to come at the front of the queue, then
    ``n`` issuable ones; no budget."""
    c = I.PagedStateCheckpointCoordinator(I.UnitPool(8), spec(10, 20), True,
                                          readable_midstep=True)
    c.attach_midstep_scratch(I.SlotPool(range(100, 100 + n + 2)), 0)
    seq = Seq(1)
    c.publish_midstep(c.reserve_midstep(seq, [(0, 4_999_999)]), forward=50)
    for k in range(n):
        c.publish_midstep(c.reserve_midstep(seq, [(0, 5_000_000 + k)]))
    return c


def test_a_drain_skips_waiting_scratch_without_walking_the_rest() -> None:
    """D.13: a scratch store waiting for its forward is passed over in place; the
    over-budget remainder behind it is not read, and the queue keeps its order."""

    same_cost(_waiting_scratch_front, lambda c: c.take_checkpoint_ops())
    c = _waiting_scratch_front(3)
    before = c.snapshot().scratch_queued
    c.take_checkpoint_ops()
    assert c.snapshot().scratch_queued == before and c.snapshot().scratch_forwards


def test_a_settle_costs_the_tokens_not_the_records() -> None:
    """D.13: polling outstanding tokens that are not done reads no record; a host reader's
    call with a crowd of READY records and one pending token costs the same."""

    def world(n: int) -> tuple[I.PagedStateCheckpointCoordinator, Any]:
        c = _coord((n + 2) * U, offload=FakeOffload())
        c.attach_offload(FakeOffload(), sink=False)
        for h in range(n):
            assert c.store.begin_store(h, 0) is not None
        token = ManualCompletion()
        c.complete_previous_batch(token)  # n records unsettled, one token
        assert c.store.begin_store(n, 0) is not None
        c.complete_previous_batch()  # settled at once
        return c, n

    same_cost(world, lambda w: w[0].settle_completions())
    same_cost(world, lambda w: w[0].acquire_checkpoint_source(w[1]))
    same_cost(world, lambda w: w[0].acquire_checkpoint_source(3))  # unsettled: None
    same_cost(world, lambda w: w[0].take_offload_stores(4))
