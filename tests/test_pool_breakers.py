"""Attempts to break two changes to the production pool (SPEC A.5, G8, G9, G10):

1. the dirty-run index skips a released run whose units are all flagged already (the
   ``flags.find(0, a, b) >= 0`` guard of ``_release_runs``), on the claim that every
   flagged unit is always covered by some run of the index, so ``dirty_units`` stays exact;
2. a reservation of several runs keeps each unit's piece in ``_piece``, copied from the
   ramp ``_ramp``.

The production pool is driven by random programs (reserve, release by ids and by runs,
rekey, mark_clean, dirty_units, cache_units, claim_cached_units, uncache_units, clone,
evicting reservations whose callback raises, deferral blocks that undo or keep them,
re-entrant callbacks that release checkpoints) over small, fragmented pools, and compared
after every step with a brute-force model of the pool (:class:`Model`: vacant set, cached
LRU, tags, the dirty set of SPEC G10), with the reference pool in lockstep while no KV is
cached, and with ``self_check``. A pool whose dirty index is pruned at every few runs
(:class:`PrunyPool`) makes ``_prune_dirty`` run all the time.

Planted bugs (:data:`PLANTS`) show the programs catch what the changes could get wrong.
"""

from __future__ import annotations

import random
import types
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import pytest
from plant_helpers import edited_method
from test_runs_adversarial import deep

from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec import EvictionCallbackError, PagedStateError
from pagedstate.spec.ops import unit_runs
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

STORE_KINDS = (CHECKPOINT_OWNER, TRANSFER_OWNER)


def is_store(owner: Hashable) -> bool:
    return isinstance(owner, tuple) and len(owner) == 2 and owner[0] in STORE_KINDS


class PrunyPool(I.UnitPool):
    """A production pool whose dirty index is pruned once it holds more than a few runs
    (the real floor is 1024 runs), so that every program prunes it many times."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dirty_prune_at = 2

    def _prune_dirty(self) -> None:
        super()._prune_dirty()
        self._dirty_prune_at = max(2, len(self._dirty_runs) + 1)


class Boom(Exception):
    pass


# -- the brute-force model ----------------------------------------------------------------------


class Model:
    """The production pool's contract, unit by unit: vacant units handed out lowest first,
    then cached ones least recently cached first; units released by a store owner are dirty
    until ``mark_clean`` (SPEC G10), reserved or free."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.vacant: set[int] = set(range(n))
        self.cached: OrderedDict[int, int] = OrderedDict()
        self.tags: dict[int, tuple[Hashable, int]] = {}
        self.dirty: set[int] = set()
        self.held: dict[Hashable, list[int]] = {}

    def copy(self) -> Model:
        m = Model(self.n)
        m.vacant, m.cached, m.tags = set(self.vacant), OrderedDict(self.cached), dict(self.tags)
        m.dirty, m.held = set(self.dirty), {o: list(us) for o, us in self.held.items()}
        return m

    def num_free(self) -> int:
        return len(self.vacant) + len(self.cached)

    def reserve(self, count: int, owner: Hashable) -> tuple[list[int], list[tuple[int, int]]]:
        """The units and the ``(unit, hash)`` of the cached units taken (evictions)."""
        assert count <= self.num_free()
        units = sorted(self.vacant)[:count]
        self.vacant.difference_update(units)
        taken = []
        while len(units) < count:
            u, h = self.cached.popitem(last=False)
            taken.append((u, h))
            units.append(u)
        self._tag(units, owner)
        return units, taken

    def _tag(self, units: list[int], owner: Hashable) -> None:
        for p, u in enumerate(units):
            self.tags[u] = (owner, p)
        if units:
            self.held[owner] = list(units)

    def unreserve(self, owner: Hashable, taken: list[tuple[int, int]]) -> None:
        """Undo a reservation: its vacant units go vacant, its cached ones back to the cold
        end of the LRU, in order."""
        units = self.held.pop(owner)
        cached_units = {u for u, _ in taken}
        for u in units:
            del self.tags[u]
            if u not in cached_units:
                self.vacant.add(u)
        for u, h in reversed(taken):
            self.cached[u] = h
            self.cached.move_to_end(u, last=False)

    def release(self, owner: Hashable) -> list[int]:
        units = self.held.pop(owner)
        for u in units:
            del self.tags[u]
            self.vacant.add(u)
        if is_store(owner):
            self.dirty.update(units)
        return units

    def rekey(self, old: Hashable, new: Hashable) -> None:
        self._tag(self.held.pop(old), new)

    def cache(self, owner: Hashable, hashes: list[int | None]) -> None:
        units = self.held.pop(owner)
        for u, h in zip(units, hashes, strict=True):
            del self.tags[u]
            if h is None:
                self.vacant.add(u)
            else:
                self.cached[u] = h

    def claim(self, units: list[int], owner: Hashable) -> None:
        for u in units:
            del self.cached[u]
        self._tag(units, owner)

    def uncache(self, units: list[int]) -> None:
        for u in units:
            del self.cached[u]
            self.vacant.add(u)

    def mark_clean(self, units: list[int]) -> None:
        self.dirty.difference_update(units)


