"""A second, fresh set of semantic bugs planted in the production store (``pagedstate.impl``),
to measure the conformance kit's strength on bugs it was never tuned on (issue 20: "Show the
gain on your own fresh set of planted bugs, kept out of the tests that tune the kit").

Written 2026-12-04, after the kit was tuned on :mod:`bugs` (the first set), by reading only
``impl/*.py``, ``spec/*.py`` and ``docs/spec.md`` (not the kit, ``engines/conformance/``), the
way an engine integrator would ship them: one-line edits (a wrong comparison, an update
left out on one path, a shallow copy, iterating the wrong end). None is one of the 20 bugs of
:mod:`bugs`, the 18 reference mutants (``pagedstate.models.mutants``), the 21 + 3 production
plants of ``docs/conformance.md`` or a plant of ``tests/``. **This set is kept out of every
test and out of the kit's tuning**: no test imports it, and a kit change made because one
of these is missed makes the set spent (write a fresh one to measure again).

The format is :mod:`bugs`'s (:class:`~bugs.Bug`; ``run.py --set fresh`` plants them with
:func:`bugs.plant`). ``SCENARIOS`` holds a short hand-written scenario for *every* bug: it
drives the reference and the production coordinator through the same calls and returns what
differs; ``run.py --set fresh --scenarios`` runs each with the plant (a difference must show)
and without it (none may), so every plant is shown to be observable through the public API.
"""

from __future__ import annotations

from collections.abc import Callable

from bugs import _SEQ0, Bug, _Pair, _Seq, check, plant

__all__ = ["BUGS", "SCENARIOS", "by_name", "check", "plant"]

_STORE = "pagedstate.impl.store"
_RESTORES = "pagedstate.impl._store_restores"
_OFFLOAD = "pagedstate.impl._store_offload"
_COMPLETIONS = "pagedstate.impl._store_completions"
_VIEWS = "pagedstate.impl._store_views"
_COORD = "pagedstate.impl.coordinator"
_DRAIN = "pagedstate.impl._coordinator_drain"
_SCRATCH = "pagedstate.impl._coordinator_scratch"
_POOL = "pagedstate.impl.pool"

