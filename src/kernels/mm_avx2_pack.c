/* mm_avx2_pack.c — the packed-panel FP32 matmul y = x·Wᵀ on AVX2 + FMA for
 * auto mode at mid and large M (prefill, a batch's experts) where no BF16 dot
 * products exist (Zen 2/3, Intel before Sapphire Rapids): BLIS-style, no
 * horizontal sums.
 *
 * The activation rows are copied once per pool run and thread into groups of
 * MR = 6, xa[g][k][8] (8×8 transposes; one stream for the broadcasts whatever
 * ldx: rows 4 KiB apart would share one set of L1), reused across the calls
 * of a run that share x (a product's slices, an expert's gate and up).  Per
 * call (output columns [n0, n1)), in chunks of NCH = 128 of them and KC = 256
 * columns of K at a time, the chunk's weight rows are dequantised exactly to
 * f32 (as ms_mat_get: FP8 is code × its block scale, one rounding) into
 * panels pb[kc][16], then micro-kernels of 6 rows × 2 vectors of 8 columns
 * keep 12 sums in lanes along n: per column k, each row's x is broadcast and
 * feeds two FMAs against the panel's two vectors, MB = 48 rows per pass over
 * the chunk's panels.  Each output
 * is one FMA chain in k order (started from y when accumulating), so its bits
 * do not depend on M, the split or the tile, but they differ from
 * mm_f32_tmpl.h's (lanes along k, then a horizontal sum): the exact and the
 * batch-invariant modes, which must give one order for every M, never come
 * here.  BF16, F16, F32, F8E4M3 and F4E2M1 weights (FP4: code × its block
 * scale, exact, 32 columns at a time where blocks start at a panel's
 * columns, else ms_mat_get).  Scalar twin:
 * ms_matmul_ref (tests/test_kernels.c: matmul_all_paths; test_kernels_avx2.c:
 * matmul_avx2_pack_taken).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/avx2_inl.h"
#include "kernels/mm_internal.h"

#define AI static inline __attribute__((always_inline))

enum {
    PW = 16,   /* panel width: weight rows (output columns) packed at once */
    MR = 6,    /* activation rows per micro-kernel (6 × 2 = 12 sums in registers) */
    KC = 256,  /* columns per panel: 16 KiB of f32, L1-resident */
    NCH = 128, /* output columns packed at once: 8 panels, 128 KiB (L2) */
    MB = 48,   /* activation rows per pass over a chunk's panels: 8 groups (L2) */
    XS = 8,    /* floats per column in a group of MR rows (lanes MR.. zero) */
};
/* x packed whole per thread up to this (beyond it, MB rows per block) */
#define XA_MAX ((size_t)64 << 20)

/* 8×8 transpose of f32: r[i] row i -> r[c] column c. */
AI void tr8(__m256 *r)
{
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* Row r of FP4 W, columns [k0, k0 + kc), as f32 at o (exact, as ms_mat_get):
 * whole 32-column blocks through vpshufb (twice the value as an int8) times
 * half the block's scale, the rest (views whose blocks do not start at k0,
 * the last part-block) element by element. */
static void f4_row(const ms_mat *W, int64_t r, int64_t k0, int64_t kc, float *o)
{
    int64_t k = 0;
    if ((W->c0 + k0) % 32 == 0) {
        const uint8_t *b = (const uint8_t *)W->data + r * (W->ld / 2) + k0 / 2;
        const uint8_t *e = W->e8scale + (W->r0 + r) * W->scale_ld + (W->c0 + k0) / 32;
        for (; k + 32 <= kc; k += 32) {
            __m128i lo, hi;
            ms_f4_i8x16(_mm_loadu_si128((const __m128i *)(b + k / 2)), &lo, &hi);
            const __m128i a = _mm_unpacklo_epi8(lo, hi), c = _mm_unpackhi_epi8(lo, hi);
            const __m256 s = _mm256_set1_ps(ms_e8m0_to_f32(e[k / 32]) * 0.5f);
            _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), s));
            _mm256_storeu_ps(
                o + k + 8,
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))), s));
            _mm256_storeu_ps(o + k + 16,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), s));
            _mm256_storeu_ps(
                o + k + 24,
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8))), s));
        }
    }
    for (; k < kc; k++) o[k] = ms_mat_get(W, r, k0 + k);
}

