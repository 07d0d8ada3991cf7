"""Trace validation: replay an event log of the production coordinator on the reference model.

An event log (:mod:`pagedstate.impl.eventlog`, format in ``docs/eventlog.md``) is a header
line, one line per public call of the production coordinator (and per KV call of the
engine on its pool), and a footer line. :func:`check_log` rebuilds the configuration the
header describes on the reference model (:mod:`pagedstate.models.reference`), with a
manual clock and stand-ins for the offload index and the scratch slot pool, and replays
every call line in order. Each call is made on the reference with the logged arguments;
the clock answers with the readings the implementation's clock gave during that call, and
the stand-ins with the answers the implementation got. Then the reference's behaviour is
compared with what the log says the implementation did:

- ``n``: the sequence number (1, 2, 3, ...: a dropped, repeated or swapped line shows here);
- ``result``: the return value (JSON-encoded, type-exact) or the error's class and message;
- ``rows``: the table rows the call took, each machine's in order (see
  :func:`normalize_rows` for the two reporting differences it leaves out);
- ``clock``: how many times the call read the clock;
- ``ext``: the calls it made on the offload index and the scratch slot pool, with their
  arguments, in order;
- ``post``: counters of the state after the call.

The first line where anything differs is reported with every field that differs there
(status ``mismatch``). The whole log must be consumed (the ``TraceMatched`` lesson of
CHECKING.md section 3.6): a log without its footer is ``incomplete``, never a pass, and the
footer's call count must equal the calls replayed. A log that cannot be parsed is
``unreadable``; one that uses what the reference model does not have (the pool's KV cache,
re-entrant calls from an eviction callback, store calls made outside the coordinator) is
``unsupported``; both name the line.

``models`` does not import ``impl``: the checker reads JSON only. Both sides encode values
with :func:`pagedstate.spec.wire.encode`, each adding its own values (the log: the engine's
sequences; the replay: its stand-ins), and ``tests/test_eventlog.py`` checks that every
kind of value round-trips.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pagedstate.spec import errors as E
from pagedstate.spec import tables as T
from pagedstate.spec import wire
from pagedstate.spec.errors import BadSpecError, InvalidArgumentError
from pagedstate.spec.types import (
    CheckpointRestoreOp,
    CheckpointStoreOp,
    PagedStateCheckpointSpec,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)
from pagedstate.spec.wire import FORMAT, UNHANDLED, VERSION
from pagedstate.spec.wire import encode as _encode

from . import reference as R

__all__ = [
    "CheckResult",
    "Difference",
    "check_log",
    "check_file",
    "encode",
    "decode",
    "normalize_rows",
    "FORMAT",
    "VERSION",
    "COORDINATOR_CALLS",
    "POOL_CALLS",
    "POOL_KV_CALLS",
]

#: The calls a log may hold (:mod:`pagedstate.spec.wire`, which the event log writes with).
COORDINATOR_CALLS: frozenset[str] = frozenset(wire.COORDINATOR_CALLS)
POOL_CALLS: frozenset[str] = frozenset(wire.POOL_CALLS)
POOL_KV_CALLS: frozenset[str] = frozenset(wire.POOL_KV_CALLS)

#: The largest pool a replay builds: the reference model's pool keeps every free unit in a
#: set, about 60 bytes a unit (16,777,216 units: about 1 GiB), so that an edited header
#: cannot make the checker exhaust memory instead of giving a verdict.
MAX_REPLAY_UNITS = 1 << 24

_HEADER_FIELDS = (
    "spec",
    "num_units",
    "enabled",
    "readable_midstep",
    "offload",
    "offload_sink",
    "scratch",
    "max_ops_per_batch",
    "offload_backlog_cap",
    "forfeit_bound",
    "change_log_size",
)
_OVER_BUDGET = T.SCRATCH.label(T.SCRATCH.step(T.S_QUEUED, "issue", "over_budget"))

# ---------------------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------------------

#: Exit status of ``pagedstate check-log`` per status.
EXIT_CODES = {"matched": 0, "mismatch": 1, "incomplete": 1, "unreadable": 2, "unsupported": 2}


@dataclass(frozen=True)
class Difference:
    """One field of a call line where the reference and the log disagree (JSON-ready)."""

    field: str
    expected: Any
    logged: Any

    def text(self) -> str:
        return f"{self.field}: reference {_dump(self.expected)}, log {_dump(self.logged)}"


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one log.

    Attributes:
        status: ``matched`` (every line consumed and agreed, footer included),
            ``mismatch`` (first disagreement at ``line``), ``incomplete`` (the log ends
            without its footer after ``line - 1`` lines), ``unreadable`` (``line`` cannot be
            parsed) or ``unsupported`` (``line`` uses what the reference model lacks).
        lines: lines read.
        calls: call lines replayed and matched.
        line: the line the verdict is about (1-based), None for ``matched``.
        call: that line's call name, when it has one.
        reason: one sentence.
        differences: for ``mismatch`` on a call line, every field that differs there.
        stopped: the footer's ``stopped`` field (``"max_lines"``: the run went on unlogged).
    """

    status: str
    lines: int
    calls: int
    line: int | None = None
    call: str | None = None
    reason: str = ""
    differences: tuple[Difference, ...] = ()
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "matched"

    @property
    def exit_code(self) -> int:
        """0 matched; 1 mismatch or incomplete; 2 unreadable or unsupported."""
        return EXIT_CODES[self.status]

    def text(self) -> str:
        """The verdict as ``pagedstate check-log`` prints it."""
        if self.ok:
            out = (
                f"check-log: MATCHED: {_count(self.lines, 'line')} read,"
                f" {_count(self.calls, 'call')} replayed on"
                " the reference model; every result, row, clock reading, outside answer and"
                " state counter agrees"
            )
            if self.reason:
                out += f"\ncheck-log: note: {self.reason}"
            if self.stopped is not None:
                out += (
                    f"\ncheck-log: note: logging stopped at {self.stopped} after {self.calls}"
                    " calls; the run went on unlogged and what followed is not checked"
                )
            return out
        where = f"line {self.line}" + (f" ({self.call})" if self.call else "")
        head = f"check-log: {self.status.upper()} at {where}: {self.reason}"
        body = [f"  {d.text()}" for d in self.differences]
        tail = (
            f"  ({_count(self.lines, 'line')} read; {_count(self.calls, 'call')} matched"
            " before it)"
        )
        return "\n".join([head, *body, tail])


