#!/usr/bin/env bash
# `make mutation`: mutmut over the store and the pool, impl/store.py and impl/pool.py with
# their mixin modules (the [tool.mutmut] only_mutate list; docs/mutation.md).
#
# Stages REV (default HEAD) in MUTATION_DIR with tools/mutation_stage.sh, then runs mutmut
# there with the [tool.mutmut] section of pyproject.toml and the Hypothesis `ci` profile.
# MUTATION_SAMPLE=K runs every K-th mutant per module (tools/mutation_sample.py; K=1, the
# default, runs all of them); MUTATION_JOBS sets mutmut's --max-children.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
venv=$(cd "$root" && realpath "${VENV:-.venv}")  # absolute: the run happens in $dir
dir=${MUTATION_DIR:-$root/build/mutation}
rev=${MUTATION_REV:-HEAD}
k=${MUTATION_SAMPLE:-1}
jobs=${MUTATION_JOBS:-2}
export HYPOTHESIS_PROFILE=ci
"$root/tools/mutation_stage.sh" "$dir" "$rev"
cd "$dir"
names=()
if [ "$k" != 1 ]; then
    # Generate the mutants (and collect which tests reach which function) without running
    # any: a filter that matches nothing stops mutmut right after that step.
    "$venv/bin/mutmut" run --max-children "$jobs" pagedstate.impl.none.x_none__mutmut_1 \
        >/dev/null 2>&1 || true
    mapfile -t names < <("$venv/bin/python" "$root/tools/mutation_sample.py" "$k")
    echo "sample: every ${k}-th mutant, ${#names[@]} mutants"
fi
"$venv/bin/mutmut" run --max-children "$jobs" "${names[@]}"
if [ ${#names[@]} -gt 0 ]; then
    "$venv/bin/python" "$root/tools/mutation_report.py" --names "${names[@]}"
else
    "$venv/bin/python" "$root/tools/mutation_report.py"
fi
