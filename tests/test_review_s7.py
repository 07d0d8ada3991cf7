"""The coordinator's drain under failing or re-entrant eviction callbacks, and the event
log + check-log on odd values. Every test here failed before its fix, each for the defect
its docstring names (the comment "was:" says what it saw)."""

from __future__ import annotations

import enum
import io
import json
from typing import Any

import pytest
from conftest import Seq, spec

from pagedstate import impl as I
from pagedstate.impl import eventlog as EL
from pagedstate.models import checklog as CL
from pagedstate.models import reference as R
from pagedstate.spec import (
    EvictionCallbackError,
    InvalidArgumentError,
    PagedStateError,
    check_invariants,
)


def _boom(h: int) -> None:
    raise KeyError(h)


def _scratch_world(on_evict: Any) -> tuple[Any, Any, Any]:
    """3-unit images; READY 101 in units 0-2; units 3-5 cached KV (301-303); a scratch pool
    [50, 51]; on_evict installed last."""
    pool = I.UnitPool(6)
    c = I.PagedStateCheckpointCoordinator(pool, spec(10, 25), True, readable_midstep=True)
    c.checkpoint(Seq(0), 1, 101)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    kv = pool.reserve_units(3, ("kv", 0))
    pool.cache_units(kv, ("kv", 0), [301, 302, 303])
    sp = I.SlotPool([50, 51])
    c.attach_midstep_scratch(sp, 8)
    pool.on_evict = on_evict
    return c, pool, sp


def _scratch_slots_accounted(c: Any, sp: Any) -> set[int]:
    """Every scratch slot the pool or the coordinator accounts for: free, reserved,
    queued or issued (a slot in none of them is lost)."""
    s = c.snapshot()
    return (
        set(sp.free_slots)
        | set(s.scratch_reserved)
        | {slot for _h, slot in s.scratch_queued}
        | set(s.scratch_issued)
    )


# --- 1. coordinator: a failing callback in the scratch part of the drain --------------------


def test_a_failing_callback_in_the_scratch_drain_keeps_the_restores_queued() -> None:
    """take_checkpoint_ops' docstring: if on_evict raises, "the restores stay queued for the
    next drain". A scratch store ran after take_restore_ops, so its failure lost them (the
    scratch stores now run first)."""
    c, _pool, _sp = _scratch_world(_boom)
    assert c.begin_restore(101, 7)
    r = c.reserve_midstep(Seq(1), [(5, 909)])
    c.publish_midstep(r)
    with pytest.raises(EvictionCallbackError):
        c.take_checkpoint_ops()
    assert c.restore_queued_for(7)  # was: the restore went in flight and was never returned


def test_a_failing_callback_in_the_scratch_drain_does_not_leak_its_scratch_slot() -> None:
    """The scratch slot whose store was given up was neither free, reserved, queued nor
    issued afterwards: lost for good (it is now issued, and returns at the completion)."""
    c, _pool, sp = _scratch_world(_boom)
    r = c.reserve_midstep(Seq(1), [(5, 909)])
    c.publish_midstep(r)
    with pytest.raises(EvictionCallbackError):
        c.take_checkpoint_ops()
    c.complete_previous_batch()
    held = _scratch_slots_accounted(c, sp)
    assert held == {50, 51}  # was: {51}


def test_a_given_up_drain_counts_the_store_whose_callback_failed() -> None:
    """Docstring: every store the drain began is given up and "counts as dropped". The store
    whose own reservation fired the failing callback was begun (its record exists), its
    boundary is gone, and it is counted nowhere."""
    pool = I.UnitPool(3)
    c = I.PagedStateCheckpointCoordinator(pool, spec(10, 25), True)
    kv = pool.reserve_units(3, ("kv", 0))
    pool.cache_units(kv, ("kv", 0), [301, 302, 303])
    pool.on_evict = _boom
    c.checkpoint(Seq(1), 1, 101)
    with pytest.raises(EvictionCallbackError):
        c.take_checkpoint_ops()
    assert len(c.store.records) == 1  # it was begun
    assert c.snapshot().pending_boundaries == ()  # and its boundary is gone
    fates = c.checkpoint_fates()
    assert fates["checkpoints_kept"] + fates["checkpoints_dropped"] == 1  # was: 0 + 0


