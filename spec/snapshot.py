"""One snapshot type any store can produce, and the invariants over it (SPEC C, G).

Both the reference model and the production store return a :class:`Snapshot`
from ``snapshot()``; differential checks compare snapshots with ``==`` and
every check calls :func:`check_invariants` (state predicates) and
:func:`check_step_invariants` (predicates over a call's before and after).

Each invariant is a named function returning a list of problem strings (empty
when it holds), so a report can say which one broke and why.

Where each of SPEC section C's 28 invariants is checked:

==== =====================================================================================
C1   :func:`unit_conservation`
C2   :func:`tag_bijection` (records and transfer reservations)
C3   :func:`unit_conservation` + :func:`tag_bijection` (a unit has one tag; free units none)
C4   :func:`fixed_size`; unit ids never change: a record's units are in its tags (C2) and
     tags of live records are only ever moved by ``rekey`` at adoption
C5   :func:`ready_set_equality`
C6   :func:`one_image_per_hash`
C7   :func:`pending_is_copying`
C8   :func:`copying_in_flight`
C9   :func:`evicting_alive`
C10  :func:`pin_accounting`
C11  step :func:`pinned_survive`; the shared eligibility rule lives in one predicate of the
     store (``_is_evictable``) and scenario tests F13-F19 pin its answers
C12  :func:`readers_reference_live_records`, step :func:`pinned_survive`, and the explorer's
     environment check that every in-flight copy's units still belong to their record
C13  step :func:`visibility`
C14  :func:`identities_ahead`, step :func:`monotone_identities`, step
     :func:`change_log_exact` (G6 replaces "bumped by unindex even on a miss")
C15  :func:`offload_ops_unique`
C16  :func:`backlog_bound`
C17  the offload table has no reclaim row without the ``reclaimable`` guard; the explorer's
     environment check fails when a lease it holds disappears (mutant ``reclaim_lease``)
C18  :func:`forfeit_memory` (G7: exact memory bounded, watermark beyond)
C19  :func:`tag_bijection` (owners are dict keys, so unique); scenario F50
C20  :func:`coordinator_pending`
C21  :func:`scratch_disjoint`; scratch slots come from their own pool, disjoint from
     request slots by construction (the explorer's worlds use separate ranges)
C22  per drain, not per state: scenario tests of the scratch budget
C23  :func:`fixed_size` for records; op fields are built from the spec (scenario tests)
C24  :class:`~pagedstate.spec.types.PagedStateCheckpointSpec` validation (construction)
C25  :func:`slot_lenders_exclusive`
C26  :func:`settled_accounting`
C27  :func:`host_readers_settled`
C28  :func:`forwards_known`
==== =====================================================================================

Section G adds :func:`one_restore_per_slot` (G4), :func:`leases_unique` (G3),
:func:`dirty_in_pool` and step :func:`dirty_marking` (G10), step
:func:`change_log_exact` (G6) and step :func:`nominations_accounted` (B.4: a deferred
nomination is never lost).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from itertools import pairwise
from typing import Any

import attrs

from .types import CHECKPOINT_OWNER, TRANSFER_OWNER, StateStoreOperationId

__all__ = [
    "RecordView",
    "OffloadPinView",
    "Snapshot",
    "INVARIANTS",
    "STEP_INVARIANTS",
    "check_invariants",
    "check_step_invariants",
]


@attrs.frozen
class RecordView:
    """A record as a snapshot shows it. ``phase`` is one of the record table's phases;
    ``settled`` whether the copy that made its image is known done (SPEC D.13): false while
    COPYING and while its batch's completion token has not reported done, true for an
    image published without a token or adopted from a transfer."""

    prefix_hash: int
    unit_ids: tuple[int, ...]
    phase: str
    pin_count: int
    settled: bool = True


@attrs.frozen
class OffloadPinView:
    """An offload store or lease operation as a snapshot shows it (SPEC B.1 ``_OffloadPin``).

    ``pinned_at`` is the store clock's reading when the op was pinned (seconds)."""

    checkpoint_id: int
    source_released: bool
    reclaimable: bool
    pinned_at: float


