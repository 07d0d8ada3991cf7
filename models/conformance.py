"""Deprecated: the conformance kit moved to :mod:`pagedstate.engines.conformance`.

Importing this module warns (``DeprecationWarning``) and gives the kit's names, the very
same objects as :mod:`pagedstate.engines.conformance`'s, so that
``from pagedstate.models.conformance import X`` keeps working for one release; this path
will be removed in the next. It is the one module of ``models`` that imports ``engines``.
"""

from __future__ import annotations

import warnings

warnings.warn(
    "pagedstate.models.conformance moved to pagedstate.engines.conformance; this path will be"
    " removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)

# The old module's names, the same objects (``X as X``: importable from it, though not in
# its ``__all__``).
from pagedstate.engines.conformance import ANY_BUSY_SLOT as ANY_BUSY_SLOT  # noqa: E402
from pagedstate.engines.conformance import (  # noqa: E402
    BAD_INPUTS,
    EVENT_RULES,
    MACRO_RULES,
    PASS_FAULTS,
    PROFILES,
    ConformanceConfig,
    ConformanceFailure,
    ConformanceMachine,
    ConformanceReport,
    KitOffload,
    KitSeq,
    Pair,
    TableCoverageError,
    assert_rule_mapping,
    check_rule_mapping,
    conformance_machine,
    conformance_settings,
    conformance_test_case,
    run_conformance,
)
from pagedstate.engines.conformance import BUSY_SLOT as BUSY_SLOT  # noqa: E402
from pagedstate.engines.conformance import DEFAULT_CONFIG as DEFAULT_CONFIG  # noqa: E402
from pagedstate.engines.conformance import KNOWN_H as KNOWN_H  # noqa: E402
from pagedstate.engines.conformance import READY_H as READY_H  # noqa: E402
from pagedstate.engines.conformance import REG_SEQ as REG_SEQ  # noqa: E402
from pagedstate.engines.conformance import SEQ as SEQ  # noqa: E402
from pagedstate.engines.conformance import SLOT as SLOT  # noqa: E402
from pagedstate.engines.conformance import BadInput as BadInput  # noqa: E402
from pagedstate.engines.conformance import CoordinatorFactory as CoordinatorFactory  # noqa: E402
from pagedstate.engines.conformance import H as H  # noqa: E402
from pagedstate.engines.conformance import PoolFactory as PoolFactory  # noqa: E402

__all__ = [
    "ConformanceConfig",
    "ConformanceMachine",
    "ConformanceFailure",
    "ConformanceReport",
    "TableCoverageError",
    "KitSeq",
    "KitOffload",
    "Pair",
    "EVENT_RULES",
    "MACRO_RULES",
    "BAD_INPUTS",
    "PASS_FAULTS",
    "PROFILES",
    "check_rule_mapping",
    "assert_rule_mapping",
    "conformance_machine",
    "conformance_settings",
    "conformance_test_case",
    "run_conformance",
]
