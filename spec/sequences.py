"""Reading a sequence's state slot, the one field of an engine's request the coordinator
trusts (SPEC D.1 steps 5, 6, 8)."""

from __future__ import annotations

from .errors import InvalidArgumentError
from .types import SequenceLike

__all__ = ["sequence_slot"]


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
        raise InvalidArgumentError(f"a sequence's state_slot must be an int, got {slot!r}")
    return slot