def _empty_dict() -> dict[Any, Any]:
    return {}


@attrs.frozen
class Snapshot:
    """Everything observable of a pool, store and (optionally) coordinator.

    Pool: ``num_units`` ids ``[0, num_units)``; ``free`` ids; ``dirty`` ids that last held
    checkpoint or transfer bytes and were not scrubbed since (G10); ``tags`` maps every raw
    unit to ``(owner, piece)``; ``cached`` lists the free units that still hold an engine's
    cached KV block as ``(unit, prefix_hash)``, next to be reused first (empty for a pool
    without KV caching, such as the reference model's).
    Store: SPEC B.1's structures, ``records`` by checkpoint id; ``queued_restores`` and
    ``inflight_restores`` as ``(cid, dst_slot)``; ``suspended`` as live leases
    ``(lease_id, cid, dst_slot)``; forfeit memory as exact ``forfeited`` ops plus a
    ``forfeit_watermark`` generation (G7); ``changes`` is the change log's content,
    ``(generation, prefix_hash or None)`` oldest first; ``next_lease_id`` the id the next
    suspended-restore lease gets.
    Coordinator (empty for a bare store): ``pending_boundaries`` as ``(seq_key, h)`` in filing
    order, ``transfers`` by owner, scratch queues, the fate counters, and ``scratch_free``,
    the scratch slot pool's free slots (``None`` when no pool is attached or it does not
    tell, i.e. has no ``free_slots``).
    Overlapped scheduling (SPEC D.13): ``completions`` lists, per completion token not yet
    seen done (in the order the completions were called), the checkpoint ids it published;
    ``last_forward`` is the forward id of the latest drain (``None`` before the first);
    ``boundary_forwards`` gives ``(seq_key, forward)`` for each pending boundary filed with
    a forward, and ``scratch_forwards`` ``(slot, forward)`` for each queued scratch store
    published with one, both in filing order; ``restore_owners`` gives ``(seq_key,
    dst_slot)`` for each queued restore begun on behalf of a sequence, in filing order.

    The fields after ``checkpoints_orphaned`` have defaults so that a store written before
    they existed still builds a snapshot; both stores of this project fill every field.
    """

    num_units: int
    units_per_checkpoint: int
    free: frozenset[int]
    dirty: frozenset[int]
    tags: Mapping[int, tuple[Hashable, int]]
    records: Mapping[int, RecordView]
    index: Mapping[int, int]
    pending: Mapping[int, int]
    lru: tuple[int, ...]
    inflight_stores: tuple[int, ...]
    queued_restores: tuple[tuple[int, int], ...]
    inflight_restores: tuple[tuple[int, int], ...]
    suspended: tuple[tuple[int, int, int], ...]
    offload_sink: bool
    offload_ready: tuple[int, ...]
    offload_backlog_cap: int
    offload_pins: Mapping[StateStoreOperationId, OffloadPinView]
    forfeited: frozenset[StateStoreOperationId]
    forfeit_watermark: int
    forfeit_bound: int
    generation: int
    next_checkpoint_id: int
    offload_generation: int
    evictions: int
    offload_pins_reclaimed: int
    offload_nominations_dropped: int
    pending_boundaries: tuple[tuple[Hashable, int], ...] = ()
    transfers: Mapping[Hashable, tuple[int, ...]] = attrs.field(factory=_empty_dict)
    scratch_reserved: frozenset[int] = frozenset()
    scratch_queued: tuple[tuple[int, int], ...] = ()
    scratch_issued: tuple[int, ...] = ()
    checkpoints_kept: int = 0
    checkpoints_dropped: int = 0
    checkpoints_orphaned: int = 0
    cached: tuple[tuple[int, int], ...] = ()
    changes: tuple[tuple[int, int | None], ...] = ()
    next_lease_id: int = 0
    scratch_free: frozenset[int] | None = None
    completions: tuple[tuple[int, ...], ...] = ()
    last_forward: int | None = None
    boundary_forwards: tuple[tuple[Hashable, int], ...] = ()
    scratch_forwards: tuple[tuple[int, int], ...] = ()
    restore_owners: tuple[tuple[Hashable, int], ...] = ()

    def ready_pairs(self) -> frozenset[tuple[int, int]]:
        """``{(prefix_hash, cid)}`` of READY records: the set the change log tracks."""
        return frozenset((r.prefix_hash, c) for c, r in self.records.items() if r.phase == "READY")

    def diff(self, other: Snapshot) -> list[str]:
        """Field names that differ from ``other``, with both values (for failure reports)."""
        out = []
        for f in attrs.fields(Snapshot):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a != b:
                out.append(f"{f.name}: {a!r} != {b!r}")
        return out


