"""Generate the API reference (HTML, pdoc) into ``docs/api/``, or check that it is fresh.

    python tools/api_docs.py --out docs/api      # write (``make docs``)
    python tools/api_docs.py --check docs/api    # exit 1 if docs/api differs (``make docs-check``)

Every public module of the five subpackages is documented (a module is public when no part of
its dotted name starts with ``_``), except the deprecated import paths kept for one release
and ``__main__`` modules. Docstrings are reStructuredText (the project's convention). The
pages carry no source and no search index, so they stay small and change only when a public
docstring or signature does; the pdoc version is pinned in pyproject.toml's ``dev`` extra.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib
import os
import pkgutil
import sys
import tempfile
import warnings
from pathlib import Path

PACKAGES = ["pagedstate.spec", "pagedstate.impl", "pagedstate.gpu", "pagedstate.models",
            "pagedstate.engines"]
#: Deprecated import paths (shims that only warn and re-export) and modules that need an
#: engine installed: not documented.
SKIP = {
    "pagedstate.models.conformance",
    "pagedstate.models.transfer",
    "pagedstate.models.engine",
    "pagedstate.models.replay_exec",
    "pagedstate.models.replay_cli",
    "pagedstate.models.bench_explore",
    "pagedstate.models.bench_replay",
    "pagedstate.models.bench_transfer",
    "pagedstate.engines.vllm.connector",  # imports vLLM (in .venv-vllm only)
}
SKIP_PREFIXES: tuple[str, ...] = ()


def public_modules() -> list[str]:
    """Every public module name under PACKAGES, sorted."""
    found = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.append(name)
        for info in pkgutil.walk_packages(package.__path__, prefix=name + "."):
            parts = info.name.split(".")
            if any(p.startswith("_") for p in parts) or info.name in SKIP:
                continue
            if info.name.startswith(SKIP_PREFIXES):
                continue
            found.append(info.name)
    return sorted(set(found))


def render(out: Path) -> None:
    import pdoc
    import pdoc.render

    os.environ.setdefault("TRITON_INTERPRET", "1")
    modules = public_modules()
    for name in modules:  # load lazily exported names, so pdoc sees them as members
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            getattr(module, attr, None)
    pdoc.render.configure(
        docformat="restructuredtext", show_source=False, search=False,
        footer_text="pagedstate API reference",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # pdoc repeats a package it reached both by name and by walking its parent, and it
        # cannot evaluate ``array[int]`` on Python 3.11 (the page shows the text instead).
        warnings.filterwarnings("ignore", message="The module specification", module="pdoc")
        warnings.filterwarnings("ignore", message="Error parsing type annotation.*array",
                                module="pdoc")
        # the vLLM connector's module needs vLLM: pdoc lists it in its package and warns
        warnings.filterwarnings("ignore", message="Couldn't import pagedstate.engines.vllm")
        # pdoc also walks a package's submodules itself: exclude the skipped ones by name.
        excluded = [f"!{name.replace('.', '[.]')}$" for name in sorted(SKIP)]
        pdoc.pdoc(*modules, *excluded, output_directory=out)
    # Defaults that are paths in the checkout (the shipped trace) would name the folder the
    # pages were made in: write the checkout's root as <checkout>, the same everywhere.
    root = str(Path(__file__).resolve().parent.parent)
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        if root in text:
            page.write_text(text.replace(root, "&lt;checkout&gt;"), encoding="utf-8")


def _differences(a: Path, b: Path) -> list[str]:
    files_a = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    diff = [f"missing: {n}" for n in sorted(files_b - files_a)]
    diff += [f"not generated any more: {n}" for n in sorted(files_a - files_b)]
    diff += [
        f"stale: {n}" for n in sorted(files_a & files_b)
        if not filecmp.cmp(a / n, b / n, shallow=False)
    ]
    return diff


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # A set's repr (a default value on a page) follows string hashing: fix the seed, so
        # the pages are the same from run to run.
        env = dict(os.environ, PYTHONHASHSEED="0")
        args = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *args], env)
    parser = argparse.ArgumentParser(prog="api_docs", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="write the pages into this folder")
    group.add_argument("--check", type=Path, help="exit 1 if this folder is not fresh")
    args = parser.parse_args(argv)
    if args.out is not None:
        if args.out.exists():
            for p in sorted(args.out.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
        render(args.out)
        count = sum(1 for p in args.out.rglob("*.html"))
        print(f"api_docs: {count} pages in {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        render(Path(tmp))
        diff = _differences(args.check, Path(tmp))
    if diff:
        print(f"api_docs: {args.check} is stale (run `make docs`):", file=sys.stderr)
        for line in diff:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"api_docs: {args.check} is fresh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
