#!/usr/bin/env bash
# run_demo.sh — `make run`: build (done by make), start the server on the
# committed trained model (models/small-code: a small DeepSeek-V3-architecture
# model trained on Python's standard library, tools/train/), send one chat
# request and one /v1/completions prompt with curl, print the replies, stop
# the server.  DEMO_MODEL=DIR serves another checkpoint.
set -euo pipefail
BUILD=${BUILD:-build}
M=${DEMO_MODEL:-models/small-code}
PORT=${DEMO_PORT:-30000}
if [ ! -f "$M/config.json" ]; then
    echo "$M/config.json missing (make train writes models/small-code)"
    exit 1
fi
"$BUILD/moeserve" serve --model-path "$M" --port "$PORT" --max-total-tokens 8192 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "server failed to start"; exit 1; }
    sleep 0.1
done
echo "--- POST /v1/chat/completions"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d '{
  "model": "small-code",
  "messages": [{"role": "user", "content": "def fibonacci(n):"}],
  "max_tokens": 64, "temperature": 0}'
echo
echo "--- POST /v1/completions"
curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d '{
  "model": "small-code", "prompt": "def fibonacci(n):\n", "max_tokens": 64, "temperature": 0}'
echo
echo "--- (a 7M-parameter model trained for minutes on Python sources: it writes Python-looking code)"
