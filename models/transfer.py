"""Prefill/decode transfer of checkpoint images between two processes (issue 6, SPEC D.12).

An engine that splits prefill and decode across instances moves checkpoint images from the
prefill instance's pool to the decode instance's pool. The store already has the protocol
(SPEC D.12); this module runs it between two real processes over ``torch.distributed``:
``gloo`` on CPU tensors (CI, two local processes), ``nccl`` on two GPUs.

Roles
-----
Rank 0 is the **sender** (prefill). It owns a production
:class:`~pagedstate.impl.UnitPool` and
:class:`~pagedstate.impl.PagedStateCheckpointCoordinator` (taken by name at run time, see
the layering note below), ``StateTensors`` of the model's layout and a
``TorchCopyExecutor``. For every image it writes a deterministic pseudo-random state into a
slot, files a checkpoint, drains, executes the store op on the tensors and completes the
batch: the image is READY in its pool. To send it, it leases the image
(``acquire_checkpoint_source(h)``: a source pin that is never timed out), and ends the lease
only by its terminal path: ``release_offload_store_source(op)`` once its units have been read
(phase 1) and ``settle_offload_store(op)`` once the send completed or was given up (phase 2).

Rank 1 is the **receiver** (decode). Per image it checks the header (``layout_id`` digest,
``image_bytes``, unit count: SPEC A.1), reserves units (``reserve_transfer_units(owner)``,
``owner`` a :class:`LoadOperationId` with a fresh attempt number, SPEC A.3), suspends an older
local restore queued into the destination slot (``suspend_queued_restore``), receives the
bytes into the reserved units, adopts them (``adopt_transfer_units``: READY with no free
window, or released as a duplicate) and releases the suspended restore; on failure it
releases the reservation and resumes the suspended restore. Then it restores the image into
the slot (``begin_restore`` + drain + execute + complete) and compares the slot's carried
bytes bit for bit with the image regenerated from the seed.

Wire protocol
-------------
Control messages are int64 tensors of fixed length on a gloo group (the default group with
``gloo``; a ``gloo`` subgroup next to ``nccl``, so the host reads them without a device
sync); image bytes go over the default group (``nccl`` on GPUs)::

    S -> R  HELLO   [MAGIC, VERSION, page_unit_bytes, image_bytes, units, len, digest, payload]
    S -> R          layout_id as len uint8 bytes
    R -> S  WELCOME [MAGIC, status, reason, 0]          (refused: both sides raise)
    per round of up to `window` images:
    S -> R  ROUND   [MAGIC, KIND_ROUND, round, count, 0, 0, 0, 0] followed, in the same
                    message, by count x [index, prefix_hash, units, image_bytes, digest,
                    variant, 0, 0], zero-padded to `window` headers
    R -> S  REPLIES count x [index, status, reason, free_units]
    S -> R  GO      [MAGIC, KIND_PAYLOAD, round, accepted, 0, 0, 0, 0]: the payload follows
                    (the receiver posts its receives only now: on NCCL a posted receive
                    cannot be withdrawn if the sender is lost first)
    S -> R  PAYLOAD the accepted images' bytes, in header order (one grouped p2p batch)
    finally:
    S -> R  END     [MAGIC, KIND_END, rounds, images, 0, 0, 0, 0], padded as a ROUND
    R -> S  SUMMARY [adopted, duplicates, refused, aborted, mismatches, verified, 0, 0]

A refused image (no room, another layout, wrong byte or unit count) is refused **before
anything is sent**: the sender ends its lease (settle, the one-phase cancel of SPEC B.3 row
19) and sends no payload for it. ``digest`` is the first 63 bits of BLAKE2b over the
``layout_id``; the HELLO carries the whole string, and the receiver compares every field.

Payload: ``staged`` (default) or ``regions``. ``staged`` gathers the image's unit regions
(unit-major, region-minor, trimmed to ``image_bytes``: SPEC E.3) into one staging tensor per
image (one ``index_select`` per region when the regions are of one size, else one
``torch.cat`` of the pieces) and sends that: one message per image whatever the geometry
(Qwen3-Next at 16-token pages is 101 units x 12 regions = 1,212 regions per image; a message
each costs a p2p launch each), and the sender's source pin is released as soon as the gather
is queued (stream order: later writers of those units run after it), so the lease holds the
units for a device-local copy, not for the network. The receiver lands the staging tensor
into its units (one ``index_copy_`` per region, or one ``_foreach_copy_`` of the pieces).
``regions`` sends each region view directly
(no staging memory, no extra copies; the source pin is held until the send completed); it is
measured against ``staged`` by :mod:`pagedstate.models.bench_transfer`.

Completion: on CUDA, ``isend``/``irecv`` complete on the device, after the host returns. The
receiver adopts (publishes READY) and the sender settles (reports the terminal state) only
after an event recorded behind the transfer has completed (one host sync per round), so
"adopted" means the bytes are there (SPEC C13) and a failed transfer is seen before adoption.

Faults (``TransferConfig.fault``; each is a test in ``tests/test_transfer.py``)
------------------------------------------------------------------------------------
- ``"sender_dies"``: in the round holding ``fault_image`` the sender leases, sends the
  headers, reads the replies and then dies before any payload: its own ``finally`` settles
  every lease of the round (the terminal path; nothing is reclaimed by timeout), it writes
  its result and the process exits with :data:`CRASH_EXIT` without a teardown. The receiver's
  receive fails (the connection is reset, or the group's timeout expires), it releases every
  reservation of the round, resumes the suspended restores, runs them and checks the slots
  hold the local images.
- ``"sender_dies_after_go"``: as ``"sender_dies"``, but the sender first sends GO, so the
  receiver has posted its payload receives when the sender dies. On gloo the receive fails
  when the connection goes and the round is given up as above. **Not handled on NCCL yet**
  (a posted NCCL receive cannot be withdrawn and has no timeout of its own: NCCL's watchdog
  ends the receiver at the group's timeout; its test is marked xfail there, not run).
- ``"sender_stalls"``: as ``"sender_dies"``, but the sender stays alive and silent for
  ``2 * timeout_s`` before it sends: the receiver's receive times out (a hung peer, not a
  dead one) and it gives the round up as above. The sender's late send then fails or lands
  nowhere; either way its ``finally`` settles its leases, never a timeout of the store.
- ``"duplicate"``: after the last round the sender sends ``fault_image`` again, alone in a
  round, with every byte inverted (a wrongful adoption would then show). The receiver's
  ``adopt_transfer_units`` returns False and releases the units; the canonical image still
  restores bit-exact.
- ``"receiver_full"``: before the round holding ``fault_image`` a live-KV tenant of the
  receiver takes every unit it can get (``ensure_free_units(1)`` then one unit, as an
  engine's fresh KV block does, SPEC A.4), so ``reserve_transfer_units`` finds no room: the
  images of that round are refused before anything is received, the receiver's snapshot is
  unchanged by the refusal, and the tenant gives its units back after the round.

Layering: ``pagedstate.models`` imports neither ``pagedstate.impl``, ``pagedstate.gpu`` nor
torch statically; they are taken by name at run time (``importlib``), as in
:mod:`pagedstate.models.replay_exec`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from pagedstate.spec import check_invariants
from pagedstate.spec.errors import InvalidArgumentError

__all__ = [
    "BACKENDS",
    "CRASH_EXIT",
    "FAULTS",
    "PAYLOADS",
    "REASONS",
    "VERIFY_MODES",
    "ImageHeader",
    "Incoming",
    "LayoutMismatchError",
    "Link",
    "LoadOperationId",
    "Outgoing",
    "Receiver",
    "Refusal",
    "Reply",
    "Sender",
    "SenderCrashed",
    "TransferConfig",
    "TransferError",
    "WireError",
    "image_key",
    "image_units",
    "layout_digest",
    "run_rank",
    "spawn_transfer",
]

#: ``torch.distributed`` backends the driver runs on (``gloo``: CPU tensors; ``nccl``: CUDA).
BACKENDS = ("gloo", "nccl")
#: How image bytes travel (see the module doc).
PAYLOADS = ("staged", "regions")
#: Injected faults (see the module doc).
FAULTS = (
    "none",
    "sender_dies",
    "sender_dies_after_go",
    "sender_stalls",
    "duplicate",
    "receiver_full",
)
#: ``"round"``: restore and check each round's images as they arrive; ``"end"``: after the
#: last round (the timed loop then holds only the transfer), every adopted image restored and
#: checked; ``"none"``: no check.
VERIFY_MODES = ("round", "end", "none")
#: Exit status of a sender process that died on purpose (``fault="sender_dies"`` or
#: ``"sender_dies_after_go"``).
CRASH_EXIT = 17
#: The longest ``TransferConfig.timeout_s`` (one day): a process group's timeout must be a
#: finite ``timedelta``, and a run is bounded by a few times it.
MAX_TIMEOUT_S = 86_400.0

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
_INT64 = 1 << 63
_MASK64 = (1 << 64) - 1
_LOCAL_SALT = 0x10CA_15EE_D5A1_7000


class TransferError(RuntimeError):
    """The transfer could not go on (a protocol step failed; the message says which).

    ``result``: when raised out of :func:`run_rank`, the rank's report at the failure (its
    unit accounting, the rows it took), else None."""

    result: dict[str, Any] | None = None


class WireError(TransferError):
    """A message could not be sent or received: the peer died, the connection broke, or the
    group's timeout expired (the original error is the ``__cause__``)."""


