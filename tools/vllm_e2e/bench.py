"""`make bench-engine`: vLLM's own prefix cache (align mode) against vLLM + the pagedstate tier
on the same requests and the same bytes of cache.

Both engines get the same total cache memory in blocks of one page: (a) vLLM alone with
``TOTAL`` blocks; (b) vLLM with ``TOTAL - UNITS`` blocks plus the tier's ``UNITS`` units
(one unit = one vLLM block of every attention layer = the same bytes as one vLLM block
here). The requests: the shared-prefix prompts and the trace slice of
``tools/vllm_e2e/common.py``, each run alone, in order, then again in reverse order (a
second visit of every conversation, the most recent first). Printed and written as JSON
(``--json``): prompt tokens served from cache (vLLM's ``num_cached_tokens``, and the tier's
share), recurrent-state bytes held per cached prefix, and wall time per request (median
over ``--reps`` alternating runs of each config, each run's first request left out as
warm-up), with the ratio (b)/(a) of each, from one invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402


def run_config(path: str, total: int, units: int | None) -> dict[str, Any]:
    tier = None if units is None else {"num_units": units}
    blocks = total if units is None else total - units
    t0 = time.perf_counter()
    engine = C.llm(path, caching=True, tier=tier, num_gpu_blocks_override=blocks)
    start_s = time.perf_counter() - t0
    names = [n for n in C.all_prompts() if n.startswith(("shared-", "trace-"))]
    prompts = C.all_prompts()
    walls: list[float] = []
    cached = 0
    tokens = 0
    for order in (names, names[::-1]):  # a second visit, the most recent first
        for n in order:
            p, k = prompts[n]
            t = time.perf_counter()
            out = engine.generate([{"prompt_token_ids": p}], C.params(k), use_tqdm=False)[0]
            walls.append(time.perf_counter() - t)
            cached += out.num_cached_tokens
            tokens += len(p)
    out: dict[str, Any] = {
        "vllm_blocks": blocks,
        "tier_units": units or 0,
        "engine_start_s": round(start_s, 1),
        "requests": len(walls),
        "prompt_tokens": tokens,
        "tokens_from_cache": cached,
        "wall_s_per_request_median": round(statistics.median(walls), 4),
        "wall_s_per_request_mean": round(statistics.mean(walls), 4),
        "wall_s_per_request": [round(w, 3) for w in walls],
    }
    from pagedstate.engines.vllm.connector import connectors

    sched = [c for c in connectors() if c.tier is not None]
    layout = None
    if sched:
        c = sched[-1]
        tier_obj = c.tier
        assert tier_obj is not None
        layout = c.layout
        out["tier_stats"] = dict(tier_obj.stats)
        out["tokens_from_tier"] = tier_obj.stats["hit_tokens"]
        out["tier_units_held"] = tier_obj.units_held()
        out["tier_idle"] = tier_obj.is_idle()
    core = engine.llm_engine.engine_core.engine_core
    cfg = core.scheduler.kv_cache_config
    groups = cfg.kv_cache_groups
    mamba = [g for g in groups if type(g.kv_cache_spec).__name__ == "MambaSpec"]
    page = mamba[0].kv_cache_spec.page_size_bytes
    out["block_tokens"] = groups[0].kv_cache_spec.block_size
    # vLLM align mode: one state block per recurrent group for every cached boundary
    out["vllm_state_bytes_per_prefix"] = page * len(mamba)
    if layout is not None:
        lay = layout.layout
        out["tier_state_bytes_per_prefix"] = lay.units_per_checkpoint * lay.page_unit_bytes
        out["state_bytes_carried"] = lay.image_bytes
    del engine
    return out


def _sub(cfg: str, total: int, units: int) -> dict[str, Any]:
    import subprocess

    r = subprocess.run(
        [sys.executable, __file__, "--config", cfg, "--total", str(total), "--units", str(units)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode:
        print(r.stdout[-4000:], r.stderr[-4000:])
        raise SystemExit(r.returncode)
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        default="96:48,384:256",
        help="TOTAL:UNITS pairs: cache blocks in all, and of them the tier's (default"
        " 96:48,384:256)",
    )
    ap.add_argument("--reps", type=int, default=2, help="runs of each config (default 2)")
    ap.add_argument("--config", choices=("vllm", "tier"), help="run one config (internal)")
    ap.add_argument("--total", type=int, default=96, help=argparse.SUPPRESS)
    ap.add_argument("--units", type=int, default=48, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    path = C.make_model(Path(tempfile.gettempdir()) / "pagedstate-vllm-tiny")
    if args.config:
        res = run_config(path, args.total, None if args.config == "vllm" else args.units)
        print(json.dumps(res))
        return 0
    sizes = [tuple(int(x) for x in pair.split(":")) for pair in args.sizes.split(",")]
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "runs": [],
    }
    for total, units in sizes:
        row: dict[str, Any] = {"total_blocks": total, "tier_units": units}
        reps: dict[str, list[dict[str, Any]]] = {"vllm": [], "tier": []}
        for rep in range(args.reps):  # alternating, so both see the same drift in load
            for cfg in ("vllm", "tier"):
                print(
                    f"bench-engine: {cfg} with {total} blocks, run {rep + 1}/{args.reps}"
                    " (engine start 15-60 s, then 34 requests) ...",
                    flush=True,
                )
                reps[cfg].append(_sub(cfg, total, units))
        for cfg, runs in reps.items():
            # the first request of a run warms the engine up: left out of the wall figures
            walls = [w for r in runs for w in r["wall_s_per_request"][1:]]
            row[cfg] = dict(runs[0])
            row[cfg]["wall_s_per_request_median"] = round(statistics.median(walls), 4)
            row[cfg]["wall_s_per_request_mean"] = round(statistics.mean(walls), 4)
            row[cfg]["runs"] = len(runs)
            row[cfg]["wall_s_per_request"] = [r["wall_s_per_request"] for r in runs]
        a, b = row["vllm"], row["tier"]
        row["ratios_tier_over_vllm"] = {
            "tokens_from_cache": round(b["tokens_from_cache"] / max(a["tokens_from_cache"], 1), 3),
            "state_bytes_per_prefix": round(
                b["tier_state_bytes_per_prefix"] / a["vllm_state_bytes_per_prefix"], 3
            ),
            "wall_s_per_request_median": round(
                b["wall_s_per_request_median"] / a["wall_s_per_request_median"], 3
            ),
        }
        row["loadavg_after"] = os.getloadavg()
        results["runs"].append(row)
    print(
        f"{'total':>6} {'config':>7} {'vllm':>5} {'units':>5} {'from cache':>17}"
        f" {'of it tier':>10} {'state B/prefix':>14} {'s/request':>9}"
    )
    for row in results["runs"]:
        for cfg in ("vllm", "tier"):
            r = row[cfg]
            state = r.get("tier_state_bytes_per_prefix", r["vllm_state_bytes_per_prefix"])
            print(
                f"{row['total_blocks']:>6} {cfg:>7} {r['vllm_blocks']:>5} {r['tier_units']:>5}"
                f" {r['tokens_from_cache']:>8}/{r['prompt_tokens']:<8}"
                f" {r.get('tokens_from_tier', 0):>10} {state:>14}"
                f" {r['wall_s_per_request_median']:>9.3f}"
            )
        print(f"{'':>6} ratios tier/vllm: {row['ratios_tier_over_vllm']}")
    print("load average after the runs:", os.getloadavg())
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
