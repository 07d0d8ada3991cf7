"""SPEC G8 on the reference model: a public call of the pool, store or coordinator that is
given bad input raises its specific error and leaves ``snapshot()`` exactly as it was.

Every case runs against one non-trivial world (built fresh per test): READY, COPYING and
EVICTING records, a queued, an in-flight and a suspended restore, a spent suspended-restore
lease, a live offload pin, a forfeited offload op, an explicit lease, a deferred nomination
backlog, a transfer reservation, a pending boundary, a queued and a reserved midstep
scratch slot, live-KV units and dirty free units.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from conftest import FakeClock, FakeOffload, Seq, assert_invariants, assert_unchanged, ready, spec

from pagedstate.models.reference import (
    PagedStateCheckpointCoordinator,
    PageUnitCheckpointStore,
    SlotPool,
    UnitPool,
)
from pagedstate.spec import (
    DuplicateUnitError,
    InvalidArgumentError,
    LeaseReusedError,
    PartialReleaseError,
    SlotBusyError,
    StaleReservationError,
    StateStoreOperationId,
    StoreOwnedUnitsError,
    UnknownOperationError,
    WrongOwnerError,
)
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

LIVE = ("live-kv", 0)
XFER = ("req-1", 0)


class Hostile:
    """An owner whose ``__hash__`` raises (SPEC A.3 asks for hashable owners)."""

    def __hash__(self) -> int:
        raise RuntimeError("hostile __hash__")

    def __repr__(self) -> str:
        return "Hostile()"


class NoSlot:
    """A sequence object without ``state_slot``."""

    has_per_req_cache = True


class NoCacheFlag:
    """A sequence object without ``has_per_req_cache``."""

    state_slot = 3


def build_world() -> SimpleNamespace:
    clock = FakeClock()
    scratch = SlotPool([90, 91, 92, 93])
    c = PagedStateCheckpointCoordinator(
        UnitPool(40), spec(10, 25), True, offload=FakeOffload(), readable_midstep=True,
        clock=clock,
    )
    c.attach_midstep_scratch(scratch, 8)
    s, pool = c.store, c.pool
    cid = {h: ready(s, h, slot=1) for h in (111, 101, 202, 303, 404, 909)}
    s.unindex(111)  # a spent nomination
    lease303, _ = s.acquire_checkpoint_source(303)
    (forfeit, _), = s.take_offload_stores(2)  # 111's nomination is spent; 101 handed out
    clock.advance(10)
    assert s.reclaim_stale_offload_pins(5) == 1
    (live_op, _), = s.take_offload_stores(2)  # 202
    s.begin_restore(404, 12)
    c.take_checkpoint_ops()  # the restore into 12 is in flight
    store_op = s.begin_store(505, 5)  # COPYING
    s.begin_restore(101, 4)  # queued
    s.begin_restore(202, 6)
    lease = s.suspend_queued_restore(6)  # suspended
    s.begin_restore(303, 14)
    spent = s.suspend_queued_restore(14)
    s.release_suspended_restore(spent)  # a used-up lease
    s.begin_restore(909, 10)
    c.unindex(909)  # EVICTING, pinned by its queued restore
    xfer_units = c.reserve_transfer_units(XFER)
    seq = Seq(7)
    c.checkpoint(seq, 1, 606)
    queued = c.reserve_midstep(Seq(8), [(16, 707)])
    c.publish_midstep(queued)
    reserved = c.reserve_midstep(Seq(8), [(32, 808)])
    live = pool.reserve_units(2, LIVE)
    c.reserve_transfer_units(("req-0", 0))
    c.release_transfer_units(("req-0", 0))  # free and dirty
    w = SimpleNamespace(
        c=c, s=s, pool=pool, scratch=scratch, clock=clock, cid=cid, seq=seq,
        lease=lease, spent=spent, lease303=lease303, forfeit=forfeit, live_op=live_op,
        store_op=store_op, xfer_units=xfer_units, reserved=reserved, live=live,
    )
    check_world(w)
    return w


def check_world(w: SimpleNamespace) -> None:
    snap = w.c.snapshot()
    phases = {r.phase for r in snap.records.values()}
    assert phases == {"READY", "COPYING", "EVICTING"}
    assert snap.queued_restores and snap.inflight_restores and snap.suspended
    assert snap.offload_pins and snap.forfeited and snap.offload_ready
    assert snap.transfers and snap.pending_boundaries
    assert snap.scratch_queued and snap.scratch_reserved
    assert snap.dirty & snap.free
    # Fields a refused call must not move either (SPEC G8).
    assert snap.next_lease_id > 0 and snap.changes and snap.scratch_free
    assert snap.changes[-1][0] == snap.generation
    assert_invariants(w.c)


@pytest.fixture
def w() -> SimpleNamespace:
    return build_world()


def units(w, h):
    return w.s.records[w.cid[h]].unit_ids


def as_coordinator(w, *args):
    """``w.s.adopt_units(*args)`` as the coordinator's ``adopt_transfer_units`` makes it (the
    only caller allowed to adopt a transfer reservation): the pool's checks behind it."""
    w.s._transfer_grant = True
    try:
        return w.s.adopt_units(*args)
    finally:
        w.s._transfer_grant = False


