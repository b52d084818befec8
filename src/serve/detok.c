/* detok.c — incremental detokenization with stop strings (detok.h).
 * Owned by one connection thread at a time; no shared state. */
#include "serve/detok.h"

#include "base/util.h"

#include <stdlib.h>
#include <string.h>

size_t ms_utf8_complete_prefix(const char *s, size_t n)
{
    /* look back at most 3 bytes for the start of the last character */
    size_t i = n;
    for (size_t back = 0; back < 4 && i > 0; back++) {
        unsigned char c = (unsigned char)s[i - 1];
        if ((c & 0xC0) != 0x80) { /* a lead byte or ASCII */
            size_t need = c < 0x80             ? 1
                          : (c & 0xE0) == 0xC0 ? 2
                          : (c & 0xF0) == 0xE0 ? 3
                          : (c & 0xF8) == 0xF0 ? 4
                                               : 1;
            return (n - (i - 1) >= need) ? n : i - 1;
        }
        i--;
    }
    return n; /* only continuation bytes: invalid, let them through */
}

int ms_detok_init(ms_detok *d, const ms_serve_codec *codec, int skip_special, char *const *stops,
                  int n_stops)
{
    memset(d, 0, sizeof *d);
    d->codec = codec;
    d->skip_special = skip_special;
    d->stop_index = -1;
    d->cap = 256;
    d->text = malloc(d->cap);
    if (!d->text) return MS_ENOMEM;
    d->text[0] = 0;
    if (n_stops > MS_SERVE_MAX_STOPS) return MS_EINVAL;
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        d->stops[d->n_stops] = strdup(stops[i]);
        if (!d->stops[d->n_stops]) return MS_ENOMEM;
        d->n_stops++;
    }
    return 0;
}

void ms_detok_deinit(ms_detok *d)
{
    if (!d) return;
    free(d->text);
    for (int i = 0; i < d->n_stops; i++) free(d->stops[i]);
    memset(d, 0, sizeof *d);
}

static int append(ms_detok *d, const char *s, size_t n)
{
    size_t need;
    if (!ms_add_size(d->n_text, n + 1, &need)) return MS_ENOMEM;
    if (need > d->cap) {
        size_t cap = d->cap;
        while (cap < need) cap *= 2;
        char *t = realloc(d->text, cap);
        if (!t) return MS_ENOMEM;
        d->text = t;
        d->cap = cap;
    }
    memcpy(d->text + d->n_text, s, n);
    d->n_text += n;
    d->text[d->n_text] = 0;
    return 0;
}

/* Appends s[0..n) with every invalid UTF-8 sequence replaced by U+FFFD, so
 * all text handed out is valid UTF-8 (JSON needs it). */
static int append_clean(ms_detok *d, const char *s, size_t n)
{
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80             ? 1
                     : (c & 0xE0) == 0xC0 ? 2
                     : (c & 0xF0) == 0xE0 ? 3
                     : (c & 0xF8) == 0xF0 ? 4
                                          : 0;
        int ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
        if (ok && len == 2 && c < 0xC2) ok = 0; /* overlong */
        if (ok && len == 3) {
            unsigned cp = ((c & 0x0Fu) << 12) | (((unsigned char)s[i + 1] & 0x3Fu) << 6);
            if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) ok = 0; /* overlong, surrogate */
        }
        if (ok && len == 4) {
            unsigned cp = ((c & 0x07u) << 18) | (((unsigned char)s[i + 1] & 0x3Fu) << 12);
            if (cp < 0x10000 || cp > 0x10FFFF) ok = 0;
        }
        if (ok) {
            i += len;
            run += len;
            continue;
        }
        int rc = append(d, s + i - run, run);
        if (rc || (rc = append(d, "\xEF\xBF\xBD", 3))) return rc;
        run = 0;
        i++;
    }
    return append(d, s + n - run, run);
}

/* Longest suffix of s[0..n) that is a proper prefix of m. */
static size_t partial_suffix(const char *s, size_t n, const char *m)
{
    size_t lm = strlen(m);
    for (size_t k = lm - 1 < n ? lm - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

static int scan(ms_detok *d, const char **delta, size_t *n_delta)
{
    const char *base = d->text + d->emitted;
    size_t avail = d->n_text - d->emitted;
    size_t best = SIZE_MAX;
    int best_i = -1;
    for (int i = 0; i < d->n_stops; i++) {
        const char *hit = memmem(base, avail, d->stops[i], strlen(d->stops[i]));
        if (hit && (size_t)(hit - base) < best) {
            best = (size_t)(hit - base);
            best_i = i;
        }
    }
    if (best_i >= 0) {
        *delta = base;
        *n_delta = best;
        d->emitted += best;
        d->n_text = d->emitted; /* drop the stop string and anything after it */
        d->text[d->n_text] = 0;
        d->stopped = 1;
        d->stop_index = best_i;
        return 1;
    }
    size_t hold = 0;
    for (int i = 0; i < d->n_stops; i++) {
        size_t k = partial_suffix(base, avail, d->stops[i]);
        if (k > hold) hold = k;
    }
    *delta = base;
    *n_delta = avail - hold;
    d->emitted += avail - hold;
    return 0;
}

int ms_detok_push(ms_detok *d, int32_t id, const char **delta, size_t *n_delta)
{
    *delta = "";
    *n_delta = 0;
    if (d->stopped) return 1;
    if (d->skip_special && d->codec->is_special(d->codec->ctx, id)) return 0;
    char buf[MS_SERVE_MAX_TOKEN_BYTES + 8];
    size_t n = 0;
    memcpy(buf, d->partial, d->n_partial);
    int rc =
        d->codec->token_bytes(d->codec->ctx, id, buf + d->n_partial, MS_SERVE_MAX_TOKEN_BYTES, &n);
    if (rc) return rc;
    if (n > MS_SERVE_MAX_TOKEN_BYTES) n = MS_SERVE_MAX_TOKEN_BYTES;
    n += d->n_partial;
    size_t ok = ms_utf8_complete_prefix(buf, n);
    if (n - ok > sizeof d->partial) ok = n; /* cannot happen for valid lead bytes */
    d->n_partial = n - ok;
    memcpy(d->partial, buf + ok, d->n_partial);
    if ((rc = append_clean(d, buf, ok)) != 0) return rc;
    return scan(d, delta, n_delta);
}

void ms_detok_flush(ms_detok *d, const char **delta, size_t *n_delta)
{
    *delta = "";
    *n_delta = 0;
    if (d->stopped) return;
    if (d->n_partial) {
        d->n_partial = 0;
        if (append(d, "\xEF\xBF\xBD", 3)) return;
    }
    size_t start = d->emitted;
    if (scan(d, delta, n_delta) == 1) return;
    *delta = d->text + start;
    *n_delta = d->n_text - start;
    d->emitted = d->n_text;
}
