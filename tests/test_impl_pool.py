"""The production pool's engine protocol (SPEC A.2-A.4, G9, G10): cached KV blocks, the
eviction callback, and a store that tolerates ``unindex`` fired from inside its own
``reserve_units``.

The re-entrant runs are compared with a *plain* run on the reference model in which the
engine does the same things one after another (release the KV blocks, store, then unindex
the evicted hash): both must end in the same snapshot.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Seq, spec

from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec import (
    EvictionCallbackError,
    InvalidArgumentError,
    PagedStateError,
    PartialReleaseError,
    StoreOwnedUnitsError,
    WrongOwnerError,
    check_invariants,
)
from pagedstate.spec.types import CHECKPOINT_OWNER

KV0, KV1 = ("live-kv", 0), ("live-kv", 1)


def _ok(obj: Any) -> None:
    assert check_invariants(obj.snapshot()) == []


def _deep(pool: I.UnitPool) -> Any:
    """Every structure of a production pool, containers in their own order (heaps as
    arrays, ordered maps in order)."""

    def canon(x: Any) -> Any:
        if isinstance(x, dict):
            return tuple((k, canon(v)) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return tuple(canon(v) for v in x)
        if isinstance(x, (set, frozenset)):
            return frozenset(x)
        return x

    return tuple((k, canon(v)) for k, v in sorted(vars(pool).items()) if k != "on_evict")


# -- the pool alone ------------------------------------------------------------------------


def test_kv_protocol_is_documented_and_satisfied() -> None:
    pool = I.UnitPool(4)
    assert isinstance(pool, I.KVBlockPool)
    doc = I.pool.__doc__ or ""
    for name in ("on_evict", "cache_units", "claim_cached_units", "uncache_units", "cached_hash"):
        assert name in doc


def test_cached_blocks_are_handed_out_last_and_fire_on_evict() -> None:
    fired: list[int] = []
    pool = I.UnitPool(6, on_evict=fired.append)
    kv = pool.reserve_units(4, KV0)
    assert kv == [0, 1, 2, 3]
    pool.cache_units(kv, KV0, [10, None, 12, 13])  # unit 1 holds nothing worth keeping
    assert pool.num_free == 6 and pool.num_cached == 3
    assert [pool.cached_hash(u) for u in range(6)] == [10, None, 12, 13, None, None]
    assert pool.reserve_units(3, KV1) == [1, 4, 5]  # vacant first, lowest id first
    assert fired == []
    pool.release_units([1, 4, 5], KV1)
    assert pool.reserve_units(5, ("x", 0)) == [1, 4, 5, 0, 2]  # then least recently cached
    assert fired == [10, 12]
    assert pool.num_cached == 1 and pool.cached_hash(3) == 13


def test_claim_and_uncache() -> None:
    fired: list[int] = []
    pool = I.UnitPool(3, on_evict=fired.append)
    kv = pool.reserve_units(3, KV0)
    pool.cache_units(kv, KV0, [10, 11, 12])
    pool.claim_cached_units([2, 0], KV1)  # a prefix hit reuses the content
    assert pool.owner_of(2) == (KV1, 0) and pool.owner_of(0) == (KV1, 1)
    assert pool.num_free == 1
    pool.uncache_units([1])  # the engine re-pointed hash 11
    assert pool.reserve_units(1, ("x", 0)) == [1]
    assert fired == []  # neither a claim nor an uncached reuse is an eviction
    with pytest.raises(PartialReleaseError):
        pool.release_units([2], KV1)
    pool.release_units([2, 0], KV1)
    assert pool.num_free == 2


def test_on_evict_errors_undo_the_reservation_after_every_callback() -> None:
    """A callback that raises (SPEC A.4, G8): every callback still runs, then the
    reservation is undone (its cached units back under their hashes, in LRU order, the
    vacant heap as it was) and EvictionCallbackError is raised from the first failure."""
    seen: list[int] = []

    def hook(h: int) -> None:
        seen.append(h)
        raise RuntimeError(f"engine failed on {h}")

    pool = I.UnitPool(4, on_evict=hook)
    pool.cache_units(pool.reserve_units(2, KV0), KV0, [1, 2])  # units 0, 1 cached
    assert pool.reserve_units(1, ("x", 0)) == [2]  # unit 3 is the only vacant one
    before = _deep(pool)
    with pytest.raises(EvictionCallbackError, match="on 1") as info:
        pool.reserve_units(3, KV1)  # vacant 3, then cached 0 (hash 1) and 1 (hash 2)
    assert isinstance(info.value.__cause__, RuntimeError) and info.value.prefix_hash == 1
    assert info.value.undone and isinstance(info.value, RuntimeError)
    assert seen == [1, 2]
    assert _deep(pool) == before
    assert pool.cached_units() == ((0, 1), (1, 2)) and pool.owner_of(0) is None
    pool.on_evict = None
    assert pool.reserve_units(3, KV1) == [3, 0, 1]  # the same units, in the same order


def test_state_units_cannot_be_cached_and_stay_dirty() -> None:
    pool = I.UnitPool(3)
    with pool._as_store():  # only the store names a checkpoint owner (SPEC A.3)
        units = pool.reserve_units(2, (CHECKPOINT_OWNER, 0))
        with pytest.raises(InvalidArgumentError):
            pool.cache_units(units, (CHECKPOINT_OWNER, 0), [1, 2])
    with pytest.raises(StoreOwnedUnitsError):
        pool.cache_units(units, (CHECKPOINT_OWNER, 0), [1, 2])
    with pool._as_store():
        pool.release_units(units, (CHECKPOINT_OWNER, 0))
    assert pool.dirty_units() == frozenset(units)  # G10
    again = pool.reserve_units(2, KV0)
    assert all(pool.is_dirty(u) for u in again)  # dirty until scrubbed, free or reserved
    pool.mark_clean(again)
    assert pool.dirty_units() == frozenset()


def test_on_evict_must_be_callable() -> None:
    with pytest.raises(InvalidArgumentError):
        I.UnitPool(3, on_evict=5)  # type: ignore[arg-type]


# -- re-entrant unindex inside reserve_units (SPEC A.4) ----------------------------------


def _engine(num_units: int, sp: Any) -> tuple[I.PagedStateCheckpointCoordinator, list[int]]:
    """A production coordinator whose pool evicts cached KV blocks into ``unindex``."""
    fired: list[int] = []
    pool = I.UnitPool(num_units)
    coord = I.PagedStateCheckpointCoordinator(pool, sp, True)

    def on_evict(h: int) -> None:
        fired.append(h)
        _ok(coord)  # the pool is consistent when the engine is called back
        coord.unindex(h)

    pool.on_evict = on_evict
    return coord, fired


def _ready(c: Any, h: int, slot: int = 0) -> int:
    assert c.store.begin_store(h, slot) is not None
    c.complete_previous_batch()
    cid: int = c.store.lookup(h)
    assert cid >= 0
    return cid


def test_begin_store_evicting_a_cached_block_unindexes_a_ready_checkpoint() -> None:
    sp = spec(10, 20)  # U = 2
    coord, fired = _engine(6, sp)
    old = _ready(coord, 101)  # units 0, 1
    kv = coord.pool.reserve_units(2, KV0)  # units 2, 3: the KV blocks of the prefix
    coord.pool.reserve_units(2, KV1)  # units 4, 5: live
    coord.pool.cache_units(kv, KV0, [101, 555])
    assert coord.pool.num_free == 2

    op = coord.store.begin_store(202, 1)

    assert op is not None and op.unit_ids == (2, 3)
    assert fired == [101, 555]
    snap = coord.snapshot()
    assert old not in snap.records  # died with its prefix, inside reserve_units
    assert snap.free == frozenset({0, 1}) and snap.dirty == frozenset({0, 1})
    assert set(snap.pending) == {202}
    assert coord.checkpoints_orphaned == 1  # 555 had nothing to unindex
    _ok(coord)

    # The plain run: the engine releases the KV blocks, stores, then unindexes.
    plain = R.PagedStateCheckpointCoordinator(R.UnitPool(6), sp, True)
    _ready(plain, 101)
    kv_r = plain.pool.reserve_units(2, KV0)
    plain.pool.reserve_units(2, KV1)
    plain.pool.release_units(kv_r, KV0)
    assert plain.store.begin_store(202, 1) == op
    plain.unindex(101)
    plain.unindex(555)
    assert plain.snapshot() == coord.snapshot(), plain.snapshot().diff(coord.snapshot())

    coord.complete_previous_batch()
    assert coord.contains(202)
    _ok(coord)


def test_reentrant_unindex_of_a_pinned_and_a_copying_record() -> None:
    sp = spec(10, 10)  # U = 1
    coord, fired = _engine(5, sp)
    pinned = _ready(coord, 101)
    assert coord.begin_restore(101, 7)  # pinned by a queued restore
    assert coord.store.begin_store(303, 0) is not None  # COPYING, unit 1
    kv = coord.pool.reserve_units(3, KV0)  # units 2, 3, 4
    coord.pool.cache_units(kv, KV0, [101, 303, None])

    assert coord.store.begin_store(404, 2) is not None  # takes vacant 4, no callback
    assert fired == []
    coord.checkpoint(Seq(3), 1, 303)  # a pending boundary of 303, orphaned below
    assert coord.reserve_transfer_units(("load", 0)) is not None  # takes cached 2: fires 101
    assert fired == [101]
    snap = coord.snapshot()
    assert snap.records[pinned].phase == "EVICTING"  # pinned: units kept
    coord.pool.reserve_units(1, KV1)  # the engine's own KV allocation takes 3: fires 303
    assert fired == [101, 303]
    snap = coord.snapshot()
    assert 303 not in snap.pending and snap.pending_boundaries == ()
    assert any(r.prefix_hash == 303 and r.phase == "EVICTING" for r in snap.records.values())
    _ok(coord)
    stores, restores = coord.take_checkpoint_ops()
    assert stores == () and [r.dst_slot for r in restores] == [7]
    coord.complete_previous_batch()
    snap = coord.snapshot()
    assert {r.prefix_hash for r in snap.records.values()} == {404}
    _ok(coord)


def test_reentrant_unindex_of_the_hash_being_stored() -> None:
    """The reservation of ``begin_store(h)`` evicts the KV block of ``h`` itself. The pool
    holds the callback until the record is filed, so the unindex finds the new COPYING
    record and makes it EVICTING: the checkpoint dies with its prefix (a pool that fired
    inside ``reserve_units`` would have found nothing yet)."""
    coord, fired = _engine(2, spec(10, 10))
    kv = coord.pool.reserve_units(2, KV0)
    coord.pool.cache_units(kv, KV0, [None, 909])
    assert coord.pool.reserve_units(1, KV1) == [0]
    op = coord.store.begin_store(909, 0)
    assert op is not None and fired == [909]
    assert coord.checkpoints_orphaned == 1
    (rec,) = coord.snapshot().records.values()
    assert rec.phase == "EVICTING" and rec.unit_ids == op.unit_ids  # kept for the writer
    _ok(coord)
    coord.complete_previous_batch()
    assert not coord.contains(909) and coord.pool.num_free == 1
    _ok(coord)


def test_a_pool_that_fires_inside_reserve_units_is_tolerated() -> None:
    """An engine's own pool may call back before ``reserve_units`` returns (no deferral):
    the store's checkpoint id is already taken, so a nested store gets the next one."""

    class EagerPool(I.UnitPool):
        deferred_evictions = None  # type: ignore[assignment]

    pool = EagerPool(4)
    coord = I.PagedStateCheckpointCoordinator(pool, spec(10, 10), True)
    nested: list[Any] = []

    def on_evict(h: int) -> None:
        coord.unindex(h)
        nested.append(coord.store.begin_store(500 + h, 3))  # a store begun from the callback

    pool.on_evict = on_evict
    _ready(coord, 1)  # unit 0
    kv = pool.reserve_units(3, KV0)
    pool.cache_units(kv, KV0, [None, None, 1])
    coord.pool.reserve_units(2, KV1)  # units 1, 2 (vacant)
    op = coord.store.begin_store(2, 0)  # takes cached unit 3: fires 1 inside reserve_units
    assert op is not None and op.unit_ids == (3,)
    assert nested[0] is not None and nested[0].unit_ids == (0,)  # unit 0 freed by the unindex
    snap = coord.snapshot()
    assert sorted((r.prefix_hash, cid) for cid, r in snap.records.items()) == [(2, 1), (501, 2)]
    _ok(coord)


