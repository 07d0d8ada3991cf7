"""The machine: :class:`ConformanceMachine`, the rule mixins by topic on the lockstep core,
with the rules that belong to no one topic (read-only queries, bad inputs, the reset to
quiescence) and the end-of-case teardown."""

from __future__ import annotations

from typing import Any

from hypothesis import currently_in_test_context, target
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from pagedstate.models.world import drain_calls, quiescence_problems

from .bad_inputs import (
    _OVERLAP_BAD_INPUTS,
    _OVERLAP_STORE_BAD_INPUTS,
    _STORE_BAD_INPUTS,
    BAD_INPUTS,
)
from .config import Pair
from .lockstep import _call_coord, _call_store, _drain_call
from .rules_macro import MacroRules
from .rules_offload import OffloadRules
from .rules_overlap import OverlapRules
from .rules_pool import PoolRules
from .rules_records import RecordRules
from .rules_restores import RestoreRules
from .rules_scratch import ScratchRules
from .rules_transfers import TransferRules
from .strategies import SEQ, SLOT, H, _block_hashes, _cfg, _counts

_QUERIES = (
    "resumable_hit",
    "contains",
    "restore_queued_for",
    "has_available_units",
    "has_offload_pins",
    "checkpoint_fates",
)
_STORE_QUERIES = ("lookup", "contains_or_pending", "changed_since")
#: The overlapped style's queries (SPEC D.13, G17), asked with ``overlap`` only.
_OVERLAP_QUERIES = ("outstanding", "is_idle")
_BAD_CASES = (
    sorted(BAD_INPUTS)
    + sorted(_STORE_BAD_INPUTS)
    + sorted(_OVERLAP_BAD_INPUTS)
    + sorted(_OVERLAP_STORE_BAD_INPUTS)
)


