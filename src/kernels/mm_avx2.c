/* mm_avx2.c — FP32 matmul kernels for AVX2 + FMA + F16C (the build
 * baseline, x86-64-v3): mm_f32_tmpl.h instantiated with 8-lane vectors (the
 * exact kernels and auto mode's one-row GEMVs), and auto mode's FP4 product
 * below 32 rows of x (r1_f4_rows), which the template calls.  Called by
 * matmul.c on pool threads. */
#include <float.h>
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

/* auto mode's one-row FP4 GEMV, below the template (it uses R1_PF). */
static int r1_f4_rows(const mm_task *t, int64_t n0, int64_t n1);
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

/* ---- auto mode, FP4 rows, below 32 activation rows (mm_f32_tmpl.h's
 * FN(nt_auto); each activation row against each weight row in turn)
 * x is rounded once per run to 16-bit integers per 32-column block, q =
 * round(x · 32767 / amax) (error at most amax / 65534 per value: under BF16's
 * rounding, which auto mode allows, for any block whose mean |x| is above amax
 * / 128).  Each weight block's 16 bytes: the low and the high nibbles split,
 * each through vpshufb into twice the e2m1 value as an int8 (exact), placed in
 * the high byte of an int16 (unpack with zero: 512 · value) and multiplied by
 * q with vpmaddwd; the block's int32 sums (at most 805 M) converted and times
 * the weight scale × x's scale.  Two blocks per 256-bit vector: about a third
 * of the instructions per code of FP32 products. */

/* How x is held (MM_SCR_A2F4), per group of 8 blocks: the int16 values, per
 * pair of blocks b0 b1 as [b0 even 0-7, b1 even 0-7], [even 8-15], [odd 0-7],
 * [odd 8-15] (the lanes of vpunpck{l,h}bw of the pair's nibbles), and the 8
 * blocks' scales as [s0 s2 s4 s6 s1 s3 s5 s7] (lane 0 the pairs' first
 * blocks: vpermilps picks a pair's); the blocks after the last whole group
 * each as [even 0-15][odd 0-15] with its scale.  A scale is amax / 32767 /
 * 512 (the table's 2 and the high byte's 256). */
#define F4_GROUP 8

/* The 8 blocks' weight scales at e times x's scales xsc (as held): NaN for
 * byte 255, 2^-127 for byte 0, as ms_e8m0_to_f32. */
static inline __m256 f4_scales8(const uint8_t *e, const float *xsc)
{
    const __m128i perm = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m256i b = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)e), perm));
    __m256i f = _mm256_slli_epi32(b, 23);
    f = _mm256_blendv_epi8(f, _mm256_set1_epi32(0x7fc00000),
                           _mm256_cmpeq_epi32(b, _mm256_set1_epi32(255)));
    f = _mm256_blendv_epi8(f, _mm256_set1_epi32(0x00400000),
                           _mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
    return _mm256_mul_ps(_mm256_castsi256_ps(f), _mm256_loadu_ps(xsc));
}

/* One pair of blocks (32 bytes at w) against its 64 held values at q: 8
 * int32 sums, lanes 0-3 the first block's, 4-7 the second's. */
static inline __m256i f4_pair(const uint8_t *w, const int16_t *q)
{
    const __m256i z = _mm256_setzero_si256();
    __m256i lo, hi;
    ms_f4_i8x32(_mm256_loadu_si256((const __m256i *)w), &lo, &hi);
    const __m256i *x = (const __m256i *)q;
    __m256i s = _mm256_madd_epi16(_mm256_unpacklo_epi8(z, lo), _mm256_loadu_si256(x));
    __m256i t = _mm256_madd_epi16(_mm256_unpackhi_epi8(z, lo), _mm256_loadu_si256(x + 1));
    s = _mm256_add_epi32(s,
                         _mm256_madd_epi16(_mm256_unpacklo_epi8(z, hi), _mm256_loadu_si256(x + 2)));
    t = _mm256_add_epi32(t,
                         _mm256_madd_epi16(_mm256_unpackhi_epi8(z, hi), _mm256_loadu_si256(x + 3)));
    return _mm256_add_epi32(s, t);
}

/* One block (16 bytes at w) against its 32 held values at q: 4 int32 sums. */
static inline __m128i f4_one(const uint8_t *w, const int16_t *q)
{
    const __m128i z = _mm_setzero_si128();
    __m128i lo, hi;
    ms_f4_i8x16(_mm_loadu_si128((const __m128i *)w), &lo, &hi);
    const __m128i *x = (const __m128i *)q;
    __m128i s = _mm_add_epi32(_mm_madd_epi16(_mm_unpacklo_epi8(z, lo), _mm_loadu_si128(x)),
                              _mm_madd_epi16(_mm_unpackhi_epi8(z, lo), _mm_loadu_si128(x + 1)));
    __m128i t = _mm_add_epi32(_mm_madd_epi16(_mm_unpacklo_epi8(z, hi), _mm_loadu_si128(x + 2)),
                              _mm_madd_epi16(_mm_unpackhi_epi8(z, hi), _mm_loadu_si128(x + 3)));
    return _mm_add_epi32(s, t);
}

/* Row w's sum over nb whole blocks (16 bytes each, scale bytes at e) against
 * x as held (q, xsc). */
