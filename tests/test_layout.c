/* test_layout.c — launch flag parsing and layout resolution: seed 000's table for both
 * `--tp 8` shapes, plain DP, rank coordinates, and every validation rule's message. */
#include "harness.h"
#include "base/util.h"
#include "parallel/ep.h"
#include "parallel/layout.h"

#include <stdlib.h>
#include <string.h>

static const ms_layout_model dsv3 = {
    .n_heads = 128, .n_kv_heads = 0, .n_routed_experts = 256, .n_layers = 61, .n_dense_layers = 3};
static const ms_layout_model v4pro = {
    .n_heads = 128, .n_kv_heads = 0, .n_routed_experts = 384, .n_layers = 61, .n_dense_layers = 0};
static const ms_layout_model v4flash = {
    .n_heads = 64, .n_kv_heads = 0, .n_routed_experts = 256, .n_layers = 43, .n_dense_layers = 0};
static const ms_layout_model llama70 = {
    .n_heads = 64, .n_kv_heads = 8, .n_routed_experts = 0, .n_layers = 80, .n_dense_layers = 80};

/* Parses a space-separated flag string into l; returns the parser's first error or 0. */
static int parse(ms_launch *l, const char *flags, ms_errbuf *err)
{
    ms_launch_init(l);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", flags);
    char *argv[64];
    int argc = 0;
    for (char *t = strtok(buf, " "); t && argc < 64; t = strtok(NULL, " ")) argv[argc++] = t;
    for (int i = 0; i < argc;) {
        int rc = ms_launch_parse_arg(l, argc, argv, &i, err);
        if (rc < 0) return rc;
        if (rc == 0) return -100; /* not a launch flag */
    }
    return 0;
}

static int resolve(const char *flags, const ms_layout_model *m, ms_layout *lay, ms_errbuf *err)
{
    ms_launch l;
    int rc = parse(&l, flags, err);
    if (rc) return rc;
    return ms_layout_resolve(&l, m, lay, err);
}

static bool has_rule(const ms_layout *lay, const char *rule, const char *needle)
{
    for (int i = 0; i < lay->n_violations; i++)
        if (!strcmp(lay->violations[i].rule, rule) && strstr(lay->violations[i].message, needle))
            return true;
    return false;
}

/* Seed 000 §2 table, row 1: `--tp 8`, no DPA, no a2a → attention TP=8, MoE TP=8, EP=1. */
TEST(seed000_tp8_low_latency)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 8", &v4pro, &lay, &err) == 0);
    CHECK(lay.world_size == 8 && lay.attn_tp == 8 && lay.attn_dp == 1);
    CHECK(lay.moe_tp == 8 && lay.moe_ep == 1 && lay.sparse_mode == MS_MLP_TP_ATTN_FULL);
    char buf[256];
    ms_layout_describe(&lay, buf, sizeof buf);
    CHECKF(!strcmp(buf, "attention TP=8 · routed experts TP=8, EP=1 · dense/shared TP=8"), "%s",
           buf);
}

/* Seed 000 §2 table, row 2: `--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend megamoe`
 * → attention TP=1, DP=8; MoE TP=1, EP=8. */
TEST(seed000_tp8_dpa_megamoe)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend megamoe", &v4pro, &lay,
                  &err) == 0);
    CHECK(lay.world_size == 8 && lay.attn_tp == 1 && lay.attn_dp == 8);
    CHECK(lay.moe_tp == 1 && lay.moe_ep == 8 && lay.ep_forced);
    CHECK(lay.sparse_mode == MS_MLP_SCATTERED && lay.experts_per_rank == 48);
    CHECK(lay.a2a == MS_A2A_MPI);
    char buf[256];
    ms_layout_describe(&lay, buf, sizeof buf);
    CHECKF(
        !strcmp(buf, "attention TP=1, DP=8 · routed experts TP=1, EP=8 · dense/shared replicated"),
        "%s", buf);
}

/* The brief's example one-liner: V4-Flash balanced recipe TP4, DPA4, DeepEP (seed 000 §6.1). */
TEST(flash_dpa4_deepep)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend deepep", &v4flash, &lay,
                  &err) == 0);
    char buf[256];
    ms_layout_describe(&lay, buf, sizeof buf);
    CHECKF(
        !strcmp(buf, "attention TP=1, DP=4 · routed experts TP=1, EP=4 · dense/shared replicated"),
        "%s", buf);
}

