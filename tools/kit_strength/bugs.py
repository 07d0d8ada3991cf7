"""A fresh set of semantic bugs planted in the production store (``pagedstate.impl``), to
measure how strong the conformance kit alone is (issue 20, "The kit as strong as the
suite").

Each bug is one source edit of one function or method of an ``impl`` module: ``old`` is
replaced by ``new`` in that function's source, the result is compiled in the module's own
namespace and put in place of the original on its class (or module) in *this process*
(:func:`plant`). Nothing on disk changes; a fresh interpreter (``run.py`` starts one per
bug) has the plant and nothing else. A plant whose ``old`` text is not in the function
exactly once fails loudly (:func:`check`), so a plant that no longer applies is noticed.

None of these is one of the 18 reference mutants (``pagedstate.models.mutants``), the 21
production plants of ``docs/conformance.md`` or the plants of ``tests/test_conformance.py``:
they are kept out of the tests that tune the kit. They are kinds an integration ships:
wrong orders, an index kept beside the tables that goes stale, a clone that shares a mutable
structure, offload accounting, an adoption racing a store, pin counting, completion tokens
(SPEC D.13) and midstep scratch.

``SCENARIOS`` holds a short hand-written scenario for each bug that the kit alone missed
under ``ci`` (``run.py --scenarios`` runs them): it drives the reference and the production
coordinator through the same calls and returns what differs, with the plant (a difference
must show) and without it (none may), so every plant is shown to change behaviour; the
others are caught by the kit itself, and all but two by the targeted project tests
(``run.py --suite``).
"""

from __future__ import annotations

import importlib
import inspect
import linecache
import sys
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BUGS", "Bug", "SCENARIOS", "by_name", "check", "plant"]


