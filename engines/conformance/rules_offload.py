"""Rules of offload and leases: the CPU tier's takes and reports (lost, duplicated, late and
out of order), explicit source leases, clock jumps and the reclaimer, and re-wiring the
tier."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import MultipleResults, consumes, multiple, precondition, rule

from .config import Pair
from .lockstep import OPS, _call_coord, _call_picked, _Lockstep
from .strategies import READY_H, H


class OffloadRules(_Lockstep):
    """Offload and leases: the CPU tier's reports, in any order."""

    # -- offload and leases (the CPU tier's reports, in any order) ----------------------

    @precondition(lambda self: self.tier is not None)
    @rule(target=OPS, room=st.integers(-1, 2))
    def take_offload(self, room: int) -> MultipleResults[Pair]:
        """Hand nominated images to the tier, which has ``room`` free places: it passes
        ``max_inflight = outstanding ops + room`` (at least 0, at most
        ``max_offload_inflight``; ``room <= 0``: full). Each op joins the ``op`` bundle."""
        limit = max(
            0, min(self.config.max_offload_inflight, len(self.snap_ref.offload_pins) + room)
        )
        out = self._both(
            "take_offload",
            f"take_offload_stores({limit})",
            lambda x: x.coord.take_offload_stores(limit),
        )
        if not out.ok:
            return multiple()
        pairs = [Pair(r[0], s[0]) for r, s in zip(out.ref, out.sut, strict=True)]
        self.op_pairs.extend(pairs)
        return multiple(*pairs)

    @precondition(lambda self: self.config.leases)
    @rule(target=OPS, h=READY_H, room=st.one_of(st.integers(0, 2), st.none()))
    def acquire(self, h: int, room: int | None) -> Pair | MultipleResults[Pair]:
        """Lease ``h``'s image for an external transfer (never reclaimed). The caller has
        ``room`` free places, as in ``take_offload``: it passes ``max_inflight =
        outstanding ops + room`` (at most ``max_offload_inflight``; ``room == 0``: full, so
        the bound is hit often), or (``room`` None) no bound."""
        limit = (
            None
            if room is None
            else max(
                0, min(self.config.max_offload_inflight, len(self.snap_ref.offload_pins) + room)
            )
        )
        out = self._both(
            "acquire",
            f"acquire_checkpoint_source({h}, max_inflight={limit})",
            lambda x: x.coord.acquire_checkpoint_source(h, max_inflight=limit),
        )
        if out.ok and out.ref is not None:
            pair = Pair(out.ref[0], out.sut[0])
            self.op_pairs.append(pair)
            return pair
        return multiple()

    @rule(op=OPS, times=st.integers(1, 2), stall=st.booleans())
    def release_source(self, op: Pair, times: int, stall: bool) -> None:
        """Phase-1 report (the gather drained), sent ``times`` times (a duplicate); late
        and duplicated ones are ignored. With ``stall``, the terminal report does not come
        in time: the clock jumps two timeouts and the reclaimer runs, so a later settle of
        this op is a late report."""
        for _ in range(times):
            self._both(
                "release_source",
                f"release_offload_store_source({op.ref!r})",
                _call_picked("release_offload_store_source", op),
            )
        if stall:
            timeout = self.config.timeout_s
            self.clock.now += 2 * timeout
            self._both(
                "release_source",
                f"reclaim_stale_offload_pins({timeout})",
                _call_coord("reclaim_stale_offload_pins", timeout),
            )

    @rule(op=OPS)
    def settle(self, op: Pair) -> None:
        """Terminal report; asks ``was_reclaimed`` first, as the tier does."""
        self._both_op("settle", "was_reclaimed", op)
        self._both_op("settle", "settle_offload_store", op)

    @rule(op=OPS)
    def report(self, op: Pair) -> None:
        """Both reports in order (the normal path): release the source, then settle."""
        self._both_op("report", "release_offload_store_source", op)
        self._both_op("report", "settle_offload_store", op)

    @rule(op=OPS)
    def settle_first(self, op: Pair) -> None:
        """Reports out of order: the terminal report, then a late phase-1 report."""
        self._both_op("settle_first", "settle_offload_store", op)
        self._both_op("settle_first", "release_offload_store_source", op)

    @rule(op=consumes(OPS))
    def lose_report(self, op: Pair) -> None:
        """The tier's reports for ``op`` are lost (never sent): only the reclaimer can take
        its pin back (a lease's pin stays until the end-of-run drain)."""
        del op

    @precondition(lambda self: self.tier is not None or self.config.leases)
    @rule(
        factor=st.sampled_from([1.0, 0.5, 2.0, 0.0, -1.0]),
        jump=st.sampled_from([1.0, 2.0, 0.0, 0.25, -0.5]),
    )
    def reclaim(self, factor: float, jump: float) -> None:
        """The clock jumps ``jump * timeout_s`` (a negative jump: the clock was set back,
        so pins are no longer in the order of their times), then
        ``reclaim_stale_offload_pins(factor * timeout_s)`` (``factor <= 0`` disables the
        reclaim)."""
        self.clock.now += jump * self.config.timeout_s
        timeout = factor * self.config.timeout_s
        self._both(
            "reclaim",
            f"reclaim_stale_offload_pins({timeout})",
            lambda x: x.coord.reclaim_stale_offload_pins(timeout),
        )

    @precondition(lambda self: self.tier is not None)
    # "vote" and "sink" are listed twice: switching the sink off stops nominations until a
    # later "sink", so it is drawn less often than the calls that keep the tier busy.
    @rule(mode=st.sampled_from(["vote", "sink", "vote", "sink", "load_only", "detach"]), h=H)
    def attach_offload(self, mode: str, h: int) -> None:
        """Re-wire the tier: sink on, load only (no nominations), or detached; or (``vote``)
        the tier starts or stops claiming it could serve ``h`` (no store call)."""
        if mode == "vote":
            assert self.tier is not None
            self.tier.served ^= {h}
            return
        tier = None if mode == "detach" else self.tier
        sink = mode == "sink"
        self._both(
            "attach_offload",
            f"attach_offload({'None' if tier is None else 'tier'}, sink={sink})",
            lambda x: x.coord.attach_offload(tier, sink=sink),
        )
