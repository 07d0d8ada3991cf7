"""The explored world: a coordinator (pool, store) plus the environment around it.

The environment is what an engine and its neighbours do to the store: sequences filing
boundaries and leaving their slots, drains and completions of batches, restores, other
owners taking and returning units (KV pressure), KV hash evictions, admin clears, the CPU
tier handing out and reporting offload stores (in any order, duplicated and late), clock
jumps past the reclaim timeout, external transfers and leases, and midstep scratch slots.
Batches complete with or without a completion token (SPEC D.13,
:class:`~pagedstate.spec.types.ManualCompletion`); the environment marks outstanding tokens
done in any order and late, and settles them (``settle_completions``, rarely with
``wait=True``). In the overlap style (``Config.forwards``) boundaries and midstep scratch
stores name the forward that computes their state, drains take automatic forward ids, and
restores are begun for a sequence (G15).

Besides the store's own invariants, the environment checks what it can see from outside
(:meth:`World.problems`): no host reader (``take_offload_stores``,
``acquire_checkpoint_source``) is handed an image whose batch's token the environment has not
marked done, and no image is settled while its token is not; in the overlap style, every
store a drain returns for a boundary comes from a boundary whose named forward is exactly the
forward drained last before that drain (no wrong-slot store under overlap), of the hash filed,
no scratch store is issued before its forward ran, the pending boundaries and their forwards
are the ones the environment filed, and ``forget_pending(seq)`` leaves no restore begun for
``seq`` queued (G15), even after the slot was reset.

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

from pagedstate.spec.types import (
    CHECKPOINT_OWNER,
    ManualCompletion,
    PagedStateCheckpointSpec,
    StateStoreOperationId,
    SuspendedCheckpointRestore,
)

from .reference import PagedStateCheckpointCoordinator, SlotPool, UnitPool
from .world_key import _key as _key  # re-exported (tests import it from here)
from .world_views import (
    DRAIN_TAIL,
    KV_OWNER,
    Action,
    _WorldViews,
    drain_calls,
    make_drain_call,
    quiescence_problems,
)

__all__ = [
    "Config",
    "World",
    "Seq",
    "ManualClock",
    "Action",
    "KV_OWNER",
    "drain_calls",
    "DRAIN_TAIL",
    "make_drain_call",
    "quiescence_problems",
]


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
        completions: batches may also complete with a completion token (SPEC D.13), while
            fewer than this many tokens are outstanding in the store (0: never).
        settle_wait: also ``settle_completions(wait=True)`` (a teardown's wait).
        forwards: the overlap style (D.13): boundaries name forwards
            (``checkpoint(..., forward=next_forward)`` before the drain, ``forward=
            last_forward`` after it), drains take automatic ids, scratch stores are
            published with ``forward=next_forward``, restores are begun with ``seq=`` and
            ``forget_pending`` is also called after resetting the slot (G15).
        skip_forwards: with ``forwards``, also drains naming ``next_forward + 1`` (forward
            ids that skip a value, so a pending boundary can fall behind).
        scratch_restores: also restores into the scratch slots (G12: refused while the slot
            is lent as scratch; a queued one makes ``reserve_midstep`` refuse the slot).
        max_depth: stop exploring below this depth (``None``: until the space is exhausted).
        symmetry: identify states up to a renaming of the sequences and their slots
            (:meth:`World.symmetric_key`): fewer states, the same shortest traces' lengths.
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
    completions: int = 0
    settle_wait: bool = False
    forwards: bool = False
    skip_forwards: bool = False
    scratch_restores: bool = False
    max_depth: int | None = None
    symmetry: bool = False

    @property
    def spec(self) -> PagedStateCheckpointSpec:
        """The image geometry: 10-byte units, ``units_per_checkpoint`` of them per image."""
        image = 10 * self.units_per_checkpoint
        return PagedStateCheckpointSpec(
            page_unit_bytes=10, slot_bytes=image, layout_id="explore-v1", image_bytes=image
        )

    def build(
        self,
        coordinator_factory: Callable[..., PagedStateCheckpointCoordinator] | None = None,
        pool_factory: Callable[[int], Any] | None = None,
    ) -> World:
        """A fresh world in its initial state (optionally over a mutant coordinator class,
        or another store's coordinator and pool factories)."""
        return World(self, coordinator_factory, pool_factory)


class _Offload:
    """A CPU-tier double: votes for nothing (the explorer does not model the vote)."""

    def could_serve(self, prefix_hash: int) -> bool:
        del prefix_hash
        return False


class World(_WorldViews):
    """A coordinator plus its environment; see the module docstring."""

    def __init__(
        self,
        config: Config,
        coordinator_factory: Callable[..., PagedStateCheckpointCoordinator] | None = None,
        pool_factory: Callable[[int], Any] | None = None,
    ) -> None:
        self.config = config
        factory = coordinator_factory or PagedStateCheckpointCoordinator
        self.clock = self._new_clock()
        self.pool = (pool_factory or UnitPool)(config.units)
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
        self.pool = self._pool_of(self.coord, self.pool)
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
        # Completion tokens the environment passed and has not marked done, each with the
        # checkpoints its completion published (SPEC D.13). Tokens are this world's own:
        # `clone` gives the copy fresh ones (the store's clone shares them).
        self.tokens: list[tuple[ManualCompletion, tuple[int, ...]]] = []
        # The overlap style: the forward the environment named for each sequence's pending
        # boundary (seq index -> (h, forward)), by the rules of SPEC D.1 steps 5-9 and D.13
        # (superseded, forgotten, unindexed, cleared, taken by the drain after its forward),
        # and for each queued scratch store (slot -> forward) while the coordinator has it.
        self.filed: dict[int, tuple[int, int]] = {}
        self.published: dict[int, int] = {}
        # The overlap style: the slot of the queued restore begun for each sequence (G15),
        # until a drain takes it, a suspend or a forget.
        self.owned: dict[int, int] = {}
        # What the environment saw go wrong during the last action (reported by `problems`).
        self.alarms: tuple[str, ...] = ()

    def clone(self) -> World:
        """A deep copy of the world (completion tokens included); the coordinator's clock is
        re-pointed at the copy's."""
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
        # `tokens`, `filed`, `published` and `owned` are replaced, never changed in place, so
        # the copy shares them until it acts.
        store = w.coord.store
        if store._completions or self.tokens:
            # The store's clone shares the token objects; this world's tokens are its own.
            fresh: dict[int, ManualCompletion] = {}

            def own(t: Any) -> ManualCompletion:
                n = fresh.get(id(t))
                if n is None:
                    n = fresh[id(t)] = ManualCompletion(t.done)
                return n

            store._completions = [(own(t), cids) for t, cids in store._completions]
            w.tokens = [(own(t), cids) for t, cids in self.tokens]
        return w

    # -- what the environment reads of the store (overridden by the conformance kit's
    # follower world, which sees a store under test through its public API only) ----------

    def _new_clock(self) -> Any:
        """The clock the coordinator is built with (read as ``clock()``; ``tick`` adds to
        its ``now``)."""
        return ManualClock()

    def _pool_of(self, coord: Any, given: Any) -> Any:
        """The unit pool ``coord``'s store uses (``given``: the one it was built with)."""
        del given
        return coord.store.pool

    def _new_token(self) -> Any:
        """A fresh completion token (not done) for ``complete_previous_batch``."""
        return ManualCompletion()

    def _records(self) -> Any:
        """The store's records by checkpoint id (a mapping; each record has ``phase``,
        ``prefix_hash``, ``unit_ids`` and ``settled``)."""
        return self.coord.store.records

    def _live_offload_ops(self) -> Any:
        """The offload operations the store still pins (a container of operation ids)."""
        return self.coord.store._offload_pins

    # -- actions ------------------------------------------------------------------------

    def actions(self) -> list[Action]:
        """Every action enabled in this state, in a fixed order.

        Calls that are certainly no-ops of the reference model here (a drain with nothing to
        drain, a completion with nothing in flight, an unindex of a hash nobody holds, a
        clock tick once every pin is past the timeout, a settle with no token done...) are
        left out: they could only lead back to this state.
        """
        c = self.config
        coord = self.coord
        store = coord.store
        hs = range(1, c.hashes + 1)
        contained = [h for h in hs if coord.contains(h)]
        out: list[Action] = []
        if coord._pending or store._queued_restores or coord._scratch_queued:
            out.append(("drain", ()))
            if c.forwards and c.skip_forwards:
                out.append(("drain_skip", ()))
        if (
            store._inflight_stores
            or store._inflight_restores
            or coord._scratch_issued
            or self.in_flight_units
        ):
            out.append(("complete", ()))
        if c.completions:
            comps: list[tuple[Any, list[int]]] = store._completions
            if len(comps) < c.completions and self._publishable():
                out.append(("complete_token", ()))
            for i in range(len(self.tokens)):
                out.append(("token_done", (i,)))
            if any(t.done for t, _ in comps):
                out.append(("settle_completions", ()))
            if c.settle_wait and any(not t.done for t, _ in comps):
                out.append(("settle_wait", ()))
        pending_seqs = {k[0] for k in coord._pending}
        pending_hashes = {h for _, h in coord._pending.values()}
        queued_slots = {op.dst_slot for _, op in store._queued_restores}
        last = coord.last_forward if c.forwards else None
        for s in range(c.seqs):
            seq = self.seqs[s]
            for h in hs:
                if not c.forwards:
                    out.append(("checkpoint", (s, h)))
                    continue
                out.append(("checkpoint_next", (s, h)))
                if last is not None:
                    out.append(("checkpoint_last", (s, h)))
            if id(seq) in pending_seqs or seq.state_slot in queued_slots:
                out.append(("forget", (s,)))
                if c.forwards:
                    out.append(("forget_reset", (s,)))
            for h in contained:
                out.append(("begin_restore", (s, h)))
            if c.suspend and seq.state_slot in queued_slots:
                out.append(("suspend", (s,)))
        if last is not None:
            out.append(("checkpoint_stale", (0, 1)))  # refused, see _a_checkpoint_stale
        if c.scratch_restores:
            for i in range(c.scratch_slots):
                for h in contained:
                    out.append(("restore_scratch", (i, h)))
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
            for h in contained:
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
        self.alarms = ()
        out = getattr(self, "_a_" + name)(*args)
        if self.published:
            self._sync_published()
        return out

    def _sync_published(self) -> None:
        """Forget the forwards named for scratch stores the coordinator no longer has queued
        (issued, refused, orphaned). From outside, a refused store cannot be told from one
        kept over budget, so this follows the coordinator; the boundaries' forwards
        (``filed``) the environment follows by itself."""
        queued = {slot for _, slot in self.coord.snapshot().scratch_queued}
        if not queued.issuperset(self.published):
            self.published = {x: f for x, f in self.published.items() if x in queued}

    def _cid_of(self, units: tuple[int, ...]) -> int | None:
        """The checkpoint whose units these are (from the pool's tag), or None."""
        tag = self.pool.owner_of(units[0]) if units else None
        owner = tag[0] if tag is not None else None
        if isinstance(owner, tuple) and owner[0] == CHECKPOINT_OWNER:
            return owner[1]  # type: ignore[no-any-return]
        return None

    def _publishable(self) -> list[int]:
        """The COPYING checkpoints the drained batches still write: what a completion now
        would publish, in drain order."""
        records = self._records()
        out = []
        for units in self.in_flight_units:
            cid = self._cid_of(units)
            rec = records.get(cid) if cid is not None else None
            if rec is not None and rec.phase == "COPYING":
                out.append(cid)
        return out  # type: ignore[return-value]

    def _alarm(self, msg: str) -> None:
        self.alarms = (*self.alarms, msg)

    def _host_read(self, what: str, units: tuple[int, ...]) -> None:
        """A host reader was handed ``units``: their image must not be one whose batch's
        completion token the environment has not marked done (SPEC D.13)."""
        cid = self._cid_of(units)
        for token, cids in self.tokens:
            if cid in cids and not token.done:
                self._alarm(
                    f"{what} handed out checkpoint {cid}, whose batch's completion token is"
                    " not done"
                )

    def _a_drain(self) -> Any:
        return self._drain(None)

    def _a_drain_skip(self) -> Any:
        # Forward ids that skip a value (an engine whose step counter jumped).
        return self._drain(self.coord.next_forward + 1)

    def _drain(self, forward: int | None) -> Any:
        coord = self.coord
        prev = coord.last_forward
        if forward is None:
            stores, restores = coord.take_checkpoint_ops()
        else:
            stores, restores = coord.take_checkpoint_ops(forward=forward)
        if self.config.forwards:
            self._check_drain(prev, stores)
        if self.owned:
            self.owned = {}  # the drain took every queued restore
        if self.filed and prev is not None:
            # Taken by this drain: stored, skipped, refused, or dropped as behind (D.13).
            self.filed = {s: (h, f) for s, (h, f) in self.filed.items() if f > prev}
        self.in_flight_units += tuple(op.unit_ids for op in stores) + tuple(
            op.unit_ids for op in restores
        )
        return stores, restores

    def _check_drain(self, prev: int | None, stores: Iterable[Any]) -> None:
        """The drain after forward ``prev`` returned ``stores``: a boundary store must come
        from a boundary the environment filed naming exactly forward ``prev`` (else the
        copy reads the slot as another forward left it: a wrong-slot store under overlap),
        of the hash filed; a scratch store published for forward ``F`` only once ``F <=
        prev`` (else the copy reads the scratch slot before forward ``F`` wrote it)."""
        records = self._records()
        for op in stores:
            slot = op.src_slot
            if slot < self.config.seqs:
                entry = self.filed.get(slot)
                if entry is None:
                    if self.config.forwards:
                        self._alarm(
                            f"the drain after forward {prev} stored sequence {slot}'s slot, but"
                            " no boundary of it is filed"
                        )
                    continue
                h, f = entry
                if f != prev:
                    self._alarm(
                        f"wrong-slot store under overlap: the drain after forward {prev} stored"
                        f" sequence {slot}'s boundary {h}, filed for forward {f}"
                    )
                cid = self._cid_of(op.unit_ids)
                rec = records.get(cid) if cid is not None else None
                if rec is None or rec.prefix_hash != h:
                    got = None if rec is None else rec.prefix_hash
                    self._alarm(
                        f"the drain stored sequence {slot}'s slot as {got!r}, but the"
                        f" boundary filed was {h}"
                    )
            else:
                fs = self.published.get(slot)
                if fs is not None and (prev is None or fs > prev):
                    self._alarm(
                        f"the drain after forward {prev} issued the scratch store of slot"
                        f" {slot}, published for forward {fs}: read before its forward ran"
                    )

    def _a_complete(self) -> None:
        self.coord.complete_previous_batch()
        self.in_flight_units = ()

    def _a_complete_token(self) -> None:
        cids = self._publishable()
        token = self._new_token()
        self.coord.complete_previous_batch(token)
        self.in_flight_units = ()
        records = self._records()
        published = tuple(c for c in cids if c in records)
        if published:
            self.tokens = [*self.tokens, (token, published)]

    def _a_token_done(self, i: int) -> None:
        # The batch's copies finished; the store learns it at its next poll.
        token, _cids = self.tokens[i]
        self.tokens = self.tokens[:i] + self.tokens[i + 1 :]
        token.set()

    def _a_settle_completions(self) -> int:
        return self.coord.settle_completions()

    def _a_settle_wait(self) -> int:
        n = self.coord.settle_completions(wait=True)
        self.tokens = [(t, cids) for t, cids in self.tokens if not t.done]
        return n

    def _a_checkpoint(self, s: int, h: int) -> None:
        self.coord.checkpoint(self.seqs[s], 1, h)

    def _file(self, s: int, h: int, forward: int) -> None:
        self.coord.checkpoint(self.seqs[s], 1, h, forward=forward)
        entry = self.filed.get(s)
        if entry is None or entry[0] != h:  # re-filing the same hash keeps its forward (G1)
            self.filed = {**self.filed, s: (h, forward)}

    def _a_checkpoint_next(self, s: int, h: int) -> None:
        # Filed when the batch that reaches the boundary is scheduled, before its drain.
        self._file(s, h, self.coord.next_forward)

    def _a_checkpoint_last(self, s: int, h: int) -> None:
        # Filed after the drain of the forward that reaches it, before the next drain.
        last = self.coord.last_forward
        assert last is not None
        self._file(s, h, last)

    def _a_checkpoint_stale(self, s: int, h: int) -> None:
        # Filed too late, naming the forward before the latest drain's: StaleBoundaryError
        # (after forward 0 that is -1, refused as an InvalidArgumentError; either way
        # refused, so whether a refusal is tried does not depend on the absolute id).
        last = self.coord.last_forward
        assert last is not None
        self._file(s, h, last - 1)
        self._alarm(f"a boundary naming forward {last - 1} was accepted after forward {last}")

    def _a_forget(self, s: int) -> None:
        self.coord.forget_pending(self.seqs[s])
        self._forgotten(s)

    def _a_forget_reset(self, s: int) -> None:
        # The engine reset the slot before forgetting the request (G15: by identity).
        seq = self.seqs[s]
        slot = seq.state_slot
        seq.state_slot = -1
        try:
            self.coord.forget_pending(seq)
        finally:
            seq.state_slot = slot
        self._forgotten(s)

    def _a_begin_restore(self, s: int, h: int) -> bool:
        seq = self.seqs[s]
        if not self.config.forwards:
            return self.coord.begin_restore(h, seq.state_slot)
        began = self.coord.begin_restore(h, seq.state_slot, seq=seq)
        if began:
            self.owned = {**self.owned, s: seq.state_slot}
        return began

    def _a_restore_scratch(self, i: int, h: int) -> bool:
        # A restore into a scratch slot: refused while the slot is lent as scratch (G12).
        return self.coord.begin_restore(h, self.config.seqs + i)

    def _a_suspend(self, s: int) -> None:
        slot = self.seqs[s].state_slot
        lease = self.coord.suspend_queued_restore(slot)
        if lease is not None:
            self.leases.append(lease)
            self._disown(slot)  # a suspended restore is no longer the sequence's (G15)

    def _disown(self, slot: int) -> None:
        if slot in self.owned.values():
            self.owned = {s: x for s, x in self.owned.items() if x != slot}

    def _forgotten(self, s: int) -> None:
        """``forget_pending`` of sequence ``s`` returned: its boundary is gone, and so is the
        restore begun for it, if one was still queued (G15: by identity, whatever its slot
        says now)."""
        if s in self.filed:
            self.filed = {k: e for k, e in self.filed.items() if k != s}
        slot = self.owned.get(s)
        if slot is None:
            return
        self.owned = {k: x for k, x in self.owned.items() if k != s}
        if self.coord.restore_queued_for(slot):
            self._alarm(
                f"forget_pending left the restore begun for sequence {s} queued into slot {slot}"
            )

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
        if self.filed:
            self.filed = {s: (fh, f) for s, (fh, f) in self.filed.items() if fh != h}

    def _a_clear(self) -> None:
        self.coord.clear_index()
        self.filed = {}

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
        for op, units in self.coord.take_offload_stores(self.config.max_offload_inflight):
            self.ops.append(op)
            self._host_read("take_offload_stores", units)

    def _a_acquire(self, h: int) -> None:
        got = self.coord.acquire_checkpoint_source(h, max_inflight=self.config.max_offload_inflight)
        if got is not None:
            self.ops.append(got[0])
            self.lease_ops = self.lease_ops | {got[0]}
            self._host_read("acquire_checkpoint_source", got[1])

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
        live = self._live_offload_ops()
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
        if not self.config.forwards:
            self.coord.publish_midstep([res])
            return
        # Published when the forward that writes the slot is scheduled, before its drain.
        forward = self.coord.next_forward
        self.coord.publish_midstep([res], forward=forward)
        self.published = {**self.published, res[0]: forward}

    def _a_cancel_midstep(self, i: int) -> None:
        res = self.scratch_res.pop(i)
        self.coord.cancel_midstep([res])
