/* mm_avx512.c — exact FP32 matmul kernels for AVX-512 (F, BW, VL, DQ):
 * mm_f32_tmpl.h instantiated with 16-lane vectors.  Compiled for AVX-512 by
 * the pragma below; matmul.c calls it on pool threads only when the CPU has
 * AVX-512 (kctx->isa >= MS_ISA_AVX512). */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/mm_internal.h"

static inline __m512 load_bf16x16(const void *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* 16 e4m3 codes -> f32 values × 2^-8, exactly, through f16 (NaN codes -> NaN). */
static inline __m512 load_f8x16(const void *p)
{
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i t = _mm256_slli_epi16(b, 7);
    __m256i h = _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
    __m512 f = _mm512_cvtph_ps(h);
    __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)),
                                            _mm256_set1_epi16(0x7f));
    return _mm512_mask_blend_ps(nan, f, _mm512_set1_ps(NAN));
}

/* 16 e4m3 codes other than NaN -> f32 values × 2^-120, exactly (as mm_avx2.c's load_f8p8). */
static inline __m512 load_f8p16(const void *p)
{
    __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_slli_epi32(b, 20), _mm512_set1_epi32((int)0x87ffffff)));
}

/* The e2m1 table times s (entry c = code c's value · s; +0 at code 8). */
static inline __m512 f4_tbl16(float s)
{
    const __m512 t = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 0.0f, -0.5f,
                                    -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    return _mm512_mul_ps(t, _mm512_set1_ps(s));
}

/* 16 codes (8 bytes at p, low nibble first) as entries of tbl: each byte
 * and its copy shifted right by 4 interleaved, widened to dwords; vpermps
 * reads only the low 4 bits of each index. */
static inline __m512 load_f4x16(const void *p, __m512 tbl)
{
    __m128i v = _mm_loadl_epi64((const __m128i *)p);
    __m128i u = _mm_unpacklo_epi8(v, _mm_srli_epi16(v, 4));
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(u), tbl);
}

#define VW               16
#define VF               __m512
#define VZERO()          _mm512_setzero_ps()
#define VSET1(f)         _mm512_set1_ps(f)
#define VLOAD(p)         _mm512_loadu_ps(p)
#define VSTORE(p, v)     _mm512_storeu_ps(p, v)
#define VFMA(a, b, c)    _mm512_fmadd_ps(a, b, c)
#define VMUL(a, b)       _mm512_mul_ps(a, b)
#define VADD(a, b)       _mm512_add_ps(a, b)
#define VHSUM(v)         _mm512_reduce_add_ps(v)
#define VLOAD_BF16(p)    load_bf16x16(p)
#define VLOAD_F16(p)     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VLOAD_F8(p)      load_f8x16(p)
#define VLOAD_F8P(p)     load_f8p16(p)
#define VF4_TBL(s)       f4_tbl16(s)
#define VLOAD_F4(p, tbl) load_f4x16(p, tbl)
#define FN(name)         ms_mm_avx512_##name
#define NT_MB            4
#define NT_R(mb)         ((mb) == 1 ? 8 : (mb) == 2 ? 6 : 4)
#define NN_C             4

#include "kernels/mm_f32_tmpl.h"
