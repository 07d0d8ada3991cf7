"""SPEC section F, scenarios 1-56, against the reference pool, store and coordinator.

One test per scenario, named ``test_f<NN>_...``, with the SPEC's pool sizes, hashes and
slots. Every store and coordinator is wrapped in ``conftest.Checked``, so every call is
followed by the SPEC C invariants and the step invariants, and a call that raises is
checked to change nothing (G8). Where section G changes a scenario's outcome, the test
asserts the G behaviour and says which G in a comment.

Scenarios with no test here, because they exercise ATOM's ``BlockManager`` / ``Scheduler``
(``schedule``, ``can_allocate``, ``allocate``, ``_fresh_block``, ``_attach_state_*``,
demand recording), for which the reference model has no API:

- F5 (pins released before allocation): the ordering of ``complete_previous_state_batch``
  before admission inside ``schedule()`` is a Scheduler property. The store half (a drained
  restore's pin is gone after ``complete_previous_batch``) is asserted by F2 and F7.
- F22 (the cache cannot starve live KV): ``can_allocate`` and ``_fresh_block``'s
  ``AssertionError("No PAGE unit ...")`` are BlockManager code. The store half (an unpinned
  image counts as free space, a pinned one does not) is F13, F14 and F21.
- F23 (demand gate uses admission plus image): ``checkpoint_demand_pos`` and
  ``demands_declined_no_room`` are BlockManager counters.
- F24 (pin before fresh blocks): the order of ``_attach_state_*`` and ``_fresh_block``
  inside ``allocate`` is BlockManager code.
- F29 (gated checkpoint vanished): ``_attach_state_*`` and its ``RuntimeError``
  (``CheckpointVanishedError``) are BlockManager code; the model only answers
  ``begin_restore(h) -> None`` for an unindexed h (asserted in F8 and S2).

Partly covered (the BlockManager half is not modelled): F9 ("slot free" after
``deallocate``), F43 (``BlockManager.settle_state_store`` not indexing a forfeited op;
the model's half, ``was_reclaimed(op)``, is asserted).
"""

from __future__ import annotations

import pytest
from conftest import (
    FakeClock,
    FakeOffload,
    Seq,
    assert_unchanged,
    checked,
    make_coord,
    make_store,
    owner_units,
    phase,
    pin,
    ready,
    record,
    spec,
)

from pagedstate.models.reference import PageUnitCheckpointStore, SlotPool, UnitPool
from pagedstate.spec import (
    AmbiguousSuspendError,
    SlotBusyError,
    StaleReservationError,
    check_invariants,
    checkpoint_copy_ops_per_batch,
)
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

U = 3  # spec(10, 25): ceil(25 / 10)


def units_of(store, cid):
    return record(store, cid).unit_ids


# ---------------------------------------------------------------------------------------
# Visibility and batch ordering
# ---------------------------------------------------------------------------------------


def test_f01_publish_before_copy():
    s = make_store(20)
    op = s.begin_store(101, 0)
    assert op is not None and len(op.unit_ids) == U
    assert s.lookup(101) == -1
    assert not s.contains(101)
    assert s.pool.num_free == 17
    assert s.begin_restore(101, 4) is None  # nothing to gather from yet
    s.complete_inflight()
    assert s.lookup(101) >= 0
    assert units_of(s, s.lookup(101)) == op.unit_ids


def test_f02_empty_pass_keeps_a_queued_restore():
    c = make_coord(20)
    cid = ready(c, 101)
    assert c.begin_restore(101, 4)
    assert pin(c, cid) == 1
    c.complete_previous_batch()  # an empty pass: no drain
    assert pin(c, cid) == 1
    assert c.restore_queued_for(4)
    stores, restores = c.take_checkpoint_ops()
    assert stores == () and [r.dst_slot for r in restores] == [4]
    assert pin(c, cid) == 1  # in flight until the next complete
    c.complete_previous_batch()
    assert pin(c, cid) == 0


def _midstep_coord(slots=(90, 91), max_num_seqs=2):
    scratch = SlotPool(slots)
    c = make_coord(
        20,
        readable_midstep=True,
        scratch=scratch,
        max_ops_per_batch=checkpoint_copy_ops_per_batch(max_num_seqs),
    )
    return c, scratch


def test_f03_scratch_is_not_begun_at_publish():
    c, _scratch = _midstep_coord()
    seq = Seq(0)
    res = c.reserve_midstep(seq, [(16, 555)])
    assert res == [(90, 16, 555)]
    c.publish_midstep(res)
    c.complete_previous_batch()
    assert not c.contains(555)
    assert not c.store.contains_or_pending(555)  # not even begun
    stores, restores = c.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [90] and restores == ()
    assert not c.contains(555)  # COPYING until its batch completes
    c.complete_previous_batch()
    assert c.contains(555)


def test_f04_scratch_slot_stays_borrowed_until_the_next_complete():
    c, scratch = _midstep_coord()
    res = c.reserve_midstep(Seq(0), [(16, 555)])
    c.publish_midstep(res)
    stores, _ = c.take_checkpoint_ops()
    assert len(stores) == 1
    assert 90 not in scratch.free_slots
    assert c.snapshot().scratch_issued == (90,)
    c.complete_previous_batch()
    assert 90 in scratch.free_slots
    assert c.snapshot().scratch_issued == ()


