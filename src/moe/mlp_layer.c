/* mlp_layer.c — dense-MLP / MoE layer execution in every parallel mode
 * (mlp_layer.h): local, TP all-reduce, DP gather (MAX_LEN / SUM_LEN) with
 * reduce-scatter, and all-to-all dispatch/combine. */
#include "moe/mlp_layer.h"

#include "base/util.h"
#include "parallel/comm.h"

#include <stdlib.h>
#include <string.h>

void ms_mlp_ws_free(ms_mlp_ws *ws)
{
    if (!ws) return;
    ms_moe_ws_free(&ws->moe);
    ms_free_aligned(ws->g);
    ms_free_aligned(ws->u);
    ms_free_aligned(ws->xall);
    ms_free_aligned(ws->yall);
    ms_free_aligned(ws->cbuf);
    free(ws->sbuf);
    free(ws->rbuf);
    free(ws->ridx);
    free(ws->rw);
    free(ws->rec_row);
    free(ws->counts);
    free(ws->cnt_all);
    memset(ws, 0, sizeof *ws);
}

static int grow_f(float **p, int64_t *cap, int64_t n)
{
    if (n <= *cap) return 0;
    n = MS_MAX(n, 2 * *cap);
    ms_free_aligned(*p);
    *p = ms_alloc_aligned((size_t)n, sizeof(float));
    *cap = *p ? n : 0;
    return *p ? 0 : MS_ENOMEM;
}

