/* comm_stats.c — byte accounting per group × layer tag × collective kind, and its printout.
 *
 * Owns the counters and the definition of the bytes (per rank, algorithm-independent: what must
 * cross between this rank and the others, whatever algorithm MPI picks; self-copies excluded).
 * With n ranks in the group, r this rank, es = element size:
 *   allreduce (c elements)  payload c·es; sent = recv = (c − b_r + b_r·(n−1))·es, the bytes of a
 *                           reduce-scatter then an all-gather over c split into n blocks
 *                           (b_r = c/n, +1 if r < c mod n): 2·(n−1)/n·c·es when balanced.
 *   allgather(v)            payload = own block; sent = own·(n−1); recv = Σ_{j≠r} block_j.
 *   reduce_scatter(v)       payload = whole input Σ_j c_j·es; sent = Σ_{j≠r} c_j·es;
 *                           recv = c_r·es·(n−1).
 *   alltoallv (dispatch / combine)  payload = Σ_j send_j; sent = Σ_{j≠r} send_j;
 *                           recv = Σ_{j≠r} recv_j  (seed 002: "network traffic excludes the
 *                           local rank").
 *   bcast (and control blocks)  payload = bytes; root sends bytes·(n−1), others receive bytes.
 *   gather(v)               payload = own block; non-roots send it, root receives Σ_{j≠root}.
 * So seed 002's DP-attention boundary "2·(N−1)/N·T_g·d·b per rank" is allgather.recv +
 * reduce_scatter.sent, and EP dispatch volume is a2a_dispatch.sent.  Over a group, Σ sent = Σ
 * recv for every kind.  wait_s is the wall time inside the call.
 * Counters grow by tag on first use (at most MS_COMM_MAX_TAG + 2 slots); a failed growth counts
 * into the untagged slot.  Main thread only.
 */
#include "parallel/comm_priv.h"

#include <stdlib.h>
#include <string.h>

const char *ms_comm_kind_name(enum ms_comm_kind k)
{
    static const char *names[MS_COMM_N_KINDS] = {"allreduce",    "allgather",   "reduce_scatter",
                                                 "a2a_dispatch", "a2a_combine", "bcast",
                                                 "gather",       "p2p"};
    return (unsigned)k < MS_COMM_N_KINDS ? names[k] : "unknown";
}

int ms_comm_set_tag(int tag)
{
    if (tag < MS_COMM_TAG_NONE || tag > MS_COMM_MAX_TAG) return MS_EINVAL;
    ms_comm_st.tag = tag;
    return 0;
}

int ms_comm_tag(void)
{
    return ms_comm_st.tag;
}

static ms_comm_counter *slot(ms_group *g, int tag, enum ms_comm_kind k)
{
    struct ms_group_priv *p = g->priv;
    int s = tag + 1;
    if (s < 0 || s > MS_COMM_MAX_TAG + 1) s = 0;
    if (s >= p->n_tag_slots) {
        int want = p->n_tag_slots ? p->n_tag_slots : 8;
        while (want <= s) want *= 2;
        if (want > MS_COMM_MAX_TAG + 2) want = MS_COMM_MAX_TAG + 2;
        ms_comm_counter *nc = realloc(p->ctr, (size_t)want * MS_COMM_N_KINDS * sizeof *nc);
        if (!nc) {
            if (!p->ctr) return NULL;
            s = 0;
        } else {
            memset(nc + (size_t)p->n_tag_slots * MS_COMM_N_KINDS, 0,
                   (size_t)(want - p->n_tag_slots) * MS_COMM_N_KINDS * sizeof *nc);
            p->ctr = nc;
            p->n_tag_slots = want;
        }
    }
    return &p->ctr[(size_t)s * MS_COMM_N_KINDS + k];
}

void ms_comm_stats_add(ms_group *g, enum ms_comm_kind k, uint64_t payload, uint64_t sent,
                       uint64_t recv, double wait_s)
{
    ms_comm_counter *c = slot(g, ms_comm_st.tag, k);
    if (!c) return;
    c->n_calls++;
    c->payload_bytes += payload;
    c->sent_bytes += sent;
    c->recv_bytes += recv;
    c->wait_s += wait_s;
}

void ms_comm_stats_get(const ms_group *g, int tag, enum ms_comm_kind k, ms_comm_counter *out)
{
    memset(out, 0, sizeof *out);
    if (!g || !g->priv || (unsigned)k >= MS_COMM_N_KINDS) return;
    const struct ms_group_priv *p = g->priv;
    for (int s = 0; s < p->n_tag_slots; s++) {
        if (tag != MS_COMM_TAG_ALL && s != tag + 1) continue;
        const ms_comm_counter *c = &p->ctr[(size_t)s * MS_COMM_N_KINDS + k];
        out->n_calls += c->n_calls;
        out->payload_bytes += c->payload_bytes;
        out->sent_bytes += c->sent_bytes;
        out->recv_bytes += c->recv_bytes;
        out->wait_s += c->wait_s;
    }
}

static void reset_one(ms_group *g)
{
    if (g->priv->ctr)
        memset(g->priv->ctr, 0,
               (size_t)g->priv->n_tag_slots * MS_COMM_N_KINDS * sizeof *g->priv->ctr);
}

void ms_comm_stats_reset(ms_group *g)
{
    if (g) {
        if (g->priv) reset_one(g);
        return;
    }
    for (ms_group *it = ms_comm_st.groups; it; it = it->priv->next) reset_one(it);
}

void ms_comm_stats_print(FILE *f)
{
    for (ms_group *g = ms_comm_st.groups; g; g = g->priv->next) {
        const struct ms_group_priv *p = g->priv;
        for (int s = 0; s < p->n_tag_slots; s++)
            for (int k = 0; k < MS_COMM_N_KINDS; k++) {
                const ms_comm_counter *c = &p->ctr[(size_t)s * MS_COMM_N_KINDS + k];
                if (!c->n_calls) continue;
                fprintf(f,
                        "comm rank=%d group=%s tag=%d kind=%s calls=%llu payload=%llu "
                        "sent=%llu recv=%llu wait_us=%.0f\n",
                        ms_comm_st.world_rank, g->name, s - 1,
                        ms_comm_kind_name((enum ms_comm_kind)k), (unsigned long long)c->n_calls,
                        (unsigned long long)c->payload_bytes, (unsigned long long)c->sent_bytes,
                        (unsigned long long)c->recv_bytes, c->wait_s * 1e6);
            }
    }
}

void ms_comm_stats_free(ms_group *g)
{
    free(g->priv->ctr);
    g->priv->ctr = NULL;
    g->priv->n_tag_slots = 0;
}
