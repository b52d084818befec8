/* mm_f32_tmpl.h — the exact FP32 matmul kernels, written once for a vector
 * width and included by mm_avx2.c (8 lanes) and mm_avx512.c (16 lanes), which
 * define the V* macros below before including it.  Weights are dequantised to
 * f32 in registers exactly as ms_mat_get does (FP8: value × block scale, one
 * f32 rounding; FP4: code × its 32-column scale, looked up in a table scaled
 * once per block), products accumulate with FP32 FMA; only the summation order
 * differs from ms_matmul_ref.  Runs on pool threads; no scratch needed.
 *
 * Required macros: VW (lanes), VF (vector type), VZERO(), VSET1(f), VLOAD(p),
 * VFMA(a, b, c) = a·b + c, VMUL(a, b), VHSUM(v), VLOAD_BF16(p), VLOAD_F16(p),
 * VLOAD_F8(p) (e4m3 value × 2⁻⁸, exact), VLOAD_F8P(p) (the same for codes
 * other than NaN: value × 2⁻¹²⁰, exact; exponent field 0 gives f32 zeros and
 * subnormals), VF4_TBL(s) (the e2m1 table times s,
 * in the form VLOAD_F4 takes), VLOAD_F4(p, tbl) (the VW codes at byte p,
 * low nibble first, as table entries), FN(name), NT_MB (max activation rows
 * per tile), NT_R(mb) (weight rows per tile), NN_C (vectors of columns per
 * tile in the nn kernel).
 */
#include "kernels/mm_internal.h"

#define AI static inline __attribute__((always_inline))

AI float FN(wget)(const int dt, const char *p)
{
    switch (dt) {
    case MS_DT_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case MS_DT_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return ms_bf16_to_f32(h);
    }
    case MS_DT_F16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return ms_f16_to_f32(h);
    }
    default:
        return ms_fp8e4m3_to_f32(*(const uint8_t *)p);
    }
}

AI VF FN(wload)(const int dt, const char *p)
{
    switch (dt) {
    case MS_DT_F32:
        return VLOAD((const float *)p);
    case MS_DT_BF16:
        return VLOAD_BF16(p);
    case MS_DT_F16:
        return VLOAD_F16(p);
    default:
        return VLOAD_F8(p);
    }
}

/* How a tile's inner loop reads its weights: F_GEN any dtype (FN(wload),
 * FP8 times the block scale); F_PLAIN FP8 rows without a NaN code
 * (ms_mat.f8_plain PLAIN or SUBN): VLOAD_F8P times the scale × 2^120, the
 * same products, bit for bit, as value × 2^-8 times scale × 256 (a SUBN row's
 * zero and subnormal codes become f32 zeros and subnormals, which FMA takes
 * at full speed on the Zen 3 measured); F_FOLD (auto mode, one activation
 * row) the same rows without the multiply per weight: activations × 2^100
 * times value × 2^-120 into a sum per scale block, which then adds sum ×
 * scale × 2^20 (one operation fewer per 8 weights: ~1.35x the codes per
 * second L2-hot).  Not bit-exact: each product is rounded once before the
 * scale instead of after it.  Activations of magnitude 2^-97 .. 2^28 keep
 * every product normal; below, a product loses bits (absolute error under
 * 2^-129 · scale); a row whose folded sum is not finite (activations of 2^28
 * or more) is redone unfolded.  A row takes F_FOLD by its own flag alone
 * (tiles of mixed rows run row by row), so the bits do not depend on the
 * split over threads. */
enum { F_GEN, F_PLAIN, F_FOLD };

/* Prefetch into L2 of the next tile's line at column k of each row (rows are
 * contiguous, so rows R.. 2R-1 past the tile), one per 64 bytes of progress:
 * DRAM-cold expert GEMVs read ~1.3x the bytes per second with it
 * (bench/HISTORY.md, "AVX2 decode: the next tile into L2"). */
AI void FN(pf_next)(const char *w0, int64_t ldw, const int R, int64_t kb)
{
    if (kb & 63) return;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm_prefetch(w0 + (R + r) * ldw + kb, _MM_HINT_T1);
}

