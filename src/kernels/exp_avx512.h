/* exp_avx512.h — exp(x) for 16 FP32 lanes, AVX-512F, for the kernels under
 * src/kernels that need it inline (attn.c, attn_prefill.c).  Not part of the
 * kernel API.  Any thread. */
#ifndef MS_KERNELS_EXP_AVX512_H
#define MS_KERNELS_EXP_AVX512_H

#include <immintrin.h>

/* exp(x) for 16 lanes: vec.c's exp8 (Cody-Waite by ln 2, Cephes degree 6);
 * x < -87.3 (also -inf) gives 0. */
static inline __attribute__((always_inline, target("avx512f"))) __m512 ms_exp16(__m512 x)
{
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i ni = _mm512_cvtps_epi32(n), h = _mm512_srai_epi32(ni, 1); /* 2^n as two normals */
    __m512 s1 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(h, _mm512_set1_epi32(127)), 23));
    __m512 s2 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, h), _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_mul_ps(_mm512_mul_ps(y, s1), s2));
}

#endif
