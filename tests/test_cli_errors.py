"""Every bad argument of every ``pagedstate`` subcommand is argparse's usage error: exit
status 2, ``pagedstate CMD: error: ...`` (naming the valid choices where there are some),
and nothing run. Before, ``pagedstate explore --config nosuch`` printed a Python list
without the prefix.

"Nothing ran": what each subcommand would run (the explorer's searches, the table
renderer, the log checker) is replaced by a function that fails the test, and nothing may
be printed on stdout. The messages are not asserted whole, only their prefix and, for a
closed set, the choices.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pagedstate.models import cli

#: One line of a Mooncake-format trace (the replay's bad arguments other than the trace).
TRACE_LINE = '{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]}\n'


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the subcommands run fails the test if it is called."""
    from pagedstate.models import checklog, explorer
    from pagedstate.spec import render

    def ran(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a subcommand ran despite a bad argument")

    for mod, name in [
        (explorer, "explore"),
        (explorer, "explore_parallel"),
        (render, "write"),
        (render, "stale"),
        (render, "render_all"),
        (checklog, "check_file"),
    ]:
        monkeypatch.setattr(mod, name, ran)


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not a folder\n", encoding="utf-8")
    trace = tmp_path / "trace.jsonl"
    trace.write_text(TRACE_LINE, encoding="utf-8")
    return {
        "DIR": str(tmp_path),
        "FILE": str(a_file),
        "MISSING": str(tmp_path / "missing"),
        "TRACE": str(trace),
    }


def _argv(argv: list[str], paths: dict[str, str]) -> list[str]:
    return [a.format(**paths) for a in argv]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Any, str, str]:
    """``pagedstate ARGV`` in this process: (exit status, stdout, stderr). argparse's own
    errors exit (``SystemExit``); the subcommands' return 2."""
    try:
        code: Any = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


BAD: list[tuple[str, list[str]]] = [
    # the command itself
    ("", ["nosuch"]),
    # explore: config names, counts, the counterexample's path, an unknown option
    ("explore", ["explore", "--config", "nosuch"]),
    ("explore", ["explore", "--config", ""]),
    ("explore", ["explore", "--workers", "0"]),
    ("explore", ["explore", "--workers", "two"]),
    ("explore", ["explore", "--workers", "65"]),
    ("explore", ["explore", "--max-states", "0"]),
    ("explore", ["explore", "--max-states", "-5"]),
    ("explore", ["explore", "--json", "{MISSING}/cex.json"]),
    ("explore", ["explore", "--json", "{DIR}"]),
    ("explore", ["explore", "--json", "{FILE}/cex.json"]),
    ("explore", ["explore", "--json", ""]),
    # ... and paths the folder checks pass for root (os.access allows /proc) that cannot be
    # opened for writing: a new file in /proc, an existing read-only one
    ("explore", ["explore", "--json", "/proc/pagedstate-cex.json"]),
    ("explore", ["explore", "--json", "/proc/version"]),
    ("explore", ["explore", "--bogus"]),
    ("explore", ["explore", "--max-memory-mb", "0"]),
    ("explore", ["explore", "--max-memory-mb", "lots"]),
    ("explore", ["explore", "--max-memory-mb", "4096"]),  # needs --workers 2 or more
    # render: a folder to check that is not one, a folder to write that cannot be one
    ("render", ["render", "--check", "{MISSING}"]),
    ("render", ["render", "--check", "{FILE}"]),
    ("render", ["render", "--check", ""]),
    ("render", ["render", "--out", "{FILE}"]),
    ("render", ["render", "--out", "{FILE}/docs"]),
    ("render", ["render", "--out", ""]),
    ("render", ["render", "--out", "{DIR}", "--check", "{DIR}"]),
    ("render", ["render", "stray"]),
    # check-log: no file, a file that cannot be read, an unknown option
    ("check-log", ["check-log"]),
    ("check-log", ["check-log", "{MISSING}.ndjson"]),
    ("check-log", ["check-log", "{DIR}"]),
    ("check-log", ["check-log", "{MISSING}.ndjson", "--bogus"]),
    # replay: required arguments, a missing trace, a bad size, model, placement or output
    ("replay", ["replay"]),
    ("replay", ["replay", "{TRACE}", "--model", "Qwen3-Next"]),
    ("replay", ["replay", "{MISSING}.jsonl", "--model", "Qwen3-Next", "--pool-gib", "1"]),
    ("replay", ["replay", "{TRACE}", "--model", "Qwen3-Next", "--pool-gib", "abc"]),
    ("replay", ["replay", "{TRACE}", "--model", "Qwen3-Next", "--pool-gib", "0"]),
    ("replay", ["replay", "{TRACE}", "--model", "nosuch-model", "--pool-gib", "1"]),
    (
        "replay",
        ["replay", "{TRACE}", "--model", "Qwen3-Next", "--pool-gib", "1", "--placement", "x"],
    ),
    (
        "replay",
        ["replay", "{TRACE}", "--model", "Qwen3-Next", "--pool-gib", "1", "--json", "{DIR}"],
    ),
]


