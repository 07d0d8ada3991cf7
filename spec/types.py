"""Op and wire types shared by every store and by the copy engine (SPEC A.1, B.1).

All of these are frozen attrs classes: values, hashable, comparable by field.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Protocol, runtime_checkable

import attrs

from .errors import BadSpecError, InvalidArgumentError

__all__ = [
    "PagedStateCheckpointSpec",
    "CheckpointStoreOp",
    "CheckpointRestoreOp",
    "StateStoreOperationId",
    "SuspendedCheckpointRestore",
    "checkpoint_copy_ops_per_batch",
    "units_for",
    "SequenceLike",
    "ScratchSlotPool",
    "OffloadIndex",
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
        for name in ("page_unit_bytes", "slot_bytes", "image_bytes"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise BadSpecError(f"{name} must be a positive int (not bool), got {value!r}")
        if self.image_bytes > self.slot_bytes:
            raise BadSpecError(
                f"image_bytes ({self.image_bytes}) must not exceed slot_bytes ({self.slot_bytes})"
            )
        if not isinstance(self.layout_id, str) or not self.layout_id:
            raise BadSpecError(f"layout_id must be a non-empty str, got {self.layout_id!r}")

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


@attrs.frozen
class CheckpointStoreOp:
    """Copy one slot's image into ``unit_ids`` (piece order). ``total_bytes == image_bytes``."""

    src_slot: int
    unit_ids: tuple[int, ...]
    total_bytes: int
    layout_id: str


@attrs.frozen
class CheckpointRestoreOp:
    """Copy an image from ``unit_ids`` (piece order) into ``dst_slot``."""

    dst_slot: int
    unit_ids: tuple[int, ...]
    total_bytes: int
    layout_id: str


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
