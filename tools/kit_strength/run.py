"""How strong is the conformance kit alone? Run it against each bug of :mod:`bugs` planted in
the production store, as an engine runs it (issue 20, "The kit as strong as the suite").

For each bug, a fresh interpreter plants it (nothing on disk changes) and calls
``run_conformance(PagedStateCheckpointCoordinator, pool_factory=UnitPool)`` on the planted
``pagedstate.impl`` classes with ``HYPOTHESIS_PROFILE=ci``, which the kit's
``conformance_settings()`` picks up (Hypothesis's own ``ci`` profile in a process without
this repository's conftest: derandomized, 100 test cases of 50 steps). By default the
shrink (and explain) phases are left out: the run is derandomized, so the first failing
test case, and with it caught or missed, is the engine's; shrinking would only shorten the
printed program, at minutes of CPU per caught bug (``--shrink`` keeps it). A control row
``none`` (no plant) must pass.

    .venv/bin/python tools/kit_strength/run.py                 # the kit alone, every bug
    .venv/bin/python tools/kit_strength/run.py --suite         # also the targeted impl tests
    .venv/bin/python tools/kit_strength/run.py --bugs a,b --timeout 120
    .venv/bin/python tools/kit_strength/run.py --scenarios     # the hand-written scenarios
    .venv/bin/python tools/kit_strength/run.py --list
    .venv/bin/python tools/kit_strength/run.py --set fresh     # the fresh set (bugs_fresh)

``--set`` picks the bug module: ``original`` (:mod:`bugs`, the default) or ``fresh``
(:mod:`bugs_fresh`, written after the kit was tuned on the first and kept out of every test
and of the kit's tuning). The choice goes to every subprocess: ``--set`` for the kit and
scenario workers, ``KIT_STRENGTH_SET`` for the pytest plugin.

``--suite`` runs ``tests/test_impl_lockstep.py``, ``tests/test_impl_exhaustive.py -k "not
slow"`` and ``tests/test_impl_self_check.py`` with the same plant, through the pytest plugin
``plant_plugin`` (``KIT_STRENGTH_BUG=<name>``), and says which files fail. One subprocess at
a time (the machine is shared). Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import importlib  # noqa: E402
import types  # noqa: E402

import bugs  # noqa: E402

#: ``--set`` -> the module holding that set's ``BUGS``, ``SCENARIOS``, ``by_name``, ``check``
#: and ``plant`` (imported from this folder).
BUG_SETS = {"original": "bugs", "fresh": "bugs_fresh"}
#: The set in use (``--set``; the plugin reads ``KIT_STRENGTH_SET``).
_set_name = "original"


def _use_set(name: str) -> types.ModuleType:
    """Make ``name``'s module the one every function here uses (as ``bugs``)."""
    global bugs, _set_name
    bugs = importlib.import_module(BUG_SETS[name])
    _set_name = name
    return bugs


SUITE_FILES = (
    "tests/test_impl_lockstep.py",
    "tests/test_impl_exhaustive.py",
    "tests/test_impl_self_check.py",
)
_MARK = "KIT_STRENGTH_RESULT "


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- worker: one kit run in this process ------------------------------------------------------


def _worker(name: str, shrink: bool, examples: int | None, exhaustive: bool = False) -> None:
    if name != "none":
        bugs.plant(bugs.by_name(name))
    from hypothesis import Phase, settings

    from pagedstate import impl as I
    from pagedstate.engines.conformance import conformance_settings, run_conformance

    base = conformance_settings()  # HYPOTHESIS_PROFILE=ci
    phases = (
        tuple(base.phases)
        if shrink
        else tuple(p for p in base.phases if p not in (Phase.shrink, Phase.explain))
    )
    kw: dict[str, Any] = {"phases": phases}
    if examples is not None:
        kw["max_examples"] = examples
    used = settings(base, **kw)
    cases = [0]

    def pool_factory(num_units: int) -> Any:
        # the planted production pool, counted: one per test case the kit runs (the count
        # is a little above the test cases, as Hypothesis also runs a few it discards)
        cases[0] += 1
        return I.UnitPool(num_units)

    t0 = time.perf_counter()
    result: dict[str, Any] = {"bug": name, "profile": os.environ.get("HYPOTHESIS_PROFILE")}
    result["max_examples"] = used.max_examples
    result["steps"] = used.stateful_step_count
    try:
        report = run_conformance(
            I.PagedStateCheckpointCoordinator, pool_factory=pool_factory, settings=used
        )
    except BaseException as exc:  # the engine's test fails: the kit caught it
        text = str(exc).strip() or type(exc).__name__
        result.update(
            caught=True,
            error=type(exc).__name__,
            first_line=text.splitlines()[0][:400],
            message=text[:4000],
        )
    else:
        result.update(
            caught=False, rows_hit=len(report.rows_hit), rows_missed=sorted(report.rows_missed)
        )
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["test_cases"] = cases[0]
    result["caught_by"] = "random" if result["caught"] else None
    if exhaustive and not result["caught"]:
        # The kit's exhaustive mode after the random run, as an engine's CI would run both.
        from pagedstate.engines.conformance import run_exhaustive_plan

        t1 = time.perf_counter()
        try:
            reports = run_exhaustive_plan(I.PagedStateCheckpointCoordinator, I.UnitPool)
        except AssertionError as exc:
            text = str(exc).strip()
            result.update(
                caught=True,
                caught_by="exhaustive",
                error=type(exc).__name__,
                first_line=text.splitlines()[0][:400],
                message=text[:4000],
            )
        else:
            result["exhaustive_states"] = sum(r.distinct for r in reports)
        result["exhaustive_seconds"] = round(time.perf_counter() - t1, 1)
    print(_MARK + json.dumps(result), flush=True)


