/* layout.c — resolves a launch shape into attention and expert layouts (DESIGN.md §3)
 * and validates it against the rules the seeds state, every message naming the flag.
 * Owns ms_layout_resolve, rank coordinates and the printed description; the flags
 * themselves are launch.c.  Pure functions over caller storage; any thread.
 *
 * Formulas (seed 000 §2, seed 002 compute_dp_attention_world_info):
 *   attn_dp = dp if DP-attention else 1;   attn_tp = tp / (attn_dp · attn_cp)
 *   ep = tp under any all-to-all backend;  moe_tp = tp / (moe_dp · ep)
 *   W = tp · pp with DP-attention, dp · tp · pp for plain DP replicas.
 */
#include "parallel/layout.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void ms_layout_add_violation(ms_layout *out, const char *rule, const char *fmt, ...)
{
    if (out->n_violations >= MS_LAYOUT_MAX_VIOLATIONS) return;
    ms_layout_violation *v = &out->violations[out->n_violations++];
    snprintf(v->rule, sizeof v->rule, "%s", rule);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->message, sizeof v->message, fmt, ap);
    va_end(ap);
}

static int div_or_floor(int a, long b)
{
    return b > 0 ? (int)(a / b) : 0;
}

/* Rows one request contributes to a decode step. */
static int verify_width(const ms_launch *l)
{
    if (l->speculative_num_draft_tokens > 0) return l->speculative_num_draft_tokens;
    if (l->spec == MS_SPEC_EAGLE || l->spec == MS_SPEC_NGRAM) /* a chain of S drafts + 1 */
        return (l->speculative_num_steps > 0 ? l->speculative_num_steps : 3) + 1;
    /* Seed 001 §3.4: DSpark reads its shape from the checkpoint; both official
     * checkpoints resolve to gamma=5, verify_num_draft_tokens=6. */
    if (l->spec == MS_SPEC_DSPARK) return 6;
    return 1;
}

static void check_ranges(const ms_launch *l, ms_layout *o)
{
    static const struct {
        const char *flag;
        size_t off;
    } w[] = {{"--tp", offsetof(ms_launch, tp)},
             {"--dp", offsetof(ms_launch, dp)},
             {"--pp-size", offsetof(ms_launch, pp)},
             {"--ep-size", offsetof(ms_launch, ep_size)},
             {"--moe-dp-size", offsetof(ms_launch, moe_dp_size)},
             {"--attn-cp-size", offsetof(ms_launch, attn_cp_size)},
             {"--page-size", offsetof(ms_launch, page_size)}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        int v;
        memcpy(&v, (const char *)l + w[i].off, sizeof v);
        if (v < 1 || v > MS_LAUNCH_MAX_WIDTH)
            ms_layout_add_violation(o, "range", "%s %d: must be in 1..%d", w[i].flag, v,
                                    MS_LAUNCH_MAX_WIDTH);
    }
}

