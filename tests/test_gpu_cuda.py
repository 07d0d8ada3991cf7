"""The copy engine on a CUDA device: full geometries, both executors, one launch
per batch, no stream synchronization, CUDA graph capture. Skipped without CUDA; run on the
H200 through the device tool (docs/gpu-benchmarks.md keeps the output)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from pagedstate.gpu.executor import TorchCopyExecutor  # noqa: E402
from pagedstate.gpu.geometry import geometry_ids, load_geometry  # noqa: E402
from pagedstate.gpu.tensors import StateTensors  # noqa: E402
from pagedstate.gpu.triton_copy import TritonCopyExecutor  # noqa: E402
from pagedstate.spec.errors import BatchHazardError  # noqa: E402
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp  # noqa: E402

pytestmark = pytest.mark.gpu

BENCH_MODELS = ("Qwen3-Next-80B", "Nemotron-H-8B", "Kimi-Linear")
EXECUTORS = ("torch", "triton-while", "triton-for", "triton-bytes")


def _executor(kind: str, t: StateTensors, max_ops: int) -> Any:
    if kind == "torch":
        return TorchCopyExecutor(t, max_ops)
    if kind == "triton-bytes":
        return TritonCopyExecutor(t, max_ops, wide=False, block=4096)
    return TritonCopyExecutor(t, max_ops, for_loop=kind == "triton-for")


def _scramble(t: StateTensors) -> None:
    for x in t.all_tensors():
        x.view(torch.uint8).random_(0, 256)


def _ops(layout: Any, slots: list[int], units: np.ndarray) -> list[CheckpointStoreOp]:
    return [
        CheckpointStoreOp(s, tuple(int(u) for u in units[i]), layout.image_bytes, layout.layout_id)
        for i, s in enumerate(slots)
    ]


def _restores(layout: Any, slots: list[int], stores: list[CheckpointStoreOp]) -> list[Any]:
    return [
        CheckpointRestoreOp(s, op.unit_ids, layout.image_bytes, layout.layout_id)
        for s, op in zip(slots, stores, strict=True)
    ]


@pytest.mark.parametrize("kind", EXECUTORS)
@pytest.mark.parametrize("model", BENCH_MODELS)
def test_round_trip_full_geometry(model: str, kind: str) -> None:
    """8 stores into shuffled, non-contiguous units, then 8 restores into other slots:
    the carried bytes come back exactly; non-carried slot bytes (a speculative-token conv
    row) and every unit byte past the image stay as they were."""
    layout = load_geometry(model).layout(16, spec_tokens=1)
    u, b = layout.units_per_checkpoint, 8
    t = StateTensors(layout, 2 * b, 3 * b * u, "cuda")
    _scramble(t)
    rng = np.random.default_rng(1)
    units = rng.permutation(3 * b * u)[: b * u].reshape(b, u)
    stores = _ops(layout, list(range(b)), units)
    ex = _executor(kind, t, 2 * b)
    images = [t.read_image(i).clone() for i in range(b)]
    unit_before = [t.read_units(op.unit_ids).clone() for op in stores]
    ex.execute(stores)
    for i, op in enumerate(stores):
        got = t.read_units(op.unit_ids)
        assert torch.equal(got[: layout.image_bytes], images[i])
        assert torch.equal(got[layout.image_bytes :], unit_before[i][layout.image_bytes :])
    slot_before = [t.read_slot(b + i).clone() for i in range(b)]
    ex.execute((), _restores(layout, [b + i for i in range(b)], stores))
    torch.cuda.synchronize()
    for i in range(b):
        assert torch.equal(t.read_image(b + i), images[i])
        after = t.read_slot(b + i)
        changed = (after != slot_before[i]).nonzero().flatten()
        # Only carried bytes may change: map every changed byte to its slot tensor.
        pos = 0
        for info in layout.slot_tensors:
            in_t = changed[(changed >= pos) & (changed < pos + info.row_bytes)] - pos
            assert int(in_t.max().item()) < info.carried_bytes if in_t.numel() else True
            pos += info.row_bytes


@pytest.mark.parametrize("model", [m for m in geometry_ids() if m != "state-spaces/mamba2-2.7b"])
def test_every_geometry_round_trips(model: str) -> None:
    """Every shipped geometry with attention layers: 2 stores and 2 restores, exact."""
    layout = load_geometry(model).layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 4, 2 * u, "cuda")
    _scramble(t)
    units = np.random.default_rng(2).permutation(2 * u).reshape(2, u)
    stores = _ops(layout, [0, 1], units)
    ex = TritonCopyExecutor(t, 4)
    images = [t.read_image(i).clone() for i in range(2)]
    ex.execute(stores)
    ex.execute((), _restores(layout, [2, 3], stores))
    torch.cuda.synchronize()
    assert torch.equal(t.read_image(2), images[0]) and torch.equal(t.read_image(3), images[1])


@pytest.mark.parametrize("kind", EXECUTORS)
def test_mixed_batch_and_scrub_in_one_call(kind: str) -> None:
    """Stores, restores of earlier images and scrubs of free units in one batch."""
    layout = load_geometry("Qwen3-Next-80B").layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 8, 6 * u, "cuda")
    _scramble(t)
    ex = _executor(kind, t, 8)
    first = _ops(layout, [0, 1], np.arange(2 * u).reshape(2, u))
    images = [t.read_image(i).clone() for i in range(4)]
    ex.execute(first)
    second = _ops(layout, [2, 3], np.arange(2 * u, 4 * u).reshape(2, u))
    scrub = list(range(5 * u, 5 * u + 7))
    ex.execute(second, _restores(layout, [4, 5], first), scrub_units=scrub)
    torch.cuda.synchronize()
    assert torch.equal(t.read_image(4), images[0]) and torch.equal(t.read_image(5), images[1])
    for i, op in enumerate(second):
        assert torch.equal(t.read_units(op.unit_ids)[: layout.image_bytes], images[2 + i])
    assert int(t.read_units(scrub).count_nonzero().item()) == 0
    assert int(t.read_units([5 * u + 7]).count_nonzero().item()) > 0


def test_hazard_refused_writes_nothing() -> None:
    layout = load_geometry("Kimi-Linear").layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 4, 2 * u, "cuda")
    _scramble(t)
    ex = TritonCopyExecutor(t, 4)
    # Compared as bytes: random bf16 bit patterns include NaNs, which never equal.
    before = [x.view(torch.uint8).clone() for x in t.all_tensors()]
    stores = _ops(layout, [0], np.arange(u).reshape(1, u))
    with pytest.raises(BatchHazardError):
        ex.execute(stores, _restores(layout, [1], stores))
    torch.cuda.synchronize()
    after = [x.view(torch.uint8) for x in t.all_tensors()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_execute_does_not_synchronize_the_stream() -> None:
    """Building and uploading the descriptor leaves the compute stream running: with the
    stream busy (a long sleep kernel queued first), ``execute`` returns while the stream
    still has work, and the copy lands after it."""
    layout = load_geometry("Qwen3-Next-80B").layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 2, 2 * u, "cuda")
    _scramble(t)
    ex = TritonCopyExecutor(t, 4)
    stores = _ops(layout, [0], np.arange(u).reshape(1, u))
    ex.execute(stores)  # compile and warm up
    ex.execute(stores)
    torch.cuda.synchronize()
    image = t.read_image(1).clone()
    stores = _ops(layout, [1], np.arange(u, 2 * u).reshape(1, u))
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU cycles
    ex.execute(stores)
    ex.execute(stores)  # twice: the second reuses a staging buffer
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert torch.equal(t.read_units(stores[0].unit_ids)[: layout.image_bytes], image)


def test_cuda_graph_capture_and_replay() -> None:
    """The launch can be captured: the descriptor buffer is static and the grid its
    capacity; replaying the graph repeats the copy."""
    layout = load_geometry("Nemotron-H-8B").layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 2, 2 * u, "cuda")
    _scramble(t)
    ex = TritonCopyExecutor(t, 2)
    stores = _ops(layout, [0], np.arange(u).reshape(1, u))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ex.execute(stores)  # warm up (compile) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ex.execute(stores)
    t.slot_tensors[0].view(torch.uint8).random_(0, 256)
    image = t.read_image(0).clone()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(t.read_units(stores[0].unit_ids)[: layout.image_bytes], image)


@pytest.mark.parametrize("kind", ["triton", "torch"])
def test_data_integrity_under_fuzzing_full_geometry(kind: str) -> None:
    """tests/test_gpu_integrity.py's state machine (production coordinator and pool,
    patterns per (hash, boundary), tenants scribbling on KV and free units, exact restores,
    untouched non-image bytes, scrubs read zero, cached KV intact) on the full Qwen3-Next
    geometry on the GPU, through the compiled kernel or the torch executor."""
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test
    from test_gpu_integrity import SLOTS, IntegrityMachine

    layout = load_geometry("Qwen3-Next-80B").layout(16, spec_tokens=1)

    class FullGeometry(IntegrityMachine):
        stats: dict[str, int] = {}
        executor_name = kind

        def build_executor(self) -> Any:
            if kind == "triton":
                return TritonCopyExecutor(self.t, 2 * SLOTS)
            return TorchCopyExecutor(self.t, 2 * SLOTS)

    FullGeometry.layout = layout
    FullGeometry.units = SLOTS * layout.units_per_checkpoint + 2  # tenants force evictions
    FullGeometry.device = "cuda"
    run_state_machine_as_test(
        FullGeometry,
        settings=settings(
            max_examples=8,
            stateful_step_count=25,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    done = FullGeometry.stats
    for what in ("stores", "restores", "evictions"):
        assert done.get(what, 0) > 0, f"the run made no {what}: {done}"


# -- descriptors on the device: ops as runs (SPEC A.5, E.4) ---------------------------------


def _run_ops(layout: Any, slot: int, ids: tuple[int, ...], cls: Any) -> Any:
    """An op as the store builds it: runs, ``unit_ids`` not expanded."""
    from pagedstate.spec.ops import unit_runs

    return cls._of_runs(slot, unit_runs(ids), layout.image_bytes, layout.layout_id)


def _fragmented_ids(rng: np.random.Generator, units: np.ndarray, pieces: int) -> tuple[int, ...]:
    """``units`` (consecutive ids) cut into ``pieces`` stretches, the stretches shuffled;
    ``pieces == len(units)`` with a reversal: every unit its own run, descending."""
    if pieces >= len(units):
        return tuple(int(x) for x in units[::-1])
    cuts = np.sort(rng.choice(np.arange(1, len(units)), pieces - 1, replace=False))
    parts = np.split(units, cuts)
    order = rng.permutation(len(parts))
    return tuple(int(x) for i in order for x in parts[i])


def _twin(t: StateTensors) -> StateTensors:
    """Tensors of the same layout and sizes holding the same bytes."""
    other = StateTensors(t.layout, t.num_slots, t.num_blocks, "cuda")
    for a, b in zip(other.all_tensors(), t.all_tensors(), strict=True):
        a.view(torch.uint8).copy_(b.view(torch.uint8))
    return other


def _same(a: StateTensors, b: StateTensors) -> bool:
    return all(
        torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        for x, y in zip(a.all_tensors(), b.all_tensors(), strict=True)
    )


def _runs_batch(layout: Any, seed: int) -> tuple[list[Any], list[Any], list[int], int]:
    """2 stores and 2 restores of fragmented images (one run, 8 runs shuffled, every unit
    its own run descending, 3 runs) and 5 scrub units, over 6 images' worth of units."""
    u = layout.units_per_checkpoint
    rng = np.random.default_rng(seed)
    chunks = [np.arange(i * u, (i + 1) * u) for i in rng.permutation(6)]
    ids = [
        tuple(int(x) for x in chunks[0]),
        _fragmented_ids(rng, chunks[1], 8),
        _fragmented_ids(rng, chunks[2], u),
        _fragmented_ids(rng, chunks[3], 3),
    ]
    stores = [_run_ops(layout, s, ids[i], CheckpointStoreOp) for i, s in enumerate([0, 1])]
    restores = [_run_ops(layout, s, ids[2 + i], CheckpointRestoreOp) for i, s in enumerate([2, 3])]
    scrub = sorted(int(x) for x in rng.choice(chunks[4], 5, replace=False))
    return stores, restores, scrub, 6 * u