def test_reentrant_unindex_during_a_drain_orphans_later_entries() -> None:
    """Stores begun by a drain evict KV blocks whose hashes have boundaries and scratch
    stores queued behind them: those entries are dropped (G5), not begun for a prefix that
    is gone, and a store whose own prefix goes is EVICTING at once."""
    sp = spec(10, 10)
    coord, fired = _engine(2, sp)
    scratch = I.SlotPool([90, 91])
    coord.readable_midstep = True
    coord.attach_midstep_scratch(scratch, 8)
    kv = coord.pool.reserve_units(2, KV0)
    coord.pool.cache_units(kv, KV0, [777, 888])
    coord.checkpoint(Seq(0), 1, 111)
    coord.checkpoint(Seq(1), 1, 777)  # filed after 111's, whose store evicts 777
    coord.publish_midstep(coord.reserve_midstep(Seq(2), [(0, 888)]))
    stores, _ = coord.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [0, 90]  # 111, then the scratch store of 888
    assert fired == [777, 888]
    snap = coord.snapshot()
    assert snap.pending_boundaries == () and snap.scratch_queued == ()
    assert sorted((r.prefix_hash, r.phase) for r in snap.records.values()) == [
        (111, "COPYING"), (888, "EVICTING"),
    ]
    assert coord.checkpoints_orphaned == 2 and coord.checkpoints_kept == 2
    _ok(coord)
    coord.complete_previous_batch()
    assert coord.contains(111) and not coord.contains(888)
    assert scratch.free_slots == {90, 91}
    _ok(coord)


