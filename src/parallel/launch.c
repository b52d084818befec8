/* launch.c — SGLang's launch flags: defaults, environment variables and the one flag
 * parser every command shares (serve, generate, plan).  Owns ms_launch_* only; what
 * the flags resolve to is layout.c.  Pure functions; any thread (getenv aside).
 */
#include "parallel/layout.h"

#include "parallel/eplb.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void ms_launch_init(ms_launch *l)
{
    memset(l, 0, sizeof *l);
    l->tp = l->dp = l->pp = 1;
    l->ep_size = 1;
    l->moe_dp_size = 1;
    l->attn_cp_size = 1;
    l->deepep_max_dispatch_tokens = 128; /* SGLang's env default */
    snprintf(l->kv_cache_dtype, sizeof l->kv_cache_dtype, "auto");
    l->page_size = 1;            /* SGLang's; serve/generate use 16 unless page_size_set */
    l->compress_state_bytes = 4; /* SGLANG_DSV4_COMPRESS_STATE_DTYPE default float32 */
    l->hicache_ratio = 2.0;      /* SGLang's --hicache-ratio default */
    l->eplb_rebalance_num_iterations = 1000; /* SGLang's defaults */
    l->eplb_min_utilization = 1.0;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !s[0] || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_state_dtype(const char *s)
{
    if (!strcasecmp(s, "fp32") || !strcasecmp(s, "float32")) return 4;
    if (!strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16")) return 2;
    return 0;
}

int ms_launch_apply_env(ms_launch *l, ms_errbuf *err)
{
    const char *v = getenv("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK");
    long n;
    if (v && *v) {
        if (parse_int(v, 1, MS_LAUNCH_MAX_DISPATCH, &n))
            return ms_err(err, MS_EINVAL,
                          "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK='%s': expected an "
                          "integer in 1..%d",
                          v, MS_LAUNCH_MAX_DISPATCH);
        l->deepep_max_dispatch_tokens = (int)n;
    }
    v = getenv("SGLANG_DSV4_COMPRESS_STATE_DTYPE");
    if (v && *v) {
        int b = parse_state_dtype(v);
        if (!b)
            return ms_err(
                err, MS_EINVAL,
                "SGLANG_DSV4_COMPRESS_STATE_DTYPE='%s': expected float32|fp32|bfloat16|bf16", v);
        l->compress_state_bytes = b;
    }
    v = getenv("SGLANG_DISABLE_STATIC_WATERFILL"); /* SGLang's bool: 1/true/yes, 0/false/no */
    if (v && *v) {
        if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"))
            l->waterfill_dynamic = true;
        else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no"))
            l->waterfill_dynamic = false;
        else
            return ms_err(err, MS_EINVAL,
                          "SGLANG_DISABLE_STATIC_WATERFILL='%s': expected 1|0|"
                          "true|false",
                          v);
    }
    return 0;
}

static const struct {
    const char *name;
    ms_a2a_alias alias;
} a2a_names[] = {
    {"none", MS_A2A_ALIAS_NONE},         {"mpi", MS_A2A_ALIAS_MPI},
    {"deepep", MS_A2A_ALIAS_DEEPEP},     {"megamoe", MS_A2A_ALIAS_MEGAMOE},
    {"mooncake", MS_A2A_ALIAS_MOONCAKE}, {"nixl", MS_A2A_ALIAS_NIXL},
    {"mori", MS_A2A_ALIAS_MORI},         {"flashinfer", MS_A2A_ALIAS_FLASHINFER},
};

const char *ms_launch_a2a_name(const ms_launch *l)
{
    for (size_t i = 0; i < sizeof a2a_names / sizeof a2a_names[0]; i++)
        if (a2a_names[i].alias == l->a2a_alias) return a2a_names[i].name;
    return "none";
}

static int kv_dtype_bytes(const char *s)
{
    static const struct {
        const char *name;
        int bytes;
    } t[] = {{"auto", 0},     {"bf16", 2},     {"bfloat16", 2}, {"fp16", 2}, {"float16", 2},
             {"fp8_e4m3", 1}, {"fp8_e5m2", 1}, {"fp8", 1},      {"fp32", 4}, {"float32", 4}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcasecmp(s, t[i].name)) return t[i].bytes;
    return -1;
}

/* Flags: kind 0 = switch, 1 = int, 2 = string handled below. */
enum { F_SWITCH, F_INT, F_STR };
enum {
    O_TP,
    O_DP,
    O_PP,
    O_DPA,
    O_EP,
    O_A2A,
    O_DENSE_TP,
    O_MOE_DP,
    O_CP,
    O_RUNNING,
    O_CHUNK,
    O_SPEC_ALG,
    O_DRAFT,
    O_REDUNDANT,
    O_DISPATCH,
    O_ENFORCE_FUSION,
    O_DISABLE_FUSION,
    O_DP_LM_HEAD,
    O_KV_DTYPE,
    O_PAGE,
    O_STATE_DTYPE,
    O_HICACHE,
    O_HICACHE_RATIO,
    O_UMBP,
    O_W4A4,
    O_DISAGG,
    O_EXPERT_LOC,
    O_EPLB_ALGO,
    O_EPLB,
    O_EPLB_ITERS,
    O_EPLB_CHUNK,
    O_EPLB_THRESH,
    O_STEPS,
    O_TOPK,
    O_NG_MIN,
    O_NG_MAX,
    O_NG_BFS,
    O_TOKEN_MAP,
    O_SWA_RATIO,
    O_FP4_INDEXER,
    O_WATERFILL,
    O_WATERFILL_OLD
};
static const struct {
    const char *name;
    int kind, id;
    long lo, hi;
    const char *help;
} flags[] = {
    {"--tp", F_INT, O_TP, 1, MS_LAUNCH_MAX_WIDTH, "N   launch TP width (alias --tp-size)"},
    {"--tp-size", F_INT, O_TP, 1, MS_LAUNCH_MAX_WIDTH, NULL},
    {"--tensor-parallel-size", F_INT, O_TP, 1, MS_LAUNCH_MAX_WIDTH, NULL},
    {"--dp", F_INT, O_DP, 1, MS_LAUNCH_MAX_WIDTH, "N   data-parallel size (alias --dp-size)"},
    {"--dp-size", F_INT, O_DP, 1, MS_LAUNCH_MAX_WIDTH, NULL},
    {"--data-parallel-size", F_INT, O_DP, 1, MS_LAUNCH_MAX_WIDTH, NULL},
    {"--pp-size", F_INT, O_PP, 1, MS_LAUNCH_MAX_WIDTH,
     "N   pipeline stages (alias --pp; plan only: serve refuses > 1)"},
    {"--pp", F_INT, O_PP, 1, MS_LAUNCH_MAX_WIDTH, NULL},
    {"--pipeline-parallel-size", F_INT, O_PP, 1, MS_LAUNCH_MAX_WIDTH, NULL},
    {"--enable-dp-attention", F_SWITCH, O_DPA, 0, 0,
     "    attention data-parallel (dp groups inside tp)"},
    {"--ep-size", F_INT, O_EP, 1, MS_LAUNCH_MAX_WIDTH, "N   expert-parallel size (alias --ep)"},
    {"--ep", F_INT, O_EP, 1, MS_LAUNCH_MAX_WIDTH, NULL},
    {"--expert-parallel-size", F_INT, O_EP, 1, MS_LAUNCH_MAX_WIDTH, NULL},
    {"--moe-a2a-backend", F_STR, O_A2A, 0, 0,
     "B   none|mpi|deepep|megamoe|mooncake|nixl|mori|flashinfer: each name but none\n"
     "                                               runs moeserve's MPI all-to-all (forces ep = "
     "tp)"},
    {"--moe-dense-tp-size", F_INT, O_DENSE_TP, 1, MS_LAUNCH_MAX_WIDTH,
     "N   1 = replicate dense/shared MLPs per rank (only 1 is supported)"},
    {"--moe-dp-size", F_INT, O_MOE_DP, 1, MS_LAUNCH_MAX_WIDTH,
     "N   MoE data-parallel size (default 1)"},
    {"--attn-cp-size", F_INT, O_CP, 1, MS_LAUNCH_MAX_WIDTH,
     "N   attention context-parallel size (plan only: serve refuses > 1)"},
    {"--max-running-requests", F_INT, O_RUNNING, 1, MS_LAUNCH_MAX_RUNNING,
     "N   global running-request ceiling (divided by attn_dp)"},
    {"--chunked-prefill-size", F_INT, O_CHUNK, -1, MS_LAUNCH_MAX_CHUNK,
     "N   global prefill chunk budget (divided by attn_dp; -1 off)"},
    {"--speculative-algorithm", F_STR, O_SPEC_ALG, 0, 0,
     "A   EAGLE|NEXTN|MTP (the checkpoint's MTP layer), NGRAM, none (DSPARK: plan only)"},
    {"--speculative-num-steps", F_INT, O_STEPS, 1, MS_LAUNCH_MAX_DRAFT - 1,
     "N   draft chain length S (default 3 with an algorithm)"},
    {"--speculative-eagle-topk", F_INT, O_TOPK, 1, 64, "N   draft tree breadth (only 1: chains)"},
    {"--speculative-num-draft-tokens", F_INT, O_DRAFT, 0, MS_LAUNCH_MAX_DRAFT,
     "N   draft tokens verified per step (a chain: S + 1)"},
    {"--speculative-ngram-min-match-window-size", F_INT, O_NG_MIN, 1, 64,
     "N   NGRAM: shortest match (default 1)"},
    {"--speculative-ngram-max-match-window-size", F_INT, O_NG_MAX, 1, 64,
     "N   NGRAM: longest match (default 12)"},
    {"--speculative-ngram-max-bfs-breadth", F_INT, O_NG_BFS, 1, 64,
     "N   NGRAM tree breadth (only 1: chains)"},
    {"--speculative-token-map", F_STR, O_TOKEN_MAP, 0, 0,
     "F   EAGLE's draft head over these token ids only (FR-Spec's hot tokens; text)"},
    {"--ep-num-redundant-experts", F_INT, O_REDUNDANT, 0, MS_LAUNCH_MAX_REDUNDANT,
     "N   redundant physical expert slots (EPLB)"},
    {"--deepep-max-dispatch-tokens-per-rank", F_INT, O_DISPATCH, 1, MS_LAUNCH_MAX_DISPATCH,
     "N   dispatch capacity per rank (env SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK, 128)"},
    {"--enforce-shared-experts-fusion", F_SWITCH, O_ENFORCE_FUSION, 0, 0,
     "    the shared expert as one more routed expert, a slot on every EP rank (a2a, EP > 1)"},
    {"--disable-shared-experts-fusion", F_SWITCH, O_DISABLE_FUSION, 0, 0,
     "    never fuse it (the default here; --enable-waterfill overrides it)"},
    {"--enable-waterfill", F_SWITCH, O_WATERFILL, 0, 0,
     "    SGLang's waterfill: the fused shared expert of each token to a lightly loaded\n"
     "                                               EP rank (a2a, EP > 1; alias "
     "--enable-deepep-waterfill)"},
    {"--enable-deepep-waterfill", F_SWITCH, O_WATERFILL_OLD, 0, 0, NULL},
    {"--enable-dp-lm-head", F_SWITCH, O_DP_LM_HEAD, 0, 0,
     "    DP ranks compute their own LM head: always so in serve (its LM head is\n"
     "                                               whole on every rank); plan: split over "
     "attn_tp"},
    {"--kv-cache-dtype", F_STR, O_KV_DTYPE, 0, 0,
     "T   auto|bf16|fp16|fp8_e4m3|fp8_e5m2|fp32 (serve: the activation dtype or fp8_e4m3)"},
    {"--page-size", F_INT, O_PAGE, 1, MS_LAUNCH_MAX_PAGE,
     "N   KV page size in tokens, any N (serve/generate default 16; plan: SGLang's 1)"},
    {"--compress-state-dtype", F_STR, O_STATE_DTYPE, 0, 0,
     "T   V4 compressor state fp32|bf16 (env SGLANG_DSV4_COMPRESS_STATE_DTYPE)"},
    {"--swa-full-tokens-ratio", F_STR, O_SWA_RATIO, 0, 0,
     "R   sliding-window pool tokens ÷ whole-history pool tokens, (0, 1] (V4; default:\n"
     "                                               each running request's window)"},
    {"--enable-deepseek-v4-fp4-indexer", F_SWITCH, O_FP4_INDEXER, 0, 0,
     "    V4 index keys (and the indexer's queries) as MXFP4, 68 bytes per key of 128"},
    {"--enable-hierarchical-cache", F_SWITCH, O_HICACHE, 0, 0, "    HiCache host tier (plan only)"},
    {"--hicache-ratio", F_STR, O_HICACHE_RATIO, 0, 0,
     "R   host/device token ratio (default 2; plan only)"},
    {"--enable-unified-cache-external-linker", F_SWITCH, O_UMBP, 0, 0,
     "    UMBP external KV store (plan only)"},
    {"--enable-w4a4-mxfp4-megamoe", F_SWITCH, O_W4A4, 0, 0, "    MegaMoE W4A4 kernel (plan only)"},
    {"--disaggregation-mode", F_STR, O_DISAGG, 0, 0,
     "M   null|prefill|decode (plan only: serve refuses all but null)"},
    {"--init-expert-location", F_STR, O_EXPERT_LOC, 0, 0,
     "F   trivial, a JSON placement {\"physical_to_logical_map\": [[...] per layer]},\n"
     "                                               or a recorded distribution "
     "(\"logical_count\": EPLB places once)"},
    {"--eplb-algorithm", F_STR, O_EPLB_ALGO, 0, 0,
     "A   auto|deepseek|deepseek_hierarchical: the policy placing a recorded distribution"},
    {"--enable-eplb", F_SWITCH, O_EPLB, 0, 0,
     "    rebalance the expert placement at run time from the recorded window (EP > 1, a2a)"},
    {"--eplb-rebalance-num-iterations", F_INT, O_EPLB_ITERS, 1, 1 << 30,
     "N   forward passes between rebalances (default 1000)"},
    {"--eplb-rebalance-layers-per-chunk", F_INT, O_EPLB_CHUNK, 1, MS_LAUNCH_MAX_WIDTH,
     "N   layers moved per forward pass (default: all at once)"},
    {"--eplb-min-rebalancing-utilization-threshold", F_STR, O_EPLB_THRESH, 0, 0,
     "X   skip a rebalance while the average balancedness is above X (default 1.0: never)"},
};

const char *ms_launch_help(void)
{
    static char buf[4096];
    if (buf[0]) return buf;
    size_t off = 0;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0] && off < sizeof buf; i++) {
        if (!flags[i].help) continue;
        int n = snprintf(buf + off, sizeof buf - off, "  %-40s %s\n", flags[i].name, flags[i].help);
        if (n < 0) break;
        off += (size_t)n;
    }
    return buf;
}

