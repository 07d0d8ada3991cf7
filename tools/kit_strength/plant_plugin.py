"""A pytest plugin (not a conftest) that plants one bug of :mod:`bugs` before any test is
collected: ``KIT_STRENGTH_BUG=<name> PYTHONPATH=tools/kit_strength pytest -p plant_plugin
...``. Unset, empty or ``none``: nothing is planted (the control run)."""

from __future__ import annotations

import os

import bugs

_NAME = os.environ.get("KIT_STRENGTH_BUG", "")
if _NAME and _NAME != "none":
    bugs.plant(bugs.by_name(_NAME))


def pytest_report_header() -> str:
    return f"kit_strength plant: {_NAME or 'none'}"
