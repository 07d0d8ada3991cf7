"""The units-per-image benchmark (:mod:`pagedstate.models.bench.units`, issue 19): its quick
mode runs the engine-like loop on both pools, produces a row for every cell and a
well-formed section, and its section writer leaves the other sections of the file as they
were. No timing is asserted: the figures are whatever this machine measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedstate.models.bench import units as bench_units

OTHER = "<!-- bench-trace:begin -->\n## Store calls\n\nsome figures\n<!-- bench-trace:end -->"
HEAD = "# Benchmarks\n\nIntro text.\n\n"
TAIL = "\n\nText after the sections.\n"


def _rows(section: str) -> list[list[str]]:
    """The cells of the main table's body rows (the first table of the section)."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| pool | running R"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_quick_mode_writes_every_row_and_leaves_other_sections(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    out.write_text(HEAD + OTHER + TAIL, encoding="utf-8")
    raw = tmp_path / "units.json"
    assert bench_units.main(["--quick", "--check", "--out", str(out), "--json", str(raw)]) == 0

    text = out.read_text(encoding="utf-8")
    begin, end = bench_units._MARK_BEGIN, bench_units._MARK_END
    assert text.count(begin) == 1 and text.count(end) == 1
    section = text[text.index(begin) : text.index(end) + len(end)]
    # appended after what was there, which stays as it was
    assert text == (HEAD + OTHER + TAIL).rstrip("\n") + "\n\n" + section + "\n"

    q = bench_units.QUICK
    rows = _rows(section)
    want = {(p, R, U) for p in q.pools for R in q.running for U in q.units}
    got = {(r[0], int(r[1].replace(",", "")), int(r[2].split()[0])) for r in rows}
    assert got == want and len(rows) == len(want)
    for r in rows:
        assert len(r) == 15
        float(r[10].replace(",", ""))  # µs/store call
        float(r[11].replace(",", ""))  # µs/image op
        float(r[12].replace(",", ""))  # store ms/pass
    assert "Problems seen" not in section  # every cell evicted, self_check clean
    assert "Every figure but the median repeat's is paired call by call" in section
    lo, hi = bench_units.RATIO_UNITS
    for pool in q.pools:
        for R in q.running:
            assert f"| {pool} | {R:,} |" in section.split(f"### Growth with the image: {hi}")[1]
        assert f"- {pool} pool, µs per image op @{hi} / @{lo}" in section
    assert "### Targets" in section and " not run" in section  # R=256 is not in --quick
    assert "load average" in section

    doc = json.loads(raw.read_text(encoding="utf-8"))
    assert {(c["pool"], c["running"], c["units"]) for c in doc["cells"]} == want
    for c in doc["cells"]:
        assert c["stored"] > 0 and c["released"] > 0 and c["restored"] > 0 and not c["errors"]
        assert c["paired"]  # the repeats made the same calls (deterministic, not timed)
        assert len(c["repeat_store_ns"]) == q.repeat
        assert set(c["timings"]) == set(bench_units.STORE_METHODS + bench_units.KV_METHODS)
    assert doc["machine_start"]["cpu_count"] >= 1


def test_section_writer_replaces_only_its_own_section(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    begin, end = bench_units._MARK_BEGIN, bench_units._MARK_END
    first = f"{begin}\nfirst\n{end}"
    second = f"{begin}\nsecond\n{end}"
    out.write_text(HEAD + OTHER + TAIL, encoding="utf-8")
    bench_units.write_section(out, first)
    kept = (HEAD + OTHER + TAIL).rstrip("\n") + "\n\n"
    assert out.read_text(encoding="utf-8") == kept + first + "\n"
    bench_units.write_section(out, second)  # replaced in place, not appended again
    assert out.read_text(encoding="utf-8") == kept + second + "\n"
    missing = tmp_path / "new" / "b.md"
    bench_units.write_section(missing, first)
    assert missing.read_text(encoding="utf-8") == "# Benchmarks\n\n" + first + "\n"


def test_bad_markers_are_a_usage_error_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    begin, end = bench_units._MARK_BEGIN, bench_units._MARK_END
    out.write_text(f"{end}\n{begin}\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        bench_units.main(["--quick", "--out", str(out)])
    assert exc.value.code == 2
    assert out.read_text(encoding="utf-8") == f"{end}\n{begin}\n"
    with pytest.raises(SystemExit):
        bench_units.main(["--quick", "--pools", "fresh,nope"])
