/* tokenizer_encode.c — text to token ids: UTF-8 validation, added-token
 * split (leftmost-longest, non-normalized tokens first), the pre-tokenizer's
 * Split steps (PCRE2, each step applied to every piece of the previous one,
 * as Hugging Face tokenizers does), ByteLevel, and BPE merging by rank with a
 * pair hash table and a (rank, position) heap over a linked list of symbols.
 * Owns no state across calls: all scratch lives in a per-call `work`, so any
 * number of threads may encode with one tokenizer at once.
 */
#include "model/tokenizer_internal.h"

#include "base/util.h"

#include <stdlib.h>
#include <string.h>

typedef struct span {
    uint32_t s, e;
    bool match; /* used while splitting; also "is added token" in segments */
    int32_t id;
} span;

typedef struct spanvec {
    span *v;
    size_t n, cap;
} spanvec;

typedef struct sym {
    int32_t id, prev, next, len;
} sym;

typedef struct hent {
    int32_t rank, pos, new_id;
} hent;

/* Per-call word cache: word bytes -> ids, so repeated words skip BPE. */
typedef struct centry {
    uint64_t hash;
    uint32_t woff, ioff; /* into cbytes / cids */
    uint16_t wlen, ilen; /* wlen 0 = empty slot */
} centry;

#define CACHE_MAX_WORD    64        /* bytes; longer words are not cached */
#define CACHE_MAX_ENTRIES (1 << 16) /* per call */

typedef struct work {
    const ms_tokenizer *tok;
    ms_errbuf *err;
    spanvec a, b, m, c; /* pieces, next pieces, raw matches, ByteLevel sub-pieces */
    sym *syms;
    hent *heap;
    size_t cap_syms, cap_heap, n_heap;
    char *scratch, *scratch2;
    size_t cap_scratch, cap_scratch2;
    centry *cache;
    size_t cache_cap, cache_n;
    uint8_t *cbytes;
    int32_t *cids;
    size_t cap_cbytes, n_cbytes, cap_cids, n_cids;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jst;
    /* output */
    int32_t *ids;
    size_t cap, n;
} work;

static int sv_push(spanvec *sv, uint32_t s, uint32_t e, bool match, int32_t id)
{
    if (sv->n == sv->cap) {
        size_t cap = sv->cap ? sv->cap * 2 : 64;
        span *p = realloc(sv->v, cap * sizeof *p);
        if (!p) return MS_ENOMEM;
        sv->v = p;
        sv->cap = cap;
    }
    sv->v[sv->n++] = (span){s, e, match, id};
    return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64, bytes;
    while (c < need) c *= 2;
    if (!ms_mul_size(c, item, &bytes)) return MS_ENOMEM;
    void *q = realloc(*p, bytes);
    if (!q) return MS_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* ---- regex matching ------------------------------------------------------ */

static size_t utf8_char_len(uint8_t c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Next match of re in subj[0..len) at or after pos; returns 1 (match), 0 (none) or <0. */
static int re_next(work *w, const pcre2_code *re, const char *subj, size_t len, size_t pos,
                   size_t *ms, size_t *me)
{
    uint32_t opts = PCRE2_NO_UTF_CHECK;
    for (int attempt = 0;; attempt++) {
        int rc = pcre2_match(re, (PCRE2_SPTR)subj, len, pos, opts, w->md, w->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
            *ms = ov[0];
            *me = ov[1];
            return 1;
        }
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && attempt == 0) {
            if (!w->mctx) w->mctx = pcre2_match_context_create(NULL);
            if (!w->jst) w->jst = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            if (!w->mctx || !w->jst) return ms_err(w->err, MS_ENOMEM, "tokenizer: no JIT stack");
            pcre2_jit_stack_assign(w->mctx, NULL, w->jst);
            continue;
        }
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && attempt == 1) {
            opts |= PCRE2_NO_JIT;
            continue;
        }
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return ms_err(w->err, MS_EINTERNAL, "tokenizer: regex match failed: %s", (const char *)msg);
    }
}

/* All matches of re in subj, as alternating (range, is_match) spans covering
 * it, with offsets shifted by base.  Empty matches right after the previous
 * match are skipped, as the Oniguruma binding of the reference does. */
