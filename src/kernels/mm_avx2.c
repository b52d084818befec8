/* mm_avx2.c — FP32 matmul kernels for AVX2 + FMA + F16C (the build
 * baseline, x86-64-v3): mm_f32_tmpl.h instantiated with 8-lane vectors (the
 * exact kernels and auto mode's one-row GEMVs), and auto mode's one-row FP4
 * GEMV (r1_f4_rows), which the template calls.  Called by matmul.c on pool
 * threads. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/avx2_inl.h"
#include "kernels/mm_internal.h"

/* 8 e4m3 codes -> f32 values × 2^-8, exactly, through f16 (NaN codes -> NaN). */
static inline __m256 load_f8x8(const void *p)
{
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i t = _mm_slli_epi16(b, 7); /* exp+man to f16 bits 7..13, sign to bit 14 */
    __m128i h = _mm_add_epi16(t, _mm_and_si128(t, _mm_set1_epi16(0x4000))); /* sign -> 15 */
    __m256 f = _mm256_cvtph_ps(h);
    __m128i nan16 = _mm_cmpeq_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f));
    __m256 nanm = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16));
    return _mm256_blendv_ps(f, _mm256_set1_ps(NAN), nanm);
}

/* 8 e4m3 codes other than NaN -> f32 values × 2^-120, exactly: the
 * sign-extended byte shifted left by 20 puts the exponent and mantissa at
 * f32's bits 26..20 and the sign at 31; the mask clears the sign's copies in
 * bits 30..27 (exponent field 0: the f32 zero or subnormal of that value). */
static inline __m256 load_f8p8(const void *p)
{
    __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_slli_epi32(b, 20), _mm256_set1_epi32((int)0x87ffffff)));
}

/* The e2m1 magnitudes times s (entry c = magnitude code c · s). */
static inline __m256 f4_tbl8(float s)
{
    const __m256 t = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    return _mm256_mul_ps(t, _mm256_set1_ps(s));
}

/* 8 codes (4 bytes at p, low nibble first) through the magnitude table
 * (vpermps reads the low 3 bits of each index), bit 3 of the code as the
 * sign: code 8 gives -0 · s, equal to ms_fp4e2m1_to_f32's +0 · s. */
static inline __m256 load_f4x8(const void *p, __m256 tbl)
{
    int32_t b4;
    memcpy(&b4, p, 4);
    __m128i v = _mm_cvtsi32_si128(b4);
    __m128i u = _mm_unpacklo_epi8(v, _mm_srli_epi16(v, 4));
    __m256i idx = _mm256_cvtepu8_epi32(u);
    __m256 mag = _mm256_permutevar8x32_ps(tbl, idx);
    __m256i sg = _mm256_and_si256(_mm256_slli_epi32(idx, 28), _mm256_set1_epi32(INT32_MIN));
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sg));
}

/* ---- auto mode, one activation row, FP4 rows (mm_f32_tmpl.h's FN(nt_auto))
 * Each 32-column scale block's 16 bytes: the low and the high nibbles split,
 * each through vpshufb into twice the e2m1 value as an int8 (exact), widened
 * and converted (vpmovsxbd, vcvtdq2ps) against activations permuted once per
 * call to the order that leaves ([even columns], [odd columns]); the block's
 * sum times its scale / 2: about half the instructions per code of the tiles
 * (load_f4x8 through a table scaled per block). */

