#!/usr/bin/env bash
# t_eplb_serve.sh — redundant experts under EP over MPI (real mpirun ranks):
# --ep-num-redundant-experts with the trivial placement, with a placement file holding
# duplicate replicas on one rank, and with a recorded distribution placed by EPLB at
# start-up: with --dtype float32 greedy tokens identical and logits within 1e-4 relative
# against the 1-rank run; the replicas cost weight memory on each rank; on a skewed
# model the EPLB placement of a recorded distribution raises balancedness (the
# recorder's sglang:eplb_balancedness) over the trivial one on the same workload; and
# the plan prices the slots as the engine loads them; and the refusals (EP 1, no
# all-to-all, a placement of the wrong width).  Runtime rebalancing: t_eplb_run.sh.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
. "$(dirname "$0")/lib.sh"
serve_setup
eplb_setup
# a recorded distribution (layer 0 dense): experts 0 and 1 hot
/usr/bin/python3 -c "
import json
lc = [[0] * 16] + [[900, 500] + [40] * 14 for _ in range(3)]
json.dump({'logical_count': lc}, open('$tmp/rec.json', 'w'))
# 20 slots, 10 per rank: rank 0 holds expert 0 three times, rank 1 holds 0 and 1 again
row = list(range(8)) + [0, 0] + list(range(8, 16)) + [0, 1]
json.dump({'physical_to_logical_map': [row] * 4}, open('$tmp/place.json', 'w'))
json.dump({'physical_to_logical_map': [list(range(16))] * 4}, open('$tmp/narrow.json', 'w'))"
check_ep() { # $1 = label, rest = flags
    local label=$1
    shift
    if ! timeout 180 "$MOESERVE" generate "${common[@]}" "$@" --dump-logits "$tmp/l.jsonl" >"$tmp/l.out" 2>&1; then
        bad "$label: run failed" "$(tail -5 "$tmp/l.out")"
        return
    fi
    if /usr/bin/python3 tests/compare_logits.py "$tmp/ref.jsonl" "$tmp/l.jsonl" >"$tmp/cmp" 2>&1; then
        ok "$label ($(grep 'max relative' "$tmp/cmp"))"
    else bad "$label" "$(cat "$tmp/cmp")"; fi
}
check_ep "EP 2 + 2 redundant, trivial" --tp 2 --moe-a2a-backend deepep --ep-num-redundant-experts 2
t "start-up names the physical slots" 'grep -q "experts: 18 physical slots per layer (16 routed + 2 redundant), 9 per EP rank" "$tmp/l.out"'
w0=$(grep -o 'weights: [0-9.]* MB' "$tmp/ref.out" | head -1)
check_ep "EP 2 + 4 redundant, duplicates on one rank (placement file)" --tp 2 --moe-a2a-backend mpi \
    --ep-num-redundant-experts 4 --init-expert-location "$tmp/place.json"
check_ep "EP 2 + 2 redundant, EPLB on a recorded distribution" --tp 2 --moe-a2a-backend deepep \
    --ep-num-redundant-experts 2 --init-expert-location "$tmp/rec.json" --eplb-algorithm deepseek
# weight memory per rank grows with the slots
wmb() { timeout 120 "$MOESERVE" generate --model "$S" --prompt-ids 0,5 --max-new-tokens 1 --threads 1 \
        --tp 2 --moe-a2a-backend deepep "$@" 2>&1 | grep -o 'weights [0-9.]* GB on this rank\|weights: [0-9.]* MB' | head -1 | grep -o '[0-9.]*'; }
a=$(wmb --ep-num-redundant-experts 0)
b=$(wmb --ep-num-redundant-experts 4)
t "4 redundant slots cost weight memory on rank 0 ($a MB -> $b MB)" \
    '/usr/bin/python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) else 1)" "$a" "$b"'
pw() { "$MOESERVE" plan --model-config "$S/config.json" --gpu cpu --gpu-mem-gb 1 --tp 2 \
        --moe-a2a-backend deepep --ep-num-redundant-experts "$1" --json 2>/dev/null |
        /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['weights_bytes_per_rank'] / 1e6)"; }
pa=$(pw 0)
pb=$(pw 4)
t "moeserve plan prices the 4 slots as the engine loads them (plan $pa -> $pb MB, engine $a -> $b MB)" \
    '/usr/bin/python3 -c "import sys; p, e = float(sys.argv[2]) - float(sys.argv[1]), float(sys.argv[4]) - float(sys.argv[3]); sys.exit(0 if abs(p - e) <= 0.1 else 1)" "$pa" "$pb" "$a" "$b"'
