"""Symbolic contracts of the spec's pure functions (``make contracts``), and proof that the
checks bite and hold the code the stores run.

Three parts:

- Plain unit tests of :mod:`pagedstate.spec.guards`, :mod:`pagedstate.spec.changelog`,
  ``spec_violation`` and :meth:`Table.step` (exhaustive where the domain is finite), and a
  test that the production store computes its guards and arithmetic through the helpers
  the pairs hold on their production side, and the reference model through those on their
  reference side.
- One CrossHair run per test, not slow (seconds each): an off-by-one planted in the
  production side of each ``diffbehavior`` pair of the Makefile is reported by that pair,
  and one is reported by ``crosshair check``.
- CrossHair runs (marked slow): the real modules pass ``crosshair check`` and every
  ``diffbehavior`` pair agrees, at the effort bounds the Makefile's ``contracts`` target
  uses (read from the Makefile, so the two cannot drift); and each planted bug, written
  into a copy of ``spec/`` in a temporary directory, is reported at that same bound.

CrossHair is run on ``spec.*`` module names from the directory holding ``spec/`` (the
repo root, or the temporary copy), as the Makefile does: crosshair 0.0.113 cannot read the
implicit namespace package ``pagedstate`` through the editable install's path hook.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import attrs
import pytest

import pagedstate.impl.store as production
import pagedstate.models.reference as reference
import pagedstate.models.reference.store_core as reference_core
import pagedstate.models.reference.store_offload as reference_offload
import pagedstate.spec.changelog as changelog_module
import pagedstate.spec.guards as guards_module
from pagedstate.spec import TABLES, BadSpecError, PagedStateCheckpointSpec
from pagedstate.spec.changelog import (
    ChangeLog,
    changed_since,
    changed_since_by_scan,
    diff_changes_by_scan,
    diff_changes_closed,
    log_is_well_formed,
)
from pagedstate.spec.errors import IllegalTransitionError, PinUnderflowError
from pagedstate.spec.guards import (
    GUARD_LABELS,
    UNDERFLOW_MESSAGE,
    check_record_step,
    diff_evictable_by_table,
    diff_evictable_computed,
    diff_guard_by_table,
    diff_guard_computed,
    diff_reclaimed_by_cases,
    diff_reclaimed_computed,
    diff_units_by_walk,
    diff_units_closed,
    evictable_by_table,
    forfeit_untrusted,
    guard_by_table,
    index_guard,
    is_evictable,
    reclaimed_by_cases,
    record_guard,
    record_step,
    store_guard,
    units_available,
    units_available_by_walk,
    unpin_guard,
)
from pagedstate.spec.tables import EVICTING, NO_GUARD, READY, RECORD
from pagedstate.spec.types import is_size, spec_violation, units_for, validate_spec_fields

REPO = Path(__file__).resolve().parent.parent
CROSSHAIR = Path(sys.executable).with_name("crosshair")
PHASES = RECORD.phases
EVENTS = RECORD.events
UNPINS = ("unpin_restore", "unpin_offload", "unpin_lease")

# ---------------------------------------------------------------------------------------
# Guards
# ---------------------------------------------------------------------------------------


def test_store_guard() -> None:
    assert store_guard(0) == "unpinned"
    assert [store_guard(n) for n in (1, 2, 7)] == ["pinned"] * 3


def test_index_guard() -> None:
    assert index_guard(READY, 0) == "unpinned"
    assert index_guard(READY, 3) == "pinned"
    for phase in PHASES:
        if phase != READY:
            assert index_guard(phase, 0) == NO_GUARD


def test_unpin_guard() -> None:
    assert unpin_guard(READY, 1) == NO_GUARD
    assert unpin_guard(READY, 4) == NO_GUARD
    assert unpin_guard(EVICTING, 1) == "last"
    assert unpin_guard(EVICTING, 2) == "more"
    for phase in PHASES:
        with pytest.raises(PinUnderflowError, match=UNDERFLOW_MESSAGE):
            unpin_guard(phase, 0)


def test_record_guard_picks_the_row_the_table_picks() -> None:
    """Every (phase, event) of the record table, pin counts 0-4: the production guard names
    a row exactly when the reference's reading of the table does, and the same one; where
    the table has rows for (phase, event) but none applies, both name the same missing
    guard (so both stores raise the same IllegalTransitionError)."""
    for phase, event, pins, settled in itertools.product(
        PHASES, EVENTS, range(5), (False, True)
    ):
        if event in UNPINS and pins == 0:
            with pytest.raises(PinUnderflowError):
                record_guard(phase, event, pins, settled)
            continue
        guard = record_guard(phase, event, pins, settled)
        by_table = guard_by_table(phase, event, pins, settled)
        assert guard in GUARD_LABELS and by_table in GUARD_LABELS
        chosen = guard if RECORD.has(phase, event, guard) else None
        read = by_table if RECORD.has(phase, event, by_table) else None
        assert chosen == read, (phase, event, pins, settled)
        if any(r.key[:2] == (phase, event) for r in RECORD.rows):
            assert guard == by_table, (phase, event, pins, settled)
        else:
            assert by_table == NO_GUARD


def test_every_guarded_record_row_is_chosen_for_some_pin_count() -> None:
    for row in RECORD.rows:
        pins = [n for n in range(4) if row.phase in (READY, EVICTING) or n == 0]
        hits = [n for n in pins if row.event not in UNPINS or n > 0]
        assert any(record_guard(row.phase, row.event, n) == row.guard for n in hits), row


def test_record_step_safety_rules_exhaustively() -> None:
    """The contracts of ``check_record_step``, over the whole finite part of its domain."""
    for p, e, pins, settled in itertools.product(
        range(len(PHASES)), range(len(EVENTS)), range(5), (False, True)
    ):
        if pins and PHASES[p] not in (READY, EVICTING):
            continue
        if EVENTS[e] in UNPINS and pins == 0:
            with pytest.raises(PinUnderflowError):
                check_record_step(p, e, pins, settled)
            continue
        row = check_record_step(p, e, pins, settled)
        read = guard_by_table(PHASES[p], EVENTS[e], pins, settled)
        assert (None if row is None else row.guard) == (
            read if RECORD.has(PHASES[p], EVENTS[e], read) else None
        )
        if row is None:
            with pytest.raises(IllegalTransitionError):
                record_step(PHASES[p], EVENTS[e], pins, settled)
            continue
        # D.13: a host reader's pin only on a settled image.
        assert row.event not in ("pin_offload", "pin_lease") or settled
        after = pins + row.pin_delta
        assert row.key[:2] == (PHASES[p], EVENTS[e])
        assert after >= 0
        assert row.pin_delta <= 0 or row.phase == READY
        assert row.units != "release" or after == 0
        assert after == 0 or row.next in (READY, EVICTING)


def test_table_step_contract_on_every_table() -> None:
    """Table.step's contract over its whole finite domain on the real tables: every key
    built from a table's phases, its events and every guard label any table uses."""
    guards = sorted({r.guard for t in TABLES.values() for r in t.rows} | {"nonsense"})
    for table in TABLES.values():
        for phase, event, guard in itertools.product(table.phases, table.events, guards):
            if table.has(phase, event, guard):
                row = table.step(phase, event, guard)
                assert row.key == (phase, event, guard)
                assert row in table.rows
            else:
                with pytest.raises(IllegalTransitionError):
                    table.step(phase, event, guard)


