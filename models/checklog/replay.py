"""Replay on the reference: ``_Replay``, the reference model configured as a log's header
says, replays one call line and returns the fields that differ; the calls a log may hold,
the bound on the pool a replay builds, and :func:`normalize_rows` (rows as compared)."""

from __future__ import annotations

from typing import Any

from pagedstate.spec import errors as E
from pagedstate.spec import tables as T
from pagedstate.spec import wire
from pagedstate.spec.errors import BadSpecError
from pagedstate.spec.types import PagedStateCheckpointSpec
from pagedstate.spec.wire import FORMAT, VERSION

from .. import reference as R
from .standins import _Clock, _Offload, _RowOrder, _Scratch, _Script, _Token
from .values import _Seq, decode, encode
from .verdict import Difference, _dump, _Unreadable, _Unsupported

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
#: Header fields that are flags: JSON true or false, nothing coerced ("false" is no flag).
_HEADER_FLAGS = ("enabled", "readable_midstep", "offload", "offload_sink", "scratch")
_OVER_BUDGET = T.SCRATCH.label(T.SCRATCH.step(T.S_QUEUED, "issue", "over_budget"))


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
        flags = [k for k in _HEADER_FLAGS if type(header[k]) is not bool]
        if "on_evict" in header and type(header["on_evict"]) is not bool:
            flags.append("on_evict")
        if flags:
            got = ", ".join(f"{k}: {header[k]!r}" for k in flags)
            raise _Unreadable(f"the header's flags must be true or false, got {got}")
        if "coordinator" in header and type(header["coordinator"]) is not str:
            raise _Unreadable(
                f"the header's coordinator must be a class name, got {header['coordinator']!r}"
            )
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
        if name.startswith("token#"):
            # a completion token: a stand-in answering from the script; the store keeps it
            # (its later queries are scripted on the lines that make them)
            return _Token(self.script, name)
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
            keys = sorted(k for k in {*expected_post, *post} if expected_post.get(k) != post.get(k))
            diffs.append(
                Difference(
                    "post",
                    {k: expected_post.get(k) for k in keys},
                    {k: post.get(k) for k in keys},
                )
            )
        return tuple(diffs)
