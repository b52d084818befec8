/* comm.c — MPI start-up/shutdown, groups, peer liveness and the waiting strategy.
 *
 * Owns the process-wide communication state (ms_comm_st), the world group and the list of live
 * groups, and ms_comm_wait: every non-blocking MPI request of the layer is completed there by
 * an MPI_Test loop that spins for opts.spin_s, then sleeps for elapsed/16 clamped to
 * [20 µs, opts.max_sleep_s] (so a late wake costs at most ~6 % of the time already waited and
 * an idle rank uses ~0 % CPU), checks every ~0.1 s that the group's peers on this host and the
 * launcher are alive, and stops at the deadline.  Collectives live in comm_coll.c, accounting in
 * comm_stats.c.  Main thread only (MPI_THREAD_FUNNELED).
 */
#include "parallel/comm_priv.h"

#include "base/log.h"
#include "base/util.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct ms_comm_state ms_comm_st;

#define LIVENESS_PERIOD_S 0.1
#define MIN_SLEEP_S       20e-6
/* Tests right after each wake in a collective: a collective schedule (libnbc) may need a few
 * progress calls to finish once the late peer's data is in; without them that costs one more
 * sleep (late-peer wake 1.6 ms -> 0.3 ms here).  Not in the idle wait: each futile test costs a
 * sched_yield when oversubscribed (idle CPU 2.5 % -> 5 % with the burst). */
#define WAKE_BURST 8

void ms_comm_opts_default(ms_comm_opts *o)
{
    o->timeout_s = 60.0;
    o->spin_s = 200e-6;
    o->max_sleep_s = 1e-3;
    const char *shm = getenv("MOESERVE_COMM_SHM");
    o->shm = shm && !strcmp(shm, "1"); /* off by default: slower end to end under load */
    const char *pair = getenv("MOESERVE_COMM_PAIR");
    o->pair = !(pair && !strcmp(pair, "0")); /* on by default; 0: MPI's Iallreduce */
}

bool ms_comm_is_init(void)
{
    return ms_comm_st.inited;
}
ms_group *ms_comm_world(void)
{
    return ms_comm_st.world;
}
int ms_comm_world_rank(void)
{
    return ms_comm_st.inited ? ms_comm_st.world_rank : 0;
}
int ms_comm_world_size(void)
{
    return ms_comm_st.inited ? ms_comm_st.world_size : 1;
}
void ms_comm_set_timeout(double timeout_s)
{
    ms_comm_st.opts.timeout_s = timeout_s;
}
double ms_comm_timeout(void)
{
    return ms_comm_st.opts.timeout_s;
}
void ms_comm_set_fixed_order(bool on)
{
    ms_comm_st.fixed_order = on;
}

int ms_comm_group_world_rank(const ms_group *g, int i)
{
    if (!g || !g->priv || i < 0 || i >= g->size) return -1;
    return g->priv->world_ranks[i];
}

/* ---- errors and checks ------------------------------------------------------------------ */

void ms_comm_mark_broken(ms_group *g, const char *why)
{
    if (!ms_comm_st.wedged) {
        ms_comm_st.wedged = true;
        snprintf(ms_comm_st.wedged_why, sizeof ms_comm_st.wedged_why, "%s", why);
    }
    if (!g || !g->priv || g->priv->broken) return;
    g->priv->broken = 1;
    snprintf(g->priv->broken_why, sizeof g->priv->broken_why, "%s", why);
}

int ms_comm_check(const ms_group *g, const char *op, ms_errbuf *e)
{
    if (!ms_comm_st.inited)
        return ms_err(e, MS_EINVAL, "%s: communication layer not initialised", op);
    if (!pthread_equal(pthread_self(), ms_comm_st.main_thread))
        return ms_err(e, MS_EINTERNAL, "%s called off the main thread (MPI_THREAD_FUNNELED)", op);
    if (!g || !g->priv || g->priv->comm == MPI_COMM_NULL)
        return ms_err(e, MS_EINVAL, "%s: no such group", op);
    if (g->priv->broken)
        return ms_err(e, MS_ECOMM, "%s on group '%s': unusable after an earlier failure (%s)", op,
                      g->name, g->priv->broken_why);
    return 0;
}

