"""Print a deterministic sample of mutmut's mutant names (docs/mutation.md).

Run inside a staged copy after mutmut has generated its mutants (mutants/**/*.meta).
Mutants are taken per module in mutmut's own order (source order, then mutant number);
every K-th one is printed, starting with the first (index 0, K, 2K, ...).

usage: python tools/mutation_sample.py K [MODULE_GLOB ...]
"""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    k = int(argv[0])
    patterns = argv[1:] or ["*"]
    for meta in sorted(Path("mutants").rglob("*.py.meta")):
        names = list(json.loads(meta.read_text())["exit_code_by_key"])
        for i, name in enumerate(names):
            if i % k == 0 and any(fnmatch.fnmatch(name, p) for p in patterns):
                print(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
