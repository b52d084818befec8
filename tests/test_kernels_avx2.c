/* test_kernels_avx2.c — AVX2 auto mode's own paths against the reference and
 * the exact kernels: which products take the packed panels, the folded FP8
 * GEMV, the one-row GEMVs (and a few rows of x), the int16 FP4 product; each
 * checks its kernel was taken (bits differ from the exact kernel's) and gives
 * the same bits with the pool or without.  Skipped below AVX2.
 */
#include "base/threadpool.h"
#include "harness.h"
#include "kernel_util.h"
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

static int best_isa;
static ms_pool *pool;

/* The AVX2 packed-panel kernel (mm_avx2_pack.c) is what auto mode runs on
 * AVX2 at M >= 32: its sums run in k order in one lane, so its bits differ
 * from the exact kernels' (lanes along k, then a horizontal sum) there, and
 * equal them below 32 (the same kernel).  Its values are checked against the
 * reference in matmul_all_paths (isa avx2, exact 0, M 33..131: views at odd
 * r0/c0, FP8 blocks straddled, K over several 256-column passes, N over
 * several 128-column chunks, M over several 48-row blocks) and, for FP4, in
 * matmul_fp4_all_paths (views with blocks at c0 and past it, part-blocks). */
TEST(matmul_avx2_pack_taken)
{
    if (best_isa < MS_ISA_AVX2) return;
    uint64_t rng = 47;
    const int64_t N = 150, K = 600;
    const ms_dtype dts[] = {MS_DT_BF16, MS_DT_F8E4M3, MS_DT_F32, MS_DT_F16, MS_DT_F4E2M1};
    float *x = malloc(sizeof(float) * (size_t)(64 * K));
    float *ya = malloc(sizeof(float) * (size_t)(64 * N)),
          *ye = malloc(sizeof(float) * (size_t)(64 * N));
    for (int64_t i = 0; i < 64 * K; i++) x[i] = frand(&rng);
    for (size_t di = 0; di < MS_ARRAY_LEN(dts); di++) {
        stored st;
        stored_make(&st, dts[di], N, K, &rng);
        const int64_t Mi[] = {1, 7, 16, 31, 32, 45, 64};
        for (size_t mi = 0; mi < MS_ARRAY_LEN(Mi); mi++) {
            ms_kctx ka = {pool, 0, MS_ISA_AVX2, 0}, ke = {pool, 1, MS_ISA_AVX2, 0};
            ms_matmul(&ka, ya, N, x, K, Mi[mi], &st.whole, 0);
            ms_matmul(&ke, ye, N, x, K, Mi[mi], &st.whole, 0);
            int same = !memcmp(ya, ye, sizeof(float) * (size_t)(Mi[mi] * N));
            /* below 32 FP8 differs in the one-row tiles (odd M: F_FOLD), and
             * rows of at most 2 KiB go one at a time at M = 1 (BF16, F16:
             * M <= 8; FP4: K whole blocks, not 600) */
            const int r1m = dts[di] == MS_DT_F8E4M3 ? 1 : 8;
            int expect =
                Mi[mi] < 32 && !(dts[di] == MS_DT_F8E4M3 && Mi[mi] % 2) &&
                !(Mi[mi] <= r1m && ms_dtype_bytes(dts[di], K) <= 2048 && dts[di] != MS_DT_F4E2M1);
            CHECKF(same == expect, "dt %d M %ld: auto %s the exact kernel's bits", dts[di],
                   (long)Mi[mi], same ? "gives" : "differs from");
            CHECKF(rel_err(ya, ye, Mi[mi], N, N) <= 1e-5, "dt %d M %ld: auto and exact apart",
                   dts[di], (long)Mi[mi]);
        }
        stored_free(&st);
    }
    free(x);
    free(ya);
    free(ye);
}

/* AVX2 auto mode's FP8 GEMV with the block scale folded (mm_f32_tmpl.h,
 * F_FOLD): close to the reference across the activation range it keeps
 * normal (2^-100 .. 2^28), and past it (every row's sum overflows) the exact
 * kernel's bits; taken (the bits differ from the exact kernel's) on plain
 * rows; a view whose rows alternate plain and not gives the same bits with
 * the pool or without (mixed tiles run row by row), the rows without the flag
 * the exact kernel's bits. */
