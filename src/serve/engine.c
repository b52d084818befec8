/* engine.c — the lockstep step of one rank (engine.h): control broadcast (new
 * requests as serve/wire records, aborts), schedule (batch broadcast inside
 * attention-TP groups, token-count all-gather), forward, sample, and the gather of
 * events, refusals and loads to rank 0.  Start-up is engine_open.c, the warm-up
 * warmup.c.  Main thread only. */
#include "serve/engine.h"
#include "serve/engine_priv.h"
#include "serve/eplb_run.h"

#include "base/log.h"
#include "base/util.h"
#include "cache/kv_budget.h"
#include "moe/expert_recorder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CTRL_MAGIC 0x4d534354u /* "MSCT" */
enum { CF_EXIT = 1, CF_FLUSH = 2 };

struct ctrl_hdr {
    uint32_t magic, flags, n_new, n_abort;
};

struct wire_ev_hdr { /* what each rank contributes to the step's event gather */
    int32_t n_events, is_leader, dp;
    int32_t n_rejects; /* struct reject records after the events */
    ms_sched_stats st;
};

/* A request this rank's scheduler refused: rank 0 finishes it with the error. */
struct reject {
    uint64_t id;
    int32_t code; /* MS_E* */
    char msg[204];
};

static int grow(void **p, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    n = MS_MAX(n, 2 * *cap);
    void *q = realloc(*p, n);
    if (!q) return MS_ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

const ms_model *ms_engine_model(const ms_engine *e)
{
    return e->m;
}

const ms_layout *ms_engine_layout(const ms_engine *e)
{
    return &e->lay;
}
int ms_engine_is_rank0(const ms_engine *e)
{
    return e->rank == 0;
}
struct ms_expert_recorder *ms_engine_recorder(const ms_engine *e)
{
    return e->rec;
}
int ms_engine_n_dp(const ms_engine *e)
{
    return e->n_dp;
}
int64_t ms_engine_pool_tokens(const ms_engine *e)
{
    return e->pool_tokens;
}
int ms_engine_kv_pools(const ms_engine *e, ms_kv_pool_info *out)
{
    return ms_kv_cache_pool_info(e->cache, out);
}
double ms_engine_kv_concurrency(const ms_engine *e, int64_t n_tokens)
{
    return ms_kv_cache_concurrency(e->cache, n_tokens);
}
const ms_kv_spec *ms_engine_kv_spec(const ms_engine *e)
{
    return ms_kv_cache_spec(e->cache);
}
int ms_engine_max_running_per_rank(const ms_engine *e)
{
    return e->max_running_rank;
}
int64_t ms_engine_chunk_per_rank(const ms_engine *e)
{
    return e->chunk_rank;
}
int64_t ms_engine_context_length(const ms_engine *e)
{
    return e->ctx_len;
}
int ms_engine_busy(const ms_engine *e)
{
    return e->inflight > 0 || e->pend_new > 0 || e->pend_abort > 0 || e->pend_flags != 0;
}

/* ---- rank 0: building the control block ---- */

int ms_engine_submit(ms_engine *e, const ms_req_params *in, ms_errbuf *err)
{
    if (in->n_ids <= 0) return ms_err(err, MS_EINVAL, "the prompt is empty");
    int64_t need = in->n_ids + in->max_new;
    if (need > e->ctx_len)
        return ms_err(err, MS_ECONTEXT,
                      "the prompt has %lld tokens and max_tokens is %lld: %lld tokens exceed the "
                      "context length of %lld",
                      (long long)in->n_ids, (long long)in->max_new, (long long)need,
                      (long long)e->ctx_len);
    /* the pool is checked by its owner, the DP rank's scheduler: a refusal comes back
     * as an error event */
    if (e->ctrl_len == 0) e->ctrl_len = sizeof(struct ctrl_hdr);
    size_t add = ms_wire_req_size(in);
    if (grow((void **)&e->ctrl, &e->ctrl_cap, e->ctrl_len + add))
        return ms_err(err, MS_ENOMEM, "out of memory");
    if (in->n_ids > MS_REQ_MAX_IDS || in->n_stop_ids < 0 || in->n_stop_ids > MS_REQ_MAX_STOP_IDS)
        return ms_err(err, MS_EINVAL, "%lld prompt ids and %d stop ids (at most %d and %d)",
                      (long long)in->n_ids, in->n_stop_ids, MS_REQ_MAX_IDS, MS_REQ_MAX_STOP_IDS);
    if (in->n_bias < 0 || in->n_bias > MS_REQ_MAX_LOGIT_BIAS)
        return ms_err(err, MS_EINVAL, "%d logit_bias entries (at most %d)", in->n_bias,
                      MS_REQ_MAX_LOGIT_BIAS);
    /* the router records the request: nothing may fail after it (the counts the
     * encoder checks were checked above) */
    ms_req_params w = *in;
    w.dp_rank = ms_router_pick(e->router, in->ids, in->n_ids, in->max_new, in->dp_rank);
    int rc = ms_wire_req_encode(&w, e->ctrl + e->ctrl_len, add, err);
    if (rc) return rc;
    e->ctrl_len += add;
    e->pend_new++;
    e->inflight++;
    return 0;
}

void ms_engine_abort(ms_engine *e, uint64_t id)
{
    if (grow((void **)&e->aborts, &e->cap_aborts, sizeof(uint64_t) * (e->pend_abort + 1))) return;
    e->aborts[e->pend_abort++] = id;
}

int ms_engine_flush_cache(ms_engine *e)
{
    if (e->inflight > 0) return MS_EBUSY;
    e->pend_flags |= CF_FLUSH;
    return 0;
}

void ms_engine_shutdown(ms_engine *e)
{
    e->pend_flags |= CF_EXIT;
}

int ms_engine_finish(ms_engine *e, ms_errbuf *err)
{
    ms_engine_shutdown(e);
    int r = ms_engine_step(e, err);
    return r < 0 ? r : 0;
}

int ms_engine_follow(ms_engine *e, ms_errbuf *err)
{
    int r;
    while ((r = ms_engine_step(e, err)) == 0) {
    }
    return r < 0 ? r : 0;
}

/* Finishes the control block: header and aborts; returns its body (e->ctrl). */
static size_t seal_ctrl(ms_engine *e)
{
    if (e->ctrl_len == 0) e->ctrl_len = sizeof(struct ctrl_hdr);
    if (grow((void **)&e->ctrl, &e->ctrl_cap, e->ctrl_len + sizeof(uint64_t) * e->pend_abort)) {
        e->pend_abort = 0; /* out of memory: aborts are retried by the caller's disconnect path */
    } else if (e->pend_abort > 0) {
        memcpy(e->ctrl + e->ctrl_len, e->aborts, sizeof(uint64_t) * e->pend_abort);
        e->ctrl_len += sizeof(uint64_t) * e->pend_abort;
    }
    struct ctrl_hdr h = {CTRL_MAGIC, e->pend_flags, e->pend_new, e->pend_abort};
    memcpy(e->ctrl, &h, sizeof h);
    size_t n = e->ctrl_len;
    e->ctrl_len = 0;
    e->pend_new = e->pend_abort = e->pend_flags = 0;
    return n;
}

/* Applies a control block on this rank; returns 1 on exit. */
static int apply_ctrl(ms_engine *e, const uint8_t *body, size_t len, ms_errbuf *err)
{
    struct ctrl_hdr h;
    if (len < sizeof h) return ms_err(err, MS_EINTERNAL, "short control block");
    memcpy(&h, body, sizeof h);
    if (h.magic != CTRL_MAGIC) return ms_err(err, MS_EINTERNAL, "bad control block");
    size_t off = sizeof h;
    e->n_rejects = 0;
    for (uint32_t i = 0; i < h.n_new; i++) {
        ms_req_params in;
        size_t used;
        int rc = ms_wire_req_decode(body + off, len - off, &in, &e->req_ids, &e->cap_req_ids, &used,
                                    err);
        if (rc) return rc;
        off += used;
        if (!e->is_leader || in.dp_rank != e->dp_index) continue;
        ms_errbuf e2 = {{0}};
        if ((rc = ms_sched_add(e->sched, &in, &e2)) == 0) continue;
        MS_LOG(MS_WARN, "engine", "request %llu rejected: %s", (unsigned long long)in.id, e2.msg);
        if (grow((void **)&e->rejects, &e->cap_rejects,
                 sizeof *e->rejects * (size_t)(e->n_rejects + 1)))
            return ms_err(err, MS_ENOMEM, "out of memory");
        struct reject *x = &e->rejects[e->n_rejects++];
        memset(x, 0, sizeof *x);
        x->id = in.id;
        x->code = rc;
        memcpy(x->msg, e2.msg, MS_MIN(strlen(e2.msg), sizeof x->msg - 1)); /* NUL from memset */
    }
    for (uint32_t i = 0; i < h.n_abort; i++) {
        uint64_t id;
        if (off + sizeof id > len) return ms_err(err, MS_EINTERNAL, "truncated control block");
        memcpy(&id, body + off, sizeof id);
        off += sizeof id;
        if (e->is_leader) ms_sched_abort(e->sched, id);
    }
    if ((h.flags & CF_FLUSH) && e->is_leader) ms_sched_flush_cache(e->sched);
    return (h.flags & CF_EXIT) ? 1 : 0;
}

/* ---- batch broadcast inside an attention-TP group ---- */

/* The leader's batch to its attention-TP members, who hold the same cache
 * (the same page ids in every stream, the same state slots) and compute the
 * same sequences.  Per sequence: n_tokens, start_pos, state slot and, per
 * stream, its page count and first live page; then the tokens; then every
 * stream's page table (slid-out pages as -1).  Its logit rows too: with a split LM head
 * (ms_model_head_split) every member computes a vocab slice of them. */
enum {
    META_SEQ = 5
}; /* per seq: n_tokens, start_pos, state slot, kind, logit rows; then per stream: n_pages, first
      live */

int ms_engine_member_logits(ms_engine *e, const int64_t *rows, int n, size_t stride, float **out,
                            ms_errbuf *err)
{
    int64_t total = 0, V = ms_model_shape_of(e->m)->vocab;
    for (int i = 0; i < n; i++) total += rows[(size_t)i * stride];
    for (int i = 0; i < n; i++) out[i] = NULL;
    if (!ms_model_head_split(e->m) || total == 0) return 0;
    if (grow((void **)&e->mlogits, &e->cap_mlogits, sizeof(float) * (size_t)(total * V)))
        return ms_err(err, MS_ENOMEM, "out of memory (members' logits)");
    for (int i = 0, k = 0; i < n; k += (int)rows[(size_t)i * stride], i++)
        if (rows[(size_t)i * stride] > 0) out[i] = e->mlogits + (int64_t)k * V;
    return 0;
}

static int share_batch(ms_engine *e, const ms_batch_seq **batch, int *n, ms_errbuf *err)
{
    ms_group *g = e->gs.attn_tp;
    int ns = ms_kv_cache_n_streams(e->cache), per = META_SEQ + 2 * ns;
    int64_t hdr[3] = {0, 0, 0}; /* n_seqs, tokens, pages */
    if (e->is_leader) {
        hdr[0] = *n;
        for (int i = 0; i < *n; i++) {
            const ms_batch_seq *b = &(*batch)[i];
            hdr[1] += b->n_tokens;
            for (int s = 0; s < ns; s++) hdr[2] += b->kv->n_pages[s];
        }
    }
    int rc = ms_comm_bcast(g, hdr, sizeof hdr, 0, err);
    if (rc || hdr[0] == 0) {
        if (!e->is_leader) *n = 0;
        return rc;
    }
    size_t bytes = sizeof(int64_t) * (size_t)per * (size_t)hdr[0] +
                   sizeof(int32_t) * (size_t)(hdr[1] + hdr[2]);
    if (grow((void **)&e->bbuf, &e->cap_bbuf, bytes))
        return ms_err(err, MS_ENOMEM, "out of memory");
    if (e->is_leader) {
        int64_t *meta = (int64_t *)e->bbuf;
        int32_t *p = (int32_t *)(meta + per * hdr[0]);
        for (int i = 0; i < *n; i++) {
            const ms_batch_seq *b = &(*batch)[i];
            int64_t *m = meta + per * i;
            m[0] = b->n_tokens;
            m[1] = b->start_pos;
            m[2] = b->kv->state_slot;
            m[3] = b->kind; /* the form its attention takes */
            m[4] = !b->logits || b->n_tokens <= 0 ? 0 : MS_MIN(MS_MAX(b->n_logits, 1), b->n_tokens);
            memcpy(p, b->tokens, sizeof(int32_t) * (size_t)b->n_tokens);
            p += b->n_tokens;
            for (int s = 0; s < ns; s++) {
                m[META_SEQ + 2 * s] = b->kv->n_pages[s];
                m[META_SEQ + 2 * s + 1] = b->kv->first_live[s];
                memcpy(p, b->kv->pages[s], sizeof(int32_t) * (size_t)b->kv->n_pages[s]);
                p += b->kv->n_pages[s];
            }
        }
    }
    if ((rc = ms_comm_bcast(g, e->bbuf, bytes, 0, err))) return rc;
    if (e->is_leader) return 0;
    if ((int)hdr[0] > e->cap_mbatch) {
        free(e->mbatch);
        free(e->mkv);
        e->mbatch = calloc((size_t)hdr[0], sizeof *e->mbatch);
        e->mkv = calloc((size_t)hdr[0], sizeof *e->mkv);
        e->cap_mbatch = e->mbatch && e->mkv ? (int)hdr[0] : 0;
        if (!e->cap_mbatch) return ms_err(err, MS_ENOMEM, "out of memory");
    }
    if (grow((void **)&e->mdata, &e->cap_mdata, bytes))
        return ms_err(err, MS_ENOMEM, "out of memory");
    memcpy(e->mdata, e->bbuf, bytes);
    int64_t *meta = (int64_t *)e->mdata;
    int32_t *p = (int32_t *)(meta + per * hdr[0]);
    if (grow((void **)&e->mlog_ptr, &e->cap_mlog_ptr, sizeof(float *) * (size_t)hdr[0]) ||
        (rc = ms_engine_member_logits(e, meta + 4, (int)hdr[0], (size_t)per, e->mlog_ptr, err)))
        return rc ? rc : ms_err(err, MS_ENOMEM, "out of memory");
    for (int i = 0; i < (int)hdr[0]; i++) {
        ms_batch_seq *b = &e->mbatch[i];
        const int64_t *m = meta + per * i;
        b->n_tokens = (int32_t)m[0];
        b->start_pos = m[1];
        b->kind = (int32_t)m[3];
        b->tokens = p;
        p += b->n_tokens;
        ms_kv_seq *kv = &e->mkv[i]; /* a view of the leader's page ids (tables not owned) */
        ms_kv_seq_init(kv);
        kv->state_slot = (int32_t)m[2];
        for (int s = 0; s < ns; s++) {
            kv->pages[s] = p;
            kv->n_pages[s] = kv->cap_pages[s] = m[META_SEQ + 2 * s];
            kv->first_live[s] = m[META_SEQ + 2 * s + 1];
            p += kv->n_pages[s];
        }
        kv->n_tokens = b->start_pos + b->n_tokens;
        b->kv = kv;
        b->logits = e->mlog_ptr[i]; /* NULL, or a split head's scratch: sampling happens on
                                     * the group's first rank */
        b->n_logits = (int32_t)m[4];
    }
    *batch = e->mbatch;
    *n = (int)hdr[0];
    return 0;
}

/* ---- events and loads to rank 0 ---- */

static int push_event(ms_engine *e, const ms_sched_event *ev, int dp, const float *logits)
{
    if (e->n_events == e->cap_events) {
        int cap = e->cap_events ? 2 * e->cap_events : 64;
        ms_engine_event *p = realloc(e->events, sizeof *p * (size_t)cap);
        if (!p) return MS_ENOMEM;
        e->events = p;
        e->cap_events = cap;
    }
    ms_engine_event *x = &e->events[e->n_events++];
    x->ev = *ev;
    x->ev.logits = NULL;
    x->dp_rank = dp;
    x->logits = logits;
    x->error = 0;
    x->error_msg = NULL;
    if (ev->finish != MS_FINISH_NONE) {
        e->inflight--;
        ms_router_finish(e->router, dp);
    }
    return 0;
}

/* rank 0: a refusal becomes the request's finish event (its message kept in rej_in). */
static int push_reject(ms_engine *e, const struct reject *r, int dp)
{
    if (grow((void **)&e->rej_in, &e->cap_rej_in, sizeof *r * (size_t)(e->n_rej_in + 1)))
        return MS_ENOMEM;
    e->rej_in[e->n_rej_in++] = *r;
    ms_sched_event x = {.id = r->id, .token = -1, .finish = MS_FINISH_ERROR};
    if (push_event(e, &x, dp, NULL)) return MS_ENOMEM;
    e->events[e->n_events - 1].error = r->code ? r->code : MS_EINTERNAL;
    return 0;
}

/* rej_in may have moved while growing: point the refusals' events at their messages. */
static void link_rejects(ms_engine *e)
{
    int j = 0;
    for (int i = 0; i < e->n_events && j < e->n_rej_in; i++)
        if (e->events[i].error) e->events[i].error_msg = e->rej_in[j++].msg;
}

static int gather_events(ms_engine *e, const ms_sched_event *ev, int n_ev, ms_errbuf *err)
{
    int64_t V = ms_model_shape_of(e->m)->vocab;
    size_t per = sizeof(ms_sched_event) + (e->o.keep_logits ? sizeof(float) * (size_t)V : 0);
    struct wire_ev_hdr h = {
        .n_events = n_ev, .is_leader = e->is_leader, .dp = e->dp_index, .n_rejects = e->n_rejects};
    if (e->is_leader) ms_sched_get_stats(e->sched, &h.st);
    e->n_events = 0;
    e->n_rej_in = 0;
    if (e->W == 1) {
        e->loads[0].st = h.st;
        for (int i = 0; i < e->n_rejects; i++)
            if (push_reject(e, &e->rejects[i], 0)) return ms_err(err, MS_ENOMEM, "out of memory");
        for (int i = 0; i < n_ev; i++)
            push_event(e, &ev[i], 0, e->o.keep_logits ? ev[i].logits : NULL);
        link_rejects(e);
        return 0;
    }
    size_t rej_bytes = sizeof(struct reject) * (size_t)e->n_rejects;
    size_t mine = sizeof h + per * (size_t)n_ev + rej_bytes;
    if (grow((void **)&e->bbuf, &e->cap_bbuf, mine)) return ms_err(err, MS_ENOMEM, "out of memory");
    memcpy(e->bbuf, &h, sizeof h);
    for (int i = 0; i < n_ev; i++) {
        uint8_t *p = e->bbuf + sizeof h + per * (size_t)i;
        memcpy(p, &ev[i], sizeof ev[i]);
        if (e->o.keep_logits && ev[i].logits)
            memcpy(p + sizeof ev[i], ev[i].logits, sizeof(float) * (size_t)V);
    }
    if (rej_bytes) memcpy(e->bbuf + sizeof h + per * (size_t)n_ev, e->rejects, rej_bytes);
    _Static_assert(sizeof(size_t) == sizeof(uint64_t), "byte counts travel as uint64");
    uint64_t my = mine, *all = (uint64_t *)e->g_bytes;
    int rc = ms_comm_gather(e->gs.world, &my, sizeof my, all, 0, err);
    if (rc) return rc;
    size_t total = 0;
    if (e->rank == 0)
        for (int i = 0; i < e->W; i++) {
            e->g_displs[i] = total;
            total += e->g_bytes[i];
        }
    if (e->rank == 0 && grow((void **)&e->gather_buf, &e->cap_gather, total + 1))
        return ms_err(err, MS_ENOMEM, "out of memory");
    rc =
        ms_comm_gatherv(e->gs.world, e->bbuf, mine, e->gather_buf, e->g_bytes, e->g_displs, 0, err);
    if (rc || e->rank != 0) return rc;
    for (int r = 0; r < e->W; r++) {
        const uint8_t *p = e->gather_buf + e->g_displs[r];
        struct wire_ev_hdr rh;
        memcpy(&rh, p, sizeof rh);
        if (!rh.is_leader) continue;
        if (rh.dp >= 0 && rh.dp < e->n_dp) e->loads[rh.dp].st = rh.st;
        for (int i = 0; i < rh.n_events; i++) {
            ms_sched_event x;
            const uint8_t *q = p + sizeof rh + per * (size_t)i;
            memcpy(&x, q, sizeof x);
            if (push_event(e, &x, rh.dp, e->o.keep_logits ? (const float *)(q + sizeof x) : NULL))
                return ms_err(err, MS_ENOMEM, "out of memory");
        }
        for (int i = 0; i < rh.n_rejects; i++) {
            struct reject x;
            memcpy(&x, p + sizeof rh + per * (size_t)rh.n_events + sizeof x * (size_t)i, sizeof x);
            x.msg[sizeof x.msg - 1] = 0;
            if (push_reject(e, &x, rh.dp)) return ms_err(err, MS_ENOMEM, "out of memory");
        }
    }
    link_rejects(e);
    return 0;
}

int ms_engine_count_rows(ms_engine *e, const ms_batch_seq *batch, int n, int64_t *replica_rows,
                         int64_t *all_rows, int64_t *all_dec, ms_errbuf *err)
{
    int64_t rows = 0, dec = 0;
    for (int i = 0; i < n; i++) {
        rows += batch[i].n_tokens;
        dec += batch[i].n_tokens == 1;
    }
    *replica_rows = *all_rows = rows;
    *all_dec = dec;
    if (e->W == 1) return 0;
    int64_t mine[2] = {rows, dec};
    int rc = ms_comm_allgather(e->gs.world, mine, sizeof mine, e->rows_world, err);
    if (rc) return rc;
    int base = e->shard.at.replica * e->lay.tp;
    *replica_rows = *all_rows = *all_dec = 0;
    for (int i = 0; i < e->W; i++) {
        int in_rep = i >= base && i < base + e->lay.tp;
        int counted = (i % e->lay.attn_tp) == 0; /* one member per attention group */
        if (in_rep) {
            e->rows_tp[i - base] = e->rows_world[2 * i];
            *replica_rows += e->rows_world[2 * i];
        }
        if (counted) {
            *all_rows += e->rows_world[2 * i];
            *all_dec += e->rows_world[2 * i + 1];
        }
    }
    return 0;
}

int ms_engine_step(ms_engine *e, ms_errbuf *err)
{
    double t0 = ms_now_s();
    int rc, exit_now = 0;
    /* 1. control */
    if (e->rank == 0) {
        size_t n = seal_ctrl(e);
        if (e->W > 1 && (rc = ms_comm_ctrl_send(e->gs.world, e->ctrl, n, err))) return rc;
        exit_now = apply_ctrl(e, e->ctrl, n, err);
    } else {
        const void *body;
        size_t n;
        if ((rc = ms_comm_ctrl_recv(e->gs.world, &body, &n, err))) return rc;
        exit_now = apply_ctrl(e, body, n, err);
    }
    if (exit_now) return exit_now; /* 1, or an error from a bad block */
    /* 2. batch */
    const ms_batch_seq *batch = NULL;
    int n = e->is_leader ? ms_sched_build(e->sched, &batch) : 0;
    if (e->W > 1 && e->lay.attn_tp > 1 && (rc = share_batch(e, &batch, &n, err))) return rc;
    /* 3. token counts */
    int64_t replica_rows, all_rows, all_dec;
    if ((rc = ms_engine_count_rows(e, batch, n, &replica_rows, &all_rows, &all_dec, err)))
        return rc;
    /* 4. forward (idle ranks of a busy replica run 0 rows through the collectives) */
    if (e->rec && e->is_leader) /* per_token: the tokens of the group's rows, in row order */
        for (int i = 0; i < n; i++)
            ms_expert_recorder_add_seq(e->rec, batch[i].tokens, batch[i].n_tokens,
                                       batch[i].start_pos, batch[i].kind);
    double t_fwd = ms_now_s();
    if (replica_rows > 0 && (rc = ms_model_forward(e->m, e->cache, batch, n, err))) return rc;
    double t_smp = ms_now_s();
    /* the pass's expert hits, summed over all ranks (every rank knows all_rows) */
    if (e->rec && all_rows > 0 &&
        (rc = ms_expert_recorder_end_pass(e->rec, e->W > 1 ? e->gs.world : NULL, err)))
        return rc;
    /* EPLB: maybe plan, maybe move a chunk of layers, between this forward and the next */
    if (e->eplb && all_rows > 0 && (rc = ms_eplb_run_step(e, err))) return rc;
    /* 5. sample and report */
    const ms_sched_event *ev = NULL;
    int n_ev = 0;
    if (e->is_leader) {
        const ms_sample_seq *ss;
        int ns = ms_sched_to_sample(e->sched, &ss);
        ms_sample_batch(e->sampler, ss, ns, e->picks);
        n_ev = ms_sched_commit(e->sched, e->picks, &ev);
    }
    double t_drf = ms_now_s();
    if (e->spec && (rc = ms_engine_spec_draft(e, err))) return rc; /* every rank */
    double t_end = ms_now_s();
    if ((rc = gather_events(e, ev, n_ev, err))) return rc;
    if (e->rank == 0) { /* every DP rank reported as of this step */
        for (int i = 0; i < e->n_dp; i++) {
            const ms_sched_stats *st = &e->loads[i].st;
            e->rloads[i] = (ms_router_load){st->n_running,
                                            st->n_waiting,
                                            st->used_tokens,
                                            st->total_tokens,
                                            st->queued_prefill_tokens,
                                            st->decode_tokens_left};
        }
        ms_router_update(e->router, e->rloads);
    }
    e->last.rows = all_rows;
    e->last.decode_rows = all_dec;
    e->last.verify_rows = 0;
    for (int i = 0; i < n; i++)
        if (batch[i].kind == MS_SEQ_VERIFY) e->last.verify_rows += batch[i].n_tokens;
    e->last.seconds = ms_now_s() - t0;
    e->last.forward_s = t_smp - t_fwd;
    e->last.sample_s = t_drf - t_smp;
    e->last.draft_s = t_end - t_drf;
    return 0;
}

int ms_engine_events(const ms_engine *e, const ms_engine_event **ev)
{
    *ev = e->events;
    return e->n_events;
}

void ms_engine_last_step(const ms_engine *e, ms_engine_step_stats *st)
{
    *st = e->last;
}

int ms_engine_loads(const ms_engine *e, const ms_engine_load **loads)
{
    *loads = e->loads;
    return e->n_dp;
}
