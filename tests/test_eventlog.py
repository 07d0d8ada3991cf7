"""Trace validation: the production coordinator's event log (``pagedstate.impl.eventlog``)
replayed on the reference model (``pagedstate.models.checklog``, ``pagedstate check-log``).

(a) Logs of long random runs (thousands of calls over small configurations: offload reports
    in any order, duplicated and late, clock jumps forwards and back, transfers, leases,
    midstep scratch, the engine's own KV reservations, bad inputs that raise) validate, and
    so does a log of the trace-driven engine model.
(b) Editing one line of a log makes the check fail at that line (parametrized over edits of
    results, arguments, rows, clock readings, outside answers, state counters, sequence
    numbers, dropped, swapped and repeated lines, the footer); an edit invisible at its own
    line is reported at the first line where it shows, and an edit that yields another valid
    history is, rightly, not a disagreement.
(c) The log is off by default and costs nothing when off: no wrapper, hook or proxy, no line
    of the module executed; detaching restores the objects exactly.
(d) ``pagedstate check-log`` exits 0 / 1 / 2.
(e) Owners, ops, leases and other values survive the JSON round trip, and both sides of the
    codec encode alike.

Plus: the bounds (``max_lines``, the sequence-id map), a log write error, clones, re-entrant
calls and KV-cache calls (reported as not replayable), and the behaviour differences between
the production store and the reference that this validation found.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, Seq, spec
from hypothesis import given
from hypothesis import strategies as st

from pagedstate import impl as I
from pagedstate.impl import eventlog as EL
from pagedstate.models import checklog as CL
from pagedstate.models import cli
from pagedstate.models import reference as R
from pagedstate.spec import (
    CheckpointRestoreOp,
    CheckpointStoreOp,
    InvalidArgumentError,
    ManualCompletion,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)
from pagedstate.spec import tables as T

# ---------------------------------------------------------------------------------------
# A random engine, logged
# ---------------------------------------------------------------------------------------


class Tier:
    """A CPU tier: serves every third hash; reports a load count."""

    def could_serve(self, prefix_hash: int) -> bool:
        return prefix_hash % 3 == 0

    def stats(self) -> dict[str, int]:
        return {"loads": 1}


class BareTier:
    """A CPU tier without ``stats``."""

    def could_serve(self, prefix_hash: int) -> bool:
        return prefix_hash % 2 == 0


class SlotSeq:
    """A sequence without weak-reference support (``__slots__``), as engines often have."""

    __slots__ = ("state_slot", "has_per_req_cache")

    def __init__(self, state_slot: int) -> None:
        self.state_slot = state_slot
        self.has_per_req_cache = True


class Driver:
    """A logged production coordinator driven at random (after ``test_impl_lockstep``)."""

    def __init__(self, rng: random.Random, **log_kwargs: Any) -> None:
        self.rng = rng
        self.clock = FakeClock(0.0)
        self.units = rng.choice([5, 6, 8, 12, 20])
        upc = rng.choice([1, 2, 3])
        tier: Any = rng.choice([Tier(), Tier(), BareTier(), None])
        self.c = I.PagedStateCheckpointCoordinator(
            I.UnitPool(self.units),
            spec(10, 10 * upc),
            True,
            tier,
            rng.random() < 0.7,
            clock=self.clock,
            offload_backlog_cap=rng.choice([1, 2, 3, 8]),
            forfeit_bound=rng.choice([1, 2, 4]),
            change_log_size=rng.choice([4, 16, 4096]),
        )
        self.buf = io.StringIO()
        self.log = EL.attach(self.c, EL.EventLog(self.buf, **log_kwargs))
        self.c.attach_midstep_scratch(I.SlotPool([50, 51, 52]), rng.choice([0, 1, 2, 4]))
        kind = SlotSeq if rng.random() < 0.5 else Seq
        self.seqs: list[Any] = [kind(k) for k in range(4)]
        self.hashes = list(range(1, 7))
        self.leases: list[SuspendedCheckpointRestore] = []
        self.ops: list[StateStoreOperationId] = []
        self.owners: list[Any] = []
        self.res: list[tuple[int, int, int]] = []
        self.kv: dict[int, list[int]] = {}
        self.next_owner = 0
        self.tokens: list[ManualCompletion] = []
        self.orng = random.Random(self.units * 7 + upc)

    def call(self, target: str, name: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        obj = self.c.pool if target == "p" else self.c
        try:
            return "ok", getattr(obj, name)(*args, **kwargs)
        except Exception as exc:
            return "raised", exc

    def lines(self) -> list[str]:
        self.log.close()
        return self.buf.getvalue().splitlines()

    def step(self) -> None:
        rng, h, s = self.rng, self.rng.choice(self.hashes), self.rng.choice(self.seqs)
        orng = self.orng  # the overlap calls' own stream: the older calls' draws are unmoved
        if self.tokens and orng.random() < 0.03:  # the device finishes a batch, late
            self.tokens.pop(orng.randrange(len(self.tokens))).set()
        k = rng.randrange(44)
        if k == 0:
            if orng.random() < 0.3:  # an explicit forward id, sometimes skipping one
                forward = self.c.next_forward + orng.randrange(2)
                self.call("c", "take_checkpoint_ops", forward=forward)
            else:
                self.call("c", "take_checkpoint_ops")
        elif k == 1:
            if orng.random() < 0.5:  # a completion token, reported done late and out of order
                token = ManualCompletion(done=orng.random() < 0.3)
                self.tokens.append(token)
                self.call("c", "complete_previous_batch", token)
            else:
                self.call("c", "complete_previous_batch")
            if orng.random() < 0.2:
                self.call("c", "settle_completions", orng.random() < 0.2)
            self.tokens = [t for t in self.tokens if not t.done][-4:]
        elif k in (2, 3):
            if orng.random() < 0.3:  # named forward: ahead, the one just drained, or stale
                last = self.c.last_forward
                fwd = orng.choice([self.c.next_forward, last if last is not None else 0,
                                  max(0, (last or 0) - 1)])
                self.call("c", "checkpoint", s, 1, h, forward=fwd)
            else:
                self.call("c", "checkpoint", s, 1, h)
        elif k == 4:
            self.call("c", "forget_pending", s)
        elif k in (5, 6):
            if self.orng.random() < 0.3:
                self.call("c", "begin_restore", h, rng.randrange(6), seq=s)
            else:
                self.call("c", "begin_restore", h, rng.randrange(6))
        elif k == 7:
            queued = list(self.c.store._queued_restores)
            slot = rng.choice(queued) if queued and rng.random() < 0.8 else rng.randrange(6)
            kind, v = self.call("c", "suspend_queued_restore", slot)
            if kind == "ok" and v is not None:
                self.leases.append(v)
        elif k == 8 and self.leases:
            lease = rng.choice(self.leases)
            name = rng.choice(["resume_suspended_restore", "release_suspended_restore"])
            kind, _ = self.call("c", name, lease)
            if kind == "ok" and rng.random() < 0.8:
                self.leases.remove(lease)  # some spent leases are reused (G3)
        elif k == 9:
            self.call("c", "unindex", h)
        elif k == 10 and rng.random() < 0.2:
            self.call("c", "clear_index")
        elif k == 11:
            self._kv()
        elif k == 12:
            kind, v = self.call("c", "take_offload_stores", rng.randrange(4))
            if kind == "ok":
                self.ops.extend(op for op, _ in v)
        elif k == 13:
            lim = rng.choice([None, 1, 3])
            kind, v = self.call("c", "acquire_checkpoint_source", h, max_inflight=lim)
            if kind == "ok" and v:
                self.ops.append(v[0])
        elif k in (14, 15) and self.ops:
            # Reports in any order, duplicated and late.
            name = "release_offload_store_source" if k == 14 else "settle_offload_store"
            self.call("c", name, rng.choice(self.ops))
        elif k == 16:
            self.clock.t += rng.choice([0.5, 5.0, 20.0, 20.0, -3.0])  # backwards too
        elif k == 17:
            self.call("c", "reclaim_stale_offload_pins", rng.choice([0, 1, 10, 100, -1, 0.5]))
        elif k == 18 and self.ops:
            self.call("c", "was_reclaimed", rng.choice(self.ops))
        elif k == 19:
            owner = rng.choice([("load", self.next_owner), f"load-{self.next_owner}",
                                ("load", ("gen", self.next_owner))])
            self.next_owner += 1
            kind, v = self.call("c", "reserve_transfer_units", owner)
            if kind == "ok" and v:
                self.owners.append(owner)
        elif k == 20 and self.owners:
            self.call("c", "release_transfer_units", rng.choice(self.owners))
        elif k == 21 and self.owners:
            self.call("c", "adopt_transfer_units", rng.choice(self.owners), h)
        elif k == 22:
            pos = [(j, rng.choice(self.hashes)) for j in range(rng.randrange(1, 3))]
            kind, v = self.call("c", "reserve_midstep", s, pos)
            if kind == "ok":
                self.res.extend(v)
        elif k == 23 and self.res:
            x = self.res.pop(rng.randrange(len(self.res)))
            self.call("c", rng.choice(["publish_midstep", "cancel_midstep"]), [x])
        elif k == 24:
            self.call("c", "has_available_units", rng.randrange(self.units + 4),
                      rng.choice([None, *self.hashes]))
        elif k == 25:
            self.call("c", "ensure_free_units", rng.randrange(self.units + 2))
        elif k == 26:
            blocks = [rng.choice(self.hashes) for _ in range(3)]
            self.call("c", "resumable_hit", s, rng.randrange(4), blocks, rng.random() < 0.2)
        elif k == 27:
            self.call("c", "checkpoint_fates")
        elif k == 28:
            self.call("c", "restore_queued_for", rng.randrange(6))
        elif k == 29:
            # Slots change between calls: the log records them at call time.
            s.state_slot = rng.choice([s.state_slot, -1, self.seqs.index(s)])
        elif k == 30:
            self.call("c", rng.choice(["contains", "unindex"]), h)
        elif k in (31, 32):
            self._bad_input()
        elif k == 33:
            self.call("c", "has_offload_pins")
        elif k == 34:
            s.has_per_req_cache = rng.random() < 0.8
            self.call("c", "applies", s)
        elif k == 35 and rng.random() < 0.1:
            self.call("c", "attach_offload", rng.choice([None, Tier(), BareTier()]),
                      sink=rng.random() < 0.7)
        elif k == 36:
            self.call("p", "mark_clean", rng.sample(range(self.units), rng.randrange(3)))
        elif k == 37 and self.kv:
            o = rng.choice(list(self.kv))
            kind, _ = self.call("p", "rekey_units", self.kv[o], ("live-kv", o),
                                ("live-kv", o + 100))
            if kind == "ok":
                self.kv[o + 100] = self.kv.pop(o)
        elif k == 38:
            # A garbage slot is filed with the boundary (both refuse it at the drain, which
            # this run does not reach: the slot is repaired first).
            s.state_slot = rng.choice([None, "x"])
            self.call("c", "checkpoint", s, 1, h)
            s.state_slot = self.seqs.index(s)
        elif k == 39:
            self.call("c", "reserve_midstep", s,
                      rng.choice([[(0, 1), (1, 2)], [[0, 1]], "ab", [(0, True)], []]))
        elif k == 40:
            # Several pins on one record, its prefix evicted, a source released (EVICTING
            # with pins left); or a source released and its report lost (reclaimed).
            kind, taken = self.call("c", "take_offload_stores", 2)
            got = taken if kind == "ok" and taken else []
            if not got:
                kind, v = self.call("c", "acquire_checkpoint_source", h)
                got = [v] if kind == "ok" and v else []
            for op, _units in got:
                self.ops.append(op)
                if rng.random() < 0.5:
                    self.call("c", "begin_restore", op.prefix_hash, rng.randrange(6))
                    self.call("c", "unindex", op.prefix_hash)
                self.call("c", "release_offload_store_source", op)
                if rng.random() < 0.5:
                    self.clock.t += 50.0
                    self.call("c", "reclaim_stale_offload_pins", 10)
        elif k >= 41:
            self.call("c", rng.choice(["take_checkpoint_ops", "complete_previous_batch"]))

    def _kv(self) -> None:
        rng = self.rng
        o = rng.randrange(3)
        if o in self.kv and rng.random() < 0.8:
            self.call("p", "release_units", self.kv.pop(o), ("live-kv", o))
        elif o in self.kv:
            self.call("p", "release_units", self.kv[o][:1], ("live-kv", o))  # G9: refused
        else:
            n = rng.randrange(1, 3)
            self.call("c", "ensure_free_units", n)
            kind, v = self.call("p", "reserve_units", n, ("live-kv", o))
            if kind == "ok" and v:
                self.kv[o] = v

    def _bad_input(self) -> None:
        rng = self.rng
        h = rng.choice(self.hashes)
        cases: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = [
            ("c", "begin_restore", (h, True), {}),
            ("c", "begin_restore", (str(h), 0), {}),
            ("c", "checkpoint", (self.seqs[0], -1, h), {}),
            ("c", "checkpoint", (self.seqs[0], 1, float(h)), {}),
            ("c", "unindex", (float(h),), {}),
            ("c", "unindex", (object(),), {}),
            ("c", "has_available_units", (-1,), {}),
            ("c", "has_available_units", (1, "h"), {}),
            ("c", "reclaim_stale_offload_pins", (math.nan,), {}),
            ("c", "reclaim_stale_offload_pins", (math.inf,), {}),
            ("c", "take_offload_stores", (-2,), {}),
            ("c", "acquire_checkpoint_source", (h,), {"max_inflight": "1"}),
            ("c", "settle_offload_store", ((h, 1),), {}),
            ("c", "release_offload_store_source", (StateStoreOperationId(h, 10**9),), {}),
            ("c", "was_reclaimed", ("op",), {}),
            ("c", "reserve_transfer_units", (None,), {}),
            ("c", "reserve_transfer_units", ([1],), {}),
            ("c", "release_transfer_units", ([1],), {}),
            ("c", "reserve_midstep", (self.seqs[0], [(0,)]), {}),
            ("c", "publish_midstep", ([(99, 0, h)],), {}),
            ("c", "cancel_midstep", ([(50, 0)],), {}),
            ("c", "resumable_hit", (self.seqs[0], 5, [h]), {}),
            ("c", "resumable_hit", (self.seqs[0], -1, [h]), {}),
            ("c", "attach_midstep_scratch", (I.SlotPool([50]), -1), {}),
            ("p", "reserve_units", (-1, ("x", 0)), {}),
            ("p", "reserve_units", (1, None), {}),
            ("p", "release_units", ([0, 0], ("x", 0)), {}),
            ("p", "release_units", ({0}, ("x", 0)), {}),
            ("p", "rekey_units", ([0], ("x", 0), None), {}),
            ("p", "mark_clean", ([self.units],), {}),
            ("p", "mark_clean", ([-1],), {}),
        ]
        if self.leases:
            lease = rng.choice(self.leases)
            cases.append(("c", "resume_suspended_restore",
                          (SuspendedCheckpointRestore(lease.checkpoint_id, lease.op, 10**6),), {}))
            cases.append(("c", "release_suspended_restore", ("lease",), {}))
        if self.owners:
            cases.append(("c", "adopt_transfer_units", (self.owners[0], "h"), {}))
        target, name, args, kwargs = rng.choice(cases)
        self.call(target, name, *args, **kwargs)


SEEDS = range(10)
STEPS = 4000
_LOGS: dict[int, list[str]] = {}


def random_log(seed: int) -> list[str]:
    if seed not in _LOGS:
        d = Driver(random.Random(seed))
        for _ in range(STEPS):
            d.step()
        _LOGS[seed] = d.lines()
    return list(_LOGS[seed])


def parsed(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(x) for x in lines]


# ---------------------------------------------------------------------------------------
# (a) Long random runs validate
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_random_run_log_validates(seed: int) -> None:
    lines = random_log(seed)
    result = CL.check_log(lines)
    assert result.ok, result.text()
    assert result.calls == len(lines) - 2 > 3000
    assert result.lines == len(lines) and result.exit_code == 0
    objs = parsed(lines)
    assert objs[0]["kind"] == "header" and objs[-1] == {"kind": "footer", "calls": result.calls}
    assert [o["n"] for o in objs[1:-1]] == list(range(1, result.calls + 1))
    assert sum("raised" in o for o in objs) > 100  # bad inputs were logged and replayed


def test_random_runs_are_not_vacuous() -> None:
    """Together the logs take nearly every reachable table row, read the clock, consult the
    offload index and scratch pool, and hold every coordinator and pool call."""
    labels: set[str] = set()
    calls: set[str] = set()
    fields: set[str] = set()
    for seed in SEEDS:
        for o in parsed(random_log(seed))[1:-1]:
            labels.update(o["rows"])
            calls.add(o["call"])
            fields.update(o)
            for event in o.get("ext", []):
                fields.add(event[0])
    reachable = {t.label(r) for t in T.TABLES.values() for r in t.rows if not r.defensive}
    assert len(labels & reachable) >= len(reachable) - 1, sorted(reachable - labels)
    assert calls >= set(EL.COORDINATOR_CALLS) | {f"pool.{n}" for n in EL.POOL_CALLS}
    assert {"clock", "ext", "seqs", "kwargs", "raised", "ok"} <= fields
    assert {"offload.could_serve", "offload.stats", "scratch.has_free", "scratch.pop",
            "scratch.release"} <= fields


def test_engine_model_log_validates() -> None:
    """A log of the trace-driven engine model (pagedstate.models.replay) on the production store
    validates; its sequences have no weak references and the id map stays bounded."""
    from pagedstate.models.replay.engine import DEFAULT_TRACE, Engine, EngineConfig, load_trace

    config = EngineConfig(max_running=16, pool_units=600, chunk_blocks=2,
                          decode_tokens_per_pass=8, arrival_scale=0.1)
    engine = Engine(config, load_trace(DEFAULT_TRACE, 80), "pagedstate.impl")
    buf = io.StringIO()
    log = EL.attach(engine.coordinator, EL.EventLog(buf, seq_memory=8))
    engine.run()
    assert log.seq_ids <= 8 + config.max_running
    log.close()
    result = CL.check_log(buf.getvalue().splitlines())
    assert result.ok, result.text()
    assert result.calls > 2000


# ---------------------------------------------------------------------------------------
# (b) One edited line fails at that line
# ---------------------------------------------------------------------------------------

EDIT_SEED = 0


def _find(objs: list[dict[str, Any]], pred: Callable[[dict[str, Any]], bool]) -> int:
    for i, o in enumerate(objs):
        if "n" in o and i > 20 and pred(o):
            return i
    raise AssertionError("no line fits this edit")


Edit = Callable[[list[dict[str, Any]]], int]


def _set(objs: list[dict[str, Any]], i: int, **fields: Any) -> int:
    objs[i] = {**objs[i], **fields}
    return i


def edit_result_bool(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: o["call"] == "begin_restore" and o.get("ok") is True)
    return _set(objs, i, ok=False)


def edit_result_units(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: o["call"] == "pool.reserve_units" and bool(o.get("ok")))
    return _set(objs, i, ok=[u + 1 for u in objs[i]["ok"]])


def edit_result_drain(objs: list[dict[str, Any]]) -> int:
    def stores(o: dict[str, Any]) -> list[Any]:
        return o["ok"]["tuple"][0]["tuple"] if o.get("ok") else []

    i = _find(objs, lambda o: o["call"] == "take_checkpoint_ops" and bool(stores(o)))
    op = json.loads(json.dumps(objs[i]["ok"]))
    op["tuple"][0]["tuple"][0]["store_op"]["src_slot"] += 1
    return _set(objs, i, ok=op)


def edit_error_message(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: "raised" in o)
    return _set(objs, i, raised={**objs[i]["raised"], "message": "something else"})


def edit_error_to_result(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: "raised" in o)
    o = dict(objs[i])
    del o["raised"]
    objs[i] = {**o, "ok": None}
    return i


def edit_argument_count(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: o["call"] == "pool.reserve_units" and bool(o.get("ok")))
    args = list(objs[i]["args"])
    args[0] += 1
    return _set(objs, i, args=args)


def edit_argument_max_inflight(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: o["call"] == "take_offload_stores" and bool(o.get("ok")))
    return _set(objs, i, args=[0])


def edit_argument_hash(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: o["call"] == "unindex" and bool(o["rows"]))
    return _set(objs, i, args=[10**6])


def edit_argument_seq_slot(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: o["call"] == "resumable_hit" and "raised" not in o
              and o["args"][0]["has_per_req_cache"] is True and o["ok"] != o["args"][1])
    seq = {**objs[i]["args"][0], "has_per_req_cache": False}
    return _set(objs, i, args=[seq, *objs[i]["args"][1:]])


def edit_drop_row(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: len(o["rows"]) >= 2)
    return _set(objs, i, rows=objs[i]["rows"][1:])


def edit_wrong_row(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: "record:COPYING+publish->READY" in o["rows"])
    old, new = "COPYING+publish->READY", "COPYING+unindex->EVICTING"
    rows = [r.replace(old, new) for r in objs[i]["rows"]]
    return _set(objs, i, rows=rows)


def edit_swap_rows_of_one_machine(objs: list[dict[str, Any]]) -> int:
    def record_rows(o: dict[str, Any]) -> list[str]:
        return [r for r in o["rows"] if r.startswith("record:")]

    i = _find(objs, lambda o: len(set(record_rows(o))) >= 2)
    rows = list(objs[i]["rows"])
    a = next(k for k, r in enumerate(rows) if r.startswith("record:"))
    b = next(k for k, r in enumerate(rows) if r.startswith("record:") and r != rows[a])
    rows[a], rows[b] = rows[b], rows[a]
    return _set(objs, i, rows=rows)


def edit_clock_reading_dropped(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: bool(o.get("clock")))
    return _set(objs, i, clock=[])


def edit_outside_answer(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: any(e[0] == "offload.could_serve" for e in o.get("ext", [])))
    ext = json.loads(json.dumps(objs[i]["ext"]))
    ev = next(e for e in ext if e[0] == "offload.could_serve")
    ev[2]["ok"] = not ev[2]["ok"]
    return _set(objs, i, ext=ext)


def edit_scratch_slot(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: any(e[0] == "scratch.pop" for e in o.get("ext", [])))
    ext = json.loads(json.dumps(objs[i]["ext"]))
    ev = next(e for e in ext if e[0] == "scratch.pop")
    ev[2]["ok"] += 7
    return _set(objs, i, ext=ext)


def edit_post(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: True)
    return _set(objs, i, post={**objs[i]["post"], "free": objs[i]["post"]["free"] + 1})


def edit_sequence_number(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: True)
    return _set(objs, i, n=objs[i]["n"] + 1)


def edit_call_name(objs: list[dict[str, Any]]) -> int:
    i = _find(objs, lambda o: o["call"] == "contains" and o.get("ok") is True)
    return _set(objs, i, call="was_reclaimed")


def edit_drop_line(objs: list[dict[str, Any]]) -> int:
    i = len(objs) // 2
    del objs[i]
    return i


def edit_drop_last_call(objs: list[dict[str, Any]]) -> int:
    i = len(objs) - 2
    del objs[i]
    return i


def edit_swap_lines(objs: list[dict[str, Any]]) -> int:
    i = len(objs) // 3
    objs[i], objs[i + 1] = objs[i + 1], objs[i]
    return i


def edit_repeat_line(objs: list[dict[str, Any]]) -> int:
    i = len(objs) // 4
    objs.insert(i + 1, objs[i])
    return i + 1


def edit_footer_count(objs: list[dict[str, Any]]) -> int:
    i = len(objs) - 1
    return _set(objs, i, calls=objs[i]["calls"] + 1)


EDITS: dict[str, tuple[Edit, str]] = {
    "result: a bool": (edit_result_bool, "mismatch"),
    "result: unit ids": (edit_result_units, "mismatch"),
    "result: a store op": (edit_result_drain, "mismatch"),
    "error message": (edit_error_message, "mismatch"),
    "error made a result": (edit_error_to_result, "mismatch"),
    "argument: a count": (edit_argument_count, "mismatch"),
    "argument: max_inflight": (edit_argument_max_inflight, "mismatch"),
    "argument: a hash": (edit_argument_hash, "mismatch"),
    "argument: a sequence field": (edit_argument_seq_slot, "mismatch"),
    "rows: one dropped": (edit_drop_row, "mismatch"),
    "rows: a wrong row": (edit_wrong_row, "mismatch"),
    "rows: one machine's order": (edit_swap_rows_of_one_machine, "mismatch"),
    "clock: a reading dropped": (edit_clock_reading_dropped, "mismatch"),
    "ext: an offload answer": (edit_outside_answer, "mismatch"),
    "ext: a scratch slot": (edit_scratch_slot, "mismatch"),
    "post: a counter": (edit_post, "mismatch"),
    "sequence number": (edit_sequence_number, "mismatch"),
    "call name": (edit_call_name, "mismatch"),
    "line dropped": (edit_drop_line, "mismatch"),
    "last call dropped": (edit_drop_last_call, "mismatch"),
    "lines swapped": (edit_swap_lines, "mismatch"),
    "line repeated": (edit_repeat_line, "mismatch"),
    "footer count": (edit_footer_count, "mismatch"),
}


@pytest.mark.parametrize("seed", [EDIT_SEED, 2])
@pytest.mark.parametrize("name", list(EDITS))
def test_one_edited_line_fails_at_that_line(name: str, seed: int) -> None:
    edit, status = EDITS[name]
    objs = parsed(random_log(seed))
    index = edit(objs)
    result = CL.check_log([json.dumps(o) for o in objs])
    assert result.status == status, result.text()
    assert result.line == index + 1, result.text()
    assert result.exit_code == 1
    assert f"at line {index + 1}" in result.text()


def test_truncation_is_never_a_pass() -> None:
    """The TraceMatched lesson: a log cut short fails, at the line where it was cut."""
    lines = random_log(EDIT_SEED)
    no_footer = CL.check_log(lines[:-1])
    assert no_footer.status == "incomplete" and no_footer.line == len(lines)
    assert no_footer.calls == len(lines) - 2 and no_footer.exit_code == 1
    assert "without its footer" in no_footer.text()
    accepted = CL.check_log(lines[:-1], require_footer=False)
    assert accepted.ok and "no footer" in accepted.text()
    cut = CL.check_log([*lines[:100], lines[100][: len(lines[100]) // 2]])
    assert cut.status == "unreadable" and cut.line == 101 and cut.exit_code == 2
    assert CL.check_log(lines[:1]).status == "incomplete"
    empty = CL.check_log([])
    assert empty.status == "unreadable" and empty.line == 1
    headless = CL.check_log(lines[1:])
    assert headless.status == "unreadable" and headless.line == 1
    after = CL.check_log([*lines, lines[-2]])
    assert after.status == "mismatch" and after.line == len(lines) + 1


def test_an_edit_invisible_at_its_line_is_reported_where_it_shows() -> None:
    """Re-filing a boundary under another hash returns nothing and takes no row: the replay
    follows the edited history until a later call behaves differently, and reports that."""
    objs = parsed(random_log(EDIT_SEED))
    i = _find(objs, lambda o: o["call"] == "checkpoint" and "raised" not in o
              and o["post"]["pending"] > objs[_prev(objs, o)]["post"]["pending"])
    objs[i] = {**objs[i], "args": [*objs[i]["args"][:2], 10**6]}
    result = CL.check_log([json.dumps(o) for o in objs])
    assert result.status == "mismatch" and result.line is not None and result.line > i + 1


def _prev(objs: list[dict[str, Any]], o: dict[str, Any]) -> int:
    return objs.index(o) - 1


def test_an_edit_that_is_another_valid_history_is_not_a_disagreement() -> None:
    """Trace validation checks that the log is *a* behaviour of the reference model: asking
    ``contains`` about another absent hash is one, so it passes (a line digest would catch
    tampering; that is not what this checks)."""
    objs = parsed(random_log(EDIT_SEED))
    i = _find(objs, lambda o: o["call"] == "contains" and o.get("ok") is False)
    objs[i] = {**objs[i], "args": [10**6]}
    assert CL.check_log([json.dumps(o) for o in objs]).ok


# ---------------------------------------------------------------------------------------
# (c) Off by default, free when off
# ---------------------------------------------------------------------------------------


def _coordinator(clock: Any = None, tier: Any = None) -> I.PagedStateCheckpointCoordinator:
    return I.PagedStateCheckpointCoordinator(
        I.UnitPool(8), spec(10, 20), True, tier, True, clock=clock
    )


def test_off_by_default_nothing_installed() -> None:
    clock, tier = FakeClock(), Tier()
    c = _coordinator(clock, tier)
    c.attach_midstep_scratch(I.SlotPool([9]), 2)
    names = set(EL.COORDINATOR_CALLS) | {"clone"}
    assert not names & set(vars(c)), "no instance-level wrapper"
    assert not (set(EL.POOL_CALLS) | set(EL.POOL_KV_CALLS)) & set(vars(c.pool))
    assert c.on_transition is None and c.store.on_transition is None
    assert c.store.clock is clock and c.offload is tier
    assert type(c._scratch) is I.SlotPool
    assert EL.attached_log(c) is None
    for name in EL.COORDINATOR_CALLS:
        assert getattr(c, name).__func__ is getattr(I.PagedStateCheckpointCoordinator, name)


def test_impl_does_not_import_the_log() -> None:
    code = "import sys, pagedstate.impl; print('pagedstate.impl.eventlog' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def _eventlog_lines_run(fn: Callable[[], None]) -> int:
    """Lines of impl/eventlog.py executed while ``fn`` runs."""
    target = EL.__file__
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if frame.f_code.co_filename == target:
            if event == "line":
                count += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def _workload(c: I.PagedStateCheckpointCoordinator) -> Callable[[], None]:
    seqs = [Seq(k) for k in range(3)]

    def run() -> None:
        for h in range(1, 30):
            s = seqs[h % 3]
            c.checkpoint(s, 1, h)
            c.take_checkpoint_ops()
            c.complete_previous_batch()
            c.begin_restore(h, 7)
            c.take_offload_stores(2)
            c.reclaim_stale_offload_pins(1.0)
            c.forget_pending(s)
            c.take_checkpoint_ops()
            c.complete_previous_batch()
            u = c.pool.reserve_units(1, ("kv", h))
            if u:
                c.pool.release_units(u, ("kv", h))

    return run


def test_zero_cost_when_off_and_after_detach() -> None:
    """Off: not one line of the log module runs. Detached: the same, and the coordinator's
    and pool's attributes are exactly what they were."""
    clock, tier = FakeClock(), Tier()
    c = _coordinator(clock, tier)
    assert _eventlog_lines_run(_workload(c)) == 0
    d = _coordinator(clock, tier)
    hook_calls: list[str] = []

    def hook(machine: str, row: T.Row, subject: object) -> None:
        hook_calls.append(machine)

    d.on_transition = hook
    before = set(vars(d)), set(vars(d.store)), set(vars(d.pool))
    log = EL.attach(d, EL.EventLog(io.StringIO()))
    assert _eventlog_lines_run(_workload(d)) > 0 and hook_calls  # on: chained hook ran
    log.close()
    assert (set(vars(d)), set(vars(d.store)), set(vars(d.pool))) == before
    assert d.store.on_transition is hook and d.store.clock is clock and d.offload is tier
    assert EL.attached_log(d) is None
    assert _eventlog_lines_run(_workload(d)) == 0


