/* test_chat.c — DeepSeek chat template rendering (V3.1's, and V4's against
 * hand-written conversations shaped as the release's encoder fixtures), the
 * streaming tool-call (V3.1 markers, V4 DSML) and reasoning parser (fed whole,
 * byte by byte and in odd splits), and the incremental detokenizer (partial
 * UTF-8, stop strings across tokens). */
#include "echo_engine.h"
#include "harness.h"
#include "serve/chat.h"
#include "serve/detok.h"
#include "model/tokenizer.h"
#include "tools/mkmodel_tok.h"

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
    ms_chat_opts o = {.thinking = -1, .add_generation_prompt = 1};
    CHECK(ms_chat_render(m, NULL, &o, &out, &n, &e) == 0 && n == strlen(out));
    free(out);
    json_decref(m);
}

/* Feeds text in pieces of `step` bytes (0 = whole) and collects the results. */
struct parsed {
    char reasoning[512], content[1024], name[8][64], args[8][256];
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

/* ---- DeepSeek-V4 (chat_v4.c, chat_dsml.c) ---- */

#define D MS_CHAT_DSML
/* The release's tools section, written out again by hand (encoding_dsv4.py TOOLS_TEMPLATE). */
#define V4_TOOLS_HEAD                                                                              \
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "   \
    "invoke tools by writing a \"<" D "tool_calls>\" block like the following:\n\n<" D             \
    "tool_calls>\n<" D "invoke name=\"$TOOL_NAME\">\n<" D                                          \
    "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" D                \
    "parameter>\n...\n</" D "invoke>\n<" D "invoke name=\"$TOOL_NAME2\">\n...\n</" D               \
    "invoke>\n</" D "tool_calls>\n\nString parameters should be specified as is and set "          \
    "`string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value " \
    "in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by "     \
    "<think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool " \
    "calls or final response.\n\nOtherwise, output directly after </think> with tool calls or "    \
    "final response.\n\n### Available Tool Schemas\n\n"
#define V4_TOOLS_TAIL                                                                              \
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "    \
    "tool calls.\n"
#define V4_MAX                                                                                     \
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough "  \
    "in your thinking and comprehensively decompose the problem to resolve the root cause, "       \
    "rigorously stress-testing your logic against all potential paths, edge cases, and "           \
    "adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting "  \
    "every intermediate step, considered alternative, and rejected hypothesis to ensure "          \
    "absolutely no assumption is left unchecked.\n\n"

static char *render4(const char *msgs, const char *tools, int thinking, int effort, int agp,
                     int *rc)
{
    json_error_t je;
    json_t *m = json_loads(msgs, 0, &je), *t = tools ? json_loads(tools, 0, NULL) : NULL;
    if (!m) fprintf(stderr, "  bad test JSON: %s at %d\n", je.text, je.column);
    ms_chat_opts o = {.thinking = thinking,
                      .add_generation_prompt = agp,
                      .format = MS_CHAT_FMT_V4,
                      .effort = effort};
    char *out = NULL;
    size_t n = 0;
    ms_errbuf e;
    *rc = m ? ms_chat_render(m, t, &o, &out, &n, &e) : -1;
    if (*rc && m) fprintf(stderr, "  render4: %s\n", e.msg);
    json_decref(m);
    json_decref(t);
    return out;
}

static int same(const char *got, const char *want)
{
    if (got && !strcmp(got, want)) return 1;
    size_t i = 0;
    while (got && got[i] && got[i] == want[i]) i++;
    fprintf(stderr, "  differ at byte %zu:\n  got  %.200s\n  want %.200s\n", i,
            got ? got + i : "(null)", want + i);
    return 0;
}

/* Both formats refuse the same malformed assistant tool calls (ms_chat_check_calls)
 * and render the well-formed one (an earlier turn: V4 reads a last assistant turn
 * with add_generation_prompt as a user turn, as the release does). */
TEST(tool_calls_checked_both_formats)
{
    static const char *const bad[] = {
        "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":{\"function\":{\"name\":\"f\"}}},{\"role\":\"user\",\"content\":\"y\"}]",
        "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"function\":{\"name\":\"f\"}},{\"function\":{\"name\":5}}]},"
        "{\"role\":\"user\",\"content\":\"y\"}]",
    };
    const char *good = "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\","
                       "\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                       "\"arguments\":\"{}\"}}]},{\"role\":\"user\",\"content\":\"y\"}]";
    int rc;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *s3 = render(bad[k], NULL, -1, &rc);
        CHECKF(rc == MS_EINVAL && !s3, "V3 format, case %zu: rc %d", k, rc);
        char *s4 = render4(bad[k], NULL, 0, 0, 1, &rc);
        CHECKF(rc == MS_EINVAL && !s4, "V4 format, case %zu: rc %d", k, rc);
    }
    char *s3 = render(good, NULL, -1, &rc);
    CHECK(rc == 0 && s3 && strstr(s3, "f"));
    free(s3);
    char *s4 = render4(good, NULL, 0, 0, 1, &rc);
    CHECK(rc == 0 && s4 && strstr(s4, "name=\"f\""));
    free(s4);
}

/* Thinking mode with tools (the shape of the release's test case 1, hand-written):
 * the request's tools on the system turn, a call with a string and a number,
 * its result merged into a user turn, reasoning kept (tools present). */
TEST(v4_encode_thinking_tools)
{
    int rc;
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"lookup\",\"description\":"
                        "\"Find a word\",\"parameters\":{\"type\":\"object\",\"properties\":{\"w\":"
                        "{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}}}}}]";
    char *s = render4(
        "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Define "
        "cat\"},{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Use lookup.\","
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"lookup\","
        "\"arguments\":\"{\\\"w\\\": \\\"cat\\\", \\\"n\\\": 2}\"}}]},{\"role\":\"tool\","
        "\"tool_call_id\":\"c1\",\"content\":\"a small feline\"},{\"role\":\"assistant\","
        "\"reasoning_content\":\"Got it.\",\"content\":\"A feline.\"},{\"role\":\"user\","
        "\"content\":\"More?\"}]",
        tools, 1, MS_CHAT_EFFORT_NONE, 1, &rc);
    const char *want = MS_CHAT_BOS
        "Be brief.\n\n" V4_TOOLS_HEAD
        "{\"name\": \"lookup\", \"description\": \"Find a word\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"w\": {\"type\": \"string\"}, \"n\": {\"type\": "
        "\"integer\"}}}}" V4_TOOLS_TAIL MS_CHAT_USER "Define cat" MS_CHAT_ASSISTANT
        "<think>Use lookup.</think>\n\n<" D "tool_calls>\n<" D "invoke name=\"lookup\">\n<" D
        "parameter name=\"w\" string=\"true\">cat</" D "parameter>\n<" D
        "parameter name=\"n\" string=\"false\">2</" D "parameter>\n</" D "invoke>\n</" D
        "tool_calls>" MS_CHAT_EOS MS_CHAT_USER
        "<tool_result>a small feline</tool_result>" MS_CHAT_ASSISTANT
        "<think>Got it.</think>A feline." MS_CHAT_EOS MS_CHAT_USER "More?" MS_CHAT_ASSISTANT
        "<think>";
    CHECK(rc == 0 && same(s, want));
    free(s);
    /* the same without thinking: </think> opens every assistant turn, no reasoning */
    s = render4("[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"A\","
                "\"reasoning_content\":\"r\"},{\"role\":\"user\",\"content\":\"Q2\"}]",
                NULL, 0, MS_CHAT_EFFORT_MAX, 1, &rc);
    CHECK(rc == 0 && same(s, MS_CHAT_BOS MS_CHAT_USER "Q" MS_CHAT_ASSISTANT
                                                      "</think>A" MS_CHAT_EOS MS_CHAT_USER
                                                      "Q2" MS_CHAT_ASSISTANT "</think>"));
    free(s);
}

/* Thinking without tools (the shape of test case 2): earlier reasoning dropped,
 * an earlier assistant opened with </think>; effort max prefixes the prompt,
 * effort high adds nothing. */
TEST(v4_encode_thinking_modes)
{
    int rc;
    const char *msgs =
        "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Hi\"},"
        "{\"role\":\"assistant\",\"reasoning_content\":\"greet\",\"content\":\"Hello!\"},"
        "{\"role\":\"user\",\"content\":\"2+2?\"}]";
    const char *tail = "S" MS_CHAT_USER "Hi" MS_CHAT_ASSISTANT
                       "</think>Hello!" MS_CHAT_EOS MS_CHAT_USER "2+2?" MS_CHAT_ASSISTANT "<think>";
    char want[4096];
    char *s = render4(msgs, NULL, 1, MS_CHAT_EFFORT_NONE, 1, &rc);
    snprintf(want, sizeof want, "%s%s", MS_CHAT_BOS, tail);
    CHECK(rc == 0 && same(s, want));
    free(s);
    s = render4(msgs, NULL, 1, MS_CHAT_EFFORT_HIGH, 1, &rc);
    CHECK(rc == 0 && same(s, want));
    free(s);
    s = render4(msgs, NULL, 1, MS_CHAT_EFFORT_MAX, 1, &rc);
    snprintf(want, sizeof want, "%s%s%s", MS_CHAT_BOS, V4_MAX, tail);
    CHECK(rc == 0 && same(s, want));
    free(s);
    /* a finished conversation (add_generation_prompt false) renders the last
     * reply with its reasoning, as the release's fixtures do */
    s = render4("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
                "\"reasoning_content\":\"r1\",\"content\":\"A1\"},{\"role\":\"user\",\"content\":"
                "\"Capital of France?\"},{\"role\":\"assistant\",\"reasoning_content\":\"Paris.\","
                "\"content\":\"Paris\"}]",
                NULL, 1, MS_CHAT_EFFORT_NONE, 0, &rc);
    CHECK(rc == 0 &&
          same(s, MS_CHAT_BOS MS_CHAT_USER
               "Hi" MS_CHAT_ASSISTANT "</think>A1" MS_CHAT_EOS MS_CHAT_USER
               "Capital of France?" MS_CHAT_ASSISTANT "<think>Paris.</think>Paris" MS_CHAT_EOS));
    free(s);
    /* with add_generation_prompt (SGLang) a trailing assistant turn is sent as a user turn */
    s = render4("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":"
                "\"Once upon\"}]",
                NULL, 0, 0, 1, &rc);
    CHECK(rc == 0 &&
          same(s, MS_CHAT_BOS MS_CHAT_USER "Hi\n\nOnce upon" MS_CHAT_ASSISTANT "</think>"));
    free(s);
}

/* Reminders, developer turns with their own tools (test case 3's shape), parallel
 * results sorted by the calls' order, values of every JSON type. */
TEST(v4_encode_roles_and_results)
{
    int rc;
    char *s = render4(
        "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"latest_reminder\",\"content\":"
        "\"2026-01-01\"},{\"role\":\"developer\",\"content\":\"find it\",\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"f\"}}]},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{\\\"x\\\": [1, true, null], \\\"y\\\": {\\\"k\\\": "
        "\\\"\xc3\xbc\\\"}}\"}},"
        "{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"oops\"}}]"
        "},"
        "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"RB\"},{\"role\":\"tool\","
        "\"tool_call_id\":\"a\",\"content\":\"RA\"},{\"role\":\"user\",\"content\":\"ok?\"}]",
        NULL, 0, 0, 1, &rc);
    const char *want = MS_CHAT_BOS
        "S" MS_CHAT_LATEST_REMINDER "2026-01-01" MS_CHAT_USER "find it\n\n" V4_TOOLS_HEAD
        "{\"name\": \"f\"}" V4_TOOLS_TAIL MS_CHAT_ASSISTANT "</think>\n\n<" D "tool_calls>\n<" D
        "invoke name=\"f\">\n<" D "parameter name=\"x\" string=\"false\">[1, true, null]</" D
        "parameter>\n<" D "parameter name=\"y\" string=\"false\">{\"k\": \"\xc3\xbc\"}</" D
        "parameter>\n</" D "invoke>\n<" D "invoke name=\"f\">\n<" D
        "parameter name=\"arguments\" string=\"true\">oops</" D "parameter>\n</" D "invoke>\n</" D
        "tool_calls>" MS_CHAT_EOS MS_CHAT_USER
        "<tool_result>RA</tool_result>\n\n<tool_result>RB</tool_result>\n\nok?" MS_CHAT_ASSISTANT
        "</think>";
    CHECK(rc == 0 && same(s, want));
    free(s);
    /* in thinking mode without tools an earlier developer turn is dropped */
    s = render4("[{\"role\":\"developer\",\"content\":\"d1\"},{\"role\":\"assistant\",\"content\":"
                "\"x\"},{\"role\":\"user\",\"content\":\"u\"}]",
                NULL, 1, 0, 1, &rc);
    CHECK(rc == 0 &&
          same(s, MS_CHAT_BOS "x" MS_CHAT_EOS MS_CHAT_USER "u" MS_CHAT_ASSISTANT "<think>"));
    free(s);
    /* errors name the message */
    s = render4("[{\"role\":\"developer\",\"content\":\"\"}]", NULL, 0, 0, 1, &rc);
    CHECK(rc == MS_EINVAL && !s);
    s = render4("[{\"role\":\"robot\",\"content\":\"x\"}]", NULL, 0, 0, 1, &rc);
    CHECK(rc == MS_EINVAL && !s);
    s = render4("[{\"role\":\"user\",\"content\":\"x\"}]", "[{\"function\":{}}]", 0, 0, 1, &rc);
    CHECK(rc == MS_EINVAL && !s);
}

/* DSML in generated text, fed whole and in every chunk size up to 9 bytes. */
TEST(v4_dsml_parse_streaming)
{
    const char *text =
        "Checking.\n\n<" D "tool_calls>\n<" D "invoke name=\"get_weather\">\n<" D
        "parameter name=\"city\" string=\"true\"> Par\xc3\xads </" D "parameter>\n<" D
        "parameter name=\"days\" string=\"false\">3</" D "parameter>\n<" D
        "parameter name=\"opts\" string=\"false\">{\"a\":[1,2.5]}</" D "parameter>\n<" D
        "parameter name=\"raw\" string=\"false\">not json</" D "parameter>\n</" D "invoke>\n<" D
        "invoke name=\"now\">\n{\"tz\": \"CET\"}\n</" D "invoke>\n<" D
        "invoke name=\"noargs\">\n</" D "invoke>\n</" D "tool_calls>";
    for (size_t step = 0; step <= 9; step++) {
        struct parsed p;
        ms_chat_parser keep;
        CHECK(parse(text, step, 1, 0, MS_TOOLS_DSML, &p, &keep) == 0);
        CHECKF(!strcmp(p.content, "Checking."), "step %zu content '%s'", step, p.content);
        CHECKF(p.n_calls == 3, "step %zu: %d calls", step, p.n_calls);
        CHECK(!strcmp(p.name[0], "get_weather") && !strcmp(p.name[1], "now") &&
              !strcmp(p.name[2], "noargs"));
        CHECKF(!strcmp(p.args[0], "{\"city\": \"Par\xc3\xads\", \"days\": 3, \"opts\": {\"a\": [1, "
                                  "2.5]}, \"raw\": \"not json\"}"),
               "step %zu args '%s'", step, p.args[0]);
        CHECK(!strcmp(p.args[1], "{\"tz\": \"CET\"}") && !strcmp(p.args[2], "{}"));
        CHECK(json_array_size(keep.all_calls) == 3);
        json_t *f0 = json_object_get(json_array_get(keep.all_calls, 0), "function");
        CHECK(!strcmp(json_string_value(json_object_get(f0, "arguments")), p.args[0]));
        ms_chat_parser_deinit(&keep);
    }
    struct parsed p;
    /* V3.1's parser does not read DSML, nor the DSML one V3.1's markers */
    CHECK(parse(text, 3, 1, 0, MS_TOOLS_V31, &p, NULL) == 0 && p.n_calls == 0 &&
          !strcmp(p.content, text));
    CHECK(parse(MS_CHAT_CALLS_BEGIN MS_CHAT_CALL_BEGIN "f" MS_CHAT_SEP
                                                       "{}" MS_CHAT_CALL_END MS_CHAT_CALLS_END,
                2, 1, 0, MS_TOOLS_DSML, &p, NULL) == 0 &&
          p.n_calls == 0);
    /* a call cut off by the end of generation is dropped; text before it stays */
    CHECK(parse("x <" D "tool_calls>\n<" D "invoke name=\"f\">\n<" D "parameter name=\"a\" str", 1,
                1, 0, MS_TOOLS_DSML, &p, NULL) == 0);
    CHECK(p.n_calls == 0 && !strcmp(p.content, "x"));
    /* whitespace not before a block, and a lone '<' or partial marker, stay content */
    CHECK(parse("a \n<b <\xef\xbd\x9c", 1, 1, 0, MS_TOOLS_DSML, &p, NULL) == 0 &&
          !strcmp(p.content, "a \n<b <\xef\xbd\x9c"));
    CHECK(parse("end \n", 1, 1, 0, MS_TOOLS_DSML, &p, NULL) == 0 && !strcmp(p.content, "end \n"));
    /* a bare invoke outside a block is a call too; text after a block is content */
    CHECK(parse("<" D "invoke name=\"g\">\n<" D "parameter name=\"k\" string=\"true\">v</" D
                "parameter>\n</" D "invoke>",
                4, 1, 0, MS_TOOLS_DSML, &p, NULL) == 0);
    CHECK(p.n_calls == 1 && !strcmp(p.args[0], "{\"k\": \"v\"}"));
}

/* --reasoning-parser deepseek-v4: thinking asked, the output opens inside the
 * reasoning (the prompt ended with <think>); not asked, all of it is content. */
TEST(v4_reasoning_then_dsml)
{
    const char *text = "The user wants weather.</think>\n\n<" D "tool_calls>\n<" D
                       "invoke name=\"w\">\n<" D "parameter name=\"c\" string=\"true\">Oslo</" D
                       "parameter>\n</" D "invoke>\n</" D "tool_calls>";
    for (size_t step = 0; step <= 5; step++) {
        struct parsed p;
        CHECK(parse(text, step, 1, 1, MS_TOOLS_DSML, &p, NULL) == 0);
        CHECKF(!strcmp(p.reasoning, "The user wants weather."), "'%s'", p.reasoning);
        CHECK(p.n_calls == 1 && !strcmp(p.name[0], "w") && !strcmp(p.args[0], "{\"c\": \"Oslo\"}"));
        CHECKF(!p.content[0], "content '%s'", p.content);
        CHECK(parse("Answer: 4.", step, 1, 0, MS_TOOLS_DSML, &p, NULL) == 0 && !p.reasoning[0] &&
              !strcmp(p.content, "Answer: 4."));
        CHECK(parse("15% of 240</think>36", step, 1, 1, MS_TOOLS_NONE, &p, NULL) == 0 &&
              !strcmp(p.reasoning, "15% of 240") && !strcmp(p.content, "36"));
    }
}
#undef D

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
/* mkmodel's V4 tokenizer: V4's ids at the release's vocabulary size, V4's
 * order at a small one; a V4 prompt's markers (｜DSML｜ too) are single tokens
 * that decode to their text. */
TEST(v4_tokenizer_specials)
{
    char dir[] = "/tmp/ms_v4tok_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[64];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ms_errbuf e;
    static const struct {
        const char *tok;
        int32_t id;
    } want[] = {{MS_CHAT_BOS, 0},
                {MS_CHAT_EOS, 1},
                {MS_CHAT_USER, 128803},
                {MS_CHAT_ASSISTANT, 128804},
                {"<think>", 128821},
                {"</think>", 128822},
                {MS_CHAT_DSML, 128825},
                {MS_CHAT_LATEST_REMINDER, 128828},
                {"<\xef\xbd\x9c"
                 "action\xef\xbd\x9c>",
                 128829},
                {"<\xef\xbd\x9c"
                 "title\xef\xbd\x9c>",
                 128836},
                {"<\xef\xbd\x9cread_url\xef\xbd\x9c>", 128845}};
    int32_t sizes[] = {MS_MKMODEL_V4_VOCAB, 1200};
    for (int k = 0; k < 2; k++) {
        CHECKF(ms_mkmodel_write_v4_tokenizer(dir, sizes[k], &e) == 0, "%s", e.msg);
        ms_tokenizer *tok = NULL;
        CHECKF(ms_tokenizer_load(&tok, path, &e) == 0, "%s", e.msg);
        if (!tok) break;
        int32_t shift = k == 0 ? 0 : sizes[k] - 128847; /* the table ends the small vocabulary */
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            int32_t id = ms_tokenizer_token_id(tok, want[i].tok);
            int32_t exp = want[i].id < 3 ? want[i].id : want[i].id + shift;
            CHECKF(id == exp, "vocab %d: %s is %d, want %d", sizes[k], want[i].tok, id, exp);
        }
        CHECK(ms_tokenizer_check_vocab(tok, sizes[k], &e) == 0);
        ms_serve_codec c;
        ms_serve_codec_from_tokenizer(&c, tok);
        const char *prompt =
            MS_CHAT_BOS MS_CHAT_USER "hi" MS_CHAT_ASSISTANT "<think>x</think>"
                                     "\n\n<" MS_CHAT_DSML "tool_calls>" MS_CHAT_EOS;
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(c.encode(c.ctx, prompt, strlen(prompt), 1, &ids, &n, &e) == 0);
        int hits = 0;
        for (size_t i = 0; i < n; i++)
            hits += ids[i] == c.token_id(c.ctx, MS_CHAT_DSML) ||
                    ids[i] == c.token_id(c.ctx, "<think>") ||
                    ids[i] == c.token_id(c.ctx, MS_CHAT_USER);
        CHECKF(hits == 3, "vocab %d: %d marker tokens", sizes[k], hits);
        ms_detok d;
        const char *delta;
        size_t kk;
        CHECK(ms_detok_init(&d, &c, 1, NULL, 0) == 0);
        CHECK(ms_detok_push(&d, c.token_id(c.ctx, MS_CHAT_DSML), &delta, &kk) == 0);
        CHECK(kk == strlen(MS_CHAT_DSML) && !memcmp(delta, MS_CHAT_DSML, kk));
        ms_detok_deinit(&d);
        free(ids);
        ms_tokenizer_free(tok);
    }
    char cfg[64];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    json_t *j = json_load_file(cfg, 0, NULL);
    CHECK(j && json_integer_value(json_object_get(j, "model_max_length")) == 1048576);
    json_decref(j);
    unlink(cfg);
    unlink(path);
    rmdir(dir);
}

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
    RUN(tool_calls_checked_both_formats);
    RUN(v4_encode_thinking_tools);
    RUN(v4_encode_thinking_modes);
    RUN(v4_encode_roles_and_results);
    RUN(v4_dsml_parse_streaming);
    RUN(v4_reasoning_then_dsml);
    RUN(detok_utf8_and_stops);
    RUN(codec_real_tokenizer);
    RUN(v4_tokenizer_specials);
    return TEST_REPORT();
}
