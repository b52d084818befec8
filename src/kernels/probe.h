/* probe.h — machine probes for benchmarks: DRAM read bandwidth with the
 * pool's threads (streaming AVX-512 or AVX2 loads over a buffer much larger
 * than the caches).  Main thread only. */
#ifndef MS_KERNELS_PROBE_H
#define MS_KERNELS_PROBE_H

#include "base/threadpool.h"

#include <stddef.h>

/* Best of `reps` passes reading `bytes` (rounded to 4 KiB) with every pool
 * thread; GB/s (1e9 bytes per second), or 0 when the buffer cannot be had. */
double ms_probe_read_gbps(ms_pool *pool, size_t bytes, int reps);

#endif
