"""``pagedstate replay``: the trace replay engine model and its command.

Runs on ``tests/data/conversation_slice.jsonl`` (the first 400 requests of the Mooncake
conversation trace); the whole traces, shipped in the checkout's ``data/traces/``, where a
test needs them.
"""

from __future__ import annotations

import json
import os
import re
import types
from pathlib import Path
from typing import Any

import pytest

from pagedstate import impl as I
from pagedstate.models import mutants as M
from pagedstate.models import reference as R
from pagedstate.models.cli import main
from pagedstate.models.replay import (
    Divergence,
    ReplayConfig,
    ReplayEngine,
    ReplayError,
    TraceError,
    load_trace,
    parse_placement,
    replay,
)

SLICE = Path(__file__).parent / "data" / "conversation_slice.jsonl"
_REPO = Path(__file__).resolve().parent.parent
#: The shipped traces, in the checkout's data/traces/.
TRACES = _REPO / "data" / "traces"
QWEN = "Qwen/Qwen3-Next-80B-A3B-Instruct"



@pytest.fixture(scope="module")
def trace() -> list[Any]:
    return load_trace(SLICE)


def _module(coordinator: type, pool: type = I.UnitPool) -> types.ModuleType:
    mod = types.ModuleType("planted")
    mod.UnitPool = pool  # type: ignore[attr-defined]
    mod.PagedStateCheckpointCoordinator = coordinator  # type: ignore[attr-defined]
    return mod


def _cfg(**kw: Any) -> ReplayConfig:
    base: dict[str, Any] = dict(model_id=QWEN, pool_gib=16.0, max_running=16)
    base.update(kw)
    return ReplayConfig(**base)


# -- the engine model ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "placement, offload, abort",
    [("end", False, 0.0), ("anchor", True, 0.0), ("grid:1", True, 0.2), ("grid:4", False, 0.1)],
)
def test_verified_replay_agrees_and_accounts_for_every_request(
    trace: list[Any], placement: str, offload: bool, abort: float
) -> None:
    r = replay(
        trace,
        _cfg(
            placement=placement, offload=offload, abort_rate=abort, verify=True, snapshot_every=16
        ),
    )
    c = r.counters
    assert r.verified
    assert c["completed"] + c["aborted"] + c["rejected"] == c["requests"] == len(trace)
    assert c["snapshots_compared"] > 1
    if placement != "grid:4":
        # The slice's reuse is mostly its shared first block (a system prompt): a 4-block
        # grid has no boundary there, the others do
        assert c["hits"] + c["cpu_hits"] > 0
    assert c["saved_tokens"] == 512 * (c["hit_blocks"] + c["cpu_hit_blocks"])
    assert r.fates["checkpoints_kept"] > 0
    if abort:
        assert c["aborted"] > 0
        assert all(c[f"aborted_{w}"] > 0 for w in ("after_hit", "before_drain", "mid_prefill"))
    else:
        assert c["aborted"] == 0
    if offload:
        assert c["offload_stores"] > 0 and c["offload_reports"] > 0
    json.dumps(r.to_json())  # serialisable


def test_replay_is_deterministic(trace: list[Any]) -> None:
    cfg = _cfg(placement="grid:2", offload=True, abort_rate=0.1)
    a, b = replay(trace, cfg), replay(trace, cfg)
    assert a.counters == b.counters and a.fates == b.fates


