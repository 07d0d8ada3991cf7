"""The pool's split owner counts, the transfer-adoption guard and the bench's relabelled
``unindex`` timings: inputs that broke them (each test failed before its fix).

Pool: two owners are the same when of the same kind and equal (a checkpoint's tag: the same
id) (SPEC A.3, G9). An object that only compares equal to a store owner's tag without being
a 2-tuple is another owner, on both models and for the snapshot's ``tag_bijection``: it
neither shares the store owner's count nor names its units. An engine's ``NamedTuple`` owner
shaped like a store
owner is a store owner on the fast path too. A NaN owner releases what it reserved on the
reference as on the production pool. The undo of a reservation whose callback raised puts
the vacant heap back as it was, array and all.

Stores: the coordinator's permission to adopt its own transfer reservation serves that one
call: code the adoption runs (an int subclass's ``__hash__``, an owner's) cannot adopt
another reservation behind the coordinator's back.

Bench: a method the timer relabelled every call of (all ``unindex`` calls dropped
something) has an id but no timings; the paired fastest-of-N fold skips it.
"""

from __future__ import annotations

import copy
from array import array
from typing import Any, NamedTuple

import pytest
from conftest import spec

from pagedstate import impl as I
from pagedstate.models import bench
from pagedstate.models import reference as R
from pagedstate.models.replay.engine import UNINDEX_DROP, UNINDEX_MISS, CallTimer, EngineResult
from pagedstate.spec import (
    EvictionCallbackError,
    InvalidArgumentError,
    PagedStateError,
    StoreOwnedUnitsError,
    WrongOwnerError,
    check_invariants,
)
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

MODELS = [pytest.param(R, id="reference"), pytest.param(I, id="impl")]


class Tag(NamedTuple):
    kind: str
    ident: Any


class Alias:
    """An owner equal to (and hashing as) a tuple, without being one."""

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return bool(self.key == (other.key if isinstance(other, Alias) else other))

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Alias({self.key!r})"


def _state(pool: Any) -> Any:
    return copy.deepcopy(
        {k: v for k, v in vars(pool).items() if k not in ("on_evict", "_store_access", "_deferral")}
    )


def _refused(pool: Any, call: Any, error: type[Exception]) -> PagedStateError:
    before = _state(pool)
    with pytest.raises(error) as info:
        call()
    assert _state(pool) == before
    return info.value  # type: ignore[return-value]


@pytest.mark.parametrize("models", MODELS)
def test_a_namedtuple_shaped_like_a_store_owner_is_refused_on_the_fast_path(models: Any) -> None:
    """The fast path of release_units recognised store owners by exact tuple type only: an
    engine's NamedTuple ``Tag("state-checkpoint", cid)`` released a live checkpoint image
    (SPEC A.3) that the slow path and the reference refuse."""
    pool = models.UnitPool(6)
    with pool._as_store():
        ckpt = pool.reserve_units(2, (CHECKPOINT_OWNER, 7))
        xfer = pool.reserve_units(2, (TRANSFER_OWNER, ("load", 0)))
    _refused(pool, lambda: pool.release_units(ckpt, Tag(CHECKPOINT_OWNER, 7)), StoreOwnedUnitsError)
    load = Tag(TRANSFER_OWNER, ("load", 0))
    _refused(pool, lambda: pool.release_units(xfer, load), StoreOwnedUnitsError)
    _refused(pool, lambda: pool.release_units([], Tag(TRANSFER_OWNER, 1)), StoreOwnedUnitsError)
    with pool._as_store():
        pool.release_units(ckpt, Tag(CHECKPOINT_OWNER, 7))  # the store may: the same owner
    assert pool.num_free == 4


