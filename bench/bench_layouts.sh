#!/usr/bin/env bash
# bench_layouts.sh — step time of 2-rank layouts against the 1-rank run with
# the same total threads (2), on small-v3, at batch 1 and batch 32, with the
# communication share of the step from --comm-stats (time inside collectives
# on rank 0 / wall time of the decode).  One row per configuration and round,
# then one "ratio" line per round and batch: each layout's decode tok/s ÷ the
# 1-rank row of the same build in the same round.
set -u
BUILD=${BUILD:-build}
M=${MODEL:-$BUILD/models/small-v3}
[ -f "$M/config.json" ] || "$BUILD/moeserve" mkmodel --preset small-v3 --seed 1 --out "$M" >/dev/null 2>&1
NEW=${NEW_TOKENS:-32}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompts() { for i in $(seq 1 "$1"); do echo "Prompt number $i talks about item $((i * 7 % 13)) in some detail"; done >"$tmp/p.txt"; }
row() { # $1 build dir, $2 label, $3 batch, $4 threads per rank, rest: layout flags; sets dec
    bd=$1; label=$2; batch=$3; th=$4; shift 4
    prompts "$batch"
    out=$("$bd/moeserve" generate --model "$M" --prompt-file "$tmp/p.txt" --max-new-tokens "$NEW" \
        --ignore-eos --threads "$th" --comm-stats "$@" 2>"$tmp/err")
    t=$(echo "$out" | grep '^timing:')
    dec=$(echo "$t" | sed 's/.*decode_tok_s=\([0-9.]*\).*/\1/')
    # collective wait time on rank 0 (microseconds) over all kinds and tags
    wait_us=$(grep '^comm rank=0 ' "$tmp/err" | sed 's/.*wait_us=\([0-9]*\).*/\1/' | paste -sd+ | bc 2>/dev/null)
    tag=""; [ "$bd" != "$BUILD" ] && tag=" build=\"$bd\""
    echo "layout=\"$label\" batch=$batch threads_per_rank=$th decode_tok_s=$dec comm_wait_s_rank0=$(echo "scale=3; ${wait_us:-0}/1000000" | bc)$tag"
}
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (b > 0) printf "%.3f", a / b; else printf "nan" }'; }
# BATCHES (default "1 32"), REPS rounds of every row in turn (default 1: alternate A B A B).
# Rows: "1 rank", "tp2" (two-rank all-reduce exchange + vocab-parallel LM head), "tp2 MPI
# all-reduce" (MOESERVE_COMM_PAIR=0: Open MPI's Iallreduce, the head still split), "dp2 ...";
# SHM=1 adds "tp2 shm all-reduce" (MOESERVE_COMM_SHM=1).  BASE=DIR (another build, e.g.
# /work/main/build) adds its "1 rank", "tp2" and "dp2" rows, interleaved in the same round.
# "1 rank" runs before and after a build's layouts, and each ratio divides by the mean of
# the two, so a host that speeds up or slows down during the round does not favour the
# layouts run first.
for rep in $(seq 1 "${REPS:-1}"); do
    for b in ${BATCHES:-1 32}; do
        line="ratio round=$rep batch=$b"
        for bd in "$BUILD" ${BASE:-}; do
            pre=""; [ "$bd" != "$BUILD" ] && pre="base_"
            row "$bd" "1 rank" "$b" 2; one_a=$dec
            row "$bd" "tp2" "$b" 1 --tp 2; d_tp2=$dec
            if [ "$bd" = "$BUILD" ]; then
                MOESERVE_COMM_PAIR=0 row "$bd" "tp2 MPI all-reduce" "$b" 1 --tp 2; d_mpi=$dec
                if [ "${SHM:-0}" = 1 ]; then
                    MOESERVE_COMM_SHM=1 row "$bd" "tp2 shm all-reduce" "$b" 1 --tp 2; d_shm=$dec
                fi
            fi
            row "$bd" "dp2 dp-attention ep2 a2a" "$b" 1 --tp 2 --dp 2 --enable-dp-attention --moe-a2a-backend deepep
            d_dp2=$dec
            row "$bd" "1 rank" "$b" 2
            one=$(awk -v a="${one_a:-0}" -v b="${dec:-0}" 'BEGIN { printf "%.4f", (a + b) / 2 }')
            line="$line ${pre}tp2=$(ratio "$d_tp2" "$one")"
            if [ "$bd" = "$BUILD" ]; then
                line="$line tp2_mpi_allreduce=$(ratio "$d_mpi" "$one")"
                [ "${SHM:-0}" = 1 ] && line="$line tp2_shm=$(ratio "$d_shm" "$one")"
            fi
            line="$line ${pre}dp2=$(ratio "$d_dp2" "$one")"
        done
        echo "$line"
    done
done
