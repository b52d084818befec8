/* avx2_inl.h — the small AVX2 helpers the kernel files share: horizontal sum
 * and maximum of 8 lanes, 8 bf16 values widened to f32, exp of 8 lanes, the
 * e2m1 (FP4) codes' doubled values as int8.  AVX2 is the build
 * baseline (x86-64-v3), so any file under src/kernels may include it. */
#ifndef MS_KERNELS_AVX2_INL_H
#define MS_KERNELS_AVX2_INL_H

#include <immintrin.h>

/* v[0] + ... + v[7], pairwise: (0+4, 1+5, 2+6, 3+7), then halves, then lanes. */
static inline __attribute__((always_inline)) float ms_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* max(v[0], ..., v[7]) (in the order of ms_hsum8). */
static inline __attribute__((always_inline)) float ms_hmax8(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* The 8 bf16 values at p (any alignment) as f32, exactly. */
static inline __attribute__((always_inline)) __m256 ms_load_bf16x8(const void *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* The 32 e2m1 codes in the 16 bytes b (low nibble first) as twice their
 * values, int8 (exact; code 8, -0, gives 0): *ev the low nibbles (even
 * columns), *od the high ones (odd columns). */
static inline __attribute__((always_inline)) void ms_f4_i8x16(__m128i b, __m128i *ev, __m128i *od)
{
    const __m128i tbl = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12),
                  m4 = _mm_set1_epi8(0x0f);
    *ev = _mm_shuffle_epi8(tbl, _mm_and_si128(b, m4));
    *od = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
}

/* ms_f4_i8x16 on each 128-bit lane of b (two blocks of 32 codes). */
static inline __attribute__((always_inline)) void ms_f4_i8x32(__m256i b, __m256i *ev, __m256i *od)
{
    const __m256i tbl = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0,
                                         1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12),
                  m4 = _mm256_set1_epi8(0x0f);
    *ev = _mm256_shuffle_epi8(tbl, _mm256_and_si256(b, m4));
    *od = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(b, 4), m4));
}

/* exp(x) for 8 lanes: Cody-Waite reduction by ln 2 and the Cephes degree-6
 * polynomial; x < -87.3 (also -inf) gives 0, x > 88.7 gives 3e38. */
static inline __attribute__((always_inline)) __m256 ms_exp8(__m256 x)
{
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n: n in [-126, 128]; split so that both factors are normal */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i h = _mm256_srai_epi32(ni, 1);
    __m256 s1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(_mm256_mul_ps(y, s1), s2));
}

#endif