@pytest.mark.parametrize("models", MODELS)
def test_an_alias_of_a_checkpoint_owner_is_another_owner(models: Any) -> None:
    """``Alias(("state-checkpoint", 1))`` equals the checkpoint's tag but is an engine owner:
    it reserves alongside it (production counted it apart already; the reference called it
    the same owner), and it cannot name the checkpoint's units, not even when its own count
    matches theirs (production then freed the image and left both counts wrong)."""
    pool = models.UnitPool(6)
    mine = (CHECKPOINT_OWNER, 1)
    with pool._as_store():
        ckpt = pool.reserve_units(2, mine)
    alias = Alias(mine)
    own = pool.reserve_units(2, alias)
    assert own == [2, 3]
    _refused(pool, lambda: pool.release_units(ckpt, alias), WrongOwnerError)
    _refused(pool, lambda: pool.rekey_units(ckpt, alias, ("kv", 9)), WrongOwnerError)
    with pool._as_store():
        _refused(pool, lambda: pool.release_units(own, mine), WrongOwnerError)
    pool.release_units(own, alias)
    with pool._as_store():
        pool.release_units(ckpt, mine)
    assert pool.num_free == 6 and pool.dirty_units() == frozenset(ckpt)


@pytest.mark.parametrize("models", MODELS)
def test_an_alias_of_a_transfer_owner_neither_frees_nor_adopts_its_units(models: Any) -> None:
    """An owner equal to a transfer reservation's tag is not the coordinator: the pool does
    not free the units for it and the store does not adopt them from it (either left the
    coordinator naming units it no longer held: tag_bijection)."""
    c = models.PagedStateCheckpointCoordinator(models.UnitPool(20), spec(10, 25), True)
    units = c.reserve_transfer_units(("load", 0))
    alias = Alias((TRANSFER_OWNER, ("load", 0)))
    snap = c.snapshot()
    with pytest.raises(WrongOwnerError):
        c.pool.release_units(list(units), alias)
    with pytest.raises(WrongOwnerError):
        c.store.adopt_units(units, alias, 5)
    assert c.snapshot() == snap and check_invariants(snap) == []
    assert c.pool.owner_of(units[0]) == ((TRANSFER_OWNER, ("load", 0)), 0)
    assert c.adopt_transfer_units(("load", 0), 5) is True
    assert check_invariants(c.snapshot()) == []
    # nor does an engine's alias hold the coordinator's owner: its reservation goes ahead
    # (it was refused, "already holds units", after ensure_free_units had run)
    kv = c.pool.reserve_units(2, Alias((TRANSFER_OWNER, ("load", 1))))
    assert kv is not None
    assert c.reserve_transfer_units(("load", 1)) is not None
    assert check_invariants(c.snapshot()) == []


@pytest.mark.parametrize("models", MODELS)
def test_a_nan_owner_releases_what_it_reserved(models: Any) -> None:
    """Owners are told apart as dict keys are (the same object, or equal): a NaN owner holds
    its units and releases them, and cannot reserve twice (the reference counted by ``==``
    alone, so NaN held nothing)."""
    nan = float("nan")
    pool = models.UnitPool(4)
    units = pool.reserve_units(2, nan)
    with pytest.raises(InvalidArgumentError, match="already holds"):
        pool.reserve_units(1, nan)
    pool.release_units(units, nan)
    with pool._as_store():
        units = pool.reserve_units(2, (CHECKPOINT_OWNER, nan))
        pool.rekey_units(units, (CHECKPOINT_OWNER, nan), ("kv", nan))
    pool.release_units(units, ("kv", nan))
    assert pool.num_free == 4


def test_the_undo_of_a_reservation_restores_the_vacant_heap_as_it_was() -> None:
    """SPEC G8 compares every structure: the vacant heap is an array, and pushing the units
    back one by one rebuilt it in another order (same units, different array)."""
    pool = I.UnitPool(8)
    kv = pool.reserve_units(8, ("kv", 0))
    assert kv is not None
    pool.cache_units(kv, ("kv", 0), [None, 11, None, 12, None, None, None, None])
    pool.release_units(pool.reserve_units(1, ("kv", 1)), ("kv", 1))  # reorders the heap
    assert pool._ext.heap != sorted(pool._ext.heap)

    def refuse(h: int) -> None:
        raise RuntimeError(h)

    pool.on_evict = refuse
    before = _state(pool)
    with pytest.raises(EvictionCallbackError) as info:
        pool.reserve_units(8, ("kv", 2))
    assert info.value.undone and _state(pool) == before