/* Seed 000 §6.1 SGLang B200 recipe table: Flash TP4 (MoE TP4), TP4+DPA4+DeepEP (EP4, 2 draft
 * tokens), TP4+DPA4+MegaMoE (EP4); Pro TP8 (MoE TP8), TP8+DPA8+MegaMoE (EP8). */
TEST(seed000_recipe_table)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 4 --speculative-num-draft-tokens 4", &v4flash, &lay, &err) == 0);
    CHECK(lay.moe_tp == 4 && lay.moe_ep == 1 && lay.tokens_per_request_step == 4);
    CHECK(resolve("--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend deepep "
                  "--speculative-num-draft-tokens 2 --max-running-requests 256",
                  &v4flash, &lay, &err) == 0);
    CHECK(lay.moe_ep == 4 && lay.moe_tp == 1 && lay.max_running_per_rank == 64); /* 64×2 ≤ 128 */
    CHECK(resolve("--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend megamoe", &v4flash, &lay,
                  &err) == 0);
    CHECK(lay.moe_ep == 4 && lay.attn_tp == 1 && lay.experts_per_rank == 64);
    CHECK(resolve("--tp 8 --speculative-num-draft-tokens 4", &v4pro, &lay, &err) == 0);
    CHECK(lay.moe_tp == 8 && lay.attn_tp == 8);
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend megamoe "
                  "--speculative-num-draft-tokens 2",
                  &v4pro, &lay, &err) == 0);
    CHECK(lay.moe_ep == 8 && lay.attn_dp == 8);
    /* seed 003: Attention-CP8 -> MoE-TP8 prefill and DP32-EP32 decode */
    CHECK(resolve("--tp 8 --attn-cp-size 8", &v4pro, &lay, &err) == 0);
    CHECK(lay.attn_cp == 8 && lay.attn_tp == 1 && lay.moe_tp == 8);
    CHECK(resolve("--tp 32 --dp 32 --enable-dp-attention --moe-a2a-backend deepep", &v4pro, &lay,
                  &err) == 0);
    CHECK(lay.moe_ep == 32 && lay.experts_per_rank == 12);
}

/* Seed 002 walk-through: --tp 8 --dp-size 8 --ep 8 --enable-dp-attention --moe-a2a-backend
 * deepep: attn_tp_size = 8 // 8 // 1 = 1, attn_dp_rank = tp_rank = 3. */
TEST(seed002_walkthrough_coords)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 8 --dp-size 8 --ep 8 --enable-dp-attention --moe-a2a-backend deepep", &dsv3,
                  &lay, &err) == 0);
    ms_rank_coords c;
    CHECK(ms_layout_rank_coords(&lay, 3, &c) == 0);
    CHECK(c.attn_tp_rank == 0 && c.attn_dp_rank == 3 && c.moe_ep_rank == 3 && c.moe_tp_rank == 0);
    CHECK(c.first_expert == 96 && lay.experts_per_rank == 32);
    CHECK(ms_layout_rank_coords(&lay, 8, &c) == MS_EINVAL);
}

/* The identity expert map is today's placement: EP rank r holds the contiguous logical
 * experts [first_expert, first_expert + experts_per_rank), in order, for every rank of
 * every EP layout; a permutation moves experts and their owners with it. */
