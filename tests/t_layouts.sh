#!/usr/bin/env bash
# t_layouts.sh — every parallel layout against the single-rank run (real mpirun
# processes, each with a deadline): with --dtype float32, greedy tokens over 17
# decode steps identical and logits within 1e-4 relative, for several prompts of
# different lengths (with 4 DP ranks and 3 prompts one DP rank stays idle), and
# again with every layer's experts permuted over the EP ranks (--init-expert-location),
# and with the shared expert fused or placed by waterfill (--enable-waterfill).
# Also: the DP-gather mode follows SGLang's MAX_LEN/SUM_LEN rule on uneven
# loads, communication byte counts match the seed-002 formulas, invalid
# launch shapes get their messages, and a killed rank ends the run with a clear
# error within seconds instead of a hang.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
# under ASan: Open MPI keeps its allocations until exit (and unloads its plugins), so
# LeakSanitizer reports them; single-rank tests elsewhere keep leak checking on
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; pkill -f "$tmp" 2>/dev/null' EXIT
. "$(dirname "$0")/lib.sh"

M=$tmp/model
"$MOESERVE" mkmodel --preset tiny-v3 --dtype bf16 --seed 3 --out "$M" 2>/dev/null || { echo "mkmodel failed"; echo "0 passed, 1 failed"; exit 1; }
P1="0,17,400,999,3,250,64,12,900,33,1,2,3,4,5,6,7,8,9,10,11,12,13"
P2="0,5"
P3="0,812,5,5,5,91,1023,300,301"
common=(--model "$M" --dtype float32 --prompt-ids "$P1" --prompt-ids "$P2" --prompt-ids "$P3"
        --max-new-tokens 17 --ignore-eos --threads 1 --comm-timeout-s 60)
timeout 120 "$MOESERVE" generate "${common[@]}" --dump-logits "$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1 \
    || { cat "$tmp/ref.out"; echo "0 passed, 1 failed"; exit 1; }

layouts=(
    "--tp 2"
    "--tp 4"
    "--tp 4 --dp 4 --enable-dp-attention"
    "--tp 4 --dp 2 --enable-dp-attention"
    "--dp 2 --tp 2"
    "--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend mpi"
    "--tp 2 --moe-a2a-backend deepep"
    "--tp 2 --dp 2 --enable-dp-attention"
    "--tp 2 --moe-dense-tp-size 1"
    "--tp 4 --dp 2 --enable-dp-attention --moe-dense-tp-size 1"
    "--tp 4 --ep-size 2"
    "--tp 4 --ep-size 4"
    "--tp 2 --moe-dp-size 2"
    "--tp 4 --dp 2 --enable-dp-attention --ep-size 2 --moe-dp-size 2"
)
check_layout() { # $1 = label, rest = flags: greedy tokens and logits against one rank
    local label=$1
    shift
    if ! timeout 180 "$MOESERVE" generate "${common[@]}" "$@" --dump-logits "$tmp/l.jsonl" >"$tmp/l.out" 2>&1; then
        bad "$label: run failed"; tail -5 "$tmp/l.out"; return
    fi
    if /usr/bin/python3 tests/compare_logits.py "$tmp/ref.jsonl" "$tmp/l.jsonl" --tol "${TOL:-1e-4}" \
        >"$tmp/cmp" 2>&1; then
        ok "$label ($(grep 'max relative' "$tmp/cmp"))"
    else
        bad "$label"; cat "$tmp/cmp"
    fi
}
# shellcheck disable=SC2086
for L in "${layouts[@]}"; do check_layout "$L" $L; done

# expert placement (--init-expert-location, SGLang's physical_to_logical_map): every layer's
# experts permuted over the EP ranks, each rank loading the experts its slots hold; the
# gate's output, dispatch and combine follow the map, so results equal one rank's
/usr/bin/python3 - "$M/config.json" "$tmp/perm.json" <<'PY'
import json, random, sys
c = json.load(open(sys.argv[1]))
E, L = c["n_routed_experts"], c["num_hidden_layers"]
rng = random.Random(5)
rows = []
for _ in range(L):
    p = list(range(E)); rng.shuffle(p); rows.append(p)
