/* test_kernels.c — every ISA path of the numeric kernels against the scalar
 * reference twins (ref.c) on random inputs at awkward shapes, and the
 * conversions exhaustively (all bf16 and f16 codes, all 256 e4m3 codes).
 * Paths below the CPU's best ISA are forced through kctx.isa.  The AVX2 auto
 * mode's own paths (which rows take which kernel) are in test_kernels_avx2.c.
 */
#include "base/threadpool.h"
#include "base/util.h"
#include "harness.h"
#include "kernel_util.h"
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

static int best_isa;
static ms_pool *pool;

static int same_f32(float a, float b)
{
    if (a != a && b != b) return 1;
    return memcmp(&a, &b, 4) == 0;
}

TEST(convert_bf16_f16_all_codes)
{
    static uint16_t codes[65536];
    static float out[65536];
    for (int i = 0; i < 65536; i++) codes[i] = (uint16_t)i;
    for (int isa = 0; isa <= best_isa; isa++) {
        ms_cvt_to_f32(isa, MS_DT_BF16, codes, out, 65536);
        for (int i = 0; i < 65536; i++)
            CHECKF(same_f32(out[i], ms_bf16_to_f32((uint16_t)i)), "isa %d bf16 %04x", isa, i);
        ms_cvt_to_f32(isa, MS_DT_F16, codes, out, 65536);
        for (int i = 0; i < 65536; i++) {
            CHECKF(same_f32(out[i], ms_f16_to_f32((uint16_t)i)), "isa %d f16 %04x", isa, i);
            /* round trip through the writer for every finite code */
            if ((i & 0x7c00) != 0x7c00) CHECK(ms_f32_to_f16(out[i]) == (uint16_t)i);
        }
        /* bf16 codes as f32 round-trip exactly; halfway cases round to even */
        static float f[65536];
        static uint16_t back[65536];
        for (int i = 0; i < 65536; i++) f[i] = ms_bf16_to_f32((uint16_t)i);
        ms_cvt_f32_to_bf16(isa, f, back, 65536);
        for (int i = 0; i < 65536; i++) {
            int exp = (i >> 7) & 0xff;
            if (exp == 0 && (i & 0x7f)) continue; /* denormal: AVX512_BF16 flushes to 0 */
            if (exp == 0xff && (i & 0x7f)) {
                CHECK((back[i] & 0x7fc0) == 0x7fc0); /* NaN stays a quiet NaN */
                continue;
            }
            CHECKF(back[i] == i, "isa %d bf16 %04x -> %04x", isa, i, back[i]);
        }
        for (int i = 0; i < 65536; i++) { /* halfway between code i and i+1 */
            uint32_t u = ((uint32_t)i << 16) | 0x8000u;
            memcpy(&f[i], &u, 4);
        }
        ms_cvt_f32_to_bf16(isa, f, back, 65536);
        for (int i = 0; i < 65536; i++) {
            int exp = (i >> 7) & 0xff;
            if (exp == 0 || exp == 0xff) continue;
            CHECKF(back[i] == ms_f32_to_bf16(f[i]), "isa %d halfway %04x", isa, i);
            CHECK(back[i] == ((i & 1) ? i + 1 : i));
        }
    }
}

TEST(convert_e4m3_all_codes)
{
    uint8_t codes[256 + 7];
    float out[256 + 7];
    uint16_t bf[256 + 7];
    for (int i = 0; i < 256 + 7; i++) codes[i] = (uint8_t)i;
    /* the reference itself: known values */
    CHECK(ms_fp8e4m3_to_f32(0x7e) == 448.0f && ms_fp8e4m3_to_f32(0xfe) == -448.0f);
    CHECK(ms_fp8e4m3_to_f32(0x01) == 0x1p-9f && ms_fp8e4m3_to_f32(0x08) == 0x1p-6f);
    CHECK(ms_fp8e4m3_to_f32(0x38) == 1.0f && ms_fp8e4m3_to_f32(0x80) == 0.0f);
    float nanv = ms_fp8e4m3_to_f32(0x7f);
    CHECK(nanv != nanv);
    for (int i = 0; i < 256; i++)
        if ((i & 0x7f) != 0x7f)
            CHECK(ms_f32_to_fp8e4m3(ms_fp8e4m3_to_f32((uint8_t)i)) == i ||
                  (i == 0x80 && ms_f32_to_fp8e4m3(-0.0f) == 0x80));
    for (int isa = 0; isa <= best_isa; isa++) {
        ms_cvt_to_f32(isa, MS_DT_F8E4M3, codes, out, 256 + 7); /* odd length: tails */
        for (int i = 0; i < 256 + 7; i++)
            CHECKF(same_f32(out[i], ms_fp8e4m3_to_f32((uint8_t)i)), "isa %d e4m3 %02x", isa, i);
        for (int off = 0; off < 3; off++) {
            ms_cvt_fp8_to_bf16(isa, codes + off, bf, 256 + 7 - off);
            for (int i = 0; i < 256 + 7 - off; i++) {
                uint8_t c = codes[i + off];
                CHECKF(bf[i] == ms_f32_to_bf16(ms_fp8e4m3_to_f32(c)), "isa %d e4m3 %02x", isa, c);
                CHECK(ms_bf16_to_f32(bf[i]) == ms_fp8e4m3_to_f32(c) || (c & 0x7f) == 0x7f);
            }
        }
    }
}

/* ---- matmul ---- */

/* What the BF16-activation path computes, in double: activations rounded to
 * bf16 after multiplying by the FP8 block scale of the weight they meet
 * (BF16 weights: scale 1).  nn: y = x·W (W[k][n]), else y = x·Wᵀ (W[n][k]). */
static void emulate_bf16(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
                         const ms_mat *W, int accumulate, int nn)
{
    int64_t N = nn ? W->cols : W->rows, K = nn ? W->rows : W->cols;
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) {
                int64_t r = nn ? k : n, c = nn ? n : k;
                float s = 1.0f, w;
                if (W->dtype == MS_DT_F8E4M3) {
                    s = W->scale[((W->r0 + r) / 128) * W->scale_ld + (W->c0 + c) / 128];
                    w = ms_fp8e4m3_to_f32(((const uint8_t *)W->data)[r * W->ld + c]);
                } else {
                    w = ms_mat_get(W, r, c);
                }
                acc += (double)ms_round_bf16(x[i * ldx + k] * s) * (double)w;
            }
            y[i * ldy + n] = accumulate ? y[i * ldy + n] + (float)acc : (float)acc;
        }
}

/* Whether ms_matmul takes that GEMV (AVX2 auto mode, FP4, below the packed
 * panels' 32 rows, K and c0 whole blocks, rows of at most 2 KiB). */
static int takes_i16_fp4(const ms_mat *W, int isa, int exact, int64_t M, int nn)
{
    return !nn && !exact && isa == MS_ISA_AVX2 && M < 32 && W->dtype == MS_DT_F4E2M1 &&
           W->cols % 32 == 0 && W->c0 % 32 == 0 && W->cols <= 4096;
}

static const int64_t Ms[] = {1,  2,  3,  5,  7,   8,
                             16, 17, 33, 34, 100, 131}; /* 5-8: two tile passes of <= 4 rows */

/* One product y = x·Wᵀ (nn: x·W) with M activation rows, on every ISA in
 * exact and auto mode, against the double reference (1e-5; 1e-2 where auto
 * mode takes the BF16-activation kernel, bf_auto, and then against its bf16
 * emulation at 1e-5; 1e-4 where it takes AVX2's int16-activation FP4 GEMV,
 * and then against the reference of x so rounded at 1e-5); columns past N
 * untouched.  Adds the cases run to
 * *n_cases; a failed check marks the running test failed. */
