"""The conformance kit's exhaustive mode (:mod:`pagedstate.engines.conformance.exhaustive`):
the production store passes it in both modes, visiting exactly the explorer's states; every
reference mutant, a clone that shares state, a crash, a refusal that changes state, a store
whose own self_check complains and one that drops a handle are each caught; the follower's
environment checks agree with the world's own; bad arguments are refused."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from pagedstate import impl as I
from pagedstate.engines.conformance import (
    EXHAUSTIVE_PLAN,
    ConformanceFailure,
    ExhaustiveReport,
    run_exhaustive,
    run_exhaustive_plan,
)
from pagedstate.engines.conformance.exhaustive import _problems
from pagedstate.models.explorer import CONFIGS, explore
from pagedstate.models.mutants import MUTANTS
from pagedstate.models.reference import PagedStateCheckpointCoordinator, UnitPool
from pagedstate.spec.errors import PagedStateError
from pagedstate.spec.types import StateStoreOperationId

#: ``tiny`` to depth 5: a few thousand states, a few seconds.
SMALL = attrs.evolve(CONFIGS["tiny"], name="tiny-5", max_depth=5)
#: the mutants' configurations (tests/test_mutants.py: a second unit per KV allocation, so
#: the partial release is tried).
MUTANT_CONFIG = attrs.evolve(CONFIGS["tiny"], name="tiny-kv2", kv_units=2, units=4)
OVERLAP_CONFIG = attrs.evolve(CONFIGS["overlap"], name="overlap-kv2", kv_units=2, units=4)
OVERLAP_MUTANTS = {"boundary_forward_ignored", "restore_into_lent_scratch"}


def _quiet(**kw: Any) -> dict[str, Any]:
    return {"progress": None, **kw}


@pytest.mark.parametrize("mode", ["clone", "replay"])
def test_the_production_store_passes_and_visits_the_explorers_states(mode: Any) -> None:
    want = explore(SMALL, check_drain=False)
    report = run_exhaustive(
        I.PagedStateCheckpointCoordinator, I.UnitPool, config=SMALL, mode=mode, **_quiet()
    )
    assert isinstance(report, ExhaustiveReport)
    assert report.mode == mode
    assert report.distinct == want.distinct
    assert report.depth == 5
    assert report.transitions > report.distinct > 1_000
    assert report.refused > 0


def test_auto_clones_when_the_coordinator_can() -> None:
    report = run_exhaustive(
        I.PagedStateCheckpointCoordinator, I.UnitPool, config=SMALL, max_states=50, **_quiet()
    )
    assert report.mode == "clone"
    assert report.distinct == 50


def test_the_drain_check_passes_on_the_production_store() -> None:
    cfg = attrs.evolve(CONFIGS["default"], max_depth=4)
    report = run_exhaustive(
        I.PagedStateCheckpointCoordinator, I.UnitPool, config=cfg, check_drain=True, **_quiet()
    )
    assert report.distinct == explore(cfg, check_drain=False).distinct


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_reference_mutant_is_caught(name: str) -> None:
    cfg = OVERLAP_CONFIG if name in OVERLAP_MUTANTS else MUTANT_CONFIG
    with pytest.raises(ConformanceFailure, match=r"after the trace \["):
        run_exhaustive(MUTANTS[name].coordinator, config=cfg, max_states=50_000, **_quiet())


class _SharedRecordsClone(PagedStateCheckpointCoordinator):
    """A clone that shares the store's records with the original."""

    def clone(self) -> Any:
        c = super().clone()
        c.store.records = self.store.records
        return c


def test_a_clone_that_shares_state_is_caught_in_clone_mode_only() -> None:
    with pytest.raises(ConformanceFailure):
        run_exhaustive(_SharedRecordsClone, config=SMALL, mode="clone", **_quiet())
    # replay never clones the store under test: the same store passes
    run_exhaustive(_SharedRecordsClone, config=SMALL, mode="replay", max_states=3_000, **_quiet())


class _CrashingUnindex(PagedStateCheckpointCoordinator):
    def unindex(self, prefix_hash: int) -> Any:
        if self.store.records:
            raise KeyError(prefix_hash)
        return super().unindex(prefix_hash)


def test_a_crash_of_the_store_under_test_is_a_failure() -> None:
    with pytest.raises(ConformanceFailure, match="crashed.*KeyError"):
        run_exhaustive(_CrashingUnindex, config=SMALL, **_quiet())


class _DirtyingPool(UnitPool):
    """A refused release that marks the named units dirty before it raises (not G8)."""

    def release_units(self, unit_ids: Any, owner: Any) -> None:
        try:
            super().release_units(unit_ids, owner)
        except PagedStateError:
            self._dirty.update(u for u in unit_ids if isinstance(u, int))
            raise


