"""``pagedstate replay``: replay a Mooncake trace through the store (see :mod:`.run`).

Exit status: 0 every run finished (and, with ``--verify``, agreed with the reference); 1 a
divergence, a broken invariant or a restore that was not bit-exact (the message names the
store call and both answers); 2 bad input (a malformed trace line, an unknown model, a pool
too small, a bad option), reported before any run starts, with nothing written.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import ReplayConfig, parse_placement
from .errors import Divergence, ReplayError
from .parts import _store_module
from .report import _atomic_write, format_result, plot_results
from .result import ReplayResult
from .run import ReplayEngine
from .trace import TraceRequest, load_trace

__all__ = ["add_parser", "plot_results", "run", "format_result"]


def _floats(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected GiB as numbers separated by commas, got {text!r}"
            ) from None
        if not v > 0 or v != v or v == float("inf"):
            raise argparse.ArgumentTypeError(
                f"a pool size must be a finite number > 0, got {part!r}"
            )
        out.append(v)
    return out


def _placements(text: str) -> list[str]:
    out = []
    for part in text.split(","):
        try:
            parse_placement(part)
        except ReplayError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        out.append(part)
    return out


def _int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {text!r}"
            ) from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {v}")
        return v

    return parse


def _rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a probability in [0, 1], got {text!r}"
        ) from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {v}")
    return v


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``replay`` on the ``commands`` subparsers of ``pagedstate``."""
    p: argparse.ArgumentParser = commands.add_parser(
        "replay",
        help="replay a request trace through the store (hit rates, tokens saved, checks)",
        description=(
            "Replay a Mooncake-format JSONL trace (512-token prefix blocks) through the "
            "production store on a simulated clock: admission with resumable hits and "
            "restores, chunked prefill filing checkpoints by placement policy, decode, "
            "completions, optional aborts and CPU tier. Prints hit rates, prefill tokens "
            "saved, checkpoint fates and per-call bookkeeping cost. With --verify the "
            "reference model runs in lockstep and the first disagreement stops the run "
            "(exit 1). Bad input exits 2 before anything runs."
        ),
    )
    p.add_argument("trace", metavar="TRACE", help="Mooncake-format JSONL trace")
    p.add_argument(
        "--model",
        required=True,
        metavar="MODEL_ID",
        help="a model of the shipped geometries, e.g. Qwen/Qwen3-Next-80B-A3B-Instruct, or a"
        " unique part of its id (Qwen3-Next)",
    )
    p.add_argument(
        "--pool-gib",
        required=True,
        type=_floats,
        metavar="G[,G2,...]",
        help="unit pool size(s) in GiB (KV pages and checkpoint images); one run each",
    )
    p.add_argument(
        "--kv-block-tokens",
        type=_int(1),
        default=512,
        metavar="B",
        help="tokens per KV page, a divisor of 512 (default %(default)s)",
    )
    p.add_argument(
        "--max-running",
        type=_int(1),
        default=64,
        metavar="N",
        help="state slots = concurrent requests (default %(default)s)",
    )
    p.add_argument(
        "--chunk-tokens",
        type=_int(1),
        default=2048,
        metavar="C",
        help="prefill tokens per request per pass (default %(default)s)",
    )
    p.add_argument(
        "--placement",
        type=_placements,
        default=["end"],
        metavar="P[,P2,...]",
        help="checkpoint placement: end, grid:K or anchor; several, comma-separated,"
        " give one run each (default end)",
    )
    p.add_argument("--offload", action="store_true", help="a CPU tier behind the store")
    p.add_argument(
        "--abort-rate",
        type=_rate,
        default=0.0,
        metavar="P",
        help="share of requests aborted at a random point (default 0)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="run the reference model in lockstep; stop at the first divergence",
    )
    p.add_argument(
        "--executor",
        choices=("none", "torch", "triton"),
        default="none",
        help="run the store's ops on real tensors and check every restore bit-exact",
    )
    p.add_argument(
        "--limit", type=_int(1), default=None, metavar="N", help="replay only the first N requests"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of aborts and lost reports")
    p.add_argument(
        "--impl",
        default="pagedstate.impl",
        metavar="MODULE",
        help="the store module to replay (UnitPool, PagedStateCheckpointCoordinator);"
        " default %(default)s",
    )
    p.add_argument("--json", metavar="OUT", default=None, help="write every figure as JSON")
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        default=None,
        help="with several pool sizes: hit rate and tokens saved against pool size",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run, subparser=p)
    return p