/* Columns [k, kend) of one scale block (whole vectors) into acc; returns the
 * first column not done. */
AI int64_t FN(nt_span)(const mm_task *t, const int dt, const int form, const int MB, const int R,
                       const char *w0, int64_t ldw, const float *x0, int64_t k, int64_t kend,
                       const VF *sv, VF (*acc)[8])
{
    const int f4 = dt == MS_DT_F4E2M1;
    const int es = dt == MS_DT_F32 ? 4 : dt == MS_DT_F8E4M3 || f4 ? 1 : 2;
    VF ab[8];
    if (form == F_FOLD)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) ab[r] = VZERO();
    for (; k + VW <= kend; k += VW) {
        FN(pf_next)(w0, ldw, R, f4 ? k / 2 : k * es);
        if (form == F_FOLD) {
            VF xv = VMUL(VLOAD(x0 + k), VSET1(0x1p100f));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) ab[r] = VFMA(xv, VLOAD_F8P(w0 + r * ldw + k), ab[r]);
            continue;
        }
        VF xv[NT_MB];
#pragma GCC unroll 8
        for (int m = 0; m < MB; m++) xv[m] = VLOAD(x0 + m * t->ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            VF w = form == F_PLAIN ? VLOAD_F8P(w0 + r * ldw + k)
                   : f4            ? VLOAD_F4(w0 + r * ldw + k / 2, sv[r])
                                   : FN(wload)(dt, w0 + r * ldw + k * es);
            if (dt == MS_DT_F8E4M3) w = VMUL(w, sv[r]);
#pragma GCC unroll 8
            for (int m = 0; m < MB; m++) acc[m][r] = VFMA(xv[m], w, acc[m][r]);
        }
    }
    if (form == F_FOLD)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[0][r] = VFMA(ab[r], sv[r], acc[0][r]);
    return k;
}

/* The sums s[m][r] of one tile: activation rows [m0, m0+MB) × weight rows
 * [n0, n0+R), all of K; fold: F_FOLD allowed.  Returns 0 when fold was taken
 * and a sum is not finite. */
AI int FN(nt_sums)(const mm_task *t, const int dt, const int fold, const int MB, const int R,
                   int64_t m0, int64_t n0, float (*s)[8])
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols;
    const int f4 = dt == MS_DT_F4E2M1;
    const int es = dt == MS_DT_F32 ? 4 : dt == MS_DT_F8E4M3 || f4 ? 1 : 2;
    const int64_t ldw = f4 ? W->ld / 2 : W->ld * es;
    const char *w0 = (const char *)W->data + n0 * ldw;
    const float *x0 = t->x + m0 * t->ldx;
    VF acc[NT_MB][8];
    float tl[NT_MB][8];
