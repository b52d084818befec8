/* test_http_limits.c — the HTTP front end under hostile or failing clients, on
 * the loopback servers of tests/http_fixture.h: client disconnects and
 * /abort_request (counted as aborts), flush, the queue limit (503), load/info and
 * /metrics, slowloris and garbage, malformed HTTP answered 4xx at once, the
 * per-client connection cap, trickling headers, the watchdog, drain.
 */
#include "http_fixture.h"

#include <signal.h>
#include <sys/resource.h>

/* Sends a raw POST /v1/completions with body on fd (Connection: close). */
static void send_completion(int fd, const char *body)
{
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: "
                     "close\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    hc_send_all(fd, req, (size_t)n);
}

/* Starts a long streaming request on a raw socket and returns the fd after
 * the first bytes of the body arrived. */
static int start_stream(int p, const char *rid)
{
    int fd = hc_connect(p);
    char body[512];
    snprintf(
        body, sizeof body,
        "{\"prompt\":\"abcdefghij\",\"max_tokens\":300,\"ignore_eos\":true,\"stream\":true%s%s%s}",
        rid ? ",\"rid\":\"" : "", rid ? rid : "", rid ? "\"" : "");
    send_completion(fd, body);
    char buf[512];
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 5000) <= 0 || recv(fd, buf, sizeof buf, 0) <= 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A sample's value in /metrics (-1: not there). */
static double metric(const char *sample)
{
    hresp r;
    double v = -1;
    if (hc_request(port, "GET", "/metrics", NULL, NULL, &r) == 0) {
        const char *p = strstr(r.body, sample);
        if (p) v = strtod(p + strlen(sample), NULL);
        hresp_free(&r);
    }
    return v;
}

#define ABORTED   "sglang:num_aborted_requests_total{model_name=\"echo-model\"} "
#define E2E_COUNT "sglang:e2e_request_latency_seconds_count{model_name=\"echo-model\"} "

TEST(disconnect_aborts)
{
    atomic_store(&eng.step_us, 5000);
    int aborts = atomic_load(&eng.n_aborts);
    double aborted0 = metric(ABORTED), e2e0 = metric(E2E_COUNT);
    int fd = start_stream(port, NULL);
    CHECK(fd >= 0);
    CHECK(wait_until(&eng.n_active, 1, 2.0));
    close(fd);
    CHECK(wait_until(&eng.n_active, 0, 2.0)); /* 300 tokens would take 1.5 s more */
    CHECK(atomic_load(&eng.n_aborts) == aborts + 1);
    /* non-stream request, client gone while waiting */
    fd = hc_connect(port);
    const char *body = "{\"prompt\":\"abcdefghij\",\"max_tokens\":300,\"ignore_eos\":true}";
    send_completion(fd, body);
    CHECK(wait_until(&eng.n_active, 1, 2.0));
    close(fd);
    CHECK(wait_until(&eng.n_active, 0, 2.0));
    CHECK(atomic_load(&eng.n_aborts) == aborts + 2);
    CHECK(wait_until((atomic_int *)&eng.n_active, 0, 0.1) && ms_frontend_live_requests(fe) == 0);
    atomic_store(&eng.step_us, 0);
    /* both counted as aborted, neither in the end-to-end latency histogram (SGLang) */
    CHECKF(metric(ABORTED) == aborted0 + 2, "aborted %g -> %g", aborted0, metric(ABORTED));
    CHECKF(metric(E2E_COUNT) == e2e0, "e2e count %g -> %g", e2e0, metric(E2E_COUNT));
}

