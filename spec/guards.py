"""Guards and availability arithmetic as pure, total functions with PEP316 contracts.

The transition tables (:mod:`pagedstate.spec.tables`) say what happens for a guard
*outcome*; this module says how the outcome is computed from a record's state. Each
computation exists twice, on purpose, and each store calls its own:

- the guard of a record step: production :func:`record_step` (through
  :func:`record_guard`), reference :func:`guard_by_table`;
- the LRU victim predicate: production :func:`is_evictable`, reference
  :func:`evictable_by_table`;
- ``has_available_units``: production :func:`units_available` (closed form, O(1)),
  reference :func:`units_available_by_walk` (ATOM's walk over the LRU);
- ``was_reclaimed`` (G7): production :func:`forfeit_untrusted`, reference
  :func:`reclaimed_by_cases`.

(``changed_since`` is in :mod:`pagedstate.spec.changelog`, split the same way.)

``make contracts`` checks this module symbolically with CrossHair in two ways:

- ``crosshair check --analysis_kind=PEP316``: every ``pre:``/``post:``/``raises:`` line below
  is a checked contract, not a comment (the production helpers' contracts, and the table's
  safety rules through :func:`check_record_step`, which runs the production
  :func:`record_step` against the reference's :func:`guard_by_table`);
- ``crosshair diffbehavior`` on the ``diff_*`` pairs at the end: each pair runs the
  **reference's helper** and the **production's helper** behind one domain guard
  (diffbehavior builds arguments from the signature and ignores ``pre:`` lines), so a
  difference is a bug in the code the production store runs, or in the reference.

Sources: SPEC B.3 rows 3-22 (guards), D.13 (host readers need a settled image), G7
(forfeit watermark), G11 (pins only on READY; units released only with no pin left).
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import IllegalTransitionError, PinUnderflowError
from .tables import EVICTING, NO_GUARD, READY, RECORD, Row

__all__ = [
    "GUARD_LABELS",
    "UNDERFLOW_MESSAGE",
    "store_guard",
    "index_guard",
    "unpin_guard",
    "settle_guard",
    "record_guard",
    "guard_holds",
    "guard_by_table",
    "record_step",
    "check_record_step",
    "is_evictable",
    "evictable_by_table",
    "units_available",
    "units_available_by_walk",
    "forfeit_untrusted",
    "reclaimed_by_cases",
]

#: The message of :func:`unpin_guard`'s PinUnderflowError.
UNDERFLOW_MESSAGE = "pin underflow: no pin left to release"

#: Every guard outcome a record row can carry.
GUARD_LABELS = frozenset({NO_GUARD, "pinned", "unpinned", "last", "more", "settled", "unsettled"})

_UNPIN_EVENTS = frozenset({"unpin_restore", "unpin_offload", "unpin_lease"})
#: The pins of host and other-stream readers: they need a settled image (SPEC D.13).
_HOST_PIN_EVENTS = frozenset({"pin_offload", "pin_lease"})

#: The legend's guard families (tables.py): the labels of one family are exclusive, and
#: together they cover every pin count the family's rows are read at ("unpinned"/"pinned":
#: any count; "last"/"more": one pin or more; "settled"/"unsettled": the record's settled
#: flag, any count).
_LEGEND = (("unpinned", "pinned"), ("last", "more"), ("settled", "unsettled"))


# ---------------------------------------------------------------------------------------
# Record guards (SPEC B.3; tables.py: "pinned"/"unpinned" = pin_count > 0 / == 0 before the
# event; for unpin, "last"/"more" = the pin count after the event is 0 / > 0)
# ---------------------------------------------------------------------------------------


def store_guard(pin_count: int) -> str:
    """``"pinned"`` or ``"unpinned"``: the guard of evict, of an EVICTING record's publish, and
    of a READY record's unindex or clear (SPEC B.3 rows 2, 10-12).

    pre: pin_count >= 0
    post: _ in ("pinned", "unpinned")
    post: (_ == "pinned") == (pin_count > 0)
    post: (_ == "unpinned") == (pin_count == 0)
    """
    return "pinned" if pin_count > 0 else "unpinned"


def index_guard(phase: str, pin_count: int) -> str:
    """The guard of unindex and clear (SPEC B.3 rows 10, 11): a READY record's pin guard;
    ``"-"`` in every other phase (COPYING and EVICTING rows have no guard).

    pre: pin_count >= 0
    post: (_ == "-") == (phase != "READY")
    post: phase != "READY" or _ == store_guard(pin_count)
    """
    if phase == READY:
        return store_guard(pin_count)
    return NO_GUARD


def unpin_guard(phase: str, pin_count: int) -> str:
    """The guard of dropping one pin (SPEC B.3 rows 3, 6, 9, 18, 19, 21): ``"-"`` on READY;
    on any other phase ``"last"`` when this is the last pin, else ``"more"``.

    Raises PinUnderflowError when no pin is left (the caller may re-raise it naming the
    record): the pin count is checked before any row is looked up.

    pre: pin_count >= 0
    raises: PinUnderflowError
    post: pin_count >= 1
    post: _ in ("-", "last", "more")
    post: (_ == "-") == (phase == "READY")
    post: phase == "READY" or (_ == "last") == (pin_count == 1)
    post: phase == "READY" or (_ == "more") == (pin_count > 1)
    """
    if pin_count <= 0:
        raise PinUnderflowError(UNDERFLOW_MESSAGE)
    if phase == READY:
        return NO_GUARD
    return "last" if pin_count == 1 else "more"


def settle_guard(settled: bool) -> str:
    """``"settled"`` or ``"unsettled"``: the guard of a host reader's pin (an offload store
    or a lease, SPEC B.3 rows 15-17, D.13). Only ``"settled"`` has a row.

    post: _ in ("settled", "unsettled")
    post: (_ == "settled") == bool(settled)
    """
    return "settled" if settled else "unsettled"


def record_guard(phase: str, event: str, pin_count: int, settled: bool = True) -> str:
    """The guard outcome of ``event`` on a record in ``phase`` holding ``pin_count`` pins
    (and ``settled`` or not, SPEC D.13): the label :meth:`Table.step` is called with.
    Whether a row exists for it is the table's business: ``("READY", "evict", "pinned")``
    has none, so such a step raises. The production store computes every guarded record
    step through this function (by :func:`record_step`): evict, EVICTING publish, unindex,
    clear, the three unpins and the two host pins.

    Raises PinUnderflowError on an unpin event with no pin left (``pin_count <= 0``).

    Its contract, that it picks exactly the row the reference's reading of the table picks
    (:func:`guard_by_table`), is checked over the real table by :func:`check_record_step`
    and by the ``diff_guard_*`` pair, not by ``post:`` lines here: CrossHair trusts a
    callee's contract instead of running its body when it analyses the caller, so a
    contract here would hide this body from the harness; and over symbolic strings the
    check costs 5x more and stops short of covering every path.
    """
    if event in _UNPIN_EVENTS:
        return unpin_guard(phase, pin_count)
    if event in _HOST_PIN_EVENTS:
        return settle_guard(settled)
    if event == "evict" or (event == "publish" and phase == EVICTING):
        return store_guard(pin_count)
    if event in ("unindex", "clear"):
        return index_guard(phase, pin_count)
    return NO_GUARD


def guard_holds(guard: str, pin_count: int, settled: bool = True) -> bool:
    """Whether a row's guard label holds for a record holding ``pin_count`` pins *before*
    the event (and ``settled`` or not), read literally off the table's legend."""
    if guard == NO_GUARD:
        return True
    if guard == "settled":
        return bool(settled)
    if guard == "unsettled":
        return not settled
    if guard == "pinned":
        return pin_count > 0
    if guard == "unpinned":
        return pin_count == 0
    if guard == "last":
        return pin_count == 1
    if guard == "more":
        return pin_count > 1
    return False


