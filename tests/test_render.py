"""The table renderers (pagedstate.spec.render) and ``pagedstate render``.

The committed pages under ``docs/tables/`` must be exactly what the renderer produces from
the current tables: after changing ``spec/tables.py`` run ``pagedstate render --out docs``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedstate.models import cli
from pagedstate.spec import RECORD, TABLES
from pagedstate.spec.render import (
    MARKDOWN_COLUMNS,
    markdown,
    mermaid,
    render_all,
    stale,
    write,
)
from pagedstate.spec.tables import NO_GUARD, Row

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def test_committed_docs_are_not_stale() -> None:
    assert stale(DOCS) == [], "docs/ is stale: run `pagedstate render --out docs`"


def test_render_all_names_one_page_per_machine_and_an_index() -> None:
    files = render_all()
    assert set(files) == {"tables/README.md"} | {f"tables/{m}.md" for m in TABLES}
    index = files["tables/README.md"]
    for machine in TABLES:
        assert f"]({machine}.md)" in index
        page = files[f"tables/{machine}.md"]
        assert page.startswith(f"# `{machine}` ")
        assert "```mermaid\n" + mermaid(TABLES[machine]) + "```\n" in page
        assert markdown(TABLES[machine]) in page


def _expected_edge(row: Row) -> tuple[str, list[str]]:
    """The start of ``row``'s Mermaid edge line and the effect texts its label must show."""
    label = row.event + ("" if row.guard == NO_GUARD else f" [{row.guard}]")
    effects = []
    if row.pin_delta:
        effects.append(f"pin{row.pin_delta:+d}")
    if row.units != "keep":
        effects.append(f"units={row.units}")
    if row.index != "none":
        effects.append(f"index={row.index}")
    return f"{row.phase} --> {row.next} : {label}", effects


def test_mermaid_record_has_every_row_edge() -> None:
    text = mermaid(RECORD)
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "stateDiagram-v2"
    assert f"[*] --> {RECORD.initial}" in lines
    for phase in RECORD.terminal:
        assert f"{phase} --> [*]" in lines
    edges = [line for line in lines if "-->" in line and "[*]" not in line]
    assert len(edges) == len(RECORD.rows)
    for row, line in zip(RECORD.rows, edges, strict=True):
        start, effects = _expected_edge(row)
        assert line.startswith(start), (row, line)
        shown = line[len(start) :]
        if effects:
            assert shown == " / " + ", ".join(effects), (row, line)
        else:
            assert shown == "", (row, line)


def test_mermaid_scratch_has_no_terminal_edge() -> None:
    text = mermaid(TABLES["scratch"])
    assert "--> [*]" not in text
    assert "[*] --> FREE" in text


@pytest.mark.parametrize("machine", list(TABLES))
def test_markdown_has_one_line_per_row(machine: str) -> None:
    table = TABLES[machine]
    lines = markdown(table).splitlines()
    assert lines[0] == "| " + " | ".join(MARKDOWN_COLUMNS) + " |"
    body = lines[2:]
    assert len(body) == len(table.rows)
    for i, (row, line) in enumerate(zip(table.rows, body, strict=True)):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == len(MARKDOWN_COLUMNS)
        assert cells[:8] == [
            str(i),
            row.phase,
            row.event,
            row.guard,
            row.next,
            "0" if row.pin_delta == 0 else f"{row.pin_delta:+d}",
            row.units,
            row.index,
        ]
        assert cells[8].startswith(row.note)


def test_output_is_deterministic() -> None:
    assert render_all() == render_all()
    for table in TABLES.values():
        assert mermaid(table) == mermaid(table)
        assert markdown(table) == markdown(table)


def test_write_then_stale(tmp_path: Path) -> None:
    assert stale(tmp_path) == sorted(render_all())
    paths = write(tmp_path)
    assert paths == [tmp_path / rel for rel in render_all()]
    assert stale(tmp_path) == []
    (tmp_path / "tables" / "record.md").write_text("edited by hand\n", encoding="utf-8")
    (tmp_path / "tables" / "lease.md").unlink()
    assert stale(tmp_path) == ["tables/lease.md", "tables/record.md"]


def test_cli_render_out_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "--check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert str(tmp_path / "tables" / "record.md") in out
    assert cli.main(["render", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert cli.main(["render", "--check", str(tmp_path)]) == 0
    assert "up to date" in capsys.readouterr().out
    (tmp_path / "tables" / "scratch.md").write_text("old\n", encoding="utf-8")
    assert cli.main(["render", "--check", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "tables" / "scratch.md")]


def test_cli_render_defaults_to_docs() -> None:
    args = cli.build_parser().parse_args(["render"])
    assert args.out == "docs"
    assert args.check is None
