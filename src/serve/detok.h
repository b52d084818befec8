/* detok.h — text side of a request: the codec seam to the tokenizer and the
 * incremental detokenizer with stop strings.
 *
 * ms_serve_codec is a table of functions over a tokenizer; codec.c builds one
 * from model/tokenizer.h, tests build their own.  ms_detok turns token ids into
 * UTF-8 deltas: it holds back incomplete UTF-8 and any tail that may still
 * become a stop string, and reports the first stop string that matches.
 * One ms_detok belongs to one HTTP connection thread; codecs are immutable.
 */
#ifndef MS_SERVE_DETOK_H
#define MS_SERVE_DETOK_H

#include "base/error.h"

#include <stddef.h>
#include <stdint.h>

#define MS_SERVE_MAX_STOPS       16   /* stop strings per request */
#define MS_SERVE_MAX_STOP_BYTES  256  /* bytes per stop string */
#define MS_SERVE_MAX_TOKEN_BYTES 1024 /* bytes of one token's text */

typedef struct ms_serve_codec {
    void *ctx;
    /* Encodes text; *ids is malloc'ed (caller frees). */
    int (*encode)(void *ctx, const char *text, size_t len, int parse_special, int32_t **ids,
                  size_t *n_ids, ms_errbuf *e);
    int (*token_bytes)(void *ctx, int32_t id, char *buf, size_t cap, size_t *n_out);
    int (*is_special)(void *ctx, int32_t id);
    int32_t (*token_id)(void *ctx, const char *token);
    int32_t vocab_size;
} ms_serve_codec;

struct ms_tokenizer;
/* A codec over a loaded tokenizer (borrowed; must outlive the codec). */
void ms_serve_codec_from_tokenizer(ms_serve_codec *c, const struct ms_tokenizer *tok);

typedef struct ms_detok {
    const ms_serve_codec *codec;
    int skip_special;
    char *text; /* decoded UTF-8 so far (complete characters), NUL-terminated */
    size_t n_text, cap;
    size_t emitted;  /* bytes of text already handed out */
    char partial[8]; /* bytes of an incomplete UTF-8 character */
    size_t n_partial;
    char *stops[MS_SERVE_MAX_STOPS];
    int n_stops;
    int stopped;    /* a stop string matched; text after it is dropped */
    int stop_index; /* which one (-1 none) */
} ms_detok;

int ms_detok_init(ms_detok *d, const ms_serve_codec *codec, int skip_special, char *const *stops,
                  int n_stops);
void ms_detok_deinit(ms_detok *d);
/* Appends one token.  *delta and *n_delta receive the newly safe text (borrowed,
 * valid until the next call).  Returns 1 when a stop string matched (the delta
 * ends before it; later tokens are ignored), 0 otherwise, negative on error. */
int ms_detok_push(ms_detok *d, int32_t id, const char **delta, size_t *n_delta);
/* At the end of generation: releases everything held back (an incomplete
 * character becomes U+FFFD). */
void ms_detok_flush(ms_detok *d, const char **delta, size_t *n_delta);
/* Valid UTF-8 prefix length of s[0..n): stops before an incomplete final
 * character; invalid bytes count as complete (they are replaced later). */
size_t ms_utf8_complete_prefix(const char *s, size_t n);

#endif