#pragma GCC unroll 8
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            acc[m][r] = VZERO();
            tl[m][r] = 0;
        }
    /* FP8 rows all without a NaN code (ms_mat.f8_plain): F_PLAIN / F_FOLD */
    int plain = dt == MS_DT_F8E4M3 && W->f8_plain;
    for (int r = 0; plain && r < R; r++) plain = W->f8_plain[W->r0 + n0 + r - W->f8_plain_r0];
    const int can_fold = fold && MB == 1 && dt == MS_DT_F8E4M3;
    int64_t k = 0;
    while (k < K) {
        int64_t kend = K;
        float ss[8] = {0};
        VF sv[8];
        int fast = 0;
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) sv[r] = VZERO();
        if (dt == MS_DT_F8E4M3) { /* one 128-column scale block at a time */
            int64_t cb = (W->c0 + k) / 128;
            kend = (cb + 1) * 128 - W->c0;
            if (kend > K) kend = K;
            fast = plain != 0;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                ss[r] = W->scale[((W->r0 + n0 + r) / 128) * W->scale_ld + cb];
                fast &= can_fold || fabsf(ss[r]) < 128.0f; /* scale × 2^120 stays finite */
            }
            const float f = !fast ? 256.0f : can_fold ? 0x1p20f : 0x1p120f;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) sv[r] = VSET1(ss[r] * f);
        }
        if (f4) { /* one 32-column scale block at a time, its table scaled */
            int64_t cb = (W->c0 + k) / 32;
            kend = (cb + 1) * 32 - W->c0;
            if (kend > K) kend = K;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                ss[r] = ms_e8m0_to_f32(W->e8scale[(W->r0 + n0 + r) * W->scale_ld + cb]);
                sv[r] = VF4_TBL(ss[r]);
            }
        }
        if (fast && can_fold)
            k = FN(nt_span)(t, dt, F_FOLD, MB, R, w0, ldw, x0, k, kend, sv, acc);
        else if (fast)
            k = FN(nt_span)(t, dt, F_PLAIN, MB, R, w0, ldw, x0, k, kend, sv, acc);
        else
            k = FN(nt_span)(t, dt, F_GEN, MB, R, w0, ldw, x0, k, kend, sv, acc);
        for (; k < kend; k++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                float wv;
                if (f4) {
                    uint8_t b = (uint8_t)w0[r * ldw + k / 2];
                    wv = ms_fp4e2m1_to_f32((uint8_t)(k & 1 ? b >> 4 : b)) * ss[r];
                } else {
                    wv = FN(wget)(dt, w0 + r * ldw + k * es);
                }
                if (dt == MS_DT_F8E4M3) wv *= ss[r];
#pragma GCC unroll 8
                for (int m = 0; m < MB; m++) tl[m][r] += x0[m * t->ldx + k] * wv;
            }
    }
    int finite = 1;
#pragma GCC unroll 8
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            s[m][r] = VHSUM(acc[m][r]) + tl[m][r];
            finite &= isfinite(s[m][r]);
        }
    return finite || !can_fold;
}

/* One tile into y; fold: F_FOLD allowed (auto mode). */
AI void FN(nt_tile)(const mm_task *t, const int dt, const int fold, const int MB, const int R,
                    int64_t m0, int64_t n0)
{
    float s[NT_MB][8];
    if (!FN(nt_sums)(t, dt, fold, MB, R, m0, n0, s)) /* folded: a sum overflowed */
        for (int r = 0; r < R; r++)
            if (!isfinite(s[0][r])) { /* that row unfolded */
                float s1[NT_MB][8];
                FN(nt_sums)(t, dt, 0, MB, 1, m0, n0 + r, s1);
                s[0][r] = s1[0][0];
            }
#pragma GCC unroll 8
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            float *yo = t->y + (m0 + m) * t->ldy + n0 + r;
            *yo = t->accumulate ? *yo + s[m][r] : s[m][r];
        }
}

AI void FN(nt_rows_mb)(const mm_task *t, const int dt, const int fold, const int MB, int64_t m0,
                       int64_t n0, int64_t n1)
{
    const int R = NT_R(MB);
    const ms_mat *W = t->W;
    const uint8_t *pl = W->f8_plain ? W->f8_plain + W->r0 - W->f8_plain_r0 : NULL;
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        int mixed = 0; /* F_FOLD: rows with and without a NaN code, row by row */
        for (int r = 1; fold && MB == 1 && dt == MS_DT_F8E4M3 && pl && r < R; r++)
            mixed |= !pl[n + r] != !pl[n];
        if (!mixed) {
            FN(nt_tile)(t, dt, fold, MB, R, m0, n);
            continue;
        }
        for (int r = 0; r < R; r++) FN(nt_tile)(t, dt, fold, MB, 1, m0, n + r);
    }
    for (; n < n1; n++) FN(nt_tile)(t, dt, fold, MB, 1, m0, n);
}

