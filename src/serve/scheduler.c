/* scheduler.c — continuous batching over one rank's KV cache (scheduler.h). */
#include "serve/scheduler.h"

#include "base/log.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ST_WAITING = 0, ST_RUNNING = 1 };

struct req {
    ms_req_params in; /* in.ids not used after add */
    int32_t *ids;     /* prompt + generated */
    int64_t n_ids, cap_ids;
    int64_t n_prompt; /* original prompt length */
    int64_t n_out;    /* generated so far (kept across retractions) */
    int64_t n_kv;     /* tokens whose KV is in pages */
    int64_t n_cached; /* prompt tokens served by the prefix cache at first admission */
    int64_t n_peek;   /* prompt tokens the prefix cache held when it arrived (estimate) */
    ms_kv_seq kv;     /* its pages in every stream of the cache */
    ms_radix_node *lock;
    uint64_t rng;
    int state;
    int64_t step_n;                            /* tokens to feed in the step being built */
    int64_t seq;                               /* arrival order */
    int32_t mask_ids[MS_REQ_MAX_STOP_IDS + 1]; /* masked while n_out < in.min_new: EOS, stop ids */
    int n_mask;
    int n_draft; /* drafts waiting at ids[n_ids ..] for the next verify */
    int32_t spec_verify_ct, spec_accepted;
    struct req *next; /* in the waiting or running list */
};

struct ms_sched {
    ms_sched_params p;
    ms_kv_cache *cache;
    ms_radix *radix;
    struct req *waiting, *running; /* singly linked; waiting in admission order */
    int n_waiting, n_running;
    int64_t arrivals;
    /* per-step */
    ms_batch_seq *batch;
    struct req **batch_req;
    int n_batch, cap_batch;
    float *logits; /* [max_running (S+1) + 1][vocab] */
    float *hidden; /* spec_hidden: [cap_hidden][hidden_dim] every fed row's state */
    int64_t cap_hidden, n_logit_rows, n_hidden_rows;
    ms_sched_draft *jobs; /* [cap_batch] the last commit's draft jobs */
    struct req **job_req; /* [cap_batch] their requests */
    int n_jobs;
    ms_sched_event *events;
    int n_events, cap_events;
    ms_sample_seq *to_sample; /* [cap_batch] what each batch sequence samples from */
    ms_kv_seq match;          /* the pages of a prefix hit (no references of its own) */
    double new_token_ratio;   /* share of their remaining max_new running requests are
                               * expected to still generate (SGLang's new_token_ratio) */
    ms_sched_stats st;
};

/* SGLang's admission estimate: start conservative, decay towards the floor each
 * step, jump back up after a retraction. */
#define RATIO_INIT         0.7
#define RATIO_MIN          0.1
#define RATIO_DECAY        0.001
#define RATIO_RETRACT_STEP 0.1

int ms_sched_new(ms_sched **out, const ms_sched_params *p, ms_kv_cache *cache, ms_errbuf *err)
{
    *out = NULL;
    if (p->page_size != ms_kv_cache_page_size(cache) || p->max_running <= 0 || p->chunk_tokens <= 0)
        return ms_err(err, MS_EINVAL, "scheduler: bad parameters");
    ms_sched *s = calloc(1, sizeof *s);
    if (!s) return ms_err(err, MS_ENOMEM, "out of memory");
    s->p = *p;
    s->cache = cache;
    ms_kv_seq_init(&s->match);
    s->cap_batch = p->max_running + 1;
    s->cap_events = 2 * p->max_running + 16;
    s->batch = calloc((size_t)s->cap_batch, sizeof *s->batch);
    s->batch_req = calloc((size_t)s->cap_batch, sizeof *s->batch_req);
    int S = p->spec_steps > 0 ? p->spec_steps : 0;
    s->logits =
        ms_alloc_aligned((size_t)(p->max_running * (S + 1) + 1) * (size_t)p->vocab, sizeof(float));
    s->jobs = calloc((size_t)s->cap_batch, sizeof *s->jobs);
    s->job_req = calloc((size_t)s->cap_batch, sizeof *s->job_req);
    if (!s->job_req) s->jobs = (free(s->jobs), NULL);
    if (p->spec_hidden && S > 0) {
        s->cap_hidden = p->chunk_tokens + (int64_t)(p->max_running + 1) * (S + 1);
        s->hidden = ms_alloc_aligned((size_t)(s->cap_hidden * p->hidden_dim), sizeof(float));
        if (!s->hidden) s->jobs = (free(s->jobs), NULL);
    }
    s->events = calloc((size_t)s->cap_events, sizeof *s->events);
    s->to_sample = calloc((size_t)s->cap_batch, sizeof *s->to_sample);
    if (ms_radix_new(&s->radix, cache) || !s->batch || !s->batch_req || !s->logits || !s->jobs ||
        !s->events || !s->to_sample) {
        ms_sched_free(s);
        return ms_err(err, MS_ENOMEM, "scheduler: out of memory");
    }
    s->st.total_tokens = ms_kv_cache_tokens(cache);
    s->new_token_ratio = RATIO_INIT;
    *out = s;
    return 0;
}