# --- 2. coordinator: clear_index from a callback during the scratch drain -------------------


def test_clear_index_from_a_callback_during_the_scratch_drain() -> None:
    """clear_index swaps _scratch_queued/_scratch_by_hash for new objects while
    _take_scratch_stores still walks the old OrderedDict: the next entry KeyErrors in
    _unqueue_scratch (not a PagedStateError), and the already-begun scratch op stays in
    _store_ops, to be handed out by a later drain after its record was released."""
    c: Any = None

    def cb(h: int) -> None:
        c.clear_index()

    pool = I.UnitPool(6)
    c = I.PagedStateCheckpointCoordinator(pool, spec(10, 25), True, readable_midstep=True)
    kv = pool.reserve_units(6, ("kv", 0))
    pool.cache_units(kv, ("kv", 0), [None, None, 301, 302, 303, 304])
    sp = I.SlotPool([50, 51])
    c.attach_midstep_scratch(sp, 8)
    pool.on_evict = cb
    r = c.reserve_midstep(Seq(1), [(5, 909), (6, 910)])
    c.publish_midstep(r)
    try:
        c.take_checkpoint_ops()
    except PagedStateError:
        pass  # a specific error would be acceptable; KeyError is not
    pool.on_evict = None
    c.complete_previous_batch()  # the cleared record is released: units 0-2 are free
    assert pool.num_free == 6
    stores, _ = c.take_checkpoint_ops()
    assert stores == ()  # a copy into units nobody owns must never be handed out


# --- 3. check-log crashes instead of a verdict on a tampered line ---------------------------


def _small_log() -> list[str]:
    c = I.PagedStateCheckpointCoordinator(I.UnitPool(8), spec(10, 20), True)
    buf = io.StringIO()
    EL.attach(c, EL.EventLog(buf))
    c.checkpoint(Seq(0), 1, 5)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    c.contains(7)
    EL.detach(c)
    return buf.getvalue().splitlines()


def _tamper(lines: list[str], index: int, edit: Any) -> list[str]:
    out = list(lines)
    obj = json.loads(out[index])
    new = edit(obj, out[index])
    out[index] = new if isinstance(new, str) else json.dumps(obj)
    return out


