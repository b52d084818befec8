/* bench_kernels.c — speed of the numeric kernels on this machine.
 *
 * Prints one machine-readable row per configuration (key=value fields):
 *   dram     AVX-512 (or AVX2) streaming read of a >= 1 GiB buffer, GB/s
 *   peak     register-only BF16 dot-product and FP32 FMA rates, GFLOP/s
 *   pool     ms_pool_run round trip with an empty job, µs
 *   matmul   ms_matmul at decode (M = 1) and batch/prefill (M = 16, 64, 512)
 *            shapes for BF16, FP8 and FP4 (e2m1 + per-32 UE8M0; its weight
 *            bytes include the scales); GFLOP/s, weight GB/s, and the reference twin's GFLOP/s
 *            (the reference runs on at most 4 activation rows, 1 rep).
 * Weights rotate through >= 256 MiB of copies so they stream from DRAM, and
 * start 8 bytes past a 64-byte boundary (as safetensors data in an mmap).
 * Every configuration is validated against ms_matmul_ref before it is timed.
 *   --dispatch: BF16 at prefill M (128 .. 2048) on small-v3's and V3's
 *            projection shapes, the tiles (dnnl=0) and oneDNN (dnnl=1)
 *            alternating twice: the measurement behind mm_dnnl.c's MIN_M.
 *   --decode: the decode GEMVs (M = 1, 2, 4, 8) on small-v3/small-v4 shapes
 *            (K = 1024 and 512, 4 MiB of BF16 each) and V3's K = 7168: BF16,
 *            FP8, FP4 through the FP32 kernel (isa=avx512, what ran before
 *            the bf16 one) and FP4 at the best ISA, one after the other, two
 *            rounds: weight GB/s per kernel against the BF16 row of the same
 *            round (x_bf16_gbs, the target: 1.0).
 *   --moe:   one MoE decode token as moe.c issues it, on small-v3/small-v4's
 *            expert shape (hidden 1024, 512 per expert, top-6 of 64, two
 *            layers of experts so the set is far larger than L3): per layer
 *            one batch of the 6 experts' gate and up (M = 1), then one of
 *            their down projections; BF16, FP8 (128x128 scales), FP4 through
 *            the FP32 kernel (isa=avx512) and FP4 at the best ISA, 32 tokens
 *            each in turn, 5 rounds; best round: weight GB/s and x_bf16_gbs.
 * FP8 weights carry the plain-row flags the model loader gives them
 * (ms_mat_f8_scan) wherever a kernel reads them.
 *   --moe32: one batch-32 MoE layer's BF16 experts as moe.c issues them (rows
 *            grouped by expert, M = 1-8 each) against the same experts at M = 1,
 *            layer by layer in turn (bench_moe32 below): x_stream.
 *   --moe32-fp8: the same with FP8 e4m3 experts (block scales, plain-row flags).
 *   --moe-rows: one expert's gate at M = 1..8, DRAM-cold and cache-hot, BF16
 *            then FP8, 1 thread unless --threads (bench_moe_rows below).
 * Usage: bench_kernels [--quick] [--dispatch] [--decode] [--moe] [--moe32] [--moe32-fp8]
 * [--moe-rows] [--prefill]
 *                      [--threads N]
 */
#include "base/threadpool.h"
#include "base/util.h"
#include "kernels/kernels.h"
#include "kernels/probe.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int quick;

/* ---- DRAM read bandwidth (the library's probe, src/kernels/probe.c) ---- */

static void bench_dram(ms_pool *pool, int nt, int isa)
{
    size_t bytes = (size_t)1 << 30;
    double best = ms_probe_read_gbps(pool, bytes, quick ? 2 : 5);
    printf("dram threads=%d simd=%s bytes=%zu read_gbs=%.1f\n", nt,
           isa >= MS_ISA_AVX512 ? "avx512" : "avx2", bytes, best);
}

/* ---- register-only peak ---- */

/* The BF16 dot-product and FP32 FMA peaks from kernels/probe.c (assembly: compiled
 * intrinsics loops kept their accumulators in memory and read a third). */
static void bench_peak(ms_pool *pool, int nt, int isa)
{
    if (isa >= MS_ISA_AVX512BF16)
        printf("peak threads=%d op=vdpbf16ps gflops=%.1f\n", nt, ms_probe_bf16_gflops(pool, 3));
    if (isa >= MS_ISA_AVX512)
        printf("peak threads=%d op=vfmadd231ps gflops=%.1f\n", nt, ms_probe_fma_gflops(pool, 3));
}

/* ---- pool overhead ---- */

