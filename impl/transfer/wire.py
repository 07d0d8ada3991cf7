"""The wire: control-message layout and codes, the messages (image headers, replies,
refusals, the receive attempt's owner), and :class:`Link`, the point-to-point messages to
the peer rank (the protocol is in the package doc)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from pagedstate.spec.errors import InvalidArgumentError

from .config import _INT64, PAYLOADS, TransferConfig
from .errors import WireError, _module

if TYPE_CHECKING:
    from .side import Outgoing, _Side

MAGIC = 0x5053_5846  # "PSXF"
VERSION = 1
KIND_ROUND = 2
KIND_END = 3
#: "The payload of this round follows": the receiver posts its receives only after it (on
#: NCCL a posted receive cannot be withdrawn, so a sender lost before its payload would
#: leave the receiver in a receive only NCCL's watchdog ends, by killing the process).
KIND_PAYLOAD = 4
CTRL_LEN = 8
HEADER_LEN = 8
REPLY_LEN = 4
ACCEPT = 1
REFUSE = 2
#: Refusal reasons on the wire (code -> name).
REASONS = {
    0: "ok",
    1: "no_room",
    2: "layout",
    3: "bytes",
    4: "units",
    5: "payload",
    6: "bad_header",
}
_REASON = {name: code for code, name in REASONS.items()}


@attrs.frozen
class LoadOperationId:
    """The owner of one receive attempt (SPEC A.3: an owner carries a generation, so a late
    release from an earlier attempt cannot free a newer reservation)."""

    prefix_hash: int
    attempt: int


@attrs.frozen
class ImageHeader:
    """What the sender says about one image before its bytes (one wire row).

    Attributes:
        index: the image's number in the run.
        prefix_hash: its prefix hash (an int64).
        units: ``units_per_checkpoint`` of the sender's layout.
        image_bytes: bytes of the image.
        digest: :func:`layout_digest` of the sender's ``layout_id``.
        variant: 0, or 1 for the duplicate fault's inverted resend.
    """

    index: int
    prefix_hash: int
    units: int
    image_bytes: int
    digest: int
    variant: int = 0

    def row(self) -> list[int]:
        """The wire row (``HEADER_LEN`` int64s).

        Raises:
            InvalidArgumentError: a field is not an int64."""
        vals = [self.index, self.prefix_hash, self.units, self.image_bytes, self.digest]
        vals += [self.variant, 0, 0]
        for v in vals:
            if type(v) is not int or not -_INT64 <= v < _INT64:
                raise InvalidArgumentError(f"header field {v!r} is not an int64 ({self})")
        return vals

    @classmethod
    def from_row(cls, row: Sequence[int]) -> ImageHeader:
        """Parse a wire row (no checks beyond the length: the receiver checks the fields).

        Raises:
            WireError: the row is not ``HEADER_LEN`` long."""
        if len(row) != HEADER_LEN:
            raise WireError(f"an image header has {HEADER_LEN} fields, got {len(row)}")
        return cls(*(int(v) for v in row[:6]))


@attrs.frozen
class Reply:
    """The receiver's answer to one header: ``status`` ACCEPT (1) or REFUSE (2), the refusal
    ``reason`` code (:data:`REASONS`) and its free units after the answer."""

    index: int
    status: int
    reason: int
    free_units: int

    @property
    def accepted(self) -> bool:
        """Whether the receiver reserved units and waits for the bytes."""
        return self.status == ACCEPT

    def row(self) -> list[int]:
        """The wire row (``REPLY_LEN`` int64s)."""
        return [self.index, self.status, self.reason, self.free_units]


@attrs.frozen
class Refusal:
    """An image the receiver refused before anything was received (nothing changed)."""

    index: int
    reason: str


class Link:
    """Point-to-point messages to the peer rank (``1 - rank``): control tensors (int64, CPU)
    on ``ctrl_group``, image bytes on ``data_group`` (None: the default group).

    Every failure of the underlying call raises :class:`WireError` from it.
    """

    def __init__(self, dist: Any, rank: int, ctrl_group: Any, data_group: Any, device: Any):
        self.dist = dist
        self.rank = rank
        self.peer = 1 - rank
        self.ctrl_group = ctrl_group
        self.data_group = data_group
        self.device = device
        self.torch = _module("torch")

    @contextlib.contextmanager
    def _wire(self, what: str) -> Iterator[None]:
        try:
            yield
        except (RuntimeError, OSError) as e:
            raise WireError(f"{what} (rank {self.rank} <-> rank {self.peer}) failed: {e}") from e

    def send_ints(self, values: Sequence[int]) -> None:
        """Send an int64 control message.

        Raises:
            WireError: the send failed."""
        t = self.torch.tensor(list(values), dtype=self.torch.int64)
        with self._wire("control send"):
            self.dist.send(t, self.peer, group=self.ctrl_group)

    def recv_ints(self, n: int) -> list[int]:
        """Receive an int64 control message of ``n`` values.

        Raises:
            WireError: the receive failed or timed out."""
        t = self.torch.empty(n, dtype=self.torch.int64)
        with self._wire("control receive"):
            self.dist.recv(t, self.peer, group=self.ctrl_group)
        return [int(v) for v in t.tolist()]

    def send_bytes(self, t: Any) -> None:
        """Send a uint8 control payload (the layout id)."""
        with self._wire("control send"):
            self.dist.send(t, self.peer, group=self.ctrl_group)

    def recv_bytes(self, t: Any) -> None:
        """Receive a uint8 control payload into ``t``."""
        with self._wire("control receive"):
            self.dist.recv(t, self.peer, group=self.ctrl_group)

    def exchange(self, tensors: Sequence[Any], sending: bool) -> None:
        """Send (or receive into) ``tensors`` as one grouped p2p batch and wait until it has
        completed (on CUDA: an event recorded behind it is synchronized), so the caller may
        report it done.

        Raises:
            WireError: a transfer failed or timed out."""
        if not tensors:
            return
        dist = self.dist
        fn = dist.isend if sending else dist.irecv
        with self._wire("image send" if sending else "image receive"):
            ops = [dist.P2POp(fn, t, self.peer, self.data_group) for t in tensors]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            if self.device.type == "cuda":
                ev = self.torch.cuda.Event()
                ev.record()
                ev.synchronize()

    def barrier(self) -> None:
        """Both ranks reach this point (on the control group).

        Raises:
            WireError: the peer is gone or the timeout expired."""
        with self._wire("barrier"):
            self.dist.barrier(group=self.ctrl_group)


def _round_message(cfg: TransferConfig, head: list[int], outs: Sequence[Outgoing]) -> list[int]:
    """A ROUND (or END) message: the 8-value head, then the round's image headers, padded
    with zeros to ``window`` headers (one fixed-size message per round: one control message
    fewer than a head and a header list of its own)."""
    rows = [v for o in outs for v in o.header.row()]
    return head + rows + [0] * (HEADER_LEN * cfg.window - len(rows))


def _hello(side: _Side) -> list[int]:
    lid = side.layout.layout_id.encode("utf-8")
    payload = PAYLOADS.index(side.cfg.payload)
    lay = side.layout
    return [
        MAGIC,
        VERSION,
        lay.page_unit_bytes,
        lay.image_bytes,
        side.units_per_image,
        len(lid),
        side.digest,
        payload,
    ]