static void release_pages(ms_sched *s, struct req *r)
{
    ms_kv_cache_release(s->cache, &r->kv);
    if (r->lock) ms_radix_unlock(s->radix, r->lock);
    r->lock = NULL;
    r->n_kv = 0;
}

static void free_req(ms_sched *s, struct req *r)
{
    if (!r) return;
    release_pages(s, r);
    free(r->ids);
    ms_kv_seq_deinit(&r->kv);
    free(r);
}

void ms_sched_free(ms_sched *s)
{
    if (!s) return;
    for (struct req *r = s->waiting, *n; r; r = n) n = r->next, free_req(s, r);
    for (struct req *r = s->running, *n; r; r = n) n = r->next, free_req(s, r);
    ms_radix_free(s->radix);
    free(s->batch);
    free(s->batch_req);
    ms_free_aligned(s->logits);
    ms_free_aligned(s->hidden);
    free(s->jobs);
    free(s->job_req);
    free(s->events);
    free(s->to_sample);
    ms_kv_seq_deinit(&s->match);
    free(s);
}

static int push_id(struct req *r, int32_t id)
{
    if (r->n_ids == r->cap_ids) {
        int64_t cap = r->cap_ids * 2 + 16;
        int32_t *p = realloc(r->ids, sizeof(int32_t) * (size_t)cap);
        if (!p) return MS_ENOMEM;
        r->ids = p;
        r->cap_ids = cap;
    }
    r->ids[r->n_ids++] = id;
    return 0;
}

int ms_sched_add(ms_sched *s, const ms_req_params *in, ms_errbuf *err)
{
    if (in->n_ids <= 0) return ms_err(err, MS_EINVAL, "empty prompt");
    int64_t need = in->n_ids + in->max_new;
    if (need > s->p.context_len)
        return ms_err(err, MS_ECONTEXT,
                      "prompt has %lld tokens and max_tokens is %lld: %lld exceeds the context "
                      "length %lld",
                      (long long)in->n_ids, (long long)in->max_new, (long long)need,
                      (long long)s->p.context_len);
    if (need > s->st.total_tokens)
        return ms_err(err, MS_ECONTEXT,
                      "prompt + max_tokens = %lld tokens exceeds the KV pool of %lld tokens per DP "
                      "rank (--max-total-tokens, or --mem-fraction-static of the memory)",
                      (long long)need, (long long)s->st.total_tokens);
    for (int i = 0; i < in->n_bias; i++)
        if (in->bias_ids[i] < 0 || in->bias_ids[i] >= s->p.vocab)
            return ms_err(err, MS_EINVAL, "logit_bias token %d is outside the vocabulary (%lld)",
                          in->bias_ids[i], (long long)s->p.vocab);
    struct req *r = calloc(1, sizeof *r);
    if (!r) return ms_err(err, MS_ENOMEM, "out of memory");
    r->in = *in;
    if (!in->ignore_eos && s->p.eos_id >= 0) r->mask_ids[r->n_mask++] = (int32_t)s->p.eos_id;
    for (int i = 0; i < in->n_stop_ids; i++)
        if (in->stop_ids[i] >= 0 && in->stop_ids[i] < s->p.vocab)
            r->mask_ids[r->n_mask++] = in->stop_ids[i];
    r->in.ids = NULL;
    r->cap_ids = in->n_ids + in->max_new + 1; /* decode never reallocates */
    r->ids = malloc(sizeof(int32_t) * (size_t)r->cap_ids);
    if (!r->ids) {
        free(r);
        return ms_err(err, MS_ENOMEM, "out of memory");
    }
    memcpy(r->ids, in->ids, sizeof(int32_t) * (size_t)in->n_ids);
    r->n_ids = r->n_prompt = in->n_ids;
    r->n_cached = -1;
    ms_kv_seq_init(&r->kv);
    r->n_peek = ms_radix_peek(s->radix, r->ids, r->n_ids);
    r->rng = ms_sample_seed(in->seed);
    r->seq = s->arrivals++;
    struct req **pp = &s->waiting;
    while (*pp) pp = &(*pp)->next;
    *pp = r;
    s->n_waiting++;
    return 0;
}

