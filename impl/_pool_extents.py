"""The production pool's vacant units as free extents (SPEC A.5), and the per-unit fills.

:class:`_Extents` holds the vacant units as maximal half-open extents ``[start, end)``,
indexed both ways (``start -> end`` and ``end -> start``) so that a released run merges with
its neighbours in O(1), and a min-heap of extent starts, so that a reservation takes the
lowest vacant ids first: exactly the units the reference pool's lowest-free-id rule gives
(SPEC A.2), as the fewest runs that rule allows. The heap is lazy: a start whose extent was
taken or merged away stays in it until it reaches the top and is dropped there (every live
start has an entry; the heap is rebuilt from the live starts when stale entries outnumber
them). Each call is O(runs log n) Python steps, independent of the units per run.

:func:`_zeros` makes the pool's per-unit piece array (:data:`TAG_TYPECODE`).
"""

from __future__ import annotations

import heapq
from array import array

__all__ = ["TAG_TYPECODE", "_Extents", "_zeros"]

#: The element of the pool's per-unit pieces and of its ramp (each below ``num_units``): a
#: C int (32 bits). The tags are int64.
TAG_TYPECODE = "i"
_WIDTH = array(TAG_TYPECODE).itemsize


def _zeros(n: int) -> array[int]:
    """An array of ``n`` zeros (:data:`TAG_TYPECODE`)."""
    return array(TAG_TYPECODE, bytes(_WIDTH * n))


class _Extents:
    """The vacant units of a pool as maximal extents (see the module docstring).

    Attributes:
        start: ``start -> end`` of every extent (half-open; no two extents touch).
        end: ``end -> start`` of every extent.
        heap: a min-heap holding every live start, and possibly stale ones.
        count: vacant units in all.
    """

    __slots__ = ("start", "end", "heap", "count")

    def __init__(self, num_units: int) -> None:
        self.start: dict[int, int] = {0: num_units} if num_units else {}
        self.end: dict[int, int] = {num_units: 0} if num_units else {}
        self.heap: list[int] = [0] if num_units else []
        self.count = num_units

    def __eq__(self, other: object) -> bool:
        """Equal structure, orders included (SPEC G8's comparisons see every index)."""
        if type(other) is not _Extents:
            return NotImplemented
        return (
            list(self.start.items()) == list(other.start.items())
            and list(self.end.items()) == list(other.end.items())
            and self.heap == other.heap
            and self.count == other.count
        )

    __hash__ = None  # type: ignore[assignment]

    def clone(self) -> _Extents:
        """A copy sharing nothing mutable. O(extents)."""
        c = _Extents.__new__(_Extents)
        c.start = dict(self.start)
        c.end = dict(self.end)
        c.heap = list(self.heap)
        c.count = self.count
        return c

    def take(self, k: int, runs: list[tuple[int, int]]) -> None:
        """Take the ``k`` lowest vacant units (``0 < k <= count``), appending them to
        ``runs`` as ``(first, count)`` runs, ascending (maximal: extents never touch)."""
        start, end, heap = self.start, self.end, self.heap
        self.count -= k
        while k:
            s = heap[0]
            e = start.get(s)
            if e is None:  # stale: its extent was taken or merged into a lower one
                heapq.heappop(heap)
                continue
            n = e - s
            if n <= k:
                heapq.heappop(heap)
                del start[s]
                del end[e]
                runs.append((s, n))
                k -= n
            else:
                m = s + k
                del start[s]
                start[m] = e
                end[e] = m
                heapq.heapreplace(heap, m)
                runs.append((s, k))
                return

    def give(self, a: int, b: int) -> None:
        """Make the units ``[a, b)`` vacant (none of them is), merging with the extents
        that end at ``a`` or start at ``b``."""
        start, end = self.start, self.end
        self.count += b - a
        left = end.pop(a, None)
        right = start.pop(b, None)
        if right is not None:
            del end[right]
            b = right
        if left is not None:
            start[left] = b
            end[b] = left
        else:
            start[a] = b
            end[b] = a
            heap = self.heap
            heapq.heappush(heap, a)
            if len(heap) > 2 * len(start) + 64:  # pragma: no mutate (any bound keeps it O(1))
                self.heap = sorted(start)  # a sorted list is a min-heap

    def detach(self) -> _Extents:
        """Empty this index, returning its former contents as a new object (what undoes a
        reservation that took every vacant unit puts back, as it was). O(1)."""
        old = _Extents.__new__(_Extents)
        old.start, old.end, old.heap, old.count = self.start, self.end, self.heap, self.count
        self.start, self.end, self.heap, self.count = {}, {}, [], 0
        return old

    def attach(self, old: _Extents) -> None:
        """Take back what :meth:`detach` returned (this index must be empty). O(1)."""
        self.start, self.end, self.heap, self.count = old.start, old.end, old.heap, old.count

    def runs(self) -> list[tuple[int, int]]:
        """Every extent as ``(first, count)``, ascending. O(extents log extents)."""
        return [(s, e - s) for s, e in sorted(self.start.items())]

    def units(self) -> list[int]:
        """Every vacant unit, ascending. O(vacant)."""
        out: list[int] = []
        for s, e in sorted(self.start.items()):
            out.extend(range(s, e))
        return out

    def problems(self) -> list[str]:
        """What is wrong with the index, as sentences (empty: nothing). O(extents)."""
        out: list[str] = []
        start, end = self.start, self.end
        if {e: s for s, e in start.items()} != end:
            out.append("the vacant extents' two indexes disagree")
        if any(e <= s for s, e in start.items()):
            out.append("a vacant extent is empty or reversed")
        prev = -1
        for s, e in sorted(start.items()):
            if s <= prev:
                out.append(f"vacant extents touch or overlap at {s}")
            prev = e
        if not set(start) <= set(self.heap):
            out.append("a vacant extent's start is missing from the heap")
        h = self.heap
        if any(h[(i - 1) // 2] > h[i] for i in range(1, len(h))):
            out.append("the vacant heap is out of order")
        if sum(e - s for s, e in start.items()) != self.count:
            out.append("the vacant count is not the extents' total")
        return out
