"""Rank 0, the sender (prefill): :class:`Sender` (store, lease, gather, settle) and its
loop over the rounds (:func:`_sender_loop`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs

from pagedstate.spec.errors import InvalidArgumentError
from pagedstate.spec.ops import run_units

from .config import MID_PAYLOAD_FAULTS, TransferConfig, _need_config, image_key
from .errors import LayoutMismatchError, SenderCrashed, TransferError, WireError, _need
from .side import Outgoing, _in_state, _round_of, _Side
from .timing import _baseline, _counted, _Phases, _warm_up
from .wire import (
    ACCEPT,
    CTRL_LEN,
    KIND_ABANDON,
    KIND_END,
    KIND_LATE,
    KIND_ROUND,
    MAGIC,
    REASONS,
    REPLY_LEN,
    ImageHeader,
    Link,
    Posted,
    Reply,
    _go_message,
    _hello,
    _hello_tail,
    _round_message,
)


class Sender(_Side):
    """Rank 0: prefills, stores, leases and sends images (module doc).

    Args:
        cfg: the run.
        device: this rank's device (``"cpu"``, ``"cuda:0"``).

    Raises:
        InvalidArgumentError: ``cfg.units`` cannot hold every image.
    """

    def __init__(self, cfg: TransferConfig, device: str = "cpu") -> None:
        _need_config(cfg)
        super().__init__(cfg, cfg.units, device, None)
        need = cfg.images * self.units_per_image
        if cfg.units < need:
            raise InvalidArgumentError(
                f"units ({cfg.units}) must hold all {cfg.images} images of"
                f" {self.units_per_image} units ({need})"
            )
        self.keys = [image_key(cfg.seed, i) for i in range(cfg.images)]
        if len(set(self.keys)) != len(self.keys):  # pragma: no cover - 2**62 keys
            raise InvalidArgumentError(f"seed {cfg.seed} gives two images one prefix hash")

    def prefill(self) -> None:
        """Store every image of the run (READY afterwards)."""
        self.store_images(self.keys)

    def lease(self, index: int, variant: int = 0) -> Outgoing:
        """Lease image ``index`` for sending (``acquire_checkpoint_source``).

        Raises:
            InvalidArgumentError: ``index`` out of range or ``variant`` not 0 or 1.
            TransferError: the image is not READY or already has an operation; nothing
                changed.
        """
        if type(index) is not int or not 0 <= index < len(self.keys):
            raise InvalidArgumentError(
                f"index must be an int in [0, {len(self.keys)}), got {index!r}"
            )
        if type(variant) is not int or variant not in (0, 1):
            raise InvalidArgumentError(f"variant must be 0 or 1, got {variant!r}")
        h = self.keys[index]
        got = self.coord.acquire_checkpoint_source(h)
        if got is None:
            raise TransferError(
                f"image {index} ({h:#x}) cannot be leased: not READY, or an operation of its"
                " hash is still outstanding"
            )
        op, units = got
        header = ImageHeader(
            index, h, self.units_per_image, self.layout.image_bytes, self.digest, variant
        )
        return Outgoing(header, op, tuple(units))

    def _views(self, out: Outgoing) -> list[Any]:
        t = self.tensors
        return [t.unit_region(r, out.units[u])[:n] for u, r, n in self.pieces]

    def gather(self, out: Outgoing, buf: Any) -> Any:
        """Gather ``out``'s image into ``buf`` (uint8, ``image_bytes``) and release its source
        pin (phase 1: later writers of the units run after the gather in stream order).
        Variant 1 inverts every byte of ``buf``. Returns ``buf``.

        Raises:
            InvalidArgumentError: ``out`` is not an :class:`Outgoing` or ``buf`` not a
                staging buffer of this rank (like :attr:`staging`'s); nothing changed.
            TransferError: ``out`` is not leased (its source was released or it settled)."""
        _need(out, Outgoing, "out")
        self._staging(buf)
        _in_state(out, "leased")
        self._holds(out)
        torch = self.torch
        if self.rows is not None:
            self.rows.gather([out.units], [self._row_of(buf)])
        elif self.uniform:
            idx = self._unit_index(out.units)
            for r, rows in enumerate(self._kv_words):
                torch.index_select(rows, 0, idx, out=self._scratch[r])
            self._grid(buf).copy_(self._scratch.transpose(0, 1))
        else:
            torch.cat(self._views(out), out=self.wire(buf))
        return self._gathered(out, buf)

    def _gathered(self, out: Outgoing, buf: Any) -> Any:
        """After ``out``'s bytes were gathered into ``buf``: invert them for variant 1,
        release the source (phase 1) and return the wire view."""
        wire = self.wire(buf)
        if out.header.variant:
            wire.bitwise_not_()
        self.coord.release_offload_store_source(out.op)
        out.state = "released"
        return wire

    def gather_round(self, outs: Sequence[Outgoing], base: int = 0) -> list[Any]:
        """:meth:`gather` of ``outs[k]`` into ``staging[base + k]`` for every image of a
        round (``base``: the round's first buffer, :meth:`buffer_base`): with the copy
        engine (:attr:`rows`) one batch, one launch with Triton, for the whole round;
        otherwise image by image. Returns the wire views, in order.

        Raises:
            InvalidArgumentError: ``outs`` is not a list or tuple of :class:`Outgoing`, names
                one twice, or one this rank did not lease (another rank's, or its units
                changed), or the round does not fit the staging buffers from ``base``;
                nothing changed.
            TransferError: an image is not leased; nothing changed."""
        _round_of(outs, Outgoing, "outs")
        for o in outs:
            _in_state(o, "leased")
            self._holds(o)
        self._round_buffers(len(outs), base)
        if self.rows is None:
            return [self.gather(o, self.staging[base + k]) for k, o in enumerate(outs)]
        at = None if base == 0 else [base + k for k in range(len(outs))]
        self.rows.gather([o.units for o in outs], at)
        return [self._gathered(o, self.staging[base + k]) for k, o in enumerate(outs)]

    def regions(self, out: Outgoing) -> list[Any]:
        """The views of ``out``'s unit regions to send in ``regions`` mode (the source pin is
        kept until :meth:`finish`); variant 1 sends inverted copies.

        Raises:
            InvalidArgumentError: ``out`` is not an :class:`Outgoing`.
            TransferError: ``out`` is not leased."""
        _need(out, Outgoing, "out")
        _in_state(out, "leased")
        self._holds(out)
        views = self._views(out)
        return [v.bitwise_not() for v in views] if out.header.variant else views

    def _holds(self, out: Outgoing) -> None:
        """Raise InvalidArgumentError unless ``out`` is a live lease of this rank's
        coordinator over exactly ``out.units`` (not another rank's lease, nor one whose
        units were changed): the gather reads those units."""
        store = self.coord.store
        pin = store._offload_pins.get(out.op)
        rec = None if pin is None else store.records.get(pin.checkpoint_id)
        if rec is None or run_units(rec.runs) != out.units:
            raise InvalidArgumentError(
                f"image {out.header.index}: this rank holds no lease {out.op!r} of units"
                f" {out.units} (an image of another rank, or its units changed)"
            )

    def finish(self, out: Outgoing) -> None:
        """End ``out``'s lease by its terminal path: release the source (if not yet) and
        settle. Idempotent (a second call changes nothing).

        Raises:
            InvalidArgumentError: ``out`` is not an :class:`Outgoing`."""
        _need(out, Outgoing, "out")
        if out.state == "settled":
            return
        self.coord.release_offload_store_source(out.op)
        self.coord.settle_offload_store(out.op)
        out.state = "settled"


def _not_abandoned(msg: list[int]) -> list[int]:
    """``msg``, unless it is the receiver's ABANDON of a round (it gave the round up after
    its payload was lost, and stopped): a REPLIES or SUMMARY message never starts with
    ``MAGIC``.

    Raises:
        WireError: ``msg`` is an ABANDON."""
    if msg[:2] == [MAGIC, KIND_ABANDON]:
        raise WireError(f"the receiver abandoned round {msg[2]} (its payload was lost)")
    return msg


@attrs.define(eq=False)
class _Round:
    """One round on the sender: its leases (``outs``), the accepted ones (``go``), their
    wire tensors (``data``: views of its staging buffers from ``base``, or region views)
    and its payload once posted (``posted``: in flight until waited)."""

    rnd: int
    items: list[tuple[int, int]]
    base: int
    struck: bool
    outs: list[Outgoing] = attrs.Factory(list)
    go: list[Outgoing] = attrs.Factory(list)
    data: list[Any] = attrs.Factory(list)
    posted: Posted | None = None
    settled: bool = False


class _Run:
    """The sender's timed loop (:func:`_sender_loop`): the steps of a round, and what the
    loop's ``finally`` must end (``live``: every round whose leases may not have ended)."""

    def __init__(self, s: Sender, link: Link) -> None:
        self.s, self.link, self.cfg = s, link, s.cfg
        self.ph = _Phases()
        self.sent: list[int] = []
        self.refused: dict[int, str] = {}
        self.bytes_sent: dict[str, int] = {}
        self.live: list[_Round] = []

    def open(self, rnd: int, items: list[tuple[int, int]]) -> _Round:
        """Lease round ``rnd``'s images (its buffers: :meth:`_Side.buffer_base`)."""
        struck = any(i == self.cfg.fault_image for i, _ in items)
        sr = _Round(rnd, items, self.s.buffer_base(rnd), struck)
        self.live.append(sr)
        with self.ph("lease"):
            for index, variant in items:
                sr.outs.append(self.s.lease(index, variant))
        return sr

    def round_message(self, sr: _Round) -> list[int]:
        head = [MAGIC, KIND_ROUND, sr.rnd, len(sr.outs), 0, 0, 0, 0]
        return _round_message(self.cfg, head, sr.outs)

    def end_message(self, rounds: int) -> list[int]:
        return _round_message(self.cfg, [MAGIC, KIND_END, rounds, self.cfg.images, 0, 0, 0, 0], [])

    def replies(self, sr: _Round) -> None:
        """Read round ``sr``'s REPLIES: the accepted images go on, a refused one's lease ends
        at once (nothing was sent for it).

        Raises:
            WireError: the receiver is gone, abandoned a round, or replied out of order."""
        with self.ph("control"):
            rows = _not_abandoned(self.link.recv_ints(REPLY_LEN * len(sr.outs)))
        replies = [Reply(*rows[k : k + REPLY_LEN]) for k in range(0, len(rows), REPLY_LEN)]
        for o, rep in zip(sr.outs, replies, strict=True):
            if rep.index != o.header.index:
                raise WireError(f"reply for image {rep.index}, expected {o.header.index}")
            if rep.accepted:
                sr.go.append(o)
            else:
                self.refused[o.header.index] = REASONS.get(rep.reason, str(rep.reason))
                self.s.finish(o)  # refused before anything was sent: end the lease

    def before_go(self, sr: _Round) -> None:
        """The faults that strike a round after its REPLIES, before its GO."""
        if sr.struck and self.cfg.fault == "sender_dies":
            raise SenderCrashed(f"the sender dies after leasing round {sr.rnd}")
        if sr.struck and self.cfg.fault == "sender_stalls":
            time.sleep(2 * self.cfg.timeout_s)

    def gather(self, sr: _Round) -> None:
        with self.ph("gather"):
            if self.cfg.payload == "staged":
                sr.data = self.s.gather_round(sr.go, sr.base)
            else:
                sr.data = [v for o in sr.go for v in self.s.regions(o)]

    def after_go(self, sr: _Round, nxt: _Round | None) -> None:
        """The faults that strike a round after its GO (``nxt``: the round whose ROUND
        travelled with that GO, ``pipeline=2``)."""
        cfg = self.cfg
        if cfg.fault == "sender_dies_after_go" and sr.struck:
            raise SenderCrashed(f"the sender dies after GO of round {sr.rnd}, before its payload")
        if cfg.fault in MID_PAYLOAD_FAULTS and sr.struck and len(sr.go) > 1:
            _mid_payload_fault(self, sr, nxt)

    def post(self, sr: _Round) -> None:
        with self.ph("exchange"):
            sr.posted = self.link.post(sr.data, sending=True)

    def settle(self, sr: _Round) -> None:
        """Wait for ``sr``'s payload (its deadline counted from the post), then end its
        accepted leases (phase 2: the terminal report). Idempotent."""
        if sr.settled:
            return
        if sr.posted is not None:
            with self.ph("exchange"):
                self.link.wait(sr.posted)
        with self.ph("settle"):
            for o in sr.go:
                self.s.finish(o)
                self.sent.append(o.header.index)
                self.s.bytes_moved += o.header.image_bytes
                key = "resent" if o.header.variant else "sent"
                self.bytes_sent[key] = self.bytes_sent.get(key, 0) + o.header.image_bytes
        sr.settled = True
        self.live.remove(sr)

    def sequential(self, rounds: list[list[tuple[int, int]]]) -> None:
        """``pipeline=1``: ROUND, REPLIES, gather, GO, payload and its wait, settle; then the
        next round; END after the last (3 control messages per round)."""
        link = self.link
        for rnd, items in enumerate(rounds):
            sr = self.open(rnd, items)
            with self.ph("control"):
                link.send_ints(self.round_message(sr))
            self.replies(sr)
            self.before_go(sr)
            self.gather(sr)
            with self.ph("control"):
                link.send_ints(_go_message(rnd, len(sr.go)))
            self.after_go(sr, None)
            self.post(sr)
            self.settle(sr)
        with self.ph("control"):
            link.send_ints(self.end_message(len(rounds)))

    def pipelined(self, rounds: list[list[tuple[int, int]]]) -> None:
        """``pipeline=2``: round k's payload is posted and, before it is waited, round k+1's
        REPLIES are read and its images gathered (into the other half of the staging
        buffers); GO of round k travels with ROUND of round k+1 (or with END after the
        last), so a round costs 2 control messages. A pre-GO fault of round k+1 first waits
        round k's payload and settles it (the same outcome as with ``pipeline=1``)."""
        link = self.link
        cur = self.open(0, rounds[0])
        with self.ph("control"):
            link.send_ints(self.round_message(cur))
        self.replies(cur)
        self.before_go(cur)
        self.gather(cur)
        for k in range(len(rounds)):
            nxt = self.open(k + 1, rounds[k + 1]) if k + 1 < len(rounds) else None
            tail = self.end_message(len(rounds)) if nxt is None else self.round_message(nxt)
            with self.ph("control"):
                link.send_ints(_go_message(k, len(cur.go)) + tail)
            self.after_go(cur, nxt)
            self.post(cur)
            if nxt is not None:
                self.replies(nxt)  # round k's payload in flight
                if nxt.struck and self.cfg.fault in ("sender_dies", "sender_stalls"):
                    self.settle(cur)
                    self.before_go(nxt)
                self.gather(nxt)  # round k's payload in flight
            self.settle(cur)
            if nxt is None:
                break
            cur = nxt

    def end_all(self) -> None:
        """The loop's ``finally``: a payload still in flight is aborted first (in ``regions``
        mode its sends read the source units, which stay pinned until then), then every
        lease of every round not settled ends by its terminal path (release, settle)."""
        for sr in self.live:
            if sr.posted is not None and sr.posted.state == "posted":
                self.link.cancel(sr.posted, "the sender failed with the payload in flight")
        for sr in self.live:
            for o in sr.outs:
                self.s.finish(o)
        self.live = []


