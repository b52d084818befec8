/* test_base.c — error table, checked arithmetic, thread pool. */
#include "base/error.h"
#include "base/threadpool.h"
#include "base/util.h"
#include "harness.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    for (int i = 0; i < 5; i++) CHECK(a[i] == i * 7);               /* contents kept */
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
    while (tid > m && !atomic_compare_exchange_weak(&j->max_tid, &m, tid)) {
    }
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

static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* CPU time the process uses while the main thread sleeps 20 ms. */
static double idle_cpu_seconds(void)
{
    double c0 = cpu_seconds();
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    return cpu_seconds() - c0;
}

static void touch(void *arg, int tid, int nt)
{
    (void)nt;
    atomic_fetch_or((_Atomic int *)arg, 1 << tid);
}

/* ms_pool_park ends a worker's spin at once: with a spin of ~2·10⁹ pauses
 * (MOESERVE_POOL_SPIN) the idle worker keeps a core busy while the main
 * thread sleeps 20 ms (at least 5 ms of CPU), and after ms_pool_park it
 * sleeps (under 1 ms of CPU, the smallest of three); runs still reach every
 * thread afterwards.  No-op for a NULL or one-thread pool. */
TEST(pool_park_stops_the_spin)
{
    ms_pool_park(NULL);
    ms_pool *one = ms_pool_new(1);
    CHECK(one);
    ms_pool_park(one);
    ms_pool_free(one);
    setenv("MOESERVE_POOL_SPIN", "2000000000", 1);
    ms_pool *p = ms_pool_new(2);
    unsetenv("MOESERVE_POOL_SPIN");
    CHECK(p);
    double spun = 0, parked = 1;
    for (int rep = 0; rep < 3; rep++) {
        _Atomic int seen = 0;
        ms_pool_run(p, touch, (void *)&seen);
        CHECK(atomic_load(&seen) == 3);
        double s = idle_cpu_seconds();
        spun = s > spun ? s : spun;
        ms_pool_park(p);
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL); /* let the worker see it */
        s = idle_cpu_seconds();
        parked = s < parked ? s : parked;
    }
    ms_pool_free(p);
    CHECKF(spun > 5e-3, "a spinning worker used only %.3f ms of CPU in 20 ms", spun * 1e3);
    CHECKF(parked < 1e-3, "parked workers used %.3f ms of CPU in 20 ms", parked * 1e3);
}

static double thread_cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* tid 1 sleeps 100 ms inside fn; the others return at once. */
static void slow_worker(void *arg, int tid, int nt)
{
    (void)nt;
    if (tid == 1) nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    atomic_fetch_add((_Atomic int *)arg, 1);
}

/* The caller waits for a slow worker asleep after its spin: with a spin of
 * 1000 pauses it uses under 10 ms of its own CPU while the worker takes 100 ms
 * (a caller that only spins uses ~100, at least ~20 on a loaded machine), for static and dynamic
 * runs; a spin of 0 (sleep at once) still returns only after every part ran. */
TEST(pool_caller_sleeps_on_a_slow_worker)
{
    const char *spins[] = {"1000", "0"};
    for (int si = 0; si < 2; si++) {
        setenv("MOESERVE_POOL_SPIN", spins[si], 1);
        ms_pool *p = ms_pool_new(2);
        unsetenv("MOESERVE_POOL_SPIN");
        CHECK(p);
        for (int dyn = 0; dyn <= 1; dyn++) {
            double least = 1;
            for (int rep = 0; rep < 2; rep++) {
                _Atomic int ran = 0;
                nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL); /* the worker is asleep */
                double c0 = thread_cpu_seconds();
                if (dyn)
                    ms_pool_run_dynamic(p, slow_worker, (void *)&ran);
                else
                    ms_pool_run(p, slow_worker, (void *)&ran);
                double c = thread_cpu_seconds() - c0;
                least = c < least ? c : least;
                if (dyn) /* the worker may have skipped it, or joined and been waited for */
                    CHECK(atomic_load(&ran) >= 1 && atomic_load(&ran) <= 2);
                else
                    CHECK(atomic_load(&ran) == 2);
            }
            CHECKF(least < 10e-3, "spin %s dyn %d: the caller used %.1f ms of CPU waiting",
                   spins[si], dyn, least * 1e3);
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
    RUN(pool_park_stops_the_spin);
    RUN(pool_caller_sleeps_on_a_slow_worker);
    return TEST_REPORT();
}