BUGS: tuple[Bug, ...] = (
    # -- orderings ------------------------------------------------------------------------
    Bug(
        "victim_heap_trusts_stale_stamp",
        _STORE,
        "PageUnitCheckpointStore._next_victim",
        "            or rec.stamp != stamp\n",
        "",
        "ordering (LRU victim order)",
        "The victim heap takes an entry whose stamp is not the record's current one (the"
        " record was re-stamped by a restore since), so a record restored and unpinned is"
        " evicted by its old place in the LRU instead of the oldest one: SPEC B.1 / B.3"
        " rows 4 and 12 (a restore moves the record to the hot end; eviction takes the"
        " LRU's cold end).",
    ),
    Bug(
        "restore_leaves_lru_place",
        _RESTORES,
        "_Restores.begin_restore",
        "    self._lru.move_to_end(cid)\n",
        "",
        "ordering (LRU order)",
        "begin_restore re-stamps the record but leaves it where it was in the LRU, so the"
        " LRU no longer lists the READY records oldest first: SPEC B.3 row 4 (the record"
        " moves to the hot end of the LRU) and B.1 (_lru in recency order).",
    ),
    Bug(
        "offload_take_newest_first",
        _OFFLOAD,
        "_Offload.take_offload_stores",
        "cid = ready.popleft()",
        "cid = ready.pop()",
        "ordering (nomination order)",
        "take_offload_stores hands out the newest nomination first instead of the oldest:"
        " SPEC B.3 row 15 (takes the oldest nomination).",
    ),
    Bug(
        "drain_walks_boundaries_newest_first",
        _DRAIN,
        "_Drain._drain",
        "for key, (seq, h) in list(pending.items()):",
        "for key, (seq, h) in reversed(list(pending.items())):",
        "ordering (drain order)",
        "The drain begins the pending boundary stores newest first, so the ops (and the"
        " units each image gets) come out in the reverse of filing order: SPEC D.1 step 6"
        " (begin the pending boundary stores in filing order).",
    ),
    Bug(
        "reclaim_cutoff_exclusive",
        _OFFLOAD,
        "_Offload.reclaim_stale_offload_pins",
        "if not pins[op].pinned_at <= now - timeout_s:",
        "if not pins[op].pinned_at < now - timeout_s:",
        "reclaim order / cutoff",
        "On the in-order path the reclaimer stops at an operation pinned exactly at"
        " now - timeout_s instead of retiring it: SPEC B.3 row 21 (every reclaimable"
        " operation pinned at or before now - timeout_s is retired).",
    ),
    # -- indexes and counters kept beside the tables --------------------------------------
    Bug(
        "completion_keeps_inflight_slots",
        _COMPLETIONS,
        "_Completions.complete_inflight",
        "        self._inflight_slots = set()\n",
        "        pass\n",
        "stale index (in-flight restore slots)",
        "The completion releases the in-flight restores but not their slots, so each slot"
        " a restore ever wrote stays busy and the next restore into it is refused: SPEC B.3"
        " row 3 and G4 (a slot is busy only while a restore is queued, in flight or"
        " suspended into it).",
    ),
    Bug(
        "retire_keeps_op_hash",
        _OFFLOAD,
        "_Offload._retire_op",
        "    self._op_hashes.remove(op.prefix_hash)\n",
        "",
        "stale index (hashes with an operation)",
        "Retiring an offload operation or lease leaves its hash marked as having an"
        " operation, so that image can never be leased or offloaded again: SPEC B.3 rows"
        " 15, 16 and 19 (at most one operation per hash, until its terminal report).",
    ),
    Bug(
        "fast_evict_skips_change_log",
        _STORE,
        "PageUnitCheckpointStore._begin_fast",
        "            changes.append((self.generation, h))\n",
        "",
        "stale index (change log)",
        "An LRU eviction made by a store's fast path bumps the generation but logs no"
        " change, so changed_since misses the evicted hash: SPEC B.3 rows 12 and 23, G6"
        " (every READY-state change is in the log).",
    ),
    Bug(
        "unindex_orphan_skips_lone_record",
        _COORD,
        "PagedStateCheckpointCoordinator.unindex",
        "if seqs or scratch or removed:",
        "if seqs or scratch:",
        "stale counter (orphan count)",
        "unindex counts an orphan only when it dropped a pending boundary or a queued"
        " scratch store, not when it unindexed the store's record alone: SPEC D.1 step 9"
        " (if it removed anything, checkpoints_orphaned grows by one).",
    ),
    Bug(
        "unindex_keeps_pending_key_of_seq",
        _COORD,
        "PagedStateCheckpointCoordinator.unindex",
        "            del self._pending_of_seq[sid]\n",
        "",
        "stale index (pending key per sequence)",
        "unindex drops a sequence's pending boundary but not the sequence's entry in the"
        " per-sequence index, so the sequence's next boundary tries to supersede one that is"
        " gone: SPEC G5 (an unindexed prefix drops its boundaries) and G1 (at most one"
        " pending boundary per sequence, superseding only a live one).",
    ),
    # -- clone fidelity -------------------------------------------------------------------
    Bug(
        "store_clone_shares_offload_pins",
        _VIEWS,
        "_Views.clone",
        "c._offload_pins = {k: p.copy() for k, p in self._offload_pins.items()}",
        "c._offload_pins = dict(self._offload_pins)",
        "clone fidelity",
        "store.clone() copies the offload operation map but shares its pin entries, so a"
        " phase-1 report on one copy marks the source released on the other: the clone"
        " contract (a deep copy sharing nothing mutable), and SPEC B.3 rows 18-19 on the"
        " copy that got no report (its settle then keeps the record pinned).",
    ),
    Bug(
        "coordinator_clone_shares_transfers",
        _COORD,
        "PagedStateCheckpointCoordinator.clone",
        "c._transfer_units = dict(self._transfer_units)",
        "c._transfer_units = self._transfer_units",
        "clone fidelity",
        "coordinator.clone() shares the transfer reservations with the original, so"
        " releasing or adopting a reservation on one copy forgets it on the other: the"
        " clone contract, and SPEC D.12 (the reservation is RESERVED until its own release or"
        " adoption) on the copy that did nothing.",
    ),
    Bug(
        "pool_clone_shares_reservation_handles",
        _POOL,
        "UnitPool.clone",
        "c._who = dict(self._who)",
        "c._who = self._who",
        "clone fidelity",
        "UnitPool.clone() shares the map from reservation handles to owners, so a release"
        " on one copy frees the units of the other (and both hand out the same handles):"
        " the clone contract, and SPEC A.2 / G9 on the copy that released nothing.",
    ),
    # -- offload accounting ---------------------------------------------------------------
    Bug(
        "reclaim_forfeits_released_source",
        _OFFLOAD,
        "_Offload.reclaim_stale_offload_pins",
        '            self._unpin(pin.checkpoint_id, "offload")\n'
        "            self._remember_forfeit(op)\n",
        '            self._unpin(pin.checkpoint_id, "offload")\n'
        "        self._remember_forfeit(op)\n",
        "offload accounting (forfeits)",
        "The reclaimer remembers every operation it retires as forfeited, a SOURCE_RELEASED"
        " one too, so was_reclaimed answers True for an operation whose bytes were read in"
        " time: SPEC B.3 row 21 and F.44 (a released source then reclaimed is not"
        " forfeited), G7.",
    ),
    Bug(
        "sink_off_keeps_backlog",
        _COORD,
        "PagedStateCheckpointCoordinator.attach_offload",
        "self.store.offload_sink = index is not None and bool(sink)",
        "self.store._offload_sink = index is not None and bool(sink)",
        "offload accounting (backlog)",
        "attach_offload sets the store's sink flag directly instead of through its setter,"
        " so switching the sink off keeps the nomination backlog: SPEC B.3 row 20 and C.16"
        " (switching the sink off drops the backlog; no sink, no nominations).",
    ),
    # -- adoption / transfer races --------------------------------------------------------
    Bug(
        "duplicate_adoption_keeps_reservation",
        _COORD,
        "PagedStateCheckpointCoordinator.adopt_transfer_units",
        "    del self._transfer_units[owner]\n",
        "    if adopted:\n        del self._transfer_units[owner]\n",
        "adoption race",
        "An adoption refused because the hash is READY or pending releases the units but"
        " keeps the reservation entry, so the coordinator still names units it no longer"
        " holds (a later release raises): SPEC B.3 row 13 and D.12 step 3 (adopting a READY"
        " or pending hash frees the units; the entry is dropped once adoption returned).",
    ),
    Bug(
        "transfer_reserve_never_evicts",
        _COORD,
        "PagedStateCheckpointCoordinator.reserve_transfer_units",
        "if not store.ensure_free_units(u):",
        "if not store.has_available_units(u):",
        "transfer reservation",
        "reserve_transfer_units asks whether room could be made instead of making it, so"
        " with the pool full of unpinned READY images the reservation fails: SPEC D.12 step 1"
        " (None only when ensure_free_units(U) cannot make room: it may evict unpinned"
        " READY images) and B.3 row 14.",
    ),
    Bug(
        "adopted_image_unsettled",
        _OFFLOAD,
        "_Offload.adopt_units",
        "rec = _Record(prefix_hash, unit_runs(unit_ids), T.ABSENT)",
        "rec = _Record(prefix_hash, unit_runs(unit_ids), T.ABSENT, settled=False)",
        "adoption / completion tokens (D.13)",
        "An adopted image is filed unsettled, with no completion token listing it, so no"
        " settle ever settles it and no host reader can lease it: SPEC B.3 row 13 and D.13"
        " (an adopted image is settled at once: the receiver waited for its transfer).",
    ),
    # -- completion tokens (SPEC D.13) ----------------------------------------------------
    Bug(
        "done_token_still_listed",
        _COMPLETIONS,
        "_Completions.complete_inflight",
        "done = True if completion is None else bool(completion.query())",
        "done = completion is None",
        "completion tokens (D.13)",
        "A completion whose token already reports done leaves its images unsettled and the"
        " token outstanding until the next settle: SPEC D.13 / B.3 row 2 (the new token is"
        " queried; when done, the published images are settled at once).",
    ),
    Bug(
        "offload_take_skips_settle",
        _OFFLOAD,
        "_Offload.take_offload_stores",
        "        self._settle(answers)\n",
        "        pass\n",
        "completion tokens (D.13)",
        "take_offload_stores polls the tokens but does not settle the images of those done,"
        " so a nominee whose batch finished is deferred instead of handed out: SPEC B.3"
        " row 15 (settles first, row 24) and D.13.",
    ),
    # -- midstep scratch ------------------------------------------------------------------
    Bug(
        "scratch_lends_inflight_restore_slot",
        _SCRATCH,
        "_Scratch.reserve_midstep",
        "if store._slot_busy(slot):",
        "if store.restore_queued_for(slot):",
        "midstep scratch (G12)",
        "reserve_midstep refuses a scratch slot only when a restore is queued into it, not"
        " when one is in flight or suspended, so a restore's slot is lent as scratch: SPEC"
        " G12 (a slot is one buffer whoever lends it; queued, in-flight or suspended).",
    ),
    Bug(
        "scratch_budget_ignores_restores",
        _DRAIN,
        "_Drain._drain",
        "self._max_ops_per_batch - len(self._store_ops) - len(store._queued_restores),",
        "self._max_ops_per_batch - len(self._store_ops),",
        "midstep scratch (budget)",
        "The scratch budget of a drain leaves out the queued restores, so a batch with"
        " restores issues more copy ops than max_ops_per_batch: SPEC D.1 step 6.3 (the"
        " budget is max_ops_per_batch - boundary stores - queued restores).",
    ),
    Bug(
        "reserve_midstep_requeues_queued_hash",
        _SCRATCH,
        "_Scratch.reserve_midstep",
        "if h in queued or store.contains_or_pending(h):",
        "if store.contains_or_pending(h):",
        "midstep scratch",
        "reserve_midstep lends a scratch slot for a hash that already has a scratch store"
        " queued, so one hash takes two slots: SPEC D.1 step 4 (hashes already queued,"
        " READY or pending are skipped).",
    ),
    # -- overlap forwards (SPEC D.13) -----------------------------------------------------
    Bug(
        "scratch_waits_past_its_forward",
        _SCRATCH,
        "_Scratch._take_scratch_stores",
        "if f is not None and (prev is None or f > prev):",
        "if f is not None and (prev is None or f >= prev):",
        "overlap forwards (D.13)",
        "A scratch store published for forward F still waits at the drain right after"
        " forward F (prev == F), one drain too long: SPEC D.13 / D.1 step 6.3 (issued when"
        " F <= prev).",
    ),
    Bug(
        "stored_boundary_keeps_its_forward",
        _DRAIN,
        "_Drain._drain",
        "                del forwards[key]\n",
        "",
        "overlap forwards (D.13) / stale index",
        "A boundary stored for its forward leaves its forward id behind, so the same"
        " sequence filing the same hash again without a forward is taken for a boundary"
        " of that old forward (and dropped): SPEC D.13 (a boundary filed without forward="
        " is stored at the next drain).",
    ),
    Bug(
        "boundary_of_latest_forward_refused",
        _DRAIN,
        "_Drain.checkpoint",
        "if fwd is not None and last is not None and fwd < last:",
        "if fwd is not None and last is not None and fwd <= last:",
        "overlap forwards (D.13)",
        "checkpoint(..., forward=F) raises StaleBoundaryError for F == last_forward, a"
        " boundary of the forward the latest drain was for: SPEC D.13 (only F <"
        " last_forward is stale).",
    ),
)