static void check_product(const ms_mat *W, int nn, int64_t M, int bf_auto, uint64_t *rng,
                          int *n_cases)
{
    int64_t N = nn ? W->cols : W->rows, K = nn ? W->rows : W->cols, ldx = K + 3, ldy = N + 5;
    float *x = malloc(sizeof(float) * (size_t)(M * ldx));
    float *y0 = malloc(sizeof(float) * (size_t)(M * ldy));
    float *ref = malloc(sizeof(float) * (size_t)(M * ldy));
    float *emu = malloc(sizeof(float) * (size_t)(M * ldy));
    float *y = malloc(sizeof(float) * (size_t)(M * ldy));
    float *xq = malloc(sizeof(float) * (size_t)(M * ldx)),
          *refq = malloc(sizeof(float) * (size_t)(M * ldy));
    for (int64_t i = 0; i < M * ldx; i++) x[i] = frand(rng);
    for (int64_t i = 0; i < M * ldy; i++) y0[i] = frand(rng);
    for (int64_t i = 0; i < M && K % 32 == 0; i++) round_i16_blocks(xq + i * ldx, x + i * ldx, K);
    for (int acc = 0; acc <= 1; acc++) {
        memcpy(refq, y0, sizeof(float) * (size_t)(M * ldy));
        if (K % 32 == 0 && !nn) ms_matmul_ref(refq, ldy, xq, ldx, M, W, acc);
        memcpy(ref, y0, sizeof(float) * (size_t)(M * ldy));
        (nn ? ms_matmul_nn_ref : ms_matmul_ref)(ref, ldy, x, ldx, M, W, acc);
        memcpy(emu, y0, sizeof(float) * (size_t)(M * ldy));
        emulate_bf16(emu, ldy, x, ldx, M, W, acc, nn);
        for (int isa = 0; isa <= best_isa; isa++)
            for (int exact = 0; exact <= 1; exact++) {
                ms_kctx kc = {pool, exact, isa, 0};
                memcpy(y, y0, sizeof(float) * (size_t)(M * ldy));
                (nn ? ms_matmul_nn : ms_matmul)(&kc, y, ldy, x, ldx, M, W, acc);
                int bf = !exact && isa >= MS_ISA_AVX512BF16 && bf_auto;
                int i16 = takes_i16_fp4(W, isa, exact, M, nn);
                double e = rel_err(y, ref, M, N, ldy);
                CHECKF(e <= (bf    ? 1e-2
                             : i16 ? 1e-4
                                   : 1e-5),
                       "nn %d isa %d exact %d dt %d M %ld N %ld K %ld acc %d: rel %g", nn, isa,
                       exact, W->dtype, (long)M, (long)N, (long)K, acc, e);
                if (i16)
                    CHECKF(rel_err(y, refq, M, N, ldy) <= 1e-5, "int16 x, N %ld K %ld: rel %g",
                           (long)N, (long)K, rel_err(y, refq, M, N, ldy));
                if (bf) {
                    double e2 = rel_err(y, emu, M, N, ldy);
                    CHECKF(e2 <= 1e-5, "nn %d bf16 emulation dt %d M %ld N %ld K %ld: rel %g", nn,
                           W->dtype, (long)M, (long)N, (long)K, e2);
                }
                for (int64_t i = 0; i < M; i++) /* padding untouched */
                    for (int64_t j = N; j < ldy; j++) CHECK(y[i * ldy + j] == y0[i * ldy + j]);
                (*n_cases)++;
            }
    }
    free(x);
    free(y0);
    free(ref);
    free(emu);
    free(y);
    free(xq);
    free(refq);
}

/* ms_dtype_find_nonfinite against the scalar conversions, every code of the
 * 8- and 16-bit types, at each position of an unaligned buffer's block */
TEST(find_nonfinite_all_codes)
{
    static unsigned char buf[3 * 4 * 5000 + 1];
    for (int dt = MS_DT_F32; dt <= MS_DT_F8E4M3; dt++) {
        int esz = ms_dtype_size((ms_dtype)dt), bad = 0;
        uint32_t n_codes = dt == MS_DT_F32 ? 1u << 16 : dt == MS_DT_F8E4M3 ? 256 : 1u << 16;
        for (uint32_t code = 0; code < n_codes; code++) {
            uint32_t bits = dt == MS_DT_F32 ? code << 16 | (code & 0xffff) : code;
            float f;
            if (dt == MS_DT_F32)
                memcpy(&f, &bits, 4);
            else if (dt == MS_DT_BF16)
                f = ms_bf16_to_f32((uint16_t)bits);
            else if (dt == MS_DT_F16)
                f = ms_f16_to_f32((uint16_t)bits);
            else
                f = ms_fp8e4m3_to_f32((uint8_t)bits);
            int64_t n = 5000, at = (int64_t)(code * 7919u % 5000u);
            memset(buf, 0, sizeof buf);
            memcpy(buf + 1 + at * esz, &bits, (size_t)esz);
            int64_t got = ms_dtype_find_nonfinite((ms_dtype)dt, buf + 1, n);
            if (got != (isfinite(f) ? -1 : at)) bad++;
        }
        CHECKF(bad == 0, "dtype %d: %d codes wrong", dt, bad);
    }
    CHECK(ms_dtype_find_nonfinite(MS_DT_I32, buf, 10) == -1);
}

TEST(matmul_all_paths)
{
    uint64_t rng = 42;
    /* (N, K, r0, c0): view shapes and origins inside a larger stored matrix */
    static const int64_t shapes[][4] = {
        {37, 300, 0, 0},    {130, 257, 71, 133}, {5, 1, 3, 0}, {19, 61, 129, 255},
        {256, 520, 0, 128}, {24, 2200, 5, 131}, /* K over two of mm_bf16.c's column passes, a tail
                                                   in the third */
    };
    const ms_dtype dts[] = {MS_DT_F32, MS_DT_BF16, MS_DT_F16, MS_DT_F8E4M3};
    int n_cases = 0;
    for (size_t si = 0; si < MS_ARRAY_LEN(shapes); si++)
        for (size_t di = 0; di < MS_ARRAY_LEN(dts); di++) {
            int64_t N = shapes[si][0], K = shapes[si][1], r0 = shapes[si][2], c0 = shapes[si][3];
            stored st;
            stored_make(&st, dts[di], r0 + N + 9, c0 + K + 11, &rng);
            ms_mat W = ms_mat_slice(&st.whole, r0, N, c0, K);
            for (size_t mi = 0; mi < MS_ARRAY_LEN(Ms); mi++) {
                if (Ms[mi] > 17 && si != 1 && si != 4 && si != 5) continue; /* keep it fast */
                check_product(&W, 0, Ms[mi], dts[di] == MS_DT_BF16 || dts[di] == MS_DT_F8E4M3, &rng,
                              &n_cases);
                if (th_cur_failed) return;
            }
            stored_free(&st);
        }
    CHECK(n_cases > 100);
}

/* Dequantisation by definition (arch.md §0.7, DeepSeek's convert.py):
 * FP4_TABLE[code] · 2^(e - 127) in f32, UE8M0 255 = NaN, 0 = 2^-127. */
static float fp4_def(int code, int e)
{
    static const double t[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6};
    if (e == 255) return NAN;
    return (float)t[code] * (float)ldexp(1.0, e - 127);
}

/* Every e2m1 code × every UE8M0 exponent, through ms_mat_get (both nibble
 * positions), the kernels (one-hot activations pick single weights; every
 * ISA, exact and auto) and the e2m1 writer. */
