"""``self_check()`` of the production pool, store and coordinator: empty on a consistent
object (also after every step of the lockstep runs, ``tests/test_impl_lockstep.py``, and of
the conformance kit, which calls a store's ``self_check`` after every step), and naming the
index for every corruption of one private index that the snapshot does not show."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from conftest import FakeClock, Seq, spec

from pagedstate import impl as I
from pagedstate.spec import ManualCompletion


class Tier:
    """A CPU tier that serves nothing."""

    def could_serve(self, prefix_hash: int) -> bool:
        return False


def busy_world() -> I.PagedStateCheckpointCoordinator:
    """A coordinator with something in every index: READY records (pinned and not), a
    COPYING one, a pending boundary, queued, in-flight and suspended restores, offload
    operations (a nomination taken and a lease), a forfeited one, a queued scratch store, a
    transfer and an engine's KV reservation."""
    clock = FakeClock()
    pool = I.UnitPool(40)
    c = I.PagedStateCheckpointCoordinator(
        pool, spec(10, 20), True, Tier(), True, clock=clock, forfeit_bound=2
    )
    c.attach_midstep_scratch(I.SlotPool([90, 91]), 1)
    for k, h in enumerate((101, 102, 103, 104, 105)):
        c.checkpoint(Seq(k), 1, h)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    assert c.begin_restore(101, 7)
    c.checkpoint(Seq(5), 1, 106)
    c.take_checkpoint_ops()  # 101's restore in flight, 106 COPYING
    assert c.begin_restore(102, 8)  # queued
    assert c.begin_restore(103, 9)
    assert c.suspend_queued_restore(9) is not None
    taken = c.take_offload_stores(2)
    assert taken
    c.release_offload_store_source(taken[0][0])
    clock.advance(100.0)
    c.reclaim_stale_offload_pins(1.0)  # forfeited
    assert c.acquire_checkpoint_source(105) is not None
    c.checkpoint(Seq(6), 1, 107)  # pending
    c.publish_midstep(c.reserve_midstep(Seq(0), [(3, 201)]))
    assert c.reserve_transfer_units(("load", 1)) is not None
    assert pool.reserve_units(2, ("live-kv", 1)) is not None
    return c


def test_a_busy_world_is_consistent() -> None:
    c = busy_world()
    s = c.snapshot()
    # every index the corruptions below touch holds something
    assert s.index and s.pending and s.inflight_stores and s.queued_restores
    assert s.inflight_restores and s.suspended and s.offload_pins and s.forfeited
    assert s.pending_boundaries and s.scratch_queued and s.transfers
    assert c.self_check() == []


def _last(d: Any) -> Any:
    return next(reversed(d))


def _first_unit_of_last_record(c: Any) -> int:
    return int(c.store.records[_last(c.store.records)].unit_ids[0])


def _swap_first_two(heap: list[int]) -> None:
    heap[0], heap[1] = heap[1], heap[0]


def _set_piece(c: Any, unit: int, piece: int) -> None:
    """Give ``unit`` alone another piece: its reservation is first written in the form of
    several runs (a piece per unit), then the unit's piece is changed."""
    pool = c.pool
    h = pool._tag[unit]
    owner, base = pool._who[h]
    if base >= 0:
        for u, g in enumerate(pool._tag):
            if g == h:
                pool._piece[u] = u - base
        pool._who[h] = (owner, -1)
    pool._piece[unit] = piece


def _units_of(c: Any, owner: Any) -> list[int]:
    pool = c.pool
    return [u for u, h in enumerate(pool._tag) if h in pool._who and pool._who[h][0] == owner]


def _ghost_handle(c: Any) -> None:
    pool = c.pool
    pool._who[pool._next_handle] = (("ghost", 0), 0)
    pool._next_handle += 1


def _split_first_extent(c: Any) -> None:
    """Cut the widest vacant extent in two touching halves (the pool keeps them merged)."""
    ext = c.pool._ext
    s, e = max(ext.start.items(), key=lambda se: se[1] - se[0])
    assert e - s >= 2
    m = s + 1
    ext.start[s] = m
    ext.start[m] = e
    ext.end[m] = s
    ext.end[e] = m
    ext.heap.append(m)


def _drop_last_extent(c: Any) -> None:
    ext = c.pool._ext
    s = max(ext.start)
    e = ext.start.pop(s)
    del ext.end[e]
    ext.count -= e - s