Invariant = Callable[[Snapshot], list[str]]
StepInvariant = Callable[[Snapshot, Snapshot], list[str]]


# --- state invariants (SPEC C) ----------------------------------------------------------


def unit_conservation(s: Snapshot) -> list[str]:
    """C1: every unit id is exactly one of free or tagged; nothing outside ``[0, num_units)``."""
    out = []
    tagged = set(s.tags)
    both = tagged & s.free
    if both:
        out.append(f"units both free and tagged: {sorted(both)}")
    everything = tagged | s.free
    missing = set(range(s.num_units)) - everything
    if missing:
        out.append(f"units neither free nor tagged (leaked): {sorted(missing)}")
    extra = everything - set(range(s.num_units))
    if extra:
        out.append(f"unit ids outside the pool: {sorted(extra)}")
    cached = [u for u, _ in s.cached]
    if len(set(cached)) != len(cached):
        out.append(f"cached units repeat: {cached}")
    if not set(cached) <= s.free:
        out.append(f"cached units not free: {sorted(set(cached) - s.free)}")
    return out


def _tagged_by(s: Snapshot) -> dict[Hashable, list[tuple[int, int]]]:
    """``(piece, unit)`` of every unit a store owner holds, by owner. A store owner is known
    by its shape, a 2-tuple of a store kind (SPEC A.3): an engine owner that only compares
    equal to one is another owner, and its units are left out."""
    by_owner: dict[Hashable, list[tuple[int, int]]] = {}
    for unit, (owner, piece) in s.tags.items():
        if (
            isinstance(owner, tuple)
            and len(owner) == 2
            and owner[0] in (CHECKPOINT_OWNER, TRANSFER_OWNER)
        ):
            by_owner.setdefault(owner, []).append((piece, unit))
    return by_owner


def tag_bijection(s: Snapshot) -> list[str]:
    """C2: a record's units are exactly those tagged ``("state-checkpoint", cid)``, piece =
    position; likewise for transfer reservations; no checkpoint or transfer tag without its
    record or reservation."""
    out = []
    by_owner = _tagged_by(s)
    for cid, r in s.records.items():
        tagged = sorted(by_owner.get((CHECKPOINT_OWNER, cid), []))
        if tuple(u for _, u in tagged) != r.unit_ids or [p for p, _ in tagged] != list(
            range(len(r.unit_ids))
        ):
            out.append(f"record {cid}: units {r.unit_ids} but tags {tagged}")
    for owner, units in s.transfers.items():
        tagged = sorted(by_owner.get((TRANSFER_OWNER, owner), []))
        if tuple(u for _, u in tagged) != units:
            out.append(f"transfer {owner!r}: units {units} but tags {tagged}")
    for owner in by_owner:
        if isinstance(owner, tuple) and len(owner) == 2:
            kind, ident = owner
            if kind == CHECKPOINT_OWNER and ident not in s.records:
                out.append(f"units tagged for checkpoint {ident}, which has no record")
            if kind == TRANSFER_OWNER and ident not in s.transfers:
                out.append(f"units tagged for transfer {ident!r}, which has no reservation")
    return out