def agree(pool: I.UnitPool, m: Model, ref: R.UnitPool | None = None, where: str = "") -> None:
    """Every reading of ``pool`` is the model's; its own indexes are consistent."""
    n = m.n
    assert pool.self_check() == [], where
    free, dirty, tags = pool.snapshot_parts()
    assert tags == m.tags, where
    assert free == m.vacant | set(m.cached), where
    assert dirty == m.dirty, where
    assert pool.cached_units() == tuple(m.cached.items()), where
    assert pool.num_free == m.num_free() and pool.num_cached == len(m.cached), where
    assert [pool.owner_of(u) for u in range(n)] == [m.tags.get(u) for u in range(n)], where
    assert [pool.is_dirty(u) for u in range(n)] == [u in m.dirty for u in range(n)], where
    # SPEC G10 through the index alone: every flagged unit is covered by an indexed run
    covered = {u for a, b in pool._dirty_runs for u in range(a, b)}
    assert m.dirty <= covered, (where, sorted(m.dirty - covered))
    with pool._as_store():
        for owner, units in m.held.items():
            assert pool._is_whole(units, owner), (where, owner, units)
            assert pool._holds_runs(list(unit_runs(units)), owner), (where, owner)
            if len(units) > 1:
                assert not pool._is_whole(units[::-1], owner), where
                assert not pool._is_whole(units[:-1], owner), where
    if ref is not None:
        assert ref.snapshot_parts() == pool.snapshot_parts(), where


# -- the random programs ------------------------------------------------------------------------


