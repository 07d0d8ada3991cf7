"""The parts a replay engine is built of: the copy executor's protocol
(:class:`ReplayExecutor`), the simulated clock, the CPU tier's index, a request of the
replay, the store module and its two sides (production and reference), and the state keys
the executor is told about."""

from __future__ import annotations

import importlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol

from .errors import ReplayError
from .trace import TraceRequest, prefix_hash

__all__ = ["ReplayExecutor"]


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


def _store_module(impl: ModuleType | str) -> ModuleType:
    """The store module ``impl`` (a module or its name), with both classes.

    Raises:
        ReplayError: it cannot be imported, or lacks ``UnitPool`` or
            ``PagedStateCheckpointCoordinator``.
    """
    if isinstance(impl, str):
        if "/" in impl or "\\" in impl or impl.endswith(".py"):
            raise ReplayError(
                f"store module {impl!r}: give a module name (for example mystore, with its"
                " folder on PYTHONPATH), not a file path"
            )
        try:
            impl = importlib.import_module(impl)
        except (ImportError, ValueError, TypeError) as e:
            hint = " (is its folder on PYTHONPATH?)" if isinstance(e, ModuleNotFoundError) else ""
            raise ReplayError(f"store module {impl!r}: cannot import it ({e}){hint}") from None
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


def _fresh_key(req: _Req) -> int:
    """A slot's state key before any block is computed (no checkpoint has it)."""
    return -1 - req.t.index


def _mid_key(req: _Req, tokens: int) -> int:
    """The state key between boundaries: never a prefix hash (those are >= 0)."""
    return -(1 << 40) - req.t.index * (1 << 20) - tokens
