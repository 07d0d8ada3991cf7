"""The reference model: SPEC sections A, B and D read literally over plain dicts, lists and sets.

This is the oracle every other check compares against. It is written to be obvious, not
fast: lookups walk lists, and every phase change is a row of :mod:`pagedstate.spec.tables`
found by ``Table.step``. Where SPEC section G differs from ATOM's module, this model follows
section G.

Public names and signatures are ATOM's (``atom/model_engine/page_unit_checkpoint.py``), so
tests written against this model run unchanged against :mod:`pagedstate.impl`.

Every public call validates its arguments first and, on bad input, raises a specific
:class:`~pagedstate.spec.errors.PagedStateError` with nothing changed.

Guards and arithmetic use the spec's *reference formulations*, never the helpers the
production store calls: a record's guard is read off the table (``guard_by_table``), an LRU
victim is a record the table has an ``evict`` row for (``evictable_by_table``),
``has_available_units`` walks the LRU (``units_available_by_walk``), ``changed_since``
looks every generation up (``changed_since_by_scan``) and ``was_reclaimed`` reads G7 case
by case (``reclaimed_by_cases``). ``make contracts`` compares each with its production
counterpart under ``crosshair diffbehavior`` (:mod:`pagedstate.spec.guards`).

Modules, one part each: :mod:`._common` (bounds, argument checks, owner predicates, the
row stepper), :mod:`.pool` (:class:`UnitPool`, :class:`SlotPool`), the store
:class:`PageUnitCheckpointStore` as a base and mixins by topic (:mod:`.store_core`: state,
lookups and the record machine's effects; :mod:`.store_restores`: restores and leases;
:mod:`.store_offload`: the CPU tier; :mod:`.store`: stores, index changes, adoption,
snapshot) and :mod:`.coordinator` (:class:`PagedStateCheckpointCoordinator`), with its
midstep scratch in :mod:`.coordinator_scratch`.
"""

# The private names of the single module this package replaces are re-exported too (``as``
# themselves), so code reaching them through ``pagedstate.models.reference`` keeps working
# (the mutants annotate with ``_Record``).
from ._common import (
    DEFAULT_CHANGE_LOG_SIZE,
    DEFAULT_FORFEIT_BOUND,
    DEFAULT_OFFLOAD_BACKLOG_CAP,
    RowSink,
)
from ._common import _free_slots as _free_slots
from ._common import _is_checkpoint_owner as _is_checkpoint_owner
from ._common import _is_dirtying as _is_dirtying
from ._common import _is_int as _is_int
from ._common import _need_int as _need_int
from ._common import _need_transfer_owner as _need_transfer_owner
from ._common import _owner_kind as _owner_kind
from ._common import _same_owner as _same_owner
from ._common import _Stepper as _Stepper
from .coordinator import PagedStateCheckpointCoordinator
from .pool import SlotPool, UnitPool
from .pool import _StoreAccess as _StoreAccess
from .store import PageUnitCheckpointStore
from .store_core import _OffloadPin as _OffloadPin
from .store_core import _Record as _Record

__all__ = [
    "UnitPool",
    "SlotPool",
    "PageUnitCheckpointStore",
    "PagedStateCheckpointCoordinator",
    "RowSink",
    "DEFAULT_OFFLOAD_BACKLOG_CAP",
    "DEFAULT_FORFEIT_BOUND",
    "DEFAULT_CHANGE_LOG_SIZE",
]
