/* test_bench_metrics.c — the bench client's pure parts: percentiles (numpy's linear method),
 * mean/std, TPOT, SLO parsing and goodput, the aggregate metrics, SGLang's random lengths and
 * the incremental SSE parser under every split of a stream. */
#include "harness.h"
#include "tools/bench.h"

#include "base/util.h"

#include <stdlib.h>
#include <string.h>

TEST(percentile_matches_numpy)
{
    double a[] = {1, 2, 3, 4};
    /* np.percentile([1,2,3,4], [50, 90, 99, 0, 100]) = 2.5, 3.7, 3.97, 1, 4 */
    CHECK_NEAR(ms_bench_percentile(a, 4, 50), 2.5, 1e-12);
    CHECK_NEAR(ms_bench_percentile(a, 4, 90), 3.7, 1e-12);
    CHECK_NEAR(ms_bench_percentile(a, 4, 99), 3.97, 1e-12);
    CHECK_NEAR(ms_bench_percentile(a, 4, 0), 1, 0);
    CHECK_NEAR(ms_bench_percentile(a, 4, 100), 4, 0);
    double b[] = {15, 20, 35, 40, 50}; /* np.percentile(b, 40) = 29.0 */
    CHECK_NEAR(ms_bench_percentile(b, 5, 40), 29.0, 1e-12);
    double c[] = {7};
    CHECK_NEAR(ms_bench_percentile(c, 1, 99), 7, 0);
    CHECK_NEAR(ms_bench_percentile(NULL, 0, 50), 0, 0);
}

TEST(stats_mean_std_sorted)
{
    double v[] = {9, 2, 4, 4, 5, 4, 7, 5}; /* mean 5, population std 2 */
    ms_bench_stats s;
    ms_bench_stats_compute(v, 8, &s);
    CHECK_NEAR(s.mean, 5, 1e-12);
    CHECK_NEAR(s.std, 2, 1e-12);
    CHECK_NEAR(s.median, 4.5, 1e-12);
    CHECK_NEAR(s.max, 9, 0);
    CHECK_NEAR(s.p90, 7.6, 1e-12); /* rank 6.3 → 7 + 0.3·2 */
    CHECK(s.n == 8);
    ms_bench_stats z;
    ms_bench_stats_compute(NULL, 0, &z);
    CHECK(z.n == 0 && z.mean == 0 && z.p99 == 0 && z.max == 0);
}

static ms_bench_result res(bool ok, double ttft, double e2e, int64_t in, int64_t out)
{
    ms_bench_result r;
    memset(&r, 0, sizeof r);
    r.ok = ok;
    r.ttft_s = ttft;
    r.e2e_s = e2e;
    r.prompt_len = in;
    r.output_len = out;
    r.prompt_len_server = -1;
    r.output_len_retok = -1;
    return r;
}

TEST(tpot_definition)
{
    ms_bench_result r = res(true, 0.1, 1.0, 10, 10);
    double t = -1;
    CHECK(ms_bench_tpot_s(&r, &t));
    CHECK_NEAR(t, 0.1, 1e-12); /* (1.0 − 0.1) / (10 − 1) */
    r.output_len = 1;
    CHECK(!ms_bench_tpot_s(&r, &t));
    r.output_len = 2;
    r.ok = false;
    CHECK(!ms_bench_tpot_s(&r, &t));
}

TEST(slo_parse)
{
    ms_bench_slo s;
    ms_errbuf e = {{0}};
    CHECK(ms_bench_slo_parse("ttft:100,tpot:20", &s, &e) == 0);
    CHECK(s.ttft_ms == 100 && s.tpot_ms == 20 && s.e2el_ms < 0);
    CHECK(ms_bench_slo_parse("e2e:2500", &s, &e) == 0 && s.e2el_ms == 2500 && s.ttft_ms < 0);
    const char *bad[] = {"ttft", "foo:1", "ttft:-1", "ttft:abc", "", "tpot:1e999"};
    for (size_t i = 0; i < MS_ARRAY_LEN(bad); i++) {
        e.msg[0] = 0;
        CHECKF(ms_bench_slo_parse(bad[i], &s, &e) == MS_EINVAL, "'%s' accepted", bad[i]);
        CHECKF(strstr(e.msg, "--slo") != NULL, "message '%s'", e.msg);
    }
}

