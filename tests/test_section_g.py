"""SPEC section G: one test per deliberate difference from ATOM's module. Each asserts the
project's behaviour, and each would fail on the module's behaviour as the G table
describes it (the comment above each assertion says what the module would do)."""

from __future__ import annotations

from conftest import (
    FakeClock,
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
    IllegalTransitionError,
    LeaseReusedError,
    PartialReleaseError,
    SlotBusyError,
    StateStoreOperationId,
    StoreOwnedUnitsError,
    WrongOwnerError,
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
