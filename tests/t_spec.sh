#!/usr/bin/env bash
# t_spec.sh — speculative decoding end to end on tiny-v3 (its random MTP layer):
# greedy output identical with and without --speculative-algorithm EAGLE (S = 1, 3)
# and NGRAM, on one rank, --tp 2 and --tp 2 --dp 2 --enable-dp-attention
# --moe-a2a-backend deepep (--dtype float32), for prompts of several lengths in
# one batch (a repetitive one for the n-gram drafts), EAGLE with a draft token map too; the same
# through a server
# with concurrent requests and a stop string; the refusals (trees, draft-token
# counts, EAGLE3, DSPARK, a model without an MTP layer).
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
. "$(dirname "$0")/lib.sh"
serve_setup
P="--prompt-ids 5,6,7,8,9,10 --prompt-ids 11,12,13 --prompt-ids 3,4,5,3,4,5,3,4,5,3,4,5,3,4 --prompt-ids 40"
gen() { timeout 180 "$MOESERVE" generate --model "$M" $P --max-new-tokens 21 --dtype float32 --ids \
    --ignore-eos --threads 1 "$@" 2>"$tmp/err" | grep '^ids:'; }
seq 0 3 400 | tr '\n' ' ' >"$tmp/map.txt" # a draft vocabulary of 134 ids (FR-Spec's token map)
for L in "" "--tp 2" "--tp 2 --dp 2 --enable-dp-attention --moe-a2a-backend deepep"; do
    ref=$(gen $L)
    t "plain run [$L]" '[ "$(printf "%s\n" "$ref" | wc -l)" -eq 4 ]'
    for A in "EAGLE --speculative-num-steps 1" "EAGLE --speculative-num-steps 3" "NEXTN --speculative-num-steps 2" \
             "NGRAM --speculative-num-steps 3" "EAGLE --speculative-num-steps 2 --speculative-token-map $tmp/map.txt"; do
        out=$(gen $L --speculative-algorithm $A)
        if [ "$out" = "$ref" ]; then ok "greedy identical: $A [$L]"; else
            bad "greedy identical: $A [$L]" "$(diff <(echo "$ref") <(echo "$out"); tail -5 "$tmp/err")"; fi
    done
done
out=$(gen --speculative-algorithm EAGLE --temperature 0.8 --top-p 0.9 --seed 3)
t "EAGLE with temperature 0.8: every prompt generates 21 tokens" \
    '[ "$(printf "%s\n" "$out" | awk "NF == 22" | wc -l)" -eq 4 ]'

# refusals, each naming what is missing
refuse() { # name, expected text, flags...
    local name=$1 want=$2
    shift 2
    local o
    o=$(timeout 60 "$MOESERVE" generate --model "$M" --prompt-ids 5,6 --max-new-tokens 2 "$@" 2>&1)
    if [ $? -ne 0 ] && printf '%s' "$o" | grep -q -- "$want"; then ok "$name"; else bad "$name" "$o"; fi
}
refuse "topk 2 refused (trees)" "eagle-topk 2" --speculative-algorithm EAGLE --speculative-eagle-topk 2
refuse "draft tokens != S + 1 refused" "num-draft-tokens 5" --speculative-algorithm EAGLE \
    --speculative-num-steps 3 --speculative-num-draft-tokens 5
refuse "EAGLE3 refused (draft model)" "draft model" --speculative-algorithm EAGLE3
refuse "DSPARK refused (V4.1 head)" "V4.1" --speculative-algorithm DSPARK
refuse "token map: a .pt refused (text ids)" "PyTorch file" --speculative-algorithm EAGLE \
    --speculative-token-map "$tmp/map.pt"
echo "5 7 5" >"$tmp/dup.txt"
refuse "token map: an id twice refused" "token 5 twice" --speculative-algorithm EAGLE \
    --speculative-token-map "$tmp/dup.txt"
refuse "token map: NGRAM refused (no draft head)" "only for the MTP draft" --speculative-algorithm NGRAM \
    --speculative-token-map "$tmp/map.txt"
refuse "NGRAM trees refused" "bfs-breadth 2" --speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 2
"$MOESERVE" mkmodel --preset tiny-v2 --seed 7 --out "$tmp/v2" >/dev/null 2>&1
o=$(timeout 60 "$MOESERVE" generate --model "$tmp/v2" --prompt-ids 5,6 --max-new-tokens 2 \
    --speculative-algorithm EAGLE 2>&1)
rc=$?
t "EAGLE on a model without an MTP layer refused" '[ $rc -ne 0 ] && printf "%s" "$o" | grep -q "no MTP layer"'
o=$(timeout 60 "$MOESERVE" generate --model "$M" --prompt-ids 5,6 --max-new-tokens 2 --tp 2 \
    --moe-a2a-backend mooncake --max-running-requests 64 --speculative-algorithm EAGLE \
    --speculative-num-steps 3 --deepep-max-dispatch-tokens-per-rank 128 2>&1)
rc=$?
t "dispatch capacity: running x draft tokens checked for every a2a alias" \
    '[ $rc -ne 0 ] && printf "%s" "$o" | grep -q "x 4 draft tokens"'