TEST(identity_expert_map_is_contiguous_placement)
{
    const char *launches[] = {"--tp 8 --ep 8",
                              "--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep",
                              "--tp 8 --ep 4", "--tp 8 --ep 2 --moe-dp-size 2", "--tp 4"};
    for (size_t i = 0; i < sizeof launches / sizeof launches[0]; i++) {
        ms_layout lay;
        ms_errbuf err = {{0}};
        CHECKF(resolve(launches[i], &dsv3, &lay, &err) == 0, "%s: %s", launches[i], err.msg);
        ms_expert_map map;
        CHECK(ms_expert_map_init_identity(&map, 256, lay.moe_ep, &err) == 0);
        CHECK(map.per_rank == lay.experts_per_rank);
        for (int r = 0; r < lay.world_size; r++) {
            ms_rank_coords c;
            CHECK(ms_layout_rank_coords(&lay, r, &c) == 0);
            for (int s = 0; s < map.per_rank; s++) {
                int e = ms_expert_map_local(&map, c.moe_ep_rank, s);
                CHECKF(e == c.first_expert + s, "%s rank %d slot %d: %d", launches[i], r, s, e);
                CHECK(ms_expert_map_owner(&map, map.physical_of[e]) == c.moe_ep_rank);
            }
        }
        ms_expert_map_deinit(&map);
    }
    ms_expert_map map;
    ms_errbuf err = {{0}};
    int32_t perm[8] = {7, 6, 5, 4, 3, 2, 1, 0}, dup[8] = {0, 1, 2, 3, 4, 5, 6, 6};
    CHECK(ms_expert_map_init_from(&map, 8, 2, perm, &err) == 0);
    CHECK(ms_expert_map_local(&map, 0, 0) == 7 && map.physical_of[7] == 0);
    CHECK(ms_expert_map_owner(&map, map.physical_of[0]) == 1 && ms_expert_map_slot(&map, 7) == 3);
    ms_expert_map_deinit(&map);
    CHECK(ms_expert_map_init_from(&map, 8, 2, dup, &err) == MS_EINVAL);
    CHECKF(strstr(err.msg, "exactly once") != NULL, "%s", err.msg);
    CHECK(ms_expert_map_init_identity(&map, 8, 3, &err) == MS_EINVAL);
}

/* Seed 002 ScatterMode docstring: TP=4, DP=2, DP-attention → [ab, ab, cd, cd]. */
TEST(tp4_dp2_groups)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 4 --dp 2 --enable-dp-attention", &dsv3, &lay, &err) == 0);
    CHECK(lay.attn_tp == 2 && lay.attn_dp == 2 && lay.sparse_mode == MS_MLP_FULL);
    CHECK(lay.dense_mode == MS_MLP_FULL && lay.dense_tp == 4 && lay.embed_tp == 1);
    int dp_rank[4], tp_rank[4];
    for (int r = 0; r < 4; r++) {
        ms_rank_coords c;
        CHECK(ms_layout_rank_coords(&lay, r, &c) == 0);
        dp_rank[r] = c.attn_dp_rank;
        tp_rank[r] = c.attn_tp_rank;
    }
    CHECK(dp_rank[0] == 0 && dp_rank[1] == 0 && dp_rank[2] == 1 && dp_rank[3] == 1);
    CHECK(tp_rank[0] == 0 && tp_rank[1] == 1 && tp_rank[2] == 0 && tp_rank[3] == 1);
    CHECK(resolve("--tp 4 --dp 2 --enable-dp-attention --moe-dense-tp-size 1", &dsv3, &lay, &err) ==
          0);
    CHECK(lay.dense_tp == 1 && lay.dense_mode == MS_MLP_TP_ATTN_FULL);
}

/* Plain DP (no DP-attention): dp independent replicas of tp ranks each. */
TEST(plain_dp_replicas)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 2 --dp 3", &dsv3, &lay, &err) == 0);
    CHECK(lay.world_size == 6 && lay.n_replicas == 3 && lay.attn_tp == 2 && lay.attn_dp == 1);
    CHECK(lay.moe_tp == 2 && lay.moe_ep == 1);
    ms_rank_coords c;
    CHECK(ms_layout_rank_coords(&lay, 5, &c) == 0);
    CHECK(c.replica == 2 && c.tp_rank == 1 && c.attn_tp_rank == 1 && c.attn_dp_rank == 0);
    char buf[256];
    ms_layout_describe(&lay, buf, sizeof buf);
    CHECKF(strstr(buf, "3 replicas × (attention TP=2") != NULL, "%s", buf);
    /* with pp: W = dp·tp·pp */
    CHECK(resolve("--tp 2 --dp 2 --pp-size 2", &dsv3, &lay, &err) == 0);
    CHECK(lay.world_size == 8);
    CHECK(ms_layout_rank_coords(&lay, 6, &c) == 0);
    CHECK(c.replica == 1 && c.pp_rank == 1 && c.tp_rank == 0);
}

/* Per-rank budgets: seed 001 §3.6/§3.7 — "--chunked-prefill-size is a global budget divided by
 * --dp": 49152/8 = 6144 and 65536/8 = 8192; max-running 256 over DP 8 = 32. */
