"""The kit's exhaustive mode: every reachable state of a bounded configuration, each call
compared (SPEC H.4, as the project's own exhaustive test runs its production store).

:func:`run_exhaustive` runs the explorer's breadth-first search
(:mod:`pagedstate.models.explorer`: same configurations, same action order, same canonical
key, the same depth bound) over two worlds at once: the reference world, which decides
which actions are enabled and which states are new, and a *follower* world whose
coordinator and pool come from the engine's factories. Every node carries both, so the
store under test is driven through exactly the shortest trace the explorer found for each
state. For **every generated transition** (not only those reaching a new state):

- every coordinator call the action makes must answer alike, by value and by type (``1``
  is not ``True``), or raise the same exception class
  (:mod:`pagedstate.engines.conformance.observe` logs them), and a refused call must leave
  the store under test's snapshot unchanged (SPEC G8); the search goes on from the copy
  that refused, so state a refusal leaves behind is exercised by the actions after it;
- the two snapshots must be equal (the failure names every differing field), and the
  store under test must not write the sequences it is given;
- and on every new state, both coordinators must answer the same read-only questions alike
  (:func:`~pagedstate.engines.conformance.observe.questions`: ``contains``,
  ``restore_queued_for``, ``has_available_units``, ``is_idle``, ...), without changing
  the snapshot; the store under test's own ``self_check()`` (when it has one) and
  the environment's checks of it (every handle the environment holds still live, no image
  settled before its completion token is done, no host reader handed such an image, the
  pending boundaries and their forwards as filed; SPEC D.13, G15) must report nothing; with
  ``check_drain``, a copy of it driven to quiescence must give every unit back.

The follower sees the store under test through its public API only (calls, ``snapshot()``,
its pool's ``reserve_units``/``release_units``/``owner_of``). To branch, it needs a copy of
the store at each state: with ``mode="clone"`` it calls the coordinator's ``clone()`` (a deep
copy that shares nothing mutable: the contract of :meth:`PagedStateCheckpointCoordinator.clone
<pagedstate.models.reference.PagedStateCheckpointCoordinator.clone>`), so clone bugs are
found too; with ``mode="replay"`` it builds a fresh store with the factories and replays the
trace (any store; O(depth) calls per transition). ``"auto"`` (the default) clones when the
coordinator has a ``clone`` method. Copies of a store may share the completion tokens and
the clock they were given; the follower's tokens and clock therefore read the state of
whichever follower world is acting, so sharing them is harmless.

Use::

    from pagedstate.engines.conformance import run_exhaustive

    report = run_exhaustive(MyCoordinator, pool_factory=MyPool, config="default", max_depth=6)
    print(report.distinct, report.transitions)  # depth 6: seconds; the plan's 9: minutes

Measured sizes and times, how to read a failure and how to keep it as a regression test are
in ``docs/conformance.md`` ("Exhaustive mode").
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from pagedstate.models.explorer import CONFIGS
from pagedstate.models.world import (
    Action,
    Config,
    World,
)
from pagedstate.spec.errors import PagedStateError
from pagedstate.spec.snapshot import Snapshot

from .config import ConformanceFailure, CoordinatorFactory, PoolFactory
from .follower import (
    FollowerWorld,
    Mode,
    _as,
    _check_world_args,
    _seq_fields,
    _undo_writes,
    follower_world,
)
from .follower import _problems as _problems  # re-exported (the kit's tests use it)
from .observe import (
    LOG,
    answers,
    differ,
    questions,
    recording_reference,
    show,
    strict,
    type_diff,
)

__all__ = [
    "EXHAUSTIVE_PLAN",
    "ExhaustiveReport",
    "follower_world",
    "run_exhaustive",
    "replay_trace",
    "run_exhaustive_plan",
]

# -- the search ------------------------------------------------------------------------------


@attrs.frozen
class ExhaustiveReport:
    """What a passing exhaustive run covered.

    Attributes:
        config: the configuration's name.
        depth_bound: the depth bound it ran to (``None``: until the space was exhausted).
        mode: ``"clone"`` or ``"replay"``, as run.
        distinct: distinct states visited (the explorer's count for the same bound).
        transitions: transitions compared (every action generated in a state expanded).
        refused: of those, calls both refused (G8 checked on each).
        depth: the deepest level reached.
        seconds: wall time of the run.
        rows: the table rows the reference took, as ``(machine, index)``: the row is
            ``TABLES[machine].rows[index]`` of :data:`pagedstate.spec.tables.TABLES`, and
            ``TABLES[machine].label(row)`` names it.
        complete: False when ``max_states`` stopped the search before its depth bound
            (then ``distinct == max_states`` and states below the bound were left).
    """

    config: str
    depth_bound: int | None
    mode: str
    distinct: int
    transitions: int
    refused: int
    depth: int
    seconds: float
    rows: frozenset[tuple[str, int]]
    complete: bool = True


Outcome = tuple[Any, ...]


class _LastCrash:
    """The exception of the store under test's last ``crashed`` outcome (chained to the
    failure that reports it, so its traceback is not lost)."""

    exc: BaseException | None = None


_LAST_CRASH = _LastCrash()


def _call(world: World, action: Action, *, under_test: bool = False) -> Outcome:
    """``(kind, value, calls)``: ``("ok", the action's result)`` (strict, see
    :func:`~pagedstate.engines.conformance.observe.strict`), ``("raised", error class)``
    for a refusal (a :class:`~pagedstate.spec.errors.PagedStateError`), and every
    coordinator call the action made with its answer. On the store under test any other
    exception is ``("crashed", text)`` and a write to a sequence it was given is
    ``("wrote", text)`` (undone by :func:`_as`); neither ever equals the reference's
    outcome. A write by the reference is a bug of the kit: raised."""
    name, args = action
    seen = _seq_fields(world.seqs)  # the follower's writes are caught by _as, in its act
    calls: list[tuple[Any, ...]] = []
    LOG.calls, LOG.depth = calls, 0
    try:
        out: tuple[str, Any] = ("ok", strict(world.act(name, *args)))
    except PagedStateError as exc:
        out = ("raised", type(exc))
    except ConformanceFailure as exc:
        if not under_test:
            raise
        out = ("wrote", str(exc))
    except Exception as exc:
        if not under_test:
            raise
        _LAST_CRASH.exc = exc
        out = ("crashed", f"{type(exc).__name__}: {exc}")
    finally:
        LOG.calls, LOG.depth = None, 0
    if not under_test:
        written = _undo_writes(world.seqs, seen)
        if written:
            raise ConformanceFailure(f"the reference wrote a sequence: {written}")
    return (*out, tuple(calls))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _config_of(config: Any) -> Config:
    if isinstance(config, str):
        if config not in CONFIGS:
            raise KeyError(f"no configuration {config!r}; known: {', '.join(CONFIGS)}")
        config = CONFIGS[config]
    if not isinstance(config, Config):
        raise TypeError(
            f"config must be a pagedstate.models.world.Config or the name of one, got {config!r}"
        )
    if config.symmetry:
        raise ValueError(
            f"config {config.name!r} has symmetry on: the kit drives one state of each class"
            " of states equal up to renaming the sequences, so a store that treats one slot"
            " unlike another could pass; use attrs.evolve(config, symmetry=False)"
        )
    d = config.max_depth
    if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 1):
        raise ValueError(
            f"config {config.name!r}: max_depth must be an int >= 1 or None, got {d!r}"
        )
    return config


def _check_bounds(max_depth: Any, max_states: Any, mode: Any, progress: Any) -> None:
    for label, value in (("max_depth", max_depth), ("max_states", max_states)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(f"{label} must be an int >= 1 or None, got {value!r}")
    if not isinstance(mode, str) or mode not in ("auto", "clone", "replay"):
        raise ValueError(f"mode must be 'auto', 'clone' or 'replay', got {mode!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {progress!r}")


def _sweep(
    rw: World,
    sw: FollowerWorld,
    asked: tuple[Any, ...],
    snap: Snapshot,
    fail: Fail,
) -> None:
    """Ask both coordinators every read-only question; each answer must agree, and the
    questions must leave the store under test's snapshot as it was."""
    want = answers(rw.coord, asked)
    with _as(sw):
        got = answers(sw.coord, asked)
    if want != got:
        for (name, args), a, b in zip(asked, want, got, strict=True):
            if a != b:
                q = name if args is None else f"{name}({', '.join(map(repr, args))})"
                raise fail(
                    sw,
                    f"in the state it reached, {q} answers differ: the reference {a[0]}"
                    f" {show(a[1])}, the store under test {b[0]} {show(b[1])}",
                )
    if sw.snapshot() != snap:
        raise fail(sw, "the read-only questions asked in the state it reached changed it")