@pytest.mark.parametrize("models", MODELS)
def test_the_adoption_grant_serves_only_the_coordinators_own_call(models: Any) -> None:
    """The coordinator raised a depth counter around its adopt_units call, so code the call
    ran (here an int subclass's ``__hash__``, hashed by the store's index) could adopt
    another transfer reservation through the store, leaving the coordinator naming units a
    checkpoint owned. The grant is now spent by the call it was given for."""
    c = models.PagedStateCheckpointCoordinator(models.UnitPool(20), spec(10, 25), True)
    c.reserve_transfer_units(("a", 0))
    b = c.reserve_transfer_units(("b", 0))
    seen: list[Any] = []

    class Sneaky(int):
        def __hash__(self) -> int:
            if not seen:
                try:
                    seen.append(c.store.adopt_units(b, (TRANSFER_OWNER, ("b", 0)), 777))
                except PagedStateError as exc:
                    seen.append(type(exc))
            return int.__hash__(self)

        def __eq__(self, other: object) -> bool:
            return int.__eq__(self, other)

    assert c.adopt_transfer_units(("a", 0), Sneaky(555)) is True
    assert seen == [StoreOwnedUnitsError]
    assert check_invariants(c.snapshot()) == []
    assert c.pool.owner_of(b[0]) == ((TRANSFER_OWNER, ("b", 0)), 0)
    with pytest.raises(StoreOwnedUnitsError):  # and nothing is left granted
        c.store.adopt_units(b, (TRANSFER_OWNER, ("b", 0)), 777)
    assert c.adopt_transfer_units(("b", 0), 777) is True
    assert check_invariants(c.snapshot()) == []


def test_paired_replays_keep_a_method_every_call_of_which_was_relabelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every ``unindex`` of a replay dropped something: the timer relabelled each call and
    dropped the ``unindex (found nothing)`` total, but its method id stays in ``methods``. The
    paired fold read a total for every id and raised KeyError."""
    timers = []
    for _ in range(2):
        t = CallTimer(keep_samples=True)
        t.call("checkpoint", lambda: None)
        t.call(UNINDEX_MISS, lambda: None)
        t.relabel_last(UNINDEX_MISS, UNINDEX_DROP)
        t.call("checkpoint", lambda: None)
        timers.append(t)
    assert UNINDEX_MISS in timers[0].methods and UNINDEX_MISS not in timers[0].timings

    class FakeEngine:
        made = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.timer = timers[FakeEngine.made]
            FakeEngine.made += 1

        def run(self, disable_gc: bool = False) -> EngineResult:
            t = self.timer
            return EngineResult(
                impl="fake",
                config=None,  # type: ignore[arg-type]
                requests=0,
                counters={},
                fates={},
                timings={k: list(v) for k, v in t.timings.items()},
                work={},
                wall_s=1.0,
                cpu_s=1.0,
                prepopulated=0,
                running_at_end=0,
                samples=array("q", t.samples),
                sample_methods=array("H", t.sample_methods),
                methods=list(t.methods),
            )

    monkeypatch.setattr(bench.measure, "Engine", FakeEngine)  # where _replay runs
    r = bench._replay(R, None, [], repeat=2)  # type: ignore[arg-type]
    assert r.extra["paired"] == 1.0
    assert set(r.timings) == {"checkpoint", UNINDEX_DROP}
    assert r.timings["checkpoint"][1] == 2 and r.timings[UNINDEX_DROP][1] == 1
    best = [min(a, b) for a, b in zip(timers[0].samples, timers[1].samples, strict=True)]
    assert sum(ns for ns, _ in r.timings.values()) == sum(best)