TEST(goodput_rule)
{
    ms_bench_slo s;
    /* binary-exact values, so "equal passes" is tested without rounding */
    CHECK(ms_bench_slo_parse("ttft:125,tpot:15.625", &s, NULL) == 0);
    ms_bench_result a = res(true, 0.125, 0.25, 5, 9);  /* TTFT and TPOT equal to the SLOs: good */
    ms_bench_result b = res(true, 0.1251, 0.2, 5, 10); /* TTFT over */
    ms_bench_result c = res(true, 0.05, 5.0, 5, 1);    /* one token: TPOT counts 0 */
    ms_bench_result d = res(true, 0.05, 0.05 + 9 * 0.016, 5, 10); /* TPOT over */
    ms_bench_result f = res(false, 0, 0, 5, 0);
    CHECK(ms_bench_slo_good(&s, &a));
    CHECK(!ms_bench_slo_good(&s, &b));
    CHECK(ms_bench_slo_good(&s, &c));
    CHECK(!ms_bench_slo_good(&s, &d));
    CHECK(!ms_bench_slo_good(&s, &f));
    ms_bench_result all[] = {a, b, c, d, f};
    ms_bench_metrics m;
    CHECK(ms_bench_metrics_compute(all, 5, 2.0, &s, &m) == 0);
    CHECK(m.has_slo && m.good == 2);
    CHECK_NEAR(m.request_goodput, 1.0, 1e-12);
}

TEST(aggregates)
{
    double itl1[] = {0.01, 0.03}, itl2[] = {0.02};
    ms_bench_result r[3];
    r[0] = res(true, 0.1, 0.5, 100, 3);
    r[0].itl_s = itl1;
    r[0].n_itl = 2;
    r[0].prompt_len_server = 104;
    r[1] = res(true, 0.3, 0.7, 50, 2);
    r[1].itl_s = itl2;
    r[1].n_itl = 1;
    r[1].prompt_len_server = 53;
    r[2] = res(false, 0, 0, 70, 0);
    ms_bench_metrics m;
    CHECK(ms_bench_metrics_compute(r, 3, 2.0, NULL, &m) == 0);
    CHECK(m.completed == 2 && m.failed == 1);
    CHECK(m.total_input == 150 && m.total_output == 5 && m.total_input_server == 157);
    CHECK(m.total_output_retok == -1 && !m.has_slo);
    CHECK_NEAR(m.request_throughput, 1.0, 1e-12);
    CHECK_NEAR(m.input_throughput, 75.0, 1e-12);
    CHECK_NEAR(m.output_throughput, 2.5, 1e-12);
    CHECK_NEAR(m.total_throughput, 77.5, 1e-12);
    CHECK_NEAR(m.concurrency, (0.5 + 0.7) / 2.0, 1e-12);
    CHECK_NEAR(m.ttft_ms.mean, 200, 1e-9);
    CHECK_NEAR(m.e2e_ms.median, 600, 1e-9);
    /* TPOT per request: (0.5−0.1)/2 = 0.2, (0.7−0.3)/1 = 0.4 */
    CHECK_NEAR(m.tpot_ms.mean, 300, 1e-9);
    CHECK_NEAR(m.tpot_ms.p99, 200 + 0.99 * 200, 1e-9);
    /* ITL pooled over requests: 10, 20, 30 ms */
    CHECK(m.itl_ms.n == 3);
    CHECK_NEAR(m.itl_ms.median, 20, 1e-9);
    CHECK_NEAR(m.itl_ms.max, 30, 1e-9);
    CHECK_NEAR(itl1[0], 0.01, 0); /* the caller's lists are not reordered */
    ms_bench_metrics z;
    CHECK(ms_bench_metrics_compute(r + 2, 1, 1.0, NULL, &z) == 0);
    CHECK(z.completed == 0 && z.failed == 1 && z.ttft_ms.mean == 0 && z.total_input_server == -1);
}

TEST(random_len_sglang_range)
{
    uint64_t rng = 1;
    for (int i = 0; i < 200; i++) CHECK(ms_bench_random_len(128, 1.0, &rng) == 128);
    int64_t lo = 1 << 30, hi = 0;
    for (int i = 0; i < 4000; i++) {
        int64_t v = ms_bench_random_len(10, 0.5, &rng);
        CHECK(v >= 5 && v <= 10);
        lo = MS_MIN(lo, v);
        hi = MS_MAX(hi, v);
    }
    CHECK(lo == 5 && hi == 10);
    lo = 1 << 30, hi = 0;
    for (int i = 0; i < 4000; i++) {
        int64_t v = ms_bench_random_len(8, 0.0, &rng); /* [max(0, 1), 8] */
        lo = MS_MIN(lo, v);
        hi = MS_MAX(hi, v);
    }
    CHECK(lo == 1 && hi == 8);
    CHECK(ms_bench_random_len(3, 0.1, &rng) >= 1); /* floor(0.3) = 0 → 1 */
}

/* ---- SSE --------------------------------------------------------------------------------- */

typedef struct events {
    char buf[4096];
    size_t n;
    int count;
} events;

