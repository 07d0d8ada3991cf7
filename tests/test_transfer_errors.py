"""The transfer driver without torch: a run fails up front, before any process is started,
with an error that says torch is needed and what to install (the ``gpu`` extra, which pins
torch), not a bare ``AssertionError`` on a result whose log hides the reason.

Each case runs in a subprocess whose meta-path finder makes ``torch`` unimportable and whose
``subprocess.Popen`` fails the run if it is called (so "before any process" is checked, not
assumed). It needs no torch itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

#: Run first in each child: torch cannot be imported, and no child process may start.
_PRELUDE = """
import importlib.abc
import json
import subprocess
import sys


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
for _m in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
    del sys.modules[_m]


def _no_process(*args, **kwargs):
    raise AssertionError(f"a process was started: {args}")


subprocess.Popen = _no_process

#: The README's example (a slice of Qwen3-Next, gloo on CPU).
CFG = dict(model="Qwen3-Next", slice=(1, 2, 32), block_tokens=128, images=8, window=2,
           slots=2, units=24, receiver_units=33)


def report(call):
    try:
        call()
    except BaseException as e:  # what the caller would see
        out = {"type": type(e).__name__, "bases": [c.__name__ for c in type(e).__mro__],
               "message": str(e)}
    else:
        out = {"type": None}
    print(json.dumps(out))
"""

CASES = {
    # the driver's own path, as an engine imports it
    "spawn_transfer": """
        from pagedstate.impl.transfer import TransferConfig, spawn_transfer
        report(lambda: spawn_transfer(TransferConfig(**CFG), timeout_s=60))
    """,
    # the README's import path (deprecated, forwards to the driver)
    "old path": """
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        from pagedstate.models.transfer import TransferConfig, spawn_transfer
        report(lambda: spawn_transfer(TransferConfig(**CFG), timeout_s=60))
    """,
    # one rank in this process: fails before it joins a process group
    "run_rank": """
        from pagedstate.impl.transfer import TransferConfig, run_rank
        report(lambda: run_rank(0, 2, TransferConfig(**CFG), "file:///nowhere"))
    """,
    "Sender": """
        from pagedstate.impl.transfer import Sender, TransferConfig
        report(lambda: Sender(TransferConfig(**CFG)))
    """,
}


def _child(body: str) -> subprocess.CompletedProcess[str]:
    code = _PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_without_torch_fails_up_front_naming_torch_and_the_extra(case: str) -> None:
    p = _child(CASES[case])
    assert p.returncode == 0, p.stderr
    got: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["type"] == "TorchMissingError", got
    # a TransferError, as every failure of the driver; an ImportError, as a missing module
    assert {"TransferError", "ImportError"} <= set(got["bases"]), got
    assert "torch" in got["message"] and "pip install 'pagedstate[gpu]'" in got["message"], got


def test_the_transfer_benchmark_without_torch_is_a_usage_error_before_any_run() -> None:
    """``python -m pagedstate.models.bench.transfer --backend gloo`` without torch: exit 2,
    the message names torch and the extra, nothing spawned, no traceback."""
    p = _child(
        """
        from pagedstate.models.bench.transfer import main
        try:
            rc = main(["--backend", "gloo", "--quick", "--images", "2"])
        except SystemExit as e:
            rc = e.code
        print(json.dumps({"rc": rc}))
        """
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"rc": 2}
    assert "torch" in p.stderr and "pip install 'pagedstate[gpu]'" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
