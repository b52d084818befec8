#!/usr/bin/env bash
# t_openai_node.sh — the official `openai` npm client against the echo server
# (build/tests/test_http --serve).  Needs tests/fixtures/node/node_modules/openai:
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
timeout 60 node tests/openai_client.js "$(cat "$dir/port")"
rc=$?
kill -TERM $pid
wait $pid
src=$?
if [ $src -ne 0 ]; then echo "server exited with $src after SIGTERM"; cat "$dir/log"; echo "0 passed, 1 failed"; exit 1; fi
exit $rc
