"""Adversarial review of SPEC A.5 (runs of units): the production pool's free extents,
reservation handles and dirty index, the copy ops' two views of their units, and the store's
record runs, against the reference model and the pool's own ``self_check``.

Tests named ``test_bug_*`` exposed defects found in the review (int-subclass unit ids lost
or refused on the run paths, an oversized run expanded before it was refused); they pass
since the fixes and stay as regression tests, beside the tests of what held up:

- raw-unit programs on the production pool and the reference pool give the same results,
  the same ``snapshot_parts`` and the same readings, with ``self_check() == []`` after every
  call, and a call that raises changes no structure of the production pool (SPEC G8);
- the KV calls with an ``on_evict`` that raises (plain and inside ``deferred_evictions``),
  and with re-entrant callbacks that release and reserve, keep every index consistent, and
  an undone reservation leaves every structure exactly as it was;
- the store over a pool fragmented by cached KV units, with ``on_evict`` calling the store's
  ``unindex``, keeps ``self_check() == []`` and the SPEC C invariants;
- ops built from unit ids and from runs are the same values (equality, hash, repr,
  pickling, copy, ``evolve``);
- the dirty index stays bounded without a scrub, and ``dirty_units`` is exact after
  ``mark_clean``.
"""

from __future__ import annotations

import copy
import math
import pickle
import random
from array import array
from collections import OrderedDict
from typing import Any

import pytest
from conftest import spec
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedstate import impl as I
from pagedstate.impl import _pool_extents
from pagedstate.models import reference as R
from pagedstate.spec import EvictionCallbackError, PagedStateError, check_invariants
from pagedstate.spec.ops import CheckpointRestoreOp, CheckpointStoreOp, run_units, unit_runs
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER


class Sub(int):
    """An int subclass (an ``IntEnum`` behaves the same): the pools accept it as a unit id
    (``need_int`` takes int subclasses, as the reference model does)."""


# -- helpers ------------------------------------------------------------------------------------


def canon(x: Any) -> Any:
    """A comparable deep copy of a pool structure (containers by content and order)."""
    if isinstance(x, (int, float, str, bool, bytes, type(None))):
        return (type(x).__name__, x)
    if isinstance(x, (array, bytearray)):
        return (type(x).__name__, getattr(x, "typecode", ""), bytes(x))
    if isinstance(x, (dict, OrderedDict)):
        return ("dict", tuple((canon(k), canon(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(canon(v) for v in x))
    slots = getattr(type(x), "__slots__", None)
    if slots and type(x).__module__.startswith("pagedstate.impl"):
        return (type(x).__name__, tuple(canon(getattr(x, s)) for s in slots if s != "_pool"))
    return ("id", id(x))


_SKIP = {"on_evict", "_store_access", "_deferral"}


def deep(pool: I.UnitPool) -> Any:
    """Every structure of a production pool, canonically."""
    return tuple((k, canon(v)) for k, v in sorted(vars(pool).items()) if k not in _SKIP)


def owner_for(kind: int, n: int) -> Any:
    return (("live", n), (CHECKPOINT_OWNER, n), (TRANSFER_OWNER, ("t", n)))[kind % 3]


def tagged(pool: Any, owner: Any) -> list[int]:
    """``owner``'s units in piece order, from the pool's readings."""
    units = [(t[1], u) for u, t in pool.snapshot_parts()[2].items() if t[0] == owner]
    return [u for _, u in sorted(units)]


STEPS = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 60), st.integers(0, 60), st.integers(0, 2)),
    max_size=60,
)


# -- bugs ---------------------------------------------------------------------------------------


