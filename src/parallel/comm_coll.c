/* comm_coll.c — the collectives and the control-block protocol, each with a deadline.
 *
 * Owns argument checks, the size_t → int count conversion (with byte units of 4096/256/16/1 so
 * large buffers stay under MPI's int counts), posting the non-blocking MPI call, waiting through
 * ms_comm_wait (comm.c), and recording the bytes (comm_stats.c defines them).  Does not own the
 * meaning of the data.  Main thread only (MPI_THREAD_FUNNELED).
 */
#include "parallel/comm_priv.h"

#include "base/util.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define P2P_TAG        4343 /* point-to-point tag of ms_comm_exchange */
#define PAIR_TAG       4344 /* point-to-point tag of the two-rank all-reduce */
#define CTRL_TAG       4242 /* point-to-point tag of control headers (collectives use another space) */
#define CTRL_HDR_BYTES 16

/* ---- count conversion ------------------------------------------------------------------- */

static int unit_for(size_t or_all)
{
    for (int i = 0; i < MS_COMM_N_UNITS - 1; i++)
        if ((or_all & (ms_comm_st.unit_bytes[i] - 1)) == 0) return i;
    return MS_COMM_N_UNITS - 1;
}

static size_t or_of(const size_t *v, int n)
{
    size_t r = 0;
    for (int i = 0; i < n; i++) r |= v[i];
    return r;
}

static int to_int(const ms_group *g, const char *op, const size_t *v, int *out, int n, size_t unit,
                  ms_errbuf *e)
{
    for (int i = 0; i < n; i++) {
        size_t q = v[i] / unit;
        if (q > INT_MAX)
            return ms_err(e, MS_ETOOBIG,
                          "%s on group '%s': %zu bytes for rank %d exceed MPI's "
                          "count limit",
                          op, g->name, v[i], i);
        out[i] = (int)q;
    }
    return 0;
}

/* Packed displacements of counts (rank order) into out; the total into *total. */
static int packed(const ms_group *g, const char *op, const size_t *counts, size_t *out,
                  size_t *total, ms_errbuf *e)
{
    size_t off = 0;
    for (int i = 0; i < g->size; i++) {
        if (out) out[i] = off;
        if (!ms_add_size(off, counts[i], &off))
            return ms_err(e, MS_ETOOBIG, "%s on group '%s': total size overflows", op, g->name);
    }
    *total = off;
    return 0;
}

static uint64_t sum_except(const size_t *v, int n, int skip)
{
    uint64_t s = 0;
    for (int i = 0; i < n; i++)
        if (i != skip) s += v[i];
    return s;
}

/* Waits for one request and records the call. */
static int finish(ms_group *g, MPI_Request *r, int mrc, const char *op, size_t bytes,
                  enum ms_comm_kind k, uint64_t payload, uint64_t sent, uint64_t recv, double t0,
                  ms_errbuf *e)
{
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, op, e);
    int rc = ms_comm_wait(g, r, 1, true, op, bytes, e);
    if (rc) return rc;
    ms_comm_stats_add(g, k, payload, sent, recv, ms_now_s() - t0);
    return 0;
}

/* ---- fixed-order sums (ms_comm_set_fixed_order) ---------------------------------------- */

/* The one sum over ranks under --enable-deterministic-inference.  send holds the group's
 * blocks in rank order (block j: counts[j] floats); block j goes to rank j (one all-to-all),
 * which adds the copies it receives in rank order, ((b0 + b1) + b2) + ..., into recv
 * (counts[rank] floats; recv may be send's own block: send is read before recv is written).
 * MPI_SUM leaves the grouping to the library, which picks its algorithm (recursive doubling,
 * ring, Rabenseifner...) by the message size, so over more than two ranks the bits of an
 * element could follow the batch's row count; here they cannot.  Not recorded in the stats
 * (the callers record what the MPI call would have). */
