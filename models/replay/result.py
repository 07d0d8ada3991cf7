"""What a replay found (:class:`ReplayResult`: counters, fates, per-call timings, pool
occupancy; its summary and its ``--json`` document), and the percentiles of the timings."""

from __future__ import annotations

from array import array
from typing import Any

import attrs

__all__ = ["ReplayResult"]


@attrs.define
class ReplayResult:
    """What a replay found; :meth:`to_json` is the ``--json`` document.

    Attributes:
        config: the knobs; ``geometry``: unit and image bytes, units per image, pool units.
        counters: requests, hits, tokens, passes, aborts (see :meth:`summary`).
        fates: ``checkpoint_fates()`` of the production coordinator at the end.
        timings_us: per store method: calls, mean, p50 and p99 microseconds per call.
        occupancy: samples ``[t_s, kv_units, checkpoint_units, cached_kv_units, free_units]``.
        wall_s: wall time of the replay (set-up excluded); ``verified``: whether the
            reference ran in lockstep (and agreed, or the run would have raised).
        executor: the copy executor's statistics (``{}`` without one).
    """

    config: dict[str, Any]
    geometry: dict[str, Any]
    counters: dict[str, int]
    fates: dict[str, int]
    timings_us: dict[str, dict[str, float]]
    occupancy: list[list[float]]
    wall_s: float
    verified: bool
    executor: dict[str, Any]

    def summary(self) -> dict[str, float]:
        """Headline figures: hit rates (blocks and tokens), prefill tokens saved."""
        c = self.counters
        blocks = max(1, c["prompt_blocks"])
        tokens = max(1, c["prompt_tokens"])
        return {
            "requests": c["requests"],
            "completed": c["completed"],
            "aborted": c["aborted"],
            "hit_rate_blocks": (c["hit_blocks"] + c["cpu_hit_blocks"]) / blocks,
            "hbm_hit_rate_blocks": c["hit_blocks"] / blocks,
            "cpu_hit_rate_blocks": c["cpu_hit_blocks"] / blocks,
            "kv_hit_rate_blocks": c["kv_hit_blocks"] / blocks,
            "hit_rate_tokens": c["saved_tokens"] / tokens,
            "prefill_tokens_saved": c["saved_tokens"],
            "prompt_tokens": c["prompt_tokens"],
        }

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document of one run: ``config``, ``geometry`` (bytes, units),
        ``summary`` (rates as fractions, tokens), ``counters``, ``fates``, ``timings_us``
        (microseconds per call), ``occupancy`` (``t_s`` in seconds, the rest in units),
        ``wall_s`` (seconds), ``verified``, ``executor``. JSON-serialisable."""
        return {
            "config": self.config,
            "geometry": self.geometry,
            "summary": self.summary(),
            "counters": self.counters,
            "fates": self.fates,
            "timings_us": self.timings_us,
            "occupancy": {
                "columns": ["t_s", "kv_units", "checkpoint_units", "cached_kv_units", "free_units"],
                "samples": self.occupancy,
            },
            "wall_s": self.wall_s,
            "verified": self.verified,
            "executor": self.executor,
        }


def _percentiles(samples: array[int]) -> tuple[float, float]:
    if not samples:
        return 0.0, 0.0
    s = sorted(samples)
    n = len(s)
    return s[min(n - 1, n // 2)] / 1000.0, s[min(n - 1, (n * 99) // 100)] / 1000.0