int ms_comm_mpi_fail(ms_group *g, int rc, const char *op, ms_errbuf *e)
{
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, s, &len);
    int r = ms_err(e, MS_ECOMM, "%s on group '%s' (rank %d of %d): MPI error %d: %s", op,
                   g ? g->name : "world", g ? g->rank : ms_comm_st.world_rank,
                   g ? g->size : ms_comm_st.world_size, rc, s);
    ms_comm_mark_broken(g, e ? e->msg : op);
    return r;
}

/* ---- peer liveness ---------------------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Reads state and start time of pid from /proc; false if the process does not exist. */
static bool proc_stat(int64_t pid, char *state, uint64_t *start_ticks)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may contain spaces and parentheses */
    if (!p) return false;
    p++;
    *state = 0;
    *start_ticks = 0;
    /* fields after the name: 3 state ... 22 starttime */
    int field = 2;
    char *sv = NULL;
    for (char *tok = strtok_r(p, " ", &sv); tok; tok = strtok_r(NULL, " ", &sv)) {
        field++;
        if (field == 3) *state = tok[0];
        if (field == 22) {
            *start_ticks = strtoull(tok, NULL, 10);
            break;
        }
    }
    return true;
}

static void self_peer(struct ms_comm_peer *p)
{
    memset(p, 0, sizeof *p);
    p->pid = getpid();
    char state;
    proc_stat(p->pid, &state, &p->start_ticks);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    snprintf(p->host, sizeof p->host, "%s", host);
    uint64_t h = fnv1a(0xcbf29ce484222325ull, host, strlen(host));
    struct stat sb;
    if (stat("/proc/self/ns/pid", &sb) == 0) h = fnv1a(h, &sb.st_ino, sizeof sb.st_ino);
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
    }
    p->host_key = fnv1a(h, boot, strlen(boot));
}

/* 1 alive, 0 dead, -1 unknown (another host or pid namespace). */
static int peer_alive(int world_rank)
{
    const struct ms_comm_state *s = &ms_comm_st;
    if (!s->peers_known || world_rank < 0 || world_rank >= s->world_size) return -1;
    const struct ms_comm_peer *p = &s->peers[world_rank];
    if (p->host_key != s->peers[s->world_rank].host_key) return -1;
    char state;
    uint64_t start;
    if (!proc_stat(p->pid, &state, &start)) return 0;
    if (state == 'Z' || state == 'X' || start != p->start_ticks) return 0;
    return 1;
}

/* Appends the liveness of g's members to buf; returns the number found dead. */
static int describe_peers(const ms_group *g, char *buf, size_t cap)
{
    size_t used = 0;
    int n_dead = 0, n_alive = 0, n_unknown = 0;
    buf[0] = 0;
    int n = g ? g->size : ms_comm_st.world_size;
    for (int i = 0; i < n; i++) {
        int wr = g ? g->priv->world_ranks[i] : i;
        if (wr == ms_comm_st.world_rank) continue;
        int a = peer_alive(wr);
        if (a == 0) {
            const struct ms_comm_peer *p = &ms_comm_st.peers[wr];
            int w = snprintf(buf + used, cap - used, "%sworld rank %d (pid %lld on %s) has died",
                             n_dead ? "; " : "", wr, (long long)p->pid, p->host);
            if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
            n_dead++;
        } else if (a > 0) {
            n_alive++;
        } else {
            n_unknown++;
        }
    }
    if (!n_dead)
        snprintf(buf, cap,
                 "%d peer(s) alive on this host, %d on other hosts (unchecked): a peer has not "
                 "entered this call or is stuck before it",
                 n_alive, n_unknown);
    return n_dead;
}

static bool launcher_gone(void)
{
    return ms_comm_st.launcher_pid > 1 && getppid() != ms_comm_st.launcher_pid;
}

