"""Checking a log: :func:`check_log` reads its lines (text or bytes, JSON objects; the
header first, the call lines, the footer last), replays each call line and returns the
verdict; :func:`check_file` does it over a file or standard input."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .replay import _field, _Replay
from .verdict import CheckResult, Difference, _Unreadable, _Unsupported

# ---------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------


class _RepeatedKey(ValueError):
    """A JSON object names a key twice (json keeps the last silently)."""


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def check_log(lines: Iterable[str | bytes], *, require_footer: bool = True) -> CheckResult:
    """Replay a log's lines on the reference model and return the verdict (see the module
    docstring). ``lines`` may be a file opened in text or binary mode; trailing newlines
    are ignored. ``require_footer=False`` accepts a log that ends without its footer (a run
    still writing) as a match of what it holds; the verdict still says how far it got.
    Never raises for bad input: every problem is a verdict naming its line."""
    replay: _Replay | None = None
    calls = 0
    lineno = 0
    cut: int | None = None  # the half-written last line of a log still being written
    cut_why = ""
    footer: dict[str, Any] | None = None
    for raw in lines:
        if cut is not None:  # a line after the one taken for half-written: it was not
            return CheckResult("unreadable", cut, calls, cut, None, cut_why)
        lineno += 1
        call: str | None = None
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            # only the last line can lack its newline: one a running engine is writing
            unterminated = not text.endswith("\n")
            being_written = not require_footer and unterminated
            text = text.rstrip("\r\n")
            if not text.strip():
                raise _Unreadable("a blank line")
            try:
                obj = json.loads(text, object_pairs_hook=_no_repeated_keys)
            except _RepeatedKey as exc:
                raise _Unreadable(f"a key repeats in one object: {exc.args[0]!r}") from None
            except json.JSONDecodeError as exc:
                if being_written and replay is not None and cut is None:
                    # the last line, unless another comes (then it is reported as is)
                    cut, cut_why = lineno, f"not JSON: {exc.msg} (column {exc.colno})"
                    continue
                hint = ""
                if unterminated and replay is not None:
                    hint = (
                        "; it has no newline: if the log was cut off while being written,"
                        " --allow-unclosed checks the lines before it"
                    )
                raise _Unreadable(f"not JSON: {exc.msg} (column {exc.colno}){hint}") from exc
            except ValueError as exc:  # e.g. an int past Python's digit limit
                raise _Unreadable(f"not readable JSON ({exc})") from exc
            except RecursionError as exc:
                raise _Unreadable("JSON nested too deep to read") from exc
            if not isinstance(obj, dict):
                raise _Unreadable(f"a line must be a JSON object, got {type(obj).__name__}")
            if isinstance(obj.get("call"), str):
                call = obj["call"]
            if footer is not None:
                return CheckResult(
                    "mismatch",
                    lineno,
                    calls,
                    lineno,
                    call,
                    "a line after the footer (the footer closes the log)",
                )
            if replay is None:
                replay = _Replay(obj)
                continue
            if obj.get("kind") == "footer":
                count = _field(obj, "calls", int, "the footer")
                if count != calls:
                    return CheckResult(
                        "mismatch",
                        lineno,
                        calls,
                        lineno,
                        None,
                        f"the footer counts {count} calls; the log holds {calls} call lines",
                        (Difference("calls", calls, count),),
                    )
                footer = obj
                continue
            if "kind" in obj:
                raise _Unreadable(f"unknown line kind {obj['kind']!r}")
            diffs = replay.replay(obj, calls + 1)
        except UnicodeDecodeError as exc:
            return CheckResult(
                "unreadable", lineno, calls, lineno, None, f"not UTF-8 ({exc.reason})"
            )
        except _Unreadable as exc:
            hint = ""
            if replay is None and lineno == 1:
                hint = " (an event log starts with its header line)"
            return CheckResult("unreadable", lineno, calls, lineno, call, f"{exc}{hint}")
        except _Unsupported as exc:
            return CheckResult("unsupported", lineno, calls, lineno, call, str(exc))
        if diffs:
            return CheckResult(
                "mismatch",
                lineno,
                calls,
                lineno,
                call,
                "the reference model disagrees with the logged call",
                diffs,
            )
        calls += 1
    if replay is None:
        return CheckResult(
            "unreadable", lineno, 0, lineno + 1, None, "the log is empty: no header line"
        )
    if footer is None:
        if not require_footer:
            note = "the log has no footer (accepted): only the lines it holds are checked"
            if cut is not None:
                note += f"; its last line, {cut}, is cut off (still being written): not checked"
            return CheckResult("matched", lineno, calls, None, None, note)
        return CheckResult(
            "incomplete",
            lineno,
            calls,
            lineno + 1,
            None,
            f"the log ends after line {lineno} without its footer: the run did not close it"
            " (crashed, killed, or still writing), so calls after the last line may be missing",
        )
    stopped = footer.get("stopped")
    return CheckResult(
        "matched", lineno, calls, None, None, "", (), stopped if isinstance(stopped, str) else None
    )


def check_file(path: str, *, require_footer: bool = True) -> CheckResult:
    """:func:`check_log` over a file (``-``: standard input).

    Raises:
        OSError: the file cannot be opened.
    """
    import sys

    if path == "-":
        return check_log(sys.stdin.buffer, require_footer=require_footer)
    with open(path, "rb") as fh:
        return check_log(fh, require_footer=require_footer)
