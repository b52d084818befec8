/* test_http.c — end-to-end tests of the HTTP front end on a real loopback port
 * with the echo engine (tests/echo_engine.h) behind the hub: OpenAI and SGLang
 * routes, SSE format, errors (400/401/404/405/413/503), context limits, stop
 * strings, tool calls, reasoning, abort (API and client disconnect), flush,
 * health, load/info, metrics (promtool), slowloris, garbage, drain.
 * `test_http --serve PORTFILE [flags]` instead runs the echo server until
 * SIGTERM (used by tests/t_openai_node.sh).
 */
#include "echo_engine.h"
#include "harness.h"
#include "http_client.h"
#include "base/log.h"
#include "serve/http.h"

#include <jansson.h>
#include <signal.h>
#include <sys/resource.h>

#define CTX 4000 /* room for V4's tools section (byte tokens) */

static ms_serve_hub *hub, *hub_v4;
static echo_engine eng, eng_v4;
static ms_frontend *fe, *fe_key, *fe_q, *fe_cap, *fe_v4, *fe_fam;
static int port, port_key, port_q, port_cap, port_v4, port_fam;
static const char *KEY_HDR = "Authorization: Bearer sekrit\r\n";

static int wait_until(atomic_int *v, int want, double timeout_s)
{
    double end = hc_now() + timeout_s;
    while (hc_now() < end) {
        if (atomic_load(v) == want) return 1;
        usleep(2000);
    }
    return atomic_load(v) == want;
}

static json_t *body_json(const hresp *r)
{
    return json_loadb(r->body ? r->body : "", r->n, 0, NULL);
}

/* Concatenates the SSE frames' JSON into an array; checks the framing. */
static json_t *sse_frames(const char *body, int *done_last)
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

static const char *err_msg(json_t *o)
{
    return json_string_value(json_object_get(json_object_get(o, "error"), "message"));
}