def guard_by_table(phase: str, event: str, pin_count: int, settled: bool = True) -> str:
    """Reference formulation of :func:`record_guard`, the one the reference model calls:
    scan the RECORD table for the rows of ``(phase, event)`` and return the guard of the
    first whose label holds (:func:`guard_holds`). When none holds, the step is illegal and
    the label returned is the one the legend gives ``pin_count`` in the family those rows
    use, so that the step raises naming it (an EVICTING publish holding a pin: "pinned");
    ``"-"`` when the table has no row for ``(phase, event)`` (or no label of the family
    holds: an unpin with no pin left, which the caller refuses first). Literal and slow on
    purpose."""
    used: str | None = None
    for row in RECORD.rows:
        if row.phase == phase and row.event == event:
            if guard_holds(row.guard, pin_count, settled):
                return row.guard
            used = row.guard
    for family in _LEGEND:
        if used in family:
            for label in family:
                if guard_holds(label, pin_count, settled):
                    return label
    return NO_GUARD


def record_step(phase: str, event: str, pin_count: int, settled: bool = True) -> Row:
    """The RECORD row a record in ``phase`` with ``pin_count`` pins (``settled`` or not)
    takes on ``event``: how the production store takes every guarded record row.

    Raises IllegalTransitionError when the table has no row for the computed guard, and
    PinUnderflowError on an unpin with no pin left. The lifecycle's safety rules over the
    real table are the contracts of :func:`check_record_step`.
    """
    return RECORD.step(phase, event, record_guard(phase, event, pin_count, settled))