AI void FN(nt_rows_dt)(const mm_task *t, const int dt, const int fold, int64_t n0, int64_t n1)
{
    /* weight rows outer (a tile of R rows is re-read from cache for each
     * group of activation rows), activation rows inner */
    const int64_t NB = 64;
    for (int64_t nb = n0; nb < n1; nb += NB) {
        int64_t ne = nb + NB < n1 ? nb + NB : n1;
        for (int64_t m0 = 0; m0 < t->M; m0 += NT_MB) {
            int64_t mb = t->M - m0 < NT_MB ? t->M - m0 : NT_MB;
            switch (mb) {
            case 1:
                FN(nt_rows_mb)(t, dt, fold, 1, m0, nb, ne);
                break;
#if NT_MB >= 2
            case 2:
                FN(nt_rows_mb)(t, dt, fold, 2, m0, nb, ne);
                break;
#endif
#if NT_MB >= 3
            case 3:
                FN(nt_rows_mb)(t, dt, fold, 3, m0, nb, ne);
                break;
#endif
#if NT_MB >= 4
            case 4:
                FN(nt_rows_mb)(t, dt, fold, 4, m0, nb, ne);
                break;
#endif
            default:
                break;
            }
        }
    }
}

void FN(nt)(const mm_task *t, int64_t n0, int64_t n1)
{
    switch (t->W->dtype) {
    case MS_DT_F32:
        FN(nt_rows_dt)(t, MS_DT_F32, 0, n0, n1);
        break;
    case MS_DT_BF16:
        FN(nt_rows_dt)(t, MS_DT_BF16, 0, n0, n1);
        break;
    case MS_DT_F16:
        FN(nt_rows_dt)(t, MS_DT_F16, 0, n0, n1);
        break;
    case MS_DT_F8E4M3:
        FN(nt_rows_dt)(t, MS_DT_F8E4M3, 0, n0, n1);
        break;
    case MS_DT_F4E2M1:
        FN(nt_rows_dt)(t, MS_DT_F4E2M1, 0, n0, n1);
        break;
    default:
        break;
    }
}

#ifdef NT_FOLD
/* ---- auto mode, one activation row: one weight row at a time ----
 * A tile of R rows reads R streams of one row's length side by side; one row
 * at a time reads the thread's range as one forward stream, which the
 * hardware prefetcher follows, and DRAM-cold expert GEMVs read more bytes per
 * second so (bench/HISTORY.md, "AVX2 decode: one weight row at a time").
 * Four sums per row (FP8: per 128-column block, folded as F_FOLD) keep the
 * FMA chains short.  Taken for rows of at most R1_MAX_BYTES: rows of 4 KiB
 * and more stream well enough side by side, and the tile loads its
 * activations once per R rows.  Needs K and (FP8) c0 whole vectors; the
 * order differs from FN(nt), so auto mode only.  BF16, F16 and F32 take it up
 * to R1_MAX_M rows of x too, each row of x against each weight row while it
 * is in L1 (a batch's experts of a few rows: bench_kernels --moe32 BF16 layer
 * ×1.17-1.22 against the tiles, which decode each weight once per 2 rows of
 * x and reload it for the next 2). */

/* Bytes ahead of the stream each 64 bytes read are prefetched from: the next
 * 4 KiB page, where the hardware prefetcher stops (FP8 experts ~1.15x). */
enum { R1_PF = 4096, R1_MAX_BYTES = 2048, R1_MAX_M = 8 };

/* Columns [k, kend) of one row at w into the four sums a (FP8: codes as
 * value × 2^-120, against x × 2^100); returns kend. */
AI int64_t FN(r1_span)(const int dt, const char *w, const float *x, int64_t k, int64_t kend, VF *a)
{
    const int es = dt == MS_DT_F32 ? 4 : dt == MS_DT_F8E4M3 ? 1 : 2;
    for (; k + 4 * VW <= kend; k += 4 * VW) {
        if (!((k * es) & 63)) _mm_prefetch(w + k * es + R1_PF, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const char *p = w + (k + j * VW) * es;
            a[j] = VFMA(VLOAD(x + k + j * VW), dt == MS_DT_F8E4M3 ? VLOAD_F8P(p) : FN(wload)(dt, p),
                        a[j]);
        }
    }
    for (; k < kend; k += VW) {
        const char *p = w + k * es;
        a[0] = VFMA(VLOAD(x + k), dt == MS_DT_F8E4M3 ? VLOAD_F8P(p) : FN(wload)(dt, p), a[0]);
    }
    return kend;
}

/* One whole 128-column FP8 block at w (x × 2^100 at x) in four sums, the
 * order of FN(r1_span), straight-line: through the general loop gcc kept
 * bounds and pointers on the stack (bench/HISTORY.md, "AVX2 one-row FP8 and
 * FP4"). */
