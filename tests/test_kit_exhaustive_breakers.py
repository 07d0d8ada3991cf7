"""Breakers for the kit's exhaustive mode (``run_exhaustive``) and the explorer's symmetry
reduction (an adversarial review, 2026-12).

Sections 1-7 are the holes the review found, each now closed: a planted bug in a store under
test that ``run_exhaustive`` must catch in a small configuration (answers of calls whose
result the world drops, read-only queries, answers of the wrong type, state hidden behind a
refusal, writes to the shared sequences, a snapshot class that equals everything), or a bad
input that must be refused up front with a specific error. The tests after them are holes
that were tried and held. The review also found the parallel explorer missing goals that
are invisible to the state key (the last test).
"""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from pagedstate import impl as I
from pagedstate.engines.conformance import ConformanceFailure, run_exhaustive, run_exhaustive_plan
from pagedstate.models.explorer import CONFIGS, explore, explore_parallel
from pagedstate.models.reference import PagedStateCheckpointCoordinator as Ref
from pagedstate.models.world import World, _key, seq
from pagedstate.spec.errors import InvalidArgumentError, PagedStateError, SlotBusyError
from pagedstate.spec.snapshot import Snapshot

#: ``tiny`` to depth 5: 1,615 states, well under a second per run.
T5 = attrs.evolve(CONFIGS["tiny"], name="tiny-5", max_depth=5)


def _run(factory: Any, pool_factory: Any = None, cfg: Any = T5, **kw: Any) -> Any:
    return run_exhaustive(factory, pool_factory, config=cfg, progress=None, **kw)


# =========================================================================================
# 1. Results the follower never compares. ``World._a_<name>`` returns the coordinator's
# answer only for drain, drain_skip, begin_restore, restore_scratch, settle_completions and
# settle_wait; every other action returns None on both sides, so ``r != s`` never sees the
# store's answer. Each store below differs observably within 5 calls of the start (a
# follower comparing every call's answer finds each one at depth <= 5; the lockstep run
# finds each at once).
# =========================================================================================


class _WasReclaimedLies(Ref):
    def was_reclaimed(self, op: Any) -> bool:
        return not super().was_reclaimed(op)


class _TakeOffloadWithoutUnits(Ref):
    def take_offload_stores(self, max_inflight: Any) -> Any:
        return [(op, ()) for op, _units in super().take_offload_stores(max_inflight)]


class _AcquireWithoutUnits(Ref):
    def acquire_checkpoint_source(self, prefix_hash: int, *, max_inflight: Any = None) -> Any:
        got = super().acquire_checkpoint_source(prefix_hash, max_inflight=max_inflight)
        return None if got is None else (got[0], ())


class _TransferWrongUnits(Ref):
    def reserve_transfer_units(self, owner: Any) -> Any:
        got = super().reserve_transfer_units(owner)
        return None if got is None else (*reversed(got), 99)


class _ReclaimCountLies(Ref):
    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        return super().reclaim_stale_offload_pins(timeout_s) + 1


class _AdoptAnswerLies(Ref):
    def adopt_transfer_units(self, owner: Any, prefix_hash: int) -> bool:
        return not super().adopt_transfer_units(owner, prefix_hash)


class _EnsureFreeLies(Ref):
    def ensure_free_units(self, count: int) -> bool:
        super().ensure_free_units(count)
        return True


class _ClearIndexReturnsSomething(Ref):
    def clear_index(self) -> Any:
        super().clear_index()
        return "cleared"


UNCOMPARED_RESULTS = [
    _WasReclaimedLies,  # [reserve_transfer, adopt(0, 1), acquire(1), settle(0)]
    _TakeOffloadWithoutUnits,  # [checkpoint(0, 1), drain, complete, take_offload]
    _AcquireWithoutUnits,  # [reserve_transfer, adopt(0, 1), acquire(1)]
    _TransferWrongUnits,  # [reserve_transfer]
    _ReclaimCountLies,  # [reserve_transfer, adopt(0, 1), acquire(1), reclaim]
    _AdoptAnswerLies,  # [reserve_transfer, adopt(0, 1)]
    _EnsureFreeLies,  # [checkpoint(0,1), checkpoint(1,2), drain, reserve_transfer, kv_alloc(0)]
    _ClearIndexReturnsSomething,  # [checkpoint(0, 1), clear]
]


