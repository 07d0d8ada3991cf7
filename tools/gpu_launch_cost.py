"""Host time per call of the Triton executor's launch and validation, on a CUDA device.

For one Qwen3-Next image of one run (16-token pages): Triton's launcher for the compiled
kernel, the compiled kernel's ``run`` called directly, the executor's ``_launch`` (its
launch-hook test, then ``run``), a whole ``execute``, and the one-op and general
validation paths. Each call is timed alone (``perf_counter_ns`` around it, then a
``torch.cuda.synchronize()`` outside the timing, so the launch queue never fills); the
median of 2,000 calls, three times. Run on the device with the checkout on PYTHONPATH
(tools/gpu_device_run.sh sets it up):

    python3 tools/gpu_launch_cost.py
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pagedstate.gpu import validation as V
from pagedstate.gpu.bench import _tensors
from pagedstate.gpu.geometry import load_geometry
from pagedstate.gpu.triton_copy import TritonCopyExecutor
from pagedstate.spec.types import CheckpointStoreOp


def host_us(fn: Callable[[], Any], n: int = 2000) -> float:
    """Median host microseconds of ``fn()``, synchronizing the device after each call."""
    xs = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        xs.append(time.perf_counter_ns() - t0)
        torch.cuda.synchronize()
    return float(np.median(xs)) / 1000


def main() -> None:
    layout = load_geometry("Qwen3-Next").layout(16)
    u = layout.units_per_checkpoint
    t, _, _ = _tensors(layout, 2, 4 * u)
    ex = TritonCopyExecutor(t, 8)
    op = CheckpointStoreOp._of_runs(0, ((u, u),), layout.image_bytes, layout.layout_id)
    for _ in range(20):
        ex.execute([op])  # compiles; fills the launcher cache
    torch.cuda.synchronize()
    gc.collect()
    gc.freeze()
    programs, (compiled, runner) = next(iter(ex._runners.items()))
    args = (ex._base, ex._stage[0], ex._span_tab, ex._scrub_tab, *ex._constants)
    raw = torch._C._cuda_getCurrentRawStream(ex._dev_index)
    key = V._layout_key(layout)

    def run() -> None:
        compiled.run(
            programs, 1, 1, raw, compiled.function, compiled.packed_metadata,
            None, None, None, *args,
        )  # fmt: skip

    for rep in range(3):
        a = host_us(lambda: runner(*args))
        b = host_us(run)
        c = host_us(lambda: ex._launch(ex._stage[0], programs, raw))
        d = host_us(lambda: ex.execute([op]))
        v1 = host_us(lambda: V._one_op_batch(key, [op], [], 2, 4 * u))
        v2 = host_us(lambda: V._fast_batch(key, [op], [], [], 2, 4 * u))
        print(
            f"rep {rep}: runner {a:.2f} us, compiled.run {b:.2f} us, _launch(raw) {c:.2f} us,"
            f" execute {d:.2f} us, one-op validate {v1:.2f} us, general validate {v2:.2f} us"
        )


if __name__ == "__main__":
    main()
