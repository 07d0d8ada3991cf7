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
SPEC H.8): a log without its footer is ``incomplete``, never a pass, and the
footer's call count must equal the calls replayed. A log that cannot be parsed is
``unreadable``; one that uses what the reference model does not have (the pool's KV cache,
re-entrant calls from an eviction callback, store calls made outside the coordinator) is
``unsupported``; both name the line.

``models`` does not import ``impl``: the checker reads JSON only. Both sides encode values
with :func:`pagedstate.spec.wire.encode`, each adding its own values (the log: the engine's
sequences; the replay: its stand-ins), and ``tests/test_eventlog.py`` checks that every
kind of value round-trips.

Its modules: :mod:`.check` (reading a log's lines, :func:`check_log`, :func:`check_file`),
:mod:`.replay` (the reference configured from the header, replaying a call line),
:mod:`.values` (:func:`encode`, :func:`decode` and the stand-in values), :mod:`.standins`
(the outside objects that answer as the implementation's did) and :mod:`.verdict`
(:class:`CheckResult`, :class:`Difference`).
"""

from __future__ import annotations

from pagedstate.spec.wire import FORMAT, VERSION

from .check import check_file, check_log
from .replay import COORDINATOR_CALLS, POOL_CALLS, POOL_KV_CALLS, normalize_rows
from .replay import MAX_REPLAY_UNITS as MAX_REPLAY_UNITS
from .values import _Seq as _Seq
from .values import decode, encode
from .verdict import EXIT_CODES as EXIT_CODES
from .verdict import CheckResult, Difference

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
