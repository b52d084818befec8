/* bench_sse.c — incremental Server-Sent-Events framing for the bench client: bytes split
 * anywhere in, one callback per event out.  Lines end in "\n", "\r\n" or "\r"; "data:" lines
 * (one optional space after the colon) are joined with '\n'; a blank line ends the event;
 * comments (":…") and other fields (event:, id:, retry:) are ignored.  Knows nothing about
 * JSON or [DONE].  One parser per stream, used by one thread.
 */
#include "tools/bench.h"

#include <stdlib.h>
#include <string.h>

void ms_bench_sse_init(ms_bench_sse *s, size_t max_bytes)
{
    memset(s, 0, sizeof *s);
    s->max_bytes = max_bytes;
}

void ms_bench_sse_deinit(ms_bench_sse *s)
{
    if (!s) return;
    free(s->line);
    free(s->data);
    s->line = s->data = NULL;
    s->n_line = s->cap_line = s->n_data = s->cap_data = 0;
}

/* Appends n bytes (+ a NUL kept after them) to a growable buffer bounded by max. */
static int grow_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n, size_t max)
{
    if (n > max || *len > max - n) return MS_ETOOBIG;
    size_t need = *len + n + 1;
    if (need > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < need) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return MS_ENOMEM;
        *buf = b;
        *cap = c;
    }
    if (n) memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

static int dispatch(ms_bench_sse *s, ms_bench_sse_cb cb, void *ctx)
{
    if (!s->has_data) return 0;
    s->has_data = false;
    size_t n = s->n_data;
    s->n_data = 0;
    return cb(ctx, s->data ? s->data : "", n);
}

/* One complete line (without its terminator). */
static int on_line(ms_bench_sse *s, const char *l, size_t n, ms_bench_sse_cb cb, void *ctx,
                   ms_errbuf *err)
{
    if (n == 0) return dispatch(s, cb, ctx);
    if (l[0] == ':') return 0;
    const char *colon = memchr(l, ':', n);
    size_t name_len = colon ? (size_t)(colon - l) : n;
    if (name_len != 4 || memcmp(l, "data", 4)) return 0;
    const char *v = colon ? colon + 1 : l + n;
    size_t vn = (size_t)(l + n - v);
    if (vn && v[0] == ' ') v++, vn--;
    int rc = 0;
    if (s->has_data) rc = grow_append(&s->data, &s->n_data, &s->cap_data, "\n", 1, s->max_bytes);
    if (!rc) rc = grow_append(&s->data, &s->n_data, &s->cap_data, v, vn, s->max_bytes);
    if (rc == MS_ETOOBIG) return ms_err(err, rc, "SSE event longer than %zu bytes", s->max_bytes);
    if (rc) return ms_err(err, rc, "out of memory in the SSE parser");
    s->has_data = true;
    return 0;
}

int ms_bench_sse_feed(ms_bench_sse *s, const char *buf, size_t n, ms_bench_sse_cb cb, void *ctx,
                      ms_errbuf *err)
{
    size_t i = 0;
    while (i < n) {
        /* a "\r" ended the previous line: swallow the "\n" of a "\r\n" split across feeds */
        if (s->n_line == 1 && s->line[0] == '\r') {
            s->n_line = 0;
            if (buf[i] == '\n') {
                i++;
                continue;
            }
        }
        size_t j = i;
        while (j < n && buf[j] != '\n' && buf[j] != '\r') j++;
        if (j == n) { /* no terminator yet: keep the piece */
            int rc = grow_append(&s->line, &s->n_line, &s->cap_line, buf + i, n - i, s->max_bytes);
            if (rc == MS_ETOOBIG)
                return ms_err(err, rc, "SSE line longer than %zu bytes", s->max_bytes);
            if (rc) return ms_err(err, rc, "out of memory in the SSE parser");
            return 0;
        }
        int rc;
        if (s->n_line) {
            rc = grow_append(&s->line, &s->n_line, &s->cap_line, buf + i, j - i, s->max_bytes);
            if (rc == MS_ETOOBIG)
                return ms_err(err, rc, "SSE line longer than %zu bytes", s->max_bytes);
            if (rc) return ms_err(err, rc, "out of memory in the SSE parser");
            size_t ln = s->n_line;
            s->n_line = 0; /* the buffer stays valid until the next append */
            rc = on_line(s, s->line, ln, cb, ctx, err);
        } else {
            rc = on_line(s, buf + i, j - i, cb, ctx, err);
        }
        if (rc) return rc;
        if (buf[j] == '\r') {
            if (j + 1 < n) {
                j += buf[j + 1] == '\n' ? 2 : 1;
            } else { /* remember the '\r' in case the '\n' comes in the next feed */
                rc = grow_append(&s->line, &s->n_line, &s->cap_line, "\r", 1, s->max_bytes);
                if (rc) return ms_err(err, rc, "out of memory in the SSE parser");
                return 0;
            }
        } else {
            j++;
        }
        i = j;
    }
    return 0;
}

int ms_bench_sse_finish(ms_bench_sse *s, ms_bench_sse_cb cb, void *ctx, ms_errbuf *err)
{
    int rc = 0;
    if (s->n_line && !(s->n_line == 1 && s->line[0] == '\r')) {
        size_t n = s->n_line;
        s->n_line = 0;
        rc = on_line(s, s->line, n, cb, ctx, err);
    }
    s->n_line = 0;
    if (!rc) rc = dispatch(s, cb, ctx);
    return rc;
}
