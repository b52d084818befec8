/* bench.h — the serving benchmark client (`moeserve bench`): shared types of its files.
 *
 * bench_metrics.c  per-request results → SGLang bench_serving aggregates (pure math)
 * bench_sse.c      incremental Server-Sent-Events framing (pure)
 * bench_dataset.c  random / generated-shared-prefix / sharegpt prompts
 * bench_client.c   libcurl multi driver: one thread, many streams, Poisson arrivals
 * bench_report.c   result block, JSON line, sweep table and gnuplot plot
 * cmd_bench.c      the command line.
 * Nothing here is shared with the server; every function is called from the one bench thread.
 */
#ifndef MS_TOOLS_BENCH_H
#define MS_TOOLS_BENCH_H

#include "base/error.h"
#include "model/tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MS_BENCH_MAX_PROMPTS     1000000            /* --num-prompts, gsp groups × prompts */
#define MS_BENCH_MAX_LEN         (1 << 22)          /* tokens in one prompt or one output */
#define MS_BENCH_MAX_CONCURRENCY 16384              /* --max-concurrency */
#define MS_BENCH_MAX_SSE_LINE    ((size_t)16 << 20) /* one SSE line / event from the server */
#define MS_BENCH_MAX_BODY        ((size_t)64 << 20) /* a non-streamed reply */
#define MS_BENCH_MAX_TEXT        ((size_t)64 << 20) /* generated text kept per request */
#define MS_BENCH_MAX_DATASET     ((size_t)4 << 30)  /* --dataset-path file */
#define MS_BENCH_MAX_SWEEP       32                 /* points of --sweep */
#define MS_BENCH_ERR_LEN         256                /* error text kept per failed request */

typedef enum ms_bench_backend {
    MS_BENCH_MOESERVE,    /* POST /generate, input_ids when known, meta_info token counts */
    MS_BENCH_SGLANG,      /* POST /generate with text (SGLang's `sglang` backend) */
    MS_BENCH_OPENAI,      /* POST /v1/completions */
    MS_BENCH_OPENAI_CHAT, /* POST /v1/chat/completions */
} ms_bench_backend;

/* One prompt of a dataset (all members owned by the dataset). */
typedef struct ms_bench_prompt {
    char *text;   /* UTF-8, NUL-terminated */
    int32_t *ids; /* [n_ids] exact token ids, or NULL (no tokenizer) */
    int64_t n_ids;
    int64_t prompt_len; /* tokens: exact with a tokenizer, else the word-count estimate */
    int64_t output_len; /* tokens to request (max_tokens / max_new_tokens) */
} ms_bench_prompt;

typedef struct ms_bench_dataset {
    ms_bench_prompt *rows; /* [n] */
    size_t n;
    bool exact; /* prompt_len counted with a tokenizer */
} ms_bench_dataset;

/* One request's outcome, measured on the client with a monotonic clock. */
typedef struct ms_bench_result {
    bool ok;
    double start_s;            /* just before the POST (absolute monotonic seconds) */
    double ttft_s;             /* first chunk with non-empty generated content */
    double e2e_s;              /* last SSE event received ([DONE] included) */
    int64_t prompt_len;        /* from the dataset (SGLang's total_input counts these) */
    int64_t prompt_len_server; /* usage.prompt_tokens / meta_info.prompt_tokens, -1 unknown */
    int64_t output_len;        /* server count, else tokenizer count, else requested */
    int64_t output_len_retok;  /* tokenizer count of the generated text, -1 without one */
    double *itl_s;             /* [n_itl] gaps between content chunks (owned) */
    size_t n_itl, cap_itl;
    char *text; /* generated text (owned, NUL-terminated when non-NULL) */
    size_t n_text, cap_text;
    char err[MS_BENCH_ERR_LEN]; /* why it failed ("HTTP 500: ...", "timeout after 3 s") */
} ms_bench_result;

void ms_bench_result_deinit(ms_bench_result *r);

/* ---- metrics (bench_metrics.c) ----------------------------------------------------------- */

/* Summary of one list, in the list's unit.  Empty list: every field 0 (as SGLang's
 * `np.mean(x or 0)`). */
