"""Per-call timing of the engine model's calls into the implementation
(:class:`CallTimer`: the single place :class:`~pagedstate.models.replay.engine.Engine`
calls it through) and the timer's own floor (:func:`timer_floor_ns`). How the figures are
measured: :mod:`pagedstate.models.replay.engine`'s docstring."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["CallTimer", "timer_floor_ns"]

_T = TypeVar("_T")
_now = time.perf_counter_ns


class CallTimer:
    """Per-method call timing: :meth:`call` is the single place the engine calls the
    implementation through.

    Args:
        keep_samples: also keep every call's duration and method, in call order
            (``samples``, ``sample_methods``; method ids index ``methods``), so that
            identical deterministic replays can be paired call by call.
    """

    def __init__(self, keep_samples: bool = False) -> None:
        #: method name -> [total ns, calls]
        self.timings: dict[str, list[int]] = {}
        self.keep_samples = keep_samples
        self.samples: array[int] = array("q")
        self.sample_methods: array[int] = array("H")
        self.methods: list[str] = []
        self._ids: dict[str, int] = {}
        self._last_ns = 0
        #: method name -> work beyond one unit per call, credited by the engine after the
        #: call (untimed): the units a pool call names or hands out beyond the first, the
        #: ops a drain returns or a completion publishes, the records an eviction or an
        #: ``unindex`` spends. Calls that do more work take longer for that reason alone;
        #: per-work figures separate that from how the store scales.
        self.extra_work: dict[str, int] = {}

    def credit(self, name: str, extra: int) -> None:
        """Add ``extra`` units of work to ``name`` (see ``extra_work``)."""
        if extra:
            self.extra_work[name] = self.extra_work.get(name, 0) + extra

    def relabel_last(self, old: str, new: str) -> None:
        """Count the last call, made as ``old``, under ``new`` instead (its duration in ns,
        its count and, with ``keep_samples``, its sample's method id): for a call whose kind
        is known only from its outcome (the engine's ``unindex`` split). A name left with no
        call is dropped from ``timings``. Untimed, like the rest of the bookkeeping.

        Raises:
            KeyError: no call was timed as ``old``.
        """
        ns = self.samples[-1] if self.keep_samples else self._last_ns
        self._add(old, -ns, -1)
        if not self.timings[old][1]:
            del self.timings[old]
        self._add(new, ns, 1)
        if self.keep_samples:
            self.sample_methods[-1] = self._method_id(new)

    def _add(self, name: str, ns: int, calls: int) -> None:
        slot = self.timings.get(name)
        if slot is None:
            self.timings[name] = [ns, calls]
        else:
            slot[0] += ns
            slot[1] += calls

    def _method_id(self, name: str) -> int:
        mid = self._ids.get(name)
        if mid is None:
            mid = self._ids[name] = len(self.methods)
            self.methods.append(name)
        return mid

    def call(self, name: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)``, its duration added to ``name``'s total. Only the call sits between
        the two clock reads; the bookkeeping comes after the second."""
        t0 = _now()
        result = fn(*args)
        t1 = _now()
        self._last_ns = t1 - t0
        self._add(name, t1 - t0, 1)
        if self.keep_samples:
            self.samples.append(t1 - t0)
            self.sample_methods.append(self._method_id(name))
        return result


def timer_floor_ns(samples: int = 200_000) -> float:
    """Median ns :meth:`CallTimer.call` reports for a call that does nothing: the part of
    every figure that is the measurement itself (two clock reads and one Python call). The
    median, so that a preempted sample does not move it."""
    timer = CallTimer(keep_samples=True)

    def noop() -> None:
        return None

    for _ in range(samples):
        timer.call("noop", noop)
    return float(sorted(timer.samples)[len(timer.samples) // 2])
