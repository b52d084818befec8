/* test_radix.c — prefix matching, insertion, locking and LRU eviction of the
 * radix cache over the pages of a KV cache (one per-token stream here; the
 * V4-shaped streams in test_kv_cache.c and below). */
#include "cache/radix.h"
#include "harness.h"
#include "model/family.h"

#include <string.h>

static ms_kv_cache *cache;
static int page;

static int mk_cache(int page_size, int n_pages)
{
    static ms_kv_spec spec;
    ms_errbuf e;
    ms_kv_spec_init(&spec, 1);
    ms_kv_stream_cover(ms_kv_spec_add(&spec, "kv", 16, 4, MS_DT_F32, 1, 0, 0), 0);
    int32_t np[MS_KV_MAX_STREAMS] = {n_pages};
    page = page_size;
    return ms_kv_cache_new(&cache, &spec, page_size, np, MS_DT_F32, 0, &e);
}

/* A request holding pages for n tokens. */
static void take(ms_kv_seq *q, int64_t n)
{
    ms_kv_seq_init(q);
    ms_kv_cache_reserve(cache, q, n);
}

static int64_t cached_pages(const ms_radix *r)
{
    return ms_radix_cached_tokens(r) / page;
}
static int64_t evictable_pages(const ms_radix *r)
{
    return ms_radix_evictable_tokens(r) / page;
}

TEST(match_insert_split_evict)
{
    CHECK(mk_cache(2, 32) == 0);
    ms_radix *r;
    CHECK(ms_radix_new(&r, cache) == 0);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ms_kv_seq pa, out, pb;
    take(&pa, 8);
    ms_kv_seq_init(&out);
    ms_radix_node *last;
    CHECK(ms_radix_match(r, a, 8, &out, &last) == 0);
    CHECK(ms_radix_insert(r, a, 8, &pa, &last) == 0);
    CHECK(cached_pages(r) == 4);
    ms_kv_cache_release(cache, &pa);           /* the request is done */
    CHECK(ms_kv_cache_n_free(cache, 0) == 28); /* tree keeps them */
    /* a prefix sharing 2 pages + half a page: matches 4 tokens */
    int32_t b[7] = {1, 2, 3, 4, 5, 9, 9};
    CHECK(ms_radix_peek(r, b, 7) == 4); /* the same length, and the tree untouched: */
    CHECK(cached_pages(r) == 4 && evictable_pages(r) == 4);
    CHECK(ms_radix_match(r, b, 7, &out, &last) == 4);
    CHECK(out.n_pages[0] == 2 && out.pages[0][0] == pa.pages[0][0] &&
          out.pages[0][1] == pa.pages[0][1]);
    ms_radix_lock(r, last);
    CHECK(evictable_pages(r) == 2);
    /* insert b's full pages: first 2 pages cached already */
    take(&pb, 6);
    ms_radix_node *lb;
    CHECK(ms_radix_insert(r, b, 6, &pb, &lb) == 4);
    CHECK(cached_pages(r) == 5);
    /* evict everything evictable: the locked prefix stays */
    ms_radix_evict(r, 100);
    CHECK(cached_pages(r) == 2);
    CHECK(ms_radix_match(r, a, 8, &out, &last) == 4);
    ms_radix_unlock(r, last);
    CHECK(ms_radix_flush(r) == 4);
    CHECK(cached_pages(r) == 0);
    ms_kv_cache_release(cache, &pb);
    CHECK(ms_kv_cache_n_free(cache, 0) == 32);
    ms_kv_seq_deinit(&pa), ms_kv_seq_deinit(&pb), ms_kv_seq_deinit(&out);
    ms_radix_free(r);
    ms_kv_cache_free(cache);
}

TEST(lru_order)
{
    CHECK(mk_cache(1, 16) == 0);
    ms_radix *r;
    CHECK(ms_radix_new(&r, cache) == 0);
    int32_t x[2] = {1, 2}, y[2] = {3, 4};
    ms_kv_seq px, py, out;
    ms_kv_seq_init(&out);
    ms_radix_node *l;
    take(&px, 2);
    take(&py, 2);
    ms_radix_insert(r, x, 2, &px, &l);
    ms_radix_insert(r, y, 2, &py, &l);
    ms_kv_cache_release(cache, &px), ms_kv_cache_release(cache, &py);
    CHECK(ms_radix_match(r, x, 2, &out, &l) == 2); /* x used more recently */
    CHECK(ms_radix_evict(r, 1) == 2);              /* y's leaf (2 pages) goes first */
    CHECK(ms_radix_match(r, y, 2, &out, &l) == 0);
    CHECK(ms_radix_match(r, x, 2, &out, &l) == 2);
    ms_radix_free(r);
    CHECK(ms_kv_cache_n_free(cache, 0) == 16);
    ms_kv_seq_deinit(&px), ms_kv_seq_deinit(&py), ms_kv_seq_deinit(&out);
    ms_kv_cache_free(cache);
}

/* A node locked by a running request is split by another request's match:
 * when the first request unlocks, every page it held must become evictable
 * again (the deeper half used to keep the lock count forever). */
