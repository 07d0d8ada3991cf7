"""``pagedstate check-log``: replay a production event log on the reference model."""

from __future__ import annotations

import argparse
from typing import Any

from ._args import UsageError


def _run_check_log(args: argparse.Namespace) -> int:
    """``pagedstate check-log FILE``: replay an event log on the reference model.

    Prints the verdict. Returns 0 when every line matched and the log ends with its footer;
    1 at the first disagreement (printed with every field that differs) or when the log
    has no footer; 2 when a line cannot be parsed or replayed (the message names the line).

    Raises:
        UsageError: the file cannot be read (``main`` reports it and returns 2).
    """
    from pagedstate.models.checklog import check_file

    if args.file != "-":  # the file can be read: checked before any line is replayed
        try:
            with open(args.file, "rb"):
                pass
        except OSError as exc:
            raise UsageError(
                f"argument FILE: cannot read {args.file}: {exc.strerror or exc}"
            ) from None
    try:
        result = check_file(args.file, require_footer=not args.allow_unclosed)
    except OSError as exc:
        raise UsageError(f"argument FILE: cannot read {args.file}: {exc.strerror or exc}") from None
    print(result.text())
    return result.exit_code


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``check-log`` on the ``commands`` subparsers of ``pagedstate``."""
    check_log: argparse.ArgumentParser = commands.add_parser(
        "check-log",
        help="replay a production event log on the reference model (trace validation)",
        description=(
            "Replay FILE, an event log written by pagedstate.impl.eventlog, on the reference "
            "model and report the first line where the two disagree, or that every line "
            "matched and the whole log (footer included) was consumed. Exit status: 0 "
            "matched; 1 a disagreement, or no footer; 2 unreadable or not replayable."
        ),
    )
    check_log.add_argument("file", metavar="FILE", help="the NDJSON event log ('-': stdin)")
    check_log.add_argument(
        "--allow-unclosed",
        action="store_true",
        help="accept a log without its footer (a run still writing): check the lines it has",
    )
    check_log.set_defaults(func=_run_check_log, subparser=check_log)
    return check_log
