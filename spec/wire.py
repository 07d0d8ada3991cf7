"""Values as tagged JSON: the one encoder of the event log's wire format.

The production coordinator's event log (:mod:`pagedstate.impl.eventlog`) writes call
arguments and results with :func:`encode`; the replay on the reference model
(:mod:`pagedstate.models.checklog`) encodes its own results with it to compare them with the
log, and decodes the log. Each side adds what only it has through ``extra``: the log, the
engine's sequence objects (given an id); the replay, its stand-ins for those sequences, for
values the log could only describe and for the offload index and scratch pool. The format
is in ``docs/eventlog.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from .types import (
    CheckpointRestoreOp,
    CheckpointStoreOp,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)

__all__ = ["UNHANDLED", "Extra", "encode", "safe_repr"]

#: What an ``extra`` hook returns for a value it leaves to the generic encoding.
UNHANDLED: Any = object()

#: ``extra(value)``: the encoding of a value no built-in rule covers, or :data:`UNHANDLED`.
Extra = Callable[[Any], Any]


def safe_repr(value: object) -> str:
    """``repr(value)``; a repr that raises gives ``<unrepresentable TYPE>`` instead."""
    try:
        return repr(value)
    except Exception:  # a repr that raises must not break the engine's call
        return f"<unrepresentable {type(value).__qualname__}>"


def _sort_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def encode(value: Any, extra: Extra | None = None) -> Any:
    """``value`` as JSON-ready data, exactly enough to rebuild an equal value of the same type.

    ``None``, bools, ints, strs and finite floats are themselves; a list is a JSON array; every
    other value is a one-key object naming its kind: ``{"tuple": [...]}``, ``{"dict": [[k, v],
    ...]}``, ``{"set": [...]}`` / ``{"frozenset": [...]}`` (sorted by their JSON text),
    ``{"float": "nan" | "inf" | "-inf"}``, ``{"bytes": hex}``, ``{"op": [h, gen]}`` (a
    :class:`StateStoreOperationId`), ``{"store_op": {...}}`` / ``{"restore_op": {...}}`` (the
    op's fields), ``{"lease": {"checkpoint_id", "op", "lease_id"}}`` (a
    :class:`SuspendedCheckpointRestore`). A value none of these covers is given to ``extra``
    (also for every value nested in a container); if that answers :data:`UNHANDLED`, or there
    is none, it is ``{"object": type name, "repr": repr}``. Owners, which may be any hashable,
    round-trip to equal hashable values (tuples stay tuples). Never raises (unless ``extra``
    does).
    """
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is list:
        return [encode(x, extra) for x in value]
    if t is tuple:
        return {"tuple": [encode(x, extra) for x in value]}
    if t is StateStoreOperationId:
        return {"op": [encode(value.prefix_hash, extra), encode(value.generation, extra)]}
    if t is CheckpointStoreOp:
        return {
            "store_op": {
                "src_slot": encode(value.src_slot, extra),
                "unit_ids": encode(value.unit_ids, extra),
                "total_bytes": encode(value.total_bytes, extra),
                "layout_id": encode(value.layout_id, extra),
            }
        }
    if t is CheckpointRestoreOp:
        return {
            "restore_op": {
                "dst_slot": encode(value.dst_slot, extra),
                "unit_ids": encode(value.unit_ids, extra),
                "total_bytes": encode(value.total_bytes, extra),
                "layout_id": encode(value.layout_id, extra),
            }
        }
    if t is SuspendedCheckpointRestore:
        return {
            "lease": {
                "checkpoint_id": encode(value.checkpoint_id, extra),
                "op": encode(value.op, extra),
                "lease_id": encode(value.lease_id, extra),
            }
        }
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, float):
        return encode(float(value))
    if isinstance(value, tuple):
        return {"tuple": [encode(x, extra) for x in value]}
    if isinstance(value, list):
        return [encode(x, extra) for x in value]
    if isinstance(value, dict):
        return {"dict": [[encode(k, extra), encode(v, extra)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        tag = "frozenset" if isinstance(value, frozenset) else "set"
        return {tag: sorted((encode(x, extra) for x in value), key=_sort_key)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if extra is not None:
        out = extra(value)
        if out is not UNHANDLED:
            return out
    return {"object": type(value).__qualname__, "repr": safe_repr(value)}
