"""Deprecated path of ``pagedstate replay``'s command, now :mod:`pagedstate.models.replay.cli`
(its report and plot: :mod:`pagedstate.models.replay.report`); it goes in the next release.
Importing it warns (``DeprecationWarning``) and gives the same objects as the new paths."""

from __future__ import annotations

import warnings

from pagedstate.models.replay.cli import (
    _check_out,
    _floats,
    _int,
    _placements,
    _Progress,
    _rate,
    _run,
    add_parser,
    run,
)
from pagedstate.models.replay.report import (
    _atomic_write,
    _occupancy_line,
    _pct,
    format_result,
    plot_results,
)

__all__ = [
    "_Progress",
    "_atomic_write",
    "_check_out",
    "_floats",
    "_int",
    "_occupancy_line",
    "_pct",
    "_placements",
    "_rate",
    "_run",
    "add_parser",
    "format_result",
    "plot_results",
    "run",
]

warnings.warn(
    "pagedstate.models.replay_cli is deprecated: import pagedstate.models.replay.cli",
    DeprecationWarning,
    stacklevel=2,
)
