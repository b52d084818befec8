#!/usr/bin/env bash
# t_serve.sh — the real server on loopback: tests/serve_e2e.py against a
# single-rank server and against a 2-rank DP-attention server under mpirun
# (self-relaunched), plus the official openai npm client, idle CPU, SIGTERM
# draining to a clean exit, and DP admission (total_requests, cache_aware:
# tests/serve_e2e.py --router).
set -u
MOESERVE=${MOESERVE:-build/moeserve}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; sleep 0.5; pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"
M=$tmp/model
"$MOESERVE" mkmodel --preset tiny-v3 --seed 7 --out "$M" 2>/dev/null || { echo "0 passed, 1 failed"; exit 1; }

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # $1 = log name, rest = flags; sets PORT and PID
    PORT=$(free_port)
    name=$1
    shift
    "$MOESERVE" serve --model-path "$M" --port "$PORT" "$@" >"$tmp/$name.log" 2>&1 &
    PID=$!
    pids+=("$PID")
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server did not start:"; tail -20 "$tmp/$name.log"; return 1
}
run_e2e() { # $1 = label, $2 = pool tokens, rest = extra args to the script
    label=$1; pool=$2; shift 2
    if /usr/bin/python3 tests/serve_e2e.py "http://127.0.0.1:$PORT" "$pool" "$@" >"$tmp/e2e.out" 2>&1; then
        ok "$label ($(tail -1 "$tmp/e2e.out"))"
    else
        bad "$label" "$(grep -E "FAIL|Traceback|Error" "$tmp/e2e.out" | head -20)"
    fi
}

run_router() { # $1 = the server's --load-balance-method
    if /usr/bin/python3 tests/serve_e2e.py "http://127.0.0.1:$PORT" "$POOL" --router "$1" >"$tmp/router.out" 2>&1; then
        ok "DP admission, $1 ($(tail -1 "$tmp/router.out"))"
    else
        bad "DP admission, $1" "$(grep -E "FAIL|Traceback|Error" "$tmp/router.out" | head -10)"
    fi
}