def test_bug_release_units_refuses_int_subclass_ids_the_reference_accepts() -> None:
    """The production pool validates ids with ``need_int`` (int subclasses pass, as in the
    reference) and then builds runs with ``unit_runs``, which refuses anything whose type is
    not exactly ``int``: the release raises InvalidArgumentError ("a unit id must be an int
    >= 0, got 0") where the reference releases. Expected: the same outcome as the reference."""
    outcomes = []
    for pool in (R.UnitPool(6), I.UnitPool(6)):
        got = pool.reserve_units(3, "kv")
        assert got == [0, 1, 2]
        try:
            pool.release_units([Sub(u) for u in got], "kv")
            outcomes.append(("ok", pool.snapshot_parts()))
        except PagedStateError as exc:
            outcomes.append(("raised", type(exc).__name__))
    assert outcomes[1] == outcomes[0]


def test_bug_claim_cached_units_with_int_subclass_ids_loses_the_units() -> None:
    """``claim_cached_units`` deletes the ids from the cached LRU, then ``unit_runs`` raises
    on the int subclass: the call raises with the units neither cached, vacant nor tagged
    (``num_free`` drops, ``self_check`` reports them, SPEC G8 broken). Expected: the claim
    succeeds (the ids are valid unit ids) or raises with nothing changed."""
    pool = I.UnitPool(8)
    kv = pool.reserve_units(3, "kv")
    assert kv is not None
    pool.cache_units(kv, "kv", [11, 12, 13])
    before = deep(pool)
    try:
        pool.claim_cached_units([Sub(0), Sub(1)], "hit")
    except PagedStateError:
        assert deep(pool) == before, "claim_cached_units raised but changed the pool"
    else:
        assert pool.owner_of(0) == ("hit", 0) and pool.owner_of(1) == ("hit", 1)
    assert pool.self_check() == []
    assert pool.num_free == 8 - len(tagged(pool, "hit"))


def test_bug_uncached_int_subclass_ids_leak_into_the_store_ops_runs() -> None:
    """``uncache_units`` keeps the caller's id objects as extent starts; a later store takes
    that extent and its op's runs carry the int subclass (``CheckpointStoreOp._of_runs`` does
    not check). The executor's ``validate_batch`` then refuses the store's own op with
    CopyOpError ("runs must be (first, count) int pairs ... got ((4, 3),)"). Expected: the
    store's ops carry exact ints and the batch validates."""
    pytest.importorskip("numpy")  # the executor's dependency
    from gpu_helpers import mini_layout

    from pagedstate.gpu.executor import validate_batch

    layout = mini_layout()
    pool = I.UnitPool(10)
    kv = pool.reserve_units(10, "kv")
    assert kv is not None
    pool.cache_units(kv, "kv", list(range(10)))
    pool.uncache_units([Sub(u) for u in (4, 5, 6)])
    store = I.PageUnitCheckpointStore(pool, layout.spec())
    op = store.begin_store(99, 0)
    assert op is not None and op.unit_ids == (4, 5, 6)
    assert all(type(f) is int and type(c) is int for f, c in op.runs), op.runs
    validate_batch(layout, [op], [], num_slots=2, num_blocks=10)


@pytest.mark.parametrize("count", [2**62, 2**70])
def test_bug_validate_batch_expands_an_oversized_run_instead_of_refusing_it(count: int) -> None:
    """SPEC E.5 step 1: an op whose runs leave the pool is refused with CopyOpError naming
    it. For a refused batch the per-op pass expands ``op.unit_ids`` before range-checking,
    so a run of 2**62 units raises MemoryError and one of 2**70 OverflowError (a run of
    10**9 would allocate gigabytes first). Expected: CopyOpError, from the runs alone."""
    pytest.importorskip("numpy")
    from gpu_helpers import mini_layout

    from pagedstate.gpu.executor import validate_batch
    from pagedstate.spec.errors import CopyOpError

    layout = mini_layout()
    op = CheckpointStoreOp.from_runs(0, ((0, count),), layout.image_bytes, layout.layout_id)
    with pytest.raises(CopyOpError):
        validate_batch(layout, [op], [], num_slots=2, num_blocks=10)


