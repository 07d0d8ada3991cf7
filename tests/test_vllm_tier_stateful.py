"""An adversarial stateful test of the vLLM prefix tier (``PrefixTier`` + ``TierWorker``),
driven the way vLLM 0.32 drives the connector (docs/vllm.md), in random interleavings.

The fake vLLM (:class:`TierMachine`) keeps one buffer of ``NUM_BLOCKS`` pages with every
layer a view over it (three GDN groups of one layer, one attention group; the config
classes come from ``tests/test_vllm_tier.py``, the geometry is smaller: 4-token blocks,
640-byte pages, 608-byte states, 3 units an image), a LIFO block allocator (block 0 is the
null block; freed blocks are reused first, scribbled; with ``null_blocks`` a recurrent
group holds a real block only where the state is, as align mode does), per-request block
tables, and requests whose prompts start with one of two shared system prompts or continue
an earlier prompt (so the tier hits), prefilled in chunks, then sampling a few tokens.

A scheduler pass is any interleaving of: a waiting request's ``match`` then ``admit``
(with vLLM's own prefix-cache hit of ``k`` blocks, the tier's offer accepted as an
asynchronous load; or the allocation failing after ``match``; or the offer declined),
scheduling a running or freshly loaded request for a chunk (block-aligned ends mostly, not
always), preempting a running request (its blocks freed at once, possibly re-admitted in
the same pass; sometimes without telling the tier, as ``reset_running_requests`` does),
aborting a request (also between ``admit`` and ``plan_step``, and while its load is
pending), ``reset()`` (also mid-pass). Besides these fine-grained rules, ``vllm_pass`` runs
a whole pass as vLLM's scheduler orders it (Hypothesis' swarm testing disables random
rules per run; the pass rule keeps every run busy). The pass ends with ``plan_step``; the
step then runs: vLLM's
``preprocess_mamba`` copy, the forward, then ``worker.run(plan)`` (copies ride after the
forward). The step's output (the loads received, the requests that hit their last token,
the step id for ``steps_ran``) is delivered zero, one or two passes later, as async
scheduling does; a finished request is freed before ``steps_ran`` of the same output.

The forward is deterministic: every page and state it writes is a function of the prompt
tokens before it (as a real model's are), so the machine knows what every block must hold.

Checked after every rule: the coordinator's and the pool's ``self_check``, the SPEC C
invariants on the coordinator's snapshot, every unit accounted for, every KV page pin owed
to a live load or an unreported step (and every such reason holding its pin), the tier's
slots and requests, every KV page of the tier holding its block's bytes. At every
eviction of a KV page: no image (indexed, in flight or pending) whose prefix runs through
it survives. At every plan: every load admitted in the pass rides it. At every forward:
the request reads exactly the state and KV pages a from-scratch run would (so a restore
that lands late or wrong is seen). After a load's step: the restored state blocks and KV
blocks hold the bytes of the forward that computed that prefix. At teardown: once every
request finished and every step was reported, the tier is idle, and ``reset()`` frees
every unit.

The planted-bug tests run the same machine on a tier with one method's source edited
(``plant_helpers``) and assert that the machine fails, and with which check. The last
three tests pin bugs found in tier.py while writing this machine (resource bugs, not wrong
bytes: the machine's byte checks passed on them), fixed since.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from plant_helpers import edited_method, plant
from test_vllm_tier import B as TB
from test_vllm_tier import FakeEngine, FullAttentionSpec, Group, KVCacheConfig, MambaSpec, Request

from pagedstate.engines.vllm.layout import tier_layout
from pagedstate.engines.vllm.plan import StepPlan
from pagedstate.engines.vllm.tier import PrefixTier, prefix_hash_of
from pagedstate.engines.vllm.worker import TierWorker
from pagedstate.spec import check_invariants

BT = 4  # tokens per vLLM block
CONV_SHAPE, SSM_SHAPE = (3, 16), (2, 8, 8)
STATE = 3 * 16 * 2 + 2 * 8 * 8 * 4  # 608 bytes of one GDN layer's state
PAGE = BT * 160  # 640 bytes of one attention block (>= STATE: one buffer of pages)
NUM_BLOCKS = 192
GDN_LAYERS = tuple(f"model.layers.{i}.linear_attn" for i in range(3))
ATTN_LAYER = "model.layers.3.self_attn"
MAX_LIVE = 5  # live requests at once (5 x 8 blocks x 4 groups < NUM_BLOCKS)
ROOT = b"\0" * 32


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def small_config(attention_first: bool) -> KVCacheConfig:
    gdn = [
        Group(MambaSpec(BT, (CONV_SHAPE, SSM_SHAPE), (torch.bfloat16, torch.float32)), [n])
        for n in GDN_LAYERS
    ]
    attn = [Group(FullAttentionSpec(BT, page_size_bytes=PAGE), [ATTN_LAYER])]
    return KVCacheConfig(attn + gdn if attention_first else gdn + attn)


def kv_caches(buf: torch.Tensor, cfg: KVCacheConfig) -> dict[str, torch.Tensor]:
    """``register_kv_caches``' dict on vLLM's CPU build: every layer a view over ``buf``."""
    raw = buf.view(torch.int8).view(NUM_BLOCKS, PAGE)
    out: dict[str, torch.Tensor] = {}
    for g in cfg.kv_cache_groups:
        for name in g.layer_names:
            if type(g.kv_cache_spec).__name__ == "MambaSpec":
                out[name] = raw[:, :STATE].unsqueeze(1).unsqueeze(1)
            else:
                out[name] = buf.view(torch.bfloat16).view(NUM_BLOCKS, 1, BT, PAGE // BT // 2)
    return out


# -- requests and what a deterministic model writes -----------------------------------------


class Req:
    """What the tier reads of vLLM's ``Request``, growing as vLLM's does: ``names`` name
    the full prompt blocks (equal names: equal tokens), ``tail`` tokens follow, then up to
    ``max_new`` sampled tokens. ``block_hashes`` is the chained SHA-256 of every full hash
    block (``hash_tokens`` tokens), extended as sampled tokens fill blocks. Blocks past
    the named ones hold tokens of this request only."""

    def __init__(
        self, rid: str, names: list[str], tail: int, hash_tokens: int, max_new: int
    ) -> None:
        self.request_id = rid
        self.names = tuple(names)
        self.hash_tokens = hash_tokens
        self.per = BT // hash_tokens
        self.num_prompt_tokens = len(names) * BT + tail
        self.num_tokens = self.num_prompt_tokens
        self.max_tokens = self.num_tokens + max_new
        self.num_computed_tokens = 0
        self.block_hashes: list[bytes] = []
        self._grow()

    def __repr__(self) -> str:
        return f"Req({self.request_id!r})"

    def name_of(self, j: int) -> str:
        return self.names[j] if j < len(self.names) else f"{self.request_id}@{j}"

    def _grow(self) -> None:
        while (len(self.block_hashes) + 1) * self.hash_tokens <= self.num_tokens:
            j, k = divmod(len(self.block_hashes), self.per)
            prev = self.block_hashes[-1] if self.block_hashes else ROOT
            self.block_hashes.append(
                hashlib.sha256(prev + f"{self.name_of(j)}/{k}".encode()).digest()
            )

    def sample(self) -> None:
        """vLLM appended a sampled token."""
        self.num_tokens += 1
        self._grow()

    def chain(self, j: int) -> bytes:
        """The chained hash of the first ``j + 1`` blocks."""
        return self.block_hashes[(j + 1) * self.per - 1]

    def h(self, j: int) -> int:
        """The tier's prefix hash of the first ``j + 1`` blocks."""
        return prefix_hash_of(self.chain(j))

    def identity(self, t: int) -> bytes:
        """Names the first ``t`` tokens (equal for two requests with equal tokens)."""
        j, m = divmod(t, BT)
        base = self.chain(j - 1) if j else ROOT
        return base if m == 0 else base + f"|{self.name_of(j)}|{m}".encode()


