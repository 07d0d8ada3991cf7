"""A round's staging rows, filled and emptied by the copy engine in one launch per round.

The staged payload (docs/transfer.md) moves an image as one contiguous message: the
sender *gathers* the image's unit regions into a staging buffer (the destination stream of
SPEC E.3: regions unit-major, region-minor, trimmed to ``image_bytes``) and the receiver
*lands* the buffer into its reserved units. That is exactly what a restore and a store do
with a slot whose one carried range is the whole stream. :class:`StagingRows` therefore
builds a second view of the rank's tensors: a *staging layout* (the rank's layout with its
slot tensors replaced by one ``uint8`` row of ``image_bytes``, padded to 256 bytes; same
``layout_id``, same unit regions) over ``window`` staging rows and the rank's own KV
tensors, and runs the gather of a round as one batch of restore ops (units -> row k) and
the landing as one batch of store ops (row k -> units) through a copy executor:

- ``"triton"`` (CUDA, or the Triton interpreter): :class:`~pagedstate.gpu.triton_copy.
  TritonCopyExecutor`, one kernel launch per round whatever the images, units or regions;
  the host uploads O(images + runs) integers, never a per-unit index tensor (the
  ``"index"`` path's blocking host-to-device copy of the unit ids is gone);
- ``"torch"``: :class:`~pagedstate.gpu.executor.TorchCopyExecutor` (O(spans) tensor
  operations per round: the reference, slow at small pages);
- ``"index"`` is not this class: it is the driver's own per-image path (one
  ``index_select``/``index_copy_`` per region, see :mod:`pagedstate.impl.transfer.side`),
  kept as the default on CPU where it is the fastest.

Validation is the executor's (SPEC E.5 step 1): every unit in range, one image's units per
op, no two ops of a round writing one unit or one row; a refused round writes nothing.

Like the rest of the driver this module takes ``pagedstate.gpu`` and torch by name at run
time: ``pagedstate.impl`` imports only ``pagedstate.spec`` statically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from pagedstate.spec.errors import InvalidArgumentError
from pagedstate.spec.ops import CheckpointRestoreOp, CheckpointStoreOp, UnitRuns, unit_runs

from .errors import _module

__all__ = ["ENGINES", "StagingRows", "staging_layout"]

#: The copy executors :class:`StagingRows` can run (``"auto"``: Triton on CUDA when
#: Triton is installed, otherwise torch).
ENGINES = ("auto", "triton", "torch")

#: Staging rows are padded to this many bytes, so that every address and length the
#: staging layout produces stays a multiple of 16 bytes (the Triton kernel's vector path)
#: and each row starts on an allocation-aligned boundary.
ROW_ALIGN = 256


def _runs_of(units: Sequence[int]) -> UnitRuns:
    """``unit_runs(units)``, with one comparison at C speed when ``units`` is one run (the
    common case: the pool hands out the fewest runs it can). ``units`` come from this
    rank's coordinator (a lease's or a reservation's units: ints in range)."""
    n = len(units)
    if n:
        a = units[0]
        if type(a) is int and units[-1] - a == n - 1 and tuple(units) == tuple(range(a, a + n)):
            return ((a, n),)
    return unit_runs(units)


