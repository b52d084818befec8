/* request.c — the request object's output channel and the hub (request.h).
 *
 * Owns: request refcounts, the per-request token channel (mutex + condvar, the
 * front end blocks on it), the submission queue (mutex + linked list + eventfd),
 * the load snapshot (mutex).  Does not interpret tokens or HTTP.
 * Thread-safe throughout; ms_serve_hub_request_stop is async-signal-safe.
 */
#include "serve/request.h"

#include "base/log.h"
#include "base/util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

struct ms_serve_req_priv {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int refs;
    atomic_int aborted;
    int finish; /* enum ms_serve_finish */
    int32_t matched_stop;
    int err_code; /* MS_E* of an ERROR finish given by ms_serve_req_fail, else 0 */
    char msg[256];
    size_t n, cap;
    int32_t *ids;     /* [cap] */
    float *lps;       /* [cap] */
    int32_t *top_ids; /* [cap][n_top] */
    float *top_lps;   /* [cap][n_top] */
    int32_t n_top;
    int32_t cached_tokens;
    int32_t spec_verify_ct, spec_accepted;
    double t_first;
};

uint64_t ms_serve_random_seed(void)
{
    static _Atomic uint64_t n = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t k = atomic_fetch_add(&n, 1) + 1;
    uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (k * 0x9e3779b97f4a7c15ull);
    return ms_rng_next(&s);
}

ms_serve_req *ms_serve_req_new(const char *rid, const int32_t *ids, int32_t n_input,
                               const ms_req_params *params)
{
    if (n_input < 0 || n_input > MS_SERVE_MAX_INPUT_TOKENS || !params) return NULL;
    ms_serve_req *r = calloc(1, sizeof *r);
    struct ms_serve_req_priv *p = calloc(1, sizeof *p);
    if (!r || !p) goto fail;
    r->priv = p;
    static _Atomic uint64_t next_id = 1;
    r->id = atomic_fetch_add(&next_id, 1);
    snprintf(r->rid, sizeof r->rid, "%s", rid ? rid : "");
    r->input_ids = malloc(sizeof(int32_t) * (size_t)(n_input > 0 ? n_input : 1));
    if (!r->input_ids) goto fail;
    if (n_input) memcpy(r->input_ids, ids, sizeof(int32_t) * (size_t)n_input);
    r->n_input = n_input;
    r->params = *params;
    r->params.ids = r->input_ids;
    r->params.n_ids = n_input;
    if (r->params.top_logprobs > MS_SERVE_MAX_TOP_LOGPROBS)
        r->params.top_logprobs = MS_SERVE_MAX_TOP_LOGPROBS;
    r->dp_rank_hint = -1;
    r->t_arrival_s = ms_now_s();
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca; /* timed waits use the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&p->refs, 1);
    atomic_init(&p->aborted, 0);
    p->matched_stop = -1;
    p->n_top = r->params.top_logprobs > 0 ? r->params.top_logprobs : 0;
    return r;
fail:
    if (r) free(r->input_ids);
    free(r);
    free(p);
    return NULL;
}

void ms_serve_req_ref(ms_serve_req *r)
{
    if (r) atomic_fetch_add(&r->priv->refs, 1);
}

void ms_serve_req_unref(ms_serve_req *r)
{
    if (!r) return;
    struct ms_serve_req_priv *p = r->priv;
    if (atomic_fetch_sub(&p->refs, 1) != 1) return;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->ids);
    free(p->lps);
    free(p->top_ids);
    free(p->top_lps);
    free(p);
    free(r->input_ids);
    free(r);
}

size_t ms_serve_req_take(ms_serve_req *r, size_t from, ms_serve_tok *out, size_t cap,
                         int timeout_ms, int *finished)
{
    return ms_serve_req_take_min(r, from, 1, out, cap, timeout_ms, finished);
}

size_t ms_serve_req_take_min(ms_serve_req *r, size_t from, size_t min, ms_serve_tok *out,
                             size_t cap, int timeout_ms, int *finished)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    size_t until = from + (min ? min : 1) - 1; /* wait while p->n <= until */
    if (p->n <= until && !p->finish && timeout_ms != 0) {
        if (timeout_ms < 0) {
            while (p->n <= until && !p->finish) pthread_cond_wait(&p->cv, &p->mu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += timeout_ms / 1000;
            ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            while (p->n <= until && !p->finish)
                if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT) break;
        }
    }
    size_t k = 0;
    for (size_t i = from; i < p->n && k < cap; i++, k++) {
        ms_serve_tok *t = &out[k];
        t->id = p->ids[i];
        t->logprob = p->lps ? p->lps[i] : 0.0f;
        t->n_top = p->top_ids ? p->n_top : 0;
        for (int32_t j = 0; j < t->n_top; j++) {
            t->top_ids[j] = p->top_ids[i * (size_t)p->n_top + (size_t)j];
            t->top_lps[j] = p->top_lps[i * (size_t)p->n_top + (size_t)j];
        }
    }
    *finished = (from + k >= p->n) ? p->finish : MS_SERVE_FINISH_NONE;
    pthread_mutex_unlock(&p->mu);
    return k;
}

