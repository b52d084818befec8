/* weights.c — weight bytes of a model, tensor by tensor from its config, and how a
 * layout shards them per rank.  Owns the storage conventions of --weights:
 *
 *   fp8          every parameter one byte (the seeds' convention: "671 GB in fp8",
 *                "235 B parameters in fp8 is 235 GB"), plus block scales of the linear
 *                layers (128×128 blocks; F32 for V3-family/Qwen3, UE8M0 for V4).  Real FP8
 *                checkpoints keep embeddings, norms and routers in BF16 (+1.9 GB for V3).
 *   bf16         two bytes per parameter, F32 tensors four.
 *   fp4-experts  the official V4 checkpoints: routed experts FP4 (two per byte) with one
 *                UE8M0 scale per 32, linear layers FP8 with block scales, the rest as stored
 *                (BF16 embeddings/norms/compressors, F32 mHC/sinks, I64 hash tables).
 *
 * Sharding (seed 002 "capacity arithmetic done twice"): attention ÷ attn_tp (replicated
 * across DP), routed experts by EP ownership ÷ moe_tp plus redundant slots, dense MLP ÷
 * dense_tp, shared experts ÷ shared_tp, embedding ÷ embed_tp, LM head ÷ lm_head_tp,
 * routers and norms replicated.  Like the seed, an attention block counts as fully split
 * under attention TP (SGLang replicates the small q_a/kv_a projections; ≈0.9 GB for V3).
 * Pipeline stages split layers as SGLang's get_pp_indices; the fullest stage is reported.
 * Any thread.
 */
#include "plan/plan.h"

#include <math.h>
#include <string.h>

enum { C_LIN, C_EXP, C_BF16, C_F32, C_I64 };

typedef struct comp_set {
    ms_plan_bytes c[MS_WC_COUNT];
} comp_set;

const char *ms_plan_component_name(int c)
{
    static const char *n[MS_WC_COUNT] = {"attention",      "dense_mlp", "shared_experts",
                                         "routed_experts", "router",    "embedding",
                                         "lm_head",        "other"};
    return c >= 0 && c < MS_WC_COUNT ? n[c] : "?";
}

static void add(comp_set *s, const ms_plan_model *m, ms_plan_weights w, int comp, int cls,
                double rows, double cols)
{
    double n = rows * cols, elem = 0, scale = 0;
    double blocks = ceil(rows / 128.0) * ceil(cols / 128.0);
    switch (cls) {
    case C_LIN:
        elem = w == MS_WEIGHTS_BF16 ? 2 * n : n;
        if (w != MS_WEIGHTS_BF16) scale = blocks * m->fp8_scale_bytes;
        break;
    case C_EXP:
        if (w == MS_WEIGHTS_FP4_EXPERTS) {
            elem = n / 2;
            scale = rows * ceil(cols / 32.0); /* one UE8M0 per 32 along K */
        } else if (w == MS_WEIGHTS_BF16) {
            elem = 2 * n;
        } else {
            elem = n;
            scale = blocks * m->fp8_scale_bytes;
        }
        break;
    case C_BF16:
        elem = w == MS_WEIGHTS_FP8 ? n : 2 * n;
        break;
    case C_F32:
        elem = w == MS_WEIGHTS_FP8 ? n : 4 * n;
        break;
    case C_I64:
        elem = 8 * n;
        break;
    }
    s->c[comp].elem += elem;
    s->c[comp].scale += scale;
}

static void attention_mla(comp_set *s, const ms_plan_model *m, ms_plan_weights w)
{
    const double D = (double)m->hidden, H = m->n_heads, qk = m->qk_nope + m->qk_rope;
    if (m->q_lora_rank > 0) {
        add(s, m, w, MS_WC_ATTENTION, C_LIN, m->q_lora_rank, D);
        add(s, m, w, MS_WC_ATTENTION, C_BF16, m->q_lora_rank, 1);
        add(s, m, w, MS_WC_ATTENTION, C_LIN, H * qk, m->q_lora_rank);
    } else {
        add(s, m, w, MS_WC_ATTENTION, C_LIN, H * qk, D);
    }
    add(s, m, w, MS_WC_ATTENTION, C_LIN, m->kv_lora_rank + m->qk_rope, D);
    add(s, m, w, MS_WC_ATTENTION, C_BF16, m->kv_lora_rank, 1);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, H * (m->qk_nope + m->v_head_dim), m->kv_lora_rank);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, D, H * m->v_head_dim);
}