@pytest.mark.parametrize("kind", EXECUTORS[1:])
@pytest.mark.parametrize("model", BENCH_MODELS)
def test_fragmented_runs_mixed_batch_bit_exact(model: str, kind: str) -> None:
    """Stores, restores and scrubs of images in one run, in shuffled runs and in single
    runs descending, in one launch: the compiled kernel writes exactly the bytes of
    ``write_descriptor``'s rows (applied one by one) and of the torch executor, and uploads
    O(ops + runs) integers."""
    from test_gpu_descriptor import _apply_rows, _want_rows

    layout = load_geometry(model).layout(16, spec_tokens=1)
    stores, restores, scrub, blocks = _runs_batch(layout, 5)
    t = StateTensors(layout, 4, blocks, "cuda")
    _scramble(t)
    ref, by_rows = _twin(t), _twin(t)
    ex = _executor(kind, t, 8)
    ex.execute(stores, restores, scrub)
    runs = sum(len(op.runs) for op in [*stores, *restores])
    assert runs > layout.units_per_checkpoint + 2  # one image in single-unit runs
    assert ex.last_upload_ints == 4 + 2 * 4 + 1 + 2 * runs + len(scrub)
    assert all(op._ids is None for op in [*stores, *restores])  # never expanded
    TorchCopyExecutor(ref, 8).execute(stores, restores, scrub)
    _apply_rows(by_rows, _want_rows(by_rows, ex.plan, stores, restores, scrub))
    torch.cuda.synchronize()
    assert _same(t, ref), "the kernel and the torch executor differ"
    assert _same(t, by_rows), "the kernel's bytes are not write_descriptor's rows"
    assert int(t.read_units(scrub).count_nonzero().item()) == 0