/* ---- waiting ---------------------------------------------------------------------------- */

/* MPI_Test on each pending request in turn, stopping at the first incomplete one.  Not
 * MPI_Testall: Open MPI 4.1's Testall checks completion before it drives progress, so what
 * that progress call delivers is only seen on the next call, one back-off sleep later (measured
 * here: idle wake ~1.8 ms with Testall vs ~0.6 ms with Test at a 1 ms sleep cap).  MPI_Test
 * drives progress and then checks again. */
static int test_all(MPI_Request *reqs, int n, int *done)
{
    *done = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i] == MPI_REQUEST_NULL) continue;
        int f = 0;
        int rc = MPI_Test(&reqs[i], &f, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
        if (!f) return MPI_SUCCESS;
    }
    *done = 1;
    return MPI_SUCCESS;
}

struct mpi_reqs {
    MPI_Request *reqs;
    int n;
};

static int poll_reqs(void *ctx, int *done)
{
    struct mpi_reqs *r = ctx;
    return test_all(r->reqs, r->n, done);
}

int ms_comm_wait(ms_group *g, MPI_Request *reqs, int n, bool deadline, const char *op, size_t bytes,
                 ms_errbuf *e)
{
    struct mpi_reqs r = {reqs, n};
    return ms_comm_wait_poll(g, poll_reqs, &r, deadline, op, bytes, e);
}

int ms_comm_wait_poll(ms_group *g, int (*poll)(void *ctx, int *done), void *ctx, bool deadline,
                      const char *op, size_t bytes, ms_errbuf *e)
{
    const ms_comm_opts *o = &ms_comm_st.opts;
    double t0 = ms_now_s(), next_check = t0 + LIVENESS_PERIOD_S;
    int burst = 0; /* tests left before the next sleep */
    for (;;) {
        int done = 0;
        int rc = poll(ctx, &done);
        if (rc != MPI_SUCCESS) return ms_comm_mpi_fail(g, rc, op, e);
        if (done) return 0;
        double now = ms_now_s(), el = now - t0;
        if (el < o->spin_s || burst-- > 0) continue;
        const char *gname = g ? g->name : "world";
        int grank = g ? g->rank : ms_comm_st.world_rank;
        int gsize = g ? g->size : ms_comm_st.world_size;
        if (now >= next_check) {
            next_check = now + LIVENESS_PERIOD_S;
            char peers[300];
            if (describe_peers(g, peers, sizeof peers) > 0) {
                ms_err(e, MS_ECOMM,
                       "%s of %zu B on group '%s' (rank %d of %d, tag %d) failed "
                       "after %.1f s: %s",
                       op, bytes, gname, grank, gsize, ms_comm_st.tag, el, peers);
                ms_comm_mark_broken(g, e ? e->msg : op);
                return MS_ECOMM;
            }
            if (launcher_gone()) {
                ms_err(e, MS_ECOMM, "%s on group '%s': the launcher (mpirun, pid %d) has died", op,
                       gname, (int)ms_comm_st.launcher_pid);
                ms_comm_mark_broken(g, e ? e->msg : op);
                return MS_ECOMM;
            }
        }
        if (deadline && el > o->timeout_s) {
            char peers[300];
            describe_peers(g, peers, sizeof peers);
            ms_err(e, MS_ETIMEOUT,
                   "%s of %zu B on group '%s' (rank %d of %d, tag %d) timed out "
                   "after %.1f s: %s",
                   op, bytes, gname, grank, gsize, ms_comm_st.tag, el, peers);
            ms_comm_mark_broken(g, e ? e->msg : op);
            return MS_ETIMEOUT;
        }
        double sl = el / 16;
        if (sl < MIN_SLEEP_S) sl = MIN_SLEEP_S;
        if (sl > o->max_sleep_s) sl = o->max_sleep_s;
        struct timespec ts = {(time_t)sl, (long)((sl - (double)(time_t)sl) * 1e9)};
        nanosleep(&ts, NULL);
        burst = deadline ? WAKE_BURST : 0; /* the idle wait is one Irecv: MPI_Test suffices */
    }
}

