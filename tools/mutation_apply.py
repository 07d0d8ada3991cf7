"""Apply one mutmut mutant to a plain staged copy, outside mutmut
(docs/mutation.md): a check that mutmut's verdict is real, by running the tests on the
mutated source with no trampolines in the way.

`mutmut show NAME` prints a diff of the mutated function rendered on its own (class methods
dedented), so it does not apply with `patch`; this finds the removed lines inside the named
function of the staged file and replaces them, re-indented.

usage (in the mutmut staged copy, e.g. build/mutation):
    mutmut show NAME | python tools/mutation_apply.py PLAIN_DIR NAME
(restore the file afterwards from a copy: there is no revert)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    plain, name = Path(argv[0]), argv[1]
    diff = sys.stdin.read().splitlines()
    path = next(line[4:].strip() for line in diff if line.startswith("+++ "))
    body = [line for line in diff if line[:1] in "-+ " and not line.startswith(("---", "+++"))]
    old = [line[1:] for line in body if line[:1] in "- "]
    func = re.sub(r"__mutmut_\d+$", "", name.rsplit(".", 1)[1]).split("ǁ")[-1]
    if func.startswith("x_"):
        func = func[2:]
    target = plain / path
    lines = target.read_text().split("\n")
    start = next(i for i, line in enumerate(lines)
                 if re.match(rf"\s*def {re.escape(func)}\(", line))
    stripped = [line.strip() for line in old]
    for i in range(start, len(lines) - len(old) + 1):
        if [line.strip() for line in lines[i:i + len(old)]] != stripped:
            continue
        out: list[str] = []
        k = i  # the file line that the next " " or "-" line of the diff stands for
        for line in body:
            if line[:1] == "+":
                # indent as the removed line it replaces (docstrings are not dedented)
                ref = lines[k - 1]  # the line just removed (a mutant replaces, never only adds)
                d = line[1:]
                pad = (len(ref) - len(ref.lstrip())) - (len(d) - len(d.lstrip()))
                out.append(" " * max(pad, 0) + d if d.strip() else d)
                continue
            if line[:1] == " ":
                out.append(lines[k])
            k += 1
        lines[i:i + len(old)] = out
        target.write_text("\n".join(lines))
        return 0
    print(f"{name}: removed lines not found in {target}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
