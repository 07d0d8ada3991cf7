"""``make bench-gpu``: batched checkpoint stores and restores on a CUDA device, measured.

For each geometry (default: Qwen3-Next-80B-A3B, Nemotron-H-8B, Kimi-Linear-48B, 16-token
KV pages) and batch size (1, 8, 64, 256) it times, in one run:

* the Triton executor (one launch per batch) for a batch of stores (slots -> units) and a
  batch of restores (units -> slots), every kernel variant asked for;
* the torch executor (per-span gathers and scatters: the straightforward baseline);
* a device-to-device copy of the same number of bytes (``Tensor.copy_`` between two
  buffers), the ceiling.

Two figures per batch. **Device time** (the target): CUDA events around the launch only
(the executor's own events, after its descriptor upload, which runs on a side stream), with
a sleep kernel holding the stream while the host enqueues the launch, so host launch
overhead is not counted; the median of ``--reps`` batches after ``--warmup``. **End to
end**: ``--reps`` batches issued back to back between two events around whole ``execute``
calls, the median of 5 such runs, so host work (validation, descriptor build, launch)
counts whenever it is slower than the device. The D2D copy is timed both ways too.
Throughput counts bytes read plus bytes written (``2 * image_bytes * batch``); the ratio is
the D2D time over the executor's time (1.0 = as fast as a plain copy). Slot and unit
tensors are views into one buffer each, so the D2D copy moves bytes of the same buffers.

Every timed batch is also checked once: the units (store) or slots (restore) hold exactly
the source bytes afterwards.

Usage: ``python -m pagedstate.gpu.bench [--models ...] [--batches 1,8,64,256]
[--variants 512:4:4:for,...] [--out docs/gpu-benchmarks.md] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp

from .executor import TorchCopyExecutor
from .geometry import CheckpointLayout, load_geometry
from .tensors import StateTensors, _torch, torch_dtype

__all__ = ["main", "run"]

DEFAULT_MODELS = (
    "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "nvidia/Nemotron-H-8B-Base-8K",
    "moonshotai/Kimi-Linear-48B-A3B-Instruct",
)
DEFAULT_BATCHES = (1, 8, 64, 256)
#: (block, rows_per_program, num_warps, loop) of the Triton kernel; loop: "while" or "for".
DEFAULT_VARIANTS = ((512, 4, 4, "for"),)
TARGET_RATIO = 0.90
_MARK_BEGIN = "<!-- bench-gpu:begin -->"
_MARK_END = "<!-- bench-gpu:end -->"


def _carve(buf: Any, specs: Sequence[tuple[tuple[int, ...], Any]]) -> list[Any]:
    """Contiguous tensors of the given shapes and dtypes laid end to end in ``buf`` (uint8),
    each starting at a 256-byte boundary."""
    out = []
    pos = 0
    for shape, dt in specs:
        n = int(np.prod(shape)) * _torch().empty((), dtype=dt).element_size()
        out.append(buf[pos : pos + n].view(dt).view(shape))
        pos += -(-n // 256) * 256
    return out


def _bytes_needed(specs: Sequence[tuple[tuple[int, ...], Any]]) -> int:
    torch = _torch()
    return sum(
        -(-int(np.prod(s)) * torch.empty((), dtype=d).element_size() // 256) * 256 for s, d in specs
    )


def _tensors(layout: CheckpointLayout, batch: int) -> tuple[StateTensors, Any, Any]:
    torch = _torch()
    u = layout.units_per_checkpoint
    slot_specs = [((batch, *t.shape), torch_dtype(t.dtype)) for t in layout.slot_tensors]
    kv_specs = [((batch * u, b // 2), torch.bfloat16) for b in layout.region_bytes]
    slot_buf = torch.empty(_bytes_needed(slot_specs), dtype=torch.uint8, device="cuda")
    kv_buf = torch.empty(_bytes_needed(kv_specs), dtype=torch.uint8, device="cuda")
    slot_buf.random_(0, 256)
    kv_buf.random_(0, 256)
    t = StateTensors(
        layout,
        batch,
        batch * u,
        "cuda",
        slot_tensors=_carve(slot_buf, slot_specs),
        kv_tensors=_carve(kv_buf, kv_specs),
    )
    return t, slot_buf, kv_buf


def _time(fn: Any, reps: int, warmup: int, rounds: int = 5) -> float:
    """Seconds per call: ``reps`` calls back to back between two CUDA events, the median of
    ``rounds`` such runs. Back to back, the host prepares a batch while the device copies
    the one before, as an engine's loop does, so a figure is the slower of the two."""
    torch = _torch()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000.0 / reps)
    return float(np.median(times))