def fixed_size(s: Snapshot) -> list[str]:
    """C4, C23: every record and reservation holds exactly ``units_per_checkpoint`` distinct
    units."""
    out = []
    for cid, r in s.records.items():
        if len(r.unit_ids) != s.units_per_checkpoint or len(set(r.unit_ids)) != len(r.unit_ids):
            out.append(f"record {cid} holds {r.unit_ids}, not {s.units_per_checkpoint} units")
    for owner, units in s.transfers.items():
        if len(units) != s.units_per_checkpoint:
            out.append(f"transfer {owner!r} holds {units}, not {s.units_per_checkpoint} units")
    return out


def ready_set_equality(s: Snapshot) -> list[str]:
    """C5: READY records = LRU = index values, and the index names each READY record by its hash."""
    out = []
    ready = {c for c, r in s.records.items() if r.phase == "READY"}
    if len(s.lru) != len(set(s.lru)):
        out.append(f"LRU has duplicates: {s.lru}")
    if set(s.lru) != ready:
        out.append(f"LRU {sorted(s.lru)} != READY {sorted(ready)}")
    if set(s.index.values()) != ready:
        out.append(f"index values {sorted(s.index.values())} != READY {sorted(ready)}")
    for h, cid in s.index.items():
        r = s.records.get(cid)
        if r is None or r.prefix_hash != h:
            out.append(f"index {h} -> {cid}, which is not a record of hash {h}")
    return out


def one_image_per_hash(s: Snapshot) -> list[str]:
    """C6: at most one READY record per hash; a hash is never both indexed and pending."""
    out = []
    counts = Counter(r.prefix_hash for r in s.records.values() if r.phase == "READY")
    out += [f"hash {h} has {n} READY records" for h, n in counts.items() if n > 1]
    both = set(s.index) & set(s.pending)
    if both:
        out.append(f"hashes both indexed and pending: {sorted(both)}")
    return out


def pending_is_copying(s: Snapshot) -> list[str]:
    """C7: ``pending[h] == cid`` iff record cid is COPYING with hash h."""
    out = []
    copying = {r.prefix_hash: c for c, r in s.records.items() if r.phase == "COPYING"}
    for h, cid in s.pending.items():
        r = s.records.get(cid)
        if r is None or r.phase != "COPYING" or r.prefix_hash != h:
            out.append(f"pending {h} -> {cid}, which is not a COPYING record of hash {h}")
    for h, cid in copying.items():
        if s.pending.get(h) != cid:
            out.append(f"COPYING record {cid} of hash {h} is not pending")
    n_copying = sum(1 for r in s.records.values() if r.phase == "COPYING")
    if n_copying != len(copying):
        out.append("two COPYING records share a hash")
    return out


def copying_in_flight(s: Snapshot) -> list[str]:
    """C8, G11: a COPYING record is in the in-flight store list and holds no pin."""
    inflight = set(s.inflight_stores)
    return [
        f"COPYING record {c}: in flight={c in inflight}, pins={r.pin_count}"
        for c, r in s.records.items()
        if r.phase == "COPYING" and (c not in inflight or r.pin_count != 0)
    ]


def evicting_alive(s: Snapshot) -> list[str]:
    """C9: an EVICTING record is unfindable and alive only while pinned or in flight."""
    out = []
    inflight = set(s.inflight_stores)
    lru = set(s.lru)
    for c, r in s.records.items():
        if r.phase != "EVICTING":
            continue
        if s.index.get(r.prefix_hash) == c or s.pending.get(r.prefix_hash) == c or c in lru:
            out.append(f"EVICTING record {c} is still findable")
        if r.pin_count == 0 and c not in inflight:
            out.append(
                f"EVICTING record {c} has no pin and no in-flight store (should be released)"
            )
    return out


def pin_accounting(s: Snapshot) -> list[str]:
    """C10: pin_count = queued + in-flight + suspended restores + unreleased offload/lease pins."""
    expect: Counter[int] = Counter()
    for cid, _ in s.queued_restores:
        expect[cid] += 1
    for cid, _ in s.inflight_restores:
        expect[cid] += 1
    for _, cid, _ in s.suspended:
        expect[cid] += 1
    for pin in s.offload_pins.values():
        if not pin.source_released:
            expect[pin.checkpoint_id] += 1
    out = []
    for cid, r in s.records.items():
        if r.pin_count < 0:
            out.append(f"record {cid} has negative pin count {r.pin_count}")
        if r.pin_count != expect.get(cid, 0):
            out.append(f"record {cid}: pin_count {r.pin_count} but {expect.get(cid, 0)} holders")
        if r.pin_count > 0 and r.phase not in ("READY", "EVICTING"):
            out.append(f"record {cid} is {r.phase} and pinned")
    return out