static void validate(const ms_launch *l, const ms_layout_model *m, ms_layout *o)
{
    const int tp = l->tp, dp = l->dp;
    check_ranges(l, o);
    if ((long)o->world_size > MS_LAUNCH_MAX_WIDTH || o->world_size < 1)
        ms_layout_add_violation(o, "world_size", "world size %d (tp·pp%s) exceeds %d ranks",
                                o->world_size, l->enable_dp_attention ? "" : "·dp",
                                MS_LAUNCH_MAX_WIDTH);
    if (l->enable_dp_attention && dp > 0 && tp % dp != 0)
        ms_layout_add_violation(o, "tp_mod_dp",
                                "--tp %d is not divisible by --dp %d (SGLang requires tp_size %% "
                                "dp_size == 0 with --enable-dp-attention)",
                                tp, dp);
    else if (o->attn_dp > 0 && l->attn_cp_size > 0 &&
             tp % ((long)o->attn_dp * l->attn_cp_size) != 0)
        ms_layout_add_violation(o, "attn_cp",
                                "--attn-cp-size %d does not divide tp/attn_dp = %d/%d (attn_tp = "
                                "tp / (attn_dp * attn_cp) must be whole)",
                                l->attn_cp_size, tp, o->attn_dp);
    if (o->attn_tp > 0 && m->n_heads > 0 && m->n_heads % o->attn_tp != 0)
        ms_layout_add_violation(o, "heads_mod_attn_tp",
                                "%d attention heads are not divisible by attention TP %d (from "
                                "--tp %d / (--dp %d * --attn-cp-size %d))",
                                m->n_heads, o->attn_tp, tp, o->attn_dp, l->attn_cp_size);
    if (o->attn_tp > 0 && m->n_kv_heads > 0) {
        bool bad = o->attn_tp >= m->n_kv_heads ? o->attn_tp % m->n_kv_heads != 0
                                               : m->n_kv_heads % o->attn_tp != 0;
        if (bad)
            ms_layout_add_violation(
                o, "kv_heads_attn_tp",
                "%d KV heads and attention TP %d (--tp %d): one must divide the "
                "other",
                m->n_kv_heads, o->attn_tp, tp);
    }
    if (l->a2a != MS_A2A_NONE && l->ep_size != 1 && l->ep_size != tp)
        ms_layout_add_violation(o, "ep_a2a",
                                "--ep-size %d conflicts with --moe-a2a-backend %s, which requires "
                                "ep_size == tp_size (%d)",
                                l->ep_size, ms_launch_a2a_name(l), tp);
    else if (o->moe_ep > 0 && l->moe_dp_size > 0 && tp % ((long)l->moe_dp_size * o->moe_ep) != 0)
        ms_layout_add_violation(
            o, "tp_mod_ep",
            "--ep-size %d (x --moe-dp-size %d) does not divide --tp %d (moe_tp = "
            "tp / (moe_dp * ep) must be whole)",
            o->moe_ep, l->moe_dp_size, tp);
    if (m->n_routed_experts > 0 && o->moe_ep > 0 && o->n_physical_experts % o->moe_ep != 0)
        ms_layout_add_violation(o, "experts_mod_ep",
                                "%d experts (%d routed + --ep-num-redundant-experts %d) are not "
                                "divisible by EP %d (--ep-size/--tp)",
                                o->n_physical_experts, m->n_routed_experts,
                                l->ep_num_redundant_experts, o->moe_ep);
    if (m->n_routed_experts == 0 && l->ep_num_redundant_experts > 0)
        ms_layout_add_violation(o, "redundant_dense",
                                "--ep-num-redundant-experts %d on a dense model",
                                l->ep_num_redundant_experts);
    if (l->moe_dense_tp_size != 0 && l->moe_dense_tp_size != 1)
        ms_layout_add_violation(o, "moe_dense_tp_size",
                                "--moe-dense-tp-size %d: only 1 (replicate dense MLPs) or unset is "
                                "supported",
                                l->moe_dense_tp_size);
    if (l->max_running_requests > 0 && o->attn_dp > 0 && l->max_running_requests < o->attn_dp)
        ms_layout_add_violation(o, "running_per_rank",
                                "--max-running-requests %d is divided by attn_dp %d: 0 per rank",
                                l->max_running_requests, o->attn_dp);
    if (l->chunked_prefill_size > 0 && o->attn_dp > 0 && l->chunked_prefill_size < o->attn_dp)
        ms_layout_add_violation(o, "chunk_per_rank",
                                "--chunked-prefill-size %d is divided by attn_dp %d: 0 per rank",
                                l->chunked_prefill_size, o->attn_dp);
    /* Seed 001 "Concurrency & DeepEP dispatch buffer": running × draft ≤ dispatch capacity
     * per rank.  The buffer is per rank and each rank dispatches its own requests' rows,
     * so the per-rank running budget (global / attn_dp) is the one compared. */
    if (l->a2a != MS_A2A_NONE && o->max_running_per_rank > 0 && /* every a2a alias */
        (long)o->max_running_per_rank * o->tokens_per_request_step > l->deepep_max_dispatch_tokens)
        ms_layout_add_violation(o, "dispatch_capacity",
                                "--max-running-requests %d (%d per rank) x %d draft tokens = %ld > "
                                "dispatch capacity %d "
                                "per rank (--deepep-max-dispatch-tokens-per-rank / "
                                "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK)",
                                l->max_running_requests, o->max_running_per_rank,
                                o->tokens_per_request_step,
                                (long)o->max_running_per_rank * o->tokens_per_request_step,
                                l->deepep_max_dispatch_tokens);
    if (l->enforce_shared_experts_fusion && l->disable_shared_experts_fusion)
        ms_layout_add_violation(
            o, "shared_fusion_flags",
            "--enforce-shared-experts-fusion and --disable-shared-experts-fusion "
            "are exclusive");
    if (l->enforce_shared_experts_fusion && o->moe_ep > 1 && l->a2a_alias != MS_A2A_ALIAS_DEEPEP &&
        l->a2a_alias != MS_A2A_ALIAS_MEGAMOE)
        ms_layout_add_violation(
            o, "shared_fusion_ep",
            "--enforce-shared-experts-fusion is rejected with moe_ep_size %d > 1 "
            "(only the deepep/megamoe per-rank shared slot allows it)",
            o->moe_ep);
    /* SGLang switches any other backend to deepep for waterfill (megamoe kept); moeserve's
     * aliases all run its one all-to-all, so only "none" lacks the path it needs. */
    if (l->enable_waterfill && l->a2a == MS_A2A_NONE)
        ms_layout_add_violation(o, "waterfill_a2a",
                                "%s without an all-to-all backend is not implemented (SGLang "
                                "switches to deepep): add --moe-a2a-backend deepep|megamoe",
                                l->waterfill_old_name ? "--enable-deepep-waterfill"
                                                      : "--enable-waterfill");
    if (l->spec == MS_SPEC_DSPARK && l->pp != 1)
        ms_layout_add_violation(o, "dspark_pp",
                                "--speculative-algorithm DSPARK requires pp_size == "
                                "1 (got --pp-size %d)",
                                l->pp);
    if (l->spec == MS_SPEC_DSPARK && l->disagg != MS_DISAGG_NONE)
        ms_layout_add_violation(o, "dspark_disagg",
                                "--speculative-algorithm DSPARK cannot run under "
                                "--disaggregation-mode (use EAGLE/MTP)");
    if (l->spec == MS_SPEC_DSPARK && o->attn_dp > 1 && !l->enable_dp_lm_head)
        ms_layout_add_violation(
            o, "dspark_dp_lm_head",
            "--speculative-algorithm DSPARK under --enable-dp-attention requires "
            "--enable-dp-lm-head");
    if (l->enable_dp_lm_head && !l->enable_dp_attention)
        ms_layout_add_violation(o, "dp_lm_head",
                                "--enable-dp-lm-head requires --enable-dp-attention");
    if (l->enable_umbp && !l->enable_dp_attention)
        ms_layout_add_violation(o, "umbp_dpa",
                                "--enable-unified-cache-external-linker (UMBP) requires "
                                "--enable-dp-attention (TP ranks would key eight copies of one "
                                "replicated cache)");
    if (l->enable_umbp && l->enable_hierarchical_cache)
        ms_layout_add_violation(o, "hicache_umbp",
                                "--enable-hierarchical-cache (HiCache) and "
                                "--enable-unified-cache-external-linker (UMBP) are exclusive");
    if (l->megamoe_w4a4 && l->a2a_alias != MS_A2A_ALIAS_MEGAMOE)
        ms_layout_add_violation(o, "w4a4_megamoe",
                                "--enable-w4a4-mxfp4-megamoe needs --moe-a2a-backend megamoe");
    if (m->n_layers > 0 && l->pp > m->n_layers)
        ms_layout_add_violation(o, "pp_layers", "--pp-size %d exceeds the model's %d layers", l->pp,
                                m->n_layers);
}

