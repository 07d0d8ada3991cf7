"""The trace-driven engine model (models/replay/engine.py) and ``make bench`` (models/bench.py).

Small deterministic replays of the first 200 requests of the Mooncake conversation trace on
the reference model, with a pool small enough that checkpoints are evicted and stores
refused: every state invariant holds after every pass, the loop reaches hits, restores,
evictions, drops and orphans, two runs agree exactly, and a quick benchmark writes its
section of ``docs/benchmarks.md`` (to a temporary file) without touching other sections.
No figure is asserted: timings are reported, never tested.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pagedstate.models as models_pkg
from pagedstate.models import bench, reference
from pagedstate.models.replay.engine import (
    DEFAULT_TRACE,
    KV_OWNER,
    UNINDEX_DROP,
    UNINDEX_MISS,
    CallTimer,
    Engine,
    EngineConfig,
    EngineResult,
    TraceRequest,
    load_trace,
    resolve_impl,
    run_trace,
    timer_floor_ns,
)
from pagedstate.spec import check_invariants

#: 16 slots over 600 units: about 28 blocks per request, so the pool is tight.
SMALL = EngineConfig(
    max_running=16, pool_units=600, chunk_blocks=2, decode_tokens_per_pass=8, arrival_scale=0.1
)


@pytest.fixture(scope="module")
def trace200() -> list[TraceRequest]:
    return load_trace(DEFAULT_TRACE, 200)


def _checked_run(trace: list[TraceRequest], config: EngineConfig = SMALL) -> EngineResult:
    passes = 0

    def check(engine: Engine) -> None:
        nonlocal passes
        passes += 1
        snap = engine.coordinator.snapshot()
        problems = check_invariants(snap)
        assert problems == [], f"pass {passes}: {problems[:5]}"
        # The engine's own bookkeeping agrees with the pool: each running request holds
        # exactly its KV reservation, and cached prefix blocks fit in the free units.
        kv = sum(1 for owner, _ in snap.tags.values() if owner[0] == KV_OWNER)
        assert kv == sum(len(r.kv_units) for r in engine.running)
        assert engine.cached_blocks <= engine.pool.num_free
        assert len(engine.running) <= engine.config.max_running

    result = Engine(config, trace, "pagedstate.models.reference", on_pass=check).run()
    assert passes == result.counters["passes"]
    return result


def test_trace_loads() -> None:
    t = load_trace(DEFAULT_TRACE, 5)
    assert [r.index for r in t] == list(range(5))
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in t)


def test_invariants_hold_after_every_pass_and_every_path_is_taken(
    trace200: list[TraceRequest],
) -> None:
    r = _checked_run(trace200)
    c, f = r.counters, r.fates
    assert c["admitted"] == c["completed"] == 200
    assert c["rejected"] == 0
    assert c["hits"] > 0 and c["restores"] == c["hits"]
    assert c["hit_blocks"] >= c["hits"]
    assert c["kv_hits"] >= c["hits"]
    assert c["admission_blocked"] > 0  # the pool, not only the slots, limits admission
    assert c["unindexed"] > 0
    assert f["checkpoints_kept"] > 0
    assert f["checkpoints_dropped"] > 0
    assert f["checkpoints_evicted"] > 0
    assert f["checkpoints_orphaned"] > 0
    assert c["peak_running"] == SMALL.max_running
    # Every call went through the timer; the calls an engine makes per pass are there.
    for m in (
        "complete_previous_batch",
        "take_checkpoint_ops",
        "resumable_hit",
        "has_available_units",
        "begin_restore",
        "ensure_free_units",
        "checkpoint",
        "forget_pending",
        UNINDEX_MISS,
        UNINDEX_DROP,
        "pool.reserve_units",
        "pool.release_units",
        "pool.num_free",
    ):
        assert r.timings[m][1] > 0, m
        assert r.timings[m][0] >= 0, m
    assert r.timings["complete_previous_batch"][1] == c["passes"]
    assert r.timings["take_checkpoint_ops"][1] == c["drains"]
    assert r.timings["checkpoint"][1] == c["checkpoints_filed"]
    assert r.timings["begin_restore"][1] == c["restores"]
    assert r.timings["pool.release_units"][1] == c["completed"]
    assert r.timings[UNINDEX_MISS][1] + r.timings[UNINDEX_DROP][1] == c["unindexed"]
    # every call that dropped something counted one orphan (a call orphans at most one)
    assert r.timings[UNINDEX_DROP][1] == f["checkpoints_orphaned"]


def test_two_runs_agree(trace200: list[TraceRequest]) -> None:
    a = run_trace(SMALL, trace200)
    b = run_trace(SMALL, trace200)
    assert a.counters == b.counters
    assert a.fates == b.fates
    assert {m: n for m, (_, n) in a.timings.items()} == {m: n for m, (_, n) in b.timings.items()}


def test_saturated_replay_stops_when_drained(trace200: list[TraceRequest]) -> None:
    cfg = EngineConfig(
        max_running=32,
        pool_units=32 * 40,
        arrival_scale=0.0,
        decode_tokens_per_pass=32,
        stop_when_drained=True,
    )
    r = _checked_run(trace200, cfg)
    assert r.counters["admitted"] == 200
    assert r.counters["completed"] + r.running_at_end == 200
    assert r.running_at_end > 0


def test_prepopulated_records_change_no_call(trace200: list[TraceRequest]) -> None:
    """Records under foreign hashes, in a pool grown by their units, leave the replay's
    calls as they were (what the live-records benchmark relies on)."""
    cfg = EngineConfig(
        max_running=16,
        pool_units=16 * 160,
        arrival_scale=0.0,
        decode_tokens_per_pass=64,
        stop_when_drained=True,
    )
    plain = run_trace(cfg, trace200[:120])
    big = EngineConfig(**{**cfg.__dict__, "pool_units": cfg.pool_units + 300 * 2})
    filled = run_trace(big, trace200[:120], prepopulate=300)
    assert filled.prepopulated == 300
    assert plain.fates["checkpoints_evicted"] == 0
    assert plain.counters == filled.counters
    assert {m: n for m, (_, n) in plain.timings.items()} == {
        m: n for m, (_, n) in filled.timings.items()
    }
    assert filled.fates["checkpoints_kept"] == plain.fates["checkpoints_kept"] + 300


def test_resolve_impl() -> None:
    assert resolve_impl("pagedstate.models.reference") is reference
    with pytest.raises(ImportError, match="PagedStateCheckpointCoordinator"):
        resolve_impl("pagedstate.spec")


def test_models_do_not_import_impl_statically() -> None:
    """``pagedstate.models`` takes the production store by name at run time."""
    models = Path(models_pkg.__file__ or "").parent
    paths = [*sorted(models.glob("bench*.py")), *sorted(models.glob("bench/*.py"))]
    paths += sorted((models / "replay").glob("*.py"))
    assert any(p.name == "engine.py" for p in paths)
    for path in paths:
        name = str(path.relative_to(models))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("pagedstate.impl"), name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("pagedstate.impl") for a in node.names), name


def test_timer() -> None:
    t = CallTimer()
    assert t.call("add", lambda a, b: a + b, 2, 3) == 5
    t.call("add", lambda a, b: a + b, 1, 1)
    assert t.timings["add"][1] == 2 and t.timings["add"][0] >= 0
    assert timer_floor_ns(1000) > 0


@pytest.mark.parametrize("keep", [False, True])
def test_timer_relabels_the_last_call(keep: bool) -> None:
    """A call known only afterwards to be of another kind moves, time and count, to that
    name; with samples kept, its sample moves too (the bench pairs replays by it)."""
    t = CallTimer(keep_samples=keep)
    t.call("a", lambda: None)
    t.call("a", lambda: None)
    total = t.timings["a"][0]
    last = t.samples[-1] if keep else t._last_ns
    t.relabel_last("a", "b")
    assert t.timings["a"][1] == 1 and t.timings["b"] == [last, 1]
    assert t.timings["a"][0] + t.timings["b"][0] == total
    t.call("a", lambda: None)
    t.relabel_last("a", "b")
    assert t.timings["b"][1] == 2 and t.timings["a"][1] == 1
    t.call("b", lambda: None)  # the name relabelling made is an ordinary one
    assert t.timings["b"][1] == 3
    t.call("c", lambda: None)
    t.relabel_last("c", "b")
    assert "c" not in t.timings  # a name left with no call goes
    if keep:
        assert [t.methods[m] for m in t.sample_methods] == ["a", "b", "b", "b", "b"]
        assert sum(t.samples) == sum(ns for ns, _ in t.timings.values())


def test_bench_quick_writes_its_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "benchmarks.md"
    explorer = "<!-- bench-explore:begin -->\nexplorer figures\n<!-- bench-explore:end -->"
    out.write_text(f"# Benchmarks\n\n{explorer}\n", encoding="utf-8")
    args = [
        "--quick",
        "--requests",
        "120",
        "--records",
        "50,400",
        "--ref-records",
        "50",
        "--out",
        str(out),
    ]
    # The reference under both names: a real two-implementation run, judged.
    assert bench.main([*args, "--impl", "pagedstate.models.reference"]) == 0
    text = out.read_text(encoding="utf-8")
    assert explorer in text
    assert text.count("<!-- bench-trace:begin -->") == 1
    assert "Overall, by concurrency" in text and "Per method" in text
    assert "| `checkpoint` |" in text and "| `take_checkpoint_ops` |" in text
    assert "live records" in text
    assert "### Targets" in text and "standing in" not in text
    # --quick runs other levels than the targets compare: shown, not judged
    # the verdict comes before the figure, so an unjudged ratio does not read as a miss
    assert "units: **n/a** (the target compares 1,024 with 64 running requests; at these" in text
    assert "records: **n/a** (the target compares 1,000,000 with 1,000 live records; at" in text
    assert "- Overall µs per call at 256 running requests: **n/a** (no run at 256 running" in text
    assert "(target <= 1.1)" not in text and "(target <= 1.2)" not in text
    # the overall table says how many requests each level completed
    assert "| running requests | peak running | pool units | requests completed |" in text
    assert "| yes |" in text  # the two runs made the same calls
    assert "### Locality control (production)" in text
    assert "| filing |" in text and "| shuffled |" in text
    # every level on one pool, the highest level's (64 slots x 40 units)
    overall = text.split("### Overall, by concurrency", 1)[1].split("###", 1)[0]
    assert overall.count("| 2,560 |") == 2, overall
    assert "every level on one pool of 2,560 units (40 per slot of the highest level)" in text
    assert "- Cost per call at 64 / at 16 running requests, one pool of 2,560 units:" in text
    # and, as context, once more on a pool grown with the slots (16 x 40, 64 x 40)
    assert "### When the pool grows with the slots (production)" in text
    grown = text.split("### When the pool grows", 1)[1].split("###", 1)[0]
    assert "| 16 | 640 |" in grown and "| 64 | 2,560 |" in grown, grown
    assert "µs per call with the pool grown with the slots, 64 / 16 running requests:" in grown
    assert "- Context, not the target: with a pool of 40 units per slot at every level" in text
    # Run again with a module that is not a store: the section is replaced, and says that
    # the reference stood in and nothing was judged.
    assert bench.main([*args, "--impl", "pagedstate.spec"]) == 0
    text = out.read_text(encoding="utf-8")
    assert explorer in text
    assert text.count("<!-- bench-trace:begin -->") == 1
    assert "standing in for pagedstate.spec" in text
    assert "**n/a**" in text
    assert "Not run (one concurrency level, or no production store)." in text
    assert "**n/a** (no production store; the reference against itself:" in text
    assert "When the pool grows" not in text  # production only: nothing to show
    printed = capsys.readouterr().out
    assert "<!-- bench-trace:begin -->" in printed


def test_bench_judges_the_concurrency_target_at_its_levels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the levels the target compares the ratio is judged, met or not met, when both
    levels were reached; with fewer requests than a level, or a pool too small to run a
    level's requests at once, it is n/a and says why. (The target's levels are scaled down
    to 4 and 16 running requests so that a short run reaches them.)"""
    monkeypatch.setattr(bench.targets, "TARGET_CONCURRENCY_LEVELS", (4, 16))
    out = tmp_path / "benchmarks.md"
    base = ["--quick", "--requests", "60", "--records", "50,400", "--ref-records", "50"]

    def line(*extra: str) -> str:
        assert bench.main([*base, *extra, "--out", str(out)]) == 0
        text = out.read_text(encoding="utf-8")
        return next(x for x in text.splitlines() if x.startswith("- Cost per call at 16 / at 4"))

    judged = line("--concurrency", "4,16")
    assert "**met**" in judged or "**not met**" in judged, judged
    assert "Context, not the target" in judged
    few = line("--concurrency", "4,16", "--requests", "10")
    assert "**n/a** (10 requests cannot fill a level of 16;" in few, few
    small = line("--concurrency", "4,16", "--pool-units", "20")
    assert "**n/a** (the pool of 20 units ran at most" in small, small