static int fixed_sum(ms_group *g, const char *op, const float *send, const size_t *counts,
                     float *recv, ms_errbuf *e)
{
    struct ms_group_priv *p = g->priv;
    int n = g->size, me = g->rank;
    size_t off = 0, mine = counts[me];
    for (int j = 0; j < n; j++) {
        if (counts[j] > INT_MAX || off > INT_MAX || mine * (size_t)j > INT_MAX)
            return ms_err(e, MS_ETOOBIG, "%s on group '%s': %zu floats exceed MPI's count limit",
                          op, g->name, counts[j]);
        p->ia[j] = (int)counts[j], p->ib[j] = (int)off;           /* what goes to j */
        p->ic[j] = (int)mine, p->id[j] = (int)(mine * (size_t)j); /* j's copy of my block */
        off += counts[j];
    }
    if (ms_grow_scratch_f32(&ms_comm_st.fixed_buf, &ms_comm_st.fixed_cap,
                            (int64_t)mine * n > 0 ? (int64_t)mine * n : 1))
        return ms_err(e, MS_ENOMEM, "%s on group '%s': out of memory", op, g->name);
    float *b = ms_comm_st.fixed_buf; /* [n][mine] */
    MPI_Request req;
    int mrc =
        MPI_Ialltoallv(send, p->ia, p->ib, MPI_FLOAT, b, p->ic, p->id, MPI_FLOAT, p->comm, &req);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, op, e);
    int rc = ms_comm_wait(g, &req, 1, true, op, mine * 4, e);
    if (rc) return rc;
    for (size_t i = 0; i < mine; i++) {
        float s = b[i];
        for (int j = 1; j < n; j++) s += b[(size_t)j * mine + i];
        recv[i] = s;
    }
    return 0;
}

/* ---- the two-rank all-reduce ------------------------------------------------------------ */

/* Two ranks: each sends its count floats whole to the other (one Isend/Irecv round, waited
 * through ms_comm_wait: the same spin/sleep, liveness and deadline) and adds the copy it
 * received, buf[i] = v0[i] + v1[i] on both ranks (IEEE addition commutes: the same bits on
 * both, and MPI_SUM's at two ranks, which is that one addition).  Open MPI 4.1's
 * MPI_Iallreduce (libnbc) measured several times slower per byte on one host (HISTORY.md). */
static int allreduce_pair(ms_group *g, float *buf, size_t count, const char *op, ms_errbuf *e)
{
    if (ms_grow_scratch_f32(&ms_comm_st.fixed_buf, &ms_comm_st.fixed_cap, (int64_t)count))
        return ms_err(e, MS_ENOMEM, "%s on group '%s': out of memory", op, g->name);
    float *peer = ms_comm_st.fixed_buf; /* [count] the other rank's values */
    MPI_Comm comm = g->priv->comm;
    int other = 1 - g->rank;
    MPI_Request req[2];
    int mrc = MPI_Irecv(peer, (int)count, MPI_FLOAT, other, PAIR_TAG, comm, &req[0]);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, op, e);
    mrc = MPI_Isend(buf, (int)count, MPI_FLOAT, other, PAIR_TAG, comm, &req[1]);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, op, e); /* marks g broken */
    int rc = ms_comm_wait(g, req, 2, true, op, count * 4, e);
    if (rc) return rc;
    for (size_t i = 0; i < count; i++) buf[i] += peer[i];
    return 0;
}

/* ---- collectives ------------------------------------------------------------------------ */