def test_every_public_method_is_logged_or_listed() -> None:
    public = {
        n for k in I.PagedStateCheckpointCoordinator.__mro__ for n, v in vars(k).items()
        if not n.startswith("_") and callable(v) and not isinstance(v, type)
    }
    assert public == set(EL.COORDINATOR_CALLS) | EL.NOT_LOGGED
    assert set(EL.COORDINATOR_CALLS) == CL.COORDINATOR_CALLS
    assert set(EL.POOL_CALLS) == CL.POOL_CALLS and set(EL.POOL_KV_CALLS) == CL.POOL_KV_CALLS
    for name in CL.COORDINATOR_CALLS:
        assert callable(getattr(R.PagedStateCheckpointCoordinator, name))
    for name in CL.POOL_CALLS:
        assert callable(getattr(R.UnitPool, name))
    assert (EL.FORMAT, EL.VERSION) == (CL.FORMAT, CL.VERSION)


def test_private_fields_the_log_reads_exist() -> None:
    c = _coordinator()
    for name in ("_pending", "_pending_of_seq", "_scratch", "_max_ops_per_batch"):
        assert hasattr(c, name)
    for name in ("_offload_backlog_cap", "_forfeit_bound", "_change_log_size", "_next_lease_id"):
        assert hasattr(c.store, name)
    rc = R.PagedStateCheckpointCoordinator(R.UnitPool(4), spec(10, 20), True)
    assert hasattr(rc, "_pending")