typedef struct ms_bench_stats {
    double mean, median, std, p90, p95, p99, max;
    size_t n;
} ms_bench_stats;

/* Goodput service-level objectives in ms; a negative value means "not set". */
typedef struct ms_bench_slo {
    double ttft_ms, tpot_ms, e2el_ms;
} ms_bench_slo;

typedef struct ms_bench_metrics {
    int64_t completed, failed;
    int64_t total_input, total_output;
    int64_t total_output_retok; /* -1 when unknown (no tokenizer) */
    int64_t total_input_server; /* -1 unless every completed request reported prompt tokens */
    double duration_s;
    double request_throughput, input_throughput, output_throughput, total_throughput;
    ms_bench_stats ttft_ms, tpot_ms, itl_ms, e2e_ms;
    double concurrency; /* Σ e2e / duration: average requests in flight */
    bool has_slo;
    int64_t good;           /* completed requests meeting every SLO */
    double request_goodput; /* good / duration */
} ms_bench_metrics;

/* np.percentile(..., q) with linear interpolation over a sorted array; q in [0, 100]. */
double ms_bench_percentile(const double *sorted, size_t n, double q);
/* Sorts v in place and fills *out (std is the population std, ddof = 0). */
void ms_bench_stats_compute(double *v, size_t n, ms_bench_stats *out);
/* TPOT = (e2e − ttft) / (output_len − 1); returns false when output_len <= 1. */
bool ms_bench_tpot_s(const ms_bench_result *r, double *tpot_s);
/* Parses "ttft:MS,tpot:MS,e2el:MS" (any subset; e2e is an alias of e2el). */
int ms_bench_slo_parse(const char *spec, ms_bench_slo *out, ms_errbuf *err);
/* vLLM's rule: good iff every set SLO satisfies slo >= metric (TPOT 0 when output_len <= 1). */
bool ms_bench_slo_good(const ms_bench_slo *slo, const ms_bench_result *r);
/* Aggregates over n results; slo may be NULL.  ENOMEM only. */
int ms_bench_metrics_compute(const ms_bench_result *r, size_t n, double duration_s,
                             const ms_bench_slo *slo, ms_bench_metrics *out);

/* ---- SSE framing (bench_sse.c) ------------------------------------------------------------ */

/* Called once per event with its data (data lines joined by '\n', NUL-terminated). A
 * non-zero return stops the feed and is returned by it. */
typedef int (*ms_bench_sse_cb)(void *ctx, const char *data, size_t n);

typedef struct ms_bench_sse {
    char *line; /* the incomplete line so far */
    size_t n_line, cap_line;
    char *data; /* the event's data so far */
    size_t n_data, cap_data;
    bool has_data;
    size_t max_bytes; /* limit on one line and on one event */
} ms_bench_sse;

void ms_bench_sse_init(ms_bench_sse *s, size_t max_bytes);
void ms_bench_sse_deinit(ms_bench_sse *s);
/* Feeds bytes split anywhere (inside lines, inside "\r\n"). */
int ms_bench_sse_feed(ms_bench_sse *s, const char *buf, size_t n, ms_bench_sse_cb cb, void *ctx,
                      ms_errbuf *err);
/* At end of stream: dispatches a last event not closed by a blank line. */
int ms_bench_sse_finish(ms_bench_sse *s, ms_bench_sse_cb cb, void *ctx, ms_errbuf *err);

/* ---- datasets (bench_dataset.c) ----------------------------------------------------------- */

typedef enum ms_bench_data_kind {
    MS_BENCH_DATA_RANDOM,
    MS_BENCH_DATA_GSP,
    MS_BENCH_DATA_SHAREGPT,
} ms_bench_data_kind;

typedef struct ms_bench_data_cfg {
    ms_bench_data_kind kind;
    const char *path; /* sharegpt JSON */
    int64_t num_prompts;
    int64_t random_input_len, random_output_len;
    double random_range_ratio;
    int64_t gsp_num_groups, gsp_prompts_per_group, gsp_system_prompt_len, gsp_question_len,
        gsp_output_len;
    int64_t sharegpt_output_len;  /* <= 0: the reference completion's length */
    int64_t sharegpt_context_len; /* <= 0: no limit */
    uint64_t seed;
    const ms_tokenizer *tok; /* optional (borrowed) */
} ms_bench_data_cfg;

