"""The exhaustive explorer (models/explorer.py) and its world (models/world.py).

The reference model must pass every check in every state the explorer reaches, take every
reachable table row and meet every applicable "sometimes" goal (a vacuous model or a bound
set too small shows up as a missed row or goal). Around that: the report's TLC-style text,
the JSON form of a counterexample, the canonical key's symmetry reduction, independent
clones, determinism, and a drain check that can fail.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from pagedstate.models.explorer import CONFIGS, Report, all_rows, explore, replay
from pagedstate.models.mutants import MUTANTS
from pagedstate.models.world import KV_OWNER, Action, Config, World
from pagedstate.spec import check_invariants
from pagedstate.spec.types import CHECKPOINT_OWNER

TINY = CONFIGS["tiny"]


def _run(trace: list[Action], config: Config = TINY, factory: Any = None) -> World:
    """A fresh world driven through ``trace`` (every step must be accepted)."""
    world = config.build(factory)
    for name, args in trace:
        world.act(name, *args)
    return world


def _assert_complete(report: Report) -> None:
    assert report.violation is None, report.text()
    assert report.rows_missed == [], report.rows_missed
    assert report.goals_missed == [], report.goals_missed
    assert report.ok
    assert set(all_rows()) <= report.rows_hit


# --- the reference model -----------------------------------------------------------------


def test_reference_tiny() -> None:
    """``tiny`` has no depth bound and cannot be exhausted in a test: at depth 8 the search
    has 120,000 distinct states and 87,000 more on the queue (about 53 s). So it is searched
    completely to depth 7 (every state reachable in at most 7 actions is visited and
    checked): about 22,600 distinct and 113,000 generated states in about 8 s, enough to
    take every reachable row and meet every goal (depth 6 misses two rows)."""
    report = explore(attrs.evolve(TINY, max_depth=7))

    _assert_complete(report)
    assert report.depth == 7
    assert report.frontier_left > 0  # the bound cut the search, as said above
    assert report.distinct > 20_000


@pytest.mark.slow
def test_reference_default() -> None:
    """``default`` (two-unit images) searched completely to depth 8: about 78,000 distinct
    and 438,000 generated states in about 30 s."""
    report = explore(attrs.evolve(CONFIGS["default"], max_depth=8))

    _assert_complete(report)
    assert report.depth == 8
    assert report.distinct > 70_000


# --- report and counterexample formats ---------------------------------------------------


def test_report_text_is_tlc_style() -> None:
    report = explore(TINY, max_states=500)

    text = report.text()
    assert f"{report.generated} states generated" in text
    assert f"{report.distinct} distinct states found" in text
    assert f"depth of the state graph search is {report.depth}" in text
    assert "No error has been found" in text
    assert report.distinct == 500 and report.generated >= report.distinct


def test_violation_json_round_trips_through_replay() -> None:
    mutant = MUTANTS["two_restores_one_slot"].coordinator
    report = explore(TINY, coordinator_factory=mutant, max_states=5_000)
    v = report.violation
    assert v is not None
    assert "Shortest trace" in report.text() and v.to_json() in report.text()

    data = json.loads(v.to_json())
    assert (data["kind"], data["name"], data["message"]) == (v.kind, v.name, v.message)
    trace = tuple((name, tuple(args)) for name, args in data["trace"])
    assert trace == v.trace

    # Replayed from JSON on the mutant, the trace reaches the broken state...
    world = replay(TINY.build(mutant), trace)
    assert v.name in dict(check_invariants(world.snapshot()))
    assert world.key() == replay(TINY.build(mutant), v.trace).key()
    # ...and on the reference it does not (the second restore is refused).
    assert check_invariants(replay(TINY.build(), trace).snapshot()) == []


# --- the canonical key -------------------------------------------------------------------

_HASH_ARG = {
    "checkpoint": 1,
    "begin_restore": 1,
    "reserve_midstep": 1,
    "adopt": 1,
    "acquire": 0,
    "unindex": 0,
}


def _swap_hashes(trace: list[Action]) -> list[Action]:
    swap = {1: 2, 2: 1}
    out = []
    for name, args in trace:
        if name in _HASH_ARG:
            i = _HASH_ARG[name]
            args = (*args[:i], swap[args[i]], *args[i + 1 :])
        out.append((name, args))
    return out


_RICH: list[Action] = [
    ("checkpoint", (0, 1)),
    ("checkpoint", (1, 2)),
    ("drain", ()),
    ("complete", ()),
    ("acquire", (2,)),  # a lease on the h2 image
    ("begin_restore", (0, 1)),  # a queued restore of the h1 image
    ("take_offload", ()),  # the h2 nomination is deferred (its hash is leased)
    ("checkpoint", (1, 1)),  # a pending boundary
]


@pytest.mark.parametrize(
    "trace",
    [
        [("checkpoint", (0, 1)), ("checkpoint", (1, 2))],
        [("checkpoint", (0, 1)), ("checkpoint", (1, 2)), ("drain", ())],
        _RICH,
        [
            ("reserve_transfer", ()),
            ("adopt", (0, 2)),
            ("checkpoint", (1, 1)),
            ("drain", ()),
            ("acquire", (2,)),
            ("tick", ()),
            ("reserve_midstep", (0, 1)),
        ],
    ],
    ids=["pending", "copying", "rich", "adopted"],
)
def test_key_invariant_under_hash_renaming(trace: list[Action]) -> None:
    a = _run(trace)
    b = _run(_swap_hashes(trace))

    assert a.snapshot() != b.snapshot()  # the hashes really differ...
    assert a.key() == b.key()  # ...and the key does not see it


@pytest.mark.parametrize(
    "left, right",
    [
        # same hash for both sequences vs. two hashes
        (
            [("checkpoint", (0, 1)), ("checkpoint", (1, 2))],
            [("checkpoint", (0, 1)), ("checkpoint", (1, 1))],
        ),
        # the boundary filed by another sequence
        ([("checkpoint", (0, 1))], [("checkpoint", (1, 1))]),
        # restore of the image in unit 0 vs. the image in unit 1
        (_RICH[:4] + [("begin_restore", (0, 1))], _RICH[:4] + [("begin_restore", (0, 2))]),
        # a lease before and after the timeout
        (_RICH[:5], _RICH[:5] + [("tick", ())]),
        # a store in flight vs. completed
        (_RICH[:3], _RICH[:4]),
    ],
    ids=["hashes", "sequence", "restore", "timeout", "completion"],
)
def test_key_separates_asymmetric_states(left: list[Action], right: list[Action]) -> None:
    assert _run(left).key() != _run(right).key()


def test_key_abstracts_ids_and_counters() -> None:
    """A checkpoint stored, dropped and its stale nomination skipped: the store is back to
    its initial contents with moved counters and ids, which the key leaves out."""
    world = _run(
        [
            ("checkpoint", (0, 1)),
            ("drain", ()),
            ("complete", ()),
            ("unindex", (1,)),
            ("take_offload", ()),
        ]
    )
    initial = TINY.build()

    assert world.snapshot() != initial.snapshot()
    assert world.key() == initial.key()


# --- clones, determinism -----------------------------------------------------------------


def test_clone_is_independent() -> None:
    world = _run(_RICH[:6])
    snap, key, now = world.snapshot(), world.key(), world.clock.now
    env = (dict(world.kv_held), list(world.ops), list(world.leases), list(world.owners))

    copy = world.clone()
    assert copy.key() == key and copy.snapshot() == snap
    for name, args in [
        ("tick", ()),
        ("reclaim", ()),
        ("kv_alloc", (0,)),
        ("drain", ()),
        ("complete", ()),
        ("suspend", (0,)),
        ("unindex", (1,)),
        ("unindex", (2,)),
        ("checkpoint", (1, 2)),
        ("reserve_transfer", ()),
    ]:
        copy.act(name, *args)
    assert copy.key() != key

    assert world.snapshot() == snap
    assert world.key() == key
    assert world.clock.now == now
    assert (dict(world.kv_held), list(world.ops), list(world.leases), list(world.owners)) == env
    # The original still acts on its own pool and clock.
    assert world.pool is world.coord.store.pool and copy.pool is copy.coord.store.pool
    assert world.pool is not copy.pool
    assert world.coord.store.clock is world.clock and copy.coord.store.clock is copy.clock


def test_exploration_is_deterministic() -> None:
    one = explore("tiny", max_states=3_000)
    two = explore("tiny", max_states=3_000)

    assert (one.distinct, one.generated) == (two.distinct, two.generated)
    assert one.rows_hit == two.rows_hit
    assert one.goals_met == two.goals_met
    assert one.rejected == two.rejected


# --- the drain check ---------------------------------------------------------------------


def _orphan_checkpoint_units(world: World) -> None:
    # Units tagged for a checkpoint that has no record: nothing will ever release them.
    with world.pool._as_store():  # only the store may name a checkpoint owner
        assert world.pool.reserve_units(1, (CHECKPOINT_OWNER, 99)) is not None


def _stuck_pin(world: World) -> None:
    # A READY image with one pin too many: clear_index leaves it EVICTING forever.
    store = world.coord.store
    rec = store.records[store.hash_to_checkpoint[1]]
    assert rec.phase == "READY"
    rec.pin_count += 1


def _forgotten_kv(world: World) -> None:
    # A tenant's units the environment lost track of.
    assert world.pool.reserve_units(1, (KV_OWNER, 0)) is not None


@pytest.mark.parametrize("leak", [_orphan_checkpoint_units, _stuck_pin, _forgotten_kv])
def test_drain_check_can_fail(leak: Callable[[World], None]) -> None:
    world = _run(_RICH[:4])
    assert world.drain_problems() == []

    leak(world)
    snap = world.snapshot()
    problems = world.drain_problems()

    assert problems, "the drain did not notice the leak"
    assert any("drain left" in p or "drain raised" in p for p in problems), problems
    assert world.snapshot() == snap  # the drain ran on a copy
