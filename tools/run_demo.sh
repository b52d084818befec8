#!/usr/bin/env bash
# run_demo.sh — `make run`: build (done by make), create a small model, start
# the server, send one chat request with curl, print the reply, stop the server.
set -euo pipefail
BUILD=${BUILD:-build}
M=${DEMO_MODEL:-$BUILD/models/tiny-v3}
PORT=${DEMO_PORT:-30000}
mkdir -p "$(dirname "$M")"
if [ ! -f "$M/config.json" ]; then
    "$BUILD/moeserve" mkmodel --preset tiny-v3 --seed 1 --out "$M"
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
  "model": "tiny-v3",
  "messages": [{"role": "user", "content": "Hello! What can you do?"}],
  "max_tokens": 24, "temperature": 0}'
echo
echo "--- (random weights: the text is gibberish; the path is real)"
