"""The malformed calls of the ``bad_input`` rule (:data:`BAD_INPUTS`, and those that go
through ``coordinator.store``): each is called on both sides and must raise the same class,
changing nothing."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from pagedstate.models.reference import SlotPool
from pagedstate.models.world import KV_OWNER
from pagedstate.spec.types import SuspendedCheckpointRestore

from .config import KitSeq, _Side

if TYPE_CHECKING:
    from .machine import ConformanceMachine

# ---------------------------------------------------------------------------------------
# Bad inputs: each is called on both sides and must raise the same class, changing nothing.
# ---------------------------------------------------------------------------------------

BadInput = Callable[[_Side, "ConformanceMachine"], Any]


def _some_record_units(m: ConformanceMachine) -> tuple[int, tuple[int, ...]]:
    snap = m.snap_ref
    for cid in sorted(snap.records):
        return cid, snap.records[cid].unit_ids
    return -1, (0,)


def _forged_lease_id(lease_id: Callable[[ConformanceMachine], Any]) -> BadInput:
    """Release a lease whose id is ``lease_id(m)`` (else the newest lease's fields): an id
    never handed out, or not an id at all."""

    def call(s: _Side, m: ConformanceMachine) -> Any:
        if m.lease_pairs:
            forged = attrs.evolve(s.pick(m.lease_pairs[-1]), lease_id=lease_id(m))
        else:
            forged = SuspendedCheckpointRestore(0, _dummy_restore_op(m), lease_id(m))
        return s.coord.release_suspended_restore(forged)

    return call


def _tampered_lease(s: _Side, m: ConformanceMachine) -> Any:
    if not m.lease_pairs:
        return s.coord.release_suspended_restore("not a lease")
    lease = s.pick(m.lease_pairs[-1])
    return s.coord.resume_suspended_restore(
        attrs.evolve(lease, checkpoint_id=lease.checkpoint_id + 1)
    )


def _dummy_restore_op(m: ConformanceMachine) -> Any:
    from pagedstate.spec.types import CheckpointRestoreOp

    spec = m.config.spec
    return CheckpointRestoreOp(0, (0,), spec.image_bytes, spec.layout_id)


def _release_record_as_kv(s: _Side, m: ConformanceMachine) -> Any:
    _cid, units = _some_record_units(m)
    return s.pool.release_units(list(units), (KV_OWNER, -1))


def _release_record_partly(s: _Side, m: ConformanceMachine) -> Any:
    from pagedstate.spec.types import CHECKPOINT_OWNER

    cid, units = _some_record_units(m)
    return s.pool.release_units(list(units[:-1]), (CHECKPOINT_OWNER, cid))


def _release_transfer_partly(s: _Side, m: ConformanceMachine) -> Any:
    from pagedstate.spec.types import TRANSFER_OWNER

    for owner, units in sorted(m.snap_ref.transfers.items(), key=repr):
        return s.pool.release_units(list(units[:-1]), (TRANSFER_OWNER, owner))
    return s.pool.release_units([], (TRANSFER_OWNER, ("load", -1)))


def _release_record_whole(s: _Side, m: ConformanceMachine) -> Any:
    from pagedstate.spec.types import CHECKPOINT_OWNER

    cid, units = _some_record_units(m)
    return s.pool.release_units(list(units), (CHECKPOINT_OWNER, cid))


def _stale_scratch(s: _Side, m: ConformanceMachine) -> Any:
    for slot in sorted(m.snap_ref.scratch_reserved):
        _slot, pos, h = m.scratch_latest[slot]
        return s.coord.publish_midstep([(slot, pos + 1, h)])
    return s.coord.publish_midstep([(999, 0, 1)])


class _HostileOwner:
    """An owner whose ``__hash__`` raises."""

    def __hash__(self) -> int:
        raise RuntimeError("hostile __hash__")

    def __repr__(self) -> str:
        return "_HostileOwner()"


def _seq0(m: ConformanceMachine) -> KitSeq:
    return m.seqs[0]


#: Named bad calls; the ``bad_input`` rule draws one by name. Each raises in the reference
#: (a specific :class:`~pagedstate.spec.errors.PagedStateError`) or, where it does not,
#: is still compared like any call.
BAD_INPUTS: Mapping[str, BadInput] = MappingProxyType(
    {
        "checkpoint_negative_blocks": lambda s, m: s.coord.checkpoint(_seq0(m), -1, 1),
        "checkpoint_str_hash": lambda s, m: s.coord.checkpoint(_seq0(m), 1, "1"),
        "checkpoint_bool_blocks": lambda s, m: s.coord.checkpoint(_seq0(m), True, 1),
        "begin_restore_negative_slot": lambda s, m: s.coord.begin_restore(1, -1),
        "begin_restore_str_hash": lambda s, m: s.coord.begin_restore("1", 0),
        "begin_restore_float_slot": lambda s, m: s.coord.begin_restore(1, 0.0),
        "unindex_str": lambda s, m: s.coord.unindex("1"),
        "unindex_float": lambda s, m: s.coord.unindex(1.0),
        "ensure_free_negative": lambda s, m: s.coord.ensure_free_units(-1),
        "has_available_str_count": lambda s, m: s.coord.has_available_units("1"),
        "has_available_str_protected": lambda s, m: s.coord.has_available_units(1, "1"),
        "reclaim_nan": lambda s, m: s.coord.reclaim_stale_offload_pins(math.nan),
        "reclaim_str": lambda s, m: s.coord.reclaim_stale_offload_pins("10"),
        "reclaim_bool": lambda s, m: s.coord.reclaim_stale_offload_pins(True),
        "release_source_tuple": lambda s, m: s.coord.release_offload_store_source((1, 1)),
        "settle_none": lambda s, m: s.coord.settle_offload_store(None),
        "was_reclaimed_int": lambda s, m: s.coord.was_reclaimed(3),
        "take_offload_negative": lambda s, m: s.coord.take_offload_stores(-1),
        "acquire_negative_limit": lambda s, m: s.coord.acquire_checkpoint_source(
            1, max_inflight=-1
        ),
        "acquire_str_hash": lambda s, m: s.coord.acquire_checkpoint_source("1"),
        "resumable_negative_hit": lambda s, m: s.coord.resumable_hit(_seq0(m), -1, [1]),
        "resumable_hit_too_long": lambda s, m: s.coord.resumable_hit(_seq0(m), 2, [1]),
        "reserve_midstep_bad_position": lambda s, m: s.coord.reserve_midstep(_seq0(m), [(1,)]),
        "publish_unknown_scratch": lambda s, m: s.coord.publish_midstep([(999, 0, 1)]),
        "cancel_malformed_scratch": lambda s, m: s.coord.cancel_midstep([(1, 2)]),
        "publish_scratch_twice_in_one_call": lambda s, m: s.coord.publish_midstep(
            [(m.config.seqs + 1, 0, 1), (m.config.seqs + 1, 0, 1)]
        ),
        "reserve_transfer_none": lambda s, m: s.coord.reserve_transfer_units(None),
        "reserve_transfer_unhashable": lambda s, m: s.coord.reserve_transfer_units(["x"]),
        "adopt_str_hash": lambda s, m: s.coord.adopt_transfer_units(("load", 0), "1"),
        "forged_lease": _forged_lease_id(
            lambda m: (m.lease_pairs[-1].ref.lease_id if m.lease_pairs else 0) + 10_000
        ),
        "forged_lease_negative_id": _forged_lease_id(lambda m: -1),
        "forged_lease_next_id": _forged_lease_id(lambda m: m.snap_ref.next_lease_id),
        "forged_lease_bool_id": _forged_lease_id(lambda m: True),
        "tampered_lease": _tampered_lease,
        "pool_reserve_negative": lambda s, m: s.pool.reserve_units(-1, (KV_OWNER, -1)),
        "pool_reserve_float": lambda s, m: s.pool.reserve_units(1.0, (KV_OWNER, -1)),
        "pool_reserve_none_owner": lambda s, m: s.pool.reserve_units(1, None),
        "pool_release_set": lambda s, m: s.pool.release_units({0}, (KV_OWNER, -1)),
        "pool_release_duplicate": lambda s, m: s.pool.release_units([0, 0], (KV_OWNER, -1)),
        "pool_release_negative_unit": lambda s, m: s.pool.release_units([-1], (KV_OWNER, -1)),
        "pool_release_wrong_owner": _release_record_as_kv,
        "pool_release_record_partly": _release_record_partly,
        "pool_release_transfer_partly": _release_transfer_partly,
        "attach_scratch_negative_budget": lambda s, m: s.coord.attach_midstep_scratch(
            SlotPool([]), -1
        ),
        "contains_str": lambda s, m: s.coord.contains("1"),
        "restore_queued_for_bool": lambda s, m: s.coord.restore_queued_for(True),
        "applies_not_a_sequence": lambda s, m: s.coord.applies(object()),
        "reserve_midstep_not_a_sequence": lambda s, m: s.coord.reserve_midstep(object(), [(0, 1)]),
        "resumable_hit_str_hash": lambda s, m: s.coord.resumable_hit(_seq0(m), 1, ["1"]),
        "publish_stale_scratch": _stale_scratch,
        "release_transfer_unhashable": lambda s, m: s.coord.release_transfer_units(["x"]),
        "reserve_transfer_hostile": lambda s, m: s.coord.reserve_transfer_units(_HostileOwner()),
        "pool_reserve_hostile_owner": lambda s, m: s.pool.reserve_units(1, _HostileOwner()),
        "pool_release_record_whole": _release_record_whole,
        "pool_has_free_str": lambda s, m: s.pool.has_free("1"),
        "pool_owner_of_str": lambda s, m: s.pool.owner_of("0"),
    }
)


class _QueryOnly:
    """A completion with ``query`` and no ``synchronize``."""

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "_QueryOnly()"


class _SynchronizeNotCallable:
    """A completion whose ``synchronize`` is not callable."""

    synchronize = 1

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "_SynchronizeNotCallable()"


class _RaisingToken:
    """A completion whose ``query`` raises (a device error): the call propagates it and
    changes nothing (every token is asked before anything changes)."""

    def query(self) -> bool:
        raise RuntimeError("query failed")

    def synchronize(self) -> None:
        raise RuntimeError("synchronize failed")

    def __repr__(self) -> str:
        return "_RaisingToken()"


def _stale_forward(m: ConformanceMachine) -> int:
    """A forward before the last drain's (stale), or -1 (not a forward id) when there is
    none."""
    last = m.snap_ref.last_forward
    return last - 1 if last else -1


def _not_greater_forward(m: ConformanceMachine) -> int:
    last = m.snap_ref.last_forward
    return -1 if last is None else last


def _publish_bad_forward(s: _Side, m: ConformanceMachine) -> Any:
    for slot in sorted(m.snap_ref.scratch_reserved):
        return s.coord.publish_midstep([m.scratch_latest[slot]], forward="1")
    return s.coord.publish_midstep([(999, 0, 1)], forward="1")


def _no_slot(m: ConformanceMachine) -> KitSeq:
    return m.seqs[-1]


def _no_cache(m: ConformanceMachine) -> KitSeq:
    return m.seqs[-2]


#: Bad inputs of the overlapped style's arguments (SPEC D.13, G12, G13, G16); run only
#: with ``overlap``. Forward ids and ``computed_blocks`` are checked before a boundary is
#: ignored (a sequence without state or without a slot) and before anything changes; a
#: completion is checked, and every token asked, before anything changes.
_OVERLAP_BAD_INPUTS: Mapping[str, BadInput] = MappingProxyType(
    {
        "checkpoint_str_forward": lambda s, m: s.coord.checkpoint(_seq0(m), 1, 1, forward="1"),
        "checkpoint_negative_forward": lambda s, m: s.coord.checkpoint(_seq0(m), 1, 1, forward=-1),
        "checkpoint_bool_forward": lambda s, m: s.coord.checkpoint(_seq0(m), 1, 1, forward=True),
        "checkpoint_stale_forward": lambda s, m: s.coord.checkpoint(
            _seq0(m), 1, 1, forward=_stale_forward(m)
        ),
        "checkpoint_stale_forward_no_slot": lambda s, m: s.coord.checkpoint(
            _no_slot(m), 1, 1, forward=_stale_forward(m)
        ),
        "checkpoint_str_forward_no_cache": lambda s, m: s.coord.checkpoint(
            _no_cache(m), 1, 1, forward="0"
        ),
        "checkpoint_zero_blocks": lambda s, m: s.coord.checkpoint(_seq0(m), 0, 1),
        "checkpoint_zero_blocks_no_slot": lambda s, m: s.coord.checkpoint(_no_slot(m), 0, 1),
        "checkpoint_beyond_computed": lambda s, m: s.coord.checkpoint(
            _seq0(m), 2, 1, computed_blocks=1
        ),
        "checkpoint_str_computed": lambda s, m: s.coord.checkpoint(
            _seq0(m), 1, 1, computed_blocks="2"
        ),
        "checkpoint_negative_computed": lambda s, m: s.coord.checkpoint(
            _seq0(m), 1, 1, computed_blocks=-1
        ),
        "checkpoint_bool_computed": lambda s, m: s.coord.checkpoint(
            _seq0(m), 1, 1, computed_blocks=True
        ),
        "take_str_forward": lambda s, m: s.coord.take_checkpoint_ops(forward="1"),
        "take_negative_forward": lambda s, m: s.coord.take_checkpoint_ops(forward=-1),
        "take_bool_forward": lambda s, m: s.coord.take_checkpoint_ops(forward=True),
        "take_forward_not_greater": lambda s, m: s.coord.take_checkpoint_ops(
            forward=_not_greater_forward(m)
        ),
        "complete_object_token": lambda s, m: s.coord.complete_previous_batch(completion=object()),
        "complete_query_only_token": lambda s, m: s.coord.complete_previous_batch(
            completion=_QueryOnly()
        ),
        "complete_synchronize_not_callable": lambda s, m: s.coord.complete_previous_batch(
            completion=_SynchronizeNotCallable()
        ),
        "complete_raising_token": lambda s, m: s.coord.complete_previous_batch(
            completion=_RaisingToken()
        ),
        "publish_str_forward": _publish_bad_forward,
        "begin_restore_seq_not_a_sequence": lambda s, m: s.coord.begin_restore(1, 0, seq=object()),
        "pool_release_unit_out_of_range": lambda s, m: s.pool.release_units(
            [m.config.units], (KV_OWNER, -1)
        ),
        "pool_release_unit_far_out_of_range": lambda s, m: s.pool.release_units(
            [10 * m.config.units + 3], (KV_OWNER, -1)
        ),
    }
)

#: Bad inputs of the overlapped style that go through ``coordinator.store`` (with
#: ``overlap`` and ``store_calls``).
_OVERLAP_STORE_BAD_INPUTS: Mapping[str, BadInput] = MappingProxyType(
    {
        "store_complete_object_token": lambda s, m: s.store.complete_inflight(object()),
        "store_complete_raising_token": lambda s, m: s.store.complete_inflight(_RaisingToken()),
    }
)

#: Bad inputs that go through ``coordinator.store`` (skipped when ``store_calls`` is off).
_STORE_BAD_INPUTS: Mapping[str, BadInput] = MappingProxyType(
    {
        "changed_since_str": lambda s, m: s.store.changed_since("0"),
        "cancel_restore_str_slot": lambda s, m: s.store.cancel_queued_restore("0"),
        "lookup_str": lambda s, m: s.store.lookup("1"),
        "contains_or_pending_list": lambda s, m: s.store.contains_or_pending([1]),
    }
)
