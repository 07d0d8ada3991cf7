"""Deprecated: ``make bench-replay`` moved to :mod:`pagedstate.models.bench.replay`.

This path re-exports its names and ``python -m pagedstate.models.bench_replay`` still runs it;
it will be removed in the next release.
"""

from __future__ import annotations

import sys
import warnings

from pagedstate.models.bench.replay import (  # noqa: F401 - re-exported
    _BEGIN,
    _END,
    _TRACES,
    _pct,
    main,
)

__all__ = ["main"]

warnings.warn(
    "pagedstate.models.bench_replay moved to pagedstate.models.bench.replay;"
    " this path will be removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    sys.exit(main())
