/* moe.h — DeepSeek MoE on one rank: the gate (router) and the routed +
 * shared expert computation over a batch of token rows.
 *
 * The gate follows DeepSeek's official inference/model.py: softmax, sigmoid
 * or (V4) sqrt(softplus) scores; e_score_correction_bias added for selection
 * only; V4's hash layers take the experts from a token-id table (tid2eid)
 * instead of a top-k, weighting them by their scores; group-limited
 * top-k (group score = sum of the top-2 biased scores with a bias, else the
 * max); other groups masked at -inf; weights from unbiased scores,
 * renormalised when norm_topk_prob; times routed_scaling_factor.  SwiGLU
 * is clamped when the config has a swiglu_limit (V4).
 * Expert compute groups tokens by expert and runs each expert's SwiGLU as
 * GEMMs over its token rows; from 8 rows the routing, the grouping copy, the
 * SiLU and the combine also run on the pool (split by rows, the combine by
 * columns, so the results do not depend on the thread count).  Main thread
 * only (kernels use the pool).
 */
#ifndef MS_MOE_MOE_H
#define MS_MOE_MOE_H

#include "kernels/kernels.h"
#include "model/config.h"

#include <stdint.h>

typedef struct ms_ffn_w { /* one SwiGLU FFN: dense MLP, shared expert or routed expert */
    ms_mat gate, up;      /* [inter][D] */
    ms_mat down;          /* [D][inter] */
} ms_ffn_w;

/* The weights of one MoE block: views into the model's layer (borrowed). */
typedef struct ms_moe_w {
    const ms_mat *router;    /* [E][D] */
    const float *e_bias;     /* [E] f32 selection bias, NULL when absent */
    const ms_ffn_w *experts; /* [E] (TP slices where this rank holds them) */
    const ms_ffn_w *shared;  /* the shared expert (or its slice), NULL when none */
    /* hash routing (V4's first layers): the experts of row t are tid2eid[tokens[t]][0..k),
     * NULL: top-k of the (biased) scores.  tokens holds the ids of the rows passed in. */
    const int32_t *tid2eid; /* [vocab][k] */
    const int32_t *tokens;  /* [T] */
} ms_moe_w;

/* Routing of one token row: n_experts_per_tok expert ids and weights. */
void ms_moe_gate_route(const ms_config *c, const float *logits /* [E] */,
                       const float *bias /* [E] or NULL */, int32_t *idx, float *weight,
                       float *scratch /* [2*E] */);
/* The same with the experts given (hash routing): idx = fixed[0..k), weights from the
 * unbiased scores of those experts, renormalised and scaled as above. */
void ms_moe_gate_route_fixed(const ms_config *c, const float *logits /* [E] */,
                             const int32_t *fixed /* [k] */, int32_t *idx, float *weight,
                             float *scratch /* [2*E] */);
/* out[i] = silu(g[i]) * u[i], with g = min(g, limit) and u = clamp(u, -limit, limit)
 * first (in place: g and u are the caller's scratch) when limit > 0 (V4's
 * swiglu_limit).  out may alias g. */
void ms_swiglu(float *out, float *g, float *u, int64_t n, float limit);

/* Scratch for expert compute (grow-only). */
typedef struct ms_moe_ws {
    int64_t cap_rows;    /* token rows */
    int64_t cap_grp;     /* grouped rows (T*k) */
    float *logits;       /* [T][E] */
    int32_t *topk_idx;   /* [T][k] */
    float *topk_w;       /* [T][k] */
    int32_t *count;      /* [E] */
    int32_t *offset;     /* [E+1] */
    int32_t *row_token;  /* [T*k]: token of each grouped row */
    float *row_weight;   /* [T*k] */
    float *xg;           /* [T*k][D] gathered inputs */
    float *g, *u;        /* [T*k][inter] */
    float *yg;           /* [T*k][D] */
    float *scratch;      /* [threads][2*E] routing scratch */
    int64_t cap_scratch; /* floats in scratch */
    int64_t cap_inter, cap_D, cap_E, cap_k;
} ms_moe_ws;

void ms_moe_ws_free(ms_moe_ws *ws);

/* SwiGLU FFN over M rows: y[M][D] (=|+=) down(silu(gate x) * up x), clamped as
 * ms_swiglu with limit.  g, u: scratch [M][inter]. */
void ms_ffn_forward(const ms_kctx *k, const ms_ffn_w *f, const float *x, int64_t M, int64_t D,
                    float *y, int accumulate, float *g, float *u, float limit);

/* Gate for T rows: writes ws->topk_idx / ws->topk_w [T][k].  0 or MS_ENOMEM. */
int ms_moe_route(const ms_kctx *k, const ms_config *c, const ms_moe_w *mw, const float *x,
                 int64_t T, ms_moe_ws *ws);

/* Routed experts [e_begin, e_end) over T rows: y[t] (=|+=) Σ_j w[t][j] Expert_idx[t][j](x[t])
 * for the entries whose expert is in range (idx < 0 entries are skipped).  idx/w are
 * [T][k] and may be ws->topk_idx / ws->topk_w.  Expert views may be TP slices (partial
 * sums).  0 or MS_ENOMEM. */
int ms_moe_experts(const ms_kctx *k, const ms_config *c, const ms_moe_w *mw, const float *x,
                   int64_t T, const int32_t *idx, const float *w, int e_begin, int e_end, float *y,
                   int accumulate, ms_moe_ws *ws);
/* The same, plus an FFN over all T rows (the shared expert, or a slice of it)
 * whose output is the starting value of y; all expert GEMMs run as two
 * batched pool runs (gate+up, then down).  shared may be NULL. */
int ms_moe_experts_shared(const ms_kctx *k, const ms_config *c, const ms_moe_w *mw, const float *x,
                          int64_t T, const int32_t *idx, const float *w, int e_begin, int e_end,
                          const ms_ffn_w *shared, float *y, int accumulate, ms_moe_ws *ws);

/* The whole MoE block on one rank: y[T][D] = Σ_j w_j Expert_j(x) + Shared(x). */
int ms_moe_forward(const ms_kctx *k, const ms_config *c, const ms_moe_w *mw, const float *x,
                   int64_t T, float *y, ms_moe_ws *ws);

#endif
