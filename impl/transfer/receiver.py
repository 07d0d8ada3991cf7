"""Rank 1, the receiver (decode): :class:`Receiver` (check, reserve, suspend, land, adopt
or abort, restore and check) and its loop over the rounds (:func:`_receiver_loop`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pagedstate.spec.errors import InvalidArgumentError

from .config import TransferConfig, _need_config, image_key
from .errors import LayoutMismatchError, PayloadLost, TransferError, WireError, _need
from .side import Incoming, _in_state, _Side
from .timing import _baseline, _Phases, _warm_up
from .wire import (
    _REASON,
    ACCEPT,
    CTRL_LEN,
    HEADER_LEN,
    KIND_ABANDON,
    KIND_END,
    KIND_LATE,
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
    _hello,
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

    def land_round(self, incs: Sequence[Incoming]) -> None:
        """:meth:`land` of ``staging[k]`` into ``incs[k]``'s units for every image of a
        round (staged payloads): with the copy engine (:attr:`rows`) one batch, one launch
        with Triton; otherwise image by image.

        Raises:
            InvalidArgumentError: an element is not an :class:`Incoming`, or more images
                than staging buffers; nothing changed.
            TransferError: an image is not reserved; nothing changed."""
        for inc in incs:
            _need(inc, Incoming, "inc")
            _in_state(inc, "reserved")
        if len(incs) > len(self.staging):
            raise InvalidArgumentError(
                f"a round of {len(incs)} images; there are {len(self.staging)} staging buffers"
            )
        if self.rows is None:
            for k, inc in enumerate(incs):
                self.land(inc, self.staging[k])
            return
        self.rows.land([inc.units for inc in incs])
        for inc in incs:
            inc.state = "landed"

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


def _give_up_round(
    r: Receiver,
    link: Link,
    rnd: int,
    incs: list[Incoming],
    err: WireError,
    outcome: dict[int, list[str]],
    local: dict[str, int],
) -> dict[str, Any]:
    """The round ``rnd`` is lost (``err``: no GO, or its payload failed): give every image of
    it up, the ones whose bytes fully arrived too (nothing of a lost round is landed or
    adopted). The data group was aborted before ``err`` was raised (:meth:`Link.exchange`),
    so the reservations are released (``release_transfer_units``) only now, when nothing can
    land in them; a payload that could not be aborted (``err.aborted`` False) has its
    reservations kept (:meth:`Receiver.quarantine`) and its staging tensors never reused
    (replaced). Every suspended local restore is resumed and run here (the caller checks
    the slots). Then ABANDON tells the sender (best effort), and with
    ``fault="sender_stalls_mid_payload"`` the receiver waits for the sender's late send
    (LATE) and counts the bytes of the round's units and staging tensors that changed since
    the give-up (``late_writes``: must be 0). Returns ``payload``, ``quarantined`` and
    ``late_writes`` for the result."""
    cfg = r.cfg
    staged = cfg.payload == "staged"
    safe = not isinstance(err, PayloadLost) or err.aborted
    out: dict[str, Any] = {"quarantined": []}
    if isinstance(err, PayloadLost):
        out["payload"] = {
            "round": rnd,
            "works_done": err.done,
            "works": err.works,
            "aborted": err.aborted,
            "how": err.how,
        }
    for inc in incs:
        resumed = inc.suspended is not None
        if safe:
            r.abort(inc)
            outcome.setdefault(inc.header.index, []).append("aborted")
        else:
            r.quarantine(inc)
            out["quarantined"].append(inc.header.index)
            outcome.setdefault(inc.header.index, []).append("quarantined")
        local["resumed"] += resumed
    staging = r.staging[: len(incs)] if staged else []
    if not safe and staged:  # a late receive may write them: never use them again
        torch = r.torch
        if r.rows is not None:
            r.new_rows()  # the old rows stay alive in `staging` below, never reused
        else:
            for k in range(len(incs)):
                r.staging[k] = torch.zeros_like(r.staging[k])
    r.run_batch()  # the resumed local restores run (and released units are scrubbed)
    watch = cfg.fault == "sender_stalls_mid_payload" and bool(incs)
    units = [u for inc in incs for u in inc.units]
    before = [r.tensors.read_units(units).clone(), *[t.clone() for t in staging]] if watch else []
    try:
        link.send_ints([MAGIC, KIND_ABANDON, rnd, len(incs), 0, 0, 0, 0])
    except WireError:
        pass  # the sender is gone: nobody to tell
    if watch:
        try:
            late = link.recv_ints(CTRL_LEN)
        except WireError:
            late = []
        if late[:2] == [MAGIC, KIND_LATE]:
            after = [r.tensors.read_units(units), *staging]
            out["late_writes"] = int(
                sum(int((a != b).sum()) for a, b in zip(after, before, strict=True))
            )
    return out


def _receiver_loop(r: Receiver, link: Link) -> dict[str, Any]:
    cfg = r.cfg
    torch = r.torch
    hello = link.recv_ints(CTRL_LEN)
    if hello[0] != MAGIC or hello[1] != VERSION or not 0 < hello[5] <= 1 << 16:
        link.send_ints([MAGIC, REFUSE, _REASON["bad_header"], 0])
        raise LayoutMismatchError(f"not a transfer HELLO: {hello}")
    lid = torch.empty(hello[5], dtype=torch.uint8)
    link.recv_bytes(lid)
    theirs = bytes(lid.tolist()).decode("utf-8", errors="replace")
    mine = _hello(r)
    reason = "ok"
    if theirs != r.layout.layout_id or hello[6] != mine[6]:
        reason = "layout"
    elif hello[2] != mine[2] or hello[3] != mine[3]:
        reason = "bytes"
    elif hello[4] != mine[4]:
        reason = "units"
    elif hello[7] != mine[7]:
        reason = "payload"
    if reason != "ok":
        link.send_ints([MAGIC, REFUSE, _REASON[reason], 0])
        raise LayoutMismatchError(
            f"the sender's layout does not match ({reason}): theirs {theirs!r}, mine"
            f" {r.layout.layout_id!r}"
        )
    link.send_ints([MAGIC, ACCEPT, 0, 0])
    keys = [image_key(cfg.seed, i) for i in range(cfg.images)]
    staged = cfg.payload == "staged"
    outcome: dict[int, list[str]] = {}
    checks: list[tuple[int, str, int, Any]] = []  # (index, what, key, mismatched bytes)
    refusal_changed: list[int] = []
    peer_lost: str | None = None
    lost: dict[str, Any] = {}
    # Whether each refusal is checked to change nothing (a snapshot before and after every
    # accept: O(state) each, so only in the run that plants the refusal).
    audit = cfg.fault == "receiver_full"
    local: dict[str, int] = {"queued": 0, "suspended": 0, "released": 0, "resumed": 0}
    _warm_up(r, link, sending=False)
    link.barrier()
    ph = _Phases()
    t0 = time.perf_counter()
    rounds = 0
    while True:
        try:
            with ph("wait"):
                msg = link.recv_ints(CTRL_LEN + HEADER_LEN * cfg.window)
        except WireError as e:  # between rounds: nothing is reserved
            peer_lost = str(e)
            break
        head = msg[:CTRL_LEN]
        if head[0] != MAGIC or head[1] not in (KIND_ROUND, KIND_END):
            raise WireError(f"expected a ROUND or END message, got {head}")
        if head[1] == KIND_END:
            break
        rounds += 1
        count = head[3]
        if not 0 < count <= cfg.window:
            raise WireError(f"a round of {count} images; the window is {cfg.window}")
        head, rows = msg[:CTRL_LEN], msg[CTRL_LEN : CTRL_LEN + HEADER_LEN * count]
        headers = [
            ImageHeader.from_row(rows[k : k + HEADER_LEN]) for k in range(0, len(rows), HEADER_LEN)
        ]
        if cfg.fault == "receiver_full" and any(h.index == cfg.fault_image for h in headers):
            r.fill_with_tenant(cfg.fault_image)
        replies: list[Reply] = []
        incs: list[Incoming] = []
        expect: dict[int, tuple[int, str, int]] = {}  # slot -> (index, what, key)
        t_accept = time.perf_counter()
        for slot, hdr in enumerate(headers):
            if r.queue_local(slot):
                local["queued"] += 1
                expect[slot] = (hdr.index, "local", r.local_key)
            before = r.coord.snapshot() if audit else None
            got = r.accept(hdr, slot)
            if isinstance(got, Refusal):
                if audit and r.coord.snapshot() != before:
                    refusal_changed.append(hdr.index)
                outcome.setdefault(hdr.index, []).append("refused:" + got.reason)
                replies.append(Reply(hdr.index, REFUSE, _REASON[got.reason], r.pool.num_free))
                continue
            if got.suspended is not None:
                local["suspended"] += 1
            incs.append(got)
            replies.append(Reply(hdr.index, ACCEPT, 0, r.pool.num_free))
        ph.s["accept"] = ph.s.get("accept", 0.0) + time.perf_counter() - t_accept
        bufs = [
            b
            for k, inc in enumerate(incs)
            for b in r.buffers(inc, r.staging[k] if staged else None)
        ]
        try:
            with ph("control"):
                link.send_ints([v for rep in replies for v in rep.row()])
                go = link.recv_ints(CTRL_LEN)
            if go[0] != MAGIC or go[1] != KIND_PAYLOAD or go[3] != len(incs):
                raise WireError(f"expected the PAYLOAD message of {len(incs)} images, got {go}")
            with ph("exchange"):
                link.exchange(bufs, sending=False)
        except WireError as e:
            peer_lost = str(e)
            lost = _give_up_round(r, link, head[2], incs, e, outcome, local)
            for slot, (index, what, key) in expect.items():
                checks.append((index, what, key, r.check_slot(slot, key)))
            break
        try:
            with ph("land"):
                if staged:
                    r.land_round(incs)
                else:
                    for inc in incs:
                        r.land(inc, None)
            for inc in incs:
                released = inc.suspended is not None
                with ph("adopt"):
                    fresh = r.adopt(inc)
                local["released"] += released
                r.bytes_moved += inc.header.image_bytes
                outcome.setdefault(inc.header.index, []).append("adopted" if fresh else "duplicate")
                expect.pop(inc.slot, None)
                if cfg.verify == "round":
                    if not r.coord.begin_restore(inc.header.prefix_hash, inc.slot):
                        raise TransferError(
                            f"image {inc.header.index} was just adopted but is not READY"
                        )
                    what = "duplicate" if not fresh else "image"
                    expect[inc.slot] = (inc.header.index, what, keys[inc.header.index])
        except BaseException:
            # The run fails, but no reservation or suspended restore of the round outlives
            # it: every image not yet adopted is given up (released, local restore resumed).
            for inc in incs:
                if inc.state in ("reserved", "landed"):
                    r.abort(inc)
            raise
        with ph("batch"):
            r.run_batch()
        if r.tenant:
            r.release_tenant()
        if cfg.verify == "round":
            for slot, (index, what, key) in expect.items():
                checks.append((index, what, key, r.check_slot(slot, key)))
    r.synchronize()
    transfer_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    if cfg.verify == "end" and peer_lost is None:
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
    result: dict[str, Any] = {
        "outcome": {str(k): v for k, v in outcome.items()},
        **counts,
        "checked": [[i, w] for i, w, _, _ in checks],
        "mismatches": mismatches,
        "refusal_changed_state": refusal_changed,
        "peer_lost": peer_lost,
        "lost_payload": lost.get("payload"),
        "quarantined": lost.get("quarantined", []),
        "late_writes": lost.get("late_writes"),
        "local": local,
        "rounds": rounds,
        "transfer_s": transfer_s,
        "phases_s": ph.s,
        "verify_s": verify_s,
        "bytes_received": r.bytes_moved,
    }
    if peer_lost is None:
        summary = [counts["adopted"], counts["duplicates"], counts["refused"], counts["aborted"]]
        link.send_ints(summary + [len(mismatches), len(checks), 0, 0])
        if cfg.baseline:
            result["baseline_s"] = _baseline(r, link, cfg.rounds(), sending=False)
    return result
