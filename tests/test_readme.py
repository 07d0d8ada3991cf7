"""The README's Python example runs as written (docs that show real use must work)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "README has no python example"
    for i, code in enumerate(blocks):
        namespace: dict[str, object] = {}
        exec(compile(code, f"README.md block {i}", "exec"), namespace)
        assert "coord" in namespace
