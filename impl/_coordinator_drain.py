"""The production coordinator's pending boundaries and its per-pass drain and completion
(SPEC D.1 steps 1, 5, 6, 8, G1): filing a boundary (at most one per sequence), forgetting
one, the drain that begins their stores, takes the queued restores and issues scratch stores
(given up whole if the engine's ``on_evict`` fails inside it), and the completion of the
previous batch. Pending boundaries are kept in filing order, plus the one pending key per
sequence and the sequences pending per hash. A mixin of
:class:`~.coordinator.PagedStateCheckpointCoordinator`."""

from __future__ import annotations

from pagedstate.spec import tables as T
from pagedstate.spec.errors import ReentrantCallError
from pagedstate.spec.sequences import need_sequence, sequence_slot
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp, SequenceLike

from ._args import need_int
from ._coordinator_base import _CoordinatorBase, _PendingKey

_READY = T.READY


class _Drain(_CoordinatorBase):
    """Pending boundaries, the drain and the completion (SPEC D.1 steps 1, 5, 6, 8, G1)."""

    # -- pending boundaries (SPEC D.1 steps 5, 6, 8, G1) ----------------------------------

    def _drop_pending(self, key: _PendingKey) -> None:
        sid, h = key
        del self._pending[key]
        del self._pending_of_seq[sid]
        seqs = self._pending_by_hash[h]
        del seqs[sid]
        if not seqs:
            del self._pending_by_hash[h]

    def checkpoint(self, seq: SequenceLike, boundary_blocks: int, h: int) -> None:
        """File boundary ``h`` of ``seq`` to be stored at the next drain from its slot.

        At most one pending boundary per sequence survives: a different ``h`` supersedes
        (and counts as dropped) the earlier one; re-filing the same ``h`` changes nothing
        (G1). Ignored when checkpoints do not apply or ``seq.state_slot < 0``. O(1).

        Args:
            seq: the engine's request (:class:`~pagedstate.spec.types.SequenceLike`); its
                ``state_slot`` is read at the drain, not now.
            boundary_blocks: the prefix length of the boundary, in KV blocks. Checked and
                kept for ATOM's signature; the store keys images by ``h`` alone, so it does
                not change what is stored.
            h: the prefix hash of the first ``boundary_blocks`` blocks.

        Raises:
            InvalidArgumentError: ``boundary_blocks`` not an int >= 0, ``h`` not an int, or
                ``seq`` not a sequence.
        """
        if type(boundary_blocks) is not int or boundary_blocks < 0:
            need_int("boundary_blocks", boundary_blocks, 0)
        if type(h) is not int:
            need_int("h", h)
        slot = getattr(seq, "state_slot", None)
        if type(slot) is not int or not hasattr(seq, "has_per_req_cache"):
            slot = need_sequence(seq)  # converts the slot, or raises naming what is wrong
        if slot < 0 or not (self.enabled and seq.has_per_req_cache):
            return
        sid = id(seq)
        key = (sid, h)
        if key in self._pending:
            return
        old = self._pending_of_seq.get(sid)
        if old is not None:
            self._drop_pending(old)
            self.checkpoints_dropped += 1
        self._pending[key] = (seq, h)
        self._pending_of_seq[sid] = key
        self._pending_by_hash.setdefault(h, {})[sid] = None

    def forget_pending(self, seq: SequenceLike) -> None:
        """``seq`` is leaving its slot: drop its pending boundary (not counted) and cancel
        the queued restore into its slot. O(1).

        Raises:
            InvalidArgumentError: ``seq`` is not a sequence (``state_slot`` not an int;
                checked before anything changes, G8).
        """
        slot = need_sequence(seq)
        old = self._pending_of_seq.get(id(seq))
        if old is not None:
            self._drop_pending(old)
        if slot >= 0:
            self.store.cancel_queued_restore(slot)

    def take_checkpoint_ops(
        self,
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        """The drain of a non-empty batch: begin the pending boundary stores (filing order),
        take the queued restores, then begin queued scratch stores within the per-batch
        budget (SPEC D.1 step 6). Returns ``(stores, restores)`` for this batch's copy
        launch. A store's reservation may evict cached KV blocks; the engine's re-entrant
        ``unindex`` then drops the boundaries and scratch stores of those hashes still
        waiting in this drain (SPEC A.4, G5). O(pending + restores + scratch issued), each
        paid for by its filing.

        If the engine's ``on_evict`` raises during the drain (or anything else interrupts
        it), every store this drain began is given up before the error propagates: its
        record is unindexed (it becomes EVICTING and the next completion releases its units,
        which no copy wrote), its op is never returned, and it counts as dropped, as does
        the attempt the error came out of; the scratch slots of given-up stores return at
        the next completion; the restores stay queued for the next drain. Without this, the
        next completion would publish images whose copy never ran.

        Raises:
            InvalidArgumentError: a pending sequence's ``state_slot`` is non-negative but not
                an int (checked for every pending sequence before anything changes, G8).
            ReentrantCallError: called from inside a drain or a completion (an ``on_evict``
                callback); nothing changed.
            EvictionCallbackError: ``on_evict`` raised; the drain was given up as above.
        """
        self._enter("take_checkpoint_ops")
        store = self.store
        first = len(store._inflight_stores)
        try:
            return self._drain()
        except BaseException:
            # an on_evict callback's failure (EvictionCallbackError) or anything else, an
            # interrupt included: the ops begun so far are never handed out, so no copy can
            # write units given back since
            self._give_up_drain(first)
            raise
        finally:
            self._busy = None
            self._attempt = False

    def _enter(self, name: str) -> None:
        if self._busy is not None:
            raise ReentrantCallError(
                f"{name} was called from inside {self._busy} (an on_evict callback?); a"
                " drain or a completion cannot be nested: nothing changed"
            )
        self._busy = name

    def _give_up_drain(self, first: int) -> None:
        """Undo the stores this drain began (``take_checkpoint_ops``): see there.

        Every store attempt of a drain is counted when it ends: kept (its op was taken) or
        dropped (refused). An error out of an attempt (its reservation fired a callback
        that failed or was interrupted) leaves that attempt uncounted (``_attempt``): it is
        dropped with the ones given up."""
        store = self.store
        began = store._inflight_stores[first:]
        for cid in began:
            rec = store.records.get(cid)
            if rec is not None and rec.phase == T.COPYING:
                store.unindex(rec.prefix_hash)
        self.checkpoints_kept -= len(self._store_ops)
        self.checkpoints_dropped += len(self._store_ops) + (1 if self._attempt else 0)
        self._attempt = False
        self._store_ops = []

    def _drain(self) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        pending = self._pending
        for seq, _h in pending.values():
            # every slot is read before anything changes (G8); sequence_slot only for one
            # that is not a plain int (it converts it or raises)
            if type(getattr(seq, "state_slot", None)) is not int:
                sequence_slot(seq)
        store = self.store
        # The store's indexes, read inline below: whether a hash is READY (``lookup``) or
        # pending (``contains_or_pending``); ``h`` was checked to be an int when filed.
        index = store.hash_to_checkpoint
        records = store.records
        store_pending = store._pending_by_hash
        of_seq = self._pending_of_seq
        by_hash = self._pending_by_hash
        for key, (seq, h) in list(pending.items()):
            if key not in pending:
                continue  # orphaned by a re-entrant unindex earlier in this drain
            # _drop_pending(key), inline
            sid = key[0]
            del pending[key]
            del of_seq[sid]
            seqs = by_hash[h]
            del seqs[sid]
            if not seqs:
                del by_hash[h]
            src = getattr(seq, "state_slot", None)
            if type(src) is not int:
                src = sequence_slot(seq)
            if src < 0 or h in store_pending:
                continue
            cid = index.get(h)
            if cid is not None:
                rec = records.get(cid)
                if rec is not None and rec.phase == _READY:
                    continue
            self._attempt = True  # counted when it ends (see _give_up_drain)
            op = store._begin(h, src)  # h checked when filed, src by sequence_slot
            self._attempt = False
            if op is None:
                self.checkpoints_dropped += 1
                continue
            self._store_ops.append(op)
            self.checkpoints_kept += 1
        # Scratch stores before the restores are taken (their budget counts the queued
        # restores, which the take moves in flight whole): if a scratch store's callback
        # fails, the drain is given up with the restores still queued for the next one.
        if self._scratch_queued:
            self._take_scratch_stores(
                self._max_ops_per_batch - len(self._store_ops) - len(store._queued_restores)
            )
        restores = store.take_restore_ops()
        stores, self._store_ops = self._store_ops, []
        return tuple(stores), restores

    def complete_previous_batch(self) -> None:
        """Top of a pass: the last drain's batch was issued. Publish its stores, release its
        restore pins and return its scratch slots (SPEC D.1 step 1). O(what it releases).

        Raises:
            ReentrantCallError: called from inside a drain or a completion; nothing changed.
        """
        self._enter("complete_previous_batch")
        try:
            self._complete()
        finally:
            self._busy = None

    def _complete(self) -> None:
        self.store.complete_inflight()
        issued, self._scratch_issued = self._scratch_issued, []
        if issued:
            row = T.SCRATCH.step(T.ISSUED, "complete")
            scratch = self._scratch
            assert scratch is not None
            for slot in issued:
                scratch.release(slot)
                self._took(T.SCRATCH, row, slot)

