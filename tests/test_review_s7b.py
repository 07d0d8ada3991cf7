"""Every test here failed before its fix, each for the defect its name says (an interrupt
in the scratch drain leaked the slot and left the attempt uncounted; check-log rejected
valid logs with an IntEnum in an error message or a refused scratch pool that is a sequence
or a set, and exhausted memory on a header with a huge pool; the conformance kit demanded
``store`` with ``store_calls=False`` and accepted a timeout that is not a number)."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from conftest import Seq, spec
from test_review_s7 import _logged, _scratch_slots_accounted, _scratch_world

from pagedstate import impl as I
from pagedstate.models import checklog as CL
from pagedstate.spec import EvictionCallbackError


def _interrupt(h: int) -> None:
    raise KeyboardInterrupt


def test_an_interrupt_in_the_scratch_drain_does_not_leak_its_scratch_slot() -> None:
    c, pool, sp = _scratch_world(_interrupt)  # the world of test_review_s7.py's scratch tests
    c.publish_midstep(c.reserve_midstep(Seq(1), [(5, 909)]))
    with pytest.raises(KeyboardInterrupt):
        c.take_checkpoint_ops()
    pool.on_evict = None
    c.complete_previous_batch()
    held = _scratch_slots_accounted(c, sp)
    assert held == {50, 51}


def test_an_interrupted_boundary_store_is_counted_as_dropped() -> None:
    """_give_up_drain: every store attempt of a drain is counted when it ends, kept or
    dropped. An on_evict failure counts the failing attempt as dropped; an interrupt out of
    the same callback (the BaseException branch) gives the same attempt up uncounted."""

    def fates(on_evict: Any) -> dict[str, int]:
        pool = I.UnitPool(5)
        c = I.PagedStateCheckpointCoordinator(pool, spec(10, 20), True)  # 2-unit images
        kv = pool.reserve_units(3, ("kv", 0))
        pool.cache_units(kv, ("kv", 0), [301, 302, 303])
        pool.on_evict = on_evict
        c.checkpoint(Seq(0), 1, 101)  # takes the 2 vacant units
        c.checkpoint(Seq(1), 1, 102)  # needs cached KV: the callback fails
        with pytest.raises((EvictionCallbackError, KeyboardInterrupt)):
            c.take_checkpoint_ops()
        return c.checkpoint_fates()

    def boom(h: int) -> None:
        raise KeyError(h)

    failed, interrupted = fates(boom), fates(_interrupt)
    assert failed["checkpoints_kept"] + failed["checkpoints_dropped"] == 2
    assert interrupted["checkpoints_kept"] + interrupted["checkpoints_dropped"] == 2  # is 1


# --- event log / check-log ------------------------------------------------------------------


class Colour(enum.IntEnum):
    RED = 3
    BELOW = -1


@pytest.mark.parametrize(
    "run",
    [
        lambda c: c.resumable_hit(Seq(0), Colour.RED, [1]),  # "hit 3 exceeds the 1 block hashes"
        lambda c: c.begin_restore(1, Colour.BELOW),  # "dst_slot must be >= 0, got -1"
        lambda c: c.ensure_free_units(Colour.BELOW),  # "count must be >= 0, got -1"
    ],
    ids=["resumable_hit", "begin_restore", "ensure_free_units"],
)
def test_check_log_accepts_an_int_enum_argument_in_an_error_message(run: Any) -> None:
    """The message formats the int subclass with str() (IntEnum: "3"); the replay's
    stand-in has only the repr ("<Colour.RED: 3>"), which str() also gives."""
    result = CL.check_log(_logged(run))
    assert result.ok, result.text()


@pytest.mark.parametrize(
    "run",
    [
        # a sequence-shaped object is logged as {"seq": ...}; the replay's _Seq has another repr
        lambda c: c.attach_midstep_scratch(Seq(0), 1),
        # a set is logged sorted; rebuilt in that order its repr differs ({8, 0} vs {0, 8})
        lambda c: c.attach_midstep_scratch(set([8, 0]), 1),
    ],
    ids=["a sequence", "a set"],
)
def test_check_log_accepts_a_refused_attach_logged_as_its_value(run: Any) -> None:
    """A refused attach_midstep_scratch is now logged as the value passed; the message
    names it by repr, which the replay must reproduce."""
    result = CL.check_log(_logged(run))
    assert result.ok, result.text()


def test_check_log_gives_a_verdict_on_a_header_with_a_huge_pool() -> None:
    """check_log "never raises for bad input": a header whose num_units is 10**12 (one edited
    field) makes the replay build the reference pool's free set, set(range(10**12)): it
    raises MemoryError (here under a 1 GiB address-space limit; without one it eats the
    machine's memory) instead of answering unreadable."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import io, json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from pagedstate import impl as I
        from pagedstate.impl import eventlog as EL
        from pagedstate.models import checklog as CL
        from pagedstate.spec import PagedStateCheckpointSpec
        sp = PagedStateCheckpointSpec(page_unit_bytes=10, slot_bytes=20, layout_id="t",
                                      image_bytes=20)
        c = I.PagedStateCheckpointCoordinator(I.UnitPool(4), sp, True)
        buf = io.StringIO()
        EL.attach(c, EL.EventLog(buf))
        EL.detach(c)
        lines = buf.getvalue().splitlines()
        header = json.loads(lines[0])
        header["num_units"] = 10**12
        print(CL.check_log([json.dumps(header)] + lines[1:]).status)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-400:]  # was: MemoryError
    assert out.stdout.strip() == "unreadable"


# --- conformance kit ----------------------------------------------------------------------


class _NoStore:
    """The production coordinator behind an integration that exposes no ``store``."""

    def __init__(self, pool: Any, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_c", I.PagedStateCheckpointCoordinator(pool, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        if name == "store":
            raise AttributeError(name)
        return getattr(self._c, name)


def test_the_kit_runs_a_coordinator_without_a_store_when_store_calls_is_off() -> None:
    """docs/conformance.md: "If your integration has no `store`, pass
    ConformanceConfig(store_calls=False)". The factory check still demands ``store``."""
    from hypothesis import HealthCheck, settings

    from pagedstate.engines import conformance as K

    s = settings(
        max_examples=5,
        stateful_step_count=10,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    config = K.ConformanceConfig(store_calls=False)
    K.run_conformance(_NoStore, I.UnitPool, settings=s, config=config)


@pytest.mark.parametrize("timeout", [None, "10"])
def test_conformance_config_refuses_a_timeout_that_is_not_a_number(timeout: Any) -> None:
    """Every other field is validated at construction (ValueError); timeout_s is not, and the
    kit then crashes mid-run with a TypeError that Hypothesis reports as a falsifying
    example of the store under test."""
    from pagedstate.engines import conformance as K

    with pytest.raises(ValueError):
        K.ConformanceConfig(timeout_s=timeout)
