"""The conformance kit: run a store in lockstep with the reference model under Hypothesis.

An engine that integrates its own checkpoint store (or wraps :mod:`pagedstate.impl`) hands
the kit two factories and gets a Hypothesis ``RuleBasedStateMachine`` back. Every rule
calls the same public method, with the same arguments, on the store under test and on the
reference coordinator (:mod:`pagedstate.models.reference`), and then:

- compares the return values (ops, booleans, leases, operation ids, unit tuples, fates);
  when a call raises, both must raise the same exception class and neither snapshot may
  change (SPEC G8);
- compares ``snapshot()`` of the two (the failure names each differing field, from
  :meth:`~pagedstate.spec.snapshot.Snapshot.diff`);
- checks every state invariant (:func:`~pagedstate.spec.snapshot.check_invariants`) and
  every step invariant (:func:`~pagedstate.spec.snapshot.check_step_invariants`) on the
  store under test;
- at the end of each test case, releases every handle, clears, drains and completes both,
  and checks that every unit came back (no leak, no stuck pin).

Faults are rules too: offload reports lost, duplicated, late and out of order; clock jumps
past the reclaim timeout; aborts and resets at any point; KV pressure from other owners;
transfers and their late releases; suspended restores and second uses of spent leases;
midstep scratch; bad inputs. ``docs/conformance.md`` describes each.

Two engine styles are driven (``ConformanceConfig(overlap=...)``): the synchronous one
(boundaries filed after the forward, drained before the next) and the overlapped one (SPEC
D.13): boundaries and drains naming forward ids, scratch stores published with
``forward=``, completions passing completion tokens that report done out of order and late,
``settle_completions``, restores begun on behalf of a sequence (G15) and aimed at scratch
slots (G12), with ``outstanding()`` and ``is_idle()`` compared after every step.

The rules come from the tables: :data:`EVENT_RULES` maps every ``(machine, event)`` of
:data:`pagedstate.spec.tables.TABLES` to the rules that drive it, and importing this package
fails (:class:`TableCoverageError`) when a table event has no rule. Each step labels the
table rows the reference took with Hypothesis ``event()`` (``Table.label(row)``), so
``pytest --hypothesis-show-statistics`` shows table-row coverage; ``teardown`` reports
``target()`` scores for the most pins on one record and the most live records.

Use::

    from pagedstate.engines.conformance import conformance_test_case, run_conformance

    run_conformance(MyCoordinator, pool_factory=MyPool)         # one call, active profile
    TestMyStore = conformance_test_case(MyCoordinator, MyPool)  # pytest / hypofuzz

Beside the random run, the exhaustive mode (:mod:`pagedstate.engines.conformance.exhaustive`)
drives the store through every state the explorer reaches on a bounded configuration,
comparing every call's answer, a sweep of read-only questions and the snapshots::

    from pagedstate.engines.conformance import run_exhaustive, run_exhaustive_plan

    run_exhaustive(MyCoordinator, pool_factory=MyPool, config="default", max_depth=6)
    run_exhaustive_plan(MyCoordinator, pool_factory=MyPool)  # the standard plan: minutes

The coordinator factory has the reference constructor's signature::

    factory(pool, spec, enabled, offload, readable_midstep,
            clock=..., offload_backlog_cap=..., forfeit_bound=...)

and ``pool_factory(num_units)`` builds the pool it is given. The kit drives KV pressure on
the pool the coordinator exposes as ``coordinator.pool`` (or ``coordinator.store.pool``),
falling back to the one the factory was given. Store-level calls that the coordinator
protocol lacks (``cancel_queued_restore``, ``changed_since``, ``lookup``,
``contains_or_pending``) go to ``coordinator.store``; switch them off with
``ConformanceConfig(store_calls=False)`` when the store under test has no ``store``.

This package never imports :mod:`pagedstate.impl`: it only receives factories. It needs
``hypothesis``: ``pip install 'pagedstate[conformance]'`` (importing the kit without it
raises ``ModuleNotFoundError`` saying so). Until the next release it can also be imported
as ``pagedstate.models.conformance``, which warns (``DeprecationWarning``).

Its modules: :mod:`.config` (configuration, failures, the sequence and offload-index
doubles), :mod:`.strategies`, :mod:`.bad_inputs`, :mod:`.lockstep` (the core the rules
share), the rules by topic (:mod:`.rules_records`, :mod:`.rules_restores`,
:mod:`.rules_pool`, :mod:`.rules_offload`, :mod:`.rules_macro`, :mod:`.rules_transfers`,
:mod:`.rules_scratch`, :mod:`.rules_overlap`), :mod:`.machine` (:class:`ConformanceMachine`),
:mod:`.mapping` (:data:`EVENT_RULES`, checked at import) and :mod:`.runners` (the entry
points).
"""

from __future__ import annotations

# The kit is built on Hypothesis: without it, say what to install instead of a bare
# "No module named 'hypothesis'" from one of the modules below.
try:
    import hypothesis  # noqa: F401
except ModuleNotFoundError as _exc:
    raise ModuleNotFoundError(
        f"the conformance kit (pagedstate.engines.conformance) needs {_exc.name or 'hypothesis'!r},"
        " which is not installed: pip install 'pagedstate[conformance]'",
        name=_exc.name or "hypothesis",
    ) from _exc

from .bad_inputs import BAD_INPUTS
from .bad_inputs import BadInput as BadInput
from .config import DEFAULT_CONFIG as DEFAULT_CONFIG
from .config import (
    ConformanceConfig,
    ConformanceFailure,
    KitOffload,
    KitSeq,
    Pair,
    TableCoverageError,
)
from .config import CoordinatorFactory as CoordinatorFactory
from .config import PoolFactory as PoolFactory
from .exhaustive import (
    EXHAUSTIVE_PLAN,
    ExhaustiveReport,
    follower_world,
    replay_trace,
    run_exhaustive,
    run_exhaustive_plan,
)
from .machine import ConformanceMachine
from .mapping import EVENT_RULES, MACRO_RULES, assert_rule_mapping, check_rule_mapping
from .rules_records import PASS_FAULTS
from .runners import (
    PROFILES,
    ConformanceReport,
    conformance_machine,
    conformance_settings,
    conformance_test_case,
    run_conformance,
)
from .strategies import ANY_BUSY_SLOT as ANY_BUSY_SLOT
from .strategies import BUSY_SLOT as BUSY_SLOT
from .strategies import KNOWN_H as KNOWN_H
from .strategies import READY_H as READY_H
from .strategies import REG_SEQ as REG_SEQ
from .strategies import SEQ as SEQ
from .strategies import SLOT as SLOT
from .strategies import H as H

__all__ = [
    "ConformanceConfig",
    "ConformanceMachine",
    "ConformanceFailure",
    "ConformanceReport",
    "ExhaustiveReport",
    "TableCoverageError",
    "KitSeq",
    "KitOffload",
    "Pair",
    "EVENT_RULES",
    "MACRO_RULES",
    "BAD_INPUTS",
    "PASS_FAULTS",
    "PROFILES",
    "check_rule_mapping",
    "assert_rule_mapping",
    "conformance_machine",
    "conformance_settings",
    "conformance_test_case",
    "run_conformance",
    "run_exhaustive",
    "run_exhaustive_plan",
    "follower_world",
    "replay_trace",
    "EXHAUSTIVE_PLAN",
]
