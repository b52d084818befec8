/* plan.c — ms_plan_run: resolves the launch with the shared layout function, then sizes
 * weights, memory budget, KV pools, tokens and requests per rank and across the cluster,
 * communication and expert traffic, and adds the hardware and memory constraints to the
 * layout's violations.  Any thread.
 *
 * Memory (per device, 10^9 bytes as the seeds count): budget = mem − --reserve-gb, or
 * mem × --mem-fraction-static (SGLang's fraction of the whole device for weights + KV,
 * default 0.88 here); pool = budget − weights unless --kv-pool-gib fixes it (seed 002's
 * fixed-pool comparisons).  A model whose weights do not fit admits zero tokens (seed 000
 * §7.1).  Tokens per rank are floored (an allocator holds whole tokens) and rounded down
 * to --page-size; the exact quotient is reported too.
 */
#include "plan/plan.h"

#include <math.h>
#include <string.h>

void ms_plan_input_init(ms_plan_input *in)
{
    memset(in, 0, sizeof *in);
    in->weights = MS_WEIGHTS_FP8;
    in->reserve_gb = -1;
    in->mem_fraction = -1;
    in->kv_pool_gib = -1;
    ms_launch_init(&in->launch);
}

static void add_violation(ms_plan_result *r, const char *rule, const char *msg)
{
    if (r->n_violations >= (int)(sizeof r->violations / sizeof r->violations[0])) return;
    ms_layout_violation *v = &r->violations[r->n_violations++];
    snprintf(v->rule, sizeof v->rule, "%s", rule);
    snprintf(v->message, sizeof v->message, "%s", msg);
}

static void hardware_rules(const ms_plan_input *in, ms_plan_result *r)
{
    const ms_launch *l = &in->launch;
    char msg[224];
    if (!in->have_gpu) return;
    const ms_plan_gpu *g = &in->gpu;
    bool megamoe = l->a2a_alias == MS_A2A_ALIAS_MEGAMOE;
    /* seed 001 "MegaMoE": the W4A8 / W4A4 variants are Blackwell-only (B200/B300/GB200/GB300);
     * Hopper uses the all-FP8 path (FP8 checkpoint). */
    if (megamoe && (l->megamoe_w4a4 || in->weights == MS_WEIGHTS_FP4_EXPERTS) &&
        g->family != MS_GPU_BLACKWELL) {
        snprintf(
            msg, sizeof msg,
            "--moe-a2a-backend megamoe with %s runs only on Blackwell (b200/b300/gb200/gb300), "
            "not --gpu %s",
            l->megamoe_w4a4 ? "--enable-w4a4-mxfp4-megamoe (W4A4)" : "FP4 experts (W4A8)", g->name);
        add_violation(r, "megamoe_blackwell", msg);
    }
    /* seed 001 "RTX PRO 6000 note": HiCache and MegaMoE are not supported there. */
    if (g->family == MS_GPU_BLACKWELL_DESKTOP && (megamoe || l->enable_hierarchical_cache)) {
        snprintf(msg, sizeof msg, "%s is not supported on --gpu %s",
                 megamoe ? "--moe-a2a-backend megamoe" : "--enable-hierarchical-cache", g->name);
        add_violation(r, "rtx_pro_unsupported", msg);
    }
    /* seed 001 "MoRI EP": on AMD expert parallelism uses the mori all-to-all backend. */
    if (g->family == MS_GPU_CDNA && l->a2a != MS_A2A_NONE && l->a2a_alias != MS_A2A_ALIAS_MORI) {
        snprintf(msg, sizeof msg, "--moe-a2a-backend %s: on --gpu %s use --moe-a2a-backend mori",
                 ms_launch_a2a_name(l), g->name);
        add_violation(r, "amd_a2a_mori", msg);
    }
}