# ---------------------------------------------------------------------------------------
# (d) The command line
# ---------------------------------------------------------------------------------------


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Callable[[list[str]], str]]:
    def write(lines: list[str]) -> str:
        path = tmp_path / f"log{len(list(tmp_path.iterdir()))}.ndjson"
        path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        return str(path)

    yield write


def test_cli_exit_codes(log_file: Callable[[list[str]], str],
                        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = random_log(1)
    assert cli.main(["check-log", log_file(lines)]) == 0
    assert "MATCHED" in capsys.readouterr().out

    objs = parsed(lines)
    i = edit_result_bool(objs)
    assert cli.main(["check-log", log_file([json.dumps(o) for o in objs])]) == 1
    out = capsys.readouterr().out
    assert f"MISMATCH at line {i + 1} (begin_restore)" in out
    assert 'result: reference {"ok":true}, log {"ok":false}' in out

    assert cli.main(["check-log", log_file(lines[:-1])]) == 1
    assert f"INCOMPLETE at line {len(lines)}" in capsys.readouterr().out
    assert cli.main(["check-log", "--allow-unclosed", log_file(lines[:-1])]) == 0
    capsys.readouterr()

    assert cli.main(["check-log", log_file([*lines[:5], "{not json", *lines[5:]])]) == 2
    assert "UNREADABLE at line 6" in capsys.readouterr().out
    assert cli.main(["check-log", log_file([])]) == 2
    assert "UNREADABLE at line 1" in capsys.readouterr().out
    bad_utf8 = tmp_path / "bad.ndjson"
    bad_utf8.write_bytes(lines[0].encode() + b"\n\xff\xfe\n")
    assert cli.main(["check-log", str(bad_utf8)]) == 2
    assert "UNREADABLE at line 2" in capsys.readouterr().out
    assert cli.main(["check-log", str(tmp_path / "missing.ndjson")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli.main(["check-log", log_file(_kv_cache_log())]) == 2
    assert "UNSUPPORTED at line" in capsys.readouterr().out


def test_cli_runs_as_a_command(log_file: Callable[[list[str]], str]) -> None:
    exe = Path(sys.executable).parent / "pagedstate"
    if not exe.exists() and not os.environ.get("CI"):
        # `make setup` installs it; only an interpreter without the project's venv lacks it.
        # In CI that would be a broken setup, so there the test runs and fails.
        pytest.skip("the pagedstate script is not installed next to this interpreter")
    ok = subprocess.run([str(exe), "check-log", log_file(random_log(2))], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr


# ---------------------------------------------------------------------------------------
# (e) Values round-trip
# ---------------------------------------------------------------------------------------

_restore_op = CheckpointRestoreOp(3, (4, 5), 20, "lay")
VALUES: list[Any] = [
    None, True, False, 0, -7, 2**80, "s", "", 1.5, -0.0, math.inf, -math.inf,
    [1, [2, (3,)]], (1, (2, [3])), (), [], {"a": 1, 2: (3,)}, {1, 2}, frozenset({("x", 1)}),
    b"\x00\xff",
    ("live-kv", 3), ("state-transfer", ("load", 7)), ("a", ("b", ("c", 1))), frozenset(),
    StateStoreOperationId(5, 2),
    CheckpointStoreOp(1, (0, 1), 20, "lay"),
    _restore_op,
    SuspendedCheckpointRestore(9, _restore_op, 4),
    SuspendedCheckpointRestore(9, _restore_op),
    [(StateStoreOperationId(1, 1), (2, 3))],
    ((CheckpointStoreOp(1, (0,), 10, "l"),), (_restore_op,)),
]


def _round_trip(value: Any) -> Any:
    text = json.dumps(EL.encode(value))
    return CL.decode(json.loads(text))


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_round_trip(value: Any) -> None:
    back = _round_trip(value)
    assert back == value and type(back) is type(value)
    assert CL.encode(back) == EL.encode(value)
    try:
        hash(value)
    except TypeError:
        return
    assert hash(back) == hash(value)


def test_nan_round_trips() -> None:
    assert math.isnan(_round_trip(math.nan))
    assert EL.encode(math.nan) == CL.encode(math.nan) == {"float": "nan"}


owners = st.recursive(
    st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none()),
    lambda inner: st.one_of(st.tuples(inner, inner), st.tuples(inner),
                            st.frozensets(inner, max_size=3)),
    max_leaves=8,
)


@given(owners)
def test_owners_round_trip_hashable(owner: Any) -> None:
    back = _round_trip(owner)
    assert back == owner and hash(back) == hash(owner)
    assert CL.encode(back) == EL.encode(owner)


def test_sequences_and_opaque_values() -> None:
    seq_ids: dict[int, int] = {}

    def sid(obj: object) -> int:
        return seq_ids.setdefault(id(obj), len(seq_ids))

    s = Seq(4)
    enc = EL.encode([s, s, Seq(1)], sid)
    assert enc == [{"seq": 0, "state_slot": 4, "has_per_req_cache": True}] * 2 + [
        {"seq": 1, "state_slot": 1, "has_per_req_cache": True}
    ]
    made: dict[int, Any] = {}
    back = CL.decode(enc, lambda i: made.setdefault(i, CL._Seq(i)))
    assert back[0] is back[1] is made[0] and back[2].state_slot == 1
    assert CL.encode(back) == enc
    opaque = EL.encode(object())
    assert set(opaque) == {"object", "repr"} and opaque["object"] == "object"
    assert CL.decode(opaque) == CL.decode(opaque) and repr(CL.decode(opaque)) == opaque["repr"]
    with pytest.raises(ValueError):
        CL.decode({"nope": 1})
    with pytest.raises(ValueError):
        CL.decode({"tuple": 1})


# ---------------------------------------------------------------------------------------
# Bounds, errors, clones, what cannot be replayed
# ---------------------------------------------------------------------------------------


def test_max_lines_stops_and_detaches() -> None:
    d = Driver(random.Random(5), max_lines=300)
    for _ in range(2000):
        d.step()
    assert d.log.stopped == "max_lines" and d.log.calls == 300 and not d.log.attached
    assert EL.attached_log(d.c) is None and "checkpoint" not in vars(d.c)
    lines = d.lines()
    assert len(lines) == 302
    assert json.loads(lines[-1]) == {"kind": "footer", "calls": 300, "stopped": "max_lines"}
    result = CL.check_log(lines)
    assert result.ok and result.stopped == "max_lines" and "went on unlogged" in result.text()


class FailingStream(io.StringIO):
    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def write(self, text: str) -> int:
        if self.after <= 0:
            raise OSError("disk full")
        self.after -= 1
        return super().write(text)


def test_a_write_error_stops_the_log_not_the_engine() -> None:
    stream = FailingStream(after=50)
    c = _coordinator(FakeClock(), Tier())
    log = EL.attach(c, EL.EventLog(stream))
    _workload(c)()  # runs to the end
    assert isinstance(log.error, OSError) and log.stopped == "error" and not log.attached
    log.close()
    result = CL.check_log(stream.getvalue().splitlines())
    assert result.status == "incomplete" and result.calls == 49


def test_seq_id_map_is_bounded() -> None:
    c = _coordinator()
    log = EL.attach(c, EL.EventLog(io.StringIO(), seq_memory=10))
    for _ in range(500):
        c.applies(Seq(0))  # weakly held: each entry goes with its sequence
    assert log.seq_ids == 0
    held = [SlotSeq(k) for k in range(4)]
    for k, s in enumerate(held):
        c.checkpoint(s, 1, 7 + k)  # pending: their ids must survive any trim
    ids = [log._seq_ids(s) for s in held]  # type: ignore[misc]
    for k in range(500):
        c.applies(SlotSeq(k))  # no weak references: held strongly, trimmed past the bound
    assert log.seq_ids <= 10 + len(held)
    assert [log._seq_ids(s) for s in held] == ids  # type: ignore[misc]
    c.take_checkpoint_ops()
    log.close()


def test_clone_is_uninstrumented_and_the_log_still_validates() -> None:
    buf = io.StringIO()
    c = _coordinator(FakeClock(), Tier())
    log = EL.attach(c, EL.EventLog(buf))
    c.checkpoint(Seq(1), 1, 5)
    twin = c.clone()
    assert EL.attached_log(twin) is None and "checkpoint" not in vars(twin)
    assert twin.store.on_transition is None and not isinstance(twin.offload, EL._External)
    assert "reserve_units" not in vars(twin.pool)
    twin.take_checkpoint_ops()
    twin.complete_previous_batch()
    c.take_checkpoint_ops()
    log.close()
    assert CL.check_log(buf.getvalue().splitlines()).ok


def test_attach_refuses() -> None:
    c = _coordinator()
    c.checkpoint(Seq(0), 1, 3)
    c.take_checkpoint_ops()
    with pytest.raises(InvalidArgumentError, match="before the coordinator's first call"):
        EL.attach(c, EL.EventLog(io.StringIO()))
    fresh = _coordinator()
    log = EL.attach(fresh, EL.EventLog(io.StringIO()))
    with pytest.raises(InvalidArgumentError, match="attached already"):
        EL.attach(fresh, EL.EventLog(io.StringIO()))
    with pytest.raises(InvalidArgumentError, match="one coordinator"):
        EL.attach(_coordinator(), log)
    with pytest.raises(InvalidArgumentError, match="impl coordinator"):
        reference = R.PagedStateCheckpointCoordinator(R.UnitPool(4), spec(10, 20), True)
        EL.attach(reference, EL.EventLog(io.StringIO()))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        EL.EventLog(io.StringIO(), max_lines=0)


def test_a_log_file_by_path(tmp_path: Path) -> None:
    path = tmp_path / "events.ndjson"
    c = _coordinator(FakeClock(), Tier())
    with EL.EventLog(path) as log:
        EL.attach(c, log)
        _workload(c)()
    assert not log.attached and log.stopped == "closed"
    result = CL.check_file(str(path))
    assert result.ok, result.text()


def _kv_cache_log() -> list[str]:
    """An engine that caches KV blocks in the pool and unindexes from ``on_evict``."""
    buf = io.StringIO()
    c = _coordinator()
    c.pool.on_evict = lambda h: c.unindex(h)
    log = EL.attach(c, EL.EventLog(buf))
    units = c.pool.reserve_units(8, ("kv", 0))
    assert units is not None
    c.pool.cache_units(units, ("kv", 0), list(range(100, 108)))
    c.pool.reserve_units(2, ("kv", 1))  # evicts two cached blocks: a nested unindex each
    log.close()
    return buf.getvalue().splitlines()


def test_kv_cache_and_reentrant_calls_are_logged_and_refused() -> None:
    lines = _kv_cache_log()
    objs = parsed(lines)
    assert [o.get("call") for o in objs[1:-1]] == [
        "pool.reserve_units", "pool.cache_units", "unindex", "unindex", "pool.reserve_units",
    ]
    assert [o.get("depth") for o in objs[3:5]] == [1, 1] and objs[1].get("depth") is None
    result = CL.check_log(lines)
    assert result.status == "unsupported" and result.line == 3 and result.exit_code == 2
    assert "KV cache" in result.reason
    nested_only = [lines[0], lines[1], *lines[3:]]
    nested = CL.check_log(nested_only)
    assert nested.status == "unsupported" and nested.line == 3 and "re-entrant" in nested.reason


def test_store_calls_outside_the_coordinator_are_flagged() -> None:
    buf = io.StringIO()
    c = _coordinator()
    log = EL.attach(c, EL.EventLog(buf))
    c.store.begin_store(5, 0)  # not through the coordinator: its row is seen outside any call
    c.contains(5)
    log.close()
    lines = buf.getvalue().splitlines()
    # The store's own reservation (made inside ``pool._as_store()``) is not an engine call
    # and is not logged; the row it took is reported on the next line (line 2), which the
    # checker refuses.
    assert json.loads(lines[1])["call"] == "contains"
    result = CL.check_log(lines)
    assert result.status == "unsupported" and result.line == 2
    assert "outside any logged call" in result.reason


# ---------------------------------------------------------------------------------------
# Rows: what the comparison leaves out, and the differences the validation found
# ---------------------------------------------------------------------------------------


def test_normalize_rows() -> None:
    pin = "record:READY+pin_restore->READY"
    begin = "restore:NONE+begin_restore->QUEUED"
    ob = "scratch:QUEUED+issue[over_budget]->QUEUED"
    assert CL.normalize_rows([pin, begin]) == CL.normalize_rows([begin, pin])
    assert CL.normalize_rows([ob, ob, ob]) == CL.normalize_rows([ob])
    a, b = "record:ABSENT+begin_store->COPYING", "record:COPYING+publish->READY"
    assert CL.normalize_rows([a, b]) != CL.normalize_rows([b, a])
    assert CL.normalize_rows([a, a]) != CL.normalize_rows([a])


def test_row_reporting_order_differs_by_design() -> None:
    """The production store reports a pin's record row before the restore/offload row; the
    reference looks the operation's row up first (the one difference in interleaving the
    random logs show, besides the over-budget repeat)."""
    c = _coordinator(FakeClock(), Tier())
    buf = io.StringIO()
    log = EL.attach(c, EL.EventLog(buf))
    s = Seq(0)
    c.checkpoint(s, 1, 3)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    c.begin_restore(3, 1)
    c.acquire_checkpoint_source(3)
    log.close()
    objs = parsed(buf.getvalue().splitlines())
    assert objs[4]["rows"] == ["record:READY+pin_restore->READY",
                               "restore:NONE+begin_restore->QUEUED"]
    assert objs[5]["rows"] == [
        "record:READY+pin_lease[settled]->READY",
        "offload:NONE+acquire->PINNED",
    ]
    assert CL.check_log(buf.getvalue().splitlines()).ok


def _garbage_slot_log(call: str) -> tuple[list[str], int]:
    buf = io.StringIO()
    c = _coordinator()
    log = EL.attach(c, EL.EventLog(buf))
    s, t = Seq(0), Seq(1)
    c.checkpoint(t, 1, 4)
    c.checkpoint(s, 1, 5)
    s.state_slot = 1.5  # the engine hands the coordinator a garbage slot
    with pytest.raises(InvalidArgumentError):
        getattr(c, call)(*([s] if call == "forget_pending" else []))
    assert len(c._pending) == 2  # the production coordinator refused before any change
    log.close()
    return buf.getvalue().splitlines(), 4


def test_found_forget_pending_with_a_garbage_slot_now_agrees() -> None:
    """Found by this validation and fixed: ``forget_pending(seq)`` with a non-int
    ``state_slot`` used to drop the sequence's pending boundary in the reference before it
    raised (a G8 violation). Both now read the slot first (``pagedstate.spec.sequences``), so
    the production log validates on the reference."""
    lines, _line = _garbage_slot_log("forget_pending")
    result = CL.check_log(lines)
    assert result.status == "matched", result.text()


def test_found_drain_with_a_garbage_slot_now_agrees() -> None:
    """Found by this validation and fixed: ``take_checkpoint_ops()`` while a pending
    sequence's ``state_slot`` was 1.5 used to begin earlier stores in the reference and then
    raise with another message. Both now check every pending slot before anything changes,
    with one message, so the production log validates on the reference."""
    lines, _line = _garbage_slot_log("take_checkpoint_ops")
    result = CL.check_log(lines)
    assert result.status == "matched", result.text()


@pytest.mark.parametrize(
    "edit",
    [
        {"enabled": "yes"},
        {"enabled": "false"},
        {"offload": 1},
        {"scratch": None},
        {"readable_midstep": None},
        {"on_evict": "x"},
        {"coordinator": 5},
    ],
    ids=lambda e: f"{next(iter(e))}={next(iter(e.values()))!r}",
)
def test_a_header_flag_that_is_not_a_bool_is_unreadable(edit: dict[str, Any]) -> None:
    """Header flags are JSON true/false: ``"false"`` must not replay as enabled."""
    objs = parsed(random_log(0))
    objs[0].update(edit)
    result = CL.check_log([json.dumps(o) for o in objs])
    assert result.status == "unreadable" and result.line == 1, result.text()


def test_a_repeated_key_is_unreadable() -> None:
    """json keeps the last of two equal keys; the checker refuses the line instead."""
    lines = random_log(0)
    header = lines[0].rstrip("\n")
    assert header.endswith("}")
    lines[0] = header[:-1] + ', "enabled": false}'
    result = CL.check_log(lines)
    assert result.status == "unreadable" and result.line == 1, result.text()


def test_a_completion_token_is_logged_by_name_and_its_answers_replay() -> None:
    """SPEC D.13: the token is no data; the log names it ``token#K`` and records every
    ``query()`` the store makes of it, on the line that makes it, so check-log's stand-in
    answers the same: the lease refused before the token is done and granted after."""
    buf = io.StringIO()
    c = I.PagedStateCheckpointCoordinator(I.UnitPool(8), spec(10, 20), True)
    log = EL.attach(c, EL.EventLog(buf))
    s = Seq(0)
    c.checkpoint(s, 1, 7)
    c.take_checkpoint_ops()
    token = ManualCompletion()
    c.complete_previous_batch(token)
    assert c.acquire_checkpoint_source(7) is None
    token.set()
    assert c.acquire_checkpoint_source(7) is not None
    c.checkpoint(s, 1, 8)
    c.take_checkpoint_ops()
    pending = ManualCompletion()
    c.complete_previous_batch(pending)
    log.close()
    # detached: the store keeps the engine's own token again, not the log's wrapper
    assert [t for t, _ in c.store._completions] == [pending]
    assert c.store._completions[0][0] is pending
    objs = parsed(buf.getvalue().splitlines())
    complete = next(o for o in objs if o.get("call") == "complete_previous_batch")
    assert complete["args"] == [{"ext": "token#0"}]
    acquires = [o for o in objs if o.get("call") == "acquire_checkpoint_source"]
    assert [o["ext"] for o in acquires] == [
        [["token#0.query", [], {"ok": False}]],
        [["token#0.query", [], {"ok": True}]],
    ]
    assert CL.check_log([json.dumps(o) for o in objs]).ok
    acquires[1]["ext"][0][2] = {"ok": False}  # the token's answer edited: the lease differs
    result = CL.check_log([json.dumps(o) for o in objs])
    assert result.status == "mismatch", result.text()
