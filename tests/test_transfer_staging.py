"""The transfer's staging rows (`pagedstate.impl.transfer.staging`, issue 21): a round's
images gathered into staging rows and landed from them by the copy engine, one batch per
round; and the one-device phase benchmark (`pagedstate.models.bench.transfer_phases`).

The rows are checked against the driver's own per-image path and against the pool's
units read back (``StateTensors.read_units``), with the torch executor and, when Triton
imports, the Triton kernel under its interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` on a machine without a GPU).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pagedstate.gpu.tensors import StateTensors  # noqa: E402
from pagedstate.gpu.triton_copy import triton_available  # noqa: E402
from pagedstate.impl.transfer import Sender, TransferConfig  # noqa: E402
from pagedstate.impl.transfer.config import _layout  # noqa: E402
from pagedstate.impl.transfer.staging import (  # noqa: E402
    ROW_ALIGN,
    StagingRows,
    _runs_of,
    staging_layout,
)
from pagedstate.spec.errors import (  # noqa: E402
    BatchHazardError,
    CopyOpError,
    InvalidArgumentError,
)

ENGINES = ["torch"] + (
    ["triton"] if triton_available() and os.environ.get("TRITON_INTERPRET") == "1" else []
)
SLICE = (1, 2, 32)  # 1 recurrent layer, 2 attention layers, / 32: 34,304 B in 3 units


def _filled(layout: Any, units: int, seed: int) -> StateTensors:
    t = StateTensors(layout, 2, units, "cpu")
    g = torch.Generator().manual_seed(seed)
    for x in t.kv_tensors:
        x.view(torch.int16).copy_(
            torch.randint(-(1 << 15), 1 << 15, x.shape, dtype=torch.int16, generator=g)
        )
    return t


def _stream(t: StateTensors, units: tuple[int, ...]) -> Any:
    return t.read_units(list(units)).view(torch.uint8)[: t.layout.image_bytes]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("block_tokens", [16, 512])
def test_gather_then_land_moves_every_image_bit_exact(engine: str, block_tokens: int) -> None:
    lay = _layout("Qwen/Qwen3-Next-80B-A3B-Instruct", SLICE, block_tokens)
    u = lay.units_per_checkpoint
    src = _filled(lay, 4 * u, 1)
    dst = _filled(lay, 4 * u, 2)
    a = StagingRows(lay, src.kv_tensors, 3, 4 * u, "cpu", engine)
    b = StagingRows(lay, dst.kv_tensors, 3, 4 * u, "cpu", engine)
    assert a.engine == engine
    # fragmented and reversed units: several runs per image
    images = [tuple(range(u - 1, -1, -1)), tuple(range(2 * u, 3 * u)), tuple(range(3 * u, 4 * u))]
    a.gather(images)
    for k, units in enumerate(images):
        assert torch.equal(a.wire(k), _stream(src, units))
    b.rows.copy_(a.rows)
    into = [tuple(range(3 * u, 4 * u)), tuple(range(u, 2 * u)), tuple(range(0, u))]
    untouched = dst.read_units(list(range(2 * u, 3 * u))).clone()
    b.land(into)
    for k, units in enumerate(into):
        assert torch.equal(_stream(dst, units), a.wire(k))
    assert torch.equal(dst.read_units(list(range(2 * u, 3 * u))), untouched)


def test_the_rows_are_the_image_stream_padded_and_the_layout_keeps_its_id() -> None:
    lay = _layout("Qwen/Qwen3-Next-80B-A3B-Instruct", SLICE, 16)
    st = staging_layout(lay)
    assert st.layout_id == lay.layout_id
    assert st.image_bytes == lay.image_bytes
    assert st.units_per_checkpoint == lay.units_per_checkpoint
    assert st.region_bytes == lay.region_bytes
    (row,) = st.slot_tensors
    assert row.carried_bytes == lay.image_bytes
    assert row.row_bytes % ROW_ALIGN == 0 and row.row_bytes - lay.image_bytes < ROW_ALIGN


def test_the_rows_match_the_drivers_own_gather() -> None:
    cfg = TransferConfig(images=3, window=3, slots=3, units=51, slice=SLICE, block_tokens=16)
    s = Sender(cfg, "cpu")
    s.prefill()
    rows = StagingRows(s.layout, s.tensors.kv_tensors, 3, cfg.units, "cpu", "torch")
    outs = [s.lease(i) for i in range(3)]
    rows.gather([o.units for o in outs])
    for k, o in enumerate(outs):
        assert torch.equal(rows.wire(k), s.image(s.keys[k]))
        assert torch.equal(s.gather(o, s.staging[k]), rows.wire(k))
        s.finish(o)


@pytest.mark.parametrize("engine", ENGINES)
def test_two_rounds_in_flight_have_a_row_each_and_gather_at_their_own(engine: str) -> None:
    """``pipeline=2``: the side's rows are ``window * pipeline`` (one per image in flight);
    round 1 gathers into rows ``window..`` (``at=``) and leaves round 0's rows untouched."""
    cfg = TransferConfig(images=4, window=2, slots=4, pipeline=2, units=12, slice=SLICE,
                         copy_engine=engine)  # fmt: skip
    s = Sender(cfg, "cpu")
    s.prefill()
    assert s.rows.rows.shape[0] == len(s.staging) == 4
    assert s.staging[3].data_ptr() == s.rows.rows[3].data_ptr()
    outs = [s.lease(i) for i in range(4)]
    s.gather_round(outs[:2], 0)
    rows0 = s.rows.rows[:2].clone()
    before = s.rows.executor.batches
    wires = s.gather_round(outs[2:], s.buffer_base(1))
    assert s.rows.executor.batches == before + 1 and torch.equal(s.rows.rows[:2], rows0)
    for k in range(4):
        assert torch.equal(s.rows.wire(k), s.image(s.keys[k]))
    assert [w.data_ptr() for w in wires] == [s.rows.wire(k).data_ptr() for k in (2, 3)]
    for o in outs:
        s.finish(o)
    again = [s.lease(0), s.lease(1)]
    with pytest.raises(InvalidArgumentError, match="from staging buffer 3"):
        s.gather_round(again, 3)  # rows 3 and 4: there is no row 4
    assert [o.state for o in again] == ["leased", "leased"]
    for o in again:
        s.finish(o)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_refused_round_writes_nothing(engine: str) -> None:
    lay = _layout("Qwen/Qwen3-Next-80B-A3B-Instruct", SLICE, 16)
    u = lay.units_per_checkpoint
    dst = _filled(lay, 3 * u, 3)
    b = StagingRows(lay, dst.kv_tensors, 2, 3 * u, "cpu", engine)
    b.rows.fill_(7)
    before = [x.view(torch.int16).clone() for x in dst.kv_tensors]  # bits (NaNs compare unequal)
    rows_before = b.rows.clone()
    bad: list[tuple[list[tuple[int, ...]], type[Exception]]] = [
        ([tuple(range(u)), tuple(range(u))], BatchHazardError),  # two images, one unit set
        ([tuple(range(u - 1))], CopyOpError),  # too few units
        ([tuple(range(2 * u, 2 * u + u - 1)) + (3 * u,)], CopyOpError),  # out of range
        ([tuple(range(u))] * 3, InvalidArgumentError),  # more images than rows
    ]
    for images, err in bad:
        with pytest.raises(err):
            b.land(images)
        if err is not BatchHazardError:  # two gathers reading one image are reads only
            with pytest.raises(err):
                b.gather(images)
        assert all(
            torch.equal(x.view(torch.int16), y) for x, y in zip(dst.kv_tensors, before, strict=True)
        )
        assert torch.equal(b.rows, rows_before)