@dataclass(frozen=True)
class Bug:
    """One planted bug: ``old`` replaced by ``new`` in ``module``'s ``target``."""

    name: str
    #: the impl module that defines the function, e.g. ``pagedstate.impl.store``
    module: str
    #: ``Class.method`` (the class that defines it) or a module-level ``function``
    target: str
    old: str
    new: str
    #: what kind of bug (ordering, stale index, clone, offload, adoption, pins, D.13, scratch)
    kind: str
    #: one sentence: what is wrong, and which SPEC rule it breaks
    what: str


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
        "restore_restamp_ties_newest",
        _STORE,
        "PageUnitCheckpointStore._refresh",
        "self._stamp += 1\n",
        "pass\n",
        "ordering (LRU victim order)",
        "A restore re-stamps its record with the newest record's stamp instead of a new one,"
        " so the victim heap breaks the tie by checkpoint id and can evict the just-restored"
        " (most recently used) record before an older one: SPEC B.1 / B.3 row 4 (a restore"
        " moves the record to the hot end of the LRU, eviction takes the LRU's cold end).",
    ),
    Bug(
        "resume_jumps_the_restore_queue",
        _RESTORES,
        "_Restores.resume_suspended_restore",
        "self._queued_restores[slot] = (cid, op)",
        "self._queued_restores = {slot: (cid, op), **self._queued_restores}",
        "ordering (restore queue order)",
        "A resumed restore is put at the head of the restore queue instead of its end, so the"
        " next drain hands the restores out in another order: SPEC B.3 row 8 (resume puts it"
        " back at the end of the queue) and row 5 (take in queue order).",
    ),
    Bug(
        "backlog_overflow_drops_newest",
        _OFFLOAD,
        "_Offload._queue_offload_store",
        "ready.popleft()",
        "ready.pop()",
        "ordering / offload accounting (nomination backlog cap)",
        "Past the nomination backlog cap the newest nomination is dropped instead of the"
        " oldest: SPEC B.1 (the backlog is capped and overflow drops the oldest).",
    ),
    Bug(
        "waiting_scratch_put_back_reversed",
        _SCRATCH,
        "_Scratch._take_scratch_stores",
        "for slot in reversed(waiting):",
        "for slot in waiting:",
        "ordering (scratch queue order)",
        "Scratch stores that wait for their forward are put back at the front of the queue in"
        " reverse order when two or more wait in one drain: SPEC D.13 / D.1 step 6.3 (a"
        " waiting scratch store stays queued in its place).",
    ),
    Bug(
        "reclaim_order_flag_never_dropped",
        _OFFLOAD,
        "_Offload._pin_offload_source",
        "self._reclaim_in_order = False",
        "pass",
        "stale index (reclaim order)",
        "The store keeps trusting that reclaimable operations are in pin-time order after the"
        " clock went back, so the reclaimer stops at the first young pin and misses older"
        " stale ones behind it: SPEC B.3 row 21 (every reclaimable op pinned at or before"
        " now - timeout is retired).",
    ),
    # -- indexes kept beside the tables ---------------------------------------------------
    Bug(
        "release_leaves_slot_suspended",
        _RESTORES,
        "_Restores.release_suspended_restore",
        "_count_add(self._suspended_slots, op.dst_slot, -1)",
        "None",
        "stale index (suspended slots)",
        "Releasing a suspended restore does not drop its slot from the per-slot suspended"
        " count, so the slot stays busy for good and a later restore into it is refused:"
        " SPEC B.3 row 9 and G4 (a slot is busy only while a restore is queued, in flight or"
        " suspended into it).",
    ),
    Bug(
        "clear_keeps_evictable_count",
        _STORE,
        "PageUnitCheckpointStore.clear",
        "self._num_evictable = 0\n",
        "pass\n",
        "stale index (evictable count)",
        "clear() empties the LRU but keeps the evictable count, so has_available_units and"
        " ensure_free_units promise units from records that are gone: SPEC B.3 row 22 (the"
        " answer counts unpinned READY records only) and row 11.",
    ),
    Bug(
        "unindex_fast_path_ignores_copying",
        _COORD,
        "PagedStateCheckpointCoordinator.unindex",
        "        and h not in store._pending_by_hash\n",
        "",
        "stale index (pending-by-hash read beside the tables)",
        "The coordinator's early return of unindex reads every index but the store's pending"
        " map, so an evicted prefix whose only image is COPYING is not unindexed and is"
        " published READY at the next completion: SPEC A.4 / B.3 row 10 (the checkpoint dies"
        " with its prefix; COPYING -> EVICTING).",
    ),
    Bug(
        "dirty_test_reads_first_unit",
        _POOL,
        "UnitPool._release_held",
        "if dirtying and flags.find(0, a, b) >= 0:",
        "if dirtying and flags[a] == 0:",
        "stale index (dirty flags)",
        "A released checkpoint or transfer run is flagged dirty only when its first unit is"
        " clean, so a run that starts on a dirty unit leaves its clean units unflagged: SPEC"
        " G10 (every unit released from a store owner is dirty until scrubbed).",
    ),
    Bug(
        "rekey_keeps_old_owner_count",
        _POOL,
        "UnitPool.rekey_units",
        "self._add_held(old_owner, -len(ids))",
        "pass",
        "stale index (per-owner unit counts)",
        "Rekeying (adoption) adds the units to the new owner's count but leaves them on the"
        " old owner's, so a spent transfer owner still 'holds units' and cannot reserve"
        " again: SPEC A.2 / G9 (one reservation per owner, counted by the units tagged with"
        " it) and B.3 row 13.",
    ),
    # -- clone fidelity -------------------------------------------------------------------
    Bug(
        "store_clone_shares_suspended_slots",
        _VIEWS,
        "_Views.clone",
        "c._suspended_slots = dict(self._suspended_slots)",
        "c._suspended_slots = self._suspended_slots",
        "clone fidelity",
        "store.clone() shares the per-slot suspended counts with the original, so suspending"
        " or releasing on one copy makes a slot busy or free on the other: the clone contract"
        " (a deep copy sharing nothing mutable), and G4 on the copy that did nothing.",
    ),
    Bug(
        "coordinator_clone_shares_pending_sets",
        _COORD,
        "PagedStateCheckpointCoordinator.clone",
        "c._pending_by_hash = {h: dict(s) for h, s in self._pending_by_hash.items()}",
        "c._pending_by_hash = dict(self._pending_by_hash)",
        "clone fidelity",
        "coordinator.clone() copies the pending-sequences-per-hash map only one level deep,"
        " so a drain or unindex on one copy removes sequences from the other's sets: the"
        " clone contract, and G1 / G5 on the copy that did nothing (its unindex no longer"
        " finds the boundaries it must drop).",
    ),
    # -- offload accounting ---------------------------------------------------------------
    Bug(
        "lease_cap_off_by_one",
        _OFFLOAD,
        "_Offload.acquire_checkpoint_source",
        "len(self._offload_pins) >= max_inflight",
        "len(self._offload_pins) > max_inflight",
        "offload accounting (operation cap)",
        "A source lease is granted with max_inflight operations already outstanding (one"
        " over the bound): SPEC B.3 row 16 (None when over max_inflight outstanding"
        " operations).",
    ),
    Bug(
        "forfeit_watermark_one_low",
        _OFFLOAD,
        "_Offload._remember_forfeit",
        "max(self._forfeit_watermark, gen)",
        "max(self._forfeit_watermark, gen - 1)",
        "offload accounting (forfeit memory)",
        "When the exact forfeit memory overflows, the watermark is raised to one below the"
        " forgotten generation, so was_reclaimed of that very operation answers False (it"
        " fails open): SPEC G7 (past the bound a watermark answers, failing closed).",
    ),
    Bug(
        "reclaim_unpins_released_source",
        _OFFLOAD,
        "_Offload.reclaim_stale_offload_pins",
        "        if not pin.source_released:\n"
        '            self._unpin(pin.checkpoint_id, "offload")\n',
        '        self._unpin(pin.checkpoint_id, "offload")\n        if not pin.source_released:\n',
        "pin counting",
        "The reclaimer drops a record pin also for an operation whose source was already"
        " released (phase 1), taking another reader's pin or underflowing: SPEC B.3 rows 18"
        " and 21 (a SOURCE_RELEASED op holds no pin; reclaim releases only a held pin).",
    ),
    # -- adoption / transfer races --------------------------------------------------------
    Bug(
        "adopt_over_an_inflight_store",
        _OFFLOAD,
        "_Offload.adopt_units",
        "if self.contains_or_pending(prefix_hash):",
        "if self.contains(prefix_hash):",
        "adoption race",
        "A transfer is adopted as the READY image of a hash whose own store is still COPYING"
        " (in flight), so one hash has two images until the store's completion dedups it:"
        " SPEC B.3 row 13 (adoption of a READY or pending hash releases the units and"
        " returns False).",
    ),
    Bug(
        "drain_begins_a_pending_hash_twice",
        _DRAIN,
        "_Drain._drain",
        "if src < 0 or h in store_pending:",
        "if src < 0:",
        "stale index / race (two boundaries of one hash in one drain)",
        "The drain skips a boundary whose hash is READY but not one whose hash is already"
        " COPYING, so two sequences filing the same prefix in one pass get two stores of one"
        " hash: SPEC D.1 step 6 / B.3 row 1 (begin_store of a READY or pending hash is"
        " refused).",
    ),
    # -- completion tokens and settling (SPEC D.13) ---------------------------------------
    Bug(
        "wait_synchronizes_first_token_only",
        _COMPLETIONS,
        "_Completions.settle_completions",
        "for token, _cids in list(self._completions):",
        "for token, _cids in self._completions[:1]:",
        "completion tokens (D.13)",
        "settle_completions(wait=True) synchronizes only the oldest outstanding token, so"
        " images of later batches stay unsettled after a wait that promised them settled:"
        " SPEC D.13 / B.3 row 24 (wait synchronizes every outstanding token first).",
    ),
    Bug(
        "settle_stops_at_first_waiting_token",
        _COMPLETIONS,
        "_Completions._settle",
        "        if not done:\n            continue\n",
        "        if not done:\n            break\n",
        "completion tokens (D.13)",
        "The settle treats tokens as done in order: records of a token that reported done"
        " after an older one still waiting are not settled, although that token is"
        " forgotten: SPEC D.13 / B.3 row 24 (every token reporting done settles its images,"
        " in any order).",
    ),
    # -- midstep scratch ------------------------------------------------------------------
    Bug(
        "refused_scratch_store_spends_budget",
        _SCRATCH,
        "_Scratch._take_scratch_stores",
        "                self.checkpoints_dropped += 1\n",
        "                self.checkpoints_dropped += 1\n                budget -= 1\n",
        "scratch slots",
        "A scratch store the drain refuses (its hash is READY or pending, or no units) still"
        " spends one op of the per-batch budget, so a later queued scratch store is left"
        " over budget: SPEC D.1 step 6.3 (the budget counts the ops issued).",
    ),
)