static ms_sched_event *new_event(ms_sched *s, const struct req *r, int32_t token, int finish)
{
    if (s->n_events == s->cap_events) {
        int cap = 2 * s->cap_events;
        ms_sched_event *e = realloc(s->events, sizeof *e * (size_t)cap);
        if (!e) return NULL;
        s->events = e;
        s->cap_events = cap;
    }
    ms_sched_event *e = &s->events[s->n_events++];
    memset(e, 0, sizeof *e);
    e->id = r->in.id;
    e->token = token;
    e->finish = finish;
    e->prompt_tokens = r->n_prompt;
    e->cached_tokens = r->n_cached < 0 ? 0 : r->n_cached;
    e->completion_tokens = r->n_out;
    e->spec_verify_ct = r->spec_verify_ct;
    e->spec_accepted = r->spec_accepted;
    return e;
}

static struct req *unlink_from(struct req **list, struct req *r)
{
    for (struct req **pp = list; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            r->next = NULL;
            return r;
        }
    return NULL;
}

/* Finishes a running or waiting request: caches its computed prefix, frees the rest. */
static void finish_req(ms_sched *s, struct req *r, int finish, int cache_prefix)
{
    int64_t unit = ms_kv_cache_share_unit(s->cache);
    if (cache_prefix && r->n_kv >= unit) {
        int64_t full = (r->n_kv / unit) * unit;
        ms_radix_node *last;
        ms_radix_insert(s->radix, r->ids, full, &r->kv, &last);
    }
    if (r->state == ST_RUNNING) {
        unlink_from(&s->running, r);
        s->n_running--;
    } else {
        unlink_from(&s->waiting, r);
        s->n_waiting--;
    }
    (void)finish;
    free_req(s, r);
}

int ms_sched_abort(ms_sched *s, uint64_t id)
{
    struct req *lists[2] = {s->waiting, s->running};
    for (int l = 0; l < 2; l++)
        for (struct req *r = lists[l]; r; r = r->next)
            if (r->in.id == id) {
                s->n_jobs = 0; /* the draft jobs may name it */
                new_event(s, r, -1, MS_FINISH_ABORT);
                finish_req(s, r, MS_FINISH_ABORT, 0);
                return 0;
            }
    return MS_ENOENT;
}

/* Reserves r's pages for tokens [0, upto) in every stream (windowed streams
 * only to win_upto), evicting cached prefixes (least recently used first)
 * while a stream is short. */
static int take_pages_upto(ms_sched *s, struct req *r, int64_t upto, int64_t win_upto)
{
    int rc;
    while ((rc = ms_kv_cache_reserve_prompt(s->cache, &r->kv, upto, win_upto)) == MS_EFULL)
        if (ms_radix_evict(s->radix, 1) == 0) break;
    return rc;
}

