/* test_chat.c — DeepSeek chat template rendering, the streaming tool-call and
 * reasoning parser (fed whole, byte by byte and in odd splits), and the
 * incremental detokenizer (partial UTF-8, stop strings across tokens). */
#include "echo_engine.h"
#include "harness.h"
#include "serve/chat.h"
#include "serve/detok.h"
#include "model/tokenizer.h"

#include <unistd.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static char *render(const char *msgs, const char *tools, int thinking, int *rc)
{
    json_t *m = json_loads(msgs, 0, NULL), *t = tools ? json_loads(tools, 0, NULL) : NULL;
    ms_chat_opts o = {.thinking = thinking, .add_generation_prompt = 1};
    char *out = NULL;
    size_t n = 0;
    ms_errbuf e;
    *rc = ms_chat_render(m, t, &o, &out, &n, &e);
    if (*rc) fprintf(stderr, "  render: %s\n", e.msg);
    json_decref(m);
    json_decref(t);
    return out;
}

TEST(template_basic)
{
    int rc;
    char *s =
        render("[{\"role\":\"system\",\"content\":\"S1\"},{\"role\":\"user\",\"content\":\"Hi\"},"
               "{\"role\":\"assistant\",\"content\":\"<think>r</"
               "think>Yo\"},{\"role\":\"system\",\"content\":\"S2\"},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},{\"type\":"
               "\"text\",\"text\":\"B\"}]}]",
               NULL, -1, &rc);
    CHECK(rc == 0);
    const char *want = MS_CHAT_BOS "S1\n\nS2" MS_CHAT_USER "Hi" MS_CHAT_ASSISTANT
                                   "Yo" MS_CHAT_EOS MS_CHAT_USER "AB" MS_CHAT_ASSISTANT;
    CHECKF(!strcmp(s, want), "got %s", s);
    free(s);
    /* V3.1 thinking on/off */
    s = render("[{\"role\":\"user\",\"content\":\"Q\"}]", NULL, 1, &rc);
    CHECK(rc == 0 && !strcmp(s, MS_CHAT_BOS MS_CHAT_USER "Q" MS_CHAT_ASSISTANT "<think>"));
    free(s);
    s = render("[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"A\"},{"
               "\"role\":\"user\",\"content\":\"Q2\"}]",
               NULL, 0, &rc);
    CHECK(rc == 0 && !strcmp(s, MS_CHAT_BOS MS_CHAT_USER "Q" MS_CHAT_ASSISTANT
                                                         "</think>A" MS_CHAT_EOS MS_CHAT_USER
                                                         "Q2" MS_CHAT_ASSISTANT "</think>"));
    free(s);
}

TEST(template_tools)
{
    int rc;
    char *s = render(
        "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c0\",\"type\":"
        "\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"t2\",\"arguments\":{\"x\":1}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c0\",\"content\":\"sunny\"},"
        "{\"role\":\"assistant\",\"content\":\"It is "
        "sunny.\"},{\"role\":\"user\",\"content\":\"thanks\"}]",
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get "
        "weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]",
        0, &rc);
    CHECK(rc == 0);
    CHECK(!strncmp(s,
                   MS_CHAT_BOS
                   "sys\n\n## Tools\nYou have access to the following tools:\n\n### get_weather\n"
                   "Description: Get weather\n\nParameters: {\"type\": \"object\", \"properties\": "
                   "{\"city\": {\"type\": \"string\"}}}\n\n"
                   "IMPORTANT: ALWAYS adhere",
                   200));
    const char *calls =
        MS_CHAT_USER "weather?" MS_CHAT_ASSISTANT "</think>" MS_CHAT_CALLS_BEGIN MS_CHAT_CALL_BEGIN
                     "get_weather" MS_CHAT_SEP
                     "{\"city\":\"Paris\"}" MS_CHAT_CALL_END MS_CHAT_CALL_BEGIN "t2" MS_CHAT_SEP
                     "{\"x\":1}" MS_CHAT_CALL_END MS_CHAT_CALLS_END MS_CHAT_EOS MS_CHAT_OUTPUT_BEGIN
                     "sunny" MS_CHAT_OUTPUT_END "It is sunny." MS_CHAT_EOS MS_CHAT_USER
                     "thanks" MS_CHAT_ASSISTANT "</think>";
    CHECKF(strstr(s, calls) != NULL, "got %s", s);
    CHECK(!strcmp(s + strlen(s) - strlen(calls), calls));
    free(s);
    /* no system prompt, a tool without description */
    s = render("[{\"role\":\"user\",\"content\":\"q\"}]",
               "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]", 0, &rc);
    CHECK(rc == 0);
    CHECKF(!strncmp(s,
                    MS_CHAT_BOS "\n\n## Tools\nYou have access to the following tools:\n\n### "
                                "f\n\nParameters: {}\n\nIMPORTANT",
                    80),
           "%s", s);
    free(s);
    /* after a tool result no generation prompt is added (the model continues) */
    s = render("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{"
               "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
               "{\"role\":\"tool\",\"content\":\"r\"}]",
               NULL, 0, &rc);
    CHECK(rc == 0);
    CHECK(!strcmp(s + strlen(s) - strlen(MS_CHAT_OUTPUT_END), MS_CHAT_OUTPUT_END));
    free(s);
}