TEST(matmul_avx2_fp8_fold)
{
    if (best_isa < MS_ISA_AVX2) return;
    uint64_t rng = 53;
    const int64_t N = 100, K = 700;
    stored st;
    stored_make(&st, MS_DT_F8E4M3, N, K, &rng);
    for (int64_t r = 0; r < N; r += 3) /* rows with zero or subnormal codes fold as well */
        ((uint8_t *)st.data)[r * K + (r * 13) % K] = (uint8_t)(r % 2 ? 0x80 : 0x83);
    ms_mat_f8_scan(&st.whole, st.plain);
    int n_subn = 0;
    for (int64_t r = 0; r < N; r++) {
        CHECK(st.plain[r] != MS_F8_ROW_NAN);
        n_subn += st.plain[r] == MS_F8_ROW_SUBN;
    }
    CHECK(n_subn >= N / 3);
    float *x = malloc(sizeof(float) * (size_t)K), *ya = malloc(sizeof(float) * (size_t)N);
    float *ye = malloc(sizeof(float) * (size_t)N), *yr = malloc(sizeof(float) * (size_t)N);
    ms_kctx ka = {pool, 0, MS_ISA_AVX2, 0}, ke = {pool, 1, MS_ISA_AVX2, 0},
            k1 = {NULL, 0, MS_ISA_AVX2, 0};
    static const double mags[] = {1.0, 1e-28, 1e-12, 1e4, 1e8, 1e9, 1e20};
    for (size_t mi = 0; mi < MS_ARRAY_LEN(mags); mi++) {
        for (int64_t i = 0; i < K; i++) x[i] = (float)(frand(&rng) * mags[mi]);
        ms_matmul(&ka, ya, N, x, K, 1, &st.whole, 0);
        ms_matmul(&ke, ye, N, x, K, 1, &st.whole, 0);
        ms_matmul_ref(yr, N, x, K, 1, &st.whole, 0);
        int same = !memcmp(ya, ye, sizeof(float) * (size_t)N);
        if (mags[mi] < 0x1p28) { /* activations below 2^28 */
            CHECKF(!same, "mag %g: the folded form was not taken", mags[mi]);
            CHECKF(rel_err(ya, yr, 1, N, N) <= 1e-5, "mag %g: rel %g", mags[mi],
                   rel_err(ya, yr, 1, N, N));
        } else { /* almost every activation at 2^28 or more: each row redone */
            CHECKF(same, "mag %g: overflowed rows not redone unfolded", mags[mi]);
        }
    }
    for (int64_t r = 0; r < N; r += 2) st.plain[r] = MS_F8_ROW_NAN; /* alternate rows: as if NaN */
    for (int64_t i = 0; i < K; i++) x[i] = frand(&rng);
    ms_matmul(&ka, ya, N, x, K, 1, &st.whole, 0);
    ms_matmul(&k1, yr, N, x, K, 1, &st.whole, 0);
    ms_matmul(&ke, ye, N, x, K, 1, &st.whole, 0);
    CHECK(!memcmp(ya, yr, sizeof(float) * (size_t)N));
    for (int64_t r = 0; r < N; r += 2)
        CHECKF(!memcmp(&ya[r], &ye[r], sizeof(float)), "row %ld without the flag", (long)r);
    int differ = 0;
    for (int64_t r = 1; r < N; r += 2) differ += memcmp(&ya[r], &ye[r], sizeof(float)) != 0;
    CHECK(differ > N / 4);
    free(x);
    free(ya);
    free(ye);
    free(yr);
    stored_free(&st);
}

/* AVX2 auto mode's product y = x·Wᵀ on W with M rows of x (x[M][K],
 * y[M][N]), overwrite and accumulate onto y0: close (1e-5) to the reference
 * of xr (x, or x as the kernel rounds it), taken (its bits differ from the
 * exact kernel's), the same bits with the pool or without; "what v" names the
 * case in a failure. */