def test_is_evictable() -> None:
    assert is_evictable(READY, 0, False)
    assert not is_evictable(READY, 0, True)
    assert not is_evictable(READY, 1, False)
    for phase in PHASES:
        if phase != READY:
            assert not is_evictable(phase, 0, False)


def test_is_evictable_equals_the_tables_reading() -> None:
    for p, pins, protected in itertools.product(range(len(PHASES)), range(4), (False, True)):
        expected = evictable_by_table(PHASES[p], pins, protected)
        assert is_evictable(PHASES[p], pins, protected) == expected
        assert diff_evictable_by_table(p, pins, protected) == expected
        assert diff_evictable_computed(p, pins, protected) == expected
    assert diff_evictable_by_table(-1, 0, False) is None
    assert diff_evictable_computed(0, -1, False) is None


def test_units_available_equals_the_walk() -> None:
    for count, free, upc in itertools.product(range(9), range(4), range(1, 4)):
        for n in range(5):
            for flags in itertools.product((False, True), repeat=n):
                walk = units_available_by_walk(count, free, list(flags), upc)
                assert units_available(count, free, sum(flags), upc) == walk
                assert diff_units_closed(count, free, list(flags), upc) == walk
                assert diff_units_by_walk(count, free, list(flags), upc) == walk
    assert diff_units_closed(1, 0, [True], 0) is None
    assert diff_units_by_walk(-1, 0, [True], 1) is None


