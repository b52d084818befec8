/* test_base.c — error table, checked arithmetic, thread pool. */
#include "base/error.h"
#include "base/threadpool.h"
#include "base/util.h"
#include "harness.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

TEST(error_table)
{
    CHECK(strcmp(ms_strerror(0), "ok") == 0);
    CHECK(strcmp(ms_strerror(MS_EINVAL), "invalid argument") == 0);
    CHECK(ms_error_http_status(MS_ETOOBIG) == 413);
    CHECK(ms_error_http_status(MS_EAUTH) == 401);
    CHECK(ms_error_http_status(12345) == 500);
    ms_errbuf e;
    CHECK(ms_err(&e, MS_ERANGE, "x=%d", 7) == MS_ERANGE);
    CHECK(strcmp(e.msg, "x=7") == 0);
}

TEST(checked_math)
{
    size_t r;
    CHECK(ms_mul_size(3, 4, &r) && r == 12);
    CHECK(!ms_mul_size(SIZE_MAX / 2, 3, &r));
    CHECK(!ms_add_size(SIZE_MAX, 1, &r));
}

static _Atomic long sum_hits;
static void add_range(void *arg, int tid, int n)
{
    int64_t b, e;
    ms_pool_range(*(int64_t *)arg, tid, n, 16, &b, &e);
    long s = 0;
    for (int64_t i = b; i < e; i++) s += i;
    atomic_fetch_add(&sum_hits, s);
}

TEST(grow_array)
{
    int32_t *a = NULL;
    int64_t cap = 0;
    void *p = a;
    CHECK(ms_grow_array(&p, &cap, 0, sizeof *a) == 0 && cap == 0 && p == NULL);
    CHECK(ms_grow_array(&p, &cap, 5, sizeof *a) == 0 && cap == 5 && p != NULL);
    a = p;
    for (int i = 0; i < 5; i++) a[i] = i * 7;
    CHECK(ms_grow_array(&p, &cap, 6, sizeof *a) == 0 && cap == 10); /* doubles */
    a = p;
    for (int i = 0; i < 5; i++) CHECK(a[i] == i * 7); /* contents kept */
    CHECK(ms_grow_array(&p, &cap, 3, sizeof *a) == 0 && cap == 10); /* never shrinks */
    free(p);
}

TEST(pool_runs_every_item_once)
{
    for (int nt = 1; nt <= 4; nt++) {
        ms_pool *p = ms_pool_new(nt);
        CHECK(p && ms_pool_size(p) == nt);
        for (int64_t n = 0; n < 200; n += 37) {
            for (int rep = 0; rep < 50; rep++) {
                atomic_store(&sum_hits, 0);
                ms_pool_run(p, add_range, &n);
                CHECK(atomic_load(&sum_hits) == n * (n - 1) / 2);
            }
        }
        ms_pool_free(p);
    }
    ms_pool_free(NULL);
}

struct dyn_job {
    int64_t n;
    _Atomic int64_t next;
    _Atomic long sum;
    _Atomic int max_tid, calls;
};

static void dyn_claim(void *arg, int tid, int nt)
{
    struct dyn_job *j = arg;
    atomic_fetch_add(&j->calls, 1);
    int m = atomic_load(&j->max_tid);
    while (tid > m && !atomic_compare_exchange_weak(&j->max_tid, &m, tid)) {}
    (void)nt;
    for (int64_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) atomic_fetch_add(&j->sum, (long)i);
}

TEST(pool_dynamic_runs_every_item_once)
{
    for (int nt = 1; nt <= 4; nt++) {
        ms_pool *p = ms_pool_new(nt);
        CHECK(p);
        for (int rep = 0; rep < 500; rep++) {
            int64_t n = rep % 97;
            struct dyn_job j = {.n = n};
            ms_pool_run_dynamic(p, dyn_claim, &j);
            CHECK(atomic_load(&j.sum) == n * (n - 1) / 2);
            CHECK(atomic_load(&j.calls) >= 1 && atomic_load(&j.calls) <= nt);
            CHECK(atomic_load(&j.max_tid) < nt);
            if (rep % 3 == 0) { /* static jobs interleaved with dynamic ones */
                int64_t m = rep % 50;
                atomic_store(&sum_hits, 0);
                ms_pool_run(p, add_range, &m);
                CHECK(atomic_load(&sum_hits) == m * (m - 1) / 2);
            }
        }
        ms_pool_free(p);
    }
}

int main(void)
{
    RUN(error_table);
    RUN(checked_math);
    RUN(grow_array);
    RUN(pool_runs_every_item_once);
    RUN(pool_dynamic_runs_every_item_once);
    return TEST_REPORT();
}
