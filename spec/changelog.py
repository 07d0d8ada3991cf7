"""The change-log arithmetic of ``changed_since`` (SPEC B.3 row 23, G6) as a pure function.

A store keeps its generation (bumped once per change of its READY set) and a bounded log
of the last bumps, ``(generation, prefix_hash)``, where ``None`` stands for a ``clear``
that changed every hash at once. ``changed_since(since)`` answers with the hashes whose
READY state changed after ``since``, or ``None`` when that cannot be known: the log no
longer reaches back to ``since + 1``, or a clear happened after ``since``.

:func:`changed_since` is what the production store (``impl/store.py``) calls, on its bounded
deque, with no copy: it reads the log backwards from the newest bump and stops at
``since``, so it costs the number of changes it reports. :func:`changed_since_by_scan` is
the deliberately literal formulation the reference model calls (look up every generation
after ``since`` one by one). ``make contracts`` checks the ``pre:``/``post:`` lines below
with ``crosshair check``, and ``crosshair diffbehavior`` compares the two stores' helpers
through the ``diff_changes_*`` pair, which wraps both in one domain guard (diffbehavior
ignores ``pre:`` lines).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ChangeLog", "changed_since", "changed_since_by_scan", "log_is_well_formed"]

#: ``(generation, prefix_hash)`` bumps, oldest first; ``None`` is a clear.
ChangeLog = tuple[tuple[int, int | None], ...]
#: A change log as a store keeps it (the production store: a bounded deque).
ChangeLogView = Sequence[tuple[int, int | None]]


def log_is_well_formed(generation: int, log: ChangeLog) -> bool:
    """What every store's log satisfies: generations strictly increasing, none above the
    store's ``generation``.

    post: _ == (all(g <= generation for g, _h in log) and _increasing(log))
    """
    previous: int | None = None
    for gen, _h in log:
        if gen > generation or (previous is not None and gen <= previous):
            return False
        previous = gen
    return True


def _increasing(log: ChangeLog) -> bool:
    return all(a[0] < b[0] for a, b in zip(log, log[1:], strict=False))


def changed_since(generation: int, log: ChangeLogView, since: int) -> set[int] | None:
    """Hashes whose READY state changed after generation ``since``, given the store's
    ``generation`` and its change ``log``; ``None`` when unknown (SPEC B.3 row 23, G6). The
    production store's ``changed_since``: O(1 + changes after ``since``), reading ``log``
    (any sequence: the store passes its deque) backwards from the newest bump.

    ``since >= generation`` answers the empty set (nothing happened after it). Otherwise
    the log must reach back to ``since + 1`` (its oldest bump at or before it) and hold no
    clear after ``since``. The precondition is :func:`log_is_well_formed`, spelled out (a
    call to a function with contracts in a ``pre:`` line doubles CrossHair's time here).

    pre: all(g <= generation for g, _h in log) and _increasing(log)
    post: since < generation or _ == frozenset()
    post: since >= generation or (_ is None) == (_not_reaching(log, since) or _cleared(log, since))
    post: _ is None or _ == frozenset(h for g, h in log if g > since and h is not None)
    """
    if since >= generation:
        return set()
    if not log or log[0][0] > since + 1:
        return None
    out: set[int] = set()
    for gen, h in reversed(log):
        if gen <= since:
            break
        if h is None:
            return None
        out.add(h)
    return out


def _not_reaching(log: ChangeLogView, since: int) -> bool:
    """The log does not reach back to ``since + 1``."""
    return not log or log[0][0] > since + 1


def _cleared(log: ChangeLogView, since: int) -> bool:
    """A clear happened after ``since``."""
    return any(h is None for g, h in log if g > since)


def changed_since_by_scan(generation: int, log: ChangeLog, since: int) -> set[int] | None:
    """Reference formulation of :func:`changed_since`, the one the reference model calls,
    for a log with one bump per generation: look up each generation ``since + 1 ..
    generation`` in the log; a missing one (fell off the bounded log) or a clear makes the
    answer unknown. Bounded: more generations to cover than log entries cannot all be
    found, so that is unknown at once.
    """
    if since >= generation:
        return set()
    if generation - since > len(log):
        return None
    by_gen = dict(log)
    out: set[int] = set()
    for g in range(since + 1, generation + 1):
        if g not in by_gen:
            return None
        h = by_gen[g]
        if h is None:
            return None
        out.add(h)
    return out


def _consecutive_domain(generation: int, log: ChangeLog) -> bool:
    """A store's log: one bump per generation, consecutive, the newest being ``generation``
    (the store bumps its generation only by appending to the log). Small scope: at most two
    entries, which already place one before and one after ``since``, or a clear on either
    side; the unit tests compare the two formulations exhaustively on longer logs. With
    three, diffbehavior took 25% longer and needed effort 200, not 50, for an off-by-one in
    the reach-back test."""
    if len(log) > 2:
        return False
    if not log:
        return generation >= 0
    if log[-1][0] != generation or log[0][0] < 1:
        return False
    return all(b[0] == a[0] + 1 for a, b in zip(log, log[1:], strict=False))


def diff_changes_by_scan(generation: int, log: ChangeLog, since: int) -> set[int] | None:
    """``changed_since`` pair, reference side: :func:`changed_since_by_scan` (``None``
    outside the domain too)."""
    if not _consecutive_domain(generation, log):
        return None
    return changed_since_by_scan(generation, log, since)


def diff_changes_closed(generation: int, log: ChangeLog, since: int) -> set[int] | None:
    """``changed_since`` pair, production side: :func:`changed_since`, as the production
    store calls it (``None`` outside the domain too)."""
    if not _consecutive_domain(generation, log):
        return None
    return changed_since(generation, log, since)
