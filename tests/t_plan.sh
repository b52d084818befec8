#!/usr/bin/env bash
# t_plan.sh — `moeserve plan` from the command line: --json fields checked with python,
# the --sweep plot files, --help, and error messages that name the flag.
set -u
BIN=${MOESERVE:-$PWD/${BUILD:-build}/moeserve}
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/lib.sh"

# check NAME PYTHON-EXPR -- ARGS...: runs plan --json ARGS and evaluates EXPR on d (the JSON).
check() {
    local name=$1 expr=$2
    shift 3
    if "$BIN" plan --json "$@" >"$TMP/out.json" 2>"$TMP/err" &&
        $PY -c "import json,sys; d=json.load(open('$TMP/out.json')); sys.exit(0 if ($expr) else 1)"; then
        ok "$name"
    else
        bad "$name"
        cat "$TMP/err" "$TMP/out.json" | head -20
    fi
}
# fails NAME NEEDLE -- ARGS...: plan must exit non-zero with NEEDLE on stderr.
fails() {
    local name=$1 needle=$2
    shift 3
    if "$BIN" plan "$@" >/dev/null 2>"$TMP/err"; then
        bad "$name (exit 0)"
    elif grep -qF -- "$needle" "$TMP/err"; then
        ok "$name"
    else
        bad "$name"
        cat "$TMP/err"
    fi
}

# seed 002: 61 × 576 × 2 = 70,272 B; 40 GiB → 611,191.84 tokens per rank; DP=8 sums the pools
check mla_cell 'd["kv_bytes_per_token"] == 70272 and d["tokens_per_rank"] == 611191 and round(d["tokens_per_rank_exact"]) == 611192 and d["cluster_distinct_tokens"] == 8 * 611191 and d["layout"]["attn_dp"] == 8 and d["fits"] is None' -- \
    --model deepseek-v3 --tp 8 --dp 8 --enable-dp-attention --kv-pool-gib 40
check tp8_replicated 'd["cluster_distinct_tokens"] == d["tokens_per_rank"] == 611191' -- \
    --model deepseek-v3 --tp 8 --kv-pool-gib 40
# seed 002: DP gather 25.7 MB/layer, 1.49 GB over 58 layers, 3.3 ms at 450 GB/s
check dp_gather 'round(d["comm"]["dp_gather_bytes_per_layer"]/1e6, 1) == 25.7 and round(d["comm"]["bytes_per_step"]/1e9, 2) == 1.49 and round(d["comm"]["ideal_ms_per_step"], 1) == 3.3 and d["comm"]["mode"] == "dp_gather"' -- \
    --model deepseek-v3 --tp 8 --dp 8 --enable-dp-attention --moe-dense-tp-size 1 --kv-pool-gib 40 \
    --tokens-per-step 1024 --link-gb-per-s 450
# seed 002: EP N=8, T=128: 5.29 distinct, 4.63282 remote, 4.38 + 8.50 = 12.88 MB
check ep 'round(d["comm"]["expected_distinct_ranks"], 2) == 5.29 and round(d["comm"]["expected_remote_ranks"], 5) == 4.63282 and round(d["comm"]["ep_dispatch_bytes_per_layer"]/1e6, 2) == 4.38 and round(d["comm"]["ep_combine_bytes_per_layer"]/1e6, 2) == 8.50 and d["comm"]["mode"] == "ep"' -- \
    --model deepseek-v3 --tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep --kv-pool-gib 40 \
    --tokens-per-step 1024
check experts 'round(d["expert_bytes"]["per_expert"]/1e6, 2) == 44.04 and round(d["expert_bytes"]["per_layer"]/1e9, 2) == 11.27 and round(d["expert_bytes"]["per_rank_per_layer"]/1e9, 2) == 1.41' -- \
    --model deepseek-v3 --tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep --kv-pool-gib 40
# seed 000 §2: both --tp 8 shapes
check tp8_low_latency '(d["layout"]["attn_tp"], d["layout"]["attn_dp"], d["layout"]["moe_tp"], d["layout"]["moe_ep"]) == (8, 1, 8, 1)' -- \
    --model deepseek-v4-pro --gpu b200 --tp 8
check tp8_dpa_megamoe '(d["layout"]["attn_tp"], d["layout"]["attn_dp"], d["layout"]["moe_tp"], d["layout"]["moe_ep"]) == (1, 8, 1, 8) and d["violations"] == []' -- \
    --model deepseek-v4-pro --gpu b200 --tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend megamoe
# seed 000 §5.2 and §7
check attention_ai 'round(d["attention_ai"]["flop_per_byte_tp1"]) == 224 and round(d["attention_ai"]["flop_per_byte_this_layout"]) == 28' -- \
    --model deepseek-v4-flash --gpu b200 --tp 8
check flash_payload 'round(d["kv_bytes_per_request"]/2**30, 2) == 3.43 and round(d["kv_bytes_per_token"]) == 3517 and round(d["tokens_per_rank_exact"]/1e6, 2) == 9.77' -- \
    --model deepseek-v4-flash --tp 1 --kv-pool-gib 32 --context-len 1048576
