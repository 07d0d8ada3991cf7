"""Planted bugs: the explorer must find every mutant of :mod:`pagedstate.models.mutants`.

For each mutant the test runs the breadth-first explorer over :data:`MUTANT_CONFIG` (or,
for the bugs of the overlap style, :data:`OVERLAP_CONFIG`, see :data:`CONFIG_OF`) and
asserts the exact shortest trace, the kind of check that broke and its name. The expected
traces were produced by the explorer and then checked by hand (and the check is repeated
here): replayed on a fresh world over the mutant, every check passes until the last step,
where the named check fails; replayed on the reference model, every check passes after every
step (a step the reference refuses changes nothing). A checker that cannot fail checks
nothing; a trace that breaks the reference too would blame the wrong model.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from pagedstate.models import explorer
from pagedstate.models.explorer import CONFIGS, explore
from pagedstate.models.mutants import MUTANTS
from pagedstate.models.world import Action, Config, World
from pagedstate.spec import check_invariants, check_step_invariants
from pagedstate.spec.errors import IllegalTransitionError, PagedStateError, PinUnderflowError

#: ``tiny`` with a second pool unit per KV allocation (which enables the partial-release
#: action, SPEC G9) and one more pool unit. Named, so a violation's snippet can build it.
MUTANT_CONFIG: Config = attrs.evolve(CONFIGS["tiny"], name="tiny-kv2", kv_units=2, units=4)

#: ``overlap`` (forward ids, restores for a sequence and into scratch slots, SPEC D.13, G12,
#: G15) with the same two changes, for the mutants only the overlap style can expose.
OVERLAP_CONFIG: Config = attrs.evolve(CONFIGS["overlap"], name="overlap-kv2", kv_units=2, units=4)

#: The configuration each mutant is searched on (:data:`MUTANT_CONFIG` when not named).
CONFIG_OF: dict[str, Config] = {
    "boundary_forward_ignored": OVERLAP_CONFIG,
    "restore_into_lent_scratch": OVERLAP_CONFIG,
}


def _config(mutant: str) -> Config:
    return CONFIG_OF.get(mutant, MUTANT_CONFIG)


#: Distinct-state bound for each mutant's search (each is found far below it).
MAX_STATES = 50_000

_ADOPT_1 = (("reserve_transfer", ()), ("adopt", (0, 1)))

#: mutant name -> (violation kind, check name, shortest trace).
EXPECTED: dict[str, tuple[str, str, tuple[Action, ...]]] = {
    # The drain's begin_store publishes record 0 READY before its batch ran.
    "publish_at_begin": (
        "Step invariant",
        "visibility",
        (("checkpoint", (0, 1)), ("drain", ())),
    ),
    # The drain takes the restore and drops its pin; unindex then frees the unit the
    # in-flight gather still reads.
    "unpin_restore_at_take": (
        "Invariant",
        "environment_agreement",
        (*_ADOPT_1, ("begin_restore", (0, 1)), ("drain", ()), ("unindex", (1,))),
    ),
    # Pool full (COPYING h1, two KV units, READY h2 pinned by a queued restore): a transfer
    # reservation evicts the pinned h2 image.
    "evict_pinned": (
        "Step invariant",
        "pinned_survive",
        (
            ("checkpoint", (0, 1)),
            ("drain", ()),
            ("kv_alloc", (0,)),
            ("reserve_transfer", ()),
            ("adopt", (0, 2)),
            ("begin_restore", (0, 2)),
            ("reserve_transfer", ()),
        ),
    ),
    # The COPYING record is nominated at begin_store; handing it to the tier is refused by
    # the record table (no pin_offload from COPYING).
    "nominate_copying": (
        "Invariant",
        "backlog_bound",
        (("checkpoint", (0, 1)), ("drain", ())),
    ),
    # A late report of the settled lease (generation 1) retires the live lease of the same
    # hash (generation 2) the environment still holds.
    "settle_by_bare_hash": (
        "Invariant",
        "environment_agreement",
        (
            *_ADOPT_1,
            ("acquire", (1,)),
            ("settle", (0,)),
            ("acquire", (1,)),
            ("late_report", ()),
        ),
    ),
    # The stale-pin reclaimer drops an explicit lease past the timeout.
    "reclaim_lease": (
        "Invariant",
        "environment_agreement",
        (*_ADOPT_1, ("acquire", (1,)), ("tick", ()), ("reclaim", ())),
    ),
    # Record 0 is published under a completion token not done yet; take_offload defers its
    # nomination (the image is not settled, D.13) and the mutant loses it instead of putting
    # it back. (Before completion tokens the shortest deferral was one whose hash was
    # leased: six steps.)
    "drop_deferred_nomination": (
        "Step invariant",
        "nominations_accounted",
        (("checkpoint", (0, 1)), ("drain", ()), ("complete_token", ()), ("take_offload", ())),
    ),
    # A second boundary of sequence 0 does not supersede the first.
    "supersede_keeps_older": (
        "Invariant",
        "coordinator_pending",
        (("checkpoint", (0, 1)), ("checkpoint", (0, 2))),
    ),
    # A lease holds record 0 with pin_count 0.
    "lease_without_pin": (
        "Invariant",
        "pin_accounting",
        (*_ADOPT_1, ("acquire", (1,))),
    ),
    # The pool accepts a release of one unit of a two-unit KV reservation.
    "partial_release_accepted": (
        "Invariant",
        "environment_agreement",
        (("kv_alloc", (0,)), ("kv_partial_free", (0,))),
    ),
    # A resumed lease is released again and drops the pin of the re-queued restore.
    "lease_reusable": (
        "Invariant",
        "pin_accounting",
        (
            *_ADOPT_1,
            ("begin_restore", (0, 1)),
            ("suspend", (0,)),
            ("resume", (0,)),
            ("reuse_lease", ()),
        ),
    ),
    # A second restore into slot 0 is queued beside the first.
    "two_restores_one_slot": (
        "Invariant",
        "one_restore_per_slot",
        (*_ADOPT_1, ("begin_restore", (0, 1)), ("begin_restore", (0, 1))),
    ),
    # The drain cancels the queued restore, the pin stays, the image never goes.
    "cancel_keeps_pin": (
        "Liveness",
        "drain",
        (*_ADOPT_1, ("begin_restore", (0, 1))),
    ),
    # unindex releases record 0 under the queued restore's pin.
    "unindex_releases_pinned": (
        "Step invariant",
        "pinned_survive",
        (*_ADOPT_1, ("begin_restore", (0, 1)), ("unindex", (1,))),
    ),
    # S14: the terminal report unpins a source phase 1 already released. The drain that
    # follows the release settles the lease and underflows the pin (with the drain check
    # off, the table's underflow check catches the same bug one step later, see below).
    "double_unpin_on_settle": (
        "Liveness",
        "drain",
        (("reserve_transfer", ()), ("adopt", (0, 1)), ("acquire", (1,)), ("release_source", (0,))),
    ),
    # D.13 (overlap style): sequence 0 files boundary h1 for forward 0, the forward about
    # to run; the first drain (before forward 0) stores it at once, from the slot as no
    # forward has left it yet. Only the environment's wrong-slot check sees it: the store
    # and its snapshot are self-consistent.
    "boundary_forward_ignored": (
        "Invariant",
        "environment_agreement",
        (("checkpoint_next", (0, 1)), ("drain", ())),
    ),
    # D.13, C.27: record 0 is published under a completion token not done yet, and the CPU
    # tier is handed its image anyway (the environment's host-reader check fails too).
    "host_pin_unsettled": (
        "Invariant",
        "host_readers_settled",
        (("checkpoint", (0, 1)), ("drain", ()), ("complete_token", ()), ("take_offload", ())),
    ),
    # G12, C.25: scratch slot 2 is reserved for h2, and a restore of the h1 image is queued
    # into it.
    "restore_into_lent_scratch": (
        "Invariant",
        "slot_lenders_exclusive",
        (*_ADOPT_1, ("reserve_midstep", (0, 2)), ("restore_scratch", (0, 1))),
    ),
}


def _checks(world: World, before: Any) -> dict[str, list[str]]:
    """Every check the explorer runs after a step, by the name it reports."""
    after = world.snapshot()
    out: dict[str, list[str]] = {}
    for name, msg in [*check_step_invariants(before, after), *check_invariants(after)]:
        out.setdefault(name, []).append(msg)
    if problems := world.problems():
        out["environment_agreement"] = problems
    if problems := world.drain_problems():
        out["drain"] = problems
    return out


def _replay_reference(
    trace: tuple[Action, ...], config: Config = MUTANT_CONFIG
) -> list[PagedStateError]:
    """Replay ``trace`` on the reference model; every check passes after every step, and a
    step the reference refuses changes nothing. Returns the refusals, in order."""
    world = config.build()
    refused = []
    for i, (name, args) in enumerate(trace):
        before = world.snapshot()
        try:
            world.act(name, *args)
        except PagedStateError as exc:
            assert world.snapshot() == before, f"step {i + 1} {name}{args} raised and changed state"
            refused.append(exc)
            continue
        assert _checks(world, before) == {}, f"reference, step {i + 1} {name}{args}"
    return refused


def _replay_mutant(
    mutant: str, kind: str, check: str, trace: tuple[Action, ...]
) -> dict[str, list[str]]:
    """Replay ``trace`` on a fresh world over the mutant: clean until the last step, where
    the named check breaks. Returns every check broken after the last step."""
    world = _config(mutant).build(MUTANTS[mutant].coordinator)
    *prefix, (last, last_args) = trace
    for i, (name, args) in enumerate(prefix):
        before = world.snapshot()
        world.act(name, *args)
        assert _checks(world, before) == {}, f"mutant, step {i + 1} {name}{args}"
    before = world.snapshot()
    if kind == "Table":
        with pytest.raises((IllegalTransitionError, PinUnderflowError)) as info:
            world.act(last, *last_args)
        assert type(info.value).__name__ == check
        return {check: [str(info.value)]}
    world.act(last, *last_args)
    broken = _checks(world, before)
    assert check in broken, f"{check} holds after the last step; broken: {broken}"
    if kind == "Step invariant":
        assert check in dict(check_step_invariants(before, world.snapshot()))
    return broken


def test_enough_mutants() -> None:
    assert len(MUTANTS) >= 10
    assert set(EXPECTED) == set(MUTANTS), "every mutant has exactly one expected trace"


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_explorer_finds_mutant(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kind, check, trace = EXPECTED[mutant]
    config = _config(mutant)

    report = explore(config, coordinator_factory=MUTANTS[mutant].coordinator, max_states=MAX_STATES)

    v = report.violation
    assert v is not None, f"{mutant} not found in {report.distinct} states"
    assert (v.kind, v.name) == (kind, check), v.message
    assert v.trace == trace
    # The trace shows the bug on the mutant, and only there.
    _replay_mutant(mutant, kind, check, trace)
    refused = _replay_reference(trace, config)
    # The printed snippet is valid Python that replays the trace on the reference model; it
    # spells the configuration out, so it works for one that is not registered in CONFIGS.
    assert config.name not in explorer.CONFIGS
    code = compile(v.snippet(config), f"<snippet {mutant}>", "exec")
    if refused:
        # The snippet does not catch errors: it stops where the reference refuses.
        with pytest.raises(type(refused[0])):
            exec(code, {})
    else:
        exec(code, {})


def test_table_check_catches_double_unpin_without_drain() -> None:
    """The explorer's own check that the model never breaks its table (an
    IllegalTransitionError or PinUnderflowError during an environment action) catches a
    planted bug by itself, with the drain check switched off."""
    report = explore(
        MUTANT_CONFIG,
        coordinator_factory=MUTANTS["double_unpin_on_settle"].coordinator,
        max_states=MAX_STATES,
        check_drain=False,
    )
    v = report.violation
    assert v is not None
    assert (v.kind, v.name) == ("Table", "PinUnderflowError")
    assert v.trace == (
        ("reserve_transfer", ()),
        ("adopt", (0, 1)),
        ("acquire", (1,)),
        ("release_source", (0,)),
        ("settle", (0,)),
    )


def test_environment_checks_catch_the_overlap_mutants() -> None:
    """Two of the overlap-style bugs are seen by the environment itself (``World.problems``),
    not only by the store's snapshot: the wrong-slot store under overlap is seen by the
    drain check alone (the store is self-consistent), and the host reader handed an
    unsettled image is seen by the host-reader check as well as by ``host_readers_settled``
    (C.27)."""
    _kind, _check, trace = EXPECTED["boundary_forward_ignored"]
    broken = _replay_mutant("boundary_forward_ignored", *EXPECTED["boundary_forward_ignored"])
    assert set(broken) == {"environment_agreement"}, broken
    assert any("wrong-slot store under overlap" in p for p in broken["environment_agreement"])

    broken = _replay_mutant("host_pin_unsettled", *EXPECTED["host_pin_unsettled"])
    assert {"host_readers_settled", "environment_agreement"} <= set(broken), broken
    assert any(
        "take_offload_stores handed out checkpoint 0" in p and "token is not done" in p
        for p in broken["environment_agreement"]
    ), broken

    # The same drain on the reference keeps the boundary pending until forward 0 has run.
    world = OVERLAP_CONFIG.build()
    for name, args in trace:
        world.act(name, *args)
    assert world.problems() == []
    assert world.snapshot().pending_boundaries
