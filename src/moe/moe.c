/* moe.c — gate routing and single-rank expert compute (moe.h). */
#include "moe/moe.h"

#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* scores[E] from the router logits by the config's scoring function. */
static void gate_scores(const ms_config *c, const float *logits, float *scores)
{
    int E = c->n_routed_experts;
    memcpy(scores, logits, sizeof(float) * (size_t)E);
    if (c->scoring_func == MS_SCORE_SIGMOID)
        for (int e = 0; e < E; e++) scores[e] = 1.0f / (1.0f + expf(-scores[e]));
    else if (c->scoring_func == MS_SCORE_SQRTSOFTPLUS) /* softplus as torch: x above 20 is x */
        for (int e = 0; e < E; e++)
            scores[e] = sqrtf(scores[e] > 20.0f ? scores[e] : log1pf(expf(scores[e])));
    else
        ms_softmax(scores, E);
}

/* weight[j] = scores[idx[j]], renormalised (norm_topk_prob) and scaled. */
static void gate_weights(const ms_config *c, const float *scores, const int32_t *idx, float *weight)
{
    int K = c->n_experts_per_tok;
    float sum = 0;
    for (int j = 0; j < K; j++) {
        weight[j] = scores[idx[j]];
        sum += weight[j];
    }
    if (c->norm_topk_prob && K > 1)
        for (int j = 0; j < K; j++) weight[j] /= sum;
    for (int j = 0; j < K; j++) weight[j] *= c->routed_scaling_factor;
}

void ms_moe_gate_route_fixed(const ms_config *c, const float *logits, const int32_t *fixed,
                             int32_t *idx, float *weight, float *scratch)
{
    gate_scores(c, logits, scratch);
    memcpy(idx, fixed, sizeof(int32_t) * (size_t)c->n_experts_per_tok);
    gate_weights(c, scratch, idx, weight);
}

void ms_swiglu(float *out, float *g, float *u, int64_t n, float limit)
{
    if (limit > 0)
        for (int64_t i = 0; i < n; i++) { /* NaN-free operands: plain compares vectorise */
            g[i] = g[i] < limit ? g[i] : limit;
            u[i] = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
        }
    ms_silu_mul(out, g, u, n);
}

void ms_moe_gate_route(const ms_config *c, const float *logits, const float *bias, int32_t *idx,
                       float *weight, float *scratch)
{
    int E = c->n_routed_experts, K = c->n_experts_per_tok;
    float *scores = scratch, *sel = scratch + E;
    gate_scores(c, logits, scores);
    for (int e = 0; e < E; e++) sel[e] = bias ? scores[e] + bias[e] : scores[e];
    int G = c->n_group;
    if (G > 1 && c->topk_method != MS_TOPK_GREEDY) {
        int per = E / G;
        float gscore[64];
        for (int g = 0; g < G; g++) {
            const float *s = sel + g * per;
            if (bias) { /* sum of the top-2 biased scores */
                float a = -INFINITY, b = -INFINITY;
                for (int i = 0; i < per; i++) {
                    if (s[i] > a) {
                        b = a;
                        a = s[i];
                    } else if (s[i] > b) {
                        b = s[i];
                    }
                }
                gscore[g] = per >= 2 ? a + b : a;
            } else {
                float a = -INFINITY;
                for (int i = 0; i < per; i++) a = s[i] > a ? s[i] : a;
                gscore[g] = a;
            }
        }
        int32_t keep[64];
        ms_topk(gscore, G, c->topk_group, keep);
        for (int g = 0; g < G; g++) {
            int kept = 0;
            for (int j = 0; j < c->topk_group; j++) kept |= keep[j] == g;
            if (!kept)
                for (int i = 0; i < per; i++) sel[g * per + i] = -INFINITY;
        }
    }
    ms_topk(sel, E, K, idx);
    gate_weights(c, scores, idx, weight);
}

void ms_moe_ws_free(ms_moe_ws *ws)
{
    if (!ws) return;
    free(ws->logits);
    free(ws->topk_idx);
    free(ws->topk_w);
    free(ws->count);
    free(ws->offset);
    free(ws->row_token);
    free(ws->row_weight);
    ms_free_aligned(ws->xg);
    ms_free_aligned(ws->g);
    ms_free_aligned(ws->u);
    ms_free_aligned(ws->yg);
    free(ws->scratch);
    memset(ws, 0, sizeof *ws);
}

