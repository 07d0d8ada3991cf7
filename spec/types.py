"""Op and wire types shared by every store and by the copy engine (SPEC A.1, B.1).

All of these are frozen values, hashable and comparable by field: attrs classes, and the
copy ops of :mod:`.ops` (re-exported here), which carry their units as runs.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Protocol, runtime_checkable

import attrs

from .errors import BadSpecError, InvalidArgumentError
from .ops import CheckpointRestoreOp, CheckpointStoreOp, UnitRuns, run_units, unit_runs

__all__ = [
    "PagedStateCheckpointSpec",
    "CheckpointStoreOp",
    "CheckpointRestoreOp",
    "UnitRuns",
    "unit_runs",
    "run_units",
    "StateStoreOperationId",
    "SuspendedCheckpointRestore",
    "checkpoint_copy_ops_per_batch",
    "units_for",
    "is_size",
    "spec_violation",
    "validate_spec_fields",
    "SequenceLike",
    "ScratchSlotPool",
    "OffloadIndex",
    "CompletionToken",
    "ManualCompletion",
    "CHECKPOINT_OWNER",
    "TRANSFER_OWNER",
]

#: First element of the pool owner tag of a checkpoint's units: ``("state-checkpoint", cid)``.
CHECKPOINT_OWNER = "state-checkpoint"
#: First element of the pool owner tag of a transfer reservation: ``("state-transfer", owner)``.
TRANSFER_OWNER = "state-transfer"

_WIRE_KEYS = frozenset({"page_unit_bytes", "slot_bytes", "image_bytes", "layout_id"})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def units_for(image_bytes: int, page_unit_bytes: int) -> int:
    """Units one image occupies: ``ceil(image_bytes / page_unit_bytes)`` (SPEC A.1).

    pre: image_bytes > 0
    pre: page_unit_bytes > 0
    post: _ * page_unit_bytes >= image_bytes
    post: (_ - 1) * page_unit_bytes < image_bytes
    """
    return -(-image_bytes // page_unit_bytes)


#: What a size field may hold before validation, as far as :func:`is_size`'s contract goes:
#: a JSON scalar (it accepts any object at run time). ``bool`` is listed on its own so that
#: CrossHair tries bools, which are ints to Python but not sizes to the spec.
SpecValue = int | bool | float | str | None


def is_size(value: SpecValue) -> bool:
    """Whether ``value`` is a valid byte count: a positive int, and not a bool.

    post: not isinstance(value, bool) or not _
    post: not _ or (isinstance(value, int) and value > 0)
    post: _ or not (type(value) is int and value > 0)
    """
    return _is_int(value) and value > 0  # type: ignore[operator]


def spec_violation(
    page_unit_bytes: int, slot_bytes: int, layout_id: str, image_bytes: int
) -> str | None:
    """The first rule of SPEC A.1 a checkpoint spec breaks, ``None`` when it is valid: the
    name of a size field that is not a positive int (bools are not ints here), then
    ``"image_bytes>slot_bytes"``, then ``"layout_id"`` (not a non-empty str).

    Annotated with the spec's field types, but any object is handled (a wire form can carry
    anything): which objects are sizes is :func:`is_size`'s contract, checked on its own over
    JSON scalars; here CrossHair searches ints and strs, where the order of the rules lives
    (over the union of JSON scalars for all four arguments it missed an off-by-one in the
    image-vs-slot rule even at effort 100).

    A module-level pure function so that CrossHair can check it: the spec class is a slotted
    attrs class, which CrossHair cannot build (it reports "Unable to meet precondition").

    post: (_ is None) == _spec_fields_valid(page_unit_bytes, slot_bytes, layout_id, image_bytes)
    post: _ in _SPEC_RULES
    post: _ != "image_bytes>slot_bytes" or image_bytes > slot_bytes
    """
    for name, value in (
        ("page_unit_bytes", page_unit_bytes),
        ("slot_bytes", slot_bytes),
        ("image_bytes", image_bytes),
    ):
        if not is_size(value):
            return name
    if image_bytes > slot_bytes:
        return "image_bytes>slot_bytes"
    if not isinstance(layout_id, str) or not layout_id:
        return "layout_id"
    return None


_SPEC_RULES = (
    None,
    "page_unit_bytes",
    "slot_bytes",
    "image_bytes",
    "image_bytes>slot_bytes",
    "layout_id",
)


def _spec_fields_valid(
    page_unit_bytes: object, slot_bytes: object, layout_id: object, image_bytes: object
) -> bool:
    """SPEC A.1 read literally: three positive ints (not bools), the image no larger than the
    slot, a non-empty layout string."""
    sizes = (page_unit_bytes, slot_bytes, image_bytes)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
        return False
    assert isinstance(page_unit_bytes, int) and isinstance(slot_bytes, int)
    assert isinstance(image_bytes, int)
    return (
        min(page_unit_bytes, slot_bytes, image_bytes) >= 1
        and image_bytes <= slot_bytes
        and isinstance(layout_id, str)
        and len(layout_id) > 0
    )


def validate_spec_fields(
    page_unit_bytes: int, slot_bytes: int, layout_id: str, image_bytes: int
) -> str | None:
    """The :class:`BadSpecError` message for the first rule :func:`spec_violation` finds
    broken, ``None`` when the spec is valid."""
    rule = spec_violation(page_unit_bytes, slot_bytes, layout_id, image_bytes)
    if rule is None:
        return None
    if rule == "image_bytes>slot_bytes":
        return f"image_bytes ({image_bytes}) must not exceed slot_bytes ({slot_bytes})"
    if rule == "layout_id":
        return f"layout_id must be a non-empty str, got {layout_id!r}"
    value = {"page_unit_bytes": page_unit_bytes, "slot_bytes": slot_bytes}.get(rule, image_bytes)
    return f"{rule} must be a positive int (not bool), got {value!r}"


@attrs.frozen
class PagedStateCheckpointSpec:
    """Geometry of one checkpoint image (SPEC A.1).

    Attributes:
        page_unit_bytes: bytes one pool unit (one KV block id) owns, all its regions
            together (``plan.entry_bytes[paged_class]`` in ATOM's runner). > 0.
        slot_bytes: bytes of one whole Active Slot (``plan.entry_bytes["state"]``). > 0.
        layout_id: non-empty string fencing the byte layout; an image is only read by a
            worker with the same ``layout_id``.
        image_bytes: bytes a checkpoint carries, ``0 < image_bytes <= slot_bytes``.

    Raises:
        BadSpecError (a ValueError): on any violation, with nothing constructed.
    """

    page_unit_bytes: int
    slot_bytes: int
    layout_id: str
    image_bytes: int

    def __attrs_post_init__(self) -> None:
        problem = validate_spec_fields(
            self.page_unit_bytes, self.slot_bytes, self.layout_id, self.image_bytes
        )
        if problem is not None:
            raise BadSpecError(problem)

    @property
    def units_per_checkpoint(self) -> int:
        """Units per image, ``ceil(image_bytes / page_unit_bytes)``; derived from the image,
        not the slot."""
        return units_for(self.image_bytes, self.page_unit_bytes)

    def to_wire(self) -> dict[str, int | str]:
        """The four fields, exactly; ``units_per_checkpoint`` is never on the wire."""
        return {
            "page_unit_bytes": self.page_unit_bytes,
            "slot_bytes": self.slot_bytes,
            "image_bytes": self.image_bytes,
            "layout_id": self.layout_id,
        }

    @classmethod
    def from_wire(cls, wire: object) -> PagedStateCheckpointSpec:
        """Parse :meth:`to_wire` output and revalidate.

        Raises:
            TypeError: ``wire`` is not a Mapping.
            BadSpecError: the key set is not exactly the four fields, or a value is invalid.
        """
        if not isinstance(wire, Mapping):
            raise TypeError(f"a checkpoint spec wire form must be a Mapping, got {type(wire)!r}")
        keys = set(wire)
        if keys != _WIRE_KEYS:
            raise BadSpecError(
                f"checkpoint spec wire fields must be exactly {sorted(_WIRE_KEYS)},"
                f" got {sorted(map(str, keys))}"
            )
        return cls(
            page_unit_bytes=wire["page_unit_bytes"],
            slot_bytes=wire["slot_bytes"],
            layout_id=wire["layout_id"],
            image_bytes=wire["image_bytes"],
        )


def checkpoint_copy_ops_per_batch(max_num_seqs: int | None) -> int:
    """Copy ops one batch may carry: one store plus one restore per sequence (SPEC A.1).

    The runner sizes its descriptor staging from this and the coordinator bounds midstep
    scratch stores by it; both must read this one function.

    pre: max_num_seqs is None or max_num_seqs >= 0
    post: _ >= 0
    post: _ % 2 == 0
    """
    if max_num_seqs is not None and (not _is_int(max_num_seqs) or max_num_seqs < 0):
        raise InvalidArgumentError(f"max_num_seqs must be a non-negative int, got {max_num_seqs!r}")
    return 2 * int(max_num_seqs or 0)


@attrs.frozen(order=True)
class StateStoreOperationId:
    """Names one offload store or lease attempt: ``(prefix_hash, generation)``.

    Generations strictly increase per store, so a re-store of the same hash after eviction
    is a distinct operation (SPEC B.3 row 17, scenario F.40).
    """

    prefix_hash: int
    generation: int


@attrs.frozen
class SuspendedCheckpointRestore:
    """A single-use lease on a suspended queued restore (SPEC B.3 row 7, G3).

    ``checkpoint_id`` and ``op`` are ATOM's fields; ``lease_id`` is this store's identity of
    the lease, so a second resume or release is recognised and refused.
    """

    checkpoint_id: int
    op: CheckpointRestoreOp
    lease_id: int = -1


@runtime_checkable
class SequenceLike(Protocol):
    """What the coordinator reads of an engine's sequence: its live state slot (``-1`` when it
    has none) and whether the model keeps per-request state at all."""

    state_slot: int
    has_per_req_cache: bool


@runtime_checkable
class CompletionToken(Protocol):
    """Says when a batch's copies are done (SPEC D.13): a CUDA event recorded on the copy
    stream after the launch (``torch.cuda.Event``), or :class:`ManualCompletion` on a CPU.
    ``query()`` must not block; ``synchronize()`` waits until ``query()`` would be true."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class ManualCompletion:
    """A completion token a test or a CPU engine sets by hand (:class:`CompletionToken`).

    ``query()`` is ``done``; ``set()`` marks it done; ``synchronize()`` marks it done too (on
    a CPU the copy ran inside ``execute``, so waiting for it ends at once). ``queries``
    counts the ``query()`` calls."""

    __slots__ = ("done", "queries")

    def __init__(self, done: bool = False) -> None:
        self.done = bool(done)
        self.queries = 0

    def set(self) -> None:
        """Mark the copies done."""
        self.done = True

    def query(self) -> bool:
        """Whether the copies are done (never blocks)."""
        self.queries += 1
        return self.done

    def synchronize(self) -> None:
        """Wait for the copies: here, mark them done."""
        self.done = True

    def __repr__(self) -> str:
        return f"ManualCompletion(done={self.done})"


@runtime_checkable
class ScratchSlotPool(Protocol):
    """The state pool midstep scratch slots are borrowed from (SPEC D.1 step 4)."""

    def has_free(self) -> bool: ...

    def pop(self) -> int: ...

    def release(self, slot: int) -> None: ...


@runtime_checkable
class OffloadIndex(Protocol):
    """The CPU tier as the coordinator sees it: ``could_serve(h)`` is the optimistic vote."""

    def could_serve(self, prefix_hash: int) -> bool: ...


Owner = Hashable