def _check_out(path: str | None, what: str) -> Path | None:
    """The output path, checked before any run: its folder exists and takes a new file.

    Raises:
        ReplayError: empty path, no such folder, a folder named, or nothing can be written
            there.
    """
    if path is None:
        return None
    if not path.strip():
        raise ReplayError(f"{what}: the path is empty")
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ReplayError(f"{what} {path}: the folder {parent} does not exist")
    if p.is_dir():
        raise ReplayError(f"{what} {path} is a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ReplayError(f"{what} {path}: cannot write in {parent} ({e.strerror or e})") from None
    return p


def run(args: argparse.Namespace) -> int:
    """The ``replay`` subcommand; see the module docstring for the exit status."""
    try:
        return _run(args)
    except ReplayError as e:
        print(f"pagedstate replay: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run(args: argparse.Namespace) -> int:
    json_out = _check_out(args.json, "--json")
    plot_out = _check_out(args.plot, "--plot")
    if json_out is not None and plot_out is not None and json_out.resolve() == plot_out.resolve():
        raise ReplayError(f"--json and --plot name the same file, {args.json}")
    for what, values in (("--pool-gib", args.pool_gib), ("--placement", args.placement)):
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            raise ReplayError(f"{what} names {', '.join(twice)} twice: one run each")
    if plot_out is not None and plot_out.suffix.lower() != ".png":
        raise ReplayError(f"--plot writes a PNG image: name it *.png, got {args.plot}")
    if plot_out is not None and len(args.pool_gib) < 2:
        raise ReplayError("--plot draws results against pool size: give several --pool-gib values")
    if plot_out is not None:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            raise ReplayError("--plot needs matplotlib: pip install 'pagedstate[plot]'") from None
    impl = _store_module(args.impl)
    trace: list[TraceRequest] = load_trace(args.trace, args.limit)
    factory = None
    if args.executor != "none":
        exec_mod = importlib.import_module("pagedstate.models.replay.executor")
        factory = exec_mod.make_executor_factory(args.executor)
    configs = [
        ReplayConfig(
            model_id=args.model,
            pool_gib=g,
            kv_block_tokens=args.kv_block_tokens,
            max_running=args.max_running,
            chunk_tokens=args.chunk_tokens,
            placement=p,
            offload=args.offload,
            abort_rate=args.abort_rate,
            verify=args.verify,
            seed=args.seed,
        )
        for p in args.placement
        for g in args.pool_gib
    ]
    # Build every engine first: bad input (model, pool too small for a request) is found
    # before any run starts.
    engines = [ReplayEngine(cfg, trace, impl, executor_factory=None) for cfg in configs]
    del engines
    results: list[ReplayResult] = []
    progress = _Progress(len(configs), len(trace), quiet=args.quiet)
    try:
        for i, cfg in enumerate(configs):
            progress.start(i, f"{cfg.placement} {cfg.pool_gib:g} GiB")
            engine = ReplayEngine(
                cfg, trace, impl, executor_factory=factory, progress=progress.update
            )
            try:
                r = engine.run()
            except ReplayError:
                raise
            except Divergence as e:
                progress.close()
                print(
                    f"pagedstate replay: {cfg.placement} {cfg.pool_gib:g} GiB: {e}", file=sys.stderr
                )
                return 1
            except Exception as e:  # the store (or the executor) misbehaved: a finding
                progress.close()
                print(
                    f"pagedstate replay: {cfg.placement} {cfg.pool_gib:g} GiB: the replay"
                    f" stopped at store call {max(0, engine.step - 1)} ({engine.last_call}):"
                    f" {type(e).__name__}: {e}",
                    file=sys.stderr,
                )
                return 1
            results.append(r)
            del engine  # its tensors go before the next run's are made
    finally:
        progress.close()
    wrote = []
    if plot_out is not None:
        plot_results(results, plot_out)
        wrote.append(plot_out)
    if json_out is not None:
        doc = {
            "trace": str(args.trace),
            "requests": len(trace),
            "runs": [r.to_json() for r in results],
        }
        data = json.dumps(doc, indent=1).encode("utf-8")
        _atomic_write(json_out, lambda f: f.write(data))
        wrote.append(json_out)
    for r in results:
        print(format_result(r))
    for path in wrote:
        print(f"wrote {path}")
    return 0


#: Seconds between the plain progress lines printed when stderr is no terminal (a CI log).
_LOG_EVERY_S = 30.0


class _Progress:
    """A rich progress bar on stderr; off a terminal (a CI log), one plain line every
    :data:`_LOG_EVERY_S` seconds instead; nothing with ``quiet``."""

    def __init__(self, runs: int, requests: int, *, quiet: bool) -> None:
        self._bar: Any = None
        self._task: Any = None
        self._runs = runs
        self._last = -1
        self._plain = not quiet and not sys.stderr.isatty()
        self._label = ""
        self._run = 0
        self._started = self._logged = time.monotonic()
        if quiet or self._plain:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("replay", total=requests)

    def start(self, i: int, label: str) -> None:
        self._run, self._label = i, label
        if self._bar is not None:
            self._bar.reset(self._task, description=f"run {i + 1}/{self._runs}: {label}")
            self._last = -1

    def update(self, done: int, total: int) -> None:
        if self._plain:
            now = time.monotonic()
            if now - self._logged >= _LOG_EVERY_S:
                self._logged = now
                print(
                    f"replay run {self._run + 1}/{self._runs} ({self._label}): {done:,} of"
                    f" {total:,} requests, {now - self._started:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            return
        if self._bar is not None and done != self._last:
            self._last = done
            self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
