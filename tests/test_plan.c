/* test_plan.c — `moeserve plan` arithmetic against every figure the seeds print, at the
 * seeds' units and rounding (each check cites its seed sentence), plus presets, config.json
 * reading, constraints and the sweep.  MB/GB = 10^6/10^9 bytes, GiB = 2^30. */
#include "harness.h"
#include "plan/plan.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ms_plan_input in;
static ms_plan_result res;

/* Rounds x to `digits` decimals, as a seed prints it. */
static double rnd(double x, int digits)
{
    double p = pow(10, digits);
    return round(x * p) / p;
}

/* Sets up `in` for model/gpu with space-separated launch flags. */
static int setup(const char *model, const char *gpu, const char *flags)
{
    ms_errbuf err;
    ms_plan_input_init(&in);
    if (ms_plan_model_preset(model, &in.model, &err)) return -1;
    in.weights = in.model.published;
    if (gpu) {
        if (ms_plan_gpu_preset(gpu, &in.gpu, &err)) return -1;
        in.have_gpu = true;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s", flags);
    char *argv[64];
    int argc = 0;
    for (char *t = strtok(buf, " "); t && argc < 64; t = strtok(NULL, " ")) argv[argc++] = t;
    for (int i = 0; i < argc;)
        if (ms_launch_parse_arg(&in.launch, argc, argv, &i, &err) != 1) return -1;
    return 0;
}

static int run(void)
{
    ms_errbuf err;
    return ms_plan_run(&in, &res, &err);
}

static bool has_violation(const char *rule)
{
    for (int i = 0; i < res.n_violations; i++)
        if (!strcmp(res.violations[i].rule, rule)) return true;
    return false;
}

/* Seed 002: "The per-token cell is L·(r_kv + d_rope)·b = 61 × 576 × 2 = 70,272 bytes on every
 * rank, so a 40 GiB pool holds 42,949,672,960 / 70,272 = 611,192 tokens per rank — and all eight
 * ranks hold the same 611,192."  The quotient is 611,191.84: the seed rounds to nearest; an
 * allocator holds 611,191 whole tokens, which is what tokens_per_rank reports. */
TEST(seed002_mla_cell_and_pool)
{
    CHECK(setup("deepseek-v3", NULL, "--tp 8") == 0);
    in.kv_pool_gib = 40;
    CHECK(run() == 0);
    CHECK(res.kv_bytes_per_token == 70272.0);
    CHECK(res.kv_pool_bytes_per_rank == 42949672960.0);
    CHECK(llround(res.tokens_per_rank_exact) == 611192);
    CHECK(res.tokens_per_rank == 611191);
    CHECK(res.cluster_distinct_tokens == 611191); /* TP=8: eight identical copies */
    CHECK(res.layout.attn_tp == 8 && res.fits == false && !res.have_memory);
}

/* Seed 002: "under DP=8 each pool holds different sequences, so the cluster holds
 * 8 × 611,192 = 4,889,536" (8 × the rounded figure; floor-based we report 4,889,528). */
TEST(seed002_cluster_tokens_dp8)
{
    CHECK(setup("deepseek-v3", NULL, "--tp 8 --dp 8 --enable-dp-attention") == 0);
    in.kv_pool_gib = 40;
    CHECK(run() == 0);
    CHECK(8 * llround(res.tokens_per_rank_exact) == 4889536);
    CHECK(res.cluster_distinct_tokens == 8 * 611191);
    CHECK(res.layout.attn_dp == 8 && res.layout.attn_tp == 1);
}

/* Seed 002: "2 × 7/8 × 1024 × 7168 × 2 = 25.7 MB per layer per rank, or 1.49 GB per rank per
 * decode step over 58 MoE layers ... 450 GB/s one direction ... 3.3 ms"; "Figure 2's 12.85 MB
 * all-gather".  SGLang also gathers around the 3 dense layers unless --moe-dense-tp-size 1
 * (dense layers in FULL mode); the seed counts the 58 MoE layers, i.e. this flag. */
TEST(seed002_dp_gather)
{
    CHECK(setup("deepseek-v3", "h100",
                "--tp 8 --dp 8 --enable-dp-attention --moe-dense-tp-size 1") == 0);
    in.kv_pool_gib = 40;
    in.tokens_per_step = 1024;
    CHECK(run() == 0);
    CHECK(!strcmp(res.comm.mode, "dp_gather"));
    CHECK(res.comm.dp_gather_bytes_per_layer == 2 * 7.0 / 8 * 1024 * 7168 * 2);
    CHECK(rnd(res.comm.dp_gather_bytes_per_layer / 1e6, 1) == 25.7);
    CHECK(rnd(res.comm.dp_allgather_bytes_per_layer / 1e6, 2) == 12.85);
    CHECK(res.comm.gather_layers == 58);
    CHECK(rnd(res.comm.bytes_per_step / 1e9, 2) == 1.49);
    CHECK(res.comm.link_gb_s == 450);
    CHECK(rnd(res.comm.ideal_ms_per_step, 1) == 3.3);
    /* without --moe-dense-tp-size 1 the 3 dense layers gather too: 61 layers */
    CHECK(setup("deepseek-v3", "h100", "--tp 8 --dp 8 --enable-dp-attention") == 0);
    in.tokens_per_step = 1024;
    CHECK(run() == 0 && res.comm.gather_layers == 61);
}

/* Seed 002: "At N=8, T_ℓ=128, d=7168: EP moves 128 × 4.63282 × 7168 × 1.03125 = 4.38 MB
 * dispatched and 8.50 MB combined, 12.88 MB sent per layer per rank, against 25.7 MB ... about
 * 2.0× smaller"; "an expected 5.29 distinct ranks, of which 4.63 are remote". */
TEST(seed002_ep_dispatch_combine)
{
    CHECK(setup("deepseek-v3", "h100",
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep") == 0);
    in.tokens_per_step = 1024; /* T_g = 1024 → T_ℓ = 128 per rank */
    CHECK(run() == 0);
    CHECK(!strcmp(res.comm.mode, "ep") && res.comm.tokens_local == 128);
    CHECK(res.comm.ep_tokens_per_rank == 128);
    CHECK(rnd(res.comm.expected_distinct_ranks, 2) == 5.29);
    CHECK(rnd(res.comm.expected_remote_ranks, 5) == 4.63282);
    CHECK(rnd(res.comm.expected_remote_ranks, 2) == 4.63);
    CHECK(rnd(res.comm.ep_dispatch_bytes_per_layer / 1e6, 2) == 4.38);
    CHECK(rnd(res.comm.ep_combine_bytes_per_layer / 1e6, 2) == 8.50);
    double sent = res.comm.ep_dispatch_bytes_per_layer + res.comm.ep_combine_bytes_per_layer;
    CHECK(rnd(sent / 1e6, 2) == 12.88);
    CHECK(rnd(res.comm.dp_gather_bytes_per_layer / sent, 1) == 2.0);
    /* the with-replacement approximation N[1−(1−1/N)^k] is a different (larger) number */
    CHECK(fabs(8 * (1 - pow(7.0 / 8, 8)) - res.comm.expected_distinct_ranks) > 0.01);
    /* 116 serialised collectives: two per MoE layer × 58 */
    CHECK(2 * res.comm.moe_layers == 116);
}

/* Seed 002: "Each DeepSeek-V3 expert is 3 × 2048 × 7168 = 44.04 MB in fp8; all 256 are 11.27 GB
 * per layer ... TP=8 reads the same 1.41 GB per rank ... its bandwidth floor matches EP=8";
 * "E[1−(1−k/E)^B]" active experts. */
TEST(seed002_expert_bytes)
{
    CHECK(setup("deepseek-v3", NULL,
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep") == 0);
    in.kv_pool_gib = 40;
    in.tokens_per_step = 1024;
    CHECK(run() == 0);
    CHECK(res.expert.per_expert == 3.0 * 2048 * 7168);
    CHECK(rnd(res.expert.per_expert / 1e6, 2) == 44.04);
    CHECK(rnd(res.expert.per_layer / 1e9, 2) == 11.27);
    CHECK(rnd(res.expert.per_rank_per_layer / 1e9, 2) == 1.41);
    double ep = res.expert.per_rank_per_layer;
    CHECK(setup("deepseek-v3", NULL, "--tp 8") == 0);
    in.kv_pool_gib = 40;
    CHECK(run() == 0);
    CHECK(res.expert.per_rank_per_layer == ep); /* TP8 slice of every expert = EP8's 32 */
    /* expected active experts: one token activates exactly k = 8 */
    in.tokens_per_step = 1;
    CHECK(run() == 0 && fabs(res.expert.expected_active_experts - 8) < 1e-9);
    in.tokens_per_step = 128;
    CHECK(run() == 0);
    CHECK_NEAR(res.expert.expected_active_experts, 256 * (1 - pow(1 - 8.0 / 256, 128)), 1e-9);
}

/* Seed 000 §5.2: "AI_TP=1 ≈ 4 n_h c / 584 ≈ 224 FLOP/byte ... Under TP8 ... ≈ 28 FLOP/byte"
 * (V4-Flash, n_h = 64, c = 512). */
TEST(seed000_attention_intensity)
{
    CHECK(setup("deepseek-v4-flash", "b200", "--tp 8") == 0);
    CHECK(run() == 0);
    CHECK(round(res.ai.flop_per_byte_tp1) == 224);
    CHECK(round(res.ai.flop_per_byte_this_layout) == 28);
    CHECK(setup("deepseek-v4-flash", "b200", "--tp 8 --dp 8 --enable-dp-attention") == 0);
    CHECK(run() == 0 && round(res.ai.flop_per_byte_this_layout) == 224); /* DPA restores it */
    /* GQA: Llama-3-70B keeps its intensity up to TP = h_kv = 8, then KV heads replicate */
    CHECK(setup("llama-3-70b", "h100", "--tp 8") == 0);
    CHECK(run() == 0 && res.ai.flop_per_byte_this_layout == res.ai.flop_per_byte_tp1);
    CHECK(setup("llama-3-70b", "h100", "--tp 16") == 0);
    CHECK(run() == 0 && res.ai.flop_per_byte_this_layout == res.ai.flop_per_byte_tp1 / 2);
}

/* Seed 000 §7.2: Flash "3.43 GiB" per 1M request, "about 3,517 B" per token; Pro "4.92 GiB",
 * "about 5,036 B"; and the 32/64/96/128 GiB table (M = 10^6 tokens). */
TEST(seed000_v4_payload_and_table)
{
    static const double flash[4] = {9.77, 19.54, 29.31, 39.07};
    static const double pro[4] = {6.82, 13.65, 20.47, 27.29};
    for (int p = 0; p < 2; p++) {
        CHECK(setup(p ? "deepseek-v4-pro" : "deepseek-v4-flash", NULL, "--tp 1") == 0);
        in.context_len = 1048576;
        for (int k = 0; k < 4; k++) {
            in.kv_pool_gib = 32.0 * (k + 1);
            CHECK(run() == 0);
            CHECKF(rnd(res.tokens_per_rank_exact / 1e6, 2) == (p ? pro : flash)[k], "%.4f",
                   res.tokens_per_rank_exact / 1e6);
        }
        CHECK(rnd(res.kv_bytes_per_request / 1073741824.0, 2) == (p ? 4.92 : 3.43));
        CHECK(round(res.kv_bytes_per_token) == (p ? 5036 : 3517));
    }
    /* 21 CSA layers × (584+68)/4 + 20 HCA × 584/128 + 43 × 128 × 584 per request */
    CHECK(setup("deepseek-v4-flash", NULL, "--tp 1") == 0);
    double b = ms_plan_kv_request_bytes(&in.model, 0, MS_KV_INDEX_DEPLOYED, 1, 0, 43, 1048576);
    CHECK(b == 21.0 * 262144 * 652 + 20.0 * 8192 * 584 + 43.0 * 128 * 584);
    /* --kv-cache-dtype bf16: 1024-byte entries and 256-byte keys; MXFP4 keys with the flag */
    double bb = ms_plan_kv_request_bytes(&in.model, 2, MS_KV_INDEX_DEPLOYED, 1, 0, 43, 1048576);
    CHECK(bb == 21.0 * 262144 * (1024 + 256) + 20.0 * 8192 * 1024 + 43.0 * 128 * 1024);
    double bf = ms_plan_kv_request_bytes(&in.model, 2, MS_KV_INDEX_MXFP4, 1, 0, 43, 1048576);
    CHECK(bf == 21.0 * 262144 * (1024 + 68) + 20.0 * 8192 * 1024 + 43.0 * 128 * 1024);
    /* --kv-cache-dtype fp8_e4m3 without the FP4 indexer: SGLang's FP8 index keys, 128 e4m3
     * + an f32 scale (arch.md §2.11's ≈ 3850 B per token) */
    double b8 = ms_plan_kv_request_bytes(&in.model, 1, MS_KV_INDEX_DEPLOYED, 1, 0, 43, 1048576);
    CHECK(b8 == 21.0 * 262144 * (584 + 132) + 20.0 * 8192 * 584 + 43.0 * 128 * 584);
    CHECK(round(b8 / 1048576) == 3853);
    CHECK(ms_plan_kv_request_bytes(&in.model, 1, MS_KV_INDEX_MXFP4, 1, 0, 43, 1048576) == b);
    /* compressor state (excluded from the payload): fp32 default, bf16 halves it; the
     * reference's [8][1024], [8][256], [128][512] rows (×2: kv and score) plus 4 spill rows
     * each for a verify's rejected drafts (deepseek_v4.h V4_STATE_SPILL) */
    double s32 = ms_plan_state_request_bytes(&in.model, 4, 0, 43);
    CHECK(s32 == 4.0 * (21 * (2 * 12 * 1024 + 2 * 12 * 256) + 20 * (2 * 132 * 512)));
    CHECK(ms_plan_state_request_bytes(&in.model, 2, 0, 43) == s32 / 2);
}

/* A 1M-token request's attention on V4-Flash (deployed: FP8 entries, MXFP4 keys): a
 * decode token at its end reads the 128-entry window of 43 layers, the top-512 of 21
 * CSA layers' c4 entries, all 8192 c128 entries of 20 HCA layers and all 262144 index
 * keys of the CSA layers (457.3 MiB, 78 % of it index keys); 4 H d FLOPs per main
 * entry for this rank's heads, 2 n_I (d_I + 1) per key on every rank; the prefill
 * sums each position's reads (the indexer's ~n²/8 keys dominate). */
TEST(v4_flash_1m_request_attention_cost)
{
    CHECK(setup("deepseek-v4-flash", "h200", "--tp 8") == 0);
    in.context_len = 1048576;
    CHECK(run() == 0);
    double n = 1048576, win = 43.0 * 128, c4 = 21.0 * 512, c128 = 20.0 * 8192, ik = 21.0 * n / 4;
    CHECK(res.kv_cost.read_bytes_total == (win + c4 + c128) * 584 + ik * 68);
    CHECK(rnd(res.kv_cost.read_bytes_total / 1048576.0, 2) == 457.30);
    double fm = 4.0 * 64 / 8 * 512, fi = 2.0 * 64 * 129;
    CHECK_NEAR(res.kv_cost.decode_flops, (win + c4 + c128) * fm + ik * fi, 1e-3);
    /* Σ_{k=1..n} floor(k/4) = n²/8 − n/4 … exactly: 4·q(q−1)/2 + q with q = n/4, r = 0 */
    double q4 = n / 4, q128 = n / 128, s4 = 4 * q4 * (q4 - 1) / 2 + q4;
    double s128 = 128 * q128 * (q128 - 1) / 2 + q128;
    double sw = 127.0 * 128 / 2 + 128 * (n - 127);                    /* Σ min(k, 128) */
    double st = (4.0 * 512 * 511 / 2 + 512) - 512 + 512 * (n - 2047); /* Σ min(floor(k/4), 512) */
    double pf = 43 * sw * fm + 21 * st * fm + 20 * s128 * fm + 21 * s4 * fi;
    CHECKF(fabs(res.kv_cost.prefill_flops - pf) <= 1e-12 * pf, "%.6g vs %.6g",
           res.kv_cost.prefill_flops, pf);
}

/* Seed 000 §7.1: "Four 192-GB B200s provide at most 768 GB" and the Pro recipe declares about
 * 960 GB: "V4-Pro ... on 4 B200s ... zero, because the official model does not fit". */
TEST(seed000_pro_on_4_b200)
{
    CHECK(setup("deepseek-v4-pro", "b200", "--tp 4") == 0);
    CHECK(run() == 0);
    CHECK(4 * in.gpu.mem_gb == 768);
    CHECK(res.weights_total_bytes > 768e9);
    CHECK(res.recipe_min_weight_bytes == 960e9);
    CHECK(res.fits == false && res.tokens_per_rank == 0 && res.admitted_requests == 0);
    CHECK(has_violation("weights_fit"));
    /* DPA4 + EP4 does not help: attention replicated, experts still a quarter each */
    CHECK(setup("deepseek-v4-pro", "b200",
                "--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend megamoe") == 0);
    CHECK(run() == 0 && res.fits == false && res.cluster_distinct_tokens == 0);
    /* 8 B200s (the official shape): fits, and Flash fits on 4 */
    CHECK(setup("deepseek-v4-pro", "b200", "--tp 8") == 0);
    CHECK(run() == 0 && res.fits && res.tokens_per_rank > 0);
    CHECK(setup("deepseek-v4-flash", "b200", "--tp 4") == 0);
    CHECK(run() == 0 && res.fits && res.requests_per_rank >= 1); /* one 1M request fits */
}

/* arch.md §2.3: the V4-Flash checkpoint is "69,187 tensors, ~159.6 GB" (main stack + MTP). */
TEST(v4_flash_checkpoint_bytes)
{
    CHECK(setup("deepseek-v4-flash", NULL, "--tp 1 --speculative-algorithm EAGLE") == 0);
    in.kv_pool_gib = 1;
    CHECK(run() == 0);
    CHECK(rnd(res.weights_total_bytes / 1e9, 1) == 159.6);
}

/* Seed 002: "DeepSeek-V3 in fp8 is 671 GB, of which 11.41 GB is attention"; "Replicating
 * attention costs 10.7 GB per rank and cuts the per-rank pool by 36%. It still wins by 10.3×"
 * (16 GPUs, 72 GB per GPU for weights + KV).  The seed's 36%/10.3× count only the attention as
 * replicated; SGLang also replicates the embedding under DP-attention
 * (VocabParallelEmbedding(enable_tp=not dp_attention)) and the routers, which the planner counts:
 * 38.6% and 9.8×.  Both are checked. */
TEST(seed002_sixteen_gpus)
{
    CHECK(setup("deepseek-v3", "h100", "--tp 16") == 0);
    in.reserve_gb = 8;
    CHECK(run() == 0);
    double total_elem = 0;
    for (int c = 0; c < MS_WC_COUNT; c++) total_elem += res.total[c].elem;
    double attn = res.total[MS_WC_ATTENTION].elem;
    CHECK(rnd(total_elem / 1e9, 0) == 671);
    CHECK(rnd(attn / 1e9, 2) == 11.41);
    double pool_tp = res.headroom_bytes, tok_tp = (double)res.cluster_distinct_tokens;
    CHECK(setup("deepseek-v3", "h100", "--tp 16 --dp 16 --enable-dp-attention") == 0);
    in.reserve_gb = 8;
    CHECK(run() == 0);
    CHECK(rnd(res.attention_replication_bytes / 1e9, 1) == 10.7);
    /* the seed's accounting from the same totals */
    double seed_tp = 72e9 - total_elem / 16, seed_dp = 72e9 - (total_elem / 16 + attn * 15 / 16);
    CHECK(rnd(1 - seed_dp / seed_tp, 2) == 0.36);
    CHECK(rnd(16 * seed_dp / seed_tp, 1) == 10.3);
    /* the planner's full accounting */
    CHECK(rnd(1 - res.headroom_bytes / pool_tp, 3) == 0.386);
    CHECK(rnd((double)res.cluster_distinct_tokens / tok_tp, 1) == 9.8);
    /* "Eight 80 GB H100s cannot fit the default checkpoint" */
    CHECK(setup("deepseek-v3", "h100",
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep") == 0);
    CHECK(run() == 0 && res.fits == false && has_violation("weights_fit"));
}

/* Seed 002 "Worked: Qwen3-235B-A22B fp8 on one 8×H100 node": "235 GB — 29.4 GB per GPU across
 * eight"; "EP=8, giving 16 experts per rank at 3 × 1536 × 4096 = 18.9 MB each, so 302 MB of expert
 * weights per layer per rank". */
TEST(seed002_qwen3_on_8_h100)
{
    CHECK(setup("qwen3-235b-a22b", "h100", "--tp 8 --ep-size 8") == 0);
    in.weights = MS_WEIGHTS_FP8;
    CHECK(run() == 0);
    CHECK(rnd(res.weights_total_bytes / 1e9, 0) == 235);
    CHECKF(rnd(res.weights_bytes_per_rank / 1e9, 1) == 29.4, "%.4f",
           res.weights_bytes_per_rank / 1e9);
    CHECK(res.layout.experts_per_rank == 16 && res.layout.attn_tp == 8 && res.layout.moe_ep == 8);
    CHECK(rnd(res.expert.per_expert / 1e6, 1) == 18.9);
    CHECK(rnd(res.expert.per_rank_per_layer / 1e6, 0) == 302);
    CHECK(res.fits);
    /* GQA h_kv = 4: the KV cache shards up to attention TP 4 and replicates beyond */
    double per_tok8 = res.kv_bytes_per_token;
    CHECK(setup("qwen3-235b-a22b", "h100", "--tp 4") == 0);
    in.weights = MS_WEIGHTS_FP8;
    CHECK(run() == 0 && res.kv_bytes_per_token == per_tok8);
    CHECK(per_tok8 == 94.0 * 2 * 1 * 128 * 2);
}

/* Seed 000 §2 table through the planner (both --tp 8 shapes) and the describe line. */
TEST(seed000_layouts_in_plan)
{
    CHECK(setup("deepseek-v4-pro", "b200", "--tp 8") == 0);
    CHECK(run() == 0);
    CHECK(res.layout.attn_tp == 8 && res.layout.moe_tp == 8 && res.layout.moe_ep == 1);
    CHECK(setup("deepseek-v4-pro", "b200",
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend megamoe") == 0);
    CHECK(run() == 0);
    CHECK(res.layout.attn_tp == 1 && res.layout.attn_dp == 8 && res.layout.moe_ep == 8);
    CHECK(!strcmp(res.layout_line,
                  "attention TP=1, DP=8 · routed experts TP=1, EP=8 · dense/shared replicated"));
    CHECK(res.n_violations == 0); /* Blackwell + fp4 experts: MegaMoE W4A8 allowed */
}

TEST(hardware_constraints)
{
    CHECK(setup("deepseek-v4-flash", "h200",
                "--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend megamoe") == 0);
    CHECK(run() == 0 && has_violation("megamoe_blackwell"));
    for (int i = 0; i < res.n_violations; i++)
        if (!strcmp(res.violations[i].rule, "megamoe_blackwell"))
            CHECK(strstr(res.violations[i].message, "--moe-a2a-backend megamoe") != NULL);
    in.weights = MS_WEIGHTS_FP8; /* Hopper's all-FP8 MegaMoE path is fine */
    CHECK(run() == 0 && !has_violation("megamoe_blackwell"));
    CHECK(setup("deepseek-v4-flash", "rtx-pro-6000", "--tp 2 --enable-hierarchical-cache") == 0);
    CHECK(run() == 0 && has_violation("rtx_pro_unsupported"));
    CHECK(setup("deepseek-v4-flash", "mi355x",
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep") == 0);
    CHECK(run() == 0 && has_violation("amd_a2a_mori"));
    CHECK(setup("deepseek-v4-flash", "mi355x",
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend mori") == 0);
    CHECK(run() == 0 && !has_violation("amd_a2a_mori"));
    /* layout rules surface through the plan too */
    CHECK(setup("deepseek-v3", "b200",
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep "
                "--max-running-requests 2048 --speculative-num-draft-tokens 4") == 0);
    CHECK(run() == 0 && has_violation("dispatch_capacity"));
    in.num_gpus = 16;
    CHECK(run() == 0 && has_violation("num_gpus"));
    /* a context beyond the model's limit */
    CHECK(setup("llama-3-70b", "h100", "--tp 8") == 0);
    in.context_len = 100000;
    CHECK(run() == 0 && has_violation("context_len"));
}

/* --gpu cpu with a memory figure; pipeline stages; plain DP replicas count in cluster tokens. */
TEST(cpu_pp_and_replicas)
{
    CHECK(setup("deepseek-v2-lite", "cpu", "--tp 2 --dp 2") == 0);
    in.gpu.mem_gb = 64;
    in.reserve_gb = 4;
    CHECK(run() == 0 && res.fits);
    CHECK(res.layout.world_size == 4 && res.cluster_distinct_tokens == 2 * res.tokens_per_rank);
    CHECK(res.kv_bytes_per_token == 27.0 * 576 * 2);
    CHECK(res.comm.ideal_ms_per_step < 0); /* no link figure for cpu */
    in.link_gb_s = 10;
    CHECK(run() == 0 && res.comm.ideal_ms_per_step >= 0);
    /* pp 2 halves the per-rank layers: KV per token of the fuller stage (14 of 27 layers) */
    CHECK(setup("deepseek-v3", "h20-141", "--tp 8 --pp-size 2") == 0);
    CHECK(run() == 0);
    CHECK(res.kv_bytes_per_token == 31.0 * 576 * 2 || res.kv_bytes_per_token == 30.0 * 576 * 2);
    int a, b, c, d;
    ms_plan_stage_layers(61, 2, 0, &a, &b);
    ms_plan_stage_layers(61, 2, 1, &c, &d);
    CHECK(a == 0 && b == 31 && c == 31 && d == 61); /* SGLang: remainder before the last stage */
    CHECK(res.fits);
    /* page size rounds tokens down */
    CHECK(setup("deepseek-v3", NULL, "--tp 8 --page-size 64") == 0);
    in.kv_pool_gib = 40;
    CHECK(run() == 0 && res.tokens_per_rank == 611191 / 64 * 64);
}

/* Seed 000 §4 / seed 002 EPLB: "Redundant experts consume HBM that could otherwise be used by
 * KV" — 32 redundant slots on EP 8 add 4 experts × 44.05 MB × 58 layers to every rank. */
TEST(redundant_experts_cost_hbm)
{
    CHECK(setup("deepseek-v3", "b200",
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep") == 0);
    CHECK(run() == 0 && res.fits);
    double w0 = res.weights_bytes_per_rank;
    int64_t t0 = res.tokens_per_rank;
    CHECK(setup("deepseek-v3", "b200",
                "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep "
                "--ep-num-redundant-experts 32") == 0);
    CHECK(run() == 0 && res.fits);
    CHECK(res.layout.experts_per_rank == 36);
    CHECK_NEAR(res.weights_bytes_per_rank - w0, 4 * 58 * res.expert.per_expert_with_scales, 1);
    CHECK(res.tokens_per_rank < t0);
}

static const char *v3_config =
    "{\"model_type\":\"deepseek_v3\",\"vocab_size\":129280,\"hidden_size\":7168,"
    "\"intermediate_size\":18432,\"moe_intermediate_size\":2048,\"num_hidden_layers\":61,"
    "\"first_k_dense_replace\":3,\"moe_layer_freq\":1,\"num_attention_heads\":128,"
    "\"num_key_value_heads\":128,\"n_routed_experts\":256,\"n_shared_experts\":1,"
    "\"num_experts_per_tok\":8,\"topk_method\":\"noaux_tc\",\"q_lora_rank\":1536,"
    "\"kv_lora_rank\":512,\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"v_head_dim\":128,"
    "\"max_position_embeddings\":163840,\"num_nextn_predict_layers\":1,"
    "\"tie_word_embeddings\":false,\"quantization_config\":{\"quant_method\":\"fp8\","
    "\"weight_block_size\":[128,128]}}";

TEST(config_json_matches_preset)
{
    ms_errbuf err;
    ms_plan_model m;
    CHECK(ms_plan_model_parse(v3_config, &m, &err) == 0);
    CHECK(m.attn == MS_ATTN_MLA && m.n_kv_heads == 0 && m.published == MS_WEIGHTS_FP8);
    CHECK(setup("deepseek-v3", "b200", "--tp 8") == 0);
    CHECK(run() == 0);
    double preset_w = res.weights_bytes_per_rank, preset_kv = res.kv_bytes_per_token;
    in.model = m;
    CHECK(run() == 0);
    CHECK(res.weights_bytes_per_rank == preset_w && res.kv_bytes_per_token == preset_kv);
    /* a V4 config with its layer program */
    char v4[2048];
    int n =
        snprintf(v4, sizeof v4,
                 "{\"model_type\":\"deepseek_v4\",\"vocab_size\":129280,\"hidden_size\":4096,"
                 "\"num_hidden_layers\":43,\"num_attention_heads\":64,\"num_key_value_heads\":1,"
                 "\"head_dim\":512,\"qk_rope_head_dim\":64,\"q_lora_rank\":1024,\"o_groups\":8,"
                 "\"o_lora_rank\":1024,\"sliding_window\":128,\"index_n_heads\":64,"
                 "\"index_head_dim\":128,\"n_routed_experts\":256,\"n_shared_experts\":1,"
                 "\"num_experts_per_tok\":6,\"moe_intermediate_size\":2048,"
                 "\"num_hash_layers\":3,\"hc_mult\":4,\"topk_method\":\"noaux_tc\","
                 "\"max_position_embeddings\":1048576,\"num_nextn_predict_layers\":1,"
                 "\"expert_dtype\":\"fp4\",\"quantization_config\":{\"quant_method\":\"fp8\","
                 "\"scale_fmt\":\"ue8m0\"},\"compress_ratios\":[0,0");
    for (int i = 0; i < 20; i++) n += snprintf(v4 + n, sizeof v4 - (size_t)n, ",4,128");
    snprintf(v4 + n, sizeof v4 - (size_t)n, ",4,0]}");
    CHECK(ms_plan_model_parse(v4, &m, &err) == 0);
    CHECK(m.attn == MS_ATTN_V4 && m.published == MS_WEIGHTS_FP4_EXPERTS && m.fp8_scale_bytes == 1);
    CHECK(setup("deepseek-v4-flash", "b200", "--tp 4") == 0);
    CHECK(run() == 0);
    preset_w = res.weights_bytes_per_rank, preset_kv = res.kv_bytes_per_token;
    in.model = m;
    CHECK(run() == 0);
    CHECK(res.weights_bytes_per_rank == preset_w && res.kv_bytes_per_token == preset_kv);
    /* malformed inputs name the field */
    CHECK(ms_plan_model_parse("{\"hidden_size\":7168}", &m, &err) == MS_EFORMAT &&
          strstr(err.msg, "num_hidden_layers") != NULL);
    CHECK(ms_plan_model_parse("{\"vocab_size\":10,\"hidden_size\":\"big\",\"num_hidden_layers\":2,"
                              "\"num_attention_heads\":2}",
                              &m, &err) == MS_EFORMAT &&
          strstr(err.msg, "hidden_size") != NULL);
    CHECK(ms_plan_model_parse("[1,2]", &m, &err) == MS_EFORMAT);
    CHECK(ms_plan_model_parse("{\"vocab_size\":10,\"hidden_size\":64,\"num_hidden_layers\":2,"
                              "\"num_attention_heads\":2,\"compress_ratios\":[0,5]}",
                              &m, &err) == MS_EFORMAT &&
          strstr(err.msg, "compress_ratios[1]") != NULL);
    CHECK(ms_plan_model_load("/nonexistent/config.json", &m, &err) == MS_ENOENT &&
          strstr(err.msg, "--model-config") != NULL);
}

TEST(presets_and_json)
{
    ms_errbuf err;
    ms_plan_model m;
    ms_plan_gpu g;
    CHECK(ms_plan_model_preset("nope", &m, &err) == MS_ENOENT && strstr(err.msg, "--model"));
    CHECK(ms_plan_gpu_preset("a100", &g, &err) == MS_ENOENT && strstr(err.msg, "--gpu"));
    static const char *gpus[] = {"b200",   "b300",    "gb200",  "gb300",  "h100",         "h200",
                                 "h20-96", "h20-141", "mi300x", "mi355x", "rtx-pro-6000", "cpu"};
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++)
        CHECK(ms_plan_gpu_preset(gpus[i], &g, &err) == 0);
    CHECK(ms_plan_model_preset("deepseek-r1", &m, &err) == 0 && m.n_routed == 256);
    CHECK(setup("moonlight-16b-a3b", "h100", "--tp 1") == 0);
    CHECK(run() == 0 && res.fits);
    json_t *o = ms_plan_to_json(&in, &res);
    CHECK(o != NULL);
    static const char *keys[] = {"layout",
                                 "fits",
                                 "weights_bytes_per_rank",
                                 "kv_bytes_per_token",
                                 "kv_pool_bytes_per_rank",
                                 "tokens_per_rank",
                                 "cluster_distinct_tokens",
                                 "comm",
                                 "expert_bytes",
                                 "attention_ai",
                                 "violations"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CHECKF(json_object_get(o, keys[i]) != NULL, "%s", keys[i]);
    json_t *lay = json_object_get(o, "layout");
    static const char *lk[] = {"attn_tp", "attn_dp",  "attn_cp", "moe_tp",
                               "moe_ep",  "dense_tp", "pp"};
    for (size_t i = 0; i < sizeof lk / sizeof lk[0]; i++)
        CHECKF(json_is_integer(json_object_get(lay, lk[i])), "%s", lk[i]);
    json_decref(o);
    FILE *f = tmpfile();
    CHECK(f && ms_plan_print(f, &in, &res) == 0);
    fclose(f);
}

TEST(sweep_curve)
{
    static ms_plan_sweep s;
    ms_errbuf err;
    memset(&s, 0, sizeof s);
    CHECK(setup("deepseek-v4-flash", "b200", "--tp 4 --enable-hierarchical-cache") == 0);
    CHECK(ms_plan_sweep_run(&in, MS_SWEEP_LAYOUTS, &s, &err) == 0);
    CHECK(s.n_contexts == 9 && s.contexts[8] == 1048576);
    CHECK(s.n_series >= 6 && s.series[1].host_tier);
    for (int i = 0; i < s.n_series; i++)
        for (int c = 1; c < s.n_contexts; c++)
            CHECK(s.series[i].requests[c] <= s.series[i].requests[c - 1]); /* falls with context */
    char path[] = "/tmp/test-plan-XXXXXX.svg";
    int fd = mkstemps(path, 4);
    CHECK(fd >= 0);
    close(fd);
    CHECK(ms_plan_sweep_plot(&s, "test", path, &err) == 0);
    FILE *f = fopen(path, "r");
    char head[256] = {0};
    CHECK(f && fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    unlink(path);
    CHECK(strstr(head, "<svg") != NULL || strstr(head, "<?xml") != NULL);
    CHECK(ms_plan_sweep_plot(&s, "test", "/tmp/it's.svg", &err) == MS_EINVAL);
}

int main(void)
{
    RUN(seed002_mla_cell_and_pool);
    RUN(seed002_cluster_tokens_dp8);
    RUN(seed002_dp_gather);
    RUN(seed002_ep_dispatch_combine);
    RUN(seed002_expert_bytes);
    RUN(seed000_attention_intensity);
    RUN(seed000_v4_payload_and_table);
    RUN(v4_flash_1m_request_attention_cost);
    RUN(seed000_pro_on_4_b200);
    RUN(v4_flash_checkpoint_bytes);
    RUN(seed002_sixteen_gpus);
    RUN(seed002_qwen3_on_8_h100);
    RUN(seed000_layouts_in_plan);
    RUN(hardware_constraints);
    RUN(cpu_pp_and_replicas);
    RUN(redundant_experts_cost_hbm);
    RUN(config_json_matches_preset);
    RUN(presets_and_json);
    RUN(sweep_curve);
    return TEST_REPORT();
}