json.dump({"physical_to_logical_map": rows}, open(sys.argv[2], "w"))
PY
# shellcheck disable=SC2086
for L in "--tp 2 --moe-a2a-backend deepep" "--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend mpi" \
         "--tp 4 --ep-size 2" "--tp 4 --ep-size 4"; do
    check_layout "$L, permuted experts" $L --init-expert-location "$tmp/perm.json"
done
echo '{"physical_to_logical_map": [[0, 0]]}' >"$tmp/bad.json"

# DeepSeek-V4 (tiny-v4: window 8, ratio-4 and ratio-128 layers, hash layers): a 133-token
# prompt crosses a 128-token entry, the decode steps cross 4-token ones; attention TP
# replicates the window / compressed / index streams and the compressor state (also with
# --kv-cache-dtype fp8_e4m3 --enable-deepseek-v4-fp4-indexer)
M4=$tmp/model4
if "$MOESERVE" mkmodel --preset tiny-v4 --dtype bf16 --seed 4 --out "$M4" 2>/dev/null; then
    P4=$(/usr/bin/python3 -c 'print(",".join(str((i * 37 + 11) % 1000 + 2) for i in range(133)))')
    common=(--model "$M4" --dtype float32 --prompt-ids "$P4" --prompt-ids "$P2" --prompt-ids "$P3"
            --max-new-tokens 17 --ignore-eos --threads 1 --comm-timeout-s 60)
    if timeout 120 "$MOESERVE" generate "${common[@]}" --dump-logits "$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1; then
        # shellcheck disable=SC2086
        for L in "--tp 2" "--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend deepep" \
                 "--tp 4 --dp 2 --enable-dp-attention"; do check_layout "tiny-v4 $L" $L; done
    else
        bad "tiny-v4: one rank failed"; tail -5 "$tmp/ref.out"
    fi
    # FP8 + FP4 experts (the release's format): routed experts stay FP4 in the 2 MiB-page
    # copy; --tp 2 slices them at 32-column scale blocks, --tp 4 between blocks, the
    # DP-attention/deepep layout places whole experts per EP rank
    M5=$tmp/model5
    if "$MOESERVE" mkmodel --preset tiny-v4 --dtype fp8-fp4 --seed 11 --out "$M5" 2>/dev/null; then
        common=(--model "$M5" --dtype float32 --prompt-ids "$P4" --prompt-ids "$P2" --prompt-ids "$P3"
                --max-new-tokens 17 --ignore-eos --threads 1 --comm-timeout-s 60)
        if timeout 120 "$MOESERVE" generate "${common[@]}" --dump-logits "$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1; then
            # shellcheck disable=SC2086
            for L in "--tp 2" "--tp 4" "--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend deepep"; do
                check_layout "tiny-v4 fp8-fp4 $L" $L
            done
        else
            bad "tiny-v4 fp8-fp4: one rank failed"; tail -5 "$tmp/ref.out"
        fi
    else
        bad "tiny-v4 fp8-fp4: mkmodel failed"
    fi
    # the deployed cache formats (FP8 ds main entries, MXFP4 index keys): the ranks of a
    # group quantise the same entries the same way, but a layout's partial sums arrive in
    # another order than one rank's, and a last-bit difference can move an entry to the
    # next e4m3 code (2^-4 of it): ~6e-3 of the logits, seen on AVX2 (Zen 3).  Greedy
    # tokens stay identical; the logits are held to 2e-2, which a wrong head, entry or
    # rank (errors of order 1) still fails
    common=(--model "$M4" --dtype float32 --prompt-ids "$P4" --prompt-ids "$P2" --prompt-ids "$P3"
            --max-new-tokens 17 --ignore-eos --threads 1 --comm-timeout-s 60
            --kv-cache-dtype fp8_e4m3 --enable-deepseek-v4-fp4-indexer)
    if timeout 120 "$MOESERVE" generate "${common[@]}" --dump-logits "$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1; then
        # shellcheck disable=SC2086
        for L in "--tp 2" "--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend deepep" \
                 "--tp 4 --dp 2 --enable-dp-attention"; do
            TOL=2e-2 check_layout "tiny-v4 fp8 cache, fp4 keys $L" $L
        done
    else
        bad "tiny-v4 fp8 cache, fp4 keys: one rank failed"; tail -5 "$tmp/ref.out"
    fi
    common=(--model "$M" --dtype float32 --prompt-ids "$P1" --prompt-ids "$P2" --prompt-ids "$P3"
            --max-new-tokens 17 --ignore-eos --threads 1 --comm-timeout-s 60)
