"""The copy ops a drain hands to the executor, and the unit runs they carry (SPEC A.1, A.5).

An image's units are named in *piece order*: piece ``i`` of the image lives in unit
``unit_ids[i]``. The pool hands units out as long stretches of consecutive ids wherever it
can (SPEC A.5), so an op carries them as **runs**: ``((first, count), ...)`` in piece order,
each run the units ``first, first + 1, ..., first + count - 1``. The runs of an op are
*maximal*: two neighbouring runs never continue each other (``first + count`` of one is
never the next one's ``first``), so a unit sequence has exactly one run form and two ops are
equal exactly when they name the same units in the same order.

``unit_ids`` (ATOM's field) stays: an op built from runs expands it on first use and keeps
it; an op built from unit ids computes its runs on first use. The store builds its ops from
runs (O(runs) per op); the copy engine reads runs (O(ops + runs) host work per batch).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn, Self

import attrs

from .errors import InvalidArgumentError

__all__ = [
    "CheckpointRestoreOp",
    "CheckpointStoreOp",
    "UnitRuns",
    "run_units",
    "unit_runs",
]

#: An image's units as runs of consecutive ids, in piece order: ``((first, count), ...)``.
UnitRuns = tuple[tuple[int, int], ...]


def unit_runs(unit_ids: Iterable[int]) -> UnitRuns:
    """The maximal runs of ``unit_ids`` in order (SPEC A.5). O(len(unit_ids)).

    ``unit_runs((7, 8, 9, 3, 4))`` is ``((7, 3), (3, 2))``; ``unit_runs(())`` is ``()``.

    Raises:
        InvalidArgumentError: an id is not an int (bools are refused) or is negative.
    """
    out: list[tuple[int, int]] = []
    first = nxt = -1
    for u in unit_ids:
        if type(u) is not int or u < 0:
            raise InvalidArgumentError(f"a unit id must be an int >= 0, got {u!r}")
        if u == nxt:
            nxt += 1
            continue
        if first >= 0:
            out.append((first, nxt - first))
        first, nxt = u, u + 1
    if first >= 0:
        out.append((first, nxt - first))
    return tuple(out)


def run_units(runs: UnitRuns) -> tuple[int, ...]:
    """The unit ids of ``runs``, in piece order. O(units)."""
    if len(runs) == 1:
        first, count = runs[0]
        return tuple(range(first, first + count))
    out: list[int] = []
    for first, count in runs:
        out.extend(range(first, first + count))
    return tuple(out)


def _well_formed_runs(runs: object) -> UnitRuns:
    """``runs`` as given, when it is a tuple of ``(first, count)`` int pairs, ``first >= 0``,
    ``count >= 1``, maximal (no run continues the one before it).

    Raises:
        InvalidArgumentError: anything else.
    """
    if type(runs) is not tuple:
        raise InvalidArgumentError(f"runs must be a tuple of (first, count) pairs, got {runs!r}")
    end = -1
    for r in runs:
        if (
            type(r) is not tuple
            or len(r) != 2
            or type(r[0]) is not int
            or type(r[1]) is not int
            or r[0] < 0
            or r[1] < 1
        ):
            raise InvalidArgumentError(
                f"a run is a (first, count) pair of ints, first >= 0, count >= 1; got {r!r}"
            )
        if r[0] == end:
            raise InvalidArgumentError(
                f"runs must be maximal: {r!r} continues the run before it (merge them)"
            )
        end = r[0] + r[1]
    return runs


class _ImageOp:
    """What a store op and a restore op share: the image's units (runs and ids, each
    computed from the other on first use), ``total_bytes`` and ``layout_id``. Frozen."""

    __slots__ = ("_slot", "_ids", "_runs", "total_bytes", "layout_id")
    _slot_name = ""

    _slot: int
    _ids: Any  # tuple[int, ...] | None; as given, so a malformed op reaches validation
    _runs: UnitRuns | None
    total_bytes: int
    layout_id: str

    def _init(
        self,
        slot: int,
        unit_ids: tuple[int, ...] | None,
        total_bytes: int,
        layout_id: str,
        runs: UnitRuns | None,
    ) -> None:
        if (unit_ids is None) == (runs is None):
            raise InvalidArgumentError(
                f"{type(self).__name__} takes unit_ids or runs, exactly one of them"
            )
        s = object.__setattr__
        s(self, "_slot", slot)
        s(self, "_ids", unit_ids)
        s(self, "_runs", None if runs is None else _well_formed_runs(runs))
        s(self, "total_bytes", total_bytes)
        s(self, "layout_id", layout_id)

    @classmethod
    def _of_runs(cls, slot: int, runs: UnitRuns, total_bytes: int, layout_id: str) -> Self:
        """The store's constructor: ``runs`` known maximal and well formed (no check)."""
        op = cls.__new__(cls)
        s = object.__setattr__
        s(op, "_slot", slot)
        s(op, "_ids", None)
        s(op, "_runs", runs)
        s(op, "total_bytes", total_bytes)
        s(op, "layout_id", layout_id)
        return op

    @property
    def unit_ids(self) -> tuple[int, ...]:
        """The image's unit ids in piece order (ATOM's field). O(units) the first time."""
        ids = self._ids
        if ids is None:
            ids = run_units(self._runs)  # type: ignore[arg-type]
            object.__setattr__(self, "_ids", ids)
        return ids  # type: ignore[no-any-return]

    @property
    def runs(self) -> UnitRuns:
        """The image's units as maximal runs ``((first, count), ...)`` in piece order.

        Raises:
            InvalidArgumentError: the op was built from ``unit_ids`` that are not a tuple
                of ints ``>= 0`` (such an op is refused by the executor too).
        """
        runs = self._runs
        if runs is None:
            ids = self._ids
            if type(ids) is not tuple:
                raise InvalidArgumentError(f"unit_ids must be a tuple, got {ids!r}")
            runs = unit_runs(ids)
            object.__setattr__(self, "_runs", runs)
        return runs

    def evolve(self, **changes: Any) -> Self:
        """A copy with some fields changed (what ``attrs.evolve`` does for attrs classes):
        the slot field by its name (``src_slot`` / ``dst_slot``), ``total_bytes``,
        ``layout_id``, and ``unit_ids`` or ``runs`` (either replaces the units).

        Raises:
            InvalidArgumentError: an unknown field, both ``unit_ids`` and ``runs``, or
                ``runs`` not maximal well-formed runs.
        """
        known = {self._slot_name, "unit_ids", "runs", "total_bytes", "layout_id"}
        unknown = set(changes) - known
        if unknown:
            raise InvalidArgumentError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        if "unit_ids" in changes and "runs" in changes:
            raise InvalidArgumentError("give unit_ids or runs, not both")
        if "unit_ids" in changes or "runs" in changes:
            ids, runs = changes.get("unit_ids"), changes.get("runs")
        elif self._runs is not None:
            ids, runs = None, self._runs
        else:
            ids, runs = self._ids, None
        op = type(self).__new__(type(self))
        op._init(
            changes.get(self._slot_name, self._slot),
            ids,
            changes.get("total_bytes", self.total_bytes),
            changes.get("layout_id", self.layout_id),
            runs,
        )
        return op

    def _key(self) -> tuple[object, ...]:
        try:
            units: object = ("runs", self.runs)
        except InvalidArgumentError:
            units = ("ids", self._ids)
        return (self._slot, units, self.total_bytes, self.layout_id)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise attrs.exceptions.FrozenInstanceError()

    def __delattr__(self, name: str) -> NoReturn:
        raise attrs.exceptions.FrozenInstanceError()

    def __repr__(self) -> str:
        try:
            units = f"runs={self.runs!r}"
        except InvalidArgumentError:
            units = f"unit_ids={self._ids!r}"
        return (
            f"{type(self).__name__}({self._slot_name}={self._slot!r}, {units},"
            f" total_bytes={self.total_bytes!r}, layout_id={self.layout_id!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._slot, self._ids, self._runs, self.total_bytes,
                           self.layout_id))

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: object) -> Any:
        return self