static void empty_job(void *arg, int tid, int nt)
{
    (void)arg;
    (void)tid;
    (void)nt;
}

static void bench_pool(ms_pool *pool, int nt)
{
    int reps = 20000;
    for (int i = 0; i < 1000; i++) ms_pool_run(pool, empty_job, NULL);
    double t0 = ms_now_s();
    for (int i = 0; i < reps; i++) ms_pool_run(pool, empty_job, NULL);
    double hot = (ms_now_s() - t0) / reps * 1e6;
    t0 = ms_now_s();
    for (int i = 0; i < reps; i++) ms_pool_run_dynamic(pool, empty_job, NULL);
    double dyn = (ms_now_s() - t0) / reps * 1e6;
    printf("pool threads=%d empty_run_us=%.2f empty_run_dynamic_us=%.2f\n", nt, hot, dyn);
}

/* ---- matmul ---- */

static float frand(uint64_t *s)
{
    return (float)(ms_rng_uniform(s) * 2.0 - 1.0);
}

static double rel_err(const float *a, const float *b, int64_t n)
{
    double mx = 0, mref = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= mx)) mx = d;
        if (fabs(b[i]) > mref) mref = fabs(b[i]);
    }
    return mref > 0 ? mx / mref : mx;
}

/* Weight GB/s of the last bench_matmul row. */
static double last_gbs;

static void bench_matmul(ms_pool *pool, int nt, int isa, ms_dtype dt, int exact, int dnnl,
                         int64_t M, int64_t K, int64_t N)
{
    ms_kernels_set_dnnl(dnnl);
    int64_t min_m = ms_kernels_set_dnnl_min_m(1); /* dnnl=1 rows: oneDNN at every M */
    uint64_t rng = 1234;
    int fp4 = dt == MS_DT_F4E2M1; /* codes then the UE8M0 scales, in each copy */
    size_t codes = (size_t)(N * ms_dtype_bytes(dt, K));
    size_t wbytes = codes + (fp4 ? (size_t)(N * ((K + 31) / 32)) : 0);
    size_t stride = (wbytes + 64 + 4095) & ~(size_t)4095;
    int copies = (int)((((size_t)256 << 20) + wbytes - 1) / wbytes);
    if (copies < 2) copies = 2;
    char *wbuf = ms_alloc_aligned((size_t)copies, stride);
    int64_t sr = (N + 127) / 128, sc = (K + 127) / 128;
    float *scale = malloc(sizeof(float) * (size_t)(sr * sc));
    float *x = malloc(sizeof(float) * (size_t)(M * K));
    float *y = malloc(sizeof(float) * (size_t)(M * N));
    float *ref = malloc(sizeof(float) * (size_t)(M * N));
    if (!wbuf || !scale || !x || !y || !ref) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < sr * sc; i++) scale[i] = (float)(0.001 + 0.01 * ms_rng_uniform(&rng));
    char *w0 = wbuf + 8;                       /* 8-byte aligned, like safetensors data */
    for (size_t i = 0; fp4 && i < wbytes; i++) /* random codes; scales 2^-8 .. 2^-1 */
        ((uint8_t *)w0)[i] =
            i < codes ? (uint8_t)(ms_rng_next(&rng) >> 24) : (uint8_t)(119 + ms_rng_next(&rng) % 8);
    for (int64_t i = 0; !fp4 && i < N * K; i++) {
        float v = frand(&rng);
        if (dt == MS_DT_BF16)
            ((uint16_t *)(void *)w0)[i] = ms_f32_to_bf16(v);
        else if (dt == MS_DT_F8E4M3)
            ((uint8_t *)w0)[i] = ms_f32_to_fp8e4m3(v * 448.0f);
        else
            ((float *)(void *)w0)[i] = v;
    }
    for (int c = 1; c < copies; c++) memcpy(wbuf + (size_t)c * stride + 8, w0, wbytes);
    for (int64_t i = 0; i < M * K; i++) x[i] = frand(&rng);
    ms_mat *W = malloc(sizeof(ms_mat) * (size_t)copies);
    ms_kctx kc = {pool, exact, isa, 0};
    uint8_t *plain = NULL; /* FP8: the loader's plain-row flags, where a kernel reads them */
    if (dt == MS_DT_F8E4M3 && ms_kernels_f8_plain_used(&kc) && (plain = malloc((size_t)N))) {
        ms_mat whole = ms_mat_whole(dt, N, K, w0, scale);
        ms_mat_f8_scan(&whole, plain);
    }
    for (int c = 0; c < copies; c++) {
        char *base = wbuf + (size_t)c * stride + 8;
        W[c] = fp4 ? ms_mat_fp4(N, K, base, (const uint8_t *)base + codes)
                   : ms_mat_whole(dt, N, K, base, dt == MS_DT_F8E4M3 ? scale : NULL);
        W[c].f8_plain = plain;
    }

    /* validate (and time the reference twin) on the first rows */
    int64_t mref = M < 4 ? M : 4;
    double t0 = ms_now_s();
    ms_matmul_ref(ref, N, x, K, mref, &W[0], 0);
    double tref = ms_now_s() - t0;
    t0 = ms_now_s();
    ms_matmul(&kc, y, N, x, K, M, &W[0], 0);
    double first_ms = (ms_now_s() - t0) * 1e3;
    double err = rel_err(y, ref, mref * N);
    int bf = !exact && isa >= MS_ISA_AVX512BF16 && dt != MS_DT_F32; /* bf16 activations */
    const char *status = err <= (bf ? 1e-2 : 1e-5) ? "ok" : "WRONG";

    double flop = 2.0 * (double)M * (double)N * (double)K;
    /* about 40 ms of work per trial at 100 GFLOP/s or 25 GB/s, best of 5 */
    int reps = (int)(0.04 / (flop / 100e9 + (double)wbytes / 25e9));
    if (reps < 2) reps = 2;
    if (reps > 2000) reps = 2000;
    if (quick) reps = reps / 2 + 1;
    for (int i = 0; i < copies; i++) ms_matmul(&kc, y, N, x, K, M, &W[i], 0); /* warm: page in */
    double best = 1e30;
    for (int trial = 0; trial < 5; trial++) {
        t0 = ms_now_s();
        for (int r = 0; r < reps; r++) ms_matmul(&kc, y, N, x, K, M, &W[r % copies], 0);
        double dtm = (ms_now_s() - t0) / reps;
        if (dtm < best) best = dtm;
    }
    double ref_gflops = 2.0 * (double)mref * N * K / tref / 1e9;
    printf("matmul threads=%d isa=%s mode=%s wdtype=%s M=%ld K=%ld N=%ld time_us=%.1f gflops=%.1f "
           "weight_gbs=%.1f ref_gflops=%.3f speedup_vs_ref=%.0f relerr=%.2e check=%s dnnl=%d "
           "first_call_ms=%.2f prepacked_mib=%.0f\n",
           nt, ms_isa_name(isa), exact ? "exact" : "auto", ms_dtype_name(dt), (long)M, (long)K,
           (long)N, best * 1e6, flop / best / 1e9, (double)wbytes / best / 1e9, ref_gflops,
           flop / best / 1e9 / ref_gflops, err, status, dnnl, first_ms,
           (double)ms_kernels_dnnl_bytes() / 1048576.0);
    last_gbs = (double)wbytes / best / 1e9;
    ms_kernels_set_dnnl(0); /* frees the prepacked copies of these weights */
    ms_kernels_set_dnnl_min_m(min_m);
    fflush(stdout);
    free(W);
    free(plain);
    free(x);
    free(y);
    free(ref);
    free(scale);
    ms_free_aligned(wbuf);
}

