"""The explored world: a coordinator (pool, store) plus the environment around it.

The environment is what an engine and its neighbours do to the store: sequences filing
boundaries and leaving their slots, drains and completions of batches, restores, other
owners taking and returning units (KV pressure), KV hash evictions, admin clears, the CPU
tier handing out and reporting offload stores (in any order, duplicated and late), clock
jumps past the reclaim timeout, external transfers and leases, and midstep scratch slots.

A :class:`World` is deterministic: the same actions from the same configuration give the
same state. Every action is a ``(name, args)`` pair, replayable with :meth:`World.act`,
so a counterexample is a list of pairs that any store can be driven through.

The environment's memory (held leases, known operations, transfer owners, scratch
reservations) is bounded by the :class:`Config`; stale handles are kept one at a time so
duplicated and late reports and second uses are exercised without growing the state.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

import attrs

from pagedstate.spec.errors import PagedStateError
from pagedstate.spec.snapshot import Snapshot
from pagedstate.spec.types import (
    CHECKPOINT_OWNER,
    TRANSFER_OWNER,
    PagedStateCheckpointSpec,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)

from .reference import PagedStateCheckpointCoordinator, SlotPool, UnitPool

__all__ = [
    "Config",
    "World",
    "Seq",
    "ManualClock",
    "Action",
    "KV_OWNER",
    "drain_calls",
    "make_drain_call",
    "quiescence_problems",
]

#: First element of the owner tag of units other tenants (live KV) hold.
KV_OWNER = "live-kv"

Action = tuple[str, tuple[Any, ...]]


class Seq:
    """A request as the coordinator sees it: a fixed state slot. Identity is by object."""

    __slots__ = ("index", "state_slot", "has_per_req_cache")

    def __init__(self, index: int, state_slot: int) -> None:
        self.index = index
        self.state_slot = state_slot
        self.has_per_req_cache = True

    def __repr__(self) -> str:
        return f"Seq({self.index}, slot={self.state_slot})"

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:
        # Pickled by reference to the process-wide registry: the coordinator keys pending
        # boundaries by ``id(seq)``, so a world sent to another (forked) process must find
        # the very same objects there.
        return (seq, (self.index, self.state_slot))


_SEQS: dict[tuple[int, int], Seq] = {}


def seq(index: int, state_slot: int) -> Seq:
    """The one :class:`Seq` for ``(index, state_slot)`` in this process (shared by every world,
    so traces and pickled worlds agree on identities)."""
    s = _SEQS.get((index, state_slot))
    if s is None:
        s = _SEQS[(index, state_slot)] = Seq(index, state_slot)
    return s


class ManualClock:
    """A clock the environment advances by hand (seconds)."""

    __slots__ = ("now",)

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@attrs.frozen
class Config:
    """A bounded configuration of the world.

    Attributes:
        name: the configuration's name.
        units: pool size (units).
        units_per_checkpoint: units per image (the spec's image is this many 10-byte units).
        hashes: how many prefix hashes exist (``1..hashes``).
        seqs: sequences, one slot each (slots ``0..seqs-1``).
        kv_owners: other tenants, each holding at most ``kv_units`` units at a time.
        kv_units: units one KV allocation takes.
        offload: a CPU tier (sink on): nominations, take/release/settle/reclaim, clock.
        max_offload_inflight: the ``max_inflight`` passed to take and acquire.
        leases: explicit ``acquire_checkpoint_source`` leases.
        transfers: at most this many external-load reservations at once (0: off).
        scratch_slots: midstep scratch slots (0: off).
        max_ops_per_batch: the per-batch copy budget for scratch stores.
        suspend: suspend/resume/release of queued restores.
        backlog_cap: nomination backlog cap (small, so overflow is reached).
        forfeit_bound: reclaimed operations remembered exactly (small, so the watermark moves).
        timeout_s: the reclaim timeout the environment uses; ``tick`` advances past it.
        max_depth: stop exploring below this depth (``None``: until the space is exhausted).
    """

    name: str
    units: int
    units_per_checkpoint: int
    hashes: int
    seqs: int
    kv_owners: int = 1
    kv_units: int = 1
    offload: bool = False
    max_offload_inflight: int = 1
    leases: bool = False
    transfers: int = 0
    scratch_slots: int = 0
    max_ops_per_batch: int = 4
    suspend: bool = False
    backlog_cap: int = 2
    forfeit_bound: int = 1
    timeout_s: float = 10.0
    max_depth: int | None = None

    @property
    def spec(self) -> PagedStateCheckpointSpec:
        """The image geometry: 10-byte units, ``units_per_checkpoint`` of them per image."""
        image = 10 * self.units_per_checkpoint
        return PagedStateCheckpointSpec(
            page_unit_bytes=10, slot_bytes=image, layout_id="explore-v1", image_bytes=image
        )

    def build(
        self, coordinator_factory: Callable[..., PagedStateCheckpointCoordinator] | None = None
    ) -> World:
        """A fresh world in its initial state (optionally over a mutant coordinator class)."""
        return World(self, coordinator_factory)


class _Offload:
    """A CPU-tier double: votes for nothing (the explorer does not model the vote)."""

    def could_serve(self, prefix_hash: int) -> bool:
        del prefix_hash
        return False


class World:
    """A coordinator plus its environment; see the module docstring."""

    def __init__(
        self,
        config: Config,
        coordinator_factory: Callable[..., PagedStateCheckpointCoordinator] | None = None,
    ) -> None:
        self.config = config
        factory = coordinator_factory or PagedStateCheckpointCoordinator
        self.clock = ManualClock()
        self.pool = UnitPool(config.units)
        self.coord = factory(
            self.pool,
            config.spec,
            True,
            _Offload() if config.offload else None,
            config.scratch_slots > 0,
            clock=self.clock,
            offload_backlog_cap=config.backlog_cap,
            forfeit_bound=config.forfeit_bound,
        )
        # The pool the store really uses (a mutant coordinator may build its own), so the
        # environment's KV actions and checks act on it: as `clone` does.
        self.pool = self.coord.store.pool
        if config.scratch_slots:
            first = config.seqs
            self.coord.attach_midstep_scratch(
                SlotPool(range(first, first + config.scratch_slots)), config.max_ops_per_batch
            )
        self.seqs = tuple(seq(i, i) for i in range(config.seqs))
        # Environment memory.
        self.kv_held: dict[int, list[int]] = {}
        self.leases: list[SuspendedCheckpointRestore] = []
        self.spent_lease: SuspendedCheckpointRestore | None = None
        self.ops: list[StateStoreOperationId] = []
        self.lease_ops: frozenset[StateStoreOperationId] = frozenset()
        self.stale_op: StateStoreOperationId | None = None
        self.owners: list[Hashable] = []
        self.stale_owner: Hashable | None = None
        self.next_owner = 0
        self.scratch_res: list[tuple[int, int, int]] = []
        # Unit tuples the copy launches of drained batches still touch (store targets and
        # restore sources), until the next completion: the GPU's view of the store.
        self.in_flight_units: tuple[tuple[int, ...], ...] = ()

    def clone(self) -> World:
        """A deep copy of the world; the coordinator's clock is re-pointed at the copy's."""
        w = World.__new__(World)
        w.__dict__.update(self.__dict__)
        w.clock = ManualClock(self.clock.now)
        w.coord = self.coord.clone()
        w.coord.store.clock = w.clock
        w.pool = w.coord.store.pool
        w.kv_held = dict(self.kv_held)
        w.leases = list(self.leases)
        w.ops = list(self.ops)
        w.owners = list(self.owners)
        w.scratch_res = list(self.scratch_res)
        return w

    # -- actions ------------------------------------------------------------------------

    def actions(self) -> list[Action]:
        """Every action enabled in this state, in a fixed order.

        Calls that are certainly no-ops of the reference model here (a drain with nothing to
        drain, a completion with nothing in flight, an unindex of a hash nobody holds, a
        clock tick once every pin is past the timeout...) are left out: they could only lead
        back to this state.
        """
        c = self.config
        coord = self.coord
        store = coord.store
        hs = range(1, c.hashes + 1)
        out: list[Action] = []
        if coord._pending or store._queued_restores or coord._scratch_queued:
            out.append(("drain", ()))
        if (
            store._inflight_stores
            or store._inflight_restores
            or coord._scratch_issued
            or self.in_flight_units
        ):
            out.append(("complete", ()))
        pending_seqs = {k[0] for k in coord._pending}
        pending_hashes = {h for _, h in coord._pending.values()}
        queued_slots = {op.dst_slot for _, op in store._queued_restores}
        for s in range(c.seqs):
            seq = self.seqs[s]
            for h in hs:
                out.append(("checkpoint", (s, h)))
            if id(seq) in pending_seqs or seq.state_slot in queued_slots:
                out.append(("forget", (s,)))
            for h in hs:
                if coord.contains(h):
                    out.append(("begin_restore", (s, h)))
            if c.suspend and seq.state_slot in queued_slots:
                out.append(("suspend", (s,)))
        for i in range(len(self.leases)):
            out.append(("resume", (i,)))
            out.append(("release_lease", (i,)))
        if self.spent_lease is not None:
            out.append(("reuse_lease", ()))
        scratch_hashes = {h for h, _ in coord._scratch_queued}
        for h in hs:
            if (
                h in store.hash_to_checkpoint
                or h in store._pending_by_hash
                or h in pending_hashes
                or h in scratch_hashes
            ):
                out.append(("unindex", (h,)))
        if store.records or coord._pending or coord._scratch_queued:
            out.append(("clear", ()))
        for k in range(c.kv_owners):
            if k in self.kv_held:
                out.append(("kv_free", (k,)))
                if c.kv_units >= 2:
                    out.append(("kv_partial_free", (k,)))
            else:
                out.append(("kv_alloc", (k,)))
        if c.offload:
            if store._offload_ready:
                out.append(("take_offload", ()))
            pins = store._offload_pins.values()
            if any(p.pinned_at > self.clock.now - c.timeout_s for p in pins):
                out.append(("tick", ()))
            if pins:
                out.append(("reclaim", ()))
        if c.leases:
            for h in hs:
                if coord.contains(h):
                    out.append(("acquire", (h,)))
        for i in range(len(self.ops)):
            out.append(("release_source", (i,)))
            out.append(("settle", (i,)))
        if self.stale_op is not None:
            out.append(("late_report", ()))
        if c.transfers:
            if len(self.owners) < c.transfers:
                out.append(("reserve_transfer", ()))
            for i in range(len(self.owners)):
                out.append(("release_transfer", (i,)))
                for h in hs:
                    out.append(("adopt", (i, h)))
            if self.stale_owner is not None:
                out.append(("late_release_transfer", ()))
        if c.scratch_slots:
            for s in range(c.seqs):
                for h in hs:
                    out.append(("reserve_midstep", (s, h)))
            for i in range(len(self.scratch_res)):
                out.append(("publish_midstep", (i,)))
                out.append(("cancel_midstep", (i,)))
        return out

    def act(self, name: str, *args: Any) -> Any:
        """Perform one action. Errors the store raises on purpose propagate."""
        return getattr(self, "_a_" + name)(*args)

    def _a_drain(self) -> Any:
        stores, restores = self.coord.take_checkpoint_ops()
        self.in_flight_units += tuple(op.unit_ids for op in stores) + tuple(
            op.unit_ids for op in restores
        )
        return stores, restores

    def _a_complete(self) -> None:
        self.coord.complete_previous_batch()
        self.in_flight_units = ()

    def _a_checkpoint(self, s: int, h: int) -> None:
        self.coord.checkpoint(self.seqs[s], 1, h)

    def _a_forget(self, s: int) -> None:
        self.coord.forget_pending(self.seqs[s])

    def _a_begin_restore(self, s: int, h: int) -> bool:
        return self.coord.begin_restore(h, self.seqs[s].state_slot)

    def _a_suspend(self, s: int) -> None:
        lease = self.coord.suspend_queued_restore(self.seqs[s].state_slot)
        if lease is not None:
            self.leases.append(lease)

    def _a_resume(self, i: int) -> None:
        lease = self.leases[i]
        self.coord.resume_suspended_restore(lease)
        del self.leases[i]
        self.spent_lease = lease

    def _a_release_lease(self, i: int) -> None:
        lease = self.leases[i]
        self.coord.release_suspended_restore(lease)
        del self.leases[i]
        self.spent_lease = lease

    def _a_reuse_lease(self) -> None:
        lease = self.spent_lease
        assert lease is not None
        self.spent_lease = None
        self.coord.release_suspended_restore(lease)

    def _a_unindex(self, h: int) -> None:
        self.coord.unindex(h)

    def _a_clear(self) -> None:
        self.coord.clear_index()

    def _a_kv_alloc(self, k: int) -> None:
        n = self.config.kv_units
        if not self.coord.ensure_free_units(n):
            return
        units = self.pool.reserve_units(n, (KV_OWNER, k))
        if units is not None:
            self.kv_held[k] = units

    def _a_kv_free(self, k: int) -> None:
        self.pool.release_units(self.kv_held.pop(k), (KV_OWNER, k))

    def _a_kv_partial_free(self, k: int) -> None:
        # Bad input: names only the first unit of the reservation (G9 refuses it).
        self.pool.release_units(self.kv_held[k][:1], (KV_OWNER, k))

    def _a_take_offload(self) -> None:
        for op, _units in self.coord.take_offload_stores(self.config.max_offload_inflight):
            self.ops.append(op)

    def _a_acquire(self, h: int) -> None:
        got = self.coord.acquire_checkpoint_source(h, max_inflight=self.config.max_offload_inflight)
        if got is not None:
            self.ops.append(got[0])
            self.lease_ops = self.lease_ops | {got[0]}

    def _a_release_source(self, i: int) -> None:
        self.coord.release_offload_store_source(self.ops[i])

    def _a_settle(self, i: int) -> None:
        op = self.ops.pop(i)
        self.lease_ops = self.lease_ops - {op}
        self.coord.was_reclaimed(op)
        self.coord.settle_offload_store(op)
        self.stale_op = op

    def _a_late_report(self) -> None:
        op = self.stale_op
        assert op is not None
        self.stale_op = None
        self.coord.release_offload_store_source(op)
        self.coord.settle_offload_store(op)

    def _a_tick(self) -> None:
        self.clock.now += self.config.timeout_s

    def _a_reclaim(self) -> None:
        self.coord.reclaim_stale_offload_pins(self.config.timeout_s)
        # Offload ops the store retired become stale handles of the environment. Leases
        # are never reclaimed: the environment keeps them, and `problems` reports a lease
        # the store dropped.
        live = self.coord.store._offload_pins
        for op in [o for o in self.ops if o not in live and o not in self.lease_ops]:
            self.ops.remove(op)
            self.stale_op = op

    def _a_reserve_transfer(self) -> None:
        owner = ("load", self.next_owner)
        self.next_owner += 1
        if self.coord.reserve_transfer_units(owner) is not None:
            self.owners.append(owner)

    def _a_release_transfer(self, i: int) -> None:
        owner = self.owners.pop(i)
        self.coord.release_transfer_units(owner)
        self.stale_owner = owner

    def _a_adopt(self, i: int, h: int) -> None:
        owner = self.owners.pop(i)
        self.coord.adopt_transfer_units(owner, h)
        self.stale_owner = owner

    def _a_late_release_transfer(self) -> None:
        owner = self.stale_owner
        self.stale_owner = None
        self.coord.release_transfer_units(owner)

    def _a_reserve_midstep(self, s: int, h: int) -> None:
        self.scratch_res.extend(self.coord.reserve_midstep(self.seqs[s], [(0, h)]))

    def _a_publish_midstep(self, i: int) -> None:
        res = self.scratch_res.pop(i)
        self.coord.publish_midstep([res])

    def _a_cancel_midstep(self, i: int) -> None:
        res = self.scratch_res.pop(i)
        self.coord.cancel_midstep([res])

    # -- views ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The coordinator's snapshot."""
        return self.coord.snapshot()

    def key(self) -> tuple[Any, ...]:
        """The canonical form used for the visited set.

        Abstracts away what no transition reads: counters, the change log, the forfeit
        memory (read only by the query ``was_reclaimed``), the clock's absolute value (only
        whether each offload pin is past the timeout), dirty marks, stale handles' identity,
        checkpoint ids (a record is named by its first unit, which is unique while it
        lives) and transfer-owner generations. Hashes are relabelled by first appearance
        (pool order, then the rest), which is sound because every action treats hashes
        symmetrically: equal keys imply states equal up to a renaming of hashes.
        """
        return _key(self)

    def problems(self) -> list[str]:
        """Agreement between the environment and the store: every handle the environment
        holds (offload op or lease awaiting its report, suspended-restore lease, transfer
        reservation, scratch reservation, KV units) is still live in the store."""
        store = self.coord.store
        out = []
        for op in self.ops:
            if op not in store._offload_pins:
                out.append(f"the environment still holds {op} but the store dropped it")
        for lease in self.leases:
            if lease.lease_id not in store._suspended:
                out.append(f"suspended-restore lease {lease.lease_id} is no longer live")
        for owner in self.owners:
            if owner not in self.coord._transfer_units:
                out.append(f"transfer reservation {owner!r} vanished")
        for slot, _pos, _h in self.scratch_res:
            if slot not in self.coord._scratch_reserved:
                out.append(f"scratch reservation of slot {slot} vanished")
        for units in self.in_flight_units:
            tag = self.pool.owner_of(units[0])
            owner = tag[0] if tag is not None else None
            if tag is None or not (
                isinstance(owner, tuple)
                and owner[0] == CHECKPOINT_OWNER
                and owner[1] in store.records
                and store.records[owner[1]].unit_ids == units
            ):
                out.append(
                    f"units {units} are read or written by an in-flight copy but belong to {tag!r}"
                )
        for k, held in self.kv_held.items():
            for piece, u in enumerate(held):
                if self.pool.owner_of(u) != ((KV_OWNER, k), piece):
                    out.append(f"KV unit {u} of tenant {k} is {self.pool.owner_of(u)!r}")
        return out

    def drain_problems(self) -> list[str]:
        """Drive a copy of this world to quiescence (:func:`drain_calls`) and report what
        did not come back (:func:`quiescence_problems`): afterwards every unit must be free
        and nothing pinned, pending, queued or in flight (no leak, no stuck pin)."""
        w = self.clone()
        calls = drain_calls(
            leases=w.leases,
            scratch=w.scratch_res,
            seqs=w.seqs,
            ops=w.ops,
            transfer_owners=w.owners,
            kv=[(units, (KV_OWNER, k)) for k, units in w.kv_held.items()],
        )
        try:
            for name, args in calls:
                make_drain_call(w.coord, w.pool, name, args)
        except PagedStateError as exc:
            return [f"the drain raised {type(exc).__name__}: {exc}"]
        return quiescence_problems(w.coord.snapshot())


# ---------------------------------------------------------------------------------------
# The drain to quiescence, shared with the conformance kit's ``quiesce`` rule
# ---------------------------------------------------------------------------------------


def drain_calls(
    *,
    leases: Iterable[Any],
    scratch: Iterable[Any],
    seqs: Iterable[Any],
    ops: Iterable[Any],
    transfer_owners: Iterable[Hashable],
    kv: Iterable[tuple[Any, Hashable]],
) -> list[Action]:
    """The calls that drive a coordinator to quiescence, in order, as ``(name, args)``
    (``name`` a coordinator method, or ``pool.<method>``): release every suspended-restore
    lease, cancel the midstep scratch reservations, forget every pending boundary, settle
    every offload operation, release every transfer reservation and the engine's KV units
    (``kv``: ``(units, owner)``), clear the index and complete batches until nothing is in
    flight. Arguments are passed through as given (the conformance kit passes a pair of
    handles, one per store)."""
    calls: list[Action] = [("release_suspended_restore", (lease,)) for lease in leases]
    reservations = list(scratch)
    if reservations:
        calls.append(("cancel_midstep", (reservations,)))
    calls += [("forget_pending", (seq,)) for seq in seqs]
    calls += [("settle_offload_store", (op,)) for op in ops]
    calls += [("release_transfer_units", (owner,)) for owner in transfer_owners]
    calls += [("pool.release_units", (units, owner)) for units, owner in kv]
    calls.append(("clear_index", ()))
    calls += [("take_checkpoint_ops", ()), ("complete_previous_batch", ())] * 3
    calls += [("clear_index", ()), ("complete_previous_batch", ())]
    return calls


def make_drain_call(coord: Any, pool: Any, name: str, args: tuple[Any, ...]) -> Any:
    """Make one call of :func:`drain_calls` on ``coord`` (or its ``pool``)."""
    if name.startswith("pool."):
        return getattr(pool, name[5:])(*args)
    return getattr(coord, name)(*args)


def quiescence_problems(s: Snapshot) -> list[str]:
    """What a drain left behind, read off the snapshot taken after it: units in use,
    records, offload pins, and anything pending, indexed, queued, in flight, suspended,
    reserved or transferred."""
    out = []
    if len(s.free) != s.num_units:
        out.append(f"drain left {s.num_units - len(s.free)} unit(s) in use: {dict(s.tags)}")
    if s.records:
        out.append(f"drain left records {dict(s.records)}")
    if s.offload_pins:
        out.append(f"drain left offload pins {dict(s.offload_pins)}")
    for name in (
        "pending",
        "index",
        "queued_restores",
        "inflight_restores",
        "suspended",
        "inflight_stores",
        "pending_boundaries",
        "scratch_queued",
        "scratch_issued",
        "scratch_reserved",
        "transfers",
    ):
        if getattr(s, name):
            out.append(f"drain left {name}: {getattr(s, name)!r}")
    return out


def _key(w: World) -> tuple[Any, ...]:
    # Written for speed: it runs once per generated state.
    coord = w.coord
    store = coord.store
    records = store.records
    hmap: dict[int, int] = {}
    omap: dict[Hashable, int] = {}
    first: dict[int, int] = {}
    units: list[Any] = []
    append = units.append
    owner_of = store.pool.owner_of  # the reference's or the production pool's
    for u in range(store.pool.num_units):
        tag = owner_of(u)
        if tag is None:
            append(None)
            continue
        owner, piece = tag
        kind = owner[0] if type(owner) is tuple else None
        if kind == CHECKPOINT_OWNER:
            if piece:
                append(piece)
                continue
            cid = owner[1]  # type: ignore[index]
            rec = records.get(cid)
            if rec is None:
                append(-1)
                continue
            first[cid] = u
            h = rec.prefix_hash
            v = hmap.get(h)
            if v is None:
                v = hmap[h] = len(hmap)
            append((v, rec.phase, rec.pin_count))
        else:
            o = owner[1] if kind == TRANSFER_OWNER else owner  # type: ignore[index]
            v = omap.get(o)
            if v is None:
                v = omap[o] = len(omap)
            append((kind == TRANSFER_OWNER, v, piece))

    def ch(h: int) -> int:
        v = hmap.get(h)
        if v is None:
            v = hmap[h] = len(hmap)
        return v

    def co(owner: Hashable) -> int:
        v = omap.get(owner)
        if v is None:
            v = omap[owner] = len(omap)
        return v

    fget = first.get
    parts: list[Any] = [tuple(units)]
    # The index and pending maps name live records; a record's first unit determines its
    # hash, so only the membership needs recording.
    parts.append(tuple(sorted(fget(c, -1) for c in store.hash_to_checkpoint.values())))
    parts.append(tuple(sorted(fget(c, -1) for c in store._pending_by_hash.values())))
    parts.append(tuple([fget(c, -1) for c in store._lru]))
    parts.append(tuple([fget(c, -1) for c in store._inflight_stores]))
    q = store._queued_restores
    parts.append(tuple([(fget(c, -1), op.dst_slot) for c, op in q]) if q else ())
    q = store._inflight_restores
    parts.append(tuple([(fget(c, -1), op.dst_slot) for c, op in q]) if q else ())
    sus = store._suspended
    parts.append(tuple(sorted((fget(c, -1), op.dst_slot) for c, op in sus.values())) if sus else ())
    parts.append(store._offload_sink)
    parts.append(tuple([fget(c, -1) for c in store._offload_ready]))
    ops = store._offload_pins
    if ops or w.ops:
        # Operation generations matter only relative to each other (they link the
        # environment's handles to the store's pins).
        gens = sorted({op.generation for op in ops} | {op.generation for op in w.ops})
        grank = {g: i for i, g in enumerate(gens)}
        limit = w.clock.now - w.config.timeout_s
        parts.append(
            tuple(
                sorted(
                    (
                        ch(op.prefix_hash),
                        grank[op.generation],
                        fget(p.checkpoint_id, -1),
                        p.source_released,
                        p.reclaimable,
                        p.pinned_at <= limit,
                    )
                    for op, p in ops.items()
                )
            )
        )
        parts.append(tuple([(ch(op.prefix_hash), grank[op.generation]) for op in w.ops]))
    else:
        parts.append(None)
    pend = coord._pending
    parts.append(tuple([(s.index, ch(h)) for s, h in pend.values()]) if pend else ())  # type: ignore[attr-defined]
    tr = coord._transfer_units
    parts.append(tuple(sorted((co(o), u[0]) for o, u in tr.items())) if tr else ())
    parts.append(tuple(sorted(coord._scratch_reserved)))
    parts.append(tuple([(ch(h), slot) for h, slot in coord._scratch_queued]))
    parts.append(tuple(coord._scratch_issued))
    # The environment.
    parts.append(tuple(sorted(w.kv_held)))
    parts.append(tuple([(fget(x.checkpoint_id, -1), x.op.dst_slot) for x in w.leases]))
    parts.append(w.spent_lease is not None)
    parts.append(w.stale_op is not None)
    parts.append(tuple([co(o) for o in w.owners]))
    parts.append(w.stale_owner is not None)
    parts.append(tuple([(slot, ch(h)) for slot, _pos, h in w.scratch_res]))
    parts.append(w.in_flight_units)
    return tuple(parts)
