#!/usr/bin/env bash
# make_golden.sh — regenerates the checked-in golden logits tests/golden/<preset>-<dtype>.json.
#
# For each preset (tiny-v3, tiny-v2) and stored dtype (fp32, bf16, fp8) it writes a seeded random
# checkpoint with `moeserve mkmodel --preset P --seed 1 --dtype D --out DIR` and runs the float64
# oracle tests/ref/deepseek_ref.py on a fixed set of prompts (1, 7 and 23 tokens, 8 greedy decode
# steps each).  The C engine's tests compare its `--dtype float32` logits with these files.
# Also writes GOLDEN_DIR/long/tiny-v3-fp32.json: one 300-token prompt (seeded random ids), 2 steps,
# so the engine's prefill attention runs in several causal query blocks.
# Usage: tests/ref/make_golden.sh [preset-dtype ...]   (default: all six and the long one)
# Env: MOESERVE (default build/moeserve), PYREF_PYTHON (default /usr/bin/python3 — Debian's,
#      with numpy), GOLDEN_DIR (default tests/golden), SEED (default 1), STEPS (default 8).
# Regenerate only when mkmodel's generator or the reference semantics change, and say why in the
# commit.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
MOESERVE=${MOESERVE:-$root/build/moeserve}
PY=${PYREF_PYTHON:-/usr/bin/python3}
GOLDEN_DIR=${GOLDEN_DIR:-$root/tests/golden}
SEED=${SEED:-1}
STEPS=${STEPS:-8}
ref=$root/tests/ref/deepseek_ref.py

if [ ! -x "$MOESERVE" ]; then
    echo "make_golden.sh: $MOESERVE not found or not executable (run make first)" >&2
    exit 1
fi
if ! "$PY" -c 'import numpy' 2>/dev/null; then
    echo "make_golden.sh: $PY has no numpy (use Debian's /usr/bin/python3)" >&2
    exit 1
fi
[ -f "$ref" ] || { echo "make_golden.sh: $ref missing" >&2; exit 1; }

# Fixed prompts: 1, 7 and 23 tokens, ids < 1024 (tiny vocab), starting with BOS 0.
P1="0"
P2="0,17,400,999,3,250,64"
P3="0,812,5,5,5,91,1023,300,301,302,7,660,128,2,44,1000,256,513,9,77,640,31,8"

targets=("$@")
long=0
if [ ${#targets[@]} -eq 0 ]; then
    targets=(tiny-v3-fp32 tiny-v3-bf16 tiny-v3-fp8 tiny-v2-fp32 tiny-v2-bf16 tiny-v2-fp8)
    long=1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$GOLDEN_DIR"
for t in "${targets[@]}"; do
    preset=${t%-*}
    dtype=${t##*-}
    case "$preset" in tiny-v3|tiny-v2) ;; *) echo "unknown preset in $t" >&2; exit 1 ;; esac
    case "$dtype" in fp32|bf16|fp8) ;; *) echo "unknown dtype in $t" >&2; exit 1 ;; esac
    dir=$tmp/$t
    echo "== $t: mkmodel" >&2
    "$MOESERVE" mkmodel --preset "$preset" --seed "$SEED" --dtype "$dtype" --out "$dir"
    [ -f "$dir/config.json" ] || { echo "mkmodel wrote no $dir/config.json" >&2; exit 1; }
    echo "== $t: reference" >&2
    "$PY" "$ref" --model "$dir" --prompt-ids "$P1" --prompt-ids "$P2" --prompt-ids "$P3" \
        --steps "$STEPS" --digits 9 --seed "$SEED" --out "$GOLDEN_DIR/$t.json"
    echo "wrote $GOLDEN_DIR/$t.json ($(wc -c < "$GOLDEN_DIR/$t.json") bytes)" >&2
done
if [ "$long" = 1 ]; then
    PL=$("$PY" -c "import random; random.seed(5); print(','.join(['0'] + [str(random.randrange(1, 1024)) for _ in range(299)]))")
    mkdir -p "$GOLDEN_DIR/long"
    "$PY" "$ref" --model "$tmp/tiny-v3-fp32" --prompt-ids "$PL" --steps 2 --digits 9 --seed "$SEED" \
        --out "$GOLDEN_DIR/long/tiny-v3-fp32.json"
    echo "wrote $GOLDEN_DIR/long/tiny-v3-fp32.json" >&2
fi
