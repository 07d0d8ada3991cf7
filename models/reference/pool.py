"""The reference pools: :class:`UnitPool`, the raw units checkpoints, transfers and other
owners reserve (SPEC A.2, A.3, G9, G10), with :class:`_StoreAccess`, the store's pass for
its own owners; and :class:`SlotPool`, a state-slot pool for midstep scratch."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from pagedstate.spec.errors import (
    DuplicateUnitError,
    InvalidArgumentError,
    PartialReleaseError,
    StoreOwnedUnitsError,
    WrongOwnerError,
    need_hashable,
)
from pagedstate.spec.protocols import need_slots

from ._common import _is_dirtying, _need_int, _owner_kind, _same_owner

# ---------------------------------------------------------------------------------------
# Unit pool (SPEC A.2, A.3, G9, G10)
# ---------------------------------------------------------------------------------------


class UnitPool:
    """Reference pool of ``num_units`` raw units, ids ``[0, num_units)``.

    A unit is free or tagged ``(owner, piece)``. ``reserve_units`` hands out the lowest free
    ids. Units released from a checkpoint or transfer owner are marked dirty until
    :meth:`mark_clean` (G10). Owners are hashable; the store owners ``("state-checkpoint",
    cid)`` and ``("state-transfer", owner)`` are accepted only from the store itself, which
    calls inside ``with pool._as_store():`` (SPEC A.3); anyone else naming one gets
    :class:`StoreOwnedUnitsError`. A unit is ``owner``'s when its tag's owner is the same
    owner (``_same_owner``): the same kind (an object only equal to a store owner's tag is
    an engine owner) and the same object or equal (a checkpoint's tag: the same id).
    """

    def __init__(self, num_units: int) -> None:
        _need_int("num_units", num_units, 0)
        self.num_units = num_units
        self._free: set[int] = set(range(num_units))
        self._tags: dict[int, tuple[Hashable, int]] = {}
        self._dirty: set[int] = set()
        self._store_calls = 0

    def clone(self) -> UnitPool:
        c = type(self).__new__(type(self))
        c.num_units = self.num_units
        c._free = set(self._free)
        c._tags = dict(self._tags)
        c._dirty = set(self._dirty)
        c._store_calls = self._store_calls
        return c

    def _as_store(self) -> _StoreAccess:
        """The store is calling: store owners are accepted inside the block."""
        return _StoreAccess(self)

    def _need_owner(self, name: str, owner: Hashable) -> None:
        need_hashable(name, owner)
        if not self._store_calls and _is_dirtying(owner):
            raise StoreOwnedUnitsError.for_owner(owner)

    def _held(self, owner: Hashable) -> int:
        """How many units are ``owner``'s (``_same_owner``, with the kind read once)."""
        kind = _owner_kind(owner)
        return sum(
            1
            for held_by, _piece in self._tags.values()
            if (held_by is owner or held_by == owner) and _owner_kind(held_by) == kind
        )

    def _need_unit(self, unit: object) -> None:
        """G16: a unit id is an int in ``[0, num_units)``; the error names the pool's range.

        Raises:
            InvalidArgumentError: not an int, or outside the range.
        """
        _need_int("unit id", unit)
        assert isinstance(unit, int)
        if not 0 <= unit < self.num_units:
            raise InvalidArgumentError(
                f"unit {unit} is outside the pool's range [0, {self.num_units}) (G16)"
            )

    @property
    def num_free(self) -> int:
        """Free units."""
        return len(self._free)

    def has_free(self, n: int) -> bool:
        """Whether at least ``n`` units are free.

        Raises:
            InvalidArgumentError: ``n`` is not a non-negative int.
        """
        _need_int("n", n, 0)
        return len(self._free) >= n

    def owner_of(self, unit: int) -> tuple[Hashable, int] | None:
        """``(owner, piece)`` of a reserved unit, ``None`` for a free one.

        Raises:
            InvalidArgumentError: ``unit`` is not an int in ``[0, num_units)``.
        """
        self._need_unit(unit)
        return self._tags.get(unit)

    def is_dirty(self, unit: int) -> bool:
        """Whether ``unit`` last held checkpoint or transfer bytes and was not scrubbed (G10).

        Raises:
            InvalidArgumentError: ``unit`` is not an int in ``[0, num_units)``.
        """
        self._need_unit(unit)
        return unit in self._dirty

    def cached_units(self) -> tuple[tuple[int, int], ...]:
        """Cached KV units: none (the reference pool caches no KV)."""
        return ()

    def dirty_units(self) -> frozenset[int]:
        """Every dirty unit."""
        return frozenset(self._dirty)

    def mark_clean(self, unit_ids: Iterable[int]) -> None:
        """Record that the executor scrubbed these units (G10)."""
        try:
            ids = list(unit_ids)
        except TypeError as exc:
            raise InvalidArgumentError(
                f"unit_ids must be an iterable of unit ids, got {unit_ids!r}"
            ) from exc
        for u in ids:
            self._need_unit(u)
        self._dirty.difference_update(ids)

    def reserve_units(self, count: int, owner: Hashable) -> list[int] | None:
        """Reserve ``count`` units tagged ``(owner, piece)`` in piece order; ``None`` (nothing
        changed) when fewer are free. ``count == 0`` returns ``[]``."""
        _need_int("count", count, 0)
        if owner is None:
            raise InvalidArgumentError("a reservation needs an owner, got None")
        self._need_owner("owner", owner)
        if self._held(owner):
            raise InvalidArgumentError(
                f"owner {owner!r} already holds units: one reservation per owner (G9)"
            )
        if len(self._free) < count:
            return None
        units = sorted(self._free)[:count]
        for piece, u in enumerate(units):
            self._free.discard(u)
            self._tags[u] = (owner, piece)
        return units

    def _validate_whole(self, unit_ids: Any, owner: Hashable) -> tuple[int, ...]:
        if not isinstance(unit_ids, (list, tuple)):
            raise InvalidArgumentError(
                f"unit_ids must be a list or tuple, got {type(unit_ids).__qualname__}"
            )
        ids = tuple(unit_ids)
        for u in ids:
            self._need_unit(u)  # G16: outside the pool is a bad id, not a wrong owner
        if len(set(ids)) != len(ids):
            raise DuplicateUnitError(f"unit ids repeat: {list(ids)}")
        if owner is None:
            raise InvalidArgumentError("owner must not be None")
        self._need_owner("owner", owner)
        for piece, u in enumerate(ids):
            tag = self._tags.get(u)
            if tag is None or not _same_owner(tag[0], owner) or tag[1] != piece:
                raise WrongOwnerError.for_unit(u, tag, owner, piece)
        held = self._held(owner)
        if held != len(ids):
            raise PartialReleaseError(
                f"owner {owner!r} holds {held} units but the call names {len(ids)}; name the"
                " whole reservation (SPEC G9)"
            )
        return ids

    def release_units(self, unit_ids: Any, owner: Hashable) -> None:
        """Release a whole reservation, every unit in piece order (G9).

        Raises:
            DuplicateUnitError, InvalidArgumentError: malformed ids (not ints, or outside
                ``[0, num_units)``, G16) or owner (None or unhashable).
            StoreOwnedUnitsError: ``owner`` is a store owner and the store is not calling.
            WrongOwnerError: a unit is not tagged ``(owner, position)``.
            PartialReleaseError: the owner holds more units than named.
        """
        ids = self._validate_whole(unit_ids, owner)
        dirty = _is_dirtying(owner)
        for u in ids:
            del self._tags[u]
            self._free.add(u)
            if dirty:
                self._dirty.add(u)

    def rekey_units(self, unit_ids: Any, old_owner: Hashable, new_owner: Hashable) -> None:
        """Retag a whole reservation from ``old_owner`` to ``new_owner`` atomically; the units
        never pass through the free list (SPEC A.2)."""
        if new_owner is None:
            raise InvalidArgumentError("new_owner must not be None")
        ids = self._validate_whole(unit_ids, old_owner)
        self._need_owner("new_owner", new_owner)
        if self._held(new_owner):
            raise InvalidArgumentError(f"owner {new_owner!r} already holds units")
        for piece, u in enumerate(ids):
            self._tags[u] = (new_owner, piece)

    def snapshot_parts(
        self,
    ) -> tuple[frozenset[int], frozenset[int], dict[int, tuple[Hashable, int]]]:
        return frozenset(self._free), frozenset(self._dirty), dict(self._tags)


class _StoreAccess:
    """``UnitPool._as_store()``: the store is calling; store owners are accepted."""

    def __init__(self, pool: UnitPool) -> None:
        self._pool = pool

    def __enter__(self) -> None:
        self._pool._store_calls += 1

    def __exit__(self, *exc: object) -> None:
        self._pool._store_calls -= 1


class SlotPool:
    """A reference state-slot pool for midstep scratch: hands out the lowest free slot."""

    def __init__(self, slots: Iterable[int]) -> None:
        self._all = frozenset(need_slots(slots))
        self._free: set[int] = set(self._all)

    def clone(self) -> SlotPool:
        c = SlotPool.__new__(SlotPool)
        c._all = self._all
        c._free = set(self._free)
        return c

    def has_free(self) -> bool:
        return bool(self._free)

    def pop(self) -> int:
        if not self._free:
            raise InvalidArgumentError("no free scratch slot")
        s = min(self._free)
        self._free.discard(s)
        return s

    def release(self, slot: int) -> None:
        if slot not in self._all or slot in self._free:
            raise InvalidArgumentError(f"slot {slot} is not a borrowed scratch slot")
        self._free.add(slot)

    @property
    def free_slots(self) -> frozenset[int]:
        return frozenset(self._free)