/* ---- one MoE decode token (--moe) ---- */

enum { MOE_E = 64, MOE_L = 2, MOE_TOPK = 6, MOE_D = 1024, MOE_F = 512 };

/* Experts [MOE_L][MOE_E] of dtype dt (index 3: FP4 too), gate/up [F][D], down [D][F]. */
struct moe_set {
    ms_mat w[MOE_L][MOE_E][3];
    void *buf;
    float *scale;
    uint8_t *plain;
    double bytes_token; /* weight bytes one token reads (top-k of each layer) */
};

static int moe_set_make(struct moe_set *S, ms_dtype dt, const ms_kctx *kc, uint64_t *rng)
{
    int fp4 = dt == MS_DT_F4E2M1;
    size_t codes = (size_t)ms_dtype_bytes(dt, (int64_t)MOE_F * MOE_D);
    size_t mbytes = codes + (fp4 ? (size_t)MOE_F * MOE_D / 32 : 0), n = (size_t)MOE_L * MOE_E * 3;
    size_t stride = (mbytes + 4095) & ~(size_t)4095;
    S->buf = ms_alloc_aligned(n, stride);
    S->scale = malloc(sizeof(float) * 8 * 4);
    S->plain = malloc(n * MOE_D);
    if (!S->buf || !S->scale || !S->plain) return -1;
    for (int i = 0; i < 32; i++) S->scale[i] = (float)(0.001 + 0.01 * ms_rng_uniform(rng));
    for (size_t i = 0; i < n; i++) {
        uint8_t *b = (uint8_t *)S->buf + i * stride;
        for (size_t j = 0; j < mbytes; j++) { /* FP4 scales 2^-8 .. 2^-1; FP8 / BF16 random */
            uint32_t r = (uint32_t)(ms_rng_next(rng) >> 24);
            if (dt == MS_DT_F8E4M3 && (r & 0x78) == 0) r |= 0x08; /* plain codes, as most */
            if (dt == MS_DT_F8E4M3 && (r & 0x7f) == 0x7f) r ^= 1;
            b[j] = fp4 && j >= codes ? (uint8_t)(119 + r % 8) : (uint8_t)r;
        }
        if (dt == MS_DT_BF16) /* finite bf16: clear the exponent's top bit */
            for (size_t j = 1; j < mbytes; j += 2) b[j] &= 0x3f;
        int l = (int)(i / (MOE_E * 3)), e = (int)(i / 3 % MOE_E), p = (int)(i % 3);
        int64_t R = p == 2 ? MOE_D : MOE_F, C = p == 2 ? MOE_F : MOE_D;
        S->w[l][e][p] = fp4 ? ms_mat_fp4(R, C, b, b + codes)
                            : ms_mat_whole(dt, R, C, b, dt == MS_DT_F8E4M3 ? S->scale : NULL);
    }
    if (dt == MS_DT_F8E4M3 && ms_kernels_f8_plain_used(kc))
        for (size_t i = 0; i < n; i++) { /* the loader's flags, MOE_D bytes per matrix */
            ms_mat *W = &S->w[i / (MOE_E * 3)][i / 3 % MOE_E][i % 3];
            ms_mat_f8_scan(W, S->plain + i * MOE_D);
            W->f8_plain = S->plain + i * MOE_D;
        }
    S->bytes_token = (double)MOE_L * MOE_TOPK * 3 * (double)ms_mat_bytes(&S->w[0][0][0]);
    return 0;
}