# the V4 cache formats follow the same kv_spec: --kv-cache-dtype bf16 gives 1024-byte entries
# and 256-byte keys (21 x 1280/4 + 20 x 1024/128 + the rings), the FP4 indexer 68-byte keys
check flash_bf16 'round(d["kv_bytes_per_token"]) == 6885' -- \
    --model deepseek-v4-flash --tp 1 --kv-pool-gib 32 --context-len 1048576 --kv-cache-dtype bf16
check flash_bf16_fp4_indexer 'round(d["kv_bytes_per_token"]) == 5898' -- \
    --model deepseek-v4-flash --tp 1 --kv-pool-gib 32 --context-len 1048576 --kv-cache-dtype bf16 \
    --enable-deepseek-v4-fp4-indexer
check pro_4_b200 'd["fits"] is False and d["tokens_per_rank"] == 0 and d["weights_bytes_total"] > 768e9 and d["recipe_min_weight_bytes"] == 960e9 and any(v["rule"] == "weights_fit" for v in d["violations"])' -- \
    --model deepseek-v4-pro --gpu b200 --num-gpus 4 --tp 4
# seed 002: Qwen3-235B fp8 on 8 H100
check qwen3 'round(d["weights_bytes_per_rank"]/1e9, 1) == 29.4 and round(d["expert_bytes"]["per_expert"]/1e6, 1) == 18.9 and round(d["expert_bytes"]["per_rank_per_layer"]/1e6) == 302' -- \
    --model qwen3-235b-a22b --weights fp8 --gpu h100 --tp 8 --ep-size 8
# fleet flags and the environment
check nnodes 'd["num_gpus"] == 16 and d["violations"] == [] and d["fits"] is True' -- \
    --model deepseek-v3 --gpu h200 --nnodes 2 --gpus-per-node 8 --tp 16
check cpu 'd["fits"] is True and d["comm"]["ideal_ms_per_step"] is None' -- \
    --model deepseek-v2-lite --gpu cpu --gpu-mem-gb 64 --reserve-gb 4 --tp 2
if SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=64 "$BIN" plan --json --model deepseek-v3 --gpu b200 \
    --tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep --max-running-requests 1024 \
    >"$TMP/env.json" 2>&1 && grep -q 'SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK' "$TMP/env.json" &&
    grep -q 'dispatch capacity 64' "$TMP/env.json"; then ok env_dispatch; else bad env_dispatch; fi
cat >"$TMP/config.json" <<'EOF'
{"model_type":"deepseek_v2","vocab_size":102400,"hidden_size":2048,"intermediate_size":10944,
 "moe_intermediate_size":1408,"num_hidden_layers":27,"first_k_dense_replace":1,"moe_layer_freq":1,
 "num_attention_heads":16,"num_key_value_heads":16,"n_routed_experts":64,"n_shared_experts":2,
 "num_experts_per_tok":6,"q_lora_rank":null,"kv_lora_rank":512,"qk_nope_head_dim":128,
 "qk_rope_head_dim":64,"v_head_dim":128,"max_position_embeddings":163840,"tie_word_embeddings":false}
EOF
check model_config 'd["kv_bytes_per_token"] == 27 * 576 * 2 and d["weights"] == "bf16" and d["fits"] is True' -- \
    --model-config "$TMP/config.json" --gpu h100 --tp 2