int ms_comm_allreduce_f32(ms_group *g, float *buf, size_t count, ms_errbuf *e)
{
    const char *op = "allreduce_f32";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    if (count > INT_MAX)
        return ms_err(e, MS_ETOOBIG, "%s on group '%s': %zu floats exceed MPI's count limit", op,
                      g->name, count);
    uint64_t n = (uint64_t)g->size, r = (uint64_t)g->rank, c = count;
    /* Bytes as a reduce-scatter then an all-gather over count split into n blocks. */
    uint64_t b = c / n + (r < c % n ? 1 : 0);
    uint64_t moved = 4 * (c - b + b * (n - 1));
    double t0 = ms_now_s();
    if (g->size == 1 || count == 0) {
        ms_comm_stats_add(g, MS_COMM_ALLREDUCE, 4 * c, 0, 0, ms_now_s() - t0);
        return 0;
    }
    if (g->priv->shm &&
        !ms_comm_st
             .shm_bypass) { /* one host: rank-order sums through shared memory, any fixed_order */
        if ((rc = ms_comm_shm_allreduce(g, buf, count, op, e))) return rc;
        ms_comm_stats_add(g, MS_COMM_ALLREDUCE, 4 * c, moved, moved, ms_now_s() - t0);
        return 0;
    }
    if (g->size == 2 && ms_comm_st.opts.pair && !ms_comm_st.shm_bypass) {
        if ((rc = allreduce_pair(g, buf, count, op, e))) return rc;
        ms_comm_stats_add(g, MS_COMM_ALLREDUCE, 4 * c, 4 * c, 4 * c, ms_now_s() - t0);
        return 0;
    }
    MPI_Request req;
    if (ms_comm_st.fixed_order && g->size > 2) { /* fixed_sum of each rank's block, gathered */
        struct ms_group_priv *p = g->priv;
        size_t *cnt = p->sa, *dsp = p->sb;
        for (uint64_t j = 0, o = 0; j < n; o += cnt[j], j++) {
            cnt[j] = (size_t)(c / n + (j < c % n ? 1 : 0));
            dsp[j] = (size_t)o;
        }
        if ((rc = fixed_sum(g, op, buf, cnt, buf + dsp[r], e))) return rc;
        for (int j = 0; j < g->size; j++) p->ia[j] = (int)cnt[j], p->ib[j] = (int)dsp[j];
        int mrc = MPI_Iallgatherv(MPI_IN_PLACE, p->ia[r], MPI_FLOAT, buf, p->ia, p->ib, MPI_FLOAT,
                                  p->comm, &req);
        return finish(g, &req, mrc, op, count * 4, MS_COMM_ALLREDUCE, 4 * c, moved, moved, t0, e);
    }
    int mrc =
        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, g->priv->comm, &req);
    return finish(g, &req, mrc, op, count * 4, MS_COMM_ALLREDUCE, 4 * c, moved, moved, t0, e);
}

int ms_comm_allgather(ms_group *g, const void *send, size_t bytes, void *recv, ms_errbuf *e)
{
    const char *op = "allgather";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    int u = unit_for(bytes);
    size_t ub = ms_comm_st.unit_bytes[u], total;
    if (bytes / ub > INT_MAX || !ms_mul_size(bytes, (size_t)g->size, &total))
        return ms_err(e, MS_ETOOBIG, "%s on group '%s': %zu bytes per rank is too large", op,
                      g->name, bytes);
    double t0 = ms_now_s();
    MPI_Request req;
    int cnt = (int)(bytes / ub);
    int mrc = MPI_Iallgather(send ? send : MPI_IN_PLACE, cnt, ms_comm_st.units[u], recv, cnt,
                             ms_comm_st.units[u], g->priv->comm, &req);
    uint64_t moved = (uint64_t)bytes * (uint64_t)(g->size - 1);
    return finish(g, &req, mrc, op, bytes, MS_COMM_ALLGATHER, bytes, moved, moved, t0, e);
}

static int allgatherv_bytes(ms_group *g, const char *op, const void *send, void *recv,
                            const size_t *counts, const size_t *displs, ms_errbuf *e)
{
    struct ms_group_priv *p = g->priv;
    int n = g->size;
    size_t total = 0;
    int rc = packed(g, op, counts, displs ? NULL : p->sb, &total, e);
    if (rc) return rc;
    if (!displs) displs = p->sb;
    int u = unit_for(or_of(counts, n) | or_of(displs, n));
    size_t ub = ms_comm_st.unit_bytes[u];
    if ((rc = to_int(g, op, counts, p->ia, n, ub, e)) ||
        (rc = to_int(g, op, displs, p->ib, n, ub, e)))
        return rc;
    double t0 = ms_now_s();
    MPI_Request req;
    int mrc = MPI_Iallgatherv(send ? send : MPI_IN_PLACE, p->ia[g->rank], ms_comm_st.units[u], recv,
                              p->ia, p->ib, ms_comm_st.units[u], p->comm, &req);
    uint64_t mine = counts[g->rank];
    return finish(g, &req, mrc, op, counts[g->rank], MS_COMM_ALLGATHER, mine,
                  mine * (uint64_t)(n - 1), sum_except(counts, n, g->rank), t0, e);
}

int ms_comm_allgatherv(ms_group *g, const void *send, void *recv, const size_t *recv_bytes,
                       const size_t *recv_displs, ms_errbuf *e)
{
    int rc = ms_comm_check(g, "allgatherv", e);
    if (rc) return rc;
    return allgatherv_bytes(g, "allgatherv", send, recv, recv_bytes, recv_displs, e);
}