static void check_auto_rows(const ms_mat *W, int64_t M, const float *x, const float *xr,
                            const float *y0, const char *what, int v)
{
    const int64_t N = W->rows, K = W->cols;
    const size_t bytes = sizeof(float) * (size_t)(M * N);
    ms_kctx ka = {pool, 0, MS_ISA_AVX2, 0}, ke = {pool, 1, MS_ISA_AVX2, 0},
            k1 = {NULL, 0, MS_ISA_AVX2, 0};
    float *ya = malloc(bytes), *ye = malloc(bytes), *y1 = malloc(bytes), *yr = malloc(bytes);
    for (int acc = 0; acc <= 1; acc++) {
        memcpy(ya, y0, bytes);
        memcpy(ye, y0, bytes);
        memcpy(y1, y0, bytes);
        memcpy(yr, y0, bytes);
        ms_matmul(&ka, ya, N, x, K, M, W, acc);
        ms_matmul(&ke, ye, N, x, K, M, W, acc);
        ms_matmul(&k1, y1, N, x, K, M, W, acc);
        ms_matmul_ref(yr, N, xr, K, M, W, acc);
        CHECKF(rel_err(ya, yr, M, N, N) <= 1e-5, "%s %d M %d acc %d: rel %g", what, v, (int)M, acc,
               rel_err(ya, yr, M, N, N));
        CHECKF(memcmp(ya, ye, bytes) != 0, "%s %d M %d acc %d: not taken", what, v, (int)M, acc);
        CHECKF(!memcmp(ya, y1, bytes), "%s %d M %d acc %d: bits follow the pool", what, v, (int)M,
               acc);
    }
    free(ya);
    free(ye);
    free(y1);
    free(yr);
}

/* AVX2 auto mode's one-row GEMV (mm_f32_tmpl.h, rows of at most 2 KiB, one
 * activation row, K whole vectors, FP8 views at c0 % 8 == 0; BF16, F16 and
 * F32 also 3 and 8 rows of x): each dtype close to the reference, overwrite
 * and accumulate, on views whose FP8 blocks start mid-row; taken (bits differ
 * from the exact kernel's); the same bits with the pool or without; FP8 rows
 * flagged NaN and rows whose folded sum overflows give the exact kernel's
 * bits.  Rows longer than 2 KiB (F32 at K = 1024) keep the exact kernel's
 * tiles, bit for bit. */
