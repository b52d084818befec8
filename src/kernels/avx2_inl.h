/* avx2_inl.h — the small AVX2 helpers the kernel files share: horizontal sum
 * and maximum of 8 lanes, 8 bf16 values widened to f32.  AVX2 is the build
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

#endif
