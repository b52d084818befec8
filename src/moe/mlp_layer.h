/* mlp_layer.h — one dense-MLP or MoE layer of a forward pass, in whatever
 * parallel mode the layout gives it (SGLang's ScatterMode, DESIGN.md §4):
 *   - single rank or replicated dense MLP: local compute;
 *   - TP_ATTN_FULL (no DP-attention): every rank of the replica holds the same
 *     tokens; each computes its slice (experts it owns × its intermediate
 *     slice, shared/dense slices) and the partial sums are all-reduced;
 *   - FULL (DP-attention, no all-to-all): the DP groups' tokens are gathered
 *     (MAX_LEN: padded all-gather; SUM_LEN: zero-filled all-reduce, chosen by
 *     SGLang's rule sum·2 >= max·dp), sliced compute, reduce-scatter back;
 *   - SCATTERED (all-to-all backend): each token is dispatched once per
 *     destination rank with its expert ids and weights there, experts run on
 *     their owner, weighted partial sums are combined back (parallel/ep.c, by
 *     the layer's expert map); shared expert local, or fused (a slot on every EP
 *     rank: the row's own, or the one waterfill picks, parallel/waterfill.h).
 * Every rank of the replica calls it every step, with 0 rows when idle.
 * Main thread only.
 */
#ifndef MS_MOE_MLP_LAYER_H
#define MS_MOE_MLP_LAYER_H

#include "model/config.h"
#include "model/shard.h"
#include "moe/moe.h"
#include "parallel/ep.h"

#include <stdint.h>

typedef struct ms_mlp_ws {
    ms_moe_ws moe;
    float *g, *u; /* dense/shared scratch [rows][inter] */
    int64_t cap_gu;
    float *xall, *yall, *cbuf;            /* gathered / expert-output / combine rows [rows][D] */
    int64_t cap_xall, cap_yall, cap_cbuf; /* floats */
    ms_ep_ws ep;                          /* a2a dispatch / combine (parallel/ep.h) */
    int32_t *ridx;                        /* [rows][k] received expert ids */
    float *rw;                            /* [rows][k] received weights */
    int64_t cap_ridx, cap_rw;             /* entries */
    int32_t *tok_send, *tok_all; /* hash routing in the DP gather: [max] mine, [N][max] all */
    int64_t cap_tok_send, cap_tok_all;
    int64_t n_max_len, n_sum_len; /* gather mode choices (tests, stats) */
    int64_t dispatch_rows;        /* rows sent to other ranks (Σ tokens × remote destinations) */
    int64_t expert_rows;   /* a2a: expert rows computed here (routed entries + shared rows) */
    int64_t shared_remote; /* a2a: rows whose fused shared expert ran on another rank */
    int32_t *sdst, *sdest; /* fused shared expert: [rows] its EP rank, [rows][k] routed ranks */
    int64_t *sall;         /* dynamic waterfill: [N][N + 1] loads of every rank */
    int64_t cap_sdst, cap_sdest, cap_sall;
} ms_mlp_ws;

void ms_mlp_ws_free(ms_mlp_ws *ws);

/* What a layer's MLP needs from the model: kernels, shape and this rank's shard. */
typedef struct ms_mlp_ctx {
    const ms_kctx *k;
    const ms_config *c;
    const ms_shard *sh; /* NULL: one rank holding everything */
} ms_mlp_ctx;

/* One layer's MLP weights (views borrowed from the model). */
typedef struct ms_mlp_w {
    int layer; /* the layer's index: its expert map in the shard */
    int is_moe;
    const ms_ffn_w *dense; /* !is_moe */
    ms_moe_w moe;          /* is_moe */
} ms_mlp_w;

/* y[T][D] = MLP(x) for this rank's T rows (T may be 0). */
int ms_mlp_forward(const ms_mlp_ctx *cx, const ms_mlp_w *w, const float *x, int64_t T, float *y,
                   ms_mlp_ws *ws, ms_errbuf *err);

#endif