TEST(health_and_models)
{
    hresp r;
    CHECK(hc_request(port, "GET", "/health", NULL, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
    CHECK(hc_request(port, "GET", "/v1/models", NULL, NULL, &r) == 0 && r.status == 200);
    json_t *o = body_json(&r);
    const char *id =
        json_string_value(json_object_get(json_array_get(json_object_get(o, "data"), 0), "id"));
    CHECK(id && !strcmp(id, "echo-model"));
    json_decref(o);
    hresp_free(&r);
    CHECK(hc_request(port, "GET", "/health_generate", NULL, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
}

TEST(chat_non_stream)
{
    hresp r;
    CHECK(hc_request(port, "POST", "/v1/chat/completions",
                     "{\"model\":\"x\",\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},"
                     "{\"role\":\"user\",\"content\":\"Hello world\"}]}",
                     NULL, &r) == 0);
    CHECKF(r.status == 200, "status %d body %s", r.status, r.body);
    json_t *o = body_json(&r);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    const char *content =
        json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    CHECKF(content && !strcmp(content, "Hello world"), "content %s", content);
    CHECK(!strcmp(json_string_value(json_object_get(ch, "finish_reason")), "stop"));
    CHECK(!strcmp(json_string_value(json_object_get(o, "object")), "chat.completion"));
    json_t *u = json_object_get(o, "usage");
    /* BOS + "sys" + USER + 11 bytes + ASSISTANT = 17 prompt tokens; 11 + EOS generated */
    CHECKF(json_integer_value(json_object_get(u, "prompt_tokens")) == 17, "%s", r.body);
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == 12);
    CHECK(json_integer_value(json_object_get(u, "total_tokens")) == 29);
    json_decref(o);
    hresp_free(&r);
}

TEST(chat_stream_sse)
{
    hresp r;
    CHECK(
        hc_request(port, "POST", "/v1/chat/completions",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"h\xc3\xa9llo \xe4\xb8\x96\"}],"
                   "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                   NULL, &r) == 0);
    CHECK(r.status == 200);
    CHECK(strcasestr(r.head, "Content-Type: text/event-stream") != NULL);
    int done = 0;
    json_t *fr = sse_frames(r.body, &done);
    CHECKF(fr && done, "bad SSE framing: %s", r.body);
    size_t nf = json_array_size(fr);
    CHECK(nf >= 4);
    json_t *d0 = json_object_get(
        json_array_get(json_object_get(json_array_get(fr, 0), "choices"), 0), "delta");
    CHECK(!strcmp(json_string_value(json_object_get(d0, "role")), "assistant"));
    char text[256] = "";
    const char *finish = NULL;
    for (size_t i = 0; i < nf; i++) {
        json_t *f = json_array_get(fr, i);
        CHECK(!strcmp(json_string_value(json_object_get(f, "object")), "chat.completion.chunk"));
        json_t *c = json_array_get(json_object_get(f, "choices"), 0);
        const char *t = json_string_value(json_object_get(json_object_get(c, "delta"), "content"));
        if (t) strncat(text, t, sizeof text - strlen(text) - 1);
        if (json_is_string(json_object_get(c, "finish_reason")))
            finish = json_string_value(json_object_get(c, "finish_reason"));
    }
    CHECKF(!strcmp(text, "h\xc3\xa9llo \xe4\xb8\x96"), "streamed '%s'", text);
    CHECK(finish && !strcmp(finish, "stop"));
    json_t *last = json_array_get(fr, nf - 1);
    CHECK(json_array_size(json_object_get(last, "choices")) == 0);
    CHECK(json_integer_value(
              json_object_get(json_object_get(last, "usage"), "completion_tokens")) == 11);
    json_decref(fr);
    hresp_free(&r);
}

TEST(completions_length_and_logprobs)
{
    hresp r;
    CHECK(hc_request(port, "POST", "/v1/completions",
                     "{\"prompt\":\"abcdefgh\",\"max_tokens\":5,\"logprobs\":2}", NULL, &r) == 0);
    CHECKF(r.status == 200, "%d %s", r.status, r.body);
    json_t *o = body_json(&r);
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(c, "text")), "abcde"));
    CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")), "length"));
    json_t *lp = json_object_get(c, "logprobs");
    CHECK(json_array_size(json_object_get(lp, "tokens")) == 5);
    CHECK(json_array_size(json_object_get(lp, "top_logprobs")) == 5);
    CHECK(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)) == 2);
    json_decref(o);
    hresp_free(&r);
    /* text_offset: the characters before each token (é is two byte tokens, one character) */
    CHECK(hc_request(port, "POST", "/v1/completions",
                     "{\"prompt\":\"ab\\u00e9cd\",\"max_tokens\":6,\"logprobs\":0}", NULL,
                     &r) == 0);
    o = body_json(&r);
    json_t *off = json_object_get(
        json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs"),
        "text_offset");
    static const int want_off[6] = {0, 1, 2, 2, 3, 4};
    CHECKF(json_array_size(off) == 6, "%s", r.body);
    for (int i = 0; i < 6; i++)
        CHECKF(json_integer_value(json_array_get(off, (size_t)i)) == want_off[i], "%s", r.body);
    json_decref(o);
    hresp_free(&r);
    /* prompt as token ids, stream */
    CHECK(hc_request(port, "POST", "/v1/completions",
                     "{\"prompt\":[104,105],\"max_tokens\":10,\"stream\":true}", NULL, &r) == 0);
    int done = 0;
    json_t *fr = sse_frames(r.body, &done);
    CHECK(fr && done);
    char text[64] = "";
    for (size_t i = 0; i < json_array_size(fr); i++) {
        const char *t = json_string_value(json_object_get(
            json_array_get(json_object_get(json_array_get(fr, i), "choices"), 0), "text"));
        if (t) strncat(text, t, sizeof text - strlen(text) - 1);
    }
    CHECK(!strcmp(text, "hi"));
    json_decref(fr);
    hresp_free(&r);
}

