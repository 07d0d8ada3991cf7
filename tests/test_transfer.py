"""Prefill/decode transfer of checkpoint images (SPEC D.12): the driver
:mod:`pagedstate.impl.transfer` on CPU tensors.

Two kinds of test:

- **in one process**, the protocol steps of :class:`Sender` and :class:`Receiver` (each with
  its own production pool and coordinator) driven by hand, the bytes handed over by a copy:
  header checks, refusals that change nothing, duplicate adoption, late releases from an
  earlier attempt, the abort path, a raising adoption;
- **two real processes over gloo**, and over nccl too where two GPUs are present (the
  device run, ``tools/transfer_device_run.sh``) (``spawn_transfer``: a ``file://``
  rendezvous, so no port to pick; every run is bounded, a rank still alive after its limit
  is killed): the happy
  path in both payload modes, the sender dying after its leases, after GO and in the middle
  of a round's payload, the sender stalling past the receiver's timeout (before GO and in
  the middle of a payload), the same image arriving twice, the receiver's pool unable to fit
  an image, and peers of different layouts;
- **the data group's deadline and abort** (:class:`Link` over a fake ``torch.distributed``:
  the nccl branch, which needs two GPUs to run for real, and the gloo branch) and a payload
  that cannot be aborted (the round's reservations are kept, never released).

Sizes: a slice of Qwen3-Next (1 recurrent and 2 attention layers, / 32, 128-token pages):
an image of 34,304 B in 3 units of 16,384 B (5 region pieces).
"""

from __future__ import annotations

import os
import re
from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")

from pagedstate.gpu.triton_copy import triton_available  # noqa: E402
from pagedstate.impl import transfer as T  # noqa: E402
from pagedstate.impl.transfer import (  # noqa: E402
    CRASH_EXIT,
    ImageHeader,
    Incoming,
    Receiver,
    Refusal,
    Sender,
    TransferConfig,
    spawn_transfer,
)
from pagedstate.spec import check_invariants  # noqa: E402
from pagedstate.spec.errors import (  # noqa: E402
    InvalidArgumentError,
    LeaseReusedError,
    StoreOwnedUnitsError,
)
from pagedstate.spec.types import TRANSFER_OWNER  # noqa: E402

U = 3  # units per image of the default slice
IMAGE = 34_304
#: Bound on one two-process run (each takes about 2 s here; the stall test about 6 s).
RUN_LIMIT_S = 60


def _nccl_pair() -> bool:
    """Two CUDA devices and NCCL: the two-process tests then also run over nccl."""
    import torch.distributed as dist

    return bool(
        torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()
    )


#: gloo always; nccl too on a machine with two GPUs (the device run, tools/transfer_device_run.sh).
BACKENDS = ["gloo"] + (["nccl"] if _nccl_pair() else [])


@pytest.fixture(params=BACKENDS)
def backend(request: Any) -> dict[str, str]:
    """The backend of a two-process test, as ``TransferConfig`` fields."""
    return {"backend": request.param, "device": "cpu" if request.param == "gloo" else "cuda"}


#: ``TransferConfig.pipeline``: every fault test runs with sequential rounds (1) and with
#: two rounds in flight (2).
PIPELINES = [1, 2]


@pytest.fixture(params=PIPELINES, ids=lambda p: f"pipeline{p}")
def pipeline(request: Any) -> dict[str, int]:
    """The rounds in flight of a test, as ``TransferConfig`` fields."""
    return {"pipeline": request.param}


def small(**kw: Any) -> TransferConfig:
    base: dict[str, Any] = dict(images=4, window=2, timeout_s=10.0)
    base.update(kw)
    base.setdefault("units", base["images"] * U)  # the sender holds every image
    in_flight = base["window"] * base.get("pipeline", 1)
    base.setdefault("slots", in_flight)  # a slot per image in flight
    if "receiver_units" not in kw:  # room for every image, the local one and what is in flight
        base["receiver_units"] = (base["images"] + 1 + in_flight) * U
    return TransferConfig(**base)


def pair(cfg: TransferConfig) -> tuple[Sender, Receiver]:
    s = Sender(cfg)
    s.prefill()
    return s, Receiver(cfg)


def move(s: Sender, r: Receiver, out: T.Outgoing, inc: Incoming) -> None:
    """The wire, in one process: the sender's bytes into the receiver's buffers."""
    if s.cfg.payload == "staged":
        data = [s.gather(out, s.staging[0])]
        bufs = r.buffers(inc, r.staging[0])
    else:
        data = s.regions(out)
        bufs = r.buffers(inc, None)
    assert [d.numel() for d in data] == [b.numel() for b in bufs]
    for d, b in zip(data, bufs, strict=True):
        b.copy_(d)
    r.land(inc, r.staging[0] if s.cfg.payload == "staged" else None)
    s.finish(out)


def restored(r: Receiver, h: int, slot: int) -> Any:
    assert r.coord.begin_restore(h, slot)
    assert r.run_batch() == 1
    return r.tensors.read_image(slot)


def terminal_leases(result: dict[str, Any]) -> tuple[int, int]:
    """(leases acquired, leases settled) from a sender's rows; fails on any reclaim."""
    ev = result["events"]
    assert not [e for e in ev if e[0] == "offload" and e[2] == "reclaim"], "a lease timed out"
    acquired = {tuple(e[3]) for e in ev if e[0] == "offload" and e[2] == "acquire"}
    settled = {tuple(e[3]) for e in ev if e[0] == "offload" and e[2] == "settle"}
    assert settled == acquired, f"leases not ended by settle: {acquired - settled}"
    return len(acquired), len(settled)


def no_leak(result: dict[str, Any], other: int = 0) -> None:
    """Every unit is free or held by a record (or by ``other`` tenant units): no reservation,
    suspended restore or lease pin left; SPEC C holds."""
    acc = result["accounting"]
    assert acc["transfers"] == 0 and acc["suspended"] == 0 and acc["offload_pins"] == 0, acc
    assert acc["other"] == other, acc
    assert acc["free"] + acc["records"] + acc["other"] == acc["num_units"], acc
    assert result["invariants"] == []
    assert result["has_offload_pins"] is False
    assert result["offload_pins_reclaimed"] == 0


# -- configuration and wire rows --------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"window": 3, "slots": 2},
        {"backend": "nccl"},  # nccl runs on cuda
        {"device": "cuda"},  # gloo runs on cpu
        {"backend": "mpi"},
        {"payload": "scatter"},
        {"fault": "explode"},
        {"fault_image": 4},
        {"images": 0},
        {"slice": (1, 2)},
        {"timeout_s": 0},
        {"timeout_s": True},
        {"verify": "maybe"},
        {"copy_engine": "cuda-graphs"},
        {"receiver_units": 0},
        {"fault": "sender_dies_mid_payload", "images": 3, "fault_image": 2},  # alone in its round
        {"fault": "sender_stalls_mid_payload", "window": 1, "slots": 1},
    ],
)
def test_config_refuses_bad_fields(kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        small(**kw)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"model": "no-such-model"}, "no-such-model"),
        ({"model": "Qwen"}, "matches 4"),  # ambiguous
        ({"model": "mamba2"}, "attention_layers"),  # no attention layer to page into
        ({"slice": (1, 2, 33)}, "divide=33"),
        ({"slice": (99, 2, 32)}, "99"),
        ({"timeout_s": float("inf")}, "inf"),
        ({"timeout_s": 1e30}, "1e+30"),
        ({"units": 4 * U - 1}, "units (11)"),
        ({"receiver_units": U}, "receiver_units (3)"),  # no room beside the local image
        ({"receiver_units": U - 1, "local_restore": False}, "receiver_units (2)"),
        ({"receiver_block_tokens": 7, "receiver_units": 2 * U}, "receiver_units (6)"),
    ],
)
def test_config_refuses_a_layout_or_pool_that_cannot_run(kw: dict[str, Any], named: str) -> None:
    """These used to be accepted and to fail later, in a child process, with an
    UnknownGeometryError, an OverflowError of the group's timedelta or a refused store."""
    with pytest.raises(InvalidArgumentError, match=re.escape(named)):
        small(**kw)


@pytest.mark.parametrize("bad", [0, 3, -1, True, 2.0, "2", None])
def test_config_refuses_a_bad_pipeline_naming_it(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"pipeline must be an int in \(1, 2\)"):
        TransferConfig(pipeline=bad)


def test_config_needs_a_slot_per_image_in_flight() -> None:
    """Two rounds in flight hold two rounds of destination slots (a slot has one restore,
    SPEC G4) and of staging buffers: ``window * pipeline <= slots``."""
    with pytest.raises(
        InvalidArgumentError, match=re.escape("x pipeline (2) must be <= slots (3)")
    ):
        small(window=2, pipeline=2, slots=3)
    cfg = small(window=2, pipeline=2)
    assert cfg.slots == 4 and TransferConfig().pipeline == 1
    assert T._config_from_json(T._config_json(cfg)) == cfg
    s = Sender(cfg)
    assert len(s.staging) == 4 and [s.buffer_base(k) for k in range(4)] == [0, 2, 0, 2]
    assert [Sender(small(window=2)).buffer_base(k) for k in range(3)] == [0, 0, 0]


def test_config_json_and_the_rank_cli_refuse_bad_input(tmp_path: Any) -> None:
    """``python -m pagedstate.impl.transfer``: a bad rank or config is a usage error (exit
    2, the value named), not a traceback or a rank that reports after it started."""
    import subprocess
    import sys

    assert T._config_from_json(T._config_json(small())) == small()
    for text, named in [
        ("nojson", "not JSON"),
        ("[1]", "JSON object"),
        ('{"bogus": 1}', "bogus"),
        ('{"images": 0}', "images"),
        ('{"slice": "abc"}', "slice"),
    ]:
        with pytest.raises(InvalidArgumentError, match=named):
            T._config_from_json(text)
    ok = tmp_path / "ok.json"
    ok.write_text(T._config_json(small()))
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "no-such-model"}')
    for argv, named in [
        (["--rank", "5", "--config", str(ok)], "invalid choice: 5"),
        (["--rank", "0", "--config", str(tmp_path / "missing.json")], "missing.json"),
        (["--rank", "0", "--config", str(bad)], "no-such-model"),
    ]:
        out = tmp_path / "out.json"
        cmd = [sys.executable, "-m", "pagedstate.impl.transfer", *argv]
        cmd += ["--init", (tmp_path / "rv").as_uri(), "--out", str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and named in p.stderr, (argv, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr and not out.exists()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--images", "0"], "images must be an int >= 1, got 0"),  # was: the default, silently
        (["--images", "-1"], "got -1"),
        (["--model", "no-such-model"], "no-such-model"),  # was: a traceback
        (["--timeout", "inf"], "inf"),  # was: every run failed in its child processes
        (["--window", "0"], "--window"),
        (["--payload", "foo"], "--payload"),
        (["--block-tokens", "0"], "--block-tokens"),
        (["--pipeline", "3"], "--pipeline"),
        (["--pipeline", "1,0"], "--pipeline"),
        (["--copy-engine", "cuda"], "--copy-engine"),
        (["--copy-engine", ","], "--copy-engine"),
    ],
)
def test_the_benchmark_cli_refuses_bad_input_before_any_run(
    argv: list[str], named: str, monkeypatch: Any, capsys: Any
) -> None:
    from pagedstate.models.bench import transfer as B

    def no_run(*a: Any, **k: Any) -> None:
        raise AssertionError("a run was spawned")

    monkeypatch.setattr(B, "spawn_transfer", no_run)
    try:
        rc = B.main(["--backend", "gloo", "--quick", *argv])
    except SystemExit as e:  # argparse's usage error
        rc = e.code
    assert rc == 2
    assert named in capsys.readouterr().err


