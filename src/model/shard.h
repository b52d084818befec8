/* shard.h — what part of the model this rank holds and which groups it
 * talks to: the per-rank slice of a resolved layout (parallel/layout.h).
 *
 * Attention heads are split over the attention-TP group; routed experts are
 * owned by EP rank and split in their intermediate dimension over MoE-TP;
 * dense MLPs and shared experts are split over their width or replicated.
 * A NULL shard means one rank holding everything.  Filled once at start-up by
 * the engine; read-only afterwards.
 */
#ifndef MS_MODEL_SHARD_H
#define MS_MODEL_SHARD_H

#include "parallel/comm.h"
#include "parallel/layout.h"

typedef struct ms_shard {
    const ms_layout *lay;
    ms_rank_coords at;
    int attn_tp, attn_tp_rank;   /* heads [rank*H/attn_tp, (rank+1)*H/attn_tp) */
    int attn_dp, attn_dp_rank;
    int tp, tp_rank;             /* the replica's tp group (MLP collectives) */
    int moe_ep, moe_ep_rank, moe_tp, moe_tp_rank;
    int first_expert, n_local_experts;
    int dense_tp, dense_rank;    /* dense MLP slice (dense_tp 1: replicated) */
    int shared_tp, shared_rank;  /* shared expert slice (1: computed whole, locally) */
    ms_mlp_mode sparse_mode, dense_mode;
    int dispatch_bf16;           /* --ep-dispatch-dtype bf16 */
    ms_group *attn_group;        /* attention-TP group */
    ms_group *tp_group;          /* replica tp group: gathers, reductions, a2a */
    /* per step: token rows of every rank of tp_group (set by the engine before a forward) */
    const int64_t *rows_per_rank;
} ms_shard;

#endif