# -- parent: one subprocess per bug ------------------------------------------------------------


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(
    cmd: list[str], env: dict[str, str], timeout: float
) -> tuple[subprocess.CompletedProcess[str] | None, float, float]:
    """Run ``cmd`` (output captured); the process (None: it timed out), and its wall and
    CPU seconds."""
    t0, c0 = time.perf_counter(), _cpu_children()
    try:
        proc: subprocess.CompletedProcess[str] | None = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        proc = None
    return proc, round(time.perf_counter() - t0, 1), round(_cpu_children() - c0, 1)


def _kit(
    name: str, timeout: float, shrink: bool, examples: int | None, exhaustive: bool = False
) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--set", _set_name, "--worker", name]
    if shrink:
        cmd.append("--shrink")
    if exhaustive:
        cmd.append("--exhaustive")
    if examples is not None:
        cmd += ["--examples", str(examples)]
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci")
    proc, wall, cpu = _timed(cmd, env, timeout)
    if proc is None:
        return {
            "bug": name,
            "caught": None,
            "first_line": f"timed out after {timeout:.0f} s",
            "wall": wall,
            "cpu": cpu,
        }
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            out: dict[str, Any] = json.loads(line[len(_MARK) :])
            out.update(wall=wall, cpu=cpu)
            return out
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {
        "bug": name,
        "caught": None,
        "first_line": f"worker failed (rc {proc.returncode}): {tail[0][:300]}",
        "wall": wall,
        "cpu": cpu,
    }


_FAILED = re.compile(r"^(FAILED|ERROR) (tests/[^:\s]+)(::\S+)?")
_SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|deselected)")


def _suite(name: str, timeout: float) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "plant_plugin",
        "-rfE",
        *SUITE_FILES,
        "-k",
        "not slow",
    ]
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci", KIT_STRENGTH_BUG=name)
    env["KIT_STRENGTH_SET"] = _set_name
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    proc, wall, cpu = _timed(cmd, env, timeout)
    if proc is None:
        return {
            "bug": name,
            "caught": None,
            "files": {},
            "summary": f"timed out ({timeout:.0f} s)",
            "wall": wall,
            "cpu": cpu,
        }
    files: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        m = _FAILED.match(line)
        if m:
            files.setdefault(Path(m.group(2)).name, []).append((m.group(3) or "")[2:])
    last = [ln for ln in proc.stdout.strip().splitlines() if _SUMMARY.search(ln)]
    summary = last[-1].strip("= ") if last else f"rc {proc.returncode}"
    return {
        "bug": name,
        "caught": proc.returncode != 0,
        "files": files,
        "summary": summary,
        "rc": proc.returncode,
        "wall": wall,
        "cpu": cpu,
    }


def _scenario(name: str) -> None:
    """Worker: run ``name``'s scenario with the plant, then report."""
    fn = bugs.SCENARIOS[name]
    planted = os.environ.get("KIT_STRENGTH_PLANT", "1") == "1"
    if planted:
        bugs.plant(bugs.by_name(name))
    diff = fn()
    print(_MARK + json.dumps({"bug": name, "planted": planted, "diff": diff}), flush=True)


def _run_scenarios(names: list[str]) -> int:
    bad = 0
    for name in names:
        if name not in bugs.SCENARIOS:
            continue
        got = {}
        for planted in ("0", "1"):
            env = dict(os.environ, KIT_STRENGTH_PLANT=planted)
            proc = subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--set",
                    _set_name,
                    "--scenario",
                    name,
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK)]
            got[planted] = (
                json.loads(lines[-1][len(_MARK) :])["diff"]
                if lines
                else [f"scenario failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"]
            )
        ok = not got["0"] and bool(got["1"])
        bad += not ok
        print(f"{name}: {'observable' if ok else 'NOT SHOWN'}")
        print(f"    without the plant: {got['0'] or 'no difference'}")
        print(f"    with the plant:    {got['1'] or 'no difference'}")
    return 1 if bad else 0