def _count(n: int, noun: str) -> str:
    """``1 line``, ``2 lines``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


class _Unreadable(Exception):
    pass


class _Unsupported(Exception):
    pass


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------


class _Seq:
    """A sequence as the log saw it; its fields are set from every line that names it."""

    __slots__ = ("sid", "state_slot", "has_per_req_cache", "__weakref__")

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.state_slot: Any = -1
        self.has_per_req_cache: Any = True

    def __repr__(self) -> str:
        return f"<seq {self.sid}>"


class _Opaque:
    """A value the log could only describe (type name and repr); equal by both."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name = type_name
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Opaque) and (self.type_name, self.text) == (
            other.type_name,
            other.text,
        )

    def __hash__(self) -> int:
        return hash((self.type_name, self.text))


#: The stand-in classes made so far, by type name (and repr, for int subclasses); each
#: cleared past 4096 entries, a bound on the memory of a long, odd log.
_OPAQUE_TYPES: dict[str, type[_Opaque]] = {}
_OPAQUE_INT_TYPES: dict[str, type[_OpaqueInt]] = {}


def _named_subclass(
    cache: dict[str, type[_T]], key: str, base: type[_T], type_name: str, ns: dict[str, Any]
) -> type[_T]:
    """The subclass of ``base`` named ``type_name`` (a ``__qualname__``) with class
    attributes ``ns``, made once per ``key`` (``cache`` is cleared past 4096 entries)."""
    cls = cache.get(key)
    if cls is None:
        if len(cache) >= 4096:
            cache.clear()
        cls = cast(
            "type[_T]",
            type(type_name.rsplit(".", 1)[-1], (base,), {"__slots__": (), **ns}),
        )
        cls.__qualname__ = type_name
        cache[key] = cls
    return cls