def by_name(name: str) -> Bug:
    """The bug called ``name``."""
    for bug in BUGS:
        if bug.name == name:
            return bug
    raise KeyError(f"no planted bug {name!r}; known: {', '.join(b.name for b in BUGS)}")


def _resolve(bug: Bug) -> tuple[Any, str, Callable[..., Any], types.ModuleType]:
    """``(holder, attribute, function, module)``: where ``bug.target`` lives."""
    module = importlib.import_module(bug.module)
    parts = bug.target.split(".")
    holder: Any = module
    for part in parts[:-1]:
        holder = getattr(holder, part)
    name = parts[-1]
    if isinstance(holder, type):
        if name not in holder.__dict__:
            raise AssertionError(f"{bug.name}: {bug.target} is not defined on {holder!r}")
        fn = holder.__dict__[name]
    else:
        fn = getattr(holder, name)
    if not isinstance(fn, types.FunctionType):
        raise AssertionError(f"{bug.name}: {bug.target} is not a plain function ({fn!r})")
    return holder, name, fn, module


def _edited_source(bug: Bug, fn: Callable[..., Any]) -> str:
    src = textwrap.dedent(inspect.getsource(fn))
    n = src.count(bug.old)
    if n != 1:
        raise AssertionError(
            f"{bug.name}: the old text is in {bug.target} {n} times, not once: {bug.old!r}"
        )
    return src.replace(bug.old, bug.new)


