"""The byte layout of a vLLM hybrid model's KV cache, as pagedstate sees it.

vLLM (0.32, hybrid allocator) hands a connector one :class:`KVCacheConfig`: KV cache groups,
each a spec (``MambaSpec`` for a recurrent group, ``FullAttentionSpec`` for attention) and
its layer names, all groups paged with the same block size. On the CPU build every layer's
cache is a view over one buffer, one page of ``page_size_padded`` bytes per block id
(docs/vllm.md). This module turns that config into

- a :class:`~pagedstate.gpu.geometry.CheckpointLayout` whose *unit* is one vLLM block of
  every attention layer (so a cached prefix block's KV page is exactly one unit) and whose
  *slot* is a request's recurrent state: conv then SSM of every recurrent layer, in group
  order (SPEC E.3's source stream);
- :class:`TierLayout`: that layout plus which group each recurrent layer belongs to (its
  block table is the one that names the layer's state block) and the byte offsets of the
  conv and SSM states inside a state block.

It reads the config by attribute (duck-typed): it does not import vLLM, so it can be tested
without the engine installed. Raises :class:`UnsupportedKVLayoutError` for what the tier
cannot hold (no attention group, more than one, groups of different block sizes, a
recurrent state of other than two tensors).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from pagedstate.gpu.geometry import DTYPE_BYTES, CheckpointLayout, ModelGeometry
from pagedstate.spec.errors import InvalidArgumentError

__all__ = ["RecurrentLayer", "TierLayout", "UnsupportedKVLayoutError", "tier_layout"]


class UnsupportedKVLayoutError(InvalidArgumentError):
    """vLLM's KV cache config has a shape the prefix tier cannot hold (see the module doc)."""


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise UnsupportedKVLayoutError(f"unsupported state dtype {dtype!r}")
    return name


@attrs.frozen
class RecurrentLayer:
    """One recurrent layer's state inside a vLLM state block.

    Attributes:
        name: vLLM's layer name (the key of ``register_kv_caches``).
        group: the KV cache group index whose block table names this layer's state block.
        conv_offset, conv_bytes: the conv state's byte range inside the block.
        ssm_offset, ssm_bytes: the SSM (recurrent) state's byte range inside the block.
    """

    name: str
    group: int
    conv_offset: int
    conv_bytes: int
    ssm_offset: int
    ssm_bytes: int


@attrs.frozen
class TierLayout:
    """The prefix tier's view of a vLLM KV cache config (see the module doc).

    Attributes:
        layout: pagedstate's checkpoint layout (units = one block of every attention layer,
            ``block_tokens`` = vLLM's block size in tokens).
        block_tokens: tokens per vLLM block (every group's).
        recurrent: the recurrent layers in source-stream order (slot tensors ``2 i`` and
            ``2 i + 1`` of :attr:`layout` are layer ``i``'s conv and SSM states).
        recurrent_groups: the recurrent groups' indexes, in order.
        attention_group: the one attention group's index.
        attention_layers: its layer names, in order (unit region ``r`` is layer ``r``'s
            page).
        page_bytes: bytes of one attention layer's block (one unit region).
    """

    layout: CheckpointLayout
    block_tokens: int
    recurrent: tuple[RecurrentLayer, ...]
    recurrent_groups: tuple[int, ...]
    attention_group: int
    attention_layers: tuple[str, ...]
    page_bytes: int

    @property
    def units_per_checkpoint(self) -> int:
        """Units one recurrent-state image spans."""
        return self.layout.units_per_checkpoint


def _is_mamba(spec: Any) -> bool:
    return type(spec).__name__ == "MambaSpec" or hasattr(spec, "mamba_cache_mode")


def tier_layout(kv_cache_config: Any, model_id: str = "vllm") -> TierLayout:
    """The :class:`TierLayout` of vLLM's ``KVCacheConfig`` (read by attribute: groups with
    ``kv_cache_spec`` and ``layer_names``; a Mamba spec's ``shapes``, ``dtypes`` and
    ``block_size``; an attention spec's ``block_size`` and ``page_size_bytes``).

    Raises:
        UnsupportedKVLayoutError: no recurrent or no attention group, more than one
            attention group, block sizes that differ between groups, or a recurrent state
            that is not (conv, SSM).
    """
    groups: Sequence[Any] = list(getattr(kv_cache_config, "kv_cache_groups", ()) or ())
    rec_groups: list[int] = []
    attn_groups: list[int] = []
    sizes: set[int] = set()
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        sizes.add(int(spec.block_size))
        (rec_groups if _is_mamba(spec) else attn_groups).append(i)
    if not rec_groups or len(attn_groups) != 1:
        raise UnsupportedKVLayoutError(
            f"the prefix tier needs recurrent groups and exactly one attention group; got"
            f" {len(rec_groups)} recurrent and {len(attn_groups)} attention groups"
        )
    if len(sizes) != 1:
        raise UnsupportedKVLayoutError(
            f"every KV cache group must page with one block size, got {sorted(sizes)}"
        )
    block = sizes.pop()
    first = groups[rec_groups[0]].kv_cache_spec
    shapes = [tuple(int(d) for d in s) for s in first.shapes]
    dtypes = [_dtype_name(d) for d in first.dtypes]
    if len(shapes) != 2:
        raise UnsupportedKVLayoutError(
            f"a recurrent state of (conv, SSM) is expected, got {len(shapes)} tensors"
        )
    conv_bytes = math.prod(shapes[0]) * DTYPE_BYTES[dtypes[0]]
    ssm_bytes = math.prod(shapes[1]) * DTYPE_BYTES[dtypes[1]]
    recurrent: list[RecurrentLayer] = []
    for gi in rec_groups:
        spec = groups[gi].kv_cache_spec
        if [tuple(int(d) for d in s) for s in spec.shapes] != shapes:
            raise UnsupportedKVLayoutError("recurrent groups with different state shapes")
        for name in groups[gi].layer_names:
            recurrent.append(RecurrentLayer(name, gi, 0, conv_bytes, conv_bytes, ssm_bytes))
    attn = groups[attn_groups[0]]
    page = int(attn.kv_cache_spec.page_size_bytes)
    layers = tuple(attn.layer_names)
    if page % block or page // block % 2:
        raise UnsupportedKVLayoutError(f"an attention page of {page} B is not whole bf16 rows")
    # vLLM's conv state is (kernel-1, conv_dim) ("SD") or (conv_dim, kernel-1) ("DS"); the
    # image carries every byte of it either way, so the order only names the shape.
    conv_rows, conv_dim = shapes[0]
    geometry = ModelGeometry(
        model_id=model_id,
        recurrent_kind="vllm-mamba-spec",
        num_recurrent_layers=len(recurrent),
        num_attention_layers=len(layers),
        conv_shape=(conv_dim, conv_rows),
        conv_dtype=dtypes[0],
        ssm_shape=shapes[1],
        ssm_dtype=dtypes[1],
        kv_bytes_per_token=page // block,
        source="vLLM KVCacheConfig",
    )
    return TierLayout(
        layout=geometry.layout(block_tokens=block),
        block_tokens=block,
        recurrent=tuple(recurrent),
        recurrent_groups=tuple(rec_groups),
        attention_group=attn_groups[0],
        attention_layers=layers,
        page_bytes=page,
    )
