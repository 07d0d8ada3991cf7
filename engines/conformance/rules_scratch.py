"""Rules of midstep scratch: reserve scratch slots for interior boundaries (the reservation
joins the ``scratch`` bundle), publish or cancel them, a second use of a spent one."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import MultipleResults, multiple, precondition, rule

from .config import Pair
from .lockstep import SCRATCH, _call_picked, _Lockstep
from .strategies import SEQ, _cfg, _positions


class ScratchRules(_Lockstep):
    """Midstep scratch reservations."""

    # -- midstep scratch --------------------------------------------------------------------

    @precondition(lambda self: self.config.scratch_slots > 0)
    @rule(
        target=SCRATCH,
        s=SEQ,
        positions=_cfg(_positions),
        then=st.sampled_from(["hold", "publish", "cancel"]),
    )
    def reserve_midstep(
        self, s: int, positions: list[tuple[int, int]], then: str
    ) -> Pair | MultipleResults[Pair]:
        """Borrow scratch slots for interior boundaries; the reservation joins ``scratch``
        (a used one stays there: publishing or cancelling it again is a second use). With
        ``then``, the forward's outcome follows at once: ``publish`` or ``cancel``."""
        seq = self._seq(s)
        out = self._both(
            "reserve_midstep",
            f"reserve_midstep({seq!r}, {positions!r})",
            lambda x: x.coord.reserve_midstep(seq, list(positions)),
        )
        if not (out.ok and out.ref):
            return multiple()
        for triple in out.ref:
            self.scratch_latest[triple[0]] = triple
        res = Pair(out.ref, out.sut)
        if then != "hold":
            method = f"{then}_midstep"
            self._both("reserve_midstep", f"{method}({res.ref!r})", _call_picked(method, res))
        return res

    @rule(res=SCRATCH)
    def publish_midstep(self, res: Pair) -> None:
        """The forward wrote the slots (a spent reservation raises UnknownOperationError, or
        StaleReservationError once its slot was lent again)."""
        self._both(
            "publish_midstep",
            f"publish_midstep({res.ref!r})",
            lambda x: x.coord.publish_midstep(list(x.pick(res))),
        )

    @rule(res=SCRATCH)
    def cancel_midstep(self, res: Pair) -> None:
        """The forward never ran: return the slots."""
        self._both(
            "cancel_midstep",
            f"cancel_midstep({res.ref!r})",
            lambda x: x.coord.cancel_midstep(list(x.pick(res))),
        )