TEST(fp4_e8m0_all_codes)
{
    for (int e = 0; e < 256; e++) {
        float v = ms_e8m0_to_f32((uint8_t)e), d = e == 255 ? NAN : (float)ldexp(1.0, e - 127);
        CHECKF(same_f32(v, d), "e8m0 %d", e);
    }
    /* W[e][k]: row e has scale exponent e in both 32-column blocks; column k
     * holds code k % 16 (k < 32: low nibbles at even k, high at odd k) */
    enum { R = 256, C = 64 };
    static uint8_t packed[R * C / 2], sc[R * 2];
    for (int r = 0; r < R; r++) {
        sc[2 * r] = sc[2 * r + 1] = (uint8_t)r;
        for (int k = 0; k < C; k += 2)
            packed[r * C / 2 + k / 2] = (uint8_t)((k % 16) | ((k + 1) % 16) << 4);
    }
    ms_mat W = ms_mat_fp4(R, C, packed, sc);
    int bad = 0;
    for (int r = 0; r < R; r++)
        for (int k = 0; k < C; k++)
            if (!same_f32(ms_mat_get(&W, r, k), fp4_def(k % 16, r))) bad++;
    CHECKF(bad == 0, "%d of %d FP4 values differ from the definition", bad, R * C);
    /* kernels: x = identity rows, so y[m][r] = W[r][m] (one product each).
     * Not at exponents 253 and 254, where code × scale overflows f32 for some
     * codes: the exact kernels (like ms_matmul_ref) then meet 0 · inf = NaN in
     * the other columns, the auto-mode kernel scales sums (as DeepSeek's
     * fp4_gemm does) and overflows only where a sum does. */
    static float x[C * C], y[C * R];
    for (int i = 0; i < C * C; i++) x[i] = i / C == i % C ? 1.0f : 0.0f;
    for (int isa = 0; isa <= best_isa; isa++)
        for (int exact = 0; exact <= 1; exact++) {
            ms_kctx kc = {pool, exact, isa, 0};
            ms_matmul(&kc, y, R, x, C, C, &W, 0);
            int nbad = 0;
            for (int m = 0; m < C; m++)
                for (int r = 0; r < R; r++) {
                    if (r == 253 || r == 254) continue;
                    float want = fp4_def(m % 16, r);
                    if (!(same_f32(y[m * R + r], want) || (want == 0 && y[m * R + r] == 0))) nbad++;
                }
            CHECKF(nbad == 0, "isa %d exact %d: %d FP4 kernel values differ", isa, exact, nbad);
        }
    for (int c = 0; c < 16; c++) { /* the writer inverts every code (8: -0, which is code 8) */
        float f = ms_fp4e2m1_to_f32((uint8_t)c);
        uint8_t back = ms_f32_to_fp4e2m1(c == 8 ? -0.0f : f);
        CHECKF(back == c, "e2m1 %d -> %g -> %d", c, (double)f, back);
    }
    /* ties to even and saturation */
    CHECK(ms_f32_to_fp4e2m1(0.25f) == 0 && ms_f32_to_fp4e2m1(0.75f) == 2 &&
          ms_f32_to_fp4e2m1(1.25f) == 2 && ms_f32_to_fp4e2m1(1.75f) == 4 &&
          ms_f32_to_fp4e2m1(2.5f) == 4 && ms_f32_to_fp4e2m1(3.5f) == 6 &&
          ms_f32_to_fp4e2m1(5.0f) == 6 && ms_f32_to_fp4e2m1(100.0f) == 7 &&
          ms_f32_to_fp4e2m1(-0.3f) == 9);
}

/* FP4 products at ragged shapes, on every ISA in exact and auto mode,
 * against ms_matmul_ref (1e-5; in auto mode on AVX512_BF16 1e-2, and 1e-5
 * against the bf16 emulation): views at c0 % 32 == 0 (the auto-mode AVX-512
 * kernels) and at other even columns (the exact kernels), K over several
 * 128-column chunks with a tail, partial 32-column scale blocks, M from 1
 * over the 4-row groups (1, 2, 3, 7, 16, 17, ...). */
TEST(matmul_fp4_all_paths)
{
    uint64_t rng = 99;
    static const int64_t shapes[][4] = {
        {37, 256, 0, 0},  {130, 300, 3, 32}, {5, 2, 1, 0},     {19, 62, 129, 66},
        {9, 2200, 5, 64}, {64, 1024, 0, 0},  {24, 130, 7, 10},
    };
    int n_cases = 0;
    for (size_t si = 0; si < MS_ARRAY_LEN(shapes); si++) {
        int64_t N = shapes[si][0], K = shapes[si][1], r0 = shapes[si][2], c0 = shapes[si][3];
        stored st;
        stored_make(&st, MS_DT_F4E2M1, r0 + N + 9, c0 + K + 38, &rng);
        ms_mat W = ms_mat_slice(&st.whole, r0, N, c0, K);
        for (size_t mi = 0; mi < MS_ARRAY_LEN(Ms); mi++) {
            if (Ms[mi] > 17 && si != 1 && si != 4 && si != 6) continue; /* keep it fast */
            check_product(&W, 0, Ms[mi], c0 % 32 == 0, &rng, &n_cases);
            if (th_cur_failed) return;
        }
        if (si == 1) check_product(&W, 1, 3, 0, &rng, &n_cases); /* x·W: the scalar path */
        stored_free(&st);
    }
    CHECK(n_cases > 50);
}

TEST(matmul_nn_all_paths)
{
    uint64_t rng = 7;
    /* W view [K rows][N cols] at (r0, c0); in auto mode FP8 views at
     * c0 % 64 == 0 take the BF16-activation kernel, the rest the exact one */
    static const int64_t shapes[][4] = {{300, 37, 0, 0},
                                        {257, 130, 71, 133},
                                        {64, 200, 128, 5},
                                        {64, 256, 128, 128},
                                        {65, 70, 3, 64}};
    const ms_dtype dts[] = {MS_DT_F32, MS_DT_BF16, MS_DT_F16, MS_DT_F8E4M3};
    int n_cases = 0;
    for (size_t si = 0; si < MS_ARRAY_LEN(shapes); si++)
        for (size_t di = 0; di < MS_ARRAY_LEN(dts); di++) {
            int64_t K = shapes[si][0], N = shapes[si][1], r0 = shapes[si][2], c0 = shapes[si][3];
            stored st;
            stored_make(&st, dts[di], r0 + K + 3, c0 + N + 70, &rng);
            ms_mat W = ms_mat_slice(&st.whole, r0, K, c0, N);
            for (size_t mi = 0; mi < MS_ARRAY_LEN(Ms); mi++) {
                check_product(&W, 1, Ms[mi], dts[di] == MS_DT_F8E4M3 && c0 % 64 == 0, &rng,
                              &n_cases);
                if (th_cur_failed) return;
            }
            stored_free(&st);
        }
    CHECK(n_cases > 100);
}

/* FP8 rows with and without zero, subnormal and NaN codes: the plain-row
 * scan matches its reference twin; with the flags set, rows that are plain
 * take the conversion without tables (AVX-512 without BF16: into f32; with
 * AVX512_BF16: into bf16, in the GEMV and the tiles) and the others the
 * tables, in x·Wᵀ and in x·W, and both match the reference (a NaN code gives
 * NaN where it is used only) and give the same bits as with no flags (every
 * row through the tables); views sliced from the middle of the matrix index
 * the flags through r0. */