def test_bench_rows_checks_every_configuration_before_the_first_run(monkeypatch: Any) -> None:
    from pagedstate.models.bench import transfer as B

    monkeypatch.setattr(B, "spawn_transfer", lambda *a, **k: pytest.fail("a run was spawned"))
    with pytest.raises(InvalidArgumentError, match="divide=33|block_tokens"):
        B.bench_rows(
            backend="gloo", model="Qwen3-Next", slice_=(1, 2, 32), block_tokens=[128, 0],
            payloads=["staged"], images=2, window=1, timeout_s=10.0,
        )  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="pipeline must be an int in"):
        B.bench_rows(
            backend="gloo", model="Qwen3-Next", slice_=(1, 2, 32), block_tokens=[128],
            payloads=["staged"], images=2, window=1, timeout_s=10.0, pipeline=[1, 3],
        )  # fmt: skip
    for bad in ([], ["index", "cuda"], "cuda"):
        with pytest.raises(InvalidArgumentError, match="copy_engine must name"):
            B.bench_rows(
                backend="gloo", model="Qwen3-Next", slice_=(1, 2, 32), block_tokens=[128],
                payloads=["staged"], images=2, window=1, timeout_s=10.0, copy_engine=bad,
            )  # fmt: skip


def test_bench_rows_runs_a_row_per_pipeline_with_a_slot_per_image_in_flight(
    monkeypatch: Any,
) -> None:
    from pagedstate.models.bench import transfer as B

    seen: list[Any] = []

    def fake(cfg: Any, **k: Any) -> list[dict[str, Any]]:
        seen.append(cfg)
        return [{"error": "not run"}, {"error": "not run"}]

    monkeypatch.setattr(B, "spawn_transfer", fake)
    rows = B.bench_rows(
        backend="gloo", model="Qwen3-Next", slice_=(1, 2, 32), block_tokens=[128],
        payloads=["staged"], images=4, window=[2], timeout_s=10.0, pipeline=[1, 2],
    )  # fmt: skip
    assert [(c.pipeline, c.slots, c.receiver_units) for c in seen] == [(1, 2, 7 * U),
                                                                       (2, 4, 9 * U)]  # fmt: skip
    assert [r["pipeline"] for r in rows] == [1, 2] and not any(r["ok"] for r in rows)


def test_the_data_deadline_is_half_the_group_timeout() -> None:
    """A round's payload has ``data_timeout_s`` (seconds from posting): below the groups'
    timeout, so the driver aborts the data group before NCCL's watchdog would act."""
    assert small(timeout_s=4.0).data_timeout_s == 2.0 == T.DATA_DEADLINE_FRACTION * 4.0
    assert 0 < T.DATA_DEADLINE_FRACTION < 1
    assert set(T.MID_PAYLOAD_FAULTS) <= set(T.FAULTS)


def test_header_rows_are_int64_and_round_trip() -> None:
    h = ImageHeader(3, (1 << 62) + 5, U, IMAGE, T.layout_digest("x"), 1)
    assert ImageHeader.from_row(h.row()) == h
    with pytest.raises(InvalidArgumentError, match="int64"):
        ImageHeader(0, 1 << 63, U, IMAGE, 0).row()
    with pytest.raises(T.WireError):
        ImageHeader.from_row([1, 2, 3])
    assert T.layout_digest("a") != T.layout_digest("b")
    assert 0 <= T.layout_digest("a") < 1 << 63
    keys = {T.image_key(7, i) for i in range(1000)}
    assert len(keys) == 1000 and all(0 <= k < 1 << 62 for k in keys)


def test_rounds_send_the_duplicate_alone_last() -> None:
    cfg = small(images=5, units=5 * U, window=2, fault="duplicate", fault_image=1)
    assert cfg.rounds() == [[(0, 0), (1, 0)], [(2, 0), (3, 0)], [(4, 0)], [(1, 1)]]


def test_sender_refuses_a_pool_too_small_for_its_images() -> None:
    with pytest.raises(InvalidArgumentError, match="hold all"):
        Sender(small(units=4 * U - 1))


# -- the protocol in one process ----------------------------------------------------------


@pytest.mark.parametrize("payload", ["staged", "regions"])
def test_one_image_end_to_end_is_bit_exact(payload: str) -> None:
    s, r = pair(small(payload=payload))
    h = s.keys[1]
    out = s.lease(1)
    assert out.units and s.coord.has_offload_pins()
    assert r.queue_local(0)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming) and inc.suspended is not None
    assert r.coord.snapshot().transfers == {inc.owner: inc.units}
    move(s, r, out, inc)
    assert out.state == "settled" and not s.coord.has_offload_pins()
    assert r.adopt(inc) is True and inc.state == "adopted"
    snap = r.coord.snapshot()
    assert snap.transfers == {} and snap.suspended == () and snap.queued_restores == ()
    assert r.coord.contains(h)
    assert torch.equal(restored(r, h, 0), s.image(h))
    assert r.check_slot(0, h).item() == 0
    assert check_invariants(r.coord.snapshot()) == [] and check_invariants(s.coord.snapshot()) == []


def test_a_lost_scatter_is_caught_by_the_check() -> None:
    """The check can fail: a receiver that never lands the staged bytes restores garbage."""
    s, r = pair(small())
    out = s.lease(0)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming)
    s.gather(out, s.staging[0])
    s.finish(out)
    for u in inc.units:
        r.tensors.fill_unit(u, torch.zeros(r.layout.page_unit_bytes, dtype=torch.uint8))
    r.land(inc, None)  # the bytes are claimed to be in place: they are not
    assert r.adopt(inc)
    restored(r, s.keys[0], 0)
    assert r.check_slot(0, s.keys[0]).item() > IMAGE // 2


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [("digest", 12345, "layout"), ("image_bytes", IMAGE + 1, "bytes"), ("units", U + 1, "units")],
)
def test_a_header_of_another_layout_is_refused_with_nothing_changed(
    field: str, value: int, reason: str
) -> None:
    s, r = pair(small())
    out = s.lease(0)
    fields = {
        "index": 0,
        "prefix_hash": out.header.prefix_hash,
        "units": U,
        "image_bytes": IMAGE,
        "digest": r.digest,
    }
    fields[field] = value
    bad = ImageHeader(**fields)
    assert r.queue_local(0)
    before = r.coord.snapshot()
    got = r.accept(bad, 0)
    assert got == Refusal(0, reason)
    assert r.coord.snapshot() == before  # the local restore is still queued, not suspended
    s.finish(out)
    assert not s.coord.has_offload_pins() and s.coord.contains(out.header.prefix_hash)


def test_a_header_out_of_the_run_is_refused() -> None:
    s, r = pair(small())
    out = s.lease(0)
    for bad in (ImageHeader(4, 1, U, IMAGE, r.digest), ImageHeader(0, 1, U, IMAGE, r.digest, 2)):
        before = r.coord.snapshot()
        assert r.accept(bad, 0) == Refusal(bad.index, "bad_header")
        assert r.coord.snapshot() == before
    s.finish(out)


def test_a_bad_slot_raises_before_anything_changes() -> None:
    s, r = pair(small())
    out = s.lease(0)
    before = r.coord.snapshot()
    for slot in (-1, 2, "0", None):
        with pytest.raises(InvalidArgumentError):
            r.accept(out.header, slot)  # type: ignore[arg-type]
    assert r.coord.snapshot() == before
    s.finish(out)


