"""SPEC section G: one test per deliberate difference from ATOM's module. Each asserts the
project's behaviour, and each would fail on the module's behaviour as the G table
describes it (the comment above each assertion says what the module would do)."""

from __future__ import annotations

import pytest
from conftest import (
    FakeClock,
    FakeOffload,
    Seq,
    assert_unchanged,
    make_coord,
    make_store,
    phase,
    pin,
    ready,
    record,
)

from pagedstate.models.reference import PageUnitCheckpointStore, SlotPool, UnitPool
from pagedstate.spec import (
    BoundaryRangeError,
    IllegalTransitionError,
    InvalidArgumentError,
    LeaseReusedError,
    PartialReleaseError,
    SlotBusyError,
    StateStoreOperationId,
    StoreOwnedUnitsError,
    WrongOwnerError,
    check_invariants,
)
from pagedstate.spec import tables as T
from pagedstate.spec.types import TRANSFER_OWNER


def test_g1_refiling_the_same_boundary_is_idempotent():
    c = make_coord(20)
    seq = Seq(2)
    c.checkpoint(seq, 1, 101)
    c.checkpoint(seq, 1, 101)
    c.checkpoint(seq, 1, 101)
    assert c.checkpoints_dropped == 0  # ATOM: 2
    assert c.snapshot().pending_boundaries == ((id(seq), 101),)
    c.checkpoint(seq, 2, 202)  # a different h still supersedes, one drop per entry
    assert c.checkpoints_dropped == 1
    assert c.snapshot().pending_boundaries == ((id(seq), 202),)
    stores, _ = c.take_checkpoint_ops()
    assert len(stores) == 1 and c.checkpoints_kept == 1


def test_g2_a_fresh_ready_record_enters_the_lru_at_the_hot_end():
    s = make_store(9)
    c1 = ready(s, 101)
    c2 = ready(s, 202)
    c3 = ready(s, 303)
    assert s.snapshot().lru == (c1, c2, c3)  # newest last, i.e. evicted last
    assert s.ensure_free_units(1) is True
    assert phase(s, c1) == "RELEASED"  # the docstring's "cold end" would have spent c3
    assert phase(s, c3) == "READY"
    s.begin_restore(202, 4)  # a restore refreshes recency too
    assert s.snapshot().lru == (c3, c2)


def test_g3_a_suspended_restore_lease_is_single_use():
    s = make_store(20)
    cid = ready(s, 101)
    s.begin_restore(101, 4)
    lease = s.suspend_queued_restore(4)
    s.resume_suspended_restore(lease)
    assert pin(s, cid) == 1
    # ATOM: a second resume queues a second gather on one pin.
    assert_unchanged(s, lambda: s.resume_suspended_restore(lease), LeaseReusedError)
    # ATOM: a release after resume spends the queued restore's pin.
    assert_unchanged(s, lambda: s.release_suspended_restore(lease), LeaseReusedError)
    s.cancel_queued_restore(4)
    assert pin(s, cid) == 0

    s.begin_restore(101, 4)
    lease = s.suspend_queued_restore(4)
    s.release_suspended_restore(lease)
    assert pin(s, cid) == 0
    assert_unchanged(s, lambda: s.release_suspended_restore(lease), LeaseReusedError)
    assert_unchanged(s, lambda: s.resume_suspended_restore(lease), LeaseReusedError)


def test_g4_one_restore_per_destination_slot():
    s = make_store(20)
    cid = ready(s, 101)
    ready(s, 202)
    s.begin_restore(101, 4)
    # ATOM: accepted; only a later suspend notices.
    assert_unchanged(s, lambda: s.begin_restore(202, 4), SlotBusyError)
    assert_unchanged(s, lambda: s.begin_restore(101, 4), SlotBusyError)
    s.take_restore_ops()  # in flight: still busy
    assert_unchanged(s, lambda: s.begin_restore(202, 4), SlotBusyError)
    s.complete_inflight()
    s.begin_restore(202, 4)  # free again after completion
    lease = s.suspend_queued_restore(4)
    assert_unchanged(s, lambda: s.begin_restore(101, 4), SlotBusyError)  # suspended: busy
    s.release_suspended_restore(lease)
    assert s.begin_restore(101, 4) is not None
    assert pin(s, cid) == 1


