/* engine.h — the step loop of one rank (DESIGN.md §1–2): every rank runs the
 * same protocol in lockstep.
 *
 *   1. rank 0 broadcasts a control block (new requests with their DP rank,
 *      aborts, flush, exit); other ranks sleep in the idle wait until it comes;
 *   2. each attention-DP group's first rank feeds its scheduler and builds the
 *      batch, broadcast to the rest of its attention-TP group;
 *   3. all ranks all-gather their token counts (idle batches of 0 rows still
 *      join every collective; the counts choose the DP-gather mode);
 *   4. forward; 5. the group's first rank samples; events and per-DP-rank
 *      load figures are gathered to rank 0.
 * With one rank no MPI is used at all.  Owns the model, this rank's KV pool
 * and scheduler.  ms_engine_submit/abort/shutdown/events are rank 0 calls;
 * ms_engine_step is called by every rank.  Main thread only.
 */
#ifndef MS_SERVE_ENGINE_H
#define MS_SERVE_ENGINE_H

#include "model/family.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "serve/router.h"
#include "serve/scheduler.h"

#include <stdint.h>

typedef struct ms_engine_opts {
    const char *model_path;
    int threads, exact;
    ms_launch launch; /* parsed SGLang launch flags */
    int page_size;
    int64_t max_total_tokens;   /* per rank; 0: from mem_fraction_static */
    double mem_fraction_static; /* of MemAvailable / ranks on this host */
    int64_t context_length;     /* 0: the model's max_position_embeddings */
    int schedule_policy;        /* enum ms_sched_policy */
    int dispatch_bf16;          /* --ep-dispatch-dtype bf16 */
    int keep_logits;            /* events carry the logits they were sampled from (rank 0) */
    ms_router_opts router;      /* --load-balance-method and its thresholds (DP admission) */
    int max_running_default;    /* global default when --max-running-requests is unset */
    int64_t chunk_default;      /* global default when --chunked-prefill-size is unset */
    int prepack;         /* prepack BF16 weights (ms_model_prepack) before sizing the KV pool */
    int recorder_mode;   /* --expert-distribution-recorder-mode: MS_REC_* (0: none) */
    int recorder_window; /* --expert-distribution-recorder-buffer-size (passes) */
    int64_t recorder_max_tokens; /* --expert-distribution-recorder-max-tokens (per_token rows) */
    int deterministic;           /* --enable-deterministic-inference: batch-invariant outputs */
} ms_engine_opts;

void ms_engine_opts_init(ms_engine_opts *o);

/* An event on rank 0: a scheduler event, its DP rank, and optionally logits.  A
 * request some rank refused has one event: finish MS_FINISH_ERROR, token -1, error
 * its MS_E* code and error_msg the reason. */
typedef struct ms_engine_event {
    ms_sched_event ev;
    int dp_rank;
    const float *logits;   /* [vocab] when keep_logits, else NULL; valid until next step */
    int error;             /* 0, or the MS_E* code of a refusal */
    const char *error_msg; /* NULL, or the refusal (valid until the next step) */
} ms_engine_event;

/* One DP rank's load as last seen by rank 0. */
typedef struct ms_engine_load {
    int dp_rank;
    ms_sched_stats st;
} ms_engine_load;

typedef struct ms_engine_step_stats {
    int64_t rows;        /* tokens computed this step, all ranks' DP groups */
    int64_t decode_rows; /* of which single-token decode rows */
    int64_t verify_rows; /* of which in speculative verify rows (this rank's DP group) */
    double seconds;      /* wall time of the step on this rank */
    /* its parts: the target's forward, sampling with the commit, the draft chain */
    double forward_s, sample_s, draft_s;
} ms_engine_step_stats;

typedef struct ms_engine ms_engine;

/* Start-up shared by the commands, before ms_engine_open: reads config.json
 * (the family table's shape),
 * resolves the launch (every rank, same answer), re-launches this program
 * under `mpirun -np W` when W > 1 ranks are needed and no launcher started
 * it, then starts MPI (W > 1) or just logging (W = 1).  argc/argv are the
 * program's own.  Returns 0, or the exit status to use (1, or 2 for a bad
 * launch) after printing the reason prefixed by cmd. */
int ms_engine_start(const char *cmd, const ms_engine_opts *o, double comm_timeout_s, int argc,
                    char **argv, ms_model_shape *shape, ms_layout *lay, int *world, int *rank);

/* Collective over the world when W > 1 (ms_comm_init must have run).  Resolves
 * the layout, builds groups, loads this rank's shard, with o->prepack
 * prepacks its BF16 weights (ms_model_prepack), sizes the KV pool
 * (--mem-fraction-static: F x MemAvailable before the load, per rank on the
 * host, minus the weights and their prepacked copies). */
int ms_engine_open(ms_engine **out, const ms_engine_opts *o, ms_errbuf *err);
void ms_engine_close(ms_engine *e);

