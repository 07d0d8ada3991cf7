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
    # Register subcommands (explore, render, ...) on `commands` here; drop the
    # `del` below once the first one exists.
    del commands
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