def by_name(name: str) -> Bug:
    """The bug of this set called ``name``."""
    for bug in BUGS:
        if bug.name == name:
            return bug
    raise KeyError(f"no fresh planted bug {name!r}; known: {', '.join(b.name for b in BUGS)}")


# -- hand-written scenarios -----------------------------------------------------------------
#
# One per bug: the same calls on the reference model and the production coordinator of this
# process (planted or not), returning what differs (empty: nothing). Units: 8 in the pool,
# 2 per image (so four READY images fill it).


def _fill(p: _Pair) -> None:
    """Four images (hashes 1-4, checkpoint ids 0-3), one batch: the pool is full."""
    p.store([_Seq(0), _Seq(1), _Seq(2), _Seq(3)], [1, 2, 3, 4])


def _sc_victim_stale_stamp() -> list[str]:
    """Four images; the oldest restored (re-stamped, pinned, then unpinned); a fifth store
    evicts the LRU's cold end, the second image."""
    p = _Pair()
    _fill(p)
    p.both("begin_restore(1, 0)", lambda c, _k: c.begin_restore(1, 0))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    p.both("complete_previous_batch()", lambda c, _k: c.complete_previous_batch())
    p.store([_Seq(4)], [5])
    p.both("contains(1)", lambda c, _k: c.contains(1))
    return p.diff