class Driver:
    """One random program on a production pool, checked against :class:`Model` (and the
    reference pool while ``cache`` is off) after every step."""

    def __init__(
        self,
        rng: random.Random,
        n: int,
        *,
        cache: bool = True,
        hostile: bool = True,
        pruny: bool = True,
        clones: bool = True,
        plants: tuple[tuple[str, str, str], ...] = (),
    ) -> None:
        self.rng, self.n = rng, n
        self.cache, self.hostile, self.clones, self.plants = cache, hostile, clones, plants
        self.pool = (PrunyPool if pruny else I.UnitPool)(n, on_evict=self.on_evict)
        self._plant(self.pool)
        self.m = Model(n)
        self.ref = None if cache else R.UnitPool(n)
        self.k = 0
        self.fail_on: set[int] = set()  # hashes whose callback raises
        self.reenter = False  # a callback releases a held store reservation first
        self.evicted: list[int] = []
        self.reentered = False
        self.fresh: set[Hashable] = set()
        # the pool last cloned from (or to) and its state: it must not move, however the
        # program goes on with the other one
        self.old: tuple[I.UnitPool, Any] | None = None

    def _plant(self, pool: I.UnitPool) -> None:
        """The plants, bound to ``pool`` (edited from the production class's methods, also
        on a :class:`PrunyPool`, whose own prune then gives way to the planted one)."""
        for name, old, new in self.plants:
            setattr(pool, name, types.MethodType(edited_method(I.UnitPool, name, old, new), pool))

    def owner(self, store: bool | None = None) -> Hashable:
        self.k += 1
        kind = self.rng.randrange(3) if store is None else self.rng.randrange(2)
        if store is False:
            kind = 2
        return ((CHECKPOINT_OWNER, self.k), (TRANSFER_OWNER, ("op", self.k)), ("live-kv", self.k))[
            kind
        ]

    def on_evict(self, h: int) -> None:
        self.evicted.append(h)
        if self.reenter:
            self.reenter = False
            stores = [o for o in self.m.held if is_store(o) and o not in self.fresh]
            if stores:
                o = self.rng.choice(sorted(stores, key=repr))
                units = self.m.release(o)
                self.reentered = True
                with self.pool._as_store():
                    self.pool._release_runs(unit_runs(units), o)
        if h in self.fail_on:
            raise Boom(h)

    # -- steps -------------------------------------------------------------------------------

    def step(self) -> None:
        rng, pool, m = self.rng, self.pool, self.m
        self.fresh = set()
        if self.old is not None:  # a clone shares nothing mutable with its original
            old, state = self.old
            assert deep(old) == state, "an operation on a clone changed its original"
        what = rng.randrange(100)
        held = sorted(m.held, key=repr)
        if what < 28 or not held and what < 60:
            self.reserve()
        elif what < 48:
            o = rng.choice(held)
            units = m.held[o]
            if self.cache and not is_store(o) and rng.random() < 0.6:
                hashes = [None if rng.random() < 0.3 else rng.randrange(10**6) for _ in units]
                m.cache(o, hashes)
                pool.cache_units(list(units), o, hashes)
            else:
                self.release(o)
        elif what < 56:
            o = rng.choice(held)
            new = self.owner()
            m.rekey(o, new)
            with pool._as_store():
                pool.rekey_units(list(m.held[new]), o, new)
            if self.ref is not None:
                with self.ref._as_store():
                    self.ref.rekey_units(list(m.held[new]), o, new)
        elif what < 64 and self.cache and m.cached:
            cached = list(m.cached)
            ids = rng.sample(cached, rng.randint(1, len(cached)))
            if rng.random() < 0.5:
                ids.sort()
            o = self.owner(store=False)
            m.claim(ids, o)
            pool.claim_cached_units(ids, o)
        elif what < 68 and self.cache and m.cached:
            ids = rng.sample(list(m.cached), rng.randint(1, len(m.cached)))
            m.uncache(ids)
            pool.uncache_units(ids)
        elif what < 78:
            ids = [u for u in range(self.n) if rng.random() < 0.3]
            m.mark_clean(ids)
            pool.mark_clean(ids)
            if self.ref is not None:
                self.ref.mark_clean(ids)
        elif what < 84:
            assert pool.dirty_units() == m.dirty
        elif what < 90 and self.clones:
            self.clone()
        elif what < 95:
            self.bad_call()
        else:
            self.deferred_block()
        agree(self.pool, self.m, self.ref, where=f"step {what}")

    def reserve(self) -> None:
        rng, pool, m = self.rng, self.pool, self.m
        free = m.num_free()
        count = rng.randint(0, free) if free and rng.random() < 0.9 else free + rng.randint(0, 2)
        o = self.owner()
        evicts = count > len(m.vacant) and bool(m.cached)
        self.fail_on = set()
        self.reenter = False
        if self.hostile and evicts and rng.random() < 0.4:
            self.reenter = rng.random() < 0.3
            hashes = list(m.cached.values())[: count - len(m.vacant)]
            self.fail_on = set(rng.sample(hashes, rng.randint(1, len(hashes))))
        self.fresh = {o}
        self.reentered = False
        before = deep(pool)
        self.evicted = []
        fits = count <= free
        if fits:  # the reservation is tagged before any callback fires
            want, taken = m.reserve(count, o)
        try:
            with pool._as_store():
                if is_store(o) and rng.random() < 0.5:
                    runs = pool._reserve_runs(count, o)
                    got = None if runs is None else [u for a, c in runs for u in range(a, a + c)]
                else:
                    got = pool.reserve_units(count, o)
        except EvictionCallbackError as exc:
            assert self.fail_on and fits, "no callback was meant to raise"
            assert exc.undone
            assert self.evicted == [h for _, h in taken]
            m.unreserve(o, taken)
            if not self.reentered:
                assert deep(pool) == before, "an undone reservation left a trace"
            return
        finally:
            self.fail_on, self.reenter = set(), False
        if not fits:
            assert got is None
            return
        assert got == want
        assert self.evicted == [h for _, h in taken]
        if self.ref is not None:
            with self.ref._as_store():
                assert self.ref.reserve_units(count, o) == want

    def release(self, o: Hashable) -> None:
        rng, pool, m = self.rng, self.pool, self.m
        units = m.release(o)
        with pool._as_store():
            if is_store(o) and rng.random() < 0.5:
                pool._release_runs(unit_runs(units), o)
            else:
                pool.release_units(list(units) if rng.random() < 0.5 else tuple(units), o)
        if self.ref is not None:
            with self.ref._as_store():
                self.ref.release_units(units, o)

    def clone(self) -> None:
        pool = self.pool
        if self.old is not None:
            assert deep(self.old[0]) == self.old[1]
        c = pool.clone()
        assert deep(c) == deep(pool)
        self._plant(c)
        if self.rng.random() < 0.5:  # go on with the clone; the original must not move
            self.old = (pool, deep(pool))
            self.pool = c
        else:  # go on with the original; the clone must not move
            self.old = (c, deep(c))
        if self.ref is not None:
            self.ref = self.ref.clone()

    def bad_call(self) -> None:
        """A call that must raise and change nothing (SPEC G8, G9)."""
        rng, pool, m = self.rng, self.pool, self.m
        held = sorted(m.held, key=repr)
        before = deep(pool)
        calls: list[Any] = []
        if held:
            o = rng.choice(held)
            units = list(m.held[o])
            other = self.owner()
            calls.append(("release_units", (units, other)))
            if len(units) > 1:
                calls.append(("release_units", (units[:-1], o)))
                calls.append(("release_units", (units[1:], o)))
                calls.append(("release_units", (units[::-1], o)))
                calls.append(("rekey_units", (units[::-1], o, other)))
                i, j = sorted(rng.sample(range(len(units)), 2))
                swapped = list(units)
                swapped[i], swapped[j] = swapped[j], swapped[i]
                calls.append(("release_units", (swapped, o)))
            calls.append(("release_units", (units + [units[0]], o)))
            if len(held) > 1:
                o2 = rng.choice([h for h in held if h != o])
                calls.append(("release_units", (units + m.held[o2], o)))
                calls.append(("rekey_units", (units, o, o2)))
            free = sorted(m.vacant | set(m.cached))
            if free:
                calls.append(("release_units", (units + [rng.choice(free)], o)))
        if m.vacant:
            calls.append(("claim_cached_units", ([min(m.vacant)], self.owner(store=False))))
            calls.append(("uncache_units", ([min(m.vacant)],)))
        if not calls:
            return
        name, args = rng.choice(calls)
        with pool._as_store():
            with pytest.raises(PagedStateError):
                getattr(pool, name)(*args)
        assert deep(pool) == before, (name, args)

    def deferred_block(self) -> None:
        """One to three reservations in a ``deferred_evictions`` block whose callbacks may
        raise: with ``undo_on_error`` the ones that evicted are undone in reverse, without
        it they stand."""
        rng, pool, m = self.rng, self.pool, self.m
        undo = rng.random() < 0.6
        before = (deep(pool), m.copy())
        made: list[tuple[Hashable, list[tuple[int, int]]]] = []
        hashes = list(m.cached.values())
        self.fail_on = set(rng.sample(hashes, min(len(hashes), 2))) if self.hostile else set()
        self.evicted = []
        raised = None
        try:
            with pool.deferred_evictions(undo_on_error=undo):
                for _ in range(rng.randint(1, 3)):
                    count = rng.randint(0, m.num_free())
                    o = self.owner()
                    self.fresh.add(o)
                    with pool._as_store():
                        got = pool.reserve_units(count, o)
                    want, taken = m.reserve(count, o)
                    assert got == want
                    if self.ref is not None:
                        with self.ref._as_store():
                            assert self.ref.reserve_units(count, o) == want
                    if taken:
                        made.append((o, taken))
                assert self.evicted == []  # held until the block exits
        except EvictionCallbackError as exc:
            raised = exc
        finally:
            fail_on, self.fail_on = self.fail_on, set()
        fired = [h for _, taken in made for _, h in taken]
        assert self.evicted == fired
        assert (raised is not None) == bool(fail_on & set(fired))
        if raised is None:
            return
        assert raised.undone == undo
        if undo:
            for o, taken in reversed(made):
                m.unreserve(o, taken)
            if len(m.held) == len(before[1].held):  # nothing else was reserved in the block
                assert deep(pool) == before[0], "an undone deferral block left a trace"


