"""The kit's exhaustive mode: every reachable state of a bounded configuration, each call
compared (SPEC H.4, as the project's own exhaustive test runs its production store).

:func:`run_exhaustive` runs the explorer's breadth-first search
(:mod:`pagedstate.models.explorer`: same configurations, same action order, same canonical
key, the same depth bound) over two worlds at once: the reference world, which decides
which actions are enabled and which states are new, and a *follower* world whose
coordinator and pool come from the engine's factories. Every node carries both, so the
store under test is driven through exactly the shortest trace the explorer found for each
state. For **every generated transition** (not only those reaching a new state):

- both must return equal values, or raise the same exception class, and a refused call must
  leave the store under test's snapshot unchanged (SPEC G8);
- the two snapshots must be equal (the failure names every differing field);
- and on every new state, the store under test's own ``self_check()`` (when it has one) and
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

    report = run_exhaustive(MyCoordinator, pool_factory=MyPool, config="default", max_depth=8)
    print(report.distinct, report.transitions)

Measured sizes and times are in ``docs/conformance.md`` ("Exhaustive mode").
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import attrs

from pagedstate.models.explorer import CONFIGS
from pagedstate.models.world import (
    KV_OWNER,
    Action,
    Config,
    World,
    make_drain_call,
    quiescence_problems,
)
from pagedstate.spec.errors import PagedStateError
from pagedstate.spec.snapshot import Snapshot
from pagedstate.spec.types import CHECKPOINT_OWNER

from .config import ConformanceFailure, CoordinatorFactory, PoolFactory, _pool_of

__all__ = [
    "EXHAUSTIVE_PLAN",
    "ExhaustiveReport",
    "follower_world",
    "run_exhaustive",
    "run_exhaustive_plan",
]

Mode = Literal["auto", "clone", "replay"]


# -- the acting follower world: what shared tokens and clocks read -------------------------


class _Acting:
    """The follower world now calling its store (None between calls)."""

    world: FollowerWorld | None = None


_ACTING = _Acting()


def _acting() -> FollowerWorld:
    w = _ACTING.world
    if w is None:
        raise ConformanceFailure(
            "the store under test read its clock or a completion token outside a call"
            " (the kit's tokens and clock answer only while one of its calls runs)"
        )
    return w


@contextmanager
def _as(world: FollowerWorld) -> Iterator[None]:
    prev = _ACTING.world
    _ACTING.world = world
    try:
        yield
    finally:
        _ACTING.world = prev


class KitToken:
    """A completion token (SPEC D.13) whose done flag belongs to the acting follower world:
    ``query()``/``done`` read it, ``set()``/``synchronize()`` set it there. Copies of a
    store that share the token therefore see each copy's own flag."""

    __slots__ = ("tid",)

    def __init__(self, tid: int) -> None:
        self.tid = tid

    @property
    def done(self) -> bool:
        return self.tid in _acting().done_ids

    def set(self) -> None:
        w = _acting()
        w.done_ids = w.done_ids | {self.tid}

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.set()

    def __repr__(self) -> str:
        return f"KitToken({self.tid})"


class _KitClock:
    """The clock given to the store under test: the acting follower world's time (s)."""

    __slots__ = ()

    def __call__(self) -> float:
        return _acting().now

    @property
    def now(self) -> float:
        return _acting().now

    @now.setter
    def now(self, value: float) -> None:
        _acting().now = value


_CLOCK = _KitClock()


