#!/usr/bin/env bash
# bench_routing.sh — DP admission policies on a served workload: a 2-rank
# DP-attention server (small-v3, one thread per rank) under
# `moeserve bench --dataset-name generated-shared-prefix`, once per
# --load-balance-method.  Prefix-cache hits come from the server's /metrics
# (cached / prompt tokens over the run); TTFT and throughput from the bench
# client.  One row per policy, appended to bench/results/bench_routing.txt.
# Usage: bench/bench_routing.sh [policy ...]   (default: round_robin cache_aware);
# NGROUPS, PER, SYS, Q, OUT, CONC set the workload, LABEL tags the header.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.." || exit 1
M=${MODEL:-$BUILD/models/small-v3}
[ -f "$M/config.json" ] || "$BUILD/moeserve" mkmodel --preset small-v3 --seed 1 --out "$M" >/dev/null 2>&1
NGROUPS=${NGROUPS:-8} PER=${PER:-8} SYS=${SYS:-512} Q=${Q:-32} OUT=${OUT:-16} CONC=${CONC:-4}
policies=("$@")
[ ${#policies[@]} -eq 0 ] && policies=(round_robin cache_aware)
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; sleep 0.5; pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
metric() { # $1 = metric name: the sum over DP ranks
    curl -s "http://127.0.0.1:$port/metrics" | grep "^$1{" | awk '{s += $2} END {printf "%.0f", s}'
}
out=bench/results/bench_routing.txt
mkdir -p bench/results
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD 2>/dev/null) bench_routing ${LABEL:+($LABEL) }groups=$NGROUPS per_group=$PER system_len=$SYS question_len=$Q output_len=$OUT concurrency=$CONC" >>"$out"
for pol in "${policies[@]}"; do
    "$BUILD/moeserve" serve --model-path "$M" --port "$port" --tp 2 --dp 2 --enable-dp-attention \
        --threads 1 --max-total-tokens 16384 --enable-metrics --load-balance-method "$pol" \
        >"$tmp/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
    p0=$(metric sglang:prompt_tokens_total) c0=$(metric sglang:cached_tokens_total)
    "$BUILD/moeserve" bench --base-url "http://127.0.0.1:$port" --backend moeserve --tokenizer "$M" \
        --dataset-name generated-shared-prefix --gsp-num-groups "$NGROUPS" --gsp-prompts-per-group "$PER" \
        --gsp-system-prompt-len "$SYS" --gsp-question-len "$Q" --gsp-output-len "$OUT" \
        --max-concurrency "$CONC" --warmup-requests 0 --disable-tqdm --output-file "$tmp/b.jsonl" \
        >"$tmp/bench.out" 2>&1 || { echo "bench failed ($pol)"; tail -5 "$tmp/bench.out"; }
    p1=$(metric sglang:prompt_tokens_total) c1=$(metric sglang:cached_tokens_total)
    row=$(/usr/bin/python3 - "$tmp/b.jsonl" "$pol" "$((p1 - p0))" "$((c1 - c0))" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
p, c = int(sys.argv[3]), int(sys.argv[4])
print(f"policy={sys.argv[2]} completed={j['completed']} prompt_tokens={p} cached_tokens={c} "
      f"cache_hit_rate={c / p if p else 0:.3f} mean_ttft_ms={j['mean_ttft_ms']:.0f} "
      f"p99_ttft_ms={j['p99_ttft_ms']:.0f} request_throughput={j['request_throughput']:.3f} "
      f"output_throughput={j['output_throughput']:.1f} duration_s={j['duration']:.1f}")
EOF
)
    echo "$row" | tee -a "$out"
    kill -TERM "$pid"
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    pid=
    rm -f "$tmp/b.jsonl"
done
