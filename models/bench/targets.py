"""The targets of the store benchmark and their verdicts (:func:`target_lines`): each
judged only at its own levels, on runs that made store calls and reached their level."""

from __future__ import annotations

from .measure import (
    Measured,
    _fixed_mix_us,
    _fixed_work_ratio,
    _same_calls,
    _store_calls,
    _store_ns,
    _us,
)

#: The store's targets on this benchmark.
TARGET_US_AT_256 = 3.0
TARGET_CONCURRENCY_RATIO = 1.1
TARGET_RECORDS_RATIO = 1.2
#: The levels the ratio targets compare (lower, higher); other levels are not judged.
TARGET_CONCURRENCY_LEVELS = (64, 1024)
TARGET_RECORDS_LEVELS = (1_000, 1_000_000)


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "not met")


def target_lines(meas: Measured, grown_ratios: tuple[float, float, float] | None) -> list[str]:
    """The targets' lines of the section: ``grown_ratios`` are the grown-pool ratios the
    section computed (per call, at the same call mix, per unit of work), None without
    grown-pool runs."""
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
    if grown and grown_ratios is not None:
        gl, gh = grown[lo_conc], grown[hi_conc]
        g_ratio, g_mix, g_work = grown_ratios
    lines: list[str] = []
    judged = stand_in is None
    lines += [
        "### Targets",
        "",
        "The production store has three targets on this benchmark: at most"
        f" {TARGET_US_AT_256:g} µs per store call at 256 running requests; the per-call cost at"
        f" 1,024 running requests at most {TARGET_CONCURRENCY_RATIO:g}x the cost at 64; the"
        f" per-call cost with 10^6 live records at most {TARGET_RECORDS_RATIO:g}x the cost with"
        " 10^3. The concurrency figures are the one-pool runs (the first table): the same"
        " trace and pool at every level, the number of running requests changed. A target"
        " is judged only at its own levels, on runs that made store calls, reached their"
        " level (peak running) and, for the live records, made the same calls. Every other"
        " figure in this section is context.",
        "",
    ]
    ps = {c: p for c, (p, _) in conc.items()}

    def unreached(*levels: int) -> str | None:
        """Why runs at ``levels`` cannot be judged (no calls, or fewer running requests
        than the level), or None."""
        for c in levels:
            if not _store_calls(ps[c]):
                return f"no store calls at {c:,} running requests"
            peak = ps[c].counters["peak_running"]
            if peak < c and len(trace) < c:
                return f"{len(trace):,} requests cannot fill a level of {c:,}"
            if peak < c:
                return (
                    f"the pool of {ps[c].config.pool_units:,} units ran at most {peak:,}"
                    f" requests at once at the level of {c:,}"
                )
        return None

    if 256 in ps:
        v = _us(ps[256])
        why_not = "no production store" if not judged else unreached(256)
        verdict = (
            f"**n/a** ({why_not}; measured: {v:.2f})"
            if why_not
            else f"{v:.2f} (target <= {TARGET_US_AT_256:g}): **{_verdict(v <= TARGET_US_AT_256)}**"
        )
        lines.append(
            f"- Overall µs per call at 256 running requests: {verdict}"
            f" (one replay's plain mean: {ps[256].extra['plain_us']:.2f})."
        )
    else:
        lines.append(
            "- Overall µs per call at 256 running requests: **n/a** (no run at 256 running"
            f" requests; levels run: {', '.join(f'{c:,}' for c in ps)})."
        )
    lo, hi = min(ps), max(ps)
    if lo != hi:
        raw = _us(ps[hi]) / _us(ps[lo]) if _us(ps[lo]) else 0.0
        mixed = _fixed_mix_us(ps[hi], ps[lo]) / _us(ps[lo]) if _us(ps[lo]) else 0.0
        per_work = _fixed_work_ratio(ps[hi], ps[lo])
        # the target compares these two levels; a run at others (--quick) is not judged
        levels = (lo, hi) == TARGET_CONCURRENCY_LEVELS
        why_not = unreached(lo, hi)
        if not judged:
            figure = f"**n/a** (no production store; the reference against itself: {raw:.2f})"
        elif not levels:
            figure = (
                f"**n/a** (the target compares {TARGET_CONCURRENCY_LEVELS[1]:,} with"
                f" {TARGET_CONCURRENCY_LEVELS[0]:,} running requests; at these levels: {raw:.2f})"
            )
        elif why_not:
            figure = f"**n/a** ({why_not}; measured: {raw:.2f})"
        else:
            ok = raw <= TARGET_CONCURRENCY_RATIO
            figure = f"{raw:.2f} (target <= {TARGET_CONCURRENCY_RATIO:g}): **{_verdict(ok)}**"
        lines.append(
            f"- Cost per call at {hi:,} / at {lo:,} running requests, one pool of"
            f" {ps[hi].config.pool_units:,} units: {figure}."
            " Context, not the target: per unit of work, over the"
            f" {lo:,} run's work mix: {per_work:.2f}; with the {hi:,} run's per-method costs"
            f" weighted by the {lo:,} run's call counts (methods, and `unindex` by outcome):"
            f" {mixed:.2f}, a weighting that holds the number of calls but not their work (a"
            f" drain or a completion at {hi:,} handles the ops of more running requests)."
        )
    if full:
        a, b = full[lo_conc], full[hi_conc]
        ta, tb = _store_ns(a), _store_ns(b)
        na, nb = a.counters["completed"], b.counters["completed"]
        if ta and na and nb:
            same = na == nb == len(trace)
            serving = (
                f"serving the same {na:,} requests to the end"
                if same
                else f"serving {na:,} and {nb:,} of {len(trace):,} requests (the others were"
                " rejected: not the same requests)"
            )
            lines.append(
                f"- Context, not the target: on pools grown with the slots ({o.units_per_slot}"
                f" units per slot), {serving}, the store spends {(tb / nb) / (ta / na):.2f}x the"
                f" time per request at {hi_conc:,} running requests as at {lo_conc:,} (per call:"
                f" {_us(b) / _us(a):.2f}x)."
            )
    if grown and _us(gl):
        lines.append(
            f"- Context, not the target: with a pool of {o.units_per_slot} units per slot"
            " at every level (the pool and its KV prefix cache grow with the concurrency, so"
            " the call mix moves with it), the cost per call at"
            f" {hi_conc:,} / at {lo_conc:,} running requests is {g_ratio:.2f}"
            f" (µs per call: {_us(gl):.2f} at {lo_conc:,}, {_us(gh):.2f} at {hi_conc:,});"
            f" at the same call mix: {g_mix:.2f}; per unit of work: {g_work:.2f}."
        )
    prod_recs = [(n, rr) for label, n, rr in rec_runs if label == prod_label and judged]
    if len(prod_recs) >= 2:
        (n0, r0), (n1, r1) = min(prod_recs, key=lambda t: t[0]), max(prod_recs, key=lambda t: t[0])
        raw = _us(r1) / _us(r0) if _us(r0) else 0.0
        levels = (n0, n1) == TARGET_RECORDS_LEVELS
        same = _same_calls(r0, r1) and _store_calls(r0) > 0
        if not levels:
            figure = (
                f"**n/a** (the target compares {TARGET_RECORDS_LEVELS[1]:,} with"
                f" {TARGET_RECORDS_LEVELS[0]:,} live records; at these: {raw:.2f})"
            )
        elif not same:
            figure = f"**n/a** (the two runs did not make the same calls; measured: {raw:.2f})"
        else:
            ok = raw <= TARGET_RECORDS_RATIO
            figure = f"{raw:.2f} (target <= {TARGET_RECORDS_RATIO:g}): **{_verdict(ok)}**"
        lines.append(
            f"- Cost per call with {n1:,} / with {n0:,} live records: {figure}."
            + (
                " The two runs make the same calls, so their call mix is the same already (per"
                f" unit of work: {_fixed_work_ratio(r1, r0):.2f})."
                if same
                else " The two runs made different calls (the live-records table's"
                ' "same calls" column), so the ratio compares different work.'
            )
        )
    elif not judged:
        lines.append(
            "- Cost per call with 10^6 / 10^3 live records: **n/a** (no production store)."
        )
    ref_recs = [(n, rr) for label, n, rr in rec_runs if label == o.ref]
    if len(ref_recs) >= 2:
        (n0, r0), (n1, r1) = ref_recs[0], ref_recs[-1]
        lines.append(
            f"- For comparison, the reference with {n1:,} / {n0:,} live records:"
            f" {_us(r1) / _us(r0) if _us(r0) else 0.0:.2f}."
        )
    return lines