int ms_comm_allgatherv_f32(ms_group *g, const float *send, float *recv, const size_t *counts,
                           const size_t *displs, ms_errbuf *e)
{
    const char *op = "allgatherv_f32";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    struct ms_group_priv *p = g->priv;
    for (int i = 0; i < g->size; i++)
        if (!ms_mul_size(counts[i], 4, &p->sa[i]) ||
            (displs && !ms_mul_size(displs[i], 4, &p->sb[i])))
            return ms_err(e, MS_ETOOBIG, "%s on group '%s': count too large", op, g->name);
    return allgatherv_bytes(g, op, send, recv, p->sa, displs ? p->sb : NULL, e);
}

int ms_comm_reduce_scatter_f32(ms_group *g, const float *send, float *recv, size_t count_per_rank,
                               ms_errbuf *e)
{
    const char *op = "reduce_scatter_f32";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    if (count_per_rank > INT_MAX)
        return ms_err(e, MS_ETOOBIG,
                      "%s on group '%s': %zu floats per rank exceed MPI's count "
                      "limit",
                      op, g->name, count_per_rank);
    uint64_t n = (uint64_t)g->size, b = 4 * (uint64_t)count_per_rank;
    double t0 = ms_now_s();
    if (ms_comm_st.fixed_order && g->size > 2) {
        size_t *cnt = g->priv->sa;
        for (int j = 0; j < g->size; j++) cnt[j] = count_per_rank;
        if ((rc = fixed_sum(g, op, send, cnt, recv, e))) return rc;
        ms_comm_stats_add(g, MS_COMM_REDUCE_SCATTER, b * n, b * (n - 1), b * (n - 1),
                          ms_now_s() - t0);
        return 0;
    }
    MPI_Request req;
    int mrc = MPI_Ireduce_scatter_block(send, recv, (int)count_per_rank, MPI_FLOAT, MPI_SUM,
                                        g->priv->comm, &req);
    return finish(g, &req, mrc, op, (size_t)b, MS_COMM_REDUCE_SCATTER, b * n, b * (n - 1),
                  b * (n - 1), t0, e);
}

int ms_comm_reduce_scatterv_f32(ms_group *g, const float *send, float *recv, const size_t *counts,
                                ms_errbuf *e)
{
    const char *op = "reduce_scatterv_f32";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    int n = g->size;
    size_t total = 0;
    if ((rc = packed(g, op, counts, NULL, &total, e)) ||
        (rc = to_int(g, op, counts, g->priv->ia, n, 1, e)))
        return rc;
    uint64_t mine = 4 * (uint64_t)counts[g->rank];
    double t0 = ms_now_s();
    if (ms_comm_st.fixed_order && n > 2) {
        if ((rc = fixed_sum(g, op, send, counts, recv, e))) return rc;
        ms_comm_stats_add(g, MS_COMM_REDUCE_SCATTER, 4 * (uint64_t)total,
                          4 * sum_except(counts, n, g->rank), mine * (uint64_t)(n - 1),
                          ms_now_s() - t0);
        return 0;
    }
    MPI_Request req;
    int mrc = MPI_Ireduce_scatter(send, recv, g->priv->ia, MPI_FLOAT, MPI_SUM, g->priv->comm, &req);
    return finish(g, &req, mrc, op, (size_t)mine, MS_COMM_REDUCE_SCATTER, 4 * (uint64_t)total,
                  4 * sum_except(counts, n, g->rank), mine * (uint64_t)(n - 1), t0, e);
}

