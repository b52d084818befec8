/* request.h — the boundary between the HTTP front end and rank 0's main loop.
 *
 * Owns: the request object (ms_serve_req: id, input ids, sampling params, output
 * channel), the hub (ms_serve_hub: submission queue + eventfd, engine info, the
 * per-DP-rank load snapshot, the step heartbeat).  Does not own scheduling, KV,
 * tokenization or HTTP.  Threads: the front end (any HTTP thread) creates
 * requests and posts messages; rank 0's main thread pops messages, pushes tokens
 * and finishes requests, publishes load.  Every function here is thread-safe.
 *
 * Main-loop protocol (the whole contract):
 *   for (;;) {
 *       if (idle) ms_serve_hub_wait(hub, -1);        // sleeps on the eventfd, no CPU
 *       ms_serve_msg m;
 *       while (ms_serve_hub_pop(hub, &m)) {           // m.req is a reference YOU own
 *           GENERATE: admit m.req (read input_ids, sampling, dp_rank_hint), keep the ref
 *           ABORT: if m.req is yours, drop it and ms_serve_req_finish(.., MS_SERVE_FINISH_ABORT);
 *                  always ms_serve_req_unref(m.req) for the message's own reference
 *           ABORT_ALL: finish every request you hold with MS_SERVE_FINISH_ABORT (m.req is NULL)
 *           FLUSH_CACHE: flush if nothing runs and finish m.req with STOP, else finish it
 *                  with MS_SERVE_FINISH_ERROR "N requests are running"; then unref
 *       }
 *       step(); for each new token: ms_serve_req_push(req, id, logprob, top_ids, top_lps);
 *       on EOS/stop id/length/error: ms_serve_req_finish(req, kind, stop_id, msg); unref(req);
 *       ms_serve_hub_publish_load(hub, dp_rank, &load) per DP rank; ms_serve_hub_heartbeat(hub);
 *   }
 * The engine may also poll ms_serve_req_aborted(req) (set before an ABORT is posted).
 * Stop strings are the front end's job: when one matches it posts ABORT for the request.
 */
#ifndef MS_SERVE_REQUEST_H
#define MS_SERVE_REQUEST_H

#include "base/error.h"
#include "cache/kv_cache.h"
#include "serve/wire.h"

#include <stddef.h>
#include <stdint.h>

/* Named limits on client-controlled sizes (the front end validates against these). */
#define MS_SERVE_RID_MAX      128                 /* request id, bytes incl. NUL */
#define MS_SERVE_MAX_STOP_IDS MS_REQ_MAX_STOP_IDS /* stop_token_ids per request */
#define MS_SERVE_MAX_TOP_LOGPROBS                                                                  \
    MS_REQ_MAX_TOP_LOGPROBS /* top_logprobs per token (OpenAI's limit) */
#define MS_SERVE_MAX_LOGIT_BIAS   MS_REQ_MAX_LOGIT_BIAS /* logit_bias entries */
#define MS_SERVE_MAX_DP           256                   /* DP ranks described in engine info */
#define MS_SERVE_MAX_INPUT_TOKENS (1 << 22) /* hard cap on input ids before the context check */

/* Same values, in the same order, as finish.h's enum ms_finish_kind (checked in
 * tests/test_openai.c), so the step loop may pass them through. */
enum ms_serve_finish {
    MS_SERVE_FINISH_NONE = 0, /* still running */
    MS_SERVE_FINISH_STOP,     /* EOS or a stop token id (matched_stop_id >= 0), or a stop string */
    MS_SERVE_FINISH_LENGTH,   /* max_new_tokens reached (or the context filled up) */
    MS_SERVE_FINISH_ABORT,    /* client gone, /abort_request, stop string, shutdown */
    MS_SERVE_FINISH_ERROR,    /* engine failure; message in finish_msg */
};

/* A seed for a request that gave none (clock and a counter mixed). */
uint64_t ms_serve_random_seed(void);

/* One generated token as the front end reads it back. */
typedef struct ms_serve_tok {
    int32_t id;
    float logprob;
    int32_t n_top;
    int32_t top_ids[MS_SERVE_MAX_TOP_LOGPROBS];
    float top_lps[MS_SERVE_MAX_TOP_LOGPROBS];
} ms_serve_tok;

typedef struct ms_serve_hub ms_serve_hub;

/* The request.  Fields above `priv` are written by the front end before
 * submission and read-only afterwards (engine: read freely, never write). */
typedef struct ms_serve_req {
    uint64_t id; /* unique in this process (1, 2, ...): the engine's request id */
    char rid[MS_SERVE_RID_MAX];
    int32_t *input_ids; /* [n_input], owned by the request */
    int32_t n_input;
    ms_req_params params;           /* sampling, stops, limits (serve/wire.h); ids/n_ids
                                     * point at input_ids; id and dp_rank are set at
                                     * admission */
    int32_t dp_rank_hint;           /* X-Data-Parallel-Rank, or -1; validated < engine info n_dp */
    int is_health_check;            /* a /health_generate probe (1 token, greedy) */
    double t_arrival_s;             /* ms_now_s() when the HTTP request arrived */
    struct ms_serve_req_priv *priv; /* channel state; use the functions below */
} ms_serve_req;

