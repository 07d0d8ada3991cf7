"""What the subcommands share: argparse types, the checks of paths made before anything runs,
and :class:`UsageError`, a bad argument found by a handler (reported as argparse reports)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """A bad argument a subcommand found before it ran anything (a path that cannot be read
    or written): :func:`pagedstate.models.cli.main` prints the subcommand's usage and
    ``pagedstate CMD: error: MESSAGE`` and returns 2, as argparse does for the arguments it
    checks itself."""


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


#: The most worker processes ``explore --workers`` forks (each is a full copy of the search).
MAX_WORKERS = 64


def _worker_count(text: str) -> int:
    """argparse type: an int in ``[1, MAX_WORKERS]``."""
    value = _positive_int(text)
    if value > MAX_WORKERS:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_WORKERS} worker processes, got {value}"
        )
    return value


def _writable_folder(folder: Path) -> str | None:
    """Why nothing can be created in ``folder`` (missing, not a folder, not writable), or
    None."""
    if not folder.is_dir():
        return (
            f"the folder {folder} does not exist"
            if not folder.exists()
            else f"{folder} is not a folder"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write in {folder}"
    return None


def _cannot_open(p: Path) -> str | None:
    """Why ``p`` cannot be opened for writing, found by trying, or None. Leaves the file
    system as it found it: an existing file is opened for appending and closed unwritten; a
    new one is created and removed. Something other than a regular file (``/dev/null``, a
    pipe) is not opened. ``os.access`` alone is not enough: for root it allows a file in
    ``/proc`` or one on a read-only mount."""
    if p.exists():
        if not p.is_file():
            return None
        try:
            with open(p, "a", encoding="utf-8"):
                pass
        except OSError as e:
            return f"cannot write it ({e.strerror or e})"
        return None
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:  # made meanwhile by someone else: theirs, not ours to probe
        return None
    except OSError as e:
        return f"cannot create it ({e.strerror or e})"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(p)
    return None


def check_out_file(path: str | None, what: str) -> None:
    """Check an output file before anything runs: a non-empty path, not a folder, in a folder
    that exists and can be written, and a file that can be opened for writing (tried, see
    :func:`_cannot_open`; nothing is left changed). ``None`` (the option not given) passes.

    Raises:
        UsageError: it is not (``what`` names the option in the message)."""
    if path is None:
        return
    if not path.strip():
        raise UsageError(f"argument {what}: the path is empty")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"argument {what}: {path} is a folder")
    why = _writable_folder(p.parent if str(p.parent) else Path(".")) or _cannot_open(p)
    if why is not None:
        raise UsageError(f"argument {what}: {path}: {why}")


def check_out_folder(path: str, what: str) -> None:
    """Check an output folder before anything is written: a non-empty path, a folder or
    nothing yet, under whose nearest existing ancestor, a folder, can be written.

    Raises:
        UsageError: it is not."""
    if not path.strip():
        raise UsageError(f"argument {what}: the path is empty")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"argument {what}: {path} is not a folder")
    base = p
    while not base.exists() and base != base.parent:
        base = base.parent
    why = _writable_folder(base)
    if why is not None:
        raise UsageError(f"argument {what}: {path}: {why}")


def check_in_folder(path: str, what: str) -> None:
    """Check a folder that is read: it exists and is a folder.

    Raises:
        UsageError: it is not."""
    p = Path(path)
    if not path.strip():
        raise UsageError(f"argument {what}: the path is empty")
    if not p.exists():
        raise UsageError(f"argument {what}: no such folder: {path}")
    if not p.is_dir():
        raise UsageError(f"argument {what}: {path} is not a folder")