TAMPERS = {
    "a set of a list": lambda o, t: o.__setitem__("args", [{"set": [[1]]}]),
    "a dict keyed by a list": lambda o, t: o.__setitem__("args", [{"dict": [[[1], 2]]}]),
    "kwargs holding a set of a set": lambda o, t: o.__setitem__(
        "kwargs", {"x": {"set": [{"set": []}]}}
    ),
    "a clock reading that is a set of a list": lambda o, t: o.__setitem__(
        "clock", [{"set": [[1]]}]
    ),
    "seqs not a list": lambda o, t: o.__setitem__("seqs", 5),
    "an int of 5000 digits": lambda o, t: t.replace('"args":[7]', '"args":[' + "9" * 5000 + "]"),
    "nesting 100000 deep": lambda o, t: t.replace(
        '"args":[7]', '"args":[' + "[" * 100000 + "]" * 100000 + "]"
    ),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_check_log_gives_a_verdict_for_a_tampered_line(name: str) -> None:
    """check_log: "Never raises for bad input: every problem is a verdict naming its line"."""
    lines = _small_log()
    index = len(lines) - 2  # the contains(7) line
    if name == "seqs not a list":
        index = 2  # the take_checkpoint_ops line
    tampered = _tamper(lines, index, TAMPERS[name])
    result = CL.check_log(tampered)  # was: TypeError / ValueError / RecursionError
    assert not result.ok and result.line == index + 1


# --- 4. check-log rejects logs of real runs ---------------------------------------------------


def _logged(run: Any, **kw: Any) -> list[str]:
    c = I.PagedStateCheckpointCoordinator(
        I.UnitPool(8), spec(10, 20), True, readable_midstep=True, **kw
    )
    c.attach_midstep_scratch(I.SlotPool([50, 51]), 4)
    buf = io.StringIO()
    EL.attach(c, EL.EventLog(buf))
    try:
        run(c)
    except PagedStateError:
        pass
    EL.detach(c)
    return buf.getvalue().splitlines()


class Thing:
    def __repr__(self) -> str:
        return "Thing()"


class Colour(enum.IntEnum):
    RED = 3


RUNS = {
    # the log writes {"ext": "scratch"} for whatever was passed; the replay passes its
    # (valid) stand-in, so the reference accepts what production refused
    "attach_midstep_scratch with a bad pool": lambda c: c.attach_midstep_scratch(Thing(), 1),
    # the error message names the argument's type; the replay's stand-in is an _Opaque
    "forget_pending(not a sequence)": lambda c: c.forget_pending(Thing()),
    "resumable_hit(block_hashes=not a list)": lambda c: c.resumable_hit(Seq(0), 0, Thing()),
    # an int subclass is encoded as a plain int, so the message's repr differs
    "an IntEnum op id": lambda c: c.settle_offload_store(Colour.RED),
    "an IntEnum scratch slot": lambda c: c.cancel_midstep(Colour.RED),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_check_log_accepts_a_log_of_a_run_where_a_call_raised(name: str) -> None:
    lines = _logged(RUNS[name])
    result = CL.check_log(lines)
    assert result.ok, result.text()  # was: MISMATCH at line 2


def test_check_log_accepts_a_run_with_a_nan_transfer_owner() -> None:
    """A NaN owner is a hashable owner like any other (it releases what it reserved, see
    test_review_s6.py); it is the same owner by identity. The log encodes it as {"float": "nan"} and
    the replay decodes a fresh NaN per line, so the duplicate-owner check no longer fires."""
    nan = float("nan")

    def run(c: Any) -> None:
        assert c.reserve_transfer_units(nan) is not None
        assert c.reserve_transfer_units(nan) is None  # duplicate active owner

    result = CL.check_log(_logged(run))
    assert result.ok, result.text()  # was: MISMATCH at line 3


def test_allow_unclosed_accepts_a_log_a_running_engine_is_still_writing() -> None:
    """docs/eventlog.md: --allow-unclosed accepts "one a running engine is still writing".
    A file being written ends in a partly flushed line (the stream writes in blocks), which
    the check reports as UNREADABLE (exit 2) rather than checking the lines it has."""
    lines = _small_log()
    live = [*lines[:-2], lines[-2][: len(lines[-2]) // 2]]
    result = CL.check_log(live, require_footer=False)
    assert result.ok, result.text()  # was: UNREADABLE at line 5
    assert f"its last line, {len(live)}, is cut off" in result.text()
    assert result.calls == len(live) - 2  # the header and the cut line are not calls
    # the same half line with a line after it is no line being written: unreadable there
    after = [*lines[:-2], lines[-2][: len(lines[-2]) // 2], lines[-2]]
    bad = CL.check_log(after, require_footer=False)
    assert bad.status == "unreadable" and bad.line == len(live), bad.text()
    # and without --allow-unclosed a cut line is unreadable, as before
    strict = CL.check_log(live)
    assert strict.status == "unreadable" and strict.line == len(live), strict.text()


def test_the_log_tells_another_scratch_pool_from_the_attached_one() -> None:
    """Under the event log the coordinator holds the log's wrapper of the scratch pool: the
    engine re-attaching its own pool (a new budget) is still the same pool, and another pool
    while slots are out is refused; the log names pools by their order of appearance
    (``scratch``, ``scratch#1``), so that the replay refuses and accepts the same calls."""
    c = I.PagedStateCheckpointCoordinator(
        I.UnitPool(12), spec(10, 20), True, readable_midstep=True
    )
    mine = I.SlotPool([50, 51])
    c.attach_midstep_scratch(mine, 4)
    buf = io.StringIO()
    EL.attach(c, EL.EventLog(buf))
    c.publish_midstep(c.reserve_midstep(Seq(0), [(1, 7)]))
    c.checkpoint(Seq(1), 1, 9)
    c.take_checkpoint_ops()
    c.attach_midstep_scratch(mine, 2)  # the same pool: accepted
    other = I.SlotPool([60, 61])
    with pytest.raises(InvalidArgumentError):
        c.attach_midstep_scratch(other, 4)  # slot 50 is out
    c.complete_previous_batch()
    c.attach_midstep_scratch(other, 4)  # every slot back: accepted
    assert c.reserve_midstep(Seq(2), [(1, 8)])[0][0] == 60
    EL.detach(c)
    lines = buf.getvalue().splitlines()
    assert '{"ext":"scratch#1"}' in "".join(lines).replace(" ", "")
    result = CL.check_log(lines)
    assert result.ok, result.text()


# --- 5. G8 in both models: completion raises after publishing -------------------------------


@pytest.mark.parametrize("M", [R, I], ids=["reference", "impl"])
def test_another_scratch_pool_is_refused_while_slots_are_out(M: Any) -> None:
    """attach_midstep_scratch used to accept a new slot pool while a scratch slot was
    issued; the next complete_previous_batch then published the batch's stores and raised
    releasing the slot into the new pool (a call that raised and changed things, G8). Now
    the re-attach is refused with nothing changed, in both models; the same pool with a new
    budget is accepted, and another pool once every slot is back."""
    c = M.PagedStateCheckpointCoordinator(M.UnitPool(12), spec(10, 20), True, readable_midstep=True)
    sp = M.SlotPool([50, 51])
    c.attach_midstep_scratch(sp, 4)
    c.publish_midstep(c.reserve_midstep(Seq(0), [(1, 7)]))
    c.checkpoint(Seq(1), 1, 9)
    c.take_checkpoint_ops()
    before = c.snapshot()
    with pytest.raises(InvalidArgumentError, match="1 scratch slot"):
        c.attach_midstep_scratch(M.SlotPool([60, 61]), 4)
    assert c.snapshot() == before
    c.attach_midstep_scratch(sp, 2)  # the same pool: a new budget
    c.complete_previous_batch()
    assert c.contains(7) and c.contains(9)
    assert check_invariants(c.snapshot()) == []
    assert sorted(sp.free_slots) == [50, 51]
    c.attach_midstep_scratch(M.SlotPool([60, 61]), 4)  # every slot is back
    assert sorted(c.reserve_midstep(Seq(2), [(1, 8)]))[0][0] == 60


def test_any_error_out_of_a_drain_gives_up_the_ops_it_began() -> None:
    """Not only an on_evict failure: whatever leaves a drain half done (here an interrupt
    raised by the engine's callback, which the pool does not catch) gives up the ops begun
    so far, so that no later drain hands out a copy into units released since."""

    def interrupt(h: int) -> None:
        raise KeyboardInterrupt

    pool = I.UnitPool(5)
    c = I.PagedStateCheckpointCoordinator(pool, spec(10, 20), True)  # 2-unit images
    kv = pool.reserve_units(3, ("kv", 0))
    pool.cache_units(kv, ("kv", 0), [301, 302, 303])
    pool.on_evict = interrupt
    c.checkpoint(Seq(0), 1, 101)  # takes the 2 vacant units: no callback
    c.checkpoint(Seq(1), 1, 102)  # needs cached KV: the callback interrupts
    with pytest.raises(KeyboardInterrupt):
        c.take_checkpoint_ops()
    pool.on_evict = None
    assert not c.store.contains_or_pending(101) and not c.store.contains_or_pending(102)
    c.complete_previous_batch()  # the given-up records release their units
    assert c.take_checkpoint_ops() == ((), ())
    assert pool.num_free == 5
    assert check_invariants(c.snapshot()) == []


def test_a_post_mismatch_names_only_the_counters_that_differ() -> None:
    """An edited ``post`` counter used to be shown as two whole dicts."""
    lines = _small_log()
    i = len(lines) - 2
    obj = json.loads(lines[i])
    obj["post"]["free"] += 1
    lines[i] = json.dumps(obj)
    result = CL.check_log(lines)
    assert result.status == "mismatch" and result.line == i + 1
    (post,) = [d for d in result.differences if d.field == "post"]
    assert list(post.expected) == ["free"] and list(post.logged) == ["free"]
    assert post.logged["free"] == post.expected["free"] + 1


def test_a_cut_last_line_without_allow_unclosed_points_at_the_flag() -> None:
    lines = _small_log()
    text = "\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2]
    result = CL.check_log(io.StringIO(text))
    assert result.status == "unreadable" and result.line == len(lines)
    assert "--allow-unclosed" in result.reason and "at at" not in result.reason