Fail = Callable[[FollowerWorld, str], ConformanceFailure]


def _check_step(
    rn: World, sn: FollowerWorld, action: Action, before: Snapshot, fail: Fail
) -> tuple[Outcome, Snapshot, Snapshot]:
    """Take ``action`` on both worlds and compare: every call's answer, the outcome and
    the snapshots; a refusal must leave the store under test as it was (``before``, its
    snapshot ahead of the call; G8). Returns ``(outcome, reference snapshot, store under
    test's snapshot)``."""
    r, s = _call(rn, action), _call(sn, action, under_test=True)
    if r != s:
        err = fail(sn, differ(r, s))
        if s[0] == "crashed":  # the store under test's exception, with its traceback
            raise err from _LAST_CRASH.exc
        raise err
    rs, ss = rn.snapshot(), sn.snapshot()
    if rs != ss:
        raise fail(sn, "snapshots differ: " + "; ".join(rs.diff(ss)))
    if r[0] == "raised" and ss != before:
        raise fail(sn, f"refused ({r[1].__name__}) but its snapshot changed")
    return r, rs, ss


def _check_state(
    rn: World,
    sn: FollowerWorld,
    rs: Snapshot,
    ss: Snapshot,
    asked: tuple[Any, ...],
    check_drain: bool,
    fail: Fail,
) -> None:
    """The checks of a state reached (module doc): snapshots equal by type too, the store
    under test's ``self_check()``, the environment's checks, the read-only questions, and
    with ``check_drain`` the drain to quiescence."""
    if strict(rs) != strict(ss):  # equal, but of other types somewhere
        raise fail(sn, "snapshots differ in type: " + type_diff(rs, ss))
    found = sn.self_check()
    if found:
        raise fail(sn, "its own self_check reports: " + "; ".join(found))
    found = sn.problems()
    if found:
        raise fail(sn, "the environment's checks: " + "; ".join(found))
    _sweep(rn, sn, asked, ss, fail)
    if check_drain:
        found = sn.drain_problems()
        if found:
            raise fail(sn, "driven to quiescence: " + "; ".join(found))