def is_evictable(phase: str, pin_count: int, is_protected: bool = False) -> bool:
    """Whether a record may be chosen as an LRU victim: READY, unpinned and not the
    protected record (SPEC B.3 rows 12, 14, 22). The production store's predicate (its
    victim heap, its evictable count, ``has_available_units``).

    pre: pin_count >= 0
    post: _ == (phase == "READY" and store_guard(pin_count) == "unpinned" and not is_protected)
    post: not _ or RECORD.has(phase, "evict", store_guard(pin_count))
    """
    return not is_protected and phase == READY and pin_count == 0


def evictable_by_table(phase: str, pin_count: int, is_protected: bool) -> bool:
    """Reference formulation of :func:`is_evictable`, the one the reference model calls:
    the record is not the protected one and the table has an ``evict`` row for it (the
    guard :func:`guard_by_table` reads for its phase and pin count)."""
    if is_protected:
        return False
    return RECORD.has(phase, "evict", guard_by_table(phase, "evict", pin_count))


# ---------------------------------------------------------------------------------------
# Availability (SPEC B.3 rows 14, 22)
# ---------------------------------------------------------------------------------------


def units_available_by_walk(count: int, num_free: int, images: Iterable[bool], upc: int) -> bool:
    """Reference formulation of :func:`units_available`, the one the reference model calls,
    as ATOM's store computes it: walk the LRU (``images`` yields each record's evictable
    flag, oldest first; read only when ``count`` units are not free), crediting ``upc``
    (units per checkpoint) per evictable image against the shortfall.

    pre: count >= 0
    pre: num_free >= 0
    pre: upc >= 1
    """
    if count <= num_free:
        return True
    shortfall = count - num_free
    for evictable in images:
        if evictable:
            shortfall -= upc
            if shortfall <= 0:
                return True
    return False


def _walk_over_evictable(
    count: int, num_free: int, evictable_images: int, units_per_checkpoint: int
) -> bool:
    """The walk over ``evictable_images`` images, every one evictable."""
    return units_available_by_walk(count, num_free, [True] * evictable_images, units_per_checkpoint)


def units_available(
    count: int, num_free: int, evictable_images: int, units_per_checkpoint: int
) -> bool:
    """Whether ``count`` units are free or could be freed by evicting ``evictable_images``
    whole images of ``units_per_checkpoint`` units each: the closed form the production
    store's ``has_available_units`` computes from its counters, O(1).

    pre: count >= 0
    pre: num_free >= 0
    pre: evictable_images >= 0
    pre: units_per_checkpoint >= 1
    post: _ == _walk_over_evictable(count, num_free, evictable_images, units_per_checkpoint)
    post: count > num_free or _
    """
    return count <= num_free + evictable_images * units_per_checkpoint


# ---------------------------------------------------------------------------------------
# G7: was_reclaimed fails closed
# ---------------------------------------------------------------------------------------


def forfeit_untrusted(in_forfeited: bool, generation: int, watermark: int, live: bool) -> bool:
    """``was_reclaimed(op)`` of the production store: True when ``op`` is in the exact
    forfeit memory, or when its generation is at or below the watermark (the memory
    overflowed past it) and it is not a live operation. Fails closed: an old op the memory
    forgot is treated as reclaimed.

    post: not in_forfeited or _
    post: in_forfeited or not live or not _
    post: in_forfeited or generation <= watermark or not _
    post: _ or live or in_forfeited or generation > watermark
    """
    return in_forfeited or (generation <= watermark and not live)


