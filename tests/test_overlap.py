"""SPEC D.13 (overlapped scheduling: forwards and completions) on the reference model, with
D.1 steps 1, 5, 6 and 8, B.3 rows 2, 15, 16, 17 and 24, and C.25-C.28.

Written like ``test_section_g``: the reference classes and the ``make_store`` /
``make_coord`` helpers are module-level names, so a lockstep run can replace them with
twin factories and replay every test on both implementations. Tests read only public
calls and snapshots; every call that must refuse is checked to change nothing
(``assert_unchanged``), and the invariants are checked on snapshots after calls.
Completion tokens are :class:`ManualCompletion` (shared by both sides of a lockstep run,
so no test counts its ``query()`` calls exactly) or :class:`FlakyToken`.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import FakeOffload, Seq, assert_unchanged, make_coord, make_store, phase, ready

from pagedstate.models.reference import SlotPool
from pagedstate.spec import (
    BoundaryRangeError,
    InvalidArgumentError,
    ManualCompletion,
    SlotBusyError,
    StaleBoundaryError,
    check_invariants,
)


class FlakyToken:
    """A completion token whose ``query()`` (and ``synchronize()``) raise while ``fail``."""

    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.fail = False

    def query(self) -> bool:
        if self.fail:
            raise RuntimeError("device lost")
        return self.done

    def synchronize(self) -> None:
        if self.fail:
            raise RuntimeError("device lost")
        self.done = True


def ok(obj: Any) -> None:
    """Every SPEC C invariant holds on ``obj``'s snapshot."""
    problems = check_invariants(obj.snapshot())
    assert problems == [], problems


def settled(obj: Any, cid: int) -> bool:
    store = obj.store if hasattr(obj, "take_checkpoint_ops") else obj
    return store.snapshot().records[cid].settled


def publish(c: Any, h: int, completion: Any = None, slot: int = 0) -> int:
    """File ``h`` for a sequence in ``slot``, drain, complete with ``completion``; the cid."""
    c.checkpoint(Seq(slot), 1, h)
    stores, _ = c.take_checkpoint_ops()
    assert len(stores) == 1
    c.complete_previous_batch(completion)
    cid = c.store.lookup(h)
    assert cid >= 0
    return cid


# ---------------------------------------------------------------------------------------
# Forward ids (D.13, D.1 step 6)
# ---------------------------------------------------------------------------------------


def test_a_drain_without_a_forward_takes_the_next_one():
    c = make_coord(20)
    assert c.last_forward is None and c.next_forward == 0
    assert c.snapshot().last_forward is None
    c.take_checkpoint_ops()
    assert c.last_forward == 0 and c.next_forward == 1
    c.take_checkpoint_ops()
    assert c.last_forward == 1
    c.take_checkpoint_ops(forward=7)  # ids may skip
    assert (c.last_forward, c.next_forward) == (7, 8)
    c.take_checkpoint_ops()
    assert c.snapshot().last_forward == 8
    ok(c)


def test_an_explicit_first_forward():
    c = make_coord(20)
    c.take_checkpoint_ops(forward=41)
    assert c.last_forward == 41 and c.next_forward == 42


@pytest.mark.parametrize("bad", [8, 3, -1, True, "9", 9.0, []])
def test_a_bad_forward_id_is_refused_with_nothing_changed(bad):
    c = make_coord(20)
    seq = Seq(2)
    c.take_checkpoint_ops(forward=8)
    c.checkpoint(seq, 1, 101)
    info = assert_unchanged(c, lambda: c.take_checkpoint_ops(forward=bad), InvalidArgumentError)
    assert not isinstance(info.value, StaleBoundaryError)
    assert c.last_forward == 8
    stores, _ = c.take_checkpoint_ops(forward=9)  # the boundary is still there
    assert len(stores) == 1


def test_a_bad_slot_at_the_drain_leaves_the_forward_unset():
    c = make_coord(20)
    seq = Seq(2)
    c.checkpoint(seq, 1, 101)
    seq.state_slot = "two"
    assert_unchanged(c, lambda: c.take_checkpoint_ops(forward=3), InvalidArgumentError)
    assert c.last_forward is None


