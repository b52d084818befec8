/* cmd_comm_check.c — `moeserve comm-check`: checks and measures the communication layer on the
 * ranks it runs on (like nccl-tests for this engine); tests/t_comm.sh drives it.
 *
 * Modes (--mode): collectives (default: every collective at awkward sizes against a computed
 * expectation, the standard groups, control blocks, byte accounting), hello, timeout (the last
 * rank skips a collective), kill (a rank SIGKILLs itself mid-run), kill-idle (rank 0 dies while
 * the others wait idle), idle (CPU use and wake latency of the idle wait), bench (latencies),
 * order (the sums' bits against the rank-order sum, --fixed-order 0 and 1; prints ORDER lines).
 * --fixed-order 1 runs the mode with ms_comm_set_fixed_order on.
 * Started without mpirun and --np > 1 it relaunches itself under mpirun.  Main thread only.
 */
#include "parallel/comm.h"
#include "tools/commands.h"

#include "base/util.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static int n_pass, n_fail, me;

#define CK(cond, ...)                                                                              \
    do {                                                                                           \
        if (cond) {                                                                                \
            n_pass++;                                                                              \
        } else {                                                                                   \
            n_fail++;                                                                              \
            fprintf(stderr, "comm-check rank %d: FAIL %s:%d: ", me, __FILE__, __LINE__);           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define CKRC(call)                                                                                 \
    do {                                                                                           \
        ms_errbuf ck_e = {""};                                                                     \
        int ck_rc = (call);                                                                        \
        CK(ck_rc == 0, "%s -> %s: %s", #call, ms_strerror(ck_rc), ck_e.msg);                       \
        if (ck_rc) return;                                                                         \
    } while (0)
/* CKRC calls pass &ck_e as their error buffer */

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* ---- collectives mode ------------------------------------------------------------------- */

static unsigned char a2a_byte(int from, int to, size_t i);

static float val(int r, size_t j)
{
    return (float)(r * 100000 + (int)(j % 99991));
}

static void check_allreduce(ms_group *g)
{
    static const size_t sizes[] = {0, 1, 7, 1023, 65537, 300001};
    int n = g->size;
    for (size_t s = 0; s < MS_ARRAY_LEN(sizes); s++) {
        size_t c = sizes[s];
        float *b = malloc((c + 1) * sizeof *b);
        for (size_t i = 0; i < c; i++) b[i] = (float)(g->rank + 1) + (float)(i % 7);
        CKRC(ms_comm_allreduce_f32(g, b, c, &ck_e));
        size_t bad = 0;
        for (size_t i = 0; i < c; i++)
            if (b[i] != (float)(n * (n + 1) / 2) + (float)(n * (int)(i % 7))) bad++;
        CK(bad == 0, "allreduce %zu floats on %s: %zu wrong", c, g->name, bad);
        free(b);
    }
}

static float oval(int r, size_t j);

/* The all-reduce's own paths against MPI_Iallreduce (ms_comm_shm_bypass) on the same data:
 * the shared-memory one (groups on one host, MOESERVE_COMM_SHM=1) and the two-rank exchange
 * (ms_comm_opts.pair).  Values of mixed magnitudes and signs so the grouping shows, sizes
 * across the segment's 2^18-float chunks and the batch-32 layer (32768), and the ranks entering
 * at different times.  Two ranks: the bits of MPI_SUM; more: the bits of the rank-order sum
 * ((v0 + v1) + v2) + ..., and MPI's within rounding. */
static void check_allreduce_paths(ms_group *g, bool shm_wanted)
{
    static const size_t sizes[] = {1, 5, 1023, 32768, 262144, 300001, 600000};
    int n = g->size;
    if (shm_wanted && !ms_comm_shm_group(g))
        CK(n == 1, "group '%s' of %d ranks on one host has no shared-memory all-reduce", g->name,
           n);
    if (!ms_comm_shm_group(g) && n != 2) return; /* MPI's own: nothing to compare */
    for (size_t s = 0; s < MS_ARRAY_LEN(sizes); s++) {
        size_t c = sizes[s], bad_bits = 0, bad_mpi = 0, bad_order = 0;
        float *a = malloc(c * sizeof *a), *b = malloc(c * sizeof *b);
        if (!a || !b) abort();
        for (size_t j = 0; j < c; j++) a[j] = b[j] = oval(g->rank + 7 * (int)s, j);
        if (s % 2 && g->rank == n - 1) sleep_s(2e-3); /* a late member */
        CKRC(ms_comm_allreduce_f32(g, a, c, &ck_e));
        ms_comm_shm_bypass(true);
        ms_errbuf e = {""};
        int rc = ms_comm_allreduce_f32(g, b, c, &e);
        ms_comm_shm_bypass(false);
        CK(rc == 0, "MPI all-reduce: %s", e.msg);
        if (rc) return;
        for (size_t j = 0; j < c; j++) {
            float want = oval(7 * (int)s, j), mag = fabsf(want);
            for (int q = 1; q < n; q++) {
                float v = oval(q + 7 * (int)s, j);
                want += v;
                mag += fabsf(v);
            }
            bad_order += memcmp(&want, &a[j], 4) != 0;
            bad_bits += memcmp(&a[j], &b[j], 4) != 0;
            bad_mpi += !(fabsf(a[j] - b[j]) <= 1e-6f * mag);
        }
        const char *path = ms_comm_shm_group(g) ? "shm" : "two-rank";
        CK(bad_order == 0, "%s all-reduce of %zu floats on %s: %zu sums not in rank order", path, c,
           g->name, bad_order);
        if (n == 2)
            CK(bad_bits == 0, "%s all-reduce of %zu floats on %s: %zu differ from MPI_SUM's bits",
               path, c, g->name, bad_bits);
        CK(bad_mpi == 0, "%s all-reduce of %zu floats on %s: %zu beyond MPI_SUM's rounding", path,
           c, g->name, bad_mpi);
        free(a);
        free(b);
    }
}

/* rows per rank for pattern p: includes ranks with 0 rows (idle participants) */
static size_t rows_of(int p, int r, int n)
{
    switch (p) {
    case 0:
        return r == 0 ? 5 : 0;
    case 1:
        return r == n - 1 ? 3 : 0;
    case 2:
        return (size_t)((r * 3 + 1) % 4);
    case 3:
        return 0;
    default:
        return (size_t)(r + 1) * 37;
    }
}

static void check_allgatherv(ms_group *g)
{
    int n = g->size;
    static const size_t widths[] = {7, 1024}; /* floats per row: unit 1 and unit 4096 paths */
    size_t counts[64], displs[64];
    for (size_t w = 0; w < MS_ARRAY_LEN(widths); w++)
        for (int p = 0; p < 5; p++)
            for (int gap = 0; gap < 2; gap++) {
                size_t off = 0;
                for (int r = 0; r < n; r++) {
                    counts[r] = rows_of(p, r, n) * widths[w];
                    displs[r] = off;
                    off += counts[r] + (size_t)gap * 3;
                }
                float *recv = calloc(off + 1, sizeof *recv);
                float *send = malloc((counts[g->rank] + 1) * sizeof *send);
                for (size_t j = 0; j < counts[g->rank]; j++) send[j] = val(g->rank, j);
                CKRC(ms_comm_allgatherv_f32(g, send, recv, counts, gap ? displs : NULL, &ck_e));
                size_t bad = 0;
                for (int r = 0; r < n; r++)
                    for (size_t j = 0; j < counts[r]; j++)
                        if (recv[displs[r] + j] != val(r, j)) bad++;
                CK(bad == 0, "allgatherv_f32 width %zu pattern %d gap %d: %zu wrong", widths[w], p,
                   gap, bad);
                /* in place: own block already in recv */
                memset(recv, 0, (off + 1) * sizeof *recv);
                memcpy(recv + displs[g->rank], send, counts[g->rank] * sizeof *send);
                CKRC(ms_comm_allgatherv_f32(g, NULL, recv, counts, displs, &ck_e));
                bad = 0;
                for (int r = 0; r < n; r++)
                    for (size_t j = 0; j < counts[r]; j++)
                        if (recv[displs[r] + j] != val(r, j)) bad++;
                CK(bad == 0, "allgatherv_f32 in place width %zu pattern %d: %zu wrong", widths[w],
                   p, bad);
                free(recv);
                free(send);
            }
    /* byte allgatherv with gaps between blocks (unit 1 and unit 256 paths) */
    for (size_t unit = 3; unit <= 768; unit *= 256) {
        size_t bc[64], bd[64], off = 0;
        for (int r = 0; r < n; r++) {
            bc[r] = rows_of(2, r, n) * unit;
            bd[r] = off + unit; /* one row of gap before each block */
            off = bd[r] + bc[r];
        }
        unsigned char *recv = calloc(off + 1, 1), *send = malloc(bc[g->rank] + 1);
        for (size_t j = 0; j < bc[g->rank]; j++) send[j] = a2a_byte(g->rank, 0, j);
        CKRC(ms_comm_allgatherv(g, send, recv, bc, bd, &ck_e));
        size_t bad = 0;
        for (int r = 0; r < n; r++)
            for (size_t j = 0; j < bc[r]; j++) bad += recv[bd[r] + j] != a2a_byte(r, 0, j);
        for (size_t j = 0; j < unit; j++) bad += recv[j] != 0; /* the gap stays untouched */
        CK(bad == 0, "allgatherv bytes, rows of %zu B with gaps: %zu wrong", unit, bad);
        free(recv);
        free(send);
    }
    /* fixed-size allgather, 3 bytes per rank, plus in place */
    unsigned char mine[3] = {(unsigned char)g->rank, 0xab, (unsigned char)(g->rank * 7)};
    unsigned char all[3 * 64];
    CKRC(ms_comm_allgather(g, mine, 3, all, &ck_e));
    int bad = 0;
    for (int r = 0; r < n; r++)
        if (all[3 * r] != r || all[3 * r + 1] != 0xab || all[3 * r + 2] != (unsigned char)(r * 7))
            bad++;
    CK(bad == 0, "allgather 3 bytes: %d ranks wrong", bad);
    memset(all, 0, sizeof all);
    memcpy(all + 3 * g->rank, mine, 3);
    CKRC(ms_comm_allgather(g, NULL, 3, all, &ck_e));
    CK(all[3 * (n - 1)] == n - 1 && all[1] == 0xab, "allgather in place");
}

static void check_reduce_scatter(ms_group *g)
{
    int n = g->size;
    size_t counts[64];
    for (int p = 0; p < 5; p++) {
        size_t total = 0, off = 0;
        for (int r = 0; r < n; r++) total += counts[r] = rows_of(p, r, n) * 13;
        for (int r = 0; r < g->rank; r++) off += counts[r];
        float *send = malloc((total + 1) * sizeof *send), *recv = malloc((counts[g->rank] + 1) * 4);
        for (size_t j = 0; j < total; j++) send[j] = (float)(g->rank + 1) + (float)(j % 5);
        CKRC(ms_comm_reduce_scatterv_f32(g, send, recv, counts, &ck_e));
        size_t bad = 0;
        for (size_t j = 0; j < counts[g->rank]; j++)
            if (recv[j] != (float)(n * (n + 1) / 2) + (float)(n * (int)((off + j) % 5))) bad++;
        CK(bad == 0, "reduce_scatterv pattern %d: %zu wrong", p, bad);
        free(send);
        free(recv);
    }
    static const size_t per[] = {0, 5, 4096};
    for (size_t s = 0; s < MS_ARRAY_LEN(per); s++) {
        size_t c = per[s];
        float *send = malloc((c * (size_t)n + 1) * 4), *recv = malloc((c + 1) * 4);
        for (size_t j = 0; j < c * (size_t)n; j++) send[j] = (float)g->rank + (float)(j % 3);
        CKRC(ms_comm_reduce_scatter_f32(g, send, recv, c, &ck_e));
        size_t bad = 0;
        for (size_t j = 0; j < c; j++)
            if (recv[j] != (float)(n * (n - 1) / 2) + (float)(n * (int)((c * g->rank + j) % 3)))
                bad++;
        CK(bad == 0, "reduce_scatter %zu per rank: %zu wrong", c, bad);
        free(send);
        free(recv);
    }
}

static unsigned char a2a_byte(int from, int to, size_t i)
{
    return (unsigned char)(from * 31 + to * 17 + (int)(i % 251));
}

static size_t a2a_rows(int from, int to, int n)
{
    return (size_t)((from * 7 + to * 3 + n) % 5);
}

static void check_alltoallv(ms_group *g)
{
    int n = g->size, r = g->rank;
    static const size_t row_bytes[] = {28, 14336};
    size_t sb[64], sd[64], rb[64], rd[64];
    for (size_t w = 0; w < MS_ARRAY_LEN(row_bytes); w++) {
        size_t st = 0, rt = 0;
        for (int j = 0; j < n; j++) {
            sb[j] = a2a_rows(r, j, n) * row_bytes[w];
            rb[j] = a2a_rows(j, r, n) * row_bytes[w];
            sd[j] = st;
            rd[j] = rt;
            st += sb[j];
            rt += rb[j];
        }
        unsigned char *send = malloc(st + 1), *recv = malloc(rt + 1), *back = malloc(st + 1);
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < sb[j]; i++) send[sd[j] + i] = a2a_byte(r, j, i);
        CKRC(ms_comm_alltoallv(g, MS_COMM_A2A_DISPATCH, send, sb, NULL, recv, rb, NULL, &ck_e));
        size_t bad = 0;
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < rb[j]; i++)
                if (recv[rd[j] + i] != a2a_byte(j, r, i)) bad++;
        CK(bad == 0, "alltoallv dispatch row %zu B: %zu wrong", row_bytes[w], bad);
        /* combine: send everything back; must reproduce send */
        memset(back, 0, st + 1);
        CKRC(ms_comm_alltoallv(g, MS_COMM_A2A_COMBINE, recv, rb, rd, back, sb, sd, &ck_e));
        CK(memcmp(back, send, st) == 0, "alltoallv combine row %zu B: round trip differs",
           row_bytes[w]);
        free(send);
        free(recv);
        free(back);
    }
}

static void check_bcast_gather(ms_group *g)
{
    int n = g->size;
    static const size_t sizes[] = {0, 5, 100000};
    for (size_t s = 0; s < MS_ARRAY_LEN(sizes); s++) {
        size_t b = sizes[s];
        unsigned char *buf = calloc(b + 1, 1);
        if (g->rank == n - 1)
            for (size_t i = 0; i < b; i++) buf[i] = (unsigned char)(i * 13 + 1);
        CKRC(ms_comm_bcast(g, buf, b, n - 1, &ck_e));
        size_t bad = 0;
        for (size_t i = 0; i < b; i++)
            if (buf[i] != (unsigned char)(i * 13 + 1)) bad++;
        CK(bad == 0, "bcast %zu bytes: %zu wrong", b, bad);
        free(buf);
    }
    for (int root = 0; root<n; root += n> 1 ? n - 1 : 1) {
        size_t rb[64], tot = 0;
        for (int j = 0; j < n; j++) tot += rb[j] = rows_of(2, j, n) * 9;
        unsigned char *send = malloc(rb[g->rank] + 1), *recv = calloc(tot + 1, 1);
        for (size_t i = 0; i < rb[g->rank]; i++) send[i] = a2a_byte(g->rank, root, i);
        CKRC(ms_comm_gatherv(g, send, rb[g->rank], recv, rb, NULL, root, &ck_e));
        if (g->rank == root) {
            size_t bad = 0, off = 0;
            for (int j = 0; j < n; j++)
                for (size_t i = 0; i < rb[j]; i++)
                    if (recv[off++] != a2a_byte(j, root, i)) bad++;
            CK(bad == 0, "gatherv to %d: %zu wrong", root, bad);
        }
        int v = g->rank * 3, all[64] = {0};
        CKRC(ms_comm_gather(g, &v, sizeof v, all, root, &ck_e));
        if (g->rank == root) {
            int bad = 0;
            for (int j = 0; j < n; j++) bad += all[j] != j * 3;
            CK(bad == 0, "gather to %d: %d wrong", root, bad);
        }
        free(send);
        free(recv);
    }
}

static void check_ctrl(ms_group *g)
{
    static const size_t sizes[] = {0, 100, MS_COMM_CTRL_INLINE, MS_COMM_CTRL_INLINE + 1, 100000};
    for (size_t s = 0; s < MS_ARRAY_LEN(sizes); s++) {
        size_t b = sizes[s];
        if (g->rank == 0) {
            unsigned char *buf = malloc(b + 1);
            for (size_t i = 0; i < b; i++) buf[i] = (unsigned char)(i * 7 + s);
            CKRC(ms_comm_ctrl_send(g, buf, b, &ck_e));
            free(buf);
        } else {
            const void *body;
            size_t got;
            CKRC(ms_comm_ctrl_recv(g, &body, &got, &ck_e));
            size_t bad = 0;
            for (size_t i = 0; i < got; i++)
                if (((const unsigned char *)body)[i] != (unsigned char)(i * 7 + s)) bad++;
            CK(got == b && bad == 0, "control block %zu bytes: got %zu, %zu wrong", b, got, bad);
        }
    }
}

/* Known calls under tag 11 on a fresh count; checks this rank's counters against the
 * definitions in comm_stats.c, and that Σ sent = Σ recv over the group for every kind. */
static void check_accounting(ms_group *g)
{
    int n = g->size, r = g->rank;
    ms_comm_stats_reset(g);
    CK(ms_comm_set_tag(MS_COMM_MAX_TAG + 1) == MS_EINVAL, "tag limit");
    CK(ms_comm_set_tag(11) == 0, "set tag");
    float buf[10] = {0};
    CKRC(ms_comm_allreduce_f32(g, buf, 10, &ck_e));
    size_t counts[64], tot = 0;
    for (int j = 0; j < n; j++) tot += counts[j] = (size_t)j * 2;
    float *all = calloc(tot + 1, 4);
    float *mine = calloc(counts[r] + 1, 4);
    CKRC(ms_comm_allgatherv_f32(g, mine, all, counts, NULL, &ck_e));
    float *rs = calloc(counts[r] + 1, 4);
    CKRC(ms_comm_reduce_scatterv_f32(g, all, rs, counts, &ck_e));
    size_t sb[64], rb[64];
    for (int j = 0; j < n; j++) {
        sb[j] = (size_t)(r + 2 * j + 1);
        rb[j] = (size_t)(j + 2 * r + 1);
    }
    unsigned char s8[1024] = {0}, r8[1024];
    CKRC(ms_comm_alltoallv(g, MS_COMM_A2A_DISPATCH, s8, sb, NULL, r8, rb, NULL, &ck_e));
    CKRC(ms_comm_bcast(g, s8, 100, 0, &ck_e));
    ms_comm_set_tag(MS_COMM_TAG_NONE);
    ms_comm_counter c;
    uint64_t n1 = (uint64_t)(n - 1);
    uint64_t b = 10 / (uint64_t)n + ((uint64_t)r < 10 % (uint64_t)n);
    ms_comm_stats_get(g, 11, MS_COMM_ALLREDUCE, &c);
    CK(c.n_calls == 1 && c.payload_bytes == 40 &&
           c.sent_bytes == (n > 1 ? 4 * (10 - b + b * n1) : 0),
       "allreduce bytes: calls %llu payload %llu sent %llu", (unsigned long long)c.n_calls,
       (unsigned long long)c.payload_bytes, (unsigned long long)c.sent_bytes);
    ms_comm_stats_get(g, 11, MS_COMM_ALLGATHER, &c);
    CK(c.sent_bytes == 4 * counts[r] * n1 && c.recv_bytes == 4 * (tot - counts[r]),
       "allgatherv bytes: sent %llu recv %llu", (unsigned long long)c.sent_bytes,
       (unsigned long long)c.recv_bytes);
    ms_comm_stats_get(g, 11, MS_COMM_REDUCE_SCATTER, &c);
    CK(c.payload_bytes == 4 * tot && c.sent_bytes == 4 * (tot - counts[r]) &&
           c.recv_bytes == 4 * counts[r] * n1,
       "reduce_scatterv bytes");
    uint64_t ss = 0, rr = 0;
    for (int j = 0; j < n; j++)
        if (j != r) ss += sb[j], rr += rb[j];
    ms_comm_stats_get(g, 11, MS_COMM_A2A_DISPATCH, &c);
    CK(c.n_calls == 1 && c.sent_bytes == ss && c.recv_bytes == rr,
       "alltoallv bytes: sent %llu "
       "(want %llu) recv %llu (want %llu)",
       (unsigned long long)c.sent_bytes, (unsigned long long)ss, (unsigned long long)c.recv_bytes,
       (unsigned long long)rr);
    ms_comm_stats_get(g, 11, MS_COMM_BCAST, &c);
    CK(c.sent_bytes == (r == 0 ? 100 * n1 : 0) && c.recv_bytes == (r == 0 ? 0 : 100),
       "bcast bytes");
    ms_comm_stats_get(g, MS_COMM_TAG_NONE, MS_COMM_A2A_DISPATCH, &c);
    CK(c.n_calls == 0, "untagged slot must be empty");
    /* group-wide conservation: Σ sent = Σ recv per kind */
    float sums[2 * MS_COMM_N_KINDS];
    for (int k = 0; k < MS_COMM_N_KINDS; k++) {
        ms_comm_stats_get(g, MS_COMM_TAG_ALL, (enum ms_comm_kind)k, &c);
        sums[2 * k] = (float)c.sent_bytes;
        sums[2 * k + 1] = (float)c.recv_bytes;
    }
    CKRC(ms_comm_allreduce_f32(g, sums, 2 * MS_COMM_N_KINDS, &ck_e));
    for (int k = 0; k < MS_COMM_N_KINDS; k++)
        CK(sums[2 * k] == sums[2 * k + 1], "kind %s: group sent %.0f != recv %.0f",
           ms_comm_kind_name((enum ms_comm_kind)k), sums[2 * k], sums[2 * k + 1]);
    free(all);
    free(mine);
    free(rs);
}

/* The groups of a layout with these sizes (pp 1, cp 1; moe_dp = tp / (ep · moe_tp)). */
static void check_groups(int tp, int attn_tp, int attn_dp, int moe_ep, int moe_tp, int dense_tp,
                         int n_replicas)
{
    ms_layout lay = {.tp = tp,
                     .pp = 1,
                     .n_replicas = n_replicas,
                     .attn_tp = attn_tp,
                     .attn_dp = attn_dp,
                     .attn_cp = 1,
                     .moe_tp = moe_tp,
                     .moe_ep = moe_ep,
                     .moe_dp = tp / (moe_ep * moe_tp),
                     .dense_tp = dense_tp,
                     .shared_tp = 1,
                     .world_size = tp * n_replicas};
    ms_comm_groups gs;
    CKRC(ms_comm_groups_init(&gs, &lay, &ck_e));
    ms_group *gl[MS_GROUP_N] = {gs.tp, gs.attn_tp, gs.moe_ep, gs.moe_tp, gs.dense, gs.dp};
    for (int k = 0; k < MS_GROUP_N; k++) {
        ms_group *g = gl[k];
        int bad = 0, first, stride, size;
        ms_layout_group_span(&lay, &gs.at, k, &first, &stride, &size);
        float sum = 0, want = 0;
        for (int i = 0; i < g->size; i++) {
            bad += ms_comm_group_world_rank(g, i) != first + i * stride;
            want += (float)(first + i * stride);
        }
        CK(bad == 0 && g->size == size, "group %s members", g->name);
        sum = (float)ms_comm_world_rank();
        CKRC(ms_comm_allreduce_f32(g, &sum, 1, &ck_e));
        CK(sum == want, "group %s: sum of world ranks %.0f, want %.0f", g->name, sum, want);
    }
    CK(gs.attn_tp->size == attn_tp && gs.moe_ep->size == moe_ep && gs.moe_tp->size == moe_tp &&
           gs.dp->size == n_replicas,
       "group sizes");
    CK(gs.at.attn_dp_rank == gs.at.tp_rank / attn_tp, "attn_dp_rank");
    ms_comm_groups_deinit(&gs);
}

static void mode_collectives(void)
{
    ms_group *w = ms_comm_world();
    int n = w->size;
    ms_group *halves = NULL, *odd = NULL;
    ms_errbuf e;
    CK(ms_comm_split(w, w->rank % 2, -w->rank, "halves", &halves, &e) == 0, "split: %s", e.msg);
    CK(ms_comm_split(w, w->rank == 0 ? -1 : 0, 0, "no_rank0", &odd, &e) == 0, "split: %s", e.msg);
    CK(w->rank == 0 ? odd == NULL : (odd && odd->size == n - 1), "color -1 leaves rank 0 out");
    ms_group *gl[3] = {w, halves, odd};
    for (int k = 0; k < 3; k++) {
        ms_group *g = gl[k];
        if (!g) continue;
        check_allreduce(g);
        check_allreduce_paths(g, ms_comm_shm_group(w)); /* shm on (one host), or two ranks */
        check_allgatherv(g);
        check_reduce_scatter(g);
        check_alltoallv(g);
        check_bcast_gather(g);
        check_ctrl(g);
    }
    if (halves && halves->size > 1)
        CK(ms_comm_group_world_rank(halves, 0) > ms_comm_group_world_rank(halves, 1),
           "split key orders members (descending world rank)");
    check_accounting(w);
    check_groups(n, 1, n, n, 1, 1, 1);
    if (n == 4) {
        check_groups(4, 2, 2, 2, 2, 1, 1);
        check_groups(2, 1, 2, 2, 1, 2, 2);
        check_groups(4, 4, 1, 1, 2, 4, 1);
    }
    ms_comm_group_free(halves);
    ms_comm_group_free(odd);
}

/* ---- order mode ------------------------------------------------------------------------- */

/* Rank r's value j: magnitudes 2^-20 .. 2^20 and both signs, so the grouping of a sum shows. */
static float oval(int r, size_t j)
{
    uint64_t st = ((uint64_t)r << 40) ^ j, x = ms_rng_next(&st);
    float m = (float)(x & 0xffffff) / (float)(1 << 24) + 0.5f;
    return ldexpf((x >> 24) & 1 ? -m : m, (int)((x >> 25) % 41) - 20);
}

/* Elements of the world's all-reduce, reduce-scatter and reduce-scatterv (at sizes where MPI
 * may pick different algorithms) whose bits differ from ((v0 + v1) + v2) + ...; one ORDER line
 * per rank with the counts.  With --fixed-order 1 each count must be 0 (checked); with 0 the
 * counts say whether this MPI's order differs from the rank order at all. */
static void mode_order(bool fixed)
{
    ms_group *g = ms_comm_world();
    int n = g->size;
    static const size_t sizes[] = {1, 7, 1024, 65537, 300001};
    size_t diff_ar = 0, diff_rs = 0, diff_rsv = 0, size_dep = 0, prev_n = 0;
    float *prev = NULL; /* the previous size's all-reduce [prev_n] */
    for (size_t s = 0; s < MS_ARRAY_LEN(sizes); s++) {
        size_t c = sizes[s] * (size_t)n, blk = sizes[s];
        float *b = malloc(c * sizeof *b), *r = malloc(c * sizeof *r);
        size_t *cnt = malloc((size_t)n * sizeof *cnt);
        if (!b || !r || !cnt) abort();
        for (size_t j = 0; j < c; j++) b[j] = oval(g->rank, j);
        CKRC(ms_comm_reduce_scatter_f32(g, b, r, blk, &ck_e));
        for (size_t j = 0; j < blk; j++) {
            size_t e = (size_t)g->rank * blk + j;
            float want = oval(0, e);
            for (int q = 1; q < n; q++) want += oval(q, e);
            diff_rs += memcmp(&want, &r[j], 4) != 0;
        }
        size_t off = 0, mine_off = 0; /* uneven blocks: rank q gets (q + 1) · c / (n(n+1)/2) */
        for (int q = 0; q < n; q++) {
            cnt[q] = q == n - 1 ? c - off : c * (size_t)(q + 1) / (size_t)(n * (n + 1) / 2);
            if (q == g->rank) mine_off = off;
            off += cnt[q];
        }
        CKRC(ms_comm_reduce_scatterv_f32(g, b, r, cnt, &ck_e));
        for (size_t j = 0; j < cnt[g->rank]; j++) {
            float want = oval(0, mine_off + j);
            for (int q = 1; q < n; q++) want += oval(q, mine_off + j);
            diff_rsv += memcmp(&want, &r[j], 4) != 0;
        }
        CKRC(ms_comm_allreduce_f32(g, b, c, &ck_e));
        size_t d = 0;
        for (size_t j = 0; j < c; j++) {
            float want = oval(0, j);
            for (int q = 1; q < n; q++) want += oval(q, j);
            d += memcmp(&want, &b[j], 4) != 0;
        }
        diff_ar += d;
        size_t dp = 0; /* the first elements hold the same values at every size */
        for (size_t j = 0; j < MS_MIN(c, prev_n); j++) dp += memcmp(&prev[j], &b[j], 4) != 0;
        size_dep += dp;
        if (g->rank == 0)
            printf("ORDER allreduce of %zu floats: %zu not in rank order, %zu of the first %zu "
                   "unlike the previous size's\n",
                   c, d, dp, MS_MIN(c, prev_n));
        free(prev);
        prev = b, prev_n = c, b = NULL;
        free(b);
        free(r);
        free(cnt);
    }
    free(prev);
    printf("ORDER rank %d of %d fixed=%d: not in rank order: allreduce %zu, reduce_scatter %zu, "
           "reduce_scatterv %zu; allreduce sums that change with the size %zu\n",
           g->rank, n, fixed, diff_ar, diff_rs, diff_rsv, size_dep);
    if (!fixed && ms_comm_shm_group(g)) /* the shared-memory all-reduce is in rank order */
        CK(diff_ar + size_dep == 0,
           "shm all-reduce: %zu sums not in rank order, %zu change "
           "with the size",
           diff_ar, size_dep);
    if (fixed)
        CK(diff_ar + diff_rs + diff_rsv + size_dep == 0,
           "fixed order: %zu + %zu + %zu sums not in rank order, %zu change with the size", diff_ar,
           diff_rs, diff_rsv, size_dep);
}

/* ---- failure modes ---------------------------------------------------------------------- */

static int mode_timeout(void)
{
    ms_group *w = ms_comm_world();
    if (w->rank == w->size - 1) { /* skips the collective, stays alive */
        sleep_s(ms_comm_timeout() + 20);
        _exit(0);
    }
    float x[4] = {1, 2, 3, 4};
    ms_errbuf e = {""};
    double t0 = ms_now_s();
    ms_comm_set_tag(7);
    int rc = ms_comm_allreduce_f32(w, x, 4, &e);
    double el = ms_now_s() - t0;
    ms_errbuf e2 = {""};
    int rc2 = ms_comm_bcast(w, x, 4, 0, &e2);
    printf("TIMEOUT rank %d rc=%s elapsed=%.2f then=%s msg=%s | then: %s\n", w->rank,
           ms_strerror(rc), el, ms_strerror(rc2), e.msg, e2.msg);
    ms_errbuf e3 = {""};
    int rc3 = ms_comm_deinit(&e3); /* must refuse MPI_Finalize: a request is still pending */
    printf("DEINIT rank %d rc=%s msg=%s\n", me, ms_strerror(rc3), e3.msg); /* w is gone */
    fflush(stdout);
    sleep_s(0.3);
    _exit(rc == MS_ETIMEOUT && rc2 == MS_ECOMM && rc3 == MS_ECOMM ? 3 : 1);
}

static int mode_kill(bool idle)
{
    ms_group *w = ms_comm_world();
    int victim = idle ? 0 : w->size - 1;
    double t0 = ms_now_s();
    for (int it = 0;; it++) {
        if (w->rank == victim && it == 20) {
            printf("KILL rank %d pid %d kills itself at iteration %d\n", w->rank, (int)getpid(),
                   it);
            fflush(stdout);
            if (idle) sleep_s(0.5);
            kill(getpid(), SIGKILL);
        }
        ms_errbuf e = {""};
        int rc;
        if (w->rank == 0) {
            rc = ms_comm_ctrl_send(w, &it, sizeof it, &e);
        } else {
            const void *b;
            size_t nb;
            rc = ms_comm_ctrl_recv(w, &b, &nb, &e);
        }
        float x[256] = {0};
        if (!rc) rc = ms_comm_allreduce_f32(w, x, 256, &e);
        if (rc) {
            printf("KILL_DETECTED rank %d after %.2f s: %s: %s\n", w->rank, ms_now_s() - t0,
                   ms_strerror(rc), e.msg);
            fflush(stdout);
            _exit(4);
        }
    }
}

/* ---- measurements ----------------------------------------------------------------------- */

static void sort_d(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
}

/* Root sends N_IDLE blocks, each after sleeping idle_s / N_IDLE outside MPI, then N_LOAD blocks
 * 200 µs apart; the others report CPU use over the idle phase and send→receive latencies. */
static int mode_idle(double idle_s)
{
    enum { N_IDLE = 8, N_LOAD = 100 };
    ms_group *w = ms_comm_world();
    ms_errbuf e = {""};
    double msg[2], lat_idle[N_IDLE], lat[N_LOAD];
    /* baseline: what a bare 1 kHz nanosleep loop costs on this machine (VM timer wakes) */
    double bare_pct = 0;
    if (w->rank != 0) {
        double b0 = cpu_s(), bt = ms_now_s();
        while (ms_now_s() - bt < 0.5) sleep_s(1e-3);
        bare_pct = 100 * (cpu_s() - b0) / (ms_now_s() - bt);
    }
    if (ms_comm_barrier(w, &e)) goto fail;
    double c0 = cpu_s(), t0 = ms_now_s(), cpu_pct = 0;
    for (int k = 0; k < N_IDLE + N_LOAD; k++) {
        if (w->rank == 0) {
            if (k < N_IDLE) {
                sleep_s(idle_s / N_IDLE);
            } else {
                double until = ms_now_s() + 200e-6;
                while (ms_now_s() < until) {
                }
            }
            msg[0] = ms_now_s();
            if (ms_comm_ctrl_send(w, msg, sizeof msg, &e)) goto fail;
        } else {
            const void *b;
            size_t nb;
            if (ms_comm_ctrl_recv(w, &b, &nb, &e)) goto fail;
            double t = ms_now_s();
            memcpy(msg, b, sizeof msg);
            if (k < N_IDLE)
                lat_idle[k] = t - msg[0];
            else
                lat[k - N_IDLE] = t - msg[0];
            if (k == N_IDLE - 1) cpu_pct = 100 * (cpu_s() - c0) / (t - t0);
        }
    }
    double mine[5] = {0};
    if (w->rank != 0) {
        sort_d(lat_idle, N_IDLE);
        sort_d(lat, N_LOAD);
        mine[0] = cpu_pct;
        mine[1] = lat_idle[N_IDLE / 2] * 1e6;
        mine[2] = lat_idle[N_IDLE - 1] * 1e6;
        mine[3] = lat[N_LOAD / 2] * 1e6;
        mine[4] = bare_pct;
    }
    double all[5 * 64];
    if (ms_comm_gather(w, mine, sizeof mine, all, 0, &e)) goto fail;
    if (w->rank == 0)
        for (int r = 1; r < w->size; r++)
            printf("IDLE rank %d idle_s=%.1f cpu_pct=%.2f bare_sleep_loop_cpu_pct=%.2f "
                   "wake_idle_p50_us=%.0f wake_idle_max_us=%.0f wake_load_p50_us=%.1f\n",
                   r, idle_s, all[5 * r], all[5 * r + 4], all[5 * r + 1], all[5 * r + 2],
                   all[5 * r + 3]);
    return 0;
fail:
    fprintf(stderr, "comm-check rank %d: idle mode failed: %s\n", w->rank, e.msg);
    return 1;
}

typedef int (*bench_fn)(ms_group *g, unsigned char *a, unsigned char *b, size_t bytes,
                        ms_errbuf *e);

static int b_allreduce(ms_group *g, unsigned char *a, unsigned char *b, size_t bytes, ms_errbuf *e)
{
    (void)b;
    return ms_comm_allreduce_f32(g, (float *)(void *)a, bytes / 4, e);
}
static int b_allgather(ms_group *g, unsigned char *a, unsigned char *b, size_t bytes, ms_errbuf *e)
{
    return ms_comm_allgather(g, a, bytes, b, e);
}
static int b_rs(ms_group *g, unsigned char *a, unsigned char *b, size_t bytes, ms_errbuf *e)
{
    return ms_comm_reduce_scatter_f32(g, (float *)(void *)a, (float *)(void *)b,
                                      bytes / 4 / (size_t)g->size, e);
}
static int b_a2a(ms_group *g, unsigned char *a, unsigned char *b, size_t bytes, ms_errbuf *e)
{
    size_t c[64];
    for (int i = 0; i < g->size; i++) c[i] = bytes / (size_t)g->size;
    return ms_comm_alltoallv(g, MS_COMM_A2A_DISPATCH, a, c, NULL, b, c, NULL, e);
}
static int b_bcast(ms_group *g, unsigned char *a, unsigned char *b, size_t bytes, ms_errbuf *e)
{
    (void)b;
    return ms_comm_bcast(g, a, bytes, 0, e);
}

static int mode_bench(int iters)
{
    ms_group *w = ms_comm_world();
    const size_t big = 1 << 20;
    unsigned char *a = calloc(big * 2, 1), *b = calloc(big * (size_t)w->size * 2, 1);
    static const struct {
        const char *name;
        bench_fn fn;
        size_t bytes;
    } cases[] = {
        {"allreduce_f32", b_allreduce, 8},
        {"allreduce_f32", b_allreduce, 14336},
        {"allreduce_f32", b_allreduce, 131072}, /* one batch-32 decode layer of small-v3 */
        {"allreduce_f32", b_allreduce, 1 << 20},
        {"allgather", b_allgather, 1 << 20},
        {"allgather", b_allgather, 1 << 18},
        {"reduce_scatter_f32", b_rs, 1 << 20},
        {"alltoallv", b_a2a, 1 << 20},
        {"bcast", b_bcast, 8},
        {"bcast", b_bcast, 1 << 20},
    };
    ms_errbuf e = {""};
    for (size_t k = 0; k < MS_ARRAY_LEN(cases); k++) {
        int n_it = cases[k].bytes >= 1 << 18 ? iters / 4 + 1 : iters;
        for (int i = 0; i < 5; i++)
            if (cases[k].fn(w, a, b, cases[k].bytes, &e)) goto fail;
        if (ms_comm_barrier(w, &e)) goto fail;
        double t0 = ms_now_s();
        for (int i = 0; i < n_it; i++)
            if (cases[k].fn(w, a, b, cases[k].bytes, &e)) goto fail;
        double us = (ms_now_s() - t0) / n_it * 1e6;
        if (w->rank == 0)
            printf("BENCH np=%d op=%s bytes=%zu iters=%d us_per_op=%.1f\n", w->size, cases[k].name,
                   cases[k].bytes, n_it, us);
    }
    /* a late peer: the last rank enters late_ms after the others; rank 0's completion time
     * minus the late rank's entry time (same host, one monotonic clock) is the wake cost */
    for (int late_ms = 2; late_ms <= 20; late_ms *= 10) {
        enum { N_LATE = 10 };
        double extra[N_LATE];
        for (int i = 0; i < N_LATE; i++) {
            if (ms_comm_barrier(w, &e)) goto fail;
            double entered = 0;
            if (w->rank == w->size - 1) {
                sleep_s(late_ms * 1e-3);
                entered = ms_now_s();
            }
            if (b_allreduce(w, a, b, 8, &e)) goto fail;
            double done = ms_now_s();
            if (ms_comm_bcast(w, &entered, sizeof entered, w->size - 1, &e)) goto fail;
            extra[i] = done - entered;
        }
        sort_d(extra, N_LATE);
        if (w->rank == 0)
            printf("BENCH np=%d op=late_peer late_ms=%d wake_p50_us=%.0f wake_max_us=%.0f\n",
                   w->size, late_ms, extra[N_LATE / 2] * 1e6, extra[N_LATE - 1] * 1e6);
    }
    free(a);
    free(b);
    return 0;
fail:
    fprintf(stderr, "comm-check rank %d: bench failed: %s\n", w->rank, e.msg);
    free(a);
    free(b);
    return 1;
}

/* ---- command ---------------------------------------------------------------------------- */

int ms_cmd_comm_check(int argc, char **argv)
{
    int np = 0, iters = 200; /* np 0: whatever mpirun started (1 without mpirun) */
    double idle_s = 2.0;
    const char *mode = "collectives";
    bool fixed = false;
    ms_comm_opts opts;
    ms_comm_opts_default(&opts);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: moeserve comm-check [--np N] [--mode collectives|hello|timeout|kill|"
                   "kill-idle|idle|bench|order] [--fixed-order 0|1] [--comm-timeout-s S] "
                   "[--comm-spin-us U] "
                   "[--comm-max-sleep-us U] "
                   "[--iters N] [--idle-s S]\n");
            return 0;
        }
        if (!v) {
            fprintf(stderr, "comm-check: unknown or incomplete flag '%s'\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--np"))
            np = atoi(v);
        else if (!strcmp(a, "--mode"))
            mode = v;
        else if (!strcmp(a, "--comm-timeout-s"))
            opts.timeout_s = atof(v);
        else if (!strcmp(a, "--comm-spin-us"))
            opts.spin_s = atof(v) * 1e-6;
        else if (!strcmp(a, "--comm-max-sleep-us"))
            opts.max_sleep_s = atof(v) * 1e-6;
        else if (!strcmp(a, "--iters"))
            iters = atoi(v);
        else if (!strcmp(a, "--idle-s"))
            idle_s = atof(v);
        else if (!strcmp(a, "--fixed-order"))
            fixed = atoi(v) != 0;
        else {
            fprintf(stderr, "comm-check: unknown flag '%s'\n", a);
            return 2;
        }
    }
    if (np < 0 || np > 64 || iters < 1) {
        fprintf(stderr, "comm-check: --np must be 1..64 and --iters >= 1\n");
        return 2;
    }
    ms_errbuf e = {""};
    /* the program name for the relaunch is "moeserve comm-check ...": argv[-1] is the binary */
    int rc = np ? ms_comm_maybe_relaunch(np, argc + 1, argv - 1, &e) : 0;
    if (rc) {
        fprintf(stderr, "comm-check: %s\n", e.msg);
        return 2;
    }
    if ((rc = ms_comm_init(&argc, &argv, &opts, &e))) {
        fprintf(stderr, "comm-check: %s\n", e.msg);
        return 2;
    }
    me = ms_comm_world_rank();
    ms_comm_set_fixed_order(fixed);
    int status = 0;
    if (!strcmp(mode, "hello")) {
        printf("HELLO rank %d of %d pid %d\n", me, ms_comm_world_size(), (int)getpid());
    } else if (!strcmp(mode, "collectives")) {
        mode_collectives();
        printf("comm-check rank %d: %d passed, %d failed\n", me, n_pass, n_fail);
        status = n_fail ? 1 : 0;
    } else if (!strcmp(mode, "timeout")) {
        status = mode_timeout();
    } else if (!strcmp(mode, "kill") || !strcmp(mode, "kill-idle")) {
        status = mode_kill(!strcmp(mode, "kill-idle"));
    } else if (!strcmp(mode, "idle")) {
        status = mode_idle(idle_s);
    } else if (!strcmp(mode, "bench")) {
        status = mode_bench(iters);
    } else if (!strcmp(mode, "order")) {
        mode_order(fixed);
        printf("comm-check rank %d: %d passed, %d failed\n", me, n_pass, n_fail);
        status = n_fail ? 1 : 0;
    } else {
        fprintf(stderr, "comm-check: unknown mode '%s'\n", mode);
        status = 2;
    }
    if (getenv("MOESERVE_COMM_STATS")) ms_comm_stats_print(stdout);
    fflush(stdout);
    if ((rc = ms_comm_deinit(&e))) {
        fprintf(stderr, "comm-check rank %d: %s\n", me, e.msg);
        return 1;
    }
    return status;
}