TEST(matmul_fp8_plain_rows)
{
    uint64_t rng = 99;
    const int64_t R = 40, C = 300; /* C: a tail past the 64-code groups */
    stored st;
    stored_make(&st, MS_DT_F8E4M3, R, C, &rng);
    uint8_t *codes = st.data;
    static const uint8_t special[] = {0x00, 0x80, 0x01, 0x87, 0x7f, 0xff, 0x7e, 0xfe, 0x08};
    for (int64_t r = 0; r < R; r += 3) /* every third row one special code */
        codes[r * C + (r * 37) % C] = special[(r / 3) % MS_ARRAY_LEN(special)];
    uint8_t plain[40], ref[40];
    ms_mat_f8_scan(&st.whole, plain);
    ms_mat_f8_scan_ref(&st.whole, ref);
    int n_class[3] = {0, 0, 0};
    for (int64_t r = 0; r < R; r++) {
        CHECKF(plain[r] == ref[r], "row %ld: %d vs %d", (long)r, plain[r], ref[r]);
        n_class[plain[r] % 3]++;
    }
    /* every class present (0x7e, 0xfe, 0x08 are plain; 0x00, 0x80, 0x01, 0x87 subnormal) */
    CHECK(n_class[MS_F8_ROW_PLAIN] > 10 && n_class[MS_F8_ROW_SUBN] > 3 &&
          n_class[MS_F8_ROW_NAN] > 1);
    memcpy(st.plain, plain, sizeof plain);
    int isas[2] = {MS_ISA_AVX512 <= best_isa ? MS_ISA_AVX512 : best_isa, best_isa};
    int n_isa = best_isa >= MS_ISA_AVX512BF16 ? 2 : 1;
    int64_t rs[][2] = {{0, R}, {5, 30}}; /* whole, and rows 5..34 */
    for (int ii = 0; ii < n_isa; ii++)
        for (size_t vi = 0; vi < MS_ARRAY_LEN(rs); vi++) {
            ms_mat W = ms_mat_slice(&st.whole, rs[vi][0], rs[vi][1], 0, C);
            ms_mat Wt = W; /* the same rows without flags: all through the tables */
            Wt.f8_plain = NULL;
            /* x·Wᵀ at M = 1, 3 and 20 (the gemvs and the tiles), x·W at 1 and 5 */
            static const int64_t cases[][2] = {{0, 1}, {0, 3}, {0, 20}, {1, 1}, {1, 5}};
            const int bf = isas[ii] >= MS_ISA_AVX512BF16; /* bf16 activations */
            for (size_t ci = 0; ci < MS_ARRAY_LEN(cases); ci++) {
                int nn = (int)cases[ci][0];
                int64_t M = cases[ci][1], K = nn ? W.rows : C, N = nn ? C : W.rows;
                float *x = malloc(sizeof(float) * (size_t)(M * K));
                float *y = malloc(sizeof(float) * (size_t)(M * N));
                float *yt = malloc(sizeof(float) * (size_t)(M * N));
                float *yr = malloc(sizeof(float) * (size_t)(M * N));
                for (int64_t i = 0; i < M * K; i++) x[i] = frand(&rng);
                ms_kctx kc = {pool, 0, isas[ii], 0};
                (nn ? ms_matmul_nn : ms_matmul)(&kc, y, N, x, K, M, &W, 0);
                (nn ? ms_matmul_nn : ms_matmul)(&kc, yt, N, x, K, M, &Wt, 0);
                (nn ? ms_matmul_nn_ref : ms_matmul_ref)(yr, N, x, K, M, &W, 0);
                double mref = 0, mx = 0;
                for (int64_t i = 0; i < M * N; i++)
                    if (!isnan(yr[i]) && fabs(yr[i]) > mref) mref = fabs(yr[i]);
                /* AVX2 auto mode folds the block scale of plain rows in its one-row
                 * tiles (the last activation row at odd M): those bits may differ */
                const int fold = isas[ii] == MS_ISA_AVX2 && !nn;
                int same = 1;
                for (int64_t i = 0; i < M * N; i++) {
                    CHECKF(isnan(y[i]) == isnan(yr[i]),
                           "isa %d view %zu nn %d M %ld out %ld: %g vs %g", isas[ii], vi, nn,
                           (long)M, (long)i, y[i], yr[i]);
                    if (!isnan(yr[i])) mx = fmax(mx, fabs(y[i] - yr[i]));
                    int folded = fold && i / N == M - 1 && M % 2 && plain[rs[vi][0] + i % N];
                    same &= folded || memcmp(&y[i], &yt[i], sizeof(float)) == 0;
                }
                CHECKF(mx <= (bf ? 1e-2 : 1e-5) * mref, "isa %d view %zu nn %d M %ld: rel %g",
                       isas[ii], vi, nn, (long)M, mx / mref);
                CHECKF(same, "isa %d view %zu nn %d M %ld: flags changed the bits", isas[ii], vi,
                       nn, (long)M);
                free(x);
                free(y);
                free(yt);
                free(yr);
            }
        }
    stored_free(&st);
}

/* The FP4 GEMV (mm_fp4.c's f4b_gemv, M = 1 on AVX512_BF16) takes the
 * arithmetic of the tiles: every row of an M = 2, 3, 5 product has the bits
 * of the M = 1 product of that row, on sliced views (r0, c0 > 0), at K with
 * partial chunks and scale blocks, split over the pool, accumulating too. */
TEST(matmul_fp4_gemv_same_bits_as_tiles)
{
    if (best_isa < MS_ISA_AVX512BF16) return;
    ms_kctx kc = {pool, 0, MS_ISA_AVX512BF16, 0};
    uint64_t rng = 41;
    static const int64_t shapes[][4] = {
        {300, 1024, 3, 32}, {77, 62, 0, 0}, {130, 300, 5, 64}, {513, 512, 1, 0}};
    for (size_t si = 0; si < MS_ARRAY_LEN(shapes); si++) {
        int64_t N = shapes[si][0], K = shapes[si][1], r0 = shapes[si][2], c0 = shapes[si][3];
        stored st;
        stored_make(&st, MS_DT_F4E2M1, r0 + N + 3, c0 + K + 64, &rng);
        ms_mat W = ms_mat_slice(&st.whole, r0, N, c0, K);
        float *x = malloc(sizeof(float) * (size_t)(5 * K)),
              *y = malloc(sizeof(float) * (size_t)(5 * N));
        float *y1 = malloc(sizeof(float) * (size_t)N);
        for (int64_t i = 0; i < 5 * K; i++) x[i] = frand(&rng);
        for (int acc = 0; acc <= 1; acc++)
            for (int64_t M = 2; M <= 5; M += M == 3 ? 2 : 1) {
                for (int64_t i = 0; i < M * N; i++) y[i] = (float)(i % 5);
                ms_matmul(&kc, y, N, x, K, M, &W, acc);
                for (int64_t m = 0; m < M; m++) {
                    for (int64_t n = 0; n < N; n++) y1[n] = (float)((m * N + n) % 5);
                    ms_matmul(&kc, y1, N, x + m * K, K, 1, &W, acc);
                    CHECKF(memcmp(y1, y + m * N, sizeof(float) * (size_t)N) == 0,
                           "N %ld K %ld M %ld row %ld acc %d", (long)N, (long)K, (long)M, (long)m,
                           acc);
                }
            }
        free(x);
        free(y);
        free(y1);
        stored_free(&st);
    }
}

/* The split over threads must not change a single bit (layout invariance of
 * --dtype float32 relies on kernels being deterministic). */
