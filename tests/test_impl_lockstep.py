"""Differential tests: the production store (pagedstate.impl) in lockstep with the reference
model (pagedstate.models.reference).

1. **The scenario suite, replayed on both.** Every test of ``test_scenarios_f``,
   ``test_scenarios_s``, ``test_section_g``, ``test_overlap`` (SPEC D.13, G12-G17) and
   ``test_atomicity_reference`` runs here
   again with the reference classes in its module replaced by :class:`Twin` factories: each
   pool, store, coordinator and slot pool the test builds is a pair (reference, production),
   every call runs on both, and after every call the two must agree on the return value
   (or raise the same error class), on ``snapshot()`` (or the pool's parts), and on the
   table rows taken; a call that raises must leave the production snapshot as it was
   (G8). The test's own assertions then run on the reference's answers, which equal the
   production's. Tests that reach into the reference model's private structures to bypass
   a guard cannot be replayed this way; :data:`NOT_REPLAYED` lists them with the reason,
   and the production store's version of each is tested below.
2. **Random lockstep runs.** ``random.Random(seed)`` drives both coordinators (same
   sequence objects, same clock; each its own completion token of a pair set done
   together, :class:`TokenPair`, so that one store's ``synchronize()`` cannot settle the
   other's batches) through a few thousand calls over
   a small configuration, bad inputs included, comparing every return value and snapshot
   after every call and checking the state and step invariants. The overlap calls (SPEC
   D.13) are part of it: drains with forward ids (skipping some, so that boundaries are
   dropped), boundaries and scratch stores filed with forwards, completions with
   :class:`~pagedstate.spec.ManualCompletion` tokens set done at random, the settle,
   restores begun for a sequence (G15), restores and scratch over one slot (G12), and
   ``outstanding()`` / ``is_idle()``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import test_atomicity_reference
import test_overlap
import test_scenarios_f
import test_scenarios_s
import test_section_g
from conftest import FakeClock, FakeOffload, Seq, spec
from plant_helpers import plant

from pagedstate import impl as I
from pagedstate.models import reference as R
from pagedstate.spec import (
    IllegalTransitionError,
    ManualCompletion,
    PagedStateError,
    Snapshot,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
    check_invariants,
    check_step_invariants,
)
from pagedstate.spec import tables as T

# ---------------------------------------------------------------------------------------
# The lockstep proxy
# ---------------------------------------------------------------------------------------

_REF_TYPES = (R.UnitPool, R.SlotPool, R.PageUnitCheckpointStore, R.PagedStateCheckpointCoordinator)
_PLAIN = (int, float, str, bool, tuple, frozenset, set, type(None))
_MISSING = object()


def _split(value: Any) -> tuple[Any, Any]:
    if isinstance(value, Twin):
        return value._r, value._i
    return value, value


def _split_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    pairs = [_split(a) for a in args]
    kpairs = {k: _split(v) for k, v in kwargs.items()}
    return (
        tuple(p[0] for p in pairs),
        tuple(p[1] for p in pairs),
        {k: p[0] for k, p in kpairs.items()},
        {k: p[1] for k, p in kpairs.items()},
    )


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # compared below, then re-raised
        return ("raised", exc)


def _state(obj: Any) -> Any:
    """The comparable state of a lockstep root: a snapshot, or a pool's parts."""
    if isinstance(obj, (R.PageUnitCheckpointStore, R.PagedStateCheckpointCoordinator,
                        I.PageUnitCheckpointStore, I.PagedStateCheckpointCoordinator)):
        return obj.snapshot()
    if isinstance(obj, (R.UnitPool, I.UnitPool)):
        return obj.snapshot_parts()
    return obj.free_slots


class Twin:
    """A (reference, production) pair that answers every call from both, checked equal.

    ``_box[0]`` is the pair whose state is compared after each call: a store or coordinator
    (for its pool, store and slot pool too), else the pool itself.
    """

    __slots__ = ("_r", "_i", "_box")

    def __init__(self, r: Any, i: Any, box: list[Twin] | None = None) -> None:
        object.__setattr__(self, "_r", r)
        object.__setattr__(self, "_i", i)
        object.__setattr__(self, "_box", box if box is not None else [self])

    def __repr__(self) -> str:
        return f"Twin({self._r!r})"

    @property
    def raw(self) -> Twin:
        return self

    def __getattr__(self, name: str) -> Any:
        a = getattr(self._r, name)
        b = getattr(self._i, name, _MISSING)
        if isinstance(a, _REF_TYPES):
            assert b is not _MISSING, f"production object has no {name}"
            return Twin(a, b, self._box)
        if callable(a) and not isinstance(a, type):
            assert b is not _MISSING, f"production object has no method {name}"
            return _TwinMethod(self, name)
        if b is not _MISSING and type(a) is type(b) and isinstance(a, _PLAIN):
            assert a == b, f"attribute {name}: reference {a!r} != production {b!r}"
        return a

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, _TwinMethod) and value.twin is self and value.name == name:
            # monkeypatch.undo() restoring the method it read through the proxy.
            for side in (self._r, self._i):
                side.__dict__.pop(name, None)
            return
        r, i = _split(value)
        setattr(self._r, name, r)
        setattr(self._i, name, i)

    def __delattr__(self, name: str) -> None:
        delattr(self._r, name)
        delattr(self._i, name)

    # -- checks --------------------------------------------------------------------------

    def _root(self) -> Twin:
        return self._box[0]

    def check_agree(self, where: str) -> None:
        root = self._root()
        a, b = _state(root._r), _state(root._i)
        if isinstance(a, Snapshot):
            assert a == b, f"after {where}: " + "; ".join(a.diff(b))
        else:
            assert a == b, f"after {where}: reference {a!r} != production {b!r}"
        rs = getattr(root._r, "row_sink", None)
        if rs is not None:
            assert rs == root._i.row_sink, f"after {where}: rows {rs ^ root._i.row_sink}"


