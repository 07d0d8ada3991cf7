"""What the production pool's modules share: the eviction callback type, the unit-id list
check, ``_consume``, the undo record of a reservation, and :class:`_PoolBase`, the typed base
of the pool's mixins (:mod:`._pool_kv`, :mod:`._pool_checks`): the pool's attributes and the
per-owner calls of :mod:`.pool` they make, declared for mypy."""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pagedstate.spec.errors import DuplicateUnitError, InvalidArgumentError

from ._args import need_int
from ._pool_extents import _Extents

#: Runs an iterator to its end at C speed, keeping nothing (a deque of maxlen 0).
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend

#: ``on_evict(prefix_hash)``: a reservation overwrote the cached KV block of ``prefix_hash``.
EvictionCallback = Callable[[int], None]


def _ids_list(unit_ids: Any, num_units: int) -> tuple[int, ...]:
    """A list or tuple of int unit ids in ``[0, num_units)`` without repeats, as a tuple of
    exact ints (int subclasses are accepted, as the reference does, and converted: runs,
    extents and ops hold plain ints).

    Raises:
        InvalidArgumentError: not a list or tuple, an id not an int, or an id outside the
            pool's range ``[0, num_units)`` (G16: the message names the range, as the
            reference model's).
        DuplicateUnitError: an id repeats.
    """
    if not isinstance(unit_ids, (list, tuple)):
        raise InvalidArgumentError(
            f"unit_ids must be a list or tuple, got {type(unit_ids).__qualname__}"
        )
    ids = tuple(unit_ids)
    exact = True
    for u in ids:
        if type(u) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("unit id", u)
            exact = False
        if not 0 <= u < num_units:
            raise InvalidArgumentError(_outside(u, num_units))
    if not exact:  # an int subclass (an IntEnum, say) names the unit; the pool keeps ints
        ids = tuple(int(u) for u in ids)
    if len(set(ids)) != len(ids):
        raise DuplicateUnitError(f"unit ids repeat: {list(ids)}")
    return ids


def _outside(unit: object, num_units: int) -> str:
    """The message for a unit id outside the pool (G16)."""
    return f"unit {unit} is outside the pool's range [0, {num_units}) (G16)"


#: What undoes one reservation: its runs (piece order), owner, the hashes of the cached
#: units it took and those units (its last ``len(hashes)`` units, in order), and the vacant
#: index it drained (a reservation that takes a cached unit takes every vacant one first).
#: Its vacant units go back as that index, or run by run if units went vacant since. Last,
#: each run's tag and piece-base arrays as they were, ``(first, tags, bases)``.
_UndoRecord = tuple[list[tuple[int, int]], Hashable, list[int], list[int], Any, list[Any]]


class _PoolBase:
    """The attributes of :class:`~.pool.UnitPool` (its constructor sets and explains them)
    and the calls of :mod:`.pool` that its mixins make, declared for mypy only: nothing
    here exists at run time."""

    num_units: int
    on_evict: EvictionCallback | None
    _ext: _Extents
    _cached: OrderedDict[int, int]
    _tag: array[int]
    _piece: array[int]
    _ramp: array[int]
    _who: dict[int, tuple[Hashable, int]]
    _next_handle: int
    _held: dict[Hashable, int]
    _held_ckpt: dict[Hashable, int]
    _held_xfer: dict[Hashable, int]
    _dirtyf: bytearray
    _dirty_runs: list[tuple[int, int]]
    _dirty_prune_at: int
    _defer: int
    _defer_undo: bool
    _deferred: list[int]
    _undo: list[_UndoRecord]
    _store_calls: int

    if TYPE_CHECKING:

        def _count_of(self, owner: Hashable) -> tuple[dict[Hashable, int], Hashable]: ...

        def _held_by(self, owner: Hashable) -> int: ...

        def _add_held(self, owner: Hashable, n: int) -> None: ...

        def _need_owner(self, name: str, owner: Hashable) -> None: ...

        def _validate_whole(self, unit_ids: Any, owner: Hashable) -> tuple[int, ...]: ...

        def _tag_runs(self, runs: list[tuple[int, int]], owner: Hashable) -> None: ...

        def _tag_of(self, unit: int) -> tuple[Hashable, int] | None: ...

        def _untag_runs(self, runs: Sequence[tuple[int, int]]) -> None: ...

        def _holds_runs(self, runs: Any, owner: Hashable) -> bool: ...

        def _need_unit(self, unit: int) -> None: ...

        def _prune_dirty(self) -> None: ...

        def dirty_units(self) -> frozenset[int]: ...
