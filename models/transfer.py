"""Deprecated: the prefill/decode transfer driver moved to :mod:`pagedstate.impl.transfer`.

This path re-exports its names (and ``python -m pagedstate.models.transfer`` still runs one
rank) and will be removed in the next release. ``pagedstate.models`` imports no
``pagedstate.impl`` statically, so the driver is taken by name at run time.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

_NEW = "pagedstate.impl.transfer"

warnings.warn(
    f"pagedstate.models.transfer moved to {_NEW}; this path will be removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)

_driver = importlib.import_module(_NEW)
_launch = importlib.import_module(f"{_NEW}.launch")

#: The names of the old module that callers and tests use: the public ones (``__all__``),
#: the wire constants, and the private helpers the tests reach.
_NAMES = (
    *_driver.__all__,
    "MAX_TIMEOUT_S",
    "ACCEPT",
    "CTRL_LEN",
    "HEADER_LEN",
    "KIND_END",
    "KIND_PAYLOAD",
    "KIND_ROUND",
    "MAGIC",
    "REFUSE",
    "REPLY_LEN",
    "VERSION",
    "_config_from_json",
    "_config_json",
    "_receiver_loop",
    "_sender_loop",
)
globals().update({name: getattr(_driver, name) for name in _NAMES})
_main = _launch._main
__all__ = list(_driver.__all__)


def __getattr__(name: str) -> Any:
    # Typed access for type checkers (the names above are set at run time); any other name
    # of the driver still resolves, from the package.
    try:
        return getattr(_driver, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":
    sys.exit(_main())