_CONTENT: dict[bytes, torch.Tensor] = {}


def _content(key: bytes, n: int) -> torch.Tensor:
    t = _CONTENT.get(key)
    if t is None:
        t = torch.frombuffer(bytearray(hashlib.shake_256(key).digest(n)), dtype=torch.uint8)
        _CONTENT[key] = t
    return t


def kv_expect(req: Req, j: int, t: int) -> torch.Tensor:
    """Attention block ``j``'s page once ``t`` tokens are computed."""
    return _content(b"kv" + req.identity(min(t, (j + 1) * BT)), PAGE)


def state_expect(req: Req, t: int, gi: int) -> torch.Tensor:
    """Recurrent group ``gi``'s state after ``t`` tokens."""
    return _content(b"st%d" % gi + req.identity(t), STATE)


class Live:
    """A request vLLM holds: ``status`` is ``waiting`` (new or preempted), ``loading``
    (admitted with an asynchronous load), ``ready`` (its load received) or ``running``;
    ``table`` its block ids per group; ``hit`` ``(k, r)`` of its load (vLLM's own hit,
    the tier's end, in blocks)."""

    def __init__(self, req: Req) -> None:
        self.req = req
        self.status = "waiting"
        self.table: list[list[int]] | None = None
        self.hit: tuple[int, int] | None = None


#: whether a chunk ends on a block boundary: mostly (vLLM's align mode splits a prefill at
#: block boundaries; a prompt's last chunk ends where the prompt does)
ALIGNED = st.sampled_from([True, True, True, False])
#: a new request: (system prompt, its blocks used, own blocks, tail tokens, tokens to
#: sample, follow): ``follow`` > 0 continues the ``follow``-th latest prompt instead (a
#: conversation's next turn: that prompt's blocks, then its own)
REQUEST = st.tuples(
    st.integers(0, 1),
    st.sampled_from([0, 1, 2, 3, 3, 3]),
    st.integers(0, 2),
    st.integers(0, BT - 1),
    st.integers(0, 3),
    st.sampled_from([0, 0, 1, 2]),
)
#: an admission: (vLLM's own hit at most, blocks: mostly none, else the tier has nothing
#: to add), mode, aligned chunk end, chunk draw
ADMIT = st.tuples(
    st.sampled_from([0, 0, 0, 0, 1, 2, 4]),
    st.sampled_from(["admit"] * 5 + ["alloc-fails", "decline"]),
    ALIGNED,
    st.integers(0, 11),
)


