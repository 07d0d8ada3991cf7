"""The conformance kit: run a store in lockstep with the reference model under Hypothesis.

An engine that integrates its own checkpoint store (or wraps :mod:`pagedstate.impl`) hands
the kit two factories and gets a Hypothesis ``RuleBasedStateMachine`` back. Every rule
calls the same public method, with the same arguments, on the store under test and on the
reference coordinator (:mod:`pagedstate.models.reference`), and then:

- compares the return values (ops, booleans, leases, operation ids, unit tuples, fates);
  when a call raises, both must raise the same exception class and neither snapshot may
  change (SPEC G8);
- compares ``snapshot()`` of the two (the failure names each differing field, from
  :meth:`~pagedstate.spec.snapshot.Snapshot.diff`);
- checks every state invariant (:func:`~pagedstate.spec.snapshot.check_invariants`) and
  every step invariant (:func:`~pagedstate.spec.snapshot.check_step_invariants`) on the
  store under test;
- at the end of each test case, releases every handle, clears, drains and completes both,
  and checks that every unit came back (no leak, no stuck pin).

Faults are rules too: offload reports lost, duplicated, late and out of order; clock jumps
past the reclaim timeout; aborts and resets at any point; KV pressure from other owners;
transfers and their late releases; suspended restores and second uses of spent leases;
midstep scratch; bad inputs. ``docs/conformance.md`` describes each.

The rules come from the tables: :data:`EVENT_RULES` maps every ``(machine, event)`` of
:data:`pagedstate.spec.tables.TABLES` to the rules that drive it, and importing this module
fails (:class:`TableCoverageError`) when a table event has no rule. Each step labels the
table rows the reference took with Hypothesis ``event()`` (``Table.label(row)``), so
``pytest --hypothesis-show-statistics`` shows table-row coverage; ``teardown`` reports
``target()`` scores for the most pins on one record and the most live records.

Use::

    from pagedstate.models.conformance import conformance_test_case, run_conformance

    run_conformance(MyCoordinator, pool_factory=MyPool)         # one call, active profile
    TestMyStore = conformance_test_case(MyCoordinator, MyPool)  # pytest / hypofuzz

The coordinator factory has the reference constructor's signature::

    factory(pool, spec, enabled, offload, readable_midstep,
            clock=..., offload_backlog_cap=..., forfeit_bound=...)

and ``pool_factory(num_units)`` builds the pool it is given. The kit drives KV pressure on
the pool the coordinator exposes as ``coordinator.pool`` (or ``coordinator.store.pool``),
falling back to the one the factory was given. Store-level calls that the coordinator
protocol lacks (``cancel_queued_restore``, ``changed_since``, ``lookup``,
``contains_or_pending``) go to ``coordinator.store``; switch them off with
``ConformanceConfig(store_calls=False)`` when the store under test has no ``store``.

This module never imports :mod:`pagedstate.impl`: it only receives factories. It needs
``hypothesis`` (the ``dev`` extra).
"""

from __future__ import annotations

import functools
import math
import os
import unittest
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import attrs
from hypothesis import HealthCheck, currently_in_test_context, event, target
from hypothesis import settings as HSettings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    INITIALIZE_RULE_MARKER,
    RULE_MARKER,
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    consumes,
    initialize,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pagedstate.spec.errors import IllegalTransitionError, PinUnderflowError
from pagedstate.spec.snapshot import Snapshot, check_invariants, check_step_invariants
from pagedstate.spec.tables import TABLES, Table
from pagedstate.spec.types import (
    PagedStateCheckpointSpec,
    SuspendedCheckpointRestore,
)

from .reference import PagedStateCheckpointCoordinator, SlotPool, UnitPool
from .world import KV_OWNER, ManualClock, drain_calls, make_drain_call, quiescence_problems

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

T = TypeVar("T")

#: A coordinator factory: the reference constructor's signature (see the module docstring).
CoordinatorFactory = Callable[..., Any]
#: A pool factory: ``pool_factory(num_units)`` returns a fresh unit pool.
PoolFactory = Callable[[int], Any]


class ConformanceFailure(AssertionError):
    """The store under test disagreed with the reference, broke an invariant, or changed
    state in a call that raised. The message names the rule, the call, both outcomes and
    every differing snapshot field."""


class TableCoverageError(AssertionError):
    """A ``(machine, event)`` of the transition tables has no conformance rule, or the
    rule mapping names a rule or event that does not exist."""


# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------


def _positive(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ConformanceConfig.{attribute.name} must be an int >= 1, got {value!r}")


def _number(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"ConformanceConfig.{attribute.name} must be a number of seconds, got {value!r}"
        )


def _non_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"ConformanceConfig.{attribute.name} must be an int >= 0, got {value!r}")


@attrs.frozen
class ConformanceConfig:
    """Sizes and switches of a conformance run (small on purpose: the small-scope
    hypothesis; pressure, overflow and watermarks are reached within a few steps).

    Attributes:
        units: pool size in units (the pool's ``num_units``).
        units_per_checkpoint: units per image; the spec's image is
            ``page_unit_bytes * (units_per_checkpoint - 1) + 1`` bytes, so the last unit is
            only partly used (``ceil`` in SPEC A.1).
        page_unit_bytes: bytes per unit in the spec.
        hashes: prefix hashes ``1..hashes``.
        seqs: sequences with their own state slot ``0..seqs-1``; two more sequences are
            always added: one without per-request state (slot ``seqs``) and one with no slot
            (``state_slot == -1``).
        scratch_slots: midstep scratch slots (``readable_midstep`` when > 0), numbered
            from ``seqs + 1``; 0 switches midstep scratch off.
        max_ops_per_batch: per-batch copy budget given to ``attach_midstep_scratch``.
        kv_tenants: at most this many KV allocations of other owners held at once.
        kv_max_units: units one KV allocation takes (1..this).
        offload: attach a CPU tier (:class:`KitOffload`) with the sink on.
        max_offload_inflight: the largest ``max_inflight`` passed to take and acquire (the
            tier's bound on outstanding offload operations).
        backlog_cap: nomination backlog cap (``offload_backlog_cap``).
        forfeit_bound: reclaimed operations remembered exactly (``forfeit_bound``).
        timeout_s: the reclaim timeout (seconds); clock jumps are multiples of it.
        transfers: at most this many fresh transfer reservations live at once (0: off).
        leases: explicit ``acquire_checkpoint_source`` leases.
        suspend: suspend/resume/release of queued restores.
        enabled: the coordinator's ``enabled`` argument.
        store_calls: call store-level methods through ``coordinator.store``.
        bad_inputs: run the :data:`BAD_INPUTS` rule.
        drain_at_end: in ``teardown``, drive both stores to quiescence and check that every
            unit came back (no leak, no stuck pin).
        sweep_queries: after every step, ask both stores every read-only question over its
            whole small domain (``has_available_units(k, p)`` for every count ``0..units+1``
            and every protected hash or None, ``restore_queued_for`` of every slot,
            ``contains`` of every hash, and with ``store_calls`` ``lookup``,
            ``contains_or_pending`` and ``changed_since`` of the last generations) and
            compare every answer, and that the sweep changed nothing. A wrong answer in a
            narrow band of arguments is then found at the first state that shows it, not
            only when a rule happens to draw those arguments.
        change_log_size: the change log's bound (``change_log_size``), on both sides; small
            by default, so that the log wraps within a run and ``changed_since`` answers
            "unknown" for generations it no longer reaches.
    """

    units: int = attrs.field(default=8, validator=_positive)
    units_per_checkpoint: int = attrs.field(default=2, validator=_positive)
    page_unit_bytes: int = attrs.field(default=16, validator=_positive)
    hashes: int = attrs.field(default=4, validator=_positive)
    seqs: int = attrs.field(default=3, validator=_positive)
    scratch_slots: int = attrs.field(default=2, validator=_non_negative)
    max_ops_per_batch: int = attrs.field(default=2, validator=_non_negative)
    kv_tenants: int = attrs.field(default=2, validator=_non_negative)
    kv_max_units: int = attrs.field(default=2, validator=_positive)
    offload: bool = True
    max_offload_inflight: int = attrs.field(default=4, validator=_positive)
    backlog_cap: int = attrs.field(default=3, validator=_positive)
    forfeit_bound: int = attrs.field(default=2, validator=_positive)
    timeout_s: float = attrs.field(default=10.0, validator=_number)
    transfers: int = attrs.field(default=1, validator=_non_negative)
    leases: bool = True
    suspend: bool = True
    enabled: bool = True
    store_calls: bool = True
    bad_inputs: bool = True
    drain_at_end: bool = True
    sweep_queries: bool = True
    change_log_size: int = attrs.field(default=6, validator=_positive)

    @property
    def spec(self) -> PagedStateCheckpointSpec:
        """The image geometry both stores are built with (``units_per_checkpoint`` units)."""
        image = self.page_unit_bytes * (self.units_per_checkpoint - 1) + 1
        return PagedStateCheckpointSpec(
            page_unit_bytes=self.page_unit_bytes,
            slot_bytes=self.page_unit_bytes * self.units_per_checkpoint,
            layout_id="conformance-v1",
            image_bytes=image,
        )

    @property
    def scratch_range(self) -> range:
        """The midstep scratch slot ids."""
        return range(self.seqs + 1, self.seqs + 1 + self.scratch_slots)


DEFAULT_CONFIG = ConformanceConfig()


# ---------------------------------------------------------------------------------------
# The environment's objects
# ---------------------------------------------------------------------------------------


class KitSeq:
    """A request as the coordinator sees it (``SequenceLike``). Both stores get the very
    same objects, so identity-keyed state (pending boundaries) agrees."""

    __slots__ = ("name", "state_slot", "has_per_req_cache")

    def __init__(self, name: str, state_slot: int, has_per_req_cache: bool = True) -> None:
        self.name = name
        self.state_slot = state_slot
        self.has_per_req_cache = has_per_req_cache

    def __repr__(self) -> str:
        return f"KitSeq({self.name!r}, slot={self.state_slot})"


