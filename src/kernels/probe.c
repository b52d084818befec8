/* probe.c — DRAM read bandwidth probe (probe.h). */
#include "kernels/probe.h"

#include "base/util.h"
#include "kernels/kernels.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct job {
    const char *buf;
    size_t bytes;
    int avx512;
    volatile uint64_t sink[64];
};

__attribute__((target("avx512f"))) static uint64_t read512(const char *p, size_t n)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
    }
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a0);
}

static uint64_t read256(const char *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0);
}

static void worker(void *arg, int tid, int nt)
{
    struct job *j = arg;
    int64_t b, e;
    ms_pool_range((int64_t)j->bytes, tid, nt, 4096, &b, &e);
    if (e > b)
        j->sink[tid % 64] =
            j->avx512 ? read512(j->buf + b, (size_t)(e - b)) : read256(j->buf + b, (size_t)(e - b));
}

double ms_probe_read_gbps(ms_pool *pool, size_t bytes, int reps)
{
    bytes = (bytes + 4095) & ~(size_t)4095;
    char *buf = aligned_alloc(4096, bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes); /* fault the pages in */
    __builtin_cpu_init();
    struct job j = {.buf = buf, .bytes = bytes, .avx512 = __builtin_cpu_supports("avx512f") != 0};
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = ms_now_s();
        ms_pool_run(pool, worker, &j);
        double gbps = (double)bytes / (ms_now_s() - t0) / 1e9;
        if (gbps > best) best = gbps;
    }
    free(buf);
    return best;
}

/* ---- BF16 dot-product peak ---- */

enum { DP_ITERS = 4000000 };

struct dp_job {
    int fma; /* 0 vdpbf16ps, 1 zmm vfmadd231ps, 2 ymm vfmadd231ps */
    volatile double sink[64];
};

/* 24 independent chains of one instruction in registers, DP_ITERS times:
 * written in assembly because compiled intrinsics with an optimisation
 * barrier measured a third of this rate (register moves around the barrier).
 * zmm30 = zmm31 = 0, so no operand is ever subnormal. */
#define CHAINS(op)                                                                                 \
    "vpxord %%zmm30, %%zmm30, %%zmm30\n\t"                                                         \
    "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"                                                         \
    "1:\n\t" op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11) op(12)      \
        op(13) op(14) op(15) op(16) op(17) op(18) op(19) op(20) op(21) op(22) op(23) "dec %0\n\t"  \
                                                                                     "jnz 1b\n\t"
#define CLOBBERS                                                                                   \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",       \
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20",  \
        "xmm21", "xmm22", "xmm23", "xmm30", "xmm31", "cc"
#define DP1(i)  "vdpbf16ps %%zmm31, %%zmm30, %%zmm" #i "\n\t"
#define FMA1(i) "vfmadd231ps %%zmm31, %%zmm30, %%zmm" #i "\n\t"

/* The chains of vdpbf16ps (j->fma = 0) or vfmadd231ps (1). */
__attribute__((target("avx512f"))) static void chains_worker(void *arg, int tid, int nt)
{
    struct dp_job *j = arg;
    (void)nt;
    long it = DP_ITERS;
    if (j->fma)
        __asm__ volatile(CHAINS(FMA1) : "+r"(it) : : CLOBBERS);
    else
        __asm__ volatile(CHAINS(DP1) : "+r"(it) : : CLOBBERS);
    j->sink[tid % 64] = (double)it;
}

/* The AVX2 form: 12 chains of vfmadd231ps on ymm (ymm14 = ymm15 = 0). */
#define CHAINS_Y(op)                                                                               \
    "vxorps %%ymm14, %%ymm14, %%ymm14\n\t"                                                         \
    "vxorps %%ymm15, %%ymm15, %%ymm15\n\t"                                                         \
    "1:\n\t" op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10)                    \
        op(11) "dec %0\n\t"                                                                        \
               "jnz 1b\n\t"
#define FMA1_Y(i) "vfmadd231ps %%ymm15, %%ymm14, %%ymm" #i "\n\t"

static void chains_worker_avx2(void *arg, int tid, int nt)
{
    struct dp_job *j = arg;
    (void)nt;
    long it = DP_ITERS;
    __asm__ volatile(CHAINS_Y(FMA1_Y)
                     : "+r"(it)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm14", "xmm15", "cc");
    j->sink[tid % 64] = (double)it;
}

/* Best of reps runs of the chains on every pool thread, GFLOP/s with
 * flops_per_insn per instruction (vdpbf16ps: 16 lanes x 2 products x 2 = 64;
 * vfmadd231ps: 16 lanes x 2 = 32). */
static double chains_gflops(ms_pool *pool, int reps, int fma, double flops_per_insn)
{
    struct dp_job j = {.fma = fma};
    double best = 0;
    int nt = ms_pool_size(pool);
    for (int r = 0; r < reps; r++) {
        double t0 = ms_now_s();
        ms_pool_run(pool, fma == 2 ? chains_worker_avx2 : chains_worker, &j);
        double g =
            (double)nt * DP_ITERS * (fma == 2 ? 12 : 24) * flops_per_insn / (ms_now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

double ms_probe_bf16_gflops(ms_pool *pool, int reps)
{
    if (ms_kernels_detect() < MS_ISA_AVX512BF16) return 0; /* honours a probed MOESERVE_ISA */
    return chains_gflops(pool, reps, 0, 64.0);
}

double ms_probe_fma_gflops(ms_pool *pool, int reps)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) /* AVX2 + FMA, the build baseline: 8 lanes x 2 */
        return chains_gflops(pool, reps, 2, 16.0);
    return chains_gflops(pool, reps, 1, 32.0);
}
