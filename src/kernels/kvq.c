/* kvq.c — V4's packed KV entry codecs: the FP8 ds entry (e4m3 nope dims with
 * UE8M0 scales per 64, BF16 rope dims), the MXFP4 key (e2m1 with UE8M0 per
 * 32) and the Hadamard rotation (kvq.h has the byte layouts).  Pure
 * functions; any thread.
 */
#include "kernels/kvq.h"

#include "kernels/dtype.h"

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

int64_t ms_kvq_mxfp4_bytes(int64_t n) { return (n + 1) / 2 + (n + FP4_BLOCK - 1) / FP4_BLOCK; }

/* ⌈log2(max(amax, 1e-4) / qmax)⌉, exactly (frexp: v = m·2^k, m in [0.5, 1)). */
static int scale_exp(float amax, float qmax)
{
    float v = fmaxf(amax, 1e-4f) / qmax;
    int k;
    float m = frexpf(v, &k);
    return m == 0.5f ? k - 1 : k;
}

static uint8_t e8m0_code(int e) { return (uint8_t)(e + 127 < 0 ? 0 : e + 127 > 254 ? 254 : e + 127); }

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

static void fp8ds_pack(const float *x, int64_t hd, int64_t dr, uint8_t *e,
                       uint8_t (*enc)(float))
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

int64_t ms_kvq_fp8key_bytes(int64_t n) { return n + 4 * ((n + FP8_KEY_BLOCK - 1) / FP8_KEY_BLOCK); }

static void fp8key_pack(const float *x, int64_t n, uint8_t *e, uint8_t (*enc)(float))
{
    uint8_t *scales = e + n;
    for (int64_t i0 = 0, b = 0; i0 < n; i0 += FP8_KEY_BLOCK, b++) {
        int64_t i1 = i0 + FP8_KEY_BLOCK < n ? i0 + FP8_KEY_BLOCK : n;
        float amax = 0;
        for (int64_t i = i0; i < i1; i++) amax = fmaxf(amax, fabsf(x[i]));
        int k = scale_exp(amax, 448.0f);
        float s = ldexpf(1.0f, k), inv = ldexpf(1.0f, -k);
        for (int64_t i = i0; i < i1; i++) e[i] = enc(fminf(fmaxf(x[i] * inv, -448.0f), 448.0f));
        uint32_t u;
        memcpy(&u, &s, 4);
        for (int j = 0; j < 4; j++) scales[4 * b + j] = (uint8_t)(u >> (8 * j));
    }
}

void ms_kvq_fp8key_pack(const float *x, int64_t n, uint8_t *e) { fp8key_pack(x, n, e, ms_kvq_e4m3_encode); }

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
