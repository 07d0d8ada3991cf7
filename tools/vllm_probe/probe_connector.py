"""Probe connector: records which hooks vLLM calls and what register_kv_caches hands over."""
import json, os
from typing import Any
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA)

LOG = os.environ.get("PROBE_LOG", "/tmp/vllm_probe_calls.jsonl")

def _log(**kw):
    with open(LOG, "a") as f:
        f.write(json.dumps(kw, default=str) + "\n")

class ProbeMeta(KVConnectorMetadata):
    pass

class ProbeConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        groups = []
        for g in kv_cache_config.kv_cache_groups:
            groups.append({"layers": g.layer_names, "spec": repr(g.kv_cache_spec)})
        _log(hook="init", role=str(role), groups=groups,
             tensors=[repr(t) for t in kv_cache_config.kv_cache_tensors],
             num_blocks=kv_cache_config.num_blocks)
    def register_kv_caches(self, kv_caches):
        out = {}
        for name, t in kv_caches.items():
            if isinstance(t, (list, tuple)):
                out[name] = [(str(x.dtype), list(x.shape), list(x.stride()), x.data_ptr()) for x in t]
            else:
                out[name] = (str(t.dtype), list(t.shape), list(t.stride()), t.data_ptr())
        _log(hook="register_kv_caches", caches=out)
    def start_load_kv(self, forward_context, **kw): _log(hook="start_load_kv")
    def wait_for_layer_load(self, layer_name): pass
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw): pass
    def wait_for_save(self): _log(hook="wait_for_save")
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        _log(hook="get_num_new_matched_tokens", req=request.request_id, computed=num_computed_tokens,
             n=request.num_tokens, hashes=len(request.block_hashes))
        return 0, False
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        _log(hook="update_state_after_alloc", req=request.request_id, ext=num_external_tokens,
             blocks=[list(b) for b in blocks.get_block_ids()])
    def build_connector_meta(self, so):
        _log(hook="build_connector_meta", new=[(r.req_id, r.num_computed_tokens, [list(b) for b in r.block_ids]) for r in so.scheduled_new_reqs],
             sched=dict(so.num_scheduled_tokens))
        return ProbeMeta()
    def update_connector_output(self, out): _log(hook="update_connector_output")
    def request_finished_all_groups(self, request, block_ids):
        _log(hook="request_finished_all_groups", req=request.request_id, blocks=[list(b) for b in block_ids])
        return False, None
