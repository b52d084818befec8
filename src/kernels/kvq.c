/* kvq.c — V4's packed KV entry codecs: the FP8 ds entry (e4m3 nope dims with
 * UE8M0 scales per 64, BF16 rope dims), the MXFP4 key (e2m1 with UE8M0 per
 * 32) and the Hadamard rotation (kvq.h has the byte layouts).  Pure
 * functions; any thread.
 */
#include "kernels/kvq.h"
#include "kernels/avx2_inl.h"

#include "kernels/dtype.h"
#include "kernels/kernels.h"

#include <immintrin.h>

#include <math.h>
#include <pthread.h>
#include <string.h>

#define FP8_BLOCK 64
#define FP4_BLOCK 32

/* e4m3 code -> f32, a table of ms_fp8e4m3_to_f32 (the unpackers' inner loop:
 * a load in place of its branches; the same values) */
static float e4m3_lut[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;
static void e4m3_lut_init(void)
{
    for (int i = 0; i < 256; i++) e4m3_lut[i] = ms_fp8e4m3_to_f32((uint8_t)i);
}
static const float *e4m3_table(void)
{
    pthread_once(&e4m3_once, e4m3_lut_init);
    return e4m3_lut;
}

int64_t ms_kvq_fp8ds_bytes(int64_t hd, int64_t dr)
{
    int64_t nope = hd - dr;
    return nope + 2 * dr + (nope + FP8_BLOCK - 1) / FP8_BLOCK + 1;
}

int64_t ms_kvq_mxfp4_bytes(int64_t n)
{
    return (n + 1) / 2 + (n + FP4_BLOCK - 1) / FP4_BLOCK;
}

/* ⌈log2(max(amax, 1e-4) / qmax)⌉, exactly (frexp: v = m·2^k, m in [0.5, 1)). */
static int scale_exp(float amax, float qmax)
{
    float v = fmaxf(amax, 1e-4f) / qmax;
    int k;
    float m = frexpf(v, &k);
    return m == 0.5f ? k - 1 : k;
}

static uint8_t e8m0_code(int e)
{
    return (uint8_t)(e + 127 < 0 ? 0 : e + 127 > 254 ? 254 : e + 127);
}

uint8_t ms_kvq_e4m3_encode(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)(u >> 24 & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7f; /* NaN */
    float a;
    memcpy(&a, &u, 4);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0x1p-6f) /* subnormals m·2^-9 (m = 8 is the smallest normal, code 0x08) */
        return sign | (uint8_t)rintf(a * 512.0f);
    /* normal: keep 3 mantissa bits, round to nearest even on the 20 dropped */
    uint32_t r = (u + 0x7ffffu + (u >> 20 & 1u)) >> 20; /* (f32 exponent << 3) | mantissa */
    uint32_t code = r - ((127u - 7u) << 3);
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

static void fp8ds_pack(const float *x, int64_t hd, int64_t dr, uint8_t *e, uint8_t (*enc)(float))
{
    int64_t nope = hd - dr, nb = (nope + FP8_BLOCK - 1) / FP8_BLOCK;
    uint8_t *scales = e + nope + 2 * dr;
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * FP8_BLOCK, i1 = i0 + FP8_BLOCK < nope ? i0 + FP8_BLOCK : nope;
        float amax = 0;
        for (int64_t i = i0; i < i1; i++) amax = fmaxf(amax, fabsf(x[i]));
        int s = scale_exp(amax, 448.0f);
        uint8_t code = e8m0_code(s);
        float inv = ldexpf(1.0f, 127 - code); /* 1 / the stored scale */
        for (int64_t i = i0; i < i1; i++) e[i] = enc(fminf(fmaxf(x[i] * inv, -448.0f), 448.0f));
        scales[b] = code;
    }
    scales[nb] = 0; /* pad */
    for (int64_t i = 0; i < dr; i++) {
        uint16_t h = ms_f32_to_bf16(x[nope + i]);
        e[nope + 2 * i] = (uint8_t)(h & 0xff);
        e[nope + 2 * i + 1] = (uint8_t)(h >> 8);
    }
}

void ms_kvq_fp8ds_pack(const float *x, int64_t hd, int64_t dr, uint8_t *e)
{
    fp8ds_pack(x, hd, dr, e, ms_kvq_e4m3_encode);
}

void ms_kvq_fp8ds_pack_ref(const float *x, int64_t hd, int64_t dr, uint8_t *e)
{
    fp8ds_pack(x, hd, dr, e, ms_f32_to_fp8e4m3);
}