def test_placements_file_their_boundaries(trace: list[Any]) -> None:
    """``end`` files one boundary per prompt with a full block; ``grid:1`` one per block."""
    end = replay(trace, _cfg(placement="end", pool_gib=64.0))
    grid = replay(trace, _cfg(placement="grid:1", pool_gib=64.0))
    full = [t.input_length // 512 for t in trace]
    assert end.counters["checkpoints_filed"] <= sum(1 for f in full if f)
    assert grid.counters["checkpoints_filed"] > 3 * end.counters["checkpoints_filed"]


class _Spy(I.PagedStateCheckpointCoordinator):
    hits: list[tuple[int, int]] = []

    def resumable_hit(self, seq: Any, hit: int, block_hashes: Any, *a: Any) -> int:
        _Spy.hits.append((seq.t.input_length, hit))
        return super().resumable_hit(seq, hit, block_hashes, *a)


def test_never_resumes_at_the_prompts_end_s5(trace: list[Any]) -> None:
    _Spy.hits = []
    replay(trace, _cfg(placement="grid:1", pool_gib=64.0), impl=_module(_Spy))
    assert _Spy.hits
    for n_in, hit in _Spy.hits:
        assert hit * 512 < n_in  # at least one prompt token is computed


class _NoRestore(I.PagedStateCheckpointCoordinator):
    """Claims a restore (begin_restore True) but never queues one (S9)."""

    def begin_restore(self, h: int, dst_slot: int) -> bool:
        return self.store.contains(h)


def test_a_hit_counts_only_with_a_queued_restore_s9(trace: list[Any]) -> None:
    honest = replay(trace, _cfg(placement="end"))
    r = replay(trace, _cfg(placement="end"), impl=_module(_NoRestore))
    assert honest.counters["hits"] > 0 and honest.counters["restores_missing"] == 0
    assert r.counters["hits"] == 0
    assert r.counters["restores_missing"] == honest.counters["hits"]


def test_timestamps_are_respected(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 90_000, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    e = ReplayEngine(_cfg(), load_trace(p))
    r = e.run()
    assert e.clock.now_ms >= 90_000
    assert r.counters["passes"] < 20  # idle time is jumped over, not stepped through
    assert r.counters["hits"] == 1  # the second request resumes from the first's image


# -- planted bugs: the lockstep check must catch them ------------------------------------------

CAUGHT = [
    "publish_at_begin",
    "evict_pinned",
    "nominate_copying",
    "partial_release_accepted",
    "unindex_releases_pinned",
    "double_unpin_on_settle",
]


@pytest.mark.parametrize("name", CAUGHT)
def test_verify_catches_a_planted_reference_mutant(trace: list[Any], name: str) -> None:
    m = M.MUTANTS[name]
    cfg = _cfg(placement="grid:2", offload=True, abort_rate=0.2, verify=True, snapshot_every=8)
    with pytest.raises(Divergence) as e:
        ReplayEngine(cfg, trace, _module(m.coordinator, R.UnitPool)).run()
    assert e.value.call and e.value.production != e.value.reference


class _ForgetfulUnindex(I.PagedStateCheckpointCoordinator):
    """A production bug: an evicted KV prefix keeps its checkpoint findable."""

    def unindex(self, h: int) -> None:
        return None


def test_verify_catches_a_planted_production_bug(trace: list[Any]) -> None:
    with pytest.raises(Divergence, match="divergence at store call"):
        replay(trace, _cfg(placement="grid:2", verify=True), impl=_module(_ForgetfulUnindex))
    # without --verify the bug goes unnoticed: the check is what catches it
    replay(trace, _cfg(placement="grid:2"), impl=_module(_ForgetfulUnindex))


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, needle",
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"timestamp": 0, "input_length": 10, "hash_ids": [1]}', "missing field 'output_length'"),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}',
            "need 1 hash",
        ),
        (
            '{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
            "'timestamp'",
        ),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "input_length"),
    ],
)
def test_a_malformed_trace_line_is_named(tmp_path: Path, line: str, needle: str) -> None:
    good = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}'
    p = tmp_path / "t.jsonl"
    p.write_text(f"{good}\n{line}\n")
    with pytest.raises(TraceError, match=needle) as e:
        load_trace(p)
    assert f"{p}:2:" in str(e.value)


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ReplayError, match="kv_block_tokens"):
        _cfg(kv_block_tokens=544)
    with pytest.raises(ReplayError, match="placement"):
        _cfg(placement="grid:0")
    with pytest.raises(ReplayError, match="abort_rate"):
        _cfg(abort_rate=1.5)
    with pytest.raises(ReplayError, match="pool_gib"):
        _cfg(pool_gib=0)
    assert parse_placement("grid:3") == ("grid", 3)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["replay", *args, "--quiet"])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "no/such-model", "--pool-gib", "8"], "unknown model id 'no/such-model'"),
        (["--model", QWEN, "--pool-gib", "0.02"], "one checkpoint image"),
        (["--model", QWEN, "--pool-gib", "0.1"], "cannot hold the request at trace line"),
        (["--model", "state-spaces/mamba2-2.7b", "--pool-gib", "8"], "cannot be replayed"),
        (["--model", QWEN, "--pool-gib", "8", "--plot", "x.png"], "several --pool-gib"),
        (["--model", QWEN, "--pool-gib", "8", "--impl", "no.such.module"], "cannot import"),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    out = tmp_path / "out.json"
    args = [a if a != "x.png" else str(tmp_path / "x.png") for a in args]
    rc, _, err = _cli(capsys, str(SLICE), *args, "--json", str(out))
    assert rc == 2
    assert needle in err
    assert list(tmp_path.iterdir()) == []