class FollowerWorld(World):
    """A :class:`~pagedstate.models.world.World` over a store under test, read through its
    public API (see the module docstring). Built by :func:`follower_world`."""

    factory: CoordinatorFactory
    pool_factory: PoolFactory
    mode: Mode
    trace: tuple[Action, ...]
    done_ids: frozenset[int]
    now: float
    next_token: int

    # World hooks ---------------------------------------------------------------------

    def _new_clock(self) -> Any:
        return _CLOCK

    def _pool_of(self, coord: Any, given: Any) -> Any:
        return _pool_of(coord, given)

    def _new_token(self) -> Any:
        self.next_token += 1
        return KitToken(self.next_token)

    def _records(self) -> Any:
        return self.coord.snapshot().records

    def _live_offload_ops(self) -> Any:
        return self.coord.snapshot().offload_pins

    # calls -----------------------------------------------------------------------------

    def act(self, name: str, *args: Any) -> Any:
        with _as(self):
            try:
                return super().act(name, *args)
            finally:
                self.trace = (*self.trace, (name, args))

    def snapshot(self) -> Snapshot:
        with _as(self):
            return self.coord.snapshot()

    def clone(self) -> FollowerWorld:
        if self.mode == "replay":
            return self._replayed()
        w = FollowerWorld.__new__(FollowerWorld)
        w.__dict__.update(self.__dict__)
        with _as(self):
            w.coord = self.coord.clone()
        w.pool = _pool_of(w.coord, None)
        if w.pool is None:
            raise ConformanceFailure(
                "mode='clone': the clone's pool is not reachable as coordinator.pool or"
                " coordinator.store.pool; use mode='replay'"
            )
        w.kv_held = dict(self.kv_held)
        w.leases = list(self.leases)
        w.ops = list(self.ops)
        w.owners = list(self.owners)
        w.scratch_res = list(self.scratch_res)
        return w

    def _replayed(self) -> FollowerWorld:
        w = follower_world(self.config, self.factory, self.pool_factory, mode="replay")
        for name, args in self.trace:
            try:
                w.act(name, *args)
            except PagedStateError:
                pass  # refused when first taken too (compared then): G8 left it unchanged
        return w

    def problems(self) -> list[str]:
        """:meth:`World.problems`, read off the store under test's snapshot."""
        with _as(self):
            snap = self.coord.snapshot()
            return _problems(self, snap)

    def drain_problems(self, memo: dict[Any, bool] | None = None) -> list[str]:
        """:meth:`World.drain_problems` (never memoised: the key reads the reference's
        internals)."""
        del memo
        w = self.clone()
        calls = w.quiescence_calls()
        with _as(w):
            try:
                for name, args in calls:
                    make_drain_call(w.coord, w.pool, name, args)
                if self.config.completions:
                    w.coord.settle_completions(wait=True)
            except PagedStateError as exc:
                return [f"the drain raised {type(exc).__name__}: {exc}"]
            s = w.coord.snapshot()
        out = quiescence_problems(s)
        if s.completions:
            out.append(f"drain left completions {s.completions!r}")
        return out

    def self_check(self) -> list[str]:
        """The store under test's own ``self_check()`` (``[]`` when it has none)."""
        check = getattr(self.coord, "self_check", None)
        if not callable(check):
            return []
        with _as(self):
            return list(check())


def follower_world(
    config: Config,
    factory: CoordinatorFactory,
    pool_factory: PoolFactory,
    *,
    mode: Mode = "auto",
) -> FollowerWorld:
    """A follower world over ``factory``'s coordinator in its initial state.

    Raises:
        ValueError: ``mode`` is not ``"auto"``, ``"clone"`` or ``"replay"``.
    """
    if mode not in ("auto", "clone", "replay"):
        raise ValueError(f"mode must be 'auto', 'clone' or 'replay', got {mode!r}")
    w = FollowerWorld.__new__(FollowerWorld)
    w.factory, w.pool_factory = factory, pool_factory
    w.trace, w.done_ids, w.now, w.next_token = (), frozenset(), 0.0, 0
    w.mode = mode
    with _as(w):
        World.__init__(w, config, factory, pool_factory)
    if mode == "auto":
        w.mode = "clone" if callable(getattr(w.coord, "clone", None)) else "replay"
    return w


