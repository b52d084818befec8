/* mlp_layer.c — dense-MLP / MoE layer execution in every parallel mode
 * (mlp_layer.h): local, TP all-reduce, DP gather (MAX_LEN / SUM_LEN) with
 * reduce-scatter, and all-to-all dispatch/combine. */
#include "moe/mlp_layer.h"

#include "base/util.h"
#include "moe/expert_recorder.h"
#include "parallel/comm.h"
#include "parallel/ep.h"
#include "parallel/waterfill.h"

#include <stdlib.h>
#include <string.h>

void ms_mlp_ws_free(ms_mlp_ws *ws)
{
    if (!ws) return;
    ms_moe_ws_free(&ws->moe);
    ms_ep_ws_free(&ws->ep);
    ms_free_aligned(ws->g);
    ms_free_aligned(ws->u);
    ms_free_aligned(ws->xall);
    ms_free_aligned(ws->yall);
    ms_free_aligned(ws->cbuf);
    free(ws->ridx);
    free(ws->rw);
    free(ws->tok_send);
    free(ws->tok_all);
    free(ws->sdst);
    free(ws->sdest);
    free(ws->sall);
    memset(ws, 0, sizeof *ws);
}

static int ffn_scratch(ms_mlp_ws *ws, int64_t rows, int64_t inter)
{
    if (rows * inter <= ws->cap_gu) return 0;
    int64_t n = MS_MAX(rows * inter, 2 * ws->cap_gu);
    ms_free_aligned(ws->g);
    ms_free_aligned(ws->u);
    ws->g = ms_alloc_aligned((size_t)n, sizeof(float));
    ws->u = ms_alloc_aligned((size_t)n, sizeof(float));
    ws->cap_gu = ws->g && ws->u ? n : 0;
    return ws->cap_gu ? 0 : MS_ENOMEM;
}

/* y[n][D] (=|+=) an FFN (dense, shared, or a slice of either) over n rows. */
static int ffn(const ms_mlp_ctx *cx, const ms_ffn_w *f, const float *x, int64_t n, float *y,
               int acc, ms_mlp_ws *ws)
{
    if (n <= 0) return 0;
    if (ffn_scratch(ws, n, f->gate.rows)) return MS_ENOMEM;
    ms_ffn_forward(cx->k, f, x, n, cx->c->hidden_size, y, acc, ws->g, ws->u, cx->c->swiglu_limit);
    return 0;
}

static int with_shared_slice(const ms_mlp_ctx *cx, const ms_mlp_w *w)
{
    return w->is_moe && cx->c->n_shared_experts > 0 && cx->sh && cx->sh->lay->shared_tp > 1;
}

static int shared_after(const ms_mlp_ctx *cx, const ms_mlp_w *w)
{
    return w->is_moe && cx->c->n_shared_experts > 0 && (!cx->sh || cx->sh->lay->shared_tp <= 1);
}

/* The gate's output of n rows to the expert distribution recorder, if one runs. */
static void record(const ms_mlp_ctx *cx, const ms_mlp_w *w, const int32_t *idx, int64_t n)
{
    ms_expert_recorder *r = ms_expert_recorder_active();
    if (!r || n <= 0) return;
    const ms_expert_map *map = cx->sh && cx->sh->experts ? &cx->sh->experts[w->layer] : NULL;
    ms_expert_recorder_add(r, w->layer, map, idx, n, cx->c->n_experts_per_tok);
}