class LayoutMismatchError(TransferError):
    """The peers' layouts differ (``layout_id``, page or image bytes, units or payload mode):
    no image may cross (SPEC A.1). Raised on both ranks after the HELLO exchange."""


class SenderCrashed(TransferError):
    """The sender died on purpose (``fault="sender_dies"`` or ``"sender_dies_after_go"``)
    after its leases were settled;
    ``result`` is its rank report, written before the process exits."""


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise TransferError(
            f"the transfer driver needs {name} ({e}): pip install 'pagedstate[gpu]'"
        ) from None


def _need(v: object, cls: type, name: str) -> None:
    if not isinstance(v, cls):
        raise InvalidArgumentError(f"{name} must be an instance of {cls.__name__}, got {v!r}")


def _in_state(x: Outgoing | Incoming, state: str) -> None:
    """Raise :class:`TransferError` unless the image ``x`` is in ``state`` (a step taken out
    of order: leasing, landing, adopting an image twice or after it ended)."""
    if x.state != state:
        raise TransferError(f"image {x.header.index} is {x.state}, not {state}")


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection on 64 bits."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def image_key(seed: int, index: int) -> int:
    """The prefix hash of image ``index`` of a run seeded ``seed``: in ``[0, 2**62)``, so it
    fits the wire's int64 and distinct indices of one seed give distinct keys (with
    overwhelming probability; checked by :class:`Sender`).

    Raises:
        InvalidArgumentError: ``seed`` or ``index`` is not an int >= 0.
    """
    for name, v in (("seed", seed), ("index", index)):
        if type(v) is not int or v < 0:
            raise InvalidArgumentError(f"{name} must be an int >= 0, got {v!r}")
    return _mix64((_mix64(seed ^ 0x9E3779B97F4A7C15) + index) & _MASK64) >> 2