def test_a_refusal_that_changes_state_is_caught() -> None:
    # the reference refused and changed nothing (G8), so the snapshots differ
    with pytest.raises(ConformanceFailure, match=r"kv_partial_free.*snapshots differ: dirty"):
        run_exhaustive(
            PagedStateCheckpointCoordinator, _DirtyingPool, config=MUTANT_CONFIG, **_quiet()
        )


class _SelfCheckComplains(PagedStateCheckpointCoordinator):
    def self_check(self) -> list[str]:
        return ["planted"] if len(self.store.records) >= 2 else []


def test_the_store_under_tests_own_self_check_is_consulted() -> None:
    with pytest.raises(ConformanceFailure, match="its own self_check reports: planted"):
        run_exhaustive(_SelfCheckComplains, config=SMALL, **_quiet())


class _ForgetsTransfers(PagedStateCheckpointCoordinator):
    """Drops a transfer reservation from its snapshot: the environment's checks see the
    reservation it holds vanish (results and snapshots cannot, as the follower compares
    against a reference that keeps it: the snapshot differs first)."""

    def snapshot(self) -> Any:
        snap = super().snapshot()
        return attrs.evolve(snap, transfers={})


def test_a_vanished_handle_is_caught() -> None:
    with pytest.raises(ConformanceFailure, match="transfers|vanished"):
        run_exhaustive(_ForgetsTransfers, config=SMALL, **_quiet())


def test_the_followers_environment_checks_are_the_worlds() -> None:
    """:func:`_problems` (read off a snapshot) agrees with ``World.problems`` (read off the
    reference's internals) on every state of ``tiny`` to depth 5, with planted alarms."""
    start = SMALL.build()
    seen = {start.key()}
    level = [start]
    checked = 0
    for _ in range(5):
        nxt = []
        for w in level:
            for name, args in w.actions():
                n = w.clone()
                try:
                    n.act(name, *args)
                except PagedStateError:
                    continue
                k = n.key()
                if k in seen:
                    continue
                seen.add(k)
                nxt.append(n)
                assert _problems(n, n.snapshot()) == n.problems()
                n.ops = [*n.ops, StateStoreOperationId(-1, -1)]  # a handle the store never had
                n.alarms = ("planted",)
                assert _problems(n, n.snapshot()) == n.problems() != []
                n.ops = n.ops[:-1]
                n.alarms = ()
                checked += 1
        level = nxt
    assert checked > 1_000


@pytest.mark.parametrize(
    "kw",
    [
        {"mode": "fast"},
        {"max_depth": 0},
        {"max_depth": True},
        {"max_depth": 1.5},
        {"max_states": 0},
        {"progress_every_s": -1},
    ],
)
def test_bad_arguments_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        run_exhaustive(I.PagedStateCheckpointCoordinator, config=SMALL, **_quiet(**kw))


def test_an_unknown_configuration_is_refused() -> None:
    with pytest.raises(KeyError, match="no-such"):
        run_exhaustive(I.PagedStateCheckpointCoordinator, config="no-such", **_quiet())


def test_progress_lines_and_the_final_line() -> None:
    lines: list[str] = []
    run_exhaustive(
        I.PagedStateCheckpointCoordinator,
        config=SMALL,
        max_states=500,
        progress=lines.append,
        progress_every_s=0.0,
    )
    assert len(lines) >= 2
    assert "all agreeing" in lines[-1]


def test_the_plan_names_configurations_and_bounds() -> None:
    assert EXHAUSTIVE_PLAN
    names = [cfg.name for cfg, _ in EXHAUSTIVE_PLAN]
    assert len(set(names)) == len(names)
    assert all(isinstance(d, int) and d >= 1 for _, d in EXHAUSTIVE_PLAN)
    reports = run_exhaustive_plan(
        I.PagedStateCheckpointCoordinator, I.UnitPool, max_states=200, progress=None
    )
    assert [r.config for r in reports] == names


def test_the_docs_example_runs() -> None:
    """docs/conformance.md's exhaustive-mode example is a complete pytest file: its fast test
    runs as written (the plan's test is the CI gate: minutes, not run here)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "conformance.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "run_exhaustive" in b]
    assert len(blocks) == 1
    ns: dict[str, Any] = {}
    exec(compile(blocks[0], "conformance.md", "exec"), ns)
    assert callable(ns["test_my_store_in_every_state_of_the_plan"])
    ns["test_my_store_in_every_state_to_depth_6"]()


def test_the_docs_regression_recipe_runs_as_written() -> None:
    """docs/conformance.md's "Turning it into a regression test" block is self-contained
    and passes on the reference (its store under test)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "conformance.md").read_text()
    blocks = [
        b
        for b in re.findall(r"```python\n(.*?)```", doc, re.S)
        if "replay_trace" in b and "TRACE" in b
    ]
    assert len(blocks) == 1
    ns: dict[str, Any] = {}
    exec(compile(blocks[0], "conformance.md", "exec"), ns)
    ns["test_unindex_of_an_image_being_copied"]()