int ms_layout_resolve(const ms_launch *l, const ms_layout_model *m, ms_layout *out, ms_errbuf *err)
{
    memset(out, 0, sizeof *out);
    const int tp = l->tp, dp = l->dp, pp = l->pp;
    const bool dpa = l->enable_dp_attention;
    out->tp = tp;
    out->pp = pp;
    out->attn_dp = dpa ? dp : 1;
    out->attn_cp = l->attn_cp_size;
    out->attn_tp = div_or_floor(tp, (long)out->attn_dp * out->attn_cp);
    out->n_replicas = dpa ? 1 : dp;
    long long world = (long long)tp * pp * out->n_replicas;
    out->world_size = world > INT_MAX ? INT_MAX : (int)world;
    out->a2a = l->a2a;
    out->moe_ep = l->a2a != MS_A2A_NONE ? tp : l->ep_size;
    out->ep_forced = l->a2a != MS_A2A_NONE && l->ep_size != tp;
    out->moe_dp = l->moe_dp_size;
    out->moe_tp = div_or_floor(tp, (long)out->moe_dp * out->moe_ep);
    out->dense_tp = l->moe_dense_tp_size == 1 ? 1 : tp;
    out->shared_tp = l->a2a != MS_A2A_NONE ? 1 : tp; /* a2a: the shared expert is local */
    out->fusion_asked = l->enforce_shared_experts_fusion || l->enable_waterfill;
    out->fusion_flag = !l->enable_waterfill
                           ? (out->fusion_asked ? "--enforce-shared-experts-fusion" : NULL)
                       : l->waterfill_old_name ? "--enable-deepep-waterfill"
                                               : "--enable-waterfill";
    out->shared_mode = l->a2a == MS_A2A_NONE              ? MS_SHARED_SEPARATE
                       : l->enable_waterfill              ? MS_SHARED_WATERFILL
                       : l->enforce_shared_experts_fusion ? MS_SHARED_FUSED
                                                          : MS_SHARED_SEPARATE;
    out->lm_head_tp = l->enable_dp_lm_head ? out->attn_tp : tp;
    out->embed_tp = dpa ? 1 : tp; /* SGLang: VocabParallelEmbedding(enable_tp=not dp_attention) */
    out->has_dense = m->n_dense_layers > 0;
    out->sparse_mode = l->a2a != MS_A2A_NONE ? MS_MLP_SCATTERED
                       : out->attn_dp > 1    ? MS_MLP_FULL
                                             : MS_MLP_TP_ATTN_FULL;
    out->dense_mode =
        (l->moe_dense_tp_size == 1 || out->attn_dp <= 1) ? MS_MLP_TP_ATTN_FULL : MS_MLP_FULL;
    out->n_routed_experts = m->n_routed_experts;
    out->n_physical_experts = m->n_routed_experts > 0 && l->ep_num_redundant_experts >= 0
                                  ? m->n_routed_experts + l->ep_num_redundant_experts
                                  : m->n_routed_experts;
    out->experts_per_rank = div_or_floor(out->n_physical_experts, out->moe_ep);
    out->max_running_per_rank =
        l->max_running_requests > 0 ? div_or_floor(l->max_running_requests, out->attn_dp) : 0;
    out->chunked_prefill_per_rank = l->chunked_prefill_size > 0
                                        ? div_or_floor(l->chunked_prefill_size, out->attn_dp)
                                        : l->chunked_prefill_size;
    out->tokens_per_request_step = verify_width(l);
    validate(l, m, out);
    if (out->n_violations > 0) return ms_err(err, MS_ELAYOUT, "%s", out->violations[0].message);
    return 0;
}

