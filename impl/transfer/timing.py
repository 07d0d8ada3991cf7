"""What the rank loops time: host seconds per phase (:class:`_Phases`) and the plain
send/recv of the protocol's tensor sizes the protocol is measured against."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from .side import _Side
from .wire import Link


class _Phases:
    """Host seconds per phase of the timed loop (``phases_s`` in a rank's result): where a
    round's time goes. On CUDA a phase that synchronizes is charged the device work it
    waits for."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.s[name] = self.s.get(name, 0.0) + time.perf_counter() - t


def _plain_rounds(side: _Side, rounds: list[list[tuple[int, int]]]) -> list[list[Any]]:
    """Per round, tensors of the sizes the protocol moves in it (no store, no protocol):
    one ``image_bytes`` tensor per image (staged) or its region sizes (regions)."""
    cfg = side.cfg
    if cfg.payload == "staged":
        return [[side.wire(t) for t in side.staging[: len(items)]] for items in rounds]
    torch = side.torch
    n = cfg.window * side.layout.image_bytes
    flat = torch.zeros(n, dtype=torch.uint8, device=side.device)
    views = list(flat.split(side.piece_bytes * cfg.window))
    k = len(side.piece_bytes)
    return [views[: k * len(items)] for items in rounds]


def _warm_up(side: _Side, link: Link, sending: bool) -> None:
    """One round's worth of plain transfers before anything is timed (NCCL builds its
    communicator on the first p2p call)."""
    first = _plain_rounds(side, [[(0, 0)] * side.cfg.window])[0]
    link.exchange(first, sending=sending)
    side.synchronize()


def _baseline(side: _Side, link: Link, rounds: list[list[tuple[int, int]]], sending: bool) -> float:
    """Seconds for a plain send/recv of the protocol's tensor sizes, round by round (one
    grouped p2p batch each, as the protocol's payloads), without control messages, leases,
    reservations or copies."""
    per_round = _plain_rounds(side, rounds)
    link.barrier()
    t0 = time.perf_counter()
    for tensors in per_round:
        link.exchange(tensors, sending=sending)
    side.synchronize()
    elapsed = time.perf_counter() - t0
    link.barrier()
    return elapsed


def _counted(link: Link, before: dict[str, int], rounds: int) -> dict[str, Any]:
    """The control messages of the timed loop (from its first ROUND to END and SUMMARY):
    ``sent``, ``received``, ``rounds`` and ``per_round`` (both directions, END and SUMMARY
    included: ``pipeline=1`` 3 + 2/rounds, ``pipeline=2`` 2 + 2/rounds)."""
    sent = link.messages["sent"] - before["sent"]
    received = link.messages["received"] - before["received"]
    return {
        "sent": sent,
        "received": received,
        "rounds": rounds,
        "per_round": (sent + received) / rounds if rounds else 0.0,
    }
