"""Macro rules: scenarios too long for random steps (many re-stamps of one record, two
nominees deferred in one take, a reclaim after the clock went back with a lease
outstanding), each chaining public calls that are compared like any other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import MultipleResults, multiple, precondition, rule

from pagedstate.spec.types import ManualCompletion

from .config import Pair, _Side
from .lockstep import OPS, _call_coord, _Lockstep
from .strategies import REG_SEQ, SLOT, H

#: How far ``lease_and_clock_back`` moves the clock after setting it back half a timeout,
#: in timeouts: only the pin taken after the set-back stale (1.25: the threshold lies
#: between two pins out of time order); every pin stale (2.0); the pin taken after the
#: set-back exactly at the threshold (1.0, stale: "at or before now - timeout").
RECLAIM_JUMPS = (1.25, 2.0, 1.0)


class MacroRules(_Lockstep):
    """Scenarios too long for random steps."""

    # -- scenarios too long for random steps (macro rules) ---------------------------------
    # Each chains public calls into a situation that random single steps reach too rarely
    # for a bounded run: many re-stamps of one record, two nominees deferred in one take, a
    # reclaim after the clock went back with a lease outstanding. Every call is compared
    # like any other; when the store's state does not allow a step (no room, a busy slot),
    # the call is refused on both sides and the scenario goes on from there.

    def _file(self, name: str, hs: Sequence[int]) -> None:
        """One engine pass filing a boundary of each of ``hs`` (sequence ``i`` files
        ``hs[i]``, round robin over the regular sequences), then the drain and the
        completion: the records go READY in that order (oldest first)."""
        for i, h in enumerate(hs):
            seq = self.seqs[i % self.config.seqs]
            self._both(name, f"checkpoint({seq!r}, 1, {h})", _call_coord("checkpoint", seq, 1, h))
        self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
        self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))

    def _sink_on(self, name: str) -> None:
        tier = self.tier
        self._both(
            name,
            "attach_offload(tier, sink=True)",
            lambda x: x.coord.attach_offload(tier, sink=True),
        )

    def _take_offload(self, name: str, room: int) -> list[Pair]:
        limit = max(
            0, min(self.config.max_offload_inflight, len(self.snap_ref.offload_pins) + room)
        )
        out = self._both(
            name, f"take_offload_stores({limit})", lambda x: x.coord.take_offload_stores(limit)
        )
        if not out.ok:
            return []
        pairs = [Pair(r[0], s[0]) for r, s in zip(out.ref, out.sut, strict=True)]
        self.op_pairs.extend(pairs)
        return pairs

    @precondition(lambda self: not self.stormed)
    @rule(
        hs=st.lists(H, min_size=2, max_size=2, unique=True),
        slot=SLOT,
        n=st.integers(34, 48),
    )
    def restore_storm(self, hs: list[int], slot: int, n: int) -> None:
        """File ``hs[0]`` then ``hs[1]`` (so ``hs[0]`` is the older record), restore
        ``hs[1]`` ``n`` times (each restore re-stamps it: a store that keeps a victim heap
        by stamp piles up stale entries and compacts it), then ask for one image's worth of
        units beyond what is free: the one victim must be the least recently used record.
        Once per test case (it is long)."""
        name = "restore_storm"
        self.stormed = True
        old, hot = hs
        self._file(name, [old, hot])
        for _ in range(n):
            self._both(
                name, f"begin_restore({hot}, {slot})", _call_coord("begin_restore", hot, slot)
            )
            self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
            self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))
        want = len(self.snap_ref.free) + self.config.units_per_checkpoint
        self._both(name, f"ensure_free_units({want})", _call_coord("ensure_free_units", want))

    @precondition(lambda self: self.tier is not None)
    @rule(target=OPS, hs=st.lists(H, min_size=2, max_size=2, unique=True))
    def deferred_nominees(self, hs: list[int]) -> MultipleResults[Pair]:
        """Two nominees deferred in one take: ``hs`` are filed and handed to the tier,
        dropped from the index while their stores are in flight (the records wait, pinned),
        filed again (new nominees of hashes whose operations are outstanding), and a take
        defers both; once the first operations are reported, a take hands the two out in
        their nomination order."""
        name = "deferred_nominees"
        self._sink_on(name)
        self._file(name, hs)
        first = self._take_offload(name, 2)
        for h in hs:
            self._both(name, f"unindex({h})", _call_coord("unindex", h))
        self._file(name, hs)
        later = self._take_offload(name, 2)
        for op in first:
            self._both_op(name, "release_offload_store_source", op)
            self._both_op(name, "settle_offload_store", op)
        later += self._take_offload(name, 2)
        return multiple(*first, *later)

    @precondition(lambda self: self.tier is not None and self.config.leases)
    @rule(
        target=OPS,
        hs=st.lists(H, min_size=3, max_size=3, unique=True),
        jump=st.sampled_from(RECLAIM_JUMPS),
    )
    def lease_and_clock_back(self, hs: list[int], jump: float) -> MultipleResults[Pair]:
        """A reclaim after the clock went back, with a lease outstanding: ``hs`` are filed
        (and nominated, the sink on); one store is taken (the oldest nominee), ``hs[2]`` is
        leased, the clock is set back half a timeout and another store is taken (pinned
        earlier than the first: out of order), then the clock jumps ``jump`` timeouts
        (:data:`RECLAIM_JUMPS`) and the reclaimer runs. After two timeouts it retires both
        stores; after 1.25 only the second (pinned earlier), so a reclaimer that walks the
        pins in take order and stops at the first young one misses it; after one timeout
        the second is stale just at the threshold. Never the lease."""
        name = "lease_and_clock_back"
        timeout = self.config.timeout_s
        self._sink_on(name)
        self._file(name, hs)
        got = self._take_offload(name, 1)
        lease_h = hs[2]
        out = self._both(
            name,
            f"acquire_checkpoint_source({lease_h})",
            lambda x: x.coord.acquire_checkpoint_source(lease_h),
        )
        if out.ok and out.ref is not None:
            pair = Pair(out.ref[0], out.sut[0])
            self.op_pairs.append(pair)
            got.append(pair)
        self.clock.now -= 0.5 * timeout
        got += self._take_offload(name, 1)
        self.clock.now += jump * timeout
        self._both(
            name,
            f"reclaim_stale_offload_pins({timeout})",
            _call_coord("reclaim_stale_offload_pins", timeout),
        )
        return multiple(*got)

    # -- directed order scenarios of the overlapped style ------------------------------

    def _fresh(self, hs: Sequence[int]) -> list[int]:
        """``hs`` with each hash that is stored, pending, queued as scratch or held by a
        record replaced by a fresh one where there is one (so that filing it stores it)."""
        snap = self.snap_ref
        busy = (
            set(snap.index)
            | {h for _, h in snap.pending_boundaries}
            | {h for h, _ in snap.scratch_queued}
            | {r.prefix_hash for r in snap.records.values()}
        )
        spare = [k for k in range(1, self.config.hashes + 1) if k not in busy and k not in hs]
        out = []
        for h in hs:
            if h in busy and spare:
                h = spare.pop(0)
            out.append(h)
        return out

    @precondition(lambda self: self.config.overlap)
    @rule(hs=st.lists(H, min_size=2, max_size=2, unique=True), via_store=st.booleans())
    def wait_two_batches(self, hs: list[int], via_store: bool) -> None:
        """Two batches complete with tokens not done: ``hs[0]`` is filed, drained and
        completed with a waiting token, then ``hs[1]`` likewise (fresh hashes where there
        are some, so that both batches publish an image); then
        ``settle_completions(wait=True)`` (``via_store``: on the store) must synchronize
        every token outstanding, not only the oldest: each side has its own tokens, so a
        token the store under test did not wait for is still not done where the
        reference's is."""
        name = "wait_two_batches"
        for i, h in enumerate(self._fresh(hs)):
            seq = self.seqs[i % self.config.seqs]
            self._both(name, f"checkpoint({seq!r}, 1, {h})", _call_coord("checkpoint", seq, 1, h))
            self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
            token = Pair(ManualCompletion(False), ManualCompletion(False))
            self.token_pairs.append(token)
            self._both(
                name,
                f"complete_previous_batch(completion={token.ref!r})",
                _complete_with(token),
            )
        if via_store and self.config.store_calls:
            self._both(
                name,
                "store.settle_completions(wait=True)",
                lambda x: x.store.settle_completions(wait=True),
            )
        else:
            self._both(
                name,
                "settle_completions(wait=True)",
                lambda x: x.coord.settle_completions(wait=True),
            )

    @precondition(lambda self: self.config.overlap and self.config.scratch_slots >= 2)
    @rule(s=REG_SEQ, hs=st.lists(H, min_size=2, max_size=2, unique=True))
    def scratch_wait_two(self, s: int, hs: list[int]) -> None:
        """Two scratch stores wait for a later forward in one drain: a reservation of two
        positions (fresh hashes where there are some) is published naming the forward
        after the next one, then the next drain runs: both stay queued, in their order
        (the snapshot's ``scratch_queued`` is compared); a later drain, after that
        forward, issues them."""
        name = "scratch_wait_two"
        seq = self._seq(s)
        positions = [(i + 1, h) for i, h in enumerate(self._fresh(hs))]
        out = self._both(
            name,
            f"reserve_midstep({seq!r}, {positions!r})",
            lambda x: x.coord.reserve_midstep(seq, list(positions)),
        )
        if not (out.ok and out.ref):
            return
        for triple in out.ref:
            self.scratch_latest[triple[0]] = triple
        res = Pair(out.ref, out.sut)
        last = self.snap_ref.last_forward
        ahead = (0 if last is None else last + 1) + 1
        self._both(
            name,
            f"publish_midstep({res.ref!r}, forward={ahead})",
            lambda x: x.coord.publish_midstep(list(x.pick(res)), forward=ahead),
        )
        self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))


def _complete_with(token: Pair) -> Callable[[_Side], Any]:
    """``complete_previous_batch(completion=<the side's own token of token>)``."""
    return lambda x: x.coord.complete_previous_batch(completion=x.pick(token))