static int take_pages(ms_sched *s, struct req *r, int64_t upto)
{
    return take_pages_upto(s, r, upto, upto);
}

/* Moves a running request back to the front of the waiting queue. */
static void retract(ms_sched *s, struct req *r)
{
    r->step_n = 0;
    r->n_draft = 0;
    unlink_from(&s->running, r);
    s->n_running--;
    release_pages(s, r);
    r->state = ST_WAITING;
    r->next = s->waiting;
    s->waiting = r;
    s->n_waiting++;
    s->st.n_retracted++;
    s->new_token_ratio = MS_MIN(1.0, s->new_token_ratio + RATIO_RETRACT_STEP);
    MS_LOG(MS_INFO, "sched", "retracted request %llu (%lld generated) to free KV pages",
           (unsigned long long)r->in.id, (long long)r->n_out);
}

static struct req *fewest_generated(ms_sched *s)
{
    struct req *best = NULL;
    for (struct req *r = s->running; r; r = r->next)
        if (!best || r->n_out < best->n_out || (r->n_out == best->n_out && r->seq > best->seq))
            best = r;
    return best;
}

/* Ensures pages cover positions [0, upto); retracts others when short.
 * Returns 0, or 1 when r itself was retracted. */
static int grow(ms_sched *s, struct req *r, int64_t upto)
{
    if (ms_kv_cache_pages_needed(s->cache, &r->kv, upto, NULL) == 0) {
        if (upto > r->kv.n_tokens) r->kv.n_tokens = upto;
        return 0;
    }
    int rc;
    while ((rc = take_pages(s, r, upto)) != 0) {
        if (rc != MS_EFULL) return 1;
        struct req *victim = fewest_generated(s);
        retract(s, victim);
        if (victim == r) return 1;
    }
    return 0;
}

/* Admits one waiting request: prefix match + pages for its whole prompt. */
/* Tokens the running requests are expected to still need (decode headroom). */
static int64_t running_reserve(const ms_sched *s)
{
    double t = 0;
    for (const struct req *r = s->running; r; r = r->next)
        t += (double)(r->in.max_new - r->n_out) * s->new_token_ratio + (double)(r->n_ids - r->n_kv);
    return (int64_t)t;
}

static int admit(ms_sched *s, struct req *r, int64_t budget)
{
    int ps = s->p.page_size;
    /* admission control: the prompt plus its expected decode must fit beside what
     * the running requests are expected to need; free + evictable pages count */
    int64_t avail = ms_kv_cache_free_tokens(s->cache) + ms_radix_evictable_tokens(s->radix);
    int64_t want = r->n_ids + (int64_t)((double)(r->in.max_new - r->n_out) * s->new_token_ratio);
    if (s->n_running > 0 && want + running_reserve(s) > avail) return MS_EFULL;
    ms_radix_node *node;
    int64_t matched = ms_radix_match(s->radix, r->ids, r->n_ids, &s->match, &node);
    int64_t unit = ms_kv_cache_share_unit(s->cache);
    int64_t limit = ((r->n_ids - 1) / unit) * unit; /* the last token must be computed */
    if (matched > limit) matched = limit;
    /* room in the page tables for the whole generation: decode never reallocates */
    if (ms_kv_cache_seq_capacity(s->cache, &r->kv, r->n_ids + r->in.max_new - r->n_out + ps))
        return MS_ENOMEM;
    ms_radix_lock(s->radix, node);
    int rc = matched > 0 ? ms_kv_cache_share(s->cache, &r->kv, &s->match, matched) : 0;
    /* the prompt's whole history now; the windows for its first chunk (later chunks
     * grow them after the previous chunk's slide) */
    if (!rc) rc = take_pages_upto(s, r, r->n_ids, matched + MS_MIN(r->n_ids - matched, budget));
    if (rc) {
        ms_kv_cache_release(s->cache, &r->kv);
        ms_radix_unlock(s->radix, node);
        return rc == MS_ENOMEM ? MS_ENOMEM : MS_EFULL;
    }
    r->lock = node;
    r->n_kv = matched;
    if (r->n_cached < 0) {
        r->n_cached = matched;
        s->st.prompt_tokens_total += r->n_prompt;
        s->st.cached_prompt_tokens_total += matched;
    }
    return 0;
}

