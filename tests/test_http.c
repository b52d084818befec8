/* test_http.c — end-to-end tests of the HTTP front end on a real loopback port
 * with the echo engine behind the hub (tests/http_fixture.h): OpenAI and SGLang
 * routes, SSE format, errors (400/401/404/405/413/503), context limits, stop
 * strings, tool calls, reasoning.  The robustness cases (abort, disconnect, queue,
 * metrics, slowloris, malformed HTTP, drain) are in test_http_limits.c.
 * `test_http --serve PORTFILE [flags]` instead runs the echo server until
 * SIGTERM (used by tests/t_openai_node.sh and t_http_curl.sh).
 */
#include "http_fixture.h"

#include <signal.h>

static const char *KEY_HDR = "Authorization: Bearer sekrit\r\n";

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
            CHECK(json_integer_value(
                      json_object_get(json_object_get(f, "usage"), "completion_tokens")) == 6);
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
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":99}", NULL, 400,
                 "'n'", &ok);
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
    if (http_fixture_open()) return 1;

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

    http_fixture_close();
    return TEST_REPORT();
}