def test_cli_malformed_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{oops\n'
    )
    out = tmp_path / "o.json"
    rc, _, err = _cli(capsys, str(p), "--model", QWEN, "--pool-gib", "8", "--json", str(out))
    assert rc == 2 and f"{p}:2: not JSON" in err and not out.exists()


def test_cli_bad_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["replay", str(SLICE), "--model", QWEN, "--pool-gib", "8", "--abort-rate", "2"])
    assert e.value.code == 2
    assert "--abort-rate" in capsys.readouterr().err


def test_cli_divergence_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "planted_forgetful", _module(_ForgetfulUnindex))
    rc, _, err = _cli(
        capsys, str(SLICE), "--model", QWEN, "--pool-gib", "16", "--placement", "grid:2",
        "--max-running", "16", "--verify", "--impl", "planted_forgetful",
    )  # fmt: skip
    assert rc == 1 and "divergence at store call" in err and "production:" in err


def test_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    j, png = tmp_path / "r.json", tmp_path / "r.png"
    rc, out, _ = _cli(
        capsys, str(SLICE), "--model", QWEN, "--pool-gib", "8,16", "--placement", "end,anchor",
        "--limit", "150", "--json", str(j), "--plot", str(png),
    )  # fmt: skip
    assert rc == 0, out
    doc = json.loads(j.read_text())
    assert doc["requests"] == 150 and len(doc["runs"]) == 4
    run = doc["runs"][0]
    for key in ("summary", "counters", "fates", "timings_us", "occupancy", "wall_s", "geometry"):
        assert key in run
    assert run["timings_us"]["overall"]["p99"] >= run["timings_us"]["overall"]["p50"] > 0
    assert run["occupancy"]["samples"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mask = os.umask(0)
    os.umask(mask)
    assert j.stat().st_mode & 0o777 == png.stat().st_mode & 0o777 == 0o666 & ~mask
    assert "hit rate:" in out and "prefill tokens saved:" in out


@pytest.mark.parametrize("name", ["conversation_trace.jsonl", "synthetic_trace.jsonl"])
def test_both_shipped_traces_replay_verified(name: str) -> None:
    r = replay(TRACES / name, _cfg(placement="anchor", verify=True, pool_gib=32.0), limit=300)
    c = r.counters
    assert c["completed"] + c["aborted"] + c["rejected"] == 300
    assert c["prompt_tokens"] > 0 and r.verified


def test_the_readme_example_prints_what_the_readme_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's worked example, run: every line but the timing line is as printed there
    (the replay is deterministic)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("$ pagedstate replay ", 1)[1].split("```", 1)[0]
    command, _, shown = block.partition("\n      ")
    args, _, shown = shown.partition("\n")
    argv = ["replay", *command.replace("\\", "").split(), *args.split()]
    argv[1] = str(TRACES / "conversation_trace.jsonl")
    assert main([*argv, "--quiet"]) == 0
    got = capsys.readouterr().out.strip().splitlines()
    want = shown.strip().splitlines()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if not w.lstrip().startswith("store calls"):
            assert g == w


class _PhantomRestore(I.PagedStateCheckpointCoordinator):
    """Says a restore is queued (S9 evidence) when the drain will deliver none."""

    def begin_restore(self, h: int, dst_slot: int) -> bool:
        return self.store.contains(h)

    def restore_queued_for(self, dst_slot: int) -> bool:
        return True


def test_a_promised_restore_that_no_drain_delivers_is_reported(trace: list[Any]) -> None:
    with pytest.raises(Divergence, match="no restore into slots"):
        replay(trace, _cfg(placement="end"), impl=_module(_PhantomRestore))


# -- hostile inputs (each failed before its fix) ----------------------------------------------

UNIT = 12_582_912  # Qwen3-Next at 512-token pages


def _write(tmp_path: Path, lines: list[dict[str, Any]], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_an_idle_pool_gives_up_a_resume_before_rejecting_a_request(tmp_path: Path) -> None:
    """The second request needs the whole 40-unit pool; its own resume point protects the
    only image. Nothing runs, so it resumes from nothing instead of being rejected."""
    p = _write(tmp_path, [
        dict(timestamp=0, input_length=600, output_length=2, hash_ids=[1, 2]),
        dict(timestamp=1000, input_length=40 * 512 - 2, output_length=2,
             hash_ids=[1, *range(100, 139)]),
    ])  # fmt: skip
    r = replay(p, _cfg(pool_gib=40 * UNIT / 2**30 + 1e-9, placement="end", verify=True))
    assert r.counters["completed"] == 2 and r.counters["rejected"] == 0
    assert r.counters["resumes_given_up"] == 1 and r.counters["hits"] == 0


def test_a_pin_of_a_lost_report_is_waited_for_and_reclaimed(tmp_path: Path) -> None:
    p = _write(tmp_path, [
        dict(timestamp=0, input_length=600, output_length=2, hash_ids=[1, 2]),
        dict(timestamp=100, input_length=40 * 512 - 2, output_length=2,
             hash_ids=list(range(100, 140))),
    ])  # fmt: skip
    cfg = _cfg(pool_gib=40 * UNIT / 2**30 + 1e-9, offload=True, offload_loss_rate=1.0)
    e = ReplayEngine(cfg, load_trace(p))
    r = e.run()
    c = r.counters
    assert c["completed"] == 2 and c["rejected"] == 0
    assert c["offload_reports_lost"] == c["offload_reclaimed"] == r.fates["offload_pins_reclaimed"]
    assert c["offload_reports_lost"] >= 1
    assert not e.prod.coordinator.has_offload_pins()


@pytest.mark.parametrize("where, counted", [
    ("after_hit", False), ("before_drain", False), ("mid_prefill", True),
])  # fmt: skip
def test_a_resume_counts_only_once_its_restore_ran(
    tmp_path: Path, where: str, counted: bool
) -> None:
    p = _write(tmp_path, [
        dict(timestamp=0, input_length=600, output_length=2, hash_ids=[1, 2]),
        dict(timestamp=1000, input_length=600, output_length=2, hash_ids=[1, 3]),
    ])  # fmt: skip
    e = ReplayEngine(_cfg(abort_rate=0.5, verify=True), load_trace(p))

    # abort the second request, at ``where`` (the engine draws abort points in ``run``)
    import random

    class Rng(random.Random):
        n = 0

        def random(self) -> float:
            Rng.n += 1
            return 0.0 if Rng.n == 2 else 0.99

        def choice(self, seq: Any) -> Any:
            return where

        def randint(self, a: int, b: int) -> int:
            return 1

    e.rng = Rng(0)
    r = e.run()
    c = r.counters
    assert c["aborted"] == 1 and c["restores_queued"] == 1
    assert c["hits"] == (1 if counted else 0)
    assert c["saved_tokens"] == (512 if counted else 0)


class _Overclaim(I.PagedStateCheckpointCoordinator):
    """Answers a resume point past the KV hit it was given (breaks S5's premise)."""

    def resumable_hit(self, seq: Any, hit: int, block_hashes: Any, *a: Any) -> int:
        got = super().resumable_hit(seq, hit, block_hashes, *a)
        return got + 1 if got else got


def test_a_store_answering_past_the_kv_hit_is_caught_without_verify(trace: list[Any]) -> None:
    with pytest.raises(Divergence, match=r"(?s)resumable_hit.*S5"):
        replay(trace, _cfg(placement="end"), impl=_module(_Overclaim))


@pytest.mark.parametrize(
    "raw, needle",
    [
        (b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [\xff]}\n',
         "not UTF-8"),
        (b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [9223372036854775808]}\n',  # noqa: E501
         "[0, 2**63)"),
        (b'{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [7, 7, 9]}\n',
         "repeats an id"),
        (b'{"timestamp": 100000000000000000000, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',  # noqa: E501
         "beyond"),
        (b"[" * 100000 + b"]" * 100000 + b"\n", "not JSON"),
    ],
)  # fmt: skip
def test_more_malformed_traces_are_named(tmp_path: Path, raw: bytes, needle: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(raw)
    with pytest.raises(TraceError, match=re.escape(needle)) as e:
        load_trace(p)
    assert f"{p}:1:" in str(e.value)


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(
        b'\xef\xbb\xbf{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
    )
    assert load_trace(p)[0].hash_ids == (1,)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--json", "/proc/out.json"], "cannot write in /proc"),
        (["--json", "SAME", "--plot", "SAME", "--pool-gib", "8,16"], "name the same file"),
        (["--pool-gib", "8,8"], "--pool-gib names 8.0 twice"),
        (["--placement", "end,end"], "--placement names end twice"),
        (["--impl", "os"], "has no UnitPool"),
        (["--impl", ""], "cannot import"),
        (["--pool-gib", "1e12"], "at most"),
        (["--json", " "], "the path is empty"),
    ],
)
def test_more_bad_options_exit_2_writing_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    extra = [str(tmp_path / "same.out") if a == "SAME" else a for a in extra]
    args = ["--model", QWEN]
    if "--pool-gib" not in extra:
        args += ["--pool-gib", "8"]
    rc, _, err = _cli(capsys, str(SLICE), *args, *extra)
    assert rc == 2, err
    assert needle in err
    assert list(tmp_path.iterdir()) == []