#: GPU cycles (about 0.1 ms on an H200) a sleep kernel holds the stream before a timed
#: launch, so the host's launch overhead is not counted as device time.
HOLD_CYCLES = 200_000


def _device_time(ex: Any, fn: Any, reps: int, warmup: int) -> float:
    """Seconds of device work per batch: the executor's own events around its launch
    (:attr:`~pagedstate.gpu.executor.CopyExecutorBase.record_events`), with the stream
    held busy while the host enqueues it (``hold_cycles``), the median of ``reps``."""
    torch = _torch()
    for _ in range(warmup):
        fn()
    ex.record_events, ex.hold_cycles = True, HOLD_CYCLES
    pairs = []
    for _ in range(reps):
        fn()
        pairs.append(ex.last_events)
    torch.cuda.synchronize()
    ex.record_events, ex.hold_cycles = False, 0
    return float(np.median([a.elapsed_time(b) / 1000.0 for a, b in pairs]))


def _d2d_time(dst: Any, src: Any, n: int, reps: int, warmup: int) -> float:
    """Seconds of one device-to-device copy of ``n`` bytes, timed like
    :func:`_device_time` (stream held while the copy is enqueued), the median."""
    torch = _torch()
    for _ in range(warmup):
        dst[:n].copy_(src[:n])
    times = []
    for _ in range(reps):
        torch.cuda._sleep(HOLD_CYCLES)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst[:n].copy_(src[:n])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000.0)
    return float(np.median(times))


def _ops(layout: CheckpointLayout, batch: int, seed: int) -> tuple[list[Any], list[Any]]:
    """Stores slot i -> a shuffled set of units, and the restores reading them back."""
    u = layout.units_per_checkpoint
    perm = np.random.default_rng(seed).permutation(batch * u).reshape(batch, u)
    stores = [
        CheckpointStoreOp(i, tuple(int(x) for x in perm[i]), layout.image_bytes, layout.layout_id)
        for i in range(batch)
    ]
    restores = [
        CheckpointRestoreOp(i, s.unit_ids, layout.image_bytes, layout.layout_id)
        for i, s in enumerate(stores)
    ]
    return stores, restores


