"""The production pool's KV side (SPEC A.4; the engine protocol is in :mod:`.pool`'s
docstring): parking a released KV reservation's blocks as cached, claiming cached blocks back
on a prefix-cache hit, uncaching them; and the pool's eviction events, the ``on_evict``
callbacks of a reservation that overwrote cached blocks: fired in order, held by
``deferred_evictions()`` blocks, and the undo of a reservation whose callback raised. A
mixin of :class:`~.pool.UnitPool`."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from pagedstate.spec.errors import EvictionCallbackError, InvalidArgumentError
from pagedstate.spec.ops import unit_runs

from ._args import is_dirtying, is_int
from ._pool_base import _consume, _ids_list, _PoolBase, _UndoRecord


def _callback_error(failed: tuple[int, Exception], undone: bool) -> EvictionCallbackError:
    h, exc = failed
    return EvictionCallbackError(h, undone, f"{type(exc).__name__}: {exc}")


class _Deferral:
    """``UnitPool.deferred_evictions()``: a re-entrant hold on eviction callbacks."""

    __slots__ = ("_pool", "_undo_on_error")

    def __init__(self, pool: _KVSide, undo_on_error: bool = False) -> None:
        self._pool = pool
        self._undo_on_error = undo_on_error

    def __enter__(self) -> None:
        pool = self._pool
        if not pool._defer:  # the outermost block decides whether its reservations are undone
            pool._defer_undo = self._undo_on_error
        pool._defer += 1

    def __exit__(self, exc_type: object, *exc: object) -> None:
        pool = self._pool
        pool._defer -= 1
        if pool._defer == 0:
            pool._defer_undo = False
        if pool._defer == 0 and pool._deferred:
            evicted, pool._deferred = pool._deferred, []
            undo, pool._undo = pool._undo, []
            if pool.on_evict is not None:
                failed = pool._fire(evicted)
                if failed is not None:
                    undone = False
                    if self._undo_on_error and exc_type is None:
                        undone = all([pool._unreserve(u) for u in reversed(undo)])
                    raise _callback_error(failed, undone) from failed[1]


class _KVSide(_PoolBase):
    """Cached KV units and the eviction events of reusing them (SPEC A.4)."""

    # -- eviction events (SPEC A.4, G8) -------------------------------------------------

    def deferred_evictions(self, *, undo_on_error: bool = False) -> _Deferral:
        """A context manager holding ``on_evict`` callbacks of reservations made inside it
        until the outermost such block exits (then they fire in order, even if the block
        raised). The store and coordinator reserve inside one, so the engine's re-entrant
        ``unindex`` finds them consistent. O(1) (+ the callbacks).

        If a callback raises, the exit raises
        :class:`~pagedstate.spec.errors.EvictionCallbackError` after every callback ran.
        With ``undo_on_error`` (on the outermost block, when the block itself completed),
        the reservations made in the block that took cached units (those whose callbacks
        fired) are undone first, and the error's ``undone`` says whether they all were;
        reservations of vacant units only stand (the store and coordinator make one
        reservation per block, the caller then drops what it filed). Without it they all
        stand."""
        return _Deferral(self, undo_on_error)

    def _fire(self, evicted: list[int]) -> tuple[int, Exception] | None:
        """Call ``on_evict`` for each hash, in order; the first failure, if any, after
        every callback ran. Store owners are not accepted inside a callback."""
        hook = self.on_evict
        assert hook is not None
        failed: tuple[int, Exception] | None = None
        trusted, self._store_calls = self._store_calls, 0
        try:
            for h in evicted:
                try:
                    hook(h)
                except Exception as exc:  # reported after every callback ran
                    if failed is None:
                        failed = (h, exc)
        finally:
            self._store_calls = trusted
        return failed

    def _unreserve(self, undo: _UndoRecord) -> bool:
        """Put a reservation's units back where they were (vacant, or cached under their
        hashes at the cold end of the LRU, in order). Only while every unit is still
        tagged as reserved (a callback may have released or retagged them): returns whether
        it undid anything. O(runs log n + cached units)."""
        runs, owner, evicted, taken, drained, was = undo
        if not runs or not self._holds_runs(runs, owner):
            return False
        h = self._tag[runs[0][0]]
        piece = sum(c for _, c in runs)
        self._untag_runs(runs)
        tag, pieces = self._tag, self._piece
        for a, old_tag, old_pieces in was:  # the tags as they were (G8 compares the arrays)
            tag[a : a + len(old_tag)] = old_tag
            pieces[a : a + len(old_pieces)] = old_pieces
        if h == self._next_handle - 1:  # the handle goes back too (G8 compares the counter)
            self._next_handle = h
        self._add_held(owner, -piece)
        ext = self._ext
        if drained is not None and not ext.count:
            ext.attach(drained)  # the index as it was, arrays and all (G8 compares them)
        else:
            # a callback released units since (or nothing was drained): the same vacant
            # units, given back run by run
            cached_set = set(taken)
            for a, c in runs:
                start = None
                for u in range(a, a + c) if cached_set else ():
                    if u in cached_set:
                        if start is not None:
                            ext.give(start, u)
                            start = None
                    elif start is None:
                        start = u
                if not cached_set:
                    ext.give(a, a + c)
                elif start is not None:
                    ext.give(start, a + c)
        cached = self._cached
        # equivalent mutants: equal lengths (the cached units taken, in order)
        for u, hh in zip(reversed(taken), reversed(evicted), strict=True):  # pragma: no mutate
            cached[u] = hh
            cached.move_to_end(u, last=False)  # pragma: no mutate (last=None is False)
        return True

    # -- the engine's KV side (:mod:`.pool`'s docstring) --------------------------------

    def cache_units(self, unit_ids: Any, owner: Hashable, prefix_hashes: Any) -> None:
        """Release a whole KV reservation but park unit ``i`` as a cached block of
        ``prefix_hashes[i]`` (``None``: the unit goes vacant). Cached units stay free and are
        handed out after every vacant unit, least recently cached first; reusing one fires
        ``on_evict``. O(k) (a vacant unit merges into its neighbours' extent in O(1)).

        Raises:
            InvalidArgumentError: ``prefix_hashes`` is not a list/tuple of ints or ``None``
                of the same length; ``owner`` is a checkpoint or transfer owner (raw state
                units hold no KV prefix); malformed ids or owner.
            DuplicateUnitError, StoreOwnedUnitsError, WrongOwnerError, PartialReleaseError:
                as ``release_units``.
        """
        ids = self._validate_whole(unit_ids, owner)
        if is_dirtying(owner):
            raise InvalidArgumentError(
                f"units of {owner!r} hold raw state, not KV: release them with release_units"
            )
        if not isinstance(prefix_hashes, (list, tuple)) or len(prefix_hashes) != len(ids):
            raise InvalidArgumentError(
                f"prefix_hashes must be a list or tuple of {len(ids)} hashes, got {prefix_hashes!r}"
            )
        for h in prefix_hashes:
            if h is not None and not is_int(h):
                raise InvalidArgumentError(f"a prefix hash must be an int or None, got {h!r}")
        self._untag_runs(unit_runs(ids))
        give, cached = self._ext.give, self._cached
        # equivalent mutants: lengths checked equal
        for u, h in zip(ids, prefix_hashes, strict=True):  # pragma: no mutate
            if h is None:
                give(u, u + 1)
            else:
                cached[u] = h
        self._add_held(owner, -len(ids))

    def claim_cached_units(self, unit_ids: Any, owner: Hashable) -> None:
        """A prefix-cache hit takes cached units back as a new reservation of ``owner``
        tagged ``(owner, position)``; nothing fires (the content is reused). O(k).

        Raises:
            InvalidArgumentError: a unit is not a cached free unit; ``owner`` is None or
                unhashable; malformed ids, or an id outside ``[0, num_units)`` (G16).
            DuplicateUnitError: an id repeats.
            StoreOwnedUnitsError: ``owner`` is a store owner (the store claims no KV).
        """
        ids = _ids_list(unit_ids, self.num_units)
        if owner is None:
            raise InvalidArgumentError("a reservation needs an owner, got None")
        self._need_owner("owner", owner)
        if self._held_by(owner):
            raise InvalidArgumentError(
                f"owner {owner!r} already holds units: one reservation per owner (G9)"
            )
        for u in ids:
            if u not in self._cached:
                raise InvalidArgumentError(f"unit {u} is not a cached free unit")
        _consume(map(self._cached.__delitem__, ids))
        if ids:
            self._tag_runs(list(unit_runs(ids)), owner)
        self._add_held(owner, len(ids))

    def uncache_units(self, unit_ids: Any) -> None:
        """The engine's prefix index no longer points at these cached units: they become
        vacant and their later reuse fires nothing. O(k log n).

        Raises:
            InvalidArgumentError: a unit is not a cached free unit; malformed ids, or an id
                outside ``[0, num_units)`` (G16).
            DuplicateUnitError: an id repeats.
        """
        ids = _ids_list(unit_ids, self.num_units)
        for u in ids:
            if u not in self._cached:
                raise InvalidArgumentError(f"unit {u} is not a cached free unit")
        give = self._ext.give
        for u in ids:
            del self._cached[u]
            give(u, u + 1)