def test_forfeit_untrusted() -> None:
    for forfeited, gen, mark, live in itertools.product(
        (False, True), range(4), range(4), (False, True)
    ):
        expected = forfeited or (gen <= mark and not live)
        assert forfeit_untrusted(forfeited, gen, mark, live) == expected
        assert reclaimed_by_cases(forfeited, gen, mark, live) == expected
        if gen >= 1:
            assert diff_reclaimed_by_cases(forfeited, gen, mark, live) == expected
            assert diff_reclaimed_computed(forfeited, gen, mark, live) == expected
    assert diff_reclaimed_by_cases(True, 0, 0, False) is None
    assert diff_reclaimed_computed(True, 1, -1, False) is None


def test_guard_pair_agrees_on_its_domain() -> None:
    for p, e, pins, settled in itertools.product(
        range(-1, len(PHASES) + 1), range(-1, len(EVENTS) + 1), range(-1, 4), (False, True)
    ):
        assert diff_guard_by_table(p, e, pins, settled) == diff_guard_computed(
            p, e, pins, settled
        )


# ---------------------------------------------------------------------------------------
# The stores compute through the helpers the pairs hold
# ---------------------------------------------------------------------------------------

#: ``(module, name the module calls, spec helper)``: the production side of every pair
#: (pagedstate.impl.store) and the reference side (the modules of pagedstate.models.reference
#: that call it). The stores are built from the package each module belongs to.
STORE_HELPERS = [
    (production, "store_guard", guards_module.store_guard),
    (production, "index_guard", guards_module.index_guard),
    (production, "unpin_guard", guards_module.unpin_guard),
    (production, "is_evictable", guards_module.is_evictable),
    (production, "units_available", guards_module.units_available),
    (production, "forfeit_untrusted", guards_module.forfeit_untrusted),
    (production, "_changed_since", changelog_module.changed_since),
    (reference_core, "guard_by_table", guards_module.guard_by_table),
    (reference_core, "evictable_by_table", guards_module.evictable_by_table),
    (reference_core, "units_available_by_walk", guards_module.units_available_by_walk),
    (reference_offload, "reclaimed_by_cases", guards_module.reclaimed_by_cases),
    (reference_core, "changed_since_by_scan", changelog_module.changed_since_by_scan),
]
#: The package whose store and pool run each module's code.
_STORES = {production: production, reference_core: reference, reference_offload: reference}


