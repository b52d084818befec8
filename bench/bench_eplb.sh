#!/usr/bin/env bash
# bench_eplb.sh — EPLB on a skewed small-v3 (mkmodel --route-skew) under EP 2 (all-to-all,
# 2 ranks x 1 thread) at batch 32: balancedness (the recorder's sglang:eplb_balancedness,
# mean over the forward passes of a 32-request served run) and decode step time
# (`generate`, 32 prompts) with the trivial placement, then with --ep-num-redundant-experts
# R placed by DeepSeek's EPLB from the distribution recorded in the first run (SGLang's
# record-then-relaunch flow; runtime rebalancing is not built); and what the R redundant
# slots cost: weight bytes per rank, and those bytes in KV tokens (the KV pool shrinks by
# that much at a fixed memory budget).  Runtime rebalancing (--enable-eplb, MODE=runtime,
# EP=2 or EP=4): two served rounds of 32 requests, the placement rebalanced from the
# recorded window after every ITERS forward passes (ITERS ~ one round's passes): the
# balancedness and wall time of round 1 (before: trivial + R redundant) and round 2
# (after), against the same two rounds without --enable-eplb, interleaved twice (ONCE=1:
# once); the staging buffer in KV tokens.  Step time (MODE=steps, EP=2 or EP=4): one
# `generate` of 32 prompts x NEW_TOKENS (30) greedy tokens with R redundant slots and
# --enable-eplb every ITERS (16) passes, so the run holds one rebalance at pass 16: the
# decode steps' time (ms per step at batch 32) and balancedness before it and after it
# (generate's eplb_decode_step_ms line); the control is the same run with
# --eplb-min-rebalancing-utilization-threshold 0 (the decision at pass 16 is skipped,
# nothing moves), which measures how step time drifts with the context alone; the two
# interleaved REPS (2) times; ratio = (after / before with EPLB) / (after / before in the
# control).  Then what the R redundant slots and the staging buffer cost per rank, in bytes
# and KV tokens, from `moeserve plan` (which prices them as the engine loads them:
# t_eplb_serve.sh).  Waterfill (MODE=waterfill, below): per-rank expert rows and decode
# step time with the shared expert at home and with --enable-waterfill.  One row per
# configuration.  Noisy on a shared machine: compare rows of one run.
set -u
BUILD=${BUILD:-build}
MS=$BUILD/moeserve
SKEW=${ROUTE_SKEW:-1.0}
R=${REDUNDANT:-4}
NEW=${NEW_TOKENS:-16}
M=${MODEL:-$BUILD/models/small-v3-skew$SKEW}
[ -f "$M/config.json" ] || "$MS" mkmodel --preset small-v3 --seed 1 --route-skew "$SKEW" --out "$M" >/dev/null 2>&1
tmp=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$tmp"' EXIT
NEP=${EP:-2}
EP=(--tp "$NEP" --moe-a2a-backend deepep)
MODE=${MODE:-static}
ITERS=${ITERS:-16}
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
served() { # $1 label, rest: flags; 32 concurrent requests; dump in $tmp/$1.json
    local label=$1
    shift
    local p
    p=$(port)
    "$MS" serve --model-path "$M" --port "$p" --threads 1 --enable-metrics \
        --expert-distribution-recorder-mode stat "${EP[@]}" "$@" >"$tmp/$label.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 1200); do curl -sf "http://127.0.0.1:$p/health" >/dev/null 2>&1 && break; sleep 0.1; done
    curl -s -X POST "http://127.0.0.1:$p/start_expert_distribution_record" >/dev/null
    for i in $(seq 1 32); do
        curl -s -X POST "http://127.0.0.1:$p/generate" -d "{\"text\": \"Request $i asks about item $((i * 7 % 13)) and more\", \"sampling_params\": {\"max_new_tokens\": $NEW, \"temperature\": 0, \"ignore_eos\": true}}" >/dev/null &
    done
    wait $(jobs -p | grep -v "^$PID$") 2>/dev/null
    curl -s -X POST "http://127.0.0.1:$p/dump_expert_distribution_record" >"$tmp/$label.json"
    curl -s "http://127.0.0.1:$p/metrics" >"$tmp/$label.metrics"
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
    /usr/bin/python3 - "$tmp/$label.metrics" <<'PY'
import re, sys
m = open(sys.argv[1]).read()
s = sum(float(v) for v in re.findall(r"sglang:eplb_balancedness_sum\{[^}]*\} (\S+)", m))
n = sum(float(v) for v in re.findall(r"sglang:eplb_balancedness_count\{[^}]*\} (\S+)", m))
print(f"{s / n:.4f} {int(n)}")
PY
}
timed() { # rest: flags; prints decode_tok_s weight_GB bytes_per_token
    for i in $(seq 1 32); do echo "Prompt number $i talks about item $((i * 7 % 13)) in some detail"; done >"$tmp/p.txt"
    "$MS" generate --model "$M" --prompt-file "$tmp/p.txt" --max-new-tokens "$NEW" --ignore-eos \
        --threads 1 "${EP[@]}" "$@" >"$tmp/g.out" 2>"$tmp/g.err"
    dec=$(grep '^timing:' "$tmp/g.out" | sed 's/.*decode_tok_s=\([0-9.]*\).*/\1/')
    wb=$(grep -o 'weights: [0-9.]* MB' "$tmp/g.err" | head -1 | grep -o '[0-9.]*')
    bpt=$(grep -o '[0-9]* B per token' "$tmp/g.err" | head -1 | grep -o '^[0-9]*')
    echo "$dec $wb $bpt"
}
rounds() { # $1 label, rest: flags; two rounds of 32: balancedness and wall seconds of each
    local label=$1
    shift
    local p
    p=$(port)
    "$MS" serve --model-path "$M" --port "$p" --threads 1 --enable-metrics "${EP[@]}" \
        --expert-distribution-recorder-mode stat --max-total-tokens 65536 "$@" \
        >"$tmp/$label.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 6000); do
        curl -sf "http://127.0.0.1:$p/health" >/dev/null 2>&1 && break
        kill -0 "$PID" 2>/dev/null || { tail -3 "$tmp/$label.log" >&2; break; }
        sleep 0.1
    done
    for r in 1 2; do
        local t0=$(date +%s.%N)
        for i in $(seq 1 32); do
            curl -s -X POST "http://127.0.0.1:$p/generate" -d "{\"text\": \"Request $i asks about item $((i * 7 % 13)) and more\", \"sampling_params\": {\"max_new_tokens\": $NEW, \"temperature\": 0, \"ignore_eos\": true}}" >/dev/null &
        done
        wait $(jobs -p | grep -v "^$PID$") 2>/dev/null
        echo "$t0 $(date +%s.%N)" >"$tmp/$label.$r.t"
        curl -s "http://127.0.0.1:$p/metrics" >"$tmp/$label.$r.metrics"
    done
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
    /usr/bin/python3 - "$tmp/$label" <<'PY'
import re, sys
def sn(path):
    m = open(path).read()
    s = sum(float(v) for v in re.findall(r"sglang:eplb_balancedness_sum\{[^}]*\} (\S+)", m))
    n = sum(float(v) for v in re.findall(r"sglang:eplb_balancedness_count\{[^}]*\} (\S+)", m))
    return s, n
b = sys.argv[1]
(s1, n1), (s2, n2) = sn(b + ".1.metrics"), sn(b + ".2.metrics")
t = [list(map(float, open(b + ".%d.t" % r).read().split())) for r in (1, 2)]
print(f"{s1 / n1:.4f} {(s2 - s1) / (n2 - n1):.4f} {int(n1)} {int(n2 - n1)} {t[0][1] - t[0][0]:.1f} {t[1][1] - t[1][0]:.1f}")
PY
}
if [ "$MODE" = steps ]; then
    NEW=${NEW_TOKENS_STEPS:-30}
    for i in $(seq 1 32); do echo "Prompt number $i talks about item $((i * 7 % 13)) in some detail"; done >"$tmp/p.txt"
    steps_run() { # rest: flags; prints the eplb_decode_step_ms fields
        "$MS" generate --model "$M" --prompt-file "$tmp/p.txt" --max-new-tokens "$NEW" --ignore-eos \
            --threads 1 "${EP[@]}" --ep-num-redundant-experts "$R" --enable-eplb \
            --eplb-rebalance-num-iterations "$ITERS" "$@" >"$tmp/s.out" 2>"$tmp/s.err" ||
            { tail -3 "$tmp/s.err" >&2; return 1; }
        grep '^eplb_decode_step_ms:' "$tmp/s.out" | sed 's/^eplb_decode_step_ms: //'
    }
    field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
    ratios=()
    for k in $(seq 1 "${REPS:-2}"); do
        e=$(steps_run) || exit 1
        c=$(steps_run --eplb-min-rebalancing-utilization-threshold 0) || exit 1
        echo "model=$(basename "$M") ep=$NEP batch=32 run=eplb redundant=$R iters=$ITERS $e"
        echo "model=$(basename "$M") ep=$NEP batch=32 run=control redundant=$R iters=$ITERS $c"
        r=$(/usr/bin/python3 -c "import sys; a, b, c, d = map(float, sys.argv[1:]); print(f'{(b / a) / (d / c):.3f}')" \
            "$(field "$e" before)" "$(field "$e" after)" "$(field "$c" before)" "$(field "$c" after)")
        ratios+=("$r")
        echo "ep=$NEP rep=$k step_ms eplb $(field "$e" before) -> $(field "$e" after), control $(field "$c" before) -> $(field "$c" after); balancedness eplb $(field "$e" before_balancedness) -> $(field "$e" after_balancedness), control $(field "$c" before_balancedness) -> $(field "$c" after_balancedness); ratio (after/before, eplb over control) $r (target < 1: EPLB shortens the step)"
        [ "${ONCE:-0}" = 1 ] && break
    done
    pj() { "$MS" plan --model-config "$M/config.json" --gpu cpu --gpu-mem-gb 64 "${EP[@]}" "$@" --json 2>/dev/null; }
    pj --ep-num-redundant-experts 0 >"$tmp/p0.json"
    pj --ep-num-redundant-experts "$R" --enable-eplb >"$tmp/p1.json"
    /usr/bin/python3 - "$tmp/p0.json" "$tmp/p1.json" "$R" "$NEP" "${ratios[*]}" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
