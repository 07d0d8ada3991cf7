"""Values as tagged JSON: the one encoder of the event log's wire format.

The production coordinator's event log (:mod:`pagedstate.impl.eventlog`) writes call
arguments and results with :func:`encode`; the replay on the reference model
(:mod:`pagedstate.models.checklog`) encodes its own results with it to compare them with the
log, and decodes the log. Each side adds what only it has through ``extra``: the log, the
engine's sequence objects (given an id); the replay, its stand-ins for those sequences, for
values the log could only describe and for the offload index and scratch pool. The format
is in ``docs/eventlog.md``. The format's name and version and the calls a log may hold are
here too, for the same two readers.
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

__all__ = [
    "FORMAT",
    "VERSION",
    "COORDINATOR_CALLS",
    "POOL_CALLS",
    "POOL_KV_CALLS",
    "UNHANDLED",
    "Extra",
    "encode",
    "safe_repr",
]

#: The header's ``format`` field.
FORMAT = "pagedstate-eventlog"
#: The header's ``version`` field.
VERSION = 1

#: Coordinator methods that write a line per call (every public method of the production
#: coordinator but ``pagedstate.impl.eventlog.NOT_LOGGED``; a test checks the two lists
#: cover the class).
COORDINATOR_CALLS: tuple[str, ...] = (
    "applies",
    "attach_midstep_scratch",
    "reserve_midstep",
    "publish_midstep",
    "cancel_midstep",
    "resumable_hit",
    "checkpoint",
    "forget_pending",
    "restore_queued_for",
    "begin_restore",
    "take_checkpoint_ops",
    "complete_previous_batch",
    "settle_completions",
    "has_available_units",
    "ensure_free_units",
    "reserve_transfer_units",
    "release_transfer_units",
    "adopt_transfer_units",
    "suspend_queued_restore",
    "resume_suspended_restore",
    "release_suspended_restore",
    "contains",
    "attach_offload",
    "take_offload_stores",
    "acquire_checkpoint_source",
    "release_offload_store_source",
    "settle_offload_store",
    "has_offload_pins",
    "reclaim_stale_offload_pins",
    "was_reclaimed",
    "unindex",
    "clear_index",
    "checkpoint_fates",
)
#: Pool calls an engine makes for its KV reservations (logged as ``pool.<name>``).
POOL_CALLS: tuple[str, ...] = ("reserve_units", "release_units", "rekey_units", "mark_clean")
#: The pool's KV-cache calls: logged so that a log never hides them, but the reference
#: model's pool has no KV cache, so a log that uses them cannot be replayed.
POOL_KV_CALLS: tuple[str, ...] = ("cache_units", "claim_cached_units", "uncache_units")

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
    other value is an object naming its kind: ``{"tuple": [...]}``, ``{"dict": [[k, v],
    ...]}``, ``{"set": [...]}`` / ``{"frozenset": [...]}`` (sorted by their JSON text),
    ``{"float": "nan" | "inf" | "-inf"}``, ``{"int": n, "type": name, "repr": text}`` (an
    int subclass, such as an ``IntEnum``: its value, type name and repr), ``{"bytes": hex}``,
    ``{"op": [h, gen]}`` (a :class:`StateStoreOperationId`), ``{"store_op": {...}}`` /
    ``{"restore_op": {...}}`` (the op's fields), ``{"lease": {"checkpoint_id", "op",
    "lease_id"}}`` (a :class:`SuspendedCheckpointRestore`). A value none of these covers is
    given to ``extra`` (also for every value nested in a container); if that answers
    :data:`UNHANDLED`, or there is none, it is ``{"object": type name, "repr": repr}``. Owners,
    which may be any hashable, round-trip to equal hashable values (tuples stay tuples).
    Never raises (unless ``extra`` does).
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
    if isinstance(value, int):  # a subclass (an IntEnum, say): its value, type and repr
        return {"int": int(value), "type": t.__qualname__, "repr": safe_repr(value)}
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
