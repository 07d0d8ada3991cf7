"""The kit's configuration, its failures, and the environment's objects both stores share:
:class:`ConformanceConfig`, :class:`ConformanceFailure`, :class:`TableCoverageError`, the
sequence and offload-index doubles (:class:`KitSeq`, :class:`KitOffload`), and the handle
pair (:class:`Pair`) and side (``_Side``) the lockstep passes around."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from pagedstate.models.reference import SlotPool
from pagedstate.spec.types import PagedStateCheckpointSpec

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
        overlap: drive the overlapped style too (SPEC D.13): boundaries and drains naming
            forward ids, scratch stores published with ``forward=``, completions with
            completion tokens set done out of order and late, ``settle_completions``,
            restores begun on behalf of a sequence and ``forget_pending`` after the
            sequence's slot was reset, restores aimed at scratch slots (G12), and
            ``outstanding()``, ``is_idle()``, ``last_forward`` and ``next_forward`` asked
            after every step (with ``sweep_queries``). Off: only the synchronous style
            (no forward ids, no tokens).
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
    overlap: bool = True

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

    @property
    def restore_slots(self) -> range:
        """The slots a restore may be aimed at: the sequences' slots, and with ``overlap``
        the scratch slots too (a restore into a slot lent as scratch is refused, G12)."""
        return range(self.seqs + 1 + (self.scratch_slots if self.overlap else 0))


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