bpt = b["kv_bytes_per_token"]
w = b["weights_bytes_per_rank"] - a["weights_bytes_per_rank"]
st = b["eplb_staging_bytes_per_rank"]
print(f"ep={sys.argv[4]} redundant={sys.argv[3]} redundant_bytes_per_rank={w:.0f} ({w / 2**20:.1f} MiB) "
      f"= {w / bpt:.0f} KV tokens; staging_bytes_per_rank={st:.0f} ({st / 2**20:.1f} MiB) = {st / bpt:.0f} "
      f"KV tokens; kv_bytes_per_token={bpt:.0f}; step-time ratios {sys.argv[5]}")
PY
    exit 0
fi
if [ "$MODE" = waterfill ]; then # SGLang's waterfill against the shared expert at home
    # One `generate` of BATCH (32) prompts x NEW_TOKENS greedy tokens per run, --comm-stats:
    # per-rank load = the expert rows each EP rank computed (routed entries received + shared
    # rows: the recorder's counts leave the shared copies out, as SGLang's do), balancedness
    # (mean + 1e-5) / (max + 1e-5) over the ranks; decode step time; the rows whose shared
    # copy ran on the other rank.  Runs: separate (default), --enable-waterfill, interleaved
    # REPS (2) times.  Waterfill moves copies only from a rank with >= 64 rows (SGLang's
    # MIN_BATCH_FOR_BALANCE): batch 32 at EP 2 gives 16 decode rows per rank, so only the
    # prefill steps move any; BATCH=128 puts 64 on each rank.
    NB=${BATCH:-32}
    for i in $(seq 1 "$NB"); do echo "Prompt number $i talks about item $((i * 7 % 13)) in some detail"; done >"$tmp/p.txt"
    wf_run() { # $1 label, rest: flags
        local label=$1
        shift
        "$MS" generate --model "$M" --prompt-file "$tmp/p.txt" --max-new-tokens "$NEW" --ignore-eos \
            --threads 1 "${EP[@]}" --comm-stats "$@" >"$tmp/w.out" 2>"$tmp/w.err" ||
            { tail -3 "$tmp/w.err" >&2; return 1; }
        /usr/bin/python3 - "$tmp/w.out" "$tmp/w.err" "$label" "$NB" "$NEP" <<'PY'
import re, sys
out, err = open(sys.argv[1]).read(), open(sys.argv[2]).read()
dec = float(re.search(r"decode_tok_s=([0-9.]+)", out).group(1))
rows = {int(a): (int(b), int(c)) for a, b, c in
        re.findall(r"^mlp rank=(\d+) .*expert_rows=(\d+) shared_remote=(\d+)", err, re.M)}
load = [rows[r][0] for r in sorted(rows)]
bal = (sum(load) / len(load) + 1e-5) / (max(load) + 1e-5)
print(f"run={sys.argv[3]} ep={sys.argv[5]} batch={sys.argv[4]} step_ms={int(sys.argv[4]) * 1000 / dec:.1f} "
      f"decode_tok_s={dec:.1f} expert_rows_per_rank={'/'.join(map(str, load))} balancedness={bal:.4f} "
      f"shared_remote={sum(v[1] for v in rows.values())}")
PY
    }
    field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
    for k in $(seq 1 "${REPS:-2}"); do
        a=$(wf_run separate) || exit 1
        b=$(wf_run waterfill --enable-waterfill) || exit 1
        echo "model=$(basename "$M") $a"
        echo "model=$(basename "$M") $b"
        echo "ep=$NEP batch=$NB rep=$k balancedness $(field "$a" balancedness) -> $(field "$b" balancedness) (higher is better: waterfill evens the ranks), step_ms $(field "$a" step_ms) -> $(field "$b" step_ms), ratio $(/usr/bin/python3 -c "import sys; print(f'{float(sys.argv[2]) / float(sys.argv[1]):.3f}')" "$(field "$a" step_ms)" "$(field "$b" step_ms)") (waterfill / separate)"
        [ "${ONCE:-0}" = 1 ] && break
    done
    exit 0