def _opaque(type_name: str, text: str) -> _Opaque:
    """A stand-in for a value of type ``type_name`` (a ``__qualname__``) whose repr was
    ``text``: an instance of a subclass of :class:`_Opaque` of that name, so that an error
    message naming the value's type names the original one."""
    return _named_subclass(_OPAQUE_TYPES, type_name, _Opaque, type_name, {})(type_name, text)


class _OpaqueInt(int):
    """An int subclass as the log saw it: its value, type name (the class's) and repr."""

    __slots__ = ()
    _text = ""

    def __repr__(self) -> str:
        return self._text

    def __str__(self) -> str:
        # the plain number, as an IntEnum's str() and an f-string give (Python >= 3.11)
        return int.__repr__(self)


def _opaque_int(n: int, type_name: str, text: str) -> int:
    """A stand-in for an instance of the int subclass ``type_name`` (a ``__qualname__``)
    with value ``n`` and repr ``text``: it encodes, compares and prints as the original."""
    key = f"{type_name}\0{text}"
    return _named_subclass(_OPAQUE_INT_TYPES, key, _OpaqueInt, type_name, {"_text": text})(n)


def _stand_in(value: Any) -> Any:
    """The replay's ``extra`` hook of :func:`pagedstate.spec.wire.encode`: its own stand-ins
    encode as the log wrote their originals."""
    t = type(value)
    if t is _Seq:
        return {
            "seq": value.sid,
            "state_slot": encode(value.state_slot),
            "has_per_req_cache": encode(value.has_per_req_cache),
        }
    if isinstance(value, _Opaque):
        return {"object": value.type_name, "repr": value.text}
    if isinstance(value, _Scripted):
        return {"ext": value.name}
    return UNHANDLED


def encode(value: Any) -> Any:
    """The log's encoding of ``value`` (:func:`pagedstate.spec.wire.encode`, which the
    event log writes with); the replay's own stand-ins encode as the log wrote their
    originals."""
    return _encode(value, _stand_in)


_NAN = float("nan")
_T = TypeVar("_T")

#: An outside object's name in the log: the offload index, the first scratch pool, or the
#: K-th other scratch pool (``scratch#K``, K >= 1).
_EXT_NAME = re.compile(r"offload|scratch|scratch#[1-9][0-9]{0,8}")

_OP_FIELDS = {
    "store_op": ("src_slot", "unit_ids", "total_bytes", "layout_id"),
    "restore_op": ("dst_slot", "unit_ids", "total_bytes", "layout_id"),
    "lease": ("checkpoint_id", "op", "lease_id"),
}