int ms_plan_run(const ms_plan_input *in, ms_plan_result *r, ms_errbuf *err)
{
    memset(r, 0, sizeof *r);
    const ms_plan_model *m = &in->model;
    if (m->n_layers < 1 || m->hidden < 1 || m->n_heads < 1)
        return ms_err(err, MS_EINVAL, "model '%s' has no layers, hidden size or heads", m->name);
    ms_layout_model lm;
    ms_plan_layout_model(m, &lm);
    ms_errbuf lerr;
    (void)ms_layout_resolve(&in->launch, &lm, &r->layout, &lerr);
    const ms_layout *lay = &r->layout;
    ms_layout_describe(lay, r->layout_line, sizeof r->layout_line);
    for (int i = 0; i < lay->n_violations; i++)
        add_violation(r, lay->violations[i].rule, lay->violations[i].message);
    if (lay->tp < 1 || lay->attn_tp < 1 || lay->moe_tp < 1 || lay->moe_ep < 1 || lay->pp < 1 ||
        lay->world_size < 1)
        return 0; /* nothing more can be computed; the violations say why */
    char msg[224];
    r->num_gpus = in->num_gpus > 0 ? in->num_gpus : lay->world_size;
    if (in->num_gpus > 0 && in->num_gpus != lay->world_size) {
        snprintf(msg, sizeof msg, "the launch needs %d ranks (world size) but --num-gpus gives %d",
                 lay->world_size, in->num_gpus);
        add_violation(r, "num_gpus", msg);
    }
    hardware_rules(in, r);
    ms_plan_weights_compute(in, lay, r);

    /* memory budget per device */
    /* --enable-eplb: moving a layer stages this rank's slots of it (serve/eplb_run.c) */
    r->eplb_staging_bytes_per_rank = 0;
    if (in->launch.enable_eplb && in->model.n_routed > 0) {
        double el, sc;
        ms_plan_expert_bytes(in, &el, &sc);
        r->eplb_staging_bytes_per_rank =
            lay->experts_per_rank * (el + sc) / (lay->moe_tp > 0 ? lay->moe_tp : 1);
    }
    double mem = in->have_gpu ? in->gpu.mem_gb * 1e9 : 0;
    r->have_memory = mem > 0;
    r->mem_bytes = mem;
    if (r->have_memory) {
        double frac = in->mem_fraction >= 0 ? in->mem_fraction : 0.88;
        if (in->reserve_gb >= 0) {
            r->budget_bytes = mem - in->reserve_gb * 1e9;
            snprintf(r->budget_basis, sizeof r->budget_basis, "%.0f GB - reserve %.1f GB",
                     in->gpu.mem_gb, in->reserve_gb);
        } else {
            r->budget_bytes = mem * frac;
            snprintf(r->budget_basis, sizeof r->budget_basis,
                     "%.0f GB x mem-fraction-static %.2f%s", in->gpu.mem_gb, frac,
                     in->mem_fraction >= 0 ? "" : " (default)");
        }
        r->headroom_bytes =
            r->budget_bytes - r->weights_bytes_per_rank - r->eplb_staging_bytes_per_rank;
        r->fits = r->headroom_bytes >= 0;
        if (!r->fits) {
            snprintf(msg, sizeof msg,
                     "weights need %.1f GB per rank, over the %.1f GB budget of --gpu %s (%.0f GB) "
                     "by %.1f GB: no tokens fit",
                     r->weights_bytes_per_rank / 1e9, r->budget_bytes / 1e9, in->gpu.name,
                     in->gpu.mem_gb, -r->headroom_bytes / 1e9);
            add_violation(r, "weights_fit", msg);
        }
    } else if (in->kv_pool_gib < 0) {
        return ms_err(err, MS_EINVAL,
                      "no memory figure: give --gpu (and --gpu-mem-gb for cpu) or "
                      "--kv-pool-gib");
    }

    /* KV: per stage, the fullest-KV or least-memory stage limits tokens */
    const int64_t L = in->context_len > 0 ? in->context_len : m->max_context;
    r->context_len = L;
    if (L > m->max_context) {
        snprintf(msg, sizeof msg, "--context-len %lld exceeds the model's %lld-token context",
                 (long long)L, (long long)m->max_context);
        add_violation(r, "context_len", msg);
    }
    const int kvb = in->launch.kv_cache_bytes;
    const int pp = lay->pp > m->n_layers ? m->n_layers : lay->pp;
    double best_tokens = INFINITY;
    int64_t best_requests = INT64_MAX;
    for (int s = 0; s < pp; s++) {
        int a, b;
        ms_plan_stage_layers(m->n_layers, pp, s, &a, &b);
        double req = ms_plan_kv_request_bytes(
            m, kvb, in->launch.v4_fp4_indexer ? MS_KV_INDEX_MXFP4 : MS_KV_INDEX_DEPLOYED,
            lay->attn_tp, a, b, L);
        double state = ms_plan_state_request_bytes(m, in->launch.compress_state_bytes, a, b);
        double pool = in->kv_pool_gib >= 0
                          ? in->kv_pool_gib * 1073741824.0
                          : r->budget_bytes - ms_plan_stage_weight_bytes(in, lay, s) -
                                r->eplb_staging_bytes_per_rank;
        if (r->have_memory && !r->fits) pool = 0;
        if (pool < 0) pool = 0;
        double per_token = req / (double)L;
        double tokens = per_token > 0 ? pool / per_token : 0;
        int64_t nreq = req + state > 0 ? (int64_t)floor(pool / (req + state)) : 0;
        if (s == 0 || tokens < best_tokens) {
            best_tokens = tokens;
            r->kv_bytes_per_token = per_token;
            r->kv_bytes_per_request = req;
            r->state_bytes_per_request = state;
            r->kv_pool_bytes_per_rank = pool;
        }
        if (nreq < best_requests) best_requests = nreq;
    }
    ms_plan_kv_cost(m, kvb, in->launch.v4_fp4_indexer ? MS_KV_INDEX_MXFP4 : MS_KV_INDEX_DEPLOYED,
                    lay->attn_tp, L, &r->kv_cost);
    const int64_t groups = (int64_t)lay->attn_dp * lay->n_replicas;
    const int page = in->launch.page_size > 0 ? in->launch.page_size : 1;
    r->tokens_per_rank_exact = best_tokens;
    r->tokens_per_rank = (int64_t)floor(best_tokens) / page * page;
    r->cluster_distinct_tokens = r->tokens_per_rank * groups;
    r->requests_per_rank = best_requests;
    r->cluster_requests = best_requests * groups;
    int64_t cap = lay->max_running_per_rank > 0 && lay->max_running_per_rank < best_requests
                      ? lay->max_running_per_rank
                      : best_requests;
    r->admitted_requests = cap * groups;
    if (in->launch.enable_hierarchical_cache)
        r->host_tokens_per_rank = (int64_t)floor(r->tokens_per_rank * in->launch.hicache_ratio);
    if ((!r->have_memory || r->fits) && r->requests_per_rank == 0) {
        snprintf(msg, sizeof msg,
                 "one %lld-token request needs %.2f GiB of KV%s per rank; the pool holds %.2f GiB",
                 (long long)L,
                 (r->kv_bytes_per_request + r->state_bytes_per_request) / 1073741824.0,
                 r->state_bytes_per_request > 0 ? " + state" : "",
                 r->kv_pool_bytes_per_rank / 1073741824.0);
        add_violation(r, "request_fit", msg);
    }
    if (in->kv_pool_gib >= 0 && r->have_memory && r->fits &&
        r->headroom_bytes < in->kv_pool_gib * 1073741824.0) {
        snprintf(msg, sizeof msg, "--kv-pool-gib %.1f exceeds the %.1f GB left after weights",
                 in->kv_pool_gib, r->headroom_bytes / 1e9);
        add_violation(r, "kv_pool_fit", msg);
    }
    ms_plan_comm_compute(in, lay, r);
    return 0;
}