def run_exhaustive(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    *,
    config: Config | str = "default",
    max_depth: int | None = None,
    mode: Mode = "auto",
    check_drain: bool = False,
    max_states: int | None = None,
    progress: Callable[[str], None] | None = _stderr,
    progress_every_s: float = 10.0,
) -> ExhaustiveReport:
    """Drive ``factory``'s coordinator through every state the explorer reaches on
    ``config`` (breadth first, to ``max_depth``), comparing every call with the reference.

    Args:
        factory, pool_factory: as :func:`~pagedstate.engines.conformance.conformance_machine`
            (``pool_factory(num_units)``; default the reference pool).
        config: a :class:`~pagedstate.models.world.Config` or the name of one of the
            explorer's (``tiny``, ``default``, ``wide``, ``overlap``: :data:`CONFIGS
            <pagedstate.models.explorer.CONFIGS>`).
        max_depth: the depth bound (actions from the initial state); default the
            configuration's own ``max_depth``. ``default`` to depth 6 takes seconds, to
            9, minutes (``docs/conformance.md``).
        mode: ``"clone"`` (copies of the store under test from its coordinator's
            ``clone()``), ``"replay"`` (a fresh store from the factories, the trace
            replayed) or ``"auto"`` (clone when the coordinator has ``clone``); see the
            docstring of :mod:`pagedstate.engines.conformance.exhaustive`.
        check_drain: also drive a copy of every new state of the store under test to
            quiescence and require every unit back (about twice the time).
        max_states: stop after this many distinct states (a smoke run; the report of a run
            cut short has ``distinct == max_states``); ``None``: no limit.
        progress: called with a line of progress about every ``progress_every_s`` seconds
            and at the end (default: printed to stderr); ``None`` for silence.
        progress_every_s: seconds between progress lines.

    Returns:
        The coverage (:class:`ExhaustiveReport`).

    Raises:
        ConformanceFailure (an AssertionError): the first disagreement; the message names
            the trace from the initial state (``[(action, args), ...]``, the explorer's
            actions, :meth:`World.act <pagedstate.models.world.World.act>`), the call and
            both outcomes or the differing snapshot fields (each as ``reference != store
            under test``). An exception of the store under test other than a
            :class:`~pagedstate.spec.errors.PagedStateError` is such a failure
            (``crashed``), not raised.
        KeyError: ``config`` names no configuration.
        TypeError: ``config`` is not a ``Config`` or a name, a factory is not callable,
            ``progress`` is not callable or None, ``check_drain`` is not a bool.
        ValueError: a bad ``mode``, ``max_depth``, ``max_states`` or ``progress_every_s``,
            or a ``config`` with ``symmetry`` on (the kit must drive every state).
    """
    from pagedstate.models.reference import PagedStateCheckpointCoordinator, UnitPool

    cfg = _config_of(config)
    _check_bounds(max_depth, max_states, mode, progress)
    _check_world_args(cfg, factory, pool_factory or UnitPool, mode)
    if not isinstance(check_drain, bool):
        raise TypeError(f"check_drain must be a bool, got {check_drain!r}")
    if (
        isinstance(progress_every_s, bool)
        or not isinstance(progress_every_s, (int, float))
        or not progress_every_s >= 0
    ):
        raise ValueError(f"progress_every_s must be a number >= 0, got {progress_every_s!r}")
    bound = cfg.max_depth if max_depth is None else max_depth
    t0 = time.perf_counter()
    rsink: set[tuple[str, int]] = set()
    ref = cfg.build(recording_reference(PagedStateCheckpointCoordinator))
    ref.coord.row_sink = rsink
    sut = follower_world(cfg, factory, pool_factory or UnitPool, mode=mode)
    asked = questions(cfg)

    def fail(w: FollowerWorld, what: str) -> ConformanceFailure:
        return ConformanceFailure(
            f"exhaustive ({cfg.name}, {sut.mode}): after the trace {list(w.trace)}: {what}"
        )

    first = ref.snapshot(), sut.snapshot()
    if first[0] != first[1]:
        raise fail(sut, "initial snapshots differ: " + "; ".join(first[0].diff(first[1])))
    _sweep(ref, sut, asked, first[1], fail)
    seen: set[Any] = {ref.key()}
    distinct, transitions, refused, depth_seen = 1, 0, 0, 0
    next_tick = time.perf_counter() + progress_every_s
    queue: deque[tuple[World, FollowerWorld, Any, int]] = deque([(ref, sut, ref.key(), 0)])
    current = sut
    cut = False  # max_states stopped the search
    if max_states is not None and distinct >= max_states:
        queue.clear()  # max_states=1: the initial state only
        cut = True
    try:
        while queue:
            rw, sw, key, depth = queue.popleft()
            if bound is not None and depth >= bound:
                continue
            current = sw
            before = sw.snapshot()
            for action in rw.actions():
                rn, sn = rw.clone(), sw.clone()
                current = sn
                transitions += 1
                r, rs, ss = _check_step(rn, sn, action, before, fail)
                if r[0] == "raised":
                    refused += 1
                    if rn.key() == key:
                        # Go on from the copies that refused: G8 says they are the state they
                        # were, and what a refusal left hidden shows in the actions after it.
                        rw, sw = rn, sn
                    continue
                nkey = rn.key()
                if nkey in seen:
                    continue
                seen.add(nkey)
                distinct += 1
                depth_seen = max(depth_seen, depth + 1)
                _check_state(rn, sn, rs, ss, asked, check_drain, fail)
                if bound is None or depth + 1 < bound:
                    queue.append((rn, sn, nkey, depth + 1))
                if max_states is not None and distinct >= max_states:
                    queue.clear()
                    cut = True
                    break
            now = time.perf_counter()
            if progress is not None and now >= next_tick:
                next_tick = now + progress_every_s
                progress(
                    f"exhaustive {cfg.name}: depth {depth}, {distinct:,} states,"
                    f" {transitions:,} transitions compared, {len(queue):,} queued,"
                    f" {now - t0:.0f} s"
                )
    except ConformanceFailure as exc:
        # A failure of a call that must not fail (snapshot(), clone(), ...): name the trace.
        if str(exc).startswith("exhaustive ("):
            raise
        raise fail(current, str(exc)) from exc
    seconds = time.perf_counter() - t0
    if progress is not None:
        progress(
            f"exhaustive {cfg.name} ({sut.mode}): {distinct:,} states to depth {depth_seen},"
            f" {transitions:,} transitions compared ({refused:,} refused), all agreeing,"
            f" {seconds:.1f} s" + (f" (stopped at max_states={max_states})" if cut else "")
        )
    return ExhaustiveReport(
        config=cfg.name,
        depth_bound=bound,
        mode=sut.mode,
        distinct=distinct,
        transitions=transitions,
        refused=refused,
        depth=depth_seen,
        seconds=seconds,
        rows=frozenset(rsink),
        complete=not cut,
    )


