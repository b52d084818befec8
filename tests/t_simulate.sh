#!/usr/bin/env bash
# t_simulate.sh — `moeserve simulate`: the real router and schedulers on a
# synthetic workload.  Prefix-aware policies must beat round robin on a
# shared-prefix workload, results are deterministic, a request that can never
# fit is reported as failed (no hang), and bad flags are named.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
gsp="--gsp-num-groups 8 --gsp-prompts-per-group 8 --gsp-system-prompt-len 512 --gsp-question-len 32 --gsp-output-len 16"
# shellcheck disable=SC2086
"$MOESERVE" simulate --dp 2 --compare $gsp --max-concurrency 4 --json >"$tmp/a.json" 2>"$tmp/err"
t "six policies, every request completed" \
    '[ "$(grep -c "\"completed\": 64, \"failed\": 0" "$tmp/a.json")" = 6 ]'
hit() { grep "\"policy\": \"$1\"" "$tmp/a.json" | sed 's/.*"cache_hit_rate": \([0-9.]*\).*/\1/'; }
t "cache_aware hits the prefix cache more than round_robin ($(hit cache_aware) > $(hit round_robin))" \
    '[ "$(echo "$(hit cache_aware) > $(hit round_robin) + 0.05" | bc)" = 1 ]'
t "cost hits the prefix cache more than round_robin ($(hit cost))" \
    '[ "$(echo "$(hit cost) > $(hit round_robin) + 0.05" | bc)" = 1 ]'
t "JSON lines parse" '/usr/bin/python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$tmp/a.json"'
# shellcheck disable=SC2086
"$MOESERVE" simulate --dp 2 --compare $gsp --max-concurrency 4 --json >"$tmp/b.json" 2>/dev/null
t "deterministic" 'cmp -s "$tmp/a.json" "$tmp/b.json"'
out=$("$MOESERVE" simulate --dp 4 --dataset-name random --num-prompts 40 --random-input-len 300 \
    --random-output-len 20 --random-range-ratio 0.5 --request-rate 50 --load-balance-method vllm 2>&1)
t "random dataset, Poisson arrivals, 4 ranks" 'echo "$out" | grep -qE "^vllm +40 +0 "'
out=$(timeout 20 "$MOESERVE" simulate --dp 2 --dataset-name random --num-prompts 3 --random-input-len 500 --random-range-ratio 1 \
    --max-total-tokens 256 2>&1)
t "a request larger than the pool fails, no hang" 'echo "$out" | grep -qE "^round_robin +0 +3 "'
e() { # expected text, then args
    want=$1; shift
    msg=$("$MOESERVE" simulate "$@" 2>&1); rc=$?
    t "bad input: $* -> exit 2 naming it" '[ $rc = 2 ] && echo "$msg" | grep -q -- "$want"'
}
e "--dp '0'" --dp 0
e "--load-balance-method 'fastest'" --load-balance-method fastest
e "--request-rate 'x'" --request-rate x
e "unknown flag --bogus" --bogus 1
e "--dp needs a value" --dp
e "at most" --dataset-name random --num-prompts 1000000 --random-input-len 1000
t "--help" '"$MOESERVE" simulate --help | grep -q "usage: moeserve simulate"'
report
