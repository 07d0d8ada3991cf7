"""Static checks of the transition tables (SPEC H.1) and ``Table.step``.

Every check of :data:`pagedstate.spec.static.CHECKS` passes on every real table, and for each
check a table with one planted bug makes exactly that check (and no other) report a problem,
so each check is shown able to fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from pagedstate.spec import RECORD, SCRATCH, TABLES, IllegalTransitionError, Row, Table
from pagedstate.spec.static import (
    CHECKS,
    check_all,
    check_deterministic,
    check_events_used,
    check_host_pins_settled,
    check_no_traps,
    check_reachable,
    check_terminal_exits,
    check_well_formed,
)

REPO = Path(__file__).resolve().parents[1]

Check = Callable[[Table], list[str]]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("machine", list(TABLES))
def test_every_check_passes_on_every_table(machine: str, check: Check) -> None:
    assert check(TABLES[machine]) == []


def test_check_all_is_clean() -> None:
    assert check_all() == []


# -- planted bugs -------------------------------------------------------------------------


def _with_rows(table: Table, *extra: Row, **changes: Any) -> Table:
    """``table`` with ``extra`` rows appended (and other fields changed)."""
    return attrs.evolve(table, rows=table.rows + extra, **changes)


def _replace_row(table: Table, position: int, /, **changes: Any) -> Table:
    """``table`` with the row at ``position`` changed."""
    rows = list(table.rows)
    rows[position] = attrs.evolve(rows[position], **changes)
    return attrs.evolve(table, rows=tuple(rows))


def _row_index(table: Table, phase: str, event: str, guard: str = "-") -> int:
    return table.row_id(table.step(phase, event, guard))


_PIN_RESTORE = _row_index(RECORD, "READY", "pin_restore")
_PIN_OFFLOAD = _row_index(RECORD, "READY", "pin_offload", "settled")

# (id, planted table, the one check that must report, a fragment of its message)
PLANTED: list[tuple[str, Table, Check, str]] = [
    (
        "duplicate key",
        _with_rows(RECORD, Row("READY", "evict", "unpinned", "EVICTING", index="remove")),
        check_deterministic,
        "share key ('READY', 'evict', 'unpinned')",
    ),
    (
        "unguarded row beside guarded ones",
        _with_rows(RECORD, Row("READY", "evict", "-", "RELEASED", units="release")),
        check_deterministic,
        "READY+evict has both an unguarded and guarded rows",
    ),
    (
        "unreachable phase",
        _with_rows(
            RECORD,
            Row("LIMBO", "clear", "-", "RELEASED", units="release"),
            phases=RECORD.phases + ("LIMBO",),
        ),
        check_reachable,
        "phase LIMBO is unreachable from ABSENT",
    ),
    (
        "trap phase (no exit)",
        _with_rows(
            RECORD,
            Row("READY", "evict", "pinned", "STUCK", index="remove"),
            phases=RECORD.phases + ("STUCK",),
        ),
        check_no_traps,
        "phase STUCK is a trap (no exit)",
    ),
    (
        "trap phase (only a self-loop)",
        _with_rows(
            RECORD,
            Row("READY", "evict", "pinned", "STUCK", index="remove"),
            Row("STUCK", "clear", "-", "STUCK"),
            phases=RECORD.phases + ("STUCK",),
        ),
        check_no_traps,
        "phase STUCK is a trap (no exit)",
    ),
    (
        "cycle that never returns (no terminal phase)",
        _with_rows(
            SCRATCH,
            Row("ISSUED", "orphan", "-", "LOST_A"),
            Row("LOST_A", "complete", "-", "LOST_B"),
            Row("LOST_B", "complete", "-", "LOST_A"),
            phases=SCRATCH.phases + ("LOST_A", "LOST_B"),
        ),
        check_no_traps,
        "from LOST_A no phase of ['FREE'] is reachable",
    ),
    (
        "exit from a terminal phase",
        _with_rows(RECORD, Row("RELEASED", "adopt", "-", "READY", units="rekey", index="add")),
        check_terminal_exits,
        "terminal phase RELEASED has an exit on adopt",
    ),
    (
        "unused declared event",
        attrs.evolve(RECORD, events=RECORD.events + ("resurrect",)),
        check_events_used,
        "event resurrect is never used",
    ),
    (
        "unknown next phase",
        _replace_row(RECORD, _PIN_RESTORE, next="PINNED"),
        check_well_formed,
        "unknown next phase PINNED",
    ),
    (
        "unknown phase",
        _with_rows(RECORD, Row("GONE", "clear", "-", "RELEASED")),
        check_well_formed,
        "unknown phase GONE",
    ),
    (
        "undeclared event",
        _with_rows(RECORD, Row("READY", "touch", "-", "READY")),
        check_well_formed,
        "undeclared event touch",
    ),
    (
        "unknown unit effect",
        _replace_row(RECORD, _PIN_RESTORE, units="leak"),
        check_well_formed,
        "unknown unit effect leak",
    ),
    (
        "unknown index effect",
        _replace_row(RECORD, _PIN_RESTORE, index="forget"),
        check_well_formed,
        "unknown index effect forget",
    ),
    (
        "pin delta out of range",
        _replace_row(RECORD, _PIN_RESTORE, pin_delta=2),
        check_well_formed,
        "pin delta 2 not in -1, 0, +1",
    ),
    (
        "empty guard label",
        _with_rows(RECORD, Row("READY", "evict", "", "RELEASED", units="release")),
        check_well_formed,
        "empty guard label",
    ),
    (
        "host pin without the settled guard",
        _replace_row(RECORD, _PIN_OFFLOAD, guard="-"),
        check_host_pins_settled,
        "a host reader's pin must be guarded 'settled'",
    ),
    (
        "undeclared terminal phase",
        attrs.evolve(RECORD, terminal=RECORD.terminal | {"VANISHED"}),
        check_well_formed,
        "terminal phase VANISHED is not declared",
    ),
]


@pytest.mark.parametrize(
    ("table", "check", "fragment"),
    [case[1:] for case in PLANTED],
    ids=[case[0] for case in PLANTED],
)
def test_planted_bug_is_caught_by_exactly_its_check(
    table: Table, check: Check, fragment: str
) -> None:
    reports = {c.__name__: c(table) for c in CHECKS}
    firing = sorted(name for name, problems in reports.items() if problems)
    assert firing == [check.__name__], reports
    assert any(fragment in p for p in reports[check.__name__]), reports[check.__name__]


def test_every_check_has_a_planted_bug() -> None:
    planted = {case[2] for case in PLANTED}
    missing = [c.__name__ for c in CHECKS if c not in planted]
    assert missing == [], f"no planted bug shows these checks can fail: {missing}"


# -- Table.step ----------------------------------------------------------------------------


@pytest.mark.parametrize("machine", list(TABLES))
def test_step_returns_the_row_of_every_key(machine: str) -> None:
    table = TABLES[machine]
    for row in table.rows:
        assert table.step(row.phase, row.event, row.guard) is row
        assert table.has(row.phase, row.event, row.guard)


def test_step_returns_the_existing_record_row() -> None:
    row = RECORD.step("ABSENT", "begin_store")
    assert (row.next, row.units, row.index) == ("COPYING", "reserve", "pending")
    assert RECORD.step("READY", "evict", "unpinned").next == "RELEASED"


@pytest.mark.parametrize(
    ("phase", "event", "guard"),
    [
        ("READY", "evict", "pinned"),  # B.3 row 12: a pinned record is not evictable
        ("COPYING", "pin_restore", "-"),  # G11: pins only on READY records
        ("RELEASED", "publish", "-"),  # terminal
        ("READY", "unindex", "-"),  # the rows are guarded: a missing guard is no row
        ("READY", "no_such_event", "-"),
    ],
)
def test_step_raises_for_a_missing_row(phase: str, event: str, guard: str) -> None:
    assert not RECORD.has(phase, event, guard)
    with pytest.raises(IllegalTransitionError) as info:
        RECORD.step(phase, event, guard)
    err = info.value
    assert (err.machine, err.phase, err.event, err.guard) == ("record", phase, event, guard)
    assert isinstance(err, AssertionError)
    assert f"no transition from {phase} on {event}" in str(err)


# -- python -m pagedstate.spec.static --------------------------------------------------------


def test_static_module_exits_zero() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pagedstate.spec.static"],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "static table checks: ok" in proc.stdout