/* ---- groups ----------------------------------------------------------------------------- */

static void group_destroy(ms_group *g)
{
    if (!g) return;
    struct ms_group_priv *p = g->priv;
    ms_comm_shm_free(g);   /* local, and no request can still use it */
    if (p && !p->broken) { /* a broken group's arrays may belong to a pending request: leaked */
        free(p->world_ranks);
        free(p->ia);
        free(p->ib);
        free(p->ic);
        free(p->id);
        free(p->sa);
        free(p->sb);
        free(p->reqs);
        ms_comm_stats_free(g);
        free(p);
    }
    free(g);
}

/* Wraps comm (owned from now on) in a new group linked into the live list. */
static int group_new(MPI_Comm comm, const char *name, ms_group **out, ms_errbuf *e)
{
    int rc = MS_ENOMEM;
    ms_group *g = calloc(1, sizeof *g);
    if (!g) goto fail;
    g->priv = calloc(1, sizeof *g->priv);
    if (!g->priv) goto fail;
    struct ms_group_priv *p = g->priv;
    p->comm = comm;
    snprintf(g->name, sizeof g->name, "%s", name ? name : "group");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &g->rank);
    MPI_Comm_size(comm, &g->size);
    size_t n = (size_t)g->size;
    p->world_ranks = calloc(n, sizeof(int));
    p->ia = calloc(n, sizeof(int));
    p->ib = calloc(n, sizeof(int));
    p->ic = calloc(n, sizeof(int));
    p->id = calloc(n, sizeof(int));
    p->sa = calloc(n, sizeof(size_t));
    p->sb = calloc(n, sizeof(size_t));
    p->reqs = calloc(n, sizeof(MPI_Request));
    if (!p->world_ranks || !p->ia || !p->ib || !p->ic || !p->id || !p->sa || !p->sb || !p->reqs)
        goto fail;
    MPI_Group mine, world;
    MPI_Comm_group(comm, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    for (int i = 0; i < g->size; i++) p->ia[i] = i;
    int mrc = MPI_Group_translate_ranks(mine, g->size, p->ia, world, p->world_ranks);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    if (mrc != MPI_SUCCESS) {
        rc = ms_comm_mpi_fail(NULL, mrc, "MPI_Group_translate_ranks", e);
        goto fail;
    }
    p->next = ms_comm_st.groups;
    ms_comm_st.groups = g;
    *out = g;
    return 0;
fail:
    if (rc == MS_ENOMEM) ms_err(e, MS_ENOMEM, "out of memory creating group '%s'", name);
    if (g && g->priv) g->priv->comm = MPI_COMM_NULL;
    MPI_Comm_free(&comm);
    group_destroy(g);
    return rc;
}

static void group_unlink(ms_group *g)
{
    for (ms_group **pp = &ms_comm_st.groups; *pp; pp = &(*pp)->priv->next)
        if (*pp == g) {
            *pp = g->priv->next;
            return;
        }
}

/* Releases g's communicator unless a failed call may still use it (then it is leaked). */
static void group_release_comm(ms_group *g)
{
    if (g->priv->comm != MPI_COMM_NULL && !g->priv->broken) MPI_Comm_free(&g->priv->comm);
    g->priv->comm = MPI_COMM_NULL;
}

