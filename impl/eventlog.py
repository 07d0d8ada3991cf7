"""Optional event log of the production coordinator: one NDJSON line per public call.

Off by default and free when off: nothing in :mod:`pagedstate.impl` refers to this module,
and a coordinator without :func:`attach` runs its own class methods with no hook, wrapper
or proxy installed. An engine turns it on with one call, after building its coordinator
and before the first call::

    from pagedstate.impl.eventlog import EventLog, attach

    log = EventLog("state-events.ndjson")      # a path, or any text stream
    attach(coordinator, log)                    # writes the header line
    ...                                         # the engine runs unchanged
    log.close()                                 # detaches, writes the footer line

:func:`attach` instruments the coordinator **in place**: every public method of the
coordinator (and ``reserve_units``, ``release_units``, ``rekey_units`` and ``mark_clean``
of its pool, for the engine's own KV reservations) is shadowed by an instance attribute
that writes one line per call, so the engine keeps the objects and references it has.
Calls the coordinator makes internally (the store reserving units, ``applies`` inside
``checkpoint``) are not logged: they are effects of the call that is. ``pagedstate
check-log FILE`` replays the log on the reference model (:mod:`pagedstate.models.checklog`)
and reports the first line where the two disagree. The line format is in
``docs/eventlog.md``.

A line records the call's name, its arguments (encoded at call time: a sequence's
``state_slot`` is read when the call is made), its result or the error it raised, the
table rows it took, in order, as ``Table.label`` strings (through the store's
``on_transition`` hook, chained after any hook set before :func:`attach`), every reading of
the store's clock the call made, every answer the call got from outside the store (the
offload index's ``could_serve`` and ``stats``, the scratch slot pool's ``has_free``,
``pop`` and ``release``, the completion tokens' ``query`` and ``synchronize``, each token
named ``token#K`` in the order the engine passed them, SPEC D.13), and a fingerprint of
the state after the call (counters).

Memory: the log keeps no per-line state. Its only map is sequence object -> stable id
(assigned in first-seen order): weak references for sequences that allow them (an entry
goes when its object does), otherwise strong references in recency order, trimmed past
``seq_memory`` entries to the ones the coordinator still holds as pending boundaries (an
object seen again after it was trimmed gets a new id, which the replay treats exactly as
the coordinator does a sequence with nothing pending). ``max_lines`` bounds the file: after
that many call lines the log writes its footer, marked ``"stopped": "max_lines"``, and
detaches itself, so the coordinator runs uninstrumented from then on. (Rotation is not
offered: a later file cannot be replayed without the calls that built its starting state.)

Not logged: ``snapshot()`` and ``clone()`` (a clone is returned uninstrumented), calls the
engine makes on ``coordinator.store`` directly (rows they take outside any logged call are
flagged on the next line, ``"outside"``, so a replay refuses the log instead of drifting),
and assignments to coordinator attributes. The log is single-threaded, as the coordinator
is. An error writing the log never reaches the engine: the log records it in
:attr:`EventLog.error`, detaches and stops, leaving a file without a footer, which the
checker reports as incomplete.

This module reads a few private fields of its sibling modules (pending boundaries for the
drain's sequence slots and the fingerprint, the bounds and scratch pool for the header);
``tests/test_eventlog.py`` pins them.
"""

from __future__ import annotations

import json
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import IO, Any

import attrs

from pagedstate.spec import OffloadIndex, ScratchSlotPool
from pagedstate.spec import tables as T
from pagedstate.spec.errors import InvalidArgumentError
from pagedstate.spec.wire import (
    COORDINATOR_CALLS,
    FORMAT,
    POOL_CALLS,
    POOL_KV_CALLS,
    UNHANDLED,
    VERSION,
    safe_repr,
)
from pagedstate.spec.wire import encode as _encode

from .coordinator import PagedStateCheckpointCoordinator
from .pool import UnitPool