def test_f04b_a_stale_midstep_reservation_is_refused():
    """Not in SPEC F (SPEC D.1 step 5): a reservation ``(slot, pos, h)`` from an earlier
    ``reserve_midstep`` that was cancelled, or published and then stored in an earlier pass,
    is stale once its slot is lent again. Publishing (or cancelling) it would queue the old
    ``h`` for the bytes the newer reservation's forward writes (or hand back the newer
    holder's slot), so it raises StaleReservationError and changes nothing; the outstanding
    reservation still publishes normally."""
    c, scratch = _midstep_coord(slots=(90,))
    old = c.reserve_midstep(Seq(0), [(16, 555)])
    assert old == [(90, 16, 555)]
    c.cancel_midstep(old)
    new = c.reserve_midstep(Seq(1), [(32, 666)])
    assert new == [(90, 32, 666)]  # the same slot, lent again
    assert_unchanged(c, lambda: c.publish_midstep(old), StaleReservationError)
    assert_unchanged(c, lambda: c.cancel_midstep(old), StaleReservationError)
    c.publish_midstep(new)
    stores, _ = c.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [90]
    c.complete_previous_batch()
    assert c.contains(666) and not c.store.contains_or_pending(555)

    # A reservation published and stored in an earlier pass is stale too.
    again = c.reserve_midstep(Seq(2), [(48, 777)])
    assert again == [(90, 48, 777)]
    assert_unchanged(c, lambda: c.publish_midstep(new), StaleReservationError)
    c.publish_midstep(again)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    assert c.contains(777) and scratch.free_slots == {90}


# ---------------------------------------------------------------------------------------
# Unindex, clear and eviction lifetime
# ---------------------------------------------------------------------------------------


def test_f06_unindex_during_copy():
    s = make_store(20)
    op = s.begin_store(101, 0)
    cid = s.snapshot().pending[101]
    assert s.unindex(101) is True
    assert phase(s, cid) == "EVICTING"
    assert s.pool.num_free == 17
    assert not s.contains_or_pending(101)
    s.complete_inflight()
    assert phase(s, cid) == "RELEASED"
    assert s.pool.num_free == 20
    assert all(s.pool.is_dirty(u) for u in op.unit_ids)  # G10: released units are dirty


def test_f07_unindex_with_two_readers():
    s = make_store(20)
    cid = ready(s, 101)
    assert s.begin_restore(101, 4) is not None
    assert s.begin_restore(101, 8) is not None
    assert pin(s, cid) == 2
    assert s.unindex(101) is True
    assert phase(s, cid) == "EVICTING"
    assert s.pool.num_free == 17
    assert owner_units(s.pool, (CHECKPOINT_OWNER, cid)) == units_of(s, cid)
    ops = s.take_restore_ops()
    assert sorted(op.dst_slot for op in ops) == [4, 8]
    assert phase(s, cid) == "EVICTING"
    s.complete_inflight()
    assert phase(s, cid) == "RELEASED"
    assert s.pool.num_free == 20


def test_f08_cancel_frees_an_evicting_record():
    s = make_store(20)
    cid = ready(s, 101)
    s.begin_restore(101, 4)
    s.unindex(101)
    assert phase(s, cid) == "EVICTING"
    s.cancel_queued_restore(4)
    assert s.take_restore_ops() == ()
    assert phase(s, cid) == "RELEASED"
    assert s.pool.num_free == 20
    assert s.begin_restore(101, 4) is None


def test_f09_deallocate_cancels_a_queued_restore():
    """``deallocate`` reaches the coordinator as ``forget_pending(seq)`` (SPEC D.1 step 8).
    Returning the slot to the request slot pool is BlockManager code, not modelled."""
    c = make_coord(20)
    cid = ready(c, 101)
    seq = Seq(4)
    assert c.begin_restore(101, seq.state_slot)  # admitted with a hit
    assert pin(c, cid) == 1
    c.forget_pending(seq)
    assert pin(c, cid) == 0
    assert not c.restore_queued_for(4)
    newcomer = Seq(4)  # reuses the slot
    assert not c.restore_queued_for(newcomer.state_slot)
    stores, restores = c.take_checkpoint_ops()
    assert stores == () and restores == ()
    c.complete_previous_batch()
    assert pin(c, cid) == 0


def test_f10_clear_defers_pinned_readers():
    s = make_store(20)
    c101 = ready(s, 101)
    c202 = ready(s, 202)
    s.begin_restore(202, 4)
    s.clear()
    assert phase(s, c101) == "RELEASED"
    assert phase(s, c202) == "EVICTING"
    assert s.pool.num_free == 17
    assert s.lookup(202) == -1
    assert [op.dst_slot for op in s.take_restore_ops()] == [4]
    s.complete_inflight()
    assert s.snapshot().records == {}
    assert s.pool.num_free == 20


def test_f11_restore_after_unindex_in_the_same_pass():
    raw = PageUnitCheckpointStore(UnitPool(20), spec(10, 25))
    s = checked(raw)
    s.begin_store(101, 0)
    first = s.snapshot().pending[101]
    s.unindex(101)
    assert s.begin_store(101, 1) is not None
    second = s.snapshot().pending[101]
    assert second != first
    assert phase(s, first) == "EVICTING" and phase(s, second) == "COPYING"

    seen = []
    real_release = raw._release_record

    def spy(cid):
        real_release(cid)
        seen.append((cid, dict(raw._pending_by_hash)))

    raw._release_record = spy
    s.complete_inflight()
    del raw._release_record
    # The first record's release left the second's pending entry alone.
    assert seen[0] == (first, {101: second})
    assert phase(s, first) == "RELEASED"
    assert phase(s, second) == "READY"
    assert s.lookup(101) == second
    assert s.pool.num_free == 17


