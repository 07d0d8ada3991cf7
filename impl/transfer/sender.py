"""Rank 0, the sender (prefill): :class:`Sender` (store, lease, gather, settle) and its
loop over the rounds (:func:`_sender_loop`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pagedstate.spec.errors import InvalidArgumentError

from .config import MID_PAYLOAD_FAULTS, TransferConfig, _need_config, image_key
from .errors import LayoutMismatchError, SenderCrashed, TransferError, WireError, _need
from .side import Outgoing, _in_state, _Side
from .timing import _baseline, _Phases, _warm_up
from .wire import (
    ACCEPT,
    CTRL_LEN,
    KIND_ABANDON,
    KIND_END,
    KIND_LATE,
    KIND_PAYLOAD,
    KIND_ROUND,
    MAGIC,
    REASONS,
    REPLY_LEN,
    ImageHeader,
    Link,
    Reply,
    _hello,
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
        wire = self.wire(buf)
        if out.header.variant:
            wire.bitwise_not_()
        self.coord.release_offload_store_source(out.op)
        out.state = "released"
        return wire

    def gather_round(self, outs: Sequence[Outgoing]) -> list[Any]:
        """:meth:`gather` of ``outs[k]`` into ``staging[k]`` for every image of a round: with
        the copy engine (:attr:`rows`) one batch, one launch with Triton, for the whole
        round; otherwise image by image. Returns the wire views, in order.

        Raises:
            InvalidArgumentError: an element is not an :class:`Outgoing`, or more images
                than staging buffers; nothing changed.
            TransferError: an image is not leased; nothing changed."""
        for o in outs:
            _need(o, Outgoing, "out")
            _in_state(o, "leased")
        if len(outs) > len(self.staging):
            raise InvalidArgumentError(
                f"a round of {len(outs)} images; there are {len(self.staging)} staging buffers"
            )
        if self.rows is None:
            return [self.gather(o, self.staging[k]) for k, o in enumerate(outs)]
        self.rows.gather([o.units for o in outs])
        wires = []
        for k, o in enumerate(outs):
            wire = self.wire(self.staging[k])
            if o.header.variant:
                wire.bitwise_not_()
            self.coord.release_offload_store_source(o.op)
            o.state = "released"
            wires.append(wire)
        return wires

    def regions(self, out: Outgoing) -> list[Any]:
        """The views of ``out``'s unit regions to send in ``regions`` mode (the source pin is
        kept until :meth:`finish`); variant 1 sends inverted copies.

        Raises:
            InvalidArgumentError: ``out`` is not an :class:`Outgoing`.
            TransferError: ``out`` is not leased."""
        _need(out, Outgoing, "out")
        _in_state(out, "leased")
        views = self._views(out)
        return [v.bitwise_not() for v in views] if out.header.variant else views

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


def _mid_payload_fault(
    s: Sender, link: Link, rnd: int, go: list[Outgoing], data: list[Any]
) -> None:
    """The faults of :data:`MID_PAYLOAD_FAULTS`: send the first accepted image's bytes as
    transfers of their own (the receiver's first receives complete, the rest stay posted),
    then die (``SenderCrashed``), or stay silent until the receiver's ABANDON of the round,
    try the rest late, report it (LATE) and fail. Always raises; the caller's ``finally``
    ends every lease of the round.

    Raises:
        SenderCrashed: ``sender_dies_mid_payload``.
        TransferError: ``sender_stalls_mid_payload`` (the message says whether the late send
            completed, which it must not: the receiver aborted its data group first).
        WireError: a control message or the first image's send failed."""
    cfg = s.cfg
    first = 1 if cfg.payload == "staged" else len(s.pieces)
    link.exchange(data[:first], sending=True)
    if cfg.fault == "sender_dies_mid_payload":
        raise SenderCrashed(
            f"the sender dies mid-payload of round {rnd}: image {go[0].header.index}'s bytes"
            f" sent, {len(go) - 1} more image(s) not"
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
    hello = _hello(s)
    link.send_ints(hello)
    link.send_bytes(torch.tensor(list(s.layout.layout_id.encode("utf-8")), dtype=torch.uint8))
    magic, status, reason, _ = link.recv_ints(4)
    if magic != MAGIC or status != ACCEPT:
        raise LayoutMismatchError(
            f"the receiver refused the layout ({REASONS.get(reason, reason)}): {s.layout.layout_id}"
        )
    sent: list[int] = []
    refused: dict[int, str] = {}
    bytes_sent: dict[str, int] = {}
    _warm_up(s, link, sending=True)
    link.barrier()
    ph = _Phases()
    t0 = time.perf_counter()
    rounds = cfg.rounds()
    for rnd, items in enumerate(rounds):
        outs: list[Outgoing] = []
        try:
            with ph("lease"):
                for index, variant in items:
                    outs.append(s.lease(index, variant))
            with ph("control"):
                link.send_ints(
                    _round_message(cfg, [MAGIC, KIND_ROUND, rnd, len(outs), 0, 0, 0, 0], outs)
                )
                rows = _not_abandoned(link.recv_ints(REPLY_LEN * len(outs)))
            replies = [Reply(*rows[k : k + REPLY_LEN]) for k in range(0, len(rows), REPLY_LEN)]
            go: list[Outgoing] = []
            for o, rep in zip(outs, replies, strict=True):
                if rep.index != o.header.index:
                    raise WireError(f"reply for image {rep.index}, expected {o.header.index}")
                if rep.accepted:
                    go.append(o)
                else:
                    refused[o.header.index] = REASONS.get(rep.reason, str(rep.reason))
                    s.finish(o)  # refused before anything was sent: end the lease
            if any(i == cfg.fault_image for i, _ in items):
                if cfg.fault == "sender_dies":
                    raise SenderCrashed(f"the sender dies after leasing round {rnd}")
                if cfg.fault == "sender_stalls":
                    time.sleep(2 * cfg.timeout_s)
            with ph("gather"):
                if cfg.payload == "staged":
                    data = s.gather_round(go)
                else:
                    data = [v for o in go for v in s.regions(o)]
            with ph("control"):
                link.send_ints([MAGIC, KIND_PAYLOAD, rnd, len(go), 0, 0, 0, 0])
            struck = any(i == cfg.fault_image for i, _ in items)
            if cfg.fault == "sender_dies_after_go" and struck:
                raise SenderCrashed(f"the sender dies after GO of round {rnd}, before its payload")
            if cfg.fault in MID_PAYLOAD_FAULTS and struck and len(go) > 1:
                _mid_payload_fault(s, link, rnd, go, data)
            with ph("exchange"):
                link.exchange(data, sending=True)
            with ph("settle"):
                for o in go:
                    s.finish(o)
                    sent.append(o.header.index)
                    s.bytes_moved += o.header.image_bytes
                    key = "resent" if o.header.variant else "sent"
                    bytes_sent[key] = bytes_sent.get(key, 0) + o.header.image_bytes
        finally:
            # The terminal path of every lease of the round, whatever happened above.
            for o in outs:
                s.finish(o)
    link.send_ints(_round_message(cfg, [MAGIC, KIND_END, len(rounds), cfg.images, 0, 0, 0, 0], []))
    transfer_s = time.perf_counter() - t0
    summary = _not_abandoned(link.recv_ints(8))
    result: dict[str, Any] = {
        "sent": sent,
        "refused": refused,
        "prefill_s": prefill_s,
        "transfer_s": transfer_s,
        "phases_s": ph.s,
        "peer_summary": dict(
            zip(
                ("adopted", "duplicates", "refused", "aborted", "mismatches", "verified"),
                summary[:6],
                strict=True,
            )
        ),
        "bytes": bytes_sent,
    }
    if cfg.baseline:
        result["baseline_s"] = _baseline(s, link, rounds, sending=True)
    return result