class _TwinMethod:
    def __init__(self, twin: Twin, name: str) -> None:
        self.twin = twin
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        twin, name = self.twin, self.name
        ra, ia, rk, ik = _split_args(args, kwargs)
        root = twin._root()
        before_r, before_i = _state(root._r), _state(root._i)
        r_kind, r_val = _outcome(getattr(twin._r, name), ra, rk)
        i_kind, i_val = _outcome(getattr(twin._i, name), ia, ik)
        where = f"{name}{args}"
        assert r_kind == i_kind, (
            f"{where}: reference {r_kind} {r_val!r}, production {i_kind} {i_val!r}"
        )
        if r_kind == "raised":
            assert type(r_val) is type(i_val), f"{where}: raised {r_val!r} vs {i_val!r}"
            if before_r == _state(root._r):
                assert before_i == _state(root._i), f"{where}: production changed on raise"
        elif name == "clone":
            return Twin(r_val, i_val)
        else:
            assert r_val == i_val, f"{where}: reference {r_val!r} != production {i_val!r}"
        twin.check_agree(where)
        if r_kind == "raised":
            raise r_val
        return r_val


class TwinFactory:
    """Builds (reference, production) pairs in place of a reference class."""

    def __init__(self, rcls: type[Any], icls: type[Any]) -> None:
        self.rcls = rcls
        self.icls = icls

    def __call__(self, *args: Any, **kwargs: Any) -> Twin:
        if self.rcls in (R.PageUnitCheckpointStore, R.PagedStateCheckpointCoordinator):
            if kwargs.get("clock") is None:
                # Both sides must read one clock: a real monotonic clock would stamp the
                # two stores' offload pins differently.
                kwargs["clock"] = FakeClock()
        ra, ia, rk, ik = _split_args(args, kwargs)
        r_kind, r_val = _outcome(self.rcls, ra, rk)
        i_kind, i_val = _outcome(self.icls, ia, ik)
        assert r_kind == i_kind, f"{self.rcls.__name__}{args}: {r_val!r} vs {i_val!r}"
        if r_kind == "raised":
            assert type(r_val) is type(i_val), f"{r_val!r} vs {i_val!r}"
            raise r_val
        if hasattr(r_val, "row_sink"):
            r_val.row_sink = set()
            i_val.row_sink = set()
        twin = Twin(r_val, i_val)
        for a in (*args, *kwargs.values()):
            if isinstance(a, Twin) and isinstance(a._r, R.UnitPool):
                a._box[0] = twin  # the pool's state is now checked through its owner
        return twin


TwinUnitPool = TwinFactory(R.UnitPool, I.UnitPool)
TwinSlotPool = TwinFactory(R.SlotPool, I.SlotPool)
TwinStore = TwinFactory(R.PageUnitCheckpointStore, I.PageUnitCheckpointStore)
TwinCoordinator = TwinFactory(R.PagedStateCheckpointCoordinator, I.PagedStateCheckpointCoordinator)


def twin_make_store(
    num_units: int = 20,
    sp: Any = None,
    *,
    sink: bool = False,
    clock: Callable[[], float] | None = None,
    **kwargs: Any,
) -> Twin:
    """``conftest.make_store`` over both implementations."""
    return TwinStore(TwinUnitPool(num_units), sp or spec(10, 25), offload_sink=sink,
                     clock=clock, **kwargs)


def twin_make_coord(
    num_units: int = 20,
    sp: Any = None,
    *,
    enabled: bool = True,
    offload: Any = None,
    readable_midstep: bool = False,
    scratch: Any = None,
    max_ops_per_batch: int = 8,
    clock: Callable[[], float] | None = None,
    **kwargs: Any,
) -> Twin:
    """``conftest.make_coord`` over both implementations."""
    coord = TwinCoordinator(TwinUnitPool(num_units), sp or spec(10, 25), enabled,
                            offload=offload, readable_midstep=readable_midstep, clock=clock,
                            **kwargs)
    if scratch is not None:
        coord.attach_midstep_scratch(scratch, max_ops_per_batch)
    return coord