int ms_layout_check_engine(const ms_layout *lay, ms_errbuf *err)
{
    if (lay->pp > 1)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--pp-size %d: pipeline parallelism is not supported "
                      "by the CPU engine yet",
                      lay->pp);
    if (lay->attn_cp > 1)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--attn-cp-size %d: context parallelism is not "
                      "supported by the CPU engine yet",
                      lay->attn_cp);
    if (lay->fusion_asked && lay->shared_mode == MS_SHARED_SEPARATE)
        return ms_err(err, MS_EUNSUPPORTED,
                      "%s without an all-to-all backend is not implemented: "
                      "the CPU engine fuses the shared expert on the all-to-all path only "
                      "(--moe-a2a-backend deepep|megamoe, EP >= 2)",
                      lay->fusion_flag);
    if (lay->shared_mode != MS_SHARED_SEPARATE && lay->moe_ep <= 1)
        return ms_err(err, MS_EUNSUPPORTED,
                      "%s at EP %d is not implemented: the shared expert's "
                      "slot on every EP rank needs EP >= 2 (SGLang's support boundary; use --tp 2 "
                      "or more with the a2a backend)",
                      lay->fusion_flag, lay->moe_ep);
    int redundant = lay->n_physical_experts - lay->n_routed_experts;
    if (redundant > 0 && lay->moe_ep <= 1)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--ep-num-redundant-experts %d at EP %d: redundant "
                      "replicas balance load across EP ranks, and there is nothing to balance "
                      "with one (use --ep-size > 1)",
                      redundant, lay->moe_ep);
    if (redundant > 0 && lay->sparse_mode != MS_MLP_SCATTERED)
        return ms_err(err, MS_EUNSUPPORTED,
                      "--ep-num-redundant-experts %d: redundant replicas "
                      "need the all-to-all MoE path (--moe-a2a-backend mpi|deepep; each token "
                      "then goes to one replica)",
                      redundant);
    return 0;
}

