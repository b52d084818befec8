/* attn_block_f32.c — one block of a long sequence's MLA decode attention in
 * FP32 on AVX2 + FMA (attn_block_f32.h): where AVX512_BF16 is missing, attn.c
 * splits a long sequence into the blocks its BF16 path uses and hands each
 * block here, so every cached row is read from memory once for all heads
 * (one head block per thread read the whole sequence twice per block of heads).
 * Heads in the lanes, as attn_mqa.c:
 * - scores: 6 rows at a time (12 where Hp is not a multiple of 16), widened
 *   to f32 in L1 first; one broadcast of a row value feeds 8 heads of the
 *   transposed query (qt[R][Hp]), 2 × 8 heads × 6 rows or 8 heads × 12 rows in
 *   12 accumulators, no horizontal sums;
 * - the softmax down the rows with 8 heads in the lanes (ms_exp8);
 * - the context 16 columns × 6 heads (or 4, 2) per pass over 128 rows, whose
 *   values and probabilities stay in L1 for all passes (sums carried in ctx): 16
 *   bf16 values widened by two unpacks against zero, which order the columns
 *   {0-3, 8-11} and {4-7, 12-15}, put back with two 128-bit permutes at the store.
 */
#include "kernels/attn_block_f32.h"

#include "kernels/avx2_inl.h"
#include "kernels/kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* Scores of the NR rows at wb (R floats apart) for the NQ lane groups of
 * heads at qt + l (lanes hp apart per value): sc[r][hp] + l, the first nr
 * rows stored.  NQ · NR = 12 sums; the queries pinned in registers (gcc
 * otherwise folds each into every FMA, a load per FMA). */
AI void scores_rows(const int NQ, const int NR, const float *wb, int64_t R, const float *qt,
                    int64_t hp, int64_t l, int64_t nr, __m256 vs, float *sc)
{
    __m256 a[12];
#pragma GCC unroll 12
    for (int i = 0; i < NQ * NR; i++) a[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < R; k++) {
        __m256 q0 = _mm256_loadu_ps(qt + k * hp + l),
               q1 = NQ > 1 ? _mm256_loadu_ps(qt + k * hp + l + 8) : q0;
        __asm__("" : "+x"(q0), "+x"(q1));
#pragma GCC unroll 12
        for (int r = 0; r < NR; r++) {
            __m256 x = _mm256_broadcast_ss(wb + r * R + k);
            a[r * NQ] = _mm256_fmadd_ps(q0, x, a[r * NQ]);
            if (NQ > 1) a[r * NQ + 1] = _mm256_fmadd_ps(q1, x, a[r * NQ + 1]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < NQ * NR; i++) /* constant indices: the sums stay in registers */
        if (i / NQ < nr)
            _mm256_storeu_ps(sc + (i / NQ) * hp + l + 8 * (i % NQ), _mm256_mul_ps(a[i], vs));
}

/* Context of heads [g, g + NG) (probabilities p[t][hp] + g, NG <= 6),
 * columns [c, c + 16), over rows rp[0..n), added to ctx when add; the first
 * nhg heads stored. */
AI void ctx_16(const int NG, const char *const *rp, int64_t n, const float *p, int64_t hp,
               int64_t c, int64_t nhg, int64_t V, float *ctx, int add)
{
    __m256 lo[6], hi[6];
    const __m256i z = _mm256_setzero_si256();
#pragma GCC unroll 6
    for (int h = 0; h < NG; h++) lo[h] = hi[h] = _mm256_setzero_ps();
    if (add)
#pragma GCC unroll 6
        for (int h = 0; h < NG; h++) {
            if (h >= nhg) break;
            __m256 a0 = _mm256_loadu_ps(ctx + h * V + c), a1 = _mm256_loadu_ps(ctx + h * V + c + 8);
            lo[h] = _mm256_permute2f128_ps(a0, a1, 0x20);
            hi[h] = _mm256_permute2f128_ps(a0, a1, 0x31);
        }
    for (int64_t t = 0; t < n; t++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(rp[t] + 2 * c));
        __m256 xl = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x)),
               xh = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x));
#pragma GCC unroll 6
        for (int h = 0; h < NG; h++) {
            __m256 pv = _mm256_broadcast_ss(p + t * hp + h);
            lo[h] = _mm256_fmadd_ps(pv, xl, lo[h]);
            hi[h] = _mm256_fmadd_ps(pv, xh, hi[h]);
        }
    }
