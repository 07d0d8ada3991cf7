"""Reading a sequence's state slot, the one field of an engine's request the coordinator
trusts (SPEC D.1 steps 5, 6, 8)."""

from __future__ import annotations

from .errors import InvalidArgumentError
from .types import SequenceLike

__all__ = ["sequence_slot", "need_sequence"]


def sequence_slot(seq: SequenceLike) -> int:
    """``seq.state_slot`` as an int: the request's live state slot, ``-1`` (or any negative
    value) when it has none.

    Raises:
        InvalidArgumentError: the attribute is missing or not an int (a bool is not a slot).
            Callers read it before changing anything, so a bad slot changes nothing (G8).
    """
    slot = getattr(seq, "state_slot", None)
    if type(slot) is not int:
        if isinstance(slot, int) and not isinstance(slot, bool):
            return int(slot)
        if not hasattr(seq, "state_slot"):
            raise InvalidArgumentError(
                f"a {type(seq).__qualname__} is not a sequence: it has no state_slot (a sequence"
                " needs an int state_slot and a has_per_req_cache attribute)"
            )
        raise InvalidArgumentError(f"a sequence's state_slot must be an int, got {slot!r}")
    return slot


def need_sequence(seq: SequenceLike) -> int:
    """Check that ``seq`` is a sequence the coordinator can read (:class:`SequenceLike`): an
    int ``state_slot`` and a ``has_per_req_cache`` attribute. Returns the slot
    (:func:`sequence_slot`). Every coordinator call that takes a sequence checks it first.

    Raises:
        InvalidArgumentError: ``state_slot`` is missing or not an int, or
            ``has_per_req_cache`` is missing.
    """
    slot = sequence_slot(seq)
    if not hasattr(seq, "has_per_req_cache"):
        raise InvalidArgumentError(
            f"a sequence needs a has_per_req_cache attribute, got {type(seq).__qualname__}"
        )
    return slot