def test_f12_dedup_at_publish():
    """Reachable only by bypassing the guards: the test drops the pending entry so a second
    store of 101 can begin; the first publishes, the second finds it READY and is released."""
    s = PageUnitCheckpointStore(UnitPool(20), spec(10, 25))
    op1 = s.begin_store(101, 0)
    first = s._pending_by_hash.pop(101)  # bypass the "already pending" guard
    op2 = s.begin_store(101, 1)
    assert op2 is not None
    second = s._pending_by_hash[101]
    s.complete_inflight()
    assert s.lookup(101) == first  # the existing one stays canonical
    assert s.records[first].unit_ids == tuple(op1.unit_ids)
    assert second not in s.records
    assert s.pool.num_free == 17
    assert all(s.pool.is_dirty(u) for u in op2.unit_ids)
    assert check_invariants(s.snapshot()) == []


# ---------------------------------------------------------------------------------------
# Admission, eviction and floors
# ---------------------------------------------------------------------------------------


def test_f13_lru_eviction_releases_one_whole_image():
    s = make_store(7)
    c101 = ready(s, 101)
    c202 = ready(s, 202)
    assert s.pool.num_free == 1
    assert s.begin_store(303, 0) is not None
    assert phase(s, c101) == "RELEASED"
    assert phase(s, c202) == "READY"
    assert s.evictions == 1
    assert s.pool.num_free == 1


def test_f14_protected_hit():
    s = make_store(6)
    ready(s, 101)
    assert s.has_available_units(6) is True
    assert s.has_available_units(6, protected_hash=101) is False


def _ten_unit_store(n):
    return make_store(n, spec(10, 100))  # U = 10


def test_f15_no_needless_eviction():
    s = _ten_unit_store(100)
    for h in (101, 202, 303):
        ready(s, h)
    assert s.pool.num_free == 70
    assert s.begin_store(404, 0) is not None
    assert s.evictions == 0
    assert all(s.lookup(h) >= 0 for h in (101, 202, 303))


def test_f16_shortfall_only():
    s = _ten_unit_store(35)
    cids = [ready(s, h) for h in (101, 202, 303)]
    assert s.pool.num_free == 5
    assert s.begin_store(404, 0) is not None
    assert s.evictions == 1
    assert [phase(s, c) for c in cids] == ["RELEASED", "READY", "READY"]


def test_f17_a_dropped_store_evicts_nothing():
    s = make_store(150)
    for i in range(50):
        ready(s, 1000 + i, slot=i)
        assert s.begin_restore(1000 + i, i) is not None  # pinned, one slot each (G4)
    assert s.pool.num_free == 0
    before = s.snapshot()
    assert s.begin_store(9999, 60) is None
    assert s.evictions == 0
    assert len(s.snapshot().records) == 50
    assert s.snapshot() == before  # no side effects, no identity consumed


def test_f18_unreachable_count():
    c = make_coord(50, spec(10, 100))  # U = 10
    for h in (101, 202, 303, 404, 505):
        ready(c, h)
    assert c.pool.num_free == 0  # 50 spendable units
    before = c.snapshot()
    assert c.store.ensure_free_units(60) is False
    assert c.ensure_free_units(60) is False
    assert c.store.evictions == 0
    assert c.snapshot() == before
    assert c.ensure_free_units(50) is True  # the whole cache is reachable
    assert c.store.evictions == 5


def test_f19_the_policy_cannot_move_the_gate():
    s = make_store(9)
    cids = {h: ready(s, h) for h in (101, 202, 303)}
    assert s.pool.num_free == 0
    queries = [(n, p) for n in range(0, 13) for p in (None, 101, 202, 303, 999)]
    lru_answers = {q: s.has_available_units(q[0], q[1]) for q in queries}
    raw = s.raw

    def newest_first():
        for cid in reversed(raw._lru):
            if raw._is_evictable(cid):
                return cid
        return -1

    s._next_victim = newest_first
    assert {q: s.has_available_units(q[0], q[1]) for q in queries} == lru_answers
    assert s.ensure_free_units(1) is True
    assert phase(s, cids[303]) == "RELEASED"  # the new policy's victim
    assert phase(s, cids[101]) == "READY" and phase(s, cids[202]) == "READY"
    assert s.evictions == 1


def test_f20_a_policy_that_leaves_the_loop_short():
    s = make_store(9)
    for h in (101, 202, 303):
        ready(s, h)
    s._next_victim = lambda protected=-1: -1
    next_id = s.snapshot().next_checkpoint_id
    assert s.begin_store(404, 0) is None
    assert s.snapshot().next_checkpoint_id == next_id
    assert s.evictions == 0
    assert len(s.snapshot().records) == 3


def test_f21_a_restore_takes_no_units():
    s = make_store(6)
    cid = ready(s, 101)
    live = s.pool.reserve_units(3, ("live-kv", 0))
    assert live is not None and s.pool.num_free == 0
    op = s.begin_restore(101, 4)
    assert op is not None and op.unit_ids == units_of(s, cid)
    assert s.pool.num_free == 0
    assert pin(s, cid) == 1


# ---------------------------------------------------------------------------------------
# Coordinator pending and orphan rules
# ---------------------------------------------------------------------------------------


def test_f25_supersede():
    c = make_coord(20)
    seq = Seq(2)
    c.checkpoint(seq, 1, 111)
    c.checkpoint(seq, 2, 222)
    assert c.checkpoints_dropped == 1
    stores, _ = c.take_checkpoint_ops()
    assert len(stores) == 1 and stores[0].src_slot == 2
    assert c.store.contains_or_pending(222) and not c.store.contains_or_pending(111)
    assert c.checkpoints_kept == 1 and c.checkpoints_dropped == 1
    c.complete_previous_batch()
    assert c.contains(222)
    assert not c.contains(111)


