"""The conformance kit (:mod:`pagedstate.engines.conformance`).

- The reference model passes its own kit under the ``ci`` profile (deterministic, bounded),
  and the run takes every non-defensive table row it is expected to.
- The kit can fail: every planted bug of :mod:`pagedstate.models.mutants` is caught, with
  the default configuration and again with bad inputs switched off (so the planted bug
  itself is what disagrees, not a skipped argument check).
- Rules come from the tables: every table event maps to a rule, and a mapping (or a table)
  with an event left out fails the check, at import time too.
- A failing program printed by Hypothesis replays as a plain regression test.
- The kit drives both engine styles: the synchronous one alone (``overlap=False``: a store
  with only the synchronous signatures passes) and the overlapped one (forward ids,
  completion tokens, settles, restore owners, G12/G13 refusals), and it catches three bugs
  of the overlapped style planted in subclasses of the production classes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from plant_helpers import edited_method, plant

from pagedstate import impl as I
from pagedstate.engines.conformance import (
    EVENT_RULES,
    MACRO_RULES,
    ConformanceConfig,
    ConformanceFailure,
    ConformanceMachine,
    ConformanceReport,
    TableCoverageError,
    assert_rule_mapping,
    check_rule_mapping,
    conformance_machine,
    conformance_settings,
    run_conformance,
)
from pagedstate.models.mutants import MUTANTS
from pagedstate.models.reference import PagedStateCheckpointCoordinator
from pagedstate.spec import tables as T
from pagedstate.spec.errors import InvalidArgumentError, LeaseReusedError
from pagedstate.spec.tables import TABLES, Row
from pagedstate.spec.types import SequenceLike

#: The ``ci`` run of the reference must stay well inside this (seconds).
CI_BUDGET_S = 60.0

#: Settings for the planted-bug runs: deterministic, and no shrinking (a caught bug is all
#: these tests need; shrinking a stateful failure takes tens of seconds). Over 10 random
#: seeds per mutant, the slowest needed 99 test cases (docs/conformance.md); the run stops
#: at the first failure, so the bound only costs time when a bug goes uncaught.
MUTANT_SETTINGS = settings(
    max_examples=2000,
    database=None,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    report_multiple_bugs=False,
)


# -- the reference passes its own kit -----------------------------------------------------


@pytest.fixture(scope="module")
def ci_run() -> tuple[ConformanceReport, float]:
    """One ``ci``-profile run of the reference against itself: (coverage, seconds)."""
    start = time.perf_counter()
    report = run_conformance(PagedStateCheckpointCoordinator, settings=settings.get_profile("ci"))
    return report, time.perf_counter() - start


def test_reference_passes_its_own_kit_under_ci(ci_run: tuple[ConformanceReport, float]) -> None:
    report, seconds = ci_run
    assert seconds < CI_BUDGET_S, f"the ci conformance run took {seconds:.1f} s"
    assert report.rows_hit


def test_ci_run_covers_the_tables(ci_run: tuple[ConformanceReport, float]) -> None:
    """Table-row coverage of the ci run: the defensive row is never taken (the API cannot
    reach it) and at least 85% of the other rows are. Which few are missed depends on the
    derandomized draw; longer runs (``dev``, ``fuzz``) take them."""
    report, _ = ci_run
    assert report.defensive_missed == ("record:COPYING+dedup->RELEASED",)
    rows = sum(1 for t in TABLES.values() for r in t.rows if not r.defensive)
    assert len(report.rows_missed) <= 0.15 * rows, report.rows_missed


def test_event_rule_mapping_matches_what_rules_do(ci_run: tuple[ConformanceReport, float]) -> None:
    """Every table event the reference took during a (non-macro) rule is listed for that
    rule in EVENT_RULES: the mapping says what the rules really drive."""
    report, _ = ci_run
    wrong = [
        f"{rule} took {machine}:{ev}"
        for rule, events in report.events_by_rule.items()
        if rule not in MACRO_RULES
        for machine, ev in sorted(events)
        if rule not in EVENT_RULES.get((machine, ev), ())
    ]
    assert wrong == []


# One run under whatever profile is active (HYPOTHESIS_PROFILE=ci|dev|fuzz); this is also
# the entry point hypofuzz collects.
TestReferenceConformance = conformance_machine(
    PagedStateCheckpointCoordinator, name="ReferenceConformance"
).TestCase


def test_conformance_settings_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    ci = conformance_settings("ci")
    assert ci.derandomize and ci.database is None
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "fuzz")
    assert conformance_settings().max_examples == settings.get_profile("fuzz").max_examples
    monkeypatch.delenv("HYPOTHESIS_PROFILE")
    assert conformance_settings().max_examples == settings().max_examples


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="units_per_checkpoint"):
        ConformanceConfig(units_per_checkpoint=0)
    assert ConformanceConfig(units_per_checkpoint=3).spec.units_per_checkpoint == 3


# -- the kit can fail: planted bugs ---------------------------------------------------------


def _run_mutant(name: str, config: ConformanceConfig) -> ConformanceFailure:
    machine = conformance_machine(MUTANTS[name].coordinator, config=config)
    with pytest.raises(ConformanceFailure) as info:
        run_state_machine_as_test(machine, settings=MUTANT_SETTINGS)
    # The store under test is to blame, never the reference.
    assert "the reference model raised" not in str(info.value)
    return info.value


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_kit_catches_planted_bug(mutant: str) -> None:
    _run_mutant(mutant, ConformanceConfig())


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_kit_catches_planted_bug_without_bad_inputs(mutant: str) -> None:
    """Some mutants also skip an argument check, which the bad-input rule finds first;
    without it, the planted bug itself must show as a disagreement."""
    failure = _run_mutant(mutant, ConformanceConfig(bad_inputs=False))
    assert "bad_input" not in str(failure)


def test_failure_names_the_call_and_the_fields() -> None:
    failure = _run_mutant("publish_at_begin", ConformanceConfig())
    text = str(failure)
    assert "take_checkpoint_ops()" in text
    assert "snapshots differ" in text
    assert "records:" in text and "'COPYING'" in text and "'READY'" in text


# -- the documented example runs -------------------------------------------------------------


def test_docs_example_runs(tmp_path: Any) -> None:
    """The first python block of docs/conformance.md is a complete pytest file: run it
    (outside this repository's conftest) under the ``ci`` profile."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "conformance.md").read_text()
    code = re.findall(r"```python\n(.*?)```", doc, re.S)[0]
    assert len(code.strip().splitlines()) <= 25
    (tmp_path / "test_example.py").write_text(code)
    env = {**os.environ, "HYPOTHESIS_PROFILE": "ci"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


# -- a failure becomes a regression test -----------------------------------------------------


def test_printed_program_replays_as_a_plain_test() -> None:
    """The program Hypothesis prints for ``unindex_releases_pinned`` (shape as printed:
    ``state = Conformance()`` then one line per step), run outside Hypothesis."""
    Conformance = conformance_machine(MUTANTS["unindex_releases_pinned"].coordinator)
    state = Conformance()
    state.warm_up(hs=[1])
    state.begin_restore(h=1, slot=0)
    with pytest.raises(ConformanceFailure, match=r"unindex\(1\)"):
        state.unindex(h=1)

    Reference = conformance_machine(PagedStateCheckpointCoordinator)
    state = Reference()
    state.warm_up(hs=[1])
    state.begin_restore(h=1, slot=0)
    state.unindex(h=1)
    state.teardown()


# -- rules come from the tables ------------------------------------------------------------


def test_every_table_event_has_a_rule() -> None:
    assert check_rule_mapping(EVENT_RULES) == []
    keys = {(t.machine, ev) for t in TABLES.values() for ev in t.events}
    assert set(EVENT_RULES) == keys


@pytest.mark.parametrize("key", sorted(EVENT_RULES), ids=lambda k: f"{k[0]}:{k[1]}")
def test_removing_a_mapping_fails(key: tuple[str, str]) -> None:
    mapping = dict(EVENT_RULES)
    del mapping[key]
    assert check_rule_mapping(mapping) == [f"table event {key[0]}:{key[1]} has no conformance rule"]
    with pytest.raises(TableCoverageError, match=f"{key[0]}:{key[1]}"):
        assert_rule_mapping(mapping)


def test_mapping_to_nothing_or_to_a_missing_rule_fails() -> None:
    mapping: dict[tuple[str, str], tuple[str, ...]] = dict(EVENT_RULES)
    mapping[("record", "evict")] = ()
    mapping[("offload", "take")] = ("take_offload", "no_such_rule")
    mapping[("record", "teleport")] = ("drain",)
    assert check_rule_mapping(mapping) == [
        "table event record:evict has no conformance rule",
        "offload:take names 'no_such_rule', which is not a rule",
        "mapped event record:teleport is in no table",
    ]


def test_a_new_table_event_needs_a_rule() -> None:
    """A row with a new event added to a table is reported until a rule drives it."""
    import attrs

    row = Row(T.READY, "teleport", "-", T.READY, note="test")
    record = attrs.evolve(
        T.RECORD, rows=(*T.RECORD.rows, row), events=(*T.RECORD.events, "teleport")
    )
    tables = {**TABLES, "record": record}
    assert check_rule_mapping(EVENT_RULES, ConformanceMachine, tables) == [
        "table event record:teleport has no conformance rule"
    ]


def test_import_fails_when_a_table_event_has_no_rule() -> None:
    """The check runs when the module is imported (in a fresh interpreter)."""
    code = textwrap.dedent(
        """
        import attrs
        from pagedstate.spec import tables as T
        row = T.Row(T.READY, "teleport", "-", T.READY)
        T.RECORD = attrs.evolve(
            T.RECORD, rows=(*T.RECORD.rows, row), events=(*T.RECORD.events, "teleport")
        )
        T.TABLES = {**T.TABLES, "record": T.RECORD}
        import pagedstate.engines.conformance
        """
    )
    env: dict[str, Any] = {**os.environ}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode != 0
    assert "TableCoverageError" in proc.stderr
    assert "table event record:teleport has no conformance rule" in proc.stderr


# -- the kit can fail on the production store: bugs planted in it -----------------------------
#
# 21 bugs were planted in a copy of pagedstate.impl and the kit run as an engine would run
# it (docs/conformance.md). The kit first caught 8 under ``ci``. These are the kinds it
# missed that later additions to the kit catch, each planted here by patching one method of
# a production coordinator: a query wrong only in a narrow band of
# its arguments (the query sweep), a live transfer owner reserved again (the rule could not
# run with ``transfers=1``), a forged lease with a negative id, a change log that ignores
# its bound, and the order of one drain's ops with scratch stores in it (``midstep_pass``).


def _planted(patch: Callable[[Any], None]) -> Callable[..., Any]:
    def factory(*args: Any, **kwargs: Any) -> Any:
        c = I.PagedStateCheckpointCoordinator(*args, **kwargs)
        patch(c)
        return c

    return factory


def _counts_pinned_as_spendable(c: Any) -> None:
    store = c.store

    def has_available_units(count: int, protected_hash: int | None = None) -> bool:
        spendable = sum(1 for r in store.records.values() if r.phase == "READY")
        return c.pool.num_free + spendable * store.units_per_checkpoint >= count

    store.has_available_units = has_available_units


def _live_owner_raises(c: Any) -> None:
    reserve = c.reserve_transfer_units

    def reserve_transfer_units(owner: Any) -> Any:
        if owner in c.snapshot().transfers:
            raise InvalidArgumentError(f"owner {owner!r} holds a reservation")
        return reserve(owner)

    c.reserve_transfer_units = reserve_transfer_units


def _negative_lease_reused(c: Any) -> None:
    release = c.release_suspended_restore

    def release_suspended_restore(lease: Any) -> Any:
        if type(lease.lease_id) is int and lease.lease_id < 0:
            raise LeaseReusedError(f"lease {lease.lease_id} was used")
        return release(lease)

    c.release_suspended_restore = release_suspended_restore


def _unbounded_change_log(c: Any) -> None:
    c.store._changes = deque(c.store._changes, maxlen=4096)


def _scratch_stores_first(c: Any) -> None:
    take = c.take_checkpoint_ops
    scratch = set(ConformanceConfig().scratch_range)  # the kit's scratch slots

    def take_checkpoint_ops() -> Any:
        stores, restores = take()
        first = [op for op in stores if op.src_slot in scratch]
        return (tuple(first + [op for op in stores if op.src_slot not in scratch]), restores)

    c.take_checkpoint_ops = take_checkpoint_ops


def _edit_store_method(name: str, old: str, new: str) -> Callable[[Any], None]:
    """A plant that replaces ``old`` by ``new`` in the source of the production store's
    method ``name``, on the coordinator's store (the bugs the kit's macro rules exist for
    live inside long methods)."""
    edited_method(I.PageUnitCheckpointStore, name, old, new)  # fails now if it no longer applies
    return lambda c: plant(c.store, name, old, new)


#: Compaction of the victim heap (after many re-stamps) leaves out the oldest evictable
#: record: ``restore_storm``.
_HEAP_DROPS_OLDEST = _edit_store_method(
    "_push_victim", "for c in self._lru:", "for c in list(self._lru)[1:]:"
)


def _without_self_check(patch: Callable[[Any], None]) -> Callable[[Any], None]:
    """``patch``, on a coordinator that offers no ``self_check``: the kit must see the bug
    in what the public calls return and what ``snapshot()`` shows."""

    def both(c: Any) -> None:
        patch(c)
        c.self_check = None

    return both


PRODUCTION_PLANTS: dict[str, Callable[[Any], None]] = {
    "has_available_units counts pinned records": _counts_pinned_as_spendable,
    "a live transfer owner reserved again raises": _live_owner_raises,
    "a negative lease id is 'reused'": _negative_lease_reused,
    "the change log ignores its bound": _unbounded_change_log,
    "scratch stores first in the drain's ops": _scratch_stores_first,
    # the three the macro rules were written for (missed with 1,000 test cases before)
    "heap compaction drops the oldest evictable record": _HEAP_DROPS_OLDEST,
    "heap compaction drops the oldest, no self_check": _without_self_check(_HEAP_DROPS_OLDEST),
    "deferred nominees put back reversed": _edit_store_method(
        "take_offload_stores",
        "ready.extendleft(reversed(deferred))",
        "ready.extendleft(deferred)",
    ),
    "the reclaimer takes leases once the clock went back": _edit_store_method(
        "reclaim_stale_offload_pins",
        "stale = [op for op in self._reclaimable if",
        "stale = [op for op in pins if",
    ),
}


@pytest.mark.parametrize("plant", sorted(PRODUCTION_PLANTS))
def test_kit_catches_bugs_planted_in_the_production_store(plant: str) -> None:
    """Each plant is caught with 400 deterministic test cases, no shrinking; the production
    store without a plant passes the same run (``test_production_store_passes``)."""
    factory = _planted(PRODUCTION_PLANTS[plant])
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(factory, I.UnitPool, settings=settings(MUTANT_SETTINGS, max_examples=400))
    assert "the reference model raised" not in str(info.value)


def test_production_store_passes_the_plant_settings() -> None:
    """The unplanted production store passes the runs above: what they catch is the plant."""
    run_conformance(
        _planted(lambda c: None), I.UnitPool, settings=settings(MUTANT_SETTINGS, max_examples=400)
    )


@pytest.mark.parametrize("returned", [object(), None, 42])
def test_a_factory_that_returns_no_coordinator_is_named(returned: Any) -> None:
    """A factory returning something that is not a coordinator fails at construction with
    a message that says so (was: a bare AttributeError on ``snapshot``)."""
    with pytest.raises(ConformanceFailure, match="not a coordinator: it has no snapshot"):
        run_conformance(lambda *a, **k: returned, I.UnitPool, settings=MUTANT_SETTINGS)


# -- the two engine styles ----------------------------------------------------------------


def test_ci_run_drives_the_overlapped_style(ci_run: tuple[ConformanceReport, float]) -> None:
    """The ci run settles images whose tokens reported done (a table row of its own), and
    both stores took the overlapped style's refusals: stale boundaries and boundaries
    beyond the computed blocks (G13), drains naming an old forward, restores and scratch
    over one slot (G12), and malformed forward ids and completion tokens. (Which of the
    bad inputs the derandomized ci draw picks shifts when rules are added; the raising
    completion tokens are driven directly below.)"""
    report, _ = ci_run
    assert {"record:READY+settle->READY", "record:EVICTING+settle->EVICTING"} <= report.rows_hit
    errors = report.errors_by_rule
    assert {"StaleBoundaryError", "BoundaryRangeError"} <= errors["checkpoint_forward"]
    assert "InvalidArgumentError" in errors["drain_forward"]
    assert "SlotBusyError" in errors["scratch_over_restore"]
    assert "SlotBusyError" in errors["restore_for"]
    assert "InvalidArgumentError" in errors["bad_input"]


class _SwallowsTokenErrors(I.PagedStateCheckpointCoordinator):
    """A planted bug: a completion whose token raises is taken as done, not propagated."""

    def complete_previous_batch(self, completion: Any = None) -> None:
        try:
            super().complete_previous_batch(completion)
        except RuntimeError:
            super().complete_previous_batch(None)


@pytest.mark.parametrize("case", ["complete_raising_token", "store_complete_raising_token"])
def test_the_kit_compares_a_raising_completion_token(case: str) -> None:
    """The kit's ``bad_input`` rule with a token whose ``query()`` raises (a device error),
    driven directly (independent of any draw): both stores raise ``RuntimeError`` with
    nothing changed, and a store that swallows the error fails the lockstep."""
    machine = conformance_machine(I.PagedStateCheckpointCoordinator, I.UnitPool, name="Raising")
    machine().bad_input(case)
    assert "RuntimeError" in machine.errors_by_rule["bad_input"]
    if case.startswith("complete"):
        planted = conformance_machine(_SwallowsTokenErrors, I.UnitPool, name="Swallows")
        with pytest.raises(ConformanceFailure):
            planted().bad_input(case)


class _SynchronousOnly(PagedStateCheckpointCoordinator):
    """A store with only the synchronous style's signatures: no forward ids, no completion
    tokens, no restore owners, no settle and no idle query."""

    settle_completions = None
    outstanding = None
    is_idle = None

    def checkpoint(self, seq: SequenceLike, boundary_blocks: int, h: int) -> None:  # type: ignore[override]
        super().checkpoint(seq, boundary_blocks, h)

    def take_checkpoint_ops(self) -> Any:  # type: ignore[override]
        return super().take_checkpoint_ops()

    def complete_previous_batch(self) -> None:  # type: ignore[override]
        super().complete_previous_batch()

    def begin_restore(self, h: int, dst_slot: int) -> bool:  # type: ignore[override]
        return super().begin_restore(h, dst_slot)

    def publish_midstep(self, reservations: Any, seq: Any = None) -> None:  # type: ignore[override]
        super().publish_midstep(reservations, seq)


def test_the_synchronous_style_alone() -> None:
    """``overlap=False`` drives the synchronous style only: a store without the overlapped
    style's arguments and calls passes it, and fails the default configuration (which
    drives both styles)."""
    quick = settings(MUTANT_SETTINGS, max_examples=30)
    config = ConformanceConfig(overlap=False)
    run_conformance(_SynchronousOnly, settings=quick, config=config)
    with pytest.raises(ConformanceFailure, match="store under test raised TypeError"):
        run_conformance(_SynchronousOnly, settings=quick)


# -- bugs of the overlapped style planted in subclasses of the production classes -----------
#
# Each is a subclass of a production class with one thing wrong, built when its test runs
# (a source edit that no longer applies fails the test, not the module's import).


def _forward_blind_drain() -> type:
    """The drain stores every pending boundary, whatever forward it names: a boundary
    filed when batch ``F`` is scheduled is stored by the drain before forward ``F`` ran,
    from the slot as the forward before left it (another state under this prefix's hash)."""

    class ForwardBlindDrain(I.PagedStateCheckpointCoordinator):
        def _drain(self, forward: int | None) -> Any:
            self._boundary_forwards.clear()
            return super()._drain(forward)

    assert callable(getattr(I.PagedStateCheckpointCoordinator, "_drain", None))
    return ForwardBlindDrain


def _lease_of_unsettled_image() -> type:
    """The store leases an image whose copy is issued but not known done (the settled
    test left out of ``acquire_checkpoint_source``, and its pin taken as if settled): a
    transfer sender may read the image before the copy wrote it."""
    store = I.PageUnitCheckpointStore

    class LeasesUnsettledStore(store):  # type: ignore[misc, valid-type]
        acquire_checkpoint_source = edited_method(
            store,
            "acquire_checkpoint_source",
            "or not self._will_settle(cid, self.records[cid], answers)",
            "or False",
        )
        _pin_offload_source = edited_method(
            store,
            "_pin_offload_source",
            "record_step(rec.phase, event, rec.pin_count, rec.settled)",
            "record_step(rec.phase, event, rec.pin_count)",
        )

    class LeasesUnsettled(I.PagedStateCheckpointCoordinator):
        store_class = LeasesUnsettledStore

    return LeasesUnsettled


def _restore_over_scratch() -> type:
    """The coordinator forgets the scratch slots when it checks a restore's destination
    (G12): a restore into a slot lent as midstep scratch is queued, and one drain reads
    and writes the slot."""

    class RestoresOverScratch(I.PagedStateCheckpointCoordinator):
        def _lent_as_scratch(self, slot: int) -> bool:
            return False

    assert callable(getattr(I.PagedStateCheckpointCoordinator, "_lent_as_scratch", None))
    return RestoresOverScratch


#: plant -> (builder of the planted coordinator class, what the failure must name).
OVERLAP_PLANTS: dict[str, tuple[Callable[[], type], str]] = {
    "boundaries stored ignoring their forward": (_forward_blind_drain, "take_checkpoint_ops("),
    "a lease of an unsettled image": (_lease_of_unsettled_image, "acquire_checkpoint_source("),
    "a restore into a lent scratch slot": (_restore_over_scratch, "SlotBusyError"),
}


@pytest.mark.parametrize("plant", sorted(OVERLAP_PLANTS))
def test_kit_catches_overlap_bugs_planted_in_production_subclasses(plant: str) -> None:
    """Each is caught with 400 deterministic test cases, no shrinking, by the call that
    shows it; the unplanted production store passes the same run
    (``test_production_store_passes_the_plant_settings``)."""
    build, shows = OVERLAP_PLANTS[plant]
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(build(), I.UnitPool, settings=settings(MUTANT_SETTINGS, max_examples=400))
    text = str(info.value)
    assert "the reference model raised" not in text
    # the plant itself disagrees, not a plant that no longer fits the class it edits
    assert not isinstance(info.value.__cause__, (AttributeError, TypeError, NameError)), text
    assert shows in text, text
