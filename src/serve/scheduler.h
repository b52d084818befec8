/* scheduler.h — the scheduler of one attention-DP rank: continuous batching
 * over that rank's KV pool and radix prefix cache.
 *
 * Each step it builds one forward batch: every running request's next decode
 * token plus prefill chunks of waiting requests within the chunked-prefill
 * budget (mixed batches), admits requests only when pages are available
 * (after evicting unused cached prefixes), and when a decode step cannot get
 * a page it retracts running requests (fewest generated tokens first) back to
 * the waiting queue instead of failing them.  After the forward it samples
 * (per-request seeded RNG), checks stop conditions and emits events.
 * Owns requests while they are inside; owns no I/O.  Main thread only.
 */
#ifndef MS_SERVE_SCHEDULER_H
#define MS_SERVE_SCHEDULER_H

#include "cache/kv_pool.h"
#include "cache/radix.h"
#include "model/model.h"
#include "model/sampler.h"
#include "serve/finish.h"

#include <stdint.h>

#define MS_SCHED_MAX_STOP_IDS 16
#define MS_SCHED_MAX_TOP_LOGPROBS 20
#define MS_SCHED_MAX_LOGIT_BIAS   64

enum ms_sched_policy { MS_SCHED_FCFS = 0, MS_SCHED_LPM = 1 };

typedef struct ms_sched_params {
    int page_size;
    int max_running;      /* per rank */
    int64_t chunk_tokens; /* prefill tokens per step, per rank */
    int policy;
    int64_t context_len;
    int64_t vocab;
    int64_t eos_id;       /* -1: none */
} ms_sched_params;

/* What a new request brings (copied in by ms_sched_add). */
typedef struct ms_sched_input {
    uint64_t id;
    const int32_t *ids;
    int64_t n_ids;
    int64_t max_new;
    ms_sampler_params samp;
    uint64_t seed;
    int ignore_eos;
    int32_t stop_ids[MS_SCHED_MAX_STOP_IDS];
    int n_stop_ids;
    int top_logprobs;     /* -1: no logprobs; 0: chosen token only; n: also the n best */
    int64_t min_new;      /* EOS and stop_ids masked (-inf) while fewer are generated */
    int n_bias;           /* logit_bias: bias[i] added to bias_ids[i]'s logit before sampling */
    int32_t bias_ids[MS_SCHED_MAX_LOGIT_BIAS];
    float bias[MS_SCHED_MAX_LOGIT_BIAS];
} ms_sched_input;

/* One generated token (or a finish without a token). */
typedef struct ms_sched_event {
    uint64_t id;
    int32_t token;        /* -1 when the event only finishes the request */
    float logprob;
    int n_top;
    int32_t top_ids[MS_SCHED_MAX_TOP_LOGPROBS];
    float top_lps[MS_SCHED_MAX_TOP_LOGPROBS];
    int finish;           /* enum ms_finish_kind */
    int64_t prompt_tokens, cached_tokens, completion_tokens;
    const float *logits;  /* [vocab] the token was sampled from (borrowed until the next build) */
} ms_sched_event;

typedef struct ms_sched_stats {
    int n_running, n_waiting;
    int64_t used_tokens;     /* pages in use × page size (requests and cache) */
    int64_t total_tokens;    /* pool capacity */
    int64_t cached_tokens;   /* held by the prefix cache */
    int64_t n_retracted;     /* cumulative */
    int64_t generated_tokens_total; /* cumulative */
    int64_t prompt_tokens_total, cached_prompt_tokens_total; /* for the cache hit rate */
    int64_t queued_prefill_tokens; /* tokens whose KV is still to compute (not the next decode) */
    int64_t decode_tokens_left;    /* max_new not generated yet, running and waiting */
} ms_sched_stats;

typedef struct ms_sched ms_sched;

int ms_sched_new(ms_sched **out, const ms_sched_params *p, ms_kv_pool *pool, ms_errbuf *err);
void ms_sched_free(ms_sched *s);

/* Queues a request.  MS_ECONTEXT if it can never fit (prompt + max_new beyond
 * the context or the whole pool); MS_ENOMEM. */
int ms_sched_add(ms_sched *s, const ms_sched_input *in, ms_errbuf *err);
/* Aborts a request wherever it is; its pages are freed now.  Returns 0, or
 * MS_ENOENT when the id is not here.  An abort event is produced. */
int ms_sched_abort(ms_sched *s, uint64_t id);

/* Builds the next batch (borrowed views, valid until ms_sched_commit).
 * Returns the number of sequences (0 = nothing to run). */
int ms_sched_build(ms_sched *s, const ms_batch_seq **batch);
/* After the forward: samples, advances and finishes requests; returns the
 * events of this step (borrowed until the next build). */
int ms_sched_commit(ms_sched *s, const ms_sched_event **events);
/* Events produced outside a step (aborts); drained by the same commit call
 * or by this function when no step runs. */
int ms_sched_take_pending(ms_sched *s, const ms_sched_event **events);

void ms_sched_get_stats(const ms_sched *s, ms_sched_stats *st);
int ms_sched_has_work(const ms_sched *s);
/* Drops every unused cached prefix; MS_EBUSY while requests run. */
int ms_sched_flush_cache(ms_sched *s);

#endif
