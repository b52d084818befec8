/* comm_groups.c — the standard set of groups (tp, attn_tp, moe_ep, moe_tp, dense, dp) built
 * from layout numbers, with the rank ordering documented in comm.h (SGLang's convention).
 *
 * Owns the rank arithmetic (pure, testable without MPI) and the splits.  Does not decide the
 * sizes: src/parallel/layout resolves them.  ms_comm_ranks_compute is thread-safe; the rest is
 * main thread only.
 */
#include "parallel/comm.h"

#include <string.h>

#define MAX_WORLD (1 << 20) /* named limit on ranks, keeps the arithmetic in int */

enum { G_TP, G_ATTN_TP, G_MOE_EP, G_MOE_TP, G_DENSE, G_DP, G_N };

int ms_comm_ranks_compute(const ms_comm_dims *d, int world_rank, ms_comm_coords *out,
                          int first[6], int stride[6], ms_errbuf *e)
{
    if (d->tp < 1 || d->attn_tp < 1 || d->attn_dp < 1 || d->moe_ep < 1 || d->moe_tp < 1 ||
        d->dense_tp < 1 || d->n_replicas < 1)
        return ms_err(e, MS_ELAYOUT, "group sizes must be >= 1 (tp %d, attn_tp %d, attn_dp %d, "
                      "moe_ep %d, moe_tp %d, dense_tp %d, replicas %d)", d->tp, d->attn_tp,
                      d->attn_dp, d->moe_ep, d->moe_tp, d->dense_tp, d->n_replicas);
    if (d->tp > MAX_WORLD || d->n_replicas > MAX_WORLD / d->tp)
        return ms_err(e, MS_ELAYOUT, "%d replicas × tp %d exceeds %d ranks", d->n_replicas, d->tp,
                      MAX_WORLD);
    if ((long)d->attn_tp * d->attn_dp != d->tp)
        return ms_err(e, MS_ELAYOUT, "attn_tp %d × attn_dp %d must equal tp %d", d->attn_tp,
                      d->attn_dp, d->tp);
    if (d->moe_ep > d->tp || d->tp % ((long)d->moe_ep * d->moe_tp) != 0)
        return ms_err(e, MS_ELAYOUT, "moe_ep %d × moe_tp %d must divide tp %d", d->moe_ep,
                      d->moe_tp, d->tp);
    if (d->tp % d->dense_tp != 0)
        return ms_err(e, MS_ELAYOUT, "dense_tp %d must divide tp %d", d->dense_tp, d->tp);
    int world = d->n_replicas * d->tp;
    if (world_rank < 0 || world_rank >= world)
        return ms_err(e, MS_ELAYOUT, "world rank %d out of range for %d ranks", world_rank, world);
    ms_comm_coords c;
    c.world_rank = world_rank;
    c.replica = world_rank / d->tp;
    c.tp_rank = world_rank % d->tp;
    c.attn_tp_rank = c.tp_rank % d->attn_tp;
    c.attn_dp_rank = c.tp_rank / d->attn_tp;
    c.moe_tp_rank = c.tp_rank % d->moe_tp;
    c.moe_ep_rank = (c.tp_rank / d->moe_tp) % d->moe_ep;
    c.moe_dp_rank = c.tp_rank / (d->moe_ep * d->moe_tp);
    c.dense_rank = c.tp_rank % d->dense_tp;
    if (out) *out = c;
    if (first && stride) {
        int base = c.replica * d->tp;
        first[G_TP] = base;
        stride[G_TP] = 1;
        first[G_ATTN_TP] = base + c.attn_dp_rank * d->attn_tp;
        stride[G_ATTN_TP] = 1;
        first[G_MOE_EP] = base + c.moe_dp_rank * d->moe_ep * d->moe_tp + c.moe_tp_rank;
        stride[G_MOE_EP] = d->moe_tp;
        first[G_MOE_TP] = base + (c.tp_rank / d->moe_tp) * d->moe_tp;
        stride[G_MOE_TP] = 1;
        first[G_DENSE] = base + (c.tp_rank / d->dense_tp) * d->dense_tp;
        stride[G_DENSE] = 1;
        first[G_DP] = c.tp_rank;
        stride[G_DP] = d->tp;
    }
    return 0;
}

int ms_comm_groups_init(ms_comm_groups *gs, const ms_comm_dims *d, ms_errbuf *e)
{
    memset(gs, 0, sizeof *gs);
    ms_group *world = ms_comm_world();
    if (!world) return ms_err(e, MS_EINVAL, "communication layer not initialised");
    if ((long)d->n_replicas * d->tp != world->size)
        return ms_err(e, MS_ELAYOUT, "this layout needs %ld ranks (%d replicas × tp %d), the "
                      "world has %d", (long)d->n_replicas * d->tp, d->n_replicas, d->tp,
                      world->size);
    int first[G_N], stride[G_N];
    int rc = ms_comm_ranks_compute(d, world->rank, &gs->at, first, stride, e);
    if (rc) return rc;
    gs->world = world;
    static const char *names[G_N] = {"tp", "attn_tp", "moe_ep", "moe_tp", "dense", "dp"};
    ms_group **slots[G_N] = {&gs->tp, &gs->attn_tp, &gs->moe_ep, &gs->moe_tp, &gs->dense, &gs->dp};
    for (int k = 0; k < G_N; k++) {
        /* color: world rank of the group's first member; key: position in the group */
        int key = (world->rank - first[k]) / stride[k];
        rc = ms_comm_split(world, first[k], key, names[k], slots[k], e);
        if (rc) {
            ms_comm_groups_deinit(gs);
            return rc;
        }
    }
    return 0;
}

void ms_comm_groups_deinit(ms_comm_groups *gs)
{
    if (!gs) return;
    ms_comm_group_free(gs->tp);
    ms_comm_group_free(gs->attn_tp);
    ms_comm_group_free(gs->moe_ep);
    ms_comm_group_free(gs->moe_tp);
    ms_comm_group_free(gs->dense);
    ms_comm_group_free(gs->dp);
    memset(gs, 0, sizeof *gs);
}
