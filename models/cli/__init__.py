"""Command-line entry point: ``pagedstate`` (``pagedstate.models.cli:main``).

One module per command group: :mod:`.explore`, :mod:`.render`, :mod:`.check_log`, and
``replay`` (:mod:`pagedstate.models.replay.cli`). Each has an ``add_parser(commands)`` that
adds its subparser to ``commands`` and sets ``func`` to a callable taking the parsed
``argparse.Namespace`` and returning an exit status, and ``subparser`` to its own parser (so
errors are reported with its usage), e.g.::

    explore = commands.add_parser("explore", help="...")
    explore.add_argument("--config", type=_config_name, default="default")
    explore.set_defaults(func=_run_explore, subparser=explore)

Every bad argument is reported as argparse reports one, before anything runs: the
subcommand's usage, then ``pagedstate CMD: error: ...`` naming the value (and the valid
choices), exit status 2. Checks argparse cannot make (a path that must be readable or
writable) raise :class:`UsageError` from the handler, before it does anything.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from . import check_log, explore, render
from ._args import Handler, UsageError

__all__ = ["Handler", "UsageError", "build_parser", "main"]


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
    # Each command group's module registers its subcommand on `commands`.
    explore.add_parser(commands)
    render.add_parser(commands)
    check_log.add_parser(commands)

    from pagedstate.models.replay import cli as replay_cli  # lazily: it loads the replay

    replay_cli.add_parser(commands)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen subcommand.

    A bad argument is argparse's usage error (``pagedstate CMD: error: ...``, exit 2) before
    anything runs: raised as ``SystemExit(2)`` when argparse finds it, returned as 2 when the
    subcommand does (:class:`UsageError`, a path that cannot be read or written)."""
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
    try:
        return func(args)
    except UsageError as e:  # a bad argument the handler found before it ran anything
        sub = getattr(args, "subparser", None)
        where = sub if isinstance(sub, argparse.ArgumentParser) else parser
        where.print_usage(sys.stderr)
        print(f"{where.prog}: error: {e}", file=sys.stderr)
        return 2
