/* test_attn.c — the paged MLA decode attention kernel against its reference
 * twin: F32, BF16 and FP8 caches, odd page sizes, one to several hundred rows, every
 * ISA path the machine has; long sequences (blocks of up to MS_ATTN_CHUNK rows,
 * the BF16 path and AVX2's FP32 one): the reference, and the same bits at any
 * thread count and batch; an FP8 cache on those paths: the bits of a BF16 cache
 * of the same values;
 * V4's one-KV-head sink attention (ms_attn_mqa) against its reference twin. */
#include "base/util.h"
#include "harness.h"
#include "kernels/attn.h"
#include "kernels/attn_mqa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double rel_err(const float *a, const float *b, int64_t n)
{
    double mx = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs((double)a[i] - b[i]));
        ref = fmax(ref, fabs((double)b[i]));
    }
    return mx / (ref > 0 ? ref : 1);
}

static void run_case(int isa, int exact, ms_dtype dt, int page_size, int64_t S, int64_t H,
                     int64_t row, int64_t vdim, int threads, double *err)
{
    uint64_t rng = 42 + (uint64_t)S;
    int64_t n_pages = (S + page_size - 1) / page_size;
    size_t esz = (size_t)ms_dtype_size(dt);
    uint8_t *mem = malloc((size_t)(n_pages * page_size * row) * esz);
    const void **pages = malloc(sizeof(void *) * (size_t)n_pages);
    float *q = malloc(sizeof(float) * (size_t)(H * row));
    float *ctx = malloc(sizeof(float) * (size_t)(H * vdim)),
          *ref = malloc(sizeof(float) * (size_t)(H * vdim));
    float *scratch = malloc(sizeof(float) * (size_t)ms_attn_scratch_floats(threads, row, H, S));
    /* pages in reverse order in memory: the kernel must follow the table */
    for (int64_t p = 0; p < n_pages; p++)
        pages[p] = mem + (size_t)((n_pages - 1 - p) * page_size * row) * esz;
    for (int64_t s = 0; s < S; s++) {
        uint8_t *r = (uint8_t *)pages[s / page_size] + (size_t)((s % page_size) * row) * esz;
        for (int64_t i = 0; i < row; i++) {
            float v = (float)(2 * ms_rng_uniform(&rng) - 1);
            if (dt == MS_DT_F32)
                ((float *)r)[i] = v;
            else if (dt == MS_DT_F8E4M3)
                r[i] = ms_f32_to_fp8e4m3(v); /* --kv-cache-dtype fp8_e4m3 */
            else
                ((uint16_t *)r)[i] = ms_f32_to_bf16(v);
        }
    }
    for (int64_t i = 0; i < H * row; i++) q[i] = (float)(2 * ms_rng_uniform(&rng) - 1);
    ms_pool *pool = ms_pool_new(threads);
    ms_kctx k = {pool, exact, isa, 0};
    ms_attn_seq a = {pages, page_size, dt, row, S};
    ms_attn_decode(&k, &a, 1, q, H, vdim, 0.3f, ctx, scratch);
    ms_attn_decode_ref(&a, q, H, vdim, 0.3f, ref);
    *err = rel_err(ctx, ref, H * vdim);
    ms_pool_free(pool);
    free(mem), free(pages), free(q), free(ctx), free(ref), free(scratch);
}

TEST(decode_attention_matches_reference)
{
    int best = ms_kernels_detect();
    static const int64_t lens[] = {1, 2, 15, 16, 17, 100, 333};
    for (int isa = MS_ISA_SCALAR; isa <= best; isa++)
        for (int dt = 0; dt < 3; dt++)
            for (size_t li = 0; li < MS_ARRAY_LEN(lens); li++) {
                double err;
                int ps = li % 2 ? 16 : 7;
                const ms_dtype dts[3] = {MS_DT_F32, MS_DT_BF16, MS_DT_F8E4M3};
                run_case(isa, 1, dts[dt], ps, lens[li], 5, 37, 29, 1 + (int)(li % 3), &err);
                CHECKF(err < 1e-5, "isa %d dtype %d S %lld: rel err %g", isa, dt,
                       (long long)lens[li], err);
                /* 19 heads: full groups of 8 and a partial one per head block */
                run_case(isa, 1, dts[dt], ps, lens[li], 19, 45, 37, 1 + (int)(li % 3), &err);
                CHECKF(err < 1e-5, "19 heads, isa %d dtype %d S %lld: rel err %g", isa, dt,
                       (long long)lens[li], err);
            }
}