def _drive(store: production.PageUnitCheckpointStore | reference.PageUnitCheckpointStore) -> None:
    """Every guarded record step, an eviction, availability, changes and reclaim queries."""
    for h in (1, 2, 3):  # the pool of 9 units is full
        assert store.begin_store(h, 0) is not None
        store.complete_inflight()
    assert store.has_available_units(6, 1)
    assert store.begin_restore(1, 1) is not None
    store.take_restore_ops()
    assert store.unindex(1)  # READY, pinned: EVICTING
    store.complete_inflight()  # its last pin: released
    assert store.begin_store(4, 0) is not None
    assert store.unindex(4)  # COPYING: EVICTING
    assert store.begin_store(5, 0) is not None  # evicts 2, the LRU victim
    store.complete_inflight()  # 4: EVICTING publish, released
    assert store.changed_since(0) == {1, 2, 3, 5}
    assert store.changed_since(store.generation - 1) == {5}
    (op, _units), *_ = store.take_offload_stores(4)
    assert not store.was_reclaimed(op)
    store.clear()
    assert store.changed_since(0) is None


@pytest.mark.parametrize(
    ("module", "name", "helper"),
    STORE_HELPERS,
    ids=[f"{m.__name__.rsplit('.', 1)[1]}.{n}" for m, n, _h in STORE_HELPERS],
)
def test_the_stores_compute_through_the_checked_helpers(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str, helper: object
) -> None:
    """What the CrossHair pairs compare is what the stores run: each store module binds the
    spec helper itself, and calls it (a counting spy in its place sees calls)."""
    assert getattr(module, name) is helper
    calls = []

    def spy(*args: object) -> object:
        calls.append(args)
        return helper(*args)  # type: ignore[operator]

    monkeypatch.setattr(module, name, spy)
    package = _STORES[module]  # type: ignore[index]
    store_cls = package.PageUnitCheckpointStore
    pool_cls = package.UnitPool
    _drive(store_cls(pool_cls(9), PagedStateCheckpointSpec(10, 25, "v", 25), offload_sink=True))
    assert calls, f"{module.__name__}.{name} was not called"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------
# Change log
# ---------------------------------------------------------------------------------------


def _logs(max_len: int) -> Iterator[tuple[int, ChangeLog]]:
    """Every consecutive log of up to ``max_len`` bumps starting at generation 1-3, hashes
    from {None (clear), 7, 8}, with the store's generation at its newest bump."""
    yield 0, ()
    for first, n in itertools.product(range(1, 4), range(1, max_len + 1)):
        for hashes in itertools.product((None, 7, 8), repeat=n):
            log = tuple(zip(range(first, first + n), hashes, strict=True))
            yield first + n - 1, log


def test_changed_since_examples() -> None:
    log: ChangeLog = ((3, 10), (4, 11), (5, None), (6, 12))
    assert changed_since(6, log, 6) == frozenset()
    assert changed_since(6, log, 9) == frozenset()
    assert changed_since(6, log, 5) == frozenset({12})
    assert changed_since(6, log, 4) is None  # the clear at 5
    assert changed_since(4, log[:2], 2) == frozenset({10, 11})  # reaches back to since + 1 = 3
    assert changed_since(4, log[:2], 1) is None  # generation 2 fell off the log
    assert changed_since(0, (), -1) is None
    assert changed_since(0, (), 0) == frozenset()


def test_changed_since_equals_the_scan_on_store_logs() -> None:
    for generation, log in _logs(4):
        assert log_is_well_formed(generation, log)
        for since in range(-2, generation + 2):
            expected = changed_since_by_scan(generation, log, since)
            assert changed_since(generation, log, since) == expected, (generation, log, since)
            assert diff_changes_closed(generation, log, since) == (
                expected if len(log) <= 2 else None
            )
            assert diff_changes_by_scan(generation, log, since) == (
                expected if len(log) <= 2 else None
            )


def test_changed_since_on_gapped_logs() -> None:
    """Well-formed but not consecutive (the contract's domain is wider than a store's)."""
    log: ChangeLog = ((2, 5), (5, 6), (9, 7))
    assert changed_since(9, log, 1) == frozenset({5, 6, 7})
    assert changed_since(9, log, 4) == frozenset({6, 7})
    assert changed_since(9, log, 0) is None
    assert not log_is_well_formed(9, ((2, 5), (2, 6)))
    assert not log_is_well_formed(1, ((2, 5),))


