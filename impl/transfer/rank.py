"""One rank of a run under ``torch.distributed`` (:func:`run_rank`), its result report, and
the entry of a spawned rank process (:func:`_rank_entry`: writes the result as JSON)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
import traceback
from typing import Any

from pagedstate.spec.errors import InvalidArgumentError

from .config import CRASH_EXIT, TransferConfig, _need_config
from .errors import SenderCrashed, TransferError, _module
from .receiver import Receiver, _receiver_loop
from .sender import Sender, _sender_loop
from .side import _Side
from .wire import Link


def run_rank(rank: int, world_size: int, cfg: TransferConfig, init_method: str) -> dict[str, Any]:
    """Run one rank of a transfer under ``torch.distributed`` and return its result: what
    it sent or received, timings in seconds, the control messages of its timed loop
    (``control_messages``: ``sent``, ``received``, ``rounds``, ``per_round``), its unit
    accounting, the offload / lease / transfer rows it took and the data group's aborts
    (``events``) and any SPEC C invariant it broke (``invariants``).

    Three process groups: the default one (``cfg.backend``), the control group (gloo: the
    default group with gloo, a gloo subgroup next to nccl) and the data group, a subgroup
    of ``cfg.backend`` that carries only image bytes, so that a lost payload can be aborted
    (:meth:`Link.abort_data`) without losing the control messages. Every group times out
    after ``cfg.timeout_s`` seconds; a round's payload after ``cfg.data_timeout_s``. With
    nccl, ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is set to ``0`` in this process before the
    groups are made (``_abort_process_group`` needs it: otherwise NCCL's watchdog may act on
    a failed or late transfer first, by ending the process).

    Args:
        rank: 0 (sender) or 1 (receiver).
        world_size: 2.
        cfg: the run (the same on both ranks).
        init_method: the rendezvous (``"tcp://127.0.0.1:PORT"`` or ``"file:///path"``).

    Raises:
        InvalidArgumentError: ``world_size`` is not 2 or ``rank`` not 0 or 1.
        SenderCrashed: rank 0 with ``fault="sender_dies"``, ``"sender_dies_after_go"`` or
            ``"sender_dies_mid_payload"`` (its result is the exception's
            ``result`` attribute; the caller should then exit without a teardown).
        LayoutMismatchError, WireError, TransferError: the run failed.
    """
    if (
        type(world_size) is not int
        or type(rank) is not int
        or world_size != 2
        or rank not in (0, 1)
    ):
        raise InvalidArgumentError(
            f"a transfer runs on ranks 0 and 1 of 2, got {rank}/{world_size}"
        )
    _need_config(cfg)
    torch = _module("torch")
    dist = _module("torch.distributed")
    if cfg.device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    else:
        device = "cpu"
    if cfg.backend == "nccl":
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    dist.init_process_group(
        cfg.backend,
        init_method=init_method,
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=cfg.timeout_s),
    )
    crashed = False
    try:
        # The control and data groups time out like the default one (new_group would wait
        # 30 min). Both ranks make them in the same order (new_group is collective).
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        ctrl = dist.new_group(backend="gloo", timeout=timeout) if cfg.backend == "nccl" else None
        data = dist.new_group(backend=cfg.backend, timeout=timeout)
        side: _Side = Sender(cfg, device) if rank == 0 else Receiver(cfg, device)
        link = Link(
            dist,
            rank,
            ctrl,
            data,
            side.device,
            data_backend=cfg.backend,
            data_timeout_s=cfg.data_timeout_s,
        )
        link.on_event = side.events.append
        t0 = time.perf_counter()
        try:
            if isinstance(side, Sender):
                result = _sender_loop(side, link)
            else:
                assert isinstance(side, Receiver)
                result = _receiver_loop(side, link)
        except TransferError as e:
            crashed = isinstance(e, SenderCrashed)
            e.result = _rank_report(side, {"crashed" if crashed else "failed": str(e)}, t0)
            raise
        return _rank_report(side, result, t0)
    finally:
        if not crashed:
            dist.destroy_process_group()


def _rank_report(side: _Side, result: dict[str, Any], t0: float) -> dict[str, Any]:
    lay = side.layout
    store = side.coord.store
    report = {
        "role": "sender" if isinstance(side, Sender) else "receiver",
        **result,
        "wall_s": time.perf_counter() - t0,
        "layout": {k: v for k, v in lay.describe().items()},
        "pieces_per_image": len(side.pieces),
        "copy_engine": side.copy_engine,
        "accounting": side.accounting(),
        "ready": sorted(h for h in store.hash_to_checkpoint if side.coord.contains(h)),
        "offload_pins_reclaimed": store.offload_pins_reclaimed,
        "has_offload_pins": side.coord.has_offload_pins(),
        "events": side.events,
        "invariants": side.invariants(),
        "device": str(side.device),
        "device_name": (
            side.torch.cuda.get_device_name(side.device)
            if side.device.type == "cuda"
            else platform.processor() or platform.machine()
        ),
        "torch": str(side.torch.__version__),
        "backend": side.cfg.backend,
    }
    if isinstance(side, Receiver):
        report["tenant_units"] = len(side.tenant)
        report["local_key"] = side.local_key
    else:
        assert isinstance(side, Sender)
        report["keys"] = side.keys
    return report


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _rank_entry(rank: int, cfg: TransferConfig, init_method: str, out: str) -> None:
    """A spawned rank: run it, write its result to ``out`` (JSON), exit (``CRASH_EXIT`` for
    the sender's planned death, 1 on an error, whose traceback is in the result)."""
    if cfg.device == "cpu":
        torch = _module("torch")
        torch.set_num_threads(1)
    try:
        result = run_rank(rank, 2, cfg, init_method)
    except SenderCrashed as e:
        _write_json(out, e.result if e.result is not None else {"crashed": str(e)})
        os._exit(CRASH_EXIT)  # die: no teardown, the peer sees the connection go
    except BaseException as e:
        report = getattr(e, "result", None) or {}
        report.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        _write_json(out, report)
        raise SystemExit(1) from None
    _write_json(out, result)