@pytest.mark.parametrize("store", UNCOMPARED_RESULTS, ids=lambda c: c.__name__)
def test_a_wrong_answer_of_an_action_whose_result_is_dropped_is_caught(store: Any) -> None:
    with pytest.raises(ConformanceFailure):
        _run(store)


# =========================================================================================
# 2. Read-only queries are never asked (the lockstep run sweeps them after every step).
# =========================================================================================


class _ContainsLies(Ref):
    def contains(self, h: int) -> bool:
        return False


class _IsIdleLies(Ref):
    def is_idle(self) -> bool:
        return True


class _RestoreQueuedForLies(Ref):
    def restore_queued_for(self, dst_slot: int) -> bool:
        return False


class _HasAvailableUnitsLies(Ref):
    def has_available_units(self, count: int, protected_hash: int | None = None) -> bool:
        return True


@pytest.mark.parametrize(
    "store",
    [_ContainsLies, _IsIdleLies, _RestoreQueuedForLies, _HasAvailableUnitsLies],
    ids=lambda c: c.__name__,
)
def test_a_query_that_lies_is_caught(store: Any) -> None:
    with pytest.raises(ConformanceFailure):
        _run(store)


# =========================================================================================
# 3. Values that compare equal but are of another type (1 for True, 1.0 for 1).
# =========================================================================================


class _BeginRestoreAnswersInt(Ref):
    def begin_restore(self, *args: Any, **kwargs: Any) -> Any:
        return int(super().begin_restore(*args, **kwargs))


class _SettleAnswersFloat(Ref):
    def settle_completions(self, wait: bool = False) -> Any:
        return float(super().settle_completions(wait))


@pytest.mark.parametrize(
    "store", [_BeginRestoreAnswersInt, _SettleAnswersFloat], ids=lambda c: c.__name__
)
def test_an_answer_of_the_wrong_type_is_caught(store: Any) -> None:
    with pytest.raises(ConformanceFailure):
        _run(store)


# =========================================================================================
# 4. A refused call is never followed: the copy that took it is dropped, so hidden state a
# refusal leaves behind (G8 holds for the snapshot) is never exercised, at any depth.
# The store below differs at depth 5: [reserve_transfer, adopt(0, 1), begin_restore(0, 1),
# begin_restore(0, 1) (refused: SlotBusyError), begin_restore(1, 1) (False, not True)].
# =========================================================================================


class _PoisonedByARefusedRestore(Ref):
    poisoned = False

    def begin_restore(self, h: int, dst_slot: int, *, seq: Any = None) -> bool:
        try:
            ok = super().begin_restore(h, dst_slot, seq=seq)
        except PagedStateError:
            self.poisoned = True
            raise
        return False if self.poisoned else ok


def test_the_poisoned_store_really_differs_at_depth_5() -> None:
    sut = T5.build(_PoisonedByARefusedRestore)
    for name, args in [("reserve_transfer", ()), ("adopt", (0, 1)), ("begin_restore", (0, 1))]:
        sut.act(name, *args)
    with pytest.raises(SlotBusyError):
        sut.act("begin_restore", 0, 1)
    ref = T5.build()
    for name, args in [("reserve_transfer", ()), ("adopt", (0, 1)), ("begin_restore", (0, 1))]:
        ref.act(name, *args)
    assert ref.act("begin_restore", 1, 1) is True
    assert sut.act("begin_restore", 1, 1) is False


def test_hidden_state_left_by_a_refused_call_is_caught() -> None:
    with pytest.raises(ConformanceFailure):
        _run(_PoisonedByARefusedRestore)


# =========================================================================================
# 5. The kit's own objects: the sequences are process-wide (``models.world.seq``) and shared
# by the reference world, every follower copy and every later World in the process. A
# store that writes one (here: forget_pending switches checkpointing off for the request
# for good) makes the reference do the same, so nothing differs, and the change outlives
# the run (a later ``explore(tiny, depth 5)`` in the same process finds 191 states, not
# 1,615). The lockstep run misses it too (both sides share its KitSeq objects).
# =========================================================================================


class _WritesTheSequence(Ref):
    def forget_pending(self, s: Any) -> None:
        super().forget_pending(s)
        s.has_per_req_cache = False


@pytest.fixture
def restore_seqs() -> Iterator[None]:
    seqs = [seq(i, i) for i in range(4)]
    saved = [(s.state_slot, s.has_per_req_cache) for s in seqs]
    try:
        yield
    finally:
        for s, (slot, cache) in zip(seqs, saved, strict=True):
            s.state_slot, s.has_per_req_cache = slot, cache