/* Twice the e2m1 magnitudes, signed: code c -> 2 · value(c) (code 8 gives 0). */
static inline __m128i f4_i8_tbl(void)
{
    return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

/* Row w's sum over nb whole blocks (16 bytes each) against xs (32 permuted
 * floats per block), the blocks' scale bytes at e. */
static inline float r1_f4_sum(const uint8_t *w, const uint8_t *e, const float *xs, int64_t nb)
{
    const __m128i tbl = f4_i8_tbl(), m4 = _mm_set1_epi8(0x0f);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t g = 0; g < nb; g++) {
        if (!(g & 3)) _mm_prefetch((const char *)w + g * 16 + 4096, _MM_HINT_T0);
        const __m128i b = _mm_loadu_si128((const __m128i *)(w + g * 16));
        const __m128i lo = _mm_shuffle_epi8(tbl, _mm_and_si128(b, m4)),
                      hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
        const float *x = xs + g * 32;
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
        __m256 t =
            _mm256_mul_ps(_mm256_loadu_ps(x + 16), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
        s = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8),
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), s);
        t = _mm256_fmadd_ps(_mm256_loadu_ps(x + 24),
                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), t);
        const __m256 f = _mm256_set1_ps(ms_e8m0_to_f32(e[g]) * 0.5f);
        if (g & 1)
            acc1 = _mm256_fmadd_ps(_mm256_add_ps(s, t), f, acc1);
        else
            acc0 = _mm256_fmadd_ps(_mm256_add_ps(s, t), f, acc0);
    }
    return ms_hsum8(_mm256_add_ps(acc0, acc1));
}

/* What MM_SCR_A2F4 holds on this thread: x of one run, permuted. */
static _Thread_local struct {
    const float *x, *xs;
    int64_t K;
    uint64_t run;
} held_f4x;

/* Rows [n0, n1) of t (M = 1, FP4, K and c0 whole blocks); 0, or -1 without
 * scratch (the caller takes the tiles).  x is permuted once per run and
 * thread (a product comes in slices of 32 KiB, an expert's gate and up share
 * x). */
static int r1_f4_rows(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols, nb = K / 32;
    float *xs = ms_mm_scratch(MM_SCR_A2F4, sizeof(float) * (size_t)K);
    if (!xs) return -1;
    if (!t->run || held_f4x.run != t->run || held_f4x.x != t->x || held_f4x.xs != xs ||
        held_f4x.K != K) {
        for (int64_t k = 0; k < K; k += 32) /* [x0 x2 .. x30] [x1 x3 .. x31] per block */
            for (int i = 0; i < 16; i++) {
                xs[k + i] = t->x[k + 2 * i];
                xs[k + 16 + i] = t->x[k + 2 * i + 1];
            }
        held_f4x.x = t->x, held_f4x.xs = xs, held_f4x.K = K, held_f4x.run = t->run;
    }
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *w = (const uint8_t *)W->data + n * (W->ld / 2);
        const uint8_t *e = W->e8scale + (W->r0 + n) * W->scale_ld + W->c0 / 32;
        float s = r1_f4_sum(w, e, xs, nb), *yo = t->y + n;
        *yo = t->accumulate ? *yo + s : s;
    }
    return 0;
}
#define NT_R1_F4(t, n0, n1) r1_f4_rows(t, n0, n1)

#define VW               8
#define VF               __m256
#define VZERO()          _mm256_setzero_ps()
#define VSET1(f)         _mm256_set1_ps(f)
#define VLOAD(p)         _mm256_loadu_ps(p)
#define VSTORE(p, v)     _mm256_storeu_ps(p, v)
#define VFMA(a, b, c)    _mm256_fmadd_ps(a, b, c)
#define VMUL(a, b)       _mm256_mul_ps(a, b)
#define VADD(a, b)       _mm256_add_ps(a, b)
#define VHSUM(v)         ms_hsum8(v)
#define VLOAD_BF16(p)    ms_load_bf16x8(p)
#define VLOAD_F16(p)     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VLOAD_F8(p)      load_f8x8(p)
#define VLOAD_F8P(p)     load_f8p8(p)
#define VF4_TBL(s)       f4_tbl8(s)
#define VLOAD_F4(p, tbl) load_f4x8(p, tbl)
#define FN(name)         ms_mm_avx2_##name
#define NT_MB            2
#define NT_R(mb)         ((mb) == 1 ? 6 : 4)
#define NN_C             2
#define NT_FOLD          1

#include "kernels/mm_f32_tmpl.h"