def _sc_restore_lru() -> list[str]:
    """Two images; a restore of the older one moves it to the LRU's hot end."""
    p = _Pair()
    p.store([_Seq(0), _Seq(1)], [1, 2])
    p.both("begin_restore(1, 0)", lambda c, _k: c.begin_restore(1, 0))
    return p.diff


def _sc_offload_oldest() -> list[str]:
    """Two nominations; a take of one hands out the older."""
    p = _Pair(offload=True)
    p.store([_Seq(0), _Seq(1)], [1, 2])
    p.both("take_offload_stores(1)", lambda c, _k: c.take_offload_stores(1))
    return p.diff


def _sc_drain_order() -> list[str]:
    """Two boundaries filed in order: the drain begins them in that order."""
    p = _Pair()
    a, b = _Seq(0), _Seq(1)
    p.both("checkpoint(a, 1)", lambda c, _k: c.checkpoint(a, 1, 1))
    p.both("checkpoint(b, 2)", lambda c, _k: c.checkpoint(b, 1, 2))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    return p.diff


def _sc_reclaim_cutoff() -> list[str]:
    """An offload store pinned at 1000, reclaimed at 1010 with a 10 s timeout: retired."""
    p = _Pair(offload=True)
    p.store([_Seq(0)], [1])
    p.both("take_offload_stores(4)", lambda c, _k: c.take_offload_stores(4))
    p.clock.now = 1010.0
    p.both("reclaim_stale_offload_pins(10)", lambda c, _k: c.reclaim_stale_offload_pins(10.0))
    return p.diff