static void moe_set_free(struct moe_set *S)
{
    ms_free_aligned(S->buf);
    free(S->scale);
    free(S->plain);
}

/* n_tok tokens through the set: seconds. */
static double moe_tokens(const ms_kctx *kc, struct moe_set *S, int n_tok, uint64_t *rng,
                         const float *x, float *g, float *u, float *y)
{
    ms_mm_call c[2 * MOE_TOPK];
    double t0 = ms_now_s();
    for (int t = 0; t < n_tok; t++)
        for (int l = 0; l < MOE_L; l++) {
            int ex[MOE_TOPK];
            for (int j = 0; j < MOE_TOPK; j++) ex[j] = (int)(ms_rng_next(rng) % MOE_E);
            for (int j = 0; j < MOE_TOPK; j++) {
                c[2 * j] =
                    (ms_mm_call){g + j * MOE_F, MOE_F, x, MOE_D, 1, &S->w[l][ex[j]][0], 0, 0};
                c[2 * j + 1] =
                    (ms_mm_call){u + j * MOE_F, MOE_F, x, MOE_D, 1, &S->w[l][ex[j]][1], 0, 0};
            }
            ms_matmul_batch(kc, c, 2 * MOE_TOPK);
            for (int j = 0; j < MOE_TOPK; j++)
                c[j] = (ms_mm_call){
                    y + j * MOE_D, MOE_D, g + j * MOE_F, MOE_F, 1, &S->w[l][ex[j]][2], 0, 0};
            ms_matmul_batch(kc, c, MOE_TOPK);
        }
    return ms_now_s() - t0;
}