TEST(matmul_same_bits_any_pool)
{
    uint64_t rng = 11;
    int64_t M = 5, N = 300, K = 700;
    const ms_dtype dts[] = {MS_DT_BF16, MS_DT_F8E4M3, MS_DT_F32, MS_DT_F4E2M1};
    float *x = malloc(sizeof(float) * (size_t)(M * K));
    float *y1 = malloc(sizeof(float) * (size_t)(M * N)),
          *y2 = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = frand(&rng);
    for (size_t di = 0; di < MS_ARRAY_LEN(dts); di++) {
        stored st;
        int64_t c0 = dts[di] == MS_DT_F4E2M1 ? 32 : 3; /* FP4: the auto kernel's origin */
        stored_make(&st, dts[di], N + 40, K + c0, &rng);
        ms_mat W = ms_mat_slice(&st.whole, 40, N, c0, K);
        for (int isa = 0; isa <= best_isa; isa++)
            for (int exact = 0; exact <= 1; exact++) {
                ms_kctx k1 = {NULL, exact, isa, 0}, k2 = {pool, exact, isa, 0};
                ms_matmul(&k1, y1, N, x, K, M, &W, 0);
                ms_matmul(&k2, y2, N, x, K, M, &W, 0);
                CHECKF(memcmp(y1, y2, sizeof(float) * (size_t)(M * N)) == 0,
                       "isa %d exact %d dt %d", isa, exact, dts[di]);
            }
        stored_free(&st);
    }
    free(x);
    free(y1);
    free(y2);
}

/* The widening gemv (auto mode, AVX-512 without AVX512_BF16) sums each row
 * the same way whatever M is: a row of an M = 6 or 16 product, whose long K
 * goes in several column passes, has the bits of the M = 1 product. */
TEST(matmul_gemv_rows_same_bits)
{
    if (best_isa < MS_ISA_AVX512) return;
    ms_kctx kc = {pool, 0, MS_ISA_AVX512, 0};
    int fp8 = ms_kernels_f8_plain_used(&kc); /* FP8 takes the widening path too */
    uint64_t rng = 23;
    int64_t N = 43, K = 2200, Ms2[] = {6, 16};
    const ms_dtype dts[] = {MS_DT_BF16, MS_DT_F8E4M3};
    float *x = malloc(sizeof(float) * (size_t)(16 * K));
    float *y = malloc(sizeof(float) * (size_t)(16 * N)), *y1 = malloc(sizeof(float) * (size_t)N);
    for (int64_t i = 0; i < 16 * K; i++) x[i] = frand(&rng);
    for (size_t di = 0; di < MS_ARRAY_LEN(dts) - !fp8; di++) {
        stored st;
        stored_make(&st, dts[di], N, K, &rng);
        for (size_t mi = 0; mi < MS_ARRAY_LEN(Ms2); mi++) {
            ms_matmul(&kc, y, N, x, K, Ms2[mi], &st.whole, 0);
            for (int64_t m = 0; m < Ms2[mi]; m++) {
                ms_matmul(&kc, y1, N, x + m * K, K, 1, &st.whole, 0);
                CHECKF(memcmp(y1, y + m * N, sizeof(float) * (size_t)N) == 0, "dt %d M %ld row %ld",
                       dts[di], (long)Ms2[mi], (long)m);
            }
        }
        stored_free(&st);
    }
    free(x);
    free(y);
    free(y1);
}

/* Batch-invariant mode (--enable-deterministic-inference): each row of an M-row
 * product has the bits of that row alone (M = 1), for M across the GEMV, the tiles,
 * FP8 widening (M >= 32) and oneDNN (M >= 128), K over two column passes, every
 * ISA.  Also prints how many M differ in the default mode (the fast paths). */
TEST(matmul_batch_invariant)
{
    uint64_t rng = 29;
    const int64_t N = 70, K = 1100, Mi[] = {2, 3, 4, 5, 17, 33, 64, 130, 200};
    const ms_dtype dts[] = {MS_DT_BF16, MS_DT_F8E4M3, MS_DT_F32};
    float *x = malloc(sizeof(float) * (size_t)(200 * K));
    float *y = malloc(sizeof(float) * (size_t)(200 * N)), *y1 = malloc(sizeof(float) * (size_t)N);
    for (int64_t i = 0; i < 200 * K; i++) x[i] = frand(&rng);
    for (size_t di = 0; di < MS_ARRAY_LEN(dts); di++) {
        stored st;
        stored_make(&st, dts[di], N, K, &rng);
        for (int isa = 0; isa <= best_isa; isa++)
            for (int binv = 0; binv <= 1; binv++) {
                ms_kctx kc = {pool, 0, isa, binv};
                int differ = 0;
                for (size_t mi = 0; mi < MS_ARRAY_LEN(Mi); mi++) {
                    ms_matmul(&kc, y, N, x, K, Mi[mi], &st.whole, 0);
                    int same = 1;
                    for (int64_t m = 0; m < Mi[mi]; m++) {
                        ms_matmul(&kc, y1, N, x + m * K, K, 1, &st.whole, 0);
                        same &= memcmp(y1, y + m * N, sizeof(float) * (size_t)N) == 0;
                    }
                    differ += !same;
                    if (binv)
                        CHECKF(same, "batch-invariant isa %d dt %d M %ld: a row differs from M = 1",
                               isa, dts[di], (long)Mi[mi]);
                }
                if (!binv && differ)
                    printf("  default mode, isa %s dt %d: %d of %d batch sizes differ from M = 1\n",
                           ms_isa_name(isa), dts[di], differ, (int)MS_ARRAY_LEN(Mi));
            }
        stored_free(&st);
    }
    free(x);
    free(y);
    free(y1);
}

/* The one-pass top-k gives the repeated scans' answer: ties, -inf, NaNs. */
TEST(topk_vs_ref)
{
    uint64_t rng = 11;
    float x[300];
    int32_t a[16], b[16];
    for (int trial = 0; trial < 2000; trial++) {
        int n = 1 + (int)(ms_rng_next(&rng) % 300), k = 1 + (int)(ms_rng_next(&rng) % 16);
        if (k > n) k = n;
        for (int i = 0; i < n; i++) {
            x[i] = (float)(ms_rng_next(&rng) % 20) - 10; /* many ties */
            if (ms_rng_next(&rng) % 10 == 0) x[i] = -INFINITY;
        }
        if (trial % 50 == 7) x[ms_rng_next(&rng) % n] = NAN;
        ms_topk(x, n, k, a);
        ms_topk_ref(x, n, k, b);
        int same = 1;
        for (int j = 0; j < k; j++) same &= a[j] == b[j];
        CHECKF(same, "trial %d n %d k %d", trial, n, k);
    }
}