# ---------------------------------------------------------------------------------------
# Boundaries filed with their forward (D.13, D.1 steps 5, 6.1)
# ---------------------------------------------------------------------------------------


def test_a_boundary_filed_ahead_waits_for_the_drain_after_its_forward():
    """Overlap style: batch F is scheduled (its boundary filed, naming F) before the drain
    of F; the drain of F runs before forward F, so it keeps the boundary; the next drain
    copies the slot as forward F left it."""
    c = make_coord(20)
    seq = Seq(2)
    c.take_checkpoint_ops()  # forward 0
    c.checkpoint(seq, 1, 101, forward=1)
    assert c.snapshot().boundary_forwards == ((id(seq), 1),)
    ok(c)
    stores, _ = c.take_checkpoint_ops(forward=1)  # before forward 1: too early
    assert stores == ()
    assert c.snapshot().pending_boundaries == ((id(seq), 101),)
    assert c.checkpoints_dropped == 0 and c.checkpoints_kept == 0
    stores, _ = c.take_checkpoint_ops(forward=2)  # after forward 1: stored
    assert [op.src_slot for op in stores] == [2]
    assert c.checkpoints_kept == 1
    snap = c.snapshot()
    assert snap.pending_boundaries == () and snap.boundary_forwards == ()
    c.complete_previous_batch()
    assert c.contains(101)
    ok(c)


def test_a_boundary_filed_before_the_first_drain():
    c = make_coord(20)
    seq = Seq(2)
    c.checkpoint(seq, 1, 101, forward=0)
    assert c.take_checkpoint_ops() == ((), ())  # the drain of forward 0
    stores, _ = c.take_checkpoint_ops()  # after forward 0
    assert len(stores) == 1


def test_a_boundary_naming_the_forward_just_drained_is_stored_at_once():
    c = make_coord(20)
    seq = Seq(2)
    c.take_checkpoint_ops(forward=4)
    c.checkpoint(seq, 1, 101, forward=4)  # the synchronous loop, with ids
    stores, _ = c.take_checkpoint_ops(forward=5)
    assert len(stores) == 1


def test_filing_order_is_kept_across_drains():
    c = make_coord(20)
    a, b, d = Seq(1), Seq(2), Seq(3)
    c.take_checkpoint_ops()  # forward 0
    c.checkpoint(a, 1, 101, forward=1)
    c.checkpoint(b, 1, 202)  # synchronous: stored at the next drain
    c.checkpoint(d, 1, 303, forward=1)
    stores, _ = c.take_checkpoint_ops(forward=1)
    assert [op.src_slot for op in stores] == [2]
    snap = c.snapshot()
    assert snap.pending_boundaries == ((id(a), 101), (id(d), 303))
    assert snap.boundary_forwards == ((id(a), 1), (id(d), 1))
    stores, _ = c.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [1, 3]
    ok(c)


def test_a_stale_boundary_is_refused_with_nothing_changed():
    c = make_coord(20)
    seq = Seq(2)
    c.take_checkpoint_ops(forward=3)
    info = assert_unchanged(c, lambda: c.checkpoint(seq, 1, 101, forward=2), StaleBoundaryError)
    assert isinstance(info.value, InvalidArgumentError)
    # Checked before "ignored": no slot, or checkpoints that do not apply.
    assert_unchanged(c, lambda: c.checkpoint(Seq(-1), 1, 101, forward=2), StaleBoundaryError)
    assert_unchanged(c, lambda: c.checkpoint(Seq(2, has_per_req_cache=False), 1, 101,
                                             forward=0), StaleBoundaryError)
    c.checkpoint(seq, 1, 101, forward=3)  # the forward just drained: not stale
    # Re-filing the same boundary with a stale forward raises too, changing nothing.
    assert_unchanged(c, lambda: c.checkpoint(seq, 1, 101, forward=1), StaleBoundaryError)
    assert c.snapshot().boundary_forwards == ((id(seq), 3),)
    stores, _ = c.take_checkpoint_ops()
    assert len(stores) == 1


