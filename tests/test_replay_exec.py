"""``pagedstate replay --executor`` (models/replay/executor.py): real tensors under a replay.

A short replay of the Mooncake conversation trace (its first 150 requests, from the
checkout's data/traces/) runs the
store's ops on the torch executor over a slice of Qwen3-Next's geometry and checks every
restore bit for bit; planted bugs (a store that hands out an image's units in the wrong
order, an executor that skips stores or restores) are caught; the factory refuses bad kinds
and Triton without a GPU before any replay starts; and the executor's own pieces (the slice,
the op translation, scrubbing, the non-carried bytes) are checked on hand-made ops.
"""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pagedstate import impl as I  # noqa: E402
from pagedstate.gpu.geometry import load_geometry  # noqa: E402
from pagedstate.gpu.triton_copy import interpreting, triton_available  # noqa: E402
from pagedstate.models.replay import (  # noqa: E402
    ReplayConfig,
    ReplayEngine,
    ReplayError,
    TraceRequest,
    load_trace,
    replay,
)
from pagedstate.models.replay import executor as X  # noqa: E402
from pagedstate.models.replay.trace import DEFAULT_TRACE  # noqa: E402
from pagedstate.spec.errors import CopyOpError  # noqa: E402
from pagedstate.spec.types import (  # noqa: E402
    CheckpointRestoreOp,
    CheckpointStoreOp,
)

# Tiny tensors on a busy 2-core machine: one intra-op thread (as tests/gpu_helpers.py).
torch.set_num_threads(1)

QWEN = "Qwen/Qwen3-Next-80B-A3B-Instruct"
#: 32 MiB: the 682 units of 12 MiB (8 GiB) become a slice of 32 KiB pages (3 recurrent
#: layers, 1 attention layer, / 32): about 23 MiB of tensors.
SMALL_BYTES = 32 << 20

#: The trace shipped in the checkout's data/traces/.
TRACE = DEFAULT_TRACE
#: The Triton kernel runs: on CUDA, or on the CPU under Triton's interpreter (conftest.py
#: sets TRITON_INTERPRET=1 on a machine without an NVIDIA device).
triton_runs = pytest.mark.skipif(
    not triton_available() or not (torch.cuda.is_available() or interpreting()),
    reason="Triton is not installed, or there is neither CUDA nor TRITON_INTERPRET=1",
)


@pytest.fixture(scope="module")
def trace() -> list[TraceRequest]:
    return load_trace(TRACE, 150)


def _cfg(**kw: Any) -> ReplayConfig:
    base: dict[str, Any] = dict(model_id=QWEN, pool_gib=8, max_running=16)
    base.update(kw)
    return ReplayConfig(**base)


def _factory(cls: type[X.TensorReplayExecutor] = X.TensorReplayExecutor, **kw: Any) -> Any:
    """A factory building ``cls`` on the CPU with the torch executor over ``SMALL_BYTES``."""

    def make(layout: Any, units: int, slots: int, pool: Any) -> X.TensorReplayExecutor:
        return cls("torch", layout, units, slots, pool, device="cpu", max_bytes=SMALL_BYTES, **kw)

    return make


# -- replays ------------------------------------------------------------------------------


def test_torch_replay_checks_every_restore(trace: list[TraceRequest]) -> None:
    """The whole short replay, with CPU-tier hits and aborts: every HBM restore the drains
    handed out ran on the tensors and was checked; stats() is JSON and consistent."""
    r = replay(
        trace,
        _cfg(offload=True, abort_rate=0.1),
        executor_factory=X.make_executor_factory("torch", max_bytes=SMALL_BYTES),
    )
    c, e = r.counters, r.executor
    assert c["completed"] + c["aborted"] + c["rejected"] == c["requests"] == len(trace)
    assert c["cpu_hits"] > 0 and c["aborted"] > 0
    n = e["counts"]
    assert c["restores_checked"] > 0
    assert n["restores"] == n["restores_checked"] == c["restores_checked"] <= c["hits"]
    # every HBM hit's restore ran, but those an abort cancelled before their drain
    assert c["restores_checked"] >= c["hits"] - c["aborted_after_hit"] - c["aborted_before_drain"]
    assert n["stores"] > 0 and n["batches"] > 0 and n["scrubbed_units"] > 0
    assert n["set_states"] > c["requests"]
    lay = e["layout"]
    assert e["kind"] == "torch" and e["device"] == "cpu" and e["scaled"] is True
    assert lay["units"] == r.geometry["pool_units"] and lay["slots"] == 16
    assert lay["units_per_checkpoint"] == r.geometry["units_per_checkpoint"]
    assert lay["tensor_bytes"] <= SMALL_BYTES == lay["max_bytes"]
    assert lay["layout_id"] != e["model_layout_id"] == r.geometry["layout_id"]
    assert n["bytes_copied"] == (n["stores"] + n["restores"]) * lay["image_bytes"]
    assert n["modelled_bytes_copied"] == (n["stores"] + n["restores"]) * r.geometry["image_bytes"]
    assert e["seconds"]["execute"] > 0
    assert json.loads(json.dumps(r.to_json()))["executor"] == e


