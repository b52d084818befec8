/* deepseek_v4_load.c — binds a DeepSeek-V4 checkpoint (the official tensor
 * names, arch.md §2.3: embed, head, norm, hc_head_*, layers.L.*, mtp.0.*)
 * to an ms_model: every tensor's presence, shape and dtype checked against
 * the config (errors name file and tensor); matrices are views into the
 * read-only mmap in F32, BF16, F16 or FP8 e4m3, whose `.scale` sibling (one
 * per 128×128 block) is F8_E8M0 (UE8M0, 2^(e−127)) or F32 and becomes the
 * f32 multipliers ms_mat takes; vectors are copied to f32; tid2eid (I64 or
 * I32) to int32 with every id checked.  Routed experts go through
 * load_expert_mat, which binds FP4 (I8-packed e2m1, per-32 UE8M0) expert
 * matrices as MS_DT_F4E2M1 views (kept in FP4).  This rank's heads, output
 * groups, experts and expert slices are narrowed from the shard, the MTP
 * block's too (the speculative draft, deepseek_v4.c).  Start-up, main thread.
 */
#include "base/util.h"
#include "model/deepseek_v4.h"
#include "model/quant_load.h"
#include "model/safetensors.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAT_DTYPES                                                                                 \
    (MS_DT_MASK(MS_DT_F32) | MS_DT_MASK(MS_DT_BF16) | MS_DT_MASK(MS_DT_F16) |                      \
     MS_DT_MASK(MS_DT_F8E4M3))
#define VEC_DTYPES (MS_DT_MASK(MS_DT_F32) | MS_DT_MASK(MS_DT_BF16) | MS_DT_MASK(MS_DT_F16))

struct ld {
    ms_model *m;
    ms_errbuf *err;
    int64_t n_params;
    int count; /* 0: the MTP block (not counted) */
};

static int keep_scale(struct ms_v4 *v, float *s)
{
    void *p = v->scales;
    if (ms_grow_array(&p, &v->cap_scales, v->n_scales + 1, sizeof(float *))) {
        free(s);
        return MS_ENOMEM;
    }
    v->scales = p;
    v->scales[v->n_scales++] = s;
    return 0;
}

/* The block scales of an FP8 matrix `name` (X.weight → X.scale): F8_E8M0 or
 * F32 [ceil(rows/128)][ceil(cols/128)], as f32 multipliers. */
static int load_scale(struct ld *L, const char *name, int64_t rows, int64_t cols, const float **out)
{
    size_t n = strlen(name);
    char sname[300];
    if (n < 7 || strcmp(name + n - 7, ".weight") != 0)
        return ms_err(L->err, MS_EFORMAT, "tensor '%s': FP8 tensor without block scales", name);
    snprintf(sname, sizeof sname, "%.*s.scale", (int)(n - 7), name);
    const int64_t sshape[2] = {(rows + 127) / 128, (cols + 127) / 128};
    const ms_tensor *s;
    int rc = ms_st_expect(L->m->st, sname, 2, sshape,
                          MS_DT_MASK(MS_DT_F8E8M0) | MS_DT_MASK(MS_DT_F32), &s, L->err);
    if (rc) return rc;
    int64_t k = sshape[0] * sshape[1];
    float *f = malloc(sizeof(float) * (size_t)k);
    if (!f) return ms_err(L->err, MS_ENOMEM, "out of memory (scales of '%s')", name);
    if (s->dtype == MS_DT_F8E8M0) {
        if ((rc = ms_e8m0_scales_to_f32(s, f, k, L->err))) {
            free(f);
            return rc;
        }
    } else {
        memcpy(f, s->data, sizeof(float) * (size_t)k);
    }
    for (int64_t i = 0; i < k; i++)
        if (!isfinite(f[i])) {
            free(f);
            return ms_err(L->err, MS_EFORMAT, "%s: tensor '%s': scale %lld is not finite", s->file,
                          sname, (long long)i);
        }
    if (keep_scale(L->m->v4, f)) return ms_err(L->err, MS_ENOMEM, "out of memory");
    *out = f;
    return 0;
}

