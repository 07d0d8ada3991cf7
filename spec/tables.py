"""The law: one transition table per machine, as frozen data.

Each machine of SPEC section B is a table of rows
``(phase, event, guard outcome) -> (next phase, effects)``. The reference model
(:mod:`pagedstate.models.reference`) and the production store
(:mod:`pagedstate.impl`) move every record, operation, restore, lease, transfer
reservation and scratch slot only through :meth:`Table.step`, which raises
:class:`~pagedstate.spec.errors.IllegalTransitionError` naming the missing row.

Guard outcomes are short labels computed by the caller from the state (for
example ``"pinned"`` / ``"unpinned"``); ``"-"`` means the row has no guard.
Effects are descriptive data: the pin delta on the record, what happens to the
units (``reserve``, ``keep``, ``release``, ``rekey``) and to the hash index
(``add``, ``remove``, ``pending``, ``none``). The model applies exactly these
effects; the static checks in :mod:`pagedstate.spec.static` and the renderers in
:mod:`pagedstate.spec.render` read the same rows.

Sources: SPEC B.3 (record rows 1-24), B.4 (auxiliary machines), D.13, G3, G4, G5, G11.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import attrs

from .errors import IllegalTransitionError

__all__ = [
    "Row",
    "Table",
    "RECORD",
    "OFFLOAD",
    "RESTORE",
    "LEASE",
    "TRANSFER",
    "SCRATCH",
    "TABLES",
    "NO_GUARD",
]

NO_GUARD = "-"

UNIT_EFFECTS = frozenset({"reserve", "keep", "release", "rekey"})
INDEX_EFFECTS = frozenset({"add", "remove", "pending", "unpending", "none"})


@attrs.frozen
class Row:
    """One transition: in ``phase``, on ``event`` with guard outcome ``guard``, go to ``next``.

    ``pin_delta`` is the change of the record's pin count (-1, 0, +1); ``units`` what happens
    to the units the machine holds; ``index`` what happens to the hash index; ``note`` a short
    source reference (a SPEC row or section). A ``defensive`` row handles a state the public
    API cannot reach (SPEC says "reachable only by bypassing guards"): coverage reports list
    it apart, and a unit test reaches it by bypassing the guard.
    """

    phase: str
    event: str
    guard: str
    next: str
    pin_delta: int = 0
    units: str = "keep"
    index: str = "none"
    note: str = ""
    defensive: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        """``(phase, event, guard)``: the row's lookup key, unique within its table."""
        return (self.phase, self.event, self.guard)


@attrs.frozen
class Table:
    """A machine's transition table.

    Attributes:
        machine: the machine's name, used in errors and reports.
        phases: every phase, initial first.
        initial: the phase a new instance starts in.
        terminal: phases with no exits (an instance there is gone for good).
        events: every event the machine knows.
        rows: the transitions, in reading order.
    """

    machine: str
    phases: tuple[str, ...]
    initial: str
    terminal: frozenset[str]
    events: tuple[str, ...]
    rows: tuple[Row, ...]
    _by_key: Mapping[tuple[str, str, str], Row] = attrs.field(init=False, repr=False, eq=False)
    _ids: Mapping[tuple[str, str, str], int] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_key: dict[tuple[str, str, str], Row] = {}
        ids: dict[tuple[str, str, str], int] = {}
        for i, row in enumerate(self.rows):
            # Duplicate keys are a static-check failure (pagedstate.spec.static); the first
            # row wins here so a broken table can still be inspected.
            by_key.setdefault(row.key, row)
            ids.setdefault(row.key, i)
        object.__setattr__(self, "_by_key", MappingProxyType(by_key))
        object.__setattr__(self, "_ids", MappingProxyType(ids))

    def step(self, phase: str, event: str, guard: str = NO_GUARD) -> Row:
        """The row for ``(phase, event, guard)``.

        Contract: the row returned has ``row.key == (phase, event, guard)``, and a row is
        returned exactly when :meth:`has` is true. Over the real tables the domain is finite,
        so tests/test_contracts.py checks it exhaustively; ``make contracts`` checks it for
        the record table with the guard computed from a symbolic pin count
        (``pagedstate.spec.guards.check_record_step``). No ``post:`` lines here on purpose:
        CrossHair trusts a contracted callee when it analyses a caller (it may skip the
        body), and over a symbolic ``self`` it missed a planted bug at effort 100.

        Raises:
            IllegalTransitionError: the table has no such row; it names (machine, phase, event,
                guard). Nothing is changed by a failed step: the caller has not applied any
                effect yet.
        """
        row = self._by_key.get((phase, event, guard))
        if row is None:
            raise IllegalTransitionError(self.machine, phase, event, guard)
        return row

    def has(self, phase: str, event: str, guard: str = NO_GUARD) -> bool:
        """Whether a row exists for the key (no error)."""
        return (phase, event, guard) in self._by_key

    def row_id(self, row: Row) -> int:
        """Position of ``row`` in :attr:`rows` (stable; used for coverage reports)."""
        return self._ids[row.key]

    def label(self, row: Row) -> str:
        """``machine:phase+event[guard]->next``: the name coverage reports use for a row."""
        g = "" if row.guard == NO_GUARD else f"[{row.guard}]"
        return f"{self.machine}:{row.phase}+{row.event}{g}->{row.next}"