def forged(lease, **changes):
    return attrs.evolve(lease, **changes)


# (id, call on the world, expected error class)

def _first_free(pool: Any) -> int:
    """The lowest free unit, through the public ``owner_of`` (either store's pool)."""
    return min(u for u in range(pool.num_units) if pool.owner_of(u) is None)

CASES = [
    # -- pool -----------------------------------------------------------------------------
    ("reserve_negative", lambda w: w.pool.reserve_units(-1, LIVE), InvalidArgumentError),
    ("reserve_str_count", lambda w: w.pool.reserve_units("2", LIVE), InvalidArgumentError),
    ("reserve_float_count", lambda w: w.pool.reserve_units(2.0, LIVE), InvalidArgumentError),
    ("reserve_bool_count", lambda w: w.pool.reserve_units(True, LIVE), InvalidArgumentError),
    ("reserve_none_owner", lambda w: w.pool.reserve_units(1, None), InvalidArgumentError),
    ("release_not_a_list", lambda w: w.pool.release_units("01", LIVE), InvalidArgumentError),
    ("release_set", lambda w: w.pool.release_units(set(w.live), LIVE), InvalidArgumentError),
    ("release_duplicate",
     lambda w: w.pool.release_units([w.live[0], w.live[0]], LIVE), DuplicateUnitError),
    ("release_none_owner", lambda w: w.pool.release_units(w.live, None), InvalidArgumentError),
    ("release_wrong_owner",
     lambda w: w.pool.release_units(w.live, ("live-kv", 1)), WrongOwnerError),
    ("release_partial", lambda w: w.pool.release_units(w.live[:1], LIVE), PartialReleaseError),
    ("release_wrong_order",
     lambda w: w.pool.release_units(list(reversed(w.live)), LIVE), WrongOwnerError),
    ("release_negative_id", lambda w: w.pool.release_units([-1], LIVE), InvalidArgumentError),
    ("release_bool_id", lambda w: w.pool.release_units([True], LIVE), InvalidArgumentError),
    ("release_mixed_owners",
     lambda w: w.pool.release_units([w.live[0], units(w, 101)[1]], LIVE), WrongOwnerError),
    ("release_other_record",
     lambda w: w.pool.release_units(units(w, 101), (CHECKPOINT_OWNER, w.cid[202])),
     StoreOwnedUnitsError),
    ("release_free_units",
     lambda w: w.pool.release_units([_first_free(w.pool)], LIVE), WrongOwnerError),
    ("rekey_none_new_owner",
     lambda w: w.pool.rekey_units(w.live, LIVE, None), InvalidArgumentError),
    ("rekey_none_old_owner",
     lambda w: w.pool.rekey_units(w.live, None, ("x", 0)), InvalidArgumentError),
    ("rekey_duplicate",
     lambda w: w.pool.rekey_units([w.live[0]] * 2, LIVE, ("x", 0)), DuplicateUnitError),
    ("rekey_wrong_owner",
     lambda w: w.pool.rekey_units(w.live, ("live-kv", 9), ("x", 0)), WrongOwnerError),
    ("rekey_partial",
     lambda w: w.pool.rekey_units(w.live[:1], LIVE, ("x", 0)), PartialReleaseError),
    ("rekey_onto_a_holder", lambda w: w.pool.rekey_units(w.live, LIVE, LIVE), InvalidArgumentError),
    # queries: bad input raises instead of answering quietly
    ("has_free_str", lambda w: w.pool.has_free("1"), InvalidArgumentError),
    ("has_free_negative", lambda w: w.pool.has_free(-1), InvalidArgumentError),
    ("owner_of_str", lambda w: w.pool.owner_of("0"), InvalidArgumentError),
    ("owner_of_out_of_range", lambda w: w.pool.owner_of(40), InvalidArgumentError),
    ("is_dirty_negative", lambda w: w.pool.is_dirty(-1), InvalidArgumentError),
    ("is_dirty_bool", lambda w: w.pool.is_dirty(True), InvalidArgumentError),
    ("mark_clean_not_iterable", lambda w: w.pool.mark_clean(5), InvalidArgumentError),
    # owners (SPEC A.3): unhashable or hostile owners change nothing
    ("reserve_unhashable_owner",
     lambda w: w.pool.reserve_units(1, ["live-kv", 5]), InvalidArgumentError),
    ("reserve_hostile_owner", lambda w: w.pool.reserve_units(1, Hostile()), InvalidArgumentError),
    ("release_hostile_owner",
     lambda w: w.pool.release_units(w.live, Hostile()), InvalidArgumentError),
    ("rekey_hostile_new_owner",
     lambda w: w.pool.rekey_units(w.live, LIVE, Hostile()), InvalidArgumentError),
    # store owners (SPEC A.3): only the store reserves, releases or retags them
    ("release_a_records_units",
     lambda w: w.pool.release_units(units(w, 101), (CHECKPOINT_OWNER, w.cid[101])),
     StoreOwnedUnitsError),
    ("release_an_evicting_records_units",
     lambda w: w.pool.release_units(units(w, 909), (CHECKPOINT_OWNER, w.cid[909])),
     StoreOwnedUnitsError),
    ("release_a_transfers_units",
     lambda w: w.pool.release_units(w.xfer_units, (TRANSFER_OWNER, XFER)), StoreOwnedUnitsError),
    ("rekey_a_records_units_away",
     lambda w: w.pool.rekey_units(units(w, 303), (CHECKPOINT_OWNER, w.cid[303]), ("x", 0)),
     StoreOwnedUnitsError),
    ("rekey_onto_a_checkpoint_owner",
     lambda w: w.pool.rekey_units(w.live, LIVE, (CHECKPOINT_OWNER, 999)), StoreOwnedUnitsError),
    ("rekey_onto_a_transfer_owner",
     lambda w: w.pool.rekey_units(w.live, LIVE, (TRANSFER_OWNER, ("req-9", 0))),
     StoreOwnedUnitsError),
    ("reserve_a_checkpoint_owner",
     lambda w: w.pool.reserve_units(1, (CHECKPOINT_OWNER, 999)), StoreOwnedUnitsError),
    ("reserve_a_transfer_owner",
     lambda w: w.pool.reserve_units(3, (TRANSFER_OWNER, ("req-9", 0))), StoreOwnedUnitsError),
    ("mark_clean_out_of_range",
     lambda w: w.pool.mark_clean([*sorted(w.pool.dirty_units()), 40]), InvalidArgumentError),
    ("mark_clean_negative",
     lambda w: w.pool.mark_clean([*sorted(w.pool.dirty_units()), -1]), InvalidArgumentError),
    # -- store: stores and restores -------------------------------------------------------
    ("begin_store_str_hash", lambda w: w.s.begin_store("123", 0), InvalidArgumentError),
    ("begin_store_float_hash", lambda w: w.s.begin_store(123.0, 0), InvalidArgumentError),
    ("begin_store_negative_slot", lambda w: w.s.begin_store(123, -1), InvalidArgumentError),
    ("begin_store_bool_slot", lambda w: w.s.begin_store(123, True), InvalidArgumentError),
    ("begin_restore_str_hash", lambda w: w.s.begin_restore("303", 20), InvalidArgumentError),
    ("begin_restore_negative_slot",
     lambda w: w.s.begin_restore(303, -2), InvalidArgumentError),
    ("begin_restore_queued_slot", lambda w: w.s.begin_restore(303, 4), SlotBusyError),
    ("begin_restore_inflight_slot", lambda w: w.s.begin_restore(303, 12), SlotBusyError),
    ("begin_restore_suspended_slot", lambda w: w.s.begin_restore(303, 6), SlotBusyError),
    ("cancel_str_slot", lambda w: w.s.cancel_queued_restore("4"), InvalidArgumentError),
    ("suspend_str_slot", lambda w: w.s.suspend_queued_restore("4"), InvalidArgumentError),
    ("resume_not_a_lease", lambda w: w.s.resume_suspended_restore("lease"),
     InvalidArgumentError),
    ("resume_spent_lease", lambda w: w.s.resume_suspended_restore(w.spent), LeaseReusedError),
    ("release_spent_lease",
     lambda w: w.s.release_suspended_restore(w.spent), LeaseReusedError),
    ("resume_unknown_lease",
     lambda w: w.s.resume_suspended_restore(forged(w.lease, lease_id=999)),
     UnknownOperationError),
    ("release_unknown_lease",
     lambda w: w.s.release_suspended_restore(forged(w.lease, lease_id=-1)),
     UnknownOperationError),
    ("resume_forged_lease",
     lambda w: w.s.resume_suspended_restore(forged(w.lease, checkpoint_id=w.cid[101])),
     UnknownOperationError),
    ("release_forged_lease",
     lambda w: w.s.release_suspended_restore(
         forged(w.lease, op=w.lease.op.evolve(dst_slot=30))),
     UnknownOperationError),
    ("restore_queued_for_str", lambda w: w.s.restore_queued_for("4"), InvalidArgumentError),
    ("resume_lease_id_str",
     lambda w: w.s.resume_suspended_restore(forged(w.lease, lease_id="0")), InvalidArgumentError),
    ("release_lease_id_list",
     lambda w: w.s.release_suspended_restore(forged(w.lease, lease_id=[0])),
     InvalidArgumentError),
    ("lookup_str", lambda w: w.s.lookup("101"), InvalidArgumentError),
    ("lookup_none", lambda w: w.s.lookup(None), InvalidArgumentError),
    ("contains_str", lambda w: w.s.contains("101"), InvalidArgumentError),
    ("contains_float", lambda w: w.s.contains(101.0), InvalidArgumentError),
    ("contains_or_pending_list",
     lambda w: w.s.contains_or_pending([505]), InvalidArgumentError),
    ("contains_or_pending_bool", lambda w: w.s.contains_or_pending(True), InvalidArgumentError),
    # -- store: index, room, adoption ----------------------------------------------------
    ("unindex_str", lambda w: w.s.unindex("101"), InvalidArgumentError),
    ("has_available_negative", lambda w: w.s.has_available_units(-1), InvalidArgumentError),
    ("has_available_bad_protected",
     lambda w: w.s.has_available_units(1, protected_hash="101"), InvalidArgumentError),
    ("ensure_free_negative", lambda w: w.s.ensure_free_units(-1), InvalidArgumentError),
    ("ensure_free_str", lambda w: w.s.ensure_free_units("3"), InvalidArgumentError),
    ("changed_since_str", lambda w: w.s.changed_since("0"), InvalidArgumentError),
    ("adopt_wrong_count",
     lambda w: as_coordinator(w, w.xfer_units[:2], (TRANSFER_OWNER, XFER), 123),
     InvalidArgumentError),
    ("adopt_bad_hash",
     lambda w: as_coordinator(w, w.xfer_units, (TRANSFER_OWNER, XFER), "123"),
     InvalidArgumentError),
    ("adopt_wrong_owner",
     lambda w: as_coordinator(w, w.xfer_units, (TRANSFER_OWNER, ("req-1", 1)), 123),
     WrongOwnerError),
    ("adopt_wrong_order",
     lambda w: as_coordinator(w, tuple(reversed(w.xfer_units)), (TRANSFER_OWNER, XFER), 123),
     WrongOwnerError),
    ("adopt_duplicate_ids",
     lambda w: as_coordinator(w, (w.xfer_units[0],) * 3, (TRANSFER_OWNER, XFER), 123),
     DuplicateUnitError),
    ("adopt_dedup_wrong_owner",  # 101 is READY: the release path validates too
     lambda w: as_coordinator(w, w.xfer_units, (TRANSFER_OWNER, ("req-1", 1)), 101),
     WrongOwnerError),
    ("adopt_record_units",
     lambda w: as_coordinator(w, units(w, 303), (TRANSFER_OWNER, XFER), 123), WrongOwnerError),
    # The coordinator's reservation, adopted behind its back: a checkpoint would own units
    # the coordinator still names (and would release or adopt again).
    ("adopt_the_coordinators_reservation",
     lambda w: w.s.adopt_units(w.xfer_units, (TRANSFER_OWNER, XFER), 123),
     StoreOwnedUnitsError),
    ("adopt_dedup_the_coordinators_reservation",  # 101 is READY: would release them
     lambda w: w.s.adopt_units(w.xfer_units, (TRANSFER_OWNER, XFER), 101),
     StoreOwnedUnitsError),
    ("adopt_a_records_own_units",  # would retag 303's units to a new record
     lambda w: w.s.adopt_units(units(w, 303), (CHECKPOINT_OWNER, w.cid[303]), 123),
     StoreOwnedUnitsError),
    ("adopt_dedup_a_records_own_units",  # 101 is READY: would free 303's units
     lambda w: w.s.adopt_units(units(w, 303), (CHECKPOINT_OWNER, w.cid[303]), 101),
     StoreOwnedUnitsError),
    # -- store: offload and leases --------------------------------------------------------
    ("take_offload_negative", lambda w: w.s.take_offload_stores(-1), InvalidArgumentError),
    ("take_offload_str", lambda w: w.s.take_offload_stores("4"), InvalidArgumentError),
    ("acquire_str_hash", lambda w: w.s.acquire_checkpoint_source("404"), InvalidArgumentError),
    ("acquire_negative_limit",
     lambda w: w.s.acquire_checkpoint_source(404, max_inflight=-1), InvalidArgumentError),
    ("acquire_bool_limit",
     lambda w: w.s.acquire_checkpoint_source(404, max_inflight=True), InvalidArgumentError),
    ("release_source_not_an_op",
     lambda w: w.s.release_offload_store_source((202, 2)), InvalidArgumentError),
    ("settle_not_an_op", lambda w: w.s.settle_offload_store("op"), InvalidArgumentError),
    ("settle_none", lambda w: w.s.settle_offload_store(None), InvalidArgumentError),
    ("was_reclaimed_not_an_op", lambda w: w.s.was_reclaimed((101, 1)), InvalidArgumentError),
    ("was_reclaimed_str_fields",
     lambda w: w.s.was_reclaimed(StateStoreOperationId("101", "1")), InvalidArgumentError),
    ("settle_str_generation",
     lambda w: w.s.settle_offload_store(StateStoreOperationId(202, "2")), InvalidArgumentError),
    ("reclaim_str", lambda w: w.s.reclaim_stale_offload_pins("5"), InvalidArgumentError),
    ("reclaim_nan",
     lambda w: w.s.reclaim_stale_offload_pins(math.nan), InvalidArgumentError),
    ("reclaim_bool", lambda w: w.s.reclaim_stale_offload_pins(True), InvalidArgumentError),
    ("reclaim_none", lambda w: w.s.reclaim_stale_offload_pins(None), InvalidArgumentError),
    # -- coordinator ----------------------------------------------------------------------
    ("checkpoint_negative_blocks",
     lambda w: w.c.checkpoint(w.seq, -1, 606), InvalidArgumentError),
    ("checkpoint_bool_blocks", lambda w: w.c.checkpoint(w.seq, True, 616), InvalidArgumentError),
    ("checkpoint_str_hash", lambda w: w.c.checkpoint(w.seq, 2, "616"), InvalidArgumentError),
    ("checkpoint_new_seq_bad_hash",
     lambda w: w.c.checkpoint(Seq(20), 2, None), InvalidArgumentError),
    ("reserve_midstep_short_pair",
     lambda w: w.c.reserve_midstep(Seq(8), [(48,)]), InvalidArgumentError),
    ("reserve_midstep_str_pos",
     lambda w: w.c.reserve_midstep(Seq(8), [("48", 818)]), InvalidArgumentError),
    ("reserve_midstep_triple",
     lambda w: w.c.reserve_midstep(Seq(8), [(48, 818, 1)]), InvalidArgumentError),
    ("reserve_midstep_good_then_bad",
     lambda w: w.c.reserve_midstep(Seq(8), [(48, 818), (64, "828")]), InvalidArgumentError),
    ("publish_unknown_slot",
     lambda w: w.c.publish_midstep([(93, 48, 818)]), UnknownOperationError),
    ("publish_queued_slot",
     lambda w: w.c.publish_midstep([(90, 16, 707)]), UnknownOperationError),
    ("publish_duplicate",
     lambda w: w.c.publish_midstep(w.reserved * 2), UnknownOperationError),
    ("publish_good_then_unknown",
     lambda w: w.c.publish_midstep([*w.reserved, (93, 48, 818)]), UnknownOperationError),
    ("publish_not_a_triple",
     lambda w: w.c.publish_midstep([*w.reserved, (93, 48)]), InvalidArgumentError),
    ("cancel_unknown_slot",
     lambda w: w.c.cancel_midstep([(92, 48, 818)]), UnknownOperationError),
    ("cancel_good_then_unknown",
     lambda w: w.c.cancel_midstep([*w.reserved, (92, 48, 818)]), UnknownOperationError),
    ("cancel_not_a_triple", lambda w: w.c.cancel_midstep(["slot"]), InvalidArgumentError),
    ("attach_scratch_negative",
     lambda w: w.c.attach_midstep_scratch(SlotPool([95]), -1), InvalidArgumentError),
    ("resumable_hit_negative",
     lambda w: w.c.resumable_hit(w.seq, -1, [101]), InvalidArgumentError),
    ("resumable_hit_too_long",
     lambda w: w.c.resumable_hit(w.seq, 3, [101, 202]), InvalidArgumentError),
    ("reserve_transfer_none", lambda w: w.c.reserve_transfer_units(None), InvalidArgumentError),
    ("reserve_transfer_unhashable",
     lambda w: w.c.reserve_transfer_units(["req", 2]), InvalidArgumentError),
    ("reserve_transfer_hostile", lambda w: w.c.reserve_transfer_units(Hostile()),
     InvalidArgumentError),
    ("release_transfer_unhashable",
     lambda w: w.c.release_transfer_units(["req", 1]), InvalidArgumentError),
    ("release_transfer_hostile",
     lambda w: w.c.release_transfer_units(Hostile()), InvalidArgumentError),
    ("release_transfer_none", lambda w: w.c.release_transfer_units(None), InvalidArgumentError),
    ("adopt_transfer_unhashable",
     lambda w: w.c.adopt_transfer_units(["req", 1], 123), InvalidArgumentError),
    ("adopt_transfer_none", lambda w: w.c.adopt_transfer_units(None, 123), InvalidArgumentError),
    # sequences: an object that is not a sequence changes nothing
    ("checkpoint_no_slot", lambda w: w.c.checkpoint(NoSlot(), 1, 616), InvalidArgumentError),
    ("checkpoint_no_cache_flag",
     lambda w: w.c.checkpoint(NoCacheFlag(), 1, 616), InvalidArgumentError),
    ("forget_no_cache_flag", lambda w: w.c.forget_pending(NoCacheFlag()), InvalidArgumentError),
    ("forget_none", lambda w: w.c.forget_pending(None), InvalidArgumentError),
    ("reserve_midstep_no_slot",
     lambda w: w.c.reserve_midstep(NoSlot(), [(48, 818)]), InvalidArgumentError),
    ("reserve_midstep_no_cache_flag",
     lambda w: w.c.reserve_midstep(NoCacheFlag(), [(48, 818)]), InvalidArgumentError),
    ("reserve_midstep_not_a_list",
     lambda w: w.c.reserve_midstep(Seq(8), 5), InvalidArgumentError),
    ("applies_no_cache_flag", lambda w: w.c.applies(NoCacheFlag()), InvalidArgumentError),
    ("applies_no_slot", lambda w: w.c.applies(NoSlot()), InvalidArgumentError),
    ("resumable_hit_no_cache_flag",
     lambda w: w.c.resumable_hit(NoCacheFlag(), 1, [101]), InvalidArgumentError),
    ("resumable_hit_str_hash",
     lambda w: w.c.resumable_hit(w.seq, 1, ["101"]), InvalidArgumentError),
    ("resumable_hit_str_hashes",
     lambda w: w.c.resumable_hit(w.seq, 0, "abc"), InvalidArgumentError),
    ("attach_scratch_not_a_pool",
     lambda w: w.c.attach_midstep_scratch(None, 4), InvalidArgumentError),
    ("coord_contains_str", lambda w: w.c.contains("101"), InvalidArgumentError),
    ("coord_was_reclaimed_bad_fields",
     lambda w: w.c.was_reclaimed(StateStoreOperationId(101, None)), InvalidArgumentError),
    # stale midstep reservations (SPEC D.1 step 5)
    ("publish_stale_reservation",
     lambda w: w.c.publish_midstep([(w.reserved[0][0], 16, 707)]), StaleReservationError),
    ("cancel_stale_reservation",
     lambda w: w.c.cancel_midstep([(w.reserved[0][0], 32, 999)]), StaleReservationError),
    ("publish_wrong_position",
     lambda w: w.c.publish_midstep([(w.reserved[0][0], 48, 808)]), StaleReservationError),
    ("publish_not_a_list", lambda w: w.c.publish_midstep(5), InvalidArgumentError),
    ("publish_str_hash",
     lambda w: w.c.publish_midstep([(w.reserved[0][0], 32, "808")]), InvalidArgumentError),
    ("adopt_transfer_str_hash",
     lambda w: w.c.adopt_transfer_units(XFER, "123"), InvalidArgumentError),
    ("coord_unindex_str", lambda w: w.c.unindex("101"), InvalidArgumentError),
    ("coord_begin_restore_busy", lambda w: w.c.begin_restore(303, 4), SlotBusyError),
    ("coord_begin_restore_bad_slot",
     lambda w: w.c.begin_restore(303, -1), InvalidArgumentError),
    ("coord_resume_spent",
     lambda w: w.c.resume_suspended_restore(w.spent), LeaseReusedError),
    ("coord_release_spent",
     lambda w: w.c.release_suspended_restore(w.spent), LeaseReusedError),
    ("coord_restore_queued_for_str",
     lambda w: w.c.restore_queued_for("4"), InvalidArgumentError),
    ("coord_resume_forged",
     lambda w: w.c.resume_suspended_restore(forged(w.lease, lease_id=77)),
     UnknownOperationError),
    ("coord_suspend_str", lambda w: w.c.suspend_queued_restore("6"), InvalidArgumentError),
    ("coord_take_offload_negative",
     lambda w: w.c.take_offload_stores(-1), InvalidArgumentError),
    ("coord_acquire_bad_limit",
     lambda w: w.c.acquire_checkpoint_source(404, max_inflight="1"), InvalidArgumentError),
    ("coord_settle_not_an_op",
     lambda w: w.c.settle_offload_store((303, 1)), InvalidArgumentError),
    ("coord_release_source_not_an_op",
     lambda w: w.c.release_offload_store_source(None), InvalidArgumentError),
    ("coord_reclaim_str",
     lambda w: w.c.reclaim_stale_offload_pins("1"), InvalidArgumentError),
    ("coord_was_reclaimed_not_an_op",
     lambda w: w.c.was_reclaimed("op"), InvalidArgumentError),
    ("coord_has_available_negative",
     lambda w: w.c.has_available_units(-3), InvalidArgumentError),
    ("coord_ensure_free_negative",
     lambda w: w.c.ensure_free_units(-3), InvalidArgumentError),
]