static void bench_moe(int nt, int isa)
{
    ms_pool *pool = ms_pool_new(nt);
    uint64_t rng = 4321;
    static const ms_dtype dts[4] = {MS_DT_BF16, MS_DT_F8E4M3, MS_DT_F4E2M1, MS_DT_F4E2M1};
    static const char *names[4] = {"bf16", "fp8", "fp4_f32", "fp4"};
    int isas[4] = {isa, isa, isa > MS_ISA_AVX512 ? MS_ISA_AVX512 : isa, isa};
    struct moe_set S[4];
    float *x = malloc(sizeof(float) * MOE_D), *g = malloc(sizeof(float) * MOE_TOPK * MOE_F);
    float *u = malloc(sizeof(float) * MOE_TOPK * MOE_F),
          *y = malloc(sizeof(float) * MOE_TOPK * MOE_D);
    if (!x || !g || !u || !y) exit(1);
    for (int i = 0; i < MOE_D; i++) x[i] = frand(&rng);
    for (int i = 0; i < MOE_TOPK * MOE_F; i++) g[i] = frand(&rng);
    for (int d = 0; d < 4; d++) {
        ms_kctx kc = {pool, 0, isas[d], 0};
        if (d == 3)
            S[3] = S[2]; /* the same FP4 weights */
        else if (moe_set_make(&S[d], dts[d], &kc, &rng)) {
            fprintf(stderr, "bench_kernels: out of memory\n");
            exit(1);
        }
    }
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    enum { TOK = 32 };
    for (int round = 0; round < 6; round++)
        for (int d = 0; d < 4; d++) {
            ms_kctx kc = {pool, 0, isas[d], 0};
            double t = moe_tokens(&kc, &S[d], TOK, &rng, x, g, u, y) / TOK;
            if (round > 0 && t < best[d]) best[d] = t; /* round 0 pages everything in */
        }
    double g16 = S[0].bytes_token / best[0] / 1e9;
    for (int d = 0; d < 4; d++)
        printf("moe threads=%d isa=%s wdtype=%s experts=%dx%d top=%d token_us=%.1f "
               "bytes_token=%.0f weight_gbs=%.1f x_bf16_gbs=%.2f\n",
               nt, ms_isa_name(isas[d]), names[d], MOE_L, MOE_E, MOE_TOPK, best[d] * 1e6,
               S[d].bytes_token, S[d].bytes_token / best[d] / 1e9,
               S[d].bytes_token / best[d] / 1e9 / g16);
    fflush(stdout);
    for (int d = 0; d < 3; d++) moe_set_free(&S[d]);
    free(x);
    free(g);
    free(u);
    free(y);
    ms_pool_free(pool);
}

