"""The verdict on a log: :class:`CheckResult` (status, the line it is about, the fields that
differ there as :class:`Difference`, the text ``pagedstate check-log`` prints) and the exit
status per status; the two exceptions a line's reading raises to end in a verdict."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------------------

#: Exit status of ``pagedstate check-log`` per status.
EXIT_CODES = {"matched": 0, "mismatch": 1, "incomplete": 1, "unreadable": 2, "unsupported": 2}


@dataclass(frozen=True)
class Difference:
    """One field of a call line where the reference and the log disagree (JSON-ready)."""

    field: str
    expected: Any
    logged: Any

    def text(self) -> str:
        return f"{self.field}: reference {_dump(self.expected)}, log {_dump(self.logged)}"


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one log.

    Attributes:
        status: ``matched`` (every line consumed and agreed, footer included),
            ``mismatch`` (first disagreement at ``line``), ``incomplete`` (the log ends
            without its footer after ``line - 1`` lines), ``unreadable`` (``line`` cannot be
            parsed) or ``unsupported`` (``line`` uses what the reference model lacks).
        lines: lines read.
        calls: call lines replayed and matched.
        line: the line the verdict is about (1-based), None for ``matched``.
        call: that line's call name, when it has one.
        reason: one sentence.
        differences: for ``mismatch`` on a call line, every field that differs there.
        stopped: the footer's ``stopped`` field (``"max_lines"``: the run went on unlogged).
    """

    status: str
    lines: int
    calls: int
    line: int | None = None
    call: str | None = None
    reason: str = ""
    differences: tuple[Difference, ...] = ()
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "matched"

    @property
    def exit_code(self) -> int:
        """0 matched; 1 mismatch or incomplete; 2 unreadable or unsupported."""
        return EXIT_CODES[self.status]

    def text(self) -> str:
        """The verdict as ``pagedstate check-log`` prints it."""
        if self.ok:
            out = (
                f"check-log: MATCHED: {_count(self.lines, 'line')} read,"
                f" {_count(self.calls, 'call')} replayed on"
                " the reference model; every result, row, clock reading, outside answer and"
                " state counter agrees"
            )
            if self.reason:
                out += f"\ncheck-log: note: {self.reason}"
            if self.stopped is not None:
                out += (
                    f"\ncheck-log: note: logging stopped at {self.stopped} after {self.calls}"
                    " calls; the run went on unlogged and what followed is not checked"
                )
            return out
        where = f"line {self.line}" + (f" ({self.call})" if self.call else "")
        head = f"check-log: {self.status.upper()} at {where}: {self.reason}"
        body = [f"  {d.text()}" for d in self.differences]
        tail = (
            f"  ({_count(self.lines, 'line')} read; {_count(self.calls, 'call')} matched before it)"
        )
        return "\n".join([head, *body, tail])


def _count(n: int, noun: str) -> str:
    """``1 line``, ``2 lines``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


class _Unreadable(Exception):
    pass


class _Unsupported(Exception):
    pass


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