/* exact = 0 with a BF16 cache and row, vdim multiples of 32 (MLA's shapes):
 * BF16 dot products where the CPU has them, within bf16 rounding of the
 * reference (q and the probabilities rounded once: up to ~6e-3 of max|ctx|
 * with these random rows, whose contexts are small averages);
 * other shapes, F32 caches and CPUs without AVX512_BF16 keep the FP32 path. */
TEST(decode_attention_bf16_auto_mode)
{
    int best = ms_kernels_detect();
    static const int64_t lens[] = {1, 2, 15, 16, 17, 100, 333};
    double worst = 0;
    for (size_t li = 0; li < MS_ARRAY_LEN(lens); li++) {
        double err;
        int ps = li % 2 ? 16 : 7, threads = 1 + (int)(li % 3);
        run_case(best, 0, MS_DT_BF16, ps, lens[li], 16, 288, 256, threads, &err); /* small-v3 */
        CHECKF(err < 2e-2, "H 16 row 288 S %lld: rel err %g", (long long)lens[li], err);
        worst = fmax(worst, err);
        run_case(best, 0, MS_DT_BF16, ps, lens[li], 19, 64, 32, threads, &err); /* partial groups */
        CHECKF(err < 2e-2, "H 19 row 64 S %lld: rel err %g", (long long)lens[li], err);
        worst = fmax(worst, err);
        /* not a multiple of 32, or an F32 cache: the FP32 path, as exact */
        run_case(best, 0, MS_DT_BF16, ps, lens[li], 5, 37, 29, threads, &err);
        CHECKF(err < 1e-5, "row 37 S %lld: rel err %g", (long long)lens[li], err);
        run_case(best, 0, MS_DT_F32, ps, lens[li], 16, 288, 256, threads, &err);
        CHECKF(err < 1e-5, "f32 auto S %lld: rel err %g", (long long)lens[li], err);
        /* an FP8 cache (--kv-cache-dtype fp8_e4m3) in auto mode: the BF16 path where
         * it runs (decode_attention_fp8_as_bf16), else FP32 */
        run_case(best, 0, MS_DT_F8E4M3, ps, lens[li], 16, 288, 256, threads, &err);
        CHECKF(err < (best >= MS_ISA_AVX512BF16 ? 2e-2 : 1e-5), "FP8 cache S %lld: rel err %g",
               (long long)lens[li], err);
    }
    /* the BF16 path does round: if it ran, the error is above FP32's */
    if (best >= MS_ISA_AVX512BF16) CHECKF(worst > 1e-5, "bf16 path not taken (rel err %g)", worst);
}

/* A batch of sequences of different lengths in one call: each sequence's
 * context matches the reference run on it alone, at 1..3 threads. */