void ms_kvq_fp8ds_unpack(const uint8_t *e, int64_t hd, int64_t dr, float *x)
{
    int64_t nope = hd - dr;
    const uint8_t *scales = e + nope + 2 * dr;
    const float *t = e4m3_table();
    for (int64_t i0 = 0; i0 < nope; i0 += FP8_BLOCK) { /* a block's scale once */
        float s = ms_e8m0_to_f32(scales[i0 / FP8_BLOCK]);
        for (int64_t i = i0; i < nope && i < i0 + FP8_BLOCK; i++) x[i] = t[e[i]] * s;
    }
    for (int64_t i = 0; i < dr; i++)
        x[nope + i] = ms_bf16_to_f32((uint16_t)(e[nope + 2 * i] | e[nope + 2 * i + 1] << 8));
}

void ms_kvq_mxfp4_pack(const float *x, int64_t n, uint8_t *e)
{
    int64_t nb = (n + FP4_BLOCK - 1) / FP4_BLOCK;
    uint8_t *scales = e + (n + 1) / 2;
    memset(e, 0, (size_t)((n + 1) / 2));
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * FP4_BLOCK, i1 = i0 + FP4_BLOCK < n ? i0 + FP4_BLOCK : n;
        float amax = 0;
        for (int64_t i = i0; i < i1; i++) amax = fmaxf(amax, fabsf(x[i]));
        uint8_t code = e8m0_code(scale_exp(amax, 6.0f));
        float inv = ldexpf(1.0f, 127 - code);
        for (int64_t i = i0; i < i1; i++) {
            uint8_t c = ms_f32_to_fp4e2m1(x[i] * inv);
            e[i / 2] |= (uint8_t)(i & 1 ? c << 4 : c);
        }
        scales[b] = code;
    }
}

void ms_kvq_mxfp4_unpack(const uint8_t *e, int64_t n, float *x)
{
    const uint8_t *scales = e + (n + 1) / 2;
    for (int64_t i0 = 0; i0 < n; i0 += FP4_BLOCK) { /* a block's scale once */
        float s = ms_e8m0_to_f32(scales[i0 / FP4_BLOCK]);
        int64_t i1 = i0 + FP4_BLOCK < n ? i0 + FP4_BLOCK : n, i = i0;
        for (; i + 1 < i1; i += 2) { /* a byte's two codes (i0 is even) */
            x[i] = ms_fp4e2m1_to_f32(e[i / 2]) * s;
            x[i + 1] = ms_fp4e2m1_to_f32((uint8_t)(e[i / 2] >> 4)) * s;
        }
        if (i < i1) x[i] = ms_fp4e2m1_to_f32(e[i / 2]) * s;
    }
}

void ms_kvq_mxfp4_round(float *x, int64_t n)
{
    uint8_t e[1024];
    for (int64_t i0 = 0; i0 < n; i0 += 1024) { /* 1024 values: 512 + 32 bytes */
        int64_t k = n - i0 < 1024 ? n - i0 : 1024;
        ms_kvq_mxfp4_pack(x + i0, k, e);
        ms_kvq_mxfp4_unpack(e, k, x + i0);
    }
}

#define FP8_KEY_BLOCK 128

int64_t ms_kvq_fp8key_bytes(int64_t n)
{
    return n + 4 * ((n + FP8_KEY_BLOCK - 1) / FP8_KEY_BLOCK);
}

static void fp8key_pack(const float *x, int64_t n, uint8_t *e, uint8_t (*enc)(float))
{
    uint8_t *scales = e + n;
    for (int64_t i0 = 0, b = 0; i0 < n; i0 += FP8_KEY_BLOCK, b++) {
        int64_t i1 = i0 + FP8_KEY_BLOCK < n ? i0 + FP8_KEY_BLOCK : n;
        float amax = 0;
        for (int64_t i = i0; i < i1; i++) amax = fmaxf(amax, fabsf(x[i]));
        /* SGLang's rule (fused_store_indexer_cache): a plain f32 scale, its f32 inverse */
        float s = fmaxf(amax, 1e-4f) / 448.0f, inv = 1.0f / s;
        for (int64_t i = i0; i < i1; i++) e[i] = enc(fminf(fmaxf(x[i] * inv, -448.0f), 448.0f));
        uint32_t u;
        memcpy(&u, &s, 4);
        for (int j = 0; j < 4; j++) scales[4 * b + j] = (uint8_t)(u >> (8 * j));
    }
}

void ms_kvq_fp8key_pack(const float *x, int64_t n, uint8_t *e)
{
    fp8key_pack(x, n, e, ms_kvq_e4m3_encode);
}

void ms_kvq_fp8key_pack_ref(const float *x, int64_t n, uint8_t *e)
{
    fp8key_pack(x, n, e, ms_f32_to_fp8e4m3);
}