class KitOffload:
    """The CPU tier's index, shared by both stores: ``could_serve(h)`` votes for the hashes
    in :attr:`served` (a rule toggles them); ``stats()`` is pure."""

    def __init__(self) -> None:
        self.served: set[int] = set()

    def could_serve(self, prefix_hash: int) -> bool:
        return prefix_hash in self.served

    def stats(self) -> dict[str, int]:
        return {"served": len(self.served)}


@attrs.frozen
class Pair:
    """A handle the two stores returned for one call: the reference's and the store under
    test's. They must be equal (both are values); each store is passed its own."""

    ref: Any
    sut: Any


@attrs.frozen
class _Outcome:
    ref: Any
    sut: Any
    error: type[BaseException] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@attrs.define
class _Side:
    """One store and the environment objects it owns."""

    name: str
    coord: Any
    pool: Any
    slots: SlotPool | None
    is_ref: bool

    def pick(self, pair: Pair) -> Any:
        return pair.ref if self.is_ref else pair.sut

    @property
    def store(self) -> Any:
        return self.coord.store


def _pool_of(coord: Any, given: Any) -> Any:
    pool = getattr(coord, "pool", None)
    if pool is None:
        pool = getattr(getattr(coord, "store", None), "pool", None)
    return given if pool is None else pool


# ---------------------------------------------------------------------------------------
# Strategies that read the machine's configuration (printed as plain values)
# ---------------------------------------------------------------------------------------


@functools.cache
def _cached(fn: Callable[[ConformanceConfig], st.SearchStrategy[Any]], c: ConformanceConfig) -> Any:
    return fn(c)


