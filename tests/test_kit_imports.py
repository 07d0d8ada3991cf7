"""Importing the conformance kit (:mod:`pagedstate.engines.conformance`).

- Without ``hypothesis``, importing the kit (by its path or by the deprecated
  ``pagedstate.models.conformance``) raises ``ModuleNotFoundError`` naming the missing module
  and the extra to install, ``pagedstate[conformance]``, chained from the original error and
  with ``name`` set; ``pytest`` is not needed to import it.
- The deprecated path warns (``DeprecationWarning``, pointing at the importer) and gives the
  very same objects as the new one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

OLD = "pagedstate.models.conformance"
NEW = "pagedstate.engines.conformance"

#: Run in a fresh interpreter: make the modules named in ``BLOCKED`` unimportable (a
#: meta-path finder that answers as a missing distribution does), import ``MODULE``, print
#: what happened as JSON.
_BLOCKED_IMPORT = textwrap.dedent(
    """
    import importlib, json, sys, warnings

    BLOCKED = {blocked!r}
    MODULE = {module!r}

    class Missing:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    assert not any(m.split(".")[0] in BLOCKED for m in sys.modules), "already imported"
    sys.meta_path.insert(0, Missing())
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        importlib.import_module(MODULE)
    except ModuleNotFoundError as exc:
        cause = exc.__cause__
        print(json.dumps({{
            "raised": type(exc).__name__,
            "message": str(exc),
            "name": exc.name,
            "cause": type(cause).__name__ if cause is not None else None,
            "cause_name": getattr(cause, "name", None),
        }}))
    else:
        print(json.dumps({{"raised": None}}))
    """
)


def _import_without(module: str, *blocked: str) -> dict[str, Any]:
    code = _BLOCKED_IMPORT.format(blocked=set(blocked), module=module)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("module", [NEW, OLD])
def test_importing_the_kit_without_hypothesis_says_what_to_install(module: str) -> None:
    got = _import_without(module, "hypothesis")
    assert got["raised"] == "ModuleNotFoundError", got
    assert "pagedstate[conformance]" in got["message"], got
    assert "hypothesis" in got["message"], got
    assert got["name"] == "hypothesis", got
    # chained from the original error (raise ... from exc)
    assert got["cause"] == "ModuleNotFoundError" and got["cause_name"] == "hypothesis", got


def test_the_kit_imports_without_pytest() -> None:
    """The ``conformance`` extra brings pytest for the documented example; the kit itself
    does not need it to import."""
    assert _import_without(NEW, "pytest", "_pytest") == {"raised": None}


def test_the_old_path_warns_and_gives_the_same_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    import pagedstate.engines.conformance as new
    import pagedstate.models

    # a fresh import of the old path (it warns once, when it is first imported)
    monkeypatch.delitem(sys.modules, OLD, raising=False)
    monkeypatch.delattr(pagedstate.models, "conformance", raising=False)
    with pytest.warns(DeprecationWarning) as record:
        import pagedstate.models.conformance as old
    messages = [str(w.message) for w in record if issubclass(w.category, DeprecationWarning)]
    assert any(OLD in m and NEW in m for m in messages), messages
    # stacklevel: the warning points at the importer, not at the shim or importlib
    assert any(w.filename == __file__ for w in record), [w.filename for w in record]

    # the old path does not grow: the names added to the kit since it moved are only there
    added = {"ExhaustiveReport", "EXHAUSTIVE_PLAN", "follower_world", "run_exhaustive"}
    added |= {"run_exhaustive_plan", "replay_trace"}
    assert [n for n in new.__all__ if n not in added] == old.__all__
    names = [n for n in vars(old) if not n.startswith("_") and n not in ("annotations", "warnings")]
    assert set(old.__all__) <= set(names)
    for name in names:
        assert getattr(old, name) is getattr(new, name), name
    # the old module's other names too (not in its __all__)
    for name in ("DEFAULT_CONFIG", "CoordinatorFactory", "PoolFactory", "H", "KNOWN_H"):
        assert getattr(old, name) is getattr(new, name), name


def test_the_profiles_repr_names_only_the_profiles() -> None:
    # A settings repr spells out every default, and Hypothesis picks other defaults under a CI
    # variable: the API reference would differ between a laptop and CI.
    from pagedstate.engines.conformance import PROFILES

    assert repr(PROFILES) == "<conformance profiles ci, dev, fuzz>"
    assert PROFILES["ci"].derandomize and dict(PROFILES).keys() == {"ci", "dev", "fuzz"}
    with pytest.raises(TypeError):
        PROFILES["ci"] = PROFILES["dev"]  # type: ignore[index]


def test_the_lazy_gpu_names_stay_bound_after_first_use() -> None:
    pytest.importorskip("torch")
    import pagedstate.gpu as gpu
    from pagedstate.gpu.tensors import StateTensors

    assert gpu.StateTensors is StateTensors
    assert vars(gpu)["StateTensors"] is StateTensors