def run_program(seed: int, n: int, steps: int = 300, **kw: Any) -> None:
    d = Driver(random.Random(seed), n, **kw)
    for _ in range(steps):
        d.step()


def fragment(pool: I.UnitPool, m: Model, rng: random.Random, ref: R.UnitPool | None = None):
    """Many small reservations, every other one released: vacant extents of a few units."""
    owners = []
    k = 0
    while m.num_free():
        k += 1
        o = (CHECKPOINT_OWNER, 10_000 + k) if k % 2 else ("frag", k)
        c = min(m.num_free(), rng.randint(1, 3))
        with pool._as_store():
            got = pool.reserve_units(c, o)
        want, _ = m.reserve(c, o)
        assert got == want
        if ref is not None:
            with ref._as_store():
                assert ref.reserve_units(c, o) == want
        owners.append(o)
    for o in owners[::2]:
        units = m.release(o)
        with pool._as_store():
            pool.release_units(units, o)
        if ref is not None:
            with ref._as_store():
                ref.release_units(units, o)


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_match_the_model_with_cached_kv(seed: int) -> None:
    run_program(seed, n=(5, 9, 16, 24, 33, 48)[seed])


@pytest.mark.parametrize("seed", range(4))
def test_random_programs_match_the_reference_without_cached_kv(seed: int) -> None:
    run_program(100 + seed, n=(7, 12, 20, 40)[seed], cache=False)


@pytest.mark.parametrize("seed", range(2))
def test_random_programs_with_the_real_prune_bound(seed: int) -> None:
    run_program(200 + seed, n=(10, 30)[seed], pruny=False)


# -- directed: the dirty guard (SPEC G10) ---------------------------------------------------------


def _store_cycle(pool: I.UnitPool, runs_wanted: list[tuple[int, int]], cid: int) -> None:
    """Reserve exactly ``runs_wanted`` as checkpoint ``cid`` and release it (dirtying
    them), on a pool with nothing reserved: every unit is first reserved alone by live KV,
    the wanted ones are given back, and the rest after the checkpoint (live KV: no dirt)."""
    n = pool.num_units
    assert pool.num_free == n
    want = {u for a, c in runs_wanted for u in range(a, a + c)}
    with pool._as_store():
        singles = [pool._reserve_runs(1, ("pad", cid, u)) for u in range(n)]
        assert singles == [[(u, 1)] for u in range(n)]
        for u in sorted(want):
            pool._release_runs([(u, 1)], ("pad", cid, u))
        runs = pool._reserve_runs(len(want), (CHECKPOINT_OWNER, cid))
        assert runs is not None and tuple(runs) == tuple(runs_wanted), runs
        pool._release_runs(runs, (CHECKPOINT_OWNER, cid))
        for u in range(n):
            if u not in want:
                pool._release_runs([(u, 1)], ("pad", cid, u))