def check(bug: Bug) -> None:
    """Fail unless ``bug`` applies: its target exists and holds ``old`` exactly once, and
    the edited source compiles. Changes nothing."""
    _, _, fn, _ = _resolve(bug)
    compile(_edited_source(bug, fn), f"<check {bug.name}>", "exec")


def plant(bug: Bug) -> None:
    """Put the edited function in place of ``bug.target`` in this process (on its class,
    or in its module and every ``pagedstate`` module that imported the same function).
    The edited source is registered in ``linecache`` so ``inspect.getsource`` still works
    on it (tests that plant their own edits read it)."""
    holder, name, fn, module = _resolve(bug)
    src = _edited_source(bug, fn)
    filename = f"<planted {bug.name}: {bug.module}.{bug.target}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns: dict[str, Any] = {}
    exec(compile(src, filename, "exec"), vars(module), ns)
    new = ns[name]
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    if isinstance(holder, type):
        setattr(holder, name, new)
        return
    for mod in list(sys.modules.values()):
        if (
            mod is not None
            and mod.__name__.startswith("pagedstate")
            and (getattr(mod, name, None) is fn)
        ):
            setattr(mod, name, new)


# -- hand-written scenarios -----------------------------------------------------------------
#
# A short scenario per bug that the kit alone missed: the same calls, in lockstep, on the
# reference model and on the production coordinator of this process (planted or not),
# returning what differs (empty: nothing). ``run.py --scenarios`` runs each in a fresh
# process with the plant (a difference must show) and without it (none may show). Each is
# also the shape of a directed check that would catch its bug.


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Seq:
    def __init__(self, slot: int) -> None:
        self.state_slot = slot
        self.has_per_req_cache = True