def test_bad_arguments_to_the_steps_raise_before_anything_changes() -> None:
    """Each used to fail late: a bool or float variant was leased (and its header failed later), a
    bad slot in ``queue_local`` queued a restore into a slot that does not exist (the next
    batch then failed), and wrong buffers or objects failed deep in torch (a RuntimeError or
    AttributeError). Each now raises InvalidArgumentError with both stores unchanged."""
    s, r = pair(small())
    out = s.lease(0)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming)
    bad_bufs = [
        None,
        torch.zeros(10, dtype=torch.uint8),
        torch.zeros(IMAGE, dtype=torch.uint8),  # the wire part, not the staging buffer
        torch.zeros(s.staging[0].numel(), dtype=torch.int64),
        torch.zeros((2, s.staging[0].numel() // 2), dtype=torch.uint8),
    ]
    calls: list[Any] = [
        lambda: s.lease(1, True),
        lambda: s.lease(1, 1.0),
        lambda: s.regions("out"),
        lambda: s.finish("out"),
        lambda: s.gather("out", s.staging[0]),
        *[lambda b=b: s.gather(out, b) for b in bad_bufs],
        lambda: r.accept("header", 1),
        lambda: r.queue_local(2),
        lambda: r.queue_local(-1),
        lambda: r.queue_local(True),
        *[lambda b=b: r.buffers(inc, b) for b in bad_bufs[1:]],
        *[lambda b=b: r.land(inc, b) for b in bad_bufs[1:]],
        lambda: r.adopt("inc"),
        lambda: r.abort("inc"),
        lambda: r.image("key"),
        lambda: Sender(small(), "meta"),
        lambda: Sender("cfg"),  # type: ignore[arg-type]
        lambda: Receiver(None),  # type: ignore[arg-type]
        lambda: T.run_rank(True, 2, small(), "file:///nowhere"),  # type: ignore[arg-type]
    ]
    before = (s.coord.snapshot(), r.coord.snapshot())
    for call in calls:
        with pytest.raises(InvalidArgumentError):
            call()
        assert (s.coord.snapshot(), r.coord.snapshot()) == before
    assert out.state == "leased" and inc.state == "reserved"
    assert r.run_batch() == 0  # nothing was queued behind our back
    move(s, r, out, inc)  # and the transfer still goes through
    assert r.adopt(inc)
    assert torch.equal(restored(r, s.keys[0], 0), s.image(s.keys[0]))


def test_an_accept_that_raises_changes_nothing(monkeypatch: Any) -> None:
    """G8 for the driver: if suspending the local restore raises, the reservation just made
    is released before the error propagates."""
    s, r = pair(small())
    out = s.lease(0)
    assert r.queue_local(0)
    before = r.coord.snapshot()

    def boom(slot: int) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(r.coord, "suspend_queued_restore", boom)
    with pytest.raises(RuntimeError, match="planted"):
        r.accept(out.header, 0)
    after = r.coord.snapshot()
    assert after.transfers == {} and after.free == before.free
    assert after.queued_restores == before.queued_restores
    s.finish(out)


def test_a_full_receiver_refuses_before_anything_is_received() -> None:
    """(d) No room: ``reserve_transfer_units`` says None, the receiver refuses with nothing
    changed (its queued local restore is not suspended), and the sender ends its lease."""
    s, r = pair(small(receiver_units=3 * U))
    assert r.queue_local(0)  # the local image is pinned by its queued restore
    taken = r.fill_with_tenant(1)
    assert taken == r.pool.num_units - U and r.pool.num_free == 0
    out = s.lease(0)
    before = r.coord.snapshot()
    assert r.accept(out.header, 0) == Refusal(0, "no_room")
    assert r.coord.snapshot() == before
    assert r.coord.restore_queued_for(0)
    s.finish(out)  # the sender's terminal path for a refused image: the one-phase cancel
    assert out.state == "settled" and not s.coord.has_offload_pins()
    assert s.coord.contains(out.header.prefix_hash)
    r.release_tenant()
    inc = r.accept(out.header, 1)  # room again: a later attempt succeeds
    assert isinstance(inc, Incoming)


def test_the_same_image_twice_releases_the_second_and_keeps_the_canonical() -> None:
    """(b) The second adoption of a hash returns False and frees its units; the canonical
    record, its units and bytes are unchanged (the second copy's bytes differ: variant 1
    inverts them, so a wrongful adoption or overwrite would show)."""
    s, r = pair(small())
    h = s.keys[2]
    first = s.lease(2)
    inc1 = r.accept(first.header, 0)
    assert isinstance(inc1, Incoming)
    move(s, r, first, inc1)
    assert r.adopt(inc1)
    canon = r.coord.snapshot()
    cid = canon.index[h]
    canon_bytes = r.tensors.read_units(inc1.units).clone()
    free_before = r.pool.num_free

    second = s.lease(2, variant=1)
    inc2 = r.accept(second.header, 1)
    assert isinstance(inc2, Incoming)
    assert set(inc2.units).isdisjoint(inc1.units)
    move(s, r, second, inc2)
    assert not torch.equal(r.tensors.read_units(inc2.units)[:IMAGE], canon_bytes[:IMAGE])
    assert r.adopt(inc2) is False and inc2.state == "duplicate"
    after = r.coord.snapshot()
    assert after.index[h] == cid and after.records[cid] == canon.records[cid]
    assert after.transfers == {}
    assert all(r.pool.owner_of(u) is None for u in inc2.units)
    assert r.pool.num_free == free_before
    assert torch.equal(r.tensors.read_units(inc1.units), canon_bytes)
    assert torch.equal(restored(r, h, 0), s.image(h))
    rows = [e for e in r.events if e[0] == "transfer" and e[2] == "adopt"]
    assert len(rows) == 2
    assert check_invariants(after) == []


def test_a_late_release_of_an_earlier_reservation_changes_nothing() -> None:
    """(c) Receiver side: attempt 1 of a hash is given up, attempt 2 is reserved; releasing
    attempt 1 again (a late report) or aborting it again changes nothing, and attempt 2
    still adopts (SPEC A.3: owners carry a generation)."""
    s, r = pair(small())
    out = s.lease(0)
    inc1 = r.accept(out.header, 0)
    assert isinstance(inc1, Incoming)
    r.abort(inc1)
    inc2 = r.accept(out.header, 0)
    assert isinstance(inc2, Incoming)
    assert inc2.owner != inc1.owner and inc2.owner.prefix_hash == inc1.owner.prefix_hash
    before = r.coord.snapshot()
    r.coord.release_transfer_units(inc1.owner)
    r.abort(inc1)
    assert r.coord.adopt_transfer_units(inc1.owner, out.header.prefix_hash) is False
    assert r.coord.snapshot() == before
    move(s, r, out, inc2)
    assert r.adopt(inc2)
    assert torch.equal(restored(r, out.header.prefix_hash, 0), s.image(out.header.prefix_hash))


def test_a_late_release_and_settle_of_an_earlier_lease_changes_nothing() -> None:
    """(c) Sender side: lease 1 of an image was settled, lease 2 of the same image is live;
    a late release and settle of lease 1 leave lease 2's pin and the whole store as they
    were."""
    s, _ = pair(small())
    first = s.lease(0)
    s.finish(first)
    second = s.lease(0)
    assert second.op != first.op and second.op.prefix_hash == first.op.prefix_hash
    assert second.op.generation > first.op.generation
    before = s.coord.snapshot()
    s.coord.release_offload_store_source(first.op)
    s.coord.settle_offload_store(first.op)
    s.finish(first)
    assert s.coord.snapshot() == before
    assert before.offload_pins[second.op].source_released is False
    s.finish(second)
    assert not s.coord.has_offload_pins()


def test_a_stale_suspended_restore_lease_is_refused_with_nothing_changed() -> None:
    """(c) The suspended restore of an adopted image was released; resuming or releasing it
    again (a late report from that attempt) raises LeaseReusedError and changes nothing."""
    s, r = pair(small())
    out = s.lease(0)
    assert r.queue_local(0)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming) and inc.suspended is not None
    move(s, r, out, inc)
    assert r.adopt(inc)
    before = r.coord.snapshot()
    for call in (r.coord.resume_suspended_restore, r.coord.release_suspended_restore):
        with pytest.raises(LeaseReusedError):
            call(inc.suspended)
    assert r.coord.snapshot() == before


def test_abort_releases_the_reservation_and_resumes_the_local_restore() -> None:
    """(a) in one process: bytes half arrived, then the sender is gone. The reservation is
    released, the suspended local restore runs, and the slot holds the local image."""
    s, r = pair(small())
    free0 = r.pool.num_free
    out = s.lease(0)
    assert r.queue_local(1)
    inc = r.accept(out.header, 1)
    assert isinstance(inc, Incoming) and r.pool.num_free == free0 - U
    r.tensors.fill_unit(inc.units[0], torch.full((r.layout.page_unit_bytes,), 7, dtype=torch.uint8))
    r.abort(inc)
    assert inc.state == "aborted" and r.pool.num_free == free0
    assert r.coord.snapshot().transfers == {}
    assert r.coord.restore_queued_for(1)
    assert r.run_batch() == 1
    assert r.check_slot(1, r.local_key).item() == 0
    with pytest.raises(T.TransferError):
        r.adopt(inc)
    s.finish(out)
    assert not s.coord.has_offload_pins()


def test_an_adoption_that_raises_releases_the_units_and_resumes(monkeypatch: Any) -> None:
    """SPEC F53 through the driver: the error propagates, nothing is left reserved."""
    s, r = pair(small())
    out = s.lease(0)
    assert r.queue_local(0)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming)
    move(s, r, out, inc)
    free = r.pool.num_free

    def boom(*a: Any) -> bool:
        raise RuntimeError("planted")

    monkeypatch.setattr(r.coord.store, "adopt_units", boom)
    with pytest.raises(RuntimeError, match="planted"):
        r.adopt(inc)
    assert inc.state == "aborted" and r.pool.num_free == free + U
    assert r.coord.snapshot().transfers == {} and r.coord.restore_queued_for(0)


def test_the_store_does_not_adopt_a_coordinator_reservation_behind_its_back() -> None:
    """Only the coordinator's adopt_transfer_units may adopt its reservation: the store's
    adopt_units, called directly with the transfer tag, refuses and changes nothing (else a
    checkpoint would own units the coordinator still names). The transfer then completes."""
    s, r = pair(small())
    out = s.lease(0)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming)
    s.finish(out)
    before = r.coord.snapshot()
    with pytest.raises(StoreOwnedUnitsError, match="adopt_transfer_units"):
        r.coord.store.adopt_units(inc.units, (TRANSFER_OWNER, inc.owner), out.header.prefix_hash)
    assert r.coord.snapshot() == before
    assert r.coord.adopt_transfer_units(inc.owner, out.header.prefix_hash) is True
    assert check_invariants(r.coord.snapshot()) == []


@pytest.mark.parametrize("payload", ["staged", "regions"])
@pytest.mark.parametrize(
    ("s_uniform", "r_uniform"), [(True, True), (False, False), (True, False), (False, True)]
)
def test_the_wire_is_the_image_in_stream_order_on_every_path(
    payload: str, s_uniform: bool, r_uniform: bool
) -> None:
    """SPEC E.3: byte k of the wire is byte k of the image, whichever path gathered it, so a
    fast-path sender and a piece-path receiver (or the reverse) agree. A piece path that puts
    its pieces in region-major order lands its own bytes back in place (the sender and the
    receiver agree on the wrong order) but sends another stream: only this check sees it."""
    s, r = pair(small(images=2, payload=payload))
    s.uniform, r.uniform = s_uniform, r_uniform
    out = s.lease(1)
    want = s.image(s.keys[1])
    if payload == "staged":
        wire = s.gather(out, s.staging[0])
    else:
        wire = torch.cat(s.regions(out))
    assert wire.numel() == IMAGE and torch.equal(wire, want)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming)
    move_back = r.buffers(inc, r.staging[0] if payload == "staged" else None)
    for b, part in zip(move_back, wire.split([b.numel() for b in move_back]), strict=True):
        b.copy_(part)
    r.land(inc, r.staging[0] if payload == "staged" else None)
    s.finish(out)
    assert r.adopt(inc)
    assert torch.equal(restored(r, s.keys[1], 0), want)


class _FakeLink:
    """The wire of the two loops run as threads of one process (queues, not
    ``torch.distributed``): each message is handed over as a copy, and the receiver's
    control and payload steps are logged in order."""

    def __init__(self, rank: int, inbox: Any, outbox: Any, barrier: Any, log: list[Any]):
        self.rank, self.inbox, self.outbox, self.bar, self.log = rank, inbox, outbox, barrier, log
        self.messages = {"sent": 0, "received": 0}
        self.on_event: Any = None  # the side's rows, as Link.on_event

    #: Seconds a receive waits before it fails as a lost peer would.
    timeout = 20.0

    def _get(self, kind: str) -> Any:
        import queue

        try:
            got_kind, value = self.inbox.get(timeout=self.timeout)
        except queue.Empty:
            raise T.WireError("fake link: nothing arrived") from None
        if got_kind != kind:
            raise T.WireError(f"fake link: expected {kind}, got {got_kind}")
        return value

    def send_ints(self, values: Any) -> None:
        self.outbox.put(("ints", [int(v) for v in values]))
        self.messages["sent"] += 1
        self.log.append(("send", len(values)))

    def recv_ints(self, n: int) -> list[int]:
        v = self._get("ints")
        if len(v) != n:
            raise T.WireError(f"fake link: {n} ints expected, got {len(v)}")
        self.log.append(("ints", v[1] if len(v) > 1 else None))
        self.messages["received"] += 1
        return list(v)

    def send_bytes(self, t: Any) -> None:
        self.outbox.put(("bytes", t.clone()))

    def recv_bytes(self, t: Any) -> None:
        t.copy_(self._get("bytes"))

    def post(self, tensors: Any, sending: bool) -> T.Posted:
        """A send hands a copy over at once (the bytes as gathered when posted); a receive
        is logged here and filled at its :meth:`wait`."""
        posted = T.Posted(list(tensors), sending, [], [], float("inf"))
        if not tensors:
            posted.state = "done"
        elif sending:
            self.outbox.put(("data", [t.clone() for t in tensors]))
            posted.state = "done"
        else:
            self.log.append(("post", len(tensors)))
        return posted

    def wait(self, posted: T.Posted) -> None:
        if posted.state == "done":
            return
        data = self._get("data")
        tensors = posted.tensors
        assert [d.numel() for d in data] == [t.numel() for t in tensors]
        for t, d in zip(tensors, data, strict=True):
            t.copy_(d)
        posted.state = "done"
        self.log.append(("exchange", len(tensors)))

    def exchange(self, tensors: Any, sending: bool) -> None:
        self.wait(self.post(tensors, sending))

    def cancel(self, posted: T.Posted, cause: str) -> T.PayloadLost | None:
        if posted.state == "done":
            return None
        posted.state = "lost"
        self.log.append(("cancel", cause))
        if self.on_event is not None:
            self.on_event(["data", "payload", "abort", "fake abort"])
        return T.PayloadLost(f"fake: cancelled ({cause})", aborted=True, how="fake abort")

    def barrier(self) -> None:
        self.bar.wait(timeout=20)