# ---------------------------------------------------------------------------------------
# Spec validation
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ((10, 25, "v", 25), None),
        ((True, 25, "v", 25), "page_unit_bytes"),
        ((10, 0, "v", 25), "slot_bytes"),
        ((10, 25, "v", -1), "image_bytes"),
        ((10, 25.0, "v", 25), "slot_bytes"),
        ((10, 25, "v", "25"), "image_bytes"),
        ((10, 25, "v", 26), "image_bytes>slot_bytes"),
        ((10, 25, "", 25), "layout_id"),
        ((10, 25, None, 25), "layout_id"),
    ],
)
def test_spec_violation(fields: tuple[object, ...], rule: str | None) -> None:
    assert spec_violation(*fields) == rule  # type: ignore[arg-type]
    message = validate_spec_fields(*fields)  # type: ignore[arg-type]
    assert (message is None) == (rule is None)
    page, slot, layout, image = fields
    if rule is None:
        PagedStateCheckpointSpec(page, slot, layout, image)  # type: ignore[arg-type]
    else:
        assert message is not None
        with pytest.raises(BadSpecError) as info:
            PagedStateCheckpointSpec(page, slot, layout, image)  # type: ignore[arg-type]
        assert str(info.value) == message
        assert message.startswith(rule.split(">")[0])


def test_is_size() -> None:
    assert is_size(1) and is_size(10**12)
    for value in (0, -3, True, False, 1.0, "1", None):
        assert not is_size(value)


def test_units_for() -> None:
    assert [units_for(b, 10) for b in (1, 10, 11, 20, 25)] == [1, 1, 2, 2, 3]


# ---------------------------------------------------------------------------------------
# CrossHair: the real modules pass, each planted bug is caught, at the Makefile's bounds
# ---------------------------------------------------------------------------------------


def _makefile() -> str:
    return (REPO / "Makefile").read_text()


def _make_var(name: str) -> str:
    m = re.search(rf"^{name}\s*[?:]?=\s*((?:.*\\\n)*.*)$", _makefile(), re.MULTILINE)
    assert m, f"{name} not in the Makefile"
    return " ".join(m.group(1).replace("\\\n", " ").split())


EFFORT = int(_make_var("CONTRACTS_EFFORT"))
DIFF_EFFORT = int(_make_var("CONTRACTS_DIFF_EFFORT"))
CHECK_TARGETS = _make_var("CONTRACTS_CHECK").split()
DIFF_PAIRS = [
    (a.strip(), b.strip())
    for a, b in re.findall(r"\$\(call crosshair_diff,([^,]+),([^)]+)\)", _makefile())
]


def _check_cmd(*targets: str, effort: int = EFFORT) -> list[str]:
    return [
        str(CROSSHAIR),
        "check",
        "--analysis_kind=PEP316",
        f"--max_uninteresting_iterations={effort}",
        *targets,
    ]


def _diff_cmd(f1: str, f2: str, effort: int = DIFF_EFFORT) -> list[str]:
    return [str(CROSSHAIR), "diffbehavior", f"--max_uninteresting_iterations={effort}", f1, f2]


@attrs.frozen
class Plant:
    """A bug written into a copy of ``spec/``: replace ``old`` (found exactly once) in
    ``file`` by ``new``; ``caught_by`` lists the runs that must report it, ``missed_by`` the
    runs known to be blind to it (kept to document why both kinds of run exist)."""

    name: str
    file: str
    old: str
    new: str
    caught_by: tuple[tuple[str, ...], ...]
    missed_by: tuple[tuple[str, ...], ...] = ()


def _chk(target: str) -> tuple[str, ...]:
    return ("check", target)