class _Tier:
    def could_serve(self, h: int) -> bool:
        return False


class _Pair:
    """The reference and the production coordinator over the same spec and clock; ``both``
    makes one call on each (each with its own arguments, from ``args(side)``) and notes
    where the results or the snapshots differ."""

    def __init__(self, units: int = 8, offload: bool = False, midstep: bool = False) -> None:
        from pagedstate import impl as I
        from pagedstate.models import reference as R
        from pagedstate.spec import PagedStateCheckpointSpec

        spec = PagedStateCheckpointSpec(
            page_unit_bytes=16, slot_bytes=32, layout_id="kit-strength", image_bytes=32
        )
        self.clock = _Clock()
        self.sides = []
        for m in (R, I):
            c = m.PagedStateCheckpointCoordinator(
                m.UnitPool(units),
                spec,
                True,
                _Tier() if offload else None,
                midstep,
                clock=self.clock,
                forfeit_bound=2,
            )
            if midstep:
                c.attach_midstep_scratch(m.SlotPool([6, 7]), 2)
            self.sides.append(c)
        self.ref, self.sut = self.sides
        self.diff: list[str] = []

    def both(self, what: str, call: Callable[[Any, int], Any]) -> tuple[Any, Any]:
        got = []
        for k, c in enumerate(self.sides):
            try:
                got.append(("returned", call(c, k)))
            except Exception as exc:  # noqa: BLE001 (a difference to report)
                got.append(("raised", type(exc).__name__))
        if got[0] != got[1]:
            self.diff.append(f"{what}: reference {got[0]}, production {got[1]}")
        a, b = (c.snapshot() for c in self.sides)
        if a != b and not any(d.startswith(f"{what}: snapshots") for d in self.diff):
            fields = [d.split(":", 1)[0] for d in a.diff(b)]
            self.diff.append(f"{what}: snapshots differ in {fields}: {a.diff(b)[0][:200]}")
        return got[0][1], got[1][1]

    def store(self, seqs: list[Any], hs: list[int]) -> None:
        for s, h in zip(seqs, hs, strict=True):
            self.both(f"checkpoint({h})", lambda c, _k, s=s, h=h: c.checkpoint(s, 1, h))
        self.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
        self.both("complete_previous_batch()", lambda c, _k: c.complete_previous_batch())


def _sc_resume_order() -> list[str]:
    """A restore suspended, another queued, the first resumed: the drain hands the
    resumed one out last (it went to the end of the queue)."""
    p = _Pair()
    p.store([_Seq(0), _Seq(1)], [1, 2])
    p.both("begin_restore(1, 0)", lambda c, _k: c.begin_restore(1, 0))
    leases = p.both("suspend(0)", lambda c, _k: c.suspend_queued_restore(0))
    p.both("begin_restore(2, 1)", lambda c, _k: c.begin_restore(2, 1))
    p.both("resume(lease)", lambda c, k: c.resume_suspended_restore(leases[k]))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    return p.diff


def _sc_waiting_scratch() -> list[str]:
    """Two scratch stores published for a forward that has not run: the drain leaves both
    queued, in their order."""
    p = _Pair(midstep=True)
    s = _Seq(0)
    res = p.both("reserve_midstep", lambda c, _k: c.reserve_midstep(s, [(1, 5), (2, 6)]))
    p.both("publish_midstep(forward=1)", lambda c, k: c.publish_midstep(res[k], forward=1))
    p.both("take_checkpoint_ops(forward=0)", lambda c, _k: c.take_checkpoint_ops(forward=0))
    return p.diff


