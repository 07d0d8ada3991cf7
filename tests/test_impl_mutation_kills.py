"""Tests added to kill surviving mutants of impl/store.py and impl/pool.py (docs/mutation.md).

Each test compares the production store with the reference model, in lockstep, on a
behaviour that the rest of the suite did not observe closely enough for mutation testing
to notice a change.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import test_atomicity_reference
from test_impl_atomicity import bad_calls
from test_impl_lockstep import Lockstep

from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec import (
    DuplicateUnitError,
    EvictionCallbackError,
    InvalidArgumentError,
    PagedStateError,
    PartialReleaseError,
    StoreOwnedUnitsError,
)
from pagedstate.spec.types import CHECKPOINT_OWNER


def _refusal(obj: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        value = getattr(obj, name)(*args, **kwargs)
    except PagedStateError as exc:
        return type(exc), str(exc)
    return "returned", value


@pytest.mark.parametrize("seed", range(6))
def test_refused_calls_carry_the_reference_message(seed: int) -> None:
    """impl/_args.py: "The messages match the reference model's, so an engine sees the same
    text from either implementation." Every bad call of the atomicity catalogue, made on both
    models in a reachable state, raises the same class with the same message."""
    ls = Lockstep(random.Random(seed))
    for _ in range(40 * seed):
        ls.step()
    for target, name, args, kwargs in bad_calls(ls):
        r, i = ({"c": c, "s": c.store, "p": c.pool}[target] for c in (ls.r, ls.i))
        assert _refusal(i, name, args, kwargs) == _refusal(r, name, args, kwargs), (
            f"{target}.{name}{args}{kwargs or ''}"
        )


def test_claiming_cached_units_without_an_owner_says_what_reserving_does() -> None:
    """``claim_cached_units`` (engine-only, no reference counterpart) makes a reservation; a
    None owner is refused with the reference's ``reserve_units`` message for the same fault."""
    expected = _refusal(R.UnitPool(4), "reserve_units", (1, None), {})
    assert expected[0] != "returned"
    assert _refusal(I.UnitPool(4), "claim_cached_units", ([0],), {"owner": None}) == expected
    assert _refusal(I.UnitPool(4), "reserve_units", (1, None), {}) == expected


def _world(monkeypatch: pytest.MonkeyPatch, models: Any) -> Any:
    """The reference atomicity suite's world, built from ``models``' classes."""
    for name in ("PagedStateCheckpointCoordinator", "UnitPool", "SlotPool"):
        monkeypatch.setattr(test_atomicity_reference, name, getattr(models, name))
    return test_atomicity_reference.build_world()


