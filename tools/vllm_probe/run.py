import os, sys, time, json
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
def make_model(path):
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_value_heads=2,
        linear_num_key_heads=1, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        full_attention_interval=4, max_position_embeddings=4096, initializer_range=0.2, torch_dtype="float32")
    torch.manual_seed(0)
    m = Qwen3NextForCausalLM(cfg)
    m.save_pretrained(path)
if __name__ == "__main__":
    path = os.environ.get("PROBE_MODEL", "/tmp/vllm_probe_model")
    if not os.path.exists(path + "/config.json"):
        make_model(path)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    kt = KVTransferConfig(kv_connector="ProbeConnector", kv_connector_module_path="probe_connector", kv_role="kv_both")
    t = time.time()
    llm = LLM(model=path, skip_tokenizer_init=True, dtype="bfloat16", enable_prefix_caching=True,
              kv_transfer_config=kt, max_model_len=4096, seed=0)
    print("start", time.time() - t)
    import random
    random.seed(0)
    prefix = [random.randrange(1, 1000) for _ in range(1400)]
    prompts = [{"prompt_token_ids": prefix + [random.randrange(1, 1000) for _ in range(50)]} for _ in range(2)]
    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=1)
    for p in prompts:
        o = llm.generate([p], sp)[0]
        print("cached", o.num_cached_tokens, o.outputs[0].token_ids)