#: name -> (corruption, the problem it must produce: a regex the whole sentence matches, or
#: a function of the world before the corruption giving the exact sentence).
CORRUPTIONS: dict[str, tuple[Callable[[Any], None], str | Callable[[Any], str]]] = {
    "hash index names a wrong record": (
        lambda c: c.store.hash_to_checkpoint.__setitem__(999, _last(c.store.records)),
        r"the READY index maps 999 to 5, which is not READY 999",
    ),
    "pending map names a READY record": (
        lambda c: c.store._pending_by_hash.__setitem__(101, c.store.hash_to_checkpoint[101]),
        r"the COPYING index maps 101 to 0, which is not COPYING 101",
    ),
    "LRU lost a record": (
        lambda c: c.store._lru.popitem(last=False),
        r"the LRU holds \[0, 1, 2, 4\], the READY records are \[0, 1, 2, 3, 4\]",
    ),
    "evictable count off": (
        lambda c: setattr(c.store, "_num_evictable", c.store._num_evictable + 1),
        r"the evictable count is 2, not 1",
    ),
    "victim heap lost an entry": (
        lambda c: c.store._victims.remove(c.store.records[c.store.hash_to_checkpoint[104]].stamp),
        r"evictable records missing from the victim heap: \[3\]",
    ),
    "victim heap out of order": (
        lambda c: c.store._victims.insert(0, 1 << 200),
        r"the victim heap is out of order",
    ),
    "victim heap's first two swapped": (
        lambda c: _swap_first_two(c.store._victims),
        r"the victim heap is out of order",
    ),
    "slot queued and in flight": (
        lambda c: c.store._inflight_slots.add(8),
        r"a slot has restores in two places \(G4\)",
    ),
    "slot queued and suspended": (
        lambda c: c.store._suspended_slots.__setitem__(8, 99),
        r"a slot has restores in two places \(G4\)",
    ),
    "in-flight slots lost one": (
        lambda c: c.store._inflight_slots.clear(),
        r"the in-flight slot set does not match the in-flight restores",
    ),
    "offload hashes lost one": (
        lambda c: c.store._op_hashes.clear(),
        r"the hashes with an offload operation do not match the operations",
    ),
    "reclaimable set holds a lease": (
        lambda c: c.store._reclaimable.__setitem__(_last(c.store._offload_pins), None),
        r"the reclaimable set does not match the operations",
    ),
    "forfeit memory past its bound": (
        lambda c: setattr(c.store, "_forfeit_bound", 0),
        r"the forfeit memory exceeds its bound or its heap",
    ),
    "a forfeited op not in the forfeit heap": (
        lambda c: c.store._forfeit_heap.clear(),
        r"the forfeit memory exceeds its bound or its heap",
    ),
    "a record's unit retagged": (
        lambda c: _set_piece(c, _first_unit_of_last_record(c), 5),
        r"unit 10 of record 5 is tagged \(\('state-checkpoint', 5\), 5\)",
    ),
    "vacant extents' indexes disagree": (
        lambda c: c.pool._ext.end.clear(),
        r"the vacant extents' two indexes disagree",
    ),
    "vacant heap out of order": (
        lambda c: c.pool._ext.heap.insert(0, 39),
        r"the vacant heap is out of order",
    ),
    "vacant heap lost a start": (
        lambda c: c.pool._ext.heap.clear(),
        r"a vacant extent's start is missing from the heap",
    ),
    "vacant count off": (
        lambda c: setattr(c.pool._ext, "count", c.pool._ext.count + 1),
        r"the vacant count is not the extents' total",
    ),
    "vacant extents touching": (
        lambda c: _split_first_extent(c),
        r"vacant extents touch or overlap at \d+",
    ),
    "a free unit both vacant and cached": (
        lambda c: c.pool._cached.__setitem__(min(c.pool._ext.start), 5),
        lambda c: f"units both vacant and cached: [{min(c.pool._ext.start)}]",
    ),
    "a free unit in neither": (
        lambda c: _drop_last_extent(c),
        r"free units \[.*\] but vacant \+ cached \[.*\]",
    ),
    "a live handle tagging no unit": (
        _ghost_handle,
        r"a live reservation handle tags no unit",
    ),
    "a tag with a handle not handed out": (
        lambda c: c.pool._tag.__setitem__(_units_of(c, ("live-kv", 1))[0], 10**6),
        r"a tag carries a handle not yet handed out",
    ),
    "a dirty unit left out of the dirty index": (
        lambda c: (c.pool._dirty_runs.clear(), c.pool._dirtyf.__setitem__(0, 1)),
        r"dirty units \[0\] are missing from the dirty index",
    ),
    "an owner's count off": (
        lambda c: c.pool._held.__setitem__(("live-kv", 1), 3),
        r"an owner's unit count is not the number of units tagged with it",
    ),
    "an owner's pieces with a gap": (
        lambda c: _set_piece(c, _units_of(c, ("live-kv", 1))[0], 7),
        r"owner \('live-kv', 1\)'s pieces are \[1, 7\], not 0\.\.1",
    ),
    "a deferral left open": (
        lambda c: setattr(c.pool, "_defer", 1),
        r"a deferral is still open between calls",
    ),
    "a deferred callback left behind": (
        lambda c: c.pool._deferred.append(5),
        r"a deferral is still open between calls",
    ),
    "pending key per sequence lost": (
        lambda c: c._pending_of_seq.clear(),
        r"the pending key per sequence does not match the pending boundaries",
    ),
    "pending sequences per hash lost": (
        lambda c: c._pending_by_hash.clear(),
        r"the pending sequences per hash do not match the pending boundaries",
    ),
    "queued scratch per hash lost": (
        lambda c: c._scratch_by_hash.clear(),
        r"the queued scratch slots per hash do not match the queue",
    ),
    "a drain left open": (
        lambda c: setattr(c, "_busy", "take_checkpoint_ops"),
        r"a drain or completion is still open between calls",
    ),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_self_check_names_each_corruption(name: str) -> None:
    corrupt, says = CORRUPTIONS[name]
    c = busy_world()
    exact = says(c) if callable(says) else None
    corrupt(c)
    problems = c.self_check()
    if exact is not None:
        assert exact in problems, problems
    else:
        assert any(re.fullmatch(str(says), p) for p in problems), problems


def test_the_forfeit_memory_full_to_its_bound_is_consistent() -> None:
    """At exactly ``forfeit_bound`` forfeited operations (not past it) nothing is wrong."""
    c = busy_world()
    store = c.store
    assert len(store._forfeited) == 1
    store._forfeit_bound = 1
    assert c.self_check() == []


def test_the_kit_calls_the_store_s_self_check() -> None:
    """The conformance kit reports a store whose own self_check complains, even when every
    answer and snapshot agrees with the reference."""
    from hypothesis import Phase, settings

    from pagedstate.engines.conformance import ConformanceFailure, run_conformance

    class Complaining(I.PagedStateCheckpointCoordinator):
        def self_check(self) -> list[str]:
            return ["planted complaint"]

    with pytest.raises(ConformanceFailure, match="own self_check reports: planted complaint"):
        run_conformance(
            Complaining,
            I.UnitPool,
            settings=settings(
                max_examples=5, derandomize=True, database=None, phases=[Phase.generate]
            ),
        )


# -- overlapped scheduling (SPEC D.13, G12, G15) ----------------------------------------


def overlap_world() -> I.PagedStateCheckpointCoordinator:
    """A coordinator with something in every overlap index: a READY record listed by an
    outstanding completion token (unsettled), a COPYING one, a pending boundary filed with
    a forward still to come, a queued scratch store published with a forward, and a restore
    remembered for its sequence (G15)."""
    c = I.PagedStateCheckpointCoordinator(
        I.UnitPool(40), spec(10, 20), True, Tier(), True, clock=FakeClock()
    )
    c.attach_midstep_scratch(I.SlotPool([90, 91, 92]), 4)
    a, b, d = Seq(0), Seq(1), Seq(2)
    c.checkpoint(a, 1, 101)
    c.take_checkpoint_ops()  # forward 0
    c.complete_previous_batch(ManualCompletion())  # 101 READY, unsettled
    c.checkpoint(d, 1, 103)
    c.checkpoint(b, 1, 102, forward=5)
    c.take_checkpoint_ops()  # forward 1: 103 COPYING, 102 waits for forward 5
    c.publish_midstep(c.reserve_midstep(Seq(3), [(0, 201)]), forward=7)
    assert c.begin_restore(101, 3, seq=a)
    return c


def test_an_overlap_world_is_consistent() -> None:
    c = overlap_world()
    s = c.snapshot()
    assert s.completions and s.boundary_forwards and s.scratch_forwards and s.restore_owners
    assert any(r.phase == "COPYING" for r in s.records.values())
    assert c.self_check() == []
    assert c.clone().self_check() == []


def _owner_key(c: Any) -> int:
    return next(iter(c._restore_owners))


OVERLAP_CORRUPTIONS: dict[str, tuple[Callable[[Any], None], str]] = {
    "a boundary forward without its boundary": (
        lambda c: c._boundary_forwards.__setitem__((1, 2), 3),
        r"a boundary forward names no pending boundary",
    ),
    "a scratch forward without its store": (
        lambda c: c._scratch_forwards.__setitem__(99, 1),
        r"a scratch forward names no queued scratch store",
    ),
    "a negative last forward": (
        lambda c: setattr(c, "_last_forward", -1),
        r"the last forward is -1, not an int >= 0",
    ),
    "a slot's restore owner that is not remembered": (
        lambda c: c._restore_owner_of_slot.__setitem__(4, 12345),
        r"the restore owner of slot 4 is not a remembered restore",
    ),
    "a valid restore owner not indexed by slot": (
        lambda c: c._restore_owner_of_slot.clear(),
        r"the valid restore owner of slot 3 is not indexed",
    ),
    "a restore owner under another key": (
        lambda c: c._restore_owners.__setitem__(7, c._restore_owners.pop(_owner_key(c))),
        r"a restore owner is filed under 7, not its sequence's id",
    ),
    "an issued scratch slot still queued": (
        lambda c: c._scratch_issued.__setitem__(next(iter(c._scratch_queued)), None),
        r"a scratch slot is issued and queued or reserved",
    ),
    "a COPYING record settled": (
        lambda c: setattr(c.store.records[c.store._pending_by_hash[103]], "settled", True),
        r"COPYING record 1 in flight is settled or listed",
    ),
    "an in-flight EVICTING record listed": (
        lambda c: (c.unindex(103), c.store._completions[0][1].append(1)),
        r"EVICTING record 1 in flight is settled or listed",
    ),
    "an unsettled record no completion lists": (
        lambda c: c.store._completions.clear(),
        r"READY record 0 is unsettled but not listed by a completion",
    ),
    "a settled record a completion lists": (
        lambda c: setattr(c.store.records[0], "settled", True),
        r"READY record 0 is settled but listed by a completion",
    ),
    "a record listed twice": (
        lambda c: c.store._completions.append((ManualCompletion(), [0])),
        r"checkpoints listed by two completions: \[0\]",
    ),
    "a completion listing nothing": (
        lambda c: c.store._completions.append((ManualCompletion(), [])),
        r"the completion ManualCompletion\(done=False\) lists no checkpoint",
    ),
    "a completion that is no token": (
        lambda c: c.store._completions.__setitem__(0, (None, c.store._completions[0][1])),
        r"the completion None is not a completion token",
    ),
}


@pytest.mark.parametrize("name", sorted(OVERLAP_CORRUPTIONS))
def test_self_check_names_each_overlap_corruption(name: str) -> None:
    corrupt, says = OVERLAP_CORRUPTIONS[name]
    c = overlap_world()
    corrupt(c)
    problems = c.self_check()
    assert any(re.fullmatch(says, p) for p in problems), problems


def test_a_clone_copies_the_overlap_structures() -> None:
    """``clone()`` shares the completion tokens but copies every list and map of the
    overlap state: changing the clone leaves the original as it was."""
    c = overlap_world()
    before = c.snapshot()
    d = c.clone()
    assert d.snapshot() == before
    token = c.store._completions[0][0]
    assert d.store._completions[0][0] is token
    d.store._completions[0][1].append(99)
    d._boundary_forwards.clear()
    d._scratch_forwards.clear()
    d._restore_owners.clear()
    d._restore_owner_of_slot.clear()
    d._scratch_issued[5] = None
    d.store.records[0].settled = True
    assert c.snapshot() == before and c.self_check() == []
    token.set()
    assert c.settle_completions() == 1 and d.snapshot() != c.snapshot()
