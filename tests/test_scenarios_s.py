"""SPEC S1-S16: failures that shipped in public serving engines, restated as call
sequences on the reference store and coordinator.

Every store and coordinator is wrapped in ``conftest.Checked``: each call is followed by
the SPEC C invariants (unit conservation among them) and the step invariants.

S10 (descriptors built from stale indices) has no test here: validating ops against the
pool range, layout id, byte count, unit count, duplicates and overlap is the GPU
executor's job (SPEC E.5), not the control plane's. Each op the model emits carries its own
slot and unit ids; that half is asserted by S1 and S7 (ops name the record's units).
"""

from __future__ import annotations

from conftest import (
    FakeClock,
    FakeOffload,
    Seq,
    assert_unchanged,
    make_coord,
    make_store,
    owner_units,
    phase,
    pin,
    ready,
    record,
)

from pagedstate.spec import LeaseReusedError, PinUnderflowError, WrongOwnerError
from pagedstate.spec.types import CHECKPOINT_OWNER

U = 3


# -- publishing an image before its bytes exist -----------------------------------------


def test_s01_hit_on_a_state_the_same_step_is_computing():
    s = make_store(20)
    assert s.begin_store(555, 1) is not None
    assert s.begin_restore(555, 2) is None
    assert s.lookup(555) == -1
    s.take_restore_ops()
    assert s.lookup(555) == -1
    s.complete_inflight()
    assert s.lookup(555) >= 0
    assert s.begin_restore(555, 2) is not None

    # The same through the coordinator: B's admission in the pass where A filed h.
    c = make_coord(20)
    a, b = Seq(1), Seq(2)
    c.checkpoint(a, 1, 555)
    assert c.resumable_hit(b, 1, [555]) == 0
    c.take_checkpoint_ops()  # the batch carrying A's store is built, not yet issued
    assert c.resumable_hit(b, 1, [555]) == 0
    assert not c.begin_restore(555, b.state_slot)
    c.complete_previous_batch()
    assert c.resumable_hit(b, 1, [555]) == 1


def test_s02_writer_aborted_after_its_hash_was_filed():
    # Aborted before the drain: forget_pending leaves nothing to store.
    c = make_coord(20)
    seq = Seq(1)
    c.checkpoint(seq, 4, 777)
    c.forget_pending(seq)
    assert c.take_checkpoint_ops() == ((), ())
    c.complete_previous_batch()
    assert not c.store.contains_or_pending(777)

    # Aborted after the drain began the store: unindex makes it unrestorable; the COPYING
    # record's units stay owned until the in-flight batch drains, then return.
    c = make_coord(20)
    seq = Seq(1)
    c.checkpoint(seq, 4, 777)
    (op,), _ = c.take_checkpoint_ops()
    cid = c.snapshot().pending[777]
    c.forget_pending(seq)
    c.unindex(777)
    assert c.store.begin_restore(777, 3) is None
    assert c.resumable_hit(Seq(3), 1, [777]) == 0
    assert phase(c, cid) == "EVICTING"
    assert owner_units(c.pool, (CHECKPOINT_OWNER, cid)) == op.unit_ids
    c.complete_previous_batch()
    assert phase(c, cid) == "RELEASED"
    assert c.pool.num_free == 20
    assert not c.contains(777)
    again = c.store.begin_store(777, 2)
    assert again is not None
    assert c.snapshot().pending[777] > cid  # a fresh record, a fresh identity


def test_s03_preemption_after_eager_registration():
    c = make_coord(20)
    seq = Seq(1)
    c.checkpoint(seq, 2, 888)
    c.forget_pending(seq)  # preempted in the same pass, before its forward
    assert c.snapshot().pending_boundaries == ()
    stores, _ = c.take_checkpoint_ops()
    assert stores == ()
    c.complete_previous_batch()
    assert not c.contains(888)
    assert c.snapshot().records == {}
    assert c.checkpoints_kept == 0


# -- storing the wrong state under a hash -----------------------------------------------


def test_s04_slot_filed_under_a_later_boundary():
    c = make_coord(20)
    seq = Seq(3)
    c.checkpoint(seq, 1, 101)
    c.complete_previous_batch()  # an empty pass: no drain
    c.checkpoint(seq, 2, 202)  # the slot now holds the state at 202
    stores, _ = c.take_checkpoint_ops()
    assert len(stores) == 1 and stores[0].src_slot == 3
    assert c.checkpoints_dropped == 1 and c.checkpoints_kept == 1
    c.complete_previous_batch()
    assert c.contains(202)
    assert not c.store.contains_or_pending(101)


