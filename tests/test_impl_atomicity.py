"""SPEC G8 on the production store: a public call that raises changes nothing, down to every
private index.

Hypothesis builds a reachable state by driving the reference and production coordinators in
lockstep through a random program (:class:`test_impl_lockstep.Lockstep`), then calls every
public method of the pool, store and coordinator with bad input. Each call must raise the
reference's error class (through the lockstep comparison) and leave **every structure** of
the production pool, store, coordinator and scratch pool exactly as it was: not only
``snapshot()``, but a canonical deep copy of each object's ``__dict__`` (heaps in array
order, ordered maps in insertion order, counters, the row sink).

A second property does the same for the pool's engine-facing KV calls (``cache_units``,
``claim_cached_units``, ``uncache_units``), which the reference does not have, over a pool
with cached KV blocks.
"""

from __future__ import annotations

import math
import random
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from conftest import Seq, spec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_atomicity_reference import Hostile, NoCacheFlag, NoSlot
from test_impl_lockstep import Lockstep

from pagedstate import impl as I
from pagedstate.spec import (
    EvictionCallbackError,
    InvalidArgumentError,
    PagedStateError,
    StateStoreOperationId,
    StoreOwnedUnitsError,
    SuspendedCheckpointRestore,
    check_invariants,
)
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

