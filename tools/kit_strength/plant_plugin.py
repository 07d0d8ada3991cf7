"""A pytest plugin (not a conftest) that plants one bug of :mod:`bugs` before any test is
collected: ``KIT_STRENGTH_BUG=<name> PYTHONPATH=tools/kit_strength pytest -p plant_plugin
...``. Unset, empty or ``none``: nothing is planted (the control run).
``KIT_STRENGTH_SET=fresh`` plants from :mod:`bugs_fresh` instead (unset or ``original``:
:mod:`bugs`)."""

from __future__ import annotations

import importlib
import os

#: ``KIT_STRENGTH_SET`` -> the module of that set (as ``run.py --set``).
_SETS = {"original": "bugs", "fresh": "bugs_fresh"}

_SET = os.environ.get("KIT_STRENGTH_SET", "") or "original"
if _SET not in _SETS:
    raise ValueError(f"KIT_STRENGTH_SET={_SET!r}: expected one of {', '.join(sorted(_SETS))}")
bugs = importlib.import_module(_SETS[_SET])

_NAME = os.environ.get("KIT_STRENGTH_BUG", "")
if _NAME and _NAME != "none":
    bugs.plant(bugs.by_name(_NAME))


def pytest_report_header() -> str:
    if _SET == "original":
        return f"kit_strength plant: {_NAME or 'none'}"
    return f"kit_strength plant: {_NAME or 'none'} (set {_SET})"
