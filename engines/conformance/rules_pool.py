"""Rules of the KV pool: index changes (KV eviction, admin reset) and KV pressure from other
owners (allocations and their release, whole or, as bad input, in part or under another
owner's tag)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from pagedstate.models.world import KV_OWNER

from .config import Pair
from .lockstep import _call_coord, _Lockstep, _release_kv
from .strategies import KNOWN_H, _cfg, _index_into, _kv_units


class PoolRules(_Lockstep):
    """The KV pool: index changes and KV pressure from other owners."""

    # -- index changes (KV eviction, admin reset) --------------------------------------

    @rule(h=KNOWN_H)
    def unindex(self, h: int) -> None:
        """The KV prefix ``h`` was evicted (at any time: COPYING, READY, pinned...)."""
        self._both("unindex", f"unindex({h})", lambda x: x.coord.unindex(h))

    @precondition(lambda self: self.calls_since_clear >= 30)
    @rule(complete=st.booleans())
    def clear_index(self, complete: bool) -> None:
        """Admin reset of the index (``complete``: then complete the batch in flight).

        Enabled 30 calls after the last reset: a reset wipes the state the other rules
        build, so it must not be drawn as often as they are. The argument also keeps it
        from being Hypothesis's first-choice rule (rules without arguments come first in
        its order, and the first is drawn most)."""
        self.calls_since_clear = 0
        self._both("clear_index", "clear_index()", _call_coord("clear_index"))
        if complete:
            self._both(
                "clear_index", "complete_previous_batch()", _call_coord("complete_previous_batch")
            )

    # -- KV pressure from other owners --------------------------------------------------

    @precondition(lambda self: self.config.kv_tenants > 0)
    @rule(n=_cfg(_kv_units))
    def kv_alloc(self, n: int) -> None:
        """A KV block allocation of another owner: ``ensure_free_units(n)`` (evicting
        unpinned READY checkpoints), then ``pool.reserve_units(n, ("live-kv", k))``. When
        ``kv_tenants`` allocations are already held, the oldest is returned first (KV churn:
        pressure comes and goes instead of filling the pool for good)."""
        if len(self.kv) >= self.config.kv_tenants:
            old, units = self.kv.pop(0)
            self._both(
                "kv_alloc", f"pool.release_units({units.ref}, {old!r})", _release_kv(units, old)
            )
        owner = (KV_OWNER, self.kv_next)
        self.kv_next += 1
        made = self._both(
            "kv_alloc", f"ensure_free_units({n})", lambda x: x.coord.ensure_free_units(n)
        )
        if not (made.ok and made.ref):
            return
        got = self._both(
            "kv_alloc",
            f"pool.reserve_units({n}, {owner!r})",
            lambda x: x.pool.reserve_units(n, owner),
        )
        if got.ok and got.ref is not None:
            self.kv.append((owner, Pair(list(got.ref), list(got.sut))))

    @precondition(lambda self: bool(self.kv))
    @rule(i=_index_into("kv"), how=st.sampled_from(["whole", "partial", "wrong_owner"]))
    def kv_free(self, i: int, how: str) -> None:
        """Another owner returns KV allocation ``i``: whole, or (bad input) only part of it
        (PartialReleaseError, G9) or under another owner's tag (WrongOwnerError)."""
        owner, units = self.kv[i]
        if how == "whole":
            del self.kv[i]
            self._both(
                "kv_free",
                f"pool.release_units({units.ref}, {owner!r})",
                _release_kv(units, owner),
            )
        elif how == "partial":
            part = Pair(units.ref[:-1], units.sut[:-1])
            self._both(
                "kv_free",
                f"pool.release_units({part.ref}, {owner!r})",
                _release_kv(part, owner),
            )
        else:
            wrong = (KV_OWNER, -1 - i)
            self._both(
                "kv_free",
                f"pool.release_units({units.ref}, {wrong!r})",
                _release_kv(units, wrong),
            )
