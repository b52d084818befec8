#!/usr/bin/env bash
# t_deterministic.sh — `--enable-deterministic-inference` (issue 29 item 6) in serve,
# generate and perplexity on the tiny-v3 model (BF16 weights, --dtype auto; serve on tiny-v4 too): 16
# concurrent greedy requests to `serve` give exactly the tokens each gives alone over
# 200 tokens, also with a KV pool small enough that requests are retracted and their
# prompt + generated tokens recomputed in prefill chunks (the retraction counter must
# be > 0), and without the flag the same check sees batch-dependent tokens
# (tests/deterministic_test.py).  The kernel-level
# property (each row of an M-row product has the bits of M = 1, every path) is
# build/tests/test_kernels' matmul_batch_invariant.  Then the same flag in `generate`
# (prompts together against each alone) and `perplexity` (--parallel and --threads
# leave the saved log-probs bit-identical).  Last, `generate --tp 4` with the flag: the
# 6 prompts together give each one's tokens alone, with Open MPI's ring all-reduce forced
# (its grouping of the 4 ranks' partial sums follows the message size, i.e. the batch's
# rows: without the fixed-order sums of ms_comm_set_fixed_order 2 of the 6 part; MPI's
# default choice on one host happens to group alike at every size, so with it the check
# could not fail).  Prints "N passed, N failed".
set -u
export MOESERVE=${MOESERVE:-build/moeserve}
. "$(dirname "$0")/lib.sh"
serve_setup
out=$(/usr/bin/python3 tests/deterministic_test.py "$M" 200 2>&1)
printf '%s\n' "$out" | grep -v '^[0-9]* passed'
add_counts "$out" || bad "deterministic_test.py" "$out"
# the same on tiny-v4 (its own attention, compressors and window pools)
"$MOESERVE" mkmodel --preset tiny-v4 --seed 7 --out "$tmp/v4" >/dev/null 2>&1 || bad "mkmodel tiny-v4"
out=$(/usr/bin/python3 tests/deterministic_test.py "$tmp/v4" 200 2>&1)
printf '%s\n' "$out" | grep -E '^(ok|FAIL)' | sed 's/^\(ok  \|FAIL\) /&[tiny-v4] /'
add_counts "$out" || bad "deterministic_test.py tiny-v4" "$out"
# `generate` with the flag (same meaning as serve's): 6 prompts run together give
# each prompt's tokens alone, over 80 tokens; without it the same check sees
# differences (so it can tell).  --threads 2: the pool splits each product.
ids_of() { # prompt i: LENS[i] seeded ids in 3..902
    local x=$((12345 + $1)) n=${LENS[$1]} out=""
    for _ in $(seq "$n"); do x=$(((x * 1103515245 + 12345) % 2147483648)); out="$out${out:+,}$((3 + x % 900))"; done
    echo "$out"
}
LENS=(5 17 33 41 60 25)
gen() { "$MOESERVE" generate --model "$M" --threads 2 --max-new-tokens 80 --ignore-eos --ids \
    --skip-server-warmup "$@" 2>&1 | grep '^ids:'; }
for mode in det default; do
    flag=; [ $mode = det ] && flag=--enable-deterministic-inference
    args=(); for i in "${!LENS[@]}"; do args+=(--prompt-ids "$(ids_of "$i")"); done
    gen $flag "${args[@]}" >"$tmp/gen_together_$mode"
    : >"$tmp/gen_alone_$mode"
    for i in "${!LENS[@]}"; do gen $flag --prompt-ids "$(ids_of "$i")" >>"$tmp/gen_alone_$mode"; done
    n_diff=$(diff "$tmp/gen_together_$mode" "$tmp/gen_alone_$mode" | grep -c '^<')
    n_ok=$(awk 'NF == 81' "$tmp/gen_alone_$mode" | wc -l)
    if [ $mode = det ]; then
        t "generate --enable-deterministic-inference: 6 prompts together give each one's 80 tokens alone ($n_diff differ)" \
            '[ "$n_ok" = 6 ] && [ "$(wc -l <"$tmp/gen_together_$mode")" = 6 ] && [ "$n_diff" = 0 ]'
    else
        t "generate without the flag: the same check sees batch-dependent tokens ($n_diff of 6 differ)" '[ "$n_diff" -gt 0 ]'
    fi
done
# --tp 4 (4 ranks oversubscribed on the test machine's cores, --threads 1, each run
# under a deadline): the same 6 prompts together and alone, with the flag.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--pci}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} # Open MPI keeps its allocations until exit
gen4() { OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 timeout -k 5 120 "$MOESERVE" generate \
    --model "$M" --threads 1 --max-new-tokens 80 --ignore-eos --ids --skip-server-warmup --tp 4 \
    --enable-deterministic-inference --comm-timeout-s 60 "$@" 2>&1 | grep '^ids:'; }
t0=$(date +%s)
args=(); for i in "${!LENS[@]}"; do args+=(--prompt-ids "$(ids_of "$i")"); done
gen4 "${args[@]}" >"$tmp/tp4_together"
: >"$tmp/tp4_alone"
for i in "${!LENS[@]}"; do gen4 --prompt-ids "$(ids_of "$i")" >>"$tmp/tp4_alone"; done
n_diff=$(diff "$tmp/tp4_together" "$tmp/tp4_alone" | grep -c '^<')
n_ok=$(awk 'NF == 81' "$tmp/tp4_alone" | wc -l)
t "generate --tp 4 --enable-deterministic-inference (ring all-reduce): 6 prompts together give each one's 80 tokens alone ($n_diff differ, $(($(date +%s) - t0)) s)" \
    '[ "$n_ok" = 6 ] && [ "$(wc -l <"$tmp/tp4_together")" = 6 ] && [ "$n_diff" = 0 ]'
# `perplexity` with the flag: the saved log-probs are bit-identical for --parallel 1
# and 4 (other windows beside each one) and --threads 1 and 2; without the flag
# --parallel changes them.
head -c 6000 README.md >"$tmp/text.txt"
ppl() { "$MOESERVE" perplexity --model "$M" --file "$tmp/text.txt" --ctx 64 --chunks 4 "$@" 2>&1 | grep '^result:'; }
ppl --parallel 1 --threads 2 --enable-deterministic-inference --save-logits "$tmp/d1.bin" >"$tmp/d1.txt"
ppl --parallel 4 --threads 2 --enable-deterministic-inference --save-logits "$tmp/d4.bin" >"$tmp/d4.txt"
ppl --parallel 4 --threads 1 --enable-deterministic-inference --save-logits "$tmp/d4t1.bin" >"$tmp/d4t1.txt"
t "perplexity --enable-deterministic-inference: --parallel 1 and 4, --threads 2 and 1 save identical log-probs" \
    'grep -q "^result: ppl=" "$tmp/d1.txt" && cmp -s "$tmp/d1.bin" "$tmp/d4.bin" && cmp -s "$tmp/d4.bin" "$tmp/d4t1.bin" && cmp -s "$tmp/d1.txt" "$tmp/d4.txt"'
ppl --parallel 1 --threads 2 --save-logits "$tmp/f1.bin" >/dev/null
ppl --parallel 4 --threads 2 --save-logits "$tmp/f4.bin" >/dev/null
t "perplexity without the flag: --parallel 1 and 4 differ (the check can tell)" \
    '[ -s "$tmp/f1.bin" ] && ! cmp -s "$tmp/f1.bin" "$tmp/f4.bin"'
report