def test_s05_resume_point_never_at_the_prompts_end():
    """Reading: the coordinator never returns more than the KV ``hit`` it is given, and for
    a prompt of n blocks ending on a block boundary the engine's KV hit is at most n - 1
    (the last token is recomputed for logits). ``resumable_hit`` has no prompt-length input,
    so the cap itself is the BlockManager's; here every boundary, the n-th included, has a
    READY checkpoint, and the answer is still n - 1."""
    c = make_coord(40)
    hashes = [11, 12, 13, 14]  # a prompt of n = 4 blocks, ending exactly on block 4
    for i, h in enumerate(hashes):
        ready(c, h, slot=i)
    seq = Seq(7)
    n = len(hashes)
    assert c.resumable_hit(seq, n - 1, hashes) == n - 1
    for hit in range(n):
        assert c.resumable_hit(seq, hit, hashes) <= hit
    # With the n-th boundary's checkpoint gone and the (n-1)-th kept, still never n.
    c.unindex(13)
    assert c.resumable_hit(seq, n - 1, hashes) == 2


# -- reading or writing units someone else still uses -----------------------------------


def test_s06_offload_reads_only_completed_images():
    s = make_store(20, sink=True)
    assert s.begin_store(11, 0) is not None
    assert s.snapshot().offload_ready == ()  # a COPYING image is never nominated
    assert s.take_offload_stores(4) == []
    assert s.acquire_checkpoint_source(11) is None  # nor leased
    s.complete_inflight()
    taken = s.take_offload_stores(4)
    assert [op.prefix_hash for op, _ in taken] == [11]
    assert phase(s, s.lookup(11)) == "READY"


def test_s07_units_stay_out_of_the_pool_while_read():
    # A restore reader: held until complete_inflight after the batch that carried it.
    s = make_store(6)
    cid = ready(s, 101)
    units = record(s, cid).unit_ids
    s.begin_restore(101, 4)
    s.unindex(101)
    assert s.ensure_free_units(6) is False  # a pinned EVICTING record is not spendable
    assert s.pool.reserve_units(4, ("live-kv", 0)) is None
    s.take_restore_ops()
    assert s.pool.reserve_units(4, ("live-kv", 0)) is None
    s.complete_inflight()
    got = s.pool.reserve_units(6, ("live-kv", 0))
    assert got is not None and set(units) <= set(got)

    # An offload reader: held until the source release.
    s = make_store(6, sink=True)
    cid = ready(s, 101)
    (op, units), = s.take_offload_stores(4)
    assert s.ensure_free_units(6) is False  # not evictable while pinned
    s.unindex(101)
    assert all(s.pool.owner_of(u) is not None for u in units)
    s.release_offload_store_source(op)
    assert all(s.pool.owner_of(u) is None for u in units)
    s.settle_offload_store(op)

    # A lease: held until its release.
    s = make_store(6)
    cid = ready(s, 101)
    op, units = s.acquire_checkpoint_source(101)
    s.unindex(101)
    assert phase(s, cid) == "EVICTING"
    assert s.pool.reserve_units(4, ("live-kv", 0)) is None
    s.release_offload_store_source(op)
    assert phase(s, cid) == "RELEASED"
    assert s.pool.reserve_units(6, ("live-kv", 0)) is not None
    s.settle_offload_store(op)


def test_s08_stale_state_bytes_are_marked_dirty():
    s = make_store(6)
    cid = ready(s, 101)
    units = record(s, cid).unit_ids
    assert not any(s.pool.is_dirty(u) for u in range(6))  # never held state
    s.unindex(101)
    assert all(s.pool.is_dirty(u) for u in units)
    assert s.pool.dirty_units() == frozenset(units)
    # Reused as KV, the unit is still dirty until the scrub reports it clean.
    kv = s.pool.reserve_units(6, ("live-kv", 0))
    assert all(s.pool.is_dirty(u) for u in units)
    s.pool.mark_clean(units)
    assert not any(s.pool.is_dirty(u) for u in kv)
    # Releasing live KV does not dirty anything.
    s.pool.release_units(kv, ("live-kv", 0))
    assert s.pool.dirty_units() == frozenset()


def test_s09_a_hit_needs_a_queued_restore_into_its_slot():
    c = make_coord(20)
    ready(c, 101)
    fresh = Seq(5)
    # A claimed hit on 202, which has no image: the restore is refused and there is no
    # evidence for slot 5, so the engine must refuse the hit and recompute.
    assert c.begin_restore(202, fresh.state_slot) is False
    assert c.restore_queued_for(fresh.state_slot) is False
    assert c.begin_restore(101, fresh.state_slot) is True
    assert c.restore_queued_for(fresh.state_slot) is True
    assert c.restore_queued_for(6) is False
    c.forget_pending(fresh)
    assert c.restore_queued_for(fresh.state_slot) is False


# -- leaks on failure paths -------------------------------------------------------------


