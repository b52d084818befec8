/* threadpool.c — fixed pthread pool with spin-then-futex hand-off (threadpool.h).
 * Both sides wait the same way: a worker for the next job, the caller for the
 * workers of the current one, each spinning `spin` pauses and then sleeping on
 * a futex (generation, finished), so a preempted thread on a loaded machine
 * is waited for asleep, its core free.  The futex wake (a syscall) is made
 * only when the other side is asleep.  Each job
 * is described by `gate` (its generation, static or dynamic, and for dynamic
 * jobs whether it is still open and how many workers joined), so a worker
 * that wakes late for a dynamic job the caller already closed skips it
 * without touching fn/arg. */
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
    _Atomic int static_done;     /* static job: workers that finished it */
    _Atomic int stop;
    _Atomic int sleepers;      /* workers inside (or entering) futex_wait */
    _Atomic uint64_t gate;     /* generation << 32 | G_* flags | joined workers */
    _Atomic int done;          /* dynamic job: joined workers that finished */
    _Atomic uint32_t park;     /* == generation: idle workers sleep without spinning */
    _Atomic uint32_t finished; /* bumped by a worker after its part of a job */
    _Atomic int caller_asleep; /* the caller is inside (or entering) futex_wait on finished */
    long spin;                 /* pause iterations before a worker sleeps */
    ms_pool_fn fn;
    void *arg;
};

#define G_STATIC (1ull << 31)
#define G_OPEN   (1ull << 30)
#define G_COUNT  ((1ull << 30) - 1)

/* Pause iterations a worker spins after a job before it sleeps, and the
 * caller before it sleeps waiting for the workers (~0.5 ms on the
 * development machine); MOESERVE_POOL_SPIN overrides it (0: sleep at once).
 * Sleeping at once cost 18-22 % of a 2-thread MoE decode token
 * (bench/RESULTS.md, "Why the code is so"). */
enum { SPIN_ITERS = 20000 };

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 1 << 30, NULL, NULL, 0);
}

/* A worker's part of the job is done: tell a sleeping caller.  After the
 * pending / done update (seq_cst), so the caller's sleep protocol below sees
 * one or the other. */
static void worker_finished(ms_pool *pool)
{
    atomic_fetch_add(&pool->finished, 1);
    if (atomic_load(&pool->caller_asleep)) futex_wake_all(&pool->finished);
}

/* Caller: wait until *ctr >= target, spinning, then sleeping on finished.
 * It announces the sleep, then re-reads *ctr; a worker updates *ctr, bumps
 * finished, then reads caller_asleep (all seq_cst): either the caller sees
 * the update, or the worker sees the announcement and wakes it (and the
 * bumped finished makes a late futex_wait return at once). */
static void caller_wait(ms_pool *pool, _Atomic int *ctr, int target)
{
    long spins = 0;
    while (atomic_load_explicit(ctr, memory_order_acquire) < target) {
        if (++spins < pool->spin) {
            __builtin_ia32_pause();
            continue;
        }
        uint32_t f = atomic_load(&pool->finished);
        atomic_store(&pool->caller_asleep, 1);
        if (atomic_load(ctr) < target) futex_wait(&pool->finished, f);
        atomic_store(&pool->caller_asleep, 0);
    }
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
        long spins = 0;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen) {
            if (++spins < pool->spin &&
                atomic_load_explicit(&pool->park, memory_order_relaxed) != seen) {
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
        uint64_t st = atomic_load(&pool->gate);
        if ((uint32_t)(st >> 32) != seen) continue; /* a later job is posted: go and see */
        if (st & G_STATIC) {
            pool->fn(pool->arg, wa.tid, pool->n_threads);
            atomic_fetch_add(&pool->static_done, 1); /* counts up to n_threads - 1 */
            worker_finished(pool);
            continue;
        }
        for (;;) { /* dynamic: join while the caller has not closed the job */
            if ((uint32_t)(st >> 32) != seen || !(st & G_OPEN)) break;
            if (atomic_compare_exchange_weak(&pool->gate, &st, st + 1)) {
                pool->fn(pool->arg, 1 + (int)(st & G_COUNT), pool->n_threads);
                atomic_fetch_add(&pool->done, 1);
                worker_finished(pool);
                break;
            }
        }
    }
}

ms_pool *ms_pool_new(int n_threads)
{
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads <= 0) n_threads = 1;
    ms_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    const char *spin = getenv("MOESERVE_POOL_SPIN");
    pool->spin = spin ? atol(spin) : SPIN_ITERS;
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

int ms_pool_size(const ms_pool *pool)
{
    return pool ? pool->n_threads : 1;
}

void ms_pool_run(ms_pool *pool, ms_pool_fn fn, void *arg)
{
    if (!pool || pool->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->static_done, 0, memory_order_relaxed);
    uint32_t gen = atomic_load(&pool->generation) + 1;
    atomic_store(&pool->gate, (uint64_t)gen << 32 | G_STATIC);
    atomic_store(&pool->generation, gen);
    if (atomic_load(&pool->sleepers) > 0)
        futex_wake_all(&pool->generation); /* skip the syscall when all spin */
    fn(arg, 0, pool->n_threads);
    caller_wait(pool, &pool->static_done, pool->n_threads - 1);
}

void ms_pool_park(ms_pool *pool)
{
    if (pool && pool->n_threads > 1)
        atomic_store_explicit(&pool->park, atomic_load(&pool->generation), memory_order_relaxed);
}

void ms_pool_run_dynamic(ms_pool *pool, ms_pool_fn fn, void *arg)
{
    if (!pool || pool->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store(&pool->done, 0);
    uint32_t gen = atomic_load(&pool->generation) + 1;
    atomic_store(&pool->gate, (uint64_t)gen << 32 | G_OPEN);
    atomic_store(&pool->generation, gen);
    if (atomic_load(&pool->sleepers) > 0) futex_wake_all(&pool->generation);
    fn(arg, 0, pool->n_threads);
    /* close the job: workers that have not joined by now never will */
    uint64_t st = atomic_fetch_and(&pool->gate, ~G_OPEN);
    int joined = (int)(st & G_COUNT);
    caller_wait(pool, &pool->done, joined);
}