/* ---- row-parallel helpers: the per-row work between the expert GEMMs ----
 * From PAR_MIN_ROWS rows of work, [0, n) is split over the pool in equal
 * static ranges of `align` items: below it the loops (a few µs) cost less
 * than a hand-off, which is ~1.5 µs quiet but a scheduler slice when the
 * cores are shared (bench/RESULTS.md, "Speculative decoding").  Each item is
 * computed the same way on any thread. */
enum { PAR_MIN_ROWS = 64 };

struct par {
    void (*fn)(void *arg, int64_t begin, int64_t end, int tid);
    void *arg;
    int64_t n, align;
};

static void par_job(void *a, int tid, int nt)
{
    struct par *p = a;
    int64_t b, e;
    ms_pool_range(p->n, tid, nt, p->align, &b, &e);
    if (b < e) p->fn(p->arg, b, e, tid);
}

static void par_for(const ms_kctx *k, int64_t rows, int64_t n, int64_t align,
                    void (*fn)(void *, int64_t, int64_t, int), void *arg)
{
    if (n <= 0) return;
    if (!k || ms_pool_size(k->pool) == 1 || rows < PAR_MIN_ROWS) {
        fn(arg, 0, n, 0);
        return;
    }
    struct par p = {fn, arg, n, align};
    ms_pool_run(k->pool, par_job, &p);
}

static int ws_reserve(ms_moe_ws *ws, int64_t T, int64_t D, int64_t inter, int64_t E, int64_t K)
{
    if (T <= ws->cap_rows && D <= ws->cap_D && inter <= ws->cap_inter && E <= ws->cap_E &&
        K <= ws->cap_k)
        return 0;
    T = MS_MAX(MS_MAX(T, 2 * ws->cap_rows), 16);
    D = MS_MAX(D, ws->cap_D);
    inter = MS_MAX(inter, ws->cap_inter);
    E = MS_MAX(E, ws->cap_E);
    K = MS_MAX(K, ws->cap_k);
    ms_moe_ws_free(ws);
    size_t rows = (size_t)(T * K);
    ws->logits = malloc(sizeof(float) * (size_t)(T * E));
    ws->topk_idx = malloc(sizeof(int32_t) * rows);
    ws->topk_w = malloc(sizeof(float) * rows);
    ws->count = malloc(sizeof(int32_t) * (size_t)E);
    ws->offset = malloc(sizeof(int32_t) * (size_t)(E + 1));
    ws->row_token = malloc(sizeof(int32_t) * rows);
    ws->row_weight = malloc(sizeof(float) * rows);
    ws->xg = ms_alloc_aligned(rows * (size_t)D, sizeof(float));
    ws->g = ms_alloc_aligned((rows + (size_t)T) * (size_t)inter, sizeof(float));
    ws->u = ms_alloc_aligned((rows + (size_t)T) * (size_t)inter, sizeof(float));
    ws->yg = ms_alloc_aligned(rows * (size_t)D, sizeof(float));
    if (!ws->logits || !ws->topk_idx || !ws->topk_w || !ws->count || !ws->offset ||
        !ws->row_token || !ws->row_weight || !ws->xg || !ws->g || !ws->u || !ws->yg) {
        ms_moe_ws_free(ws);
        return MS_ENOMEM;
    }
    ws->cap_rows = T;
    ws->cap_grp = T * K;
    ws->cap_D = D;
    ws->cap_inter = inter;
    ws->cap_E = E;
    ws->cap_k = K;
    return 0;
}

static int64_t shared_width(const ms_moe_w *mw)
{
    return mw->shared ? mw->shared->gate.rows : 0;
}

void ms_ffn_forward(const ms_kctx *k, const ms_ffn_w *f, const float *x, int64_t M, int64_t D,
                    float *y, int accumulate, float *g, float *u, float limit)
{
    int64_t inter = f->gate.rows;
    if (M <= 0) return;
    ms_matmul(k, g, inter, x, D, M, &f->gate, 0);
    ms_matmul(k, u, inter, x, D, M, &f->up, 0);
    ms_swiglu(g, g, u, M * inter, limit);
    ms_matmul(k, y, D, g, inter, M, &f->down, accumulate);
}

struct route_job {
    const ms_config *c;
    const ms_moe_w *mw;
    ms_moe_ws *ws;
};