def _mid_payload_fault(run: _Run, sr: _Round, nxt: _Round | None) -> None:
    """The faults of :data:`MID_PAYLOAD_FAULTS`: send the first accepted image's bytes as
    transfers of their own (the receiver's first receives complete, the rest stay posted),
    read the REPLIES of the next round when its ROUND travelled with this GO
    (``pipeline=2``: the receiver has accepted it), then die (``SenderCrashed``), or stay
    silent until the receiver's ABANDON, try the rest late, report it (LATE) and fail.
    Always raises; the loop's ``finally`` ends every lease of both rounds.

    Raises:
        SenderCrashed: ``sender_dies_mid_payload``.
        TransferError: ``sender_stalls_mid_payload`` (the message says whether the late send
            completed, which it must not: the receiver aborted its data group first).
        WireError: a control message or the first image's send failed."""
    s, link, cfg, rnd, data = run.s, run.link, run.cfg, sr.rnd, sr.data
    first = 1 if cfg.payload == "staged" else len(s.pieces)
    link.exchange(data[:first], sending=True)
    if nxt is not None:
        run.replies(nxt)  # the receiver accepted round rnd + 1 with rnd's payload in flight
    if cfg.fault == "sender_dies_mid_payload":
        raise SenderCrashed(
            f"the sender dies mid-payload of round {rnd}: image {sr.go[0].header.index}'s"
            f" bytes sent, {len(sr.go) - 1} more image(s) not"
            + (f"; round {nxt.rnd} accepted" if nxt is not None else "")
        )
    msg = link.recv_ints(CTRL_LEN)  # silent until the receiver has given the round up
    if msg[:3] != [MAGIC, KIND_ABANDON, rnd]:
        raise WireError(f"expected the receiver's ABANDON of round {rnd}, got {msg}")
    try:
        link.exchange(data[first:], sending=True)
        late = "completed"
    except WireError as e:
        late = f"failed ({e})"
    link.send_ints([MAGIC, KIND_LATE, rnd, int(late == "completed"), 0, 0, 0, 0])
    raise TransferError(
        f"the receiver abandoned round {rnd} (the sender stalled mid-payload); the late send"
        f" of the rest {late}"
    )


