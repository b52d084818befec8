# lib.sh — what the shell tests (tests/t_*.sh) share; each sources it first:
#   . "$(dirname "$0")/lib.sh"
# ok NAME / bad NAME [DETAIL] record one check (DETAIL: its last 25 lines are
# shown, indented); t NAME CONDITION records whether the shell condition holds;
# add_counts TEXT adds the closing line of a sub-run ("N passed, N failed",
# the last one in TEXT; returns 1 when there is none); report prints this
# test's closing line, which run_tests.sh reads, and returns non-zero when a
# check failed.
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    if [ -n "${2:-}" ]; then printf '%s\n' "$2" | tail -n 25 | sed 's/^/    /'; fi
}
t() { # name, then a shell condition
    local name=$1
    shift
    if eval "$@"; then ok "$name"; else bad "$name"; fi
}
add_counts() {
    local line
    line=$(printf '%s\n' "$1" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    [ -n "$line" ] || return 1
    pass=$((pass + $(echo "$line" | awk '{print $1}')))
    fail=$((fail + $(echo "$line" | awk '{print $3}')))
}
report() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}

# Server tests (t_stop.sh, t_sampling.sh).  serve_setup [MKMODEL ARGS]: a
# temporary directory $tmp, removed at exit with every process whose command
# line names it, and the model $M in it (mkmodel's ARGS, default tiny-v3 seed 7).
# free_port prints a free loopback port.  serve_up NAME CMD...: runs CMD (a
# server on $PORT) in the background, its log in $tmp/NAME.log, sets PID, and
# waits for /health (60 s); a server that never answers is a failure (returns
# 1).  serve_down stops it (SIGTERM, waits) and clears PID.
serve_setup() {
    tmp=$(mktemp -d)
    PID=
    trap serve_cleanup EXIT
    M=$tmp/model
    [ $# -gt 0 ] || set -- --preset tiny-v3 --seed 7
    "$MOESERVE" mkmodel "$@" --out "$M" 2>/dev/null ||
        { echo "0 passed, 1 failed"; exit 1; }
}
serve_down() {
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
}
serve_cleanup() {
    [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null
    sleep 0.3
    pkill -9 -f "$tmp" 2>/dev/null
    rm -rf "$tmp"
}
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
serve_up() {
    local name=$1
    shift
    "$@" >"$tmp/$name.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    bad "$name: server did not start" "$(tail -20 "$tmp/$name.log")"
    return 1
}
# The EPLB tests' setup (t_eplb_serve.sh, t_eplb_run.sh): a skewed tiny-v3 in $S, the
# generate flags of the layout comparisons in common[], the 1-rank float32 run's logits
# in $tmp/ref.jsonl.  After serve_setup.
eplb_setup() {
    "$MOESERVE" mkmodel --preset tiny-v3 --seed 7 --route-skew 1.2 --out "$tmp/skew" 2>/dev/null
    S=$tmp/skew
    P1="0,17,400,999,3,250,64,12,900,33,1,2,3,4,5,6,7,8,9,10,11,12,13"
    common=(--model "$S" --dtype float32 --prompt-ids "$P1" --prompt-ids "0,5" --max-new-tokens 12
            --ignore-eos --threads 1 --comm-timeout-s 60)
    timeout 120 "$MOESERVE" generate "${common[@]}" --dump-logits "$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1 ||
        { bad "1-rank run" "$(tail -5 "$tmp/ref.out")"; report; exit 1; }
}
# Passes when `generate` on $S with the flags after $1 fails saying $1.
eplb_refuses() {
    local want=$1
    shift
    local out
    out=$(timeout 60 "$MOESERVE" generate --model "$S" --prompt-ids 0 --threads 1 "$@" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q -- "$want"; then ok "refuses $* ($want)"
    else bad "refuses $*" "$out"; fi
}