int ms_comm_alltoallv(ms_group *g, enum ms_comm_kind kind, const void *send,
                      const size_t *send_bytes, const size_t *send_displs, void *recv,
                      const size_t *recv_bytes, const size_t *recv_displs, ms_errbuf *e)
{
    const char *op = kind == MS_COMM_A2A_COMBINE ? "alltoallv (combine)" : "alltoallv (dispatch)";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    if (kind != MS_COMM_A2A_DISPATCH && kind != MS_COMM_A2A_COMBINE)
        return ms_err(e, MS_EINVAL, "alltoallv: kind must be dispatch or combine");
    struct ms_group_priv *p = g->priv;
    int n = g->size;
    size_t st = 0, rt = 0;
    if ((rc = packed(g, op, send_bytes, send_displs ? NULL : p->sa, &st, e)) ||
        (rc = packed(g, op, recv_bytes, recv_displs ? NULL : p->sb, &rt, e)))
        return rc;
    if (!send_displs) send_displs = p->sa;
    if (!recv_displs) recv_displs = p->sb;
    int u = unit_for(or_of(send_bytes, n) | or_of(send_displs, n) | or_of(recv_bytes, n) |
                     or_of(recv_displs, n));
    size_t ub = ms_comm_st.unit_bytes[u];
    if ((rc = to_int(g, op, send_bytes, p->ia, n, ub, e)) ||
        (rc = to_int(g, op, send_displs, p->ib, n, ub, e)) ||
        (rc = to_int(g, op, recv_bytes, p->ic, n, ub, e)) ||
        (rc = to_int(g, op, recv_displs, p->id, n, ub, e)))
        return rc;
    double t0 = ms_now_s();
    MPI_Request req;
    int mrc = MPI_Ialltoallv(send, p->ia, p->ib, ms_comm_st.units[u], recv, p->ic, p->id,
                             ms_comm_st.units[u], p->comm, &req);
    return finish(g, &req, mrc, op, st, kind, st, sum_except(send_bytes, n, g->rank),
                  sum_except(recv_bytes, n, g->rank), t0, e);
}

/* Broadcast without accounting (the control protocol counts its own bytes). */
static int bcast_raw(ms_group *g, const char *op, void *buf, size_t bytes, int root, ms_errbuf *e)
{
    int u = unit_for(bytes);
    size_t ub = ms_comm_st.unit_bytes[u];
    if (bytes / ub > INT_MAX)
        return ms_err(e, MS_ETOOBIG, "%s on group '%s': %zu bytes exceed MPI's count limit", op,
                      g->name, bytes);
    MPI_Request req;
    int mrc = MPI_Ibcast(buf, (int)(bytes / ub), ms_comm_st.units[u], root, g->priv->comm, &req);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, op, e);
    return ms_comm_wait(g, &req, 1, true, op, bytes, e);
}

int ms_comm_bcast(ms_group *g, void *buf, size_t bytes, int root, ms_errbuf *e)
{
    const char *op = "bcast";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    if (root < 0 || root >= g->size)
        return ms_err(e, MS_EINVAL, "%s on group '%s': root %d out of range (size %d)", op, g->name,
                      root, g->size);
    double t0 = ms_now_s();
    if ((rc = bcast_raw(g, op, buf, bytes, root, e))) return rc;
    uint64_t b = bytes, n1 = (uint64_t)(g->size - 1);
    bool is_root = g->rank == root;
    ms_comm_stats_add(g, MS_COMM_BCAST, b, is_root ? b * n1 : 0, is_root ? 0 : b, ms_now_s() - t0);
    return 0;
}

int ms_comm_gatherv(ms_group *g, const void *send, size_t send_bytes, void *recv,
                    const size_t *recv_bytes, const size_t *recv_displs, int root, ms_errbuf *e)
{
    const char *op = "gatherv";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    struct ms_group_priv *p = g->priv;
    int n = g->size;
    if (root < 0 || root >= n)
        return ms_err(e, MS_EINVAL, "%s on group '%s': root %d out of range (size %d)", op, g->name,
                      root, n);
    bool is_root = g->rank == root;
    size_t or_all = send_bytes, total = 0;
    if (is_root) {
        if (recv_bytes[root] != send_bytes)
            return ms_err(e, MS_EINVAL,
                          "%s on group '%s': root sends %zu bytes but expects %zu "
                          "from itself",
                          op, g->name, send_bytes, recv_bytes[root]);
        if ((rc = packed(g, op, recv_bytes, recv_displs ? NULL : p->sb, &total, e))) return rc;
        if (!recv_displs) recv_displs = p->sb;
        or_all |= or_of(recv_bytes, n) | or_of(recv_displs, n);
    }
    int u = unit_for(or_all);
    size_t ub = ms_comm_st.unit_bytes[u];
    if (send_bytes / ub > INT_MAX)
        return ms_err(e, MS_ETOOBIG, "%s on group '%s': %zu bytes exceed MPI's count limit", op,
                      g->name, send_bytes);
    if (is_root && ((rc = to_int(g, op, recv_bytes, p->ia, n, ub, e)) ||
                    (rc = to_int(g, op, recv_displs, p->ib, n, ub, e))))
        return rc;
    double t0 = ms_now_s();
    MPI_Request req;
    int mrc = MPI_Igatherv(send, (int)(send_bytes / ub), ms_comm_st.units[u], recv,
                           is_root ? p->ia : NULL, is_root ? p->ib : NULL, ms_comm_st.units[u],
                           root, p->comm, &req);
    return finish(g, &req, mrc, op, send_bytes, MS_COMM_GATHER, send_bytes,
                  is_root ? 0 : send_bytes, is_root ? sum_except(recv_bytes, n, root) : 0, t0, e);
}