TEST(per_rank_budgets)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --chunked-prefill-size 49152", &v4pro, &lay,
                  &err) == 0);
    CHECK(lay.chunked_prefill_per_rank == 6144);
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --chunked-prefill-size 65536 "
                  "--max-running-requests 256",
                  &v4pro, &lay, &err) == 0);
    CHECK(lay.chunked_prefill_per_rank == 8192 && lay.max_running_per_rank == 32);
    CHECK(resolve("--tp 8 --max-running-requests 96", &v4pro, &lay, &err) == 0);
    CHECK(lay.max_running_per_rank == 96); /* TP-only: the ceiling is the per-rank batch */
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --max-running-requests 100", &v4pro, &lay,
                  &err) == 0);
    CHECK(lay.max_running_per_rank == 12); /* floor */
}

TEST(flag_parsing)
{
    ms_launch l;
    ms_errbuf err = {{0}};
    CHECK(parse(&l, "--tp=4 --moe-a2a-backend=mori --kv-cache-dtype fp8_e4m3 --hicache-ratio 2.5",
                &err) == 0);
    CHECK(l.tp == 4 && l.a2a == MS_A2A_MPI && l.a2a_alias == MS_A2A_ALIAS_MORI);
    CHECK(l.kv_cache_bytes == 1 && l.hicache_ratio == 2.5);
    CHECK(!strcmp(ms_launch_a2a_name(&l), "mori"));
    CHECK(parse(&l, "--tp eight", &err) == MS_EINVAL && strstr(err.msg, "--tp") != NULL);
    CHECK(parse(&l, "--moe-a2a-backend pplx", &err) == MS_EINVAL &&
          strstr(err.msg, "--moe-a2a-backend") != NULL);
    CHECK(parse(&l, "--ep-size", &err) == MS_EINVAL && strstr(err.msg, "needs a value") != NULL);
    CHECK(parse(&l, "--enable-dp-attention=1", &err) == MS_EINVAL);
    CHECK(parse(&l, "--tp 0", &err) == MS_EINVAL);
    CHECK(parse(&l, "--compress-state-dtype fp16", &err) == MS_EINVAL &&
          strstr(err.msg, "--compress-state-dtype") != NULL);
    CHECK(parse(&l, "--model foo", &err) == -100); /* not a launch flag: left for the command */
    CHECK(parse(&l, "--speculative-algorithm DSPARK --compress-state-dtype bf16", &err) == 0);
    CHECK(l.spec == MS_SPEC_DSPARK && l.compress_state_bytes == 2);
    CHECK(strstr(ms_launch_help(), "--moe-a2a-backend") != NULL);
}