def decode(
    value: Any,
    seq: Callable[[int], _Seq] | None = None,
    ext: Callable[[str], Any] | None = None,
) -> Any:
    """Rebuild the value :func:`encode` (or the log) wrote. ``seq(id)`` supplies the
    replay's sequence object for an id (its fields are then set from the encoding);
    ``ext(name)`` the stand-in for ``{"ext": name}``.

    Raises:
        ValueError: not an encoding of this format.
    """

    def d(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v
        if isinstance(v, list):
            return [d(x) for x in v]
        if not isinstance(v, dict):
            raise ValueError(f"not an encoded value: {v!r}")
        if "seq" in v:
            if set(v) != {"seq", "state_slot", "has_per_req_cache"} or type(v["seq"]) is not int:
                raise ValueError(f"a sequence is {{seq, state_slot, has_per_req_cache}}: {v!r}")
            if seq is None:
                raise ValueError("a sequence where none can be")
            s = seq(v["seq"])
            s.state_slot = d(v["state_slot"])
            s.has_per_req_cache = d(v["has_per_req_cache"])
            return s
        if "int" in v:
            n, type_name, text = v.get("int"), v.get("type"), v.get("repr")
            if set(v) != {"int", "type", "repr"} or type(n) is not int or not (
                isinstance(type_name, str) and isinstance(text, str)
            ):
                raise ValueError(f"an int subclass is {{int, type, repr}}: {v!r}")
            return _opaque_int(n, type_name, text)
        if "object" in v:
            if set(v) != {"object", "repr"} or not all(isinstance(x, str) for x in v.values()):
                raise ValueError(f"an opaque value is {{object, repr}}: {v!r}")
            return _opaque(v["object"], v["repr"])
        if len(v) != 1:
            raise ValueError(f"an encoded value has one tag: {v!r}")
        ((tag, body),) = v.items()
        if tag in ("tuple", "set", "frozenset"):
            if not isinstance(body, list):
                raise ValueError(f"{tag} needs a list: {v!r}")
            items = [d(x) for x in body]
            try:
                return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
            except TypeError as exc:  # an unhashable item: no engine value encodes so
                raise ValueError(f"{tag} of an unhashable item: {exc}") from exc
        if tag == "dict":
            if not (
                isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body)
            ):
                raise ValueError(f"dict needs [key, value] pairs: {v!r}")
            try:
                return {d(k): d(x) for k, x in body}
            except TypeError as exc:  # an unhashable key: no engine value encodes so
                raise ValueError(f"dict with an unhashable key: {exc}") from exc
        if tag == "float":
            if body not in ("nan", "inf", "-inf"):
                raise ValueError(f"float tag is nan, inf or -inf: {v!r}")
            # one NaN object for every logged NaN: a NaN equals nothing, so a NaN owner
            # (a transfer owner, say) is found again only as the same object, which is
            # what an engine passing one constant does (the log cannot tell two NaNs apart)
            return _NAN if body == "nan" else float(body)
        if tag == "bytes":
            if not isinstance(body, str):
                raise ValueError(f"bytes needs hex: {v!r}")
            return bytes.fromhex(body)
        if tag == "op":
            if not (isinstance(body, list) and len(body) == 2):
                raise ValueError(f"op is [prefix_hash, generation]: {v!r}")
            return StateStoreOperationId(d(body[0]), d(body[1]))
        if tag in _OP_FIELDS:
            names = _OP_FIELDS[tag]
            if not (isinstance(body, dict) and set(body) == set(names)):
                raise ValueError(f"{tag} has fields {names}: {v!r}")
            fields = {k: d(body[k]) for k in names}
            if tag == "store_op":
                return CheckpointStoreOp(**fields)
            if tag == "restore_op":
                return CheckpointRestoreOp(**fields)
            return SuspendedCheckpointRestore(**fields)
        if tag == "ext":
            if ext is None or not _EXT_NAME.fullmatch(body if isinstance(body, str) else ""):
                raise ValueError(f"unknown outside object: {v!r}")
            return ext(body)
        raise ValueError(f"unknown tag {tag!r}")

    return d(value)


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


class _Scripted:
    name = ""

    def __init__(self, script: _Script, name: str | None = None) -> None:
        self._script = script
        if name is not None:
            self.name = name


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


def normalize_rows(labels: list[str]) -> dict[str, list[str]]:
    """Rows as the checker compares them: per machine, in the order taken, with a run of
    scratch ``over_budget`` self-loops counted once. Every row must match one for one, and
    each machine's rows in order; two things are left out, because the implementation and
    the reference report them differently by design:

    - **the interleaving of machines within a call.** A pin taken for a restore, an offload
      store or a lease is two rows: the record's ``READY+pin_*`` and the operation's
      (``restore:NONE+begin_restore``, ``offload:NONE+take`` or ``offload:NONE+acquire``).
      The reference records a row when it looks it up, so the operation's row comes first;
      the production store reports each row after its effects are applied, so the record's
      pin comes first and the operation's row once the operation is filed.
    - **repeats of the over-budget self-loop.** When a drain's copy budget runs out with
      scratch stores still queued, the reference looks up ``scratch:QUEUED+issue[over_budget]``
      once per store left queued; the production coordinator reports it once per drain (for
      the first store left queued). Nothing changes phase on that row.
    """
    out: dict[str, list[str]] = {}
    for label in labels:
        rows = out.setdefault(label.split(":", 1)[0], [])
        if label == _OVER_BUDGET and rows and rows[-1] == _OVER_BUDGET:
            continue
        rows.append(label)
    return out


