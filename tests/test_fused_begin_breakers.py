"""Breakers for the store's fused begin (``PageUnitCheckpointStore._begin_fast``, b276518).

On the production :class:`~pagedstate.impl.UnitPool` the store's ``begin_store`` applies
the LRU victims' evict rows (SPEC B.3 row 12) and the begin row (row 1) inline, and skips
the pool's deferral block when vacant units alone suffice. These tests hold it to:

- the **general path** (the same store with ``_FAST_ROWS`` off: ``_make_room`` / ``_evict``
  / ``_apply`` / ``_begin_deferred``), in lockstep over a pool with a KV side: cached units,
  an ``on_evict`` callback that re-enters the store (unindex, begin_store,
  ensure_free_units, clear) or raises; every return value, every callback, every row
  handed to ``row_sink`` and ``on_transition`` (in order, with its subject) and the pool's
  and store's internal indexes must be the same after every call;
- the **reference model** (no KV side there), in lockstep over eviction-heavy pools (exactly
  full, or with a remainder), including ``changed_since``, the counters and ``clone()``;
- targeted cases: refused begins keep the checkpoint id, a hook that raises inside the
  eviction loop, re-entrant hooks, a record unindexed by its own reservation's callback.

Two findings of these breakers were fixed: the begin row's hook saw the record in flight
on the shortcut only (every path now puts it in flight first), and a raising begin-row
hook stranded a COPYING record on the deferred path (the same fix); their tests stay.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import FakeClock, spec

import pagedstate.impl.store as S
from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec import check_invariants
from pagedstate.spec import tables as T


@contextlib.contextmanager
def general_path() -> Iterator[None]:
    """The store's general begin (``_make_room`` then ``_apply``), as before b276518."""
    old = S._FAST_ROWS
    S._FAST_ROWS = False
    try:
        yield
    finally:
        S._FAST_ROWS = old