def reclaimed_by_cases(in_forfeited: bool, generation: int, watermark: int, live: bool) -> bool:
    """Reference formulation of :func:`forfeit_untrusted`, the one the reference model
    calls: G7 read case by case. An op the exact memory holds was reclaimed; a live op was
    not; the memory forgets only ops at or below the watermark, so an op above it that the
    memory does not hold was never reclaimed; any other op may have been forgotten, and
    counts as reclaimed (fail closed)."""
    if in_forfeited:
        return True
    if live:
        return False
    if generation > watermark:
        return False
    return True


# ---------------------------------------------------------------------------------------
# Harness over the real RECORD table. Phases and events are finite: CrossHair gets them as
# indices (cheap) instead of symbolic strings (z3 string theory: ~5x slower, and it stops
# short of covering every path at the effort bound). Only ``pin_count`` is unbounded.
# ---------------------------------------------------------------------------------------


def _nth(items: tuple[str, ...], index: int) -> str:
    """``items[index]``, found by comparing ``index`` with each position: under CrossHair a
    symbolic index then forks into one path per position, each with a concrete string
    (``items[index]`` would keep the string symbolic, and z3's string theory is slow)."""
    for i, item in enumerate(items):
        if i == index:
            return item
    raise IndexError(index)


def _table_choice(
    phase_index: int, event_index: int, pin_count: int, settled: bool = True
) -> str | None:
    """The guard of the row the reference's reading takes; ``None`` when none applies."""
    phase, event = _nth(RECORD.phases, phase_index), _nth(RECORD.events, event_index)
    guard = guard_by_table(phase, event, pin_count, settled)
    return guard if RECORD.has(phase, event, guard) else None


def _guard_of(row: Row | None) -> str | None:
    return None if row is None else row.guard


def check_record_step(
    phase_index: int, event_index: int, pin_count: int, settled: bool = True
) -> Row | None:
    """:func:`record_step` (the production store's) on ``RECORD.phases[phase_index]``,
    ``RECORD.events[event_index]``; ``None`` where it raises IllegalTransitionError (no row
    for the computed guard).

    The contracts: the computed guard picks exactly the row the reference's reading of the
    table (:func:`guard_by_table`) picks, or none when that has none; pins never go
    negative; pins are taken only on READY records (G11); a host reader's pin only on a
    settled one (D.13); units are released only when no
    pin is left (G11, C.11); a record holding a pin stays READY or EVICTING. The domain is
    the reachable one: only READY and EVICTING records hold pins (SPEC C).

    pre: 0 <= phase_index < len(RECORD.phases)
    pre: 0 <= event_index < len(RECORD.events)
    pre: pin_count >= 0
    pre: pin_count == 0 or RECORD.phases[phase_index] in ("READY", "EVICTING")
    raises: PinUnderflowError
    post: _guard_of(_) == _table_choice(phase_index, event_index, pin_count, settled)
    post: _ is None or _.event not in ("pin_offload", "pin_lease") or settled
    post: _ is None or _.key[:2] == (RECORD.phases[phase_index], RECORD.events[event_index])
    post: _ is None or _.next in RECORD.phases
    post: _ is None or pin_count + _.pin_delta >= 0
    post: _ is None or _.pin_delta <= 0 or _.phase == "READY"
    post: _ is None or _.units != "release" or pin_count + _.pin_delta == 0
    post: _ is None or pin_count + _.pin_delta == 0 or _.next in ("READY", "EVICTING")
    """
    try:
        phase, event = _nth(RECORD.phases, phase_index), _nth(RECORD.events, event_index)
        return record_step(phase, event, pin_count, settled)
    except IllegalTransitionError:
        return None


# ---------------------------------------------------------------------------------------
# diffbehavior pairs (``make contracts``): each runs the reference model's helper (``*_by_*``
# side) and the production store's helper (other side) behind one domain guard, the same in
# both wrappers: crosshair diffbehavior builds arguments from the signature and ignores pre:.
# A wrapper answers ``None`` outside the domain.
#
#   contracts-diff-guards     diff_guard_by_table      guard_by_table       vs record_guard
#   contracts-diff-evictable  diff_evictable_by_table  evictable_by_table   vs is_evictable
#   contracts-diff-units      diff_units_by_walk       units_available_by_walk
#                                                                           vs units_available
#   contracts-diff-reclaimed  diff_reclaimed_by_cases  reclaimed_by_cases   vs forfeit_untrusted
# ---------------------------------------------------------------------------------------


