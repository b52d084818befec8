#!/usr/bin/env bash
# t_http_curl.sh — the echo server (build/tests/test_http --serve) driven by
# curl and bash's /dev/tcp: SSE framing over HTTP/1.1 (chunked) and HTTP/1.0
# (close-delimited), malformed JSON, a body over the limit, a chunked body, both
# Content-Length and Transfer-Encoding, a client that gives up mid-stream (its
# request is aborted), and SIGTERM (drain, exit 0).  Prints "N passed, N failed".
set -u
BUILD=${BUILD:-build}
dir=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
ECHO_STEP_US=3000 "$BUILD/tests/test_http" --serve "$dir/port" --max-body-bytes 65536 2>"$dir/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 600); do [ -s "$dir/port" ] && break; sleep 0.05; done # 30 s: slow under load and ASan
port=$(cat "$dir/port" 2>/dev/null)
[ -n "$port" ] || { cat "$dir/log"; echo "0 passed, 1 failed"; exit 1; }
url=http://127.0.0.1:$port

# 1. SSE stream, HTTP/1.1
out=$(curl -sN -m 10 "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"hi there"}],"stream":true}')
if [ "$(printf '%s\n' "$out" | grep -c '^data: ')" -ge 3 ] && [ "$(printf '%s' "$out" | tail -n 1)" = "data: [DONE]" ] \
    && ! printf '%s\n' "$out" | grep -v '^data: ' | grep -q .; then ok sse_http11; else bad sse_http11 "$out"; fi

# 2. SSE stream, HTTP/1.0 (no chunked encoding: the close ends the stream)
out=$(curl -sN -m 10 --http1.0 "$url/v1/completions" -d '{"prompt":"abc","stream":true}')
if printf '%s' "$out" | tail -n 1 | grep -q '^data: \[DONE\]$' && printf '%s' "$out" | grep -q '"text":"a"'; then ok sse_http10; else bad sse_http10 "$out"; fi

# 3. malformed JSON and wrong types: 400 with a JSON error
code=$(curl -s -o "$dir/b" -w '%{http_code}' -m 5 "$url/v1/completions" -d '{"prompt": "x",')
if [ "$code" = 400 ] && grep -q '"error"' "$dir/b"; then ok malformed; else bad malformed "$code $(cat "$dir/b")"; fi
code=$(curl -s -o "$dir/b" -w '%{http_code}' -m 5 "$url/generate" -d '{"text":"x","sampling_params":{"temperature":"warm"}}')
if [ "$code" = 400 ] && grep -q 'temperature' "$dir/b"; then ok wrong_type; else bad wrong_type "$code $(cat "$dir/b")"; fi

# 4. a body over the limit: 413; a chunked body: 411 (Content-Length required)
head -c 200000 /dev/zero | tr '\0' 'a' > "$dir/big"
code=$(curl -s -o "$dir/b" -w '%{http_code}' -m 10 "$url/v1/completions" --data-binary @"$dir/big")
if [ "$code" = 413 ]; then ok body_413; else bad body_413 "$code"; fi
code=$(curl -s -o "$dir/b" -w '%{http_code}' -m 10 "$url/v1/completions" -H 'Transfer-Encoding: chunked' --data-binary @"$dir/big")
if [ "$code" = 411 ] && grep -q "Content-Length" "$dir/b"; then ok chunked_411; else bad chunked_411 "$code"; fi

# 5. Content-Length and Transfer-Encoding together: 400
# (in a subshell: a refused connect or a write to a closed socket must fail
# this check, not end the script)
resp=$( (exec 3<>/dev/tcp/127.0.0.1/"$port" &&
    printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n' >&3 &&
    timeout 5 cat <&3) 2>&1 || true)
if printf '%s' "$resp" | head -n 1 | grep -q ' 400 '; then ok cl_and_te; else bad cl_and_te "$(printf '%s' "$resp" | head -n 1)"; fi

# 6. a client that gives up mid-stream: its request is aborted (running goes back to 0)
curl -sN -m 0.5 "$url/v1/completions" -d '{"prompt":"abcdef","max_tokens":3000,"ignore_eos":true,"stream":true}' > /dev/null 2>&1
running=1
for _ in $(seq 100); do
    running=$(curl -s -m 2 "$url/get_load" | grep -o '"num_running_reqs":[0-9]*' | head -n 1 | cut -d: -f2)
    [ "$running" = 0 ] && break
    sleep 0.05
done
if [ "$running" = 0 ]; then ok client_gone_aborts; else bad client_gone_aborts "running=$running"; fi

# 7. health still fine; SIGTERM drains a running stream and exits 0
code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$url/health")
[ "$code" = 200 ] && ok health_after || bad health_after "$code"
curl -sN -m 10 "$url/v1/completions" -d '{"prompt":"abc","max_tokens":100,"ignore_eos":true,"stream":true}' > "$dir/drain" &
cpid=$!
for _ in $(seq 100); do # wait until the stream is inside the engine
    curl -s -m 2 "$url/get_load" | grep -q '"num_running_reqs":1' && break
    sleep 0.02
done
kill -TERM $pid
wait $cpid
wait $pid
src=$?
if [ $src = 0 ] && grep -q '"finish_reason":"length"' "$dir/drain" && tail -n 2 "$dir/drain" | grep -q "^data: \[DONE\]$"; then ok sigterm_drain; else bad sigterm_drain "rc=$src $(tail -c 200 "$dir/drain")"; fi
report
[ $fail = 0 ]