def _tupled(x: Any) -> Any:
    """``x`` with every list made a tuple (a trace's arguments read back from JSON)."""
    if isinstance(x, (list, tuple)):
        return tuple(_tupled(v) for v in x)
    return x


def replay_trace(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    *,
    config: Config | str,
    trace: Sequence[Action],
    mode: Mode = "auto",
    check_drain: bool = False,
) -> int:
    """Drive ``factory``'s coordinator along one ``trace`` beside the reference, with every
    check :func:`run_exhaustive` makes: each call's answer, the outcome and the snapshots
    after every step (a refusal leaving the store as it was), and in every state reached
    the snapshots' types, ``self_check()``, the environment's checks, the read-only
    questions and, with ``check_drain``, the drain to quiescence. The regression test of
    a failure :func:`run_exhaustive` printed: its message names the trace, which this
    replays exactly (``docs/conformance.md``, "Exhaustive mode", "Turning it into a
    regression test"). A ``crashed`` failure is chained to the store's own exception
    (``__cause__``: its traceback shows where it was raised).

    Args:
        factory, pool_factory, mode, check_drain: as :func:`run_exhaustive`.
        config: the configuration the trace was found on (a
            :class:`~pagedstate.models.world.Config` or the name of one).
        trace: ``[(action, args), ...]`` from the initial state, as a failure names it
            (the explorer's actions, :meth:`World.act
            <pagedstate.models.world.World.act>`); each must be enabled in the state the
            steps before it reach. Lists are taken for tuples (a trace read back from
            JSON: ``[["checkpoint", [0, 1]], ...]``).

    Returns:
        The number of steps replayed (``len(trace)``), every one agreeing.

    Raises:
        ConformanceFailure: the first disagreement, naming the trace up to it.
        ValueError: a step is not an ``(action name, args tuple)`` pair, or an action the
            reference world does not offer in that state (the trace is of another
            configuration, or edited); nothing of that step is run. Also as
            :func:`run_exhaustive` (``mode``).
        KeyError, TypeError: as :func:`run_exhaustive` (``config``, the factories).
    """
    from pagedstate.models.reference import PagedStateCheckpointCoordinator, UnitPool

    cfg = _config_of(config)
    _check_bounds(None, None, mode, None)
    _check_world_args(cfg, factory, pool_factory or UnitPool, mode)
    if not isinstance(check_drain, bool):
        raise TypeError(f"check_drain must be a bool, got {check_drain!r}")
    steps = list(trace) if isinstance(trace, (list, tuple)) else None
    if steps is None:
        raise ValueError(f"trace must be a list or tuple of (action, args) pairs, got {trace!r}")
    for i, step in enumerate(steps):
        if not (
            isinstance(step, (tuple, list))
            and len(step) == 2
            and isinstance(step[0], str)
            and isinstance(step[1], (tuple, list))
        ):
            raise ValueError(f"step {i} of the trace is not an (action, args) pair: {step!r}")
        steps[i] = (step[0], _tupled(step[1]))
    ref = cfg.build(recording_reference(PagedStateCheckpointCoordinator))
    sut = follower_world(cfg, factory, pool_factory or UnitPool, mode=mode)
    asked = questions(cfg)

    def fail(w: FollowerWorld, what: str) -> ConformanceFailure:
        return ConformanceFailure(
            f"replay ({cfg.name}, {sut.mode}): after the trace {list(w.trace)}: {what}"
        )

    try:
        rs, ss = ref.snapshot(), sut.snapshot()
        if rs != ss:
            raise fail(sut, "initial snapshots differ: " + "; ".join(rs.diff(ss)))
        _check_state(ref, sut, rs, ss, asked, check_drain, fail)
        for i, action in enumerate(steps):
            if action not in ref.actions():
                raise ValueError(
                    f"step {i} of the trace, {action!r}, is not an action of config"
                    f" {cfg.name!r} in the state the steps before it reach"
                )
            r, rs, ss = _check_step(ref, sut, action, ss, fail)
            if r[0] != "raised":
                _check_state(ref, sut, rs, ss, asked, check_drain, fail)
    except ConformanceFailure as exc:
        if str(exc).startswith("replay ("):
            raise
        raise fail(sut, str(exc)) from exc
    return len(steps)