/* A number in (0, hi] into *r; -1 (r untouched) otherwise. */
static int parse_ratio(const char *v, double hi, double *r)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || !v[0] || *end || !(x > 0.0 && x <= hi)) return -1;
    *r = x;
    return 0;
}

static int set_string(ms_launch *l, int id, const char *flag, const char *v, ms_errbuf *err)
{
    switch (id) {
    case O_A2A:
        for (size_t i = 0; i < sizeof a2a_names / sizeof a2a_names[0]; i++)
            if (!strcasecmp(v, a2a_names[i].name)) {
                l->a2a_alias = a2a_names[i].alias;
                l->a2a = a2a_names[i].alias == MS_A2A_ALIAS_NONE ? MS_A2A_NONE : MS_A2A_MPI;
                return 1;
            }
        return ms_err(err, MS_EINVAL,
                      "%s '%s': expected none|mpi|deepep|megamoe|mooncake|nixl|mori|flashinfer",
                      flag, v);
    case O_SPEC_ALG:
        if (!strcasecmp(v, "none"))
            l->spec = MS_SPEC_NONE;
        else if (!strcasecmp(v, "EAGLE3"))
            return ms_err(err, MS_EINVAL,
                          "%s EAGLE3: not implemented (EAGLE3 needs a separate draft model, "
                          "--speculative-draft-model-path; EAGLE, NEXTN and MTP use the "
                          "checkpoint's own MTP layer)",
                          flag);
        else if (!strcasecmp(v, "EAGLE") || !strcasecmp(v, "NEXTN") || !strcasecmp(v, "MTP"))
            l->spec = MS_SPEC_EAGLE;
        else if (!strcasecmp(v, "DSPARK"))
            l->spec = MS_SPEC_DSPARK;
        else if (!strcasecmp(v, "NGRAM"))
            l->spec = MS_SPEC_NGRAM;
        else
            return ms_err(err, MS_EINVAL, "%s '%s': expected EAGLE|NEXTN|MTP|NGRAM|DSPARK|none",
                          flag, v);
        return 1;
    case O_KV_DTYPE: {
        int b = kv_dtype_bytes(v);
        if (b < 0 || strlen(v) >= sizeof l->kv_cache_dtype)
            return ms_err(err, MS_EINVAL, "%s '%s': expected auto|bf16|fp16|fp8_e4m3|fp8_e5m2|fp32",
                          flag, v);
        l->kv_cache_bytes = b;
        snprintf(l->kv_cache_dtype, sizeof l->kv_cache_dtype, "%s", v);
        return 1;
    }
    case O_STATE_DTYPE: {
        int b = parse_state_dtype(v);
        if (!b)
            return ms_err(err, MS_EINVAL, "%s '%s': expected fp32|float32|bf16|bfloat16", flag, v);
        l->compress_state_bytes = b;
        l->compress_state_flag = true;
        return 1;
    }
    case O_SWA_RATIO:
        if (parse_ratio(v, 1.0, &l->swa_full_tokens_ratio))
            return ms_err(err, MS_EINVAL, "%s '%s': expected a number in (0, 1]", flag, v);
        return 1;
    case O_HICACHE_RATIO:
        if (parse_ratio(v, 1000.0, &l->hicache_ratio))
            return ms_err(err, MS_EINVAL, "%s '%s': expected a number in (0, 1000]", flag, v);
        return 1;
    case O_TOKEN_MAP:
        if (strlen(v) >= sizeof l->speculative_token_map)
            return ms_err(err, MS_EINVAL, "%s: path longer than %zu bytes", flag,
                          sizeof l->speculative_token_map - 1);
        snprintf(l->speculative_token_map, sizeof l->speculative_token_map, "%s", v);
        return 1;
    case O_EXPERT_LOC:
        if (strlen(v) >= sizeof l->init_expert_location)
            return ms_err(err, MS_EINVAL, "%s: path longer than %zu bytes", flag,
                          sizeof l->init_expert_location - 1);
        snprintf(l->init_expert_location, sizeof l->init_expert_location, "%s",
                 strcmp(v, "trivial") ? v : "");
        return 1;
    case O_EPLB_ALGO:
        if ((l->eplb_algorithm = ms_eplb_policy_parse(v)) < 0)
            return ms_err(err, MS_EINVAL, "%s '%s': expected auto|deepseek|deepseek_hierarchical",
                          flag, v);
        return 1;
    case O_EPLB_THRESH: {
        char *end = NULL;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || !v[0] || *end || !(x >= 0.0 && x <= 1.0))
            return ms_err(err, MS_EINVAL, "%s '%s': expected a number in [0, 1]", flag, v);
        l->eplb_min_utilization = x;
        return 1;
    }
    case O_DISAGG:
        if (!strcasecmp(v, "null") || !strcasecmp(v, "none"))
            l->disagg = MS_DISAGG_NONE;
        else if (!strcasecmp(v, "prefill"))
            l->disagg = MS_DISAGG_PREFILL;
        else if (!strcasecmp(v, "decode"))
            l->disagg = MS_DISAGG_DECODE;
        else
            return ms_err(err, MS_EINVAL, "%s '%s': expected null|prefill|decode", flag, v);
        return 1;
    }
    return ms_err(err, MS_EINTERNAL, "%s: unhandled flag", flag);
}