def test_g5_orphaned_scratch_stores_are_dropped_at_once():
    """Reading of "counted as orphaned": once per ``unindex`` / ``clear_index`` call that
    dropped something, as SPEC D counts ``orphaned`` per call, not per dropped entry."""
    scratch = SlotPool([90, 91, 92])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=8)
    seq = Seq(0)
    res = c.reserve_midstep(seq, [(16, 555), (32, 666), (48, 777)])
    c.publish_midstep(res)
    assert scratch.free_slots == frozenset()
    c.unindex(555)
    # ATOM: the scratch store for 555 stays queued and is begun at the next drain.
    assert [h for h, _ in c.snapshot().scratch_queued] == [666, 777]
    assert 90 in scratch.free_slots
    assert c.checkpoints_orphaned == 1
    c.clear_index()
    assert c.snapshot().scratch_queued == ()
    assert scratch.free_slots == frozenset({90, 91, 92})
    assert c.checkpoints_orphaned == 2
    assert c.take_checkpoint_ops() == ((), ())


def test_g6_every_generation_bump_is_a_real_change():
    s = make_store(6)
    g = s.generation
    assert s.unindex(999) is False
    assert s.generation == g  # ATOM: +1 on a no-op unindex
    s.clear()  # nothing READY
    assert s.generation == g
    s.begin_store(101, 0)
    s.unindex(101)  # a COPYING record: the READY set did not change
    s.complete_inflight()
    assert s.generation == g
    ready(s, 101)
    ready(s, 202)
    g = s.generation
    assert s.begin_store(303, 0) is not None  # evicts 101
    assert s.evictions == 1
    assert s.generation == g + 1  # ATOM: +2 per eviction
    g = s.generation
    s.complete_inflight()
    assert s.generation == g + 1
    assert s.changed_since(g) == {303}
    assert s.changed_since(g - 1) == {101, 303}


def test_g7_forfeits_fail_closed_with_bounded_memory():
    clock = FakeClock()
    s = make_store(20, sink=True, clock=clock, forfeit_bound=2)
    ops = []
    for h in (11, 12, 13, 14):
        ready(s, h)
        (op, _), = s.take_offload_stores(4)
        ops.append(op)
        clock.advance(10)
        assert s.reclaim_stale_offload_pins(5) == 1
    snap = s.snapshot()
    assert len(snap.forfeited) == 2
    assert ops[0] not in snap.forfeited
    # ATOM: forgotten past the FIFO, so a late report would be trusted.
    assert all(s.was_reclaimed(op) for op in ops)
    assert snap.forfeit_watermark >= ops[1].generation
    # An operation at or below the watermark that nobody reclaimed is untrusted too,
    # unless it is a live pin.
    assert s.was_reclaimed(StateStoreOperationId(99, 1)) is True
    ready(s, 15)
    (live, _), = s.take_offload_stores(4)
    assert s.was_reclaimed(live) is False


def test_g8_a_call_that_raises_changes_nothing_adopt_consumes_no_identity():
    c = make_coord(6)
    owner = ("req-1", 0)
    units = c.reserve_transfer_units(owner)
    store = c.store.raw
    next_id = store._next_checkpoint_id
    # ATOM: the id is taken before rekey_units fails.
    assert_unchanged(
        c, lambda: store.adopt_units(units, ("someone-else", 0), 101), WrongOwnerError
    )
    # Beyond G8: only the coordinator may adopt its own transfer reservation.
    assert_unchanged(
        c, lambda: store.adopt_units(units, (TRANSFER_OWNER, owner), 101), StoreOwnedUnitsError
    )

    def as_coordinator() -> None:
        store._transfer_grant = True  # what adopt_transfer_units does around its call
        try:
            store.adopt_units(tuple(reversed(units)), (TRANSFER_OWNER, owner), 101)
        finally:
            store._transfer_grant = False

    info = assert_unchanged(c, as_coordinator, WrongOwnerError)
    assert not isinstance(info.value, StoreOwnedUnitsError)  # the rekey's own check
    assert store._next_checkpoint_id == next_id
    assert c.adopt_transfer_units(owner, 101) is True
    assert c.store.lookup(101) == next_id


def test_g9_release_units_must_name_the_whole_reservation():
    s = make_store(10)
    pool = s.pool
    units = pool.reserve_units(3, ("live-kv", 0))
    # ATOM: a prefix passes validation and leaves the rest tagged.
    assert_unchanged(s, lambda: pool.release_units(units[:2], ("live-kv", 0)),
                     PartialReleaseError)
    assert_unchanged(s, lambda: pool.release_units(units[:1], ("live-kv", 0)),
                     PartialReleaseError)
    assert_unchanged(s, lambda: pool.release_units(units[::-1], ("live-kv", 0)),
                     WrongOwnerError)
    pool.release_units(units, ("live-kv", 0))
    assert pool.num_free == 10