#pragma GCC unroll 6
    for (int h = 0; h < NG; h++) {
        if (h >= nhg) break;
        _mm256_storeu_ps(ctx + h * V + c, _mm256_permute2f128_ps(lo[h], hi[h], 0x20));
        _mm256_storeu_ps(ctx + h * V + c + 8, _mm256_permute2f128_ps(lo[h], hi[h], 0x31));
    }
}

void ms_attn_block_f32(const char *const *rp, int64_t n, int64_t R, int64_t V, const float *q,
                       int64_t nh, float scale, int fresh, float *scratch, float *ctx, float *mx,
                       float *sm)
{
    const int64_t hp = (nh + 7) & ~(int64_t)7;
    float *sc = scratch, *qt = sc + hp * MS_ATTN_CHUNK, *wb = qt + hp * R; /* [12][R] */
    if (fresh)
        for (int64_t k = 0; k < R; k++)
            for (int64_t h = 0; h < hp; h++) qt[k * hp + h] = h < nh ? q[h * R + k] : 0.0f;
    const __m256 vs = _mm256_set1_ps(scale);
    /* 6 rows per step where every lane group is 16 heads (qt and the rows in
     * L1), 12 where a group of 8 takes 12 rows at once */
    const int64_t step = hp % 16 ? 12 : 6;
    for (int64_t s = 0; s < n; s += step) {
        const int64_t nr = n - s < step ? n - s : step;
        for (int64_t r = 0; r < step; r++) {
            if (r < nr)
                ms_cvt_to_f32(MS_ISA_AVX2, MS_DT_BF16, rp[s + r], wb + r * R, R);
            else
                memset(wb + r * R, 0, sizeof(float) * (size_t)R);
            if (s + step + r < n) /* the next step's rows towards L1 */
                for (int64_t b = 0; b < 2 * R; b += 64)
                    _mm_prefetch(rp[s + step + r] + b, _MM_HINT_T0);
        }
        int64_t l = 0;
        for (; l + 16 <= hp; l += 16) /* 2 x 8 heads x 6 rows */
            for (int64_t r0 = 0; r0 < step; r0 += 6)
                scores_rows(2, 6, wb + r0 * R, R, qt, hp, l, nr - r0, vs, sc + (s + r0) * hp);
        if (l < hp) scores_rows(1, 12, wb, R, qt, hp, l, nr, vs, sc + s * hp);
    }
    for (int64_t l = 0; l < hp; l += 8) { /* 8 heads in the lanes, down the rows */
        __m256 m = _mm256_set1_ps(-INFINITY), e = _mm256_setzero_ps();
        for (int64_t t = 0; t < n; t++) m = _mm256_max_ps(m, _mm256_loadu_ps(sc + t * hp + l));
        for (int64_t t = 0; t < n; t++) {
            __m256 x = ms_exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + t * hp + l), m));
            _mm256_storeu_ps(sc + t * hp + l, x);
            e = _mm256_add_ps(e, x);
        }
        __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), e);
        for (int64_t t = 0; t < n; t++)
            _mm256_storeu_ps(sc + t * hp + l, _mm256_mul_ps(_mm256_loadu_ps(sc + t * hp + l), inv));
        float mv[8], ev[8];
        _mm256_storeu_ps(mv, m);
        _mm256_storeu_ps(ev, e);
        for (int64_t h = l; h < l + 8 && h < nh; h++) mx[h] = mv[h - l], sm[h] = ev[h - l];
    }
    for (int64_t t0 = 0; t0 < n; t0 += 128) {
        const int64_t nt = n - t0 < 128 ? n - t0 : 128, add = t0 > 0;
        const float *pt = sc + t0 * hp;
        for (int64_t c = 0; c < V; c += 16) {
            int64_t g = 0; /* 6 heads at a time, 4 + 4 for the last 8, pairs within Hp */
            for (; g + 6 <= nh && nh - g != 8; g += 6)
                ctx_16(6, rp + t0, nt, pt + g, hp, c, 6, V, ctx + g * V, add);
            for (; g + 4 <= nh; g += 4)
                ctx_16(4, rp + t0, nt, pt + g, hp, c, 4, V, ctx + g * V, add);
            for (; g < nh; g += 2)
                ctx_16(2, rp + t0, nt, pt + g, hp, c, nh - g, V, ctx + g * V, add);
        }
    }
}