def test_reference_world_actions_run_on_the_production_pool() -> None:
    """The pool handed to World-style environments: raw KV reserve/release only, same ids as
    the reference (lowest free first)."""
    r, i = R.UnitPool(7), I.UnitPool(7)
    for pool in (r, i):
        a = pool.reserve_units(3, KV0)
        b = pool.reserve_units(2, KV1)
        assert a is not None and b is not None
        pool.release_units(a, KV0)
        pool.reserve_units(4, ("x", 0))
    assert r.snapshot_parts() == i.snapshot_parts()


# -- survivors of the full mutmut run at e247f01 (docs/mutation.md) ------------------------


def test_undo_after_a_callback_that_freed_other_units_restores_each_unit() -> None:
    """The callback released another owner's unit before raising, so the vacant heap is not
    empty when the undo runs: the undo puts each vacant unit of the reservation back onto it
    and the cached ones under their hashes, in LRU order."""
    pool = I.UnitPool(4)
    pool.cache_units(pool.reserve_units(2, KV0), KV0, [1, 2])  # 0, 1 cached
    assert pool.reserve_units(1, ("x", 0)) == [2]  # 3 is the only vacant unit

    def hook(h: int) -> None:
        if h == 1:
            pool.release_units([2], ("x", 0))
            raise RuntimeError("engine failed")

    pool.on_evict = hook
    with pytest.raises(EvictionCallbackError) as info:
        pool.reserve_units(3, KV1)
    assert info.value.undone
    assert pool.owner_of(3) is None and pool.owner_of(0) is None and pool.owner_of(2) is None
    assert pool.cached_units() == ((0, 1), (1, 2))
    assert pool.num_free == 4
    pool.on_evict = None
    assert pool.reserve_units(4, KV1) == [2, 3, 0, 1]  # vacant lowest first, then LRU


