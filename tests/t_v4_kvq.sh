#!/usr/bin/env bash
# t_v4_kvq.sh — DeepSeek-V4's deployed cache formats on tiny-v4 through the real
# binaries: --kv-cache-dtype fp8_e4m3 (FP8 ds main entries, kernels/kvq.h: head_dim 64
# with 16 rope dims is 48 + 32 + 1 + 1 = 82 bytes) and --enable-deepseek-v4-fp4-indexer
# (MXFP4 index keys: 32 values in 16 + 1 bytes), alone and together:
#   bytes     the start-up log's bytes per token and /server_info's entry bytes per pool
#             follow the formats (F32: 256-byte entries, 128-byte keys; --kv-cache-dtype
#             fp8_e4m3 alone stores SGLang's FP8 index keys: 32 e4m3 + an f32 scale = 36);
#   quality   `perplexity --kl-base` against the F32 cache on 4 windows of 256 tokens:
#             mean KL and top-1 agreement within bounds 2-3x what was measured
#             (random weights: a chaotic model; measured FP8 0.0090 / 82 %, MXFP4
#             0.0224 / 71 %, both 0.0236 / 67 %; the larger model's figure is small-v4's
#             in bench/RESULTS.md);
#   prefix    a prefix hit with both formats returns the cold run's tokens and
#             log-probabilities (float32: within 1e-4), 256 tokens cached;
#   swa       --swa-full-tokens-ratio 0.01 with both: a 400-token request completes in a
#             26-token window pool;
#   refused   --enable-deepseek-v4-fp4-indexer on a V3 model, naming the flag.
# (tests/t_layouts.sh runs both formats on the V4 layouts against one rank.)
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
. "$(dirname "$0")/lib.sh"
serve_setup --preset tiny-v4 --dtype bf16 --seed 9
"$MOESERVE" mkmodel --preset tiny-v3 --seed 7 --out "$tmp/v3" 2>/dev/null ||
    { echo "0 passed, 1 failed"; exit 1; }
PY=/usr/bin/python3
FP8="--kv-cache-dtype fp8_e4m3"
FP4="--enable-deepseek-v4-fp4-indexer"

# bytes per token (whole-history streams: 2 CSA layers' c4 entries and keys per 4 tokens,
# 2 HCA layers' c128 entries per 128, the carry snapshot 2 x 6144 B per 2048 tokens, the
# window snapshot of 8 entries of each of the 5 layers per 2048)
per_tok() { echo "$1" | grep 'KV pool:' | sed 's/.* \([0-9]*\) B per token.*/\1/' | head -1; }
want() { $PY -c "import sys; e, k = $1, $2; print(int(2 * e / 4 + 2 * e / 128 + 2 * k / 4 + 2 * 6144 / 2048 + 5 * 8 * e / 2048))"; }
for c in "F32::256:128" "FP8:$FP8:82:36" "FP4:$FP4:256:17" "both:$FP8 $FP4:82:17"; do
    IFS=: read -r name flags e k <<<"$c"
    # shellcheck disable=SC2086
    out=$(timeout 60 "$MOESERVE" generate --model "$M" --dtype float32 --prompt-ids 5,6,7 \
          --max-new-tokens 2 --threads 1 $flags 2>&1)
    b=$(per_tok "$out")
    w=$(want "$e" "$k")
    t "bytes: $name cache $b B per token (entries $e B, keys $k B: $w)" '[ -n "$b" ] && [ "$b" = "$w" ]' ||
        printf '%s\n' "$out" | tail -3
done

# quality: KL against the F32 cache
cat /usr/lib/python3.11/hmac.py /usr/lib/python3.11/netrc.py >"$tmp/held.py"
pp=(perplexity --model "$M" --dtype float32 --file "$tmp/held.py" --ctx 256 --stride 128 --chunks 4
    --threads 2)