static void add_seq(ms_sched *s, struct req *r, int64_t n_tokens)
{
    ms_batch_seq *b = &s->batch[s->n_batch];
    int nd = r->n_kv + 1 == r->n_ids ? r->n_draft : 0; /* a verify: the last token + drafts */
    b->tokens = r->ids + r->n_kv;
    b->n_tokens = (int32_t)n_tokens;
    b->start_pos = r->n_kv;
    b->kv = &r->kv;
    b->logits =
        r->n_kv + n_tokens == r->n_ids + nd ? s->logits + s->n_logit_rows * s->p.vocab : NULL;
    b->n_logits = b->logits ? 1 + nd : 0;
    s->n_logit_rows += b->n_logits;
    /* a generated token being fed back is a decode; prompt tokens are a prefill chunk
     * (a retracted request's regenerated history too); a token with drafts, a verify */
    b->kind = nd > 0                                    ? MS_SEQ_VERIFY
              : n_tokens == 1 && r->n_kv >= r->n_prompt ? MS_SEQ_DECODE
                                                        : MS_SEQ_PREFILL;
    b->hidden = NULL;
    b->n_hidden = 0;
    b->hidden_in = NULL;
    if (s->hidden && s->n_hidden_rows + n_tokens <= s->cap_hidden) {
        b->hidden = s->hidden + s->n_hidden_rows * s->p.hidden_dim;
        b->n_hidden = (int32_t)n_tokens;
        s->n_hidden_rows += n_tokens;
    }
    s->batch_req[s->n_batch++] = r;
}

static struct req *pick_waiting(ms_sched *s)
{
    if (s->p.policy != MS_SCHED_LPM || !s->waiting || !s->waiting->next) return s->waiting;
    /* longest cached prefix first (ties: arrival order); look at the first 64 */
    struct req *best = NULL;
    int64_t best_len = -1;
    int seen = 0;
    for (struct req *r = s->waiting; r && seen < 64; r = r->next, seen++) {
        ms_radix_node *node;
        int64_t m = ms_radix_match(s->radix, r->ids, r->n_ids, &s->match, &node);
        if (m > best_len) best = r, best_len = m;
    }
    return best;
}

int ms_sched_build(ms_sched *s, const ms_batch_seq **batch)
{
    s->n_batch = 0;
    s->n_jobs = 0;
    s->n_logit_rows = s->n_hidden_rows = 0;
    s->new_token_ratio = MS_MAX(RATIO_MIN, s->new_token_ratio - RATIO_DECAY);
    int64_t budget = s->p.chunk_tokens;
    /* running requests: decode tokens and continuing prefill chunks.  Growing
     * one request may retract another, so walk a snapshot and skip those that
     * left the running list. */
    int n_snap = 0;
    for (struct req *r = s->running; r && n_snap < s->cap_batch; r = r->next)
        s->batch_req[n_snap++] = r;
    for (int i = 0; i < n_snap; i++) {
        struct req *r = s->batch_req[i];
        if (r->state != ST_RUNNING) continue;
        int64_t left = r->n_ids - r->n_kv;
        if (left != 1) r->n_draft = 0;
        r->step_n = left == 1 ? 1 + r->n_draft : MS_MIN(left, budget);
        if (r->step_n <= 0) continue;
        if (grow(s, r, r->n_kv + r->step_n)) {
            r->step_n = 0; /* r itself was retracted */
            continue;
        }
        budget -= left > 1 ? r->step_n : r->n_draft; /* verify rows count against the budget */
    }
    for (struct req *r = s->running; r; r = r->next)
        if (r->step_n > 0 && s->n_batch < s->cap_batch) add_seq(s, r, r->step_n);
    /* admit waiting requests into the remaining prefill budget */
    while (s->waiting && s->n_running < s->p.max_running && budget > 0 &&
           s->n_batch < s->cap_batch) {
        struct req *r = pick_waiting(s);
        if (admit(s, r, budget) != 0) break;
        unlink_from(&s->waiting, r);
        s->n_waiting--;
        r->state = ST_RUNNING;
        struct req **pp = &s->running;
        while (*pp) pp = &(*pp)->next;
        *pp = r;
        s->n_running++;
        int64_t n = MS_MIN(r->n_ids - r->n_kv, budget);
        if (r->n_ids - r->n_kv > 1) budget -= n;
        add_seq(s, r, n);
    }
    *batch = s->batch;
    return s->n_batch;
}