TEST(matmul_avx2_gemv_one_row)
{
    if (best_isa < MS_ISA_AVX2) return;
    uint64_t rng = 59;
    const int64_t N = 77, K = 512, r0 = 3, c0 = 40; /* FP8: blocks of 88, 128 x 3, 40 columns */
    const ms_dtype dts[] = {MS_DT_BF16, MS_DT_F16, MS_DT_F32, MS_DT_F8E4M3};
    float *x = malloc(sizeof(float) * 1024), *y0 = malloc(sizeof(float) * (size_t)N);
    float *ya = malloc(sizeof(float) * (size_t)N), *ye = malloc(sizeof(float) * (size_t)N);
    float *xm = malloc(sizeof(float) * 8 * K), *ym = malloc(sizeof(float) * 8 * (size_t)N);
    ms_kctx ka = {pool, 0, MS_ISA_AVX2, 0}, ke = {pool, 1, MS_ISA_AVX2, 0};
    for (int64_t i = 0; i < 1024; i++) x[i] = frand(&rng);
    for (int64_t i = 0; i < N; i++) y0[i] = frand(&rng);
    for (int64_t i = 0; i < 8 * K; i++) xm[i] = frand(&rng);
    for (int64_t i = 0; i < 8 * N; i++) ym[i] = frand(&rng);
    for (size_t di = 0; di < MS_ARRAY_LEN(dts); di++) {
        stored st;
        stored_make(&st, dts[di], r0 + N + 5, c0 + K + 24, &rng);
        ms_mat W = ms_mat_slice(&st.whole, r0, N, c0, K);
        check_auto_rows(&W, 1, x, x, y0, "dt", dts[di]);
        if (dts[di] != MS_DT_F8E4M3) { /* 3 and 8 rows of x: one at a time too */
            check_auto_rows(&W, 3, xm, xm, ym, "dt", dts[di]);
            check_auto_rows(&W, 8, xm, xm, ym, "dt", dts[di]);
        }
        if (dts[di] == MS_DT_F32) { /* 4 KiB rows: the tiles */
            ms_mat W2 = ms_mat_slice(&st.whole, r0, N, 0, 256 + K);
            ms_matmul(&ka, ya, N, x, 256 + K, 1, &W2, 0);
            ms_matmul(&ke, ye, N, x, 256 + K, 1, &W2, 0);
            CHECK(!memcmp(ya, ye, sizeof(float) * (size_t)N));
        }
        if (dts[di] == MS_DT_F8E4M3) {
            for (int64_t r = 0; r < N; r += 2) st.plain[r0 + r] = MS_F8_ROW_NAN; /* as if NaN */
            ms_matmul(&ka, ya, N, x, K, 1, &W, 0);
            ms_matmul(&ke, ye, N, x, K, 1, &W, 0);
            int differ = 0;
            for (int64_t r = 0; r < N; r++) {
                int same = !memcmp(&ya[r], &ye[r], sizeof(float));
                if (r % 2 == 0)
                    CHECKF(same, "row %ld flagged NaN", (long)r);
                else
                    differ += !same;
            }
            CHECK(differ > N / 4);
            float *xb = malloc(sizeof(float) * (size_t)K); /* 2^28 and more: every row overflows */
            for (int64_t i = 0; i < K; i++) xb[i] = x[i] * 0x1p40f;
            ms_matmul(&ka, ya, N, xb, K, 1, &W, 0);
            ms_matmul(&ke, ye, N, xb, K, 1, &W, 0);
            CHECK(!memcmp(ya, ye, sizeof(float) * (size_t)N));
            free(xb);
        }
        stored_free(&st);
    }
    free(x);
    free(xm);
    free(ym);
    free(y0);
    free(ya);
    free(ye);
}

/* AVX2 auto mode's FP4 product below 32 rows of x (mm_avx2.c, r1_f4_rows: x
 * held as int16, K and c0 whole 32-column blocks, rows of at most 2 KiB):
 * at 1, 16 and 31 rows close to the reference of x rounded as the kernel
 * holds it, on views (r0, c0 > 0) with whole groups of 8 blocks, blocks past
 * the last group, or both, overwrite and accumulate; taken (bits differ from
 * the exact kernel's); the same bits with the pool or without; a NaN scale
 * byte, in a group or past it, makes its row NaN as in the reference; x with
 * an inf or a NaN, or K not whole blocks, keeps the exact kernel's bits; a
 * batch of products in one run each gets its own x. */