TEST(elementwise_vs_ref)
{
    uint64_t rng = 5;
    static const int64_t ns[] = {1, 7, 8, 9, 31, 100, 7168};
    for (size_t t = 0; t < MS_ARRAY_LEN(ns); t++) {
        int64_t n = ns[t];
        float *a = malloc(sizeof(float) * (size_t)n * 2),
              *b = malloc(sizeof(float) * (size_t)n * 2);
        float *w = malloc(sizeof(float) * (size_t)n), *y1 = malloc(sizeof(float) * (size_t)n * 2);
        float *y2 = malloc(sizeof(float) * (size_t)n * 2);
        for (int64_t i = 0; i < 2 * n; i++) a[i] = 4 * frand(&rng), b[i] = 4 * frand(&rng);
        for (int64_t i = 0; i < n; i++) w[i] = frand(&rng);
        double d = ms_dot_f32(a, b, n), dr = ms_dot_f32_ref(a, b, n);
        CHECK(fabs(d - dr) <= 1e-5 * (fabs(dr) + sqrt((double)n)));
        memcpy(y1, b, sizeof(float) * (size_t)n);
        memcpy(y2, b, sizeof(float) * (size_t)n);
        ms_axpy_f32(y1, 0.37f, a, n);
        ms_axpy_f32_ref(y2, 0.37f, a, n);
        CHECK(rel_err(y1, y2, 1, n, n) <= 1e-6);
        /* two rows, stride n; weighted and unweighted; in place */
        ms_rmsnorm(y1, a, w, 2, n, n, 1e-6f);
        ms_rmsnorm_ref(y2, a, w, 2, n, n, 1e-6f);
        CHECK(rel_err(y1, y2, 2, n, n) <= 1e-5);
        memcpy(y1, a, sizeof(float) * (size_t)n * 2);
        ms_rmsnorm(y1, y1, NULL, 2, n, n, 1e-6f);
        ms_rmsnorm_ref(y2, a, NULL, 2, n, n, 1e-6f);
        CHECK(rel_err(y1, y2, 2, n, n) <= 1e-5);
        for (int64_t i = 0; i < n; i++) y1[i] = y2[i] = 30 * a[i];
        if (n > 3) y1[3] = y2[3] = -INFINITY; /* masked score */
        ms_softmax(y1, n);
        ms_softmax_ref(y2, n);
        CHECK(rel_err(y1, y2, 1, n, n) <= 1e-5);
        if (n > 3) CHECK(y1[3] == 0.0f);
        double sum = 0;
        for (int64_t i = 0; i < n; i++) sum += y1[i];
        CHECK(fabs(sum - 1.0) <= 1e-5);
        for (int64_t i = 0; i < n; i++) a[i] *= 30; /* silu over [-120, 120]: both tails */
        ms_silu_mul(y1, a, b, n);
        ms_silu_mul_ref(y2, a, b, n);
        for (int64_t i = 0; i < n; i++)
            CHECKF(fabs(y1[i] - y2[i]) <= 2e-6 * (fabs(y2[i]) + 1e-30), "silu %g: %g vs %g", a[i],
                   y1[i], y2[i]);
        free(a);
        free(b);
        free(w);
        free(y1);
        free(y2);
    }
}

/* ms_matmul_batch: a batch of mixed products (nt and nn, every dtype, several
 * M, overwrite and accumulate, a TP-style column slice) gives bit for bit what
 * the single calls give, at pool size 1 and 2, and in the exact mode. */
TEST(matmul_batch_same_as_single)
{
    uint64_t rng = 17;
    enum { NC = 12 };
    static const ms_dtype dts[] = {MS_DT_BF16, MS_DT_F8E4M3, MS_DT_F32, MS_DT_F16};
    stored st[NC];
    ms_mat views[NC];
    ms_mm_call calls[NC];
    float *x[NC], *y1[NC], *y2[NC];
    int64_t ylen[NC];
    for (int i = 0; i < NC; i++) {
        int64_t R = 200 + 37 * i, C = 130 + 61 * (i % 5), M = i % 4 == 3 ? 5 : 1 + i % 3;
        int nn = i % 3 == 2;
        stored_make(&st[i], dts[i % 4], R, C, &rng);
        views[i] = i == 4 ? ms_mat_slice(&st[i].whole, 3, R - 3, 40, C - 40) : st[i].whole;
        int64_t K = nn ? views[i].rows : views[i].cols, N = nn ? views[i].cols : views[i].rows;
        x[i] = malloc(sizeof(float) * (size_t)(M * K));
        ylen[i] = M * (N + 3);
        y1[i] = malloc(sizeof(float) * (size_t)ylen[i]);
        y2[i] = malloc(sizeof(float) * (size_t)ylen[i]);
        for (int64_t j = 0; j < M * K; j++) x[i][j] = frand(&rng);
        calls[i] = (ms_mm_call){y1[i], N + 3, x[i], K, M, &views[i], i % 2, nn};
    }
    for (int exact = 0; exact <= 1; exact++)
        for (int np = 1; np <= 2; np++) {
            ms_pool *p = np == 1 ? ms_pool_new(1) : pool;
            ms_kctx kc = {p, exact, best_isa, 0};
            for (int i = 0; i < NC; i++)
                for (int64_t j = 0; j < ylen[i]; j++) y1[i][j] = y2[i][j] = (float)j;
            ms_matmul_batch(&kc, calls, NC);
            for (int i = 0; i < NC; i++) {
                const ms_mm_call *c = &calls[i];
                (c->nn ? ms_matmul_nn : ms_matmul)(&kc, y2[i], c->ldy, c->x, c->ldx, c->M, c->W,
                                                   c->accumulate);
                CHECKF(memcmp(y1[i], y2[i], sizeof(float) * (size_t)ylen[i]) == 0,
                       "call %d (nn %d, exact %d, pool %d) differs", i, c->nn, exact, np);
            }
            if (np == 1) ms_pool_free(p);
        }
    for (int i = 0; i < NC; i++) {
        stored_free(&st[i]);
        free(x[i]);
        free(y1[i]);
        free(y2[i]);
    }
}

/* ms_kernels_dnnl_prepack: the copy made ahead is the one a large-M call
 * uses (held bytes do not grow, results match), it is made once, matrices
 * that never take oneDNN are refused, and clearing frees the chunks. */