static void attention_gqa(comp_set *s, const ms_plan_model *m, ms_plan_weights w)
{
    const double D = (double)m->hidden, hd = m->head_dim;
    add(s, m, w, MS_WC_ATTENTION, C_LIN, m->n_heads * hd, D);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, m->n_kv_heads * hd, D);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, m->n_kv_heads * hd, D);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, D, m->n_heads * hd);
    if (m->qk_norm) add(s, m, w, MS_WC_ATTENTION, C_BF16, 2 * hd, 1);
}

/* arch.md §2.3 tensor inventory (Flash names; Pro by its config). */
static void attention_v4(comp_set *s, const ms_plan_model *m, ms_plan_weights w, int ratio)
{
    const double D = (double)m->hidden, H = m->n_heads, hd = m->head_dim, ql = m->q_lora_rank;
    const double G = m->o_groups, R = m->o_lora_rank;
    add(s, m, w, MS_WC_ATTENTION, C_F32, H, 1); /* attn_sink */
    add(s, m, w, MS_WC_ATTENTION, C_LIN, ql, D);
    add(s, m, w, MS_WC_ATTENTION, C_BF16, ql, 1);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, H * hd, ql);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, hd, D);
    add(s, m, w, MS_WC_ATTENTION, C_BF16, hd, 1);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, G * R, H * hd / G);
    add(s, m, w, MS_WC_ATTENTION, C_LIN, D, G * R);
    if (ratio) {
        double c = ratio == 4 ? 2 : 1;
        add(s, m, w, MS_WC_ATTENTION, C_BF16, 2 * c * hd, D); /* compressor wkv + wgate */
        add(s, m, w, MS_WC_ATTENTION, C_F32, ratio, c * hd);  /* ape */
        add(s, m, w, MS_WC_ATTENTION, C_BF16, hd, 1);
    }
    if (ratio == 4) {
        const double ih = m->index_n_heads, id = m->index_head_dim;
        add(s, m, w, MS_WC_ATTENTION, C_LIN, ih * id, ql);
        add(s, m, w, MS_WC_ATTENTION, C_BF16, ih, D);         /* weights_proj */
        add(s, m, w, MS_WC_ATTENTION, C_BF16, 2 * 2 * id, D); /* indexer compressor */
        add(s, m, w, MS_WC_ATTENTION, C_F32, 4, 2 * id);
        add(s, m, w, MS_WC_ATTENTION, C_BF16, id, 1);
    }
}

static void swiglu(comp_set *s, const ms_plan_model *m, ms_plan_weights w, int comp, int cls,
                   double count, double inter)
{
    const double D = (double)m->hidden;
    for (int i = 0; i < 2; i++) add(s, m, w, comp, cls, count * inter, D);
    add(s, m, w, comp, cls, count * D, inter);
}