def _dif(pair: str) -> tuple[str, ...]:
    return {
        "units": ("diff", "spec.guards.diff_units_by_walk", "spec.guards.diff_units_closed"),
        "guards": ("diff", "spec.guards.diff_guard_by_table", "spec.guards.diff_guard_computed"),
        "evictable": (
            "diff",
            "spec.guards.diff_evictable_by_table",
            "spec.guards.diff_evictable_computed",
        ),
        "reclaimed": (
            "diff",
            "spec.guards.diff_reclaimed_by_cases",
            "spec.guards.diff_reclaimed_computed",
        ),
        "changes": (
            "diff",
            "spec.changelog.diff_changes_by_scan",
            "spec.changelog.diff_changes_closed",
        ),
    }[pair]


PLANTS = [
    Plant(
        "store_guard_pinned_above_one",
        "guards.py",
        'return "pinned" if pin_count > 0 else "unpinned"',
        'return "pinned" if pin_count > 1 else "unpinned"',
        (_chk("spec.guards.store_guard"), _dif("guards")),
    ),
    Plant(
        "unpin_guard_last_off_by_one",
        "guards.py",
        'return "last" if pin_count == 1 else "more"',
        'return "last" if pin_count <= 2 else "more"',
        (_chk("spec.guards.unpin_guard"), _dif("guards")),
    ),
    Plant(
        "unpin_guard_no_underflow_check",
        "guards.py",
        "    if pin_count <= 0:\n        raise PinUnderflowError(UNDERFLOW_MESSAGE)",
        "    if pin_count < 0:\n        raise PinUnderflowError(UNDERFLOW_MESSAGE)",
        (_chk("spec.guards.unpin_guard"),),
    ),
    Plant(
        # Raising is declared (raises: PinUnderflowError), so check cannot tell an early
        # raise from a right one; the diff pair compares it with the table's reading.
        "unpin_guard_raises_on_the_last_pin",
        "guards.py",
        "    if pin_count <= 0:\n        raise PinUnderflowError(UNDERFLOW_MESSAGE)",
        "    if pin_count <= 1:\n        raise PinUnderflowError(UNDERFLOW_MESSAGE)",
        (_dif("guards"),),
        missed_by=(_chk("spec.guards.unpin_guard"),),
    ),
    Plant(
        "record_guard_forgets_evicting_publish",
        "guards.py",
        'if event == "evict" or (event == "publish" and phase == EVICTING):',
        'if event == "evict":',
        (_chk("spec.guards.check_record_step"), _dif("guards")),
    ),
    Plant(
        "is_evictable_ignores_pins",
        "guards.py",
        "return not is_protected and phase == READY and pin_count == 0",
        "return not is_protected and phase == READY",
        (_chk("spec.guards.is_evictable"), _dif("evictable")),
    ),
    Plant(
        "units_available_off_by_one",
        "guards.py",
        "return count <= num_free + evictable_images * units_per_checkpoint",
        "return count < num_free + evictable_images * units_per_checkpoint",
        (_chk("spec.guards.units_available"), _dif("units")),
    ),
    Plant(
        "units_available_credits_one_unit_per_image",
        "guards.py",
        "return count <= num_free + evictable_images * units_per_checkpoint",
        "return count <= num_free + evictable_images",
        (_chk("spec.guards.units_available"),),
    ),
    Plant(
        "forfeit_watermark_exclusive",
        "guards.py",
        "return in_forfeited or (generation <= watermark and not live)",
        "return in_forfeited or (generation < watermark and not live)",
        (_chk("spec.guards.forfeit_untrusted"), _dif("reclaimed")),
    ),
    Plant(
        # G11 / C.11: a row that frees the units while a pin is left.
        "table_frees_units_under_a_lease",
        "tables.py",
        'Row(EVICTING, "unpin_lease", "more", EVICTING, pin_delta=-1, note="B.3 rows 18, 19"),',
        'Row(EVICTING, "unpin_lease", "more", EVICTING, pin_delta=-1, units="release"),',
        (_chk("spec.guards.check_record_step"),),
    ),
    Plant(
        "table_step_looks_up_the_wrong_guard",
        "tables.py",
        "row = self._by_key.get((phase, event, guard))",
        'row = self._by_key.get((phase, event, "more" if guard == "last" else guard))',
        (_chk("spec.guards.check_record_step"),),
    ),
    Plant(
        "changed_since_forgets_clears",
        "changelog.py",
        "break\n        if h is None:\n            return None\n        out.add(h)",
        "break\n        if h is not None:\n            out.add(h)",
        (_chk("spec.changelog.changed_since"), _dif("changes")),
    ),
    Plant(
        "changed_since_reach_back_off_by_one",
        "changelog.py",
        "    if not log or log[0][0] > since + 1:\n        return None\n    out: set[int]",
        "    if not log or log[0][0] > since:\n        return None\n    out: set[int]",
        (_chk("spec.changelog.changed_since"), _dif("changes")),
    ),
    Plant(
        "spec_accepts_bools",
        "types.py",
        "return _is_int(value) and value > 0",
        "return isinstance(value, int) and value > 0",
        (_chk("spec.types.is_size"),),
    ),
    Plant(
        "spec_image_may_equal_slot_plus_one",
        "types.py",
        "if image_bytes > slot_bytes:",
        "if image_bytes > slot_bytes + 1:",
        (_chk("spec.types.spec_violation"),),
    ),
    Plant(
        "units_for_rounds_up_whole_multiples",
        "types.py",
        "return -(-image_bytes // page_unit_bytes)",
        "return image_bytes // page_unit_bytes + 1",
        (_chk("spec.types.units_for"),),
    ),
]