static void set_int(ms_launch *l, int id, int v)
{
    switch (id) {
    case O_TP:
        l->tp = v;
        break;
    case O_DP:
        l->dp = v;
        break;
    case O_PP:
        l->pp = v;
        break;
    case O_EP:
        l->ep_size = v;
        break;
    case O_DENSE_TP:
        l->moe_dense_tp_size = v;
        break;
    case O_MOE_DP:
        l->moe_dp_size = v;
        break;
    case O_CP:
        l->attn_cp_size = v;
        break;
    case O_RUNNING:
        l->max_running_requests = v;
        break;
    case O_CHUNK:
        l->chunked_prefill_size = v == 0 ? -1 : v;
        break;
    case O_DRAFT:
        l->speculative_num_draft_tokens = v;
        break;
    case O_STEPS:
        l->speculative_num_steps = v;
        break;
    case O_TOPK:
        l->speculative_eagle_topk = v;
        break;
    case O_NG_MIN:
        l->ngram_min = v;
        break;
    case O_NG_MAX:
        l->ngram_max = v;
        break;
    case O_NG_BFS:
        l->ngram_bfs_breadth = v;
        break;
    case O_REDUNDANT:
        l->ep_num_redundant_experts = v;
        break;
    case O_EPLB_ITERS:
        l->eplb_rebalance_num_iterations = v;
        break;
    case O_EPLB_CHUNK:
        l->eplb_rebalance_layers_per_chunk = v;
        break;
    case O_DISPATCH:
        l->deepep_max_dispatch_tokens = v;
        break;
    case O_PAGE:
        l->page_size = v, l->page_size_set = true;
        break;
    }
}