def layout_digest(layout_id: str) -> int:
    """The 63-bit digest of a ``layout_id`` carried by every image header (BLAKE2b).

    Raises:
        InvalidArgumentError: ``layout_id`` is not a non-empty str.
    """
    if not isinstance(layout_id, str) or not layout_id:
        raise InvalidArgumentError(f"layout_id must be a non-empty str, got {layout_id!r}")
    d = hashlib.blake2b(layout_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(d, "little") >> 1


def _need_config(cfg: object) -> None:
    if not isinstance(cfg, TransferConfig):
        raise InvalidArgumentError(f"cfg must be a TransferConfig, got {cfg!r}")


def _positive(name: str, v: object, low: int = 1) -> None:
    if type(v) is not int or v < low:
        raise InvalidArgumentError(f"{name} must be an int >= {low}, got {v!r}")


def _layout(model: str, slice_: tuple[int, int, int] | None, block_tokens: int) -> Any:
    geometry = _module("pagedstate.gpu.geometry")
    g = geometry.load_geometry(model)
    if slice_ is not None:
        g = g.sliced(*slice_)
    return g.layout(block_tokens)


def image_units(
    model: str, slice_: tuple[int, int, int] | None, block_tokens: int, name: str = "block_tokens"
) -> int:
    """``units_per_checkpoint`` of the layout of ``model`` (a shipped geometry id or unique
    substring), sliced by ``slice_`` (or not: None), at ``block_tokens``-token pages.

    Raises:
        InvalidArgumentError: no such layout (an unknown or ambiguous model, a slice that does
            not fit the model, a model without attention layers, a bad page size); the
            message names the values (``name``: what ``block_tokens`` is called)."""
    try:
        lay = _layout(model, slice_, block_tokens)
    except ValueError as e:  # InvalidArgumentError, UnsupportedGeometryError
        raise InvalidArgumentError(
            f"model {model!r}, slice {slice_!r}, {name} {block_tokens!r}: {e}"
        ) from None
    except LookupError as e:  # UnknownGeometryError
        raise InvalidArgumentError(f"model {model!r}: {e}") from None
    return int(lay.units_per_checkpoint)


@attrs.frozen
class TransferConfig:
    """One two-rank transfer run (both ranks get the same config).

    Attributes:
        model: a shipped geometry id (or unique substring, ``load_geometry``).
        block_tokens: tokens per KV page (sets ``page_unit_bytes``, so units per image).
        slice: ``(recurrent_layers, attention_layers, divide)`` for
            ``ModelGeometry.sliced`` (small CPU tensors), or None for the full geometry.
        slots: state slots per rank (>= ``window``; one destination slot per image of a
            round).
        units: pool units of the sender (it holds every image: >= ``images *
            units_per_checkpoint``).
        receiver_units: pool units of the receiver (None: ``units``): at least one image's
            units, two with ``local_restore`` (the local image and one received).
        images: images sent (each a distinct prefix hash).
        window: images per round (one control round trip and one grouped p2p batch).
        backend: ``"gloo"`` (``device="cpu"``) or ``"nccl"`` (``device="cuda"``: rank r uses
            ``cuda:r``).
        device: ``"cpu"`` or ``"cuda"``.
        seed: seeds every image's bytes and prefix hash.
        payload: ``"staged"`` or ``"regions"`` (module doc).
        local_restore: the receiver keeps a local older image and queues its restore into
            each destination slot before the transfer (the restore D.12 suspends).
        verify: ``"round"``, ``"end"`` or ``"none"`` (:data:`VERIFY_MODES`).
        fault: one of :data:`FAULTS`; ``fault_image``: the image it strikes.
        receiver_block_tokens: the receiver's page size if it differs (a layout mismatch).
        baseline: after the protocol, time a plain send/recv of the same tensor sizes.
        timeout_s: the process group's timeout (a receive waits at most this long), at
            most :data:`MAX_TIMEOUT_S`.

    Raises:
        InvalidArgumentError: a field is out of range, or the model, slice and page sizes
            give no layout (an unknown or ambiguous model, a slice that does not fit, a
            model without attention layers), or a pool cannot hold what it must (named in
            the message).
    """

    model: str = "Qwen3-Next"
    block_tokens: int = 128
    slice: tuple[int, int, int] | None = (1, 2, 32)
    slots: int = 4
    units: int = 64
    receiver_units: int | None = None
    images: int = 8
    window: int = 2
    backend: str = "gloo"
    device: str = "cpu"
    seed: int = 0
    payload: str = "staged"
    local_restore: bool = True
    verify: str = "round"
    fault: str = "none"
    fault_image: int = 0
    receiver_block_tokens: int | None = None
    baseline: bool = False
    timeout_s: float = 30.0

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise InvalidArgumentError(f"model must be a non-empty str, got {self.model!r}")
        _positive("block_tokens", self.block_tokens)
        if self.slice is not None:
            if (
                not isinstance(self.slice, tuple)
                or len(self.slice) != 3
                or any(type(v) is not int or v < 1 for v in self.slice)
            ):
                raise InvalidArgumentError(
                    "slice must be None or (recurrent_layers, attention_layers, divide), ints"
                    f" >= 1, got {self.slice!r}"
                )
        for name in ("slots", "units", "images", "window"):
            _positive(name, getattr(self, name))
        if self.receiver_units is not None:
            _positive("receiver_units", self.receiver_units)
        if self.receiver_block_tokens is not None:
            _positive("receiver_block_tokens", self.receiver_block_tokens)
        if self.window > self.slots:
            raise InvalidArgumentError(
                f"window ({self.window}) must be <= slots ({self.slots}): each image of a"
                " round lands in its own slot"
            )
        pairs = {"gloo": "cpu", "nccl": "cuda"}
        if self.backend not in pairs:
            raise InvalidArgumentError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.device != pairs[self.backend]:
            raise InvalidArgumentError(
                f"backend {self.backend!r} runs on device {pairs[self.backend]!r}, got"
                f" {self.device!r}"
            )
        _positive("seed", self.seed, 0)
        for name, allowed in (
            ("payload", PAYLOADS),
            ("verify", VERIFY_MODES),
            ("fault", FAULTS),
        ):
            if getattr(self, name) not in allowed:
                raise InvalidArgumentError(
                    f"{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if type(self.fault_image) is not int or not 0 <= self.fault_image < self.images:
            raise InvalidArgumentError(
                f"fault_image must be an int in [0, {self.images}), got {self.fault_image!r}"
            )
        if type(self.local_restore) is not bool or type(self.baseline) is not bool:
            raise InvalidArgumentError("local_restore and baseline must be bools")
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or not 0 < self.timeout_s <= MAX_TIMEOUT_S
        ):
            raise InvalidArgumentError(
                f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S}], got"
                f" {self.timeout_s!r}"
            )
        # The geometry and the pool sizes are checked here, not first in a child process.
        per_image = self._units_per_image("block_tokens", self.block_tokens)
        rx_per_image = per_image
        if self.receiver_block_tokens is not None:
            rx_per_image = self._units_per_image(
                "receiver_block_tokens", self.receiver_block_tokens
            )
        need = self.images * per_image
        if self.units < need:
            raise InvalidArgumentError(
                f"units ({self.units}) must hold all {self.images} images of"
                f" {per_image} units ({need})"
            )
        rx = self.units if self.receiver_units is None else self.receiver_units
        low = rx_per_image * (2 if self.local_restore else 1)
        if rx < low:
            raise InvalidArgumentError(
                f"receiver_units ({rx}) must hold {low} units: one image of {rx_per_image} units"
                + (" and the local image (local_restore)" if self.local_restore else "")
            )

    def _units_per_image(self, name: str, block_tokens: int) -> int:
        return image_units(self.model, self.slice, block_tokens, name)

    def layout(self, block_tokens: int | None = None) -> Any:
        """The ``CheckpointLayout`` both ranks use (``block_tokens`` overrides the page size;
        the receiver passes ``receiver_block_tokens``).

        Raises:
            UnknownGeometryError, UnsupportedGeometryError: from ``load_geometry`` / ``sliced``
                (for ``block_tokens`` not of the config; its own were checked).
        """
        return _layout(
            self.model, self.slice, self.block_tokens if block_tokens is None else block_tokens
        )

    def rounds(self) -> list[list[tuple[int, int]]]:
        """The sender's rounds: lists of ``(index, variant)``, ``window`` images each; with
        ``fault="duplicate"`` a last round resends ``fault_image`` (variant 1)."""
        idx = list(range(self.images))
        out = [[(i, 0) for i in idx[k : k + self.window]] for k in range(0, len(idx), self.window)]
        if self.fault == "duplicate":
            out.append([(self.fault_image, 1)])
        return out


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


