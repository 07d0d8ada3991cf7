"""Rules come from the tables: :data:`EVENT_RULES` maps every ``(machine, event)`` of
:data:`pagedstate.spec.tables.TABLES` to the rules that drive it, and importing this module
(so the kit) fails with :class:`~.config.TableCoverageError` when a table event has no rule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from hypothesis.stateful import INITIALIZE_RULE_MARKER, RULE_MARKER, RuleBasedStateMachine

from pagedstate.spec.tables import TABLES, Table

from .config import TableCoverageError
from .machine import ConformanceMachine

#: Every ``(machine, event)`` of the transition tables, and the rules that drive it.
#: Importing this module checks it (:func:`assert_rule_mapping`): a table event added
#: without a rule here fails the import.
EVENT_RULES: Mapping[tuple[str, str], tuple[str, ...]] = MappingProxyType(
    {
        # record lifecycle
        ("record", "begin_store"): ("drain", "drain_forward", "engine_pass", "warm_up"),
        ("record", "adopt"): ("adopt_transfer",),
        ("record", "publish"): (
            "complete",
            "complete_with_token",
            "engine_pass",
            "warm_up",
            "clear_index",
        ),
        ("record", "dedup"): ("complete",),  # defensive row: unreachable through the API
        ("record", "unindex"): ("unindex", "engine_pass"),
        ("record", "clear"): ("clear_index", "engine_pass"),
        ("record", "evict"): (
            "kv_alloc",
            "drain",
            "drain_forward",
            "engine_pass",
            "reserve_transfer",
            "reserve_transfer_again",
        ),
        ("record", "pin_restore"): ("begin_restore", "restore_and_suspend", "restore_for"),
        ("record", "pin_offload"): ("take_offload",),
        ("record", "pin_lease"): ("acquire",),
        ("record", "unpin_restore"): (
            "complete",
            "complete_with_token",
            "clear_index",
            "forget",
            "reslot_forget",
            "cancel_restore",
            "release_lease",
        ),
        ("record", "unpin_offload"): (
            "release_source",
            "settle",
            "report",
            "settle_first",
            "reclaim",
        ),
        ("record", "unpin_lease"): ("release_source", "settle", "report", "settle_first"),
        # the settle of an image whose completion token reported done (SPEC D.13)
        ("record", "settle"): (
            "complete",
            "complete_with_token",
            "settle_completions",
            "take_offload",
            "acquire",
            "clear_index",
        ),
        # offload store / lease operation
        ("offload", "take"): ("take_offload",),
        ("offload", "acquire"): ("acquire",),
        ("offload", "release_source"): ("release_source", "report", "settle_first"),
        ("offload", "settle"): ("settle", "report", "settle_first"),
        ("offload", "reclaim"): ("reclaim", "release_source"),
        # restore
        ("restore", "begin_restore"): ("begin_restore", "restore_and_suspend", "restore_for"),
        ("restore", "take"): ("drain", "drain_forward"),
        ("restore", "complete"): ("complete", "complete_with_token", "clear_index"),
        ("restore", "cancel"): ("forget", "reslot_forget", "cancel_restore"),
        ("restore", "suspend"): ("suspend", "restore_and_suspend"),
        ("restore", "resume"): ("resume",),
        ("restore", "release"): ("release_lease",),
        # suspended-restore lease
        ("lease", "suspend"): ("suspend", "restore_and_suspend"),
        ("lease", "resume"): ("resume",),
        ("lease", "release"): ("release_lease",),
        # transfer reservation
        ("transfer", "reserve"): ("reserve_transfer", "reserve_transfer_again"),
        ("transfer", "release"): ("release_transfer",),
        ("transfer", "adopt"): ("adopt_transfer",),
        # midstep scratch
        ("scratch", "reserve"): ("reserve_midstep",),
        ("scratch", "cancel"): ("cancel_midstep", "reserve_midstep"),
        ("scratch", "publish"): ("publish_midstep", "publish_forward", "reserve_midstep"),
        ("scratch", "issue"): ("drain", "drain_forward"),
        ("scratch", "orphan"): ("unindex", "clear_index"),
        ("scratch", "complete"): ("complete", "complete_with_token", "clear_index"),
    }
)

#: Rules that chain several public calls (their table events are not listed per rule).
MACRO_RULES = frozenset(
    {
        "quiesce",
        "teardown",
        "__init__",
        "engine_pass",
        "midstep_pass",
        "warm_up",
        "restore_storm",
        "deferred_nominees",
        "lease_and_clock_back",
        "overlap_pass",
        "scratch_over_restore",
        "unsettled_image",
        "wait_two_batches",
        "scratch_wait_two",
    }
)


def _rule_names(machine: type[RuleBasedStateMachine]) -> frozenset[str]:
    """Names of ``machine``'s ``@rule`` and ``@initialize`` methods."""
    out = set()
    for name in dir(machine):
        fn = getattr(machine, name, None)
        for marker in (RULE_MARKER, INITIALIZE_RULE_MARKER):
            if getattr(fn, marker, None) is not None:
                out.add(name)
    return frozenset(out)


def check_rule_mapping(
    mapping: Mapping[tuple[str, str], Iterable[str]],
    machine: type[RuleBasedStateMachine] = ConformanceMachine,
    tables: Mapping[str, Table] = TABLES,
) -> list[str]:
    """Problems with an event-to-rule mapping: a table ``(machine, event)`` with no rule, a
    mapped name that is not a rule of ``machine``, or a mapped event no table has.

    Returns:
        One line per problem; empty when every table event has at least one rule.
    """
    rules = _rule_names(machine)
    out = []
    known = {(t.machine, ev) for t in tables.values() for ev in t.events}
    for key in sorted(known):
        names = tuple(mapping.get(key, ()))
        if not names:
            out.append(f"table event {key[0]}:{key[1]} has no conformance rule")
    for key, mapped in sorted(mapping.items()):
        if key not in known:
            out.append(f"mapped event {key[0]}:{key[1]} is in no table")
        for name in mapped:
            if name not in rules:
                out.append(f"{key[0]}:{key[1]} names {name!r}, which is not a rule")
    return out


def assert_rule_mapping(
    mapping: Mapping[tuple[str, str], Iterable[str]] = EVENT_RULES,
    machine: type[RuleBasedStateMachine] = ConformanceMachine,
    tables: Mapping[str, Table] = TABLES,
) -> None:
    """Raise :class:`TableCoverageError` listing every problem :func:`check_rule_mapping`
    finds."""
    problems = check_rule_mapping(mapping, machine, tables)
    if problems:
        raise TableCoverageError(
            "the conformance kit does not drive every table event:\n  " + "\n  ".join(problems)
        )


assert_rule_mapping()
