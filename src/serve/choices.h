/* choices.h — the n choices of one generation request (OpenAI's n): one
 * session (session.h) and one engine request per choice.  The first choice
 * is submitted alone; the others follow once it has its first token, so its
 * prompt is in the radix cache and they share its KV pages instead of
 * computing the prompt again (SGLang sends a prefix request first for the
 * same reason).  With a seed, choice i samples with seed + i.  Streams
 * interleave the choices' chunks (each with its index) and end with one usage
 * chunk and one [DONE]; a body lists every choice and sums the usage.  With
 * n = 1 it is the session itself, unchanged.
 * Owned by the connection thread that created it, like its sessions.
 */
#ifndef MS_SERVE_CHOICES_H
#define MS_SERVE_CHOICES_H

#include "serve/session.h"

typedef struct ms_choices {
    ms_session *s; /* [n] */
    int n, n_submitted;
    ms_serve_hub *hub; /* borrowed */
    int32_t max_queued;
    int tail_done; /* stream, n > 1: the closing chunks are queued */
    char *tail;    /* ... they are (malloc'ed) */
    size_t n_tail, tail_pos;
} ms_choices;

/* Builds api->n sessions (api is moved), one engine request each (rid: the
 * response id; dp_hint: X-Data-Parallel-Rank or -1).  Submits nothing. */
int ms_choices_init(ms_choices *c, ms_api_req *api, const int32_t *ids, int32_t n_ids,
                    const char *rid, int32_t dp_hint, ms_serve_hub *hub, ms_metrics *metrics,
                    const ms_serve_codec *codec, const char *model_name, ms_errbuf *e);
void ms_choices_deinit(ms_choices *c);
/* Submits the first choice (max_queued: --max-queued-requests); on error
 * every choice is marked finished (it never reached the engine). */
int ms_choices_submit(ms_choices *c, int32_t max_queued, ms_errbuf *e);
/* ms_session_step over the choices: 1 once all are finished (in stream mode
 * with everything queued), 0 otherwise, negative on error. */
int ms_choices_step(ms_choices *c, int timeout_ms);
int ms_choices_finished(const ms_choices *c);
int ms_choices_stream(const ms_choices *c);
/* Stream: pending bytes of any choice (or the closing chunks). */
int ms_choices_pending(const ms_choices *c);
size_t ms_choices_read(ms_choices *c, char *buf, size_t max);
/* Non-stream: the response body (malloc'ed) and HTTP status after finish. */
char *ms_choices_body(ms_choices *c, int *http_status, size_t *len);
/* Posts an abort for every choice in the engine (rid NULL: all requests, or
 * only when it is this response's id); returns 1 if it did. */
int ms_choices_abort(ms_choices *c, const char *rid);
/* The client went away: unfinished choices are aborted and counted so;
 * returns how many there were. */
int ms_choices_abandon(ms_choices *c);

#endif
