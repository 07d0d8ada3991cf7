"""The production pool's ``self_check``: its own indexes (the vacant heap, the cached LRU,
the per-owner counts, the reservation handles, the dirty index, the deferral state) checked
against the unit tags, for tests and the conformance kit. A mixin of :class:`~.pool.UnitPool`."""

from __future__ import annotations

from collections.abc import Hashable

from ._pool_base import _PoolBase


class _Checks(_PoolBase):
    """The pool's self-check."""

    def self_check(self) -> list[str]:
        """Problems with the pool's own indexes, as sentences (empty: none): what the
        snapshot does not show, checked against the unit tags. Between calls, every untagged
        unit is in exactly one of the vacant extents and the cached LRU, and no tagged one
        is; the extents are maximal, indexed both ways and on the heap, which keeps its
        order; a unit is free exactly when its tag's handle is not live, and no tag or live
        handle is one not yet handed out; each owner holds one reservation, its count is the
        number of units tagged with it, and its pieces are ``0..count-1``; every dirty unit
        is in the dirty index; no deferral is open. For tests and the conformance kit (its
        ``self_check`` hook). Never raises. O(num_units).
        """
        out: list[str] = []
        tag, pieces, who = self._tag, self._piece, self._who
        ext = self._ext
        out.extend(ext.problems())
        vacant = ext.units()
        free = {u for u, h in enumerate(tag) if h not in who}
        in_vacant, in_cached = set(vacant), set(self._cached)
        if in_vacant & in_cached:
            out.append(f"units both vacant and cached: {sorted(in_vacant & in_cached)}")
        if in_vacant | in_cached != free:
            out.append(
                f"free units {sorted(free)} but vacant + cached {sorted(in_vacant | in_cached)}"
            )
        if any(h >= self._next_handle or h < 0 for h in tag) or any(
            h <= 0 or h >= self._next_handle for h in who
        ):
            out.append("a tag carries a handle not yet handed out")
        seen: dict[int, dict[Hashable, list[int]]] = {}
        by_handle: dict[int, dict[Hashable, int]] = {}
        tagged_handles: set[int] = set()
        for u, h in enumerate(tag):
            w = who.get(h)
            if w is None:
                continue
            tagged_handles.add(h)
            o, base = w
            counts, key = self._count_of(o)
            prev = by_handle.setdefault(id(counts), {}).setdefault(key, h)
            if prev != h:
                out.append(f"owner {key!r} holds two reservations")
            seen.setdefault(id(counts), {}).setdefault(key, []).append(
                u - base if base >= 0 else pieces[u]
            )
        if tagged_handles != set(who):
            out.append("a live reservation handle tags no unit")
        for counts in (self._held, self._held_ckpt, self._held_xfer):
            tagged = seen.get(id(counts), {})
            if dict(counts) != {k: len(v) for k, v in tagged.items()}:
                out.append("an owner's unit count is not the number of units tagged with it")
            for key, got in tagged.items():
                if sorted(got) != list(range(len(got))):
                    out.append(f"owner {key!r}'s pieces are {sorted(got)}, not 0..{len(got) - 1}")
        flagged = {u for u, f in enumerate(self._dirtyf) if f}
        indexed: set[int] = set()
        for a, b in self._dirty_runs:
            indexed.update(range(a, b))
        if not flagged <= indexed:
            out.append(f"dirty units {sorted(flagged - indexed)} are missing from the dirty index")
        if any(f not in (0, 1) for f in self._dirtyf):
            out.append("a dirty flag is neither 0 nor 1")
        if self._defer or self._deferred or self._undo or self._defer_undo:
            out.append("a deferral is still open between calls")
        return out
