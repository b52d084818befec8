/* bench_report.c — what `moeserve bench` prints and writes: SGLang's "Serving Benchmark
 * Result" block, one JSON line per run with bench_serving's field names (plus failed, p90s,
 * goodput and the observed peak of requests in flight), the sweep table, and the
 * latency–throughput plot drawn by the gnuplot program.  Bench thread only.
 */
#include "tools/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* One latency block of the summary, as SGLang prints it (ITL adds P95 and Max). */
static void print_stats(FILE *f, const char *what, const ms_bench_stats *st, bool p95_max)
{
    char label[64];
    const char *name[] = {"Mean", "Median", "P90", "P95", "P99", "Max"};
    const double v[] = {st->mean, st->median, st->p90, st->p95, st->p99, st->max};
    for (int i = 0; i < 6; i++) {
        if (!p95_max && (i == 3 || i == 5)) continue;
        snprintf(label, sizeof label, "%s %s (ms):", name[i], what);
        fprintf(f, "%-40s %.2f\n", label, v[i]);
    }
}

void ms_bench_report_print(FILE *f, const ms_bench_run_info *in, const ms_bench_metrics *m)
{
    const char *rule = "==================================================";
    fprintf(f, "\n============ Serving Benchmark Result ============\n");
    fprintf(f, "%-40s %s\n", "Backend:", in->backend);
    if (isfinite(in->request_rate) && in->request_rate > 0)
        fprintf(f, "%-40s %g\n", "Traffic request rate:", in->request_rate);
    else
        fprintf(f, "%-40s inf\n", "Traffic request rate:");
    if (in->max_concurrency > 0)
        fprintf(f, "%-40s %d\n", "Max request concurrency:", in->max_concurrency);
    else
        fprintf(f, "%-40s not set\n", "Max request concurrency:");
    fprintf(f, "%-40s %lld\n", "Successful requests:", (long long)m->completed);
    fprintf(f, "%-40s %lld\n", "Failed requests:", (long long)m->failed);
    fprintf(f, "%-40s %.2f\n", "Benchmark duration (s):", m->duration_s);
    fprintf(f, "%-40s %lld\n", "Total input tokens:", (long long)m->total_input);
    fprintf(f, "%-40s %lld\n", "Total generated tokens:", (long long)m->total_output);
    if (m->total_output_retok >= 0)
        fprintf(f, "%-40s %lld\n",
                "Total generated tokens (retokenized):", (long long)m->total_output_retok);
    fprintf(f, "%-40s %.2f\n", "Request throughput (req/s):", m->request_throughput);
    fprintf(f, "%-40s %.2f\n", "Input token throughput (tok/s):", m->input_throughput);
    fprintf(f, "%-40s %.2f\n", "Output token throughput (tok/s):", m->output_throughput);
    fprintf(f, "%-40s %.2f\n", "Total token throughput (tok/s):", m->total_throughput);
    fprintf(f, "%-40s %.2f\n", "Concurrency:", m->concurrency);
    fprintf(f, "%-40s %d\n", "Peak requests in flight:", in->peak_in_flight);
    if (in->spec_accept_length > 0) /* SGLang prints it when the server reports one */
        fprintf(f, "%-40s %.2f\n", "Accept length:", in->spec_accept_length);
    if (m->has_slo) {
        fprintf(f, "%-40s %lld\n", "Requests meeting the SLOs:", (long long)m->good);
        fprintf(f, "%-40s %.2f\n", "Request goodput (req/s):", m->request_goodput);
    }
    fprintf(f, "---------------End-to-End Latency----------------\n");
    print_stats(f, "E2E Latency", &m->e2e_ms, false);
    fprintf(f, "---------------Time to First Token----------------\n");
    print_stats(f, "TTFT", &m->ttft_ms, false);
    fprintf(f, "-----Time per Output Token (excl. 1st token)------\n");
    print_stats(f, "TPOT", &m->tpot_ms, false);
    fprintf(f, "---------------Inter-Token Latency----------------\n");
    print_stats(f, "ITL", &m->itl_ms, true);
    fprintf(f, "%s\n", rule);
}

static void put_stats(json_t *o, const char *name, const ms_bench_stats *s, bool p95_max)
{
    char k[64];
    snprintf(k, sizeof k, "mean_%s_ms", name);
    json_object_set_new(o, k, json_real(s->mean));
    snprintf(k, sizeof k, "median_%s_ms", name);
    json_object_set_new(o, k, json_real(s->median));
    snprintf(k, sizeof k, "std_%s_ms", name);
    json_object_set_new(o, k, json_real(s->std));
    snprintf(k, sizeof k, "p90_%s_ms", name);
    json_object_set_new(o, k, json_real(s->p90));
    if (p95_max) {
        snprintf(k, sizeof k, "p95_%s_ms", name);
        json_object_set_new(o, k, json_real(s->p95));
    }
    snprintf(k, sizeof k, "p99_%s_ms", name);
    json_object_set_new(o, k, json_real(s->p99));
    if (p95_max) {
        snprintf(k, sizeof k, "max_%s_ms", name);
        json_object_set_new(o, k, json_real(s->max));
    }
}

