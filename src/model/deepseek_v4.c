/* deepseek_v4.c — the DeepSeek-V4 family (arch.md §2, DESIGN.md §5): its
 * table entry, config.json fields, cache streams, and the forward's frame:
 * embed into hc_mult residual streams, per layer the mHC collapse (hc_pre
 * with Sinkhorn-normalised mixing), attention (deepseek_v4_attn.c) or MoE,
 * the mHC expand (hc_post); the head collapses the streams (hc_head), norms
 * and projects.  Weights: deepseek_v4_load.c.  Main thread only.
 */
#include "model/deepseek_v4.h"

#include "base/log.h"
#include "base/util.h"
#include "kernels/attn_mqa.h"
#include "kernels/kvq.h"
#include "model/config_json.h"
#include "model/planner_families.h"
#include "model/safetensors.h"
#include "parallel/comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* V4 deployed entry formats (kernels/kvq.h; the planner's default): the FP8
 * ds main entry (V4-Flash: 448 FP8 + 64 BF16 rope + 7 UE8M0 + 1 pad = 584
 * bytes) and the MXFP4 index key (128 values: 64 B + 4 UE8M0 = 68 bytes). */

/* ---- config ---- */

static int v4_match(const json_t *root)
{
    const char *t = ms_json_model_type(root);
    return json_object_get(root, "compress_ratios") != NULL || (t && !strcmp(t, "deepseek_v4")) ||
           ms_json_has_arch(root, "DeepseekV4ForCausalLM");
}

/* The compress_ratios array into out[0 .. n): each 0, 4 or 128. */
static int parse_ratios(const json_t *root, int n_layers, int max, int16_t *out, int *n,
                        ms_errbuf *err)
{
    const json_t *r = json_object_get(root, "compress_ratios");
    if (!json_is_array(r) || json_array_size(r) < (size_t)n_layers ||
        json_array_size(r) > (size_t)max)
        return ms_err(err, MS_EFORMAT,
                      "config.json: compress_ratios must be an array of at least "
                      "num_hidden_layers (%d) entries",
                      n_layers);
    *n = (int)json_array_size(r);
    for (int i = 0; i < *n; i++) {
        const json_t *e = json_array_get(r, (size_t)i);
        long x = json_is_integer(e) ? (long)json_integer_value(e) : -1;
        if (x != 0 && x != 4 && x != 128)
            return ms_err(err, MS_EFORMAT, "config.json: compress_ratios[%d] must be 0, 4 or 128",
                          i);
        out[i] = (int16_t)x;
    }
    return 0;
}

static int v4_parse(const json_t *root, ms_model_shape *m, ms_errbuf *err)
{
    int rc = ms_planner_parse_common(root, m, err);
    if (rc) return rc;
    ms_jget g = {root, "", err};
    const int64_t big = INT64_C(1) << 24;
    int64_t v;
    m->attn = MS_ATTN_V4;
    m->n_kv_heads = 0;                                               /* one shared KV */
    if (!json_object_get(root, "qk_rope_head_dim")) m->qk_rope = 64; /* ms_v4_cfg_parse's default */
#define GET(key, lo, hi, def, dst)                                                                 \
    do {                                                                                           \
        if ((rc = ms_jget_int(&g, key, def, lo, hi, &v))) return rc;                               \
        dst = v;                                                                                   \
    } while (0)
    GET("o_groups", 1, 1 << 10, 1, m->o_groups);
    GET("o_lora_rank", 1, big, 1024, m->o_lora_rank);
    GET("sliding_window", 0, 1 << 20, 128, m->window);
    GET("index_n_heads", 0, 1 << 10, 64, m->index_n_heads);
    GET("index_head_dim", 0, 1 << 12, 128, m->index_head_dim);
    GET("index_topk", 1, 1 << 20, 512, m->index_topk);
    GET("num_hash_layers", 0, MS_PLANNER_MAX_LAYERS, 0, m->n_hash_layers);
    GET("hc_mult", 1, 64, 4, m->hc_mult);
#undef GET
    if ((rc = parse_ratios(root, m->n_layers, MS_PLANNER_MAX_LAYERS, m->compress_ratios,
                           &m->n_ratios, err)))
        return rc;
    const char *ed = json_string_value(json_object_get(root, "expert_dtype"));
    if (ed && !strcmp(ed, "fp4")) m->published = MS_WEIGHTS_FP4_EXPERTS;
    return 0;
}