def test_a_boundary_whose_forward_was_skipped_is_dropped_and_counted():
    c = make_coord(20)
    seq = Seq(2)
    c.take_checkpoint_ops()  # forward 0
    c.checkpoint(seq, 1, 101, forward=1)
    stores, _ = c.take_checkpoint_ops(forward=2)  # forward 1 never ran
    assert stores == () and c.checkpoints_dropped == 0
    stores, _ = c.take_checkpoint_ops()  # after forward 2: the slot is forward 2's
    assert stores == ()
    assert c.checkpoints_dropped == 1 and c.checkpoints_kept == 0
    snap = c.snapshot()
    assert snap.pending_boundaries == () and snap.boundary_forwards == ()
    assert not c.store.contains_or_pending(101)
    ok(c)


def test_superseding_replaces_the_forward_and_refiling_keeps_the_first():
    c = make_coord(20)
    seq = Seq(2)
    c.checkpoint(seq, 1, 101, forward=1)
    c.checkpoint(seq, 1, 101, forward=5)  # G1: the same boundary, nothing changes
    assert c.snapshot().boundary_forwards == ((id(seq), 1),)
    c.checkpoint(seq, 2, 202, forward=2)  # a different h: dropped +1, its forward replaces
    assert c.checkpoints_dropped == 1
    assert c.snapshot().boundary_forwards == ((id(seq), 2),)
    c.checkpoint(seq, 3, 303)  # without a forward: the synchronous meaning
    assert c.checkpoints_dropped == 2
    snap = c.snapshot()
    assert snap.pending_boundaries == ((id(seq), 303),) and snap.boundary_forwards == ()
    ok(c)


def test_unindex_forget_and_clear_drop_the_forwards_with_their_boundaries():
    c = make_coord(20)
    a, b, d = Seq(1), Seq(2), Seq(3)
    c.checkpoint(a, 1, 101, forward=4)
    c.checkpoint(b, 1, 202, forward=4)
    c.checkpoint(d, 1, 303, forward=5)
    c.unindex(101)
    c.forget_pending(b)
    assert c.snapshot().boundary_forwards == ((id(d), 5),)
    ok(c)
    c.clear_index()
    assert c.snapshot().boundary_forwards == ()
    ok(c)


# ---------------------------------------------------------------------------------------
# Scratch stores published with a forward (D.13, D.1 step 6.3)
# ---------------------------------------------------------------------------------------


def test_a_scratch_store_published_with_a_forward_waits_for_it():
    scratch = SlotPool([90, 91])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=1)
    seq = Seq(0)
    c.take_checkpoint_ops()  # forward 0
    early = c.reserve_midstep(seq, [(16, 555)])
    c.publish_midstep(early, forward=1)
    now = c.reserve_midstep(seq, [(32, 666)])
    c.publish_midstep(now)  # the synchronous meaning
    assert c.snapshot().scratch_forwards == ((90, 1),)
    ok(c)
    # Before forward 1: 555 is not issuable; it keeps its place and takes no budget.
    stores, _ = c.take_checkpoint_ops(forward=1)
    assert [op.src_slot for op in stores] == [91]
    snap = c.snapshot()
    assert snap.scratch_queued == ((555, 90),) and snap.scratch_forwards == ((90, 1),)
    assert snap.scratch_issued == (91,)
    c.complete_previous_batch()
    stores, _ = c.take_checkpoint_ops(forward=2)  # after forward 1: issued
    assert [op.src_slot for op in stores] == [90]
    snap = c.snapshot()
    assert snap.scratch_queued == () and snap.scratch_forwards == ()
    c.complete_previous_batch()
    assert c.contains(555) and c.contains(666)
    assert scratch.free_slots == frozenset({90, 91})
    ok(c)