AI VF FN(r1_f8_block)(const char *w, const float *x)
{
    VF a[4] = {VZERO(), VZERO(), VZERO(), VZERO()};
    _mm_prefetch(w + R1_PF, _MM_HINT_T0);
    _mm_prefetch(w + 64 + R1_PF, _MM_HINT_T0);
#pragma GCC unroll 16
    for (int i = 0; i < 128 / VW; i++)
        a[i % 4] = VFMA(VLOAD(x + i * VW), VLOAD_F8P(w + i * VW), a[i % 4]);
    return VADD(VADD(a[0], a[1]), VADD(a[2], a[3]));
}

/* Row n's sum with activations x (FP8: x × 2^100, one sum per 128-column
 * block times its scale × 2^20); 0 when an FP8 row's sum is not finite. */
AI int FN(r1_sum)(const mm_task *t, const int dt, const float *x, int64_t n, float *out)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols;
    const char *w = (const char *)W->data + n * ms_dtype_bytes(dt, W->ld);
    const float *srow = dt == MS_DT_F8E4M3 ? W->scale + ((W->r0 + n) / 128) * W->scale_ld : NULL;
    VF acc = VZERO();
    for (int64_t k = 0; k < K;) {
        int64_t cb = (W->c0 + k) / 128, kend = dt == MS_DT_F8E4M3 ? (cb + 1) * 128 - W->c0 : K;
        if (kend > K) kend = K;
        if (dt == MS_DT_F8E4M3 && kend - k == 128) {
            acc = VFMA(FN(r1_f8_block)(w + k, x + k), VSET1(srow[cb] * 0x1p20f), acc);
            k = kend;
            continue;
        }
        VF a[4] = {VZERO(), VZERO(), VZERO(), VZERO()};
        k = FN(r1_span)(dt, w, x, k, kend, a);
        VF blk = VADD(VADD(a[0], a[1]), VADD(a[2], a[3]));
        acc = dt == MS_DT_F8E4M3 ? VFMA(blk, VSET1(srow[cb] * 0x1p20f), acc) : blk;
    }
    *out = VHSUM(acc);
    return isfinite(*out) || dt != MS_DT_F8E4M3;
}

AI void FN(r1_rows_dt)(const mm_task *t, const int dt, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const uint8_t *pl = W->f8_plain ? W->f8_plain + W->r0 - W->f8_plain_r0 : NULL;
    const float *x = t->x;
    if (dt == MS_DT_F8E4M3) { /* x × 2^100 once per call */
        float *xs = pl ? ms_mm_scratch(MM_SCR_W, sizeof(float) * (size_t)W->cols) : NULL;
        if (!xs) {
            FN(nt_rows_dt)(t, dt, 1, n0, n1);
            return;
        }
        for (int64_t k = 0; k < W->cols; k += VW)
            VSTORE(xs + k, VMUL(VLOAD(x + k), VSET1(0x1p100f)));
        x = xs;
    }
    for (int64_t n = n0; n < n1; n++) {
        float s;
        if (dt != MS_DT_F8E4M3) { /* M <= R1_MAX_M rows of x */
            for (int64_t m = 0; m < t->M; m++) {
                FN(r1_sum)(t, dt, x + m * t->ldx, n, &s);
                float *yo = t->y + m * t->ldy + n;
                *yo = t->accumulate ? *yo + s : s;
            }
            continue;
        }
        if (pl[n] == MS_F8_ROW_NAN || !FN(r1_sum)(t, dt, x, n, &s)) {
            FN(nt_tile)(t, dt, 0, 1, 1, 0, n); /* NaN codes, or the fold overflowed */
            continue;
        }
        float *yo = t->y + n;
        *yo = t->accumulate ? *yo + s : s;
    }
}

/* FN(nt) in auto mode: one activation row (BF16, F16, F32: up to R1_MAX_M)
 * goes row by row (above) where the rows are short and K (and an FP8 view's
 * c0) whole vectors, FP8 rows without NaN codes folded; other FP8 products
 * fold their plain rows at one activation row. */