def _fingerprint(c: R.PagedStateCheckpointCoordinator) -> dict[str, int]:
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


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if name not in obj:
        raise _Unreadable(f"{what} has no {name!r} field")
    value = obj[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Unreadable(f"{what}'s {name!r} field is not a {getattr(kind, '__name__', kind)}")
    return value


class _Replay:
    """The reference model configured as a log's header says."""

    def __init__(self, header: dict[str, Any]) -> None:
        if header.get("kind") != "header":
            raise _Unreadable("the first line is not a header (kind: header)")
        if header.get("format") != FORMAT:
            raise _Unreadable(f"format is {header.get('format')!r}, not {FORMAT!r}")
        if header.get("version") != VERSION:
            raise _Unreadable(f"version {header.get('version')!r} is not {VERSION}")
        missing = [k for k in _HEADER_FIELDS if k not in header]
        if missing:
            raise _Unreadable(f"the header lacks {missing}")
        try:
            spec = PagedStateCheckpointSpec.from_wire(header["spec"])
        except (TypeError, BadSpecError) as exc:
            raise _Unreadable(f"the header's spec: {exc}") from exc
        self.clock = _Clock()
        self.script = _Script(self)
        self.offload = _Offload(self.script)
        self.scratch = _Scratch(self.script)
        self.other_scratch: dict[str, _Scratch] = {}
        self.seqs: dict[int, _Seq] = {}
        self.rows = _RowOrder()
        units = header["num_units"]
        if type(units) is int and units > MAX_REPLAY_UNITS:
            raise _Unreadable(
                f"the header's pool has {units:,} units; the reference model replays at most"
                f" {MAX_REPLAY_UNITS:,} (it keeps a set of every free unit)"
            )
        try:
            pool = R.UnitPool(units)
            c = R.PagedStateCheckpointCoordinator(
                pool,
                spec,
                bool(header["enabled"]),
                self.offload if header["offload"] else None,
                bool(header["readable_midstep"]),
                clock=self.clock,
                offload_backlog_cap=header["offload_backlog_cap"],
                forfeit_bound=header["forfeit_bound"],
                change_log_size=header["change_log_size"],
            )
            c.store.offload_sink = bool(header["offload_sink"])
            if header["scratch"]:
                c.attach_midstep_scratch(self.scratch, header["max_ops_per_batch"])
        except E.PagedStateError as exc:
            raise _Unreadable(f"the header's configuration is refused: {exc}") from exc
        c.row_sink = self.rows
        self.coordinator = c

    def _seq(self, sid: int) -> _Seq:
        s = self.seqs.get(sid)
        if s is None:
            s = self.seqs[sid] = _Seq(sid)
        return s

    def _ext(self, name: str) -> Any:
        if name == "offload":
            return self.offload
        if name == "scratch":
            return self.scratch
        # another scratch pool than the first: a stand-in of its own (same script), so
        # that the reference tells it from the attached one as the implementation did
        other = self.other_scratch.get(name)
        if other is None:
            other = self.other_scratch[name] = _Scratch(self.script, name)
        return other

    def decode(self, value: Any) -> Any:
        return decode(value, self._seq, self._ext)

    def replay(self, line: dict[str, Any], n: int) -> tuple[Difference, ...]:
        """Replay one call line; the fields that differ (empty: it matched)."""
        what = "the call line"
        logged_n = _field(line, "n", int, what)
        name = _field(line, "call", str, what)
        args = _field(line, "args", list, what)
        kwargs = line.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise _Unreadable("'kwargs' is not an object")
        rows = _field(line, "rows", list, what)
        if not all(isinstance(r, str) for r in rows):
            raise _Unreadable("'rows' holds a non-string")
        clock = line.get("clock", [])
        ext = line.get("ext", [])
        if not isinstance(clock, list) or not isinstance(ext, list):
            raise _Unreadable("'clock' and 'ext' must be lists")
        for event in ext:
            if not (
                isinstance(event, list)
                and len(event) == 3
                and isinstance(event[0], str)
                and isinstance(event[1], list)
                and isinstance(event[2], dict)
                and len(event[2]) == 1
                and ("ok" in event[2] or "raised" in event[2])
            ):
                raise _Unreadable(f"an 'ext' event is [name, [args], {{ok|raised}}]: {event!r}")
        post = _field(line, "post", dict, what)
        if ("ok" in line) == ("raised" in line):
            raise _Unreadable("a call line must have exactly one of 'ok' and 'raised'")
        if "raised" in line:
            raised = line["raised"]
            if not (isinstance(raised, dict) and set(raised) == {"type", "message"}):
                raise _Unreadable("'raised' must be {type, message}")
        if name.startswith("pool."):
            method = name[5:]
            if method in POOL_KV_CALLS:
                raise _Unsupported(
                    f"{name}: the reference model's pool keeps no KV cache, so a log that uses"
                    " the pool's KV-cache calls cannot be replayed"
                )
            if method not in POOL_CALLS:
                raise _Unreadable(f"unknown pool call {name!r}")
            target: Any = self.coordinator.pool
        else:
            method = name
            if method not in COORDINATOR_CALLS:
                raise _Unreadable(f"unknown call {name!r}")
            target = self.coordinator
        if line.get("depth"):
            raise _Unsupported(
                "a re-entrant call (made inside another call, from the pool's eviction"
                " callback): the reference model's pool fires no evictions to replay it"
            )
        if line.get("outside"):
            raise _Unsupported(
                f"rows were taken outside any logged call before this line ({line['outside']}):"
                " the engine called the store directly, which the log does not record"
            )
        diffs: list[Difference] = []
        if logged_n != n:
            diffs.append(Difference("n", n, logged_n))
        seqs = line.get("seqs") or []
        if not isinstance(seqs, list):
            raise _Unreadable("'seqs' must be a list")
        try:
            for s in seqs:
                self.decode(s)
            call_args = self.decode(args)
            call_kwargs = {str(k): self.decode(v) for k, v in kwargs.items()}
            readings = [self.decode(t) for t in clock]
        except ValueError as exc:
            raise _Unreadable(str(exc)) from exc
        except RecursionError as exc:
            raise _Unreadable("a value nested too deep to decode") from exc
        self.clock.reset(readings)
        self.script.reset(ext)
        self.rows.order.clear()
        try:
            result: tuple[str, Any] = (
                "ok",
                encode(getattr(target, method)(*call_args, **call_kwargs)),
            )
        except Exception as exc:
            result = ("raised", {"type": type(exc).__name__, "message": str(exc)})
        self.script.finish()
        logged = ("ok", line["ok"]) if "ok" in line else ("raised", line["raised"])
        if _dump(result) != _dump(logged):
            diffs.append(Difference("result", {result[0]: result[1]}, {logged[0]: logged[1]}))
        labels = [T.TABLES[m].label(T.TABLES[m].rows[i]) for m, i in self.rows.order]
        if normalize_rows(labels) != normalize_rows(rows):
            diffs.append(Difference("rows", labels, rows))
        if self.clock.reads != len(readings):
            diffs.append(
                Difference("clock", f"{self.clock.reads} reading(s)", f"{len(readings)} reading(s)")
            )
        if self.script.problems:
            diffs.append(Difference("ext", self.script.problems, ext))
        expected_post = _fingerprint(self.coordinator)
        if _dump(expected_post) != _dump(post):
            # only the counters that differ (a missing one shows as null)
            keys = sorted(
                k for k in {*expected_post, *post} if expected_post.get(k) != post.get(k)
            )
            diffs.append(
                Difference(
                    "post",
                    {k: expected_post.get(k) for k in keys},
                    {k: post.get(k) for k in keys},
                )
            )
        return tuple(diffs)


# ---------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------


def check_log(lines: Iterable[str | bytes], *, require_footer: bool = True) -> CheckResult:
    """Replay a log's lines on the reference model and return the verdict (see the module
    docstring). ``lines`` may be a file opened in text or binary mode; trailing newlines
    are ignored. ``require_footer=False`` accepts a log that ends without its footer (a run
    still writing) as a match of what it holds; the verdict still says how far it got.
    Never raises for bad input: every problem is a verdict naming its line."""
    replay: _Replay | None = None
    calls = 0
    lineno = 0
    cut: int | None = None  # the half-written last line of a log still being written
    cut_why = ""
    footer: dict[str, Any] | None = None
    for raw in lines:
        if cut is not None:  # a line after the one taken for half-written: it was not
            return CheckResult("unreadable", cut, calls, cut, None, cut_why)
        lineno += 1
        call: str | None = None
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            # only the last line can lack its newline: one a running engine is writing
            unterminated = not text.endswith("\n")
            being_written = not require_footer and unterminated
            text = text.rstrip("\r\n")
            if not text.strip():
                raise _Unreadable("a blank line")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                if being_written and replay is not None and cut is None:
                    # the last line, unless another comes (then it is reported as is)
                    cut, cut_why = lineno, f"not JSON: {exc.msg} (column {exc.colno})"
                    continue
                hint = ""
                if unterminated and replay is not None:
                    hint = (
                        "; it has no newline: if the log was cut off while being written,"
                        " --allow-unclosed checks the lines before it"
                    )
                raise _Unreadable(f"not JSON: {exc.msg} (column {exc.colno}){hint}") from exc
            except ValueError as exc:  # e.g. an int past Python's digit limit
                raise _Unreadable(f"not readable JSON ({exc})") from exc
            except RecursionError as exc:
                raise _Unreadable("JSON nested too deep to read") from exc
            if not isinstance(obj, dict):
                raise _Unreadable(f"a line must be a JSON object, got {type(obj).__name__}")
            if isinstance(obj.get("call"), str):
                call = obj["call"]
            if footer is not None:
                return CheckResult(
                    "mismatch",
                    lineno,
                    calls,
                    lineno,
                    call,
                    "a line after the footer (the footer closes the log)",
                )
            if replay is None:
                replay = _Replay(obj)
                continue
            if obj.get("kind") == "footer":
                count = _field(obj, "calls", int, "the footer")
                if count != calls:
                    return CheckResult(
                        "mismatch",
                        lineno,
                        calls,
                        lineno,
                        None,
                        f"the footer counts {count} calls; the log holds {calls} call lines",
                        (Difference("calls", calls, count),),
                    )
                footer = obj
                continue
            if "kind" in obj:
                raise _Unreadable(f"unknown line kind {obj['kind']!r}")
            diffs = replay.replay(obj, calls + 1)
        except UnicodeDecodeError as exc:
            return CheckResult(
                "unreadable", lineno, calls, lineno, None, f"not UTF-8 ({exc.reason})"
            )
        except _Unreadable as exc:
            hint = ""
            if replay is None and lineno == 1:
                hint = " (an event log starts with its header line)"
            return CheckResult("unreadable", lineno, calls, lineno, call, f"{exc}{hint}")
        except _Unsupported as exc:
            return CheckResult("unsupported", lineno, calls, lineno, call, str(exc))
        if diffs:
            return CheckResult(
                "mismatch",
                lineno,
                calls,
                lineno,
                call,
                "the reference model disagrees with the logged call",
                diffs,
            )
        calls += 1
    if replay is None:
        return CheckResult(
            "unreadable", lineno, 0, lineno + 1, None, "the log is empty: no header line"
        )
    if footer is None:
        if not require_footer:
            note = "the log has no footer (accepted): only the lines it holds are checked"
            if cut is not None:
                note += f"; its last line, {cut}, is cut off (still being written): not checked"
            return CheckResult("matched", lineno, calls, None, None, note)
        return CheckResult(
            "incomplete",
            lineno,
            calls,
            lineno + 1,
            None,
            f"the log ends after line {lineno} without its footer: the run did not close it"
            " (crashed, killed, or still writing), so calls after the last line may be missing",
        )
    stopped = footer.get("stopped")
    return CheckResult(
        "matched", lineno, calls, None, None, "", (), stopped if isinstance(stopped, str) else None
    )


def check_file(path: str, *, require_footer: bool = True) -> CheckResult:
    """:func:`check_log` over a file (``-``: standard input).

    Raises:
        OSError: the file cannot be opened.
    """
    import sys

    if path == "-":
        return check_log(sys.stdin.buffer, require_footer=require_footer)
    with open(path, "rb") as fh:
        return check_log(fh, require_footer=require_footer)