def _problems(w: World, snap: Snapshot) -> list[str]:
    """The environment's checks of :meth:`World.problems`, from a snapshot only."""
    out = list(w.alarms)
    if w.config.forwards:
        index: dict[Any, int] = {id(s): s.index for s in w.seqs}
        named = dict(snap.boundary_forwards)
        seen = {index.get(k, -1): (h, named.get(k)) for k, h in snap.pending_boundaries}
        if seen != w.filed:
            out.append(
                f"pending boundaries (sequence: (hash, forward)) are {seen}, but the"
                f" environment filed {w.filed}"
            )
    records = snap.records
    for token, cids in w.tokens:
        if token.done:
            continue
        for cid in cids:
            rec = records.get(cid)
            if rec is not None and rec.settled:
                out.append(f"checkpoint {cid} is settled, but its completion token is not done")
    for op in w.ops:
        if op not in snap.offload_pins:
            out.append(f"the environment still holds {op} but the store dropped it")
    suspended = {lease_id for lease_id, _slot, _cid in snap.suspended}
    for lease in w.leases:
        if lease.lease_id not in suspended:
            out.append(f"suspended-restore lease {lease.lease_id} is no longer live")
    for owner in w.owners:
        if owner not in snap.transfers:
            out.append(f"transfer reservation {owner!r} vanished")
    for slot, _pos, _h in w.scratch_res:
        if slot not in snap.scratch_reserved:
            out.append(f"scratch reservation of slot {slot} vanished")
    tags = snap.tags
    for units in w.in_flight_units:
        tag = tags.get(units[0])
        owner = tag[0] if tag is not None else None
        if tag is None or not (
            isinstance(owner, tuple)
            and owner[0] == CHECKPOINT_OWNER
            and owner[1] in records
            and records[owner[1]].unit_ids == units
        ):
            out.append(
                f"units {units} are read or written by an in-flight copy but belong to {tag!r}"
            )
    for k, held in w.kv_held.items():
        for piece, u in enumerate(held):
            if tags.get(u) != ((KV_OWNER, k), piece):
                out.append(f"KV unit {u} of tenant {k} is {tags.get(u)!r}")
    return out


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
        rows: ``(machine, row)`` of the tables the reference took.
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


