/* test_kvq.c — V4's packed KV entry codecs (kernels/kvq.h) against their
 * definitions: the bitwise e4m3 encoder equals the search-based reference on
 * every rounding boundary and a sweep of f32 bit patterns; the FP8 ds entry's
 * byte layout, scale rule and error bound, fast pack = reference pack; the
 * MXFP4 key's layout (low nibble first), exact round trips of every code at
 * every scale exponent, its error bound; the FP8 key's layout (codes, then an
 * f32 scale per 128: SGLang's max(amax, 1e-4) / 448), every e4m3 code at every
 * power-of-two scale, fast pack = reference pack, the scale rule and the codes of
 * its definition, its error bound; the packed-code dots (ms_kvq_fp8key_dots) equal
 * ms_dot_f32 of the unpacked key bit for bit (every code as a one-hot product, random
 * keys of awkward lengths and scales, 1..16 heads) and the float64 sum within 1e-5; the Hadamard
 * rotation is Sylvester's matrix / sqrt(n) and orthogonal.
 */
#include "harness.h"
#include "kernels/dtype.h"
#include "kernels/kvq.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)(1 << 24) * 2.0f - 1.0f;
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TEST(e4m3_encode_vs_ref)
{
    /* every midpoint between neighbouring codes, and one f32 ulp either side */
    for (int c = 0; c < 0x7e; c++) {
        float lo = ms_fp8e4m3_to_f32((uint8_t)c), hi = ms_fp8e4m3_to_f32((uint8_t)(c + 1));
        float mid = (lo + hi) / 2;
        float v[5] = {lo, mid, nextafterf(mid, 0), nextafterf(mid, 1000), hi};
        for (int i = 0; i < 5; i++)
            for (int sg = 0; sg < 2; sg++) {
                float x = sg ? -v[i] : v[i];
                CHECKF(ms_kvq_e4m3_encode(x) == ms_f32_to_fp8e4m3(x), "x=%a fast %02x ref %02x", x,
                       ms_kvq_e4m3_encode(x), ms_f32_to_fp8e4m3(x));
            }
    }
    /* a sweep of bit patterns from 0 up past 448, both signs */
    for (uint32_t u = 0; u < 0x43f00000u; u += 397) {
        float x = f_of(u);
        CHECKF(ms_kvq_e4m3_encode(x) == ms_f32_to_fp8e4m3(x), "x=%a", x);
        CHECKF(ms_kvq_e4m3_encode(-x) == ms_f32_to_fp8e4m3(-x), "x=-%a", x);
    }
    CHECK(ms_kvq_e4m3_encode(1e9f) == 0x7e && ms_kvq_e4m3_encode(-1e9f) == 0xfe);
}

/* hd values, dr rope dims: bytes, scale rule, error bound, pack == pack_ref */
static int check_fp8ds(int64_t hd, int64_t dr, uint64_t seed)
{
    int64_t nope = hd - dr, nb = (nope + 63) / 64, bytes = ms_kvq_fp8ds_bytes(hd, dr);
    if (bytes != nope + 2 * dr + nb + 1) return 0;
    float *x = malloc(sizeof(float) * (size_t)hd), *y = malloc(sizeof(float) * (size_t)hd);
    uint8_t *e = malloc((size_t)bytes), *r = malloc((size_t)bytes);
    int ok = x && y && e && r;
    for (int rep = 0; ok && rep < 200; rep++) {
        float mag = ldexpf(1.0f, rep % 40 - 20); /* scales 2^-20 .. 2^19 */
        for (int64_t i = 0; i < hd; i++) x[i] = frand(&seed) * mag * (i % 7 == 3 ? 9.0f : 1.0f);
        if (rep % 10 == 0) x[0] = 0, x[1] = -0.0f;
        ms_kvq_fp8ds_pack(x, hd, dr, e);
        ms_kvq_fp8ds_pack_ref(x, hd, dr, r);
        ok = !memcmp(e, r, (size_t)bytes) && e[bytes - 1] == 0;
        ms_kvq_fp8ds_unpack(e, hd, dr, y);
        for (int64_t b = 0; ok && b < nb; b++) {
            float amax = 0, s = ms_e8m0_to_f32(e[nope + 2 * dr + b]);
            for (int64_t i = b * 64; i < nope && i < b * 64 + 64; i++)
                amax = fmaxf(amax, fabsf(x[i]));
            /* the smallest power of two with amax / s <= 448 (amax clamped to 1e-4) */
            float a = fmaxf(amax, 1e-4f);
            ok = a / s <= 448.0f && a / s > 224.0f;
            for (int64_t i = b * 64; ok && i < nope && i < b * 64 + 64; i++)
                ok = fabsf(y[i] - x[i]) <= fmaxf(fabsf(x[i]) * 0x1p-4f, s * 0x1p-10f);
        }
        for (int64_t i = 0; ok && i < dr; i++) ok = y[nope + i] == ms_round_bf16(x[nope + i]);
    }
    free(x), free(y), free(e), free(r);
    return ok;
}

