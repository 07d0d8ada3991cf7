"""The Triton executor's descriptor rows (built from per-span affine tables) are exactly
:func:`pagedstate.gpu.plan.write_descriptor`'s over the tensors' base tables, for stores,
restores (columns swapped) and scrubs. Host side only: no kernel runs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from pagedstate.gpu.geometry import load_geometry  # noqa: E402
from pagedstate.gpu.plan import write_descriptor  # noqa: E402
from pagedstate.gpu.tensors import StateTensors  # noqa: E402
from pagedstate.gpu.triton_copy import TritonCopyExecutor  # noqa: E402
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp  # noqa: E402


@pytest.mark.parametrize("model", ["Qwen3-Next", "Kimi-Linear", "MiniMax"])
def test_rows_equal_write_descriptor(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # CPU tensors: the executor is only built (no kernel runs), which it allows under the
    # interpreter's variable, also on a machine with a GPU.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    layout = load_geometry(model).sliced(2, 2, 16).layout(16, spec_tokens=1)
    u = layout.units_per_checkpoint
    t = StateTensors(layout, 6, 8 * u)
    ex = TritonCopyExecutor(t, 6, max_scrub_units=5)
    rng = np.random.default_rng(0)
    perm = rng.permutation(8 * u)
    su, ru, scrub = perm[: 2 * u].reshape(2, u), perm[2 * u : 5 * u].reshape(3, u), perm[-5:]
    img, lid = layout.image_bytes, layout.layout_id
    stores = [CheckpointStoreOp(s, tuple(map(int, su[i])), img, lid) for i, s in enumerate([4, 1])]
    restores = [
        CheckpointRestoreOp(s, tuple(map(int, ru[i])), img, lid) for i, s in enumerate([0, 2, 5])
    ]
    batch = ex.check(stores, restores, [int(x) for x in scrub])
    out = np.full((ex._rows_cap, 3), -7, dtype=np.int64)
    n = ex._write_rows(out, batch)
    spans = ex.plan.num_spans
    r = len(layout.region_bytes)
    assert n == 5 * spans + 5 * r
    want_s = np.empty((2 * spans, 3), np.int64)
    write_descriptor(want_s, ex.plan, t.slot_bases([4, 1]), t.unit_bases(su))
    want_r = np.empty((3 * spans, 3), np.int64)
    write_descriptor(want_r, ex.plan, t.slot_bases([0, 2, 5]), t.unit_bases(ru), forward=False)
    assert np.array_equal(out[: 2 * spans], want_s)
    assert np.array_equal(out[2 * spans : 5 * spans], want_r)
    scrub_rows = out[5 * spans : n]
    assert (scrub_rows[:, 0] == 0).all()
    want_addr = t.unit_bases(np.sort(scrub).reshape(-1, 1)).reshape(-1)
    assert np.array_equal(scrub_rows[:, 1], want_addr)
    assert np.array_equal(scrub_rows[:, 2], np.tile(layout.region_bytes, 5))
    assert (out[n:] == -7).all()  # nothing written past the rows
