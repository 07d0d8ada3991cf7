"""Shared helpers for the scenario suite (SPEC sections A-D, F, G and S).

Test modules import the helpers directly (``from conftest import ...``): pytest puts
``tests/`` on ``sys.path`` because it has no ``__init__.py``. The fixtures below hand out
the same objects for tests that prefer injection.

Shorthand used throughout, as in SPEC section F:

- ``spec(10, 25)``: ``page_unit_bytes=10, slot_bytes=25, image_bytes=25`` -> U = 3 units.
- ``ready(store, h)``: ``begin_store(h, slot)`` then ``complete_inflight()``.
- :class:`Checked` wraps a pool, store or coordinator so that every method call checks the
  state invariants (SPEC C) and the step invariants of :mod:`pagedstate.spec.snapshot` on
  the root object's snapshot afterwards, and checks that a call that raises changed nothing
  (SPEC G8).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from pagedstate.models.reference import (
    PagedStateCheckpointCoordinator,
    PageUnitCheckpointStore,
    SlotPool,
    UnitPool,
)
from pagedstate.spec import (
    PagedStateCheckpointSpec,
    check_invariants,
    check_step_invariants,
)

LAYOUT = "test-v1"

# The Triton executor's CPU tests (tests/test_gpu_*.py) run its kernel under Triton's
# interpreter, which must be chosen before anything imports Triton (``@triton.jit`` reads
# the variable when a kernel is defined, and test modules import pagedstate.gpu.triton_copy
# at collection). Not on a machine with an NVIDIA device, where tests/test_gpu_cuda.py runs
# the compiled kernel (the CPU-tensor Triton tests then skip); an explicit setting wins.
if "TRITON_INTERPRET" not in os.environ and not any(
    os.path.exists(dev) for dev in ("/dev/nvidiactl", "/dev/nvidia0")
):
    os.environ["TRITON_INTERPRET"] = "1"


def spec(page_unit_bytes: int = 10, slot_bytes: int = 25, image_bytes: int | None = None):
    """``spec(10, 25)``: the SPEC's setup shorthand; ``image_bytes`` defaults to the slot."""
    return PagedStateCheckpointSpec(
        page_unit_bytes=page_unit_bytes,
        slot_bytes=slot_bytes,
        layout_id=LAYOUT,
        image_bytes=slot_bytes if image_bytes is None else image_bytes,
    )


class Seq:
    """A fake engine sequence: what the coordinator reads of it."""

    def __init__(self, state_slot: int = 0, has_per_req_cache: bool = True) -> None:
        self.state_slot = state_slot
        self.has_per_req_cache = has_per_req_cache

    def __repr__(self) -> str:
        return f"Seq(slot={self.state_slot})"


class FakeOffload:
    """A fake CPU-tier index: ``could_serve(h)`` answers from ``served``; ``stats()`` is
    reported in ``checkpoint_fates`` as ``state_offload_<k>``."""

    def __init__(self, served: set[int] | None = None, stats: dict[str, int] | None = None):
        self.served = set(served or ())
        self._stats = dict(stats or {"loads": 0})
        self.asked: list[int] = []

    def could_serve(self, prefix_hash: int) -> bool:
        self.asked.append(prefix_hash)
        return prefix_hash in self.served

    def stats(self) -> dict[str, int]:
        return dict(self._stats)