def _rebuild(
    cls: type[_ImageOp],
    slot: int,
    ids: Any,
    runs: UnitRuns | None,
    total_bytes: int,
    layout_id: str,
) -> _ImageOp:
    op = cls.__new__(cls)
    s = object.__setattr__
    for name, v in (
        ("_slot", slot),
        ("_ids", ids),
        ("_runs", runs),
        ("total_bytes", total_bytes),
        ("layout_id", layout_id),
    ):
        s(op, name, v)
    return op


class CheckpointStoreOp(_ImageOp):
    """Copy slot ``src_slot``'s image into its units (piece order); ``total_bytes ==
    image_bytes`` (SPEC A.1).

    ``CheckpointStoreOp(src_slot, unit_ids, total_bytes, layout_id)`` as in ATOM, or
    ``CheckpointStoreOp.from_runs(src_slot, runs, total_bytes, layout_id)`` with maximal
    runs (see :mod:`pagedstate.spec.ops`). Frozen, hashable, equal by slot, unit sequence,
    ``total_bytes`` and ``layout_id``.

    Raises:
        InvalidArgumentError: neither or both of ``unit_ids`` and ``runs`` given, or
            ``runs`` not maximal well-formed runs.
    """

    __slots__ = ()
    _slot_name = "src_slot"

    def __init__(
        self,
        src_slot: int,
        unit_ids: tuple[int, ...] | None = None,
        total_bytes: int = 0,
        layout_id: str = "",
        *,
        runs: UnitRuns | None = None,
    ) -> None:
        self._init(src_slot, unit_ids, total_bytes, layout_id, runs)

    @property
    def src_slot(self) -> int:
        """The slot the image is read from."""
        return self._slot

    @classmethod
    def from_runs(
        cls, src_slot: int, runs: UnitRuns, total_bytes: int, layout_id: str
    ) -> CheckpointStoreOp:
        """A store op over ``runs`` (their form is checked: a tuple of ``(first, count)``
        int pairs, maximal; whether they overlap, fit the pool or count the image's units is
        the executor's to check, SPEC E.5 step 1).

        Raises:
            InvalidArgumentError: ``runs`` is not a tuple of maximal ``(first, count)``
                int pairs with ``first >= 0`` and ``count >= 1``.
        """
        return cls(src_slot, None, total_bytes, layout_id, runs=runs)