static json_t *num_or_inf(double v)
{
    /* SGLang writes float("inf") as the bare token Infinity; strict JSON has no such token */
    return isfinite(v) && v > 0 ? json_real(v) : json_string("inf");
}

json_t *ms_bench_report_json(const ms_bench_run_info *in, const ms_bench_metrics *m,
                             const ms_bench_result *res, size_t n)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "backend", json_string(in->backend));
    json_object_set_new(o, "dataset_name", json_string(in->dataset_name));
    json_object_set_new(o, "request_rate", num_or_inf(in->request_rate));
    json_object_set_new(o, "max_concurrency",
                        in->max_concurrency > 0 ? json_integer(in->max_concurrency) : json_null());
    json_object_set_new(o, "num_prompts", json_integer(in->num_prompts));
    json_object_set_new(o, "sharegpt_output_len",
                        in->sharegpt_output_len > 0 ? json_integer(in->sharegpt_output_len)
                                                    : json_null());
    json_object_set_new(o, "random_input_len", json_integer(in->random_input_len));
    json_object_set_new(o, "random_output_len", json_integer(in->random_output_len));
    json_object_set_new(o, "random_range_ratio", json_real(in->random_range_ratio));
    json_object_set_new(o, "duration", json_real(m->duration_s));
    json_object_set_new(o, "completed", json_integer(m->completed));
    json_object_set_new(o, "failed", json_integer(m->failed));
    json_object_set_new(o, "total_input_tokens", json_integer(m->total_input));
    json_object_set_new(o, "total_input_tokens_server",
                        m->total_input_server >= 0 ? json_integer(m->total_input_server)
                                                   : json_null());
    json_object_set_new(o, "total_output_tokens", json_integer(m->total_output));
    json_object_set_new(o, "total_output_tokens_retokenized",
                        m->total_output_retok >= 0 ? json_integer(m->total_output_retok)
                                                   : json_null());
    json_object_set_new(o, "request_throughput", json_real(m->request_throughput));
    json_object_set_new(o, "input_throughput", json_real(m->input_throughput));
    json_object_set_new(o, "output_throughput", json_real(m->output_throughput));
    json_object_set_new(o, "total_throughput", json_real(m->total_throughput));
    put_stats(o, "e2e_latency", &m->e2e_ms, false);
    put_stats(o, "ttft", &m->ttft_ms, false);
    put_stats(o, "tpot", &m->tpot_ms, false);
    put_stats(o, "itl", &m->itl_ms, true);
    json_object_set_new(o, "concurrency", json_real(m->concurrency));
    json_object_set_new(o, "max_concurrent_requests", json_integer(in->peak_in_flight));
    json_object_set_new(o, "accept_length",
                        in->spec_accept_length > 0 ? json_real(in->spec_accept_length)
                                                   : json_null());
    if (m->has_slo) {
        const ms_bench_slo *s = in->slo;
        json_t *slo = json_object();
        if (s->ttft_ms >= 0) json_object_set_new(slo, "ttft_ms", json_real(s->ttft_ms));
        if (s->tpot_ms >= 0) json_object_set_new(slo, "tpot_ms", json_real(s->tpot_ms));
        if (s->e2el_ms >= 0) json_object_set_new(slo, "e2el_ms", json_real(s->e2el_ms));
        json_object_set_new(o, "slo", slo);
        json_object_set_new(o, "good_requests", json_integer(m->good));
        json_object_set_new(o, "request_goodput", json_real(m->request_goodput));
    }
    /* distinct failure messages with their counts (at most 8) */
    json_t *errs = json_array();
    for (size_t i = 0; i < n; i++) {
        if (res[i].ok || !res[i].err[0]) continue;
        size_t k, ne = json_array_size(errs);
        for (k = 0; k < ne; k++) {
            json_t *e = json_array_get(errs, k);
            if (!strcmp(json_string_value(json_object_get(e, "error")), res[i].err)) {
                json_object_set_new(
                    e, "count", json_integer(json_integer_value(json_object_get(e, "count")) + 1));
                break;
            }
        }
        if (k == ne && ne < 8)
            json_array_append_new(errs, json_pack("{s:s,s:i}", "error", res[i].err, "count", 1));
    }
    json_object_set_new(o, "errors", errs);
    return o;
}

