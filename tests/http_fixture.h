/* http_fixture.h — the loopback servers test_http.c and test_http_limits.c share:
 * one echo engine (tests/echo_engine.h) behind a hub with five front ends (plain;
 * --api-key and the V3.1 parsers; a 2-request queue with a 1 s watchdog; 3
 * connections per client; V4 parsers) and a second hub reporting a V4 model,
 * plus the response helpers both files use.  Header-only like harness.h:
 * include it once per test program.
 */
#ifndef MS_TESTS_HTTP_FIXTURE_H
#define MS_TESTS_HTTP_FIXTURE_H

#include "echo_engine.h"
#include "harness.h"
#include "http_client.h"
#include "base/log.h"
#include "serve/http.h"

#include <jansson.h>

#define CTX 4000 /* room for V4's tools section (byte tokens) */

static ms_serve_hub *hub, *hub_v4;
static echo_engine eng, eng_v4;
static ms_frontend *fe, *fe_key, *fe_q, *fe_cap, *fe_v4, *fe_fam;
static int port, port_key, port_q, port_cap, port_v4, port_fam;

static inline int wait_until(atomic_int *v, int want, double timeout_s)
{
    double end = hc_now() + timeout_s;
    while (hc_now() < end) {
        if (atomic_load(v) == want) return 1;
        usleep(2000);
    }
    return atomic_load(v) == want;
}

static inline json_t *body_json(const hresp *r)
{
    return json_loadb(r->body ? r->body : "", r->n, 0, NULL);
}

/* Concatenates the SSE frames' JSON into an array; checks the framing. */
static inline json_t *sse_frames(const char *body, int *done_last)
{
    json_t *a = json_array();
    *done_last = 0;
    const char *p = body;
    while (*p) {
        const char *end = strstr(p, "\n\n");
        if (!end || strncmp(p, "data: ", 6)) {
            json_decref(a);
            return NULL;
        }
        if (!strncmp(p + 6, "[DONE]", 6)) {
            *done_last = end[2] == 0;
            break;
        }
        json_t *o = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
        if (!o) {
            json_decref(a);
            return NULL;
        }
        json_array_append_new(a, o);
        p = end + 2;
    }
    return a;
}

static inline const char *err_msg(json_t *o)
{
    return json_string_value(json_object_get(json_object_get(o, "error"), "message"));
}

/* Expects an error answer: status, an OpenAI error object, needle in its message. */
static inline void expect_error(int p, const char *method, const char *path, const char *body,
                                const char *extra, int status, const char *needle, int *ok)
{
    hresp r;
    *ok = 0;
    if (hc_request(p, method, path, body, extra, &r)) return;
    json_t *o = body_json(&r);
    const char *m = err_msg(o);
    *ok = r.status == status && m && (!needle || strstr(m, needle));
    if (!*ok)
        fprintf(stderr, "  expected %d '%s', got %d %s\n", status, needle ? needle : "", r.status,
                r.body);
    json_t *e = json_object_get(o, "error");
    if (*ok && !(json_is_string(json_object_get(e, "type")) &&
                 json_integer_value(json_object_get(e, "code")) == status))
        *ok = 0;
    json_decref(o);
    hresp_free(&r);
}

static inline void setup_info(ms_engine_info *in)
{
    memset(in, 0, sizeof *in);
    snprintf(in->model_path, sizeof in->model_path, "/models/echo");
    in->context_len = CTX;
    in->page_size = 1;
    in->vocab_size = TC_VOCAB;
    snprintf(in->layout, sizeof in->layout, "tp=2 dp=2 dp-attention");
    in->tp_size = 2;
    in->dp_size = 2;
    in->attn_dp_size = 2;
    in->attn_tp_size = 1;
    in->ep_size = 1;
    in->pp_size = 1;
    in->moe_tp_size = 2;
    in->n_dp = 2;
    in->max_total_num_tokens[0] = in->max_total_num_tokens[1] = 5000;
    in->max_running_requests = 32;
    in->max_running_requests_per_rank = 16;
    in->chunked_prefill_size = 1024;
    in->chunked_prefill_size_per_rank = 512;
    snprintf(in->dtype, sizeof in->dtype, "float32");
}