def _cfg(fn: Callable[[ConformanceConfig], st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """A strategy built from the running machine's :class:`ConformanceConfig`."""
    return st.runner().flatmap(lambda m: _cached(fn, m.config))


def _hashes(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(1, c.hashes)


def _seq_index(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(0, c.seqs + 1)


def _regular_seq_index(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(0, c.seqs - 1)


def _slots(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(0, c.seqs)


def _kv_units(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(1, c.kv_max_units)


def _counts(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(0, c.units + 1)


def _positions(c: ConformanceConfig) -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.lists(st.tuples(st.integers(0, 64), st.integers(1, c.hashes)), min_size=1, max_size=2)


def _block_hashes(c: ConformanceConfig) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, c.hashes), max_size=4)


H = _cfg(_hashes)
SEQ = _cfg(_seq_index)
REG_SEQ = _cfg(_regular_seq_index)
SLOT = _cfg(_slots)


def _known_hash(m: ConformanceMachine) -> st.SearchStrategy[int]:
    snap = m.snap_ref
    known = sorted(
        {r.prefix_hash for r in snap.records.values()}
        | {h for _, h in snap.pending_boundaries}
        | {h for h, _ in snap.scratch_queued}
    )
    every = _cached(_hashes, m.config)
    return st.one_of(st.sampled_from(known), every) if known else every


def _ready_hash(m: ConformanceMachine) -> st.SearchStrategy[int]:
    ready = sorted(m.snap_ref.index)
    every = _cached(_hashes, m.config)
    return st.one_of(st.sampled_from(ready), every) if ready else every


def _any_busy_slot(m: ConformanceMachine) -> st.SearchStrategy[int]:
    snap = m.snap_ref
    busy = sorted(
        {d for _, d in snap.queued_restores}
        | {d for _, d in snap.inflight_restores}
        | {d for _, _, d in snap.suspended}
    )
    every = _cached(_slots, m.config)
    return st.one_of(st.sampled_from(busy), every) if busy else every


def _busy_slot(m: ConformanceMachine) -> st.SearchStrategy[int]:
    snap = m.snap_ref
    busy = sorted({d for _, d in snap.queued_restores})
    every = _cached(_slots, m.config)
    return st.one_of(st.sampled_from(busy), every) if busy else every


#: A hash: one the store or a pending boundary knows, or any hash (state-drawn).
KNOWN_H: st.SearchStrategy[int] = st.runner().flatmap(_known_hash)
#: A hash: one with a READY image, or any hash (state-drawn).
READY_H: st.SearchStrategy[int] = st.runner().flatmap(_ready_hash)
#: A slot: one with a queued restore, or any slot (state-drawn).
BUSY_SLOT: st.SearchStrategy[int] = st.runner().flatmap(_busy_slot)
#: A slot: one with a queued, in-flight or suspended restore, or any slot (state-drawn).
ANY_BUSY_SLOT: st.SearchStrategy[int] = st.runner().flatmap(_any_busy_slot)


def _index_into(attr: str) -> st.SearchStrategy[int]:
    """An index into the machine's list ``attr`` (guard the rule with a precondition)."""
    return st.runner().flatmap(lambda m: st.integers(0, max(0, len(getattr(m, attr)) - 1)))


# ---------------------------------------------------------------------------------------
# Bad inputs: each is called on both sides and must raise the same class, changing nothing.
# ---------------------------------------------------------------------------------------

BadInput = Callable[[_Side, "ConformanceMachine"], Any]


def _some_record_units(m: ConformanceMachine) -> tuple[int, tuple[int, ...]]:
    snap = m.snap_ref
    for cid in sorted(snap.records):
        return cid, snap.records[cid].unit_ids
    return -1, (0,)


def _forged_lease_id(lease_id: Callable[[ConformanceMachine], Any]) -> BadInput:
    """Release a lease whose id is ``lease_id(m)`` (else the newest lease's fields): an id
    never handed out, or not an id at all."""

    def call(s: _Side, m: ConformanceMachine) -> Any:
        if m.lease_pairs:
            forged = attrs.evolve(s.pick(m.lease_pairs[-1]), lease_id=lease_id(m))
        else:
            forged = SuspendedCheckpointRestore(0, _dummy_restore_op(m), lease_id(m))
        return s.coord.release_suspended_restore(forged)

    return call


def _tampered_lease(s: _Side, m: ConformanceMachine) -> Any:
    if not m.lease_pairs:
        return s.coord.release_suspended_restore("not a lease")
    lease = s.pick(m.lease_pairs[-1])
    return s.coord.resume_suspended_restore(
        attrs.evolve(lease, checkpoint_id=lease.checkpoint_id + 1)
    )


def _dummy_restore_op(m: ConformanceMachine) -> Any:
    from pagedstate.spec.types import CheckpointRestoreOp

    spec = m.config.spec
    return CheckpointRestoreOp(0, (0,), spec.image_bytes, spec.layout_id)


def _release_record_as_kv(s: _Side, m: ConformanceMachine) -> Any:
    _cid, units = _some_record_units(m)
    return s.pool.release_units(list(units), (KV_OWNER, -1))


def _release_record_partly(s: _Side, m: ConformanceMachine) -> Any:
    from pagedstate.spec.types import CHECKPOINT_OWNER

    cid, units = _some_record_units(m)
    return s.pool.release_units(list(units[:-1]), (CHECKPOINT_OWNER, cid))


def _release_transfer_partly(s: _Side, m: ConformanceMachine) -> Any:
    from pagedstate.spec.types import TRANSFER_OWNER

    for owner, units in sorted(m.snap_ref.transfers.items(), key=repr):
        return s.pool.release_units(list(units[:-1]), (TRANSFER_OWNER, owner))
    return s.pool.release_units([], (TRANSFER_OWNER, ("load", -1)))


def _release_record_whole(s: _Side, m: ConformanceMachine) -> Any:
    from pagedstate.spec.types import CHECKPOINT_OWNER

    cid, units = _some_record_units(m)
    return s.pool.release_units(list(units), (CHECKPOINT_OWNER, cid))


def _stale_scratch(s: _Side, m: ConformanceMachine) -> Any:
    for slot in sorted(m.snap_ref.scratch_reserved):
        _slot, pos, h = m.scratch_latest[slot]
        return s.coord.publish_midstep([(slot, pos + 1, h)])
    return s.coord.publish_midstep([(999, 0, 1)])


class _HostileOwner:
    """An owner whose ``__hash__`` raises."""

    def __hash__(self) -> int:
        raise RuntimeError("hostile __hash__")

    def __repr__(self) -> str:
        return "_HostileOwner()"


def _seq0(m: ConformanceMachine) -> KitSeq:
    return m.seqs[0]


#: Named bad calls; the ``bad_input`` rule draws one by name. Each raises in the reference
#: (a specific :class:`~pagedstate.spec.errors.PagedStateError`) or, where it does not,
#: is still compared like any call.
BAD_INPUTS: Mapping[str, BadInput] = MappingProxyType(
    {
        "checkpoint_negative_blocks": lambda s, m: s.coord.checkpoint(_seq0(m), -1, 1),
        "checkpoint_str_hash": lambda s, m: s.coord.checkpoint(_seq0(m), 1, "1"),
        "checkpoint_bool_blocks": lambda s, m: s.coord.checkpoint(_seq0(m), True, 1),
        "begin_restore_negative_slot": lambda s, m: s.coord.begin_restore(1, -1),
        "begin_restore_str_hash": lambda s, m: s.coord.begin_restore("1", 0),
        "begin_restore_float_slot": lambda s, m: s.coord.begin_restore(1, 0.0),
        "unindex_str": lambda s, m: s.coord.unindex("1"),
        "unindex_float": lambda s, m: s.coord.unindex(1.0),
        "ensure_free_negative": lambda s, m: s.coord.ensure_free_units(-1),
        "has_available_str_count": lambda s, m: s.coord.has_available_units("1"),
        "has_available_str_protected": lambda s, m: s.coord.has_available_units(1, "1"),
        "reclaim_nan": lambda s, m: s.coord.reclaim_stale_offload_pins(math.nan),
        "reclaim_str": lambda s, m: s.coord.reclaim_stale_offload_pins("10"),
        "reclaim_bool": lambda s, m: s.coord.reclaim_stale_offload_pins(True),
        "release_source_tuple": lambda s, m: s.coord.release_offload_store_source((1, 1)),
        "settle_none": lambda s, m: s.coord.settle_offload_store(None),
        "was_reclaimed_int": lambda s, m: s.coord.was_reclaimed(3),
        "take_offload_negative": lambda s, m: s.coord.take_offload_stores(-1),
        "acquire_negative_limit": lambda s, m: s.coord.acquire_checkpoint_source(
            1, max_inflight=-1
        ),
        "acquire_str_hash": lambda s, m: s.coord.acquire_checkpoint_source("1"),
        "resumable_negative_hit": lambda s, m: s.coord.resumable_hit(_seq0(m), -1, [1]),
        "resumable_hit_too_long": lambda s, m: s.coord.resumable_hit(_seq0(m), 2, [1]),
        "reserve_midstep_bad_position": lambda s, m: s.coord.reserve_midstep(_seq0(m), [(1,)]),
        "publish_unknown_scratch": lambda s, m: s.coord.publish_midstep([(999, 0, 1)]),
        "cancel_malformed_scratch": lambda s, m: s.coord.cancel_midstep([(1, 2)]),
        "publish_scratch_twice_in_one_call": lambda s, m: s.coord.publish_midstep(
            [(m.config.seqs + 1, 0, 1), (m.config.seqs + 1, 0, 1)]
        ),
        "reserve_transfer_none": lambda s, m: s.coord.reserve_transfer_units(None),
        "reserve_transfer_unhashable": lambda s, m: s.coord.reserve_transfer_units(["x"]),
        "adopt_str_hash": lambda s, m: s.coord.adopt_transfer_units(("load", 0), "1"),
        "forged_lease": _forged_lease_id(
            lambda m: (m.lease_pairs[-1].ref.lease_id if m.lease_pairs else 0) + 10_000
        ),
        "forged_lease_negative_id": _forged_lease_id(lambda m: -1),
        "forged_lease_next_id": _forged_lease_id(lambda m: m.snap_ref.next_lease_id),
        "forged_lease_bool_id": _forged_lease_id(lambda m: True),
        "tampered_lease": _tampered_lease,
        "pool_reserve_negative": lambda s, m: s.pool.reserve_units(-1, (KV_OWNER, -1)),
        "pool_reserve_float": lambda s, m: s.pool.reserve_units(1.0, (KV_OWNER, -1)),
        "pool_reserve_none_owner": lambda s, m: s.pool.reserve_units(1, None),
        "pool_release_set": lambda s, m: s.pool.release_units({0}, (KV_OWNER, -1)),
        "pool_release_duplicate": lambda s, m: s.pool.release_units([0, 0], (KV_OWNER, -1)),
        "pool_release_negative_unit": lambda s, m: s.pool.release_units([-1], (KV_OWNER, -1)),
        "pool_release_wrong_owner": _release_record_as_kv,
        "pool_release_record_partly": _release_record_partly,
        "pool_release_transfer_partly": _release_transfer_partly,
        "attach_scratch_negative_budget": lambda s, m: s.coord.attach_midstep_scratch(
            SlotPool([]), -1
        ),
        "contains_str": lambda s, m: s.coord.contains("1"),
        "restore_queued_for_bool": lambda s, m: s.coord.restore_queued_for(True),
        "applies_not_a_sequence": lambda s, m: s.coord.applies(object()),
        "reserve_midstep_not_a_sequence": lambda s, m: s.coord.reserve_midstep(object(), [(0, 1)]),
        "resumable_hit_str_hash": lambda s, m: s.coord.resumable_hit(_seq0(m), 1, ["1"]),
        "publish_stale_scratch": _stale_scratch,
        "release_transfer_unhashable": lambda s, m: s.coord.release_transfer_units(["x"]),
        "reserve_transfer_hostile": lambda s, m: s.coord.reserve_transfer_units(_HostileOwner()),
        "pool_reserve_hostile_owner": lambda s, m: s.pool.reserve_units(1, _HostileOwner()),
        "pool_release_record_whole": _release_record_whole,
        "pool_has_free_str": lambda s, m: s.pool.has_free("1"),
        "pool_owner_of_str": lambda s, m: s.pool.owner_of("0"),
    }
)

#: Bad inputs that go through ``coordinator.store`` (skipped when ``store_calls`` is off).
_STORE_BAD_INPUTS: Mapping[str, BadInput] = MappingProxyType(
    {
        "changed_since_str": lambda s, m: s.store.changed_since("0"),
        "cancel_restore_str_slot": lambda s, m: s.store.cancel_queued_restore("0"),
        "lookup_str": lambda s, m: s.store.lookup("1"),
        "contains_or_pending_list": lambda s, m: s.store.contains_or_pending([1]),
    }
)

#: Where :meth:`ConformanceMachine.engine_pass` injects an abort or reset: ``*_pending``
#: after the boundary is filed and before the drain, ``*_in_flight`` after the drain and
#: before the completion; ``no_completion`` leaves the batch in flight.
PASS_FAULTS = (
    "none",
    "unindex_pending",
    "forget_pending",
    "clear_pending",
    "unindex_in_flight",
    "clear_in_flight",
    "forget_in_flight",
    "kv_pressure_in_flight",
    "no_completion",
)

_QUERIES = (
    "resumable_hit",
    "contains",
    "restore_queued_for",
    "has_available_units",
    "has_offload_pins",
    "checkpoint_fates",
)
_STORE_QUERIES = ("lookup", "contains_or_pending", "changed_since")


# ---------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------


class ConformanceMachine(RuleBasedStateMachine):
    """Lockstep of a store under test against the reference model.

    Subclass it (or let :func:`conformance_machine` do it) and set the class attributes:

    Attributes:
        coordinator_factory: builds the coordinator under test (reference signature).
        pool_factory: ``pool_factory(num_units)`` builds the pool handed to it.
        config: the :class:`ConformanceConfig`.
        rows_hit: table-row labels the reference took, over every test case this class ran
            (each subclass has its own).
        events_by_rule: ``rule name -> {(machine, event)}`` observed, over every test case.

    Instances hold both coordinators (``ref``, ``sut``), their last snapshots
    (``snap_ref``, ``snap_sut``), the shared :class:`~pagedstate.models.world.ManualClock`
    and the environment's handles.
    """

    coordinator_factory: ClassVar[CoordinatorFactory] = PagedStateCheckpointCoordinator
    pool_factory: ClassVar[PoolFactory] = UnitPool
    config: ClassVar[ConformanceConfig] = DEFAULT_CONFIG
    rows_hit: ClassVar[set[str]] = set()
    events_by_rule: ClassVar[dict[str, set[tuple[str, str]]]] = {}

    ops: ClassVar[Bundle[Pair]] = Bundle("op")
    leases: ClassVar[Bundle[Pair]] = Bundle("lease")
    owners: ClassVar[Bundle[Hashable]] = Bundle("owner")
    scratch: ClassVar[Bundle[Pair]] = Bundle("scratch")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.rows_hit = set()
        cls.events_by_rule = {}

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        c = cls.config
        self.clock = ManualClock(1000.0)
        self.tier: KitOffload | None = KitOffload() if c.offload else None
        spec = c.spec
        midstep = c.scratch_slots > 0
        ref_pool = UnitPool(c.units)
        self.ref = PagedStateCheckpointCoordinator(
            ref_pool,
            spec,
            c.enabled,
            self.tier,
            midstep,
            clock=self.clock,
            offload_backlog_cap=c.backlog_cap,
            forfeit_bound=c.forfeit_bound,
            change_log_size=c.change_log_size,
        )
        given = cls.pool_factory(c.units)
        self.sut = cls.coordinator_factory(
            given,
            spec,
            c.enabled,
            self.tier,
            midstep,
            clock=self.clock,
            offload_backlog_cap=c.backlog_cap,
            forfeit_bound=c.forfeit_bound,
            change_log_size=c.change_log_size,
        )
        needed = ("snapshot", "checkpoint", "take_checkpoint_ops")
        missing = [
            name
            for name in needed + (("store",) if c.store_calls else ())
            if not hasattr(self.sut, name)
        ]
        if missing:
            raise ConformanceFailure(
                f"[rule __init__] construction: coordinator_factory returned {self.sut!r}"
                f" ({type(self.sut).__qualname__}), not a coordinator: it has no"
                f" {', '.join(missing)} (the factory takes the reference's arguments: pool,"
                " spec, enabled, offload, readable_midstep, clock=..., offload_backlog_cap=...,"
                " forfeit_bound=..., change_log_size=...)"
            )
        self.sink: set[tuple[str, int]] = set()
        self.ref.row_sink = self.sink
        self.sides = (
            _Side(
                "reference",
                self.ref,
                _pool_of(self.ref, ref_pool),
                SlotPool(c.scratch_range) if midstep else None,
                True,
            ),
            _Side(
                "store under test",
                self.sut,
                _pool_of(self.sut, given),
                SlotPool(c.scratch_range) if midstep else None,
                False,
            ),
        )
        self.seqs = tuple(KitSeq(f"s{i}", i) for i in range(c.seqs)) + (
            KitSeq("no-cache", c.seqs, has_per_req_cache=False),
            KitSeq("no-slot", -1),
        )
        # Environment memory.
        self.kv: list[tuple[Hashable, Pair]] = []
        self.kv_next = 0
        self.op_pairs: list[Pair] = []
        self.lease_pairs: list[Pair] = []
        # ``restore_storm`` is long (over a hundred calls): once per test case.
        self.stormed = False
        # The latest midstep reservation handed out per scratch slot (an older one for the
        # same slot is stale once the slot was lent again).
        self.scratch_latest: dict[int, tuple[int, int, int]] = {}
        self.transfer_next = 0
        self.max_pins = 0
        self.max_records = 0
        self._clean = True
        self._rule = "__init__"
        self.calls_since_quiesce = 0
        self.calls_since_clear = 0
        self.snap_ref: Snapshot = self.ref.snapshot()
        self.snap_sut: Snapshot = self.sut.snapshot()
        self._compare_snapshots("construction", self.snap_ref, self.snap_sut)
        if midstep:
            self._both(
                "__init__",
                f"attach_midstep_scratch(SlotPool({list(c.scratch_range)}), {c.max_ops_per_batch})",
                lambda s: s.coord.attach_midstep_scratch(s.slots, c.max_ops_per_batch),
            )

    # -- the lockstep core ------------------------------------------------------------

    def _fail(self, what: str, problem: str, cause: BaseException | None = None) -> None:
        self._clean = False
        msg = f"[rule {self._rule}] {what}: {problem}"
        if cause is not None:
            raise ConformanceFailure(msg) from cause
        raise ConformanceFailure(msg)

    def _compare_snapshots(self, what: str, ref: Snapshot, sut: Snapshot) -> None:
        if ref != sut:
            diff = "\n  ".join(ref.diff(sut))
            self._fail(
                what,
                "snapshots differ (reference != store under test):\n  " + diff,
            )

    def _both(self, rule_name: str, what: str, call: Callable[[_Side], Any]) -> _Outcome:
        """Call ``call`` on the reference, then on the store under test; compare outcomes,
        snapshots and invariants; label the rows the reference took."""
        self._rule = rule_name
        self._clean = False
        self.calls_since_quiesce += 1
        self.calls_since_clear += 1
        self.sink.clear()
        ref_side, sut_side = self.sides
        results: list[tuple[bool, Any]] = []
        for side in (ref_side, sut_side):
            try:
                results.append((True, call(side)))
            except Exception as exc:  # noqa: BLE001 - every outcome is compared
                results.append((False, exc))
        (ref_ok, ref_val), (sut_ok, sut_val) = results
        self._note_rows(rule_name)
        before_ref, before_sut = self.snap_ref, self.snap_sut
        after_ref = self.ref.snapshot()
        after_sut = self.sut.snapshot()
        if not ref_ok and isinstance(ref_val, (IllegalTransitionError, PinUnderflowError)):
            self._fail(
                what,
                f"the reference model raised {ref_val!r}: the reference broke its own table"
                " (a bug in the reference or in the kit, not in the store under test)",
                ref_val,
            )
        if ref_ok and not sut_ok:
            self._fail(
                what,
                f"the reference returned {ref_val!r}; the store under test raised {sut_val!r}",
                sut_val,
            )
        if sut_ok and not ref_ok:
            self._fail(
                what,
                f"the reference raised {ref_val!r}; the store under test returned {sut_val!r}",
            )
        error: type[BaseException] | None = None
        if not ref_ok:
            error = type(ref_val)
            if type(sut_val) is not type(ref_val):
                self._fail(
                    what,
                    f"the reference raised {type(ref_val).__name__} ({ref_val}); the store"
                    f" under test raised {type(sut_val).__name__} ({sut_val})",
                    sut_val,
                )
            if after_ref != before_ref:
                self._fail(
                    what,
                    f"the reference raised {ref_val!r} and changed state (G8):\n  "
                    + "\n  ".join(before_ref.diff(after_ref)),
                )
            if after_sut != before_sut:
                self._fail(
                    what,
                    f"the store under test raised {sut_val!r} and changed state (G8):\n  "
                    + "\n  ".join(before_sut.diff(after_sut)),
                )
            _event(f"{rule_name} raised {error.__name__}")
        elif ref_val != sut_val:
            self._fail(
                what,
                f"results differ: the reference returned {ref_val!r}, the store under test"
                f" returned {sut_val!r}",
            )
        self._compare_snapshots(what, after_ref, after_sut)
        problems = check_invariants(after_sut)
        if problems:
            self._fail(what, "invariants broken: " + "; ".join(f"{n}: {p}" for n, p in problems))
        steps = check_step_invariants(before_sut, after_sut)
        if steps:
            self._fail(what, "step invariants broken: " + "; ".join(f"{n}: {p}" for n, p in steps))
        own_check = getattr(self.sut, "self_check", None)
        if callable(own_check):
            own = own_check()
            if own:
                self._fail(what, "the store under test's own self_check reports: " + "; ".join(own))
        if ref_side.slots is not None and sut_side.slots is not None:
            if ref_side.slots.free_slots != sut_side.slots.free_slots:
                self._fail(
                    what,
                    f"free scratch slots differ: reference {sorted(ref_side.slots.free_slots)},"
                    f" store under test {sorted(sut_side.slots.free_slots)}",
                )
        self.snap_ref, self.snap_sut = after_ref, after_sut
        self.max_pins = max(
            self.max_pins, max((r.pin_count for r in after_sut.records.values()), default=0)
        )
        self.max_records = max(self.max_records, len(after_sut.records))
        if self.config.sweep_queries:
            self._sweep(what)
        self._clean = True
        return _Outcome(ref_val, sut_val, error)

    def _queries(self) -> list[tuple[str, Callable[[_Side], Any]]]:
        """Every read-only question of :attr:`ConformanceConfig.sweep_queries`."""
        c = self.config
        hashes = range(1, c.hashes + 1)
        out: list[tuple[str, Callable[[_Side], Any]]] = []
        for k in range(c.units + 2):
            for p in (None, *hashes):
                question = f"has_available_units({k}, {p})"
                out.append((question, _call_coord("has_available_units", k, p)))
        for slot in (*range(c.seqs + 1), *c.scratch_range):
            out.append((f"restore_queued_for({slot})", _call_coord("restore_queued_for", slot)))
        for h in hashes:
            out.append((f"contains({h})", _call_coord("contains", h)))
        if c.store_calls:
            for h in hashes:
                out.append((f"store.lookup({h})", _call_store("lookup", h)))
                question = f"store.contains_or_pending({h})"
                out.append((question, _call_store("contains_or_pending", h)))
            gen = self.snap_ref.generation
            for g in range(max(0, gen - c.change_log_size - 1), gen + 1):
                out.append((f"store.changed_since({g})", _call_store("changed_since", g)))
        return out

    def _sweep(self, what: str) -> None:
        """Ask both stores every read-only question and compare (see ``sweep_queries``)."""
        ref_side, sut_side = self.sides
        for question, call in self._queries():
            answers: list[tuple[bool, Any]] = []
            for side in (ref_side, sut_side):
                try:
                    answers.append((True, call(side)))
                except Exception as exc:  # noqa: BLE001 - compared below
                    answers.append((False, exc))
            (ref_ok, ref_val), (sut_ok, sut_val) = answers
            if ref_ok != sut_ok or (
                (ref_val != sut_val) if ref_ok else (type(ref_val) is not type(sut_val))
            ):
                self._fail(
                    what,
                    f"after it, {question} answers differ: the reference"
                    f" {'returned' if ref_ok else 'raised'} {ref_val!r}, the store under test"
                    f" {'returned' if sut_ok else 'raised'} {sut_val!r}",
                )
        if self.sut.snapshot() != self.snap_sut:
            self._fail(what, "the read-only questions asked after it changed the store's state")

    def _note_rows(self, rule_name: str) -> None:
        # The end-of-run drain is a check, not part of the run: its rows are not coverage.
        if not self.sink or rule_name == "teardown":
            return
        cls = type(self)
        seen = cls.events_by_rule.setdefault(rule_name, set())
        for machine, row_id in sorted(self.sink):
            table: Table = TABLES[machine]
            row = table.rows[row_id]
            label = table.label(row)
            _event(label)
            cls.rows_hit.add(label)
            seen.add((machine, row.event))

    def _seq(self, s: int) -> KitSeq:
        return self.seqs[s]

    # -- a pass of the engine: boundaries, drain, completion ---------------------------

    @rule(s=SEQ, h=H, blocks=st.integers(0, 3))
    def checkpoint(self, s: int, h: int, blocks: int) -> None:
        """File boundary ``h`` of a sequence (supersedes its older one, G1)."""
        seq = self._seq(s)
        self._both(
            "checkpoint",
            f"checkpoint({seq!r}, {blocks}, {h})",
            lambda x: x.coord.checkpoint(seq, blocks, h),
        )

    @rule(s=SEQ)
    def forget(self, s: int) -> None:
        """Abort: the sequence leaves its slot (pending boundary and queued restore go)."""
        seq = self._seq(s)
        self._both("forget", f"forget_pending({seq!r})", lambda x: x.coord.forget_pending(seq))

    @initialize(hs=st.lists(H, min_size=1, max_size=3, unique=True))
    def warm_up(self, hs: list[int]) -> None:
        """Start from READY records: file a boundary of ``h`` for sequence ``i`` (one per
        regular sequence, round robin), then one drain and one completion."""
        for i, h in enumerate(hs):
            seq = self.seqs[i % self.config.seqs]
            self._both(
                "warm_up", f"checkpoint({seq!r}, 1, {h})", _call_coord("checkpoint", seq, 1, h)
            )
        if hs:
            self._both("warm_up", "take_checkpoint_ops()", lambda x: x.coord.take_checkpoint_ops())
            self._both(
                "warm_up", "complete_previous_batch()", lambda x: x.coord.complete_previous_batch()
            )

    @rule(
        boundaries=st.lists(st.tuples(REG_SEQ, H), min_size=1, max_size=3),
        fault=st.sampled_from(("none", "none", *PASS_FAULTS)),
    )
    def engine_pass(self, boundaries: list[tuple[int, int]], fault: str) -> None:
        """A whole engine pass in one step: file a boundary ``(sequence, h)`` for each of
        ``boundaries``, drain, and complete the batch (the common path, so READY records
        appear often), with an abort or reset injected at one point of it
        (:data:`PASS_FAULTS`; it acts on the first boundary's sequence and hash)."""
        name = "engine_pass"
        for s, h in boundaries:
            seq = self._seq(s)
            self._both(name, f"checkpoint({seq!r}, 1, {h})", _call_coord("checkpoint", seq, 1, h))
        seq, h = self._seq(boundaries[0][0]), boundaries[0][1]
        if fault.endswith("_pending"):
            self._pass_fault(fault, seq, h)
        self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
        if fault.endswith("_in_flight"):
            self._pass_fault(fault, seq, h)
        if fault != "no_completion":
            self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))

    def _pass_fault(self, fault: str, seq: KitSeq, h: int) -> None:
        kind = fault.rsplit("_", 2)[0] if fault.endswith("_in_flight") else fault.rsplit("_", 1)[0]
        name = "engine_pass"
        if kind == "unindex":
            self._both(name, f"unindex({h})", _call_coord("unindex", h))
        elif kind == "clear":
            self._both(name, "clear_index()", _call_coord("clear_index"))
        elif kind == "forget":
            self._both(name, f"forget_pending({seq!r})", _call_coord("forget_pending", seq))
        elif kind == "kv_pressure":
            n = self.config.units
            self._both(name, f"ensure_free_units({n})", _call_coord("ensure_free_units", n))

    @precondition(lambda self: self.config.scratch_slots > 0)
    @rule(
        s=REG_SEQ,
        positions=_cfg(_positions),
        boundary=st.tuples(REG_SEQ, H),
        restore=st.tuples(SLOT, READY_H),
        complete=st.booleans(),
    )
    def midstep_pass(
        self,
        s: int,
        positions: list[tuple[int, int]],
        boundary: tuple[int, int],
        restore: tuple[int, int],
        complete: bool,
    ) -> None:
        """A pass that fills one drain: midstep scratch stores reserved and published, a
        boundary filed and a restore queued, then the drain, so that the per-batch budget
        is met and exceeded (the scratch stores left over wait: ``issue[over_budget]``)
        and the order of the drain's ops is compared with all three kinds in it."""
        name = "midstep_pass"
        seq = self._seq(s)
        out = self._both(
            name,
            f"reserve_midstep({seq!r}, {positions!r})",
            lambda x: x.coord.reserve_midstep(seq, list(positions)),
        )
        if out.ok and out.ref:
            for triple in out.ref:
                self.scratch_latest[triple[0]] = triple
            res = Pair(out.ref, out.sut)
            self._both(name, f"publish_midstep({res.ref!r})", _call_picked("publish_midstep", res))
        bseq, h = self._seq(boundary[0]), boundary[1]
        self._both(name, f"checkpoint({bseq!r}, 1, {h})", _call_coord("checkpoint", bseq, 1, h))
        slot, rh = restore
        self._both(name, f"begin_restore({rh}, {slot})", _call_coord("begin_restore", rh, slot))
        self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
        if complete:
            self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))

    @rule()
    def drain(self) -> None:
        """The drain of a non-empty batch: begin stores, take restores, issue scratch."""
        self._both("drain", "take_checkpoint_ops()", lambda x: x.coord.take_checkpoint_ops())

    @rule()
    def complete(self) -> None:
        """The last drain's batch was issued: publish stores, unpin restores."""
        self._both(
            "complete", "complete_previous_batch()", lambda x: x.coord.complete_previous_batch()
        )

    # -- restores --------------------------------------------------------------------------

    @rule(slot=st.one_of(SLOT, ANY_BUSY_SLOT), h=READY_H)
    def begin_restore(self, slot: int, h: int) -> None:
        """Queue a restore of ``h`` into ``slot`` (SlotBusyError when the slot has a queued,
        in-flight or suspended restore, G4: such slots are drawn on purpose)."""
        self._both(
            "begin_restore", f"begin_restore({h}, {slot})", lambda x: x.coord.begin_restore(h, slot)
        )

    @precondition(lambda self: self.config.store_calls)
    @rule(slot=BUSY_SLOT)
    def cancel_restore(self, slot: int) -> None:
        """Abort: cancel the queued restore into ``slot`` (store level)."""
        self._both(
            "cancel_restore",
            f"store.cancel_queued_restore({slot})",
            lambda x: x.store.cancel_queued_restore(slot),
        )

    @precondition(lambda self: self.config.suspend)
    @rule(target=leases, slot=BUSY_SLOT)
    def suspend(self, slot: int) -> Pair | MultipleResults[Pair]:
        """Suspend the queued restore into ``slot``; its lease joins the ``lease`` bundle."""
        out = self._both(
            "suspend",
            f"suspend_queued_restore({slot})",
            lambda x: x.coord.suspend_queued_restore(slot),
        )
        if out.ok and out.ref is not None:
            pair = Pair(out.ref, out.sut)
            self.lease_pairs.append(pair)
            return pair
        return multiple()

    @precondition(lambda self: self.config.suspend)
    @rule(target=leases, slot=SLOT, h=READY_H)
    def restore_and_suspend(self, slot: int, h: int) -> Pair | MultipleResults[Pair]:
        """Queue a restore of ``h`` into ``slot`` and suspend it at once (a request paused
        before its batch ran); the lease joins the ``lease`` bundle."""
        self._both(
            "restore_and_suspend",
            f"begin_restore({h}, {slot})",
            lambda x: x.coord.begin_restore(h, slot),
        )
        out = self._both(
            "restore_and_suspend",
            f"suspend_queued_restore({slot})",
            lambda x: x.coord.suspend_queued_restore(slot),
        )
        if out.ok and out.ref is not None:
            pair = Pair(out.ref, out.sut)
            self.lease_pairs.append(pair)
            return pair
        return multiple()

    @rule(lease=leases)
    def resume(self, lease: Pair) -> None:
        """Resume a suspended restore (a spent lease raises LeaseReusedError, G3)."""
        self._both(
            "resume",
            f"resume_suspended_restore({lease.ref!r})",
            lambda x: x.coord.resume_suspended_restore(x.pick(lease)),
        )

    @rule(lease=leases)
    def release_lease(self, lease: Pair) -> None:
        """Release a suspended restore and its pin (a second use raises, G3)."""
        self._both(
            "release_lease",
            f"release_suspended_restore({lease.ref!r})",
            lambda x: x.coord.release_suspended_restore(x.pick(lease)),
        )

    # -- index changes (KV eviction, admin reset) --------------------------------------

    @rule(h=KNOWN_H)
    def unindex(self, h: int) -> None:
        """The KV prefix ``h`` was evicted (at any time: COPYING, READY, pinned...)."""
        self._both("unindex", f"unindex({h})", lambda x: x.coord.unindex(h))

    @precondition(lambda self: self.calls_since_clear >= 30)
    @rule(complete=st.booleans())
    def clear_index(self, complete: bool) -> None:
        """Admin reset of the index (``complete``: then complete the batch in flight).

        Enabled 30 calls after the last reset: a reset wipes the state the other rules
        build, so it must not be drawn as often as they are. The argument also keeps it
        from being Hypothesis's first-choice rule (rules without arguments come first in
        its order, and the first is drawn most)."""
        self.calls_since_clear = 0
        self._both("clear_index", "clear_index()", _call_coord("clear_index"))
        if complete:
            self._both(
                "clear_index", "complete_previous_batch()", _call_coord("complete_previous_batch")
            )

    # -- KV pressure from other owners --------------------------------------------------

    @precondition(lambda self: self.config.kv_tenants > 0)
    @rule(n=_cfg(_kv_units))
    def kv_alloc(self, n: int) -> None:
        """A KV block allocation of another owner: ``ensure_free_units(n)`` (evicting
        unpinned READY checkpoints), then ``pool.reserve_units(n, ("live-kv", k))``. When
        ``kv_tenants`` allocations are already held, the oldest is returned first (KV churn:
        pressure comes and goes instead of filling the pool for good)."""
        if len(self.kv) >= self.config.kv_tenants:
            old, units = self.kv.pop(0)
            self._both(
                "kv_alloc", f"pool.release_units({units.ref}, {old!r})", _release_kv(units, old)
            )
        owner = (KV_OWNER, self.kv_next)
        self.kv_next += 1
        made = self._both(
            "kv_alloc", f"ensure_free_units({n})", lambda x: x.coord.ensure_free_units(n)
        )
        if not (made.ok and made.ref):
            return
        got = self._both(
            "kv_alloc",
            f"pool.reserve_units({n}, {owner!r})",
            lambda x: x.pool.reserve_units(n, owner),
        )
        if got.ok and got.ref is not None:
            self.kv.append((owner, Pair(list(got.ref), list(got.sut))))

    @precondition(lambda self: bool(self.kv))
    @rule(i=_index_into("kv"), how=st.sampled_from(["whole", "partial", "wrong_owner"]))
    def kv_free(self, i: int, how: str) -> None:
        """Another owner returns KV allocation ``i``: whole, or (bad input) only part of it
        (PartialReleaseError, G9) or under another owner's tag (WrongOwnerError)."""
        owner, units = self.kv[i]
        if how == "whole":
            del self.kv[i]
            self._both(
                "kv_free",
                f"pool.release_units({units.ref}, {owner!r})",
                _release_kv(units, owner),
            )
        elif how == "partial":
            part = Pair(units.ref[:-1], units.sut[:-1])
            self._both(
                "kv_free",
                f"pool.release_units({part.ref}, {owner!r})",
                _release_kv(part, owner),
            )
        else:
            wrong = (KV_OWNER, -1 - i)
            self._both(
                "kv_free",
                f"pool.release_units({units.ref}, {wrong!r})",
                _release_kv(units, wrong),
            )

    # -- offload and leases (the CPU tier's reports, in any order) ----------------------

    @precondition(lambda self: self.tier is not None)
    @rule(target=ops, room=st.integers(-1, 2))
    def take_offload(self, room: int) -> MultipleResults[Pair]:
        """Hand nominated images to the tier, which has ``room`` free places: it passes
        ``max_inflight = outstanding ops + room`` (at least 0, at most
        ``max_offload_inflight``; ``room <= 0``: full). Each op joins the ``op`` bundle."""
        limit = max(
            0, min(self.config.max_offload_inflight, len(self.snap_ref.offload_pins) + room)
        )
        out = self._both(
            "take_offload",
            f"take_offload_stores({limit})",
            lambda x: x.coord.take_offload_stores(limit),
        )
        if not out.ok:
            return multiple()
        pairs = [Pair(r[0], s[0]) for r, s in zip(out.ref, out.sut, strict=True)]
        self.op_pairs.extend(pairs)
        return multiple(*pairs)

    @precondition(lambda self: self.config.leases)
    @rule(target=ops, h=READY_H, limited=st.booleans())
    def acquire(self, h: int, limited: bool) -> Pair | MultipleResults[Pair]:
        """Lease ``h``'s image for an external transfer (never reclaimed)."""
        limit = self.config.max_offload_inflight if limited else None
        out = self._both(
            "acquire",
            f"acquire_checkpoint_source({h}, max_inflight={limit})",
            lambda x: x.coord.acquire_checkpoint_source(h, max_inflight=limit),
        )
        if out.ok and out.ref is not None:
            pair = Pair(out.ref[0], out.sut[0])
            self.op_pairs.append(pair)
            return pair
        return multiple()

    @rule(op=ops, times=st.integers(1, 2), stall=st.booleans())
    def release_source(self, op: Pair, times: int, stall: bool) -> None:
        """Phase-1 report (the gather drained), sent ``times`` times (a duplicate); late
        and duplicated ones are ignored. With ``stall``, the terminal report does not come
        in time: the clock jumps two timeouts and the reclaimer runs, so a later settle of
        this op is a late report."""
        for _ in range(times):
            self._both(
                "release_source",
                f"release_offload_store_source({op.ref!r})",
                _call_picked("release_offload_store_source", op),
            )
        if stall:
            timeout = self.config.timeout_s
            self.clock.now += 2 * timeout
            self._both(
                "release_source",
                f"reclaim_stale_offload_pins({timeout})",
                _call_coord("reclaim_stale_offload_pins", timeout),
            )

    @rule(op=ops)
    def settle(self, op: Pair) -> None:
        """Terminal report; asks ``was_reclaimed`` first, as the tier does."""
        self._both_op("settle", "was_reclaimed", op)
        self._both_op("settle", "settle_offload_store", op)

    @rule(op=ops)
    def report(self, op: Pair) -> None:
        """Both reports in order (the normal path): release the source, then settle."""
        self._both_op("report", "release_offload_store_source", op)
        self._both_op("report", "settle_offload_store", op)

    @rule(op=ops)
    def settle_first(self, op: Pair) -> None:
        """Reports out of order: the terminal report, then a late phase-1 report."""
        self._both_op("settle_first", "settle_offload_store", op)
        self._both_op("settle_first", "release_offload_store_source", op)

    def _both_op(self, rule_name: str, name: str, op: Pair) -> None:
        """``coordinator.<name>(op)`` on both sides, each with its own handle of ``op``."""
        self._both(rule_name, f"{name}({op.ref!r})", _call_picked(name, op))

    @rule(op=consumes(ops))
    def lose_report(self, op: Pair) -> None:
        """The tier's reports for ``op`` are lost (never sent): only the reclaimer can take
        its pin back (a lease's pin stays until the end-of-run drain)."""
        del op

    @precondition(lambda self: self.tier is not None or self.config.leases)
    @rule(
        factor=st.sampled_from([1.0, 0.5, 2.0, 0.0, -1.0]),
        jump=st.sampled_from([1.0, 2.0, 0.0, 0.25, -0.5]),
    )
    def reclaim(self, factor: float, jump: float) -> None:
        """The clock jumps ``jump * timeout_s`` (a negative jump: the clock was set back,
        so pins are no longer in the order of their times), then
        ``reclaim_stale_offload_pins(factor * timeout_s)`` (``factor <= 0`` disables the
        reclaim)."""
        self.clock.now += jump * self.config.timeout_s
        timeout = factor * self.config.timeout_s
        self._both(
            "reclaim",
            f"reclaim_stale_offload_pins({timeout})",
            lambda x: x.coord.reclaim_stale_offload_pins(timeout),
        )

    @precondition(lambda self: self.tier is not None)
    # "vote" and "sink" are listed twice: switching the sink off stops nominations until a
    # later "sink", so it is drawn less often than the calls that keep the tier busy.
    @rule(mode=st.sampled_from(["vote", "sink", "vote", "sink", "load_only", "detach"]), h=H)
    def attach_offload(self, mode: str, h: int) -> None:
        """Re-wire the tier: sink on, load only (no nominations), or detached; or (``vote``)
        the tier starts or stops claiming it could serve ``h`` (no store call)."""
        if mode == "vote":
            assert self.tier is not None
            self.tier.served ^= {h}
            return
        tier = None if mode == "detach" else self.tier
        sink = mode == "sink"
        self._both(
            "attach_offload",
            f"attach_offload({'None' if tier is None else 'tier'}, sink={sink})",
            lambda x: x.coord.attach_offload(tier, sink=sink),
        )

    # -- scenarios too long for random steps (macro rules) ---------------------------------
    # Each chains public calls into a situation that random single steps reach too rarely
    # for a bounded run: many re-stamps of one record, two nominees deferred in one take, a
    # reclaim after the clock went back with a lease outstanding. Every call is compared
    # like any other; when the store's state does not allow a step (no room, a busy slot),
    # the call is refused on both sides and the scenario goes on from there.

    def _file(self, name: str, hs: Sequence[int]) -> None:
        """One engine pass filing a boundary of each of ``hs`` (sequence ``i`` files
        ``hs[i]``, round robin over the regular sequences), then the drain and the
        completion: the records go READY in that order (oldest first)."""
        for i, h in enumerate(hs):
            seq = self.seqs[i % self.config.seqs]
            self._both(name, f"checkpoint({seq!r}, 1, {h})", _call_coord("checkpoint", seq, 1, h))
        self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
        self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))

    def _sink_on(self, name: str) -> None:
        tier = self.tier
        self._both(
            name,
            "attach_offload(tier, sink=True)",
            lambda x: x.coord.attach_offload(tier, sink=True),
        )

    def _take_offload(self, name: str, room: int) -> list[Pair]:
        limit = max(
            0, min(self.config.max_offload_inflight, len(self.snap_ref.offload_pins) + room)
        )
        out = self._both(
            name, f"take_offload_stores({limit})", lambda x: x.coord.take_offload_stores(limit)
        )
        if not out.ok:
            return []
        pairs = [Pair(r[0], s[0]) for r, s in zip(out.ref, out.sut, strict=True)]
        self.op_pairs.extend(pairs)
        return pairs

    @precondition(lambda self: not self.stormed)
    @rule(
        hs=st.lists(H, min_size=2, max_size=2, unique=True),
        slot=SLOT,
        n=st.integers(34, 48),
    )
    def restore_storm(self, hs: list[int], slot: int, n: int) -> None:
        """File ``hs[0]`` then ``hs[1]`` (so ``hs[0]`` is the older record), restore
        ``hs[1]`` ``n`` times (each restore re-stamps it: a store that keeps a victim heap
        by stamp piles up stale entries and compacts it), then ask for one image's worth of
        units beyond what is free: the one victim must be the least recently used record.
        Once per test case (it is long)."""
        name = "restore_storm"
        self.stormed = True
        old, hot = hs
        self._file(name, [old, hot])
        for _ in range(n):
            self._both(
                name, f"begin_restore({hot}, {slot})", _call_coord("begin_restore", hot, slot)
            )
            self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
            self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))
        want = len(self.snap_ref.free) + self.config.units_per_checkpoint
        self._both(name, f"ensure_free_units({want})", _call_coord("ensure_free_units", want))

    @precondition(lambda self: self.tier is not None)
    @rule(target=ops, hs=st.lists(H, min_size=2, max_size=2, unique=True))
    def deferred_nominees(self, hs: list[int]) -> MultipleResults[Pair]:
        """Two nominees deferred in one take: ``hs`` are filed and handed to the tier,
        dropped from the index while their stores are in flight (the records wait, pinned),
        filed again (new nominees of hashes whose operations are outstanding), and a take
        defers both; once the first operations are reported, a take hands the two out in
        their nomination order."""
        name = "deferred_nominees"
        self._sink_on(name)
        self._file(name, hs)
        first = self._take_offload(name, 2)
        for h in hs:
            self._both(name, f"unindex({h})", _call_coord("unindex", h))
        self._file(name, hs)
        later = self._take_offload(name, 2)
        for op in first:
            self._both_op(name, "release_offload_store_source", op)
            self._both_op(name, "settle_offload_store", op)
        later += self._take_offload(name, 2)
        return multiple(*first, *later)

    @precondition(lambda self: self.tier is not None and self.config.leases)
    @rule(target=ops, hs=st.lists(H, min_size=3, max_size=3, unique=True))
    def lease_and_clock_back(self, hs: list[int]) -> MultipleResults[Pair]:
        """A reclaim after the clock went back, with a lease outstanding: ``hs`` are filed
        (and nominated, the sink on); one store is taken (the oldest nominee), ``hs[2]`` is
        leased, the clock is set back half a timeout and another store is taken (pinned
        earlier than the first: out of order), then the clock jumps two timeouts and the
        reclaimer runs. It retires both stores and never the lease."""
        name = "lease_and_clock_back"
        timeout = self.config.timeout_s
        self._sink_on(name)
        self._file(name, hs)
        got = self._take_offload(name, 1)
        lease_h = hs[2]
        out = self._both(
            name,
            f"acquire_checkpoint_source({lease_h})",
            lambda x: x.coord.acquire_checkpoint_source(lease_h),
        )
        if out.ok and out.ref is not None:
            pair = Pair(out.ref[0], out.sut[0])
            self.op_pairs.append(pair)
            got.append(pair)
        self.clock.now -= 0.5 * timeout
        got += self._take_offload(name, 1)
        self.clock.now += 2 * timeout
        self._both(
            name,
            f"reclaim_stale_offload_pins({timeout})",
            _call_coord("reclaim_stale_offload_pins", timeout),
        )
        return multiple(*got)

    # -- transfers ------------------------------------------------------------------------

    @precondition(lambda self: len(self.snap_ref.transfers) < self.config.transfers)
    @rule(target=owners)
    def reserve_transfer(self) -> Hashable | MultipleResults[Hashable]:
        """Reserve one image's units for an external load under a fresh owner."""
        owner = ("load", self.transfer_next)
        self.transfer_next += 1
        out = self._both(
            "reserve_transfer",
            f"reserve_transfer_units({owner!r})",
            lambda x: x.coord.reserve_transfer_units(owner),
        )
        if out.ok and out.ref is not None:
            return owner
        return multiple()

    @rule(owner=owners)
    def reserve_transfer_again(self, owner: Hashable) -> None:
        """Reserve under an owner already used (live: refused; spent: reused, within the
        ``transfers`` bound on live reservations)."""
        live = owner in self.snap_ref.transfers
        if not live and len(self.snap_ref.transfers) >= self.config.transfers:
            return
        self._both(
            "reserve_transfer_again",
            f"reserve_transfer_units({owner!r})",
            lambda x: x.coord.reserve_transfer_units(owner),
        )

    @rule(owner=owners)
    def release_transfer(self, owner: Hashable) -> None:
        """Release a reservation (late: an old generation, ignored)."""
        self._both(
            "release_transfer",
            f"release_transfer_units({owner!r})",
            lambda x: x.coord.release_transfer_units(owner),
        )

    @rule(owner=owners, h=KNOWN_H)
    def adopt_transfer(self, owner: Hashable, h: int) -> None:
        """Publish a completed external image as ``h`` (fresh or duplicate)."""
        self._both(
            "adopt_transfer",
            f"adopt_transfer_units({owner!r}, {h})",
            lambda x: x.coord.adopt_transfer_units(owner, h),
        )

    # -- midstep scratch --------------------------------------------------------------------

    @precondition(lambda self: self.config.scratch_slots > 0)
    @rule(
        target=scratch,
        s=SEQ,
        positions=_cfg(_positions),
        then=st.sampled_from(["hold", "publish", "cancel"]),
    )
    def reserve_midstep(
        self, s: int, positions: list[tuple[int, int]], then: str
    ) -> Pair | MultipleResults[Pair]:
        """Borrow scratch slots for interior boundaries; the reservation joins ``scratch``
        (a used one stays there: publishing or cancelling it again is a second use). With
        ``then``, the forward's outcome follows at once: ``publish`` or ``cancel``."""
        seq = self._seq(s)
        out = self._both(
            "reserve_midstep",
            f"reserve_midstep({seq!r}, {positions!r})",
            lambda x: x.coord.reserve_midstep(seq, list(positions)),
        )
        if not (out.ok and out.ref):
            return multiple()
        for triple in out.ref:
            self.scratch_latest[triple[0]] = triple
        res = Pair(out.ref, out.sut)
        if then != "hold":
            method = f"{then}_midstep"
            self._both("reserve_midstep", f"{method}({res.ref!r})", _call_picked(method, res))
        return res

    @rule(res=scratch)
    def publish_midstep(self, res: Pair) -> None:
        """The forward wrote the slots (a spent reservation raises UnknownOperationError, or
        StaleReservationError once its slot was lent again)."""
        self._both(
            "publish_midstep",
            f"publish_midstep({res.ref!r})",
            lambda x: x.coord.publish_midstep(list(x.pick(res))),
        )

    @rule(res=scratch)
    def cancel_midstep(self, res: Pair) -> None:
        """The forward never ran: return the slots."""
        self._both(
            "cancel_midstep",
            f"cancel_midstep({res.ref!r})",
            lambda x: x.coord.cancel_midstep(list(x.pick(res))),
        )

    # -- queries ----------------------------------------------------------------------------

    @rule(
        kind=st.sampled_from(_QUERIES + _STORE_QUERIES),
        h=H,
        slot=SLOT,
        n=_cfg(_counts),
        flag=st.booleans(),
        s=SEQ,
        block_hashes=_cfg(_block_hashes),
    )
    def query(
        self, kind: str, h: int, slot: int, n: int, flag: bool, s: int, block_hashes: list[int]
    ) -> None:
        """A read-only call; its answer is compared (store-level kinds need
        ``store_calls``). ``resumable_hit`` is admission: the longest resumable prefix of a
        KV hit of ``len(block_hashes) - n % 3`` blocks (``flag``: assume checkpointed)."""
        if kind in _STORE_QUERIES and not self.config.store_calls:
            kind = "contains"
        if kind == "resumable_hit":
            seq = self._seq(s)
            hit = max(0, len(block_hashes) - n % 3)
            hashes = list(block_hashes)
            what = f"resumable_hit({seq!r}, {hit}, {hashes!r}, {flag})"
            call = _call_coord("resumable_hit", seq, hit, hashes, flag)
        elif kind == "changed_since":
            gen = max(0, self.snap_ref.generation - n)
            what, call = f"store.changed_since({gen})", _call_store("changed_since", gen)
        elif kind in _STORE_QUERIES:
            what, call = f"store.{kind}({h})", _call_store(kind, h)
        elif kind == "has_available_units":
            ph = h if flag else None
            what = f"has_available_units({n}, {ph})"
            call = _call_coord("has_available_units", n, ph)
        elif kind == "restore_queued_for":
            what, call = f"restore_queued_for({slot})", _call_coord(kind, slot)
        elif kind == "contains":
            what, call = f"contains({h})", _call_coord(kind, h)
        else:
            what, call = f"{kind}()", _call_coord(kind)
        self._both("query", what, call)

    # -- bad inputs -------------------------------------------------------------------------

    @precondition(lambda self: self.config.bad_inputs)
    @rule(case=st.sampled_from(sorted(BAD_INPUTS) + sorted(_STORE_BAD_INPUTS)))
    def bad_input(self, case: str) -> None:
        """A malformed call from :data:`BAD_INPUTS`: both raise the same class, nothing
        changes."""
        fn = BAD_INPUTS.get(case)
        if fn is None:
            if not self.config.store_calls:
                return
            fn = _STORE_BAD_INPUTS[case]
        bad = fn
        self._both("bad_input", case, lambda x: bad(x, self))

    # -- reset to quiescence ------------------------------------------------------------

    @precondition(lambda self: self.calls_since_quiesce >= 40)
    @rule()
    def quiesce(self) -> None:
        """Release every handle, clear, drain and complete; then every unit is free.
        Enabled only after 40 calls since the last one, so it is a rare reset."""
        self._quiesce("quiesce")

    def _quiesce(self, rule_name: str) -> None:
        """The explorer's drain (:func:`~pagedstate.models.world.drain_calls`) on both
        stores, each call compared; each store is passed its own handles."""
        snap = self.snap_ref
        live = {lease_id for lease_id, _, _ in snap.suspended}
        leases = []
        for pair in self.lease_pairs:
            if pair.ref.lease_id in live:
                live.discard(pair.ref.lease_id)
                leases.append(pair)
        pairs = {p.ref: p for p in self.op_pairs}
        calls = drain_calls(
            leases=leases,
            scratch=[self.scratch_latest[slot] for slot in sorted(snap.scratch_reserved)],
            seqs=self.seqs,
            ops=[pairs.get(op, Pair(op, op)) for op in sorted(snap.offload_pins)],
            transfer_owners=sorted(snap.transfers, key=repr),
            kv=[(units, owner) for owner, units in self.kv],
        )
        self.kv.clear()
        for name, args in calls:
            shown = ", ".join(repr(a.ref if isinstance(a, Pair) else a) for a in args)
            self._both(rule_name, f"{name}({shown})", _drain_call(name, args))
        self.calls_since_quiesce = 0
        self.calls_since_clear = 0
        problems = quiescence_problems(self.snap_sut)
        if problems:
            self._fail("quiescence", "after releasing everything: " + "; ".join(problems))
        for side in self.sides:
            if side.slots is not None and side.slots.free_slots != frozenset(
                self.config.scratch_range
            ):
                self._fail(
                    "quiescence",
                    f"{side.name}: scratch slots not returned:"
                    f" free {sorted(side.slots.free_slots)}",
                )

    def teardown(self) -> None:
        """Drain to quiescence (``drain_at_end``, only after a clean run) and report the
        ``target()`` scores: most pins on one record, most live records."""
        try:
            if self.config.drain_at_end and self._clean:
                self._quiesce("teardown")
        finally:
            if currently_in_test_context():
                target(float(self.max_pins), label="max pins on one record")
                target(float(self.max_records), label="max live records")


