"""Copy plans, descriptors, range builders and model geometries (SPEC E.1-E.4,
scenarios F57-F60 and F63). NumPy only, except the F59 device round trip (torch).

The plan is checked by simulating its descriptor on NumPy byte buffers: a descriptor row
``(src_addr, dst_addr, length)`` copies ``buf[src:src+length]`` to ``buf[dst:dst+length]``,
so every claim about "which bytes a copy writes" is checked on bytes, not on the arrays'
shapes.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedstate.gpu import (
    CopyPlan,
    ModelGeometry,
    geometry_ids,
    load_geometry,
    plan_segmented_copy,
    write_descriptor,
)
from pagedstate.gpu.plan import (
    DEFAULT_TILE_BYTES,
    Field,
    assert_ratios_divide_alignment,
    checkpoint_ranges_for,
    merge_abutting,
    tile_rows,
)
from pagedstate.spec.errors import (
    BadCopyPlanError,
    InvalidArgumentError,
    UnknownGeometryError,
    UnsupportedGeometryError,
)
from pagedstate.spec.types import PagedStateCheckpointSpec

SHARED_GEOMETRIES = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "model_geometries.json"
)
NO_ATTENTION = "state-spaces/mamba2-2.7b"


def stream_of(buf: np.ndarray, bases: np.ndarray, sizes: list[int] | tuple[int, ...]) -> np.ndarray:
    """The bytes of segments ``sizes`` at ``bases``, concatenated in segment order."""
    parts = [buf[b : b + n] for b, n in zip(bases.tolist(), sizes, strict=True)]
    return np.concatenate(parts) if parts else np.empty(0, np.uint8)


def run_descriptor(buf: np.ndarray, rows: np.ndarray) -> None:
    """Execute descriptor rows on a flat uint8 buffer whose addresses are indices."""
    for src, dst, ln in rows.tolist():
        buf[dst : dst + ln] = buf[src : src + ln]


def layout_bases(
    sizes: tuple[int, ...] | list[int], start: int, gap: int, reverse: bool = False
) -> np.ndarray:
    """Addresses of segments of ``sizes`` laid out from ``start`` with ``gap`` bytes of
    padding after each (so a span that runs past its segment lands in the padding);
    ``reverse`` lays them out last segment first."""
    order = list(sizes)[::-1] if reverse else list(sizes)
    ends = np.cumsum(np.asarray(order, dtype=np.int64) + gap)
    addr = start + np.concatenate(([0], ends[:-1])).astype(np.int64)[: len(order)]
    return addr[::-1].copy() if reverse else addr


# -- F57: wire order ---------------------------------------------------------------------


def test_f57_wire_order_exact_spans() -> None:
    plan = plan_segmented_copy([5, 7], [3, 4, 5], 12)
    assert plan.rows() == [(0, 0, 0, 0, 3), (0, 3, 1, 0, 2), (1, 0, 1, 2, 2), (1, 2, 2, 0, 5)]
    assert plan.total == 12 and plan.num_spans == 4
    assert plan.src_sizes == (5, 7) and plan.dst_sizes == (3, 4, 5)
    for a in (plan.src_seg, plan.src_off, plan.dst_seg, plan.dst_off, plan.length):
        assert a.dtype == np.int64


def test_f57_reversed_descriptor_is_the_exact_column_mirror() -> None:
    plan = plan_segmented_copy([5, 7], [3, 4, 5], 12)
    src = np.array([[1000, 2000], [5000, 6000]], dtype=np.int64)
    dst = np.array([[100, 200, 300], [400, 500, 600]], dtype=np.int64)
    fwd = write_descriptor(np.full((8, 3), -1, np.int64), plan, src, dst)
    rev = write_descriptor(np.full((8, 3), -1, np.int64), plan, src, dst, forward=False)
    assert np.array_equal(rev[:, [1, 0, 2]], fwd)
    # The forward rows themselves: copy c's span s is row c * spans + s.
    assert fwd.tolist() == [
        [1000, 100, 3],
        [1003, 200, 2],
        [2000, 202, 2],
        [2002, 300, 5],
        [5000, 400, 3],
        [5003, 500, 2],
        [6000, 502, 2],
        [6002, 600, 5],
    ]


def test_f57_restore_reads_back_what_the_store_wrote() -> None:
    """Byte k of the source stream lands on byte k of the destination stream, and the
    mirrored descriptor brings exactly those bytes back (SPEC E.3, E.4)."""
    plan = plan_segmented_copy([5, 7], [3, 4, 5], 12)
    buf = np.zeros(200, np.uint8)
    src = layout_bases(plan.src_sizes, 0, 3)
    dst = layout_bases(plan.dst_sizes, 100, 2)
    stream = np.arange(1, 13, dtype=np.uint8)
    buf[src[0] : src[0] + 5] = stream[:5]
    buf[src[1] : src[1] + 7] = stream[5:]
    run_descriptor(buf, write_descriptor(np.empty((4, 3), np.int64), plan, src[None], dst[None]))
    got = np.concatenate([buf[b : b + n] for b, n in zip(dst, plan.dst_sizes, strict=True)])
    assert np.array_equal(got, stream)
    # Restore into a second slot elsewhere.
    slot2 = layout_bases(plan.src_sizes, 50, 3)
    run_descriptor(
        buf,
        write_descriptor(np.empty((4, 3), np.int64), plan, slot2[None], dst[None], forward=False),
    )
    back = np.concatenate([buf[b : b + n] for b, n in zip(slot2, plan.src_sizes, strict=True)])
    assert np.array_equal(back, stream)


# -- F58: short bases --------------------------------------------------------------------


@pytest.mark.parametrize(
    "dst_bases",
    [
        np.array([[100, 200, 300]], dtype=np.int64),  # one row for 3 copies
        np.array([100, 200, 300], dtype=np.int64),  # 1-D
    ],
    ids=["one-row", "1-D"],
)
def test_f58_short_dst_bases_are_refused_and_nothing_is_written(dst_bases: np.ndarray) -> None:
    plan = plan_segmented_copy([5, 7], [3, 4, 5], 12)
    src = np.array([[0, 10], [20, 30], [40, 50]], dtype=np.int64)
    out = np.full((12, 3), -7, np.int64)
    with pytest.raises(BadCopyPlanError, match="one row of bases per copy") as info:
        write_descriptor(out, plan, src, dst_bases)
    assert isinstance(info.value, ValueError)
    assert (out == -7).all()


def test_f58_short_src_bases_and_bad_out_are_refused() -> None:
    plan = plan_segmented_copy([5, 7], [3, 4, 5], 12)
    dst = np.zeros((3, 3), np.int64)
    good_src = np.zeros((3, 2), np.int64)
    out = np.full((12, 3), -7, np.int64)
    with pytest.raises(BadCopyPlanError, match="one row of bases per copy"):
        write_descriptor(out, plan, np.zeros(2, np.int64), dst)
    with pytest.raises(BadCopyPlanError, match="one row of bases per copy"):
        write_descriptor(out, plan, np.zeros((2, 2), np.int64), dst)  # 2 copies vs 3
    with pytest.raises(BadCopyPlanError, match="segments"):
        write_descriptor(out, plan, np.zeros((3, 3), np.int64), dst)  # too many src bases
    with pytest.raises(BadCopyPlanError, match="segments"):
        write_descriptor(out, plan, good_src, np.zeros((3, 2), np.int64))
    with pytest.raises(BadCopyPlanError, match="integer"):
        write_descriptor(out, plan, good_src, np.zeros((3, 3), np.float64))
    assert (out == -7).all()
    for bad in (
        np.zeros((11, 3), np.int64),
        np.zeros((12, 2), np.int64),
        np.zeros((12, 3), np.int32),
        [[0, 0, 0]] * 12,
    ):
        with pytest.raises(BadCopyPlanError, match="out must be"):
            write_descriptor(bad, plan, good_src, dst)  # type: ignore[arg-type]


# -- F59: partial tail untouched ---------------------------------------------------------


def test_f59_plan_covers_exactly_the_first_13_bytes() -> None:
    plan = plan_segmented_copy([13], [5, 5, 5], 13)
    assert plan.rows() == [(0, 0, 0, 0, 5), (0, 5, 1, 0, 5), (0, 10, 2, 0, 3)]
    assert int(plan.length.sum()) == 13
    written = [
        (int(s), o)
        for s, off, ln in zip(plan.dst_seg, plan.dst_off, plan.length, strict=True)
        for o in range(int(off), int(off + ln))
    ]
    assert written == [(u, o) for u in range(3) for o in range(5)][:13]
    # On bytes: the descriptor writes exactly 13 bytes, the last unit's tail keeps its
    # sentinel, and so does everything around the units.
    buf = np.full(64, 0xEE, np.uint8)
    src = np.array([[0]], dtype=np.int64)
    buf[0:13] = np.arange(1, 14, dtype=np.uint8)
    dst = np.array([[40, 20, 30]], dtype=np.int64)  # out of order on purpose
    before = buf.copy()
    run_descriptor(buf, write_descriptor(np.empty((3, 3), np.int64), plan, src, dst))
    changed = np.flatnonzero(buf != before).tolist()
    assert changed == sorted([*range(40, 45), *range(20, 25), *range(30, 33)])
    assert np.array_equal(np.concatenate((buf[40:45], buf[20:25], buf[30:33])), buf[0:13])
    assert buf[33:35].tolist() == [0xEE, 0xEE]  # the tail of the last unit


@pytest.mark.parametrize(
    ("dtype", "elems", "region"),
    [("uint8", 13, 6), ("float16", 13, 10)],
    ids=["13B-into-6B-units", "26B-into-10B-units"],
)
def test_f59_device_round_trip_leaves_the_tail_at_its_sentinel(
    dtype: str, elems: int, region: int
) -> None:
    """The executor version of F59. KV pages are bf16 rows, so a unit has an even number of
    bytes: 13 bytes go into three 6-byte units (tail 5 B), or 26 bytes into three 10-byte
    units (tail 4 B). Torch executor here; tests/test_gpu_executor.py runs both."""
    torch = pytest.importorskip("torch")
    from gpu_helpers import tiny_layout

    from pagedstate.gpu import StateTensors, TorchCopyExecutor
    from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp

    layout = tiny_layout([(dtype, (elems,), None)], (region,))
    image = layout.image_bytes
    assert layout.units_per_checkpoint == 3 and image < 3 * region
    t = StateTensors(layout, 2, 5)
    for x in t.all_tensors():
        x.view(torch.uint8).fill_(0xEE)
    data = torch.arange(1, image + 1, dtype=torch.uint8)
    t.write_image(0, data)
    ex = TorchCopyExecutor(t)
    units = (4, 1, 2)
    ex.execute([CheckpointStoreOp(0, units, image, layout.layout_id)])
    stream = t.read_units(units)
    assert torch.equal(stream[:image], data)
    assert (stream[image:] == 0xEE).all() and len(stream) - image == 3 * region - image
    for u in (0, 3):
        assert (t.read_units([u]) == 0xEE).all()
    ex.execute([], [CheckpointRestoreOp(1, units, image, layout.layout_id)])
    assert torch.equal(t.read_image(1), data)


# -- F60: tiling coverage ----------------------------------------------------------------


def test_f60_a_10000_byte_span_gives_three_tiles() -> None:
    plan = plan_segmented_copy([10_000], [10_000], 10_000)
    assert plan.num_spans == 1
    assert plan.tile_start.tolist() == [0, 4096, 8192]
    assert plan.span_of_tile.tolist() == [0, 0, 0]
    assert plan.tile_bytes == DEFAULT_TILE_BYTES == 4096


def test_f60_zero_byte_plan_has_no_spans_and_no_tiles() -> None:
    for src, dst in (([5], [3, 4]), ([], []), ([1], [])):
        plan = plan_segmented_copy(src, dst, 0)
        assert plan.num_spans == 0 and plan.num_tiles == 0 and plan.rows() == []
        out = np.empty((0, 3), np.int64)
        write_descriptor(
            out, plan, np.zeros((2, len(src)), np.int64), np.zeros((2, len(dst)), np.int64)
        )


def test_f60_tile_rows() -> None:
    row, start = tile_rows([10_000, 0, 4096, 1], 4096)
    assert row.tolist() == [0, 0, 0, 2, 3]
    assert start.tolist() == [0, 4096, 8192, 0, 0]
    row, start = tile_rows([], 4096)
    assert len(row) == len(start) == 0
    with pytest.raises(BadCopyPlanError):
        tile_rows([5], 0)
    with pytest.raises(BadCopyPlanError):
        tile_rows([5, -1], 16)


# -- F63: range builders -----------------------------------------------------------------


def test_f63_checkpoint_ranges_for_drops_zero_byte_runs_and_keeps_padding() -> None:
    fields = [
        Field(0, 0, True),  # a zero-byte run, ended by the dropped field
        Field(0, 16, False),
        Field(16, 8, True),
        Field(32, 8, True),  # padding 24..32 included in the run
        Field(40, 4, False),
        Field(48, 0, True),  # zero-byte run at the end
    ]
    assert checkpoint_ranges_for(fields) == [(16, 24)]
    assert checkpoint_ranges_for([Field(0, 8), Field(8, 0, False), Field(8, 8)]) == [(0, 8), (8, 8)]
    assert checkpoint_ranges_for([]) == []
    assert checkpoint_ranges_for([Field(0, 4, False)]) == []
    with pytest.raises(BadCopyPlanError):
        checkpoint_ranges_for([Field(0, 8), Field(4, 8)])  # overlapping
    with pytest.raises(BadCopyPlanError):
        checkpoint_ranges_for([Field(8, 8), Field(0, 8)])  # out of order
    with pytest.raises(BadCopyPlanError):
        checkpoint_ranges_for([Field(-1, 8)])
    with pytest.raises(BadCopyPlanError):
        checkpoint_ranges_for([Field(0, -8)])


def test_f63_merge_abutting() -> None:
    assert merge_abutting([(0, 5), (5, 5), (20, 1), (21, 3), (30, 2)]) == [
        (0, 10),
        (20, 4),
        (30, 2),
    ]
    assert merge_abutting([]) == []
    for bad in (
        [(10, 5), (0, 5)],
        [(0, 10), (5, 10)],
        [(0, 5), (4, 1)],
        [(0, 0)],
        [(0, 5), (9, -1)],
    ):
        with pytest.raises(BadCopyPlanError) as info:
            merge_abutting(bad)
        assert isinstance(info.value, ValueError)


def test_f63_compress_ratios_must_divide_a_positive_alignment() -> None:
    assert_ratios_divide_alignment(16, 2, [1, 4, 8, 32])
    assert_ratios_divide_alignment(256, 1, [])
    for block, dcp, ratios in (
        (16, 1, [3]),
        (16, 2, [4, 64]),
        (0, 1, [1]),
        (16, 0, []),
        (-4, 1, []),
    ):
        with pytest.raises(BadCopyPlanError) as info:
            assert_ratios_divide_alignment(block, dcp, ratios)
        assert isinstance(info.value, ValueError)
    with pytest.raises(BadCopyPlanError):
        assert_ratios_divide_alignment(16, 1, [0])
    with pytest.raises(BadCopyPlanError):
        assert_ratios_divide_alignment(16, 1, [-4])


# -- plan edge cases ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst", "total", "match"),
    [
        ([5], [5], -1, "total"),
        ([5, 7], [3, 4, 5], 13, "source stream holds 12"),
        ([5, 7, 9], [3, 4, 5], 13, "destination stream holds 12"),
        ([5, 0, 7], [12], 12, "size <= 0"),
        ([12], [6, 0, 6], 12, "size <= 0"),
        ([12, -1], [12], 11, "size <= 0"),
        ([[6, 6]], [12], 12, "one-dimensional"),
        (["a"], [12], 1, "sequence of ints"),
        ([5], [5], 2.0, "total"),
        ([5], [5], True, "total"),
    ],
)
def test_plan_refuses_bad_inputs(src: object, dst: object, total: object, match: str) -> None:
    with pytest.raises(BadCopyPlanError, match=match) as info:
        plan_segmented_copy(src, dst, total)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_plan_refuses_bad_tile_bytes() -> None:
    for tile in (0, -1, 1.5):
        with pytest.raises(BadCopyPlanError, match="tile_bytes"):
            plan_segmented_copy([5], [5], 5, tile)  # type: ignore[arg-type]


def test_plan_stops_at_total_in_longer_streams() -> None:
    plan = plan_segmented_copy([4, 4, 4], [6, 6, 6], 7)
    assert plan.rows() == [(0, 0, 0, 0, 4), (1, 0, 0, 4, 2), (1, 2, 1, 0, 1)]


# -- property: the plan tiles [0, total) exactly ------------------------------------------

sizes = st.lists(st.integers(1, 40), min_size=0, max_size=8)


@st.composite
def segmentations(draw: st.DrawFn) -> tuple[list[int], list[int], int, int]:
    src = draw(sizes)
    dst = draw(sizes)
    total = draw(st.integers(0, min(sum(src), sum(dst))))
    tile = draw(st.sampled_from([1, 3, 7, 16, 4096]))
    return src, dst, total, tile


def _check_stream(seg: np.ndarray, off: np.ndarray, length: np.ndarray, sizes: list[int]) -> None:
    begins = [0, *np.cumsum(sizes).tolist()]
    pos = 0
    for s, o, n in zip(seg.tolist(), off.tolist(), length.tolist(), strict=True):
        assert 0 <= s < len(sizes) and 0 <= o and n > 0
        assert o + n <= sizes[s], "a span crosses a segment boundary"
        assert int(begins[s]) + o == pos, "spans are not contiguous and in order"
        pos += n


@given(segmentations())
def test_plan_tiles_both_streams_exactly(case: tuple[list[int], list[int], int, int]) -> None:
    src, dst, total, tile = case
    plan = plan_segmented_copy(src, dst, total, tile)
    assert isinstance(plan, CopyPlan)
    assert int(plan.length.sum()) == total == plan.total
    _check_stream(plan.src_seg, plan.src_off, plan.length, src)
    _check_stream(plan.dst_seg, plan.dst_off, plan.length, dst)
    # Cut at every boundary of either stream below total, and nowhere else.
    starts = np.concatenate(([0], np.cumsum(plan.length)[:-1])).tolist() if plan.num_spans else []
    bounds = {int(b) for b in np.cumsum(src).tolist() + np.cumsum(dst).tolist() if 0 < b < total}
    assert set(starts) == ({0} | bounds if total else set())
    assert len(starts) == len(set(starts))
    # Tiles: every span's tile starts are range(0, length, tile).
    got: dict[int, list[int]] = {}
    for s, t in zip(plan.span_of_tile.tolist(), plan.tile_start.tolist(), strict=True):
        got.setdefault(s, []).append(t)
    assert got == {s: list(range(0, n, tile)) for s, n in enumerate(plan.length.tolist())}
    assert plan.span_of_tile.tolist() == sorted(plan.span_of_tile.tolist())
    # On bytes: two copies through the descriptor, out of order bases, with padding; every
    # destination byte k is source byte k, and nothing else changes.
    copies = 2
    gap = 3
    src_b = np.stack([layout_bases(src, 1 + 500 * c, gap) for c in range(copies)])
    dst_b = np.stack([layout_bases(dst, 1100 + 500 * c, gap, reverse=True) for c in range(copies)])
    buf = np.full(2200, 0xEE, np.uint8)
    rng = np.random.default_rng(total)
    for c in range(copies):
        for b, n in zip(src_b[c], src, strict=True):
            buf[b : b + n] = rng.integers(0, 200, n)
    before = buf.copy()
    out = np.empty((copies * plan.num_spans, 3), np.int64)
    run_descriptor(buf, write_descriptor(out, plan, src_b, dst_b))
    for c in range(copies):
        src_stream = stream_of(before, src_b[c], src)
        dst_stream = stream_of(buf, dst_b[c], dst)
        assert np.array_equal(dst_stream[:total], src_stream[:total])
    written = np.zeros(len(buf), bool)
    for c in range(copies):
        pos = 0
        for b, n in zip(dst_b[c], dst, strict=True):
            k = max(0, min(n, total - pos))
            written[b : b + k] = True
            pos += n
    assert np.array_equal(buf[~written], before[~written])


# -- geometries --------------------------------------------------------------------------


def _shipped_entries() -> list[dict[str, object]]:
    text = resources.files("pagedstate.gpu").joinpath("data/model_geometries.json").read_text()
    return json.loads(text)  # type: ignore[no-any-return]


def test_all_17_shipped_geometries_load() -> None:
    ids = geometry_ids()
    assert len(ids) == 17 == len(set(ids))
    assert ids == [e["model_id"] for e in _shipped_entries()]
    for gid in ids:
        g = load_geometry(gid)
        assert isinstance(g, ModelGeometry) and g.model_id == gid
        assert g.num_recurrent_layers >= 1 and g.ssm_bytes() > 0 and g.source


def test_shipped_json_is_the_shared_data_set() -> None:
    if not SHARED_GEOMETRIES.exists():
        pytest.skip(f"{SHARED_GEOMETRIES} is not beside this checkout")
    shipped = resources.files("pagedstate.gpu").joinpath("data/model_geometries.json").read_bytes()
    assert shipped == SHARED_GEOMETRIES.read_bytes()


@pytest.mark.parametrize("entry", _shipped_entries(), ids=lambda e: str(e["model_id"]))
def test_layout_bytes_match_the_data_set(entry: dict[str, object]) -> None:
    g = load_geometry(str(entry["model_id"]))
    if not entry["num_attention_layers"]:
        with pytest.raises(UnsupportedGeometryError, match="no attention layer"):
            g.layout(16)
        return
    layout = g.layout(16)
    assert layout.image_bytes == entry["total_state_bytes_per_request"]
    assert layout.slot_bytes == layout.image_bytes  # spec 0: the image is the whole slot
    assert layout.page_unit_bytes == 16 * entry["kv_bytes_per_token_all_attn_layers_bf16"]  # type: ignore[operator]
    assert layout.units_per_checkpoint == math.ceil(layout.image_bytes / layout.page_unit_bytes)
    assert len(layout.region_bytes) == entry["num_attention_layers"]
    per_spec = entry.get("conv_bytes_per_spec_token_per_layer")
    spec2 = g.layout(16, spec_tokens=2)
    assert spec2.image_bytes == layout.image_bytes  # speculative rows are not carried
    if per_spec is not None:
        assert spec2.slot_bytes - spec2.image_bytes == 2 * per_spec * g.num_recurrent_layers  # type: ignore[operator]
    sp = layout.spec()
    assert sp.units_per_checkpoint == layout.units_per_checkpoint


def test_the_model_without_attention_is_unsupported() -> None:
    g = load_geometry(NO_ATTENTION)
    assert g.num_attention_layers == 0
    for spec_tokens in (0, 1):
        with pytest.raises(UnsupportedGeometryError):
            g.layout(16, spec_tokens)


def test_lookup_by_substring_and_refusals() -> None:
    assert load_geometry("Qwen3-Next").model_id == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    assert load_geometry("qwen3-next").model_id == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    assert load_geometry("jamba").model_id == "ai21labs/Jamba-v0.1"
    for ambiguous in ("Qwen", "nvidia", "Nemotron"):
        with pytest.raises(UnknownGeometryError, match="matches [0-9]+ shipped") as info:
            load_geometry(ambiguous)
        assert isinstance(info.value, LookupError)
    with pytest.raises(UnknownGeometryError, match="matches 0"):
        load_geometry("no-such-model")
    for bad in ("", None, 3):
        with pytest.raises(InvalidArgumentError):
            load_geometry(bad)  # type: ignore[arg-type]


def test_sliced_geometry_and_its_errors() -> None:
    g = load_geometry("Qwen3-Next")
    s = g.sliced(2, 1, 32)
    assert s.num_recurrent_layers == 2 and s.num_attention_layers == 1
    assert s.conv_shape == (256, 3) and s.ssm_shape == (1, 128, 128)
    assert s.kv_bytes_per_token == 64 and s.model_id != g.model_id
    assert s.layout(16).layout_id != g.sliced(2, 1, 16).layout(16).layout_id
    assert g.sliced(36, 12).layout(16).image_bytes == g.layout(16).image_bytes
    bad = [
        (0, 1, 1),
        (37, 1, 1),
        (1, 0, 1),
        (1, 13, 1),
        (1, 1, 0),
        (1, 1, 3),  # does not divide 32 heads
        (1, 1, 64),  # 32 heads
        (1.0, 1, 1),
        (1, 1, 2.0),
    ]
    for rec, attn, div in bad:
        with pytest.raises(UnsupportedGeometryError):
            g.sliced(rec, attn, div)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedGeometryError):
        load_geometry(NO_ATTENTION).sliced(1, 1)  # no attention layer to keep
    # KV bytes that would not be whole bf16 elements.
    odd = attrs.evolve(g, kv_bytes_per_token=6, ssm_shape=(2, 4), conv_shape=(2, 3))
    with pytest.raises(UnsupportedGeometryError):
        odd.sliced(1, 1, 2)


def test_layout_refuses_bad_sizes() -> None:
    g = load_geometry("Qwen3-Next").sliced(1, 1, 32)
    for block, spec in ((0, 0), (-1, 0), (16, -1), (16.0, 0), (16, 1.0)):
        with pytest.raises(UnsupportedGeometryError):
            g.layout(block, spec)  # type: ignore[arg-type]


def _variants(g: ModelGeometry) -> list[tuple[str, ModelGeometry]]:
    return [
        ("rec", attrs.evolve(g, num_recurrent_layers=g.num_recurrent_layers + 1)),
        ("attn", attrs.evolve(g, num_attention_layers=g.num_attention_layers + 1)),
        ("conv_dim", attrs.evolve(g, conv_shape=(g.conv_shape[0] + 2, g.conv_shape[1]))),
        ("kernel", attrs.evolve(g, conv_shape=(g.conv_shape[0], g.conv_shape[1] + 1))),
        ("conv_dtype", attrs.evolve(g, conv_dtype="float32")),
        ("ssm_heads", attrs.evolve(g, ssm_shape=(g.ssm_shape[0] + 1, *g.ssm_shape[1:]))),
        ("ssm_last", attrs.evolve(g, ssm_shape=(*g.ssm_shape[:-1], g.ssm_shape[-1] + 1))),
        ("ssm_dtype", attrs.evolve(g, ssm_dtype="float32")),
        ("kv", attrs.evolve(g, kv_bytes_per_token=g.kv_bytes_per_token + 2)),
        ("model", attrs.evolve(g, model_id=g.model_id + "-x")),
        ("no_conv", attrs.evolve(g, conv_shape=())),
    ]


def test_layout_id_differs_when_any_number_differs() -> None:
    g = load_geometry("Qwen3-Next").sliced(2, 2, 32)
    base = g.layout(16, 1)
    ids = {"base": base.layout_id}
    for name, v in _variants(g):
        ids[name] = v.layout(16, 1).layout_id
    ids["block"] = g.layout(32, 1).layout_id
    ids["spec"] = g.layout(16, 0).layout_id
    assert len(set(ids.values())) == len(ids), ids
    assert g.layout(16, 1).layout_id == base.layout_id  # and is stable


def test_spec_round_trips() -> None:
    for gid in geometry_ids():
        g = load_geometry(gid)
        if not g.num_attention_layers:
            continue
        layout = g.layout(16, spec_tokens=1)
        sp = layout.spec()
        assert isinstance(sp, PagedStateCheckpointSpec)
        assert (sp.page_unit_bytes, sp.slot_bytes, sp.image_bytes, sp.layout_id) == (
            layout.page_unit_bytes,
            layout.slot_bytes,
            layout.image_bytes,
            layout.layout_id,
        )
        assert PagedStateCheckpointSpec(**sp.to_wire()) == sp  # type: ignore[arg-type]
        assert sp.units_per_checkpoint == layout.units_per_checkpoint
        assert sp.image_bytes <= sp.slot_bytes
        d = layout.describe()
        assert d["image_bytes"] == sp.image_bytes and d["layout_id"] == sp.layout_id


def test_layout_streams() -> None:
    layout = load_geometry("Qwen3-Next").sliced(2, 2, 32).layout(128, spec_tokens=1)
    assert [t.name for t in layout.slot_tensors] == [
        "layer0.conv",
        "layer0.ssm",
        "layer1.conv",
        "layer1.ssm",
    ]
    assert layout.src_sizes == (3 * 512, 32768, 3 * 512, 32768)
    assert layout.slot_bytes == layout.image_bytes + 2 * 512
    assert layout.region_bytes == (8192, 8192)
    assert layout.dst_sizes() == (8192,) * 10 and layout.units_per_checkpoint == 5
    assert layout.dst_sizes(2) == (8192,) * 4
    # MiniMax has no conv state: one SSM tensor per layer.
    mm = load_geometry("MiniMax").layout(16, spec_tokens=3)
    assert all(t.name.endswith(".ssm") for t in mm.slot_tensors)
    assert mm.image_bytes == mm.slot_bytes


def test_malformed_entries_are_refused() -> None:
    entry = dict(_shipped_entries()[0])
    ModelGeometry.from_json(entry)
    for change in (
        {"state_bytes_per_layer": 1},
        {"conv_state_dtype": "int3"},
        {"ssm_state_shape": [32, 0, 128]},
        {"ssm_state_shape": "32x128"},
    ):
        with pytest.raises(UnsupportedGeometryError):
            ModelGeometry.from_json({**entry, **change})
    missing = {k: v for k, v in entry.items() if k != "ssm_state_dtype"}
    with pytest.raises(UnsupportedGeometryError):
        ModelGeometry.from_json(missing)