TEST(split_of_a_locked_node_unlocks_whole)
{
    CHECK(mk_cache(2, 32) == 0); /* page_size 2 */
    ms_radix *r;
    CHECK(ms_radix_new(&r, cache) == 0);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ms_kv_seq pa, out;
    ms_kv_seq_init(&out);
    take(&pa, 8);
    ms_radix_node *x, *y, *z;
    CHECK(ms_radix_insert(r, a, 8, &pa, &x) == 0);
    ms_kv_seq held = pa; /* its table, for the insert of c below (all cached by then) */
    ms_kv_cache_release(cache, &pa);
    CHECK(ms_radix_match(r, a, 8, &out, &x) == 8); /* request X holds all of a */
    ms_radix_lock(r, x);
    CHECK(evictable_pages(r) == 0);
    int32_t b[8] = {1, 2, 3, 4, 9, 9, 9, 9};
    CHECK(ms_radix_match(r, b, 8, &out, &y) == 4); /* splits X's node after 2 pages */
    ms_radix_lock(r, y);
    int32_t c[6] = {1, 2, 3, 4, 5, 6};
    CHECK(ms_radix_insert(r, c, 6, &held, &z) == 6); /* splits it again, inside X's prefix */
    CHECK(evictable_pages(r) == 0);
    ms_radix_unlock(r, x); /* X finishes: its last two pages are free to go, y's are not */
    CHECK(evictable_pages(r) == 2);
    ms_radix_unlock(r, y);
    CHECK(evictable_pages(r) == 4 && cached_pages(r) == 4);
    CHECK(ms_radix_evict(r, 100) == 8);
    CHECK(ms_kv_cache_n_free(cache, 0) == 32);
    ms_kv_seq_deinit(&pa), ms_kv_seq_deinit(&out);
    ms_radix_free(r);
    ms_kv_cache_free(cache);
}

/* V4's streams: the tree keys units of page × 128 tokens, holds the pages of
 * every stream, and a hit ends where the window a continuation needs is no
 * longer held; with the compressor state in the spec (as V4 has) no hit is
 * given at all (the carry at the match point is not kept). */
TEST(per_stream_pages_and_window_hits)
{
    char v4[2048];
    int n = snprintf(v4, sizeof v4,
                     "{\"model_type\":\"deepseek_v4\",\"vocab_size\":1000,\"hidden_size\":64,"
                     "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"head_dim\":16,"
                     "\"sliding_window\":8,\"index_head_dim\":8,\"compress_ratios\":[0,4,128,4]}");
    CHECK(n > 0);
    ms_model_shape s;
    ms_errbuf err;
    ms_kv_spec spec;
    ms_kv_spec_opts o = {.state_bytes = 0, .page_size = 2, .attn_tp = 1};
    CHECK(ms_family_parse(v4, NULL, &s, &err) == 0 && ms_family_kv_spec(&s, &o, &spec, &err) == 0);
    int32_t pages[MS_KV_MAX_STREAMS] = {400, 128, 8, 128};
    CHECK(ms_kv_spec_state_bytes(&spec, 0, 4) > 0);
    { /* stateful: no hit */
        ms_radix *r0;
        int32_t t0[300];
        ms_kv_seq q, o0;
        for (int i = 0; i < 300; i++) t0[i] = i % 89;
        CHECK(ms_kv_cache_new(&cache, &spec, 2, pages, MS_DT_BF16, 1, &err) == 0);
        page = 2;
        ms_radix_node *l0;
        ms_kv_seq_init(&o0);
        CHECK(ms_radix_new(&r0, cache) == 0);
        take(&q, 300);
        CHECK(ms_radix_insert(r0, t0, 300, &q, &l0) == 0 &&
              ms_radix_match(r0, t0, 300, &o0, &l0) == 0);
        ms_kv_cache_release(cache, &q);
        ms_radix_free(r0);
        ms_kv_seq_deinit(&q), ms_kv_seq_deinit(&o0);
        ms_kv_cache_free(cache);
    }
    memset(spec.state_layer_bytes, 0, sizeof spec.state_layer_bytes); /* the streams alone */
    CHECK(ms_kv_cache_new(&cache, &spec, 2, pages, MS_DT_BF16, 0, &err) == 0);
    page = 2;
    ms_radix *r;
    CHECK(ms_radix_new(&r, cache) == 0 && ms_kv_cache_share_unit(cache) == 256);
    int32_t t[600];
    for (int i = 0; i < 600; i++) t[i] = i % 97;
    ms_kv_seq a, out, b;
    ms_kv_seq_init(&out), ms_kv_seq_init(&b);
    take(&a, 600);
    CHECK(a.n_tokens == 600);
    ms_radix_node *l;
    CHECK(ms_radix_insert(r, t, 600, &a, &l) == 0);
    CHECK(ms_radix_cached_tokens(r) == 512); /* two whole units */
    /* a hit copies every stream's pages: window 256, c4 64, c128 2, index 64 */
    CHECK(ms_radix_match(r, t, 600, &out, &l) == 512);
    CHECK(out.n_pages[0] == 256 && out.n_pages[1] == 64 && out.n_pages[2] == 2 &&
          out.n_pages[3] == 64 && out.pages[2][1] == a.pages[2][1]);
    CHECK(ms_kv_cache_share(cache, &b, &out, 512) == 0 && b.pages[1][63] == a.pages[1][63]);
    ms_kv_cache_release(cache, &b);
    /* a sequence whose window slid before it was cached keeps only the window
     * before its last share unit (512): a hit there is usable, one at the first
     * unit (256), whose window slid out, is not */
    ms_radix_flush(r);
    ms_kv_cache_slide(cache, &a, 600);
    CHECK(ms_radix_insert(r, t, 600, &a, &l) == 0);
    CHECK(ms_radix_match(r, t, 600, &out, &l) == 512);
    CHECK(ms_radix_match(r, t, 300, &out, &l) == 0);
    ms_kv_cache_release(cache, &a);
    ms_radix_free(r);
    for (int st = 0; st < 4; st++) CHECK(ms_kv_cache_n_free(cache, st) == pages[st]);
    ms_kv_seq_deinit(&a), ms_kv_seq_deinit(&b), ms_kv_seq_deinit(&out);
    ms_kv_cache_free(cache);
}