__all__ = [
    "EventLog",
    "attach",
    "detach",
    "attached_log",
    "encode",
    "FORMAT",
    "VERSION",
    "COORDINATOR_CALLS",
    "POOL_CALLS",
    "POOL_KV_CALLS",
    "NOT_LOGGED",
]

#: Public coordinator methods that are not logged: pure reads of the whole state (or of its
#: counts, SPEC G17), or copies.
NOT_LOGGED = frozenset({"snapshot", "clone", "self_check", "outstanding", "is_idle"})

#: Key under which an attached coordinator holds its log (an instance attribute).
_ATTR = "_pagedstate_eventlog"
_DEFAULT_SEQ_MEMORY = 1 << 16
_MISSING = object()

_LABELS: dict[int, str] = {
    id(row): table.label(row) for table in T.TABLES.values() for row in table.rows
}


def _label(machine: str, row: T.Row) -> str:
    label = _LABELS.get(id(row))
    return label if label is not None else T.TABLES[machine].label(row)


# ---------------------------------------------------------------------------------------
# Values as tagged JSON
# ---------------------------------------------------------------------------------------


def _sequence(seq_id: Callable[[object], int], value: object) -> Any:
    """The log's ``extra`` hook of :func:`pagedstate.spec.wire.encode`: an object with
    ``state_slot`` and ``has_per_req_cache`` is a sequence, ``{"seq": id, "state_slot": ...,
    "has_per_req_cache": ...}``, its id from ``seq_id`` and both fields read now."""
    slot = getattr(value, "state_slot", _MISSING)
    cache = getattr(value, "has_per_req_cache", _MISSING)
    if slot is _MISSING or cache is _MISSING:
        return UNHANDLED
    return {"seq": seq_id(value), "state_slot": encode(slot), "has_per_req_cache": encode(cache)}


def encode(value: Any, seq_id: Callable[[object], int] | None = None) -> Any:
    """``value`` as JSON-ready data (:func:`pagedstate.spec.wire.encode`, the format shared
    with the replay). With ``seq_id``, an object with ``state_slot`` and
    ``has_per_req_cache`` (at any depth) is a sequence: ``{"seq": id, "state_slot": ...,
    "has_per_req_cache": ...}`` with the id from ``seq_id`` and both fields read now. Never
    raises."""
    return _encode(value, None if seq_id is None else partial(_sequence, seq_id))


def _error(exc: BaseException) -> dict[str, str]:
    try:
        message = str(exc)
    except Exception:
        message = safe_repr(exc)
    return {"type": type(exc).__name__, "message": message}


# ---------------------------------------------------------------------------------------
# Sequence ids
# ---------------------------------------------------------------------------------------


class _SeqIds:
    """Sequence object -> stable id, by identity, in first-seen order (see the module
    docstring for the bound)."""

    def __init__(self, limit: int, pending: Callable[[], Any]) -> None:
        self._limit = limit
        self._pending = pending
        self._weak: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._strong: OrderedDict[int, tuple[object, int]] = OrderedDict()
        self._next = 0

    def __len__(self) -> int:
        return len(self._weak) + len(self._strong)

    def _gone(self, key: int, ref: weakref.ref[Any]) -> None:
        entry = self._weak.get(key)
        if entry is not None and entry[0] is ref:
            del self._weak[key]

    def __call__(self, obj: object) -> int:
        key = id(obj)
        entry = self._weak.get(key)
        if entry is not None and entry[0]() is obj:
            return entry[1]
        held = self._strong.get(key)
        if held is not None and held[0] is obj:
            self._strong.move_to_end(key)
            return held[1]
        sid = self._next
        self._next += 1
        try:
            self._weak[key] = (weakref.ref(obj, partial(self._gone, key)), sid)
        except TypeError:  # no weak references (__slots__ without __weakref__)
            self._strong[key] = (obj, sid)
            if len(self._strong) > self._limit:
                self._trim()
        return sid

    def _trim(self) -> None:
        pending = self._pending()
        strong = self._strong
        target = self._limit // 2
        for key in list(strong):
            if len(strong) <= target:
                break
            if key not in pending:
                del strong[key]


