"""The production store's whole-state readers: :meth:`clone` (a deep copy), :meth:`snapshot`
(everything observable, as the spec's :class:`~pagedstate.spec.snapshot.Snapshot`) and
:meth:`self_check` (its own indexes checked against the records, for tests and the
conformance kit). A mixin of :class:`~.store.PageUnitCheckpointStore`."""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Self

from pagedstate.spec import tables as T
from pagedstate.spec.snapshot import OffloadPinView, RecordView, Snapshot
from pagedstate.spec.types import CHECKPOINT_OWNER

from ._store_base import _StoreBase
from .pool import UnitPool

_READY = T.READY
_COPYING = T.COPYING
_EVICTING = T.EVICTING


class _Views(_StoreBase):
    """Copying, snapshot and self-check of the store."""

    # -- copying ------------------------------------------------------------------------

    def clone(self, pool: UnitPool | None = None) -> Self:
        """A deep copy sharing nothing mutable (the clock, row sink and transition hook are
        shared, and so are the completion tokens); over ``pool`` if given, else over a clone
        of this store's pool. O(state)."""
        c = type(self).__new__(type(self))
        c.__dict__.update(self.__dict__)
        c.pool = pool if pool is not None else self.pool.clone()
        c.records = {k: r.copy() for k, r in self.records.items()}
        c.hash_to_checkpoint = dict(self.hash_to_checkpoint)
        c._pending_by_hash = dict(self._pending_by_hash)
        c._lru = OrderedDict(self._lru)
        c._victims = list(self._victims)
        c._inflight_stores = list(self._inflight_stores)
        c._queued_restores = dict(self._queued_restores)
        c._inflight_restores = list(self._inflight_restores)
        c._inflight_slots = set(self._inflight_slots)
        c._suspended = dict(self._suspended)
        c._suspended_slots = dict(self._suspended_slots)
        c._changes = deque(self._changes, maxlen=self._change_log_size)
        c._offload_ready = deque(self._offload_ready)
        c._offload_pins = {k: p.copy() for k, p in self._offload_pins.items()}
        c._op_hashes = set(self._op_hashes)
        c._reclaimable = OrderedDict(self._reclaimable)
        c._forfeited = dict(self._forfeited)
        c._forfeit_heap = list(self._forfeit_heap)
        # completion tokens are shared objects; their lists are copied (SPEC D.13)
        c._completions = [(token, list(cids)) for token, cids in self._completions]
        return c

    # -- self-check -----------------------------------------------------------------------

    def self_check(self) -> list[str]:
        """Problems with the store's own indexes, as sentences (empty: none): what the
        snapshot does not show, checked against the records. The hash index names READY
        records and the pending map COPYING ones, under their own hashes; the LRU holds
        exactly the READY records; the evictable count is the number of unpinned READY
        records, and the victim heap holds each one's current stamp; restore slots are in
        one place each; the offload indexes match the offload operations; the settled flags
        match the outstanding completions (a record whose store is in flight, COPYING or
        EVICTING, is unsettled and unlisted; a published one is unsettled exactly when one
        token lists it; no token lists nothing; each token has ``query`` and
        ``synchronize``, SPEC D.13); every record's
        units are tagged with it in the pool (a production pool's own :meth:`UnitPool.
        self_check` too). For tests and the conformance kit (its ``self_check`` hook).
        Never raises. O(state + num_units)."""
        out: list[str] = []
        records = self.records
        for index, phase in ((self.hash_to_checkpoint, _READY), (self._pending_by_hash, _COPYING)):
            for h, cid in index.items():
                rec = records.get(cid)
                if rec is None or rec.phase != phase or rec.prefix_hash != h:
                    out.append(f"the {phase} index maps {h} to {cid}, which is not {phase} {h}")
        ready = {cid for cid, r in records.items() if r.phase == _READY}
        if set(self._lru) != ready:
            out.append(f"the LRU holds {sorted(self._lru)}, the READY records are {sorted(ready)}")
        evictable = [cid for cid in ready if records[cid].pin_count == 0]
        if self._num_evictable != len(evictable):
            out.append(f"the evictable count is {self._num_evictable}, not {len(evictable)}")
        heap = self._victims
        if any(heap[(i - 1) // 2] > heap[i] for i in range(1, len(heap))):
            out.append("the victim heap is out of order")
        stamps = set(heap)
        lost = [cid for cid in evictable if records[cid].stamp not in stamps]
        if lost:
            out.append(f"evictable records missing from the victim heap: {sorted(lost)}")
        queued, inflight = set(self._queued_restores), self._inflight_slots
        suspended = set(self._suspended_slots)
        if queued & inflight or queued & suspended or inflight & suspended:
            out.append("a slot has restores in two places (G4)")
        if inflight != {op.dst_slot for _, op in self._inflight_restores}:
            out.append("the in-flight slot set does not match the in-flight restores")
        pins = self._offload_pins
        if self._op_hashes != {op.prefix_hash for op in pins}:
            out.append("the hashes with an offload operation do not match the operations")
        if set(self._reclaimable) != {op for op, pin in pins.items() if pin.reclaimable}:
            out.append("the reclaimable set does not match the operations")
        if len(self._forfeited) > self._forfeit_bound or not set(self._forfeited) <= {
            op for _, op in self._forfeit_heap
        }:
            out.append("the forfeit memory exceeds its bound or its heap")
        out += self._check_completions()
        pool = self.pool
        if type(pool) is UnitPool:
            for cid, rec in records.items():
                runs = rec.runs
                if sum(c for _, c in runs) != self._units or any(
                    a + c == b for (a, c), (b, _) in zip(runs, runs[1:], strict=False)
                ):
                    out.append(
                        f"record {cid}'s runs {runs} are not {self._units} units as maximal runs"
                    )
                # run by run at C speed; a unit only when its run is off (SPEC A.5)
                if pool._holds_runs(runs, (CHECKPOINT_OWNER, cid)):
                    continue
                for piece, u in enumerate(rec.unit_ids):
                    if pool.owner_of(u) != ((CHECKPOINT_OWNER, cid), piece):
                        out.append(f"unit {u} of record {cid} is tagged {pool.owner_of(u)!r}")
            out += pool.self_check()
        return out

    def _check_completions(self) -> list[str]:
        """``self_check``'s part for the settled flags and the outstanding completions."""
        out: list[str] = []
        listed: dict[int, int] = {}
        for token, cids in self._completions:
            if not cids:
                out.append(f"the completion {token!r} lists no checkpoint")
            if not (callable(getattr(token, "query", None)) and callable(
                getattr(token, "synchronize", None)
            )):
                out.append(f"the completion {token!r} is not a completion token")
            for cid in cids:
                listed[cid] = listed.get(cid, 0) + 1
        twice = sorted(cid for cid, n in listed.items() if n > 1)
        if twice:
            out.append(f"checkpoints listed by two completions: {twice}")
        inflight = set(self._inflight_stores)
        for cid, rec in self.records.items():
            if rec.phase == _COPYING or (rec.phase == _EVICTING and cid in inflight):
                if rec.settled or cid in listed:
                    out.append(f"{rec.phase} record {cid} in flight is settled or listed")
            elif rec.settled == (cid in listed):
                state = "settled" if rec.settled else "unsettled"
                where = "listed" if cid in listed else "not listed"
                out.append(f"{rec.phase} record {cid} is {state} but {where} by a completion")
        return out

    # -- snapshot -------------------------------------------------------------------------

    def snapshot(self, **coordinator_fields: Any) -> Snapshot:
        """Everything observable, as the spec's :class:`Snapshot` (a coordinator passes its
        own fields through ``coordinator_fields``). O(state)."""
        pool = self.pool
        free, dirty, tags = pool.snapshot_parts()
        cached_units = getattr(pool, "cached_units", None)
        return Snapshot(
            num_units=pool.num_units,
            units_per_checkpoint=self._units,
            free=free,
            dirty=dirty,
            tags=tags,
            cached=cached_units() if cached_units is not None else (),
            records={
                c: RecordView(r.prefix_hash, r.unit_ids, r.phase, r.pin_count, r.settled)
                for c, r in self.records.items()
            },
            index=dict(self.hash_to_checkpoint),
            pending=dict(self._pending_by_hash),
            lru=tuple(self._lru),
            inflight_stores=tuple(self._inflight_stores),
            queued_restores=tuple((c, op.dst_slot) for c, op in self._queued_restores.values()),
            inflight_restores=tuple((c, op.dst_slot) for c, op in self._inflight_restores),
            suspended=tuple(
                sorted((lid, c, op.dst_slot) for lid, (c, op) in self._suspended.items())
            ),
            offload_sink=self._offload_sink,
            offload_ready=tuple(self._offload_ready),
            offload_backlog_cap=self._offload_backlog_cap,
            offload_pins={
                op: OffloadPinView(p.checkpoint_id, p.source_released, p.reclaimable, p.pinned_at)
                for op, p in self._offload_pins.items()
            },
            forfeited=frozenset(self._forfeited),
            forfeit_watermark=self._forfeit_watermark,
            forfeit_bound=self._forfeit_bound,
            generation=self.generation,
            changes=tuple(self._changes),
            next_checkpoint_id=self._next_checkpoint_id,
            next_lease_id=self._next_lease_id,
            offload_generation=self._offload_generation,
            evictions=self.evictions,
            offload_pins_reclaimed=self.offload_pins_reclaimed,
            offload_nominations_dropped=self.offload_nominations_dropped,
            completions=tuple(tuple(cids) for _token, cids in self._completions),
            **coordinator_fields,
        )