# every preset through the family table gives the figures the planner gave before it did
# (kv bytes per token and per request, state bytes, tokens and weight bytes per rank, as
# printed by 36a8bd1, the last commit with the planner's own config reader), now from the
# family's kv_spec; V4's state bytes since w-v4mtp include 4 spill rows per compressor
# (a verify's rejected drafts; deepseek_v4.h V4_STATE_SPILL): 12206080 -> 13393920 on Flash
same_figures() {
    local name=$1 want=$2
    shift 2
    local got
    got=$("$BIN" plan --json --gpu b200 "$@" 2>"$TMP/err" | $PY -c "import json,sys; d=json.load(sys.stdin); print(d['kv_bytes_per_token'], d['kv_bytes_per_request'], d['state_bytes_per_request'], d['tokens_per_rank'], d['weights_bytes_per_rank'])")
    if [ "$got" = "$want" ]; then ok "$name"; else bad "$name"; echo "  got  $got"; echo "  want $want"; fi
}
same_figures v3_tp8 '70272.0 4605345792.0 0.0 1209121 83992632620.0' --model deepseek-v3 --tp 8 --context-len 65536
same_figures v3_dpa8 '70272.0 4605345792.0 0.0 1055430 94792774560.0' --model deepseek-r1 --tp 8 --dp 8 --enable-dp-attention --context-len 65536
same_figures v3_pp2 '35712.0 2340421632.0 0.0 4161105 21691373348.0' --model deepseek-v3 --tp 16 --pp-size 2 --nnodes 2 --gpus-per-node 16 --context-len 65536
same_figures v3_fp8kv '35136.0 5756682240.0 0.0 30796 167877938264.0' --model deepseek-v3 --tp 4 --kv-cache-dtype fp8_e4m3
same_figures flash_tp8 '3563.296875 233524224.0 13393920.0 41883568 19716411884.0' --model deepseek-v4-flash --tp 8 --context-len 65536
same_figures flash_pp2 '1862.578125 122065920.0 6758400.0 88099164 5112325280.0' --model deepseek-v4-flash --tp 16 --pp-size 2 --nnodes 2 --gpus-per-node 16 --context-len 65536
same_figures flash_short '6719.096 6719096.0 13393920.0 19313946 39187738492.0' --model deepseek-v4-flash --tp 4 --context-len 1000
same_figures pro_dpa8 '5101.015625 334300160.0 20447232.0 8362474 126302887716.0' --model deepseek-v4-pro --tp 8 --dp 8 --enable-dp-attention --context-len 65536
same_figures v2lite_tp8 '31104.0 2038431744.0 0.0 5305659 3932781952.0' --model deepseek-v2-lite --tp 8 --context-len 65536
same_figures moonlight_dpa8 '31104.0 2038431744.0 0.0 5263834 5233702400.0' --model moonlight-16b-a3b --tp 8 --dp 8 --enable-dp-attention --context-len 65536
same_figures qwen3_tp8 '48128.0 3154116608.0 0.0 2287628 58861008768.0' --model qwen3-235b-a22b --tp 8 --context-len 65536
same_figures qwen3_dpa8 '192512.0 12616466432.0 0.0 505321 71679499264.0' --model qwen3-235b-a22b --tp 8 --dp 8 --enable-dp-attention --context-len 65536
same_figures qwen3_fp8kv '24064.0 985661440.0 0.0 2133398 117621903104.0' --model qwen3-235b-a22b --tp 4 --kv-cache-dtype fp8_e4m3
same_figures llama_tp8 '40960.0 2684354560.0 0.0 3694318 17640734720.0' --model llama-3-70b --tp 8 --context-len 65536
same_figures llama_dpa8 '327680.0 21474836480.0 0.0 391666 40618704896.0' --model llama-3-70b --tp 8 --dp 8 --enable-dp-attention --context-len 65536

# readable output and --help
if "$BIN" plan --model deepseek-v3 --gpu h100 --tp 8 >"$TMP/table" 2>&1 && grep -q '^layout' "$TMP/table" &&
    grep -q 'DO NOT FIT' "$TMP/table"; then ok table; else bad table; fi
if "$BIN" plan --help >"$TMP/help" && grep -q -- '--moe-a2a-backend' "$TMP/help" &&
    grep -q -- '--kv-pool-gib' "$TMP/help" && grep -q -- '--sweep' "$TMP/help"; then ok help; else bad help; fi

# sweeps write plots
(cd "$TMP" && "$BIN" plan --model deepseek-v4-flash --gpu b200 --tp 4 --sweep layouts >"$TMP/sweep.txt")
if [ -s "$TMP/plan-sweep.svg" ] && grep -q '<svg' "$TMP/plan-sweep.svg" && grep -q 'DPA4+EP4' "$TMP/sweep.txt"; then
    ok sweep_svg
else bad sweep_svg; fi
if "$BIN" plan --model deepseek-v3 --gpu b200 --tp 8 --dp 8 --enable-dp-attention --sweep context \
    --sweep-contexts 8192,32768,131072 --plot "$TMP/c.png" --json >"$TMP/sweep.json" &&
    [ "$(head -c 4 "$TMP/c.png" | od -An -c | tr -d ' ')" = "211PNG" ] &&
    $PY -c "import json; d=json.load(open('$TMP/sweep.json')); assert d['contexts']==[8192,32768,131072]; s=d['series'][0]['admitted_requests']; assert s[0] > s[1] > s[2] > 0"; then
    ok sweep_png
else bad sweep_png; fi

# errors name the flag
fails bad_int '--tp' -- --model deepseek-v3 --tp eight
fails bad_gpu '--gpu' -- --model deepseek-v3 --gpu a100
fails bad_model '--model' -- --model gpt-5
fails bad_config '--model-config' -- --model-config "$TMP/none.json"
fails bad_weights '--weights' -- --model deepseek-v3 --weights int4
fails cpu_mem '--gpu-mem-gb' -- --model deepseek-v3 --gpu cpu --tp 8
fails unknown 'unknown flag' -- --model deepseek-v3 --frobnicate
fails no_memory '--kv-pool-gib' -- --model deepseek-v3 --tp 8
fails reserve_and_fraction 'not both' -- --model deepseek-v3 --gpu b200 --tp 8 --reserve-gb 8 \
    --mem-fraction-static 0.9
fails bad_sweep '--sweep' -- --model deepseek-v3 --gpu b200 --sweep everything
if SGLANG_DSV4_COMPRESS_STATE_DTYPE=fp16 "$BIN" plan --model deepseek-v3 --tp 8 --kv-pool-gib 1 \
    >/dev/null 2>"$TMP/err"; then bad bad_env; elif grep -q SGLANG_DSV4_COMPRESS_STATE_DTYPE "$TMP/err"; then
    ok bad_env
else bad bad_env; fi
report