def _run_loops(s: Sender, r: Receiver, timeout: float = 20.0) -> tuple[dict[str, Any], list[Any]]:
    """The sender's and the receiver's loops as two threads over a :class:`_FakeLink`:
    ``({"s": result or exception, "r": ...}, the receiver's log)``."""
    import queue
    import threading

    a, b = queue.Queue(), queue.Queue()  # type: ignore[var-annotated]
    bar = threading.Barrier(2)
    rlog: list[Any] = []
    results: dict[str, Any] = {}

    def side(name: str, fn: Any, obj: Any, link: Any) -> None:
        try:
            results[name] = fn(obj, link)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            results[name] = e
            bar.abort()

    links = [_FakeLink(0, b, a, bar, []), _FakeLink(1, a, b, bar, rlog)]
    for link, obj in zip(links, (s, r), strict=True):
        link.timeout = timeout
        link.on_event = obj.events.append
    threads = [
        threading.Thread(target=side, args=("s", T._sender_loop, s, links[0])),
        threading.Thread(target=side, args=("r", T._receiver_loop, r, links[1])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * timeout + 30)
    assert not any(t.is_alive() for t in threads)
    return results, rlog


def test_a_payload_that_cannot_be_aborted_keeps_its_reservations(
    monkeypatch: Any, pipeline: dict[str, int]
) -> None:
    """The rule for a backend whose data group cannot be aborted: the round's receives may
    still land, so its reservations are NOT released (quarantined, held to the end of the
    run) and its staging tensors never used again (replaced); the suspended local restores
    are resumed, run and checked all the same (they write the slots, which no receive
    targets). The receiver's ABANDON then stops the sender. With ``pipeline=2`` round 2 is
    already accepted when round 1's payload is lost: its reservations are kept too (one
    rule for every round in flight), its local restores resumed."""
    cfg = small(**pipeline, images=6, window=2)
    s, r = Sender(cfg), Receiver(cfg)
    old_staging = list(r.staging)
    wait = _FakeLink.wait
    calls = {"n": 0}

    def lost_once(self: _FakeLink, posted: T.Posted) -> None:
        if self.rank == 1 and posted.state == "posted":
            calls["n"] += 1
            if calls["n"] == 3:  # the warm-up, round 0, then round 1's payload
                self._get("data")  # the sender's bytes: in flight, not received
                posted.state = "lost"
                raise T.PayloadLost(
                    "fake: lost", works=len(posted.tensors), aborted=False,
                    how="could NOT be aborted",
                )  # fmt: skip
        wait(self, posted)

    monkeypatch.setattr(_FakeLink, "wait", lost_once)
    results, _ = _run_loops(s, r, timeout=2.0)
    res = results["r"]
    assert isinstance(res, dict), res
    lost = [2, 3] if cfg.pipeline == 1 else [2, 3, 4, 5]
    assert res["outcome"] == {"0": ["adopted"], "1": ["adopted"],
                              **{str(i): ["quarantined"] for i in lost}}  # fmt: skip
    assert res["given_up_rounds"] == ([1] if cfg.pipeline == 1 else [1, 2])
    assert res["quarantined"] == lost and res["local"]["resumed"] == len(lost)
    assert all([i, "local"] in res["checked"] for i in lost)
    assert res["mismatches"] == []
    acc = r.accounting()
    assert acc["transfers"] == len(lost) * U and acc["suspended"] == 0, acc  # kept
    assert not [e for e in r.events if e[0] == "transfer" and e[2] == "release"]
    # the staging buffers of every round given up are replaced (round 1's, and round 2's)
    given_up = [r.buffer_base(1), r.buffer_base(1) + 1]
    if cfg.pipeline == 2:
        given_up += [r.buffer_base(2), r.buffer_base(2) + 1]
    assert all(r.staging[i] is not old_staging[i] for i in given_up)
    assert r.invariants() == []
    assert isinstance(results["s"], T.WireError) and "abandoned round 1" in str(results["s"])
    assert not s.coord.has_offload_pins()  # the sender's finally ended every lease


@pytest.mark.parametrize(
    ("theirs", "mine", "reason"),
    [({"pipeline": 2}, {"pipeline": 1, "slots": 4}, "pipeline"),
     ({"window": 1, "slots": 2}, {"window": 2}, "window")],
)  # fmt: skip
def test_peers_of_another_pipeline_or_window_refuse_the_hello(
    theirs: dict[str, Any], mine: dict[str, Any], reason: str
) -> None:
    """Both ranks must agree on the rounds in flight and the window (the merged GO + ROUND
    message has a length fixed by both): the HELLO's tail carries them, and a difference is
    refused as a layout is, with its reason, before any lease or reservation."""
    s, r = Sender(small(**theirs)), Receiver(small(**mine))
    results, _ = _run_loops(s, r, timeout=5.0)
    assert isinstance(results["r"], T.LayoutMismatchError), results
    assert f"({reason})" in str(results["r"]), results["r"]
    assert isinstance(results["s"], T.LayoutMismatchError) and reason in str(results["s"])
    assert not r.coord.snapshot().transfers and not s.coord.has_offload_pins()


def test_a_hello_of_another_version_is_refused_before_the_rest_is_read() -> None:
    import queue

    from pagedstate.impl.transfer.receiver import _check_hello

    r = Receiver(small())
    inbox, outbox = queue.Queue(), queue.Queue()  # type: ignore[var-annotated]
    hello = T.wire._hello(r)
    inbox.put(("ints", [hello[0], 1, *hello[2:]]))  # VERSION 1: no tail follows
    link = _FakeLink(1, inbox, outbox, None, [])
    with pytest.raises(T.LayoutMismatchError, match="version 2"):
        _check_hello(r, link)  # type: ignore[arg-type]
    assert outbox.get_nowait() == ("ints", [T.MAGIC, T.REFUSE, 6, 0])  # bad_header
    assert T.REASONS[6] == "bad_header" and T.VERSION == 2 and inbox.empty()


def test_a_control_failure_with_a_payload_in_flight_aborts_it_before_any_release(
    monkeypatch: Any,
) -> None:
    """``pipeline=2``: the receiver's REPLIES of round 2 cannot be sent while round 1's
    receives are posted (the sender is gone). Nothing is waited any more: round 1's payload
    is cancelled (the data group aborted) before any reservation of round 1 or round 2 is
    released; both rounds are given up, their local restores resumed and checked; round 0
    stays adopted."""
    cfg = small(pipeline=2, images=6)
    s, r = Sender(cfg), Receiver(cfg)
    send = _FakeLink.send_ints
    sends = {"n": 0}

    def failing(self: _FakeLink, values: Any) -> None:
        if self.rank == 1:
            sends["n"] += 1
            if sends["n"] == 4:  # WELCOME, REPLIES of rounds 0 and 1, then of round 2
                raise T.WireError("planted: control send failed")
        send(self, values)

    monkeypatch.setattr(_FakeLink, "send_ints", failing)
    results, rlog = _run_loops(s, r, timeout=2.0)
    res = results["r"]
    assert isinstance(res, dict), res
    assert res["outcome"] == {"0": ["adopted"], "1": ["adopted"],
                              **{str(i): ["aborted"] for i in range(2, 6)}}  # fmt: skip
    assert res["given_up_rounds"] == [1, 2] and res["lost_payload"]["round"] == 1
    assert "planted" in res["peer_lost"] and ("cancel", "planted: control send failed") in rlog
    ev = r.events
    abort = next(k for k, e in enumerate(ev) if e[0] == "data")
    releases = [k for k, e in enumerate(ev) if e[0] == "transfer" and e[2] == "release"]
    assert len(releases) == 4 and abort < releases[0], (abort, releases)
    assert res["local"]["resumed"] == 4 and res["mismatches"] == []
    acc = r.accounting()
    assert acc["transfers"] == 0 and acc["suspended"] == 0 and r.invariants() == []
    assert isinstance(results["s"], T.WireError) and not s.coord.has_offload_pins()


def test_a_quarantined_image_is_never_released_landed_or_adopted() -> None:
    s, r = pair(small())
    out = s.lease(0)
    assert r.queue_local(0)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming)
    r.quarantine(inc)
    r.quarantine(inc)  # idempotent
    assert inc.state == "quarantined" and r.coord.snapshot().transfers == {inc.owner: inc.units}
    assert r.coord.restore_queued_for(0)  # the local restore is resumed
    for call in (lambda: r.abort(inc), lambda: r.adopt(inc), lambda: r.land(inc, None)):
        with pytest.raises(T.TransferError):
            call()
    assert r.coord.snapshot().transfers == {inc.owner: inc.units}
    assert r.run_batch() == 1 and r.check_slot(0, r.local_key).item() == 0
    s.finish(out)


class _Work:
    """A fake p2p work: ``done_after`` polls it reports completed (None: never), ``fail``
    raised by ``wait``; ``timeout_fails``: a ``wait`` with a timeout raises (gloo's timed-out
    wait) unless done. Logs its calls into ``log``."""

    def __init__(self, log: list[Any], name: str, done_after: int | None = None,
                 fail: str | None = None, timeout_fails: bool = True) -> None:  # fmt: skip
        self.log, self.name, self.done_after, self.fail = log, name, done_after, fail
        self.timeout_fails = timeout_fails
        self.polls = 0

    def is_completed(self) -> bool:
        self.polls += 1
        return self.fail is not None or (
            self.done_after is not None and self.polls > self.done_after
        )

    def wait(self, timeout: Any = None) -> bool:
        self.log.append(("wait", self.name, timeout))
        if self.fail is not None:
            raise RuntimeError(self.fail)
        if self.done_after is None and timeout is not None and self.timeout_fails:
            raise RuntimeError(f"Timed out waiting {timeout} for recv operation to complete")
        return self.done_after is not None or not self.timeout_fails


class _Dist:
    """A fake ``torch.distributed`` for :class:`Link`'s data path: ``works`` are handed out in
    order, by ``batch_isend_irecv`` (one grouped work, as nccl's) or one per ``irecv``."""

    def __init__(self, works: list[_Work]) -> None:
        self.works = list(works)
        self.posted: list[Any] = []

    def P2POp(self, fn: Any, t: Any, peer: int, group: Any) -> tuple[Any, ...]:  # noqa: N802
        return (fn, t, peer, group)

    def batch_isend_irecv(self, ops: list[Any]) -> list[_Work]:
        self.posted.append(("batch", len(ops), ops[0][3]))
        return [self.works.pop(0)]

    def irecv(self, t: Any, peer: int, group: Any = None) -> _Work:
        self.posted.append(("irecv", group))
        return self.works.pop(0)

    isend = irecv


def _data_link(dist: _Dist, backend: str, log: list[Any], deadline_s: float = 0.3) -> T.Link:
    link = T.Link(dist, 1, "ctrl", "data", torch.device("cpu"), data_backend=backend,
                  data_timeout_s=deadline_s)  # fmt: skip
    link.on_event = lambda row: log.append(("event", row[2]))
    return link


def _recording_abort(monkeypatch: Any, log: list[Any], fail: bool = False) -> None:
    import torch.distributed.distributed_c10d as c10d

    def abort(group: Any) -> None:
        log.append(("abort", group))
        if fail:
            raise RuntimeError("planted: the abort fails")

    monkeypatch.setattr(c10d, "_abort_process_group", abort)


def test_the_nccl_payload_is_polled_and_aborted_at_the_deadline(monkeypatch: Any) -> None:
    """The nccl branch (two GPUs to run for real; here over a fake ``torch.distributed``):
    the payload's grouped work is polled, never waited on blocking, and when the data
    deadline passes the data group is aborted (``_abort_process_group``) before PayloadLost
    is raised; the group is not used again."""
    import time

    log: list[Any] = []
    _recording_abort(monkeypatch, log)
    work = _Work(log, "batch")
    dist = _Dist([work])
    link = _data_link(dist, "nccl", log)
    bufs = [torch.zeros(8, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8)]
    t0 = time.monotonic()
    with pytest.raises(T.PayloadLost) as e:
        link.exchange(bufs, sending=False)
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 2.0, elapsed
    assert dist.posted == [("batch", 2, "data")] and work.polls > 10
    assert not [x for x in log if x[0] == "wait"], log  # no blocking wait on the payload
    assert log == [("abort", "data"), ("event", "abort")], log
    err = e.value
    assert (err.done, err.works, err.aborted) == (0, 1, True)
    assert "data deadline (0.3 s)" in str(err) and "the data group was aborted" in str(err)
    assert link.data_aborted and link.held == []
    with pytest.raises(T.WireError, match="aborted by an earlier payload"):
        link.exchange(bufs, sending=False)
    assert len(dist.posted) == 1  # nothing posted on an aborted group


def test_an_nccl_payload_that_fails_is_aborted_at_once(monkeypatch: Any) -> None:
    log: list[Any] = []
    _recording_abort(monkeypatch, log)
    link = _data_link(_Dist([_Work(log, "batch", fail="NCCL error: remote process exited")]),
                      "nccl", log, deadline_s=30.0)  # fmt: skip
    with pytest.raises(T.PayloadLost, match="remote process exited") as e:
        link.exchange([torch.zeros(8, dtype=torch.uint8)], sending=True)
    assert e.value.aborted and "image send" in str(e.value)
    assert [x[0] for x in log] == ["wait", "abort", "event"], log


