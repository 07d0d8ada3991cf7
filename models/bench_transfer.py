"""Deprecated: the transfer benchmark moved to :mod:`pagedstate.models.bench.transfer`.

This path re-exports its names and ``python -m pagedstate.models.bench_transfer`` still runs it;
it will be removed in the next release.
"""

from __future__ import annotations

import sys
import warnings

from pagedstate.models.bench.transfer import (  # noqa: F401 - re-exported
    MODEL,
    PAYLOADS,
    QUICK_SLICE,
    TransferConfig,
    _ints,
    _payloads,
    _row,
    _shown,
    _two_gpus,
    bench_rows,
    image_units,
    main,
    render,
    spawn_transfer,
    write_section,
)

__all__ = ["bench_rows", "main", "render", "write_section"]

warnings.warn(
    "pagedstate.models.bench_transfer moved to pagedstate.models.bench.transfer;"
    " this path will be removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    sys.exit(main())