def run(
    models: Sequence[str] = DEFAULT_MODELS,
    batches: Sequence[int] = DEFAULT_BATCHES,
    variants: Sequence[tuple[int, int, int, str]] = DEFAULT_VARIANTS,
    block_tokens: int = 16,
    reps: int = 10,
    warmup: int = 3,
    torch_baseline: bool = True,
) -> dict[str, Any]:
    """Measure and return the raw results (see the module doc)."""
    torch = _torch()
    from .triton_copy import TritonCopyExecutor

    if not torch.cuda.is_available():
        raise RuntimeError("bench-gpu needs a CUDA device")
    props = torch.cuda.get_device_properties(0)
    results: dict[str, Any] = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "block_tokens": block_tokens,
        "reps": reps,
        "warmup": warmup,
        "rows": [],
    }
    for model in models:
        layout = load_geometry(model).layout(block_tokens)
        for batch in batches:
            t, slot_buf, kv_buf = _tensors(layout, batch)
            stores, restores = _ops(layout, batch, batch)
            moved = 2 * layout.image_bytes * batch
            n = layout.image_bytes * batch
            d2d = _d2d_time(kv_buf, slot_buf, n, reps, warmup)
            d2d_e2e = _time(lambda n=n, a=kv_buf, b=slot_buf: a[:n].copy_(b[:n]), reps, warmup)
            row: dict[str, Any] = {
                "model": layout.geometry.model_id,
                "batch": batch,
                "image_bytes": layout.image_bytes,
                "units_per_checkpoint": layout.units_per_checkpoint,
                "spans_per_image": 0,
                "bytes_moved": moved,
                "d2d_s": d2d,
                "d2d_e2e_s": d2d_e2e,
                "executors": [],
            }
            execs: list[tuple[str, Any]] = []
            for block, rows, warps, loop in variants:
                ex = TritonCopyExecutor(
                    t,
                    batch,
                    block=block,
                    rows_per_program=rows,
                    num_warps=warps,
                    for_loop=loop == "for",
                )
                execs.append((f"triton block={block} rows={rows} warps={warps} {loop}", ex))
            if torch_baseline:
                execs.append(("torch", TorchCopyExecutor(t, batch)))
            row["spans_per_image"] = execs[0][1].plan.num_spans
            for name, ex in execs:
                # Correctness once: store, compare, scramble slots, restore, compare.
                images = [t.read_image(i).clone() for i in range(min(batch, 4))]
                ex.execute(stores)
                for i, img in enumerate(images):
                    got = t.read_units(stores[i].unit_ids)[: layout.image_bytes]
                    if not torch.equal(got, img):
                        raise AssertionError(f"{name}: store {i} of {model} x{batch} is wrong")
                slot_buf.random_(0, 256)
                ex.execute((), restores)
                for i, img in enumerate(images):
                    if not torch.equal(t.read_image(i), img):
                        raise AssertionError(f"{name}: restore {i} of {model} x{batch} is wrong")

                def store(ex: Any = ex, ops: list[Any] = stores) -> None:
                    ex.execute(ops)

                def restore(ex: Any = ex, ops: list[Any] = restores) -> None:
                    ex.execute((), ops)

                st = _device_time(ex, store, reps, warmup)
                rs = _device_time(ex, restore, reps, warmup)
                st_e2e = _time(store, reps, warmup)
                rs_e2e = _time(restore, reps, warmup)
                row["executors"].append(
                    {
                        "name": name,
                        "store_s": st,
                        "restore_s": rs,
                        "store_e2e_s": st_e2e,
                        "restore_e2e_s": rs_e2e,
                        "store_tbps": moved / st / 1e12,
                        "restore_tbps": moved / rs / 1e12,
                        "store_ratio": d2d / st,
                        "restore_ratio": d2d / rs,
                        "store_e2e_ratio": d2d_e2e / st_e2e,
                        "restore_e2e_ratio": d2d_e2e / rs_e2e,
                    }
                )
                print(
                    f"{layout.geometry.model_id} x{batch} {name}: store {st * 1e3:.3f} ms"
                    f" ({d2d / st:.2f}x D2D; end to end {d2d_e2e / st_e2e:.2f}x), restore"
                    f" {rs * 1e3:.3f} ms ({d2d / rs:.2f}x; end to end {d2d_e2e / rs_e2e:.2f}x);"
                    f" D2D {d2d * 1e3:.3f} ms",
                    file=sys.stderr,
                    flush=True,
                )
            results["rows"].append(row)
            del t, slot_buf, kv_buf, execs
            torch.cuda.empty_cache()
    return results