/* This rank's share of the layer over n rows: Y (overwritten) = its experts and slices. */
static int partial(const ms_mlp_ctx *cx, const ms_mlp_w *w, const float *X, int64_t n, float *Y,
                   ms_mlp_ws *ws)
{
    const int layer = w->layer;
    const ms_shard *sh = cx->sh;
    int64_t D = cx->c->hidden_size;
    if (!w->is_moe) {
        if (n > 0) return ffn(cx, w->dense, X, n, Y, 0, ws);
        return 0;
    }
    int rc = ms_moe_route(cx->k, cx->c, &w->moe, X, n, &ws->moe);
    if (rc) return rc;
    (void)D;
    if (!sh || sh->tp_group->rank == 0) record(cx, w, ws->moe.topk_idx, n); /* once per replica */
    /* The gate's output through the expert map: entries of experts this rank does not hold
     * are skipped (idx -1).  --moe-dp-size: every MoE-DP group holds all experts (ep ×
     * moe_tp of them split over its ranks) and computes the routed experts of its share
     * of the rows only, so the tp-wide sum counts each row once. */
    if (sh && sh->experts) {
        int md = sh->lay->moe_dp, j = sh->at.moe_dp_rank, K = cx->c->n_experts_per_tok;
        int64_t r0 = n * j / md, r1 = n * (j + 1) / md;
        int32_t *idx = ws->moe.topk_idx;
        for (int64_t t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (t < r0 || t >= r1 || !ms_shard_holds(sh, layer, idx[t * K + k]))
                    idx[t * K + k] = -1;
    }
    return ms_moe_experts_shared(cx->k, cx->c, &w->moe, X, n, ws->moe.topk_idx, ws->moe.topk_w, 0,
                                 cx->c->n_routed_experts,
                                 with_shared_slice(cx, w) ? w->moe.shared : NULL, Y, 0, &ws->moe);
}

/* ---- TP_ATTN_FULL: same tokens everywhere, partial sums all-reduced ---- */
static int mode_allreduce(const ms_mlp_ctx *cx, const ms_mlp_w *w, const float *x, int64_t T,
                          float *y, ms_mlp_ws *ws, ms_errbuf *err)
{
    int rc = partial(cx, w, x, T, y, ws);
    if (rc) return ms_err(err, rc, "out of memory in MLP layer");
    if (T > 0 &&
        (rc = ms_comm_allreduce_f32(cx->sh->tp_group, y, (size_t)(T * cx->c->hidden_size), err)))
        return rc;
    if (shared_after(cx, w) && (rc = ffn(cx, w->moe.shared, x, T, y, 1, ws)))
        return ms_err(err, rc, "out of memory in MLP layer");
    return 0;
}

/* ---- FULL: gather the DP groups' tokens, partial sums, scatter back ---- */
static int mode_gather(const ms_mlp_ctx *cx, const ms_mlp_w *w, const float *x, int64_t T, float *y,
                       ms_mlp_ws *ws, ms_errbuf *err)
{
    const ms_shard *sh = cx->sh;
    ms_group *g = sh->tp_group;
    int N = g->size, atp = sh->lay->attn_tp, dp = N / atp, me = g->rank;
    int64_t D = cx->c->hidden_size, max_len = 0, sum_len = 0, my_off = 0;
    int64_t off[MS_LAUNCH_MAX_WIDTH > 4096 ? 4096 : MS_LAUNCH_MAX_WIDTH];
    if (dp > 4096) return ms_err(err, MS_EUNSUPPORTED, "more than 4096 DP groups");
    for (int d = 0; d < dp; d++) {
        int64_t t = sh->step->rows_per_rank[d * atp];
        off[d] = sum_len;
        if (d == me / atp) my_off = sum_len;
        sum_len += t;
        max_len = MS_MAX(max_len, t);
    }
    if (sum_len == 0) return 0; /* every group idle: nothing moves */
    int rc;
    ms_mlp_w wg = *w; /* hash routing: the gathered rows' token ids, in the same order */
    if (w->is_moe && w->moe.tid2eid) {
        void *a = ws->tok_send, *b = ws->tok_all;
        rc = ms_grow_array(&a, &ws->cap_tok_send, MS_MAX(max_len, 1), sizeof(int32_t));
        ws->tok_send = a;
        if (!rc)
            rc = ms_grow_array(&b, &ws->cap_tok_all, (int64_t)N * max_len + sum_len,
                               sizeof(int32_t));
        ws->tok_all = b;
        if (rc) return ms_err(err, MS_ENOMEM, "out of memory in DP gather");
        memset(ws->tok_send, 0, sizeof(int32_t) * (size_t)max_len);
        if (T > 0) memcpy(ws->tok_send, w->moe.tokens, sizeof(int32_t) * (size_t)T);
        if ((rc = ms_comm_allgather(g, ws->tok_send, sizeof(int32_t) * (size_t)max_len, ws->tok_all,
                                    err)))
            return rc;
        int32_t *compact = ws->tok_all + (int64_t)N * max_len;
        for (int d = 0; d < dp; d++)
            memcpy(compact + off[d], ws->tok_all + (int64_t)d * atp * max_len,
                   sizeof(int32_t) * (size_t)sh->step->rows_per_rank[d * atp]);
        wg.moe.tokens = compact;
    }
    w = &wg;
    if (sum_len * 2 >= max_len * dp) { /* MAX_LEN: padded all-gather, reduce-scatter */
        ws->n_max_len++;
        int64_t padded = (int64_t)N * max_len;
        if (ms_grow_scratch_f32(&ws->xall, &ws->cap_xall, MS_MAX(padded, sum_len) * D) ||
            ms_grow_scratch_f32(&ws->cbuf, &ws->cap_cbuf, MS_MAX(padded, sum_len) * D) ||
            ms_grow_scratch_f32(&ws->yall, &ws->cap_yall, sum_len * D))
            return ms_err(err, MS_ENOMEM, "out of memory in DP gather");
        float *send = ws->cbuf; /* [max][D] my rows padded */
        memcpy(send, x, sizeof(float) * (size_t)(T * D));
        memset(send + T * D, 0, sizeof(float) * (size_t)((max_len - T) * D));
        if ((rc = ms_comm_allgather(g, send, sizeof(float) * (size_t)(max_len * D), ws->xall, err)))
            return rc;
        float *X = ws->cbuf; /* compact [sum][D] from each group's first member */
        for (int d = 0; d < dp; d++)
            memcpy(X + off[d] * D, ws->xall + (int64_t)d * atp * max_len * D,
                   sizeof(float) * (size_t)(sh->step->rows_per_rank[d * atp] * D));
        if ((rc = partial(cx, w, X, sum_len, ws->yall, ws)))
            return ms_err(err, rc, "out of memory");
        float *S = ws->xall; /* [N][max][D]: block i = rows of member i's group */
        for (int i = 0; i < N; i++) {
            int d = i / atp;
            int64_t t = sh->step->rows_per_rank[d * atp];
            memcpy(S + (int64_t)i * max_len * D, ws->yall + off[d] * D,
                   sizeof(float) * (size_t)(t * D));
            memset(S + ((int64_t)i * max_len + t) * D, 0,
                   sizeof(float) * (size_t)((max_len - t) * D));
        }
        if ((rc = ms_comm_reduce_scatter_f32(g, S, ws->cbuf, (size_t)(max_len * D), err)))
            return rc;
        memcpy(y, ws->cbuf, sizeof(float) * (size_t)(T * D));
    } else { /* SUM_LEN: zero-filled all-reduce in, all-reduce out */
        ws->n_sum_len++;
        if (ms_grow_scratch_f32(&ws->xall, &ws->cap_xall, sum_len * D) ||
            ms_grow_scratch_f32(&ws->yall, &ws->cap_yall, sum_len * D))
            return ms_err(err, MS_ENOMEM, "out of memory in DP gather");
        memset(ws->xall, 0, sizeof(float) * (size_t)(sum_len * D));
        if (sh->at.attn_tp_rank == 0)
            memcpy(ws->xall + my_off * D, x, sizeof(float) * (size_t)(T * D));
        if ((rc = ms_comm_allreduce_f32(g, ws->xall, (size_t)(sum_len * D), err))) return rc;
        if ((rc = partial(cx, w, ws->xall, sum_len, ws->yall, ws)))
            return ms_err(err, rc, "out of memory");
        if ((rc = ms_comm_allreduce_f32(g, ws->yall, (size_t)(sum_len * D), err))) return rc;
        memcpy(y, ws->yall + my_off * D, sizeof(float) * (size_t)(T * D));
    }
    if (shared_after(cx, w) && (rc = ffn(cx, w->moe.shared, x, T, y, 1, ws)))
        return ms_err(err, rc, "out of memory in MLP layer");
    return 0;
}

/* ---- SCATTERED: all-to-all dispatch / combine ---- */

/* ws->sdst[n]: the EP rank computing each row's fused shared expert (waterfill.h):
 * its own under plain fusion, waterfill's choice otherwise.  The dynamic mode's
 * EP-wide loads take one all-gather, entered by every rank every layer. */
static int place_shared(const ms_mlp_ctx *cx, const ms_expert_map *map, int64_t n, ms_mlp_ws *ws,
                        ms_errbuf *err)
{
    const ms_shard *sh = cx->sh;
    int K = cx->c->n_experts_per_tok, N = map->n_ranks, me = sh->tp_group->rank, rc;
    void *a = ws->sdst, *b = ws->sdest;
    rc = ms_grow_array(&a, &ws->cap_sdst, MS_MAX(n, 1), sizeof(int32_t));
    ws->sdst = a;
    if (!rc) rc = ms_grow_array(&b, &ws->cap_sdest, MS_MAX(n, 1) * K, sizeof(int32_t));
    ws->sdest = b;
    if (rc || N > MS_EP_MAX_RANKS) return ms_err(err, MS_ENOMEM, "out of memory in waterfill");
    if (sh->lay->shared_mode != MS_SHARED_WATERFILL) {
        for (int64_t t = 0; t < n; t++) ws->sdst[t] = me;
        return 0;
    }
    const int32_t *idx = ws->moe.topk_idx;
    for (int64_t i = 0; i < n * K; i++)
        ws->sdest[i] = ms_expert_map_owner(map, map->physical_of[idx[i]]);
    void *c = ws->sall; /* [N + 1] mine, [N] routed, [N] rows, [N] effective, [N][N + 1] all */
    if (ms_grow_array(&c, &ws->cap_sall, (int64_t)N * (N + 5) + 1, sizeof(int64_t)))
        return ms_err(err, MS_ENOMEM, "out of memory in waterfill");
    ws->sall = c;
    int64_t *load = ws->sall, *all = load + N + 1, *rows = all + N, *eff = rows + N, *got = eff + N;
    ms_waterfill_plan p;
    ms_waterfill_count(map, idx, n, K, load);
    if (sh->waterfill_dynamic) { /* [routed per rank..., my rows] from every rank */
        load[N] = n;
        if ((rc = ms_comm_allgather(sh->tp_group, load, sizeof(int64_t) * (size_t)(N + 1), got,
                                    err)))
            return rc;
        for (int r = 0; r < N; r++) {
            all[r] = 0;
            rows[r] = got[(int64_t)r * (N + 1) + N];
            for (int s = 0; s < N; s++) all[r] += got[(int64_t)s * (N + 1) + r];
        }
        ms_waterfill_dynamic_plan(all, rows, N, K, eff, &p);
    } else {
        p = (ms_waterfill_plan){.rank_load = load, .n_ranks = N, .allow_all = 1, .target = 0};
    }
    ms_waterfill_choose(&p, me, ws->sdest, n, K, ws->sdst);
    for (int64_t t = 0; t < n; t++) ws->shared_remote += ws->sdst[t] != me;
    return 0;
}

/* The fused shared expert on the n_recv received rows that carry it (ws->ep.rshared):
 * gathered, run, added into their expert outputs ws->yall with their weight. */
static int shared_slot(const ms_mlp_ctx *cx, const ms_mlp_w *w, int64_t n_recv, ms_mlp_ws *ws)
{
    int64_t D = cx->c->hidden_size, m = 0;
    for (int64_t r = 0; r < n_recv; r++) m += ws->ep.rshared[r] != 0;
    ws->expert_rows += m;
    if (m == 0) return 0;
    if (ms_grow_scratch_f32(&ws->cbuf, &ws->cap_cbuf, 2 * m * D)) return MS_ENOMEM;
    float *xin = ws->cbuf, *yout = ws->cbuf + m * D;
    for (int64_t r = 0, i = 0; r < n_recv; r++)
        if (ws->ep.rshared[r] != 0)
            memcpy(xin + i++ * D, ws->xall + r * D, sizeof(float) * (size_t)D);
    int rc = ffn(cx, w->moe.shared, xin, m, yout, 0, ws);
    if (rc) return rc;
    for (int64_t r = 0, i = 0; r < n_recv; r++)
        if (ws->ep.rshared[r] != 0)
            ms_axpy_f32(ws->yall + r * D, ws->ep.rshared[r], yout + i++ * D, D);
    return 0;
}

static int mode_a2a(const ms_mlp_ctx *cx, const ms_mlp_w *w, const float *x, int64_t T, float *y,
                    ms_mlp_ws *ws, ms_errbuf *err)
{
    const ms_shard *sh = cx->sh;
    const ms_config *c = cx->c;
    const ms_expert_map *map = &sh->experts[w->layer];
    int K = c->n_experts_per_tok;
    int64_t D = c->hidden_size;
    int rc;
    /* attention-TP members hold the same rows: each dispatches its own share */
    int j = sh->at.attn_tp_rank, atp = sh->lay->attn_tp;
    int64_t r0 = T * j / atp, r1 = T * (j + 1) / atp, n = r1 - r0;
    const float *xs = x + r0 * D;
    float *ys = y + r0 * D;
    ms_moe_w mw = w->moe; /* hash routing reads the share's token ids */
    if (mw.tokens) mw.tokens += r0;
    if ((rc = ms_moe_route(cx->k, c, &mw, xs, n, &ws->moe)))
        return ms_err(err, rc, "out of memory");
    /* the recorder sees the routed top-k only, as SGLang's on_select_experts runs before
     * its waterfill appends the shared column */
    record(cx, w, ws->moe.topk_idx, n); /* each rank its own rows */
    const int fused = sh->lay->shared_mode != MS_SHARED_SEPARATE && c->n_shared_experts > 0;
    ms_ep_shared shared = {.fused = fused};
    if (fused && (rc = place_shared(cx, map, n, ws, err))) return rc;
    shared.dst = ws->sdst;
    int64_t n_recv = 0;
    if ((rc = ms_ep_dispatch(sh->tp_group, map, xs, n, D, K, ws->moe.topk_idx, ws->moe.topk_w,
                             &shared, sh->dispatch_bf16, &ws->ep, &ws->xall, &ws->cap_xall,
                             &ws->ridx, &ws->cap_ridx, &ws->rw, &ws->cap_rw, &n_recv, err)))
        return rc;
    ws->dispatch_rows = ws->ep.dispatch_rows;
    /* experts on the received rows (their ids are this rank's logical experts) */
    if (ms_grow_scratch_f32(&ws->yall, &ws->cap_yall, MS_MAX(n_recv, 1) * D))
        return ms_err(err, MS_ENOMEM, "out of memory in experts");
    rc = ms_moe_experts(cx->k, c, &w->moe, ws->xall, n_recv, ws->ridx, ws->rw, 0,
                        c->n_routed_experts, ws->yall, 0, &ws->moe);
    if (rc) return ms_err(err, rc, "out of memory in experts");
    for (int64_t i = 0; i < n_recv * K; i++) ws->expert_rows += ws->ridx[i] >= 0;
    if (fused) { /* the shared expert's slot here: the received rows that carry it */
        if ((rc = shared_slot(cx, w, n_recv, ws)))
            return ms_err(err, rc, "out of memory in experts");
        if (n > 0) memset(ys, 0, sizeof(float) * (size_t)(n * D));
    } else if (c->n_shared_experts > 0 && n > 0) { /* shared expert (local, whole) */
        ws->expert_rows += n;
        if ((rc = ffn(cx, w->moe.shared, xs, n, ys, 0, ws)))
            return ms_err(err, rc, "out of memory");
    } else if (n > 0) {
        memset(ys, 0, sizeof(float) * (size_t)(n * D));
    }
    if ((rc = ms_ep_combine(sh->tp_group, D, ws->yall, ys, &ws->ep, err))) return rc;
    /* attention-TP members: reassemble the full rows */
    if (atp > 1 && T > 0) {
        size_t cnts[4096], disp[4096];
        for (int q = 0; q < atp; q++) {
            int64_t a = T * q / atp, b = T * (q + 1) / atp;
            cnts[q] = (size_t)((b - a) * D);
            disp[q] = (size_t)(a * D);
        }
        return ms_comm_allgatherv_f32(sh->attn_group, NULL, y, cnts, disp, err);
    }
    return 0;
}

int ms_mlp_forward(const ms_mlp_ctx *cx, const ms_mlp_w *w, const float *x, int64_t T, float *y,
                   ms_mlp_ws *ws, ms_errbuf *err)
{
    const ms_shard *sh = cx->sh;
    int rc;
    if (!sh || (!w->is_moe && sh->lay->dense_tp <= 1) || sh->tp_group->size == 1) {
        if (!w->is_moe)
            rc = ffn(cx, w->dense, x, T, y, 0, ws);
        else
            rc = T > 0 ? ms_moe_forward(cx->k, cx->c, &w->moe, x, T, y, &ws->moe) : 0;
        if (!rc && w->is_moe) record(cx, w, ws->moe.topk_idx, T);
        return rc ? ms_err(err, rc, "out of memory in MLP layer") : 0;
    }
    ms_mlp_mode mode = w->is_moe ? sh->lay->sparse_mode : sh->lay->dense_mode;
    if (mode == MS_MLP_SCATTERED && w->is_moe) return mode_a2a(cx, w, x, T, y, ws, err);
    if (mode == MS_MLP_FULL || sh->lay->attn_dp > 1) return mode_gather(cx, w, x, T, y, ws, err);
    return mode_allreduce(cx, w, x, T, y, ws, err);
}
