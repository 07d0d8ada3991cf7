"""The store benchmark's report: the Markdown section of one run (:func:`section`) and its
place between the markers of ``docs/benchmarks.md`` (:func:`_write`)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from pagedstate.models.replay.engine import UNINDEX_MISS, EngineResult

from .measure import (
    _NOT_STORE_OPS,
    Measured,
    _fixed_mix_us,
    _fixed_work_ratio,
    _peak_rss_mib,
    _same_calls,
    _store_calls,
    _store_ns,
    _us,
    _work,
)
from .targets import target_lines

_MARK_BEGIN = "<!-- bench-trace:begin -->"
_MARK_END = "<!-- bench-trace:end -->"


def _locality_verdict(sf: float, ss: float, df: float, ds: float) -> str:
    """What the locality control shows, from the growth (higher level / lower level) of the
    store's ``unindex`` and of a plain ``dict.pop``, in filing (``sf``, ``df``) and shuffled
    (``ss``, ``ds``) order. The store is suspect only when it grows more than 15% beyond the
    plain dict in either order."""
    if sf > 1.15 * df or ss > 1.15 * ds:
        return (
            "In this run the store grows more than 15% beyond the plain dict: look for per-call"
            " work that scales with the number of records."
        )
    if sf < ss and abs(ss - ds) <= 0.15 * ds:
        return (
            "The store grows less in filing order than shuffled, and shuffled about as"
            " much as the plain dict (within 15%): in this run the growth follows the"
            " memory hierarchy (objects spread over more cache lines and pages), not"
            " per-call work that scales with the number of records."
        )
    return (
        "In this run the store grows no more than 15% beyond the plain dict in either order:"
        " no sign of per-call work that scales with the number of records."
    )


def _fmt(x: float) -> str:
    return f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def _contended(r: EngineResult) -> str:
    return f"{r.wall_s:.1f} s ({r.cpu_s / r.wall_s:.0%} CPU)" if r.wall_s > 0 else "-"


def section(meas: Measured, *, quick: bool = False) -> str:
    """The benchmark's Markdown section of the runs ``meas`` (between its markers)."""
    o, stand_in, trace, conc, grown, full, rec_runs = (
        meas.o,
        meas.stand_in,
        meas.trace,
        meas.conc,
        meas.grown,
        meas.full,
        meas.rec_runs,
    )
    prod_label, lo_conc, hi_conc = meas.prod_label, meas.lo_conc, meas.hi_conc
    prod_from, ref_from, floor, one_pool = meas.prod_from, meas.ref_from, meas.floor, meas.one_pool
    locality = meas.locality
    lines = [
        _MARK_BEGIN,
        "## Store calls on a replayed trace (`make bench`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()},"
        f" {os.cpu_count()} cores, Python {platform.python_version()}, in one run"
        + (" (quick mode)" if quick else "")
        + f". Production: `{prod_label}`"
        + (f" ({prod_from})" if prod_from else "")
        + f"; reference: `{o.ref}`"
        + (f" ({ref_from})" if ref_from else "")
        + ".",
        "",
    ]
    if stand_in is not None:
        lines += [
            f"**No production store was measured**: {stand_in}. The reference stood in for"
            " it, so the production columns repeat the reference and no target is judged.",
            "",
        ]
    lines += [
        f"Workload: the first {len(trace):,} requests of `{o.trace.name}`, all arriving at"
        f" once; the engine model of `pagedstate.models.replay.engine` (admission with"
        f" `resumable_hit` and `begin_restore`, chunked prefill of {o.chunk_blocks} blocks"
        f" filing a checkpoint at every chunk end, KV units reserved per running request,"
        f" one drain and the completions per pass, `unindex` when the KV prefix cache model"
        " drops a hash, timed in two rows: `unindex (orphaned)` when the call dropped a"
        " checkpoint, pending boundary or queued scratch store (the engine counters' orphaned"
        " column) and `unindex (found nothing)` otherwise);"
        f" every level on one pool of {one_pool:,} units"
        + (
            f" ({o.units_per_slot} per slot of the highest level)"
            if one_pool == hi_conc * o.units_per_slot
            else ""
        )
        + ", as an engine on one GPU runs when only the scheduler's limit on running requests"
        f" changes; {o.units_per_checkpoint} units per image, `1024 // concurrency` decode"
        " tokens per request per pass (a pass decodes as many tokens at every level); the"
        " replay stops when nothing is left waiting."
        + (
            " A pool that grows with the slots changes the KV prefix cache, and with it the"
            " call mix, together with the concurrency: those runs are context, further down."
            if grown
            else ""
        ),
        "",
        "How it is measured: `perf_counter_ns` is read just before and after every call"
        " (the bookkeeping comes after the second read); the timer's own floor, measured as"
        f" {floor:.0f} ns per call on a no-op, is included in every figure and not"
        " subtracted. The replay is deterministic, so repeating it repeats every call exactly:"
        f" production figures take, call by call, the fastest of {o.repeat} replays"
        f" ({'one replay' if o.ref_repeat == 1 else f'{o.ref_repeat} replays'} for the"
        " reference), which removes the time a call spent preempted when another program had"
        " the CPU; the first replay's plain mean is shown beside it. Overall figures are over"
        " store calls: every coordinator and pool call except `pool.num_free`, a property the"
        " engine model reads for its own KV-cache bookkeeping (listed per method). Wall time"
        " is the first replay's, with the share of it this process spent on a CPU (below 100%"
        " means the machine was shared and plain means are inflated).",
        "",
        "### Overall, by concurrency",
        "",
        f"| running requests | peak running | pool units | requests completed | store calls"
        " | production"
        f" µs/call (fastest of"
        f" {o.repeat}) | production, one replay | reference µs/call | reference / production"
        " (one replay each) | production wall | reference wall | same calls |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c, (p, r) in conc.items():
        pp, rp = p.extra["plain_us"], r.extra["plain_us"]
        lines.append(
            f"| {c:,} | {p.counters['peak_running']:,} | {p.config.pool_units:,} |"
            f" {p.counters['completed']:,} |"
            f" {_store_calls(p):,} | {_fmt(_us(p))} |"
            f" {_fmt(pp)} | {_fmt(_us(r))} | {rp / pp if pp else 0.0:,.1f}x |"
            f" {_contended(p)} | {_contended(r)} | {'yes' if _same_calls(p, r) else 'no'} |"
        )
    lines += [
        "",
        '"Same calls": production and reference made the same number of calls of every'
        " method, the engine counted the same hits, restores and unindexes, and the"
        " checkpoint fates agree. Every replay stops when nothing is left waiting, so the"
        " levels complete different numbers of requests"
        + (" (the same requests served to the end are further down)" if full else "")
        + ': what the levels compare is the cost per call. "Peak running": the most'
        " requests that ran at once; a level the pool cannot hold is not reached, and no"
        " target is judged on it.",
        "",
        "### Per method (µs per call; calls from the production run)",
        "",
        f"prod: the fastest of {o.repeat} replays per call; ref: "
        + ("one replay." if o.ref_repeat == 1 else f"the fastest of {o.ref_repeat}.")
        + " `coordinator.unindex` has two rows, by outcome: `unindex (orphaned)`, a call that"
        " dropped something (a checkpoint, pending boundaries, queued scratch stores), and"
        " `unindex (found nothing)`, the many calls for evicted prefixes that had none.",
        "",
    ]
    methods = sorted({m for p, r in conc.values() for m in (*p.timings, *r.timings)})
    lo_c, hi_c = min(conc), max(conc)
    growth = lo_c != hi_c
    head = "| method |" + "".join(f" calls @{c} | prod @{c} | ref @{c} |" for c in conc)
    head += f" prod @{hi_c} / @{lo_c} |" if growth else ""
    lines += [head, "|---|" + "---:|---:|---:|" * len(conc) + ("---:|" if growth else "")]
    for m in methods:
        row = f"| `{m}` |"
        for p, r in conc.values():
            n = p.timings.get(m, [0, 0])[1]
            row += (
                f" {n:,} | {_fmt(_us(p, m)) if m in p.timings else '-'} |"
                f" {_fmt(_us(r, m)) if m in r.timings else '-'} |"
            )
        if growth:
            a, b = conc[lo_c][0], conc[hi_c][0]
            ok = m in a.timings and m in b.timings and _us(a, m) > 0
            row += f" {_us(b, m) / _us(a, m):.2f} |" if ok else " - |"
        lines.append(row)
    lines += [
        "",
        "The pool is the same at every level, but a call's work still moves with the"
        " concurrency: a drain or a completion handles as many ops as the pass filed, and"
        " more running requests file more per pass (the per-unit-of-work table below); the"
        " live-records runs further down repeat one identical call sequence and isolate how"
        " the store scales with what it holds.",
        "",
        "### Per unit of work (production)",
        "",
        "A call's work is one unit plus: for `pool.reserve_units` / `pool.release_units`,"
        " the units beyond the first; for `take_checkpoint_ops`, the ops it returns and the"
        " records it evicts; for `complete_previous_batch`, the ops of the batch it"
        " completes; for `ensure_free_units`, the records it evicts; for `unindex (orphaned)`,"
        " one more (what it dropped). The engine credits it after the call, outside the"
        " timed region. µs per unit of work, and units of work per call:",
        "",
    ]
    head = "| method |" + "".join(f" work/call @{c} | µs/work @{c} |" for c in conc)
    head += f" µs/work @{hi_c} / @{lo_c} |" if growth else ""
    lines += [head, "|---|" + "---:|---:|" * len(conc) + ("---:|" if growth else "")]
    for m in methods:
        if m in _NOT_STORE_OPS:
            continue
        row = f"| `{m}` |"
        for p, _r in conc.values():
            if m in p.timings and _work(p, m):
                ns, n = p.timings[m]
                row += f" {_work(p, m) / n:.2f} | {_fmt(ns / _work(p, m) / 1000)} |"
            else:
                row += " - | - |"
        if growth:
            a, b = conc[lo_c][0], conc[hi_c][0]
            if m in a.timings and m in b.timings and _work(a, m) and _work(b, m):
                ca = a.timings[m][0] / _work(a, m)
                cb = b.timings[m][0] / _work(b, m)
                row += f" {cb / ca:.2f} |" if ca else " - |"
            else:
                row += " - |"
        lines.append(row)
    lines += [
        "",
        "### Engine counters (production, one pool)",
        "",
        "| running requests | passes | admitted | completed | KV hits | resumable hits"
        " (restores) | blocks resumed | checkpoints filed | kept | dropped | evicted | orphaned"
        " | unindex calls |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, (p, _r) in conc.items():
        cn, f = p.counters, p.fates
        lines.append(
            f"| {c:,} | {cn['passes']:,} | {cn['admitted']:,} | {cn['completed']:,} |"
            f" {cn['kv_hits']:,} | {cn['restores']:,} | {cn['hit_blocks']:,} |"
            f" {cn['checkpoints_filed']:,} | {f['checkpoints_kept']:,} |"
            f" {f['checkpoints_dropped']:,} | {f['checkpoints_evicted']:,} |"
            f" {f['checkpoints_orphaned']:,} | {cn['unindexed']:,} |"
        )
    if grown:
        gl, gh = grown[lo_conc], grown[hi_conc]
        g_ratio = _us(gh) / _us(gl) if _us(gl) else 0.0
        g_mix = _fixed_mix_us(gh, gl) / _us(gl) if _us(gl) else 0.0
        g_work = _fixed_work_ratio(gh, gl)
        lines += [
            "",
            "### When the pool grows with the slots (production)",
            "",
            f"The same replay with a pool of {o.units_per_slot} units per slot at every level,"
            " so the pool (and the KV prefix cache in it) grows with the concurrency. A"
            " smaller pool drops more prefixes, nearly all through cheap `unindex (found"
            " nothing)` calls, and those pull the mean per call down: the levels make"
            " different calls, so their mean per call compares call mixes as much as the"
            f" store. Fastest of {o.repeat} replays call by call. Context, not a target:",
            "",
            "| running requests | pool units | store calls | `unindex (found nothing)` calls |"
            " µs/call | one replay | completed |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c, gr in grown.items():
            misses = gr.timings.get(UNINDEX_MISS, [0, 0])[1]
            lines.append(
                f"| {c:,} | {gr.config.pool_units:,} | {_store_calls(gr):,} | {misses:,} |"
                f" {_fmt(_us(gr))} | {_fmt(gr.extra['plain_us'])} |"
                f" {gr.counters['completed']:,} |"
            )
        lines += [
            "",
            f"Per method (calls, µs per call) at {lo_conc:,} and {hi_conc:,} running requests:",
            "",
            f"| method | calls @{lo_conc} | µs @{lo_conc} | calls @{hi_conc} | µs @{hi_conc} |"
            f" µs @{hi_conc} / @{lo_conc} |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for m in sorted({*gl.timings, *gh.timings}):
            cells = ""
            for gr in (gl, gh):
                if m in gr.timings:
                    cells += f" {gr.timings[m][1]:,} | {_fmt(_us(gr, m))} |"
                else:
                    cells += " 0 | - |"
            ok = m in gl.timings and m in gh.timings and _us(gl, m) > 0
            cells += f" {_us(gh, m) / _us(gl, m):.2f} |" if ok else " - |"
            lines.append(f"| `{m}` |" + cells)
        lines += [
            "",
            f"µs per call with the pool grown with the slots, {hi_conc:,} / {lo_conc:,} running"
            f" requests: {g_ratio:.2f}; with the {hi_conc:,} run's per-method costs weighted"
            f" by the {lo_conc:,} run's call counts: {g_mix:.2f};"
            f" per unit of work, over the {lo_conc:,} run's work mix: {g_work:.2f}.",
        ]
    lines += [
        "",
        "### Locality control (production)",
        "",
    ]
    if locality:
        lc, hc = lo_conc, hi_conc
        lines += [
            "Why a method's cost per call can grow with the store's size although no call"
            " walks the records: a larger working set is slower to reach on this machine. The"
            " same"
            f" operation, an `unindex` that releases a READY record, in stores sized like the"
            f" grown-pool {lc} and {hc} runs ({8 * lc:,} and {8 * hc:,} records filed through"
            " `checkpoint`, the drain and the completion), with the records touched in"
            " filing order and in a shuffled order; and, without any store, a plain"
            " `dict.pop` plus one attribute read over as many small objects in the same two"
            " orders. Median ns per operation, the fastest of 3 builds; each figure includes"
            " the timer floor above. Context for the per-method growth in the grown-pool"
            " runs, not a target:",
            "",
            f"| order | store `unindex` @{lc} | @{hc} | @{hc} / @{lc} | plain `dict.pop`"
            f" @{lc} | @{hc} | @{hc} / @{lc} |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for order in ("filing", "shuffled"):
            s0, s1 = locality[lc][f"store {order}"], locality[hc][f"store {order}"]
            d0, d1 = locality[lc][f"dict {order}"], locality[hc][f"dict {order}"]
            lines.append(
                f"| {order} | {s0:,.0f} | {s1:,.0f} | {s1 / s0:.2f} | {d0:,.0f} | {d1:,.0f} |"
                f" {d1 / d0:.2f} |"
            )
        sf = locality[hc]["store filing"] / locality[lc]["store filing"]
        ss = locality[hc]["store shuffled"] / locality[lc]["store shuffled"]
        df = locality[hc]["dict filing"] / locality[lc]["dict filing"]
        ds = locality[hc]["dict shuffled"] / locality[lc]["dict shuffled"]
        lines += ["", _locality_verdict(sf, ss, df, ds)]
    else:
        lines.append("Not run (one concurrency level, or no production store).")
    if full:
        lines += [
            "",
            "### The same requests, served to the end (production)",
            "",
            "The grown-pool runs above stop when nothing is left waiting, so they serve"
            " different requests at each concurrency, and their call mix differs (a smaller"
            " pool drops more KV prefixes, most of which have no checkpoint: many cheap"
            " `unindex (found nothing)` calls). Here, on the same grown pools, the replay goes"
            " on until every request is done at the lowest and the highest concurrency, so"
            " both runs serve the same requests unless the pool rejected some (the requests"
            " served column); store time is the sum of the timed store calls (fastest of"
            f" {o.repeat} replays, call by call). Context, not a target:",
            "",
            "| running requests | requests served | store calls | calls per request |"
            " µs/call | store ms | store µs per request |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        per_req: dict[int, float] = {}
        for c, fr in full.items():
            calls = _store_calls(fr)
            total_ns = _store_ns(fr)
            served = fr.counters["completed"]
            per_req[c] = total_ns / 1000.0 / served if served else 0.0
            lines.append(
                f"| {c:,} | {served:,} | {calls:,} | {calls / served if served else 0:.1f} |"
                f" {_fmt(_us(fr))} | {total_ns / 1e6:,.1f} | {per_req[c]:,.1f} |"
            )
        lo_r, hi_r = per_req[lo_conc], per_req[hi_conc]
        lines += [
            "",
            f"Store time per request served, {hi_conc:,} / {lo_conc:,} running requests:"
            f" {hi_r / lo_r if lo_r else 0.0:.2f}; µs per call:"
            f" {_us(full[hi_conc]) / _us(full[lo_conc]) if _us(full[lo_conc]) else 0.0:.2f}.",
        ]
    lines += [
        "",
        f"### Live records ({o.records_concurrency} running requests)",
        "",
        "Before the replay the store is filled with READY records under hashes no request"
        " has (through `checkpoint`, the drain and `complete_previous_batch`, untimed), in a"
        " pool grown by their units. The replay's own part of the pool is"
        f" {o.records_units_per_slot} units per slot, "
        + (
            "chosen so that the replay evicts nothing: then the runs make the same calls"
            ' ("same calls", against the first run of the same implementation) and differ'
            " only in how many records the store holds."
            if all(rr.fates["checkpoints_evicted"] == 0 for _, _, rr in rec_runs)
            else "meant to be enough that the replay evicts nothing; in this run some replays"
            " evicted records (the evicted column), so the runs did not all make the same calls"
            ' ("same calls", against the first run of the same implementation).'
        )
        + " Eviction itself is measured in the concurrency runs above.",
        "",
        "| implementation | live records | store calls | µs/call | evicted | same calls"
        " | populate s | RSS MiB before | RSS MiB populated | replay wall |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    first: dict[str, EngineResult] = {}
    for label, n, rr in rec_runs:
        x = rr.extra
        base = first.setdefault(label, rr)
        lines.append(
            f"| `{label}` | {n:,} | {_store_calls(rr):,} | {_fmt(_us(rr))} |"
            f" {rr.fates['checkpoints_evicted']:,} | {'yes' if _same_calls(base, rr) else 'no'} |"
            f" {x['populate_s']:.1f} | {x['rss_before_mib']:.0f} |"
            f" {x['rss_populated_mib']:.0f} | {_contended(rr)} |"
        )
    if rec_runs:
        lines += ["", "Per method (µs per call):", ""]
        rec_methods = sorted({m for _, _, rr in rec_runs for m in rr.timings})
        lines.append(
            "| method | calls |"
            + "".join(f" `{label.split()[0]}` {n:,} |" for label, n, _ in rec_runs)
        )
        lines.append("|---|---:|" + "---:|" * len(rec_runs))
        for m in rec_methods:
            calls = rec_runs[0][2].timings.get(m, [0, 0])[1]
            lines.append(
                f"| `{m}` | {calls:,} |"
                + "".join(
                    f" {_fmt(_us(rr, m)) if m in rr.timings else '-'} |" for _, _, rr in rec_runs
                )
            )
    lines += ["", f"Peak RSS of the whole run: {_peak_rss_mib():.0f} MiB.", ""]
    lines += target_lines(meas, (g_ratio, g_mix, g_work) if grown else None)
    lines += ["", _MARK_END]
    return "\n".join(lines)


def _split_markers(text: str) -> tuple[str, str] | None:
    """``(head, tail)`` around this benchmark's section of ``text``, or None when the file
    has no section yet.

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


def _write(out: Path, section: str) -> None:
    old = out.read_text(encoding="utf-8") if out.exists() else "# Benchmarks\n"
    parts = _split_markers(old)
    if parts is not None:
        new = parts[0] + section + parts[1]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(new, encoding="utf-8")