def _sender_loop(s: Sender, link: Link) -> dict[str, Any]:
    cfg = s.cfg
    torch = s.torch
    t0 = time.perf_counter()
    s.prefill()
    s.synchronize()
    prefill_s = time.perf_counter() - t0
    link.send_ints(_hello(s))
    link.send_bytes(torch.tensor(list(s.layout.layout_id.encode("utf-8")), dtype=torch.uint8))
    link.send_ints(_hello_tail(cfg))
    magic, status, reason, _ = link.recv_ints(4)
    if magic != MAGIC or status != ACCEPT:
        raise LayoutMismatchError(
            f"the receiver refused the layout ({REASONS.get(reason, reason)}): {s.layout.layout_id}"
            f" (pipeline {cfg.pipeline}, window {cfg.window})"
        )
    _warm_up(s, link, sending=True)
    link.barrier()
    run = _Run(s, link)
    before = dict(link.messages)
    t0 = time.perf_counter()
    rounds = cfg.rounds()
    try:
        if cfg.pipeline == 1:
            run.sequential(rounds)
        else:
            run.pipelined(rounds)
    finally:
        run.end_all()
    transfer_s = time.perf_counter() - t0
    summary = _not_abandoned(link.recv_ints(8))
    result: dict[str, Any] = {
        "sent": run.sent,
        "refused": run.refused,
        "prefill_s": prefill_s,
        "transfer_s": transfer_s,
        "phases_s": run.ph.s,
        "pipeline": cfg.pipeline,
        "control_messages": _counted(link, before, len(rounds)),
        "peer_summary": dict(
            zip(
                ("adopted", "duplicates", "refused", "aborted", "mismatches", "verified"),
                summary[:6],
                strict=True,
            )
        ),
        "bytes": run.bytes_sent,
    }
    if cfg.baseline:
        result["baseline_s"] = _baseline(s, link, rounds, sending=True)
    return result