def _event(label: str) -> None:
    # Outside Hypothesis (a failing program replayed as a plain regression test) there is
    # nothing to record statistics in.
    if currently_in_test_context():
        event(label)


def _call_coord(name: str, *args: Any) -> Callable[[_Side], Any]:
    return lambda x: getattr(x.coord, name)(*args)


def _call_picked(name: str, pair: Pair) -> Callable[[_Side], Any]:
    return lambda x: getattr(x.coord, name)(x.pick(pair))


def _release_kv(units: Pair, owner: Hashable) -> Callable[[_Side], Any]:
    return lambda x: x.pool.release_units(x.pick(units), owner)


def _call_store(name: str, *args: Any) -> Callable[[_Side], Any]:
    return lambda x: getattr(x.store, name)(*args)


def _drain_call(name: str, args: tuple[Any, ...]) -> Callable[[_Side], Any]:
    def call(x: _Side) -> Any:
        mine = tuple(x.pick(a) if isinstance(a, Pair) else a for a in args)
        return make_drain_call(x.coord, x.pool, name, mine)

    return call


# ---------------------------------------------------------------------------------------
# Rules come from the tables
# ---------------------------------------------------------------------------------------

#: Every ``(machine, event)`` of the transition tables, and the rules that drive it.
#: Importing this module checks it (:func:`assert_rule_mapping`): a table event added
#: without a rule here fails the import.
EVENT_RULES: Mapping[tuple[str, str], tuple[str, ...]] = MappingProxyType(
    {
        # record lifecycle
        ("record", "begin_store"): ("drain", "engine_pass", "warm_up"),
        ("record", "adopt"): ("adopt_transfer",),
        ("record", "publish"): ("complete", "engine_pass", "warm_up", "clear_index"),
        ("record", "dedup"): ("complete",),  # defensive row: unreachable through the API
        ("record", "unindex"): ("unindex", "engine_pass"),
        ("record", "clear"): ("clear_index", "engine_pass"),
        ("record", "evict"): (
            "kv_alloc",
            "drain",
            "engine_pass",
            "reserve_transfer",
            "reserve_transfer_again",
        ),
        ("record", "pin_restore"): ("begin_restore", "restore_and_suspend"),
        ("record", "pin_offload"): ("take_offload",),
        ("record", "pin_lease"): ("acquire",),
        ("record", "unpin_restore"): (
            "complete",
            "clear_index",
            "forget",
            "cancel_restore",
            "release_lease",
        ),
        ("record", "unpin_offload"): (
            "release_source",
            "settle",
            "report",
            "settle_first",
            "reclaim",
        ),
        ("record", "unpin_lease"): ("release_source", "settle", "report", "settle_first"),
        # offload store / lease operation
        ("offload", "take"): ("take_offload",),
        ("offload", "acquire"): ("acquire",),
        ("offload", "release_source"): ("release_source", "report", "settle_first"),
        ("offload", "settle"): ("settle", "report", "settle_first"),
        ("offload", "reclaim"): ("reclaim", "release_source"),
        # restore
        ("restore", "begin_restore"): ("begin_restore", "restore_and_suspend"),
        ("restore", "take"): ("drain",),
        ("restore", "complete"): ("complete", "clear_index"),
        ("restore", "cancel"): ("forget", "cancel_restore"),
        ("restore", "suspend"): ("suspend", "restore_and_suspend"),
        ("restore", "resume"): ("resume",),
        ("restore", "release"): ("release_lease",),
        # suspended-restore lease
        ("lease", "suspend"): ("suspend", "restore_and_suspend"),
        ("lease", "resume"): ("resume",),
        ("lease", "release"): ("release_lease",),
        # transfer reservation
        ("transfer", "reserve"): ("reserve_transfer", "reserve_transfer_again"),
        ("transfer", "release"): ("release_transfer",),
        ("transfer", "adopt"): ("adopt_transfer",),
        # midstep scratch
        ("scratch", "reserve"): ("reserve_midstep",),
        ("scratch", "cancel"): ("cancel_midstep", "reserve_midstep"),
        ("scratch", "publish"): ("publish_midstep", "reserve_midstep"),
        ("scratch", "issue"): ("drain",),
        ("scratch", "orphan"): ("unindex", "clear_index"),
        ("scratch", "complete"): ("complete", "clear_index"),
    }
)

