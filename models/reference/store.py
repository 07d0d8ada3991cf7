"""The reference checkpoint store, :class:`PageUnitCheckpointStore` (SPEC B.1-B.4 with
section G): its state and record machine come from :class:`~.store_core._StoreCore`,
restores from :class:`~.store_restores._Restores`, the CPU tier from
:class:`~.store_offload._Offload`; this module holds the stores (eviction for room,
``begin_store``, the batch completion with its completion token, SPEC D.13), the index
changes and adoption, and the snapshot."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from pagedstate.spec import tables as T
from pagedstate.spec.errors import InvalidArgumentError, StoreOwnedUnitsError
from pagedstate.spec.protocols import need_completion
from pagedstate.spec.snapshot import OffloadPinView, RecordView, Snapshot
from pagedstate.spec.types import CHECKPOINT_OWNER, CheckpointStoreOp, CompletionToken

from ._common import _is_checkpoint_owner, _is_dirtying, _need_int
from .store_core import _Record
from .store_offload import _Offload
from .store_restores import _Restores


class PageUnitCheckpointStore(_Restores, _Offload):
    """Reference checkpoint store (SPEC B.1-B.4 with section G).

    Args:
        pool: the unit pool checkpoints reserve from.
        spec: the image geometry; ``units_per_checkpoint`` units per record.
        offload_sink: nominate READY records for the CPU tier (SPEC B.3 row 20).
        clock: seconds, monotonic; used to stamp offload pins (default ``time.monotonic``).
        offload_backlog_cap, forfeit_bound, change_log_size: the bounds of SPEC B.1 / G7.
    """

    # -- stores ---------------------------------------------------------------------------

    def ensure_free_units(self, count: int) -> bool:
        """Evict unpinned READY records, oldest first, until ``count`` units are free.

        Returns False and spends nothing when ``has_available_units(count)`` is False
        (SPEC B.3 row 14)."""
        _need_int("count", count, 0)
        if not self.has_available_units(count):
            return False
        while self.pool.num_free < count:
            victim = self._next_victim()
            if victim < 0:
                return False
            self._evict(victim)
        return True

    def begin_store(self, prefix_hash: int, src_slot: int) -> CheckpointStoreOp | None:
        """Begin copying ``src_slot``'s image under ``prefix_hash`` (SPEC B.3 row 1).

        Returns the op for this batch's copy launch, or ``None`` (nothing changed beyond LRU
        evictions that made room) when the hash is READY or pending or no units can be had.
        The record is COPYING, invisible to lookup and unsettled (D.13), until the next
        ``complete_inflight``.
        """
        _need_int("prefix_hash", prefix_hash)
        _need_int("src_slot", src_slot, 0)
        if self.lookup(prefix_hash) >= 0 or prefix_hash in self._pending_by_hash:
            return None
        u = self.units_per_checkpoint
        if not self.ensure_free_units(u):
            return None
        cid = self._next_checkpoint_id
        with self.pool._as_store():
            units = self.pool.reserve_units(u, (CHECKPOINT_OWNER, cid))
        if units is None:
            return None
        self._next_checkpoint_id += 1
        row = self._step(T.RECORD, T.ABSENT, "begin_store")
        rec = _Record(prefix_hash, tuple(units), T.ABSENT)
        self.records[cid] = rec
        self._apply(cid, rec, row)
        self._inflight_stores.append(cid)
        return CheckpointStoreOp(src_slot, tuple(units), self.spec.image_bytes, self.spec.layout_id)

    def complete_inflight(self, completion: CompletionToken | None = None) -> None:
        """The batch that carried the last drain's ops has been issued: publish its stores
        (COPYING -> READY, or release EVICTING and duplicates), settle the records of the
        outstanding tokens that report done, and release its restore pins (SPEC B.3 rows
        2, 3, 24; D.13).

        Every outstanding token and ``completion`` are asked ``query()`` first, before any
        change. A record published here is settled at once without ``completion`` or when
        ``completion`` already reports done; otherwise it is unsettled and listed by a new
        completion entry (kept only if it lists a record) until the token reports done.

        Raises:
            InvalidArgumentError: ``completion`` is neither None nor a token (callable
                ``query`` and ``synchronize``); nothing changed.
            Whatever a token's ``query()`` raises; nothing changed.
        """
        need_completion(completion)
        done = self._poll_completions()
        fresh_done = completion is None or bool(completion.query())
        listed: list[int] = []
        inflight, self._inflight_stores = self._inflight_stores, []
        for cid in inflight:
            rec = self.records.get(cid)
            if rec is None:
                continue
            if rec.phase == T.EVICTING:
                self._apply(cid, rec, self._guarded_step(rec, "publish"))
            elif rec.phase != T.COPYING:
                continue
            elif self.lookup(rec.prefix_hash) >= 0:
                self._apply(cid, rec, self._step(T.RECORD, T.COPYING, "dedup"))
            else:
                self._apply(cid, rec, self._step(T.RECORD, T.COPYING, "publish"))
                rec.settled = fresh_done
                if not fresh_done:
                    listed.append(cid)
                if self._offload_sink:
                    self._queue_offload_store(cid)
        self._settle(done)
        if listed:
            assert completion is not None
            self._completions.append((completion, listed))
        restores, self._inflight_restores = self._inflight_restores, []
        for cid, _op in restores:
            self._step(T.RESTORE, T.IN_FLIGHT, "complete", to=T.DONE)
            self._unpin(cid, "restore")

    # -- index changes --------------------------------------------------------------------

    def unindex(self, prefix_hash: int) -> bool:
        """The KV prefix ``prefix_hash`` was evicted: make its checkpoint unfindable (SPEC B.3
        row 10). READY unpinned records are released; pinned or COPYING ones become EVICTING
        and keep their units until the last reader or writer is done. Returns whether a
        record was found."""
        _need_int("prefix_hash", prefix_hash)
        cid = self.hash_to_checkpoint.get(prefix_hash)
        if cid is None:
            cid = self._pending_by_hash.get(prefix_hash)
        if cid is None:
            return False
        rec = self.records.get(cid)
        if rec is None:
            return False
        self._apply(cid, rec, self._guarded_step(rec, "unindex"))
        return True

    def clear(self) -> None:
        """Unindex everything (SPEC B.3 row 11). Pinned and in-flight records become EVICTING;
        the rest are released. Queued restores, offload pins, nominations and transfer
        reservations survive. The change log records one ``None`` bump when the READY set
        was not empty (G6)."""
        plan = []
        for cid, rec in self.records.items():
            plan.append((cid, rec, self._guarded_step(rec, "clear")))
        had_ready = bool(self.hash_to_checkpoint)
        for _cid, rec, row in plan:
            self._set_phase(rec, row)
        self.hash_to_checkpoint.clear()
        self._pending_by_hash.clear()
        self._lru.clear()
        for cid, _rec, row in plan:
            if row.units == "release":
                self._release_record(cid)
        if had_ready:
            self._note_change(None)

    def adopt_units(self, unit_ids: tuple[int, ...], owner: Hashable, prefix_hash: int) -> bool:
        """Make a completed external image the READY record of ``prefix_hash`` by retagging
        ``owner``'s units, with no window in which they are free (SPEC B.3 row 13). If the
        hash is READY or pending, the units are released and False returned. Not nominated
        for offload. Settled at once: the receiver waited for its transfer (D.13).
        Identities are taken only after nothing can fail (G8).

        Raises:
            InvalidArgumentError: wrong unit count or argument types.
            StoreOwnedUnitsError: ``owner`` is a checkpoint's own tag (its units are not
                adoptable), or a transfer reservation and the caller is not the
                coordinator's ``adopt_transfer_units``.
            WrongOwnerError, PartialReleaseError, DuplicateUnitError: the units are not
                exactly ``owner``'s whole reservation.
        """

        _need_int("prefix_hash", prefix_hash)
        if not isinstance(unit_ids, (list, tuple)) or len(unit_ids) != self.units_per_checkpoint:
            raise InvalidArgumentError(
                f"adoption needs exactly {self.units_per_checkpoint} units, got {unit_ids!r}"
            )
        if _is_checkpoint_owner(owner):
            raise StoreOwnedUnitsError.for_owner(owner)
        if _is_dirtying(owner):
            if not self._transfer_grant:
                raise StoreOwnedUnitsError.for_transfer_adoption(owner)
            self._transfer_grant = False  # spent: it serves this call alone
        if self.contains_or_pending(prefix_hash):
            with self.pool._as_store():
                self.pool.release_units(unit_ids, owner)
            return False
        cid = self._next_checkpoint_id
        with self.pool._as_store():
            self.pool.rekey_units(unit_ids, owner, (CHECKPOINT_OWNER, cid))
        self._next_checkpoint_id += 1
        row = self._step(T.RECORD, T.ABSENT, "adopt")
        rec = _Record(prefix_hash, tuple(unit_ids), T.ABSENT, settled=True)  # D.13: settled
        self.records[cid] = rec
        self._apply(cid, rec, row)
        return True

    # -- snapshot -------------------------------------------------------------------------

    def snapshot(self, **coordinator_fields: Any) -> Snapshot:
        """Everything observable, as the spec's :class:`Snapshot` (a coordinator passes its
        own fields through ``coordinator_fields``)."""
        free, dirty, tags = self.pool.snapshot_parts()
        return Snapshot(
            num_units=self.pool.num_units,
            units_per_checkpoint=self.units_per_checkpoint,
            free=free,
            dirty=dirty,
            tags=tags,
            cached=self.pool.cached_units(),
            records={
                c: RecordView(r.prefix_hash, r.unit_ids, r.phase, r.pin_count, r.settled)
                for c, r in self.records.items()
            },
            index=dict(self.hash_to_checkpoint),
            pending=dict(self._pending_by_hash),
            lru=tuple(self._lru),
            inflight_stores=tuple(self._inflight_stores),
            queued_restores=tuple((c, op.dst_slot) for c, op in self._queued_restores),
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
