/* waterfill.h — where each token's copy of the fused shared expert runs (SGLang's
 * WaterfillBalancer, layers/moe/waterfill.py, and its kernel
 * kernels/ops/moe/deepep_waterfill_kernels.py; the flag was --enable-deepep-waterfill
 * before v0.5.16).
 *
 * The shared expert has a slot on every EP rank.  A source rank with fewer than
 * MS_WATERFILL_MIN_BATCH rows keeps every copy at home.  Otherwise the rank loads are
 * the routed entries (token x top-k, not deduplicated) per destination EP rank: in the
 * static mode (SGLang's default) of this rank's own rows only; in the dynamic one
 * (SGLANG_DISABLE_STATIC_WATERFILL=1) summed over the EP group plus each rank's row
 * count.  target = ceil((Σload + Σload/k) / N) (dynamic: Σrouted/k for the second term).
 * Row t's candidates are every rank (static; dynamic when max load <= target) or its
 * home plus its routed entries' ranks; each candidate r weighs max(target - load[r], 0),
 * times 10/11 (integer) off home; u = LCG(t ^ (src · 0x9E3779B9)) mod Σweights picks by
 * cumulative weight in rank order.  With all weights 0 the pick is the least-loaded
 * candidate, home preferred (another wins only when load · 11 < best · 10).
 * Pure functions, any thread.
 */
#ifndef MS_PARALLEL_WATERFILL_H
#define MS_PARALLEL_WATERFILL_H

#include "parallel/ep.h"

#include <stdint.h>

#define MS_WATERFILL_MIN_BATCH 64 /* SGLang's MIN_BATCH_FOR_BALANCE */

typedef struct ms_waterfill_plan {
    const int64_t *rank_load; /* [n_ranks] effective load of each EP rank */
    int n_ranks;
    int allow_all;  /* every rank is a candidate (else home + routed ranks) */
    int64_t target; /* the water level; 0: derived from rank_load as static */
} ms_waterfill_plan;

/* load[r] (+)= routed entries of n rows idx[n][K] (logical ids) whose replica lives on
 * EP rank r, by map.  load is zeroed first. */
void ms_waterfill_count(const ms_expert_map *map, const int32_t *idx, int64_t n, int K,
                        int64_t *load);

/* The dynamic plan from the EP-wide routed loads routed[N] and rows per rank rows[N]:
 * eff[N] = routed + rows (caller storage), target and allow_all as SGLang's. */
void ms_waterfill_dynamic_plan(const int64_t *routed, const int64_t *rows, int N, int K,
                               int64_t *eff, ms_waterfill_plan *p);

/* dst[t] for n rows of source rank src: the EP rank that computes row t's shared expert.
 * dest[n][K]: the EP rank of each routed entry (-1: none).  n < MS_WATERFILL_MIN_BATCH
 * or p NULL: dst = src for every row. */
void ms_waterfill_choose(const ms_waterfill_plan *p, int src, const int32_t *dest, int64_t n, int K,
                         int32_t *dst);

#endif