static int is_stop(const ms_sched *s, const struct req *r, int32_t t)
{
    if (!r->in.ignore_eos && s->p.eos_id >= 0 && t == s->p.eos_id) return 1;
    for (int i = 0; i < r->in.n_stop_ids; i++)
        if (r->in.stop_ids[i] == t) return 1;
    return 0;
}

/* A request whose prompt was just computed shares it with the requests
 * after it at once, as SGLang caches unfinished requests: its whole pages go
 * into the radix tree (the part already there keeps the tree's pages) and
 * the request's lock moves to the node ending them.  Without memory the tree
 * simply learns nothing now (finish_req tries again). */
static void cache_prompt(ms_sched *s, struct req *r)
{
    int64_t unit = ms_kv_cache_share_unit(s->cache), full = (r->n_kv / unit) * unit;
    ms_radix_node *last;
    if (full == 0 || ms_radix_insert(s->radix, r->ids, full, &r->kv, &last) < 0) return;
    ms_radix_lock(s->radix, last);
    if (r->lock) ms_radix_unlock(s->radix, r->lock);
    r->lock = last;
}

int ms_sched_to_sample(ms_sched *s, const ms_sample_seq **seqs)
{
    for (int b = 0; b < s->n_batch; b++) {
        struct req *r = s->batch_req[b];
        const ms_batch_seq *sq = &s->batch[b];
        ms_sample_seq *q = &s->to_sample[b];
        /* a request with max_new_tokens = 0 finishes without a pick */
        q->logits = sq->logits && r->n_out < r->in.max_new ? sq->logits : NULL;
        q->params = &r->in.samp;
        q->rng = &r->rng;
        q->ids = r->ids;
        q->n_prompt = r->n_prompt;
        q->n_ids = r->n_ids;
        q->top_logprobs = r->in.top_logprobs;
        q->n_bias = r->in.n_bias;
        q->bias_ids = r->in.bias_ids;
        q->bias = r->in.bias;
        q->n_mask =
            r->n_out < r->in.min_new ? r->n_mask : 0; /* min_new_tokens: no stop before it */
        q->mask_ids = r->mask_ids;
        q->mask_rows = (int)MS_MAX(0, MS_MIN(r->in.min_new - r->n_out, 1 << 20));
        q->n_draft = q->logits && sq->kind == MS_SEQ_VERIFY ? sq->n_logits - 1 : 0;
        q->draft = r->ids + r->n_ids;
    }
    *seqs = s->to_sample;
    return s->n_batch;
}

/* Drafts by n-gram lookup (vLLM's prompt lookup): the longest suffix of ids
 * (ngram_max down to ngram_min tokens) that occurred before, latest match
 * first; the tokens after that occurrence.  Returns how many (<= want). */
static int ngram_drafts(const ms_sched *s, const struct req *r, int want, int32_t *out)
{
    const int32_t *ids = r->ids;
    int64_t n = r->n_ids;
    for (int k = MS_MIN(s->p.ngram_max, (int)(n - 1)); k >= MS_MAX(s->p.ngram_min, 1); k--)
        for (int64_t st = n - k - 1; st >= 0; st--) {
            if (memcmp(ids + st, ids + n - k, sizeof(int32_t) * (size_t)k)) continue;
            int m = (int)MS_MIN((int64_t)want, n - (st + k));
            memcpy(out, ids + st + k, sizeof(int32_t) * (size_t)m);
            return m;
        }
    return 0;
}