def test_undo_is_not_claimed_when_the_callback_released_the_new_reservation() -> None:
    pool = I.UnitPool(2)
    pool.cache_units(pool.reserve_units(2, KV0), KV0, [1, 2])

    def hook(h: int) -> None:
        if h == 1:
            pool.release_units([0, 1], KV1)  # the reservation being made
            raise RuntimeError("engine failed")

    pool.on_evict = hook
    with pytest.raises(EvictionCallbackError) as info:
        pool.reserve_units(2, KV1)
    assert info.value.undone is False
    assert pool.num_free == 2 and pool.owner_of(0) is None


def test_undo_is_not_claimed_when_the_callback_retagged_the_new_reservation() -> None:
    """The callback moved the reservation being made to another owner (same pieces) before
    raising: the units are no longer the reservation's, so nothing is undone and the new
    owner keeps them."""
    pool = I.UnitPool(2)
    pool.cache_units(pool.reserve_units(2, KV0), KV0, [1, 2])

    def hook(h: int) -> None:
        if h == 1:
            pool.rekey_units([0, 1], KV1, ("moved", 0))
            raise RuntimeError("engine failed")

    pool.on_evict = hook
    with pytest.raises(EvictionCallbackError) as info:
        pool.reserve_units(2, KV1)
    assert info.value.undone is False
    assert pool.owner_of(0) == (("moved", 0), 0) and pool.owner_of(1) == (("moved", 0), 1)
    pool.release_units([0, 1], ("moved", 0))
    assert pool.num_free == 2