static void route_rows(void *arg, int64_t t0, int64_t t1, int tid)
{
    struct route_job *j = arg;
    int64_t E = j->c->n_routed_experts, K = j->c->n_experts_per_tok;
    const ms_moe_w *mw = j->mw;
    for (int64_t t = t0; t < t1; t++)
        if (mw->tid2eid)
            ms_moe_gate_route_fixed(j->c, j->ws->logits + t * E,
                                    mw->tid2eid + (int64_t)mw->tokens[t] * K,
                                    j->ws->topk_idx + t * K, j->ws->topk_w + t * K,
                                    j->ws->scratch + (int64_t)tid * 2 * E);
        else
            ms_moe_gate_route(j->c, j->ws->logits + t * E, mw->e_bias, j->ws->topk_idx + t * K,
                              j->ws->topk_w + t * K, j->ws->scratch + (int64_t)tid * 2 * E);
}

int ms_moe_route(const ms_kctx *k, const ms_config *c, const ms_moe_w *mw, const float *x,
                 int64_t T, ms_moe_ws *ws)
{
    int64_t D = c->hidden_size, E = c->n_routed_experts, K = c->n_experts_per_tok;
    if (ws_reserve(ws, T, D, MS_MAX(c->moe_intermediate_size, shared_width(mw)), E, K))
        return MS_ENOMEM;
    if (T <= 0) return 0;
    int nt = k ? ms_pool_size(k->pool) : 1;
    if (ms_grow_array((void **)&ws->scratch, &ws->cap_scratch, 2 * E * nt, sizeof(float)))
        return MS_ENOMEM;
    ms_matmul(k, ws->logits, E, x, D, T, mw->router, 0);
    struct route_job j = {c, mw, ws};
    par_for(k, T, T, 1, route_rows, &j);
    return 0;
}

/* The per-row loops of ms_moe_experts_shared (run through par_for). */
struct rows_job {
    ms_moe_ws *ws;
    const float *x;
    float *y;
    int64_t D, ld, rows; /* ld: row stride of g/u; rows: routed rows (the shared FFN's follow) */
    int64_t ew, sw;      /* SwiGLU widths: routed experts (local slice), shared FFN */
    float limit;         /* swiglu_limit (0: none) */
};

static void gather_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    struct rows_job *j = arg;
    (void)tid;
    for (int64_t r = r0; r < r1; r++)
        memcpy(j->ws->xg + r * j->D, j->x + (int64_t)j->ws->row_token[r] * j->D,
               sizeof(float) * (size_t)j->D);
}

static void silu_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    struct rows_job *j = arg;
    (void)tid;
    for (int64_t r = r0; r < r1; r++)
        ms_swiglu(j->ws->g + r * j->ld, j->ws->g + r * j->ld, j->ws->u + r * j->ld,
                  r < j->rows ? j->ew : j->sw, j->limit);
}

/* Columns [d0, d1) of every token's sum: rows in order, so each token adds
 * its experts in id order (rows are expert-major), whichever thread runs. */
static void combine_cols(void *arg, int64_t d0, int64_t d1, int tid)
{
    struct rows_job *j = arg;
    const ms_moe_ws *ws = j->ws;
    (void)tid;
    for (int64_t r = 0; r < j->rows; r++)
        ms_axpy_f32(j->y + (int64_t)ws->row_token[r] * j->D + d0, ws->row_weight[r],
                    ws->yg + r * j->D + d0, d1 - d0);
}