def test_a_scratch_store_is_never_stale():
    scratch = SlotPool([90])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=4)
    res = c.reserve_midstep(Seq(0), [(16, 555)])
    c.take_checkpoint_ops(forward=5)
    c.publish_midstep(res, forward=2)  # published late: issued by the next drain
    stores, _ = c.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [90]
    assert c.checkpoints_dropped == 0


def test_an_issuable_scratch_store_waits_for_budget_behind_one_that_is_not():
    scratch = SlotPool([90, 91, 92])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=0)
    seq = Seq(0)
    c.take_checkpoint_ops()  # forward 0
    a = c.reserve_midstep(seq, [(16, 555)])
    c.publish_midstep(a, forward=3)
    b = c.reserve_midstep(seq, [(32, 666), (48, 777)])
    c.publish_midstep(b)
    c.take_checkpoint_ops()  # no budget at all: everything stays, in order
    snap = c.snapshot()
    assert snap.scratch_queued == ((555, 90), (666, 91), (777, 92))
    assert snap.scratch_forwards == ((90, 3),)
    c.attach_midstep_scratch(scratch, 1)
    stores, _ = c.take_checkpoint_ops()  # forward 2: 555 still waits; 666 takes the budget
    assert [op.src_slot for op in stores] == [91]
    assert c.snapshot().scratch_queued == ((555, 90), (777, 92))
    ok(c)


def test_orphaning_a_scratch_store_drops_its_forward():
    scratch = SlotPool([90, 91])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=4)
    res = c.reserve_midstep(Seq(0), [(16, 555), (32, 666)])
    c.publish_midstep(res, forward=3)
    c.unindex(555)
    assert c.snapshot().scratch_forwards == ((91, 3),)
    ok(c)
    c.clear_index()
    assert c.snapshot().scratch_forwards == ()
    ok(c)


@pytest.mark.parametrize("bad", [-1, True, "1", 1.5])
def test_a_bad_publish_forward_changes_nothing(bad):
    scratch = SlotPool([90])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=4)
    res = c.reserve_midstep(Seq(0), [(16, 555)])
    assert_unchanged(c, lambda: c.publish_midstep(res, forward=bad), InvalidArgumentError)
    c.publish_midstep(res, forward=0)


# ---------------------------------------------------------------------------------------
# Completion tokens (D.13, D.1 step 1, B.3 rows 2, 15-17, 24)
# ---------------------------------------------------------------------------------------


def test_a_record_published_with_a_pending_token_is_ready_but_unsettled():
    c = make_coord(20, offload=FakeOffload())
    token = ManualCompletion()
    cid = publish(c, 101, token)
    snap = c.snapshot()
    assert snap.records[cid].phase == "READY" and snap.records[cid].settled is False
    assert snap.completions == ((cid,),)
    assert token.queries > 0
    ok(c)
    # Issued: restores (same-stream readers) may pin it at once.
    assert c.resumable_hit(Seq(3), 1, [101]) == 1
    assert c.begin_restore(101, 3) is True
    # Not settled: the CPU-tier gather defers it, a transfer save gets None.
    assert c.take_offload_stores(4) == []
    assert c.snapshot().offload_ready == (cid,)
    assert c.acquire_checkpoint_source(101) is None
    assert c.has_offload_pins() is False
    ok(c)
    token.set()
    (op, units), = c.take_offload_stores(4)  # settles first, then hands it out
    assert op.prefix_hash == 101 and settled(c, cid)
    assert c.snapshot().completions == ()
    ok(c)


def test_a_lease_waits_for_the_token():
    c = make_coord(20)
    token = ManualCompletion()
    cid = publish(c, 101, token)
    assert c.acquire_checkpoint_source(101) is None
    assert c.acquire_checkpoint_source(101, max_inflight=4) is None
    assert c.snapshot().completions == ((cid,),)
    token.set()
    lease = c.acquire_checkpoint_source(101)
    assert lease is not None and settled(c, cid)
    ok(c)


