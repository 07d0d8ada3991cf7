"""The README's Python example runs as written (docs that show real use must work)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "README has no python example"
    for i, code in enumerate(blocks):
        namespace: dict[str, object] = {}
        exec(compile(code, f"README.md block {i}", "exec"), namespace)
        # each block ends with the object it is about (and asserts on it)
        assert "coord" in namespace or "receiver" in namespace


def test_eventlog_doc_example_runs_and_its_log_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/eventlog.md's example, run as written with ``STATE_EVENT_LOG`` set: the log it
    writes is closed and ``check-log`` matches it."""
    from pagedstate.models.checklog import check_file

    doc = README.parent / "docs" / "eventlog.md"
    (code,) = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)[:1]
    log = tmp_path / "events.ndjson"
    monkeypatch.setenv("STATE_EVENT_LOG", str(log))
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/eventlog.md block 0", "exec"), namespace)
    assert namespace["log"] is not None
    result = check_file(str(log), require_footer=True)
    assert result.exit_code == 0, result.text()


def test_integration_doc_loop_runs(tmp_path: Path) -> None:
    """docs/integration.md's loop runs as written, as a script of its own (its dataclass
    needs a module), and ends in its own assertions (resumes happened, KV eviction reached
    the store, invariants and self_check clean)."""
    doc = README.parent / "docs" / "integration.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
    (code,) = [b for b in blocks if "fates" in b]  # the loop; the other blocks run below
    for k, other in enumerate(b for b in blocks if b is not code):
        exec(compile(other, f"docs/integration.md block {k}", "exec"), {})
    script = tmp_path / "integration_doc.py"
    script.write_text(code, encoding="utf-8")
    namespace = runpy.run_path(str(script), run_name="integration_doc")
    fates = namespace["fates"]
    assert isinstance(fates, dict) and fates["checkpoints_kept"] > 0
    resumed = namespace["resumed"]
    assert isinstance(resumed, list) and sum(resumed) > 0


def test_overlap_doc_loop_runs(tmp_path: Path) -> None:
    """docs/overlap.md's overlapped loop runs as written and ends in its own assertions:
    restored slots hold the state of the prefix they resumed (no image was stored from a
    slot a later forward had moved on), a host reader leased settled images, the
    coordinator is idle and every invariant holds."""
    doc = README.parent / "docs" / "overlap.md"
    (code,) = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
    script = tmp_path / "overlap_doc.py"
    script.write_text(code, encoding="utf-8")
    namespace = runpy.run_path(str(script), run_name="overlap_doc")
    checked, leased = namespace["checked"], namespace["leased"]
    assert isinstance(checked, int) and checked > 0
    assert isinstance(leased, int) and leased > 0
