"""The replay engine's store calls (the mixin :class:`_LockstepCalls` of
:class:`~pagedstate.models.replay.run.ReplayEngine`): every call made on the production
store, timed, and with ``verify`` on the reference too, the answers compared; the snapshot
and invariant check; and the production pool as the copy executor sees it."""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from pagedstate.spec.snapshot import check_invariants

from .errors import Divergence, _text
from .parts import _Req, _Side

if TYPE_CHECKING:
    from .run import ReplayEngine


class _LockstepCalls:
    """The calls section of :class:`~pagedstate.models.replay.run.ReplayEngine` (which
    sets every attribute declared here)."""

    prod: _Side
    ref: _Side | None
    step: int
    last_call: str
    samples: dict[str, array[int]]
    c: dict[str, int]

    # -- calls ------------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Any:
        """Call ``name`` on the production side (timed), and on the reference with
        ``verify``; raise :class:`Divergence` when the answers (or raised errors) differ."""
        fn = self.prod.fns[name]
        step = self.step
        self.step = step + 1
        self.last_call = name
        err: BaseException | None = None
        t0 = time.perf_counter_ns()
        try:
            got = fn(*args)
        except Exception as e:  # compared with the reference's, then re-raised
            got, err = None, e
        t1 = time.perf_counter_ns()
        s = self.samples.get(name)
        if s is None:
            s = self.samples[name] = array("q")
        s.append(t1 - t0)
        if self.ref is not None:
            rerr: BaseException | None = None
            try:
                want = self.ref.fns[name](*args)
            except Exception as e:
                want, rerr = None, e
            if (err is None) != (rerr is None) or (
                err is not None and type(err).__name__ != type(rerr).__name__
            ):
                raise Divergence(
                    step, self._call_text(name, args), _text(err or got), _text(rerr or want)
                )
            if err is None and got != want:
                raise Divergence(step, self._call_text(name, args), _text(got), _text(want))
        if err is not None:
            raise err
        return got

    @staticmethod
    def _call_text(name: str, args: tuple[Any, ...]) -> str:
        shown = [
            f"<request {a.t.index} (line {a.t.line})>" if isinstance(a, _Req) else _text(a, 200)
            for a in args
        ]
        return f"{name}({', '.join(shown)})"

    def _compare_snapshots(self) -> None:
        s = self.prod.coordinator.snapshot()
        bad = check_invariants(s)
        if bad:
            raise Divergence(self.step, "check_invariants(production snapshot)", _text(bad), "[]")
        if self.ref is not None:
            r = self.ref.coordinator.snapshot()
            if s != r:
                diff = (
                    [
                        f.name
                        for f in attrs.fields(type(s))
                        if getattr(s, f.name) != getattr(r, f.name)
                    ]
                    if attrs.has(type(s))
                    else []
                )
                raise Divergence(
                    self.step,
                    f"snapshot() (fields differing: {', '.join(diff) or '?'})",
                    _text({f: getattr(s, f) for f in diff} if diff else s),
                    _text({f: getattr(r, f) for f in diff} if diff else r),
                )
        self.c["snapshots_compared"] += 1


class _ExecutorPool:
    """The production pool as the copy executor sees it: reads go to the pool itself;
    ``mark_clean`` (the executor zeroed freed units, SPEC G10) goes through the engine's
    ``_call``, so it is timed and, with ``verify``, made on the reference too."""

    def __init__(self, engine: ReplayEngine) -> None:
        self._engine = engine
        self._pool = engine.prod.pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def mark_clean(self, unit_ids: Iterable[int]) -> None:
        self._engine._call("pool.mark_clean", list(unit_ids))
