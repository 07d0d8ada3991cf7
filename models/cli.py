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

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen subcommand."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