#: One off-by-one per diffbehavior pair of the Makefile, planted in the helper the
#: production store calls (the pair's production side), plus one that ``crosshair check``
#: must report from the helper's own contract. Each is one CrossHair run of a few seconds.
PRODUCTION_OFF_BY_ONE = [
    Plant(
        "changed_since_reads_one_bump_too_far_back",
        "changelog.py",
        "        if gen <= since:\n            break",
        "        if gen < since:\n            break",
        (_dif("changes"),),
    ),
    Plant(
        "units_available_needs_one_unit_more",
        "guards.py",
        "return count <= num_free + evictable_images * units_per_checkpoint",
        "return count < num_free + evictable_images * units_per_checkpoint",
        (_dif("units"),),
    ),
    Plant(
        "unpin_guard_last_at_two_pins",
        "guards.py",
        'return "last" if pin_count == 1 else "more"',
        'return "last" if pin_count == 2 else "more"',
        (_dif("guards"),),
    ),
    Plant(
        "is_evictable_with_one_pin",
        "guards.py",
        "return not is_protected and phase == READY and pin_count == 0",
        "return not is_protected and phase == READY and pin_count <= 1",
        (_dif("evictable"),),
    ),
    Plant(
        "forfeit_untrusted_watermark_exclusive",
        "guards.py",
        "return in_forfeited or (generation <= watermark and not live)",
        "return in_forfeited or (generation < watermark and not live)",
        (_dif("reclaimed"),),
    ),
    Plant(
        "units_available_needs_one_unit_more_check",
        "guards.py",
        "return count <= num_free + evictable_images * units_per_checkpoint",
        "return count < num_free + evictable_images * units_per_checkpoint",
        (_chk("spec.guards.units_available"),),
    ),
]


def _plant(plant: Plant, root: Path) -> Path:
    where = root / plant.name
    shutil.copytree(REPO / "spec", where / "spec", ignore=shutil.ignore_patterns("__pycache__"))
    path = where / "spec" / plant.file
    text = path.read_text()
    assert text.count(plant.old) == 1, f"{plant.name}: the text to replace is not unique"
    path.write_text(text.replace(plant.old, plant.new))
    return where


def _command(run: tuple[str, ...]) -> list[str]:
    return _check_cmd(run[1]) if run[0] == "check" else _diff_cmd(run[1], run[2])


def _reported(run: tuple[str, ...], result: subprocess.CompletedProcess[str]) -> bool:
    """Whether the run reported a counterexample (and not some other failure)."""
    out = result.stdout + result.stderr
    if run[0] == "check":
        assert result.returncode in (0, 1), out
        return result.returncode == 1 and ": error: " in out
    assert result.returncode in (0, 1), out
    return "Given: (" in out


