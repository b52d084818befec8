#!/usr/bin/env bash
# t_stop.sh — a clean stop of a 2-rank server (DP-attention, self-relaunched
# under mpirun, and under a user-run mpirun): SIGTERM to the process the user
# started drains it (in-flight streams finish, new requests and /health get
# 503, exit code 0, no process left); a second SIGINT stops at once (streams
# end with finish_reason abort, exit 0); under your own mpirun, SIGUSR1 to
# mpirun (forwarded to every rank) or SIGTERM to rank 0 drain the same way, and SIGTERM
# to mpirun drains within the time its --mca odls_base_sigkill_timeout gives (case 4).
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
# 4. SIGTERM to a user-run mpirun: Open MPI 4.1 sends every rank SIGCONT at once, SIGTERM
# odls_base_sigkill_timeout (G) seconds later, SIGKILL G seconds after that, and exits 1
# whatever the ranks do.  With G above the drain, rank 0 drains on that SIGTERM (here
# --shutdown-timeout 1 then ends the long streams with abort), the other ranks keep
# stepping until rank 0 ends the run, and every rank exits 0 by itself before the
# SIGKILL (each says so: MPI_Finalize waits for an aborting mpirun, so a rank that saw
# its SIGCONT stops waiting after 1 s; gone before 2G; the streams end with [DONE]).
# The streams must outlast G + 1 s on any machine: tiny-v3 streams ~1,000 tokens/s
# (6,000 tokens ended with length before the drain on a fast host), so 60,000, with
# the context and the KV pool raised to hold them.
G=6
sed -i 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 131072/' "$M/config.json"
FLAGS="${FLAGS/--max-total-tokens 8192/--max-total-tokens 65536} --shutdown-timeout 1"
if start term-mpirun $MPI --mca odls_base_sigkill_timeout $G; then
    streams 2 60000 || bad "term-mpirun: 2 streams did not all start"
    ranks=$(pgrep -P "$PID" | tr '\n' ' ' | sed 's/ $//')
    t0=$SECONDS
    kill -TERM "$PID"
    hc=
    for _ in $(seq 1 $((G * 20 + 60))); do
        hc=$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$PORT/health")
        [ "$hc" = 503 ] && break
        sleep 0.05
    done
    code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "http://127.0.0.1:$PORT/v1/completions" \
        -d '{"prompt":"x","max_tokens":2}')
    gone=
    for _ in $(seq 1 $((G * 30))); do
        # exited: gone or a zombie (mpirun reaps its children only at its end)
        ps -o stat= -p "${ranks// /,}" 2>/dev/null | grep -qv '^Z' || { gone=$((SECONDS - t0)); break; }
        sleep 0.1
    done
    wait_exit $((3 * G))
    wait "${SPIDS[@]}" 2>/dev/null
    n0=$(grep -c "exiting with status 0" "$tmp/term-mpirun.log")
    ends=$(grep -ho '"finish_reason":"[a-z]*"' "$tmp/s1" "$tmp/s2" | cut -d'"' -f4 | tr '\n' ' ')
    t "SIGTERM to a user-run mpirun (--mca odls_base_sigkill_timeout $G): drained after ~$G s (/health $hc, a new request $code), the streams ended with ${ends:-nothing}and [DONE], $n0 of 2 ranks exited 0, gone after ${gone:-never} s (< $((2 * G)): before the SIGKILL), mpirun exit code $rc (Open MPI's 1), no rank left" \
        '[ "$hc" = 503 ] && [ "$code" = 503 ] && all_end_with 2 abort && [ "$n0" = 2 ] && [ -n "$ranks" ] && [ -n "$gone" ] && [ "$gone" -lt $((2 * G)) ] && no_rank_left'
fi
report