static int collect(void *ctx, const char *data, size_t n)
{
    events *e = ctx;
    if (strlen(data) != n) e->count += 1000; /* must be NUL-terminated at n */
    if (e->n + n + 2 < sizeof e->buf) {
        memcpy(e->buf + e->n, data, n);
        e->n += n;
        e->buf[e->n++] = '|';
        e->buf[e->n] = 0;
    }
    e->count++;
    return 0;
}

static const char stream_text[] = ": keep-alive\r\n"
                                  "data: {\"a\":1}\r\n\r\n"
                                  "event: message\n"
                                  "data:{\"b\":2}\n\n"
                                  "data: line1\n"
                                  "data: line2\r\r"
                                  "id: 7\n"
                                  "data\n\n"
                                  "data: [DONE]\n\n"
                                  "data: tail";
static const char expect_events[] = "{\"a\":1}|{\"b\":2}|line1\nline2||[DONE]|tail|";

static int run_split(const size_t *cuts, int n_cuts, events *ev)
{
    ms_bench_sse s;
    ms_bench_sse_init(&s, 1024);
    memset(ev, 0, sizeof *ev);
    size_t len = strlen(stream_text), at = 0;
    int rc = 0;
    for (int i = 0; i <= n_cuts && !rc; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        rc = ms_bench_sse_feed(&s, stream_text + at, end - at, collect, ev, NULL);
        at = end;
    }
    if (!rc) rc = ms_bench_sse_finish(&s, collect, ev, NULL);
    ms_bench_sse_deinit(&s);
    return rc;
}

TEST(sse_whole_and_every_split)
{
    events ev;
    CHECK(run_split(NULL, 0, &ev) == 0);
    CHECKF(!strcmp(ev.buf, expect_events), "got '%s'", ev.buf);
    CHECK(ev.count == 6);
    size_t len = strlen(stream_text);
    for (size_t c = 1; c < len; c++) { /* one cut anywhere */
        CHECK(run_split(&c, 1, &ev) == 0);
        CHECKF(!strcmp(ev.buf, expect_events), "cut %zu: got '%s'", c, ev.buf);
    }
    size_t cuts[200];
    for (size_t c = 0; c + 1 < len && c < 200; c++) cuts[c] = c + 1; /* byte by byte */
    CHECK(run_split(cuts, (int)MS_MIN(len - 1, 200), &ev) == 0);
    CHECKF(!strcmp(ev.buf, expect_events), "bytewise: got '%s'", ev.buf);
    uint64_t rng = 99;
    for (int t = 0; t < 300; t++) { /* random multi-cuts */
        int k = 1 + (int)(ms_rng_next(&rng) % 6);
        size_t cs[6];
        for (int i = 0; i < k; i++) cs[i] = 1 + ms_rng_next(&rng) % (len - 1);
        for (int i = 1; i < k; i++) /* sort */
            for (int j = i; j > 0 && cs[j - 1] > cs[j]; j--) {
                size_t x = cs[j];
                cs[j] = cs[j - 1];
                cs[j - 1] = x;
            }
        CHECK(run_split(cs, k, &ev) == 0);
        CHECKF(!strcmp(ev.buf, expect_events), "random cuts: got '%s'", ev.buf);
    }
}

static int stop_at_second(void *ctx, const char *data, size_t n)
{
    int *count = ctx;
    (void)data;
    (void)n;
    return ++*count == 2 ? MS_ECANCELED : 0;
}

TEST(sse_limits_and_stop)
{
    ms_bench_sse s;
    ms_bench_sse_init(&s, 16);
    ms_errbuf e = {{0}};
    events ev = {{0}, 0, 0};
    const char *longline = "data: 0123456789abcdefghijklmnop\n\n";
    CHECK(ms_bench_sse_feed(&s, longline, strlen(longline), collect, &ev, &e) == MS_ETOOBIG);
    CHECK(strstr(e.msg, "longer than 16") != NULL);
    ms_bench_sse_deinit(&s);
    ms_bench_sse_init(&s, 1024);
    int count = 0;
    const char *three = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    CHECK(ms_bench_sse_feed(&s, three, strlen(three), stop_at_second, &count, NULL) ==
          MS_ECANCELED);
    CHECK(count == 2);
    ms_bench_sse_deinit(&s);
}

int main(void)
{
    RUN(percentile_matches_numpy);
    RUN(stats_mean_std_sorted);
    RUN(tpot_definition);
    RUN(slo_parse);
    RUN(goodput_rule);
    RUN(aggregates);
    RUN(random_len_sglang_range);
    RUN(sse_whole_and_every_split);
    RUN(sse_limits_and_stop);
    return TEST_REPORT();
}
