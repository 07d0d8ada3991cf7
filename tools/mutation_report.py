"""Summarize a mutmut run per module (docs/mutation.md).

Run inside the staged copy after `mutmut run`. Reads mutants/**/*.py.meta and prints, per
module, the number of mutants considered (all, or those named with --names), killed,
survived, timeout, no tests and not checked, the kill rate (killed + timeout over checked),
and the surviving mutants' names.

usage: python tools/mutation_report.py [--names NAME ...]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code


def main(argv: list[str]) -> int:
    wanted = set(argv[1:]) if argv[:1] == ["--names"] else None
    survivors: list[str] = []
    for meta in sorted(Path("mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        counts: Counter[str] = Counter()
        for name, code in codes.items():
            if wanted is not None and name not in wanted:
                continue
            status = status_by_exit_code[code]
            counts[status] += 1
            if status == "survived":
                survivors.append(name)
        if not counts:
            continue
        total = sum(counts.values())
        dead = counts["killed"] + counts["timeout"]
        checked = total - counts["not checked"]
        rate = f"{100 * dead / checked:.1f}%" if checked else "n/a"
        module = str(meta)[len("mutants/src/"):-len(".py.meta")]
        print(f"{module}: {total} mutants, {counts['killed']} killed,"
              f" {counts['survived']} survived,"
              f" {counts['timeout']} timeout, {counts['no tests']} no tests,"
              f" {counts['not checked']} not checked; killed {rate}"
              + "".join(f", {n} {s}" for s, n in sorted(counts.items()) if s not in {
                  "killed", "survived", "timeout", "no tests", "not checked"}))
    for name in survivors:
        print("survived:", name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