#: Rules that chain several public calls (their table events are not listed per rule).
MACRO_RULES = frozenset(
    {
        "quiesce",
        "teardown",
        "__init__",
        "engine_pass",
        "midstep_pass",
        "warm_up",
        "restore_storm",
        "deferred_nominees",
        "lease_and_clock_back",
    }
)


def _rule_names(machine: type[RuleBasedStateMachine]) -> frozenset[str]:
    """Names of ``machine``'s ``@rule`` and ``@initialize`` methods."""
    out = set()
    for name in dir(machine):
        fn = getattr(machine, name, None)
        for marker in (RULE_MARKER, INITIALIZE_RULE_MARKER):
            if getattr(fn, marker, None) is not None:
                out.add(name)
    return frozenset(out)


def check_rule_mapping(
    mapping: Mapping[tuple[str, str], Iterable[str]],
    machine: type[RuleBasedStateMachine] = ConformanceMachine,
    tables: Mapping[str, Table] = TABLES,
) -> list[str]:
    """Problems with an event-to-rule mapping: a table ``(machine, event)`` with no rule, a
    mapped name that is not a rule of ``machine``, or a mapped event no table has.

    Returns:
        One line per problem; empty when every table event has at least one rule.
    """
    rules = _rule_names(machine)
    out = []
    known = {(t.machine, ev) for t in tables.values() for ev in t.events}
    for key in sorted(known):
        names = tuple(mapping.get(key, ()))
        if not names:
            out.append(f"table event {key[0]}:{key[1]} has no conformance rule")
    for key, mapped in sorted(mapping.items()):
        if key not in known:
            out.append(f"mapped event {key[0]}:{key[1]} is in no table")
        for name in mapped:
            if name not in rules:
                out.append(f"{key[0]}:{key[1]} names {name!r}, which is not a rule")
    return out


