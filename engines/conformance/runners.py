"""The entry points: :func:`conformance_machine` (the machine class for a factory),
:func:`conformance_test_case` (a ``unittest.TestCase`` for pytest and hypofuzz),
:func:`run_conformance` (one call, returning a :class:`ConformanceReport`), and the settings
they run with (:data:`PROFILES`, :func:`conformance_settings`)."""

from __future__ import annotations

import os
import unittest
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import attrs
from hypothesis import HealthCheck
from hypothesis import settings as HSettings
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import run_state_machine_as_test

from pagedstate.models.reference import UnitPool
from pagedstate.spec.tables import TABLES

from .config import DEFAULT_CONFIG, ConformanceConfig, CoordinatorFactory, PoolFactory
from .machine import ConformanceMachine


def conformance_machine(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    *,
    config: ConformanceConfig = DEFAULT_CONFIG,
    name: str = "Conformance",
) -> type[ConformanceMachine]:
    """A :class:`ConformanceMachine` subclass that checks ``factory``'s coordinator.

    Args:
        factory: builds the coordinator under test, with the reference constructor's
            signature ``factory(pool, spec, enabled, offload, readable_midstep, clock=...,
            offload_backlog_cap=..., forfeit_bound=...)``.
        pool_factory: ``pool_factory(num_units)`` builds the pool passed to ``factory``
            (default: the reference :class:`~pagedstate.models.reference.UnitPool`).
        config: sizes and switches.
        name: the class name (a printed failing program starts ``state = <name>()``).

    Returns:
        The class; run it with ``run_state_machine_as_test`` or collect ``.TestCase``.
    """
    return type(
        name,
        (ConformanceMachine,),
        {
            "coordinator_factory": staticmethod(factory),
            "pool_factory": staticmethod(pool_factory or UnitPool),
            "config": config,
            "__module__": __name__.rpartition(".")[0],  # pagedstate.engines.conformance
        },
    )


#: The kit's own profiles, used by :func:`conformance_settings` when the named profile was
#: not registered (an engine's test suite without a ``conftest`` registering them):
#: ``ci`` deterministic and bounded, ``dev`` the defaults, ``fuzz`` long.
class _Profiles(Mapping[str, HSettings]):
    """A read-only mapping of profile name to settings whose repr names only the profiles:
    a settings object's repr spells out every default, and those follow the environment
    (Hypothesis picks other defaults when it sees a CI variable)."""

    def __init__(self, profiles: dict[str, HSettings]) -> None:
        self._profiles = MappingProxyType(profiles)

    def __getitem__(self, name: str) -> HSettings:
        return self._profiles[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._profiles)

    def __len__(self) -> int:
        return len(self._profiles)

    def __repr__(self) -> str:
        return f"<conformance profiles {', '.join(self._profiles)}>"


PROFILES: Mapping[str, HSettings] = _Profiles(
    {
        "ci": HSettings(
            derandomize=True,
            database=None,
            print_blob=True,
            deadline=None,
            max_examples=100,
            stateful_step_count=50,
            suppress_health_check=[HealthCheck.too_slow],
        ),
        "dev": HSettings(max_examples=100, deadline=None, stateful_step_count=50),
        "fuzz": HSettings(max_examples=20_000, deadline=None, stateful_step_count=100),
    }
)


def conformance_settings(profile: str | None = None) -> HSettings:
    """The settings a conformance run uses.

    ``profile`` (default: ``$HYPOTHESIS_PROFILE``) names a registered Hypothesis profile,
    or one of :data:`PROFILES` when no profile of that name is registered. With neither,
    the active profile (``settings()``) is used.

    Raises:
        hypothesis.errors.InvalidArgument: an unknown profile name.
    """
    name = profile if profile is not None else os.environ.get("HYPOTHESIS_PROFILE")
    if not name:
        return HSettings()
    try:
        return HSettings.get_profile(name)
    except InvalidArgument:
        if name in PROFILES:
            return PROFILES[name]
        raise


def conformance_test_case(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    *,
    config: ConformanceConfig = DEFAULT_CONFIG,
    settings: HSettings | None = None,
    name: str = "Conformance",
) -> type[unittest.TestCase]:
    """The machine as a ``unittest.TestCase`` class, for pytest collection and hypofuzz.

    Unlike ``conformance_machine(...).TestCase`` (Hypothesis's default settings), it runs
    with ``settings`` or :func:`conformance_settings` (``$HYPOTHESIS_PROFILE``), read when
    this is called, i.e. when the test module is imported.
    """
    case = conformance_machine(factory, pool_factory, config=config, name=name).TestCase
    case.settings = settings if settings is not None else conformance_settings()
    return case


@attrs.frozen
class ConformanceReport:
    """What a passing run covered.

    Attributes:
        rows_hit: labels (``Table.label``) of the table rows the reference took.
        rows_missed: non-defensive rows never taken (each is a gap in the run, not a bug).
        defensive_missed: defensive rows never taken (expected: the API cannot reach them).
        events_by_rule: ``rule -> {(machine, event)}`` observed.
        errors_by_rule: ``rule -> {exception class name}`` both stores raised (refusals
            both took: bad inputs, busy slots, stale boundaries, spent leases).
    """

    rows_hit: frozenset[str]
    rows_missed: tuple[str, ...]
    defensive_missed: tuple[str, ...]
    events_by_rule: Mapping[str, frozenset[tuple[str, str]]]
    errors_by_rule: Mapping[str, frozenset[str]] = attrs.field(factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, machine: type[ConformanceMachine]) -> ConformanceReport:
        """The coverage a machine class accumulated over its runs."""
        hit = frozenset(machine.rows_hit)
        missed: list[str] = []
        defensive: list[str] = []
        for table in TABLES.values():
            for row in table.rows:
                label = table.label(row)
                if label not in hit:
                    (defensive if row.defensive else missed).append(label)
        return cls(
            rows_hit=hit,
            rows_missed=tuple(missed),
            defensive_missed=tuple(defensive),
            events_by_rule=MappingProxyType(
                {k: frozenset(v) for k, v in sorted(machine.events_by_rule.items())}
            ),
            errors_by_rule=MappingProxyType(
                {k: frozenset(v) for k, v in sorted(machine.errors_by_rule.items())}
            ),
        )


def run_conformance(
    factory: CoordinatorFactory,
    pool_factory: PoolFactory | None = None,
    settings: HSettings | None = None,
    config: ConformanceConfig = DEFAULT_CONFIG,
) -> ConformanceReport:
    """Run the conformance kit against ``factory``'s coordinator; return its coverage.

    Args:
        factory, pool_factory, config: as :func:`conformance_machine`.
        settings: Hypothesis settings (default :func:`conformance_settings`: the profile
            ``$HYPOTHESIS_PROFILE`` names, else the active one).

    Raises:
        ConformanceFailure (an AssertionError): the first disagreement, after Hypothesis
            shrank it; the printed program replays it (``state = Conformance()``, ...).
    """
    machine = conformance_machine(factory, pool_factory, config=config)
    run_state_machine_as_test(
        machine, settings=settings if settings is not None else conformance_settings()
    )
    return ConformanceReport.of(machine)