def _sc_inflight_slots() -> list[str]:
    """A restore into slot 0 taken and completed; another restore into slot 0 is fine."""
    p = _Pair()
    p.store([_Seq(0)], [1])
    p.both("begin_restore(1, 0)", lambda c, _k: c.begin_restore(1, 0))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    p.both("complete_previous_batch()", lambda c, _k: c.complete_previous_batch())
    p.both("begin_restore(1, 0) again", lambda c, _k: c.begin_restore(1, 0))
    return p.diff


def _sc_op_hash() -> list[str]:
    """A lease settled (retired); the same image leased again."""
    p = _Pair(offload=True)
    p.store([_Seq(0)], [1])
    ops = p.both("acquire(1)", lambda c, _k: c.acquire_checkpoint_source(1))
    p.both("settle_offload_store(op)", lambda c, k: c.settle_offload_store(ops[k][0]))
    p.both("acquire(1) again", lambda c, _k: c.acquire_checkpoint_source(1))
    return p.diff


def _sc_change_log() -> list[str]:
    """A full pool; a fifth store evicts the oldest image: changed_since names it."""
    p = _Pair()
    _fill(p)
    gens = p.both("snapshot().generation", lambda c, _k: c.snapshot().generation)
    p.store([_Seq(4)], [5])
    p.both("changed_since(g)", lambda c, k: c.store.changed_since(gens[k]))
    return p.diff