def assert_rule_mapping(
    mapping: Mapping[tuple[str, str], Iterable[str]] = EVENT_RULES,
    machine: type[RuleBasedStateMachine] = ConformanceMachine,
    tables: Mapping[str, Table] = TABLES,
) -> None:
    """Raise :class:`TableCoverageError` listing every problem :func:`check_rule_mapping`
    finds."""
    problems = check_rule_mapping(mapping, machine, tables)
    if problems:
        raise TableCoverageError(
            "the conformance kit does not drive every table event:\n  " + "\n  ".join(problems)
        )


assert_rule_mapping()


# ---------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------


def conformance_machine(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    *,
    config: ConformanceConfig = DEFAULT_CONFIG,
    name: str = "Conformance",
) -> type[ConformanceMachine]:
    """A :class:`ConformanceMachine` subclass that checks ``factory``'s coordinator.

    Args:
        factory: builds the coordinator under test, with the reference constructor's
            signature ``factory(pool, spec, enabled, offload, readable_midstep, clock=...,
            offload_backlog_cap=..., forfeit_bound=...)``.
        pool_factory: ``pool_factory(num_units)`` builds the pool passed to ``factory``
            (default: the reference :class:`~pagedstate.models.reference.UnitPool`).
        config: sizes and switches.
        name: the class name (a printed failing program starts ``state = <name>()``).

    Returns:
        The class; run it with ``run_state_machine_as_test`` or collect ``.TestCase``.
    """
    return type(
        name,
        (ConformanceMachine,),
        {
            "coordinator_factory": staticmethod(factory),
            "pool_factory": staticmethod(pool_factory or UnitPool),
            "config": config,
            "__module__": __name__,
        },
    )