def test_tokens_may_report_done_in_any_order():
    c = make_coord(20)
    t1, t2 = ManualCompletion(), ManualCompletion()
    c1 = publish(c, 101, t1, slot=1)
    c2 = publish(c, 202, t2, slot=2)
    assert c.snapshot().completions == ((c1,), (c2,))
    assert c.settle_completions() == 0
    t2.set()
    assert c.settle_completions() == 1
    assert not settled(c, c1) and settled(c, c2)
    assert c.snapshot().completions == ((c1,),)
    ok(c)
    t1.set()
    assert c.store.settle_completions() == 1
    assert settled(c, c1) and c.snapshot().completions == ()
    ok(c)


def test_a_completion_settles_the_tokens_already_done():
    c = make_coord(20)
    t1 = ManualCompletion()
    c1 = publish(c, 101, t1, slot=1)
    t1.set()
    t2 = ManualCompletion()
    c2 = publish(c, 202, t2, slot=2)  # the settle inside this completion settles c1
    assert settled(c, c1) and not settled(c, c2)
    assert c.snapshot().completions == ((c2,),)
    ok(c)


def test_settle_with_wait_synchronizes_every_token():
    c = make_coord(20)
    tokens = [ManualCompletion() for _ in range(3)]
    cids = [publish(c, 101 + i, t, slot=i) for i, t in enumerate(tokens)]
    assert c.settle_completions(wait=True) == 3
    assert all(t.done for t in tokens)
    assert all(settled(c, cid) for cid in cids)
    assert c.snapshot().completions == ()
    assert c.settle_completions(wait=True) == 0
    ok(c)


def test_one_token_lists_every_record_of_its_batch_in_publish_order():
    c = make_coord(20)
    a, b = Seq(1), Seq(2)
    c.checkpoint(a, 1, 101)
    c.checkpoint(b, 1, 202)
    c.take_checkpoint_ops()
    token = ManualCompletion()
    c.complete_previous_batch(token)
    c1, c2 = c.store.lookup(101), c.store.lookup(202)
    assert c.snapshot().completions == ((c1, c2),)
    token.set()
    assert c.settle_completions() == 2


def test_a_token_that_raises_changes_nothing():
    c = make_coord(20, offload=FakeOffload())
    flaky = FlakyToken()
    cid = publish(c, 101, flaky, slot=1)
    flaky.fail = True
    c.checkpoint(Seq(2), 1, 202)
    c.take_checkpoint_ops()
    # Every outstanding token is asked before any change: nothing publishes, nothing settles.
    assert_unchanged(c, lambda: c.complete_previous_batch(), RuntimeError)
    assert_unchanged(c, lambda: c.complete_previous_batch(ManualCompletion(True)),
                     RuntimeError)
    assert_unchanged(c, lambda: c.settle_completions(), RuntimeError)
    assert_unchanged(c, lambda: c.settle_completions(wait=True), RuntimeError)
    assert_unchanged(c, lambda: c.take_offload_stores(4), RuntimeError)
    assert_unchanged(c, lambda: c.acquire_checkpoint_source(101), RuntimeError)
    assert_unchanged(c, lambda: c.store.complete_inflight(), RuntimeError)
    flaky.fail = False
    flaky.done = True
    c.complete_previous_batch()
    assert settled(c, cid) and settled(c, c.store.lookup(202))
    assert c.snapshot().completions == ()
    ok(c)


def test_a_new_token_that_raises_changes_nothing():
    c = make_coord(20)
    c.checkpoint(Seq(2), 1, 101)
    c.take_checkpoint_ops()
    flaky = FlakyToken()
    flaky.fail = True
    assert_unchanged(c, lambda: c.complete_previous_batch(flaky), RuntimeError)
    assert c.snapshot().inflight_stores != ()
    flaky.fail = False
    c.complete_previous_batch(flaky)
    assert c.snapshot().completions == ((c.store.lookup(101),),)