TEST(decode_attention_batch)
{
    int best = ms_kernels_detect();
    enum { N = 5, PS = 7 };
    static const int64_t lens[N] = {1, 17, 100, 3, 333};
    const int64_t H = 6, row = 41, vdim = 33;
    uint64_t rng = 7;
    void *mem[N];
    const void **pages[N];
    ms_attn_seq seqs[N];
    float *q = malloc(sizeof(float) * (size_t)(N * H * row));
    float *ctx = malloc(sizeof(float) * (size_t)(N * H * vdim)),
          *ref = malloc(sizeof(float) * (size_t)(H * vdim));
    for (int i = 0; i < N; i++) {
        int64_t np = (lens[i] + PS - 1) / PS;
        mem[i] = malloc(sizeof(uint16_t) * (size_t)(np * PS * row));
        pages[i] = malloc(sizeof(void *) * (size_t)np);
        for (int64_t p = 0; p < np; p++) pages[i][p] = (uint16_t *)mem[i] + p * PS * row;
        for (int64_t e = 0; e < np * PS * row; e++)
            ((uint16_t *)mem[i])[e] = ms_f32_to_bf16((float)(2 * ms_rng_uniform(&rng) - 1));
        seqs[i] = (ms_attn_seq){pages[i], PS, MS_DT_BF16, row, lens[i]};
    }
    for (int64_t e = 0; e < N * H * row; e++) q[e] = (float)(2 * ms_rng_uniform(&rng) - 1);
    for (int threads = 1; threads <= 3; threads++) {
        ms_pool *pool = ms_pool_new(threads);
        ms_kctx k = {pool, 1, best, 0};
        float *scratch =
            malloc(sizeof(float) * (size_t)ms_attn_scratch_floats(threads, row, H, 333));
        ms_attn_decode(&k, seqs, N, q, H, vdim, 0.25f, ctx, scratch);
        for (int i = 0; i < N; i++) {
            ms_attn_decode_ref(&seqs[i], q + i * H * row, H, vdim, 0.25f, ref);
            double err = rel_err(ctx + i * H * vdim, ref, H * vdim);
            CHECKF(err < 1e-5, "threads %d seq %d (S %lld): rel err %g", threads, i,
                   (long long)lens[i], err);
        }
        free(scratch);
        ms_pool_free(pool);
    }
    for (int i = 0; i < N; i++) free(mem[i]), free(pages[i]);
    free(q), free(ctx), free(ref);
}

/* BF16 cache rows [S][row] of uniform values in one page table (page size ps). */
static void fill_bf16(uint64_t *rng, int64_t S, int64_t row, int ps, uint16_t **mem,
                      const void ***pages)
{
    int64_t np = (S + ps - 1) / ps;
    *mem = malloc(sizeof(uint16_t) * (size_t)(np * ps * row));
    *pages = malloc(sizeof(void *) * (size_t)np);
    for (int64_t p = 0; p < np; p++) (*pages)[p] = *mem + (np - 1 - p) * ps * row;
    for (int64_t e = 0; e < np * ps * row; e++)
        (*mem)[e] = ms_f32_to_bf16((float)(2 * ms_rng_uniform(rng) - 1));
}

/* Sequences longer than MS_ATTN_CHUNK in blocks, on the BF16 path (isa
 * MS_ISA_AVX512BF16, within bf16 rounding: tol 2e-2) or in FP32 on AVX2 (isa
 * MS_ISA_AVX2, ms_attn_block_f32: tol 1e-5): a batch of long and short
 * sequences (more blocks than one pool run's partial slots at one thread:
 * several waves) matches the reference per sequence, and gives the same bits
 * at 1, 2 and 3 threads and for each sequence decoded alone.  Scores with a
 * peak in one block test the blocks' weights: a block combined without its
 * max/sum weight misses by far. */
