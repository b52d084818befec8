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
# run_client NAME CLIENT.js SERVER-FLAGS...: one echo server, one client run;
# the client's "N passed, N failed" line goes to $dir/NAME.out
run_client() {
    local name=$1 js=$2
    shift 2
    rm -f "$dir/port"
    "$BUILD/tests/test_http" --serve "$dir/port" "$@" 2>"$dir/$name.log" &
    pid=$!
    for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
    [ -s "$dir/port" ] || { cat "$dir/$name.log"; echo "0 passed, 1 failed"; exit 1; }
    timeout 60 node "$js" "$(cat "$dir/port")" >"$dir/$name.out"
    local rc=$?
    kill -TERM $pid
    wait $pid
    local src=$?
    if [ $src -ne 0 ]; then
        echo "$name server exited with $src after SIGTERM"; cat "$dir/$name.log"
        echo "0 passed, 1 failed"; exit 1
    fi
    return $rc
}
run_client v3 tests/openai_client.js --api-key k --tool-call-parser deepseekv31 \
    --served-model-name echo-model
rc=$?
run_client v4 tests/openai_v4.js --model-family deepseek_v4 --tool-call-parser deepseekv4 \
    --reasoning-parser deepseek-v4 --served-model-name echo-v4
rc2=$?
p=$(( $(awk '{print $1}' "$dir/v3.out") + $(awk '{print $1}' "$dir/v4.out") ))
f=$(( $(awk '{print $3}' "$dir/v3.out") + $(awk '{print $3}' "$dir/v4.out") ))
echo "$p passed, $f failed"
[ $rc -eq 0 ] && [ $rc2 -eq 0 ]