def test_bench_pool_units_sets_the_one_pool(tmp_path: Path) -> None:
    """``--pool-units`` gives every concurrency level that pool; the grown-pool context
    runs keep ``--units-per-slot`` per slot."""
    out = tmp_path / "benchmarks.md"
    args = ["--quick", "--requests", "60", "--records", "50,400", "--ref-records", "50"]
    assert bench.main([*args, "--pool-units", "3000", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    overall = text.split("### Overall, by concurrency", 1)[1].split("###", 1)[0]
    assert overall.count("| 3,000 |") == 2 and "2,560" not in overall, overall
    assert "every level on one pool of 3,000 units, as an engine" in text
    grown = text.split("### When the pool grows", 1)[1].split("###", 1)[0]
    assert "| 16 | 640 |" in grown and "| 64 | 2,560 |" in grown, grown


def test_locality_control_releases_every_record() -> None:
    """The control's store figures time real releases: every filed record is gone after
    its ``unindex`` (the control raises otherwise), in both orders."""
    got = bench._locality_control(reference, bench.QUICK, 4, repeat=1)
    assert set(got) == {"store filing", "store shuffled", "dict filing", "dict shuffled"}
    assert all(v > 0 for v in got.values())


def test_replays_pair_call_by_call(trace200: list[TraceRequest]) -> None:
    """Two replays make the same calls in the same order, so the benchmark can take each
    call's fastest replay; the paired figure keeps every call count."""
    a = run_trace(SMALL, trace200[:60], keep_samples=True)
    b = run_trace(SMALL, trace200[:60], keep_samples=True)
    assert a.methods == b.methods
    assert a.sample_methods == b.sample_methods
    assert len(a.samples) == a.calls
    best = bench._replay(reference, SMALL, trace200[:60], repeat=2)
    assert best.extra["paired"] == 1.0
    assert {m: n for m, (_, n) in best.timings.items()} == {m: n for m, (_, n) in a.timings.items()}
    assert 0 < bench._us(best) <= best.extra["plain_us"]  # no call slower than in replay 1


@pytest.mark.parametrize(
    ("growth", "says"),
    [
        ((1.04, 1.29, 1.04, 1.30), "follows the memory hierarchy"),  # make bench, 2026-12-01
        ((1.00, 0.99, 1.16, 1.31), "no sign of per-call work"),  # store flat, dict grows
        ((1.40, 1.45, 1.04, 1.30), "look for per-call work"),  # filing order grows alone
        ((1.04, 1.60, 1.04, 1.30), "look for per-call work"),  # shuffled beyond the dict
    ],
)
def test_locality_verdict(growth: tuple[float, float, float, float], says: str) -> None:
    """The control blames the store only when it grows more than 15% beyond a plain dict."""
    assert says in bench._locality_verdict(*growth)
