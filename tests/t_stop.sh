#!/usr/bin/env bash
# t_stop.sh — a clean stop of a 2-rank server (DP-attention, self-relaunched
# under mpirun, and under a user-run mpirun): SIGTERM to the process the user
# started drains it (in-flight streams finish, new requests and /health get
# 503, exit code 0, no process left); a second SIGINT stops at once (streams
# end with finish_reason abort, exit 0); under your own mpirun, SIGUSR1 to
# mpirun (forwarded to every rank) or SIGTERM to rank 0 drain the same way.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} # OpenMPI keeps its allocations until exit
. "$(dirname "$0")/lib.sh"
serve_setup
FLAGS="--model-path $M --max-total-tokens 8192 --threads 1 --tp 2 --dp 2 --enable-dp-attention --skip-server-warmup"
start() { # $1 = log name, rest = the command before the serve flags; sets PORT and PID
    PORT=$(free_port)
    local name=$1
    shift
    serve_up "$name" "$@" "$MOESERVE" serve $FLAGS --port "$PORT"
}
streams() { # $1 = how many, $2 = max_tokens: streams in the background, into $tmp/s<i>
    rm -f "$tmp"/s[0-9]*
    SPIDS=()
    for i in $(seq 1 "$1"); do
        curl -sN -m 120 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\":\"hello $i\",\"max_tokens\":$2,\"ignore_eos\":true,\"stream\":true}" \
            >"$tmp/s$i" 2>/dev/null &
        SPIDS+=($!)
    done
    for _ in $(seq 1 200); do # until all of them run in the engine
        n=$(curl -s -m 2 "http://127.0.0.1:$PORT/get_load" | grep -o '"num_running_reqs":[0-9]*' |
            cut -d: -f2 | awk '{s+=$1} END {print s+0}')
        [ "$n" -ge "$1" ] && return 0
        sleep 0.05
    done
    return 1
}
# wait_exit SECONDS: waits for $PID, leaves its exit code in $rc (timeout: rc=timeout)
wait_exit() {
    for _ in $(seq 1 $(($1 * 10))); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$PID" 2>/dev/null; then rc=timeout; else wait "$PID"; rc=$?; fi
    PID=
}
all_end_with() { # $1 = how many streams, $2 = finish_reason
    for i in $(seq 1 "$1"); do
        grep -q "\"finish_reason\":\"$2\"" "$tmp/s$i" && [ "$(tail -n 2 "$tmp/s$i" | head -n 1)" = "data: [DONE]" ] || return 1
    done
}
no_rank_left() { ! pgrep -f "$M" >/dev/null; }

# 1. SIGTERM to the launcher the self-relaunch made: drain, 503 for new requests, exit 0
if start relaunch; then
    streams 4 1500 || bad "4 streams did not all start"
    kill -TERM "$PID"
    sleep 0.2
    code=$(curl -s -o "$tmp/new" -w '%{http_code}' -m 5 "http://127.0.0.1:$PORT/v1/completions" \
        -d '{"prompt":"x","max_tokens":2}')
    hc=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "http://127.0.0.1:$PORT/health")
    t "while draining: a new request gets 503 ($code), /health 503 ($hc)" \
        '[ "$code" = 503 ] && grep -q "shutting down" "$tmp/new" && [ "$hc" = 503 ]'
    wait_exit 60
    wait "${SPIDS[@]}" 2>/dev/null
    t "SIGTERM to the launcher: exit code $rc" '[ "$rc" = 0 ]'
    t "SIGTERM to the launcher: all 4 in-flight streams finished (length, [DONE])" 'all_end_with 4 length'
    t "SIGTERM to the launcher: no rank left" no_rank_left
fi
# 2. a second signal stops at once: streams end with finish_reason abort, exit 0
if start twice; then
    streams 2 6000 || bad "2 streams did not all start"
    kill -INT "$PID"
    for _ in $(seq 1 100); do grep -q "stop requested: draining" "$tmp/twice.log" && break; sleep 0.05; done
    t0=$SECONDS
    kill -INT "$PID"
    wait_exit 20
    wait "${SPIDS[@]}" 2>/dev/null
    t "second SIGINT: stopped in $((SECONDS - t0)) s, exit code $rc" '[ "$rc" = 0 ] && [ $((SECONDS - t0)) -le 10 ]'
    t "second SIGINT: the streams end with finish_reason abort and [DONE]" 'all_end_with 2 abort'
    t "second SIGINT: no rank left" no_rank_left
fi
# 3. under a user-run mpirun: SIGUSR1 to mpirun, and SIGTERM to rank 0, drain
MPI="mpirun -np 2 --oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"
for how in usr1-mpirun term-rank0; do
    start "$how" $MPI || continue
    streams 2 1500 || bad "$how: 2 streams did not all start"
    if [ "$how" = usr1-mpirun ]; then
        kill -USR1 "$PID"
    else
        for c in $(pgrep -P "$PID"); do
            tr '\0' '\n' <"/proc/$c/environ" | grep -qx "OMPI_COMM_WORLD_RANK=0" && kill -TERM "$c"
        done
    fi
    wait_exit 60
    wait "${SPIDS[@]}" 2>/dev/null
    t "user-run mpirun, $how: exit code $rc, streams finished, no rank left" \
        '[ "$rc" = 0 ] && all_end_with 2 length && no_rank_left'
done
report
