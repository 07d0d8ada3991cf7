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
        lambda c: c.store._victims.remove(
            c.store.records[c.store.hash_to_checkpoint[104]].stamp
        ),
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
        lambda c: c.pool._pieces.__setitem__(_first_unit_of_last_record(c), 5),
        r"unit 10 of record 5 is tagged \(\('state-checkpoint', 5\), 5\)",
    ),
    "vacant heap holds a unit twice": (
        lambda c: c.pool._vacant.append(c.pool._vacant[-1]),
        r"the vacant heap holds a unit twice",
    ),
    "vacant heap out of order": (
        lambda c: c.pool._vacant.insert(0, 39),
        r"the vacant heap is out of order",
    ),
    "vacant heap's first two swapped": (
        lambda c: _swap_first_two(c.pool._vacant),
        r"the vacant heap is out of order",
    ),
    "a free unit both vacant and cached": (
        lambda c: c.pool._cached.__setitem__(c.pool._vacant[0], 5),
        lambda c: f"units both vacant and cached: [{c.pool._vacant[0]}]",
    ),
    "a free unit in neither": (
        lambda c: c.pool._vacant.pop(),
        lambda c: (
            f"free units {sorted(c.pool._vacant)} but vacant + cached"
            f" {sorted(c.pool._vacant[:-1])}"  # the corruption pops the array's last unit
        ),
    ),
    "a free unit with a piece": (
        lambda c: c.pool._pieces.__setitem__(c.pool._vacant[0], 3),
        r"a free unit carries a piece",
    ),
    "an owner's count off": (
        lambda c: c.pool._held.__setitem__(("live-kv", 1), 3),
        r"an owner's unit count is not the number of units tagged with it",
    ),
    "an owner's pieces with a gap": (
        lambda c: c.pool._pieces.__setitem__(c.pool._owners.index(("live-kv", 1)), 7),
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
