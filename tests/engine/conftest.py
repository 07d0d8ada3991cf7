"""Engine tests: pagedstate's connector inside vLLM's CPU build (`make engine-check`).

Skipped where vLLM is not installed (`make test` runs in .venv, which has no vLLM). One
reference engine (prefix caching off) runs first in a subprocess; the tests share one engine
with the pagedstate tier, in process (VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    # not collected at all where vLLM is missing (`make test`); `make engine-check` has it
    collect_ignore_glob = ["test_*.py"]

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "vllm_e2e"))

import common as C  # noqa: E402


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="session")
def model_path(workdir: Path) -> str:
    return C.make_model(workdir / "model")


@pytest.fixture(scope="session")
def reference(model_path: str, workdir: Path) -> dict[str, dict[str, Any]]:
    """Every prompt run alone with prefix caching off, in its own process."""
    out = workdir / "reference.json"
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "vllm_e2e" / "common.py"), model_path, str(out)],
        check=True,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    data: dict[str, dict[str, Any]] = json.loads(out.read_text())
    return data