int32_t ms_serve_req_matched_stop(const ms_serve_req *r)
{
    return r->priv->matched_stop;
}

const char *ms_serve_req_finish_msg(const ms_serve_req *r)
{
    return r->priv->msg;
}

int ms_serve_req_error_status(const ms_serve_req *r)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    int code = p->err_code;
    pthread_mutex_unlock(&p->mu);
    return code ? ms_error_http_status(code) : 500;
}

double ms_serve_req_t_first_token(const ms_serve_req *r)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    double t = p->t_first;
    pthread_mutex_unlock(&p->mu);
    return t;
}

int32_t ms_serve_req_cached_tokens(const ms_serve_req *r)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    int32_t c = p->cached_tokens;
    pthread_mutex_unlock(&p->mu);
    return c;
}

size_t ms_serve_req_n_generated(const ms_serve_req *r)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    size_t n = p->n;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void ms_serve_req_mark_aborted(ms_serve_req *r)
{
    atomic_store(&r->priv->aborted, 1);
}

int ms_serve_req_aborted(const ms_serve_req *r)
{
    return atomic_load(&r->priv->aborted);
}

int ms_serve_req_finished(const ms_serve_req *r)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    int f = p->finish;
    pthread_mutex_unlock(&p->mu);
    return f;
}

static void finish_locked(struct ms_serve_req_priv *p, int kind, int32_t stop, const char *msg)
{
    if (p->finish) return;
    p->finish = kind;
    p->matched_stop = stop;
    snprintf(p->msg, sizeof p->msg, "%s", msg ? msg : "");
    pthread_cond_broadcast(&p->cv);
}

static int grow(struct ms_serve_req_priv *p)
{
    size_t cap = p->cap ? p->cap * 2 : 64, bytes;
    size_t per = p->n_top > 0 ? (size_t)p->n_top : 1;
    if (!ms_mul_size(cap, per * sizeof(float), &bytes)) return MS_ENOMEM;
    int32_t *ids = realloc(p->ids, cap * sizeof *ids);
    if (!ids) return MS_ENOMEM;
    p->ids = ids;
    float *lps = realloc(p->lps, cap * sizeof *lps);
    if (!lps) return MS_ENOMEM;
    p->lps = lps;
    if (p->n_top > 0) {
        int32_t *ti = realloc(p->top_ids, bytes);
        if (!ti) return MS_ENOMEM;
        p->top_ids = ti;
        float *tl = realloc(p->top_lps, bytes);
        if (!tl) return MS_ENOMEM;
        p->top_lps = tl;
    }
    p->cap = cap;
    return 0;
}

int ms_serve_req_push(ms_serve_req *r, int32_t id, float logprob, const int32_t *top_ids,
                      const float *top_lps)
{
    struct ms_serve_req_priv *p = r->priv;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (p->finish) goto out;
    if (p->n == p->cap && (rc = grow(p)) != 0) {
        finish_locked(p, MS_SERVE_FINISH_ERROR, -1, "out of memory for output tokens");
        goto out;
    }
    if (p->n == 0) p->t_first = ms_now_s();
    p->ids[p->n] = id;
    p->lps[p->n] = logprob;
    for (int32_t j = 0; j < p->n_top; j++) {
        p->top_ids[p->n * (size_t)p->n_top + (size_t)j] = top_ids ? top_ids[j] : -1;
        p->top_lps[p->n * (size_t)p->n_top + (size_t)j] = top_lps ? top_lps[j] : 0.0f;
    }
    p->n++;
    pthread_cond_broadcast(&p->cv);
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void ms_serve_req_set_spec(ms_serve_req *r, int32_t verify_ct, int32_t accepted)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    p->spec_verify_ct = verify_ct;
    p->spec_accepted = accepted;
    pthread_mutex_unlock(&p->mu);
}

void ms_serve_req_spec(const ms_serve_req *r, int32_t *verify_ct, int32_t *accepted)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    *verify_ct = p->spec_verify_ct;
    *accepted = p->spec_accepted;
    pthread_mutex_unlock(&p->mu);
}

