#!/usr/bin/env bash
# t_eplb_run.sh — runtime EPLB (--enable-eplb) under EP over MPI (2 real mpirun ranks) on a
# skewed tiny model: with --dtype float32, greedy tokens identical and logits within 1e-4
# relative of the 1-rank run before, during and after rebalances (a small
# --eplb-rebalance-num-iterations and one layer per chunk make "during" deterministic:
# the log names the forward pass each layer moved at, inside the generation), with and
# without redundant slots, all layers at once too; a served workload's balancedness
# improves after a rebalance; a request streaming while the layers move gets the same
# tokens as without EPLB; the staging buffer is in the KV budget (start-up log,
# /server_info, `moeserve plan` agree); the threshold skips; and the refusals.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
. "$(dirname "$0")/lib.sh"
serve_setup
eplb_setup
check_run() { # $1 = label, rest = flags; the run's log stays in $tmp/l.out
    local label=$1
    shift
    if ! timeout 180 "$MOESERVE" generate "${common[@]}" --tp 2 --moe-a2a-backend deepep \
        --enable-eplb "$@" --dump-logits "$tmp/l.jsonl" >"$tmp/l.out" 2>&1; then
        bad "$label: run failed" "$(tail -5 "$tmp/l.out")"
        return
    fi
    if /usr/bin/python3 tests/compare_logits.py "$tmp/ref.jsonl" "$tmp/l.jsonl" >"$tmp/cmp" 2>&1; then
        ok "$label ($(grep 'max relative' "$tmp/cmp"))"
    else bad "$label" "$(cat "$tmp/cmp")"; fi
}
# 12 tokens = 12 forward passes: planned at pass 3, layers 1, 2, 3 moved at passes 4, 5, 6
# (during), generation goes on to pass 12 under the new placement (after); again at 9..12
check_run "EP 2 + 2 redundant, rebalance every 3 passes, 1 layer per chunk = 1-rank run" \
    --ep-num-redundant-experts 2 --eplb-rebalance-num-iterations 3 --eplb-rebalance-layers-per-chunk 1
t "the plan came at pass 3 and each layer moved at its own pass (4, 5, 6), inside the generation" \
    'grep -q "rebalance start at forward pass 3:" "$tmp/l.out" &&
     grep -q "layer 1 moved at forward pass 4:" "$tmp/l.out" &&
     grep -q "layer 2 moved at forward pass 5:" "$tmp/l.out" &&
     grep -q "layer 3 moved at forward pass 6:" "$tmp/l.out" &&
     grep -q "rebalance end at forward pass 6 " "$tmp/l.out"'
t "slots really moved between the ranks (transfers received)" \
    'grep "moved at forward pass" "$tmp/l.out" | grep -vq "(0 received"'
t "the staging buffer is in the start-up KV line" 'grep -q "MiB EPLB staging)" "$tmp/l.out"'
# waterfill on top: the shared expert's slot on every rank stays put while routed slots move
check_run "EP 2 + 2 redundant + --enable-waterfill, rebalance every 3 passes = 1-rank run" \
    --ep-num-redundant-experts 2 --eplb-rebalance-num-iterations 3 --eplb-rebalance-layers-per-chunk 1 \
    --enable-waterfill
t "waterfill + EPLB: the layers moved (rebalance end at pass 6)" 'grep -q "rebalance end at forward pass 6 " "$tmp/l.out"'
check_run "EP 2, no redundant slots (a permutation), all layers at once" \
    --eplb-rebalance-num-iterations 4
t "all layers moved at the plan's pass" \
    'grep -q "layer 1 moved at forward pass 4:" "$tmp/l.out" && grep -q "layer 3 moved at forward pass 4:" "$tmp/l.out"'
check_run "threshold 0.1: every rebalance skipped" --ep-num-redundant-experts 2 \
    --eplb-rebalance-num-iterations 3 --eplb-min-rebalancing-utilization-threshold 0.1
t "the skip is logged and nothing moved" \
    'grep -q "Skipped ep rebalancing" "$tmp/l.out" && ! grep -q "moved at forward pass" "$tmp/l.out"'
