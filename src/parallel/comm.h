/* comm.h — the communication layer of the distributed engine: the only door to MPI.
 *
 * Owns: MPI start-up and shutdown (singleton or under mpirun), groups (sub-communicators),
 * collectives with a deadline, the idle wait for rank 0's control blocks, byte accounting per
 * group × layer tag × collective kind, and the self-relaunch under mpirun.  Does NOT own the
 * layout arithmetic (src/parallel/layout.h decides the sizes) nor what the bytes mean.
 * Threads: MPI runs in MPI_THREAD_FUNNELED mode; every function here that talks to MPI must be
 * called from the thread that called ms_comm_init (checked: others get MS_EINTERNAL).  The pure
 * helpers (ms_comm_launch_argv, ms_comm_kind_name) are thread-safe.
 *
 * Errors are values: 0 or a negative MS_E* with the reason in the ms_errbuf.  Every MPI error
 * becomes MS_ECOMM with MPI's own error string.  No call blocks forever: collectives give up
 * after the deadline (ms_comm_opts.timeout_s, `--comm-timeout-s`) with MS_ETIMEOUT naming the
 * collective, the group and which peers are alive; a peer that died on this host is noticed
 * within ~0.1 s (MS_ECOMM).  After MS_ETIMEOUT or MS_ECOMM the group is unusable (MPI cannot
 * cancel a collective): the caller must not free the buffers of the failed call and should
 * log the message and exit non-zero (mpirun then stops the other ranks).
 */
#ifndef MS_PARALLEL_COMM_H
#define MS_PARALLEL_COMM_H

#include "base/error.h"
#include "parallel/layout.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- start-up --------------------------------------------------------------------------- */

typedef struct ms_comm_opts {
    double timeout_s;   /* deadline of each collective (default 60; `--comm-timeout-s`) */
    double spin_s;      /* busy-poll this long before sleeping (default 200 µs) */
    double max_sleep_s; /* back-off cap while waiting (default 1 ms): the idle wake latency */
    bool shm;           /* all-reduce through shared memory in groups on one host
                         * (MOESERVE_COMM_SHM=1; default off: MPI's, see bench/HISTORY.md) */
    bool pair;          /* two-rank groups all-reduce by one Isend/Irecv exchange and a local
                         * add (comm_coll.c; default on, MOESERVE_COMM_PAIR=0: MPI_Iallreduce) */
} ms_comm_opts;

void ms_comm_opts_default(ms_comm_opts *o);

/* Initialises MPI (MPI_Init_thread, FUNNELED required), sets MPI_ERRORS_RETURN, creates the
 * world group and exchanges each rank's pid/host for liveness checks, and calls
 * ms_log_init(world rank).  Works without mpirun (singleton, world size 1).  opts may be NULL. */
int ms_comm_init(int *argc, char ***argv, const ms_comm_opts *opts, ms_errbuf *e);
/* Frees every group and finalises MPI after a barrier with the deadline.  If a group failed
 * earlier, or the barrier fails, MPI_Finalize is skipped (it could hang) and an error is
 * returned: the process should then exit non-zero.  Safe to call when not initialised. */
int ms_comm_deinit(ms_errbuf *e);
bool ms_comm_is_init(void);
/* Ends every rank of the job now (MPI_Abort); for fatal errors after a failed collective. */
void ms_comm_abort(int exit_code) __attribute__((noreturn));

void ms_comm_set_timeout(double timeout_s); /* changes the deadline of later calls */
double ms_comm_timeout(void);
/* on (--enable-deterministic-inference): every sum over more than two ranks (all-reduce,
 * reduce-scatter) adds the ranks' values in rank order, ((v0 + v1) + v2) + ..., whatever the
 * message size (MPI_SUM's grouping is the library's and follows the size); two ranks' sum is
 * the same either way and keeps MPI's.  Bytes as MPI's bandwidth-optimal algorithms. */
void ms_comm_set_fixed_order(bool on);

/* ---- groups ----------------------------------------------------------------------------- */

#define MS_COMM_NAME_MAX 32

/* A group of ranks (an MPI communicator).  Fields are read-only for callers. */
typedef struct ms_group {
    int rank;                    /* this process's rank in the group */
    int size;                    /* number of ranks in the group */
    char name[MS_COMM_NAME_MAX]; /* for logs and stats: "attn_tp", "moe_ep", ... */
    struct ms_group_priv *priv;  /* communicator, member list, stats: comm*.c only */
} ms_group;

/* The world group (borrowed; valid until ms_comm_deinit). */
ms_group *ms_comm_world(void);
int ms_comm_world_rank(void);
int ms_comm_world_size(void);

/* Collective over parent: ranks passing the same color >= 0 form one new group, ordered by
 * key (ties by parent rank).  color < 0: this rank joins no group and *out is NULL.  Every
 * rank of parent must call it (checked with the deadline before MPI_Comm_split).  The new
 * group is owned by the caller: ms_comm_group_free. */