int ms_v4_cfg_parse(const json_t *root, ms_v4_cfg *c, ms_errbuf *err)
{
    memset(c, 0, sizeof *c);
    ms_jget g = {root, "", err};
    const int64_t big = INT64_C(1) << 24;
    int rc = 0;
    const char *sf = NULL;
#define I(key, lo, hi, def, dst)                                                                   \
    if (!rc) rc = ms_jget_i32(&g, key, def, lo, hi, &dst)
#define F(key, lo, hi, def, dst)                                                                   \
    if (!rc) rc = ms_jget_num(&g, key, def, lo, hi, &dst)
    if (!rc) rc = ms_jget_int(&g, "hidden_size", -1, 1, 1 << 17, &c->D);
    if (!rc) rc = ms_jget_int(&g, "vocab_size", -1, 1, 1 << 22, &c->vocab);
    if (!rc)
        rc = ms_jget_int(&g, "max_position_embeddings", 4096, 1, INT64_C(1) << 32, &c->max_pos);
    I("num_hidden_layers", 1, MS_KV_MAX_LAYERS - 1, -1, c->n_layers);
    I("num_attention_heads", 1, 1 << 12, -1, c->H);
    I("head_dim", 2, 1 << 12, 512, c->hd);
    I("qk_rope_head_dim", 2, 1 << 12, 64, c->dr);
    I("q_lora_rank", 1, (int)big, 1024, c->q_lora);
    I("o_groups", 1, 1 << 10, 1, c->o_groups);
    I("o_lora_rank", 1, (int)big, 1024, c->o_lora);
    I("sliding_window", 1, 1 << 20, 128, c->window);
    I("index_n_heads", 1, 1 << 10, 64, c->n_idx_heads);
    I("index_head_dim", 2, 1 << 12, 128, c->idx_hd);
    I("index_topk", 1, 1 << 20, 512, c->idx_topk);
    I("n_routed_experts", 1, 1 << 16, -1, c->E);
    I("n_shared_experts", 0, 1, 1, c->n_shared);
    I("num_experts_per_tok", 1, 1 << 10, -1, c->K);
    I("moe_intermediate_size", 1, (int)big, -1, c->inter);
    I("num_hash_layers", 0, MS_KV_MAX_LAYERS, 0, c->n_hash);
    I("hc_mult", 1, 16, 4, c->hc);
    I("hc_sinkhorn_iters", 1, 1000, 20, c->sinkhorn_iters);
    F("hc_eps", 0, 1, 1e-6, c->hc_eps);
    F("rms_norm_eps", 1e-12, 1, 1e-6, c->eps);
    F("rope_theta", 1, 1e12, 10000, c->rope_theta);
    F("compress_rope_theta", 1, 1e12, 160000, c->compress_rope_theta);
    I("num_nextn_predict_layers", 0, 1, 0, c->n_mtp);
    if (!rc) rc = ms_jget_str(&g, "scoring_func", &sf);
    if (rc) return rc;
#undef I
    if (c->n_layers < 0 || c->H < 0 || c->E < 0 || c->K < 0 || c->inter < 0 || c->D < 0 ||
        c->vocab < 0)
        return ms_err(err, MS_EFORMAT,
                      "config.json: hidden_size, vocab_size, num_hidden_layers, "
                      "num_attention_heads, n_routed_experts, num_experts_per_tok and "
                      "moe_intermediate_size are required for deepseek_v4");
    if (sf && strcmp(sf, "sqrtsoftplus"))
        return ms_err(err, MS_EUNSUPPORTED,
                      "config.json: scoring_func '%s': deepseek_v4 runs sqrtsoftplus only", sf);
    const json_t *rs = json_object_get(root, "rope_scaling");
    c->rope_factor = 1, c->beta_fast = 32, c->beta_slow = 1;
    if (json_is_object(rs)) {
        ms_jget r = {rs, "rope_scaling.", err};
        rc = ms_jget_num(&r, "factor", 1, 1, 1e6, &c->rope_factor);
        if (!rc)
            rc = ms_jget_int(&r, "original_max_position_embeddings", 0, 0, INT64_C(1) << 32,
                             &c->rope_orig);
        if (!rc) rc = ms_jget_num(&r, "beta_fast", 32, 0, 1e6, &c->beta_fast);
        if (!rc) rc = ms_jget_num(&r, "beta_slow", 1, 0, 1e6, &c->beta_slow);
        if (rc) return rc;
    }
#undef F
    int n = 0;
    if ((rc = parse_ratios(root, c->n_layers, MS_KV_MAX_LAYERS, c->ratio, &n, err))) return rc;
    if (c->n_mtp && n < c->n_layers + 1) c->ratio[c->n_layers] = 0; /* MTP: window only */
    if (c->hd <= c->dr || c->dr % 2 || c->idx_hd < c->dr)
        return ms_err(err, MS_EFORMAT,
                      "config.json: head_dim %d must exceed an even qk_rope_head_dim %d, and "
                      "index_head_dim %d must hold it",
                      c->hd, c->dr, c->idx_hd);
    if (c->H % c->o_groups)
        return ms_err(err, MS_EFORMAT, "config.json: o_groups %d must divide %d heads", c->o_groups,
                      c->H);
    if (c->K > c->E || c->n_hash > c->n_layers)
        return ms_err(err, MS_EFORMAT,
                      "config.json: num_experts_per_tok %d over %d experts, or num_hash_layers "
                      "%d over %d layers",
                      c->K, c->E, c->n_hash, c->n_layers);
    return 0;
}

/* ---- cache streams ---- */

int64_t ms_v4_state_floats(int ratio, int hd, int ihd)
{
    if (!ratio) return 0;
    int64_t c = ratio == 4 ? 2 : 1, st = 2 * ms_v4_comp_slots(ratio) * (c * hd);
    if (ratio == 4) st += 2 * ms_v4_comp_slots(4) * (2 * (int64_t)ihd);
    return st;
}

int64_t ms_v4_carry_values(int hd, int ihd)
{
    return 2 * 4 * (2 * (int64_t)hd) + 2 * 4 * (2 * (int64_t)ihd);
}

/* Every layer a window of main entries (plus the verify's draft slack); CSA
 * layers (ratio 4) one main entry and one index key per 4 tokens; HCA layers
 * (ratio 128) one main entry per 128 tokens.  Main entries: elem_bytes 0 or
 * 1 (the planner's default; --kv-cache-dtype fp8_e4m3) the packed FP8 ds
 * entry, 2 or 4 plain BF16 or F32 values.  Index keys (o->index_key): MXFP4,
 * FP8, or plain values (elem_bytes', the activations' under an FP8 cache); the
 * planner's default MXFP4 with the model's packed entries, FP8 under
 * --kv-cache-dtype fp8_e4m3 (SGLang's pair).  The forward tells the formats
 * apart by the streams' dtype (MS_DT_U8: packed) and, for the index keys, by
 * their bytes (68 vs 132 for 128 values).  State: each
 * compressed layer's kv_state + score_state, each [slots][c'·d] (c' = 2 for
 * ratio 4; ms_v4_comp_slots: c'·m + the verify's spill), and the CSA
 * indexer's own pair (arch.md §2.7), of state_bytes each (0: F32). */
