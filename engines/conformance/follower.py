"""The kit's follower world (:func:`follower_world`): a :class:`~pagedstate.models.world.World`
whose coordinator and pool come from the engine's factories, read through their public API
only, with the completion tokens and the clock the store under test is given (they answer
for whichever follower world is acting, so copies of a store may share them), and the
environment's checks read off the store under test's snapshot. The exhaustive mode
(:mod:`pagedstate.engines.conformance.exhaustive`) drives one beside the reference world."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, cast

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
from .observe import Observed

__all__ = ["FollowerWorld", "KitToken", "follower_world"]

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
    """While the store under test is called for ``world``: its tokens and clock answer
    for ``world``, and the sequences it was given must come back as they were (a write is
    undone and reported as a :class:`ConformanceFailure`)."""
    prev = _ACTING.world
    _ACTING.world = world
    seqs = getattr(world, "seqs", ())
    seen = _seq_fields(seqs)
    try:
        yield
    finally:
        _ACTING.world = prev
        written = _undo_writes(seqs, seen)
        if written:
            raise ConformanceFailure(
                f"the store under test wrote a sequence it was given (undone): {written}"
            )


def _seq_fields(seqs: Any) -> list[tuple[int, bool]]:
    return [(q.state_slot, q.has_per_req_cache) for q in seqs]


def _undo_writes(seqs: Any, seen: list[tuple[int, bool]]) -> str:
    """Put back the fields of ``seqs`` that changed since ``seen``; what changed ("" if
    nothing did)."""
    now = _seq_fields(seqs)
    if now == seen:
        return ""
    for q, (slot, cache) in zip(seqs, seen, strict=True):
        q.state_slot, q.has_per_req_cache = slot, cache
    return "; ".join(
        f"{q!r}: (state_slot, has_per_req_cache) {a} -> {b}"
        for q, a, b in zip(seqs, seen, now, strict=True)
        if a != b
    )


@contextmanager
def _calling(world: FollowerWorld, what: str) -> Iterator[None]:
    """:func:`_as`, for a call that must not fail (``snapshot()``, ``clone()``,
    ``self_check()``, a drain step): any exception of the store under test becomes a
    :class:`ConformanceFailure` naming the call."""
    try:
        with _as(world):
            yield
    except ConformanceFailure:
        raise
    except Exception as exc:
        raise ConformanceFailure(
            f"the store under test's {what} raised {type(exc).__name__}: {exc}"
        ) from exc


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
        with _calling(self, "snapshot()"):
            snap = self.coord.snapshot()
        if type(snap) is not Snapshot:  # a subclass could redefine equality
            raise ConformanceFailure(
                f"snapshot() of the store under test returned a {type(snap).__qualname__},"
                " not a pagedstate.spec.snapshot.Snapshot"
            )
        return snap

    def clone(self) -> FollowerWorld:
        if self.mode == "replay":
            return self._replayed()
        w = FollowerWorld.__new__(FollowerWorld)
        w.__dict__.update(self.__dict__)
        with _calling(self, "clone()"):
            w.coord = cast(Any, Observed(self.coord.clone()))
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
        with _calling(w, "drain to quiescence"):
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
        with _calling(self, "self_check()"):
            found = check()
        if not isinstance(found, (list, tuple)):
            return [f"self_check() returned {found!r}, not a list of problems"]
        return list(found)


def follower_world(
    config: Config,
    factory: CoordinatorFactory,
    pool_factory: PoolFactory,
    *,
    mode: Mode = "auto",
) -> FollowerWorld:
    """A follower world over ``factory``'s coordinator in its initial state.

    Its ``coord`` is the store under test's coordinator behind an
    :class:`~pagedstate.engines.conformance.observe.Observed` proxy.

    Raises:
        TypeError: ``config`` is not a :class:`~pagedstate.models.world.Config`, or a
            factory is not callable.
        ValueError: ``mode`` is not ``"auto"``, ``"clone"`` or ``"replay"``, or it is
            ``"clone"`` and the coordinator has no ``clone`` method.
    """
    _check_world_args(config, factory, pool_factory, mode)
    w = FollowerWorld.__new__(FollowerWorld)
    w.factory, w.pool_factory = factory, pool_factory
    w.trace, w.done_ids, w.now, w.next_token = (), frozenset(), 0.0, 0
    w.mode = mode
    with _as(w):
        World.__init__(w, config, _observed(factory), pool_factory)
    has_clone = callable(getattr(w.coord, "clone", None))
    if mode == "auto":
        w.mode = "clone" if has_clone else "replay"
    elif mode == "clone" and not has_clone:
        raise ValueError(
            f"mode='clone': the coordinator ({type(cast(Any, w.coord).target).__qualname__})"
            " has no clone() method; use mode='replay' (or 'auto')"
        )
    return w


def _observed(factory: CoordinatorFactory) -> Callable[..., Any]:
    """``factory``, its coordinators behind an :class:`Observed` proxy."""

    def build(*args: Any, **kwargs: Any) -> Any:
        return Observed(factory(*args, **kwargs))

    return build


def _check_world_args(config: Any, factory: Any, pool_factory: Any, mode: Any) -> None:
    if not isinstance(config, Config):
        raise TypeError(f"config must be a pagedstate.models.world.Config, got {config!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable (a coordinator factory), got {factory!r}")
    if not callable(pool_factory):
        raise TypeError(f"pool_factory must be callable, got {pool_factory!r}")
    if not isinstance(mode, str) or mode not in ("auto", "clone", "replay"):
        raise ValueError(f"mode must be 'auto', 'clone' or 'replay', got {mode!r}")


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
