/* test_openai.c — request parsing and validation (types, ranges, named
 * fields), the context-length rules and messages, error bodies, chunk and
 * usage formatting, SSE framing, the request channel and the hub queue. */
#include "echo_engine.h"
#include "base/util.h"
#include "harness.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/scheduler.h" /* both boundaries coexist in the step loop */

#include <jansson.h>
#include <string.h>

_Static_assert((int)MS_SERVE_FINISH_STOP == (int)MS_FINISH_STOP &&
                   (int)MS_SERVE_FINISH_LENGTH == (int)MS_FINISH_LENGTH &&
                   (int)MS_SERVE_FINISH_ABORT == (int)MS_FINISH_ABORT &&
                   (int)MS_SERVE_FINISH_ERROR == (int)MS_FINISH_ERROR,
               "finish kinds agree");
_Static_assert(MS_SERVE_MAX_STOP_IDS <= MS_REQ_MAX_STOP_IDS, "stop ids fit the scheduler");
_Static_assert(MS_SERVE_MAX_TOP_LOGPROBS <= MS_SCHED_MAX_TOP_LOGPROBS, "top logprobs fit");

static const ms_api_config cfg = {.context_len = 100, .vocab_size = TC_VOCAB};

static int parse(enum ms_api_kind k, const char *body, ms_api_req *r, ms_errbuf *e,
                 const char **param)
{
    return ms_api_parse(r, k, body, strlen(body), &cfg, e, param);
}

TEST(parse_chat_fields)
{
    ms_api_req r;
    ms_errbuf e;
    const char *param;
    CHECK(
        parse(
            MS_API_CHAT,
            "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_"
            "completion_tokens\":7,"
            "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,\"seed\":-3,\"stop\":\"S\",\"stream\":"
            "true,"
            "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":3,"
            "\"stop_token_ids\":[1,2],\"ignore_eos\":true,\"rid\":\"abc\",\"n\":1,\"user\":\"u\"}",
            &r, &e, &param) == 0);
    CHECK(r.params.max_new == 7 && r.max_tokens_given);
    CHECK_NEAR(r.params.samp.temperature, 0.5, 1e-6);
    CHECK_NEAR(r.params.samp.top_p, 0.9, 1e-6);
    CHECK(r.params.samp.top_k == 20 && r.seed_given && r.params.seed == (uint64_t)-3);
    CHECK(r.n_stops == 1 && !strcmp(r.stops[0], "S"));
    CHECK(r.stream && r.include_usage && r.logprobs && r.top_logprobs == 3);
    CHECK(r.logprobs && r.params.top_logprobs == 3);
    CHECK(r.params.n_stop_ids == 2 && r.params.stop_ids[1] == 2 && r.params.ignore_eos);
    CHECK(!strcmp(r.rid, "abc") && !strcmp(r.model, "m"));
    CHECK(r.text && r.parse_special &&
          !strcmp(r.text, MS_CHAT_BOS MS_CHAT_USER "hi" MS_CHAT_ASSISTANT));
    ms_api_req_deinit(&r);
}

/* DeepSeek-V4 chat requests: the format follows the model family (or the
 * deepseekv4 tool parser, as SGLang); thinking via chat_template_kwargs, effort
 * via reasoning_effort (top level or in chat_template_kwargs), which never
 * turns thinking on. */
