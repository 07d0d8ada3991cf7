"""The benchmarks: each measures in one run and writes its own section of a Markdown file.

- ``python -m pagedstate.models.bench`` (``make bench``): microseconds per store call on a
  replayed trace, production against reference (:mod:`.store`; its parts :mod:`.workload`,
  :mod:`.measure`, :mod:`.report`, :mod:`.targets`);
- ``python -m pagedstate.models.bench.explore`` (``make bench-explore``): explorer
  throughput;
- ``python -m pagedstate.models.bench.replay`` (``make bench-replay``): wall time of
  ``pagedstate replay`` on the full shared traces;
- ``python -m pagedstate.models.bench.transfer``: the prefill/decode transfer against a
  plain send/recv of the same bytes;
- ``python -m pagedstate.models.bench.units``: the store's host cost against the number of
  units per image (2 to 390) on a fresh and a fragmented pool, in an engine-like loop
  (:mod:`.units`).

This package re-exports the store benchmark's names (it was the module
``pagedstate.models.bench``). A global the code reads lives in its own module: patch
``bench.targets.TARGET_CONCURRENCY_LEVELS`` or ``bench.measure.Engine``, not the package.
"""

from __future__ import annotations

from .measure import _locality_control as _locality_control
from .measure import _replay as _replay
from .measure import _us as _us
from .report import _locality_verdict as _locality_verdict
from .store import main, run
from .workload import QUICK as QUICK
from .workload import BenchOptions

__all__ = ["BenchOptions", "main", "run"]