@pytest.mark.parametrize(("call", "exc"), [(c, e) for _, c, e in CASES],
                         ids=[name for name, _, _ in CASES])
def test_bad_input_raises_and_changes_nothing(w, call, exc):
    # The snapshot shows the scratch pool's free slots, the change log and the lease ids.
    assert_unchanged(w.c, lambda: call(w), exc)


def test_case_ids_are_unique():
    names = [name for name, _, _ in CASES]
    assert len(names) == len(set(names))


def test_the_world_still_works_after_every_refusal(w):
    """All the refusals in a row change nothing and hand nothing out (no id, op or lease),
    and the same world then completes normally with good calls."""
    before = w.c.snapshot()
    for _, call, exc in CASES:
        with pytest.raises(exc):
            call(w)
    after = w.c.snapshot()
    assert after == before, "; ".join(before.diff(after))
    w.pool.release_units(w.live, LIVE)
    w.s.resume_suspended_restore(w.lease)
    w.c.release_offload_store_source(w.lease303)
    w.c.settle_offload_store(w.lease303)
    w.c.settle_offload_store(w.live_op)
    assert w.c.adopt_transfer_units(XFER, 123) is True
    w.c.take_checkpoint_ops()
    w.c.complete_previous_batch()
    w.c.complete_previous_batch()
    assert_invariants(w.c)
    snap = w.c.snapshot()
    assert all(r.phase == "READY" and r.pin_count == 0 for r in snap.records.values())
    assert {r.prefix_hash for r in snap.records.values()} == {
        101, 202, 303, 404, 505, 606, 707, 123,
    }
    assert snap.offload_pins == {} and snap.transfers == {}


