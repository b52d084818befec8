/* chat_priv.h — what the chat files (chat.c, chat_v4.c, chat_dsml.c) share and
 * nothing else sees: a growing string buffer, message content as text, and the
 * output parser's emit/marker helpers.  Any thread (no shared state).
 */
#ifndef MS_SERVE_CHAT_PRIV_H
#define MS_SERVE_CHAT_PRIV_H

#include "serve/chat.h"

#include "base/util.h"

#include <stdlib.h>
#include <string.h>

struct sb {
    char *s;
    size_t n, cap;
    int oom;
};

static inline void sb_addn(struct sb *b, const char *s, size_t n)
{
    if (b->oom || !n) return;
    size_t need;
    if (!ms_add_size(b->n, n + 1, &need)) {
        b->oom = 1;
        return;
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap *= 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static inline void sb_add(struct sb *b, const char *s)
{
    sb_addn(b, s, strlen(s));
}

/* Text of messages[idx].content: a string, null (""), or [{type:"text", text}]. */
int ms_chat_content_text(const json_t *c, size_t idx, struct sb *out, ms_errbuf *e);

/* messages[idx].tool_calls is an array whose every function.name is a string
 * (what both formats' renderers then read without looking again), else MS_EINVAL. */
int ms_chat_check_calls(const json_t *calls, size_t idx, ms_errbuf *e);

/* ---- parser helpers (chat.c) ---- */
/* Appends text to the delta and to the totals (reasoning or content). */
void ms_chat_emit_text(ms_chat_parser *p, ms_chat_delta *d, int reasoning, const char *s, size_t n);
/* Starts call number p->n_calls named name[0..n_name) with arguments args
 * (NUL-terminated, may be ""): one delta entry {index, id, type, function}. */
void ms_chat_emit_call(ms_chat_parser *p, ms_chat_delta *d, const char *name, size_t n_name,
                       const char *args);
/* The earliest of nm markers in s[0..n): its index (at = offset) or -1. */
int ms_chat_find_first(const char *s, size_t n, const char *const *ms, int nm, size_t *at);
/* Bytes at the end of s[0..n) that may begin one of the markers. */
size_t ms_chat_hold_len(const char *s, size_t n, const char *const *ms, int nm);

/* chat_dsml.c: one step of the DSML state machine over s[0..n) (the parser is
 * past any reasoning); returns the bytes consumed, and sets *more when the
 * machine can step again on the rest. */
size_t ms_chat_dsml_step(ms_chat_parser *p, const char *s, size_t n, int last, ms_chat_delta *d,
                         int *more);

#endif