out=$(timeout 300 "$MOESERVE" "${pp[@]}" --save-logits "$tmp/base.lg" 2>&1)
t "quality: perplexity with the F32 cache" "echo \"\$out\" | grep -q '^result:'" || printf '%s\n' "$out" | tail -5
for c in "FP8:$FP8:0.02:0.70" "MXFP4:$FP4:0.06:0.55" "both:$FP8 $FP4:0.06:0.55"; do
    IFS=: read -r name flags klmax top1min <<<"$c"
    # shellcheck disable=SC2086
    out=$(timeout 300 "$MOESERVE" "${pp[@]}" $flags --kl-base "$tmp/base.lg" 2>&1)
    res=$(echo "$out" | grep '^result:')
    if [ -z "$res" ]; then
        bad "quality: perplexity with the $name cache" "$out"
        continue
    fi
    kl=$(echo "$res" | sed 's/.* kl_mean=\([0-9.]*\).*/\1/')
    top1=$(echo "$res" | sed 's/.* top1=\([0-9.]*\).*/\1/')
    t "quality: $name cache mean KL $kl <= $klmax, top-1 agreement $top1 >= $top1min" \
        "awk -v a=$kl -v b=$top1 'BEGIN { exit !(a > 0 && a <= $klmax && b >= $top1min) }'"
done

# /server_info: the entry bytes of each pool with both formats
PORT=$(free_port)
A=$($PY -c 'print(",".join(str((i * 53 + 7) % 1000 + 2) for i in range(300)))')
C=$($PY -c 'print(",".join(str((i * 53 + 7) % 1000 + 2) if i < 256 else str((i * 11) % 900 + 5) for i in range(300)))')
# shellcheck disable=SC2086
if serve_up hit "$MOESERVE" serve --model-path "$M" --port "$PORT" --threads 2 --page-size 1 \
        --dtype float32 $FP8 $FP4; then
    r=$(curl -s -m 10 "http://127.0.0.1:$PORT/server_info" | $PY -c '
import json, sys
j = json.load(sys.stdin)
b = {p["name"]: p["entry_bytes"] for p in j["kv_pools_per_dp_rank"]}
ok = b["window"] == b["c4"] == b["c128"] == 82 and b["index"] == 17
print(("ok " if ok else "BAD ") + " ".join("%s %g" % kv for kv in sorted(b.items())))' 2>&1)
    t "/server_info entry bytes: $r" '[ "${r#ok}" != "$r" ]'
    # prefix hits: a repeat of a 300-token prompt, and a prompt sharing its first 256 tokens
    comp() { curl -s -m 120 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": [$1], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 5}"; }
    comp "$A" >"$tmp/a_cold.json"
    comp "$A" >"$tmp/a_hit.json"
    comp "$C" >"$tmp/c_hit.json"
    curl -s -m 30 -X POST "http://127.0.0.1:$PORT/flush_cache" >/dev/null
    comp "$C" >"$tmp/c_cold.json"
    for x in a c; do
        r=$($PY tests/prefix_hit_compare.py "$tmp/${x}_cold.json" "$tmp/${x}_hit.json" 256 2>&1)
        t "prefix hit with FP8 entries and MXFP4 keys ($x): $r" '[ "${r#ok}" != "$r" ]'
    done
    serve_down
fi

# --swa-full-tokens-ratio with both formats: the window pool at its floor
PORT=$(free_port)
# shellcheck disable=SC2086
if serve_up swa "$MOESERVE" serve --model-path "$M" --port "$PORT" --threads 2 --page-size 1 \
        --max-total-tokens 512 --swa-full-tokens-ratio 0.01 --chunked-prefill-size 16 $FP8 $FP4; then
    w=$(curl -s -m 10 "http://127.0.0.1:$PORT/server_info" | $PY -c 'import json,sys; j=json.load(sys.stdin); print([p["tokens"] for p in j["kv_pools_per_dp_rank"] if p["name"] == "window"][0])' 2>&1)
    ids=$($PY -c "print(','.join(str((j * 17) % 1000 + 2) for j in range(300)))")
    c=$(curl -s -m 300 "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
        -d "{\"input_ids\": [$ids], \"sampling_params\": {\"max_new_tokens\": 100, \"temperature\": 0, \"ignore_eos\": true}}" |
        $PY -c 'import json,sys; print(json.load(sys.stdin)["meta_info"]["completion_tokens"])' 2>&1)
    t "--swa-full-tokens-ratio 0.01 with both formats: $c tokens in a $w-token window pool" \
        '[ "$c" = 100 ] && [ "$w" = 26 ]'
    serve_down
fi

out=$(timeout 60 "$MOESERVE" serve --model-path "$tmp/v3" --port 1 $FP4 2>&1)
rc=$?
t "V3: $FP4 refused ($(echo "$out" | tail -1 | head -c 100))" \
    '[ $rc -ne 0 ] && echo "$out" | grep -q -- "$FP4: not implemented for this model"'
report
