#!/usr/bin/env bash
# t_openai_node.sh — the official `openai` npm client against the echo server
# (build/tests/test_http --serve), as a V3 model (tests/openai_client.js) and as
# a DeepSeek-V4 one with the V4 parsers (tests/openai_v4.js: DSML tool calls and
# reasoning, streamed and not).  Needs tests/fixtures/node/node_modules/openai:
#   npm install --no-audit --no-fund --no-save --prefix tests/fixtures/node openai@4
# Without it the test reports a skip (0 passed, 0 failed).
set -u
BUILD=${BUILD:-build}
if [ ! -d tests/fixtures/node/node_modules/openai ] || ! command -v node >/dev/null; then
    echo "SKIP: openai npm package not installed (see header)"
    echo "0 passed, 0 failed"
    exit 0
fi
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
"$BUILD/tests/test_http" --serve "$dir/port" --api-key k --tool-call-parser deepseekv31 \
    --served-model-name echo-model 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
[ -s "$dir/port" ] || { cat "$dir/log"; echo "0 passed, 1 failed"; exit 1; }
timeout 60 node tests/openai_client.js "$(cat "$dir/port")" >"$dir/out1"
rc=$?
kill -TERM $pid
wait $pid
src=$?
if [ $src -ne 0 ]; then echo "server exited with $src after SIGTERM"; cat "$dir/log"; echo "0 passed, 1 failed"; exit 1; fi
rm -f "$dir/port"
"$BUILD/tests/test_http" --serve "$dir/port" --model-family deepseek_v4 --tool-call-parser deepseekv4 \
    --reasoning-parser deepseek-v4 --served-model-name echo-v4 2>"$dir/log4" &
pid=$!
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
[ -s "$dir/port" ] || { cat "$dir/log4"; echo "0 passed, 1 failed"; exit 1; }
timeout 60 node tests/openai_v4.js "$(cat "$dir/port")" >"$dir/out2"
rc2=$?
kill -TERM $pid
wait $pid
src=$?
if [ $src -ne 0 ]; then echo "V4 server exited with $src after SIGTERM"; cat "$dir/log4"; echo "0 passed, 1 failed"; exit 1; fi
p=$(( $(awk '{print $1}' "$dir/out1") + $(awk '{print $1}' "$dir/out2") ))
f=$(( $(awk '{print $3}' "$dir/out1") + $(awk '{print $3}' "$dir/out2") ))
echo "$p passed, $f failed"
[ $rc -eq 0 ] && [ $rc2 -eq 0 ]