/* Panel of weight rows [n, n + nr) (nr ≤ PW) × columns [k0, k0 + kc) of W:
 * pb[k][j] = W(n + j, k0 + k) as f32, zero for j ≥ nr.  rows: scratch of
 * PW × KC floats for the rows dequantised in order. */
static void pack(const ms_mat *W, int64_t n, int nr, int64_t k0, int64_t kc, float *rows, float *pb)
{
    const int es = ms_dtype_size(W->dtype);
    for (int j = 0; j < PW; j++) {
        float *o = rows + j * KC;
        if (j >= nr) {
            memset(o, 0, sizeof(float) * (size_t)kc);
            continue;
        }
        if (W->dtype == MS_DT_F4E2M1) {
            f4_row(W, n + j, k0, kc, o);
            continue;
        }
        ms_mm_avx2_cvt(W->dtype, (const char *)W->data + ((n + j) * W->ld + k0) * es, o, kc);
        if (W->dtype == MS_DT_F8E4M3) { /* code × block scale, per 128-column block */
            const float *srow = W->scale + ((W->r0 + n + j) / 128) * W->scale_ld;
            for (int64_t k = 0; k < kc;) {
                int64_t cb = (W->c0 + k0 + k) / 128, ke = (cb + 1) * 128 - W->c0 - k0;
                if (ke > kc) ke = kc;
                const float s = srow[cb];
                for (; k < ke; k++) o[k] *= s;
            }
        }
    }
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8)
        for (int g = 0; g < PW; g += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(rows + (g + i) * KC + k);
            tr8(r);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(pb + (k + i) * PW + g, r[i]);
        }
    for (; k < kc; k++)
        for (int j = 0; j < PW; j++) pb[k * PW + j] = rows[j * KC + k];
}

/* y[m][0..nc) (=|+=) over rows [0, mr) of the group xt[kc][XS]: one FMA chain
 * per output over the panel's kc columns, started from y when `load` (a later
 * column block, or accumulate). */
AI void micro(const int mr, const float *xt, const float *pb, int64_t kc, float *y, int64_t ldy,
              int nc, int load)
{
    __m256 acc[MR][2];
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc - 8), lane);
#pragma GCC unroll 6
    for (int m = 0; m < mr; m++) {
        if (load && nc == PW) {
            acc[m][0] = _mm256_loadu_ps(y + m * ldy);
            acc[m][1] = _mm256_loadu_ps(y + m * ldy + 8);
        } else if (load) {
            acc[m][0] = _mm256_maskload_ps(y + m * ldy, m0);
            acc[m][1] = _mm256_maskload_ps(y + m * ldy + 8, m1);
        } else {
            acc[m][0] = _mm256_setzero_ps();
            acc[m][1] = _mm256_setzero_ps();
        }
    }
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        const __m256 w0 = _mm256_loadu_ps(pb + k * PW), w1 = _mm256_loadu_ps(pb + k * PW + 8);
#pragma GCC unroll 6
        for (int m = 0; m < mr; m++) {
            const __m256 xb = _mm256_broadcast_ss(xt + k * XS + m);
            acc[m][0] = _mm256_fmadd_ps(xb, w0, acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(xb, w1, acc[m][1]);
        }
    }
#pragma GCC unroll 6
    for (int m = 0; m < mr; m++) {
        if (nc == PW) {
            _mm256_storeu_ps(y + m * ldy, acc[m][0]);
            _mm256_storeu_ps(y + m * ldy + 8, acc[m][1]);
        } else {
            _mm256_maskstore_ps(y + m * ldy, m0, acc[m][0]);
            _mm256_maskstore_ps(y + m * ldy + 8, m1, acc[m][1]);
        }
    }
}

/* micro() for the last 1..MR-1 rows of a block. */
static void micro_tail(int mr, const float *xt, const float *pb, int64_t kc, float *y, int64_t ldy,
                       int nc, int load)
{
    switch (mr) {
    case 1:
        micro(1, xt, pb, kc, y, ldy, nc, load);
        break;
    case 2:
        micro(2, xt, pb, kc, y, ldy, nc, load);
        break;
    case 3:
        micro(3, xt, pb, kc, y, ldy, nc, load);
        break;
    case 4:
        micro(4, xt, pb, kc, y, ldy, nc, load);
        break;
    default:
        micro(5, xt, pb, kc, y, ldy, nc, load);
        break;
    }
}