TEST(fp8ds_entry)
{
    CHECK(ms_kvq_fp8ds_bytes(512, 64) == 584); /* V4-Flash / Pro */
    CHECK(check_fp8ds(512, 64, 1));
    CHECK(check_fp8ds(128, 64, 2)); /* small-v4: one block */
    CHECK(check_fp8ds(64, 16, 3));  /* tiny-v4: a partial block of 48 */
    CHECK(check_fp8ds(200, 2, 4));  /* odd sizes: blocks of 64, 64, 64, 6 */
    /* the layout: nope codes, BF16 rope little-endian, scales, pad */
    float x[512];
    for (int i = 0; i < 512; i++) x[i] = i < 448 ? (i < 64 ? 448.0f : 1.0f) : 1.5f;
    uint8_t e[584];
    ms_kvq_fp8ds_pack(x, 512, 64, e);
    CHECK(e[0] == 0x7e && e[63] == 0x7e && e[64] == 0x78); /* 448 at scale 1; 1 = 256 × 2^-8 */
    CHECK(e[576] == 127 && e[577] == 127 - 8 && e[582] == 127 - 8 && e[583] == 0);
    CHECK(e[448] == 0xc0 && e[449] == 0x3f); /* 1.5 = bf16 0x3fc0 */
    /* every code at every scale exponent decodes to code value × 2^(s−127) */
    for (int s = 1; s < 255; s++)
        for (int c = 0; c < 256; c++) {
            if ((c & 0x7f) == 0x7f) continue;
            uint8_t b[82] = {0};
            for (int i = 0; i < 48; i++) b[i] = (uint8_t)c;
            b[48 + 32] = (uint8_t)s;
            float y[64];
            ms_kvq_fp8ds_unpack(b, 64, 16, y);
            CHECK(y[47] == ms_fp8e4m3_to_f32((uint8_t)c) * ldexpf(1.0f, s - 127));
        }
}

TEST(mxfp4_key)
{
    CHECK(ms_kvq_mxfp4_bytes(128) == 68 && ms_kvq_mxfp4_bytes(32) == 17 &&
          ms_kvq_mxfp4_bytes(64) == 34);
    /* every code at every scale exponent whose block max is 6 × 2^e round-trips exactly
     * (from 2^-12: below that the amax floor 1e-4 sets the scale) */
    for (int ex = -12; ex <= 120; ex++)
        for (int c = 0; c < 16; c++) {
            float x[32], y[32];
            uint8_t e[17];
            for (int i = 0; i < 32; i++)
                x[i] = ldexpf(ms_fp4e2m1_to_f32((uint8_t)((c + i) & 15)), ex);
            x[31] = ldexpf(6.0f, ex); /* the block max: scale 2^ex */
            ms_kvq_mxfp4_pack(x, 32, e);
            CHECK(e[16] == 127 + ex);
            ms_kvq_mxfp4_unpack(e, 32, y);
            for (int i = 0; i < 32; i++) CHECKF(y[i] == x[i], "ex %d c %d i %d", ex, c, i);
            /* low nibble first */
            CHECK((e[0] & 15) == ms_f32_to_fp4e2m1(ldexpf(x[0], -ex)) &&
                  (e[0] >> 4) == ms_f32_to_fp4e2m1(ldexpf(x[1], -ex)));
        }
    /* random keys: scale rule and the e2m1 half-step bound */
    uint64_t seed = 7;
    for (int rep = 0; rep < 500; rep++) {
        float x[128], y[128];
        uint8_t e[68];
        float mag = ldexpf(1.0f, rep % 30 - 15);
        for (int i = 0; i < 128; i++) x[i] = frand(&seed) * mag;
        ms_kvq_mxfp4_pack(x, 128, e);
        ms_kvq_mxfp4_unpack(e, 128, y);
        for (int b = 0; b < 4; b++) {
            float amax = 1e-4f, s = ms_e8m0_to_f32(e[64 + b]);
            for (int i = b * 32; i < b * 32 + 32; i++) amax = fmaxf(amax, fabsf(x[i]));
            CHECK(amax / s <= 6.0f && amax / s > 3.0f);
            for (int i = b * 32; i < b * 32 + 32; i++) /* grid steps: 0.5 below 2, 1 to 4, 2 */
                CHECK(fabsf(y[i] - x[i]) <= s * (fabsf(x[i]) / s < 2   ? 0.25f
                                                 : fabsf(x[i]) / s < 4 ? 0.5f
                                                                       : 1.0f));
        }
        float z[128];
        memcpy(z, x, sizeof z);
        ms_kvq_mxfp4_round(z, 128);
        CHECK(!memcmp(z, y, sizeof z));
    }
}