def test_bad_construction_is_refused() -> None:
    lay = _layout("Qwen/Qwen3-Next-80B-A3B-Instruct", SLICE, 16)
    n = 2 * lay.units_per_checkpoint
    t = _filled(lay, n, 4)
    for window in (0, -1, 1.0, True):
        with pytest.raises(InvalidArgumentError):
            StagingRows(lay, t.kv_tensors, window, n, "cpu")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        StagingRows(lay, t.kv_tensors, 2, n, "cpu", "cuda-graphs")
    with pytest.raises(InvalidArgumentError):  # KV tensors of another pool size
        StagingRows(lay, t.kv_tensors, 2, n + 1, "cpu")


def test_runs_of_is_unit_runs() -> None:
    from pagedstate.spec.ops import unit_runs

    for units in [(), (5,), (3, 4, 5), (5, 4, 3), (0, 1, 3, 4), (2, 3, 9, 10, 11, 4)]:
        assert _runs_of(units) == unit_runs(units)
        assert _runs_of(list(units)) == unit_runs(units)


def test_the_phase_benchmark_runs_on_cpu_and_checks_its_bytes(capsys: Any) -> None:
    from pagedstate.models.bench import transfer_phases as tp

    rows = tp.measure([16], [2], "cpu", "torch", 0, 1, tp.QUICK_SLICE, say=lambda _: None)
    (row,) = rows
    assert row["mismatches"] == 0 and row["engine"] == "torch"
    for k in ("index gather", "engine gather", "index land", "engine land"):
        assert row[k]["round_s"] > 0
    assert "| 16 |" in tp.render(rows, "head")


def test_the_phase_benchmark_catches_a_misplaced_row(monkeypatch: Any) -> None:
    """The benchmark's byte check can fail: a landing that swaps two rows is caught."""
    from pagedstate.models.bench import transfer_phases as tp

    real = StagingRows.land

    def swapped(self: StagingRows, images: Any, at: Any = None) -> None:
        real(self, list(reversed(images)), at)

    monkeypatch.setattr(StagingRows, "land", swapped)
    with pytest.raises(RuntimeError, match="mismatched"):
        tp.measure([16], [2], "cpu", "torch", 0, 1, tp.QUICK_SLICE, say=lambda _: None)