def test_an_nccl_abort_that_fails_keeps_the_buffers(monkeypatch: Any) -> None:
    """If the data group cannot be aborted, PayloadLost says so (``aborted`` False) and the
    link keeps the works and their buffers alive (a receive may still write them)."""
    log: list[Any] = []
    _recording_abort(monkeypatch, log, fail=True)
    work = _Work(log, "batch")
    link = _data_link(_Dist([work]), "nccl", log, deadline_s=0.05)
    buf = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(T.PayloadLost, match="could NOT be aborted") as e:
        link.exchange([buf], sending=False)
    assert e.value.aborted is False and ("event", "not aborted") in log
    assert link.held == [([work], [buf])]
    assert not T.Link(_Dist([]), 1, "c", None, torch.device("cpu"),
                      data_backend="nccl").abort_data()[0]  # never the default group  # fmt: skip


def test_the_gloo_payload_waits_each_transfer_with_the_time_left(monkeypatch: Any) -> None:
    """gloo: one work per tensor (a gloo p2p work completes only inside ``wait``), each
    waited with the time left as its timeout; a failed one makes every unfinished work be
    waited 1 ms (a timed-out gloo wait closes the group's connections); never
    ``_abort_process_group``, which does nothing to a gloo group."""
    import datetime

    log: list[Any] = []
    _recording_abort(monkeypatch, log)
    works = [_Work(log, "a", done_after=0), _Work(log, "b", fail="Connection closed by peer")]
    link = _data_link(_Dist(works), "gloo", log, deadline_s=5.0)
    with pytest.raises(T.PayloadLost, match="failed after 1 of 2 transfers") as e:
        link.exchange([torch.zeros(8, dtype=torch.uint8)] * 2, sending=False)
    assert e.value.aborted and "connections of its context are closed" in str(e.value)
    waits = [x for x in log if x[0] == "wait"]
    assert [w[1] for w in waits] == ["a", "b", "b"]
    assert all(datetime.timedelta(0) < w[2] <= datetime.timedelta(seconds=5) for w in waits)
    assert waits[-1][2] == datetime.timedelta(milliseconds=1)
    assert ("abort", "data") not in log and log[-1] == ("event", "abort")
    # a gloo transfer that neither completes nor fails: not aborted, its buffers kept
    log.clear()
    stuck = _Work(log, "c", timeout_fails=False)
    stuck.wait = lambda timeout=None: False  # type: ignore[method-assign]
    link = _data_link(_Dist([stuck]), "gloo", log)
    with pytest.raises(T.PayloadLost, match="could NOT be aborted") as e:
        link.exchange([torch.zeros(8, dtype=torch.uint8)], sending=False)
    assert e.value.aborted is False and len(link.held) == 1


def test_a_posted_payload_keeps_the_deadline_of_its_post(monkeypatch: Any) -> None:
    """``pipeline=2`` waits a payload later than it posts it: the deadline still counts from
    the post (nccl: the poll gives up 0.3 s after the post, not after the wait began; gloo:
    each wait gets the time left from the post), and the abort comes before PayloadLost."""
    import datetime
    import time

    log: list[Any] = []
    _recording_abort(monkeypatch, log)
    link = _data_link(_Dist([_Work(log, "batch")]), "nccl", log)
    t0 = time.monotonic()
    posted = link.post([torch.zeros(8, dtype=torch.uint8)], sending=False)
    assert posted.state == "posted" and not [x for x in log if x[0] == "wait"]
    time.sleep(0.2)  # the control exchange and gather of the next round
    t1 = time.monotonic()
    with pytest.raises(T.PayloadLost, match=r"data deadline \(0.3 s\)"):
        link.wait(posted)
    assert 0.3 <= time.monotonic() - t0 < 1.5 and time.monotonic() - t1 < 0.25
    assert log == [("abort", "data"), ("event", "abort")] and posted.state == "lost"
    log.clear()
    works = [_Work(log, "a", done_after=0), _Work(log, "b", done_after=0)]
    link = _data_link(_Dist(works), "gloo", log, deadline_s=5.0)
    posted = link.post([torch.zeros(8, dtype=torch.uint8)] * 2, sending=True)
    time.sleep(0.2)
    link.wait(posted)
    link.wait(posted)  # a payload already waited returns at once
    waits = [x[2] for x in log if x[0] == "wait"]
    assert len(waits) == 2 and all(w <= datetime.timedelta(seconds=4.85) for w in waits), waits
    assert posted.state == "done" and link.cancel(posted, "late") is None


def test_a_payload_given_up_before_its_wait_is_aborted_first(monkeypatch: Any) -> None:
    """``Link.cancel``: a payload in flight when the run fails elsewhere (a control message
    of the next round, a step that raised) is aborted before the caller releases anything;
    the PayloadLost it returns says whether the abort held. The group is not used again."""
    log: list[Any] = []
    _recording_abort(monkeypatch, log)
    link = _data_link(_Dist([_Work(log, "batch")]), "nccl", log)
    posted = link.post([torch.zeros(8, dtype=torch.uint8)], sending=False)
    lost = link.cancel(posted, "control receive failed")
    assert (
        isinstance(lost, T.PayloadLost) and lost.aborted and "given up before its wait" in str(lost)
    )
    assert log == [("abort", "data"), ("event", "abort")] and posted.state == "lost"
    with pytest.raises(T.WireError, match="already lost"):
        link.wait(posted)
    with pytest.raises(T.WireError, match="aborted by an earlier payload"):
        link.post([torch.zeros(8, dtype=torch.uint8)], sending=False)
    # gloo: an unfinished work that neither completes nor fails cannot be aborted: kept
    log.clear()
    stuck = _Work(log, "c", timeout_fails=False)
    stuck.wait = lambda timeout=None: False  # type: ignore[method-assign]
    link = _data_link(_Dist([stuck]), "gloo", log)
    buf = torch.zeros(8, dtype=torch.uint8)
    lost = link.cancel(link.post([buf], sending=False), "the receiver failed")
    assert lost is not None and lost.aborted is False and link.held == [([stuck], [buf])]
    assert log[-1] == ("event", "not aborted")


def test_a_receiver_step_that_raises_mid_round_gives_the_round_up(
    monkeypatch: Any, pipeline: dict[str, int]
) -> None:
    """A step of the receiver that raises after the payload arrived (here its landing of
    the round's first image) fails the run, but first gives up every image of the round not
    yet adopted: reservations released, suspended local restores resumed, nothing left; with
    ``pipeline=2`` the next round too (round 2, already accepted)."""
    cfg = small(**pipeline, images=6, window=2)
    s, r = Sender(cfg), Receiver(cfg)
    land = r.land
    landed: list[int] = []

    def failing_land(inc: Incoming, staging: Any) -> None:
        landed.append(inc.header.index)
        if len(landed) == 3:  # image 2, the first of round 2
            raise RuntimeError("planted: land fails")
        land(inc, staging)

    monkeypatch.setattr(r, "land", failing_land)
    results, _ = _run_loops(s, r, timeout=1.0)  # the sender then waits this long
    assert isinstance(results["r"], RuntimeError) and "planted" in str(results["r"])
    acc = r.accounting()
    assert acc["transfers"] == 0 and acc["suspended"] == 0, acc
    assert acc["free"] + acc["records"] == acc["num_units"], acc
    assert r.invariants() == []
    assert [r.coord.contains(k) for k in s.keys] == [True, True, False, False, False, False]
    rows = [e[2] for e in r.events if e[0] == "transfer"]
    in_flight = 2 if cfg.pipeline == 1 else 4  # round 1, and with pipeline 2 round 2
    assert rows.count("reserve") == 2 + in_flight and rows.count("release") == in_flight, rows
    assert r.coord.snapshot().queued_restores  # the resumed local restores are queued again


@pytest.mark.parametrize("payload", ["staged", "regions"])
def test_the_loops_adopt_only_landed_bytes_and_post_receives_after_go(
    payload: str, monkeypatch: Any, pipeline: dict[str, int]
) -> None:
    """The two loops in one process over a fake link: at the moment the receiver adopts an
    image (publishes it READY, SPEC C13), its reserved units already hold the image's bytes;
    and every payload receive is posted right after the round's GO message (on NCCL a
    receive posted before it cannot be withdrawn if the sender is lost). A receiver that
    adopts before it lands (or lands before the payload's wait) ends with the same bytes, so
    the end-of-run check cannot see it. With ``pipeline=2`` each round but the last has the
    next round's REPLIES sent between its post and its wait (round k+1 accepted while
    round k's payload is in flight). And the sender ends a round's leases only after its
    payload's wait (in ``regions`` mode the sends read the source units): at each wait of
    the sender, only the earlier rounds' leases are settled."""

    cfg = small(**pipeline, images=6, window=2, payload=payload)
    s = Sender(cfg)
    r = Receiver(cfg)
    at_adoption: list[tuple[int, bool]] = []
    adopt = r.coord.adopt_transfer_units

    def checked_adopt(owner: Any, h: int) -> bool:
        units = r.coord.snapshot().transfers[owner]
        held = r.tensors.read_units(list(units))[:IMAGE]
        at_adoption.append((h, bool(torch.equal(held, r.image(h)))))
        return bool(adopt(owner, h))

    monkeypatch.setattr(r.coord, "adopt_transfer_units", checked_adopt)
    wait = _FakeLink.wait
    settled_at_wait: list[int] = []

    def sender_wait(self: _FakeLink, posted: T.Posted) -> None:
        if self.rank == 0 and posted.sending and posted.tensors:
            settled_at_wait.append(sum(e[0] == "offload" and e[2] == "settle" for e in s.events))
        wait(self, posted)

    monkeypatch.setattr(_FakeLink, "wait", sender_wait)
    results, rlog = _run_loops(s, r)
    assert isinstance(results["r"], dict) and isinstance(results["s"], dict), results
    assert results["r"]["adopted"] == 6 and results["r"]["mismatches"] == []
    assert sorted(h for h, _ in at_adoption) == sorted(s.keys)
    assert all(ok for _, ok in at_adoption), "adopted before the bytes were in its units"
    first = next(k for k, e in enumerate(rlog) if e[0] == "exchange")
    timed = rlog[first + 1 :]  # after the warm-up
    posts = [k for k, e in enumerate(timed) if e[0] == "post"]
    waits = [k for k, e in enumerate(timed) if e[0] == "exchange"]
    assert len(posts) == len(waits) == 3 and all(p < w for p, w in zip(posts, waits, strict=True))
    assert all(timed[k - 1] == ("ints", T.KIND_PAYLOAD) for k in posts), timed
    between = [
        [e for e in timed[p + 1 : w] if e[0] == "send"] for p, w in zip(posts, waits, strict=True)
    ]
    if cfg.pipeline == 1:
        assert between == [[], [], []], timed
    else:  # REPLIES of rounds 1 and 2 sent with rounds 0 and 1 in flight
        assert [len(b) for b in between] == [1, 1, 0], timed
    assert settled_at_wait == [0, 0, 2, 4], settled_at_wait  # the warm-up, rounds 0, 1, 2


# -- two processes over gloo ---------------------------------------------------------------