/* n > 1: one choice per engine request, each with its index; one usage, one [DONE] */
TEST(n_choices)
{
    hresp r;
    CHECK(hc_request(port, "POST", "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"hey\"}],\"n\":3}", NULL,
                     &r) == 0);
    CHECKF(r.status == 200, "%d %s", r.status, r.body);
    json_t *o = body_json(&r);
    json_t *ch = json_object_get(o, "choices");
    CHECKF(json_array_size(ch) == 3, "%s", r.body);
    const char *c0 = json_string_value(
        json_object_get(json_object_get(json_array_get(ch, 0), "message"), "content"));
    for (size_t i = 0; i < json_array_size(ch); i++) {
        json_t *c = json_array_get(ch, i);
        CHECK(json_integer_value(json_object_get(c, "index")) == (json_int_t)i);
        const char *t =
            json_string_value(json_object_get(json_object_get(c, "message"), "content"));
        CHECK(c0 && t && !strcmp(t, c0));
    }
    json_t *u = json_object_get(o, "usage");
    int64_t one = (int64_t)strlen(c0 ? c0 : "") + 1; /* the echo and its EOS */
    CHECKF(json_integer_value(json_object_get(u, "completion_tokens")) == 3 * one, "%s", r.body);
    json_decref(o);
    hresp_free(&r);
    CHECK(hc_request(port, "POST", "/v1/completions",
                     "{\"prompt\":\"abcd\",\"max_tokens\":3,\"n\":2,\"stream\":true,"
                     "\"stream_options\":{\"include_usage\":true}}",
                     NULL, &r) == 0);
    int done = 0;
    json_t *fr = sse_frames(r.body, &done);
    char text[2][16] = {"", ""};
    int n_usage = 0, n_done = 0;
    for (const char *p = r.body; (p = strstr(p, "data: [DONE]")); p++) n_done++;
    for (size_t i = 0; i < json_array_size(fr); i++) {
        json_t *f = json_array_get(fr, i), *c = json_array_get(json_object_get(f, "choices"), 0);
        if (json_object_get(f, "usage") && json_is_object(json_object_get(f, "usage"))) {
            n_usage++;
            CHECK(json_integer_value(json_object_get(json_object_get(f, "usage"),
                                                     "completion_tokens")) == 6);
        }
        if (!c) continue;
        json_int_t k = json_integer_value(json_object_get(c, "index"));
        const char *t = json_string_value(json_object_get(c, "text"));
        CHECK(k == 0 || k == 1);
        if (t && (k == 0 || k == 1)) strncat(text[k], t, sizeof text[k] - strlen(text[k]) - 1);
    }
    CHECKF(done && n_done == 1 && n_usage == 1, "done %d, %d [DONE], %d usage", done, n_done,
           n_usage);
    CHECKF(!strcmp(text[0], "abc") && !strcmp(text[1], "abc"), "'%s' '%s'", text[0], text[1]);
    json_decref(fr);
    hresp_free(&r);
}

TEST(stop_string_aborts_engine)
{
    int aborts = atomic_load(&eng.n_aborts);
    hresp r;
    atomic_store(&eng.step_us, 2000);
    CHECK(hc_request(
              port, "POST", "/v1/completions",
              "{\"prompt\":\"hello STOP world and more\",\"max_tokens\":500,\"ignore_eos\":true,"
              "\"stop\":[\"STOP\",\"zzz\"]}",
              NULL, &r) == 0);
    atomic_store(&eng.step_us, 0);
    json_t *o = body_json(&r);
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    CHECKF(!strcmp(json_string_value(json_object_get(c, "text")), "hello "), "%s", r.body);
    CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")), "stop"));
    json_decref(o);
    hresp_free(&r);
    CHECK(wait_until(&eng.n_active, 0, 2));
    CHECK(atomic_load(&eng.n_aborts) == aborts + 1);
}