void ms_serve_req_set_cached_tokens(ms_serve_req *r, int32_t cached_tokens)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    p->cached_tokens = cached_tokens;
    pthread_mutex_unlock(&p->mu);
}

void ms_serve_req_finish(ms_serve_req *r, enum ms_serve_finish kind, int32_t matched_stop_id,
                         const char *msg)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    finish_locked(p, kind == MS_SERVE_FINISH_NONE ? MS_SERVE_FINISH_ERROR : (int)kind,
                  matched_stop_id, msg);
    pthread_mutex_unlock(&p->mu);
}

void ms_serve_req_fail(ms_serve_req *r, int code, const char *msg)
{
    struct ms_serve_req_priv *p = r->priv;
    pthread_mutex_lock(&p->mu);
    if (!p->finish) p->err_code = code;
    finish_locked(p, MS_SERVE_FINISH_ERROR, -1, msg);
    pthread_mutex_unlock(&p->mu);
}

/* ------------------------------------------------------------------ hub */

struct msg_node {
    ms_serve_msg m;
    struct msg_node *next;
};

struct ms_serve_hub {
    pthread_mutex_t mu;
    int efd;
    struct msg_node *head, *tail;
    int32_t n_generate; /* GENERATE messages queued */
    atomic_int stop;
    ms_engine_info info;
    ms_dp_load load[MS_SERVE_MAX_DP];
    _Atomic uint64_t heartbeats;
    _Atomic double last_beat;
};

ms_serve_hub *ms_serve_hub_new(const ms_engine_info *info, ms_errbuf *e)
{
    if (!info || info->n_dp < 1 || info->n_dp > MS_SERVE_MAX_DP) {
        ms_err(e, MS_EINVAL, "engine info n_dp must be 1..%d", MS_SERVE_MAX_DP);
        return NULL;
    }
    ms_serve_hub *h = calloc(1, sizeof *h);
    if (!h) {
        ms_err(e, MS_ENOMEM, "hub allocation failed");
        return NULL;
    }
    h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->efd < 0) {
        ms_err(e, MS_EIO, "eventfd: %s", strerror(errno));
        free(h);
        return NULL;
    }
    pthread_mutex_init(&h->mu, NULL);
    h->info = *info;
    atomic_init(&h->stop, 0);
    atomic_init(&h->heartbeats, 0);
    atomic_init(&h->last_beat, ms_now_s());
    return h;
}

