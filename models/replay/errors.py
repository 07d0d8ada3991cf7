"""The replay's errors: bad input (:class:`ReplayError`, :class:`TraceError`,
:class:`AmbiguousModelError`) and a finding (:class:`Divergence`), and the helper that
shortens a value for their messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["AmbiguousModelError", "Divergence", "ReplayError", "TraceError"]


class ReplayError(ValueError):
    """Bad input to a replay (trace, model, pool size, option): the message names it."""


class TraceError(ReplayError):
    """A trace line is not a Mooncake request; the message names the file and line."""


class AmbiguousModelError(ReplayError):
    """``--model`` names a part of several shipped model ids: the message says it is
    ambiguous and lists them.

    Attributes:
        model_id: the name given.
        matches: the shipped ids it is a part of, in the geometry file's order.
    """

    def __init__(self, model_id: str, matches: Sequence[str]) -> None:
        self.model_id = model_id
        self.matches = tuple(matches)
        super().__init__(
            f"model id {model_id!r} is ambiguous: it is a part of {len(self.matches)} shipped"
            f" model ids ({', '.join(self.matches)}); give the exact id or a part of only one"
        )


class Divergence(AssertionError):
    """The production store and the reference disagreed (``verify``), or an invariant broke.

    Attributes:
        step: the number of store calls made before the one that disagreed (0-based).
        call: the method and its arguments, as text.
        production, reference: both answers (or the exception each raised), as text.
    """

    def __init__(self, step: int, call: str, production: str, reference: str) -> None:
        self.step = step
        self.call = call
        self.production = production
        self.reference = reference
        super().__init__(
            f"divergence at store call {step}: {call}\n  production: {production}\n"
            f"  reference:  {reference}"
        )


def _text(value: Any, limit: int = 600) -> str:
    s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."