def _sc_refused_scratch() -> list[str]:
    """A scratch store refused (a boundary of its hash was begun first in the same drain)
    spends no budget: the next scratch store is issued."""
    p = _Pair(midstep=True)
    s0, s1 = _Seq(0), _Seq(1)
    res = p.both("reserve_midstep", lambda c, _k: c.reserve_midstep(s0, [(1, 5), (2, 6)]))
    p.both("publish_midstep", lambda c, k: c.publish_midstep(res[k]))
    p.both("checkpoint(s1, 5)", lambda c, _k: c.checkpoint(s1, 1, 5))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    return p.diff


def _sc_reclaim_order() -> list[str]:
    """Two offload stores, the second pinned after the clock went back; a reclaim for which
    only the second is stale retires it."""
    p = _Pair(offload=True)
    p.store([_Seq(0)], [1])
    p.both("take_offload_stores(4) at 1000", lambda c, _k: c.take_offload_stores(4))
    p.store([_Seq(1)], [2])
    p.clock.now = 900.0
    p.both("take_offload_stores(4) at 900", lambda c, _k: c.take_offload_stores(4))
    p.clock.now = 915.0
    p.both(
        "reclaim_stale_offload_pins(10) at 915", lambda c, _k: c.reclaim_stale_offload_pins(10.0)
    )
    return p.diff


def _sc_dirty() -> list[str]:
    """An image's units released where the first is dirty and the second never was: both
    are dirty after (G10)."""
    p = _Pair()
    p.store([_Seq(0)], [1])  # units 0, 1
    p.both("unindex(1)", lambda c, _k: c.unindex(1))  # 0, 1 dirty
    p.both("pool.reserve_units(1, kv)", lambda c, _k: c.pool.reserve_units(1, ("live-kv", 0)))
    p.store([_Seq(0)], [2])  # units 1 (dirty), 2 (clean)
    p.both("unindex(2)", lambda c, _k: c.unindex(2))
    p.both("pool.is_dirty(2)", lambda c, _k: c.pool.is_dirty(2))
    return p.diff


def _sc_store_clone() -> list[str]:
    """A restore suspended on a clone of the store: the original's slot is not busy."""
    p = _Pair()
    p.store([_Seq(0)], [1])
    p.both("begin_restore(1, 0)", lambda c, _k: c.begin_restore(1, 0))
    for c in p.sides:
        c.store.clone().suspend_queued_restore(0)  # on the clone only
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    p.both("complete_previous_batch()", lambda c, _k: c.complete_previous_batch())
    p.both("begin_restore(1, 0) again", lambda c, _k: c.begin_restore(1, 0))
    return p.diff


def _sc_coordinator_clone() -> list[str]:
    """Two boundaries of one hash; a clone drains them; the original's unindex must still
    drop both (G5)."""
    p = _Pair()
    a, b = _Seq(0), _Seq(1)
    p.both("checkpoint(a, 3)", lambda c, _k: c.checkpoint(a, 1, 3))
    p.both("checkpoint(b, 3)", lambda c, _k: c.checkpoint(b, 1, 3))
    for c in p.sides:
        c.clone().take_checkpoint_ops()
    p.both("unindex(3)", lambda c, _k: c.unindex(3))
    return p.diff


def _sc_lease_cap() -> list[str]:
    """A source lease with max_inflight=1 while one operation is outstanding: refused."""
    p = _Pair(offload=True)
    p.store([_Seq(0), _Seq(1)], [1, 2])
    p.both(
        "acquire(1, max_inflight=1)", lambda c, _k: c.acquire_checkpoint_source(1, max_inflight=1)
    )
    p.both(
        "acquire(2, max_inflight=1)", lambda c, _k: c.acquire_checkpoint_source(2, max_inflight=1)
    )
    return p.diff