void ms_serve_hub_free(ms_serve_hub *h)
{
    if (!h) return;
    struct msg_node *n = h->head;
    while (n) {
        struct msg_node *next = n->next;
        ms_serve_req_unref(n->m.req);
        free(n);
        n = next;
    }
    close(h->efd);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

const ms_engine_info *ms_serve_hub_info(const ms_serve_hub *h)
{
    return &h->info;
}

void ms_serve_hub_set_info(ms_serve_hub *h, const ms_engine_info *info)
{
    pthread_mutex_lock(&h->mu);
    int32_t n_dp = h->info.n_dp;
    h->info = *info;
    h->info.n_dp = n_dp; /* the number of ranks never changes after start-up */
    pthread_mutex_unlock(&h->mu);
}

int ms_serve_hub_fd(const ms_serve_hub *h)
{
    return h->efd;
}

static void signal_efd(int efd)
{
    uint64_t one = 1;
    ssize_t w = write(efd, &one, sizeof one);
    (void)w; /* EAGAIN means the counter is already non-zero: still readable */
}

int ms_serve_hub_wait(ms_serve_hub *h, int timeout_ms)
{
    pthread_mutex_lock(&h->mu);
    int pending = h->head != NULL || atomic_load(&h->stop);
    pthread_mutex_unlock(&h->mu);
    if (pending) return 1;
    struct pollfd pfd = {.fd = h->efd, .events = POLLIN};
    int rc;
    do rc = poll(&pfd, 1, timeout_ms);
    while (rc < 0 && errno == EINTR && !atomic_load(&h->stop));
    return rc > 0 || atomic_load(&h->stop);
}

int ms_serve_hub_pop(ms_serve_hub *h, ms_serve_msg *out)
{
    pthread_mutex_lock(&h->mu);
    struct msg_node *n = h->head;
    if (n) {
        h->head = n->next;
        if (!h->head) h->tail = NULL;
        if (n->m.kind == MS_MSG_GENERATE) h->n_generate--;
    }
    if (!h->head) { /* drain the eventfd while holding the lock: no lost wake-ups */
        uint64_t v;
        ssize_t rd = read(h->efd, &v, sizeof v);
        (void)rd;
        if (atomic_load(&h->stop)) signal_efd(h->efd);
    }
    pthread_mutex_unlock(&h->mu);
    if (!n) return 0;
    *out = n->m;
    free(n);
    return 1;
}

static int enqueue(ms_serve_hub *h, enum ms_serve_msg_kind kind, ms_serve_req *r, int32_t max_q,
                   ms_errbuf *e)
{
    struct msg_node *n = malloc(sizeof *n);
    if (!n) return ms_err(e, MS_ENOMEM, "out of memory");
    n->m.kind = kind;
    n->m.req = r;
    n->next = NULL;
    pthread_mutex_lock(&h->mu);
    if (kind == MS_MSG_GENERATE && max_q > 0) {
        int64_t waiting = h->n_generate;
        for (int32_t i = 0; i < h->info.n_dp; i++) waiting += h->load[i].num_waiting_reqs;
        if (waiting >= max_q) {
            pthread_mutex_unlock(&h->mu);
            free(n);
            return ms_err(e, MS_EFULL, "The request queue is full.");
        }
    }
    ms_serve_req_ref(r);
    if (h->tail)
        h->tail->next = n;
    else
        h->head = n;
    h->tail = n;
    if (kind == MS_MSG_GENERATE) h->n_generate++;
    signal_efd(h->efd);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

int ms_serve_hub_submit(ms_serve_hub *h, ms_serve_req *r, int32_t max_queued, ms_errbuf *e)
{
    if (atomic_load(&h->stop)) return ms_err(e, MS_EBUSY, "the server is shutting down");
    return enqueue(h, MS_MSG_GENERATE, r, max_queued, e);
}

int ms_serve_hub_post(ms_serve_hub *h, enum ms_serve_msg_kind kind, ms_serve_req *r)
{
    if (kind == MS_MSG_GENERATE) return MS_EINVAL;
    if (kind == MS_MSG_ABORT && !r) return MS_EINVAL;
    if (kind == MS_MSG_ABORT) ms_serve_req_mark_aborted(r);
    return enqueue(h, kind, kind == MS_MSG_ABORT_ALL ? NULL : r, 0, NULL);
}

void ms_serve_hub_publish_load(ms_serve_hub *h, int32_t dp_rank, const ms_dp_load *load)
{
    if (dp_rank < 0 || dp_rank >= h->info.n_dp) return;
    pthread_mutex_lock(&h->mu);
    h->load[dp_rank] = *load;
    pthread_mutex_unlock(&h->mu);
}

void ms_serve_hub_read_load(ms_serve_hub *h, ms_dp_load *out, int32_t n)
{
    pthread_mutex_lock(&h->mu);
    for (int32_t i = 0; i < n && i < h->info.n_dp; i++) out[i] = h->load[i];
    pthread_mutex_unlock(&h->mu);
}

void ms_serve_hub_heartbeat(ms_serve_hub *h)
{
    atomic_fetch_add(&h->heartbeats, 1);
    atomic_store(&h->last_beat, ms_now_s());
}

uint64_t ms_serve_hub_heartbeats(ms_serve_hub *h)
{
    return atomic_load(&h->heartbeats);
}

double ms_serve_hub_last_heartbeat_s(ms_serve_hub *h)
{
    return atomic_load(&h->last_beat);
}

int32_t ms_serve_hub_n_queued(ms_serve_hub *h)
{
    pthread_mutex_lock(&h->mu);
    int32_t n = h->n_generate;
    pthread_mutex_unlock(&h->mu);
    return n;
}

void ms_serve_hub_request_stop(ms_serve_hub *h)
{
    atomic_fetch_add(&h->stop, 1);
    signal_efd(h->efd);
}

int ms_serve_hub_stop_requested(const ms_serve_hub *h)
{
    return atomic_load(&((ms_serve_hub *)h)->stop);
}

static ms_serve_hub *signal_hub;

static void on_signal(int sig)
{
    (void)sig;
    if (signal_hub) ms_serve_hub_request_stop(signal_hub);
}

int ms_serve_hub_install_signals(ms_serve_hub *h)
{
    signal_hub = h;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    /* SIGUSR1: what a self-relaunch's supervisor sends through mpirun (comm_launch.c) */
    if (sigaction(SIGTERM, &sa, NULL) || sigaction(SIGINT, &sa, NULL) ||
        sigaction(SIGUSR1, &sa, NULL))
        return MS_EIO;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}
