"""The production pool's KV side against a plain model (SPEC A.2, A.4): a Hypothesis state
machine reserves, releases, caches, claims and uncaches units of engine owners on a
:class:`~pagedstate.impl.UnitPool` and on a model of a few lines, and compares every
returned unit list, every ``on_evict`` callback (which hashes, in which order) and the
pool's view after every step.

The reference model's pool keeps no KV cache, so neither the conformance kit nor the
lockstep runs reach this part of the pool (docs/conformance.md, the one production plant
the kit misses). The model here is the rule SPEC A.2 gives for ``pop()``: vacant units
first, lowest id first, then cached units, least recently cached first; a cached unit
handed out fires ``on_evict(its hash)``, after the whole reservation is tagged.

``test_the_machine_catches_*`` plant bugs in a pool and show the machine failing on each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from plant_helpers import edited_method, plant

from pagedstate.impl import UnitPool

NUM_UNITS = 8
HASHES = st.integers(0, 5)  # few hashes: the same hash cached twice happens


class KVModel:
    """The pool's KV side, by the rule: vacant ids, cached ``(unit, hash)`` oldest first,
    and each owner's units in piece order."""

    def __init__(self, n: int) -> None:
        self.vacant: set[int] = set(range(n))
        self.cached: list[tuple[int, int]] = []
        self.held: dict[Any, list[int]] = {}

    def reserve(self, count: int, owner: Any) -> tuple[list[int] | None, list[int]]:
        """The units handed out (None: too few free) and the hashes evicted, in order."""
        if len(self.vacant) + len(self.cached) < count:
            return None, []
        units = sorted(self.vacant)[:count]
        self.vacant.difference_update(units)
        taken, self.cached = self.cached[: count - len(units)], self.cached[count - len(units) :]
        units += [u for u, _ in taken]
        self.held[owner] = units
        return units, [h for _, h in taken]

    def release(self, owner: Any) -> None:
        self.vacant.update(self.held.pop(owner))

    def cache(self, owner: Any, hashes: list[int | None]) -> None:
        for u, h in zip(self.held.pop(owner), hashes, strict=True):
            if h is None:
                self.vacant.add(u)
            else:
                self.cached.append((u, h))

    def claim(self, units: list[int], owner: Any) -> None:
        self.cached = [(u, h) for u, h in self.cached if u not in units]
        self.held[owner] = list(units)

    def uncache(self, units: list[int]) -> None:
        self.cached = [(u, h) for u, h in self.cached if u not in units]
        self.vacant.update(units)