_SUBSTITUTES: dict[str, Any] = {
    "UnitPool": TwinUnitPool,
    "SlotPool": TwinSlotPool,
    "PageUnitCheckpointStore": TwinStore,
    "PagedStateCheckpointCoordinator": TwinCoordinator,
    "make_store": twin_make_store,
    "make_coord": twin_make_coord,
    "checked": lambda obj, step=True: obj,
}

SCENARIO_MODULES = {
    "f": test_scenarios_f,
    "s": test_scenarios_s,
    "g": test_section_g,
    "overlap": test_overlap,
    "atomicity": test_atomicity_reference,
}

#: Scenario tests that bypass a guard through the reference model's private structures
#: (or spy on its private methods), with what replaces them for the production store.
NOT_REPLAYED: dict[str, str] = {
    "test_scenarios_f.test_f11_restore_after_unindex_in_the_same_pass": (
        "spies on the reference's _release_record; the production run is "
        "test_impl_f11_second_record_keeps_its_pending_entry"
    ),
    "test_scenarios_f.test_f12_dedup_at_publish": (
        "pops the reference's _pending_by_hash to bypass the guard; see test_impl_f12_dedup"
    ),
    "test_scenarios_f.test_f19_the_policy_cannot_move_the_gate": (
        "installs a policy reading the reference's _lru list; see test_impl_f19_policy_swap"
    ),
    "test_scenarios_f.test_f20_a_policy_that_leaves_the_loop_short": (
        "replaces _next_victim on one object, which the proxy cannot split; see "
        "test_impl_f20_policy_short"
    ),
    "test_scenarios_f.test_f51_adopt_with_no_free_window": (
        "spies on pool.rekey_units by calling the saved method from inside the call; see "
        "test_impl_f51_no_free_window"
    ),
    "test_scenarios_f.test_f54_suspend_defensive_check_when_the_guard_is_bypassed": (
        "appends to the reference's queued-restore list; the production queue is keyed by "
        "slot, so two restores into one slot cannot be queued even by hand"
    ),
    "test_section_g.test_g11_completion_of_a_pinned_evicting_store_raises_rather_than_frees": (
        "sets a pin count on the reference's record object; see test_impl_g11_pinned_evicting"
    ),
}


def _replayed() -> Iterator[Any]:
    for short, mod in SCENARIO_MODULES.items():
        for name, fn in vars(mod).items():
            if not (name.startswith("test_") and callable(fn)):
                continue
            if f"{mod.__name__}.{name}" in NOT_REPLAYED:
                continue
            yield f"test_lockstep_{short}__{name[len('test_'):]}", fn


# Collected by pytest under new names; each still reads its own module's globals, which the
# autouse fixture below points at the twin factories for the duration of the test.
for _name, _fn in _replayed():
    globals()[_name] = _fn
w = test_atomicity_reference.w  # the atomicity tests' world fixture


