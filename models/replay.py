"""Replay a real request trace through the checkpoint store (``pagedstate replay``).

The engine model here is what a user runs to see what prefix caching of recurrent state buys
on a real workload, and to check a store under it. It drives the production store (taken by
module name at run time, ``pagedstate.impl`` by default) through the calls an engine makes
(SPEC D.1), on a simulated clock that respects the trace's timestamps, and optionally runs the
reference model in lockstep (``verify``): every call is made on both and the first
disagreement stops the run with the step, the call and both answers.

What it models
--------------
- **Geometry.** A model of ``model_geometries.json`` (through ``pagedstate.gpu``'s geometry
  loader) sets the bytes of one unit (``kv_block_tokens`` tokens of KV in every attention
  layer) and of one checkpoint image (every recurrent layer's conv and SSM state); the pool
  holds ``pool_bytes // unit_bytes`` units and an image takes ``ceil(image / unit)`` of them.
  KV pages and checkpoint images share that one pool (the point of the design: SPEC A).
- **Clock and arrivals.** Requests arrive at their trace ``timestamp`` (ms). One scheduler
  pass takes ``pass_ms`` of simulated time and decodes one token per decoding request (a fixed
  decode rate of ``1000 / pass_ms`` tokens per second). When no request is prefilling, none
  waits and the pass filed no checkpoint, the passes until the next event (an arrival, a
  request finishing, an offload report or reclaim) are taken as one long pass: they would
  make the same store calls (empty drains and completions) at different times, which only
  the CPU tier's pin stamps could see.
- **Admission** (FIFO, up to ``max_running`` state slots, head-of-line): the KV hit is the
  leading prompt blocks the KV prefix index holds, capped so that at least one prompt token
  is computed (a resume point is never at or past the prompt's end, SCENARIOS S5);
  ``r = resumable_hit(seq, hit, hashes)``; the gate ``has_available_units`` protects
  ``hashes[r-1]``; when the image is in the store, ``begin_restore`` queues it into the slot
  only if ``restore_queued_for(slot)`` says a restore will write the slot (S9; the next drain
  must then deliver it, or the run stops); when only the CPU tier has it, the host copy is
  the engine's, not the store's. A resume counts (hits, tokens saved) at the request's first
  forward, once its restore ran: an abort before that counts none. A store answering a resume
  point past the KV hit it was given stops the run. Then ``ensure_free_units`` and the
  request's KV reservation (every page of prompt and output, reserved at once). If nothing
  runs and the request only fits by evicting the image it would resume from, it resumes from
  nothing (``resumes_given_up``); if it does not fit even so, it waits while an offload pin
  holds room (reclaimed after its timeout), else it is ``rejected``.
- **Prefill** in chunks of ``chunk_tokens`` per pass, resumed after block ``r``; a chunk also
  ends at each checkpoint boundary of the placement policy, where ``checkpoint`` is filed:
  ``end`` (the prompt's last full block), ``grid:K`` (every K blocks), ``anchor`` (the deepest
  boundary the prompt shares with an earlier request, plus the prompt's end).
- **Each pass** (SPEC D.1): ``complete_previous_batch``; offload reports due; admission; the
  drain ``take_checkpoint_ops`` (its ops run on the copy executor, if any); the CPU tier takes
  nominated stores; the forward (prefill chunks, decode tokens); completions
  (``forget_pending``, the KV pages go back, the prompt's blocks stay cached in the KV prefix
  index while the pool has room). When the prefix index drops a block, ``unindex`` reports it.
- **Aborts**: each request is drawn for an abort with probability ``abort_rate``, at a random
  point: between the hit and the allocation, before the drain of the pass that admitted it,
  or after 1 to 4 prefill chunks (after its last one if it has fewer). Every drawn abort
  happens. An abort is ``forget_pending`` (it cancels a queued restore and drops a filed
  boundary) and the KV pages go back.
- **CPU tier** (``offload``): a capacity-bounded LRU index of prefix hashes
  (``could_serve``); each pass hands nominated images over (``take_offload_stores``), each
  report arrives ``offload_delay_ms`` later (``release_offload_store_source`` then
  ``settle_offload_store``) except a ``offload_loss_rate`` share, which is lost: the pin is
  reclaimed after ``offload_timeout_s`` (``reclaim_stale_offload_pins``, a forfeit); the run
  goes on until every pin is settled or reclaimed. A CPU-tier load costs nothing here (no
  transfer reservation, no delay), so CPU-tier hit rates are an upper bound.

What it leaves out (and why the figures are still meaningful): KV pages a running request
shares with another running request are charged twice (the pool's tags have one owner), and
the KV prefix index is block-granular (a hash block of 512 tokens is cached or not; its pages
are charged as ``512 / kv_block_tokens`` units of the free count). No decode-time checkpoints
(decoded tokens have no trace hashes), no preemption, no speculative decoding.
"""

from __future__ import annotations

import importlib
import json
import math
import random
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import attrs

from pagedstate.models.engine import prefix_hash
from pagedstate.spec.snapshot import check_invariants

#: Tokens per hash block in the Mooncake traces (their README).
TRACE_BLOCK_TOKENS = 512
#: Arrival times beyond this (ms, about 31 years) are refused as not a trace's.
MAX_TIMESTAMP_MS = 10**12
#: The largest pool the replay models, in units (the pools are Python lists of units).
MAX_POOL_UNITS = 1 << 24
#: Owner-tag prefix of a running request's KV reservation (SPEC A.3).
KV_OWNER = "live-kv"
_MASK63 = (1 << 63) - 1
_GIB = 1 << 30

