"""Engine models driving a store over a request trace, and ``pagedstate replay``.

Two engine models share the Mooncake traces, one scheduler loop each:

- :mod:`.engine`: the workload model ``make bench`` times (every call into the store
  timed through :mod:`.timing`'s ``CallTimer``); it used to be
  ``pagedstate.models.engine``.
- :mod:`.run`: the replay a user runs (``pagedstate replay``), on the production store with
  the reference in lockstep (``verify``); its docstring says what it models. Its store calls
  are :mod:`.lockstep`'s, a request's life :mod:`.lifecycle`'s, its parts (store sides,
  requests, CPU tier, clock) :mod:`.parts`'.

Around them: :mod:`.trace` (loading a trace, the prefix hash, the shipped trace's path),
:mod:`.config` (a replay's knobs and the model lookup), :mod:`.result` (what a replay
found), :mod:`.errors`, :mod:`.executor` (the copy executors of ``--executor``, formerly
``pagedstate.models.replay_exec``), :mod:`.cli` and :mod:`.report` (the command and its
report and plot, formerly ``pagedstate.models.replay_cli``).

This package re-exports the names of the former module ``pagedstate.models.replay``.
"""

# The names of the former module's __all__, and beside them the constants and helpers that
# other modules and tests import from it (re-exported as ``name as name``).
from .config import ReplayConfig, parse_placement
from .config import _geometry as _geometry
from .config import iter_configs as iter_configs
from .errors import AmbiguousModelError, Divergence, ReplayError, TraceError
from .lifecycle import KV_OWNER as KV_OWNER
from .parts import ReplayExecutor
from .parts import _store_module as _store_module
from .result import ReplayResult
from .run import MAX_POOL_UNITS as MAX_POOL_UNITS
from .run import ReplayEngine, replay
from .trace import MAX_TIMESTAMP_MS as MAX_TIMESTAMP_MS
from .trace import TRACE_BLOCK_TOKENS as TRACE_BLOCK_TOKENS
from .trace import TraceRequest, load_trace, prefix_hash

__all__ = [
    "AmbiguousModelError",
    "Divergence",
    "ReplayConfig",
    "ReplayError",
    "ReplayExecutor",
    "ReplayResult",
    "ReplayEngine",
    "TraceError",
    "TraceRequest",
    "load_trace",
    "parse_placement",
    "prefix_hash",
    "replay",
]
