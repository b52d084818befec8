#!/usr/bin/env bash
# t_sampling.sh — request fields that change sampling, on the real server
# (tiny-v3): logit_bias bans the greedy token and forces another; min_tokens
# (OpenAI) / min_new_tokens (/generate) keep EOS from ending the output before
# that many tokens; n = 3 gives three choices, identical under greedy, the
# later two reading the prompt's KV pages from the radix cache.  On one rank
# and on the second DP rank of a 2-rank DP-attention server (the fields travel
# in the control block to the rank that samples).
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} # OpenMPI keeps its allocations until exit
. "$(dirname "$0")/lib.sh"
serve_setup
start() { # $1 = log name, rest = flags
    PORT=$(free_port)
    local name=$1
    shift
    serve_up "$name" "$MOESERVE" serve --model-path "$M" --port "$PORT" --max-total-tokens 1024 \
        --threads 1 --skip-server-warmup --enable-metrics "$@"
}
# gen SAMPLING_JSON: /generate's output_ids, space-separated (header $DP)
gen() {
    curl -s -m 30 "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' $DP \
        -d "{\"input_ids\":[5,6,7,8,9],\"sampling_params\":{\"temperature\":0,$1}}" |
        python3 -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["output_ids"])))'
}
checks() { # $1 = label
    local base ban first forced eos minned cmp
    base=$(gen '"max_new_tokens":8,"ignore_eos":true')
    first=${base%% *}
    ban=$(gen "\"max_new_tokens\":8,\"ignore_eos\":true,\"logit_bias\":{\"$first\":-100}")
    t "$1: logit_bias -100 bans the greedy token $first (got: ${ban%% *})" \
        '[ -n "$first" ] && [ -n "$ban" ] && [ "${ban%% *}" != "$first" ]'
    forced=$(gen '"max_new_tokens":6,"ignore_eos":true,"logit_bias":{"42":100}')
    t "$1: logit_bias +100 forces token 42 ($forced)" '[ "$forced" = "42 42 42 42 42 42" ]'
    # EOS (id 1) forced: one token without min_new_tokens, 5 others and then EOS with it
    eos=$(gen '"max_new_tokens":20,"logit_bias":{"1":100}')
    minned=$(gen '"max_new_tokens":20,"min_new_tokens":5,"logit_bias":{"1":100}')
    t "$1: min_new_tokens 5 holds EOS back ($eos | $minned)" \
        '[ "$eos" = 1 ] && [ "$(echo "$minned" | wc -w)" = 6 ] && [ "${minned##* }" = 1 ] && ! echo "${minned% *}" | grep -qw 1'
    cmp=$(curl -s -m 30 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' $DP \
        -d '{"prompt":[5,6,7,8,9],"max_tokens":20,"temperature":0,"min_tokens":4,"logit_bias":{"1":100}}' |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["completion_tokens"])')
    t "$1: OpenAI min_tokens 4: 5 completion tokens ($cmp)" '[ "$cmp" = 5 ]'
    # n = 3: three choices, identical under greedy; choices 1 and 2 read the prompt's KV
    # pages from the radix cache (cached_tokens_total grows by their whole pages)
    local c0 nch
    c0=$(metric cached_tokens_total)
    nch=$(curl -s -m 60 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' $DP \
        -d "{\"prompt\":[$(seq -s, 10 49)],\"max_tokens\":8,\"temperature\":0,\"n\":3,\"ignore_eos\":true}" |
        python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"]; print(len(c), len(set(x["text"] for x in c)), [x["index"] for x in c])')
    t "$1: n=3 greedy: 3 choices, 1 distinct text, indexes 0..2 ($nch)" '[ "$nch" = "3 1 [0, 1, 2]" ]'
    t "$1: n=3: the other choices hit the prompt's cached pages ($c0 -> $(metric cached_tokens_total))" \
        '[ "$(metric cached_tokens_total)" -ge $((c0 + 64)) ]'
}
metric() { curl -s -m 5 "http://127.0.0.1:$PORT/metrics" | grep "^sglang:$1{" | awk '{print int($2)}'; }
if start one; then
    DP=
    checks "one rank"
    kill -TERM "$PID"; wait "$PID"; PID=
fi
if start dpa --tp 2 --dp 2 --enable-dp-attention; then
    DP="-H X-Data-Parallel-Rank:1"
    checks "DP rank 1 of 2"
    kill -TERM "$PID"; wait "$PID"; PID=
fi
report