TEST(env_variables)
{
    ms_launch l;
    ms_errbuf err = {{0}};
    ms_launch_init(&l);
    CHECK(l.deepep_max_dispatch_tokens == 128 && l.compress_state_bytes == 4);
    setenv("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "1024", 1);
    setenv("SGLANG_DSV4_COMPRESS_STATE_DTYPE", "bfloat16", 1);
    CHECK(ms_launch_apply_env(&l, &err) == 0);
    CHECK(l.deepep_max_dispatch_tokens == 1024 && l.compress_state_bytes == 2);
    setenv("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "lots", 1);
    CHECK(ms_launch_apply_env(&l, &err) == MS_EINVAL &&
          strstr(err.msg, "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK") != NULL);
    unsetenv("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK");
    unsetenv("SGLANG_DSV4_COMPRESS_STATE_DTYPE");
}

/* Every validation rule, each with a message naming the flag. */
TEST(validation_messages)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 8 --dp 3 --enable-dp-attention", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "tp_mod_dp", "--tp 8 is not divisible by --dp 3"));
    CHECK(strstr(err.msg, "--dp 3") != NULL);
    CHECK(resolve("--tp 8 --attn-cp-size 3", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "attn_cp", "--attn-cp-size 3"));
    CHECK(resolve("--tp 3", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "heads_mod_attn_tp",
                   "128 attention heads are not divisible by attention TP 3"));
    CHECK(resolve("--tp 16", &llama70, &lay, &err) == 0); /* 16 % 8 kv heads == 0: replicated */
    CHECK(resolve("--tp 16 --attn-cp-size 1",
                  &(ms_layout_model){.n_heads = 48, .n_kv_heads = 12, .n_layers = 4}, &lay,
                  &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "kv_heads_attn_tp", "12 KV heads"));
    CHECK(resolve("--tp 8 --ep-size 3", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "tp_mod_ep", "--ep-size 3"));
    CHECK(resolve("--tp 8 --ep-size 4 --moe-a2a-backend deepep", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "ep_a2a", "--ep-size 4 conflicts with --moe-a2a-backend deepep"));
    CHECK(resolve("--tp 6 --dp 6 --enable-dp-attention --moe-a2a-backend deepep",
                  &(ms_layout_model){.n_heads = 6, .n_routed_experts = 256, .n_layers = 4}, &lay,
                  &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "experts_mod_ep", "256 experts"));
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep "
                  "--ep-num-redundant-experts 4",
                  &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "experts_mod_ep", "--ep-num-redundant-experts 4"));
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep "
                  "--ep-num-redundant-experts 32",
                  &dsv3, &lay, &err) == 0);
    CHECK(lay.n_physical_experts == 288 && lay.experts_per_rank == 36);
    /* running × draft vs dispatch capacity: 1024/8 = 128 per rank × 2 = 256 > 128 */
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep "
                  "--max-running-requests 1024 --speculative-num-draft-tokens 2",
                  &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "dispatch_capacity",
                   "--max-running-requests 1024 (128 per rank) x 2 draft "
                   "tokens = 256 > dispatch capacity 128"));
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep "
                  "--max-running-requests 1024 --speculative-num-draft-tokens 2 "
                  "--deepep-max-dispatch-tokens-per-rank 256",
                  &dsv3, &lay, &err) == 0);
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --max-running-requests 4", &dsv3, &lay,
                  &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "running_per_rank", "--max-running-requests 4"));
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --chunked-prefill-size 7", &dsv3, &lay,
                  &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "chunk_per_rank", "--chunked-prefill-size 7"));
    CHECK(resolve("--tp 8 --ep-size 8 --enforce-shared-experts-fusion", &dsv3, &lay, &err) ==
          MS_ELAYOUT);
    CHECK(has_rule(&lay, "shared_fusion_ep", "--enforce-shared-experts-fusion"));
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend megamoe "
                  "--enforce-shared-experts-fusion",
                  &dsv3, &lay, &err) == 0);
    CHECK(resolve("--tp 8 --enforce-shared-experts-fusion", &dsv3, &lay, &err) == 0);
    CHECK(resolve("--tp 8 --enforce-shared-experts-fusion --disable-shared-experts-fusion", &dsv3,
                  &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "shared_fusion_flags", "exclusive"));
    CHECK(resolve("--tp 8 --pp-size 2 --speculative-algorithm DSPARK", &dsv3, &lay, &err) ==
          MS_ELAYOUT);
    CHECK(has_rule(&lay, "dspark_pp", "pp_size == 1"));
    CHECK(resolve("--tp 8 --speculative-algorithm DSPARK --disaggregation-mode decode", &dsv3, &lay,
                  &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "dspark_disagg", "--disaggregation-mode"));
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --speculative-algorithm DSPARK", &dsv3, &lay,
                  &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "dspark_dp_lm_head", "--enable-dp-lm-head"));
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --enable-dp-lm-head "
                  "--speculative-algorithm DSPARK",
                  &dsv3, &lay, &err) == 0);
    CHECK(lay.tokens_per_request_step == 6 && lay.lm_head_tp == 1);
    CHECK(resolve("--tp 8 --enable-dp-lm-head", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "dp_lm_head", "--enable-dp-attention"));
    CHECK(resolve("--tp 8 --enable-unified-cache-external-linker", &dsv3, &lay, &err) ==
          MS_ELAYOUT);
    CHECK(has_rule(&lay, "umbp_dpa", "requires --enable-dp-attention"));
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --enable-unified-cache-external-linker "
                  "--enable-hierarchical-cache",
                  &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "hicache_umbp", "exclusive"));
    CHECK(resolve("--tp 8 --moe-dense-tp-size 2", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "moe_dense_tp_size", "--moe-dense-tp-size 2"));
    CHECK(resolve("--tp 8 --enable-w4a4-mxfp4-megamoe", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "w4a4_megamoe", "megamoe"));
    CHECK(resolve("--tp 1 --pp-size 62", &dsv3, &lay, &err) == MS_ELAYOUT);
    CHECK(has_rule(&lay, "pp_layers", "--pp-size 62"));
    /* several violations are all recorded */
    CHECK(resolve("--tp 8 --dp 3 --enable-dp-attention --ep-size 3", &dsv3, &lay, &err) ==
          MS_ELAYOUT);
    CHECK(lay.n_violations >= 2);
    /* a struct built by code (not the parser) with tp 0 is caught, not divided by */
    ms_launch l;
    ms_launch_init(&l);
    l.tp = 0;
    CHECK(ms_layout_resolve(&l, &dsv3, &lay, &err) == MS_ELAYOUT && strstr(err.msg, "--tp 0"));
}

