/* comm_priv.h — state shared by comm.c, comm_coll.c and comm_stats.c; nothing else includes it.
 *
 * Owns the layout of a group's private part (communicator, member list, scratch arrays for MPI
 * counts, stats counters) and the process-wide state of the communication layer.  Main thread
 * only (MPI_THREAD_FUNNELED), like everything in comm.h that touches MPI.
 */
#ifndef MS_PARALLEL_COMM_PRIV_H
#define MS_PARALLEL_COMM_PRIV_H

#include "parallel/comm.h"

#include <mpi.h>
#include <pthread.h>
#include <sys/types.h>

#define MS_COMM_N_UNITS 4 /* byte units 4096, 256, 16, 1 for large counts */

struct ms_group_priv {
    MPI_Comm comm;          /* MPI_COMM_NULL once freed */
    int *world_ranks;       /* [size] world rank of each member */
    int *ia, *ib, *ic, *id; /* [size] scratch int counts/displacements for one call */
    size_t *sa, *sb;        /* [size] scratch size_t counts/displacements */
    MPI_Request *reqs;      /* [size] scratch requests (control headers) */
    int broken;             /* a call failed or timed out: the communicator is unusable */
    char broken_why[sizeof(ms_errbuf)];
    ms_comm_counter *ctr; /* [n_tag_slots][MS_COMM_N_KINDS]; slot 0 = MS_COMM_TAG_NONE */
    int n_tag_slots;
    uint64_t ctrl_seq;       /* control blocks sent/received on this group */
    ms_group *next;          /* list of live groups */
    struct ms_comm_shm *shm; /* shared-memory all-reduce (comm_shm.c); NULL: MPI's */
};

struct ms_comm_peer {
    int64_t pid;
    uint64_t start_ticks; /* /proc/<pid>/stat field 22: tells a reused pid apart */
    uint64_t host_key;    /* hostname + pid namespace + boot id: same key = pid is checkable */
    char host[40];
};

struct ms_comm_state {
    bool inited;
    pthread_t main_thread;
    ms_comm_opts opts;
    int world_rank, world_size;
    ms_group *world;
    ms_group *groups;           /* every live group, world included */
    struct ms_comm_peer *peers; /* [world_size] */
    bool peers_known;           /* peers[] filled by the start-up exchange */
    pid_t launcher_pid;         /* our parent under mpirun (0: singleton, not checked) */
    MPI_Datatype units[MS_COMM_N_UNITS];
    size_t unit_bytes[MS_COMM_N_UNITS];
    int tag;     /* current layer tag */
    bool wedged; /* a call failed and a request may still be pending */
    char wedged_why[sizeof(ms_errbuf)];
    unsigned char *ctrl_hdr;  /* 2 × (16 + MS_COMM_CTRL_INLINE): receive half, send half */
    unsigned char *ctrl_body; /* reassembled control body */
    size_t ctrl_body_cap;
    bool fixed_order; /* ms_comm_set_fixed_order */
    bool shm_bypass;  /* ms_comm_shm_bypass: every all-reduce through MPI_Iallreduce */
    float *fixed_buf; /* [size][block] the received blocks of a fixed-order sum, or [count] the
                       * peer's copy in a two-rank all-reduce (grow-only) */
    int64_t fixed_cap;
};

extern struct ms_comm_state ms_comm_st;

/* 0 if g may be used now (initialised, main thread, not broken), else the error. */
int ms_comm_check(const ms_group *g, const char *op, ms_errbuf *e);
/* Turns an MPI return code into MS_ECOMM with MPI's string, marks g broken. */
int ms_comm_mpi_fail(ms_group *g, int rc, const char *op, ms_errbuf *e);
/* Marks g unusable (a collective may still be pending on it). */
void ms_comm_mark_broken(ms_group *g, const char *why);
/* Waits for reqs with the spin-then-sleep strategy.  deadline: give up after opts.timeout_s
 * (MS_ETIMEOUT); otherwise wait forever.  Either way fails fast with MS_ECOMM when a member of
 * g (or the launcher) died.  op/bytes describe the call for messages.  g may be NULL. */
int ms_comm_wait(ms_group *g, MPI_Request *reqs, int n, bool deadline, const char *op, size_t bytes,
                 ms_errbuf *e);
/* The same strategy around any completion test: poll sets *done (1: finished) and returns
 * MPI_SUCCESS or an MPI error code (then MS_ECOMM with MPI's string). */
int ms_comm_wait_poll(ms_group *g, int (*poll)(void *ctx, int *done), void *ctx, bool deadline,
                      const char *op, size_t bytes, ms_errbuf *e);
/* Adds one call to g's counters under the current tag. */
void ms_comm_stats_add(ms_group *g, enum ms_comm_kind k, uint64_t payload, uint64_t sent,
                       uint64_t recv, double wait_s);
void ms_comm_stats_free(ms_group *g);

/* comm_shm.c.  Collective over g right after it is made: maps a shared segment when every
 * member is on this host and opts.shm is on (else leaves g on MPI; 0 either way unless an MPI
 * call failed). */
int ms_comm_shm_setup(ms_group *g, ms_errbuf *e);
/* Sum of buf over g in rank order through the segment (g must have one); op names the call
 * in errors.  Same deadline and failure reports as the MPI calls; no accounting. */
int ms_comm_shm_allreduce(ms_group *g, float *buf, size_t count, const char *op, ms_errbuf *e);
void ms_comm_shm_free(ms_group *g); /* local: unmaps (NULL or no segment ok) */

#endif