def _table(
    machine: str,
    phases: tuple[str, ...],
    terminal: tuple[str, ...],
    rows: list[Row],
) -> Table:
    events: list[str] = []
    for r in rows:
        if r.event not in events:
            events.append(r.event)
    return Table(
        machine=machine,
        phases=phases,
        initial=phases[0],
        terminal=frozenset(terminal),
        events=tuple(events),
        rows=tuple(rows),
    )


# ---------------------------------------------------------------------------
# Record lifecycle (SPEC B.2, B.3).
# Pin events are per pin kind: restore (queued, in flight or suspended: Q/I/S),
# offload (a reclaimable nomination handed out: O) and lease (an explicit,
# never-reclaimed source pin: O). Pins exist only on READY records (G11): there
# are no pin rows from COPYING or EVICTING, so pinning them raises.
# Guards: "pinned"/"unpinned" = pin_count > 0 / == 0 before the event;
# for unpin, "last"/"more" = the pin count after the event is 0 / > 0;
# for the host readers' pins (offload, lease), "settled"/"unsettled" = the copy that
# made the image is known done (its completion token reported done, or it had none).
# READY has two meanings (D.13): issued (same-stream readers: restores) and settled
# (host and other-stream readers too); there is no row for an unsettled host pin.
# ---------------------------------------------------------------------------
ABSENT, COPYING, READY, EVICTING, RELEASED = "ABSENT", "COPYING", "READY", "EVICTING", "RELEASED"

_record_rows: list[Row] = [
    Row(ABSENT, "begin_store", "-", COPYING, units="reserve", index="pending", note="B.3 row 1"),
    Row(ABSENT, "adopt", "-", READY, units="rekey", index="add", note="B.3 row 13"),
    Row(COPYING, "publish", "-", READY, index="add", note="B.3 row 2: READY only after the batch"),
    Row(
        COPYING,
        "dedup",
        "-",
        RELEASED,
        units="release",
        index="unpending",
        note="B.3 row 2, F.12: a READY image for h exists",
        defensive=True,
    ),
    Row(
        COPYING,
        "unindex",
        "-",
        EVICTING,
        index="unpending",
        note="B.3 row 10: units kept until the in-flight store drains",
    ),
    Row(COPYING, "clear", "-", EVICTING, index="unpending", note="B.3 row 11"),
    Row(
        EVICTING,
        "publish",
        "unpinned",
        RELEASED,
        units="release",
        note="B.3 row 2, G11: release on completion checks pin_count == 0",
    ),
    Row(EVICTING, "clear", "-", EVICTING, note="B.3 row 11: already unfindable"),
    Row(READY, "unindex", "unpinned", RELEASED, units="release", index="remove", note="B.3 row 10"),
    Row(
        READY,
        "unindex",
        "pinned",
        EVICTING,
        index="remove",
        note="B.3 row 10: freed when the last pin drops",
    ),
    Row(READY, "clear", "unpinned", RELEASED, units="release", index="remove", note="B.3 row 11"),
    Row(READY, "clear", "pinned", EVICTING, index="remove", note="B.3 row 11"),
    Row(
        READY,
        "evict",
        "unpinned",
        RELEASED,
        units="release",
        index="remove",
        note="B.3 row 12: the only path counted as an eviction",
    ),
    Row(READY, "pin_restore", "-", READY, pin_delta=+1, note="B.3 row 4 (Q)"),
    Row(
        READY,
        "pin_offload",
        "settled",
        READY,
        pin_delta=+1,
        note="B.3 rows 15, 17 (O, reclaimable), D.13: a host reader needs a settled image",
    ),
    Row(
        READY,
        "pin_lease",
        "settled",
        READY,
        pin_delta=+1,
        note="B.3 rows 16, 17 (O, lease), D.13: a host reader needs a settled image",
    ),
    Row(READY, "unpin_restore", "-", READY, pin_delta=-1, note="B.3 rows 3, 6, 9"),
    Row(READY, "unpin_offload", "-", READY, pin_delta=-1, note="B.3 rows 18, 19, 21"),
    Row(READY, "unpin_lease", "-", READY, pin_delta=-1, note="B.3 rows 18, 19"),
    Row(EVICTING, "unpin_restore", "more", EVICTING, pin_delta=-1, note="B.3 rows 3, 6, 9"),
    Row(
        EVICTING,
        "unpin_restore",
        "last",
        RELEASED,
        pin_delta=-1,
        units="release",
        note="B.3 rows 3, 6, 9: EVICTING with no pin is released at once (C.9)",
    ),
    Row(EVICTING, "unpin_offload", "more", EVICTING, pin_delta=-1, note="B.3 rows 18, 19, 21"),
    Row(
        EVICTING,
        "unpin_offload",
        "last",
        RELEASED,
        pin_delta=-1,
        units="release",
        note="B.3 rows 18, 19, 21",
    ),
    Row(EVICTING, "unpin_lease", "more", EVICTING, pin_delta=-1, note="B.3 rows 18, 19"),
    Row(
        EVICTING,
        "unpin_lease",
        "last",
        RELEASED,
        pin_delta=-1,
        units="release",
        note="B.3 rows 18, 19",
    ),
    Row(
        READY,
        "settle",
        "-",
        READY,
        note="B.3 row 24, D.13: its batch's completion token reported done",
    ),
    Row(
        EVICTING,
        "settle",
        "-",
        EVICTING,
        note="B.3 row 24, D.13: settled while unfindable (its pins still hold it)",
    ),
]

