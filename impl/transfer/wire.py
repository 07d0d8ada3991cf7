"""The wire: control-message layout and codes, the messages (image headers, replies,
refusals, the receive attempt's owner), and :class:`Link`, the point-to-point messages to
the peer rank (the protocol is in the package doc)."""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from pagedstate.spec.errors import InvalidArgumentError

from .config import _INT64, PAYLOADS, TransferConfig
from .errors import PayloadLost, WireError, _module

if TYPE_CHECKING:
    from .side import Outgoing, _Side

MAGIC = 0x5053_5846  # "PSXF"
#: 2: the HELLO is followed by its tail (:func:`_hello_tail`: ``pipeline``, ``window``), and
#: with ``pipeline=2`` a round's GO travels with the next ROUND (or END) in one message.
VERSION = 2
KIND_ROUND = 2
KIND_END = 3
#: "The payload of this round follows": the receiver posts its receives only after it (on
#: NCCL a posted receive cannot be withdrawn, so a sender lost before its payload would
#: leave the receiver in a receive only NCCL's watchdog ends, by killing the process).
KIND_PAYLOAD = 4
#: "I gave this round up" (receiver to sender, after a lost payload: its data group was
#: aborted or could not be, its reservations released or held). Best effort: a dead sender
#: never reads it; a living one may end its leases on it.
KIND_ABANDON = 5
#: The outcome of a stalled sender's late send of the rest of an abandoned round
#: (``fault="sender_stalls_mid_payload"`` only): ``[MAGIC, KIND_LATE, round, completed, ...]``.
KIND_LATE = 6
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
    7: "pipeline",
    8: "window",
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


class _DeadlinePassed(Exception):
    """The data deadline passed with transfers still pending (internal to :class:`Link`)."""


@attrs.define(eq=False)
class Posted:
    """A payload posted on the data group and not waited yet (:meth:`Link.post`): what a
    round in flight owns on the wire. Its buffers (``tensors``) must be neither reused nor,
    for a receive into reserved units, released before :meth:`Link.wait` returned or
    :meth:`Link.cancel` aborted the data group.

    Attributes:
        tensors: the buffers, in posting order.
        sending: True for sends.
        works: the posted works (nccl: one grouped work; gloo: one per tensor).
        finished: per work, whether it is known complete.
        deadline: the monotonic time by which it must complete (``data_timeout_s`` after it
            was posted; inf: none).
        state: ``"posted"``, ``"done"`` (waited: every transfer completed) or ``"lost"``
            (failed or cancelled: the data group was aborted, or could not be).
    """

    tensors: list[Any]
    sending: bool
    works: list[Any]
    finished: list[bool]
    deadline: float
    state: str = "posted"

    @property
    def what(self) -> str:
        return "image send" if self.sending else "image receive"


#: Backends whose p2p works report completion by themselves (``Work.is_completed()``, polled).
#: A gloo send/recv work completes only inside its ``wait()`` (torch 2.13: ``is_completed()``
#: stays False until then, ``get_future()`` is not implemented), so on gloo each work is
#: waited with the time left as its timeout instead.
_POLLED = ("nccl",)
#: Polling pauses (seconds): the first check is immediate, then 20 us doubling up to 100 us
#: (a round of 8 Qwen3-Next images moves in about 1 ms on NVLink: a coarser pause would
#: add a large part of that to every round).
_POLL_FIRST_S = 20e-6
_POLL_MAX_S = 100e-6


