/* dtype.c — dtype names and the slow-path conversions of dtype.h. */
#include "kernels/dtype.h"

#include <math.h>

static const char *const names[MS_DT_COUNT] = {"F32", "BF16", "F16", "F8_E4M3", "I8",
                                               "U8",  "I32",  "I64", "F64",     "F8_E8M0"};

const char *ms_dtype_name(ms_dtype t) { return (unsigned)t < MS_DT_COUNT ? names[t] : NULL; }

int ms_dtype_parse(const char *name)
{
    for (int i = 0; i < MS_DT_COUNT; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

uint16_t ms_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (a < 0x38800000u) {                                   /* f16 subnormal or zero */
        float af;
        memcpy(&af, &a, 4);
        float scaled = af * 16777216.0f; /* 2^24: subnormal unit is 2^-24 */
        return (uint16_t)(sign | (uint32_t)nearbyintf(scaled));
    }
    uint32_t mant = a & 0x7fffffu, exp = (a >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

uint8_t ms_f32_to_fp8e4m3(float f)
{
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e;
    /* pick the best of the 127 non-negative finite codes by nearest, ties to even code */
    int lo = 0, hi = 0x7e;
    while (lo < hi) { /* largest code with value <= a */
        int mid = (lo + hi + 1) / 2;
        if (ms_fp8e4m3_to_f32((uint8_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    int code = lo;
    if (code < 0x7e) {
        float v0 = ms_fp8e4m3_to_f32((uint8_t)code), v1 = ms_fp8e4m3_to_f32((uint8_t)(code + 1));
        if (a - v0 > v1 - a || (a - v0 == v1 - a && (code & 1))) code++;
    }
    return (uint8_t)(sign | code);
}
