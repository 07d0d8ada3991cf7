"""The report of :mod:`pagedstate.models.bench.units`: its Markdown section (every cell,
the growth ratios, the per-call tables, the targets), the section's place in a Markdown
file, and the raw JSON. Apart from the measurement so that each module holds one idea."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .units import Cell, Measured

__all__ = ["ratio_rows", "section", "write_json", "write_section"]

_MARK_BEGIN = "<!-- bench-units:begin -->"
_MARK_END = "<!-- bench-units:end -->"

#: Units per image of the shipped geometries at 16-token pages (``pagedstate.gpu``).
MODEL_UNITS = {101: "Qwen3-Next", 337: "Kimi-Linear", 390: "Nemotron-H"}
POOLS = ("fresh", "fragmented")

#: The targets (issue 19): µs per image op at ``RATIO_UNITS[1]`` units over its cost at
#: ``RATIO_UNITS[0]``, per pool; the store host time per pass at ``PASS_TARGET_AT``.
RATIO_UNITS = (4, 390)
TARGET_RATIO = {"fresh": 1.2, "fragmented": 2.0}
PASS_TARGET_AT = (256, 101)  # (running requests, units per image)
TARGET_PASS_MS = 0.5

#: Store calls (the coordinator's), in report order.
STORE_METHODS = (
    "complete_previous_batch",
    "contains",
    "begin_restore",
    "ensure_free_units",
    "take_checkpoint_ops",
    "checkpoint",
    "forget_pending",
)
#: The engine's own KV calls on the pool (fragmented pool only): timed apart.
KV_METHODS = ("pool.reserve_units", "pool.cache_units")


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def _find(meas: Measured, pool: str, R: int, U: int) -> Cell | None:
    for c in meas.cells:
        if (c.pool, c.running, c.units) == (pool, R, U):
            return c
    return None


def _label(U: int) -> str:
    return f"{U} ({MODEL_UNITS[U]})" if U in MODEL_UNITS else str(U)


def ratio_rows(meas: Measured) -> list[dict[str, Any]]:
    """Per (pool, running requests): µs per image op at ``RATIO_UNITS`` and their ratio
    against the pool's target (empty where either U was not run)."""
    lo, hi = RATIO_UNITS
    out = []
    for pool in meas.o.pools:
        for R in meas.o.running:
            a, b = _find(meas, pool, R, lo), _find(meas, pool, R, hi)
            if a is None or b is None or not a.us_per_image_op:
                continue
            ratio = b.us_per_image_op / a.us_per_image_op
            target = TARGET_RATIO.get(pool, TARGET_RATIO["fragmented"])
            out.append(
                {
                    "pool": pool,
                    "running": R,
                    "lo": a.us_per_image_op,
                    "hi": b.us_per_image_op,
                    "ratio": ratio,
                    "target": target,
                    "met": ratio <= target,
                }
            )
    return out


