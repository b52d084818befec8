#!/usr/bin/env bash
# run_demo.sh — `make run`: build, create a small model, generate from it.
set -euo pipefail
BUILD=${BUILD:-build}
M=${DEMO_MODEL:-$BUILD/models/tiny-v3}
mkdir -p "$(dirname "$M")"
if [ ! -f "$M/config.json" ]; then
    "$BUILD/moeserve" mkmodel --preset tiny-v3 --seed 1 --out "$M"
fi
"$BUILD/moeserve" generate --model "$M" --prompt "The quick brown fox" --max-new-tokens 24 --ids