def _sc_orphan_count() -> list[str]:
    """An image unindexed with no boundary or scratch store of its hash: one orphan."""
    p = _Pair()
    p.store([_Seq(0)], [1])
    p.both("unindex(1)", lambda c, _k: c.unindex(1))
    p.both("checkpoint_fates()", lambda c, _k: c.checkpoint_fates())
    return p.diff


def _sc_pending_of_seq() -> list[str]:
    """A boundary dropped by unindex; the sequence files another boundary."""
    p = _Pair()
    a = _Seq(0)
    p.both("checkpoint(a, 3)", lambda c, _k: c.checkpoint(a, 1, 3))
    p.both("unindex(3)", lambda c, _k: c.unindex(3))
    p.both("checkpoint(a, 4)", lambda c, _k: c.checkpoint(a, 1, 4))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    return p.diff


def _sc_clone_pins() -> list[str]:
    """An offload store handed out; its phase-1 report on a clone of the store only: the
    original's pin is untouched."""
    p = _Pair(offload=True)
    p.store([_Seq(0)], [1])
    ops = p.both("take_offload_stores(4)", lambda c, _k: c.take_offload_stores(4))
    for k, c in enumerate(p.sides):
        c.store.clone().release_offload_store_source(ops[k][0][0])  # on the clone only
    p.both("settle_offload_store(op)", lambda c, k: c.settle_offload_store(ops[k][0][0]))
    return p.diff


def _sc_clone_transfers() -> list[str]:
    """A transfer reservation released on a clone of the coordinator only: the original
    still holds it."""
    p = _Pair()
    p.both("reserve_transfer_units(o)", lambda c, _k: c.reserve_transfer_units(("load", 0)))
    for c in p.sides:
        c.clone().release_transfer_units(("load", 0))  # on the clone only
    p.both("release_transfer_units(o)", lambda c, _k: c.release_transfer_units(("load", 0)))
    return p.diff


def _sc_clone_handles() -> list[str]:
    """An image unindexed (released) on a clone of the coordinator only: the original's
    image keeps its units."""
    p = _Pair()
    p.store([_Seq(0)], [1])
    for c in p.sides:
        c.clone().unindex(1)  # on the clone only
    p.both("pool.owner_of(0)", lambda c, _k: c.pool.owner_of(0))
    return p.diff


def _sc_forfeit_released() -> list[str]:
    """An offload store's source released (phase 1), then reclaimed: not forfeited."""
    p = _Pair(offload=True)
    p.store([_Seq(0)], [1])
    ops = p.both("take_offload_stores(4)", lambda c, _k: c.take_offload_stores(4))
    p.both(
        "release_offload_store_source(op)",
        lambda c, k: c.release_offload_store_source(ops[k][0][0]),
    )
    p.clock.now += 100.0
    p.both("reclaim_stale_offload_pins(10)", lambda c, _k: c.reclaim_stale_offload_pins(10.0))
    p.both("was_reclaimed(op)", lambda c, k: c.was_reclaimed(ops[k][0][0]))
    return p.diff


def _sc_sink_off() -> list[str]:
    """A nomination waiting; the tier detached (sink off): the backlog is dropped."""
    p = _Pair(offload=True)
    p.store([_Seq(0)], [1])
    p.both("attach_offload(None)", lambda c, _k: c.attach_offload(None))
    return p.diff


