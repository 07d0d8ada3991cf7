"""The import rule between the subpackages, checked on every module's source.

- ``pagedstate.spec`` imports nothing else of ours;
- ``pagedstate.impl`` and ``pagedstate.gpu`` import only ``spec`` (and themselves);
- ``pagedstate.models`` imports ``spec`` and itself: it drives the production store and the
  copy engine through the protocols ``spec`` declares, taking them by name at run time;
- ``pagedstate.engines`` may import everything; nothing else of ours imports it.

Every ``import`` statement counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``). The one exception is the deprecated import paths kept for one release,
listed in ``DEPRECATED_PATHS``: each is a shim that only warns and re-exports.

The wheel's package list in ``pyproject.toml`` is checked against the folders too: a
subpackage left out of it would be missing from the installed distribution.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = ("spec", "impl", "gpu", "models", "engines")

#: What each subpackage may import of ours.
ALLOWED: dict[str, frozenset[str]] = {
    "spec": frozenset({"spec"}),
    "impl": frozenset({"spec", "impl"}),
    "gpu": frozenset({"spec", "gpu"}),
    "models": frozenset({"spec", "models"}),
    "engines": frozenset(TOP),
}

#: Old module paths kept for one release: module -> the one subpackage it forwards to.
DEPRECATED_PATHS: dict[str, str] = {
    "models/conformance.py": "engines",
    "models/transfer.py": "impl",
}


def _module_name(path: Path, root: Path) -> list[str]:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return parts


def imports_of(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """Every subpackage of ours that ``path`` imports, as ``(line, top-level folder)``:
    absolute ``pagedstate.X`` imports and relative imports resolved against the module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = _module_name(path, root)
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "pagedstate" and len(parts) > 1:
                    yield node.lineno, parts[1]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "pagedstate":
                    if len(parts) > 1:
                        yield node.lineno, parts[1]
                    else:  # from pagedstate import spec, impl
                        for alias in node.names:
                            yield node.lineno, alias.name
            else:
                base = ["pagedstate", *(here if is_package else here[:-1])]
                up = node.level - 1
                if up >= len(base):
                    yield node.lineno, "<outside pagedstate>"
                    continue
                target = base[: len(base) - up] + (node.module or "").split(".")
                target = [t for t in target if t]
                if len(target) > 1:
                    yield node.lineno, target[1]
                else:  # from .. import impl (in a top-level folder's __init__)
                    for alias in node.names:
                        yield node.lineno, alias.name


def violations(root: Path, exempt: dict[str, str] | None = None) -> list[str]:
    """``path:line: A imports B`` for each import that breaks the rule under ``root``."""
    exempt = DEPRECATED_PATHS if exempt is None else exempt
    found = []
    for top in TOP:
        folder = root / top
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            allowed = ALLOWED[top] | ({exempt[rel]} if rel in exempt else set())
            for line, target in imports_of(path, root):
                if target not in allowed:
                    found.append(f"{rel}:{line}: {top} imports {target}")
    return found


def test_every_module_keeps_the_import_rule() -> None:
    assert violations(ROOT) == []


def test_the_rule_catches_a_planted_import(tmp_path: Path) -> None:
    """The check can fail: an impl module importing the reference model, a spec module
    importing impl by a relative import, and models importing engines are each reported."""
    for top in TOP:
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "impl" / "store.py").write_text(
        "def f():\n    from pagedstate.models.reference import UnitPool\n", encoding="utf-8"
    )
    (tmp_path / "spec" / "types.py").write_text(
        "from ..impl import store\n", encoding="utf-8"
    )
    (tmp_path / "models" / "kit.py").write_text(
        "import pagedstate.engines.conformance\nimport pagedstate.spec\n", encoding="utf-8"
    )
    (tmp_path / "gpu" / "plan.py").write_text(
        "from . import geometry\nfrom pagedstate.spec import errors\n", encoding="utf-8"
    )
    assert sorted(violations(tmp_path, exempt={})) == [
        "impl/store.py:2: impl imports models",
        "models/kit.py:1: models imports engines",
        "spec/types.py:1: spec imports impl",
    ]


@pytest.mark.parametrize("shim", sorted(DEPRECATED_PATHS))
def test_each_exempt_module_is_a_deprecation_shim(shim: str) -> None:
    """The exemption covers only shims: small modules that warn DeprecationWarning."""
    text = (ROOT / shim).read_text(encoding="utf-8")
    assert "DeprecationWarning" in text
    assert len(text.splitlines()) < 120, f"{shim} is more than a shim"


def test_the_wheel_lists_every_subpackage() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    folders = {
        "pagedstate." + ".".join(p.parent.relative_to(ROOT).parts)
        for top in TOP
        for p in (ROOT / top).rglob("__init__.py")
    }
    data = {"pagedstate.gpu.data"}  # package data only (the shipped geometries)
    assert listed - data == folders