# served: balancedness before and after, a stream across the moves.  Each request is 7
# passes (120 prompt tokens in 32-token chunks, 4 tokens): 1-7 and 8-14 fill the window
# (no redundant slots: the trivial placement puts the hot experts 0-7 on rank 0), the plan
# comes at pass 14, layers 1, 2, 3 move at passes 15, 16, 17 while the third request
# (15-21) streams, and the fourth (22-28) runs on the new placement.
BODY="{\"input_ids\": $(/usr/bin/python3 -c 'import random; r=random.Random(5); print([r.randrange(1000) for _ in range(120)])'), \"sampling_params\": {\"max_new_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}"
PORT=$(free_port)
if serve_up eplb "$MOESERVE" serve --model-path "$S" --port "$PORT" --threads 1 --skip-server-warmup \
    --dtype float32 --enable-metrics --tp 2 --moe-a2a-backend deepep --chunked-prefill-size 32 \
    --enable-eplb --eplb-rebalance-num-iterations 14 --eplb-rebalance-layers-per-chunk 1; then
    bal() { curl -s "http://127.0.0.1:$PORT/metrics" | /usr/bin/python3 -c "
import re, sys
m = sys.stdin.read()
s = sum(float(v) for v in re.findall(r'sglang:eplb_balancedness_sum\{[^}]*\} (\S+)', m))
n = sum(float(v) for v in re.findall(r'sglang:eplb_balancedness_count\{[^}]*\} (\S+)', m))
print(s, n)"; }
    curl -s "http://127.0.0.1:$PORT/generate" -d "$BODY}" >"$tmp/r1.json"
    b1=$(bal)
    curl -s "http://127.0.0.1:$PORT/generate" -d "$BODY}" >/dev/null
    curl -sN "http://127.0.0.1:$PORT/generate" -d "$BODY, \"stream\": true}" >"$tmp/r3.sse"
    b3=$(bal)
    curl -s "http://127.0.0.1:$PORT/generate" -d "$BODY}" >"$tmp/r4.json"
    b4=$(bal)
    curl -s "http://127.0.0.1:$PORT/server_info" >"$tmp/info.json"
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
    avg=$(/usr/bin/python3 -c "
import sys
s1, n1, s3, n3, s4, n4 = map(float, sys.argv[1:])
print('%.4f %.4f' % (s1 / n1, (s4 - s3) / (n4 - n3)))" $b1 $b3 $b4)
    t "balancedness of the same request before / after the rebalance: $avg" \
        '/usr/bin/python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if b > a + 0.02 else 1)" $avg'
    t "the layers moved while the third request streamed (passes 15, 16, 17)" \
        'grep -q "rebalance start at forward pass 14:" "$tmp/eplb.log" && grep -q "layer 1 moved at forward pass 15:" "$tmp/eplb.log" && grep -q "layer 3 moved at forward pass 17:" "$tmp/eplb.log"'
    t "the streamed request equals the ones before and after the moves" '/usr/bin/python3 -c "
import json, sys
a = json.load(open(sys.argv[1]))
last = [json.loads(l[6:]) for l in open(sys.argv[2]) if l.startswith(\"data: {\")][-1]
c = json.load(open(sys.argv[3]))
ok = a[\"text\"] == last[\"text\"] == c[\"text\"] and a[\"output_ids\"] == c[\"output_ids\"]
sys.exit(0 if ok and len(a[\"output_ids\"]) == 4 else 1)" "$tmp/r1.json" "$tmp/r3.sse" "$tmp/r4.json"'
    st=$(/usr/bin/python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['eplb_staging_bytes'])" "$tmp/info.json" 2>/dev/null)
    lg=$(grep -o '+ [0-9.]* MiB EPLB staging' "$tmp/eplb.log" | head -1 | grep -o '[0-9.]*')
    pl=$("$MOESERVE" plan --model-config "$S/config.json" --gpu cpu --gpu-mem-gb 1 --tp 2 \
        --moe-a2a-backend deepep --enable-eplb --json 2>/dev/null |
        /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['eplb_staging_bytes_per_rank'])")
    t "staging: /server_info $st B, start-up log $lg MiB, plan $pl B agree" \
        '/usr/bin/python3 -c "import sys; s, l, p = map(float, sys.argv[1:]); sys.exit(0 if s > 0 and abs(s / 2**20 - l) < 0.06 and abs(p - s) <= 0.001 * s else 1)" "$st" "$lg" "$pl"'
fi
# refusals
eplb_refuses "nothing to balance" --enable-eplb
eplb_refuses "needs the all-to-all" --tp 2 --ep-size 2 --enable-eplb
MOESERVE_WEIGHTS=mmap eplb_refuses "cannot be rewritten" --tp 2 --moe-a2a-backend deepep --enable-eplb
eplb_refuses "expected a number in \[0, 1\]" --eplb-min-rebalancing-utilization-threshold 2
report