# ---------------------------------------------------------------------------------------
# The log
# ---------------------------------------------------------------------------------------


class _Frame:
    __slots__ = ("rows", "clock", "ext")

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.clock: list[Any] = []
        self.ext: list[Any] = []


class EventLog:
    """An NDJSON event log for one coordinator (see the module docstring).

    Args:
        target: a path (the file is created, truncated, and closed by :meth:`close`) or an
            open text stream (written to and flushed, never closed).
        max_lines: stop after this many call lines (then the footer is written and the log
            detaches); ``None``: no bound.
        seq_memory: how many sequences without weak-reference support are remembered
            beyond those with a pending boundary (see the module docstring).

    Raises:
        InvalidArgumentError: ``max_lines`` or ``seq_memory`` is not a positive int.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[str],
        *,
        max_lines: int | None = None,
        seq_memory: int = _DEFAULT_SEQ_MEMORY,
    ) -> None:
        for name, bound in (("max_lines", max_lines), ("seq_memory", seq_memory)):
            if bound is not None and (type(bound) is not int or bound < 1):
                raise InvalidArgumentError(f"{name} must be a positive int, got {bound!r}")
        if isinstance(target, (str, os.PathLike)):
            self._stream: IO[str] = open(target, "w", encoding="utf-8")
            self._owns = True
        else:
            self._stream = target
            self._owns = False
        self.max_lines = max_lines
        self._seq_memory = seq_memory
        #: Call lines written so far (the last line's ``n``).
        self.calls = 0
        #: The first error met writing the log (the log stopped there), or None.
        self.error: BaseException | None = None
        #: Why the log stopped writing: None while it runs, "closed", "max_lines" or "error".
        self.stopped: str | None = None
        self._coordinator: PagedStateCheckpointCoordinator | None = None
        self._frames: list[_Frame] = []
        self._outside: list[str] = []
        self._seq_ids: _SeqIds | None = None
        self._saved: dict[str, Any] = {}
        #: The distinct scratch slot pools seen (the attached one first): a pool is logged
        #: by its place here, so that the replay can tell another pool from the attached
        #: one (``attach_midstep_scratch`` refuses another while slots are out).
        self._scratch_pools: list[Any] = []
        #: Completion tokens seen so far: the next one is logged as ``token#<this>``.
        self._tokens = 0

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def attached(self) -> bool:
        """Whether the log is attached to a coordinator now."""
        return self._coordinator is not None

    @property
    def seq_ids(self) -> int:
        """How many sequence objects the id map holds now."""
        return 0 if self._seq_ids is None else len(self._seq_ids)

    # -- writing ------------------------------------------------------------------------

    def _write(self, obj: dict[str, Any]) -> bool:
        if self.stopped is not None:
            return False
        try:
            self._stream.write(json.dumps(obj, separators=(",", ":")) + "\n")
        except Exception as exc:  # the engine must not fail because its log did
            self.error = exc
            self._stop("error")
            return False
        return True

    def flush(self) -> None:
        """Flush the stream (lines are otherwise buffered as the stream buffers them)."""
        if self.stopped != "error":
            try:
                self._stream.flush()
            except Exception as exc:
                self.error = exc
                self._stop("error")

    def close(self) -> None:
        """Detach, write the footer (``{"kind": "footer", "calls": N}``) and close a file
        the log opened. Idempotent."""
        if self.stopped is None:
            self._write({"kind": "footer", "calls": self.calls})
            self._stop("closed")
        if self._owns and not self._stream.closed:
            try:
                self._stream.close()
            except Exception as exc:
                self.error = self.error or exc
        elif not self._owns and self.stopped != "error":
            self.flush()

    def _stop(self, why: str) -> None:
        if self._coordinator is not None:
            _uninstall(self._coordinator, self)
        self.stopped = why
        if self._owns and why != "error":
            try:
                self._stream.flush()
            except Exception as exc:
                self.error = self.error or exc

    # -- hooks --------------------------------------------------------------------------

    def _hook(self, machine: str, row: T.Row, subject: object) -> None:
        label = _label(machine, row)
        frames = self._frames
        if frames:
            frames[-1].rows.append(label)
        else:
            self._outside.append(label)
        prev = self._saved.get("on_transition")
        if prev is not None:
            prev(machine, row, subject)

    def _line(
        self,
        name: str,
        args: list[Any],
        kwargs: dict[str, Any],
        seqs: list[Any] | None,
        frame: _Frame,
        depth: int,
        outcome: tuple[str, Any],
    ) -> None:
        coordinator = self._coordinator
        if coordinator is None or self.stopped is not None:
            return  # stopped inside this call (max_lines or a write error in a nested call)
        self.calls += 1
        line: dict[str, Any] = {"n": self.calls, "call": name, "args": args}
        if kwargs:
            line["kwargs"] = kwargs
        if seqs is not None:
            line["seqs"] = seqs
        if depth:
            line["depth"] = depth
        line[outcome[0]] = outcome[1]
        line["rows"] = frame.rows
        if frame.clock:
            line["clock"] = [encode(t) for t in frame.clock]
        if frame.ext:
            line["ext"] = frame.ext
        line["post"] = _fingerprint(coordinator)
        if self._outside:
            line["outside"], self._outside = self._outside, []
        if not self._write(line):
            self.calls -= 1
        elif self.max_lines is not None and self.calls >= self.max_lines:
            self._write({"kind": "footer", "calls": self.calls, "stopped": "max_lines"})
            self._stop("max_lines")


def _fingerprint(c: PagedStateCheckpointCoordinator) -> dict[str, int]:
    """Counters of the state after a call (the replay compares them)."""
    store = c.store
    return {
        "free": store.pool.num_free,
        "records": len(store.records),
        "pending": len(c._pending),
        "gen": store.generation,
        "kept": c.checkpoints_kept,
        "dropped": c.checkpoints_dropped,
        "orphaned": c.checkpoints_orphaned,
        "evictions": store.evictions,
        "reclaimed": store.offload_pins_reclaimed,
        "nominations_dropped": store.offload_nominations_dropped,
    }


# ---------------------------------------------------------------------------------------
# Recording what the store reads from outside
# ---------------------------------------------------------------------------------------


class _Clock:
    __slots__ = ("inner", "log")

    def __init__(self, inner: Callable[[], float], log: EventLog) -> None:
        self.inner = inner
        self.log = log

    def __call__(self) -> float:
        t = self.inner()
        frames = self.log._frames
        if frames:
            frames[-1].clock.append(t)
        return t


class _External:
    """Stands in for the offload index or the scratch slot pool: records the calls the
    coordinator makes on it during a logged call; everything else is forwarded."""

    _recorded: frozenset[str] = frozenset()

    def __init__(self, inner: Any, log: EventLog, prefix: str) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name in self._recorded and callable(value):
            return partial(self._call, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __repr__(self) -> str:
        return repr(self._inner)

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        frames = self._log._frames
        if not frames:
            return fn(*args)
        event: list[Any] = [f"{self._prefix}.{name}", [encode(a) for a in args]]
        try:
            result = fn(*args)
        except BaseException as exc:
            event.append({"raised": _error(exc)})
            frames[-1].ext.append(event)
            raise
        event.append({"ok": encode(result)})
        frames[-1].ext.append(event)
        return result


class _Offload(_External):
    _recorded = frozenset({"could_serve", "stats"})


class _Scratch(_External):
    _recorded = frozenset({"has_free", "pop", "release"})


class _Token(_External):
    """A completion token (SPEC D.13): the store keeps this wrapper, so every ``query()``
    and ``synchronize()`` it makes later, inside whichever logged call, is recorded there
    as ``token#K.query`` / ``token#K.synchronize`` with its answer."""

    _recorded = frozenset({"query", "synchronize"})


