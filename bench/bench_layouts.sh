#!/usr/bin/env bash
# bench_layouts.sh — step time of 2-rank layouts against the 1-rank run with
# the same total threads (2), on small-v3, at batch 1 and batch 32, with the
# communication share of the step from --comm-stats (time inside collectives
# on rank 0 / wall time of the decode).  One row per configuration and round.
set -u
BUILD=${BUILD:-build}
M=${MODEL:-$BUILD/models/small-v3}
[ -f "$M/config.json" ] || "$BUILD/moeserve" mkmodel --preset small-v3 --seed 1 --out "$M" >/dev/null 2>&1
NEW=${NEW_TOKENS:-32}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompts() { for i in $(seq 1 "$1"); do echo "Prompt number $i talks about item $((i * 7 % 13)) in some detail"; done >"$tmp/p.txt"; }
row() { # $1 label, $2 batch, $3 threads per rank, rest: layout flags
    label=$1; batch=$2; th=$3; shift 3
    prompts "$batch"
    out=$("$BUILD/moeserve" generate --model "$M" --prompt-file "$tmp/p.txt" --max-new-tokens "$NEW" \
        --ignore-eos --threads "$th" --comm-stats "$@" 2>"$tmp/err")
    t=$(echo "$out" | grep '^timing:')
    dec=$(echo "$t" | sed 's/.*decode_tok_s=\([0-9.]*\).*/\1/')
    # collective wait time on rank 0 (microseconds) over all kinds and tags
    wait_us=$(grep '^comm rank=0 ' "$tmp/err" | sed 's/.*wait_us=\([0-9]*\).*/\1/' | paste -sd+ | bc 2>/dev/null)
    echo "layout=\"$label\" batch=$batch threads_per_rank=$th decode_tok_s=$dec comm_wait_s_rank0=$(echo "scale=3; ${wait_us:-0}/1000000" | bc)"
}
# BATCHES (default "1 32"), REPS rounds of every row in turn (default 1: alternate A B A B);
# the "shm all-reduce" row is tp2 with the shared-memory all-reduce on (MOESERVE_COMM_SHM=1)
for rep in $(seq 1 "${REPS:-1}"); do
    for b in ${BATCHES:-1 32}; do
        row "1 rank" "$b" 2
        row "tp2" "$b" 1 --tp 2
        MOESERVE_COMM_SHM=1 row "tp2 shm all-reduce" "$b" 1 --tp 2
        row "dp2 dp-attention ep2 a2a" "$b" 1 --tp 2 --dp 2 --enable-dp-attention --moe-a2a-backend deepep
    done
done
