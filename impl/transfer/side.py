"""What both ranks own (:class:`_Side`: layout, pool, coordinator, tensors, executor) and
the images in flight on each side (:class:`Outgoing`, :class:`Incoming`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from pagedstate.impl import PagedStateCheckpointCoordinator, UnitPool
from pagedstate.spec import check_invariants
from pagedstate.spec.errors import InvalidArgumentError

from .config import _INT64, TransferConfig, _mix64, _need_config, layout_digest
from .errors import TransferError, _module
from .wire import ImageHeader, LoadOperationId


def _round_of(xs: object, cls: type, name: str) -> None:
    """Raise InvalidArgumentError unless ``xs`` is a list or tuple of ``cls`` instances,
    none named twice (a round's images, before anything of the round is done)."""
    if not isinstance(xs, (list, tuple)):
        raise InvalidArgumentError(
            f"{name} must be a list or tuple of {cls.__name__}, got {type(xs).__name__}"
        )
    for x in xs:
        if not isinstance(x, cls):
            raise InvalidArgumentError(f"{name} must hold {cls.__name__}s, got {x!r}")
    if len({id(x) for x in xs}) != len(xs):
        raise InvalidArgumentError(f"{name} names one image twice")


def _in_state(x: Outgoing | Incoming, state: str) -> None:
    """Raise :class:`TransferError` unless the image ``x`` is in ``state`` (a step taken out
    of order: leasing, landing, adopting an image twice or after it ended)."""
    if x.state != state:
        raise TransferError(f"image {x.header.index} is {x.state}, not {state}")


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
    ``"duplicate"``; or ``"reserved"``/``"landed"`` -> ``"aborted"`` (reservation released);
    or ``"reserved"`` -> ``"quarantined"`` (a receive that could not be aborted may still
    land: the reservation is kept to the end of the run)."""

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
        tensors_mod = _module("pagedstate.gpu.tensors")
        executor_mod = _module("pagedstate.gpu.executor")
        self.layout = cfg.layout(block_tokens)
        self.spec = self.layout.spec()
        self.digest = layout_digest(self.layout.layout_id)
        self.pool = UnitPool(units)
        self.coord = PagedStateCheckpointCoordinator(self.pool, self.spec, True)
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
        #: One staging tensor per image in flight (``staged`` payloads, and the baseline):
        #: ``window * pipeline`` of them, round ``k`` owning the ``window`` that start at
        #: :meth:`buffer_base` ``(k)`` (with ``pipeline=2`` round k+1 is gathered into its
        #: half while round k's payload is in flight from the other). ``image_bytes`` on the
        #: wire (:meth:`wire`); on the fast path padded to whole units (the padding of a
        #: receiver's staging is never written, so it stays zero and a landed unit's tail
        #: past the image is zero, as a scrubbed unit's).
        self.staging = [
            torch.zeros(padded, dtype=torch.uint8, device=self.device)
            for _ in range(cfg.window * cfg.pipeline)
        ]
        #: The copy engine over the round's staging rows (``copy_engine`` ``"triton"`` or
        #: ``"torch"``, or ``"auto"`` on CUDA with Triton), or None (the per-image index path).
        #: With it, :attr:`staging` are its rows (``image_bytes`` padded to 256 B) and a
        #: round is gathered and landed in one batch (:meth:`Sender.gather_round`,
        #: :meth:`Receiver.land_round`).
        self.rows: Any = None
        self.copy_engine = "index"
        engine = cfg.copy_engine
        if engine == "auto" and cfg.payload == "staged" and self.device.type == "cuda":
            engine = "triton" if _module("pagedstate.gpu.triton_copy").triton_available() else ""
        if engine in ("triton", "torch") and cfg.payload == "staged":
            self._units = units
            self.new_rows(engine)

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

    def new_rows(self, engine: str | None = None) -> None:
        """(Re)build the copy engine's staging rows (fresh tensors: rows a late receive may
        still write are dropped, never reused) and point :attr:`staging` at them."""
        staging_mod = _module("pagedstate.impl.transfer.staging")
        n = self.cfg.window * self.cfg.pipeline
        self.rows = staging_mod.StagingRows(
            self.layout,
            self.tensors.kv_tensors,
            n,
            self._units,
            self.device,
            engine or self.copy_engine,
        )
        self.copy_engine = self.rows.engine
        self.staging = [self.rows.rows[k] for k in range(n)]

    def buffer_base(self, rnd: int) -> int:
        """The first staging buffer and destination slot of round ``rnd``: round ``rnd``
        owns ``window`` of each from there (``(rnd % pipeline) * window``), so the rounds in
        flight never share one."""
        return (rnd % self.cfg.pipeline) * self.cfg.window

    def _round_buffers(self, n: int, base: int) -> None:
        """Check that a round of ``n`` images from staging buffer ``base`` fits.

        Raises:
            InvalidArgumentError: ``base`` not an int >= 0, or past the staging buffers."""
        if type(base) is not int or base < 0 or base + n > len(self.staging):
            raise InvalidArgumentError(
                f"a round of {n} images from staging buffer {base!r}; there are"
                f" {len(self.staging)} staging buffers"
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

    def _row_of(self, staging: Any) -> int:
        """Which of :attr:`staging` (the copy engine's rows) ``staging`` is.

        Raises:
            InvalidArgumentError: none of them (with the copy engine a staging buffer must be
                one of its rows)."""
        for k, row in enumerate(self.staging):
            if row is staging:
                return k
        raise InvalidArgumentError(
            "with the copy engine a staging buffer must be one of this rank's staging rows"
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
