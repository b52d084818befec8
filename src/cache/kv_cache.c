/* kv_cache.c — the KV cache of streams (kv_cache.h): one ms_kv_pool per
 * stream (its layers are the stream's covered layers), per-sequence page
 * tables grown by entry page, window slides, prefix sharing by reference,
 * and the state slots.  Single owner (the scheduler); main thread.
 */
#include "cache/kv_cache.h"

#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ms_kv_cache {
    ms_kv_spec spec;
    int page_size, n_streams;
    ms_kv_pool *pools[MS_KV_MAX_STREAMS];   /* NULL: a stream covering no layer */
    int16_t *layer_slot[MS_KV_MAX_STREAMS]; /* [spec.n_layers]: pool layer, -1 none */
    size_t state_bytes;                     /* one slot */
    uint8_t *state;                         /* [n_state][state_bytes] */
    int32_t *state_free, n_state, n_state_free;
};

void ms_kv_seq_init(ms_kv_seq *s)
{
    memset(s, 0, sizeof *s);
    s->state_slot = -1;
}

void ms_kv_seq_deinit(ms_kv_seq *s)
{
    for (int i = 0; i < MS_KV_MAX_STREAMS; i++) free(s->pages[i]);
    ms_kv_seq_init(s);
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Entries one page of a stream holds (page_entries, else the page size). */
static int page_entries(const ms_kv_stream *st, int page_size)
{
    return st->page_entries > 0 ? st->page_entries : page_size;
}
static int pe_of(const ms_kv_cache *c, int s)
{
    return page_entries(&c->spec.streams[s], c->page_size);
}

/* Tokens a windowed stream must keep behind the newest one. */
static int64_t keep_tokens(const ms_kv_stream *st)
{
    return st->window + st->window_slack;
}

/* Pages one sequence's window keeps in stream st (one partial page at each end),
 * twice without snapshots: the running window and the one kept at its last share
 * unit (a prefix hit there needs it; ms_kv_cache_slide). */
static int64_t window_pages(const ms_kv_spec *spec, const ms_kv_stream *st, int64_t span)
{
    return (spec->state_snapshots ? 1 : 2) * (ceil_div(keep_tokens(st), span) + 2);
}

void ms_kv_cache_pages_for(const ms_kv_spec *spec, int page_size, int64_t tokens, int max_seqs,
                           int64_t step_tokens, int64_t window_tokens, int32_t *pages)
{
    for (int s = 0; s < spec->n_streams; s++) {
        const ms_kv_stream *st = &spec->streams[s];
        int64_t span = (int64_t)page_entries(st, page_size) * st->tokens_per_entry, n;
        if (st->window > 0) { /* each sequence's window (+ a page each side), and the step's
                               * new tokens, which the sequences share */
            int64_t one = window_pages(spec, st, span) + ceil_div(step_tokens, span);
            n = window_tokens > 0 ? MS_MAX(ceil_div(window_tokens, span), one)
                                  : (int64_t)max_seqs * window_pages(spec, st, span) +
                                        ceil_div(step_tokens, span);
        } else if (st->tokens_per_entry > 1) { /* compressed: the tokens' entries, rounded up */
            n = ceil_div(tokens, span);
        } else {
            n = tokens / span;
        }
        pages[s] = (int32_t)MS_MIN(MS_MAX(n, 1), (int64_t)INT32_MAX - 1);
    }
}

double ms_kv_cache_pages_bytes(const ms_kv_spec *spec, int page_size, const int32_t *pages,
                               int window_only)
{
    double b = 0;
    for (int s = 0; s < spec->n_streams; s++) {
        const ms_kv_stream *st = &spec->streams[s];
        if (st->n_layers == 0 || (window_only && st->window <= 0)) continue;
        b += (double)pages[s] * page_entries(st, page_size) * st->entry_bytes * st->n_layers;
    }
    return b;
}

int ms_kv_cache_new(ms_kv_cache **out, const ms_kv_spec *spec, int page_size, const int32_t *pages,
                    ms_dtype dt, int n_state_slots, ms_errbuf *err)
{
    *out = NULL;
    if (page_size <= 0 || spec->n_streams <= 0 || spec->n_streams > MS_KV_MAX_STREAMS)
        return ms_err(err, MS_EINVAL, "kv cache: %d streams, page size %d", spec->n_streams,
                      page_size);
    ms_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return ms_err(err, MS_ENOMEM, "kv cache: out of memory");
    c->spec = *spec;
    c->page_size = page_size;
    c->n_streams = spec->n_streams;
    int rc = 0;
    for (int s = 0; s < c->n_streams; s++) {
        const ms_kv_stream *st = &spec->streams[s];
        c->layer_slot[s] = malloc(sizeof(int16_t) * (size_t)MS_MAX(spec->n_layers, 1));
        if (!c->layer_slot[s]) goto oom;
        int n = 0;
        for (int l = 0; l < spec->n_layers; l++)
            c->layer_slot[s][l] = ms_kv_stream_covers(st, l) ? (int16_t)n++ : -1;
        if (n == 0) continue;
        /* packed streams keep their bytes; under an FP8 cache each stream keeps the
         * dtype its spec gives (V3's latent e4m3, V4's plain index keys BF16/F32) */
        ms_dtype sdt = st->dtype == MS_DT_U8 || dt == MS_DT_F8E4M3 ? st->dtype : dt;
        if ((rc = ms_kv_pool_new(&c->pools[s], n, st->entry_elems, page_entries(st, page_size),
                                 pages[s], sdt, err)))
            goto fail;
    }
    double sb = ms_kv_spec_state_bytes(spec, 0, spec->n_layers);
    if (sb > 0 && n_state_slots > 0) {
        c->state_bytes = (size_t)sb;
        c->state = calloc((size_t)n_state_slots, c->state_bytes);
        c->state_free = malloc(sizeof(int32_t) * (size_t)n_state_slots);
        if (!c->state || !c->state_free) goto oom;
        for (int32_t i = 0; i < n_state_slots; i++) c->state_free[i] = n_state_slots - 1 - i;
        c->n_state = c->n_state_free = n_state_slots;
    }
    *out = c;
    return 0;
oom:
    rc = ms_err(err, MS_ENOMEM, "kv cache: out of memory");
fail:
    ms_kv_cache_free(c);
    return rc;
}

void ms_kv_cache_free(ms_kv_cache *c)
{
    if (!c) return;
    for (int s = 0; s < MS_KV_MAX_STREAMS; s++) {
        ms_kv_pool_free(c->pools[s]);
        free(c->layer_slot[s]);
    }
    free(c->state);
    free(c->state_free);
    free(c);
}

const ms_kv_spec *ms_kv_cache_spec(const ms_kv_cache *c)
{
    return &c->spec;
}
int ms_kv_cache_n_streams(const ms_kv_cache *c)
{
    return c->n_streams;
}
int ms_kv_cache_page_size(const ms_kv_cache *c)
{
    return c->page_size;
}
ms_kv_pool *ms_kv_cache_pool(const ms_kv_cache *c, int stream)
{
    return c->pools[stream];
}

int32_t ms_kv_cache_n_free(const ms_kv_cache *c, int stream)
{
    return c->pools[stream] ? ms_kv_pool_n_free(c->pools[stream]) : 0;
}

int32_t ms_kv_cache_n_pages(const ms_kv_cache *c, int stream)
{
    return c->pools[stream] ? c->pools[stream]->n_pages : 0;
}

int64_t ms_kv_cache_tokens(const ms_kv_cache *c)
{
    int64_t t = INT64_MAX;
    for (int s = 0; s < c->n_streams; s++) {
        const ms_kv_stream *st = &c->spec.streams[s];
        if (!c->pools[s] || st->window > 0) continue;
        t = MS_MIN(t, (int64_t)c->pools[s]->n_pages * pe_of(c, s) * st->tokens_per_entry);
    }
    return t == INT64_MAX ? 0 : t;
}

/* Entry pages stream s needs for tokens [0, upto): an entry exists once its
 * tokens_per_entry tokens are all in. */
static int64_t pages_upto(const ms_kv_cache *c, int s, int64_t upto)
{
    return ceil_div(upto / c->spec.streams[s].tokens_per_entry, pe_of(c, s));
}

int64_t ms_kv_cache_free_tokens(const ms_kv_cache *c)
{
    int64_t t = INT64_MAX;
    for (int s = 0; s < c->n_streams; s++) {
        const ms_kv_stream *st = &c->spec.streams[s];
        if (!c->pools[s] || st->window > 0) continue;
        t = MS_MIN(t, (int64_t)ms_kv_pool_n_free(c->pools[s]) * pe_of(c, s) * st->tokens_per_entry);
    }
    return t == INT64_MAX ? 0 : t;
}

int ms_kv_cache_seq_capacity(const ms_kv_cache *c, ms_kv_seq *seq, int64_t upto)
{
    for (int s = 0; s < c->n_streams; s++) {
        void *p = seq->pages[s];
        int rc = ms_grow_array(&p, &seq->cap_pages[s], MS_MAX(pages_upto(c, s, upto), 1),
                               sizeof(int32_t));
        seq->pages[s] = p;
        if (rc) return MS_ENOMEM;
    }
    return 0;
}

/* Pages each stream needs for [0, upto), windowed streams only for [0, win_upto). */
static int64_t needed(const ms_kv_cache *c, const ms_kv_seq *seq, int64_t upto, int64_t win_upto,
                      int64_t *need)
{
    int64_t sum = 0;
    for (int s = 0; s < c->n_streams; s++) {
        int64_t u = c->spec.streams[s].window > 0 ? win_upto : upto;
        int64_t n = c->pools[s] ? MS_MAX(pages_upto(c, s, u) - seq->n_pages[s], 0) : 0;
        if (need) need[s] = n;
        sum += n;
    }
    return sum;
}

int64_t ms_kv_cache_pages_needed(const ms_kv_cache *c, const ms_kv_seq *seq, int64_t upto,
                                 int64_t *need)
{
    return needed(c, seq, upto, upto, need);
}

int ms_kv_cache_fits(const ms_kv_cache *c, const int64_t *need)
{
    for (int s = 0; s < c->n_streams; s++)
        if (need[s] > ms_kv_cache_n_free(c, s)) return 0;
    return 1;
}

int ms_kv_cache_reserve(ms_kv_cache *c, ms_kv_seq *seq, int64_t upto)
{
    return ms_kv_cache_reserve_prompt(c, seq, upto, upto);
}

int ms_kv_cache_reserve_prompt(ms_kv_cache *c, ms_kv_seq *seq, int64_t upto, int64_t win_upto)
{
    int64_t need[MS_KV_MAX_STREAMS];
    needed(c, seq, upto, MS_MIN(win_upto, upto), need);
    int want_state = c->n_state > 0 && seq->state_slot < 0;
    if (!ms_kv_cache_fits(c, need) || (want_state && c->n_state_free == 0)) return MS_EFULL;
    for (int s = 0; s < c->n_streams; s++) {
        void *p = seq->pages[s];
        int rc = ms_grow_array(&p, &seq->cap_pages[s], seq->n_pages[s] + need[s], sizeof(int32_t));
        seq->pages[s] = p;
        if (rc) return MS_ENOMEM; /* nothing taken yet */
    }
    for (int s = 0; s < c->n_streams; s++) {
        if (need[s] == 0) continue;
        (void)ms_kv_pool_alloc(c->pools[s], (int32_t)need[s], seq->pages[s] + seq->n_pages[s]);
        seq->n_pages[s] += need[s];
    }
    if (want_state) {
        seq->state_slot = c->state_free[--c->n_state_free];
        memset(c->state + (size_t)seq->state_slot * c->state_bytes, 0, c->state_bytes);
    }
    if (upto > seq->n_tokens) seq->n_tokens = upto;
    return 0;
}

void ms_kv_cache_release(ms_kv_cache *c, ms_kv_seq *seq)
{
    for (int s = 0; s < c->n_streams; s++) {
        for (int64_t i = seq->first_live[s]; i < seq->n_pages[s]; i++)
            if (seq->pages[s][i] >= 0) ms_kv_pool_unref(c->pools[s], seq->pages[s][i]);
        seq->n_pages[s] = seq->first_live[s] = 0;
    }
    if (seq->state_slot >= 0) c->state_free[c->n_state_free++] = seq->state_slot;
    seq->state_slot = -1;
    seq->n_tokens = 0;
}

/* The first entry page a windowed stream still needs after n tokens. */
static int64_t first_needed(const ms_kv_cache *c, int s, int64_t n)
{
    const ms_kv_stream *st = &c->spec.streams[s];
    int64_t from = MS_MAX(n - keep_tokens(st), 0) / st->tokens_per_entry;
    return from / pe_of(c, s);
}

int64_t ms_kv_cache_slide(ms_kv_cache *c, ms_kv_seq *seq, int64_t n_done)
{
    int64_t freed = 0, unit = ms_kv_cache_share_unit(c);
    /* the last share unit: its window is kept, unless the model snapshots it */
    int64_t P = c->spec.state_snapshots ? 0 : n_done / unit * unit;
    for (int s = 0; s < c->n_streams; s++) {
        if (!c->pools[s] || c->spec.streams[s].window <= 0) continue;
        int64_t upto = MS_MIN(first_needed(c, s, n_done), seq->n_pages[s]);
        int64_t kf = upto, kt = upto; /* pages kept for a prefix hit at P */
        if (P > 0) kf = first_needed(c, s, P), kt = MS_MIN(pages_upto(c, s, P), upto);
        for (int64_t i = seq->first_live[s]; i < upto; i++) {
            if (i >= kf && i < kt) continue;
            if (seq->pages[s][i] >= 0) ms_kv_pool_unref(c->pools[s], seq->pages[s][i]), freed++;
            seq->pages[s][i] = -1;
        }
        int64_t first = kf < kt ? kf : upto;
        if (first > seq->first_live[s]) seq->first_live[s] = first;
    }
    return freed;
}

int64_t ms_kv_cache_truncate(ms_kv_cache *c, ms_kv_seq *seq, int64_t upto)
{
    int64_t freed = 0;
    if (upto >= seq->n_tokens) return 0;
    for (int s = 0; s < c->n_streams; s++) {
        if (!c->pools[s]) continue;
        int64_t keep = MS_MAX(pages_upto(c, s, upto), seq->first_live[s]);
        for (int64_t i = keep; i < seq->n_pages[s]; i++)
            if (seq->pages[s][i] >= 0) ms_kv_pool_unref(c->pools[s], seq->pages[s][i]), freed++;
        if (keep < seq->n_pages[s]) seq->n_pages[s] = keep;
    }
    seq->n_tokens = upto;
    return freed;
}

int64_t ms_kv_cache_share_unit(const ms_kv_cache *c)
{
    int64_t u = c->page_size;
    for (int s = 0; s < c->n_streams; s++)
        if (c->pools[s]) u = MS_MAX(u, (int64_t)pe_of(c, s) * c->spec.streams[s].tokens_per_entry);
    return u; /* the tokens_per_entry values (1, 4, 128) divide one another */
}

int ms_kv_cache_share(ms_kv_cache *c, ms_kv_seq *dst, const ms_kv_seq *src, int64_t n_tokens)
{
    if (n_tokens % ms_kv_cache_share_unit(c) || n_tokens > src->n_tokens) return MS_EINVAL;
    int64_t from[MS_KV_MAX_STREAMS], to[MS_KV_MAX_STREAMS];
    for (int s = 0; s < c->n_streams; s++) {
        int win = c->pools[s] && c->spec.streams[s].window > 0;
        to[s] = c->pools[s] ? pages_upto(c, s, n_tokens) : 0;
        from[s] = win ? first_needed(c, s, n_tokens) : 0;
        /* snapshots: the window's pages are dst's own, reserved next and filled
         * by the forward from the snapshot at n_tokens */
        if (win && c->spec.state_snapshots)
            to[s] = from[s];
        else if (from[s] < src->first_live[s] || to[s] > src->n_pages[s])
            return MS_EINVAL;
        void *p = dst->pages[s];
        int rc = ms_grow_array(&p, &dst->cap_pages[s], to[s], sizeof(int32_t));
        dst->pages[s] = p;
        if (rc) return MS_ENOMEM;
    }
    for (int s = 0; s < c->n_streams; s++) {
        for (int64_t i = 0; i < to[s]; i++) {
            dst->pages[s][i] = i < from[s] ? -1 : src->pages[s][i];
            if (dst->pages[s][i] >= 0) ms_kv_pool_ref(c->pools[s], dst->pages[s][i]);
        }
        dst->n_pages[s] = to[s];
        dst->first_live[s] = from[s];
    }
    dst->n_tokens = n_tokens;
    return 0;
}

void *ms_kv_view_entry(const ms_kv_view *v, int stream, int layer, int64_t pos)
{
    const ms_kv_cache *c = v->cache;
    if (stream < 0 || stream >= c->n_streams || layer < 0 || layer >= c->spec.n_layers) return NULL;
    int slot = c->layer_slot[stream][layer];
    if (slot < 0) return NULL;
    int pe = pe_of(c, stream);
    int64_t e = pos / c->spec.streams[stream].tokens_per_entry, pg = e / pe;
    if (pg < v->seq->first_live[stream] || pg >= v->seq->n_pages[stream] ||
        v->seq->pages[stream][pg] < 0)
        return NULL;
    return ms_kv_pool_row(c->pools[stream], slot, v->seq->pages[stream][pg], (int)(e % pe));
}

int64_t ms_kv_view_entry_elems(const ms_kv_view *v, int stream)
{
    return v->cache->spec.streams[stream].entry_elems;
}

ms_dtype ms_kv_view_dtype(const ms_kv_view *v, int stream)
{
    return v->cache->pools[stream] ? v->cache->pools[stream]->dtype : MS_DT_F32;
}

int ms_kv_view_page_size(const ms_kv_view *v)
{
    return v->cache->page_size;
}

void *ms_kv_view_state(const ms_kv_view *v)
{
    const ms_kv_cache *c = v->cache;
    if (!c->state || v->seq->state_slot < 0) return NULL;
    return c->state + (size_t)v->seq->state_slot * c->state_bytes;
}

size_t ms_kv_view_state_bytes(const ms_kv_view *v)
{
    return v->cache->state_bytes;
}

int ms_kv_cache_pool_info(const ms_kv_cache *c, ms_kv_pool_info *out)
{
    int n = 0;
    for (int s = 0; s < c->n_streams; s++) {
        const ms_kv_stream *st = &c->spec.streams[s];
        if (!c->pools[s]) continue;
        ms_kv_pool_info *o = &out[n++];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", st->name);
        o->pages = c->pools[s]->n_pages;
        o->page_tokens = (int64_t)pe_of(c, s) * st->tokens_per_entry;
        o->tokens = (int64_t)o->pages * o->page_tokens;
        o->window = st->window;
        o->n_layers = st->n_layers;
        o->entry_bytes = st->entry_bytes;
        o->bytes = (double)o->pages * pe_of(c, s) * st->entry_bytes * st->n_layers;
    }
    return n;
}

double ms_kv_cache_concurrency(const ms_kv_cache *c, int64_t n_tokens)
{
    double x = c->n_state > 0 ? (double)c->n_state : 1e300;
    if (n_tokens <= 0) return 0;
    for (int s = 0; s < c->n_streams; s++) {
        const ms_kv_stream *st = &c->spec.streams[s];
        if (!c->pools[s]) continue;
        int64_t span = (int64_t)pe_of(c, s) * st->tokens_per_entry;
        int64_t need = st->window > 0
                           ? MS_MIN(window_pages(&c->spec, st, span), ceil_div(n_tokens, span))
                           : pages_upto(c, s, n_tokens);
        if (need > 0) x = MS_MIN(x, (double)c->pools[s]->n_pages / (double)need);
    }
    return x;
}