/* One decoder layer; mtp = the speculative (next-n) layer stored after the main stack. */
static void layer_weights(comp_set *s, const ms_plan_model *m, ms_plan_weights w, int layer,
                          bool mtp)
{
    const double D = (double)m->hidden;
    int ratio = 0;
    if (m->attn == MS_ATTN_V4) {
        ratio = mtp ? 0 : (layer < m->n_ratios ? m->compress_ratios[layer] : 0);
        attention_v4(s, m, w, ratio);
        const double hc = m->hc_mult, mix = (2 + hc) * hc;
        add(s, m, w, MS_WC_OTHER, C_F32, 2 * mix, hc * D); /* hc_attn_fn, hc_ffn_fn */
        add(s, m, w, MS_WC_OTHER, C_F32, 2 * (mix + 3), 1);
    } else if (m->attn == MS_ATTN_MLA) {
        attention_mla(s, m, w);
    } else {
        attention_gqa(s, m, w);
    }
    add(s, m, w, MS_WC_OTHER, C_BF16, 2 * D, 1); /* attention / FFN norms */
    bool moe = mtp ? m->n_routed > 0 : ms_plan_layer_is_moe(m, layer);
    if (!moe) {
        swiglu(s, m, w, MS_WC_DENSE_MLP, C_LIN, 1, (double)m->intermediate);
        return;
    }
    const double E = m->n_routed;
    add(s, m, w, MS_WC_ROUTER, C_BF16, E, D);
    bool hash = m->attn == MS_ATTN_V4 && !mtp && layer < m->n_hash_layers;
    if (hash)
        add(s, m, w, MS_WC_ROUTER, C_I64, (double)m->vocab, m->topk);
    else if (m->router_bias)
        add(s, m, w, MS_WC_ROUTER, C_F32, E, 1);
    if (m->n_shared > 0)
        swiglu(s, m, w, MS_WC_SHARED, C_LIN, m->n_shared, (double)m->moe_intermediate);
    /* per expert, so block scales are counted per [inter, D] matrix */
    comp_set one;
    memset(&one, 0, sizeof one);
    swiglu(&one, m, w, MS_WC_ROUTED, C_EXP, 1, (double)m->moe_intermediate);
    s->c[MS_WC_ROUTED].elem += E * one.c[MS_WC_ROUTED].elem;
    s->c[MS_WC_ROUTED].scale += E * one.c[MS_WC_ROUTED].scale;
}

static void mtp_extras(comp_set *s, const ms_plan_model *m, ms_plan_weights w)
{
    const double D = (double)m->hidden;
    if (m->attn == MS_ATTN_V4) {
        add(s, m, w, MS_WC_OTHER, C_LIN, D, D); /* e_proj */
        add(s, m, w, MS_WC_OTHER, C_LIN, D, D); /* h_proj */
        add(s, m, w, MS_WC_OTHER, C_BF16, 3 * D, 1);
        add(s, m, w, MS_WC_OTHER, C_F32, m->hc_mult * (m->hc_mult * D + 1) + 1, 1);
    } else {
        add(s, m, w, MS_WC_OTHER, C_BF16, D, 2 * D); /* eh_proj */
        add(s, m, w, MS_WC_OTHER, C_BF16, 3 * D, 1);
    }
}

void ms_plan_stage_layers(int n_layers, int pp, int stage, int *first, int *end)
{
    /* SGLang get_pp_indices: even split, the remainder to the stages before the last. */
    if (pp < 1) pp = 1;
    int base = n_layers / pp, rem = n_layers % pp, a = 0;
    for (int s = 0; s <= stage && s < pp; s++) {
        int n = base + ((s >= pp - 1 - rem && s < pp - 1) ? 1 : 0);
        if (s == stage) {
            *first = a;
            *end = a + n;
            return;
        }
        a += n;
    }
    *first = *end = n_layers;
}

static bool mtp_loaded(const ms_plan_input *in)
{
    /* the next-n (MTP) layer is loaded for speculative decoding; draft tokens imply it */
    return in->model.n_mtp_layers > 0 &&
           (in->launch.spec != MS_SPEC_NONE || in->launch.speculative_num_draft_tokens > 0);
}

/* Model totals of one stage's layers (+ embedding on the first, head/MTP on the last). */
static void stage_totals(const ms_plan_input *in, int pp, int stage, comp_set *s)
{
    const ms_plan_model *m = &in->model;
    const ms_plan_weights w = in->weights;
    memset(s, 0, sizeof *s);
    int a, b;
    ms_plan_stage_layers(m->n_layers, pp, stage, &a, &b);
    for (int l = a; l < b; l++) layer_weights(s, m, w, l, false);
    const double D = (double)m->hidden, V = (double)m->vocab;
    if (stage == 0) add(s, m, w, MS_WC_EMBED, C_BF16, V, D);
    if (stage == pp - 1) {
        if (!m->tie_embeddings || pp > 1) add(s, m, w, MS_WC_LM_HEAD, C_BF16, V, D);
        add(s, m, w, MS_WC_OTHER, C_BF16, D, 1);
        if (m->attn == MS_ATTN_V4)
            add(s, m, w, MS_WC_OTHER, C_F32, m->hc_mult * (m->hc_mult * D + 1) + 1, 1);
        if (mtp_loaded(in))
            for (int k = 0; k < m->n_mtp_layers; k++) {
                layer_weights(s, m, w, m->n_layers + k, true);
                mtp_extras(s, m, w);
            }
    }
}