def _completion_arg(log: EventLog, value: Any) -> tuple[Any, Any]:
    """``complete_previous_batch``'s completion as it is passed on and as it is logged:
    ``None`` as itself; a token (callable ``query`` and ``synchronize``) wrapped in a
    :class:`_Token` named ``token#K`` (K counts the tokens seen) and logged as ``{"ext":
    "token#K"}``; anything else (the call refuses it) as an opaque value with its type name
    and repr, so that the replay is refused with the same error."""
    if value is None:
        return None, None
    if callable(getattr(value, "query", None)) and callable(getattr(value, "synchronize", None)):
        name = f"token#{log._tokens}"
        log._tokens += 1
        return _Token(value, log, name), {"ext": name}
    return value, {"object": type(value).__qualname__, "repr": safe_repr(value)}


def _unwrap_tokens(store: Any) -> None:
    """The store's outstanding tokens without the log's wrappers (detach, clone)."""
    store._completions = [(_inner(token), cids) for token, cids in store._completions]


def _inner(obj: Any) -> Any:
    return object.__getattribute__(obj, "_inner") if isinstance(obj, _External) else obj


# ---------------------------------------------------------------------------------------
# Attaching
# ---------------------------------------------------------------------------------------


def attached_log(coordinator: PagedStateCheckpointCoordinator) -> EventLog | None:
    """The log attached to ``coordinator``, or None."""
    log = coordinator.__dict__.get(_ATTR)
    return log if isinstance(log, EventLog) else None


