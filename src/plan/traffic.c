/* traffic.c — the per-token and per-step arithmetic of seeds 000 and 002: KV bytes per
 * request, V4 compressor state, DP-gather / TP all-reduce / EP dispatch+combine bytes per
 * layer per rank with the hypergeometric destination count, expert bytes streamed per
 * step, and the attention arithmetic-intensity trend.  Pure functions; any thread.
 */
#include "plan/plan.h"

#include <math.h>
#include <string.h>

/* V4's deployed main entry (arch.md §2.11; seed 000 §7.2), for the attention intensity;
 * the cache streams themselves come from the family's kv_spec. */
#define V4_MAIN_ENTRY 584.0
/* DeepEP's FP8 dispatch: one byte per element plus an FP32 scale per 128 (seed 002). */
#define FP8_DISPATCH_BYTES (1.0 + 4.0 / 128.0)
#define ACT_BYTES          2.0 /* BF16 activations (combine, gathers) */

static double gqa_kv_heads_per_rank(const ms_plan_model *m, int attn_tp)
{
    /* SGLang get_num_kv_heads: max(1, kv_heads / tp): replicated once tp > kv heads. */
    double h = (double)m->n_kv_heads / (attn_tp > 0 ? attn_tp : 1);
    return h < 1 ? 1 : h;
}

/* The family's cache streams for this rank (model/family.h kv_spec): kv_bytes is
 * --kv-cache-dtype's bytes (0 = the model's BF16), index_key V4's index-key format
 * (MS_KV_INDEX_*), state_bytes the compressor state's. */
static void spec_of(const ms_plan_model *m, int kv_bytes, int index_key, int state_bytes,
                    int attn_tp, ms_kv_spec *spec)
{
    ms_kv_spec_opts o = {.elem_bytes = kv_bytes,
                         .index_key = index_key,
                         .state_bytes = state_bytes,
                         .page_size = 1,
                         .attn_tp = attn_tp,
                         .draft_tokens = 0};
    ms_errbuf err;
    if (ms_family_kv_spec(m, &o, spec, &err)) ms_kv_spec_init(spec, m->n_layers);
}

double ms_plan_kv_request_bytes(const ms_plan_model *m, int kv_bytes, int index_key, int attn_tp,
                                int first, int end, int64_t L)
{
    ms_kv_spec spec; /* ~37 KiB */
    spec_of(m, kv_bytes, index_key, 0, attn_tp, &spec);
    return ms_kv_spec_request_bytes(&spec, first, end, L);
}

void ms_plan_kv_cost(const ms_plan_model *m, int kv_bytes, int index_key, int attn_tp, int64_t L,
                     ms_kv_cost *out)
{
    ms_kv_spec spec;
    spec_of(m, kv_bytes, index_key, 0, attn_tp, &spec);
    ms_kv_spec_cost(&spec, L, out);
}

double ms_plan_state_request_bytes(const ms_plan_model *m, int state_bytes, int first, int end)
{
    ms_kv_spec spec;
    spec_of(m, 0, 0, state_bytes, 1, &spec);
    return ms_kv_spec_state_bytes(&spec, first, end);
}

double ms_plan_expected_distinct_ranks(int E, int k, int N)
{
    if (N < 1 || E < 1 || k < 1) return 0;
    if (N == 1) return 1;
    /* Uniform choice of k distinct experts of E, E/N per rank (hypergeometric):
     * P(rank untouched) = C(E − E/N, k) / C(E, k) = Π_i (E − E/N − i) / (E − i). */
    double per = (double)E / N, p0 = 1;
    for (int i = 0; i < k; i++) {
        double num = E - per - i;
        p0 *= num > 0 ? num / (E - i) : 0;
    }
    return N * (1 - p0);
}