static int grow_bytes(void **p, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    n = MS_MAX(n, 2 * *cap);
    void *q = realloc(*p, n);
    if (!q) return MS_ENOMEM;
    *p = q;
    *cap = n;
    return 0;
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
static int ffn(ms_model *m, const ms_ffn_w *f, const float *x, int64_t n, float *y, int acc,
               ms_mlp_ws *ws)
{
    if (n <= 0) return 0;
    if (ffn_scratch(ws, n, f->gate.rows)) return MS_ENOMEM;
    ms_ffn_forward(&m->kctx, f, x, n, m->cfg.hidden_size, y, acc, ws->g, ws->u);
    return 0;
}

static int with_shared_slice(const ms_model *m, const ms_layer_w *lw)
{
    return lw->is_moe && m->cfg.n_shared_experts > 0 && m->shard && m->shard->lay->shared_tp > 1;
}

static int shared_after(const ms_model *m, const ms_layer_w *lw)
{
    return lw->is_moe && m->cfg.n_shared_experts > 0 && (!m->shard || m->shard->lay->shared_tp <= 1);
}

/* This rank's share of the layer over n rows: Y (overwritten) = its experts and slices. */
static int partial(ms_model *m, const ms_layer_w *lw, const float *X, int64_t n, float *Y,
                   ms_mlp_ws *ws)
{
    const ms_shard *sh = m->shard;
    int64_t D = m->cfg.hidden_size;
    if (!lw->is_moe) {
        if (n > 0) return ffn(m, &lw->dense, X, n, Y, 0, ws);
        return 0;
    }
    int rc = ms_moe_route(&m->kctx, &m->cfg, lw, X, n, &ws->moe);
    if (rc) return rc;
    int e0 = sh ? sh->at.first_expert : 0, e1 = sh ? e0 + sh->lay->experts_per_rank : m->cfg.n_routed_experts;
    (void)D;
    /* --moe-dp-size: every MoE-DP group holds all experts (ep × moe_tp of them split over
     * its ranks) and computes the routed experts of its share of the rows only; the other
     * groups' shares are skipped (idx -1), so the tp-wide sum counts each row once. */
    if (sh && sh->lay->moe_dp > 1) {
        int md = sh->lay->moe_dp, j = sh->at.moe_dp_rank, K = m->cfg.n_experts_per_tok;
        int64_t r0 = n * j / md, r1 = n * (j + 1) / md;
        for (int64_t t = 0; t < n; t++)
            if (t < r0 || t >= r1)
                for (int k = 0; k < K; k++) ws->moe.topk_idx[t * K + k] = -1;
    }
    return ms_moe_experts_shared(&m->kctx, &m->cfg, lw, X, n, ws->moe.topk_idx, ws->moe.topk_w, e0,
                                 e1, with_shared_slice(m, lw) ? &lw->shared : NULL, Y, 0, &ws->moe);
}

/* ---- TP_ATTN_FULL: same tokens everywhere, partial sums all-reduced ---- */
static int mode_allreduce(ms_model *m, const ms_layer_w *lw, const float *x, int64_t T, float *y,
                          ms_mlp_ws *ws, ms_errbuf *err)
{
    int rc = partial(m, lw, x, T, y, ws);
    if (rc) return ms_err(err, rc, "out of memory in MLP layer");
    if (T > 0 && (rc = ms_comm_allreduce_f32(m->shard->tp_group, y, (size_t)(T * m->cfg.hidden_size), err)))
        return rc;
    if (shared_after(m, lw) && (rc = ffn(m, &lw->shared, x, T, y, 1, ws)))
        return ms_err(err, rc, "out of memory in MLP layer");
    return 0;
}

/* ---- FULL: gather the DP groups' tokens, partial sums, scatter back ---- */
static int mode_gather(ms_model *m, const ms_layer_w *lw, const float *x, int64_t T, float *y,
                       ms_mlp_ws *ws, ms_errbuf *err)
{
    const ms_shard *sh = m->shard;
    ms_group *g = sh->tp_group;
    int N = g->size, atp = sh->lay->attn_tp, dp = N / atp, me = g->rank;
    int64_t D = m->cfg.hidden_size, max_len = 0, sum_len = 0, my_off = 0;
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
    if (sum_len * 2 >= max_len * dp) { /* MAX_LEN: padded all-gather, reduce-scatter */
        ws->n_max_len++;
        int64_t padded = (int64_t)N * max_len;
        if (grow_f(&ws->xall, &ws->cap_xall, MS_MAX(padded, sum_len) * D) ||
            grow_f(&ws->cbuf, &ws->cap_cbuf, MS_MAX(padded, sum_len) * D) ||
            grow_f(&ws->yall, &ws->cap_yall, sum_len * D))
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
        if ((rc = partial(m, lw, X, sum_len, ws->yall, ws))) return ms_err(err, rc, "out of memory");
        float *S = ws->xall; /* [N][max][D]: block i = rows of member i's group */
        for (int i = 0; i < N; i++) {
            int d = i / atp;
            int64_t t = sh->step->rows_per_rank[d * atp];
            memcpy(S + (int64_t)i * max_len * D, ws->yall + off[d] * D, sizeof(float) * (size_t)(t * D));
            memset(S + ((int64_t)i * max_len + t) * D, 0, sizeof(float) * (size_t)((max_len - t) * D));
        }
        if ((rc = ms_comm_reduce_scatter_f32(g, S, ws->cbuf, (size_t)(max_len * D), err))) return rc;
        memcpy(y, ws->cbuf, sizeof(float) * (size_t)(T * D));
    } else { /* SUM_LEN: zero-filled all-reduce in, all-reduce out */
        ws->n_sum_len++;
        if (grow_f(&ws->xall, &ws->cap_xall, sum_len * D) ||
            grow_f(&ws->yall, &ws->cap_yall, sum_len * D))
            return ms_err(err, MS_ENOMEM, "out of memory in DP gather");
        memset(ws->xall, 0, sizeof(float) * (size_t)(sum_len * D));
        if (sh->at.attn_tp_rank == 0) memcpy(ws->xall + my_off * D, x, sizeof(float) * (size_t)(T * D));
        if ((rc = ms_comm_allreduce_f32(g, ws->xall, (size_t)(sum_len * D), err))) return rc;
        if ((rc = partial(m, lw, ws->xall, sum_len, ws->yall, ws))) return ms_err(err, rc, "out of memory");
        if ((rc = ms_comm_allreduce_f32(g, ws->yall, (size_t)(sum_len * D), err))) return rc;
        memcpy(y, ws->yall + my_off * D, sizeof(float) * (size_t)(T * D));
    }
    if (shared_after(m, lw) && (rc = ffn(m, &lw->shared, x, T, y, 1, ws)))
        return ms_err(err, rc, "out of memory in MLP layer");
    return 0;
}

/* ---- SCATTERED: all-to-all dispatch / combine ---- */

/* One dispatched row: expert ids and weights at the destination, then the hidden row. */
static size_t record_bytes(int K, int64_t D, int bf16)
{
    size_t b = 8 + (size_t)K * 8 + (size_t)D * (bf16 ? 2 : 4);
    return (b + 7) & ~(size_t)7;
}

static int mode_a2a(ms_model *m, const ms_layer_w *lw, const float *x, int64_t T, float *y,
                    ms_mlp_ws *ws, ms_errbuf *err)
{
    const ms_shard *sh = m->shard;
    const ms_config *c = &m->cfg;
    ms_group *g = sh->tp_group;
    int N = g->size, me = g->rank, K = c->n_experts_per_tok, bf16 = sh->dispatch_bf16;
    int64_t D = c->hidden_size;
    int rc;
    /* attention-TP members hold the same rows: each dispatches its own share */
    int j = sh->at.attn_tp_rank, atp = sh->lay->attn_tp;
    int64_t r0 = T * j / atp, r1 = T * (j + 1) / atp, n = r1 - r0;
    const float *xs = x + r0 * D;
    float *ys = y + r0 * D;
    if ((rc = ms_moe_route(&m->kctx, c, lw, xs, n, &ws->moe))) return ms_err(err, rc, "out of memory");
    if (N > ws->cap_world) {
        free(ws->counts);
        free(ws->cnt_all);
        ws->counts = calloc((size_t)N * 4, sizeof(size_t));
        ws->cnt_all = calloc((size_t)N * (size_t)N, sizeof(int64_t));
        if (!ws->counts || !ws->cnt_all) return ms_err(err, MS_ENOMEM, "out of memory");
        ws->cap_world = N;
    }
    size_t *sbytes = ws->counts, *sdisp = sbytes + N, *rbytes = sdisp + N, *rdisp = rbytes + N;
    int64_t cnt[4096];
    if (N > 4096) return ms_err(err, MS_EUNSUPPORTED, "more than 4096 EP ranks");
    memset(cnt, 0, sizeof(int64_t) * (size_t)N);
    const int32_t *idx = ws->moe.topk_idx;
    const float *wt = ws->moe.topk_w;
    /* destinations of each row (deduplicated) */
    for (int64_t t = 0; t < n; t++) {
        uint8_t seen[4096 / 8 + 1] = {0};
        for (int k = 0; k < K; k++) {
            int d = ms_layout_expert_owner(sh->lay, idx[t * K + k]);
            if (d < 0 || d >= N) return ms_err(err, MS_EINTERNAL, "expert %d has no owner", idx[t * K + k]);
            if (!(seen[d / 8] & (1u << (d % 8)))) {
                seen[d / 8] |= (uint8_t)(1u << (d % 8));
                cnt[d]++;
            }
        }
    }
    size_t R = record_bytes(K, D, bf16);
    int64_t n_send = 0;
    for (int d = 0; d < N; d++) {
        sdisp[d] = (size_t)n_send * R;
        sbytes[d] = (size_t)cnt[d] * R;
        n_send += cnt[d];
        if (d != me) ws->dispatch_rows += cnt[d];
    }
    /* pack: records grouped by destination; remember each record's source row */
    if (grow_bytes((void **)&ws->sbuf, &ws->cap_sbuf, (size_t)n_send * R + 8) ||
        grow_bytes((void **)&ws->rec_row, &ws->cap_rec_row, sizeof(int32_t) * (size_t)(n_send + 1)))
        return ms_err(err, MS_ENOMEM, "out of memory in dispatch");
    int32_t *rec_row = ws->rec_row;
    int64_t fill[4096];
    for (int d = 0; d < N; d++) fill[d] = (int64_t)(sdisp[d] / R);
    for (int64_t t = 0; t < n; t++) {
        for (int k = 0; k < K; k++) {
            int d = ms_layout_expert_owner(sh->lay, idx[t * K + k]);
            int dup = 0;
            for (int q = 0; q < k; q++) dup |= ms_layout_expert_owner(sh->lay, idx[t * K + q]) == d;
            if (dup) continue;
            int64_t r = fill[d]++;
            rec_row[r] = (int32_t)t;
            uint8_t *rec = ws->sbuf + (size_t)r * R;
            int32_t ne = 0;
            for (int q = 0; q < K; q++) {
                int32_t e = -1;
                float w = 0;
                if (ms_layout_expert_owner(sh->lay, idx[t * K + q]) == d) {
                    e = idx[t * K + q];
                    w = wt[t * K + q];
                    ne++;
                }
                memcpy(rec + 8 + (size_t)q * 8, &e, 4);
                memcpy(rec + 12 + (size_t)q * 8, &w, 4);
            }
            memcpy(rec, &t, 4);
            memcpy(rec + 4, &ne, 4);
            uint8_t *pl = rec + 8 + (size_t)K * 8;
            if (bf16) {
                for (int64_t i = 0; i < D; i++) {
                    uint16_t h = ms_f32_to_bf16(xs[t * D + i]);
                    memcpy(pl + 2 * i, &h, 2);
                }
            } else {
                memcpy(pl, xs + t * D, sizeof(float) * (size_t)D);
            }
        }
    }
    /* who sends what to whom */
    if ((rc = ms_comm_allgather(g, cnt, sizeof(int64_t) * (size_t)N, ws->cnt_all, err))) return rc;
    int64_t n_recv = 0;
    for (int s = 0; s < N; s++) {
        rdisp[s] = (size_t)n_recv * R;
        rbytes[s] = (size_t)ws->cnt_all[(int64_t)s * N + me] * R;
        n_recv += ws->cnt_all[(int64_t)s * N + me];
    }
    if (grow_bytes((void **)&ws->rbuf, &ws->cap_rbuf, (size_t)n_recv * R + 8) ||
        grow_f(&ws->xall, &ws->cap_xall, MS_MAX(n_recv, 1) * D) ||
        grow_f(&ws->yall, &ws->cap_yall, MS_MAX(n_recv, 1) * D) ||
        grow_bytes((void **)&ws->ridx, &ws->cap_ridx, sizeof(int32_t) * (size_t)(MS_MAX(n_recv, 1) * K)) ||
        grow_bytes((void **)&ws->rw, &ws->cap_rw, sizeof(float) * (size_t)(MS_MAX(n_recv, 1) * K)))
        return ms_err(err, MS_ENOMEM, "out of memory in dispatch");
    if ((rc = ms_comm_alltoallv(g, MS_COMM_A2A_DISPATCH, ws->sbuf, sbytes, sdisp, ws->rbuf, rbytes,
                                rdisp, err)))
        return rc;
    /* experts on the received rows */
    int32_t *ridx = ws->ridx;
    float *rw = ws->rw;
    for (int64_t r = 0; r < n_recv; r++) {
        const uint8_t *rec = ws->rbuf + (size_t)r * R;
        for (int q = 0; q < K; q++) {
            memcpy(&ridx[r * K + q], rec + 8 + (size_t)q * 8, 4);
            memcpy(&rw[r * K + q], rec + 12 + (size_t)q * 8, 4);
        }
        const uint8_t *pl = rec + 8 + (size_t)K * 8;
        if (bf16) {
            for (int64_t i = 0; i < D; i++) {
                uint16_t h;
                memcpy(&h, pl + 2 * i, 2);
                ws->xall[r * D + i] = ms_bf16_to_f32(h);
            }
        } else {
            memcpy(ws->xall + r * D, pl, sizeof(float) * (size_t)D);
        }
    }
    rc = ms_moe_experts(&m->kctx, c, lw, ws->xall, n_recv, ridx, rw, sh->at.first_expert,
                        sh->at.first_expert + sh->lay->experts_per_rank, ws->yall, 0, &ws->moe);
    if (rc) return ms_err(err, rc, "out of memory in experts");
    /* combine: weighted partial sums back to the rows' owners */
    for (int s = 0; s < N; s++) {
        size_t rows_from_s = rbytes[s] / R, rows_to_s = sbytes[s] / R;
        rbytes[s] = rows_from_s * (size_t)D * 4; /* what I send back to s */
        rdisp[s] = rdisp[s] / R * (size_t)D * 4;
        sbytes[s] = rows_to_s * (size_t)D * 4;   /* what s sends back to me */
        sdisp[s] = sdisp[s] / R * (size_t)D * 4;
    }
    if (grow_f(&ws->cbuf, &ws->cap_cbuf, MS_MAX(n_send, 1) * D))
        return ms_err(err, MS_ENOMEM, "out of memory in combine");
    if ((rc = ms_comm_alltoallv(g, MS_COMM_A2A_COMBINE, ws->yall, rbytes, rdisp, ws->cbuf, sbytes,
                                sdisp, err)))
        return rc;
    /* shared expert (local, whole) then the routed partial sums */
    if (c->n_shared_experts > 0 && n > 0) {
        if ((rc = ffn(m, &lw->shared, xs, n, ys, 0, ws))) return ms_err(err, rc, "out of memory");
    } else if (n > 0) {
        memset(ys, 0, sizeof(float) * (size_t)(n * D));
    }
    for (int64_t r = 0; r < n_send; r++) ms_axpy_f32(ys + (int64_t)rec_row[r] * D, 1.0f, ws->cbuf + r * D, D);
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

int ms_mlp_forward(ms_model *m, const ms_layer_w *lw, const float *x, int64_t T, float *y,
                   ms_mlp_ws *ws, ms_errbuf *err)
{
    const ms_shard *sh = m->shard;
    int rc;
    if (!sh || (!lw->is_moe && sh->lay->dense_tp <= 1) || sh->tp_group->size == 1) {
        if (!lw->is_moe) rc = ffn(m, &lw->dense, x, T, y, 0, ws);
        else rc = T > 0 ? ms_moe_forward(&m->kctx, &m->cfg, lw, x, T, y, &ws->moe) : 0;
        return rc ? ms_err(err, rc, "out of memory in MLP layer") : 0;
    }
    ms_mlp_mode mode = lw->is_moe ? sh->lay->sparse_mode : sh->lay->dense_mode;
    if (mode == MS_MLP_SCATTERED && lw->is_moe) return mode_a2a(m, lw, x, T, y, ws, err);
    if (mode == MS_MLP_FULL || sh->lay->attn_dp > 1) return mode_gather(m, lw, x, T, y, ws, err);
    return mode_allreduce(m, lw, x, T, y, ws, err);
}