TEST(generate_native)
{
    hresp r;
    CHECK(hc_request(
              port, "POST", "/generate",
              "{\"text\":\"native\",\"sampling_params\":{\"max_new_tokens\":4,\"temperature\":0}}",
              NULL, &r) == 0);
    CHECKF(r.status == 200, "%d %s", r.status, r.body);
    json_t *o = body_json(&r);
    CHECK(!strcmp(json_string_value(json_object_get(o, "text")), "nati"));
    json_t *mi = json_object_get(o, "meta_info");
    CHECK(json_integer_value(json_object_get(mi, "prompt_tokens")) == 6);
    CHECK(json_integer_value(json_object_get(mi, "completion_tokens")) == 4);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(mi, "finish_reason"), "type")),
                  "length"));
    CHECK(json_array_size(json_object_get(o, "output_ids")) == 4);
    json_decref(o);
    hresp_free(&r);
    CHECK(hc_request(port, "POST", "/generate",
                     "{\"input_ids\":[65,66,67],\"stream\":true,\"return_logprob\":true}", NULL,
                     &r) == 0);
    int done = 0;
    json_t *fr = sse_frames(r.body, &done);
    CHECK(fr && done && json_array_size(fr) >= 2);
    json_t *last = json_array_get(fr, json_array_size(fr) - 1);
    CHECK(!strcmp(json_string_value(json_object_get(last, "text")), "ABC")); /* cumulative */
    CHECK(json_array_size(
              json_object_get(json_object_get(last, "meta_info"), "output_token_logprobs")) == 4);
    json_decref(fr);
    hresp_free(&r);
}

static void expect_error(int p, const char *method, const char *path, const char *body,
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

TEST(errors)
{
    int ok;
    expect_error(port, "POST", "/v1/chat/completions", "{\"messages\": [", NULL, 400,
                 "malformed JSON", &ok);
    CHECK(ok);
    expect_error(port, "POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"x\"}",
                 NULL, 400, "max_tokens", &ok);
    CHECK(ok);
    expect_error(port, "POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-1}", NULL,
                 400, "temperature", &ok);
    CHECK(ok);
    expect_error(port, "POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":99}", NULL, 400, "'n'",
                 &ok);
    CHECK(ok);
    expect_error(port, "POST", "/generate", "{\"text\":\"x\",\"sampling_params\":{\"n\":2}}", NULL,
                 400, "'n'", &ok);
    CHECK(ok);
    /* fields this server does not have are refused naming them, never ignored */
    static const char *const refused[][2] = {
        {"/v1/chat/completions", "\"regex\":\"a+\""},
        {"/v1/chat/completions", "\"json_schema\":\"{}\""},
        {"/v1/completions", "\"ebnf\":\"root ::= x\""},
        {"/v1/chat/completions", "\"logit_bias\":{\"99999\":10}"},
        {"/v1/completions", "\"logit_bias\":{\"5\":101}"},
        {"/v1/completions", "\"min_tokens\":9,\"max_tokens\":3"},
        {"/v1/chat/completions",
         "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}"},
        {"/v1/completions", "\"response_format\":{\"type\":\"json_object\"}"},
        {"/generate", "\"sampling_params\":{\"regex\":\"a\"}"},
        {"/generate", "\"sampling_params\":{\"min_new_tokens\":-2}"},
        {"/generate", "\"sampling_params\":{\"max_new_tokens\":2,\"temprature\":0.5}"}};
    static const char *const names[] = {
        "regex",           "json_schema",     "ebnf",  "logit_bias",     "logit_bias", "min_tokens",
        "response_format", "response_format", "regex", "min_new_tokens", "temprature"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char body[512];
        if (!strcmp(refused[i][0], "/generate"))
            snprintf(body, sizeof body, "{\"text\":\"x\",%s}", refused[i][1]);
        else if (strstr(refused[i][0], "chat"))
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}",
                     refused[i][1]);
        else
            snprintf(body, sizeof body, "{\"prompt\":\"x\",%s}", refused[i][1]);
        expect_error(port, "POST", refused[i][0], body, NULL, 400, names[i], &ok);
        CHECKF(ok, "%s %s", refused[i][0], refused[i][1]);
    }
    /* an unknown top-level field of an OpenAI route is ignored, as SGLang's models do */
    hresp ru;
    CHECK(hc_request(port, "POST", "/v1/completions",
                     "{\"prompt\":\"ab\",\"max_tokens\":1,\"some_vendor_field\":1}", NULL,
                     &ru) == 0);
    CHECKF(ru.status == 200, "%d %s", ru.status, ru.body);
    hresp_free(&ru);
    expect_error(port, "POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", NULL, 400,
                 "messages[0].role", &ok);
    CHECK(ok);
    expect_error(port, "POST", "/v1/chat/completions", "[1,2]", NULL, 400, "JSON object", &ok);
    CHECK(ok);
    expect_error(port, "POST", "/v1/completions", "{\"prompt\":[1,2,99999]}", NULL, 400,
                 "vocabulary", &ok);
    CHECK(ok);
    expect_error(port, "POST", "/generate", "{\"sampling_params\":{}}", NULL, 400, "text", &ok);
    CHECK(ok);
    expect_error(port, "POST", "/nope", "{}", NULL, 404, NULL, &ok);
    CHECK(ok);
    expect_error(port, "GET", "/v1/chat/completions", NULL, NULL, 405, NULL, &ok);
    CHECK(ok);
    expect_error(port, "POST", "/generate", "{\"text\":\"a\"}", "X-Data-Parallel-Rank: 7\r\n", 400,
                 "X-Data-Parallel-Rank", &ok);
    CHECK(ok);
    /* a body over the limit (64 KiB in this test) */
    size_t big = 100 * 1024;
    char *b = malloc(big + 64);
    strcpy(b, "{\"prompt\":\"");
    memset(b + 11, 'a', big);
    strcpy(b + 11 + big, "\"}");
    expect_error(port, "POST", "/v1/completions", b, NULL, 413, "larger than", &ok);
    free(b);
    CHECK(ok);
    /* API key */
    expect_error(port_key, "POST", "/v1/completions", "{\"prompt\":\"a\"}", NULL, 401, NULL, &ok);
    CHECK(ok);
    expect_error(port_key, "POST", "/v1/completions", "{\"prompt\":\"a\"}",
                 "Authorization: Bearer wrong\r\n", 401, NULL, &ok);
    CHECK(ok);
    hresp r;
    CHECK(hc_request(port_key, "POST", "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":1}",
                     KEY_HDR, &r) == 0);
    CHECK(r.status == 200);
    hresp_free(&r);
}