int ms_comm_split(ms_group *parent, int color, int key, const char *name, ms_group **out,
                  ms_errbuf *e);
/* Frees a group (NULL ok; the world group is ignored).  Local, not collective. */
void ms_comm_group_free(ms_group *g);
/* World rank of member i of g (-1 if i is out of range). */
int ms_comm_group_world_rank(const ms_group *g, int i);
/* Groups whose members all run on this host sum their all-reduces through shared memory
 * (parallel/comm_shm.c: in rank order, ((v0 + v1) + v2) + ..., the same bits on every member
 * and at every size; for two ranks the bits of MPI_SUM) when ms_comm_opts.shm is on.
 * ms_comm_shm_group: whether g does.  ms_comm_shm_bypass(true) sends every all-reduce (the
 * shared-memory one and the two-rank exchange, ms_comm_opts.pair) to MPI_Iallreduce until
 * called with false (a test hook: every rank must switch between the same two calls). */
bool ms_comm_shm_group(const ms_group *g);
void ms_comm_shm_bypass(bool on);

/* ---- the standard set of groups --------------------------------------------------------- *
 * Built from the layout's rank coordinates and group spans (parallel/layout.h: the one place
 * the rank ordering is written down, SGLang's initialize_model_parallel convention). */
typedef struct ms_comm_groups {
    ms_rank_coords at;                                     /* this rank (ms_layout_rank_coords) */
    ms_group *world;                                       /* borrowed from ms_comm_world() */
    ms_group *tp, *attn_tp, *moe_ep, *moe_tp, *dense, *dp; /* owned */
} ms_comm_groups;

/* Collective over the world: checks the world size against the layout, computes this rank's
 * coordinates and builds every group (MS_ELAYOUT with the reason). */
int ms_comm_groups_init(ms_comm_groups *gs, const ms_layout *lay, ms_errbuf *e);
void ms_comm_groups_deinit(ms_comm_groups *gs);

/* ---- collectives ------------------------------------------------------------------------ *
 * Every rank of the group must make the same call (a rank with no rows passes 0 counts: an
 * idle participant).  Counts are per group rank; displacement arrays may be NULL (packed in
 * rank order).  Byte counts and displacements must each stay below 2^31 units, where the unit
 * is the largest of 4096/256/16/1 bytes dividing all of them (MS_ETOOBIG otherwise). */

/* Accounting kinds (see comm_stats.c for the exact byte definitions). */
enum ms_comm_kind {
    MS_COMM_ALLREDUCE,
    MS_COMM_ALLGATHER,
    MS_COMM_REDUCE_SCATTER,
    MS_COMM_A2A_DISPATCH,
    MS_COMM_A2A_COMBINE,
    MS_COMM_BCAST,
    MS_COMM_GATHER,
    MS_COMM_P2P,
    MS_COMM_N_KINDS
};
const char *ms_comm_kind_name(enum ms_comm_kind k);

/* Sum of buf over the group, in place. */
int ms_comm_allreduce_f32(ms_group *g, float *buf, size_t count, ms_errbuf *e);
/* Every rank contributes bytes; recv gets size·bytes in rank order.  send NULL: in place
 * (this rank's block already sits at recv + rank·bytes). */
int ms_comm_allgather(ms_group *g, const void *send, size_t bytes, void *recv, ms_errbuf *e);
/* Rank i contributes recv_bytes[i] bytes (this rank sends recv_bytes[rank] from send; NULL:
 * in place), placed at recv + recv_displs[i]. */
int ms_comm_allgatherv(ms_group *g, const void *send, void *recv, const size_t *recv_bytes,
                       const size_t *recv_displs, ms_errbuf *e);
/* The same with counts and displacements in floats. */
int ms_comm_allgatherv_f32(ms_group *g, const float *send, float *recv, const size_t *counts,
                           const size_t *displs, ms_errbuf *e);
/* send holds size·count_per_rank floats; rank r receives the sum of block r. */
int ms_comm_reduce_scatter_f32(ms_group *g, const float *send, float *recv, size_t count_per_rank,
                               ms_errbuf *e);
/* send holds Σcounts floats in rank order; rank r receives the sum of its counts[r] block. */
int ms_comm_reduce_scatterv_f32(ms_group *g, const float *send, float *recv, const size_t *counts,
                                ms_errbuf *e);
/* All-to-all with per-peer byte counts (MoE dispatch/combine; kind says which, for stats). */
int ms_comm_alltoallv(ms_group *g, enum ms_comm_kind kind, const void *send,
                      const size_t *send_bytes, const size_t *send_displs, void *recv,
                      const size_t *recv_bytes, const size_t *recv_displs, ms_errbuf *e);
/* bytes from group rank root to everyone. */
int ms_comm_bcast(ms_group *g, void *buf, size_t bytes, int root, ms_errbuf *e);
/* Rank i's send_bytes land at recv + recv_displs[i] on root (recv/recv_bytes read on root
 * only; recv_bytes[i] must equal rank i's send_bytes). */
