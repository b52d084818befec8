#!/usr/bin/env bash
# t_v4_cache.sh — DeepSeek-V4's KV cache on tiny-v4 through the real binaries: the
# compressed-state dtype (--compress-state-dtype bf16 and SGLANG_DSV4_COMPRESS_STATE_DTYPE
# give the same logits, close to the FP32 state's and not equal to them); the V4-only
# cache flags refused on a V3 model; the capacity per pool and the maximum concurrency
# in /server_info; the 1×, 2×, 4×, 8×, 16× admission test (concurrent requests whose
# tokens add up to k × max_total_num_tokens all complete); --swa-full-tokens-ratio
# sizing the window pool, and a window pool of a few dozen tokens serving a request
# ten times longer (its window pages are released while it runs); prefix hits on V4
# (the repeat of a prompt, a prompt sharing its first 256 tokens, and one sharing an
# earlier unit of a longer cached prompt, whose window slid out long before: the window
# and carry snapshots of every unit) equal to cold runs, cached_tokens what was skipped.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
. "$(dirname "$0")/lib.sh"
serve_setup --preset tiny-v4 --dtype bf16 --seed 9
"$MOESERVE" mkmodel --preset tiny-v3 --seed 7 --out "$tmp/v3" 2>/dev/null ||
    { echo "0 passed, 1 failed"; exit 1; }
PY=/usr/bin/python3

# the compressor state in BF16: the flag and SGLang's variable agree; the logits move a little
P=$($PY -c 'print(",".join(str((i * 53 + 7) % 1000 + 2) for i in range(300)))')
g=(generate --model "$M" --dtype float32 --prompt-ids "$P" --max-new-tokens 6 --ignore-eos --ids --threads 2)
timeout 120 "$MOESERVE" "${g[@]}" --dump-logits "$tmp/f32.jsonl" >/dev/null 2>&1
timeout 120 "$MOESERVE" "${g[@]}" --compress-state-dtype bf16 --dump-logits "$tmp/bf16.jsonl" \
    >/dev/null 2>"$tmp/bf16.err"
SGLANG_DSV4_COMPRESS_STATE_DTYPE=bf16 timeout 120 "$MOESERVE" "${g[@]}" \
    --dump-logits "$tmp/env.jsonl" >/dev/null 2>&1
d=$($PY - "$tmp/f32.jsonl" "$tmp/bf16.jsonl" <<'EOF' 2>&1
import json, sys
a, b = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:3])
assert len(a) == len(b) == 6, (len(a), len(b))
d = max(max(abs(x - y) for x, y in zip(p["logits"], q["logits"])) / max(abs(x) for x in p["logits"])
        for p, q in zip(a, b))
print("%.3g" % d)
EOF
)
t "compressor state bf16: max relative logit change $d (0 < d < 0.02)" \
    "$PY -c 'import sys; d=float(sys.argv[1]); sys.exit(not 0 < d < 0.02)' '$d' 2>/dev/null"
t "SGLANG_DSV4_COMPRESS_STATE_DTYPE=bf16 = --compress-state-dtype bf16" \
    '[ -s "$tmp/env.jsonl" ] && cmp -s "$tmp/env.jsonl" "$tmp/bf16.jsonl"'
t "the bf16 state is not named as an ignored variable" '! grep -q "does not read" "$tmp/bf16.err"'

# the V4 cache flags on a V3 model: refused, naming the flag
for f in "--swa-full-tokens-ratio 0.1" "--compress-state-dtype bf16"; do
    out=$(timeout 60 "$MOESERVE" serve --model-path "$tmp/v3" --port 1 $f 2>&1)
    rc=$?
    t "V3: $f refused ($(echo "$out" | tail -1 | head -c 120))" \
        '[ $rc -ne 0 ] && echo "$out" | grep -q -- "${f%% *}.*not implemented for this model"'
done

