/* scheduler.h — the scheduler of one attention-DP rank: continuous batching
 * over that rank's KV cache of streams and radix prefix cache.
 *
 * Each step it builds one forward batch: every running request's next decode
 * token plus prefill chunks of waiting requests within the chunked-prefill
 * budget (mixed batches), admits requests only when pages are available
 * (after evicting unused cached prefixes), and when a decode step cannot get
 * a page it retracts running requests (fewest generated tokens first) back to
 * the waiting queue instead of failing them.  After the forward it lists what
 * each request samples from (its logits, parameters, RNG state, history);
 * serve/sample.c picks; the commit checks stop conditions and emits events.
 * Owns requests while they are inside; owns no I/O.  Main thread only.
 */
#ifndef MS_SERVE_SCHEDULER_H
#define MS_SERVE_SCHEDULER_H

#include "cache/kv_cache.h"
#include "cache/radix.h"
#include "model/family.h"
#include "model/sampler.h"
#include "serve/finish.h"
#include "serve/sample.h"
#include "serve/wire.h"

#include <stdint.h>

#define MS_SCHED_MAX_STOP_IDS     MS_REQ_MAX_STOP_IDS
#define MS_SCHED_MAX_TOP_LOGPROBS MS_SAMPLE_MAX_TOP

enum ms_sched_policy { MS_SCHED_FCFS = 0, MS_SCHED_LPM = 1 };

typedef struct ms_sched_params {
    int page_size;
    int max_running;      /* per rank */
    int64_t chunk_tokens; /* prefill tokens per step, per rank */
    int policy;
    int64_t context_len;
    int64_t vocab;
    int64_t eos_id; /* -1: none */
    /* speculative decoding: a decoding request with drafts feeds its last token and
     * its n_draft drafts as one verify row (n_draft + 1 positions, logits of each) */
    int spec_steps;  /* S, drafts per verify; 0: no speculation */
    int spec_ngram;  /* 1: drafts come from n-gram lookup in the request's own ids;
                      * 0: from ms_sched_set_draft (the draft layer, or a test) */
    int spec_hidden; /* 1: keep the hidden states of every fed position (hidden_dim
                      * floats each) for the draft layer's extend */
    int64_t hidden_dim;
    int ngram_min, ngram_max; /* n-gram match lengths tried, longest first */
} ms_sched_params;

/* One generated token (or a finish without a token). */
typedef struct ms_sched_event {
    uint64_t id;
    int32_t token; /* -1 when the event only finishes the request */
    float logprob;
    int n_top;
    int32_t top_ids[MS_SCHED_MAX_TOP_LOGPROBS];
    float top_lps[MS_SCHED_MAX_TOP_LOGPROBS];
    int finish; /* enum ms_finish_kind */
    int64_t prompt_tokens, cached_tokens, completion_tokens;
    const float *logits; /* [vocab] the token was sampled from (borrowed until the next build) */
    int32_t spec_verify_ct, spec_accepted; /* the request's verify steps and accepted drafts */
} ms_sched_event;

typedef struct ms_sched_stats {
    int n_running, n_waiting;
    int64_t used_tokens;            /* pages in use × page size (requests and cache) */
    int64_t total_tokens;           /* pool capacity */
    int64_t cached_tokens;          /* held by the prefix cache */
    int64_t n_retracted;            /* cumulative */
    int64_t generated_tokens_total; /* cumulative */
    int64_t prompt_tokens_total, cached_prompt_tokens_total; /* for the cache hit rate */
    int64_t queued_prefill_tokens; /* tokens whose KV is still to compute (not the next decode) */
    int64_t decode_tokens_left;    /* max_new not generated yet, running and waiting */
    int64_t spec_verify_total, spec_drafted_total, spec_accepted_total; /* cumulative */
} ms_sched_stats;

/* After a commit with speculation: one per request that ran and goes on.  seq
 * is the draft layer's extend over the positions the target just accepted
 * (tokens ids[start+1 ..], hidden_in the target's hidden rows, kv its pages;
 * logits NULL: the caller points logits/hidden at its own buffers).  want:
 * drafts it may propose now (0 while still prefilling or at its length
 * limit); the draft chain's later steps write positions seq's end .. +want-2,
 * which its pages already cover. */
typedef struct ms_sched_draft {
    ms_batch_seq seq;
    int want;
    uint64_t id;
} ms_sched_draft;

typedef struct ms_sched ms_sched;

/* cache: borrowed; the scheduler is its only user (reserve, release, share, slide). */
int ms_sched_new(ms_sched **out, const ms_sched_params *p, ms_kv_cache *cache, ms_errbuf *err);
void ms_sched_free(ms_sched *s);

/* Queues a request (its ids are copied; dp_rank is not read).  MS_ECONTEXT if it
 * can never fit (prompt + max_new beyond the context or the whole pool); MS_ENOMEM. */
int ms_sched_add(ms_sched *s, const ms_req_params *in, ms_errbuf *err);
/* Aborts a request wherever it is; its pages are freed now.  Returns 0, or
 * MS_ENOENT when the id is not here.  An abort event is produced. */
int ms_sched_abort(ms_sched *s, uint64_t id);

/* Builds the next batch (borrowed views, valid until ms_sched_commit).
 * Returns the number of sequences (0 = nothing to run). */
int ms_sched_build(ms_sched *s, const ms_batch_seq **batch);
/* After the forward: for each sequence of the batch, what to sample from
 * (logits NULL: nothing this step); borrowed until ms_sched_commit.  The
 * scheduler itself never samples (serve/sample.h picks). */
int ms_sched_to_sample(ms_sched *s, const ms_sample_seq **seqs);
/* Takes the picks (one per batch sequence, as ms_sched_to_sample listed
 * them; NULL when nothing was sampled), advances and finishes requests;
 * returns the events of this step (borrowed until the next build). */
int ms_sched_commit(ms_sched *s, const ms_sample_pick *picks, const ms_sched_event **events);
/* The draft jobs of the last commit (borrowed until the next build or abort). */
int ms_sched_drafts(ms_sched *s, ms_sched_draft **jobs);
/* Sets job `job`'s drafts for its next step (n <= want; 0: a plain decode). */
void ms_sched_set_draft(ms_sched *s, int job, const int32_t *tokens, int n);
/* Events produced outside a step (aborts); drained by the same commit call
 * or by this function when no step runs. */
int ms_sched_take_pending(ms_sched *s, const ms_sched_event **events);

void ms_sched_get_stats(const ms_sched *s, ms_sched_stats *st);
int ms_sched_has_work(const ms_sched *s);
/* Drops every unused cached prefix; MS_EBUSY while requests run. */
int ms_sched_flush_cache(ms_sched *s);

#endif