def test_f26_orphan_across_seqs():
    c = make_coord(20)
    a, b = Seq(1), Seq(2)
    c.checkpoint(a, 1, 333)
    c.checkpoint(b, 1, 333)
    assert len(c.snapshot().pending_boundaries) == 2
    c.unindex(333)
    assert c.snapshot().pending_boundaries == ()
    assert c.checkpoints_orphaned == 1
    stores, restores = c.take_checkpoint_ops()
    assert stores == () and restores == ()


def test_f27_duplicate_pending_hash_across_seqs():
    c = make_coord(20)
    a, b = Seq(1), Seq(2)
    c.checkpoint(a, 1, 333)
    c.checkpoint(b, 1, 333)
    stores, _ = c.take_checkpoint_ops()
    assert len(stores) == 1 and stores[0].src_slot == 1  # filing order
    assert c.checkpoints_kept == 1
    assert c.checkpoints_dropped == 0


def test_f28_missing_slot():
    c = make_coord(20)
    c.checkpoint(Seq(-1), 1, 111)
    assert c.snapshot().pending_boundaries == ()
    seq = Seq(3)
    c.checkpoint(seq, 1, 222)
    assert len(c.snapshot().pending_boundaries) == 1
    seq.state_slot = -1  # lost its slot before the drain
    stores, _ = c.take_checkpoint_ops()
    assert stores == ()
    assert c.checkpoints_kept == 0 and c.checkpoints_dropped == 0
    assert c.snapshot().pending_boundaries == ()
    assert not c.store.contains_or_pending(222)


# ---------------------------------------------------------------------------------------
# Offload nomination and pins
# ---------------------------------------------------------------------------------------


def test_f30_nominate_without_pinning():
    s = make_store(20, sink=True)
    cid = ready(s, 11)
    assert s.snapshot().offload_ready == (cid,)
    assert pin(s, cid) == 0
    assert s._is_evictable(cid) is True
    taken = s.take_offload_stores(4)
    assert len(taken) == 1
    op, units = taken[0]
    assert op.prefix_hash == 11
    assert units == units_of(s, cid)
    assert pin(s, cid) == 1
    assert s._is_evictable(cid) is False


def test_f31_no_sink():
    s = make_store(20, sink=False)
    ready(s, 11)
    assert s.snapshot().offload_ready == ()
    assert s.take_offload_stores(4) == []

    c = make_coord(20)
    index = FakeOffload()
    c.attach_offload(index, sink=False)  # a load-only role: the vote, no sink
    assert c.offload is index
    ready(c, 11)
    assert c.snapshot().offload_ready == ()
    assert c.take_offload_stores(4) == []
    assert c.snapshot().offload_pins == {}


def test_f32_spent_nominee():
    s = make_store(20, sink=True)
    cid = ready(s, 11)
    s._evict(cid)
    assert s.take_offload_stores(4) == []
    assert s.snapshot().offload_ready == ()  # dropped for good
    assert s.take_offload_stores(4) == []


def test_f33_offered_once():
    s = make_store(20, sink=True)
    ready(s, 11)
    assert len(s.take_offload_stores(4)) == 1
    assert s.take_offload_stores(4) == []


def test_f34_the_cap_waits_it_does_not_drop():
    s = make_store(20, sink=True)
    cids = [ready(s, h) for h in (11, 12, 13)]
    first = s.take_offload_stores(2)
    assert [op.prefix_hash for op, _ in first] == [11, 12]
    assert s.take_offload_stores(2) == []
    assert s.snapshot().offload_ready == (cids[2],)
    s.settle_offload_store(first[0][0])
    third = s.take_offload_stores(2)
    assert [op.prefix_hash for op, _ in third] == [13]
    assert s.offload_nominations_dropped == 0


def test_f35_deferral_keeps_its_place():
    """SPEC: cid1, cid2 for h and cid3 for h'. A fourth nominee h'' (cap 2) shows the
    deferred entry is put back *ahead* of newer ones, not behind them."""
    s = make_store(20, sink=True)
    cid1 = ready(s, 11)
    (op1, _), = s.take_offload_stores(2)
    s.unindex(11)
    assert phase(s, cid1) == "EVICTING"
    cid2 = ready(s, 11)
    cid3 = ready(s, 12)
    cid4 = ready(s, 13)
    taken = s.take_offload_stores(2)
    assert [op.prefix_hash for op, _ in taken] == [12]  # cid2 deferred, cid3 handed out
    assert s.snapshot().offload_pins[taken[0][0]].checkpoint_id == cid3
    assert s.snapshot().offload_ready == (cid2, cid4)
    s.settle_offload_store(op1)
    assert phase(s, cid1) == "RELEASED"
    (op2, units2), = s.take_offload_stores(2)
    assert op2.prefix_hash == 11 and units2 == units_of(s, cid2)
    assert s.snapshot().offload_ready == (cid4,)


def test_f36_backlog_overflow():
    """Reading of "a following extendleft re-queue must keep the re-queued oldest entries":
    a take that defers every nominee (their hashes are leased) puts them all back, oldest
    first, without counting or losing any, even with the backlog at its cap."""
    s = make_store(20, sink=True, offload_backlog_cap=2)
    c1, c2, c3 = (ready(s, h) for h in (11, 12, 13))
    assert s.offload_nominations_dropped == 1
    assert s.snapshot().offload_ready == (c2, c3)  # the oldest was dropped
    # Make both remaining nominees' hashes busy, so a take defers both and re-queues them
    # with extendleft: the re-queued oldest entries must all be kept, in order.
    lease2 = s.acquire_checkpoint_source(12)
    lease3 = s.acquire_checkpoint_source(13)
    assert lease2 is not None and lease3 is not None
    assert s.take_offload_stores(10) == []
    assert s.snapshot().offload_ready == (c2, c3)
    assert s.offload_nominations_dropped == 1
    for op, _ in (lease2, lease3):
        s.release_offload_store_source(op)
        s.settle_offload_store(op)
    assert [op.prefix_hash for op, _ in s.take_offload_stores(10)] == [12, 13]
    assert phase(s, c1) == "READY"  # dropping a nomination does not touch the image