def _outcome(fn: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", fn())
    except Exception as exc:  # compared between the worlds
        return ("raised", type(exc).__name__, str(exc))


def _pool_state(p: I.UnitPool) -> tuple[Any, ...]:
    """Everything the production pool holds, orders included."""
    return (
        p.snapshot_parts(),
        p.cached_units(),
        p._ext.runs(),
        list(p._ext.heap),
        p._ext.count,
        bytes(p._tag),
        bytes(p._piece),
        dict(p._who),
        p._next_handle,
        dict(p._held),
        dict(p._held_ckpt),
        dict(p._held_xfer),
        bytes(p._dirtyf),
        list(p._dirty_runs),
        p._defer,
        list(p._deferred),
    )


def _store_state(s: I.PageUnitCheckpointStore) -> tuple[Any, ...]:
    return (
        s.snapshot(),
        list(s._victims),
        s._stamp,
        s._num_evictable,
        list(s._lru),
        list(s._changes),
        {c: (r.stamp, r.runs) for c, r in s.records.items()},
    )


# ---------------------------------------------------------------------------------------
# Fast vs general path, with a KV side
# ---------------------------------------------------------------------------------------

HASHES = range(8)


class KVWorld:
    """A production store over a production pool with an engine's KV side. The engine's
    ``on_evict`` unindexes the hash and, by its own seeded draw, re-enters the store or
    raises; the draws are the same in both worlds as long as their calls are."""

    def __init__(self, fast: bool, seed: int, n: int, sp: Any, reenter: bool) -> None:
        self.fast = fast
        self.pool = I.UnitPool(n)
        self.store = I.PageUnitCheckpointStore(self.pool, sp, clock=FakeClock())
        self.store.row_sink = set()
        self.rows: list[tuple[str, T.Row, object]] = []
        self.store.on_transition = lambda m, row, subj: self.rows.append((m, row, subj))
        self.fired: list[tuple[int, Any]] = []
        self.cb_rng = random.Random(seed * 7919 + 1)
        self.reenter = reenter
        self.pool.on_evict = self._on_evict
        self.kv: dict[tuple[str, int], list[int]] = {}
        self.depth = 0

    def _on_evict(self, h: int) -> None:
        r = self.cb_rng
        self.fired.append((h, self.store.unindex(h)))
        if not self.reenter or self.depth:
            return
        self.depth += 1
        try:
            x = r.random()
            if x < 0.15:
                op = self.store.begin_store(r.choice(HASHES), 1)
                self.fired.append(("begin", _op_result(op)))
            elif x < 0.25:
                self.fired.append(("ensure", self.store.ensure_free_units(r.randint(0, 6))))
            elif x < 0.28:
                self.store.clear()
                self.fired.append(("clear", None))
            elif x < 0.33:
                self.fired.append(("complete", self.store.complete_inflight()))
            elif x < 0.38:
                raise RuntimeError(f"engine refuses {h}")
        finally:
            self.depth -= 1

    def call(self, fn: Callable[[], Any]) -> tuple[Any, ...]:
        if self.fast:
            return _outcome(fn)
        with general_path():
            return _outcome(fn)

    def state(self) -> tuple[Any, ...]:
        return (
            _pool_state(self.pool),
            _store_state(self.store),
            sorted(self.store.row_sink),
            list(self.rows),
            list(self.fired),
            {k: list(v) for k, v in self.kv.items()},
        )


def _op_result(op: Any) -> Any:
    return None if op is None else (op.src_slot, tuple(op.unit_ids), op.total_bytes)


def _kv_step(rng: random.Random, worlds: list[KVWorld], step: int) -> str:
    """One random call, made on every world: the driver reads the first world's state
    (which equals the others' after every step)."""
    w0 = worlds[0]
    x = rng.random()
    if x < 0.30:
        h, slot = rng.choice(HASHES), rng.randint(0, 2)
        name, fn = "begin_store", lambda w: _op_result(w.store.begin_store(h, slot))
    elif x < 0.42:
        name, fn = "complete_inflight", lambda w: w.store.complete_inflight()
    elif x < 0.46:
        h = rng.choice(HASHES)
        name, fn = "unindex", lambda w: w.store.unindex(h)
    elif x < 0.50:
        k = rng.randint(0, 8)
        name, fn = "ensure_free_units", lambda w: w.store.ensure_free_units(k)
    elif x < 0.51:
        name, fn = "clear", lambda w: w.store.clear()
    elif x < 0.56:
        h, slot = rng.choice(HASHES), rng.randint(0, 3)
        name, fn = "begin_restore", lambda w: _restore(w, h, slot)
    elif x < 0.60:
        name, fn = "take_restore_ops", lambda w: len(w.store.take_restore_ops())
    elif x < 0.72:
        count = rng.randint(1, 4)
        owner = ("kv", step)

        def fn(w: KVWorld, count: int = count, owner: Any = owner) -> Any:
            got = w.pool.reserve_units(count, owner)
            if got is not None:
                w.kv[owner] = list(got)
            return got

        name = "reserve_units"
    elif x < 0.86 and w0.kv:
        owner = rng.choice(sorted(w0.kv))
        hashes = [rng.choice([None, *HASHES]) for _ in w0.kv[owner]]

        def fn(w: KVWorld, owner: Any = owner, hashes: Any = hashes) -> Any:
            w.pool.cache_units(w.kv.pop(owner), owner, hashes)

        name = "cache_units"
    elif x < 0.89 and w0.kv:
        owner = rng.choice(sorted(w0.kv))

        def fn(w: KVWorld, owner: Any = owner) -> Any:
            w.pool.release_units(w.kv.pop(owner), owner)

        name = "release_units"
    elif x < 0.95 and w0.pool.num_cached:
        units = [u for u, _ in w0.pool.cached_units()]
        pick = rng.sample(units, rng.randint(1, min(3, len(units))))
        owner = ("kv", step)

        def fn(w: KVWorld, pick: Any = pick, owner: Any = owner) -> Any:
            w.pool.claim_cached_units(pick, owner)
            w.kv[owner] = list(pick)

        name = "claim_cached_units"
    elif w0.pool.num_cached:
        units = [u for u, _ in w0.pool.cached_units()]
        pick = rng.sample(units, 1)
        name, fn = "uncache_units", lambda w: w.pool.uncache_units(pick)
    else:
        name, fn = "complete_inflight", lambda w: w.store.complete_inflight()
    outcomes = [w.call(lambda w=w: fn(w)) for w in worlds]
    assert all(o == outcomes[0] for o in outcomes), f"step {step} {name}: {outcomes}"
    return name


def _restore(w: KVWorld, h: int, slot: int) -> Any:
    if w.store.restore_queued_for(slot) is not None or slot in w.store._inflight_slots:
        return "busy"
    op = w.store.begin_restore(h, slot)
    return None if op is None else tuple(op.unit_ids)


def _kv_lockstep(
    seed: int, steps: int, n: int, sp: Any, reenter: bool, callback: bool = True
) -> dict[str, int]:
    rng = random.Random(seed)
    worlds = [KVWorld(fast, seed, n, sp, reenter) for fast in (True, False)]
    if not callback:  # an engine that wires no on_evict: cached units are taken silently
        for w in worlds:
            w.pool.on_evict = None
    seen: dict[str, int] = {}
    for step in range(steps):
        name = _kv_step(rng, worlds, step)
        seen[name] = seen.get(name, 0) + 1
        a, b = worlds[0].state(), worlds[1].state()
        if a != b:
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                assert x == y, f"seed {seed} step {step} {name}: part {i}: {x!r} != {y!r}"
        for w in worlds:
            assert w.store.self_check() == [], (seed, step, name, w.fast)
            assert check_invariants(w.store.snapshot()) == [], (seed, step, name, w.fast)
    return seen


@pytest.mark.parametrize(
    ("reenter", "callback"),
    [(False, True), (True, True), (False, False)],
    ids=["plain-engine", "reentrant-engine", "no-callback"],
)
def test_fast_begin_matches_the_general_path_over_a_kv_pool(reenter: bool, callback: bool) -> None:
    """Random runs over a small pool with cached KV units, engine reservations and an
    ``on_evict`` that unindexes (and, re-entrant, begins stores, makes room, clears,
    completes, or raises), or no ``on_evict`` at all: the fused begin and the general begin
    give the same return values, callbacks (hashes, order, what they returned), rows
    (``row_sink`` and the ``on_transition`` sequence with subjects) and the same pool and
    store internals (extents and heap, tags and handles, per-owner counts, dirty index,
    victim heap, stamps, change log) after every call; both pass ``self_check`` and SPEC C's
    invariants."""
    total: dict[str, int] = {}
    for seed in range(16):
        for n, sp in ((12, spec(10, 25)), (9, spec(10, 30)), (7, spec(10, 10))):
            got = _kv_lockstep(seed, 180, n, sp, reenter, callback)
            for k, v in got.items():
                total[k] = total.get(k, 0) + v
    # the run reached the paths under test: stores, KV caching and claiming
    assert total["begin_store"] > 500 and total["cache_units"] > 100, total


def test_the_kv_lockstep_reaches_every_begin_branch() -> None:
    """The lockstep above is only worth something if the fused begin took each of its
    branches: evictions, the vacant shortcut, the no-callback reservation over cached units
    (``on_evict`` unset) and the deferral block. Counted on one plain run with ``on_evict``
    dropped half of the time."""
    hits: dict[str, int] = {"evict": 0, "vacant": 0, "deferred": 0, "plain": 0}
    real_vacant = I.UnitPool._reserve_vacant_ckpt
    real_deferred = I.PageUnitCheckpointStore._begin_deferred
    real_runs = I.UnitPool._reserve_runs

    def vacant(self: Any, count: int, cid: int) -> Any:
        hits["vacant"] += 1
        return real_vacant(self, count, cid)

    def deferred(self: Any, h: int, cid: int, pool: Any) -> Any:
        hits["deferred"] += 1
        return real_deferred(self, h, cid, pool)

    def runs(self: Any, count: int, owner: Any) -> Any:
        if isinstance(owner, tuple) and owner[0] == "state-checkpoint" and not self._defer:
            hits["plain"] += 1
        return real_runs(self, count, owner)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(I.UnitPool, "_reserve_vacant_ckpt", vacant)
        mp.setattr(I.PageUnitCheckpointStore, "_begin_deferred", deferred)
        mp.setattr(I.UnitPool, "_reserve_runs", runs)
        for seed in range(6):
            w = KVWorld(True, seed, 9, spec(10, 30), reenter=False)
            if seed % 2:
                w.pool.on_evict = None
            rng = random.Random(seed)
            for step in range(150):
                _kv_step(rng, [w], step)
            hits["evict"] += w.store.evictions
    assert all(v > 0 for v in hits.values()), hits


# ---------------------------------------------------------------------------------------
# Production store vs the reference model (no KV side)
# ---------------------------------------------------------------------------------------


class RefPair:
    """The reference store and the production store over their own pools, one clock."""

    def __init__(self, n: int, sp: Any) -> None:
        clock = FakeClock()
        self.r = R.PageUnitCheckpointStore(R.UnitPool(n), sp, clock=clock)
        self.i = I.PageUnitCheckpointStore(I.UnitPool(n), sp, clock=clock)
        self.r.row_sink = set()
        self.i.row_sink = set()

    def both(self, name: str, *args: Any) -> Any:
        a = _outcome(lambda: getattr(self.r, name)(*args))
        b = _outcome(lambda: getattr(self.i, name)(*args))
        a, b = _norm(a), _norm(b)
        assert a == b, f"{name}{args}: reference {a!r}, production {b!r}"
        self.agree(f"{name}{args}")
        return a

    def agree(self, where: str) -> None:
        sr, si = self.r.snapshot(), self.i.snapshot()
        assert sr == si, f"after {where}: " + "; ".join(sr.diff(si))
        assert self.r.row_sink == self.i.row_sink, f"after {where}: rows differ"
        assert self.i.self_check() == [], where


def _norm(outcome: tuple[Any, ...]) -> tuple[Any, ...]:
    if outcome[0] == "ok":
        v = outcome[1]
        if hasattr(v, "unit_ids") and hasattr(v, "src_slot"):
            return ("ok", _op_result(v))
        if isinstance(v, tuple) and v and hasattr(v[0], "dst_slot"):
            return ("ok", tuple((o.dst_slot, tuple(o.unit_ids)) for o in v))
        if hasattr(v, "dst_slot"):
            return ("ok", (v.dst_slot, tuple(v.unit_ids)))
    return outcome


def _ref_step(rng: random.Random, p: RefPair) -> str:
    x = rng.random()
    if x < 0.40:
        p.both("begin_store", rng.choice(HASHES), rng.randint(0, 2))
        return "begin_store"
    if x < 0.55:
        p.both("complete_inflight")
        return "complete_inflight"
    if x < 0.60:
        p.both("unindex", rng.choice(HASHES))
        return "unindex"
    if x < 0.65:
        p.both("ensure_free_units", rng.randint(0, 10))
        return "ensure_free_units"
    if x < 0.67:
        p.both("clear")
        return "clear"
    if x < 0.77:
        slot = rng.randint(0, 3)
        if p.r.restore_queued_for(slot) is None and all(
            s != slot for _, op in p.r._inflight_restores for s in [op.dst_slot]
        ):
            p.both("begin_restore", rng.choice(HASHES), slot)
        return "begin_restore"
    if x < 0.82:
        p.both("take_restore_ops")
        return "take_restore_ops"
    if x < 0.86:
        p.both("cancel_queued_restore", rng.randint(0, 3))
        return "cancel_queued_restore"
    if x < 0.93:
        g = rng.randint(-1, p.r.generation + 1)
        p.both("changed_since", g)
        return "changed_since"
    protected = rng.choice([None, *HASHES])
    p.both("has_available_units", rng.randint(0, 10), protected)
    return "has_available_units"


@pytest.mark.parametrize(
    ("n", "image"),
    [(9, 30), (6, 30), (8, 30), (4, 40), (3, 10)],
    ids=["full-3x3", "full-2x3", "remainder-8/3", "one-image-pool", "one-unit-images"],
)
def test_fast_begin_matches_the_reference_on_eviction_heavy_pools(n: int, image: int) -> None:
    """Pools whose size is a multiple of the image (a begin on a full pool evicts exactly
    the LRU victim, and the last unit is taken), or not (units left that no image fits),
    with restores pinning victims: every return value, snapshot (counters, generation,
    change log, next checkpoint id), ``changed_since`` answer and the ``row_sink``
    coverage equal the reference's after every call."""
    evictions = 0
    for seed in range(6):
        p = RefPair(n, spec(10, image))
        rng = random.Random(1000 + seed)
        for _ in range(120):
            _ref_step(rng, p)
        evictions += p.i.evictions
    assert evictions > 20


def test_clones_continue_in_lockstep_with_the_reference() -> None:
    """A store cloned mid-run (with READY, COPYING and pinned records) and its original go
    on through different calls; each stays in lockstep with the clone of the reference
    made at the same point, and neither disturbs the other (the fused begin writes only
    its own store's and pool's structures)."""
    for seed in range(4):
        p = RefPair(9, spec(10, 30))
        rng = random.Random(50 + seed)
        for _ in range(40):
            _ref_step(rng, p)
        q = RefPair.__new__(RefPair)
        q.r, q.i = p.r.clone(), p.i.clone()
        q.r.row_sink, q.i.row_sink = set(p.r.row_sink), set(p.i.row_sink)
        assert q.i.pool is not p.i.pool and type(q.i.pool) is I.UnitPool
        before = p.i.snapshot()
        for _ in range(60):
            _ref_step(rng, q)
        assert p.i.snapshot() == before  # the clone's calls left the original alone
        for _ in range(60):
            _ref_step(rng, p)
        assert p.i.pool.self_check() == [] and q.i.pool.self_check() == []


def test_a_refused_begin_keeps_the_checkpoint_id_and_changes_nothing() -> None:
    """A pool whose every image is pinned (restores queued) refuses a begin: nothing
    changes (no eviction, no id taken, no row), and the next begin after the pins go gets
    the id the refused one would have had, as in the reference."""
    p = RefPair(6, spec(10, 30))
    for h, slot in ((1, 0), (2, 1)):
        p.both("begin_store", h, 0)
        p.both("complete_inflight")
        p.both("begin_restore", h, slot)
    before = p.i.snapshot()
    rows = set(p.i.row_sink)
    assert p.both("begin_store", 3, 0) == ("ok", None)
    assert p.i.snapshot() == before and p.i.row_sink == rows
    assert p.both("ensure_free_units", 1) == ("ok", False)
    p.both("cancel_queued_restore", 0)
    got = p.both("begin_store", 3, 0)
    assert got[1] is not None
    assert p.i.snapshot().records[2].prefix_hash == 3  # id 2: the refused begin took none
    assert p.i.evictions == 1


def test_a_begin_in_a_full_pool_evicts_exactly_the_lru_victim() -> None:
    """Pool exactly full of READY images: each begin evicts one victim, the least recently
    used unpinned one (a restore pin moves a record to the hot end and protects it), takes
    its units lowest first, bumps the generation once and logs the victim's hash."""
    p = RefPair(9, spec(10, 30))
    for h in (1, 2, 3):
        p.both("begin_store", h, 0)
        p.both("complete_inflight")
    p.both("begin_restore", 1, 0)  # 1 is now pinned and most recent
    g = p.i.generation
    op = p.both("begin_store", 4, 0)
    assert op == ("ok", (0, (3, 4, 5), 30))  # record 1 (hash 2) gave its units
    assert p.i.evictions == 1 and p.i.generation == g + 1
    assert p.i.changed_since(g) == {2}
    p.both("complete_inflight")
    p.both("take_restore_ops")
    p.both("complete_inflight")  # restore done: hash 1 unpinned, still the hottest
    op = p.both("begin_store", 5, 0)
    assert op == ("ok", (0, (6, 7, 8), 30))  # hash 3 is now the LRU victim
    assert p.i.changed_since(g) == {2, 3, 4}


# ---------------------------------------------------------------------------------------
# Targeted cases: callbacks and hooks
# ---------------------------------------------------------------------------------------


def _cached_world(fast: bool, on_evict: Callable[[Any, int], None]) -> tuple[Any, ...]:
    """Vacant 0, 1 and cached 2..5 under hashes 21..24; ``on_evict(store, h)``. A begin of
    a 3-unit image under hash 21 takes 0, 1, 2 and fires ``on_evict(21)``: the very hash
    being stored."""
    pool = I.UnitPool(6)
    kv = pool.reserve_units(6, ("kv", 0))
    assert kv is not None
    pool.cache_units(kv, ("kv", 0), [None, None, 21, 22, 23, 24])
    store = I.PageUnitCheckpointStore(pool, spec(10, 30))
    store.row_sink = set()
    rows: list[Any] = []
    store.on_transition = lambda m, row, subj: rows.append((m, row, subj))
    pool.on_evict = lambda h: on_evict(store, h)
    ctx = contextlib.nullcontext() if fast else general_path()
    with ctx:
        out = _outcome(lambda: _op_result(store.begin_store(21, 0)))
        out2 = _outcome(lambda: _op_result(store.begin_store(22, 1)))
    return out, out2, _pool_state(pool), _store_state(store), rows, store.self_check()


@pytest.mark.parametrize(
    "reaction",
    ["unindex", "unindex-then-begin", "clear", "ensure", "raise"],
)
def test_a_callback_during_the_cached_reservation_sees_the_record_filed(reaction: str) -> None:
    """The engine's ``on_evict`` for the hash being stored (its own KV block overwritten by
    the image) unindexes it (the new record goes EVICTING), begins another store, clears,
    makes room or raises: the fused begin behaves as the general one (same ops, errors,
    rows, pool and store state) and the store passes ``self_check`` afterwards."""

    def react(store: Any, h: int) -> None:
        store.unindex(h)
        if reaction == "unindex-then-begin":
            store.begin_store(h + 100, 2)
        elif reaction == "clear":
            store.clear()
        elif reaction == "ensure":
            store.ensure_free_units(3)
        elif reaction == "raise":
            raise RuntimeError("engine")

    fast, general = _cached_world(True, react), _cached_world(False, react)
    assert fast == general
    assert fast[-1] == []


def _full_store() -> Any:
    """A production store whose 9-unit pool is full of three READY 3-unit images (hashes
    1, 2, 3, oldest first), with a row sink."""
    store = I.PageUnitCheckpointStore(I.UnitPool(9), spec(10, 30))
    for h in (1, 2, 3):
        store.begin_store(h, 0)
        store.complete_inflight()
    store.row_sink = set()
    return store


def test_a_hook_that_raises_inside_the_eviction_loop_leaves_the_same_state() -> None:
    """``on_transition`` raising on the victim's evict row (a full pool): the fused loop
    stops where the general one stops (the victim's row applied and recorded, its units
    vacant, no eviction counted for it, no record begun, no id taken); the store is
    consistent, and the next begin proceeds from there the same way."""

    def run(fast: bool) -> tuple[Any, ...]:
        store = _full_store()
        seen: list[Any] = []

        def hook(m: str, row: T.Row, subj: object) -> None:
            seen.append((row.event, subj))
            if row.event == "evict" and len(seen) == 1:
                raise RuntimeError("hook")

        store.on_transition = hook
        with contextlib.nullcontext() if fast else general_path():
            out = _outcome(lambda: store.begin_store(9, 0))
            mid = (_store_state(store), _pool_state(store.pool), store.self_check())
            out2 = _outcome(lambda: _op_result(store.begin_store(9, 0)))
        return out, mid, out2, seen, _store_state(store), _pool_state(store.pool)

    fast, general = run(True), run(False)
    assert fast == general
    assert fast[0][0] == "raised" and fast[1][-1] == []
    assert fast[1][0][0].evictions == 0 and fast[1][0][0].next_checkpoint_id == 3


def test_a_reentrant_begin_from_an_evict_row_hook_matches_the_general_path() -> None:
    """An ``on_transition`` hook that, on an evict row, begins another store (taking the
    room just made) and completes the batch: the outer begin then evicts again or gives
    up exactly as the general path does."""

    def run(fast: bool) -> tuple[Any, ...]:
        store = _full_store()
        seen: list[Any] = []

        def hook(m: str, row: T.Row, subj: object) -> None:
            seen.append((row.event, subj))
            if row.event == "evict" and len(seen) < 3:
                seen.append(("nested", _op_result(store.begin_store(50 + len(seen), 1))))
                store.complete_inflight()

        store.on_transition = hook
        with contextlib.nullcontext() if fast else general_path():
            out = _outcome(lambda: _op_result(store.begin_store(9, 0)))
        return out, seen, _store_state(store), _pool_state(store.pool), store.self_check()

    fast, general = run(True), run(False)
    assert fast == general
    assert fast[-1] == []


def _begin_row_view(mode: str, act: str) -> tuple[Any, ...]:
    """A begin whose ``on_transition`` hook, on the begin row, reads the store (``read``),
    completes the batch (``complete``) or raises (``raise``). ``mode``: ``fast`` (vacant
    units suffice: the fused shortcut), ``fast-cached`` (the fused path, cached units and a
    callback: ``_begin_deferred``), ``general`` (``_FAST_ROWS`` off)."""
    pool = I.UnitPool(6)
    if mode == "fast-cached":
        kv = pool.reserve_units(6, ("kv", 0))
        assert kv is not None
        pool.cache_units(kv, ("kv", 0), [71, 72, 73, 74, 75, 76])
        pool.on_evict = lambda h: None
    store = I.PageUnitCheckpointStore(pool, spec(10, 30))
    seen: list[Any] = []

    def hook(m: str, row: T.Row, subj: object) -> None:
        if row.event != "begin_store":
            return
        snap = store.snapshot()
        seen.append((snap.inflight_stores, check_invariants(snap)))
        if act == "complete":
            store.complete_inflight()
        elif act == "raise":
            raise RuntimeError("hook")

    store.on_transition = hook
    with contextlib.nullcontext() if mode != "general" else general_path():
        out = _outcome(lambda: store.begin_store(1, 0) is not None)
    snap = store.snapshot()
    return out, seen, snap.inflight_stores, {c: r.phase for c, r in snap.records.items()}


@pytest.mark.parametrize("act", ["read", "complete", "raise"])
def test_the_begin_row_hook_sees_one_store_on_every_path(act: str) -> None:
    """The begin row's ``on_transition`` hook sees the same store on the fused shortcut
    (vacant units suffice), on the fused path's deferred reservation (cached units) and on
    the general path: the record already in flight (a helper found the shortcut appended
    before the hook and the other paths after; every path now appends first). ``read``:
    what the hook reads; ``complete``: a hook that completes the batch; ``raise``: a hook
    that raises (a misuse: the hook must not raise), the end state."""
    views = {m: _begin_row_view(m, act) for m in ("fast", "fast-cached", "general")}
    assert views["fast-cached"] == views["general"]  # the two hook-first paths agree
    assert views["fast"] == views["general"], views


# ---------------------------------------------------------------------------------------
# The coordinator's drain (which calls the store's begin directly), with a KV side
# ---------------------------------------------------------------------------------------


class _Seq:
    def __init__(self, slot: int) -> None:
        self.state_slot = slot
        self.has_per_req_cache = True


class CoordWorld:
    """A production coordinator over a production pool with an engine's KV side whose
    ``on_evict`` calls ``coordinator.unindex`` (and raises now and then, by a seeded
    draw)."""

    def __init__(self, fast: bool, seed: int, n: int, sp: Any, seqs: list[_Seq]) -> None:
        self.fast = fast
        self.pool = I.UnitPool(n)
        self.c = I.PagedStateCheckpointCoordinator(self.pool, sp, True, clock=FakeClock())
        self.c.row_sink = set()
        self.rows: list[Any] = []
        self.c.on_transition = lambda m, row, subj: self.rows.append((m, row, subj))
        self.fired: list[Any] = []
        self.cb_rng = random.Random(seed * 31 + 5)
        self.pool.on_evict = self._on_evict
        self.kv: dict[Any, list[int]] = {}
        self.seqs = seqs  # shared: the coordinator keys boundaries by sequence identity

    def _on_evict(self, h: int) -> None:
        self.fired.append(h)
        self.c.unindex(h)
        if self.cb_rng.random() < 0.05:
            raise RuntimeError(f"engine refuses {h}")

    def call(self, fn: Callable[[], Any]) -> tuple[Any, ...]:
        if self.fast:
            return _outcome(fn)
        with general_path():
            return _outcome(fn)

    def state(self) -> tuple[Any, ...]:
        return (
            self.c.snapshot(),
            _pool_state(self.pool),
            _store_state(self.c.store),
            sorted(self.c.row_sink),
            list(self.rows),
            list(self.fired),
            self.c.checkpoint_fates(),
        )


def _coord_step(rng: random.Random, worlds: list[CoordWorld], step: int) -> str:
    w0 = worlds[0]
    x = rng.random()
    h = rng.choice(HASHES)
    si = rng.randrange(3)
    if x < 0.30:
        name, fn = "checkpoint", lambda w: w.c.checkpoint(w.seqs[si], 1, h)
    elif x < 0.45:
        name, fn = "take_checkpoint_ops", lambda w: _ops(w.c.take_checkpoint_ops())
    elif x < 0.57:
        name, fn = "complete_previous_batch", lambda w: w.c.complete_previous_batch()
    elif x < 0.60:
        name, fn = "unindex", lambda w: w.c.unindex(h)
    elif x < 0.61:
        name, fn = "clear_index", lambda w: w.c.clear_index()
    elif x < 0.66:
        slot = rng.randrange(4)

        def fn(w: CoordWorld) -> Any:
            s = w.c.store
            if s.restore_queued_for(slot) is not None or slot in s._inflight_slots:
                return "busy"
            op = w.c.begin_restore(h, slot)
            return None if op is None else tuple(op.unit_ids)

        name = "begin_restore"
    elif x < 0.78:
        count, owner = rng.randint(1, 4), ("kv", step)

        def fn(w: CoordWorld) -> Any:
            got = w.pool.reserve_units(count, owner)
            if got is not None:
                w.kv[owner] = list(got)
            return got

        name = "reserve_units"
    elif x < 0.92 and w0.kv:
        owner = rng.choice(sorted(w0.kv))
        hashes = [rng.choice([None, *HASHES]) for _ in w0.kv[owner]]

        def fn(w: CoordWorld) -> Any:
            w.pool.cache_units(w.kv.pop(owner), owner, hashes)

        name = "cache_units"
    elif x < 0.96 and w0.pool.num_cached:
        units = [u for u, _ in w0.pool.cached_units()]
        pick = rng.sample(units, min(2, len(units)))
        owner = ("kv", step)

        def fn(w: CoordWorld) -> Any:
            w.pool.claim_cached_units(pick, owner)
            w.kv[owner] = list(pick)

        name = "claim_cached_units"
    else:
        k = rng.randint(0, 6)
        name, fn = "ensure_free_units", lambda w: w.c.ensure_free_units(k)
    outcomes = [w.call(lambda w=w: fn(w)) for w in worlds]
    assert all(o == outcomes[0] for o in outcomes), f"step {step} {name}: {outcomes}"
    return name


def _ops(got: Any) -> Any:
    stores, restores = got
    return (
        tuple(_op_result(op) for op in stores),
        tuple((op.dst_slot, tuple(op.unit_ids)) for op in restores),
    )


def test_the_coordinators_drain_matches_the_general_path_over_a_kv_pool() -> None:
    """The coordinator's drain begins its boundary stores through the store's begin: over a
    pool with cached KV units whose ``on_evict`` calls ``coordinator.unindex`` (raising now
    and then, SPEC G8), the fused begin and the general one give the same drains, fates,
    callbacks, rows and pool and store internals after every call, and both coordinators
    pass ``self_check``."""
    drained = evictions = fired = 0
    for seed in range(16):
        for n, sp in ((9, spec(10, 30)), (10, spec(10, 20))):
            rng = random.Random(seed)
            seqs = [_Seq(k) for k in range(3)]
            worlds = [CoordWorld(fast, seed, n, sp, seqs) for fast in (True, False)]
            for step in range(120):
                name = _coord_step(rng, worlds, step)
                drained += name == "take_checkpoint_ops"
                a, b = worlds[0].state(), worlds[1].state()
                if a != b:
                    for i, (x, y) in enumerate(zip(a, b, strict=True)):
                        assert x == y, f"seed {seed} step {step} {name}: part {i}"
                for w in worlds:
                    assert w.c.self_check() == [], (seed, step, name, w.c.self_check())
            evictions += worlds[0].c.store.evictions
            fired += len(worlds[0].fired)
    assert drained > 100 and evictions > 20 and fired > 20, (drained, evictions, fired)


def test_a_raising_begin_row_hook_leaves_no_stranded_record() -> None:
    """``on_transition`` raising on the begin row over cached units (the deferred
    reservation; a misuse, the hook must not raise): the record is in flight before the hook
    runs, so the next completion settles it and the store stays consistent (SPEC C's
    ``copying_in_flight``); before the helper's finding it was filed COPYING and pending but
    in no batch, its units and hash held for good."""
    pool = I.UnitPool(6)
    kv = pool.reserve_units(6, ("kv", 0))
    assert kv is not None
    pool.cache_units(kv, ("kv", 0), [71, 72, 73, 74, 75, 76])
    pool.on_evict = lambda h: None
    store = I.PageUnitCheckpointStore(pool, spec(10, 30))

    def hook(m: str, row: T.Row, subj: object) -> None:
        if row.event == "begin_store":
            raise RuntimeError("hook")

    store.on_transition = hook
    with pytest.raises(RuntimeError):
        store.begin_store(1, 0)
    store.on_transition = None
    store.complete_inflight()
    problems = check_invariants(store.snapshot())
    assert problems == [] and 1 not in store.snapshot().pending, problems