def test_g10_units_released_from_a_checkpoint_or_transfer_are_dirty():
    c = make_coord(9)
    cid = ready(c, 101)
    ckpt_units = record(c, cid).unit_ids
    owner = ("req-1", 0)
    xfer_units = c.reserve_transfer_units(owner)
    kv = c.pool.reserve_units(3, ("live-kv", 0))
    assert c.pool.dirty_units() == frozenset()
    c.unindex(101)
    c.release_transfer_units(owner)
    c.pool.release_units(kv, ("live-kv", 0))
    # ATOM: nothing is tracked; stale fp32 state is handed out as KV.
    assert c.pool.dirty_units() == frozenset(ckpt_units) | frozenset(xfer_units)
    assert not any(c.pool.is_dirty(u) for u in kv)
    c.pool.mark_clean(ckpt_units)
    assert c.pool.dirty_units() == frozenset(xfer_units)


def test_g11_copying_records_take_no_pins():
    s = make_store(20)
    s.begin_store(101, 0)
    cid = s.snapshot().pending[101]
    # ATOM: nothing stops a pin on a COPYING record; the completion release relies on it.
    info = assert_unchanged(s, lambda: s.raw._pin(cid, "restore"), IllegalTransitionError)
    assert (info.value.machine, info.value.phase, info.value.event) == (
        "record", "COPYING", "pin_restore",
    )
    for kind in ("offload", "lease"):
        assert_unchanged(s, lambda k=kind: s.raw._pin(cid, k), IllegalTransitionError)
    s.unindex(101)  # EVICTING and in flight: no pins either
    assert_unchanged(s, lambda: s.raw._pin(cid, "restore"), IllegalTransitionError)
    # The release on completion goes through the table and checks pin_count == 0.
    assert T.RECORD.has("EVICTING", "publish", "unpinned")
    assert not T.RECORD.has("EVICTING", "publish", "pinned")
    assert not T.RECORD.has("EVICTING", "publish")
    s.complete_inflight()
    assert phase(s, cid) == "RELEASED"


def test_g11_completion_of_a_pinned_evicting_store_raises_rather_than_frees():
    """Forced by hand (a pin on an in-flight EVICTING record cannot be taken through the
    table): completing it finds no row, instead of freeing units a reader still uses."""
    s = PageUnitCheckpointStore(UnitPool(20), make_store(20).raw.spec)
    s.begin_store(101, 0)
    cid = s._pending_by_hash[101]
    s.unindex(101)
    s.records[cid].pin_count = 1  # bypass
    try:
        s.complete_inflight()
    except IllegalTransitionError as e:
        assert (e.phase, e.event, e.guard) == ("EVICTING", "publish", "pinned")
    else:
        raise AssertionError("a pinned EVICTING record was released on completion")
    assert cid in s.records


def test_g12_a_restore_may_not_target_a_slot_lent_as_scratch():
    scratch = SlotPool([4, 5])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=8)
    cid = ready(c, 101)
    seq = Seq(0)
    res = c.reserve_midstep(seq, [(16, 555)])
    assert res == [(4, 16, 555)]
    # ATOM: accepted; the drain then pairs a gather into slot 4 with the copy out of it.
    assert_unchanged(c, lambda: c.begin_restore(101, 4), SlotBusyError)  # reserved
    c.publish_midstep(res)
    assert_unchanged(c, lambda: c.begin_restore(101, 4, seq=Seq(4)), SlotBusyError)  # queued
    stores, _ = c.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [4]
    assert_unchanged(c, lambda: c.begin_restore(101, 4), SlotBusyError)  # issued
    c.complete_previous_batch()  # the scratch slot is back in the pool
    assert c.begin_restore(101, 4) is True
    assert pin(c, cid) == 1
    assert check_invariants(c.snapshot()) == []


