/* ep.h — expert parallelism: the expert map and the all-to-all dispatch / combine
 * (DESIGN.md §7 "Experts through one map").
 *
 * ms_expert_map (one per layer): logical expert → its physical replica → owning EP
 * rank and local slot.  Physical experts are numbered rank-major (EP rank r owns
 * physical [r·per_rank, (r+1)·per_rank)), so owner and slot are arithmetic; the map
 * says which logical expert each physical slot holds.  Weight loading, the gate's
 * output, dispatch and combine all read it; without a placement file (SGLang's
 * --init-expert-location) it is the identity.  With --ep-num-redundant-experts a
 * logical expert may have several physical replicas; physical_of is then this rank's
 * choice (SGLang's static dispatch): its own replica if it holds one, else a fair
 * seeded one, so the ranks without a copy spread over the replicas.
 *
 * Dispatch sends each token row once per destination EP rank with the entries of its
 * top-k that rank owns (physical ids, weights); combine sends the owners' weighted
 * partial sums back and adds them to the rows.  With the shared expert fused (SGLang's
 * shared-expert fusion and waterfill) each row has one more entry: the shared expert's
 * slot on the EP rank shared_dst names, weight 1 (moeserve's routed weights already
 * carry routed_scaling_factor; SGLang's 1/routed_scaling_factor becomes 1 after its
 * scaling).  Pure communication: no gate, no expert weights.  Main thread only
 * (collectives); the map functions any thread.
 */
#ifndef MS_PARALLEL_EP_H
#define MS_PARALLEL_EP_H

#include "base/error.h"
#include "parallel/comm.h"

#include <stddef.h>
#include <stdint.h>

#define MS_EP_MAX_RANKS 4096 /* EP ranks one dispatch addresses */

typedef struct ms_expert_map {
    int n_logical, n_physical; /* n_physical = n_ranks · per_rank */
    int n_ranks, per_rank;
    int32_t *logical_of;  /* [n_physical]: the logical expert physical slot p holds */
    int32_t *physical_of; /* [n_logical]: the replica a token of logical e goes to */
} ms_expert_map;

/* The identity: physical = logical, EP rank r owning [r·per_rank, (r+1)·per_rank).
 * n_logical must equal n_ranks · per_rank.  0 or MS_EINVAL / MS_ENOMEM. */
int ms_expert_map_init_identity(ms_expert_map *m, int n_logical, int n_ranks, ms_errbuf *err);
/* From a physical → logical row (n_physical entries, each logical expert exactly once:
 * no redundant replicas yet).  0 or MS_EINVAL naming the bad entry. */
int ms_expert_map_init_from(ms_expert_map *m, int n_logical, int n_ranks, const int32_t *logical_of,
                            ms_errbuf *err);
/* With replicas: logical_of[n_physical] (n_physical a multiple of n_ranks, every
 * logical expert at least once).  physical_of is EP rank me's dispatch choice: the
 * first replica me holds, else the replica SGLang's fair choice gives me among the
 * ranks holding none (each replica taken floor(k/c) or ceil(k/c) times by those k
 * ranks, c replicas; a seeded sample and shuffle, seed e.g. the layer: every rank
 * computes the same table).  0 or MS_EINVAL naming the bad entry. */
int ms_expert_map_init_replicas(ms_expert_map *m, int n_logical, int n_physical, int n_ranks,
                                int me, uint64_t seed, const int32_t *logical_of, ms_errbuf *err);
void ms_expert_map_deinit(ms_expert_map *m);

/* Every layer's map, from SGLang's --init-expert-location: path NULL or "" (trivial:
 * slot p holds logical p mod n_logical); a JSON placement {"physical_to_logical_map":
 * [[n_physical ids] per layer]} (rows absent: trivial); or a recorded distribution
 * (an object with "logical_count", or a plain [L][E] array): DeepSeek's EPLB
 * (parallel/eplb.h, policy MS_EPLB_*, one group, one node, n_ranks GPUs) places
 * n_physical slots from it once.  A recorded dump carries both fields: its
 * logical_count wins.  me: this EP rank (its dispatch choice).  0, or MS_EINVAL with
 * the file and the reason. */
int ms_expert_map_load(ms_expert_map *maps, int n_layers, int n_logical, int n_physical,
                       int n_ranks, int me, int policy, const char *path, ms_errbuf *err);

static inline int ms_expert_map_owner(const ms_expert_map *m, int physical)
{
    return physical / m->per_rank;
}
static inline int ms_expert_map_slot(const ms_expert_map *m, int physical)
{
    return physical % m->per_rank;
}
/* The logical expert in local slot s of EP rank r. */
static inline int ms_expert_map_local(const ms_expert_map *m, int r, int s)
{
    return m->logical_of[r * m->per_rank + s];
}

/* Scratch of one dispatch/combine (grow-only; ms_ep_ws_free releases it). */
typedef struct ms_ep_ws {
    uint8_t *sbuf, *rbuf;
    int64_t cap_sbuf, cap_rbuf; /* bytes */
    int32_t *rec_row;           /* [n_send]: source row of each sent record */
    int64_t cap_rec_row;
    size_t *counts;   /* [4][N]: send/recv bytes and displacements */
    int64_t *cnt_all; /* [N][N] */
    int cap_world;
    float *cbuf; /* [n_send][D] combined partial sums coming back */
    int64_t cap_cbuf;
    int64_t n_send, n_recv;
    int64_t dispatch_rows; /* cumulative rows sent to other ranks */
    float *rshared;        /* [n_recv] fused dispatch: weight of the shared expert (0: none) */
    int64_t cap_rshared;
} ms_ep_ws;

void ms_ep_ws_free(ms_ep_ws *ws);

/* The shared expert of a fused dispatch: fused on every rank of the group or on none;
 * dst[n]: the EP rank computing row t's shared expert (parallel/waterfill.h). */
typedef struct ms_ep_shared {
    int fused;
    const int32_t *dst; /* [n] (NULL when n = 0 or not fused) */
} ms_ep_shared;

/* Dispatch over group g (its ranks are the EP ranks; map->n_ranks == g->size): n rows
 * x[n][D] with their top-k logical ids idx[n][K] and weights w[n][K], and, fused, each
 * row's shared-expert destination (shared; NULL: not fused).  On return *n_recv rows
 * arrived: xr[n_recv][D] (grown, ms_alloc_aligned floats, *cap_xr floats), their local
 * logical ids ir[n_recv][K] (-1: not for this rank) and weights wr[n_recv][K] (grown
 * with ms_grow_array; caps in entries), and fused, ws->rshared[n_recv] (the shared
 * expert's weight on each row, 0: not here).  Every rank of g calls it (n = 0: an idle
 * participant).  0, or MS_EINTERNAL for an expert with no owner here, MS_ENOMEM, or a
 * communication error. */
int ms_ep_dispatch(ms_group *g, const ms_expert_map *map, const float *x, int64_t n, int64_t D,
                   int K, const int32_t *idx, const float *w, const ms_ep_shared *shared, int bf16,
                   ms_ep_ws *ws, float **xr, int64_t *cap_xr, int32_t **ir, int64_t *cap_ir,
                   float **wr, int64_t *cap_wr, int64_t *n_recv, ms_errbuf *err);
/* After the experts ran on the received rows (yr[n_recv][D], weighted partial sums):
 * sends them back and adds each to its source row of y[n][D].  0 or an error. */
int ms_ep_combine(ms_group *g, int64_t D, const float *yr, float *y, ms_ep_ws *ws, ms_errbuf *err);

#endif