void ms_kvq_fp8key_unpack(const uint8_t *e, int64_t n, float *x)
{
    const uint8_t *scales = e + n;
    const float *t = e4m3_table();
    for (int64_t i0 = 0, b = 0; i0 < n; i0 += FP8_KEY_BLOCK, b++) {
        uint32_t u = 0;
        for (int j = 0; j < 4; j++) u |= (uint32_t)scales[4 * b + j] << (8 * j);
        float s;
        memcpy(&s, &u, 4);
        for (int64_t i = i0; i < n && i < i0 + FP8_KEY_BLOCK; i++) x[i] = t[e[i]] * s;
    }
}

void ms_kvq_fp8key_round(float *x, int64_t n)
{
    uint8_t e[1024 + 32];
    for (int64_t i0 = 0; i0 < n; i0 += 1024) {
        int64_t k = n - i0 < 1024 ? n - i0 : 1024;
        ms_kvq_fp8key_pack(x + i0, k, e);
        ms_kvq_fp8key_unpack(e, k, x + i0);
    }
}

void ms_kvq_hadamard(float *x, int64_t n)
{
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* e4m3 codes -> the f16 bits of value · 2^-8 by shifts: the sign to bit 15, the 7
 * magnitude bits to bits 7..13 (e4m3's subnormals land on f16's subnormals, exactly). */
static inline __m256i e4m3_f16bits16(__m128i b)
{
    __m256i w = _mm256_cvtepu8_epi16(b);
    __m256i sg = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
    __m256i mg = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7);
    return _mm256_or_si256(sg, mg);
}

static inline __m128i e4m3_f16bits8(__m128i b)
{
    __m128i w = _mm_cvtepu8_epi16(b);
    __m128i sg = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
    __m128i mg = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7);
    return _mm_or_si128(sg, mg);
}

static float fp8key_scale(const uint8_t *e, int64_t n, int64_t i)
{
    float s;
    memcpy(&s, e + n + 4 * (i / FP8_KEY_BLOCK), 4);
    return s;
}

/* One query's 8 lanes before the horizontal sum: ms_dot_f32's four accumulators over
 * the 32s of the key's vectors k[nv] (n32 of them in whole 32s), then the 8s into the
 * first, combined as (a0 + a1) + (a2 + a3). */
static inline __m256 key_dot8(const float *qh, const __m256 *k, int64_t n32, int64_t nv)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t v = 0;
    for (; v < n32; v += 4) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v), k[v], a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v + 8), k[v + 1], a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v + 16), k[v + 2], a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v + 24), k[v + 3], a3);
    }
    for (; v < nv; v++) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v), k[v], a0);
    return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* out[h] = q_h · the key k[nv] (8-value vectors, n32 of them in whole 32s) for nh
 * queries, each in ms_dot_f32's order (key_dot8, then hsum8's pairs, eight heads'
 * horizontal sums at once): the packed-code dots' common half. */
static void key_dots(const float *q, int64_t nh, int64_t ldq, const __m256 *k, int64_t n32,
                     int64_t nv, float *out)
{
    int64_t hd = 0;
    for (; hd + 8 <= nh; hd += 8) { /* eight heads' horizontal sums at once, hsum8's pairs */
        __m256 t[8];
        for (int g = 0; g < 8; g++) t[g] = key_dot8(q + (hd + g) * ldq, k, n32, nv);
        __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(t[0], t[1], 0x20),
                                   _mm256_permute2f128_ps(t[0], t[1], 0x31));
        __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(t[2], t[3], 0x20),
                                   _mm256_permute2f128_ps(t[2], t[3], 0x31));
        __m256 s45 = _mm256_add_ps(_mm256_permute2f128_ps(t[4], t[5], 0x20),
                                   _mm256_permute2f128_ps(t[4], t[5], 0x31));
        __m256 s67 = _mm256_add_ps(_mm256_permute2f128_ps(t[6], t[7], 0x20),
                                   _mm256_permute2f128_ps(t[6], t[7], 0x31));
        /* lane 0: heads 0 2 (4 6), lane 1: heads 1 3 (5 7); each [x0 + x2, x1 + x3] */
        __m256 p = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
        __m256 r = _mm256_add_ps(_mm256_shuffle_ps(s45, s67, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(s45, s67, _MM_SHUFFLE(3, 2, 3, 2)));
        __m256 o = _mm256_add_ps(_mm256_shuffle_ps(p, r, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(p, r, _MM_SHUFFLE(3, 1, 3, 1)));
        /* o = heads [0 2 4 6 | 1 3 5 7] */
        _mm256_storeu_ps(out + hd,
                         _mm256_permutevar8x32_ps(o, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    for (; hd < nh; hd++) {
        out[hd] = ms_hsum8(key_dot8(q + hd * ldq, k, n32, nv));
    }
}

/* q_h · key e for nh queries straight from the codes: the key's values are made once
 * in registers (F16C of the shifted codes, × s · 2^8: the one real product code · s
 * rounded once, as the unpack's table value · s is) and every query's dot sums them in
 * ms_dot_f32's order (four 8-lane accumulators over 32s, then 8s into the first, the
 * same horizontal sum's pairs, eight heads' sums at once), so each result equals ms_dot_f32(q_h,
 * unpacked e, n) bit for bit.  Keys of n > 128 or n not a multiple of 8 take the unpacked row.
 * Codes 0x7f / 0xff (NaN, never written) read as ±480 here. */
void ms_kvq_fp8key_dots(const float *q, int64_t nh, int64_t ldq, const uint8_t *e, int64_t n,
                        float *out)
{
    if (n > 128 || n % 8) {
        ms_kvq_fp8key_dots_ref(q, nh, ldq, e, n, out);
        return;
    }
    __m256 k[16];
    int64_t nv = n / 8, n32 = n / 32 * 4; /* 8-value vectors; those in whole 32s */
    __m256 vs = _mm256_set1_ps(fp8key_scale(e, n, 0) * 256.0f); /* n <= 128: one block */
    int64_t v = 0;
    for (; v + 2 <= nv; v += 2) {
        __m256i h = e4m3_f16bits16(_mm_loadu_si128((const __m128i *)(e + 8 * v)));
        k[v] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), vs);
        k[v + 1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), vs);
    }
    if (v < nv)
        k[v] = _mm256_mul_ps(
            _mm256_cvtph_ps(e4m3_f16bits8(_mm_loadl_epi64((const __m128i *)(e + 8 * v)))), vs);
    key_dots(q, nh, ldq, k, n32, nv, out);
}