class Link:
    """Point-to-point messages to the peer rank (``1 - rank``): control tensors (int64, CPU)
    on ``ctrl_group``, image bytes on ``data_group``, a process group of their own (of
    ``data_backend``: ``"gloo"`` or ``"nccl"``) so that it can be aborted without losing the
    control messages. ``data_group`` None is the default group (then it must not be the
    control group too: an abort would end the control messages; on nccl the default group
    is never aborted).

    A payload is posted (:meth:`post`) and later waited (:meth:`wait`; :meth:`exchange` is
    both at once). It must complete within ``data_timeout_s`` seconds of being posted
    (None: no deadline of the driver's own, only the group's timeout), however late it is
    waited; when it does not, or a transfer fails, the data group is aborted before
    :class:`PayloadLost` is raised (:meth:`abort_data`). A payload given up without a wait
    (the run failed elsewhere while it was in flight) is aborted the same way
    (:meth:`cancel`). ``on_event`` (settable; None: not called) receives one row
    ``["data", "payload", "abort" or "not aborted", how]`` per abort, in the order of the
    side's own rows. ``held``: the works and buffers of payloads that could not be aborted
    (kept alive to the end of the process: a receive may still write them). ``messages``:
    control messages sent and received (``{"sent": n, "received": m}``).

    Every failure of the underlying call raises :class:`WireError` from it.
    """

    def __init__(
        self,
        dist: Any,
        rank: int,
        ctrl_group: Any,
        data_group: Any,
        device: Any,
        *,
        data_backend: str = "gloo",
        data_timeout_s: float | None = None,
    ):
        self.dist = dist
        self.rank = rank
        self.peer = 1 - rank
        self.ctrl_group = ctrl_group
        self.data_group = data_group
        self.device = device
        self.data_backend = data_backend
        self.data_timeout_s = data_timeout_s
        self.data_aborted = False
        self.on_event: Callable[[list[Any]], None] | None = None
        self.held: list[tuple[list[Any], list[Any]]] = []
        self.messages = {"sent": 0, "received": 0}
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
        self.messages["sent"] += 1

    def recv_ints(self, n: int) -> list[int]:
        """Receive an int64 control message of ``n`` values.

        Raises:
            WireError: the receive failed or timed out."""
        t = self.torch.empty(n, dtype=self.torch.int64)
        with self._wire("control receive"):
            self.dist.recv(t, self.peer, group=self.ctrl_group)
        self.messages["received"] += 1
        return [int(v) for v in t.tolist()]

    def send_bytes(self, t: Any) -> None:
        """Send a uint8 control payload (the layout id)."""
        with self._wire("control send"):
            self.dist.send(t, self.peer, group=self.ctrl_group)
        self.messages["sent"] += 1

    def recv_bytes(self, t: Any) -> None:
        """Receive a uint8 control payload into ``t``."""
        with self._wire("control receive"):
            self.dist.recv(t, self.peer, group=self.ctrl_group)
        self.messages["received"] += 1

    def exchange(self, tensors: Sequence[Any], sending: bool) -> None:
        """:meth:`post` then :meth:`wait`: send (or receive into) ``tensors`` on the data
        group and return once every transfer completed.

        Raises:
            PayloadLost: a transfer failed or the deadline passed (the data group was
                aborted first, or could not be: ``aborted``).
            WireError: the data group was aborted by an earlier payload."""
        self.wait(self.post(tensors, sending))

    def post(self, tensors: Sequence[Any], sending: bool) -> Posted:
        """Post sends (or receives into) ``tensors`` on the data group, in order, and return
        at once: the transfers run while the caller does other work (on gloo they move in
        gloo's own threads but complete only inside :meth:`wait`). The deadline starts now.
        On nccl the payload is one grouped p2p batch (``batch_isend_irecv``), on gloo one
        ``isend``/``irecv`` per tensor. No tensors: a payload already done.

        Raises:
            PayloadLost: posting failed (the data group was aborted first, or could not be).
            WireError: the data group was aborted by an earlier payload; nothing posted."""
        posted = Posted(list(tensors), sending, [], [], self._deadline())
        if not tensors:
            posted.state = "done"
            return posted
        if self.data_aborted:
            raise WireError(f"{posted.what}: the data group was aborted by an earlier payload")
        dist = self.dist
        fn = dist.isend if sending else dist.irecv
        try:
            if self.data_backend in _POLLED:
                ops = [dist.P2POp(fn, t, self.peer, self.data_group) for t in tensors]
                posted.works = list(dist.batch_isend_irecv(ops))
                posted.finished = [False] * len(posted.works)
            else:
                for t in tensors:
                    posted.works.append(fn(t, self.peer, group=self.data_group))
                    posted.finished.append(False)
        except (RuntimeError, OSError) as e:
            raise self._lost(posted, str(e)) from e
        return posted

    def wait(self, posted: Posted) -> None:
        """Wait until every transfer of ``posted`` completed (on CUDA: an event recorded
        behind them is synchronized too), so the caller may report it done; bounded by its
        deadline, counted from :meth:`post`. On nccl its work is polled (``is_completed()``,
        pauses of 20 us doubling to 100 us), never a blocking wait; on gloo each work is
        waited with the time left as its timeout (a gloo p2p work completes only inside its
        ``wait``; once the deadline has passed, 1 ms). When a transfer fails or the deadline
        passes, the data group is aborted (:meth:`abort_data`) and only then is the error
        raised. A payload already waited returns at once.

        Raises:
            PayloadLost: a transfer failed or the deadline passed; its ``aborted`` says
                whether nothing can land any more, ``done`` how many transfers completed.
            WireError: ``posted`` was already lost or cancelled."""
        if posted.state == "done":
            return
        if posted.state != "posted":
            raise WireError(f"{posted.what}: the payload was already {posted.state}")
        try:
            if self.data_backend in _POLLED:
                self._poll(posted.works, posted.finished, posted.deadline)
            else:
                self._wait_each(posted.works, posted.finished, posted.deadline)
            if self.device.type == "cuda":
                ev = self.torch.cuda.Event()
                ev.record()
                ev.synchronize()
        except (RuntimeError, OSError, _DeadlinePassed) as e:
            if isinstance(e, _DeadlinePassed):
                cause = f"not completed within the data deadline ({self.data_timeout_s:g} s)"
            else:
                cause = str(e)
            raise self._lost(posted, cause) from e
        posted.state = "done"

    def cancel(self, posted: Posted, cause: str) -> PayloadLost | None:
        """Give ``posted`` up without waiting for it (the run failed elsewhere while it was
        in flight): the data group is aborted (:meth:`abort_data`: nothing of it can land
        any more, or, when it cannot be aborted, its buffers are kept in :attr:`held`).
        Returns the :class:`PayloadLost` that says so (not raised), or None when the payload
        had already been waited (nothing in flight). Never raises."""
        if posted.state == "done":
            return None
        if posted.state == "lost":  # its wait raised already: the same verdict again
            kept = any(works is posted.works for works, _ in self.held)
            return PayloadLost(
                f"{posted.what}: already lost", works=len(posted.works), aborted=not kept
            )
        return self._lost(posted, f"given up before its wait ({cause})")

    def _lost(self, posted: Posted, cause: str) -> PayloadLost:
        """Abort the data group for ``posted`` (keep its buffers when it cannot be), mark it
        lost and return the :class:`PayloadLost` to raise."""
        aborted, how = self.abort_data(posted.works, posted.finished)
        if not aborted:
            self.held.append((posted.works, posted.tensors))
        posted.state = "lost"
        done = sum(posted.finished)
        return PayloadLost(
            f"{posted.what} (rank {self.rank} <-> rank {self.peer}) failed after {done} of"
            f" {len(posted.works)} transfers: {cause}; {how}",
            done=done,
            works=len(posted.works),
            aborted=aborted,
            how=how,
        )

    def _deadline(self) -> float:
        """The monotonic time a payload posted now must complete by (inf: none)."""
        if self.data_timeout_s is None:
            return float("inf")
        return time.monotonic() + self.data_timeout_s

    def _poll(self, works: list[Any], finished: list[bool], deadline: float) -> None:
        """Poll ``works`` until all completed (``wait()`` on each then: it raises if the work
        failed and orders the current stream after it). Raises :class:`_DeadlinePassed`
        past ``deadline``, RuntimeError from a failed work."""
        pause = 0.0
        while True:
            for k, w in enumerate(works):
                if not finished[k] and w.is_completed():
                    w.wait()
                    finished[k] = True
            if all(finished):
                return
            if time.monotonic() >= deadline:
                raise _DeadlinePassed()
            if pause:
                time.sleep(pause)
            pause = min(max(2 * pause, _POLL_FIRST_S), _POLL_MAX_S)

    def _wait_each(self, works: list[Any], finished: list[bool], deadline: float) -> None:
        """gloo: wait each work in order with the time left (at least 1 ms) as its timeout.
        A gloo wait that times out closes every connection of the group's context before
        it raises (gloo's ``UnboundBuffer::waitRecv``/``waitSend``: "Application timeout
        caused pair closure"), so the deadline itself stops the transfers."""
        for k, w in enumerate(works):
            left = deadline - time.monotonic()
            if left == float("inf"):
                ok = w.wait()
            else:
                ok = w.wait(datetime.timedelta(seconds=max(left, 1e-3)))
            if ok is False:
                raise RuntimeError("the wait of a transfer was aborted")
            finished[k] = True

    def abort_data(
        self, works: Sequence[Any] = (), finished: Sequence[bool] = ()
    ) -> tuple[bool, str]:
        """Make sure nothing can land in the buffers of the unfinished ``works`` (``finished``
        marks those known done; missing entries count as unfinished): returns ``(aborted,
        how)``; ``aborted`` False means a transfer may still write its buffer.

        - gloo: ``ProcessGroup.abort()``, ``_abort_process_group`` and
          ``destroy_process_group`` do nothing to a gloo group's connections in torch 2.13
          (``ProcessGroupGloo`` keeps ``Backend::abort()``, a no-op: a receive posted before
          any of them still lands). What closes them is a timed-out wait: every unfinished
          work is waited 1 ms; one that times out closes every connection of the data
          group's context, after which no receive of it can be written and every other
          wait fails at once. Aborted when each unfinished work either raised (its
          connection is closed) or turned out complete.
        - nccl: ``torch.distributed.distributed_c10d._abort_process_group(data_group)``
          (``ncclCommAbort`` of its communicators, which stops their kernels; run with
          ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``, set by ``run_rank``), whatever ``works``
          says (a failed ``batch_isend_irecv`` may have queued some). Not for the default
          group (it would abort the control group too): then not aborted.
        - any other backend: not aborted (there is no abort the driver knows).

        Afterwards the data group is not used again (:attr:`data_aborted`). Never raises.
        """
        pending = [w for k, w in enumerate(works) if not (k < len(finished) and finished[k])]
        self.data_aborted = True
        if self.data_backend == "gloo":
            unknown = closed = 0
            for w in pending:
                try:
                    if w.wait(datetime.timedelta(milliseconds=1)) is False:
                        unknown += 1
                except (RuntimeError, OSError):
                    closed += 1  # its connection is closed: nothing can land in it
            if unknown:
                aborted, how = (
                    False,
                    (
                        f"the data group could NOT be aborted ({unknown} gloo transfers neither"
                        " completed nor failed)"
                    ),
                )
            elif closed:
                aborted, how = (
                    True,
                    (
                        "the data group was aborted (gloo: the connections of its context are"
                        f" closed, {closed} transfers failed; nothing can land)"
                    ),
                )
            else:
                aborted, how = (
                    True,
                    (
                        "the data group was aborted (gloo: no transfer was left pending; nothing"
                        " can land)"
                    ),
                )
        elif self.data_backend == "nccl":
            if self.data_group is None:
                aborted, how = (
                    False,
                    ("the data group could NOT be aborted (nccl: it is the default group)"),
                )
            else:
                c10d = _module("torch.distributed.distributed_c10d")
                try:
                    c10d._abort_process_group(self.data_group)
                    aborted, how = (
                        True,
                        (
                            "the data group was aborted (nccl: ncclCommAbort by"
                            " _abort_process_group; nothing can land)"
                        ),
                    )
                except Exception as e:  # noqa: BLE001 - reported, never raised
                    aborted, how = (
                        False,
                        (f"the data group could NOT be aborted (nccl: {type(e).__name__}: {e})"),
                    )
        else:
            aborted, how = (
                False,
                (f"the data group could NOT be aborted ({self.data_backend}: no abort known)"),
            )
        if self.on_event is not None:
            self.on_event(["data", "payload", "abort" if aborted else "not aborted", how])
        return aborted, how

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


def _go_message(rnd: int, accepted: int) -> list[int]:
    """GO of round ``rnd`` (``accepted`` images): the receiver posts its receives only
    after it. With ``pipeline=2`` the next ROUND (or END) follows in the same message."""
    return [MAGIC, KIND_PAYLOAD, rnd, accepted, 0, 0, 0, 0]


def _go_length(cfg: TransferConfig) -> int:
    """The GO message's length: ``CTRL_LEN``, and with ``pipeline=2`` a whole ROUND (or END)
    message after it (:func:`_round_message`)."""
    return CTRL_LEN + (CTRL_LEN + HEADER_LEN * cfg.window if cfg.pipeline > 1 else 0)


def _hello_tail(cfg: TransferConfig) -> list[int]:
    """The HELLO's second int64 message (VERSION 2), after the ``layout_id``: the run's
    shape both ranks must agree on, ``[pipeline, window, 0, 0, 0, 0, 0, 0]`` (the merged GO
    and ROUND messages have a length fixed by both)."""
    return [cfg.pipeline, cfg.window, 0, 0, 0, 0, 0, 0]


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
