"""Production store: the recurrent-state page store held to the spec tables.

``from pagedstate.impl import UnitPool, PageUnitCheckpointStore,
PagedStateCheckpointCoordinator, SlotPool`` gives the same public classes, constructor
arguments, methods, return values, errors and snapshots as the reference model
(:mod:`pagedstate.models.reference`), with indexes in place of its walks: every call is O(1)
amortized or O(log n) (see each method's docstring). Every phase change is a row of
:mod:`pagedstate.spec.tables`. ``impl`` imports only :mod:`pagedstate.spec`.

The engine's KV side plugs into :class:`UnitPool` through the small protocol
:class:`KVBlockPool` (``on_evict``, ``cache_units``, ``claim_cached_units``,
``uncache_units``, ``cached_hash``); see :mod:`pagedstate.impl.pool`.
"""

from .coordinator import PagedStateCheckpointCoordinator
from .pool import EvictionCallback, KVBlockPool, SlotPool, UnitPool
from .store import (
    DEFAULT_CHANGE_LOG_SIZE,
    DEFAULT_FORFEIT_BOUND,
    DEFAULT_OFFLOAD_BACKLOG_CAP,
    PageUnitCheckpointStore,
    RowSink,
    TransitionHook,
)

__all__ = [
    "UnitPool",
    "SlotPool",
    "KVBlockPool",
    "EvictionCallback",
    "PageUnitCheckpointStore",
    "PagedStateCheckpointCoordinator",
    "RowSink",
    "TransitionHook",
    "DEFAULT_OFFLOAD_BACKLOG_CAP",
    "DEFAULT_FORFEIT_BOUND",
    "DEFAULT_CHANGE_LOG_SIZE",
]