def test_cuda_graph_capture_of_a_fragmented_mixed_batch() -> None:
    """A captured launch of stores, restores and scrubs over fragmented runs (the grid the
    capacity's, the extra programs idle) replays the same copy with the slots' new bytes."""
    layout = load_geometry("Kimi-Linear").layout(16)
    stores, restores, scrub, blocks = _runs_batch(layout, 7)
    t = StateTensors(layout, 4, blocks, "cuda")
    _scramble(t)
    ex = TritonCopyExecutor(t, 8, max_scrub_units=16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ex.execute(stores, restores, scrub)  # warm up (compile) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ex.execute(stores, restores, scrub)
    assert ex._grid_cap > ex.programs(4, len(scrub))
    _scramble(t)
    ref = _twin(t)
    g.replay()
    TorchCopyExecutor(ref, 8).execute(stores, restores, scrub)
    torch.cuda.synchronize()
    assert _same(t, ref)


def test_direct_launches_copy_what_the_jit_dispatch_copies() -> None:
    """The compiled kernel's launcher (``direct_launch``, after the first launch compiled
    it) and Triton's JIT dispatch write the same bytes, batch after batch, over grids of
    several sizes, on the default stream and on a stream of the caller's; the compute
    stream then waits for the side stream's upload either way."""
    layout = load_geometry("Kimi-Linear").layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 4, 12 * u, "cuda")
    _scramble(t)
    twin = _twin(t)
    direct = TritonCopyExecutor(t, 8)
    jit = TritonCopyExecutor(twin, 8)
    jit.direct_launch = False
    rng = np.random.default_rng(3)
    user = torch.cuda.Stream()
    for step in range(8):
        k = 1 + step % 3
        units = rng.permutation(12 * u)[: k * u].reshape(k, u)
        stores = _ops(layout, list(range(k)), units)
        for ex in (direct, jit):
            if step % 2:
                user.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(user):
                    ex.execute(stores)
                torch.cuda.current_stream().wait_stream(user)
            else:
                ex.execute(stores)
        for x in (*t.slot_tensors, *twin.slot_tensors):  # the next images: new slot bytes
            x.view(torch.uint8).add_(1)
    torch.cuda.synchronize()
    assert direct._runners and not jit._runners  # the two paths were taken
    assert _same(t, twin)