@pytest.mark.usefixtures("restore_seqs")
def test_a_store_writing_the_shared_sequences_is_caught() -> None:
    with pytest.raises(ConformanceFailure):
        _run(_WritesTheSequence)


@pytest.mark.usefixtures("restore_seqs")
def test_a_run_leaves_the_process_wide_sequences_as_they_were() -> None:
    try:
        _run(_WritesTheSequence)
    except ConformanceFailure:
        pass
    assert all(seq(i, i).has_per_req_cache for i in range(2))


# =========================================================================================
# 6. A snapshot of a Snapshot subclass that equals everything: every snapshot comparison
# (results, G8, the initial check) passes, whatever the store's state.
# =========================================================================================


class _AgreeableSnapshot(Snapshot):
    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


class _LiesWithAnAgreeableSnapshot(Ref):
    """Reports no dirty unit ever (a state bug), in a snapshot that equals anything."""

    def snapshot(self) -> Any:
        s = super().snapshot()
        fields = {a.name: getattr(s, a.name) for a in attrs.fields(Snapshot)}
        fields["dirty"] = frozenset()
        return _AgreeableSnapshot(**fields)


def test_a_snapshot_that_equals_everything_is_refused() -> None:
    with pytest.raises((ConformanceFailure, TypeError)):
        _run(_LiesWithAnAgreeableSnapshot)


# =========================================================================================
# 7. Bad inputs: a specific error, before any store is built.
# =========================================================================================


@pytest.mark.parametrize("config", [5, None, ["tiny"], {"name": "tiny"}])
def test_a_config_of_the_wrong_type_is_refused_specifically(config: Any) -> None:
    with pytest.raises((TypeError, ValueError, KeyError)):
        run_exhaustive(I.PagedStateCheckpointCoordinator, config=config, progress=None)


def test_no_factory_is_refused() -> None:
    # factory=None silently runs the reference against itself and "passes"
    with pytest.raises((TypeError, ValueError)):
        run_exhaustive(None, config=T5, max_states=10, progress=None)  # type: ignore[arg-type]