static int v4_kv_spec(const ms_model_shape *s, const ms_kv_spec_opts *o, ms_kv_spec *out,
                      ms_errbuf *err)
{
    /* with drafts the MTP block's window entries ride in the same pages as layer
     * n_layers (window-only: compress_ratios[n_layers] is 0) */
    int n_lay = s->n_layers + (o->draft_tokens > 0 && s->n_mtp_layers > 0);
    ms_kv_spec_init(out, n_lay);
    int b = o->elem_bytes, packed = b == 0 || b == 1;
    int ab = o->act_bytes == 4 ? 4 : 2, kb = b == 2 || b == 4 ? b : ab;
    int fp4 = o->index_key == MS_KV_INDEX_MXFP4 || (o->index_key == MS_KV_INDEX_DEPLOYED && b == 0);
    int fp8 = o->index_key == MS_KV_INDEX_FP8 || (o->index_key == MS_KV_INDEX_DEPLOYED && b == 1);
    int64_t main_n = s->head_dim, key_n = s->index_head_dim;
    double main = (double)main_n * b, key = (double)key_n * kb;
    ms_dtype dt = b == 4 ? MS_DT_F32 : MS_DT_BF16, kdt = kb == 4 ? MS_DT_F32 : MS_DT_BF16;
    if (packed) {
        main_n = ms_kvq_fp8ds_bytes(s->head_dim, s->qk_rope);
        main = (double)main_n, dt = MS_DT_U8;
    }
    if ((fp4 || fp8) && (s->index_head_dim & (s->index_head_dim - 1)))
        return ms_err(err, MS_EUNSUPPORTED,
                      "%s index keys: index_head_dim %d is not a power of two (the Hadamard "
                      "rotation)",
                      fp4 ? "MXFP4" : "FP8", s->index_head_dim);
    if (fp4 || fp8) {
        key_n =
            fp4 ? ms_kvq_mxfp4_bytes(s->index_head_dim) : ms_kvq_fp8key_bytes(s->index_head_dim);
        key = (double)key_n, kdt = MS_DT_U8;
    }
    ms_kv_stream *win =
        ms_kv_spec_add(out, "window", main, main_n, dt, 1, s->window, o->draft_tokens);
    ms_kv_stream *c4 = ms_kv_spec_add(out, "c4", main, main_n, dt, 4, 0, 0);
    ms_kv_stream *c128 = ms_kv_spec_add(out, "c128", main, main_n, dt, 128, 0, 0);
    ms_kv_stream *idx = ms_kv_spec_add(out, "index", key, key_n, kdt, 4, 0, 0);
    if (!win || !c4 || !c128 || !idx) return ms_err(err, MS_EINTERNAL, "kv_spec: too many streams");
    /* what a query reads (arch.md §2.6-§2.8): every window entry and C128 entry, the
     * indexer's top-k of the C4 entries, each a key and a value (K = V) for this
     * rank's heads (q·k and p·v: 4·H·d FLOPs); every index key, for all index heads
     * on every attention-TP member (q·k, then w_h·ReLU summed: 2·n_I·(d_I + 1)) */
    double hl = (double)s->n_heads / (o->attn_tp > 0 ? o->attn_tp : 1);
    win->read_flops = c4->read_flops = c128->read_flops = 4 * hl * s->head_dim;
    c4->read_cap = s->index_topk > 0 ? s->index_topk : 512;
    idx->read_flops = 2.0 * s->index_n_heads * (s->index_head_dim + 1);
    double sb = o->state_bytes > 0 ? o->state_bytes : 4;
    /* what a prefix hit needs at a share unit (page_size × 128 tokens, where the
     * ratio-128 windows are empty), snapshotted at every unit a sequence passes, one
     * entry per unit, so that a hit is usable at any unit of a cached prefix
     * (deepseek_v4_attn.c saves and restores them): 'carry', each CSA layer's two
     * overlapping compressors' previous window; 'wsnap', every layer's last window
     * of main entries before the unit, in the window's own format (its pages are
     * then never shared: a hit takes fresh ones that the restore fills) */
    ms_kv_stream *carry = NULL, *wsnap = NULL;
    if (o->prefix_carry && o->page_size > 0) {
        int64_t n = ms_v4_carry_values(s->head_dim, s->index_head_dim);
        carry = ms_kv_spec_add(out, "carry", (double)n * sb, (int64_t)(n * sb), MS_DT_U8,
                               o->page_size * 128, 0, 0);
        wsnap = ms_kv_spec_add(out, "wsnap", main * s->window, (int64_t)main * s->window, MS_DT_U8,
                               o->page_size * 128, 0, 0);
        if (!carry || !wsnap) return ms_err(err, MS_EINTERNAL, "kv_spec: too many streams");
        carry->page_entries = wsnap->page_entries = 1;
        carry->read_cap = wsnap->read_cap = -1; /* read only at a chunk start on a unit */
        out->state_snapshots = true;
    }
    for (int l = 0; l < s->n_layers; l++) {
        int ratio = l < s->n_ratios ? s->compress_ratios[l] : 0;
        ms_kv_stream_cover(win, l);
        if (wsnap) ms_kv_stream_cover(wsnap, l);
        if (ratio == 4 && carry) ms_kv_stream_cover(carry, l);
        if (ratio == 4) ms_kv_stream_cover(c4, l), ms_kv_stream_cover(idx, l);
        if (ratio == 128) ms_kv_stream_cover(c128, l);
        if (ratio)
            ms_kv_spec_add_state(out, l,
                                 ms_v4_state_floats(ratio, s->head_dim, s->index_head_dim) * sb);
    }
    if (n_lay > s->n_layers) ms_kv_stream_cover(win, s->n_layers);
    return 0;
}

/* ---- workspace ---- */

#define GROW_F(ptr, n)                                                                             \
    do {                                                                                           \
        ms_free_aligned(ptr);                                                                      \
        (ptr) = ms_alloc_aligned((size_t)(n), sizeof(float));                                      \
        if (!(ptr)) return MS_ENOMEM;                                                              \
    } while (0)