TEST(template_errors)
{
    int rc;
    char *s = render("[]", NULL, -1, &rc);
    CHECK(rc == MS_EINVAL && !s);
    s = render("[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]", NULL, -1, &rc);
    CHECK(rc == MS_EINVAL && !s);
    s = render("[{\"role\":5}]", NULL, -1, &rc);
    CHECK(rc == MS_EINVAL && !s);
    s = render("[{\"role\":\"user\",\"content\":\"x\"}]", "[{\"function\":{}}]", -1, &rc);
    CHECK(rc == MS_EINVAL && !s);
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"x\"}]", 0, NULL);
    ms_errbuf e;
    char *out = NULL;
    size_t n;
    ms_chat_opts o = {-1, 1};
    CHECK(ms_chat_render(m, NULL, &o, &out, &n, &e) == 0 && n == strlen(out));
    free(out);
    json_decref(m);
}

/* Feeds text in pieces of `step` bytes (0 = whole) and collects the results. */
struct parsed {
    char reasoning[512], content[512], name[8][64], args[8][256];
    int n_calls;
};

static void collect(ms_chat_delta *d, struct parsed *p)
{
    if (d->reasoning)
        strncat(p->reasoning, d->reasoning, sizeof p->reasoning - strlen(p->reasoning) - 1);
    if (d->content) strncat(p->content, d->content, sizeof p->content - strlen(p->content) - 1);
    size_t i;
    json_t *t;
    json_array_foreach(d->tool_calls, i, t)
    {
        int idx = (int)json_integer_value(json_object_get(t, "index"));
        if (idx < 0 || idx >= 8) continue;
        if (idx + 1 > p->n_calls) p->n_calls = idx + 1;
        const char *nm = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        const char *ar =
            json_string_value(json_object_get(json_object_get(t, "function"), "arguments"));
        if (nm) strncat(p->name[idx], nm, 63 - strlen(p->name[idx]));
        if (ar) strncat(p->args[idx], ar, 255 - strlen(p->args[idx]));
    }
}

static int parse(const char *text, size_t step, int sep, int in_reason, int tools, struct parsed *p,
                 ms_chat_parser *keep)
{
    memset(p, 0, sizeof *p);
    ms_chat_parser ps;
    if (ms_chat_parser_init(&ps, sep, in_reason, tools)) return -1;
    size_t n = strlen(text), pos = 0;
    ms_chat_delta d;
    while (pos < n) {
        size_t k = step && step < n - pos ? step : n - pos;
        ms_chat_parser_feed(&ps, text + pos, k, 0, &d);
        collect(&d, p);
        ms_chat_delta_clear(&d);
        pos += k;
    }
    ms_chat_parser_feed(&ps, "", 0, 1, &d);
    collect(&d, p);
    ms_chat_delta_clear(&d);
    if (keep)
        *keep = ps;
    else
        ms_chat_parser_deinit(&ps);
    return 0;
}

TEST(tool_call_parse_streaming)
{
    const char *text =
        "Let me check." MS_CHAT_CALLS_BEGIN MS_CHAT_CALL_BEGIN "get_weather" MS_CHAT_SEP
        "{\"city\": \"Par\xc3\xads\"}" MS_CHAT_CALL_END MS_CHAT_CALL_BEGIN "get_time" MS_CHAT_SEP
        "{\"tz\": \"CET\"}" MS_CHAT_CALL_END MS_CHAT_CALLS_END;
    size_t steps[] = {0, 1, 2, 3, 5, 7, 13};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        struct parsed p;
        ms_chat_parser keep;
        CHECK(parse(text, steps[s], 0, 0, 1, &p, &keep) == 0);
        CHECKF(!strcmp(p.content, "Let me check."), "step %zu content '%s'", steps[s], p.content);
        CHECK(p.n_calls == 2);
        CHECK(!strcmp(p.name[0], "get_weather") && !strcmp(p.name[1], "get_time"));
        CHECKF(!strcmp(p.args[0], "{\"city\": \"Par\xc3\xads\"}"), "step %zu args '%s'", steps[s],
               p.args[0]);
        CHECK(!strcmp(p.args[1], "{\"tz\": \"CET\"}"));
        /* the accumulated (non-stream) view agrees */
        CHECK(json_array_size(keep.all_calls) == 2);
        json_t *f1 = json_object_get(json_array_get(keep.all_calls, 1), "function");
        CHECK(!strcmp(json_string_value(json_object_get(f1, "arguments")), "{\"tz\": \"CET\"}"));
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(keep.all_calls, 0), "id")),
                      "call_0"));
        ms_chat_parser_deinit(&keep);
    }
    /* without a tool parser the markup stays text; a truncated call keeps its partial args */
    struct parsed p;
    CHECK(parse(text, 3, 0, 0, 0, &p, NULL) == 0 && p.n_calls == 0 && !strcmp(p.content, text));
    CHECK(parse(MS_CHAT_CALLS_BEGIN MS_CHAT_CALL_BEGIN "f" MS_CHAT_SEP "{\"a\":", 4, 0, 0, 1, &p,
                NULL) == 0);
    CHECK(p.n_calls == 1 && !strcmp(p.name[0], "f") && !strcmp(p.args[0], "{\"a\":"));
    /* a lone '<' that never becomes a marker is released at the end */
    CHECK(parse("a <b <\xef\xbd\x9c", 1, 0, 0, 1, &p, NULL) == 0 &&
          !strcmp(p.content, "a <b <\xef\xbd\x9c"));
}

