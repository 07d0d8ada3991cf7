"""What a benchmark report records about the code it measured."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["commit"]


def commit() -> str:
    """The commit measured: ``$COMMIT`` if set (a device machine's copy of the tree has no
    history), else ``git rev-parse --short HEAD`` of this checkout, else ``"unknown"``."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