def readers_reference_live_records(s: Snapshot) -> list[str]:
    """C12: every outstanding writer (in-flight store) or reader (restore, unreleased offload
    pin or lease) names a live record, so its units are not free."""
    out = []
    for cid in s.inflight_stores:
        if cid not in s.records:
            out.append(f"in-flight store of checkpoint {cid}, which was released")
    for what, cids in (
        ("queued restore", [c for c, _ in s.queued_restores]),
        ("in-flight restore", [c for c, _ in s.inflight_restores]),
        ("suspended restore", [c for _, c, _ in s.suspended]),
        (
            "offload source",
            [p.checkpoint_id for p in s.offload_pins.values() if not p.source_released],
        ),
    ):
        for cid in cids:
            if cid not in s.records:
                out.append(f"{what} of checkpoint {cid}, which was released")
    return out


def offload_ops_unique(s: Snapshot) -> list[str]:
    """C15: at most one offload or lease operation per prefix hash."""
    counts = Counter(op.prefix_hash for op in s.offload_pins)
    return [f"hash {h} has {n} offload operations" for h, n in counts.items() if n > 1]


def backlog_bound(s: Snapshot) -> list[str]:
    """C16: the nomination backlog stays within its cap; no sink, no nominations. (Offload
    ops handed out before the sink was switched off stay until their report.)"""
    out = []
    if len(s.offload_ready) > s.offload_backlog_cap:
        out.append(f"backlog {len(s.offload_ready)} > cap {s.offload_backlog_cap}")
    if not s.offload_sink and s.offload_ready:
        out.append(f"nominations without a sink: {s.offload_ready}")
    for cid in s.offload_ready:
        r = s.records.get(cid)
        if r is not None and r.phase == "COPYING":
            out.append(f"COPYING checkpoint {cid} is nominated for offload (S6)")
    return out


def forfeit_memory(s: Snapshot) -> list[str]:
    """C18, G7: a forfeited op is not a live pin; the exact memory is bounded; every exactly
    remembered forfeit lies above the watermark."""
    out = []
    live = set(s.offload_pins) & s.forfeited
    if live:
        out.append(f"forfeited ops still pinned: {sorted(live)}")
    if len(s.forfeited) > s.forfeit_bound:
        out.append(f"forfeit memory {len(s.forfeited)} > bound {s.forfeit_bound}")
    low = [op for op in s.forfeited if op.generation <= s.forfeit_watermark]
    if low:
        out.append(f"forfeits at or below the watermark {s.forfeit_watermark}: {sorted(low)}")
    return out


def identities_ahead(s: Snapshot) -> list[str]:
    """C14: every live cid is below ``next_checkpoint_id``, every op generation at most
    ``offload_generation``, every live lease id below ``next_lease_id``; the change log's
    generations strictly increase and its newest is ``generation``."""
    out = []
    for cid in s.records:
        if cid >= s.next_checkpoint_id:
            out.append(f"record {cid} >= next id {s.next_checkpoint_id}")
    for op in list(s.offload_pins) + list(s.forfeited):
        if op.generation > s.offload_generation:
            out.append(f"op {op} ahead of offload generation {s.offload_generation}")
    for lid, _, _ in s.suspended:
        if not 0 <= lid < s.next_lease_id:
            out.append(f"lease {lid} outside the issued ids [0, {s.next_lease_id})")
    gens = [g for g, _ in s.changes]
    if any(b <= a for a, b in pairwise(gens)):
        out.append(f"change log generations do not strictly increase: {gens}")
    if gens and gens[-1] != s.generation:
        out.append(f"newest change log entry {gens[-1]} is not the generation {s.generation}")
    return out


