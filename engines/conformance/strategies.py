"""Hypothesis strategies the rules draw from: values sized by the running machine's
:class:`~.config.ConformanceConfig` (printed as plain values) and values drawn from the
reference's current state (known hashes, READY hashes, busy slots)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from .config import ConformanceConfig, T

if TYPE_CHECKING:
    from .machine import ConformanceMachine

# ---------------------------------------------------------------------------------------
# Strategies that read the machine's configuration (printed as plain values)
# ---------------------------------------------------------------------------------------


@functools.cache
def _cached(fn: Callable[[ConformanceConfig], st.SearchStrategy[Any]], c: ConformanceConfig) -> Any:
    return fn(c)


def _cfg(fn: Callable[[ConformanceConfig], st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """A strategy built from the running machine's :class:`ConformanceConfig`."""
    return st.runner().flatmap(lambda m: _cached(fn, m.config))


def _hashes(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(1, c.hashes)


def _seq_index(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(0, c.seqs + 1)


def _regular_seq_index(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(0, c.seqs - 1)


def _slots(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(0, c.seqs)


def _restore_slots(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.sampled_from(c.restore_slots)


def _kv_units(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(1, c.kv_max_units)


def _counts(c: ConformanceConfig) -> st.SearchStrategy[int]:
    return st.integers(0, c.units + 1)


def _positions(c: ConformanceConfig) -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.lists(st.tuples(st.integers(0, 64), st.integers(1, c.hashes)), min_size=1, max_size=2)


def _block_hashes(c: ConformanceConfig) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, c.hashes), max_size=4)


H = _cfg(_hashes)
SEQ = _cfg(_seq_index)
REG_SEQ = _cfg(_regular_seq_index)
SLOT = _cfg(_slots)
#: A slot a restore may be aimed at (:attr:`~.config.ConformanceConfig.restore_slots`).
RESTORE_SLOT = _cfg(_restore_slots)


def _known_hash(m: ConformanceMachine) -> st.SearchStrategy[int]:
    snap = m.snap_ref
    known = sorted(
        {r.prefix_hash for r in snap.records.values()}
        | {h for _, h in snap.pending_boundaries}
        | {h for h, _ in snap.scratch_queued}
    )
    every = _cached(_hashes, m.config)
    return st.one_of(st.sampled_from(known), every) if known else every


def _ready_hash(m: ConformanceMachine) -> st.SearchStrategy[int]:
    ready = sorted(m.snap_ref.index)
    every = _cached(_hashes, m.config)
    return st.one_of(st.sampled_from(ready), every) if ready else every


def _any_busy_slot(m: ConformanceMachine) -> st.SearchStrategy[int]:
    snap = m.snap_ref
    busy = sorted(
        {d for _, d in snap.queued_restores}
        | {d for _, d in snap.inflight_restores}
        | {d for _, _, d in snap.suspended}
    )
    every = _cached(_slots, m.config)
    return st.one_of(st.sampled_from(busy), every) if busy else every


def _busy_slot(m: ConformanceMachine) -> st.SearchStrategy[int]:
    snap = m.snap_ref
    busy = sorted({d for _, d in snap.queued_restores})
    every = _cached(_slots, m.config)
    return st.one_of(st.sampled_from(busy), every) if busy else every


def _lent_slot(m: ConformanceMachine) -> st.SearchStrategy[int]:
    snap = m.snap_ref
    lent = sorted(
        set(snap.scratch_reserved)
        | {slot for _, slot in snap.scratch_queued}
        | set(snap.scratch_issued)
    )
    every = _cached(_restore_slots, m.config)
    return st.one_of(st.sampled_from(lent), every) if lent else every


#: A hash: one the store or a pending boundary knows, or any hash (state-drawn).
KNOWN_H: st.SearchStrategy[int] = st.runner().flatmap(_known_hash)
#: A hash: one with a READY image, or any hash (state-drawn).
READY_H: st.SearchStrategy[int] = st.runner().flatmap(_ready_hash)
#: A slot: one with a queued restore, or any slot (state-drawn).
BUSY_SLOT: st.SearchStrategy[int] = st.runner().flatmap(_busy_slot)
#: A slot: one with a queued, in-flight or suspended restore, or any slot (state-drawn).
ANY_BUSY_SLOT: st.SearchStrategy[int] = st.runner().flatmap(_any_busy_slot)
#: A slot: one lent as midstep scratch (reserved, queued or issued), or any slot a restore
#: may be aimed at (state-drawn).
LENT_SLOT: st.SearchStrategy[int] = st.runner().flatmap(_lent_slot)


def _index_into(attr: str) -> st.SearchStrategy[int]:
    """An index into the machine's list ``attr`` (guard the rule with a precondition)."""
    return st.runner().flatmap(lambda m: st.integers(0, max(0, len(getattr(m, attr)) - 1)))
