"""``pagedstate explore``: exhaustive search of one configuration of the reference model."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ._args import MAX_WORKERS, UsageError, _positive_int, _worker_count, check_out_file

#: Seconds between the plain progress lines ``explore`` prints when stderr is no terminal
#: (a CI log, ``make check``): at most this long without a line (the searches report about
#: once a second, the parallel one in the middle of a level too).
_LOG_EVERY_S = 10.0


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
    the counterexample (if any) as JSON; with no violation the file is left as it was.
    Off a terminal, a plain progress line goes to stderr every ``_LOG_EVERY_S`` (10) seconds:
    elapsed seconds, states generated and distinct, depth, states queued and at the depth
    bound, distinct states per second.

    Raises:
        UsageError: ``--json`` names a file that cannot be written, found before the
            search (nothing runs), or the write of the counterexample failed after it (the
            report is printed first). ``main`` reports either and returns 2.
    """
    import attrs
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from pagedstate.models.explorer import CONFIGS, Report, explore, explore_parallel

    check_out_file(args.json, "--json")  # written at the end: checked before the search
    if args.max_memory_mb is not None and args.workers < 2:
        raise UsageError(
            "argument --max-memory-mb: needs --workers 2 or more (the one-process search"
            " has no memory bound)"
        )
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
                queue=r.queued,
                rate=r.states_per_second,
            )
            now = time.monotonic()
            if plain and now - last_line[0] >= _LOG_EVERY_S:
                last_line[0] = now
                print(
                    f"explore {args.config}: {r.seconds:,.0f} s, {r.generated:,} generated,"
                    f" {r.distinct:,} distinct, depth {r.depth}, queue {r.queued:,},"
                    f" {r.at_depth_bound:,} at the depth bound, {r.states_per_second:,.0f}"
                    " distinct/s",
                    file=sys.stderr,
                    flush=True,
                )

        cfg: Any = CONFIGS[args.config]
        if args.symmetry:
            cfg = attrs.evolve(cfg, symmetry=True)
        if args.max_depth is not None:
            cfg = attrs.evolve(cfg, max_depth=args.max_depth)
        if args.workers > 1:
            try:
                report = explore_parallel(
                    cfg,
                    workers=args.workers,
                    max_states=args.max_states,
                    max_memory_mb=args.max_memory_mb,
                    check_drain=not args.no_drain,
                    progress=progress,
                )
            except ValueError as e:  # the memory bound, checked before the search starts
                if not str(e).startswith("max_memory_mb="):
                    raise
                raise UsageError(f"argument --max-memory-mb: {e}") from None
        else:
            report = explore(
                cfg,
                max_states=args.max_states,
                check_drain=not args.no_drain,
                progress=progress,
            )
    print(report.text(), flush=True)
    if args.json is not None and report.violation is not None:
        try:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(report.violation.to_json() + "\n")
        except OSError as e:  # it could be written before the search, not now
            raise UsageError(
                f"argument --json: {args.json}: cannot write the counterexample there"
                f" ({e.strerror or e}); it is printed above as JSON"
            ) from None
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
    explore.add_argument(
        "--symmetry",
        action="store_true",
        help="identify states up to a renaming of the sequences (fewer states, the same"
        " shortest traces' lengths)",
    )
    explore.add_argument(
        "--max-depth",
        type=_positive_int,
        default=None,
        help="the depth bound (>= 1; default the configuration's own: tiny 7, default 10,"
        " wide 14, overlap 8)",
    )
    explore.add_argument(
        "--max-memory-mb",
        type=_positive_int,
        default=None,
        help='with --workers >= 2: stop ("memory bound") before the search\'s resident'
        " memory exceeds this many MiB (default: no bound; default to depth 11 with"
        " --symmetry needs more than 16 GiB)",
    )
    explore.add_argument("--quiet", action="store_true", help="no progress bar")
    explore.set_defaults(func=_run_explore, subparser=explore)
    return explore