def test_the_phase_benchmark_cli_refuses_bad_input(capsys: Any) -> None:
    from pagedstate.models.bench import transfer_phases as tp

    for argv in (
        ["--device", "tpu"],
        ["--window", "0"],
        ["--block-tokens", "x"],
        ["--repeat", "0"],
        ["--engine", "nope"],
    ):
        with pytest.raises(SystemExit) as e:
            tp.main(argv)
        assert e.value.code == 2


CUDA = torch.cuda.is_available() and triton_available()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and Triton (the device run)")
@pytest.mark.parametrize("block_tokens", [16, 512])
def test_on_cuda_the_triton_rows_move_every_image_bit_exact(block_tokens: int) -> None:
    lay = _layout("Qwen/Qwen3-Next-80B-A3B-Instruct", None, block_tokens)
    u = lay.units_per_checkpoint
    src = StateTensors(lay, 1, 3 * u, "cuda")
    dst = StateTensors(lay, 1, 3 * u, "cuda")
    for x in src.kv_tensors:
        x.view(torch.int16).random_(-(1 << 15), 1 << 15)
    for x in dst.kv_tensors:
        x.zero_()
    a = StagingRows(lay, src.kv_tensors, 2, 3 * u, "cuda")
    b = StagingRows(lay, dst.kv_tensors, 2, 3 * u, "cuda")
    assert a.engine == b.engine == "triton"
    images = [tuple(range(2 * u - 1, u - 1, -1)), tuple(range(2 * u, 3 * u))]
    a.gather(images)
    b.rows.copy_(a.rows)
    into = [tuple(range(0, u)), tuple(range(u, 2 * u))]
    b.land(into)
    torch.cuda.synchronize()
    for k in range(2):
        assert torch.equal(a.wire(k), _stream(src, images[k]))
        assert torch.equal(_stream(dst, into[k]), a.wire(k))
    before = [x.view(torch.int16).clone() for x in dst.kv_tensors]
    with pytest.raises(BatchHazardError):
        b.land([into[0], into[0]])
    torch.cuda.synchronize()
    assert all(
        torch.equal(x.view(torch.int16), y) for x, y in zip(dst.kv_tensors, before, strict=True)
    )


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and Triton (the device run)")
def test_on_cuda_the_driver_gathers_and_lands_a_round_through_triton() -> None:
    from pagedstate.impl.transfer import Incoming, Receiver

    cfg = TransferConfig(
        images=4,
        window=4,
        slots=4,
        units=4 * 101,
        receiver_units=5 * 101,
        slice=None,
        block_tokens=16,
        backend="nccl",
        device="cuda",
        local_restore=False,
    )
    s = Sender(cfg, "cuda:0")
    r = Receiver(cfg, "cuda:0")
    assert s.copy_engine == r.copy_engine == "triton"
    s.prefill()
    outs = [s.lease(i) for i in range(4)]
    wires = s.gather_round(outs)
    incs = [r.accept(o.header, k) for k, o in enumerate(outs)]
    assert all(isinstance(i, Incoming) for i in incs)
    for k, w in enumerate(wires):
        r.buffers(incs[k], r.staging[k])[0].copy_(w)
    r.land_round(incs)  # type: ignore[arg-type]
    for k, inc in enumerate(incs):
        assert r.adopt(inc) is True  # type: ignore[arg-type]
        assert r.coord.begin_restore(s.keys[k], k)
    r.run_batch()
    torch.cuda.synchronize()
    for k in range(4):
        assert r.check_slot(k, s.keys[k]).item() == 0
    for o in outs:
        s.finish(o)


@pytest.mark.parametrize("engine", ENGINES)
def test_rows_named_twice_or_not_a_sequence_are_refused_with_nothing_changed(engine: str) -> None:
    lay = _layout("Qwen/Qwen3-Next-80B-A3B-Instruct", SLICE, 16)
    u = lay.units_per_checkpoint
    dst = _filled(lay, 2 * u, 5)
    b = StagingRows(lay, dst.kv_tensors, 2, 2 * u, "cpu", engine)
    b.rows.fill_(9)
    kv = [x.view(torch.int16).clone() for x in dst.kv_tensors]
    rows = b.rows.clone()
    two = [tuple(range(u)), tuple(range(u, 2 * u))]
    for images, at in ((two, [0, 0]), (two, 5), (iter(two), None), (two, "01")):
        for call in (b.land, b.gather):
            with pytest.raises(InvalidArgumentError):
                call(images, at)  # type: ignore[arg-type]
            assert torch.equal(b.rows, rows)
            assert all(
                torch.equal(x.view(torch.int16), y) for x, y in zip(dst.kv_tensors, kv, strict=True)
            )


def test_the_phase_benchmark_refuses_what_it_cannot_run_before_it_runs(
    monkeypatch: Any, tmp_path: Any
) -> None:
    from pagedstate.models.bench import transfer_phases as tp

    monkeypatch.setattr(tp, "measure", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit) as e:
        tp.main(["--device", "cpu", "--engine", "triton"])
    assert e.value.code == 2
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as e:
        tp.main(["--device", "cpu", "--quick", "--json", str(blocker / "x.json")])
    assert e.value.code == 2