# balancedness: a recorded skewed workload placed by EPLB beats the trivial placement
BODY="{\"input_ids\": $(/usr/bin/python3 -c 'import random; r=random.Random(5); print([r.randrange(1000) for _ in range(120)])'), \"sampling_params\": {\"max_new_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}}"
bal_run() { # $1 = name, rest: flags; prints the mean balancedness over the passes
    local name=$1
    shift
    PORT=$(free_port)
    serve_up "$name" "$MOESERVE" serve --model-path "$S" --port "$PORT" --threads 1 --skip-server-warmup \
        --enable-metrics --tp 2 --moe-a2a-backend deepep --expert-distribution-recorder-mode stat "$@" || return 1
    curl -s -X POST "http://127.0.0.1:$PORT/start_expert_distribution_record" >/dev/null
    curl -s -X POST "http://127.0.0.1:$PORT/generate" -d "$BODY" >/dev/null
    curl -s -X POST "http://127.0.0.1:$PORT/dump_expert_distribution_record" >"$tmp/$name.json"
    curl -s "http://127.0.0.1:$PORT/metrics" >"$tmp/$name.metrics"
    curl -s "http://127.0.0.1:$PORT/server_info" >"$tmp/$name.info"
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
    /usr/bin/python3 -c "
import re, sys
m = open(sys.argv[1]).read()
s = sum(float(v) for v in re.findall(r'sglang:eplb_balancedness_sum\{[^}]*\} (\S+)', m))
n = sum(float(v) for v in re.findall(r'sglang:eplb_balancedness_count\{[^}]*\} (\S+)', m))
print(f'{s / n:.4f}')" "$tmp/$name.metrics"
}
b_triv=$(bal_run triv)
b_eplb=$(bal_run eplb --ep-num-redundant-experts 2 --init-expert-location "$tmp/triv.json")
t "skewed model, EP 2: balancedness trivial $b_triv -> EPLB-placed (2 redundant) $b_eplb" \
    '/usr/bin/python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) + 0.02 else 1)" "$b_triv" "$b_eplb"'
t "/server_info names the slots" 'grep -Eq "\"ep_num_redundant_experts\": ?2" "$tmp/eplb.info" && grep -Eq "\"num_physical_experts\": ?18" "$tmp/eplb.info"'
# what the 2 slots cost: /server_info's weight bytes (rank 0) against moeserve plan's
p2=$(pw 2)
wi=$(/usr/bin/python3 -c "import json,sys; print((json.load(open(sys.argv[2]))['weight_bytes_per_rank'] - json.load(open(sys.argv[1]))['weight_bytes_per_rank']) / 1e6)" "$tmp/triv.info" "$tmp/eplb.info" 2>&1)
t "/server_info prices the 2 slots as moeserve plan does ($wi MB; plan $pa -> $p2 MB)" \
    '/usr/bin/python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - (float(sys.argv[3]) - float(sys.argv[2]))) <= 0.1 and float(sys.argv[1]) > 0 else 1)" "$wi" "$pa" "$p2"'
# waterfill: the recorder counts the routed top-k only (SGLang's on_select_experts runs
# before its waterfill appends the shared column), so a 200-token prompt (100 rows per EP
# rank, above waterfill's 64) records the same totals with and without it
BODY="{\"input_ids\": $(/usr/bin/python3 -c 'import random; r=random.Random(6); print([r.randrange(1000) for _ in range(200)])'), \"sampling_params\": {\"max_new_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}}"
bal_run wsep >/dev/null
bal_run wfill --enable-waterfill >/dev/null
tot() { /usr/bin/python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(sum(map(sum, d['logical_count'])))" "$1" 2>/dev/null; }
ts=$(tot "$tmp/wsep.json")
tw=$(tot "$tmp/wfill.json")
t "waterfill: the recorder leaves the shared copies out (routed entries $ts without, $tw with)" \
    '[ -n "$ts" ] && [ "$ts" -gt 0 ] && [ "$ts" = "$tw" ]'
# refusals
eplb_refuses "nothing to balance" --ep-num-redundant-experts 2
eplb_refuses "need the all-to-all MoE path" --tp 2 --ep-size 2 --ep-num-redundant-experts 2
eplb_refuses "the launch 18 (16 routed + --ep-num-redundant-experts 2)" --tp 2 --moe-a2a-backend deepep \
    --ep-num-redundant-experts 2 --init-expert-location "$tmp/narrow.json"
eplb_refuses "expected auto|deepseek|deepseek_hierarchical" --eplb-algorithm waterfill
report