int ms_comm_gather(ms_group *g, const void *send, size_t bytes, void *recv, int root, ms_errbuf *e)
{
    const char *op = "gather";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    if (root < 0 || root >= g->size)
        return ms_err(e, MS_EINVAL, "%s on group '%s': root %d out of range (size %d)", op, g->name,
                      root, g->size);
    int u = unit_for(bytes);
    size_t ub = ms_comm_st.unit_bytes[u], total;
    if (bytes / ub > INT_MAX || !ms_mul_size(bytes, (size_t)g->size, &total))
        return ms_err(e, MS_ETOOBIG, "%s on group '%s': %zu bytes per rank is too large", op,
                      g->name, bytes);
    bool is_root = g->rank == root;
    double t0 = ms_now_s();
    MPI_Request req;
    int cnt = (int)(bytes / ub);
    int mrc = MPI_Igather(send, cnt, ms_comm_st.units[u], recv, cnt, ms_comm_st.units[u], root,
                          g->priv->comm, &req);
    uint64_t b = bytes;
    return finish(g, &req, mrc, op, bytes, MS_COMM_GATHER, b, is_root ? 0 : b,
                  is_root ? b * (uint64_t)(g->size - 1) : 0, t0, e);
}

int ms_comm_barrier(ms_group *g, ms_errbuf *e)
{
    int rc = ms_comm_check(g, "barrier", e);
    if (rc) return rc;
    MPI_Request req;
    int mrc = MPI_Ibarrier(g->priv->comm, &req);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, "barrier", e);
    return ms_comm_wait(g, &req, 1, true, "barrier", 0, e);
}

int ms_comm_exchange(ms_group *g, const ms_comm_p2p *ops, int n, ms_errbuf *e)
{
    const char *op = "exchange (p2p)";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    if (n <= 0) return 0;
    MPI_Request *req = calloc((size_t)n, sizeof *req);
    if (!req) return ms_err(e, MS_ENOMEM, "out of memory in %s", op);
    uint64_t sent = 0, recv = 0;
    size_t total = 0;
    double t0 = ms_now_s();
    int posted = 0;
    for (; posted < n; posted++) {
        const ms_comm_p2p *o = &ops[posted];
        if (o->peer < 0 || o->peer >= g->size || o->peer == g->rank || o->bytes > INT_MAX) {
            rc = ms_err(e, MS_EINVAL, "%s: op %d: peer %d of %d (self: %d), %zu bytes", op, posted,
                        o->peer, g->size, g->rank, o->bytes);
            break;
        }
        int mrc = o->is_recv ? MPI_Irecv(o->buf, (int)o->bytes, MPI_BYTE, o->peer, P2P_TAG,
                                         g->priv->comm, &req[posted])
                             : MPI_Isend(o->buf, (int)o->bytes, MPI_BYTE, o->peer, P2P_TAG,
                                         g->priv->comm, &req[posted]);
        if (mrc != MPI_SUCCESS) {
            rc = ms_comm_mpi_fail(g, mrc, op, e);
            break;
        }
        *(o->is_recv ? &recv : &sent) += o->bytes;
        total += o->bytes;
    }
    if (!rc)
        rc = ms_comm_wait(g, req, n, true, op, total, e);
    else if (posted > 0)
        ms_comm_mark_broken(g, "an exchange failed with transfers posted");
    if (!rc) ms_comm_stats_add(g, MS_COMM_P2P, sent, sent, recv, ms_now_s() - t0);
    free(req);
    return rc;
}

/* ---- control blocks --------------------------------------------------------------------- */