fi
if [ "$MODE" = runtime ]; then
    RT=(--ep-num-redundant-experts "$R" --enable-eplb --eplb-rebalance-num-iterations "$ITERS")
    for k in 1 2; do # interleaved: static (trivial + R redundant), then runtime EPLB
        read -r sb0 sb1 sn0 sn1 st0 st1 < <(rounds static --ep-num-redundant-experts "$R")
        echo "model=small-v3 route_skew=$SKEW ep=$NEP batch=32 mode=static redundant=$R balancedness_round1=$sb0 balancedness_round2=$sb1 passes=$sn0+$sn1 round1_s=$st0 round2_s=$st1"
        read -r rb0 rb1 rn0 rn1 rt0 rt1 < <(rounds runtime "${RT[@]}")
        stg=$(grep -o '+ [0-9.]* MiB EPLB staging' "$tmp/runtime.log" | head -1 | grep -o '[0-9.]*')
        bpt=$(grep -o '[0-9]* B per token' "$tmp/runtime.log" | head -1 | grep -o '^[0-9]*')
        moves=$(grep -c "moved at forward pass" "$tmp/runtime.log")
        mt=$(grep -o 'rebalance end at forward pass [0-9]* time=[0-9.]*s' "$tmp/runtime.log" | head -1 | grep -o 'time=[0-9.]*s')
        kv=$(/usr/bin/python3 -c "print(int(round($stg * 1048576 / $bpt)))" 2>/dev/null)
        echo "model=small-v3 route_skew=$SKEW ep=$NEP batch=32 mode=runtime redundant=$R iters=$ITERS balancedness_round1=$rb0 balancedness_round2=$rb1 passes=$rn0+$rn1 round1_s=$rt0 round2_s=$rt1 layer_moves=$moves first_rebalance_$mt staging_mib=$stg staging_kv_tokens=$kv kv_bytes_per_token=$bpt"
        grep "rebalance start\|rebalance end" "$tmp/runtime.log" | sed 's/^/  # /'
        [ "${ONCE:-0}" = 1 ] && break
    done
    exit 0
fi
read -r b0 n0 < <(served trivial)
cp "$tmp/trivial.json" "$tmp/rec.json"
read -r b1 n1 < <(served eplb --ep-num-redundant-experts "$R" --init-expert-location "$tmp/rec.json")
read -r d0 w0 bpt < <(timed)
read -r d1 w1 _ < <(timed --ep-num-redundant-experts "$R" --init-expert-location "$tmp/rec.json")
kv=$(/usr/bin/python3 -c "print(int(round(($w1 - $w0) * 1e6 / $bpt)))" 2>/dev/null)
echo "model=small-v3 route_skew=$SKEW ep=2 batch=32 placement=trivial redundant=0 balancedness=$b0 passes=$n0 decode_tok_s=$d0 step_ms=$(/usr/bin/python3 -c "print(f'{32000 / $d0:.1f}')") weights_mb_rank0=$w0"
echo "model=small-v3 route_skew=$SKEW ep=2 batch=32 placement=eplb_recorded redundant=$R balancedness=$b1 passes=$n1 decode_tok_s=$d1 step_ms=$(/usr/bin/python3 -c "print(f'{32000 / $d1:.1f}')") weights_mb_rank0=$w1 redundant_cost_kv_tokens=$kv kv_bytes_per_token=$bpt"