def _planted(coordinator: type) -> types.ModuleType:
    mod = types.ModuleType("planted")
    mod.UnitPool = I.UnitPool  # type: ignore[attr-defined]
    mod.PagedStateCheckpointCoordinator = coordinator  # type: ignore[attr-defined]
    return mod


class _MisorderedRestore(I.PagedStateCheckpointCoordinator):
    """Planted store bug: the first restore ever handed out names its image's units in
    reverse order (the right units, read in the wrong order)."""

    planted = 0

    def take_checkpoint_ops(self) -> Any:
        stores, restores = super().take_checkpoint_ops()
        if restores and not self.planted:
            type(self).planted += 1
            op = restores[0]
            bad = CheckpointRestoreOp(op.dst_slot, op.unit_ids[::-1], op.total_bytes, op.layout_id)
            restores = (bad, *restores[1:])
        return stores, restores


class _Dropping(X.TensorReplayExecutor):
    """Planted copy-executor bug: its launch drops every store (``drop = "store"``) or every
    restore (``"restore"``) of the batch it was handed (validated as usual)."""

    drop = ""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        run = self.executor._run
        empty = {
            f"{self.drop}_slots": np.zeros(0, np.int64),
            f"{self.drop}_units": np.zeros((0, self.layout.units_per_checkpoint), np.int64),
        }
        self.executor._run = lambda batch: run(attrs.evolve(batch, **empty))


class _SkipStores(_Dropping):
    drop = "store"


class _SkipRestores(_Dropping):
    drop = "restore"


def test_a_misordered_restore_is_caught(trace: list[TraceRequest]) -> None:
    _MisorderedRestore.planted = 0
    engine = ReplayEngine(_cfg(), trace, _planted(_MisorderedRestore), executor_factory=_factory())
    with pytest.raises(X.RestoreMismatch) as info:
        engine.run()
    e = info.value
    assert _MisorderedRestore.planted == 1
    assert engine.executor is not None
    page = engine.executor.layout.page_unit_bytes  # type: ignore[attr-defined]
    assert e.carried and e.offset < page  # the first unit's bytes
    assert f"slot {e.slot}" in str(e) and f"key {e.key}" in str(e)
    assert engine.c["restores_checked"] == 0  # the very first restore


@pytest.mark.parametrize("cls", [_SkipStores, _SkipRestores])
def test_an_executor_that_skips_copies_is_caught(
    trace: list[TraceRequest], cls: type[X.TensorReplayExecutor]
) -> None:
    engine = ReplayEngine(_cfg(), trace, executor_factory=_factory(cls))
    with pytest.raises(X.RestoreMismatch) as info:
        engine.run()
    e = info.value
    # never-written KV pages (0xDB) or the poisoned destination (0xA5) came back
    assert e.got == (X.UNWRITTEN if cls is _SkipStores else X.POISON)
    assert e.offset == 0 and e.tensor == "layer0.conv"


def test_verified_replay_with_an_executor(trace: list[TraceRequest]) -> None:
    r = replay(trace, _cfg(verify=True, snapshot_every=16), executor_factory=_factory())
    assert r.verified and r.counters["restores_checked"] > 0