def _call(world: World, action: Action, *, under_test: bool = False) -> tuple[str, Any]:
    """``("ok", value)`` or ``("raised", error class)`` for a refusal (a
    :class:`~pagedstate.spec.errors.PagedStateError`); on the store under test any other
    exception is ``("crashed", repr)``, which never equals the reference's outcome."""
    name, args = action
    try:
        return "ok", world.act(name, *args)
    except PagedStateError as exc:
        return "raised", type(exc)
    except Exception as exc:
        if not under_test:
            raise
        return "crashed", f"{type(exc).__name__}: {exc}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
            explorer's (``tiny``, ``default``, ``wide``, ``overlap``, ...).
        max_depth: the depth bound (actions from the initial state); default the
            configuration's own ``max_depth``.
        mode: ``"clone"``, ``"replay"`` or ``"auto"`` (see the module docstring).
        check_drain: also drive a copy of every new state of the store under test to
            quiescence and require every unit back (about twice the time).
        max_states: stop after this many distinct states (a smoke run); ``None``: no limit.
        progress: called with a line of progress about every ``progress_every_s`` seconds
            and at the end (default: printed to stderr); ``None`` for silence.
        progress_every_s: seconds between progress lines.

    Returns:
        The coverage (:class:`ExhaustiveReport`).

    Raises:
        ConformanceFailure (an AssertionError): the first disagreement; the message names
            the trace from the initial state (``[(action, args), ...]``, the explorer's
            actions, :meth:`World.act <pagedstate.models.world.World.act>`), the call and
            both outcomes or the differing snapshot fields.
        KeyError: ``config`` names no configuration.
        ValueError: a bad ``mode``, ``max_depth`` or ``max_states``.
    """
    from pagedstate.models.reference import UnitPool

    if isinstance(config, str):
        if config not in CONFIGS:
            raise KeyError(f"no configuration {config!r}; known: {', '.join(CONFIGS)}")
        cfg = CONFIGS[config]
    else:
        cfg = config
    for label, value in (("max_depth", max_depth), ("max_states", max_states)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(f"{label} must be an int >= 1 or None, got {value!r}")
    if (
        isinstance(progress_every_s, bool)
        or not isinstance(progress_every_s, (int, float))
        or not progress_every_s >= 0
    ):
        raise ValueError(f"progress_every_s must be a number >= 0, got {progress_every_s!r}")
    bound = cfg.max_depth if max_depth is None else max_depth
    t0 = time.perf_counter()
    rsink: set[tuple[str, int]] = set()
    ref = cfg.build()
    ref.coord.row_sink = rsink
    sut = follower_world(cfg, factory, pool_factory or UnitPool, mode=mode)
    parents: dict[Any, tuple[Any, Action] | None] = {ref.key(): None}

    def trace(key: Any, last: Action | None = None) -> list[Action]:
        steps = [] if last is None else [last]
        while (entry := parents[key]) is not None:
            key, act = entry
            steps.append(act)
        return steps[::-1]

    def fail(key: Any, action: Action | None, what: str) -> ConformanceFailure:
        return ConformanceFailure(
            f"exhaustive ({cfg.name}, {sut.mode}): after the trace {trace(key, action)}: {what}"
        )

    first = ref.snapshot(), sut.snapshot()
    if first[0] != first[1]:
        raise fail(
            ref.key(), None, "initial snapshots differ: " + "; ".join(first[0].diff(first[1]))
        )
    distinct, transitions, refused, depth_seen = 1, 0, 0, 0
    next_tick = time.perf_counter() + progress_every_s
    queue: deque[tuple[World, FollowerWorld, Any, int]] = deque([(ref, sut, ref.key(), 0)])
    while queue:
        rw, sw, key, depth = queue.popleft()
        if bound is not None and depth >= bound:
            continue
        before = sw.snapshot()
        for action in rw.actions():
            rn, sn = rw.clone(), sw.clone()
            r, s = _call(rn, action), _call(sn, action, under_test=True)
            transitions += 1
            rs, ss = rn.snapshot(), sn.snapshot()
            if r != s:
                raise fail(
                    key,
                    action,
                    f"results differ: the reference {r[0]} {r[1]!r}, the store under test"
                    f" {s[0]} {s[1]!r}",
                )
            if rs != ss:
                raise fail(key, action, "snapshots differ: " + "; ".join(rs.diff(ss)))
            if r[0] == "raised":
                refused += 1
                if ss != before:
                    raise fail(key, action, f"refused ({r[1].__name__}) but its snapshot changed")
                continue
            nkey = rn.key()
            if nkey in parents:
                continue
            parents[nkey] = (key, action)
            distinct += 1
            depth_seen = max(depth_seen, depth + 1)
            found = sn.self_check()
            if found:
                raise fail(key, action, "its own self_check reports: " + "; ".join(found))
            found = sn.problems()
            if found:
                raise fail(key, action, "the environment's checks: " + "; ".join(found))
            if check_drain:
                found = sn.drain_problems()
                if found:
                    raise fail(key, action, "driven to quiescence: " + "; ".join(found))
            if bound is None or depth + 1 < bound:
                queue.append((rn, sn, nkey, depth + 1))
            if max_states is not None and distinct >= max_states:
                queue.clear()
                break
        now = time.perf_counter()
        if progress is not None and now >= next_tick:
            next_tick = now + progress_every_s
            progress(
                f"exhaustive {cfg.name}: depth {depth}, {distinct:,} states,"
                f" {transitions:,} transitions compared, {len(queue):,} queued,"
                f" {now - t0:.0f} s"
            )
    seconds = time.perf_counter() - t0
    if progress is not None:
        progress(
            f"exhaustive {cfg.name} ({sut.mode}): {distinct:,} states to depth {depth_seen},"
            f" {transitions:,} transitions compared ({refused:,} refused), all agreeing,"
            f" {seconds:.1f} s"
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
    )


#: The kit's standard exhaustive sweep, ``(configuration, depth bound)`` in order, about six
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
    plan: tuple[tuple[Config, int], ...] = EXHAUSTIVE_PLAN,
    mode: Mode = "auto",
    max_states: int | None = None,
    progress: Callable[[str], None] | None = _stderr,
) -> list[ExhaustiveReport]:
    """:func:`run_exhaustive` over each ``(configuration, depth bound)`` of ``plan`` in
    turn (default :data:`EXHAUSTIVE_PLAN`); stops at the first failure.

    Returns:
        One report per configuration, in plan order.

    Raises:
        ConformanceFailure: as :func:`run_exhaustive`.
        ValueError: as :func:`run_exhaustive`.
    """
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
        for cfg, depth in plan
    ]