def _fresh(c: PagedStateCheckpointCoordinator) -> bool:
    store = c.store
    pool = store.pool
    twin = PagedStateCheckpointCoordinator(
        UnitPool(pool.num_units),
        store.spec,
        c.enabled,
        None,
        c.readable_midstep,
        offload_backlog_cap=store._offload_backlog_cap,
        forfeit_bound=store._forfeit_bound,
        change_log_size=store._change_log_size,
    )
    twin.store.offload_sink = store.offload_sink
    # The twin has no scratch pool attached; whether ``c`` has one is not state.
    return (
        attrs.evolve(c.snapshot(), scratch_free=None) == twin.snapshot()
        and store._next_lease_id == 0
        and getattr(pool, "num_cached", 0) == 0
    )


def attach(coordinator: PagedStateCheckpointCoordinator, log: EventLog) -> EventLog:
    """Start logging every public call of ``coordinator`` (and the engine's KV calls on its
    pool) to ``log``, and write the header line. Call it before the coordinator's first call.

    Returns ``log``.

    Raises:
        InvalidArgumentError: ``coordinator`` is not the production coordinator, has a log
            already, or is not fresh (a call changed it already: the replay starts from the
            empty store the header describes); ``log`` is attached elsewhere or stopped.
    """
    if not isinstance(coordinator, PagedStateCheckpointCoordinator):
        raise InvalidArgumentError(
            f"attach needs a pagedstate.impl coordinator, got {type(coordinator).__qualname__}"
        )
    if attached_log(coordinator) is not None:
        raise InvalidArgumentError("this coordinator has an event log attached already")
    if log._coordinator is not None or log.stopped is not None or log.calls:
        raise InvalidArgumentError("an event log serves one coordinator, from its first call")
    if not _fresh(coordinator):
        raise InvalidArgumentError(
            "attach the event log before the coordinator's first call: its state is no longer"
            " the empty state the log's header describes"
        )
    store = coordinator.store
    pool = store.pool
    header = {
        "kind": "header",
        "format": FORMAT,
        "version": VERSION,
        "coordinator": f"{type(coordinator).__module__}.{type(coordinator).__qualname__}",
        "spec": store.spec.to_wire(),
        "num_units": pool.num_units,
        "enabled": coordinator.enabled,
        "readable_midstep": coordinator.readable_midstep,
        "offload": coordinator.offload is not None,
        "offload_sink": store.offload_sink,
        "scratch": coordinator._scratch is not None,
        "max_ops_per_batch": coordinator._max_ops_per_batch,
        "offload_backlog_cap": store._offload_backlog_cap,
        "forfeit_bound": store._forfeit_bound,
        "change_log_size": store._change_log_size,
        "on_evict": getattr(pool, "on_evict", None) is not None,
    }
    if not log._write(header):
        raise InvalidArgumentError(f"the event log cannot be written: {log.error!r}")
    log._seq_ids = _SeqIds(log._seq_memory, lambda: coordinator._pending_of_seq)
    _install(coordinator, log)
    return log