def test_f37_two_phase_release():
    s = make_store(20, sink=True)
    cid = ready(s, 11)
    (op, _), = s.take_offload_stores(4)
    s.release_offload_store_source(op)
    assert pin(s, cid) == 0
    assert s._is_evictable(cid) is True
    assert s.has_offload_pins() is True
    assert s._hash_in_flight(11) is True
    s.settle_offload_store(op)
    assert s.has_offload_pins() is False
    assert s._hash_in_flight(11) is False


def test_f38_idempotence():
    s = make_store(20, sink=True)
    cid = ready(s, 11)
    (op, _), = s.take_offload_stores(4)
    s.release_offload_store_source(op)
    s.release_offload_store_source(op)
    assert pin(s, cid) == 0
    s.settle_offload_store(op)
    s.settle_offload_store(op)
    s.release_offload_store_source(op)
    assert pin(s, cid) == 0
    assert phase(s, cid) == "READY"
    assert not s.has_offload_pins()


def test_f39_unindex_during_an_offload_copy():
    s = make_store(20, sink=True)
    cid = ready(s, 11)
    (op, units), = s.take_offload_stores(4)
    assert s.unindex(11) is True
    assert phase(s, cid) == "EVICTING"
    assert s.pool.num_free == 17
    assert all(s.pool.owner_of(u) is not None for u in units)
    s.settle_offload_store(op)
    assert phase(s, cid) == "RELEASED"
    assert s.pool.num_free == 20


def test_f40_generations():
    s = make_store(20, sink=True)
    ready(s, 11)
    (op1, _), = s.take_offload_stores(4)
    s.settle_offload_store(op1)
    s.unindex(11)
    cid2 = ready(s, 11)
    (op2, _), = s.take_offload_stores(4)
    assert op2 != op1
    assert op2.prefix_hash == op1.prefix_hash == 11
    assert op2.generation > op1.generation
    s.settle_offload_store(op1)  # its own pin is long gone: settles nothing
    assert pin(s, cid2) == 1
    s.settle_offload_store(op2)
    assert pin(s, cid2) == 0


def test_f41_late_report_from_a_superseded_attempt():
    """"Re-queue" is done by hand (``_queue_offload_store``), as the store never re-nominates
    an image whose op was settled or reclaimed (SPEC B.4)."""
    clock = FakeClock()
    s = make_store(20, sink=True, clock=clock)
    cid = ready(s, 11)
    (op1, _), = s.take_offload_stores(4)
    clock.advance(10)
    assert s.reclaim_stale_offload_pins(1.0) == 1
    assert op1 not in s.snapshot().offload_pins
    s._queue_offload_store(cid)  # re-queue (test bypass: never re-nominated by the store)
    (op2, _), = s.take_offload_stores(4)
    assert pin(s, cid) == 1
    s.settle_offload_store(op1)
    assert pin(s, cid) == 1
    s.settle_offload_store(op2)
    assert pin(s, cid) == 0


def test_f42_no_concurrent_stores_of_one_hash():
    s = make_store(20, sink=True)
    cid = ready(s, 11)
    (op, _), = s.take_offload_stores(4)
    s._queue_offload_store(cid)  # re-queue the same cid (test bypass)
    assert s.take_offload_stores(4) == []
    assert s.snapshot().offload_ready == (cid,)  # deferred, not lost
    assert s.acquire_checkpoint_source(11) is None
    s.release_offload_store_source(op)
    assert s.acquire_checkpoint_source(11) is None  # still in flight until its report
    assert s.take_offload_stores(4) == []
    s.settle_offload_store(op)
    assert s.acquire_checkpoint_source(11) is not None


def test_f43_forfeit_on_reclaim():
    """The model half only: ``BlockManager.settle_state_store(op, ok=True)`` reading
    ``was_reclaimed(op)`` and not indexing 11 is engine code."""
    clock = FakeClock()
    s = make_store(20, sink=True, clock=clock)
    cid = ready(s, 11)
    (op, _), = s.take_offload_stores(4)
    clock.advance(1)
    assert s.reclaim_stale_offload_pins(1e-9) == 1
    assert s.was_reclaimed(op) is True
    assert pin(s, cid) == 0
    assert s._is_evictable(cid) is True
    assert phase(s, cid) == "READY"
    s.settle_offload_store(op)  # the late report settles nothing ...
    assert s.was_reclaimed(op) is True  # ... and stays untrusted
    assert pin(s, cid) == 0


def test_f44_a_source_released_op_that_is_then_reclaimed_is_not_forfeited():
    clock = FakeClock()
    s = make_store(20, sink=True, clock=clock)
    cid = ready(s, 11)
    (op, _), = s.take_offload_stores(4)
    s.release_offload_store_source(op)
    clock.advance(1)
    assert s.reclaim_stale_offload_pins(1e-9) == 1
    assert pin(s, cid) == 0
    assert s.was_reclaimed(op) is False
    assert s.offload_pins_reclaimed == 1
    assert not s.has_offload_pins()


def test_f45_timeout_bounds():
    clock = FakeClock()
    s = make_store(20, sink=True, clock=clock)
    cid = ready(s, 11)
    (op, _), = s.take_offload_stores(4)
    clock.advance(10)
    assert s.reclaim_stale_offload_pins(3600) == 0
    assert s.reclaim_stale_offload_pins(0) == 0
    assert s.reclaim_stale_offload_pins(-1) == 0
    assert pin(s, cid) == 1 and s.offload_pins_reclaimed == 0
    assert s.reclaim_stale_offload_pins(5) == 1  # only an expired timeout reclaims
    assert s.was_reclaimed(op)


