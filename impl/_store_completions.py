"""The production store's completions (SPEC B.3 rows 2, 3, 24, D.13): the completion of the
batch that carried the last drain's ops (its stores published READY, its restore pins
dropped), the completion tokens that say when those copies are done, the settle that marks
the images their tokens reported done as settled (readable by host and other-stream
readers), and ``outstanding()``, the O(1) count of what the store still holds (G17). A mixin
of :class:`~.store.PageUnitCheckpointStore`.

Outstanding completions are a list in the order the completions were called, each the
token and the checkpoint ids it published unsettled (``_Completion``); a record's
``settled`` flag is the index the host readers test (``take_offload_stores``,
``acquire_checkpoint_source``), in O(1).
"""

from __future__ import annotations

from pagedstate.spec import tables as T
from pagedstate.spec.guards import store_guard
from pagedstate.spec.protocols import need_completion
from pagedstate.spec.types import CompletionToken

from ._store_base import _Record, _StoreBase

_READY = T.READY
_COPYING = T.COPYING
_EVICTING = T.EVICTING
#: Rows whose key is constant, looked up once in their table (which still decides them:
#: a missing row fails here, at import).
_PUBLISH = T.RECORD.step(T.COPYING, "publish")
_DEDUP = T.RECORD.step(T.COPYING, "dedup")
_SETTLE = {phase: T.RECORD.step(phase, "settle") for phase in (T.READY, T.EVICTING)}


class _Completions(_StoreBase):
    """Completions, completion tokens and the settle (SPEC B.3 rows 2, 3, 24, D.13)."""

    def complete_inflight(self, completion: CompletionToken | None = None) -> None:
        """The batch that carried the last drain's ops has been issued: publish its stores
        (COPYING -> READY, or release EVICTING and duplicates) and release its restore pins
        (SPEC B.3 rows 2, 3).

        ``completion`` is the batch's completion token (SPEC D.13), anything with a
        non-blocking ``query()`` and a blocking ``synchronize()`` (a CUDA event, or
        :class:`~pagedstate.spec.types.ManualCompletion`): without one, or when its
        ``query()`` answers True, the published images are settled at once; otherwise they
        are READY but unsettled, listed by the token until a settle sees it done (a
        completion that published nothing keeps no token). Every outstanding token is
        queried (in order), then the new one, before anything changes; after the stores
        are published, the records of the outstanding tokens that answered True are
        settled (B.3 row 24), and then the restores complete.

        O(stores + restores of that batch + outstanding tokens + records settled) (+ log n
        per publish).

        Raises:
            InvalidArgumentError: ``completion`` is neither None nor a completion token
                (nothing changed).
            IllegalTransitionError: an EVICTING store still holds a pin (G11; unreachable
                through the public API).
            Whatever a token's ``query()`` raises: propagated, nothing changed.
        """
        need_completion(completion)
        answers = self._poll() if self._completions else []
        done = True if completion is None else bool(completion.query())
        inflight, self._inflight_stores = self._inflight_stores, []
        records = self.records
        index = self.hash_to_checkpoint
        listed: list[int] = []
        for cid in inflight:
            rec = records.get(cid)
            if rec is None:
                # equivalent mutants: unreachable: an in-flight store is COPYING or EVICTING
                continue  # pragma: no mutate
            phase = rec.phase
            if phase == _COPYING:
                # lookup(rec.prefix_hash) >= 0, inline: a READY record of the hash exists
                other = index.get(rec.prefix_hash)
                if other is not None:
                    found = records.get(other)
                    if found is not None and found.phase == _READY:
                        self._apply(cid, rec, _DEDUP)
                        continue
                if done:
                    rec.settled = True
                else:
                    listed.append(cid)
                self._apply(cid, rec, _PUBLISH)
                if self._offload_sink:
                    self._queue_offload_store(cid)
            elif phase == _EVICTING:
                guard = store_guard(rec.pin_count)
                self._apply(cid, rec, T.RECORD.step(_EVICTING, "publish", guard))
        if answers:
            self._settle(answers)
        if listed:
            assert completion is not None
            self._completions.append((completion, listed))
        restores, self._inflight_restores = self._inflight_restores, []
        if restores:
            self._inflight_slots = set()
            row = T.RESTORE.step(T.IN_FLIGHT, "complete")
            for cid, op in restores:
                if self.row_sink is not None or self.on_transition is not None:
                    self._took(T.RESTORE, row, (cid, op.dst_slot))
                self._unpin(cid, "restore")

    def settle_completions(self, wait: bool = False) -> int:
        """Settle the images of every outstanding completion token that reports done (SPEC
        B.3 row 24, D.13): each live record such a token listed is settled (READY or
        EVICTING, a self-loop) and the token is forgotten; tokens not done stay, in order.
        With ``wait``, ``synchronize()`` every outstanding token first (a teardown, or a
        sender that must not wait for the next poll). Every ``query()`` is asked before
        anything changes. No generation bump: the READY set is unchanged. Returns the
        number of records settled. O(outstanding tokens + records they list).

        Raises:
            Whatever a token's ``synchronize()`` or ``query()`` raises: propagated, nothing
                changed.
        """
        if wait:
            for token, _cids in list(self._completions):
                token.synchronize()
        if not self._completions:
            return 0
        return self._settle(self._poll())

    def outstanding(self) -> dict[str, int]:
        """What the store still holds (SPEC D.13, G17), in O(1) without a snapshot: queued,
        in-flight and suspended restores, in-flight stores, offload and lease operations
        (source-released ones included, until their report) and completion tokens not yet
        seen done. Counts, each an int >= 0."""
        return {
            "queued_restores": len(self._queued_restores),
            "inflight_restores": len(self._inflight_restores),
            "suspended_restores": len(self._suspended),
            "inflight_stores": len(self._inflight_stores),
            "offload_operations": len(self._offload_pins),
            "completions": len(self._completions),
        }

    # -- the settle (SPEC B.3 row 24) -----------------------------------------------------

    def _poll(self) -> list[bool]:
        """``query()`` of every outstanding token, in order; changes nothing (a token that
        raises propagates). O(outstanding tokens)."""
        return [bool(token.query()) for token, _cids in self._completions]

    def _settle(self, answers: list[bool]) -> int:
        """Settle the outstanding tokens ``_poll`` found done (``answers``, one per token
        then outstanding, in order; tokens appended since are kept): each live unsettled
        record one lists takes its settle row; the token is forgotten. Returns the number
        of records settled. O(tokens + records they list)."""
        if True not in answers:
            return 0
        completions = self._completions
        keep = [entry for entry, done in zip(completions, answers, strict=False) if not done]
        keep += completions[len(answers) :]
        records = self.records
        settled = 0
        for (_token, cids), done in zip(completions, answers, strict=False):
            if not done:
                continue
            for cid in cids:
                rec = records.get(cid)
                if rec is None or rec.settled:
                    continue  # released since (its id is never reused)
                row = _SETTLE.get(rec.phase) or T.RECORD.step(rec.phase, "settle")
                rec.settled = True
                self._apply(cid, rec, row)
                settled += 1
        self._completions = keep
        return settled

    def _will_settle(self, cid: int, rec: _Record, answers: list[bool]) -> bool:
        """Whether record ``cid`` is settled once ``_settle(answers)`` has run. O(1) when it
        is settled already, else O(records listed by the tokens found done)."""
        if rec.settled:
            return True
        pairs = zip(self._completions, answers, strict=True)
        return any(done and cid in cids for (_token, cids), done in pairs)