#: The kit's own profiles, used by :func:`conformance_settings` when the named profile was
#: not registered (an engine's test suite without a ``conftest`` registering them):
#: ``ci`` deterministic and bounded, ``dev`` the defaults, ``fuzz`` long.
PROFILES: Mapping[str, HSettings] = MappingProxyType(
    {
        "ci": HSettings(
            derandomize=True,
            database=None,
            print_blob=True,
            deadline=None,
            max_examples=100,
            stateful_step_count=50,
            suppress_health_check=[HealthCheck.too_slow],
        ),
        "dev": HSettings(max_examples=100, deadline=None, stateful_step_count=50),
        "fuzz": HSettings(max_examples=20_000, deadline=None, stateful_step_count=100),
    }
)


def conformance_settings(profile: str | None = None) -> HSettings:
    """The settings a conformance run uses.

    ``profile`` (default: ``$HYPOTHESIS_PROFILE``) names a registered Hypothesis profile,
    or one of :data:`PROFILES` when no profile of that name is registered. With neither,
    the active profile (``settings()``) is used.

    Raises:
        hypothesis.errors.InvalidArgument: an unknown profile name.
    """
    name = profile if profile is not None else os.environ.get("HYPOTHESIS_PROFILE")
    if not name:
        return HSettings()
    try:
        return HSettings.get_profile(name)
    except InvalidArgument:
        if name in PROFILES:
            return PROFILES[name]
        raise


