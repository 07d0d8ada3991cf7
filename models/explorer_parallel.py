"""The explorer's parallel search: :func:`explore_parallel`, the breadth-first search of
:func:`pagedstate.models.explorer.explore` over forked worker processes (Linux). Import it
from :mod:`pagedstate.models.explorer`."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pagedstate.spec.errors import IllegalTransitionError, PagedStateError, PinUnderflowError
from pagedstate.spec.snapshot import Snapshot, check_invariants, check_step_invariants

from .reference import PagedStateCheckpointCoordinator
from .world import Action, Config, World

if TYPE_CHECKING:
    from .explorer import Report

__all__ = ["explore_parallel"]

# --- the parallel search -----------------------------------------------------------------
#
# Level-synchronous breadth-first search over W forked worker processes. A state belongs to
# worker ``hash(key) % W`` (forked processes share Python's hash seed). Each level, every
# worker expands its frontier; successors it owns stay local, the others are pickled to
# their owner (once per key per sender). The owner deduplicates, checks each new state
# (invariants, environment agreement, drain) and queues it for the next level. Parent
# pointers stay with the owner, and the main process walks them to rebuild a trace. The
# first level with a violation ends the search, so a reported trace is a shortest one.
# The last level (at the depth bound, most of the states) is checked but never kept as
# worlds: owned successors are checked where they are generated, the others are pickled in
# chunks as they come and checked by their owner one chunk at a time.
#
# Memory: a state waiting for its expansion is kept as its pickled world (about 2 KB for
# ``default``, where the live world is about 13 KB and its snapshot 3 KB), the frontier and
# a level's local successors alike; it is unpickled when expanded and its snapshot taken
# again (about 50 us per state in all: the search needs several times less memory, so
# ``default`` goes deeper within a memory bound).
#
# Counts: every reply ends with the worker's (queued, at depth bound) states; with a
# progress callback, a worker in the middle of a level also sends ``(_TICK, generated,
# rejected, new, queued, at depth bound)`` (its counts so far in this round) every
# _PROGRESS_EVERY_S (of pagedstate.models.explorer) seconds, so a long level is not silent.

_TICK = "tick"


def _rss_mb(pid: int | str = "self") -> float:
    """The memory of process ``pid`` now (MiB, Linux ``/proc``; 0 if it is gone): its
    proportional set size, so pages a forked worker shares with its parent count once
    between them; its resident size where the kernel has no ``smaps_rollup``."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * _PAGE / 2**20


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _worker(
    wid: int,
    nworkers: int,
    cfg: Config,
    factory: Callable[..., PagedStateCheckpointCoordinator] | None,
    check_drain: bool,
    conn: Any,
    tick_every: float | None = None,
    drain_memo: bool = True,
    memory_cap_mb: float | None = None,
    memory_hit: Any = None,
    time_hit: Any = None,
) -> None:
    import pickle

    gc.disable()

    def out(deadline: float | None) -> bool:
        """Past the deadline, or over this process's share of the memory bound (then
        ``memory_hit``, an event shared with the main process, is set: the resident size
        may fall again once the level's worlds are freed)."""
        if deadline is not None and time.perf_counter() >= deadline:
            time_hit.set()
            return True
        if memory_cap_mb is not None and _rss_mb() >= memory_cap_mb:
            memory_hit.set()
            return True
        return False

    memo: dict[Any, bool] | None = {} if drain_memo else None
    last_tick = [time.perf_counter()]

    def tick(generated: int, rejected: int, new: int, queued: int) -> None:
        """Send the counts so far in this round, at most every ``tick_every`` seconds."""
        if tick_every is None:
            return
        now = time.perf_counter()
        if now - last_tick[0] >= tick_every:
            last_tick[0] = now
            conn.send((_TICK, generated, rejected, new, queued, unkept[0]))

    sink: set[tuple[str, int]] = set()
    parents: dict[Any, tuple[Any, Action] | None] = {}
    # (pickled world, key): states of the next level to expand (module comment, Memory)
    frontier: list[tuple[bytes, Any]] = []
    # (key, parent key, action, pickled world): this worker's own successors of the level
    local: list[tuple[Any, Any, Action | None, bytes]] = []
    dumps, loads, proto = pickle.dumps, pickle.loads, pickle.HIGHEST_PROTOCOL

    def packed(w: World) -> bytes:
        """``w`` pickled without the row sink (a per-process set, set again on unpacking)."""
        w.coord.row_sink = None
        return dumps(w, protocol=proto)

    sent: set[Any] = set()
    goal_checks = [(n, pred) for n, (applies, pred) in _explorer.GOALS.items() if applies(cfg)]
    goals_met: set[str] = set()
    dropped_at_deadline = [0]
    # States of the last level (at the depth bound): checked, counted, never kept.
    unkept = [0]

    def note_goals(s: Snapshot) -> None:
        for n, pred in list(goal_checks):
            if pred(s):
                goals_met.add(n)
                goal_checks.remove((n, pred))

    def check(nkey: Any, w: World, s: Snapshot, keep: bool) -> Any:
        """Check a new state this worker owns (its parent pointer already recorded); queue
        it for the next level unless it is on the last one. A violation, or None."""
        for iname, msg in check_invariants(s):
            return ("Invariant", iname, msg, nkey, None)
        for msg in w.problems():
            return ("Invariant", "environment_agreement", msg, nkey, None)
        if check_drain:
            problems = w.drain_problems(memo)
            if problems:
                return ("Liveness", "drain", problems[0], nkey, None)
        note_goals(s)
        if keep:
            frontier.append((packed(w), nkey))
        else:
            unkept[0] += 1
        return None

    def receive(blobs: list[bytes], deadline: float | None, keep: bool) -> tuple[int, Any]:
        new = 0
        i = 0
        # One blob at a time, so only its worlds are alive at once (the last level is most
        # of the states; its worlds are dropped once checked).
        batches: list[Any] = [local[:]]
        local.clear()
        for b in range(len(blobs) + 1):
            items = batches.pop() if b == 0 else pickle.loads(blobs[b - 1])
            for j, item in enumerate(items):
                if i % 64 == 0 and out(deadline):
                    # Out of time or memory: unchecked states are not counted; they stay on
                    # the frontier.
                    rest = sum(len(pickle.loads(x)) for x in blobs[b:])
                    dropped_at_deadline[0] += len(items) - j + rest
                    return new, None
                i += 1
                tick(0, 0, new, len(frontier) + dropped_at_deadline[0])
                nkey, pkey, action, w = item
                if nkey in parents:
                    continue
                parents[nkey] = None if pkey is None else (pkey, action)
                if type(w) is bytes:  # a local successor, packed
                    w = loads(w)
                w.coord.row_sink = sink
                new += 1
                viol = check(nkey, w, w.snapshot(), keep)
                if viol is not None:
                    return new, viol
            del items
        return new, None

    def expand(
        deadline: float | None, last: bool
    ) -> tuple[int, int, Any, dict[int, list[bytes]], int]:
        """Expand the frontier. With ``last``, the successors are the last level: the ones
        this worker owns are checked here and dropped, the others are pickled in chunks as
        they come, so no level of worlds beyond the frontier is ever alive at once."""
        generated = rejected = new = 0
        outbox: dict[int, list[Any]] = {}
        blobs: dict[int, list[bytes]] = {}
        level_keys: set[Any] = set()
        todo = list(frontier)
        frontier.clear()

        def ship(o: int) -> None:
            blobs.setdefault(o, []).append(
                pickle.dumps(outbox.pop(o), protocol=pickle.HIGHEST_PROTOCOL)
            )

        for i, (blob, key) in enumerate(todo):
            if i % 64 == 0 and out(deadline):
                # Out of time or memory: the rest stays queued (reported as the frontier left).
                frontier.extend(todo[i:])
                break
            todo[i] = None  # type: ignore[call-overload]  # expanded: its bytes can go
            tick(generated, rejected, new, len(todo) - i)
            world = loads(blob)
            del blob
            world.coord.row_sink = sink
            snap = world.snapshot()
            for action in world.actions():
                nxt = world.clone()
                name, args = action
                try:
                    nxt.act(name, *args)
                except (IllegalTransitionError, PinUnderflowError) as exc:
                    return (
                        generated,
                        rejected,
                        ("Table", type(exc).__name__, str(exc), key, action),
                        {},
                        new,
                    )
                except PagedStateError as exc:
                    rejected += 1
                    if nxt.snapshot() != snap:
                        return (
                            generated,
                            rejected,
                            (
                                "Atomicity",
                                name,
                                f"{type(exc).__name__} raised but the state changed",
                                key,
                                action,
                            ),
                            {},
                            new,
                        )
                    continue
                generated += 1
                nkey = nxt.key()
                if nkey in parents or nkey in level_keys:
                    if goal_checks:
                        note_goals(nxt.snapshot())
                    continue
                owner = hash(nkey) % nworkers
                if owner != wid:
                    if goal_checks:
                        # The owner looks at the states it is sent only when they are new
                        # to it; goals invisible to the key are looked for here, as the
                        # serial search looks at every transition until they are met.
                        note_goals(nxt.snapshot())
                    if nkey in sent:
                        continue
                level_keys.add(nkey)
                nsnap = nxt.snapshot()
                for iname, msg in check_step_invariants(snap, nsnap):
                    return (
                        generated,
                        rejected,
                        ("Step invariant", iname, msg, key, action),
                        {},
                        new,
                    )
                nxt.coord.row_sink = None
                if owner == wid:
                    nxt.coord.row_sink = sink
                    if last:
                        parents[nkey] = (key, action)
                        new += 1
                        viol = check(nkey, nxt, nsnap, False)
                        if viol is not None:
                            return generated, rejected, viol, {}, new
                    else:
                        local.append((nkey, key, action, packed(nxt)))
                else:
                    sent.add(nkey)
                    outbox.setdefault(owner, []).append((nkey, key, action, nxt))
                    if last and len(outbox[owner]) >= 256:
                        ship(owner)
            world.coord.row_sink = None
        del todo
        for o in list(outbox):
            ship(o)
        return generated, rejected, None, blobs, new

    def sizes() -> tuple[int, int]:
        # (queued: kept for the next level, or left unchecked at the deadline; at the bound)
        return len(frontier) + dropped_at_deadline[0], unkept[0]

    while True:
        msg = conn.recv()
        op = msg[0]
        if op == "receive":
            got = receive(msg[1], msg[2], msg[3])
            conn.send((*got, *sizes()))
        elif op == "expand":
            got2 = expand(msg[1], msg[2])
            conn.send((*got2, *sizes()))
        elif op == "parent":
            conn.send(parents.get(msg[1], None))
        elif op == "finish":
            conn.send((sink, goals_met, *sizes()))
            return