/* ---- one batch-32 MoE layer's experts (--moe32) ----
 * 32 tokens drawn top-6 of 64 (distinct), grouped by expert as moe.c does
 * (an expert of n rows is one product of M = n), gate and up of the active
 * experts in one ms_matmul_batch, then their down projections in another;
 * against the same experts at M = 1 (the weight stream of the same bytes),
 * in turn for each draw.  Three sets of experts: all active ones, those of
 * 1-3 rows (the GEMV) and those of 4-8 (the tiles).  x_stream (batch-form
 * GB/s ÷ M = 1 GB/s) is how close the batch's expert products come to
 * streaming. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_moe32(int nt, int isa, ms_dtype wdt)
{
    enum { T = 32, ROWS = T * MOE_TOPK, DRAWS = 24, SETS = 3 };
    static const char *set_name[SETS] = {"all", "rows1-3", "rows4-8"};
    ms_pool *pool = ms_pool_new(nt);
    ms_kctx kc = {pool, 0, isa, 0};
    uint64_t rng = 8642;
    struct moe_set S;
    float *x = malloc(sizeof(float) * ROWS * MOE_D), *g = malloc(sizeof(float) * ROWS * MOE_F);
    float *u = malloc(sizeof(float) * ROWS * MOE_F), *y = malloc(sizeof(float) * ROWS * MOE_D);
    float *ref = malloc(sizeof(float) * 8 * MOE_F);
    if (!x || !g || !u || !y || !ref || moe_set_make(&S, wdt, &kc, &rng)) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < ROWS * MOE_D; i++) x[i] = frand(&rng);
    for (int i = 0; i < ROWS * MOE_F; i++) g[i] = frand(&rng);
    double tm[SETS][2][DRAWS], sum[SETS][2] = {{0}}, bytes[SETS] = {0}, worst = 0;
    int nd = 0, act_sum[SETS] = {0};
    const double mbytes = (double)ms_mat_bytes(&S.w[0][0][0]);
    ms_mm_call c[2 * MOE_E];
    for (int it = 0; it < DRAWS + 2; it++) { /* the first two draws page everything in */
        const int l = it % MOE_L;
        int cnt[MOE_E] = {0};
        for (int t = 0; t < T; t++) {
            int ex[MOE_TOPK];
            for (int j = 0; j < MOE_TOPK;) {
                int e = (int)(ms_rng_next(&rng) % MOE_E), dup = 0;
                for (int q = 0; q < j; q++) dup |= ex[q] == e;
                if (!dup) ex[j++] = e;
            }
            for (int j = 0; j < MOE_TOPK; j++) cnt[ex[j]]++;
        }
        for (int set = 0; set < SETS; set++)
            for (int form = 0; form < 2; form++) { /* 0: the batch's rows per expert, 1: M = 1 */
                int nc = 0, off = 0, act = 0;
                for (int e = 0; e < MOE_E; e++) {
                    int n = cnt[e];
                    if (!n || (set == 1 && n > 3) || (set == 2 && (n < 4 || n > 8))) continue;
                    int64_t m = form ? 1 : n;
                    c[nc++] = (ms_mm_call){
                        g + off * MOE_F, MOE_F, x + off * MOE_D, MOE_D, m, &S.w[l][e][0], 0, 0};
                    c[nc++] = (ms_mm_call){
                        u + off * MOE_F, MOE_F, x + off * MOE_D, MOE_D, m, &S.w[l][e][1], 0, 0};
                    off += n;
                    act++;
                }
                double t0 = ms_now_s();
                ms_matmul_batch(&kc, c, nc);
                for (int i = 0; i < nc / 2; i++) { /* the down projections of the same experts */
                    const ms_mm_call *a = &c[2 * i];
                    int64_t r0 = (a->y - g) / MOE_F;
                    const ms_mat *dw = a->W + 2; /* [l][e][0] -> [l][e][2] */
                    c[i] =
                        (ms_mm_call){y + r0 * MOE_D, MOE_D, g + r0 * MOE_F, MOE_F, a->M, dw, 0, 0};
                }
                ms_matmul_batch(&kc, c, nc / 2);
                double dt = ms_now_s() - t0;
                if (it == 0 && set == 0 &&
                    form == 0) /* check the gate of one expert per row count */
                    for (int e = 0, o = 0, seen[9] = {0}; e < MOE_E; o += cnt[e], e++) {
                        if (!cnt[e] || cnt[e] > 8 || seen[cnt[e]]++) continue;
                        ms_matmul_ref(ref, MOE_F, x + o * MOE_D, MOE_D, cnt[e], &S.w[l][e][0], 0);
                        double err = rel_err(g + o * MOE_F, ref, cnt[e] * MOE_F);
                        worst = err > worst ? err : worst;
                    }
                if (it < 2) continue;
                tm[set][form][nd] = dt;
                sum[set][form] += dt;
                if (form == 0) act_sum[set] += act, bytes[set] += 3.0 * act * mbytes;
            }
        if (it >= 2) nd++;
    }
    if (worst > 2e-2) {
        fprintf(stderr, "bench_kernels: moe32 gate differs from the reference (rel %.3g)\n", worst);
        exit(1);
    }
    for (int set = 0; set < SETS; set++) {
        for (int f = 0; f < 2; f++) qsort(tm[set][f], (size_t)nd, sizeof(double), cmp_double);
        printf("moe32 threads=%d wdtype=%s tokens=%d top=%d experts=%s active_mean=%.1f "
               "layer_ms_median=%.3f stream_layer_ms_median=%.3f weight_gbs=%.1f stream_gbs=%.1f "
               "x_stream=%.3f ref_rel_err=%.1e\n",
               nt, wdt == MS_DT_F8E4M3 ? "fp8" : "bf16", T, MOE_TOPK, set_name[set],
               (double)act_sum[set] / nd, tm[set][0][nd / 2] * 1e3, tm[set][1][nd / 2] * 1e3,
               bytes[set] / sum[set][0] / 1e9, bytes[set] / sum[set][1] / 1e9,
               sum[set][1] / sum[set][0], worst);
    }
    fflush(stdout);
    moe_set_free(&S);
    free(x);
    free(g);
    free(u);
    free(y);
    free(ref);
    ms_pool_free(pool);
}

/* ---- one expert product per row count (--moe-rows) ----
 * An expert's gate [512][1024] at M = 1..8 activation rows, one thread
 * team: cold (each product a different one of the moe_set's 384 matrices,
 * which stream from DRAM) and hot (one matrix again and again, from L2/L3).
 * Hot against cold separates a kernel bound by its instructions (hot no
 * faster than cold) from one bound by the lines it keeps in flight (hot
 * much faster); x_m1 is cold GB/s ÷ M = 1's cold GB/s in the same round. */
