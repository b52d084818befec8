/* openai.h — the request/response formats of the HTTP API: parses and
 * validates /v1/chat/completions, /v1/completions and /generate bodies into an
 * ms_api_req (prompt text or ids + sampling params), checks the context
 * length, and builds response objects, stream chunks and error bodies.
 * No I/O, no engine: pure functions, any thread.
 */
#ifndef MS_SERVE_OPENAI_H
#define MS_SERVE_OPENAI_H

#include "serve/chat.h"
#include "serve/detok.h"
#include "serve/request.h"

#include <jansson.h>

#define MS_API_MAX_MODEL_NAME 256 /* bytes of "model" echoed back */
#define MS_API_MAX_N          16  /* choices per request ("n") */

enum ms_api_kind { MS_API_CHAT = 1, MS_API_COMPLETION, MS_API_GENERATE };
enum ms_tool_parser {
    MS_TOOL_PARSER_NONE = 0,
    MS_TOOL_PARSER_DEEPSEEK_V31,
    MS_TOOL_PARSER_DEEPSEEK_V4
};

typedef struct ms_api_config {
    int64_t context_len;
    int32_t vocab_size;
    int reasoning_parser; /* enum ms_reasoning_mode */
    int tool_parser;      /* enum ms_tool_parser */
    int chat_format;      /* enum ms_chat_format: the model family's (ms_api_chat_format) */
} ms_api_config;

/* The chat format of a model family (ms_family name, e.g. "deepseek_v4"); the
 * deepseekv4 tool-call parser selects V4's format too, as SGLang's does. */
int ms_api_chat_format(const char *family, int tool_parser);

typedef struct ms_api_req {
    enum ms_api_kind kind;
    char *text; /* prompt text to encode (chat: rendered template), or NULL */
    size_t n_text;
    int parse_special; /* special-token strings in text are tokens (chat) */
    int32_t *ids;      /* given input ids (completions/generate), or NULL */
    size_t n_ids;
    ms_req_params params; /* sampling, stops, limits; ids/id/dp_rank unset here */
    int max_tokens_given;
    int seed_given; /* 'seed' was in the request (else params.seed is random) */
    char *stops[MS_SERVE_MAX_STOPS];
    int n_stops;
    int stream, include_usage, continuous_usage;
    int logprobs, top_logprobs;
    char model[MS_API_MAX_MODEL_NAME];
    char rid[MS_SERVE_RID_MAX];
    int separate_reasoning, starts_in_reasoning;
    int parse_tools; /* enum ms_tool_syntax */
    int skip_special_tokens;
    int no_stop_trim; /* /generate: keep the matched stop string */
    int n;            /* choices (OpenAI routes; 1..MS_API_MAX_N; choices.h) */
} ms_api_req;

/* Parses a request body.  On error returns MS_EINVAL/MS_EFORMAT/MS_EUNSUPPORTED
 * with the reason in e and the offending field in param (static string, may be
 * NULL).  r must be deinit'ed either way. */
int ms_api_parse(ms_api_req *r, enum ms_api_kind kind, const char *body, size_t len,
                 const ms_api_config *cfg, ms_errbuf *e, const char **param);
void ms_api_req_deinit(ms_api_req *r);
/* Validates ids against the vocabulary and the context length, and fills the
 * default max_new_tokens (SGLang's rules and messages). */
int ms_api_check_input(ms_api_req *r, const int32_t *ids, size_t n_ids, const ms_api_config *cfg,
                       ms_errbuf *e);

/* {"error": {"message", "type", "param", "code"}} as a malloc'ed string. */
char *ms_api_error_body(int http_status, const char *message, const char *param);

const char *ms_api_finish_str(int finish_kind, int has_tool_calls);

/* Usage object; cached tokens go into prompt_tokens_details. */
json_t *ms_api_usage(int64_t prompt, int64_t completion, int64_t cached);

/* One token as a logprob entry: chat format {token, logprob, bytes, top_logprobs}. */
json_t *ms_api_chat_logprob(const ms_serve_codec *c, const ms_serve_tok *t, int with_top);

/* Chunk / response envelopes; json arguments are stolen (may be NULL). */
json_t *ms_api_chat_chunk(const char *id, int64_t created, const char *model, json_t *delta,
                          const char *finish, json_t *logprobs);
json_t *ms_api_completion_chunk(const char *id, int64_t created, const char *model,
                                const char *text, size_t n_text, const char *finish,
                                json_t *logprobs);

/* Dumps compactly into a malloc'ed "data: {...}\n\n" frame (NULL on failure). */
char *ms_api_sse_frame(const json_t *obj, size_t *len);

#endif
