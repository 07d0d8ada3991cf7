"""``pagedstate render``: the transition tables as Markdown + Mermaid pages, or a check that
the pages are up to date."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._args import UsageError, check_in_folder, check_out_folder


def _run_render(args: argparse.Namespace) -> int:
    """``pagedstate render``: write the table pages, or with ``--check`` report stale ones.

    Returns 0 after writing, or with ``--check`` when every page is up to date; 1 when
    ``--check`` finds a page missing or different (each is printed, one per line).

    Raises:
        UsageError: ``--check`` is no folder, or ``--out`` cannot be a folder written here
            (before anything is read or written).
    """
    from pathlib import Path

    from pagedstate.spec import render

    if args.check is not None:
        check_in_folder(args.check, "--check")
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
    check_out_folder(args.out, "--out")
    try:
        written = render.write(args.out)
    except OSError as e:
        why = e.strerror or e
        raise UsageError(f"argument --out: {args.out}: cannot write there ({why})") from None
    for path in written:
        print(path)
    return 0


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``render`` on the ``commands`` subparsers of ``pagedstate``."""
    render: argparse.ArgumentParser = commands.add_parser(
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
    render.set_defaults(func=_run_render, subparser=render)
    return render