class _NoClone:
    """A store under test without clone(): the reference behind a delegating wrapper."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._c = Ref(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "clone":
            raise AttributeError(name)
        return getattr(self._c, name)


def test_mode_clone_without_a_clone_method_is_refused_up_front() -> None:
    # (was: a bare AttributeError from the middle of the search)
    with pytest.raises(ValueError, match="clone"):
        _run(_NoClone, mode="clone")


def test_progress_that_is_not_callable_is_refused_before_the_search() -> None:
    built: list[int] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return Ref(*args, **kwargs)

    with pytest.raises((TypeError, ValueError)):
        run_exhaustive(factory, config=T5, max_states=20, progress="x")  # type: ignore[arg-type]
    assert built == []  # (was: the whole search ran first)


def test_a_bad_plan_entry_is_refused_before_any_configuration_runs() -> None:
    built: list[int] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return Ref(*args, **kwargs)

    with pytest.raises(ValueError):
        run_exhaustive_plan(factory, plan=((T5, 3), (T5, 0)), progress=None)
    assert built == []  # (was: the first entry ran to completion first)


# =========================================================================================
# What held.
# =========================================================================================


def test_bad_numbers_are_refused_before_any_store_is_built() -> None:
    built: list[int] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return Ref(*args, **kwargs)

    for kw in (
        {"max_depth": -1},
        {"max_depth": "3"},
        {"max_states": 2.0},
        {"progress_every_s": float("nan")},
        {"progress_every_s": "1"},
        {"mode": None},
        {"mode": ["clone"]},
    ):
        with pytest.raises(ValueError):
            _run(factory, **kw)
    assert built == []


class _DeepCopyClone(Ref):
    def clone(self) -> Any:
        return copy.deepcopy(self)  # copies the kit's tokens and clock too: still correct


def test_a_deepcopy_clone_passes() -> None:
    assert _run(_DeepCopyClone, mode="clone").distinct == 1615


def test_a_store_without_clone_runs_in_replay_mode_and_passes() -> None:
    report = _run(_NoClone, cfg=attrs.evolve(T5, max_depth=4))
    assert report.mode == "replay"


def _sharing(where: str, name: str) -> type:
    def clone(self: Any) -> Any:
        c = Ref.clone(self)
        pick = {"coord": lambda x: x, "store": lambda x: x.store, "pool": lambda x: x.store.pool}
        setattr(pick[where](c), name, getattr(pick[where](self), name))
        return c

    return type(f"_Shares_{where}_{name}", (Ref,), {"clone": clone})


@pytest.mark.parametrize(
    ("where", "name"),
    [
        ("coord", "_transfer_units"),
        ("coord", "_scratch_reserved"),
        ("coord", "_scratch"),
        ("store", "_offload_pins"),
        ("store", "_suspended"),
        ("store", "_changes"),
        ("pool", "_dirty"),
        ("pool", "_tags"),
    ],
)
def test_a_clone_sharing_a_mutable_structure_is_caught(where: str, name: str) -> None:
    # every harmful sharing of the reference's structures tried was caught on tiny (depth
    # 6) or overlap (depth 5); the misses were harmless sharing (lists the store rebinds
    # before changing: _completions, _restore_owners; overlap-only maps on tiny)
    with pytest.raises(ConformanceFailure):
        _run(_sharing(where, name), mode="clone", cfg=attrs.evolve(T5, max_depth=6))


class _WrongRefusalClass(Ref):
    def begin_restore(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().begin_restore(*args, **kwargs)
        except SlotBusyError as exc:
            raise InvalidArgumentError(str(exc)) from None


class _RaisesValueError(Ref):
    def release_transfer_units(self, owner: Any) -> None:
        if owner not in self._transfer_units:
            raise ValueError(owner)
        super().release_transfer_units(owner)


def test_a_refusal_of_another_class_is_caught() -> None:
    with pytest.raises(ConformanceFailure, match="SlotBusyError.*InvalidArgumentError"):
        _run(_WrongRefusalClass, cfg=attrs.evolve(T5, max_depth=6))


def test_a_non_paged_state_error_is_a_crash() -> None:
    with pytest.raises(ConformanceFailure, match="crashed.*ValueError"):
        _run(_RaisesValueError)


class _SynchronizesTokens(Ref):
    """Waits for the batch's token inside complete_previous_batch (only
    settle_completions(wait=True) may): the token is then done in the follower only."""

    def complete_previous_batch(self, completion: Any = None) -> None:
        super().complete_previous_batch(completion)
        if completion is not None:
            completion.synchronize()


def test_a_store_that_synchronizes_a_token_is_caught() -> None:
    with pytest.raises(ConformanceFailure):
        _run(_SynchronizesTokens)


class _AsymmetricRestore(Ref):
    """Reads slot numbers: a restore into slot 0 is refused while sequence 1, and only it,
    has a pending boundary."""

    def begin_restore(self, h: int, dst_slot: int, *args: Any, **kwargs: Any) -> bool:
        if dst_slot == 0 and {s.state_slot for s, _h in self._pending.values()} == {1}:
            return False
        return super().begin_restore(h, dst_slot, *args, **kwargs)


def test_an_asymmetric_store_is_caught_without_symmetry() -> None:
    # with symmetry it would pass (1,045 states): run_exhaustive refuses such a Config
    with pytest.raises(ConformanceFailure, match=r"begin_restore', \(0, 1\)"):
        _run(_AsymmetricRestore)
    built: list[int] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return _AsymmetricRestore(*args, **kwargs)

    with pytest.raises(ValueError, match="symmetry"):
        _run(factory, cfg=attrs.evolve(T5, symmetry=True))
    assert built == []


# -- symmetry ------------------------------------------------------------------------------

# The same sequence-naming actions and level-by-level search as tests/test_symmetry.py.
from test_symmetry import SEQ_ACTIONS  # noqa: E402
from test_symmetry import _states as _all_states  # noqa: E402


def test_three_sequences_every_permutation_reaches_its_image() -> None:
    """tests/test_symmetry.py swaps two sequences only; with three, symmetric_key ranges
    over all six permutations: each renamed trace must reach the renamed state."""
    cfg = attrs.evolve(CONFIGS["tiny"], seqs=3, units=4)
    perms = list(itertools.permutations(range(3)))[1:]
    checked = 0
    for w, trace in _all_states(cfg, 3):
        for p in perms:
            m = cfg.build()
            for name, args in trace:
                m.act(name, *((p[args[0]], *args[1:]) if name in SEQ_ACTIONS else args))
            assert m.key() == _key(w, p), (p, trace)
            assert m.symmetric_key() == w.symmetric_key(), (p, trace)
            checked += 1
    assert checked > 500


@pytest.mark.parametrize(("name", "depth", "extra"), [("tiny", 4, {}), ("overlap", 4, {})])
def test_states_with_one_symmetric_key_are_isomorphic_and_behave_alike(
    name: str, depth: int, extra: dict[str, Any]
) -> None:
    """The converse the mirror test does not check: two states with one symmetric key are
    one state up to a renaming of the sequences (plain keys equal under some permutation),
    and their successors fall into the same classes, refusals included."""
    cfg = attrs.evolve(CONFIGS[name], **extra)
    perms = list(itertools.permutations(range(cfg.seqs)))
    groups: dict[Any, list[World]] = defaultdict(list)
    for w, _trace in _all_states(cfg, depth):
        groups[w.symmetric_key()].append(w)

    def successors(w: World) -> set[Any]:
        out: set[Any] = set()
        for action in w.actions():
            n = w.clone()
            try:
                n.act(action[0], *action[1])
            except PagedStateError as exc:
                out.add(("refused", type(exc).__name__))
                continue
            out.add(n.symmetric_key())
        return out

    merged = 0
    for ws in groups.values():
        for w in ws[1:]:
            assert any(_key(ws[0]) == _key(w, p) for p in perms)
            assert successors(w) == successors(ws[0])
            merged += 1
    assert merged > 100


def test_the_parallel_explorer_with_symmetry_counts_as_the_serial_one() -> None:
    cfg = attrs.evolve(CONFIGS["tiny"], symmetry=True, max_depth=6)
    serial = explore(cfg)
    parallel = explore_parallel(cfg, workers=2)
    for field in ("generated", "distinct", "depth", "at_depth_bound", "queued", "rejected"):
        assert getattr(serial, field) == getattr(parallel, field), field
    assert serial.rows_hit == parallel.rows_hit
    assert set(serial.goals_met) == set(parallel.goals_met)
    assert serial.violation is None and parallel.violation is None


# -- what the failures say ------------------------------------------------------------------


def test_a_wrong_answer_inside_an_action_names_the_call_and_both_answers() -> None:
    # World._a_reserve_transfer drops reserve_transfer_units' answer; the log has it
    with pytest.raises(ConformanceFailure) as info:
        _run(_TransferWrongUnits)
    msg = str(info.value)
    # tiny has one unit per image
    assert "call 1 of the action differs: the reference's reserve_transfer_units ok (0,)" in msg
    assert "the store under test's reserve_transfer_units ok (0, 99)" in msg
    assert "after the trace [('reserve_transfer', ())]" in msg


def test_an_answer_of_the_wrong_type_reads_differently_in_the_message() -> None:
    wanted = r"the reference ok 1, the store under test ok 1\.0$"
    with pytest.raises(ConformanceFailure, match=wanted):
        _run(_SettleAnswersFloat)


def test_a_lying_query_is_named_in_the_message() -> None:
    with pytest.raises(ConformanceFailure, match=r"restore_queued_for\(\d\) answers differ"):
        _run(_RestoreQueuedForLies)


# =========================================================================================
# A second review (helper-33): holes found after the first fixes, each now closed.
# =========================================================================================


class _WritesTheSequenceInSnapshot(Ref):
    """Writes a sequence from snapshot(), outside any action."""

    def snapshot(self) -> Any:
        for s, _h in self._pending.values():
            s.has_per_req_cache = False
        return super().snapshot()


@pytest.mark.usefixtures("restore_seqs")
def test_a_sequence_written_outside_an_action_is_caught_and_undone() -> None:
    with pytest.raises(ConformanceFailure, match="wrote a sequence"):
        _run(_WritesTheSequenceInSnapshot)
    assert all(seq(i, i).has_per_req_cache for i in range(2))


class _FloatBytesInOps(Ref):
    def take_checkpoint_ops(self, **kw: Any) -> Any:
        stores, restores = super().take_checkpoint_ops(**kw)
        return tuple(o.evolve(total_bytes=float(o.total_bytes)) for o in stores), restores


class _FloatBytesInTheLease(Ref):
    def suspend_queued_restore(self, slot: int) -> Any:
        lease = super().suspend_queued_restore(slot)
        if lease is None:
            return None
        return attrs.evolve(lease, op=lease.op.evolve(total_bytes=float(lease.op.total_bytes)))


class _FloatInTheSnapshot(Ref):
    def snapshot(self) -> Any:
        s = super().snapshot()
        return attrs.evolve(s, num_units=float(s.num_units))


@pytest.mark.parametrize(
    "store",
    [_FloatBytesInOps, _FloatBytesInTheLease, _FloatInTheSnapshot],
    ids=lambda c: c.__name__,
)
def test_a_value_of_another_type_inside_an_op_a_lease_or_a_snapshot_is_caught(
    store: Any,
) -> None:
    with pytest.raises(ConformanceFailure, match=r"1\.0|\d\.0"):
        _run(store)


class _ResumableHitLies(Ref):
    def resumable_hit(self, s: Any, hit: int, block_hashes: Any, assume: bool = False) -> Any:
        return hit


class _AppliesLies(Ref):
    def applies(self, s: Any) -> bool:
        return False


@pytest.mark.parametrize("store", [_ResumableHitLies, _AppliesLies], ids=lambda c: c.__name__)
def test_admission_questions_that_lie_are_caught(store: Any) -> None:
    with pytest.raises(ConformanceFailure, match="resumable_hit|applies"):
        _run(store)


class _OwnList(list):  # type: ignore[type-arg]
    pass


class _AnswersAListSubclass(Ref):
    def take_offload_stores(self, max_inflight: Any) -> Any:
        return _OwnList(super().take_offload_stores(max_inflight))


def test_an_answer_of_a_subclass_is_caught_and_named() -> None:
    with pytest.raises(ConformanceFailure, match=r"\(_OwnList\)"):
        _run(_AnswersAListSubclass)


class _SnapshotCrashesLater(Ref):
    def snapshot(self) -> Any:
        if self._transfer_units:
            raise KeyError("boom")
        return super().snapshot()


class _SelfCheckReturnsNone(Ref):
    def self_check(self) -> Any:
        return None


def test_a_crash_outside_an_action_is_a_failure_with_its_trace() -> None:
    with pytest.raises(
        ConformanceFailure, match=r"after the trace \[.*snapshot\(\) raised KeyError"
    ):
        _run(_SnapshotCrashesLater)
    with pytest.raises(ConformanceFailure, match="self_check"):
        _run(_SelfCheckReturnsNone)


@pytest.mark.parametrize("depth", [0, -3, 2.5, True, "3"])
def test_a_config_with_a_bad_depth_bound_is_refused_before_any_store_is_built(depth: Any) -> None:
    built: list[int] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return Ref(*args, **kwargs)

    with pytest.raises(ValueError, match="max_depth"):
        _run(factory, cfg=attrs.evolve(CONFIGS["tiny"], max_depth=depth))
    assert built == []


def test_plan_entries_may_name_configurations_and_an_empty_plan_still_checks_arguments() -> None:
    reports = run_exhaustive_plan(Ref, plan=(("tiny", 2), (T5, 2)), progress=None)
    assert [r.config for r in reports] == ["tiny", "tiny-5"]
    with pytest.raises(TypeError):
        run_exhaustive_plan(None, plan=(), progress=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("bound", [1, 2, 50])
def test_a_run_cut_by_max_states_reports_exactly_that_many(bound: int) -> None:
    assert _run(Ref, max_states=bound).distinct == bound


# =========================================================================================
# replay_trace: every failure the search reports replays from its trace alone.


def _trace_of(failure: ConformanceFailure) -> list[Any]:
    """The trace a failure message names (``after the trace [...]:``)."""
    import ast
    import re

    m = re.search(r"after the trace (\[.*?\]): ", str(failure))
    assert m, str(failure)
    return list(ast.literal_eval(m.group(1)))


@pytest.mark.parametrize(
    "store",
    [_TransferWrongUnits, _RestoreQueuedForLies, _SettleAnswersFloat],
    ids=lambda c: c.__name__,
)
def test_replay_trace_reproduces_a_failure_from_its_trace_alone(store: Any) -> None:
    """A call's answer inside an action, a read-only question, an answer's type: the kinds
    of failure the old regression recipe could not replay. replay_trace fails with the same
    complaint on the trace the search printed, and passes on the reference there."""
    from pagedstate.engines.conformance import replay_trace

    with pytest.raises(ConformanceFailure) as found:
        _run(store)
    trace = _trace_of(found.value)
    complaint = str(found.value).split(": ", 1)[1].split("]: ", 1)[1]
    with pytest.raises(ConformanceFailure) as replayed:
        replay_trace(store, config=T5, trace=trace)
    assert str(replayed.value).startswith(f"replay ({T5.name}, clone): after the trace {trace}")
    assert complaint in str(replayed.value)
    assert replay_trace(Ref, config=T5, trace=trace) == len(trace)
    assert replay_trace(I.PagedStateCheckpointCoordinator, I.UnitPool, config=T5, trace=trace)


def test_replay_trace_checks_the_initial_state_and_an_empty_trace() -> None:
    from pagedstate.engines.conformance import replay_trace

    assert replay_trace(Ref, config="tiny", trace=[]) == 0

    class WrongStart(Ref):
        def is_idle(self) -> bool:
            return False  # a fresh coordinator is idle

    with pytest.raises(ConformanceFailure, match=r"after the trace \[\]: .*is_idle"):
        replay_trace(WrongStart, config="tiny", trace=())


def test_replay_trace_refuses_a_bad_trace_before_running_its_step() -> None:
    from pagedstate.engines.conformance import replay_trace

    calls: list[str] = []

    class Counting(Ref):
        def take_checkpoint_ops(self) -> Any:
            calls.append("drain")
            return super().take_checkpoint_ops()

    for bad in (
        [("checkpoint", (0, 1)), ("explode", ())],  # no such action
        [("checkpoint", (0, 99))],  # not an action of tiny (hash 99)
        [{"drain": ()}],  # not a pair
        [("drain",)],
        "drain",
        None,
    ):
        with pytest.raises(ValueError):
            replay_trace(Counting, config="tiny", trace=bad)  # type: ignore[arg-type]
    assert calls == []  # no drain ran for any of them
    # a trace read back from JSON (lists for tuples) is the same trace
    as_json = [["checkpoint", [0, 1]], ["drain", []]]
    assert replay_trace(Counting, config="tiny", trace=as_json) == 2 and calls == ["drain"]
    with pytest.raises(KeyError):
        replay_trace(Ref, config="nope", trace=[])
    with pytest.raises(ValueError, match="mode"):
        replay_trace(Ref, config="tiny", trace=[], mode="fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        replay_trace(Ref, config="tiny", trace=[], check_drain=1)  # type: ignore[arg-type]


def test_replay_trace_with_the_drain_check_catches_a_leak_at_quiescence() -> None:
    """check_drain drives a copy of every state reached to quiescence (as run_exhaustive's
    check_drain): a store that keeps a transfer reservation through release is caught."""
    from pagedstate.engines.conformance import replay_trace

    class KeepsTransfers(Ref):
        def release_transfer_units(self, owner: Any) -> Any:
            return None  # the reservation stays

    trace = [("reserve_transfer", ())]
    assert replay_trace(Ref, config=T5, trace=trace, check_drain=True) == 1
    assert replay_trace(KeepsTransfers, config=T5, trace=trace) == 1  # not without the drain
    with pytest.raises(ConformanceFailure, match="driven to quiescence: .*transfers"):
        replay_trace(KeepsTransfers, config=T5, trace=trace, check_drain=True)


def test_a_crash_replayed_is_chained_to_the_stores_own_exception() -> None:
    """The failure of a store that raises something other than a PagedStateError keeps
    its exception as __cause__ (with its traceback), in the search and in the replay."""
    from pagedstate.engines.conformance import replay_trace

    class Crashy(Ref):
        def take_checkpoint_ops(self) -> Any:
            return {}[0]  # KeyError

    with pytest.raises(ConformanceFailure, match="crashed") as found:
        _run(Crashy)
    assert isinstance(found.value.__cause__, KeyError)
    trace = _trace_of(found.value)
    with pytest.raises(ConformanceFailure, match="crashed") as replayed:
        replay_trace(Crashy, config=T5, trace=trace)
    cause = replayed.value.__cause__
    assert isinstance(cause, KeyError) and cause.__traceback__ is not None


def test_a_run_cut_by_max_states_says_so() -> None:
    lines: list[str] = []
    cut = run_exhaustive(Ref, config="tiny", max_states=50, progress=lines.append)
    assert cut.distinct == 50 and cut.complete is False
    assert "(stopped at max_states=50)" in lines[-1]
    whole = run_exhaustive(Ref, config="tiny", max_depth=2, progress=None)
    assert whole.complete is True