def test_g12_scratch_may_not_be_lent_over_a_restore_destination():
    scratch = SlotPool([4, 5])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=8)
    ready(c, 101)
    seq = Seq(0)
    c.begin_restore(101, 5)  # queued into 5; scratch pops 4 first, then 5
    before = c.checkpoint_fates()
    # ATOM: lends slot 5 as scratch; the next drain writes and reads it in one launch.
    assert_unchanged(c, lambda: c.reserve_midstep(seq, [(16, 555), (32, 666)]), SlotBusyError)
    assert scratch.free_slots == frozenset({4, 5})  # both popped slots went back
    assert c.checkpoint_fates() == before  # no drop counted
    c.take_checkpoint_ops()  # in flight: still the restore's
    assert_unchanged(c, lambda: c.reserve_midstep(seq, [(16, 555), (32, 666)]), SlotBusyError)
    c.complete_previous_batch()
    c.begin_restore(101, 5)
    lease = c.suspend_queued_restore(5)  # suspended: still the restore's
    assert_unchanged(c, lambda: c.reserve_midstep(seq, [(16, 555), (32, 666)]), SlotBusyError)
    c.release_suspended_restore(lease)
    assert c.reserve_midstep(seq, [(16, 555), (32, 666)]) == [(4, 16, 555), (5, 32, 666)]
    assert check_invariants(c.snapshot()) == []


def test_g12_a_suspended_restore_is_not_resumed_into_a_scratch_slot():
    """Reachable only past the coordinator's guard (a restore queued on the store itself
    over a reserved scratch slot): the resume is refused first, with nothing changed."""
    scratch = SlotPool([4])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=8)
    ready(c, 101)
    res = c.reserve_midstep(Seq(0), [(16, 555)])
    store = c.store.raw
    store.begin_restore(101, 4)  # bypasses the coordinator's G12 check
    lease = store.suspend_queued_restore(4)
    # ATOM (and the store alone): the restore goes back on the queue into scratch slot 4.
    assert_unchanged(c, lambda: c.raw.resume_suspended_restore(lease), SlotBusyError,
                     invariants=False)
    store.release_suspended_restore(lease)
    c.cancel_midstep(res)
    assert check_invariants(c.snapshot()) == []


def test_g13_a_boundary_names_computed_state():
    c = make_coord(20)
    seq = Seq(2)
    # ATOM: a boundary of 0 blocks is filed and stored.
    info = assert_unchanged(c, lambda: c.checkpoint(seq, 0, 101), BoundaryRangeError)
    assert isinstance(info.value, InvalidArgumentError)
    # Checked before "ignored": a sequence with no slot, or a disabled coordinator, too.
    assert_unchanged(c, lambda: c.checkpoint(Seq(-1), 0, 101), BoundaryRangeError)
    off = make_coord(20, enabled=False)
    assert_unchanged(off, lambda: off.checkpoint(seq, 0, 101), BoundaryRangeError)
    assert_unchanged(c, lambda: c.checkpoint(seq, 5, 101, computed_blocks=4),
                     BoundaryRangeError)
    assert c.snapshot().pending_boundaries == ()
    c.checkpoint(seq, 4, 101, computed_blocks=4)  # at the computed end: filed
    assert c.snapshot().pending_boundaries == ((id(seq), 101),)
    stores, _ = c.take_checkpoint_ops()
    assert len(stores) == 1 and c.checkpoints_kept == 1


def test_g14_a_disabled_coordinator_fails_closed():
    c = make_coord(20, enabled=False)
    hashes = [11, 12, 13]
    # ATOM: 3, so a request with per-request state resumes with a slot nothing restored.
    assert c.resumable_hit(Seq(1), 3, hashes) == 0
    assert c.resumable_hit(Seq(1), 3, hashes, assume_checkpointed=True) == 0
    assert c.resumable_hit(Seq(1, has_per_req_cache=False), 3, hashes) == 3
    # Argument checks still come first.
    assert_unchanged(c, lambda: c.resumable_hit(Seq(1), 4, hashes), InvalidArgumentError)


def test_g15_forget_pending_cancels_the_restore_filed_for_the_sequence():
    c = make_coord(20)
    cid = ready(c, 101)
    seq = Seq(4)
    assert c.begin_restore(101, 4, seq=seq) is True
    assert c.snapshot().restore_owners == ((id(seq), 4),)
    seq.state_slot = -1  # the engine reset the slot before forgetting the request
    c.forget_pending(seq)
    # ATOM: looks at the current slot (-1) and leaves the restore into slot 4 queued.
    assert c.snapshot().queued_restores == ()
    assert pin(c, cid) == 0
    assert c.snapshot().restore_owners == ()


