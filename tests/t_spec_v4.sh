#!/usr/bin/env bash
# t_spec_v4.sh — speculative decoding end to end on tiny-v4 (window 8, ratio-4 and
# ratio-128 layers, its random MTP block): greedy output identical with and without
# --speculative-algorithm EAGLE (S = 1, 3; S = 2 with a --speculative-token-map), NEXTN
# (S = 2) and NGRAM (S = 3), on one rank,
# --tp 2 and --tp 2 --dp 2 --enable-dp-attention --moe-a2a-backend deepep (--dtype
# float32), for prompts of 3 to 139 tokens in one batch (a repetitive one for the n-gram
# drafts) generating 30 tokens across the 4- and 128-token compression boundaries; the
# same through a server with concurrent requests and a stop string; S above V4's
# compressor-state spill (4) refused naming the flag.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
. "$(dirname "$0")/lib.sh"
serve_setup --preset tiny-v4 --seed 3
long=$(seq 2 140 | awk '{print ($1 * 37) % 1000 + 2}' | paste -sd,)
mid=$(seq 2 127 | awk '{print ($1 * 53) % 1000 + 2}' | paste -sd,)
P="--prompt-ids 5,6,7,8,9,10 --prompt-ids 11,12,13 --prompt-ids 3,4,5,3,4,5,3,4,5,3,4,5,3,4 --prompt-ids $mid --prompt-ids $long"
gen() { timeout 300 "$MOESERVE" generate --model "$M" $P --max-new-tokens 30 --dtype float32 --ids \
    --ignore-eos --threads 1 "$@" 2>"$tmp/err" | grep '^ids:'; }
seq 0 2 200 >"$tmp/map.txt" # a draft head over 101 ids (FR-Spec's hot vocabulary)
for L in "" "--tp 2" "--tp 2 --dp 2 --enable-dp-attention --moe-a2a-backend deepep"; do
    ref=$(gen $L)
    t "plain run [$L]" '[ "$(printf "%s\n" "$ref" | wc -l)" -eq 5 ]'
    for A in "EAGLE --speculative-num-steps 1" "EAGLE --speculative-num-steps 3" \
             "NEXTN --speculative-num-steps 2" "NGRAM --speculative-num-steps 3" \
             "EAGLE --speculative-num-steps 2 --speculative-token-map $tmp/map.txt"; do
        out=$(gen $L --speculative-algorithm $A)
        if [ -n "$out" ] && [ "$out" = "$ref" ]; then ok "greedy identical: $A [$L]"; else
            bad "greedy identical: $A [$L]" "$(diff <(echo "$ref") <(echo "$out"); tail -5 "$tmp/err")"; fi
    done
done
o=$(timeout 60 "$MOESERVE" generate --model "$M" --prompt-ids 5,6 --max-new-tokens 2 \
    --speculative-algorithm EAGLE --speculative-num-steps 5 2>&1)
rc=$?
t "V4: --speculative-num-steps 5 refused naming the flag" \
    '[ $rc -ne 0 ] && printf "%s" "$o" | grep -q -- "--speculative-num-steps 5"'

# a server: concurrent requests (one with a stop string), the same text as without speculation
srv() { # name, flags...
    local name=$1
    shift
    PORT=$(free_port)
    serve_up "$name" "$MOESERVE" serve --model-path "$M" --max-total-tokens 4096 --threads 1 \
        --skip-server-warmup --dtype float32 --port "$PORT" "$@" || return 1
    local pids=()
    for i in 1 2 3 4; do
        stop=""
        [ "$i" = 2 ] && stop=',"stop":["e"]'
        curl -s -m 120 "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
            -d "{\"text\":\"hello world $i $(printf 'ab%.0s' $(seq 1 $((i * 20))))\",\"sampling_params\":{\"max_new_tokens\":$((10 + 5 * i)),\"temperature\":0$stop}}" \
            >"$tmp/$name.$i" &
        pids+=($!)
    done
    wait "${pids[@]}"
    serve_down
}
srv plain && srv eagle --speculative-algorithm EAGLE --speculative-num-steps 3 &&
    srv ngram --speculative-algorithm NGRAM --speculative-num-steps 3
for i in 1 2 3 4; do
    a=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$tmp/plain.$i" 2>&1)
    for v in eagle ngram; do
        b=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$tmp/$v.$i" 2>&1)
        if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "server request $i ($v): the same text"; else
            bad "server request $i ($v): the same text" "plain: $a
$v: $b"; fi
    done
done
report