/* After its step: how many drafts a decoding request may take next (its
 * length and context limits), 0 while prefilling. */
static int draft_room(const ms_sched *s, const struct req *r)
{
    if (s->p.spec_steps <= 0 || r->n_kv + 1 != r->n_ids) return 0;
    int64_t room = MS_MIN(r->in.max_new - r->n_out - 1, s->p.context_len - r->n_ids);
    return (int)MS_MAX(0, MS_MIN((int64_t)s->p.spec_steps, room));
}

/* The request's next drafts: n-gram lookup here, or a job for the caller
 * (the draft layer's extend over the positions just accepted, fed from start). */
static void plan_drafts(ms_sched *s, struct req *r, const ms_batch_seq *sq, int64_t start)
{
    int want = draft_room(s, r);
    r->n_draft = 0;
    if (s->p.spec_steps <= 0) return;
    if (s->p.spec_ngram) {
        if (want > 0) r->n_draft = ngram_drafts(s, r, want, r->ids + r->n_ids);
        return;
    }
    if (s->p.spec_hidden && !sq->hidden) return; /* no hidden rows kept: no draft this time */
    /* the chain's later steps write the draft layer's entries at n_kv .. n_kv+want-2 */
    if (want > 1 && take_pages(s, r, r->n_kv + want - 1)) want = 1;
    s->job_req[s->n_jobs] = r;
    ms_sched_draft *j = &s->jobs[s->n_jobs++];
    memset(j, 0, sizeof *j);
    j->id = r->in.id;
    j->want = want;
    j->seq.tokens = r->ids + start + 1;
    j->seq.n_tokens = (int32_t)(r->n_kv - start);
    j->seq.start_pos = start;
    j->seq.kv = &r->kv;
    j->seq.kind = sq->kind == MS_SEQ_PREFILL ? MS_SEQ_PREFILL : MS_SEQ_VERIFY; /* absorbed form */
    j->seq.hidden_in = sq->hidden;
}

int ms_sched_drafts(ms_sched *s, ms_sched_draft **jobs)
{
    *jobs = s->jobs;
    return s->n_jobs;
}

void ms_sched_set_draft(ms_sched *s, int job, const int32_t *tokens, int n)
{
    if (job < 0 || job >= s->n_jobs) return;
    struct req *r = s->job_req[job];
    n = MS_MAX(0, MS_MIN(n, s->jobs[job].want));
    memcpy(r->ids + r->n_ids, tokens, sizeof(int32_t) * (size_t)n);
    r->n_draft = n;
}

/* Emits pick k of a step for r; returns its finish (MS_FINISH_NONE: go on). */
static int emit(ms_sched *s, struct req *r, const ms_sample_pick *pk, const float *logits)
{
    int32_t t = pk->token;
    int fin = MS_FINISH_NONE;
    r->n_out++;
    s->st.generated_tokens_total++;
    if (push_id(r, t))
        fin = MS_FINISH_ERROR;
    else if (is_stop(s, r, t))
        fin = MS_FINISH_STOP;
    else if (r->n_out >= r->in.max_new || r->n_ids >= s->p.context_len)
        fin = MS_FINISH_LENGTH;
    ms_sched_event *e = new_event(s, r, t, fin);
    if (e) e->logits = logits;
    if (e && r->in.top_logprobs >= 0) {
        e->logprob = pk->logprob;
        e->n_top = MS_MIN(pk->n_top, MS_SCHED_MAX_TOP_LOGPROBS);
        memcpy(e->top_ids, pk->top_ids, sizeof(int32_t) * (size_t)e->n_top);
        memcpy(e->top_lps, pk->top_lps, sizeof(float) * (size_t)e->n_top);
    }
    return fin;
}