def test_g15_forget_pending_leaves_another_sequences_restore_alone():
    c = make_coord(20)
    cid = ready(c, 101)
    owner, stale = Seq(4), Seq(4)  # stale still names slot 4, which owner now holds
    c.begin_restore(101, 4, seq=owner)
    c.forget_pending(stale)
    # ATOM: cancels the queued restore into slot 4, which owner's request relies on.
    assert c.snapshot().queued_restores == ((cid, 4),)
    # One remembered restore per sequence.
    assert_unchanged(c, lambda: c.begin_restore(101, 5, seq=owner), SlotBusyError)
    # Without seq=, forget_pending still cancels by the sequence's slot (as ATOM).
    c.forget_pending(owner)
    assert c.snapshot().queued_restores == ()
    c.begin_restore(101, 6)
    c.forget_pending(Seq(6))
    assert c.snapshot().queued_restores == ()
    # A drain takes the restore: it is nobody's any more, and a new one may be filed.
    c.begin_restore(101, 4, seq=owner)
    c.take_checkpoint_ops()
    assert c.snapshot().restore_owners == ()
    c.complete_previous_batch()
    assert c.begin_restore(101, 5, seq=owner) is True
    assert check_invariants(c.snapshot()) == []


def test_g16_errors_name_the_pools_range():
    s = make_store(20)
    pool = s.pool
    units = pool.reserve_units(2, ("live-kv", 0))
    # ATOM: a WrongOwnerError about a unit that "is not held", not a bad argument.
    for bad in ([20], [units[0], units[1], 25], [-1]):
        info = assert_unchanged(
            s, lambda b=bad: pool.release_units(b, ("live-kv", 0)), InvalidArgumentError
        )
        assert not isinstance(info.value, WrongOwnerError)
        assert "20" in str(info.value)  # the range [0, 20)
    info = assert_unchanged(
        s, lambda: pool.rekey_units([units[0], 99], ("live-kv", 0), ("other", 0)),
        InvalidArgumentError,
    )
    assert "20" in str(info.value)
    pool.release_units(units, ("live-kv", 0))
    assert pool.num_free == 20


def test_g17_an_idle_query_without_a_snapshot():
    scratch = SlotPool([90])
    c = make_coord(20, readable_midstep=True, scratch=scratch, max_ops_per_batch=8)
    keys = {
        "queued_restores", "inflight_restores", "suspended_restores", "inflight_stores",
        "offload_operations", "completions", "pending_boundaries", "transfers",
        "scratch_reserved", "scratch_queued", "scratch_issued",
    }
    # ATOM: no such query; an engine would build and walk a snapshot every pass.
    assert set(c.outstanding()) == keys and not any(c.outstanding().values())
    assert c.is_idle() is True
    assert set(c.store.outstanding()) == keys - {
        "pending_boundaries", "transfers", "scratch_reserved", "scratch_queued",
        "scratch_issued",
    }
    ready(c, 101)
    c.checkpoint(Seq(2), 1, 202)
    assert c.outstanding()["pending_boundaries"] == 1 and c.is_idle() is False
    c.begin_restore(101, 3)
    res = c.reserve_midstep(Seq(2), [(16, 303)])
    assert c.outstanding()["scratch_reserved"] == 1
    c.publish_midstep(res)
    assert c.outstanding()["scratch_queued"] == 1
    c.take_checkpoint_ops()
    out = c.outstanding()
    assert (out["inflight_stores"], out["inflight_restores"], out["scratch_issued"]) == (2, 1, 1)
    assert out["pending_boundaries"] == 0 and out["queued_restores"] == 0
    c.complete_previous_batch()
    assert c.is_idle() is True



def test_attach_offload_refuses_what_the_constructor_refuses():
    """``attach_offload`` checks its index as the constructor checks ``offload``: a value
    without ``could_serve`` is refused with nothing changed (it failed later, inside
    ``resumable_hit``, with an AttributeError)."""
    c = make_coord(20)
    for bad, sink in ((5, True), (object(), True), (FakeOffload(), "yes")):
        assert_unchanged(c, lambda b=bad, k=sink: c.attach_offload(b, sink=k), InvalidArgumentError)
    assert c.offload is None


@pytest.mark.parametrize("slots", [None, 5, ["a"], [True], [-1], [1, 1]])
def test_a_slot_pool_refuses_bad_slots(slots):
    with pytest.raises(InvalidArgumentError):
        SlotPool(slots)