def test_a_free_unit_keeps_no_tag() -> None:
    """Every way a unit goes free (release, cache, the undo of a reservation) forgets its
    reservation's handle (SPEC A.5: a unit is free exactly when its tag's handle is not
    live), and the undo gives its handle back, so a refused call leaves the pool exactly as
    it was (the atomicity tests compare every structure)."""
    pool = I.UnitPool(8, on_evict=lambda h: None)
    a = pool.reserve_units(3, KV0)
    b = pool.reserve_units(3, KV1)
    pool.release_units(a, KV0)
    pool.cache_units(b, KV1, [11, None, 13])
    with pool._as_store():
        c = pool.reserve_units(4, (CHECKPOINT_OWNER, 1))
        pool.release_units(c, (CHECKPOINT_OWNER, 1))
    assert not pool._who and pool.num_free == 8 and pool.self_check() == []
    assert all(pool.owner_of(u) is None for u in range(8))
    handles = pool._next_handle

    def refuse(h: int) -> None:
        raise RuntimeError(f"engine failed on {h}")

    pool.on_evict = refuse
    with pytest.raises(EvictionCallbackError):
        pool.reserve_units(8, ("x", 0))  # takes the cached units: undone
    assert not pool._who and pool.num_free == 8 and pool._next_handle == handles
    assert all(pool.owner_of(u) is None for u in range(8)) and pool.self_check() == []


def test_rekey_moves_the_owner_counts() -> None:
    """After a rekey the old owner holds nothing (it may reserve and release anew) and the
    new owner holds the units; a new owner already holding one unit is refused."""
    for models in (R, I):
        pool = models.UnitPool(6)
        units = pool.reserve_units(2, ("a", 0))
        pool.rekey_units(units, ("a", 0), ("b", 0))
        again = pool.reserve_units(1, ("a", 0))
        pool.release_units(again, ("a", 0))  # G9: exactly the one unit a holds now
        one = pool.reserve_units(1, ("c", 0))
        with pytest.raises(PagedStateError):
            pool.rekey_units(units, ("b", 0), ("c", 0))  # c already holds a unit
        pool.release_units(units, ("b", 0))
        pool.release_units(one, ("c", 0))
        assert pool.num_free == 6


def test_has_available_units_refuses_a_float_count() -> None:
    for models in (R, I):
        store = models.PageUnitCheckpointStore(models.UnitPool(4), spec(10, 20))
        with pytest.raises(PagedStateError, match="count"):
            store.has_available_units(1.5)


def test_claim_cached_units_names_the_owner_argument() -> None:
    pool = I.UnitPool(4)
    pool.cache_units(pool.reserve_units(1, KV0), KV0, [7])
    with pytest.raises(PagedStateError, match="^owner must be hashable"):
        pool.claim_cached_units([0], ["unhashable"])
    with pytest.raises(PagedStateError, match="unit 1 is not a cached free unit"):
        pool.claim_cached_units([1], KV1)


