#!/usr/bin/env bash
# t_v4.sh — DeepSeek-V4 end to end on tiny-v4: an fp8-fp4 checkpoint (FP4 experts) generating
# in auto mode (the AVX-512 FP4 kernel; its numbers are checked in t_v4ref.sh); `generate`
# greedy under --dtype float32 the same whether the prompt is prefilled in one chunk
# or in chunks of 7 (--chunked-prefill-size); `serve` answers the same completion twice
# with the same tokens, the second time from a prefix hit of 128 tokens (the share unit
# at page size 1: the window before it and the compressor carry snapshot there are kept).
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
PID=
trap serve_cleanup EXIT
M=$tmp/model
"$MOESERVE" mkmodel --preset tiny-v4 --dtype bf16 --seed 9 --out "$M" 2>/dev/null ||
    { echo "0 passed, 1 failed"; exit 1; }
"$MOESERVE" mkmodel --preset tiny-v4 --dtype fp8-fp4 --seed 9 --out "$tmp/x" >/dev/null 2>&1
P4=$(seq -s, 3 70)
out=$(timeout 120 "$MOESERVE" generate --model "$tmp/x" --prompt-ids "$P4" --max-new-tokens 12 \
      --ignore-eos --ids --threads 2 2>&1)
t "fp8-fp4 checkpoint (expert_dtype fp4) generates in auto mode" \
  'grep -q "\"expert_dtype\": \"fp4\"" "$tmp/x/config.json" && echo "$out" | grep -q "decode_tokens=11"'

P=$(/usr/bin/python3 -c 'print(",".join(str((i * 53 + 7) % 1000 + 2) for i in range(140)))')
g=(generate --model "$M" --dtype float32 --prompt-ids "$P" --max-new-tokens 12 --ignore-eos --ids --threads 2)
a=$(timeout 120 "$MOESERVE" "${g[@]}" 2>/dev/null | grep '^ids:')
b=$(timeout 120 "$MOESERVE" "${g[@]}" --chunked-prefill-size 7 2>/dev/null | grep '^ids:')
t "generate: 140-token prompt, one chunk = chunks of 7 ($a)" '[ -n "$a" ] && [ "$a" = "$b" ]'

PORT=$(free_port)
if serve_up v4 "$MOESERVE" serve --model-path "$M" --dtype float32 --port "$PORT" --threads 2 \
        --page-size 1; then
    req() {
        curl -s -m 60 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\": [${P}], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}"
    }
    r1=$(req)
    r2=$(req)
    t1=$(echo "$r1" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["choices"][0]["text"], d["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))' 2>&1)
    t2=$(echo "$r2" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["choices"][0]["text"], d["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))' 2>&1)
    t "serve: the same completion twice, the same text, cached_tokens 128 the second time ($t2)" \
        '[ -n "$t1" ] && [ "${t1% *}" = "${t2% *}" ] && [ "${t1##* }" = 0 ] && [ "${t2##* }" = 128 ]'
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
else
    bad "serve did not start"
fi
report