int ms_bench_report_append(const char *path, const json_t *row, ms_errbuf *err)
{
    char *s = json_dumps(row, JSON_COMPACT);
    if (!s) return ms_err(err, MS_ENOMEM, "out of memory writing --output-file");
    FILE *f = fopen(path, "a");
    int rc = 0;
    if (!f || fprintf(f, "%s\n", s) < 0)
        rc = ms_err(err, MS_EIO, "--output-file %s: cannot write", path);
    if (f && fclose(f) && !rc) rc = ms_err(err, MS_EIO, "--output-file %s: cannot write", path);
    free(s);
    return rc;
}

static void fmt_point(char *b, size_t n, double v)
{
    if (!isfinite(v) || v <= 0)
        snprintf(b, n, "inf");
    else
        snprintf(b, n, "%g", v);
}

void ms_bench_report_sweep_table(FILE *f, const char *axis, const ms_bench_sweep_point *p, int n)
{
    fprintf(f, "\n%-12s %6s %6s %9s %10s %10s %10s %10s %10s %10s %8s\n", axis, "ok", "fail",
            "req/s", "out tok/s", "TTFT mean", "TTFT p99", "TPOT mean", "ITL p99", "E2E mean",
            "conc");
    for (int i = 0; i < n; i++) {
        const ms_bench_metrics *m = &p[i].m;
        char v[32];
        fmt_point(v, sizeof v, p[i].value);
        fprintf(f, "%-12s %6lld %6lld %9.2f %10.1f %10.1f %10.1f %10.2f %10.2f %10.1f %8.2f\n", v,
                (long long)m->completed, (long long)m->failed, m->request_throughput,
                m->output_throughput, m->ttft_ms.mean, m->ttft_ms.p99, m->tpot_ms.mean,
                m->itl_ms.p99, m->e2e_ms.mean, m->concurrency);
    }
    fprintf(f, "(latencies in ms)\n");
}

int ms_bench_report_sweep_plot(const char *path, const char *axis, const ms_bench_sweep_point *p,
                               int n, ms_errbuf *err)
{
    if (strchr(path, '\'') || strchr(path, '\n'))
        return ms_err(err, MS_EINVAL, "--plot-file '%s': quotes and newlines are not allowed",
                      path);
    size_t len = strlen(path);
    bool png = len > 4 && !strcmp(path + len - 4, ".png");
    char data[] = "/tmp/moeserve-bench-XXXXXX";
    int fd = mkstemp(data);
    if (fd < 0) return ms_err(err, MS_EIO, "--plot-file: cannot create a temporary file");
    FILE *df = fdopen(fd, "w");
    if (!df) {
        close(fd);
        unlink(data);
        return ms_err(err, MS_EIO, "--plot-file: cannot write a temporary file");
    }
    for (int i = 0; i < n; i++) {
        const ms_bench_metrics *m = &p[i].m;
        char v[32];
        fmt_point(v, sizeof v, p[i].value);
        fprintf(df, "%.6g %.6g %.6g %.6g %s\n", m->output_throughput, m->e2e_ms.median,
                m->ttft_ms.p99 > 0 ? m->ttft_ms.p99 : 1e-3,
                m->tpot_ms.mean > 0 ? m->tpot_ms.mean : 1e-3, v);
    }
    fclose(df);
    int rc = 0;
    FILE *gp = popen("gnuplot 2>/dev/null", "w");
    if (!gp) {
        rc = ms_err(err, MS_EIO, "--plot-file: cannot run gnuplot (install gnuplot-nox)");
        goto out;
    }
    fprintf(gp, "set terminal %s size 960,600\n", png ? "pngcairo" : "svg dynamic");
    fprintf(gp, "set output '%s'\n", path);
    fprintf(gp, "set title 'moeserve bench: latency vs throughput (labels: %s)' noenhanced\n",
            !strcmp(axis, "rate") ? "request rate" : "max concurrency");
    fprintf(gp, "set xlabel 'output token throughput (tok/s)'\nset ylabel 'latency (ms)'\n"
                "set logscale y 10\nset grid\nset key left top noenhanced\n");
    fprintf(gp,
            "plot '%s' using 1:2 with linespoints lw 2 title 'median E2E', "
            "'' using 1:3 with linespoints title 'p99 TTFT', "
            "'' using 1:4 with linespoints title 'mean TPOT', "
            "'' using 1:2:5 with labels offset 0,1 notitle\n",
            data);
    int st = pclose(gp);
    struct stat sb;
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || stat(path, &sb) || sb.st_size == 0)
        rc = ms_err(err, MS_EIO, "--plot-file %s: gnuplot failed (is gnuplot installed?)", path);
out:
    unlink(data);
    return rc;
}
