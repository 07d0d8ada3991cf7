"""The production pool's dirty units (SPEC G10): a flag per unit, for ``is_dirty`` in O(1),
set run by run at C speed when a checkpoint's or a transfer's units are released, and an
index of the runs that were flagged, so that ``dirty_units`` walks the dirty runs, not the
pool. Every flagged unit is in the index, so a run released with all its units flagged
already is not indexed again. The index is a superset (its runs may overlap and hold
scrubbed units), pruned to the maximal runs of flagged units when walked and when it has
grown by a fraction of what it covers. A mixin of :class:`~.pool.UnitPool`."""

from __future__ import annotations

import re
from collections.abc import Iterable

from pagedstate.spec.errors import InvalidArgumentError

from ._pool_base import _PoolBase

#: A stretch of dirty flags (one a unit), one flag, and the flags of a fresh dirty run.
_ONES_RUN = re.compile(b"\x01+")
_ONE = re.compile(b"\x01")
_NUM_ONES = 4096
_ONES = memoryview(b"\x01" * _NUM_ONES)


class _Dirty(_PoolBase):
    """Dirty flags and the dirty-run index (SPEC G10)."""

    def is_dirty(self, unit: int) -> bool:
        """Whether ``unit`` last held checkpoint or transfer bytes and was not scrubbed
        since (G10). O(1).

        Raises:
            InvalidArgumentError: ``unit`` is not an int in ``[0, num_units)``.
        """
        self._need_unit(unit)
        return bool(self._dirtyf[unit])

    def dirty_units(self) -> frozenset[int]:
        """Every dirty unit. O(dirty runs + dirty units), not O(num_units)."""
        self._prune_dirty()
        flags = self._dirtyf
        out: set[int] = set()
        for a, b in self._dirty_runs:
            out.update(m.start() for m in _ONE.finditer(flags, a, b))
        return frozenset(out)

    def _prune_dirty(self) -> None:
        """Rebuild the dirty-run index as the maximal runs of flagged units inside it (its
        runs may overlap and hold scrubbed units). O(index runs log + their units at C
        speed); the next prune waits until the index has doubled (amortized O(1) a run)."""
        index = self._dirty_runs
        if not index:
            return
        flags = self._dirtyf
        merged: list[tuple[int, int]] = []
        for a, b in sorted(index):
            if merged and a <= merged[-1][1]:
                if b > merged[-1][1]:
                    merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        out: list[tuple[int, int]] = []
        for a, b in merged:
            out.extend(m.span() for m in _ONES_RUN.finditer(flags, a, b))
        self._dirty_runs = out
        # the next prune scans about as many units again: wait for 1/64 of them in new runs
        covered = sum(b - a for a, b in out)
        self._dirty_prune_at = max(1024, 2 * len(out), covered // 64)

    def mark_clean(self, unit_ids: Iterable[int]) -> None:
        """Record that the executor scrubbed these units (G10). O(k).

        Raises:
            InvalidArgumentError: ``unit_ids`` is not iterable, or an id is not an int in
                ``[0, num_units)``.
        """
        try:
            ids = list(unit_ids)
        except TypeError as exc:
            raise InvalidArgumentError(
                f"unit_ids must be an iterable of unit ids, got {unit_ids!r}"
            ) from exc
        for u in ids:
            self._need_unit(u)
        flags = self._dirtyf
        for u in ids:
            flags[u] = 0