def test_constructors_validate():
    with pytest.raises(InvalidArgumentError):
        UnitPool(-1)
    with pytest.raises(InvalidArgumentError):
        UnitPool(2.5)
    with pytest.raises(InvalidArgumentError):
        PageUnitCheckpointStore(UnitPool(3), {"page_unit_bytes": 10})
    with pytest.raises(InvalidArgumentError):
        PageUnitCheckpointStore(UnitPool(3), spec(10, 25), offload_backlog_cap=0)
    with pytest.raises(InvalidArgumentError):
        PageUnitCheckpointStore(UnitPool(3), spec(10, 25), forfeit_bound=-1)
    with pytest.raises(InvalidArgumentError):
        PagedStateCheckpointCoordinator(UnitPool(3), spec(10, 25), True, change_log_size=0)


# -- constructor arguments and messages (fresh-user trial, 2026-11-30) ---------------------


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"enabled": "yes"}, "enabled must be a bool"),
        ({"enabled": None}, "enabled must be a bool"),
        ({"enabled": True, "readable_midstep": 1}, "readable_midstep must be a bool"),
        ({"enabled": True, "offload": object()}, "could_serve"),
    ],
)
def test_coordinator_arguments_are_checked_at_construction(
    kwargs: dict[str, Any], needle: str
) -> None:
    from pagedstate import impl as I

    for coord_cls, pool_cls in (
        (PagedStateCheckpointCoordinator, UnitPool),
        (I.PagedStateCheckpointCoordinator, I.UnitPool),
    ):
        with pytest.raises(InvalidArgumentError, match=needle):
            coord_cls(pool_cls(4), spec(10, 20), **kwargs)


def test_a_pool_that_is_not_a_pool_is_refused_at_construction() -> None:
    from pagedstate import impl as I

    for coord_cls in (PagedStateCheckpointCoordinator, I.PagedStateCheckpointCoordinator):
        with pytest.raises(InvalidArgumentError, match="pool must be a unit pool"):
            coord_cls([], spec(10, 20), True)


def test_messages_say_what_is_wrong() -> None:
    from pagedstate import impl as I

    for models_pool, coord_cls in (
        (UnitPool, PagedStateCheckpointCoordinator),
        (I.UnitPool, I.PagedStateCheckpointCoordinator),
    ):
        pool = models_pool(4)
        with pytest.raises(WrongOwnerError, match=r"raw unit 0 is free, not by 'nobody' as"):
            pool.release_units([0], "nobody")
        coord = coord_cls(models_pool(4), spec(10, 20), True)
        with pytest.raises(InvalidArgumentError, match="an? object is not a sequence: it has no"):
            coord.checkpoint(object(), 4, 1)
