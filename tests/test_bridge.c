/* test_bridge.c — the whole server path on one rank: a tiny random DeepSeek-V3
 * checkpoint (mkmodel), the real tokenizer, the real engine driven by the
 * bridge in this thread's loop, the HTTP front end on a loopback port, and a
 * client thread.  Checks greedy determinism through the API, streaming,
 * logprobs, abort on disconnect, flush, load/metrics, and a clean drain. */
#include "base/log.h"
#include "harness.h"
#include "http_client.h"
#include "model/tokenizer.h"
#include "serve/bridge.h"
#include "serve/http.h"
#include "tools/mkmodel.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

static int port;
static ms_serve_hub *hub;
static ms_serve_bridge *bridge;
static atomic_int client_done;

static json_t *post(const char *path, const char *body, int *status)
{
    hresp r;
    *status = -1;
    if (hc_request(port, "POST", path, body, NULL, &r)) return NULL;
    *status = r.status;
    json_t *o = json_loadb(r.body, r.n, 0, NULL);
    hresp_free(&r);
    return o;
}

static const char *chat_text(json_t *o)
{
    return json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message"), "content"));
}

TEST(greedy_chat_deterministic)
{
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"The quick brown fox\"}],"
                    "\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}";
    int st1, st2;
    json_t *a = post("/v1/chat/completions", b, &st1), *c = post("/v1/chat/completions", b, &st2);
    CHECKF(st1 == 200 && st2 == 200, "%d %d", st1, st2);
    CHECK(chat_text(a) && chat_text(c) && !strcmp(chat_text(a), chat_text(c)));
    json_t *u = json_object_get(a, "usage");
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == 12);
    CHECK(!strcmp(json_string_value(json_object_get(
                      json_array_get(json_object_get(a, "choices"), 0), "finish_reason")),
                  "length"));
    json_decref(a);
    json_decref(c);
}

TEST(stream_matches_non_stream)
{
    int st;
    json_t *a =
        post("/v1/completions",
             "{\"prompt\":\"hello "
             "world\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":2}",
             &st);
    CHECK(st == 200);
    const char *want = json_string_value(
        json_object_get(json_array_get(json_object_get(a, "choices"), 0), "text"));
    json_t *lp = json_object_get(json_array_get(json_object_get(a, "choices"), 0), "logprobs");
    CHECK(json_array_size(json_object_get(lp, "token_logprobs")) == 8);
    CHECK(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 0)) <= 0);
    hresp r;
    CHECK(hc_request(
              port, "POST", "/v1/completions",
              "{\"prompt\":\"hello "
              "world\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}",
              NULL, &r) == 0);
    char got[1024] = "";
    for (char *p = r.body; (p = strstr(p, "data: {")); p++) {
        char *end = strstr(p, "\n\n");
        json_t *f = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
        const char *t = json_string_value(
            json_object_get(json_array_get(json_object_get(f, "choices"), 0), "text"));
        if (t) strncat(got, t, sizeof got - strlen(got) - 1);
        json_decref(f);
    }
    CHECKF(want && !strcmp(got, want), "stream '%s' vs '%s'", got, want);
    CHECK(strstr(r.body, "data: [DONE]\n\n"));
    hresp_free(&r);
    json_decref(a);
}