@pytest.mark.parametrize("clean", [0, 1, 2, 3, 5, 7])
def test_a_run_with_one_clean_unit_anywhere_is_flagged_again(clean: int) -> None:
    """A run released when all but one of its units are flagged: the clean one (first,
    middle, last, or unit 0 of the pool) becomes dirty, and the index covers it."""
    for start in (0, 3):
        pool = PrunyPool(16)
        _store_cycle(pool, [(start, 8)], 1)
        pool.mark_clean([start + clean])
        assert pool.dirty_units() == frozenset(range(start, start + 8)) - {start + clean}
        _store_cycle(pool, [(start, 8)], 2)
        assert pool.is_dirty(start + clean)
        assert pool.dirty_units() == frozenset(range(start, start + 8))
        assert pool.self_check() == []


def test_a_run_flagged_by_several_earlier_runs_is_not_indexed_again() -> None:
    """``[0, 6)`` is flagged whole by two earlier releases, ``[0, 2)`` and ``[2, 6)``; its
    own release adds nothing to the index, and the units stay exactly known through prunes
    and scrubs of either earlier run."""
    pool = I.UnitPool(8)
    _store_cycle(pool, [(0, 2)], 1)
    _store_cycle(pool, [(2, 4)], 2)
    index = list(pool._dirty_runs)
    _store_cycle(pool, [(0, 6)], 3)
    assert pool._dirty_runs == index
    pool._prune_dirty()
    assert pool.dirty_units() == frozenset(range(6))
    pool.mark_clean([0, 1])
    assert pool.dirty_units() == frozenset(range(2, 6))
    _store_cycle(pool, [(0, 6)], 4)  # 0 and 1 are clean again: flagged and indexed
    assert pool.dirty_units() == frozenset(range(6))
    pool.mark_clean([2, 3, 4, 5])
    assert pool.dirty_units() == frozenset({0, 1})
    assert pool.self_check() == []


def test_long_runs_past_the_fill_buffer_keep_the_guard_exact() -> None:
    """Runs longer than the 4096-flag buffer (the other fill branch), released with one
    clean unit at either end and in the middle, then whole-flagged again."""
    n = 9000
    pool = I.UnitPool(n)
    _store_cycle(pool, [(0, n)], 1)
    for k, u in enumerate((0, 4096, 4097, n - 1)):
        pool.mark_clean([u])
        assert not pool.is_dirty(u)
        _store_cycle(pool, [(0, n)], 2 + k)
        assert pool.is_dirty(u)
    assert len(pool._dirty_runs) <= 5
    assert pool.dirty_units() == frozenset(range(n))
    pool.mark_clean(range(1, n, 2))
    assert pool.dirty_units() == frozenset(range(0, n, 2))
    assert pool.self_check() == []


def test_the_dirty_rule_follows_the_owner_at_release_time() -> None:
    """A checkpoint rekeyed to live KV is released clean (nothing dirties it); live KV
    rekeyed to a transfer owner is released dirty; a dirty unit reserved again stays dirty
    until scrubbed, also when its new reservation is undone or rekeyed."""
    pool, ref = I.UnitPool(6), R.UnitPool(6)
    for p in (pool, ref):
        with p._as_store():
            a = p.reserve_units(3, (CHECKPOINT_OWNER, 1))
            b = p.reserve_units(3, ("live-kv", 1))
            assert a == [0, 1, 2] and b == [3, 4, 5]
            p.rekey_units(a, (CHECKPOINT_OWNER, 1), ("live-kv", 2))
            p.rekey_units(b, ("live-kv", 1), (TRANSFER_OWNER, ("op", 1)))
            p.release_units(a, ("live-kv", 2))
            p.release_units(b, (TRANSFER_OWNER, ("op", 1)))
            assert p.dirty_units() == frozenset({3, 4, 5})
            c = p.reserve_units(6, (CHECKPOINT_OWNER, 2))
            assert c == list(range(6))
            p.mark_clean([4])
            p.release_units(c, (CHECKPOINT_OWNER, 2))
            assert p.dirty_units() == frozenset(range(6))
    assert pool.snapshot_parts() == ref.snapshot_parts()
    assert pool.self_check() == []


# -- directed: reservations of several runs (``_piece`` from ``_ramp``) ---------------------------


