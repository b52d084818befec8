/* comm_shm.c — the all-reduce of a group whose members all run on this host, through one
 * shared-memory segment instead of MPI (Open MPI 4.1's non-blocking Iallreduce over the vader
 * BTL took ~3.4 ms per MiB here, libnbc's rounds each waiting for a progress call).
 *
 * Owns: setting the segment up when a group is made (ms_comm_shm_setup, collective over the
 * group, with the collectives' deadline), the all-reduce through it, and unmapping it.
 * Does not own waiting (ms_comm_wait_poll in comm.c: the same spin-then-sleep, liveness and
 * deadline as every MPI call, so a dead or late peer is reported the same way) nor accounting.
 *
 * Segment: a POSIX shm object made by group rank 0, opened by the others, unlinked once all
 * have mapped it (nothing stays in /dev/shm, even after a crash).  Rank r's region (stride
 * bytes): a 64-byte line holding seq (calls completed by r on this group, atomic), then two
 * slots of SLOT_FLOATS floats (call k uses slot k & 1).
 *
 * One call (per chunk of at most SLOT_FLOATS floats): k = ++seq; copy the chunk into my slot
 * k & 1; store seq = k (release); wait until every member's seq >= k (acquire); every member
 * sums the slots in rank order, ((s0 + s1) + s2) + ..., into its buffer, so every member gets
 * the same bits, the sums are in rank order at every size (what --enable-deterministic-inference
 * asks for), and for two ranks they equal MPI_SUM's.  Reusing slot k & 1 at call k + 2 is safe
 * without a second barrier: a member reaching call k + 2 waited at call k + 1 for every member to
 * publish k + 1, i.e. to have finished reading call k.
 * Off when the group spans hosts, when shm_open/fallocate fail (falls back to MPI, logged), or
 * unless MOESERVE_COMM_SHM=1 (ms_comm_opts.shm; off by default: bench/HISTORY.md).  Main thread
 * only, like comm.c.
 */
#include "parallel/comm_priv.h"

#include "base/log.h"
#include "base/util.h"

#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SLOT_FLOATS ((size_t)1 << 18) /* 1 MiB per slot: one decode step of 256 rows × 1024 */
#define LINE        64
#define NAME_MAX_B  64

struct ms_comm_shm {
    unsigned char *base; /* the mapping */
    size_t map_bytes;
    size_t stride; /* bytes per member: LINE + 2 slots */
    uint64_t seq;  /* calls made on this group (this member's published count) */
    uint64_t want; /* the call being waited for */
    int n;
};

static _Atomic uint64_t *seq_of(const struct ms_comm_shm *s, int r)
{
    return (_Atomic uint64_t *)(void *)(s->base + (size_t)r * s->stride);
}

static float *slot_of(const struct ms_comm_shm *s, int r, uint64_t k)
{
    return (float *)(void *)(s->base + (size_t)r * s->stride + LINE +
                             (size_t)(k & 1) * SLOT_FLOATS * sizeof(float));
}

void ms_comm_shm_free(ms_group *g)
{
    struct ms_comm_shm *s = g && g->priv ? g->priv->shm : NULL;
    if (!s) return;
    munmap(s->base, s->map_bytes);
    free(s);
    g->priv->shm = NULL;
}

bool ms_comm_shm_group(const ms_group *g)
{
    return g && g->priv && g->priv->shm;
}

void ms_comm_shm_bypass(bool on)
{
    ms_comm_st.shm_bypass = on;
}

/* Every member of g on this host (same host key: hostname, pid namespace, boot id). */
static bool one_host(const ms_group *g)
{
    const struct ms_comm_state *st = &ms_comm_st;
    if (!st->peers_known) return false;
    uint64_t mine = st->peers[st->world_rank].host_key;
    for (int i = 0; i < g->size; i++)
        if (st->peers[g->priv->world_ranks[i]].host_key != mine) return false;
    return true;
}

static int map_fd(int fd, size_t bytes, unsigned char **out)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return -1;
    *out = p;
    return 0;
}