static int find_matches(work *w, const pcre2_code *re, const char *subj, size_t len, uint32_t base,
                        spanvec *out)
{
    out->n = 0;
    size_t prev = 0, pos = 0;
    bool have_last = false;
    size_t last_end = 0;
    while (pos <= len) {
        size_t s = 0, e = 0;
        int rc = re_next(w, re, subj, len, pos, &s, &e);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (s == e && have_last && last_end == e) {
            if (pos >= len) break;
            pos += utf8_char_len((uint8_t)subj[pos]);
            continue;
        }
        pos = e;
        have_last = true;
        last_end = e;
        if (prev != s && (rc = sv_push(out, base + (uint32_t)prev, base + (uint32_t)s, false, -1)))
            return rc;
        if ((rc = sv_push(out, base + (uint32_t)s, base + (uint32_t)e, true, -1))) return rc;
        prev = e;
    }
    if (prev != len) return sv_push(out, base + (uint32_t)prev, base + (uint32_t)len, false, -1);
    return 0;
}

/* Applies one Split step to piece [s, e) of text, appending pieces to out. */
static int split_piece(work *w, const tok_split *st, const char *text, span piece, spanvec *out)
{
    int rc = find_matches(w, st->re, text + piece.s, piece.e - piece.s, piece.s, &w->m);
    if (rc) return rc;
    span *m = w->m.v;
    size_t n = w->m.n;
    if (st->invert)
        for (size_t i = 0; i < n; i++) m[i].match = !m[i].match;
    size_t first = out->n;
    bool prev_match = false;
    switch (st->behavior) {
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!m[i].match && (rc = sv_push(out, m[i].s, m[i].e, false, -1))) return rc;
        break;
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++)
            if ((rc = sv_push(out, m[i].s, m[i].e, false, -1))) return rc;
        break;
    case TOK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            if (m[i].match && !prev_match && out->n > first)
                out->v[out->n - 1].e = m[i].e;
            else if ((rc = sv_push(out, m[i].s, m[i].e, false, -1)))
                return rc;
            prev_match = m[i].match;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT:
        for (size_t i = n; i-- > 0;) {
            if (m[i].match && !prev_match && out->n > first)
                out->v[out->n - 1].s = m[i].s;
            else if ((rc = sv_push(out, m[i].s, m[i].e, false, -1)))
                return rc;
            prev_match = m[i].match;
        }
        for (size_t i = first, j = out->n; i + 1 < j; i++, j--) { /* reverse */
            span tmp = out->v[i];
            out->v[i] = out->v[j - 1];
            out->v[j - 1] = tmp;
        }
        break;
    default: /* TOK_SPLIT_CONTIGUOUS */
        for (size_t i = 0; i < n; i++) {
            if (m[i].match == prev_match && out->n > first)
                out->v[out->n - 1].e = m[i].e;
            else if ((rc = sv_push(out, m[i].s, m[i].e, false, -1)))
                return rc;
            prev_match = m[i].match;
        }
        break;
    }
    /* drop empty pieces */
    size_t k = first;
    for (size_t i = first; i < out->n; i++)
        if (out->v[i].e > out->v[i].s) out->v[k++] = out->v[i];
    out->n = k;
    return 0;
}

/* ---- BPE ----------------------------------------------------------------- */

static int emit(work *w, int32_t id)
{
    if (w->n < w->cap) w->ids[w->n] = id;
    w->n++;
    return 0;
}

static void heap_push(work *w, hent h)
{
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        hent *q = &w->heap[p];
        if (q->rank < h.rank || (q->rank == h.rank && q->pos <= h.pos)) break;
        w->heap[i] = *q;
        i = p;
    }
    w->heap[i] = h;
}

static hent heap_pop(work *w)
{
    hent top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n &&
            (w->heap[c + 1].rank < w->heap[c].rank ||
             (w->heap[c + 1].rank == w->heap[c].rank && w->heap[c + 1].pos < w->heap[c].pos)))
            c++;
        if (last.rank < w->heap[c].rank ||
            (last.rank == w->heap[c].rank && last.pos <= w->heap[c].pos))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static void push_pair(work *w, int32_t pos)
{
    const ms_tokenizer *t = w->tok;
    int32_t nx = w->syms[pos].next;
    const tok_pairent *pe = ms_tok_pair_lookup(t, w->syms[pos].id, w->syms[nx].id);
    if (pe) heap_push(w, (hent){pe->rank, pos, pe->new_id});
}