static int ws_reserve(ms_model *m, int64_t T)
{
    ms_v4_ws *w = &m->v4->ws;
    const ms_v4_cfg *c = &m->v4->c;
    if (T <= w->cap_T) return 0;
    T = MS_MAX(T, 2 * w->cap_T);
    int64_t D = c->D, hc = c->hc, M = (2 + hc) * hc, H = m->n_local_heads;
    GROW_F(w->X, T * hc * D);
    GROW_F(w->Xn, T * hc * D);
    GROW_F(w->mix, T * M);
    GROW_F(w->pre, T * hc);
    GROW_F(w->post, T * hc);
    GROW_F(w->comb, T * hc * hc);
    GROW_F(w->u, T * D);
    GROW_F(w->f, T * D);
    GROW_F(w->qr, T * c->q_lora);
    GROW_F(w->q, T * H * c->hd);
    GROW_F(w->kv, T * c->hd);
    GROW_F(w->o, T * H * c->hd);
    GROW_F(w->z, T * m->v4->n_local_groups * c->o_lora);
    GROW_F(w->ca, T * 2 * MS_MAX(c->hd, c->idx_hd));
    GROW_F(w->cg, T * 2 * MS_MAX(c->hd, c->idx_hd));
    GROW_F(w->iq, T * c->n_idx_heads * c->idx_hd);
    GROW_F(w->iw, T * c->n_idx_heads);
    GROW_F(w->hn, T * D);
    free(w->tok);
    w->tok = malloc(sizeof(int32_t) * (size_t)T);
    if (!w->tok) return MS_ENOMEM;
    w->cap_T = T;
    return 0;
}

int ms_v4_ws_attn_reserve(ms_model *m, int64_t S, int64_t n_win)
{
    ms_v4_ws *w = &m->v4->ws;
    const ms_v4_cfg *c = &m->v4->c;
    if (n_win > w->cap_win) {
        n_win = MS_MAX(n_win, 2 * w->cap_win);
        GROW_F(w->win, n_win * c->hd);
        w->cap_win = n_win;
    }
    int nt = ms_pool_size(m->pool) > 0 ? ms_pool_size(m->pool) : 1;
    if (S <= w->cap_S && nt <= w->n_th) return 0;
    S = MS_MAX(MS_MAX(S, 2 * w->cap_S), 256);
    GROW_F(w->cand, S * c->hd);
    GROW_F(w->isc, S);
    GROW_F(w->ik, S * c->idx_hd);
    GROW_F(w->iscore, S * c->n_idx_heads);
    GROW_F(w->isr, S * 2 * nt);
    GROW_F(w->cbuf, S * c->hd);
    free(w->sel);
    w->sel = malloc(sizeof(int32_t) * (size_t)S);
    if (!w->sel) return MS_ENOMEM;
    for (int i = 0; i < w->n_th; i++) {
        ms_free_aligned(w->th[i].isc), ms_free_aligned(w->th[i].sc), ms_free_aligned(w->th[i].kb);
        free(w->th[i].sel), free(w->th[i].cand);
    }
    free(w->th);
    w->n_th = 0;
    w->cap_S = 0;
    if (!(w->th = calloc((size_t)nt, sizeof *w->th))) return MS_ENOMEM;
    w->n_th = nt;
    for (int i = 0; i < nt; i++) {
        struct v4_th *t = &w->th[i];
        t->isc = ms_alloc_aligned((size_t)S, sizeof(float));
        t->sc = ms_alloc_aligned((size_t)ms_attn_mqa_scratch_floats(S, c->hd), sizeof(float));
        t->sel = malloc(sizeof(int32_t) * (size_t)S);
        t->cand = malloc(sizeof(float *) * (size_t)S);
        t->kb = ms_alloc_aligned((size_t)(64 * c->idx_hd), sizeof(float));
        if (!t->isc || !t->sc || !t->sel || !t->cand || !t->kb) return MS_ENOMEM;
    }
    w->cap_S = S;
    return 0;
}

static void ws_free(ms_v4_ws *w)
{
    float *bufs[] = {w->X,    w->Xn,  w->mix, w->pre,    w->post, w->comb,   w->u,     w->f,  w->qr,
                     w->q,    w->kv,  w->o,   w->z,      w->ca,   w->cg,     w->iq,    w->iw, w->hn,
                     w->cand, w->isc, w->ik,  w->iscore, w->isr,  w->logits, w->cstate};
    for (size_t i = 0; i < MS_ARRAY_LEN(bufs); i++) ms_free_aligned(bufs[i]);
    ms_free_aligned(w->win), ms_free_aligned(w->cbuf);
    for (int i = 0; i < w->n_th; i++) {
        ms_free_aligned(w->th[i].isc), ms_free_aligned(w->th[i].sc), ms_free_aligned(w->th[i].kb);
        free(w->th[i].sel), free(w->th[i].cand);
    }
    free(w->th);
    free(w->tok);
    free(w->sel);
    free(w->kseq);
    ms_mlp_ws_free(&w->mlp);
}

/* ---- mHC (arch.md §2.5) ---- */

static float sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* r[t] = 1 / sqrt(mean(X[t]²) + eps) over the hc·D values of each row; then
 * mix[t] = r[t] · (fn · X[t]). */
static void hc_mix(ms_model *m, const ms_mat *fn, int64_t T, float *mix)
{
    const ms_v4_cfg *c = &m->v4->c;
    const ms_v4_ws *w = &m->v4->ws;
    int64_t W = c->hc * c->D, M = fn->rows;
    ms_matmul(&m->kctx, mix, M, w->X, W, T, fn, 0);
    for (int64_t t = 0; t < T; t++) {
        const float *x = w->X + t * W;
        double ss = 0;
        for (int64_t i = 0; i < W; i++) ss += (double)x[i] * x[i];
        float r = 1.0f / sqrtf((float)(ss / (double)W) + c->eps);
        for (int64_t i = 0; i < M; i++) mix[t * M + i] *= r;
    }
}

/* hc_pre: the pre / post weights and the Sinkhorn-normalised comb of each
 * row, and the block input u[t] = Σ_k pre_k X[t][k]. */
