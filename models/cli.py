"""Command-line entry point: ``pagedstate`` (``pagedstate.models.cli:main``).

Subcommands register themselves in :func:`build_parser`: each one adds a
subparser to ``commands`` and sets ``func`` to a callable taking the parsed
``argparse.Namespace`` and returning an exit status, e.g.::

    explore = commands.add_parser("explore", help="...")
    explore.add_argument("--config", default="default")
    explore.set_defaults(func=_run_explore)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

Handler = Callable[[argparse.Namespace], int]


def _version() -> str:
    try:
        return version("pagedstate")
    except PackageNotFoundError:  # running from a checkout that is not installed
        return "unknown"


def _run_render(args: argparse.Namespace) -> int:
    """``pagedstate render``: write the table pages, or with ``--check`` report stale ones.

    Returns 0 after writing, or with ``--check`` when every page is up to date; 1 when
    ``--check`` finds a page missing or different (each is printed, one per line).
    """
    from pathlib import Path

    from pagedstate.spec import render

    if args.check is not None:
        root = Path(args.check)
        stale = render.stale(root)
        for rel in stale:
            print(root / rel)
        if stale:
            print(
                f"render --check: {len(stale)} stale or missing file(s) under {root}; "
                f"run `pagedstate render --out {root}`",
                file=sys.stderr,
            )
            return 1
        print(f"render --check: {root} is up to date ({len(render.render_all())} files)")
        return 0
    for path in render.write(args.out):
        print(path)
    return 0


#: Seconds between the plain progress lines ``explore`` prints when stderr is no terminal.
_LOG_EVERY_S = 30.0


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _run_explore(args: argparse.Namespace) -> int:
    """``pagedstate explore``: exhaustive search of one configuration; prints the report.

    Returns 0 when the search found no violation, took every reachable table row and met
    every applicable goal; 1 otherwise (the report says which). ``--json FILE`` also writes
    the counterexample (if any) as JSON.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from pagedstate.models.explorer import CONFIGS, Report, explore, explore_parallel

    if args.config not in CONFIGS:
        print(f"unknown config {args.config!r}; choose one of {sorted(CONFIGS)}", file=sys.stderr)
        return 2
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


def _run_check_log(args: argparse.Namespace) -> int:
    """``pagedstate check-log FILE``: replay an event log on the reference model.

    Prints the verdict. Returns 0 when every line matched and the log ends with its footer;
    1 at the first disagreement (printed with every field that differs) or when the log
    has no footer; 2 when the file cannot be read or a line cannot be parsed or replayed
    (the message names the line).
    """
    from pagedstate.models.checklog import check_file

    try:
        result = check_file(args.file, require_footer=not args.allow_unclosed)
    except OSError as exc:
        print(f"check-log: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    print(result.text())
    return result.exit_code


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="pagedstate",
        description=(
            "Recurrent-state prefix-cache checkpoints in KV block pool pages: "
            "reference model, exploration and documentation tools."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Register subcommands (explore, render, ...) on `commands` here.

    explore = commands.add_parser(
        "explore",
        help="exhaustively explore the reference model on a bounded configuration",
        description=(
            "Breadth-first search over every reachable state of the reference model for a "
            "named configuration (see pagedstate.models.explorer.CONFIGS), checking every "
            "invariant, atomicity of refused calls, and a drain from every state. Prints a "
            "TLC-style report; on a violation, the shortest trace as Python and JSON."
        ),
    )
    explore.add_argument("--config", default="default", help="tiny, default or wide")
    explore.add_argument(
        "--workers", type=_positive_int, default=1, help="worker processes (forked; default 1)"
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
    explore.set_defaults(func=_run_explore)

    render = commands.add_parser(
        "render",
        help="write the transition tables as Markdown + Mermaid pages, or check them",
        description=(
            "Render every table of pagedstate.spec.tables as DIR/tables/<machine>.md "
            "(a Mermaid state diagram and a Markdown table) plus DIR/tables/README.md."
        ),
    )
    render_mode = render.add_mutually_exclusive_group()
    render_mode.add_argument(
        "--out",
        metavar="DIR",
        default="docs",
        help="write the pages under DIR (default: %(default)s)",
    )
    render_mode.add_argument(
        "--check",
        metavar="DIR",
        default=None,
        help="write nothing; print each page under DIR that is missing or differs, and exit 1 "
        "if there is any",
    )
    render.set_defaults(func=_run_render)

    check_log = commands.add_parser(
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
    check_log.set_defaults(func=_run_check_log)

    from pagedstate.models import replay_cli

    replay_cli.add_parser(commands)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen subcommand."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # reported with the subcommand's own usage where it has one (``pagedstate replay``)
        sub = getattr(args, "subparser", None)
        (sub if isinstance(sub, argparse.ArgumentParser) else parser).error(
            f"unrecognized arguments: {' '.join(extra)}"
        )
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