/* ---- front end side ---- */

/* A request with a copy of the ids (n_input >= 0) and the given params.  NULL on
 * failure (ENOMEM or n_input over MS_SERVE_MAX_INPUT_TOKENS).  Refcount 1. */
ms_serve_req *ms_serve_req_new(const char *rid, const int32_t *ids, int32_t n_input,
                               const ms_req_params *p);
void ms_serve_req_ref(ms_serve_req *r);
void ms_serve_req_unref(ms_serve_req *r); /* accepts NULL; frees at zero */

/* Copies up to cap new tokens starting at index `from`, waiting up to timeout_ms
 * (-1 forever, 0 no wait) while none is available and the request is unfinished.
 * Returns the number copied; *finished is set to the finish kind once every
 * token has been read (MS_SERVE_FINISH_NONE otherwise). */
size_t ms_serve_req_take(ms_serve_req *r, size_t from, ms_serve_tok *out, size_t cap,
                         int timeout_ms, int *finished);
/* The same, waiting while fewer than min tokens are available (--stream-interval);
 * on timeout it copies what there is. */
size_t ms_serve_req_take_min(ms_serve_req *r, size_t from, size_t min, ms_serve_tok *out,
                             size_t cap, int timeout_ms, int *finished);
/* After the finish: the engine's matched stop id (-1 none) and message (borrowed,
 * valid while r lives). */
int32_t ms_serve_req_matched_stop(const ms_serve_req *r);
const char *ms_serve_req_finish_msg(const ms_serve_req *r);
/* The HTTP status of an ERROR finish: from the MS_E* code given to ms_serve_req_fail
 * (a request no pool can hold is 400), 500 when the engine gave none. */
int ms_serve_req_error_status(const ms_serve_req *r);
/* Timing from the engine side (seconds, ms_now_s clock; 0 if not yet). */
double ms_serve_req_t_first_token(const ms_serve_req *r);
int32_t ms_serve_req_cached_tokens(const ms_serve_req *r);
/* Speculative decoding so far: its verify steps and accepted draft tokens. */
void ms_serve_req_spec(const ms_serve_req *r, int32_t *verify_ct, int32_t *accepted);
size_t ms_serve_req_n_generated(const ms_serve_req *r);
/* Marks the request aborted (idempotent); the caller then posts MS_MSG_ABORT. */
void ms_serve_req_mark_aborted(ms_serve_req *r);

/* ---- engine side ---- */

/* Appends one generated token; top_ids/top_lps hold params.top_logprobs
 * entries (may be NULL when that is 0).  Wakes the front end.  Ignored after
 * finish.  Returns 0 or MS_ENOMEM (then the request is finished with ERROR). */
int ms_serve_req_push(ms_serve_req *r, int32_t id, float logprob, const int32_t *top_ids,
                      const float *top_lps);
/* Prefix-cache hits of the prompt, reported once after prefill (for usage/metrics). */
void ms_serve_req_set_cached_tokens(ms_serve_req *r, int32_t cached_tokens);
void ms_serve_req_set_spec(ms_serve_req *r, int32_t verify_ct, int32_t accepted);
/* Finishes the request (first call wins); matched_stop_id is the stop token id
 * for STOP (-1 for EOS-less stops), msg a reason for ABORT/ERROR (may be NULL). */
void ms_serve_req_finish(ms_serve_req *r, enum ms_serve_finish kind, int32_t matched_stop_id,
                         const char *msg);
/* Finishes the request with ERROR for the MS_E* code (its HTTP status) and msg. */
void ms_serve_req_fail(ms_serve_req *r, int code, const char *msg);
/* True once the front end marked it aborted (client gone, stop string, abort API). */
int ms_serve_req_aborted(const ms_serve_req *r);
int ms_serve_req_finished(const ms_serve_req *r);

/* ---- engine info and load (filled by the main loop) ---- */

typedef struct ms_engine_info {
    char model_path[512];
    char model_family[32]; /* ms_family name ("deepseek_v3", "deepseek_v4"): the chat format */
    int64_t context_len;
    int32_t page_size;
    int32_t vocab_size;
    char layout[256]; /* human-readable resolved layout, e.g. "tp=8 dp=8 dp-attention ep=8" */
    int32_t tp_size, dp_size, ep_size, pp_size;
    int32_t attn_dp_size, attn_tp_size, moe_tp_size;
    int kv_pool_replicated; /* 1 under attention TP (every member holds the same tokens) */
    int32_t n_dp;           /* entries below (= attn_dp_size, or dp replicas) */
    int64_t max_total_num_tokens[MS_SERVE_MAX_DP]; /* KV capacity per DP rank */
    int n_kv_pools;                                /* the pools of one DP rank (all alike) */
    ms_kv_pool_info kv_pools[MS_KV_MAX_STREAMS];
    double swa_full_tokens_ratio; /* 0: windows sized by running requests */
    int64_t max_position_embeddings;
    double max_concurrency_ctx, max_concurrency_max_pos; /* requests of context_len / max_pos */
    /* a max_position_embeddings-long request's attention cost per attention rank
     * (cache/kv_spec.h), by stream (named kv_stream_names) */
    ms_kv_cost max_position_cost;
    int n_kv_streams;
    char kv_stream_names[MS_KV_MAX_STREAMS][16];
    int32_t max_running_requests, max_running_requests_per_rank;
    int32_t chunked_prefill_size, chunked_prefill_size_per_rank;
    int32_t max_prefill_tokens;
    char dtype[16];
    char load_balance_method[24];        /* DP admission policy (router.h) */
    struct ms_expert_recorder *recorder; /* rank 0's expert distribution recorder, or NULL */
    int32_t n_physical_experts;          /* routed + --ep-num-redundant-experts slots per layer */
    int32_t n_redundant_experts;
    int32_t enable_eplb;        /* --enable-eplb */
    int64_t eplb_staging_bytes; /* its staging buffer on each rank (in the KV budget) */
    int64_t weight_bytes_rank0; /* the weights rank 0 holds (its expert slots included) */
} ms_engine_info;

