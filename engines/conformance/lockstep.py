"""The lockstep core the rule mixins share: ``_Lockstep``, the base of
:class:`~.machine.ConformanceMachine`, builds the reference and the store under test, calls
each rule's call on both (``_both``), compares outcomes, snapshots, invariants and the
read-only sweep, and labels the table rows the reference took; the bundles the rules fill
and draw from; and the small builders of per-side calls (``_call_coord``, ...)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, ClassVar

from hypothesis import currently_in_test_context, event
from hypothesis.stateful import Bundle, RuleBasedStateMachine

from pagedstate.models.reference import PagedStateCheckpointCoordinator, SlotPool, UnitPool
from pagedstate.models.world import ManualClock, make_drain_call
from pagedstate.spec.errors import IllegalTransitionError, PinUnderflowError
from pagedstate.spec.snapshot import Snapshot, check_invariants, check_step_invariants
from pagedstate.spec.tables import TABLES, Table

from .config import (
    DEFAULT_CONFIG,
    ConformanceConfig,
    ConformanceFailure,
    CoordinatorFactory,
    KitOffload,
    KitSeq,
    Pair,
    PoolFactory,
    _Outcome,
    _pool_of,
    _Side,
)

#: The bundles (one object each, shared by every rule mixin and the machine's class
#: attributes ``ops``, ``leases``, ``owners`` and ``scratch``).
OPS: Bundle[Pair] = Bundle("op")
LEASES: Bundle[Pair] = Bundle("lease")
OWNERS: Bundle[Hashable] = Bundle("owner")
SCRATCH: Bundle[Pair] = Bundle("scratch")


class _Lockstep(RuleBasedStateMachine):
    """The machine's construction and lockstep core, without rules (the rule mixins derive
    from it, so that each knows the attributes it uses; see
    :class:`~.machine.ConformanceMachine` for the class attributes)."""

    coordinator_factory: ClassVar[CoordinatorFactory] = PagedStateCheckpointCoordinator
    pool_factory: ClassVar[PoolFactory] = UnitPool
    config: ClassVar[ConformanceConfig] = DEFAULT_CONFIG
    rows_hit: ClassVar[set[str]] = set()
    events_by_rule: ClassVar[dict[str, set[tuple[str, str]]]] = {}
    errors_by_rule: ClassVar[dict[str, set[str]]] = {}

    ops: ClassVar[Bundle[Pair]] = OPS
    leases: ClassVar[Bundle[Pair]] = LEASES
    owners: ClassVar[Bundle[Hashable]] = OWNERS
    scratch: ClassVar[Bundle[Pair]] = SCRATCH

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.rows_hit = set()
        cls.events_by_rule = {}
        cls.errors_by_rule = {}

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        c = cls.config
        self.clock = ManualClock(1000.0)
        self.tier: KitOffload | None = KitOffload() if c.offload else None
        spec = c.spec
        midstep = c.scratch_slots > 0
        ref_pool = UnitPool(c.units)
        self.ref = PagedStateCheckpointCoordinator(
            ref_pool,
            spec,
            c.enabled,
            self.tier,
            midstep,
            clock=self.clock,
            offload_backlog_cap=c.backlog_cap,
            forfeit_bound=c.forfeit_bound,
            change_log_size=c.change_log_size,
        )
        given = cls.pool_factory(c.units)
        self.sut = cls.coordinator_factory(
            given,
            spec,
            c.enabled,
            self.tier,
            midstep,
            clock=self.clock,
            offload_backlog_cap=c.backlog_cap,
            forfeit_bound=c.forfeit_bound,
            change_log_size=c.change_log_size,
        )
        needed = ("snapshot", "checkpoint", "take_checkpoint_ops")
        missing = [
            name
            for name in needed + (("store",) if c.store_calls else ())
            if not hasattr(self.sut, name)
        ]
        if missing:
            raise ConformanceFailure(
                f"[rule __init__] construction: coordinator_factory returned {self.sut!r}"
                f" ({type(self.sut).__qualname__}), not a coordinator: it has no"
                f" {', '.join(missing)} (the factory takes the reference's arguments: pool,"
                " spec, enabled, offload, readable_midstep, clock=..., offload_backlog_cap=...,"
                " forfeit_bound=..., change_log_size=...)"
            )
        self.sink: set[tuple[str, int]] = set()
        self.ref.row_sink = self.sink
        self.sides = (
            _Side(
                "reference",
                self.ref,
                _pool_of(self.ref, ref_pool),
                SlotPool(c.scratch_range) if midstep else None,
                True,
            ),
            _Side(
                "store under test",
                self.sut,
                _pool_of(self.sut, given),
                SlotPool(c.scratch_range) if midstep else None,
                False,
            ),
        )
        self.seqs = tuple(KitSeq(f"s{i}", i) for i in range(c.seqs)) + (
            KitSeq("no-cache", c.seqs, has_per_req_cache=False),
            KitSeq("no-slot", -1),
        )
        # Environment memory.
        self.kv: list[tuple[Hashable, Pair]] = []
        self.kv_next = 0
        self.op_pairs: list[Pair] = []
        self.lease_pairs: list[Pair] = []
        # ``restore_storm`` is long (over a hundred calls): once per test case.
        self.stormed = False
        # The latest midstep reservation handed out per scratch slot (an older one for the
        # same slot is stale once the slot was lent again).
        self.scratch_latest: dict[int, tuple[int, int, int]] = {}
        self.transfer_next = 0
        # Completion tokens handed to the completions (one per side, set done together:
        # the copies they stand for are the environment's, SPEC D.13).
        self.token_pairs: list[Pair] = []
        self.max_pins = 0
        self.max_records = 0
        self._clean = True
        self._rule = "__init__"
        self.calls_since_quiesce = 0
        self.calls_since_clear = 0
        self.snap_ref: Snapshot = self.ref.snapshot()
        self.snap_sut: Snapshot = self.sut.snapshot()
        self._compare_snapshots("construction", self.snap_ref, self.snap_sut)
        if midstep:
            self._both(
                "__init__",
                f"attach_midstep_scratch(SlotPool({list(c.scratch_range)}), {c.max_ops_per_batch})",
                lambda s: s.coord.attach_midstep_scratch(s.slots, c.max_ops_per_batch),
            )

    # -- the lockstep core ------------------------------------------------------------

    def _fail(self, what: str, problem: str, cause: BaseException | None = None) -> None:
        self._clean = False
        msg = f"[rule {self._rule}] {what}: {problem}"
        if cause is not None:
            raise ConformanceFailure(msg) from cause
        raise ConformanceFailure(msg)

    def _compare_snapshots(self, what: str, ref: Snapshot, sut: Snapshot) -> None:
        if ref != sut:
            diff = "\n  ".join(ref.diff(sut))
            self._fail(
                what,
                "snapshots differ (reference != store under test):\n  " + diff,
            )

    def _both(self, rule_name: str, what: str, call: Callable[[_Side], Any]) -> _Outcome:
        """Call ``call`` on the reference, then on the store under test; compare outcomes,
        snapshots and invariants; label the rows the reference took."""
        self._rule = rule_name
        self._clean = False
        self.calls_since_quiesce += 1
        self.calls_since_clear += 1
        self.sink.clear()
        ref_side, sut_side = self.sides
        results: list[tuple[bool, Any]] = []
        for side in (ref_side, sut_side):
            try:
                results.append((True, call(side)))
            except Exception as exc:  # noqa: BLE001 - every outcome is compared
                results.append((False, exc))
        (ref_ok, ref_val), (sut_ok, sut_val) = results
        self._note_rows(rule_name)
        before_ref, before_sut = self.snap_ref, self.snap_sut
        after_ref = self.ref.snapshot()
        after_sut = self.sut.snapshot()
        if not ref_ok and isinstance(ref_val, (IllegalTransitionError, PinUnderflowError)):
            self._fail(
                what,
                f"the reference model raised {ref_val!r}: the reference broke its own table"
                " (a bug in the reference or in the kit, not in the store under test)",
                ref_val,
            )
        if ref_ok and not sut_ok:
            self._fail(
                what,
                f"the reference returned {ref_val!r}; the store under test raised {sut_val!r}",
                sut_val,
            )
        if sut_ok and not ref_ok:
            self._fail(
                what,
                f"the reference raised {ref_val!r}; the store under test returned {sut_val!r}",
            )
        error: type[BaseException] | None = None
        if not ref_ok:
            error = type(ref_val)
            if type(sut_val) is not type(ref_val):
                self._fail(
                    what,
                    f"the reference raised {type(ref_val).__name__} ({ref_val}); the store"
                    f" under test raised {type(sut_val).__name__} ({sut_val})",
                    sut_val,
                )
            if after_ref != before_ref:
                self._fail(
                    what,
                    f"the reference raised {ref_val!r} and changed state (G8):\n  "
                    + "\n  ".join(before_ref.diff(after_ref)),
                )
            if after_sut != before_sut:
                self._fail(
                    what,
                    f"the store under test raised {sut_val!r} and changed state (G8):\n  "
                    + "\n  ".join(before_sut.diff(after_sut)),
                )
            _event(f"{rule_name} raised {error.__name__}")
            if rule_name != "teardown":
                type(self).errors_by_rule.setdefault(rule_name, set()).add(error.__name__)
        elif ref_val != sut_val:
            self._fail(
                what,
                f"results differ: the reference returned {ref_val!r}, the store under test"
                f" returned {sut_val!r}",
            )
        self._compare_snapshots(what, after_ref, after_sut)
        problems = check_invariants(after_sut)
        if problems:
            self._fail(what, "invariants broken: " + "; ".join(f"{n}: {p}" for n, p in problems))
        steps = check_step_invariants(before_sut, after_sut)
        if steps:
            self._fail(what, "step invariants broken: " + "; ".join(f"{n}: {p}" for n, p in steps))
        own_check = getattr(self.sut, "self_check", None)
        if callable(own_check):
            own = own_check()
            if own:
                self._fail(what, "the store under test's own self_check reports: " + "; ".join(own))
        self._compare_tokens(what)
        if ref_side.slots is not None and sut_side.slots is not None:
            if ref_side.slots.free_slots != sut_side.slots.free_slots:
                self._fail(
                    what,
                    f"free scratch slots differ: reference {sorted(ref_side.slots.free_slots)},"
                    f" store under test {sorted(sut_side.slots.free_slots)}",
                )
        self.snap_ref, self.snap_sut = after_ref, after_sut
        self.max_pins = max(
            self.max_pins, max((r.pin_count for r in after_sut.records.values()), default=0)
        )
        self.max_records = max(self.max_records, len(after_sut.records))
        if self.config.sweep_queries:
            self._sweep(what)
        self._clean = True
        return _Outcome(ref_val, sut_val, error)

    def _compare_tokens(self, what: str) -> None:
        """Only ``settle_completions(wait=True)`` may wait for a token (``synchronize()``,
        which marks a :class:`~pagedstate.spec.types.ManualCompletion` done): each pair of
        tokens must still agree."""
        for i, pair in enumerate(self.token_pairs):
            if pair.ref.done != pair.sut.done:
                self._fail(
                    what,
                    f"completion token {i}: the reference left it done={pair.ref.done}, the"
                    f" store under test done={pair.sut.done} (only settle_completions(wait=True)"
                    " may synchronize a token)",
                )

    def _queries(self) -> list[tuple[str, Callable[[_Side], Any]]]:
        """Every read-only question of :attr:`ConformanceConfig.sweep_queries`."""
        c = self.config
        hashes = range(1, c.hashes + 1)
        out: list[tuple[str, Callable[[_Side], Any]]] = []
        for k in range(c.units + 2):
            for p in (None, *hashes):
                question = f"has_available_units({k}, {p})"
                out.append((question, _call_coord("has_available_units", k, p)))
        for slot in (*range(c.seqs + 1), *c.scratch_range):
            out.append((f"restore_queued_for({slot})", _call_coord("restore_queued_for", slot)))
        for h in hashes:
            out.append((f"contains({h})", _call_coord("contains", h)))
        if c.overlap:
            out.append(("outstanding()", _call_coord("outstanding")))
            out.append(("is_idle()", _call_coord("is_idle")))
            out.append(("last_forward", _get_coord("last_forward")))
            out.append(("next_forward", _get_coord("next_forward")))
            if c.store_calls:
                out.append(("store.outstanding()", _call_store("outstanding")))
        if c.store_calls:
            for h in hashes:
                out.append((f"store.lookup({h})", _call_store("lookup", h)))
                question = f"store.contains_or_pending({h})"
                out.append((question, _call_store("contains_or_pending", h)))
            gen = self.snap_ref.generation
            for g in range(max(0, gen - c.change_log_size - 1), gen + 1):
                out.append((f"store.changed_since({g})", _call_store("changed_since", g)))
        return out

    def _sweep(self, what: str) -> None:
        """Ask both stores every read-only question and compare (see ``sweep_queries``)."""
        ref_side, sut_side = self.sides
        for question, call in self._queries():
            answers: list[tuple[bool, Any]] = []
            for side in (ref_side, sut_side):
                try:
                    answers.append((True, call(side)))
                except Exception as exc:  # noqa: BLE001 - compared below
                    answers.append((False, exc))
            (ref_ok, ref_val), (sut_ok, sut_val) = answers
            if ref_ok != sut_ok or (
                (ref_val != sut_val) if ref_ok else (type(ref_val) is not type(sut_val))
            ):
                self._fail(
                    what,
                    f"after it, {question} answers differ: the reference"
                    f" {'returned' if ref_ok else 'raised'} {ref_val!r}, the store under test"
                    f" {'returned' if sut_ok else 'raised'} {sut_val!r}",
                )
        if self.sut.snapshot() != self.snap_sut:
            self._fail(what, "the read-only questions asked after it changed the store's state")

    def _note_rows(self, rule_name: str) -> None:
        # The end-of-run drain is a check, not part of the run: its rows are not coverage.
        if not self.sink or rule_name == "teardown":
            return
        cls = type(self)
        seen = cls.events_by_rule.setdefault(rule_name, set())
        for machine, row_id in sorted(self.sink):
            table: Table = TABLES[machine]
            row = table.rows[row_id]
            label = table.label(row)
            _event(label)
            cls.rows_hit.add(label)
            seen.add((machine, row.event))

    def _seq(self, s: int) -> KitSeq:
        return self.seqs[s]

    def _both_op(self, rule_name: str, name: str, op: Pair) -> None:
        """``coordinator.<name>(op)`` on both sides, each with its own handle of ``op``."""
        self._both(rule_name, f"{name}({op.ref!r})", _call_picked(name, op))


def _event(label: str) -> None:
    # Outside Hypothesis (a failing program replayed as a plain regression test) there is
    # nothing to record statistics in.
    if currently_in_test_context():
        event(label)


def _call_coord(name: str, *args: Any) -> Callable[[_Side], Any]:
    return lambda x: getattr(x.coord, name)(*args)


def _get_coord(name: str) -> Callable[[_Side], Any]:
    return lambda x: getattr(x.coord, name)


def _call_picked(name: str, pair: Pair) -> Callable[[_Side], Any]:
    return lambda x: getattr(x.coord, name)(x.pick(pair))


def _release_kv(units: Pair, owner: Hashable) -> Callable[[_Side], Any]:
    return lambda x: x.pool.release_units(x.pick(units), owner)


def _call_store(name: str, *args: Any) -> Callable[[_Side], Any]:
    return lambda x: getattr(x.store, name)(*args)


def _drain_call(name: str, args: tuple[Any, ...]) -> Callable[[_Side], Any]:
    def call(x: _Side) -> Any:
        mine = tuple(x.pick(a) if isinstance(a, Pair) else a for a in args)
        return make_drain_call(x.coord, x.pool, name, mine)

    return call