__all__ = [
    "Divergence",
    "ReplayConfig",
    "ReplayError",
    "ReplayExecutor",
    "ReplayResult",
    "ReplayEngine",
    "TraceError",
    "TraceRequest",
    "load_trace",
    "parse_placement",
    "prefix_hash",
    "replay",
]


class ReplayError(ValueError):
    """Bad input to a replay (trace, model, pool size, option): the message names it."""


class TraceError(ReplayError):
    """A trace line is not a Mooncake request; the message names the file and line."""


class Divergence(AssertionError):
    """The production store and the reference disagreed (``verify``), or an invariant broke.

    Attributes:
        step: the number of store calls made before the one that disagreed (0-based).
        call: the method and its arguments, as text.
        production, reference: both answers (or the exception each raised), as text.
    """

    def __init__(self, step: int, call: str, production: str, reference: str) -> None:
        self.step = step
        self.call = call
        self.production = production
        self.reference = reference
        super().__init__(
            f"divergence at store call {step}: {call}\n  production: {production}\n"
            f"  reference:  {reference}"
        )


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
        placement: ``"end"``, ``"anchor"`` or ``"grid:K"`` (see the module docstring).
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


class ReplayExecutor(Protocol):
    """Runs a drain's ops on real tensors and checks every restore (``--executor``).

    The engine tells it what state each slot holds: ``set_state(slot, key)`` after every
    prefill chunk (``key`` is the prefix hash of a checkpoint boundary, or another int for a
    state between boundaries). ``run_batch`` executes one drain's stores and restores;
    ``check_restored(slot, key)`` raises ``Divergence``-like errors (an ``AssertionError``)
    when the slot does not hold ``key``'s state bit for bit."""

    def set_state(self, slot: int, key: int) -> None: ...

    def run_batch(self, stores: Sequence[Any], restores: Sequence[Any]) -> None: ...

    def check_restored(self, slot: int, key: int) -> None: ...

    def stats(self) -> dict[str, Any]: ...


class _Clock:
    """The simulated clock the stores stamp offload pins with (seconds)."""

    __slots__ = ("now_ms",)

    def __init__(self) -> None:
        self.now_ms = 0.0

    def __call__(self) -> float:
        return self.now_ms / 1000.0


class _CpuTier:
    """The CPU tier's index: an LRU of prefix hashes with a capacity in images."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held: OrderedDict[int, None] = OrderedDict()
        self.stored = 0
        self.dropped = 0

    def could_serve(self, prefix_hash: int) -> bool:
        return prefix_hash in self._held

    def add(self, h: int) -> None:
        held = self._held
        if h in held:
            held.move_to_end(h)
            return
        held[h] = None
        self.stored += 1
        while len(held) > self.capacity:
            held.popitem(last=False)
            self.dropped += 1

    def touch(self, h: int) -> None:
        if h in self._held:
            self._held.move_to_end(h)

    def __len__(self) -> int:
        return len(self._held)


class _Req:
    """A request of the replay; the coordinator's ``SequenceLike``."""

    __slots__ = (
        "t",
        "hashes",
        "state_slot",
        "has_per_req_cache",
        "computed",
        "boundaries",
        "next_boundary",
        "published",
        "generated",
        "kv_units",
        "abort_at",
        "chunks",
        "admitted_pass",
        "resumed",
        "resumed_cpu",
    )

    def __init__(self, t: TraceRequest) -> None:
        self.t = t
        self.hashes = [prefix_hash(h) for h in t.hash_ids]
        self.state_slot = -1
        self.has_per_req_cache = True
        self.computed = 0
        self.boundaries: list[int] = []
        self.next_boundary = 0
        self.published = 0
        self.generated = 0
        self.kv_units: list[int] = []
        self.abort_at: tuple[str, int] | None = None
        self.chunks = 0
        self.admitted_pass = -1
        self.resumed = 0  # blocks resumed; counted at the first forward, once restored
        self.resumed_cpu = False


def _text(value: Any, limit: int = 600) -> str:
    s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _store_module(impl: ModuleType | str) -> ModuleType:
    """The store module ``impl`` (a module or its name), with both classes.

    Raises:
        ReplayError: it cannot be imported, or lacks ``UnitPool`` or
            ``PagedStateCheckpointCoordinator``.
    """
    if isinstance(impl, str):
        try:
            impl = importlib.import_module(impl)
        except (ImportError, ValueError, TypeError) as e:
            raise ReplayError(f"store module {impl!r}: cannot import it ({e})") from None
    missing = [n for n in ("UnitPool", "PagedStateCheckpointCoordinator") if not hasattr(impl, n)]
    if missing:
        raise ReplayError(f"store module {impl.__name__!r} has no {' or '.join(missing)}")
    return impl