/* Launch structs built by code with any values: resolve answers 0 or MS_ELAYOUT, never divides
 * by zero or overflows (run under SANITIZE=1), and valid layouts have consistent coordinates. */
TEST(random_launches)
{
    uint64_t seed = 12345;
    static const int vals[] = {-1, 0, 1, 2, 3, 4, 6, 8, 16, 32, 64, 65536, 65537};
    const int nv = (int)(sizeof vals / sizeof vals[0]);
    for (int it = 0; it < 20000; it++) {
        ms_launch l;
        ms_launch_init(&l);
        int *f[] = {&l.tp,
                    &l.dp,
                    &l.pp,
                    &l.ep_size,
                    &l.attn_cp_size,
                    &l.moe_dp_size,
                    &l.max_running_requests,
                    &l.chunked_prefill_size,
                    &l.speculative_num_draft_tokens,
                    &l.ep_num_redundant_experts};
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
            if (ms_rng_next(&seed) % 3 == 0) *f[k] = vals[ms_rng_next(&seed) % (uint64_t)nv];
        l.enable_dp_attention = ms_rng_next(&seed) & 1;
        l.a2a = (ms_rng_next(&seed) & 1) ? MS_A2A_MPI : MS_A2A_NONE;
        l.a2a_alias = l.a2a ? MS_A2A_ALIAS_DEEPEP : MS_A2A_ALIAS_NONE;
        ms_layout_model m = {.n_heads = vals[ms_rng_next(&seed) % (uint64_t)nv],
                             .n_kv_heads = (int)(ms_rng_next(&seed) % 9),
                             .n_routed_experts = vals[ms_rng_next(&seed) % (uint64_t)nv],
                             .n_layers = 61};
        ms_layout lay;
        ms_errbuf err;
        int rc = ms_layout_resolve(&l, &m, &lay, &err);
        CHECK(rc == 0 || rc == MS_ELAYOUT);
        CHECK((rc == 0) == (lay.n_violations == 0));
        if (rc == 0) {
            CHECK(lay.world_size >= 1 && lay.attn_tp * lay.attn_dp * lay.attn_cp == lay.tp);
            CHECK(lay.moe_tp * lay.moe_ep * lay.moe_dp == lay.tp);
            ms_rank_coords c;
            CHECK(ms_layout_rank_coords(&lay, lay.world_size - 1, &c) == 0);
            CHECK(c.attn_dp_rank < lay.attn_dp && c.moe_ep_rank < lay.moe_ep);
        }
        char buf[1024];
        CHECK(ms_layout_describe_table(&lay, buf, sizeof buf) > 0);
    }
}

TEST(describe_table)
{
    ms_layout lay;
    ms_errbuf err = {{0}};
    CHECK(resolve("--tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep "
                  "--max-running-requests 256",
                  &dsv3, &lay, &err) == 0);
    char buf[2048];
    int n = ms_layout_describe_table(&lay, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n < sizeof buf);
    CHECK(strstr(buf, "max running 32") != NULL && strstr(buf, "SCATTERED") != NULL);
    CHECK(resolve("--tp 8", &llama70, &lay, &err) == 0);
    ms_layout_describe(&lay, buf, sizeof buf);
    CHECKF(!strcmp(buf, "attention TP=8 · MLP TP=8"), "%s", buf);
}

int main(void)
{
    RUN(seed000_tp8_low_latency);
    RUN(seed000_tp8_dpa_megamoe);
    RUN(flash_dpa4_deepep);
    RUN(seed000_recipe_table);
    RUN(seed002_walkthrough_coords);
    RUN(identity_expert_map_is_contiguous_placement);
    RUN(tp4_dp2_groups);
    RUN(plain_dp_replicas);
    RUN(per_rank_budgets);
    RUN(flag_parsing);
    RUN(env_variables);
    RUN(validation_messages);
    RUN(random_launches);
    RUN(describe_table);
    return TEST_REPORT();
}
