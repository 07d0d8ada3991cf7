"""The process launcher: :func:`spawn_transfer` runs both ranks as child processes, and
:func:`_main` is one such child (``python -m pagedstate.impl.transfer``)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedstate.spec.errors import InvalidArgumentError

from .config import TransferConfig, _config_from_json, _config_json, _need_config
from .errors import _module
from .rank import _rank_entry


def _require_torch() -> None:
    """Check, in this process, that the ranks will be able to run: ``torch`` and
    ``torch.distributed`` import (each rank imports them first thing; a child that cannot
    would only report it in its result's ``log``).

    Raises:
        TorchMissingError: one of them cannot be imported; the message names it and the
            extra to install (``pip install 'pagedstate[gpu]'``).
    """
    _module("torch")
    _module("torch.distributed")


def spawn_transfer(cfg: TransferConfig, *, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Run both ranks of ``cfg`` as two child processes (``python -m
    pagedstate.impl.transfer``, a ``file://`` rendezvous in a fresh temporary folder: no
    port to pick) and return their results, rank 0 first. Each result has ``exitcode``,
    ``killed`` and ``log`` (the end of the rank's output); a rank that wrote no result has
    ``error``.

    The whole run is bounded: a rank still alive ``timeout_s`` seconds after the start
    (default ``3 * cfg.timeout_s + 60``) is killed (by its own process id) and marked
    ``killed``, so a hung peer cannot hang the caller.

    Raises:
        InvalidArgumentError: ``cfg`` is not a TransferConfig or ``timeout_s`` not a finite
            number > 0.
        TorchMissingError: torch cannot be imported here (:func:`_require_torch`); no
            process was started.
    """
    _need_config(cfg)
    limit = 3 * cfg.timeout_s + 60 if timeout_s is None else timeout_s
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not limit > 0
        or not math.isfinite(limit)
    ):
        raise InvalidArgumentError(
            f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}"
        )
    _require_torch()
    with tempfile.TemporaryDirectory(prefix="pagedstate-transfer-") as tmp:
        init = Path(tmp, "rendezvous").as_uri()
        conf = Path(tmp, "config.json")
        conf.write_text(_config_json(cfg), encoding="utf-8")
        outs = [Path(tmp, f"rank{r}.json") for r in range(2)]
        logs = [Path(tmp, f"rank{r}.log") for r in range(2)]
        procs = []
        for r in range(2):
            cmd = [sys.executable, "-m", "pagedstate.impl.transfer", "--rank", str(r)]
            cmd += ["--config", str(conf), "--init", init, "--out", str(outs[r])]
            with open(logs[r], "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + limit
        killed = [False, False]
        for r, p in enumerate(procs):
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed[r] = True
        for r, p in enumerate(procs):
            if p.poll() is None:
                killed[r] = True
                p.kill()
                p.wait(10)
        results: list[dict[str, Any]] = []
        for r, p in enumerate(procs):
            try:
                res: dict[str, Any] = json.loads(outs[r].read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                res = {"error": f"rank {r} wrote no result ({type(e).__name__})"}
            res["exitcode"] = p.returncode
            res["killed"] = killed[r]
            res["log"] = logs[r].read_bytes()[-4000:].decode("utf-8", errors="replace")
            results.append(res)
    return results


def _main(argv: Sequence[str] | None = None) -> int:
    """One rank of :func:`spawn_transfer` (``python -m pagedstate.impl.transfer``)."""
    ap = argparse.ArgumentParser(prog="python -m pagedstate.impl.transfer")
    ap.add_argument("--rank", type=int, choices=(0, 1), required=True)
    ap.add_argument("--config", type=Path, required=True, help="TransferConfig as JSON")
    ap.add_argument("--init", required=True, help="torch.distributed init_method")
    ap.add_argument("--out", required=True, help="where the rank writes its result (JSON)")
    args = ap.parse_args(argv)
    try:
        cfg = _config_from_json(args.config.read_text(encoding="utf-8"))
    except OSError as e:
        ap.error(f"argument --config: cannot read {str(args.config)!r}: {e.strerror or e}")
    except InvalidArgumentError as e:
        ap.error(f"argument --config: {args.config}: {e}")
    _rank_entry(args.rank, cfg, args.init, args.out)
    return 0
