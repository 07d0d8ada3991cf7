"""The run's configuration (:class:`TransferConfig`), its JSON form, and the values every
rank derives from it: image keys, the layout digest, units per image."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import attrs

from pagedstate.spec.errors import InvalidArgumentError

from .errors import _module

#: ``torch.distributed`` backends the driver runs on (``gloo``: CPU tensors; ``nccl``: CUDA).
BACKENDS = ("gloo", "nccl")
#: How image bytes travel (see the module doc).
PAYLOADS = ("staged", "regions")
#: How the staged payload's bytes are gathered and landed (``TransferConfig.copy_engine``):
#: ``"index"``, the driver's per-image ``index_select``/``index_copy_`` path; ``"triton"`` or
#: ``"torch"``, the copy engine over the round's staging rows (one batch per round, one
#: launch with Triton: :mod:`pagedstate.impl.transfer.staging`); ``"auto"``: ``"triton"``
#: on CUDA when Triton imports, ``"index"`` otherwise.
COPY_ENGINES = ("auto", "index", "triton", "torch")
#: Rounds in flight (``TransferConfig.pipeline``): 1, one round after the other; 2,
#: double-buffered (round k+1's lease, control exchange and gather overlap round k's
#: payload, which is posted and waited only before round k's settle / landing).
PIPELINES = (1, 2)
#: Injected faults (see the module doc).
FAULTS = (
    "none",
    "sender_dies",
    "sender_dies_after_go",
    "sender_dies_mid_payload",
    "sender_stalls",
    "sender_stalls_mid_payload",
    "duplicate",
    "receiver_full",
)
#: ``"round"``: restore and check each round's images as they arrive; ``"end"``: after the
#: last round (the timed loop then holds only the transfer), every adopted image restored and
#: checked; ``"none"``: no check.
VERIFY_MODES = ("round", "end", "none")
#: Faults that strike while a round's payload is in flight: the sender sends the bytes of the
#: first accepted image of the round holding ``fault_image`` and then dies
#: (``sender_dies_mid_payload``) or stays alive and silent until the receiver has given the
#: round up (``sender_stalls_mid_payload``). That round must hold two images or more.
MID_PAYLOAD_FAULTS = ("sender_dies_mid_payload", "sender_stalls_mid_payload")
#: Exit status of a sender process that died on purpose (``fault="sender_dies"``,
#: ``"sender_dies_after_go"`` or ``"sender_dies_mid_payload"``).
CRASH_EXIT = 17
#: A round's payload must complete within this fraction of ``TransferConfig.timeout_s``
#: (:attr:`TransferConfig.data_timeout_s`), counted from the moment its transfers are posted;
#: past it the data group is aborted. Below 1 so that the driver's abort comes before NCCL's
#: watchdog (which acts at the group's timeout), and so that a peer waiting on the control
#: group for the outcome (a wait bounded by ``timeout_s``) hears of it in time.
DATA_DEADLINE_FRACTION = 0.5
#: The longest ``TransferConfig.timeout_s`` (one day): a process group's timeout must be a
#: finite ``timedelta``, and a run is bounded by a few times it.
MAX_TIMEOUT_S = 86_400.0

_INT64 = 1 << 63
_MASK64 = (1 << 64) - 1


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
        pipeline: rounds in flight (:data:`PIPELINES`): 1, sequential rounds; 2,
            double-buffered: round k's payload is posted and not waited before round k+1's
            lease, ROUND/REPLIES exchange and gather (GO of round k travels with ROUND of
            round k+1, one message). Both ranks must agree (the HELLO says it). Each image
            in flight needs its own destination slot and staging buffer: ``window *
            pipeline <= slots``, and each side holds ``window * pipeline`` staging buffers.
        backend: ``"gloo"`` (``device="cpu"``) or ``"nccl"`` (``device="cuda"``: rank r uses
            ``cuda:r``).
        device: ``"cpu"`` or ``"cuda"``.
        seed: seeds every image's bytes and prefix hash.
        payload: ``"staged"`` or ``"regions"`` (module doc).
        copy_engine: how a staged payload is gathered and landed (:data:`COPY_ENGINES`);
            the regions payload has nothing to gather.
        local_restore: the receiver keeps a local older image and queues its restore into
            each destination slot before the transfer (the restore D.12 suspends).
        verify: ``"round"``, ``"end"`` or ``"none"`` (:data:`VERIFY_MODES`).
        fault: one of :data:`FAULTS`; ``fault_image``: the image it strikes (the faults of
            a round, every one but ``duplicate`` and ``receiver_full``, strike the round
            holding it, at its first image; ignored with ``fault="none"``).
        receiver_block_tokens: the receiver's page size if it differs (a layout mismatch).
        baseline: after the protocol, time a plain send/recv of the same tensor sizes.
        timeout_s: the process groups' timeout in seconds (a control receive waits at most
            this long), at most :data:`MAX_TIMEOUT_S`; a round's payload has
            :attr:`data_timeout_s`.

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
    pipeline: int = 1
    backend: str = "gloo"
    device: str = "cpu"
    seed: int = 0
    payload: str = "staged"
    copy_engine: str = "auto"
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
        if type(self.pipeline) is not int or self.pipeline not in PIPELINES:
            raise InvalidArgumentError(
                f"pipeline must be an int in {PIPELINES}, got {self.pipeline!r}"
            )
        if self.receiver_units is not None:
            _positive("receiver_units", self.receiver_units)
        if self.receiver_block_tokens is not None:
            _positive("receiver_block_tokens", self.receiver_block_tokens)
        if self.window > self.slots:
            raise InvalidArgumentError(
                f"window ({self.window}) must be <= slots ({self.slots}): each image of a"
                " round lands in its own slot"
            )
        if self.window * self.pipeline > self.slots:
            raise InvalidArgumentError(
                f"window ({self.window}) x pipeline ({self.pipeline}) must be <= slots"
                f" ({self.slots}): each image of the {self.pipeline} rounds in flight lands"
                " in its own slot"
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
            ("copy_engine", COPY_ENGINES),
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
        if self.fault in MID_PAYLOAD_FAULTS:
            start = self.fault_image - self.fault_image % self.window
            if min(self.images, start + self.window) - start < 2:
                raise InvalidArgumentError(
                    f"fault {self.fault!r} needs a round of two images or more; image"
                    f" {self.fault_image} is alone in its round (images {self.images},"
                    f" window {self.window})"
                )
        if self.fault == "duplicate" and self.pipeline == 2:
            last_start = (self.images - 1) // self.window * self.window
            if self.fault_image >= last_start:
                # With two rounds in flight the resend (its own last round) is leased before
                # the last regular round is settled: an image still leased cannot be leased
                # again.
                raise InvalidArgumentError(
                    f"fault 'duplicate' with pipeline 2 resends image {self.fault_image} in the"
                    f" round after its own, while its lease is still open: pick a fault_image"
                    f" below {last_start} (images {self.images}, window {self.window}) or"
                    " pipeline 1"
                )
        if self.copy_engine == "triton" and self.payload == "staged" and self.device == "cpu":
            import importlib.util
            import os

            if importlib.util.find_spec("triton") is None:
                raise InvalidArgumentError("copy_engine 'triton' needs triton installed")
            if os.environ.get("TRITON_INTERPRET") != "1":
                raise InvalidArgumentError(
                    "copy_engine 'triton' on device 'cpu' needs TRITON_INTERPRET=1 (Triton's"
                    " interpreter) set before anything imports triton; on CPU use 'index' or"
                    " 'torch'"
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
        if self.fault == "duplicate" and self.receiver_block_tokens is None:
            # The resend must find the first copy still READY: every image, the local one
            # and the resend's own reservation at once (with less, the reservation may
            # evict the first copy and the "duplicate" is adopted as a new image).
            dup = rx_per_image * (self.images + 1 + (1 if self.local_restore else 0))
            if rx < dup:
                raise InvalidArgumentError(
                    f"fault 'duplicate' needs receiver_units >= {dup} (all {self.images}"
                    " images, the resend's reservation"
                    + (" and the local image" if self.local_restore else "")
                    + f", {rx_per_image} units each), got {rx}: with less, the resend may"
                    " evict the first copy"
                )

    @property
    def data_timeout_s(self) -> float:
        """Seconds a round's payload may take from the moment its transfers are posted:
        :data:`DATA_DEADLINE_FRACTION` x ``timeout_s``. Past it the data group is aborted and
        the round given up (``Link.exchange``)."""
        return DATA_DEADLINE_FRACTION * float(self.timeout_s)

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
