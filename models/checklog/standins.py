"""The replay world's outside objects: the script of what the implementation got from
outside during a call, and the stand-ins that answer from it (the offload index, the
scratch slot pool, the clock), and the row sink that keeps the order of the rows taken."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pagedstate.spec import errors as E
from pagedstate.spec.errors import InvalidArgumentError

from .values import _Scripted, encode
from .verdict import _dump

if TYPE_CHECKING:
    from .replay import _Replay

# ---------------------------------------------------------------------------------------
# The replay world
# ---------------------------------------------------------------------------------------


class _Script:
    """What the implementation got from outside during the current call, in order."""

    def __init__(self, replay: _Replay) -> None:
        self.replay = replay
        self.events: list[Any] = []
        self.pos = 0
        self.problems: list[str] = []

    def reset(self, events: list[Any]) -> None:
        self.events = events
        self.pos = 0
        self.problems = []

    def peek(self) -> str | None:
        if self.pos < len(self.events):
            name = self.events[self.pos][0]
            return name if isinstance(name, str) else None
        return None

    def call(self, name: str, args: list[Any], default: Callable[[], Any]) -> Any:
        shown = f"{name}({', '.join(_dump(encode(a)) for a in args)})"
        if self.pos >= len(self.events):
            self.problems.append(f"the reference called {shown}; the implementation did not")
            return default()
        event = self.events[self.pos]
        self.pos += 1
        if event[0] != name or _dump(event[1]) != _dump([encode(a) for a in args]):
            self.problems.append(
                f"the reference called {shown} where the implementation called"
                f" {event[0]}({', '.join(_dump(a) for a in event[1])})"
            )
        outcome = event[2]
        if "raised" in outcome:
            raise _error_class(outcome["raised"]["type"])(outcome["raised"]["message"])
        return self.replay.decode(outcome["ok"])

    def finish(self) -> None:
        for event in self.events[self.pos :]:
            self.problems.append(
                f"the implementation called {event[0]}"
                f"({', '.join(_dump(a) for a in event[1])}); the reference did not"
            )


def _error_class(name: str) -> type[Exception]:
    cls = getattr(E, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        return builtin
    return type(name, (RuntimeError,), {})


class _Offload(_Scripted):
    """The offload index, answering as the implementation's did."""

    name = "offload"

    def could_serve(self, prefix_hash: int) -> bool:
        return bool(self._script.call("offload.could_serve", [prefix_hash], lambda: False))

    def __getattr__(self, attr: str) -> Any:
        # ``stats`` exists only where the implementation's index had it (the coordinator
        # reads it with getattr(..., None)): the script says whether it was called.
        if attr == "stats" and self._script.peek() == "offload.stats":
            return lambda: self._script.call("offload.stats", [], dict)
        raise AttributeError(attr)


class _Scratch(_Scripted):
    """The scratch slot pool, answering as the implementation's did."""

    name = "scratch"

    def has_free(self) -> bool:
        return bool(self._script.call("scratch.has_free", [], lambda: False))

    def pop(self) -> int:
        def refuse() -> int:
            raise InvalidArgumentError("no free scratch slot")

        return int(self._script.call("scratch.pop", [], refuse))

    def release(self, slot: int) -> None:
        self._script.call("scratch.release", [slot], lambda: None)


class _Token(_Scripted):
    """A completion token (SPEC D.13), answering ``query()`` as the implementation's did."""

    def query(self) -> bool:
        return bool(self._script.call(f"{self.name}.query", [], lambda: False))

    def synchronize(self) -> None:
        self._script.call(f"{self.name}.synchronize", [], lambda: None)


class _Clock:
    """The implementation's clock readings of the current call, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.readings: list[Any] = []
        self.reads = 0

    def reset(self, readings: list[Any]) -> None:
        self.readings = readings
        self.reads = 0

    def __call__(self) -> float:
        if self.reads < len(self.readings):
            self.now = self.readings[self.reads]
        self.reads += 1
        return self.now


class _RowOrder(set[tuple[str, int]]):
    """A row sink (a set, as the reference expects) that also keeps every row in order."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[tuple[str, int]] = []

    def add(self, item: tuple[str, int]) -> None:
        self.order.append(item)
        super().add(item)
