/* mm_avx512_inl.h — small AVX-512 helpers that the auto-mode matmul kernels
 * mm_bf16.c and mm_widen.c share: loading 16 activations with their FP8 block
 * scales, and storing 64 output columns.  Include after the file's target
 * pragma (AVX-512 F/BW/VL/DQ at least); only those two files include it. */
#ifndef MS_KERNELS_MM_AVX512_INL_H
#define MS_KERNELS_MM_AVX512_INL_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/mm_internal.h"

/* x[k .. k + 15] of one activation row (zero at and past K), when srow is
 * given times f · the FP8 block scale of each column, srow[((c0 + k + e) /
 * 128) · sld] (c0: the view's origin along x; 16 columns at a 16-aligned
 * position never straddle a 128-column block). */
static inline __attribute__((always_inline)) __m512
mm_x16(const float *x, int64_t k, int64_t K, const float *srow, int64_t c0, int64_t sld, float f)
{
    int64_t rem = K - k;
    __mmask16 mk = rem >= 16 ? 0xffff : rem <= 0 ? 0 : (__mmask16)((1u << rem) - 1);
    __m512 v = _mm512_maskz_loadu_ps(mk, x + k);
    if (!srow || rem <= 0) return v;
    if (((c0 + k) & 15) == 0)
        return _mm512_mul_ps(v, _mm512_set1_ps(f * srow[(c0 + k) / 128 * sld]));
    float s16[16];
    for (int e = 0; e < 16; e++) s16[e] = e < rem ? f * srow[(c0 + k + e) / 128 * sld] : 0.0f;
    return _mm512_mul_ps(v, _mm512_loadu_ps(s16));
}

/* o[0..3] as the 64 columns at yo, the first rem of them (all from 64 on),
 * added to what is there when t->accumulate. */
static inline __attribute__((always_inline)) void mm_store64(const mm_task *t, float *yo,
                                                             const __m512 *o, int64_t rem)
{
    for (int v = 0; v < 4; v++) {
        int64_t rv = rem - 16 * v;
        __mmask16 mk = rv >= 16 ? 0xffff : rv <= 0 ? 0 : (__mmask16)((1u << rv) - 1);
        __m512 r =
            t->accumulate ? _mm512_add_ps(o[v], _mm512_maskz_loadu_ps(mk, yo + 16 * v)) : o[v];
        _mm512_mask_storeu_ps(yo + 16 * v, mk, r);
    }
}

/* FP8 codes as bf16(code × 2^-8), the form both files' x·Wᵀ kernels convert
 * to (the activations carry the 256): the high-byte table ms_f8_bf16_hi[64h
 * .. 64h + 63] with 4 taken from every entry but zero and NaN (an exponent 8
 * less); the low bytes are ms_f8_bf16_lo's. */
static inline __attribute__((always_inline)) __m512i mm_f8_hi_scaled(int h)
{
    const __m512i four = _mm512_set1_epi8(4), nan = _mm512_set1_epi8(0x7f);
    __m512i t = _mm512_loadu_si512(ms_f8_bf16_hi + 64 * h);
    __mmask64 k = _mm512_test_epi8_mask(t, t) & _mm512_cmpneq_epi8_mask(t, nan);
    return _mm512_mask_sub_epi8(t, k, t, four);
}

/* The same for 64 plain codes (exponent field 1..15, not NaN) without the
 * tables: s eeee mmm -> bf16 s 0111eeee mmm0000 = code × 2^-8 (the exponent
 * offset 112 has no bit in common with eeee).  Both bytes are bit
 * permutations of the code, one GF(2) affine transform each (GFNI; the high
 * byte's 0111 is the transform's constant): high = s 0111 e3 e2 e1, low = e0
 * m2 m1 m0 0000.  The caller's target must include GFNI. */
static inline __attribute__((always_inline, target("avx512f,avx512bw,gfni"))) void
mm_f8_plain_bytes(__m512i c, __m512i *lo, __m512i *hi)
{
    /* gf2p8affine: result bit i = parity(A.byte[7 - i] & x) ^ imm.bit[i] */
    const __m512i ahi = _mm512_set1_epi64(0x1020400000000080ll); /* bits 7, 2, 1, 0 <- 7, 6, 5, 4 */
    const __m512i alo = _mm512_set1_epi64(0x0000000001020408ll); /* bits 7..4 <- 3..0 */
    *lo = _mm512_gf2p8affine_epi64_epi8(c, alo, 0x00);
    *hi = _mm512_gf2p8affine_epi64_epi8(c, ahi, 0x38);
}

/* The x·W drivers' column loop (mm_bf16.c, mm_widen.c): activation rows in
 * groups of mb ≤ 4, columns [n0, n1) in chunks of 64·cw (cw = 4, 2, 1 for mb
 * = 1, 2, 3..4, so the sums fit the registers); CHUNK(full, mb, cw, n, rem)
 * runs one chunk, full when it has all 64·cw columns (rem of them valid). */
static inline int mm_nn_cw(int mb)
{
    return mb == 1 ? 4 : mb == 2 ? 2 : 1;
}
#define MM_NN_CHUNK_1(CHUNK, mb, mb_, cw_, n, rem)                                                 \
    if ((mb) == mb_) {                                                                             \
        if ((rem) == 64 * cw_)                                                                     \
            CHUNK(1, mb_, cw_, n, rem);                                                            \
        else                                                                                       \
            CHUNK(0, mb_, cw_, n, rem);                                                            \
    }
#define MM_NN_COLUMNS(CHUNK, mb, n0, n1)                                                           \
    for (int64_t n_ = (n0); n_ < (n1); n_ += 64 * mm_nn_cw(mb)) {                                  \
        int64_t rem_ = (n1)-n_ < 64 * mm_nn_cw(mb) ? (n1)-n_ : 64 * mm_nn_cw(mb);                  \
        MM_NN_CHUNK_1(CHUNK, mb, 1, 4, n_, rem_)                                                   \
        MM_NN_CHUNK_1(CHUNK, mb, 2, 2, n_, rem_)                                                   \
        MM_NN_CHUNK_1(CHUNK, mb, 3, 1, n_, rem_)                                                   \
        MM_NN_CHUNK_1(CHUNK, mb, 4, 1, n_, rem_)                                                   \
    }

#endif