TEST(context_limits)
{
    /* completions prompt of n bytes = n tokens; context CTX */
    char body[CTX + 256], want[160];
    char prompt[CTX + 8];
    int ok;
    memset(prompt, 'x', CTX);
    prompt[CTX] = 0;
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", prompt);
    expect_error(port, "POST", "/v1/completions", body, NULL, 400,
                 "is longer than the model's context length", &ok);
    CHECK(ok);
    prompt[100] = 0;
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d}", prompt, CTX - 100);
    snprintf(want, sizeof want,
             "You requested a total of %d tokens: 100 tokens from the input messages and %d tokens",
             CTX, CTX - 100);
    expect_error(port, "POST", "/v1/completions", body, NULL, 400, want, &ok);
    CHECK(ok);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d}", prompt, CTX - 101);
    hresp r;
    CHECK(hc_request(port, "POST", "/v1/completions", body, NULL, &r) == 0 && r.status == 200);
    hresp_free(&r);
}

TEST(tool_calls_and_reasoning)
{
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"description\":\"w\",\"parameters\":{\"type\":\"object\"}}}]";
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"</think>ok " MS_CHAT_CALLS_BEGIN
                 MS_CHAT_CALL_BEGIN "get_weather" MS_CHAT_SEP
             "{\\\"city\\\": \\\"Paris\\\"}" MS_CHAT_CALL_END MS_CHAT_CALLS_END "\"}],%s}",
             tools);
    hresp r;
    CHECK(hc_request(port_key, "POST", "/v1/chat/completions", body, KEY_HDR, &r) == 0);
    CHECKF(r.status == 200, "%d %s", r.status, r.body);
    json_t *o = body_json(&r);
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    json_t *tc = json_array_get(json_object_get(msg, "tool_calls"), 0);
    CHECKF(tc, "%s", r.body);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(tc, "function"), "name")),
                  "get_weather"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")),
                  "{\"city\": \"Paris\"}"));
    CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")), "tool_calls"));
    CHECK(!strcmp(json_string_value(json_object_get(msg, "content")), "ok "));
    json_decref(o);
    hresp_free(&r);
    /* streamed: deltas reassemble to the same call */
    body[strlen(body) - 1] = 0;
    strcat(body, ",\"stream\":true}");
    CHECK(hc_request(port_key, "POST", "/v1/chat/completions", body, KEY_HDR, &r) == 0);
    int done;
    json_t *fr = sse_frames(r.body, &done);
    CHECK(fr && done);
    char name[64] = "", args[256] = "";
    const char *finish = NULL;
    for (size_t i = 0; i < json_array_size(fr); i++) {
        json_t *ch = json_array_get(json_object_get(json_array_get(fr, i), "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        size_t j;
        json_t *t;
        json_array_foreach(json_object_get(d, "tool_calls"), j, t)
        {
            CHECK(json_integer_value(json_object_get(t, "index")) == 0);
            const char *nm =
                json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            const char *ar =
                json_string_value(json_object_get(json_object_get(t, "function"), "arguments"));
            if (nm) strncat(name, nm, sizeof name - strlen(name) - 1);
            if (ar) strncat(args, ar, sizeof args - strlen(args) - 1);
        }
        if (json_is_string(json_object_get(ch, "finish_reason")))
            finish = json_string_value(json_object_get(ch, "finish_reason"));
    }
    CHECK(!strcmp(name, "get_weather"));
    CHECK(!strcmp(args, "{\"city\": \"Paris\"}"));
    CHECK(finish && !strcmp(finish, "tool_calls"));
    json_decref(fr);
    hresp_free(&r);
    /* reasoning (server runs --reasoning-parser deepseek-r1) */
    CHECK(hc_request(port_key, "POST", "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"hmm let me think</think>The "
                     "answer\"}]}",
                     KEY_HDR, &r) == 0);
    o = body_json(&r);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECKF(
        !strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "hmm let me think"),
        "%s", r.body);
    CHECK(!strcmp(json_string_value(json_object_get(msg, "content")), "The answer"));
    json_decref(o);
    hresp_free(&r);
    /* separate_reasoning=false keeps it in content */
    CHECK(hc_request(port_key, "POST", "/v1/chat/completions",
                     "{\"separate_reasoning\":false,\"messages\":[{\"role\":\"user\",\"content\":"
                     "\"a</think>b\"}]}",
                     KEY_HDR, &r) == 0);
    o = body_json(&r);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECK(!strcmp(json_string_value(json_object_get(msg, "content")), "a</think>b"));
    json_decref(o);
    hresp_free(&r);
}

