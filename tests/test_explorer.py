"""The exhaustive explorer (models/explorer.py) and its world (models/world.py).

The reference model must pass every check in every state the explorer reaches, take every
reachable table row and meet every applicable "sometimes" goal (a vacuous model or a bound
set too small shows up as a missed row or goal), on ``tiny``, ``default`` and ``overlap``
(the overlap style of SPEC D.13: forward ids, restores for a sequence and into scratch
slots). Around that: the report's TLC-style text, the JSON form of a counterexample, the
canonical key's symmetry reduction (hashes, completion tokens, forward ids), independent
clones (completion tokens included), determinism, the parallel search against the
sequential one, and a drain check that can fail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from pagedstate.models.explorer import (
    CONFIGS,
    Report,
    all_rows,
    explore,
    explore_parallel,
    replay,
)
from pagedstate.models.mutants import MUTANTS
from pagedstate.models.reference import PagedStateCheckpointCoordinator
from pagedstate.models.world import KV_OWNER, Action, Config, World
from pagedstate.spec import check_invariants
from pagedstate.spec.types import CHECKPOINT_OWNER

TINY = CONFIGS["tiny"]
OVERLAP = CONFIGS["overlap"]


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
    """``tiny`` cannot be exhausted in a test: at depth 8 the search has 105,000 distinct
    states and 78,000 more on the queue (about 32 s on 2 workers). So it is searched
    completely to depth 7, its own bound (every state reachable in at most 7 actions is
    visited and checked): about 27,300 distinct and 133,000 generated states in about 12 s
    (22,600 before completion tokens), enough to take every reachable row and meet every
    goal (depth 6 misses two rows)."""
    report = explore(attrs.evolve(TINY, max_depth=7))

    _assert_complete(report)
    assert report.depth == 7
    assert report.frontier_left > 0  # the bound cut the search, as said above
    assert report.distinct > 20_000


#: The rows of completion tokens and settled images (SPEC D.13, B.3 rows 15-17, 24).
SETTLE_ROWS = {("record", 14), ("record", 15), ("record", 25), ("record", 26)}

#: The goals of the overlap style (forward ids, restores for a sequence and into scratch).
OVERLAP_GOALS = {
    "a boundary waiting for its forward",
    "a boundary left behind by a skipped forward",
    "a scratch store waiting for its forward",
    "a restore remembered for its sequence",
    "a restore into a scratch slot",
    "two completion tokens outstanding",
    "an unsettled READY image",
    "a restore reading an unsettled image",
}


def test_reference_overlap() -> None:
    """``overlap`` (SPEC D.13, G12, G15) searched completely to depth 7, one short of its
    own bound: about 36,600 distinct and 199,000 generated states in about 20 s. Every row
    of completion tokens and settled images is taken and every goal met; only the lost
    report of a reclaimed offload op (a source release, a tick and a reclaim after the
    store) needs the eighth step (see the slow test)."""
    report = explore(attrs.evolve(OVERLAP, max_depth=7))

    assert report.violation is None, report.text()
    assert SETTLE_ROWS <= report.rows_hit
    assert OVERLAP_GOALS <= set(report.goals_met)
    assert report.rows_missed == ["offload:SOURCE_RELEASED+reclaim[reclaimable]->LOST_REPORT"]
    assert report.goals_missed == []
    assert report.depth == 7 and report.distinct > 30_000


@pytest.mark.slow
def test_reference_overlap_full() -> None:
    """``overlap`` to its own bound, depth 8: about 152,700 distinct and 915,000 generated
    states in about 100 s (60 s on 2 workers); every row taken, every goal met."""
    report = explore(OVERLAP)

    _assert_complete(report)
    assert report.depth == 8


@pytest.mark.slow
def test_reference_default() -> None:
    """``default`` (two-unit images) searched completely to depth 8: about 98,500 distinct
    and 537,000 generated states in about 45 s (78,000 before completion tokens)."""
    report = explore(attrs.evolve(CONFIGS["default"], max_depth=8))

    _assert_complete(report)
    assert report.depth == 8
    assert report.distinct > 90_000


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
    "checkpoint_next": 1,
    "checkpoint_last": 1,
    "restore_scratch": 1,
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


#: The overlap style: h1 stored after forward 0 under a token, h2 filed for forward 2, a
#: restore of h1 remembered for sequence 1, a scratch store of h2 published for forward 2.
_OVERLAP_RICH: list[Action] = [
    ("checkpoint_next", (0, 1)),
    ("drain", ()),
    ("drain", ()),
    ("complete_token", ()),
    ("checkpoint_last", (0, 2)),
    ("begin_restore", (1, 1)),
    ("reserve_midstep", (0, 2)),
    ("publish_midstep", (0,)),
]


def test_key_invariant_under_hash_renaming_overlap() -> None:
    a = _run(_OVERLAP_RICH, OVERLAP)
    b = _run(_swap_hashes(_OVERLAP_RICH), OVERLAP)

    assert a.snapshot() != b.snapshot()
    assert a.key() == b.key()
    s = a.snapshot()
    assert s.boundary_forwards and s.scratch_forwards and s.restore_owners and s.completions


def test_key_abstracts_forward_ids() -> None:
    """Forward ids grow with every drain; the key keeps them relative to the latest one, so
    the same situation one forward later is the same state (else the space is infinite)."""
    once = [("checkpoint_next", (0, 1)), ("drain", ())]
    later = [*once, ("forget", (0,)), ("checkpoint_next", (0, 1)), ("drain", ())]
    a, b = _run(once, OVERLAP), _run(later, OVERLAP)

    assert (a.coord.last_forward, b.coord.last_forward) == (0, 1)
    assert a.snapshot().boundary_forwards != b.snapshot().boundary_forwards
    assert a.key() == b.key()
    # ...but not whether a boundary's forward has run yet: filed for the forward about to
    # run (stored one drain later) vs for the forward just drained (stored at the next).
    first = [("checkpoint_next", (0, 2)), ("drain", ())]
    ahead = _run([*first, ("checkpoint_next", (1, 1))], OVERLAP)
    now = _run([*first, ("checkpoint_last", (1, 1))], OVERLAP)
    assert ahead.key() != now.key()
    assert _run([("checkpoint_next", (0, 1))], OVERLAP).key() != a.key()


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


_TOKEN = [("checkpoint", (0, 1)), ("drain", ()), ("complete_token", ())]


@pytest.mark.parametrize(
    "left, right",
    [
        # published settled (no token) vs unsettled (a token not done)
        (_TOKEN[:2] + [("complete", ())], _TOKEN),
        # the token done but not yet seen vs not done
        (_TOKEN + [("token_done", (0,))], _TOKEN),
        # the token seen done (settled, forgotten) vs done and not yet seen
        (
            _TOKEN + [("token_done", (0,)), ("settle_completions", ())],
            _TOKEN + [("token_done", (0,))],
        ),
    ],
    ids=["settled", "done", "seen"],
)
def test_key_separates_completion_states(left: list[Action], right: list[Action]) -> None:
    assert _run(left).key() != _run(right).key()


def test_tokens_out_of_order_and_late() -> None:
    """Two outstanding tokens (``overlap`` allows two): the later one done first settles
    only its own image, and only when the store polls (here, ``settle_completions``)."""
    world = _run(
        [
            ("checkpoint_next", (0, 1)),
            ("drain", ()),
            ("drain", ()),
            ("complete_token", ()),
            ("checkpoint_last", (1, 2)),
            ("drain", ()),
            ("complete_token", ()),
        ],
        OVERLAP,
    )
    assert world.snapshot().completions == ((0,), (1,))
    world.act("token_done", 1)
    assert not world.snapshot().records[1].settled  # not seen yet
    assert world.act("settle_completions") == 1
    s = world.snapshot()
    assert s.completions == ((0,),)
    assert (s.records[0].settled, s.records[1].settled) == (False, True)
    assert world.act("settle_wait") == 1
    assert world.snapshot().completions == () and world.tokens == []
    assert world.problems() == [] and world.drain_problems() == []


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


def test_clone_has_its_own_tokens() -> None:
    """The store's clone shares completion tokens; the world's clone gives the copy its own,
    so marking one done in a successor does not reach its parent or siblings."""
    world = _run(_TOKEN)
    copy = world.clone()
    copy.act("token_done", 0)

    assert world.tokens[0][0].done is False and world.coord.store._completions[0][0].done is False
    assert copy.coord.store._completions[0][0].done is True
    assert world.tokens[0][0] is world.coord.store._completions[0][0]  # still one object
    assert world.key() == _run(_TOKEN).key() != copy.key()


@pytest.mark.parametrize("config", ["tiny", "overlap"])
def test_parallel_search_agrees(config: str) -> None:
    """The parallel search visits exactly the sequential one's states (its last level is
    checked where it is generated or one chunk at a time, never kept as worlds)."""
    cfg = attrs.evolve(CONFIGS[config], max_depth=5)
    one, two = explore(cfg), explore_parallel(cfg, workers=2)

    assert (two.distinct, two.generated, two.rejected) == (
        one.distinct,
        one.generated,
        one.rejected,
    )
    assert two.frontier_left == one.frontier_left > 0 and two.stopped == "depth bound"
    assert two.rows_hit == one.rows_hit


def test_parallel_search_checks_the_last_level() -> None:
    """A violation on the last level (the depth bound is the shortest trace's length) is
    found by the parallel search as by the sequential one."""
    mutant = MUTANTS["host_pin_unsettled"].coordinator
    cfg = attrs.evolve(TINY, max_depth=4)
    one = explore(cfg, coordinator_factory=mutant)
    two = explore_parallel(cfg, coordinator_factory=mutant, workers=2)

    assert one.violation is not None and two.violation is not None
    assert (two.violation.kind, two.violation.name) == (one.violation.kind, one.violation.name)
    assert len(two.violation.trace) == len(one.violation.trace) == 4
    assert explore_parallel(attrs.evolve(cfg, max_depth=3), coordinator_factory=mutant).ok is False


def test_exploration_is_deterministic() -> None:
    one = explore("tiny", max_states=3_000)
    two = explore("tiny", max_states=3_000)

    assert (one.distinct, one.generated) == (two.distinct, two.generated)
    assert one.rows_hit == two.rows_hit
    assert one.goals_met == two.goals_met
    assert one.rejected == two.rejected


# --- the states left unexpanded ("states left on queue") --------------------------------


class _Clock:
    """A stand-in for the explorer's ``time`` module. ``every``: each ``perf_counter`` call
    is a second after the last, so ``progress`` is called after every expansion (and a
    parallel worker sends its counts after every state); ``once``: only the first call
    after the start is later, so ``progress`` is called once, early in the search."""

    def __init__(self, mode: str) -> None:
        self.mode, self.calls = mode, 0

    def perf_counter(self) -> float:
        self.calls += 1
        if self.mode == "every":
            return float(self.calls)
        return 0.0 if self.calls == 1 else 2.0


def _level_sizes(cfg: Config) -> list[int]:
    """Distinct states (by canonical key) at each depth ``0..cfg.max_depth`` of a plain
    breadth-first search over the world, without the explorer or its checks."""
    from pagedstate.spec.errors import PagedStateError

    assert cfg.max_depth is not None
    level = [cfg.build()]
    seen = {level[0].key()}
    sizes = [1]
    for _ in range(cfg.max_depth):
        nxt = []
        for world in level:
            for name, args in world.actions():
                child = world.clone()
                try:
                    child.act(name, *args)
                except PagedStateError:
                    continue
                if child.key() not in seen:
                    seen.add(child.key())
                    nxt.append(child)
        level = nxt
        sizes.append(len(nxt))
    return sizes


#: A configuration small enough to be searched completely (276 distinct states).
_MICRO = Config(name="micro", units=2, units_per_checkpoint=1, hashes=2, seqs=1)

_SEARCHES = pytest.mark.parametrize(
    "search", [explore, explore_parallel], ids=["sequential", "parallel"]
)


def _patch_time(monkeypatch: pytest.MonkeyPatch, clock: Any) -> None:
    """The searches' clock (both modules: the parallel search lives in its own)."""
    from pagedstate.models import explorer, explorer_parallel

    monkeypatch.setattr(explorer, "time", clock)
    monkeypatch.setattr(explorer_parallel, "time", clock)


@_SEARCHES
@pytest.mark.parametrize("clock", [None, "every", "once"])
def test_states_left_on_queue_are_those_at_the_depth_bound(
    monkeypatch: pytest.MonkeyPatch, search: Callable[..., Report], clock: str | None
) -> None:
    """Searched to its depth bound, the states left unexpanded are exactly the distinct
    states at that depth (a plain BFS counts them), whether ``progress`` is called never,
    after every expansion or once early on. Before, the sequential search's progress call
    overwrote the count with the queue's length and the depth-bound branch then added to
    it: twice the count with progress every step, queue length plus count with one call."""
    cfg = attrs.evolve(TINY, max_depth=4)
    sizes = _level_sizes(cfg)
    seen: list[Report] = []
    if clock is not None:
        _patch_time(monkeypatch, _Clock(clock))
    report = search(cfg, progress=None if clock is None else seen.append)

    assert report.distinct == sum(sizes) and report.depth == 4
    assert report.frontier_left == sizes[-1] > 0, (report.frontier_left, sizes)
    assert f"{sizes[-1]} states left on queue" in report.text()
    assert not report.complete and report.stopped == "depth bound"
    assert (report.at_depth_bound, report.queued) == (sizes[-1], 0)
    assert (clock is None) == (not seen)


@_SEARCHES
@pytest.mark.parametrize("clock", [None, "every", "once"])
def test_a_complete_search_stays_complete_with_progress(
    monkeypatch: pytest.MonkeyPatch, search: Callable[..., Report], clock: str | None
) -> None:
    """A search that exhausts its space is complete, with nothing left on the queue, also
    when ``progress`` was called while the queue was not empty (before, the sequential
    search kept that queue length and reported a "depth bound" on a config without one)."""
    if clock is not None:
        _patch_time(monkeypatch, _Clock(clock))
    report = search(_MICRO, progress=None if clock is None else lambda r: None)

    assert report.frontier_left == 0, report.frontier_left
    assert report.complete and report.stopped == "complete"
    assert "Model checking completed" in report.text()
    assert report.distinct == 276 and (report.at_depth_bound, report.queued) == (0, 0)


def test_states_left_at_a_state_bound_do_not_depend_on_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped by ``max_states``, the count is the states still queued (none yet at the
    depth bound), the same with progress after every expansion; progress saw the live
    queue, never a count above the distinct states found."""
    plain = explore(TINY, max_states=500)
    seen: list[tuple[int, int, int]] = []
    _patch_time(monkeypatch, _Clock("every"))
    ticked = explore(
        TINY, max_states=500, progress=lambda r: seen.append((r.distinct, r.queued, r.depth))
    )

    assert (ticked.queued, ticked.at_depth_bound) == (plain.queued, plain.at_depth_bound)
    assert ticked.frontier_left == plain.frontier_left == plain.queued > 0
    assert plain.stopped == "state bound" and plain.at_depth_bound == 0
    assert len(seen) > 100
    assert all(0 < queued < distinct for distinct, queued, _ in seen)


def test_parallel_progress_comes_within_a_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parallel search calls ``progress`` in the middle of a level too (a level of
    ``default`` takes minutes; before, it was called once per level), with counts that
    only grow and never pass the final ones."""
    cfg = attrs.evolve(TINY, max_depth=4)
    sizes = _level_sizes(cfg)
    seen: list[tuple[int, int]] = []
    _patch_time(monkeypatch, _Clock("every"))
    report = explore_parallel(
        cfg, workers=2, progress=lambda r: seen.append((r.generated, r.distinct))
    )

    assert report.distinct == sum(sizes)
    assert len(seen) > 2 * len(sizes), len(seen)  # more than once per level
    generated, distinct = [g for g, _ in seen], [d for _, d in seen]
    assert generated == sorted(generated) and distinct == sorted(distinct)
    assert max(generated) <= report.generated and max(distinct) <= report.distinct
    # Some calls came in the middle of a level: distinct counts no level ends at.
    level_ends = {sum(sizes[: i + 1]) for i in range(len(sizes))}
    assert set(distinct) - level_ends, (sorted(set(distinct)), level_ends)


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


def test_drain_waits_for_tokens() -> None:
    """The drain ends with ``settle_completions(wait=True)``: a token nobody marked done
    does not outlive it, and the world it ran on still waits for it."""
    world = _run(_TOKEN)
    assert world.drain_problems() == []
    assert world.snapshot().completions == ((0,),) and not world.tokens[0][0].done


_MAIN_PID = os.getpid()


class DiesInAWorker(PagedStateCheckpointCoordinator):
    """Exits at its first checkpoint in any process but the test's (pickled by name)."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        if os.getpid() != _MAIN_PID:
            os._exit(3)
        return super().checkpoint(*args, **kwargs)


@pytest.mark.parametrize("with_progress", [False, True])
def test_a_worker_that_dies_is_an_error_not_a_hang(with_progress: bool) -> None:
    """A worker killed mid-search (the kernel's OOM killer, here os._exit) ends the search
    with a RuntimeError naming it and its exit code, instead of a receive that waits for
    ever (the main process used to keep the child's end of each pipe open)."""
    import signal

    def hung(*_: Any) -> None:
        raise TimeoutError("explore_parallel hung after a worker died")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.raises(RuntimeError, match=r"worker \d of 2 died, exit code 3"):
            explore_parallel(
                attrs.evolve(CONFIGS["tiny"], max_depth=4),
                workers=2,
                coordinator_factory=DiesInAWorker,
                progress=(lambda r: None) if with_progress else None,
            )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_memory_bound_stops_the_parallel_search_in_a_level(monkeypatch: Any) -> None:
    from pagedstate.models import explorer_parallel as xp

    cfg = attrs.evolve(CONFIGS["tiny"], max_depth=5)
    free = explore_parallel(cfg, workers=2)
    assert free.stopped == "depth bound"
    # The check before the search sees a small process; from then on (in the forked workers
    # too) every process is over its share, so the first level ends the search.
    calls = [0]

    def grows(pid: Any = "self") -> float:
        calls[0] += 1
        return 0.0 if calls[0] == 1 else 1e6

    monkeypatch.setattr(xp, "_rss_mb", grows)
    bound = explore_parallel(cfg, workers=2, max_memory_mb=300.0)
    monkeypatch.undo()
    assert bound.stopped == "memory bound"
    assert bound.distinct < free.distinct and bound.frontier_left > 0
    assert bound.violation is None
    roomy = explore_parallel(cfg, workers=2, max_memory_mb=1e9)
    assert (roomy.stopped, roomy.distinct) == ("depth bound", free.distinct)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_bad_memory_bound_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="max_memory_mb"):
        explore_parallel("tiny", workers=2, max_memory_mb=bad)


def test_a_memory_bound_spent_before_the_search_is_refused_up_front(capsys: Any) -> None:
    """1 MiB is less than a process uses before the first state: a ValueError naming the
    process's size, not a search stopped at once with 0 states; the CLI says so (exit 2)."""
    with pytest.raises(ValueError, match="already uses"):
        explore_parallel("tiny", workers=2, max_memory_mb=1.0)
    from pagedstate.models.cli import main as cli_main

    assert cli_main(["explore", "--config", "tiny", "--workers", "2", "--max-memory-mb", "1"]) == 2
    assert "already uses" in capsys.readouterr().err


def test_a_state_bound_of_one_reports_the_initial_state_alone() -> None:
    report = explore("tiny", max_states=1)
    assert (report.distinct, report.generated, report.stopped) == (1, 0, "state bound")
    assert report.frontier_left == 1


class RaisesInAWorker(PagedStateCheckpointCoordinator):
    """Raises (not a refusal) at its first clear_index in any process but the test's."""

    def clear_index(self) -> None:
        if os.getpid() != _MAIN_PID:
            raise KeyError("planted")
        super().clear_index()


def test_a_worker_that_raises_is_named_as_an_exception_not_as_memory() -> None:
    with pytest.raises(RuntimeError, match="exit code 1 \\(an exception in the worker"):
        explore_parallel(
            attrs.evolve(CONFIGS["tiny"], max_depth=4),
            workers=2,
            coordinator_factory=RaisesInAWorker,
        )


@pytest.mark.parametrize("workers", [1.5, True, "2"])
def test_a_bad_worker_count_is_refused_before_any_world_is_built(workers: Any) -> None:
    with pytest.raises(ValueError, match="workers"):
        explore_parallel("tiny", workers=workers)