def test_the_extents_module_says_what_the_arrays_are() -> None:
    """``_pool_extents.TAG_TYPECODE`` is the element of the pieces and the ramp (32 bits:
    each below ``num_units``); the tags are int64
    handles, never reused (a review found the module's docstring still describing reused
    32-bit tags)."""
    pool = I.UnitPool(4)
    assert pool._piece.typecode == _pool_extents.TAG_TYPECODE and pool._tag.typecode == "q"
    assert pool._ramp.typecode == _pool_extents.TAG_TYPECODE and list(pool._ramp) == [0, 1, 2, 3]
    doc = _pool_extents.__doc__ or ""
    assert "_fill" not in doc and "reused" not in doc


# -- the pool against the reference (raw units) ---------------------------------------------


def _raw_call(step: tuple[int, int, int, int], n: int, held: dict[Any, list[int]], nxt: int):
    """The call a program step makes: (method name, args)."""
    what, a, b, kind = step
    owners = list(held)
    if what <= 3 or not owners and what <= 6:
        return "reserve_units", (a % (n + 2), owner_for(kind, nxt))
    if what <= 6:
        o = owners[a % len(owners)]
        ids = list(held[o])
        if b % 7 == 0 and ids:
            ids = ids[:-1]  # a partial release: refused
        elif b % 7 == 1:
            ids = ids[::-1]  # out of piece order: refused unless one unit
        return "release_units", (ids, o)
    if what == 7 and owners:
        o = owners[a % len(owners)]
        return "rekey_units", (list(held[o]), o, owner_for(kind, nxt))
    if what == 8:
        return "mark_clean", ([u for u in range(n) if (u * 7 + a) % (b + 2) == 0],)
    return "dirty_units", ()


