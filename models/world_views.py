"""The views of an explored :class:`~pagedstate.models.world.World` (its snapshot, canonical
key, the environment's agreement checks, the drain to quiescence) and the drain's calls,
shared with the conformance kit's ``quiesce`` rule. A mixin of :class:`World`, apart so
that ``world.py`` holds the environment's actions and this module what is read off them."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any

from pagedstate.spec.errors import PagedStateError
from pagedstate.spec.snapshot import Snapshot
from pagedstate.spec.types import CHECKPOINT_OWNER

from .world_key import _PERMS, _key, _key_parts

if TYPE_CHECKING:
    from pagedstate.spec.types import (
        ManualCompletion,
        StateStoreOperationId,
        SuspendedCheckpointRestore,
    )

    from .reference import PagedStateCheckpointCoordinator
    from .world import Config, World

__all__: list[str] = []

#: First element of the owner tag of units other tenants (live KV) hold.
KV_OWNER = "live-kv"

Action = tuple[str, tuple[Any, ...]]


class _WorldViews:
    """What :class:`~pagedstate.models.world.World` reads off its state (module doc)."""

    # The World's attributes these views read (set by World.__init__ and clone).
    config: Config
    coord: PagedStateCheckpointCoordinator
    pool: Any
    seqs: tuple[Any, ...]
    kv_held: dict[int, list[int]]
    leases: list[SuspendedCheckpointRestore]
    ops: list[StateStoreOperationId]
    owners: list[Hashable]
    scratch_res: list[tuple[int, int, int]]
    in_flight_units: tuple[tuple[int, ...], ...]
    tokens: list[tuple[ManualCompletion, tuple[int, ...]]]
    filed: dict[int, tuple[int, int]]
    alarms: tuple[str, ...]

    if TYPE_CHECKING:

        def clone(self) -> World: ...  # World's (the drain copies the world)

    def snapshot(self) -> Snapshot:
        """The coordinator's snapshot."""
        return self.coord.snapshot()

    def key(self) -> tuple[Any, ...]:
        """The canonical form used for the visited set.

        Abstracts away what no transition reads: counters, the change log, the forfeit
        memory (read only by the query ``was_reclaimed``), the clock's absolute value (only
        whether each offload pin is past the timeout), dirty marks, stale handles' identity,
        checkpoint ids (a record is named by its first unit, which is unique while it
        lives), transfer-owner generations and completion tokens' identity (each token is
        its done flag and the records it lists; each record carries its settled flag), and
        forward ids (kept relative to the latest drain's, see :func:`_forward_key`). Hashes
        are relabelled by first appearance (pool order, then the rest), which is sound
        because every action treats hashes symmetrically: equal keys imply states equal up
        to a renaming of hashes. With ``config.symmetry``, also up to a renaming of the
        sequences: :meth:`symmetric_key`.
        """
        if self.config.symmetry:
            return self.symmetric_key()
        return _key(self)  # type: ignore[arg-type]  # a World (the mixin's class)

    def symmetric_key(self) -> tuple[Any, ...]:
        """The canonical form up to a renaming of the sequences (with their slots, SPEC
        H.3): the parts of :meth:`key` that name no sequence, with the set of the other
        parts under every permutation of the sequences. Sound
        because every action treats sequences alike (each has its own slot, and no rule
        reads a slot's number): a state and its mirror image, the state the mirrored
        trace reaches, have the same set (``tests/test_symmetry.py`` checks it on every
        state of ``tiny``, ``overlap`` and ``default`` to a bound). O(key + seqs! x the
        parts naming sequences)."""
        n = self.config.seqs
        if n < 2:
            return _key(self)  # type: ignore[arg-type]  # a World (the mixin's class)
        perms = _PERMS.get(n)
        if perms is None:
            perms = _PERMS[n] = tuple(itertools.permutations(range(n)))[1:]
        base, variants = _key_parts(self, (None, *perms))  # type: ignore[arg-type]
        return base, frozenset(variants)

    def problems(self) -> list[str]:
        """Agreement between the environment and the store: every handle the environment
        holds (offload op or lease awaiting its report, suspended-restore lease, transfer
        reservation, scratch reservation, KV units) is still live in the store; no image
        whose batch's completion token the environment has not marked done is settled
        (SPEC D.13); in the overlap style, the pending boundaries and their forwards are the
        ones the environment filed; and what the environment saw go wrong during the last
        action (a host reader handed such an image, a wrong-slot store under overlap, see
        :meth:`_check_drain`, a restore ``forget_pending`` left queued, G15)."""
        store = self.coord.store
        out = list(self.alarms)
        if self.config.forwards:
            # The boundaries pending, each with the forward named for it, as the environment
            # filed them (SPEC D.13, G1).
            snap = self.coord.snapshot()
            index: dict[Hashable, int] = {id(s): s.index for s in self.seqs}
            named = dict(snap.boundary_forwards)
            seen = {index.get(k, -1): (h, named.get(k)) for k, h in snap.pending_boundaries}
            if seen != self.filed:
                out.append(
                    f"pending boundaries (sequence: (hash, forward)) are {seen}, but the"
                    f" environment filed {self.filed}"
                )
        for token, cids in self.tokens:
            if token.done:
                continue
            for cid in cids:
                rec = store.records.get(cid)
                if rec is not None and rec.settled:
                    out.append(f"checkpoint {cid} is settled, but its completion token is not done")
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

    def quiescence_calls(self) -> list[Action]:
        """:func:`drain_calls` for the handles this world holds: the calls that give them
        all back and drive the coordinator to quiescence."""
        return drain_calls(
            leases=self.leases,
            scratch=self.scratch_res,
            seqs=self.seqs,
            ops=self.ops,
            transfer_owners=self.owners,
            kv=[(units, (KV_OWNER, k)) for k, units in self.kv_held.items()],
        )

    def drain_problems(self, memo: dict[Any, bool] | None = None) -> list[str]:
        """Drive a copy of this world to quiescence (:func:`drain_calls`, then
        ``settle_completions(wait=True)``) and report what did not come back
        (:func:`quiescence_problems`): afterwards every unit must be free and nothing
        pinned, pending, queued, in flight or awaiting its completion token (no leak, no
        stuck pin).

        ``memo`` (a dict kept by the caller for one search, or None) memoises the drain's
        fixed tail on the canonical state it starts from. The drain is a head that hands
        back what the environment holds (leases, scratch reservations, pending boundaries,
        offload operations, transfer reservations, KV units: different from state to
        state) and a tail that takes no argument (:data:`DRAIN_TAIL`: clear, drain and
        complete until nothing is in flight, settle). The tail calls only the
        coordinator, so two copies whose keys (:meth:`key`) are equal once the head ran
        (the environment's released handles forgotten) come out of it alike: the first
        one's verdict stands for the rest. A memoised failure is drained again without the
        memo, so its message names this state's own objects. O(head + key) on a hit."""
        w = self.clone()
        calls = w.quiescence_calls()
        tail = len(calls) - DRAIN_TAIL
        seen: Any = None
        try:
            for i, (name, args) in enumerate(calls):
                if i == tail and memo is not None:
                    # the head gave every handle back: the environment holds nothing now
                    w.kv_held, w.leases, w.ops, w.owners, w.scratch_res = {}, [], [], [], []
                    seen = w.key()
                    ok = memo.get(seen)
                    if ok is not None:
                        return [] if ok else self.drain_problems()
                make_drain_call(w.coord, w.pool, name, args)
            if self.config.completions:
                w.coord.settle_completions(wait=True)  # a teardown waits for every token
        except PagedStateError as exc:
            out = [f"the drain raised {type(exc).__name__}: {exc}"]
        else:
            s = w.coord.snapshot()
            out = quiescence_problems(s)
            if s.completions:
                out.append(f"drain left completions {s.completions!r}")
        if seen is not None:
            memo[seen] = not out  # type: ignore[index]
        return out


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


#: The calls at the end of every :func:`drain_calls` list that take no argument (clear the
#: index, drain and complete three times, clear and complete): the part of a drain that
#: :meth:`World.drain_problems` memoises.
DRAIN_TAIL = 9


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
