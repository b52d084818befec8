/* comm_groups.c — the standard set of groups (tp, attn_tp, moe_ep, moe_tp, dense, dp) of one
 * rank, split from the world along the layout's coordinates and group spans
 * (ms_layout_rank_coords, ms_layout_group_span: the rank arithmetic lives there alone).
 * Main thread only.
 */
#include "parallel/comm.h"

#include <string.h>

int ms_comm_groups_init(ms_comm_groups *gs, const ms_layout *lay, ms_errbuf *e)
{
    memset(gs, 0, sizeof *gs);
    ms_group *world = ms_comm_world();
    if (!world) return ms_err(e, MS_EINVAL, "communication layer not initialised");
    if (lay->world_size != world->size)
        return ms_err(e, MS_ELAYOUT,
                      "this layout needs %d ranks (%d replicas × pp %d × tp %d), the world has %d",
                      lay->world_size, lay->n_replicas, lay->pp, lay->tp, world->size);
    if (ms_layout_rank_coords(lay, world->rank, &gs->at))
        return ms_err(e, MS_ELAYOUT,
                      "inconsistent group sizes (tp %d = attn tp %d × cp %d × dp %d = moe tp %d × "
                      "ep %d × dp %d; dense %d)",
                      lay->tp, lay->attn_tp, lay->attn_cp, lay->attn_dp, lay->moe_tp, lay->moe_ep,
                      lay->moe_dp, lay->dense_tp);
    gs->world = world;
    static const char *names[MS_GROUP_N] = {"tp", "attn_tp", "moe_ep", "moe_tp", "dense", "dp"};
    ms_group **slots[MS_GROUP_N] = {&gs->tp,     &gs->attn_tp, &gs->moe_ep,
                                    &gs->moe_tp, &gs->dense,   &gs->dp};
    for (int k = 0; k < MS_GROUP_N; k++) {
        int first, stride, size;
        ms_layout_group_span(lay, &gs->at, k, &first, &stride, &size);
        /* color: world rank of the group's first member; key: position in the group */
        int key = (world->rank - first) / stride;
        int rc = ms_comm_split(world, first, key, names[k], slots[k], e);
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