def test_owner_counts_keep_kinds_apart_and_equal_owners_together() -> None:
    """G9 counts per owner. Checkpoint owners are counted apart, by id: an owner of another
    kind with the same id (or the bare id) is another owner, and an owner equal to a
    checkpoint owner (a tuple subclass, a float id) is the same one, on both models."""
    from typing import NamedTuple

    class Tag(NamedTuple):
        kind: str
        ident: int

    for models in (R, I):
        pool = models.UnitPool(24)
        mine = (CHECKPOINT_OWNER, 7)
        with pool._as_store():
            ckpt = pool.reserve_units(2, mine)
            assert ckpt is not None
            with pytest.raises(InvalidArgumentError, match="already holds"):
                pool.reserve_units(1, Tag(CHECKPOINT_OWNER, 7))  # equal: the same owner
            with pytest.raises(InvalidArgumentError, match="already holds"):
                pool.reserve_units(1, (CHECKPOINT_OWNER, 7.0))
        others = [
            ("live-kv", 7),
            7,
            ("state-checkpoint-x", 7),
            # engine owners that only look like a checkpoint's: each is its own owner
            (CHECKPOINT_OWNER, 7, "a"),
            (CHECKPOINT_OWNER, 7, "b"),
            (1, CHECKPOINT_OWNER),
            (2, CHECKPOINT_OWNER),
        ]
        held = [pool.reserve_units(3, o) for o in others]  # none of them holds units yet
        with pytest.raises(PartialReleaseError):
            pool.release_units(held[0][:2], others[0])  # holds 3, not the checkpoint's 2
        with pool._as_store():
            with pytest.raises(PartialReleaseError):
                pool.release_units(ckpt[:1], mine)
            pool.release_units(list(ckpt), Tag(CHECKPOINT_OWNER, 7))  # the same owner
        for units, o in zip(held, others, strict=True):
            pool.release_units(units, o)
        assert pool.num_free == 24


def test_a_release_naming_a_free_unit_for_a_piece_is_refused() -> None:
    """The owner holds two units; a release naming a free unit in place of its first one
    (the right count, the rest right) is refused with WrongOwnerError on both models and
    changes nothing (the fast path must not take a free unit for the owner's)."""
    for models in (R, I):
        pool = models.UnitPool(6)
        pool.reserve_units(1, ("x", 0))  # unit 0
        mine = pool.reserve_units(2, KV0)  # units 1, 2
        pool.release_units([0], ("x", 0))  # unit 0 is free again
        assert mine == [1, 2] and pool.owner_of(0) is None
        before = pool.snapshot_parts()
        with pytest.raises(WrongOwnerError):
            pool.release_units([0, 2], KV0)
        assert pool.snapshot_parts() == before and pool.num_free == 4
        pool.release_units(mine, KV0)
        assert pool.num_free == 6


# -- G16: ids outside the pool ---------------------------------------------------------------


def test_every_id_taking_call_names_the_pool_range() -> None:
    """G16: a unit id outside ``[0, num_units)`` (negative or past the end) given to any
    pool call that takes ids, the KV calls included (the reference has none), raises
    InvalidArgumentError naming the range, ahead of any owner or duplicate check, and
    changes nothing."""
    pool = I.UnitPool(6)
    kv = pool.reserve_units(2, KV0)
    assert kv is not None
    pool.cache_units(pool.reserve_units(1, KV1), KV1, [301])  # unit 2 cached
    before = _deep(pool)
    calls = [
        lambda u: pool.release_units([*kv, u], KV0),
        lambda u: pool.release_units([u, u], ("nobody", 0)),  # before the duplicate check
        lambda u: pool.release_units([u], (CHECKPOINT_OWNER, 0)),  # before the owner check
        lambda u: pool.rekey_units([u, *kv], KV0, ("other", 0)),
        lambda u: pool.cache_units([*kv, u], KV0, [1, 2, 3]),
        lambda u: pool.claim_cached_units([2, u], ("kv", 9)),
        lambda u: pool.uncache_units([u]),
        lambda u: pool.mark_clean([u]),
        lambda u: pool.owner_of(u),
        lambda u: pool.is_dirty(u),
        lambda u: pool.cached_hash(u),
    ]
    for call in calls:
        for u in (6, 99, -1):
            with pytest.raises(InvalidArgumentError) as info:
                call(u)
            assert type(info.value) is InvalidArgumentError
            assert f"unit {u} is outside the pool's range [0, 6) (G16)" in str(info.value)
            assert _deep(pool) == before
    assert pool.self_check() == []
