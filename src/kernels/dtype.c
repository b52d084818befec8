/* dtype.c — dtype names and the slow-path conversions of dtype.h. */
#include "kernels/dtype.h"

#include <math.h>

static const char *const names[MS_DT_COUNT] = {"F32", "BF16", "F16", "F8_E4M3", "I8",     "U8",
                                               "I32", "I64",  "F64", "F8_E8M0", "F4_E2M1"};

const char *ms_dtype_name(ms_dtype t)
{
    return (unsigned)t < MS_DT_COUNT ? names[t] : NULL;
}

/* Each test maps the exponent field all ones (NaN or infinity) to the top
 * bit of the lane: (x & ~sign) + (the lowest such magnitude's distance from
 * the top bit) sets it exactly for those codes, without a carry into the next
 * lane, so 8 bytes go at once (SWAR) and the compiler vectorises the block
 * loop; only a block with a bit set is searched again for the index.  The
 * loads are memcpy: the data may be unaligned (a file mapping). */
static int64_t find_lanes(const unsigned char *v, int64_t n, int esz, uint64_t abs, uint64_t add,
                          uint64_t top)
{
    int64_t n_words = n * esz / 8;
    for (int64_t b = 0; b < n_words; b += 512) {
        int64_t e = n_words - b < 512 ? n_words : b + 512;
        uint64_t acc = 0, x;
        for (int64_t i = b; i < e; i++) {
            memcpy(&x, v + i * 8, 8);
            acc |= (x & abs) + add;
        }
        if (!(acc & top)) continue;
        for (int64_t k = b * 8 / esz; k < e * 8 / esz; k++) {
            x = 0;
            memcpy(&x, v + k * esz, (size_t)esz);
            if (((x & abs) + add) & top) return k;
        }
    }
    for (int64_t k = n_words * 8 / esz; k < n; k++) { /* the tail */
        uint64_t x = 0;
        memcpy(&x, v + k * esz, (size_t)esz);
        if (((x & abs) + add) & top) return k;
    }
    return -1;
}

/* Per dtype: element bytes, then abs / add / top of find_lanes for 8 bytes of lanes. */
static const struct {
    int esz;
    uint64_t abs, add, top;
} nonfinite_lanes[MS_DT_COUNT] = {
    [MS_DT_F32] = {4, 0x7fffffff7fffffffull, 0x0080000000800000ull, 0x8000000080000000ull},
    [MS_DT_BF16] = {2, 0x7fff7fff7fff7fffull, 0x0080008000800080ull, 0x8000800080008000ull},
    [MS_DT_F16] = {2, 0x7fff7fff7fff7fffull, 0x0400040004000400ull, 0x8000800080008000ull},
    [MS_DT_F8E4M3] = {1, 0x7f7f7f7f7f7f7f7full, 0x0101010101010101ull, 0x8080808080808080ull},
};

int64_t ms_dtype_find_nonfinite(ms_dtype t, const void *p, int64_t n)
{
    if ((unsigned)t >= MS_DT_COUNT || !nonfinite_lanes[t].esz) return -1;
    return find_lanes(p, n, nonfinite_lanes[t].esz, nonfinite_lanes[t].abs, nonfinite_lanes[t].add,
                      nonfinite_lanes[t].top);
}

int ms_dtype_parse(const char *name)
{
    for (int i = 0; i < MS_DT_COUNT; i++)
        if (i != MS_DT_F4E2M1 && !strcmp(name, names[i])) return i; /* not a file dtype */
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
        if (ms_fp8e4m3_to_f32((uint8_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    int code = lo;
    if (code < 0x7e) {
        float v0 = ms_fp8e4m3_to_f32((uint8_t)code), v1 = ms_fp8e4m3_to_f32((uint8_t)(code + 1));
        if (a - v0 > v1 - a || (a - v0 == v1 - a && (code & 1))) code++;
    }
    return (uint8_t)(sign | code);
}

uint8_t ms_f32_to_fp4e2m1(float f)
{
    /* magnitude codes 0..7: 0 0.5 1 1.5 2 3 4 6; the midpoints between
     * neighbours round to the code with an even mantissa bit */
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    uint8_t sign = signbit(f) ? 8 : 0, c = 0;
    float a = fabsf(f);
    if (a != a) return 7; /* NaN: no code for it; saturate */
    while (c < 7 && (a > mid[c] || (a == mid[c] && (c & 1)))) c++;
    return (uint8_t)(sign | c);
}
