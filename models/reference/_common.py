"""Shared by the reference's modules: the SPEC B.1 bounds, argument checks, the owner-tag
predicates (SPEC A.3, G9) and :class:`_Stepper`, which looks table rows up for the store and
the coordinator and records which ones were taken."""

from __future__ import annotations

from collections.abc import Hashable

from pagedstate.spec import tables as T
from pagedstate.spec.errors import IllegalTransitionError, InvalidArgumentError, need_hashable
from pagedstate.spec.tables import Row, Table
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

#: SPEC B.1: nominations are capped at 8192; overflow drops the oldest.
DEFAULT_OFFLOAD_BACKLOG_CAP = 8192
#: SPEC B.1 / G7: reclaimed operations remembered exactly, beyond which a watermark answers.
DEFAULT_FORFEIT_BOUND = 4096
#: SPEC B.1: the change log keeps the last 4096 bumps.
DEFAULT_CHANGE_LOG_SIZE = 4096

#: Where row hits are recorded: a set of ``(machine, row index)``.
RowSink = set[tuple[str, int]]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need_int(name: str, value: object, minimum: int | None = None) -> None:
    if not _is_int(value):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    assert isinstance(value, int)
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")


def _is_checkpoint_owner(owner: Hashable) -> bool:
    return isinstance(owner, tuple) and len(owner) == 2 and owner[0] == CHECKPOINT_OWNER


def _free_slots(scratch: object) -> frozenset[int] | None:
    free = getattr(scratch, "free_slots", None)
    return None if free is None else frozenset(free)


def _need_transfer_owner(owner: Hashable) -> None:
    if owner is None:
        raise InvalidArgumentError("a transfer reservation needs an owner, got None")
    need_hashable("owner", owner)


def _is_dirtying(owner: Hashable) -> bool:
    return (
        isinstance(owner, tuple)
        and len(owner) == 2
        and owner[0]
        in (
            CHECKPOINT_OWNER,
            TRANSFER_OWNER,
        )
    )


def _owner_kind(owner: Hashable) -> str | None:
    """The store kind of an owner shaped as a store owner's tag, else None (an engine's)."""
    if isinstance(owner, tuple) and len(owner) == 2:
        if owner[0] == CHECKPOINT_OWNER:
            return CHECKPOINT_OWNER
        if owner[0] == TRANSFER_OWNER:
            return TRANSFER_OWNER
    return None


def _same_owner(held_by: Hashable, owner: Hashable) -> bool:
    """Whether a unit tagged by ``held_by`` is ``owner``'s (SPEC A.3, G9): the same object,
    or equal and of the same kind (equal store owners' tags are equal item by item: a
    checkpoint's by its id). An engine owner that only compares equal to a store owner's tag
    is another owner."""
    if held_by is not owner and not held_by == owner:
        return False
    return _owner_kind(held_by) == _owner_kind(owner)


class _Stepper:
    """Looks rows up and records which ones were taken."""

    row_sink: RowSink | None = None

    def _step(
        self,
        table: Table,
        phase: str,
        event: str,
        guard: str = T.NO_GUARD,
        *,
        to: str | None = None,
    ) -> Row:
        """The row for ``(phase, event, guard)``. ``to`` is the phase the model's structures
        put the subject in (an auxiliary machine's phase is where its entry lives: a queue, a
        list, a map); the table must agree, so its ``next`` column binds too.

        Raises:
            IllegalTransitionError: no such row, or the row's next phase is not ``to``.
        """
        row = table.step(phase, event, guard)
        if to is not None and row.next != to:
            raise IllegalTransitionError(
                table.machine,
                phase,
                event,
                guard,
                f"the model moves the {table.machine} to {to}, the table says {row.next}",
            )
        if self.row_sink is not None:
            self.row_sink.add((table.machine, table.row_id(row)))
        return row
