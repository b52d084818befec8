/* codec.c — ms_serve_codec over model/tokenizer.h (the only serve file that
 * calls the tokenizer).  Thread-safe: the tokenizer is immutable after load. */
#include "serve/detok.h"

#include "model/tokenizer.h"

#include <stdlib.h>

static int enc(void *ctx, const char *text, size_t len, int parse_special, int32_t **ids,
               size_t *n_ids, ms_errbuf *e)
{
    const ms_tokenizer *tok = ctx;
    size_t cap = len + 16, n = 0;
    int32_t *buf = malloc(cap * sizeof *buf);
    if (!buf) return ms_err(e, MS_ENOMEM, "out of memory");
    int rc = ms_tokenizer_encode(tok, text, len, parse_special, buf, cap, &n, e);
    if (rc == 0 && n > cap) { /* byte-level BPE gives at most one id per byte; be safe */
        int32_t *b2 = realloc(buf, n * sizeof *buf);
        if (!b2) {
            free(buf);
            return ms_err(e, MS_ENOMEM, "out of memory");
        }
        buf = b2;
        rc = ms_tokenizer_encode(tok, text, len, parse_special, buf, n, &n, e);
    }
    if (rc) {
        free(buf);
        return rc;
    }
    *ids = buf;
    *n_ids = n;
    return 0;
}

static int tbytes(void *ctx, int32_t id, char *buf, size_t cap, size_t *n_out)
{
    return ms_tokenizer_token_bytes(ctx, id, buf, cap, n_out);
}

static int is_special(void *ctx, int32_t id)
{
    return ms_tokenizer_is_special(ctx, id);
}

static int32_t tid(void *ctx, const char *token)
{
    return ms_tokenizer_token_id(ctx, token);
}

void ms_serve_codec_from_tokenizer(ms_serve_codec *c, const struct ms_tokenizer *tok)
{
    c->ctx = (void *)tok;
    c->encode = enc;
    c->token_bytes = tbytes;
    c->is_special = is_special;
    c->token_id = tid;
    c->vocab_size = ms_tokenizer_vocab_size(tok);
}