static double divide(const ms_plan_bytes *b, double d, ms_plan_bytes *out)
{
    if (d < 1) d = 1;
    out->elem = b->elem / d;
    out->scale = b->scale / d;
    return out->elem + out->scale;
}

/* Per-rank bytes of one stage under the layout; returns the total. */
static double stage_per_rank(const ms_plan_input *in, const ms_layout *lay, int stage,
                             comp_set *tot, comp_set *pr)
{
    int pp = lay->pp > 0 ? lay->pp : 1;
    stage_totals(in, pp, stage, tot);
    double sum = 0;
    const double div[MS_WC_COUNT] = {
        [MS_WC_ATTENTION] = lay->attn_tp,
        [MS_WC_DENSE_MLP] = lay->dense_tp,
        [MS_WC_SHARED] = lay->shared_tp,
        [MS_WC_ROUTED] = 1,
        [MS_WC_ROUTER] = 1,
        [MS_WC_EMBED] = lay->embed_tp,
        [MS_WC_LM_HEAD] = lay->lm_head_tp,
        [MS_WC_OTHER] = 1,
    };
    for (int c = 0; c < MS_WC_COUNT; c++) sum += divide(&tot->c[c], div[c], &pr->c[c]);
    /* routed: the rank's physical experts (EP ownership + redundant slots) ÷ moe_tp */
    const ms_plan_bytes *r = &tot->c[MS_WC_ROUTED];
    sum -= pr->c[MS_WC_ROUTED].elem + pr->c[MS_WC_ROUTED].scale;
    if (in->model.n_routed > 0) {
        double f = (double)lay->experts_per_rank / in->model.n_routed /
                   (lay->moe_tp > 0 ? lay->moe_tp : 1);
        pr->c[MS_WC_ROUTED].elem = r->elem * f;
        pr->c[MS_WC_ROUTED].scale = r->scale * f;
        sum += pr->c[MS_WC_ROUTED].elem + pr->c[MS_WC_ROUTED].scale;
    }
    return sum;
}

double ms_plan_stage_weight_bytes(const ms_plan_input *in, const ms_layout *lay, int stage)
{
    comp_set tot, pr;
    return stage_per_rank(in, lay, stage, &tot, &pr);
}

void ms_plan_weights_compute(const ms_plan_input *in, const ms_layout *lay, ms_plan_result *r)
{
    int pp = lay->pp > 0 ? lay->pp : 1;
    if (pp > in->model.n_layers) pp = in->model.n_layers;
    memset(r->total, 0, sizeof r->total);
    r->weights_total_bytes = 0;
    r->weights_bytes_per_rank = -1;
    for (int s = 0; s < pp; s++) {
        comp_set tot, pr;
        double w = stage_per_rank(in, lay, s, &tot, &pr);
        for (int c = 0; c < MS_WC_COUNT; c++) {
            r->total[c].elem += tot.c[c].elem;
            r->total[c].scale += tot.c[c].scale;
            r->weights_total_bytes += tot.c[c].elem + tot.c[c].scale;
        }
        if (w > r->weights_bytes_per_rank) {
            r->weights_bytes_per_rank = w;
            memcpy(r->per_rank, pr.c, sizeof r->per_rank);
        }
    }
    const ms_plan_bytes *a = &r->total[MS_WC_ATTENTION];
    double attn = a->elem + a->scale;
    r->attention_replication_bytes =
        lay->attn_tp > 0 && lay->tp > 0 ? attn / lay->attn_tp - attn / lay->tp : 0;
    r->recipe_min_weight_bytes = in->model.recipe_min_weight_gb * 1e9;
}

/* Bytes of one routed expert (elements and scales) in the chosen format. */
void ms_plan_expert_bytes(const ms_plan_input *in, double *elem, double *scale)
{
    comp_set one;
    memset(&one, 0, sizeof one);
    swiglu(&one, &in->model, in->weights, MS_WC_ROUTED, C_EXP, 1,
           (double)in->model.moe_intermediate);
    *elem = one.c[MS_WC_ROUTED].elem;
    *scale = one.c[MS_WC_ROUTED].scale;
}