int ms_sched_commit(ms_sched *s, const ms_sample_pick *picks, const ms_sched_event **events)
{
    int at = 0; /* this sequence's first pick (ms_sample_batch's layout) */
    s->n_jobs = 0;
    for (int b = 0; b < s->n_batch; b++) {
        struct req *r = s->batch_req[b];
        const ms_batch_seq *sq = &s->batch[b];
        int nd = s->to_sample[b].n_draft, first = at;
        at += nd + 1;
        int64_t start = r->n_kv;
        if (nd > 0) { /* a verify: the positions of accepted drafts stay, the rest roll back */
            int m = 0;
            while (m <= nd && picks && picks[first + m].token >= 0) m++;
            m = MS_MAX(m, 1);
            r->n_kv += m;
            ms_kv_cache_truncate(s->cache, &r->kv, r->n_kv + 1);
            r->spec_verify_ct++;
            r->spec_accepted += m - 1;
            s->st.spec_verify_total++;
            s->st.spec_drafted_total += nd;
            s->st.spec_accepted_total += m - 1;
        } else {
            r->n_kv += sq->n_tokens;
            if (sq->kind == MS_SEQ_DECODE && s->p.spec_steps > 0) {
                r->spec_verify_ct++; /* a verify without drafts (accept length 1) */
                s->st.spec_verify_total++;
            }
        }
        r->n_draft = 0;
        ms_kv_cache_slide(s->cache, &r->kv, r->n_kv); /* windowed streams drop what slid out */
        if (!sq->logits) {
            plan_drafts(s, r, sq, start);
            continue;
        }
        if (sq->kind == MS_SEQ_PREFILL || r->n_out == 0) cache_prompt(s, r);
        if (r->n_out >= r->in.max_new) { /* max_new_tokens = 0 */
            new_event(s, r, -1, MS_FINISH_LENGTH);
            finish_req(s, r, MS_FINISH_LENGTH, 1);
            continue;
        }
        int fin = MS_FINISH_NONE;
        for (int k = 0; k <= nd && fin == MS_FINISH_NONE; k++) {
            const ms_sample_pick *pk = picks ? &picks[first + k] : NULL;
            if (k > 0 && pk->token < 0) break;
            if (!pk || pk->token < 0 || pk->token >= s->p.vocab) { /* caller's bug */
                new_event(s, r, -1, MS_FINISH_ERROR);
                fin = MS_FINISH_ERROR;
                break;
            }
            fin = emit(s, r, pk, sq->logits + (int64_t)k * s->p.vocab);
        }
        if (fin != MS_FINISH_NONE)
            finish_req(s, r, fin, fin != MS_FINISH_ERROR);
        else
            plan_drafts(s, r, sq, start);
    }
    s->n_batch = 0;
    *events = s->events;
    int n = s->n_events;
    s->n_events = 0;
    return n;
}

int ms_sched_take_pending(ms_sched *s, const ms_sched_event **events)
{
    *events = s->events;
    int n = s->n_events;
    s->n_events = 0;
    return n;
}

void ms_sched_get_stats(const ms_sched *s, ms_sched_stats *st)
{
    *st = s->st;
    st->n_running = s->n_running;
    st->n_waiting = s->n_waiting;
    /* as SGLang: pages the prefix cache could give back on demand are not "used" */
    st->used_tokens = s->st.total_tokens - ms_kv_cache_free_tokens(s->cache) -
                      ms_radix_evictable_tokens(s->radix);
    st->cached_tokens = ms_radix_cached_tokens(s->radix);
    st->queued_prefill_tokens = st->decode_tokens_left = 0;
    for (int list = 0; list < 2; list++)
        for (const struct req *r = list ? s->running : s->waiting; r; r = r->next) {
            /* a waiting request's cached prefix: as when it arrived (not re-matched per step) */
            int64_t done = list ? r->n_kv : MS_MAX(r->n_kv, r->n_peek);
            st->queued_prefill_tokens += MS_MAX(r->n_ids - done - 1, 0);
            st->decode_tokens_left += r->in.max_new - r->n_out;
        }
}

int ms_sched_has_work(const ms_sched *s)
{
    return s->n_running > 0 || s->n_waiting > 0;
}

int ms_sched_flush_cache(ms_sched *s)
{
    if (s->n_running > 0 || s->n_waiting > 0) return MS_EBUSY;
    ms_radix_flush(s->radix);
    return 0;
}