def one_restore_per_slot(s: Snapshot) -> list[str]:
    """G4: at most one queued, in-flight or suspended restore per destination slot."""
    slots = Counter(
        [d for _, d in s.queued_restores]
        + [d for _, d in s.inflight_restores]
        + [d for _, _, d in s.suspended]
    )
    return [f"slot {d} has {n} restores" for d, n in slots.items() if n > 1]


def leases_unique(s: Snapshot) -> list[str]:
    """G3: live suspended-restore leases have distinct ids."""
    ids = Counter(lid for lid, _, _ in s.suspended)
    return [f"lease {lid} appears {n} times" for lid, n in ids.items() if n > 1]


def dirty_in_pool(s: Snapshot) -> list[str]:
    """G10: dirty marks name pool units only (a dirty unit stays dirty, free or reserved,
    until the executor's scrub reports it clean)."""
    bad = {u for u in s.dirty if not 0 <= u < s.num_units}
    return [f"dirty marks outside the pool: {sorted(bad)}"] if bad else []


def coordinator_pending(s: Snapshot) -> list[str]:
    """C20: at most one pending boundary per sequence."""
    counts = Counter(k for k, _ in s.pending_boundaries)
    return [f"sequence {k!r} has {n} pending boundaries" for k, n in counts.items() if n > 1]


def scratch_disjoint(s: Snapshot) -> list[str]:
    """C21: a scratch slot is in at most one of reserved, queued and issued, and a slot in
    any of them is not free in the scratch pool."""
    queued = [slot for _, slot in s.scratch_queued]
    everything = list(s.scratch_reserved) + queued + list(s.scratch_issued)
    counts = Counter(everything)
    out = [f"scratch slot {slot} held {n} times" for slot, n in counts.items() if n > 1]
    if s.scratch_free is not None:
        both = s.scratch_free & set(everything)
        if both:
            out.append(f"scratch slots both borrowed and free: {sorted(both)}")
    return out


def slot_lenders_exclusive(s: Snapshot) -> list[str]:
    """C25: a slot is one buffer whoever lends it: no slot is both a restore's destination
    (queued, in flight or suspended) and a scratch slot held (reserved, queued or issued)."""
    restored = {slot for _, slot in s.queued_restores}
    restored |= {slot for _, slot in s.inflight_restores}
    restored |= {slot for _, _, slot in s.suspended}
    scratch = set(s.scratch_reserved) | {slot for _, slot in s.scratch_queued}
    scratch |= set(s.scratch_issued)
    both = restored & scratch
    return [f"slots both restore destinations and lent as scratch: {sorted(both)}"] if both else []


def settled_accounting(s: Snapshot) -> list[str]:
    """C26: a record whose store is in flight (COPYING, or EVICTING since it was unindexed
    or cleared in flight) is unsettled and listed by no completion; any other READY or
    EVICTING record is unsettled exactly when an outstanding completion lists it; no record
    is listed twice."""
    out = []
    listed = [cid for group in s.completions for cid in group]
    counts = Counter(listed)
    out += [f"checkpoint {c} is listed by {n} completions" for c, n in counts.items() if n > 1]
    inflight = set(s.inflight_stores)
    for cid, r in s.records.items():
        if r.phase == "COPYING" or (r.phase == "EVICTING" and cid in inflight):
            if r.settled or cid in counts:
                out.append(f"{r.phase} record {cid} in flight is settled or listed")
        elif r.settled == (cid in counts):
            state = "settled" if r.settled else "unsettled"
            where = "listed" if cid in counts else "not listed"
            out.append(f"{r.phase} record {cid} is {state} but {where} by a completion")
    if any(not group for group in s.completions):
        out.append("an outstanding completion lists no checkpoint")
    return out