# The rules live in the mixins by topic, on the lockstep core (``_Lockstep``). Hypothesis
# collects a machine's rules with ``inspect.getmembers`` (sorted by name), so how they are
# spread over the mixins, and the mixins' order here, does not change what it draws.
class ConformanceMachine(
    RecordRules,
    RestoreRules,
    PoolRules,
    OffloadRules,
    MacroRules,
    TransferRules,
    ScratchRules,
    OverlapRules,
):
    """Lockstep of a store under test against the reference model.

    Subclass it (or let :func:`conformance_machine` do it) and set the class attributes:

    Attributes:
        coordinator_factory: builds the coordinator under test (reference signature).
        pool_factory: ``pool_factory(num_units)`` builds the pool handed to it.
        config: the :class:`ConformanceConfig`.
        rows_hit: table-row labels the reference took, over every test case this class ran
            (each subclass has its own).
        events_by_rule: ``rule name -> {(machine, event)}`` observed, over every test case.
        errors_by_rule: ``rule name -> {exception class name}`` both stores raised, over
            every test case.

    Instances hold both coordinators (``ref``, ``sut``), their last snapshots
    (``snap_ref``, ``snap_sut``), the shared :class:`~pagedstate.models.world.ManualClock`
    and the environment's handles.
    """

    # -- queries ----------------------------------------------------------------------------

    @rule(
        kind=st.sampled_from(_QUERIES + _STORE_QUERIES + _OVERLAP_QUERIES),
        h=H,
        slot=SLOT,
        n=_cfg(_counts),
        flag=st.booleans(),
        s=SEQ,
        block_hashes=_cfg(_block_hashes),
    )
    def query(
        self, kind: str, h: int, slot: int, n: int, flag: bool, s: int, block_hashes: list[int]
    ) -> None:
        """A read-only call; its answer is compared (store-level kinds need
        ``store_calls``; ``outstanding`` and ``is_idle`` need ``overlap``). ``resumable_hit``
        is admission: the longest resumable prefix of a KV hit of
        ``len(block_hashes) - n % 3`` blocks (``flag``: assume checkpointed)."""
        if kind in _STORE_QUERIES and not self.config.store_calls:
            kind = "contains"
        if kind in _OVERLAP_QUERIES and not self.config.overlap:
            kind = "contains"
        if kind == "resumable_hit":
            seq = self._seq(s)
            hit = max(0, len(block_hashes) - n % 3)
            hashes = list(block_hashes)
            what = f"resumable_hit({seq!r}, {hit}, {hashes!r}, {flag})"
            call = _call_coord("resumable_hit", seq, hit, hashes, flag)
        elif kind == "changed_since":
            gen = max(0, self.snap_ref.generation - n)
            what, call = f"store.changed_since({gen})", _call_store("changed_since", gen)
        elif kind in _STORE_QUERIES:
            what, call = f"store.{kind}({h})", _call_store(kind, h)
        elif kind == "has_available_units":
            ph = h if flag else None
            what = f"has_available_units({n}, {ph})"
            call = _call_coord("has_available_units", n, ph)
        elif kind == "restore_queued_for":
            what, call = f"restore_queued_for({slot})", _call_coord(kind, slot)
        elif kind == "contains":
            what, call = f"contains({h})", _call_coord(kind, h)
        else:
            what, call = f"{kind}()", _call_coord(kind)
        self._both("query", what, call)

    # -- bad inputs -------------------------------------------------------------------------

    @precondition(lambda self: self.config.bad_inputs)
    @rule(case=st.sampled_from(_BAD_CASES))
    def bad_input(self, case: str) -> None:
        """A malformed call from :data:`BAD_INPUTS` (and, with ``overlap``, of the
        overlapped style's arguments): both raise the same class, nothing changes."""
        fn = BAD_INPUTS.get(case)
        if fn is None:
            store = case in _STORE_BAD_INPUTS or case in _OVERLAP_STORE_BAD_INPUTS
            overlap = case in _OVERLAP_BAD_INPUTS or case in _OVERLAP_STORE_BAD_INPUTS
            if (store and not self.config.store_calls) or (overlap and not self.config.overlap):
                return
            fn = {**_STORE_BAD_INPUTS, **_OVERLAP_BAD_INPUTS, **_OVERLAP_STORE_BAD_INPUTS}[case]
        bad = fn
        self._both("bad_input", case, lambda x: bad(x, self))

    # -- reset to quiescence ------------------------------------------------------------

    @precondition(lambda self: self.calls_since_quiesce >= 40)
    @rule()
    def quiesce(self) -> None:
        """Release every handle, clear, drain and complete; then every unit is free.
        Enabled only after 40 calls since the last one, so it is a rare reset."""
        self._quiesce("quiesce")

    def _quiesce(self, rule_name: str) -> None:
        """The explorer's drain (:func:`~pagedstate.models.world.drain_calls`) on both
        stores, each call compared; each store is passed its own handles."""
        snap = self.snap_ref
        live = {lease_id for lease_id, _, _ in snap.suspended}
        leases = []
        for pair in self.lease_pairs:
            if pair.ref.lease_id in live:
                live.discard(pair.ref.lease_id)
                leases.append(pair)
        pairs = {p.ref: p for p in self.op_pairs}
        calls = drain_calls(
            leases=leases,
            scratch=[self.scratch_latest[slot] for slot in sorted(snap.scratch_reserved)],
            seqs=self.seqs,
            ops=[pairs.get(op, Pair(op, op)) for op in sorted(snap.offload_pins)],
            transfer_owners=sorted(snap.transfers, key=repr),
            kv=[(units, owner) for owner, units in self.kv],
        )
        self.kv.clear()
        for name, args in calls:
            shown = ", ".join(repr(a.ref if isinstance(a, Pair) else a) for a in args)
            self._both(rule_name, f"{name}({shown})", _drain_call(name, args))
        if self.config.overlap:
            # Wait for every copy: the tokens still outstanding are synchronized and
            # forgotten, and the coordinator is idle.
            self._both(rule_name, "settle_completions(wait=True)", _settle_and_wait)
            self._both(rule_name, "is_idle()", _call_coord("is_idle"))
        self.calls_since_quiesce = 0
        self.calls_since_clear = 0
        problems = quiescence_problems(self.snap_sut)
        if self.config.overlap:
            if self.snap_sut.completions:
                problems.append(f"drain left completions {self.snap_sut.completions!r}")
            idle = self.sut.is_idle()
            if idle is not True:
                problems.append(f"is_idle() is {idle!r} after the drain: {self.sut.outstanding()}")
        if problems:
            self._fail("quiescence", "after releasing everything: " + "; ".join(problems))
        for side in self.sides:
            if side.slots is not None and side.slots.free_slots != frozenset(
                self.config.scratch_range
            ):
                self._fail(
                    "quiescence",
                    f"{side.name}: scratch slots not returned:"
                    f" free {sorted(side.slots.free_slots)}",
                )

    def teardown(self) -> None:
        """Drain to quiescence (``drain_at_end``, only after a clean run) and report the
        ``target()`` scores: most pins on one record, most live records."""
        try:
            if self.config.drain_at_end and self._clean:
                self._quiesce("teardown")
        finally:
            if currently_in_test_context():
                target(float(self.max_pins), label="max pins on one record")
                target(float(self.max_records), label="max live records")


def _settle_and_wait(x: Any) -> Any:
    return x.coord.settle_completions(wait=True)