TEST(reasoning_split)
{
    size_t steps[] = {0, 1, 4};
    for (size_t s = 0; s < 3; s++) {
        struct parsed p;
        CHECK(parse("<think>deep thought</think>\n\nanswer", steps[s], 1, 1, 0, &p, NULL) == 0);
        CHECKF(!strcmp(p.reasoning, "deep thought"), "'%s'", p.reasoning);
        CHECK(!strcmp(p.content, "\n\nanswer"));
        CHECK(parse("still thinking</thi", steps[s], 1, 1, 0, &p, NULL) == 0);
        CHECK(!strcmp(p.reasoning, "still thinking</thi") && !p.content[0]);
        /* not starting in reasoning (V3.1 without thinking): everything is content */
        CHECK(parse("plain</think>x", steps[s], 1, 0, 0, &p, NULL) == 0 &&
              !strcmp(p.content, "plain</think>x"));
        /* reasoning then a tool call */
        CHECK(parse("hmm</think>" MS_CHAT_CALLS_BEGIN MS_CHAT_CALL_BEGIN "f" MS_CHAT_SEP
                    "{}" MS_CHAT_CALL_END MS_CHAT_CALLS_END,
                    steps[s], 1, 1, 1, &p, NULL) == 0);
        CHECK(!strcmp(p.reasoning, "hmm") && p.n_calls == 1 && !strcmp(p.args[0], "{}") &&
              !p.content[0]);
    }
}

static int detok_run(const int32_t *ids, size_t n, char *const *stops, int n_stops, char *out,
                     size_t cap, int *stopped_at)
{
    ms_detok d;
    if (ms_detok_init(&d, &test_codec, 1, stops, n_stops)) return -1;
    out[0] = 0;
    *stopped_at = -1;
    for (size_t i = 0; i < n; i++) {
        const char *delta;
        size_t k;
        int rc = ms_detok_push(&d, ids[i], &delta, &k);
        strncat(out, delta, k < cap - strlen(out) - 1 ? k : cap - strlen(out) - 1);
        if (rc == 1) {
            *stopped_at = (int)i;
            break;
        }
        /* a delta is always whole UTF-8 */
        if (k && ms_utf8_complete_prefix(delta, k) != k) return -2;
    }
    const char *delta;
    size_t k;
    ms_detok_flush(&d, &delta, &k);
    strncat(out, delta, k);
    int st = d.stop_index;
    ms_detok_deinit(&d);
    return st;
}

