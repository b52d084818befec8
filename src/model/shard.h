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
    const ms_layout *lay;        /* borrowed (the engine's) */
    ms_rank_coords at;           /* heads [at.attn_tp_rank·H/attn_tp, ...) of the attention group */
    ms_group *attn_group;        /* attention-TP group (borrowed) */
    ms_group *tp_group;          /* replica tp group: gathers, reductions, a2a (borrowed) */
    int dispatch_bf16;           /* --ep-dispatch-dtype bf16 */
    const ms_step_ctx *step;     /* borrowed; its contents change every step, the pointer never */
} ms_shard;

#endif