class CheckpointRestoreOp(_ImageOp):
    """Copy an image from its units (piece order) into slot ``dst_slot`` (SPEC A.1).

    Built as :class:`CheckpointStoreOp` is (``unit_ids`` or :meth:`from_runs`).

    Raises:
        InvalidArgumentError: as :class:`CheckpointStoreOp`.
    """

    __slots__ = ()
    _slot_name = "dst_slot"

    def __init__(
        self,
        dst_slot: int,
        unit_ids: tuple[int, ...] | None = None,
        total_bytes: int = 0,
        layout_id: str = "",
        *,
        runs: UnitRuns | None = None,
    ) -> None:
        self._init(dst_slot, unit_ids, total_bytes, layout_id, runs)

    @property
    def dst_slot(self) -> int:
        """The slot the image is written to."""
        return self._slot

    @classmethod
    def from_runs(
        cls, dst_slot: int, runs: UnitRuns, total_bytes: int, layout_id: str
    ) -> CheckpointRestoreOp:
        """A restore op over ``runs`` (checked as :meth:`CheckpointStoreOp.from_runs`).

        Raises:
            InvalidArgumentError: as :meth:`CheckpointStoreOp.from_runs`.
        """
        return cls(dst_slot, None, total_bytes, layout_id, runs=runs)
