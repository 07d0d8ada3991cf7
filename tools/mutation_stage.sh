#!/usr/bin/env bash
# Stage a mutmut-friendly copy of one commit for mutation testing (see docs/mutation.md).
#
# mutmut 3 derives a mutant's module name from its file path and puts mutants/src
# first on sys.path. The repo maps spec/ models/ impl/ gpu/ engines/ into the namespace
# package `pagedstate` through setuptools package-dir, and the editable install's finder would
# import the *original* impl/ from mutants/. So the copy lays the code out as
# src/pagedstate/{spec,models,impl,gpu,engines} (those the commit has: engines/ is newer):
# `src/pagedstate/impl/store.py` is named
# `pagedstate.impl.store` by mutmut and by Python alike, and the plain path finder
# (ahead of the editable finder on sys.meta_path) imports the mutated file.
#
# The copy is taken from a commit (default HEAD), not the working tree, so concurrent
# edits in the repo neither leak into the run nor see mutated files.
#
# usage: tools/mutation_stage.sh DEST [REV]
set -euo pipefail
dest=${1:?usage: tools/mutation_stage.sh DEST [REV]}
rev=${2:-HEAD}
root=$(git rev-parse --show-toplevel)
commit=$(git -C "$root" rev-parse "$rev")
rm -rf "$dest"
mkdir -p "$dest/src/pagedstate"
mapfile -t dirs < <(git -C "$root" ls-tree --name-only "$commit" spec models impl gpu engines)
git -C "$root" archive "$commit" "${dirs[@]}" tests pyproject.toml README.md \
    | tar -x -C "$dest"
for d in "${dirs[@]}"; do mv "$dest/$d" "$dest/src/pagedstate/$d"; done
echo "$commit" > "$dest/COMMIT"
echo "staged $commit in $dest"