def section(meas: Measured, *, quick: bool = False) -> str:
    """The benchmark's Markdown section (between its markers)."""
    o, m0, m1 = meas.o, meas.machine_start, meas.machine_end
    lo, hi = RATIO_UNITS
    lines = [
        _MARK_BEGIN,
        "## Store host cost by units per image (`python -m pagedstate.models.bench.units`)",
        "",
        f"Measured {meas.date} on {m0['platform']} ({m0['machine']}), {m0['cpu_count']} CPUs,"
        f" Python {m0['python']}; load average {m0['load_avg']} at the start,"
        f" {m1['load_avg']} at the end; one run of {meas.wall_s:.0f} s"
        + (" (quick mode)" if quick else "")
        + f". Implementation: `{o.impl}`"
        + (f" ({meas.provenance})" if meas.provenance else "")
        + ".",
        "",
        "Workload: an engine-like loop (SPEC D.1 order, docs/integration.md) of R running"
        " requests, one state slot each. Every pass: `complete_previous_batch()`; admission of"
        " the requests that finished last pass, each looking up the newest image of another"
        " request (`contains`) and queueing its restore into its slot (`begin_restore(h, slot,"
        " seq=)`); the drain `take_checkpoint_ops()`, which begins one image store for every"
        " boundary filed last pass (evicting the least recently used unpinned images to make"
        " room) and hands out the restores; then every request files one boundary"
        f" (`checkpoint`, a new prefix hash each time) except one in {o.restore_every} (by"
        " slot, rotating), which finishes instead (`forget_pending`) and whose slot the next"
        " pass refills. Pool: R x U x"
        f" {o.images_per_slot} units for images plus R x {o.kv_units} units of live KV, so"
        " that in steady state it is full and each pass evicts about a pass's images.",
        "",
        "- **fresh**: the live KV is reserved first (the lowest ids) and never moves; the pool"
        " holds nothing but checkpoint images and those reservations.",
        f"- **fragmented**: before anything else the whole pool is reserved in blocks of"
        f" {o.frag_block} units; every other block (the 1st, 3rd, ...) is released into the"
        " KV prefix cache (`cache_units`, a distinct prefix hash per unit), the others vacant;"
        " then the live KV is reserved (from the vacant blocks). Reservations take vacant"
        " units lowest id first, so images are built from broken-up vacant extents, then"
        " cached units in LRU order, firing `on_evict`, wired to `coordinator.unindex`. A"
        " request that finishes puts its KV units into the prefix cache (`pool.cache_units`,"
        " new hashes) and its successor reserves new ones (`ensure_free_units`, then"
        " `pool.reserve_units`), so cached units stay interleaved with the images in steady"
        " state.",
        "",
        "How it is measured: `time.perf_counter_ns` just before and after every coordinator"
        " call (the store calls) and, apart, every engine KV call on the pool"
        " (`pool.reserve_units`, `pool.cache_units`: the engine KV column, not in the store"
        " figures; the `on_evict` callbacks they fire run there). The driver's bookkeeping is"
        " outside the timed intervals; the garbage collector is off from the end of the"
        " first set-up of a (pool, R). Every U of a (pool, R) is set up and warmed up"
        f" ({o.warmup} passes), then {o.repeat} repeats of {o.passes} passes run interleaved"
        " (the first repeat of every U, then the second, ...), so that a busy spell of the"
        " machine falls on every U alike; figures are paired call by call (below). A timed"
        " no-op costs"
        f" {meas.floor_ns:.0f} ns here, included in every call's figure, not subtracted."
        " µs per image op = store time / (images stored + restored + released); runs/image:"
        " runs of consecutive unit ids per image stored (the fragmentation the images got).",
        "",
        "| pool | running R | units per image U | pool units | store calls/pass | stored/pass"
        " | restored/pass | released/pass | on_evict/pass | runs/image | µs/store call"
        " | µs/image op | store ms/pass | median repeat, ms/pass | engine KV µs/pass |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in meas.cells:
        p = c.passes
        lines.append(
            f"| {c.pool} | {c.running:,} | {_label(c.units)} | {c.pool_units:,} |"
            f" {c.store_calls / p:,.0f} | {c.stored / p:,.0f} | {c.restored / p:,.0f} |"
            f" {c.released / p:,.0f} | {c.on_evict / p:,.0f} | {c.runs_per_image:.1f} |"
            f" {_fmt(c.us_per_call)} | {_fmt(c.us_per_image_op)} | {c.ms_per_pass:,.3f} |"
            f" {c.median_repeat_ms_per_pass:,.3f} | {_fmt(c.kv_ns / 1000.0 / p)} |"
        )
    unpaired = [c for c in meas.cells if not c.paired]
    lines += [
        "",
        "Every figure but the median repeat's is paired call by call: the repeats made the"
        " same calls in the same order, and each call counts at its fastest repeat"
        " (removing time it spent preempted while another program had the CPU)."
        if not unpaired
        else "Paired call by call (each call at its fastest repeat) except in "
        + ", ".join(f"{c.pool} R={c.running} U={c.units}" for c in unpaired)
        + ", whose repeats made different calls: there the fastest repeat stands whole.",
    ]
    problems = [(c, e) for c in meas.cells for e in c.errors]
    if problems:
        lines += ["", "Problems seen:", ""]
        lines += [f"- {c.pool} R={c.running} U={c.units}: {e}" for c, e in problems]
    ratios = ratio_rows(meas)
    lines += [
        "",
        f"### Growth with the image: {hi} units against {lo}",
        "",
        f"| pool | running R | µs/image op @{lo} | µs/image op @{hi} | @{hi} / @{lo} | target"
        " | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in ratios:
        lines.append(
            f"| {r['pool']} | {r['running']:,} | {_fmt(r['lo'])} | {_fmt(r['hi'])} |"
            f" {r['ratio']:.2f} | <= {r['target']:g} | {_verdict(r['met'])} |"
        )
    if not ratios:
        lines.append(f"| - | - | - | - | - | - | not run (needs U={lo} and U={hi}) |")
    # per method, at one R, both pools: which calls grow with U
    per_R = PASS_TARGET_AT[0] if PASS_TARGET_AT[0] in o.running else o.running[len(o.running) // 2]
    us = list(o.units)
    growth = lo in us and hi in us
    for pool in o.pools:
        cells = [_find(meas, pool, per_R, U) for U in us]
        if any(c is None for c in cells):
            continue
        got = [c for c in cells if c is not None]
        methods = STORE_METHODS + (KV_METHODS if pool == "fragmented" else ())
        lines += [
            "",
            f"### Per call, {pool} pool, {per_R:,} running requests (µs per call)",
            "",
            "| method | calls/pass |"
            + "".join(f" U={U} |" for U in us)
            + (f" @{hi} / @{lo} |" if growth else ""),
            "|---|---:|" + "---:|" * len(us) + ("---:|" if growth else ""),
        ]
        for m in methods:
            row = f"| `{m}` | {got[-1].timings[m][1] / got[-1].passes:,.1f} |"
            row += "".join(f" {_fmt(c.us_of(m))} |" for c in got)
            if growth:
                a = got[us.index(lo)].us_of(m)
                b = got[us.index(hi)].us_of(m)
                row += f" {b / a:.1f} |" if a and b else " - |"
            lines.append(row)
    lines += ["", "### Targets", ""]
    lines.append(
        f"Printed, never enforced (measured, not timed): µs per image op at {hi} units at"
        f" most {TARGET_RATIO['fresh']:g}x its cost at {lo} units on the fresh pool and"
        f" {TARGET_RATIO['fragmented']:g}x on the fragmented pool (at every R run); store"
        f" host time per pass at most {TARGET_PASS_MS:g} ms at R={PASS_TARGET_AT[0]},"
        f" U={PASS_TARGET_AT[1]} (Qwen3-Next, 16-token pages)."
    )
    lines.append("")
    for pool in o.pools:
        rs = [r for r in ratios if r["pool"] == pool]
        if rs:
            worst = max(rs, key=lambda r: r["ratio"])
            ok = all(r["met"] for r in rs)
            lines.append(
                f"- {pool} pool, µs per image op @{hi} / @{lo} <= {worst['target']:g}:"
                f" **{_verdict(ok)}** (worst {worst['ratio']:.2f} at R={worst['running']:,};"
                " " + ", ".join(f"R={r['running']:,}: {r['ratio']:.2f}" for r in rs) + ")"
            )
        else:
            lines.append(f"- {pool} pool, µs per image op @{hi} / @{lo}: not run")
    R_t, U_t = PASS_TARGET_AT
    for pool in o.pools:
        at = _find(meas, pool, R_t, U_t)
        if at is None:
            lines.append(f"- {pool} pool, store ms per pass at R={R_t}, U={U_t}: not run")
        else:
            lines.append(
                f"- {pool} pool, store host time per pass at R={R_t}, U={U_t} <="
                f" {TARGET_PASS_MS:g} ms: **{_verdict(at.ms_per_pass <= TARGET_PASS_MS)}**"
                f" ({at.ms_per_pass:.3f} ms)"
            )
    lines += ["", _MARK_END]
    return "\n".join(lines)


def _split_markers(text: str) -> tuple[str, str] | None:
    """``(head, tail)`` around this benchmark's section of ``text``, or None when the file
    has none.

    Raises:
        ValueError: the markers are not one begin marker followed by one end marker.
    """
    nb, ne = text.count(_MARK_BEGIN), text.count(_MARK_END)
    if nb == ne == 0:
        return None
    if nb != 1 or ne != 1 or text.index(_MARK_BEGIN) > text.index(_MARK_END):
        raise ValueError(
            f"expected one {_MARK_BEGIN} followed by one {_MARK_END}; found {nb} begin and"
            f" {ne} end marker(s){' in the wrong order' if nb == ne == 1 else ''}"
        )
    head, rest = text.split(_MARK_BEGIN, 1)
    _, tail = rest.split(_MARK_END, 1)
    return head, tail


def write_section(out: Path, text: str) -> None:
    """Replace this benchmark's section of ``out`` with ``text`` (appended when the file has
    none; a missing file is created with a ``# Benchmarks`` title). Other sections are left
    as they are.

    Raises:
        ValueError: the file's markers are out of order or repeat (nothing written).
    """
    old = out.read_text(encoding="utf-8") if out.exists() else "# Benchmarks\n"
    parts = _split_markers(old)
    if parts is not None:
        new = parts[0] + text + parts[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(new, encoding="utf-8")


def write_json(path: Path, meas: Measured) -> None:
    """The raw figures: options, machine, and every cell with its derived figures."""
    doc = {
        "benchmark": "bench-units",
        "date": meas.date,
        "impl": meas.o.impl,
        "provenance": meas.provenance,
        "options": asdict(meas.o),
        "machine_start": meas.machine_start,
        "machine_end": meas.machine_end,
        "timer_floor_ns": meas.floor_ns,
        "wall_s": meas.wall_s,
        "cells": [c.figures() for c in meas.cells],
        "ratios": ratio_rows(meas),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