static void long_blocks(int isa, double tol, int64_t H, int PS, int64_t row)
{
    enum { N = 5 };
    /* 4 · MS_ATTN_CHUNK + 37: blocks of MS_ATTN_CHUNK rows; 701 and 1025:
     * four blocks of a quarter each */
    static const int64_t lens[N] = {300, 17, 4 * MS_ATTN_CHUNK + 37, 701, 2 * MS_ATTN_CHUNK + 1};
    const int64_t vdim = row - 32;
    uint64_t rng = 11;
    uint16_t *mem[N];
    const void **pages[N];
    ms_attn_seq seqs[N];
    for (int i = 0; i < N; i++) {
        fill_bf16(&rng, lens[i], row, PS, &mem[i], &pages[i]);
        seqs[i] = (ms_attn_seq){pages[i], PS, MS_DT_BF16, row, lens[i]};
    }
    /* sequence 3: row 650 points along every query of its heads (a peak far
     * from the first block) */
    float *q = malloc(sizeof(float) * (size_t)(N * H * row));
    for (int64_t e = 0; e < N * H * row; e++) q[e] = (float)(2 * ms_rng_uniform(&rng) - 1);
    {
        uint16_t *r = (uint16_t *)pages[3][650 / PS] + (650 % PS) * row;
        for (int64_t c = 0; c < row; c++) r[c] = ms_f32_to_bf16(q[3 * H * row + c] > 0 ? 1 : -1);
    }
    size_t cbytes = sizeof(float) * (size_t)(N * H * vdim);
    float *ctx[3], *one = malloc(cbytes), *ref = malloc(sizeof(float) * (size_t)(H * vdim));
    for (int threads = 1; threads <= 3; threads++) {
        ms_pool *pool = ms_pool_new(threads);
        ms_kctx k = {pool, 0, isa, 0};
        float *scratch =
            malloc(sizeof(float) * (size_t)ms_attn_scratch_floats(threads, row, H, lens[2]));
        ctx[threads - 1] = malloc(cbytes);
        ms_attn_decode(&k, seqs, N, q, H, vdim, 0.06f, ctx[threads - 1], scratch);
        for (int i = 0; i < N; i++) { /* alone: the same bits */
            ms_attn_decode(&k, &seqs[i], 1, q + i * H * row, H, vdim, 0.06f, one, scratch);
            CHECKF(
                !memcmp(one, ctx[threads - 1] + i * H * vdim, sizeof(float) * (size_t)(H * vdim)),
                "threads %d seq %d (S %lld): alone differs from in the batch", threads, i,
                (long long)lens[i]);
        }
        free(scratch);
        ms_pool_free(pool);
        if (threads > 1)
            CHECKF(!memcmp(ctx[0], ctx[threads - 1], cbytes), "threads %d differ from 1", threads);
    }
    for (int i = 0; i < N; i++) {
        ms_attn_decode_ref(&seqs[i], q + i * H * row, H, vdim, 0.06f, ref);
        double err = rel_err(ctx[0] + i * H * vdim, ref, H * vdim);
        CHECKF(err < tol, "isa %d H %lld page %d row %lld seq %d (S %lld): rel err %g", isa,
               (long long)H, PS, (long long)row, i, (long long)lens[i], err);
    }
    for (int t = 0; t < 3; t++) free(ctx[t]);
    for (int i = 0; i < N; i++) free(mem[i]), free(pages[i]);
    free(q), free(one), free(ref);
}

/* H 16 (one zmm of heads in the long blocks' softmax lanes), 5, 21 and 24
 * (padded head groups of 8 and lanes of 16; on AVX2 head groups of 6, 4
 * and 2 in the context); odd last blocks (701, 1025, 2085).
 * Pages of 16 rows keep each step of 16 rows one run in memory; pages of 5
 * and 7 (in reverse order) make the BF16 scores copy the rows first.  Rows
 * of 288 (small-v3) and 576 (V3) have their own inlined forms there, 320 the
 * generic one.  The AVX2 form runs on every CPU the build runs on. */
TEST(decode_attention_long_blocks)
{
    const int bf = ms_kernels_detect() >= MS_ISA_AVX512BF16;
    for (int pass = bf ? 0 : 1; pass < 2; pass++) {
        int isa = pass ? MS_ISA_AVX2 : MS_ISA_AVX512BF16;
        double tol = pass ? 1e-5 : 2e-2;
        long_blocks(isa, tol, 16, 16, 288);
        long_blocks(isa, tol, 5, 16, 288);
        long_blocks(isa, tol, 21, 16, 288);
        long_blocks(isa, tol, 24, 16, 288);
        long_blocks(isa, tol, 16, 5, 288);
        long_blocks(isa, tol, 21, 7, 576);
        long_blocks(isa, tol, 16, 16, 576);
        long_blocks(isa, tol, 24, 5, 320);
        long_blocks(isa, tol, 8, 16, 288); /* small-v3's heads per rank at --tp 2 */
    }
}

/* An FP8 cache on the BF16 path (auto mode, isa MS_ISA_AVX512BF16) or the
 * AVX2 one (MS_ISA_AVX2): its rows widened to bf16 (exact), a batch of short
 * and long sequences (more than MS_ATTN_CHUNK rows: blocks) has the bits of
 * the same batch over a BF16 cache of the same values, at 1, 2 and 3
 * threads, and is within tol of the reference (bf16 rounding; FP32). */
