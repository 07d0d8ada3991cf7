"""Production unit pool: the KV block pool as the checkpoint store and an engine share it.

SPEC A.2-A.4, G9, G10. A *unit* is one block id in ``[0, num_units)``. Every unit is
exactly one of:

- **vacant**: free and holding nothing anyone needs;
- **cached**: free, but still holding the KV block of a prefix hash the engine's prefix
  cache may hit. A cached unit counts as free (``num_free``) because it is reclaimable;
- **reserved**: tagged ``(owner, piece)``: a checkpoint image (``("state-checkpoint",
  cid)``), a transfer reservation (``("state-transfer", owner)``), or live KV under any
  owner the engine chooses (for example ``("live-kv", req_id)``).

Reservations hand out vacant units first, lowest id first (free extents on a min-heap of
their starts, so an image from an unfragmented pool is one run of consecutive ids: SPEC
A.5), then cached units, least recently cached first (an ordered map): a cached KV block is
the last thing a reservation overwrites. Overwriting one is the pool's *eviction event*: it fires
``on_evict(prefix_hash)``.

Engine protocol (:class:`KVBlockPool`)
--------------------------------------
An engine plugs its KV side into the pool with these calls; everything else is the raw-unit
contract the store uses.

``UnitPool(num_units, on_evict=None)``
    ``on_evict(prefix_hash)`` is called once for every cached unit a reservation takes,
    after the whole reservation is tagged (so the pool is consistent: the new owner already
    holds every unit it got). The engine drops ``prefix_hash`` from its prefix index and
    calls ``coordinator.unindex(prefix_hash)``: the checkpoint "dies with its prefix"
    (SPEC A.4). This call is **re-entrant**: it runs inside ``reserve_units``, which may be
    inside the store's ``begin_store``, the coordinator's ``reserve_transfer_units`` or the
    engine's own KV allocation, and it may release checkpoint units back to the pool. The
    store and coordinator tolerate that (see ``PageUnitCheckpointStore.begin_store``).
``reserve_units(count, owner)`` / ``release_units(unit_ids, owner)``
    Live KV is reserved and released like any raw unit, as whole reservations in piece order.
``cache_units(unit_ids, owner, prefix_hashes)``
    Release a whole KV reservation whose blocks still hold prefixes: unit ``i`` is parked
    as cached under ``prefix_hashes[i]`` (``None``: nothing worth keeping, the unit goes
    vacant). Cached units are handed out after every vacant unit.
``claim_cached_units(unit_ids, owner)``
    A prefix-cache hit takes cached units back as a new reservation of ``owner`` (piece
    order = list order). No eviction fires: the content is reused.
``uncache_units(unit_ids)``
    The engine's index no longer points at these cached units (it re-pointed or dropped the
    hash): they become vacant, and reusing them later fires nothing.
``cached_hash(unit)`` / ``num_cached``
    What a cached unit holds; how many units are cached.

The store and coordinator reserve inside ``with pool.deferred_evictions():``: callbacks of
reservations made in the block are held until it exits, so the engine is called back only
once the caller has filed what it reserved (the checkpoint record, the transfer entry) and
every invariant holds again. A pool without ``deferred_evictions`` (an engine's own) may fire
inside ``reserve_units``; the store tolerates that too (its checkpoint id is taken before the
reservation, so a nested store cannot reuse it).

A callback that raises: ``reserve_units`` (outside any deferral block) and the
coordinator's ``reserve_transfer_units`` undo the reservation that fired it (its units go
back exactly where they were, cached KV blocks under their hashes in their LRU places) and
raise :class:`~pagedstate.spec.errors.EvictionCallbackError` from the callback's exception
(SPEC G8). What the callbacks did before raising is the engine's own and stays.

Store owners (SPEC A.3): units tagged ``("state-checkpoint", cid)`` or ``("state-transfer",
owner)`` belong to the store and coordinator. ``reserve_units``, ``release_units``,
``rekey_units``, ``cache_units`` and ``claim_cached_units`` naming such an owner raise
:class:`~pagedstate.spec.errors.StoreOwnedUnitsError` unless the store itself is calling
(it calls inside ``with pool._as_store():``); an engine cannot free or retag a live image.
A store owner is known by its shape, a 2-tuple (a ``NamedTuple`` too) of a store kind: an
object that only compares equal to one is an engine owner of its own, which neither names
the store owner's units nor shares its count (two owners are the same when of the same
kind and equal, a checkpoint's by its id; the reference model's ``_same_owner``).

Dirty units (SPEC G10): a unit released from a checkpoint or a transfer reservation still
holds raw state bytes; it is *dirty* until the executor scrubs it and calls
:meth:`UnitPool.mark_clean`. A dirty unit stays dirty while free or reserved.

Complexity (SPEC A.5): the store's own path (``_reserve_runs`` / ``_release_runs``, a
record's runs) takes O(runs log n) Python steps per image, plus O(units) at C speed (memory
fills of the per-unit tag, piece and dirty arrays), plus one step per cached KV unit it
overwrites; it does not grow with the units per image. The engine-facing calls that name
unit ids (``release_units``, ``cache_units``, ...) are O(k) in the ids named, and
``reserve_units`` returns its ids as a list (O(k)). Nothing depends on the pool size or the
number of owners; the whole-reservation check (G9) reads a per-owner unit count instead of
walking the tags. ``snapshot_parts``, ``self_check`` and ``clone`` are O(num_units).

Modules: this one holds :class:`UnitPool` with its constructor, the readings, the per-owner
counts and the raw-unit contract, and :class:`SlotPool`; the pool's mixins hold the KV side
and its eviction events (:mod:`._pool_kv`) and ``self_check`` (:mod:`._pool_checks`); the
shared pieces and the mixins' typed base are in :mod:`._pool_base`.
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from pagedstate.spec.errors import (
    InvalidArgumentError,
    PartialReleaseError,
    StoreOwnedUnitsError,
    WrongOwnerError,
)
from pagedstate.spec.ops import run_units, unit_runs
from pagedstate.spec.protocols import need_slots
from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

from ._args import need_hashable, need_int
from ._pool_base import EvictionCallback, _ids_list, _outside, _UndoRecord
from ._pool_checks import _Checks
from ._pool_dirty import _NUM_ONES, _ONES, _Dirty
from ._pool_extents import TAG_TYPECODE as _TC
from ._pool_extents import _Extents, _zeros
from ._pool_kv import _callback_error, _Deferral, _KVSide

__all__ = ["UnitPool", "SlotPool", "KVBlockPool", "EvictionCallback"]

#: The owner kinds that belong to the store (SPEC A.3): ``(kind, ident)`` owners.
_STORE_KINDS = (CHECKPOINT_OWNER, TRANSFER_OWNER)


@runtime_checkable
class KVBlockPool(Protocol):
    """What an engine's KV side calls on the shared pool (see the module docstring).

    Unit ids are ints in ``[0, num_units)``; prefix hashes are the engine's chained
    block-content hashes (ints). Errors are :mod:`pagedstate.spec.errors` classes and a
    call that raises changes nothing.
    """

    num_units: int
    on_evict: EvictionCallback | None

    @property
    def num_free(self) -> int: ...

    def has_free(self, n: int) -> bool: ...

    def reserve_units(self, count: int, owner: Hashable) -> list[int] | None: ...

    def release_units(self, unit_ids: Any, owner: Hashable) -> None: ...

    def cache_units(self, unit_ids: Any, owner: Hashable, prefix_hashes: Any) -> None: ...

    def claim_cached_units(self, unit_ids: Any, owner: Hashable) -> None: ...

    def uncache_units(self, unit_ids: Any) -> None: ...

    def cached_hash(self, unit: int) -> int | None: ...

    def is_dirty(self, unit: int) -> bool: ...

    def mark_clean(self, unit_ids: Iterable[int]) -> None: ...


class UnitPool(_KVSide, _Dirty, _Checks):
    """Production pool of ``num_units`` units, ids ``[0, num_units)`` (SPEC A.2, G9, G10).

    Args:
        num_units: pool size in units (KV block ids), ``>= 0``.
        on_evict: called with the prefix hash of every cached KV unit a reservation
            overwrites (SPEC A.4); ``None`` (default) when the engine caches no KV here.
            Settable later as the ``on_evict`` attribute.

    Raises:
        InvalidArgumentError: ``num_units`` is not a non-negative int, or ``on_evict`` is
            not callable.

    Driven through the raw-unit calls only (no KV caching), it hands out exactly the units
    the reference model's pool hands out: the lowest free ids, in piece order.
    """

    def __init__(self, num_units: int, on_evict: EvictionCallback | None = None) -> None:
        need_int("num_units", num_units, 0)
        if on_evict is not None and not callable(on_evict):
            raise InvalidArgumentError(f"on_evict must be callable or None, got {on_evict!r}")
        self.num_units = num_units
        self.on_evict: EvictionCallback | None = on_evict
        # Vacant free units as free extents, lowest first (SPEC A.5; see _pool_extents). A
        # unit is free (vacant or cached) exactly when it has no tag.
        self._ext = _Extents(num_units)
        # Cached free units -> prefix hash, least recently cached first.
        self._cached: OrderedDict[int, int] = OrderedDict()
        # The tag ``(owner, piece)`` of every unit by id (SPEC A.5). ``_tag[u]`` is the
        # handle of the last reservation that held u; handles are never reused, so u is
        # reserved exactly when its handle is live, a key of ``_who``: ``_who[h] = (owner,
        # base)``. A one-run reservation (the common case) has ``base`` its first unit and
        # piece ``u - base``; one of several runs has ``base == -1`` and piece
        # ``_piece[u]`` (``_piece``, written for such reservations only, ascends by one
        # along a run: each run's pieces are copied from the ramp ``_ramp``, ``0, 1, ...,
        # num_units - 1``, never written). A reservation is tagged with one memory fill per
        # run (two with several runs), released by forgetting its handle (no fill), rekeyed
        # by rewriting one ``_who`` entry: no Python step per unit.
        self._tag: array[int] = array("q", bytes(8 * num_units))
        self._piece: array[int] = _zeros(num_units)
        self._ramp: array[int] = array(_TC, range(num_units))
        self._who: dict[int, tuple[Hashable, int]] = {}
        self._next_handle = 1
        # Units held per (hashable) owner: the whole-reservation check of G9 without a walk.
        # A checkpoint's owner ``("state-checkpoint", cid)`` is counted apart, under its
        # ``cid`` (see ``_count_of``): the store holds one such owner per record, and
        # consecutive ids fill neighbouring slots of a dict where tuple keys scatter over
        # all of it (with 10^6 records, a cache miss per count on every store and release).
        # A transfer reservation's owner is counted apart too, so that an engine owner equal
        # to a store owner's tag (without being a 2-tuple) is never counted as that owner.
        self._held: dict[Hashable, int] = {}
        self._held_ckpt: dict[Hashable, int] = {}
        self._held_xfer: dict[Hashable, int] = {}
        # Dirty units (G10): a flag per unit (``is_dirty`` in O(1); set run by run at C
        # speed), and the runs that were flagged, for ``dirty_units`` to walk without reading
        # every unit: a superset of the dirty units, pruned when walked and when it grows.
        self._dirtyf = bytearray(num_units)
        self._dirty_runs: list[tuple[int, int]] = []
        self._dirty_prune_at = 1024
        # Eviction callbacks held by deferred_evictions() blocks (nesting depth, hashes), and
        # what undoes each reservation that fired them (see _unreserve).
        self._defer = 0
        self._defer_undo = False  # the outermost open block undoes its reservations on error
        self._deferred: list[int] = []
        self._undo: list[_UndoRecord] = []
        # Depth of _as_store() blocks: store owners are accepted only inside one.
        self._store_calls = 0
        self._store_access = _StoreAccess(self)
        self._deferral = _Deferral(self)  # the store's reusable deferred_evictions()

    def clone(self) -> UnitPool:
        """A deep copy sharing nothing mutable (``on_evict`` is shared). O(num_units)."""
        c = type(self).__new__(type(self))
        c.__dict__.update(self.__dict__)
        c._ext = self._ext.clone()
        c._cached = OrderedDict(self._cached)
        c._tag = array("q", self._tag)
        c._piece = array(_TC, self._piece)
        c._who = dict(self._who)
        c._held = dict(self._held)
        c._held_ckpt = dict(self._held_ckpt)
        c._held_xfer = dict(self._held_xfer)
        c._dirtyf = bytearray(self._dirtyf)
        c._dirty_runs = list(self._dirty_runs)
        c._deferred = list(self._deferred)
        c._undo = list(self._undo)
        c._store_access = _StoreAccess(c)
        c._deferral = _Deferral(c)
        return c

    # -- reading ------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Free units, vacant and cached (a cached KV block is reclaimable). O(1)."""
        return self._ext.count + len(self._cached)

    @property
    def num_cached(self) -> int:
        """Free units still holding a cached KV prefix. O(1)."""
        return len(self._cached)

    def has_free(self, n: int) -> bool:
        """Whether at least ``n`` units are free. O(1).

        Raises:
            InvalidArgumentError: ``n`` is not a non-negative int.
        """
        if type(n) is not int or n < 0:  # pragma: no mutate (need_int re-checks)
            need_int("n", n, 0)
        return self._ext.count + len(self._cached) >= n

    def _need_unit(self, unit: int) -> None:
        """G16: a unit id is an int in ``[0, num_units)``; the error names the pool's range."""
        if type(unit) is not int:  # pragma: no mutate (need_int re-checks)
            need_int("unit id", unit)
        if not 0 <= unit < self.num_units:
            raise InvalidArgumentError(_outside(unit, self.num_units))

    def owner_of(self, unit: int) -> tuple[Hashable, int] | None:
        """``(owner, piece)`` of a reserved unit, ``None`` for a free one. O(1).

        Raises:
            InvalidArgumentError: ``unit`` is not an int in ``[0, num_units)``.
        """
        self._need_unit(unit)
        return self._tag_of(unit)

    def cached_hash(self, unit: int) -> int | None:
        """The prefix hash a cached free unit holds, ``None`` otherwise. O(1).

        Raises:
            InvalidArgumentError: ``unit`` is not an int in ``[0, num_units)``.
        """
        self._need_unit(unit)
        return self._cached.get(unit)

    def cached_units(self) -> tuple[tuple[int, int], ...]:
        """``(unit, prefix_hash)`` of every cached free unit, least recently cached (next to
        be reused) first. O(cached)."""
        return tuple(self._cached.items())

    def snapshot_parts(
        self,
    ) -> tuple[frozenset[int], frozenset[int], dict[int, tuple[Hashable, int]]]:
        """``(free, dirty, tags)`` for :class:`~pagedstate.spec.snapshot.Snapshot`.
        O(num_units)."""
        tag, pieces, who = self._tag, self._piece, self._who
        free: set[int] = set()
        tags: dict[int, tuple[Hashable, int]] = {}
        for u, h in enumerate(tag):
            w = who.get(h)
            if w is None:
                free.add(u)
            else:
                tags[u] = (w[0], u - w[1] if w[1] >= 0 else pieces[u])
        return frozenset(free), self.dirty_units(), tags

    # -- per-owner counts ---------------------------------------------------------------

    # Every owner that reaches these two is hashable: the public calls check it first
    # (``_need_owner``) and the store's owners are ``(kind, int)`` tuples.

    def _count_of(self, owner: Hashable) -> tuple[dict[Hashable, int], Hashable]:
        """Where ``owner``'s unit count is kept: ``(counts, key)`` (see ``_held_ckpt``).

        This is what makes two owners the same one (the reference model's ``_same_owner``):
        the same kind and the same key. A checkpoint owner is any 2-tuple (subclasses too)
        whose kind equals ``"state-checkpoint"``, keyed by its second item; a transfer owner
        any 2-tuple whose kind equals ``"state-transfer"``, keyed by itself; any other owner
        is an engine owner, keyed by itself. So an engine owner that merely compares equal to
        a store owner's tag is another owner, and never names the store's units."""
        if isinstance(owner, tuple) and len(owner) == 2:
            kind = owner[0]
            if kind == CHECKPOINT_OWNER:
                return self._held_ckpt, owner[1]
            if kind == TRANSFER_OWNER:
                return self._held_xfer, owner
        return self._held, owner

    def _counted_as(
        self, held_by: Hashable | None, counts: dict[Hashable, int], key: Hashable
    ) -> bool:
        """Whether the owner a unit is tagged with, ``held_by`` (None: free), is the owner
        whose count ``_count_of`` keeps at ``(counts, key)``."""
        if held_by is None:
            return False
        their_counts, their_key = self._count_of(held_by)
        return their_counts is counts and (their_key is key or their_key == key)

    def _held_by(self, owner: Hashable) -> int:
        counts, key = self._count_of(owner)
        return counts.get(key, 0)

    def _add_held(self, owner: Hashable, n: int) -> None:
        counts, key = self._count_of(owner)
        left = counts.get(key, 0) + n
        if left:
            counts[key] = left
        else:
            counts.pop(key, None)

    def _as_store(self) -> _StoreAccess:
        """The store (or coordinator) is calling: store owners are accepted inside the block
        (module docstring). Not for engines. O(1)."""
        return self._store_access

    def _need_owner(self, name: str, owner: Hashable) -> None:
        """``owner`` is hashable and, unless the store is calling, not a store owner (the
        test ``_is_whole`` makes on the fast path)."""
        try:
            hash(owner)
        except Exception:
            need_hashable(name, owner)
        if (
            isinstance(owner, tuple)
            and len(owner) == 2
            and owner[0] in _STORE_KINDS
            and not self._store_calls
        ):
            raise StoreOwnedUnitsError.for_owner(owner)

    def _validate_whole(self, unit_ids: Any, owner: Hashable) -> tuple[int, ...]:
        ids = _ids_list(unit_ids, self.num_units)
        if owner is None:
            raise InvalidArgumentError("owner must not be None")
        self._need_owner("owner", owner)
        counts, key = self._count_of(owner)
        for piece, u in enumerate(ids):
            got = self._tag_of(u)
            held_by = None if got is None else got[0]
            if (
                got is None
                or (held_by is not owner and not self._counted_as(held_by, counts, key))
                or got[1] != piece
            ):
                raise WrongOwnerError.for_unit(u, got, owner, piece)
        held = counts.get(key, 0)
        if held != len(ids):
            raise PartialReleaseError(
                f"owner {owner!r} holds {held} units but the call names {len(ids)}; name the"
                " whole reservation (SPEC G9)"
            )
        return ids

    def _tag_of(self, unit: int) -> tuple[Hashable, int] | None:
        """``owner_of`` of an id known to be in range."""
        w = self._who.get(self._tag[unit])
        if w is None:
            return None
        return w[0], unit - w[1] if w[1] >= 0 else self._piece[unit]

    # -- tagging runs ---------------------------------------------------------------------

    def _tag_runs(self, runs: list[tuple[int, int]], owner: Hashable) -> None:
        """Tag ``runs`` (piece order, at least one) as one new reservation of ``owner``.
        O(runs): one fill of the tag array per run, and with several runs one copy of the
        ramp's pieces per run."""
        h = self._next_handle
        self._next_handle = h + 1
        tag = self._tag
        one = array("q", (h,))
        if len(runs) == 1:
            a, c = runs[0]
            tag[a : a + c] = one * c
            self._who[h] = (owner, a)
            return
        self._who[h] = (owner, -1)
        pieces, ramp = self._piece, self._ramp
        piece = 0
        for a, c in runs:
            b = a + c
            tag[a:b] = one * c
            pieces[a:b] = ramp[piece : piece + c]
            piece += c

    def _untag_runs(self, runs: Sequence[tuple[int, int]]) -> None:
        """Forget the reservation holding ``runs`` (one whole reservation): its handle. O(1)."""
        if runs:
            self._who.pop(self._tag[runs[0][0]], None)

    def _holds_runs(self, runs: Sequence[tuple[int, int]], owner: Hashable) -> bool:
        """Whether ``runs`` (piece order) are exactly tagged ``(owner, piece)``, one live
        handle whose owner is ``owner`` (equal), checked run by run at C speed. O(runs)
        Python steps; for self-checks and the undo of a reservation."""
        if not runs:
            return True
        tag, pieces, ramp = self._tag, self._piece, self._ramp
        h = tag[runs[0][0]]
        w = self._who.get(h)
        if w is None or w[0] != owner:
            return False
        single = w[1] >= 0
        if single and (len(runs) != 1 or w[1] != runs[0][0]):
            return False
        piece = 0
        one = array("q", (h,))
        for a, c in runs:
            b = a + c
            if tag[a:b] != one * c:
                return False
            if not single and pieces[a:b] != ramp[piece : piece + c]:
                return False
            piece += c
        return True

    # -- the raw-unit contract (SPEC A.2) ----------------------------------------------

    def reserve_units(self, count: int, owner: Hashable) -> list[int] | None:
        """Reserve ``count`` units tagged ``(owner, piece)``, returned in piece order.

        Vacant units go first, lowest id first; then cached KV units, least recently cached
        first, each firing ``on_evict(prefix_hash)`` once the whole reservation is tagged
        (SPEC A.4). ``None``, with nothing changed, when fewer than ``count`` units are free;
        ``[]`` for ``count == 0``. O(runs log num_units + cached units taken) Python steps
        (SPEC A.5), plus the ``count`` ids of the list returned.

        Raises:
            InvalidArgumentError: ``count`` is not a non-negative int, or ``owner`` is None
                or unhashable.
            StoreOwnedUnitsError: ``owner`` is a store owner and the store is not calling.
            EvictionCallbackError: ``on_evict`` raised (after every callback ran); outside
                a ``deferred_evictions()`` block the reservation is undone first, so nothing
                changed (what the callbacks did is the engine's).
        """
        if type(count) is not int or count < 0:  # pragma: no mutate (need_int re-checks)
            need_int("count", count, 0)
        if owner is None:
            raise InvalidArgumentError("a reservation needs an owner, got None")
        self._need_owner("owner", owner)
        if self._held_by(owner):
            raise InvalidArgumentError(
                f"owner {owner!r} already holds units: one reservation per owner (G9)"
            )
        return self._reserve(count, owner)

    def _reserve(self, count: int, owner: Hashable) -> list[int] | None:
        """``reserve_units`` past its argument checks, as unit ids."""
        runs = self._reserve_runs(count, owner)
        if runs is None:
            return None
        return list(run_units(tuple(runs)))

    def _reserve_vacant_ckpt(self, count: int, cid: int) -> list[tuple[int, int]]:
        """``_reserve_runs(count, (CHECKPOINT_OWNER, cid))`` when at least ``count >= 1``
        units are vacant (the caller checked): the lowest vacant units, no cached unit
        taken, so no callback fires and there is nothing to undo. O(runs log n)."""
        runs: list[tuple[int, int]] = []
        self._ext.take(count, runs)
        self._tag_runs(runs, (CHECKPOINT_OWNER, cid))
        held = self._held_ckpt
        # equivalent mutants: a new checkpoint id holds nothing yet
        held[cid] = held.get(cid, 0) + count  # pragma: no mutate
        return runs

    def _reserve_runs(self, count: int, owner: Hashable) -> list[tuple[int, int]] | None:
        """``reserve_units`` past its argument checks, as maximal runs in piece order: the
        store's own path (its owners are well formed and its own to use). O(runs log n +
        cached units taken) Python steps (SPEC A.5)."""
        ext = self._ext
        cached = self._cached
        if ext.count + len(cached) < count:
            return None
        if count == 0:
            return []
        runs: list[tuple[int, int]] = []
        evicted: list[int] = []
        taken: list[int] = []
        drained: _Extents | None = None
        if ext.count >= count:  # pragma: no mutate (with exactly count vacant, the same units)
            ext.take(count, runs)
        else:
            # every vacant unit goes, lowest first; the index is kept as it was, for an undo
            # to put back (see _unreserve)
            drained = ext.detach()
            runs = drained.runs()
            for _ in range(count - drained.count):
                u, h = cached.popitem(last=False)  # pragma: no mutate (last=None is False)
                evicted.append(h)
                taken.append(u)
                if runs and runs[-1][0] + runs[-1][1] == u:
                    runs[-1] = (runs[-1][0], runs[-1][1] + 1)
                else:
                    runs.append((u, 1))
        # An undo is possible outside a deferral block and inside one that undoes on error
        # (the store's own block never does): only then is the undo record kept.
        undoable = (
            bool(evicted) and self.on_evict is not None and (not self._defer or self._defer_undo)
        )
        if undoable:
            # what the tags were, for an undo to put back exactly (SPEC G8)
            tag, pieces = self._tag, self._piece
            was = [(a, tag[a : a + c], pieces[a : a + c]) for a, c in runs]
        self._tag_runs(runs, owner)
        held, key = self._count_of(owner)  # _add_held(owner, count), inline (count > 0)
        held[key] = held.get(key, 0) + count
        if evicted and self.on_evict is not None:
            if self._defer:
                self._deferred.extend(evicted)
                if undoable:
                    self._undo.append((runs, owner, evicted, taken, drained, was))
            else:
                failed = self._fire(evicted)
                if failed is not None:
                    undo = (runs, owner, evicted, taken, drained, was)
                    raise _callback_error(failed, self._unreserve(undo)) from failed[1]
        return runs

    def release_units(self, unit_ids: Any, owner: Hashable) -> None:
        """Release a whole reservation, every unit in piece order (SPEC A.2, G9). The units
        go vacant; units of a checkpoint or transfer owner become dirty (G10). O(k) to
        check the ids, then O(runs log n) (SPEC A.5).

        Raises:
            InvalidArgumentError: ``unit_ids`` is not a list/tuple of non-negative ints, an
                id is outside ``[0, num_units)`` (G16: the message names the range), or
                ``owner`` is None or unhashable.
            DuplicateUnitError: an id repeats.
            StoreOwnedUnitsError: ``owner`` is a store owner and the store is not calling.
            WrongOwnerError: a unit is not tagged ``(owner, position)``.
            PartialReleaseError: the owner holds more units than named.
        """
        if self._is_whole(unit_ids, owner):  # pragma: no mutate (False: the checked path)
            self._release(unit_ids, owner)
        else:
            self._release(self._validate_whole(unit_ids, owner), owner)

    def _release(self, ids: tuple[int, ...] | list[int], owner: Hashable) -> None:
        """``release_units`` of a whole reservation already known to be ``owner``'s, in
        piece order, by unit ids."""
        self._release_runs(unit_runs(ids), owner)

    def _release_runs(self, runs: Sequence[tuple[int, int]], owner: Hashable) -> None:
        """Release a whole reservation already known to be ``owner``'s, given as its runs
        in piece order: the store's own path for its records. O(runs log n) Python steps
        (``_untag_runs`` and the dirty flags and index, inline: the store releases through
        here once per record)."""
        if not runs:
            return  # an empty reservation holds no count and no handle
        dirtying = isinstance(owner, tuple) and len(owner) == 2 and owner[0] in _STORE_KINDS
        held, key = self._count_of(owner)
        self._release_held(runs, dirtying, held, key)

    def _release_ckpt(self, runs: Sequence[tuple[int, int]], cid: int) -> None:
        """``_release_runs(runs, (CHECKPOINT_OWNER, cid))``: checkpoint ``cid``'s whole
        reservation (at least one run) going dirty, its count kept in ``_held_ckpt``."""
        self._release_held(runs, True, self._held_ckpt, cid)

    def _release_held(
        self,
        runs: Sequence[tuple[int, int]],
        dirtying: bool,
        held: dict[Hashable, int],
        key: Hashable,
    ) -> None:
        """``_release_runs`` past its owner's kind: ``runs`` (at least one) go vacant, and
        dirty when ``dirtying``; the owner's count is ``held[key]``."""
        del self._who[self._tag[runs[0][0]]]
        ext = self._ext
        start, end = ext.start, ext.end
        flags, index = self._dirtyf, self._dirty_runs
        n = 0
        for a, c in runs:
            b = a + c
            # ext.give(a, b), inline (one call per run saved on the store's release path)
            left = end.pop(a, None)
            right = start.pop(b, None)
            e = b
            if right is not None:
                del end[right]
                e = right
            if left is not None:
                start[left] = e
                end[e] = left
            else:
                start[a] = e
                end[e] = a
                heapq.heappush(ext.heap, a)
            # a run already flagged whole is already in the index (every flagged unit is):
            # it is neither flagged nor indexed again, so re-releasing dirty units (the
            # steady state of a pool that is not scrubbed) does not grow the index
            # equivalent mutants: a wider search re-flags a dirty run (indexed twice, pruned)
            if dirtying and flags.find(0, a, b) >= 0:  # pragma: no mutate
                flags[a:b] = _ONES[:c] if c <= _NUM_ONES else b"\x01" * c
                index.append((a, b))
            n += c
        ext.count += n
        if len(ext.heap) > 2 * len(start) + 64:  # pragma: no mutate (any bound keeps it O(1))
            ext.heap = sorted(start)  # a sorted list is a min-heap
        if dirtying and len(index) > self._dirty_prune_at:  # pragma: no mutate (speed only)
            self._prune_dirty()
        # equivalent mutants: a whole reservation is released, so left is 0
        left = held.get(key, 0) - n  # pragma: no mutate
        if left:
            held[key] = left  # pragma: no mutate
        else:
            held.pop(key, None)

    def _is_whole(self, unit_ids: Any, owner: Hashable) -> bool:
        """Fast check that ``unit_ids`` is exactly ``owner``'s whole reservation in piece
        order; False sends the caller to :meth:`_validate_whole`, which names what is
        wrong. O(k), one plain loop.

        Lines marked ``no mutate`` had equivalent mutants only among those that survived
        (docs/mutation.md): ones that answer False where True was right (the caller then
        validates, with the same outcome)."""
        if type(unit_ids) is not list and type(unit_ids) is not tuple:  # pragma: no mutate
            return False
        n = len(unit_ids)  # pragma: no mutate
        if owner is None:
            return False
        if (
            not self._store_calls
            and isinstance(owner, tuple)
            and len(owner) == 2
            and owner[0] in _STORE_KINDS
        ):
            return False  # refused by the slow path (StoreOwnedUnitsError)
        try:
            counts, key = self._count_of(owner)
            if counts.get(key, 0) != n:  # pragma: no mutate
                return False
        except Exception:  # unhashable, or a __hash__ that raises: the slow path names it
            return False
        tag, pieces, who = self._tag, self._piece, self._who
        size = self.num_units
        piece = 0  # pragma: no mutate
        # Every unit of one reservation carries its live handle; the handle's owner is the
        # named one: the same object, or an owner counted under the same kind and key. Two
        # owners of one type are that exactly when they are equal (an engine's owner rebuilt
        # for the call: one comparison); otherwise their counts say.
        handle = -1
        base = 0
        for u in unit_ids:
            if type(u) is not int or not 0 <= u < size:  # pragma: no mutate
                return False
            h = tag[u]
            if h != handle:
                w = who.get(h)
                if handle >= 0 or w is None:  # another reservation, or a free unit
                    return False
                held_by, base = w
                if held_by is not owner:
                    if type(held_by) is type(owner):
                        if held_by != owner:
                            return False
                    elif not self._counted_as(held_by, counts, key):
                        return False
                handle = h
            if (u - base if base >= 0 else pieces[u]) != piece:
                return False
            piece += 1  # pragma: no mutate
        return True  # pragma: no mutate

    def rekey_units(self, unit_ids: Any, old_owner: Hashable, new_owner: Hashable) -> None:
        """Retag a whole reservation from ``old_owner`` to ``new_owner`` atomically; the units
        never pass through the free list (SPEC A.2). O(k) to check the ids, then O(1): the
        reservation's handle gets the new owner.

        Raises:
            InvalidArgumentError: ``new_owner`` is None, unhashable or already holds units;
                malformed ids, or an id outside ``[0, num_units)`` (G16).
            StoreOwnedUnitsError: either owner is a store owner and the store is not calling.
            DuplicateUnitError, WrongOwnerError, PartialReleaseError: as ``release_units``.
        """
        if new_owner is None:
            raise InvalidArgumentError("new_owner must not be None")
        ids = self._validate_whole(unit_ids, old_owner)
        self._need_owner("new_owner", new_owner)
        if self._held_by(new_owner) > 0:
            raise InvalidArgumentError(f"owner {new_owner!r} already holds units")
        if ids:
            h = self._tag[ids[0]]
            self._who[h] = (new_owner, self._who[h][1])
        self._add_held(old_owner, -len(ids))
        self._add_held(new_owner, len(ids))


