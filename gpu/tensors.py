"""The tensors a copy engine reads and writes: per-layer slot tensors and per-layer KV pages.

:class:`StateTensors` allocates them from a :class:`~pagedstate.gpu.geometry.CheckpointLayout`
(or wraps an engine's own tensors of the same shapes) and gives byte-level views for the
executors and tests: a slot's carried image, a unit's bytes, and the address tables a
descriptor is built from. Needs torch (the ``gpu`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pagedstate.spec.errors import InvalidArgumentError

from .geometry import CheckpointLayout

if TYPE_CHECKING:
    import torch as _t

__all__ = ["StateTensors", "torch_dtype"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the gpu extra is missing
        raise ImportError("pagedstate.gpu needs torch: pip install 'pagedstate[gpu]'") from exc
    return torch


def torch_dtype(name: str) -> Any:
    """The torch dtype of a geometry dtype name (``"bfloat16"``, ``"float32"``, ...)."""
    return getattr(_torch(), name)


class StateTensors:
    """Slot tensors and KV page tensors of one layout on one device.

    Attributes:
        layout: the layout the tensors follow.
        num_slots: slots per slot tensor (requests' live states).
        num_blocks: KV blocks (pool units) per KV tensor.
        slot_tensors: one tensor per :attr:`CheckpointLayout.slot_tensors` entry, shape
            ``[num_slots, *shape]`` and its dtype.
        kv_tensors: one bf16 tensor per attention layer, shape
            ``[num_blocks, region_bytes // 2]`` (one page per block).

    Args:
        layout: the checkpoint layout.
        num_slots: >= 1.
        num_blocks: >= ``layout.units_per_checkpoint``.
        device: a torch device (``"cpu"``, ``"cuda"``); tensors are allocated empty.
        slot_tensors, kv_tensors: an engine's own tensors instead (shapes and dtypes are
            checked; each must be contiguous).

    Raises:
        InvalidArgumentError: counts out of range, or given tensors of the wrong shape,
            dtype, device or layout.
    """

    def __init__(
        self,
        layout: CheckpointLayout,
        num_slots: int,
        num_blocks: int,
        device: Any = "cpu",
        *,
        slot_tensors: Sequence[Any] | None = None,
        kv_tensors: Sequence[Any] | None = None,
    ) -> None:
        torch = _torch()
        if type(num_slots) is not int or num_slots < 1:
            raise InvalidArgumentError(f"num_slots must be an int >= 1, got {num_slots!r}")
        if type(num_blocks) is not int or num_blocks < layout.units_per_checkpoint:
            raise InvalidArgumentError(
                f"num_blocks must be an int >= units_per_checkpoint"
                f" ({layout.units_per_checkpoint}), got {num_blocks!r}"
            )
        self.layout = layout
        self.num_slots = num_slots
        self.num_blocks = num_blocks
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        want_slots = [((num_slots, *t.shape), torch_dtype(t.dtype)) for t in layout.slot_tensors]
        want_kv = [((num_blocks, b // 2), torch.bfloat16) for b in layout.region_bytes]
        self.slot_tensors: list[_t.Tensor] = self._take("slot_tensors", slot_tensors, want_slots)
        self.kv_tensors: list[_t.Tensor] = self._take("kv_tensors", kv_tensors, want_kv)
        # The hazard check reasons about slots and units, so every tensor must be its own
        # memory: two given tensors sharing bytes would let one batch write them twice.
        spans = sorted(
            (x.data_ptr(), x.data_ptr() + x.numel() * x.element_size(), i)
            for i, x in enumerate([*self.slot_tensors, *self.kv_tensors])
            if x.numel()
        )
        for (_, end, i), (start, _, j) in zip(spans, spans[1:], strict=False):
            if start < end:
                raise InvalidArgumentError(
                    f"tensors {i} and {j} (slot tensors first, then KV) share memory: each"
                    " slot and KV tensor must be its own"
                )
        self._slot_rows: list[_t.Tensor] = [
            t.view(num_slots, -1).view(torch.uint8) for t in self.slot_tensors
        ]
        self._kv_rows: list[_t.Tensor] = [t.view(torch.uint8) for t in self.kv_tensors]
        self._carried = [t.carried_bytes for t in layout.slot_tensors]

    def _take(
        self, name: str, given: Sequence[Any] | None, want: Sequence[tuple[tuple[int, ...], Any]]
    ) -> list[Any]:
        torch = _torch()
        if given is None:
            return [torch.empty(shape, dtype=dt, device=self.device) for shape, dt in want]
        try:
            given = list(given)
        except TypeError:
            raise InvalidArgumentError(
                f"{name} must be a sequence of tensors, got {given!r}"
            ) from None
        if len(given) != len(want):
            raise InvalidArgumentError(f"{name}: {len(want)} tensors expected, got {len(given)}")
        for i, (t, (shape, dt)) in enumerate(zip(given, want, strict=True)):
            if not isinstance(t, torch.Tensor):
                raise InvalidArgumentError(f"{name}[{i}] must be a tensor, got {t!r}")
            if tuple(t.shape) != shape or t.dtype != dt or t.device != self.device:
                raise InvalidArgumentError(
                    f"{name}[{i}] must be {shape} {dt} on {self.device}, got"
                    f" {tuple(t.shape)} {t.dtype} on {t.device}"
                )
            if not t.is_contiguous():
                raise InvalidArgumentError(f"{name}[{i}] must be contiguous")
        return given

    # -- byte views ----------------------------------------------------------------------

    def _slot(self, slot: object) -> int:
        if type(slot) is not int or not 0 <= slot < self.num_slots:
            raise InvalidArgumentError(
                f"slot must be an int in [0, {self.num_slots}), got {slot!r}"
            )
        return slot

    def _unit(self, unit: object) -> int:
        if type(unit) is not int or not 0 <= unit < self.num_blocks:
            raise InvalidArgumentError(
                f"unit must be an int in [0, {self.num_blocks}), got {unit!r}"
            )
        return unit

    def _bytes(self, data: Any, n: int, what: str) -> Any:
        torch = _torch()
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.numel() != n:
            got = f"{tuple(data.shape)} {data.dtype}" if isinstance(data, torch.Tensor) else data
            raise InvalidArgumentError(f"{what} needs a uint8 tensor of {n} bytes, got {got!r}")
        return data.reshape(-1)

    def slot_row(self, tensor: int, slot: int) -> _t.Tensor:
        """Slot ``slot``'s whole row of slot tensor ``tensor`` as a uint8 view
        (``row_bytes`` bytes).

        Raises:
            InvalidArgumentError: ``slot`` is not an int in ``[0, num_slots)``."""
        return self._slot_rows[tensor][self._slot(slot)]

    @property
    def kv_rows(self) -> list[_t.Tensor]:
        """Each attention layer's KV tensor as uint8 rows, ``[num_blocks, region_bytes[r]]``
        (views: writes go to the KV tensors). For gathers over many units at once
        (``index_select`` / ``index_copy_`` with a unit index)."""
        return list(self._kv_rows)

    def unit_region(self, region: int, unit: int) -> _t.Tensor:
        """Unit ``unit``'s region ``region`` (its page in attention layer ``region``) as a
        uint8 view (``region_bytes[region]`` bytes).

        Raises:
            InvalidArgumentError: ``unit`` is not an int in ``[0, num_blocks)``."""
        return self._kv_rows[region][self._unit(unit)]

    def read_image(self, slot: int) -> _t.Tensor:
        """The carried bytes of ``slot`` in source-stream order (a new uint8 tensor of
        ``image_bytes``).

        Raises:
            InvalidArgumentError: ``slot`` is not an int in ``[0, num_slots)``."""
        torch = _torch()
        slot = self._slot(slot)
        rows = zip(self._slot_rows, self._carried, strict=True)
        out: _t.Tensor = torch.cat([r[slot, :c] for r, c in rows])
        return out

    def write_image(self, slot: int, data: Any) -> None:
        """Write ``image_bytes`` bytes (uint8 tensor) into ``slot``'s carried ranges.

        Raises:
            InvalidArgumentError: a bad slot, or ``data`` is not ``image_bytes`` uint8
                bytes (checked before anything is written)."""
        slot = self._slot(slot)
        data = self._bytes(data, self.layout.image_bytes, "write_image")
        pos = 0
        for r, c in zip(self._slot_rows, self._carried, strict=True):
            r[slot, :c].copy_(data[pos : pos + c])
            pos += c

    def read_slot(self, slot: int) -> _t.Tensor:
        """All bytes of ``slot``, carried or not, tensor by tensor (uint8, ``slot_bytes``).

        Raises:
            InvalidArgumentError: ``slot`` is not an int in ``[0, num_slots)``."""
        torch = _torch()
        slot = self._slot(slot)
        out: _t.Tensor = torch.cat([r[slot] for r in self._slot_rows])
        return out

    def read_units(self, unit_ids: Sequence[int]) -> _t.Tensor:
        """The destination stream over ``unit_ids``: regions unit-major, region-minor
        (uint8, ``len(unit_ids) * page_unit_bytes``).

        Raises:
            InvalidArgumentError: a unit is not an int in ``[0, num_blocks)``."""
        torch = _torch()
        units = [self._unit(u) for u in unit_ids]
        out: _t.Tensor = torch.cat([r[u] for u in units for r in self._kv_rows])
        return out

    def fill_unit(self, unit: int, data: Any) -> None:
        """Overwrite every region of ``unit`` with ``data`` (uint8, ``page_unit_bytes``).

        Raises:
            InvalidArgumentError: a bad unit, or ``data`` of another size or dtype (checked
                before anything is written)."""
        unit = self._unit(unit)
        data = self._bytes(data, self.layout.page_unit_bytes, "fill_unit")
        pos = 0
        for r in self._kv_rows:
            n = r.shape[1]
            r[unit].copy_(data[pos : pos + n])
            pos += n

    # -- address tables for descriptors ------------------------------------------------

    def slot_bases(self, slots: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``(len(slots), len(slot_tensors))`` byte addresses of each slot's carried ranges
        (each carried range starts its row)."""
        s = np.asarray(slots, dtype=np.int64).reshape(-1, 1)
        base = np.array([r.data_ptr() for r in self._slot_rows], dtype=np.int64)
        stride = np.array([r.stride(0) for r in self._slot_rows], dtype=np.int64)
        return base + s * stride

    def unit_bases(self, unit_ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``(copies, U * R)`` byte addresses of each copy's unit regions, unit-major and
        region-minor (SPEC E.3), from ``(copies, U)`` unit ids."""
        u = np.asarray(unit_ids, dtype=np.int64)
        base = np.array([r.data_ptr() for r in self._kv_rows], dtype=np.int64)
        stride = np.array([r.stride(0) for r in self._kv_rows], dtype=np.int64)
        return (base + u[..., None] * stride).reshape(u.shape[0], -1)

    def all_tensors(self) -> list[_t.Tensor]:
        """Every tensor, slot tensors first (for a kernel's base pointer)."""
        return [*self.slot_tensors, *self.kv_tensors]
