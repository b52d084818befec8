/* threadpool.h — the fixed worker-thread pool of one rank.
 *
 * ms_pool_run(pool, fn, arg) calls fn(arg, tid, n_threads) once on each of the
 * pool's n_threads threads (the caller is thread 0) and returns when all are
 * done: a parallel-for where fn splits the work by tid.  Workers spin briefly
 * after a job and then sleep on a futex, so an idle pool uses no CPU; the
 * caller, waiting for workers still in fn, spins as briefly and then sleeps
 * too, so a worker preempted on a loaded machine is waited for without
 * holding a core (MOESERVE_POOL_SPIN: pause iterations before either sleeps,
 * default 20000, ~0.5 ms; 0 sleeps at once.  OMP_WAIT_POLICY does not apply:
 * it is oneDNN's OpenMP team's).
 * Only one thread (the rank's main thread) may call ms_pool_run at a time;
 * fn must not call ms_pool_run.  A NULL pool runs fn(arg, 0, 1) inline.
 */
#ifndef MS_BASE_THREADPOOL_H
#define MS_BASE_THREADPOOL_H

#include <stdint.h>

typedef struct ms_pool ms_pool;
typedef void (*ms_pool_fn)(void *arg, int tid, int n_threads);

/* n_threads <= 0 means all online cores.  Returns NULL on failure. */
ms_pool *ms_pool_new(int n_threads);
void ms_pool_free(ms_pool *pool);
int ms_pool_size(const ms_pool *pool);
void ms_pool_run(ms_pool *pool, ms_pool_fn fn, void *arg);
/* Like ms_pool_run, but fn runs on the caller (tid 0) and on those workers
 * that pick the job up before the caller's own fn returns (tids 1, 2, ...
 * without gaps); the others skip it.  For jobs whose threads claim work from a
 * shared counter: a worker on a busy or oversubscribed core then delays
 * nothing.  Returns when every fn that started has returned. */
void ms_pool_run_dynamic(ms_pool *pool, ms_pool_fn fn, void *arg);

/* Lets idle workers skip the rest of their spin and sleep until the next
 * run: for the caller to call before it hands the cores to other threads
 * (oneDNN's OpenMP team), which a spinning worker would otherwise share a
 * core with.  Caller thread only; a no-op for a NULL or one-thread pool. */
void ms_pool_park(ms_pool *pool);

/* Splits [0, n) into n_threads nearly equal chunks, aligned to `align` items;
 * writes thread tid's half-open range. */
static inline void ms_pool_range(int64_t n, int tid, int n_threads, int64_t align, int64_t *begin,
                                 int64_t *end)
{
    if (align < 1) align = 1;
    int64_t blocks = (n + align - 1) / align;
    int64_t b0 = blocks * tid / n_threads, b1 = blocks * (tid + 1) / n_threads;
    *begin = b0 * align < n ? b0 * align : n;
    *end = b1 * align < n ? b1 * align : n;
}

#endif