TEST(fp8_key)
{
    CHECK(ms_kvq_fp8key_bytes(128) == 132 && ms_kvq_fp8key_bytes(32) == 36 &&
          ms_kvq_fp8key_bytes(256) == 264);
    /* every finite code at every scale exponent whose block max is 448 × 2^e round-trips
     * exactly (from 2^-21: below that the amax floor 1e-4 sets the scale) */
    for (int ex = -21; ex <= 110; ex++)
        for (int c0 = 0; c0 < 256; c0 += 127) {
            float x[128], y[128];
            uint8_t e[132];
            for (int i = 0; i < 128; i++) {
                uint8_t c = (uint8_t)((c0 + i) & 0xff);
                if ((c & 0x7f) == 0x7f) c = 0x00; /* NaN codes are never written */
                x[i] = ldexpf(ms_fp8e4m3_to_f32(c), ex);
            }
            x[127] = ldexpf(448.0f, ex);
            ms_kvq_fp8key_pack(x, 128, e);
            float s;
            memcpy(&s, e + 128, 4);
            CHECKF(s == ldexpf(1.0f, ex), "ex %d", ex);
            ms_kvq_fp8key_unpack(e, 128, y);
            int ok = 1;
            for (int i = 0; i < 128; i++)
                ok &= y[i] == x[i] && e[i] == ms_f32_to_fp8e4m3(ldexpf(x[i], -ex));
            CHECKF(ok, "ex %d c0 %d", ex, c0);
        }
    /* random keys of awkward lengths: fast pack = reference pack byte for byte, the scale
     * rule (s = max(amax, 1e-4) / 448 in f32, codes e4m3(clamp(x · (1/s)))), the e4m3
     * half-step bound, round = pack + unpack */
    uint64_t seed = 11;
    static const int lens[] = {1, 7, 127, 128, 129, 256, 300};
    for (int rep = 0; rep < 700; rep++) {
        int n = lens[rep % 7];
        float x[300], y[300], z[300];
        uint8_t e[320], r[320];
        float mag = ldexpf(1.0f, rep % 40 - 20);
        for (int i = 0; i < n; i++) x[i] = frand(&seed) * mag;
        ms_kvq_fp8key_pack(x, n, e);
        ms_kvq_fp8key_pack_ref(x, n, r);
        CHECK(!memcmp(e, r, (size_t)ms_kvq_fp8key_bytes(n)));
        ms_kvq_fp8key_unpack(e, n, y);
        int ok = 1;
        for (int b = 0; b * 128 < n; b++) {
            float amax = 1e-4f, s;
            memcpy(&s, e + n + 4 * b, 4);
            for (int i = b * 128; i < n && i < b * 128 + 128; i++) amax = fmaxf(amax, fabsf(x[i]));
            ok &= s == amax / 448.0f;
            for (int i = b * 128; i < n && i < b * 128 + 128; i++) {
                float v = fminf(fmaxf(x[i] * (1.0f / s), -448.0f), 448.0f);
                ok &= e[i] == ms_f32_to_fp8e4m3(v);
                float a = fabsf(x[i]) / s; /* e4m3: 3 mantissa bits, subnormal step 2^-9 */
                float step = a < 0x1p-6f ? 0x1p-9f : ldexpf(1.0f, (int)floorf(log2f(a)) - 3);
                ok &= fabsf(y[i] - x[i]) <= 0.5f * step * s * (1 + 1e-6f);
            }
        }
        CHECKF(ok, "rep %d n %d", rep, n);
        memcpy(z, x, sizeof(float) * (size_t)n);
        ms_kvq_fp8key_round(z, n);
        CHECK(!memcmp(z, y, sizeof(float) * (size_t)n));
    }
}

