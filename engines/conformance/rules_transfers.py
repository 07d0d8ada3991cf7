"""Rules of transfer reservations: reserve under a fresh owner or again under a used one,
release (late ones ignored) and adopt a completed external image."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis.stateful import MultipleResults, multiple, precondition, rule

from .lockstep import OWNERS, _Lockstep
from .strategies import KNOWN_H


class TransferRules(_Lockstep):
    """Transfer reservations of external loads."""

    # -- transfers ------------------------------------------------------------------------

    @precondition(lambda self: len(self.snap_ref.transfers) < self.config.transfers)
    @rule(target=OWNERS)
    def reserve_transfer(self) -> Hashable | MultipleResults[Hashable]:
        """Reserve one image's units for an external load under a fresh owner."""
        owner = ("load", self.transfer_next)
        self.transfer_next += 1
        out = self._both(
            "reserve_transfer",
            f"reserve_transfer_units({owner!r})",
            lambda x: x.coord.reserve_transfer_units(owner),
        )
        if out.ok and out.ref is not None:
            return owner
        return multiple()

    @rule(owner=OWNERS)
    def reserve_transfer_again(self, owner: Hashable) -> None:
        """Reserve under an owner already used (live: refused; spent: reused, within the
        ``transfers`` bound on live reservations)."""
        live = owner in self.snap_ref.transfers
        if not live and len(self.snap_ref.transfers) >= self.config.transfers:
            return
        self._both(
            "reserve_transfer_again",
            f"reserve_transfer_units({owner!r})",
            lambda x: x.coord.reserve_transfer_units(owner),
        )

    @rule(owner=OWNERS)
    def release_transfer(self, owner: Hashable) -> None:
        """Release a reservation (late: an old generation, ignored)."""
        self._both(
            "release_transfer",
            f"release_transfer_units({owner!r})",
            lambda x: x.coord.release_transfer_units(owner),
        )

    @rule(owner=OWNERS, h=KNOWN_H)
    def adopt_transfer(self, owner: Hashable, h: int) -> None:
        """Publish a completed external image as ``h`` (fresh or duplicate)."""
        self._both(
            "adopt_transfer",
            f"adopt_transfer_units({owner!r}, {h})",
            lambda x: x.coord.adopt_transfer_units(owner, h),
        )
