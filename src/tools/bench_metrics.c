/* bench_metrics.c — turns per-request results into SGLang bench_serving's aggregates
 * (reference/testing.md §4): TTFT, TPOT = (e2e − ttft)/(output_len − 1), pooled ITL, E2E,
 * throughputs over the benchmark duration, concurrency = Σ e2e / duration, and vLLM-style
 * goodput.  Percentiles are numpy's default (linear interpolation between closest ranks).
 * Pure functions, no I/O; the bench thread calls them.
 */
#include "tools/bench.h"

#include "base/util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void ms_bench_result_deinit(ms_bench_result *r)
{
    if (!r) return;
    free(r->itl_s);
    free(r->text);
    r->itl_s = NULL;
    r->text = NULL;
    r->n_itl = r->cap_itl = r->n_text = r->cap_text = 0;
}

double ms_bench_percentile(const double *sorted, size_t n, double q)
{
    if (n == 0) return 0.0;
    if (q <= 0) return sorted[0];
    if (q >= 100) return sorted[n - 1];
    double rank = q / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double frac = rank - (double)lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void ms_bench_stats_compute(double *v, size_t n, ms_bench_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    if (n == 0) return;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    double mean = sum / (double)n, ss = 0;
    for (size_t i = 0; i < n; i++) ss += (v[i] - mean) * (v[i] - mean);
    out->mean = mean;
    out->std = sqrt(ss / (double)n);
    out->median = ms_bench_percentile(v, n, 50);
    out->p90 = ms_bench_percentile(v, n, 90);
    out->p95 = ms_bench_percentile(v, n, 95);
    out->p99 = ms_bench_percentile(v, n, 99);
    out->max = v[n - 1];
}

bool ms_bench_tpot_s(const ms_bench_result *r, double *tpot_s)
{
    if (!r->ok || r->output_len <= 1) return false;
    *tpot_s = (r->e2e_s - r->ttft_s) / (double)(r->output_len - 1);
    return true;
}

int ms_bench_slo_parse(const char *spec, ms_bench_slo *out, ms_errbuf *err)
{
    out->ttft_ms = out->tpot_ms = out->e2el_ms = -1;
    char buf[256];
    if (!spec || !spec[0] || strlen(spec) >= sizeof buf)
        return ms_err(err, MS_EINVAL, "--slo '%s': expected ttft:MS,tpot:MS,e2el:MS",
                      spec ? spec : "");
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(t, ':');
        if (!colon) return ms_err(err, MS_EINVAL, "--slo '%s': '%s' is not NAME:MS", spec, t);
        *colon = 0;
        const char *v = colon + 1;
        char *end = NULL;
        errno = 0;
        double ms = strtod(v, &end);
        if (errno || !v[0] || *end || !(ms >= 0) || !isfinite(ms))
            return ms_err(err, MS_EINVAL, "--slo '%s': %s needs a number of ms >= 0, got '%s'",
                          spec, t, v);
        double *slot = !strcmp(t, "ttft")                          ? &out->ttft_ms
                       : !strcmp(t, "tpot")                        ? &out->tpot_ms
                       : (!strcmp(t, "e2el") || !strcmp(t, "e2e")) ? &out->e2el_ms
                                                                   : NULL;
        if (!slot)
            return ms_err(err, MS_EINVAL, "--slo '%s': unknown metric '%s' (ttft, tpot, e2el)",
                          spec, t);
        *slot = ms;
    }
    return 0;
}

bool ms_bench_slo_good(const ms_bench_slo *slo, const ms_bench_result *r)
{
    if (!r->ok) return false;
    double tpot = 0;
    (void)ms_bench_tpot_s(r, &tpot); /* stays 0 for output_len <= 1, as vLLM's all_tpots */
    if (slo->ttft_ms >= 0 && !(slo->ttft_ms / 1e3 >= r->ttft_s)) return false;
    if (slo->tpot_ms >= 0 && !(slo->tpot_ms / 1e3 >= tpot)) return false;
    if (slo->e2el_ms >= 0 && !(slo->e2el_ms / 1e3 >= r->e2e_s)) return false;
    return true;
}

static void scale_ms(ms_bench_stats *s)
{
    s->mean *= 1e3;
    s->median *= 1e3;
    s->std *= 1e3;
    s->p90 *= 1e3;
    s->p95 *= 1e3;
    s->p99 *= 1e3;
    s->max *= 1e3;
}

int ms_bench_metrics_compute(const ms_bench_result *r, size_t n, double duration_s,
                             const ms_bench_slo *slo, ms_bench_metrics *out)
{
    memset(out, 0, sizeof *out);
    size_t n_itl = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].ok && !ms_add_size(n_itl, r[i].n_itl, &n_itl)) return MS_ENOMEM;
    double *ttft = malloc(sizeof(double) * (n ? n : 1));
    double *tpot = malloc(sizeof(double) * (n ? n : 1));
    double *e2e = malloc(sizeof(double) * (n ? n : 1));
    double *itl = malloc(sizeof(double) * (n_itl ? n_itl : 1));
    int rc = 0;
    if (!ttft || !tpot || !e2e || !itl) {
        rc = MS_ENOMEM;
        goto out;
    }
    size_t n_ok = 0, n_tpot = 0, k = 0;
    bool all_server_in = true, all_retok = true;
    double sum_e2e = 0;
    out->has_slo = slo && (slo->ttft_ms >= 0 || slo->tpot_ms >= 0 || slo->e2el_ms >= 0);
    for (size_t i = 0; i < n; i++) {
        const ms_bench_result *x = &r[i];
        if (!x->ok) {
            out->failed++;
            continue;
        }
        out->total_input += x->prompt_len;
        out->total_output += x->output_len;
        if (x->prompt_len_server >= 0)
            out->total_input_server += x->prompt_len_server;
        else
            all_server_in = false;
        if (x->output_len_retok >= 0)
            out->total_output_retok += x->output_len_retok;
        else
            all_retok = false;
        ttft[n_ok] = x->ttft_s;
        e2e[n_ok] = x->e2e_s;
        sum_e2e += x->e2e_s;
        n_ok++;
        double t;
        if (ms_bench_tpot_s(x, &t)) tpot[n_tpot++] = t;
        if (x->n_itl) memcpy(itl + k, x->itl_s, sizeof(double) * x->n_itl);
        k += x->n_itl;
        if (out->has_slo && ms_bench_slo_good(slo, x)) out->good++;
    }
    out->completed = (int64_t)n_ok;
    if (!n_ok || !all_server_in) out->total_input_server = -1;
    if (!n_ok || !all_retok) out->total_output_retok = -1;
    out->duration_s = duration_s;
    double d = duration_s > 0 ? duration_s : 1e-9;
    out->request_throughput = (double)n_ok / d;
    out->input_throughput = (double)out->total_input / d;
    out->output_throughput = (double)out->total_output / d;
    out->total_throughput = (double)(out->total_input + out->total_output) / d;
    out->concurrency = sum_e2e / d;
    out->request_goodput = (double)out->good / d;
    ms_bench_stats_compute(ttft, n_ok, &out->ttft_ms);
    ms_bench_stats_compute(tpot, n_tpot, &out->tpot_ms);
    ms_bench_stats_compute(e2e, n_ok, &out->e2e_ms);
    ms_bench_stats_compute(itl, k, &out->itl_ms);
    scale_ms(&out->ttft_ms);
    scale_ms(&out->tpot_ms);
    scale_ms(&out->e2e_ms);
    scale_ms(&out->itl_ms);
out:
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    return rc;
}
