"""What an engine integration uses beside the store: the conformance kit
(:mod:`pagedstate.engines.conformance`) and adapters for real engines.

This subpackage may import every other part of pagedstate (and, in an adapter, the engine
itself); nothing else of ours imports it.
"""