/* Key dots d (fast) and r (twin) of nh heads (queries qq, stride ld) against unpacked key y:
 * d equals r bit for bit, and both the float64 sum within 1e-5 of sum |q·y|. */
static void check_key_dots(int rep, int n, int nh, int ld, const float *qq, const float *y,
                           const float *d, const float *r)
{
    for (int h = 0; h < nh; h++) {
        double want = 0, m1 = 0;
        for (int i = 0; i < n; i++) {
            double p = (double)qq[h * ld + i] * y[i];
            want += p, m1 += fabs(p);
        }
        CHECKF(memcmp(&d[h], &r[h], 4) == 0, "rep %d n %d head %d: %.9g vs twin %.9g", rep, n, h,
               d[h], r[h]);
        CHECKF(fabs(d[h] - want) <= 1e-5 * m1 + 1e-30, "rep %d n %d head %d: %.9g vs %.9g", rep, n,
               h, d[h], want);
    }
}

/* The packed-code dots against their twin, ms_dot_f32 of the unpacked key (bit for bit),
 * and the float64 sums (1e-5 of the sum of |products|). */
TEST(fp8_key_dots)
{
    /* every code (NaN codes excepted: never written) as a one-hot product, two keys of
     * 128 codes, at plain and power-of-two scales (the smallest: the amax floor's) */
    static const float scales[] = {1.0f, 0x1p-20f, 3.7e-3f, 0.4464f, 1e-4f / 448.0f, 7.5e4f};
    static float q[128 * 128];
    for (int i = 0; i < 128; i++) q[i * 128 + i] = 1.0f; /* head i: one-hot at value i */
    for (int si = 0; si < 6; si++)
        for (int half = 0; half < 2; half++) {
            uint8_t e[132];
            float s = scales[si], x[128], d[128];
            for (int i = 0; i < 128; i++) {
                int c = half * 128 + i;
                e[i] = (uint8_t)((c & 0x7f) == 0x7f ? 0x7e : c);
            }
            memcpy(e + 128, &s, 4);
            ms_kvq_fp8key_unpack(e, 128, x);
            ms_kvq_fp8key_dots(q, 128, 128, e, 128, d);
            int ok = 1;
            for (int i = 0; i < 128; i++) ok &= d[i] == x[i] && d[i] == ms_fp8e4m3_to_f32(e[i]) * s;
            CHECKF(ok, "scale %g half %d", s, half);
        }
    /* random keys of every length the register path takes and some it hands to the twin,
     * 1..16 heads with a row stride past the key */
    uint64_t seed = 21;
    static const int lens[] = {8, 24, 32, 40, 64, 72, 96, 120, 128, 136, 256, 301};
    for (int rep = 0; rep < 1200; rep++) {
        int n = lens[rep % 12], nh = 1 + rep % 16, ld = n + 3;
        static float qq[16 * 304];
        float x[320], d[16], r[16];
        uint8_t e[340];
        float mag = ldexpf(1.0f, rep % 50 - 25);
        for (int i = 0; i < n; i++) x[i] = frand(&seed) * mag;
        for (int i = 0; i < nh * ld; i++) qq[i] = frand(&seed) * 3.0f;
        if (rep % 3 == 0) x[rep % n] *= 50.0f; /* an outlier: small values go subnormal */
        ms_kvq_fp8key_pack(x, n, e);
        ms_kvq_fp8key_dots(qq, nh, ld, e, n, d);
        ms_kvq_fp8key_dots_ref(qq, nh, ld, e, n, r);
        float y[320];
        ms_kvq_fp8key_unpack(e, n, y);
        check_key_dots(rep, n, nh, ld, qq, y, d, r);
        if (th_cur_failed) return;
    }
}