int ms_comm_split(ms_group *parent, int color, int key, const char *name, ms_group **out,
                  ms_errbuf *e)
{
    *out = NULL;
    int rc = ms_comm_check(parent, "split", e);
    if (rc) return rc;
    /* Rendezvous with the deadline first: MPI_Comm_split itself has no way out. */
    int mine[2] = {color, key};
    int *all = calloc((size_t)parent->size * 2, sizeof(int));
    if (!all) return ms_err(e, MS_ENOMEM, "out of memory splitting group '%s'", parent->name);
    MPI_Request req;
    int mrc = MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, parent->priv->comm, &req);
    if (mrc != MPI_SUCCESS) {
        free(all);
        return ms_comm_mpi_fail(parent, mrc, "split (rendezvous)", e);
    }
    rc = ms_comm_wait(parent, &req, 1, true, "split (rendezvous)", sizeof mine, e);
    if (rc) return rc; /* `all` is leaked: the pending collective may still write into it */
    free(all);
    MPI_Comm nc = MPI_COMM_NULL;
    mrc = MPI_Comm_split(parent->priv->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (mrc != MPI_SUCCESS) return ms_comm_mpi_fail(parent, mrc, "MPI_Comm_split", e);
    if (color < 0 || nc == MPI_COMM_NULL) return 0;
    if ((rc = group_new(nc, name, out, e))) return rc;
    return ms_comm_shm_setup(*out, e); /* on failure *out stays for ms_comm_group_free */
}

void ms_comm_group_free(ms_group *g)
{
    if (!g || g == ms_comm_st.world) return;
    if (g->priv) {
        group_unlink(g);
        if (ms_comm_st.inited) group_release_comm(g);
    }
    group_destroy(g);
}

/* ---- start-up and shutdown -------------------------------------------------------------- */

static int make_units(ms_errbuf *e)
{
    static const size_t bytes[MS_COMM_N_UNITS] = {4096, 256, 16, 1};
    for (int i = 0; i < MS_COMM_N_UNITS; i++) {
        ms_comm_st.unit_bytes[i] = bytes[i];
        if (bytes[i] == 1) {
            ms_comm_st.units[i] = MPI_BYTE;
            continue;
        }
        int rc = MPI_Type_contiguous((int)bytes[i], MPI_BYTE, &ms_comm_st.units[i]);
        if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&ms_comm_st.units[i]);
        if (rc != MPI_SUCCESS) return ms_comm_mpi_fail(NULL, rc, "MPI_Type_contiguous", e);
    }
    return 0;
}

static void free_units(void)
{
    for (int i = 0; i < MS_COMM_N_UNITS; i++)
        if (ms_comm_st.unit_bytes[i] > 1 && ms_comm_st.units[i] != MPI_DATATYPE_NULL)
            MPI_Type_free(&ms_comm_st.units[i]);
}