int ms_layout_rank_coords(const ms_layout *lay, int world_rank, ms_rank_coords *c)
{
    if (world_rank < 0 || world_rank >= lay->world_size || lay->tp < 1 || lay->attn_tp < 1 ||
        lay->attn_cp < 1 || lay->attn_dp < 1 || lay->moe_tp < 1 || lay->moe_ep < 1 ||
        lay->moe_dp < 1 || lay->pp < 1 || lay->n_replicas < 1 || lay->dense_tp < 1 ||
        lay->shared_tp < 1)
        return MS_EINVAL;
    if ((long)lay->attn_tp * lay->attn_cp * lay->attn_dp != lay->tp ||
        (long)lay->moe_tp * lay->moe_ep * lay->moe_dp != lay->tp || lay->tp % lay->dense_tp ||
        lay->tp % lay->shared_tp || (long)lay->tp * lay->pp * lay->n_replicas != lay->world_size)
        return MS_EINVAL;
    memset(c, 0, sizeof *c);
    c->world_rank = world_rank;
    c->tp_rank = world_rank % lay->tp;
    int stage = world_rank / lay->tp; /* replica·pp + pp_rank */
    c->pp_rank = stage % lay->pp;
    c->replica = stage / lay->pp;
    /* attention: (dp, cp, tp) with tp fastest (seed 002 compute_dp_attention_world_info) */
    c->attn_tp_rank = c->tp_rank % lay->attn_tp;
    c->attn_cp_rank = (c->tp_rank / lay->attn_tp) % lay->attn_cp;
    c->attn_dp_rank =
        lay->attn_dp > 1 ? (int)(c->tp_rank / ((long)lay->attn_tp * lay->attn_cp)) : 0;
    /* experts: (moe_dp, ep, moe_tp) with moe_tp fastest (SGLang parallel_state groups) */
    c->moe_tp_rank = c->tp_rank % lay->moe_tp;
    c->moe_ep_rank = (c->tp_rank / lay->moe_tp) % lay->moe_ep;
    c->moe_dp_rank = (int)(c->tp_rank / ((long)lay->moe_tp * lay->moe_ep));
    c->dense_rank = c->tp_rank % lay->dense_tp;
    c->shared_rank = c->tp_rank % lay->shared_tp;
    c->first_expert = c->moe_ep_rank * lay->experts_per_rank;
    return 0;
}

int ms_layout_group_span(const ms_layout *lay, const ms_rank_coords *c, int kind, int *first,
                         int *stride, int *size)
{
    int base = c->world_rank - c->tp_rank; /* this stage of this replica */
    *stride = 1;
    switch (kind) {
    case MS_GROUP_TP:
        *first = base;
        *size = lay->tp;
        return 0;
    case MS_GROUP_ATTN_TP:
        *first = base + (c->attn_dp_rank * lay->attn_cp + c->attn_cp_rank) * lay->attn_tp;
        *size = lay->attn_tp;
        return 0;
    case MS_GROUP_MOE_EP:
        *first = base + c->moe_dp_rank * lay->moe_ep * lay->moe_tp + c->moe_tp_rank;
        *stride = lay->moe_tp;
        *size = lay->moe_ep;
        return 0;
    case MS_GROUP_MOE_TP:
        *first = base + (c->tp_rank / lay->moe_tp) * lay->moe_tp;
        *size = lay->moe_tp;
        return 0;
    case MS_GROUP_DENSE:
        *first = base + (c->tp_rank / lay->dense_tp) * lay->dense_tp;
        *size = lay->dense_tp;
        return 0;
    case MS_GROUP_DP:
        *first = c->pp_rank * lay->tp + c->tp_rank;
        *stride = lay->pp * lay->tp;
        *size = lay->n_replicas;
        return 0;
    default:
        return MS_EINVAL;
    }
}

