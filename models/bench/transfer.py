"""``python -m pagedstate.models.bench.transfer``: images per second and GB/s of the
prefill/decode transfer (:mod:`pagedstate.impl.transfer`) against a plain
send/recv of the same bytes measured in the same run.

Each configuration (page size x payload mode x window x pipeline) is one two-rank run that
this command spawns itself (``spawn_transfer``: two child processes, rank 0 the sender,
rank 1 the receiver):

1. the sender stores every image through its own store (untimed: ``prefill_s``);
2. one round of plain transfers warms the link (NCCL builds its communicator on the first
   p2p call);
3. **protocol** (timed, from a barrier to the receiver's last adoption with its device
   synchronized): every image goes through the whole protocol of SPEC D.12 in rounds of
   ``window`` images (lease, header, reply, reserve, suspend the local restore, payload,
   land, adopt, release the suspended restore, release and settle the lease), with
   ``--pipeline`` rounds in flight (2: round k+1's lease, control exchange and gather
   overlap round k's payload);
4. every adopted image is restored into a slot and compared bit for bit with the image
   regenerated from the seed (untimed: ``verify_s``; ``mismatches`` must be 0);
5. **plain** (timed the same way): the same tensor sizes, grouped per round the same way,
   with ``isend``/``irecv`` alone: no control messages, leases, reservations or copies
   (one round after the other, whatever ``--pipeline``).

``GB/s`` is ``images * image_bytes / seconds`` (10^9 bytes); ``ratio`` is protocol GB/s over
plain GB/s. The Markdown table goes between ``<!-- bench-transfer:<name>:begin -->`` and
``<!-- bench-transfer:<name>:end -->`` of ``--out`` (appended when the markers are missing;
``<name>`` is the backend, with ``-quick`` for ``--quick``), so the gloo and nccl figures
live side by side in ``docs/transfer.md``.

Full size (``--backend nccl``, two GPUs): Qwen/Qwen3-Next-80B-A3B-Instruct, 512-token pages
(an image of 39,518,208 B in 4 units of 12 regions). ``--quick``: a slice of the geometry
(1 recurrent and 2 attention layers, / 32: 34,304 B in 3 units), few images: a smoke test on
CPU with gloo.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pagedstate.models._provenance import commit
from pagedstate.spec.errors import InvalidArgumentError

__all__ = ["bench_rows", "main", "render", "write_section"]

#: The driver, :mod:`pagedstate.impl.transfer`, taken by name at run time:
#: ``pagedstate.models`` imports no ``pagedstate.impl`` statically.
_driver: Any = importlib.import_module("pagedstate.impl.transfer")
PAYLOADS: tuple[str, ...] = _driver.PAYLOADS
PIPELINES: tuple[int, ...] = _driver.PIPELINES
COPY_ENGINES: tuple[str, ...] = _driver.COPY_ENGINES
TransferConfig: Any = _driver.TransferConfig
image_units: Any = _driver.image_units
spawn_transfer: Any = _driver.spawn_transfer

MODEL = "Qwen/Qwen3-Next-80B-A3B-Instruct"
QUICK_SLICE = (1, 2, 32)


def _ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected ints >= 1, got {text!r}")
    return vals


def _pipelines(text: str) -> list[int]:
    vals = _ints(text)
    if any(v not in PIPELINES for v in vals):
        raise argparse.ArgumentTypeError(f"pipelines are {PIPELINES}, got {text!r}")
    return vals


def _engines(text: str) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in vals if v not in COPY_ENGINES]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"copy engines are {COPY_ENGINES}, got {text!r}")
    return vals


def _payloads(text: str) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in vals if v not in PAYLOADS]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"payloads are {PAYLOADS}, got {text!r}")
    return vals


def bench_rows(
    *,
    backend: str,
    model: str,
    slice_: tuple[int, int, int] | None,
    block_tokens: Sequence[int],
    payloads: Sequence[str],
    images: int,
    window: int | Sequence[int],
    timeout_s: float,
    seed: int = 0,
    log: Any = None,
    pipeline: int | Sequence[int] = 1,
    copy_engine: str | Sequence[str] = "auto",
) -> list[dict[str, Any]]:
    """One two-rank run per ``(block_tokens, payload, window, pipeline, copy_engine)`` (the
    copy engine of a staged payload: ``TransferConfig.copy_engine``; the regions payload
    runs once, with ``"auto"``); a row per run
    (see the module doc for the fields' meaning). A failed run gives a row with ``ok``
    False and ``error``. Each run has ``window * pipeline`` slots (a slot per image in
    flight).

    Raises:
        InvalidArgumentError: a configuration is out of range (``TransferConfig``).
    """
    device = "cuda" if backend == "nccl" else "cpu"
    rows = []
    windows = [window] if isinstance(window, int) else list(window)
    if not windows:
        raise InvalidArgumentError("window must name at least one window, got none")
    pipes = [pipeline] if isinstance(pipeline, int) else list(pipeline)
    if not pipes:
        raise InvalidArgumentError("pipeline must name at least one value, got none")
    engines = [copy_engine] if isinstance(copy_engine, str) else list(copy_engine)
    if not engines or any(e not in COPY_ENGINES for e in engines):
        raise InvalidArgumentError(
            f"copy_engine must name at least one of {COPY_ENGINES}, got {copy_engine!r}"
        )
    cfgs = []  # every configuration is checked before the first run
    combos = [
        (b, p, w, q, e)
        for b in block_tokens
        for p in payloads
        for w in windows
        for q in pipes
        for e in (engines if p == "staged" else ["auto"])
    ]
    for bt, payload, window, pipe, engine in combos:
        for name, v in (("images", images), ("window", window)):
            if type(v) is not int or v < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {v!r}")
        if type(pipe) is not int or pipe not in PIPELINES:
            raise InvalidArgumentError(f"pipeline must be an int in {PIPELINES}, got {pipe!r}")
        u = image_units(model, slice_, bt)
        cfgs.append(
            TransferConfig(
                model=model,
                block_tokens=bt,
                slice=slice_,
                images=images,
                window=window,
                pipeline=pipe,
                slots=window * pipe,
                backend=backend,
                device=device,
                payload=payload,
                copy_engine=engine,
                units=images * u,
                receiver_units=(images + 1 + window * pipe) * u,
                verify="end",
                baseline=True,
                timeout_s=timeout_s,
                seed=seed,
            )
        )
    if not cfgs:
        raise InvalidArgumentError("no configuration to run: block_tokens and payloads are empty")
    for cfg in cfgs:
        t0 = time.perf_counter()
        res = spawn_transfer(cfg, timeout_s=2 * timeout_s + 120)
        row = _row(cfg, res, time.perf_counter() - t0)
        rows.append(row)
        if log is not None:
            print(json.dumps({k: v for k, v in row.items() if k != "ranks"}), file=log)
            log.flush()
    return rows


def _row(cfg: Any, res: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    snd, rcv = res
    lay = rcv.get("layout") or snd.get("layout") or {}
    image_bytes = int(lay.get("image_bytes", 0))
    row: dict[str, Any] = {
        "backend": cfg.backend,
        "model": lay.get("model_id", cfg.model),
        "block_tokens": cfg.block_tokens,
        "payload": cfg.payload,
        "images": cfg.images,
        "window": cfg.window,
        "pipeline": cfg.pipeline,
        "copy_engine": rcv.get("copy_engine") or snd.get("copy_engine") or cfg.copy_engine,
        "image_bytes": image_bytes,
        "units_per_image": lay.get("units_per_checkpoint"),
        "pieces_per_image": rcv.get("pieces_per_image"),
        "device_name": rcv.get("device_name"),
        "torch": rcv.get("torch"),
        "wall_s": wall,
    }
    errors = [f"rank {r}: {x['error']}" for r, x in enumerate(res) if "error" in x]
    errors += [f"rank {r}: killed" for r, x in enumerate(res) if x.get("killed")]
    errors += [
        f"rank {r}: invariants {x['invariants']}" for r, x in enumerate(res) if x.get("invariants")
    ]
    if errors:
        row.update(ok=False, error="; ".join(errors), logs=[x.get("log", "") for x in res])
        return row
    moved = cfg.images * image_bytes
    t, tb = rcv["transfer_s"], rcv["baseline_s"]
    gbps = moved / t / 1e9
    base_gbps = moved / tb / 1e9
    row.update(
        ok=rcv["adopted"] == cfg.images and not rcv["mismatches"],
        adopted=rcv["adopted"],
        checked=len(rcv["checked"]),
        mismatches=len(rcv["mismatches"]),
        protocol_s=t,
        images_per_s=cfg.images / t,
        gbps=gbps,
        plain_s=tb,
        plain_images_per_s=cfg.images / tb,
        plain_gbps=base_gbps,
        ratio=gbps / base_gbps,
        sender_protocol_s=snd["transfer_s"],
        sender_plain_s=snd["baseline_s"],
        prefill_s=snd["prefill_s"],
        verify_s=rcv["verify_s"],
        sender_phases_s=snd.get("phases_s", {}),
        receiver_phases_s=rcv.get("phases_s", {}),
        leases_left=snd["accounting"]["offload_pins"],
        reservations_left=rcv["accounting"]["transfers"],
        control_messages=snd.get("control_messages"),
        control_per_round=(snd.get("control_messages") or {}).get("per_round"),
    )
    return row


def render(rows: Sequence[dict[str, Any]], meta: dict[str, str]) -> str:
    """The Markdown section: a line of context and one table row per run."""
    head = (
        f"Measured {meta['date']} at commit `{meta['commit']}` on {meta['device']}"
        f" ({meta['backend']}, torch {meta['torch']}); `{meta['command']}`."
    )
    lines = [head, ""]
    lines.append(
        "| model | page tokens | payload | copy engine | window | pipeline | images | image |"
        " units (pieces) |"
        " protocol s | images/s | GB/s | plain GB/s | ratio | control msgs / round |"
        " checked (mismatches) |"
    )
    lines.append("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b = r["image_bytes"]
        size = f"{b / 2**20:.2f} MiB" if b >= 2**20 else f"{b / 2**10:.1f} KiB"
        units = f"{r.get('units_per_image')} ({r.get('pieces_per_image')})"
        shape = f"| {r['model']} | {r['block_tokens']} | {r['payload']} |"
        shape += f" {r.get('copy_engine', '-')} | {r['window']} |"
        shape += f" {r.get('pipeline', 1)} | {r['images']} | {size} | {units} |"
        if not r.get("protocol_s"):
            lines.append(f"{shape} failed: {r.get('error', '?')[:200]} | | | | | | |")
            continue
        per_round = r.get("control_per_round")
        ctrl = "" if per_round is None else f"{per_round:.2f}"
        lines.append(
            f"{shape} {r['protocol_s']:.4f} |"
            f" {r['images_per_s']:,.1f} | {r['gbps']:.2f} |"
            f" {r['plain_gbps']:.2f} | {r['ratio']:.2f} | {ctrl} |"
            f" {r['checked']} ({r['mismatches']}) |"
        )
    lines.append("")
    lines.append(
        "protocol s: receiver's seconds from a barrier to its last adoption (device"
        " synchronized); plain: the same tensor sizes by isend/irecv alone, grouped per round"
        " the same way, in the same run. ratio = protocol GB/s / plain GB/s. pipeline: rounds"
        " in flight (1: one after the other; 2: round k+1's control exchange and gather"
        " overlap round k's payload). control msgs / round: the timed loop's control messages"
        " (both directions, END and SUMMARY included) per round. Every adopted image was then"
        " restored and compared bit for bit (checked, mismatches)."
    )
    timed = [r for r in rows if r.get("protocol_s") and r.get("sender_phases_s")]
    if timed:
        lines += [
            "",
            "Where the protocol's time goes: host ms per image in each phase"
            " (a phase that waits for the peer or the device is charged the wait).",
            "",
        ]
        cols = [
            ("sender", "gather"),
            ("sender", "control"),
            ("sender", "exchange"),
            ("receiver", "control"),
            ("receiver", "exchange"),
            ("receiver", "land"),
            ("receiver", "accept"),
            ("receiver", "adopt"),
        ]
        lines.append(
            "| page tokens | payload | copy engine | window | pipeline | "
            + " | ".join(f"{side} {ph}" for side, ph in cols)
            + " |"
        )
        lines.append("|---:|---|---|---:|---:|" + "---:|" * len(cols))
        for r in timed:
            cells = [
                f"{1e3 * r[side + '_phases_s'].get(ph, 0.0) / r['images']:.3f}" for side, ph in cols
            ]
            lines.append(
                f"| {r['block_tokens']} | {r['payload']} | {r.get('copy_engine', '-')} |"
                f" {r['window']} | {r.get('pipeline', 1)} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines) + "\n"


def write_section(path: Path, name: str, body: str) -> None:
    """Put ``body`` between the markers of section ``name`` (``nccl``, ``gloo``,
    ``gloo-quick``) in ``path`` (appended, or a new file, when they are missing)."""
    begin = f"<!-- bench-transfer:{name}:begin -->"
    end = f"<!-- bench-transfer:{name}:end -->"
    block = f"{begin}\n{body}{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in text and end in text and text.index(begin) < text.index(end):
        a = text.index(begin)
        b = text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block + "\n"
    path.write_text(text, encoding="utf-8")


def _shown(argv: Sequence[str] | None) -> list[str]:
    """The command's arguments without its output paths (``--out``, ``--json``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in ("--out", "--json"):
            skip = True
        elif not a.startswith(("--out=", "--json=")):
            out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every run adopted and checked every image, else 1."""
    ap = argparse.ArgumentParser(
        prog="python -m pagedstate.models.bench.transfer",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Images per second and GB/s of the prefill/decode transfer against a plain"
        " send/recv of the same bytes (two ranks spawned here). nccl needs two CUDA devices;"
        " on a CPU use --backend gloo. Defaults: 128 images in rounds of 8 at 512-token pages"
        " (--quick: a slice, 16 images in rounds of 4 at 128-token pages).",
    )
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="nccl")
    ap.add_argument("--quick", action="store_true", help="sliced geometry, few images (CPU)")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--block-tokens", type=_ints, default=None, help="e.g. 512 or 512,128")
    ap.add_argument("--payload", type=_payloads, default=list(PAYLOADS), help="staged,regions")
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--window", type=_ints, default=None, help="images per round, e.g. 8,32")
    ap.add_argument(
        "--pipeline", type=_pipelines, default=[1], help="rounds in flight, 1, 2 or 1,2"
    )
    ap.add_argument(
        "--copy-engine",
        type=_engines,
        default=["auto"],
        help="how a staged payload is gathered and landed, e.g. index,triton (auto: triton"
        " on CUDA, index on CPU)",
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="process group timeout, s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="Markdown file to update")
    ap.add_argument("--json", type=Path, default=None, help="write every row as JSON here")
    args = ap.parse_args(argv)
    if args.backend == "nccl" and not _two_gpus():
        ap.error("--backend nccl needs two CUDA devices and NCCL; on a CPU use --backend gloo")
    quick = args.quick
    slice_ = QUICK_SLICE if quick else None
    block_tokens = args.block_tokens or ([128] if quick else [512])
    images = args.images if args.images is not None else (16 if quick else 128)
    window = args.window or ([4] if quick else [8])
    try:
        rows = bench_rows(
            backend=args.backend,
            model=args.model,
            slice_=slice_,
            block_tokens=block_tokens,
            payloads=args.payload,
            images=images,
            window=window,
            timeout_s=args.timeout,
            seed=args.seed,
            log=sys.stdout,
            pipeline=args.pipeline,
            copy_engine=args.copy_engine,
        )
    except (InvalidArgumentError, _driver.TorchMissingError) as e:  # before any run
        print(f"bench_transfer: {e}", file=sys.stderr)
        return 2
    first = next((r for r in rows if r.get("device_name")), {})
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "commit": commit(),
        "device": f"2 x {first.get('device_name')}"
        if args.backend == "nccl"
        else (f"one host, 2 processes ({platform.machine()})"),
        "backend": args.backend,
        "torch": str(first.get("torch")),
        "command": "python -m pagedstate.models.bench.transfer " + " ".join(_shown(argv)),
    }
    body = render(rows, meta)
    print(body)
    if args.json is not None:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    ok = bool(rows) and all(r.get("ok") for r in rows)
    if args.out is not None and ok:
        write_section(args.out, args.backend + ("-quick" if quick else ""), body)
    elif args.out is not None:
        print(f"bench_transfer: a run failed: {args.out} left as it was", file=sys.stderr)
    return 0 if ok else 1


def _two_gpus() -> bool:
    try:  # by name at run time, as the driver does (no static torch import in models)
        torch = importlib.import_module("torch")
        dist = importlib.import_module("torch.distributed")
    except ImportError:  # pragma: no cover - the gpu extra is missing
        return False
    return bool(
        torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()
    )


if __name__ == "__main__":
    sys.exit(main())