def render(results: dict[str, Any]) -> str:
    """The Markdown section for ``docs/gpu-benchmarks.md``."""
    lines = [
        _MARK_BEGIN,
        "## Batched checkpoint copies (`make bench-gpu`)",
        "",
        f"Measured {results['date']} on {results['device']} ({results['sms']} SMs), torch"
        f" {results['torch']}, Triton {results['triton']}, Python {results['python']}, in one"
        f" run, {results['block_tokens']}-token KV pages. Device figures: the median of"
        f" {results['reps']} timed batches after {results['warmup']} untimed ones (see the note"
        " under the table). TB/s counts bytes read plus written; ratio = the device-to-device"
        " copy of the same bytes / the executor's time (above 1.0: faster than that copy).",
        "",
        "| model | batch | image MiB | units | spans/image | executor | store ms | store TB/s"
        " | store / D2D | restore ms | restore TB/s | restore / D2D | D2D ms | D2D TB/s |"
        " store / D2D, end to end | restore / D2D, end to end |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    worst: dict[str, float] = {}
    worst_e2e: dict[str, float] = {}
    for row in results["rows"]:
        d2d = row["d2d_s"]
        for e in row["executors"]:
            lines.append(
                f"| {row['model']} | {row['batch']} | {row['image_bytes'] / 2**20:.1f} |"
                f" {row['units_per_checkpoint']} | {row['spans_per_image']} | {e['name']} |"
                f" {e['store_s'] * 1e3:.3f} | {e['store_tbps']:.2f} | {e['store_ratio']:.2f} |"
                f" {e['restore_s'] * 1e3:.3f} | {e['restore_tbps']:.2f} |"
                f" {e['restore_ratio']:.2f} | {d2d * 1e3:.3f} |"
                f" {row['bytes_moved'] / d2d / 1e12:.2f} | {e['store_e2e_ratio']:.2f} |"
                f" {e['restore_e2e_ratio']:.2f} |"
            )
            if row["batch"] >= 8:
                key = e["name"]
                worst[key] = min(worst.get(key, 9.9), e["store_ratio"], e["restore_ratio"])
                worst_e2e[key] = min(
                    worst_e2e.get(key, 9.9), e["store_e2e_ratio"], e["restore_e2e_ratio"]
                )
    lines += [
        "",
        "Store, restore and D2D ms are device time: CUDA events around the launch (the"
        " executor's own events, after its descriptor upload, which runs on a side stream;"
        " for the torch executor, around all its launches), with a sleep kernel holding the"
        " stream while the host enqueues the launch, so host launch overhead is not counted;"
        " the median of the timed batches. The end-to-end ratios time batches issued back to"
        " back between two events around the whole `execute` calls (and plain `copy_` calls"
        " for D2D), host work (validation, descriptor build, launch) included; where they"
        " fall below the device ratio the host, not the copy, limits the rate.",
    ]
    lines += ["", f"### Target: >= {TARGET_RATIO:.2f}x D2D for batches >= 8", ""]
    for name, w in worst.items():
        verdict = "met" if w >= TARGET_RATIO else "not met"
        lines.append(
            f"- {name}: worst device-time ratio over geometries and batches >= 8: {w:.2f}"
            f" (**{verdict}**); end to end: {worst_e2e[name]:.2f}"
        )
    lines += ["", _MARK_END]
    return "\n".join(lines)


def _write(out: Path, section: str) -> None:
    old = out.read_text(encoding="utf-8") if out.exists() else "# GPU benchmarks\n"
    if _MARK_BEGIN in old and _MARK_END in old:
        head, rest = old.split(_MARK_BEGIN, 1)
        _, tail = rest.split(_MARK_END, 1)
        text = head + section + tail
    else:
        text = old.rstrip("\n") + "\n\n" + section + "\n"
    out.write_text(text, encoding="utf-8")


def _variant(text: str) -> tuple[int, int, int, str]:
    a, b, c, d = text.split(":")
    if d not in ("while", "for"):
        raise argparse.ArgumentTypeError(f"loop must be while or for, got {d!r}")
    return int(a), int(b), int(c), d


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the section, write ``--out`` / ``--json`` when given."""
    ap = argparse.ArgumentParser(prog="python -m pagedstate.gpu.bench")
    ap.add_argument("--models", nargs="*", default=list(DEFAULT_MODELS))
    ap.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)))
    ap.add_argument(
        "--variants",
        default=",".join(":".join(map(str, v)) for v in DEFAULT_VARIANTS),
        help="Triton kernel variants block:rows_per_program:num_warps:loop (loop: while or for),"
        " comma-separated",
    )
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch executor baseline")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    results = run(
        a.models,
        [int(x) for x in a.batches.split(",")],
        [_variant(v) for v in a.variants.split(",")],
        a.block_tokens,
        a.reps,
        a.warmup,
        not a.no_torch,
    )
    section = render(results)
    print(section)
    if a.json is not None:
        a.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    if a.out is not None:
        _write(a.out, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