def _mixed_step(layout: Any, rng: Any, step: int, units_total: int) -> list[CheckpointStoreOp]:
    """Step ``step``'s stores: one to three images, one run each on even steps (an upload
    of a few integers) and shuffled units on odd ones (hundreds of integers)."""
    u = layout.units_per_checkpoint
    k = 1 + step % 3
    if step % 2:
        units = rng.permutation(units_total)[: k * u].reshape(k, u)
    else:
        first = rng.permutation(units_total // u)[:k]
        units = np.stack([np.arange(f * u, (f + 1) * u) for f in first])
    return _ops(layout, list(range(k)), units)


def test_host_read_uploads_copy_what_device_uploads_copy() -> None:
    """Small uploads read from pinned host memory (``host_read_ints``), every upload read
    so, and none: the same bytes, batch after batch, with upload sizes on both sides of
    the threshold and buffers reused in turn."""
    layout = load_geometry("Qwen3-Next").layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 4, 12 * u, "cuda")
    _scramble(t)
    twins = [_twin(t), _twin(t)]
    auto = TritonCopyExecutor(t, 8)
    every = TritonCopyExecutor(twins[0], 8)
    every.host_read_ints = 1 << 30
    never = TritonCopyExecutor(twins[1], 8)
    never.host_read_ints = 0
    rng = np.random.default_rng(5)
    for step in range(10):
        stores = _mixed_step(layout, rng, step, 12 * u)
        for ex in (auto, every, never):
            ex.execute(stores)
        for x in (*t.slot_tensors, *twins[0].slot_tensors, *twins[1].slot_tensors):
            x.view(torch.uint8).add_(1)
    torch.cuda.synchronize()
    assert 0 < auto.host_read_batches < auto.batches  # both paths ran on auto
    assert every.host_read_batches == every.batches and never.host_read_batches == 0
    assert _same(t, twins[0]) and _same(t, twins[1])


