"""The canonical key of a :class:`~pagedstate.models.world.World` (what the explorer's
visited set holds): hashes relabelled by first appearance, ids and counters abstracted, and
with symmetry the sequences renamed (:meth:`World.key <pagedstate.models.world.World.key>`,
:meth:`World.symmetric_key <pagedstate.models.world.World.symmetric_key>`). Written for
speed: it runs once per generated state."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from pagedstate.spec.types import CHECKPOINT_OWNER, TRANSFER_OWNER

from .reference import UnitPool

if TYPE_CHECKING:
    from .world import World

__all__: list[str] = []


def _key(w: World, perm: tuple[int, ...] | None = None) -> tuple[Any, ...]:
    """:meth:`World.key`, with the sequences renamed by ``perm`` (index i -> perm[i], and
    with them their slots: sequence i has slot i) when given."""
    base, variants = _key_parts(w, (perm,))
    return base + variants[0]


def _key_parts(
    w: World, perms: tuple[tuple[int, ...] | None, ...]
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    # Written for speed: it runs once per generated state. The key is ``base`` (what does
    # not name a sequence or a slot) plus, for each permutation of ``perms`` (None: the
    # identity), the parts that do, renamed. Hashes are relabelled in one traversal: the
    # renamed parts visit them in the same order for every permutation.
    coord = w.coord
    store = coord.store
    records = store.records
    hmap: dict[int, int] = {}
    omap: dict[Hashable, int] = {}
    first: dict[int, int] = {}
    units: list[Any] = []
    append = units.append
    pool = store.pool
    # The reference pool's tags directly (its owner_of validates every unit id); another
    # pool (the production one, a mutant's) through its owner_of.
    owner_of = pool._tags.get if type(pool) is UnitPool else pool.owner_of
    for u in range(pool.num_units):
        tag = owner_of(u)
        if tag is None:
            append(None)
            continue
        owner, piece = tag
        kind = owner[0] if type(owner) is tuple else None
        if kind == CHECKPOINT_OWNER:
            if piece:
                append(piece)
                continue
            cid = owner[1]  # type: ignore[index]
            rec = records.get(cid)
            if rec is None:
                append(-1)
                continue
            first[cid] = u
            h = rec.prefix_hash
            v = hmap.get(h)
            if v is None:
                v = hmap[h] = len(hmap)
            append((v, rec.phase, rec.pin_count, rec.settled))
        else:
            o = owner[1] if kind == TRANSFER_OWNER else owner  # type: ignore[index]
            v = omap.get(o)
            if v is None:
                v = omap[o] = len(omap)
            append((kind == TRANSFER_OWNER, v, piece))

    def ch(h: int) -> int:
        v = hmap.get(h)
        if v is None:
            v = hmap[h] = len(hmap)
        return v

    def co(owner: Hashable) -> int:
        v = omap.get(owner)
        if v is None:
            v = omap[owner] = len(omap)
        return v

    fget = first.get
    parts: list[Any] = [tuple(units)]
    # The index and pending maps name live records; a record's first unit determines its
    # hash, so only the membership needs recording.
    parts.append(tuple(sorted(fget(c, -1) for c in store.hash_to_checkpoint.values())))
    parts.append(tuple(sorted(fget(c, -1) for c in store._pending_by_hash.values())))
    parts.append(tuple([fget(c, -1) for c in store._lru]))
    parts.append(tuple([fget(c, -1) for c in store._inflight_stores]))
    parts.append(store._offload_sink)
    parts.append(tuple([fget(c, -1) for c in store._offload_ready]))
    ops = store._offload_pins
    if ops or w.ops:
        # Operation generations matter only relative to each other (they link the
        # environment's handles to the store's pins).
        gens = sorted({op.generation for op in ops} | {op.generation for op in w.ops})
        grank = {g: i for i, g in enumerate(gens)}
        limit = w.clock.now - w.config.timeout_s
        parts.append(
            tuple(
                sorted(
                    (
                        ch(op.prefix_hash),
                        grank[op.generation],
                        fget(p.checkpoint_id, -1),
                        p.source_released,
                        p.reclaimable,
                        p.pinned_at <= limit,
                    )
                    for op, p in ops.items()
                )
            )
        )
        parts.append(tuple([(ch(op.prefix_hash), grank[op.generation]) for op in w.ops]))
    else:
        parts.append(None)
    tr = coord._transfer_units
    parts.append(tuple(sorted((co(o), u[0]) for o, u in tr.items())) if tr else ())
    parts.append(tuple(sorted(coord._scratch_reserved)))
    parts.append(tuple([(ch(h), slot) for h, slot in coord._scratch_queued]))
    parts.append(tuple(coord._scratch_issued))
    # The environment.
    parts.append(tuple(sorted(w.kv_held)))
    parts.append(w.spent_lease is not None)
    parts.append(w.stale_op is not None)
    parts.append(tuple([co(o) for o in w.owners]))
    parts.append(w.stale_owner is not None)
    parts.append(tuple([(slot, ch(h)) for slot, _pos, h in w.scratch_res]))
    parts.append(w.in_flight_units)
    parts.append(w.alarms)
    cfg = w.config
    if cfg.completions:
        # Completion tokens: done or not, and the records each lists (D.13).
        comps: list[tuple[Any, list[int]]] = store._completions
        parts.append(
            tuple([(t.done, tuple([fget(c, -1) for c in cids])) for t, cids in comps])
            if comps
            else ()
        )
        parts.append(
            tuple([tuple([fget(c, -1) for c in cids]) for _t, cids in w.tokens]) if w.tokens else ()
        )
    # The parts that name sequences or slots, once per permutation.
    queued = store._queued_restores
    inflight = store._inflight_restores
    sus = store._suspended
    pend = coord._pending
    leases = w.leases
    variants = []
    for perm in perms:
        if perm is None:
            ps = _same
        else:

            def ps(x: int, perm: tuple[int, ...] = perm) -> int:
                return perm[x] if 0 <= x < len(perm) else x

        var = (
            tuple([(fget(c, -1), ps(op.dst_slot)) for c, op in queued]) if queued else (),
            tuple([(fget(c, -1), ps(op.dst_slot)) for c, op in inflight]) if inflight else (),
            tuple(sorted((fget(c, -1), ps(op.dst_slot)) for c, op in sus.values())) if sus else (),
            tuple([(ps(s.index), ch(h)) for s, h in pend.values()]) if pend else (),  # type: ignore[attr-defined]
            tuple([(fget(x.checkpoint_id, -1), ps(x.op.dst_slot)) for x in leases]),
            _forward_key(w, ch, ps) if cfg.forwards else None,
        )
        variants.append(var)
    return tuple(parts), variants


#: seqs -> its permutations but the identity (filled on first use).
_PERMS: dict[int, tuple[tuple[int, ...], ...]] = {}


def _same(x: int) -> int:
    return x


def _forward_key(
    w: World, ch: Callable[[int], int], ps: Callable[[int], int] = _same
) -> tuple[Any, ...]:
    """The overlap style's part of the key. Forward ids grow without bound, so they are
    kept relative to the latest drain's (``last_forward``), and clamped where no later call
    can tell them apart: a pending boundary named for an earlier forward is dropped at the
    next drain whatever it names (``-1``), a queued scratch store named for a forward
    already drained is issuable at every later drain (``0``). Read off the snapshot, so it
    holds for any store."""
    snap = w.coord.snapshot()
    last = snap.last_forward
    base = -1 if last is None else last
    index: dict[Hashable, int] = {id(s): ps(s.index) for s in w.seqs}
    return (
        last is None,
        tuple([(index.get(k, -1), max(f - base, -1)) for k, f in snap.boundary_forwards]),
        tuple([(slot, max(f - base, 0)) for slot, f in snap.scratch_forwards]),
        tuple([(index.get(k, -1), ps(slot)) for k, slot in snap.restore_owners]),
        tuple(sorted((ps(s), ch(h), max(f - base, -1)) for s, (h, f) in w.filed.items())),
        tuple(sorted((slot, max(f - base, 0)) for slot, f in w.published.items())),
        tuple(sorted((ps(s), ps(x)) for s, x in w.owned.items())),
    )