_EXAMPLES = max(10, settings.default.max_examples // 4)


def canon(x: Any) -> Any:
    """A comparable deep copy: containers by content and order, the store's record and pin
    objects by their fields, anything else (sequences, clocks, tiers) by identity."""
    if isinstance(x, (int, float, str, bool, bytes, type(None))):
        return x
    if isinstance(x, (array, bytearray)):  # the pool's per-unit tags and dirty flags
        return (type(x).__name__, bytes(x))
    if isinstance(x, dict):
        return ("dict", tuple((canon(k), canon(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple, deque)):
        return (type(x).__name__, tuple(canon(v) for v in x))
    if isinstance(x, (set, frozenset)):
        return ("set", frozenset(canon(v) for v in x))
    if attrs.has(type(x)):
        return x  # frozen values: ops, op ids, leases
    slots = getattr(type(x), "__slots__", None)
    if slots and type(x).__module__.startswith("pagedstate.impl"):
        return (type(x).__name__, tuple(canon(getattr(x, s)) for s in slots))
    return ("id", id(x))


_SKIP = {"store", "pool", "clock", "spec", "offload", "on_transition", "on_evict", "_scratch"}


def deep_state(c: I.PagedStateCheckpointCoordinator) -> Any:
    """Every structure of the production coordinator, its store, pool and scratch pool."""
    parts = []
    for obj in (c, c.store, c.pool, c._scratch):
        if obj is None:
            continue
        parts.append(
            (type(obj).__name__, tuple(
                (k, canon(v)) for k, v in sorted(vars(obj).items()) if k not in _SKIP
            ))
        )
    return tuple(parts)


BadCall = tuple[str, str, tuple[Any, ...], dict[str, Any]]


def _kv(ls: Lockstep) -> tuple[Any, list[int]] | None:
    for o, units in ls.kv.items():
        return ("live-kv", o), units
    return None


def _record_units(ls: Lockstep) -> tuple[int, tuple[int, ...]] | None:
    for cid, rec in ls.r.store.records.items():
        return cid, rec.unit_ids
    return None


def _ready_hash(ls: Lockstep) -> int | None:
    for h in ls.r.store.hash_to_checkpoint:
        return h
    return None


def _busy_slot(ls: Lockstep) -> int | None:
    s = ls.r.store
    for _, op in [*s._queued_restores, *s._inflight_restores, *s._suspended.values()]:
        return op.dst_slot
    return None


def bad_calls(ls: Lockstep) -> list[BadCall]:
    """Bad inputs for every public call, some built from the state (wrong owners, partial
    releases, busy slots, spent or forged leases, foreign scratch reservations)."""
    seq = ls.seqs[0]
    h = ls.hashes[0]
    out: list[BadCall] = [
        # pool
        ("p", "reserve_units", (-1, ("x", 0)), {}),
        ("p", "reserve_units", ("2", ("x", 0)), {}),
        ("p", "reserve_units", (2.0, ("x", 0)), {}),
        ("p", "reserve_units", (True, ("x", 0)), {}),
        ("p", "reserve_units", (1, None), {}),
        ("p", "release_units", ("01", ("x", 0)), {}),
        ("p", "release_units", ({0, 1}, ("x", 0)), {}),
        ("p", "release_units", ([0, 0], ("x", 0)), {}),
        ("p", "release_units", ([-1], ("x", 0)), {}),
        ("p", "release_units", ([True], ("x", 0)), {}),
        ("p", "release_units", ([0], None), {}),
        ("p", "release_units", ([ls.units - 1], ("nobody", 0)), {}),
        ("p", "rekey_units", ([0], ("x", 0), None), {}),
        ("p", "rekey_units", ([0], None, ("y", 0)), {}),
        ("p", "rekey_units", ([0, 0], ("x", 0), ("y", 0)), {}),
        ("p", "mark_clean", ([ls.units],), {}),
        ("p", "mark_clean", ([-1],), {}),
        ("p", "mark_clean", (["0"],), {}),
        ("p", "mark_clean", (5,), {}),
        ("p", "has_free", ("1",), {}),
        ("p", "has_free", (-1,), {}),
        ("p", "owner_of", ("0",), {}),
        ("p", "owner_of", (ls.units,), {}),
        ("p", "is_dirty", (-1,), {}),
        ("p", "is_dirty", (None,), {}),
        ("p", "reserve_units", (1, Hostile()), {}),
        ("p", "reserve_units", (1, ["x", 0]), {}),
        ("p", "reserve_units", (1, (CHECKPOINT_OWNER, 10**6)), {}),
        ("p", "reserve_units", (1, (TRANSFER_OWNER, ("load", -1))), {}),
        ("p", "release_units", ([0], Hostile()), {}),
        ("p", "rekey_units", ([0], ("x", 0), Hostile()), {}),
        # store
        ("s", "begin_store", (str(h), 0), {}),
        ("s", "begin_store", (float(h), 0), {}),
        ("s", "begin_store", (h, -1), {}),
        ("s", "begin_store", (h, True), {}),
        ("s", "begin_restore", (str(h), 0), {}),
        ("s", "begin_restore", (h, -2), {}),
        ("s", "cancel_queued_restore", ("4",), {}),
        ("s", "suspend_queued_restore", ("4",), {}),
        ("s", "restore_queued_for", ("4",), {}),
        ("s", "lookup", (str(h),), {}),
        ("s", "contains", (None,), {}),
        ("s", "contains_or_pending", ([h],), {}),
        ("s", "was_reclaimed", (StateStoreOperationId(str(h), 1),), {}),
        ("s", "resume_suspended_restore", ("lease",), {}),
        ("s", "release_suspended_restore", (None,), {}),
        ("s", "unindex", (str(h),), {}),
        ("s", "has_available_units", (-1,), {}),
        ("s", "has_available_units", (1, "h"), {}),
        ("s", "ensure_free_units", (-1,), {}),
        ("s", "ensure_free_units", ("3",), {}),
        ("s", "changed_since", ("0",), {}),
        ("s", "adopt_units", ((0,) * 9, (TRANSFER_OWNER, "nobody"), h), {}),
        ("s", "take_offload_stores", (-1,), {}),
        ("s", "take_offload_stores", ("4",), {}),
        ("s", "acquire_checkpoint_source", ("h",), {}),
        ("s", "acquire_checkpoint_source", (h,), {"max_inflight": -1}),
        ("s", "acquire_checkpoint_source", (h,), {"max_inflight": True}),
        ("s", "release_offload_store_source", ((h, 2),), {}),
        ("s", "settle_offload_store", ("op",), {}),
        ("s", "settle_offload_store", (None,), {}),
        ("s", "was_reclaimed", ((h, 1),), {}),
        ("s", "reclaim_stale_offload_pins", ("5",), {}),
        ("s", "reclaim_stale_offload_pins", (math.nan,), {}),
        ("s", "reclaim_stale_offload_pins", (True,), {}),
        ("s", "reclaim_stale_offload_pins", (None,), {}),
        # coordinator
        ("c", "checkpoint", (seq, -1, h), {}),
        ("c", "checkpoint", (seq, True, h), {}),
        ("c", "checkpoint", (seq, 2, str(h)), {}),
        ("c", "checkpoint", (Seq(20), 2, None), {}),
        ("c", "reserve_midstep", (seq, [(48,)]), {}),
        ("c", "reserve_midstep", (seq, [("48", h)]), {}),
        ("c", "reserve_midstep", (seq, [(48, h, 1)]), {}),
        ("c", "reserve_midstep", (seq, [(48, h), (64, "h")]), {}),
        ("c", "publish_midstep", ([(99, 48, h)],), {}),
        ("c", "publish_midstep", ([(99, 48)],), {}),
        ("c", "cancel_midstep", ([(99, 48, h)],), {}),
        ("c", "cancel_midstep", (["slot"],), {}),
        ("c", "attach_midstep_scratch", (None, -1), {}),
        ("c", "resumable_hit", (seq, -1, [h]), {}),
        ("c", "resumable_hit", (seq, 3, [h, h]), {}),
        ("c", "reserve_transfer_units", (None,), {}),
        ("c", "reserve_transfer_units", (["req", 2],), {}),
        ("c", "unindex", (str(h),), {}),
        ("c", "resume_suspended_restore", ((h, 0),), {}),
        ("c", "release_suspended_restore", ("lease",), {}),
        ("c", "begin_restore", (h, -1), {}),
        ("c", "suspend_queued_restore", ("6",), {}),
        ("c", "restore_queued_for", ("4",), {}),
        ("c", "take_offload_stores", (-1,), {}),
        ("c", "acquire_checkpoint_source", (h,), {"max_inflight": "1"}),
        ("c", "settle_offload_store", ((h, 1),), {}),
        ("c", "release_offload_store_source", (None,), {}),
        ("c", "reclaim_stale_offload_pins", ("1",), {}),
        ("c", "was_reclaimed", ("op",), {}),
        ("c", "has_available_units", (-3,), {}),
        ("c", "ensure_free_units", (-3,), {}),
        ("c", "contains", (str(h),), {}),
        ("c", "applies", (NoCacheFlag(),), {}),
        ("c", "applies", (NoSlot(),), {}),
        ("c", "checkpoint", (NoCacheFlag(), 1, h), {}),
        ("c", "forget_pending", (NoCacheFlag(),), {}),
        ("c", "forget_pending", (None,), {}),
        ("c", "reserve_midstep", (NoSlot(), [(48, h)]), {}),
        ("c", "reserve_midstep", (seq, 5), {}),
        ("c", "resumable_hit", (NoCacheFlag(), 1, [h]), {}),
        ("c", "resumable_hit", (seq, 1, [str(h)]), {}),
        ("c", "attach_midstep_scratch", (None, 4), {}),
        ("c", "publish_midstep", (5,), {}),
        ("c", "reserve_transfer_units", (Hostile(),), {}),
        ("c", "release_transfer_units", (["req", 2],), {}),
        ("c", "release_transfer_units", (Hostile(),), {}),
        ("c", "release_transfer_units", (None,), {}),
        ("c", "adopt_transfer_units", (["req", 2], h), {}),
        # overlapped scheduling (SPEC D.13, G13, G15)
        ("c", "checkpoint", (seq, 0, h), {}),
        ("c", "checkpoint", (seq, 2, h), {"computed_blocks": 1}),
        ("c", "checkpoint", (seq, 1, h), {"computed_blocks": "2"}),
        ("c", "checkpoint", (seq, 1, h), {"forward": -1}),
        ("c", "checkpoint", (seq, 1, h), {"forward": 2.0}),
        ("c", "take_checkpoint_ops", (), {"forward": -1}),
        ("c", "take_checkpoint_ops", (), {"forward": "0"}),
        ("c", "complete_previous_batch", (5,), {}),
        ("s", "complete_inflight", ("token",), {}),
        ("c", "publish_midstep", ([],), {"forward": -1}),
        ("c", "begin_restore", (h, 0), {"seq": 5}),
    ]
    last = ls.i.last_forward
    if last is not None:
        out.append(("c", "take_checkpoint_ops", (), {"forward": last}))
        if last > 0:
            out.append(("c", "checkpoint", (seq, 1, h), {"forward": last - 1}))  # stale
    kv = _kv(ls)
    if kv is not None:
        owner, units = kv
        out += [
            ("p", "release_units", (units, ("live-kv", 99)), {}),
            ("p", "rekey_units", (units, ("live-kv", 99), ("y", 0)), {}),
        ]
        if len(units) > 1:
            out += [
                ("p", "release_units", (units[:1], owner), {}),  # G9: partial
                ("p", "release_units", (units[::-1], owner), {}),
                ("p", "rekey_units", (units[:1], owner, ("y", 0)), {}),
            ]
        rec = _record_units(ls)
        if rec is not None:
            out.append(("p", "rekey_units", (units, owner, (CHECKPOINT_OWNER, rec[0])), {}))
    rec = _record_units(ls)
    if rec is not None:
        cid, units_ = rec
        out += [
            ("p", "release_units", (list(units_), (CHECKPOINT_OWNER, cid + 1)), {}),
            ("p", "release_units", (list(units_), (CHECKPOINT_OWNER, cid)), {}),  # the owner's
            ("p", "rekey_units", (list(units_), (CHECKPOINT_OWNER, cid), ("y", 0)), {}),
            ("s", "adopt_units", (units_, (TRANSFER_OWNER, ("load", -1)), h), {}),
            ("s", "adopt_units", (units_, (CHECKPOINT_OWNER, cid), h), {}),
        ]
    busy = _busy_slot(ls)
    ready = _ready_hash(ls)
    if busy is not None and ready is not None:
        out += [
            ("s", "begin_restore", (ready, busy), {}),
            ("c", "begin_restore", (ready, busy), {}),
        ]
    lent = [*ls.r._scratch_reserved, *(slot for _h, slot in ls.r._scratch_queued),
            *ls.r._scratch_issued]
    if lent:
        out.append(("c", "begin_restore", (ready if ready is not None else h, lent[0]), {}))  # G12
    for _sid, (_slot, _entry, owner) in ls.i._restore_owners.items():
        if ls.i._owner_valid((_slot, _entry, owner)):
            out.append(("c", "begin_restore", (h, 5), {"seq": owner}))  # G15
            break
    if ls.r.store._suspended:
        lid, (cid, op) = next(iter(ls.r.store._suspended.items()))
        lease = SuspendedCheckpointRestore(cid, op, lid)
        out += [
            ("c", "resume_suspended_restore", (attrs.evolve(lease, lease_id=10**6),), {}),
            ("c", "release_suspended_restore", (attrs.evolve(lease, checkpoint_id=-5),), {}),
        ]
    for lease in ls.leases:
        if lease.lease_id not in ls.r.store._suspended:  # a spent lease (G3)
            out += [
                ("c", "resume_suspended_restore", (lease,), {}),
                ("s", "release_suspended_restore", (lease,), {}),
            ]
            break
    if ls.r._transfer_units:
        owner = next(iter(ls.r._transfer_units))
        units_ = ls.r._transfer_units[owner]
        out += [
            ("p", "release_units", (list(units_), (TRANSFER_OWNER, owner)), {}),
            ("c", "adopt_transfer_units", (owner, "h"), {}),
            ("s", "adopt_units", (units_[:-1], (TRANSFER_OWNER, owner), h), {}),
            ("s", "adopt_units", (units_, (TRANSFER_OWNER, ("load", -1)), h), {}),
        ]
        if len(units_) > 1:
            out += [
                ("s", "adopt_units", (units_[::-1], (TRANSFER_OWNER, owner), h), {}),
                ("s", "adopt_units", ((units_[0],) * len(units_), (TRANSFER_OWNER, owner), h),
                 {}),
            ]
    if ls.r._scratch_reserved:
        slot, (pos, rh) = next(iter(ls.r._scratch_reserved.items()))
        out += [
            ("c", "publish_midstep", ([(slot, 0, h), (slot, 0, h)],), {}),
            ("c", "cancel_midstep", ([(slot, 0, h), (99, 0, h)],), {}),
            ("c", "publish_midstep", ([(slot, pos + 1, rh)],), {}),  # stale
            ("c", "cancel_midstep", ([(slot, pos, rh + 100)],), {}),  # stale
        ]
    return out


def _check_refused(ls: Lockstep, call: BadCall) -> None:
    target, name, args, kwargs = call
    before = deep_state(ls.i)
    kind, value = ls.call(target, name, *args, **kwargs)
    assert kind == "raised", f"{target}.{name}{args} did not raise: {value!r}"
    after = deep_state(ls.i)
    assert after == before, f"{target}.{name}{args} raised but changed a production index"


@settings(max_examples=_EXAMPLES)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(0, 150))
def test_every_refused_call_changes_no_index(seed: int, steps: int) -> None:
    ls = Lockstep(random.Random(seed))
    for _ in range(steps):
        ls.step()
    for call in bad_calls(ls):
        _check_refused(ls, call)


def test_bad_calls_cover_every_public_method() -> None:
    """The catalogue names every public method of the production pool, store and
    coordinator that takes arguments (queries and mutators alike), except the KV calls
    tested below and ``clone``/``snapshot``."""
    ls = Lockstep(random.Random(3))
    for _ in range(300):
        ls.step()
    named = {(t, n) for t, n, _, _ in bad_calls(ls)}
    exempt = {
        # no arguments, the production pool's KV calls (tested below), or checker hooks
        "clone", "snapshot", "snapshot_parts", "cache_units", "claim_cached_units",
        "uncache_units", "dirty_units", "cached_hash", "cached_units", "complete_inflight",
        "take_restore_ops", "clear", "has_offload_pins", "checkpoint_fates",
        "complete_previous_batch", "take_checkpoint_ops", "clear_index", "attach_offload",
        "deferred_evictions", "self_check", "outstanding", "is_idle",
        # a flag: every value is accepted; only a token's own error refuses it (the
        # overlap tests)
        "settle_completions",
    }
    for target, obj in (("p", I.UnitPool), ("s", I.PageUnitCheckpointStore),
                        ("c", I.PagedStateCheckpointCoordinator)):
        public = {
            n for k in obj.__mro__ for n, v in vars(k).items()  # mixins' methods too
            if not n.startswith("_") and callable(v) and not isinstance(v, type)
            and n not in exempt
        }
        missing = {n for n in public if (target, n) not in named}
        assert not missing, (target, sorted(missing))


def test_garbage_state_slots_are_refused_before_anything_changes() -> None:
    """The production coordinator checks a sequence's slot before it changes anything; the
    reference raises the same error class only after dropping the pending boundary (forget)
    or beginning earlier stores (drain). Production only."""
    c = I.PagedStateCheckpointCoordinator(I.UnitPool(20), spec(10, 25), True)
    good, bad = Seq(1), Seq(2)
    c.checkpoint(good, 1, 101)
    c.checkpoint(bad, 1, 202)
    bad.state_slot = 1.5  # type: ignore[assignment]
    before = deep_state(c)
    with pytest.raises(PagedStateError):
        c.take_checkpoint_ops()
    assert deep_state(c) == before
    with pytest.raises(PagedStateError):
        c.forget_pending(bad)
    assert deep_state(c) == before


# -- the engine's KV calls (production only) --------------------------------------------


def _kv_pool(rng: random.Random) -> tuple[I.UnitPool, dict[Any, list[int]], list[int]]:
    evicted: list[int] = []
    pool = I.UnitPool(rng.choice([4, 8, 12]), on_evict=evicted.append)
    held: dict[Any, list[int]] = {}
    for _ in range(rng.randrange(60)):
        k = rng.randrange(5)
        owner = ("kv", rng.randrange(4))
        if k == 0 and owner not in held:
            got = pool.reserve_units(rng.randrange(1, 4), owner)
            if got:
                held[owner] = got
        elif k == 1 and owner in held:
            units = held.pop(owner)
            hashes = [rng.choice([None, *range(100, 110)]) for _ in units]
            pool.cache_units(units, owner, hashes)
        elif k == 2 and owner in held:
            pool.release_units(held.pop(owner), owner)
        elif k == 3 and owner not in held and pool.num_cached:
            cached = [u for u in range(pool.num_units) if pool.cached_hash(u) is not None]
            take = rng.sample(cached, rng.randrange(1, len(cached) + 1))
            pool.claim_cached_units(take, owner)
            held[owner] = take
        elif k == 4 and pool.num_cached:
            u = next(u for u in range(pool.num_units) if pool.cached_hash(u) is not None)
            pool.uncache_units([u])
    return pool, held, evicted


def _pool_state(pool: I.UnitPool) -> Any:
    return tuple((k, canon(v)) for k, v in sorted(vars(pool).items()) if k != "on_evict")


@settings(max_examples=_EXAMPLES)
@given(seed=st.integers(0, 2**32 - 1))
def test_kv_calls_refused_change_nothing(seed: int) -> None:
    rng = random.Random(seed)
    pool, held, _ = _kv_pool(rng)
    free = next((u for u in range(pool.num_units) if pool.owner_of(u) is None
                 and pool.cached_hash(u) is None), pool.num_units)
    calls: list[Callable[[], Any]] = [
        lambda: pool.cache_units("0", ("kv", 0), [1]),
        lambda: pool.cache_units([free], ("kv", 9), [1]),
        lambda: pool.claim_cached_units([free], ("kv", 9)),
        lambda: pool.claim_cached_units([0, 0], ("kv", 9)),
        lambda: pool.claim_cached_units([0], None),
        lambda: pool.uncache_units([free]),
        lambda: pool.uncache_units([-1]),
        lambda: pool.uncache_units("x"),
        lambda: pool.cached_hash("0"),
        lambda: pool.cached_hash(pool.num_units),
        lambda: pool.claim_cached_units([0], Hostile()),
        lambda: pool.claim_cached_units([0], (CHECKPOINT_OWNER, 0)),
    ]
    for owner, units in held.items():
        calls += [
            lambda o=owner, u=units: pool.cache_units(u, o, [1] * (len(u) + 1)),
            lambda o=owner, u=units: pool.cache_units(u, o, ["h"] * len(u)),
            lambda o=owner, u=units: pool.cache_units(u, o, 5),
            lambda o=owner, u=units: pool.cache_units(u[::-1], o, [1] * len(u))
            if len(u) > 1 else pool.cache_units(u, ("kv", 99), [1]),
            lambda o=owner, u=units: pool.cache_units(u[:-1], o, [1] * (len(u) - 1)),
        ]
    cached = [u for u in range(pool.num_units) if pool.cached_hash(u) is not None]
    if cached:
        calls += [
            lambda: pool.claim_cached_units([cached[0], free], ("kv", 9)),
            lambda: pool.uncache_units([cached[0], free]),
            lambda: pool.cache_units([cached[0]], (CHECKPOINT_OWNER, 0), [1]),
        ]
    for call in calls:
        before = _pool_state(pool)
        with pytest.raises(PagedStateError):
            call()
        assert _pool_state(pool) == before


def test_deep_state_sees_private_indexes() -> None:
    """The comparison is not vacuous: a change to any private index shows."""
    ls = Lockstep(random.Random(5))
    for _ in range(200):
        ls.step()
    c = ls.i
    mutations: list[Callable[[], None]] = [
        lambda: c.store._victims.append((10**9, 0)),
        lambda: setattr(c.store, "_num_evictable", c.store._num_evictable + 1),
        lambda: c.store._op_hashes.add(10**9),
        lambda: c.pool._held.__setitem__(("ghost", 0), 1),
        lambda: c.pool._ext.heap.append(10**6),
        lambda: c.pool._tag.__setitem__(0, c.pool._tag[0] + 1),
        lambda: c.pool._piece.__setitem__(0, c.pool._piece[0] + 1),
        lambda: c.pool._dirtyf.__setitem__(0, 1 - c.pool._dirtyf[0]),
        lambda: c.pool._dirty_runs.append((0, 1)),
        lambda: c.pool._who.__setitem__(10**9, "ghost"),
        lambda: c._pending_by_hash.__setitem__(10**9, {}),
        lambda: c._scratch_by_hash.__setitem__(10**9, {}),
        lambda: c.store._changes.append((10**9, None)),
    ]
    for mutate in mutations:
        before = deep_state(c)
        mutate()
        assert deep_state(c) != before  # most of these are invisible to snapshot()
        ls = Lockstep(random.Random(5))  # a fresh world for the next mutation
        for _ in range(200):
            ls.step()
        c = ls.i


# -- eviction callbacks and hostile owners (production only) ---------------------------


def _transfer_world(on_evict: Any) -> I.PagedStateCheckpointCoordinator:
    """A coordinator whose pool's only free units are cached KV blocks (one vacant), with a
    READY checkpoint of 101 and a pending boundary: a transfer reservation must reuse the
    cached blocks of 301 and 302."""
    pool = I.UnitPool(8)
    c = I.PagedStateCheckpointCoordinator(pool, spec(10, 25), True)
    assert c.store.begin_store(101, 0) is not None  # units 0-2
    c.complete_previous_batch()
    kv = pool.reserve_units(4, ("kv", 0))  # units 3-6
    pool.cache_units(kv, ("kv", 0), [None, 301, 302, None])  # 4 and 5 cached
    assert pool.reserve_units(2, ("kv", 1)) == [3, 6]  # vacant 7 is left
    c.checkpoint(Seq(5), 1, 555)
    assert pool.num_free == 3 and pool.cached_units() == ((4, 301), (5, 302))
    pool.on_evict = on_evict
    return c


@pytest.mark.parametrize("fails_on", [301, 302])
def test_an_eviction_callback_that_raises_in_reserve_transfer_units_changes_nothing(
    fails_on: int,
) -> None:
    """SPEC A.4, G8: the callback raises (here KeyError, from the engine's
    own index) inside ``reserve_transfer_units``. Before, the reservation stayed filed and
    the KeyError escaped; now it is undone, down to the pool's cached-block order, and
    EvictionCallbackError is raised from the KeyError."""
    seen: list[int] = []

    def on_evict(h: int) -> None:
        seen.append(h)
        if h == fails_on:
            raise KeyError(h)

    c = _transfer_world(on_evict)
    before, snap = deep_state(c), c.snapshot()
    with pytest.raises(EvictionCallbackError) as info:
        c.reserve_transfer_units(("load", 0))
    assert isinstance(info.value.__cause__, KeyError)
    assert info.value.prefix_hash == fails_on and info.value.undone
    assert seen == [301, 302]  # every callback ran
    assert deep_state(c) == before and c.snapshot() == snap
    assert check_invariants(c.snapshot()) == []
    # The same call succeeds once the engine is fixed, with the same units.
    c.pool.on_evict = seen.append
    assert c.reserve_transfer_units(("load", 0)) == (7, 4, 5)
    assert seen == [301, 302, 301, 302]


def test_a_callback_that_unindexes_then_raises_leaves_only_its_own_effects() -> None:
    """The engine's callback unindexes the evicted hash (its job) and then raises: the
    reservation is undone, nothing is filed, and what the callback did (it orphaned the
    pending boundary of 301) stays; every invariant holds."""
    holder: list[I.PagedStateCheckpointCoordinator] = []

    def on_evict(h: int) -> None:
        holder[0].unindex(h)
        raise KeyError(h)

    c = _transfer_world(on_evict)
    holder.append(c)
    c.checkpoint(Seq(6), 1, 301)
    free_before = c.pool.num_free
    with pytest.raises(EvictionCallbackError):
        c.reserve_transfer_units(("load", 0))
    snap = c.snapshot()
    assert snap.transfers == {} and c.pool.num_free == free_before
    assert c.pool.cached_units() == ((4, 301), (5, 302))
    assert all(h != 301 for _, h in snap.pending_boundaries)  # the callback's own effect
    assert check_invariants(snap) == []


def test_a_hostile_owner_changes_no_pool_index() -> None:
    """SPEC A.3, G8: an owner whose ``__hash__`` raises used to leave a tagged unit in the
    production pool (the tag was written before the per-owner count hashed it)."""
    pool = I.UnitPool(4)
    pool.reserve_units(1, ("kv", 0))
    before = _pool_state(pool)
    for call in (
        lambda: pool.reserve_units(2, Hostile()),
        lambda: pool.release_units([0], Hostile()),
        lambda: pool.rekey_units([0], ("kv", 0), Hostile()),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
        assert _pool_state(pool) == before


def test_only_the_store_names_store_owners() -> None:
    """SPEC A.3: the engine cannot free a checkpoint's units through the pool; the
    store still can (it releases them when the record goes)."""
    c = I.PagedStateCheckpointCoordinator(I.UnitPool(6), spec(10, 25), True)
    op = c.store.begin_store(101, 0)
    assert op is not None
    c.complete_previous_batch()
    cid = c.store.lookup(101)
    before = deep_state(c)
    with pytest.raises(StoreOwnedUnitsError):
        c.pool.release_units(list(op.unit_ids), (CHECKPOINT_OWNER, cid))
    assert deep_state(c) == before
    c.unindex(101)  # the store releases its own units
    assert c.pool.num_free == 6 and c.pool.dirty_units() == frozenset(op.unit_ids)
