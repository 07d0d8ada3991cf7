"""Rules of the engine's pass: boundaries filed, the drain and the completion, a whole pass
with an abort or reset injected (:data:`PASS_FAULTS`), and a midstep pass that fills one
drain; ``warm_up`` (the initial rule) starts from READY records."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from .config import KitSeq, Pair
from .lockstep import _call_coord, _call_picked, _Lockstep
from .strategies import READY_H, REG_SEQ, SEQ, SLOT, H, _cfg, _positions

#: Where :meth:`ConformanceMachine.engine_pass` injects an abort or reset: ``*_pending``
#: after the boundary is filed and before the drain, ``*_in_flight`` after the drain and
#: before the completion; ``no_completion`` leaves the batch in flight.
PASS_FAULTS = (
    "none",
    "unindex_pending",
    "forget_pending",
    "clear_pending",
    "unindex_in_flight",
    "clear_in_flight",
    "forget_in_flight",
    "kv_pressure_in_flight",
    "no_completion",
)


class RecordRules(_Lockstep):
    """Records and the drain: a pass of the engine (boundaries, drain, completion)."""

    # -- a pass of the engine: boundaries, drain, completion ---------------------------

    @rule(s=SEQ, h=H, blocks=st.integers(0, 3))
    def checkpoint(self, s: int, h: int, blocks: int) -> None:
        """File boundary ``h`` of a sequence (supersedes its older one, G1)."""
        seq = self._seq(s)
        self._both(
            "checkpoint",
            f"checkpoint({seq!r}, {blocks}, {h})",
            lambda x: x.coord.checkpoint(seq, blocks, h),
        )

    @rule(s=SEQ)
    def forget(self, s: int) -> None:
        """Abort: the sequence leaves its slot (pending boundary and queued restore go)."""
        seq = self._seq(s)
        self._both("forget", f"forget_pending({seq!r})", lambda x: x.coord.forget_pending(seq))

    @initialize(hs=st.lists(H, min_size=1, max_size=3, unique=True))
    def warm_up(self, hs: list[int]) -> None:
        """Start from READY records: file a boundary of ``h`` for sequence ``i`` (one per
        regular sequence, round robin), then one drain and one completion."""
        for i, h in enumerate(hs):
            seq = self.seqs[i % self.config.seqs]
            self._both(
                "warm_up", f"checkpoint({seq!r}, 1, {h})", _call_coord("checkpoint", seq, 1, h)
            )
        if hs:
            self._both("warm_up", "take_checkpoint_ops()", lambda x: x.coord.take_checkpoint_ops())
            self._both(
                "warm_up", "complete_previous_batch()", lambda x: x.coord.complete_previous_batch()
            )

    @rule(
        boundaries=st.lists(st.tuples(REG_SEQ, H), min_size=1, max_size=3),
        fault=st.sampled_from(("none", "none", *PASS_FAULTS)),
    )
    def engine_pass(self, boundaries: list[tuple[int, int]], fault: str) -> None:
        """A whole engine pass in one step: file a boundary ``(sequence, h)`` for each of
        ``boundaries``, drain, and complete the batch (the common path, so READY records
        appear often), with an abort or reset injected at one point of it
        (:data:`PASS_FAULTS`; it acts on the first boundary's sequence and hash)."""
        name = "engine_pass"
        for s, h in boundaries:
            seq = self._seq(s)
            self._both(name, f"checkpoint({seq!r}, 1, {h})", _call_coord("checkpoint", seq, 1, h))
        seq, h = self._seq(boundaries[0][0]), boundaries[0][1]
        if fault.endswith("_pending"):
            self._pass_fault(fault, seq, h)
        self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
        if fault.endswith("_in_flight"):
            self._pass_fault(fault, seq, h)
        if fault != "no_completion":
            self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))

    def _pass_fault(self, fault: str, seq: KitSeq, h: int) -> None:
        kind = fault.rsplit("_", 2)[0] if fault.endswith("_in_flight") else fault.rsplit("_", 1)[0]
        name = "engine_pass"
        if kind == "unindex":
            self._both(name, f"unindex({h})", _call_coord("unindex", h))
        elif kind == "clear":
            self._both(name, "clear_index()", _call_coord("clear_index"))
        elif kind == "forget":
            self._both(name, f"forget_pending({seq!r})", _call_coord("forget_pending", seq))
        elif kind == "kv_pressure":
            n = self.config.units
            self._both(name, f"ensure_free_units({n})", _call_coord("ensure_free_units", n))

    @precondition(lambda self: self.config.scratch_slots > 0)
    @rule(
        s=REG_SEQ,
        positions=_cfg(_positions),
        boundary=st.tuples(REG_SEQ, H),
        restore=st.tuples(SLOT, READY_H),
        complete=st.booleans(),
    )
    def midstep_pass(
        self,
        s: int,
        positions: list[tuple[int, int]],
        boundary: tuple[int, int],
        restore: tuple[int, int],
        complete: bool,
    ) -> None:
        """A pass that fills one drain: midstep scratch stores reserved and published, a
        boundary filed and a restore queued, then the drain, so that the per-batch budget
        is met and exceeded (the scratch stores left over wait: ``issue[over_budget]``)
        and the order of the drain's ops is compared with all three kinds in it."""
        name = "midstep_pass"
        seq = self._seq(s)
        out = self._both(
            name,
            f"reserve_midstep({seq!r}, {positions!r})",
            lambda x: x.coord.reserve_midstep(seq, list(positions)),
        )
        if out.ok and out.ref:
            for triple in out.ref:
                self.scratch_latest[triple[0]] = triple
            res = Pair(out.ref, out.sut)
            self._both(name, f"publish_midstep({res.ref!r})", _call_picked("publish_midstep", res))
        bseq, h = self._seq(boundary[0]), boundary[1]
        self._both(name, f"checkpoint({bseq!r}, 1, {h})", _call_coord("checkpoint", bseq, 1, h))
        slot, rh = restore
        self._both(name, f"begin_restore({rh}, {slot})", _call_coord("begin_restore", rh, slot))
        self._both(name, "take_checkpoint_ops()", _call_coord("take_checkpoint_ops"))
        if complete:
            self._both(name, "complete_previous_batch()", _call_coord("complete_previous_batch"))

    @rule()
    def drain(self) -> None:
        """The drain of a non-empty batch: begin stores, take restores, issue scratch."""
        self._both("drain", "take_checkpoint_ops()", lambda x: x.coord.take_checkpoint_ops())

    @rule()
    def complete(self) -> None:
        """The last drain's batch was issued: publish stores, unpin restores."""
        self._both(
            "complete", "complete_previous_batch()", lambda x: x.coord.complete_previous_batch()
        )
