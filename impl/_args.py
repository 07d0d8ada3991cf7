"""Argument checks shared by the production pool, store and coordinator.

Each check raises :class:`~pagedstate.spec.errors.InvalidArgumentError` (a ``ValueError``)
before the calling method changes anything (SPEC G8). The messages match the reference
model's, so an engine sees the same text from either implementation.
"""

from __future__ import annotations

from collections.abc import Hashable

from pagedstate.spec.errors import InvalidArgumentError, need_hashable
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

__all__ = ["is_int", "need_int", "need_hashable", "is_dirtying", "is_checkpoint_owner"]


def is_int(value: object) -> bool:
    """``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def need_int(name: str, value: object, minimum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) ``>= minimum``.

    Raises:
        InvalidArgumentError: otherwise; the message names ``name``.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def is_dirtying(owner: Hashable) -> bool:
    """Whether units leaving ``owner`` held raw state bytes (a checkpoint or a transfer
    reservation) and so must be marked dirty on release (SPEC G10)."""
    return (
        isinstance(owner, tuple)
        and len(owner) == 2
        and owner[0] in (CHECKPOINT_OWNER, TRANSFER_OWNER)
    )


def is_checkpoint_owner(owner: Hashable) -> bool:
    """Whether ``owner`` is a checkpoint's own tag ``("state-checkpoint", cid)``."""
    return isinstance(owner, tuple) and len(owner) == 2 and owner[0] == CHECKPOINT_OWNER