class _Side:
    """One implementation: its pool and coordinator, and its methods by call name."""

    def __init__(self, module: ModuleType, units: int, spec: Any, tier: Any, clock: Any) -> None:
        self.module = module
        try:
            self.pool = module.UnitPool(units)
            self.coordinator = module.PagedStateCheckpointCoordinator(
                self.pool, spec, True, tier, False, clock=clock
            )
        except TypeError as e:
            raise ReplayError(
                f"store module {module.__name__!r}: its constructors must take the"
                " reference's arguments, UnitPool(num_units) and"
                " PagedStateCheckpointCoordinator(pool, spec, enabled, offload,"
                f" readable_midstep, *, clock): {e}"
            ) from None
        c, p = self.coordinator, self.pool
        self.fns: dict[str, Callable[..., Any]] = {
            name: getattr(c, name)
            for name in (
                "complete_previous_batch",
                "resumable_hit",
                "has_available_units",
                "begin_restore",
                "restore_queued_for",
                "ensure_free_units",
                "take_checkpoint_ops",
                "checkpoint",
                "forget_pending",
                "unindex",
                "take_offload_stores",
                "release_offload_store_source",
                "settle_offload_store",
                "reclaim_stale_offload_pins",
            )
        }
        self.fns["pool.reserve_units"] = p.reserve_units
        self.fns["pool.release_units"] = p.release_units
        self.fns["pool.num_free"] = lambda: p.num_free
        self.fns["pool.mark_clean"] = p.mark_clean


class _ExecutorPool:
    """The production pool as the copy executor sees it: reads go to the pool itself;
    ``mark_clean`` (the executor zeroed freed units, SPEC G10) goes through the engine's
    ``_call``, so it is timed and, with ``verify``, made on the reference too."""

    def __init__(self, engine: ReplayEngine) -> None:
        self._engine = engine
        self._pool = engine.prod.pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def mark_clean(self, unit_ids: Iterable[int]) -> None:
        self._engine._call("pool.mark_clean", list(unit_ids))