def host_readers_settled(s: Snapshot) -> list[str]:
    """C27: every offload store or lease operation reads a settled image (its copy known
    done): a host or other-stream reader never reads an image whose copy may be running."""
    out = []
    for op, pin in s.offload_pins.items():
        r = s.records.get(pin.checkpoint_id)
        if r is not None and not r.settled:
            out.append(f"operation {op} reads checkpoint {pin.checkpoint_id}, not settled")
    return out


def forwards_known(s: Snapshot) -> list[str]:
    """C28: forward ids name pending boundaries and queued scratch stores that exist, and
    a queued restore has at most one owner."""
    out = []
    pending = {k for k, _ in s.pending_boundaries}
    out += [
        f"a forward is filed for sequence {k!r}, which has no pending boundary"
        for k, _ in s.boundary_forwards
        if k not in pending
    ]
    queued = {slot for _, slot in s.scratch_queued}
    out += [
        f"a forward is filed for scratch slot {slot}, which has no queued store"
        for slot, _ in s.scratch_forwards
        if slot not in queued
    ]
    restore_slots = {slot for _, slot in s.queued_restores}
    slots = [slot for _, slot in s.restore_owners]
    out += [
        f"an owner is filed for slot {slot}, which has no queued restore"
        for slot in slots
        if slot not in restore_slots
    ]
    counts = Counter(slots)
    out += [f"slot {slot} has {n} restore owners" for slot, n in counts.items() if n > 1]
    return out


def counters_non_negative(s: Snapshot) -> list[str]:
    """Counters never go below zero."""
    names = (
        "generation",
        "evictions",
        "offload_pins_reclaimed",
        "offload_nominations_dropped",
        "checkpoints_kept",
        "checkpoints_dropped",
        "checkpoints_orphaned",
    )
    return [f"{n} is negative" for n in names if getattr(s, n) < 0]


INVARIANTS: Mapping[str, Invariant] = {
    "unit_conservation": unit_conservation,
    "tag_bijection": tag_bijection,
    "fixed_size": fixed_size,
    "ready_set_equality": ready_set_equality,
    "one_image_per_hash": one_image_per_hash,
    "pending_is_copying": pending_is_copying,
    "copying_in_flight": copying_in_flight,
    "evicting_alive": evicting_alive,
    "pin_accounting": pin_accounting,
    "readers_reference_live_records": readers_reference_live_records,
    "offload_ops_unique": offload_ops_unique,
    "backlog_bound": backlog_bound,
    "forfeit_memory": forfeit_memory,
    "identities_ahead": identities_ahead,
    "one_restore_per_slot": one_restore_per_slot,
    "leases_unique": leases_unique,
    "dirty_in_pool": dirty_in_pool,
    "coordinator_pending": coordinator_pending,
    "scratch_disjoint": scratch_disjoint,
    "slot_lenders_exclusive": slot_lenders_exclusive,
    "settled_accounting": settled_accounting,
    "host_readers_settled": host_readers_settled,
    "forwards_known": forwards_known,
    "counters_non_negative": counters_non_negative,
}


# --- step invariants: a call's before and after ----------------------------------------


def monotone_identities(a: Snapshot, b: Snapshot) -> list[str]:
    """C14: ids, generations and counters never go back; new records take fresh ids."""
    out = []
    for name in (
        "next_checkpoint_id",
        "next_lease_id",
        "offload_generation",
        "generation",
        "evictions",
        "offload_pins_reclaimed",
        "offload_nominations_dropped",
        "forfeit_watermark",
        "checkpoints_kept",
        "checkpoints_dropped",
        "checkpoints_orphaned",
    ):
        if getattr(b, name) < getattr(a, name):
            out.append(f"{name} went back from {getattr(a, name)} to {getattr(b, name)}")
    for cid in set(b.records) - set(a.records):
        if cid < a.next_checkpoint_id:
            out.append(f"record {cid} reuses an id below {a.next_checkpoint_id}")
    return out