static void hc_pre(ms_model *m, const ms_mat *fn, const float *base, const float *scale, int64_t T)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    int64_t hc = c->hc, D = c->D, M = (2 + hc) * hc;
    hc_mix(m, fn, T, w->mix);
    for (int64_t t = 0; t < T; t++) {
        const float *mx = w->mix + t * M;
        float *pre = w->pre + t * hc, *post = w->post + t * hc, *cb = w->comb + t * hc * hc;
        for (int64_t k = 0; k < hc; k++) {
            pre[k] = sigmoidf(mx[k] * scale[0] + base[k]) + c->hc_eps;
            post[k] = 2.0f * sigmoidf(mx[hc + k] * scale[1] + base[hc + k]);
        }
        for (int64_t j = 0; j < hc; j++) { /* row softmax + eps */
            float *row = cb + j * hc, mxv = -INFINITY, s = 0;
            for (int64_t k = 0; k < hc; k++) {
                row[k] = mx[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
                mxv = fmaxf(mxv, row[k]);
            }
            for (int64_t k = 0; k < hc; k++) s += row[k] = expf(row[k] - mxv);
            for (int64_t k = 0; k < hc; k++) row[k] = row[k] / s + c->hc_eps;
        }
        for (int it = 0; it < c->sinkhorn_iters; it++) {
            if (it > 0)
                for (int64_t j = 0; j < hc; j++) {
                    float s = 0;
                    for (int64_t k = 0; k < hc; k++) s += cb[j * hc + k];
                    for (int64_t k = 0; k < hc; k++) cb[j * hc + k] /= s + c->hc_eps;
                }
            for (int64_t k = 0; k < hc; k++) {
                float s = 0;
                for (int64_t j = 0; j < hc; j++) s += cb[j * hc + k];
                for (int64_t j = 0; j < hc; j++) cb[j * hc + k] /= s + c->hc_eps;
            }
        }
        float *u = w->u + t * D;
        const float *x = w->X + t * hc * D;
        for (int64_t d = 0; d < D; d++) u[d] = pre[0] * x[d];
        for (int64_t k = 1; k < hc; k++)
            for (int64_t d = 0; d < D; d++) u[d] += pre[k] * x[k * D + d];
    }
}

/* hc_post: X'[t][k] = post_k · f[t] + Σ_j comb[j][k] · X[t][j]. */
static void hc_post(ms_model *m, int64_t T)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    int64_t hc = c->hc, D = c->D;
    for (int64_t t = 0; t < T; t++) {
        const float *x = w->X + t * hc * D, *f = w->f + t * D, *cb = w->comb + t * hc * hc;
        for (int64_t k = 0; k < hc; k++) {
            float *y = w->Xn + (t * hc + k) * D, pk = w->post[t * hc + k];
            for (int64_t d = 0; d < D; d++) y[d] = pk * f[d];
            for (int64_t j = 0; j < hc; j++) ms_axpy_f32(y, cb[j * hc + k], x + j * D, D);
        }
    }
    float *tmp = w->X;
    w->X = w->Xn;
    w->Xn = tmp;
}

/* ---- the forward ---- */

static int32_t n_logit_rows(const ms_batch_seq *sq)
{
    if (!sq->logits || sq->n_tokens <= 0) return 0;
    int32_t n = sq->n_logits > 0 ? sq->n_logits : 1;
    return n < sq->n_tokens ? n : sq->n_tokens;
}

static int v4_embed(ms_model *m, const ms_batch_seq *seqs, int n_seqs, ms_errbuf *err)
{
    const ms_v4_cfg *c = &m->v4->c;
    int64_t T = 0, S = 0, D = c->D;
    for (int i = 0; i < n_seqs; i++) {
        const ms_batch_seq *sq = &seqs[i];
        if (sq->n_tokens <= 0) continue;
        if (sq->start_pos < 0 || sq->start_pos + sq->n_tokens > c->max_pos)
            return ms_err(err, MS_ECONTEXT, "sequence %d: positions %lld..%lld exceed %lld", i,
                          (long long)sq->start_pos, (long long)(sq->start_pos + sq->n_tokens),
                          (long long)c->max_pos);
        if (sq->logits && sq->n_logits > sq->n_tokens)
            return ms_err(err, MS_EINVAL, "sequence %d wants logits of %d positions, has %d", i,
                          sq->n_logits, sq->n_tokens);
        for (int32_t j = 0; j < sq->n_tokens; j++)
            if (sq->tokens[j] < 0 || sq->tokens[j] >= c->vocab)
                return ms_err(err, MS_ERANGE, "token id %d out of range [0, %lld)", sq->tokens[j],
                              (long long)c->vocab);
        T += sq->n_tokens;
        S = MS_MAX(S, sq->start_pos + sq->n_tokens);
    }
    m->fwd_T = T;
    m->fwd_S = S;
    if (T == 0 && !m->shard) return 0;
    if (ws_reserve(m, MS_MAX(T, 1))) return ms_err(err, MS_ENOMEM, "out of memory (workspace)");
    ms_v4_ws *w = &m->v4->ws;
    const ms_mat *E = &m->embed;
    size_t esz = (size_t)ms_dtype_size(E->dtype);
    int64_t t = 0;
    for (int i = 0; i < n_seqs; i++)
        for (int32_t j = 0; j < seqs[i].n_tokens; j++, t++) {
            int32_t tok = seqs[i].tokens[j];
            float *x = w->X + t * c->hc * D;
            ms_cvt_to_f32(m->kctx.isa, E->dtype,
                          (const char *)E->data + (size_t)(tok * E->ld) * esz, x, D);
            for (int k = 1; k < c->hc; k++) memcpy(x + k * D, x, sizeof(float) * (size_t)D);
            w->tok[t] = tok;
        }
    return 0;
}

/* The draft block past its window entries: every sequence cut to its last
 * ms_draft_out_rows positions (family.h), their residual streams and token
 * ids packed to the front; *seqs becomes the cut batch (kept in kseq). */
static int kseq_reserve(ms_v4_ws *w, int n_seqs)
{
    if (n_seqs <= w->cap_kseq) return 0;
    void *p = realloc(w->kseq, sizeof *w->kseq * (size_t)n_seqs);
    if (!p) return MS_ENOMEM;
    w->kseq = p;
    w->cap_kseq = n_seqs;
    return 0;
}

/* The draft batch before its block: every sequence cut to its output rows
 * and the window - 1 positions before them, the only positions whose window
 * entries those rows read (the older ones have slid out of the window pages
 * the scheduler keeps); into kseq, *seqs becomes the cut batch. */