# ---------------------------------------------------------------------------------------
# External leases, reservations and adoption
# ---------------------------------------------------------------------------------------


def test_f46_exact_ready_only():
    c = make_coord(20)
    assert c.acquire_checkpoint_source(101) is None
    op = c.store.begin_store(101, 0)
    assert c.acquire_checkpoint_source(101) is None  # COPYING
    c.complete_previous_batch()
    lru_before = c.snapshot().lru
    lease = c.acquire_checkpoint_source(101)
    assert lease is not None
    lop, units = lease
    assert units == op.unit_ids
    assert lop.prefix_hash == 101
    s = c.snapshot()
    assert s.queued_restores == () and s.inflight_restores == () and s.offload_ready == ()
    assert s.lru == lru_before
    assert c.checkpoints_kept == 0
    assert c.pool.num_units - c.pool.num_free == U


def test_f47_leases_are_never_timed_out():
    clock = FakeClock()
    c = make_coord(20, offload=FakeOffload(), clock=clock)
    c101 = ready(c, 101)
    ready(c, 202)
    lease, _ = c.acquire_checkpoint_source(101)
    taken = c.take_offload_stores(4)
    assert [op.prefix_hash for op, _ in taken] == [202]  # 101 is in flight as a lease
    legacy = taken[0][0]
    clock.advance(999)
    assert c.reclaim_stale_offload_pins(60) == 1
    pins = c.snapshot().offload_pins
    assert legacy not in pins and lease in pins
    assert c.was_reclaimed(legacy) and not c.was_reclaimed(lease)
    c.unindex(101)
    assert phase(c, c101) == "EVICTING"  # units held by the lease
    assert c.pool.num_free == 20 - 2 * U
    c.release_offload_store_source(lease)
    assert phase(c, c101) == "RELEASED"
    assert c.has_offload_pins() is True
    c.settle_offload_store(lease)
    assert c.has_offload_pins() is False


def test_f48_lease_limit():
    c = make_coord(20)
    ready(c, 101)
    ready(c, 202)
    op, _ = c.acquire_checkpoint_source(101)
    c.release_offload_store_source(op)
    assert c.acquire_checkpoint_source(202, max_inflight=1) is None
    c.settle_offload_store(op)
    assert c.acquire_checkpoint_source(202, max_inflight=1) is not None


def test_f49_lease_across_a_reset():
    c = make_coord(20)
    cid = ready(c, 101)
    op, units = c.acquire_checkpoint_source(101)
    c.clear_index()
    assert phase(c, cid) == "EVICTING"
    assert all(c.pool.owner_of(u) == ((CHECKPOINT_OWNER, cid), i) for i, u in enumerate(units))
    assert c.acquire_checkpoint_source(101) is None
    c.settle_offload_store(op)  # one-phase terminal cancel, no prior release
    assert phase(c, cid) == "RELEASED"
    assert c.pool.num_free == 20


def test_f50_transfer_reservation():
    c = make_coord(9)
    owner = ("req-1", 0)  # LoadOperationId(req_id, nonce)
    units = c.reserve_transfer_units(owner)
    assert units is not None and len(units) == U
    assert owner_units(c.pool, (TRANSFER_OWNER, owner)) == units
    s = c.snapshot()
    assert s.records == {} and s.transfers == {owner: units}
    assert c.take_checkpoint_ops() == ((), ())
    assert c.reserve_transfer_units(owner) is None  # duplicate owner
    # Fill the rest with a pinned and a leased image; a second reservation is refused
    # without evicting either.
    pinned = ready(c, 101)
    c.begin_restore(101, 4)
    leased = ready(c, 202)
    c.acquire_checkpoint_source(202)
    assert c.pool.num_free == 0
    assert c.reserve_transfer_units(("req-2", 0)) is None
    assert c.store.evictions == 0
    assert phase(c, pinned) == "READY" and phase(c, leased) == "READY"
    c.clear_index()
    c.complete_previous_batch()
    assert c.snapshot().transfers == {owner: units}
    c.release_transfer_units(("req-1", 1))  # another generation: no-op
    assert c.snapshot().transfers == {owner: units}
    c.release_transfer_units(owner)
    assert c.snapshot().transfers == {}
    assert all(c.pool.owner_of(u) is None for u in units)
    c.release_transfer_units(owner)  # double release: no-op
    assert c.snapshot().transfers == {}


def test_f51_adopt_with_no_free_window(monkeypatch):
    c = make_coord(3, offload=FakeOffload())  # sink on: adoption still nominates nothing
    owner = ("req-1", 0)
    units = c.reserve_transfer_units(owner)
    assert c.pool.num_free == 0
    pool = c.pool.raw
    seen = []
    real_rekey = pool.rekey_units

    def rekey_spy(*args, **kwargs):
        seen.append(pool.num_free)
        real_rekey(*args, **kwargs)
        seen.append(pool.num_free)

    def release_spy(*args, **kwargs):
        raise AssertionError("adoption must not release the units")

    monkeypatch.setattr(pool, "rekey_units", rekey_spy)
    monkeypatch.setattr(pool, "release_units", release_spy)
    assert c.adopt_transfer_units(owner, 101) is True
    monkeypatch.undo()
    assert seen == [0, 0]
    assert c.pool.num_free == 0
    assert c.contains(101)
    cid = c.store.lookup(101)
    assert units_of(c, cid) == units
    assert pin(c, cid) == 0
    assert c.snapshot().offload_ready == ()
    assert c.snapshot().transfers == {}
    c.unindex(101)
    assert c.pool.num_free == 3