static void fp8_as_bf16(int isa, double tol, int64_t H)
{
    enum { N = 6, PS = 7 };
    static const int64_t lens[N] = {1, 17, MS_ATTN_CHUNK, MS_ATTN_CHUNK + 1, 701, 40};
    const int64_t row = 288, vdim = 256;
    uint64_t rng = 23;
    uint8_t *m8[N];
    uint16_t *m16[N];
    const void **p8[N], **p16[N];
    ms_attn_seq s8[N], s16[N];
    for (int i = 0; i < N; i++) {
        int64_t np = (lens[i] + PS - 1) / PS;
        m8[i] = malloc((size_t)(np * PS * row));
        m16[i] = malloc(sizeof(uint16_t) * (size_t)(np * PS * row));
        p8[i] = malloc(sizeof(void *) * (size_t)np);
        p16[i] = malloc(sizeof(void *) * (size_t)np);
        for (int64_t p = 0; p < np; p++) /* pages in reverse order, as run_case */
            p8[i][p] = m8[i] + (np - 1 - p) * PS * row,
            p16[i][p] = m16[i] + (np - 1 - p) * PS * row;
        for (int64_t e = 0; e < np * PS * row; e++) {
            m8[i][e] = ms_f32_to_fp8e4m3((float)(4 * ms_rng_uniform(&rng) - 2));
            m16[i][e] = ms_f32_to_bf16(ms_fp8e4m3_to_f32(m8[i][e])); /* exact */
        }
        s8[i] = (ms_attn_seq){p8[i], PS, MS_DT_F8E4M3, row, lens[i]};
        s16[i] = (ms_attn_seq){p16[i], PS, MS_DT_BF16, row, lens[i]};
    }
    float *q = malloc(sizeof(float) * (size_t)(N * H * row));
    for (int64_t e = 0; e < N * H * row; e++) q[e] = (float)(2 * ms_rng_uniform(&rng) - 1);
    size_t cbytes = sizeof(float) * (size_t)(N * H * vdim);
    float *c8 = malloc(cbytes), *c16 = malloc(cbytes),
          *ref = malloc(sizeof(float) * (size_t)(H * vdim));
    for (int threads = 1; threads <= 3; threads++) {
        ms_pool *pool = ms_pool_new(threads);
        ms_kctx k = {pool, 0, isa, 0};
        float *scratch =
            malloc(sizeof(float) * (size_t)ms_attn_scratch_floats(threads, row, H, 701));
        memset(c8, 0xff, cbytes);
        ms_attn_decode(&k, s8, N, q, H, vdim, 0.06f, c8, scratch);
        ms_attn_decode(&k, s16, N, q, H, vdim, 0.06f, c16, scratch);
        for (int i = 0; i < N; i++)
            CHECKF(
                !memcmp(c8 + i * H * vdim, c16 + i * H * vdim, sizeof(float) * (size_t)(H * vdim)),
                "H %lld threads %d seq %d (S %lld): FP8 differs from BF16 of the same values",
                (long long)H, threads, i, (long long)lens[i]);
        free(scratch);
        ms_pool_free(pool);
    }
    for (int i = 0; i < N; i++) {
        ms_attn_decode_ref(&s8[i], q + i * H * row, H, vdim, 0.06f, ref);
        double err = rel_err(c8 + i * H * vdim, ref, H * vdim);
        CHECKF(err < tol, "FP8 isa %d H %lld seq %d (S %lld): rel err %g", isa, (long long)H, i,
               (long long)lens[i], err);
    }
    for (int i = 0; i < N; i++) free(m8[i]), free(m16[i]), free(p8[i]), free(p16[i]);
    free(q), free(c8), free(c16), free(ref);
}

TEST(decode_attention_fp8_as_bf16)
{
    if (ms_kernels_detect() >= MS_ISA_AVX512BF16) {
        fp8_as_bf16(MS_ISA_AVX512BF16, 2e-2, 16);
        fp8_as_bf16(MS_ISA_AVX512BF16, 2e-2, 5);
    }
    fp8_as_bf16(MS_ISA_AVX2, 1e-5, 16);
    fp8_as_bf16(MS_ISA_AVX2, 1e-5, 5);
}