/* Starts a long streaming request on a raw socket and returns the fd after
 * the first bytes of the body arrived. */
static int start_stream(int p, const char *rid)
{
    int fd = hc_connect(p);
    char body[512], req[1024];
    snprintf(
        body, sizeof body,
        "{\"prompt\":\"abcdefghij\",\"max_tokens\":300,\"ignore_eos\":true,\"stream\":true%s%s%s}",
        rid ? ",\"rid\":\"" : "", rid ? rid : "", rid ? "\"" : "");
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: "
                     "close\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    hc_send_all(fd, req, (size_t)n);
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

/* --tool-call-parser deepseekv4 --reasoning-parser deepseek-v4 (V4's format):
 * the echo engine replays a hand-written model output given as the user turn. */
TEST(v4_dsml_and_reasoning)
{
#define D MS_CHAT_DSML
    const char *out = "Need the weather.</think>\\n\\n<" D "tool_calls>\\n<" D
                      "invoke name=\\\"get_weather\\\">\\n<" D
                      "parameter name=\\\"city\\\" string=\\\"true\\\">Paris</" D "parameter>\\n<" D
                      "parameter name=\\\"days\\\" string=\\\"false\\\">2</" D "parameter>\\n</" D
                      "invoke>\\n</" D "tool_calls>";
#undef D
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"tools\":[{\"type\":"
             "\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
             "\"object\"}}}],\"chat_template_kwargs\":{\"thinking\":true}%s}",
             out, "");
    hresp r;
    CHECK(hc_request(port_v4, "POST", "/v1/chat/completions", body, NULL, &r) == 0);
    CHECKF(r.status == 200, "%d %s", r.status, r.body);
    json_t *o = body_json(&r);
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    json_t *tc = json_array_get(json_object_get(msg, "tool_calls"), 0);
    CHECKF(tc && json_array_size(json_object_get(msg, "tool_calls")) == 1, "%s", r.body);
    json_t *fn = json_object_get(tc, "function");
    CHECK(!strcmp(json_string_value(json_object_get(fn, "name")), "get_weather"));
    CHECKF(!strcmp(json_string_value(json_object_get(fn, "arguments")),
                   "{\"city\": \"Paris\", \"days\": 2}"),
           "%s", r.body);
    CHECK(
        !strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "Need the weather."));
    CHECK(json_is_null(json_object_get(msg, "content")));
    CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")), "tool_calls"));
    json_decref(o);
    hresp_free(&r);
    /* streamed: one call delta (name and arguments), reasoning deltas before it */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"tools\":[{\"type\":"
             "\"function\",\"function\":{\"name\":\"get_weather\"}}],\"chat_template_kwargs\":"
             "{\"thinking\":true},\"stream\":true}",
             out);
    CHECK(hc_request(port_v4, "POST", "/v1/chat/completions", body, NULL, &r) == 0);
    int done;
    json_t *fr = sse_frames(r.body, &done);
    CHECK(fr && done);
    char reasoning[256] = "", name[64] = "", args[256] = "";
    const char *finish = NULL;
    int n_call_deltas = 0, content_chars = 0;
    for (size_t i = 0; i < json_array_size(fr); i++) {
        json_t *ch = json_array_get(json_object_get(json_array_get(fr, i), "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        const char *rs = json_string_value(json_object_get(d, "reasoning_content"));
        if (rs) strncat(reasoning, rs, sizeof reasoning - strlen(reasoning) - 1);
        const char *ct = json_string_value(json_object_get(d, "content"));
        if (ct) content_chars += (int)strlen(ct);
        size_t j;
        json_t *t;
        json_array_foreach(json_object_get(d, "tool_calls"), j, t)
        {
            n_call_deltas++;
            CHECK(json_integer_value(json_object_get(t, "index")) == 0);
            json_t *f = json_object_get(t, "function");
            const char *nm = json_string_value(json_object_get(f, "name"));
            const char *ar = json_string_value(json_object_get(f, "arguments"));
            if (nm) strncat(name, nm, sizeof name - strlen(name) - 1);
            if (ar) strncat(args, ar, sizeof args - strlen(args) - 1);
        }
        if (json_is_string(json_object_get(ch, "finish_reason")))
            finish = json_string_value(json_object_get(ch, "finish_reason"));
    }
    CHECKF(!strcmp(reasoning, "Need the weather."), "'%s'", reasoning);
    CHECK(!strcmp(name, "get_weather") && !strcmp(args, "{\"city\": \"Paris\", \"days\": 2}"));
    CHECK(n_call_deltas == 1 && content_chars == 0);
    CHECK(finish && !strcmp(finish, "tool_calls"));
    json_decref(fr);
    hresp_free(&r);
    /* non-thinking (the default): the output is content, </think> included */
    CHECK(hc_request(port_v4, "POST", "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"a</think>b\"}],"
                     "\"reasoning_effort\":\"max\"}",
                     NULL, &r) == 0);
    o = body_json(&r);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    CHECKF(!strcmp(json_string_value(json_object_get(msg, "content")), "a</think>b"), "%s", r.body);
    CHECK(json_is_null(json_object_get(msg, "reasoning_content")));
    json_decref(o);
    hresp_free(&r);
    /* the format follows the model family: the same history is V4's merged user
     * turn on a V4 engine (no parser flags), V3.1's last user turn on a V3 one */
    const char *hist =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
        "null,\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"R\"},"
        "{\"role\":\"user\",\"content\":\"ok?\"}]}";
    const int ports[] = {port_fam, port};
    const char *want[] = {"<tool_result>R</tool_result>\n\nok?", "ok?"};
    for (int k = 0; k < 2; k++) {
        CHECK(hc_request(ports[k], "POST", "/v1/chat/completions", hist, NULL, &r) == 0);
        o = body_json(&r);
        msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
        CHECKF(!strcmp(json_string_value(json_object_get(msg, "content")), want[k]), "%s", r.body);
        json_decref(o);
        hresp_free(&r);
    }
    /* /server_info names the parsers */
    CHECK(hc_request(port_v4, "GET", "/server_info", NULL, NULL, &r) == 0);
    o = body_json(&r);
    CHECK(!strcmp(json_string_value(json_object_get(o, "tool_call_parser")), "deepseekv4"));
    CHECK(!strcmp(json_string_value(json_object_get(o, "reasoning_parser")), "deepseek-v4"));
    json_decref(o);
    hresp_free(&r);
}

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
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: "
                     "close\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    hc_send_all(fd, req, (size_t)n);
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
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: "
                     "close\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    for (int i = 0; i < 2; i++) {
        fds[i] = hc_connect(port_q);
        hc_send_all(fds[i], req, (size_t)n);
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
    /* rejected requests (the errors test's) and retractions are counted */
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
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: "
                     "close\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    hc_send_all(fd, req, (size_t)n);
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

static void setup_info(ms_engine_info *in)
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

static volatile sig_atomic_t got_term;

/* --model-family NAME (this test's own flag, first): the family the echo engine
 * reports, as a real engine reports its model's (the chat format follows it). */
static int serve_forever(int argc, char **argv)
{
    ms_engine_info in;
    setup_info(&in);
    int first = 3;
    if (argc > 4 && !strcmp(argv[3], "--model-family")) {
        snprintf(in.model_family, sizeof in.model_family, "%s", argv[4]);
        first = 5;
    }
    ms_errbuf e;
    hub = ms_serve_hub_new(&in, &e);
    ms_frontend_opts o;
    ms_frontend_opts_init(&o);
    o.port = 0;
    snprintf(o.served_model_name, sizeof o.served_model_name, "echo-model");
    for (int i = first; i < argc;) {
        int k = ms_frontend_parse_flag(&o, argc, argv, i, &e);
        if (k <= 0) {
            fprintf(stderr, "bad flag %s: %s\n", argv[i], k < 0 ? e.msg : "unknown");
            return 2;
        }
        i += k;
    }
    ms_serve_hub_install_signals(hub);
    if (echo_start(&eng, hub) || ms_frontend_open(&fe, &o, hub, &test_codec, &e)) {
        fprintf(stderr, "start: %s\n", e.msg);
        return 1;
    }
    if (getenv("ECHO_STEP_US")) atomic_store(&eng.step_us, atoi(getenv("ECHO_STEP_US")));
    FILE *f = fopen(argv[2], "w");
    fprintf(f, "%d\n", ms_frontend_port(fe));
    fclose(f);
    while (!ms_serve_hub_stop_requested(hub)) usleep(20000);
    ms_frontend_begin_drain(fe);
    while (ms_frontend_live_requests(fe)) usleep(10000);
    ms_frontend_close(fe);
    echo_stop(&eng);
    ms_serve_hub_free(hub);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    ms_log_init(0);
    if (argc >= 3 && !strcmp(argv[1], "--serve")) return serve_forever(argc, argv);
    if (!getenv("MOESERVE_LOG")) ms_log_threshold = MS_WARN;
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

    RUN(health_and_models);
    RUN(chat_non_stream);
    RUN(chat_stream_sse);
    RUN(completions_length_and_logprobs);
    RUN(n_choices);
    RUN(stop_string_aborts_engine);
    RUN(generate_native);
    RUN(errors);
    RUN(context_limits);
    RUN(tool_calls_and_reasoning);
    RUN(v4_dsml_and_reasoning);
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
    return TEST_REPORT();
}