def test_f52_duplicate_adoption():
    c = make_coord(6)
    cid = ready(c, 101)
    canonical = units_of(c, cid)
    owner = ("req-1", 0)
    incoming = c.reserve_transfer_units(owner)
    assert c.pool.num_free == 0
    assert c.adopt_transfer_units(owner, 101) is False
    assert c.store.lookup(101) == cid and units_of(c, cid) == canonical
    assert c.pool.num_free == 3
    assert all(c.pool.owner_of(u) is None for u in incoming)
    assert c.snapshot().transfers == {}


def test_f53_adopt_raises(monkeypatch):
    c = make_coord(6)
    owner = ("req-1", 0)
    units = c.reserve_transfer_units(owner)

    def boom(*args, **kwargs):
        raise RuntimeError("adopt failed")

    monkeypatch.setattr(c.store.raw, "adopt_units", boom)
    with pytest.raises(RuntimeError, match="adopt failed"):
        c.adopt_transfer_units(owner, 101)
    assert c.snapshot().transfers == {owner: units}
    c.release_transfer_units(owner)
    assert c.pool.num_free == 6
    assert c.snapshot().transfers == {}


def test_f54_suspend():
    c = make_coord(20)
    cid = ready(c, 101)
    c.begin_restore(101, 9)
    lease = c.suspend_queued_restore(9)
    assert lease is not None and lease.checkpoint_id == cid and lease.op.dst_slot == 9
    assert c.take_checkpoint_ops() == ((), ())
    assert pin(c, cid) == 1
    c.resume_suspended_restore(lease)
    _, restores = c.take_checkpoint_ops()
    assert [r.dst_slot for r in restores] == [9]
    c.complete_previous_batch()
    assert pin(c, cid) == 0

    c.begin_restore(101, 9)
    lease = c.suspend_queued_restore(9)
    c.release_suspended_restore(lease)
    assert pin(c, cid) == 0
    assert c.take_checkpoint_ops() == ((), ())

    # G4: a second restore into one slot can no longer be queued, so the SPEC's "two queued
    # restores to one slot" now fails at the second begin_restore, changing nothing.
    ready(c, 202)
    c.begin_restore(101, 9)
    assert_unchanged(c, lambda: c.begin_restore(202, 9), SlotBusyError)
    assert c.snapshot().queued_restores == ((cid, 9),)


def test_f54_suspend_defensive_check_when_the_guard_is_bypassed():
    """Two queued restores to one slot, forced past G4 by hand: suspend raises
    ``AmbiguousSuspendError`` (an AssertionError) before any mutation."""
    s = PageUnitCheckpointStore(UnitPool(20), spec(10, 25))
    s.begin_store(101, 0)
    s.complete_inflight()
    cid = s.lookup(101)
    s.begin_restore(101, 9)
    s._queued_restores.append(s._queued_restores[0])  # bypass G4
    s.records[cid].pin_count += 1
    info = assert_unchanged(s, lambda: s.suspend_queued_restore(9), AmbiguousSuspendError,
                            invariants=False)
    assert isinstance(info.value, AssertionError)
    assert len(s._queued_restores) == 2


def test_f55_reservation_eviction_respects_leases():
    c = make_coord(6)
    c101 = ready(c, 101)
    c202 = ready(c, 202)
    c.acquire_checkpoint_source(101)
    assert c.reserve_transfer_units(("req-1", 0)) is not None
    assert phase(c, c202) == "RELEASED"
    assert phase(c, c101) == "READY"
    assert c.store.evictions == 1
    assert c.reserve_transfer_units(("req-2", 0)) is None
    assert c.store.evictions == 1
    assert phase(c, c101) == "READY"


# ---------------------------------------------------------------------------------------
# Change log
# ---------------------------------------------------------------------------------------


def test_f56_change_log():
    s = make_store(20)
    start = s.generation
    ready(s, 101)
    ready(s, 202)
    assert s.changed_since(start) >= {101, 202}
    assert s.changed_since(s.generation) == set()
    middle = s.generation
    s.unindex(101)
    since = s.changed_since(middle)
    assert 101 in since and 202 not in since
    s.clear()
    assert s.changed_since(start) is None
    assert s.changed_since(middle) is None

    raw = PageUnitCheckpointStore(UnitPool(20), spec(10, 25))
    old = raw.generation
    raw.begin_store(7, 0)
    raw.complete_inflight()
    recent = raw.generation
    while raw.generation <= old + 4096 + 1:  # more than 4096 bumps
        raw.unindex(7)
        raw.begin_store(7, 0)
        raw.complete_inflight()
    assert raw.changed_since(old) is None
    assert raw.changed_since(recent) is None
    assert raw.changed_since(raw.generation - 10) == {7}


# ---------------------------------------------------------------------------------------
# Section D details the scenarios above rely on (midstep scratch; not numbered in F)
# ---------------------------------------------------------------------------------------


def test_d_midstep_out_of_scratch_counts_one_drop_and_stops():
    c, scratch = _midstep_coord(slots=(90,))
    ready(c, 444)
    res = c.reserve_midstep(Seq(0), [(8, 444), (16, 1), (32, 2), (48, 3)])
    assert res == [(90, 16, 1)]  # 444 is READY: skipped, not counted
    assert c.checkpoints_dropped == 1  # once per call, at the first position with no slot
    assert scratch.free_slots == frozenset()
    c.cancel_midstep(res)
    assert scratch.free_slots == frozenset({90})
    assert c.checkpoints_dropped == 1