/* The MXFP4 packed-code dots (ms_kvq_mxfp4_dots, the decode indexer's scores of
 * --enable-deepseek-v4-fp4-indexer keys) equal the twin (unpack + ms_dot_f32) bit for
 * bit: every code at every written scale exponent as one-hot queries, then random keys
 * of the lengths the register path takes and some it hands to the twin, 1..16 heads. */
TEST(mxfp4_key_dots)
{
    static float q[128 * 128];
    for (int i = 0; i < 128; i++) q[i * 128 + i] = 1.0f; /* head i: one-hot at value i */
    for (int ex = 0; ex < 253; ex++) { /* 253, 254: ±4, ±6 overflow (0 · inf); 255 NaN */
        uint8_t e[68];
        float x[128], d[128];
        for (int i = 0; i < 64; i++) e[i] = (uint8_t)((i + ex) * 37 + (i >> 3));
        for (int b = 0; b < 4; b++) e[64 + b] = (uint8_t)(b == 0 ? ex : (ex + 61 * b) % 253);
        ms_kvq_mxfp4_unpack(e, 128, x);
        ms_kvq_mxfp4_dots(q, 128, 128, e, 128, d);
        int ok = 1;
        for (int i = 0; i < 128; i++) ok &= memcmp(&d[i], &x[i], 4) == 0;
        CHECKF(ok, "exponent %d", ex);
    }
    uint64_t seed = 23;
    static const int lens[] = {8, 24, 32, 40, 64, 72, 96, 120, 128, 136, 256, 301};
    for (int rep = 0; rep < 1200; rep++) {
        int n = lens[rep % 12], nh = 1 + rep % 16, ld = n + 3;
        static float qq[16 * 304];
        float x[320], d[16], r[16], y[320];
        uint8_t e[340];
        float mag = ldexpf(1.0f, rep % 50 - 25);
        for (int i = 0; i < n; i++) x[i] = frand(&seed) * mag;
        for (int i = 0; i < nh * ld; i++) qq[i] = frand(&seed) * 3.0f;
        if (rep % 3 == 0) x[rep % n] *= 50.0f; /* an outlier: its block's small values go to 0 */
        ms_kvq_mxfp4_pack(x, n, e);
        ms_kvq_mxfp4_dots(qq, nh, ld, e, n, d);
        ms_kvq_mxfp4_dots_ref(qq, nh, ld, e, n, r);
        ms_kvq_mxfp4_unpack(e, n, y);
        check_key_dots(rep, n, nh, ld, qq, y, d, r);
        if (th_cur_failed) return;
    }
}

TEST(hadamard)
{
    for (int n = 1; n <= 128; n *= 2)
        for (int j = 0; j < n; j++) { /* column j of H / sqrt(n) */
            float x[128] = {0};
            x[j] = 1;
            ms_kvq_hadamard(x, n);
            for (int i = 0; i < n; i++) {
                float want =
                    (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0f : 1.0f) / sqrtf((float)n);
                CHECK_NEAR(x[i], want, 1e-6);
            }
        }
    uint64_t seed = 3;
    float a[128], b[128], ha[128], hb[128];
    for (int i = 0; i < 128; i++) ha[i] = a[i] = frand(&seed), hb[i] = b[i] = frand(&seed);
    ms_kvq_hadamard(ha, 128);
    ms_kvq_hadamard(hb, 128);
    double d0 = 0, d1 = 0;
    for (int i = 0; i < 128; i++) d0 += (double)a[i] * b[i], d1 += (double)ha[i] * hb[i];
    CHECK_NEAR(d0, d1, 1e-5);
    ms_kvq_hadamard(ha, 128); /* symmetric and orthogonal: its own inverse */
    for (int i = 0; i < 128; i++) CHECK_NEAR(ha[i], a[i], 1e-6);
}

int main(void)
{
    RUN(e4m3_encode_vs_ref);
    RUN(fp8ds_entry);
    RUN(mxfp4_key);
    RUN(fp8_key);
    RUN(fp8_key_dots);
    RUN(mxfp4_key_dots);
    RUN(hadamard);
    return TEST_REPORT();
}