@pytest.mark.parametrize(
    "case", test_atomicity_reference.CASES, ids=[c[0] for c in test_atomicity_reference.CASES]
)
def test_refusals_in_the_atomicity_world_carry_the_reference_message(
    case: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each refusal of the reference atomicity suite (a world with records in every phase,
    queued, in-flight and suspended restores, leases, offload pins, transfers, midstep
    scratch), made on a reference world and on a production world built the same way, raises
    the same class with the same message."""
    _, call, error = case

    def outcome(models: Any) -> Any:
        w = _world(monkeypatch, models)
        try:
            value = call(w)
        except PagedStateError as exc:
            return type(exc), str(exc)
        return "returned", value

    expected = outcome(R)
    assert expected[0] is error
    assert outcome(I) == expected


def test_resume_reports_the_lease_and_the_restore_it_requeues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``on_transition`` (production only) names each row's subject: resuming a suspended
    restore reports the lease and the ``(checkpoint id, slot)`` restore, after which the
    restore is queued again in both models."""
    w = _world(monkeypatch, I)
    seen: list[tuple[str, object]] = []
    w.c.on_transition = lambda machine, row, subject: seen.append((machine, subject))
    lease = w.lease
    w.s.resume_suspended_restore(lease)
    assert ("lease", lease.lease_id) in seen
    assert ("restore", (lease.checkpoint_id, lease.op.dst_slot)) in seen
    r = _world(monkeypatch, R)
    r.s.resume_suspended_restore(r.lease)
    assert w.s.restore_queued_for(lease.op.dst_slot) is r.s.restore_queued_for(r.lease.op.dst_slot)
    assert w.s.restore_queued_for(lease.op.dst_slot)


# -- survivors of the 2026-11-30 sample at 962d58a (docs/mutation.md) ----------------------


def _both_stores(**kwargs: Any) -> tuple[Any, Any]:
    """A reference and a production store over pools of 16 units, one-unit images."""
    from conftest import spec

    return (
        R.PageUnitCheckpointStore(R.UnitPool(16), spec(10, 10), **kwargs),
        I.PageUnitCheckpointStore(I.UnitPool(16), spec(10, 10), **kwargs),
    )


def _outcome(fn: Any) -> Any:
    try:
        return "returned", fn()
    except PagedStateError as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("bad", [True, -1, 1.0])
def test_release_refuses_a_unit_id_that_is_not_a_plain_id(bad: Any) -> None:
    """``_is_whole``'s fast path: a bool (``True == 1``), a negative id (which would index
    the tag list from its end) or a float is not unit 1 / the last unit. Set up so that the
    unit those would alias is the owner's piece 0, refused with the reference's error and
    nothing changed."""
    for models in (R, I):
        pool = models.UnitPool(4)
        owner = ("live-kv", 7)
        alias = 3 if bad == -1 else 1
        if alias == 3:
            assert pool.reserve_units(3, ("live-kv", 1)) == [0, 1, 2]
        else:
            assert pool.reserve_units(1, ("live-kv", 1)) == [0]
        assert pool.reserve_units(1, owner) == [alias]
        before = pool.snapshot_parts()
        with pytest.raises(PagedStateError):
            pool.release_units([bad], owner)
        assert pool.snapshot_parts() == before
    r, i = R.UnitPool(4), I.UnitPool(4)
    for p in (r, i):
        p.reserve_units(1, ("live-kv", 1))
        p.reserve_units(1, ("live-kv", 7))
    assert _outcome(lambda: i.release_units([bad], ("live-kv", 7))) == _outcome(
        lambda: r.release_units([bad], ("live-kv", 7))
    )


def test_release_of_a_large_reservation_takes_the_bulk_path() -> None:
    """A large reservation (40 units; the pool once had a separate bulk path above 8): the
    whole-reservation check, in both stores."""
    for models in (R, I):
        pool = models.UnitPool(64)
        units = pool.reserve_units(40, ("live-kv", 1))
        assert units == list(range(40))
        pool.release_units(units, ("live-kv", 1))
        assert pool.num_free == 64
        units = pool.reserve_units(20, ("live-kv", 2))
        with pytest.raises(PagedStateError):
            pool.release_units(units[:-1], ("live-kv", 2))  # partial (G9)
        with pytest.raises(PagedStateError):
            pool.release_units([*units[:-1], 63], ("live-kv", 2))  # a free unit
        pool.release_units(units, ("live-kv", 2))
        assert pool.num_free == 64


def test_cache_units_names_what_prefix_hashes_must_be() -> None:
    pool = I.UnitPool(4)
    units = pool.reserve_units(2, ("live-kv", 1))
    with pytest.raises(PagedStateError, match=r"prefix_hashes must be a list or tuple of 2"):
        pool.cache_units(units, ("live-kv", 1), [5])


def test_store_access_nests() -> None:
    """``_as_store()`` blocks nest: leaving the inner one keeps the outer one's access."""
    pool = I.UnitPool(4)
    owner = ("state-checkpoint", 0)
    with pool._as_store():
        with pool._as_store():
            pass
        assert pool.reserve_units(1, owner) == [0]
    with pytest.raises(PagedStateError):
        pool.reserve_units(1, ("state-checkpoint", 1))


def test_lookup_of_a_copying_record_is_exactly_minus_one() -> None:
    """``lookup`` answers -1 (ATOM's value) for a hash whose record is COPYING or
    EVICTING, not just some negative number."""
    for store in _both_stores():
        assert store.begin_store(5, 0) is not None
        assert store.lookup(5) == -1  # COPYING
        store.complete_inflight()
        assert store.lookup(5) >= 0
        assert store.begin_restore(5, 1) is not None  # pinned
        assert store.unindex(5)  # EVICTING while pinned
        assert store.lookup(5) == -1
        assert store.lookup(6) == -1  # never stored


def test_restore_into_slot_zero() -> None:
    for store in _both_stores():
        assert store.begin_store(5, 3) is not None
        store.complete_inflight()
        op = store.begin_restore(5, 0)
        assert op is not None and op.dst_slot == 0
        assert store.restore_queued_for(0)


def test_a_lease_not_yet_issued_is_unknown_not_reused() -> None:
    """A forged lease naming the next id to be issued was never issued: UnknownOperation,
    the reference's class and message (a reused lease would be LeaseReusedError)."""
    from pagedstate.spec import LeaseReusedError, UnknownOperationError

    outcomes = []
    for store in _both_stores():
        assert store.begin_store(5, 3) is not None
        store.complete_inflight()
        assert store.begin_restore(5, 1) is not None
        lease = store.suspend_queued_restore(1)
        assert lease is not None
        forged = type(lease)(lease.checkpoint_id, lease.op, lease.lease_id + 1)
        got = _outcome(lambda s=store, f=forged: s.resume_suspended_restore(f))
        assert got[0] is UnknownOperationError
        outcomes.append(got)
        store.resume_suspended_restore(lease)
        again = _outcome(lambda s=store, le=lease: s.resume_suspended_restore(le))
        assert again[0] is LeaseReusedError
    assert outcomes[0] == outcomes[1]


def test_a_live_pin_below_the_forfeit_watermark_is_trusted() -> None:
    """G7: past the exact forfeit memory, a report at or below the watermark is untrusted
    *unless its operation still holds a live pin*: here an explicit lease (generation 1,
    never timed out) under a watermark of 2."""
    from conftest import FakeClock, spec

    answers = []
    for models in (R, I):
        clock = FakeClock(0.0)
        store = models.PageUnitCheckpointStore(
            models.UnitPool(16), spec(10, 10), offload_sink=True, clock=clock, forfeit_bound=1
        )
        for h in (1, 2, 3):
            assert store.begin_store(h, 0) is not None
            store.complete_inflight()
        leased = store.acquire_checkpoint_source(1)
        assert leased is not None
        lease_op = leased[0]
        ops = [op for op, _ in store.take_offload_stores(3)]
        assert [op.prefix_hash for op in ops] == [2, 3]
        clock.advance(10)
        assert store.reclaim_stale_offload_pins(5) == 2  # 2 and 3; the bound trims 2
        got = (store.was_reclaimed(lease_op), [store.was_reclaimed(op) for op in ops])
        assert got == (False, [True, True])
        answers.append(got)
    assert answers[0] == answers[1]


def test_snapshot_shows_cached_kv_units() -> None:
    """The snapshot carries the pool's cached KV units (unit, prefix hash), so a refused
    call that disturbed them is seen."""
    c = I.PagedStateCheckpointCoordinator(I.UnitPool(8), _spec_of_two(), True)
    units = c.pool.reserve_units(2, ("live-kv", 1))
    c.pool.cache_units(units, ("live-kv", 1), [11, 12])
    snap = c.snapshot()
    assert dict(snap.cached) == {units[0]: 11, units[1]: 12}


def _spec_of_two() -> Any:
    from conftest import spec

    return spec(10, 20)


def test_a_pin_on_a_copying_record_is_refused_naming_its_phase() -> None:
    """G11 through the production store's own ``_pin`` (the reference's is covered by
    tests/test_section_g.py): the table refuses it and the error names the real phase."""
    from pagedstate.spec import IllegalTransitionError

    for store in _both_stores():
        assert store.begin_store(5, 0) is not None
        cid = store.snapshot().pending[5]
        before = store.snapshot()
        with pytest.raises(IllegalTransitionError) as info:
            store._pin(cid, "restore")
        assert (info.value.phase, info.value.event) == ("COPYING", "pin_restore")
        assert store.snapshot() == before


# -- survivors of the full run at e247f01 (docs/mutation.md): the pool ---------------------


def _both_pools(n: int) -> tuple[Any, Any]:
    return R.UnitPool(n), I.UnitPool(n)


@pytest.mark.parametrize("bad", ["4", -1, True, 2.0])
def test_a_bad_pool_size_is_refused_with_the_reference_message(bad: Any) -> None:
    """The message names ``num_units``, as the reference's does."""
    expected = _outcome(lambda: R.UnitPool(bad))
    assert expected[0] != "returned"
    assert _outcome(lambda: I.UnitPool(bad)) == expected


def test_an_empty_pool_is_a_pool() -> None:
    """``num_units >= 0``: a pool of no units is accepted and has nothing free."""
    for pool in _both_pools(0):
        assert pool.num_free == 0
        assert pool.has_free(0) and not pool.has_free(1)
        assert pool.reserve_units(1, ("live-kv", 1)) is None


def test_a_callback_that_cannot_be_called_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        I.UnitPool(4, on_evict=5)  # type: ignore[arg-type]
    assert str(info.value) == "on_evict must be callable or None, got 5"


def _cached_pool(n: int, hashes: list[int], on_evict: Any = None) -> I.UnitPool:
    """A production pool of ``n`` units whose first ``len(hashes)`` units are cached KV
    blocks of ``hashes`` (least recently cached first); the rest are vacant."""
    pool = I.UnitPool(n, on_evict=on_evict)
    units = pool.reserve_units(n, ("live-kv", 0))
    assert units is not None
    k = len(hashes)
    pool.cache_units(units, ("live-kv", 0), [*hashes, *([None] * (n - k))])
    assert pool.num_cached == k
    return pool


def test_cached_units_count_as_free() -> None:
    """``has_free`` counts vacant and cached units alike (a cached block is reclaimable)."""
    pool = _cached_pool(4, [11, 12, 13, 14])
    assert pool.has_free(4)
    assert not pool.has_free(5)
    pool = _cached_pool(4, [11, 12])
    assert pool.has_free(4) and pool.num_free == 4


def test_a_clone_defers_its_own_evictions() -> None:
    """A clone's ``deferred_evictions`` block holds its callbacks until the block exits,
    on the clone's own lists: the original sees none of it."""
    fired: list[int] = []
    pool = _cached_pool(4, [11, 12, 13, 14], on_evict=fired.append)
    clone = pool.clone()
    with clone.deferred_evictions():
        assert clone.reserve_units(2, ("live-kv", 1)) == [0, 1]
        assert fired == []
    assert fired == [11, 12]
    assert pool.num_cached == 4 and clone.num_cached == 2
    with pool.deferred_evictions():
        assert pool.reserve_units(1, ("live-kv", 1)) == [0]
    assert fired == [11, 12, 11]


def test_a_clone_can_undo_a_reservation_whose_callback_raised() -> None:
    """The clone has its own undo list: a callback that raises inside a clone's
    ``deferred_evictions(undo_on_error=True)`` undoes the clone's reservation only."""

    def boom(h: int) -> None:
        raise ValueError(h)

    pool = _cached_pool(4, [11, 12, 13, 14], on_evict=boom)
    clone = pool.clone()
    with pytest.raises(EvictionCallbackError) as info:
        with clone.deferred_evictions(undo_on_error=True):
            clone.reserve_units(2, ("live-kv", 1))
    assert info.value.undone is True
    assert clone.num_cached == 4 and clone.owner_of(0) is None
    assert pool.num_cached == 4


def test_releasing_nothing_for_an_owner_without_units_changes_nothing() -> None:
    """An owner that holds no units releases (or retags) a whole reservation of none:
    accepted, as by the reference, and the owners' counts stay right."""
    for pool in _both_pools(4):
        pool.release_units([], ("live-kv", 3))
        pool.rekey_units([], ("live-kv", 3), ("live-kv", 4))
        assert pool.num_free == 4
        assert pool.reserve_units(1, ("live-kv", 3)) == [0]
        assert pool.reserve_units(1, ("live-kv", 4)) == [1]


def test_releasing_nothing_for_an_owner_with_units_is_partial() -> None:
    r, i = _both_pools(4)
    for pool in (r, i):
        pool.reserve_units(2, ("live-kv", 1))
    got = _outcome(lambda: i.release_units([], ("live-kv", 1)))
    assert got[0] is PartialReleaseError
    assert got == _outcome(lambda: r.release_units([], ("live-kv", 1)))
    assert i.num_free == 2


def test_releasing_nothing_for_no_owner_is_refused() -> None:
    r, i = _both_pools(4)
    got = _outcome(lambda: i.release_units([], None))
    assert got[0] is InvalidArgumentError
    assert got == _outcome(lambda: r.release_units([], None))


def _refused_alike(n: int, count: int, ids: list[Any], error: type) -> None:
    """In a pool of ``n`` units whose owner holds units ``0 .. count - 1``,
    ``release_units(ids)`` is refused with ``error`` and the reference's message, and
    nothing changed; the right ids are then accepted."""
    r, i = _both_pools(n)
    owner = ("live-kv", 7)
    for pool in (r, i):
        assert pool.reserve_units(count, owner) == list(range(count))
    before = i.snapshot_parts()
    got = _outcome(lambda: i.release_units(ids, owner))
    assert got[0] is error
    assert got == _outcome(lambda: r.release_units(ids, owner))
    assert i.snapshot_parts() == before
    i.release_units(list(range(count)), owner)
    assert i.num_free == n


def test_release_naming_the_unit_past_the_pool_names_the_range() -> None:
    """Unit ``num_units`` does not exist: an InvalidArgumentError naming the pool's range
    (G16; before G16, WrongOwner), never an IndexError, on the small and the bulk fast
    paths, with the reference's message."""
    _refused_alike(4, 1, [4], InvalidArgumentError)
    _refused_alike(12, 12, [*range(11), 12], InvalidArgumentError)


def test_release_naming_a_piece_twice_is_refused() -> None:
    """Units [0, 1, 1] of a three-unit reservation: the repeat is refused, even though
    the count matches and 0 and 1 are the right first pieces."""
    _refused_alike(4, 3, [0, 1, 1], DuplicateUnitError)
    _refused_alike(12, 12, [*range(11), 10], DuplicateUnitError)


@pytest.mark.parametrize("bad", [-1, True])
def test_bulk_release_refuses_an_id_that_aliases_a_held_unit(bad: Any) -> None:
    """On the bulk path (more than ``_SMALL`` units): -1 would index the tag list from its
    end (the owner's last unit, 11) and ``True`` is unit 1; both are refused."""
    ids: list[Any] = list(range(12))
    if bad is True:
        ids[1] = True
    else:
        ids[11] = -1
    _refused_alike(12, 12, ids, InvalidArgumentError)


@pytest.mark.parametrize("n", [2, 12])
def test_release_through_a_list_subclass_frees_the_owner(n: int) -> None:
    """A list subclass takes the validating path; the release still frees the units and
    the owner's count, so the owner can reserve again, and dirties a store owner's units."""

    class Ids(list):  # type: ignore[type-arg]
        pass

    pool = I.UnitPool(16)
    units = pool.reserve_units(n, ("live-kv", 1))
    pool.release_units(Ids(units), ("live-kv", 1))
    assert pool.num_free == 16 and not pool.dirty_units()
    assert pool.reserve_units(n, ("live-kv", 1)) == units
    owner = (CHECKPOINT_OWNER, 5)
    with pool._as_store():
        got = pool.reserve_units(1, owner)
        assert got is not None
        pool.release_units(Ids(got), owner)
        assert pool.dirty_units() == frozenset(got)
        assert pool.reserve_units(1, owner) == got


def test_a_callback_may_not_use_store_owners() -> None:
    """Store owners are refused inside ``on_evict`` (the engine's code), however the
    reservation that fired it was made."""
    refused: list[object] = []
    pool: I.UnitPool

    def grab(h: int) -> None:
        try:
            pool.reserve_units(1, (CHECKPOINT_OWNER, h))
        except StoreOwnedUnitsError as exc:
            refused.append(exc)

    pool = _cached_pool(4, [11, 12, 13, 14], on_evict=grab)
    assert pool.reserve_units(1, ("live-kv", 1)) == [0]
    assert len(refused) == 1
    with pool._as_store():
        assert pool.reserve_units(1, (CHECKPOINT_OWNER, 99)) == [1]
    assert len(refused) == 2


def test_raw_state_units_cannot_be_cached_and_the_message_says_so() -> None:
    pool = I.UnitPool(4)
    owner = (CHECKPOINT_OWNER, 1)
    with pool._as_store():
        units = pool.reserve_units(1, owner)
        with pytest.raises(InvalidArgumentError) as info:
            pool.cache_units(units, owner, [5])
    assert str(info.value) == (
        f"units of {owner!r} hold raw state, not KV: release them with release_units"
    )


def test_a_prefix_hash_that_is_not_an_int_is_named() -> None:
    pool = I.UnitPool(4)
    units = pool.reserve_units(2, ("live-kv", 1))
    with pytest.raises(InvalidArgumentError) as info:
        pool.cache_units(units, ("live-kv", 1), [5, "x"])
    assert str(info.value) == "a prefix hash must be an int or None, got 'x'"


def test_uncaching_a_unit_that_is_not_cached_names_it() -> None:
    pool = _cached_pool(4, [11])
    with pytest.raises(InvalidArgumentError) as info:
        pool.uncache_units([0, 2])
    assert str(info.value) == "unit 2 is not a cached free unit"
    assert pool.num_cached == 1


def test_an_eviction_error_names_the_callbacks_exception() -> None:
    def boom(h: int) -> None:
        raise KeyError(h)

    pool = _cached_pool(4, [11, 12, 13, 14], on_evict=boom)
    with pytest.raises(EvictionCallbackError) as info:
        pool.reserve_units(1, ("live-kv", 1))
    assert str(info.value).startswith("on_evict(11) raised KeyError: 11; ")
    assert info.value.undone is True


def test_nested_deferrals_fire_when_the_outermost_exits() -> None:
    fired: list[int] = []
    pool = _cached_pool(4, [11, 12, 13, 14], on_evict=fired.append)
    with pool.deferred_evictions():
        with pool.deferred_evictions():
            pool.reserve_units(1, ("live-kv", 1))
        assert fired == []
        with pool.deferred_evictions():
            pass
        assert fired == []
        pool.reserve_units(1, ("live-kv", 2))
        assert fired == []
    assert fired == [11, 12]


@pytest.mark.parametrize("explicit", [False, True])
def test_an_engine_deferral_keeps_its_reservations_when_a_callback_raises(
    explicit: bool,
) -> None:
    """Without ``undo_on_error`` (the default) the block's reservations stand and the
    error says so (``undone`` is exactly False)."""

    def boom(h: int) -> None:
        raise ValueError(h)

    pool = _cached_pool(4, [11, 12, 13, 14], on_evict=boom)
    block = pool.deferred_evictions(undo_on_error=False) if explicit else pool.deferred_evictions()
    with pytest.raises(EvictionCallbackError) as info:
        with block:
            assert pool.reserve_units(2, ("live-kv", 1)) == [0, 1]
    assert info.value.undone is False
    assert pool.owner_of(0) == (("live-kv", 1), 0) and pool.num_cached == 2


def test_retagging_onto_an_owner_holding_one_unit_is_refused() -> None:
    r, i = _both_pools(4)
    for pool in (r, i):
        pool.reserve_units(1, ("live-kv", 1))
        pool.reserve_units(1, ("live-kv", 2))
    got = _outcome(lambda: i.rekey_units([0], ("live-kv", 1), ("live-kv", 2)))
    assert got[0] is InvalidArgumentError
    assert got == _outcome(lambda: r.rekey_units([0], ("live-kv", 1), ("live-kv", 2)))


def test_slot_pool_refusals_carry_the_reference_message() -> None:
    r, i = R.SlotPool([3, 4]), I.SlotPool([3, 4])
    for pool in (r, i):
        assert pool.pop() == 3
    for call in (lambda p: p.release(9), lambda p: p.release(4), lambda p: p.release(3.5)):
        got = _outcome(lambda call=call: call(i))
        assert got[0] is InvalidArgumentError
        assert got == _outcome(lambda call=call: call(r))
    for pool in (r, i):
        assert pool.pop() == 4
    got = _outcome(i.pop)
    assert got[0] is InvalidArgumentError
    assert got == _outcome(r.pop)


# -- survivors of the full run at e247f01 (docs/mutation.md): the store --------------------


def _stores(pool_size: int = 16, **kwargs: Any) -> tuple[Any, Any]:
    """A reference and a production store over pools of ``pool_size`` units, one-unit
    images."""
    from conftest import spec

    return (
        R.PageUnitCheckpointStore(R.UnitPool(pool_size), spec(10, 10), **kwargs),
        I.PageUnitCheckpointStore(I.UnitPool(pool_size), spec(10, 10), **kwargs),
    )


def _stored(store: Any, *hashes: int) -> Any:
    for h in hashes:
        assert store.begin_store(h, 0) is not None
        store.complete_inflight()
    return store


@pytest.mark.parametrize(
    "kwargs",
    [
        {"spec": "not a spec"},
        {"offload_backlog_cap": "8"},
        {"offload_backlog_cap": 0},
        {"forfeit_bound": 1.0},
        {"forfeit_bound": 0},
        {"change_log_size": None},
        {"change_log_size": 0},
    ],
)
def test_a_bad_store_argument_is_refused_with_the_reference_message(kwargs: Any) -> None:
    from conftest import spec

    def build(models: Any) -> Any:
        args = {"spec": spec(10, 10), **kwargs}
        return models.PageUnitCheckpointStore(models.UnitPool(4), **args)

    expected = _outcome(lambda: build(R))
    assert expected[0] is InvalidArgumentError
    assert _outcome(lambda: build(I)) == expected


def test_a_change_log_of_one_change_is_allowed_and_bounds_clones() -> None:
    """``change_log_size=1`` is the smallest log; a clone keeps the same bound (an older
    generation is then unknown, ``None``, in the clone as in the original)."""
    for store in _stores(change_log_size=1):
        _stored(store, 1)
        g = store.generation
        clone = store.clone()
        _stored(clone, 2, 3)
        assert clone.changed_since(g + 1) == {3}
        assert clone.changed_since(g) is None
        assert store.changed_since(g) == set()


def test_a_clone_over_a_given_pool_uses_that_pool() -> None:
    for store in _stores():
        _stored(store, 1)
        pool = store.pool.clone()
        clone = store.clone(pool)
        assert clone.pool is pool
        assert clone.clone().pool is not pool


def test_the_default_clock_stamps_offload_pins() -> None:
    """With no ``clock``, offload pins are stamped by ``time.monotonic``."""
    import time

    before = time.monotonic()
    for store in _stores(offload_sink=True):
        _stored(store, 1)
        got = store.acquire_checkpoint_source(1)
        assert got is not None
        pinned_at = store.snapshot().offload_pins[got[0]].pinned_at
        assert before <= pinned_at <= time.monotonic()


@pytest.mark.parametrize("subclass", [False, True])
def test_a_store_reservation_stands_when_a_callback_raises(subclass: bool) -> None:
    """``begin_store`` (SPEC A.4, G8): a failing ``on_evict`` leaves the reservation and
    the COPYING record in place, ``undone`` exactly False, over a ``UnitPool`` and over a
    subclass of it (the store's general path)."""
    from conftest import spec

    class Sub(I.UnitPool):
        pass

    def boom(h: int) -> None:
        raise ValueError(h)

    pool = (Sub if subclass else I.UnitPool)(2, on_evict=boom)
    units = pool.reserve_units(2, ("live-kv", 0))
    pool.cache_units(units, ("live-kv", 0), [11, 12])
    store = I.PageUnitCheckpointStore(pool, spec(10, 10))
    with pytest.raises(EvictionCallbackError) as info:
        store.begin_store(5, 0)
    assert info.value.undone is False
    assert store.snapshot().pending == {5: 0}
    assert pool.owner_of(0) == ((CHECKPOINT_OWNER, 0), 0)


class _BarePool:
    """A unit pool with only the protocol's calls (no ``_as_store``, ``deferred_evictions``
    or ``cached_units``): a reference pool that always grants store access."""

    def __init__(self, n: int) -> None:
        self._pool = R.UnitPool(n)
        self._pool._as_store().__enter__()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "cached_units":
            raise AttributeError(name)
        return getattr(self._pool, name)


@pytest.mark.parametrize("pool_kind", ["reference", "bare"])
def test_the_store_runs_over_a_pool_of_another_class(pool_kind: str) -> None:
    """A pool that is not ``impl.UnitPool`` is driven through its public calls only: store,
    publish, restore, evict, unindex and snapshot, in step with the reference."""
    from conftest import spec

    pool: Any = R.UnitPool(2) if pool_kind == "reference" else _BarePool(2)
    store = I.PageUnitCheckpointStore(pool, spec(10, 10))
    ref = R.PageUnitCheckpointStore(R.UnitPool(2), spec(10, 10))
    for s in (store, ref):
        _stored(s, 1, 2, 3)  # 3 evicts 1
        assert s.evictions == 1 and s.lookup(1) == -1
        assert s.unindex(2)
    assert pool.num_free == 1
    assert store.snapshot() == ref.snapshot()


def _clock_store(models: Any) -> tuple[Any, Any]:
    from conftest import FakeClock, spec

    clock = FakeClock(10.0)
    store = models.PageUnitCheckpointStore(
        models.UnitPool(16), spec(10, 10), offload_sink=True, clock=clock
    )
    return store, clock


def test_reclaim_after_the_clock_stepped_back_finds_every_stale_pin() -> None:
    """Pins taken at 10, then 5 (the clock stepped back), then 7: pin order is no longer
    time order, so reclaim reads them all. At 12 with a 7 s timeout only the pin of 5 is
    stale (at the boundary); after it is gone and the pin of 10 settled, at 13 with a 6 s
    timeout the pin of 7 is stale. As the reference."""
    answers = []
    for models in (R, I):
        store, clock = _clock_store(models)
        _stored(store, 1, 2, 3)
        ops = []
        for t in (10.0, 5.0, 7.0):
            clock.t = t
            got = store.take_offload_stores(len(ops) + 1)
            assert len(got) == 1
            ops.append(got[0][0])
        clock.t = 12.0
        first = store.reclaim_stale_offload_pins(7)
        reclaimed = [store.was_reclaimed(op) for op in ops]
        store.settle_offload_store(ops[0])
        clock.t = 13.0
        second = store.reclaim_stale_offload_pins(6)
        answers.append((first, reclaimed, second, [store.was_reclaimed(op) for op in ops]))
    assert answers[0] == answers[1]
    assert answers[1] == (1, [False, True, False], 1, [False, True, True])


def test_a_second_pin_older_than_the_first_is_found_by_reclaim() -> None:
    """Two pins, at 10 and then 5 (the clock stepped back): at 12 with a 7 s timeout the
    pin of 5 is stale although the pin before it is not, as in the reference."""
    for models in (R, I):
        store, clock = _clock_store(models)
        _stored(store, 1, 2)
        ops = []
        for t in (10.0, 5.0):
            clock.t = t
            ops.append(store.take_offload_stores(len(ops) + 1)[0][0])
        clock.t = 12.0
        assert store.reclaim_stale_offload_pins(7) == 1
        assert [store.was_reclaimed(op) for op in ops] == [False, True]


def test_a_retired_pin_keeps_reclaim_reading_out_of_order_pins() -> None:
    """Pins at 10, 5, 7; the pin of 5 is settled. The two left (10, then 7) are still out
    of time order: at 13 with a 6 s timeout the pin of 7 is stale, not hidden behind 10."""
    answers = []
    for models in (R, I):
        store, clock = _clock_store(models)
        _stored(store, 1, 2, 3)
        ops = []
        for t in (10.0, 5.0, 7.0):
            clock.t = t
            ops.append(store.take_offload_stores(len(ops) + 1)[0][0])
        store.settle_offload_store(ops[1])
        clock.t = 13.0
        answers.append((store.reclaim_stale_offload_pins(6), store.was_reclaimed(ops[2])))
    assert answers == [(1, True), (1, True)]


def test_a_restored_record_is_the_most_recently_used() -> None:
    """Restoring 1 makes it more recent than 2: room for 3 evicts 2, then 1."""
    for store in _stores(2):
        _stored(store, 1, 2)
        for _ in range(3):
            assert store.begin_restore(1, 0) is not None
            store.take_restore_ops()
            store.complete_inflight()
        _stored(store, 3)
        assert (store.lookup(1) >= 0, store.lookup(2)) == (True, -1)
        _stored(store, 4)
        assert store.lookup(1) == -1 and store.lookup(3) >= 0


def test_eviction_order_survives_victim_heap_compaction() -> None:
    """Many pin / unpin cycles on one record grow the victim heap past its bound, so it is
    rebuilt from the LRU: the rebuilt heap still holds every evictable record, in LRU
    order (2 is evicted first, then 1), as in the reference."""
    for store in _stores(3):
        _stored(store, 1, 2)
        for _ in range(40):
            assert store.begin_restore(1, 0) is not None
            store.take_restore_ops()
            store.complete_inflight()
        _stored(store, 3, 4)
        assert store.evictions == 1
        assert store.lookup(1) >= 0 and store.lookup(2) == -1
        _stored(store, 5)
        assert store.lookup(1) == -1 and store.lookup(3) >= 0


def test_a_pinned_protected_record_is_not_discounted() -> None:
    """``has_available_units``: the protected record is discounted only when it could be
    evicted; a pinned one is not evictable anyway."""
    for store in _stores(2):
        _stored(store, 1, 2)
        assert store.begin_restore(1, 0) is not None
        assert store.has_available_units(1, protected_hash=1)
        assert not store.has_available_units(1, protected_hash=2)
        assert not store.has_available_units(2, protected_hash=1)


@pytest.mark.parametrize(
    "call",
    [
        ("begin_store", ("x", -1), {}),
        ("begin_restore", ("x", -1), {}),
        ("acquire_checkpoint_source", ("x",), {"max_inflight": -1}),
        ("acquire_checkpoint_source", ("x",), {"max_inflight": 0}),
        ("adopt_units", ((), ("live-kv", 1), "x"), {}),
    ],
)
def test_a_bad_prefix_hash_is_named_first(call: Any) -> None:
    """The prefix hash is checked before the other arguments (and before ``max_inflight``
    can answer None), as in the reference."""
    name, args, kwargs = call
    r, i = _stores()
    expected = _outcome(lambda: getattr(r, name)(*args, **kwargs))
    assert expected[0] is InvalidArgumentError and "prefix_hash" in expected[1]
    assert _outcome(lambda: getattr(i, name)(*args, **kwargs)) == expected


def test_restore_rows_name_the_checkpoint_and_the_slot() -> None:
    """``on_transition``'s subject for restore rows is ``(checkpoint id, slot)``: taking,
    cancelling and suspending a queued restore."""
    store = _stored(_stores()[1], 1)
    cid = store.lookup(1)
    seen: list[tuple[str, str, object]] = []
    store.on_transition = lambda machine, row, subject: seen.append((machine, row.event, subject))
    for slot in (0, 1, 2):
        assert store.begin_restore(1, slot) is not None
    store.cancel_queued_restore(1)
    assert store.suspend_queued_restore(2) is not None
    store.take_restore_ops()
    restore_rows = [(e, s) for m, e, s in seen if m == "restore"]
    assert ("cancel", (cid, 1)) in restore_rows
    assert ("suspend", (cid, 2)) in restore_rows
    assert ("take", (cid, 0)) in restore_rows


def test_a_pin_taken_through_pin_is_a_restore_pin_on_the_record() -> None:
    """``_pin`` on a READY record applies the pin row to that record (counted, reported
    with the record's id) and ``_unpin`` undoes it."""
    store = _stored(_stores()[1], 1)
    cid = store.lookup(1)
    seen: list[object] = []
    store.on_transition = lambda machine, row, subject: seen.append((machine, subject))
    store._pin(cid, "restore")
    assert store.snapshot().records[cid].pin_count == 1
    assert seen == [("record", cid)]
    assert not store.has_available_units(17)
    store._unpin(cid, "restore")
    assert store.snapshot().records[cid].pin_count == 0


def test_an_owner_holding_units_cannot_claim_cached_ones() -> None:
    """G9, one reservation per owner: claiming cached units is a reservation too, refused
    with ``reserve_units``' message."""
    pool = _cached_pool(4, [11, 12])
    assert pool.reserve_units(1, ("live-kv", 1)) == [2]
    expected = _outcome(lambda: pool.reserve_units(1, ("live-kv", 1)))
    assert expected[0] is InvalidArgumentError
    assert _outcome(lambda: pool.claim_cached_units([0], ("live-kv", 1))) == expected
    assert pool.num_cached == 2


def _leased(models: Any) -> tuple[Any, Any, int]:
    """A store of ``models`` with checkpoint 1 READY and a suspended restore of it into
    slot 1: ``(store, lease, checkpoint id)``."""
    from conftest import spec

    store = _stored(models.PageUnitCheckpointStore(models.UnitPool(4), spec(10, 10)), 1)
    assert store.begin_restore(1, 1) is not None
    lease = store.suspend_queued_restore(1)
    assert lease is not None
    return store, lease, lease.checkpoint_id


@pytest.mark.parametrize("fault", ["no record", "no pin", "queued", "in flight"])
def test_resume_refuses_a_lost_pin_or_a_busy_slot_with_the_reference_message(
    fault: str,
) -> None:
    """SPEC B.3 row 8's guards on ``resume_suspended_restore``. The public calls cannot
    reach them (the lease holds the pin; a slot with a suspended restore takes no other),
    so each fault is planted in both models' private state, the same way."""
    got = []
    for models in (R, I):
        store, lease, cid = _leased(models)
        if fault == "no record":
            del store.records[cid]
        elif fault == "no pin":
            store.records[cid].pin_count = 0
        elif models is R:
            where = store._queued_restores if fault == "queued" else store._inflight_restores
            where.append((cid, lease.op))
        elif fault == "queued":
            store._queued_restores[lease.op.dst_slot] = (cid, lease.op)
        else:
            store._inflight_slots.add(lease.op.dst_slot)
        got.append(_outcome(lambda s=store, le=lease: s.resume_suspended_restore(le)))
    from pagedstate.spec import SlotBusyError, SourcePinLostError

    assert got[0][0] is (SourcePinLostError if fault.startswith("no") else SlotBusyError)
    assert got[1] == got[0]


@pytest.mark.parametrize("state", ["nothing nominated", "at max_inflight"])
def test_offload_takes_read_the_clock_only_when_they_take(state: str) -> None:
    """``take_offload_stores`` reads the clock only when it will pin a nominee: with
    nothing nominated, or with ``max_inflight`` pins already out, a broken clock is never
    called and the answer is ``[]``, as in the reference."""
    from conftest import spec

    class Broken(Exception):
        pass

    def clock() -> float:
        if broken:
            raise Broken
        return 5.0

    for models in (R, I):
        broken = False
        store = models.PageUnitCheckpointStore(
            models.UnitPool(8), spec(10, 10), offload_sink=True, clock=clock
        )
        _stored(store, 1)
        if state == "at max_inflight":
            _stored(store, 2)
            assert len(store.take_offload_stores(1)) == 1
        else:
            assert len(store.take_offload_stores(1)) == 1
            assert not store.store_backlog
        broken = True
        assert store.take_offload_stores(1 if state == "at max_inflight" else 2) == []


def test_an_unpin_underflow_names_the_checkpoint_and_kind() -> None:
    """``_unpin`` of an unpinned record (unreachable through the public calls: every unpin
    follows its pin) raises PinUnderflow with the reference's message."""
    got = []
    for store in _stores():
        _stored(store, 1)
        cid = store.lookup(1)
        got.append(_outcome(lambda s=store, c=cid: s._unpin(c, "offload")))
    from pagedstate.spec import PinUnderflowError

    assert got[0][0] is PinUnderflowError
    assert got[1] == got[0]


def test_an_owner_holding_units_cannot_reserve_again() -> None:
    """G9, one reservation per owner, in both pools: the class and message match."""
    r, i = _both_pools(4)
    for pool in (r, i):
        assert pool.reserve_units(1, ("live-kv", 1)) == [0]
    got = _outcome(lambda: i.reserve_units(1, ("live-kv", 1)))
    assert got[0] is InvalidArgumentError
    assert got == _outcome(lambda: r.reserve_units(1, ("live-kv", 1)))
    assert i.num_free == 3


def test_a_clock_that_cannot_be_called_is_refused_with_the_reference_message() -> None:
    from conftest import spec

    got = [
        _outcome(lambda m=m: m.PageUnitCheckpointStore(m.UnitPool(4), spec(10, 10), clock=5))
        for m in (R, I)
    ]
    assert got[0][0] is InvalidArgumentError
    assert got[1] == got[0]


def test_a_pool_that_refuses_a_store_leaves_the_checkpoint_id_unused() -> None:
    """A pool of another class may refuse a reservation although it reported free units:
    ``begin_store`` answers None and the next store takes checkpoint id 0."""
    from conftest import spec

    class Refusing(_BarePool):
        refuse = True

        def reserve_units(self, count: int, owner: Any) -> Any:
            if self.refuse:
                return None
            return self._pool.reserve_units(count, owner)

    pool = Refusing(4)
    store = I.PageUnitCheckpointStore(pool, spec(10, 10))  # type: ignore[arg-type]
    assert store.begin_store(1, 0) is None
    pool.refuse = False
    assert store.begin_store(1, 0) is not None
    assert store.snapshot().pending == {1: 0}


# -- survivors of the full run at 3a7fbf5 (docs/mutation.md) ---------------------------------


def test_a_dedup_at_publish_does_not_stop_the_batch() -> None:
    """F.12 with a third store after the duplicate in the same batch: the duplicate is
    released and the completion goes on to publish the rest (``continue``, not ``break``)."""
    from test_impl_lockstep import _istore

    s = _istore(30)
    assert s.begin_store(101, 0) is not None
    first = s._pending_by_hash.pop(101)  # bypass the "already pending" guard
    assert s.begin_store(101, 1) is not None
    assert s.begin_store(202, 2) is not None
    s.complete_inflight()
    assert s.lookup(101) == first
    assert s.lookup(202) >= 0
    assert s.contains(202)


@pytest.mark.parametrize("protect", [None, 101, 202, 999])
def test_has_available_units_spares_exactly_the_protected_record(protect: int | None) -> None:
    """Every count around the boundary, with and without a protected READY record, agrees
    with the reference: the protected record withholds its units once, not twice."""
    from conftest import spec

    answers = []
    for mod in (I, R):
        s = mod.PageUnitCheckpointStore(mod.UnitPool(40), spec(10, 25))  # 3 units per image
        for slot, h in enumerate((101, 202, 303)):
            assert s.begin_store(h, slot) is not None
            s.complete_inflight()
        answers.append([s.has_available_units(n, protect) for n in range(45)])
    assert answers[0] == answers[1]
    free = 40 - 9
    spare = 3 - (protect in (101, 202))
    assert answers[0].index(False) == free + 3 * spare + 1


def test_a_cloned_pool_defers_its_own_callbacks() -> None:
    """A store over a cloned pool reserves inside the clone's own deferral block: cached KV
    units it overwrites fire the clone's ``on_evict`` once the record is filed, and the
    original pool is untouched."""
    fired: list[int] = []
    from conftest import spec

    pool = I.UnitPool(6, on_evict=fired.append)
    kv = pool.reserve_units(6, "kv")
    assert kv is not None
    pool.cache_units(kv, "kv", [11, 12, 13, 14, 15, 16])
    store = I.PageUnitCheckpointStore(pool, spec(10, 25))
    twin = store.clone()
    assert twin.pool is not pool
    assert twin.begin_store(101, 0) is not None
    assert fired == [11, 12, 13]
    assert pool.num_free == 6 and pool._defer == 0 and twin.pool._defer == 0
    assert store.begin_store(202, 0) is not None
    assert fired == [11, 12, 13, 11, 12, 13]


# -- coordinator survivors of a sampled run (docs/mutation.md) --------------------------------


class _Seq:
    def __init__(self, slot: int, has: bool = True) -> None:
        self.state_slot = slot
        self.has_per_req_cache = has


def test_applies_needs_both_the_switch_and_a_per_request_cache() -> None:
    from conftest import spec

    for mod in (I, R):
        for enabled in (True, False):
            c = mod.PagedStateCheckpointCoordinator(mod.UnitPool(8), spec(10, 25), enabled)
            for has in (True, False):
                assert c.applies(_Seq(0, has)) is (enabled and has), (mod.__name__, enabled, has)


def test_an_attached_tier_votes_in_resumable_hit() -> None:
    from conftest import spec

    class Tier:
        def could_serve(self, h: int) -> bool:
            return h == 7

    for mod in (I, R):
        c = mod.PagedStateCheckpointCoordinator(mod.UnitPool(8), spec(10, 25), True)
        assert c.resumable_hit(_Seq(0), 2, [5, 7]) == 0
        c.attach_offload(Tier())
        assert c.resumable_hit(_Seq(0), 2, [5, 7]) == 2
        c.attach_offload(None)
        assert c.resumable_hit(_Seq(0), 2, [5, 7]) == 0


@pytest.mark.parametrize("case", ["no_slot_first", "same_hash_twice", "ready_first", "no_room"])
def test_a_skipped_boundary_does_not_end_the_drain(case: str) -> None:
    """Every way the drain skips a pending boundary (no slot, a hash already pending or
    READY, no room) goes on to the boundaries filed after it; both stores agree."""
    from conftest import spec

    got = []
    for mod in (I, R):
        units = 3 if case == "no_room" else 30  # 3 units per image
        c = mod.PagedStateCheckpointCoordinator(mod.UnitPool(units), spec(10, 25), True)
        if case == "no_room":
            assert c.pool.reserve_units(1, "kv") is not None
        if case == "ready_first":
            c.checkpoint(_Seq(0), 1, 101)
            c.take_checkpoint_ops()
            c.complete_previous_batch()
        seqs = [_Seq(-1 if case == "no_slot_first" else 1), _Seq(2), _Seq(3)]
        hashes = [101, 101 if case == "same_hash_twice" else 202, 303]
        for s, h in zip(seqs, hashes, strict=True):
            c.checkpoint(s, 1, h)
        stores, _ = c.take_checkpoint_ops()
        got.append(([op.src_slot for op in stores], c.checkpoint_fates()))
    assert got[0] == got[1]
    slots, fates = got[0]
    want = {
        "no_slot_first": [2, 3],
        "same_hash_twice": [1, 3],
        "ready_first": [2, 3],
        "no_room": [],
    }[case]
    assert slots == want
    if case == "no_room":
        assert fates["checkpoints_dropped"] == 3


def test_a_boundary_orphaned_during_the_drain_does_not_end_it() -> None:
    """The first store of a drain overwrites the cached KV block of the second boundary's
    hash: the re-entrant ``unindex`` drops that boundary, and the drain goes on to the third
    (SPEC A.4, G5). The production store only: the reference pool caches no KV."""
    from conftest import spec

    for mod in (I,):
        pool = mod.UnitPool(12)
        c = mod.PagedStateCheckpointCoordinator(pool, spec(10, 25), True)  # 3 units per image
        pool.on_evict = c.unindex
        assert pool.reserve_units(6, "other") is not None
        kv = pool.reserve_units(6, "kv")
        assert kv is not None
        pool.cache_units(kv, "kv", [202, 900, 901, 902, 903, 904])  # 202 goes first
        for slot, h in ((1, 101), (2, 202), (3, 303)):
            c.checkpoint(_Seq(slot), 1, h)
        stores, _ = c.take_checkpoint_ops()
        assert [op.src_slot for op in stores] == [1, 3], mod.__name__
        assert c.checkpoint_fates()["checkpoints_orphaned"] == 1


def test_scratch_stores_issue_oldest_first_within_the_budget() -> None:
    """Two queued midstep scratch stores and room in the batch for one: the one queued
    first is issued, the other waits (both stores agree)."""
    from conftest import spec

    got = []
    for mod in (I, R):
        c = mod.PagedStateCheckpointCoordinator(
            mod.UnitPool(30), spec(10, 25), True, readable_midstep=True
        )
        c.attach_midstep_scratch(R.SlotPool([40, 41, 42]), 2)
        seq = _Seq(1)
        c.checkpoint(_Seq(0), 1, 100)  # takes one op of the budget of 2
        first = c.reserve_midstep(seq, [(16, 707)])
        c.publish_midstep(first)
        second = c.reserve_midstep(seq, [(32, 808)])
        c.publish_midstep(second)
        stores, _ = c.take_checkpoint_ops()
        got.append([op.src_slot for op in stores])
    assert got[0] == got[1] == [0, 40]
