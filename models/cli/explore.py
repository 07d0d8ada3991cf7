"""``pagedstate explore``: exhaustive search of one configuration of the reference model."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ._args import MAX_WORKERS, _positive_int, _worker_count, check_out_file

#: Seconds between the plain progress lines ``explore`` prints when stderr is no terminal.
_LOG_EVERY_S = 30.0


def _config_name(text: str) -> str:
    """argparse type: a name of :data:`pagedstate.models.explorer.CONFIGS` (loaded only when
    ``explore`` is the command)."""
    from pagedstate.models.explorer import CONFIGS

    if text not in CONFIGS:
        choices = ", ".join(repr(c) for c in sorted(CONFIGS))
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {choices})")
    return text


def _run_explore(args: argparse.Namespace) -> int:
    """``pagedstate explore``: exhaustive search of one configuration; prints the report.

    Returns 0 when the search found no violation, took every reachable table row and met
    every applicable goal; 1 otherwise (the report says which). ``--json FILE`` also writes
    the counterexample (if any) as JSON.

    Raises:
        UsageError: ``--json`` names a file that cannot be written (before the search).
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from pagedstate.models.explorer import Report, explore, explore_parallel

    check_out_file(args.json, "--json")  # written at the end: checked before the search
    console = Console(stderr=True)
    # Off a terminal (a CI log), one plain line every `_LOG_EVERY_S` seconds instead of the bar.
    plain = not args.quiet and not console.is_terminal
    last_line = [time.monotonic()]
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]explore {task.fields[config]}[/]"),
        BarColumn(bar_width=None),
        TextColumn(
            "{task.fields[distinct]:>10,} distinct  depth {task.fields[depth]:>3}"
            "  queue {task.fields[queue]:>9,}  {task.fields[rate]:>7,.0f}/s"
        ),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=args.quiet or not console.is_terminal,
    ) as bar:
        task = bar.add_task(
            "explore", total=None, config=args.config, distinct=0, depth=0, queue=0, rate=0.0
        )

        def progress(r: Report) -> None:
            bar.update(
                task,
                distinct=r.distinct,
                depth=r.depth,
                queue=r.frontier_left,
                rate=r.states_per_second,
            )
            now = time.monotonic()
            if plain and now - last_line[0] >= _LOG_EVERY_S:
                last_line[0] = now
                print(
                    f"explore {args.config}: {r.distinct:,} distinct, depth {r.depth},"
                    f" queue {r.frontier_left:,}, {r.states_per_second:,.0f}/s",
                    file=sys.stderr,
                    flush=True,
                )

        if args.workers > 1:
            report = explore_parallel(
                args.config,
                workers=args.workers,
                max_states=args.max_states,
                check_drain=not args.no_drain,
                progress=progress,
            )
        else:
            report = explore(
                args.config,
                max_states=args.max_states,
                check_drain=not args.no_drain,
                progress=progress,
            )
    print(report.text())
    if args.json is not None and report.violation is not None:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(report.violation.to_json() + "\n")
    return 0 if report.ok else 1


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``explore`` on the ``commands`` subparsers of ``pagedstate``."""
    explore: argparse.ArgumentParser = commands.add_parser(
        "explore",
        help="exhaustively explore the reference model on a bounded configuration",
        description=(
            "Breadth-first search over every reachable state of the reference model for a "
            "named configuration (see pagedstate.models.explorer.CONFIGS), checking every "
            "invariant, atomicity of refused calls, and a drain from every state. Prints a "
            "TLC-style report; on a violation, the shortest trace as Python and JSON."
        ),
    )
    explore.add_argument(
        "--config",
        type=_config_name,
        default="default",
        help="a configuration of pagedstate.models.explorer.CONFIGS (tiny, default, wide, overlap)",
    )
    explore.add_argument(
        "--workers",
        type=_worker_count,
        default=1,
        help=f"worker processes (forked; 1 to {MAX_WORKERS}; default 1)",
    )
    explore.add_argument(
        "--max-states",
        type=_positive_int,
        default=None,
        help="stop after this many distinct states (>= 1)",
    )
    explore.add_argument(
        "--no-drain", action="store_true", help="skip the per-state drain (leak) check"
    )
    explore.add_argument(
        "--json", metavar="FILE", default=None, help="write a counterexample as JSON to FILE"
    )
    explore.add_argument("--quiet", action="store_true", help="no progress bar")
    explore.set_defaults(func=_run_explore, subparser=explore)
    return explore