@attrs.define
class Outgoing:
    """One leased image on the sender: its header, lease operation and units.

    ``state``: ``"leased"`` -> ``"released"`` (phase 1: the units were read) ->
    ``"settled"`` (phase 2: the terminal report), or ``"leased"`` -> ``"settled"`` (a refusal
    or a failure: the one-phase cancel)."""

    header: ImageHeader
    op: Any
    units: tuple[int, ...]
    state: str = "leased"


@attrs.define
class Incoming:
    """One accepted image on the receiver: its reservation and destination.

    ``state``: ``"reserved"`` -> ``"landed"`` (bytes in the units) -> ``"adopted"`` or
    ``"duplicate"``; or ``"reserved"``/``"landed"`` -> ``"aborted"``."""

    header: ImageHeader
    owner: LoadOperationId
    units: tuple[int, ...]
    slot: int
    suspended: Any
    state: str = "reserved"


@attrs.define
class _Seq:
    """The two fields of an engine sequence the coordinator reads."""

    state_slot: int
    has_per_req_cache: bool = True


def _piece_sizes(layout: Any) -> list[tuple[int, int, int]]:
    """The destination stream of one image (SPEC E.3) as ``(unit position, region, bytes)``
    pieces: regions unit-major, region-minor, the last trimmed to ``image_bytes`` (a unit's
    tail past the image is never sent)."""
    left = layout.image_bytes
    out = []
    for u in range(layout.units_per_checkpoint):
        for r, size in enumerate(layout.region_bytes):
            n = min(size, left)
            if n > 0:
                out.append((u, r, n))
            left -= n
    return out


