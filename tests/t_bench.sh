#!/usr/bin/env bash
# t_bench.sh — `moeserve bench` against tests/bench_double.py, a server double that streams SSE
# with known timing and records what it received: TTFT/ITL/TPOT/E2E within tolerances, token
# counts (usage, meta_info, tokenizer fallback), Poisson arrivals, max-concurrency, failures
# and timeouts, datasets, the JSON line, sweeps and their plot, and flag errors naming the flag.
set -u
BIN=${MOESERVE:-$PWD/${BUILD:-build}/moeserve}
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
DPID=
cleanup() {
    if [ -n "$DPID" ]; then kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"

$PY "$HERE/bench_double.py" "$TMP/port" 2>/dev/null &
DPID=$!
for _ in $(seq 100); do [ -f "$TMP/port" ] && break; sleep 0.05; done
if [ ! -f "$TMP/port" ]; then
    bad "test double did not start"
    report
    exit 1
fi
URL=http://127.0.0.1:$(cat "$TMP/port")

# config JSON: the double's timing and failure settings; every run() re-sends it (fresh stats)
CFGBODY='{}'
config() {
    CFGBODY=$1
    curl -s -X POST -H 'Content-Type: application/json' -d "$1" "$URL/config" >/dev/null
}

# run NAME ARGS...: one bench run (stdout, stderr, exit code, JSON lines, the double's stats)
run() {
    local name=$1
    shift
    LAST=$name
    config "$CFGBODY"
    "$BIN" bench --base-url "$URL" --output-file "$TMP/$name.jsonl" "$@" \
        >"$TMP/$name.out" 2>"$TMP/$name.err"
    echo $? >"$TMP/$name.rc"
    curl -s "$URL/stats" >"$TMP/$name.stats"
}

# check NAME EXPR: EXPR over the last run's r (last JSON line), rows (all), s (stats), out,
# err, rc
check() {
    local name=$1 expr=$2
    if NAME="$LAST" T="$TMP" $PY - "$expr" <<'EOF'; then ok "$name"; else
import json, os, sys
t, n = os.environ["T"], os.environ["NAME"]
def rd(p):
    try:
        return open(p).read()
    except OSError:
        return ""
rows = [json.loads(l) for l in rd(f"{t}/{n}.jsonl").splitlines() if l.strip()]
r = rows[-1] if rows else {}
s = json.loads(rd(f"{t}/{n}.stats") or "{}")
out, err, rc = rd(f"{t}/{n}.out"), rd(f"{t}/{n}.err"), int(rd(f"{t}/{n}.rc") or -1)
ok = bool(eval(sys.argv[1]))
if not ok:
    keys = ("completed", "failed", "total_output_tokens", "mean_ttft_ms", "mean_itl_ms",
            "mean_tpot_ms", "mean_e2e_latency_ms", "duration", "concurrency", "errors")
    print("  r:", {k: r.get(k) for k in keys})
    print("  s:", {k: s.get(k) for k in ("requests", "peak_active", "failed", "max_tokens")})
    print("  rc:", rc, "err:", err[-600:])
sys.exit(0 if ok else 1)
EOF
        bad "$name"
    fi
}


# 1. OpenAI completions: TTFT 100 ms, then a token every 20 ms; 8 requests, 4 at a time
config '{"ttft_ms": 100, "itl_ms": 20}'
run openai --backend openai --num-prompts 8 --random-input-len 16 --random-output-len 10 \
    --random-range-ratio 1 --max-concurrency 4
check openai_counts 'rc == 0 and r["completed"] == 8 and r["failed"] == 0 and r["total_output_tokens"] == 80 and r["total_input_tokens"] == 128 and s["requests"] == 9'
check openai_ttft '95 <= r["mean_ttft_ms"] <= 250 and r["p99_ttft_ms"] >= r["median_ttft_ms"]'
check openai_itl '18 <= r["mean_itl_ms"] <= 45 and 18 <= r["median_itl_ms"] <= 45'
check openai_tpot '18 <= r["mean_tpot_ms"] <= 45 and abs(r["mean_tpot_ms"] - r["mean_itl_ms"]) < 5'
check openai_e2e '280 <= r["mean_e2e_latency_ms"] <= 700'
check openai_throughput 'abs(r["output_throughput"] - 80 / r["duration"]) < 1e-6 * r["output_throughput"] and abs(r["request_throughput"] - 8 / r["duration"]) < 1e-9 * 8 / r["duration"] and 0.5 <= r["duration"] <= 1.6'
check openai_concurrency 's["peak_active"] == 4 and r["max_concurrent_requests"] == 4 and 3.0 <= r["concurrency"] <= 4.0'
check openai_request_fields 'set(s["models"]) == {"double-model"} and all(s["ignore_eos"]) and all(s["streams"]) and s["max_tokens"][0] == 10 and set(s["paths"]) == {"/v1/completions"}'
check openai_json_fields 'all(k in r for k in ["backend", "dataset_name", "request_rate", "max_concurrency", "completed", "total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput", "output_throughput", "duration", "concurrency"] + [f"{a}_{m}_ms" for a in ("mean", "median", "p90", "p99") for m in ("ttft", "tpot", "itl", "e2e_latency")]) and r["request_rate"] == "inf" and r["max_concurrency"] == 4'
check progress_lines '"8/8 requests done" in err'
check summary_labels 'all(("%s %s (ms):" % (q, m)) in out for m in ("E2E Latency", "TTFT", "TPOT", "ITL") for q in ("Mean", "Median", "P90", "P99")) and "P95 ITL (ms):" in out and "Max ITL (ms):" in out and "P95 TTFT" not in out'

# 2. chat: the role chunk with empty content arrives at once and must not count as TTFT
config '{"ttft_ms": 100, "itl_ms": 20}'
run chat --backend openai-chat --num-prompts 4 --random-input-len 8 --random-output-len 6 \
    --random-range-ratio 1 --warmup-requests 0
check chat_ttft 'rc == 0 and r["completed"] == 4 and 95 <= r["mean_ttft_ms"] <= 250 and 18 <= r["mean_itl_ms"] <= 45 and r["total_output_tokens"] == 24 and set(s["paths"]) == {"/v1/chat/completions"}'

# 3. SGLang /generate: 3 tokens per chunk every 30 ms → ITL 10 ms each; frames split mid-JSON
config '{"ttft_ms": 60, "itl_ms": 30, "tokens_per_chunk": 3, "split": true}'
run generate --backend sglang --num-prompts 4 --random-input-len 8 --random-output-len 9 \
    --random-range-ratio 1 --warmup-requests 0
check generate_itl_spread 'rc == 0 and r["completed"] == 4 and 9 <= r["mean_itl_ms"] <= 25 and 7 <= r["mean_tpot_ms"] <= 20 and r["total_output_tokens"] == 36 and 55 <= r["mean_ttft_ms"] <= 200 and set(s["paths"]) == {"/generate"}'

# 4. --tokenizer: exact prompt lengths; moeserve sends input_ids
if "$BIN" mkmodel --preset tiny-v3 --out "$TMP/model" >/dev/null 2>&1; then
    config '{"ttft_ms": 10, "itl_ms": 2}'
    run tok_ids --backend moeserve --tokenizer "$TMP/model" --num-prompts 6 \
        --random-input-len 40 --random-output-len 5 --random-range-ratio 1
    check tokenizer_input_ids 'rc == 0 and s["input_ids_lens"] == [40] * 7 and r["total_input_tokens"] == 240 and r["total_output_tokens_retokenized"] is not None'
    run tok_range --backend moeserve --tokenizer "$TMP/model/tokenizer.json" --num-prompts 30 \
        --random-input-len 40 --random-output-len 8 --random-range-ratio 0.5 --warmup-requests 0
    check tokenizer_range 'rc == 0 and all(20 <= n <= 40 for n in s["input_ids_lens"]) and len(set(s["input_ids_lens"])) > 3 and all(4 <= m <= 8 for m in s["max_tokens"]) and r["total_input_tokens"] == sum(s["input_ids_lens"])'
    config '{"ttft_ms": 10, "itl_ms": 2, "usage": false}'
    run tok_count --backend openai --tokenizer "$TMP/model" --num-prompts 3 \
        --random-input-len 30 --random-output-len 6 --random-range-ratio 1 --warmup-requests 0
    check tokenizer_counts_output 'rc == 0 and r["total_input_tokens"] == 90 and r["total_output_tokens"] == r["total_output_tokens_retokenized"] > 0'
else
    bad "mkmodel for a tokenizer"
fi

# 5. no usage and no tokenizer: SGLang's fallback, the requested output length
config '{"ttft_ms": 10, "itl_ms": 2, "usage": false}'
run nousage --backend openai --num-prompts 3 --random-input-len 8 --random-output-len 7 \
    --random-range-ratio 1 --warmup-requests 0
check output_len_fallback 'rc == 0 and r["total_output_tokens"] == 21 and r["total_output_tokens_retokenized"] is None'

# 6. Poisson arrivals at 25 req/s vs all at once
config '{"ttft_ms": 5, "itl_ms": 1}'
run poisson --backend openai --num-prompts 50 --random-input-len 4 --random-output-len 2 \
    --request-rate 25 --warmup-requests 0 --seed 3
check poisson_rate 'rc == 0 and r["completed"] == 50 and r["request_rate"] == 25 and (lambda a: 12 <= 49 / (a[-1] - a[0]) <= 50)(s["arrivals"])'
check poisson_gaps '(lambda g: 0.5 <= (sum((x - sum(g)/len(g))**2 for x in g)/len(g))**0.5 / (sum(g)/len(g)) <= 1.6)([b - a for a, b in zip(s["arrivals"], s["arrivals"][1:])])'
run burst --backend openai --num-prompts 20 --random-input-len 4 --random-output-len 2 \
    --warmup-requests 0
check burst_inf 'rc == 0 and s["arrivals"][-1] - s["arrivals"][0] < 0.5 and r["max_concurrent_requests"] == 20'

# 7. failures: every third request gets HTTP 500
config '{"ttft_ms": 5, "itl_ms": 1, "fail_every": 3}'
run fails --backend openai --num-prompts 9 --random-input-len 4 --random-output-len 3 \
    --random-range-ratio 1 --warmup-requests 0
check failed_counted 'rc == 0 and r["completed"] == 6 and r["failed"] == 3 and r["total_output_tokens"] == 18 and len(r["errors"]) == 3 and all("HTTP 500: injected failure" in e["error"] and e["count"] == 1 for e in r["errors"]) and "failed request" in out'

# 7b. errors inside a 200 stream: an error event (OpenAI), finish_reason abort (/generate)
config '{"ttft_ms": 5, "itl_ms": 1, "stream_error": true}'
run stream_err --backend openai --num-prompts 2 --random-input-len 4 --random-output-len 3 \
    --warmup-requests 0
check stream_error_event 'rc != 0 and r["failed"] == 2 and "server error: mid-stream failure" in r["errors"][0]["error"]'
run gen_abort --backend sglang --num-prompts 2 --random-input-len 4 --random-output-len 3 \
    --warmup-requests 0
check generate_abort 'rc != 0 and r["failed"] == 2 and "server abort: aborted by the double" in r["errors"][0]["error"]'

# 8. non-streamed replies: TTFT = E2E
config '{"ttft_ms": 50, "itl_ms": 10}'
run nostream --backend openai --disable-stream --num-prompts 3 --random-input-len 4 \
    --random-output-len 5 --random-range-ratio 1 --warmup-requests 0 \
    --extra-request-body '{"x_extra": 7}'
check disable_stream 'rc == 0 and r["completed"] == 3 and abs(r["mean_ttft_ms"] - r["mean_e2e_latency_ms"]) < 1e-6 and 85 <= r["mean_e2e_latency_ms"] <= 250 and not any(s["streams"]) and r["total_output_tokens"] == 15'
check extra_request_body 's["extra"] == [7, 7, 7]'

# 9. goodput: TTFT 30 ms meets a 250 ms SLO, misses a 20 ms one
config '{"ttft_ms": 30, "itl_ms": 5}'
run slo --backend openai --num-prompts 4 --random-input-len 4 --random-output-len 3 \
    --random-range-ratio 1 --warmup-requests 0 --slo ttft:250,tpot:500
check goodput 'rc == 0 and r["good_requests"] == 4 and abs(r["request_goodput"] - r["request_throughput"]) < 1e-9 and r["slo"] == {"ttft_ms": 250, "tpot_ms": 500}'
run slo_tight --backend openai --num-prompts 4 --random-input-len 4 --random-output-len 3 \
    --random-range-ratio 1 --warmup-requests 0 --slo ttft:20
check goodput_tight 'rc == 0 and r["good_requests"] == 0 and r["request_goodput"] == 0'

# 10. sweeps: one JSON line per point, a table and a plot
config '{"ttft_ms": 20, "itl_ms": 5}'
run sweep --backend openai --num-prompts 8 --random-input-len 4 --random-output-len 4 \
    --random-range-ratio 1 --warmup-requests 0 --sweep concurrency:1,2,4 --plot-file "$TMP/sweep.svg"
check sweep_rows 'rc == 0 and [x["max_concurrent_requests"] for x in rows] == [1, 2, 4] and [x["max_concurrency"] for x in rows] == [1, 2, 4] and all(x["completed"] == 8 for x in rows) and rows[0]["duration"] > rows[2]["duration"] and "out tok/s" in out'
check sweep_svg_plot 'open(t + "/sweep.svg").read().lstrip().startswith("<?xml") and "<svg" in open(t + "/sweep.svg").read()'
run sweep_rate --backend openai --num-prompts 6 --random-input-len 4 --random-output-len 2 \
    --random-range-ratio 1 --warmup-requests 0 --sweep rate:20,inf --plot-file "$TMP/sweep.png"
check sweep_rate_png 'rc == 0 and [x["request_rate"] for x in rows] == [20, "inf"] and open(t + "/sweep.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"'

# 11. generated-shared-prefix: 2 groups x 3 questions, each group's system prompt reused 3 times
config '{"ttft_ms": 5, "itl_ms": 1}'
run gsp --backend openai --dataset-name generated-shared-prefix --gsp-num-groups 2 \
    --gsp-prompts-per-group 3 --gsp-system-prompt-len 12 --gsp-question-len 4 \
    --gsp-output-len 3 --warmup-requests 0
check gsp_groups 'rc == 0 and r["completed"] == 6 and r["total_output_tokens"] == 18 and sorted(s["prefixes"].count(p) for p in set(s["prefixes"])) == [3, 3] and r["dataset_name"] == "generated-shared-prefix"'

# 12. ShareGPT file: conversations with < 2 turns or a too-short turn are dropped
cat >"$TMP/sharegpt.json" <<'EOF'
[{"id": "a", "conversations": [{"from": "human", "value": "What is the capital city of France, and why?"},
                               {"from": "gpt", "value": "Paris is the capital of France for many reasons."}]},
 {"id": "b", "conversations": [{"from": "human", "value": "Only one turn here, nothing else"}]},
 {"id": "c", "conversations": [{"from": "human", "value": "Say something short to me please"},
                               {"from": "gpt", "value": "ok"}]},
 {"id": "d", "conversations": [{"from": "human", "value": "Tell me about the moon and the tides."},
                               {"from": "gpt", "value": "The moon pulls the oceans and makes tides."}]},
 {"id": "e", "conversations": [{"from": "human", "value": "Write a haiku about autumn leaves"},
                               {"from": "gpt", "value": "Red leaves drift and fall, quiet paths of gold."}]}]
EOF
run sharegpt --backend openai --dataset-name sharegpt --dataset-path "$TMP/sharegpt.json" \
    --num-prompts 10 --warmup-requests 0
check sharegpt_filter 'rc == 0 and r["completed"] == 3 and s["requests"] == 3'
run sharegpt_out --backend openai --dataset-name sharegpt --dataset-path "$TMP/sharegpt.json" \
    --num-prompts 10 --warmup-requests 0 --sharegpt-output-len 5
check sharegpt_output_len 'rc == 0 and r["completed"] == 4 and s["max_tokens"] == [5] * 4'

# 13. flag errors name the flag; --help lists the flags
fails() {
    local name=$1 needle=$2
    shift 2
    if "$BIN" bench --base-url "$URL" "$@" >/dev/null 2>"$TMP/ferr"; then
        bad "$name (exit 0)"
    elif grep -qF -- "$needle" "$TMP/ferr"; then
        ok "$name"
    else
        bad "$name"
        cat "$TMP/ferr"
    fi
}
fails bad_rate --request-rate --request-rate abc
fails bad_concurrency --max-concurrency --max-concurrency 0
fails bad_backend --backend --backend nope
fails bad_dataset --dataset-name --dataset-name nope
fails sharegpt_needs_path --dataset-path --dataset-name sharegpt
fails sharegpt_missing_file --dataset-path --dataset-name sharegpt --dataset-path "$TMP/none.json"
fails bad_ratio --random-range-ratio --random-range-ratio 2
fails bad_slo --slo --slo ttft
fails bad_sweep_axis --sweep --sweep foo:1
fails bad_sweep_value --sweep --sweep concurrency:0
fails bad_extra --extra-request-body --extra-request-body '[1]'
fails bad_tokenizer --tokenizer --tokenizer "$TMP/none.json"
fails unknown_flag --bogus-flag --bogus-flag 1
fails missing_value --num-prompts --num-prompts
if "$BIN" bench --help | grep -q -- "--gsp-system-prompt-len"; then ok help; else bad help; fi

# 14. nothing listening: the warmup fails with curl's reason
"$BIN" bench --backend openai --base-url http://127.0.0.1:1 --num-prompts 2 >/dev/null 2>"$TMP/refused.err"
echo $? >"$TMP/refused.rc"
LAST=refused
check connect_refused 'rc != 0 and "warmup failed" in err and "connect" in err.lower()'

# 15. the real server: every backend against `moeserve serve` on a tiny random model
if [ -d "$TMP/model" ] && "$BIN" serve --help >/dev/null 2>&1; then
    "$BIN" serve --model-path "$TMP/model" --port 0 --threads 1 >"$TMP/serve.log" 2>&1 &
    SPID=$!
    SURL=
    for _ in $(seq 150); do
        SURL=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$TMP/serve.log" | sed 's/listening on //')
        [ -n "$SURL" ] && break
        sleep 0.1
    done
    for b in moeserve sglang openai openai-chat; do
        LAST=real_$b
        "$BIN" bench --base-url "$SURL" --backend "$b" --tokenizer "$TMP/model" --num-prompts 4 \
            --random-input-len 16 --random-output-len 4 --random-range-ratio 1 \
            --output-file "$TMP/$LAST.jsonl" >"$TMP/$LAST.out" 2>"$TMP/$LAST.err"
        echo $? >"$TMP/$LAST.rc"
        check real_server_$b 'rc == 0 and r["completed"] == 4 and r["failed"] == 0 and r["total_output_tokens"] == 16 and r["total_input_tokens"] == 64 and r["mean_ttft_ms"] > 0 and r["total_input_tokens_server"] is not None'
    done
    kill "$SPID" 2>/dev/null
    wait "$SPID" 2>/dev/null
else
    echo "skip real_server (no model or no serve command)"
fi

# 15. timeouts are failures with a message (last: the double keeps sleeping afterwards)
config '{"ttft_ms": 3000, "itl_ms": 1}'
run timeout --backend openai --num-prompts 2 --random-input-len 4 --random-output-len 2 \
    --warmup-requests 0 --request-timeout 0.3
check timeout_failed 'rc != 0 and r["completed"] == 0 and r["failed"] == 2 and "timeout after 0.3 s" in r["errors"][0]["error"] and "no request completed" in err'

report