def _sc_reclaim_released() -> list[str]:
    """An offload store whose source was released (phase 1), its record restored (pinned),
    then reclaimed: the restore keeps its pin."""
    p = _Pair(offload=True)
    p.store([_Seq(0)], [1])
    ops = p.both("take_offload_stores(4)", lambda c, _k: c.take_offload_stores(4))
    p.both(
        "release_offload_store_source(op)",
        lambda c, k: c.release_offload_store_source(ops[k][0][0]),
    )
    p.both("begin_restore(1, 0)", lambda c, _k: c.begin_restore(1, 0))
    p.clock.now += 100.0
    p.both("reclaim_stale_offload_pins(10)", lambda c, _k: c.reclaim_stale_offload_pins(10.0))
    return p.diff


def _sc_adopt_inflight() -> list[str]:
    """A transfer adopted under a hash whose store is in flight (COPYING): refused."""
    p = _Pair()
    p.both("reserve_transfer_units(o)", lambda c, _k: c.reserve_transfer_units(("load", 0)))
    p.both("checkpoint(3)", lambda c, _k: c.checkpoint(_SEQ0, 1, 3))
    p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
    p.both("adopt_transfer_units(o, 3)", lambda c, _k: c.adopt_transfer_units(("load", 0), 3))
    p.both("complete_previous_batch()", lambda c, _k: c.complete_previous_batch())
    return p.diff


_SEQ0 = _Seq(0)


def _tokens_pair() -> tuple[_Pair, list[list[Any]]]:
    """Two batches completed with tokens not done yet: two outstanding completions."""
    from pagedstate.spec import ManualCompletion

    p = _Pair()
    toks: list[list[Any]] = [[], []]
    for h in (1, 2):
        p.both(f"checkpoint({h})", lambda c, _k, h=h: c.checkpoint(_SEQ0, 1, h))
        p.both("take_checkpoint_ops()", lambda c, _k: c.take_checkpoint_ops())
        for k in (0, 1):
            toks[k].append(ManualCompletion())
        p.both(
            "complete_previous_batch(token)",
            lambda c, k: c.complete_previous_batch(completion=toks[k][-1]),
        )
    return p, toks


def _sc_wait_all() -> list[str]:
    """settle_completions(wait=True) with two tokens outstanding settles both."""
    p, _ = _tokens_pair()
    p.both("settle_completions(wait=True)", lambda c, _k: c.settle_completions(wait=True))
    return p.diff


def _sc_settle_out_of_order() -> list[str]:
    """The newer of two tokens reports done first: a settle settles its image."""
    p, toks = _tokens_pair()
    for k in (0, 1):
        toks[k][1].set()
    p.both("settle_completions()", lambda c, _k: c.settle_completions())
    return p.diff


#: bug name -> scenario (every bug the kit alone missed in the ci run).
SCENARIOS: dict[str, Callable[[], list[str]]] = {
    "resume_jumps_the_restore_queue": _sc_resume_order,
    "waiting_scratch_put_back_reversed": _sc_waiting_scratch,
    "reclaim_order_flag_never_dropped": _sc_reclaim_order,
    "dirty_test_reads_first_unit": _sc_dirty,
    "store_clone_shares_suspended_slots": _sc_store_clone,
    "coordinator_clone_shares_pending_sets": _sc_coordinator_clone,
    "lease_cap_off_by_one": _sc_lease_cap,
    "reclaim_unpins_released_source": _sc_reclaim_released,
    "adopt_over_an_inflight_store": _sc_adopt_inflight,
    "wait_synchronizes_first_token_only": _sc_wait_all,
    "settle_stops_at_first_waiting_token": _sc_settle_out_of_order,
    "refused_scratch_store_spends_budget": _sc_refused_scratch,
}