def test_a_completion_without_a_token_or_with_a_done_one_settles_at_once():
    c = make_coord(20)
    cid = publish(c, 101)  # no token: the engine vouches that issued is done
    assert settled(c, cid) and c.snapshot().completions == ()
    cid = publish(c, 202, ManualCompletion(done=True), slot=1)
    assert settled(c, cid) and c.snapshot().completions == ()
    assert c.acquire_checkpoint_source(202) is not None
    ok(c)


def test_a_completion_that_published_nothing_keeps_no_token():
    c = make_coord(20)
    c.complete_previous_batch(ManualCompletion())
    assert c.snapshot().completions == ()
    c.checkpoint(Seq(2), 1, 101)
    c.take_checkpoint_ops()
    c.unindex(101)  # the store is EVICTING: its completion releases it, publishes nothing
    c.complete_previous_batch(ManualCompletion())
    assert c.snapshot().completions == () and c.snapshot().records == {}
    assert c.outstanding()["completions"] == 0
    ok(c)


def test_a_bad_completion_changes_nothing():
    c = make_coord(20)
    c.checkpoint(Seq(2), 1, 101)
    c.take_checkpoint_ops()

    class QueryOnly:
        def query(self) -> bool:
            return True

    class NotCallable:
        query = True
        synchronize = True

    for bad in (object(), QueryOnly(), NotCallable(), 1, "done", True):
        assert_unchanged(c, lambda b=bad: c.complete_previous_batch(b), InvalidArgumentError)
        assert_unchanged(c, lambda b=bad: c.store.complete_inflight(b), InvalidArgumentError)
    c.complete_previous_batch(ManualCompletion())
    ok(c)


def test_an_unsettled_record_may_be_evicted_and_its_token_then_settles_nothing():
    c = make_coord(6)  # two images fill the pool
    token = ManualCompletion()
    cid = publish(c, 101, token)
    c.unindex(101)  # READY unpinned: released at once
    assert phase(c, cid) == "RELEASED"
    assert c.snapshot().completions == ((cid,),)  # the stale cid stays listed
    ok(c)
    token.set()
    assert c.settle_completions() == 0
    assert c.snapshot().completions == ()
    ok(c)


def test_an_evicting_record_is_settled_while_its_reader_holds_it():
    c = make_coord(20)
    token = ManualCompletion()
    cid = publish(c, 101, token)
    c.begin_restore(101, 3)
    c.unindex(101)  # pinned: EVICTING, still unsettled
    assert phase(c, cid) == "EVICTING" and not settled(c, cid)
    ok(c)
    token.set()
    assert c.settle_completions() == 1
    assert phase(c, cid) == "EVICTING" and settled(c, cid)
    ok(c)
    c.forget_pending(Seq(3))  # the last pin: released
    assert phase(c, cid) == "RELEASED"
    ok(c)


def test_a_store_unindexed_in_flight_stays_unsettled_and_is_released_unlisted():
    """C.26: a COPYING record unindexed (or cleared) in flight is EVICTING with its copy not
    run: it stays unsettled, no completion lists it, and its batch's completion releases it."""
    c = make_coord(20)
    c.checkpoint(Seq(0), 1, 101)
    (op,), _ = c.take_checkpoint_ops()
    cid = c.snapshot().pending[101]
    c.unindex(101)
    assert phase(c, cid) == "EVICTING" and not settled(c, cid)
    ok(c)
    token = ManualCompletion()
    c.complete_previous_batch(token)
    assert phase(c, cid) == "RELEASED" and c.snapshot().completions == ()
    ok(c)


def test_an_adopted_image_is_settled():
    c = make_coord(20)
    owner = ("req-1", 0)
    assert c.reserve_transfer_units(owner) is not None
    assert c.outstanding()["transfers"] == 1 and not c.is_idle()
    assert c.adopt_transfer_units(owner, 101) is True
    cid = c.store.lookup(101)
    assert settled(c, cid)
    assert c.snapshot().completions == ()
    assert c.acquire_checkpoint_source(101) is not None
    assert c.outstanding()["transfers"] == 0
    ok(c)


