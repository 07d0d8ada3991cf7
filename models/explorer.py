"""Exhaustive breadth-first exploration of the reference model (SPEC H.3).

For a bounded :class:`~pagedstate.models.world.Config`, :func:`explore` visits every state
of the world reachable from the initial one, and in every state checks:

- every state invariant of :mod:`pagedstate.spec.snapshot` (SPEC C and G);
- every step invariant on the transition that led there;
- that an action the store refuses with a :class:`~pagedstate.spec.errors.PagedStateError`
  changed nothing (G8);
- that a drain from the state returns the pool to all-free with nothing pinned or pending
  (no leak, no stuck pin).

It records which table rows were taken (row coverage) and which named "sometimes" goals
were met, so a vacuous model is noticed. Symmetry reduction: the visited set holds the
canonical key of :meth:`World.key` (hashes relabelled, ids and counters abstracted);
successors are computed from the actual state, so every explored state is reachable.

On a violation the shortest trace (BFS order) is returned as a list of ``(name, args)``
actions, printable as a runnable Python snippet and as JSON.
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from pagedstate.spec.errors import IllegalTransitionError, PagedStateError, PinUnderflowError
from pagedstate.spec.snapshot import Snapshot, check_invariants, check_step_invariants
from pagedstate.spec.tables import TABLES

from .reference import PagedStateCheckpointCoordinator
from .world import Action, Config, World

__all__ = [
    "CONFIGS",
    "GOALS",
    "Violation",
    "Report",
    "explore",
    "explore_parallel",
    "replay",
    "trace_snippet",
    "all_rows",
]

# --- configurations ----------------------------------------------------------------------

CONFIGS: Mapping[str, Config] = {
    c.name: c
    for c in (
        Config(
            name="tiny",
            units=3,
            units_per_checkpoint=1,
            hashes=2,
            seqs=2,
            kv_owners=1,
            offload=True,
            max_offload_inflight=2,
            leases=True,
            transfers=1,
            scratch_slots=1,
            max_ops_per_batch=2,
            suspend=True,
            backlog_cap=1,
            completions=1,
            settle_wait=True,
            max_depth=7,
        ),
        Config(
            name="default",
            units=5,
            units_per_checkpoint=2,
            hashes=2,
            seqs=2,
            kv_owners=1,
            offload=True,
            max_offload_inflight=2,
            leases=True,
            transfers=1,
            scratch_slots=1,
            max_ops_per_batch=2,
            suspend=True,
            backlog_cap=1,
            completions=1,
            max_depth=10,
        ),
        Config(
            name="wide",
            units=7,
            units_per_checkpoint=2,
            hashes=3,
            seqs=2,
            kv_owners=2,
            offload=True,
            max_offload_inflight=2,
            leases=True,
            transfers=1,
            scratch_slots=1,
            suspend=True,
            completions=2,
            settle_wait=True,
            max_depth=14,
        ),
        # The overlap style (SPEC D.13, G12, G15): ``tiny`` whose boundaries and scratch
        # stores name forwards, drains taking automatic (and, now and then, skipping) ids,
        # restores begun for a sequence and into scratch slots, two completion tokens.
        Config(
            name="overlap",
            units=3,
            units_per_checkpoint=1,
            hashes=2,
            seqs=2,
            kv_owners=1,
            offload=True,
            max_offload_inflight=2,
            leases=True,
            transfers=1,
            scratch_slots=1,
            max_ops_per_batch=2,
            suspend=True,
            backlog_cap=1,
            completions=2,
            settle_wait=True,
            forwards=True,
            skip_forwards=True,
            scratch_restores=True,
            max_depth=8,
        ),
    )
}

# --- "sometimes" goals -------------------------------------------------------------------


def _evicting_two_readers(s: Snapshot) -> bool:
    return any(r.phase == "EVICTING" and r.pin_count >= 2 for r in s.records.values())


def _copying_beside_evicting(s: Snapshot) -> bool:
    by_hash: dict[int, set[str]] = {}
    for r in s.records.values():
        by_hash.setdefault(r.prefix_hash, set()).add(r.phase)
    return any({"COPYING", "EVICTING"} <= p for p in by_hash.values())


def _all_pinned_full(s: Snapshot) -> bool:
    return (
        not s.free
        and any(r.phase == "READY" for r in s.records.values())
        and all(r.pin_count > 0 for r in s.records.values() if r.phase == "READY")
    )


def _boundary_waits(s: Snapshot) -> bool:
    # A pending boundary named for a forward not drained yet (D.13: it stays pending).
    return any(s.last_forward is None or f > s.last_forward for _, f in s.boundary_forwards)


def _restore_into_scratch(s: Snapshot) -> bool:
    # A restore queued or in flight into a free scratch slot (G12: refused while lent).
    free = s.scratch_free or frozenset()
    return any(slot in free for _, slot in (*s.queued_restores, *s.inflight_restores))


GOALS: Mapping[str, tuple[Callable[[Config], bool], Callable[[Snapshot], bool]]] = {
    "a READY image": (
        lambda c: True,
        lambda s: any(r.phase == "READY" for r in s.records.values()),
    ),
    "an EVICTING record with two readers": (lambda c: c.seqs >= 2, _evicting_two_readers),
    "a COPYING and an EVICTING record of one hash": (lambda c: True, _copying_beside_evicting),
    "an in-flight restore": (lambda c: True, lambda s: bool(s.inflight_restores)),
    "an LRU eviction": (lambda c: True, lambda s: s.evictions > 0),
    "a pool full of pinned images": (lambda c: True, _all_pinned_full),
    "a suspended restore": (lambda c: c.suspend, lambda s: bool(s.suspended)),
    "an offload op awaiting its report after source release": (
        lambda c: c.offload,
        lambda s: any(p.source_released for p in s.offload_pins.values()),
    ),
    "a forfeited offload op": (lambda c: c.offload, lambda s: bool(s.forfeited)),
    "a lease on an EVICTING record": (
        lambda c: c.leases,
        lambda s: any(
            not p.reclaimable
            and not p.source_released
            and s.records.get(p.checkpoint_id) is not None
            and s.records[p.checkpoint_id].phase == "EVICTING"
            for p in s.offload_pins.values()
        ),
    ),
    "a dropped nomination": (lambda c: c.offload, lambda s: s.offload_nominations_dropped > 0),
    "a transfer reservation with no free unit": (
        lambda c: c.transfers > 0,
        lambda s: bool(s.transfers) and not s.free,
    ),
    "an adopted image": (
        lambda c: c.transfers > 0,
        lambda s: (
            any(r.phase == "READY" and r.pin_count == 0 for r in s.records.values())
            and s.next_checkpoint_id > 0
            and not s.inflight_stores
            and bool(s.records)
            and s.checkpoints_kept == 0
        ),
    ),
    "a queued scratch store": (lambda c: c.scratch_slots > 0, lambda s: bool(s.scratch_queued)),
    "an issued scratch store": (lambda c: c.scratch_slots > 0, lambda s: bool(s.scratch_issued)),
    "a superseded boundary": (lambda c: True, lambda s: s.checkpoints_dropped > 0),
    "an orphaned checkpoint": (lambda c: True, lambda s: s.checkpoints_orphaned > 0),
    # SPEC D.13: completion tokens.
    "an unsettled READY image": (
        lambda c: c.completions > 0,
        lambda s: any(r.phase == "READY" and not r.settled for r in s.records.values()),
    ),
    "a restore reading an unsettled image": (
        lambda c: c.completions > 0,
        lambda s: any(not r.settled and r.pin_count > 0 for r in s.records.values()),
    ),
    "two completion tokens outstanding": (
        lambda c: c.completions >= 2,
        lambda s: len(s.completions) >= 2,
    ),
    # SPEC D.13, G12, G15: the overlap style.
    "a boundary waiting for its forward": (lambda c: c.forwards, _boundary_waits),
    "a boundary left behind by a skipped forward": (
        lambda c: c.forwards and c.skip_forwards,
        lambda s: (
            s.last_forward is not None and any(f < s.last_forward for _, f in s.boundary_forwards)
        ),
    ),
    "a scratch store waiting for its forward": (
        lambda c: c.forwards and c.scratch_slots > 0,
        lambda s: any(s.last_forward is None or f > s.last_forward for _, f in s.scratch_forwards),
    ),
    "a restore remembered for its sequence": (
        lambda c: c.forwards,
        lambda s: bool(s.restore_owners),
    ),
    "a restore into a scratch slot": (lambda c: c.scratch_restores, _restore_into_scratch),
}


def all_rows(*, defensive: bool = False) -> list[tuple[str, int]]:
    """Every ``(machine, row index)`` of every table that the public API can reach (or,
    with ``defensive=True``, only the defensive rows, which it cannot)."""
    return [
        (t.machine, i)
        for t in TABLES.values()
        for i, row in enumerate(t.rows)
        if row.defensive == defensive
    ]


def _row_label(r: tuple[str, int]) -> str:
    t = TABLES[r[0]]
    return t.label(t.rows[r[1]])


# --- results -----------------------------------------------------------------------------


@attrs.frozen
class Violation:
    """A broken check: which one, what it said, and the shortest trace that reaches it."""

    kind: str
    name: str
    message: str
    trace: tuple[Action, ...]

    def snippet(self, config: Config | str) -> str:
        """The trace as a runnable Python snippet (see :func:`trace_snippet`)."""
        return trace_snippet(config, self.trace, f"{self.kind} {self.name}: {self.message}")

    def to_json(self) -> str:
        """The violation and its trace as JSON."""
        return json.dumps(
            {
                "kind": self.kind,
                "name": self.name,
                "message": self.message,
                "trace": [[n, list(a)] for n, a in self.trace],
            }
        )


@attrs.define
class Report:
    """What an exploration found, in the style of TLC and stateright.

    Counts are of states; times are seconds of wall time. While the search runs, the report
    passed to ``progress`` holds the counts so far.

    Attributes:
        generated: successors computed (states, duplicates included).
        distinct: distinct states found and checked.
        depth: the deepest level reached (actions from the initial state).
        at_depth_bound: distinct states found at the depth bound (``config.max_depth``
            actions from the initial state): checked and counted in ``distinct``, never
            expanded. 0 without a bound or when no state lies that deep; the same in every
            run of one configuration and bound, with or without ``progress``.
        queued: distinct states found below the depth bound and not yet expanded. While
            the search runs, those waiting on its queue; once it ends, those a state or
            time bound or a violation left unexpanded (0 when it ran to completion or to its
            depth bound). The parallel search also counts the successors it had received
            but not yet deduplicated when its time bound struck.
        seconds: wall time of the search.
        complete: every reachable state was expanded: nothing queued, no state at the
            depth bound (the bound cut nothing off), no violation.
        frontier_left: ``at_depth_bound + queued`` (a property; TLC's "states left on
            queue").
    """

    config: Config
    generated: int = 0
    distinct: int = 0
    depth: int = 0
    #: Distinct states at the depth bound, checked and never expanded.
    at_depth_bound: int = 0
    #: Distinct states below the depth bound, found and not (yet) expanded.
    queued: int = 0
    seconds: float = 0.0
    complete: bool = False
    rows_hit: set[tuple[str, int]] = attrs.field(factory=set)
    goals_met: dict[str, int] = attrs.field(factory=dict)
    rejected: int = 0
    violation: Violation | None = None
    #: Why the search ended: "complete", "depth bound", "state bound", "time bound",
    #: "memory bound" (the parallel search only) or
    #: "violation" (empty while running).
    stopped: str = ""

    @property
    def frontier_left(self) -> int:
        """States found but never expanded (TLC's "states left on queue"):
        ``at_depth_bound + queued``. 0 when the search is complete (and after a violation
        that left nothing unexpanded)."""
        return self.at_depth_bound + self.queued

    @property
    def states_per_second(self) -> float:
        """Distinct states per second of wall time."""
        return self.distinct / self.seconds if self.seconds > 0 else 0.0

    @property
    def rows_missed(self) -> list[str]:
        """Labels of table rows never taken."""
        return [_row_label(r) for r in all_rows() if r not in self.rows_hit]

    @property
    def goals_missed(self) -> list[str]:
        """Applicable goals never met."""
        return [
            n
            for n, (applies, _) in GOALS.items()
            if applies(self.config) and n not in self.goals_met
        ]

    @property
    def ok(self) -> bool:
        """No violation, every row taken, every applicable goal met."""
        return self.violation is None and not self.rows_missed and not self.goals_missed

    def text(self) -> str:
        """The report as printed by ``pagedstate explore``."""
        c = self.config
        lines = [
            f"config {c.name}: units={c.units} U={c.units_per_checkpoint} hashes={c.hashes}"
            f" seqs={c.seqs} kv_owners={c.kv_owners} offload={c.offload} leases={c.leases}"
            f" transfers={c.transfers} scratch={c.scratch_slots} suspend={c.suspend}"
            f" completions={c.completions} forwards={c.forwards} max_depth={c.max_depth}"
            + (" symmetry=seqs" if c.symmetry else ""),
            f"{self.generated} states generated, {self.distinct} distinct states found,"
            f" {self.frontier_left} states left on queue ({self.at_depth_bound} at the depth"
            f" bound, {self.queued} not expanded).",
            f"The depth of the {'complete ' if self.complete else ''}state graph search is"
            f" {self.depth}.",
            f"{self.seconds:.1f} s, {self.states_per_second:,.0f} distinct states/s;"
            f" {self.rejected} refused actions checked unchanged.",
            f"Rows taken: {len(set(all_rows()) & self.rows_hit)}/{len(all_rows())}"
            f" (plus {len(all_rows(defensive=True))} defensive row(s) the API cannot reach:"
            f" {', '.join(_row_label(r) for r in all_rows(defensive=True))}).",
        ]
        lines += [f"  row never taken: {r}" for r in self.rows_missed]
        applicable = [n for n, (a, _) in GOALS.items() if a(c)]
        lines.append(f"Goals met: {len(applicable) - len(self.goals_missed)}/{len(applicable)}.")
        lines += [f"  goal never met: {g}" for g in self.goals_missed]
        if self.violation is None and (self.rows_missed or self.goals_missed):
            lines.append(
                "RESULT: NOT OK: no violation, but some reachable rows or goals were not reached"
                " (a bound too small, or a vacuous model); exit status 1."
            )
        if self.violation is None:
            if self.complete:
                lines.append("Model checking completed. No error has been found.")
            else:
                lines.append(
                    f"Search stopped at its {self.stopped or 'bound'}. No error has been found"
                    " in the states it reached"
                    + ("." if self.ok else " (the result above stands: NOT OK).")
                )
        else:
            v = self.violation
            lines.append(f"{v.kind} {v.name} is violated: {v.message}")
            lines.append(f"Shortest trace ({len(v.trace)} steps):")
            lines += [f"  {i + 1}: {n}{tuple(a)}" for i, (n, a) in enumerate(v.trace)]
            lines.append("As Python:")
            lines.append(v.snippet(c))
            lines.append("As JSON:")
            lines.append(v.to_json())
        return "\n".join(lines)


def trace_snippet(config: Config | str, trace: Iterable[Action], comment: str = "") -> str:
    """A runnable Python snippet replaying ``trace`` on a fresh world of ``config``.

    The configuration is written out in full (its ``repr``), so the snippet also works for a
    configuration that is not in :data:`CONFIGS`. It replays on the reference model; for a
    planted bug, pass the mutant's coordinator class to ``build``.
    """
    cfg = CONFIGS[config] if isinstance(config, str) else config
    lines = []
    if comment:
        lines.append(f"# {comment}")
    lines += [
        "from pagedstate.models.world import Config",
        f"w = {cfg!r}.build()",
    ]
    lines += [f"w.act({', '.join([repr(n)] + [repr(a) for a in args])})" for n, args in trace]
    lines.append("print(w.snapshot())")
    return "\n".join(lines)


def replay(world: World, trace: Iterable[Action]) -> World:
    """Apply ``trace`` to ``world`` in place (refused actions are skipped) and return it."""
    for name, args in trace:
        try:
            world.act(name, *args)
        except PagedStateError:
            pass
    return world


# --- the search --------------------------------------------------------------------------


def explore(
    config: Config | str,
    *,
    coordinator_factory: Callable[..., PagedStateCheckpointCoordinator] | None = None,
    max_states: int | None = None,
    max_seconds: float | None = None,
    check_drain: bool = True,
    progress: Callable[[Report], None] | None = None,
    drain_memo: bool = True,
) -> Report:
    """Breadth-first search over every reachable state of ``config``.

    Args:
        config: a :class:`Config` or the name of one in :data:`CONFIGS`.
        coordinator_factory: build the world over this coordinator class (a mutant, for
            planted-bug tests) instead of the reference.
        max_states: stop after this many distinct states (``None``: no bound).
        max_seconds: stop after this much wall time (``None``: no bound).
        check_drain: run the drain check in every state.
        drain_memo: memoise the drain check's argument-free tail on the canonical state it
            starts from (:meth:`World.drain_problems`); False drains every state whole.
            The verdicts, counts, rows and goals are the same either way.
        progress: called with the running report about once a second; it must not change
            the report. The counts it sees are the search's own so far (``queued``: the
            states on the queue now); the final report is the same with or without it.

    Returns:
        A :class:`Report`; ``report.violation`` holds the first (shortest) violation found,
        at which point the search stops.

    Raises:
        KeyError: ``config`` is a name not in :data:`CONFIGS`.
    """
    cfg = CONFIGS[config] if isinstance(config, str) else config
    with _no_gc():
        return _explore(
            cfg, coordinator_factory, max_states, max_seconds, check_drain, progress, drain_memo
        )


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The search allocates millions of acyclic tuples; the cyclic collector would rescan
    the ever-growing visited set again and again (measured: 2x slower at 80k states)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: Seconds between two calls of a search's ``progress`` callback (and, in the parallel
#: search, between two interim counts a worker sends in the middle of a level).
_PROGRESS_EVERY_S = 1.0


def _explore(
    cfg: Config,
    coordinator_factory: Callable[..., PagedStateCheckpointCoordinator] | None,
    max_states: int | None,
    max_seconds: float | None,
    check_drain: bool,
    progress: Callable[[Report], None] | None,
    drain_memo: bool = True,
) -> Report:
    report = Report(config=cfg)
    memo: dict[Any, bool] | None = {} if drain_memo else None
    sink: set[tuple[str, int]] = report.rows_hit
    t0 = time.perf_counter()
    last_progress = t0

    init = cfg.build(coordinator_factory)
    init.coord.row_sink = sink
    # parents: key -> (parent key, action); the initial state's parent is None.
    parents: dict[Any, tuple[Any, Action] | None] = {}

    def trace_to(key: Any, last: Action | None = None) -> tuple[Action, ...]:
        steps: list[Action] = [] if last is None else [last]
        k = key
        while True:
            entry = parents[k]
            if entry is None:
                break
            k, act = entry
            steps.append(act)
        return tuple(reversed(steps))

    # The queue holds states below the depth bound (to expand) and, behind them, states at
    # it (counted in report.at_depth_bound when found, dropped when popped).
    queue: deque[tuple[World, Any, Snapshot, int]] = deque()
    at_bound_queued = 0  # states at the depth bound still on the queue

    def fail(kind: str, name: str, msg: str, key: Any, last: Action | None) -> Report:
        report.queued = len(queue) - at_bound_queued
        report.stopped = "violation"
        report.violation = Violation(kind, name, msg, trace_to(key, last))
        report.seconds = time.perf_counter() - t0
        return report

    init_key = init.key()
    parents[init_key] = None
    s0 = init.snapshot()
    for name, msg in check_invariants(s0):
        return fail("Invariant", name, msg, init_key, None)
    queue.append((init, init_key, s0, 0))
    if cfg.max_depth is not None and cfg.max_depth <= 0:
        report.at_depth_bound = at_bound_queued = 1
    report.distinct = 1
    goal_checks = [(n, pred) for n, (applies, pred) in GOALS.items() if applies(cfg)]

    def note_goals(s: Snapshot) -> None:
        if not goal_checks:
            return
        for n, pred in list(goal_checks):
            if pred(s):
                report.goals_met[n] = report.distinct
                goal_checks.remove((n, pred))

    note_goals(s0)
    if check_drain:
        problems = init.drain_problems(memo)
        if problems:
            return fail("Liveness", "drain", problems[0], init_key, None)

    if max_states is not None and report.distinct >= max_states:
        # a bound of one state: the initial state, checked and not expanded
        report.queued = len(queue) - at_bound_queued
        report.seconds = time.perf_counter() - t0
        report.stopped = "state bound"
        return report
    deadline = None if max_seconds is None else t0 + max_seconds
    while queue:
        if deadline is not None and time.perf_counter() >= deadline:
            report.stopped = "time bound"
            break
        world, key, snap, depth = queue.popleft()
        report.depth = max(report.depth, depth)
        if cfg.max_depth is not None and depth >= cfg.max_depth:
            at_bound_queued -= 1  # counted in report.at_depth_bound when it was found
            continue
        child_at_bound = cfg.max_depth is not None and depth + 1 >= cfg.max_depth
        for action in world.actions():
            nxt = world.clone()
            name, args = action
            try:
                nxt.act(name, *args)
            except (IllegalTransitionError, PinUnderflowError) as exc:
                # The model broke its own table: no environment action may cause this.
                return fail("Table", type(exc).__name__, str(exc), key, action)
            except PagedStateError as exc:
                report.rejected += 1
                # The store must be exactly as before; the environment may have spent a
                # stale handle, and the refused branch is not explored further.
                if nxt.snapshot() != snap:
                    return fail(
                        "Atomicity",
                        name,
                        f"{type(exc).__name__} raised but the state changed",
                        key,
                        action,
                    )
                continue
            report.generated += 1
            nkey = nxt.key()
            if nkey in parents:
                if goal_checks:
                    # Goals about counters or forfeit memory are invisible to the key;
                    # look at known states too until every goal is met.
                    note_goals(nxt.snapshot())
                continue
            # A new state: check it, and the transition that found it.
            parents[nkey] = (key, action)
            report.distinct += 1
            nsnap = nxt.snapshot()
            for iname, msg in check_step_invariants(snap, nsnap):
                return fail("Step invariant", iname, msg, key, action)
            for iname, msg in check_invariants(nsnap):
                return fail("Invariant", iname, msg, nkey, None)
            for msg in nxt.problems():
                return fail("Invariant", "environment_agreement", msg, nkey, None)
            if check_drain:
                problems = nxt.drain_problems(memo)
                if problems:
                    return fail("Liveness", "drain", problems[0], nkey, None)
            note_goals(nsnap)
            queue.append((nxt, nkey, nsnap, depth + 1))
            if child_at_bound:
                report.at_depth_bound += 1
                at_bound_queued += 1
            if max_states is not None and report.distinct >= max_states:
                report.queued = len(queue) - at_bound_queued
                report.seconds = time.perf_counter() - t0
                report.stopped = "state bound"
                return report
        if progress is not None:
            now = time.perf_counter()
            if now - last_progress >= _PROGRESS_EVERY_S:
                last_progress = now
                report.seconds = now - t0
                report.queued = len(queue) - at_bound_queued
                progress(report)
    # Empty unless the time bound stopped the search.
    report.queued = len(queue) - at_bound_queued
    report.complete = report.frontier_left == 0 and report.stopped == ""
    if not report.stopped:
        report.stopped = "complete" if report.complete else "depth bound"
    report.seconds = time.perf_counter() - t0
    return report


# Last: explorer_parallel imports this module (either may come first).
from .explorer_parallel import explore_parallel  # noqa: E402