def _units_domain(count: int, num_free: int, images: list[bool], units_per_checkpoint: int) -> bool:
    return count >= 0 and num_free >= 0 and units_per_checkpoint >= 1


def diff_units_by_walk(
    count: int, num_free: int, images: list[bool], units_per_checkpoint: int
) -> bool | None:
    """``has_available_units`` pair, reference side: :func:`units_available_by_walk` over
    the LRU's evictable flags ``images``."""
    if not _units_domain(count, num_free, images, units_per_checkpoint):
        return None
    return units_available_by_walk(count, num_free, images, units_per_checkpoint)


def diff_units_closed(
    count: int, num_free: int, images: list[bool], units_per_checkpoint: int
) -> bool | None:
    """``has_available_units`` pair, production side: :func:`units_available` given the
    number of evictable images (the production store keeps it as a counter)."""
    if not _units_domain(count, num_free, images, units_per_checkpoint):
        return None
    return units_available(count, num_free, sum(images), units_per_checkpoint)


def _guard_domain(phase_index: int, event_index: int, pin_count: int) -> bool:
    return (
        0 <= phase_index < len(RECORD.phases)
        and 0 <= event_index < len(RECORD.events)
        and pin_count >= 0
        and not (RECORD.events[event_index] in _UNPIN_EVENTS and pin_count == 0)
    )


def diff_guard_by_table(
    phase_index: int, event_index: int, pin_count: int, settled: bool
) -> str | None:
    """Guard pair, reference side: the guard :func:`guard_by_table` reads when the table
    has that row; ``None`` when it has not (the step raises). An unpin with no pin left is
    outside the domain: both stores refuse it before any guard is read."""
    if not _guard_domain(phase_index, event_index, pin_count):
        return None
    phase, event = RECORD.phases[phase_index], RECORD.events[event_index]
    guard = guard_by_table(phase, event, pin_count, settled)
    return guard if RECORD.has(phase, event, guard) else None


def diff_guard_computed(
    phase_index: int, event_index: int, pin_count: int, settled: bool
) -> str | None:
    """Guard pair, production side: :func:`record_guard` (what :func:`record_step` steps
    with) when the table has that row; ``None`` when it has not."""
    if not _guard_domain(phase_index, event_index, pin_count):
        return None
    phase, event = RECORD.phases[phase_index], RECORD.events[event_index]
    guard = record_guard(phase, event, pin_count, settled)
    return guard if RECORD.has(phase, event, guard) else None


def _evictable_domain(phase_index: int, pin_count: int) -> bool:
    return 0 <= phase_index < len(RECORD.phases) and pin_count >= 0


def diff_evictable_by_table(phase_index: int, pin_count: int, is_protected: bool) -> bool | None:
    """Victim pair, reference side: :func:`evictable_by_table`."""
    if not _evictable_domain(phase_index, pin_count):
        return None
    return evictable_by_table(_nth(RECORD.phases, phase_index), pin_count, is_protected)


def diff_evictable_computed(phase_index: int, pin_count: int, is_protected: bool) -> bool | None:
    """Victim pair, production side: :func:`is_evictable`."""
    if not _evictable_domain(phase_index, pin_count):
        return None
    return is_evictable(_nth(RECORD.phases, phase_index), pin_count, is_protected)


def _reclaimed_domain(generation: int, watermark: int) -> bool:
    # Operation generations start at 1; the watermark at 0 and only rises to a generation.
    return generation >= 1 and watermark >= 0


def diff_reclaimed_by_cases(
    in_forfeited: bool, generation: int, watermark: int, live: bool
) -> bool | None:
    """``was_reclaimed`` pair, reference side: :func:`reclaimed_by_cases`."""
    if not _reclaimed_domain(generation, watermark):
        return None
    return reclaimed_by_cases(in_forfeited, generation, watermark, live)


def diff_reclaimed_computed(
    in_forfeited: bool, generation: int, watermark: int, live: bool
) -> bool | None:
    """``was_reclaimed`` pair, production side: :func:`forfeit_untrusted`."""
    if not _reclaimed_domain(generation, watermark):
        return None
    return forfeit_untrusted(in_forfeited, generation, watermark, live)
