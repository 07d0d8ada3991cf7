"""The production pool's ``self_check``: its own indexes (the vacant heap, the cached LRU,
the per-owner counts, the deferral state) checked against the unit tags, for tests and the
conformance kit. A mixin of :class:`~.pool.UnitPool`."""

from __future__ import annotations

from collections.abc import Hashable

from ._pool_base import _PoolBase


class _Checks(_PoolBase):
    """The pool's self-check."""

    def self_check(self) -> list[str]:
        """Problems with the pool's own indexes, as sentences (empty: none): what the
        snapshot does not show, checked against the unit tags. Between calls, every untagged
        unit is in exactly one of the vacant min-heap and the cached LRU, and no tagged one
        is; the heap keeps its order; free units carry piece 0; each owner's count is the
        number of units tagged with it, and its pieces are ``0..count-1``; no deferral is
        open. For tests and the conformance kit (its ``self_check`` hook). Never raises.
        O(num_units).
        """
        out: list[str] = []
        owners, pieces = self._owners, self._pieces
        vacant = self._vacant
        if len(set(vacant)) != len(vacant):
            out.append("the vacant heap holds a unit twice")
        if any(vacant[(i - 1) // 2] > vacant[i] for i in range(1, len(vacant))):
            out.append("the vacant heap is out of order")
        free = {u for u, o in enumerate(owners) if o is None}
        in_vacant, in_cached = set(vacant), set(self._cached)
        if in_vacant & in_cached:
            out.append(f"units both vacant and cached: {sorted(in_vacant & in_cached)}")
        if in_vacant | in_cached != free:
            out.append(
                f"free units {sorted(free)} but vacant + cached {sorted(in_vacant | in_cached)}"
            )
        if any(pieces[u] for u in free):
            out.append("a free unit carries a piece")
        seen: dict[int, dict[Hashable, list[int]]] = {}
        for u, o in enumerate(owners):
            if o is not None:
                counts, key = self._count_of(o)
                seen.setdefault(id(counts), {}).setdefault(key, []).append(pieces[u])
        for counts in (self._held, self._held_ckpt, self._held_xfer):
            tagged = seen.get(id(counts), {})
            if dict(counts) != {k: len(v) for k, v in tagged.items()}:
                out.append("an owner's unit count is not the number of units tagged with it")
            for key, got in tagged.items():
                if sorted(got) != list(range(len(got))):
                    out.append(f"owner {key!r}'s pieces are {sorted(got)}, not 0..{len(got) - 1}")
        if self._defer or self._deferred or self._undo:
            out.append("a deferral is still open between calls")
        return out
