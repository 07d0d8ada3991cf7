"""Static checks of the transition tables (SPEC H.1).

Each check returns a list of problems (empty when the table is sound), so tests can
assert on them and planted-bug tests can show each check failing. ``python -m
pagedstate.spec.static`` runs them all and exits 1 on any problem.

Checks: one row per key (determinism); every phase reachable from the initial one;
no trap phases (a non-terminal phase with no exit); terminal phases have no exits;
every declared event is used by some row; rows name only declared phases; effects
use the known vocabulary; pin deltas are -1, 0 or +1; a pin that a host or other-stream
reader takes (offload, lease) exists only for a settled image (SPEC D.13).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

from .tables import INDEX_EFFECTS, TABLES, UNIT_EFFECTS, Table

__all__ = [
    "check_deterministic",
    "check_reachable",
    "check_no_traps",
    "check_terminal_exits",
    "check_events_used",
    "check_well_formed",
    "check_host_pins_settled",
    "HOST_PIN_EVENTS",
    "CHECKS",
    "check_table",
    "check_all",
    "main",
]


def check_deterministic(t: Table) -> list[str]:
    """One row per ``(phase, event, guard)`` key, and a guard-free row never shares its
    ``(phase, event)`` with a guarded one."""
    problems: list[str] = []
    seen: dict[tuple[str, str, str], int] = {}
    guards: dict[tuple[str, str], set[str]] = {}
    for i, r in enumerate(t.rows):
        if r.key in seen:
            problems.append(f"{t.machine}: rows {seen[r.key]} and {i} share key {r.key}")
        seen.setdefault(r.key, i)
        guards.setdefault((r.phase, r.event), set()).add(r.guard)
    for (phase, event), gs in guards.items():
        if "-" in gs and len(gs) > 1:
            problems.append(f"{t.machine}: {phase}+{event} has both an unguarded and guarded rows")
    return problems


def _reachable(t: Table) -> set[str]:
    seen = {t.initial}
    frontier = [t.initial]
    while frontier:
        p = frontier.pop()
        for r in t.rows:
            if r.phase == p and r.next not in seen:
                seen.add(r.next)
                frontier.append(r.next)
    return seen


def check_reachable(t: Table) -> list[str]:
    """Every phase is reachable from the initial phase."""
    seen = _reachable(t)
    return [
        f"{t.machine}: phase {p} is unreachable from {t.initial}" for p in t.phases if p not in seen
    ]


def check_no_traps(t: Table) -> list[str]:
    """Every non-terminal phase has at least one exit to another phase, and from every
    phase some terminal phase (or, for a machine with none, the initial one) is reachable."""
    problems = []
    goal = set(t.terminal) if t.terminal else {t.initial}
    for p in t.phases:
        if p in t.terminal:
            continue
        exits = [r for r in t.rows if r.phase == p and r.next != p]
        if not exits:
            problems.append(f"{t.machine}: phase {p} is a trap (no exit)")
            continue
        # Can p get to the goal set?
        seen = {p}
        frontier = [p]
        while frontier:
            q = frontier.pop()
            for r in t.rows:
                if r.phase == q and r.next not in seen:
                    seen.add(r.next)
                    frontier.append(r.next)
        if not (seen & goal) and p not in goal:
            problems.append(f"{t.machine}: from {p} no phase of {sorted(goal)} is reachable")
    return problems


def check_terminal_exits(t: Table) -> list[str]:
    """Terminal phases have no rows at all."""
    return [
        f"{t.machine}: terminal phase {r.phase} has an exit on {r.event}"
        for r in t.rows
        if r.phase in t.terminal
    ]


def check_events_used(t: Table) -> list[str]:
    """Every declared event appears in some row."""
    used = {r.event for r in t.rows}
    return [f"{t.machine}: event {e} is never used" for e in t.events if e not in used]


def check_well_formed(t: Table) -> list[str]:
    """Rows name declared phases and events, effects come from the known vocabulary, pin
    deltas are -1, 0 or +1, the initial phase is declared and not terminal."""
    problems = []
    phases = set(t.phases)
    if t.initial not in phases:
        problems.append(f"{t.machine}: initial phase {t.initial} is not declared")
    if t.initial in t.terminal:
        problems.append(f"{t.machine}: initial phase {t.initial} is terminal")
    for p in t.terminal:
        if p not in phases:
            problems.append(f"{t.machine}: terminal phase {p} is not declared")
    for i, r in enumerate(t.rows):
        where = f"{t.machine} row {i} ({r.phase}+{r.event})"
        if r.phase not in phases:
            problems.append(f"{where}: unknown phase {r.phase}")
        if r.next not in phases:
            problems.append(f"{where}: unknown next phase {r.next}")
        if r.event not in t.events:
            problems.append(f"{where}: undeclared event {r.event}")
        if r.pin_delta not in (-1, 0, 1):
            problems.append(f"{where}: pin delta {r.pin_delta} not in -1, 0, +1")
        if r.units not in UNIT_EFFECTS:
            problems.append(f"{where}: unknown unit effect {r.units}")
        if r.index not in INDEX_EFFECTS:
            problems.append(f"{where}: unknown index effect {r.index}")
        if not r.guard:
            problems.append(f"{where}: empty guard label (use '-')")
    return problems


#: The record events by which a host or other-stream reader pins an image (SPEC D.13).
HOST_PIN_EVENTS = frozenset({"pin_offload", "pin_lease"})


def check_host_pins_settled(t: Table) -> list[str]:
    """The record table's two READY meanings (SPEC D.13): every row by which a host or
    other-stream reader pins an image carries the ``settled`` guard, so an image whose copy
    may still be running has no such row; and a settle row exists for each phase a
    published record can be in (READY, EVICTING). Other tables pass trivially."""
    if t.machine != "record":
        return []
    problems = [
        f"record row {i} ({r.phase}+{r.event}[{r.guard}]): a host reader's pin must be"
        " guarded 'settled'"
        for i, r in enumerate(t.rows)
        if r.event in HOST_PIN_EVENTS and r.guard != "settled"
    ]
    settles = {r.phase for r in t.rows if r.event == "settle"}
    problems += [
        f"record: no settle row from {phase}" for phase in ("READY", "EVICTING")
        if phase not in settles
    ]
    return problems


CHECKS: tuple[Callable[[Table], list[str]], ...] = (
    check_well_formed,
    check_host_pins_settled,
    check_deterministic,
    check_reachable,
    check_no_traps,
    check_terminal_exits,
    check_events_used,
)


def check_table(t: Table) -> list[str]:
    """Every static check on one table."""
    out: list[str] = []
    for check in CHECKS:
        out.extend(check(t))
    return out


def check_all(tables: Iterable[Table] | None = None) -> list[str]:
    """Every static check on every table (default: all of :data:`TABLES`)."""
    out: list[str] = []
    for t in tables if tables is not None else TABLES.values():
        out.extend(check_table(t))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print a line per table and every problem; exit status 1 if any."""
    del argv
    problems = check_all()
    for t in TABLES.values():
        print(
            f"{t.machine:9s} {len(t.phases)} phases, {len(t.events)} events, {len(t.rows)} rows:"
            f" {'ok' if not check_table(t) else 'PROBLEMS'}"
        )
    for p in problems:
        print("  " + p)
    print("static table checks:", "ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