RECORD = _table("record", (ABSENT, COPYING, READY, EVICTING, RELEASED), (RELEASED,), _record_rows)

# ---------------------------------------------------------------------------
# Offload store / lease operation (SPEC B.4): a key of the store's offload pins.
# "reclaimable" guards the timeout reclaim: leases (acquire) are never reclaimed.
# ---------------------------------------------------------------------------
OP_NONE, PINNED, SOURCE_RELEASED = "NONE", "PINNED", "SOURCE_RELEASED"
SETTLED, RECLAIMED, LOST_REPORT = "SETTLED", "RECLAIMED", "LOST_REPORT"

OFFLOAD = _table(
    "offload",
    (OP_NONE, PINNED, SOURCE_RELEASED, SETTLED, RECLAIMED, LOST_REPORT),
    (SETTLED, RECLAIMED, LOST_REPORT),
    [
        Row(OP_NONE, "take", "-", PINNED, pin_delta=+1, note="B.3 row 15: nomination handed out"),
        Row(OP_NONE, "acquire", "-", PINNED, pin_delta=+1, note="B.3 row 16: explicit lease"),
        Row(
            PINNED,
            "release_source",
            "-",
            SOURCE_RELEASED,
            pin_delta=-1,
            note="B.3 row 18: the op stays until its report",
        ),
        Row(SOURCE_RELEASED, "release_source", "-", SOURCE_RELEASED, note="B.3 row 18: idempotent"),
        Row(
            PINNED,
            "settle",
            "-",
            SETTLED,
            pin_delta=-1,
            note="B.3 row 19: one-phase terminal (failure or cancel)",
        ),
        Row(SOURCE_RELEASED, "settle", "-", SETTLED, note="B.3 row 19"),
        Row(
            PINNED,
            "reclaim",
            "reclaimable",
            RECLAIMED,
            pin_delta=-1,
            note="B.3 row 21: forfeited, remembered (G7)",
        ),
        Row(
            SOURCE_RELEASED,
            "reclaim",
            "reclaimable",
            LOST_REPORT,
            note="B.3 row 21: bytes were read; a late ok report may index",
        ),
    ],
)

# ---------------------------------------------------------------------------
# A restore (SPEC B.3 rows 3-9, G4). Slot exclusivity (G4) is checked before
# begin_restore and resume: a busy slot raises SlotBusyError.
# ---------------------------------------------------------------------------
R_NONE, QUEUED, IN_FLIGHT, SUSPENDED, DONE, CANCELLED = (
    "NONE",
    "QUEUED",
    "IN_FLIGHT",
    "SUSPENDED",
    "DONE",
    "CANCELLED",
)