def conformance_test_case(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    *,
    config: ConformanceConfig = DEFAULT_CONFIG,
    settings: HSettings | None = None,
    name: str = "Conformance",
) -> type[unittest.TestCase]:
    """The machine as a ``unittest.TestCase`` class, for pytest collection and hypofuzz.

    Unlike ``conformance_machine(...).TestCase`` (Hypothesis's default settings), it runs
    with ``settings`` or :func:`conformance_settings` (``$HYPOTHESIS_PROFILE``), read when
    this is called, i.e. when the test module is imported.
    """
    case = conformance_machine(factory, pool_factory, config=config, name=name).TestCase
    case.settings = settings if settings is not None else conformance_settings()
    return case


@attrs.frozen
class ConformanceReport:
    """What a passing run covered.

    Attributes:
        rows_hit: labels (``Table.label``) of the table rows the reference took.
        rows_missed: non-defensive rows never taken (each is a gap in the run, not a bug).
        defensive_missed: defensive rows never taken (expected: the API cannot reach them).
        events_by_rule: ``rule -> {(machine, event)}`` observed.
    """

    rows_hit: frozenset[str]
    rows_missed: tuple[str, ...]
    defensive_missed: tuple[str, ...]
    events_by_rule: Mapping[str, frozenset[tuple[str, str]]]

    @classmethod
    def of(cls, machine: type[ConformanceMachine]) -> ConformanceReport:
        """The coverage a machine class accumulated over its runs."""
        hit = frozenset(machine.rows_hit)
        missed: list[str] = []
        defensive: list[str] = []
        for table in TABLES.values():
            for row in table.rows:
                label = table.label(row)
                if label not in hit:
                    (defensive if row.defensive else missed).append(label)
        return cls(
            rows_hit=hit,
            rows_missed=tuple(missed),
            defensive_missed=tuple(defensive),
            events_by_rule=MappingProxyType(
                {k: frozenset(v) for k, v in sorted(machine.events_by_rule.items())}
            ),
        )


def run_conformance(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    settings: HSettings | None = None,
    config: ConformanceConfig = DEFAULT_CONFIG,
) -> ConformanceReport:
    """Run the conformance kit against ``factory``'s coordinator; return its coverage.

    Args:
        factory, pool_factory, config: as :func:`conformance_machine`.
        settings: Hypothesis settings (default :func:`conformance_settings`: the profile
            ``$HYPOTHESIS_PROFILE`` names, else the active one).

    Raises:
        ConformanceFailure (an AssertionError): the first disagreement, after Hypothesis
            shrank it; the printed program replays it (``state = Conformance()``, ...).
    """
    machine = conformance_machine(factory, pool_factory, config=config)
    run_state_machine_as_test(
        machine, settings=settings if settings is not None else conformance_settings()
    )
    return ConformanceReport.of(machine)