def detach(coordinator: PagedStateCheckpointCoordinator) -> None:
    """Stop logging ``coordinator`` and write its log's footer (as ``log.close()``, which
    also closes a file the log opened). No-op when no log is attached."""
    log = attached_log(coordinator)
    if log is not None:
        log.close()


def _install(c: PagedStateCheckpointCoordinator, log: EventLog) -> None:
    store = c.store
    pool = store.pool
    log._coordinator = c
    saved = log._saved
    saved["on_transition"] = store.on_transition
    saved["clock"] = store.clock
    store.on_transition = log._hook
    store.clock = _Clock(store.clock, log)
    if c.offload is not None:
        c.offload = _Offload(c.offload, log, "offload")
    if c._scratch is not None:
        log._scratch_pools.append(c._scratch)
        c._scratch = _Scratch(c._scratch, log, "scratch")
    cls = type(c)
    for name in COORDINATOR_CALLS:
        setattr(c, name, _wrap(log, c, name, getattr(cls, name).__get__(c), False))
    setattr(c, "clone", partial(_clone, log, cls.clone.__get__(c)))  # noqa: B010
    pcls = type(pool)
    for name in POOL_CALLS + POOL_KV_CALLS:
        method = getattr(pcls, name, None)
        if method is not None:
            setattr(pool, name, _wrap(log, c, name, method.__get__(pool), True))
    c.__dict__[_ATTR] = log


def _uninstall(c: PagedStateCheckpointCoordinator, log: EventLog) -> None:
    store = c.store
    pool = store.pool
    saved = log._saved
    if store.on_transition == log._hook:
        store.on_transition = saved.get("on_transition")
    if isinstance(store.clock, _Clock) and store.clock.log is log:
        store.clock = saved["clock"]
    c.offload = _inner(c.offload)
    c._scratch = _inner(c._scratch)
    _unwrap_tokens(store)
    for name in (*COORDINATOR_CALLS, "clone"):
        c.__dict__.pop(name, None)
    for name in POOL_CALLS + POOL_KV_CALLS:
        pool.__dict__.pop(name, None)
    c.__dict__.pop(_ATTR, None)
    log._coordinator = None
    log._frames.clear()


def _clone(log: EventLog, clone: Callable[[], Any]) -> Any:
    """``coordinator.clone()``, returned without the log's wrappers, hook and proxies."""
    c = clone()
    for name in (*COORDINATOR_CALLS, "clone", _ATTR):
        c.__dict__.pop(name, None)
    for name in POOL_CALLS + POOL_KV_CALLS:
        c.store.pool.__dict__.pop(name, None)
    if c.store.on_transition == log._hook:
        c.store.on_transition = log._saved.get("on_transition")
    if isinstance(c.store.clock, _Clock):
        c.store.clock = c.store.clock.inner
    c.offload = _inner(c.offload)
    c._scratch = _inner(c._scratch)
    _unwrap_tokens(c.store)
    return c


_EXTERNAL_ARGS = {
    "attach_offload": ("offload", "index"),
    "attach_midstep_scratch": ("scratch", "slot_pool"),
}