void FN(nt_auto)(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int dt = W->dtype;
    const int row1 = (dt == MS_DT_F8E4M3 ? t->M == 1 && W->c0 % VW == 0 : t->M <= R1_MAX_M) &&
                     W->cols % VW == 0 && ms_dtype_bytes(dt, W->cols) <= R1_MAX_BYTES;
    switch (row1 ? dt : -1) {
    case MS_DT_F32:
        FN(r1_rows_dt)(t, MS_DT_F32, n0, n1);
        return;
    case MS_DT_BF16:
        FN(r1_rows_dt)(t, MS_DT_BF16, n0, n1);
        return;
    case MS_DT_F16:
        FN(r1_rows_dt)(t, MS_DT_F16, n0, n1);
        return;
    case MS_DT_F8E4M3:
        FN(r1_rows_dt)(t, MS_DT_F8E4M3, n0, n1);
        return;
    default:
        break;
    }
#ifdef NT_R1_F4
    if (dt == MS_DT_F4E2M1 && W->cols % 32 == 0 && W->c0 % 32 == 0 &&
        ms_dtype_bytes(dt, W->cols) <= R1_MAX_BYTES && NT_R1_F4(t, n0, n1) == 0)
        return;
#endif
    if (dt == MS_DT_F8E4M3)
        FN(nt_rows_dt)(t, MS_DT_F8E4M3, 1, n0, n1);
    else
        FN(nt)(t, n0, n1);
}
#endif

/* ---- y = x·W (no transpose): W is [K = rows][N = cols] ---- */

/* Activation rows [m0, m0+MB) × columns [n, n + C·VW), all K rows of W. */
AI void FN(nn_tile)(const mm_task *t, const int dt, const int MB, const int C, int64_t m0,
                    int64_t n)
{
    const ms_mat *W = t->W;
    const int64_t K = W->rows;
    const int es = dt == MS_DT_F32 ? 4 : dt == MS_DT_F8E4M3 ? 1 : 2;
    const int64_t ldw = W->ld * es;
    const float *x0 = t->x + m0 * t->ldx;
    VF acc[4][4 * NN_C];
    VF sv[4 * NN_C];
#pragma GCC unroll 16
    for (int c = 0; c < 4 * NN_C; c++) sv[c] = VZERO();
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) acc[m][c] = VZERO();
    int64_t rb_cur = -1;
    for (int64_t k = 0; k < K; k++) {
        const char *wr = (const char *)W->data + k * ldw + n * es;
        if (dt == MS_DT_F8E4M3) {
            int64_t rb = (W->r0 + k) / 128;
            if (rb != rb_cur) { /* per-lane scales: columns may straddle a block */
                float s[4 * NN_C * VW];
                for (int j = 0; j < C * VW; j++)
                    s[j] = 256.0f * W->scale[rb * W->scale_ld + (W->c0 + n + j) / 128];
#pragma GCC unroll 16
                for (int c = 0; c < C; c++) sv[c] = VLOAD(s + c * VW);
                rb_cur = rb;
            }
        }
        VF w[4 * NN_C];
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) {
            w[c] = FN(wload)(dt, wr + c * VW * es);
            if (dt == MS_DT_F8E4M3) w[c] = VMUL(w[c], sv[c]);
        }
#pragma GCC unroll 4
        for (int m = 0; m < MB; m++) {
            VF xb = VSET1(x0[m * t->ldx + k]);
#pragma GCC unroll 16
            for (int c = 0; c < C; c++) acc[m][c] = VFMA(xb, w[c], acc[m][c]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) {
            float *yo = t->y + (m0 + m) * t->ldy + n + c * VW;
            if (t->accumulate) acc[m][c] = VADD(acc[m][c], VLOAD(yo));
            VSTORE(yo, acc[m][c]);
        }
}

