/* session.h — one generation request seen from its HTTP connection: reads the
 * engine's tokens from the request channel, detokenizes, applies stop strings
 * (posting an abort to the engine when one matches), splits reasoning and tool
 * calls (chat), and produces SSE frames or the final JSON body in the route's
 * format (chat, completions, SGLang /generate).
 * Owned by the connection thread that created it; no other thread touches it.
 */
#ifndef MS_SERVE_SESSION_H
#define MS_SERVE_SESSION_H

#include "serve/metrics.h"
#include "serve/openai.h"

typedef struct ms_session {
    ms_api_req api;      /* parsed request (owned) */
    ms_serve_req *req;   /* the engine request (one reference owned) */
    ms_serve_hub *hub;   /* borrowed */
    ms_metrics *metrics; /* borrowed, may be NULL */
    const ms_serve_codec *codec;
    ms_detok detok;
    ms_chat_parser chat;
    char id[MS_SERVE_RID_MAX];
    int64_t created;
    int oom; /* an output buffer could not grow */
    char model[MS_API_MAX_MODEL_NAME];
    int64_t n_prompt;
    size_t n_taken;    /* tokens read from the channel */
    size_t off_bytes;  /* bytes of detok.text counted into off_chars */
    int64_t off_chars; /* characters (code points) decoded before the next token */
    int finish;        /* enum ms_serve_finish once done, else 0 */
    int stop_string;   /* index of the matched stop string, -1 none */
    int sent_role, sent_final;
    int index;     /* the choice this session is (choices.h), in each chunk */
    int quiet_end; /* no usage chunk and [DONE] at the end: choices.c sends them once */
    double t_prev; /* time of the previous token batch (ITL) */
    /* accumulated output (non-stream bodies, /generate's cumulative text) */
    char *text;
    size_t n_text, cap_text;
    json_t *lp;          /* chat: [entries]; completions: {tokens,...}; generate: [[lp,id,null]] */
    json_t *out_ids;     /* /generate output_ids */
    int stream_interval; /* --stream-interval: tokens per SSE chunk after the first (1) */
    char *chunk;         /* text of the chunk being gathered */
    size_t n_chunk, cap_chunk;
    /* pending SSE bytes */
    char *out;
    size_t n_out, cap_out, out_pos;
} ms_session;

/* Takes ownership of api (moved; the caller's copy is zeroed) and one
 * reference of req. */
int ms_session_init(ms_session *s, ms_api_req *api, ms_serve_req *req, ms_serve_hub *hub,
                    ms_metrics *metrics, const ms_serve_codec *codec, const char *model_name,
                    int64_t n_prompt);
void ms_session_deinit(ms_session *s);

/* Waits up to timeout_ms for tokens and processes them; in stream mode appends
 * SSE frames to the pending buffer.  Returns 1 once the request is finished
 * (all frames incl. [DONE] queued), 0 otherwise, negative on error. */
int ms_session_step(ms_session *s, int timeout_ms);
/* The client went away before the finish: the request counts as aborted. */
void ms_session_abandon(ms_session *s);
/* Non-stream: the response body (malloc'ed) and HTTP status after finish. */
char *ms_session_body(ms_session *s, int *http_status, size_t *len);
/* Stream: copies up to max pending bytes into buf; returns the count. */
size_t ms_session_read(ms_session *s, char *buf, size_t max);
int ms_session_pending(const ms_session *s);

#endif
