"""The Python examples of the README and the guides type-check under ``mypy --strict``, as a
user's code would be checked: every public name they import has its real type (a name
typed ``object``, e.g. one loaded lazily by a module ``__getattr__``, fails here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Documents whose ```python blocks are complete programs a user would copy.
DOCS = ["README.md", "docs/integration.md", "docs/overlap.md", "docs/eventlog.md"]


def _blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
            found.append((f"{Path(doc).stem.replace('-', '_')}_block{i}", code))
    return found


def _mypy(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for name, code in files.items():
        (tmp_path / f"{name}.py").write_text(code, encoding="utf-8")
    mypy_path = ROOT / ".venv" / "mypy-path"
    if not mypy_path.is_dir():
        pytest.skip(f"{mypy_path} missing: made by `make setup`, which every make target runs")
    env = dict(os.environ, MYPYPATH=str(mypy_path))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir=/dev/null",
         "--config-file=", "--follow-imports=silent", *sorted(f"{n}.py" for n in files)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )


def test_doc_examples_pass_mypy_strict(tmp_path: Path) -> None:
    blocks = dict(_blocks())
    assert len(blocks) >= 3, "the README and guides have fewer python examples than expected"
    done = _mypy(tmp_path, blocks)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_fails_on_a_name_typed_object(tmp_path: Path) -> None:
    """The check can fail: a module whose ``__getattr__`` hands out a class, with no
    ``TYPE_CHECKING`` import, makes a call to that class an error."""
    lazy = (
        "def __getattr__(name: str) -> object:\n"
        "    if name == 'Thing':\n"
        "        class Thing:\n"
        "            pass\n"
        "        return Thing\n"
        "    raise AttributeError(name)\n"
    )
    done = _mypy(tmp_path, {"lazymod": lazy, "user": "from lazymod import Thing\nThing()\n"})
    assert done.returncode == 1 and "not callable" in done.stdout, done.stdout + done.stderr