def _pick_end(s: int, total: int, aligned: bool, v: int) -> int:
    e = (s // BT + 1 + v % 3) * BT if aligned else s + 1 + v % (3 * BT)
    return min(e, total)


# -- the machine ----------------------------------------------------------------------------


class TierMachine(RuleBasedStateMachine):
    """The fake vLLM around a tier and its worker (see the module doc)."""

    #: ``(method, old, new)``: a planted bug (see :data:`MUTANTS`), or None
    mutant: ClassVar[tuple[str, str, str] | None] = None
    #: the tier's own planted bug (``PLANTED_BUGS``), or None
    tier_plant: ClassVar[str | None] = None
    #: check the tier's own bookkeeping (pins, steps, slots, pending loads); False leaves
    #: what vLLM and the bytes can see
    white_box: ClassVar[bool] = True
    #: what the runs did, summed over every run of this class (coverage)
    stats: ClassVar[Counter[str]]

    def __init__(self) -> None:
        super().__init__()
        self.ready = False

    # -- setup -------------------------------------------------------------------------

    @initialize(
        num_units=st.sampled_from([3, 5, 8, 12, 20, 32, 32]),
        num_slots=st.sampled_from([1, 2, 3, 5, 8]),
        hash_tokens=st.sampled_from([BT, BT // 2, 1]),
        attention_first=st.booleans(),
        null_blocks=st.booleans(),
    )
    def setup(
        self,
        num_units: int,
        num_slots: int,
        hash_tokens: int,
        attention_first: bool,
        null_blocks: bool,
    ) -> None:
        self.cfg = small_config(attention_first)
        self.tl = tier_layout(self.cfg)
        self.num_units, self.num_slots = num_units, num_slots
        self.hash_tokens = hash_tokens
        self.null_blocks = null_blocks  # align mode: only the state's block is real
        self.groups = len(self.cfg.kv_cache_groups)
        self.rec = self.tl.recurrent_groups
        self.ag = self.tl.attention_group
        tier = PrefixTier(
            self.tl, num_units, num_slots, hash_block_tokens=hash_tokens, plant=self.tier_plant
        )
        if self.mutant is not None:
            plant(tier, *self.mutant)
        self.tier = tier
        inner_evict = tier._evict_page

        def evict_and_check() -> bool:  # every eviction is checked as it happens
            before = set(tier._pages)
            done = inner_evict()
            for page in before - set(tier._pages):
                self.check_evicted(page)
            return done

        tier._evict_page = evict_and_check  # type: ignore[method-assign]
        self.buf = torch.zeros(NUM_BLOCKS * PAGE, dtype=torch.uint8)
        self.pages = self.buf.view(NUM_BLOCKS, PAGE)
        self.worker = TierWorker(self.tl, kv_caches(self.buf, self.cfg), num_units, num_slots)
        self.unit_rows = self.worker.tensors._kv_rows[0]
        self.gen = torch.Generator().manual_seed(7)
        self.free = list(range(NUM_BLOCKS - 1, 0, -1))
        self.live: dict[str, Live] = {}
        self.n = 0
        self.prompts: list[tuple[str, ...]] = []
        # the model: what forwards wrote, by the tier's prefix hash
        self.kv_by_hash: dict[int, torch.Tensor] = {}
        self.state_by_hash: dict[int, list[torch.Tensor]] = {}
        self.prefix_of: dict[int, tuple[int, ...]] = {}  # image hash -> its pages' hashes
        # vLLM's own prefix cache: the chained hashes whose page / boundary state it holds
        self.vllm_kv: set[bytes] = set()
        self.vllm_state: set[bytes] = set()
        # the open pass and the undelivered step outputs (step, loaded, finished)
        self.pass_open = False
        self.pass_sched: dict[str, int] = {}
        self.pass_preempted: list[str] = []
        self.pass_admitted: set[str] = set()
        self.pass_loads: set[str] = set()
        self.outputs: deque[tuple[int, tuple[str, ...], tuple[str, ...]]] = deque()
        self.next_step = 0
        self.ready = True

    # -- vLLM's memory ---------------------------------------------------------------------

    def scribble(self, block: int) -> None:
        self.pages[block] = torch.randint(0, 256, (PAGE,), dtype=torch.uint8, generator=self.gen)

    def alloc(self, live: Live, tokens: int, keep: set[int]) -> None:
        """Blocks for ``tokens`` tokens in every group; with ``null_blocks``, a recurrent
        group gets a real block only at the positions in ``keep`` (where its state is
        read or written) and the null block elsewhere, as vLLM's align mode does."""
        if live.table is None:
            live.table = [[] for _ in range(self.groups)]
        need = math.ceil(tokens / BT)
        for g, ids in enumerate(live.table):
            while len(ids) < need:
                if self.null_blocks and g != self.ag and len(ids) not in keep:
                    ids.append(0)
                    continue
                b = self.free.pop()
                self.scribble(b)
                ids.append(b)

    def release_blocks(self, live: Live) -> None:
        if live.table is not None:
            for ids in live.table:
                self.free.extend(reversed([b for b in ids if b]))
        live.table = None

    def drop_old_state_blocks(self, live: Live) -> None:
        """vLLM's align mode frees a recurrent group's blocks behind the state's."""
        if not self.null_blocks or live.table is None:
            return
        t = (
            live.hit[1] * BT
            if live.status == "loading" and live.hit
            else live.req.num_computed_tokens
        )
        cur = math.ceil(t / BT) - 1
        for g in self.rec:
            ids = live.table[g]
            for i in range(min(cur, len(ids))):
                if ids[i]:
                    self.free.append(ids[i])
                    ids[i] = 0

    def vllm_hit(self, req: Req, want: int) -> int:
        """Blocks of ``req`` vLLM's own prefix cache can give, at most ``want``: pages some
        forward computed, ending at a boundary whose state one computed (since its last
        reset)."""
        top = min(want, (req.num_tokens - 1) // BT)
        best = 0
        for k in range(1, top + 1):
            if req.chain(k - 1) not in self.vllm_kv:
                break
            if req.chain(k - 1) in self.vllm_state:
                best = k
        return best

    def fill_vllm_hit(self, live: Live, k: int) -> None:
        """vLLM's own hit of ``k`` blocks: its cached pages and the state at ``k``."""
        if not k:
            return
        req, table = live.req, live.table
        assert table is not None
        for j in range(k):
            self.pages[table[self.ag][j]] = kv_expect(req, j, k * BT)
        for gi, g in enumerate(self.rec):
            assert table[g][k - 1], "the state block of vLLM's hit is real"
            self.pages[table[g][k - 1], :STATE] = state_expect(req, k * BT, gi)

    # -- the model's forward -----------------------------------------------------------------

    def forward(self, live: Live, n: int) -> None:
        """``preprocess_mamba`` then the forward of tokens ``[s, s + n)``: checks that the
        request reads what a from-scratch run would (the KV of every earlier block, the state
        after ``s``), then writes its pages and the state, recording each full block and
        block-aligned state by prefix hash."""
        req, table = live.req, live.table
        assert table is not None
        rid = req.request_id
        s, e = req.num_computed_tokens, req.num_computed_tokens + n
        attn = table[self.ag]
        for j in range(math.ceil(s / BT)):
            assert torch.equal(self.pages[attn[j]], kv_expect(req, j, s)), (
                f"{rid} reads a wrong KV page at block {j} (computed {s})"
            )
        src, dst = math.ceil(s / BT) - 1, math.ceil(e / BT) - 1
        for gi, g in enumerate(self.rec):
            b = table[g][dst]
            assert b, f"{rid}: the state block of step end {e} is the null block"
            if s:
                if src != dst:
                    assert table[g][src], f"{rid}: the state of {s} is in the null block"
                    self.pages[b, :STATE] = self.pages[table[g][src], :STATE]
                assert torch.equal(self.pages[b, :STATE], state_expect(req, s, gi)), (
                    f"{rid} starts from a wrong state in group {g} (computed {s})"
                )
        for j in range(s // BT, math.ceil(e / BT)):
            self.pages[attn[j]] = kv_expect(req, j, e)
            if (j + 1) * BT <= e:
                self.kv_by_hash[req.h(j)] = kv_expect(req, j, e)
                self.vllm_kv.add(req.chain(j))
        for gi, g in enumerate(self.rec):
            self.pages[table[g][dst], :STATE] = state_expect(req, e, gi)
        if e % BT == 0:
            self.state_by_hash[req.h(e // BT - 1)] = [
                state_expect(req, e, gi) for gi in range(len(self.rec))
            ]
            self.vllm_state.add(req.chain(e // BT - 1))

    # -- checks ---------------------------------------------------------------------------

    def check_evicted(self, page: int) -> None:
        """The tier just evicted KV page ``page``: no image whose prefix runs through it is
        left indexed, in flight or pending (SPEC A.4)."""
        snap = self.tier.coordinator.snapshot()
        images = set(snap.index) | set(snap.pending) | {h for _, h in snap.pending_boundaries}
        for h in images:
            assert h in self.prefix_of, f"the tier holds image {h} of no known prefix"
            assert page not in self.prefix_of[h], (
                f"image {h} survived the eviction of KV page {page} of its prefix"
            )

    def check_loaded(self, plan: StepPlan) -> None:
        """After a load's step: the state blocks and KV blocks of the hit hold the bytes the
        forward that computed that prefix wrote."""
        for rid in plan.loaded:
            live = self.live.get(rid)
            if live is None:
                continue
            assert live.hit is not None and live.table is not None
            req, (k, r) = live.req, live.hit
            h = req.h(r - 1)
            assert h in self.state_by_hash, f"{rid} was served boundary {r}, never computed"
            for gi, g in enumerate(self.rec):
                got = self.pages[live.table[g][r - 1], :STATE]
                assert torch.equal(got, self.state_by_hash[h][gi]), (
                    f"{rid}: restored state of boundary {r} differs in group {g}"
                )
            for j in range(k, r):
                assert req.h(j) in self.kv_by_hash, f"{rid} was served page {j}, never computed"
                assert torch.equal(self.pages[live.table[self.ag][j]], self.kv_by_hash[req.h(j)]), (
                    f"{rid}: loaded KV page {j} differs"
                )
            self.stats["loads checked"] += 1

    @invariant()
    def tier_consistent(self) -> None:
        if not self.ready:
            return
        t = self.tier
        assert t.coordinator.self_check() == []
        snap = t.coordinator.snapshot()
        assert check_invariants(snap) == []
        assert t.pool.self_check() == []
        held = t.units_held()
        assert sum(held.values()) == self.num_units and min(held.values()) >= 0, held
        # every KV page: a unit of its own, tagged with its hash, holding its block's bytes
        kv_units = {u: o for u, (o, _) in snap.tags.items() if o[0] == "kv-page"}
        assert len(kv_units) == len(t._pages) == held["kv_pages"]
        for h, unit in t._pages.items():
            assert kv_units.get(unit) == ("kv-page", h)
            want = self.kv_by_hash.get(h)
            assert want is not None, f"the tier holds KV page {h}, which no forward computed"
            assert torch.equal(self.unit_rows[unit], want), f"KV page {h} holds wrong bytes"
        if not self.white_box:
            return
        # every pin owed to a live load or an unreported step, and every such reason pinned
        owed: Counter[int] = Counter()
        for seq in t._seqs.values():
            if seq.load is not None:
                owed.update(seq.load[2])
        for hashes in t._step_pins.values():
            owed.update(hashes)
        assert dict(owed) == t._pins, f"KV page pins {t._pins} != the pins owed {dict(owed)}"
        assert set(t._pins) <= set(t._pages)
        undelivered = {s for s, _, _ in self.outputs}
        assert set(t._tokens) == set(t._step_pins) == undelivered
        # requests and slots
        assert set(t._seqs) <= set(self.live)
        slots = [s.state_slot for s in t._seqs.values() if s.state_slot >= 0]
        free = t._slots.free_slots
        assert len(set(slots)) == len(slots) and not set(slots) & free
        assert len(slots) + len(free) == self.num_slots
        for rid, seq in t._seqs.items():
            if seq.load is not None:
                assert rid in self.pass_loads, f"{rid} holds a load it was not admitted for"

    # -- the scheduler's hooks -------------------------------------------------------------

    def candidates(self, *statuses: str) -> list[str]:
        return [rid for rid, lv in self.live.items() if lv.status in statuses]

    def can_open(self) -> bool:
        """A pass may open (or go on) while at most two step outputs are undelivered."""
        return self.ready and len(self.outputs) <= 2

    def new_request(
        self, system: int, shared: int, own: int, tail: int, max_new: int, follow: int
    ) -> None:
        """Up to three blocks of one of two shared system prompts (or an earlier prompt's
        blocks), then its own blocks."""
        if len(self.live) >= MAX_LIVE:
            return
        rid = f"r{self.n}"
        self.n += 1
        if follow and self.prompts:
            names = list(self.prompts[-min(follow, len(self.prompts))][:4])
        else:
            names = [f"sys{system}.{i}" for i in range(shared)]
        names += [f"{rid}.{i}" for i in range(own)]
        self.prompts.append(tuple(names))
        req = Req(rid, names, tail if names or tail else 1, self.hash_tokens, max_new)
        self.live[rid] = Live(req)
        self.register(req)

    def register(self, req: Req) -> None:
        """The model's map of every full block's prefix hash to its pages' hashes."""
        hashes = [req.h(j) for j in range(req.num_tokens // BT)]
        for j in range(len(hashes)):
            self.prefix_of[hashes[j]] = tuple(hashes[: j + 1])

    @precondition(lambda self: self.ready)
    @rule(spec=REQUEST)
    def arrive(self, spec: tuple[int, int, int, int, int, int]) -> None:
        """A new request waits (up to ``MAX_LIVE`` live)."""
        self.new_request(*spec)

    def admissible(self) -> list[str]:
        return [r for r in self.candidates("waiting") if r not in self.pass_admitted]

    @precondition(lambda self: self.can_open() and self.admissible())
    @rule(i=st.integers(0, 7), how=ADMIT)
    def admit_waiting(self, i: int, how: tuple[int, str, bool, int]) -> None:
        cands = self.admissible()
        self.admit_one(cands[i % len(cands)], *how)

    def admit_one(self, rid: str, hit: int, mode: str, aligned: bool, v: int) -> None:
        """The waiting loop for ``rid``: vLLM's own hit of up to ``hit`` blocks, ``match``,
        then (unless the allocation fails) ``admit``: an accepted offer is an asynchronous
        load, else (or when ``mode`` declines the offer) the request runs a chunk now."""
        live = self.live[rid]
        req = live.req
        self.pass_open = True
        self.pass_admitted.add(rid)
        k = self.vllm_hit(req, hit)
        c = k * BT
        n = self.tier.match(req, c)
        assert n >= 0 and n % BT == 0 and c + n < req.num_tokens, (c, n, req.num_tokens)
        if mode == "alloc-fails":
            self.stats["allocation failed"] += 1
            return  # vLLM keeps it waiting: no admit, match again in a later pass
        if n and mode != "decline":
            r = (c + n) // BT
            self.alloc(live, c + n, {r - 1, k - 1})
            self.fill_vllm_hit(live, k)
            assert live.table is not None
            self.tier.admit(req, live.table, n)
            live.hit = (k, r)
            self.pass_loads.add(rid)
            if self.tier.plant == "sync-load":  # a synchronous load: it runs now
                req.num_computed_tokens = c + n
                live.status = "running"
                self.run_chunk(live, aligned, v)
                return
            req.num_computed_tokens = c
            live.status = "loading"
            self.stats["admitted with a load"] += 1
            if rid in self.pass_preempted:
                self.stats["re-admitted with a load in its preemption's pass"] += 1
            return
        if n:
            self.stats["offers declined"] += 1
        e = _pick_end(c, req.num_tokens, aligned, v)
        self.alloc(live, e, {k - 1, math.ceil(e / BT) - 1})
        self.fill_vllm_hit(live, k)
        assert live.table is not None
        self.tier.admit(req, live.table, 0)
        req.num_computed_tokens = c
        live.status = "running"
        self.pass_sched[rid] = e - c
        self.stats["vllm hits" if k else "admitted cold"] += 1

    def run_chunk(self, live: Live, aligned: bool, v: int) -> None:
        req = live.req
        s = req.num_computed_tokens
        e = _pick_end(s, req.num_tokens, aligned, v)
        self.alloc(live, e, {math.ceil(s / BT) - 1, math.ceil(e / BT) - 1})
        self.pass_sched[req.request_id] = e - s

    def schedulable(self) -> list[str]:
        return [
            rid
            for rid in self.candidates("running", "ready")
            if rid not in self.pass_sched
            and rid not in self.pass_admitted
            and self.live[rid].req.num_computed_tokens < self.live[rid].req.num_tokens
        ]

    @precondition(lambda self: self.can_open() and self.schedulable())
    @rule(i=st.integers(0, 7), aligned=ALIGNED, v=st.integers(0, 11))
    def schedule(self, i: int, aligned: bool, v: int) -> None:
        cands = self.schedulable()
        self.schedule_one(cands[i % len(cands)], aligned, v)

    def schedule_one(self, rid: str, aligned: bool, v: int) -> None:
        """A running request's next chunk (prefill or decode), or a loaded one's first
        (vLLM admits it again: ``update_state_after_alloc`` with 0 external tokens)."""
        live = self.live[rid]
        self.pass_open = True
        self.run_chunk(live, aligned, v)
        if live.status == "ready":
            self.pass_admitted.add(rid)
            assert live.table is not None
            self.tier.admit(live.req, live.table, 0)
            live.status = "running"
            self.stats["ran after its load"] += 1

    def preemptible(self) -> list[str]:
        return [
            rid
            for rid in self.candidates("running")
            if rid not in self.pass_sched
            and rid not in self.pass_admitted
            and rid not in self.pass_preempted
        ]

    @precondition(lambda self: self.can_open() and self.preemptible())
    @rule(
        i=st.integers(0, 7),
        again=st.none() | ADMIT,
        told=st.sampled_from([True, True, True, False]),
    )
    def preempt(self, i: int, again: tuple[int, str, bool, int] | None, told: bool = True) -> None:
        """vLLM preempts a running request: its blocks are freed now, it waits again with
        nothing computed; the tier hears of it in this pass's ``plan_step`` unless
        ``told`` is false (``reset_prefix_cache(reset_running_requests=True)`` names its
        victims in ``resumed_req_ids`` instead, docs/vllm.md); ``again``: the waiting loop of
        the same pass admits it again."""
        cands = self.preemptible()
        rid = cands[i % len(cands)]
        live = self.live[rid]
        self.pass_open = True
        self.release_blocks(live)
        live.req.num_computed_tokens = 0
        live.status = "waiting"
        live.hit = None
        if told:
            self.pass_preempted.append(rid)
        self.stats["preempted" if told else "preempted silently"] += 1
        if again is not None:
            self.admit_one(rid, *again)

    @precondition(lambda self: self.ready and any(r not in self.pass_sched for r in self.live))
    @rule(i=st.integers(0, 7), go=st.integers(0, 2))
    def abort(self, i: int, go: int) -> None:
        """A request aborted (in any state but scheduled in the open pass); one draw in
        three, so that requests live long enough to hit."""
        if go:
            return
        cands = [r for r in self.live if r not in self.pass_sched]
        if not cands:
            return
        rid = cands[i % len(cands)]
        self.stats[f"aborted while {self.live[rid].status}"] += 1
        if self.pass_open and rid in self.pass_loads:
            self.stats["aborted between admit and plan_step"] += 1
        self.finish(rid)

    def finish(self, rid: str) -> None:
        live = self.live.pop(rid)
        self.tier.finished(live.req)
        self.release_blocks(live)
        self.pass_loads.discard(rid)

    @precondition(lambda self: self.ready)
    @rule(go=st.integers(0, 9))
    def reset(self, go: int) -> None:
        """``reset_prefix_cache`` (one draw in ten): the tier empties (pinned pages stay),
        and so does vLLM's own cache."""
        if go:
            return
        done = self.tier.reset()
        t = self.tier
        assert done == (not t._pages)
        assert set(t._pages) == set(t._pins), "reset left an unpinned KV page"
        snap = t.coordinator.snapshot()
        assert not snap.index and not snap.pending, "reset left an image indexed"
        self.vllm_kv.clear()
        self.vllm_state.clear()
        self.stats["resets" + (" mid-pass" if self.pass_open else "")] += 1

    @precondition(lambda self: self.can_open())
    @rule()
    def plan(self) -> None:
        """The pass ends (an empty one if nothing happened in it)."""
        self.end_pass()

    @precondition(lambda self: self.ready)
    @rule(
        arrivals=st.lists(REQUEST, max_size=2),
        victim=st.none() | st.integers(0, 7),
        admissions=st.lists(ADMIT, min_size=MAX_LIVE, max_size=MAX_LIVE),
        aligned=ALIGNED,
        v=st.integers(0, 11),
        abort=st.none() | st.integers(0, 7),
        late=st.integers(0, 2),
    )
    def vllm_pass(
        self,
        arrivals: list[tuple[int, int, int, int, int, int]],
        victim: int | None,
        admissions: list[tuple[int, str, bool, int]],
        aligned: bool,
        v: int,
        abort: int | None,
        late: int,
    ) -> None:
        """A whole pass as vLLM runs one: the outputs older than ``late`` passes delivered,
        new requests, the running loop (every running request scheduled, but ``victim``
        preempted), the waiting loop (every waiting request, the victim included), an abort
        before the pass ends (``abort``), ``plan_step`` and the step."""
        if not self.pass_open:
            self.deliver_outputs(len(self.outputs) - late)
        if not self.can_open():
            return
        for spec in arrivals:
            self.new_request(*spec)
        if victim is not None and self.preemptible():
            self.preempt(victim, None)
        for rid in self.schedulable():
            self.schedule_one(rid, aligned, v)
        for rid, how in zip(self.admissible(), admissions, strict=False):
            self.admit_one(rid, *how)
        if abort is not None:
            self.abort(abort, 0)
        self.end_pass()

    def end_pass(self) -> None:
        """``build_connector_meta``, then the step: ``preprocess_mamba`` and the forward,
        the worker's copies, the output queued for delivery."""
        sched = dict(self.pass_sched)
        plan = self.tier.plan_step(
            sched, list(self.pass_preempted), lambda rid: self.live[rid].table
        )
        assert plan.step == self.next_step
        self.next_step += 1
        if self.tier.plant is None:
            loads = {r for r in self.pass_loads if r in self.live}
            assert set(plan.loaded) == loads, (
                f"the loads admitted in the pass {sorted(loads)} != the plan's {plan.loaded}"
            )
        done: list[str] = []
        for rid, n in sched.items():
            live = self.live[rid]
            self.forward(live, n)
            req = live.req
            req.num_computed_tokens += n
            if req.num_computed_tokens % BT == 0:
                self.stats["aligned chunk ends"] += 1
            if req.num_computed_tokens == req.num_tokens:
                if req.num_tokens < req.max_tokens:
                    req.sample()
                    self.register(req)
                else:
                    done.append(rid)  # EOS: vLLM frees it when it reads this output
        self.worker.run(plan)
        self.check_loaded(plan)
        for live in self.live.values():
            self.drop_old_state_blocks(live)
        self.outputs.append((plan.step, plan.loaded, tuple(done)))
        self.pass_open = False
        self.pass_sched.clear()
        self.pass_preempted.clear()
        self.pass_admitted.clear()
        self.pass_loads.clear()
        for what, ops in (("stores", plan.stores), ("restores", plan.restores)):
            self.stats[what] += len(ops)
        self.stats["kv loads"] += len(plan.kv_loads)
        self.stats["scrubs"] += bool(plan.scrub)

    @precondition(lambda self: self.ready and self.outputs and not self.pass_open)
    @rule(both=st.booleans())
    def deliver(self, both: bool) -> None:
        """``update_from_output`` of the oldest step (or two)."""
        self.deliver_outputs(2 if both else 1)

    def deliver_outputs(self, count: int) -> None:
        """The outputs of the oldest ``count`` steps: the requests done in them are freed,
        their loads count as received, then one ``steps_ran`` for them all."""
        if count <= 0:
            return
        batch = [self.outputs.popleft() for _ in range(min(count, len(self.outputs)))]
        self.stats[f"delivered {len(self.outputs)} passes late"] += 1
        for _, loaded, done in batch:
            for rid in done:
                if rid in self.live:
                    self.finish(rid)
            for rid in loaded:
                live = self.live.get(rid)
                if live is not None and live.status == "loading":
                    assert live.hit is not None
                    live.status = "ready"
                    live.req.num_computed_tokens = live.hit[1] * BT
        self.tier.steps_ran([step for step, _, _ in batch])

    # -- teardown -----------------------------------------------------------------------------

    def teardown(self) -> None:
        if not self.ready or sys.exc_info()[0] is not None:
            return  # a step failed: its error is the report
        if self.pass_open:
            self.end_pass()
        for rid in list(self.live):
            self.finish(rid)
        self.deliver_outputs(len(self.outputs))
        self.end_pass()  # an empty pass: publishes the last batch
        self.deliver_outputs(len(self.outputs))
        t = self.tier
        self.tier_consistent()
        assert t.is_idle(), f"not idle once everything finished: {t.outstanding()}"
        assert t.reset() is True
        assert t.pool.num_free == self.num_units
        assert t.units_held() == {"free": self.num_units, "kv_pages": 0, "images": 0}
        self.tier_consistent()
        self.stats["runs"] += 1
        self.stats["hits"] += t.stats["hits"]
        self.stats["kv pages evicted"] += t.stats["kv_pages_evicted"]
        self.stats["kv pages refused"] += t.stats["kv_pages_refused"]
        self.stats["finished in flight"] += t.stats["finished_in_flight"]


# -- settings ---------------------------------------------------------------------------------


def machine_settings() -> settings:
    """The active profile, bounded for CI time and derandomized unless it is ``fuzz`` (which
    runs long and random)."""
    base = settings.default
    fuzz = base.max_examples > 1000
    examples, steps = (base.max_examples // 20, 80) if fuzz else (min(base.max_examples, 80), 80)
    return settings(
        base,
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=base.derandomize or not fuzz,
        database=base.database if fuzz else None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def machine(name: str = "TierMachine", **attrs_: Any) -> type[TierMachine]:
    # one class name for every variant: the derandomized runs draw the same steps
    return type(name, (TierMachine,), {"stats": Counter(), **attrs_})


def test_the_tier_survives_the_adversary() -> None:
    m = machine()
    run_state_machine_as_test(m, settings=machine_settings())
    done = m.stats
    for what in (
        "loads checked",
        "hits",
        "stores",
        "restores",
        "kv pages evicted",
        "kv pages refused",
        "preempted",
        "preempted silently",
        "re-admitted with a load in its preemption's pass",
        "aborted while loading",
        "aborted between admit and plan_step",
        "delivered 2 passes late",
        "resets",
        "resets mid-pass",
        "ran after its load",
        "vllm hits",
        "finished in flight",
        "scrubs",
    ):
        assert done[what] > 0, f"the runs made no {what!r}: {dict(done)}"


# -- planted bugs -----------------------------------------------------------------------------

#: A planted bug: ``(method of PrefixTier, fragment of its source, replacement, what the
#: machine's failure says)``.
MUTANTS: dict[str, tuple[str, str, str, str]] = {
    # the store of boundary n reads the state block of boundary n - 1
    "store reads the state block one early": (
        "plan_step",
        "state = tuple(int(ids[g][n - 1]) for g in self.tl.recurrent_groups)",
        "state = tuple(int(ids[g][n - 2]) for g in self.tl.recurrent_groups)",
        "restored state of boundary|starts from a wrong state",
    ),
    # a hit restores the image of the boundary before the one it offered, when there is one
    "admit restores the previous boundary": (
        "admit",
        "restored = self.coordinator.begin_restore(h_hit, seq.state_slot, seq=seq)",
        "restored = self.coordinator.begin_restore(seq.hashes[r - 2] if r > 1 and"
        " self.coordinator.contains(seq.hashes[r - 2]) else h_hit, seq.state_slot, seq=seq)",
        "restored state of boundary|starts from a wrong state",
    ),
    "steps_ran keeps the step's pins": (
        "steps_ran",
        "self._unpin(self._step_pins.pop(step, ()))",
        "self._step_pins.pop(step, ())",
        "pins owed",
    ),
    "an evicted KV page takes only its own image": (
        "_evict_page",
        "for image in self._dependents.pop(h, {h: None}):",
        "for image in (h,):",
        "survived the eviction",
    ),
    "admit pins no KV page": (
        "admit",
        "self._pins[h] = self._pins.get(h, 0) + 1",
        "pass",
        "pins owed",
    ),
    "a request leaving keeps its load's pins": (
        "_leave",
        "self._unpin(seq.load[2])",
        "pass",
        "pins owed",
    ),
    "a same-pass re-admission is treated as a preemption": (
        "plan_step",
        "if seq.admitted_in == self.step:",
        "if False:",
        "the loads admitted in the pass",
    ),
}

#: Deterministic, no shrinking, stop at the first failure.
PLANTED = settings(
    max_examples=150,
    stateful_step_count=50,
    database=None,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("bug", list(MUTANTS))
def test_the_machine_catches_a_planted_bug(bug: str) -> None:
    method, old, new, caught_by = MUTANTS[bug]
    edited_method(PrefixTier, method, old, new)  # fails here if the plant no longer applies
    with pytest.raises(AssertionError, match=caught_by):
        run_state_machine_as_test(machine(mutant=(method, old, new)), settings=PLANTED)


@pytest.mark.parametrize(
    ("bug", "caught_by"),
    [
        ("admit pins no KV page", "loaded KV page"),
        ("steps_ran keeps the step's pins", "not idle once everything finished"),
        ("a request leaving keeps its load's pins", "not idle once everything finished"),
    ],
)
def test_the_bytes_alone_catch_a_pin_bug(bug: str, caught_by: str) -> None:
    """The pin bugs above fail the machine's check of the tier's pins; without that check
    (``white_box=False``) the machine still fails on what vLLM would see: a hit's KV page
    evicted and its unit reused before its load ran (wrong bytes in the request's block),
    or a tier that never becomes idle."""
    method, old, new, _ = MUTANTS[bug]
    with pytest.raises(AssertionError, match=caught_by):
        run_state_machine_as_test(
            machine(mutant=(method, old, new), white_box=False),
            settings=settings(PLANTED, stateful_step_count=80),
        )


def test_the_machine_catches_a_synchronous_load() -> None:
    """The tier's own ``sync-load`` plant, with vLLM running the request in the pass that
    admitted it (a synchronous load): its forward reads the state before the restore."""
    with pytest.raises(AssertionError, match="starts from a wrong state|reads a wrong KV"):
        run_state_machine_as_test(machine(tier_plant="sync-load"), settings=PLANTED)


# -- bugs found by this machine, fixed in tier.py ---------------------------------------------


def test_a_duplicate_boundary_evicts_no_kv_page() -> None:
    """Two requests with the same one-block prefix computed in one step file the same
    boundary twice; the drain stores one image (3 units), and 3 units are free once the
    step's one KV page is reserved. The tier makes room for two images: it evicts the three
    KV pages C left cached."""
    eng = FakeEngine(num_units=7, num_slots=4)
    c = Request("C", ["c0", "c1", "c2"], 5)
    eng.arrive(c)
    eng.step({c: 3 * TB + 5})  # three KV pages, no boundary (the chunk ends mid-block)
    eng.finish(c)
    eng.settle()
    assert eng.tier.units_held() == {"free": 4, "kv_pages": 3, "images": 0}
    a1, a2 = Request("A1", ["s0"], 5), Request("A2", ["s0"], 7)
    assert eng.arrive(a1) == eng.arrive(a2) == 0
    plan = eng.step({a1: TB, a2: TB})
    assert len(plan.stores) == 1 and eng.tier.stats["boundaries"] == 2
    assert eng.tier.stats["kv_pages_evicted"] == 0, eng.tier.units_held()


def _run_with_hot_page(eng: FakeEngine, i: int) -> None:
    """Request ``i``: the shared block ``sys`` (boundary 1, the tier's hit once it is
    cached), its own block ``u<i>`` (boundary 2), a tail."""
    r = Request(f"R{i}", ["sys", f"u{i}"], 3)
    n = eng.arrive(r)
    if n:
        eng.step({})
        eng.received(r, n)
    else:
        eng.step({r: TB})  # boundary 1 filed
    eng.step({r: TB})  # boundary 2 filed
    eng.step({r: 3})
    eng.finish(r)
    eng.settle()


def test_dependents_of_a_hot_page_stay_bounded() -> None:
    """An 8-unit pool holds two images at most; after 60 requests through the hot page
    ``sys``, the tier's list of images depending on it stays within its bound (twice the
    live images plus 8), not one entry per image ever filed."""
    eng = FakeEngine(num_units=8, num_slots=4)
    for i in range(60):
        _run_with_hot_page(eng, i)
    tier = eng.tier
    assert tier.stats["hits"] >= 59  # the hot page stayed cached throughout
    snap = tier.coordinator.snapshot()
    assert len(snap.index) <= 2
    h_sys = prefix_hash_of(Request("x", ["sys"], 0).block_hashes[0])
    remembered = len(tier._dependents[h_sys])
    live = 8 // eng.tl.units_per_checkpoint  # the pool holds 2
    assert remembered <= 2 * live + 8, remembered


def test_reset_leaves_no_dependents() -> None:
    """vLLM's own cache serves block 0 of B, which computes blocks 1-2 (boundary 3 filed
    through block 0); the tier never holds block 0's page. After ``reset()`` every unit is
    free, but the tier still remembers boundary 3's image under block 0."""
    eng = FakeEngine()
    b = Request("B", ["s0", "s1", "s2"], 5)
    assert eng.arrive(b, num_computed=TB) == 0
    eng.step({b: 2 * TB})
    eng.step({b: 5})
    eng.finish(b)
    eng.settle()
    tier = eng.tier
    assert tier.is_idle() and tier.reset() is True
    assert tier.units_held() == {"free": 64, "kv_pages": 0, "images": 0}
    assert tier._dependents == {}, tier._dependents


#: The passes of a program the adversary found (2026-12-04): a boundary filed while one of
#: its prefix's KV pages was served by vLLM's own cache (not held by the tier), the page
#: saved into the tier later and then evicted: its image must go with it (SPEC A.4).
_LATE_PAGE_PASSES: tuple[tuple[list[tuple[int, ...]], int | None, int], ...] = (
    ([], None, 0),
    ([(0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 2, 0)], None, 0),
    ([], None, 0),
    ([], None, 0),
    ([(0, 1, 2, 0, 0, 0), (0, 0, 1, 0, 1, 1)], None, 0),
    ([], None, 0),
    ([], None, 0),
    ([], None, 0),
    ([], 0, 1),
    ([(0, 0, 0, 0, 0, 1)], None, 0),
    ([], None, 0),
)


def _late_page_program(planted: bool) -> None:
    state = machine()()
    state.setup(num_units=12, num_slots=1, hash_tokens=4, attention_first=False, null_blocks=False)
    if planted:  # the tier as it was: dependents recorded only on pages it held then
        plant(
            state.tier,
            "plan_step",
            # (the method's source, dedented by one level)
            "                        self._depends(hj, h_n)\n"
            "                        if hj in pages:\n",
            "                        if hj in pages:\n"
            "                            self._depends(hj, h_n)\n",
        )
    for arrivals, victim, first in _LATE_PAGE_PASSES:
        admissions = [(first, "admit", True, 0)] + [(0, "admit", True, 0)] * 4
        state.tier_consistent()
        state.vllm_pass(
            abort=None,
            admissions=admissions,
            aligned=True,
            arrivals=arrivals,
            late=0,
            v=0,
            victim=victim,
        )
    state.tier_consistent()
    state.teardown()


def test_a_page_saved_after_its_boundary_still_takes_the_image_with_it() -> None:
    """The adversary's program of a KV page that entered the tier after a boundary of its
    prefix was filed: evicting the page unindexes the image; the tier that recorded
    dependents only on the pages it held at the boundary leaves the image behind."""
    _late_page_program(planted=False)
    with pytest.raises(AssertionError, match="survived the eviction"):
        _late_page_program(planted=True)
