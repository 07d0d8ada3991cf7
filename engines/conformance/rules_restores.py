"""Rules of restores: queue, cancel, suspend (a lease joins the ``lease`` bundle), resume and
release a suspended restore."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import MultipleResults, multiple, precondition, rule

from .config import Pair
from .lockstep import LEASES, _Lockstep
from .strategies import ANY_BUSY_SLOT, BUSY_SLOT, READY_H, SLOT


class RestoreRules(_Lockstep):
    """Restores: queued, cancelled, suspended, resumed and released."""

    # -- restores --------------------------------------------------------------------------

    @rule(slot=st.one_of(SLOT, ANY_BUSY_SLOT), h=READY_H)
    def begin_restore(self, slot: int, h: int) -> None:
        """Queue a restore of ``h`` into ``slot`` (SlotBusyError when the slot has a queued,
        in-flight or suspended restore, G4: such slots are drawn on purpose)."""
        self._both(
            "begin_restore", f"begin_restore({h}, {slot})", lambda x: x.coord.begin_restore(h, slot)
        )

    @precondition(lambda self: self.config.store_calls)
    @rule(slot=BUSY_SLOT)
    def cancel_restore(self, slot: int) -> None:
        """Abort: cancel the queued restore into ``slot`` (store level)."""
        self._both(
            "cancel_restore",
            f"store.cancel_queued_restore({slot})",
            lambda x: x.store.cancel_queued_restore(slot),
        )

    @precondition(lambda self: self.config.suspend)
    @rule(target=LEASES, slot=BUSY_SLOT)
    def suspend(self, slot: int) -> Pair | MultipleResults[Pair]:
        """Suspend the queued restore into ``slot``; its lease joins the ``lease`` bundle."""
        out = self._both(
            "suspend",
            f"suspend_queued_restore({slot})",
            lambda x: x.coord.suspend_queued_restore(slot),
        )
        if out.ok and out.ref is not None:
            pair = Pair(out.ref, out.sut)
            self.lease_pairs.append(pair)
            return pair
        return multiple()

    @precondition(lambda self: self.config.suspend)
    @rule(target=LEASES, slot=SLOT, h=READY_H)
    def restore_and_suspend(self, slot: int, h: int) -> Pair | MultipleResults[Pair]:
        """Queue a restore of ``h`` into ``slot`` and suspend it at once (a request paused
        before its batch ran); the lease joins the ``lease`` bundle."""
        self._both(
            "restore_and_suspend",
            f"begin_restore({h}, {slot})",
            lambda x: x.coord.begin_restore(h, slot),
        )
        out = self._both(
            "restore_and_suspend",
            f"suspend_queued_restore({slot})",
            lambda x: x.coord.suspend_queued_restore(slot),
        )
        if out.ok and out.ref is not None:
            pair = Pair(out.ref, out.sut)
            self.lease_pairs.append(pair)
            return pair
        return multiple()

    @rule(lease=LEASES)
    def resume(self, lease: Pair) -> None:
        """Resume a suspended restore (a spent lease raises LeaseReusedError, G3)."""
        self._both(
            "resume",
            f"resume_suspended_restore({lease.ref!r})",
            lambda x: x.coord.resume_suspended_restore(x.pick(lease)),
        )

    @rule(lease=LEASES)
    def release_lease(self, lease: Pair) -> None:
        """Release a suspended restore and its pin (a second use raises, G3)."""
        self._both(
            "release_lease",
            f"release_suspended_restore({lease.ref!r})",
            lambda x: x.coord.release_suspended_restore(x.pick(lease)),
        )