def _fragmented(n: int, seed: int) -> tuple[I.UnitPool, R.UnitPool, Model]:
    pool, ref, m = I.UnitPool(n), R.UnitPool(n), Model(n)
    fragment(pool, m, random.Random(seed), ref)
    agree(pool, m, ref)
    return pool, ref, m


@pytest.mark.parametrize("seed", range(4))
def test_big_reservations_over_a_fragmented_pool_match_the_reference(seed: int) -> None:
    """Reservations spanning several vacant extents read back as the reference's tags
    (``owner_of``, snapshot), are released by unit ids on the fast path only when named
    whole and in piece order, and are rekeyed, cloned and released as the reference's."""
    rng = random.Random(seed)
    pool, ref, m = _fragmented(64, seed)
    big = []
    for k in range(3):
        o = ((CHECKPOINT_OWNER, k), (TRANSFER_OWNER, ("op", k)), ("live-kv", k))[k]
        count = min(m.num_free(), rng.randint(4, 12))
        with pool._as_store(), ref._as_store():
            got = pool.reserve_units(count, o)
            assert got == ref.reserve_units(count, o)
        want, _ = m.reserve(count, o)
        assert got == want and len(unit_runs(got)) > 1
        h = pool._tag[got[0]]
        assert pool._who[h][1] == -1  # kept in the form of several runs
        assert [pool._piece[u] for u in got] == list(range(count))
        big.append(o)
        agree(pool, m, ref)
    with pool._as_store():
        for o in big:
            units = m.held[o]
            for _ in range(20):  # any other list of ids is refused by the fast check
                ids = rng.sample(
                    units + [u for u in range(64) if u not in units][:2],
                    rng.randint(1, len(units) + 1),
                )
                if ids != units:
                    assert not pool._is_whole(ids, o), ids
    snapshot = deep(pool)
    c = pool.clone()
    new = ("live-kv", "rekeyed")
    m.rekey(big[0], new)
    with pool._as_store(), ref._as_store():
        pool.rekey_units(m.held[new], big[0], new)
        ref.rekey_units(m.held[new], big[0], new)
    agree(pool, m, ref)
    assert deep(c) == snapshot  # the clone did not move with the rekey
    with pool._as_store(), ref._as_store():
        for o in [new, *big[1:]]:
            units = m.held[o]
            assert pool._is_whole(units, o)
            m.release(o)
            pool.release_units(units, o)
            ref.release_units(units, o)
            agree(pool, m, ref)
    assert deep(c) == snapshot


def _lru_fragmented(pool: I.UnitPool, m: Model) -> None:
    """A pool of 12 with vacant extents [0, 2), [3, 5), [6, 7), [8, 11) and the cached
    units 11, 2, 7, 5, in that LRU order (unlike the id order), whose last reservation (a
    prefix-cache hit in that order) left its pieces in ``_piece``."""
    all_ = pool.reserve_units(12, ("kv", 0))
    m.reserve(12, ("kv", 0))
    hashes: list[int | None] = [100 + u for u in range(12)]
    pool.cache_units(all_, ("kv", 0), hashes)
    m.cache(("kv", 0), hashes)
    hit = [11, 2, 7, 5]
    pool.claim_cached_units(hit, ("kv", 1))
    m.claim(hit, ("kv", 1))
    assert [pool._piece[u] for u in hit] == [0, 1, 2, 3]
    pool.cache_units(hit, ("kv", 1), [200 + u for u in hit])
    m.cache(("kv", 1), [200 + u for u in hit])
    rest = [0, 1, 3, 4, 6, 8, 9, 10]
    pool.uncache_units(rest)
    m.uncache(rest)
    agree(pool, m)
    assert pool._ext.runs() == [(0, 2), (3, 2), (6, 1), (8, 3)]
    assert pool.cached_units() == tuple((u, 200 + u) for u in hit)


def test_a_reservation_over_extents_and_cached_units_has_its_pieces_in_lru_order() -> None:
    pool, m = I.UnitPool(12), Model(12)
    _lru_fragmented(pool, m)
    evicted: list[int] = []
    pool.on_evict = evicted.append
    with pool._as_store():
        runs = pool._reserve_runs(10, (CHECKPOINT_OWNER, 1))
    want, taken = m.reserve(10, (CHECKPOINT_OWNER, 1))
    assert runs == [(0, 2), (3, 2), (6, 1), (8, 4), (2, 1)]
    assert [u for a, c in runs for u in range(a, a + c)] == want
    assert evicted == [211, 202] == [h for _, h in taken]
    assert [pool.owner_of(u) for u in want] == [((CHECKPOINT_OWNER, 1), p) for p in range(10)]
    agree(pool, m)
    # the next one takes the last two cached units, 7 then 5: piece 0 on 7
    got = pool.reserve_units(2, ("live-kv", 9))
    m.reserve(2, ("live-kv", 9))
    assert got == [7, 5] and pool.owner_of(7) == (("live-kv", 9), 0)
    agree(pool, m)
    c = pool.clone()
    with pool._as_store():
        pool._release_runs(runs, (CHECKPOINT_OWNER, 1))
    m.release((CHECKPOINT_OWNER, 1))
    agree(pool, m)
    assert c.owner_of(2) == ((CHECKPOINT_OWNER, 1), 9) and not c.is_dirty(2)
    assert c.self_check() == []