int ms_comm_init(int *argc, char ***argv, const ms_comm_opts *opts, ms_errbuf *e)
{
    struct ms_comm_state *s = &ms_comm_st;
    if (s->inited) return ms_err(e, MS_EINVAL, "communication layer already initialised");
    int already = 0;
    MPI_Initialized(&already);
    if (already) return ms_err(e, MS_EINVAL, "MPI was initialised outside the communication layer");
    memset(s, 0, sizeof *s);
    ms_comm_opts_default(&s->opts);
    if (opts) s->opts = *opts;
    if (!(s->opts.timeout_s > 0) || s->opts.spin_s < 0 || !(s->opts.max_sleep_s > 0))
        return ms_err(e, MS_EINVAL,
                      "comm options: timeout %.3g s, spin %.3g s, max sleep %.3g s "
                      "(timeout and sleep must be > 0)",
                      s->opts.timeout_s, s->opts.spin_s, s->opts.max_sleep_s);
    s->tag = MS_COMM_TAG_NONE;
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return ms_comm_mpi_fail(NULL, rc, "MPI_Init_thread", e);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    s->main_thread = pthread_self();
    /* Short back-off sleeps should last what they say, not the default 50 µs timer slack. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    MPI_Comm_rank(MPI_COMM_WORLD, &s->world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s->world_size);
    ms_log_init(s->world_rank);
    s->inited = true; /* from here on, failures go through ms_comm_deinit */
    if (provided < MPI_THREAD_FUNNELED) {
        rc = ms_err(e, MS_EUNSUPPORTED,
                    "MPI provides thread level %d, moeserve needs "
                    "MPI_THREAD_FUNNELED (%d)",
                    provided, MPI_THREAD_FUNNELED);
        goto fail;
    }
    for (int i = 0; i < MS_COMM_N_UNITS; i++) s->units[i] = MPI_DATATYPE_NULL;
    if ((rc = make_units(e))) goto fail;
    s->peers = calloc((size_t)s->world_size, sizeof *s->peers);
    s->ctrl_hdr = malloc(2 * (16 + MS_COMM_CTRL_INLINE));
    if (!s->peers || !s->ctrl_hdr) {
        rc = ms_err(e, MS_ENOMEM, "out of memory at communication start-up");
        goto fail;
    }
    MPI_Comm wc;
    MPI_Request req;
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &wc, &req);
    if (rc != MPI_SUCCESS) {
        rc = ms_comm_mpi_fail(NULL, rc, "MPI_Comm_idup(world)", e);
        goto fail;
    }
    if ((rc = ms_comm_wait(NULL, &req, 1, true, "start-up (dup world)", 0, e))) goto fail;
    if ((rc = group_new(wc, "world", &s->world, e))) goto fail;
    struct ms_comm_peer me;
    self_peer(&me);
    rc = MPI_Iallgather(&me, (int)sizeof me, MPI_BYTE, s->peers, (int)sizeof me, MPI_BYTE,
                        s->world->priv->comm, &req);
    if (rc != MPI_SUCCESS) {
        rc = ms_comm_mpi_fail(s->world, rc, "start-up (peer exchange)", e);
        goto fail;
    }
    if ((rc = ms_comm_wait(s->world, &req, 1, true, "start-up (peer exchange)", sizeof me, e)))
        goto fail;
    s->peers_known = true;
    s->launcher_pid = s->world_size > 1 ? getppid() : 0;
    if ((rc = ms_comm_shm_setup(s->world, e))) goto fail;
    MS_LOG(MS_DEBUG, "comm", "MPI up: rank %d of %d, pid %d on %s, thread level %d", s->world_rank,
           s->world_size, (int)me.pid, me.host, provided);
    return 0;
fail : {
    ms_errbuf e2;
    ms_comm_deinit(&e2);
    return rc;
}
}

int ms_comm_deinit(ms_errbuf *e)
{
    struct ms_comm_state *s = &ms_comm_st;
    if (!s->inited) return 0;
    int rc = 0;
    if (s->wedged)
        rc = ms_err(e, MS_ECOMM, "MPI not finalised: a call failed earlier (%s)", s->wedged_why);
    if (!rc && s->world && s->world_size > 1) {
        MPI_Request req;
        int mrc = MPI_Ibarrier(s->world->priv->comm, &req);
        if (mrc != MPI_SUCCESS)
            rc = ms_comm_mpi_fail(s->world, mrc, "shutdown barrier", e);
        else
            rc = ms_comm_wait(s->world, &req, 1, true, "shutdown barrier", 0, e);
    }
    /* Release every communicator; groups still held by callers keep their memory. */
    while (s->groups) {
        ms_group *g = s->groups;
        s->groups = g->priv->next;
        group_release_comm(g);
    }
    if (s->world) group_destroy(s->world);
    s->world = NULL;
    if (!s->wedged) { /* else pending requests may still use them: leaked on purpose */
        free_units();
        free(s->peers);
        free(s->ctrl_hdr);
        free(s->ctrl_body);
        ms_free_aligned(s->fixed_buf);
    }
    s->fixed_buf = NULL;
    s->fixed_cap = 0;
    s->peers = NULL;
    s->ctrl_hdr = s->ctrl_body = NULL;
    s->ctrl_body_cap = 0;
    s->peers_known = false;
    s->inited = false;
    if (!rc) MPI_Finalize();
    return rc;
}

void ms_comm_abort(int exit_code)
{
    fflush(stdout);
    fflush(stderr);
    if (ms_comm_st.inited) MPI_Abort(MPI_COMM_WORLD, exit_code);
    _exit(exit_code);
}