def explore_parallel(
    config: Config | str,
    *,
    workers: int = 2,
    coordinator_factory: Callable[..., PagedStateCheckpointCoordinator] | None = None,
    max_states: int | None = None,
    max_seconds: float | None = None,
    check_drain: bool = True,
    progress: Callable[[Report], None] | None = None,
    drain_memo: bool = True,
    max_memory_mb: float | None = None,
) -> Report:
    """:func:`explore` over ``workers`` forked processes (Linux; same checks, same report).

    ``max_states`` is honoured at level granularity: the search stops after the first
    level that reaches it. ``max_seconds`` and ``max_memory_mb`` (the search's memory in
    MiB, as proportional set size: each of the ``workers + 1`` processes keeps to an equal
    share) stop it in the middle of a level: ``stopped`` is then ``"time bound"`` or
    ``"memory bound"`` and the states not yet checked are left on the queue. A
    violation's trace is a shortest one (BFS level order), though not necessarily the same
    one the sequential search reports.

    ``progress`` is called with the running report after every level and, in the middle
    of a level, about once a second with the workers' counts so far (a level of
    ``default`` takes minutes). It must not change the report; the final report is the
    same with or without it.

    Raises:
        ValueError: ``workers`` is not an int >= 1, or ``max_memory_mb`` is not a number
            above 0, or is spent before the search (each process's share is not above
            what the calling process already uses: nothing runs).
        KeyError: ``config`` is a name not in :data:`~pagedstate.models.explorer.CONFIGS`.
        RuntimeError: a worker died (e.g. killed for memory: ``default`` beyond depth 10
            takes more than 20 GiB); the others are stopped.
    """
    import multiprocessing
    import pickle
    from multiprocessing.connection import wait

    cfg = _explorer.CONFIGS[config] if isinstance(config, str) else config
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if max_memory_mb is not None and (
        isinstance(max_memory_mb, bool)
        or not isinstance(max_memory_mb, (int, float))
        or not max_memory_mb > 0
    ):
        raise ValueError(f"max_memory_mb must be a number > 0 or None, got {max_memory_mb!r}")
    share = None if max_memory_mb is None else max_memory_mb / (workers + 1)
    if share is not None:
        start_mb = _rss_mb()
        if start_mb >= share:
            # Every worker starts as a fork of this process: the bound is spent before the
            # first state, so the search could only stop at once with nothing checked.
            raise ValueError(
                f"max_memory_mb={max_memory_mb} gives each of the {workers + 1} processes"
                f" {share:.0f} MiB, but this process already uses {start_mb:.0f} MiB before"
                f" the search: raise the bound above {start_mb * (workers + 1):.0f} MiB"
            )
    report = _explorer.Report(config=cfg)
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    memory_hit = ctx.Event()  # set by any process over its share of max_memory_mb
    time_hit = ctx.Event()  # set by a worker that left states unchecked at the deadline
    gc.collect()
    init = cfg.build(coordinator_factory)
    init_key = init.key()
    s0 = init.snapshot()
    for name, msg in check_invariants(s0):
        report.violation = _explorer.Violation("Invariant", name, msg, ())
        return report
    conns = []
    procs = []
    for wid in range(workers):
        parent_conn, child_conn = ctx.Pipe()
        proc = ctx.Process(
            target=_worker,
            args=(
                wid,
                workers,
                cfg,
                coordinator_factory,
                check_drain,
                child_conn,
                None if progress is None else _explorer._PROGRESS_EVERY_S,
                drain_memo,
                share,
                memory_hit,
                time_hit,
            ),
            daemon=True,
        )
        proc.start()
        # The child's end must be closed here (before the next fork), so that a worker
        # that dies shows as an end of file on its pipe instead of a receive that waits
        # for ever.
        child_conn.close()
        conns.append(parent_conn)
        procs.append(proc)

    def dead(w: int, exc: BaseException) -> RuntimeError:
        procs[w].join(timeout=5)
        code = procs[w].exitcode
        if code == -9:
            why = " (SIGKILL: out of memory? reduce the depth bound, or set max_memory_mb)"
        elif code == 1:
            why = " (an exception in the worker: its traceback is above, on stderr)"
        else:
            why = ""
        return RuntimeError(
            f"explore_parallel: worker {w} of {workers} died, exit code {code}{why}"
        )

    def recv(w: int) -> Any:
        try:
            return conns[w].recv()
        except (EOFError, OSError) as exc:
            raise dead(w, exc) from exc

    def send(w: int, msg: Any) -> None:
        try:
            conns[w].send(msg)
        except OSError as exc:
            raise dead(w, exc) from exc

    def trace_to(key: Any, last: Action | None) -> tuple[Action, ...]:
        steps: list[Action] = [] if last is None else [last]
        k = key
        while True:
            owner = hash(k) % workers
            send(owner, ("parent", k))
            entry = recv(owner)
            if entry is None:
                break
            k, act = entry
            steps.append(act)
        return tuple(reversed(steps))

    # Each worker's (queued, at depth bound) as of its last reply.
    shown: list[tuple[int, int]] = [(0, 0)] * workers

    def gather(msgs: list[Any], counts: Callable[[Any], tuple[int, int, int]]) -> list[Any]:
        """Send ``msgs[w]`` to worker ``w``; its replies, in worker order. With ``progress``,
        the workers' interim counts (ticks) are shown while they work, as the report's
        counts before this round plus each worker's latest ones (``counts`` reads a reply's
        generated, rejected and new states)."""
        for w, m in enumerate(msgs):
            send(w, m)
        if progress is None:
            replies = [recv(w) for w in range(workers)]
            for w, r in enumerate(replies):
                shown[w] = (r[-2], r[-1])
            return replies
        base = (report.generated, report.rejected, report.distinct)
        live: list[tuple[int, ...]] = [(0, 0, 0, *shown[w]) for w in range(workers)]
        replies = [None] * workers
        waiting: dict[Any, int] = {c: w for w, c in enumerate(conns)}
        last_shown = time.perf_counter()
        while waiting:
            ready: list[Any] = wait(list(waiting), timeout=max(_explorer._PROGRESS_EVERY_S, 0.01))
            for c in ready:
                w = waiting[c]
                msg = recv(w)
                if msg[0] == _TICK:
                    live[w] = msg[1:]
                else:
                    replies[w] = msg
                    shown[w] = (msg[-2], msg[-1])
                    live[w] = (*counts(msg), *shown[w])
                    del waiting[c]
            now = time.perf_counter()
            if waiting and now - last_shown >= _explorer._PROGRESS_EVERY_S:
                last_shown = now
                report.generated = base[0] + sum(x[0] for x in live)
                report.rejected = base[1] + sum(x[1] for x in live)
                report.distinct = base[2] + sum(x[2] for x in live)
                report.queued = sum(x[3] for x in live)
                report.at_depth_bound = sum(x[4] for x in live)
                report.seconds = now - t0
                progress(report)
        # The caller adds the replies' counts to the report's own.
        report.generated, report.rejected, report.distinct = base
        return replies

    inbox: dict[int, list[bytes]] = {w: [] for w in range(workers)}
    inbox[hash(init_key) % workers].append(
        pickle.dumps([(init_key, None, None, init)], protocol=pickle.HIGHEST_PROTOCOL)
    )
    depth = 0
    violation: tuple[Any, ...] | None = None
    deadline = None if max_seconds is None else t0 + max_seconds
    out_of_time = False

    def over_memory() -> bool:
        if share is None:
            return False
        if _rss_mb() >= share:
            memory_hit.set()
        return bool(memory_hit.is_set())

    finished = False
    try:
        while True:
            last = cfg.max_depth is not None and depth >= cfg.max_depth
            got = gather(
                [("receive", inbox[w], deadline, not last) for w in range(workers)],
                lambda r: (0, 0, r[0]),
            )
            for new, viol, _, _ in got:
                report.distinct += new
                violation = violation or viol
            del got
            if violation is not None:
                break
            report.depth = depth
            report.seconds = time.perf_counter() - t0
            report.queued = sum(q for q, _ in shown)
            report.at_depth_bound = sum(a for _, a in shown)
            if progress is not None:
                progress(report)
            if report.frontier_left == 0:
                report.complete = True
                report.stopped = "complete"
                break
            if over_memory():
                report.stopped = "memory bound"
                break
            if out_of_time or time_hit.is_set():
                report.stopped = "time bound"
                break
            if max_states is not None and report.distinct >= max_states:
                report.stopped = "state bound"
                break
            if cfg.max_depth is not None and depth >= cfg.max_depth:
                report.stopped = "depth bound"
                break
            # The next level is the last: its states are checked but never kept as worlds.
            next_last = cfg.max_depth is not None and depth + 1 >= cfg.max_depth
            got = gather([("expand", deadline, next_last)] * workers, lambda r: (r[0], r[1], r[4]))
            inbox = {w: [] for w in range(workers)}
            for generated, rejected, viol, blobs, new, _, _ in got:
                report.generated += generated
                report.rejected += rejected
                report.distinct += new
                violation = violation or viol
                for target, chunks in blobs.items():
                    inbox[target].extend(chunks)
            del got, blobs
            if violation is not None:
                break
            out_of_time = deadline is not None and time.perf_counter() >= deadline
            depth += 1
        if violation is not None:
            kind, name, msg, key, last = violation
            report.stopped = "violation"
            report.violation = _explorer.Violation(kind, name, msg, trace_to(key, last))
        report.queued = report.at_depth_bound = 0
        for w in range(workers):
            send(w, ("finish",))
            sink, goals, queued, at_bound = recv(w)
            report.rows_hit |= sink
            for g in goals:
                report.goals_met.setdefault(g, report.distinct)
            report.queued += queued
            report.at_depth_bound += at_bound
        finished = True
    finally:
        for proc in procs:
            proc.join(timeout=5 if finished else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
    report.seconds = time.perf_counter() - t0
    return report


# Last: pagedstate.models.explorer imports this module at its end (either may come first).
from . import explorer as _explorer  # noqa: E402