def test_every_drawn_abort_happens(trace: list[Any]) -> None:
    r = replay(trace, _cfg(abort_rate=1.0))
    assert r.counters["aborted"] == len(trace) and r.counters["completed"] == 0


def test_occupancy_covers_the_whole_run(trace: list[Any]) -> None:
    e = ReplayEngine(_cfg(max_running=1), trace[:60])
    r = e.run()
    assert len(r.occupancy) <= e.config.occupancy_points
    assert r.occupancy[-1][0] == round(e.clock.now_ms / 1000.0, 3)
    assert r.occupancy[0][0] < r.occupancy[-1][0] / 4


def test_a_misspelled_option_gets_the_replay_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["replay", str(SLICE), "--model", QWEN, "--pool-gib", "8", "--verfy"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "usage: pagedstate replay" in err and "unrecognized arguments: --verfy" in err


def test_plot_must_be_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli(
        capsys, str(SLICE), "--model", QWEN, "--pool-gib", "8,16", "--plot", str(tmp_path / "p.txt")
    )
    assert rc == 2 and "*.png" in err and list(tmp_path.iterdir()) == []


class _Raising(I.PagedStateCheckpointCoordinator):
    calls = 0

    def begin_restore(self, h: int, dst_slot: int) -> bool:
        _Raising.calls += 1
        if _Raising.calls == 3:
            raise KeyError("planted")
        return super().begin_restore(h, dst_slot)


def test_a_store_error_names_the_call(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    _Raising.calls = 0
    monkeypatch.setitem(sys.modules, "planted_raising", _module(_Raising))
    rc, _, err = _cli(capsys, str(SLICE), "--model", QWEN, "--pool-gib", "16",
                      "--impl", "planted_raising")  # fmt: skip
    assert rc == 1
    assert "(begin_restore): KeyError: 'planted'" in err


def test_replay_takes_a_model_by_a_unique_part_of_its_id() -> None:
    """As ``load_geometry`` and the transfer driver do: "Qwen3-Next" names the one shipped
    Qwen3-Next geometry; an ambiguous part is refused as ambiguous (tests/
    test_replay_errors.py), a name no id contains as unknown."""
    from pagedstate.models.replay import ReplayError, _geometry

    short = _geometry("Qwen3-Next", 512)
    full = _geometry("Qwen/Qwen3-Next-80B-A3B-Instruct", 512)
    assert short == full
    with pytest.raises(ReplayError, match="ambiguous"):
        _geometry("Qwen", 512)  # more than one shipped model matches
    with pytest.raises(ReplayError, match="unknown model id 'no-such-model'"):
        _geometry("no-such-model", 512)
    with pytest.raises(ReplayError, match="cannot be replayed"):
        _geometry("", 512)


def test_the_old_module_paths_warn_and_give_the_same_objects() -> None:
    """``pagedstate.models.engine``, ``.replay_exec`` and ``.replay_cli`` (one release more):
    importing one warns with the new path, and every name it offers is the new module's."""
    import subprocess
    import sys

    code = """
import importlib, warnings
cases = [
    ("pagedstate.models.engine", ["pagedstate.models.replay.engine"]),
    ("pagedstate.models.replay_exec", ["pagedstate.models.replay.executor"]),
    ("pagedstate.models.replay_cli",
     ["pagedstate.models.replay.cli", "pagedstate.models.replay.report"]),
]
for old, new in cases:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mod = importlib.import_module(old)
    msgs = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert any(new[0] in m for m in msgs), (old, msgs)
    homes = [importlib.import_module(n) for n in new]
    assert mod.__all__
    for name in mod.__all__:
        want = [getattr(h, name) for h in homes if hasattr(h, name)]
        assert want and getattr(mod, name) is want[0], (old, name)
print("ok")
"""
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
