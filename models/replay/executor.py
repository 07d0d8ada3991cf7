"""Copy executors for ``pagedstate replay --executor`` (real tensors, every restore checked).

:func:`make_executor_factory` gives :class:`~pagedstate.models.replay.ReplayEngine` the
``executor_factory`` it takes: called with ``(layout, pool_units, slots, pool)`` it builds a
:class:`TensorReplayExecutor`, which holds ``pagedstate.gpu`` ``StateTensors`` (``slots``
slot rows and ``pool_units`` KV pages), runs every drain's stores and restores on them with
the torch or the Triton copy executor, zero-fills the pool's dirty free units in the same
launch (SPEC G10), and checks every restored slot bit for bit.

Scaling (why the bytes are not the model's)
-------------------------------------------
The engine's pool is the model's: ``pool_gib`` of units of ``page_unit_bytes`` (12 MiB for
Qwen3-Next at 512-token pages), and an image is ``units_per_checkpoint`` of them. Holding
that on a CPU is out of the question, so when ``pool_units * page_unit_bytes + slots *
slot_bytes`` exceeds ``max_bytes`` the executor builds its tensors from a *slice* of the
geometry (``ModelGeometry.sliced(recurrent_layers, attention_layers, divide)``: the first
layers, conv channels, SSM heads and KV bytes per token divided by ``divide``) chosen so that

- the slice has **the same ``units_per_checkpoint``** as the model (an op's unit ids are the
  store's, verbatim: the same number of units per image, every unit id ``< pool_units``, every
  slot ``< slots``, so a store that names a wrong or released unit, or misorders an image's
  units, is caught exactly as at full size);
- the tensors take at most ``max_bytes``, and as many as possible under it (the slice with
  the most bytes; ties go to the one with more layers, so more spans per copy).

The unit *count* and slot count are never scaled, only the bytes of each. The store itself
still works in the model's layout (its spec is ``layout.spec()``, so its free-unit
arithmetic is the model's), and its ops carry the model's ``layout_id`` and ``image_bytes``.
The executor **translates** each op: it checks ``layout_id`` and ``total_bytes`` against the
model's layout (``CopyOpError`` otherwise, as a worker of another layout would refuse it,
SPEC F61) and rewrites them to the slice's before the copy executor validates the batch
again against its own tensors (unit count, ranges, duplicates, hazards). When the model's
geometry fits in ``max_bytes`` (a GPU, a small pool) no slice is taken and the ops go to the
copy executor untouched.

What a check means
------------------
``set_state(slot, key)`` writes the image of ``key``: ``image_bytes`` pseudo-random bytes
from a generator seeded with a 64-bit mix of ``key`` (every carried byte; distinct keys give
distinct images), and fills the slot's non-carried bytes (speculative conv rows, only with
``spec_tokens > 0``) from another seed. Before a batch runs, each restore's destination slot
has its carried bytes poisoned (``0xA5``), so a restore that leaves any carried byte
unwritten is caught even when the slot happened to hold the right image already. After the
batch, ``check_restored(slot, key)`` compares the slot's carried bytes with the image of
``key`` and its non-carried bytes with what the last ``set_state`` put there (a restore must
not write them), and raises :class:`RestoreMismatch` naming the slot, the key, the first
differing byte and the slot tensor it lies in. KV pages start filled with ``0xDB`` (bytes
nobody wrote), and scrubbed units read zero.

``models`` does not import ``pagedstate.gpu`` (nor torch) statically: both are taken by name
when a factory is made, and a missing one is a :class:`~pagedstate.models.replay.ReplayError`.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from pagedstate.spec.errors import CopyOpError
from pagedstate.spec.types import CheckpointRestoreOp, CheckpointStoreOp

from .errors import ReplayError

__all__ = [
    "CPU_MAX_BYTES",
    "CUDA_FREE_SHARE",
    "EXECUTOR_KINDS",
    "POISON",
    "UNWRITTEN",
    "RestoreMismatch",
    "TensorReplayExecutor",
    "choose_slice",
    "image_seed",
    "make_executor_factory",
]

#: The executors ``make_executor_factory`` builds.
EXECUTOR_KINDS = ("torch", "triton")
#: Default ``max_bytes`` for tensors on a CPU (256 MiB).
CPU_MAX_BYTES = 256 << 20
#: Default ``max_bytes`` on CUDA: this share of the device's free memory when the executor
#: is built (the rest is left to the copy executor's buffers and to the check's temporaries).
CUDA_FREE_SHARE = 0.8
#: Byte a restore's destination is filled with before the batch (every carried byte must
#: then be written by the restore).
POISON = 0xA5
#: Byte the KV pages hold before any store or scrub writes them.
UNWRITTEN = 0xDB

_MASK64 = (1 << 64) - 1
_SIDE_SALT = 0x5DE1_C0DE_5DE1_C0DE


class RestoreMismatch(AssertionError):
    """A restored slot does not hold the image it should, bit for bit.

    Attributes:
        slot: the restore's destination slot.
        key: the state key (prefix hash) the slot should hold.
        offset: the first differing byte: an offset into the carried image (source-stream
            order) when ``carried``, else into the whole slot row set (slot tensors in
            order, ``read_slot``'s order).
        carried: whether that byte is carried by the image (False: a restore wrote a byte
            outside the image, e.g. a speculative conv row).
        tensor: the name of the slot tensor the byte lies in (``"layer3.ssm"``).
        got, want: the byte found and the byte expected.
        batch: how many batches the executor had run (the failing restore's is the last).
    """

    def __init__(
        self,
        slot: int,
        key: int,
        offset: int,
        carried: bool,
        tensor: str,
        got: int,
        want: int,
        batch: int,
    ) -> None:
        self.slot = slot
        self.key = key
        self.offset = offset
        self.carried = carried
        self.tensor = tensor
        self.got = got
        self.want = want
        self.batch = batch
        where = "image" if carried else "slot (a byte the image does not carry)"
        super().__init__(
            f"restore into slot {slot} after batch {batch} is not the image of key {key}:"
            f" first differing byte at {where} offset {offset} (in {tensor}):"
            f" got 0x{got:02x}, expected 0x{want:02x}"
        )


def image_seed(key: int) -> int:
    """The generator seed of ``key``'s image: splitmix64's finaliser over ``key mod 2**64``
    (a bijection on 64 bits, so distinct keys of the engine, prefix hashes ``>= 0`` and
    negative keys ``> -2**63``, give distinct seeds). In ``[0, 2**64)``."""
    x = key & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _module(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ReplayError(f"{what} needs {name} ({e}): pip install 'pagedstate[gpu]'") from None


def _exactly(value: Any, cls: type) -> bool:
    """``type(value) is cls`` (as validate_batch: no subclass), without narrowing ``value``."""
    return type(value) is cls


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_slice(layout: Any, pool_units: int, slots: int, max_bytes: int) -> tuple[Any, int]:
    """The layout the executor's tensors follow, and the bytes they take.

    ``layout`` itself when ``pool_units * page_unit_bytes + slots * slot_bytes <=
    max_bytes``; otherwise the layout (same ``block_tokens`` and ``spec_tokens``) of the
    slice ``layout.geometry.sliced(r, a, d)`` with the same ``units_per_checkpoint`` that
    takes the most bytes up to ``max_bytes`` (ties: more recurrent layers, then more
    attention layers). The slice's image and page are ``r / R / d`` and ``a / A / d`` of
    the model's (``R``, ``A``: its layer counts); see the module docstring. O(R * A *
    divisors) arithmetic, one layout built.

    Raises:
        ReplayError: no slice fits (the message gives the smallest one's bytes).
    """
    full = pool_units * layout.page_unit_bytes + slots * layout.slot_bytes
    if full <= max_bytes:
        return layout, full
    g = layout.geometry
    spec = layout.spec_tokens
    units = layout.units_per_checkpoint
    dims = [g.ssm_shape[0], g.kv_bytes_per_token] + ([g.conv_shape[0]] if g.conv_shape else [])
    carried = (g.conv_shape[1] * g.conv_bytes_per_row() if g.conv_shape else 0) + g.ssm_bytes()
    per_layer = g.state_bytes_per_layer(spec)
    page = layout.block_tokens * g.kv_bytes_per_token
    best: tuple[int, int, int, int] | None = None  # (bytes, rec, attn, divide)
    smallest = math.inf
    for d in _divisors(math.gcd(*dims)):
        if g.kv_bytes_per_token // d % 2:
            continue
        for a in range(1, g.num_attention_layers + 1):
            unit = a * page // d
            for r in range(1, g.num_recurrent_layers + 1):
                if -(-(r * carried // d) // unit) != units:
                    continue
                size = pool_units * unit + slots * (r * per_layer // d)
                smallest = min(smallest, size)
                if size <= max_bytes and (best is None or (size, r, a) > best[:3]):
                    best = (size, r, a, d)
    if best is None:
        need = f"{int(smallest):,} bytes" if math.isfinite(smallest) else "an impossible size"
        raise ReplayError(
            f"{pool_units:,} units and {slots} slots of {g.model_id} take {full:,} bytes, over"
            f" the executor's max_bytes of {max_bytes:,}; the smallest slice with"
            f" {units} units per image takes {need}: raise max_bytes or lower the pool"
        )
    size, r, a, d = best
    sliced = g.sliced(r, a, d).layout(layout.block_tokens, spec)
    if sliced.units_per_checkpoint != units:  # pragma: no cover - the arithmetic above
        raise AssertionError(f"slice {r}/{a}/{d} of {g.model_id} changed the units per image")
    return sliced, size


class TensorReplayExecutor:
    """A :class:`~pagedstate.models.replay.ReplayExecutor` on real tensors (module doc).

    Args:
        kind: ``"torch"`` (``TorchCopyExecutor``) or ``"triton"`` (``TritonCopyExecutor``,
            with ``max_ops_per_batch = 2 * slots``, SPEC E.5, and its default 256 scrub
            units per batch).
        layout: the model's ``CheckpointLayout`` (the one the store's spec came from).
        pool_units: the pool's unit count (KV pages per KV tensor).
        slots: state slots (rows per slot tensor).
        pool: the store's unit pool (``dirty_units``, ``owner_of``, ``mark_clean``).
        device: a torch device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        max_bytes: the most bytes the slot and KV tensors may take (see
            :func:`choose_slice`); the copy executor's buffers are extra.

    Attributes:
        full_layout: the model's layout; ``layout``: the tensors' (a slice, or the same).
        tensors: the ``StateTensors``; ``executor``: the copy executor.

    Raises:
        ReplayError: no slice fits ``max_bytes``.
    """

    def __init__(
        self,
        kind: str,
        layout: Any,
        pool_units: int,
        slots: int,
        pool: Any,
        *,
        device: str,
        max_bytes: int,
    ) -> None:
        self._torch = torch = _module("torch", "the replay executor")
        tensors_mod = _module("pagedstate.gpu.tensors", "the replay executor")
        executor_mod = _module("pagedstate.gpu.executor", "the replay executor")
        self._free_dirty_units: Callable[..., list[int]] = executor_mod.free_dirty_units
        self.kind = kind
        self.full_layout = layout
        self.pool = pool
        self.layout, self.tensor_bytes = choose_slice(layout, pool_units, slots, max_bytes)
        self.max_bytes = max_bytes
        self.scaled = self.layout is not layout
        self.tensors = tensors_mod.StateTensors(self.layout, slots, pool_units, device)
        self.device = self.tensors.device
        if kind == "triton":
            triton_mod = _module("pagedstate.gpu.triton_copy", "--executor triton")
            self.executor = triton_mod.TritonCopyExecutor(self.tensors, 2 * slots)
        else:
            self.executor = executor_mod.TorchCopyExecutor(self.tensors)
        self._gen = torch.Generator(device=self.device)
        lay = self.layout
        self._carried = [(t.name, t.carried_bytes, t.row_bytes) for t in lay.slot_tensors]
        self._side_bytes = lay.slot_bytes - lay.image_bytes
        #: slot -> the key whose side pattern its non-carried bytes hold
        self._side_key: dict[int, int] = {}
        for kv in self.tensors.kv_tensors:
            kv.view(torch.uint8).fill_(UNWRITTEN)
        for slot in range(slots):
            self._poison(slot)
            self._write_side(slot, -(1 << 62) - slot)
        self.counts: dict[str, int] = dict.fromkeys(
            (
                "set_states",
                "batches",
                "stores",
                "restores",
                "restores_checked",
                "scrubbed_units",
                "bytes_copied",
                "modelled_bytes_copied",
                "scrub_bytes",
            ),
            0,
        )
        self.seconds: dict[str, float] = dict.fromkeys(("set_state", "execute", "check"), 0.0)

    # -- images -----------------------------------------------------------------------------

    def _random(self, seed: int, n: int) -> Any:
        """``n`` pseudo-random bytes (uint8 on the tensors' device) of ``seed``."""
        torch = self._torch
        self._gen.manual_seed(seed)
        words = torch.randint(
            -(1 << 63),
            (1 << 63) - 1,
            (-(-n // 8),),
            dtype=torch.int64,
            generator=self._gen,
            device=self.device,
        )
        return words.view(torch.uint8)[:n]

    def image(self, key: int) -> Any:
        """The carried bytes of ``key``'s state: ``image_bytes`` uint8 (the slice's), in
        source-stream order, on the tensors' device. Deterministic in ``key``."""
        return self._random(image_seed(key), self.layout.image_bytes)

    def _side(self, key: int) -> Any:
        return self._random(image_seed(key ^ _SIDE_SALT), self._side_bytes)

    def _write_side(self, slot: int, key: int) -> None:
        self._side_key[slot] = key
        if not self._side_bytes:
            return
        data, pos = self._side(key), 0
        for t, (_, carried, row) in enumerate(self._carried):
            if row > carried:
                self.tensors.slot_row(t, slot)[carried:].copy_(data[pos : pos + row - carried])
                pos += row - carried

    def _poison(self, slot: int) -> None:
        for t, (_, carried, _) in enumerate(self._carried):
            self.tensors.slot_row(t, slot)[:carried].fill_(POISON)

    # -- the ReplayExecutor protocol --------------------------------------------------------

    def set_state(self, slot: int, key: int) -> None:
        """Write ``key``'s image into ``slot``'s carried bytes and the side pattern of
        ``key`` into its non-carried bytes (the engine computed up to that state).

        Raises:
            InvalidArgumentError: ``slot`` is not an int in ``[0, slots)``."""
        t0 = time.perf_counter()
        self.tensors.write_image(slot, self.image(key))
        self._write_side(slot, key)
        self.counts["set_states"] += 1
        self.seconds["set_state"] += time.perf_counter() - t0

    def _translate(self, ops: Sequence[Any], cls: type, what: str) -> list[Any]:
        """The ops in the tensors' layout (the module doc's translation)."""
        ops = list(ops)
        if not self.scaled:
            return ops
        full, lay = self.full_layout, self.layout
        out: list[Any] = []
        for i, op in enumerate(ops):
            if not _exactly(op, cls):
                raise CopyOpError(f"{what} {i}: expected a {cls.__name__}, got {type(op).__name__}")
            if op.layout_id != full.layout_id:
                raise CopyOpError(
                    f"{what} {i}: layout_id {op.layout_id!r} is not the replayed model's"
                    f" {full.layout_id!r}"
                )
            if type(op.total_bytes) is not int or op.total_bytes != full.image_bytes:
                raise CopyOpError(
                    f"{what} {i}: total_bytes {op.total_bytes!r} != image_bytes {full.image_bytes}"
                )
            slot = op.src_slot if cls is CheckpointStoreOp else op.dst_slot
            out.append(cls(slot, op.unit_ids, lay.image_bytes, lay.layout_id))
        return out

    def run_batch(self, stores: Sequence[Any], restores: Sequence[Any]) -> None:
        """Run one drain's ops: translate them (when scaled), poison each restore's
        destination, list the pool's dirty free units (at most the copy executor's
        ``max_scrub_units``), copy and scrub in one ``execute``, then ``pool.mark_clean``
        the scrubbed units. Waits for the device (CUDA) so ``execute`` seconds are the
        batch's whole time.

        Raises:
            CopyOpError, BatchHazardError, BatchTooLargeError: the batch was refused (see
                ``pagedstate.gpu.executor.validate_batch``); nothing was copied or scrubbed.
        """
        s_ops = self._translate(stores, CheckpointStoreOp, "store")
        r_ops = self._translate(restores, CheckpointRestoreOp, "restore")
        t0 = time.perf_counter()
        ex = self.executor
        scrub = self._free_dirty_units(self.pool, ex.max_scrub_units)
        ex.check(s_ops, r_ops, scrub)  # refuse before poisoning anything
        for op in r_ops:
            self._poison(op.dst_slot)
        ex.execute(s_ops, r_ops, scrub)
        if scrub:
            self.pool.mark_clean(scrub)
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)
        self.seconds["execute"] += time.perf_counter() - t0
        c = self.counts
        copies = len(s_ops) + len(r_ops)
        c["batches"] += 1
        c["stores"] += len(s_ops)
        c["restores"] += len(r_ops)
        c["scrubbed_units"] += len(scrub)
        c["bytes_copied"] += copies * self.layout.image_bytes
        c["modelled_bytes_copied"] += copies * self.full_layout.image_bytes
        c["scrub_bytes"] += len(scrub) * self.layout.page_unit_bytes

    def check_restored(self, slot: int, key: int) -> None:
        """``slot``'s carried bytes are ``key``'s image and its non-carried bytes are as the
        last ``set_state`` of the slot left them, bit for bit.

        Raises:
            RestoreMismatch: naming the slot, the key and the first differing byte.
            InvalidArgumentError: ``slot`` is not an int in ``[0, slots)``."""
        t0 = time.perf_counter()
        torch = self._torch
        want = self.image(key)
        side = self._side(self._side_key[slot]) if self._side_bytes else None
        pos = spos = soff = 0
        for t, (name, carried, row) in enumerate(self._carried):
            got = self.tensors.slot_row(t, slot)
            if not torch.equal(got[:carried], want[pos : pos + carried]):
                i = int((got[:carried] != want[pos : pos + carried]).nonzero()[0, 0])
                b, w = int(got[i]), int(want[pos + i])
                raise RestoreMismatch(slot, key, pos + i, True, name, b, w, self.counts["batches"])
            if side is not None and row > carried:
                n = row - carried
                if not torch.equal(got[carried:], side[spos : spos + n]):
                    i = int((got[carried:] != side[spos : spos + n]).nonzero()[0, 0])
                    b, w = int(got[carried + i]), int(side[spos + i])
                    raise RestoreMismatch(
                        slot, key, soff + carried + i, False, name, b, w, self.counts["batches"]
                    )
                spos += n
            pos += carried
            soff += row
        self.counts["restores_checked"] += 1
        self.seconds["check"] += time.perf_counter() - t0

    def stats(self) -> dict[str, Any]:
        """JSON-serialisable figures: ``kind``, ``device``, ``scaled``, the tensors' geometry
        (``layout``: the slice's ``describe()`` plus ``units``, ``slots``,
        ``tensor_bytes``, ``max_bytes``, ``scale``: slice image bytes / model image bytes),
        the model's ``layout_id``, ``counts`` (set_states, batches, stores, restores,
        restores_checked, scrubbed_units; bytes_copied and scrub_bytes in the tensors'
        bytes, modelled_bytes_copied in the model's) and ``seconds`` (set_state, execute,
        check: wall seconds)."""
        lay = self.layout
        geometry: dict[str, Any] = dict(lay.describe())
        geometry.update(
            units=self.tensors.num_blocks,
            slots=self.tensors.num_slots,
            tensor_bytes=self.tensor_bytes,
            max_bytes=self.max_bytes,
            scale=lay.image_bytes / self.full_layout.image_bytes,
        )
        return {
            "kind": self.kind,
            "device": str(self.device),
            "scaled": self.scaled,
            "layout": geometry,
            "model_layout_id": self.full_layout.layout_id,
            "counts": dict(self.counts),
            "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
        }


def make_executor_factory(
    kind: str, *, device: str | None = None, max_bytes: int | None = None
) -> Callable[..., TensorReplayExecutor]:
    """The ``executor_factory`` of :class:`~pagedstate.models.replay.ReplayEngine` for
    ``kind`` (``"torch"`` or ``"triton"``): ``factory(layout, pool_units, slots, pool)``
    builds a :class:`TensorReplayExecutor`.

    Everything that can be checked before a replay is checked here: the kind, torch and
    ``pagedstate.gpu`` importable, the device, and for ``"triton"`` Triton importable and a
    CUDA device (or ``TRITON_INTERPRET=1``, which runs the kernel on the CPU, slowly).

    Args:
        kind: ``"torch"`` or ``"triton"``.
        device: a torch device; None picks ``"cpu"`` for torch, and for Triton ``"cuda"``
            when CUDA is available, else ``"cpu"`` under ``TRITON_INTERPRET=1``.
        max_bytes: the most bytes of slot and KV tensors (:func:`choose_slice`); None:
            :data:`CPU_MAX_BYTES` on a CPU, :data:`CUDA_FREE_SHARE` of the device's free
            memory (when the executor is built) on CUDA.

    Raises:
        ReplayError: an unknown kind, a bad device or ``max_bytes``, torch or Triton
            missing, or Triton without a GPU (and without ``TRITON_INTERPRET=1``).
    """
    if kind not in EXECUTOR_KINDS:
        raise ReplayError(f"executor must be one of {', '.join(EXECUTOR_KINDS)}, got {kind!r}")
    if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 1):
        raise ReplayError(f"max_bytes must be None or an int >= 1, got {max_bytes!r}")
    if device is not None and not isinstance(device, str):
        raise ReplayError(f"device must be None or a str, got {device!r}")
    torch = _module("torch", f"--executor {kind}")
    _module("pagedstate.gpu.executor", f"--executor {kind}")
    cuda = bool(torch.cuda.is_available())
    interpreting = False
    if kind == "triton":
        triton_mod = _module("pagedstate.gpu.triton_copy", "--executor triton")
        if not triton_mod.triton_available():
            raise ReplayError("--executor triton needs triton (a CUDA build of torch ships it)")
        interpreting = bool(triton_mod.interpreting())
    if device is None:
        device = "cuda" if kind == "triton" and cuda else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ReplayError(f"device {device!r} is not a torch device ({e})") from None
    if dev.type == "cuda" and not cuda:
        raise ReplayError(f"device {device!r}: CUDA is not available here")
    if kind == "triton" and dev.type != "cuda" and not interpreting:
        raise ReplayError(
            "--executor triton needs a GPU (a CUDA device): "
            + ("none is available here" if not cuda else f"device {device!r} is not one")
            + "; set TRITON_INTERPRET=1 to run its kernel on the CPU (slow), or use"
            " --executor torch"
        )
    kind_ = kind
    device_ = str(dev)

    def factory(layout: Any, pool_units: int, slots: int, pool: Any) -> TensorReplayExecutor:
        limit = max_bytes
        if limit is None:
            if dev.type == "cuda":
                limit = int(torch.cuda.mem_get_info(dev)[0] * CUDA_FREE_SHARE)
            else:
                limit = CPU_MAX_BYTES
        return TensorReplayExecutor(
            kind_, layout, pool_units, slots, pool, device=device_, max_bytes=limit
        )

    return factory