int ms_comm_shm_setup(ms_group *g, ms_errbuf *e)
{
    static unsigned serial;
    if (!ms_comm_st.opts.shm || g->size < 2 || !one_host(g)) return 0;
    /* every member computes the same answer so far: all go on, or none */
    struct ms_group_priv *p = g->priv;
    size_t stride = LINE + 2 * SLOT_FLOATS * sizeof(float), bytes = stride * (size_t)g->size;
    char name[NAME_MAX_B] = "";
    int fd = -1, rc;
    unsigned char *base = NULL;
    if (g->rank == 0) {
        snprintf(name, sizeof name, "/moeserve-%d-%u-%s", (int)getpid(), serial++, g->name);
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        /* fallocate, not ftruncate: a full /dev/shm fails here, not as SIGBUS on first touch */
        int err = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
        if (!err && map_fd(fd, bytes, &base)) err = errno;
        if (err) {
            MS_LOG(MS_INFO, "comm", "group '%s': no shared-memory all-reduce (%s): using MPI",
                   g->name, strerror(err));
            if (fd >= 0) shm_unlink(name);
            name[0] = 0;
        }
    }
    MPI_Request req;
    int mrc = MPI_Ibcast(name, NAME_MAX_B, MPI_CHAR, 0, p->comm, &req);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, "shm setup (name)", e);
    if ((rc = ms_comm_wait(g, &req, 1, true, "shm setup (name)", NAME_MAX_B, e))) return rc;
    if (!name[0]) {
        if (fd >= 0) close(fd);
        return 0;
    }
    if (g->rank != 0) {
        fd = shm_open(name, O_RDWR, 0600);
        if (fd < 0 || map_fd(fd, bytes, &base)) base = NULL;
    }
    if (fd >= 0) close(fd);
    int ok = base != NULL, all_ok = 0;
    mrc = MPI_Iallreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, p->comm, &req);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(g, mrc, "shm setup (agree)", e);
    rc = ms_comm_wait(g, &req, 1, true, "shm setup (agree)", sizeof ok, e);
    if (g->rank == 0) shm_unlink(name); /* every member has mapped it, or given up */
    if (rc || !all_ok) {
        if (base) munmap(base, bytes);
        if (!rc)
            MS_LOG(MS_INFO, "comm", "group '%s': a member could not map %s: using MPI", g->name,
                   name);
        return rc;
    }
    struct ms_comm_shm *s = calloc(1, sizeof *s);
    if (!s) {
        munmap(base, bytes);
        return ms_err(e, MS_ENOMEM, "out of memory setting up group '%s'", g->name);
    }
    *s = (struct ms_comm_shm){.base = base, .map_bytes = bytes, .stride = stride, .n = g->size};
    /* the segment is zero-filled: every seq starts at 0 */
    p->shm = s;
    MS_LOG(MS_DEBUG, "comm", "group '%s': shared-memory all-reduce over %d ranks (%zu MiB)",
           g->name, g->size, bytes >> 20);
    return 0;
}

static int poll_seq(void *ctx, int *done)
{
    const struct ms_comm_shm *s = ctx;
    *done = 0;
    for (int r = 0; r < s->n; r++)
        if (atomic_load_explicit(seq_of(s, r), memory_order_acquire) < s->want) {
            CPU_RELAX();
            sched_yield(); /* as Open MPI's MPI_Test when oversubscribed: the peer may be
                            * waiting for this core */
            return MPI_SUCCESS;
        }
    *done = 1;
    return MPI_SUCCESS;
}

int ms_comm_shm_allreduce(ms_group *g, float *buf, size_t count, const char *op, ms_errbuf *e)
{
    struct ms_comm_shm *s = g->priv->shm;
    int n = s->n, me = g->rank;
    for (size_t off = 0; off < count; off += SLOT_FLOATS) {
        size_t m = MS_MIN(SLOT_FLOATS, count - off);
        uint64_t k = s->seq + 1;
        memcpy(slot_of(s, me, k), buf + off, m * sizeof(float));
        atomic_store_explicit(seq_of(s, me), k, memory_order_release);
        s->seq = k;
        s->want = k;
        int rc = ms_comm_wait_poll(g, poll_seq, s, true, op, count * sizeof(float), e);
        if (rc) return rc;
        float *y = buf + off;
        const float *a = slot_of(s, 0, k), *b = slot_of(s, 1, k);
        for (size_t i = 0; i < m; i++) y[i] = a[i] + b[i];
        for (int r = 2; r < n; r++) {
            const float *c = slot_of(s, r, k);
            for (size_t i = 0; i < m; i++) y[i] += c[i];
        }
    }
    return 0;
}