def staging_layout(layout: Any) -> Any:
    """``layout`` (a :class:`~pagedstate.gpu.geometry.CheckpointLayout`) with its slot
    tensors replaced by one ``uint8`` row: ``image_bytes`` carried, padded to a multiple of
    :data:`ROW_ALIGN` bytes. The ``layout_id``, ``image_bytes``, unit regions and units per
    image are ``layout``'s (a staging row holds exactly an image's stream), so ops made for
    ``layout`` validate against it."""
    geometry = _module("pagedstate.gpu.geometry")
    n = layout.image_bytes
    padded = -(-n // ROW_ALIGN) * ROW_ALIGN
    row = geometry.SlotTensorInfo("staging", (padded,), "uint8", padded, n)
    return attrs.evolve(layout, slot_tensors=(row,))


class StagingRows:
    """``window`` staging rows of one layout and the executor that gathers images into them
    and lands them from them, one launch per round (module doc).

    Attributes:
        layout: the staging layout (:func:`staging_layout` of the given one).
        rows: ``[window, row_bytes]`` uint8 on the device; row ``k`` holds image ``k`` of
            the round, its first ``image_bytes`` bytes the image's stream.
        engine: ``"triton"`` or ``"torch"``, the executor chosen.
        executor: the copy executor over the staging tensors.

    Args:
        layout: the rank's :class:`~pagedstate.gpu.geometry.CheckpointLayout`.
        kv_tensors: the rank's KV tensors (its ``StateTensors.kv_tensors``: shared, not
            copied).
        window: rows (images per round), >= 1.
        num_units: units of the rank's pool (the KV tensors' blocks).
        device: the KV tensors' device.
        engine: one of :data:`ENGINES`.

    Raises:
        InvalidArgumentError: ``window`` or ``engine`` out of range, KV tensors that do not
            fit the layout (the executor's and ``StateTensors``' checks), ``"triton"``
            asked for without Triton or without CUDA (and no interpreter).
    """

    def __init__(
        self,
        layout: Any,
        kv_tensors: Sequence[Any],
        window: int,
        num_units: int,
        device: Any,
        engine: str = "auto",
    ) -> None:
        if type(window) is not int or window < 1:
            raise InvalidArgumentError(f"window must be an int >= 1, got {window!r}")
        if engine not in ENGINES:
            raise InvalidArgumentError(f"engine must be one of {ENGINES}, got {engine!r}")
        tensors_mod = _module("pagedstate.gpu.tensors")
        executor_mod = _module("pagedstate.gpu.executor")
        triton_mod = _module("pagedstate.gpu.triton_copy")
        torch = _module("torch")
        self.layout = staging_layout(layout)
        self._image_bytes = int(layout.image_bytes)
        self._layout_id = layout.layout_id
        self.tensors = tensors_mod.StateTensors(
            self.layout, window, num_units, device, kv_tensors=list(kv_tensors)
        )
        self.rows: Any = self.tensors.slot_tensors[0]
        self.rows.zero_()  # touched once (no first-touch faults in a timed round)
        on_cuda = self.tensors.device.type == "cuda"
        if engine == "auto":
            engine = (
                "triton"
                if triton_mod.triton_available() and (on_cuda or triton_mod.interpreting())
                else "torch"
            )
        if engine == "triton":
            if not triton_mod.triton_available():
                raise InvalidArgumentError("engine='triton' needs triton installed")
            self.executor: Any = triton_mod.TritonCopyExecutor(
                self.tensors, window, max_scrub_units=0
            )
        else:
            self.executor = executor_mod.TorchCopyExecutor(self.tensors, window)
        self.engine = engine
        self.window = window
        self._torch = torch

    def wire(self, k: int) -> Any:
        """Row ``k``'s first ``image_bytes`` bytes: what travels for image ``k`` of a round
        (a contiguous view)."""
        return self.rows[k, : self._image_bytes]

    def _ops(
        self, cls: Any, images: Sequence[Sequence[int]], at: Sequence[int] | None
    ) -> list[Any]:
        if not isinstance(images, (list, tuple)):
            raise InvalidArgumentError(
                f"images must be a list or tuple of unit sequences, got {type(images).__name__}"
            )
        if len(images) > self.window:
            raise InvalidArgumentError(
                f"a round of {len(images)} images; there are {self.window} staging rows"
            )
        if at is None:
            at = range(len(images))
        elif not isinstance(at, (list, tuple, range)):
            raise InvalidArgumentError(f"at must be a list or tuple of rows, got {at!r}")
        elif len(at) != len(images):
            raise InvalidArgumentError(f"{len(images)} images but {len(at)} rows named")
        elif len(set(at)) != len(at):
            # two gathers into one row, or two landings from one: the executor sees reads of
            # one slot (allowed), so it is refused here
            raise InvalidArgumentError(f"at names a row twice: {list(at)}")
        n, lid = self._image_bytes, self._layout_id
        # a row out of range or named twice is the executor's to refuse (a slot, SPEC E.5)
        return [
            cls.from_runs(k, _runs_of(units), n, lid) for k, units in zip(at, images, strict=True)
        ]

    def gather(self, images: Sequence[Sequence[int]], at: Sequence[int] | None = None) -> None:
        """Copy image ``k``'s units (piece order) into row ``k`` (or ``at[k]``), for every
        image of the round, in one batch (one launch with Triton). Asynchronous on CUDA (the current
        stream): later writers of those units queued on that stream run after it.

        Raises:
            InvalidArgumentError: more images than rows, ``images`` or ``at`` not a list or
                tuple, ``at`` of another length or naming a row twice; nothing copied.
            CopyOpError, BatchHazardError: the executor refused the round (a unit or row
                out of range, the wrong number of units, ...): nothing was copied.
        """
        self.executor.execute((), self._ops(CheckpointRestoreOp, images, at))

    def land(self, images: Sequence[Sequence[int]], at: Sequence[int] | None = None) -> None:
        """Copy row ``k`` (or ``at[k]``) into image ``k``'s units (piece order), for every
        image of the round, in one batch (one launch with Triton). Only the image's bytes
        are written: a unit's tail past ``image_bytes`` keeps what it held (as after any
        store).

        Raises:
            InvalidArgumentError: more images than rows, ``images`` or ``at`` not a list or
                tuple, ``at`` of another length or naming a row twice; nothing written.
            CopyOpError, BatchHazardError: the executor refused the round (two images
                sharing a unit, a unit or row out of range, ...): nothing was written.
        """
        self.executor.execute(self._ops(CheckpointStoreOp, images, at), ())