class _Side:
    """What both ranks own: layout, pool, coordinator, tensors, executor (module doc)."""

    def __init__(self, cfg: TransferConfig, units: int, device: str, block_tokens: int | None):
        _need_config(cfg)
        self.cfg = cfg
        self.torch = torch = _module("torch")
        try:
            dev = torch.device(device)
        except (TypeError, RuntimeError):
            dev = None
        if dev is None or dev.type != cfg.device:
            raise InvalidArgumentError(
                f"device must be a {cfg.device!r} device (cfg.device), got {device!r}"
            )
        impl = _module("pagedstate.impl")
        tensors_mod = _module("pagedstate.gpu.tensors")
        executor_mod = _module("pagedstate.gpu.executor")
        self.layout = cfg.layout(block_tokens)
        self.spec = self.layout.spec()
        self.digest = layout_digest(self.layout.layout_id)
        self.pool = impl.UnitPool(units)
        self.coord = impl.PagedStateCheckpointCoordinator(self.pool, self.spec, True)
        #: Rows of the offload, lease and transfer machines taken, as JSON-able lists.
        self.events: list[list[Any]] = []
        self.coord.on_transition = self._on_transition
        self.tensors = tensors_mod.StateTensors(self.layout, cfg.slots, units, device)
        self.device = self.tensors.device
        for x in self.tensors.all_tensors():
            x.zero_()  # touched once at start, as an engine's pool is (no first-touch faults)
        self.executor = executor_mod.TorchCopyExecutor(self.tensors)
        self._free_dirty = executor_mod.free_dirty_units
        self._gen = torch.Generator(device=self.device)
        self._seqs = [_Seq(s) for s in range(cfg.slots)]
        self.pieces = _piece_sizes(self.layout)
        self.piece_bytes = [n for _, _, n in self.pieces]
        self.units_per_image = self.layout.units_per_checkpoint
        self.bytes_moved = 0
        n = self.layout.image_bytes
        regions = self.layout.region_bytes
        #: Whether a unit is ``len(region_bytes)`` regions of one size, laid out in its
        #: ``page_unit_bytes`` in order: then an image is gathered and landed with one
        #: ``index_select`` / ``index_copy_`` per region (the fast path), not a view per piece.
        self.uniform = len(set(regions)) == 1 and sum(regions) == self.layout.page_unit_bytes
        padded = self.units_per_image * self.layout.page_unit_bytes if self.uniform else n
        #: One staging tensor per image of a round (``staged`` payloads, and the baseline):
        #: ``image_bytes`` on the wire (:meth:`wire`); on the fast path padded to whole units
        #: (the padding of a receiver's staging is never written, so it stays zero and a
        #: landed unit's tail past the image is zero, as a scrubbed unit's).
        self.staging = [
            torch.zeros(padded, dtype=torch.uint8, device=self.device) for _ in range(cfg.window)
        ]

        if self.uniform:
            k = len(regions)
            # The fast path moves words, not bytes (a byte-wise gather kernel is several
            # times slower): the widest of 8, 4, 2, 1 bytes that divides a region.
            word, self._word = (
                next(
                    (n, dt)
                    for n, dt in ((8, torch.int64), (4, torch.int32), (2, torch.int16))
                    if regions[0] % n == 0
                )
                if regions[0] % 2 == 0
                else (1, torch.uint8)
            )
            self._kv_words = [r.view(self._word) for r in self.tensors.kv_rows]
            #: Per-region scratch of the fast gather: ``[regions, units, region words]``.
            self._scratch = torch.zeros(
                (k, self.units_per_image, regions[0] // word), dtype=self._word, device=self.device
            )

    def _on_transition(self, machine: str, row: Any, subject: object) -> None:
        if machine not in ("offload", "lease", "transfer"):
            return
        if isinstance(subject, LoadOperationId):
            subj: Any = [subject.prefix_hash, subject.attempt]
        elif hasattr(subject, "generation"):
            subj = [subject.prefix_hash, subject.generation]  # type: ignore[attr-defined]
        else:
            subj = repr(subject)
        self.events.append([machine, row.phase, row.event, subj])

    def image(self, key: int) -> Any:
        """The carried bytes of ``key``'s state (``image_bytes`` uint8 on this rank's device,
        deterministic in ``key``: both ranks regenerate the same bytes).

        Raises:
            InvalidArgumentError: ``key`` is not an int."""
        if type(key) is not int:
            raise InvalidArgumentError(f"key must be an int, got {key!r}")
        torch = self.torch
        n = self.layout.image_bytes
        self._gen.manual_seed(_mix64(key ^ 0x9E3779B97F4A7C15))
        words = torch.randint(
            -_INT64,
            _INT64 - 1,
            (-(-n // 8),),
            dtype=torch.int64,
            generator=self._gen,
            device=self.device,
        )
        return words.view(torch.uint8)[:n]

    def run_batch(self) -> int:
        """One pass: drain, execute the ops (scrubbing free dirty units, SPEC G10), complete
        the batch. Returns the restores run."""
        stores, restores = self.coord.take_checkpoint_ops()
        scrub = self._free_dirty(self.pool, None)
        self.executor.execute(stores, restores, scrub)
        if scrub:
            self.pool.mark_clean(scrub)
        self.coord.complete_previous_batch()
        return len(restores)

    def store_images(self, keys: Sequence[int]) -> None:
        """Write each key's image into a slot and checkpoint it, ``slots`` per pass: after
        this every key is READY (the store's own ops, run by the executor).

        Raises:
            TransferError: a store was refused (the pool has no room)."""
        for k in range(0, len(keys), self.cfg.slots):
            chunk = keys[k : k + self.cfg.slots]
            for slot, key in enumerate(chunk):
                self.tensors.write_image(slot, self.image(key))
                self.coord.checkpoint(self._seqs[slot], 1, key)
            self.run_batch()
            for key in chunk:
                if not self.coord.contains(key):
                    raise TransferError(
                        f"the store of image {key:#x} was refused: {self.pool.num_units} units"
                        f" cannot hold it ({self.units_per_image} units per image)"
                    )

    def accounting(self) -> dict[str, int]:
        """Where every unit is: ``free``, ``records`` (checkpoint units), ``transfers``
        (reservations), ``other`` (the rest: live-KV tenants)."""
        snap = self.coord.snapshot()
        records = sum(len(r.unit_ids) for r in snap.records.values())
        transfers = sum(len(u) for u in snap.transfers.values())
        free = self.pool.num_free
        return {
            "num_units": self.pool.num_units,
            "free": free,
            "records": records,
            "transfers": transfers,
            "other": self.pool.num_units - free - records - transfers,
            "suspended": len(snap.suspended),
            "queued_restores": len(snap.queued_restores),
            "offload_pins": len(snap.offload_pins),
        }

    def invariants(self) -> list[str]:
        """SPEC C on the coordinator's snapshot: the problems found (empty when sound)."""
        return [f"{n}: {p}" for n, p in check_invariants(self.coord.snapshot())]

    def wire(self, staging: Any) -> Any:
        """The part of a staging tensor that travels: its first ``image_bytes`` bytes."""
        return staging[: self.layout.image_bytes]

    def _staging(self, staging: object) -> None:
        """Check that ``staging`` is a staging buffer of this rank (uint8, 1-D, the size of
        :attr:`staging`'s tensors, on this device), before anything is written.

        Raises:
            InvalidArgumentError: it is not."""
        torch = self.torch
        want = self.staging[0].numel()
        if (
            not isinstance(staging, torch.Tensor)
            or staging.dtype != torch.uint8
            or staging.dim() != 1
            or staging.numel() != want
            or staging.device != self.device
            or not staging.is_contiguous()
        ):
            got = (
                f"{tuple(staging.shape)} {staging.dtype} on {staging.device}"
                if isinstance(staging, torch.Tensor)
                else repr(staging)
            )
            raise InvalidArgumentError(
                f"a staging buffer is a contiguous uint8 tensor of {want} bytes on"
                f" {self.device}, got {got}"
            )

    def _unit_index(self, units: Sequence[int]) -> Any:
        for u in units:
            self.tensors.unit_region(0, u)  # range check (InvalidArgumentError)
        return self.torch.tensor(list(units), dtype=self.torch.int64, device=self.device)

    def _grid(self, staging: Any) -> Any:
        """``staging`` (padded) as ``[units, regions, region words]``: the stream order."""
        k, u, b = self._scratch.shape
        return staging.view(self._word).view(u, k, b)

    def synchronize(self) -> None:
        """Wait for this rank's device work (a no-op on CPU)."""
        if self.device.type == "cuda":
            self.torch.cuda.current_stream(self.device).synchronize()


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
        if self.uniform:
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
        if staging is not None and self.uniform:
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
            TransferError: ``inc`` was already adopted."""
        _need(inc, Incoming, "inc")
        if inc.state == "aborted":
            return
        if inc.state in ("adopted", "duplicate"):
            raise TransferError(f"image {inc.header.index} is {inc.state}: nothing to abort")
        self.coord.release_transfer_units(inc.owner)
        inc.state = "aborted"
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


class _Phases:
    """Host seconds per phase of the timed loop (``phases_s`` in a rank's result): where a
    round's time goes. On CUDA a phase that synchronizes is charged the device work it
    waits for."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.s[name] = self.s.get(name, 0.0) + time.perf_counter() - t


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
                rows = link.recv_ints(REPLY_LEN * len(outs))
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
                    data = [s.gather(o, s.staging[k]) for k, o in enumerate(go)]
                else:
                    data = [v for o in go for v in s.regions(o)]
            with ph("control"):
                link.send_ints([MAGIC, KIND_PAYLOAD, rnd, len(go), 0, 0, 0, 0])
            if cfg.fault == "sender_dies_after_go" and any(i == cfg.fault_image for i, _ in items):
                raise SenderCrashed(f"the sender dies after GO of round {rnd}, before its payload")
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
    summary = link.recv_ints(8)
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


def _plain_rounds(side: _Side, rounds: list[list[tuple[int, int]]]) -> list[list[Any]]:
    """Per round, tensors of the sizes the protocol moves in it (no store, no protocol):
    one ``image_bytes`` tensor per image (staged) or its region sizes (regions)."""
    cfg = side.cfg
    if cfg.payload == "staged":
        return [[side.wire(t) for t in side.staging[: len(items)]] for items in rounds]
    torch = side.torch
    n = cfg.window * side.layout.image_bytes
    flat = torch.zeros(n, dtype=torch.uint8, device=side.device)
    views = list(flat.split(side.piece_bytes * cfg.window))
    k = len(side.piece_bytes)
    return [views[: k * len(items)] for items in rounds]


def _warm_up(side: _Side, link: Link, sending: bool) -> None:
    """One round's worth of plain transfers before anything is timed (NCCL builds its
    communicator on the first p2p call)."""
    first = _plain_rounds(side, [[(0, 0)] * side.cfg.window])[0]
    link.exchange(first, sending=sending)
    side.synchronize()


def _baseline(side: _Side, link: Link, rounds: list[list[tuple[int, int]]], sending: bool) -> float:
    """Seconds for a plain send/recv of the protocol's tensor sizes, round by round (one
    grouped p2p batch each, as the protocol's payloads), without control messages, leases,
    reservations or copies."""
    per_round = _plain_rounds(side, rounds)
    link.barrier()
    t0 = time.perf_counter()
    for tensors in per_round:
        link.exchange(tensors, sending=sending)
    side.synchronize()
    elapsed = time.perf_counter() - t0
    link.barrier()
    return elapsed


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
            for inc in incs:
                resumed = inc.suspended is not None
                r.abort(inc)
                local["resumed"] += resumed
                outcome.setdefault(inc.header.index, []).append("aborted")
            r.run_batch()  # the resumed local restores run
            for slot, (index, what, key) in expect.items():
                checks.append((index, what, key, r.check_slot(slot, key)))
            break
        try:
            for k, inc in enumerate(incs):
                with ph("land"):
                    r.land(inc, r.staging[k] if staged else None)
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


def run_rank(rank: int, world_size: int, cfg: TransferConfig, init_method: str) -> dict[str, Any]:
    """Run one rank of a transfer under ``torch.distributed`` and return its result: what
    it sent or received, timings in seconds, its unit accounting, the offload / lease /
    transfer rows it took (``events``) and any SPEC C invariant it broke (``invariants``).

    Args:
        rank: 0 (sender) or 1 (receiver).
        world_size: 2.
        cfg: the run (the same on both ranks).
        init_method: the rendezvous (``"tcp://127.0.0.1:PORT"`` or ``"file:///path"``).

    Raises:
        InvalidArgumentError: ``world_size`` is not 2 or ``rank`` not 0 or 1.
        SenderCrashed: rank 0 with ``fault="sender_dies"`` or ``"sender_dies_after_go"``
            (its result is the exception's
            ``result`` attribute; the caller should then exit without a teardown).
        LayoutMismatchError, WireError, TransferError: the run failed.
    """
    if (
        type(world_size) is not int
        or type(rank) is not int
        or world_size != 2
        or rank not in (0, 1)
    ):
        raise InvalidArgumentError(
            f"a transfer runs on ranks 0 and 1 of 2, got {rank}/{world_size}"
        )
    _need_config(cfg)
    torch = _module("torch")
    dist = _module("torch.distributed")
    if cfg.device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    else:
        device = "cpu"
    dist.init_process_group(
        cfg.backend,
        init_method=init_method,
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=cfg.timeout_s),
    )
    crashed = False
    try:
        # The control group times out like the default one (new_group would wait 30 min).
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        ctrl = dist.new_group(backend="gloo", timeout=timeout) if cfg.backend == "nccl" else None
        side: _Side = Sender(cfg, device) if rank == 0 else Receiver(cfg, device)
        link = Link(dist, rank, ctrl, None, side.device)
        t0 = time.perf_counter()
        try:
            if isinstance(side, Sender):
                result = _sender_loop(side, link)
            else:
                assert isinstance(side, Receiver)
                result = _receiver_loop(side, link)
        except TransferError as e:
            crashed = isinstance(e, SenderCrashed)
            e.result = _rank_report(side, {"crashed" if crashed else "failed": str(e)}, t0)
            raise
        return _rank_report(side, result, t0)
    finally:
        if not crashed:
            dist.destroy_process_group()


def _rank_report(side: _Side, result: dict[str, Any], t0: float) -> dict[str, Any]:
    lay = side.layout
    store = side.coord.store
    report = {
        "role": "sender" if isinstance(side, Sender) else "receiver",
        **result,
        "wall_s": time.perf_counter() - t0,
        "layout": {k: v for k, v in lay.describe().items()},
        "pieces_per_image": len(side.pieces),
        "accounting": side.accounting(),
        "ready": sorted(h for h in store.hash_to_checkpoint if side.coord.contains(h)),
        "offload_pins_reclaimed": store.offload_pins_reclaimed,
        "has_offload_pins": side.coord.has_offload_pins(),
        "events": side.events,
        "invariants": side.invariants(),
        "device": str(side.device),
        "device_name": (
            side.torch.cuda.get_device_name(side.device)
            if side.device.type == "cuda"
            else platform.processor() or platform.machine()
        ),
        "torch": str(side.torch.__version__),
        "backend": side.cfg.backend,
    }
    if isinstance(side, Receiver):
        report["tenant_units"] = len(side.tenant)
        report["local_key"] = side.local_key
    else:
        assert isinstance(side, Sender)
        report["keys"] = side.keys
    return report


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _rank_entry(rank: int, cfg: TransferConfig, init_method: str, out: str) -> None:
    """A spawned rank: run it, write its result to ``out`` (JSON), exit (``CRASH_EXIT`` for
    the sender's planned death, 1 on an error, whose traceback is in the result)."""
    if cfg.device == "cpu":
        torch = _module("torch")
        torch.set_num_threads(1)
    try:
        result = run_rank(rank, 2, cfg, init_method)
    except SenderCrashed as e:
        _write_json(out, e.result if e.result is not None else {"crashed": str(e)})
        os._exit(CRASH_EXIT)  # die: no teardown, the peer sees the connection go
    except BaseException as e:
        report = getattr(e, "result", None) or {}
        report.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        _write_json(out, report)
        raise SystemExit(1) from None
    _write_json(out, result)


def _config_json(cfg: TransferConfig) -> str:
    return json.dumps(attrs.asdict(cfg))


def _config_from_json(text: str) -> TransferConfig:
    """The config written by :func:`_config_json`.

    Raises:
        InvalidArgumentError: ``text`` is not JSON of a ``TransferConfig``'s fields, or a
            field is out of range."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise InvalidArgumentError(f"the config is not JSON: {e}") from None
    if not isinstance(d, dict):
        raise InvalidArgumentError(f"the config must be a JSON object, got {d!r}")
    names = {a.name for a in attrs.fields(TransferConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise InvalidArgumentError(
            f"the config has unknown fields {unknown}; known: {sorted(names)}"
        )
    if isinstance(d.get("slice"), list):
        d["slice"] = tuple(d["slice"])
    return TransferConfig(**d)


def spawn_transfer(cfg: TransferConfig, *, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Run both ranks of ``cfg`` as two child processes (``python -m
    pagedstate.models.transfer``, a ``file://`` rendezvous in a fresh temporary folder: no
    port to pick) and return their results, rank 0 first. Each result has ``exitcode``,
    ``killed`` and ``log`` (the end of the rank's output); a rank that wrote no result has
    ``error``.

    The whole run is bounded: a rank still alive ``timeout_s`` seconds after the start
    (default ``3 * cfg.timeout_s + 60``) is killed (by its own process id) and marked
    ``killed``, so a hung peer cannot hang the caller.

    Raises:
        InvalidArgumentError: ``cfg`` is not a TransferConfig or ``timeout_s`` not a finite
            number > 0.
    """
    _need_config(cfg)
    limit = 3 * cfg.timeout_s + 60 if timeout_s is None else timeout_s
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not limit > 0
        or not math.isfinite(limit)
    ):
        raise InvalidArgumentError(
            f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}"
        )
    with tempfile.TemporaryDirectory(prefix="pagedstate-transfer-") as tmp:
        init = Path(tmp, "rendezvous").as_uri()
        conf = Path(tmp, "config.json")
        conf.write_text(_config_json(cfg), encoding="utf-8")
        outs = [Path(tmp, f"rank{r}.json") for r in range(2)]
        logs = [Path(tmp, f"rank{r}.log") for r in range(2)]
        procs = []
        for r in range(2):
            cmd = [sys.executable, "-m", "pagedstate.models.transfer", "--rank", str(r)]
            cmd += ["--config", str(conf), "--init", init, "--out", str(outs[r])]
            with open(logs[r], "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + limit
        killed = [False, False]
        for r, p in enumerate(procs):
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed[r] = True
        for r, p in enumerate(procs):
            if p.poll() is None:
                killed[r] = True
                p.kill()
                p.wait(10)
        results: list[dict[str, Any]] = []
        for r, p in enumerate(procs):
            try:
                res: dict[str, Any] = json.loads(outs[r].read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                res = {"error": f"rank {r} wrote no result ({type(e).__name__})"}
            res["exitcode"] = p.returncode
            res["killed"] = killed[r]
            res["log"] = logs[r].read_bytes()[-4000:].decode("utf-8", errors="replace")
            results.append(res)
    return results


def _main(argv: Sequence[str] | None = None) -> int:
    """One rank of :func:`spawn_transfer` (``python -m pagedstate.models.transfer``)."""
    ap = argparse.ArgumentParser(prog="python -m pagedstate.models.transfer")
    ap.add_argument("--rank", type=int, choices=(0, 1), required=True)
    ap.add_argument("--config", type=Path, required=True, help="TransferConfig as JSON")
    ap.add_argument("--init", required=True, help="torch.distributed init_method")
    ap.add_argument("--out", required=True, help="where the rank writes its result (JSON)")
    args = ap.parse_args(argv)
    try:
        cfg = _config_from_json(args.config.read_text(encoding="utf-8"))
    except OSError as e:
        ap.error(f"argument --config: cannot read {str(args.config)!r}: {e.strerror or e}")
    except InvalidArgumentError as e:
        ap.error(f"argument --config: {args.config}: {e}")
    _rank_entry(args.rank, cfg, args.init, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
