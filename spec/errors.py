"""The error hierarchy of pagedstate.

Every error the library raises on purpose is a :class:`PagedStateError`.
Each subclass also derives from the builtin exception that ATOM's module
raises in the same situation (``ValueError``, ``AssertionError``,
``RuntimeError``), so an engine that swaps pagedstate in for ATOM's module and
catches the builtin keeps working.

A call that raises one of these changes nothing: every structure of the pool,
store and coordinator is as it was before the call (SPEC section G8).
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = [
    "PagedStateError",
    "BadSpecError",
    "InvalidArgumentError",
    "DuplicateUnitError",
    "BoundaryRangeError",
    "StaleBoundaryError",
    "WrongOwnerError",
    "StoreOwnedUnitsError",
    "PartialReleaseError",
    "RawUnitFreeError",
    "NoFreeUnitError",
    "IllegalTransitionError",
    "PinUnderflowError",
    "UnknownOperationError",
    "StaleReservationError",
    "LeaseReusedError",
    "SourcePinLostError",
    "SlotBusyError",
    "AmbiguousSuspendError",
    "CheckpointVanishedError",
    "BatchTooLargeError",
    "EvictionCallbackError",
    "ReentrantCallError",
    "UnknownGeometryError",
    "UnsupportedGeometryError",
    "BadCopyPlanError",
    "CopyOpError",
    "BatchHazardError",
]


class PagedStateError(Exception):
    """Base class of every error pagedstate raises on purpose."""


class BadSpecError(PagedStateError, ValueError):
    """A :class:`PagedStateCheckpointSpec` or its wire form is malformed (SPEC A.1).

    Raised for a non-int or non-positive byte count, ``image_bytes >
    slot_bytes``, an empty ``layout_id`` or a wire mapping with the wrong keys.
    Fix the geometry the runner derived; nothing was constructed.
    """


class InvalidArgumentError(PagedStateError, ValueError):
    """An argument is outside its domain (a negative count, a ``None`` owner,
    a non-int hash or slot). The message names the argument and what it must be."""


class BoundaryRangeError(InvalidArgumentError):
    """A boundary names no computed state: ``boundary_blocks`` is 0, or beyond the blocks
    the request has computed once its forward has run (SPEC D.1 step 5, G13). Nothing was
    filed."""


class StaleBoundaryError(InvalidArgumentError):
    """A boundary names a forward whose slot has since been handed to a later forward
    (SPEC D.13): storing it would copy the later forward's state under this prefix's hash.
    File a boundary before the drain of the forward after the one that computes it (at
    scheduling time under overlapped scheduling). Nothing was filed."""


class DuplicateUnitError(InvalidArgumentError):
    """A unit-id list names the same unit twice (SPEC A.2 ``release_units`` and
    ``rekey_units``)."""


class WrongOwnerError(PagedStateError, AssertionError):
    """A unit is not tagged ``(owner, piece)`` as the caller claimed (SPEC A.2,
    scenario S16). Nothing was released or retagged: pass the owner the units
    were reserved for, in piece order."""

    @classmethod
    def for_unit(cls, unit: int, tag: object, owner: Hashable, piece: int) -> WrongOwnerError:
        """The error both pools raise when ``unit`` is not ``(owner, piece)``: ``tag`` is
        what it is (``None``: free)."""
        held = "is free" if tag is None else f"is held as {tag!r} (owner, piece)"
        return cls(
            f"raw unit {unit} {held}, not by {owner!r} as piece {piece}; release a whole"
            " reservation with its own owner, its units in piece order"
        )


class StoreOwnedUnitsError(WrongOwnerError):
    """A pool call named a store owner (``("state-checkpoint", cid)`` or
    ``("state-transfer", owner)``, SPEC A.3) from outside the store. Those units belong to
    the checkpoint store and the coordinator, which alone reserve, release and retag them;
    an engine that freed them would hand a live image's units to someone else. Release a
    checkpoint through the store (``unindex``, ``clear_index``) and a transfer reservation
    through ``release_transfer_units``; nothing was changed."""

    @classmethod
    def for_owner(cls, owner: Hashable) -> StoreOwnedUnitsError:
        """The error both stores raise for ``owner`` (one message, so an engine sees the
        same text from either)."""
        return cls(
            f"units of {owner!r} belong to the checkpoint store; only the store reserves,"
            " releases or retags them (SPEC A.3): release a checkpoint through the store"
            " (unindex, clear_index) and a transfer reservation through"
            " release_transfer_units"
        )

    @classmethod
    def for_transfer_adoption(cls, owner: Hashable) -> StoreOwnedUnitsError:
        """The error both stores raise when ``adopt_units`` names a transfer reservation
        ``("state-transfer", owner)`` and the coordinator is not the caller: adopting it
        behind the coordinator's back would leave the coordinator's reservation naming
        units a checkpoint now owns."""
        return cls(
            f"{owner!r} is a coordinator transfer tag: only the coordinator's"
            " adopt_transfer_units adopts a transfer reservation (release_transfer_units gives"
            " one up); the store's adopt_units takes units reserved under an engine owner"
        )


class PartialReleaseError(PagedStateError, AssertionError):
    """A release names only part of a reservation (SPEC G9). Release the whole
    reservation, every unit in piece order, in one call."""


class RawUnitFreeError(PagedStateError, AssertionError):
    """A raw (checkpoint or transfer) unit was handed to the KV ``free`` path.
    Use ``release_units`` with its owner instead."""


class NoFreeUnitError(PagedStateError, AssertionError):
    """The pool has no free unit and nothing is evictable (SPEC A.4): a gate
    that should have refused the admission was bypassed."""


class IllegalTransitionError(PagedStateError, AssertionError):
    """A machine was asked for a transition its table has no row for.

    Attributes ``machine``, ``phase``, ``event`` and ``guard`` name the missing
    row of the table in :mod:`pagedstate.spec.tables`.
    """

    def __init__(self, machine: str, phase: str, event: str, guard: str, detail: str = "") -> None:
        self.machine = machine
        self.phase = phase
        self.event = event
        self.guard = guard
        msg = (
            f"{machine}: no transition from {phase} on {event}"
            + (f" [{guard}]" if guard != "-" else "")
            + (f": {detail}" if detail else "")
            + ". The caller broke the protocol of the table in pagedstate.spec.tables;"
            " nothing was changed."
        )
        super().__init__(msg)


class PinUnderflowError(PagedStateError, AssertionError):
    """A pin was released on a record whose pin count is already 0 (SPEC C.10,
    scenario S14). Releases are keyed by operation; this one had no pin left."""


class UnknownOperationError(PagedStateError, LookupError):
    """An operation, lease or reservation was not issued by this store (for
    example a :class:`SuspendedCheckpointRestore` built by hand, or one issued
    by another store)."""


class StaleReservationError(UnknownOperationError):
    """A midstep scratch reservation ``(slot, pos, h)`` is not the one outstanding for its
    slot: it came from an earlier ``reserve_midstep`` that was already published or
    cancelled, and the slot has since been lent to another reservation (SPEC B.4 scratch
    machine: only a RESERVED reservation is published or cancelled, once). Publishing it
    would file ``h`` over the bytes the newer reservation's forward writes. Publish or
    cancel the triple the latest ``reserve_midstep`` returned; nothing was changed."""


class LeaseReusedError(PagedStateError, AssertionError):
    """A single-use lease (a suspended restore) was resumed or released a second
    time (SPEC G3). The first use already spent its pin; nothing was changed."""


class SourcePinLostError(PagedStateError, AssertionError):
    """A suspended restore is resumed but its record no longer holds a pin
    (SPEC B.3 row 8)."""


class SlotBusyError(PagedStateError, AssertionError):
    """A second restore into a destination slot that already has a queued,
    in-flight or suspended restore (SPEC G4): two gathers into one slot in one
    launch race. Cancel or complete the first one before queueing another.
    Also a restore into a slot lent as midstep scratch (reserved, queued or issued),
    and scratch lent over a slot with a restore (SPEC G12): a slot is one buffer
    whoever lends it."""


class AmbiguousSuspendError(PagedStateError, AssertionError):
    """``suspend_queued_restore`` found more than one queued restore for the
    slot (SPEC B.3 row 7). Unreachable under G4; kept as a defensive check."""


class CheckpointVanishedError(PagedStateError, RuntimeError):
    """A gated checkpoint disappeared between the gate and the attach (SPEC F.29)."""


class BatchTooLargeError(PagedStateError, RuntimeError):
    """A batch asks to copy more checkpoints than its descriptor was sized for
    (``checkpoint_copy_ops_per_batch``, SPEC C.22 and E.5)."""


class EvictionCallbackError(PagedStateError, RuntimeError):
    """The engine's ``on_evict(prefix_hash)`` callback raised while a reservation overwrote
    cached KV blocks (SPEC A.4). The callback's exception is the ``__cause__``;
    ``prefix_hash`` names the first hash whose callback failed.

    The reservation that fired it is undone (its units go back to where they were, cached
    KV blocks included, and nothing is filed) when the pool's own ``reserve_units`` or the
    coordinator's ``reserve_transfer_units`` fired it (SPEC G8). What the callbacks
    themselves did before raising is the engine's and stays. A reservation made by
    ``begin_store`` (alone or in a drain), or inside an engine's own
    ``deferred_evictions()`` block, stands: ``undone`` says which.
    """

    def __init__(self, prefix_hash: int, undone: bool, detail: str) -> None:
        self.prefix_hash = prefix_hash
        self.undone = undone
        super().__init__(
            f"on_evict({prefix_hash}) raised {detail}; "
            + (
                "the reservation that evicted it was undone and nothing was changed"
                if undone
                else "the reservation that evicted it stands"
            )
        )


class ReentrantCallError(PagedStateError, RuntimeError):
    """A drain (``take_checkpoint_ops``) or a completion (``complete_previous_batch``) was
    called while one is running: from an ``on_evict`` callback the drain's own reservation
    fired. Nested, it would hand the outer drain's ops to the inner call or publish images
    whose copy has not run. Nothing was changed; call it after the outer call returns."""


class UnknownGeometryError(PagedStateError, LookupError):
    """No shipped model geometry has this id (``pagedstate.gpu.geometry_ids()`` lists them)."""


class UnsupportedGeometryError(PagedStateError, ValueError):
    """A geometry cannot hold checkpoint images in KV pages: it has no attention layer (so
    no KV block pool to page into), or a slice or block size it was asked for does not fit."""


class BadCopyPlanError(PagedStateError, ValueError):
    """A copy plan or descriptor was asked for with malformed inputs (SPEC E.4): a negative
    total, a stream shorter than the total, an empty segment, base arrays that are not one
    row per copy (F58), a descriptor buffer of the wrong shape, ranges out of order (F63)."""


class CopyOpError(PagedStateError, RuntimeError):
    """A store or restore op of a batch is not executable by this worker (SPEC E.5, F61):
    another ``layout_id``, a wrong ``total_bytes`` or unit count, a unit or slot out of
    range, a unit named twice. The whole batch is refused; nothing was written."""


class BatchHazardError(CopyOpError):
    """Two ops of one batch touch the same bytes (SPEC E.5 "no ordering within a launch"):
    a restore writes a slot a store reads, a store writes a unit a restore reads, two ops
    write the same slot or unit, or a scrub zeroes a unit an op reads or writes. The whole
    batch is refused; nothing was written."""


def need_hashable(name: str, value: object) -> None:
    """Check that ``value`` can be hashed (an owner is a dict key, SPEC A.3); both stores
    call it, so their messages agree.

    Raises:
        InvalidArgumentError: ``hash(value)`` raised (unhashable, or a ``__hash__`` that
            fails); the message names ``name``.
    """
    try:
        hash(value)
    except Exception as exc:
        raise InvalidArgumentError(f"{name} must be hashable, got {value!r}") from exc


def read_clock(clock: object) -> float:
    """``clock()``, checked: both stores read the engine's clock through this, before
    changing anything, so a clock that raises or answers garbage changes nothing.

    Returns:
        seconds, as returned (an int or float, finite).

    Raises:
        InvalidArgumentError: ``clock()`` returned something other than a finite number of
            seconds (NaN would make every later snapshot unequal to itself). Whatever
            ``clock()`` itself raises propagates unchanged.
    """
    now = clock()  # type: ignore[operator]
    if (
        isinstance(now, bool)
        or not isinstance(now, (int, float))
        or now != now
        or now
        in (
            float("inf"),
            float("-inf"),
        )
    ):
        raise InvalidArgumentError(f"clock() must return finite seconds, got {now!r}")
    return now


def need_timeout(timeout_s: object) -> float:
    """Check a timeout in seconds (``reclaim_stale_offload_pins``); both stores call it.

    Returns:
        ``timeout_s`` as a float (``inf`` allowed; ``<= 0`` is the caller's "disabled").

    Raises:
        InvalidArgumentError: not an int or float (a bool is not), NaN, or an int too
            large for a float.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise InvalidArgumentError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
    try:
        seconds = float(timeout_s)
    except OverflowError:
        raise InvalidArgumentError(f"timeout_s is too large: {timeout_s!r}") from None
    if seconds != seconds:
        raise InvalidArgumentError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
    return seconds
