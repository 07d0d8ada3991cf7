"""pagedstate as a vLLM KV connector (vLLM 0.32, ``KVConnectorBase_V1`` + ``SupportsHMA``).

Use it by name; nothing in vLLM is patched::

    from vllm import LLM
    from vllm.config import KVTransferConfig

    llm = LLM(
        model=path,
        enable_prefix_caching=True,  # vLLM's align mode: states at block boundaries
        kv_transfer_config=KVTransferConfig(
            kv_connector="PagedStateConnector",
            kv_connector_module_path="pagedstate.engines.vllm.connector",
            kv_role="kv_both",
            kv_connector_extra_config={"num_units": 256},
        ),
    )

``kv_connector_extra_config`` keys: ``num_units`` (the tier's pool, in units of one vLLM
block of every attention layer; default 64), ``num_slots`` (default ``2 * max_num_seqs``),
``event_log`` (a path: the coordinator's event log, for ``pagedstate check-log``),
``plant`` (a planted bug, for tests: :data:`~pagedstate.engines.vllm.tier.PLANTED_BUGS`).

The scheduler side is :class:`~pagedstate.engines.vllm.tier.PrefixTier`, the worker side
:class:`~pagedstate.engines.vllm.worker.TierWorker`; this module only moves vLLM's objects
between them. The connector API's limits are in docs/vllm.md.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)

from .layout import tier_layout
from .plan import StepPlan, StepReport
from .tier import PrefixTier
from .worker import TierWorker

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

__all__ = ["PagedStateConnector", "connectors", "scheduler_tier"]

log = logging.getLogger("pagedstate.engines.vllm")

_LIVE: weakref.WeakSet[PagedStateConnector] = weakref.WeakSet()


def connectors() -> list[PagedStateConnector]:
    """The connectors alive in this process, in no fixed order (an in-process engine has a
    scheduler-side one, with ``tier`` set, and a worker-side one, with ``worker`` set)."""
    return list(_LIVE)


def scheduler_tier() -> PrefixTier:
    """The prefix tier of the one scheduler-side connector alive in this process (an
    in-process engine), to read its counters (``stats``, ``units_held()``,
    ``outstanding()``, ``is_idle()``).

    Raises:
        LookupError: no scheduler-side connector is alive, or more than one is."""
    tiers = [c.tier for c in _LIVE if c.tier is not None]
    if len(tiers) != 1:
        raise LookupError(f"{len(tiers)} scheduler-side connectors alive in this process, not 1")
    return tiers[0]


def _close_at_exit(ref: weakref.ref[PagedStateConnector]) -> None:
    conn = ref()
    if conn is not None:
        conn.shutdown()


class _Meta(KVConnectorMetadata):
    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class _WorkerMeta(KVConnectorWorkerMetadata):
    def __init__(self, report: StepReport) -> None:
        self.report = report

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, _WorkerMeta)
        steps = sorted(set(self.report.steps) | set(other.report.steps))
        return _WorkerMeta(StepReport(tuple(steps)))


class PagedStateConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's connector interface over the pagedstate prefix tier (see the module doc)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
        self.layout = tier_layout(kv_cache_config, str(vllm_config.model_config.model))
        self.num_units = int(extra.get("num_units", 64))
        max_seqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.num_slots = int(extra.get("num_slots", 2 * max_seqs))
        self.plant = extra.get("plant")
        self.tier: PrefixTier | None = None
        self.worker: TierWorker | None = None
        self.event_log: Any = None
        self._kv_cache_manager_ref: KVCacheManager | None = None
        if role == KVConnectorRole.SCHEDULER:
            hash_tokens = int(getattr(vllm_config.cache_config, "hash_block_size", 0) or 0)
            self.tier = PrefixTier(
                self.layout,
                self.num_units,
                self.num_slots,
                hash_block_tokens=hash_tokens or None,
                plant=self.plant,
            )
            path = extra.get("event_log")
            if path:
                from pagedstate.impl.eventlog import EventLog, attach

                self.event_log = attach(self.tier.coordinator, EventLog(str(path)))
                # an engine dropped without shutdown(): the footer is written at interpreter
                # exit (a weak reference, so the connector can still be collected)
                atexit.register(_close_at_exit, weakref.ref(self))
        self._finished_loads: set[str] = set()
        self._report: list[int] = []
        _LIVE.add(self)

    # -- scheduler side -------------------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        self._kv_cache_manager_ref = kv_cache_manager

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        assert self.tier is not None
        n = self.tier.match(request, num_computed_tokens)
        return n, bool(n) and self.tier.plant != "sync-load"

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self.tier is not None
        self.tier.admit(request, blocks.get_block_ids(), num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self.tier is not None
        mgr = self._kv_cache_manager_ref
        assert mgr is not None, "vLLM did not bind its KV cache manager"
        plan = self.tier.plan_step(
            scheduler_output.num_scheduled_tokens,
            scheduler_output.preempted_req_ids or (),
            mgr.get_block_ids,
        )
        return _Meta(plan)

    def update_connector_output(self, connector_output: Any) -> None:
        assert self.tier is not None
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, _WorkerMeta):
            self.tier.steps_ran(meta.report.steps)

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self.tier is not None
        self.tier.finished(request)
        return False, None

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def reset_cache(self) -> bool | None:
        if self.tier is None:
            return None
        return self.tier.reset()

    def shutdown(self) -> None:
        if self.event_log is not None:
            self.event_log.close()
            self.event_log = None

    # -- worker side ----------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.worker = TierWorker(self.layout, kv_caches, self.num_units, self.num_slots)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        # Every copy runs after the step's forward (wait_for_save): a restore lands a step
        # before its request runs (loads are asynchronous), and a store reads the state the
        # forward left. vLLM calls this after the forward when no load is synchronous.
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        pass

    def wait_for_save(self) -> None:
        if self.worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, _Meta)
        self.worker.run(meta.plan)
        self._finished_loads.update(meta.plan.loaded)
        self._report.append(meta.plan.step)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done, self._finished_loads = self._finished_loads, set()
        return None, (done or None)

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if not self._report:
            return None
        steps, self._report = tuple(self._report), []
        return _WorkerMeta(StepReport(steps))