static inline float r1_f4_sum(const uint8_t *w, const uint8_t *e, const int16_t *q,
                              const float *xsc, int64_t nb)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + F4_GROUP <= nb; g += F4_GROUP) {
        _mm_prefetch((const char *)w + g * 16 + R1_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)w + g * 16 + R1_PF + 64, _MM_HINT_T0);
        const __m256 s8 = f4_scales8(e + g, xsc + g);
        const uint8_t *wg = w + g * 16;
        const int16_t *qg = q + g * 32;
        acc0 =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(f4_pair(wg, qg)), _mm256_permute_ps(s8, 0x00), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(f4_pair(wg + 32, qg + 64)),
                               _mm256_permute_ps(s8, 0x55), acc1);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(f4_pair(wg + 64, qg + 128)),
                               _mm256_permute_ps(s8, 0xaa), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(f4_pair(wg + 96, qg + 192)),
                               _mm256_permute_ps(s8, 0xff), acc1);
    }
    __m128 tail = _mm_setzero_ps();
    for (; g < nb; g++)
        tail = _mm_fmadd_ps(_mm_cvtepi32_ps(f4_one(w + g * 16, q + g * 32)),
                            _mm_set1_ps(ms_e8m0_to_f32(e[g]) * xsc[g]), tail);
    __m128 t4 = _mm_add_ps(tail, _mm_movehl_ps(tail, tail));
    return ms_hsum8(_mm256_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_add_ss(t4, _mm_movehdup_ps(t4)));
}

/* What MM_SCR_A2F4 holds on this thread: x of one run, as above, row by row
 * (finite: 0 when x has an inf or a NaN, which takes the tiles). */
static _Thread_local struct {
    const float *x;
    void *held;
    int64_t ldx, M, K;
    uint64_t run;
    int finite;
} held_f4x;

/* x (K values, K whole blocks) held as above in q (K int16) and xsc (K / 32
 * floats); 0 when some value is not finite. */
static int f4_hold_x(const float *x, int64_t K, int16_t *q, float *xsc)
{
    const int64_t nb = K / 32, ng = nb / F4_GROUP * F4_GROUP;
    for (int64_t g = 0; g < nb; g++) {
        const float *xb = x + g * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            const float a = fabsf(xb[i]);
            if (!(a <= FLT_MAX)) return 0; /* inf or NaN */
            amax = a > amax ? a : amax;
        }
        const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        int16_t v[32]; /* [even 0-15][odd 0-15]; cvtss2si rounds as lrintf, inline */
        for (int i = 0; i < 16; i++) {
            v[i] = (int16_t)_mm_cvtss_si32(_mm_set_ss(xb[2 * i] * inv));
            v[16 + i] = (int16_t)_mm_cvtss_si32(_mm_set_ss(xb[2 * i + 1] * inv));
        }
        const float sc = amax / 32767.0f / 512.0f;
        if (g < ng) { /* pair p = (g % 8) / 2, first or second block h */
            const int64_t g0 = g / F4_GROUP * F4_GROUP;
            const int p = (int)(g - g0) / 2, h = (int)(g - g0) % 2;
            int16_t *d = q + (g0 + 2 * p) * 32;
            for (int part = 0; part < 4; part++) /* even 0-7, even 8-15, odd 0-7, odd 8-15 */
                memcpy(d + part * 16 + h * 8, v + part * 8, 16);
            xsc[g0 + h * 4 + p] = sc;
        } else {
            memcpy(q + g * 32, v, sizeof v);
            xsc[g] = sc;
        }
    }
    return 1;
}

/* Activation rows at most: each runs the one-row sum against the weight row
 * while it is in L1 (from 32, matmul.c's pack_min_m, the packed panels take
 * over). */
enum { F4_MAX_M = 31 };

/* Rows [n0, n1) of t (FP4, K and c0 whole blocks, M <= F4_MAX_M); 0, or -1
 * (nothing written) past F4_MAX_M, without scratch or with x not finite (the
 * caller takes the tiles).  x is held once per run and thread (a product
 * comes in slices of 32 KiB, an expert's gate and up share x). */
static int r1_f4_rows(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols, nb = K / 32, M = t->M, per = K + 2 * nb; /* int16 per row */
    if (M > F4_MAX_M) return -1;
    int16_t *q = ms_mm_scratch(MM_SCR_A2F4, sizeof(int16_t) * (size_t)(M * per));
    if (!q) return -1;
    if (!t->run || held_f4x.run != t->run || held_f4x.x != t->x || held_f4x.held != q ||
        held_f4x.ldx != t->ldx || held_f4x.M != M || held_f4x.K != K) {
        held_f4x.finite = 1;
        for (int64_t m = 0; m < M && held_f4x.finite; m++)
            held_f4x.finite =
                f4_hold_x(t->x + m * t->ldx, K, q + m * per, (float *)(q + m * per + K));
        held_f4x.x = t->x, held_f4x.held = q, held_f4x.ldx = t->ldx, held_f4x.M = M;
        held_f4x.K = K, held_f4x.run = t->run;
    }
    if (!held_f4x.finite) return -1;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *w = (const uint8_t *)W->data + n * (W->ld / 2);
        const uint8_t *e = W->e8scale + (W->r0 + n) * W->scale_ld + W->c0 / 32;
        for (int64_t m = 0; m < M; m++) {
            const int16_t *qm = q + m * per;
            float s = r1_f4_sum(w, e, qm, (const float *)(qm + K), nb), *yo = t->y + m * t->ldy + n;
            *yo = t->accumulate ? *yo + s : s;
        }
    }
    return 0;
}