class PoolKVMachine(RuleBasedStateMachine):
    """Runs one pool factory against :class:`KVModel` (set ``make_pool`` on a subclass)."""

    make_pool: Callable[..., Any] = UnitPool

    def __init__(self) -> None:
        super().__init__()
        self.fired: list[int] = []
        self.pool = type(self).make_pool(NUM_UNITS, on_evict=self.fired.append)
        self.model = KVModel(NUM_UNITS)
        self.next_owner = 0

    @initialize()
    def empty(self) -> None:
        assert self.pool.num_free == NUM_UNITS

    def _owners(self) -> list[Any]:
        return sorted(self.model.held, key=repr)

    def _new_owner(self) -> tuple[str, int]:
        self.next_owner += 1
        return ("kv", self.next_owner - 1)

    def _pick_cached(self, picks: list[int]) -> list[int]:
        """Distinct cached units, chosen by ``picks`` (in pick order)."""
        cached = [u for u, _ in self.model.cached]
        return list(dict.fromkeys(cached[p % len(cached)] for p in picks))

    @rule(count=st.integers(0, NUM_UNITS + 1))
    def reserve(self, count: int) -> None:
        owner = self._new_owner()
        self.fired.clear()
        got = self.pool.reserve_units(count, owner)
        want, evicted = self.model.reserve(count, owner)
        assert got == want, f"reserve_units({count}): {got} != {want}"
        assert self.fired == evicted, f"on_evict fired {self.fired}, the rule says {evicted}"

    @precondition(lambda self: bool(self.model.held))
    @rule(i=st.integers(0, 1 << 16))
    def release(self, i: int) -> None:
        owner = self._owners()[i % len(self.model.held)]
        self.pool.release_units(list(self.model.held[owner]), owner)
        self.model.release(owner)

    @precondition(lambda self: bool(self.model.held))
    @rule(i=st.integers(0, 1 << 16), hashes=st.lists(st.one_of(st.none(), HASHES), max_size=9))
    def cache(self, i: int, hashes: list[int | None]) -> None:
        owner = self._owners()[i % len(self.model.held)]
        units = self.model.held[owner]
        hs = (hashes + [None] * len(units))[: len(units)]
        self.pool.cache_units(list(units), owner, hs)
        self.model.cache(owner, hs)

    @precondition(lambda self: bool(self.model.cached))
    @rule(picks=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4))
    def claim(self, picks: list[int]) -> None:
        units = self._pick_cached(picks)
        owner = self._new_owner()
        self.fired.clear()
        self.pool.claim_cached_units(units, owner)
        assert self.fired == [], "a claim reuses the content: nothing may fire"
        self.model.claim(units, owner)

    @precondition(lambda self: bool(self.model.cached))
    @rule(picks=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4))
    def uncache(self, picks: list[int]) -> None:
        units = self._pick_cached(picks)
        self.pool.uncache_units(units)
        self.model.uncache(units)

    @invariant()
    def same_view(self) -> None:
        pool, model = self.pool, self.model
        assert pool.num_free == len(model.vacant) + len(model.cached)
        assert pool.num_cached == len(model.cached)
        for u, h in model.cached:
            assert pool.cached_hash(u) == h, f"unit {u}: {pool.cached_hash(u)} != {h}"
            assert pool.owner_of(u) is None
        for u in model.vacant:
            assert pool.cached_hash(u) is None and pool.owner_of(u) is None
        for owner, units in model.held.items():
            for piece, u in enumerate(units):
                assert pool.owner_of(u) == (owner, piece)
        check = getattr(pool, "self_check", None)
        if callable(check):
            assert check() == []


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=40,
    database=None,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _run(make_pool: Callable[..., Any], settings_: settings = SETTINGS) -> None:
    machine = type("Machine", (PoolKVMachine,), {"make_pool": staticmethod(make_pool)})
    run_state_machine_as_test(machine, settings=settings_)


def test_the_production_pool_follows_the_rule() -> None:
    _run(UnitPool)


def _planted_pool(old: str, new: str) -> Callable[..., Any]:
    """A UnitPool whose ``_reserve_runs`` has ``old`` replaced by ``new`` in its source."""
    edited_method(UnitPool, "_reserve_runs", old, new)  # fails now if it no longer applies

    def make(n: int, on_evict: Any = None) -> Any:
        pool = UnitPool(n, on_evict=on_evict)
        plant(pool, "_reserve_runs", old, new)
        return pool

    return make


PLANTS = {
    # the plant of docs/conformance.md's 21 that the conformance kit cannot see
    "most recently cached unit first": (
        "cached.popitem(last=False)",
        "cached.popitem(last=True)",
    ),
    "the vacant-only path skipped while units are cached": (
        "if ext.count >= count:",
        "if ext.count >= count and not cached:",
    ),
    "an eviction fires nothing": ("evicted.append(h)", "pass"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_the_machine_catches_a_planted_bug(plant: str) -> None:
    quick = settings(SETTINGS, phases=[Phase.explicit, Phase.generate])
    make = _planted_pool(*PLANTS[plant])
    with pytest.raises(AssertionError) as info:
        _run(make, quick)
    assert "!=" in str(info.value) or "fired" in str(info.value), info.value
