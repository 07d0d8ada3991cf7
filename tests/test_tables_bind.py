"""The tables' ``next`` column binds the reference model for every machine, not only the
record machine: plant a wrong next phase in one row of an auxiliary table and the explorer
stops on a table violation the first time that row is taken. (Before the model checked
it, a scratch ``over_budget`` row moved to FREE went unnoticed.)
"""

from __future__ import annotations

import attrs
import pytest

from pagedstate.models.explorer import explore
from pagedstate.spec import tables as T

# (machine, phase, event, guard, planted next)
PLANTED = [
    ("scratch", "QUEUED", "issue", "over_budget", "FREE"),
    ("restore", "QUEUED", "cancel", "-", "DONE"),
    ("offload", "PINNED", "reclaim", "reclaimable", "LOST_REPORT"),
    ("transfer", "RESERVED", "adopt", "duplicate", "ADOPTED"),
    ("lease", "LIVE", "resume", "-", "RELEASED"),
]

_ATTR = {"scratch": "SCRATCH", "restore": "RESTORE", "offload": "OFFLOAD",
         "transfer": "TRANSFER", "lease": "LEASE"}


@pytest.mark.parametrize("machine,phase,event,guard,wrong", PLANTED)
def test_wrong_next_phase_is_caught(
    monkeypatch: pytest.MonkeyPatch, machine: str, phase: str, event: str, guard: str, wrong: str
) -> None:
    table = getattr(T, _ATTR[machine])
    rows = tuple(
        attrs.evolve(r, next=wrong) if r.key == (phase, event, guard) else r for r in table.rows
    )
    assert rows != table.rows
    planted = attrs.evolve(table, rows=rows)
    monkeypatch.setattr(T, _ATTR[machine], planted)
    report = explore("tiny", max_states=30_000, check_drain=False)
    v = report.violation
    assert v is not None, f"{machine} {phase}+{event}[{guard}] -> {wrong} went unnoticed"
    assert (v.kind, v.name) == ("Table", "IllegalTransitionError")
    assert f"the table says {wrong}" in v.message


def test_the_real_tables_pass() -> None:
    assert explore("tiny", max_states=3_000, check_drain=False).violation is None
