"""Rank 1, the receiver (decode): :class:`Receiver` (check, reserve, suspend, land, adopt
or abort, restore and check) and its loop over the rounds (:func:`_receiver_loop`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pagedstate.spec.errors import InvalidArgumentError

from .config import TransferConfig, _need_config, image_key
from .errors import LayoutMismatchError, PayloadLost, TransferError, WireError, _need
from .giveup import _Accepted, _fail_rounds, _give_up_rounds
from .side import Incoming, _in_state, _round_of, _Side
from .timing import _baseline, _counted, _Phases, _warm_up
from .wire import (
    _REASON,
    ACCEPT,
    CTRL_LEN,
    HEADER_LEN,
    KIND_END,
    KIND_PAYLOAD,
    KIND_ROUND,
    MAGIC,
    REFUSE,
    VERSION,
    ImageHeader,
    Link,
    LoadOperationId,
    Refusal,
    Reply,
    _go_length,
    _hello,
    _hello_tail,
)

_LOCAL_SALT = 0x10CA_15EE_D5A1_7000


class Receiver(_Side):
    """Rank 1: reserves, receives, adopts, restores and checks images (module doc).

    Args:
        cfg: the run.
        device: this rank's device.

    Raises:
        TransferError: ``local_restore`` and the pool cannot hold the local image.
    """

    def __init__(self, cfg: TransferConfig, device: str = "cpu") -> None:
        _need_config(cfg)
        units = cfg.units if cfg.receiver_units is None else cfg.receiver_units
        super().__init__(cfg, units, device, cfg.receiver_block_tokens)
        self.local_key = image_key(cfg.seed ^ _LOCAL_SALT, 0)
        if cfg.local_restore:
            self.store_images([self.local_key])
        self._attempt = 0
        #: Live-KV tenant units (``fault="receiver_full"``): (unit, owner).
        self.tenant: list[tuple[int, Any]] = []

    def check(self, header: ImageHeader) -> str:
        """Why ``header`` cannot be received here (a :data:`REASONS` name), or ``"ok"``.
        Pure."""
        if header.digest != self.digest:
            return "layout"
        if header.image_bytes != self.layout.image_bytes:
            return "bytes"
        if header.units != self.units_per_image:
            return "units"
        if not 0 <= header.index < self.cfg.images or header.variant not in (0, 1):
            return "bad_header"
        return "ok"

    def accept(self, header: ImageHeader, slot: int) -> Incoming | Refusal:
        """Reserve units for ``header``'s image and suspend the restore queued into ``slot``
        (SPEC D.12 steps 1-2). A :class:`Refusal` (the header does not match this layout, or
        no room can be made) changes nothing.

        Raises:
            InvalidArgumentError: ``header`` is not an :class:`ImageHeader` or ``slot`` not an
                int in ``[0, slots)``; nothing changed.
        """
        _need(header, ImageHeader, "header")
        if type(slot) is not int or not 0 <= slot < self.cfg.slots:
            raise InvalidArgumentError(
                f"slot must be an int in [0, {self.cfg.slots}), got {slot!r}"
            )
        reason = self.check(header)
        if reason != "ok":
            return Refusal(header.index, reason)
        self._attempt += 1
        owner = LoadOperationId(header.prefix_hash, self._attempt)
        units = self.coord.reserve_transfer_units(owner)
        if units is None:
            return Refusal(header.index, "no_room")
        try:
            suspended = self.coord.suspend_queued_restore(slot)
        except BaseException:
            self.coord.release_transfer_units(owner)
            raise
        return Incoming(header, owner, tuple(units), slot, suspended)

    def _views(self, inc: Incoming) -> list[Any]:
        t = self.tensors
        return [t.unit_region(r, inc.units[u])[:n] for u, r, n in self.pieces]

    def buffers(self, inc: Incoming, staging: Any | None) -> list[Any]:
        """Where ``inc``'s bytes are received: ``[staging]`` (staged) or the reserved units'
        region views (``staging`` None).

        Raises:
            InvalidArgumentError: ``inc`` is not an :class:`Incoming` or ``staging`` not None
                nor a staging buffer of this rank.
            TransferError: ``inc`` is not reserved."""
        _need(inc, Incoming, "inc")
        if staging is not None:
            self._staging(staging)
        _in_state(inc, "reserved")
        self._holds(inc)
        return self._views(inc) if staging is None else [self.wire(staging)]

    def land(self, inc: Incoming, staging: Any | None) -> None:
        """The bytes arrived: scatter ``staging`` into the reserved units (staged; one
        ``_foreach_copy_``), or nothing to do (``staging`` None: received in place).

        Raises:
            InvalidArgumentError: ``inc`` is not an :class:`Incoming` or ``staging`` not None
                nor a staging buffer of this rank; nothing changed.
            TransferError: ``inc`` is not reserved."""
        _need(inc, Incoming, "inc")
        if staging is not None:
            self._staging(staging)
        _in_state(inc, "reserved")
        self._holds(inc)
        if staging is not None and self.rows is not None:
            self.rows.land([inc.units], [self._row_of(staging)])
        elif staging is not None and self.uniform:
            idx = self._unit_index(inc.units)
            grid = self._grid(staging)
            for r, rows in enumerate(self._kv_words):
                rows.index_copy_(0, idx, grid[:, r])
        elif staging is not None:
            views = self._views(inc)
            parts = list(self.wire(staging).split(self.piece_bytes))
            foreach = getattr(self.torch, "_foreach_copy_", None)
            if foreach is not None:
                foreach(views, parts)
            else:  # pragma: no cover - every torch this project supports has it
                for v, p in zip(views, parts, strict=True):
                    v.copy_(p)
        inc.state = "landed"

    def land_round(self, incs: Sequence[Incoming], base: int = 0) -> None:
        """:meth:`land` of ``staging[base + k]`` into ``incs[k]``'s units for every image of
        a round (staged payloads; ``base``: the round's first buffer, :meth:`buffer_base`):
        with the copy engine (:attr:`rows`) one batch, one launch with Triton; otherwise
        image by image.

        Raises:
            InvalidArgumentError: ``incs`` is not a list or tuple of :class:`Incoming`, names
                one twice, or one this rank did not reserve (another rank's, or its units
                changed), or the round does not fit the staging buffers from ``base``;
                nothing changed.
            TransferError: an image is not reserved; nothing changed."""
        _round_of(incs, Incoming, "incs")
        for inc in incs:
            _in_state(inc, "reserved")
            self._holds(inc)
        self._round_buffers(len(incs), base)
        if self.rows is None:
            for k, inc in enumerate(incs):
                self.land(inc, self.staging[base + k])
            return
        at = None if base == 0 else [base + k for k in range(len(incs))]
        self.rows.land([inc.units for inc in incs], at)
        for inc in incs:
            inc.state = "landed"

    def _holds(self, inc: Incoming) -> None:
        """Raise InvalidArgumentError unless this rank's coordinator holds ``inc``'s
        reservation with exactly ``inc.units`` (not another rank's image, nor one whose
        units were changed): what is written next goes to those units."""
        if self.coord._transfer_units.get(inc.owner) != inc.units:
            raise InvalidArgumentError(
                f"image {inc.header.index}: this rank holds no reservation {inc.owner!r} of"
                f" units {inc.units} (an image of another rank, or its units changed)"
            )

    def adopt(self, inc: Incoming) -> bool:
        """Publish ``inc``'s units as the READY image of its hash (``adopt_transfer_units``)
        and release the suspended restore (SPEC D.12 step 3). False: the hash was already
        READY or pending, the units were released and the canonical image is unchanged.
        If adoption raises, the reservation is released, the suspended restore resumed, and
        the error propagates.

        Raises:
            InvalidArgumentError: ``inc`` is not an :class:`Incoming`.
            TransferError: ``inc`` has not landed."""
        _need(inc, Incoming, "inc")
        _in_state(inc, "landed")
        try:
            adopted: bool = self.coord.adopt_transfer_units(inc.owner, inc.header.prefix_hash)
        except BaseException:
            self.abort(inc)
            raise
        if inc.suspended is not None:
            self.coord.release_suspended_restore(inc.suspended)
        inc.state = "adopted" if adopted else "duplicate"
        return adopted

    def abort(self, inc: Incoming) -> None:
        """Give up ``inc``: release its reservation and resume the suspended restore (SPEC
        D.12 step 4). Idempotent on an aborted image.

        Raises:
            InvalidArgumentError: ``inc`` is not an :class:`Incoming`.
            TransferError: ``inc`` was already adopted, or is quarantined (its receive may
                still land: its units must not be released)."""
        _need(inc, Incoming, "inc")
        if inc.state == "aborted":
            return
        if inc.state in ("adopted", "duplicate", "quarantined"):
            raise TransferError(f"image {inc.header.index} is {inc.state}: nothing to abort")
        self.coord.release_transfer_units(inc.owner)
        inc.state = "aborted"
        if inc.suspended is not None:
            self.coord.resume_suspended_restore(inc.suspended)

    def quarantine(self, inc: Incoming) -> None:
        """Give up ``inc`` when its receive may still land (the data group could not be
        aborted): resume the suspended restore (it writes the slot, which no receive
        targets) but keep the reservation, so its units are never handed to anyone else
        while this process lives. Idempotent on a quarantined image.

        Raises:
            InvalidArgumentError: ``inc`` is not an :class:`Incoming`.
            TransferError: ``inc`` is not reserved (landed, adopted or aborted)."""
        _need(inc, Incoming, "inc")
        if inc.state == "quarantined":
            return
        _in_state(inc, "reserved")
        inc.state = "quarantined"
        if inc.suspended is not None:
            self.coord.resume_suspended_restore(inc.suspended)

    def queue_local(self, slot: int) -> bool:
        """Queue a restore of the local image into ``slot`` (the older local restore a
        transfer suspends); False when the local image is gone (evicted).

        Raises:
            InvalidArgumentError: ``slot`` is not an int in ``[0, slots)``; nothing changed."""
        if type(slot) is not int or not 0 <= slot < self.cfg.slots:
            raise InvalidArgumentError(
                f"slot must be an int in [0, {self.cfg.slots}), got {slot!r}"
            )
        return bool(self.cfg.local_restore and self.coord.begin_restore(self.local_key, slot))

    def fill_with_tenant(self, tag: int) -> int:
        """A live-KV tenant takes every unit it can (``ensure_free_units(1)`` then one unit,
        each its own owner ``("live-kv", tag, n)``). Returns the units taken."""
        taken = 0
        while self.coord.ensure_free_units(1):
            owner = ("live-kv", tag, taken)
            got = self.pool.reserve_units(1, owner)
            if got is None:  # pragma: no cover - ensure_free_units made room
                break
            self.tenant.append((got[0], owner))
            taken += 1
        return taken

    def release_tenant(self) -> None:
        """The tenant gives every unit back."""
        for unit, owner in self.tenant:
            self.pool.release_units([unit], owner)
        self.tenant = []

    def check_slot(self, slot: int, key: int) -> Any:
        """Bytes of ``slot``'s image that differ from ``key``'s (a device scalar: no sync)."""
        return (self.tensors.read_image(slot) != self.image(key)).sum()


def _check_hello(r: Receiver, link: Link) -> None:
    """Read the sender's HELLO (its head, ``layout_id`` and tail) and answer it: ACCEPT, or
    REFUSE with the first field that differs from this rank's (``layout``, ``bytes``,
    ``units``, ``payload``, ``pipeline``, ``window``; ``bad_header`` for another protocol or
    VERSION, refused before the rest is read).

    Raises:
        LayoutMismatchError: refused (after the REFUSE was sent).
        WireError: a message could not be read."""
    torch = r.torch
    hello = link.recv_ints(CTRL_LEN)
    if hello[0] != MAGIC or hello[1] != VERSION or not 0 < hello[5] <= 1 << 16:
        link.send_ints([MAGIC, REFUSE, _REASON["bad_header"], 0])
        raise LayoutMismatchError(f"not a transfer HELLO of version {VERSION}: {hello}")
    lid = torch.empty(hello[5], dtype=torch.uint8)
    link.recv_bytes(lid)
    tail = link.recv_ints(CTRL_LEN)
    theirs = bytes(lid.tolist()).decode("utf-8", errors="replace")
    mine, my_tail = _hello(r), _hello_tail(r.cfg)
    reason = "ok"
    if theirs != r.layout.layout_id or hello[6] != mine[6]:
        reason = "layout"
    elif hello[2] != mine[2] or hello[3] != mine[3]:
        reason = "bytes"
    elif hello[4] != mine[4]:
        reason = "units"
    elif hello[7] != mine[7]:
        reason = "payload"
    elif tail[0] != my_tail[0]:
        reason = "pipeline"
    elif tail[1] != my_tail[1]:
        reason = "window"
    if reason != "ok":
        link.send_ints([MAGIC, REFUSE, _REASON[reason], 0])
        raise LayoutMismatchError(
            f"the sender's layout does not match ({reason}): theirs {theirs!r}, pipeline"
            f" {tail[0]}, window {tail[1]}; mine {r.layout.layout_id!r}, pipeline"
            f" {my_tail[0]}, window {my_tail[1]}"
        )
    link.send_ints([MAGIC, ACCEPT, 0, 0])


class _Run:
    """The receiver's timed loop (:func:`_receiver_loop`): the steps of a round, and the
    rounds in flight (``inflight``: accepted, not yet adopted; with ``pipeline=2`` up to
    two)."""

    def __init__(self, r: Receiver, link: Link) -> None:
        cfg = r.cfg
        self.r, self.link, self.cfg = r, link, cfg
        self.keys = [image_key(cfg.seed, i) for i in range(cfg.images)]
        self.staged = cfg.payload == "staged"
        self.outcome: dict[int, list[str]] = {}
        #: (index, what, key, mismatched bytes: a device scalar)
        self.checks: list[tuple[int, str, int, Any]] = []
        self.refusal_changed: list[int] = []
        self.peer_lost: str | None = None
        self.lost: dict[str, Any] = {}
        # Whether each refusal is checked to change nothing (a snapshot before and after
        # every accept: O(state) each, so only in the run that plants the refusal).
        self.audit = cfg.fault == "receiver_full"
        self.local: dict[str, int] = {"queued": 0, "suspended": 0, "released": 0, "resumed": 0}
        self.ph = _Phases()
        self.rounds = 0
        self.inflight: list[_Accepted] = []

    def open(self, msg: list[int]) -> _Accepted | None:
        """A ROUND message (or END: None): check every header, reserve and suspend (the
        round's destination slots and staging buffers start at its :meth:`buffer_base`).
        The round is in flight from its first accept (:attr:`inflight`).

        Raises:
            WireError: not a ROUND or END, a round out of order or of a bad size."""
        cfg, r = self.cfg, self.r
        head = msg[:CTRL_LEN]
        if head[0] != MAGIC or head[1] not in (KIND_ROUND, KIND_END):
            raise WireError(f"expected a ROUND or END message, got {head}")
        if head[1] == KIND_END:
            if head[2] != self.rounds or head[3] != cfg.images:
                raise WireError(
                    f"an END of {head[2]} rounds and {head[3]} images; {self.rounds} rounds"
                    f" of a run of {cfg.images} images arrived"
                )
            return None
        rnd, count = head[2], head[3]
        if rnd != self.rounds:
            raise WireError(f"round {rnd} arrived; expected round {self.rounds}")
        if not 0 < count <= cfg.window:
            raise WireError(f"a round of {count} images; the window is {cfg.window}")
        self.rounds += 1
        rows = msg[CTRL_LEN : CTRL_LEN + HEADER_LEN * count]
        headers = [
            ImageHeader.from_row(rows[k : k + HEADER_LEN]) for k in range(0, len(rows), HEADER_LEN)
        ]
        if cfg.fault == "receiver_full" and any(h.index == cfg.fault_image for h in headers):
            r.fill_with_tenant(cfg.fault_image)
        rr = _Accepted(rnd, r.buffer_base(rnd))
        self.inflight.append(rr)
        t_accept = time.perf_counter()
        for j, hdr in enumerate(headers):
            slot = rr.base + j
            if r.queue_local(slot):
                self.local["queued"] += 1
                rr.expect[slot] = (hdr.index, "local", r.local_key)
            before = r.coord.snapshot() if self.audit else None
            got = r.accept(hdr, slot)
            if isinstance(got, Refusal):
                if self.audit and r.coord.snapshot() != before:
                    self.refusal_changed.append(hdr.index)
                self.outcome.setdefault(hdr.index, []).append("refused:" + got.reason)
                rr.replies.append(Reply(hdr.index, REFUSE, _REASON[got.reason], r.pool.num_free))
                continue
            if got.suspended is not None:
                self.local["suspended"] += 1
            rr.incs.append(got)
            rr.replies.append(Reply(hdr.index, ACCEPT, 0, r.pool.num_free))
        self.ph.s["accept"] = self.ph.s.get("accept", 0.0) + time.perf_counter() - t_accept
        return rr

    def reply(self, rr: _Accepted) -> None:
        with self.ph("control"):
            self.link.send_ints([v for rep in rr.replies for v in rep.row()])
        rr.replied = True

    def post(self, rr: _Accepted, go: list[int]) -> None:
        """GO of ``rr`` arrived: post its receives (only now: on NCCL a posted receive
        cannot be withdrawn if the sender is lost first).

        Raises:
            WireError: ``go`` is not GO of this round and its accepted images."""
        if go[:4] != [MAGIC, KIND_PAYLOAD, rr.rnd, len(rr.incs)]:
            raise WireError(
                f"expected the PAYLOAD message of round {rr.rnd}, {len(rr.incs)} images, got"
                f" {go[:CTRL_LEN]}"
            )
        r = self.r
        bufs = [
            b
            for k, inc in enumerate(rr.incs)
            for b in r.buffers(inc, r.staging[rr.base + k] if self.staged else None)
        ]
        with self.ph("exchange"):
            rr.posted = self.link.post(bufs, sending=False)

    def settle(self, rr: _Accepted) -> None:
        """``rr``'s payload completed: land, adopt, run the batch, check the slots."""
        r, cfg = self.r, self.cfg
        with self.ph("land"):
            if self.staged:
                r.land_round(rr.incs, rr.base)
            else:
                for inc in rr.incs:
                    r.land(inc, None)
        for inc in rr.incs:
            released = inc.suspended is not None
            with self.ph("adopt"):
                fresh = r.adopt(inc)
            self.local["released"] += released
            r.bytes_moved += inc.header.image_bytes
            self.outcome.setdefault(inc.header.index, []).append(
                "adopted" if fresh else "duplicate"
            )
            rr.expect.pop(inc.slot, None)
            if cfg.verify == "round":
                if not r.coord.begin_restore(inc.header.prefix_hash, inc.slot):
                    raise TransferError(
                        f"image {inc.header.index} was just adopted but is not READY"
                    )
                what = "duplicate" if not fresh else "image"
                rr.expect[inc.slot] = (inc.header.index, what, self.keys[inc.header.index])
        self.inflight.remove(rr)
        with self.ph("batch"):
            r.run_batch()
        if r.tenant:
            r.release_tenant()
        if cfg.verify == "round":
            self._check(rr)

    def _check(self, rr: _Accepted) -> None:
        for slot, (index, what, key) in rr.expect.items():
            self.checks.append((index, what, key, self.r.check_slot(slot, key)))

    def give_up(self, err: WireError) -> None:
        """The sender is lost with :attr:`inflight` rounds in flight: give them all up
        (:func:`_give_up_rounds`) and check their slots."""
        rounds, self.inflight = self.inflight, []
        self.peer_lost = str(err)
        if rounds:
            self.lost = _give_up_rounds(self.r, self.link, rounds, err, self.outcome, self.local)
        for rr in rounds:
            self._check(rr)

    def loop(self) -> None:
        """The rounds, until END or a lost sender. ``pipeline=1``: ROUND, REPLIES, GO, the
        payload, its wait, the landing and adoption, then the next ROUND. ``pipeline=2``:
        GO of round k comes with ROUND of round k+1 (or END): round k's receives are posted,
        round k+1 accepted and answered, and only then is round k's payload waited, landed
        and adopted."""
        link, cfg = self.link, self.cfg
        try:
            with self.ph("wait"):
                msg = link.recv_ints(CTRL_LEN + HEADER_LEN * cfg.window)
        except WireError as e:  # before the first round: nothing is reserved
            self.peer_lost = str(e)
            return
        cur = self._open_or_fail(msg)
        while cur is not None:
            nxt: _Accepted | None = None
            try:
                if not cur.replied:
                    self.reply(cur)
                with self.ph("control"):
                    go = link.recv_ints(_go_length(cfg))
                self.post(cur, go)
                if cfg.pipeline > 1:
                    nxt = self.open(go[CTRL_LEN:])  # round k+1, with round k's payload in flight
                    if nxt is not None:
                        self.reply(nxt)
                with self.ph("exchange"):
                    link.wait(cur.posted)  # type: ignore[arg-type]
            except WireError as e:
                err = e
                if not isinstance(e, PayloadLost) and cur.posted is not None:
                    err = link.cancel(cur.posted, str(e)) or e  # aborted before any release
                self.give_up(err)
                return
            except BaseException:
                self._fail()
                raise
            try:
                self.settle(cur)
            except BaseException:
                self._fail()
                raise
            if cfg.pipeline == 1:
                try:
                    with self.ph("wait"):
                        msg = link.recv_ints(CTRL_LEN + HEADER_LEN * cfg.window)
                except WireError as e:  # between rounds: nothing is reserved
                    self.peer_lost = str(e)
                    return
                nxt = self._open_or_fail(msg)
            cur = nxt

    def _open_or_fail(self, msg: list[int]) -> _Accepted | None:
        """:meth:`open`, and if it raises part-way, the images it accepted are given up."""
        try:
            return self.open(msg)
        except BaseException:
            self._fail()
            raise

    def _fail(self) -> None:
        """The run fails (a step raised), but no reservation or suspended restore of a
        round in flight outlives it (:func:`_fail_rounds`)."""
        rounds, self.inflight = self.inflight, []
        _fail_rounds(self.r, self.link, rounds)


def _receiver_loop(r: Receiver, link: Link) -> dict[str, Any]:
    cfg = r.cfg
    _check_hello(r, link)
    _warm_up(r, link, sending=False)
    link.barrier()
    run = _Run(r, link)
    before = dict(link.messages)
    t0 = time.perf_counter()
    run.loop()
    r.synchronize()
    transfer_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    outcome, checks, keys = run.outcome, run.checks, run.keys
    if cfg.verify == "end" and run.peer_lost is None:
        done = [i for i, o in outcome.items() if o[0] == "adopted"]
        for k in range(0, len(done), cfg.slots):
            chunk = done[k : k + cfg.slots]
            for slot, index in enumerate(chunk):
                if not r.coord.begin_restore(keys[index], slot):
                    raise TransferError(f"image {index} was evicted before it was checked")
            r.run_batch()
            for slot, index in enumerate(chunk):
                checks.append((index, "image", keys[index], r.check_slot(slot, keys[index])))
    bad = [int(c[3].item()) for c in checks]
    r.synchronize()
    verify_s = time.perf_counter() - t1
    mismatches = [[i, w, n] for (i, w, _, _), n in zip(checks, bad, strict=True) if n]
    flat = [o for v in outcome.values() for o in v]
    counts = {
        "adopted": flat.count("adopted"),
        "duplicates": flat.count("duplicate"),
        "refused": sum(o.startswith("refused") for o in flat),
        "aborted": flat.count("aborted"),
    }
    lost = run.lost
    result: dict[str, Any] = {
        "outcome": {str(k): v for k, v in outcome.items()},
        **counts,
        "checked": [[i, w] for i, w, _, _ in checks],
        "mismatches": mismatches,
        "refusal_changed_state": run.refusal_changed,
        "peer_lost": run.peer_lost,
        "lost_payload": lost.get("payload"),
        "given_up_rounds": lost.get("rounds", []),
        "quarantined": lost.get("quarantined", []),
        "late_writes": lost.get("late_writes"),
        "local": run.local,
        "rounds": run.rounds,
        "pipeline": cfg.pipeline,
        "transfer_s": transfer_s,
        "phases_s": run.ph.s,
        "verify_s": verify_s,
        "bytes_received": r.bytes_moved,
    }
    if run.peer_lost is None:
        summary = [counts["adopted"], counts["duplicates"], counts["refused"], counts["aborted"]]
        link.send_ints(summary + [len(mismatches), len(checks), 0, 0])
    result["control_messages"] = _counted(link, before, run.rounds)
    if run.peer_lost is None and cfg.baseline:
        result["baseline_s"] = _baseline(r, link, cfg.rounds(), sending=False)
    return result
