"""A replay's knobs (:class:`ReplayConfig`, checked on construction), the placement
policies' syntax (:func:`parse_placement`), a sweep of configurations
(:func:`iter_configs`) and the model lookup through ``pagedstate.gpu`` (``_geometry``)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable
from typing import Any

import attrs

from .errors import AmbiguousModelError, ReplayError
from .trace import TRACE_BLOCK_TOKENS

__all__ = ["ReplayConfig", "iter_configs", "parse_placement"]


def parse_placement(text: str) -> tuple[str, int]:
    """``"end"``, ``"anchor"`` or ``"grid:K"`` (K >= 1 blocks) as ``(kind, K)``.

    Raises:
        ReplayError: anything else.
    """
    if text in ("end", "anchor"):
        return text, 0
    if text.startswith("grid:"):
        k = text[5:]
        if k.isascii() and k.isdigit() and int(k) >= 1:
            return "grid", int(k)
    raise ReplayError(f"placement must be 'end', 'anchor' or 'grid:K' (K >= 1), got {text!r}")


def _positive(name: str, value: Any, minimum: float = 1) -> None:
    if type(value) is not int or value < minimum:
        raise ReplayError(f"{name} must be an int >= {minimum:g}, got {value!r}")


def _rate(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise ReplayError(f"{name} must be a number in [0, 1], got {value!r}")


@attrs.frozen
class ReplayConfig:
    """One replay's knobs. Checked on construction (:class:`ReplayError` names the field).

    Attributes:
        model_id: a model of ``pagedstate.gpu.geometry_ids()``, e.g.
            ``"Qwen/Qwen3-Next-80B-A3B-Instruct"``.
        pool_gib: the unit pool, GiB (2**30 bytes) of KV pages and checkpoint images.
        kv_block_tokens: tokens per KV page (one unit); must divide 512, the trace's block.
        max_running: state slots (concurrent requests).
        chunk_tokens: prefill tokens per request per pass.
        placement: ``"end"``, ``"anchor"`` or ``"grid:K"`` (see :mod:`.run`'s docstring).
        offload: a CPU tier of ``offload_gib`` behind the store.
        abort_rate: probability that a request is aborted at a random point.
        verify: run the reference model in lockstep and check invariants.
        seed: the random aborts' and report losses' seed (the replay is deterministic).
        pass_ms: simulated milliseconds per pass (decode rate ``1000 / pass_ms`` tokens/s).
        offload_gib, offload_delay_ms, offload_loss_rate, offload_timeout_s,
        offload_max_inflight: the CPU tier's capacity, transfer delay, share of lost
            reports, reclaim timeout and operations in flight.
        snapshot_every: with ``verify``, compare whole snapshots every this many passes
            (and at the end).
        occupancy_points: how many pool-occupancy samples to keep (at most).
    """

    model_id: str
    pool_gib: float
    kv_block_tokens: int = 512
    max_running: int = 64
    chunk_tokens: int = 2048
    placement: str = "end"
    offload: bool = False
    abort_rate: float = 0.0
    verify: bool = False
    seed: int = 0
    pass_ms: float = 20.0
    offload_gib: float = 64.0
    offload_delay_ms: float = 5.0
    offload_loss_rate: float = 0.01
    offload_timeout_s: float = 2.0
    offload_max_inflight: int = 8
    snapshot_every: int = 256
    occupancy_points: int = 400

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ReplayError(f"model_id must be a non-empty string, got {self.model_id!r}")
        for name in ("pool_gib", "offload_gib", "pass_ms", "offload_delay_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ReplayError(f"{name} must be a number > 0, got {v!r}")
            if math.isinf(v) or math.isnan(v):
                raise ReplayError(f"{name} must be finite, got {v!r}")
        t = self.offload_timeout_s
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0:
            raise ReplayError(f"offload_timeout_s must be a number > 0, got {t!r}")
        _positive("kv_block_tokens", self.kv_block_tokens)
        if TRACE_BLOCK_TOKENS % self.kv_block_tokens:
            raise ReplayError(
                f"kv_block_tokens must divide the trace's 512-token block, got"
                f" {self.kv_block_tokens}"
            )
        for name in ("max_running", "chunk_tokens", "offload_max_inflight", "snapshot_every"):
            _positive(name, getattr(self, name))
        _positive("occupancy_points", self.occupancy_points, 2)
        if type(self.seed) is not int:
            raise ReplayError(f"seed must be an int, got {self.seed!r}")
        for name in ("abort_rate", "offload_loss_rate"):
            _rate(name, getattr(self, name))
        for name in ("offload", "verify"):
            if type(getattr(self, name)) is not bool:
                raise ReplayError(f"{name} must be a bool, got {getattr(self, name)!r}")
        parse_placement(self.placement)


def iter_configs(
    base: ReplayConfig, pools: Iterable[float], placements: Iterable[str]
) -> list[ReplayConfig]:
    """Every (pool, placement) pair of ``base``, placements outermost."""
    return [attrs.evolve(base, pool_gib=g, placement=p) for p in placements for g in pools]


def _geometry(model_id: str, block_tokens: int) -> Any:
    """The layout of ``model_id`` through ``pagedstate.gpu`` (taken by name: ``models``
    does not import ``gpu`` statically).

    Raises:
        AmbiguousModelError: ``model_id`` is a part of several shipped ids (it lists them).
        ReplayError: no shipped id matches (the message lists the known ones), or the
            model cannot be replayed (a malformed id, a geometry without KV pages).
    """
    gpu = importlib.import_module("pagedstate.gpu.geometry")
    try:
        # an exact id, or a unique case-insensitive part of one ("Qwen3-Next"), as
        # load_geometry and the transfer driver take it
        return gpu.load_geometry(model_id).layout(block_tokens)
    except gpu.AmbiguousGeometryError as e:  # a part of several ids: name them
        raise AmbiguousModelError(model_id, e.matches) from None
    except gpu.UnknownGeometryError:
        ids = gpu.geometry_ids()
        raise ReplayError(
            f"unknown model id {model_id!r} (an exact id or a unique part of one); known:"
            f" {', '.join(sorted(ids))}"
        ) from None
    except Exception as e:  # a malformed id, UnsupportedGeometryError: say which and why
        raise ReplayError(f"model {model_id!r} cannot be replayed: {e}") from None