def _sc_duplicate_adoption() -> list[str]:
    """A transfer adopted under a READY hash: refused, and the reservation is gone."""
    p = _Pair()
    p.store([_Seq(0)], [1])
    p.both("reserve_transfer_units(o)", lambda c, _k: c.reserve_transfer_units(("load", 0)))
    p.both("adopt_transfer_units(o, 1)", lambda c, _k: c.adopt_transfer_units(("load", 0), 1))
    p.both("release_transfer_units(o)", lambda c, _k: c.release_transfer_units(("load", 0)))
    return p.diff


def _sc_reserve_evicts() -> list[str]:
    """A full pool of unpinned images: a transfer reservation evicts the oldest."""
    p = _Pair()
    _fill(p)
    p.both("reserve_transfer_units(o)", lambda c, _k: c.reserve_transfer_units(("load", 0)))
    return p.diff


def _sc_adopted_settled() -> list[str]:
    """An adopted image is settled: a lease of it is granted."""
    p = _Pair(offload=True)
    p.both("reserve_transfer_units(o)", lambda c, _k: c.reserve_transfer_units(("load", 0)))
    p.both("adopt_transfer_units(o, 3)", lambda c, _k: c.adopt_transfer_units(("load", 0), 3))
    p.both("acquire(3)", lambda c, _k: c.acquire_checkpoint_source(3))
    return p.diff


def _sc_done_token() -> list[str]:
    """A completion whose token is already done: its image is settled at once."""
    from pagedstate.spec import ManualCompletion

    p = _Pair()
    p.both("checkpoint(1)", lambda c, _k: c.checkpoint(_SEQ0, 1, 1))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    toks = [ManualCompletion(done=True), ManualCompletion(done=True)]
    p.both(
        "complete_previous_batch(done token)",
        lambda c, k: c.complete_previous_batch(completion=toks[k]),
    )
    return p.diff


def _sc_take_settles() -> list[str]:
    """A nominee whose batch's token has since reported done: the take settles it and
    hands it out."""
    from pagedstate.spec import ManualCompletion

    p = _Pair(offload=True)
    p.both("checkpoint(1)", lambda c, _k: c.checkpoint(_SEQ0, 1, 1))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    toks = [ManualCompletion(), ManualCompletion()]
    p.both(
        "complete_previous_batch(token)",
        lambda c, k: c.complete_previous_batch(completion=toks[k]),
    )
    for t in toks:
        t.set()
    p.both("take_offload_stores(4)", lambda c, _k: c.take_offload_stores(4))
    return p.diff


def _sc_scratch_inflight_slot() -> list[str]:
    """A restore into slot 6 (a scratch pool slot) in flight: reserve_midstep, which the
    scratch pool answers with slot 6, is refused (G12)."""
    p = _Pair(midstep=True)
    p.store([_Seq(0)], [1])
    p.both("begin_restore(1, 6)", lambda c, _k: c.begin_restore(1, 6))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    s = _Seq(1)
    p.both("reserve_midstep", lambda c, _k: c.reserve_midstep(s, [(1, 5)]))
    return p.diff


def _sc_scratch_budget() -> list[str]:
    """A budget of 2, one restore queued, two scratch stores published: the drain issues
    one scratch store."""
    p = _Pair(midstep=True)
    p.store([_Seq(0)], [1])
    s = _Seq(1)
    res = p.both("reserve_midstep", lambda c, _k: c.reserve_midstep(s, [(1, 5), (2, 6)]))
    p.both("publish_midstep", lambda c, k: c.publish_midstep(res[k]))
    p.both("begin_restore(1, 3)", lambda c, _k: c.begin_restore(1, 3))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    return p.diff


def _sc_scratch_queued_hash() -> list[str]:
    """A scratch store of hash 5 queued; another sequence's reservation of hash 5 is
    skipped."""
    p = _Pair(midstep=True)
    s0, s1 = _Seq(0), _Seq(1)
    res = p.both("reserve_midstep(s0)", lambda c, _k: c.reserve_midstep(s0, [(1, 5)]))
    p.both("publish_midstep", lambda c, k: c.publish_midstep(res[k]))
    p.both("reserve_midstep(s1)", lambda c, _k: c.reserve_midstep(s1, [(1, 5)]))
    return p.diff