# a request that no DP rank's pool can hold: the rank's scheduler refuses it and the
# refusal comes back as its finish event: HTTP 400 naming the pool, within seconds
overflow() { # $1 = label, $2 = a DP rank for X-Data-Parallel-Rank (optional)
    t0=$SECONDS; rm -f "$tmp/ov.json" "$tmp/ov2.json"
    code=$(curl -s -m 30 -o "$tmp/ov.json" -w '%{http_code}' "http://127.0.0.1:$PORT/generate" \
        -H 'Content-Type: application/json' ${2:+-H "X-Data-Parallel-Rank: $2"} \
        -d '{"input_ids":[5,6,7,8],"sampling_params":{"max_new_tokens":3000,"temperature":0}}')
    took=$((SECONDS - t0))
    t "$1: pool overflow -> $code in ${took}s: $(head -c 160 "$tmp/ov.json")" \
        '[ "$code" = 400 ] && [ $took -le 5 ] && grep -q "KV pool of [0-9]* tokens per DP rank" "$tmp/ov.json"'
    code=$(curl -s -m 30 -o "$tmp/ov2.json" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" \
        -H 'Content-Type: application/json' -d '{"model":"m","prompt":"hello","max_tokens":3000}')
    t "$1: pool overflow on /v1/completions -> $code" '[ "$code" = 400 ] && grep -q "KV pool" "$tmp/ov2.json"'
    t "$1: serves after the refusals" '[ -n "$(curl -sf -m 30 "http://127.0.0.1:$PORT/generate" \
        -H "Content-Type: application/json" -d "{\"input_ids\":[5,6],\"sampling_params\":{\"max_new_tokens\":2}}")" ]'
}

POOL=1024
# --dtype float32: outputs must not depend on how requests are batched together
if start one --max-total-tokens $POOL --threads 2 --max-running-requests 64 --dtype float32 --max-connections 1024; then
    run_e2e "single rank" $POOL
    overflow "single rank"
    # idle CPU: no requests for 2 s -> the server process uses (almost) no CPU
    t0=$(awk '{print $14+$15}' /proc/$PID/stat); sleep 2; t1=$(awk '{print $14+$15}' /proc/$PID/stat)
    ticks=$((t1 - t0))
    t "idle server CPU: $ticks ticks in 2 s" '[ $ticks -le 10 ]'
    if [ ! -d tests/fixtures/node/node_modules/openai ]; then
        bad "openai npm client not installed (tests/fetch_fixtures.sh)"
    else
        if timeout 120 node tests/openai_real.js "http://127.0.0.1:$PORT/v1" >"$tmp/node.out" 2>&1; then
            ok "openai npm client ($(tail -1 "$tmp/node.out"))"
        else bad "openai npm client" "$(tail -10 "$tmp/node.out")"; fi
    fi
    kill -TERM "$PID"
    for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    if ! kill -0 "$PID" 2>/dev/null; then wait "$PID"; rc=$?; else rc=timeout; fi
    if [ "$rc" = 0 ]; then ok "SIGTERM: drained and exited 0"
    else bad "SIGTERM exit: $rc" "$(tail -5 "$tmp/one.log")"; fi
else
    bad "server did not start"
fi

if start dpa --max-total-tokens $POOL --threads 1 --tp 2 --dp 2 --enable-dp-attention --max-running-requests 64 --dtype float32 --max-connections 1024 --load-balance-method total_requests; then
    run_e2e "2-rank DP-attention (mpirun)" $POOL --quick --lb-total-requests
    overflow "2-rank DP-attention, refused by DP rank 1 (rank 1)" 1
    t "2-rank warm-up ran a prompt on both ranks: $(grep -o 'a [0-9]*-token prompt' "$tmp/dpa.log")" \
        'grep -q "warm-up: .* a [0-9]*-token prompt" "$tmp/dpa.log"'
    run_router total_requests
    kill -TERM "$PID"
    for _ in $(seq 1 150); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    if ! kill -0 "$PID" 2>/dev/null; then ok "2-rank server stopped on SIGTERM"
    else bad "2-rank server still running after SIGTERM"; fi
else
    bad "server did not start"
fi
# the warm-up before "ready": BF16 weights prepacked (panels, where the CPU
# has AVX512-BF16, the only ISA that reads them) and one prompt through the
# model (as long as the 256-token pool allows); none with --skip-server-warmup
gen() { curl -sf "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
    -d '{"input_ids":[5,6,7,8,9,10,11,12],"sampling_params":{"max_new_tokens":4,"temperature":0}}'; }
stop() { kill -TERM "$PID"; for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done; }
bf16=0; "$MOESERVE" version | grep -q "avx512bf16=1" && bf16=1
if start warm --max-total-tokens 256 --threads 2; then
    line=$(grep -o "warm-up: .*" "$tmp/warm.log")
    n=$(echo "$line" | sed -n 's/warm-up: \([0-9]*\) weight matrices.*/\1/p')
    toks=$(echo "$line" | sed -n 's/.* a \([0-9]*\)-token prompt.*/\1/p')
    t "warm-up prepacks the BF16 weights (avx512bf16: $bf16): $line" \
        '[ -n "$n" ] && if [ "$bf16" = 1 ]; then [ "$n" -gt 0 ]; else [ "$n" = 0 ]; fi'
    t "warm-up prompt fits the pool: $toks tokens" '[ -n "$toks" ] && [ "$toks" -gt 0 ] && [ "$toks" -le 240 ]'
    t "a request after the warm-up" '[ -n "$(gen)" ]'
    # the copies are made before the KV pool is sized, out of the same budget
    mib=$(sed -n 's/.*KV pool: .*(+ \([0-9.]*\) MiB prepacked).*/\1/p' "$tmp/warm.log")
    t "KV pool line counts the prepacked copies: $mib MiB" \
        '[ -n "$mib" ] && if [ "$bf16" = 1 ]; then [ "$mib" != 0.0 ]; else [ "$mib" = 0.0 ]; fi'
    stop
else
    bad "server did not start"
fi
if start nowarm --max-total-tokens 256 --threads 2 --skip-server-warmup; then
    t "--skip-server-warmup: no warm-up" '! grep -q "warm-up:" "$tmp/nowarm.log"'
    t "--skip-server-warmup: serves" '[ -n "$(gen)" ]'
    t "--skip-server-warmup: nothing prepacked" 'grep -q "KV pool: .*(+ 0.0 MiB prepacked" "$tmp/nowarm.log"'
    stop
else
    bad "server with --skip-server-warmup did not start"
fi
# cache-aware admission (sgl-router's policy) on the same 2-rank shape
if start dpc --max-total-tokens $POOL --threads 1 --tp 2 --dp 2 --enable-dp-attention --dtype float32 --load-balance-method cache_aware; then
    run_router cache_aware
    kill -TERM "$PID"
    for _ in $(seq 1 150); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
else
    bad "server did not start"
fi
report