/* Rows [0, mb) of x, columns [0, kc), into groups of MR rows: group g at
 * xt + g·gs holds xt[k][XS] (lane m: row g·MR + m; lanes past the rows zero). */
static void pack_x(const float *x, int64_t ldx, int64_t mb, int64_t kc, float *xt, int64_t gs)
{
    for (int64_t g = 0; g * MR < mb; g++) {
        const int mr = (int)(mb - g * MR < MR ? mb - g * MR : MR);
        const float *r0 = x + g * MR * ldx;
        float *o = xt + g * gs;
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++)
                r[m] = m < mr ? _mm256_loadu_ps(r0 + m * ldx + k) : _mm256_setzero_ps();
            tr8(r);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + (k + i) * XS, r[i]);
        }
        for (; k < kc; k++)
            for (int m = 0; m < XS; m++) o[k * XS + m] = m < mr ? r0[m * ldx + k] : 0.0f;
    }
}

/* What MM_SCR_A2X holds on this thread: x of one run, packed whole. */
static _Thread_local struct {
    const float *x, *xa;
    int64_t ldx, M, K;
    uint64_t run;
} held_x;

int ms_mm_avx2_pack_nt(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    if (W->dtype != MS_DT_BF16 && W->dtype != MS_DT_F16 && W->dtype != MS_DT_F32 &&
        W->dtype != MS_DT_F8E4M3 && W->dtype != MS_DT_F4E2M1)
        return -1;
    const int64_t K = W->cols, M = t->M, G = (M + MR - 1) / MR;
    /* x packed once per run and thread (a call covers a few panels, and an
     * expert's gate and up share x), or per block past XA_MAX */
    const size_t whole = sizeof(float) * (size_t)(G * K * XS);
    float *xa = t->run && whole <= XA_MAX ? ms_mm_scratch(MM_SCR_A2X, whole) : NULL;
    if (xa && !(held_x.run == t->run && held_x.x == t->x && held_x.xa == xa &&
                held_x.ldx == t->ldx && held_x.M == M && held_x.K == K)) {
        pack_x(t->x, t->ldx, M, K, xa, K * XS);
        held_x.x = t->x, held_x.xa = xa, held_x.ldx = t->ldx, held_x.M = M, held_x.K = K;
        held_x.run = t->run;
    }
    float *rows =
        ms_mm_scratch(MM_SCR_W, sizeof(float) * (PW + NCH + (xa ? 0 : MB / MR * XS)) * KC);
    if (!rows) return -1;
    float *pbs = rows + PW * KC, *xb = pbs + NCH * KC;
    const int64_t gs = xa ? K * XS : KC * XS; /* floats from one group to the next */
    for (int64_t c0 = n0; c0 < n1; c0 += NCH) {
        const int64_t cn = n1 - c0 < NCH ? n1 - c0 : NCH;
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t kc = K - k0 < KC ? K - k0 : KC;
            const int load = k0 > 0 || t->accumulate;
            for (int64_t p = 0; p * PW < cn; p++)
                pack(W, c0 + p * PW, (int)(cn - p * PW < PW ? cn - p * PW : PW), k0, kc, rows,
                     pbs + p * PW * KC);
            for (int64_t m0 = 0; m0 < M; m0 += MB) {
                const int64_t mb = M - m0 < MB ? M - m0 : MB;
                const float *xt = xa ? xa + m0 / MR * gs + k0 * XS : xb;
                if (!xa) pack_x(t->x + m0 * t->ldx + k0, t->ldx, mb, kc, xb, gs);
                for (int64_t p = 0; p * PW < cn; p++) {
                    const int nc = (int)(cn - p * PW < PW ? cn - p * PW : PW);
                    const float *pb = pbs + p * PW * KC;
                    float *y = t->y + m0 * t->ldy + c0 + p * PW;
                    int64_t g = 0;
                    for (; (g + 1) * MR <= mb; g++)
                        micro(MR, xt + g * gs, pb, kc, y + g * MR * t->ldy, t->ldy, nc, load);
                    if (g * MR < mb)
                        micro_tail((int)(mb - g * MR), xt + g * gs, pb, kc, y + g * MR * t->ldy,
                                   t->ldy, nc, load);
                }
            }
        }
    }
    return 0;
}
