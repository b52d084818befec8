/* chat.h — the DeepSeek-V3 / V3.1 chat format in C: prompt rendering from
 * OpenAI messages (system, user, assistant with tool_calls, tool results,
 * tool definitions, thinking) and the streaming output parser that splits
 * generated text into reasoning_content, content and tool_calls.
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

typedef struct ms_chat_opts {
    int thinking;              /* -1 not given (V3 style), 0 append </think>, 1 append <think> */
    int add_generation_prompt; /* default 1 */
} ms_chat_opts;

/* Renders messages (+ optional tools array, may be NULL) into *out (malloc'ed,
 * NUL-terminated).  Validation errors name the field in e (MS_EINVAL). */
int ms_chat_render(const json_t *messages, const json_t *tools, const ms_chat_opts *o, char **out,
                   size_t *out_len, ms_errbuf *e);

/* ---- output parser ---- */

enum ms_reasoning_mode { MS_REASONING_OFF = 0, MS_REASONING_DEEPSEEK_R1, MS_REASONING_DEEPSEEK_V3 };

typedef struct ms_chat_parser {
    int in_reasoning; /* text is reasoning until </think> */
    int tools;        /* parse tool-call markup */
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
} ms_chat_parser;

/* reasoning: whether to separate reasoning and whether the model starts inside
 * it (R1: always; V3.1: when thinking was requested).  tools: parse tool calls. */
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
