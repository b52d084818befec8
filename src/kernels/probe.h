/* probe.h — machine probes for benchmarks: DRAM read bandwidth with the
 * pool's threads (streaming AVX-512 or AVX2 loads over a buffer much larger
 * than the caches), and the peak rates of the instructions the matmul
 * kernels use (register-only vdpbf16ps, and vfmadd231ps for CPUs without
 * AVX512_BF16).  Main thread only. */
#ifndef MS_KERNELS_PROBE_H
#define MS_KERNELS_PROBE_H

#include "base/threadpool.h"

#include <stddef.h>

/* Best of `reps` passes reading `bytes` (rounded to 4 KiB) with every pool
 * thread; GB/s (1e9 bytes per second), or 0 when the buffer cannot be had. */
double ms_probe_read_gbps(ms_pool *pool, size_t bytes, int reps);

/* Best of `reps` runs of independent vdpbf16ps chains (24 per thread, no
 * memory traffic) on every pool thread: GFLOP/s (one instruction = 16 lanes
 * x 2 products x 2 flops), or 0 where the kernels do not use AVX512_BF16
 * (ms_kernels_detect). */
double ms_probe_bf16_gflops(ms_pool *pool, int reps);

/* The same for FP32 FMA: 512-bit vfmadd231ps (16 lanes x 2 flops), or the
 * 256-bit one (8 lanes x 2) on a CPU without AVX-512. */
double ms_probe_fma_gflops(ms_pool *pool, int reps);

#endif