class _StoreAccess:
    """``UnitPool._as_store()``: the store is calling; store owners are accepted."""

    __slots__ = ("_pool",)

    def __init__(self, pool: UnitPool) -> None:
        self._pool = pool

    def __enter__(self) -> None:
        self._pool._store_calls += 1

    def __exit__(self, *exc: object) -> None:
        self._pool._store_calls -= 1


class SlotPool:
    """A state-slot pool for midstep scratch (SPEC D.1 step 4): hands out the lowest free
    slot, like the reference model's. O(log n) per call.

    Args:
        slots: the slot indices this pool lends (distinct, mutually comparable).
    """

    def __init__(self, slots: Iterable[int]) -> None:
        self._all = frozenset(need_slots(slots))
        self._free: set[int] = set(self._all)
        self._heap: list[int] = sorted(self._all)

    def clone(self) -> SlotPool:
        """A deep copy. O(slots)."""
        c = SlotPool.__new__(SlotPool)
        c._all = self._all
        c._free = set(self._free)
        c._heap = list(self._heap)
        return c

    def has_free(self) -> bool:
        """Whether a slot can be borrowed. O(1)."""
        return bool(self._free)

    def pop(self) -> int:
        """Borrow the lowest free slot.

        Raises:
            InvalidArgumentError: no slot is free.
        """
        if not self._free:
            raise InvalidArgumentError("no free scratch slot")
        s = heapq.heappop(self._heap)
        self._free.discard(s)
        return s

    def release(self, slot: int) -> None:
        """Return a borrowed slot.

        Raises:
            InvalidArgumentError: ``slot`` is not one of this pool's borrowed slots.
        """
        if slot not in self._all or slot in self._free:
            raise InvalidArgumentError(f"slot {slot} is not a borrowed scratch slot")
        self._free.add(slot)
        heapq.heappush(self._heap, slot)

    @property
    def free_slots(self) -> frozenset[int]:
        """The slots not borrowed now. O(slots)."""
        return frozenset(self._free)