@pytest.fixture(autouse=True)
def _lockstep_models(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in SCENARIO_MODULES.values():
        for name, sub in _SUBSTITUTES.items():
            if name in vars(mod):
                monkeypatch.setattr(mod, name, sub)


def test_not_replayed_names_exist() -> None:
    """The exclusion list names real tests (it cannot go stale silently)."""
    for qual in NOT_REPLAYED:
        mod_name, name = qual.split(".")
        mod = {m.__name__: m for m in SCENARIO_MODULES.values()}[mod_name]
        assert callable(getattr(mod, name, None)), qual


def test_replay_covers_the_suite() -> None:
    replayed = list(_replayed())
    total = sum(
        1
        for mod in SCENARIO_MODULES.values()
        for name, fn in vars(mod).items()
        if name.startswith("test_") and callable(fn)
    )
    assert len(replayed) + len(NOT_REPLAYED) == total
    assert len(replayed) >= 80


def test_the_twin_notices_a_disagreement() -> None:
    """A proxy that cannot fail checks nothing: break the production side on purpose."""
    s = twin_make_store(20)
    s.begin_store(101, 0)
    s._i._next_checkpoint_id += 1  # the next production record gets another id
    with pytest.raises(AssertionError, match="next_checkpoint_id|records"):
        s.begin_store(202, 0)


# ---------------------------------------------------------------------------------------
# Production versions of the scenarios that bypass reference internals
# ---------------------------------------------------------------------------------------


def _istore(n: int = 20, **kw: Any) -> I.PageUnitCheckpointStore:
    return I.PageUnitCheckpointStore(I.UnitPool(n), spec(10, 25), **kw)


def _iready(s: I.PageUnitCheckpointStore, h: int, slot: int = 0) -> int:
    assert s.begin_store(h, slot) is not None
    s.complete_inflight()
    return s.lookup(h)


def _phase(s: Any, cid: int) -> str:
    r = s.snapshot().records.get(cid)
    return "RELEASED" if r is None else r.phase


def test_impl_f11_second_record_keeps_its_pending_entry() -> None:
    s = _istore()
    s.begin_store(101, 0)
    first = s.snapshot().pending[101]
    s.unindex(101)
    assert s.begin_store(101, 1) is not None
    second = s.snapshot().pending[101]
    seen = []
    real = s._release_record

    def spy(cid: int) -> None:
        real(cid)
        seen.append((cid, dict(s._pending_by_hash)))

    s._release_record = spy  # type: ignore[method-assign]
    s.complete_inflight()
    del s._release_record
    assert seen[0] == (first, {101: second})
    assert _phase(s, first) == "RELEASED" and s.lookup(101) == second
    assert s.pool.num_free == 17
    assert check_invariants(s.snapshot()) == []


def test_impl_f12_dedup() -> None:
    s = _istore()
    op1 = s.begin_store(101, 0)
    assert op1 is not None
    first = s._pending_by_hash.pop(101)  # bypass the "already pending" guard
    op2 = s.begin_store(101, 1)
    assert op2 is not None
    second = s._pending_by_hash[101]
    s.complete_inflight()
    assert s.lookup(101) == first
    assert s.records[first].unit_ids == op1.unit_ids and second not in s.records
    assert s.pool.num_free == 17
    assert all(s.pool.is_dirty(u) for u in op2.unit_ids)
    assert check_invariants(s.snapshot()) == []


def test_impl_f19_policy_swap() -> None:
    s = _istore(9)
    cids = {h: _iready(s, h) for h in (101, 202, 303)}
    queries = [(n, p) for n in range(13) for p in (None, 101, 202, 303, 999)]
    answers = {q: s.has_available_units(*q) for q in queries}

    def newest_first() -> int:
        for cid in reversed(s._lru):
            if s._is_evictable(cid):
                return cid
        return -1

    s._next_victim = newest_first  # type: ignore[method-assign]
    assert {q: s.has_available_units(*q) for q in queries} == answers
    assert s.ensure_free_units(1) is True
    assert _phase(s, cids[303]) == "RELEASED"
    assert _phase(s, cids[101]) == _phase(s, cids[202]) == "READY"
    assert s.evictions == 1


def test_impl_f20_policy_short() -> None:
    s = _istore(9)
    for h in (101, 202, 303):
        _iready(s, h)
    s._next_victim = lambda protected=-1: -1  # type: ignore[method-assign]
    before = s.snapshot()
    assert s.begin_store(404, 0) is None
    assert s.snapshot() == before


def test_impl_f51_no_free_window() -> None:
    c = I.PagedStateCheckpointCoordinator(I.UnitPool(3), spec(10, 25), True, FakeOffload())
    owner = ("req-1", 0)
    units = c.reserve_transfer_units(owner)
    pool = c.pool
    seen = []
    real_rekey = pool.rekey_units

    def rekey_spy(*args: Any) -> None:
        seen.append(pool.num_free)
        real_rekey(*args)
        seen.append(pool.num_free)

    def release_spy(*args: Any) -> None:
        raise AssertionError("adoption must not release the units")

    pool.rekey_units = rekey_spy  # type: ignore[method-assign]
    pool.release_units = release_spy  # type: ignore[method-assign]
    assert c.adopt_transfer_units(owner, 101) is True
    del pool.rekey_units, pool.release_units
    assert seen == [0, 0] and c.pool.num_free == 0
    cid = c.store.lookup(101)
    assert c.store.records[cid].unit_ids == units
    assert c.snapshot().offload_ready == ()
    c.unindex(101)
    assert c.pool.num_free == 3


def test_impl_g11_pinned_evicting() -> None:
    s = _istore()
    s.begin_store(101, 0)
    cid = s._pending_by_hash[101]
    s.unindex(101)
    s.records[cid].pin_count = 1  # bypass
    with pytest.raises(IllegalTransitionError) as info:
        s.complete_inflight()
    assert (info.value.phase, info.value.event, info.value.guard) == (
        "EVICTING", "publish", "pinned",
    )
    assert cid in s.records


# ---------------------------------------------------------------------------------------
# Random lockstep runs
# ---------------------------------------------------------------------------------------


class _Tier:
    def could_serve(self, prefix_hash: int) -> bool:
        return prefix_hash % 3 == 0

    def stats(self) -> dict[str, int]:
        return {"loads": 1}


class TokenPair:
    """One completion token of the driver, as two :class:`ManualCompletion` tokens: the
    reference's and the production store's (``sides``). Each store gets its own, so the
    reference's ``synchronize()`` (which marks its token done) cannot settle the production
    store's batches for it; :meth:`set` marks both done."""

    def __init__(self, done: bool = False) -> None:
        self.sides = (ManualCompletion(done), ManualCompletion(done))

    def set(self) -> None:
        for token in self.sides:
            token.set()

    def __repr__(self) -> str:
        return f"TokenPair({self.sides[0].done}, {self.sides[1].done})"


def _side_args(
    args: tuple[Any, ...], kwargs: dict[str, Any], side: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` for side 0 (reference) or 1 (production): each
    :class:`TokenPair` replaced by that side's token."""

    def one(a: Any) -> Any:
        return a.sides[side] if isinstance(a, TokenPair) else a

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


class Lockstep:
    """Two coordinators (reference, production) over equal pools, driven together."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clock = FakeClock(0.0)
        self.units = rng.choice([5, 6, 8, 12, 20])
        self.upc = rng.choice([1, 2, 3])
        sp = spec(10, 10 * self.upc)
        tier = _Tier() if rng.random() < 0.7 else None
        kw: dict[str, Any] = dict(
            clock=self.clock,
            offload_backlog_cap=rng.choice([1, 2, 3, 8]),
            forfeit_bound=rng.choice([1, 2, 4]),
            change_log_size=rng.choice([4, 16, 4096]),
        )
        midstep = rng.random() < 0.7
        self.r = R.PagedStateCheckpointCoordinator(
            R.UnitPool(self.units), sp, True, tier, midstep, **kw
        )
        self.i = I.PagedStateCheckpointCoordinator(
            I.UnitPool(self.units), sp, True, tier, midstep, **kw
        )
        budget = rng.choice([0, 2, 4])
        self.r.attach_midstep_scratch(R.SlotPool([50, 51, 52]), budget)
        self.i.attach_midstep_scratch(I.SlotPool([50, 51, 52]), budget)
        self.r.row_sink, self.i.row_sink = set(), set()
        self.seqs = [Seq(k) for k in range(4)]
        self.hashes = list(range(1, 7))
        self.leases: list[SuspendedCheckpointRestore] = []
        self.ops: list[StateStoreOperationId] = []
        self.owners: list[Any] = []
        self.res: list[tuple[int, int, int]] = []
        self.kv: dict[int, list[int]] = {}
        self.tokens: list[TokenPair] = []
        self.next_owner = 0
        self.calls = 0

    def call(self, target: str, name: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        """Call ``name`` on both (``target``: "c" coordinator, "s" store, "p" pool) and
        compare everything; returns ``(kind, value)`` of the reference."""
        self.calls += 1
        objs = []
        for c in (self.r, self.i):
            objs.append({"c": c, "s": c.store, "p": c.pool}[target])
        before = self.r.snapshot()
        before_i = self.i.snapshot()
        out = [
            _outcome(getattr(o, name), *_side_args(args, kwargs, side))
            for side, o in enumerate(objs)
        ]
        (rk, rv), (ik, iv) = out
        where = f"{target}.{name}{args}{kwargs or ''}"
        assert rk == ik, f"{where}: reference {rk} {rv!r}, production {ik} {iv!r}"
        after = self.r.snapshot()
        after_i = self.i.snapshot()
        assert after == after_i, f"after {where}: " + "; ".join(after.diff(after_i))
        assert self.r.row_sink == self.i.row_sink, where
        if rk == "raised":
            assert type(rv) is type(iv), f"{where}: {rv!r} vs {iv!r}"
            assert isinstance(rv, PagedStateError), f"{where}: {rv!r}"
            assert after_i == before_i, f"{where} raised but changed the production store"
        else:
            assert rv == iv, f"{where}: reference {rv!r} != production {iv!r}"
        assert self.r.outstanding() == self.i.outstanding(), where
        assert self.r.is_idle() == self.i.is_idle(), where
        assert (self.r.last_forward, self.r.next_forward) == (
            self.i.last_forward, self.i.next_forward,
        ), where
        assert check_invariants(after_i) == [], (where, check_invariants(after_i))
        assert check_step_invariants(before, after_i) == [], where
        assert self.i.self_check() == [], (where, self.i.self_check())
        return rk, rv

    # -- the overlap arguments (SPEC D.13) -------------------------------------------------

    def _forward(self) -> int | None:
        """A drain's forward id: mostly none (``next_forward``), sometimes skipping ids."""
        r = self.rng.random()
        if r < 0.5:
            return None
        return self.i.next_forward + (0 if r < 0.8 else self.rng.randrange(1, 3))

    def _boundary_forward(self) -> int | None:
        """A boundary's or scratch store's forward id: none, the latest drained forward, one
        to come, or (rarely, for a boundary) an older one."""
        r = self.rng.random()
        last = self.i.last_forward
        if r < 0.4:
            return None
        if r < 0.6 and last is not None:
            return last
        if r < 0.95:
            return self.i.next_forward + self.rng.randrange(2)
        return max(0, (last or 0) - 1)

    def _token(self) -> TokenPair | None:
        """A completion token for a completion: none, a fresh pair (sometimes done at once)."""
        if self.rng.random() < 0.4:
            return None
        token = TokenPair(done=self.rng.random() < 0.2)
        self.tokens.append(token)
        return token

    def _restore_slot(self) -> int:
        """A restore destination: a request slot, now and then a scratch slot (G12)."""
        return self.rng.choice([50, 51, 52]) if self.rng.random() < 0.1 else self.rng.randrange(6)

    def step(self) -> None:
        rng, h, s = self.rng, self.rng.choice(self.hashes), self.rng.choice(self.seqs)
        k = rng.randrange(46)
        if k == 0:
            fwd = self._forward()
            self.call("c", "take_checkpoint_ops", **({} if fwd is None else {"forward": fwd}))
        elif k == 1:
            token = self._token()
            self.call("c", "complete_previous_batch", *(() if token is None else (token,)))
        elif k in (2, 3):
            fwd = self._boundary_forward()
            kw: dict[str, Any] = {} if fwd is None else {"forward": fwd}
            if rng.random() < 0.3:
                kw["computed_blocks"] = rng.randrange(4)
            self.call("c", "checkpoint", s, rng.choice([1, 1, 2]), h, **kw)
        elif k == 4:
            self.call("c", "forget_pending", s)
        elif k in (5, 36):
            if rng.random() < 0.5:
                self.call("c", "begin_restore", h, self._restore_slot(), seq=s)
            else:
                self.call("c", "begin_restore", h, self._restore_slot())
        elif k == 6:
            queued = [op.dst_slot for _, op in self.r.store._queued_restores]
            slot = rng.choice(queued) if queued and rng.random() < 0.8 else rng.randrange(6)
            kind, v = self.call("c", "suspend_queued_restore", slot)
            if kind == "ok" and v is not None:
                self.leases.append(v)
        elif k == 7 and self.leases:
            name = rng.choice(["resume_suspended_restore", "release_suspended_restore"])
            lease = rng.choice(self.leases)
            kind, _ = self.call("c", name, lease)
            if kind == "ok" and rng.random() < 0.8:
                self.leases.remove(lease)  # mostly forget spent leases; some are reused (G3)
        elif k == 8:
            self.call("c", "unindex", h)
        elif k == 9 and rng.random() < 0.2:
            self.call("c", "clear_index")
        elif k == 10:
            o = rng.randrange(3)
            if o in self.kv and rng.random() < 0.8:
                self.call("p", "release_units", self.kv.pop(o), ("live-kv", o))
            elif o in self.kv:
                self.call("p", "release_units", self.kv[o][:1], ("live-kv", o))  # G9: refused
            else:
                n = rng.randrange(1, 3)
                self.call("c", "ensure_free_units", n)
                kind, v = self.call("p", "reserve_units", n, ("live-kv", o))
                if v:
                    self.kv[o] = v
        elif k == 11:
            kind, v = self.call("c", "take_offload_stores", rng.randrange(4))
            if kind == "ok":
                self.ops.extend(op for op, _ in v)
        elif k == 12:
            lim = rng.choice([None, 1, 3])
            kind, v = self.call("c", "acquire_checkpoint_source", h, max_inflight=lim)
            if kind == "ok" and v:
                self.ops.append(v[0])
        elif k == 13 and self.ops:
            self.call("c", "release_offload_store_source", rng.choice(self.ops))
        elif k == 14 and self.ops:
            self.call("c", "settle_offload_store", rng.choice(self.ops))
        elif k == 15:
            self.clock.advance(rng.choice([0.5, 5.0, 20.0]))
        elif k == 16:
            self.call("c", "reclaim_stale_offload_pins", rng.choice([0, 1, 10, 100, -1, 0.5]))
        elif k == 17 and self.ops:
            self.call("c", "was_reclaimed", rng.choice(self.ops))
        elif k == 18:
            owner = ("load", self.next_owner)
            self.next_owner += 1
            kind, v = self.call("c", "reserve_transfer_units", owner)
            if kind == "ok" and v:
                self.owners.append(owner)
        elif k == 19 and self.owners:
            self.call("c", "release_transfer_units", rng.choice(self.owners))
        elif k == 20 and self.owners:
            self.call("c", "adopt_transfer_units", rng.choice(self.owners), h)
        elif k == 21:
            pos = [(j, rng.choice(self.hashes)) for j in range(rng.randrange(1, 3))]
            kind, v = self.call("c", "reserve_midstep", s, pos)
            if kind == "ok":
                self.res.extend(v)
        elif k == 22 and self.res:
            x = self.res.pop(rng.randrange(len(self.res)))
            self.call("c", rng.choice(["publish_midstep", "cancel_midstep"]), [x])
        elif k == 23:
            self.call("c", "has_available_units", rng.randrange(self.units + 4),
                      rng.choice([None, *self.hashes]))
        elif k == 24:
            self.call("c", "ensure_free_units", rng.randrange(self.units + 2))
        elif k == 25:
            blocks = [rng.choice(self.hashes) for _ in range(3)]
            self.call("c", "resumable_hit", s, rng.randrange(4), blocks, rng.random() < 0.2)
        elif k == 26:
            self.call("c", "checkpoint_fates")
        elif k == 27:
            self.call("c", "restore_queued_for", rng.randrange(6))
        elif k == 28:
            self.call("s", "changed_since", rng.randrange(self.r.store.generation + 2))
        elif k == 29:
            s.state_slot = rng.choice([s.state_slot, -1, self.seqs.index(s)])
        elif k == 30:
            self.call("s", "begin_store", h, rng.randrange(4))
        elif k == 31:
            self.call("s", "complete_inflight")
        elif k == 32:
            self.call("s", "take_restore_ops")
        elif k == 33:
            self.call("s", rng.choice(["lookup", "contains", "contains_or_pending"]), h)
        elif k == 34:
            self._bad_input()
        elif k == 35:
            self.call("c", "has_offload_pins")
        elif k in (37, 38):
            if self.tokens:
                token = rng.choice(self.tokens)
                token.set()
                if rng.random() < 0.5:
                    self.tokens.remove(token)
        elif k == 39:
            self.call("c", "settle_completions", rng.random() < 0.2)
        elif k == 40:
            self.call("s", "settle_completions", wait=rng.random() < 0.2)
        elif k == 41:
            token = self._token()
            self.call("s", "complete_inflight", *(() if token is None else (token,)))
        elif k == 42 and self.res:
            x = self.res.pop(rng.randrange(len(self.res)))
            fwd = self._boundary_forward()
            self.call("c", "publish_midstep", [x], **({} if fwd is None else {"forward": fwd}))
        elif k == 43:
            self.call("c", rng.choice(["outstanding", "is_idle"]))
        elif k == 44:
            self.call("s", "outstanding")
        elif k == 45:
            self._bad_overlap_input()

    def _bad_input(self) -> None:
        rng = self.rng
        h = rng.choice(self.hashes)
        cases: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = [
            ("s", "begin_store", (str(h), 0), {}),
            ("s", "begin_store", (h, -1), {}),
            ("c", "begin_restore", (h, True), {}),
            ("c", "checkpoint", (self.seqs[0], -1, h), {}),
            ("c", "unindex", (float(h),), {}),
            ("c", "has_available_units", (-1,), {}),
            ("c", "reclaim_stale_offload_pins", (math.nan,), {}),
            ("c", "take_offload_stores", (-2,), {}),
            ("c", "acquire_checkpoint_source", (h,), {"max_inflight": "1"}),
            ("c", "settle_offload_store", ((h, 1),), {}),
            ("c", "reserve_transfer_units", (None,), {}),
            ("c", "reserve_midstep", (self.seqs[0], [(0,)]), {}),
            ("c", "publish_midstep", ([(99, 0, h)],), {}),
            ("c", "resumable_hit", (self.seqs[0], 5, [h]), {}),
            ("p", "reserve_units", (-1, ("x", 0)), {}),
            ("p", "release_units", ([0, 0], ("x", 0)), {}),
            ("p", "rekey_units", ([0], ("x", 0), None), {}),
            ("p", "mark_clean", ([self.units],), {}),
        ]
        if self.leases:
            lease = rng.choice(self.leases)
            cases.append(("c", "resume_suspended_restore",
                          (SuspendedCheckpointRestore(lease.checkpoint_id, lease.op, 10**6),), {}))
        if self.owners:
            cases.append(("c", "adopt_transfer_units", (self.owners[0], "h"), {}))
        target, name, args, kwargs = rng.choice(cases)
        self.call(target, name, *args, **kwargs)

    def _bad_overlap_input(self) -> None:
        """Refused overlap calls (SPEC D.13, G12, G13, G15): each raises, nothing changed."""
        rng = self.rng
        h = rng.choice(self.hashes)
        seq = rng.choice(self.seqs)
        last = self.i.last_forward
        cases: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = [
            ("c", "checkpoint", (seq, 0, h), {}),
            ("c", "checkpoint", (seq, 3, h), {"computed_blocks": 2}),
            ("c", "checkpoint", (seq, 1, h), {"computed_blocks": -1}),
            ("c", "checkpoint", (seq, 1, h), {"forward": -1}),
            ("c", "checkpoint", (seq, 1, h), {"forward": "3"}),
            ("c", "checkpoint", (seq, 1, h), {"forward": True}),
            ("c", "take_checkpoint_ops", (), {"forward": -1}),
            ("c", "take_checkpoint_ops", (), {"forward": 1.5}),
            ("c", "complete_previous_batch", (5,), {}),
            ("s", "complete_inflight", (object(),), {}),
            ("c", "publish_midstep", ([],), {"forward": -2}),
            ("c", "begin_restore", (h, 0), {"seq": 5}),
        ]
        if last is not None:
            cases.append(("c", "take_checkpoint_ops", (), {"forward": last}))
            if last > 0:
                cases.append(("c", "checkpoint", (seq, 1, h), {"forward": last - 1}))  # stale
        target, name, args, kwargs = rng.choice(cases)
        self.call(target, name, *args, **kwargs)


SEEDS = range(12)
_RUNS: dict[int, Lockstep] = {}


def _run(seed: int) -> Lockstep:
    if seed not in _RUNS:
        ls = Lockstep(random.Random(seed))
        for _ in range(2500):
            ls.step()
        _RUNS[seed] = ls
    return _RUNS[seed]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_lockstep(seed: int) -> None:
    ls = _run(seed)
    assert ls.calls > 1500
    assert ls.r.checkpoint_fates() == ls.i.checkpoint_fates()


def test_random_lockstep_takes_most_rows() -> None:
    """The random runs are not vacuous: together they take nearly every reachable row."""
    rows: set[tuple[str, int]] = set()
    for seed in SEEDS:
        rows |= _run(seed).i.row_sink or set()
    reachable = {
        (t.machine, i) for t in T.TABLES.values() for i, row in enumerate(t.rows)
        if not row.defensive
    }
    assert len(rows & reachable) >= len(reachable) - 2, sorted(reachable - rows)


def test_replayed_modules_build_twins() -> None:
    """Inside this module's tests, the scenario modules build lockstep pairs."""
    assert isinstance(test_scenarios_f.make_store(), Twin)
    assert isinstance(test_section_g.UnitPool(3), Twin)
    c = test_atomicity_reference.PagedStateCheckpointCoordinator(
        test_atomicity_reference.UnitPool(4), spec(10, 25), True
    )
    assert isinstance(c, Twin) and isinstance(c.raw._i, I.PagedStateCheckpointCoordinator)


# ---------------------------------------------------------------------------------------
# Hooks and imports
# ---------------------------------------------------------------------------------------


def test_on_transition_reports_every_applied_row_after_its_effects() -> None:
    """The hook sees exactly the rows the row sink records, each once its effects are
    applied: a record row's subject is already in the row's next phase (or released)."""
    seen: set[tuple[str, int]] = set()
    calls = 0

    def run(seed: int) -> Lockstep:
        nonlocal calls
        ls = Lockstep(random.Random(seed))
        store = ls.i.store

        def hook(machine: str, row: T.Row, subject: object) -> None:
            nonlocal calls
            calls += 1
            table = T.TABLES[machine]
            seen.add((machine, table.row_id(row)))
            if machine == "record":
                assert isinstance(subject, int)
                rec = store.records.get(subject)
                if row.next == T.RELEASED:
                    assert rec is None
                else:
                    assert rec is not None and rec.phase == row.next
            elif machine == "offload":
                assert isinstance(subject, StateStoreOperationId)
                if row.next in (T.PINNED, T.SOURCE_RELEASED):
                    pin = store._offload_pins[subject]
                    assert pin.source_released == (row.next == T.SOURCE_RELEASED)
                else:
                    assert subject not in store._offload_pins
            elif machine == "restore":
                assert isinstance(subject, tuple) and len(subject) == 2
            elif machine in ("lease", "scratch"):
                assert isinstance(subject, int)

        ls.i.on_transition = hook
        assert store.on_transition is hook
        for _ in range(1500):
            ls.step()
        return ls

    sinks: set[tuple[str, int]] = set()
    for seed in (1, 2, 3):
        sinks |= run(seed).i.row_sink or set()
    assert seen == sinks and calls > len(seen)


def test_impl_imports_only_the_spec() -> None:
    import ast
    import os

    root = os.path.dirname(os.path.abspath(I.__file__))
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(root, name)).read())
        for node in ast.walk(tree):
            mods: list[str] = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            for mod in mods:
                if mod.startswith("pagedstate"):
                    assert mod.startswith("pagedstate.spec"), f"{name} imports {mod}"


def test_each_store_gets_its_own_completion_token() -> None:
    """A production settle that synchronizes only the oldest outstanding token on
    ``wait=True`` (a planted bug) is caught by the random lockstep: with one token object
    shared by both stores the reference's ``synchronize()`` would mark the production
    store's tokens done first and hide it."""
    for seed in range(60):
        ls = Lockstep(random.Random(seed))
        plant(
            ls.i.store,
            "settle_completions",
            "for token, _cids in list(self._completions):",
            "for token, _cids in self._completions[:1]:",
        )
        try:
            for _ in range(600):
                ls.step()
        except AssertionError:
            return
    raise AssertionError("the planted settle bug was not caught")
