/* metrics.c — Prometheus text for sglang:* metrics (metrics.h).  Counters and
 * histograms sit behind one mutex (a handful of updates per request); gauges
 * come from the hub at scrape time. */
#include "serve/metrics.h"

#include "moe/expert_recorder.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUCKETS 24

typedef struct hist {
    const char *name, *help;
    int n;
    double le[MAX_BUCKETS];
    uint64_t count[MAX_BUCKETS + 1]; /* last = +Inf */
    double sum;
    uint64_t total;
} hist;

#define MAX_RESPONSE_KINDS 64

struct ms_metrics {
    pthread_mutex_t mu;
    char model[256]; /* label value, escaped */
    uint64_t prompt_tokens, gen_tokens, cached_tokens, requests, aborted;
    hist ttft, itl, tpot, e2e;
    struct {
        const char *endpoint; /* static */
        int status;
        uint64_t n;
    } resp[MAX_RESPONSE_KINDS]; /* sglang:http_responses_total */
    int n_resp;
};

static void hist_init(hist *h, const char *name, const char *help, const double *le, int n)
{
    memset(h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->n = n;
    memcpy(h->le, le, sizeof(double) * (size_t)n);
}

static void hist_add(hist *h, double v, uint64_t times)
{
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->count[i] += times;
    h->sum += v * (double)times;
    h->total += times;
}

ms_metrics *ms_metrics_new(const char *model_name)
{
    ms_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    size_t j = 0;
    for (const char *p = model_name ? model_name : ""; *p && j + 3 < sizeof m->model; p++) {
        if (*p == '\\' || *p == '"') m->model[j++] = '\\';
        if (*p == '\n') {
            m->model[j++] = '\\';
            m->model[j++] = 'n';
            continue;
        }
        m->model[j++] = *p;
    }
    m->model[j] = 0;
    static const double ttft[] = {0.1, 0.2, 0.4, 0.6, 0.8, 1,  2,   4,   6,
                                  8,   10,  20,  40,  60,  80, 120, 160, 300};
    static const double itl[] = {0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025,
                                 0.03,  0.035, 0.04,  0.06,  0.08, 0.1,   0.2,  0.4,
                                 0.6,   0.8,   1,     2,     4,    6,     8};
    static const double e2e[] = {0.1, 0.2, 0.4, 0.6, 0.8, 1,   2,   4,   6,   8,
                                 10,  20,  40,  60,  80,  100, 150, 200, 300, 600};
    hist_init(&m->ttft, "sglang:time_to_first_token_seconds",
              "Histogram of time to first token in seconds.", ttft,
              (int)(sizeof ttft / sizeof *ttft));
    hist_init(&m->itl, "sglang:inter_token_latency_seconds",
              "Histogram of inter-token latency in seconds.", itl, (int)(sizeof itl / sizeof *itl));
    hist_init(&m->tpot, "sglang:time_per_output_token_seconds",
              "Histogram of time per output token in seconds.", itl,
              (int)(sizeof itl / sizeof *itl));
    hist_init(&m->e2e, "sglang:e2e_request_latency_seconds",
              "Histogram of end-to-end request latency in seconds.", e2e,
              (int)(sizeof e2e / sizeof *e2e));
    return m;
}

void ms_metrics_free(ms_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void ms_metrics_observe_request(ms_metrics *m, int64_t prompt_tokens, int64_t gen_tokens,
                                int64_t cached_tokens, double ttft_s, double e2e_s, int finish)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    if (ttft_s >= 0) hist_add(&m->ttft, ttft_s, 1);
    if (finish == MS_SERVE_FINISH_ABORT) { /* SGLang: counted, not a finished request */
        m->aborted++;
        pthread_mutex_unlock(&m->mu);
        return;
    }
    m->prompt_tokens += (uint64_t)(prompt_tokens > 0 ? prompt_tokens : 0);
    m->gen_tokens += (uint64_t)(gen_tokens > 0 ? gen_tokens : 0);
    m->cached_tokens += (uint64_t)(cached_tokens > 0 ? cached_tokens : 0);
    m->requests++;
    if (e2e_s >= 0) hist_add(&m->e2e, e2e_s, 1);
    if (ttft_s >= 0 && gen_tokens > 1)
        hist_add(&m->tpot, (e2e_s - ttft_s) / (double)(gen_tokens - 1), 1);
    pthread_mutex_unlock(&m->mu);
}

void ms_metrics_observe_response(ms_metrics *m, const char *endpoint, int status)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_resp && !(m->resp[i].endpoint == endpoint && m->resp[i].status == status)) i++;
    if (i == m->n_resp && i < MAX_RESPONSE_KINDS) {
        m->resp[i].endpoint = endpoint;
        m->resp[i].status = status;
        m->n_resp++;
    }
    if (i < m->n_resp) m->resp[i].n++;
    pthread_mutex_unlock(&m->mu);
}