Runs = dict[tuple[str, tuple[str, ...]], Future[subprocess.CompletedProcess[str]]]


@pytest.fixture(scope="module")
def crosshair_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """Every CrossHair run of this module, started at once on a pool of one worker per CPU
    (each run is one single-threaded process); tests wait on their own."""
    root = tmp_path_factory.mktemp("planted")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    jobs: list[tuple[tuple[str, tuple[str, ...]], list[str], Path]] = [
        (("real", ("check",)), _check_cmd(*CHECK_TARGETS), REPO),
        *((("real", ("diff", a, b)), _diff_cmd(a, b), REPO) for a, b in DIFF_PAIRS),
    ]
    for plant in PLANTS:
        where = _plant(plant, root)
        for run in plant.caught_by + plant.missed_by:
            jobs.append(((plant.name, run), _command(run), where))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        runs: Runs = {
            key: pool.submit(
                subprocess.run, cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600
            )
            for key, cmd, cwd in jobs
        }
        yield runs
        for f in runs.values():
            f.cancel()


def test_every_pair_has_a_production_off_by_one() -> None:
    pairs = {run[1:] for plant in PRODUCTION_OFF_BY_ONE for run in plant.caught_by}
    assert set(DIFF_PAIRS) <= pairs
    assert any(run[0] == "check" for p in PRODUCTION_OFF_BY_ONE for run in p.caught_by)


@pytest.mark.parametrize("plant", PRODUCTION_OFF_BY_ONE, ids=lambda p: p.name)
def test_off_by_one_in_a_production_helper_is_reported(plant: Plant, tmp_path: Path) -> None:
    """The planted copy of ``spec/`` is the code the production store would run; CrossHair,
    at the Makefile's bound, reports the difference from the reference's helper (or the
    broken contract) with a counterexample."""
    where = _plant(plant, tmp_path)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for run in plant.caught_by:
        result = subprocess.run(
            _command(run), cwd=where, env=env, capture_output=True, text=True, timeout=300
        )
        assert _reported(run, result), (
            f"{' '.join(run)} did not report {plant.name}:\n{result.stdout}{result.stderr}"
        )


def test_makefile_bounds_are_explicit() -> None:
    assert 50 <= EFFORT <= 200
    assert 50 <= DIFF_EFFORT <= 200
    assert {"spec.guards", "spec.changelog", "spec.types"} <= set(CHECK_TARGETS)
    assert len(DIFF_PAIRS) >= 5
    assert re.search(r"^check-only:.*(?:\n\t.*)*\n\t.*\bcontracts\b", _makefile(), re.MULTILINE)


@pytest.mark.slow
def test_real_contracts_hold(crosshair_runs: Runs) -> None:
    result = crosshair_runs[("real", ("check",))].result()
    assert result.returncode == 0, result.stdout + result.stderr
    assert ": error: " not in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("pair", DIFF_PAIRS, ids=lambda p: p[1].rsplit(".", 1)[1])
def test_real_pairs_agree(crosshair_runs: Runs, pair: tuple[str, str]) -> None:
    result = crosshair_runs[("real", ("diff", *pair))].result()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Given: (" not in result.stdout
    assert "No differences found" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.name)
def test_planted_bug_is_caught(crosshair_runs: Runs, plant: Plant) -> None:
    for run in plant.caught_by:
        result = crosshair_runs[(plant.name, run)].result()
        assert _reported(run, result), (
            f"{' '.join(run)} did not report {plant.name}:\n{result.stdout}{result.stderr}"
        )
        if run[0] == "check":
            assert result.returncode == 1
    for run in plant.missed_by:
        result = crosshair_runs[(plant.name, run)].result()
        assert not _reported(run, result), f"{' '.join(run)} now reports {plant.name}"
