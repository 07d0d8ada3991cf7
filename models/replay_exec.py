"""Deprecated path of :mod:`pagedstate.models.replay.executor` (the copy executors of
``pagedstate replay --executor``); it goes in the next release. Importing it warns
(``DeprecationWarning``) and gives the same objects as the new path."""

from __future__ import annotations

import warnings

from pagedstate.models.replay.executor import (
    CPU_MAX_BYTES,
    CUDA_FREE_SHARE,
    EXECUTOR_KINDS,
    POISON,
    UNWRITTEN,
    RestoreMismatch,
    TensorReplayExecutor,
    _divisors,
    _exactly,
    _module,
    choose_slice,
    image_seed,
    make_executor_factory,
)

__all__ = [
    "CPU_MAX_BYTES",
    "CUDA_FREE_SHARE",
    "EXECUTOR_KINDS",
    "POISON",
    "UNWRITTEN",
    "RestoreMismatch",
    "TensorReplayExecutor",
    "_divisors",
    "_exactly",
    "_module",
    "choose_slice",
    "image_seed",
    "make_executor_factory",
]

warnings.warn(
    "pagedstate.models.replay_exec is deprecated: import pagedstate.models.replay.executor",
    DeprecationWarning,
    stacklevel=2,
)