class _NoWait:
    """An event whose host wait is skipped (a planted bug: the host rewrites a staging
    buffer that a queued kernel has yet to read)."""

    def __init__(self, event: Any) -> None:
        self.event = event

    def record(self, stream: Any = None) -> None:
        self.event.record(stream)

    def synchronize(self) -> None:
        pass


def _host_read_race(planted: bool) -> bool:
    """Three one-image batches queued behind a long sleep kernel, so the host stages the
    third (into the first's staging buffer) before the first kernel runs: whether the
    bytes match those of an executor that copies every upload to the device."""
    layout = load_geometry("Qwen3-Next").layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 4, 12 * u, "cuda")
    _scramble(t)
    twin = _twin(t)
    ex = TritonCopyExecutor(t, 8)
    ex.host_read_ints = 1 << 30
    ref = TritonCopyExecutor(twin, 8)
    ref.host_read_ints = 0
    warm = _ops(layout, [3], np.arange(11 * u, 12 * u)[None, :])
    ex.execute(warm)  # compiles
    ref.execute(warm)
    torch.cuda.synchronize()
    if planted:
        ex._kernel_done = [_NoWait(e) for e in ex._kernel_done]
    batches = [_ops(layout, [k], np.arange(k * u, (k + 1) * u)[None, :]) for k in range(3)]
    torch.cuda._sleep(2_000_000_000)  # about a second of a busy stream
    for stores in batches:
        ex.execute(stores)
    for stores in batches:
        ref.execute(stores)
    torch.cuda.synchronize()
    return _same(t, twin)


def test_host_read_waits_for_the_kernel_that_read_its_staging_buffer() -> None:
    """The host waits, before rewriting a staging buffer the kernel reads from host memory,
    for the kernel that read it; with the wait planted out, the third batch's integers
    overwrite the first's before its kernel reads them, and the bytes differ."""
    assert _host_read_race(planted=False)
    assert not _host_read_race(planted=True)


def test_a_launch_hook_set_sends_launches_through_the_launcher() -> None:
    """With no launch hook the executor calls the compiled kernel's ``run`` itself; with
    ``triton.knobs.runtime.launch_enter_hook`` set (a profiler's) every launch goes through
    Triton's launcher, which calls the hook: the same bytes either way."""
    knobs = pytest.importorskip("triton").knobs
    layout = load_geometry("Qwen3-Next").layout(16)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 4, 12 * u, "cuda")
    _scramble(t)
    twin = _twin(t)
    raw = TritonCopyExecutor(t, 8)
    hooked = TritonCopyExecutor(twin, 8)
    rng = np.random.default_rng(9)
    seen: list[Any] = []
    for step in range(6):
        stores = _mixed_step(layout, rng, step, 12 * u)
        raw.execute(stores)
        knobs.runtime.launch_enter_hook = seen.append
        try:
            hooked.execute(stores)
        finally:
            knobs.runtime.launch_enter_hook = None
        for x in (*t.slot_tensors, *twin.slot_tensors):
            x.view(torch.uint8).add_(1)
    torch.cuda.synchronize()
    assert len(seen) >= 5  # the first launch of each grid compiles through the JIT
    assert _same(t, twin)