def run(cfg: TransferConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    snd, rcv = spawn_transfer(cfg, timeout_s=RUN_LIMIT_S)
    assert not snd["killed"] and not rcv["killed"], (snd.get("log"), rcv.get("log"))
    return snd, rcv


def test_two_processes_happy_path_staged(backend: dict[str, str], pipeline: dict[str, int]) -> None:
    """Every image adopted and bit-exact, nothing left; and the control messages of the
    timed loop (3 rounds): ROUND, REPLIES and GO per round, then END and SUMMARY, 11 in
    all with ``pipeline=1``; with ``pipeline=2`` GO of round k travels with ROUND of round
    k+1 (and the last GO with END): 8, of which 4 are the sender's."""
    cfg = small(**backend, **pipeline, images=6, window=2, units=6 * U, baseline=True)
    snd, rcv = run(cfg)
    assert snd["exitcode"] == 0 and rcv["exitcode"] == 0, (snd.get("error"), rcv.get("error"))
    assert snd["sent"] == list(range(6)) and snd["refused"] == {}
    assert rcv["outcome"] == {str(i): ["adopted"] for i in range(6)}
    assert rcv["checked"] == [[i, "image"] for i in range(6)] and rcv["mismatches"] == []
    assert rcv["local"] == {"queued": 6, "suspended": 6, "released": 6, "resumed": 0}
    assert rcv["bytes_received"] == 6 * IMAGE == snd["bytes"]["sent"]
    assert snd["peer_summary"]["adopted"] == 6 and snd["peer_summary"]["verified"] == 6
    assert terminal_leases(snd) == (6, 6)
    no_leak(snd)
    no_leak(rcv)
    assert snd["accounting"]["records"] == 6 * U
    assert rcv["accounting"]["records"] == 7 * U  # six adopted images and the local one
    assert set(snd["keys"]) <= set(rcv["ready"])
    assert snd["baseline_s"] > 0 and rcv["baseline_s"] > 0
    sent, received = {1: (7, 4), 2: (4, 4)}[cfg.pipeline]  # the sender's
    assert snd["control_messages"] == {"sent": sent, "received": received, "rounds": 3,
                                       "per_round": (sent + received) / 3}  # fmt: skip
    assert rcv["control_messages"] == {**snd["control_messages"], "sent": received,
                                       "received": sent}  # fmt: skip
    assert snd["pipeline"] == rcv["pipeline"] == cfg.pipeline


#: The copy engine over the staging rows (issue 21): torch always, Triton where its
#: interpreter runs the kernel on these CPU tensors (tests/conftest.py).
STAGING_ENGINES = ["torch"] + (
    ["triton"] if triton_available() and os.environ.get("TRITON_INTERPRET") == "1" else []
)


@pytest.mark.parametrize("engine", STAGING_ENGINES)
def test_one_image_end_to_end_through_the_copy_engine(engine: str) -> None:
    s, r = pair(small(copy_engine=engine))
    assert s.copy_engine == r.copy_engine == engine and s.rows is not None
    h = s.keys[1]
    out = s.lease(1)
    assert r.queue_local(0)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming)
    move(s, r, out, inc)
    assert inc.state == "landed" and r.adopt(inc) is True
    assert torch.equal(restored(r, h, 0), s.image(h))
    assert check_invariants(r.coord.snapshot()) == [] and check_invariants(s.coord.snapshot()) == []


@pytest.mark.parametrize("engine", STAGING_ENGINES)
def test_a_round_is_gathered_and_landed_in_one_batch(engine: str) -> None:
    """gather_round / land_round: one executor batch per round (counted), every image's
    bytes bit-exact, the variant inverted, every source released; a staging buffer that is
    not one of the rows is refused with nothing changed."""
    cfg = small(copy_engine=engine, images=4, window=2, slots=2)
    s, r = pair(cfg)
    outs = [s.lease(0), s.lease(2, variant=1)]
    before = s.rows.executor.batches
    wires = s.gather_round(outs)
    assert s.rows.executor.batches == before + 1
    assert [o.state for o in outs] == ["released", "released"]
    pins = s.coord.snapshot().offload_pins
    assert len(pins) == 2 and all(p.source_released for p in pins.values())
    assert torch.equal(wires[0], s.image(s.keys[0]))
    assert torch.equal(wires[1], s.image(s.keys[2]).bitwise_not())
    incs = [r.accept(o.header, k) for k, o in enumerate(outs)]
    assert all(isinstance(i, Incoming) for i in incs)
    for k, w in enumerate(wires):
        r.buffers(incs[k], r.staging[k])[0].copy_(w)
    before = r.rows.executor.batches
    r.land_round(incs)  # type: ignore[arg-type]
    assert r.rows.executor.batches == before + 1
    for k, inc in enumerate(incs):
        assert inc.state == "landed"  # type: ignore[union-attr]
        got = r.tensors.read_units(list(inc.units)).view(torch.uint8)[:IMAGE]  # type: ignore[union-attr]
        assert torch.equal(got, wires[k])
    o = s.lease(1)
    snap = s.coord.snapshot()
    with pytest.raises(InvalidArgumentError):
        s.gather(o, torch.zeros_like(s.staging[0]))  # not one of the rows
    assert s.coord.snapshot() == snap and o.state == "leased"
    for x in (*outs, o):
        s.finish(x)


@pytest.mark.parametrize("engine", ["index", *STAGING_ENGINES])
def test_two_rounds_in_flight_own_their_staging_buffers(engine: str) -> None:
    """``pipeline=2``: round k+1 is gathered (into buffers ``window..2*window-1``) while
    round k's are on the wire, so its gather must not touch them; each round lands from its
    own buffers. A round that does not fit from its base is refused with nothing changed."""
    cfg = small(copy_engine=engine, pipeline=2, images=4, window=2)
    s, r = pair(cfg)
    assert len(s.staging) == len(r.staging) == 4
    if engine != "index":
        assert s.rows.rows.shape[0] == r.rows.rows.shape[0] == 4
    a, b = [s.lease(0), s.lease(1)], [s.lease(2), s.lease(3)]
    wa = s.gather_round(a, s.buffer_base(0))
    held = [w.clone() for w in wa]
    wb = s.gather_round(b, s.buffer_base(1))  # round 0's wires untouched
    assert all(torch.equal(w, h) for w, h in zip(wa, held, strict=True))
    assert [w.data_ptr() for w in wb] == [s.wire(s.staging[k]).data_ptr() for k in (2, 3)]
    for w, i in zip([*wa, *wb], range(4), strict=True):
        assert torch.equal(w, s.image(s.keys[i]))
    ia = [r.accept(o.header, k) for k, o in enumerate(a)]
    ib = [r.accept(o.header, 2 + k) for k, o in enumerate(b)]
    for incs, wires, base in ((ib, wb, 2), (ia, wa, 0)):  # round 1's bytes arrive first
        for k, w in enumerate(wires):
            r.buffers(incs[k], r.staging[base + k])[0].copy_(w)  # type: ignore[arg-type]
    snap = r.coord.snapshot()
    with pytest.raises(InvalidArgumentError, match="from staging buffer 3"):
        r.land_round(ia, 3)  # type: ignore[arg-type]
    assert r.coord.snapshot() == snap and all(i.state == "reserved" for i in ia)  # type: ignore[union-attr]
    r.land_round(ib, r.buffer_base(1))  # type: ignore[arg-type]
    r.land_round(ia, r.buffer_base(0))  # type: ignore[arg-type]
    for inc in (*ia, *ib):
        assert r.adopt(inc)  # type: ignore[arg-type]
    for i in range(4):
        assert torch.equal(restored(r, s.keys[i], 0), s.image(s.keys[i]))
    for x in (*a, *b):
        s.finish(x)
    assert check_invariants(r.coord.snapshot()) == [] and not s.coord.has_offload_pins()


@pytest.mark.parametrize("engine", STAGING_ENGINES)
def test_two_processes_through_the_copy_engine(engine: str) -> None:
    cfg = small(images=4, window=2, slots=2, units=4 * U, copy_engine=engine)
    snd, rcv = run(cfg)
    assert snd["exitcode"] == 0 and rcv["exitcode"] == 0, (snd.get("error"), rcv.get("error"))
    assert snd["copy_engine"] == rcv["copy_engine"] == engine
    assert rcv["outcome"] == {str(i): ["adopted"] for i in range(4)}
    assert rcv["checked"] == [[i, "image"] for i in range(4)] and rcv["mismatches"] == []
    assert terminal_leases(snd) == (4, 4)
    no_leak(snd)
    no_leak(rcv)


def test_two_processes_mid_payload_loss_through_the_copy_engine(pipeline: dict[str, int]) -> None:
    cfg = small(**pipeline, copy_engine="torch", fault="sender_dies_mid_payload", fault_image=3)
    snd, rcv = run(cfg)
    assert snd["exitcode"] == CRASH_EXIT and rcv["exitcode"] == 0, rcv.get("error")
    assert rcv["copy_engine"] == "torch"
    aborted_before_released(rcv)
    assert_round_1_given_up(snd, rcv)


def test_two_processes_the_same_image_twice_regions(
    backend: dict[str, str], pipeline: dict[str, int]
) -> None:
    """(b) over the wire: image 1 arrives again (inverted bytes) in a last round; the
    receiver's second adoption returns False and every restore of it is the first copy."""
    cfg = small(
        **backend, **pipeline, images=4, payload="regions", fault="duplicate", fault_image=1
    )
    snd, rcv = run(cfg)
    assert snd["exitcode"] == 0 and rcv["exitcode"] == 0, (snd.get("error"), rcv.get("error"))
    assert snd["sent"] == [0, 1, 2, 3, 1]
    assert rcv["outcome"]["1"] == ["adopted", "duplicate"] and rcv["duplicates"] == 1
    assert [1, "duplicate"] in rcv["checked"] and rcv["mismatches"] == []
    assert terminal_leases(snd) == (5, 5)
    no_leak(snd)
    no_leak(rcv)
    assert rcv["accounting"]["records"] == 5 * U  # 4 images + the local one, no 6th


def assert_round_1_given_up(snd: dict[str, Any], rcv: dict[str, Any]) -> None:
    """Round 0 (images 0, 1) adopted; round 1 (images 2, 3) given up by the receiver: both
    reservations released, both suspended local restores resumed and restored bit-exact;
    every lease of the sender settled; no leak on either side."""
    assert rcv["outcome"] == {
        "0": ["adopted"],
        "1": ["adopted"],
        "2": ["aborted"],
        "3": ["aborted"],
    }
    assert rcv["local"]["resumed"] == 2
    assert [2, "local"] in rcv["checked"] and [3, "local"] in rcv["checked"]
    assert rcv["mismatches"] == []
    released = {tuple(e[3]) for e in rcv["events"] if e[0] == "transfer" and e[2] == "release"}
    assert len(released) == 2
    assert terminal_leases(snd) == (4, 4)
    no_leak(snd)
    no_leak(rcv)


def test_two_processes_the_sender_dies_after_its_leases(
    backend: dict[str, str], pipeline: dict[str, int]
) -> None:
    """(a) The sender leases round 1 (images 2 and 3), the receiver reserves and suspends,
    the sender dies before any payload. Its own ``finally`` settled both leases (no
    timeout); the receiver sees the connection go, releases both reservations, resumes and
    runs the local restores; neither side leaks a unit."""
    cfg = small(**backend, **pipeline, fault="sender_dies", fault_image=3)
    snd, rcv = run(cfg)
    assert snd["exitcode"] == CRASH_EXIT and "dies" in snd["crashed"]
    assert rcv["exitcode"] == 0, rcv.get("error")
    assert rcv["peer_lost"]
    assert_round_1_given_up(snd, rcv)
    assert snd["accounting"]["records"] == 4 * U  # every image still READY on the sender
    assert rcv["accounting"]["records"] == 3 * U  # two adopted + the local image