static int keep_window_rows(ms_model *m, const ms_batch_seq **seqs, int n_seqs)
{
    ms_v4_ws *w = &m->v4->ws;
    int64_t HW = m->v4->c.hc * m->v4->c.D;
    if (kseq_reserve(w, n_seqs)) return MS_ENOMEM;
    for (int i = 0; i < n_seqs; i++) {
        ms_batch_seq b = (*seqs)[i];
        int32_t keep = (int32_t)MS_MIN((int64_t)b.n_tokens,
                                       (int64_t)ms_draft_out_rows(&b) + m->v4->c.window - 1);
        ms_batch_seq_keep_last(&b, keep, HW);
        w->kseq[i] = b;
    }
    *seqs = w->kseq;
    return 0;
}

static int keep_out_rows(ms_model *m, const ms_batch_seq **seqs, int n_seqs)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    int64_t W = c->hc * c->D, t = 0, k = 0;
    if (kseq_reserve(w, n_seqs)) return MS_ENOMEM;
    for (int i = 0; i < n_seqs; i++) {
        ms_batch_seq b = (*seqs)[i];
        int32_t keep = ms_draft_out_rows(&b), drop = b.n_tokens > 0 ? b.n_tokens - keep : 0;
        t += drop;
        for (int32_t j = 0; j < keep; j++, t++, k++) { /* k <= t: forward moves */
            memmove(w->X + k * W, w->X + t * W, sizeof(float) * (size_t)W);
            w->tok[k] = w->tok[t];
        }
        ms_batch_seq_keep_last(&b, keep, W);
        w->kseq[i] = b;
    }
    *seqs = w->kseq;
    m->fwd_T = k;
    return 0;
}

/* Block l (a layer of the stack, or the MTP block at n_layers) over the
 * streams in ws->X.  keep (the draft block, window-only): every row's window
 * entry is written, then only each sequence's output rows go on through the
 * attention and the MoE, and *keep is set to the cut batch (keep_out_rows). */
static int block(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs, int l,
                 const ms_batch_seq **keep, ms_errbuf *err)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    const v4_layer *lw = &m->v4->layers[l];
    int64_t T = m->fwd_T, D = c->D;
    int rc;
    hc_pre(m, &lw->hc_attn_fn, lw->hc_attn_base, lw->hc_attn_scale, T);
    ms_rmsnorm(w->u, w->u, lw->attn_norm, T, D, D, c->eps);
    if (keep) { /* every row's window entry, then only the output rows go on */
        if ((rc = ms_v4_store_window(m, cache, seqs, n_seqs, l, err))) return rc;
        if (keep_out_rows(m, &seqs, n_seqs)) return ms_err(err, MS_ENOMEM, "out of memory");
        *keep = seqs;
        T = m->fwd_T;
        hc_pre(m, &lw->hc_attn_fn, lw->hc_attn_base, lw->hc_attn_scale, T);
        ms_rmsnorm(w->u, w->u, lw->attn_norm, T, D, D, c->eps);
    }
    if ((rc = ms_v4_attention(m, cache, seqs, n_seqs, l, err))) return rc;
    hc_post(m, T);
    hc_pre(m, &lw->hc_ffn_fn, lw->hc_ffn_base, lw->hc_ffn_scale, T);
    ms_rmsnorm(w->u, w->u, lw->ffn_norm, T, D, D, c->eps);
    ms_comm_set_tag(l);
    ms_mlp_ctx mcx = {&m->kctx, &m->cfg, m->shard};
    ms_mlp_w mw = {.layer = l,
                   .is_moe = 1,
                   .moe = {&lw->router, lw->bias, lw->experts, c->n_shared ? &lw->shared : NULL,
                           lw->tid2eid, w->tok}};
    if ((rc = ms_mlp_forward(&mcx, &mw, w->u, T, w->f, &w->mlp, err))) return rc;
    hc_post(m, T);
    return 0;
}

static int v4_run_layers(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs,
                         int n_seqs, int first, int last, ms_errbuf *err)
{
    const ms_v4_cfg *c = &m->v4->c;
    if (first < 0 || last > c->n_layers || first > last)
        return ms_err(err, MS_EINVAL, "layers [%d, %d) outside the model's %d", first, last,
                      c->n_layers);
    if (m->fwd_T == 0 && !m->shard) return 0;
    for (int l = first; l < last; l++) {
        int rc = block(m, cache, seqs, n_seqs, l, NULL, err);
        if (rc) return rc;
    }
    ms_comm_set_tag(MS_COMM_TAG_NONE);
    return 0;
}

/* Sequence i's hidden-state rows: its last n_hidden positions (0: its logit rows). */
static int32_t n_hidden_rows(const ms_batch_seq *sq)
{
    if (!sq->hidden || sq->n_tokens <= 0) return 0;
    if (sq->n_hidden <= 0) return n_logit_rows(sq);
    return sq->n_hidden < sq->n_tokens ? sq->n_hidden : sq->n_tokens;
}

/* The wanted rows: hidden states are the residual streams before hc_head
 * ([hc][D] per row: what the MTP block reads, arch.md §2.10); logits from
 * hc_head (fn, base, scale) on the logit rows, the norm and the head. */
