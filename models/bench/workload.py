"""The store benchmark's workload: its options (:class:`BenchOptions`, :data:`QUICK`) and the
engine configuration of each run (the pool, the running requests, the decode rate)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pagedstate.models.replay.engine import DEFAULT_TRACE, EngineConfig


@dataclass(frozen=True)
class BenchOptions:
    """What one benchmark run does."""

    impl: str = "pagedstate.impl"
    ref: str = "pagedstate.models.reference"
    trace: Path = DEFAULT_TRACE
    requests: int = 3000
    concurrency: tuple[int, ...] = (64, 256, 1024)
    #: Pool units per slot of the highest concurrency level (the one-pool runs), and per slot
    #: of every level in the grown-pool runs.
    units_per_slot: int = 40
    #: Pool units of every concurrency run; 0: ``units_per_slot`` x the highest level.
    pool_units: int = 0
    chunk_blocks: int = 4
    units_per_checkpoint: int = 2
    records: tuple[int, ...] = (1000, 1_000_000)
    ref_records: tuple[int, ...] = (1000, 10_000)
    records_concurrency: int = 256
    #: Large enough that the replay at ``records_concurrency`` evicts nothing, so the runs
    #: with few and with many live records make exactly the same calls.
    records_units_per_slot: int = 56
    #: Replays per production measurement (figures: per call, the fastest replay).
    repeat: int = 3
    #: Replays per reference measurement (the reference is slow; one replay by default).
    ref_repeat: int = 1


QUICK = BenchOptions(
    requests=300,
    concurrency=(16, 64),
    records=(100, 2000),
    ref_records=(100, 1000),
    records_concurrency=16,
    records_units_per_slot=160,
    repeat=2,
)


def _one_pool(o: BenchOptions) -> int:
    """Units of the pool every concurrency level shares (``BenchOptions.pool_units``)."""
    return o.pool_units or max(o.concurrency) * o.units_per_slot


def _config(
    o: BenchOptions,
    concurrency: int,
    extra_units: int = 0,
    units_per_slot: int | None = None,
    *,
    pool_units: int | None = None,
) -> EngineConfig:
    """The engine configuration of one run: ``pool_units`` units, or else
    ``units_per_slot`` (default ``o.units_per_slot``) per slot, plus ``extra_units``."""
    per_slot = o.units_per_slot if units_per_slot is None else units_per_slot
    units = concurrency * per_slot if pool_units is None else pool_units
    return EngineConfig(
        max_running=concurrency,
        pool_units=units + extra_units,
        units_per_checkpoint=o.units_per_checkpoint,
        chunk_blocks=o.chunk_blocks,
        decode_tokens_per_pass=max(1, 1024 // concurrency),
        arrival_scale=0.0,
        stop_when_drained=True,
    )
