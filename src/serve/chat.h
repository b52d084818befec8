/* chat.h — the DeepSeek chat formats in C: prompt rendering from OpenAI
 * messages (system, user, assistant with tool_calls, tool results, tool
 * definitions, thinking) in DeepSeek-V3/V3.1's format (chat.c) or
 * DeepSeek-V4's (chat_v4.c), and the streaming output parser that splits
 * generated text into reasoning_content, content and tool_calls (V3.1 tool
 * markers in chat.c, V4's DSML in chat_dsml.c).
 * Pure functions over jansson values; a parser state belongs to one thread.
 */
#ifndef MS_SERVE_CHAT_H
#define MS_SERVE_CHAT_H

#include "base/error.h"

#include <jansson.h>
#include <stddef.h>

#define MS_CHAT_MAX_MESSAGES   4096 /* messages per request */
#define MS_CHAT_MAX_TOOLS      128  /* tool definitions per request */
#define MS_CHAT_MAX_TOOL_NAME  256  /* bytes of a parsed tool-call name */
#define MS_CHAT_MAX_TOOL_CALLS 64   /* tool calls parsed from one completion */

/* The markers (UTF-8; the fullwidth bars and ▁ are part of the token text). */
#define MS_CHAT_BOS                                                                                \
    "<\xef\xbd\x9c"                                                                                \
    "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define MS_CHAT_EOS                                                                                \
    "<\xef\xbd\x9c"                                                                                \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define MS_CHAT_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define MS_CHAT_ASSISTANT                                                                          \
    "<\xef\xbd\x9c"                                                                                \
    "Assistant\xef\xbd\x9c>"
#define MS_CHAT_CALLS_BEGIN                                                                        \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "calls\xe2\x96\x81"                                                                            \
    "begin\xef\xbd\x9c>"
#define MS_CHAT_CALLS_END                                                                          \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "calls\xe2\x96\x81"                                                                            \
    "end\xef\xbd\x9c>"
#define MS_CHAT_CALL_BEGIN                                                                         \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "call\xe2\x96\x81"                                                                             \
    "begin\xef\xbd\x9c>"
#define MS_CHAT_CALL_END                                                                           \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "call\xe2\x96\x81"                                                                             \
    "end\xef\xbd\x9c>"
#define MS_CHAT_SEP "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"
#define MS_CHAT_OUTPUT_BEGIN                                                                       \
    "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"                                              \
    "begin\xef\xbd\x9c>"
#define MS_CHAT_OUTPUT_END                                                                         \
    "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"                                              \
    "end\xef\xbd\x9c>"
#define MS_CHAT_THINK     "<think>"
#define MS_CHAT_THINK_END "</think>"

/* DeepSeek-V4's markers: <｜latest_reminder｜> and the DSML tool-call grammar
 * (｜DSML｜ is one special token of the V4 tokenizer; the tags around it are text). */
#define MS_CHAT_LATEST_REMINDER "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"
#define MS_CHAT_DSML                                                                               \
    "\xef\xbd\x9c"                                                                                 \
    "DSML\xef\xbd\x9c"
#define MS_CHAT_DSML_CALLS      "<" MS_CHAT_DSML "tool_calls>"
#define MS_CHAT_DSML_CALLS_END  "</" MS_CHAT_DSML "tool_calls>"
#define MS_CHAT_DSML_INVOKE     "<" MS_CHAT_DSML "invoke"
#define MS_CHAT_DSML_INVOKE_END "</" MS_CHAT_DSML "invoke>"
#define MS_CHAT_DSML_PARAM      "<" MS_CHAT_DSML "parameter"
#define MS_CHAT_DSML_PARAM_END  "</" MS_CHAT_DSML "parameter>"

/* The prompt format, chosen from the model family (never from a flag alone). */
enum ms_chat_format { MS_CHAT_FMT_V3 = 0, MS_CHAT_FMT_V4 };
/* V4's reasoning effort: the prompt text each level adds (thinking mode only). */
enum ms_chat_effort { MS_CHAT_EFFORT_NONE = 0, MS_CHAT_EFFORT_HIGH, MS_CHAT_EFFORT_MAX };

typedef struct ms_chat_opts {
    int thinking;              /* -1 not given (V3 style), 0 append </think>, 1 append <think> */
    int add_generation_prompt; /* default 1 (V4: 1 sends a trailing assistant turn as a user's) */
    int format;                /* enum ms_chat_format */
    int effort;                /* enum ms_chat_effort (V4) */
} ms_chat_opts;

/* Renders messages (+ optional tools array, may be NULL) into *out (malloc'ed,
 * NUL-terminated) in o->format.  Validation errors name the field in e (MS_EINVAL). */
int ms_chat_render(const json_t *messages, const json_t *tools, const ms_chat_opts *o, char **out,
                   size_t *out_len, ms_errbuf *e);
/* DeepSeek-V4's encode_messages (chat_v4.c): thinking 1 = "thinking" mode,
 * anything else "chat" mode. */
int ms_chat_render_v4(const json_t *messages, const json_t *tools, const ms_chat_opts *o,
                      char **out, size_t *out_len, ms_errbuf *e);

/* ---- output parser ---- */

/* deepseek-v3 and deepseek-v4 behave alike: reasoning only when thinking was asked. */
enum ms_reasoning_mode {
    MS_REASONING_OFF = 0,
    MS_REASONING_DEEPSEEK_R1,
    MS_REASONING_DEEPSEEK_V3,
    MS_REASONING_DEEPSEEK_V4
};
/* The tool-call syntax the parser reads. */
enum ms_tool_syntax { MS_TOOLS_NONE = 0, MS_TOOLS_V31, MS_TOOLS_DSML };

typedef struct ms_chat_parser {
    int in_reasoning; /* text is reasoning until </think> */
    int tools;        /* enum ms_tool_syntax */
    int state;        /* tool-call state machine */
    char *hold;       /* text held back (a marker may be starting) */
    size_t n_hold, cap_hold;
    char name[MS_CHAT_MAX_TOOL_NAME + 1];
    size_t n_name;
    int n_calls; /* calls started */
    int saw_think_start;
    /* accumulated totals (non-stream responses) */
    json_t *all_calls; /* [{id, type, function{name, arguments}}] */
    char *reasoning, *content;
    size_t n_reasoning, n_content, cap_reasoning, cap_content;
    /* DSML: the invoke being read, whitespace held before a tool_calls block */
    char *inv;
    size_t n_inv, cap_inv, n_ws;
} ms_chat_parser;

/* reasoning: whether to separate reasoning and whether the model starts inside
 * it (R1: always; V3.1 and V4: when thinking was requested).  tools: the
 * tool-call syntax to parse (enum ms_tool_syntax). */
int ms_chat_parser_init(ms_chat_parser *p, int separate_reasoning, int starts_in_reasoning,
                        int tools);
void ms_chat_parser_deinit(ms_chat_parser *p);

/* The pieces of one delta; strings are malloc'ed or NULL; tool_calls is a new
 * reference to an array of OpenAI delta objects or NULL. */
typedef struct ms_chat_delta {
    char *reasoning, *content;
    json_t *tool_calls;
} ms_chat_delta;
void ms_chat_delta_clear(ms_chat_delta *d);

/* Feeds generated text; last != 0 flushes everything held back.  Fills d. */
int ms_chat_parser_feed(ms_chat_parser *p, const char *text, size_t n, int last, ms_chat_delta *d);

#endif