static int head_rows(ms_model *m, const ms_batch_seq *seqs, int n_seqs, const ms_mat *hc_fn,
                     const float *hc_base, const float *hc_scale, const float *norm,
                     const ms_mat *head, ms_errbuf *err)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    int64_t D = c->D, hc = c->hc, t = 0, n = 0, V = head->rows;
    if (m->fwd_T == 0) return 0;
    /* the logit rows' streams packed to the front of Xn; the hidden rows copied out */
    for (int i = 0; i < n_seqs; i++) {
        int32_t nl = n_logit_rows(&seqs[i]), nh = n_hidden_rows(&seqs[i]);
        t += MS_MAX(seqs[i].n_tokens, 0);
        if (nh)
            memcpy(seqs[i].hidden, w->X + (t - nh) * hc * D, sizeof(float) * (size_t)(nh * hc * D));
        if (!nl) continue;
        memcpy(w->Xn + n * hc * D, w->X + (t - nl) * hc * D, sizeof(float) * (size_t)(nl * hc * D));
        n += nl;
    }
    if (n == 0) return 0;
    if (n > w->cap_logits) {
        int64_t rows = MS_MAX(n, 2 * w->cap_logits);
        ms_free_aligned(w->logits);
        w->logits = ms_alloc_aligned((size_t)(rows * c->vocab), sizeof(float));
        w->cap_logits = w->logits ? rows : 0;
        if (!w->logits) return ms_err(err, MS_ENOMEM, "out of memory (logits)");
    }
    float *tmp = w->X; /* hc_mix reads X */
    w->X = w->Xn;
    w->Xn = tmp;
    hc_mix(m, hc_fn, n, w->mix);
    for (int64_t r = 0; r < n; r++) {
        float *y = w->hn + r * D;
        const float *x = w->X + r * hc * D;
        memset(y, 0, sizeof(float) * (size_t)D);
        for (int64_t k = 0; k < hc; k++) {
            float pk = sigmoidf(w->mix[r * hc + k] * hc_scale[0] + hc_base[k]) + c->hc_eps;
            ms_axpy_f32(y, pk, x + k * D, D);
        }
    }
    tmp = w->X;
    w->X = w->Xn;
    w->Xn = tmp;
    ms_rmsnorm(w->hn, w->hn, norm, n, D, D, c->eps);
    ms_matmul(&m->kctx, w->logits, V, w->hn, D, n, head, 0);
    n = 0;
    for (int i = 0; i < n_seqs; i++) {
        int32_t nl = n_logit_rows(&seqs[i]);
        if (!nl) continue;
        memcpy(seqs[i].logits, w->logits + n * V, sizeof(float) * (size_t)(nl * V));
        n += nl;
    }
    return 0;
}

static int v4_head(ms_model *m, const ms_batch_seq *seqs, int n_seqs, ms_errbuf *err)
{
    struct ms_v4 *v = m->v4;
    return head_rows(m, seqs, n_seqs, &v->hc_head_fn, v->hc_head_base, v->hc_head_scale,
                     m->final_norm, &m->lm_head, err);
}

/* The MTP block (arch.md §2.10, the official MTPBlock) over a batch whose
 * sequences carry hidden_in [n_tokens][hc][D]: e = enorm(embed(token)),
 * X_k = e_proj(e) + h_proj(hnorm(h_k)) for each of the hc streams h_k, one
 * block at layer index n_layers (window-only attention with base RoPE,
 * non-hash MoE) writing its window entries to cache layer n_layers (for a
 * sequence's output rows and the window before them), then its
 * own hc_head, its norm and the shared head (or the draft head of
 * --speculative-token-map).  h is the target's final streams before hc_head;
 * further along a chain the block's own output streams, which is what the
 * returned hidden rows hold. */
static int v4_draft(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                    ms_errbuf *err)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    const v4_layer *lw = &m->v4->layers[c->n_layers];
    int64_t D = c->D, hc = c->hc, t = 0;
    if (keep_window_rows(m, &seqs, n_seqs)) return ms_err(err, MS_ENOMEM, "out of memory");
    int rc = v4_embed(m, seqs, n_seqs, err);
    if (rc) return rc;
    int64_t T = m->fwd_T;
    if (T == 0 && !m->shard) return 0;
    for (int i = 0; i < n_seqs; i++) {
        const ms_batch_seq *sq = &seqs[i];
        if (sq->n_tokens > 0 && !sq->hidden_in)
            return ms_err(err, MS_EINVAL, "draft forward: sequence %d has no hidden_in", i);
        for (int32_t j = 0; j < sq->n_tokens; j++, t++) {
            ms_rmsnorm(w->u + t * D, w->X + t * hc * D, lw->enorm, 1, D, D, c->eps);
            ms_rmsnorm(w->Xn + t * hc * D, sq->hidden_in + (int64_t)j * hc * D, lw->hnorm, hc, D, D,
                       c->eps);
        }
    }
    if (T > 0) {
        ms_matmul(&m->kctx, w->X, D, w->Xn, D, T * hc, &lw->h_proj, 0);
        ms_matmul(&m->kctx, w->f, D, w->u, D, T, &lw->e_proj, 0);
        for (int64_t r = 0; r < T; r++)
            for (int64_t k = 0; k < hc; k++)
                ms_axpy_f32(w->X + (r * hc + k) * D, 1.0f, w->f + r * D, D);
    }
    const ms_batch_seq *kept = seqs;
    rc = block(m, cache, seqs, n_seqs, c->n_layers, &kept, err);
    ms_comm_set_tag(MS_COMM_TAG_NONE);
    if (!rc)
        rc = head_rows(m, kept, n_seqs, &lw->hc_head_fn, lw->hc_head_base, lw->hc_head_scale,
                       lw->mnorm, m->draft_vocab ? &m->draft_head : &m->lm_head, err);
    return rc;
}

/* ---- open / free ---- */

static void v4_free(ms_model *m)
{
    if (!m) return;
    if (m->v4) {
        ms_v4_free_weights(m);
        ws_free(&m->v4->ws);
        free(m->v4->inv_freq_plain);
        free(m->v4->inv_freq_comp);
        free(m->v4->state_off);
        free(m->v4);
    }
    free(m->final_norm);
    ms_free_aligned((void *)m->draft_head.data); /* --speculative-token-map's head */
    free(m->draft_vocab);
    ms_pool_free(m->pool);
    if (m->arena) munmap(m->arena, m->arena_bytes);
    free(m->f8_plain);
    ms_st_close(m->st);
    free(m);
}

/* Inverse frequencies of the rope dims (arch.md §0.4): YaRN when orig > 0. */
static void rope_table(int dr, double base, double factor, int64_t orig, double beta_fast,
                       double beta_slow, float *out)
{
    for (int i = 0; i < dr / 2; i++) out[i] = (float)(1.0 / pow(base, 2.0 * i / dr));
    if (orig <= 0) return;
    double lo = floor(dr * log((double)orig / (beta_fast * 2 * M_PI)) / (2 * log(base)));
    double hi = ceil(dr * log((double)orig / (beta_slow * 2 * M_PI)) / (2 * log(base)));
    lo = fmax(lo, 0), hi = fmin(hi, dr - 1);
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < dr / 2; i++) {
        float ramp = (float)(((float)i - lo) / (hi - lo));
        ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
        float smooth = 1.0f - ramp;
        out[i] = out[i] / (float)factor * (1.0f - smooth) + out[i] * smooth;
    }
}

