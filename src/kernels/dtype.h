/* dtype.h — stored number formats and their scalar conversions.
 *
 * Weights stay in their stored type (F32, BF16, F16, F8_E4M3 with 128x128 F32
 * block scales, F4_E2M1 with per-32 UE8M0 scales); kernels convert on the fly.  These inline scalar
 * conversions are the reference every SIMD path is tested against.  Pure functions.
 */
#ifndef MS_KERNELS_DTYPE_H
#define MS_KERNELS_DTYPE_H

#include <stdint.h>
#include <string.h>

typedef enum ms_dtype {
    MS_DT_F32 = 0,
    MS_DT_BF16,
    MS_DT_F16,
    MS_DT_F8E4M3, /* OCP e4m3fn: bias 7, no inf, 0x7f/0xff NaN, max 448 */
    MS_DT_I8,
    MS_DT_U8,
    MS_DT_I32,
    MS_DT_I64,
    MS_DT_F64,
    MS_DT_F8E8M0, /* UE8M0 scale: 2^(byte-127) */
    /* FP4 e2m1 (DeepSeek-V4 routed experts, arch.md §0.7): two codes per
     * byte, element 2i in the low nibble, 2i+1 in the high one; bit 3 sign,
     * bits 2..1 exponent (bias 1), bit 0 mantissa.  Not a safetensors dtype
     * (checkpoints store the bytes as I8): ms_dtype_parse never returns it
     * and ms_dtype_size is 0; use ms_dtype_bytes. */
    MS_DT_F4E2M1,
    MS_DT_COUNT
} ms_dtype;

/* Bytes per element; 0 for F4E2M1 (half a byte) and invalid values. */
static inline int ms_dtype_size(ms_dtype t)
{
    static const int sz[MS_DT_COUNT] = {4, 2, 2, 1, 1, 1, 4, 8, 8, 1, 0};
    return (unsigned)t < MS_DT_COUNT ? sz[t] : 0;
}

/* Bytes that n consecutive elements of type t occupy (F4E2M1: n / 2 rounded
 * up; the caller keeps FP4 runs at even element offsets). */
static inline int64_t ms_dtype_bytes(ms_dtype t, int64_t n)
{
    return t == MS_DT_F4E2M1 ? (n + 1) / 2 : n * ms_dtype_size(t);
}
/* The safetensors name ("F32", "BF16", ...); NULL for an invalid value. */
const char *ms_dtype_name(ms_dtype t);
/* Parses a safetensors dtype name; returns -1 when unknown or unsupported. */
int ms_dtype_parse(const char *name);
/* Index of the first NaN or infinity among the n values at p (F32, BF16,
 * F16, F8E4M3: its NaN codes 0x7f/0xff; it has no infinity), -1 when all are
 * finite or the type has no such codes (integers, E8M0 scales). */
int64_t ms_dtype_find_nonfinite(ms_dtype t, const void *p, int64_t n);

static inline float ms_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t ms_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Rounds an f32 to the nearest bf16 value and back (what kernels that take
 * bf16 activations see). */
static inline float ms_round_bf16(float f)
{
    return ms_bf16_to_f32(ms_f32_to_bf16(f));
}

static inline float ms_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even f32 -> f16 (used by writers/tests, not hot paths). */
uint16_t ms_f32_to_f16(float f);

/* e4m3fn -> f32, exact.  0x7f / 0xff are NaN. */
static inline float ms_fp8e4m3_to_f32(uint8_t x)
{
    uint32_t sign = (uint32_t)(x & 0x80u) << 24, exp = (x >> 3) & 0xfu, man = x & 7u;
    float v;
    if (exp == 0xf && man == 7) {
        uint32_t u = sign | 0x7fc00000u;
        memcpy(&v, &u, 4);
        return v;
    }
    if (exp == 0) {
        v = (float)man * (1.0f / 512.0f); /* subnormal: man * 2^-9 */
    } else {
        uint32_t u = ((exp + 127 - 7) << 23) | (man << 20);
        memcpy(&v, &u, 4);
    }
    return sign ? -v : v;
}

/* f32 -> e4m3fn, round to nearest even, saturating to ±448 (writers, tests). */
uint8_t ms_f32_to_fp8e4m3(float f);

/* UE8M0 -> f32, exact: 2^(x-127); x = 0 gives 2^-127 (an f32 subnormal),
 * x = 255 NaN (torch's float8_e8m0fnu, which DeepSeek's convert.py and
 * model.py read through .float()). */
static inline float ms_e8m0_to_f32(uint8_t x)
{
    if (x == 0xff) return __builtin_nanf("");
    if (x == 0) return 0x1p-127f;
    uint32_t u = (uint32_t)x << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* FP4 e2m1 code (low 4 bits of c) -> f32, exact: ±{0, 0.5, 1, 1.5, 2, 3, 4,
 * 6}.  Code 8 gives +0, as DeepSeek's FP4_TABLE (inference/convert.py) does. */
static inline float ms_fp4e2m1_to_f32(uint8_t c)
{
    static const float t[16] = {0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return t[c & 15u];
}

/* Round-to-nearest-even f32 -> e2m1 code, saturating to ±6 (writers, tests;
 * ties as DeepSeek's fp4 quantiser: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
 * 2.5 -> 2, 3.5 -> 4, 5 -> 4). */
uint8_t ms_f32_to_fp4e2m1(float f);

#endif
