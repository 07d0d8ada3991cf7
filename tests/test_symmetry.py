"""Symmetry reduction over sequences (``Config.symmetry``, :meth:`World.symmetric_key`).

The reduction is sound only if the world really is symmetric in its sequences: the state a
mirrored trace reaches (every sequence argument renamed) must be the mirror image of the
state the trace reaches. That is checked here on every state of ``tiny`` and ``overlap`` to
a bound, by replaying the mirrored trace on a fresh world and comparing its key with the
renamed key of the original. Then: the explorer with the reduction finds fewer states, takes
the same table rows, and finds every planted bug with a shortest trace of the same length
(and a planted asymmetry, a store that reads a slot's number, breaks the mirror check).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from pagedstate.models.explorer import CONFIGS, explore
from pagedstate.models.mutants import MUTANTS
from pagedstate.models.reference import PagedStateCheckpointCoordinator
from pagedstate.models.world import Action, Config, World, _key
from pagedstate.spec.errors import PagedStateError

#: actions whose first argument is a sequence index (renamed by the mirror).
SEQ_ACTIONS = {
    "checkpoint",
    "checkpoint_next",
    "checkpoint_last",
    "forget",
    "forget_reset",
    "begin_restore",
    "suspend",
    "reserve_midstep",
}
SWAP = (1, 0)


def _mirror(trace: list[Action]) -> list[Action]:
    return [
        (name, (SWAP[args[0]], *args[1:])) if name in SEQ_ACTIONS else (name, args)
        for name, args in trace
    ]


def _states(cfg: Config, depth: int) -> list[tuple[World, list[Action]]]:
    """Every distinct state (plain key) to ``depth``, each with a trace reaching it."""
    start = cfg.build()
    seen = {start.key()}
    level: list[tuple[World, list[Action]]] = [(start, [])]
    out = list(level)
    for _ in range(depth):
        nxt = []
        for w, trace in level:
            for action in w.actions():
                n = w.clone()
                try:
                    n.act(action[0], *action[1])
                except PagedStateError:
                    continue
                k = n.key()
                if k not in seen:
                    seen.add(k)
                    nxt.append((n, [*trace, action]))
        out += nxt
        level = nxt
    return out


def _replay(cfg: Config, trace: list[Action], factory: Any = None) -> World | None:
    w = cfg.build(factory)
    for name, args in trace:
        try:
            w.act(name, *args)
        except PagedStateError:
            return None
    return w


@pytest.mark.parametrize(("name", "depth"), [("tiny", 5), ("overlap", 5), ("default", 5)])
def test_the_mirrored_trace_reaches_the_mirror_image(name: str, depth: int) -> None:
    cfg = CONFIGS[name]
    checked = 0
    for w, trace in _states(cfg, depth):
        m = _replay(cfg, _mirror(trace))
        assert m is not None, f"the mirror of {trace} was refused"
        assert m.key() == _key(w, SWAP), trace
        assert m.symmetric_key() == w.symmetric_key(), trace
        checked += 1
    assert checked > 500


class _SlotNumberMatters(PagedStateCheckpointCoordinator):
    """An asymmetric store: a boundary of slot 1 is dropped (reads a slot's number)."""

    def checkpoint(self, seq: Any, *args: Any, **kwargs: Any) -> Any:
        if seq.state_slot == 1:
            return None
        return super().checkpoint(seq, *args, **kwargs)


def test_the_mirror_check_catches_an_asymmetric_store() -> None:
    cfg = CONFIGS["tiny"]
    bad = 0
    for _w, trace in _states(cfg, 3):
        w2 = _replay(cfg, trace, _SlotNumberMatters)
        m = _replay(cfg, _mirror(trace), _SlotNumberMatters)
        if w2 is None or m is None or m.key() != _key(w2, SWAP):
            bad += 1
    assert bad > 0


def test_the_reduction_finds_fewer_states_and_the_same_rows() -> None:
    cfg = attrs.evolve(CONFIGS["default"], max_depth=6)
    plain = explore(cfg)
    reduced = explore(attrs.evolve(cfg, symmetry=True))
    assert reduced.violation is None and plain.violation is None
    assert plain.distinct / reduced.distinct > 1.3
    assert reduced.rows_hit == plain.rows_hit
    assert reduced.depth == plain.depth


MUTANT_CONFIG = attrs.evolve(CONFIGS["tiny"], name="tiny-kv2", kv_units=2, units=4)
OVERLAP_CONFIG = attrs.evolve(CONFIGS["overlap"], name="overlap-kv2", kv_units=2, units=4)
OVERLAP_MUTANTS = {"boundary_forward_ignored", "restore_into_lent_scratch"}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_every_mutant_is_found_with_a_shortest_trace_of_the_same_length(mutant: str) -> None:
    cfg = OVERLAP_CONFIG if mutant in OVERLAP_MUTANTS else MUTANT_CONFIG
    factory = MUTANTS[mutant].coordinator
    plain = explore(cfg, coordinator_factory=factory, max_states=50_000)
    reduced = explore(attrs.evolve(cfg, symmetry=True), coordinator_factory=factory)
    assert plain.violation is not None and reduced.violation is not None
    assert len(reduced.violation.trace) == len(plain.violation.trace)
    assert reduced.violation.kind == plain.violation.kind
