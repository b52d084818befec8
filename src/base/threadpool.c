/* threadpool.c — fixed pthread pool with spin-then-futex hand-off (threadpool.h).
 * The futex wake (a syscall) is made only when a worker is asleep. */
#include "base/threadpool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

struct ms_pool {
    int n_threads;
    pthread_t *threads;
    _Atomic uint32_t generation; /* bumped for each job; workers wait on it */
    _Atomic int pending;         /* workers still running the current job */
    _Atomic int stop;
    _Atomic int sleepers;        /* workers inside (or entering) futex_wait */
    ms_pool_fn fn;
    void *arg;
};

enum { SPIN_ITERS = 20000 };

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 1 << 30, NULL, NULL, 0);
}

struct worker_arg {
    ms_pool *pool;
    int tid;
};

static void *worker_main(void *p)
{
    struct worker_arg wa = *(struct worker_arg *)p;
    free(p);
    ms_pool *pool = wa.pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                __builtin_ia32_pause();
                continue;
            }
            /* announce the sleep before re-checking the generation inside
             * futex_wait: ms_pool_run bumps the generation, then reads
             * sleepers (both seq_cst), so one of the two sees the other */
            atomic_fetch_add(&pool->sleepers, 1);
            futex_wait(&pool->generation, seen);
            atomic_fetch_sub(&pool->sleepers, 1);
            spins = 0;
        }
        seen = gen;
        if (atomic_load(&pool->stop)) return NULL;
        pool->fn(pool->arg, wa.tid, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel);
    }
}

ms_pool *ms_pool_new(int n_threads)
{
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads <= 0) n_threads = 1;
    ms_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) goto fail;
    for (int t = 1; t < n_threads; t++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa) goto fail_threads;
        wa->pool = pool;
        wa->tid = t;
        if (pthread_create(&pool->threads[t], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->n_threads = t;
            goto fail_threads;
        }
    }
    return pool;
fail_threads:
    ms_pool_free(pool);
    return NULL;
fail:
    free(pool);
    return NULL;
}

void ms_pool_free(ms_pool *pool)
{
    if (!pool) return;
    if (pool->threads) {
        atomic_store(&pool->stop, 1);
        atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
        futex_wake_all(&pool->generation);
        for (int t = 1; t < pool->n_threads; t++)
            if (pool->threads[t]) pthread_join(pool->threads[t], NULL);
    }
    free(pool->threads);
    free(pool);
}

int ms_pool_size(const ms_pool *pool) { return pool ? pool->n_threads : 1; }

void ms_pool_run(ms_pool *pool, ms_pool_fn fn, void *arg)
{
    if (!pool || pool->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&pool->generation, 1);
    if (atomic_load(&pool->sleepers) > 0) futex_wake_all(&pool->generation); /* skip the syscall when all spin */
    fn(arg, 0, pool->n_threads);
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0)
        __builtin_ia32_pause();
}