static int load_mat(struct ld *L, ms_mat *out, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int load_mat(struct ld *L, ms_mat *out, int64_t rows, int64_t cols, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const int64_t shape[2] = {rows, cols};
    const ms_tensor *t;
    int rc = ms_st_expect(L->m->st, name, 2, shape, MAT_DTYPES, &t, L->err);
    if (rc) return rc;
    const float *scale = NULL;
    if (t->dtype == MS_DT_F8E4M3 && (rc = load_scale(L, name, rows, cols, &scale))) return rc;
    *out = ms_mat_whole(t->dtype, rows, cols, t->data, scale);
    if (L->count) L->n_params += rows * cols;
    return 0;
}

/* An F32 matrix (the mHC mixing weights). */
static int load_f32_mat(struct ld *L, ms_mat *out, int64_t rows, int64_t cols, const char *name)
{
    const int64_t shape[2] = {rows, cols};
    const ms_tensor *t;
    int rc = ms_st_expect(L->m->st, name, 2, shape, MS_DT_MASK(MS_DT_F32), &t, L->err);
    if (rc) return rc;
    *out = ms_mat_whole(MS_DT_F32, rows, cols, t->data, NULL);
    if (L->count) L->n_params += rows * cols;
    return 0;
}

#define load_vec(L, out, n, ...)                                                                   \
    ms_model_load_vec((L)->m->st, out, n, (L)->count ? &(L)->n_params : NULL, (L)->err, __VA_ARGS__)

/* One routed expert's matrix: FP4 (e2m1, two codes per I8 byte, low nibble
 * first, per-32 UE8M0 scales [rows][cols/32], a 255 (NaN) scale refused
 * naming the tensor: quant_load.h's ms_load_fp4_mat) when stored as I8,
 * else load_mat's dtypes. */
static int load_expert_mat(struct ld *L, ms_mat *out, int64_t rows, int64_t cols, const char *name)
{
    if (!ms_st_is_fp4(L->m->st, name)) return load_mat(L, out, rows, cols, "%s", name);
    int rc = ms_load_fp4_mat(L->m->st, name, rows, cols, out, L->err);
    if (!rc && L->count) L->n_params += rows * cols;
    return rc;
}

static int load_ffn(struct ld *L, ms_ffn_w *f, int64_t inter, const char *p, int expert)
{
    int64_t D = L->m->v4->c.D;
    char n[3][256];
    snprintf(n[0], sizeof n[0], "%s.w1.weight", p);
    snprintf(n[1], sizeof n[1], "%s.w3.weight", p);
    snprintf(n[2], sizeof n[2], "%s.w2.weight", p);
    if (expert) {
        int rc = load_expert_mat(L, &f->gate, inter, D, n[0]);
        if (!rc) rc = load_expert_mat(L, &f->up, inter, D, n[1]);
        if (!rc) rc = load_expert_mat(L, &f->down, D, inter, n[2]);
        return rc;
    }
    int rc = load_mat(L, &f->gate, inter, D, "%s", n[0]);
    if (!rc) rc = load_mat(L, &f->up, inter, D, "%s", n[1]);
    if (!rc) rc = load_mat(L, &f->down, D, inter, "%s", n[2]);
    return rc;
}

static int load_comp(struct ld *L, v4_comp *cp, int ratio, int d, const char *p)
{
    int64_t D = L->m->v4->c.D;
    cp->ratio = ratio, cp->d = d, cp->overlap = ratio == 4;
    int64_t w = (cp->overlap ? 2 : 1) * (int64_t)d;
    int rc = load_mat(L, &cp->wkv, w, D, "%s.wkv.weight", p);
    if (!rc) rc = load_mat(L, &cp->wgate, w, D, "%s.wgate.weight", p);
    if (!rc) {
        char n[256];
        snprintf(n, sizeof n, "%s.ape", p);
        ms_mat ape;
        rc = load_f32_mat(L, &ape, ratio, w, n);
        if (!rc) {
            cp->ape = malloc(sizeof(float) * (size_t)(ratio * w));
            if (!cp->ape) return ms_err(L->err, MS_ENOMEM, "out of memory");
            memcpy(cp->ape, ape.data, sizeof(float) * (size_t)(ratio * w));
        }
    }
    if (!rc) rc = load_vec(L, &cp->norm, d, "%s.norm.weight", p);
    return rc;
}

/* The three mHC tensors of one site (p = "layers.L.hc_attn" ...). */
static int load_hc(struct ld *L, ms_mat *fn, float **base, float **scale, int64_t M,
                   int64_t n_scale, const char *p)
{
    const ms_v4_cfg *c = &L->m->v4->c;
    char n[256];
    snprintf(n, sizeof n, "%s_fn", p);
    int rc = load_f32_mat(L, fn, M, c->hc * c->D, n);
    if (!rc) rc = load_vec(L, base, M, "%s_base", p);
    if (!rc) rc = load_vec(L, scale, n_scale, "%s_scale", p);
    return rc;
}

/* tid2eid [vocab][K] (I64 or I32) as int32, every id in [0, E). */
static int load_tid2eid(struct ld *L, v4_layer *lw, const char *p)
{
    const ms_v4_cfg *c = &L->m->v4->c;
    char n[256];
    snprintf(n, sizeof n, "%s.ffn.gate.tid2eid", p);
    const int64_t shape[2] = {c->vocab, c->K};
    const ms_tensor *t;
    int rc = ms_st_expect(L->m->st, n, 2, shape, MS_DT_MASK(MS_DT_I64) | MS_DT_MASK(MS_DT_I32), &t,
                          L->err);
    if (rc) return rc;
    int64_t k = c->vocab * c->K;
    lw->tid2eid = malloc(sizeof(int32_t) * (size_t)k);
    if (!lw->tid2eid) return ms_err(L->err, MS_ENOMEM, "out of memory (%s)", n);
    for (int64_t i = 0; i < k; i++) {
        int64_t e;
        if (t->dtype == MS_DT_I64) {
            memcpy(&e, (const char *)t->data + 8 * i, 8);
        } else {
            int32_t e32;
            memcpy(&e32, (const char *)t->data + 4 * i, 4);
            e = e32;
        }
        if (e < 0 || e >= c->E)
            return ms_err(L->err, MS_EFORMAT,
                          "%s: tensor '%s': expert id %lld at %lld outside [0, %d)", t->file, n,
                          (long long)e, (long long)i, c->E);
        lw->tid2eid[i] = (int32_t)e;
    }
    return 0;
}

/* One block: layers.L or mtp.0 (p), with the layer's ratio; hash selects tid2eid. */
static int load_block(struct ld *L, v4_layer *lw, const char *p, int ratio, int hash)
{
    const ms_v4_cfg *c = &L->m->v4->c;
    int64_t D = c->D, H = c->H, hd = c->hd, M = (2 + c->hc) * c->hc;
    char q[200];
    lw->ratio = ratio;
    int rc = load_vec(L, &lw->attn_norm, D, "%s.attn_norm.weight", p);
    if (!rc) rc = load_vec(L, &lw->ffn_norm, D, "%s.ffn_norm.weight", p);
    snprintf(q, sizeof q, "%s.hc_attn", p);
    if (!rc) rc = load_hc(L, &lw->hc_attn_fn, &lw->hc_attn_base, &lw->hc_attn_scale, M, 3, q);
    snprintf(q, sizeof q, "%s.hc_ffn", p);
    if (!rc) rc = load_hc(L, &lw->hc_ffn_fn, &lw->hc_ffn_base, &lw->hc_ffn_scale, M, 3, q);
    if (!rc) rc = load_vec(L, &lw->sink, H, "%s.attn.attn_sink", p);
    if (!rc) rc = load_mat(L, &lw->wq_a, c->q_lora, D, "%s.attn.wq_a.weight", p);
    if (!rc) rc = load_vec(L, &lw->q_norm, c->q_lora, "%s.attn.q_norm.weight", p);
    if (!rc) rc = load_mat(L, &lw->wq_b, H * hd, c->q_lora, "%s.attn.wq_b.weight", p);
    if (!rc) rc = load_mat(L, &lw->wkv, hd, D, "%s.attn.wkv.weight", p);
    if (!rc) rc = load_vec(L, &lw->kv_norm, hd, "%s.attn.kv_norm.weight", p);
    if (!rc)
        rc = load_mat(L, &lw->wo_a, (int64_t)c->o_groups * c->o_lora, H * hd / c->o_groups,
                      "%s.attn.wo_a.weight", p);
    if (!rc)
        rc = load_mat(L, &lw->wo_b, D, (int64_t)c->o_groups * c->o_lora, "%s.attn.wo_b.weight", p);
    if (rc) return rc;
    if (ratio) {
        snprintf(q, sizeof q, "%s.attn.compressor", p);
        if ((rc = load_comp(L, &lw->comp, ratio, c->hd, q))) return rc;
    }
    if (ratio == 4) {
        int64_t nI = c->n_idx_heads;
        rc = load_mat(L, &lw->iwq_b, nI * c->idx_hd, c->q_lora, "%s.attn.indexer.wq_b.weight", p);
        if (!rc) rc = load_mat(L, &lw->iwproj, nI, D, "%s.attn.indexer.weights_proj.weight", p);
        snprintf(q, sizeof q, "%s.attn.indexer.compressor", p);
        if (!rc) rc = load_comp(L, &lw->icomp, 4, c->idx_hd, q);
        if (rc) return rc;
    }
    if ((rc = load_mat(L, &lw->router, c->E, D, "%s.ffn.gate.weight", p))) return rc;
    rc = hash ? load_tid2eid(L, lw, p) : load_vec(L, &lw->bias, c->E, "%s.ffn.gate.bias", p);
    if (rc) return rc;
    lw->experts = calloc((size_t)c->E, sizeof *lw->experts);
    if (!lw->experts) return ms_err(L->err, MS_ENOMEM, "out of memory (experts)");
    for (int e = 0; e < c->E && !rc; e++) {
        snprintf(q, sizeof q, "%s.ffn.experts.%d", p, e);
        rc = load_ffn(L, &lw->experts[e], c->inter, q, 1);
    }
    snprintf(q, sizeof q, "%s.ffn.shared_experts", p);
    if (!rc && c->n_shared) rc = load_ffn(L, &lw->shared, (int64_t)c->inter * c->n_shared, q, 0);
    return rc;
}

static int load_mtp_extras(struct ld *L, v4_layer *lw, const char *p)
{
    const ms_v4_cfg *c = &L->m->v4->c;
    int64_t D = c->D;
    char q[200];
    int rc = load_mat(L, &lw->e_proj, D, D, "%s.e_proj.weight", p);
    if (!rc) rc = load_mat(L, &lw->h_proj, D, D, "%s.h_proj.weight", p);
    if (!rc) rc = load_vec(L, &lw->enorm, D, "%s.enorm.weight", p);
    if (!rc) rc = load_vec(L, &lw->hnorm, D, "%s.hnorm.weight", p);
    if (!rc) rc = load_vec(L, &lw->mnorm, D, "%s.norm.weight", p);
    snprintf(q, sizeof q, "%s.hc_head", p);
    if (!rc) rc = load_hc(L, &lw->hc_head_fn, &lw->hc_head_base, &lw->hc_head_scale, c->hc, 1, q);
    return rc;
}

/* This rank's heads, output groups, experts and expert slices. */
static int shard_block(ms_model *m, v4_layer *lw, int l, ms_errbuf *err)
{
    const ms_shard *sh = m->shard;
    const ms_v4_cfg *c = &m->v4->c;
    int64_t hd = c->hd, R = c->o_lora, h0 = m->head0, nh = m->n_local_heads;
    int64_t g0 = m->v4->group0, ng = m->v4->n_local_groups;
    if (nh != c->H) {
        lw->wq_b = ms_mat_slice(&lw->wq_b, h0 * hd, nh * hd, 0, lw->wq_b.cols);
        memmove(lw->sink, lw->sink + h0, sizeof(float) * (size_t)nh);
        lw->wo_a = ms_mat_slice(&lw->wo_a, g0 * R, ng * R, 0, lw->wo_a.cols);
        lw->wo_b = ms_mat_slice(&lw->wo_b, 0, lw->wo_b.rows, g0 * R, ng * R);
    }
    for (int s = 0; s < ms_shard_n_experts(sh, c->E); s++) {
        int rc = ms_model_shard_ffn(&lw->experts[ms_shard_expert(sh, l, s)], sh->lay->moe_tp,
                                    sh->at.moe_tp_rank, "moe_intermediate_size", l, err);
        if (rc) return rc;
    }
    if (c->n_shared)
        return ms_model_shard_ffn(&lw->shared, sh->lay->shared_tp, sh->at.shared_rank,
                                  "shared expert", l, err);
    return 0;
}

int ms_v4_load(ms_model *m, const ms_model_opts *opts, ms_errbuf *err)
{
    (void)opts;
    struct ms_v4 *v = m->v4;
    const ms_v4_cfg *c = &v->c;
    struct ld L = {m, err, 0, 1};
    int rc = load_mat(&L, &m->embed, c->vocab, c->D, "embed.weight");
    if (!rc && m->embed.dtype == MS_DT_F8E4M3)
        rc = ms_err(err, MS_EUNSUPPORTED, "embed.weight: FP8 embeddings unsupported");
    if (!rc) rc = load_mat(&L, &m->lm_head, c->vocab, c->D, "head.weight");
    if (!rc) rc = load_vec(&L, &m->final_norm, c->D, "norm.weight");
    if (!rc)
        rc = load_hc(&L, &v->hc_head_fn, &v->hc_head_base, &v->hc_head_scale, c->hc, 1, "hc_head");
    if (rc) return rc;
    int n = c->n_layers + c->n_mtp;
    v->layers = calloc((size_t)n, sizeof *v->layers);
    if (!v->layers) return ms_err(err, MS_ENOMEM, "out of memory");
    for (int l = 0; l < n && !rc; l++) {
        char p[64];
        int mtp = l >= c->n_layers;
        if (mtp)
            snprintf(p, sizeof p, "mtp.%d", l - c->n_layers);
        else
            snprintf(p, sizeof p, "layers.%d", l);
        L.count = !mtp;
        rc = load_block(&L, &v->layers[l], p, c->ratio[l], !mtp && l < c->n_hash);
        if (!rc && mtp) rc = load_mtp_extras(&L, &v->layers[l], p);
        if (!rc && m->shard) rc = shard_block(m, &v->layers[l], l, err);
    }
    if (rc) return rc;
    m->n_mtp_layers = c->n_mtp;
    m->n_params = L.n_params;
    /* weight bytes per decoded token: all this rank's views but the embedding
     * (one row) and its routed experts, plus K experts per layer (of the
     * layer's local share: slices under MoE TP) */
    int64_t b = ms_v4_local_weight_bytes(m) - ms_mat_bytes(&m->embed);
    int n_loc = ms_shard_n_experts(m->shard, c->E);
    for (int l = 0; l < c->n_layers; l++) {
        const v4_layer *lw = &v->layers[l];
        for (int s = 0; s < n_loc; s++) {
            const ms_ffn_w *e = &lw->experts[ms_shard_expert(m->shard, l, s)];
            int64_t eb = ms_mat_bytes(&e->gate) + ms_mat_bytes(&e->up) + ms_mat_bytes(&e->down);
            b -= eb;
            if (s == 0) b += eb * c->K;
        }
    }
    m->active_bytes_per_token = b;
    return 0;
}

static void free_comp(v4_comp *cp)
{
    free(cp->ape);
    free(cp->norm);
}

void ms_v4_free_weights(ms_model *m)
{
    struct ms_v4 *v = m->v4;
    if (v->layers)
        for (int l = 0; l < v->c.n_layers + v->c.n_mtp; l++) {
            v4_layer *lw = &v->layers[l];
            float *f[] = {lw->attn_norm,     lw->ffn_norm,     lw->hc_attn_base, lw->hc_ffn_base,
                          lw->hc_attn_scale, lw->hc_ffn_scale, lw->sink,         lw->q_norm,
                          lw->kv_norm,       lw->bias,         lw->enorm,        lw->hnorm,
                          lw->mnorm,         lw->hc_head_base, lw->hc_head_scale};
            for (size_t i = 0; i < MS_ARRAY_LEN(f); i++) free(f[i]);
            free_comp(&lw->comp);
            free_comp(&lw->icomp);
            free(lw->tid2eid);
            free(lw->experts);
        }
    free(v->layers);
    free(v->hc_head_base);
    free(v->hc_head_scale);
    for (int i = 0; i < v->n_scales; i++) free(v->scales[i]);
    free(v->scales);
}

/* Every weight matrix this rank reads (not the embedding, read a row at a time). */
void ms_v4_each_view(ms_model *m, ms_view_fn fn, void *arg)
{
    struct ms_v4 *v = m->v4;
    const ms_v4_cfg *c = &v->c;
    fn(&m->lm_head, MS_VIEW_LM_HEAD, arg);
    fn(&v->hc_head_fn, 0, arg);
    for (int l = 0; l < c->n_layers; l++) {
        v4_layer *lw = &v->layers[l];
        ms_mat *a[] = {&lw->hc_attn_fn, &lw->hc_ffn_fn,  &lw->wq_a,  &lw->wq_b,
                       &lw->wkv,        &lw->wo_a,       &lw->wo_b,  &lw->router,
                       &lw->comp.wkv,   &lw->comp.wgate, &lw->iwq_b, &lw->iwproj,
                       &lw->icomp.wkv,  &lw->icomp.wgate};
        for (size_t i = 0; i < MS_ARRAY_LEN(a); i++)
            if (a[i]->data) fn(a[i], 0, arg);
        ms_ffn_w *sh = c->n_shared ? &lw->shared : NULL;
        if (sh) fn(&sh->gate, 0, arg), fn(&sh->up, 0, arg), fn(&sh->down, 0, arg);
        for (int s = 0; s < ms_shard_n_experts(m->shard, c->E); s++) {
            ms_ffn_w *x = &lw->experts[ms_shard_expert(m->shard, l, s)];
            fn(&x->gate, 0, arg), fn(&x->up, 0, arg), fn(&x->down, 0, arg);
        }
    }
}

static void add_bytes(ms_mat *w, unsigned flags, void *arg)
{
    (void)flags;
    *(int64_t *)arg += ms_mat_bytes(w);
}

int64_t ms_v4_local_weight_bytes(const ms_model *m)
{
    int64_t b = ms_mat_bytes(&m->embed);
    ms_v4_each_view((ms_model *)m, add_bytes, &b);
    return b;
}