/* V4's engine spec (the carry and window snapshot streams): the tree holds no
 * window pages, so a prefix hit is usable at every unit of a cached prefix,
 * also at units whose window slid out while the request ran; the hit's window
 * starts as its own pages (reserved next, filled by the forward). */
TEST(snapshot_streams_hit_at_every_unit)
{
    const char *v4 = "{\"model_type\":\"deepseek_v4\",\"vocab_size\":1000,\"hidden_size\":64,"
                     "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"head_dim\":16,"
                     "\"sliding_window\":8,\"index_head_dim\":8,\"compress_ratios\":[0,4,128,4]}";
    ms_model_shape s;
    ms_errbuf err;
    ms_kv_spec spec;
    ms_kv_spec_opts o = {.elem_bytes = 4, .page_size = 2, .attn_tp = 1, .prefix_carry = 1};
    CHECK(ms_family_parse(v4, NULL, &s, &err) == 0 && ms_family_kv_spec(&s, &o, &spec, &err) == 0);
    CHECK(spec.n_streams == 6 && spec.state_snapshots && !strcmp(spec.streams[5].name, "wsnap"));
    CHECK(spec.streams[5].entry_bytes == 8 * 16 * 4 && spec.streams[5].n_layers == 4);
    int32_t pages[MS_KV_MAX_STREAMS] = {400, 128, 8, 128, 8, 8};
    CHECK(ms_kv_cache_new(&cache, &spec, 2, pages, MS_DT_F32, 2, &err) == 0);
    page = 2;
    ms_radix *r;
    CHECK(ms_radix_new(&r, cache) == 0 && ms_kv_cache_share_unit(cache) == 256);
    int32_t t[800];
    for (int i = 0; i < 800; i++) t[i] = i % 97;
    ms_kv_seq a, out, b;
    ms_kv_seq_init(&out), ms_kv_seq_init(&b);
    take(&a, 800);
    ms_kv_cache_slide(cache, &a, 800); /* only the last window is left */
    CHECK(a.first_live[0] == (800 - 8) / 2);
    ms_radix_node *l;
    CHECK(ms_radix_insert(r, t, 800, &a, &l) == 0 && ms_radix_cached_tokens(r) == 768);
    CHECK(ms_radix_match(r, t, 800, &out, &l) == 768);
    CHECK(ms_radix_match(r, t, 300, &out, &l) == 256); /* an earlier unit */
    CHECK(out.n_pages[0] == 0 && out.n_pages[1] == 32 && out.n_pages[4] == 1 &&
          out.n_pages[5] == 1);
    int32_t free_win = ms_kv_cache_n_free(cache, 0);
    CHECK(ms_kv_cache_share(cache, &b, &out, 256) == 0);
    CHECK(b.n_pages[0] == (256 - 8) / 2 && b.first_live[0] == b.n_pages[0]);
    CHECK(b.pages[5][0] == a.pages[5][0] && ms_kv_cache_n_free(cache, 0) == free_win);
    CHECK(ms_kv_cache_reserve(cache, &b, 260) == 0); /* its own window from 248 */
    CHECK(ms_kv_cache_n_free(cache, 0) == free_win - 6 && b.pages[0][124] >= 0);
    ms_kv_cache_release(cache, &a), ms_kv_cache_release(cache, &b);
    ms_radix_free(r);
    for (int st = 0; st < 6; st++) CHECK(ms_kv_cache_n_free(cache, st) == pages[st]);
    ms_kv_seq_deinit(&a), ms_kv_seq_deinit(&b), ms_kv_seq_deinit(&out);
    ms_kv_cache_free(cache);
}

int main(void)
{
    RUN(match_insert_split_evict);
    RUN(lru_order);
    RUN(split_of_a_locked_node_unlocks_whole);
    RUN(per_stream_pages_and_window_hits);
    RUN(snapshot_streams_hit_at_every_unit);
    return TEST_REPORT();
}