else
    bad "tiny-v4: mkmodel failed"
fi

# MAX_LEN vs SUM_LEN: uneven prefill (23/2/9/idle tokens over 4 DP ranks) must use
# SUM_LEN (sum*2 = 68 < max*dp = 92); the balanced decode steps use MAX_LEN.
# (--skip-server-warmup: the counts are those of these steps alone)
timeout 120 "$MOESERVE" generate "${common[@]}" --max-new-tokens 3 --tp 4 --dp 4 --enable-dp-attention \
    --comm-stats --skip-server-warmup >"$tmp/g.out" 2>&1
mx=$(grep '^mlp rank=0' "$tmp/g.out" | sed 's/.*max_len=\([0-9]*\).*/\1/')
sm=$(grep '^mlp rank=0' "$tmp/g.out" | sed 's/.*sum_len=\([0-9]*\).*/\1/')
# 4 layers: 1 prefill step (SUM_LEN) + 2 decode steps (3 rows of 1: 6 >= 4 -> MAX_LEN)
if [ "$mx" = 8 ] && [ "$sm" = 4 ]; then ok "gather mode: uneven prefill SUM_LEN, decode MAX_LEN"
else bad "gather mode: max_len=$mx sum_len=$sm (want 8 and 4)"; grep '^mlp' "$tmp/g.out"; fi
# seed 002: all-gather in, reduce-scatter out, each (N-1)/N x T_g x d x b per rank per layer.
# Decode steps here: N=4, 1 row per rank padded to max 1 (T_g = 4), d=256, b=4 (fp32):
# (N-1) x 1 x 256 x 4 = 3072 bytes sent per call; 2 decode calls on layer 1 -> 6144.
ag=$(grep 'rank=0 group=tp tag=1 kind=allgather' "$tmp/g.out" | sed 's/.* sent=\([0-9]*\).*/\1/')
rs=$(grep 'rank=0 group=tp tag=1 kind=reduce_scatter' "$tmp/g.out" | sed 's/.* sent=\([0-9]*\).*/\1/')
if [ "$ag" = 6144 ] && [ "$rs" = 6144 ]; then ok "DP gather bytes = 2 x (N-1)/N x T_g x d x b"
else bad "DP gather bytes: allgather sent=$ag reduce_scatter sent=$rs (want 6144 each)"; fi
# EP dispatch: sent bytes = rows to other ranks x record size; the engine counts the
# rows itself (Σ tokens × remote destination ranks); both must agree.
timeout 120 "$MOESERVE" generate "${common[@]}" --max-new-tokens 3 --tp 2 --moe-a2a-backend mpi \
    --comm-stats >"$tmp/e.out" 2>&1
rows=$(grep '^mlp rank=0' "$tmp/e.out" | sed 's/.*dispatch_rows=\([0-9]*\).*/\1/')
sent=$(grep 'rank=0 group=tp tag=MS_ALL\|rank=0 group=tp tag=.* kind=a2a_dispatch' "$tmp/e.out" \
       | sed 's/.* sent=\([0-9]*\).*/\1/' | paste -sd+ | bc)
rec=$(( (8 + 4 * 8 + 256 * 4 + 7) / 8 * 8 ))
if [ -n "$rows" ] && [ "$rows" -gt 0 ] && [ "$sent" = $((rows * rec)) ]; then
    ok "EP dispatch bytes = remote rows ($rows) x record ($rec B)"
else bad "EP dispatch: rows=$rows sent=$sent record=$rec"; grep -E '^mlp|a2a' "$tmp/e.out" | head; fi