void ms_plan_comm_compute(const ms_plan_input *in, const ms_layout *lay, ms_plan_result *r)
{
    const ms_plan_model *m = &in->model;
    const double d = (double)m->hidden;
    const int groups =
        (lay->attn_dp > 0 ? lay->attn_dp : 1) * (lay->n_replicas > 0 ? lay->n_replicas : 1);
    double Tg = (double)in->tokens_per_step;
    if (Tg <= 0)
        Tg = lay->max_running_per_rank > 0
                 ? (double)lay->max_running_per_rank * groups * lay->tokens_per_request_step
                 : 1024;
    const double T_engine = Tg / (lay->n_replicas > 0 ? lay->n_replicas : 1);
    const double Tl = Tg / groups; /* each attention rank's share */
    memset(&r->comm, 0, sizeof r->comm);
    r->comm.tokens_global = Tg;
    r->comm.tokens_local = Tl;
    /* DP gather + TP FFN, seed 002: 2 · (N−1)/N · T_g · d · b with N the tp world. */
    const double N = lay->tp > 0 ? lay->tp : 1;
    r->comm.gather_world = lay->tp;
    r->comm.dp_allgather_bytes_per_layer = (N - 1) / N * T_engine * d * ACT_BYTES;
    r->comm.dp_gather_bytes_per_layer = 2 * r->comm.dp_allgather_bytes_per_layer;
    /* attention TP without DP: two ring all-reduces per layer of the group's tokens */
    const double A = lay->attn_tp > 0 ? lay->attn_tp : 1;
    r->comm.tp_allreduce_bytes_per_layer =
        2 * 2 * (A - 1) / A * (T_engine / (lay->attn_dp > 0 ? lay->attn_dp : 1)) * d * ACT_BYTES;
    /* EP: this layout's EP world, or tp (what an a2a backend would force) for comparison */
    const int ep = lay->moe_ep > 1 ? lay->moe_ep : lay->tp;
    r->comm.ep_world = ep;
    if (m->n_routed > 0 && ep > 1) {
        double distinct = ms_plan_expected_distinct_ranks(m->n_routed, m->topk, ep);
        r->comm.expected_distinct_ranks = distinct;
        r->comm.expected_remote_ranks = distinct * (ep - 1) / ep;
        /* SCATTERED: every rank of the tp group dispatches its own 1/tp of the group's tokens
         * (under DP-attention with attn_tp = 1 that is T_g / dp, the seed's T_ℓ) */
        const double Tep = T_engine / N;
        r->comm.ep_tokens_per_rank = Tep;
        r->comm.ep_dispatch_bytes_per_layer =
            Tep * r->comm.expected_remote_ranks * d * FP8_DISPATCH_BYTES;
        r->comm.ep_combine_bytes_per_layer = Tep * r->comm.expected_remote_ranks * d * ACT_BYTES;
    }
    const int n_moe = ms_plan_n_moe_layers(m), n_dense = m->n_layers - n_moe;
    r->comm.moe_layers = n_moe;
    if (lay->sparse_mode == MS_MLP_SCATTERED && m->n_routed > 0) {
        r->comm.mode = "ep";
        r->comm.bytes_per_step =
            (r->comm.ep_dispatch_bytes_per_layer + r->comm.ep_combine_bytes_per_layer) * n_moe;
        if (lay->dense_mode == MS_MLP_FULL) r->comm.gather_layers = n_dense;
    } else if (lay->attn_dp > 1) {
        r->comm.mode = "dp_gather";
        r->comm.gather_layers =
            (m->n_routed > 0 ? n_moe : 0) + (lay->dense_mode == MS_MLP_FULL ? n_dense : 0);
    } else if (lay->attn_tp > 1) {
        r->comm.mode = "tp_allreduce";
        r->comm.bytes_per_step = r->comm.tp_allreduce_bytes_per_layer * m->n_layers;
    } else {
        r->comm.mode = "none";
    }
    r->comm.bytes_per_step += r->comm.dp_gather_bytes_per_layer * r->comm.gather_layers;
    double link = in->link_gb_s > 0 ? in->link_gb_s : (in->have_gpu ? in->gpu.link_gb_s : 0);
    r->comm.link_gb_s = link;
    r->comm.ideal_ms_per_step = link > 0 ? r->comm.bytes_per_step / (link * 1e9) * 1e3 : -1;

    /* Expert weights streamed (seed 002 "why EP is really about weight bandwidth"): the
     * seed counts element bytes (3·2048·7168 = 44.04 MB in fp8), scales reported apart. */
    if (m->n_routed > 0) {
        double elem, scale;
        ms_plan_expert_bytes(in, &elem, &scale);
        r->expert.per_expert = elem;
        r->expert.per_expert_with_scales = elem + scale;
        r->expert.per_layer = elem * m->n_routed;
        double f = (double)lay->experts_per_rank / (lay->moe_tp > 0 ? lay->moe_tp : 1);
        r->expert.per_rank_per_layer = elem * f;
        r->expert.per_rank_per_step = r->expert.per_rank_per_layer * n_moe;
        double E = m->n_routed, k = m->topk;
        r->expert.expected_active_experts = E * (1 - pow(1 - k / E, Tg));
        r->expert.expected_per_rank_per_layer =
            r->expert.per_rank_per_layer * r->expert.expected_active_experts / E;
        r->expert.expected_per_rank_per_step = r->expert.expected_per_rank_per_layer * n_moe;
    }

    /* Attention intensity trend, seed 000 §5.2: AI ≈ 4·(n_h/attn_tp)·c / entry bytes for one
     * shared latent; GQA keeps K/V heads with their query heads until tp > kv heads. */
    double b = in->launch.kv_cache_bytes > 0 ? in->launch.kv_cache_bytes : 2;
    if (m->attn == MS_ATTN_V4) {
        r->ai.flop_per_byte_tp1 = 4.0 * m->n_heads * m->head_dim / V4_MAIN_ENTRY;
        r->ai.flop_per_byte_this_layout = r->ai.flop_per_byte_tp1 / A;
    } else if (m->attn == MS_ATTN_MLA) {
        double entry = (m->kv_lora_rank + m->qk_rope) * b;
        r->ai.flop_per_byte_tp1 = 4.0 * m->n_heads * m->kv_lora_rank / entry;
        r->ai.flop_per_byte_this_layout = r->ai.flop_per_byte_tp1 / A;
    } else if (m->n_kv_heads > 0) {
        double g1 = (double)m->n_heads / m->n_kv_heads;
        r->ai.flop_per_byte_tp1 = 4.0 * g1 / (2 * b);
        double q = m->n_heads / A, kv = gqa_kv_heads_per_rank(m, (int)A);
        r->ai.flop_per_byte_this_layout = 4.0 * (q / kv) / (2 * b);
    }
}
