"""Model geometries and the checkpoint layout derived from them (SPEC E.1-E.3).

The package ships ``data/model_geometries.json``: the recurrent-state shapes and dtypes and
the attention KV bytes per token of 17 public hybrid models (TP=1, vLLM's default dtypes;
the file's ``source`` field names each model's config and the vLLM code it was read from,
and ``docs/`` of the data set derives every number). :func:`load_geometry` returns one of
them by model id; :func:`geometry_ids` lists the ids.

A :class:`CheckpointLayout` turns a geometry, a KV block size ``B`` (tokens per page) and a
number of speculative tokens into the byte layout the copy engine executes:

* **Slot** (one request's live recurrent state). Per recurrent layer ``i``, in layer order,
  a conv-state tensor ``[num_slots, kernel-1+spec, conv_dim]`` (vLLM's "SD" storage order:
  the rows are time steps; ``kernel-1`` rows for a model whose conv state has no
  speculative rows, Mamba1's ``conv_grows_with_spec: false``) and an SSM/recurrent-state
  tensor ``[num_slots, *ssm_shape]``.
  A model without a conv state (MiniMax's lightning attention) has the SSM tensor only.
* **Image** (what a checkpoint carries): per layer, the first ``kernel-1`` conv rows (the
  convolution's history) and the whole SSM state, as one byte range each. The
  ``spec`` speculative-token rows at the end of a conv state are not carried: they hold
  draft-token columns that the verify step writes before it reads them, the same reason
  ATOM leaves fields out of its image (SPEC E.2 "excluded bytes"). With ``spec == 0`` the
  image is the whole slot.
* **Unit** (one KV block id). Per attention layer ``l``, a KV tensor
  ``[num_blocks, B * kv_bytes_per_token_per_layer / 2]`` (bf16, one page per block); unit
  ``b`` owns region ``l`` = row ``b`` of tensor ``l``. ``page_unit_bytes`` is the sum over
  attention layers, ``units_per_checkpoint = ceil(image_bytes / page_unit_bytes)``.
* **Streams** (SPEC E.3): the source stream is the slot's carried ranges in layer order;
  the destination stream is unit 0's regions 0..R-1, then unit 1's, ...; byte ``k`` of one
  is byte ``k`` of the other for ``k < image_bytes``, and the last unit's tail is never
  written.

``layout_id`` encodes every number above, so an image is only read by a worker with the
same layout (SPEC A.1, F61).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import attrs

from pagedstate.spec.errors import (
    InvalidArgumentError,
    UnknownGeometryError,
    UnsupportedGeometryError,
)
from pagedstate.spec.types import PagedStateCheckpointSpec

__all__ = [
    "DTYPE_BYTES",
    "AmbiguousGeometryError",
    "CheckpointLayout",
    "ModelGeometry",
    "geometry_ids",
    "load_geometry",
]

#: Bytes per element of the dtypes the geometries use.
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}

_LAYOUT_VERSION = "pagedstate-slot-v1"


class AmbiguousGeometryError(UnknownGeometryError):
    """A part of a model id that several shipped ids contain: :func:`load_geometry` takes a
    part of an id only when it names one model. An :class:`UnknownGeometryError` (a
    ``LookupError``), so callers that catch that catch this too.

    Attributes:
        model_id: the name asked for.
        matches: the shipped ids that contain it, in the file's order.
    """

    def __init__(self, model_id: str, matches: Sequence[str]) -> None:
        self.model_id = model_id
        self.matches = tuple(matches)
        super().__init__(
            f"{model_id!r} is ambiguous: it matches {len(self.matches)} shipped geometries"
            f" ({', '.join(self.matches)}); give the exact id or a part of only one"
        )


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(d) is int and d > 0 for d in value):
        raise UnsupportedGeometryError(f"{what} must be a list of positive ints, got {value!r}")
    return tuple(value)


@attrs.frozen
class ModelGeometry:
    """One model's recurrent state and KV geometry (one entry of the shipped JSON).

    Attributes:
        model_id: the Hugging Face id, e.g. ``"Qwen/Qwen3-Next-80B-A3B-Instruct"``.
        recurrent_kind: ``"gated_deltanet"``, ``"mamba2"``, ``"kda ..."``, ...
        num_recurrent_layers: layers that keep a recurrent state (each has one slot entry).
        num_attention_layers: layers with a KV cache (each gives a unit one region).
        conv_shape: ``[conv_dim, kernel-1]`` (empty: no conv state).
        conv_dtype: dtype name of the conv state (``DTYPE_BYTES`` key).
        ssm_shape: the SSM / recurrent state's shape, e.g. ``[num_v_heads, head_v_dim,
            head_k_dim]``.
        ssm_dtype: dtype name of the SSM state.
        kv_bytes_per_token: attention KV bytes per token per attention layer (bf16).
        source: where the numbers come from (configs and vLLM code, from the JSON).
        conv_grows_with_spec: whether the conv state has a row per speculative token
            (the JSON's ``conv_grows_with_spec``, default True; False for Mamba1, whose
            vLLM conv state has no speculative rows).
    """

    model_id: str
    recurrent_kind: str
    num_recurrent_layers: int
    num_attention_layers: int
    conv_shape: tuple[int, ...]
    conv_dtype: str
    ssm_shape: tuple[int, ...]
    ssm_dtype: str
    kv_bytes_per_token: int
    source: str = ""
    conv_grows_with_spec: bool = True

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> ModelGeometry:
        """Build from one entry of ``model_geometries.json`` and check it against the
        entry's own byte totals.

        Raises:
            UnsupportedGeometryError: a field is missing or malformed, or the shapes do not
                give the entry's ``state_bytes_per_layer``.
        """
        try:
            conv = entry["conv_state_shape"]
            g = cls(
                model_id=str(entry["model_id"]),
                recurrent_kind=str(entry["recurrent_kind"]),
                num_recurrent_layers=int(entry["num_recurrent_layers"]),
                num_attention_layers=int(entry["num_attention_layers"]),
                conv_shape=_shape(conv, "conv_state_shape") if conv else (),
                conv_dtype=str(entry["conv_state_dtype"]),
                ssm_shape=_shape(entry["ssm_state_shape"], "ssm_state_shape"),
                ssm_dtype=str(entry["ssm_state_dtype"]),
                kv_bytes_per_token=int(entry["kv_bytes_per_token_per_attn_layer_bf16"]),
                source=str(entry.get("source", "")),
                conv_grows_with_spec=bool(entry.get("conv_grows_with_spec", True)),
            )
        except KeyError as exc:
            raise UnsupportedGeometryError(f"geometry entry lacks {exc}") from None
        for dtype in (g.conv_dtype, g.ssm_dtype):
            if dtype not in DTYPE_BYTES:
                raise UnsupportedGeometryError(f"{g.model_id}: unknown dtype {dtype!r}")
        want = int(entry["state_bytes_per_layer"])
        if g.state_bytes_per_layer() != want:
            raise UnsupportedGeometryError(
                f"{g.model_id}: shapes give {g.state_bytes_per_layer()} B per layer, the"
                f" entry says {want}"
            )
        return g

    def conv_bytes_per_row(self) -> int:
        """Bytes of one conv time step (one row of the "SD" storage): ``conv_dim * dtype``."""
        return self.conv_shape[0] * DTYPE_BYTES[self.conv_dtype] if self.conv_shape else 0

    def conv_rows(self, spec_tokens: int = 0) -> int:
        """Rows of one layer's conv state: ``kernel-1``, plus ``spec_tokens`` when the conv
        state grows with speculative tokens; 0 without a conv state."""
        if not self.conv_shape:
            return 0
        return self.conv_shape[1] + (spec_tokens if self.conv_grows_with_spec else 0)

    def ssm_bytes(self) -> int:
        """Bytes of one layer's SSM state."""
        return math.prod(self.ssm_shape) * DTYPE_BYTES[self.ssm_dtype]

    def state_bytes_per_layer(self, spec_tokens: int = 0) -> int:
        """Bytes of one layer's slot entry: conv rows ``kernel-1+spec_tokens`` (``kernel-1``
        when the conv state does not grow with speculative tokens) plus SSM."""
        rows = self.conv_rows(spec_tokens)
        return rows * self.conv_bytes_per_row() + self.ssm_bytes()

    def sliced(
        self, recurrent_layers: int, attention_layers: int, divide: int = 1
    ) -> ModelGeometry:
        """A smaller geometry of the same kind for tests on a CPU: the first
        ``recurrent_layers`` and ``attention_layers`` layers, with the leading dimension of
        the conv state (``conv_dim``), of the SSM state (heads) and the KV bytes per token
        divided by ``divide``. The model id records the slice, so ``layout_id`` differs.

        Raises:
            UnsupportedGeometryError: a count is out of range, or ``divide`` does not divide
                those dimensions exactly.
        """
        for name, v, top in (
            ("recurrent_layers", recurrent_layers, self.num_recurrent_layers),
            ("attention_layers", attention_layers, self.num_attention_layers),
        ):
            if type(v) is not int or not 1 <= v <= top:
                raise UnsupportedGeometryError(f"{name} must be an int in [1, {top}], got {v!r}")
        if type(divide) is not int or divide < 1:
            raise UnsupportedGeometryError(f"divide must be an int >= 1, got {divide!r}")
        dims = [self.ssm_shape[0], self.kv_bytes_per_token]
        if self.conv_shape:
            dims.append(self.conv_shape[0])
        if any(d % divide for d in dims) or self.kv_bytes_per_token // divide % 2:
            raise UnsupportedGeometryError(
                f"{self.model_id}: divide={divide} does not divide {dims} into whole bf16 rows"
            )
        conv = (self.conv_shape[0] // divide, *self.conv_shape[1:]) if self.conv_shape else ()
        return attrs.evolve(
            self,
            model_id=f"{self.model_id}[rec={recurrent_layers},attn={attention_layers},/{divide}]",
            num_recurrent_layers=recurrent_layers,
            num_attention_layers=attention_layers,
            conv_shape=conv,
            ssm_shape=(self.ssm_shape[0] // divide, *self.ssm_shape[1:]),
            kv_bytes_per_token=self.kv_bytes_per_token // divide,
        )

    def layout(self, block_tokens: int = 16, spec_tokens: int = 0) -> CheckpointLayout:
        """The checkpoint layout with KV pages of ``block_tokens`` tokens (see module doc).

        Raises:
            UnsupportedGeometryError: the model has no attention layer (no KV pages to hold
                images), or the arguments are not positive ints.
        """
        return CheckpointLayout.build(self, block_tokens, spec_tokens)


@cache
def _entries() -> dict[str, dict[str, Any]]:
    text = (
        resources.files("pagedstate.gpu")
        .joinpath("data/model_geometries.json")
        .read_text(encoding="utf-8")
    )
    return {str(e["model_id"]): e for e in json.loads(text)}


def geometry_ids() -> list[str]:
    """The ids of the shipped geometries, in the file's order (17 models)."""
    return list(_entries())


def load_geometry(model_id: str) -> ModelGeometry:
    """The shipped geometry of ``model_id`` (exact id, or a unique case-insensitive
    substring such as ``"Qwen3-Next"``).

    Raises:
        InvalidArgumentError: ``model_id`` is not a non-empty str.
        AmbiguousGeometryError: the substring is a part of several shipped ids (an
            ``UnknownGeometryError``, naming them).
        UnknownGeometryError: no shipped model matches (the message lists the known ids).
        UnsupportedGeometryError: the entry is malformed (a packaging error).
    """
    if not isinstance(model_id, str) or not model_id:
        raise InvalidArgumentError(f"model_id must be a non-empty str, got {model_id!r}")
    entries = _entries()
    if model_id in entries:
        return ModelGeometry.from_json(entries[model_id])
    hits = [k for k in entries if model_id.lower() in k.lower()]
    if len(hits) > 1:
        raise AmbiguousGeometryError(model_id, hits)
    if not hits:
        raise UnknownGeometryError(
            f"{model_id!r} matches 0 shipped geometries; known: {', '.join(entries)}"
        )
    return ModelGeometry.from_json(entries[hits[0]])


@attrs.frozen
class SlotTensorInfo:
    """One per-layer slot tensor: ``[num_slots, *shape]`` of ``dtype``; the image carries
    the first ``carried_bytes`` of each slot's row."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    row_bytes: int
    carried_bytes: int


@attrs.frozen
class CheckpointLayout:
    """The byte layout of slots, units and images for one geometry (see module doc).

    Attributes:
        geometry: the model geometry.
        block_tokens: tokens per KV page (B).
        spec_tokens: speculative tokens the conv state has room for (not carried).
        slot_tensors: the per-layer slot tensors, in source-stream order.
        region_bytes: bytes of each region of a unit (one KV page per attention layer).
        kv_elements_per_page: bf16 elements of one page (``region_bytes // 2``).
    """

    geometry: ModelGeometry
    block_tokens: int
    spec_tokens: int
    slot_tensors: tuple[SlotTensorInfo, ...]
    region_bytes: tuple[int, ...]

    @classmethod
    def build(cls, g: ModelGeometry, block_tokens: int, spec_tokens: int) -> CheckpointLayout:
        """See :meth:`ModelGeometry.layout`."""
        if type(block_tokens) is not int or block_tokens < 1:
            raise UnsupportedGeometryError(
                f"block_tokens must be an int >= 1, got {block_tokens!r}"
            )
        if type(spec_tokens) is not int or spec_tokens < 0:
            raise UnsupportedGeometryError(f"spec_tokens must be an int >= 0, got {spec_tokens!r}")
        if g.num_attention_layers < 1 or g.kv_bytes_per_token < 1:
            raise UnsupportedGeometryError(
                f"{g.model_id} has no attention layer: there is no KV block pool to keep"
                " checkpoint images in"
            )
        tensors: list[SlotTensorInfo] = []
        for i in range(g.num_recurrent_layers):
            if g.conv_shape:
                rows = g.conv_rows(spec_tokens)
                row = g.conv_bytes_per_row()
                tensors.append(
                    SlotTensorInfo(
                        f"layer{i}.conv",
                        (rows, g.conv_shape[0]),
                        g.conv_dtype,
                        rows * row,
                        g.conv_shape[1] * row,
                    )
                )
            tensors.append(
                SlotTensorInfo(
                    f"layer{i}.ssm", g.ssm_shape, g.ssm_dtype, g.ssm_bytes(), g.ssm_bytes()
                )
            )
        page = block_tokens * g.kv_bytes_per_token
        return cls(g, block_tokens, spec_tokens, tuple(tensors), (page,) * g.num_attention_layers)

    @property
    def src_sizes(self) -> tuple[int, ...]:
        """Segment sizes of the source stream: each slot tensor's carried bytes, in order."""
        return tuple(t.carried_bytes for t in self.slot_tensors)

    @property
    def image_bytes(self) -> int:
        """Bytes one checkpoint carries."""
        return sum(self.src_sizes)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one whole slot (carried or not)."""
        return sum(t.row_bytes for t in self.slot_tensors)

    @property
    def page_unit_bytes(self) -> int:
        """Bytes one unit owns: one page per attention layer."""
        return sum(self.region_bytes)

    @property
    def units_per_checkpoint(self) -> int:
        """``ceil(image_bytes / page_unit_bytes)``."""
        return -(-self.image_bytes // self.page_unit_bytes)

    def dst_sizes(self, units: int | None = None) -> tuple[int, ...]:
        """Segment sizes of the destination stream over ``units`` units (default: one
        image's): the regions tiled unit-major, region-minor (SPEC E.3)."""
        n = self.units_per_checkpoint if units is None else units
        return self.region_bytes * n

    @property
    def layout_id(self) -> str:
        """A string naming every number of the layout (SPEC A.1: images are only read by
        workers with the same ``layout_id``)."""
        g = self.geometry
        conv = "x".join(map(str, g.conv_shape)) + f":{g.conv_dtype}" if g.conv_shape else "none"
        ssm = "x".join(map(str, g.ssm_shape)) + f":{g.ssm_dtype}"
        return (
            f"{_LAYOUT_VERSION}:model={g.model_id}:rec={g.num_recurrent_layers}"
            f":conv={conv}:ssm={ssm}:spec={self.spec_tokens}:attn={g.num_attention_layers}"
            f":kv={g.kv_bytes_per_token}:block={self.block_tokens}"
        )

    def spec(self) -> PagedStateCheckpointSpec:
        """The store's :class:`~pagedstate.spec.types.PagedStateCheckpointSpec` for this
        layout."""
        return PagedStateCheckpointSpec(
            page_unit_bytes=self.page_unit_bytes,
            slot_bytes=self.slot_bytes,
            layout_id=self.layout_id,
            image_bytes=self.image_bytes,
        )

    def describe(self) -> dict[str, int | str]:
        """The derived numbers, for reports."""
        return {
            "model_id": self.geometry.model_id,
            "block_tokens": self.block_tokens,
            "spec_tokens": self.spec_tokens,
            "slot_tensors": len(self.slot_tensors),
            "attention_layers": len(self.region_bytes),
            "image_bytes": self.image_bytes,
            "slot_bytes": self.slot_bytes,
            "page_unit_bytes": self.page_unit_bytes,
            "units_per_checkpoint": self.units_per_checkpoint,
            "layout_id": self.layout_id,
        }