static const char *mode_name(ms_mlp_mode m)
{
    return m == MS_MLP_FULL        ? "FULL (all-gather + reduce-scatter)"
           : m == MS_MLP_SCATTERED ? "SCATTERED (a2a dispatch/combine)"
                                   : "TP_ATTN_FULL (no gather)";
}

int ms_layout_describe(const ms_layout *lay, char *buf, size_t cap)
{
    char a[96], e[64], d[64], pre[48] = "", post[32] = "";
    int n = snprintf(a, sizeof a, "attention TP=%d", lay->attn_tp);
    if (lay->attn_dp > 1) n += snprintf(a + n, sizeof a - (size_t)n, ", DP=%d", lay->attn_dp);
    if (lay->attn_cp > 1) snprintf(a + n, sizeof a - (size_t)n, ", CP=%d", lay->attn_cp);
    if (lay->n_physical_experts > 0)
        snprintf(e, sizeof e, " · routed experts TP=%d, EP=%d", lay->moe_tp, lay->moe_ep);
    else
        e[0] = 0;
    bool dense_rep = !lay->has_dense || lay->dense_tp == 1;
    bool dense_full = !lay->has_dense || lay->dense_tp == lay->tp;
    if (lay->n_physical_experts == 0)
        snprintf(d, sizeof d, " · MLP TP=%d", lay->dense_tp);
    else if (lay->shared_tp == 1 && dense_rep)
        snprintf(d, sizeof d, " · dense/shared replicated");
    else if (lay->shared_tp == lay->tp && dense_full)
        snprintf(d, sizeof d, " · dense/shared TP=%d", lay->tp);
    else
        snprintf(d, sizeof d, " · dense TP=%d, shared TP=%d", lay->dense_tp, lay->shared_tp);
    if (lay->n_replicas > 1) snprintf(pre, sizeof pre, "%d replicas × (", lay->n_replicas);
    if (lay->pp > 1) snprintf(post, sizeof post, " · PP=%d", lay->pp);
    return snprintf(buf, cap, "%s%s%s%s%s%s", pre, a, e, d, post, lay->n_replicas > 1 ? ")" : "");
}

int ms_layout_describe_table(const ms_layout *lay, char *buf, size_t cap)
{
    char line[256];
    ms_layout_describe(lay, line, sizeof line);
    char run[32], chunk[32];
    if (lay->max_running_per_rank > 0)
        snprintf(run, sizeof run, "%d", lay->max_running_per_rank);
    else
        snprintf(run, sizeof run, "auto");
    if (lay->chunked_prefill_per_rank > 0)
        snprintf(chunk, sizeof chunk, "%d", lay->chunked_prefill_per_rank);
    else
        snprintf(chunk, sizeof chunk, lay->chunked_prefill_per_rank < 0 ? "off" : "auto");
    return snprintf(
        buf, cap,
        "%s\n"
        "  world size            %d (tp %d × pp %d × replicas %d)\n"
        "  attention             tp %d, dp %d, cp %d\n"
        "  routed experts        tp %d, ep %d, moe_dp %d; %d physical, %d per EP rank%s\n"
        "  dense MLP / shared    tp %d / tp %d\n"
        "  embedding / LM head   split %d / %d\n"
        "  sparse layers         %s\n"
        "  dense layers          %s\n"
        "  per rank              max running %s, chunked prefill %s, %d row(s) per "
        "request per step\n",
        line, lay->world_size, lay->tp, lay->pp, lay->n_replicas, lay->attn_tp, lay->attn_dp,
        lay->attn_cp, lay->moe_tp, lay->moe_ep, lay->moe_dp, lay->n_physical_experts,
        lay->experts_per_rank, lay->ep_forced ? " (ep forced to tp by the a2a backend)" : "",
        lay->dense_tp, lay->shared_tp, lay->embed_tp, lay->lm_head_tp, mode_name(lay->sparse_mode),
        lay->has_dense ? mode_name(lay->dense_mode) : "none", run, chunk,
        lay->tokens_per_request_step);
}