def test_two_processes_the_sender_dies_after_go(
    backend: dict[str, str], pipeline: dict[str, int]
) -> None:
    """(a) The sender dies after GO, so the receiver has posted its payload receives: on
    gloo they fail when the connection goes; on nccl (a posted receive that cannot be
    withdrawn) they pass the data deadline. Either way the data group is aborted first, and
    the round is given up as when the sender dies before GO: both reservations released,
    both local restores resumed and checked, no leak. (The nccl variant runs only with two
    GPUs; it was not run on the session that wrote the abort.)"""
    cfg = small(**backend, **pipeline, fault="sender_dies_after_go", fault_image=3, timeout_s=5.0)
    snd, rcv = run(cfg)
    assert snd["exitcode"] == CRASH_EXIT and "after GO" in snd["crashed"]
    assert rcv["exitcode"] == 0, rcv.get("error")
    assert "image receive" in rcv["peer_lost"], rcv["peer_lost"]
    assert "the data group was aborted" in rcv["peer_lost"], rcv["peer_lost"]
    assert rcv["lost_payload"]["works_done"] == 0 and rcv["lost_payload"]["aborted"] is True
    aborted_before_released(rcv)
    assert_round_1_given_up(snd, rcv)
    assert rcv["accounting"]["records"] == 3 * U  # two adopted + the local image


def aborted_before_released(rcv: dict[str, Any]) -> None:
    """The receiver's rows: the data group's abort comes before the first reservation of the
    lost round is released (a receive still posted could otherwise land in released units)."""
    ev = rcv["events"]
    aborts = [k for k, e in enumerate(ev) if e[0] == "data"]
    releases = [k for k, e in enumerate(ev) if e[0] == "transfer" and e[2] == "release"]
    assert [ev[k][2] for k in aborts] == ["abort"], [ev[k] for k in aborts]
    assert releases and aborts[0] < releases[0], (aborts, releases)


def first_image_done(rcv: dict[str, Any], backend: dict[str, str], payload: str) -> None:
    """The lost payload was really lost in the middle: on gloo (one work per tensor) the
    first image's receives had completed and the rest were still posted; on nccl the
    payload is one grouped work, which never completed."""
    lost = rcv["lost_payload"]
    assert lost["round"] == 1 and lost["aborted"] is True, lost
    assert "the data group was aborted" in lost["how"], lost
    if backend["backend"] == "gloo":
        per_image = 1 if payload == "staged" else rcv["pieces_per_image"]
        assert (lost["works_done"], lost["works"]) == (per_image, 2 * per_image), lost
    else:
        assert (lost["works_done"], lost["works"]) == (0, 1), lost


@pytest.mark.parametrize("payload", ["staged", "regions"])
def test_two_processes_the_sender_dies_mid_payload(
    backend: dict[str, str], pipeline: dict[str, int], payload: str
) -> None:
    """(a) The sender sends image 2's bytes (the first image of round 1) and dies before
    image 3's: the receiver's receives of image 2 have completed, image 3's are still posted
    (gloo) when the connection goes. The data group is aborted before anything is released;
    the whole round is given up, image 2 too (its bytes arrived but nothing of a lost round
    is landed or adopted): both reservations released, both local restores resumed, run and
    checked bit for bit; the sender's ``finally`` settled its leases; no leak."""
    cfg = small(
        **backend, **pipeline, payload=payload, fault="sender_dies_mid_payload", fault_image=3
    )
    snd, rcv = run(cfg)
    assert snd["exitcode"] == CRASH_EXIT and "mid-payload" in snd["crashed"], snd.get("crashed")
    assert rcv["exitcode"] == 0, rcv.get("error")
    assert "image receive" in rcv["peer_lost"], rcv["peer_lost"]
    first_image_done(rcv, backend, payload)
    aborted_before_released(rcv)
    assert_round_1_given_up(snd, rcv)
    assert rcv["bytes_received"] == 2 * IMAGE  # image 2's bytes arrived but were not adopted
    assert rcv["quarantined"] == [] and rcv["accounting"]["records"] == 3 * U
    assert snd["accounting"]["records"] == 4 * U


@pytest.mark.parametrize("payload", ["staged", "regions"])
def test_two_processes_the_sender_stalls_mid_payload(
    backend: dict[str, str], pipeline: dict[str, int], payload: str
) -> None:
    """(a) A living sender goes silent after image 2's bytes: the receiver's payload passes
    its data deadline (1 s: half the 2 s group timeout), it aborts the data group, gives the
    round up as above and sends ABANDON. Only then does the sender send image 3 late: the
    late send fails (the data group's connections are gone), and no byte of the round's
    released units or staging tensors changed after the give-up (``late_writes`` 0). The
    sender fails; its ``finally`` settles every lease; no leak on either side."""
    cfg = small(
        **backend,
        **pipeline,
        payload=payload,
        fault="sender_stalls_mid_payload",
        fault_image=3,
        timeout_s=2.0,
    )
    snd, rcv = run(cfg)
    assert rcv["exitcode"] == 0, rcv.get("error")
    assert "image receive" in rcv["peer_lost"], rcv["peer_lost"]
    first_image_done(rcv, backend, payload)
    aborted_before_released(rcv)
    assert rcv["late_writes"] == 0, rcv["late_writes"]
    assert snd["exitcode"] == 1 and "abandoned round 1" in snd["error"], snd.get("error")
    assert "late send of the rest failed" in snd["error"], snd["error"]
    assert_round_1_given_up(snd, rcv)
    assert rcv["bytes_received"] == 2 * IMAGE


@pytest.mark.parametrize("fault", ["sender_dies_mid_payload", "sender_stalls_mid_payload"])
def test_two_processes_a_lost_payload_gives_up_its_accepted_successor(
    backend: dict[str, str], fault: str
) -> None:
    """(a) Two rounds in flight (``pipeline=2``, 6 images in rounds of 2): the sender sends
    GO of round 1 with ROUND of round 2, sends image 2's bytes, reads round 2's REPLIES (the
    receiver has reserved its units and suspended its local restores while round 1's
    payload is posted) and then dies (or goes silent). The receiver's wait of round 1 fails
    (or passes its deadline): the data group is aborted before ANY reservation of either
    round is released; both rounds are given up (4 reservations released, 4 local restores
    resumed, run and checked bit for bit); round 0 stays adopted; the sender's leases of all
    three rounds ended by settle (none reclaimed); no leak on either side."""
    stalls = fault == "sender_stalls_mid_payload"
    cfg = small(**backend, pipeline=2, images=6, fault=fault, fault_image=3,
                timeout_s=2.0 if stalls else 10.0)  # fmt: skip
    snd, rcv = run(cfg)
    assert rcv["exitcode"] == 0, rcv.get("error")
    if stalls:
        assert snd["exitcode"] == 1 and "late send of the rest failed" in snd["error"], snd
        assert rcv["late_writes"] == 0, rcv["late_writes"]
    else:
        assert snd["exitcode"] == CRASH_EXIT and "round 2 accepted" in snd["crashed"], snd
    assert rcv["outcome"] == {"0": ["adopted"], "1": ["adopted"],
                              **{str(i): ["aborted"] for i in range(2, 6)}}  # fmt: skip
    assert rcv["given_up_rounds"] == [1, 2]
    first_image_done(rcv, backend, "staged")
    ev = rcv["events"]
    abort = next(k for k, e in enumerate(ev) if e[0] == "data")
    reserves = [k for k, e in enumerate(ev) if e[0] == "transfer" and e[2] == "reserve"]
    releases = [k for k, e in enumerate(ev) if e[0] == "transfer" and e[2] == "release"]
    assert len(reserves) == 6 and reserves[-1] < abort  # round 2 reserved before the loss
    assert len(releases) == 4 and abort < releases[0], (abort, releases)
    assert {tuple(ev[k][3]) for k in releases} == {tuple(ev[k][3]) for k in reserves[2:]}
    assert rcv["local"]["resumed"] == 4 and rcv["mismatches"] == []
    assert all([i, "local"] in rcv["checked"] for i in range(2, 6))
    assert rcv["bytes_received"] == 2 * IMAGE and rcv["quarantined"] == []
    assert terminal_leases(snd) == (6, 6)
    no_leak(snd)
    no_leak(rcv)
    assert rcv["accounting"]["records"] == 3 * U  # two adopted + the local image


def test_two_processes_a_stalled_sender_times_the_receiver_out(
    backend: dict[str, str], pipeline: dict[str, int]
) -> None:
    """(a) A hung peer rather than a dead one: the receiver's receive times out after the
    group's timeout, it gives the round up as above; the sender's late send fails and its
    ``finally`` settles every lease. With ``pipeline=2`` the stall strikes round 1, whose
    REPLIES the sender read with round 0's payload in flight: it waits for that payload
    and settles round 0 first (adopted), then goes silent before GO of round 1."""
    stalled = 1 if pipeline["pipeline"] == 1 else 3
    cfg = small(**backend, **pipeline, fault="sender_stalls", fault_image=stalled, timeout_s=2.0)
    snd, rcv = run(cfg)
    assert rcv["exitcode"] == 0, rcv.get("error")
    assert "Timed out" in rcv["peer_lost"] or "timed out" in rcv["peer_lost"].lower()
    if stalled == 1:
        assert rcv["outcome"] == {"0": ["aborted"], "1": ["aborted"]}
    else:
        assert rcv["outcome"] == {"0": ["adopted"], "1": ["adopted"], "2": ["aborted"],
                                  "3": ["aborted"]}  # fmt: skip
        assert rcv["given_up_rounds"] == [1] and rcv["lost_payload"] is None
    assert rcv["local"]["resumed"] == 2 and rcv["mismatches"] == []
    assert snd["exitcode"] != 0 and "WireError" in snd["error"]
    acquired, _ = terminal_leases(snd)
    assert acquired >= 2
    no_leak(snd)
    no_leak(rcv)


def test_two_processes_a_full_receiver_refuses_before_anything_is_sent(
    backend: dict[str, str], pipeline: dict[str, int]
) -> None:
    """(d) Before round 1 a live-KV tenant takes every unit the receiver can free: both
    images of the round are refused before any byte moves (the receiver's snapshot is
    unchanged by each refusal), the sender settles their leases, and the run goes on."""
    cfg = small(**backend, **pipeline, images=6, units=6 * U, fault="receiver_full", fault_image=2)
    snd, rcv = run(cfg)
    assert snd["exitcode"] == 0 and rcv["exitcode"] == 0, (snd.get("error"), rcv.get("error"))
    assert snd["refused"] == {"2": "no_room", "3": "no_room"}
    assert snd["sent"] == [0, 1, 4, 5] and snd["bytes"]["sent"] == 4 * IMAGE
    assert rcv["bytes_received"] == 4 * IMAGE
    assert rcv["outcome"]["2"] == ["refused:no_room"] and rcv["refusal_changed_state"] == []
    assert rcv["adopted"] == 4 and rcv["mismatches"] == []
    assert terminal_leases(snd) == (6, 6)
    no_leak(snd)
    no_leak(rcv)


def test_two_processes_of_different_layouts_move_nothing(backend: dict[str, str]) -> None:
    """SPEC A.1: the receiver compares the HELLO's layout_id and sizes with its own; a
    mismatch fails both ranks before any lease or reservation."""
    snd, rcv = run(small(**backend, receiver_block_tokens=64))
    assert snd["exitcode"] == 1 and "LayoutMismatchError" in snd["error"]
    assert rcv["exitcode"] == 1 and "LayoutMismatchError" in rcv["error"]
    assert "block=64" in rcv["error"] and "block=128" in rcv["error"]


def test_spawn_refuses_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError):
        spawn_transfer("cfg")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        spawn_transfer(small(), timeout_s=0)
    with pytest.raises(InvalidArgumentError):
        spawn_transfer(small(), timeout_s=float("inf"))  # "bounded"
    with pytest.raises(InvalidArgumentError):
        T.run_rank(2, 2, small(), "file:///nowhere")


# -- layering and the benchmark's report ----------------------------------------------------


def test_the_driver_imports_neither_gpu_nor_torch_statically() -> None:
    """The driver (``pagedstate.impl.transfer``) takes ``pagedstate.gpu`` and torch by name at
    run time; the benchmark and the old path (``pagedstate.models``) take the driver so too."""
    import ast
    from pathlib import Path

    from pagedstate.models.bench import transfer as bench_transfer

    driver = sorted(Path(T.__file__ or "").parent.glob("*.py"))
    assert len(driver) > 2  # the package's modules, not only its __init__
    shim = Path(bench_transfer.__file__ or "").parent.parent / "transfer.py"
    checks = [(path, ("pagedstate.gpu", "torch")) for path in driver]
    checks += [
        (path, ("pagedstate.gpu", "pagedstate.impl", "torch"))
        for path in (Path(bench_transfer.__file__ or ""), shim)
    ]
    for path, banned in checks:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(banned), (path.name, name)