@triton_runs
def test_triton_replay(trace: list[TraceRequest]) -> None:
    """The Triton kernel (compiled on CUDA, else the interpreter) under a short replay."""
    r = replay(
        trace[:40],
        _cfg(),
        executor_factory=X.make_executor_factory("triton", max_bytes=SMALL_BYTES),
    )
    n = r.executor["counts"]
    assert r.executor["kind"] == "triton"
    assert n["restores"] == n["restores_checked"] == r.counters["restores_checked"] > 0


# -- the factory ----------------------------------------------------------------------------


def test_bad_kind_and_arguments() -> None:
    with pytest.raises(ReplayError, match="one of torch, triton"):
        X.make_executor_factory("cuda")
    with pytest.raises(ReplayError, match="max_bytes"):
        X.make_executor_factory("torch", max_bytes=0)
    with pytest.raises(ReplayError, match="not a torch device"):
        X.make_executor_factory("torch", device="gpu7")


def test_triton_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if not triton_available():
        with pytest.raises(ReplayError, match="needs triton"):
            X.make_executor_factory("triton")
        return
    with pytest.raises(ReplayError, match="needs a GPU"):
        X.make_executor_factory("triton")
    with pytest.raises(ReplayError, match="needs a GPU"):
        X.make_executor_factory("triton", device="cpu")
    with pytest.raises(ReplayError, match="CUDA is not available"):
        X.make_executor_factory("torch", device="cuda")
    X.make_executor_factory("torch")  # the torch executor runs on the CPU