TEST(parse_chat_v4)
{
    CHECK(ms_api_chat_format("deepseek_v4", MS_TOOL_PARSER_NONE) == MS_CHAT_FMT_V4);
    CHECK(ms_api_chat_format("deepseek_v3", MS_TOOL_PARSER_DEEPSEEK_V31) == MS_CHAT_FMT_V3);
    CHECK(ms_api_chat_format("deepseek_v3", MS_TOOL_PARSER_DEEPSEEK_V4) == MS_CHAT_FMT_V4);
    ms_api_config c4 = cfg;
    c4.chat_format = MS_CHAT_FMT_V4;
    c4.reasoning_parser = MS_REASONING_DEEPSEEK_V4;
    c4.tool_parser = MS_TOOL_PARSER_DEEPSEEK_V4;
    static const char *const bodies[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":\"max\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":\"high\","
        "\"chat_template_kwargs\":{\"thinking\":true}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":\"low\","
        "\"chat_template_kwargs\":{\"thinking\":true,\"reasoning_effort\":\"max\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":\"medium\","
        "\"chat_template_kwargs\":{\"thinking\":true}}"};
    static const int think[] = {0, 0, 1, 1, 1}, max[] = {0, 0, 0, 1, 0};
    for (int i = 0; i < 5; i++) {
        ms_api_req r;
        ms_errbuf e;
        const char *param;
        int rc = ms_api_parse(&r, MS_API_CHAT, bodies[i], strlen(bodies[i]), &c4, &e, &param);
        CHECKF(rc == 0, "%s: %s", bodies[i], e.msg);
        char want[2048];
        snprintf(want, sizeof want, "%s%s%s%s", MS_CHAT_BOS,
                 max[i] ? "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n" : "",
                 max[i] ? "" : MS_CHAT_USER "hi" MS_CHAT_ASSISTANT,
                 think[i] ? "<think>" : "</think>");
        if (max[i]) {
            CHECKF(r.text && !strncmp(r.text, want, strlen(want) - strlen("<think>")), "%s",
                   r.text);
            CHECK(r.text && strstr(r.text, "left unchecked.\n\n" MS_CHAT_USER "hi" MS_CHAT_ASSISTANT
                                           "<think>"));
        } else {
            CHECKF(r.text && !strcmp(r.text, want), "%d: %s", i, r.text);
        }
        CHECK(r.separate_reasoning && r.starts_in_reasoning == think[i]);
        CHECK(r.parse_tools == MS_TOOLS_NONE);
        ms_api_req_deinit(&r);
    }
    /* tools: DSML parsing, the tools section rendered (also under tool_choice none, as SGLang's
     * V4 path renders them; then nothing is parsed) */
    for (int none = 0; none < 2; none++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"}],\"tools\":[{\"type\":"
                 "\"function\",\"function\":{\"name\":\"f\"}}]%s}",
                 none ? ",\"tool_choice\":\"none\"" : "");
        ms_api_req r;
        ms_errbuf e;
        const char *param;
        CHECK(ms_api_parse(&r, MS_API_CHAT, body, strlen(body), &c4, &e, &param) == 0);
        CHECK(r.text && strstr(r.text, "### Available Tool Schemas\n\n{\"name\": \"f\"}"));
        CHECK(r.parse_tools == (none ? MS_TOOLS_NONE : MS_TOOLS_DSML));
        ms_api_req_deinit(&r);
    }
    int ok;
    ms_api_req r;
    ms_errbuf e = {{0}};
    const char *param = NULL;
    const char *bad =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":3}";
    ok = ms_api_parse(&r, MS_API_CHAT, bad, strlen(bad), &c4, &e, &param) == MS_EINVAL && param &&
         !strcmp(param, "reasoning_effort");
    ms_api_req_deinit(&r);
    CHECK(ok);
}

static void expect_bad(enum ms_api_kind k, const char *body, int code, const char *want_param,
                       const char *needle, int *ok)
{
    ms_api_req r;
    ms_errbuf e = {{0}};
    const char *param = NULL;
    int rc = parse(k, body, &r, &e, &param);
    ms_api_req_deinit(&r);
    *ok = rc == code && (!want_param || (param && !strcmp(param, want_param))) &&
          (!needle || strstr(e.msg, needle));
    if (!*ok)
        fprintf(stderr, "  %s -> rc %d param %s msg '%s'\n", body, rc, param ? param : "-", e.msg);
}