@settings(max_examples=max(20, settings.default.max_examples // 2))
@given(st.integers(1, 24), STEPS)
def test_raw_programs_match_the_reference(n: int, steps: list[tuple[int, int, int, int]]) -> None:
    prod, ref = I.UnitPool(n), R.UnitPool(n)
    held: dict[Any, list[int]] = {}
    for i, step in enumerate(steps):
        name, args = _raw_call(step, n, held, i + 1)
        outcomes = []
        for pool in (prod, ref):
            with pool._as_store():
                before = deep(pool) if pool is prod else None
                try:
                    outcomes.append(("ok", getattr(pool, name)(*args)))
                except PagedStateError as exc:
                    outcomes.append(("raised", type(exc).__name__))
                    if pool is prod:
                        assert deep(pool) == before, f"{name}{args} raised but changed the pool"
        assert outcomes[0] == outcomes[1], (name, args)
        assert prod.self_check() == []
        assert prod.snapshot_parts() == ref.snapshot_parts()
        assert [prod.owner_of(u) for u in range(n)] == [ref.owner_of(u) for u in range(n)]
        assert [prod.is_dirty(u) for u in range(n)] == [ref.is_dirty(u) for u in range(n)]
        assert prod.num_free == ref.num_free
        if outcomes[0][0] == "ok":
            if name == "reserve_units" and outcomes[0][1]:
                held[args[1]] = outcomes[0][1]
            elif name == "release_units":
                held.pop(args[1])
            elif name == "rekey_units":
                held[args[2]] = held.pop(args[1])


def test_a_fresh_pool_gives_one_run_and_the_reference_units_after_churn() -> None:
    """Many store-path reservations and releases in a shuffled order: the runs handed out are
    the reference's lowest free ids, as maximal runs."""
    n = 200
    prod, ref = I.UnitPool(n), R.UnitPool(n)
    live: list[tuple[Any, list[tuple[int, int]]]] = []
    for k in range(600):
        owner = (CHECKPOINT_OWNER, k)
        if live and k % 3 == 2:
            o, runs = live.pop((k * 31) % len(live))
            with prod._as_store(), ref._as_store():
                prod._release_runs(runs, o)
                ref.release_units(list(run_units(tuple(runs))), o)
            continue
        count = 1 + (k * 13) % 17
        with prod._as_store(), ref._as_store():
            runs = prod._reserve_runs(count, owner)
            got = ref.reserve_units(count, owner)
        if got is None:
            assert runs is None
            continue
        assert runs is not None
        assert tuple(runs) == unit_runs(got)
        live.append((owner, runs))
        assert prod.snapshot_parts() == ref.snapshot_parts()
    assert prod.self_check() == []


# -- the KV side: callbacks that raise, re-enter, and deferral blocks -----------------------------


class Boom(Exception):
    pass


@settings(max_examples=max(20, settings.default.max_examples // 2))
@given(st.integers(1, 16), STEPS, st.integers(0, 2**32))
def test_kv_programs_with_hostile_callbacks_keep_the_pool_consistent(
    n: int, steps: list[tuple[int, int, int, int]], salt: int
) -> None:
    pool = I.UnitPool(n)
    held: dict[Any, list[int]] = {}
    mode = {"m": 0, "k": 0}

    def on_evict(h: int) -> None:
        mode["k"] += 1
        if mode["m"] == 1:
            raise Boom(h)
        if mode["m"] == 2 and held:  # re-entrant: release one reservation, reserve another
            o = sorted(held, key=repr)[(salt + mode["k"]) % len(held)]
            with pool._as_store():
                pool.release_units(held.pop(o), o)
            o2 = ("reentrant", salt, mode["k"])
            got = pool.reserve_units(1 + mode["k"] % 2, o2)
            if got:
                held[o2] = got
            if (salt + mode["k"]) % 3 == 0:
                raise Boom(h)

    pool.on_evict = on_evict
    for i, (what, a, b, kind) in enumerate(steps):
        mode["m"] = (a + b + salt) % 3
        owner = owner_for(kind if what <= 2 else 0, i + 1)
        if what <= 3:
            deferred, undo = b % 4 == 0, b % 8 == 0
            before = deep(pool)
            try:
                if deferred:
                    with pool.deferred_evictions(undo_on_error=undo):
                        with pool._as_store():
                            pool._reserve(a % (n + 1), owner)
                else:
                    with pool._as_store():
                        pool.reserve_units(a % (n + 1), owner)
            except EvictionCallbackError as exc:
                if mode["m"] == 1 and (not deferred or undo):
                    assert exc.undone
                    assert deep(pool) == before, "an undone reservation left a trace"
            units = tagged(pool, owner)
            if units:
                held[owner] = units
        elif what <= 5 and held:
            o = sorted(held, key=repr)[a % len(held)]
            ids = held.pop(o)
            if o[0] in (CHECKPOINT_OWNER, TRANSFER_OWNER) or b % 4 == 0:
                with pool._as_store():
                    pool.release_units(ids, o)
            else:
                pool.cache_units(ids, o, [None if (u + b) % 3 == 0 else (u + b) % 5 for u in ids])
        elif what == 6 and pool.num_cached:
            cached = [u for u, _ in pool.cached_units()]
            ids = [u for j, u in enumerate(cached) if (j + a) % 3 == 0]
            pool.claim_cached_units(ids, ("hit", i))
            if ids:
                held[("hit", i)] = ids
        elif what == 7 and pool.num_cached:
            cached = [u for u, _ in pool.cached_units()]
            pool.uncache_units([u for j, u in enumerate(cached) if (j + b) % 2 == 0])
        elif what == 8 and held:
            o = sorted(held, key=repr)[a % len(held)]
            new = ("rekeyed", i) if o[0] not in (CHECKPOINT_OWNER,) else (CHECKPOINT_OWNER, -i)
            with pool._as_store():
                pool.rekey_units(held[o], o, new)
            held[new] = held.pop(o)
        else:
            pool.mark_clean([u for u in range(n) if (u + a) % 2 == 0])
            assert pool.dirty_units() == {u for u in range(n) if pool.is_dirty(u)}
        assert pool.self_check() == []
        tags = pool.snapshot_parts()[2]
        assert tags == {u: (o, p) for o, us in held.items() for p, u in enumerate(us)}
        assert pool.num_free == n - len(tags)


@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(st.integers(0, 2**32), st.sampled_from([1, 2, 3, 5, 8, 13, 40]))
def test_long_kv_programs_with_hostile_callbacks(seed: int, n: int) -> None:
    """The same as above as long seeded programs (250 calls): a raising callback undoes its
    reservation exactly (every structure of the pool as before), plain or in a deferral
    block with ``undo_on_error``; re-entrant callbacks release and reserve."""
    rnd = random.Random(seed)
    pool = I.UnitPool(n)
    held: dict[Any, list[int]] = {}
    mode = {"m": "ok"}
    counter = [0]

    def on_evict(h: int) -> None:
        if mode["m"] == "raise":
            raise Boom(h)
        if mode["m"] == "reenter" and held and rnd.random() < 0.5:
            o = rnd.choice(sorted(held, key=repr))
            with pool._as_store():
                pool.release_units(held.pop(o), o)
            if rnd.random() < 0.5:
                counter[0] += 1
                o2 = ("reentrant", counter[0])
                got = pool.reserve_units(rnd.randint(0, 3), o2)
                if got:
                    held[o2] = got
            if rnd.random() < 0.3:
                raise Boom(h)

    pool.on_evict = on_evict
    for _ in range(250):
        mode["m"] = rnd.choice(["ok", "raise", "raise", "reenter"])
        counter[0] += 1
        kind = rnd.choice([0, 0, 1, 2])
        owner = owner_for(kind, counter[0])
        x = rnd.random()
        if x < 0.35:
            count = rnd.randint(0, n)
            deferred = rnd.random() < 0.3
            undo = rnd.random() < 0.5
            before = deep(pool)
            try:
                if deferred:
                    with pool.deferred_evictions(undo_on_error=undo):
                        with pool._as_store():
                            pool._reserve(count, owner)
                else:
                    with pool._as_store():
                        pool.reserve_units(count, owner)
            except EvictionCallbackError as exc:
                if mode["m"] == "raise" and (not deferred or undo):
                    assert exc.undone
                    assert deep(pool) == before, "an undone reservation left a trace"
            units = tagged(pool, owner)
            if units:
                held[owner] = units
        elif x < 0.55 and held:
            o = rnd.choice(sorted(held, key=repr))
            ids = held.pop(o)
            if o[0] in (CHECKPOINT_OWNER, TRANSFER_OWNER) or rnd.random() < 0.3:
                with pool._as_store():
                    pool.release_units(ids, o)
            else:
                pool.cache_units(ids, o, [rnd.choice([None, rnd.randint(0, 5)]) for _ in ids])
        elif x < 0.65 and pool.num_cached:
            cached = [u for u, _ in pool.cached_units()]
            ids = rnd.sample(cached, rnd.randint(0, len(cached)))
            pool.claim_cached_units(ids, ("hit", counter[0]))
            if ids:
                held[("hit", counter[0])] = ids
        elif x < 0.72 and pool.num_cached:
            cached = [u for u, _ in pool.cached_units()]
            pool.uncache_units(rnd.sample(cached, rnd.randint(0, len(cached))))
        elif x < 0.8 and held:
            o = rnd.choice(sorted(held, key=repr))
            new = (o[0], counter[0]) if o[0] == CHECKPOINT_OWNER else ("rekeyed", counter[0])
            with pool._as_store():
                pool.rekey_units(held[o], o, new)
            held[new] = held.pop(o)
        elif x < 0.9:
            pool.mark_clean(rnd.sample(range(n), rnd.randint(0, n)))
        else:
            assert pool.dirty_units() == {u for u in range(n) if pool.is_dirty(u)}
        assert pool.self_check() == []
        tags = pool.snapshot_parts()[2]
        assert tags == {u: (o, p) for o, us in held.items() for p, u in enumerate(us)}


def test_bad_kv_calls_change_nothing() -> None:
    """SPEC G8 for the KV calls' refusals over a fragmented pool with cached units."""
    pool = I.UnitPool(12)
    a = pool.reserve_units(6, "a")
    b = pool.reserve_units(4, "b")
    assert a is not None and b is not None
    pool.cache_units(a, "a", [1, None, 2, None, 3, 4])
    bad: list[tuple[str, tuple[Any, ...]]] = [
        ("claim_cached_units", ([0, 1], "x")),  # 1 is vacant, not cached
        ("claim_cached_units", ([0, 0], "x")),
        ("claim_cached_units", ([0], "b")),  # b already holds units
        ("claim_cached_units", ([True], "x")),
        ("claim_cached_units", ([0], (CHECKPOINT_OWNER, 5))),
        ("uncache_units", ([0, 1],)),
        ("uncache_units", ([0, 0],)),
        ("uncache_units", ((2.0,),)),
        ("cache_units", (b, "b", [1, 2, 3])),
        ("cache_units", (b, "b", [1, 2, 3, True])),
        ("cache_units", (b[::-1], "b", [1, 2, 3, 4])),
        ("cache_units", (b[:3], "b", [1, 2, 3])),
        ("release_units", (b[1:], "b")),
        ("rekey_units", (b, "b", None)),
        ("mark_clean", ([12],)),
        ("reserve_units", (1, "b")),
    ]
    for name, args in bad:
        before = deep(pool)
        with pytest.raises(PagedStateError):
            getattr(pool, name)(*args)
        assert deep(pool) == before, name
        assert pool.self_check() == []


def test_an_undone_deferred_block_puts_every_structure_back() -> None:
    """Two evicting reservations in one ``deferred_evictions(undo_on_error=True)`` block,
    with units released between them: undone in reverse, the pool is exactly as before."""
    pool = I.UnitPool(10)
    kv = pool.reserve_units(10, "kv")
    assert kv is not None
    pool.cache_units(kv, "kv", [None, 5, None, 6, None, 7, 8, None, 9, None])
    eng = pool.reserve_units(2, "eng")  # takes vacant 0 and 2
    assert eng == [0, 2]

    def refuse(h: int) -> None:
        raise RuntimeError(h)

    pool.on_evict = refuse
    before = deep(pool)
    with pytest.raises(EvictionCallbackError) as info:
        with pool.deferred_evictions(undo_on_error=True):
            with pool._as_store():
                first = pool._reserve_runs(5, (CHECKPOINT_OWNER, 1))
                second = pool._reserve_runs(3, (CHECKPOINT_OWNER, 2))
    assert info.value.undone
    assert first is not None and second is not None
    assert deep(pool) == before
    assert pool.self_check() == []


# -- the store over a fragmented pool, with a re-entrant unindex ---------------------------------


@settings(max_examples=max(10, settings.default.max_examples // 4))
@given(
    st.sampled_from([(8, (10, 25)), (12, (10, 10)), (20, (5, 40)), (40, (10, 100))]),
    st.lists(st.tuples(st.integers(0, 19), st.integers(0, 30), st.integers(0, 30)), max_size=80),
)
def test_the_store_keeps_its_runs_over_a_fragmented_pool(
    shape: tuple[int, tuple[int, int]], steps: list[tuple[int, int, int]]
) -> None:
    n, (page, slot_bytes) = shape
    pool = I.UnitPool(n)
    store = I.PageUnitCheckpointStore(pool, spec(page, slot_bytes))
    kv: dict[Any, list[int]] = {}
    raising = {"on": False}

    def on_evict(h: int) -> None:
        store.unindex(h)  # the engine drops the prefix: its checkpoint dies with it (A.4)
        if raising["on"]:
            raise Boom(h)

    pool.on_evict = on_evict
    hashes = 6
    for i, (what, a, b) in enumerate(steps):
        raising["on"] = b % 9 == 0
        try:
            if what <= 2:
                got = pool.reserve_units(1 + a % 4, ("live-kv", i))
                if got:
                    kv[("live-kv", i)] = got
            elif what <= 4 and kv:
                o = sorted(kv)[a % len(kv)]
                ids = kv.pop(o)
                marks = [None if (u + b) % 4 == 0 else (u + b) % hashes for u in ids]
                pool.cache_units(ids, o, marks)
            elif what == 5 and pool.num_cached:
                cached = [u for u, _ in pool.cached_units()]
                ids = [u for j, u in enumerate(cached) if (j + a) % 3 == 0][:3]
                pool.claim_cached_units(ids, ("hit", i))
                if ids:
                    kv[("hit", i)] = ids
            elif what == 6 and pool.num_cached:
                cached = [u for u, _ in pool.cached_units()]
                pool.uncache_units(cached[: 1 + a % len(cached)])
            elif what <= 10:
                op = store.begin_store(a % hashes, b % 4)
                if op is not None:
                    assert unit_runs(op.unit_ids) == op.runs
            elif what <= 12:
                store.complete_inflight()
            elif what == 13:
                slot = b % 4
                if store.restore_queued_for(slot) is None and slot not in store._inflight_slots:
                    store.begin_restore(a % hashes, slot)
            elif what == 14:
                for op in store.take_restore_ops():
                    assert unit_runs(op.unit_ids) == op.runs
            elif what == 15:
                store.unindex(a % hashes)
            elif what == 16:
                store.ensure_free_units(a % (n + 1))
            elif what == 17:
                store.clear()
            else:
                pool.mark_clean(sorted(pool.dirty_units())[: a + 1])
        except EvictionCallbackError:
            pass
        for o in list(kv):
            if pool.owner_of(kv[o][0]) != (o, 0):
                kv.pop(o)
        assert store.self_check() == []
        assert check_invariants(store.snapshot()) == []
        for cid, rec in store.records.items():
            assert pool._holds_runs(rec.runs, (CHECKPOINT_OWNER, cid))


# -- ops ---------------------------------------------------------------------------------------


@given(
    st.lists(st.integers(0, 2**40), max_size=12),
    st.integers(0, 3),
    st.sampled_from([CheckpointStoreOp, CheckpointRestoreOp]),
)
def test_an_op_is_one_value_whichever_form_built_it(ids: list[int], slot: int, cls: Any) -> None:
    a = cls(slot, tuple(ids), 64, "L")
    b = cls.from_runs(slot, unit_runs(ids), 64, "L")
    c = cls(slot, None, 64, "L", runs=unit_runs(ids))
    for x, y in ((a, b), (b, c), (a, c)):
        assert x == y and not (x != y) and hash(x) == hash(y) and repr(x) == repr(y)
    assert a.unit_ids == b.unit_ids == tuple(ids) and a.runs == b.runs == unit_runs(ids)
    for op in (a, b, cls.from_runs(slot, unit_runs(ids), 64, "L")):
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(op, proto))
            assert back == a and hash(back) == hash(a) and back.unit_ids == tuple(ids)
        assert copy.copy(op) == a and copy.deepcopy(op) == a
    slot_name = "src_slot" if cls is CheckpointStoreOp else "dst_slot"
    moved = b.evolve(**{slot_name: slot + 1})
    assert moved == a.evolve(**{slot_name: slot + 1}) and moved != a
    assert a.evolve(runs=unit_runs(ids[::-1])) == b.evolve(unit_ids=tuple(ids[::-1]))
    assert a.evolve(total_bytes=65) != a and a.evolve(layout_id="M") != b
    other = CheckpointRestoreOp if cls is CheckpointStoreOp else CheckpointStoreOp
    assert a != other(slot, tuple(ids), 64, "L")
    with pytest.raises(PagedStateError):
        a.evolve(unit_ids=tuple(ids), runs=unit_runs(ids))


@pytest.mark.parametrize(
    "runs",
    [
        [(0, 2)],
        ((0, 2), (2, 1)),
        ((True, 2),),
        ((0, True),),
        ((0, 0),),
        ((-1, 2),),
        ((0, 2, 1),),
        ((0,),),
        ((1.0, 2),),
        ((Sub(1), 2),),
        ([0, 2],),
        ((0, 2), (5, 1), (6, 3)),
    ],
)
def test_from_runs_refuses_malformed_runs(runs: Any) -> None:
    for cls in (CheckpointStoreOp, CheckpointRestoreOp):
        with pytest.raises(PagedStateError):
            cls.from_runs(0, runs, 1, "L")
        op = cls.from_runs(0, ((3, 2),), 1, "L")
        with pytest.raises(PagedStateError):
            op.evolve(runs=runs)


def test_ops_are_frozen() -> None:
    op = CheckpointStoreOp.from_runs(0, ((3, 2),), 1, "L")
    for name in ("src_slot", "runs", "unit_ids", "total_bytes", "_runs", "_ids", "x"):
        with pytest.raises(AttributeError):
            setattr(op, name, 1)
        with pytest.raises(AttributeError):
            delattr(op, name)
    assert op.unit_ids == (3, 4) and op.runs == ((3, 2),)


# -- the dirty index ---------------------------------------------------------------------------


def test_the_dirty_index_stays_bounded_over_many_fragmented_releases() -> None:
    """Tens of thousands of releases of fragmented checkpoints, never scrubbed, in a pool
    kept fragmented by live KV: the dirty index stays within its prune bound, and
    ``dirty_units`` is exact after partial scrubs."""
    n = 4096
    pool = I.UnitPool(n)
    # every fourth unit is live KV: checkpoints come in runs of three
    kv = pool.reserve_units(n, "kv")
    assert kv is not None
    pool.release_units(kv, "kv")
    keep = [pool.reserve_units(1, ("kv", u)) for u in range(n)]
    for u in range(n):
        if u % 4:
            pool.release_units([u], ("kv", u))
    del keep
    with pool._as_store():
        for k in range(30000):
            runs = pool._reserve_runs(6 + k % 5, (CHECKPOINT_OWNER, k))
            assert runs is not None and len(runs) >= 2
            pool._release_runs(runs, (CHECKPOINT_OWNER, k))
            assert len(pool._dirty_runs) <= max(pool._dirty_prune_at, 1024) + len(runs)
    want = set([u for u in range(n) if u % 4][:10])  # the most any checkpoint took
    assert pool.dirty_units() == frozenset(want)
    pool.mark_clean([1, 5])
    assert pool.dirty_units() == frozenset(want - {1, 5})
    assert pool.self_check() == []


def test_dirty_units_is_exact_after_mark_clean_of_a_long_run() -> None:
    pool = I.UnitPool(10000)
    with pool._as_store():
        runs = pool._reserve_runs(9000, (CHECKPOINT_OWNER, 0))
        assert runs == [(0, 9000)]
        pool._release_runs(runs, (CHECKPOINT_OWNER, 0))
    assert pool.dirty_units() == frozenset(range(9000))
    pool.mark_clean(range(0, 9000, 2))
    assert pool.dirty_units() == frozenset(range(1, 9000, 2))
    pool.mark_clean(range(9000))
    assert pool.dirty_units() == frozenset()
    assert pool._dirty_runs == [] and pool.self_check() == []
    assert math.isfinite(pool._dirty_prune_at)