def test_d_scratch_waits_for_budget_and_refused_begins_release_the_slot():
    c, scratch = _midstep_coord(slots=(90, 91), max_num_seqs=1)  # budget 2 ops per batch
    ready(c, 101)
    seq = Seq(3)
    c.begin_restore(101, 4)
    c.checkpoint(seq, 1, 202)
    res = c.reserve_midstep(Seq(0), [(16, 555), (32, 101)])  # 101 READY: skipped
    assert [h for _, _, h in res] == [555]
    c.publish_midstep(res)
    stores, restores = c.take_checkpoint_ops()
    assert len(stores) == 1 and len(restores) == 1  # budget 2 - 1 - 1 = 0
    assert c.snapshot().scratch_queued == ((555, 90),)  # stays queued, slot still borrowed
    assert 90 not in scratch.free_slots
    c.complete_previous_batch()
    stores, _ = c.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [90]
    c.complete_previous_batch()
    assert c.contains(555) and 90 in scratch.free_slots
    # A queued scratch store whose hash is already stored is refused at the drain: its slot
    # goes back at once and it counts as dropped.
    res = c.reserve_midstep(Seq(0), [(16, 666)])
    c.publish_midstep(res)
    ready(c, 666)
    dropped = c.checkpoints_dropped
    assert c.take_checkpoint_ops() == ((), ())
    assert c.checkpoints_dropped == dropped + 1
    assert scratch.free_slots == frozenset({90, 91})


def test_d_resumable_hit_and_the_tier_vote():
    index = FakeOffload(served={12})
    c = make_coord(20, offload=index)
    ready(c, 11)
    seq = Seq(1)
    hashes = [11, 12, 13]
    assert c.resumable_hit(seq, 3, hashes) == 2  # 13 unreachable, 12 voted by the tier
    assert 13 in index.asked
    index.served.clear()
    assert c.resumable_hit(seq, 3, hashes) == 1  # HBM holds 11
    assert c.resumable_hit(seq, 3, hashes, assume_checkpointed=True) == 3
    assert c.resumable_hit(seq, 0, hashes) == 0
    assert c.resumable_hit(Seq(1, has_per_req_cache=False), 3, hashes) == 3  # not applicable
    # A disabled coordinator passes the hit through for a request without per-request
    # state (one with it gets 0: G14, tests/test_section_g.py).
    stateless = Seq(1, has_per_req_cache=False)
    assert make_coord(20, enabled=False).resumable_hit(stateless, 3, hashes) == 3
    assert make_coord(20).resumable_hit(seq, 3, [21, 22, 23]) == 0  # no tier, nothing READY


def test_d_checkpoint_fates():
    clock = FakeClock()
    c = make_coord(6, offload=FakeOffload(stats={"loads": 4, "stores": 2}), clock=clock,
                   offload_backlog_cap=1)
    seq = Seq(1)
    c.checkpoint(seq, 1, 101)
    c.checkpoint(seq, 2, 202)  # supersedes: dropped 1
    c.take_checkpoint_ops()  # kept 1
    c.complete_previous_batch()  # 202 READY and nominated
    ready(c, 303)  # nominated: the backlog cap 1 drops 202's nomination
    ready(c, 404)  # evicts 202, 303's nomination dropped
    (op, _), = c.take_offload_stores(4)
    clock.advance(10)
    c.reclaim_stale_offload_pins(1)
    c.checkpoint(seq, 3, 505)
    c.unindex(505)  # orphaned 1
    assert c.checkpoint_fates() == {
        "checkpoints_kept": 1,
        "checkpoints_dropped": 1,
        "checkpoints_evicted": 1,
        "offload_pins_reclaimed": 1,
        "checkpoints_orphaned": 1,
        "state_offload_loads": 4,
        "state_offload_stores": 2,
        "state_offload_store_backlog": 0,
        "state_offload_nominations_dropped": 2,
    }
    bare = make_coord(9).checkpoint_fates()
    assert bare["state_offload_store_backlog"] == 0
    assert bare["state_offload_nominations_dropped"] == 0
    assert not any(k.startswith("state_offload_") and k not in (
        "state_offload_store_backlog", "state_offload_nominations_dropped") for k in bare)


# ---------------------------------------------------------------------------------------
# Section A.2 and B.3 details the scenarios above rely on (not numbered in F)
# ---------------------------------------------------------------------------------------


def test_a2_pool_reserve_release_rekey_contract():
    pool = UnitPool(5)
    assert pool.reserve_units(0, ("a", 0)) == []
    got = pool.reserve_units(3, ("a", 0))
    assert got is not None and len(set(got)) == 3
    assert [pool.owner_of(u) for u in got] == [(("a", 0), i) for i in range(3)]
    assert pool.num_free == 2 and pool.has_free(2) and not pool.has_free(3)
    assert pool.reserve_units(3, ("b", 0)) is None  # atomic precheck: nothing taken
    assert pool.num_free == 2
    pool.rekey_units(got, ("a", 0), ("c", 0))  # ownership moves, counts do not
    assert pool.num_free == 2
    assert [pool.owner_of(u) for u in got] == [(("c", 0), i) for i in range(3)]
    pool.release_units(got, ("c", 0))
    assert pool.num_free == 5
    assert all(pool.owner_of(u) is None for u in got)


def test_b12_only_an_unpinned_ready_checkpoint_is_evictable():
    s = make_store(20)
    cid = ready(s, 101)
    s.begin_restore(101, 4)
    info = assert_unchanged(s, lambda: s.raw._evict(cid), AssertionError)
    assert "pinned" in str(info.value)
    s.begin_store(202, 0)
    copying = s.snapshot().pending[202]
    assert_unchanged(s, lambda: s.raw._evict(copying), AssertionError)
    assert s.evictions == 0
