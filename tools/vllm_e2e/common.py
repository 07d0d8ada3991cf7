"""Shared by the engine tests (tests/engine/) and `make bench-engine`: the tiny random-weight
Qwen3-Next, the prompts, the trace slice and the LLM construction, so the reference run
(prefix caching off) and the runs with the pagedstate tier see the same model and requests.

Run with vLLM's CPU build (`make engine-setup`), in process (VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "conversation_trace.jsonl"
#: Trace lines (0-based) of the slice: four conversations' earlier turns and later turns
#: that share at least three 512-token blocks with them (Mooncake's hash ids), all <= 3,600
#: tokens so they fit the tiny model's context.
TRACE_LINES = (40, 65, 66, 100, 133, 261, 280, 298, 311)
TRACE_BLOCK = 512  # tokens per Mooncake hash id
VOCAB = 1000  # token ids drawn from [1, VOCAB)
MAX_MODEL_LEN = 4096
MAX_BATCHED = 1024  # chunked prefill: long prompts take several steps (aborts mid-prefill)


def make_model(path: str | os.PathLike[str]) -> str:
    """Save the tiny Qwen3-Next (Gated DeltaNet + attention, random weights, seed 0) at
    ``path`` unless it is there; returns the path. ~3 MB, no download."""
    path = str(path)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        full_attention_interval=4,
        max_position_embeddings=MAX_MODEL_LEN,
        initializer_range=0.2,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    Qwen3NextForCausalLM(cfg).save_pretrained(path)
    return path


def tokens(seed: int, n: int) -> list[int]:
    """``n`` token ids from a generator seeded with ``seed``."""
    rng = random.Random(seed)
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def shared_prefix_prompts() -> list[list[int]]:
    """Eight prompts: two system prompts (1,400 and 2,000 tokens) each with four user
    suffixes of 40-180 tokens."""
    out = []
    for s, (plen, seed) in enumerate(((1400, 1), (2000, 2))):
        prefix = tokens(seed, plen)
        out += [prefix + tokens(100 * (s + 1) + i, 40 + 47 * i) for i in range(4)]
    return out


def trace_prompts() -> list[list[int]]:
    """The trace slice: each request's hash ids mapped to 512 tokens apiece (a generator
    seeded with the hash id), cut to its input length."""
    lines = TRACE.read_text().splitlines()
    out = []
    for i in TRACE_LINES:
        r = json.loads(lines[i])
        toks: list[int] = []
        for h in r["hash_ids"]:
            toks += tokens(10_000 + h, TRACE_BLOCK)
        out.append(toks[: r["input_length"]])
    return out


def llm(path: str, *, caching: bool, tier: dict[str, Any] | None = None, **kw: Any) -> Any:
    """The engine: bf16 (CPU GDN needs it), greedy-friendly, chunked prefill of
    :data:`MAX_BATCHED` tokens, async scheduling on; ``tier`` is the connector's extra config
    (None: no connector)."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    if tier is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="PagedStateConnector",
            kv_connector_module_path="pagedstate.engines.vllm.connector",
            kv_role="kv_both",
            kv_connector_extra_config=tier,
        )
    kw.setdefault("async_scheduling", True)
    return LLM(
        model=path,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enable_prefix_caching=caching,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=MAX_BATCHED,
        seed=0,
        enforce_eager=True,
        **kw,
    )


def params(max_tokens: int = 6) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=1, ignore_eos=True)


def result(o: Any) -> dict[str, Any]:
    """One request's output: tokens, logprobs of the chosen tokens, vLLM's cached count."""
    c = o.outputs[0]
    return {
        "tokens": list(c.token_ids),
        "logprobs": [d[t].logprob for d, t in zip(c.logprobs, c.token_ids, strict=True)],
        "cached": o.num_cached_tokens,
    }


def one_by_one(engine: Any, prompts: list[list[int]], max_tokens: int = 6) -> list[dict[str, Any]]:
    """Each prompt generated alone, in order."""
    sp = params(max_tokens)
    return [
        result(engine.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]) for p in prompts
    ]


def scenario_prompts() -> dict[str, tuple[list[int], int]]:
    """The prompts of the scenario tests beyond :func:`shared_prefix_prompts` and
    :func:`trace_prompts`, each with its ``max_tokens``: a long prompt aborted mid-prefill
    (then run whole), a prompt that finishes with its prefill (``max_tokens=1``: it leaves
    while its last store is in flight) and a longer one sharing it, a long prompt preempted
    mid-run, and prompts run while the tier's pool is full."""
    long = tokens(7, 3300)
    # 2,560 tokens: a multiple of every block size vLLM picks here (256 with chunks of
    # 1,024, 640 without), so its last chunk ends on a boundary and stores its image
    short = tokens(8, 2560)
    return {
        "abort": (long, 6),
        "abort-follower": (long[:2600] + tokens(71, 90), 6),
        "inflight": (short, 1),
        "inflight-follower": (short + tokens(81, 200), 6),
        "preempt": (tokens(9, 3000), 12),
        "full-1": (tokens(10, 1500), 6),
        "full-2": (tokens(10, 1500)[:1300] + tokens(11, 300), 6),
    }


def all_prompts() -> dict[str, tuple[list[int], int]]:
    """Every prompt a test compares, by name, with its ``max_tokens``."""
    out = {f"shared-{i}": (p, 6) for i, p in enumerate(shared_prefix_prompts())}
    out.update({f"trace-{i}": (p, 6) for i, p in enumerate(trace_prompts())})
    out.update(scenario_prompts())
    return out


def reference(path: str, out: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Run every prompt alone with prefix caching off (no connector); write and return
    ``{name: result}``."""
    engine = llm(path, caching=False)
    res = {
        name: result(engine.generate([{"prompt_token_ids": p}], params(n), use_tqdm=False)[0])
        for name, (p, n) in all_prompts().items()
    }
    Path(out).write_text(json.dumps(res))
    return res


if __name__ == "__main__":  # python tools/vllm_e2e/common.py MODEL_DIR OUT.json
    import sys

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    reference(make_model(sys.argv[1]), sys.argv[2])
