"""The scheduler side of the vLLM connector: a prefix tier in pagedstate's own pool.

One :class:`~pagedstate.impl.UnitPool` holds both halves of every cached prefix: the KV page
of each prompt block (one unit: the block's page of every attention layer) and, at the
boundaries where vLLM's align mode leaves the recurrent state of a block-aligned prefix in
a state block, that state's image split over units (the store's records, SPEC A-B). One
:class:`~pagedstate.impl.PagedStateCheckpointCoordinator` runs the images through the
tables; the KV pages are the engine's own reservations of the same pool (``pool.reserve_units``
/ ``release_units`` under owner ``("kv-page", prefix_hash)``), kept in LRU order here, so
that the event log of a run replays on the reference model (the reference pool has no KV
cache: ``cache_units`` would make a log unreplayable, docs/eventlog.md).

How vLLM's hooks map onto the store (SPEC D.1 step numbers; docs/vllm.md has the whole
table):

- the first hook of a scheduler pass: ``complete_previous_batch(completion=token)`` (step 1)
  with the previous step's completion token (D.13), set when the worker reports that step's
  copies ran;
- ``get_num_new_matched_tokens`` -> :meth:`PrefixTier.match`: the consecutive KV pages
  beyond vLLM's own hit, gated by ``resumable_hit`` (step 2); side-effect free;
- ``update_state_after_alloc`` -> :meth:`PrefixTier.admit`: ``begin_restore(h, slot,
  seq=)`` (step 3) and pins on the hit's KV pages;
- ``build_connector_meta`` -> :meth:`PrefixTier.plan_step`: ``forget_pending`` for preempted
  requests (step 8), a KV page reservation per prompt block computed in the step and a
  ``checkpoint(seq, n, h)`` for a step that ends on block boundary ``n`` (step 5), then the
  drain ``take_checkpoint_ops()`` (step 6) and the scrub list (G10);
- ``update_connector_output`` -> :meth:`PrefixTier.steps_ran`: the steps' tokens are set
  and their KV page pins released;
- ``request_finished_all_groups`` -> :meth:`PrefixTier.finished`: ``forget_pending``;
- a KV page evicted from the tier -> ``unindex(h)`` (step 9, SPEC A.4).

A request's *slot* is a connector slot id (``[0, num_slots)``), not a vLLM block: vLLM keeps
a request's recurrent state in a different block of each recurrent group, and moves it to a
new block as the request crosses block boundaries. Each :class:`~.plan.StepPlan` names, for
the slots its ops touch, the state block of every recurrent group at that step.

Loads are asynchronous in vLLM's sense (``get_num_new_matched_tokens`` answers ``True``):
vLLM copies a resumed request's state from the block of its hit into its running block
*before* a step's synchronous loads run, so a restore must land a step ahead. The worker
reports the request received after the step that carried its copies.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pagedstate.gpu.executor import free_dirty_units
from pagedstate.impl import PagedStateCheckpointCoordinator, UnitPool
from pagedstate.impl.pool import SlotPool
from pagedstate.spec.errors import InvalidArgumentError
from pagedstate.spec.types import ManualCompletion

from .layout import TierLayout
from .plan import StepPlan

__all__ = ["PLANTED_BUGS", "PrefixTier", "prefix_hash_of"]

log = logging.getLogger("pagedstate.engines.vllm")

#: Connector bugs a test can plant (``kv_connector_extra_config={"plant": NAME}``), to show
#: what the end-to-end checks catch: ``"complete-early"`` completes each batch in the
#: drain's own pass, before its copies ran, with no completion token (the images are
#: published and settled a step early); ``"sync-load"`` reports a hit as a synchronous load,
#: so vLLM runs the request in the very step whose copies restore its state (the request is
#: let go one step early).
PLANTED_BUGS = ("complete-early", "sync-load")

_NULL_BLOCK = 0  # vLLM's null block id (BlockPool keeps block 0 as the null block)


def prefix_hash_of(block_hash: Any) -> int:
    """pagedstate's prefix hash (an int in ``[0, 2**63)``) of vLLM's block hash (bytes, the
    chained SHA-256 of a block's tokens, or an int)."""
    if isinstance(block_hash, int):
        return block_hash & (2**63 - 1)
    data = bytes(block_hash)
    return int.from_bytes(data[:8], "big") >> 1


class _Seq:
    """What the coordinator reads of a vLLM request (SequenceLike), plus the tier's
    bookkeeping of it."""

    def __init__(self, req_id: str, request: Any) -> None:
        self.req_id = req_id
        self.request = request
        self.state_slot = -1
        self.has_per_req_cache = True
        self.hashes: list[int] = []
        # A load waiting for the drain: (state blocks per recurrent group, kv loads, the
        # hashes of the pages it pinned).
        self.load: tuple[tuple[int, ...], list[tuple[int, int]], list[int]] | None = None
        # (num_computed, blocks served) of the last match, until admit consumes it.
        self.matched: tuple[int, int] | None = None
        # The step of the latest boundary filed for it (its store rides that step), and of
        # the pass that last admitted it.
        self.last_store_step = -1
        self.admitted_in = -1

    def __repr__(self) -> str:
        return f"_Seq({self.req_id!r}, slot={self.state_slot})"


class PrefixTier:
    """The scheduler-side prefix tier (see the module doc).

    Args:
        tl: the KV layout (:func:`~.layout.tier_layout`).
        num_units: units in the tier's pool (each ``tl.layout.page_unit_bytes`` bytes on the
            worker); >= ``units_per_checkpoint``.
        num_slots: connector slots (requests that can hold a restore or a boundary at once).
        hash_block_tokens: tokens per entry of vLLM's ``request.block_hashes`` (must divide
            the block size).
        plant: one of :data:`PLANTED_BUGS`, or None.

    Raises:
        InvalidArgumentError: a count out of range or an unknown planted bug.
    """

    def __init__(
        self,
        tl: TierLayout,
        num_units: int,
        num_slots: int,
        *,
        hash_block_tokens: int | None = None,
        plant: str | None = None,
    ) -> None:
        if type(num_units) is not int or num_units < tl.units_per_checkpoint:
            raise InvalidArgumentError(
                f"num_units must be an int >= {tl.units_per_checkpoint} (one image), got"
                f" {num_units!r}"
            )
        if type(num_slots) is not int or num_slots < 1:
            raise InvalidArgumentError(f"num_slots must be an int >= 1, got {num_slots!r}")
        hbt = tl.block_tokens if hash_block_tokens is None else hash_block_tokens
        if type(hbt) is not int or hbt < 1 or tl.block_tokens % hbt:
            raise InvalidArgumentError(
                f"hash_block_tokens must divide the block size {tl.block_tokens}, got {hbt!r}"
            )
        if plant is not None and plant not in PLANTED_BUGS:
            raise InvalidArgumentError(f"unknown planted bug {plant!r}; known: {PLANTED_BUGS}")
        self.tl = tl
        self.block = tl.block_tokens
        self._hash_stride = tl.block_tokens // hbt
        self.plant = plant
        self.pool = UnitPool(num_units)
        self.coordinator = PagedStateCheckpointCoordinator(self.pool, tl.layout.spec(), True)
        self.num_slots = num_slots
        self._slots = SlotPool(range(num_slots))
        self._seqs: dict[str, _Seq] = {}
        # KV pages: prefix hash -> unit, LRU first; pins per hash; pages written by a step
        # not yet reported (hash -> step).
        self._pages: OrderedDict[int, int] = OrderedDict()
        self._pins: dict[int, int] = {}
        self._step_pins: dict[int, list[int]] = {}
        # KV page hash -> the image hashes whose prefix runs through it (insertion order)
        self._dependents: dict[int, dict[int, None]] = {}
        self._dep_caps: dict[int, int] = {}  # the size at which a list is pruned next
        self._dep_keys_cap = 64  # the number of pages at which the map is pruned next
        self._tokens: dict[int, ManualCompletion] = {}
        self._last_token: ManualCompletion | None = None
        self._pass_open = False
        self.step = 0
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "lookups",
                "hits",
                "hit_tokens",
                "restores",
                "stores",
                "kv_pages_saved",
                "kv_pages_loaded",
                "kv_pages_evicted",
                "kv_pages_refused",
                "boundaries",
                "preempted",
                "finished_in_flight",
            ),
            0,
        )

    # -- passes ---------------------------------------------------------------------------

    def _open(self) -> None:
        """The first hook of a scheduler pass (SPEC D.1 step 1)."""
        if self._pass_open:
            return
        self._pass_open = True
        self.coordinator.complete_previous_batch(completion=self._last_token)
        self._last_token = None

    # -- requests -------------------------------------------------------------------------

    def _seq(self, request: Any) -> _Seq:
        rid = request.request_id
        seq = self._seqs.get(rid)
        if seq is None:
            seq = self._seqs[rid] = _Seq(rid, request)
        seq.request = request
        hashes = request.block_hashes
        have = len(seq.hashes)
        stride = self._hash_stride
        n = len(hashes) // stride
        if n > have:
            seq.hashes.extend(prefix_hash_of(hashes[(j + 1) * stride - 1]) for j in range(have, n))
        return seq

    def match(self, request: Any, num_computed: int) -> int:
        """Tokens beyond vLLM's own ``num_computed`` the tier can load for ``request``: the
        consecutive KV pages from block ``num_computed / block``, cut back to the longest
        prefix whose recurrent image is READY (``resumable_hit``), never the prompt's last
        token. 0 when vLLM's hit is not block-aligned, no slot is free, or nothing beyond it
        is cached. Changes nothing but the pass (and remembers the answer for
        :meth:`admit`)."""
        self._open()
        self.stats["lookups"] += 1
        seq = self._seq(request)
        seq.matched = None
        block = self.block
        if num_computed % block:
            return 0
        start = num_computed // block
        top = min(len(seq.hashes), (request.num_tokens - 1) // block)
        n = start
        pages = self._pages
        while n < top and seq.hashes[n] in pages:
            n += 1
        if n == start:
            return 0
        if seq.state_slot < 0 and not self._slots.has_free():
            return 0
        r = self.coordinator.resumable_hit(seq, n, seq.hashes)
        if r <= start:
            return 0
        seq.matched = (num_computed, r)
        return (r - start) * block

    def admit(self, request: Any, block_ids: Sequence[Sequence[int]], num_external: int) -> None:
        """vLLM allocated ``request``'s blocks (``block_ids`` per KV cache group); when it
        accepted ``num_external`` tokens from :meth:`match`, queue the restore of the hit's
        image into the request's slot (``begin_restore``: pinned before anything else can
        evict it) and pin the hit's KV pages.

        Raises:
            InvalidArgumentError: ``num_external`` is not what :meth:`match` offered, or a
                block vLLM allocated for the hit is the null block.
        """
        self._open()
        seq = self._seq(request)
        matched = seq.matched
        if num_external == 0:
            seq.matched = None
            seq.admitted_in = self.step
            if seq.state_slot < 0 and self._slots.has_free():
                seq.state_slot = self._slots.pop()
            return
        # every check before anything changes: a refused admission keeps the offer
        if matched is None or (seq.state_slot < 0 and not self._slots.has_free()):
            raise InvalidArgumentError(
                f"request {seq.req_id}: vLLM accepted {num_external} external tokens that"
                " the tier did not offer"
            )
        computed, r = matched
        block = self.block
        if computed + num_external != r * block:
            raise InvalidArgumentError(
                f"request {seq.req_id}: vLLM accepted {num_external} of the"
                f" {r * block - computed} tokens offered; a partial load is not supported"
            )
        start = computed // block
        state_blocks = tuple(int(block_ids[g][r - 1]) for g in self.tl.recurrent_groups)
        attn = block_ids[self.tl.attention_group]
        if _NULL_BLOCK in state_blocks or any(int(attn[j]) == _NULL_BLOCK for j in range(start, r)):
            raise InvalidArgumentError(
                f"request {seq.req_id}: vLLM gave the null block for a block of the hit"
            )
        h_hit = seq.hashes[r - 1]
        if not self.coordinator.contains(h_hit):
            raise InvalidArgumentError(
                f"request {seq.req_id}: the image matched in this pass is gone"
            )
        seq.matched = None
        seq.admitted_in = self.step
        if seq.state_slot < 0:
            seq.state_slot = self._slots.pop()
        restored = self.coordinator.begin_restore(h_hit, seq.state_slot, seq=seq)
        assert restored, "a READY image refused a restore"
        loads: list[tuple[int, int]] = []
        pinned = seq.hashes[start:r]
        for j, h in enumerate(pinned, start):
            unit = self._pages[h]
            self._pages.move_to_end(h)
            self._pins[h] = self._pins.get(h, 0) + 1
            loads.append((unit, int(attn[j])))
        seq.load = (state_blocks, loads, pinned)
        self.stats["hits"] += 1
        self.stats["hit_tokens"] += num_external

    def _leave(self, seq: _Seq) -> None:
        """``seq`` leaves its slot (finished, aborted or preempted): SPEC D.1 step 8."""
        self.coordinator.forget_pending(seq)
        if seq.load is not None:
            # its restore was cancelled with the rest; the hit's pages go back to the LRU
            self._unpin(seq.load[2])
            seq.load = None
        if seq.state_slot >= 0:
            self._slots.release(seq.state_slot)
            seq.state_slot = -1
        seq.matched = None

    def finished(self, request: Any) -> None:
        """``request`` finished or was aborted (vLLM frees its blocks when this returns)."""
        self._open()
        seq = self._seqs.pop(request.request_id, None)
        if seq is not None:
            if seq.last_store_step in self._tokens:
                # its last store's step has not been reported run: the request leaves
                # while that copy is in flight (the completion token stays unset)
                self.stats["finished_in_flight"] += 1
            self._leave(seq)

    # -- KV pages -------------------------------------------------------------------------

    def _unpin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            n = self._pins.get(h, 0) - 1
            if n > 0:
                self._pins[h] = n
            else:
                self._pins.pop(h, None)

    def _evict_page(self) -> bool:
        """Drop the least recently used unpinned KV page, and with it every image whose
        prefix runs through it (its own included: SPEC A.4, the checkpoint dies with its
        prefix; deeper ones could never be reached again). False when every page is
        pinned."""
        for h, unit in self._pages.items():
            if h in self._pins:
                continue
            del self._pages[h]
            self.pool.release_units([unit], ("kv-page", h))
            self._dep_caps.pop(h, None)
            for image in self._dependents.pop(h, {h: None}):
                self.coordinator.unindex(image)
            self.stats["kv_pages_evicted"] += 1
            return True
        return False

    def _depends(self, page: int, image: int) -> None:
        """Record that ``image``'s prefix runs through KV page ``page`` (held by the tier or
        not yet: a page vLLM's cache served may be saved later). Entries of images the store
        no longer holds are pruned once the page's list has doubled since its last pruning,
        so each list stays within twice its live images plus 8; pages the tier does not
        hold whose images are all gone are dropped once the map has doubled since its last
        pruning (at least 64 pages). Amortized O(1) per call."""
        deps = self._dependents.setdefault(page, {})
        deps[image] = None
        if len(deps) > self._dep_caps.get(page, 8):
            live = {h: None for h in deps if self._holds(h)}
            self._dependents[page] = live
            self._dep_caps[page] = max(8, 2 * len(live))
        if len(self._dependents) > self._dep_keys_cap:
            # pages the tier does not hold whose images are all gone are forgotten; once
            # the map has doubled since the last time (amortized O(1) per call)
            kept = {
                pg: images
                for pg, images in self._dependents.items()
                if pg in self._pages or any(self._holds(h) for h in images)
            }
            self._dependents = kept
            for pg in [pg for pg in self._dep_caps if pg not in kept]:
                del self._dep_caps[pg]
            self._dep_keys_cap = max(64, 2 * len(kept))

    def _holds(self, image: int) -> bool:
        """Whether the coordinator still holds ``image`` (READY, in flight or pending)."""
        coord = self.coordinator
        return coord.store.contains_or_pending(image) or image in coord._pending_by_hash

    def _make_room(self, count: int) -> bool:
        """At least ``count`` free units, evicting least recently used KV pages (with the
        images that need them); False when the pinned pages leave too few."""
        while self.pool.num_free < count:
            if not self._evict_page():
                return False
        return True

    def _reserve_page(self, h: int) -> int | None:
        """A unit for the KV page of ``h``: a free one, else one of the least recently used
        page (its images go with it), else one of an unpinned image; None when the pool
        holds only pinned pages and in-flight images (the page is refused: it costs
        nothing)."""
        owner = ("kv-page", h)
        if self._make_room(1) or self.coordinator.ensure_free_units(1):
            got = self.pool.reserve_units(1, owner)
            if got:
                return got[0]
        return None

    # -- a step ---------------------------------------------------------------------------

    def plan_step(
        self,
        scheduled: Mapping[str, int],
        preempted: Iterable[str],
        block_ids_of: Callable[[str], Sequence[Sequence[int]]],
    ) -> StepPlan:
        """The end of a scheduler pass (``build_connector_meta``): the copies that ride
        this step. ``scheduled`` maps request ids to the tokens scheduled for them (their
        ``num_computed_tokens`` not yet advanced), ``preempted`` names requests vLLM
        preempted in this pass, ``block_ids_of(req_id)`` gives a request's block ids per
        group as of this step (vLLM's ``KVCacheManager.get_block_ids``). Returns the
        :class:`~.plan.StepPlan` (its ops in pool units and connector slots).

        Raises:
            InvalidArgumentError: as the coordinator's ``checkpoint`` and
                ``take_checkpoint_ops`` (a request's state is read at the drain)."""
        self._open()
        for rid in preempted:
            seq = self._seqs.get(rid)
            if seq is None:
                continue
            self.stats["preempted"] += 1
            if seq.admitted_in == self.step:
                # vLLM preempted it and admitted it again in this very pass (its restore, if
                # any, is the new admission's): it left its old blocks, not its slot
                continue
            self._leave(seq)
        block = self.block
        slot_blocks: dict[int, tuple[int, ...]] = {}
        kv_saves: list[tuple[int, int]] = []
        step_pages: list[int] = []
        coord = self.coordinator
        filed: set[int] = set()
        for rid, n_new in scheduled.items():
            seq = self._seqs.get(rid)
            if seq is None or n_new <= 0:
                continue
            req = seq.request
            self._seq(req)
            start = int(req.num_computed_tokens)
            end = start + int(n_new)
            prompt = int(req.num_prompt_tokens)
            last = min(end, prompt) // block  # full prompt blocks once this step ran
            if last <= start // block:
                continue
            ids = block_ids_of(rid)
            attn = ids[self.tl.attention_group]
            for j in range(start // block, min(last, len(seq.hashes))):
                h = seq.hashes[j]
                if h in self._pages:
                    self._pages.move_to_end(h)
                    continue
                unit = self._reserve_page(h)
                if unit is None:
                    self.stats["kv_pages_refused"] += 1
                    continue
                self._pages[h] = unit
                self._pins[h] = self._pins.get(h, 0) + 1  # until the step's copies ran
                step_pages.append(h)
                kv_saves.append((int(attn[j]), unit))
                self.stats["kv_pages_saved"] += 1
            if end % block == 0 and end <= prompt and seq.state_slot >= 0:
                n = end // block
                if n <= len(seq.hashes):
                    state = tuple(int(ids[g][n - 1]) for g in self.tl.recurrent_groups)
                    if _NULL_BLOCK not in state:
                        h_n = seq.hashes[n - 1]
                        coord.checkpoint(seq, n, h_n, computed_blocks=n)
                        if not coord.store.contains_or_pending(h_n):
                            filed.add(h_n)  # the drain will try to store it (once)
                        pages = self._pages
                        for hj in seq.hashes[:n]:
                            # every page of the prefix, held by the tier or not: a page
                            # vLLM's own cache served may be saved into the tier later, and
                            # its eviction must still take this image with it (SPEC A.4)
                            self._depends(hj, h_n)
                            if hj in pages:
                                pages.move_to_end(hj)  # the whole prefix is recently used
                        slot_blocks[seq.state_slot] = state
                        seq.last_store_step = self.step
                        self.stats["boundaries"] += 1
        if filed:
            # room for the images before the drain reserves them: least recently used KV
            # pages go first (the store would otherwise refuse the image, or evict another)
            self._make_room(len(filed) * self.tl.units_per_checkpoint)
        loaded: list[str] = []
        kv_loads: list[tuple[int, int]] = []
        for seq in self._seqs.values():
            if seq.load is not None:
                state, loads, pinned = seq.load
                slot_blocks[seq.state_slot] = state
                kv_loads.extend(loads)
                step_pages.extend(pinned)
                if self.plant != "sync-load":
                    loaded.append(seq.req_id)
                seq.load = None  # its pins now end with this step's report
        stores, restores = coord.take_checkpoint_ops()
        self.stats["stores"] += len(stores)
        self.stats["restores"] += len(restores)
        self.stats["kv_pages_loaded"] += len(kv_loads)
        scrub = free_dirty_units(self.pool)
        if scrub:
            self.pool.mark_clean(scrub)
        step = self.step
        self.step += 1
        token = ManualCompletion()
        self._tokens[step] = token
        self._step_pins[step] = step_pages
        used = {op.src_slot for op in stores} | {op.dst_slot for op in restores}
        plan = StepPlan(
            step=step,
            stores=stores,
            restores=restores,
            slot_blocks={s: b for s, b in slot_blocks.items() if s in used},
            kv_saves=tuple(kv_saves),
            kv_loads=tuple(kv_loads),
            scrub=tuple(scrub),
            loaded=tuple(loaded),
        )
        self._last_token = token
        self._pass_open = False
        if self.plant == "complete-early":
            # planted bug: the batch is completed, settled, before its copies ran
            self.coordinator.complete_previous_batch()
            self._last_token = None
        return plan

    def steps_ran(self, steps: Iterable[int]) -> None:
        """The worker reports these steps' copies issued (``update_connector_output``): set
        their completion tokens and release the KV page pins they held."""
        for step in steps:
            token = self._tokens.pop(step, None)
            if token is not None:
                token.set()
            self._unpin(self._step_pins.pop(step, ()))

    # -- admin ----------------------------------------------------------------------------

    def reset(self) -> bool:
        """Empty the tier (``reset_cache``): unindex every image (``clear_index``) and drop
        every unpinned KV page. True when nothing was left pinned."""
        self.coordinator.clear_index()
        while self._evict_page():
            pass
        # every image is gone: no page (pinned ones included) has a dependent left
        self._dependents.clear()
        self._dep_caps.clear()
        return not self._pages

    def outstanding(self) -> dict[str, int]:
        """The coordinator's outstanding counts plus the tier's: pinned KV pages, steps not
        reported, requests known."""
        out = self.coordinator.outstanding()
        out["kv_pages_pinned"] = len(self._pins)
        out["steps_unreported"] = len(self._tokens)
        out["requests"] = len(self._seqs)
        return out

    def is_idle(self) -> bool:
        """Nothing owed: the coordinator is idle (SPEC G17) and the tier holds no pin and
        no request."""
        return self.coordinator.is_idle() and not self._pins and not self._seqs

    def units_held(self) -> dict[str, int]:
        """Units of the pool by holder: ``free``, ``kv_pages``, ``images`` (the rest)."""
        free = self.pool.num_free
        pages = len(self._pages)
        return {"free": free, "kv_pages": pages, "images": self.pool.num_units - free - pages}