AI void FN(nn_cols_mb)(const mm_task *t, const int dt, const int MB, int64_t m0, int64_t n0,
                       int64_t n1)
{
    int64_t n = n0;
    /* one activation row: whole rows of MLA's W_UK (256 columns) per pass, so
     * W is read in order */
    if (MB == 1 && dt != MS_DT_F8E4M3)
        for (; n + 4 * NN_C * VW <= n1; n += 4 * NN_C * VW) FN(nn_tile)(t, dt, 1, 4 * NN_C, m0, n);
    if (MB == 1) /* one activation row: twice the columns per pass over W */
        for (; n + 2 * NN_C * VW <= n1; n += 2 * NN_C * VW) FN(nn_tile)(t, dt, 1, 2 * NN_C, m0, n);
    for (; n + NN_C * VW <= n1; n += NN_C * VW) FN(nn_tile)(t, dt, MB, NN_C, m0, n);
    for (; n + VW <= n1; n += VW) FN(nn_tile)(t, dt, MB, 1, m0, n);
    const ms_mat *W = t->W;
    const int es = dt == MS_DT_F32 ? 4 : dt == MS_DT_F8E4M3 ? 1 : 2;
    for (; n < n1; n++) /* column tail: scalar, same FP32 order */
        for (int m = 0; m < MB; m++) {
            float s = 0;
            for (int64_t k = 0; k < W->rows; k++) {
                float wv = FN(wget)(dt, (const char *)W->data + (k * W->ld + n) * es);
                if (dt == MS_DT_F8E4M3)
                    wv *= W->scale[((W->r0 + k) / 128) * W->scale_ld + (W->c0 + n) / 128];
                s = fmaf(t->x[(m0 + m) * t->ldx + k], wv, s);
            }
            float *yo = t->y + (m0 + m) * t->ldy + n;
            *yo = t->accumulate ? *yo + s : s;
        }
}

AI void FN(nn_dt)(const mm_task *t, const int dt, int64_t n0, int64_t n1)
{
    for (int64_t m0 = 0; m0 < t->M; m0 += 4) {
        int64_t mb = t->M - m0 < 4 ? t->M - m0 : 4;
        switch (mb) {
        case 1:
            FN(nn_cols_mb)(t, dt, 1, m0, n0, n1);
            break;
        case 2:
            FN(nn_cols_mb)(t, dt, 2, m0, n0, n1);
            break;
        case 3:
            FN(nn_cols_mb)(t, dt, 3, m0, n0, n1);
            break;
        default:
            FN(nn_cols_mb)(t, dt, 4, m0, n0, n1);
            break;
        }
    }
}

void FN(nn)(const mm_task *t, int64_t n0, int64_t n1)
{
    switch (t->W->dtype) {
    case MS_DT_F32:
        FN(nn_dt)(t, MS_DT_F32, n0, n1);
        break;
    case MS_DT_BF16:
        FN(nn_dt)(t, MS_DT_BF16, n0, n1);
        break;
    case MS_DT_F16:
        FN(nn_dt)(t, MS_DT_F16, n0, n1);
        break;
    case MS_DT_F8E4M3:
        FN(nn_dt)(t, MS_DT_F8E4M3, n0, n1);
        break;
    default:
        break;
    }
}

/* out[i] = dequantised in[i] (FP8 unscaled), exact. */
void FN(cvt)(ms_dtype dt, const void *in, float *out, int64_t n)
{
    const int es = ms_dtype_size(dt);
    const char *p = in;
    int64_t i = 0;
    switch (dt) {
    case MS_DT_F32:
        for (; i + VW <= n; i += VW) VSTORE(out + i, FN(wload)(MS_DT_F32, p + i * es));
        break;
    case MS_DT_BF16:
        for (; i + VW <= n; i += VW) VSTORE(out + i, FN(wload)(MS_DT_BF16, p + i * es));
        break;
    case MS_DT_F16:
        for (; i + VW <= n; i += VW) VSTORE(out + i, FN(wload)(MS_DT_F16, p + i * es));
        break;
    case MS_DT_F8E4M3:
        for (; i + VW <= n; i += VW)
            VSTORE(out + i, VMUL(FN(wload)(MS_DT_F8E4M3, p + i * es), VSET1(256.0f)));
        break;
    default:
        return;
    }
    for (; i < n; i++) out[i] = FN(wget)(dt, p + i * es);
}