def test_a_store_records_settled_state_on_the_store_alone():
    s = make_store(20, sink=True)
    s.begin_store(101, 0)
    cid = s.snapshot().pending[101]
    assert s.snapshot().records[cid].settled is False  # COPYING
    token = ManualCompletion()
    s.complete_inflight(token)
    assert s.snapshot().completions == ((cid,),)
    assert s.outstanding()["completions"] == 1
    assert s.take_offload_stores(2) == []
    token.set()
    assert len(s.take_offload_stores(2)) == 1
    ok(s)


# ---------------------------------------------------------------------------------------
# Restore owners, outstanding(), is_idle() (G15, G17)
# ---------------------------------------------------------------------------------------


def test_cancelling_another_slot_keeps_a_restore_owner():
    """G15 knows a restore by its queued entry: cancelling the restore of another slot on the
    store directly leaves this one's owner in place."""
    c = make_coord(20)
    ready(c, 101)
    ready(c, 102)
    a = Seq(0)
    c.begin_restore(101, 1)
    c.begin_restore(102, 0, seq=a)
    c.store.cancel_queued_restore(1)
    assert c.snapshot().restore_owners == ((id(a), 0),)
    a.state_slot = -1
    c.forget_pending(a)
    assert c.snapshot().queued_restores == ()
    ok(c)


def test_restore_owners_follow_the_queue():
    c = make_coord(20)
    ready(c, 101)
    a, b = Seq(3), Seq(4)
    c.begin_restore(101, 3, seq=a)
    c.begin_restore(101, 4, seq=b)
    c.begin_restore(101, 5)  # nobody's
    assert c.snapshot().restore_owners == ((id(a), 3), (id(b), 4))
    ok(c)
    lease = c.suspend_queued_restore(3)  # suspended: forgotten
    assert c.snapshot().restore_owners == ((id(b), 4),)
    c.resume_suspended_restore(lease)  # back on the queue, nobody's
    assert c.snapshot().restore_owners == ((id(b), 4),)
    ok(c)
    assert c.begin_restore(101, 6, seq=a) is True  # a's earlier restore is no longer a's
    c.take_checkpoint_ops()
    assert c.snapshot().restore_owners == ()
    ok(c)


def test_a_refused_or_bad_restore_remembers_nothing():
    c = make_coord(20)
    seq = Seq(3)
    assert c.begin_restore(999, 3, seq=seq) is False  # not READY
    assert c.snapshot().restore_owners == ()
    ready(c, 101)
    assert_unchanged(c, lambda: c.begin_restore(101, 3, seq=object()), InvalidArgumentError)
    assert_unchanged(c, lambda: c.begin_restore(101, -1, seq=seq), InvalidArgumentError)
    assert_unchanged(c, lambda: c.begin_restore("101", 3, seq=seq), InvalidArgumentError)
    c.begin_restore(101, 3)
    assert_unchanged(c, lambda: c.begin_restore(101, 3, seq=seq), SlotBusyError)  # G4
    assert c.snapshot().restore_owners == ()


def test_outstanding_counts_everything_held_and_idle_ignores_completions():
    c = make_coord(20, offload=FakeOffload())
    token = ManualCompletion()
    cid = publish(c, 101, token)
    out = c.outstanding()
    assert out["completions"] == 1 and sum(out.values()) == 1
    assert c.is_idle() is True  # an image waiting for its token is not owed work
    token.set()
    c.take_offload_stores(4)
    assert c.outstanding()["offload_operations"] == 1 and not c.is_idle()
    (op,) = c.snapshot().offload_pins
    c.release_offload_store_source(op)
    assert c.outstanding()["offload_operations"] == 1  # source-released still counts
    c.settle_offload_store(op)
    c.begin_restore(101, 3)
    assert c.outstanding()["queued_restores"] == 1
    lease = c.suspend_queued_restore(3)
    assert c.outstanding()["suspended_restores"] == 1 and not c.is_idle()
    c.release_suspended_restore(lease)
    assert c.is_idle() and c.outstanding() == c.store.outstanding() | {
        "pending_boundaries": 0, "transfers": 0, "scratch_reserved": 0, "scratch_queued": 0,
        "scratch_issued": 0,
    }
    assert phase(c, cid) == "READY"
    ok(c)


