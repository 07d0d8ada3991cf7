"""pagedstate inside vLLM: a KV connector that keeps a prefix tier (attention KV pages and
recurrent-state images over units of one pool, one store) and serves vLLM's misses from it.

- :mod:`.connector`: :class:`~.connector.PagedStateConnector`, loaded by vLLM by name
  (imports vLLM; ``pip install 'pagedstate[vllm]'``);
- :mod:`.tier`: the scheduler side (:class:`~.tier.PrefixTier`), vLLM-free;
- :mod:`.worker`: the worker side (the pool's memory, pagedstate's executor over vLLM's
  tensors);
- :mod:`.layout`, :mod:`.plan`: the byte layout read from vLLM's KV cache config, and the
  per-step plan the two sides exchange.

docs/vllm.md shows it in use and lists what vLLM's connector API cannot express.
"""