T=512
info() { curl -s -m 10 "http://127.0.0.1:$PORT/server_info"; }
PORT=$(free_port)
if serve_up v4 "$MOESERVE" serve --model-path "$M" --port "$PORT" --threads 2 --page-size 1 \
        --max-total-tokens $T --max-running-requests 16; then
    info >"$tmp/info.json"
    r=$($PY - "$tmp/info.json" $T <<'EOF' 2>&1
import json, sys
j = json.load(open(sys.argv[1])); T = int(sys.argv[2])
pools = {p["name"]: p for p in j["kv_pools_per_dp_rank"]}
assert sorted(pools) == ["c128", "c4", "carry", "index", "window", "wsnap"], sorted(pools)
assert j["max_total_num_tokens"] == T and j["num_dp_ranks"] == 1, j["max_total_num_tokens"]
for n in ("c4", "c128", "index", "carry", "wsnap"):   # whole history: T tokens (page 1: 4, 128 a page)
    assert pools[n]["window"] == 0 and pools[n]["tokens"] == T, (n, pools[n])
assert pools["c4"]["page_tokens"] == 4 and pools["c128"]["page_tokens"] == 128
# the carry snapshot per 128 tokens of each CSA layer: 2 compressors x kv, score [4][2 d] f32
assert pools["carry"]["page_tokens"] == 128 and pools["carry"]["num_layers"] == 2
assert pools["carry"]["entry_bytes"] == (2 * 4 * 2 * 64 + 2 * 4 * 2 * 32) * 4, pools["carry"]
# the window snapshot per 128 tokens of every layer: the 8 entries before the unit (BF16)
assert pools["wsnap"]["page_tokens"] == 128 and pools["wsnap"]["num_layers"] == 5
assert pools["wsnap"]["entry_bytes"] == 8 * 64 * 2, pools["wsnap"]
w = pools["window"]
assert w["window"] == 8 and w["num_layers"] == 5 and w["page_tokens"] == 1, w
c = j["max_concurrency_per_dp_rank"]   # 16 windows of 10 pages fit; the histories hold 512
assert c["context_length"] == j["context_length"] and abs(c["requests"] - T / c["context_length"]) < 1e-9, c
assert c["max_position_embeddings"] == 4096 and c["requests_at_max_position"] < 1, c
assert j["swa_full_tokens_ratio"] is None
print("pools %s, concurrency %.3f at %d tokens" % (
    ", ".join("%s %d" % (n, p["tokens"]) for n, p in sorted(pools.items())), c["requests"], c["context_length"]))
EOF
)
    t "/server_info: capacity per pool, concurrency ($r)" '[ "${r#pools}" != "$r" ]'
    # the max_position_embeddings request's attention cost, recomputed from config.json:
    # a decode token at its end reads the window's 8 entries of every layer, every c128
    # entry, the indexer's top-k of the c4 entries and every index key; 4 H d FLOPs per
    # main entry, 2 n_I (d_I + 1) per key; the prefill sums each position's
    r=$($PY - "$tmp/info.json" "$M/config.json" <<'EOF' 2>&1
import json, sys
j = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2]))
N = j["max_position_embeddings"]; L = c["num_hidden_layers"]; rat = c["compress_ratios"][:L]
W, k = c["sliding_window"], c["index_topk"]
eb = {p["name"]: p["entry_bytes"] for p in j["kv_pools_per_dp_rank"]}
fm = 4 * c["num_attention_heads"] * c["head_dim"]; fi = 2 * c["index_n_heads"] * (c["index_head_dim"] + 1)
def reads(n):   # entries read by the query at position n - 1, by pool (over all layers)
    return {"window": L * min(n, W), "c128": rat.count(128) * (n // 128),
            "c4": rat.count(4) * min(n // 4, k), "index": rat.count(4) * (n // 4)}
r = reads(N)
fl = {"window": fm, "c128": fm, "c4": fm, "index": fi}
got = j["max_position_cost_per_attention_rank"]
want_b = {n: r[n] * eb[n] for n in r}
assert got["tokens"] == N and got["decode_read_bytes_by_pool"] == want_b, (got, want_b)
assert abs(got["decode_read_bytes"] - sum(want_b.values())) < 1e-6
assert abs(got["decode_flops"] - sum(r[n] * fl[n] for n in r)) < 1e-3
pf = sum(sum(reads(m)[n] * fl[n] for n in r) for m in range(1, N + 1))
assert abs(got["prefill_flops"] - pf) <= 1e-9 * pf, (got["prefill_flops"], pf)
print("ok decode %.0f B, %.3g FLOP; prefill %.4g FLOP at %d tokens" % (got["decode_read_bytes"], got["decode_flops"], pf, N))
EOF
)
    t "/server_info: the max_position_embeddings request's attention cost ($r)" '[ "${r#ok}" != "$r" ]'
    t "start-up log: that cost" 'grep -q "a 4096-token request.s attention per rank (weights not included): a decode token at its end reads" "$tmp/v4.log"'
    t "start-up log: maximum concurrency and the max_position_embeddings request" \
        'grep -q "maximum concurrency for 4096-token requests" "$tmp/v4.log" && grep -q "a 4096-token request (max_position_embeddings) holds .* refused at admission" "$tmp/v4.log"'
    # admission: 2k concurrent requests of T/2 tokens each (k × T in all) all complete
    for k in 1 2 4 8 16; do
        n=$((2 * k))
        cpids=()
        for i in $(seq 1 $n); do
            ids=$($PY -c "print(','.join(str((j * 31 + $i * 7) % 1000 + 2) for j in range($T // 2 - 8)))")
            curl -s -m 300 "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
                -d "{\"input_ids\": [$ids], \"sampling_params\": {\"max_new_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}}" \
                >"$tmp/adm_${k}_$i.json" &
            cpids+=($!)
        done
        wait "${cpids[@]}"
        done_n=0
        for i in $(seq 1 $n); do
            $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(d["meta_info"]["completion_tokens"] != 8)' \
                "$tmp/adm_${k}_$i.json" 2>/dev/null && done_n=$((done_n + 1))
        done
        t "admission ${k}x max_total_num_tokens: $n requests of $((T / 2)) tokens, $done_n completed" \
            '[ $done_n -eq $n ]'
    done
    serve_down
else
    bad "serve did not start" "$(tail -5 "$tmp/v4.log")"
fi

# prefix hits (page size 1: share units of 128 tokens): a repeat of a 300-token prompt
# matches 256 tokens (the window and compressor carry snapshots there), a prompt sharing
# only those 256 tokens too, and a 300-token prompt sharing the first 300 tokens of a
# cached 700-token one (whose window at 256 slid out while it ran) matches 256 of them,
# an earlier unit than its last (640); all give the cold run's tokens and
# log-probabilities (float32: within 1e-4)
PORT=$(free_port)
if serve_up hit "$MOESERVE" serve --model-path "$M" --port "$PORT" --threads 2 --page-size 1 \
        --dtype float32; then
    A=$($PY -c 'print(",".join(str((i * 53 + 7) % 1000 + 2) for i in range(300)))')
    C=$($PY -c 'print(",".join(str((i * 53 + 7) % 1000 + 2) if i < 256 else str((i * 11) % 900 + 5) for i in range(300)))')
    comp() { curl -s -m 120 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": [$1], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 5}"; }
    comp "$A" >"$tmp/a_cold.json"
    comp "$A" >"$tmp/a_hit.json"
    comp "$C" >"$tmp/c_hit.json"
    curl -s -m 30 -X POST "http://127.0.0.1:$PORT/flush_cache" >/dev/null
    comp "$C" >"$tmp/c_cold.json"
    L=$($PY -c 'print(",".join(str((i * 29 + 3) % 1000 + 2) for i in range(700)))')
    E=$($PY -c 'print(",".join(str((i * 29 + 3) % 1000 + 2) if i < 300 else str((i * 13) % 900 + 7) for i in range(300)))')
    comp "$L" >/dev/null
    comp "$E" >"$tmp/e_hit.json"
    curl -s -m 30 -X POST "http://127.0.0.1:$PORT/flush_cache" >/dev/null
    comp "$E" >"$tmp/e_cold.json"
    for x in a c e; do
        r=$($PY tests/prefix_hit_compare.py "$tmp/${x}_cold.json" "$tmp/${x}_hit.json" 256 2>&1)
        t "prefix hit ($x): $r" '[ "${r#ok}" != "$r" ]'
    done
    serve_down
else
    bad "serve (prefix hits) did not start" "$(tail -5 "$tmp/hit.log")"
fi

# --swa-full-tokens-ratio 0.01: the window pool is its floor, one request's window
# (8 tokens + a page at each end: the window snapshots make a second one needless) and one 16-token chunk: 26 tokens; a 400-token
# request completes in it only because its window pages are released as it runs
PORT=$(free_port)
if serve_up swa "$MOESERVE" serve --model-path "$M" --port "$PORT" --threads 2 --page-size 1 \
        --max-total-tokens $T --swa-full-tokens-ratio 0.01 --chunked-prefill-size 16; then
    info >"$tmp/swa.json"
    w=$($PY -c 'import json,sys; j=json.load(open(sys.argv[1])); print([p["tokens"] for p in j["kv_pools_per_dp_rank"] if p["name"] == "window"][0], j["swa_full_tokens_ratio"])' "$tmp/swa.json" 2>&1)
    t "--swa-full-tokens-ratio 0.01: window pool $w (26 tokens, ratio 0.01)" '[ "$w" = "26 0.01" ]'
    ids=$($PY -c "print(','.join(str((j * 17) % 1000 + 2) for j in range(300)))")
    curl -s -m 300 "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
        -d "{\"input_ids\": [$ids], \"sampling_params\": {\"max_new_tokens\": 100, \"temperature\": 0, \"ignore_eos\": true}}" \
        >"$tmp/long.json"
    c=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["meta_info"]["completion_tokens"])' "$tmp/long.json" 2>&1)
    t "a 400-token request in a 26-token window pool: $c tokens generated" '[ "$c" = 100 ]'
    serve_down
else
    bad "serve --swa-full-tokens-ratio did not start" "$(tail -5 "$tmp/swa.log")"
fi
report