@pytest.mark.parametrize(("command", "argv"), BAD, ids=[" ".join(a) for _, a in BAD])
@pytest.mark.usefixtures("nothing_runs")
def test_a_bad_argument_is_a_usage_error_and_nothing_runs(
    command: str, argv: list[str], paths: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(_argv(argv, paths), capsys)
    assert code == 2, (code, err)
    prog = f"pagedstate {command}" if command else "pagedstate"
    assert f"{prog}: error: " in err, err
    assert "Traceback" not in err
    assert out == "", out


@pytest.mark.usefixtures("nothing_runs")
def test_an_unknown_config_names_every_config(capsys: pytest.CaptureFixture[str]) -> None:
    from pagedstate.models.explorer import CONFIGS

    code, _, err = run_cli(["explore", "--config", "nosuch"], capsys)
    assert code == 2 and "pagedstate explore: error: " in err
    assert all(repr(name) in err for name in CONFIGS), err


def test_the_command_reports_a_bad_config_as_argparse_does(tmp_path: Path) -> None:
    """The reported defect, through the command's own process: exit 2 and the prefix (the
    console script is ``pagedstate.models.cli:main``, the same as ``python -m``)."""
    p = subprocess.run(
        [sys.executable, "-m", "pagedstate.models.cli", "explore", "--config", "nosuch"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode == 2, p.stderr
    assert "pagedstate explore: error: " in p.stderr and p.stdout == ""
    assert not list(tmp_path.iterdir())  # nothing written


def test_good_paths_still_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The checks refuse only bad paths: a folder still to be made under one that exists is
    written, and ``--check`` of it then passes."""
    out = tmp_path / "new" / "docs"
    code, _, _ = run_cli(["render", "--out", str(out)], capsys)
    assert code == 0 and (out / "tables" / "README.md").is_file()
    code, _, err = run_cli(["render", "--check", str(out)], capsys)
    assert code == 0, err


def test_render_that_cannot_write_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder that passes the up-front check but fails at the write (a full disk, /proc)
    ends in a usage error naming the folder, not a traceback."""
    from pagedstate.spec import render

    def full(out_dir: object) -> list[Path]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(render, "write", full)
    code, out, err = run_cli(["render", "--out", str(tmp_path / "docs")], capsys)
    assert code == 2 and "pagedstate render: error: argument --out" in err, err
    assert "No space left on device" in err and "Traceback" not in err and out == ""


def _fake_search(
    monkeypatch: pytest.MonkeyPatch, *, violation: bool, before: Any = None
) -> list[int]:
    """Replace both searches by one that returns at once a report of ``tiny`` (with a
    violation if asked), after calling ``before``; the list counts the calls."""
    from pagedstate.models import explorer

    calls: list[int] = []

    def search(*args: Any, **kwargs: Any) -> explorer.Report:
        calls.append(1)
        if before is not None:
            before()
        report = explorer.Report(config=explorer.CONFIGS["tiny"], stopped="violation")
        if violation:
            report.violation = explorer.Violation(
                "Invariant", "planted", "a planted violation", (("drain", ()),)
            )
        return report

    monkeypatch.setattr(explorer, "explore", search)
    monkeypatch.setattr(explorer, "explore_parallel", search)
    return calls


def test_explore_json_that_cannot_be_written_at_the_end_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``--json`` path that passed the check before the search but cannot be written when
    the counterexample is (its folder went away meanwhile) ends in an error naming it, exit
    status 2, after the report; before, a traceback."""
    folder = tmp_path / "out"
    folder.mkdir()
    calls = _fake_search(monkeypatch, violation=True, before=folder.rmdir)

    code, out, err = run_cli(["explore", "--json", str(folder / "cex.json")], capsys)

    assert calls == [1] and not folder.exists()
    assert code == 2, (code, err)
    assert "pagedstate explore: error: argument --json" in err and "cannot write" in err, err
    assert "Traceback" not in err
    assert "planted is violated" in out and '"name": "planted"' in out  # the report came first


@pytest.mark.parametrize("violation", [False, True])
def test_explore_json_check_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    violation: bool,
) -> None:
    """The up-front check of ``--json`` tries to open the file and leaves no trace: a new
    path stays absent and an existing file unchanged unless there is a counterexample to
    write (then it is the counterexample)."""
    calls = _fake_search(monkeypatch, violation=violation)
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("kept\n", encoding="utf-8")

    for path in (new, old):
        code, _, err = run_cli(["explore", "--json", str(path)], capsys)
        assert code == 1, err  # the fake report misses rows: NOT OK, but no usage error

    assert calls == [1, 1]
    if violation:
        for path in (new, old):
            assert json.loads(path.read_text(encoding="utf-8"))["name"] == "planted"
    else:
        assert not new.exists() and old.read_text(encoding="utf-8") == "kept\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_explore_prints_progress_lines_off_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], workers: str
) -> None:
    """Off a terminal (a CI log, ``make check``) ``explore`` prints a plain progress line at
    least every 15 s (before: every 30 s, and the parallel search only once a level); here
    with both intervals at 0, so every progress call is a line."""
    from pagedstate.models import explorer
    from pagedstate.models.cli import explore as explore_cli

    assert explore_cli._LOG_EVERY_S <= 15 and explorer._PROGRESS_EVERY_S <= 15
    monkeypatch.setattr(explore_cli, "_LOG_EVERY_S", 0.0)
    monkeypatch.setattr(explorer, "_PROGRESS_EVERY_S", 0.0)

    code, out, err = run_cli(
        ["explore", "--config", "tiny", "--max-states", "300", "--workers", workers], capsys
    )

    assert code == 1, err  # 300 states miss rows: NOT OK
    lines = [line for line in err.splitlines() if line.startswith("explore tiny: ")]
    assert len(lines) >= 3, err
    assert all(" distinct, depth " in line and " at the depth bound" in line for line in lines)
    assert "distinct states found" in out  # the report, on stdout


def test_the_explore_help_names_each_configuration_s_depth_bound() -> None:
    """``--max-depth``'s help states every configuration's default bound; it is written
    out (the CLI does not import the explorer to build its parser), so it must be kept
    true by hand: this test does."""
    from pagedstate.models.cli import explore as explore_cli
    from pagedstate.models.explorer import CONFIGS

    parser = argparse.ArgumentParser()
    explore_cli.add_parser(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices["explore"]._actions if a.dest == "max_depth")
    for name, cfg in CONFIGS.items():
        assert f"{name} {cfg.max_depth}" in (action.help or "")