static void bench_moe_rows(int nt, int isa, ms_dtype wdt)
{
    enum { NM = MOE_L * MOE_E * 3, REPS = 5, MMAX = 8 };
    ms_pool *pool = ms_pool_new(nt);
    ms_kctx kc = {pool, 0, isa, 0};
    uint64_t rng = 9753;
    struct moe_set S;
    float *x = malloc(sizeof(float) * MMAX * MOE_D), *y = malloc(sizeof(float) * MMAX * MOE_D);
    if (!x || !y || moe_set_make(&S, wdt, &kc, &rng)) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < MMAX * MOE_D; i++) x[i] = frand(&rng);
    const ms_mat *W = &S.w[0][0][0];
    const double mbytes = (double)ms_mat_bytes(W);
    double cold[REPS][MMAX + 1], hot[REPS][MMAX + 1];
    for (int rep = 0; rep < REPS; rep++)
        for (int M = 1; M <= MMAX; M++) {
            for (int h = 0; h < 2; h++) {
                int n = h ? 64 : NM / 3 * 2; /* hot: one matrix 64 times; cold: every gate and up */
                const ms_mat *H = &S.w[rep % MOE_L][rep][0];
                ms_matmul(&kc, y, MOE_F, x, MOE_D, M, H, 0); /* warms H for the hot form */
                double t0 = ms_now_s();
                for (int i = 0; i < n; i++) {
                    const ms_mat *Wi = h ? H : &S.w[i / (2 * MOE_E)][i / 2 % MOE_E][i % 2];
                    ms_matmul(&kc, y, MOE_F, x, MOE_D, M, Wi, 0);
                }
                double gbs = n * mbytes / (ms_now_s() - t0) / 1e9;
                if (h)
                    hot[rep][M] = gbs;
                else
                    cold[rep][M] = gbs;
            }
        }
    for (int M = 1; M <= MMAX; M++) {
        double c[REPS], hh[REPS], r[REPS];
        for (int rep = 0; rep < REPS; rep++)
            c[rep] = cold[rep][M], hh[rep] = hot[rep][M], r[rep] = cold[rep][M] / cold[rep][1];
        qsort(c, REPS, sizeof(double), cmp_double);
        qsort(hh, REPS, sizeof(double), cmp_double);
        qsort(r, REPS, sizeof(double), cmp_double);
        printf("moe_rows threads=%d wdtype=%s M=%d K=%d N=%d cold_gbs_median=%.1f "
               "hot_gbs_median=%.1f x_m1_cold_median=%.3f\n",
               nt, wdt == MS_DT_F8E4M3 ? "fp8" : "bf16", M, MOE_D, MOE_F, c[REPS / 2], hh[REPS / 2],
               r[REPS / 2]);
    }
    fflush(stdout);
    moe_set_free(&S);
    free(x);
    free(y);
    ms_pool_free(pool);
}

/* BF16 bench_matmul over shapes (K, N) × row counts, reps alternating the
 * dispatch (rep & 1: 0 the default path, 1 oneDNN) */
static void bf16_sweep(int nt, int isa, const int64_t (*shp)[2], size_t nshp, const int64_t *ms,
                       size_t nms, int reps)
{
    ms_pool *pool = ms_pool_new(nt);
    for (size_t s = 0; s < nshp; s++)
        for (size_t m = 0; m < nms; m++)
            for (int rep = 0; rep < reps; rep++)
                bench_matmul(pool, nt, isa, MS_DT_BF16, 0, rep & 1, ms[m], shp[s][0], shp[s][1]);
    ms_pool_free(pool);
}