void ms_metrics_observe_itl(ms_metrics *m, double gap_s, int64_t count)
{
    if (!m || count <= 0 || gap_s < 0) return;
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, gap_s / (double)count, (uint64_t)count);
    pthread_mutex_unlock(&m->mu);
}

struct out {
    char *s;
    size_t n, cap;
    int oom;
};

__attribute__((format(printf, 2, 3))) static void put(struct out *o, const char *fmt, ...)
{
    for (;;) {
        if (o->oom) return;
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(o->s + o->n, o->cap - o->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            o->oom = 1;
            return;
        }
        if ((size_t)k < o->cap - o->n) {
            o->n += (size_t)k;
            return;
        }
        size_t cap = o->cap * 2 + (size_t)k;
        char *t = realloc(o->s, cap);
        if (!t) {
            o->oom = 1;
            return;
        }
        o->s = t;
        o->cap = cap;
    }
}

static void head(struct out *o, const char *name, const char *type, const char *help)
{
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist_put(struct out *o, const hist *h, const char *model)
{
    head(o, h->name, "histogram", h->help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->count[i];
        put(o, "%s_bucket{model_name=\"%s\",le=\"%g\"} %llu\n", h->name, model, h->le[i],
            (unsigned long long)cum);
    }
    cum += h->count[h->n];
    put(o, "%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", h->name, model,
        (unsigned long long)cum);
    put(o, "%s_sum{model_name=\"%s\"} %.9g\n", h->name, model, h->sum);
    put(o, "%s_count{model_name=\"%s\"} %llu\n", h->name, model, (unsigned long long)h->total);
}

int ms_metrics_render(ms_metrics *m, ms_serve_hub *hub, char **out, size_t *len)
{
    struct out o = {malloc(8192), 0, 8192, 0};
    if (!o.s) return MS_ENOMEM;
    o.s[0] = 0;
    const char *md = m->model;
    if (hub) {
        const ms_engine_info *info = ms_serve_hub_info(hub);
        int32_t n = info->n_dp;
        ms_dp_load *ld = calloc((size_t)n, sizeof *ld);
        if (!ld) {
            free(o.s);
            return MS_ENOMEM;
        }
        ms_serve_hub_read_load(hub, ld, n);
        int32_t queued = ms_serve_hub_n_queued(hub);
        static const struct {
            const char *name, *help;
        } g[] = {
            {"sglang:num_running_reqs", "The number of running requests."},
            {"sglang:num_queue_reqs", "The number of requests in the waiting queue."},
            {"sglang:num_used_tokens", "The number of used KV tokens."},
            {"sglang:max_total_num_tokens", "KV cache capacity in tokens."},
            {"sglang:token_usage", "The token usage (used / capacity)."},
            {"sglang:cache_hit_rate", "The prefix cache hit rate."},
            {"sglang:gen_throughput", "The generation throughput (token/s)."},
            {"sglang:num_retracted_reqs", "The number of retracted requests since start-up."},
        };
        for (size_t k = 0; k < sizeof g / sizeof g[0]; k++) {
            head(&o, g[k].name, "gauge", g[k].help);
            for (int32_t r = 0; r < n; r++) {
                double v = 0;
                switch (k) {
                case 0:
                    v = ld[r].num_running_reqs;
                    break;
                case 1:
                    v = ld[r].num_waiting_reqs + (r == 0 ? queued : 0);
                    break;
                case 2:
                    v = (double)ld[r].num_used_tokens;
                    break;
                case 3:
                    v = (double)info->max_total_num_tokens[r];
                    break;
                case 4:
                    v = ld[r].token_usage;
                    break;
                case 5:
                    v = ld[r].cache_hit_rate;
                    break;
                case 6:
                    v = ld[r].gen_throughput;
                    break;
                default:
                    v = (double)ld[r].num_retracted_reqs_total;
                    break;
                }
                put(&o, "%s{model_name=\"%s\",dp_rank=\"%d\"} %.9g\n", g[k].name, md, r, v);
            }
        }
        head(&o, "sglang:num_retracted_requests_total", "counter",
             "Number of requests retracted (KV pool full) since start-up.");
        for (int32_t r = 0; r < n; r++)
            put(&o, "sglang:num_retracted_requests_total{model_name=\"%s\",dp_rank=\"%d\"} %lld\n",
                md, r, (long long)ld[r].num_retracted_reqs_total);
        head(&o, "sglang:spec_accept_length", "gauge",
             "Speculative decoding: 1 + accepted draft tokens per verify step (0: none yet).");
        for (int32_t r = 0; r < n; r++)
            put(&o, "sglang:spec_accept_length{model_name=\"%s\",dp_rank=\"%d\"} %.9g\n", md, r,
                ld[r].spec_verify_total > 0
                    ? 1.0 + (double)ld[r].spec_accepted_total / (double)ld[r].spec_verify_total
                    : 0.0);
        static const char *sn[] = {"sglang:spec_verify_steps_total",
                                   "sglang:spec_draft_tokens_total",
                                   "sglang:spec_accepted_tokens_total"};
        static const char *sh[] = {"Speculative verify steps since start-up.",
                                   "Draft tokens proposed since start-up.",
                                   "Draft tokens accepted since start-up."};
        for (int k = 0; k < 3; k++) {
            head(&o, sn[k], "counter", sh[k]);
            for (int32_t r = 0; r < n; r++)
                put(&o, "%s{model_name=\"%s\",dp_rank=\"%d\"} %lld\n", sn[k], md, r,
                    (long long)(k == 0   ? ld[r].spec_verify_total
                                : k == 1 ? ld[r].spec_drafted_total
                                         : ld[r].spec_accepted_total));
        }
        free(ld);
        if (info->recorder) { /* SGLang's summary name; per layer: our own gauge */
            ms_expert_recorder *r = info->recorder;
            ms_recorder_stats st;
            ms_expert_recorder_stats(r, &st);
            head(&o, "sglang:eplb_balancedness", "summary",
                 "Balancedness of MoE in expert parallelism (per forward pass by forward_mode, "
                 "mean over "
                 "layers of (mean+1e-5)/(max+1e-5) of per-EP-rank routed tokens).");
            for (int f = 0; f < MS_REC_N_FM; f++) { /* SGLang's extra label */
                if (!st.fm_count[f]) continue;
                const char *fm = ms_recorder_forward_mode_name(f);
                put(&o,
                    "sglang:eplb_balancedness_sum{model_name=\"%s\",forward_mode=\"%s\"} %.9g\n",
                    md, fm, st.fm_sum[f]);
                put(&o,
                    "sglang:eplb_balancedness_count{model_name=\"%s\",forward_mode=\"%s\"} %lld\n",
                    md, fm, (long long)st.fm_count[f]);
            }
            head(&o, "moeserve:eplb_layer_balancedness", "gauge",
                 "The last forward pass's balancedness of each MoE layer.");
            for (int l = 0; l < ms_expert_recorder_n_layers(r); l++)
                put(&o, "moeserve:eplb_layer_balancedness{model_name=\"%s\",layer=\"%d\"} %.6f\n",
                    md, l, ms_expert_recorder_layer_balancedness(r, l));
        }
    }
    pthread_mutex_lock(&m->mu);
    static const char *cn[] = {"sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                               "sglang:cached_tokens_total", "sglang:num_requests_total",
                               "sglang:num_aborted_requests_total"};
    static const char *ch[] = {"Number of prefill tokens processed.",
                               "Number of generation tokens processed.",
                               "Number of cached prompt tokens.", "Number of requests processed.",
                               "Number of requests aborted."};
    uint64_t cv[] = {m->prompt_tokens, m->gen_tokens, m->cached_tokens, m->requests, m->aborted};
    for (int k = 0; k < 5; k++) {
        head(&o, cn[k], "counter", ch[k]);
        put(&o, "%s{model_name=\"%s\"} %llu\n", cn[k], md, (unsigned long long)cv[k]);
    }
    head(&o, "sglang:http_responses_total", "counter",
         "HTTP responses by endpoint and status (rejected requests: 4xx and 503).");
    for (int i = 0; i < m->n_resp; i++)
        put(&o,
            "sglang:http_responses_total{model_name=\"%s\",endpoint=\"%s\",status=\"%d\"} %llu\n",
            md, m->resp[i].endpoint, m->resp[i].status, (unsigned long long)m->resp[i].n);
    hist_put(&o, &m->ttft, md);
    hist_put(&o, &m->itl, md);
    hist_put(&o, &m->tpot, md);
    hist_put(&o, &m->e2e, md);
    pthread_mutex_unlock(&m->mu);
    if (o.oom) {
        free(o.s);
        return MS_ENOMEM;
    }
    *out = o.s;
    *len = o.n;
    return 0;
}