class FakeClock:
    """A monotonic clock you advance by hand: ``clock()`` reads it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = float(start)

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.t += seconds


def assert_invariants(obj: Any) -> None:
    """Every SPEC C invariant holds on ``obj.snapshot()`` (a store or a coordinator)."""
    problems = check_invariants(obj.snapshot())
    assert problems == [], problems


def assert_unchanged(
    obj: Any,
    fn: Callable[[], Any],
    exc_type: type[BaseException],
    *,
    invariants: bool = True,
) -> Any:
    """``fn()`` raises ``exc_type`` and ``obj.snapshot()`` is exactly as before (SPEC G8).

    ``invariants=False`` skips the invariant check afterwards (for states a test built by
    bypassing the guards). Returns the ``pytest.ExceptionInfo`` for message checks."""
    if isinstance(obj, Checked):
        obj = obj.raw
    before = obj.snapshot()
    with pytest.raises(exc_type) as info:
        fn()
    after = obj.snapshot()
    assert after == before, "a call that raised changed state: " + "; ".join(before.diff(after))
    if invariants:
        assert_invariants(obj)
    return info


_WRAPPED_TYPES = (UnitPool, PageUnitCheckpointStore, PagedStateCheckpointCoordinator)
_UNCHECKED = frozenset({"snapshot", "clone", "snapshot_parts"})


class Checked:
    """A proxy that checks invariants around every method call of the wrapped object.

    ``root`` is the object whose snapshot is checked (a coordinator when wrapping its store
    or pool). Attributes that are themselves a pool or store come back wrapped with the same
    root; attribute assignment goes to the wrapped object (for monkeypatching policies).
    ``step=False`` skips the step invariants (before/after predicates).
    """

    def __init__(self, target: Any, root: Any = None, step: bool = True) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_root", target if root is None else root)
        object.__setattr__(self, "_check_step", step)

    @property
    def raw(self) -> Any:
        """The wrapped object itself."""
        return self._target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if isinstance(value, _WRAPPED_TYPES):
            return Checked(value, self._root, self._check_step)
        if name in _UNCHECKED or name.startswith("__") or not callable(value):
            return value
        if isinstance(value, type):
            return value
        return self._wrap(name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        root = self._root

        def call(*args: Any, **kwargs: Any) -> Any:
            before = root.snapshot()
            try:
                result = fn(*args, **kwargs)
            except Exception:
                after = root.snapshot()
                assert after == before, (
                    f"{name} raised but changed state (G8): " + "; ".join(before.diff(after))
                )
                raise
            after = root.snapshot()
            problems = check_invariants(after)
            assert problems == [], f"after {name}{args}: {problems}"
            if self._check_step:
                steps = check_step_invariants(before, after)
                assert steps == [], f"step invariants of {name}{args}: {steps}"
            return result

        return call


def checked(obj: Any, step: bool = True) -> Any:
    """Wrap ``obj`` in :class:`Checked` (invariants after every call)."""
    return Checked(obj, step=step)


def make_store(
    num_units: int = 20,
    sp: PagedStateCheckpointSpec | None = None,
    *,
    sink: bool = False,
    clock: Callable[[], float] | None = None,
    **kwargs: Any,
) -> Any:
    """A checked store over ``UnitPool(num_units)`` (default ``spec(10, 25)``, U = 3)."""
    store = PageUnitCheckpointStore(
        UnitPool(num_units), sp or spec(10, 25), offload_sink=sink, clock=clock, **kwargs
    )
    return checked(store)


def make_coord(
    num_units: int = 20,
    sp: PagedStateCheckpointSpec | None = None,
    *,
    enabled: bool = True,
    offload: Any = None,
    readable_midstep: bool = False,
    scratch: SlotPool | None = None,
    max_ops_per_batch: int = 8,
    clock: Callable[[], float] | None = None,
    **kwargs: Any,
) -> Any:
    """A checked coordinator over ``UnitPool(num_units)``; ``scratch`` is attached as the
    midstep scratch pool with ``max_ops_per_batch``."""
    coord = PagedStateCheckpointCoordinator(
        UnitPool(num_units),
        sp or spec(10, 25),
        enabled,
        offload=offload,
        readable_midstep=readable_midstep,
        clock=clock,
        **kwargs,
    )
    if scratch is not None:
        coord.attach_midstep_scratch(scratch, max_ops_per_batch)
    return checked(coord)


def ready(store: Any, h: int, slot: int = 0) -> int:
    """``begin_store(h, slot)`` then ``complete_inflight()``; returns the READY cid.

    ``store`` may be a store or a coordinator (its store is used)."""
    if not hasattr(store, "complete_inflight"):
        store = store.store
    op = store.begin_store(h, slot)
    assert op is not None, f"begin_store({h}) was refused"
    store.complete_inflight()
    cid = store.lookup(h)
    assert cid >= 0, f"{h} is not READY after complete_inflight"
    return cid


def record(store: Any, cid: int) -> Any:
    """The snapshot view of record ``cid`` (``None`` when released)."""
    if not hasattr(store, "complete_inflight"):
        store = store.store
    return store.snapshot().records.get(cid)


def pin(store: Any, cid: int) -> int:
    """Pin count of record ``cid``; fails if the record is gone."""
    r = record(store, cid)
    assert r is not None, f"record {cid} was released"
    return r.pin_count


def phase(store: Any, cid: int) -> str:
    """Phase of record ``cid``, ``"RELEASED"`` when it has no record."""
    r = record(store, cid)
    return "RELEASED" if r is None else r.phase


def owner_units(pool: Any, owner: Hashable) -> tuple[int, ...]:
    """Units tagged for ``owner``, in piece order."""
    tags = pool.snapshot_parts()[2]
    pieces = sorted((piece, u) for u, (o, piece) in tags.items() if o == owner)
    return tuple(u for _, u in pieces)


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def offload() -> FakeOffload:
    return FakeOffload()


@pytest.fixture
def store() -> Any:
    """A checked store over P(20) with spec(10, 25)."""
    return make_store(20)


@pytest.fixture
def coord() -> Any:
    """A checked coordinator over P(20) with spec(10, 25), enabled, no tier."""
    return make_coord(20)


# -- Hypothesis profiles (SPEC H.5) ------------------------------------------------
#
# ``ci``: fixed inputs (derandomized), no example database, failures print a
# ``@reproduce_failure`` blob; ``dev``: the library defaults without a deadline;
# ``fuzz``: a long randomized run for a nightly job or by hand. Pick one with
# ``HYPOTHESIS_PROFILE=<name>``; otherwise ``ci`` when ``CI`` is set, else ``dev``.
# Each starts from the library defaults: under ``CI`` Hypothesis has already loaded its
# built-in ``ci`` profile, which would otherwise leak into ``dev`` and ``fuzz``.

_HYPOTHESIS_DEFAULTS = settings.get_profile("default")
settings.register_profile(
    "ci",
    _HYPOTHESIS_DEFAULTS,
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", _HYPOTHESIS_DEFAULTS, max_examples=100, deadline=None)
settings.register_profile("fuzz", _HYPOTHESIS_DEFAULTS, max_examples=20000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if "CI" in os.environ else "dev"))