# a server: concurrent requests, a stop string, the same text as without speculation
srv() { # name, flags...: starts a server, runs the requests, leaves answers in $tmp/<name>.<i>
    local name=$1
    shift
    PORT=$(free_port)
    serve_up "$name" "$MOESERVE" serve --model-path "$M" --max-total-tokens 4096 --threads 1 \
        --skip-server-warmup --dtype float32 --enable-metrics --port "$PORT" "$@" || return 1
    local pids=()
    for i in 1 2 3 4; do
        stop=""
        [ "$i" = 2 ] && stop=',"stop":["e"]'
        curl -s -m 120 "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
            -d "{\"text\":\"hello world $i\",\"sampling_params\":{\"max_new_tokens\":$((10 + 5 * i)),\"temperature\":0$stop}}" \
            >"$tmp/$name.$i" &
        pids+=($!)
    done
    wait "${pids[@]}"
    timeout 120 "$MOESERVE" bench --backend sglang --base-url "http://127.0.0.1:$PORT" --num-prompts 2 \
        --random-input-len 8 --random-output-len 6 >"$tmp/$name.bench" 2>&1
    curl -s -m 10 "http://127.0.0.1:$PORT/metrics" >"$tmp/$name.metrics"
    curl -s -m 10 "http://127.0.0.1:$PORT/server_info" >"$tmp/$name.info"
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
}
srv plain && srv eagle --speculative-algorithm EAGLE --speculative-num-steps 3
export SGLANG_SIMULATE_ACC_LEN=2.5 # accepts drafts, so the log line's figures are not all 1 and 0
srv sim --speculative-algorithm EAGLE --speculative-num-steps 3 --decode-log-interval 4
unset SGLANG_SIMULATE_ACC_LEN
for i in 1 2 3 4; do
    a=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$tmp/plain.$i" 2>&1)
    b=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$tmp/eagle.$i" 2>&1)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "server request $i: the same text"; else
        bad "server request $i: the same text" "plain: $a
eagle: $b"; fi
done
# metrics: accepted <= drafted, accept length = 1 + accepted / verify steps, in /metrics,
# /server_info and each request's meta_info
chk=$(/usr/bin/python3 - "$tmp" <<'PY'
import json, re, sys
d = sys.argv[1]
m = open(d + "/eagle.metrics").read()
def val(name):
    x = re.search(r"^%s\{[^}]*\} ([0-9.e+-]+)$" % name, m, re.M)
    return float(x.group(1)) if x else None
v, dr, a, L = (val("sglang:spec_verify_steps_total"), val("sglang:spec_draft_tokens_total"),
               val("sglang:spec_accepted_tokens_total"), val("sglang:spec_accept_length"))
info = json.load(open(d + "/eagle.info"))
metas = [json.load(open("%s/eagle.%d" % (d, i)))["meta_info"] for i in (1, 2, 3, 4)]
ok = (None not in (v, dr, a, L) and v > 0 and dr > 0 and 0 <= a <= dr and abs(L - (1 + a / v)) < 1e-6
      and abs(info["avg_spec_accept_length"] - L) < 1e-6
      and all(x.get("spec_verify_ct", 0) > 0 and x["spec_accepted_tokens"] <= 3 * x["spec_verify_ct"]
              for x in metas if x["completion_tokens"] > 1)
      and sum(x.get("spec_verify_ct", 0) for x in metas) <= v)
print("OK" if ok else "BAD %s %s %s %s %s %s" % (v, dr, a, L, info.get("avg_spec_accept_length"), metas))
PY
)
t "metrics consistent ($chk)" '[ "$chk" = OK ]'
# SGLang's decode log line (scheduler_metrics_mixin's field order): accept len = 1 + accepted /
# verifies, accept rate = accepted / (verifies x S), so len - 1 = rate x S on every line, to the
# rounding of two printed decimals (0.005 on len, S x 0.005 through rate)
chk=$(/usr/bin/python3 - "$tmp/sim.log" 3 <<'PY'
import re, sys
S = int(sys.argv[2])
pat = re.compile(r"Decode batch\. #running-req: (\d+), #token: (\d+), token usage: ([0-9.]+), "
                 r"accept len: ([0-9.]+), accept rate: ([0-9.]+), gen throughput \(token/s\): "
                 r"([0-9.]+), #queue-req: (\d+)$")
lines = [l for l in open(sys.argv[1]) if "Decode batch" in l]
m = [pat.search(l.rstrip("\n")) for l in lines]
bad = [l for l, x in zip(lines, m) if not x or not (1 <= float(x.group(4)) <= S + 1
       and 0 <= float(x.group(5)) <= 1 and abs(float(x.group(4)) - 1 - S * float(x.group(5))) <= 0.005 * (S + 1) + 1e-9)]
some = any(x and float(x.group(4)) > 1.2 for x in m)
print("OK %d" % len(lines) if lines and some and not bad else "BAD %d lines: %s" % (len(lines), (bad or lines)[:2]))
PY
)
t "decode log line: SGLang's fields, accept len - 1 = accept rate x S ($chk)" '[ "${chk%% *}" = OK ]'
t "moeserve bench prints the server's accept length" 'grep -q "^Accept length:" "$tmp/eagle.bench"'
t "moeserve bench: no accept length without speculation" '! grep -q "^Accept length:" "$tmp/plain.bench"'
t "plain server: accept length 0 (no speculation)" 'grep -q "^sglang:spec_accept_length{.*} 0$" "$tmp/plain.metrics"'
report