def _external_arg(log: EventLog, kind: str, value: Any) -> Any:
    """How an ``attach_*`` call's offload index or scratch pool is logged: ``None`` as
    itself; an offload index (any object) as ``{"ext": "offload"}``; a scratch pool as
    ``{"ext": "scratch"}`` for the first pool seen and ``{"ext": "scratch#K"}`` for the K-th
    other one; a value that is no scratch pool (the call refuses it) as an opaque value with
    its type name and repr, whatever it is (a sequence or a set rebuilt from its encoding
    would print otherwise), so that the replay is refused with the same message."""
    if value is None:
        return None
    if kind != "scratch":
        if not isinstance(_inner(value), OffloadIndex):
            return {"object": type(value).__qualname__, "repr": safe_repr(value)}
        return {"ext": kind}
    pool = _inner(value)
    if not isinstance(pool, ScratchSlotPool):
        return {"object": type(value).__qualname__, "repr": safe_repr(value)}
    known = log._scratch_pools
    k = next((i for i, seen in enumerate(known) if seen is pool), None)
    if k is None:
        k = len(known)
        known.append(pool)
    return {"ext": "scratch" if k == 0 else f"scratch#{k}"}


def _wrap(
    log: EventLog,
    c: PagedStateCheckpointCoordinator,
    name: str,
    fn: Callable[..., Any],
    on_pool: bool,
) -> Callable[..., Any]:
    label = f"pool.{name}" if on_pool else name
    passthrough_nested = on_pool or name == "applies"
    drain = name == "take_checkpoint_ops"
    completes = name == "complete_previous_batch"
    external, ext_param = _EXTERNAL_ARGS.get(name, (None, ""))
    frames = log._frames
    pool = c.store.pool if on_pool else None

    def pop(frame: _Frame) -> None:
        if frames and frames[-1] is frame:
            frames.pop()

    def logged(*args: Any, **kwargs: Any) -> Any:
        depth = len(frames)
        if (
            (depth and passthrough_nested)
            or log.stopped is not None
            or (pool is not None and getattr(pool, "_store_calls", 0))
        ):
            # The store or coordinator calling its own pool (inside a logged call, or the
            # store called directly: its rows are flagged "outside"), or ``applies`` from
            # inside a coordinator call: an effect of a call, not a call of the engine's.
            return fn(*args, **kwargs)
        if external == "scratch":
            # The attached pool, named again by the engine: the coordinator holds the log's
            # wrapper of it, which is what the call must see to know it for the same pool.
            current = c._scratch
            if isinstance(current, _External):
                inner = _inner(current)
                if args and args[0] is inner:
                    args = (current, *args[1:])
                elif kwargs.get(ext_param, None) is inner:
                    kwargs = {**kwargs, ext_param: current}
        seq_id = log._seq_ids
        enc_args = [encode(a, seq_id) for a in args]
        enc_kwargs = {k: encode(v, seq_id) for k, v in kwargs.items()}
        if external is not None:
            # The offload index or scratch pool itself is not data: the replay puts a
            # stand-in there that answers what this one answered (each call's "ext").
            if args:
                enc_args[0] = _external_arg(log, external, args[0])
            elif ext_param in kwargs:
                enc_kwargs[ext_param] = _external_arg(log, external, kwargs[ext_param])
        if completes and (args or "completion" in kwargs):
            # The token is not data: the store keeps a wrapper that records its answers.
            if args:
                token, enc_args[0] = _completion_arg(log, args[0])
                args = (token, *args[1:])
            else:
                token, enc_kwargs["completion"] = _completion_arg(log, kwargs["completion"])
                kwargs = {**kwargs, "completion": token}
        seqs = [encode(s, seq_id) for s, _h in c._pending.values()] if drain else None
        frame = _Frame()
        frames.append(frame)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            pop(frame)
            log._line(label, enc_args, enc_kwargs, seqs, frame, depth, ("raised", _error(exc)))
            raise
        pop(frame)
        if external == "offload" and c.offload is not None and not isinstance(
            c.offload, _External
        ):
            c.offload = _Offload(c.offload, log, "offload")
        elif external == "scratch" and c._scratch is not None and not isinstance(
            c._scratch, _External
        ):
            c._scratch = _Scratch(c._scratch, log, "scratch")
        log._line(label, enc_args, enc_kwargs, seqs, frame, depth, ("ok", encode(result)))
        return result

    logged.__name__ = name
    logged.__doc__ = fn.__doc__
    logged.__wrapped__ = fn  # type: ignore[attr-defined]
    return logged