static int v4_open(ms_model **out, const char *dir, const ms_model_opts *opts, ms_errbuf *err)
{
    *out = NULL;
    char path[1200];
    if (!ms_path_join(path, sizeof path, dir, "config.json"))
        return ms_err(err, MS_EINVAL, "model path too long: %s", dir);
    char *text = NULL;
    int rc = ms_read_file(path, MS_CONFIG_MAX_BYTES, &text, NULL);
    if (rc) return ms_err(err, rc, "%s: cannot read: %s", path, ms_strerror(rc));
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    free(text);
    if (!root) return ms_err(err, MS_EFORMAT, "%s: %s (line %d)", path, je.text, je.line);
    ms_model *m = calloc(1, sizeof *m);
    if (m) m->v4 = calloc(1, sizeof *m->v4);
    if (!m || !m->v4) {
        json_decref(root);
        free(m);
        return ms_err(err, MS_ENOMEM, "out of memory");
    }
    snprintf(m->path, sizeof m->path, "%s", dir);
    m->family = &ms_family_deepseek_v4;
    ms_v4_cfg *c = &m->v4->c;
    rc = ms_v4_cfg_parse(root, c, err);
    /* the MoE code's view of the config */
    ms_config *mc = &m->cfg;
    snprintf(mc->model_type, sizeof mc->model_type, "deepseek_v4");
    mc->vocab_size = c->vocab, mc->hidden_size = c->D, mc->n_layers = c->n_layers;
    mc->moe_intermediate_size = c->inter, mc->n_routed_experts = c->E;
    mc->n_shared_experts = c->n_shared, mc->n_experts_per_tok = c->K;
    mc->n_group = mc->topk_group = 1, mc->topk_method = MS_TOPK_NOAUX_TC;
    mc->scoring_func = MS_SCORE_SQRTSOFTPLUS, mc->n_heads = c->H;
    mc->rms_norm_eps = c->eps, mc->max_position_embeddings = c->max_pos;
    mc->num_nextn_predict_layers = c->n_mtp;
    if (!rc)
        rc = ms_jget_bool(&(ms_jget){root, "", err}, "norm_topk_prob", true, &mc->norm_topk_prob);
    if (!rc)
        rc = ms_jget_num(&(ms_jget){root, "", err}, "routed_scaling_factor", 1.0, 0, 1e6,
                         &mc->routed_scaling_factor);
    if (!rc)
        rc = ms_jget_num(&(ms_jget){root, "", err}, "swiglu_limit", 0.0, 0, 1e6, &mc->swiglu_limit);
    json_decref(root);
    if (rc) goto fail;
    m->shard = opts ? opts->shard : NULL;
    m->n_local_heads = c->H;
    m->v4->n_local_groups = c->o_groups;
    int tp = m->shard ? m->shard->lay->attn_tp : 1;
    if (tp > 1) {
        if (c->H % tp || c->o_groups % tp) {
            rc = ms_err(err, MS_ELAYOUT,
                        "%d attention heads and %d output groups must be divisible by attention "
                        "TP %d",
                        c->H, c->o_groups, tp);
            goto fail;
        }
        m->n_local_heads = c->H / tp;
        m->head0 = m->shard->at.attn_tp_rank * m->n_local_heads;
        m->v4->n_local_groups = c->o_groups / tp;
        m->v4->group0 = m->shard->at.attn_tp_rank * m->v4->n_local_groups;
    }
    if ((rc = ms_model_init_kernels(m, opts, err))) goto fail;
    if ((rc = ms_st_open_dir(&m->st, dir, err))) goto fail;
    if ((rc = ms_v4_load(m, opts, err))) goto fail;
    if ((rc = ms_model_place(m, err))) goto fail;
    m->v4->inv_freq_plain = malloc(sizeof(float) * (size_t)(c->dr / 2));
    m->v4->inv_freq_comp = malloc(sizeof(float) * (size_t)(c->dr / 2));
    m->v4->state_off = calloc((size_t)c->n_layers + 1, sizeof(int64_t));
    if (!m->v4->inv_freq_plain || !m->v4->inv_freq_comp || !m->v4->state_off) {
        rc = ms_err(err, MS_ENOMEM, "out of memory");
        goto fail;
    }
    rope_table(c->dr, c->rope_theta, 1, 0, 0, 0, m->v4->inv_freq_plain);
    rope_table(c->dr, c->compress_rope_theta, c->rope_factor, c->rope_orig, c->beta_fast,
               c->beta_slow, m->v4->inv_freq_comp);
    for (int l = 0; l < c->n_layers; l++) /* the kv_spec's state, layer by layer */
        m->v4->state_off[l + 1] =
            m->v4->state_off[l] + ms_v4_state_floats(c->ratio[l], c->hd, c->idx_hd);
    MS_LOG(
        MS_INFO, "model",
        "loaded %s: deepseek_v4, %d layers (+%d MTP: the speculative draft), %lld params, isa %s, "
        "%d threads, %s activations%s",
        dir, c->n_layers, c->n_mtp, (long long)m->n_params, ms_isa_name(m->kctx.isa),
        ms_pool_size(m->pool), m->kctx.exact ? "fp32" : "auto",
        m->kctx.batch_invariant ? ", batch-invariant products" : "");
    *out = m;
    return 0;
fail:
    v4_free(m);
    return rc;
}

const ms_family ms_family_deepseek_v4 = {
    .name = "deepseek_v4",
    .models = "DeepSeek-V4 Flash/Pro",
    .match = v4_match,
    .parse = v4_parse,
    .kv_spec = v4_kv_spec,
    .open = v4_open,
    .embed = v4_embed,
    .run_layers = v4_run_layers,
    .head = v4_head,
    .each_view = ms_v4_each_view,
    .free = v4_free,
    .draft = v4_draft,
};