def test_models_do_not_import_gpu_or_impl_statically() -> None:
    tree = ast.parse(Path(X.__file__).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        for name in names:
            assert not name.startswith(("pagedstate.gpu", "pagedstate.impl", "torch")), name


# -- the executor on hand-made ops ---------------------------------------------------------


def _lone(spec_tokens: int = 1, units: int = 40, slots: int = 4) -> X.TensorReplayExecutor:
    """An executor over Qwen3-Next at 512-token pages (4 units per image) with
    ``spec_tokens`` non-carried conv rows, scaled into 2 MiB."""
    layout = load_geometry(QWEN).layout(512, spec_tokens=spec_tokens)
    pool = I.UnitPool(units)
    return X.make_executor_factory("torch", max_bytes=2 << 20)(layout, units, slots, pool)


def _store(ex: X.TensorReplayExecutor, slot: int, units: tuple[int, ...]) -> CheckpointStoreOp:
    full = ex.full_layout
    return CheckpointStoreOp(slot, units, full.image_bytes, full.layout_id)


def _restore(ex: X.TensorReplayExecutor, slot: int, units: tuple[int, ...]) -> CheckpointRestoreOp:
    full = ex.full_layout
    return CheckpointRestoreOp(slot, units, full.image_bytes, full.layout_id)


def test_round_trip_and_mismatches() -> None:
    ex = _lone()
    assert ex.scaled and ex.layout.spec_tokens == 1
    assert ex.layout.slot_bytes > ex.layout.image_bytes  # speculative rows exist
    ex.set_state(0, 7)
    ex.run_batch([_store(ex, 0, (5, 9, 2, 30))], [])
    ex.set_state(0, 8)  # the source moves on; the units keep 7's image
    ex.set_state(1, -3)
    ex.run_batch([], [_restore(ex, 1, (5, 9, 2, 30))])
    ex.check_restored(1, 7)
    with pytest.raises(X.RestoreMismatch, match="slot 1 .* key 8"):
        ex.check_restored(1, 8)
    # a restore must leave the bytes it does not carry as they were
    row = ex.tensors.slot_row(0, 1)
    carried = ex.layout.slot_tensors[0].carried_bytes
    row[carried + 3] ^= 1
    with pytest.raises(X.RestoreMismatch) as info:
        ex.check_restored(1, 7)
    e = info.value
    assert not e.carried and e.offset == carried + 3 and e.tensor == "layer0.conv"
    # a wrong byte deep in the image: its offset and tensor are named
    last = len(ex.layout.slot_tensors) - 1
    ex.tensors.slot_row(last, 1)[-1] ^= 0x10
    row[carried + 3] ^= 1
    with pytest.raises(X.RestoreMismatch) as info:
        ex.check_restored(1, 7)
    assert info.value.carried and info.value.offset == ex.layout.image_bytes - 1
    assert info.value.tensor == ex.layout.slot_tensors[last].name
    s = ex.stats()
    assert json.loads(json.dumps(s)) == s
    assert s["counts"]["restores_checked"] == 1 and s["counts"]["stores"] == 1


def test_ops_of_another_layout_or_size_are_refused() -> None:
    ex = _lone(spec_tokens=0)
    full = ex.full_layout
    ex.set_state(0, 1)
    for op, msg in [
        (CheckpointStoreOp(0, (1, 2, 3, 4), full.image_bytes, "other"), "layout_id"),
        (CheckpointStoreOp(0, (1, 2, 3, 4), full.image_bytes - 1, full.layout_id), "total"),
        (CheckpointStoreOp(0, (1, 2, 3), full.image_bytes, full.layout_id), "tuple of 4"),
        (CheckpointStoreOp(0, (1, 2, 3, 40), full.image_bytes, full.layout_id), "outside"),
        (CheckpointStoreOp(4, (1, 2, 3, 4), full.image_bytes, full.layout_id), "slot 4"),
        (_restore(ex, 0, (1, 2, 3, 4)), "expected a CheckpointStoreOp"),
    ]:
        before = ex.tensors.read_units([1, 2, 3, 4]).clone()
        with pytest.raises(CopyOpError, match=msg):
            ex.run_batch([op], [])
        assert torch.equal(ex.tensors.read_units([1, 2, 3, 4]), before)
    # a store of the model's layout is translated, and lands
    ex.run_batch([_store(ex, 0, (1, 2, 3, 4))], [])
    stream = ex.tensors.read_units([1, 2, 3, 4])[: ex.layout.image_bytes]
    assert torch.equal(stream, ex.image(1))


class _DirtyPool:
    """The pool calls the executor makes (SPEC G10): dirty units, owners, cached KV."""

    def __init__(self, dirty: set[int], owned: set[int], cached: set[int]) -> None:
        self.dirty, self.owned, self.cached = dirty, owned, cached

    def dirty_units(self) -> frozenset[int]:
        return frozenset(self.dirty)

    def owner_of(self, unit: int) -> object:
        return "someone" if unit in self.owned else None

    def cached_hash(self, unit: int) -> int | None:
        return 1234 if unit in self.cached else None

    def mark_clean(self, units: list[int]) -> None:
        self.dirty.difference_update(units)


def test_dirty_free_units_are_scrubbed_and_marked_clean() -> None:
    ex = _lone(spec_tokens=0)
    pool = ex.pool = _DirtyPool({1, 2, 3, 7, 8}, owned={7}, cached={8})
    ex.set_state(2, 5)
    ex.run_batch([_store(ex, 2, (20, 21, 22, 23))], [])
    assert pool.dirty == {7, 8}  # reserved again, or a cached KV block: kept
    assert not ex.tensors.read_units([1, 2, 3]).any()
    assert (ex.tensors.read_units([7, 8]) == X.UNWRITTEN).all()
    assert ex.stats()["counts"]["scrubbed_units"] == 3


def test_choose_slice() -> None:
    layout = load_geometry(QWEN).layout(512)
    same, size = X.choose_slice(layout, 10, 2, 1 << 40)
    assert same is layout and size == 10 * layout.page_unit_bytes + 2 * layout.slot_bytes
    # the slice with the most bytes that fit (ties: more layers), 4 units per image
    for limit, name in (
        (SMALL_BYTES, "[rec=3,attn=1,/32]"),
        (X.CPU_MAX_BYTES, "[rec=36,attn=11,/32]"),
        (300 << 20, "[rec=22,attn=6,/16]"),  # the same bytes as [rec=11,attn=3,/8]
        (1 << 30, "[rec=36,attn=11,/8]"),
    ):
        lay, size = X.choose_slice(layout, 682, 16, limit)
        assert lay.geometry.model_id == QWEN + name
        assert lay.units_per_checkpoint == layout.units_per_checkpoint
        assert size == 682 * lay.page_unit_bytes + 16 * lay.slot_bytes <= limit
    with pytest.raises(ReplayError, match="smallest slice"):
        X.choose_slice(layout, 682, 16, 1 << 20)
    assert len({X.image_seed(k) for k in (-5, -1, 0, 1, 5, 2**62)}) == 6
