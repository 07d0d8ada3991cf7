"""Data integrity under fuzzing (SPEC H.7): a Hypothesis state machine drives the production
coordinator (:mod:`pagedstate.impl`) over a :class:`~pagedstate.impl.UnitPool`, and an
executor on real CPU tensors of a small slice of a real geometry (Qwen3-Next, 1 recurrent
layer, 2 attention layers, / 32, 128-token pages, 1 speculative token: a 34,304-byte
image in 3 units of 2 regions, and conv rows the image does not carry).

What it checks:

- before a store, the slot holds a pattern derived from ``(hash, boundary)``; the store
  copies exactly those bytes;
- other tenants reserve and release KV units through the same pool and write garbage into
  their units and into free units between steps; some park their blocks as cached KV
  prefixes (the pool's ``cache_units``) and later requests claim them back
  (``claim_cached_units``): a cached block must keep its KV until then (a scrub of the
  pool's dirty units must not zero it), and the pool's ``on_evict`` reports the ones a
  reservation takes;
- every READY checkpoint's units hold its image, whatever the tenants did;
- every restore reproduces the stored slot bytes exactly, leaves the slot's non-image bytes
  (the speculative conv rows) untouched and changes no other slot;
- scrubbed units (the pool's free dirty units, in the drain's launch or on their own) read
  zero.

It fails on planted bugs: an off-by-one span in the executor's plan (one byte short, or
shifted by one byte), and a restore that reads units the pool already released (a
coordinator that hands out restores without pinning their source).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import attrs
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import Seq  # noqa: E402
from gpu_helpers import executor_names, make_executor, small_layout  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pagedstate.gpu import CopyPlan, StateTensors  # noqa: E402
from pagedstate.gpu import executor as executor_module  # noqa: E402
from pagedstate.gpu.executor import free_dirty_units  # noqa: E402
from pagedstate.impl import PagedStateCheckpointCoordinator, UnitPool  # noqa: E402
from pagedstate.spec.errors import CopyOpError  # noqa: E402
from pagedstate.spec.types import CheckpointRestoreOp  # noqa: E402

SLOTS = 4
UNITS = 14
HASHES = st.integers(1, 4)
LAYOUT = small_layout(recurrent_layers=1, spec_tokens=1)


def pattern(h: int, boundary: int, n: int | None = None, device: Any = "cpu") -> Any:
    """The image (``n`` bytes, default the slice's image) a slot holds before a store of
    ``h`` at ``boundary`` blocks."""
    gen = torch.Generator(device=device).manual_seed(h * 1_000 + boundary)
    size = LAYOUT.image_bytes if n is None else n
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen, device=device)


def garbage(n: int, seed: int, device: Any = "cpu") -> Any:
    gen = torch.Generator(device=device).manual_seed(10_000_019 + seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen, device=device)


class IntegrityMachine(RuleBasedStateMachine):
    """See the module docstring. Subclasses set :attr:`executor_name`, and may plant a bug
    with :meth:`plant` (on the executor) or :meth:`wrap_coordinator`."""

    executor_name = "torch"
    #: The layout, unit count and device of the tensors (a CUDA subclass in
    #: test_gpu_cuda.py runs a full geometry on the GPU).
    layout = LAYOUT
    units = UNITS
    device = "cpu"
    #: What the runs did, summed over every machine of this class (checked by the test:
    #: a run that never restored or scrubbed would prove nothing).
    stats: dict[str, int]

    def __init__(self) -> None:
        super().__init__()
        self.pool = UnitPool(self.units, on_evict=self._kv_evicted)
        self.coord: Any = self.wrap_coordinator(
            PagedStateCheckpointCoordinator(self.pool, self.layout.spec(), True)
        )
        self.t = StateTensors(self.layout, SLOTS, self.units, self.device)
        for x in self.t.all_tensors():
            x.view(-1).view(torch.uint8).copy_(
                garbage(x.numel() * x.element_size(), -1, self.device)
            )
        self.ex = self.build_executor()
        self.seqs = [Seq(s) for s in range(SLOTS)]
        self.pending: dict[int, tuple[int, Any]] = {}  # slot -> (h, pattern) filed
        self.queued: dict[int, tuple[int, Any]] = {}  # slot -> (h, image) to restore
        self.expected: dict[int, Any] = {}  # h -> image of its READY record
        self.tenants: dict[int, list[int]] = {}
        self.kv_written: dict[int, Any] = {}  # unit -> the KV bytes its tenant wrote
        self.cached: dict[int, int] = {}  # KV prefix hash -> cached unit
        self.next_kv_hash = 1_000
        self.next_tenant = 0
        self.noise = 0

    # -- hooks for planted bugs ----------------------------------------------------------

    def build_executor(self) -> Any:
        """The executor under test (planted bugs change its plan)."""
        return make_executor(self.executor_name, self.t, 2 * SLOTS)

    def wrap_coordinator(self, coord: Any) -> Any:
        """Wrap the coordinator (planted bugs only)."""
        return coord

    # -- helpers -------------------------------------------------------------------------

    def _ready_units(self, h: int) -> tuple[int, ...] | None:
        store = self.coord.store
        cid = store.lookup(h)
        return None if cid < 0 else store.records[cid].unit_ids

    def _count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    def _scribble(self, unit: int) -> Any:
        self.noise += 1
        data = garbage(self.layout.page_unit_bytes, self.noise, self.device)
        self.t.fill_unit(unit, data)
        return data

    def _kv_evicted(self, h: int) -> None:
        """The pool's ``on_evict``: a reservation took the cached KV block of ``h``. The
        engine drops it from its prefix index and tells the coordinator (SPEC A.4)."""
        self.cached.pop(h)
        self.coord.unindex(h)

    # -- rules ---------------------------------------------------------------------------

    @initialize()
    def first_pass(self) -> None:
        """Every slot files a checkpoint and one batch stores them, so that restores and
        evictions are possible from the first rule on (short examples still copy)."""
        for slot in range(SLOTS):
            self.file_checkpoint(slot, slot + 1, 1)
        self.drain_execute_complete(False)

    @rule(slot=st.integers(0, SLOTS - 1), h=HASHES, boundary=st.integers(1, 4))
    def file_checkpoint(self, slot: int, h: int, boundary: int) -> None:
        """The forward wrote the slot's state at a boundary; the engine files it."""
        if slot in self.queued:
            return  # the slot's restore lands first (SPEC E.5); the engine never files now
        image = pattern(h, boundary, self.layout.image_bytes, self.device)
        self.t.write_image(slot, image)
        self.coord.checkpoint(self.seqs[slot], boundary, h)
        self.pending[slot] = (h, image)

    @rule(slot=st.integers(0, SLOTS - 1), h=HASHES)
    def begin_restore(self, slot: int, h: int) -> None:
        if slot in self.pending or slot in self.queued or self._ready_units(h) is None:
            return
        assert self.coord.resumable_hit(self.seqs[slot], 1, [h]) == 1
        assert self.coord.begin_restore(h, slot)
        self.queued[slot] = (h, self.expected[h].clone())

    @rule(scrub=st.booleans())
    def drain_execute_complete(self, scrub: bool) -> None:
        """One pass's batch: drain, execute (with the free dirty units when ``scrub``),
        then the next pass's ``complete_previous_batch``."""
        stores, restores = self.coord.take_checkpoint_ops()
        dirty = free_dirty_units(self.pool) if scrub else []
        want_restored = {}
        for op in restores:
            h, image = self.queued.pop(op.dst_slot)
            want_restored[op.dst_slot] = image
        assert not self.queued, f"restores not handed out: {sorted(self.queued)}"
        slots_before = [self.t.read_slot(s).clone() for s in range(SLOTS)]
        stored = {}
        for op in stores:
            h, image = self.pending[op.src_slot]
            assert torch.equal(self.t.read_image(op.src_slot), image)
            stored[h] = (image, op.unit_ids)
        self.pending.clear()
        self.ex.execute(stores, restores, dirty)
        self._count("stores", len(stores))
        self._count("restores", len(restores))
        self._count("scrubbed in a drain", len(dirty))
        for slot, image in want_restored.items():
            assert torch.equal(self.t.read_image(slot), image), (
                f"restore into slot {slot} did not reproduce the stored bytes"
            )
        for s in range(SLOTS):
            now = self.t.read_slot(s)
            if s in want_restored:
                # Only the carried ranges may change: compare the rest byte for byte.
                keep = self._non_image_mask()
                assert torch.equal(now[keep], slots_before[s][keep]), (
                    f"restore wrote slot {s}'s non-image bytes"
                )
            else:
                assert torch.equal(now, slots_before[s]), f"slot {s} changed without a restore"
        if dirty:
            assert (self.t.read_units(dirty) == 0).all(), "a scrubbed unit is not zero"
            self.pool.mark_clean(dirty)
        self.coord.complete_previous_batch()
        for h, (image, units) in stored.items():
            if self._ready_units(h) == units:
                self.expected[h] = image

    @rule(n=st.integers(1, 5))
    def tenant_reserve(self, n: int) -> None:
        """A KV tenant takes units (evicting unpinned READY checkpoints if it must) and
        writes its KV into them."""
        evicted = self.coord.store.evictions
        if not self.coord.ensure_free_units(n):
            return
        self._count("evictions", self.coord.store.evictions - evicted)
        owner = self.next_tenant
        self.next_tenant += 1
        units = self.pool.reserve_units(n, ("live-kv", owner))
        assert units is not None
        self.tenants[owner] = units
        for u in units:
            self._scribble(u)

    @precondition(lambda self: bool(self.tenants))
    @rule(data=st.data(), cache=st.booleans())
    def tenant_release(self, data: st.DataObject, cache: bool) -> None:
        """A request finishes: its KV units go back to the pool, vacant, or (``cache``)
        parked as cached prefix blocks with the KV it wrote (every other one)."""
        owner = data.draw(st.sampled_from(sorted(self.tenants)))
        units = self.tenants.pop(owner)
        if not cache:
            for u in units:
                self._scribble(u)
            self.pool.release_units(units, ("live-kv", owner))
            return
        hashes: list[int | None] = []
        for i, u in enumerate(units):
            if i % 2:
                hashes.append(None)
                continue
            self.kv_written[u] = self._scribble(u)
            self.next_kv_hash += 1
            hashes.append(self.next_kv_hash)
            self.cached[self.next_kv_hash] = u
        self.pool.cache_units(units, ("live-kv", owner), hashes)
        self._count("kv blocks cached", sum(h is not None for h in hashes))

    @precondition(lambda self: bool(self.cached))
    @rule(data=st.data())
    def prefix_hit(self, data: st.DataObject) -> None:
        """A new request hits a cached KV block: it claims it and reads the KV back."""
        h = data.draw(st.sampled_from(sorted(self.cached)))
        unit = self.cached.pop(h)
        owner = self.next_tenant
        self.next_tenant += 1
        self.pool.claim_cached_units([unit], ("live-kv", owner))
        self.tenants[owner] = [unit]
        assert torch.equal(self.t.read_units([unit]), self.kv_written[unit]), (
            f"the cached KV block in unit {unit} changed before its prefix hit"
        )
        self._count("prefix hits")

    @precondition(lambda self: bool(self.tenants))
    @rule()
    def tenants_write(self) -> None:
        for units in self.tenants.values():
            for u in units:
                self._scribble(u)

    @rule()
    def garbage_into_free_units(self) -> None:
        """Free units hold nobody's bytes (cached KV blocks are not free to write)."""
        for u in range(self.units):
            if self.pool.owner_of(u) is None and self.pool.cached_hash(u) is None:
                self._scribble(u)

    @rule(h=HASHES)
    def unindex(self, h: int) -> None:
        """The KV prefix ``h`` was evicted."""
        self.coord.unindex(h)

    # Enabled only when there is something to scrub: a draw never wasted on an empty scrub,
    # so a random (dev profile) run scrubs whenever it left units dirty and free.
    @precondition(lambda self: bool(free_dirty_units(self.pool)))
    @rule()
    def scrub_free_dirty_units(self) -> None:
        dirty = free_dirty_units(self.pool)
        self.ex.execute([], [], dirty)
        self._count("scrubbed alone", len(dirty))
        if dirty:
            assert (self.t.read_units(dirty) == 0).all(), "a scrubbed unit is not zero"
        self.pool.mark_clean(dirty)
        assert not (set(free_dirty_units(self.pool)) & set(dirty))

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def ready_images_are_intact(self) -> None:
        for h, image in self.expected.items():
            units = self._ready_units(h)
            if units is not None:
                got = self.t.read_units(units)[: self.layout.image_bytes]
                assert torch.equal(got, image), f"the image of READY checkpoint {h} changed"

    @invariant()
    def cached_kv_blocks_are_intact(self) -> None:
        for h, unit in self.cached.items():
            assert torch.equal(self.t.read_units([unit]), self.kv_written[unit]), (
                f"the cached KV block {h} in unit {unit} changed while cached"
            )

    def _non_image_mask(self) -> Any:
        mask = torch.ones(self.layout.slot_bytes, dtype=torch.bool, device=self.device)
        pos = 0
        for info in self.layout.slot_tensors:
            mask[pos : pos + info.carried_bytes] = False
            pos += info.row_bytes
        return mask


# -- settings ---------------------------------------------------------------------------------

#: The Triton interpreter runs a few hundred launches per second at most: fewer, shorter runs.
_BOUNDS = {"torch": (60, 50), "triton": (20, 30)}


def machine_settings(name: str) -> settings:
    """The active profile, bounded for CI time, and derandomized unless it is ``fuzz`` (which
    runs long and random). The bounded run is small (20 examples under the Triton
    interpreter), so a random draw of it could miss restores or scrubs: the dev profile made
    no restore in about 6% of runs, failing the coverage check below with no code at fault.
    Derandomized, ``dev`` and ``ci`` run the same checked sequence; ``fuzz`` explores."""
    examples, steps = _BOUNDS[name]
    base = settings.default
    fuzz = base.max_examples > 1000
    if fuzz:
        examples, steps = base.max_examples // 20, 60
    return settings(
        base,
        max_examples=min(base.max_examples, examples),
        stateful_step_count=steps,
        deadline=None,
        derandomize=base.derandomize or not fuzz,
        database=base.database if fuzz else None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def machine_for(name: str, base: type[IntegrityMachine] = IntegrityMachine) -> type:
    # One class name for both executors: the derandomized runs then draw the same steps.
    return type(base.__name__, (base,), {"executor_name": name, "stats": {}})


@pytest.mark.parametrize("name", executor_names())
def test_data_integrity_under_fuzzing(name: str) -> None:
    machine = machine_for(name)
    run_state_machine_as_test(machine, settings=machine_settings(name))
    done = machine.stats
    for what in ("stores", "restores", "evictions"):
        assert done.get(what, 0) > 0, f"the run made no {what}: {done}"
    assert done.get("scrubbed in a drain", 0) + done.get("scrubbed alone", 0) > 0, done
    if name == "torch":  # the longer run also parks cached KV blocks (checked each step)
        assert done.get("kv blocks cached", 0) > 0, done


# -- planted bugs -------------------------------------------------------------------------------

#: Settings of the planted-bug runs: deterministic, no shrinking, stop at the first failure.
PLANTED = settings(
    max_examples=300,
    stateful_step_count=30,
    database=None,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


class PlanBug(IntegrityMachine):
    """An executor built from a wrong plan: :meth:`bad_plan` changes the geometry's plan
    before the executor derives anything from it (its span table, descriptor tables,
    alignment), as if ``plan_segmented_copy`` itself had the bug."""

    def bad_plan(self, plan: CopyPlan) -> CopyPlan:  # pragma: no cover - abstract
        raise NotImplementedError

    def build_executor(self) -> Any:
        real = executor_module.plan_segmented_copy

        def planted(*args: Any, **kwargs: Any) -> CopyPlan:
            return self.bad_plan(real(*args, **kwargs))

        with mock.patch.object(executor_module, "plan_segmented_copy", planted):
            ex = super().build_executor()
        assert ex.plan.total == LAYOUT.image_bytes
        return ex


class ShortSpan(PlanBug):
    """Planted bug: the plan's last span is one byte short."""

    def bad_plan(self, plan: CopyPlan) -> CopyPlan:
        length = plan.length.copy()
        length[-1] -= 1
        return attrs.evolve(plan, length=length)


class ShiftedSpan(PlanBug):
    """Planted bug: one span (in the middle of the image) lands one byte late in its unit
    region (its destination offset + 1), in both directions."""

    def bad_plan(self, plan: CopyPlan) -> CopyPlan:
        off = plan.dst_off.copy()
        k = len(off) // 2
        assert off[k] + plan.length[k] < plan.dst_sizes[plan.dst_seg[k]]
        off[k] += 1
        return attrs.evolve(plan, dst_off=off)


class UnpinnedRestores:
    """A coordinator that queues restores without pinning their source: it remembers the
    units the record has at ``begin_restore`` and hands out a restore of them at the next
    drain, whatever happened to the record (unindexed, its units released and reused)."""

    def __init__(self, coord: PagedStateCheckpointCoordinator) -> None:
        self._coord = coord
        self._stale: dict[int, tuple[int, ...]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coord, name)

    def begin_restore(self, h: int, dst_slot: int) -> bool:
        cid = self._coord.store.lookup(h)
        if cid < 0:
            return False
        self._stale[dst_slot] = self._coord.store.records[cid].unit_ids
        return True

    def take_checkpoint_ops(self) -> tuple[Any, tuple[CheckpointRestoreOp, ...]]:
        stores, restores = self._coord.take_checkpoint_ops()
        extra = tuple(
            CheckpointRestoreOp(slot, units, LAYOUT.image_bytes, LAYOUT.layout_id)
            for slot, units in self._stale.items()
        )
        self._stale = {}
        return stores, restores + extra


class RestoreFromReleasedUnits(IntegrityMachine):
    """Planted bug: restores read units the pool may have released (see
    :class:`UnpinnedRestores`)."""

    def wrap_coordinator(self, coord: Any) -> Any:
        return UnpinnedRestores(coord)


PLANTED_BUGS = {
    "short-span": ShortSpan,
    "shifted-span": ShiftedSpan,
    "restore-from-released-units": RestoreFromReleasedUnits,
}


@pytest.mark.parametrize("bug", sorted(PLANTED_BUGS))
@pytest.mark.parametrize("name", executor_names())
def test_the_machine_catches_a_planted_bug(name: str, bug: str) -> None:
    machine = machine_for(name, PLANTED_BUGS[bug])
    with pytest.raises((AssertionError, CopyOpError)) as info:
        run_state_machine_as_test(machine, settings=PLANTED)
    if bug != "restore-from-released-units":
        # A plan bug is caught by the bytes, never by the executor's validation.
        assert isinstance(info.value, AssertionError)
    else:
        # Caught by the restored bytes, or by the hazard check when a store of the same
        # batch got the released units.
        assert "did not reproduce" in str(info.value) or isinstance(info.value, CopyOpError), (
            info.value
        )


def test_pattern_depends_on_hash_and_boundary() -> None:
    a, b, c = pattern(1, 1), pattern(1, 2), pattern(2, 1)
    assert not torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a, pattern(1, 1))
    assert np.count_nonzero(a.numpy() != b.numpy()) > LAYOUT.image_bytes // 2