def test_s11_abort_between_a_hit_and_its_batch():
    c = make_coord(20)
    cid = ready(c, 101)
    seq = Seq(4)
    assert c.begin_restore(101, seq.state_slot)
    c.unindex(101)  # meanwhile its KV prefix went
    assert phase(c, cid) == "EVICTING"
    c.forget_pending(seq)  # the abort
    assert phase(c, cid) == "RELEASED"
    assert c.pool.num_free == 20
    assert c.take_checkpoint_ops() == ((), ())

    c2 = make_coord(20)
    cid = ready(c2, 101)
    c2.store.begin_restore(101, 4)
    c2.store.cancel_queued_restore(4)
    assert pin(c2, cid) == 0 and phase(c2, cid) == "READY"


def test_s12_cpu_tier_load_fails_after_reserving_units():
    c = make_coord(20)
    cid = ready(c, 101)
    seq = Seq(4)
    c.begin_restore(101, seq.state_slot)  # the older local restore
    owner = ("req-9", 1)
    units = c.reserve_transfer_units(owner)
    assert units is not None
    assert c.restore_queued_for(4) is True
    lease = c.suspend_queued_restore(seq.state_slot)
    assert c.restore_queued_for(4) is False  # truthful: nothing will write slot 4 now
    # The transfer fails.
    c.resume_suspended_restore(lease)
    assert c.restore_queued_for(4) is True
    c.release_transfer_units(owner)
    assert all(c.pool.owner_of(u) is None for u in units)
    assert c.snapshot().transfers == {}
    assert not c.contains(999)  # nothing published under the loaded hash
    assert [cid] == list(c.snapshot().records)
    _, restores = c.take_checkpoint_ops()
    assert [r.dst_slot for r in restores] == [4]


def test_s13_every_image_pinned_when_a_store_needs_units():
    c = make_coord(9)
    ready(c, 101)
    ready(c, 202)
    ready(c, 303)
    c.begin_restore(101, 4)  # restore pin
    c.attach_offload(FakeOffload())
    c.store._queue_offload_store(c.store.lookup(202))  # nominate 202 after the fact
    assert [op.prefix_hash for op, _ in c.take_offload_stores(4)] == [202]  # offload pin
    c.acquire_checkpoint_source(303)  # lease
    assert c.pool.num_free == 0
    seq = Seq(7)
    c.checkpoint(seq, 1, 404)
    stores, _ = c.take_checkpoint_ops()
    assert stores == ()
    assert c.checkpoints_dropped == 1
    assert c.store.evictions == 0
    assert all(c.contains(h) for h in (101, 202, 303))
    assert c.store.begin_store(505, 1) is None


# -- pin accounting ---------------------------------------------------------------------


def test_s14_double_unpin():
    s = make_store(20, sink=True)
    cid = ready(s, 101)
    (op, _), = s.take_offload_stores(4)
    s.release_offload_store_source(op)
    s.release_offload_store_source(op)  # keyed by operation: a no-op
    assert pin(s, cid) == 0

    s.begin_restore(101, 4)
    lease = s.suspend_queued_restore(4)
    s.release_suspended_restore(lease)
    assert pin(s, cid) == 0
    assert_unchanged(s, lambda: s.release_suspended_restore(lease), LeaseReusedError)

    # A real decrement below zero raises and changes nothing.
    info = assert_unchanged(s, lambda: s.raw._unpin(cid, "restore"), PinUnderflowError)
    assert isinstance(info.value, AssertionError)


def test_s15_pins_that_are_never_released():
    clock = FakeClock()
    s = make_store(20, sink=True, clock=clock, forfeit_bound=2)
    cid = ready(s, 101)
    (op, units), = s.take_offload_stores(4)
    s.unindex(101)  # only the lost report holds the units now
    assert phase(s, cid) == "EVICTING"
    clock.advance(30)
    assert s.reclaim_stale_offload_pins(10) == 1
    assert phase(s, cid) == "RELEASED"
    assert all(s.pool.owner_of(u) is None for u in units)
    assert s.was_reclaimed(op)
    # However late: many newer forfeits push it out of the exact memory (G7) ...
    for h in range(200, 210):
        ready(s, h)
        s.take_offload_stores(4)
        clock.advance(30)
        assert s.reclaim_stale_offload_pins(10) == 1
    assert op not in s.snapshot().forfeited
    assert s.was_reclaimed(op)  # ... and it is still untrusted
    s.settle_offload_store(op)
    assert s.was_reclaimed(op)


def test_s16_a_release_naming_another_owners_unit():
    s = make_store(20)
    cid = ready(s, 101)
    mine = s.pool.reserve_units(2, ("live-kv", 0))
    theirs = record(s, cid).unit_ids
    info = assert_unchanged(
        s, lambda: s.pool.release_units([mine[0], theirs[1]], ("live-kv", 0)), WrongOwnerError
    )
    assert isinstance(info.value, AssertionError)
    assert all(s.pool.owner_of(u) is not None for u in (*mine, *theirs))
    assert_unchanged(s, lambda: s.pool.release_units(theirs, ("live-kv", 0)), WrongOwnerError)
    s.pool.release_units(mine, ("live-kv", 0))
    assert s.pool.num_free == 17