TEST(disconnect_frees_engine_slot)
{
    int fd = hc_connect(port);
    const char *body =
        "{\"prompt\":\"abc\",\"max_tokens\":2000,\"ignore_eos\":true,\"stream\":true}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    hc_send_all(fd, req, (size_t)n);
    char buf[4096];
    size_t got = 0;
    double end = hc_now() + 10;
    while (got < 600 && hc_now() < end) { /* a few token frames */
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    CHECK(got >= 600);
    close(fd);
    end = hc_now() + 5;
    json_t *ld = NULL;
    int running = -1;
    while (hc_now() < end) {
        hresp r;
        if (hc_request(port, "GET", "/get_load", NULL, NULL, &r) == 0) {
            ld = json_loadb(r.body, r.n, 0, NULL);
            running =
                (int)json_integer_value(json_object_get(json_array_get(ld, 0), "num_running_reqs"));
            json_decref(ld);
        }
        hresp_free(&r);
        if (running == 0) break;
        usleep(20000);
    }
    CHECK(running == 0);
}

TEST(flush_and_metrics)
{
    int st;
    json_t *o = post("/flush_cache", "", &st);
    json_decref(o);
    CHECK(st == 200);
    hresp r;
    CHECK(hc_request(port, "GET", "/metrics", NULL, NULL, &r) == 0 && r.status == 200);
    CHECK(strstr(r.body, "sglang:generation_tokens_total"));
    hresp_free(&r);
    CHECK(hc_request(port, "GET", "/server_info", NULL, NULL, &r) == 0 && r.status == 200);
    json_t *i = json_loadb(r.body, r.n, 0, NULL);
    CHECK(json_integer_value(json_object_get(i, "context_length")) > 0);
    CHECK(json_array_size(json_object_get(i, "max_total_num_tokens_per_dp_rank")) == 1);
    json_decref(i);
    hresp_free(&r);
    CHECK(hc_request(port, "GET", "/health_generate", NULL, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
}

static void *client(void *arg)
{
    (void)arg;
    RUN(greedy_chat_deterministic);
    RUN(stream_matches_non_stream);
    RUN(disconnect_frees_engine_slot);
    RUN(flush_and_metrics);
    atomic_store(&client_done, 1);
    ms_serve_hub_request_stop(hub); /* like SIGTERM */
    return NULL;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    ms_log_init(0);
    if (!getenv("MOESERVE_LOG")) ms_log_threshold = MS_WARN;
    char dir[] = "/tmp/ms_bridge_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    ms_errbuf e = {{0}};
    ms_config cfg;
    char tokpath[256];
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", dir);
    if (ms_mkmodel_preset("tiny-v3", &cfg) || ms_mkmodel_write(&cfg, MS_MK_BF16, 1, dir, 0, &e)) {
        fprintf(stderr, "mkmodel: %s\n", e.msg);
        return 1;
    }
    ms_tokenizer *tok = NULL;
    ms_engine *eng = NULL;
    ms_engine_opts eo;
    ms_engine_opts_init(&eo);
    eo.model_path = dir;
    eo.threads = 1;
    eo.max_total_tokens = 8192;
    if (ms_tokenizer_load(&tok, tokpath, &e) || ms_engine_open(&eng, &eo, &e)) {
        fprintf(stderr, "open: %s\n", e.msg);
        return 1;
    }
    ms_serve_codec codec;
    ms_serve_codec_from_tokenizer(&codec, tok);
    ms_engine_info info;
    ms_serve_bridge_engine_info(eng, dir, &info);
    hub = ms_serve_hub_new(&info, &e);
    ms_frontend_opts o;
    ms_frontend_opts_init(&o);
    o.port = 0;
    o.enable_metrics = 1;
    ms_frontend *fe = NULL;
    if (!hub || ms_serve_bridge_new(&bridge, hub) || ms_frontend_open(&fe, &o, hub, &codec, &e)) {
        fprintf(stderr, "front end: %s\n", e.msg);
        return 1;
    }
    port = ms_frontend_port(fe);
    pthread_t th;
    pthread_create(&th, NULL, client, NULL);
    /* the rank-0 loop of bridge.h */
    int draining = 0;
    double deadline = hc_now() + 120;
    for (;;) {
        if (!ms_engine_busy(eng)) ms_serve_hub_wait(hub, draining ? 10 : 1000);
        if (hc_now() > deadline) {
            fprintf(stderr, "deadline\n");
            break;
        }
        if (ms_serve_hub_stop_requested(hub) && !draining) {
            ms_frontend_begin_drain(fe);
            draining = 1;
        }
        if (draining && ms_frontend_live_requests(fe) == 0 && !ms_engine_busy(eng)) break;
        ms_serve_bridge_pull(bridge, eng);
        if (ms_engine_busy(eng)) {
            if (ms_engine_step(eng, &e)) {
                fprintf(stderr, "step: %s\n", e.msg);
                break;
            }
            ms_serve_bridge_push(bridge, eng);
        }
    }
    pthread_join(th, NULL);
    ms_frontend_close(fe);
    int live = ms_serve_bridge_n_live(bridge);
    ms_serve_bridge_free(bridge);
    ms_engine_shutdown(eng);
    ms_engine_step(eng, &e);
    ms_engine_close(eng);
    ms_serve_hub_free(hub);
    ms_tokenizer_free(tok);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "cleanup failed\n");
    th_cur_failed = 0;
    if (!atomic_load(&client_done) || live != 0) {
        fprintf(stderr, "FAIL loop: client_done %d, live %d\n", atomic_load(&client_done), live);
        th_failed++;
    }
    return TEST_REPORT();
}