def visibility(a: Snapshot, b: Snapshot) -> list[str]:
    """C13: a record becomes READY only from COPYING (its store rode a batch) or by adopting
    units that a transfer reservation held before the call."""
    out = []
    for cid, r in b.records.items():
        if r.phase != "READY":
            continue
        before = a.records.get(cid)
        if before is None:
            held = {u for owner, units in a.transfers.items() for u in units}
            if not set(r.unit_ids) <= held:
                out.append(f"record {cid} appeared READY without a completed store or transfer")
        elif before.phase not in ("READY", "COPYING"):
            out.append(f"record {cid} went from {before.phase} to READY")
    return out


def pinned_survive(a: Snapshot, b: Snapshot) -> list[str]:
    """C11, C12: a pinned or in-flight record is never released by a call that did not drop
    its holders; in particular a pinned READY record is never released in one call."""
    out = []
    for cid, r in a.records.items():
        if cid in b.records:
            continue
        if r.phase == "READY" and r.pin_count > 0:
            out.append(f"pinned READY record {cid} (pins {r.pin_count}) was released")
        if r.phase == "COPYING" and cid in b.inflight_stores:
            out.append(f"record {cid} was released while its store is still in flight")
    return out


def change_log_exact(a: Snapshot, b: Snapshot) -> list[str]:
    """G6: the generation moves iff the READY set changed."""
    changed = a.ready_pairs() != b.ready_pairs()
    moved = b.generation != a.generation
    if changed and not moved:
        return ["the READY set changed but the generation did not move"]
    if moved and not changed:
        # G6: every bump is a real change; a clear of an empty READY set does not bump.
        return [f"generation moved {a.generation} -> {b.generation} with no READY-set change"]
    return []


def dirty_marking(a: Snapshot, b: Snapshot) -> list[str]:
    """G10: units that left a checkpoint or a transfer reservation for the free list are dirty."""
    out = []
    for unit, (owner, _) in a.tags.items():
        if (
            unit in b.free
            and isinstance(owner, tuple)
            and owner
            and owner[0]
            in (
                CHECKPOINT_OWNER,
                TRANSFER_OWNER,
            )
        ):
            if unit not in b.dirty:
                out.append(f"unit {unit} left {owner!r} for the free list but is not dirty")
    return out


def nominations_accounted(a: Snapshot, b: Snapshot) -> list[str]:
    """SPEC B.4: a nomination leaves the backlog only by being handed out (a new offload op
    for its record), as a spent entry (its record is no longer READY), by overflow
    (counted), or because the sink is off after the call (C16: no sink, no nominations;
    switching it off drops the whole backlog, which :func:`backlog_bound` checks). A
    deferred nomination is never lost while the sink stays on."""
    left = Counter(a.offload_ready) - Counter(b.offload_ready)
    if not left or not b.offload_sink:
        return []
    handed = Counter(
        p.checkpoint_id for op, p in b.offload_pins.items() if op not in a.offload_pins
    )
    overflow = b.offload_nominations_dropped - a.offload_nominations_dropped
    out = []
    for cid, n in left.items():
        rec = a.records.get(cid)
        spent = (
            rec is None
            or rec.phase != "READY"
            or b.records.get(cid) is None
            or (b.records[cid].phase != "READY")
        )
        if spent:
            continue
        n -= handed.get(cid, 0)
        take = min(n, overflow)
        n -= take
        overflow -= take
        if n > 0:
            out.append(f"nomination of READY checkpoint {cid} vanished from the backlog")
    return out


STEP_INVARIANTS: Mapping[str, StepInvariant] = {
    "nominations_accounted": nominations_accounted,
    "monotone_identities": monotone_identities,
    "visibility": visibility,
    "pinned_survive": pinned_survive,
    "change_log_exact": change_log_exact,
    "dirty_marking": dirty_marking,
}


def check_invariants(s: Snapshot) -> list[tuple[str, str]]:
    """Every state invariant on ``s``: ``[(invariant name, problem)]``, empty when all hold."""
    return [(name, p) for name, inv in INVARIANTS.items() for p in inv(s)]


def check_step_invariants(a: Snapshot, b: Snapshot) -> list[tuple[str, str]]:
    """Every step invariant on a call that took ``a`` to ``b``."""
    return [(name, p) for name, inv in STEP_INVARIANTS.items() for p in inv(a, b)]
