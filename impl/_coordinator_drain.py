"""The production coordinator's pending boundaries and its per-pass drain and completion
(SPEC D.1 steps 1, 5, 6, 8, D.13, G1, G13): filing a boundary (at most one per sequence,
naming the forward that computes it), forgetting one, the drain that begins their stores,
takes the queued restores and issues scratch stores (given up whole if the engine's
``on_evict`` fails inside it), and the completion of the previous batch (with its
completion token). Pending boundaries are kept in filing order, plus the one pending key
per sequence, the sequences pending per hash and the forward ids of those filed with one.
A mixin of :class:`~.coordinator.PagedStateCheckpointCoordinator`."""

from __future__ import annotations

from pagedstate.spec import tables as T
from pagedstate.spec.errors import (
    BoundaryRangeError,
    InvalidArgumentError,
    ReentrantCallError,
    StaleBoundaryError,
)
from pagedstate.spec.protocols import need_completion, need_forward
from pagedstate.spec.sequences import need_sequence, sequence_slot
from pagedstate.spec.types import (
    CheckpointRestoreOp,
    CheckpointStoreOp,
    CompletionToken,
    SequenceLike,
)

from ._args import need_int
from ._coordinator_base import _CoordinatorBase, _PendingKey

_READY = T.READY


class _Drain(_CoordinatorBase):
    """Pending boundaries, the drain and the completion (SPEC D.1 steps 1, 5, 6, 8, G1)."""

    # -- pending boundaries (SPEC D.1 steps 5, 6, 8, G1) ----------------------------------

    def _drop_pending(self, key: _PendingKey) -> None:
        sid, h = key
        del self._pending[key]
        if self._boundary_forwards:
            self._boundary_forwards.pop(key, None)
        del self._pending_of_seq[sid]
        seqs = self._pending_by_hash[h]
        del seqs[sid]
        if not seqs:
            del self._pending_by_hash[h]

    def checkpoint(
        self,
        seq: SequenceLike,
        boundary_blocks: int,
        h: int,
        *,
        forward: int | None = None,
        computed_blocks: int | None = None,
    ) -> None:
        """File boundary ``h`` of ``seq`` to be stored from its slot (SPEC D.1 step 5).

        Without ``forward``, the next drain stores it from the slot as it is then. With
        ``forward=F`` (SPEC D.13), forward ``F`` leaves the state of ``h`` in the slot: the
        first drain after forward ``F`` (``last_forward == F``) stores it; a drain before
        it leaves it pending; a drain after a later forward drops it (counted as dropped).
        At most one pending boundary per sequence survives: a different ``h`` supersedes
        (and counts as dropped) the earlier one, its forward replacing the earlier one's;
        re-filing the same ``h`` changes nothing, the first forward included (G1). Ignored,
        after every check, when checkpoints do not apply or ``seq.state_slot < 0``. O(1).

        Args:
            seq: the engine's request (:class:`~pagedstate.spec.types.SequenceLike`); its
                ``state_slot`` is read at the drain, not now.
            boundary_blocks: the prefix length of the boundary, in KV blocks, >= 1 (G13).
                The store keys images by ``h`` alone, so it does not change what is stored.
            h: the prefix hash of the first ``boundary_blocks`` blocks.
            forward: the id of the forward that computes the boundary's state, or None.
            computed_blocks: the blocks the request has computed once its forward has run,
                or None; ``boundary_blocks`` may not exceed it (G13).

        Raises:
            InvalidArgumentError: ``boundary_blocks`` not an int >= 0, ``computed_blocks``
                neither None nor an int >= 0, ``forward`` neither None nor an int >= 0,
                ``h`` not an int, or ``seq`` not a sequence.
            BoundaryRangeError: ``boundary_blocks`` is 0, or exceeds ``computed_blocks``
                (G13).
            StaleBoundaryError: ``forward`` is older than ``last_forward``: its slot has
                been handed to a later forward (D.13).
            Each before anything changes (nothing filed).
        """
        if type(boundary_blocks) is not int or boundary_blocks < 0:
            need_int("boundary_blocks", boundary_blocks, 0)
        if boundary_blocks == 0:
            raise BoundaryRangeError(
                "boundary_blocks must be >= 1: a boundary of 0 blocks names no computed"
                " state (G13)"
            )
        if computed_blocks is not None:
            if type(computed_blocks) is not int or computed_blocks < 0:
                need_int("computed_blocks", computed_blocks, 0)
            if boundary_blocks > computed_blocks:
                raise BoundaryRangeError(
                    f"boundary_blocks {boundary_blocks} is beyond the {computed_blocks}"
                    " blocks computed (G13)"
                )
        fwd = None if forward is None else need_forward("forward", forward)
        if type(h) is not int:
            need_int("h", h)
        slot = getattr(seq, "state_slot", None)
        if type(slot) is not int or not hasattr(seq, "has_per_req_cache"):
            slot = need_sequence(seq)  # converts the slot, or raises naming what is wrong
        last = self._last_forward
        if fwd is not None and last is not None and fwd < last:
            raise StaleBoundaryError(
                f"boundary {h} names forward {fwd}, but the latest drain was for forward"
                f" {last}: its slot has been handed to a later forward (D.13)"
            )
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
        if fwd is not None:
            self._boundary_forwards[key] = fwd

    def forget_pending(self, seq: SequenceLike) -> None:
        """``seq`` is leaving its slot: drop its pending boundary (not counted) and cancel
        its queued restore (SPEC D.1 step 8, G15): the one ``begin_restore(..., seq=seq)``
        queued, into whatever slot it names, while it is still queued; else the queued
        restore into ``seq.state_slot`` when that is ``>= 0`` and no other sequence's
        restore. O(1).

        Raises:
            InvalidArgumentError: ``seq`` is not a sequence (``state_slot`` not an int;
                checked before anything changes, G8).
        """
        slot = need_sequence(seq)
        old = self._pending_of_seq.get(id(seq))
        if old is not None:
            self._drop_pending(old)
        self._forget_restore_of(seq, slot)

    def take_checkpoint_ops(
        self, *, forward: int | None = None
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        """The drain of a non-empty batch: begin the pending boundary stores (filing order),
        take the queued restores, then begin queued scratch stores within the per-batch
        budget (SPEC D.1 step 6). Returns ``(stores, restores)`` for this batch's copy
        launch, which runs before forward ``forward`` (D.13: ``next_forward`` when not
        given; it becomes ``last_forward`` as the drain begins, and stays if the drain is
        given up).

        With ``prev`` the ``last_forward`` before this drain: a boundary filed with forward
        ``F`` is stored when ``F == prev``, stays pending in place when ``F > prev`` (or no
        drain ran yet) and is dropped, counted, when ``F < prev``; a scratch store
        published with ``F`` is issued only when ``F <= prev``, else it stays queued in its
        place and takes no budget. A store's reservation may evict cached KV blocks; the
        engine's re-entrant ``unindex`` then drops the boundaries and scratch stores of
        those hashes still waiting in this drain (SPEC A.4, G5). Every queued restore is
        taken, so no restore owner is remembered after it (G15). O(pending + restores +
        scratch issued or refused + scratch entries skipped), each paid for by its filing.

        If the engine's ``on_evict`` raises during the drain (or anything else interrupts
        it), every store this drain began is given up before the error propagates: its
        record is unindexed (it becomes EVICTING and the next completion releases its units,
        which no copy wrote), its op is never returned, and it counts as dropped, as does
        the attempt the error came out of; the scratch slots of given-up stores return at
        the next completion; the restores stay queued for the next drain. Without this, the
        next completion would publish images whose copy never ran.

        Raises:
            InvalidArgumentError: ``forward`` is neither None nor an int >= 0, or not
                greater than ``last_forward`` (D.13); a pending sequence's ``state_slot`` is
                non-negative but not an int (checked for every pending sequence). Each
                before anything changes (G8).
            ReentrantCallError: called from inside a drain or a completion (an ``on_evict``
                callback); nothing changed.
            EvictionCallbackError: ``on_evict`` raised; the drain was given up as above.
        """
        fwd = None if forward is None else need_forward("forward", forward)
        last = self._last_forward
        if fwd is not None and last is not None and fwd <= last:
            raise InvalidArgumentError(
                f"forward {fwd} must be greater than the latest drain's forward {last} (D.13)"
            )
        self._enter("take_checkpoint_ops")
        store = self.store
        first = len(store._inflight_stores)
        try:
            return self._drain(fwd)
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

    def _drain(
        self, forward: int | None
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        pending = self._pending
        for seq, _h in pending.values():
            # every slot is read before anything changes (G8); sequence_slot only for one
            # that is not a plain int (it converts it or raises)
            if type(getattr(seq, "state_slot", None)) is not int:
                sequence_slot(seq)
        prev = self._last_forward
        self._last_forward = forward if forward is not None else (0 if prev is None else prev + 1)
        forwards = self._boundary_forwards
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
            if forwards:
                f = forwards.get(key)
                if f is not None:
                    if f != prev and (prev is None or f > prev):
                        continue  # forward f has not run yet: stays pending in place (D.13)
                    del forwards[key]
                    if f != prev:
                        # its slot was handed to a later forward: dropped (D.13)
                        self._drop_pending(key)
                        self.checkpoints_dropped += 1
                        continue
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
                self._max_ops_per_batch - len(self._store_ops) - len(store._queued_restores),
                prev,
            )
        restores = store.take_restore_ops()
        self._clear_restore_owners()
        stores, self._store_ops = self._store_ops, []
        return tuple(stores), restores

    def complete_previous_batch(self, completion: CompletionToken | None = None) -> None:
        """Top of a pass: the last drain's batch was issued. Publish its stores, release its
        restore pins and return its scratch slots (SPEC D.1 step 1). ``completion`` is the
        batch's completion token, when the engine has one (D.13): the images it publishes
        stay unsettled until it reports done (see
        :meth:`PageUnitCheckpointStore.complete_inflight`). O(what it publishes, releases
        and settles + outstanding tokens).

        Raises:
            InvalidArgumentError: ``completion`` is neither None nor a completion token.
            ReentrantCallError: called from inside a drain or a completion.
            Whatever a token's ``query()`` raises. Each with nothing changed.
        """
        need_completion(completion)
        self._enter("complete_previous_batch")
        try:
            self._complete(completion)
        finally:
            self._busy = None

    def _complete(self, completion: CompletionToken | None) -> None:
        self.store.complete_inflight(completion)
        issued, self._scratch_issued = self._scratch_issued, {}
        if issued:
            row = T.SCRATCH.step(T.ISSUED, "complete")
            scratch = self._scratch
            assert scratch is not None
            for slot in issued:
                scratch.release(slot)
                self._took(T.SCRATCH, row, slot)