TEST(detok_utf8_and_stops)
{
    /* "é世" as bytes, then EOS (special: skipped) */
    int32_t a[] = {0xc3, 0xa9, 0xe4, 0xb8, 0x96, TC_EOS};
    char out[256];
    int at;
    CHECK(detok_run(a, 6, NULL, 0, out, sizeof out, &at) == -1 &&
          !strcmp(out, "\xc3\xa9\xe4\xb8\x96"));
    /* a truncated character becomes U+FFFD at the end; invalid bytes too */
    int32_t b[] = {'x', 0xe4, 0xb8};
    CHECK(detok_run(b, 3, NULL, 0, out, sizeof out, &at) == -1 && !strcmp(out, "x\xef\xbf\xbd"));
    int32_t c[] = {0xff, 'y', 0x80};
    CHECK(detok_run(c, 3, NULL, 0, out, sizeof out, &at) == -1 &&
          !strcmp(out, "\xef\xbf\xbdy\xef\xbf\xbd"));
    /* a stop string split across tokens; text before it only */
    char *stops[] = {"END", "xyz"};
    const char *t = "abcENDdef";
    int32_t ids[16];
    for (int i = 0; t[i]; i++) ids[i] = (unsigned char)t[i];
    CHECK(detok_run(ids, strlen(t), stops, 2, out, sizeof out, &at) == 0);
    CHECK(!strcmp(out, "abc") && at == 5);
    /* a held-back prefix that does not complete is released */
    const char *t2 = "abEN";
    for (int i = 0; t2[i]; i++) ids[i] = (unsigned char)t2[i];
    CHECK(detok_run(ids, 4, stops, 2, out, sizeof out, &at) == -1 && !strcmp(out, "abEN"));
    /* the earliest of several matches wins */
    const char *t3 = "--xyzEND";
    for (int i = 0; t3[i]; i++) ids[i] = (unsigned char)t3[i];
    CHECK(detok_run(ids, 8, stops, 2, out, sizeof out, &at) == 1 && !strcmp(out, "--"));
    /* a multi-byte stop string */
    char *st2[] = {"\xe4\xb8\x96"};
    CHECK(detok_run(a, 6, st2, 1, out, sizeof out, &at) == 0 && !strcmp(out, "\xc3\xa9"));
    /* an out-of-range id is an error, not a crash */
    ms_detok d;
    const char *delta;
    size_t k;
    CHECK(ms_detok_init(&d, &test_codec, 1, NULL, 0) == 0);
    CHECK(ms_detok_push(&d, 999999, &delta, &k) < 0);
    ms_detok_deinit(&d);
}

/* The codec over the real tokenizer (a small trained DeepSeek-style one):
 * markers are single tokens, decoding through ms_detok reproduces the text,
 * BOS/EOS are skipped as special, tool markers are not. */
TEST(codec_real_tokenizer)
{
    char path[] = "/tmp/ms_tok_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    ms_errbuf e;
    CHECKF(ms_tokenizer_train_write(NULL, 0, 2000, path, &e) == 0, "%s", e.msg);
    ms_tokenizer *tok = NULL;
    int rc = ms_tokenizer_load(&tok, path, &e);
    unlink(path);
    CHECKF(rc == 0, "%s", e.msg);
    ms_serve_codec c;
    ms_serve_codec_from_tokenizer(&c, tok);
    CHECK(c.vocab_size == 2000);
    int r2;
    char *prompt =
        render("[{\"role\":\"user\",\"content\":\"h\u00e9llo \u4e16\u754c\"}]", NULL, 0, &r2);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(r2 == 0 && c.encode(c.ctx, prompt, strlen(prompt), 1, &ids, &n, &e) == 0);
    free(prompt);
    int32_t user = c.token_id(c.ctx, MS_CHAT_USER), bos = c.token_id(c.ctx, MS_CHAT_BOS);
    CHECK(user >= 0 && bos >= 0 && ids[0] == bos && ids[1] == user);
    CHECK(c.is_special(c.ctx, bos) && !c.is_special(c.ctx, c.token_id(c.ctx, MS_CHAT_CALLS_BEGIN)));
    /* decode the user text back token by token */
    int32_t asst = c.token_id(c.ctx, MS_CHAT_ASSISTANT);
    ms_detok d;
    CHECK(ms_detok_init(&d, &c, 1, NULL, 0) == 0);
    char out[256] = "";
    for (size_t i = 2; i < n && ids[i] != asst; i++) {
        const char *delta;
        size_t k;
        CHECK(ms_detok_push(&d, ids[i], &delta, &k) == 0);
        strncat(out, delta, k);
    }
    const char *delta;
    size_t k;
    ms_detok_flush(&d, &delta, &k);
    strncat(out, delta, k);
    ms_detok_deinit(&d);
    free(ids);
    CHECKF(!strcmp(out, "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c"), "decoded '%s'", out);
    /* a tool-call marker decodes to its text (not skipped) */
    ms_detok_init(&d, &c, 1, NULL, 0);
    CHECK(ms_detok_push(&d, c.token_id(c.ctx, MS_CHAT_CALLS_BEGIN), &delta, &k) == 0);
    CHECK(k == strlen(MS_CHAT_CALLS_BEGIN) && !memcmp(delta, MS_CHAT_CALLS_BEGIN, k));
    CHECK(ms_detok_push(&d, bos, &delta, &k) == 0 && k == 0);
    ms_detok_deinit(&d);
    ms_tokenizer_free(tok);
}

int main(void)
{
    RUN(template_basic);
    RUN(template_tools);
    RUN(template_errors);
    RUN(tool_call_parse_streaming);
    RUN(reasoning_split);
    RUN(detok_utf8_and_stops);
    RUN(codec_real_tokenizer);
    return TEST_REPORT();
}