# shared-expert fusion and SGLang's waterfill (--enable-waterfill, old name
# --enable-deepep-waterfill): the shared expert as a slot on every EP rank, each token's
# copy at home (fusion) or on the rank waterfill picks; a 150-token prompt gives a rank
# the 64 rows from which waterfill moves copies (shared_remote > 0, else it kept them home)
PW=$(/usr/bin/python3 -c 'print(",".join(str((i * 37 + 11) % 1000 + 2) for i in range(150)))')
wf=(--model "$M" --dtype float32 --prompt-ids "$PW" --prompt-ids "$P2" --prompt-ids "$P3"
    --prompt-ids "$PW,7,8" --max-new-tokens 9 --ignore-eos --threads 1 --comm-timeout-s 60)
if timeout 120 "$MOESERVE" generate "${wf[@]}" --dump-logits "$tmp/wref.jsonl" >"$tmp/wref.out" 2>&1; then
    for L in "--tp 2 --moe-a2a-backend deepep --enable-waterfill" \
             "--tp 2 --dp 2 --enable-dp-attention --moe-a2a-backend deepep --enable-waterfill" \
             "--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend mooncake --enable-deepep-waterfill" \
             "SGLANG_DISABLE_STATIC_WATERFILL=1 --tp 2 --dp 2 --enable-dp-attention --moe-a2a-backend deepep --enable-waterfill" \
             "--tp 2 --moe-a2a-backend megamoe --enforce-shared-experts-fusion"; do
        envs=(WF=static)
        case "$L" in SGLANG_*) envs=("${L%% *}"); L=${L#* } ;; esac
        # shellcheck disable=SC2086
        if ! env "${envs[@]}" timeout 180 "$MOESERVE" generate "${wf[@]}" $L --comm-stats --dump-logits "$tmp/w.jsonl" \
            >"$tmp/w.out" 2>&1; then bad "$L: run failed"; tail -5 "$tmp/w.out"; continue; fi
        remote=$(grep '^mlp rank=' "$tmp/w.out" | sed 's/.*shared_remote=\([0-9]*\).*/\1/' | paste -sd+ | bc)
        want_remote=1
        case "$L" in *fusion*) want_remote=0 ;; esac
        if ! /usr/bin/python3 tests/compare_logits.py "$tmp/wref.jsonl" "$tmp/w.jsonl" >"$tmp/cmp" 2>&1; then
            bad "$L"; cat "$tmp/cmp"
        elif [ "$want_remote" = 1 ] && ! [ "${remote:-0}" -gt 0 ]; then
            bad "$L: no shared copy left its rank (shared_remote=$remote)"
        elif [ "$want_remote" = 0 ] && [ "${remote:-0}" != 0 ]; then
            bad "$L: fusion alone moved $remote shared copies"
        else ok "${envs[*]#WF=static} $L ($(grep 'max relative' "$tmp/cmp"); shared copies elsewhere: $remote)"; fi
    done
else
    bad "waterfill: one rank failed"; tail -5 "$tmp/wref.out"
fi
# DeepSeek-V4 (tiny-v4: hash-routed and top-k layers, SGLang's HashTopK path) with waterfill
if [ -f "$M4/config.json" ]; then
    wf4=(--model "$M4" --dtype float32 --prompt-ids "$PW" --prompt-ids "$P2" --max-new-tokens 9
         --ignore-eos --threads 1 --comm-timeout-s 60)
    if timeout 120 "$MOESERVE" generate "${wf4[@]}" --dump-logits "$tmp/wref4.jsonl" >"$tmp/wref4.out" 2>&1 &&
        timeout 180 "$MOESERVE" generate "${wf4[@]}" --tp 2 --moe-a2a-backend deepep --enable-waterfill \
            --comm-stats --dump-logits "$tmp/w4.jsonl" >"$tmp/w4.out" 2>&1 &&
        /usr/bin/python3 tests/compare_logits.py "$tmp/wref4.jsonl" "$tmp/w4.jsonl" >"$tmp/cmp" 2>&1; then
        remote=$(grep '^mlp rank=' "$tmp/w4.out" | sed 's/.*shared_remote=\([0-9]*\).*/\1/' | paste -sd+ | bc)
        if [ "${remote:-0}" -gt 0 ]; then ok "tiny-v4 --tp 2 deepep --enable-waterfill ($(grep 'max relative' "$tmp/cmp"); shared copies elsewhere: $remote)"
        else bad "tiny-v4 waterfill: no shared copy left its rank"; fi
    else
        bad "tiny-v4 --enable-waterfill"; tail -5 "$tmp/w4.out" "$tmp/cmp" 2>/dev/null
    fi