static uint64_t hash_word(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    uint64_t v = 0;
    memcpy(&v, p + i, n - i);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

/* The slot holding word p or the empty slot where it belongs; NULL when the
 * cache is full or cannot grow (the word is then simply not cached). */
static centry *cache_slot(work *w, uint64_t h, const uint8_t *p, size_t n)
{
    if (w->cache_n * 2 >= w->cache_cap) {
        size_t cap = w->cache_cap ? w->cache_cap * 2 : 256;
        centry *nc = cap <= CACHE_MAX_ENTRIES ? calloc(cap, sizeof *nc) : NULL;
        if (nc) {
            for (size_t i = 0; i < w->cache_cap; i++) {
                if (!w->cache[i].wlen) continue;
                size_t j = w->cache[i].hash & (cap - 1);
                while (nc[j].wlen) j = (j + 1) & (cap - 1);
                nc[j] = w->cache[i];
            }
            free(w->cache);
            w->cache = nc;
            w->cache_cap = cap;
        }
    }
    if (!w->cache_cap) return NULL;
    size_t mask = w->cache_cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        centry *e = &w->cache[i];
        if (!e->wlen) return w->cache_n * 2 < w->cache_cap ? e : NULL;
        if (e->hash == h && e->wlen == n && memcmp(w->cbytes + e->woff, p, n) == 0) return e;
    }
}

/* BPE of one byte-level word: merges by rank with a (rank, position) heap,
 * exactly as the reference (lowest rank first, leftmost on ties). */