def test_the_old_path_warns_and_forwards(tmp_path: Any) -> None:
    """``pagedstate.models.transfer`` is a deprecated shim: importing it warns (pointing at
    the importer), it gives the driver's own objects, and ``python -m`` on it runs a rank."""
    import subprocess
    import sys

    sys.modules.pop("pagedstate.models.transfer", None)  # imported afresh: it warns again
    with pytest.warns(DeprecationWarning, match="moved to pagedstate.impl.transfer") as rec:
        import pagedstate.models.transfer as old
    assert rec[0].filename == __file__
    for name in (*T.__all__, "_config_json", "_sender_loop", "_receiver_loop", "KIND_PAYLOAD"):
        assert getattr(old, name) is getattr(T, name), name
    cmd = [sys.executable, "-m", "pagedstate.models.transfer", "--rank", "5", "--config", "x"]
    cmd += ["--init", (tmp_path / "rv").as_uri(), "--out", str(tmp_path / "out.json")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "invalid choice: 5" in p.stderr, p.stderr


def test_the_benchmark_writes_its_own_section(tmp_path: Any) -> None:
    from pagedstate.models.bench import transfer as B

    row = {
        "model": "m", "block_tokens": 512, "payload": "staged", "copy_engine": "triton",
        "window": 2, "pipeline": 2,
        "images": 8, "image_bytes": 3 << 20, "units_per_image": 4, "pieces_per_image": 38,
        "protocol_s": 0.5, "images_per_s": 16.0, "gbps": 0.05, "plain_gbps": 0.1,
        "ratio": 0.5, "control_per_round": 2.5, "checked": 8, "mismatches": 0,
        "sender_phases_s": {"gather": 0.004, "control": 0.008},
        "receiver_phases_s": {"land": 0.002},
    }  # fmt: skip
    failed = {**row, "protocol_s": None, "error": "rank 0: boom"}
    meta = {
        "date": "d",
        "commit": "c",
        "device": "x",
        "backend": "nccl",
        "torch": "t",
        "command": "k",
    }  # noqa: E501
    body = B.render([row, failed], meta)
    assert (
        "| m | 512 | staged | triton | 2 | 2 | 8 | 3.00 MiB | 4 (38) | 0.5000 | 16.0 | 0.05 |"
        " 0.10 | 0.50 | 2.50 | 8 (0) |" in body
    )
    # ms per image per phase: gather 4 ms / 8 images, control 1.0, then 0 for the missing
    phases = "| 512 | staged | triton | 2 | 2 | 0.500 | 1.000 | 0.000 | 0.000 | 0.000 | 0.250 |"
    assert phases in body
    failed_row = "| m | 512 | staged | triton | 2 | 2 | 8 | 3.00 MiB | 4 (38) | failed: rank 0"
    assert failed_row in body
    assert "failed: rank 0: boom" in body
    doc = tmp_path / "t.md"
    doc.write_text(
        "# T\n\n<!-- bench-transfer:nccl:begin -->\nold\n<!-- bench-transfer:nccl:end -->\ntail\n"
    )
    B.write_section(doc, "nccl", body)
    B.write_section(doc, "gloo", "g\n")
    text = doc.read_text()
    assert "old" not in text and text.count("bench-transfer:nccl:begin") == 1 and "tail" in text
    assert text.rstrip().endswith("<!-- bench-transfer:gloo:end -->")
    assert B._shown(["--backend", "gloo", "--out", "x.md", "--json=y", "--quick"]) == [
        "--backend", "gloo", "--quick",
    ]  # fmt: skip


@pytest.mark.parametrize("uniform", [True, False])
def test_the_fast_and_the_piece_path_move_the_same_bytes(uniform: bool) -> None:
    """Regions of one size take the fast path (one ``index_select`` / ``index_copy_`` per
    region); the piece path (a view per region piece) is the general one. Both land the
    image bit for bit; the fast path writes the staging padding (zero) into the last unit's
    tail past the image, the piece path leaves the tail as it was."""
    s, r = pair(small(images=2))
    assert s.uniform and r.uniform  # the slice's regions are all one size
    if not uniform:
        s.uniform = r.uniform = False
    for u in range(r.pool.num_units):  # junk everywhere a reservation could land
        r.tensors.fill_unit(u, torch.full((r.layout.page_unit_bytes,), 0xA5, dtype=torch.uint8))
    out = s.lease(1)
    inc = r.accept(out.header, 0)
    assert isinstance(inc, Incoming)
    move(s, r, out, inc)
    assert r.adopt(inc)
    assert torch.equal(restored(r, s.keys[1], 0), s.image(s.keys[1]))
    stream = r.tensors.read_units(list(inc.units))
    tail = stream[IMAGE:]
    assert tail.numel() == U * r.layout.page_unit_bytes - IMAGE > 0
    assert int(tail.count_nonzero()) == (0 if uniform else tail.numel())
    assert check_invariants(r.coord.snapshot()) == []


def test_the_benchmark_refuses_nccl_without_two_gpus_and_keeps_out_on_failure(
    tmp_path: Any, monkeypatch: Any, capsys: Any
) -> None:
    """nccl on a machine without two GPUs is a usage error before any run; a run that fails
    leaves ``--out`` as it was (no section of failed rows in the docs)."""
    from pagedstate.models.bench import transfer as B

    monkeypatch.setattr(B, "_two_gpus", lambda: False)
    with pytest.raises(SystemExit) as e:
        B.main(["--quick"])
    assert e.value.code == 2 and "--backend gloo" in capsys.readouterr().err
    doc = tmp_path / "t.md"
    doc.write_text("keep\n")
    monkeypatch.setattr(B, "spawn_transfer", lambda *a, **k: [{"error": "boom"}, {"error": "x"}])
    assert B.main(["--backend", "gloo", "--quick", "--images", "2", "--out", str(doc)]) == 1
    assert doc.read_text() == "keep\n"


# -- helper-38's breaks: other ranks' images, repeated images, END, configs ---------------


@pytest.mark.parametrize("engine", ["index", *STAGING_ENGINES])
def test_images_of_another_rank_are_refused_with_nothing_changed(engine: str) -> None:
    """A landing writes the units the Incoming names: one reserved by another receiver (or
    whose units were changed) must be refused before anything is written, or it overwrites
    this rank's READY image; a gather of another sender's lease likewise."""
    cfg = small(images=2, window=2, slots=2, units=2 * U, receiver_units=4 * U, copy_engine=engine)
    s = Sender(cfg)
    s.prefill()
    r1, r2 = Receiver(cfg), Receiver(cfg)
    o1 = s.lease(1)
    inc2 = r2.accept(o1.header, 0)
    assert isinstance(inc2, Incoming)
    w = s.gather_round([o1])[0]
    r2.buffers(inc2, r2.staging[0])[0].copy_(w)
    r2.land_round([inc2])
    assert r2.adopt(inc2) is True
    s.finish(o1)
    o0 = s.lease(0)
    inc1 = r1.accept(o0.header, 0)  # r1's reservation: units r2's image 1 may use
    assert isinstance(inc1, Incoming)
    before = r2.tensors.read_units(list(range(r2.pool.num_units))).clone()
    snap = r2.coord.snapshot()
    for call in (
        lambda: r2.land_round([inc1]),
        lambda: r2.land(inc1, r2.staging[0]),
        lambda: r2.buffers(inc1, r2.staging[0]),
    ):
        with pytest.raises(InvalidArgumentError, match="no reservation"):
            call()
        assert inc1.state == "reserved" and r2.coord.snapshot() == snap
        assert torch.equal(r2.tensors.read_units(list(range(r2.pool.num_units))), before)
    moved = attrs.evolve(inc1, units=tuple(reversed(inc1.units)))
    with pytest.raises(InvalidArgumentError, match="units changed"):
        r1.land_round([moved])
    s2 = Sender(cfg)
    s2.prefill()
    for call2 in (
        lambda: s2.gather_round([o0]),
        lambda: s2.gather(o0, s2.staging[0]),
        lambda: s2.regions(o0),
    ):
        with pytest.raises(InvalidArgumentError, match="no lease"):
            call2()
        assert o0.state == "leased"
    assert s.coord.snapshot().offload_pins[o0.op].source_released is False
    s.finish(o0)
    r1.abort(inc1)


@pytest.mark.parametrize("engine", ["index", *STAGING_ENGINES])
def test_a_round_naming_an_image_twice_or_not_a_list_is_refused(engine: str) -> None:
    cfg = small(images=2, window=2, slots=2, copy_engine=engine)
    s, r = pair(cfg)
    o = s.lease(0)
    snap = s.coord.snapshot()
    for bad in ([o, o], (o, o), o, iter([o]), [o, "x"]):
        with pytest.raises(InvalidArgumentError):
            s.gather_round(bad)  # type: ignore[arg-type]
        assert o.state == "leased" and s.coord.snapshot() == snap
    inc = r.accept(o.header, 0)
    assert isinstance(inc, Incoming)
    rsnap = r.coord.snapshot()
    for bad in ([inc, inc], inc):
        with pytest.raises(InvalidArgumentError):
            r.land_round(bad)  # type: ignore[arg-type]
        assert inc.state == "reserved" and r.coord.snapshot() == rsnap
    s.finish(o)
    r.abort(inc)


@pytest.mark.parametrize("end", [[99, None], [None, 12345]])
def test_an_end_that_does_not_match_the_rounds_is_a_wire_error(
    monkeypatch: Any, end: list[Any]
) -> None:
    """An END naming other counts than the rounds that arrived (an early or bogus END) is
    a WireError on the receiver, not a clean finish with images missing."""
    from pagedstate.impl.transfer import sender as snd_mod

    cfg = small(images=4, window=2, slots=2, local_restore=False)
    s, r = Sender(cfg), Receiver(cfg)
    real = snd_mod._Run.end_message

    def bogus(self: Any, rounds: int) -> list[int]:
        msg = real(self, rounds)
        msg[2] = rounds if end[0] is None else end[0]
        msg[3] = cfg.images if end[1] is None else end[1]
        return msg

    monkeypatch.setattr(snd_mod._Run, "end_message", bogus)
    results, _ = _run_loops(s, r, timeout=2.0)
    assert isinstance(results["r"], T.WireError), results["r"]
    assert "an END of" in str(results["r"])


def test_configs_the_driver_cannot_run_are_refused_when_built(monkeypatch: Any) -> None:
    # pipeline 2 leases the resend before the last regular round settles
    with pytest.raises(InvalidArgumentError, match="fault_image\\s+below 2|below 2"):
        small(images=4, window=2, slots=4, pipeline=2, fault="duplicate", fault_image=3)
    with pytest.raises(InvalidArgumentError, match="below 0"):
        small(images=2, window=2, slots=4, pipeline=2, fault="duplicate", fault_image=0)
    small(images=4, window=2, slots=4, pipeline=2, fault="duplicate", fault_image=1)  # runs
    # a receiver too small to keep the first copy while the resend is reserved
    with pytest.raises(InvalidArgumentError, match="needs receiver_units >= 9"):
        small(images=1, window=1, slots=1, fault="duplicate", receiver_units=8)
    small(images=1, window=1, slots=1, fault="duplicate", receiver_units=9)
    # Triton on CPU only under its interpreter
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(InvalidArgumentError, match="TRITON_INTERPRET|triton installed"):
        small(copy_engine="triton")
    small(copy_engine="triton", payload="regions")  # nothing to gather
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if triton_available():
        small(copy_engine="triton")