fi

# invalid launch shapes: a message naming the flag
check_err() { # $1 = expected text, rest = flags
    want=$1; shift
    out=$(timeout 30 "$MOESERVE" generate --model "$M" --prompt-ids 0 "$@" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q -- "$want"; then ok "rejects $* ($want)"
    else bad "rejects $*: got: $out"; fi
}
check_err "--dp" --tp 3 --dp 2 --enable-dp-attention
check_err "heads" --tp 3
check_err "--ep-size" --tp 6 --dp 6 --enable-dp-attention --ep-size 3
check_err "--tp" --tp 0
# redundant expert slots need EPLB's replicas: refused before any rank loads (it used to
# kill rank 1 with SIGSEGV at load)
check_err "--ep-num-redundant-experts" --tp 2 --ep-size 2 --ep-num-redundant-experts 2
check_err "--ep-num-redundant-experts" --ep-num-redundant-experts 4
check_err "--init-expert-location" --tp 2 --ep-size 2 --init-expert-location "$tmp/bad.json"
check_err "--init-expert-location" --tp 2 --ep-size 2 --init-expert-location "$tmp/missing.json"
# waterfill and fusion where SGLang has no place for them: no all-to-all, one EP rank,
# fusion on a backend without the per-rank shared slot
check_err "--enable-waterfill: not implemented (shared-expert fusion without an all-to-all" --tp 2 --enable-waterfill
check_err "--enable-deepep-waterfill at EP 1" --moe-a2a-backend deepep --enable-deepep-waterfill
check_err "--enforce-shared-experts-fusion is rejected" --tp 2 --moe-a2a-backend mpi --enforce-shared-experts-fusion
check_err "--enforce-shared-experts-fusion: not implemented (shared-expert fusion without" --tp 2 --enforce-shared-experts-fusion
# a model without a shared expert (the config says so; refused before any weight loads)
mkdir -p "$tmp/noshared" && cp "$M"/* "$tmp/noshared/" &&
    /usr/bin/python3 -c 'import json, sys; p = sys.argv[1] + "/config.json"; c = json.load(open(p)); c["n_shared_experts"] = 0; json.dump(c, open(p, "w"))' "$tmp/noshared"
out=$(timeout 60 "$MOESERVE" generate --model "$tmp/noshared" --prompt-ids 0 --tp 2 --moe-a2a-backend deepep \
    --enable-waterfill 2>&1)
if [ $? -ne 0 ] && echo "$out" | grep -q -- "--enable-waterfill: the model has no shared expert"; then
    ok "rejects --enable-waterfill on a model without a shared expert"
else bad "no shared expert: got: $out"; fi

# a rank killed mid-run: the others must stop with an error, not hang
( timeout 60 "$MOESERVE" generate --model "$M" --prompt-ids "$P1" --max-new-tokens 15000 --ignore-eos \
    --threads 1 --tp 2 --comm-timeout-s 20 >"$tmp/k.out" 2>&1; echo "rc=$?" >>"$tmp/k.out" ) &
runner=$!
victim=""
for _ in $(seq 1 100); do
    victim=$(pgrep -f "moeserve generate --model $M --prompt-ids $P1 --max-new-tokens 15000" | while read -r p; do
        [ -n "$(tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep '^OMPI_COMM_WORLD_RANK=1$')" ] && echo "$p"; done | head -1)
    [ -n "$victim" ] && break
    sleep 0.1
done
sleep 1
start=$SECONDS
[ -n "$victim" ] && kill -9 "$victim"
wait "$runner"
took=$((SECONDS - start))
if [ -n "$victim" ] && [ $took -le 15 ] && ! grep -q "rc=0" "$tmp/k.out"; then
    ok "killed rank 1: run ended in ${took}s with $(grep -o "rc=[0-9]*" "$tmp/k.out")"; grep -iE "error|exited|signal|rank" "$tmp/k.out" | head -3 | sed "s/^/     /"
else bad "killed rank: victim=$victim took=${took}s"; tail -5 "$tmp/k.out"; fi

report