static int bpe_word(void *ctx, const uint8_t *p, size_t n)
{
    work *w = ctx;
    const ms_tokenizer *t = w->tok;
    int rc;
    if (n == 0) return 0;
    if (n == 1 && t->byte_id[p[0]] >= 0) return emit(w, t->byte_id[p[0]]);
    if (t->ignore_merges) {
        if ((rc = grow((void **)&w->scratch2, &w->cap_scratch2, n * 2, 1))) return rc;
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp = ms_tok_byte_to_cp(p[i]);
            if (cp < 0x80)
                w->scratch2[o++] = (char)cp;
            else {
                w->scratch2[o++] = (char)(0xC0 | (cp >> 6));
                w->scratch2[o++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        int32_t id = ms_tok_str_lookup(t, w->scratch2, o);
        if (id >= 0) return emit(w, id);
    }
    centry *slot = NULL;
    uint64_t h = 0;
    if (n <= CACHE_MAX_WORD) {
        h = hash_word(p, n);
        slot = cache_slot(w, h, p, n);
        if (slot && slot->wlen) {
            for (uint32_t i = 0; i < slot->ilen; i++) emit(w, w->cids[slot->ioff + i]);
            return 0;
        }
    }
    if ((rc = grow((void **)&w->syms, &w->cap_syms, n, sizeof(sym))) ||
        (rc = grow((void **)&w->heap, &w->cap_heap, 3 * n, sizeof(hent))))
        return rc;
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[p[i]];
        if (id < 0) {
            if (t->unk_id < 0) continue; /* unknown byte without unk token: dropped */
            if (t->fuse_unk && ns > 0 && w->syms[ns - 1].id == t->unk_id) {
                w->syms[ns - 1].len++;
                continue;
            }
            id = t->unk_id;
        }
        w->syms[ns] = (sym){id, ns - 1, -1, 1};
        if (ns > 0) w->syms[ns - 1].next = ns;
        ns++;
    }
    w->n_heap = 0;
    for (int32_t i = 0; i + 1 < ns; i++) push_pair(w, i);
    while (w->n_heap > 0) {
        hent top = heap_pop(w);
        sym *s = &w->syms[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        sym *r = &w->syms[s->next];
        const tok_pairent *pe = ms_tok_pair_lookup(t, s->id, r->id);
        if (!pe || pe->new_id != top.new_id) continue;
        s->id = top.new_id;
        s->len += r->len;
        s->next = r->next;
        r->len = 0;
        if (s->next >= 0) w->syms[s->next].prev = top.pos;
        if (s->prev >= 0) push_pair(w, s->prev);
        if (s->next >= 0) push_pair(w, top.pos);
    }
    size_t first = w->n_cids;
    uint32_t n_ids = 0;
    bool keep = slot && grow((void **)&w->cbytes, &w->cap_cbytes, w->n_cbytes + n, 1) == 0 &&
                grow((void **)&w->cids, &w->cap_cids, w->n_cids + n, sizeof(int32_t)) == 0 &&
                w->n_cbytes + n <= UINT32_MAX && w->n_cids + n <= UINT32_MAX;
    for (int32_t i = ns ? 0 : -1; i >= 0; i = w->syms[i].next) {
        emit(w, w->syms[i].id);
        if (keep) w->cids[first + n_ids] = w->syms[i].id;
        n_ids++;
    }
    if (keep) {
        memcpy(w->cbytes + w->n_cbytes, p, n);
        *slot = (centry){h, (uint32_t)w->n_cbytes, (uint32_t)first, (uint16_t)n, (uint16_t)n_ids};
        w->n_cbytes += n;
        w->n_cids += n_ids;
        w->cache_n++;
    }
    return 0;
}

/* ---- pre-tokenization ---------------------------------------------------- */

static int bytelevel_piece(work *w, const char *text, span pc, ms_tok_word_fn fn, void *ctx)
{
    const ms_tokenizer *t = w->tok;
    const char *base = text + pc.s;
    size_t len = pc.e - pc.s;
    int rc;
    if (t->bl_prefix_space && base[0] != ' ') {
        if ((rc = grow((void **)&w->scratch, &w->cap_scratch, len + 1, 1))) return rc;
        w->scratch[0] = ' ';
        memcpy(w->scratch + 1, base, len);
        base = w->scratch;
        len++;
    }
    if (!t->bl_use_regex) return fn(ctx, (const uint8_t *)base, len);
    spanvec *sub = &w->c;
    rc = find_matches(w, t->gpt2_re, base, len, 0, sub);
    for (size_t i = 0; !rc && i < sub->n; i++)
        if (sub->v[i].e > sub->v[i].s)
            rc = fn(ctx, (const uint8_t *)base + sub->v[i].s, sub->v[i].e - sub->v[i].s);
    return rc;
}

static int pretok_work(work *w, const char *text, span seg, ms_tok_word_fn fn, void *ctx)
{
    const ms_tokenizer *t = w->tok;
    int rc;
    w->a.n = 0;
    if ((rc = sv_push(&w->a, seg.s, seg.e, false, -1))) return rc;
    for (int k = 0; k < t->n_steps; k++) {
        w->b.n = 0;
        for (size_t i = 0; i < w->a.n; i++)
            if ((rc = split_piece(w, &t->steps[k], text, w->a.v[i], &w->b))) return rc;
        spanvec tmp = w->a;
        w->a = w->b;
        w->b = tmp;
    }
    for (size_t i = 0; i < w->a.n; i++)
        if ((rc = bytelevel_piece(w, text, w->a.v[i], fn, ctx))) return rc;
    return 0;
}

static void work_deinit(work *w)
{
    free(w->a.v);
    free(w->b.v);
    free(w->m.v);
    free(w->c.v);
    free(w->syms);
    free(w->heap);
    free(w->scratch);
    free(w->scratch2);
    free(w->cache);
    free(w->cbytes);
    free(w->cids);
    pcre2_match_data_free(w->md);
    pcre2_match_context_free(w->mctx);
    pcre2_jit_stack_free(w->jst);
}

static int work_init(work *w, const ms_tokenizer *t, ms_errbuf *err)
{
    memset(w, 0, sizeof *w);
    w->tok = t;
    w->err = err;
    w->md = pcre2_match_data_create(4, NULL);
    return w->md ? 0 : MS_ENOMEM;
}

static int check_text(const char *text, size_t len, ms_errbuf *err)
{
    if (len > MS_TOK_MAX_TEXT_BYTES)
        return ms_err(err, MS_ETOOBIG, "text of %zu bytes exceeds the tokenizer limit of %zu", len,
                      MS_TOK_MAX_TEXT_BYTES);
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = ms_tok_utf8_valid_len(s + i, len - i);
        if (!k) return ms_err(err, MS_EINVAL, "text is not valid UTF-8 (byte offset %zu)", i);
        i += k;
    }
    return 0;
}

int ms_tok_pretokenize(const ms_tokenizer *t, const char *text, size_t len, ms_tok_word_fn fn,
                       void *ctx, ms_errbuf *err)
{
    int rc = check_text(text, len, err);
    if (rc || len == 0) return rc;
    work w;
    if ((rc = work_init(&w, t, err))) return ms_err(err, rc, "tokenizer: out of memory");
    rc = pretok_work(&w, text, (span){0, (uint32_t)len, false, -1}, fn, ctx);
    work_deinit(&w);
    return rc;
}

/* ---- added tokens -------------------------------------------------------- */

static bool is_ws(const uint8_t *s, size_t n, size_t *k)
{
    /* ASCII whitespace and the common Unicode spaces (Rust char::is_whitespace) */
    if (n >= 1 && (s[0] == ' ' || (s[0] >= 9 && s[0] <= 13))) {
        *k = 1;
        return true;
    }
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) {
        *k = 2;
        return true;
    }
    if (n >= 3 && s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80) {
        *k = 3;
        return true;
    }
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF)) {
        *k = 3;
        return true;
    }
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) {
        *k = 3;
        return true;
    }
    if (n >= 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80) {
        *k = 3;
        return true;
    }
    return false;
}