#: The kit's standard exhaustive sweep, ``(configuration, depth bound)`` in order, about 8.5
#: minutes in all for the production store on one core of a 2-core machine (figures in
#: ``docs/conformance.md``): ``default`` (the synchronous style with every feature on: KV
#: pressure, the CPU tier, leases, a transfer, scratch, suspends, one completion token),
#: ``overlap`` (boundaries and drains naming forwards, restores for a sequence and into
#: scratch slots, two tokens) and ``tiny`` with two completion tokens outstanding (tokens
#: done out of order and settled, in the synchronous style).
EXHAUSTIVE_PLAN: tuple[tuple[Config, int], ...] = (
    (CONFIGS["default"], 9),
    (CONFIGS["overlap"], 7),
    (attrs.evolve(CONFIGS["tiny"], name="tiny-tokens", completions=2), 8),
)


def run_exhaustive_plan(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    *,
    plan: Sequence[tuple[Config, int]] | None = None,
    mode: Mode = "auto",
    max_states: int | None = None,
    progress: Callable[[str], None] | None = _stderr,
) -> list[ExhaustiveReport]:
    """:func:`run_exhaustive` over each ``(configuration, depth bound)`` of ``plan`` in
    turn (default :data:`EXHAUSTIVE_PLAN`: ``default`` to depth 9, ``overlap`` to 7, ``tiny``
    with two completion tokens to 8; about nine minutes for :mod:`pagedstate.impl`); stops at
    the first failure.

    Args:
        factory, pool_factory: as :func:`run_exhaustive`.
        plan: ``(Config, depth bound)`` pairs, run in order (``None``:
            :data:`EXHAUSTIVE_PLAN`); every entry is checked before the first runs.
        mode, max_states, progress: passed to each :func:`run_exhaustive` (``check_drain``
            is off).

    Returns:
        One report per configuration, in plan order.

    Raises:
        ConformanceFailure: as :func:`run_exhaustive`.
        TypeError, ValueError: as :func:`run_exhaustive`, or an entry of ``plan`` is not a
            ``(Config, int >= 1)`` pair; raised before any configuration runs.
    """
    entries: list[tuple[Config, int]] = []
    for entry in EXHAUSTIVE_PLAN if plan is None else tuple(plan):
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise ValueError(f"a plan entry must be a (Config, depth bound) pair, got {entry!r}")
        if entry[1] is None:
            raise ValueError(f"a plan entry's depth bound must be an int >= 1, got {entry!r}")
        _check_bounds(entry[1], max_states, mode, progress)
        entries.append((_config_of(entry[0]), entry[1]))
    _check_bounds(None, max_states, mode, progress)
    for cfg, _ in entries[:1] or [(CONFIGS["tiny"], 1)]:
        _check_world_args(cfg, factory, pool_factory or _reference_pool(), mode)
    return [
        run_exhaustive(
            factory,
            pool_factory,
            config=cfg,
            max_depth=depth,
            mode=mode,
            max_states=max_states,
            progress=progress,
        )
        for cfg, depth in entries
    ]


def _reference_pool() -> PoolFactory:
    from pagedstate.models.reference import UnitPool

    return UnitPool
