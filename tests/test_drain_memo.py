"""The explorer's memoised drain check (``World.drain_problems(memo)``, issue 20): the
drain's argument-free tail is run once per canonical state it starts from. Shown here to
change nothing the search reports: the same distinct, generated and refused counts, rows,
goals and completeness on ``tiny`` and on the first levels of ``default``, serial and
parallel, and the same violation (kind, check, message, shortest trace) on every planted
bug the drain check is the one to catch, and on a planted bug of the drain's own tail."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from test_mutants import EXPECTED, MAX_STATES, _config

from pagedstate.models.explorer import CONFIGS, Report, explore, explore_parallel
from pagedstate.models.mutants import MUTANTS
from pagedstate.models.reference import PagedStateCheckpointCoordinator
from pagedstate.models.world import DRAIN_TAIL, World, drain_calls
from pagedstate.spec import tables as T


def _summary(r: Report) -> tuple[Any, ...]:
    v = r.violation
    return (
        r.distinct,
        r.generated,
        r.rejected,
        r.depth,
        r.complete,
        r.stopped,
        sorted(r.rows_hit),
        dict(r.goals_met),
        None if v is None else (v.kind, v.name, v.message, v.trace),
    )


def test_the_drain_tail_takes_no_argument() -> None:
    """What the memo skips is the same for every state: calls without arguments."""
    calls = drain_calls(leases=[1], scratch=[2], seqs=[3], ops=[4], transfer_owners=[5], kv=[])
    assert len(calls) > DRAIN_TAIL
    assert all(args == () for _name, args in calls[-DRAIN_TAIL:])
    assert calls[-DRAIN_TAIL - 1][1] != ()


@pytest.mark.parametrize(("config", "bound"), [("tiny", None), ("default", 6), ("overlap", 6)])
def test_the_memo_changes_nothing_the_search_reports(config: str, bound: int | None) -> None:
    cfg = CONFIGS[config] if bound is None else attrs.evolve(CONFIGS[config], max_depth=bound)
    plain = explore(cfg, drain_memo=False)
    memo = explore(cfg)
    assert plain.violation is None and plain.distinct > 1_000
    assert _summary(memo) == _summary(plain)


def test_the_memo_changes_nothing_in_parallel() -> None:
    cfg = attrs.evolve(CONFIGS["default"], max_depth=5)
    assert _summary(explore_parallel(cfg, workers=2)) == _summary(
        explore_parallel(cfg, workers=2, drain_memo=False)
    )


@pytest.mark.parametrize(
    "mutant", sorted(m for m, (kind, _c, _t) in EXPECTED.items() if kind == "Liveness")
)
def test_drain_caught_mutants_are_found_alike(mutant: str) -> None:
    """The planted bugs the drain check catches: the same violation, message included,
    and the shortest trace test_mutants expects."""
    cfg, factory = _config(mutant), MUTANTS[mutant].coordinator
    plain = explore(cfg, coordinator_factory=factory, max_states=MAX_STATES, drain_memo=False)
    memo = explore(cfg, coordinator_factory=factory, max_states=MAX_STATES)
    assert memo.violation is not None and memo.violation.trace == EXPECTED[mutant][2]
    assert _summary(memo) == _summary(plain)


class _ClearKeepsTwoReady(PagedStateCheckpointCoordinator):
    """A planted bug in what the drain's tail runs: ``clear_index`` does nothing while two
    or more records are all READY and unpinned, so the tail (which clears twice) leaves
    them behind. The memo must give every state met later the verdict it would get."""

    def clear_index(self) -> None:
        recs = self.store.records
        if len(recs) >= 2 and all(r.phase == T.READY and r.pin_count == 0 for r in recs.values()):
            return
        super().clear_index()


def test_a_planted_tail_bug_is_found_alike() -> None:
    cfg = CONFIGS["tiny"]
    plain = explore(cfg, coordinator_factory=_ClearKeepsTwoReady, drain_memo=False)
    memo = explore(cfg, coordinator_factory=_ClearKeepsTwoReady)
    assert plain.violation is not None and plain.violation.kind == "Liveness"
    assert _summary(memo) == _summary(plain)


def test_a_memo_hit_is_a_drain_of_the_same_verdict() -> None:
    """Every state the search meets gets the verdict of a whole drain of its own."""
    cfg = attrs.evolve(CONFIGS["default"], max_depth=4)
    memo: dict[Any, bool] = {}
    seen = 0
    frontier = [cfg.build()]
    for _ in range(4):
        nxt: list[World] = []
        for w in frontier:
            for name, args in w.actions():
                c = w.clone()
                try:
                    c.act(name, *args)
                except Exception:
                    continue
                assert c.drain_problems(memo) == c.drain_problems()
                seen += 1
                nxt.append(c)
        frontier = nxt[:200]
    assert seen > 300 and 0 < len(memo) < seen