int ms_moe_experts_shared(const ms_kctx *k, const ms_config *c, const ms_moe_w *mw, const float *x,
                          int64_t T, const int32_t *idx, const float *w, int e_begin, int e_end,
                          const ms_ffn_w *shared, float *y, int accumulate, ms_moe_ws *ws)
{
    int64_t D = c->hidden_size, E = c->n_routed_experts, K = c->n_experts_per_tok;
    if (ws_reserve(ws, T, D, MS_MAX(c->moe_intermediate_size, shared_width(mw)), E, K))
        return MS_ENOMEM;
    if (T <= 0) return 0;
    int64_t ld = ws->cap_inter; /* row stride of the g/u scratch */
    /* group rows by expert (counting sort keeps token order within an expert) */
    memset(ws->count, 0, sizeof(int32_t) * (size_t)E);
    for (int64_t i = 0; i < T * K; i++)
        if (idx[i] >= e_begin && idx[i] < e_end) ws->count[idx[i]]++;
    ws->offset[0] = 0;
    for (int64_t e = 0; e < E; e++) ws->offset[e + 1] = ws->offset[e] + ws->count[e];
    memset(ws->count, 0, sizeof(int32_t) * (size_t)E);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < K; j++) {
            int32_t e = idx[t * K + j];
            if (e < e_begin || e >= e_end) continue;
            int32_t r = ws->offset[e] + ws->count[e]++;
            ws->row_token[r] = (int32_t)t;
            ws->row_weight[r] = w[t * K + j];
        }
    int64_t rows = ws->offset[E], sh_row = rows; /* the shared FFN's scratch rows follow */
    int64_t ew = 0; /* local (TP) width: that of the experts this call runs */
    for (int64_t e = e_begin; e < e_end && !ew; e++)
        if (ws->offset[e + 1] > ws->offset[e]) ew = mw->experts[e].gate.rows;
    struct rows_job rj = {
        ws, x, y, D, ld, rows, ew, shared ? shared->gate.rows : 0, c->swiglu_limit};
    par_for(k, rows, rows, 1, gather_rows, &rj);
    /* gate and up of every active expert (and the shared FFN) in one batch */
    ms_mm_call calls[2 * 256 + 2];
    int nc = 0;
    for (int64_t e = e_begin; e < e_end && nc < 2 * 256; e++) {
        int64_t n = ws->offset[e + 1] - ws->offset[e], r0 = ws->offset[e];
        if (n == 0) continue;
        const ms_ffn_w *f = &mw->experts[e];
        calls[nc++] = (ms_mm_call){ws->g + r0 * ld, ld, ws->xg + r0 * D, D, n, &f->gate, 0, 0};
        calls[nc++] = (ms_mm_call){ws->u + r0 * ld, ld, ws->xg + r0 * D, D, n, &f->up, 0, 0};
    }
    if (shared) {
        calls[nc++] = (ms_mm_call){ws->g + sh_row * ld, ld, x, D, T, &shared->gate, 0, 0};
        calls[nc++] = (ms_mm_call){ws->u + sh_row * ld, ld, x, D, T, &shared->up, 0, 0};
    }
    ms_matmul_batch(k, calls, nc);
    par_for(k, rows, rows + (shared ? T : 0), 1, silu_rows, &rj);
    /* down projections: experts into yg, the shared FFN straight into y */
    nc = 0;
    for (int64_t e = e_begin; e < e_end && nc < 256; e++) {
        int64_t n = ws->offset[e + 1] - ws->offset[e], r0 = ws->offset[e];
        if (n == 0) continue;
        calls[nc++] =
            (ms_mm_call){ws->yg + r0 * D, D, ws->g + r0 * ld, ld, n, &mw->experts[e].down, 0, 0};
    }
    if (shared)
        calls[nc++] = (ms_mm_call){y, D, ws->g + sh_row * ld, ld, T, &shared->down, accumulate, 0};
    else if (!accumulate)
        memset(y, 0, sizeof(float) * (size_t)(T * D));
    ms_matmul_batch(k, calls, nc);
    par_for(k, rows, D, 16, combine_cols, &rj); /* combine, split by columns */
    return 0;
}

int ms_moe_experts(const ms_kctx *k, const ms_config *c, const ms_moe_w *mw, const float *x,
                   int64_t T, const int32_t *idx, const float *w, int e_begin, int e_end, float *y,
                   int accumulate, ms_moe_ws *ws)
{
    if (!accumulate && T > 0) memset(y, 0, sizeof(float) * (size_t)(T * c->hidden_size));
    return ms_moe_experts_shared(k, c, mw, x, T, idx, w, e_begin, e_end, NULL, y, 1, ws);
}

int ms_moe_forward(const ms_kctx *k, const ms_config *c, const ms_moe_w *mw, const float *x,
                   int64_t T, float *y, ms_moe_ws *ws)
{
    int64_t D = c->hidden_size;
    int rc = ms_moe_route(k, c, mw, x, T, ws);
    if (rc) return rc;
    (void)D;
    return ms_moe_experts_shared(k, c, mw, x, T, ws->topk_idx, ws->topk_w, 0, c->n_routed_experts,
                                 mw->shared, y, 0, ws);
}