/* Splits text segment seg by the tokens of one trie (leftmost-longest). */
static int split_added(const ms_tokenizer *t, const tok_trie *tr, const char *text, span seg,
                       spanvec *out)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t prev = seg.s;
    int rc;
    for (size_t i = seg.s; i < seg.e;) {
        int32_t node = tr->root[s[i]], best = -1;
        size_t best_end = 0;
        for (size_t j = i; node >= 0;) {
            if (tr->nodes[node].added >= 0) {
                best = tr->nodes[node].added;
                best_end = j + 1;
            }
            if (++j >= seg.e) break;
            int32_t c = tr->nodes[node].child;
            while (c >= 0 && tr->nodes[c].byte != s[j]) c = tr->nodes[c].sibling;
            node = c;
        }
        if (best < 0) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[best];
        size_t ms = i, me = best_end, k;
        if (a->lstrip) /* swallow whitespace before the token */
            while (ms > prev) {
                size_t back = 1;
                while (back < 4 && ms - back > prev && (s[ms - back] & 0xC0) == 0x80) back++;
                if (!is_ws(s + ms - back, back, &k) || k != back) break;
                ms -= back;
            }
        if (a->rstrip)
            while (me < seg.e && is_ws(s + me, seg.e - me, &k)) me += k;
        if (ms > prev && (rc = sv_push(out, (uint32_t)prev, (uint32_t)ms, false, -1))) return rc;
        if ((rc = sv_push(out, (uint32_t)ms, (uint32_t)me, true, a->id))) return rc;
        prev = me;
        i = best_end > me ? best_end : me;
    }
    if (prev < seg.e) return sv_push(out, (uint32_t)prev, seg.e, false, -1);
    return 0;
}

int ms_tokenizer_encode(const ms_tokenizer *t, const char *text, size_t len, int parse_special,
                        int32_t *ids, size_t cap, size_t *n_out, ms_errbuf *err)
{
    *n_out = 0;
    int rc = check_text(text, len, err);
    if (rc || len == 0) return rc;
    work w;
    spanvec seg1 = {0}, seg2 = {0};
    if ((rc = work_init(&w, t, err))) return ms_err(err, rc, "tokenizer: out of memory");
    w.ids = ids;
    w.cap = ids ? cap : 0;
    span whole = {0, (uint32_t)len, false, -1};
    if (!parse_special || (!t->trie_raw.any && !t->trie_norm.any)) {
        rc = sv_push(&seg2, 0, (uint32_t)len, false, -1);
    } else {
        rc = split_added(t, &t->trie_raw, text, whole, &seg1);
        for (size_t i = 0; !rc && i < seg1.n; i++) {
            if (seg1.v[i].match || !t->trie_norm.any)
                rc = sv_push(&seg2, seg1.v[i].s, seg1.v[i].e, seg1.v[i].match, seg1.v[i].id);
            else
                rc = split_added(t, &t->trie_norm, text, seg1.v[i], &seg2);
        }
    }
    for (size_t i = 0; !rc && i < seg2.n; i++) {
        if (seg2.v[i].match)
            rc = emit(&w, seg2.v[i].id);
        else
            rc = pretok_work(&w, text, seg2.v[i], bpe_word, &w);
    }
    if (rc == MS_ENOMEM) ms_err(err, rc, "tokenizer: out of memory while encoding");
    if (!rc) *n_out = w.n;
    free(seg1.v);
    free(seg2.v);
    work_deinit(&w);
    return rc;
}
