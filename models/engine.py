"""Deprecated path of :mod:`pagedstate.models.replay.engine` (the trace-driven engine model
``make bench`` times); it goes in the next release. Importing it warns
(``DeprecationWarning``) and gives the same objects as the new path."""

from __future__ import annotations

import warnings

from pagedstate.models.replay.engine import (
    BLOCK_TOKENS,
    DEFAULT_TRACE,
    KV_OWNER,
    PREPOP_HASH_BASE,
    UNINDEX_DROP,
    UNINDEX_MISS,
    CallTimer,
    Engine,
    EngineConfig,
    EngineResult,
    Request,
    TraceRequest,
    _read_num_free,
    _Seq,
    load_trace,
    prefix_hash,
    resolve_impl,
    run_trace,
    timer_floor_ns,
)

__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_TRACE",
    "KV_OWNER",
    "PREPOP_HASH_BASE",
    "UNINDEX_DROP",
    "UNINDEX_MISS",
    "CallTimer",
    "Engine",
    "EngineConfig",
    "EngineResult",
    "Request",
    "TraceRequest",
    "_Seq",
    "_read_num_free",
    "load_trace",
    "prefix_hash",
    "resolve_impl",
    "run_trace",
    "timer_floor_ns",
]

warnings.warn(
    "pagedstate.models.engine is deprecated: import pagedstate.models.replay.engine",
    DeprecationWarning,
    stacklevel=2,
)