int main(int argc, char **argv)
{
    /* oneDNN's OpenMP threads must sleep between calls, as under moeserve (main.c) */
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
        execv("/proc/self/exe", argv); /* on failure, go on with the default */
    int only_threads = 0, dispatch = 0, decode = 0, moe = 0, moe32 = 0, prefill = 0, mrows = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--dispatch"))
            dispatch = 1;
        else if (!strcmp(argv[i], "--decode"))
            decode = 1;
        else if (!strcmp(argv[i], "--moe"))
            moe = 1;
        else if (!strcmp(argv[i], "--moe32"))
            moe32 = 1;
        else if (!strcmp(argv[i], "--prefill"))
            prefill = 1;
        else if (!strcmp(argv[i], "--moe32-fp8"))
            moe32 = 2;
        else if (!strcmp(argv[i], "--moe-rows"))
            mrows = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            only_threads = atoi(argv[++i]);
    }
    int isa = ms_kernels_detect();
    static const int64_t gemv[][2] = {{512, 512},   {2048, 512},  {4096, 1024},
                                      {7168, 2048}, {2048, 7168}, {7168, 7168}};
    static const int64_t bigm[] = {16, 64, 512};
    if (moe) {
        bench_moe(only_threads ? only_threads : 2, isa);
        return 0;
    }
    if (mrows) {
        bench_moe_rows(only_threads ? only_threads : 1, isa, MS_DT_BF16);
        bench_moe_rows(only_threads ? only_threads : 1, isa, MS_DT_F8E4M3);
        return 0;
    }
    if (moe32) {
        bench_moe32(only_threads ? only_threads : 2, isa, moe32 == 2 ? MS_DT_F8E4M3 : MS_DT_BF16);
        return 0;
    }
    if (decode) { /* K, N: 2048 rows of 1024 (gate+up of 4 small experts), 4096 of 512, V3 */
        static const int64_t shp[][2] = {{1024, 2048}, {512, 4096}, {7168, 2048}};
        static const int64_t dm[] = {1, 2, 4, 8};
        int nt = only_threads ? only_threads : 2;
        ms_pool *pool = ms_pool_new(nt);
        quick = 1;
        bench_dram(pool, nt, isa);
        for (int round = 0; round < 2; round++)
            for (size_t si = 0; si < sizeof shp / sizeof shp[0]; si++)
                for (size_t mi = 0; mi < sizeof dm / sizeof dm[0]; mi++) {
                    int64_t K = shp[si][0], N = shp[si][1], M = dm[mi];
                    bench_matmul(pool, nt, isa, MS_DT_BF16, 0, 0, M, K, N);
                    double g16 = last_gbs;
                    bench_matmul(pool, nt, isa, MS_DT_F8E4M3, 0, 0, M, K, N);
                    double g8 = last_gbs, g4o = 0;
                    if (isa > MS_ISA_AVX512) {
                        bench_matmul(pool, nt, MS_ISA_AVX512, MS_DT_F4E2M1, 0, 0, M, K, N);
                        g4o = last_gbs;
                    }
                    bench_matmul(pool, nt, isa, MS_DT_F4E2M1, 0, 0, M, K, N);
                    printf("decode_gemv round=%d M=%ld K=%ld N=%ld bf16_gbs=%.1f fp8_gbs=%.1f "
                           "fp4_f32_gbs=%.1f fp4_gbs=%.1f x_bf16_gbs fp8=%.2f fp4_f32=%.2f "
                           "fp4=%.2f\n",
                           round, (long)M, (long)K, (long)N, g16, g8, g4o, last_gbs, g8 / g16,
                           g4o / g16, last_gbs / g16);
                    fflush(stdout);
                }
        ms_pool_free(pool);
        return 0;
    }
    if (prefill) { /* a 512-token small-v3 prefill's experts (~48 rows): gate/up, down; 1 thread */
        /* packed panel (default at M >= 16), tiles (MOESERVE_PACK_MIN_M=1000000 in the
         * environment), oneDNN (dnnl=1), alternating */
        static const int64_t shp[][2] = {{1024, 512}, {512, 1024}};
        static const int64_t pm[] = {16, 32, 48, 64};
        quick = 1;
        bf16_sweep(only_threads ? only_threads : 1, isa, shp, 2, pm, 4, 2);
        return 0;
    }
    if (dispatch) { /* K, N: small-v3 q_a, kv_b, o, dense up, dense down; V3 expert gate/up */
        static const int64_t shp[][2] = {{1024, 384},  {256, 2048},  {1024, 1024},
                                         {1024, 2816}, {2816, 1024}, {7168, 2048}};
        static const int64_t dm[] = {128, 256, 512, 2048};
        quick = 1;
        bf16_sweep(only_threads ? only_threads : 2, isa, shp, 6, dm, 4, 4);
        return 0;
    }
    for (int nt = 1; nt <= 2; nt++) {
        if (only_threads && nt != only_threads) continue;
        ms_pool *pool = ms_pool_new(nt);
        bench_pool(pool, nt);
        bench_dram(pool, nt, isa);
        bench_peak(pool, nt, isa);
        for (int d = 0; d < 3; d++) {
            ms_dtype dt = d == 2 ? MS_DT_F4E2M1 : d ? MS_DT_F8E4M3 : MS_DT_BF16;
            for (size_t s = 0; s < sizeof gemv / sizeof gemv[0]; s++) {
                if (quick && s != 3) continue;
                bench_matmul(pool, nt, isa, dt, 0, 0, 1, gemv[s][0], gemv[s][1]);
            }
            bench_matmul(pool, nt, isa, dt, 1, 0, 1, 7168, 2048);
            for (size_t m = 0; m < sizeof bigm / sizeof bigm[0]; m++) {
                bench_matmul(pool, nt, isa, dt, 0, 0, bigm[m], 7168, 2048);
                if (dt == MS_DT_BF16 && bigm[m] >= 48)
                    bench_matmul(pool, nt, isa, dt, 0, 1, bigm[m], 7168, 2048);
                if (!quick) bench_matmul(pool, nt, isa, dt, 1, 0, bigm[m], 7168, 2048);
            }
        }
        ms_pool_free(pool);
    }
    return 0;
}
