/* test_radix.c — prefix matching, insertion, locking and LRU eviction of the
 * radix cache over KV pages. */
#include "cache/radix.h"
#include "harness.h"

#include <string.h>

static ms_kv_pool *pool;

static void take(int32_t n, int32_t *pages) { ms_kv_pool_alloc(pool, n, pages); }

TEST(match_insert_split_evict)
{
    ms_errbuf e;
    CHECK(ms_kv_pool_new(&pool, 1, 4, 2, 32, MS_DT_F32, &e) == 0); /* page_size 2 */
    ms_radix *r;
    CHECK(ms_radix_new(&r, pool) == 0);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, pa[4];
    take(4, pa);
    ms_radix_node *last;
    int32_t out[8];
    CHECK(ms_radix_match(r, a, 8, out, &last) == 0);
    CHECK(ms_radix_insert(r, a, 8, pa, &last) == 0);
    CHECK(ms_radix_cached_pages(r) == 4);
    for (int i = 0; i < 4; i++) ms_kv_pool_unref(pool, pa[i]); /* the request is done */
    CHECK(ms_kv_pool_n_free(pool) == 28);                     /* tree keeps them */
    /* a prefix sharing 2 pages + half a page: matches 4 tokens */
    int32_t b[7] = {1, 2, 3, 4, 5, 9, 9};
    CHECK(ms_radix_peek(r, b, 7) == 4); /* the same length, and the tree untouched: */
    CHECK(ms_radix_cached_pages(r) == 4 && ms_radix_evictable_pages(r) == 4);
    CHECK(ms_radix_match(r, b, 7, out, &last) == 4);
    CHECK(out[0] == pa[0] && out[1] == pa[1]);
    ms_radix_lock(r, last);
    CHECK(ms_radix_evictable_pages(r) == 2);
    /* insert b's full pages: first 2 pages cached already */
    int32_t pb[3];
    take(3, pb);
    ms_radix_node *lb;
    CHECK(ms_radix_insert(r, b, 6, pb, &lb) == 4);
    CHECK(ms_radix_cached_pages(r) == 5);
    /* evict everything evictable: the locked prefix stays */
    ms_radix_evict(r, 100);
    CHECK(ms_radix_cached_pages(r) == 2);
    CHECK(ms_radix_match(r, a, 8, out, &last) == 4);
    ms_radix_unlock(r, last);
    CHECK(ms_radix_flush(r) == 2);
    CHECK(ms_radix_cached_pages(r) == 0);
    for (int i = 0; i < 3; i++) ms_kv_pool_unref(pool, pb[i]);
    CHECK(ms_kv_pool_n_free(pool) == 32);
    ms_radix_free(r);
    ms_kv_pool_free(pool);
}

TEST(lru_order)
{
    ms_errbuf e;
    CHECK(ms_kv_pool_new(&pool, 1, 4, 1, 16, MS_DT_F32, &e) == 0);
    ms_radix *r;
    CHECK(ms_radix_new(&r, pool) == 0);
    int32_t x[2] = {1, 2}, y[2] = {3, 4}, px[2], py[2], out[2];
    ms_radix_node *l;
    take(2, px);
    take(2, py);
    ms_radix_insert(r, x, 2, px, &l);
    ms_radix_insert(r, y, 2, py, &l);
    for (int i = 0; i < 2; i++) ms_kv_pool_unref(pool, px[i]), ms_kv_pool_unref(pool, py[i]);
    CHECK(ms_radix_match(r, x, 2, out, &l) == 2); /* x used more recently */
    CHECK(ms_radix_evict(r, 1) == 2);             /* y's leaf (2 pages) goes first */
    CHECK(ms_radix_match(r, y, 2, out, &l) == 0);
    CHECK(ms_radix_match(r, x, 2, out, &l) == 2);
    ms_radix_free(r);
    CHECK(ms_kv_pool_n_free(pool) == 16);
    ms_kv_pool_free(pool);
}

/* A node locked by a running request is split by another request's match:
 * when the first request unlocks, every page it held must become evictable
 * again (the deeper half used to keep the lock count forever). */
TEST(split_of_a_locked_node_unlocks_whole)
{
    ms_errbuf e;
    CHECK(ms_kv_pool_new(&pool, 1, 4, 2, 32, MS_DT_F32, &e) == 0); /* page_size 2 */
    ms_radix *r;
    CHECK(ms_radix_new(&r, pool) == 0);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, pa[4], out[8];
    take(4, pa);
    ms_radix_node *x, *y, *z;
    CHECK(ms_radix_insert(r, a, 8, pa, &x) == 0);
    for (int i = 0; i < 4; i++) ms_kv_pool_unref(pool, pa[i]);
    CHECK(ms_radix_match(r, a, 8, out, &x) == 8); /* request X holds all of a */
    ms_radix_lock(r, x);
    CHECK(ms_radix_evictable_pages(r) == 0);
    int32_t b[8] = {1, 2, 3, 4, 9, 9, 9, 9};
    CHECK(ms_radix_match(r, b, 8, out, &y) == 4); /* splits X's node after 2 pages */
    ms_radix_lock(r, y);
    int32_t c[6] = {1, 2, 3, 4, 5, 6};
    CHECK(ms_radix_insert(r, c, 6, pa, &z) == 6); /* splits it again, inside X's prefix */
    CHECK(ms_radix_evictable_pages(r) == 0);
    ms_radix_unlock(r, x); /* X finishes: its last two pages are free to go, y's are not */
    CHECK(ms_radix_evictable_pages(r) == 2);
    ms_radix_unlock(r, y);
    CHECK(ms_radix_evictable_pages(r) == 4 && ms_radix_cached_pages(r) == 4);
    CHECK(ms_radix_evict(r, 100) == 4);
    CHECK(ms_kv_pool_n_free(pool) == 32);
    ms_radix_free(r);
    ms_kv_pool_free(pool);
}

int main(void)
{
    RUN(match_insert_split_evict);
    RUN(lru_order);
    RUN(split_of_a_locked_node_unlocks_whole);
    return TEST_REPORT();
}