@pytest.mark.parametrize("deferred", [False, True])
def test_an_undone_reservation_puts_back_the_stale_pieces(deferred: bool) -> None:
    """The undo of a reservation of several runs whose callback raised restores the tag and
    piece arrays exactly (SPEC G8), stale pieces of an earlier reservation included."""
    pool, m = I.UnitPool(12), Model(12)
    _lru_fragmented(pool, m)
    stale = array_bytes(pool)

    def refuse(h: int) -> None:
        raise Boom(h)

    pool.on_evict = refuse
    before = deep(pool)
    with pytest.raises(EvictionCallbackError) as info:
        with pool._as_store():
            if deferred:
                with pool.deferred_evictions(undo_on_error=True):
                    got = pool.reserve_units(11, ("live-kv", 1))
                    assert array_bytes(pool) != stale  # the pieces were overwritten
            else:
                pool.reserve_units(11, ("live-kv", 1))
    assert info.value.undone
    assert array_bytes(pool) == stale
    assert deep(pool) == before
    agree(pool, m)
    if deferred:
        assert got == [0, 1, 3, 4, 6, 8, 9, 10, 11, 2, 7]


def array_bytes(pool: I.UnitPool) -> tuple[bytes, bytes]:
    return bytes(pool._tag), bytes(pool._piece)


def _multi_run_owner(pool: I.UnitPool) -> tuple[Hashable, list[int]]:
    with pool._as_store():
        got = pool.reserve_units(10, (CHECKPOINT_OWNER, 1))
    assert got is not None and len(unit_runs(got)) > 1
    return (CHECKPOINT_OWNER, 1), got


@pytest.mark.parametrize(
    "piece", [lambda p: p + 1, lambda p: 0, lambda p: -1, lambda p: 10, lambda p: 2**31 - 1]
)
@pytest.mark.parametrize("which", [0, 4, 9])
def test_self_check_reports_a_planted_wrong_piece(which: int, piece: Any) -> None:
    pool, m = I.UnitPool(12), Model(12)
    _lru_fragmented(pool, m)
    owner, units = _multi_run_owner(pool)
    assert pool.self_check() == []
    u = units[which]
    wrong = piece(which)
    if wrong == which:
        return
    pool._piece[u] = wrong
    assert any("pieces" in p for p in pool.self_check()), pool.self_check()
    # the fast whole-reservation check no longer takes it either: the slow one names it
    with pool._as_store():
        assert not pool._is_whole(units, owner)
        assert not pool._holds_runs(list(unit_runs(units)), owner)


def test_the_store_self_check_reports_two_swapped_pieces() -> None:
    """Two pieces swapped inside one run: each owner still holds pieces 0..n-1 (what the
    pool's own check can see: a prefix-cache hit may order pieces any way), but the record's
    runs no longer hold them in order, which the store's check reports."""
    from conftest import spec

    pool = I.UnitPool(12)
    kv = pool.reserve_units(12, ("kv", 0))
    assert kv is not None
    pool.release_units(kv, ("kv", 0))
    keep = [pool.reserve_units(1, ("live", u)) for u in range(12)]
    for u in range(12):
        if u % 3:
            pool.release_units([u], ("live", u))
    del keep
    store = I.PageUnitCheckpointStore(pool, spec(10, 60))  # 6 units: 1, 2, 4, 5, 7, 8
    op = store.begin_store(1, 0)
    assert op is not None and len(op.runs) == 3
    assert store.self_check() == []
    a, b = op.unit_ids[:2]
    pool._piece[a], pool._piece[b] = pool._piece[b], pool._piece[a]
    assert store.self_check() != []


def test_a_clone_and_its_original_share_no_piece_flag_or_index() -> None:
    """Reservations of several runs, releases that dirty and scrubs on one of a pool and its
    clone leave the other exactly as it was (the piece array, the dirty flags and the
    dirty-run index included; the ramp is never written, so it may be shared)."""
    for go_on_with_clone in (False, True):
        pool, m = I.UnitPool(12), Model(12)
        _lru_fragmented(pool, m)
        owner, units = _multi_run_owner(pool)
        c = pool.clone()
        assert c._ramp == pool._ramp
        a, b = (c, pool) if go_on_with_clone else (pool, c)
        state = deep(b)
        with a._as_store():
            a._release_runs(list(unit_runs(units)), owner)  # dirty, indexed
            a.mark_clean(units[:2])
            got = a.reserve_units(11, ("live-kv", 2))  # several runs, other pieces
            assert got is not None and len(unit_runs(got)) > 1
            assert [a._piece[u] for u in got[:3]] == [0, 1, 2]
        assert deep(b) == state
        assert b.owner_of(units[1]) == (owner, 1) and not b.is_dirty(units[0])
        assert a.self_check() == [] and b.self_check() == []


