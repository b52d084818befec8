/* weights.c — binds a DeepSeek-V2/V3 checkpoint to ms_model: opens the
 * safetensors store, checks every tensor's presence, shape and dtype against
 * the config (errors name file and tensor), and builds ms_mat views into the
 * read-only mmap (norm vectors and the gate bias are copied to f32); then
 * places this rank's matrices in memory (place_weights: a copy into 2 MiB
 * pages by default, the file mapping with MOESERVE_WEIGHTS=mmap), refusing
 * a NaN or infinity in any of them (note_bad below).  MTP
 * layers (num_nextn_predict_layers) are validated and kept as views into the
 * file for later use; the main forward skips them.  Called once at start-up
 * on the main thread.
 */
#include "base/log.h"
#include "base/util.h"
#include "model/deepseek_v4.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAT_DTYPES                                                                                 \
    ((1u << MS_DT_F32) | (1u << MS_DT_BF16) | (1u << MS_DT_F16) | (1u << MS_DT_F8E4M3))
#define VEC_DTYPES ((1u << MS_DT_F32) | (1u << MS_DT_BF16) | (1u << MS_DT_F16))

struct loader {
    ms_model *m;
    ms_errbuf *err;
    int64_t n_params;
};

/* Binds a 2-D weight matrix (and its FP8 block scales) to a view. */
static int load_mat(struct loader *L, ms_mat *out, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int load_mat(struct loader *L, ms_mat *out, int64_t rows, int64_t cols, const char *fmt, ...)
{
    char name[256], sname[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const int64_t shape[2] = {rows, cols};
    const ms_tensor *t;
    int rc = ms_st_expect(L->m->st, name, 2, shape, MAT_DTYPES, &t, L->err);
    if (rc) return rc;
    const float *scale = NULL;
    if (t->dtype == MS_DT_F8E4M3) {
        size_t n = strlen(name);
        if (n < 7 || strcmp(name + n - 7, ".weight") != 0)
            return ms_err(L->err, MS_EFORMAT, "%s: tensor '%s': FP8 tensor without block scales",
                          t->file, name);
        snprintf(sname, sizeof sname, "%s_scale_inv", name);
        const int64_t sshape[2] = {(rows + 127) / 128, (cols + 127) / 128};
        const ms_tensor *s;
        rc = ms_st_expect(L->m->st, sname, 2, sshape, 1u << MS_DT_F32, &s, L->err);
        if (rc) return rc;
        if (((uintptr_t)s->data & 3u) != 0)
            return ms_err(L->err, MS_EFORMAT, "%s: tensor '%s': scales not 4-byte aligned", s->file,
                          sname);
        scale = s->data;
    }
    *out = ms_mat_whole(t->dtype, rows, cols, t->data, scale);
    L->n_params += rows * cols;
    return 0;
}

int ms_model_load_vec(const struct ms_st_store *st, float **out, int64_t n, int64_t *n_params,
                      ms_errbuf *err, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const ms_tensor *t;
    int rc = ms_st_expect(st, name, 1, &n, VEC_DTYPES, &t, err);
    if (rc) return rc;
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return ms_err(err, MS_ENOMEM, "out of memory loading '%s'", name);
    ms_mat view = ms_mat_whole(t->dtype, 1, n, t->data, NULL);
    for (int64_t i = 0; i < n; i++) v[i] = ms_mat_get(&view, 0, i);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            float bad = v[i];
            free(v);
            return ms_err(err, MS_EFORMAT, "%s: tensor '%s': %g at element %lld", t->file, name,
                          (double)bad, (long long)i);
        }
    *out = v;
    if (n_params) *n_params += n;
    return 0;
}

#define load_vec(L, out, n, ...)                                                                   \
    ms_model_load_vec((L)->m->st, out, n, &(L)->n_params, (L)->err, __VA_ARGS__)

static int load_ffn(struct loader *L, ms_ffn_w *f, int64_t inter, const char *prefix)
{
    int64_t D = L->m->cfg.hidden_size;
    int rc = load_mat(L, &f->gate, inter, D, "%s.gate_proj.weight", prefix);
    if (!rc) rc = load_mat(L, &f->up, inter, D, "%s.up_proj.weight", prefix);
    if (!rc) rc = load_mat(L, &f->down, D, inter, "%s.down_proj.weight", prefix);
    return rc;
}

static int load_layer(struct loader *L, ms_layer_w *lw, int layer)
{
    const ms_config *c = &L->m->cfg;
    int64_t D = c->hidden_size, H = c->n_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
            dv = c->v_head_dim, kvr = c->kv_lora_rank;
    char p[96];
    snprintf(p, sizeof p, "model.layers.%d", layer);
    int rc = load_vec(L, &lw->attn_norm, D, "%s.input_layernorm.weight", p);
    if (!rc) rc = load_vec(L, &lw->ffn_norm, D, "%s.post_attention_layernorm.weight", p);
    if (rc) return rc;
    if (c->q_lora_rank > 0) {
        rc = load_mat(L, &lw->q_a, c->q_lora_rank, D, "%s.self_attn.q_a_proj.weight", p);
        if (!rc)
            rc = load_vec(L, &lw->q_a_norm, c->q_lora_rank, "%s.self_attn.q_a_layernorm.weight", p);
        if (!rc)
            rc = load_mat(L, &lw->q_b, H * (dn + dr), c->q_lora_rank,
                          "%s.self_attn.q_b_proj.weight", p);
    } else {
        rc = load_mat(L, &lw->q, H * (dn + dr), D, "%s.self_attn.q_proj.weight", p);
    }
    if (!rc) rc = load_mat(L, &lw->kv_a, kvr + dr, D, "%s.self_attn.kv_a_proj_with_mqa.weight", p);
    if (!rc) rc = load_vec(L, &lw->kv_a_norm, kvr, "%s.self_attn.kv_a_layernorm.weight", p);
    if (!rc) rc = load_mat(L, &lw->kv_b, H * (dn + dv), kvr, "%s.self_attn.kv_b_proj.weight", p);
    if (!rc) rc = load_mat(L, &lw->o, D, H * dv, "%s.self_attn.o_proj.weight", p);
    if (rc) return rc;

    lw->is_moe = ms_config_layer_is_moe(c, layer);
    char q[128];
    if (!lw->is_moe) {
        snprintf(q, sizeof q, "%s.mlp", p);
        return load_ffn(L, &lw->dense, c->intermediate_size, q);
    }
    int E = c->n_routed_experts;
    rc = load_mat(L, &lw->router, E, D, "%s.mlp.gate.weight", p);
    if (rc) return rc;
    char bname[160];
    snprintf(bname, sizeof bname, "%s.mlp.gate.e_score_correction_bias", p);
    if (ms_st_find(L->m->st, bname)) {
        rc = load_vec(L, &lw->e_bias, E, "%s", bname);
        if (rc) return rc;
    }
    lw->experts = calloc((size_t)E, sizeof *lw->experts);
    if (!lw->experts)
        return ms_err(L->err, MS_ENOMEM, "out of memory (experts of layer %d)", layer);
    for (int e = 0; e < E && !rc; e++) {
        snprintf(q, sizeof q, "%s.mlp.experts.%d", p, e);
        rc = load_ffn(L, &lw->experts[e], c->moe_intermediate_size, q);
    }
    if (!rc && c->n_shared_experts > 0) {
        snprintf(q, sizeof q, "%s.mlp.shared_experts", p);
        rc = load_ffn(L, &lw->shared, (int64_t)c->n_shared_experts * c->moe_intermediate_size, q);
    }
    return rc;
}

/* The extras of MTP layer `layer` (its block loads as any layer).  A checkpoint
 * without them still loads: it simply has no draft (ms_model_has_draft). */
static int load_mtp(struct loader *L, ms_mtp_w *w, int layer, int *absent)
{
    int64_t D = L->m->cfg.hidden_size;
    char n[128];
    snprintf(n, sizeof n, "model.layers.%d.eh_proj.weight", layer);
    *absent = ms_st_find(L->m->st, n) == NULL;
    if (*absent) return 0;
    int rc = load_mat(L, &w->eh_proj, D, 2 * D, "%s", n);
    if (!rc) rc = load_vec(L, &w->enorm, D, "model.layers.%d.enorm.weight", layer);
    if (!rc) rc = load_vec(L, &w->hnorm, D, "model.layers.%d.hnorm.weight", layer);
    if (!rc) rc = load_vec(L, &w->head_norm, D, "model.layers.%d.shared_head.norm.weight", layer);
    return rc;
}

static void free_mtp(ms_model *m)
{
    for (int k = 0; m->mtp && k < m->n_mtp_layers; k++) {
        free(m->mtp[k].enorm);
        free(m->mtp[k].hnorm);
        free(m->mtp[k].head_norm);
    }
    free(m->mtp);
    m->mtp = NULL;
    ms_free_aligned((void *)m->draft_head.data);
    free(m->draft_vocab);
    m->draft_vocab = NULL;
}

static void free_layer(ms_layer_w *lw)
{
    free(lw->attn_norm);
    free(lw->ffn_norm);
    free(lw->q_a_norm);
    free(lw->kv_a_norm);
    free(lw->e_bias);
    free(lw->experts);
    free(lw->slots);
}

int ms_model_init_kernels(ms_model *m, const ms_model_opts *opts, ms_errbuf *err)
{
    m->pool = ms_pool_new(opts ? opts->threads : 0);
    if (!m->pool) return ms_err(err, MS_ENOMEM, "cannot start worker threads");
    m->kctx.pool = m->pool;
    m->kctx.exact = opts ? opts->exact : 0;
    m->kctx.batch_invariant = opts ? opts->batch_invariant : 0;
    m->kctx.isa = ms_kernels_detect();
    return 0;
}

static int64_t ffn_bytes(const ms_ffn_w *f)
{
    return ms_mat_bytes(&f->gate) + ms_mat_bytes(&f->up) + ms_mat_bytes(&f->down);
}

/* Bytes of the weights layer l reads on this rank: attention, dense MLP, router,
 * shared expert, and the routed experts it holds (or `topk` of them, all of
 * average size, when topk > 0). */
static int64_t layer_bytes(const ms_model *m, int l, int topk)
{
    const ms_config *c = &m->cfg;
    const ms_layer_w *lw = &m->layers[l];
    int64_t b = ms_mat_bytes(&lw->kv_a) + ms_mat_bytes(&lw->kv_b) + ms_mat_bytes(&lw->o);
    b +=
        c->q_lora_rank > 0 ? ms_mat_bytes(&lw->q_a) + ms_mat_bytes(&lw->q_b) : ms_mat_bytes(&lw->q);
    if (!lw->is_moe) return b + ffn_bytes(&lw->dense);
    b += ms_mat_bytes(&lw->router) + (c->n_shared_experts > 0 ? ffn_bytes(&lw->shared) : 0);
    if (topk > 0) return b + ffn_bytes(&lw->slots[0]) * topk;
    for (int s = 0; s < lw->n_slots; s++) b += ffn_bytes(&lw->slots[s]);
    return b;
}

/* Weight bytes streamed per decoded token: everything but the embedding table
 * and the non-selected experts (top-k of each MoE layer, taken as the average
 * expert size). */
static int64_t active_bytes(const ms_model *m)
{
    const ms_config *c = &m->cfg;
    int64_t b = ms_mat_bytes(&m->lm_head) + m->embed.cols * ms_dtype_size(m->embed.dtype);
    for (int l = 0; l < c->n_layers; l++) b += layer_bytes(m, l, c->n_experts_per_tok);
    return b;
}

/* Narrows the views of one layer to this rank's shard (no copies). */
int ms_model_shard_ffn(ms_ffn_w *f, int parts, int part, const char *what, int layer,
                       ms_errbuf *err)
{
    if (parts <= 1) return 0;
    int64_t inter = f->gate.rows;
    if (inter % parts)
        return ms_err(err, MS_ELAYOUT, "layer %d: %s width %lld is not divisible by %d ranks",
                      layer, what, (long long)inter, parts);
    int64_t n = inter / parts, r0 = (int64_t)part * n;
    if (f->down.dtype == MS_DT_F4E2M1 && n % 2)
        return ms_err(err, MS_ELAYOUT,
                      "layer %d: %s width %lld over %d ranks splits an FP4 byte (odd %lld)", layer,
                      what, (long long)inter, parts, (long long)n);
    f->gate = ms_mat_slice(&f->gate, r0, n, 0, f->gate.cols);
    f->up = ms_mat_slice(&f->up, r0, n, 0, f->up.cols);
    f->down = ms_mat_slice(&f->down, 0, f->down.rows, r0, n);
    return 0;
}

static int shard_layer(ms_model *m, ms_layer_w *lw, int layer, ms_errbuf *err)
{
    const ms_shard *sh = m->shard;
    const ms_config *c = &m->cfg;
    int64_t qd = ms_config_qk_head_dim(c), kvd = c->qk_nope_head_dim + c->v_head_dim,
            dv = c->v_head_dim, h0 = m->head0, nh = m->n_local_heads;
    if (nh != c->n_heads) {
        if (c->q_lora_rank > 0)
            lw->q_b = ms_mat_slice(&lw->q_b, h0 * qd, nh * qd, 0, lw->q_b.cols);
        else
            lw->q = ms_mat_slice(&lw->q, h0 * qd, nh * qd, 0, lw->q.cols);
        lw->kv_b = ms_mat_slice(&lw->kv_b, h0 * kvd, nh * kvd, 0, lw->kv_b.cols);
        lw->o = ms_mat_slice(&lw->o, 0, lw->o.rows, h0 * dv, nh * dv);
    }
    if (!lw->is_moe)
        return ms_model_shard_ffn(&lw->dense, sh->lay->dense_tp, sh->at.dense_rank,
                                  "intermediate_size", layer, err);
    for (int s = 0; s < ms_shard_n_experts(sh, c->n_routed_experts); s++) {
        int rc = ms_model_shard_ffn(&lw->experts[ms_shard_expert(sh, layer, s)], sh->lay->moe_tp,
                                    sh->at.moe_tp_rank, "moe_intermediate_size", layer, err);
        if (rc) return rc;
    }
    if (c->n_shared_experts > 0)
        return ms_model_shard_ffn(&lw->shared, sh->lay->shared_tp, sh->at.shared_rank,
                                  "shared expert", layer, err);
    return 0;
}

int ms_model_ws_new(ms_model *m, ms_errbuf *err);
void ms_model_ws_free(ms_model_ws *ws);

/* Visits every weight view this rank reads (its shard: attention, dense or
 * shared FFN, its experts, the router and the LM head; not the embedding,
 * which is read a row at a time). */
struct plain_fn {
    void (*fn)(ms_mat *, void *);
    void *arg;
};

static void plain_fn(ms_mat *w, unsigned flags, void *arg)
{
    const struct plain_fn *p = arg;
    (void)flags;
    p->fn(w, p->arg);
}

static void each_view(ms_model *m, void (*fn)(ms_mat *, void *), void *arg)
{
    if (m->v4) { /* the V4 family lists its own views */
        struct plain_fn p = {fn, arg};
        ms_v4_each_view(m, plain_fn, &p);
        return;
    }
    const ms_config *c = &m->cfg;
    fn(&m->lm_head, arg);
    for (int l = 0; l < c->n_layers; l++) {
        ms_layer_w *lw = &m->layers[l];
        ms_mat *att[] = {&lw->q_a, &lw->q_b, &lw->q, &lw->kv_a, &lw->kv_b, &lw->o};
        for (size_t i = 0; i < sizeof att / sizeof *att; i++) fn(att[i], arg);
        ms_ffn_w *f[2] = {lw->is_moe ? NULL : &lw->dense,
                          lw->is_moe && c->n_shared_experts > 0 ? &lw->shared : NULL};
        if (lw->is_moe) fn(&lw->router, arg);
        for (int i = 0; i < 2; i++)
            if (f[i]) fn(&f[i]->gate, arg), fn(&f[i]->up, arg), fn(&f[i]->down, arg);
        if (lw->is_moe) /* each physical slot (expert_slots.c): its own copy */
            for (int s = 0; s < lw->n_slots; s++) {
                ms_ffn_w *x = &lw->slots[s];
                fn(&x->gate, arg), fn(&x->up, arg), fn(&x->down, arg);
            }
    }
}

/* Faults in the page-table entries of one weight view now (MADV_POPULATE_READ,
 * or one read per page where the kernel lacks it), so the first tokens do not
 * pay a page fault per 4 KiB of weights. */
static void prefault(ms_mat *w, void *arg)
{
    (void)arg;
    if (!w->data || w->rows <= 0) return;
    uintptr_t a = (uintptr_t)w->data & ~(uintptr_t)4095;
    uintptr_t b =
        (uintptr_t)w->data + (size_t)ms_dtype_bytes(w->dtype, (w->rows - 1) * w->ld + w->cols);
    if (madvise((void *)a, b - a, MADV_POPULATE_READ) == 0) return;
    volatile unsigned char sink = 0;
    for (uintptr_t p = a; p < b; p += 4096)
        sink ^= *(const volatile unsigned char *)(p < (uintptr_t)w->data ? (uintptr_t)w->data : p);
    (void)sink;
}

/* Weight placement.  By default this rank's views are copied out of the file
 * mapping into one anonymous arena backed by 2 MiB pages (MADV_HUGEPAGE), each
 * view compacted to ld = cols (a TP column slice keeps only its columns), with
 * its FP8 block scales (still found through r0/c0), and the (untied)
 * embedding too.  Why: decode streams many expert matrices from scattered
 * places, and 4 KiB file pages stop the TLB and the hardware prefetcher every
 * 4 KiB (measured: bench/RESULTS.md, "Why the code is so").  MOESERVE_WEIGHTS=mmap keeps the views
 * in the file mapping (shared page cache, no copy), faulted in. */
struct place {
    char *base;
    size_t used, cap;
    ms_pool *pool;     /* check_view's threads */
    const ms_mat *bad; /* the first view met with a NaN or infinity, NULL: none */
    int64_t bad_at;    /* its element, row-major in the view; -1 - k: element k of its scales */
};

/* The NaN/infinity check (a checkpoint with one such weight loaded and
 * answered every request with token 0).  It costs no extra pass where the
 * load reads every byte anyway: the copy checks each piece it has just
 * written, while it is in cache.  Read from the file mapping, the views are
 * read once more on the pool (check_view), unless MOESERVE_WEIGHTS=
 * mmap-nocheck says not to.  The MTP layers, which the forward does not
 * read, are not checked. */
static void note_bad(struct place *p, const ms_mat *w, int64_t at)
{
    if (!p->bad) p->bad = w, p->bad_at = at;
}

/* memcpy in pieces of 256 KiB, each checked just after it is written. */
static void copy_checked(struct place *p, const ms_mat *w, char *dst, const char *src, size_t bytes,
                         ms_dtype dt, int64_t first, int scale)
{
    size_t esz = ms_dtype_size(dt) ? (size_t)ms_dtype_size(dt) : 1, /* FP4: bytes, no NaN codes */
        piece = ((size_t)256 << 10) / esz * esz;
    for (size_t o = 0; o < bytes; o += piece) {
        size_t n = bytes - o < piece ? bytes - o : piece;
        memcpy(dst + o, src + o, n);
        int64_t i = ms_dtype_find_nonfinite(dt, dst + o, (int64_t)(n / esz));
        if (i >= 0) {
            int64_t at = first + (int64_t)(o / esz) + i;
            note_bad(p, w, scale ? -1 - at : at);
            return;
        }
    }
}

size_t ms_model_view_bytes(const ms_mat *w)
{
    if (!w->data || w->rows <= 0 || w->cols <= 0) return 0;
    return ((size_t)ms_dtype_bytes(w->dtype, w->rows * w->cols) + 63) & ~(size_t)63;
}

/* FP4 views' UE8M0 scale bytes: the view's own [rows][cols / 32] when it
 * starts on a 32-column block (compacted; every V4 expert view and TP slice
 * does), else its rows' whole stored scale rows.  The loader has refused a
 * 255 (NaN) byte naming the tensor (ms_load_fp4_mat); FP4 codes have no NaN. */
static size_t fp4_scale_bytes(const ms_mat *w)
{
    if (w->dtype != MS_DT_F4E2M1 || !ms_model_view_bytes(w)) return 0;
    int64_t per_row = w->c0 % 32 ? w->scale_ld : (w->cols + 31) / 32;
    return (size_t)(w->rows * per_row);
}

/* FP8 block scales up to the view's last row block (indexed through r0/c0
 * as in the file: the blocks above r0 are copied too). */
size_t ms_model_scale_bytes(const ms_mat *w)
{
    if (w->dtype != MS_DT_F8E4M3 || !w->scale || !ms_model_view_bytes(w)) return 0;
    return (size_t)((w->r0 + w->rows - 1) / 128 + 1) * (size_t)w->scale_ld * sizeof(float);
}

static void place_count(ms_mat *w, void *arg)
{
    ((struct place *)arg)->cap += ms_model_view_bytes(w) +
                                  ((ms_model_scale_bytes(w) + 63) & ~(size_t)63) +
                                  ((fp4_scale_bytes(w) + 63) & ~(size_t)63);
}

static void place_copy(ms_mat *w, void *arg)
{
    struct place *p = arg;
    size_t n = ms_model_view_bytes(w), row = (size_t)ms_dtype_bytes(w->dtype, w->cols);
    if (!n || p->used + n > p->cap) return;
    char *dst = p->base + p->used;
    const char *src = w->data;
    if (w->ld == w->cols)
        copy_checked(p, w, dst, src, (size_t)w->rows * row, w->dtype, 0, 0);
    else
        for (int64_t r = 0; r < w->rows; r++)
            copy_checked(p, w, dst + r * row, src + (size_t)ms_dtype_bytes(w->dtype, r * w->ld),
                         row, w->dtype, r * w->cols, 0);
    w->data = dst;
    w->ld = w->cols;
    p->used += n;
    size_t fb = fp4_scale_bytes(w);
    if (fb && p->used + ((fb + 63) & ~(size_t)63) <= p->cap) {
        /* the view's scale rows, re-based so that the copy is the stored matrix */
        int64_t per_row = (int64_t)fb / w->rows, c_first = w->c0 % 32 ? 0 : w->c0 / 32;
        uint8_t *sd = (uint8_t *)p->base + p->used;
        for (int64_t r = 0; r < w->rows; r++)
            memcpy(sd + r * per_row, w->e8scale + (w->r0 + r) * w->scale_ld + c_first,
                   (size_t)per_row);
        w->e8scale = sd;
        w->scale_ld = per_row;
        w->r0 = 0;
        if (!(w->c0 % 32)) w->c0 = 0;
        p->used += (fb + 63) & ~(size_t)63;
    }
    size_t sb = ms_model_scale_bytes(w), sb64 = (sb + 63) & ~(size_t)63;
    if (sb && p->used + sb64 <= p->cap) {
        copy_checked(p, w, p->base + p->used, (const char *)w->scale, sb, MS_DT_F32, 0, 1);
        w->scale = (const float *)(p->base + p->used);
        p->used += sb64;
    }
}

/* The stored name of the tensor behind view w. */
static void view_name(const ms_model *m, const ms_mat *w, char *buf, size_t cap)
{
    static const char *const att_names[] = {"q_a_proj",           "q_b_proj",  "q_proj",
                                            "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
    static const char *const ffn_names[] = {"gate_proj", "up_proj", "down_proj"};
    snprintf(buf, cap, "%s",
             w == &m->lm_head && m->lm_head.data != m->embed.data ? "lm_head.weight"
                                                                  : "model.embed_tokens.weight");
    if (w == &m->lm_head || w == &m->embed) return;
    const ms_config *c = &m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        ms_layer_w *lw = &m->layers[l];
        const ms_mat *att[] = {&lw->q_a, &lw->q_b, &lw->q, &lw->kv_a, &lw->kv_b, &lw->o};
        for (int i = 0; i < 6; i++)
            if (w == att[i]) {
                snprintf(buf, cap, "model.layers.%d.self_attn.%s.weight", l, att_names[i]);
                return;
            }
        if (w == &lw->router) {
            snprintf(buf, cap, "model.layers.%d.mlp.gate.weight", l);
            return;
        }
        for (int s = -2; s < (lw->is_moe ? lw->n_slots : 0); s++) {
            int e = s < 0 ? s : ms_shard_expert(m->shard, l, s);
            const ms_ffn_w *f = s == -2 ? &lw->dense : s == -1 ? &lw->shared : &lw->slots[s];
            const ms_mat *fm[] = {&f->gate, &f->up, &f->down};
            for (int i = 0; i < 3; i++) {
                if (w != fm[i]) continue;
                if (e >= 0)
                    snprintf(buf, cap, "model.layers.%d.mlp.experts.%d.%s.weight", l, e,
                             ffn_names[i]);
                else
                    snprintf(buf, cap, "model.layers.%d.mlp.%s%s.weight", l,
                             e == -1 ? "shared_experts." : "", ffn_names[i]);
                return;
            }
        }
    }
}

/* The error for element `at` of view w (place.bad_at's encoding), naming the
 * file, the tensor and the stored row and column. */
static int bad_weight(const ms_model *m, const ms_mat *w, int64_t at, ms_errbuf *err)
{
    char name[240];
    view_name(m, w, name, sizeof name - 16);
    if (at < 0) {
        int64_t k = -1 - at;
        strcat(name, "_scale_inv");
        const ms_tensor *t = ms_st_find(m->st, name);
        float v;
        memcpy(&v, w->scale + k, sizeof v);
        return ms_err(err, MS_EFORMAT, "%s: tensor '%s': %g at row %lld, column %lld",
                      t ? t->file : "?", name, (double)v, (long long)(k / w->scale_ld),
                      (long long)(k % w->scale_ld));
    }
    const ms_tensor *t = ms_st_find(m->st, name);
    int64_t r = at / w->cols, c = at % w->cols;
    return ms_err(err, MS_EFORMAT, "%s: tensor '%s': %g at row %lld, column %lld",
                  t ? t->file : "?", name, (double)ms_mat_get(w, r, c), (long long)(w->r0 + r),
                  (long long)(w->c0 + c));
}

/* The check of views left in the file mapping: one read, rows shared by the
 * pool's threads, the first bad element kept (smallest index). */
struct check_job {
    const ms_mat *w;
    _Atomic int64_t first; /* INT64_MAX: none */
};

static void check_rows(void *arg, int tid, int nt)
{
    struct check_job *j = arg;
    const ms_mat *w = j->w;
    int64_t b, e;
    ms_pool_range(w->rows, tid, nt, 1, &b, &e);
    for (int64_t r = b; r < e; r++) {
        int64_t i = ms_dtype_find_nonfinite(
            w->dtype, (const char *)w->data + ms_dtype_bytes(w->dtype, r * w->ld), w->cols);
        if (i < 0) continue;
        int64_t at = r * w->cols + i, cur = atomic_load(&j->first);
        while (at < cur && !atomic_compare_exchange_weak(&j->first, &cur, at)) {
        }
        return;
    }
}

static void check_view(ms_mat *w, void *arg)
{
    struct place *p = arg;
    if (!ms_model_view_bytes(w) || p->bad) return;
    struct check_job j = {w, INT64_MAX};
    ms_pool_run(p->pool, check_rows, &j);
    if (j.first != INT64_MAX) note_bad(p, w, j.first);
    size_t sb = ms_model_scale_bytes(w);
    int64_t k = sb ? ms_dtype_find_nonfinite(MS_DT_F32, w->scale, (int64_t)(sb / 4)) : -1;
    if (k >= 0) note_bad(p, w, -1 - k);
}

static int place_weights(ms_model *m, ms_errbuf *err)
{
    const char *mode = getenv("MOESERVE_WEIGHTS");
    int tied = m->lm_head.data == m->embed.data;
    int nocheck = mode && !strcmp(mode, "mmap-nocheck");
    if (!(mode && (!strcmp(mode, "mmap") || nocheck))) {
        struct place p = {0};
        each_view(m, place_count, &p);
        if (!tied) place_count(&m->embed, &p);
        size_t huge = (size_t)2 << 20, len = (p.cap + huge - 1) & ~(huge - 1);
        char *raw =
            len ? mmap(NULL, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                : MAP_FAILED;
        if (raw != MAP_FAILED) {
            char *base = (char *)(((uintptr_t)raw + huge - 1) & ~(huge - 1));
            if (base > raw) munmap(raw, (size_t)(base - raw));
            if (base + len < raw + len + huge)
                munmap(base + len, (size_t)(raw + len + huge - (base + len)));
            (void)madvise(base, len, MADV_HUGEPAGE); /* best effort: 4 KiB pages otherwise */
            p.base = base;
            each_view(m, place_copy, &p);
            if (tied)
                m->embed = m->lm_head;
            else
                place_copy(&m->embed, &p);
            (void)mprotect(base, len, PROT_READ);
            m->arena = base;
            m->arena_bytes = len;
            if (p.bad) return bad_weight(m, p.bad, p.bad_at, err);
            MS_LOG(MS_INFO, "model", "weights: %.1f MB copied into 2 MiB pages (checked finite)",
                   (double)p.used / 1e6);
            return 0;
        }
        MS_LOG(MS_WARN, "model", "weights: no memory for a %.1f MB copy; reading the file mapping",
               (double)p.cap / 1e6);
    }
    each_view(m, prefault, NULL);
    if (!tied) prefault(&m->embed, NULL);
    if (nocheck) {
        MS_LOG(MS_WARN, "model",
               "weights: not checked for NaN or infinity (MOESERVE_WEIGHTS=mmap-nocheck)");
        return 0;
    }
    struct place p = {.pool = m->pool};
    each_view(m, check_view, &p);
    if (!tied) check_view(&m->embed, &p);
    return p.bad ? bad_weight(m, p.bad, p.bad_at, err) : 0;
}

/* Row classes of the FP8 views (ms_mat.f8_plain, MS_F8_ROW_*), one byte per
 * row in one block the model owns, for the kernels that convert FP8 codes
 * without tables: the auto-mode AVX-512 ones (mm_widen.c, and mm_bf16.c's
 * GEMV and tiles) on rows without a zero, subnormal or NaN code, the FP32
 * tiles (mm_f32_tmpl.h, AVX2 and AVX-512) on rows without a NaN code; faster
 * than the table lookups alone (measured: bench/RESULTS.md, "Why the code is
 * so"; bench/HISTORY.md, "The AVX2 paths").  The scan reads every FP8 byte
 * once, so the pool's threads share each view's rows. */
struct plainer {
    uint8_t *buf;
    size_t used, cap;
    ms_pool *pool;
};

struct scan_job {
    const ms_mat *w;
    uint8_t *out;
};

static void scan_rows(void *arg, int tid, int nt)
{
    const struct scan_job *j = arg;
    int64_t b, e;
    ms_pool_range(j->w->rows, tid, nt, 1, &b, &e);
    if (b >= e) return;
    ms_mat part = *j->w;
    part.rows = e - b;
    part.data = (const uint8_t *)j->w->data + b * j->w->ld;
    ms_mat_f8_scan(&part, j->out + b);
}

static void plain_count(ms_mat *w, void *arg)
{
    if (w->dtype == MS_DT_F8E4M3 && w->data && w->rows > 0)
        ((struct plainer *)arg)->cap += (size_t)w->rows;
}

static void plain_scan(ms_mat *w, void *arg)
{
    struct plainer *p = arg;
    if (w->dtype != MS_DT_F8E4M3 || !w->data || w->rows <= 0 || p->used + (size_t)w->rows > p->cap)
        return;
    struct scan_job j = {w, p->buf + p->used};
    ms_pool_run(p->pool, scan_rows, &j);
    w->f8_plain = p->buf + p->used;
    w->f8_plain_r0 = w->r0;
    p->used += (size_t)w->rows;
}

static void mark_plain_rows(ms_model *m)
{
    if (!ms_kernels_f8_plain_used(&m->kctx)) return; /* no kernel here reads them */
    struct plainer p = {.pool = m->pool};
    double t0 = ms_now_s();
    each_view(m, plain_count, &p);
    if (!p.cap || !(p.buf = malloc(p.cap))) return; /* without them: the tables, same results */
    each_view(m, plain_scan, &p);
    m->f8_plain = p.buf;
    /* moe.c reads the experts through lw->experts[], copies of the slots
     * bound before this scan: bind them again, so they carry the flags */
    for (int l = 0; !m->v4 && l < m->cfg.n_layers + m->cfg.num_nextn_predict_layers; l++)
        ms_model_expert_slots_bind(m, l);
    size_t n = 0;
    for (size_t i = 0; i < p.used; i++) n += p.buf[i];
    MS_LOG(MS_DEBUG, "model", "FP8: %zu of %zu rows plain (scanned in %.3f s)", n, p.used,
           ms_now_s() - t0);
}

struct view_adapter {
    ms_model *m;
    ms_view_fn fn;
    void *arg;
};

static void adapt_view(ms_mat *w, void *arg)
{
    struct view_adapter *a = arg;
    a->fn(w, w == &a->m->lm_head ? MS_VIEW_LM_HEAD : 0, a->arg);
}

void ms_dsv3_each_view(ms_model *m, ms_view_fn fn, void *arg)
{
    struct view_adapter a = {m, fn, arg};
    each_view(m, adapt_view, &a);
}

int64_t ms_model_local_weight_bytes(const ms_model *m)
{
    if (m->v4) return ms_v4_local_weight_bytes(m);
    const ms_config *c = &m->cfg;
    int64_t b = ms_mat_bytes(&m->embed) +
                (m->lm_head.data != m->embed.data ? ms_mat_bytes(&m->lm_head) : 0);
    for (int l = 0; l < c->n_layers; l++) b += layer_bytes(m, l, 0);
    return b;
}

int ms_model_place(ms_model *m, ms_errbuf *err)
{
    double t_pf = ms_now_s();
    int rc = place_weights(m, err);
    if (rc) return rc;
    mark_plain_rows(m);
    MS_LOG(MS_DEBUG, "model", "weights placed in %.2f s", ms_now_s() - t_pf);
    return 0;
}

int ms_dsv3_open(ms_model **out, const char *dir, const ms_model_opts *opts, ms_errbuf *err)
{
    *out = NULL;
    ms_model *m = calloc(1, sizeof *m);
    if (!m) return ms_err(err, MS_ENOMEM, "out of memory");
    snprintf(m->path, sizeof m->path, "%s", dir);
    char path[1200];
    int rc;
    if (!ms_path_join(path, sizeof path, dir, "config.json")) {
        rc = ms_err(err, MS_EINVAL, "model path too long: %s", dir);
        goto fail;
    }
    rc = ms_config_load(&m->cfg, path, err);
    if (rc) goto fail;
    m->family = &ms_family_deepseek_v3;
    ms_dsv3_parse_config(&m->cfg, &m->shape);
    m->shape.family = m->family;
    rc = ms_st_open_dir(&m->st, dir, err);
    if (rc) goto fail;

    const ms_config *c = &m->cfg;
    struct loader L = {m, err, 0};
    rc = load_mat(&L, &m->embed, c->vocab_size, c->hidden_size, "model.embed_tokens.weight");
    if (rc) goto fail;
    if (ms_st_find(m->st, "lm_head.weight") || !c->tie_word_embeddings)
        rc = load_mat(&L, &m->lm_head, c->vocab_size, c->hidden_size, "lm_head.weight");
    else
        m->lm_head = m->embed;
    if (!rc) rc = load_vec(&L, &m->final_norm, c->hidden_size, "model.norm.weight");
    if (rc) goto fail;
    if (m->embed.dtype == MS_DT_F8E4M3) {
        rc = ms_err(err, MS_EUNSUPPORTED, "model.embed_tokens.weight: FP8 embeddings unsupported");
        goto fail;
    }
    m->shard = opts ? opts->shard : NULL;
    m->n_local_heads = c->n_heads;
    if (m->shard && m->shard->lay->attn_tp > 1) {
        if (c->n_heads % m->shard->lay->attn_tp) {
            rc = ms_err(err, MS_ELAYOUT, "%d attention heads are not divisible by attention TP %d",
                        c->n_heads, m->shard->lay->attn_tp);
            goto fail;
        }
        m->n_local_heads = c->n_heads / m->shard->lay->attn_tp;
        m->head0 = m->shard->at.attn_tp_rank * m->n_local_heads;
    }
    int n_total = c->n_layers + c->num_nextn_predict_layers;
    m->layers = calloc((size_t)n_total, sizeof *m->layers);
    if (!m->layers) {
        rc = ms_err(err, MS_ENOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < n_total; l++) {
        int64_t before = L.n_params;
        rc = load_layer(&L, &m->layers[l], l);
        if (!rc && m->shard) rc = shard_layer(m, &m->layers[l], l, err);
        if (!rc && m->layers[l].is_moe) rc = ms_dsv3_slots_init(m, &m->layers[l], l, err);
        if (rc) goto fail;
        if (l >= c->n_layers) L.n_params = before; /* MTP layers: not part of the main stack */
    }
    m->n_mtp_layers = c->num_nextn_predict_layers;
    if (m->n_mtp_layers > 0) {
        int64_t before = L.n_params;
        int absent = 0;
        m->mtp = calloc((size_t)m->n_mtp_layers, sizeof *m->mtp);
        if (!m->mtp) {
            rc = ms_err(err, MS_ENOMEM, "out of memory");
            goto fail;
        }
        for (int k = 0; k < m->n_mtp_layers && !absent; k++)
            if ((rc = load_mtp(&L, &m->mtp[k], c->n_layers + k, &absent))) goto fail;
        if (absent) free_mtp(m);
        L.n_params = before;
    }
    m->n_params = L.n_params;
    m->active_bytes_per_token = active_bytes(m);

    m->rope_inv_freq = malloc(sizeof(float) * (size_t)(c->qk_rope_head_dim / 2 + 1));
    if (!m->rope_inv_freq) {
        rc = ms_err(err, MS_ENOMEM, "out of memory");
        goto fail;
    }
    ms_config_rope_inv_freq(c, m->rope_inv_freq);
    m->softmax_scale = ms_config_softmax_scale(c);
    if ((rc = ms_model_init_kernels(m, opts, err))) goto fail;
    rc = ms_model_ws_new(m, err);
    if (rc) goto fail;
    double t_pf = ms_now_s();
    rc = place_weights(m, err);
    if (rc) goto fail;
    ms_dsv3_slots_place(m);
    mark_plain_rows(m);
    MS_LOG(MS_DEBUG, "model", "weights placed in %.2f s", ms_now_s() - t_pf);
    MS_LOG(MS_INFO, "model",
           "loaded %s: %d layers (+%d MTP), %lld params, %.1f MB active per token, isa %s, "
           "%d threads, %s activations%s",
           dir, c->n_layers, m->n_mtp_layers, (long long)m->n_params,
           (double)m->active_bytes_per_token / 1e6, ms_isa_name(m->kctx.isa), ms_pool_size(m->pool),
           m->kctx.exact ? "fp32" : "auto",
           m->kctx.batch_invariant ? ", batch-invariant products" : "");
    *out = m;
    return 0;
fail:
    ms_dsv3_free(m);
    return rc;
}

void ms_dsv3_free(ms_model *m)
{
    if (!m) return;
    ms_model_profile_print();
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers + m->cfg.num_nextn_predict_layers; l++)
            free_layer(&m->layers[l]);
    free(m->layers);
    free_mtp(m);
    free(m->final_norm);
    free(m->rope_inv_freq);
    ms_model_ws_free(m->ws);
    ms_pool_free(m->pool);
    if (m->arena) munmap(m->arena, m->arena_bytes);
    free(m->f8_plain);
    ms_st_close(m->st);
    free(m);
}