typedef struct ms_dp_load {
    int32_t num_running_reqs;
    int32_t num_waiting_reqs;
    int64_t num_used_tokens;
    double token_usage;    /* used / capacity */
    double cache_hit_rate; /* recent prefix-cache hit rate, [0, 1] */
    double gen_throughput; /* tokens/s, recent */
    int64_t num_retracted_reqs_total;
    int64_t num_steps_total;
    /* speculative decoding (cumulative): verify steps, drafted and accepted tokens */
    int64_t spec_verify_total, spec_drafted_total, spec_accepted_total;
} ms_dp_load;

/* ---- the hub ---- */

enum ms_serve_msg_kind {
    MS_MSG_GENERATE = 1,
    MS_MSG_ABORT,
    MS_MSG_ABORT_ALL,
    MS_MSG_FLUSH_CACHE,
};

typedef struct ms_serve_msg {
    enum ms_serve_msg_kind kind;
    ms_serve_req *req; /* a reference owned by the receiver (NULL for ABORT_ALL) */
} ms_serve_msg;

/* info is copied; n_dp must be 1..MS_SERVE_MAX_DP.  NULL on failure (reason in e). */
ms_serve_hub *ms_serve_hub_new(const ms_engine_info *info, ms_errbuf *e);
void ms_serve_hub_free(ms_serve_hub *h);                        /* unrefs requests still queued */
const ms_engine_info *ms_serve_hub_info(const ms_serve_hub *h); /* borrowed, immutable */
/* Replaces engine info (n_dp stays); main thread, only before ms_frontend_open
 * (the front end reads info without a lock). */
void ms_serve_hub_set_info(ms_serve_hub *h, const ms_engine_info *info);

/* Main loop: the eventfd (readable while messages are pending or a stop was
 * requested), a blocking wait (-1 = forever) returning 1 if something is
 * pending, and a non-blocking pop (1 = got one, 0 = empty). */
int ms_serve_hub_fd(const ms_serve_hub *h);
int ms_serve_hub_wait(ms_serve_hub *h, int timeout_ms);
int ms_serve_hub_pop(ms_serve_hub *h, ms_serve_msg *out);
void ms_serve_hub_publish_load(ms_serve_hub *h, int32_t dp_rank, const ms_dp_load *load);
void ms_serve_hub_heartbeat(ms_serve_hub *h); /* once per step: watchdog + health probe */

/* Front end: posts a GENERATE (takes its own reference).  MS_EFULL when the
 * queued + waiting requests reach max_queued (<= 0: unlimited), MS_EBUSY while
 * draining. */
int ms_serve_hub_submit(ms_serve_hub *h, ms_serve_req *r, int32_t max_queued, ms_errbuf *e);
/* Posts ABORT (r non-NULL, marks it aborted), ABORT_ALL (r NULL) or FLUSH_CACHE. */
int ms_serve_hub_post(ms_serve_hub *h, enum ms_serve_msg_kind kind, ms_serve_req *r);
/* Copies the load snapshot of n ranks (n <= info n_dp). */
void ms_serve_hub_read_load(ms_serve_hub *h, ms_dp_load *out, int32_t n);
uint64_t ms_serve_hub_heartbeats(ms_serve_hub *h);
double ms_serve_hub_last_heartbeat_s(ms_serve_hub *h);
int32_t ms_serve_hub_n_queued(ms_serve_hub *h); /* GENERATE messages not yet popped */

/* Shutdown: ms_serve_hub_request_stop is async-signal-safe (counts a request
 * and writes the eventfd) so a SIGTERM handler can call it; the main loop
 * checks ms_serve_hub_stop_requested (the number of requests) after each
 * wake-up: 1 drains (http.h), 2 stops at once. */
void ms_serve_hub_request_stop(ms_serve_hub *h);
int ms_serve_hub_stop_requested(const ms_serve_hub *h);
/* Installs SIGTERM, SIGINT and SIGUSR1 handlers that call ms_serve_hub_request_stop(h). */
int ms_serve_hub_install_signals(ms_serve_hub *h);

#endif