# ---------------------------------------------------------------------------------------
# Bad inputs change nothing (G8 for the new arguments)
# ---------------------------------------------------------------------------------------


def _world() -> Any:
    scratch = SlotPool([90, 91])
    c = make_coord(40, offload=FakeOffload(), readable_midstep=True, scratch=scratch,
                   max_ops_per_batch=8)
    seq = Seq(2)
    c.take_checkpoint_ops(forward=3)
    c.checkpoint(seq, 1, 101, forward=4)
    res = c.reserve_midstep(Seq(0), [(16, 555)])
    c.publish_midstep(res, forward=4)
    publish(c, 202, ManualCompletion(), slot=5)
    ready(c, 303)
    c.begin_restore(303, 7, seq=Seq(7))
    return c, seq


BAD_CALLS = [
    ("blocks_negative", lambda c, s: c.checkpoint(s, -1, 616), InvalidArgumentError),
    ("blocks_zero", lambda c, s: c.checkpoint(s, 0, 616), BoundaryRangeError),
    ("blocks_past_computed", lambda c, s: c.checkpoint(s, 3, 616, computed_blocks=2),
     BoundaryRangeError),
    ("computed_negative", lambda c, s: c.checkpoint(s, 1, 616, computed_blocks=-1),
     InvalidArgumentError),
    ("computed_str", lambda c, s: c.checkpoint(s, 1, 616, computed_blocks="2"),
     InvalidArgumentError),
    ("computed_bool", lambda c, s: c.checkpoint(s, 1, 616, computed_blocks=True),
     InvalidArgumentError),
    ("forward_negative", lambda c, s: c.checkpoint(s, 1, 616, forward=-1),
     InvalidArgumentError),
    ("forward_bool", lambda c, s: c.checkpoint(s, 1, 616, forward=True), InvalidArgumentError),
    ("forward_str", lambda c, s: c.checkpoint(s, 1, 616, forward="4"), InvalidArgumentError),
    ("forward_stale", lambda c, s: c.checkpoint(s, 1, 616, forward=2), StaleBoundaryError),
    ("forward_bad_h", lambda c, s: c.checkpoint(s, 1, "616", forward=4), InvalidArgumentError),
    ("forward_bad_seq", lambda c, s: c.checkpoint(object(), 1, 616, forward=4),
     InvalidArgumentError),
    ("drain_forward_equal", lambda c, s: c.take_checkpoint_ops(forward=3),
     InvalidArgumentError),
    ("drain_forward_lower", lambda c, s: c.take_checkpoint_ops(forward=0),
     InvalidArgumentError),
    ("drain_forward_str", lambda c, s: c.take_checkpoint_ops(forward="4"),
     InvalidArgumentError),
    ("complete_bad_token", lambda c, s: c.complete_previous_batch(object()),
     InvalidArgumentError),
    ("store_complete_bad_token", lambda c, s: c.store.complete_inflight(42),
     InvalidArgumentError),
    ("restore_bad_seq", lambda c, s: c.begin_restore(303, 8, seq=object()),
     InvalidArgumentError),
    ("restore_into_scratch", lambda c, s: c.begin_restore(303, 90, seq=s), SlotBusyError),
    ("restore_busy", lambda c, s: c.begin_restore(303, 7), SlotBusyError),
    ("publish_bad_forward", lambda c, s: c.publish_midstep([], forward=-2), InvalidArgumentError),
]


@pytest.mark.parametrize(("call", "exc"), [case[1:] for case in BAD_CALLS],
                         ids=[case[0] for case in BAD_CALLS])
def test_bad_input_raises_and_changes_nothing(call, exc):
    c, seq = _world()
    ok(c)
    assert_unchanged(c, lambda: call(c, seq), exc)