TEST(matmul_avx2_fp4_int16)
{
    if (best_isa < MS_ISA_AVX2) return;
    uint64_t rng = 61;
    static const int64_t shapes[][4] = {
        {77, 512, 3, 32}, {40, 1024, 0, 0}, {33, 96, 5, 64}, {21, 352, 2, 96}};
    ms_kctx ka = {pool, 0, MS_ISA_AVX2, 0}, ke = {pool, 1, MS_ISA_AVX2, 0};
    float *x = malloc(sizeof(float) * 1024), *y0 = malloc(sizeof(float) * 31 * 128);
    float *ya = malloc(sizeof(float) * 128), *ye = malloc(sizeof(float) * 128);
    float *yr = malloc(sizeof(float) * 128), *xm = malloc(sizeof(float) * 31 * 1024);
    for (int64_t i = 0; i < 1024; i++) x[i] = frand(&rng);
    for (int64_t i = 0; i < 31 * 1024; i++) xm[i] = frand(&rng);
    for (int64_t i = 0; i < 31 * 128; i++) y0[i] = frand(&rng);
    for (size_t si = 0; si < MS_ARRAY_LEN(shapes); si++) {
        int64_t N = shapes[si][0], K = shapes[si][1], r0 = shapes[si][2], c0 = shapes[si][3];
        stored st;
        stored_make(&st, MS_DT_F4E2M1, r0 + N + 3, c0 + K + 64, &rng);
        ms_mat W = ms_mat_slice(&st.whole, r0, N, c0, K);
        for (int64_t M = 1; M <= 31; M += 15) { /* 1, 16, 31 rows of x (K apart) */
            float *xr = malloc(sizeof(float) * (size_t)(M * K));
            for (int64_t m = 0; m < M; m++) round_i16_blocks(xr + m * K, xm + m * K, K);
            check_auto_rows(&W, M, xm, xr, y0, "K", (int)K);
            free(xr);
        }
        /* row 2's last block: scale byte 255 (NaN) */
        uint8_t *sb = (uint8_t *)st.scale + (r0 + 2) * st.whole.scale_ld + (c0 + K) / 32 - 1;
        *sb = 0xff;
        ms_matmul(&ka, ya, N, x, K, 1, &W, 0);
        ms_matmul_ref(yr, N, x, K, 1, &W, 0);
        CHECK(isnan(ya[2]) && isnan(yr[2]));
        CHECK(!isnan(ya[1]) && !isnan(ya[3]));
        *sb = 120;
        float keep = x[K / 2];
        for (int bad = 0; bad < 2; bad++) { /* x not finite: the tiles */
            x[K / 2] = bad ? NAN : INFINITY;
            ms_matmul(&ka, ya, N, x, K, 1, &W, 0);
            ms_matmul(&ke, ye, N, x, K, 1, &W, 0);
            CHECKF(!memcmp(ya, ye, sizeof(float) * (size_t)N), "K %d, x %s", (int)K,
                   bad ? "NaN" : "inf");
        }
        x[K / 2] = keep;
        stored_free(&st);
    }
    { /* one run of several products: the permuted x held per run and thread
       * is the one of each product's x and K (two share x, one has another x,
       * one another K at the same address) */
        stored sb[4];
        ms_mat wv[4];
        ms_mm_call calls[4];
        float *x2 = malloc(sizeof(float) * 1024), *yb[4], *ys = malloc(sizeof(float) * 300);
        for (int64_t i = 0; i < 1024; i++) x2[i] = frand(&rng);
        const int64_t Ks[4] = {1024, 1024, 1024, 512};
        const float *xs4[4] = {x, x, x2, x};
        for (int i = 0; i < 4; i++) {
            stored_make(&sb[i], MS_DT_F4E2M1, 300, Ks[i], &rng);
            wv[i] = sb[i].whole;
            yb[i] = malloc(sizeof(float) * 300);
            calls[i] = (ms_mm_call){yb[i], 300, xs4[i], Ks[i], 1, &wv[i], 0, 0};
        }
        ms_matmul_batch(&ka, calls, 4);
        for (int i = 0; i < 4; i++) {
            ms_matmul(&ka, ys, 300, xs4[i], Ks[i], 1, &wv[i], 0);
            CHECKF(!memcmp(ys, yb[i], sizeof(float) * 300), "batched product %d differs", i);
            free(yb[i]);
            stored_free(&sb[i]);
        }
        free(x2);
        free(ys);
    }
    stored st; /* K = 1000: not whole blocks, the exact kernel */
    stored_make(&st, MS_DT_F4E2M1, 20, 1000, &rng);
    ms_matmul(&ka, ya, 20, x, 1000, 1, &st.whole, 0);
    ms_matmul(&ke, ye, 20, x, 1000, 1, &st.whole, 0);
    CHECK(!memcmp(ya, ye, sizeof(float) * 20));
    stored_free(&st);
    free(x);
    free(xm);
    free(y0);
    free(ya);
    free(ye);
    free(yr);
}

int main(void)
{
    best_isa = ms_kernels_detect();
    pool = ms_pool_new(2);
    fprintf(stderr, "best isa: %s\n", ms_isa_name(best_isa));
    RUN(matmul_avx2_pack_taken);
    RUN(matmul_avx2_fp8_fold);
    RUN(matmul_avx2_fp4_int16);
    RUN(matmul_avx2_gemv_one_row);
    ms_kernels_dnnl_clear();
    ms_pool_free(pool);
    return TEST_REPORT();
}