def _table(rows: list[dict[str, Any]], suite: dict[str, dict[str, Any]], kit: bool) -> str:
    yes = {True: "yes", False: "no", None: "?"}
    head = ["bug"]
    if kit:
        head += ["kit", "s (wall)", "pools built"]
    if suite:
        head += ["suite", "s (wall)", "suite files failing (tests)"]
    if kit:
        head.append("kit: first line of the failure")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["bug"]]
        if kit:
            cells += [
                yes[r.get("caught")]
                + (" (exhaustive)" if r.get("caught_by") == "exhaustive" else ""),
                f"{r.get('wall', 0):.1f}",
                str(r.get("test_cases", "-")),
            ]
        if suite:
            s = suite.get(r["bug"], {})
            files = s.get("files", {})
            cells += [
                yes[s.get("caught")] if s else "-",
                f"{s.get('wall', 0):.1f}",
                ", ".join(f"{f} ({len(t)})" for f, t in files.items()) or "-",
            ]
        if kit:
            first = r.get("first_line") or (
                f"passed: {r.get('rows_hit', '?')} rows hit" if r.get("caught") is False else ""
            )
            cells.append(first.replace("|", "\\|")[:160])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--set",
        choices=sorted(BUG_SETS),
        default="original",
        help="which set of planted bugs: original (bugs.py, default) or fresh (bugs_fresh.py)",
    )
    ap.add_argument("--bugs", help="comma-separated bug names (default: all)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per subprocess")
    ap.add_argument("--suite", action="store_true", help="also run the targeted impl tests")
    ap.add_argument("--no-kit", action="store_true", help="skip the kit runs")
    ap.add_argument("--no-control", action="store_true", help="skip the unplanted control row")
    ap.add_argument("--shrink", action="store_true", help="keep Hypothesis's shrink phase")
    ap.add_argument("--examples", type=int, help="override max_examples (default: the profile's)")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--scenarios", action="store_true", help="run the hand-written scenarios")
    ap.add_argument("--list", action="store_true", help="list the bugs")
    ap.add_argument(
        "--exhaustive",
        action="store_true",
        help="when the random run passes, also run the kit's exhaustive mode"
        " (run_exhaustive_plan: minutes per bug it does not catch; raise --timeout)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    _use_set(args.set)

    if args.worker:
        _worker(args.worker, args.shrink, args.examples, args.exhaustive)
        return 0
    if args.scenario:
        _scenario(args.scenario)
        return 0
    names = args.bugs.split(",") if args.bugs else [b.name for b in bugs.BUGS]
    for n in names:
        if n != "none":
            bugs.check(bugs.by_name(n))  # every plant applies (old text found once)
    if args.list:
        for b in bugs.BUGS:
            print(f"{b.name} [{b.kind}] {b.module}:{b.target}\n    {b.what}")
        return 0
    if args.scenarios:
        return _run_scenarios(names)
    if not args.no_control and "none" not in names:
        names = ["none", *names]

    rows: list[dict[str, Any]] = []
    suite: dict[str, dict[str, Any]] = {}
    t_all, c_all = time.perf_counter(), _cpu_children()
    for k, name in enumerate(names, 1):
        if not args.no_kit:
            _progress(f"kit   {k}/{len(names)} {name} ...")
            r = _kit(name, args.timeout, args.shrink, args.examples, args.exhaustive)
            rows.append(r)
            verdict = {True: "CAUGHT", False: "missed", None: "??"}[r.get("caught")]
            _progress(
                f"kit   {k}/{len(names)} {name}: {verdict} in {r.get('wall')} s"
                f" ({r.get('test_cases', '?')} test cases): {r.get('first_line', '')[:120]}"
            )
        else:
            rows.append({"bug": name})
        if args.suite:
            _progress(f"suite {k}/{len(names)} {name} ...")
            s = _suite(name, args.timeout)
            suite[name] = s
            _progress(
                f"suite {k}/{len(names)} {name}: {s['summary']} in {s['wall']} s;"
                f" failing: {', '.join(s['files']) or '-'}"
            )
    print(_table(rows, suite, not args.no_kit))
    planted = [r for r in rows if r["bug"] != "none"]
    if not args.no_kit:
        n_kit = sum(1 for r in planted if r.get("caught"))
        print(
            f"\nkit alone: {n_kit}/{len(planted)} caught"
            + (f" ({100 * n_kit / len(planted):.0f}%)" if planted else "")
        )
        n_exh = sum(1 for r in planted if r.get("caught_by") == "exhaustive")
        if args.exhaustive:
            print(f"  of which by the exhaustive mode (after the random run passed): {n_exh}")
        control = [r for r in rows if r["bug"] == "none"]
        if control:
            ok = control[0].get("caught") is False
            print(f"control (no plant): {'passed' if ok else 'FAILED'}")
    if suite:
        n_suite = sum(1 for n, s in suite.items() if n != "none" and s.get("caught"))
        print(f"targeted suite: {n_suite}/{len([n for n in suite if n != 'none'])} caught")
        for n, s in suite.items():
            if s["files"]:
                for f, tests in s["files"].items():
                    print(f"  {n}: {f}: {', '.join(tests[:3])}{' ...' if len(tests) > 3 else ''}")
    print(
        f"total wall {time.perf_counter() - t_all:.0f} s, CPU of subprocesses"
        f" {_cpu_children() - c_all:.0f} s"
    )
    if args.json:
        out: dict[str, Any] = {"kit": rows, "suite": suite}
        if _set_name != "original":
            out["set"] = _set_name
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
