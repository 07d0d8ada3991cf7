"""Planting a bug in one method of a production class, for tests that show a checker
catching it: the method's source with one fragment replaced, compiled in its own module's
namespace and bound to one object (the class itself is left alone)."""

from __future__ import annotations

import inspect
import textwrap
import types
from typing import Any


def edited_method(cls: type, name: str, old: str, new: str) -> Any:
    """``cls.name`` with ``old`` replaced by ``new`` in its source, as a plain function
    (bind it with :func:`plant`). Fails if ``old`` is not in the source exactly once, so a
    plant that no longer applies is noticed."""
    fn = getattr(cls, name)
    src = textwrap.dedent(inspect.getsource(fn))
    assert src.count(old) == 1, (name, old)  # the plant still applies to the source
    module = inspect.getmodule(fn)
    assert module is not None
    ns: dict[str, Any] = {}
    exec(compile(src.replace(old, new), f"<planted {name}>", "exec"), vars(module), ns)
    return ns[name]


def plant(obj: object, name: str, old: str, new: str) -> None:
    """Bind the edited ``type(obj).name`` to ``obj`` only."""
    fn = edited_method(type(obj), name, old, new)
    setattr(obj, name, types.MethodType(fn, obj))