TEST(abort_api_and_flush)
{
    atomic_store(&eng.step_us, 5000);
    double aborted0 = metric(ABORTED);
    int fd = start_stream(port, "my-rid-1");
    CHECK(fd >= 0);
    hresp r;
    CHECK(hc_request(port, "POST", "/flush_cache", "", NULL, &r) == 0);
    CHECKF(r.status == 400, "flush while running: %d", r.status);
    hresp_free(&r);
    CHECK(hc_request(port, "POST", "/abort_request", "{\"rid\":\"my-rid-1\"}", NULL, &r) == 0);
    CHECK(r.status == 200 && strstr(r.body, "\"aborted\":1"));
    hresp_free(&r);
    char *rest = NULL;
    hc_read_all(fd, &rest, 5);
    close(fd);
    CHECKF(rest && strstr(rest, "\"finish_reason\":\"abort\"") && strstr(rest, "data: [DONE]"),
           "%s", rest ? rest : "");
    free(rest);
    CHECK(wait_until(&eng.n_active, 0, 2.0));
    CHECK(hc_request(port, "POST", "/flush_cache", "", NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
    atomic_store(&eng.step_us, 0);
    CHECKF(metric(ABORTED) == aborted0 + 1, "aborted %g -> %g", aborted0, metric(ABORTED));
}

TEST(queue_full_503)
{
    atomic_store(&eng.paused, 1);
    usleep(20000); /* the engine is past any pop in progress */
    int fds[2];
    const char *body = "{\"prompt\":\"ab\",\"max_tokens\":2}";
    for (int i = 0; i < 2; i++) {
        fds[i] = hc_connect(port_q);
        send_completion(fds[i], body);
    }
    double end = hc_now() + 2;
    while (ms_serve_hub_n_queued(hub) < 2 && hc_now() < end) usleep(1000);
    int nq = ms_serve_hub_n_queued(hub);
    /* two connection threads waiting for tokens use (almost) no CPU */
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    usleep(500000);
    getrusage(RUSAGE_SELF, &ru1);
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec -
                          ru0.ru_stime.tv_sec) +
                 (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec -
                          ru0.ru_stime.tv_usec) *
                     1e-6;
    int ok;
    expect_error(port_q, "POST", "/v1/completions", body, NULL, 503, "queue is full", &ok);
    atomic_store(&eng.paused, 0);
    for (int i = 0; i < 2; i++) {
        char *raw = NULL;
        hc_read_all(fds[i], &raw, 5);
        close(fds[i]);
        CHECK(raw && !strncmp(raw, "HTTP/1.1 200", 12));
        free(raw);
    }
    CHECK(ok);
    CHECKF(nq == 2, "queued %d", nq);
    CHECKF(cpu < 0.1, "waiting used %.3f s CPU in 0.5 s", cpu);
}

TEST(load_info_metrics)
{
    /* one rejected request of each kind, for the response counters below */
    int ok;
    expect_error(port, "POST", "/v1/chat/completions", "{\"messages\": [", NULL, 400, NULL, &ok);
    CHECK(ok);
    size_t big = 100 * 1024; /* over this fixture's 64 KiB body limit */
    char *b = malloc(big + 64);
    CHECK(b);
    strcpy(b, "{\"prompt\":\"");
    memset(b + 11, 'a', big);
    strcpy(b + 11 + big, "\"}");
    expect_error(port, "POST", "/v1/completions", b, NULL, 413, "larger than", &ok);
    free(b);
    CHECK(ok);
    hresp r;
    CHECK(hc_request(port, "GET", "/get_load", NULL, NULL, &r) == 0 && r.status == 200);
    json_t *o = body_json(&r);
    CHECK(json_array_size(o) == 2);
    CHECK(json_integer_value(json_object_get(json_array_get(o, 1), "dp_rank")) == 1);
    json_decref(o);
    hresp_free(&r);
    CHECK(hc_request(port, "GET", "/server_info", NULL, NULL, &r) == 0 && r.status == 200);
    o = body_json(&r);
    CHECK(json_integer_value(json_object_get(o, "context_length")) == CTX);
    CHECK(json_array_size(json_object_get(o, "max_total_num_tokens_per_dp_rank")) == 2);
    CHECK(json_integer_value(json_object_get(o, "max_running_requests_per_dp_rank")) == 16);
    CHECK(json_array_size(json_object_get(o, "internal_states")) == 2);
    json_decref(o);
    hresp_free(&r);
    CHECK(hc_request(port, "GET", "/get_server_info", NULL, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
    CHECK(hc_request(port, "GET", "/metrics", NULL, NULL, &r) == 0 && r.status == 200);
    CHECK(strstr(r.body, "sglang:num_requests_total{model_name=\"echo-model\"}"));
    CHECK(strstr(r.body, "sglang:num_running_reqs{model_name=\"echo-model\",dp_rank=\"1\"} 0"));
    CHECK(strstr(r.body, "sglang:time_to_first_token_seconds_bucket"));
    /* rejected requests and retractions are counted */
    CHECK(strstr(r.body, "sglang:http_responses_total{model_name=\"echo-model\",endpoint=\"/v1/"
                         "completions\",status=\"413\"} "));
    CHECK(strstr(r.body, "sglang:http_responses_total{model_name=\"echo-model\",endpoint=\"/v1/"
                         "chat/completions\",status=\"400\"} "));
    CHECK(strstr(r.body,
                 "sglang:num_retracted_requests_total{model_name=\"echo-model\",dp_rank=\"0\"} "));
    char path[] = "/tmp/ms_metrics_XXXXXX";
    int tfd = mkstemp(path);
    CHECK(tfd >= 0);
    CHECK(write(tfd, r.body, r.n) == (ssize_t)r.n);
    close(tfd);
    hresp_free(&r);
    /* promtool: only the "should not contain ':'" lint is allowed (SGLang's names have colons) */
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "promtool check metrics < %s 2>&1 | grep -v \"metric names should not contain ':'\"",
             path);
    FILE *p = popen(cmd, "r");
    char out[1024] = "";
    size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[got] = 0;
    if (p) pclose(p);
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s > /dev/null 2>&1; test $? -le 3", path);
    int prc = system(cmd);
    unlink(path);
    CHECKF(got == 0, "promtool: %s", out);
    CHECK(prc == 0);
    /* promtool does catch broken text (the check can fail) */
    CHECK(system("printf 'sglang_x{a=\"1\" 3\\n' | promtool check metrics > /dev/null 2>&1") != 0);
}

TEST(slowloris_and_garbage)
{
    int fds[20];
    for (int i = 0; i < 20; i++) {
        fds[i] = hc_connect(port);
        hc_send_all(fds[i], "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le", 49);
    }
    double t0 = hc_now();
    hresp r;
    CHECK(hc_request(port, "GET", "/health", NULL, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
    CHECK(hc_now() - t0 < 1.0);
    /* binary garbage, a huge header, then the server still answers */
    int g = hc_connect(port);
    char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)(i * 7 + 3);
    hc_send_all(g, junk, sizeof junk);
    close(g);
    g = hc_connect(port);
    char *hdr = malloc(200 * 1024);
    int k = sprintf(hdr, "GET /health HTTP/1.1\r\nX-Big: ");
    memset(hdr + k, 'a', 190 * 1024);
    strcpy(hdr + k + 190 * 1024, "\r\n\r\n");
    hc_send_all(g, hdr, strlen(hdr));
    free(hdr);
    char *raw = NULL;
    hc_read_all(g, &raw, 5);
    close(g);
    CHECKF(raw && (!strncmp(raw, "HTTP/1.1 431", 12) || !strncmp(raw, "HTTP/1.1 413", 12) ||
                   raw[0] == 0),
           "%.40s", raw ? raw : "");
    free(raw);
    for (int i = 0; i < 20; i++) close(fds[i]);
    CHECK(hc_request(port, "GET", "/health", NULL, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
}

/* Sends raw bytes, returns the status of the answer (0: closed without one)
 * and how long it took. */
static int raw_status(int p, const char *req, size_t n, double *took)
{
    int fd = hc_connect(p);
    double t0 = hc_now();
    hc_send_all(fd, req, n);
    char *raw = NULL;
    hc_read_all(fd, &raw, 8);
    close(fd);
    *took = hc_now() - t0;
    int st = 0;
    if (raw) sscanf(raw, "HTTP/1.%*d %d", &st);
    free(raw);
    return st;
}

TEST(malformed_http_4xx_at_once)
{
    /* each is answered with its 4xx (or 501) well inside the idle timeout (2 s here) */
    static const char H[] =
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
    char *ext = malloc(80 * 1024);
    int k = sprintf(ext, "%sTransfer-Encoding: chunked\r\n\r\n5;", H);
    memset(ext + k, 'e', 70 * 1024);
    strcpy(ext + k + 70 * 1024, "\r\nhello\r\n0\r\n\r\n");
    char b[4][512];
    snprintf(b[0], sizeof b[0], "%sTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc", H);
    snprintf(b[1], sizeof b[1], "%sTransfer-Encoding: chunked\r\n\r\n100000000\r\nabc", H);
    snprintf(b[2], sizeof b[2], "%sTransfer-Encoding: gzip\r\n\r\nabc", H);
    snprintf(b[3], sizeof b[3], "%sContent-Length: 18446744073709551615\r\n\r\nabc", H);
    struct {
        const char *req;
        int want;
    } cases[] = {{ext, 411}, {b[0], 411}, {b[1], 411}, {b[2], 501}, {b[3], 413}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double took;
        int st = raw_status(port, cases[i].req, strlen(cases[i].req), &took);
        CHECKF(st == cases[i].want && took < 1.0, "case %zu: %d after %.2f s (want %d)", i, st,
               took, cases[i].want);
    }
    free(ext);
    /* a body that stops half-way is cut at the body deadline (1 s here), though each
     * byte resets the idle timeout */
    int fd = hc_connect(port);
    const char *req = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{";
    hc_send_all(fd, req, strlen(req));
    double t0 = hc_now();
    int closed = 0;
    while (!closed && hc_now() - t0 < 4.0) {
        if (send(fd, " ", 1, MSG_NOSIGNAL) != 1) closed = 1;
        struct pollfd pl = {.fd = fd, .events = POLLIN};
        char c;
        if (poll(&pl, 1, 300) > 0 && recv(fd, &c, 1, 0) <= 0) closed = 1;
    }
    close(fd);
    CHECKF(closed && hc_now() - t0 < 2.5, "closed %d after %.1f s", closed, hc_now() - t0);
    /* the auth scheme is case-insensitive */
    hresp r;
    const char *auth[] = {"Authorization: bearer sekrit\r\n", "Authorization: BEARER  sekrit\r\n"};
    for (int i = 0; i < 2; i++) {
        CHECK(hc_request(port_key, "POST", "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":1}",
                         auth[i], &r) == 0);
        CHECKF(r.status == 200, "%s: %d", auth[i], r.status);
        hresp_free(&r);
    }
    CHECK(hc_request(port_key, "POST", "/v1/completions", "{\"prompt\":\"a\"}",
                     "Authorization: Bearersekrit\r\n", &r) == 0);
    CHECK(r.status == 401);
    hresp_free(&r);
}

/* --max-connections-per-client 3: a fourth connection is closed at accept */
TEST(connections_per_client_capped)
{
    int fds[3];
    for (int i = 0; i < 3; i++) fds[i] = hc_connect(port_cap);
    usleep(100000);
    int fd = hc_connect(port_cap);
    double took;
    (void)took;
    char *raw = NULL;
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    hc_send_all(fd, get, strlen(get));
    long n = hc_read_all(fd, &raw, 2);
    close(fd);
    CHECKF(n == 0, "the 4th connection got %ld bytes: %.30s", n, raw ? raw : "");
    free(raw);
    close(fds[0]);
    usleep(200000);
    hresp r;
    CHECK(hc_request(port_cap, "GET", "/health", NULL, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
    close(fds[1]);
    close(fds[2]);
}

TEST(trickling_headers_are_cut)
{
    /* one byte every 100 ms keeps resetting the idle timeout; the header
     * deadline (1 s in this test) still closes the connection */
    int fd = hc_connect(port);
    CHECK(fd >= 0);
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "
                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    double t0 = hc_now();
    int closed = 0;
    for (size_t i = 0; req[i] && hc_now() - t0 < 4.0 && !closed; i++) {
        if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1) closed = 1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) {
            char b[64];
            if (recv(fd, b, sizeof b, 0) <= 0) closed = 1;
        }
    }
    close(fd);
    CHECKF(closed && hc_now() - t0 < 3.5, "closed %d after %.1f s", closed, hc_now() - t0);
    hresp r; /* and the server is fine */
    CHECK(hc_request(port, "GET", "/health", NULL, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
}

TEST(watchdog_marks_unhealthy)
{
    /* fe_q runs with --watchdog-timeout 1 and MOESERVE_WATCHDOG_NO_EXIT */
    atomic_store(&eng.stalled, 1);
    int fd = hc_connect(port_q);
    const char *body = "{\"prompt\":\"ab\",\"max_tokens\":2}";
    send_completion(fd, body);
    double end = hc_now() + 5;
    int st = 0;
    while (hc_now() < end) {
        hresp r;
        if (hc_request(port_q, "GET", "/health", NULL, NULL, &r) == 0) st = r.status;
        hresp_free(&r);
        if (st == 503) break;
        usleep(100000);
    }
    atomic_store(&eng.stalled, 0);
    char *raw = NULL;
    hc_read_all(fd, &raw, 5);
    close(fd);
    free(raw);
    CHECK(st == 503);
}

TEST(drain)
{
    atomic_store(&eng.step_us, 2000);
    int fd = start_stream(port, NULL);
    CHECK(fd >= 0);
    ms_frontend_begin_drain(fe);
    CHECK(ms_frontend_live_requests(fe) == 1);
    /* no longer admitting: a new request gets 503, /health too */
    hresp r2;
    CHECK(hc_request(port, "POST", "/v1/completions", "{\"prompt\":\"ab\",\"max_tokens\":2}", NULL,
                     &r2) == 0);
    CHECKF(r2.status == 503 && strstr(r2.body, "shutting down"), "%d %s", r2.status, r2.body);
    hresp_free(&r2);
    CHECK(hc_request(port, "GET", "/health", NULL, NULL, &r2) == 0 && r2.status == 503);
    hresp_free(&r2);
    char *rest = NULL;
    hc_read_all(fd, &rest, 5); /* the running request completes */
    close(fd);
    CHECK(rest && strstr(rest, "\"finish_reason\":\"length\"") && strstr(rest, "[DONE]"));
    free(rest);
    double end = hc_now() + 2;
    while (ms_frontend_live_requests(fe) && hc_now() < end) usleep(1000);
    CHECK(ms_frontend_live_requests(fe) == 0);
    atomic_store(&eng.step_us, 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    ms_log_init(0);
    if (!getenv("MOESERVE_LOG")) ms_log_threshold = MS_WARN;
    if (http_fixture_open()) return 1;

    RUN(disconnect_aborts);
    RUN(abort_api_and_flush);
    RUN(queue_full_503);
    RUN(load_info_metrics);
    RUN(slowloris_and_garbage);
    RUN(malformed_http_4xx_at_once);
    RUN(connections_per_client_capped);
    RUN(trickling_headers_are_cut);
    RUN(watchdog_marks_unhealthy);
    RUN(drain);

    http_fixture_close();
    return TEST_REPORT();
}