static void set_switch(ms_launch *l, int id)
{
    switch (id) {
    case O_DPA:
        l->enable_dp_attention = true;
        break;
    case O_ENFORCE_FUSION:
        l->enforce_shared_experts_fusion = true;
        break;
    case O_DISABLE_FUSION:
        l->disable_shared_experts_fusion = true;
        break;
    case O_DP_LM_HEAD:
        l->enable_dp_lm_head = true;
        break;
    case O_HICACHE:
        l->enable_hierarchical_cache = true;
        break;
    case O_UMBP:
        l->enable_umbp = true;
        break;
    case O_W4A4:
        l->megamoe_w4a4 = true;
        break;
    case O_EPLB:
        l->enable_eplb = true;
        break;
    case O_FP4_INDEXER:
        l->v4_fp4_indexer = true;
        break;
    case O_WATERFILL:
        l->enable_waterfill = true;
        break;
    case O_WATERFILL_OLD:
        l->enable_waterfill = l->waterfill_old_name = true;
        break;
    }
}

int ms_launch_parse_arg(ms_launch *l, int argc, char **argv, int *i, ms_errbuf *err)
{
    if (*i < 0 || *i >= argc || !argv[*i]) return 0;
    const char *arg = argv[*i];
    const char *eq = strchr(arg, '=');
    size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) {
        const char *name = flags[k].name;
        if (strlen(name) != name_len || strncmp(arg, name, name_len)) continue;
        if (flags[k].kind == F_SWITCH) {
            if (eq) return ms_err(err, MS_EINVAL, "%s takes no value", name);
            set_switch(l, flags[k].id);
            *i += 1;
            return 1;
        }
        const char *v = eq ? eq + 1 : (*i + 1 < argc ? argv[*i + 1] : NULL);
        if (!v) return ms_err(err, MS_EINVAL, "%s needs a value", name);
        if (flags[k].kind == F_INT) {
            long n;
            if (parse_int(v, flags[k].lo, flags[k].hi, &n))
                return ms_err(err, MS_EINVAL, "%s '%s': expected an integer in %ld..%ld", name, v,
                              flags[k].lo, flags[k].hi);
            set_int(l, flags[k].id, (int)n);
        } else {
            int rc = set_string(l, flags[k].id, name, v, err);
            if (rc < 0) return rc;
        }
        *i += eq ? 1 : 2;
        return 1;
    }
    return 0;
}