def _sc_scratch_forward() -> list[str]:
    """A drain for forward 0; a scratch store published for forward 0: the next drain
    (prev == 0) issues it."""
    p = _Pair(midstep=True)
    s = _Seq(0)
    p.both("take_checkpoint_ops(forward=0)", lambda c, _k: c.take_checkpoint_ops(forward=0))
    res = p.both("reserve_midstep", lambda c, _k: c.reserve_midstep(s, [(1, 5)]))
    p.both("publish_midstep(forward=0)", lambda c, k: c.publish_midstep(res[k], forward=0))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    return p.diff


def _sc_boundary_forward_left() -> list[str]:
    """A boundary filed for forward 0 is stored at the drain after forward 0; the sequence
    then files the same hash without a forward: no forward is remembered for it."""
    p = _Pair()
    a = _Seq(0)
    p.both("checkpoint(a, 3, forward=0)", lambda c, _k: c.checkpoint(a, 1, 3, forward=0))
    p.both("take_checkpoint_ops() (forward 0)", lambda c, _k: c.take_checkpoint_ops())
    p.both("take_checkpoint_ops() (forward 1)", lambda c, _k: c.take_checkpoint_ops())
    p.both("complete_previous_batch()", lambda c, _k: c.complete_previous_batch())
    p.both("unindex(3)", lambda c, _k: c.unindex(3))
    p.both("checkpoint(a, 3)", lambda c, _k: c.checkpoint(a, 1, 3))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    return p.diff


def _sc_latest_forward() -> list[str]:
    """A drain for forward 0; a boundary naming forward 0 is accepted (only an older one is
    stale), and stored at the next drain."""
    p = _Pair()
    a = _Seq(0)
    p.both("take_checkpoint_ops(forward=0)", lambda c, _k: c.take_checkpoint_ops(forward=0))
    p.both("checkpoint(a, 3, forward=0)", lambda c, _k: c.checkpoint(a, 1, 3, forward=0))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    return p.diff


#: bug name -> scenario (every bug of the set).
SCENARIOS: dict[str, Callable[[], list[str]]] = {
    "victim_heap_trusts_stale_stamp": _sc_victim_stale_stamp,
    "restore_leaves_lru_place": _sc_restore_lru,
    "offload_take_newest_first": _sc_offload_oldest,
    "drain_walks_boundaries_newest_first": _sc_drain_order,
    "reclaim_cutoff_exclusive": _sc_reclaim_cutoff,
    "completion_keeps_inflight_slots": _sc_inflight_slots,
    "retire_keeps_op_hash": _sc_op_hash,
    "fast_evict_skips_change_log": _sc_change_log,
    "unindex_orphan_skips_lone_record": _sc_orphan_count,
    "unindex_keeps_pending_key_of_seq": _sc_pending_of_seq,
    "store_clone_shares_offload_pins": _sc_clone_pins,
    "coordinator_clone_shares_transfers": _sc_clone_transfers,
    "pool_clone_shares_reservation_handles": _sc_clone_handles,
    "reclaim_forfeits_released_source": _sc_forfeit_released,
    "sink_off_keeps_backlog": _sc_sink_off,
    "duplicate_adoption_keeps_reservation": _sc_duplicate_adoption,
    "transfer_reserve_never_evicts": _sc_reserve_evicts,
    "adopted_image_unsettled": _sc_adopted_settled,
    "done_token_still_listed": _sc_done_token,
    "offload_take_skips_settle": _sc_take_settles,
    "scratch_lends_inflight_restore_slot": _sc_scratch_inflight_slot,
    "scratch_budget_ignores_restores": _sc_scratch_budget,
    "reserve_midstep_requeues_queued_hash": _sc_scratch_queued_hash,
    "scratch_waits_past_its_forward": _sc_scratch_forward,
    "stored_boundary_keeps_its_forward": _sc_boundary_forward_left,
    "boundary_of_latest_forward_refused": _sc_latest_forward,
}
