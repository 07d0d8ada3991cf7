"""Deprecated: ``make bench-explore`` moved to :mod:`pagedstate.models.bench.explore`.

This path re-exports its names and ``python -m pagedstate.models.bench_explore`` still runs it;
it will be removed in the next release.
"""

from __future__ import annotations

import sys
import warnings

from pagedstate.models.bench.explore import (  # noqa: F401 - re-exported
    _MARK_BEGIN,
    _MARK_END,
    _row,
    _write,
    main,
    run,
)

__all__ = ["main", "run"]

warnings.warn(
    "pagedstate.models.bench_explore moved to pagedstate.models.bench.explore;"
    " this path will be removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    sys.exit(main())
