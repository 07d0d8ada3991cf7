"""``--model`` names that match several shipped geometries, or none.

A part of an id that several shipped ids contain (``Qwen``: four models) is refused as
*ambiguous*, naming every id it matches; a name no id contains is refused as *unknown*,
with the known ids. Both through the lookup (``pagedstate.gpu.load_geometry``), the replay's
model resolution and ``pagedstate replay`` (exit 2, ``pagedstate replay: error: ...``,
nothing run or written). The ambiguous errors subclass the ones raised before
(``UnknownGeometryError``, ``ReplayError``), so callers that catch those still do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pagedstate.gpu.geometry import (
    AmbiguousGeometryError,
    geometry_ids,
    load_geometry,
)
from pagedstate.models.cli import main
from pagedstate.models.replay import (
    AmbiguousModelError,
    ReplayConfig,
    ReplayEngine,
    ReplayError,
    load_trace,
    replay,
)
from pagedstate.models.replay.config import _geometry
from pagedstate.spec.errors import UnknownGeometryError

SLICE = Path(__file__).parent / "data" / "conversation_slice.jsonl"
#: A part of several shipped ids, and one of no id.
AMBIGUOUS = ["Qwen", "nvidia", "nemotron", "-h-"]
UNKNOWN = "no-such-model"


def _matching(name: str) -> list[str]:
    return [i for i in geometry_ids() if name.lower() in i.lower()]


def test_the_cases_are_what_they_claim() -> None:
    for name in AMBIGUOUS:
        assert len(_matching(name)) > 1, name
    assert len(_matching("Qwen")) == 4  # the defect's example
    assert _matching(UNKNOWN) == []


# -- the lookup (pagedstate.gpu) --------------------------------------------------------------


@pytest.mark.parametrize("name", AMBIGUOUS)
def test_lookup_refuses_an_ambiguous_part_naming_every_match(name: str) -> None:
    with pytest.raises(AmbiguousGeometryError) as info:
        load_geometry(name)
    e = info.value
    assert isinstance(e, UnknownGeometryError) and isinstance(e, LookupError)
    assert "ambiguous" in str(e)
    assert e.model_id == name
    assert list(e.matches) == _matching(name)
    for model_id in _matching(name):
        assert model_id in str(e)


def test_lookup_calls_an_unknown_name_unknown() -> None:
    with pytest.raises(UnknownGeometryError) as info:
        load_geometry(UNKNOWN)
    e = info.value
    assert not isinstance(e, AmbiguousGeometryError)
    assert "ambiguous" not in str(e)
    assert UNKNOWN in str(e)
    assert all(model_id in str(e) for model_id in geometry_ids())  # the known ones


def test_a_unique_part_and_an_exact_id_still_resolve() -> None:
    qwen3_next = "Qwen/Qwen3-Next-80B-A3B-Instruct"
    assert load_geometry("Qwen3-Next").model_id == qwen3_next
    assert load_geometry(qwen3_next).model_id == qwen3_next
    assert _geometry("qwen3-next", 512) == _geometry(qwen3_next, 512)


# -- the replay's model resolution ------------------------------------------------------------


@pytest.mark.parametrize("name", AMBIGUOUS)
def test_replay_refuses_an_ambiguous_model_naming_every_match(name: str) -> None:
    with pytest.raises(AmbiguousModelError) as info:
        _geometry(name, 512)
    e = info.value
    assert isinstance(e, ReplayError) and isinstance(e, ValueError)
    assert "ambiguous" in str(e) and "unknown" not in str(e)
    assert e.model_id == name
    assert list(e.matches) == _matching(name)
    for model_id in _matching(name):
        assert model_id in str(e)


def test_replay_calls_an_unknown_model_unknown() -> None:
    with pytest.raises(ReplayError) as info:
        _geometry(UNKNOWN, 512)
    e = info.value
    assert not isinstance(e, AmbiguousModelError)
    assert "unknown" in str(e) and "ambiguous" not in str(e)
    assert all(model_id in str(e) for model_id in geometry_ids())


def test_engine_and_replay_raise_it_before_anything_runs() -> None:
    trace = load_trace(SLICE, 20)
    cfg = ReplayConfig(model_id="Qwen", pool_gib=16.0)  # the knobs do not resolve the model
    with pytest.raises(AmbiguousModelError):
        ReplayEngine(cfg, trace)
    with pytest.raises(AmbiguousModelError):
        replay(trace, cfg)
    with pytest.raises(ReplayError, match="unknown"):
        replay(trace, ReplayConfig(model_id=UNKNOWN, pool_gib=16.0))


# -- pagedstate replay --------------------------------------------------------------------------


def _cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model: str
) -> tuple[int, str, str, Path]:
    out = tmp_path / "out.json"
    rc = main(
        ["replay", str(SLICE), "--model", model, "--pool-gib", "16", "--json", str(out), "--quiet"]
    )
    got_out, got_err = capsys.readouterr()
    return rc, got_out, got_err, out


@pytest.mark.parametrize("name", ["Qwen", "nvidia"])
def test_cli_ambiguous_model_exits_2_naming_every_match(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    rc, out, err, json_out = _cli(capsys, tmp_path, name)
    assert rc == 2
    assert out == "" and not json_out.exists()  # nothing ran, nothing written
    assert err.startswith("pagedstate replay: error: ")
    assert "ambiguous" in err and "unknown" not in err
    for model_id in _matching(name):
        assert model_id in err
    assert len(err.strip().splitlines()) == 1


def test_cli_unknown_model_exits_2_saying_unknown(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, out, err, json_out = _cli(capsys, tmp_path, UNKNOWN)
    assert rc == 2
    assert out == "" and not json_out.exists()
    assert err.startswith("pagedstate replay: error: ")
    assert "unknown" in err and "ambiguous" not in err
    assert UNKNOWN in err and "known:" in err


def test_cli_ambiguous_model_in_a_process(tmp_path: Path) -> None:
    """The exit status the shell sees."""
    out = tmp_path / "out.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pagedstate.models.cli",
            "replay",
            str(SLICE),
            "--model",
            "Qwen",
            "--pool-gib",
            "16",
            "--json",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 2, p.stderr
    assert p.stdout == "" and not out.exists()
    assert "pagedstate replay: error: " in p.stderr and "ambiguous" in p.stderr
    for model_id in _matching("Qwen"):
        assert model_id in p.stderr


def test_progress_off_a_terminal_prints_plain_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Off a terminal (a CI log) the replay prints a plain progress line now and then
    instead of the bar; with quiet, nothing."""
    from pagedstate.models.replay import cli as replay_cli

    monkeypatch.setattr(replay_cli, "_LOG_EVERY_S", 0.0)
    p = replay_cli._Progress(2, 10, quiet=False)
    p.start(1, "16 GiB anchor")
    p.update(5, 10)
    p.close()
    err = capsys.readouterr().err
    assert "replay run 2/2 (16 GiB anchor): 5 of 10 requests" in err, err
    q = replay_cli._Progress(2, 10, quiet=True)
    q.start(0, "x")
    q.update(5, 10)
    q.close()
    assert capsys.readouterr().err == ""