TEST(matmul_dnnl_prepack_ahead)
{
    uint64_t rng = 7;
    { /* below AVX512_BF16 ms_matmul never takes oneDNN: nothing is prepacked */
        stored w;
        stored_make(&w, MS_DT_BF16, 8, 64, &rng);
        for (int isa = MS_ISA_SCALAR; isa <= MS_ISA_AVX512; isa++) {
            ms_kctx below = {pool, 0, isa, 0};
            CHECKF(ms_kernels_dnnl_prepack(&below, &w.whole) == -1, "isa %d", isa);
        }
        CHECK(ms_kernels_dnnl_bytes() == 0);
        if (best_isa >= MS_ISA_AVX512BF16 && !ms_kernels_dnnl_available()) {
            /* AVX512_BF16 forced past CPUID: oneDNN cannot see it, no copies */
            ms_kctx kc = {pool, 0, best_isa, 0};
            CHECK(ms_kernels_dnnl_prepack(&kc, &w.whole) == -1);
        }
        stored_free(&w);
    }
    if (best_isa < MS_ISA_AVX512BF16 || !ms_kernels_dnnl_available()) return;
    int64_t M = 160, N = 72, K = 136; /* M: a padded call (not a multiple of 32) */
    stored a, b, f8;
    stored_make(&a, MS_DT_BF16, N, K, &rng);
    stored_make(&b, MS_DT_BF16, 2 * N, K, &rng);
    stored_make(&f8, MS_DT_F8E4M3, N, K, &rng);
    float *x = malloc(sizeof(float) * (size_t)(M * K)),
          *y = malloc(sizeof(float) * (size_t)(M * 2 * N));
    float *emu = malloc(sizeof(float) * (size_t)(M * 2 * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = frand(&rng);
    ms_kctx kc = {pool, 0, best_isa, 0}, exact = {pool, 1, best_isa, 0};
    ms_kernels_dnnl_clear();
    ms_kernels_set_dnnl(1);
    CHECK(ms_kernels_dnnl_prepack(&kc, &a.whole) == 0);
    size_t held = ms_kernels_dnnl_bytes();
    CHECK(held >= (size_t)(N * K * 2));
    CHECK(ms_kernels_dnnl_prepack(&kc, &a.whole) == 0); /* held already: no second copy */
    CHECK(ms_kernels_dnnl_bytes() == held);
    CHECK(ms_kernels_dnnl_prepack(&kc, &b.whole) == 0);
    held = ms_kernels_dnnl_bytes();
    CHECK(held >= (size_t)(3 * N * K * 2));
    CHECK(ms_kernels_dnnl_prepack(&kc, &f8.whole) == -1);   /* FP8: hand kernels only */
    CHECK(ms_kernels_dnnl_prepack(&exact, &a.whole) == -1); /* exact mode: no oneDNN */
    const ms_mat *w[2] = {&a.whole, &b.whole};
    for (int i = 0; i < 2; i++) {
        int64_t n = w[i]->rows;
        emulate_bf16(emu, n, x, K, M, w[i], 0, 0);
        ms_matmul(&kc, y, n, x, K, M, w[i], 0);
        CHECKF(rel_err(y, emu, M, n, n) <= 1e-5, "matrix %d: %g", i, rel_err(y, emu, M, n, n));
    }
    CHECK(ms_kernels_dnnl_bytes() == held); /* the calls used the copies made ahead */
    ms_kernels_dnnl_clear();
    CHECK(ms_kernels_dnnl_bytes() == 0);
    CHECK(ms_kernels_dnnl_prepack(&kc, &a.whole) == 0); /* usable again after a clear */
    ms_kernels_dnnl_clear();
    free(x);
    free(y);
    free(emu);
    stored_free(&a);
    stored_free(&b);
    stored_free(&f8);
}

/* ms_kernels_dnnl_refresh (an EPLB slot rewritten in place): the held copy is reordered
 * again from the new contents, in the same space.  The new contents keep the 8 values
 * the fingerprint samples, so without the refresh the stale copy would be used. */
TEST(matmul_dnnl_refresh)
{
    if (best_isa < MS_ISA_AVX512BF16 || !ms_kernels_dnnl_available()) return;
    uint64_t rng = 17;
    int64_t M = 160, N = 72, K = 136;
    stored a, b;
    stored_make(&a, MS_DT_BF16, N, K, &rng);
    stored_make(&b, MS_DT_BF16, N, K, &rng);
    float *x = malloc(sizeof(float) * (size_t)(M * K)),
          *y = malloc(sizeof(float) * (size_t)(M * N));
    float *emu = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = frand(&rng);
    ms_kctx kc = {pool, 0, best_isa, 0};
    ms_kernels_dnnl_clear();
    ms_kernels_set_dnnl(1);
    CHECK(ms_kernels_dnnl_refresh(&kc, &a.whole) == -1); /* nothing held yet */
    CHECK(ms_kernels_dnnl_prepack(&kc, &a.whole) == 0);
    ms_matmul(&kc, y, N, x, K, M, &a.whole, 0);
    size_t held = ms_kernels_dnnl_bytes();
    uint16_t *d = a.data, keep[8];
    int64_t at[8];
    for (int i = 0; i < 8; i++) { /* mm_dnnl.c's fingerprint samples */
        at[i] = (N - 1) * i / 7 * K + (K - 1) * (i * 5 % 8) / 7;
        keep[i] = d[at[i]];
    }
    memcpy(a.data, b.data, (size_t)(N * K) * 2);
    for (int i = 0; i < 8; i++) d[at[i]] = keep[i];
    CHECK(ms_kernels_dnnl_refresh(&kc, &a.whole) == 0);
    CHECK(ms_kernels_dnnl_bytes() == held);
    emulate_bf16(emu, N, x, K, M, &a.whole, 0, 0);
    ms_matmul(&kc, y, N, x, K, M, &a.whole, 0);
    CHECKF(rel_err(y, emu, M, N, N) <= 1e-5, "after refresh: %g", rel_err(y, emu, M, N, N));
    CHECK(ms_kernels_dnnl_bytes() == held);
    ms_kernels_dnnl_clear();
    free(x);
    free(y);
    free(emu);
    stored_free(&a);
    stored_free(&b);
}

/* The oneDNN path: prepacked once, used (bytes held), invalidated by
 * forget / by new contents under the same pointer, and switchable off. */
TEST(matmul_dnnl_prepack)
{
    if (best_isa < MS_ISA_AVX512BF16 || !ms_kernels_dnnl_available()) return;
    uint64_t rng = 99;
    int64_t M = 64, N = 96, K = 200;
    stored st;
    stored_make(&st, MS_DT_BF16, N, K, &rng);
    float *x = malloc(sizeof(float) * (size_t)(M * K)),
          *y = malloc(sizeof(float) * (size_t)(M * N));
    float *emu = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = frand(&rng);
    ms_kctx kc = {pool, 0, best_isa, 0};
    ms_kernels_set_dnnl(1);
    int64_t min_m = ms_kernels_set_dnnl_min_m(M); /* M = 64 is below the default */
    for (int round = 0; round < 3; round++) {
        emulate_bf16(emu, N, x, K, M, &st.whole, 0, 0);
        ms_matmul(&kc, y, N, x, K, M, &st.whole, 0);
        CHECKF(rel_err(y, emu, M, N, N) <= 1e-5, "round %d: %g", round, rel_err(y, emu, M, N, N));
        CHECK(ms_kernels_dnnl_bytes() >= (size_t)(N * K * 2));
        /* new contents under the same pointer: round 0 says so, round 1 does not
         * (the fingerprint must notice: every sampled element changes) */
        for (int64_t i = 0; i < N * K; i++) ((uint16_t *)st.data)[i] = ms_f32_to_bf16(frand(&rng));
        if (round == 0) ms_kernels_dnnl_forget(st.data);
    }
    ms_kernels_set_dnnl(0);
    CHECK(ms_kernels_dnnl_bytes() == 0);
    emulate_bf16(emu, N, x, K, M, &st.whole, 0, 0);
    ms_matmul(&kc, y, N, x, K, M, &st.whole, 0);
    CHECK(rel_err(y, emu, M, N, N) <= 1e-5);
    CHECK(ms_kernels_dnnl_bytes() == 0);
    ms_kernels_set_dnnl(1);
    ms_kernels_set_dnnl_min_m(min_m);
    free(x);
    free(y);
    free(emu);
    stored_free(&st);
}

/* The packed-panel BF16 kernel (mm_bf16_pack.c, auto mode at M >= 16)
 * against its scalar twin (x and W rounded to bf16, products summed in
 * double): random shapes with odd M (micro-kernel row tails), N (panel
 * column tails) and K (the odd pair), accumulate on and off, the output
 * columns split over the pool.  Tolerance: FP32 accumulation of exact bf16
 * products. */
TEST(matmul_pack_vs_twin)
{
    if (best_isa < MS_ISA_AVX512BF16) return;
    uint64_t rng = 41;
    const int64_t shapes[][3] = {{16, 64, 64},  {48, 1024, 512}, {17, 77, 131}, {23, 1, 3},
                                 {31, 513, 65}, {53, 190, 257},  {100, 33, 17}, {127, 4, 300}};
    for (size_t si = 0; si < MS_ARRAY_LEN(shapes); si++) {
        const int64_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        stored st;
        stored_make(&st, MS_DT_BF16, N, K, &rng);
        float *x = malloc(sizeof(float) * (size_t)(M * K));
        float *y = malloc(sizeof(float) * (size_t)(M * N)),
              *y0 = malloc(sizeof(float) * (size_t)(M * N));
        for (int64_t i = 0; i < M * K; i++) x[i] = frand(&rng);
        for (int acc = 0; acc <= 1; acc++) {
            for (int64_t i = 0; i < M * N; i++) y[i] = y0[i] = frand(&rng);
            ms_kctx kc = {pool, 0, best_isa, 0};
            ms_matmul(&kc, y, N, x, K, M, &st.whole, acc);
            double worst = 0;
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    double s = 0, mag = 0;
                    for (int64_t k = 0; k < K; k++) {
                        double p = (double)ms_bf16_to_f32(ms_f32_to_bf16(x[m * K + k])) *
                                   (double)ms_mat_get(&st.whole, n, k);
                        s += p, mag += fabs(p);
                    }
                    if (acc) s += y0[m * N + n], mag += fabs(y0[m * N + n]);
                    double e = fabs(y[m * N + n] - s) / (mag + 1e-30);
                    if (e > worst) worst = e;
                }
            CHECKF(worst < 1e-5, "M %ld K %ld N %ld acc %d: worst error %.3g of the magnitude",
                   (long)M, (long)K, (long)N, acc, worst);
        }
        free(x);
        free(y);
        free(y0);
        stored_free(&st);
    }
}

/* Panel copies (ms_kernels_panels_fill): a view holding them gives, at every
 * M >= 16 and with the pool or without, the bits the packed-panel kernel gives
 * packing at each call (oneDNN off for M >= 128, which panels bypass), and
 * reads only the panels: the product is unchanged after the weights
 * themselves are zeroed.  Views with ld > cols and odd K, row tails of a
 * panel, accumulate, a batch of several products. */
TEST(matmul_panels_same_bits)
{
    if (best_isa < MS_ISA_AVX512BF16) return;
    uint64_t rng = 43;
    const int64_t shapes[][3] = {{16, 64, 64},   {32, 1024, 200}, {48, 131, 77},
                                 {17, 300, 129}, {32, 65, 513},   {150, 96, 70}};
    int64_t min_m = ms_kernels_set_dnnl_min_m(128);
    ms_kernels_set_dnnl(0);
    for (size_t si = 0; si < MS_ARRAY_LEN(shapes); si++) {
        const int64_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        stored st;
        stored_make(&st, MS_DT_BF16, N + 3, K + 5, &rng);
        ms_mat W = ms_mat_slice(&st.whole, 3, N, 5, K); /* ld = K + 5 */
        ms_mat V = ms_mat_slice(&st.whole, 0, 16, 0, K);
        ms_kctx kc = {pool, 0, best_isa, 0}, k1 = {NULL, 0, best_isa, 0};
        size_t bytes = ms_kernels_panels_bytes(&kc, &W);
        CHECK(bytes == (size_t)((N + 63) / 64 * 64) * (size_t)((K + 1) / 2) * 4);
        void *pw = aligned_alloc(64, (bytes + 63) / 64 * 64);
        memset(pw, 0x7f, bytes); /* rows past N must be written (as zero) by the fill */
        float *x = malloc(sizeof(float) * (size_t)(M * K));
        float *y0 = malloc(sizeof(float) * (size_t)(M * N)),
              *want = malloc(sizeof(float) * (size_t)(M * N));
        float *got = malloc(sizeof(float) * (size_t)(M * N)),
              *v16 = malloc(sizeof(float) * (size_t)(M * 16));
        for (int64_t i = 0; i < M * K; i++) x[i] = frand(&rng);
        for (int64_t i = 0; i < M * N; i++) y0[i] = frand(&rng);
        for (int acc = 0; acc <= 1; acc++) {
            memcpy(want, y0, sizeof(float) * (size_t)(M * N));
            ms_matmul(&kc, want, N, x, K, M, &W, acc);
            ms_mat P = W;
            ms_kernels_panels_fill(&kc, &P, pw);
            P.panels = pw;
            CHECK(ms_mat_slice(&P, 0, 64, 0, K).panels == NULL);
            uint16_t *d = (uint16_t *)st.data;
            uint16_t *keep = malloc(sizeof(uint16_t) * (size_t)((N + 3) * (K + 5)));
            memcpy(keep, d, sizeof(uint16_t) * (size_t)((N + 3) * (K + 5)));
            for (int64_t r = 3; r < N + 3; r++)
                memset(d + r * (K + 5) + 5, 0, sizeof(uint16_t) * (size_t)K);
            for (int pl = 0; pl <= 1; pl++) {
                memcpy(got, y0, sizeof(float) * (size_t)(M * N));
                ms_matmul(pl ? &kc : &k1, got, N, x, K, M, &P, acc);
                CHECKF(memcmp(got, want, sizeof(float) * (size_t)(M * N)) == 0,
                       "M %ld K %ld N %ld acc %d pool %d: panels differ from packing", (long)M,
                       (long)K, (long)N, acc, pl);
            }
            /* in a batch with a view without panels (rows 0..15: zeroed from row 3) */
            memcpy(got, y0, sizeof(float) * (size_t)(M * N));
            ms_mm_call calls[2] = {{v16, 16, x, K, M, &V, 0, 0}, {got, N, x, K, M, &P, acc, 0}};
            ms_matmul_batch(&kc, calls, 2);
            CHECK(memcmp(got, want, sizeof(float) * (size_t)(M * N)) == 0);
            memcpy(d, keep, sizeof(uint16_t) * (size_t)((N + 3) * (K + 5)));
            free(keep);
        }
        /* the weights change in place: a second fill follows them */
        ms_mat P = W;
        ms_kernels_panels_fill(&kc, &P, pw);
        P.panels = pw;
        uint16_t *d = (uint16_t *)st.data;
        for (int64_t r = 3; r < N + 3; r++) d[r * (K + 5) + 5] ^= 0x0100;
        ms_matmul(&kc, want, N, x, K, M, &W, 0);
        ms_kernels_panels_fill(&kc, &P, pw);
        ms_matmul(&kc, got, N, x, K, M, &P, 0);
        CHECK(memcmp(got, want, sizeof(float) * (size_t)(M * N)) == 0);
        free(pw);
        free(x);
        free(y0);
        free(want);
        free(got);
        free(v16);
        stored_free(&st);
    }
    ms_kctx ex = {pool, 1, best_isa, 0}, bi = {pool, 0, best_isa, 1},
            av = {pool, 0, MS_ISA_AVX512, 0};
    stored st;
    stored_make(&st, MS_DT_BF16, 8, 8, &rng);
    CHECK(ms_kernels_panels_bytes(&ex, &st.whole) == 0);
    CHECK(ms_kernels_panels_bytes(&bi, &st.whole) == 0);
    CHECK(ms_kernels_panels_bytes(&av, &st.whole) == 0);
    stored_free(&st);
    stored_make(&st, MS_DT_F8E4M3, 8, 8, &rng);
    CHECK(ms_kernels_panels_bytes(&(ms_kctx){pool, 0, best_isa, 0}, &st.whole) == 0);
    stored_free(&st);
    ms_kernels_set_dnnl(1);
    ms_kernels_set_dnnl_min_m(min_m);
}

int main(void)
{
    best_isa = ms_kernels_detect();
    pool = ms_pool_new(2);
    fprintf(stderr, "best isa: %s\n", ms_isa_name(best_isa));
    RUN(convert_bf16_f16_all_codes);
    RUN(convert_e4m3_all_codes);
    RUN(find_nonfinite_all_codes);
    RUN(matmul_all_paths);
    RUN(matmul_nn_all_paths);
    RUN(fp4_e8m0_all_codes);
    RUN(matmul_fp4_all_paths);
    RUN(matmul_dnnl_prepack);
    RUN(matmul_dnnl_prepack_ahead);
    RUN(matmul_dnnl_refresh);
    RUN(matmul_batch_same_as_single);
    RUN(matmul_fp8_plain_rows);
    RUN(matmul_same_bits_any_pool);
    RUN(matmul_fp4_gemv_same_bits_as_tiles);
    RUN(matmul_gemv_rows_same_bits);
    RUN(matmul_batch_invariant);
    RUN(matmul_pack_vs_twin);
    RUN(matmul_panels_same_bits);
    RUN(topk_vs_ref);
    RUN(elementwise_vs_ref);
    ms_kernels_dnnl_clear();
    ms_pool_free(pool);
    return TEST_REPORT();
}
