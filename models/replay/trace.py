"""Loading a Mooncake-format request trace for ``pagedstate replay`` (:func:`load_trace`,
checked line by line), where the shipped trace lies (:data:`DEFAULT_TRACE`), and the prefix
hash both engine models give a trace's block id (:func:`prefix_hash`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from .errors import ReplayError, TraceError, _text

__all__ = [
    "DEFAULT_TRACE",
    "MAX_TIMESTAMP_MS",
    "TRACE_BLOCK_TOKENS",
    "TraceRequest",
    "load_trace",
    "prefix_hash",
]

#: Tokens per hash block in the Mooncake traces (their README).
TRACE_BLOCK_TOKENS = 512
#: Arrival times beyond this (ms, about 31 years) are refused as not a trace's.
MAX_TIMESTAMP_MS = 10**12
_MASK63 = (1 << 63) - 1

_REPO = Path(__file__).resolve().parent.parent.parent
#: The Mooncake conversation trace shipped in the checkout, ``<repo>/data/traces/`` (not part
#: of the installed package: pass a path when running from a wheel).
DEFAULT_TRACE = _REPO / "data" / "traces" / "conversation_trace.jsonl"


def prefix_hash(block_id: int) -> int:
    """The prefix hash the engine model uses for a trace's block id (or a pre-populated
    record's number): a bijective 63-bit mix (splitmix64's finaliser, taken mod 2**63).

    A Mooncake trace numbers its prefix blocks 0, 1, 2, ...; an engine's prefix hashes are
    uniformly spread 64-bit values (vLLM hashes the block's tokens). Passing the ids through
    unmixed would make every hash table of the store see a dense run of small ints and the
    pre-populated records a second run that aliases it slot for slot, which no real engine
    produces. Distinct ids give distinct hashes (each step is invertible mod 2**63).
    """
    x = block_id & _MASK63
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK63
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK63
    return x ^ (x >> 31)


@attrs.frozen
class TraceRequest:
    """One trace line (Mooncake format).

    Attributes:
        index: position in the trace (0-based); ``line`` is the 1-based line number.
        timestamp_ms: arrival, milliseconds from the start of the trace.
        input_length, output_length: prompt and generated tokens.
        hash_ids: one id per 512-token prompt block (prefix-chained).
    """

    index: int
    line: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _field_int(d: dict[str, Any], key: str, where: str, minimum: int) -> int:
    if key not in d:
        raise TraceError(f"{where}: missing field {key!r}")
    v = d[key]
    if type(v) is not int or v < minimum:
        raise TraceError(f"{where}: {key!r} must be an int >= {minimum}, got {v!r}")
    return v


def load_trace(path: Path | str, limit: int | None = None) -> list[TraceRequest]:
    """The first ``limit`` requests (all when ``None``) of a Mooncake-format JSONL trace.

    Each non-blank line is an object with ``timestamp`` (ms, int >= 0, non-decreasing),
    ``input_length`` (tokens, int >= 1), ``output_length`` (tokens, int >= 0) and
    ``hash_ids`` (ints >= 0, exactly ``ceil(input_length / 512)`` of them).

    Raises:
        TraceError: the file cannot be read, or a line is malformed (naming file and line).
    """
    if limit is not None and (type(limit) is not int or limit < 1):
        raise ReplayError(f"the request limit must be an int >= 1, got {limit!r}")
    out: list[TraceRequest] = []
    last_ts = 0
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TraceError(f"{path}: cannot read the trace: {e.strerror or e}") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                why = f"{e.reason} at byte {e.start}"
                raise TraceError(f"{where}: not UTF-8 text ({why})") from None
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise TraceError(f"{where}: not JSON ({e})") from None
            if not isinstance(d, dict):
                raise TraceError(f"{where}: expected a JSON object, got {type(d).__name__}")
            ts = _field_int(d, "timestamp", where, 0)
            if ts > MAX_TIMESTAMP_MS:
                raise TraceError(
                    f"{where}: 'timestamp' {ts} ms is beyond {MAX_TIMESTAMP_MS} ms (about 31"
                    " years): not a trace's arrival time"
                )
            n_in = _field_int(d, "input_length", where, 1)
            n_out = _field_int(d, "output_length", where, 0)
            if "hash_ids" not in d:
                raise TraceError(f"{where}: missing field 'hash_ids'")
            ids = d["hash_ids"]
            if not isinstance(ids, list) or not all(
                type(h) is int and 0 <= h <= _MASK63 for h in ids
            ):
                raise TraceError(
                    f"{where}: 'hash_ids' must be a list of ints in [0, 2**63),"
                    f" got {_text(ids, 200)}"
                )
            if len(set(ids)) != len(ids):
                raise TraceError(
                    f"{where}: 'hash_ids' repeats an id: prefix-chained ids name distinct"
                    " prefixes, so one prompt cannot hold the same id twice"
                )
            want = -(-n_in // TRACE_BLOCK_TOKENS)
            if len(ids) != want:
                raise TraceError(
                    f"{where}: {n_in} input tokens need {want} hash ids (512 tokens each),"
                    f" got {len(ids)}"
                )
            if ts < last_ts:
                raise TraceError(f"{where}: timestamp {ts} is before the previous line's {last_ts}")
            last_ts = ts
            out.append(TraceRequest(len(out), lineno, ts, n_in, n_out, tuple(ids)))
    if not out:
        raise TraceError(f"{path}: no requests in the trace")
    return out