/* The twins: key e unpacked to f32 by unpack, then ms_dot_f32 per head (n <= 4096; NaN else). */
static void unpacked_dots(void (*unpack)(const uint8_t *, int64_t, float *), const float *q,
                          int64_t nh, int64_t ldq, const uint8_t *e, int64_t n, float *out)
{
    float x[4096];
    if (n > 4096) {
        for (int64_t h = 0; h < nh; h++) out[h] = NAN;
        return;
    }
    unpack(e, n, x);
    for (int64_t h = 0; h < nh; h++) out[h] = ms_dot_f32(q + h * ldq, x, n);
}

void ms_kvq_fp8key_dots_ref(const float *q, int64_t nh, int64_t ldq, const uint8_t *e, int64_t n,
                            float *out)
{
    unpacked_dots(ms_kvq_fp8key_unpack, q, nh, ldq, e, n, out);
}

/* q_h · MXFP4 key e for nh queries from its codes: each 8 codes (4 bytes) shifted
 * into lanes, their e2m1 values by permutes of the two 8-entry halves of
 * ms_fp4e2m1_to_f32's table (code 8 is +0 there, as here), × the block's UE8M0 scale
 * (the one f32 product table value · s that the unpack makes), then key_dots, so each
 * result equals ms_dot_f32(q_h, unpacked e, n) bit for bit.  Keys of n > 128 or n
 * not a multiple of 8 take the unpacked row. */
void ms_kvq_mxfp4_dots(const float *q, int64_t nh, int64_t ldq, const uint8_t *e, int64_t n,
                       float *out)
{
    if (n > 128 || n % 8) {
        ms_kvq_mxfp4_dots_ref(q, nh, ldq, e, n, out);
        return;
    }
    const __m256 pos = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256 neg = _mm256_setr_ps(0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    const __m256i sh = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0); /* code i's bit 3 to 31 */
    const uint8_t *scales = e + n / 2;
    __m256 k[16];
    float sb[4];                          /* the blocks' scales (n <= 128) */
    int64_t nv = n / 8, n32 = n / 32 * 4; /* 8-value vectors; those in whole 32s */
    for (int64_t b = 0; b < (n + FP4_BLOCK - 1) / FP4_BLOCK; b++) sb[b] = ms_e8m0_to_f32(scales[b]);
    for (int64_t v = 0; v < nv; v++) {
        uint32_t u;
        memcpy(&u, e + 4 * v, 4);
        /* lane i: code i of the 8 (nibble i of u) in bits 28..31; permutes read bits 0..2 */
        __m256i hi = _mm256_sllv_epi32(_mm256_set1_epi32((int)u), sh);
        __m256i c = _mm256_srli_epi32(hi, 28);
        __m256 a = _mm256_blendv_ps(_mm256_permutevar8x32_ps(pos, c),
                                    _mm256_permutevar8x32_ps(neg, c), _mm256_castsi256_ps(hi));
        k[v] = _mm256_mul_ps(a, _mm256_set1_ps(sb[v / 4]));
    }
    key_dots(q, nh, ldq, k, n32, nv, out);
}

void ms_kvq_mxfp4_dots_ref(const float *q, int64_t nh, int64_t ldq, const uint8_t *e, int64_t n,
                           float *out)
{
    unpacked_dots(ms_kvq_mxfp4_unpack, q, nh, ldq, e, n, out);
}