/* SGLang's random lengths: uniform integers in [max(floor(len·ratio), 1), len]. */
int64_t ms_bench_random_len(int64_t len, double ratio, uint64_t *rng);
int ms_bench_dataset_build(const ms_bench_data_cfg *c, ms_bench_dataset *out, ms_errbuf *err);
void ms_bench_dataset_deinit(ms_bench_dataset *d);

/* ---- client (bench_client.c) -------------------------------------------------------------- */

typedef struct ms_bench_client_cfg {
    ms_bench_backend backend;
    const char *url; /* the endpoint (…/generate, …/v1/completions, …/v1/chat/completions) */
    const char *model; /* "model" field of OpenAI requests; NULL: omitted */
    bool stream, ignore_eos;
    const json_t *extra;     /* object merged into every request body, or NULL (borrowed) */
    double timeout_s;        /* per request, 0 = none */
    const char *api_key;     /* Authorization: Bearer, or NULL */
    const ms_tokenizer *tok; /* optional: counts generated tokens (borrowed) */
} ms_bench_client_cfg;

typedef void (*ms_bench_progress_fn)(void *ctx, size_t done, size_t failed, size_t total);

typedef struct ms_bench_run_cfg {
    double request_rate; /* requests/s of the Poisson process; <= 0 or inf: all at t = 0 */
    int max_concurrency; /* 0: unlimited */
    uint64_t seed;       /* arrival gaps */
    int64_t max_output;  /* > 0: caps every prompt's output_len (warmup uses 32) */
    ms_bench_progress_fn progress;
    void *progress_ctx;
} ms_bench_run_cfg;

typedef struct ms_bench_run_out {
    double duration_s; /* first dispatch → last completion */
    int peak_in_flight;
} ms_bench_run_out;

/* Sends prompts[i] (i < n) and fills res[i] (initialised here; ms_bench_result_deinit each).
 * Request failures are results, not errors; returns non-zero only when the run cannot start. */
int ms_bench_client_run(const ms_bench_client_cfg *c, const ms_bench_run_cfg *rc,
                        const ms_bench_prompt *prompts, size_t n, ms_bench_result *res,
                        ms_bench_run_out *out, ms_errbuf *err);

/* ---- report (bench_report.c) -------------------------------------------------------------- */

typedef struct ms_bench_run_info {
    const char *backend, *dataset_name;
    double request_rate; /* inf allowed */
    int max_concurrency; /* 0: not set */
    int64_t num_prompts, random_input_len, random_output_len, sharegpt_output_len;
    double random_range_ratio;
    const ms_bench_slo *slo;
    int peak_in_flight;
    double spec_accept_length; /* the server's avg_spec_accept_length; 0: not reported */
} ms_bench_run_info;

void ms_bench_report_print(FILE *f, const ms_bench_run_info *info, const ms_bench_metrics *m);
/* SGLang's result dict (+ failed, p90s, goodput, …); new reference.  errors: distinct
 * failure messages of the run (may be NULL). */
json_t *ms_bench_report_json(const ms_bench_run_info *info, const ms_bench_metrics *m,
                             const ms_bench_result *res, size_t n);
/* Appends one JSON line. */
int ms_bench_report_append(const char *path, const json_t *row, ms_errbuf *err);

typedef struct ms_bench_sweep_point {
    double value; /* concurrency or rate (inf allowed) */
    ms_bench_metrics m;
} ms_bench_sweep_point;

void ms_bench_report_sweep_table(FILE *f, const char *axis, const ms_bench_sweep_point *p, int n);
/* Latency–throughput plot with gnuplot: svg, or png when path ends in .png. */
int ms_bench_report_sweep_plot(const char *path, const char *axis, const ms_bench_sweep_point *p,
                               int n, ms_errbuf *err);

#endif
