"""``make bench``'s command line and verdicts, and one check-log message: each test failed
before its fix.

- bench judged targets on runs that measured nothing (0 requests) or never reached their
  level (a pool too small to run that many requests at once), and on live-records runs that
  did not make the same calls;
- its text promised sections a run did not have, and called "the same requests" runs that
  served different numbers of them;
- bad arguments crashed mid-run (ZeroDivisionError, a missing trace, an unknown reference
  module), were silently replaced by defaults (0 read as "not given"), or were only refused
  after the whole run (an ``--out`` whose markers are out of order);
- check-log said "a line is a JSON object" of a line that is not one.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from pagedstate.models import bench
from pagedstate.models.checklog import check_log

NO_RECORDS = ["--records", ",", "--ref-records", ","]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert bench.main(argv) == 0
    return capsys.readouterr().out


def _refused(argv: list[str]) -> None:
    """A clear argparse error (SystemExit 2), not a traceback and not a silent default."""
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2


def test_zero_requests_judges_no_target(capsys: pytest.CaptureFixture[str]) -> None:
    # observed: 0 store calls at every level, yet "2.39"->"0.00 (target <= 3): **met**" and
    # "1,024 / 64 ...: 0.00 (target <= 1.1): **met**"
    try:
        out = _run(["--requests", "0", *NO_RECORDS, "--repeat", "1"], capsys)
    except SystemExit as e:
        assert e.code == 2
        return
    assert "**met**" not in out


def test_pool_too_small_for_the_levels_judges_no_target(capsys: pytest.CaptureFixture[str]) -> None:
    # observed: peak running 2 at both "64" and "1,024", 210 of 300 requests rejected,
    # "Cost per call at 1,024 / at 64 running requests, one pool of 10 units: 0.75 ... **met**"
    argv = [
        "--pool-units",
        "10",
        "--concurrency",
        "64,1024",
        "--requests",
        "300",
        *NO_RECORDS,
        "--repeat",
        "1",
    ]
    try:
        out = _run(argv, capsys)
    except SystemExit as e:
        assert e.code == 2
        return
    assert "**met**" not in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--concurrency", "0"],  # ZeroDivisionError in _config
        ["--concurrency", "16,0"],
        ["--pool-units", "-5"],  # InvalidArgumentError from impl/_args.py, mid-run
        ["--units-per-slot", "-3"],
        ["--units-per-slot", "0"],  # silently replaced by 40
        ["--pool-units", "0"],  # silently replaced by the default
        ["--repeat", "0"],  # silently replaced by the default
        ["--repeat", "-2"],  # runs 1 replay, reports "fastest of -2 replays"
        ["--ref-repeat", "0"],
        ["--records-concurrency", "0"],
        ["--chunk-blocks", "0"],  # ValueError traceback from the engine
        ["--requests", "-1"],  # "the first 0 requests"
        ["--records", "-5"],  # a row with -5 live records
        ["--trace", "/nonexistent"],  # FileNotFoundError traceback
        ["--trace", "/tmp"],  # IsADirectoryError traceback
        ["--ref", "nosuch.module"],  # ModuleNotFoundError traceback
    ],
)
def test_bad_cli_input_is_refused(argv: list[str]) -> None:
    _refused(["--quick", *NO_RECORDS, *argv])


def test_records_target_line_agrees_with_same_calls_column(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the table said evicted 1,637 and same calls "no", the targets "The two runs make
    the same calls" (and at the target's levels would have judged them)."""
    monkeypatch.setattr(bench.targets, "TARGET_RECORDS_LEVELS", (100, 2000))  # judged at these
    argv = ["--quick", "--records-units-per-slot", "1", "--records", "100,2000"]
    out = _run([*argv, "--ref-records", ","], capsys)
    table = out.split("### Live records")[1].split("Per method")[0]
    assert re.search(r"\| no \|", table), table  # the scenario: the runs differ
    assert "The two runs make the same calls" not in out
    assert "chosen so that the replay evicts nothing" not in out
    assert "in this run some replays evicted records" in out
    assert "**n/a** (the two runs did not make the same calls; measured:" in out


def test_same_requests_context_only_when_served_counts_agree(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: served 214 at 16 and 288 at 64, yet "serving the same 214 requests"."""
    out = _run(["--quick", "--units-per-slot", "2", *NO_RECORDS], capsys)
    full = out.split("### The same requests, served to the end")[1].split("###")[0]
    served = re.findall(r"^\| [\d,]+ \| ([\d,]+) \| [\d,]+ \| [\d.]+ \|", full, re.M)
    assert len(served) == 2 and served[0] != served[1], served  # the scenario
    assert "serving the same" not in out
    assert f"serving {served[0]} and {served[1]} of 300 requests" in out


def test_single_level_does_not_promise_absent_sections(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["--quick", "--concurrency", "64", *NO_RECORDS], capsys)
    assert "### When the pool grows with the slots" not in out
    assert "### The same requests, served to the end" not in out
    assert "those runs are context, further down" not in out
    assert "served to the end are further down" not in out


def test_zero_calls_and_unreached_levels_are_not_judged(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A level the pool cannot run at is n/a at the target's own levels, and says why."""
    monkeypatch.setattr(bench.targets, "TARGET_CONCURRENCY_LEVELS", (16, 64))
    out = _run(["--quick", "--pool-units", "10", *NO_RECORDS, "--repeat", "1"], capsys)
    line = next(x for x in out.splitlines() if x.startswith("- Cost per call at 64 / at 16"))
    assert "**n/a** (the pool of 10 units ran at most" in line, line
    assert "**met**" not in out and "**not met**" not in out


@pytest.mark.parametrize(
    "text",
    [
        "x <!-- bench-trace:end --> y <!-- bench-trace:begin --> z\n",  # reversed
        "<!-- bench-trace:begin --> only a begin\n",
        "<!-- bench-trace:begin --> a <!-- bench-trace:end --> <!-- bench-trace:end -->\n",
    ],
)
def test_bad_markers_in_out_file_are_refused_before_the_run(tmp_path: Path, text: str) -> None:
    f = tmp_path / "b.md"
    f.write_text(text)
    _refused(["--quick", *NO_RECORDS, "--out", str(f)])
    assert f.read_text() == text  # untouched


def test_out_directory_is_refused(tmp_path: Path) -> None:
    _refused(["--quick", *NO_RECORDS, "--out", str(tmp_path)])


def test_checklog_non_object_message_is_true() -> None:
    r = check_log(io.StringIO("[1, 2]\n"))
    assert "a line is a JSON object" not in r.text()
    assert "a line must be a JSON object, got list" in r.text()
