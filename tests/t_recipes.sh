#!/usr/bin/env bash
# t_recipes.sh — every SGLang launch command of seed 001, read from the seed itself
# (tests/recipes_test.py), against a tiny-v3 model: it starts and answers with a
# warning naming its GPU-only flags, or it is refused naming its flags that are not
# built.  The seeds are shared/ next to the repository (CI clones it so:
# $(repo)/../shared/seeds); MOESERVE_SEEDS overrides.  No seeds found is a failure.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
repo=$(cd "$(dirname "$0")/.." && pwd)
seeds=${MOESERVE_SEEDS:-}
if [ -z "$seeds" ]; then
    # a git worktree two levels down (…/wt/NAME) finds the shared/ of the main checkout
    for d in "$repo/../shared/seeds" "$repo/../../shared/seeds"; do
        if [ -d "$d" ]; then seeds=$d; break; fi
    done
fi
if [ -z "$seeds" ] || [ ! -d "$seeds" ]; then
    echo "FAIL seed directory not found: $repo/../shared/seeds (set MOESERVE_SEEDS)"
    echo "0 passed, 1 failed"
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$MOESERVE" mkmodel --preset tiny-v3 --seed 7 --out "$tmp/model" >/dev/null 2>&1 ||
    { echo "0 passed, 1 failed"; exit 1; }
MOESERVE=$MOESERVE timeout -k 5 500 /usr/bin/python3 tests/recipes_test.py "$seeds" "$tmp/model"
