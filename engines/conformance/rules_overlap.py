"""Rules of the overlapped style (SPEC D.13, G12, G13, G15): boundaries and drains naming
forward ids (the next forward before its drain, the last one after it, stale ones, skipped
ids), scratch stores published with ``forward=``, completions with completion tokens set
done out of order and late, ``settle_completions``, restores begun on behalf of a sequence,
``forget_pending`` after the sequence's slot was reset, and restores and scratch lent over
one slot. Every rule here needs :attr:`~.config.ConformanceConfig.overlap`."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import MultipleResults, multiple, precondition, rule

from pagedstate.spec.types import ManualCompletion

from .config import Pair
from .lockstep import SCRATCH, _call_coord, _Lockstep
from .strategies import (
    ANY_BUSY_SLOT,
    BUSY_SLOT,
    LENT_SLOT,
    READY_H,
    REG_SEQ,
    RESTORE_SLOT,
    SEQ,
    SLOT,
    H,
    _index_into,
)

#: How a boundary or a scratch store names its forward: ``none`` (the synchronous
#: meaning), ``next`` (the forward whose drain comes next: filed when that batch is
#: scheduled), ``last`` (the forward issued just before the last drain: filed after it),
#: ``stale`` (the one before that: StaleBoundaryError for a boundary), ``ahead`` (two
#: drains away).
FORWARDS = ("none", "next", "last", "stale", "ahead")
#: How a drain names its forward: ``none`` (takes ``next_forward``), ``next`` (the same,
#: explicit), ``skip`` (an id skipped: boundaries naming it are dropped at the drain after),
#: ``last`` (not greater than the last drain's: InvalidArgumentError).
DRAIN_FORWARDS = ("none", "next", "skip", "last")
#: ``computed_blocks`` of a boundary of ``blocks`` blocks: ``none``, ``equal``, ``more``,
#: or ``short`` (one fewer: BoundaryRangeError, G13).
COMPUTED = ("none", "equal", "more", "short")
#: After an overlapped pass: ``none``; ``oldest`` / ``newest``: the oldest (in order) or
#: newest (out of order) token not done yet reports done, then ``settle_completions()``;
#: ``wait``: ``settle_completions(wait=True)``.
DONE = ("none", "oldest", "newest", "wait")
#: A completion's token: ``none`` (settles at once), ``pending`` (a token not done yet),
#: ``done`` (a token already done when the completion asks it).
TOKENS = ("none", "pending", "done")


def _overlap(self: _Lockstep) -> bool:
    return self.config.overlap


class OverlapRules(_Lockstep):
    """The overlapped style: forward ids, completion tokens, restore owners."""

    # -- helpers ------------------------------------------------------------------------

    def _last(self) -> int | None:
        return self.snap_ref.last_forward

    def _next(self) -> int:
        last = self._last()
        return 0 if last is None else last + 1

    def _forward(self, choice: str) -> int | None:
        """The forward id ``choice`` (:data:`FORWARDS`) names in the current state."""
        last, nxt = self._last(), self._next()
        if choice == "next":
            return nxt
        if choice == "last":
            return last
        if choice == "stale":
            return last - 1 if last else last
        if choice == "ahead":
            return nxt + 1
        return None

    def _drain_forward(self, choice: str) -> int | None:
        last, nxt = self._last(), self._next()
        if choice == "next":
            return nxt
        if choice == "skip":
            return nxt + 1
        if choice == "last":
            return -1 if last is None else last
        return None

    def _token(self, choice: str) -> Pair | None:
        """A fresh pair of completion tokens (one per side), or None."""
        if choice == "none":
            return None
        done = choice == "done"
        pair = Pair(ManualCompletion(done), ManualCompletion(done))
        self.token_pairs.append(pair)
        return pair

    def _complete(self, name: str, token: Pair | None) -> None:
        if token is None:
            self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))
            return
        self._both(
            name,
            f"complete_previous_batch(completion={token.ref!r})",
            lambda x: x.coord.complete_previous_batch(completion=x.pick(token)),
        )

    def _file_boundary(
        self, name: str, s: int, blocks: int, h: int, fwd: int | None, comp: int | None
    ) -> None:
        seq = self._seq(s)
        self._both(
            name,
            f"checkpoint({seq!r}, {blocks}, {h}, forward={fwd}, computed_blocks={comp})",
            lambda x: x.coord.checkpoint(seq, blocks, h, forward=fwd, computed_blocks=comp),
        )

    def _drain(self, name: str, fwd: int | None) -> None:
        if fwd is None:
            self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
        else:
            self._both(
                name,
                f"take_checkpoint_ops(forward={fwd})",
                lambda x: x.coord.take_checkpoint_ops(forward=fwd),
            )

    # -- boundaries and drains naming forwards ------------------------------------------

    @precondition(_overlap)
    @rule(
        s=SEQ,
        h=H,
        blocks=st.integers(0, 3),
        forward=st.sampled_from(FORWARDS),
        computed=st.sampled_from(COMPUTED),
    )
    def checkpoint_forward(self, s: int, h: int, blocks: int, forward: str, computed: str) -> None:
        """File boundary ``h`` naming a forward (:data:`FORWARDS`) and the blocks computed
        (:data:`COMPUTED`): pending until the drain after that forward; a stale one or one
        beyond the computed blocks is refused, nothing filed (D.13, G13)."""
        comp = {"none": None, "equal": blocks, "more": blocks + 2, "short": blocks - 1}[computed]
        self._file_boundary("checkpoint_forward", s, blocks, h, self._forward(forward), comp)

    @precondition(_overlap)
    @rule(forward=st.sampled_from(DRAIN_FORWARDS))
    def drain_forward(self, forward: str) -> None:
        """A drain naming its forward (:data:`DRAIN_FORWARDS`): it stores the boundaries of
        the last forward, keeps those of later ones pending and drops the skipped ones."""
        self._drain("drain_forward", self._drain_forward(forward))

    @precondition(_overlap)
    @rule(
        boundaries=st.lists(st.tuples(REG_SEQ, H), min_size=1, max_size=3),
        explicit=st.booleans(),
        token=st.sampled_from(TOKENS),
        late=st.sampled_from(("none", "last", "stale")),
        late_h=H,
        done=st.sampled_from(DONE),
    )
    def overlap_pass(
        self,
        boundaries: list[tuple[int, int]],
        explicit: bool,
        token: str,
        late: str,
        late_h: int,
        done: str,
    ) -> None:
        """A pass of an overlapping engine: batch ``F = next_forward`` is scheduled and its
        boundaries filed naming ``F`` (with the blocks computed), the drain before forward
        ``F`` (``forward=F`` when ``explicit``) stores the boundaries of the forward before
        it, and the completion passes a token (:data:`TOKENS`). With ``late``, a result
        processed after the drain files a boundary of the first sequence naming
        ``last_forward`` (stored at the next drain) or the one before (stale: refused).
        Then ``done`` (:data:`DONE`): a token of an earlier pass reports done, in order or
        out of order, and the engine settles; or it waits for every token."""
        name = "overlap_pass"
        fwd = self._next()
        for s, h in boundaries:
            self._file_boundary(name, s, 1, h, fwd, 1)
        self._drain(name, fwd if explicit else None)
        if late != "none":
            last = self._last()
            named = last if late == "last" or last is None else last - 1
            self._file_boundary(name, boundaries[0][0], 1, late_h, named, None)
        self._complete(name, self._token(token))
        self._done(name, done)

    def _done(self, name: str, done: str) -> None:
        if done == "none":
            return
        if done != "wait":
            waiting = [p for p in self.token_pairs if not p.ref.done]
            if waiting:
                pair = waiting[0] if done == "oldest" else waiting[-1]
                pair.ref.set()
                pair.sut.set()
        wait = done == "wait"
        self._both(
            name,
            f"settle_completions(wait={wait})",
            lambda x: x.coord.settle_completions(wait=wait),
        )

    @precondition(_overlap)
    @rule(s=REG_SEQ, h=H, slot=SLOT, limited=st.booleans())
    def unsettled_image(self, s: int, h: int, slot: int, limited: bool) -> None:
        """An image whose copy is issued but not known done: ``h`` is filed, drained and
        completed with a token not done yet (READY, unsettled); the tier and a lease are
        refused it (deferred, ``None``) while a restore may pin it at once and is drained;
        ``h`` is evicted from the KV cache while the restore reads it (EVICTING, pinned);
        the token reports done and the engine settles (EVICTING+settle); the restore
        completes and the record goes."""
        name = "unsettled_image"
        seq = self._seq(s)
        self._both(name, f"checkpoint({seq!r}, 1, {h})", _call_coord("checkpoint", seq, 1, h))
        self._drain(name, None)
        pair = self._token("pending")
        self._complete(name, pair)
        limit = self.config.max_offload_inflight if limited else None
        if self.config.leases:
            out = self._both(
                name,
                f"acquire_checkpoint_source({h}, max_inflight={limit})",
                lambda x: x.coord.acquire_checkpoint_source(h, max_inflight=limit),
            )
            if out.ok and out.ref is not None:
                self.op_pairs.append(Pair(out.ref[0], out.sut[0]))
        if self.tier is not None:
            room = self.config.max_offload_inflight
            got = self._both(
                name,
                f"take_offload_stores({room})",
                lambda x: x.coord.take_offload_stores(room),
            )
            if got.ok:
                self.op_pairs.extend(
                    Pair(r[0], t[0]) for r, t in zip(got.ref, got.sut, strict=True)
                )
        self._both(name, f"begin_restore({h}, {slot})", _call_coord("begin_restore", h, slot))
        self._drain(name, None)
        self._both(name, f"unindex({h})", _call_coord("unindex", h))
        if pair is not None:
            pair.ref.set()
            pair.sut.set()
        self._both(name, "settle_completions()", _call_coord("settle_completions"))
        self._complete(name, None)

    # -- completions and their tokens ---------------------------------------------------

    @precondition(_overlap)
    @rule(token=st.sampled_from(TOKENS[1:]))
    def complete_with_token(self, token: str) -> None:
        """The last drain's batch completes with a completion token (:data:`TOKENS`): what
        it publishes is READY and unsettled until the token reports done."""
        self._complete("complete_with_token", self._token(token))

    @precondition(lambda self: self.config.overlap and bool(self.token_pairs))
    @rule(i=_index_into("token_pairs"))
    def set_done(self, i: int) -> None:
        """Completion token ``i`` reports done from now on (any token, in any order; late:
        its records may be gone). No store call: the next poll sees it."""
        pair = self.token_pairs[i]
        pair.ref.set()
        pair.sut.set()

    @precondition(_overlap)
    @rule(wait=st.booleans(), via_store=st.booleans())
    def settle_completions(self, wait: bool, via_store: bool) -> None:
        """Settle the records whose tokens report done (``wait``: synchronize every token
        first); the count is compared. ``via_store`` (with ``store_calls``) asks the store
        itself."""
        if via_store and self.config.store_calls:
            self._both(
                "settle_completions",
                f"store.settle_completions(wait={wait})",
                lambda x: x.store.settle_completions(wait=wait),
            )
        else:
            self._both(
                "settle_completions",
                f"settle_completions(wait={wait})",
                lambda x: x.coord.settle_completions(wait=wait),
            )

    # -- midstep scratch published with forward= ----------------------------------------

    @precondition(_overlap)
    @rule(res=SCRATCH, forward=st.sampled_from(FORWARDS))
    def publish_forward(self, res: Pair, forward: str) -> None:
        """Publish a scratch reservation naming the forward that writes it: issued by the
        first drain after that forward, never before (D.13)."""
        fwd = self._forward(forward)
        self._both(
            "publish_forward",
            f"publish_midstep({res.ref!r}, forward={fwd})",
            lambda x: x.coord.publish_midstep(list(x.pick(res)), forward=fwd),
        )

    # -- restores on behalf of a sequence (G15) and over scratch (G12) ------------------

    @precondition(_overlap)
    @rule(
        s=SEQ,
        h=READY_H,
        slot=st.one_of(RESTORE_SLOT, ANY_BUSY_SLOT, LENT_SLOT),
        own=st.booleans(),
        owned=st.booleans(),
    )
    def restore_for(self, s: int, h: int, slot: int, own: bool, owned: bool) -> None:
        """Queue a restore of ``h`` (``owned``: ``seq=`` the sequence, remembered for it)
        into the sequence's slot (``own``) or into ``slot``, which may be busy or lent as
        scratch: SlotBusyError (G4, G12), and a second live restore for one sequence too."""
        seq = self._seq(s)
        dst = seq.state_slot if own else slot
        if owned:
            self._both(
                "restore_for",
                f"begin_restore({h}, {dst}, seq={seq!r})",
                lambda x: x.coord.begin_restore(h, dst, seq=seq),
            )
        else:
            self._both(
                "restore_for", f"begin_restore({h}, {dst})", _call_coord("begin_restore", h, dst)
            )

    @precondition(_overlap)
    @rule(s=SEQ, slot=st.one_of(st.just(-1), RESTORE_SLOT, BUSY_SLOT))
    def reslot_forget(self, s: int, slot: int) -> None:
        """Abort after the engine reset the sequence's ``state_slot`` (to -1, or to a slot
        that may hold another sequence's restore): ``forget_pending`` cancels the restore
        begun for the sequence, not the one queued into its current slot (G15). The slot
        is put back afterwards (the kit's sequences keep their slots)."""
        seq = self._seq(s)
        old = seq.state_slot
        seq.state_slot = slot
        try:
            self._both(
                "reslot_forget",
                f"forget_pending({seq!r}) with state_slot={slot}",
                lambda x: x.coord.forget_pending(seq),
            )
        finally:
            seq.state_slot = old

    @precondition(lambda self: self.config.overlap and self.config.scratch_slots > 0)
    @rule(target=SCRATCH, h=READY_H, s=REG_SEQ, pos=st.integers(0, 64), scratch_h=H)
    def scratch_over_restore(
        self, h: int, s: int, pos: int, scratch_h: int
    ) -> Pair | MultipleResults[Pair]:
        """A slot is one buffer whoever lends it (G12), both ways: a restore of ``h`` is
        queued into the scratch slot the pool hands out next; a midstep reservation over it
        is refused (the slot goes back); the restore is suspended and its lease released;
        the reservation now gets the slot; the spent lease's resume and a new restore into
        the slot are refused with SlotBusyError (the scratch check first). The reservation
        joins ``scratch``."""
        name = "scratch_over_restore"
        ref_slots = self.sides[0].slots
        if ref_slots is None or not ref_slots.free_slots:
            return multiple()
        slot = min(ref_slots.free_slots)
        seq = self._seq(s)
        snap = self.snap_ref
        fresh = [
            k
            for k in range(1, self.config.hashes + 1)
            if k not in snap.index
            and k not in {hh for _, hh in snap.pending_boundaries}
            and k not in {hh for hh, _ in snap.scratch_queued}
            and k not in {r.prefix_hash for r in snap.records.values()}
        ]
        sh = scratch_h if scratch_h in fresh or not fresh else fresh[0]
        positions = [(pos, sh)]
        reserve = f"reserve_midstep({seq!r}, {positions!r})"
        self._both(name, f"begin_restore({h}, {slot})", _call_coord("begin_restore", h, slot))
        first = self._both(name, reserve, lambda x: x.coord.reserve_midstep(seq, list(positions)))
        if first.ok and first.ref:
            # the restore was not queued (``h`` not READY): the slot was lent; give it back
            for triple in first.ref:
                self.scratch_latest[triple[0]] = triple
            res = Pair(first.ref, first.sut)
            self._both(
                name,
                f"cancel_midstep({res.ref!r})",
                lambda x: x.coord.cancel_midstep(list(x.pick(res))),
            )
        out = self._both(
            name,
            f"suspend_queued_restore({slot})",
            lambda x: x.coord.suspend_queued_restore(slot),
        )
        lease: Pair | None = None
        if out.ok and out.ref is not None:
            lease = Pair(out.ref, out.sut)
            self.lease_pairs.append(lease)
            shown = f"({lease.ref!r})"
            self._both(
                name,
                f"release_suspended_restore{shown}",
                lambda x: x.coord.release_suspended_restore(x.pick(lease)),
            )
        got = self._both(name, reserve, lambda x: x.coord.reserve_midstep(seq, list(positions)))
        if lease is not None:
            spent = lease
            self._both(
                name,
                f"resume_suspended_restore({spent.ref!r})",
                lambda x: x.coord.resume_suspended_restore(x.pick(spent)),
            )
        self._both(name, f"begin_restore({h}, {slot})", _call_coord("begin_restore", h, slot))
        if got.ok and got.ref:
            for triple in got.ref:
                self.scratch_latest[triple[0]] = triple
            return Pair(got.ref, got.sut)
        return multiple()