def test_a_prune_leaves_the_maximal_dirty_runs() -> None:
    """Touching dirty runs indexed apart become one run when the index is pruned."""
    pool = I.UnitPool(8)
    _store_cycle(pool, [(0, 2)], 1)
    _store_cycle(pool, [(2, 2)], 2)
    _store_cycle(pool, [(5, 2)], 3)
    assert pool._dirty_runs == [(0, 2), (2, 4), (5, 7)]
    assert pool.dirty_units() == frozenset({0, 1, 2, 3, 5, 6})
    assert pool._dirty_runs == [(0, 4), (5, 7)]
    pool.mark_clean([1])
    pool._prune_dirty()
    assert pool._dirty_runs == [(0, 1), (2, 4), (5, 7)]


# -- planted bugs -------------------------------------------------------------------------------

PLANTS = {
    # the dirty guard (change 1)
    "a run flagged but not indexed": ("_release_held", "index.append((a, b))", "pass"),
    "the guard inverted": (
        "_release_held",
        "flags.find(0, a, b) >= 0",
        "flags.find(0, a, b) < 0",
    ),
    "the guard reads the first unit only": (
        "_release_held",
        "flags.find(0, a, b) >= 0",
        "flags.find(0, a, a + 1) >= 0",
    ),
    "the guard misses the last unit": (
        "_release_held",
        "flags.find(0, a, b) >= 0",
        "flags.find(0, a, b - 1) >= 0",
    ),
    "the guard takes a clean first unit for flagged": (
        "_release_held",
        "flags.find(0, a, b) >= 0",
        "flags.find(0, a, b) > a",
    ),
    "a prune drops the last unit of a run": (
        "_prune_dirty",
        "_ONES_RUN.finditer(flags, a, b)",
        "_ONES_RUN.finditer(flags, a, b - 1)",
    ),
    "a clone shares the dirty flags": (
        "clone",
        "c._dirtyf = bytearray(self._dirtyf)",
        "c._dirtyf = self._dirtyf",
    ),
    "a clone shares the dirty index": (
        "clone",
        "c._dirty_runs = list(self._dirty_runs)",
        "c._dirty_runs = self._dirty_runs",
    ),
    # the pieces of a reservation of several runs (change 2)
    "the ramp copied off by one": (
        "_tag_runs",
        "ramp[piece : piece + c]",
        "ramp[piece + 1 : piece + c + 1]",
    ),
    "the ramp copied at the unit's id": ("_tag_runs", "ramp[piece : piece + c]", "ramp[a : a + c]"),
    "the piece not advanced past a run": ("_tag_runs", "piece += c", "pass"),
    "the undo check reads the ramp off by one": (
        "_holds_runs",
        "ramp[piece : piece + c]",
        "ramp[piece + 1 : piece + c + 1]",
    ),
    "an undo keeps the new pieces": (
        "_unreserve",
        "pieces[a : a + len(old_pieces)] = old_pieces",
        "pass",
    ),
    "the undo record keeps the wrong pieces": (
        "_reserve_runs",
        "pieces[a : a + c]) for a, c in runs]",
        "pieces[a + 1 : a + c + 1]) for a, c in runs]",
    ),
    "owner_of reads a piece as a base": (
        "_tag_of",
        "else self._piece[unit]",
        "else unit - self._piece[unit]",
    ),
    "the snapshot reads a piece as a base": (
        "snapshot_parts",
        "else pieces[u])",
        "else u - pieces[u])",
    ),
    "the fast whole check skips the pieces": (
        "_is_whole",
        "if (u - base if base >= 0 else pieces[u]) != piece:",
        "if (u - base if base >= 0 else piece) != piece:",
    ),
    "a clone shares the pieces": (
        "clone",
        "c._piece = array(_TC, self._piece)",
        "c._piece = self._piece",
    ),
}


def _caught(plants: tuple[tuple[str, str, str], ...]) -> bool:
    for name, old, new in plants:  # the plant still applies (else it would be "caught")
        edited_method(I.UnitPool, name, old, new)
    for seed, (n, cache) in enumerate(((9, True), (16, True), (12, False), (33, True))):
        try:
            run_program(seed, n, steps=300, cache=cache, plants=plants)
        except Exception:  # an assertion, or a refusal the plant made wrongly
            return True
    return False


@pytest.mark.parametrize("plant_name", sorted(PLANTS))
def test_a_planted_bug_is_caught_by_the_random_programs(plant_name: str) -> None:
    assert _caught((PLANTS[plant_name],))


def test_the_programs_pass_without_a_plant() -> None:
    assert not _caught(())