TEST(parse_rejects)
{
    int ok;
    const char *M = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char b[512];
#define BAD(kind, body, code, par, needle)                                                         \
    do {                                                                                           \
        expect_bad(kind, body, code, par, needle, &ok);                                            \
        CHECK(ok);                                                                                 \
    } while (0)
    BAD(MS_API_CHAT, "{", MS_EFORMAT, NULL, "malformed JSON");
    BAD(MS_API_CHAT, "{} x", MS_EFORMAT, NULL, NULL);
    BAD(MS_API_CHAT, "{\"a\":1,\"a\":2}", MS_EFORMAT, NULL, NULL);
    BAD(MS_API_CHAT, "\"str\"", MS_EFORMAT, NULL, NULL);
    BAD(MS_API_CHAT, "[1]", MS_EINVAL, NULL, "object");
    BAD(MS_API_CHAT, "{\"messages\":\"hi\"}", MS_EINVAL, "messages", "non-empty array");
    BAD(MS_API_CHAT, "{}", MS_EINVAL, "messages", "required");
    snprintf(b, sizeof b, "{%s,\"max_tokens\":\"x\"}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "max_tokens", "'max_tokens' must be an integer");
    snprintf(b, sizeof b, "{%s,\"max_tokens\":0}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "max_tokens", "between 1");
    snprintf(b, sizeof b, "{%s,\"max_tokens\":1.5}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "max_tokens", NULL);
    snprintf(b, sizeof b, "{%s,\"temperature\":\"hot\"}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "temperature", "number");
    snprintf(b, sizeof b, "{%s,\"temperature\":-0.1}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "temperature", NULL);
    snprintf(b, sizeof b, "{%s,\"top_p\":0}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "top_p", NULL);
    snprintf(b, sizeof b, "{%s,\"n\":17}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "n", "between 1 and 16");
    BAD(MS_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"n\":2}}", MS_EINVAL, "n",
        "/v1/completions");
    snprintf(b, sizeof b, "{%s,\"stream\":1}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "stream", "boolean");
    snprintf(b, sizeof b, "{%s,\"stop\":[1]}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "stop", "stop[0]");
    snprintf(b, sizeof b,
             "{%s,\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\","
             "\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}",
             M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "stop", "limit is 16");
    snprintf(b, sizeof b, "{%s,\"top_logprobs\":3}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "top_logprobs", "requires");
    snprintf(b, sizeof b, "{%s,\"logprobs\":true,\"top_logprobs\":21}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "top_logprobs", NULL);
    snprintf(b, sizeof b, "{%s,\"stop_token_ids\":[5000]}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "stop_token_ids", "vocabulary");
    snprintf(b, sizeof b, "{%s,\"response_format\":{\"type\":\"json_object\"}}", M);
    BAD(MS_API_CHAT, b, MS_EUNSUPPORTED, "response_format", NULL);
    snprintf(b, sizeof b, "{%s,\"rid\":7}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "rid", NULL);
    snprintf(b, sizeof b, "{%s,\"chat_template_kwargs\":{\"thinking\":\"yes\"}}", M);
    BAD(MS_API_CHAT, b, MS_EINVAL, "chat_template_kwargs", "boolean");
    BAD(MS_API_COMPLETION, "{\"prompt\":5}", MS_EINVAL, "prompt", NULL);
    BAD(MS_API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", MS_EUNSUPPORTED, "prompt", "batches");
    BAD(MS_API_COMPLETION, "{\"prompt\":[1,-2]}", MS_EINVAL, "prompt", "prompt[1]");
    BAD(MS_API_COMPLETION, "{\"prompt\":\"a\",\"echo\":true}", MS_EUNSUPPORTED, "echo", NULL);
    BAD(MS_API_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":true}", MS_EINVAL, "logprobs",
        "integer");
    BAD(MS_API_GENERATE, "{\"text\":\"a\",\"input_ids\":[1]}", MS_EINVAL, "text", "exactly one");
    BAD(MS_API_GENERATE, "{\"text\":[\"a\"]}", MS_EINVAL, "text", NULL);
    BAD(MS_API_GENERATE, "{\"input_ids\":[[1,2]]}", MS_EUNSUPPORTED, "input_ids", NULL);
    BAD(MS_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":-1}}", MS_EINVAL,
        "max_new_tokens", NULL);
    BAD(MS_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":[]}", MS_EINVAL, "sampling_params",
        NULL);
#undef BAD
}

TEST(context_rules)
{
    ms_api_req r;
    ms_errbuf e;
    const char *param;
    int32_t ids[120] = {0};
    /* completions default max_tokens is 16 (given) */
    CHECK(parse(MS_API_COMPLETION, "{\"prompt\":\"x\"}", &r, &e, &param) == 0);
    CHECK(ms_api_check_input(&r, ids, 83, &cfg, &e) == 0 && r.params.max_new == 16);
    CHECK(ms_api_check_input(&r, ids, 84, &cfg, &e) == MS_ECONTEXT);
    CHECK(strstr(e.msg,
                 "maximum context length of 100 tokens. You requested a total of 100 tokens: "
                 "84 tokens from the input messages and 16 tokens for the completion"));
    CHECK(ms_api_check_input(&r, ids, 100, &cfg, &e) == MS_ECONTEXT);
    CHECK(!strcmp(
        e.msg, "The input (100 tokens) is longer than the model's context length (100 tokens)."));
    CHECK(ms_api_check_input(&r, ids, 0, &cfg, &e) == MS_EINVAL);
    ids[3] = TC_VOCAB;
    CHECK(ms_api_check_input(&r, ids, 10, &cfg, &e) == MS_EINVAL && strstr(e.msg, "vocabulary"));
    ids[3] = 0;
    ms_api_req_deinit(&r);
    /* chat without max_tokens: fills the rest of the context */
    CHECK(parse(MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e,
                &param) == 0);
    CHECK(ms_api_check_input(&r, ids, 30, &cfg, &e) == 0 && r.params.max_new == 69);
    ms_api_req_deinit(&r);
    /* /generate default 128 is clipped to the room left */
    CHECK(parse(MS_API_GENERATE, "{\"input_ids\":[1,2]}", &r, &e, &param) == 0);
    CHECK(ms_api_check_input(&r, ids, 2, &cfg, &e) == 0 && r.params.max_new == 97);
    ms_api_req_deinit(&r);
}

TEST(formatting)
{
    char *b = ms_api_error_body(400, "bad \"thing\"", "max_tokens");
    json_t *o = json_loads(b, 0, NULL);
    json_t *er = json_object_get(o, "error");
    CHECK(!strcmp(json_string_value(json_object_get(er, "message")), "bad \"thing\""));
    CHECK(!strcmp(json_string_value(json_object_get(er, "param")), "max_tokens"));
    CHECK(json_integer_value(json_object_get(er, "code")) == 400 &&
          json_is_string(json_object_get(er, "type")));
    json_decref(o);
    free(b);
    b = ms_api_error_body(503, "bad \xff utf8", NULL); /* never emits invalid JSON */
    o = json_loads(b, 0, NULL);
    CHECK(o && json_is_null(json_object_get(json_object_get(o, "error"), "param")));
    json_decref(o);
    free(b);
    json_t *c = ms_api_chat_chunk("id1", 5, "m", json_pack("{s:s}", "content", "hi"), "stop", NULL);
    size_t n;
    char *f = ms_api_sse_frame(c, &n);
    CHECK(f && n == strlen(f) && !strncmp(f, "data: {", 7) && !strcmp(f + n - 2, "\n\n"));
    CHECK(strstr(f, "\"finish_reason\":\"stop\"") &&
          strstr(f, "\"object\":\"chat.completion.chunk\""));
    CHECK(!strchr(f, '\n') || strchr(f, '\n') == f + n - 2); /* one line per frame */
    free(f);
    json_decref(c);
    json_t *u = ms_api_usage(10, 5, 4);
    CHECK(json_integer_value(json_object_get(u, "total_tokens")) == 15);
    CHECK(json_integer_value(
              json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 4);
    json_decref(u);
    CHECK(!strcmp(ms_api_finish_str(MS_SERVE_FINISH_STOP, 1), "tool_calls"));
    CHECK(!strcmp(ms_api_finish_str(MS_SERVE_FINISH_LENGTH, 0), "length"));
    ms_serve_tok t = {
        .id = 'a', .logprob = -1.5f, .n_top = 2, .top_ids = {'a', 'b'}, .top_lps = {-1.5f, -2.f}};
    json_t *lp = ms_api_chat_logprob(&test_codec, &t, 1);
    CHECK(!strcmp(json_string_value(json_object_get(lp, "token")), "a"));
    CHECK(json_array_size(json_object_get(lp, "top_logprobs")) == 2);
    CHECK(json_integer_value(json_array_get(json_object_get(lp, "bytes"), 0)) == 'a');
    json_decref(lp);
    t.id = 0xe4; /* a partial character: token text is lossy, bytes exact */
    lp = ms_api_chat_logprob(&test_codec, &t, 0);
    CHECK(lp && json_integer_value(json_array_get(json_object_get(lp, "bytes"), 0)) == 0xe4);
    json_decref(lp);
}

TEST(channel_and_queue)
{
    ms_engine_info in = {.context_len = 100, .n_dp = 1};
    ms_errbuf e;
    ms_serve_hub *h = ms_serve_hub_new(&in, &e);
    CHECK(h);
    in.n_dp = 0;
    CHECK(ms_serve_hub_new(&in, &e) == NULL);
    ms_req_params s;
    ms_req_params_init(&s);
    s.top_logprobs = 2;
    int32_t ids[3] = {1, 2, 3};
    ms_serve_req *r = ms_serve_req_new("r1", ids, 3, &s);
    CHECK(r && r->n_input == 3 && r->input_ids[2] == 3 && r->dp_rank_hint == -1 && r->id > 0);
    CHECK(ms_serve_hub_wait(h, 0) == 0);
    CHECK(ms_serve_hub_submit(h, r, 1, &e) == 0);
    CHECK(ms_serve_hub_submit(h, r, 1, &e) == MS_EFULL); /* max_queued 1 */
    CHECK(ms_serve_hub_n_queued(h) == 1 && ms_serve_hub_wait(h, 0) == 1);
    ms_serve_msg m;
    CHECK(ms_serve_hub_pop(h, &m) == 1 && m.kind == MS_MSG_GENERATE && m.req == r);
    CHECK(ms_serve_hub_pop(h, &m) == 0 && ms_serve_hub_wait(h, 0) == 0);
    /* engine pushes, front end takes */
    for (int i = 0; i < 100; i++) {
        int32_t top[2] = {i, i + 1};
        float tl[2] = {-1, -2};
        CHECK(ms_serve_req_push(r, i, -0.5f, top, tl) == 0);
    }
    ms_serve_tok t[64];
    int fin;
    CHECK(ms_serve_req_take(r, 0, t, 64, 0, &fin) == 64 && fin == 0 && t[63].id == 63 &&
          t[63].top_ids[1] == 64);
    CHECK(ms_serve_req_take(r, 64, t, 64, 0, &fin) == 36 && fin == 0);
    double t0 = ms_now_s();
    CHECK(ms_serve_req_take(r, 100, t, 64, 50, &fin) == 0 && ms_now_s() - t0 >= 0.04);
    ms_serve_req_finish(r, MS_SERVE_FINISH_LENGTH, -1, NULL);
    ms_serve_req_finish(r, MS_SERVE_FINISH_ABORT, -1, "late"); /* first wins */
    CHECK(ms_serve_req_push(r, 5, 0, NULL, NULL) == 0 && ms_serve_req_n_generated(r) == 100);
    CHECK(ms_serve_req_take(r, 100, t, 64, -1, &fin) == 0 && fin == MS_SERVE_FINISH_LENGTH);
    /* abort message carries a reference and marks the request */
    CHECK(ms_serve_hub_post(h, MS_MSG_ABORT, r) == 0 && ms_serve_req_aborted(r));
    CHECK(ms_serve_hub_post(h, MS_MSG_ABORT, NULL) == MS_EINVAL);
    CHECK(ms_serve_hub_post(h, MS_MSG_ABORT_ALL, NULL) == 0);
    CHECK(ms_serve_hub_pop(h, &m) == 1 && m.kind == MS_MSG_ABORT && m.req == r);
    ms_serve_req_unref(m.req);
    CHECK(ms_serve_hub_pop(h, &m) == 1 && m.kind == MS_MSG_ABORT_ALL && !m.req);
    ms_serve_req_unref(r); /* the GENERATE reference */
    ms_serve_req_unref(r); /* ours */
    /* load snapshot + queue limit counts waiting requests */
    ms_dp_load ld = {.num_waiting_reqs = 3};
    ms_serve_hub_publish_load(h, 0, &ld);
    ms_serve_hub_publish_load(h, 5, &ld); /* out of range: ignored */
    ms_serve_req *r2 = ms_serve_req_new("r2", ids, 3, &s);
    CHECK(ms_serve_hub_submit(h, r2, 3, &e) == MS_EFULL && strstr(e.msg, "queue is full"));
    CHECK(ms_serve_hub_submit(h, r2, 4, &e) == 0);
    ms_serve_hub_request_stop(h);
    CHECK(ms_serve_hub_stop_requested(h) && ms_serve_hub_wait(h, -1) == 1);
    CHECK(ms_serve_hub_submit(h, r2, 0, &e) == MS_EBUSY);
    ms_serve_req_unref(r2);
    ms_serve_hub_free(h); /* drops the queued reference */
    ms_serve_req_unref(NULL);
    CHECK(ms_serve_req_new("x", ids, -1, &s) == NULL);
}

TEST(metrics_text)
{
    ms_metrics *m = ms_metrics_new("mo\"del");
    ms_metrics_observe_request(m, 10, 5, 2, 0.3, 1.0, MS_SERVE_FINISH_STOP);
    ms_metrics_observe_request(m, 10, 1, 0, -1, 0.5, MS_SERVE_FINISH_ABORT);
    ms_metrics_observe_itl(m, 0.02, 2);
    char *t;
    size_t n;
    CHECK(ms_metrics_render(m, NULL, &t, &n) == 0 && n == strlen(t));
    /* the aborted request: counted as aborted, not in the totals or the e2e histogram */
    CHECK(strstr(t, "sglang:prompt_tokens_total{model_name=\"mo\\\"del\"} 10\n"));
    CHECK(strstr(t, "sglang:num_requests_total{model_name=\"mo\\\"del\"} 1\n"));
    CHECK(strstr(t, "sglang:num_aborted_requests_total{model_name=\"mo\\\"del\"} 1\n"));
    CHECK(strstr(t, "sglang:inter_token_latency_seconds_count{model_name=\"mo\\\"del\"} 2\n"));
    CHECK(strstr(
        t, "sglang:time_to_first_token_seconds_bucket{model_name=\"mo\\\"del\",le=\"0.4\"} 1\n"));
    CHECK(strstr(
        t, "sglang:time_to_first_token_seconds_bucket{model_name=\"mo\\\"del\",le=\"0.2\"} 0\n"));
    CHECK(strstr(t, "sglang:e2e_request_latency_seconds_count{model_name=\"mo\\\"del\"} 1\n"));
    free(t);
    ms_metrics_free(m);
    ms_metrics_free(NULL);
}

int main(void)
{
    RUN(parse_chat_fields);
    RUN(parse_chat_v4);
    RUN(parse_rejects);
    RUN(context_rules);
    RUN(formatting);
    RUN(channel_and_queue);
    RUN(metrics_text);
    return TEST_REPORT();
}