int ms_comm_gatherv(ms_group *g, const void *send, size_t send_bytes, void *recv,
                    const size_t *recv_bytes, const size_t *recv_displs, int root, ms_errbuf *e);
int ms_comm_gather(ms_group *g, const void *send, size_t bytes, void *recv, int root, ms_errbuf *e);
int ms_comm_barrier(ms_group *g, ms_errbuf *e);
/* One exchange of point-to-point transfers (EPLB's expert moves): each op a send to or a
 * receive from group rank peer of bytes (< 2 GiB) at buf.  Every op's peer posts the
 * matching op; between one pair, sends and receives match in the order posted (one tag
 * for all).  All posted at once and waited together, with the collectives' deadline.
 * Ops to oneself are refused (copy locally).  0 or an error. */
typedef struct ms_comm_p2p {
    int peer, is_recv;
    void *buf; /* a send's is read only */
    size_t bytes;
} ms_comm_p2p;
int ms_comm_exchange(ms_group *g, const ms_comm_p2p *ops, int n, ms_errbuf *e);

/* ---- the step protocol's control block -------------------------------------------------- *
 * Group rank 0 sends a control block of any size to the group; the others wait for it with
 * no deadline (the server may idle for hours) while sleeping with back-off (~0 % CPU, wake
 * within ~max_sleep_s), and fail within ~0.1 s with MS_ECOMM if rank 0 (or the launcher) dies.
 * The body travels inline with the header up to MS_COMM_CTRL_INLINE bytes, the rest by a
 * broadcast with the deadline.  Blocks must be consumed in order: one recv per send. */
#define MS_COMM_CTRL_INLINE    2048
#define MS_COMM_CTRL_MAX_BYTES ((size_t)1 << 30) /* named limit on one control block */
int ms_comm_ctrl_send(ms_group *g, const void *body, size_t bytes, ms_errbuf *e);
/* *body is borrowed: valid until the next ms_comm_ctrl_recv or ms_comm_deinit. */
int ms_comm_ctrl_recv(ms_group *g, const void **body, size_t *bytes, ms_errbuf *e);

/* ---- accounting ------------------------------------------------------------------------- */

#define MS_COMM_TAG_NONE (-1) /* outside any layer */
#define MS_COMM_TAG_ALL  (-2) /* ms_comm_stats_get: sum over every tag */
#define MS_COMM_MAX_TAG  4095 /* named limit on layer tags */

typedef struct ms_comm_counter {
    uint64_t n_calls;
    uint64_t payload_bytes; /* this rank's input to the call (see comm_stats.c) */
    uint64_t sent_bytes;    /* bytes this rank must deliver to other ranks */
    uint64_t recv_bytes;    /* bytes other ranks must deliver to this rank */
    double wait_s;          /* time inside the call */
} ms_comm_counter;

/* Tags the following collectives (a layer index, or MS_COMM_TAG_NONE).  MS_EINVAL if out of
 * [-1, MS_COMM_MAX_TAG]. */
int ms_comm_set_tag(int tag);
int ms_comm_tag(void);
/* One counter (tag MS_COMM_TAG_ALL sums the tags); zero if nothing was counted. */
void ms_comm_stats_get(const ms_group *g, int tag, enum ms_comm_kind k, ms_comm_counter *out);
void ms_comm_stats_reset(ms_group *g); /* NULL: every group */
/* One line per non-zero (group, tag, kind) of this rank:
 * "comm rank=R group=G tag=T kind=K calls=N payload=B sent=B recv=B wait_us=U". */
void ms_comm_stats_print(FILE *f);

/* ---- launching -------------------------------------------------------------------------- */

/* If this process runs under a launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set),
 * checks that it started world_size_needed ranks (MS_ELAYOUT "this launch needs 4 ranks,
 * mpirun started 2") and returns 0.  Without a launcher and world_size_needed <= 1 returns 0
 * (singleton).  Otherwise runs this binary (/proc/self/exe) with the same argv under
 * `mpirun -np W` (see ms_comm_launch_argv) as a child, stays as its supervisor (the first two
 * SIGTERM/SIGINT/SIGHUP become SIGUSR1 to every rank, a third SIGTERM to mpirun) and exits
 * with mpirun's status: it does not return unless mpirun cannot be started.  Call it
 * before ms_comm_init and before starting threads; argv is main's (argv[0] is replaced by
 * /proc/self/exe). */
int ms_comm_maybe_relaunch(int world_size_needed, int argc, char **argv, ms_errbuf *e);
/* Pure: fills out[0..] (cap entries, NULL-terminated) with the mpirun command line used by the
 * relaunch; returns the number of entries or MS_ETOOBIG.  Strings are borrowed from the
 * arguments or static.  as_root adds --allow-run-as-root. */
int ms_comm_launch_argv(int world_size, const char *exe, int argc, char **argv, bool as_root,
                        char **out, int cap, ms_errbuf *e);

#endif