/* ms_attn_mqa against ms_attn_mqa_ref: blocks of 8 heads and the single heads
 * past them (H 16, 11, 3), hd whole vectors or not, 1 .. 300 rows scattered in
 * memory, sinks from far below to above the scores; a head range [h0, h1)
 * writes only its heads; a head's bits do not depend on its block's other
 * heads (another head's query changed), nor on a range whose blocks start
 * where [0, H)'s do. */
TEST(mqa_attention_matches_reference)
{
    static const int64_t shapes[][3] = {{16, 128, 300}, {16, 128, 1}, {11, 64, 9},
                                        {3, 64, 40},    {8, 24, 8},   {9, 20, 17}};
    uint64_t rng = 7;
    for (size_t si = 0; si < MS_ARRAY_LEN(shapes); si++) {
        const int64_t H = shapes[si][0], hd = shapes[si][1], n = shapes[si][2];
        float *mem = malloc(sizeof(float) * (size_t)(2 * n * hd)),
              *q = malloc(sizeof(float) * (size_t)(H * hd));
        float *sink = malloc(sizeof(float) * (size_t)H),
              *o = malloc(sizeof(float) * (size_t)(H * hd));
        float *ref = malloc(sizeof(float) * (size_t)(H * hd)),
              *o2 = malloc(sizeof(float) * (size_t)(H * hd));
        float *scr = malloc(sizeof(float) * (size_t)ms_attn_mqa_scratch_floats(n, hd));
        const float **rows = malloc(sizeof(float *) * (size_t)n);
        CHECK(mem && q && sink && o && ref && o2 && scr && rows);
        for (int64_t i = 0; i < 2 * n * hd; i++) mem[i] = (float)(ms_rng_uniform(&rng) * 2 - 1);
        for (int64_t i = 0; i < n; i++) rows[i] = mem + ((i * 7) % (2 * n)) * hd; /* scattered */
        for (int64_t i = 0; i < H * hd; i++) q[i] = (float)(ms_rng_uniform(&rng) * 4 - 2);
        for (int64_t h = 0; h < H; h++)
            sink[h] = (float)(h % 3 == 0 ? -30.0 : h % 3 == 1 ? 0.5 : 6.0);
        const float scale = 1.0f / sqrtf((float)hd);
        ms_attn_mqa(q, hd, rows, n, 0, H, scale, sink, scr, o);
        ms_attn_mqa_ref(q, hd, rows, n, 0, H, scale, sink, scr, ref);
        double e = rel_err(o, ref, H * hd);
        CHECKF(e <= 1e-5, "H %ld hd %ld n %ld: rel %g", (long)H, (long)hd, (long)n, e);
        for (int64_t i = 0; i < H * hd; i++)
            o2[i] = 12345.0f; /* heads [1, H): the others untouched */
        ms_attn_mqa(q, hd, rows, n, 1, H, scale, sink, scr, o2);
        for (int64_t i = 0; i < hd; i++) CHECK(o2[i] == 12345.0f);
        if (H >= 9) { /* head 8 computed in [8, H) and in [0, H): the blocks start at 8 in both */
            ms_attn_mqa(q, hd, rows, n, 8, H, scale, sink, scr, o2);
            CHECK(!memcmp(o2 + 8 * hd, o + 8 * hd, sizeof(float) * (size_t)hd));
        }
        q[hd * (H > 1 ? 1 : 0)] += 1.0f; /* head 1's query: head 0 keeps its bits */
        ms_attn_mqa(q, hd, rows, n, 0, H, scale, sink, scr, o2);
        if (H > 1) CHECK(!memcmp(o2, o, sizeof(float) * (size_t)hd));
        free(mem), free(q), free(sink), free(o), free(ref), free(o2), free(scr), free(rows);
    }
}

int main(void)
{
    RUN(decode_attention_matches_reference);
    RUN(decode_attention_bf16_auto_mode);
    RUN(decode_attention_batch);
    RUN(decode_attention_long_blocks);
    RUN(decode_attention_fp8_as_bf16);
    RUN(mqa_attention_matches_reference);
    return TEST_REPORT();
}