@attrs.define
class ReplayResult:
    """What a replay found; :meth:`to_json` is the ``--json`` document.

    Attributes:
        config: the knobs; ``geometry``: unit and image bytes, units per image, pool units.
        counters: requests, hits, tokens, passes, aborts (see :meth:`summary`).
        fates: ``checkpoint_fates()`` of the production coordinator at the end.
        timings_us: per store method: calls, mean, p50 and p99 microseconds per call.
        occupancy: samples ``[t_s, kv_units, checkpoint_units, cached_kv_units, free_units]``.
        wall_s: wall time of the replay (set-up excluded); ``verified``: whether the
            reference ran in lockstep (and agreed, or the run would have raised).
        executor: the copy executor's statistics (``{}`` without one).
    """

    config: dict[str, Any]
    geometry: dict[str, Any]
    counters: dict[str, int]
    fates: dict[str, int]
    timings_us: dict[str, dict[str, float]]
    occupancy: list[list[float]]
    wall_s: float
    verified: bool
    executor: dict[str, Any]

    def summary(self) -> dict[str, float]:
        """Headline figures: hit rates (blocks and tokens), prefill tokens saved."""
        c = self.counters
        blocks = max(1, c["prompt_blocks"])
        tokens = max(1, c["prompt_tokens"])
        return {
            "requests": c["requests"],
            "completed": c["completed"],
            "aborted": c["aborted"],
            "hit_rate_blocks": (c["hit_blocks"] + c["cpu_hit_blocks"]) / blocks,
            "hbm_hit_rate_blocks": c["hit_blocks"] / blocks,
            "cpu_hit_rate_blocks": c["cpu_hit_blocks"] / blocks,
            "kv_hit_rate_blocks": c["kv_hit_blocks"] / blocks,
            "hit_rate_tokens": c["saved_tokens"] / tokens,
            "prefill_tokens_saved": c["saved_tokens"],
            "prompt_tokens": c["prompt_tokens"],
        }

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document of one run: ``config``, ``geometry`` (bytes, units),
        ``summary`` (rates as fractions, tokens), ``counters``, ``fates``, ``timings_us``
        (microseconds per call), ``occupancy`` (``t_s`` in seconds, the rest in units),
        ``wall_s`` (seconds), ``verified``, ``executor``. JSON-serialisable."""
        return {
            "config": self.config,
            "geometry": self.geometry,
            "summary": self.summary(),
            "counters": self.counters,
            "fates": self.fates,
            "timings_us": self.timings_us,
            "occupancy": {
                "columns": ["t_s", "kv_units", "checkpoint_units", "cached_kv_units", "free_units"],
                "samples": self.occupancy,
            },
            "wall_s": self.wall_s,
            "verified": self.verified,
            "executor": self.executor,
        }


def _geometry(model_id: str, block_tokens: int) -> Any:
    """The layout of ``model_id`` through ``pagedstate.gpu`` (taken by name: ``models``
    does not import ``gpu`` statically)."""
    gpu = importlib.import_module("pagedstate.gpu.geometry")
    try:
        # an exact id, or a unique case-insensitive part of one ("Qwen3-Next"), as
        # load_geometry and the transfer driver take it
        return gpu.load_geometry(model_id).layout(block_tokens)
    except gpu.UnknownGeometryError:
        ids = gpu.geometry_ids()
        raise ReplayError(
            f"unknown model id {model_id!r} (an exact id or a unique part of one); known:"
            f" {', '.join(sorted(ids))}"
        ) from None
    except Exception as e:  # a malformed id, UnsupportedGeometryError: say which and why
        raise ReplayError(f"model {model_id!r} cannot be replayed: {e}") from None


def _percentiles(samples: array[int]) -> tuple[float, float]:
    if not samples:
        return 0.0, 0.0
    s = sorted(samples)
    n = len(s)
    return s[min(n - 1, n // 2)] / 1000.0, s[min(n - 1, (n * 99) // 100)] / 1000.0


class ReplayEngine:
    """The engine model (module docstring) over one trace and one configuration.

    Args:
        config: the knobs.
        trace: the requests, in arrival order (:func:`load_trace`).
        impl: the production module (``UnitPool``, ``PagedStateCheckpointCoordinator``).
        reference: the reference module, used when ``config.verify``.
        executor_factory: builds the copy executor from ``(layout, pool_units, slots,
            pool)``; None runs no device work.
        progress: called with ``(requests finished, total)`` after every pass.

    Raises:
        ReplayError: unknown model, a pool too small for one image or for a request of the
            trace (naming its line), bad knobs.
    """

    def __init__(
        self,
        config: ReplayConfig,
        trace: Sequence[TraceRequest],
        impl: ModuleType | str = "pagedstate.impl",
        reference: ModuleType | str = "pagedstate.models.reference",
        executor_factory: Callable[..., ReplayExecutor] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        if not trace:
            raise ReplayError("the trace has no requests")
        self.config = config
        self.trace = list(trace)
        self.layout = _geometry(config.model_id, config.kv_block_tokens)
        spec = self.layout.spec()
        self.unit_bytes = int(self.layout.page_unit_bytes)
        self.image_units = int(spec.units_per_checkpoint)
        self.units = int(config.pool_gib * _GIB) // self.unit_bytes
        gib = config.pool_gib
        if self.units > MAX_POOL_UNITS:
            raise ReplayError(
                f"a pool of {gib:g} GiB is {self.units:,} units of {self.unit_bytes:,} bytes;"
                f" the replay models at most {MAX_POOL_UNITS:,} units (a smaller pool, or"
                " larger --kv-block-tokens)"
            )
        if self.units < self.image_units:
            raise ReplayError(
                f"a pool of {gib:g} GiB is {self.units} units of {self.unit_bytes:,} bytes;"
                f" one checkpoint image of {config.model_id} needs {self.image_units}"
            )
        self.block_units = TRACE_BLOCK_TOKENS // config.kv_block_tokens
        for t in self.trace:
            need = self._kv_units(t)
            if need > self.units:
                raise ReplayError(
                    f"a pool of {gib:g} GiB ({self.units} units) cannot hold the request at"
                    f" trace line {t.line}: {t.input_length}+{t.output_length} tokens need"
                    f" {need} units of {config.kv_block_tokens} tokens"
                )
        kind, k = parse_placement(config.placement)
        self.placement_kind, self.grid = kind, k
        self.clock = _Clock()
        self.tier: _CpuTier | None = None
        if config.offload:
            cap = max(1, int(config.offload_gib * _GIB) // max(1, int(self.layout.image_bytes)))
            self.tier = _CpuTier(cap)
        mod = _store_module(impl)
        self.prod = _Side(mod, self.units, spec, self.tier, self.clock)
        self.ref: _Side | None = None
        if config.verify:
            self.ref = _Side(_store_module(reference), self.units, spec, self.tier, self.clock)
        self.executor = (
            executor_factory(self.layout, self.units, config.max_running, _ExecutorPool(self))
            if executor_factory is not None
            else None
        )
        self.progress = progress
        self.rng = random.Random(config.seed)
        self.loss_rng = random.Random(config.seed ^ 0x5EED)
        self.step = 0
        #: the store method of the latest call (named when a run stops on an error)
        self.last_call = ""
        #: method -> per-call ns (production), in call order.
        self.samples: dict[str, array[int]] = {}
        self.c: dict[str, int] = dict.fromkeys(
            (
                "requests",
                "completed",
                "aborted",
                "aborted_after_hit",
                "aborted_before_drain",
                "aborted_mid_prefill",
                "rejected",
                "passes",
                "skipped_passes",
                "drains",
                "admission_blocked",
                "prompt_blocks",
                "prompt_tokens",
                "kv_hit_blocks",
                "hits",
                "hit_blocks",
                "cpu_hits",
                "cpu_hit_blocks",
                "saved_tokens",
                "restores_queued",
                "restores_missing",
                "resumes_given_up",
                "restores_checked",
                "checkpoints_filed",
                "unindexed",
                "offload_stores",
                "offload_reports",
                "offload_reports_lost",
                "offload_reclaimed",
                "peak_running",
                "snapshots_compared",
            ),
            0,
        )
        self.c["requests"] = len(self.trace)
        # KV prefix index: live hash -> holders; cached hashes, LRU (oldest first).
        self._live: dict[int, int] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._seen: set[int] = set()  # full-block ids of earlier requests (anchor)
        self._free_slots = list(range(config.max_running))
        self._offload_due: deque[tuple[float, Any, bool]] = deque()
        self._filed = False  # a checkpoint was filed this pass: the next pass drains it
        #: slot -> the prefix hash a queued restore will write into it (executor checks)
        self._expect: dict[int, int] = {}
        self.occupancy: list[list[float]] = []
        self._occ_every_ms = 1.0

    # -- calls ------------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Any:
        """Call ``name`` on the production side (timed), and on the reference with
        ``verify``; raise :class:`Divergence` when the answers (or raised errors) differ."""
        fn = self.prod.fns[name]
        step = self.step
        self.step = step + 1
        self.last_call = name
        err: BaseException | None = None
        t0 = time.perf_counter_ns()
        try:
            got = fn(*args)
        except Exception as e:  # compared with the reference's, then re-raised
            got, err = None, e
        t1 = time.perf_counter_ns()
        s = self.samples.get(name)
        if s is None:
            s = self.samples[name] = array("q")
        s.append(t1 - t0)
        if self.ref is not None:
            rerr: BaseException | None = None
            try:
                want = self.ref.fns[name](*args)
            except Exception as e:
                want, rerr = None, e
            if (err is None) != (rerr is None) or (
                err is not None and type(err).__name__ != type(rerr).__name__
            ):
                raise Divergence(
                    step, self._call_text(name, args), _text(err or got), _text(rerr or want)
                )
            if err is None and got != want:
                raise Divergence(step, self._call_text(name, args), _text(got), _text(want))
        if err is not None:
            raise err
        return got

    @staticmethod
    def _call_text(name: str, args: tuple[Any, ...]) -> str:
        shown = [
            f"<request {a.t.index} (line {a.t.line})>" if isinstance(a, _Req) else _text(a, 200)
            for a in args
        ]
        return f"{name}({', '.join(shown)})"

    def _compare_snapshots(self) -> None:
        s = self.prod.coordinator.snapshot()
        bad = check_invariants(s)
        if bad:
            raise Divergence(self.step, "check_invariants(production snapshot)", _text(bad), "[]")
        if self.ref is not None:
            r = self.ref.coordinator.snapshot()
            if s != r:
                diff = (
                    [
                        f.name
                        for f in attrs.fields(type(s))
                        if getattr(s, f.name) != getattr(r, f.name)
                    ]
                    if attrs.has(type(s))
                    else []
                )
                raise Divergence(
                    self.step,
                    f"snapshot() (fields differing: {', '.join(diff) or '?'})",
                    _text({f: getattr(s, f) for f in diff} if diff else s),
                    _text({f: getattr(r, f) for f in diff} if diff else r),
                )
        self.c["snapshots_compared"] += 1

    # -- sizes and the KV prefix index ------------------------------------------------------

    def _kv_units(self, t: TraceRequest) -> int:
        return -(-(t.input_length + max(1, t.output_length)) // self.config.kv_block_tokens)

    def _num_free(self) -> int:
        return int(self._call("pool.num_free"))

    def _trim_cache(self) -> None:
        cap = self._num_free() // self.block_units
        cached = self._cached
        while len(cached) > cap:
            h, _ = cached.popitem(last=False)
            self.c["unindexed"] += 1
            self._call("unindex", h)

    def _kv_hit(self, req: _Req) -> int:
        cap = (req.t.input_length - 1) // TRACE_BLOCK_TOKENS  # S5: never the prompt's end
        n = 0
        live, cached = self._live, self._cached
        for h in req.hashes[:cap]:
            if h in live or h in cached:
                n += 1
            else:
                break
        return n

    def _hold(self, h: int) -> None:
        if h in self._cached:
            del self._cached[h]
        self._live[h] = self._live.get(h, 0) + 1

    def _drop(self, h: int) -> None:
        """One holder fewer; the last one parks ``h`` as cached at the recently used end.
        Callers drop a prompt's blocks last block first (as vLLM frees them), so the LRU
        evicts a cached prefix from its tail and its head stays reachable longest."""
        left = self._live[h] - 1
        if left:
            self._live[h] = left
        else:
            del self._live[h]
            self._cached[h] = None

    # -- placement ----------------------------------------------------------------------------

    def _boundaries(self, req: _Req, resumed: int) -> list[int]:
        """Checkpoint boundaries (in 512-token blocks) past ``resumed``, ascending."""
        full = req.t.input_length // TRACE_BLOCK_TOKENS
        if self.placement_kind == "end":
            out = [full]
        elif self.placement_kind == "grid":
            out = list(range(self.grid, full + 1, self.grid))
        else:
            seen = self._seen
            deepest = 0
            for i in range(full - 1, -1, -1):
                if req.t.hash_ids[i] in seen:
                    deepest = i + 1
                    break
            out = [deepest, full] if deepest < full else [full]
        return [b for b in out if b > resumed]

    # -- a request's life -------------------------------------------------------------------

    def _abort(self, req: _Req, where: str) -> None:
        self._call("forget_pending", req)
        if req.kv_units:
            self._call("pool.release_units", req.kv_units, (KV_OWNER, req.t.index))
            req.kv_units = []
        for h in reversed(req.hashes[: req.published]):
            self._drop(h)
        self._release_slot(req)
        self.c["aborted"] += 1
        self.c[f"aborted_{where}"] += 1

    def _release_slot(self, req: _Req) -> None:
        if req.state_slot >= 0:
            self._expect.pop(req.state_slot, None)
            self._free_slots.append(req.state_slot)
            self._free_slots.sort(reverse=True)
            req.state_slot = -1

    def _admit(self, req: _Req, idle: bool) -> str:
        """``"ok"``, ``"blocked"`` (no room now) or ``"aborted"``. ``idle``: nothing runs, so
        waiting frees nothing; the request then gives up its resume point if protecting it
        is what keeps it out (the image is evicted instead)."""
        hit = self._kv_hit(req)
        r = self._call("resumable_hit", req, hit, req.hashes) if hit else 0
        if type(r) is not int or not 0 <= r <= hit:
            # S5 rests on this: the KV hit is capped below the prompt's end, and a resume
            # point past it would skip computing the prompt's last tokens
            raise Divergence(
                self.step - 1,
                self._call_text("resumable_hit", (req, hit, req.hashes)),
                _text(r),
                f"an int in [0, {hit}] (the KV hit, capped below the prompt's end: S5)",
            )
        need = self._kv_units(req.t)
        protected = req.hashes[r - 1] if r else None
        if not self._call("has_available_units", need, protected):
            if not (idle and r and self._call("has_available_units", need, None)):
                return "blocked"
            r, protected = 0, None
            self.c["resumes_given_up"] += 1
        slot = self._free_slots.pop()
        req.state_slot = slot
        cpu = False
        if r:
            h = req.hashes[r - 1]
            if self._call("begin_restore", h, slot):
                if self._call("restore_queued_for", slot):  # S9: evidence before counting
                    self.c["restores_queued"] += 1
                    self._expect[slot] = h
                else:
                    self.c["restores_missing"] += 1
                    r = 0
            elif self.tier is not None and self.tier.could_serve(h):
                cpu = True  # the engine copies it from host memory itself
                self.tier.touch(h)
            else:
                self.c["restores_missing"] += 1
                r = 0
        if req.abort_at is not None and req.abort_at[0] == "after_hit":
            self._abort(req, "after_hit")
            return "aborted"
        if not self._call("ensure_free_units", need):
            raise RuntimeError("ensure_free_units refused after a passing gate")
        units = self._call("pool.reserve_units", need, (KV_OWNER, req.t.index))
        if units is None:
            raise RuntimeError("reserve_units refused after ensure_free_units")
        req.kv_units = list(units)
        for h in req.hashes[:r]:
            self._hold(h)
        req.published = r
        req.computed = r * TRACE_BLOCK_TOKENS
        req.boundaries = self._boundaries(req, r)
        c = self.c
        if hit:
            c["kv_hit_blocks"] += hit
        req.resumed, req.resumed_cpu = r, cpu
        if r:
            if self.executor is not None:
                # the restore (HBM: this pass's drain; CPU tier: the engine) leaves the slot
                # at the boundary; a CPU-tier restore is modelled by writing the state
                if cpu:
                    self.executor.set_state(slot, req.hashes[r - 1])
        elif self.executor is not None:
            self.executor.set_state(slot, _fresh_key(req))
        return "ok"

    def _count_resume(self, req: _Req) -> None:
        c, r = self.c, req.resumed
        if req.resumed_cpu:
            c["cpu_hits"] += 1
            c["cpu_hit_blocks"] += r
        else:
            c["hits"] += 1
            c["hit_blocks"] += r
        c["saved_tokens"] += r * TRACE_BLOCK_TOKENS

    def _prefill_chunk(self, req: _Req) -> None:
        n_in = req.t.input_length
        start = req.computed
        end = min(start + self.config.chunk_tokens, n_in)
        bs = req.boundaries
        while req.next_boundary < len(bs) and bs[req.next_boundary] * TRACE_BLOCK_TOKENS <= start:
            req.next_boundary += 1
        if req.next_boundary < len(bs):
            end = min(end, bs[req.next_boundary] * TRACE_BLOCK_TOKENS)
        req.computed = end
        req.chunks += 1
        full = end // TRACE_BLOCK_TOKENS
        for i in range(req.published, full):
            self._hold(req.hashes[i])
        req.published = max(req.published, full)
        at_boundary = (
            req.next_boundary < len(bs) and end == bs[req.next_boundary] * TRACE_BLOCK_TOKENS
        )
        if self.executor is not None:
            self.executor.set_state(
                req.state_slot,
                req.hashes[full - 1]
                if end % TRACE_BLOCK_TOKENS == 0 and full
                else _mid_key(req, end),
            )
        if at_boundary:
            b = bs[req.next_boundary]
            req.next_boundary += 1
            self.c["checkpoints_filed"] += 1
            self._filed = True
            self._call("checkpoint", req, b * self.block_units, req.hashes[b - 1])
        if end == n_in:
            req.generated = 1  # the last prefill chunk yields the first token
            for i in range(n_in // TRACE_BLOCK_TOKENS):
                self._seen.add(req.t.hash_ids[i])

    def _complete(self, req: _Req) -> None:
        self._call("forget_pending", req)
        self._release_slot(req)
        self._call("pool.release_units", req.kv_units, (KV_OWNER, req.t.index))
        req.kv_units = []
        for h in reversed(req.hashes[: req.published]):
            self._drop(h)
        self.c["completed"] += 1

    # -- offload ------------------------------------------------------------------------------

    def _offload_reports(self) -> None:
        due = self._offload_due
        now = self.clock.now_ms
        while due and due[0][0] <= now:
            _, op, lost = due.popleft()
            if lost:
                self.c["offload_reports_lost"] += 1
                continue
            self._call("release_offload_store_source", op)
            self._call("settle_offload_store", op)
            self.c["offload_reports"] += 1
            assert self.tier is not None
            self.tier.add(op.prefix_hash)
        self.c["offload_reclaimed"] += int(
            self._call("reclaim_stale_offload_pins", self.config.offload_timeout_s)
        )

    def _offload_take(self) -> None:
        cfg = self.config
        ops = self._call("take_offload_stores", cfg.offload_max_inflight)
        for op, _units in ops:
            self.c["offload_stores"] += 1
            lost = self.loss_rng.random() < cfg.offload_loss_rate
            self._offload_due.append((self.clock.now_ms + cfg.offload_delay_ms, op, lost))

    # -- the pass ---------------------------------------------------------------------------

    def _pass(self, waiting: deque[_Req], running: list[_Req]) -> None:
        c = self.c
        c["passes"] += 1
        self._filed = False
        self._call("complete_previous_batch")
        if self.tier is not None:
            self._offload_reports()
        admitted: list[_Req] = []
        while waiting and self._free_slots:
            req = waiting[0]
            got = self._admit(req, not running and not admitted)
            if got == "blocked":
                c["admission_blocked"] += 1
                if not running and not admitted:
                    if self.tier is not None and self.prod.coordinator.has_offload_pins():
                        break  # an offload pin holds the room: reclaimed after its timeout
                    # Nothing runs and nothing will free room: the request needs more than
                    # the pool can give even with every unpinned image evicted.
                    waiting.popleft()
                    c["rejected"] += 1
                    continue
                break
            waiting.popleft()
            if got == "ok":
                req.admitted_pass = c["passes"]
                running.append(req)
                admitted.append(req)
            self._trim_cache()
        if any(r.abort_at is not None and r.abort_at[0] == "before_drain" for r in admitted):
            keep = []
            for r in running:
                if r.abort_at is not None and r.abort_at[0] == "before_drain":
                    self._abort(r, "before_drain")
                else:
                    keep.append(r)
            running[:] = keep
        c["peak_running"] = max(c["peak_running"], len(running))
        if running:
            c["drains"] += 1
            stores, restores = self._call("take_checkpoint_ops")
            expect = self._expect
            if self.executor is not None and (stores or restores):
                self.executor.run_batch(stores, restores)
                for op in restores:
                    self.executor.check_restored(op.dst_slot, expect[op.dst_slot])
                    c["restores_checked"] += 1
            for op in restores:
                if expect.pop(op.dst_slot, None) is None:
                    raise Divergence(
                        self.step - 1,
                        "take_checkpoint_ops()",
                        f"a restore into slot {op.dst_slot}, which no admission queued",
                        "only the restores begin_restore queued",
                    )
            if expect:
                # S9: restore_queued_for promised these, and the drain did not deliver them
                raise Divergence(
                    self.step - 1,
                    "take_checkpoint_ops()",
                    f"no restore into slots {sorted(expect)}",
                    "the restores restore_queued_for reported queued",
                )
            self._trim_cache()
        if self.tier is not None:
            self._offload_take()
        finished: list[_Req] = []
        aborted: list[_Req] = []
        for req in running:
            if req.computed < req.t.input_length:
                if req.chunks == 0 and req.resumed:
                    self._count_resume(req)  # the drain above restored it (or the host did)
                self._prefill_chunk(req)
                a = req.abort_at
                # after its a[1]-th chunk, or its last one if it has fewer
                if (
                    a is not None
                    and a[0] == "mid_prefill"
                    and (req.chunks >= a[1] or req.computed >= req.t.input_length)
                ):
                    aborted.append(req)
                    continue
            else:
                req.generated += 1
            if req.computed >= req.t.input_length and req.generated >= req.t.output_length:
                finished.append(req)
        if finished or aborted:
            gone = {id(r) for r in finished} | {id(r) for r in aborted}
            running[:] = [r for r in running if id(r) not in gone]
            for req in aborted:
                self._abort(req, "mid_prefill")
            for req in finished:
                self._complete(req)
            self._trim_cache()

    def _skip(self, arrivals: deque[_Req], waiting: deque[_Req], running: list[_Req]) -> None:
        """Take the passes until the next event as one (see the module docstring)."""
        if self._filed or waiting or any(r.computed < r.t.input_length for r in running):
            return
        step = self.config.pass_ms
        horizon = math.inf
        if arrivals:
            horizon = arrivals[0].t.timestamp_ms - self.clock.now_ms
        if running:
            left = min(r.t.output_length - r.generated for r in running)
            horizon = min(horizon, max(0, left - 1) * step)
        if self._offload_due:
            horizon = min(horizon, self._offload_due[0][0] - self.clock.now_ms)
        if self.tier is not None and self.prod.coordinator.has_offload_pins():
            horizon = min(horizon, self.config.offload_timeout_s * 1000.0)
        if not running:
            if math.isfinite(horizon) and horizon > 0:
                self.clock.now_ms += horizon
            return
        k = int(horizon // step) - 1
        if k >= 1:
            self.clock.now_ms += k * step
            for r in running:
                r.generated += k
            self.c["skipped_passes"] += k

    def _sample_occupancy(self) -> None:
        free = self.prod.pool.num_free
        store = self.prod.coordinator.store
        ckpt = len(store.records) * self.image_units if hasattr(store, "records") else 0
        kv = self.units - free - ckpt
        self.occupancy.append(
            [
                round(self.clock.now_ms / 1000.0, 3),
                kv,
                ckpt,
                min(free, len(self._cached) * self.block_units),
                free,
            ]
        )

    def run(self) -> ReplayResult:
        """Replay the whole trace (every request completes or aborts).

        Raises:
            Divergence: ``verify`` found the production store and the reference
                disagreeing, or an invariant broken (or the executor found a restore that
                is not bit-exact).
        """
        cfg = self.config
        arrivals: deque[_Req] = deque()
        for t in self.trace:
            req = _Req(t)
            if cfg.abort_rate and self.rng.random() < cfg.abort_rate:
                where = self.rng.choice(("after_hit", "before_drain", "mid_prefill"))
                req.abort_at = (where, self.rng.randint(1, 4))
            self.c["prompt_blocks"] += len(t.hash_ids)
            self.c["prompt_tokens"] += t.input_length
            arrivals.append(req)
        span_ms = max(1.0, float(self.trace[-1].timestamp_ms))
        self._occ_every_ms = span_ms / (cfg.occupancy_points // 2)
        next_occ = 0.0
        waiting: deque[_Req] = deque()
        running: list[_Req] = []
        self._free_slots.sort(reverse=True)
        total = len(self.trace)
        t_start = time.perf_counter()
        tier = self.tier
        coordinator = self.prod.coordinator
        # Lost offload reports leave pins the store reclaims after a timeout: the run goes on
        # (passes with nothing to run) until they are (SPEC D.1 step 11).
        while (
            arrivals
            or waiting
            or running
            or self._offload_due
            or (tier is not None and coordinator.has_offload_pins())
        ):
            clock = self.clock
            if not waiting and not running and arrivals:
                wake = float(arrivals[0].t.timestamp_ms)
                if self._offload_due:
                    wake = min(wake, self._offload_due[0][0])
                clock.now_ms = max(clock.now_ms, wake)
            while arrivals and arrivals[0].t.timestamp_ms <= clock.now_ms:
                waiting.append(arrivals.popleft())
            self._pass(waiting, running)
            if self.ref is not None and self.c["passes"] % cfg.snapshot_every == 0:
                self._compare_snapshots()
            if clock.now_ms >= next_occ:
                self._sample_occupancy()
                if len(self.occupancy) >= cfg.occupancy_points:
                    # keep the whole run in view: every other sample, twice the interval
                    del self.occupancy[1::2]
                    self._occ_every_ms *= 2
                next_occ = clock.now_ms + self._occ_every_ms
            if self.progress is not None:
                self.progress(self.c["completed"] + self.c["aborted"] + self.c["rejected"], total)
            clock.now_ms += cfg.pass_ms
            self._skip(arrivals, waiting, running)
        # the last drain's stores are published by one more completion
        self._call("complete_previous_batch")
        self._sample_occupancy()
        wall = time.perf_counter() - t_start
        if self.ref is not None:
            self._compare_snapshots()
        fates = {k: int(v) for k, v in self.prod.coordinator.checkpoint_fates().items()}
        timings: dict[str, dict[str, float]] = {}
        every: array[int] = array("q")
        for name, s in sorted(self.samples.items()):
            p50, p99 = _percentiles(s)
            timings[name] = {
                "calls": len(s),
                "mean": sum(s) / len(s) / 1000.0 if s else 0.0,
                "p50": p50,
                "p99": p99,
            }
            if name not in ("pool.num_free", "pool.mark_clean"):
                every.extend(s)
        p50, p99 = _percentiles(every)
        timings["overall"] = {
            "calls": len(every),
            "mean": sum(every) / len(every) / 1000.0 if every else 0.0,
            "p50": p50,
            "p99": p99,
        }
        geometry = dict(self.layout.describe())
        geometry.update(
            unit_bytes=self.unit_bytes,
            image_units=self.image_units,
            pool_units=self.units,
            slots=cfg.max_running,
        )
        return ReplayResult(
            config=attrs.asdict(cfg),
            geometry=geometry,
            counters=dict(self.c),
            fates=fates,
            timings_us=timings,
            occupancy=self.occupancy,
            wall_s=wall,
            verified=self.ref is not None,
            executor=self.executor.stats() if self.executor is not None else {},
        )


def _fresh_key(req: _Req) -> int:
    """A slot's state key before any block is computed (no checkpoint has it)."""
    return -1 - req.t.index


def _mid_key(req: _Req, tokens: int) -> int:
    """The state key between boundaries: never a prefix hash (those are >= 0)."""
    return -(1 << 40) - req.t.index * (1 << 20) - tokens


def replay(
    trace: Sequence[TraceRequest] | Path | str,
    config: ReplayConfig,
    *,
    limit: int | None = None,
    impl: ModuleType | str = "pagedstate.impl",
    executor_factory: Callable[..., ReplayExecutor] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Load ``trace`` (a path, or requests) and replay it once under ``config``.

    Raises:
        ReplayError, TraceError: bad input (nothing was written).
        Divergence: with ``config.verify``, the stores disagreed.
    """
    reqs = load_trace(trace, limit) if isinstance(trace, (str, Path)) else list(trace)[:limit]
    engine = ReplayEngine(config, reqs, impl, executor_factory=executor_factory, progress=progress)
    return engine.run()


def iter_configs(
    base: ReplayConfig, pools: Iterable[float], placements: Iterable[str]
) -> list[ReplayConfig]:
    """Every (pool, placement) pair of ``base``, placements outermost."""
    return [attrs.evolve(base, pool_gib=g, placement=p) for p in placements for g in pools]