RESTORE = _table(
    "restore",
    (R_NONE, QUEUED, IN_FLIGHT, SUSPENDED, DONE, CANCELLED),
    (DONE, CANCELLED),
    [
        Row(R_NONE, "begin_restore", "-", QUEUED, pin_delta=+1, note="B.3 row 4"),
        Row(QUEUED, "take", "-", IN_FLIGHT, note="B.3 row 5: only a drain on a non-empty batch"),
        Row(IN_FLIGHT, "complete", "-", DONE, pin_delta=-1, note="B.3 row 3"),
        Row(QUEUED, "cancel", "-", CANCELLED, pin_delta=-1, note="B.3 row 6"),
        Row(QUEUED, "suspend", "-", SUSPENDED, note="B.3 row 7: pin kept (Q -> S)"),
        Row(SUSPENDED, "resume", "-", QUEUED, note="B.3 row 8 (S -> Q)"),
        Row(SUSPENDED, "release", "-", DONE, pin_delta=-1, note="B.3 row 9"),
    ],
)

# ---------------------------------------------------------------------------
# The single-use lease a suspend hands out (SPEC G3).
# ---------------------------------------------------------------------------
L_NONE, LIVE, RESUMED, L_RELEASED = "NONE", "LIVE", "RESUMED", "RELEASED"

LEASE = _table(
    "lease",
    (L_NONE, LIVE, RESUMED, L_RELEASED),
    (RESUMED, L_RELEASED),
    [
        Row(L_NONE, "suspend", "-", LIVE, note="B.3 row 7"),
        Row(LIVE, "resume", "-", RESUMED, note="B.3 row 8, G3: spent"),
        Row(LIVE, "release", "-", L_RELEASED, note="B.3 row 9, G3: spent"),
    ],
)

# ---------------------------------------------------------------------------
# Transfer reservation (SPEC B.4, D.1 step 12).
# ---------------------------------------------------------------------------
T_NONE, RESERVED, T_RELEASED, ADOPTED, DEDUPED = (
    "NONE",
    "RESERVED",
    "RELEASED",
    "ADOPTED",
    "DEDUPED",
)

TRANSFER = _table(
    "transfer",
    (T_NONE, RESERVED, T_RELEASED, ADOPTED, DEDUPED),
    (T_RELEASED, ADOPTED, DEDUPED),
    [
        Row(T_NONE, "reserve", "-", RESERVED, units="reserve", note="D.1 step 12"),
        Row(RESERVED, "release", "-", T_RELEASED, units="release", note="D.1 step 12"),
        Row(
            RESERVED,
            "adopt",
            "fresh",
            ADOPTED,
            units="rekey",
            index="add",
            note="B.3 row 13: becomes a READY record, no free window",
        ),
        Row(
            RESERVED,
            "adopt",
            "duplicate",
            DEDUPED,
            units="release",
            note="B.3 row 13: the hash is READY or pending; incoming units freed",
        ),
    ],
)

# ---------------------------------------------------------------------------
# Midstep scratch slot (SPEC B.4, D.1 steps 4-6, G5). A slot cycles forever:
# no terminal phase.
# ---------------------------------------------------------------------------
FREE, S_RESERVED, S_QUEUED, ISSUED = "FREE", "RESERVED", "QUEUED", "ISSUED"

SCRATCH = _table(
    "scratch",
    (FREE, S_RESERVED, S_QUEUED, ISSUED),
    (),
    [
        Row(FREE, "reserve", "-", S_RESERVED, note="D.1 step 4"),
        Row(S_RESERVED, "cancel", "-", FREE, note="D.1 step 4"),
        Row(S_RESERVED, "publish", "-", S_QUEUED, note="D.1 step 5"),
        Row(S_QUEUED, "issue", "begun", ISSUED, note="D.1 step 6.3"),
        Row(S_QUEUED, "issue", "refused", FREE, note="D.1 step 6.3: counted as dropped"),
        Row(S_QUEUED, "issue", "over_budget", S_QUEUED, note="D.1 step 6.3: stays queued"),
        Row(S_QUEUED, "orphan", "-", FREE, note="G5: its hash was unindexed or cleared"),
        Row(ISSUED, "complete", "-", FREE, note="D.1 step 1"),
    ],
)

#: Every table, by machine name.
TABLES: Mapping[str, Table] = MappingProxyType(
    {t.machine: t for t in (RECORD, OFFLOAD, RESTORE, LEASE, TRANSFER, SCRATCH)}
)
