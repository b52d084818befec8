/* shard.h — what part of the model this rank holds and which groups it
 * talks to: the per-rank slice of a resolved layout (parallel/layout.h).
 *
 * Attention heads are split over the attention-TP group; routed experts are
 * owned by EP rank and split in their intermediate dimension over MoE-TP;
 * dense MLPs and shared experts are split over their width or replicated.
 * A NULL shard means one rank holding everything.  Filled once at start-up by
 * the engine; read-only afterwards (per-step counts live in ms_step_ctx).
 */
#ifndef MS_MODEL_SHARD_H
#define MS_MODEL_SHARD_H

#include "parallel/comm.h"
#include "parallel/ep.h"
#include "parallel/layout.h"

#include <stdint.h>

/* Per step: what the engine learns in the step's token-count all-gather.  Owned and
 * rewritten by the engine before each forward; the MLP layers read it. */
typedef struct ms_step_ctx {
    const int64_t *rows_per_rank; /* [tp]: token rows of every rank of the tp group */
} ms_step_ctx;

/* This rank's place in the layout: {layout, coordinates, groups}, read-only after
 * start-up.  Group sizes, MLP modes and expert counts are read from lay, this rank's
 * positions from at (ms_layout_rank_coords), never copied. */
typedef struct ms_shard {
    const ms_layout *lay; /* borrowed (the engine's) */
    ms_rank_coords at;    /* heads [at.attn_tp_rank·H/attn_tp, ...) of the attention group */
    ms_group *attn_group; /* attention-TP group (borrowed) */
    ms_group *tp_group;   /* replica tp group: gathers, reductions, a2a (borrowed) */
    int dispatch_bf16;    /* --ep-dispatch-dtype bf16 */
    const ms_expert_map *experts; /* [n_layers + MTP layers] placement of each layer's experts
                                   * (borrowed; NULL for a dense model) */
    const ms_step_ctx *step;      /* borrowed; its contents change every step, the pointer never */
    int waterfill_dynamic;        /* SGLANG_DISABLE_STATIC_WATERFILL: waterfill on EP-wide loads */
} ms_shard;

/* The routed experts this rank holds in layer l: ms_shard_n_experts of them, the s-th
 * being logical expert ms_shard_expert(sh, l, s) (all of them, in order, on one rank).
 * Weight loading and the non-all-to-all MLP modes read placement only through these. */
static inline int ms_shard_n_experts(const ms_shard *sh, int n_routed)
{
    return sh && sh->experts ? sh->experts[0].per_rank : n_routed;
}
static inline int ms_shard_expert(const ms_shard *sh, int layer, int s)
{
    return sh && sh->experts ? ms_expert_map_local(&sh->experts[layer], sh->at.moe_ep_rank, s) : s;
}
/* Whether this rank holds logical expert e of layer l (always, on one rank). */
static inline int ms_shard_holds(const ms_shard *sh, int layer, int e)
{
    if (!sh || !sh->experts) return 1;
    const ms_expert_map *m = &sh->experts[layer];
    return ms_expert_map_owner(m, m->physical_of[e]) == sh->at.moe_ep_rank;
}

#endif