const ms_model *ms_engine_model(const ms_engine *e);
/* The server's warm-up, on every rank before any request (after an open with
 * o->prepack, whose figures st repeats): one prompt of
 * min(max_tokens, the prefill chunk, the pool, the context length) tokens through the model on
 * every rank at once (pages lent by the KV pool; no scheduler, router or
 * metrics involved; all ranks must call it together), so
 * the first real prompt of that size finds the workspaces faulted in and the
 * kernels' buffers and primitives made.  Returns 0 or a negative MS_E*. */
typedef struct ms_engine_warmup_stats {
    int64_t prepacked; /* weight views held prepacked */
    size_t prepacked_bytes;
    double prepack_s;
    int64_t forward_tokens; /* 0: no prompt (the pool is too small) */
    double forward_s;
} ms_engine_warmup_stats;
int ms_engine_warmup(ms_engine *e, int64_t max_tokens, ms_engine_warmup_stats *st, ms_errbuf *err);
/* The start-up `serve` and `generate` share after ms_engine_start: ms_engine_open with
 * o->prepack = !skip_warmup, then (unless skip_warmup, i.e. --skip-server-warmup) the
 * warm-up prompt of up to warmup_tokens, logged on rank 0 ("warm-up: ...").  Every
 * rank together.  On failure *out is NULL. */
#define MS_ENGINE_WARMUP_TOKENS                                                                    \
    2048 /* longer prompts still grow the workspaces on first                                      \
          * use; this covers the default prefill chunk */
int ms_engine_boot(ms_engine **out, ms_engine_opts *o, int skip_warmup, int64_t warmup_tokens,
                   ms_errbuf *err);
const ms_layout *ms_engine_layout(const ms_engine *e);
int ms_engine_is_rank0(const ms_engine *e);
int ms_engine_n_dp(const ms_engine *e);            /* DP ranks: replicas × attn_dp */
int64_t ms_engine_pool_tokens(const ms_engine *e); /* KV pool tokens of each DP rank */
/* Each pool of a DP rank (every DP rank has the same pools); returns how many. */
int ms_engine_kv_pools(const ms_engine *e, ms_kv_pool_info *out);
/* n_tokens-long requests one DP rank's pools hold at once (fractional). */
double ms_engine_kv_concurrency(const ms_engine *e, int64_t n_tokens);
/* The cache's streams (borrowed): ms_kv_spec_cost gives a request's attention cost. */
const ms_kv_spec *ms_engine_kv_spec(const ms_engine *e);
int ms_engine_max_running_per_rank(const ms_engine *e);
int64_t ms_engine_chunk_per_rank(const ms_engine *e);
int64_t ms_engine_context_length(const ms_engine *e);
/* --enable-eplb's staging buffer on this rank (0: off; counted in the KV budget). */
size_t ms_engine_eplb_staging_bytes(const ms_engine *e);
/* --enable-eplb's progress (all 0 when off): rebalance decisions taken (planned or
 * skipped), of them skipped, and whether a plan is still moving layers. */
typedef struct ms_engine_eplb_state {
    int64_t decisions, skipped;
    int moving;
} ms_engine_eplb_state;
void ms_engine_eplb_progress(const ms_engine *e, ms_engine_eplb_state *st);

/* rank 0: queue a request for the DP rank in->dp_rank (-1: the router's choice).
 * Checks the context length now (MS_ECONTEXT with the token counts); the DP rank's
 * scheduler checks its pool, and a request it refuses finishes with an error
 * event (ms_engine_event.error: MS_ECONTEXT when no pool can ever hold it). */
int ms_engine_submit(ms_engine *e, const ms_req_params *in, ms_errbuf *err);
void ms_engine_abort(ms_engine *e, uint64_t id);
int ms_engine_flush_cache(ms_engine *e); /* MS_EBUSY while requests run */
void ms_engine_shutdown(ms_engine *e);
/* rank 0: ms_engine_shutdown, then the step that carries it to every rank.  0 or <0. */
int ms_engine_finish(ms_engine *e, ms_errbuf *err);
/* rank 0: requests submitted and not finished, or control pending. */
int ms_engine_busy(const ms_engine *e);

/* Every rank: one lockstep step.  Returns 0, 1 when told to exit, or <0. */
int ms_engine_step(ms_engine *e, ms_errbuf *err);
/* Every rank but 0: steps as rank 0 says until it ends the run.  0, or <0 on a failure. */
int ms_engine_follow(ms_engine *e, ms_errbuf *err);
/* Speculative decoding's drafts per verify (S; 0 without speculation). */
int ms_engine_spec_steps(const ms_engine *e);
/* rank 0: the events of the last step (borrowed until the next step). */
int ms_engine_events(const ms_engine *e, const ms_engine_event **ev);
void ms_engine_last_step(const ms_engine *e, ms_engine_step_stats *st);
/* rank 0: the load of every DP rank as of the last step. */
int ms_engine_loads(const ms_engine *e, const ms_engine_load **loads);

/* The expert distribution recorder (moe/expert_recorder.h) this engine feeds, NULL
 * without --expert-distribution-recorder-mode.  Its start/stop/dump/stats are
 * thread-safe. */
struct ms_expert_recorder *ms_engine_recorder(const ms_engine *e);

#endif