/* Opens the engines, hubs and front ends above; 0 on success. */
static inline int http_fixture_open(void)
{
    setenv("MOESERVE_WATCHDOG_NO_EXIT", "1", 1);
    ms_engine_info in;
    setup_info(&in);
    ms_errbuf e;
    hub = ms_serve_hub_new(&in, &e);
    if (!hub || echo_start(&eng, hub)) return 1;
    ms_frontend_opts o;
    ms_frontend_opts_init(&o);
    o.port = 0;
    o.max_body_bytes = 64 * 1024;
    o.enable_metrics = 1;
    o.idle_timeout_s = 2;
    o.header_timeout_s = 1;
    o.body_timeout_s = 1;
    snprintf(o.served_model_name, sizeof o.served_model_name, "echo-model");
    if (ms_frontend_open(&fe, &o, hub, &test_codec, &e)) {
        fprintf(stderr, "open: %s\n", e.msg);
        return 1;
    }
    port = ms_frontend_port(fe);
    ms_frontend_opts ok = o;
    char *args[] = {"x",           "--api-key",
                    "sekrit",      "--tool-call-parser",
                    "deepseekv31", "--reasoning-parser=deepseek-r1"};
    for (int i = 1; i < 6;) {
        int k = ms_frontend_parse_flag(&ok, 6, args, i, &e);
        if (k <= 0) return 1;
        i += k;
    }
    if (ms_frontend_open(&fe_key, &ok, hub, &test_codec, &e)) return 1;
    port_key = ms_frontend_port(fe_key);
    ms_frontend_opts oq = o;
    oq.max_queued_requests = 2;
    oq.watchdog_timeout_s = 1;
    if (ms_frontend_open(&fe_q, &oq, hub, &test_codec, &e)) return 1;
    port_q = ms_frontend_port(fe_q);
    ms_frontend_opts oc = o;
    oc.max_connections_per_client = 3;
    if (ms_frontend_open(&fe_cap, &oc, hub, &test_codec, &e)) return 1;
    port_cap = ms_frontend_port(fe_cap);
    ms_frontend_opts o4 = o;
    char *args4[] = {"x", "--tool-call-parser", "deepseekv4", "--reasoning-parser=deepseek-v4"};
    for (int i = 1; i < 4;) {
        int k = ms_frontend_parse_flag(&o4, 4, args4, i, &e);
        if (k <= 0) return 1;
        i += k;
    }
    if (ms_frontend_open(&fe_v4, &o4, hub, &test_codec, &e)) return 1;
    port_v4 = ms_frontend_port(fe_v4);
    ms_engine_info in4 = in; /* an engine serving a DeepSeek-V4 model; no parser flags */
    snprintf(in4.model_family, sizeof in4.model_family, "deepseek_v4");
    hub_v4 = ms_serve_hub_new(&in4, &e);
    if (!hub_v4 || echo_start(&eng_v4, hub_v4)) return 1;
    if (ms_frontend_open(&fe_fam, &o, hub_v4, &test_codec, &e)) return 1;
    port_fam = ms_frontend_port(fe_fam);
    return 0;
}

static inline void http_fixture_close(void)
{
    ms_frontend_close(fe_fam);
    echo_stop(&eng_v4);
    ms_serve_hub_free(hub_v4);
    ms_frontend_close(fe_v4);
    ms_frontend_close(fe_cap);
    ms_frontend_close(fe_q);
    ms_frontend_close(fe_key);
    ms_frontend_close(fe);
    echo_stop(&eng);
    ms_serve_hub_free(hub);
}

#endif
