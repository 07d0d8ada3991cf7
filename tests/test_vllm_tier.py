"""The vLLM connector's vLLM-free parts (``pagedstate.engines.vllm``: layout, tier, worker,
plan) on fakes of vLLM's objects, in the main ``.venv`` (torch CPU, no vLLM).

The fakes mirror what the engine test (tests/engine/) measured in vLLM's CPU build: three
GDN groups of one layer each (``MambaSpec``: conv ``(3, 512)`` bf16, SSM ``(2, 128, 128)``
fp32, 134,144 state bytes) and one attention group of one layer (``page_size_bytes = B *
512``), B = 384 tokens, so a page of 196,608 B holds a whole state. Every layer's cache is a
view over ONE buffer of ``num_blocks`` pages: a GDN layer as ``int8 [num_blocks, 1, 1,
134144]``, the attention layer as ``bf16 [num_blocks, 1, B, 256]``, each block one page
apart; block ids come from one allocator for every group (block 0 is vLLM's null block).

A scheduler pass is driven as vLLM drives the connector: ``match`` then ``admit`` for a
waiting request, ``plan_step`` at the end of the pass (``num_computed_tokens`` advanced
after it), the step's "forward" (random bytes into the blocks it computes), the worker's
copies after it, then ``steps_ran`` (``update_connector_output``).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import pytest
import torch

from pagedstate.engines.vllm.layout import UnsupportedKVLayoutError, tier_layout
from pagedstate.engines.vllm.plan import StepPlan
from pagedstate.engines.vllm.tier import PLANTED_BUGS, PrefixTier, prefix_hash_of
from pagedstate.engines.vllm.worker import TierWorker, VllmStateTensors, byte_rows
from pagedstate.impl.eventlog import EventLog, attach
from pagedstate.models import checklog
from pagedstate.spec.errors import InvalidArgumentError, PagedStateError
from pagedstate.spec.types import CheckpointRestoreOp

B = 384  # tokens per vLLM block (every group's)
CONV = ((3, 512), "bfloat16")
SSM = ((2, 128, 128), "float32")
STATE = 3 * 512 * 2 + 2 * 128 * 128 * 4  # 134,144 bytes of one GDN layer's state
PAGE = B * 512  # 196,608 bytes of one attention block
assert PAGE >= STATE
GDN_LAYERS = tuple(f"model.layers.{i}.linear_attn" for i in range(3))
ATTN_LAYER = "model.layers.3.self_attn"


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """The copies are small: torch's intra-op threads only contend on a loaded machine
    (20x slower with 2 threads on 2 busy cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# -- fakes of vLLM's KVCacheConfig ---------------------------------------------------------


class MambaSpec:
    """vLLM's recurrent spec, as far as ``tier_layout`` reads it (by class name)."""

    def __init__(self, block_size: int = B, shapes: Any = None, dtypes: Any = None) -> None:
        self.block_size = block_size
        self.shapes = shapes if shapes is not None else (CONV[0], SSM[0])
        self.dtypes = dtypes if dtypes is not None else (torch.bfloat16, torch.float32)


class GDNAttentionSpec:
    """A recurrent spec of another class name, recognised by ``mamba_cache_mode``."""

    def __init__(self, block_size: int = B) -> None:
        self.block_size = block_size
        self.shapes = (CONV[0], SSM[0])
        self.dtypes = ("torch.bfloat16", "torch.float32")
        self.mamba_cache_mode = "align"


class FullAttentionSpec:
    def __init__(self, block_size: int = B, page_size_bytes: int | None = None) -> None:
        self.block_size = block_size
        self.page_size_bytes = block_size * 512 if page_size_bytes is None else page_size_bytes


class Group:
    def __init__(self, spec: Any, layer_names: Sequence[str]) -> None:
        self.kv_cache_spec = spec
        self.layer_names = list(layer_names)


class KVCacheConfig:
    def __init__(self, groups: Sequence[Group], num_blocks: int = 0) -> None:
        self.kv_cache_groups = list(groups)
        self.num_blocks = num_blocks


def config(*, attention_first: bool = False, block: int = B) -> KVCacheConfig:
    """The measured config: 3 GDN groups of one layer, one attention group of one layer."""
    gdn = [Group(MambaSpec(block), [name]) for name in GDN_LAYERS]
    attn = [Group(FullAttentionSpec(block), [ATTN_LAYER])]
    return KVCacheConfig(attn + gdn if attention_first else gdn + attn)


# -- fake requests ------------------------------------------------------------------------


class Request:
    """What the tier reads of vLLM's ``Request``. ``blocks`` names each full prompt block's
    tokens (equal names: equal tokens); ``tail`` tokens follow them. ``block_hashes`` is the
    chained SHA-256 of every full hash block (``hash_tokens`` tokens each)."""

    def __init__(self, rid: str, blocks: Sequence[str], tail: int, hash_tokens: int = B) -> None:
        self.request_id = rid
        self.num_prompt_tokens = len(blocks) * B + tail
        self.num_tokens = self.num_prompt_tokens
        self.num_computed_tokens = 0
        per = B // hash_tokens
        h = b"\0" * 32
        self.block_hashes: list[bytes] = []
        for name in blocks:
            for k in range(per):
                h = hashlib.sha256(h + f"{name}/{k}".encode()).digest()
                self.block_hashes.append(h)

    def __repr__(self) -> str:
        return f"Request({self.request_id!r})"


# -- a fake engine around the tier and the worker -----------------------------------------


class FakeEngine:
    """vLLM's side of the connector: one buffer of pages, views per layer, a block
    allocator, block tables per request and group, a "forward" that writes random bytes,
    and what it wrote (``kv_written[(rid, j)]``: block ``j``'s page; ``state_written[(rid,
    n)]``: the state after ``n`` blocks, per recurrent group)."""

    def __init__(
        self,
        *,
        num_units: int = 64,
        num_slots: int = 4,
        num_blocks: int = 40,
        plant: str | None = None,
        attention_first: bool = False,
        hash_tokens: int | None = None,
        log: EventLog | None = None,
    ) -> None:
        self.cfg = config(attention_first=attention_first)
        self.tl = tier_layout(self.cfg)
        self.tier = PrefixTier(
            self.tl, num_units, num_slots, hash_block_tokens=hash_tokens, plant=plant
        )
        if log is not None:
            attach(self.tier.coordinator, log)
        self.buf = torch.zeros(num_blocks * PAGE, dtype=torch.uint8)
        self.pages = self.buf.view(num_blocks, PAGE)  # block id -> its bytes
        self.kv_caches = kv_caches(self.buf, num_blocks, self.cfg)
        self.worker = TierWorker(self.tl, self.kv_caches, num_units, num_slots)
        self.free = list(range(num_blocks - 1, 0, -1))  # block 0 is the null block
        self.tables: dict[str, list[list[int]]] = {}
        self.gen = torch.Generator().manual_seed(1234)
        self.kv_written: dict[tuple[str, int], torch.Tensor] = {}
        self.state_written: dict[tuple[str, int], list[torch.Tensor]] = {}
        self.plans: list[StepPlan] = []

    # memory

    def _random(self, n: int) -> torch.Tensor:
        return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=self.gen)

    def scribble(self, block: int) -> None:
        self.pages[block] = self._random(PAGE)

    def state_bytes(self, block: int) -> torch.Tensor:
        return self.pages[block, :STATE].clone()

    def page_bytes(self, block: int) -> torch.Tensor:
        return self.pages[block].clone()

    # block tables

    def ensure_blocks(self, req: Request, tokens: int) -> None:
        """Blocks for ``tokens`` tokens in every group (fresh ones hold garbage)."""
        table = self.tables.setdefault(req.request_id, [[] for _ in self.cfg.kv_cache_groups])
        need = math.ceil(tokens / B)
        for ids in table:
            while len(ids) < need:
                b = self.free.pop()
                self.scribble(b)
                ids.append(b)

    def block_ids_of(self, rid: str) -> list[list[int]]:
        return self.tables[rid]

    def attn_ids(self, rid: str) -> list[int]:
        return self.tables[rid][self.tl.attention_group]

    def state_ids(self, rid: str, n: int) -> list[int]:
        """The state block of boundary ``n`` (blocks) in each recurrent group."""
        return [self.tables[rid][g][n - 1] for g in self.tl.recurrent_groups]

    # the scheduler's hooks

    def arrive(self, req: Request, num_computed: int = 0) -> int:
        """A waiting request: ``match``, allocate, ``admit``; returns the tokens taken."""
        n = self.tier.match(req, num_computed)
        req.num_computed_tokens = num_computed
        self.ensure_blocks(req, num_computed + n)
        self.tier.admit(req, self.tables[req.request_id], n)
        return n

    def received(self, req: Request, tokens: int) -> None:
        """vLLM's side of a finished async load: the request's tokens count as computed."""
        assert req.request_id in self.worker.received
        req.num_computed_tokens += tokens

    def step(
        self,
        scheduled: dict[Request, int],
        preempted: Iterable[str] = (),
        *,
        report: bool = True,
    ) -> StepPlan:
        """One scheduler pass's end and its step: plan, forward, advance, copies, report."""
        for req, n in scheduled.items():
            self.ensure_blocks(req, req.num_computed_tokens + n)
        plan = self.tier.plan_step(
            {r.request_id: n for r, n in scheduled.items()}, list(preempted), self.block_ids_of
        )
        for req, n in scheduled.items():
            self.forward(req, n)
            req.num_computed_tokens += n
        self.worker.run(plan)
        self.plans.append(plan)
        if report:
            self.tier.steps_ran([plan.step])
        return plan

    def forward(self, req: Request, n: int) -> None:
        """The model computes ``n`` tokens of ``req``: every block it touches gets a new
        page, and the state block of its last block a new state (vLLM's align mode keeps a
        block-aligned prefix's state in that prefix's last block)."""
        rid = req.request_id
        start, end = req.num_computed_tokens, req.num_computed_tokens + n
        attn = self.attn_ids(rid)
        for j in range(start // B, math.ceil(end / B)):
            self.scribble(attn[j])
            if (j + 1) * B <= end:
                self.kv_written[(rid, j)] = self.page_bytes(attn[j])
        last = math.ceil(end / B)
        for b in self.state_ids(rid, last):
            self.pages[b, :STATE] = self._random(STATE)
        if end % B == 0:
            self.state_written[(rid, last)] = [
                self.state_bytes(b) for b in self.state_ids(rid, last)
            ]

    def finish(self, req: Request) -> None:
        self.tier.finished(req)
        for ids in self.tables.pop(req.request_id):
            self.free.extend(reversed(ids))  # reused first: A's blocks are B's garbage

    def settle(self) -> StepPlan:
        """An empty pass and step: delivers the last step's report to the store."""
        return self.step({})


def kv_caches(buf: torch.Tensor, num_blocks: int, cfg: KVCacheConfig) -> dict[str, torch.Tensor]:
    """``register_kv_caches``' dict on vLLM's CPU build: every layer a view over ``buf``."""
    raw = buf.view(torch.int8).view(num_blocks, PAGE)
    out: dict[str, torch.Tensor] = {}
    for g in cfg.kv_cache_groups:
        for name in g.layer_names:
            if type(g.kv_cache_spec).__name__ == "MambaSpec":
                out[name] = raw[:, :STATE].unsqueeze(1).unsqueeze(1)
            else:
                out[name] = buf.view(torch.bfloat16).view(num_blocks, 1, B, PAGE // B // 2)
    for t in out.values():
        assert t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
        assert t.stride(0) * t.element_size() == PAGE
    return out


def run_a(eng: FakeEngine, a: Request) -> None:
    """Request A computes its prompt in chunks of B, 2B and the tail (boundaries at 1 and 3
    blocks), then finishes."""
    assert eng.arrive(a) == 0
    eng.step({a: B})
    eng.step({a: 2 * B})
    eng.step({a: a.num_prompt_tokens - 3 * B})
    eng.finish(a)


def state_of(eng: FakeEngine) -> tuple[Any, dict[str, int], dict[str, int], dict[str, int]]:
    t = eng.tier
    return (t.coordinator.snapshot(), dict(t.stats), t.outstanding(), t.units_held())


# -- 1. the layout --------------------------------------------------------------------------


@pytest.mark.parametrize("attention_first", [False, True])
def test_tier_layout_numbers(attention_first: bool) -> None:
    tl = tier_layout(config(attention_first=attention_first))
    rec = (1, 2, 3) if attention_first else (0, 1, 2)
    assert tl.block_tokens == B
    assert tl.page_bytes == PAGE == 196_608
    assert tl.layout.image_bytes == 3 * 134_144 == 3 * STATE
    assert tl.layout.page_unit_bytes == PAGE
    assert tl.units_per_checkpoint == 3  # ceil(402,432 / 196,608)
    assert tl.recurrent_groups == rec
    assert tl.attention_group == (0 if attention_first else 3)
    assert tl.attention_layers == (ATTN_LAYER,)
    assert [r.name for r in tl.recurrent] == list(GDN_LAYERS)
    assert [r.group for r in tl.recurrent] == list(rec)
    for r in tl.recurrent:
        assert (r.conv_offset, r.conv_bytes) == (0, 3 * 512 * 2)
        assert (r.ssm_offset, r.ssm_bytes) == (3 * 512 * 2, 2 * 128 * 128 * 4)
    assert tl.layout.src_sizes == (3072, 131072) * 3
    spec = tl.layout.spec()
    assert (spec.page_unit_bytes, spec.image_bytes) == (PAGE, 3 * STATE)


def test_tier_layout_small_block_and_string_dtypes() -> None:
    """B = 64: a 32 KiB page, 13 units an image; dtype names and a spec recognised by its
    ``mamba_cache_mode`` read the same as torch dtypes and ``MambaSpec``."""
    groups = [Group(GDNAttentionSpec(64), [n]) for n in GDN_LAYERS]
    tl = tier_layout(KVCacheConfig([*groups, Group(FullAttentionSpec(64), [ATTN_LAYER])]))
    assert tl.page_bytes == 64 * 512 == 32_768
    assert tl.units_per_checkpoint == math.ceil(3 * STATE / 32_768) == 13
    assert tl.layout.image_bytes == 3 * STATE
    assert tl.recurrent_groups == (0, 1, 2) and tl.attention_group == 3
    assert tl.layout.layout_id == tier_layout(config(block=64)).layout.layout_id


def _bad_configs() -> dict[str, KVCacheConfig]:
    gdn = [Group(MambaSpec(), [n]) for n in GDN_LAYERS]
    attn = Group(FullAttentionSpec(), [ATTN_LAYER])
    three = MambaSpec(shapes=(CONV[0], SSM[0], (4,)), dtypes=(torch.bfloat16,) * 3)
    return {
        "no attention group": KVCacheConfig(gdn),
        "two attention groups": KVCacheConfig(
            [*gdn, attn, Group(FullAttentionSpec(), ["model.layers.7.self_attn"])]
        ),
        "no recurrent group": KVCacheConfig([attn]),
        "no groups": KVCacheConfig([]),
        "block sizes differ": KVCacheConfig(
            [*gdn[:2], Group(MambaSpec(2 * B), [GDN_LAYERS[2]]), attn]
        ),
        "attention block differs": KVCacheConfig([*gdn, Group(FullAttentionSpec(B // 2), ["a"])]),
        "three state tensors": KVCacheConfig([Group(three, ["g"]), attn]),
        "one state tensor": KVCacheConfig(
            [Group(MambaSpec(shapes=(SSM[0],), dtypes=(torch.float32,)), ["g"]), attn]
        ),
        "state shapes differ": KVCacheConfig(
            [gdn[0], Group(MambaSpec(shapes=((3, 256), SSM[0])), ["g"]), attn]
        ),
        "unknown dtype": KVCacheConfig(
            [Group(MambaSpec(dtypes=("torch.complex32", torch.float32)), ["g"]), attn]
        ),
        "page not whole bf16 rows": KVCacheConfig(
            [*gdn, Group(FullAttentionSpec(page_size_bytes=PAGE + 1), [ATTN_LAYER])]
        ),
        "odd bytes per token": KVCacheConfig(
            [*gdn, Group(FullAttentionSpec(page_size_bytes=B * 511), [ATTN_LAYER])]
        ),
    }


@pytest.mark.parametrize("name", list(_bad_configs()))
def test_tier_layout_refuses(name: str) -> None:
    cfg = _bad_configs()[name]
    with pytest.raises(UnsupportedKVLayoutError):
        tier_layout(cfg)
    assert issubclass(UnsupportedKVLayoutError, InvalidArgumentError)


def test_byte_rows_views_the_buffer() -> None:
    """``byte_rows`` is a view: a write through it lands in the layer's block, and a range
    past the block is refused."""
    eng = FakeEngine(num_blocks=4)
    t = eng.kv_caches[GDN_LAYERS[1]]
    rows = byte_rows(t, 3072, 16)
    assert rows.shape == (4, 16)
    rows[2] = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(eng.pages[2, 3072:3088], torch.arange(16, dtype=torch.uint8))
    assert byte_rows(eng.kv_caches[ATTN_LAYER], 0, PAGE).shape == (4, PAGE)
    for off, n in ((PAGE - 15, 16), (-1, 4)):
        with pytest.raises(InvalidArgumentError):
            byte_rows(t, off, n)


# -- 2. a round trip: A's prefix served to B ------------------------------------------------


@pytest.mark.parametrize(
    ("attention_first", "hash_tokens"), [(False, None), (True, B // 2)], ids=["last", "first"]
)
def test_round_trip_a_then_b(attention_first: bool, hash_tokens: int | None) -> None:
    eng = FakeEngine(attention_first=attention_first, hash_tokens=hash_tokens)
    tier, ht = eng.tier, hash_tokens or B
    a = Request("A", ["s0", "s1", "s2"], 10, ht)
    run_a(eng, a)
    p0, p1, p2 = eng.plans
    assert len(p0.kv_saves) == 1 and len(p0.stores) == 1
    assert len(p1.kv_saves) == 2 and len(p1.stores) == 1
    assert not (p2.kv_saves or p2.stores or p2.restores)
    assert tier.stats["boundaries"] == 2 and tier.stats["kv_pages_saved"] == 3
    assert tier.units_held() == {"free": 64 - 3 - 6, "kv_pages": 3, "images": 6}

    b = Request("B", ["s0", "s1", "s2", "b3"], 5, ht)
    assert tier.match(b, 0) == 3 * B  # the tier's pages and A's image at boundary 3
    req_b = eng.arrive(b)  # match again (vLLM may ask twice), then admit
    assert req_b == 3 * B
    assert tier.stats["hits"] == 1 and tier.stats["hit_tokens"] == 3 * B
    plan = eng.step({})  # B waits for its async load: the step carries the copies
    assert len(plan.restores) == 1 and len(plan.kv_loads) == 3 and plan.loaded == ("B",)
    (slot,) = plan.slot_blocks
    assert plan.slot_blocks[slot] == tuple(eng.state_ids("B", 3))
    assert [blk for _, blk in plan.kv_loads] == eng.attn_ids("B")[:3]
    # B's blocks hold A's bytes of the same boundary (they held garbage before)
    for g, (got, want) in enumerate(
        zip(eng.state_ids("B", 3), eng.state_written[("A", 3)], strict=True)
    ):
        assert torch.equal(eng.state_bytes(got), want), f"state of group {g}"
    for j in range(3):
        assert torch.equal(eng.page_bytes(eng.attn_ids("B")[j]), eng.kv_written[("A", j)]), j
    # not A's boundary-1 state: the hit restored the newest one
    assert not torch.equal(
        eng.state_bytes(eng.state_ids("B", 3)[0]), eng.state_written[("A", 1)][0]
    )
    assert eng.worker.copies == {"kv_saves": 3, "kv_loads": 3, "stores": 2, "restores": 1}

    eng.received(b, 3 * B)
    eng.step({b: B + 5})
    assert tier.stats["kv_pages_saved"] == 4  # B's own block 3
    eng.finish(b)
    eng.settle()
    assert tier.is_idle(), tier.outstanding()
    assert tier.coordinator.self_check() == []
    assert tier.reset() is True
    assert tier.pool.num_free == tier.pool.num_units
    assert tier.units_held() == {"free": 64, "kv_pages": 0, "images": 0}
    assert tier.match(Request("C", ["s0", "s1", "s2"], 9, ht), 0) == 0


def test_vllm_own_hit_is_not_loaded_again() -> None:
    """vLLM's own prefix cache hit block 0: the tier offers and loads blocks 1-2 only, and
    restores the state of boundary 3."""
    eng = FakeEngine()
    run_a(eng, Request("A", ["s0", "s1", "s2"], 10))
    b = Request("B", ["s0", "s1", "s2", "b3"], 5)
    assert eng.tier.match(b, B + 1) == 0  # not block-aligned
    assert eng.arrive(b, num_computed=B) == 2 * B
    plan = eng.step({})
    assert len(plan.restores) == 1
    assert [blk for _, blk in plan.kv_loads] == eng.attn_ids("B")[1:3]
    for got, want in zip(eng.state_ids("B", 3), eng.state_written[("A", 3)], strict=True):
        assert torch.equal(eng.state_bytes(got), want)
    for j in (1, 2):
        assert torch.equal(eng.page_bytes(eng.attn_ids("B")[j]), eng.kv_written[("A", j)])


def test_match_never_serves_the_last_prompt_token() -> None:
    """A prompt of exactly the three cached blocks can be served two at most (its last
    token is recomputed): that needs the state of boundary 2, and A filed boundaries 1 and
    3 only, so it gets one block. One token more and it gets all three."""
    eng = FakeEngine()
    run_a(eng, Request("A", ["s0", "s1", "s2"], 10))
    assert eng.tier.match(Request("C", ["s0", "s1", "s2"], 0), 0) == B
    assert eng.tier.match(Request("D", ["s0", "s1", "s2"], 1), 0) == 3 * B
    assert eng.tier.match(Request("E", ["s0", "x1", "s2"], 50), 0) == B
    assert eng.tier.match(Request("F", ["x0", "s1", "s2"], 50), 0) == 0


def test_preempted_request_gives_back_its_slot() -> None:
    """B, loaded and running, is preempted in a later pass: its slot is freed (with one
    slot, C is offered the hit only then) and the tier ends idle."""
    eng = FakeEngine(num_slots=1)
    run_a(eng, Request("A", ["s0", "s1", "s2"], 10))
    b = Request("B", ["s0", "s1", "s2", "b3"], 5)
    assert eng.arrive(b) == 3 * B
    eng.step({})
    eng.received(b, 3 * B)
    eng.step({b: B})
    c = Request("C", ["s0", "s1", "s2", "c3"], 5)
    assert eng.tier.match(c, 0) == 0  # the one slot is B's
    plan = eng.step({}, preempted=["B"])
    assert not (plan.restores or plan.kv_loads or plan.loaded)
    assert eng.tier.stats["preempted"] == 1
    assert eng.arrive(c) == 3 * B
    plan = eng.step({})
    assert len(plan.restores) == 1 and plan.loaded == ("C",)
    eng.finish(b)
    eng.finish(c)
    eng.settle()
    assert eng.tier.is_idle(), eng.tier.outstanding()


@pytest.mark.parametrize("order", ["free-then-report", "report-then-free"])
def test_request_finishing_in_its_last_boundary_step_keeps_that_image(order: str) -> None:
    """A's prompt ends on boundary 3 and its last chunk finishes it (``max_tokens=1``): the
    image of boundary 3 rides the step that finishes A. vLLM 0.32 frees A before it
    delivers that step's report (``update_from_output``: ``request_finished`` first, then
    ``update_connector_output``); an engine may deliver the report first. Either way the
    image survives A's free, and B resumes from all three blocks with A's state bytes."""
    eng = FakeEngine()
    tier = eng.tier
    a = Request("A", ["s0", "s1", "s2"], 0)
    assert eng.arrive(a) == 0
    eng.step({a: B})
    last = eng.step({a: 2 * B}, report=False)  # boundary 3: A's last chunk
    assert len(last.stores) == 1
    if order == "free-then-report":
        eng.finish(a)
        tier.steps_ran([last.step])
    else:
        tier.steps_ran([last.step])
        eng.finish(a)
    # freed while its last store's step was unreported: counted as finishing in flight
    assert tier.stats["finished_in_flight"] == (1 if order == "free-then-report" else 0)
    b = Request("B", ["s0", "s1", "s2", "b3"], 5)
    assert eng.arrive(b) == 3 * B
    plan = eng.step({})
    assert len(plan.restores) == 1 and plan.loaded == ("B",)
    for got, want in zip(eng.state_ids("B", 3), eng.state_written[("A", 3)], strict=True):
        assert torch.equal(eng.state_bytes(got), want)
    eng.received(b, 3 * B)
    eng.step({b: B + 5})
    eng.finish(b)
    eng.settle()
    assert tier.is_idle(), tier.outstanding()
    assert tier.coordinator.self_check() == []


# -- 3. bad input changes nothing -----------------------------------------------------------


def _engine_after_a() -> tuple[FakeEngine, Request]:
    eng = FakeEngine(num_slots=2)
    run_a(eng, Request("A", ["s0", "s1", "s2"], 10))
    b = Request("B", ["s0", "s1", "s2", "b3"], 5)
    eng.ensure_blocks(b, 3 * B)
    return eng, b


def test_admit_refuses_external_tokens_not_offered() -> None:
    eng, b = _engine_after_a()
    tier, ids = eng.tier, eng.tables["B"]
    assert tier.match(b, 0) == 3 * B  # opens the pass; B is known
    for n in (2 * B, 4 * B, B + 1):  # a partial load, more than offered, unaligned
        before = state_of(eng)
        with pytest.raises(InvalidArgumentError):
            tier.admit(b, ids, n)
        assert state_of(eng) == before, n
        assert tier.match(b, 0) == 3 * B
    tier.match(Request("Y", ["y0"], 3), 0)
    before = state_of(eng)
    with pytest.raises(InvalidArgumentError):
        tier.admit(Request("Y", ["y0"], 3), [[5]] * 4, B)  # nothing was offered to Y
    assert state_of(eng) == before


def test_refused_admit_leaves_the_offer() -> None:
    """A refused admission changes nothing, the offer included: vLLM may admit again with
    the tokens offered."""
    eng, b = _engine_after_a()
    tier, ids = eng.tier, eng.tables["B"]
    assert tier.match(b, 0) == 3 * B
    with pytest.raises(InvalidArgumentError):
        tier.admit(b, ids, 2 * B)
    tier.admit(b, ids, 3 * B)  # no match in between: the offer survived the refusal
    assert tier.stats["hits"] == 1 and tier.stats["hit_tokens"] == 3 * B
    plan = eng.step({})
    assert len(plan.restores) == 1 and len(plan.kv_loads) == 3 and plan.loaded == ("B",)
    for got, want in zip(eng.state_ids("B", 3), eng.state_written[("A", 3)], strict=True):
        assert torch.equal(eng.state_bytes(got), want)


def test_refused_admit_takes_no_slot() -> None:
    """With one slot, an admission of tokens never offered (to Y) is refused and leaves
    the slot free: B is still offered its hit, and gets it."""
    eng = FakeEngine(num_slots=1)
    run_a(eng, Request("A", ["s0", "s1", "s2"], 10))
    tier = eng.tier
    y = Request("Y", ["y0"], 3)
    assert tier.match(y, 0) == 0
    before = state_of(eng)
    with pytest.raises(InvalidArgumentError):
        tier.admit(y, [[5]] * 4, B)
    assert state_of(eng) == before
    b = Request("B", ["s0", "s1", "s2", "b3"], 5)
    assert tier.match(b, 0) == 3 * B  # 0 if the refused admission had kept the slot
    assert eng.arrive(b) == 3 * B
    plan = eng.step({})
    assert len(plan.restores) == 1 and plan.loaded == ("B",)


@pytest.mark.parametrize(
    ("kind", "index"),
    [("recurrent", 0), ("recurrent", 2), ("attention", 0), ("attention", 2)],
    ids=["state-group-0", "state-group-2", "attn-block-0", "attn-block-2"],
)
def test_admit_refuses_the_null_block(kind: str, index: int) -> None:
    """vLLM's null block (id 0) as a state block of the hit's boundary (recurrent group
    ``index``) or as an attention block of the hit (block ``index``): refused, nothing
    changes, and the offer stands for the real blocks."""
    eng, b = _engine_after_a()
    tier, tl, ids = eng.tier, eng.tl, eng.tables["B"]
    assert tier.match(b, 0) == 3 * B
    bad = [list(g) for g in ids]
    if kind == "recurrent":
        bad[tl.recurrent_groups[index]][2] = 0
    else:
        bad[tl.attention_group][index] = 0
    before = state_of(eng)
    with pytest.raises(InvalidArgumentError):
        tier.admit(b, bad, 3 * B)
    assert state_of(eng) == before
    tier.admit(b, ids, 3 * B)
    plan = eng.step({})
    assert len(plan.restores) == 1 and plan.slot_blocks[plan.restores[0].dst_slot] == tuple(
        eng.state_ids("B", 3)
    )


def test_admit_accepts_null_blocks_outside_the_hit() -> None:
    """State blocks before the hit's boundary are not read (vLLM's align mode may leave
    them null): the admission goes through and restores into the boundary's blocks."""
    eng, b = _engine_after_a()
    tier, tl = eng.tier, eng.tl
    ids = [list(g) for g in eng.tables["B"]]
    for g in tl.recurrent_groups:
        ids[g][0] = ids[g][1] = 0
    assert tier.match(b, 0) == 3 * B
    tier.admit(b, ids, 3 * B)
    plan = eng.step({})
    (slot,) = plan.slot_blocks
    assert plan.slot_blocks[slot] == tuple(eng.state_ids("B", 3))
    assert [blk for _, blk in plan.kv_loads] == eng.attn_ids("B")[:3]


_BAD_TIER_ARGS: dict[str, dict[str, Any]] = {
    "num_units below one image": {"num_units": 2},
    "num_units a float": {"num_units": 3.0},
    "num_slots 0": {"num_slots": 0},
    "num_slots True": {"num_slots": True},
    "hash_block_tokens 0": {"hash_block_tokens": 0},
    "hash_block_tokens not a divisor": {"hash_block_tokens": 5},
    "hash_block_tokens twice the block": {"hash_block_tokens": 2 * B},
    "hash_block_tokens True": {"hash_block_tokens": True},
    "hash_block_tokens a float divisor": {"hash_block_tokens": 3.0},
    "unknown plant": {"plant": "complete-late"},
    "empty plant": {"plant": ""},
}


@pytest.mark.parametrize("name", list(_BAD_TIER_ARGS))
def test_prefix_tier_refuses_bad_arguments(name: str) -> None:
    args: dict[str, Any] = {"num_units": 64, "num_slots": 4, **_BAD_TIER_ARGS[name]}
    tl = tier_layout(config())
    with pytest.raises(InvalidArgumentError):
        PrefixTier(tl, args.pop("num_units"), args.pop("num_slots"), **args)


def test_prefix_tier_accepts_edge_arguments() -> None:
    tl = tier_layout(config())
    assert tl.units_per_checkpoint == 3
    t = PrefixTier(tl, 3, 1)  # one image's units, one slot
    assert t.pool.num_units == 3 and t.num_slots == 1 and t.plant is None
    for hbt in (1, 2, 3, B // 2, B):
        assert PrefixTier(tl, 64, 4, hash_block_tokens=hbt)._hash_stride == B // hbt
    for plant in PLANTED_BUGS:
        assert PrefixTier(tl, 64, 4, plant=plant).plant == plant
    assert PLANTED_BUGS == ("complete-early", "sync-load")


# -- 4. the worker refuses a bad plan whole ------------------------------------------------


def _tensors(eng: FakeEngine) -> list[torch.Tensor]:
    """Copies of everything the worker writes: its unit tensors (as bytes: random bf16
    holds NaNs), vLLM's buffer, the slot map."""
    t = eng.worker.tensors
    units = (x.view(torch.uint8).clone() for x in t.kv_tensors)
    return [*units, eng.buf.clone(), t.slot_blocks.clone()]


def _same(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "bad",
    [{0: (7, 8, 9), 1: (7, 10, 11)}, {0: (7, 8)}, {3: (7, 8, 9)}],
    ids=["two-slots-one-block", "a-group-short", "slot-out-of-range"],
)
def test_map_slots_refused_changes_nothing(bad: dict[int, tuple[int, ...]]) -> None:
    eng = FakeEngine(num_slots=2, num_blocks=16)
    t = eng.worker.tensors
    t.map_slots({1: (4, 5, 6)})
    before = t.slot_blocks.clone()
    with pytest.raises(InvalidArgumentError):
        t.map_slots(bad)
    assert torch.equal(t.slot_blocks, before)
    assert t.slot_blocks.tolist() == [[-1, -1, -1], [4, 5, 6]]


def test_map_slots_same_block_in_two_groups() -> None:
    """One block id in two groups is two different blocks' worth of state: allowed."""
    eng = FakeEngine(num_slots=2, num_blocks=16)
    t = VllmStateTensors(eng.tl, eng.kv_caches, 8, 2)
    t.map_slots({0: (7, 7, 7), 1: (8, 9, 8)})
    assert t.slot_blocks.tolist() == [[7, 7, 7], [8, 9, 8]]
    t.map_slots({1: (3, 3, 3)})  # every other slot unmapped
    assert t.slot_blocks.tolist() == [[-1, -1, -1], [3, 3, 3]]


def _boundary_plan(eng: FakeEngine) -> StepPlan:
    """A's first step planned (not run): a KV page save and the store of boundary 1."""
    a = Request("A", ["s0", "s1", "s2"], 10)
    assert eng.arrive(a) == 0
    eng.ensure_blocks(a, B)
    plan = eng.tier.plan_step({"A": B}, [], eng.block_ids_of)
    assert len(plan.kv_saves) == 1 and len(plan.stores) == 1 and len(plan.slot_blocks) == 1
    return plan


def test_worker_refuses_an_op_on_an_unmapped_slot() -> None:
    eng = FakeEngine()
    plan = _boundary_plan(eng)
    with pytest.raises(InvalidArgumentError):
        eng.worker.run(attrs.evolve(plan, slot_blocks={}))
    assert eng.worker.steps_run == [] and not eng.worker.received
    assert set(eng.worker.copies.values()) == {0}
    eng.worker.run(plan)  # the plan as planned runs
    assert eng.worker.copies == {"kv_saves": 1, "kv_loads": 0, "stores": 1, "restores": 0}


def _bad_plans(eng: FakeEngine, plan: StepPlan) -> dict[str, StepPlan]:
    (store,) = plan.stores
    (slot,) = plan.slot_blocks
    other = 1 - slot
    lid, nbytes = eng.tl.layout.layout_id, eng.tl.layout.image_bytes
    restore = CheckpointRestoreOp(other, (20, 21, 22), nbytes, lid)
    return {
        "kv-load-out-of-range": attrs.evolve(plan, kv_loads=((5, 10_000),)),
        "kv-save-unit-out-of-range": attrs.evolve(plan, kv_saves=((4, 64),)),
        "two-slots-one-block": attrs.evolve(
            plan, slot_blocks={**plan.slot_blocks, other: plan.slot_blocks[slot]}
        ),
        "store-slot-out-of-range": attrs.evolve(
            plan, stores=(store.evolve(src_slot=9),), slot_blocks={}
        ),
        "store-unit-out-of-range": attrs.evolve(
            plan, stores=(store.evolve(unit_ids=(1, 2, 64)),)
        ),
        "store-wrong-layout": attrs.evolve(
            plan, stores=(store.evolve(layout_id=lid + "x"),)
        ),
        "store-slot-unmapped": attrs.evolve(plan, slot_blocks={}),
        "restore-slot-unmapped": attrs.evolve(plan, kv_saves=(), restores=(restore,)),
    }


@pytest.mark.parametrize(
    "name",
    [
        "kv-load-out-of-range",
        "kv-save-unit-out-of-range",
        "two-slots-one-block",
        "store-slot-out-of-range",
        "store-unit-out-of-range",
        "store-wrong-layout",
        "store-slot-unmapped",
        "restore-slot-unmapped",
    ],
)
def test_worker_refused_plan_copies_nothing(name: str) -> None:
    """``TierWorker.run`` checks the whole plan before it copies anything: a bad plan
    (of a KV page save, a store and whatever the case adds) raises and leaves the unit
    tensors, vLLM's buffer and the slot map as they were."""
    eng = FakeEngine()
    plan = _boundary_plan(eng)
    bad = _bad_plans(eng, plan)[name]
    for x in eng.worker.tensors.kv_tensors:  # units 20-22 hold an "image" to restore
        x.view(torch.uint8)[20:23] = eng._random(x[20:23].numel() * 2).view(3, -1)
    eng.worker.tensors.map_slots({1: (30, 31, 32)})  # a previous step's map
    before = _tensors(eng)
    with pytest.raises(PagedStateError):
        eng.worker.run(bad)
    assert _same(_tensors(eng), before)
    assert eng.worker.steps_run == [] and set(eng.worker.copies.values()) == {0}


# -- 5. the event log of a run replays on the reference model ------------------------------


def _logged_run() -> tuple[FakeEngine, list[str]]:
    """An 8-unit pool: A files boundaries 1 and 2 (two pages, two images: the whole pool),
    B hits A's prefix and is restored, then C and E crowd the pool until KV pages are
    evicted (and the images that need them)."""
    out = io.StringIO()
    log = EventLog(out)
    eng = FakeEngine(num_units=8, log=log)
    a = Request("A", ["s0", "s1"], 10)
    assert eng.arrive(a) == 0
    eng.step({a: B})
    eng.step({a: B})
    eng.step({a: 10})
    eng.finish(a)
    b = Request("B", ["s0", "s1", "b2"], 5)
    assert eng.arrive(b) == 2 * B
    eng.step({})
    eng.received(b, 2 * B)
    eng.step({b: B + 5})
    eng.finish(b)
    run_a(eng, Request("C", ["c0", "c1", "c2"], 7))
    run_a(eng, Request("E", ["e0", "e1", "e2"], 7))
    eng.settle()
    log.close()
    return eng, out.getvalue().splitlines(keepends=True)


def test_event_log_replays_on_the_reference() -> None:
    eng, lines = _logged_run()
    s = eng.tier.stats
    assert s["kv_pages_evicted"] > 0 and s["hits"] >= 1 and s["restores"] >= 1
    assert eng.tier.is_idle(), eng.tier.outstanding()
    calls = [json.loads(line).get("call") for line in lines]
    assert {"begin_restore", "checkpoint", "unindex", "pool.release_units"} <= set(calls)
    result = checklog.check_log(lines)
    assert result.status == "matched", result.text()
    assert result.calls == len(lines) - 2  # all but the header and the footer


@pytest.mark.parametrize("call", ["begin_restore", "unindex", "pool.reserve_units"])
def test_event_log_edited_free_count_mismatches_at_that_line(call: str) -> None:
    _, lines = _logged_run()
    k = next(i for i, line in enumerate(lines) if json.loads(line).get("call") == call)
    obj = json.loads(lines[k])
    free = obj["post"]["free"]
    obj["post"]["free"] = free + 1
    edited = [*lines[:k], json.dumps(obj, separators=(",", ":")) + "\n", *lines[k + 1 :]]
    result = checklog.check_log(edited)
    assert result.status == "mismatch" and result.line == k + 1, result.text()
    assert result.call == call and result.calls == k - 1
    (diff,) = result.differences
    assert (diff.field, diff.expected, diff.logged) == ("post", {"free": free}, {"free": free + 1})


# -- 6. planted bugs: what they change ------------------------------------------------------


def test_planted_complete_early_settles_before_the_copies_ran() -> None:
    """``complete-early``: the batch of A's boundary step is completed in the step's own
    pass, before its copies ran, with no completion token: the image is settled at once.
    The correct tier completes that batch at the next pass's top with the step's token,
    unset until the worker reports the step: the image is READY, not settled, and one
    completion is owed until then."""
    good, bad = FakeEngine(), FakeEngine(plant="complete-early")
    for eng in (good, bad):
        a = Request("A", ["s0", "s1", "s2"], 10)
        assert eng.arrive(a) == 0
        plan = eng.step({a: B}, report=False)  # boundary 1; step 0 not reported yet
        assert len(plan.stores) == 1
    # the next pass opens with a match (before steps_ran([0]))
    good_hit = good.tier.match(Request("B", ["s0", "b1"], 5), 0)
    bad_hit = bad.tier.match(Request("B", ["s0", "b1"], 5), 0)

    h = prefix_hash_of(Request("A", ["s0"], 0).block_hashes[0])

    def image(eng: FakeEngine) -> Any:
        (rec,) = [r for r in eng.tier.coordinator.snapshot().records.values() if r.prefix_hash == h]
        return rec

    assert good.tier.outstanding()["completions"] == 1
    assert image(good).phase == "READY" and not image(good).settled
    assert bad.tier.outstanding()["completions"] == 0
    assert image(bad).phase == "READY" and image(bad).settled
    # both offer the hit (an unsettled image may be restored: the restore rides a later
    # step); what differs is whether the image counts as known copied
    assert good_hit == bad_hit == B
    # once step 0 is reported, the correct tier settles it at the next pass's top
    good.tier.steps_ran([0])
    good.step({})  # ends the pass that match opened
    assert good.tier.outstanding()["completions"] == 1
    good.settle()
    assert good.tier.outstanding()["completions"] == 0 and image(good).settled


@pytest.mark.parametrize("plant", [None, "sync-load"])
def test_planted_sync_load_reports_no_load(plant: str | None) -> None:
    """``sync-load``: the plan carrying B's restore and pages does not report B received
    (vLLM runs it in that very step); the correct tier reports it."""
    eng = FakeEngine(plant=plant)
    run_a(eng, Request("A", ["s0", "s1", "s2"], 10))
    assert eng.arrive(Request("B", ["s0", "s1", "s2", "b3"], 5)) == 3 * B
    plan = eng.step({})
    assert len(plan.restores) == 1 and len(plan.kv_loads) == 3
    assert plan.loaded == (() if plant else ("B",))
    assert ("B" in eng.worker.received) is (plant is None)