int ms_comm_ctrl_send(ms_group *g, const void *body, size_t bytes, ms_errbuf *e)
{
    const char *op = "control send";
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    struct ms_group_priv *p = g->priv;
    if (g->rank != 0)
        return ms_err(e, MS_EINVAL, "%s on group '%s': only rank 0 sends control blocks", op,
                      g->name);
    if (bytes > MS_COMM_CTRL_MAX_BYTES)
        return ms_err(e, MS_ETOOBIG,
                      "%s on group '%s': control block of %zu bytes exceeds the "
                      "limit of %zu",
                      op, g->name, bytes, MS_COMM_CTRL_MAX_BYTES);
    double t0 = ms_now_s();
    unsigned char *hdr = ms_comm_st.ctrl_hdr + CTRL_HDR_BYTES + MS_COMM_CTRL_INLINE; /* send half */
    uint64_t h[2] = {++p->ctrl_seq, bytes};
    memcpy(hdr, h, sizeof h);
    size_t inl = MS_MIN(bytes, (size_t)MS_COMM_CTRL_INLINE);
    if (inl) memcpy(hdr + CTRL_HDR_BYTES, body, inl);
    for (int i = 1; i < g->size; i++) {
        int mrc = MPI_Isend(hdr, (int)(CTRL_HDR_BYTES + inl), MPI_BYTE, i, CTRL_TAG, p->comm,
                            &p->reqs[i - 1]);
        if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, op, e);
    }
    if (g->size > 1 && (rc = ms_comm_wait(g, p->reqs, g->size - 1, true, op, bytes, e))) return rc;
    if (bytes > inl && (rc = bcast_raw(g, "control body", (unsigned char *)(uintptr_t)body + inl,
                                       bytes - inl, 0, e)))
        return rc;
    uint64_t b = bytes;
    ms_comm_stats_add(g, MS_COMM_BCAST, b, b * (uint64_t)(g->size - 1), 0, ms_now_s() - t0);
    return 0;
}

int ms_comm_ctrl_recv(ms_group *g, const void **body, size_t *bytes, ms_errbuf *e)
{
    const char *op = "control wait";
    *body = NULL;
    *bytes = 0;
    int rc = ms_comm_check(g, op, e);
    if (rc) return rc;
    struct ms_group_priv *p = g->priv;
    if (g->rank == 0)
        return ms_err(e, MS_EINVAL,
                      "%s on group '%s': rank 0 sends control blocks, it does not "
                      "wait for them",
                      op, g->name);
    unsigned char *hdr = ms_comm_st.ctrl_hdr; /* receive half */
    MPI_Request req;
    int mrc =
        MPI_Irecv(hdr, CTRL_HDR_BYTES + MS_COMM_CTRL_INLINE, MPI_BYTE, 0, CTRL_TAG, p->comm, &req);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, op, e);
    if ((rc = ms_comm_wait(g, &req, 1, false, op, 0, e))) return rc; /* idle: no deadline */
    double t_hdr = ms_now_s();
    uint64_t h[2];
    memcpy(h, hdr, sizeof h);
    if (h[0] != p->ctrl_seq + 1 || h[1] > MS_COMM_CTRL_MAX_BYTES) {
        ms_err(e, MS_ECOMM,
               "%s on group '%s': bad control header (seq %llu, expected %llu, "
               "%llu bytes)",
               op, g->name, (unsigned long long)h[0], (unsigned long long)(p->ctrl_seq + 1),
               (unsigned long long)h[1]);
        ms_comm_mark_broken(g, "bad control header");
        return MS_ECOMM;
    }
    p->ctrl_seq = h[0];
    size_t n = (size_t)h[1];
    if (n + 1 > ms_comm_st.ctrl_body_cap) {
        unsigned char *nb = realloc(ms_comm_st.ctrl_body, n + 1);
        if (!nb) return ms_err(e, MS_ENOMEM, "%s: out of memory for a %zu-byte block", op, n);
        ms_comm_st.ctrl_body = nb;
        ms_comm_st.ctrl_body_cap = n + 1;
    }
    size_t inl = MS_MIN(n, (size_t)MS_COMM_CTRL_INLINE);
    memcpy(ms_comm_st.ctrl_body, hdr + CTRL_HDR_BYTES, inl);
    if (n > inl && (rc = bcast_raw(g, "control body", ms_comm_st.ctrl_body + inl, n - inl, 0, e)))
        return rc;
    ms_comm_stats_add(g, MS_COMM_BCAST, n, 0, n, ms_now_s() - t_hdr);
    *body = ms_comm_st.ctrl_body;
    *bytes = n;
    return 0;
}
