/* mm_widen.c — the auto-mode (exact = 0) matmul y = x·Wᵀ for BF16 and FP8
 * weights, and y = x·W for FP8 (MLA's absorption), on AVX-512 CPUs without
 * AVX512_BF16 (Skylake-SP to Ice Lake, and guests that hide it): FP32
 * activations, weights widened to f32, FP32 FMA.  A group of 64 BF16 weights
 * (two vectors of 32 words) widens with one shift and one AND per vector —
 * even words to the top half of a lane, odd words kept in place — so the f32
 * lanes come out permuted; FP8 codes first become the two bytes of bf16
 * words, through the exact e4m3 -> bf16 byte tables (vpermi2b, AVX512_VBMI),
 * or with one GF(2) affine transform per byte (GFNI) in rows the model
 * marked plain (ms_mat.f8_plain).  The
 * activations are permuted once to match (FP8: times 256 · the block scale),
 * so the inner loops have no shuffles.  Small M streams the weight rows;
 * larger M widens each block of rows to f32 scratch once per pass of WD_KC
 * columns and runs FMA-only register tiles over it.  Each output is summed in
 * a fixed order, so results do not depend on the split; ~1e-7 relative to
 * ms_matmul_ref, like the exact kernels.  Runs on pool threads (matmul.c);
 * the FP8 half only where the CPU has AVX512_VBMI and GFNI.
 */
#include <immintrin.h>

#include "base/util.h"
#include "kernels/mm_internal.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include "kernels/mm_avx512_inl.h"

#define AI static inline __attribute__((always_inline))

enum {
    WD_GEMV_M = 6,  /* activation rows per pass of the streaming gemv */
    WD_GEMV_NB = 8, /* weight rows per gemv block (every pass over it while in L1) */
    /* up to this many activation rows the gemv (in passes of six) beats
     * widening into scratch: 1 MiB BF16 expert matrices from DRAM, 2
     * threads, gemv / tiles: M = 7 58 / 90 us, 9 67 / 83, 12 79 / 93, 16 99 /
     * 107, 24 140 / 137, 32 182 / 162 */
    WD_GEMV_MAX_M = 16,
    /* prepared rows of one gemv pass over more than this many bytes go in
     * passes of WD_GEMV_KC columns, which stay in L1 while the 8 weight rows
     * go past (at K = 7168 six rows are 172 KiB: every FMA's operand came
     * from L2) */
    WD_GEMV_XP_L1 = 32768,
    WD_GEMV_KC = 1024,
    WD_MC = 128,              /* activation rows prepared at once, at least */
    WD_XP_BYTES = 2048 << 10, /* and up to this many bytes of them (per thread) */
    WD_NB = 128,              /* BF16 weight rows widened per block (FP8: its scale blocks) */
    /* columns per widened pass: a 4-row tile (16 KiB) and 6 prepared rows
     * (24 KiB) stay in L1 while the block (512 KiB) stays in L2 */
    WD_KC = 1024,
    /* one line per weight row this far ahead, as mm_bf16.c does: it starts
     * the address translation of the pages the stream reaches next */
    WD_PAGE_PF_BYTES = 16384,
    /* and every line of the stream this far ahead into L1, and WD_PF_L2_BYTES
     * ahead into L2: the hardware prefetcher alone leaves one stream per core
     * well below the read rate (measured: bench/RESULTS.md, "Why the code is so") */
    WD_PF_BYTES = 2048,
    WD_PF_L2_BYTES = 8192,
};

/* The prepared activations on this thread (MM_SCR_XW): prep's arguments and
 * the pool run, shared by the BF16 and FP8 instantiations. */
static _Thread_local struct wd_key {
    const float *x, *xp, *srow;
    int64_t ldx, mc, K, c0;
    uint64_t run;
    int fp8;
} wd_prepped;

/* Four sums as one __m128: the lanes of each vector added in the same tree
 * as wd_red1 (halves, quarters, then pairs), so a row's sum has the same
 * bits whichever of the two computes it. */
AI __m128 wd_red4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 e =
        _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    __m512 t = _mm512_add_ps(e, _mm512_permute_ps(e, 0x4E)); /* (0+2, 1+3) in each lane */
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));        /* (0+2) + (1+3) */
    __m512 s = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), t);
    return _mm512_castps512_ps128(s);
}

AI float wd_red1(__m512 a)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(q) + _mm_cvtss_f32(_mm_shuffle_ps(q, q, 1));
}

/* Columns per gemv pass for mb prepared rows of Kp floats (all of them, or
 * WD_GEMV_KC). */
static inline int64_t wd_gemv_kc(int mb, int64_t Kp)
{
    return (int64_t)mb * Kp * 4 <= WD_GEMV_XP_L1 ? Kp : WD_GEMV_KC;
}

/* One tile over widened weights: prepared rows xp[MB][ldx] × widened rows
 * wf[R][ldw], kcp columns (a multiple of 16, zero padded); sums to out[m][4]. */
AI void wd_tile(const int MB, const int R, const float *xp, int64_t ldx, const float *wf,
                int64_t ldw, int64_t kcp, float *out)
{
    __m512 acc[6][4];
#pragma GCC unroll 6
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kcp; k += 16) {
        __m512 xv[6];
#pragma GCC unroll 6
        for (int m = 0; m < MB; m++) xv[m] = _mm512_load_ps(xp + m * ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_load_ps(wf + r * ldw + k);
#pragma GCC unroll 6
            for (int m = 0; m < MB; m++) acc[m][r] = _mm512_fmadd_ps(xv[m], w, acc[m][r]);
        }
    }
#pragma GCC unroll 6
    for (int m = 0; m < MB; m++) {
        if (R == 4)
            _mm_storeu_ps(out + 4 * m, wd_red4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]));
        else
            out[4 * m] = wd_red1(acc[m][0]);
    }
}

static void wd_tile_mb(int MB, int R, const float *xp, int64_t ldx, const float *wf, int64_t ldw,
                       int64_t kcp, float *out)
{
#define T(mb)                                                                                      \
    case mb:                                                                                       \
        if (R == 4)                                                                                \
            wd_tile(mb, 4, xp, ldx, wf, ldw, kcp, out);                                            \
        else                                                                                       \
            wd_tile(mb, 1, xp, ldx, wf, ldw, kcp, out);                                            \
        break
    switch (MB) {
        T(1);
        T(2);
        T(3);
        T(4);
        T(5);
    default:
        T(6);
    }
#undef T
}

/* Prepared rows xp[mc][ldx] × widened rows wf[nr][kcp] into y[mc][ldy]
 * (add: added to y).  The activation rows go in groups of at most six, as
 * equal as they come (32 = 6 + 6 + 5 + 5 + 5 + 5), each staying in L1 while
 * the block's rows go past four at a time.  (No prefetch of the next
 * block from here: it was slower; bench/RESULTS.md, "Why the code is so".) */
static void wd_block(const float *xp, int64_t ldx, int64_t mc, const float *wf, int64_t kcp,
                     int64_t nr, float *y, int64_t ldy, int add)
{
    float s[6 * 4];
    const int64_t groups = (mc + 5) / 6;
    for (int64_t g = 0, m = 0; g < groups; g++) {
        int mb = (int)((mc - m) / (groups - g) + ((mc - m) % (groups - g) != 0));
        for (int64_t r = 0; r < nr;) {
            int R = nr - r >= 4 ? 4 : 1;
            wd_tile_mb(mb, R, xp + m * ldx, ldx, wf + r * kcp, kcp, kcp, s);
            for (int i = 0; i < mb; i++) {
                float *yo = y + (m + i) * ldy + r;
                for (int j = 0; j < R; j++) yo[j] = add ? yo[j] + s[4 * i + j] : s[4 * i + j];
            }
            r += R;
        }
        m += mb;
    }
}

/* ---- BF16 weights ---- */

typedef struct wd_nolut {
    int unused;
} wd_nolut;

static inline void wd_bf16_lut_init(wd_nolut *L)
{
    L->unused = 0;
}

/* Two vectors of 32 words -> f32: v[0] = words 0, 2, ..., 30 (shifted to the
 * top half), v[1] = words 1, 3, ..., 31 (the low word masked off), v[2], v[3]
 * the same for words 32..63. */
AI void wd_bf16_split(__m512i a, __m512i b, __m512 *v)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    v[1] = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
    v[2] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
    v[3] = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
}

AI void wd_bf16_load64(const wd_nolut *L, const char *p, __m512 *v)
{
    (void)L;
    wd_bf16_split(_mm512_loadu_si512(p), _mm512_loadu_si512(p + 64), v);
}

AI void wd_bf16_load64_tail(const wd_nolut *L, const char *p, int64_t rem, __m512 *v)
{
    (void)L;
    __mmask32 m0 = rem >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << rem) - 1);
    __mmask32 m1 = rem <= 32 ? 0 : (((__mmask32)1 << (rem - 32)) - 1);
    wd_bf16_split(_mm512_maskz_loadu_epi16(m0, p), _mm512_maskz_loadu_epi16(m1, p + 64), v);
}

AI void wd_bf16_load64_plain(const char *p, __m512 *v)
{
    wd_bf16_load64(NULL, p, v);
}

/* x[0..63] as v[4] -> the order of wd_bf16_split (evens, odds, per half). */
AI void wd_bf16_permute(const __m512 *v, float *o)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    _mm512_store_ps(o, _mm512_permutex2var_ps(v[0], ev, v[1]));
    _mm512_store_ps(o + 16, _mm512_permutex2var_ps(v[0], od, v[1]));
    _mm512_store_ps(o + 32, _mm512_permutex2var_ps(v[2], ev, v[3]));
    _mm512_store_ps(o + 48, _mm512_permutex2var_ps(v[2], od, v[3]));
}

#define WD_FP8           0
#define WD_LUT           wd_nolut
#define WD_FN(name)      wd_bf16_##name
#define wd_permute(v, o) wd_bf16_permute(v, o)
#include "kernels/mm_widen_tmpl.h"
#undef WD_FP8
#undef WD_LUT
#undef WD_FN
#undef wd_permute

#pragma GCC pop_options

/* ---- FP8 (e4m3) weights: AVX512_VBMI for the byte tables, GFNI for plain rows ---- */

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,gfni")

typedef struct wd_f8lut {
    __m512i th0, th1, tl0, tl1; /* high and low bytes of bf16(code × 2^-8), codes 0..63, 64..127 */
    __m512i sign;
} wd_f8lut;

/* The exact tables for code × 2^-8 (mm_f8_hi_scaled): the scale the
 * integer conversion below gives, undone by the activations' factor 256
 * (prep). */
static inline void wd_fp8_lut_init(wd_f8lut *L)
{
    L->th0 = mm_f8_hi_scaled(0);
    L->th1 = mm_f8_hi_scaled(1);
    L->tl0 = _mm512_loadu_si512(ms_f8_bf16_lo);
    L->tl1 = _mm512_loadu_si512(ms_f8_bf16_lo + 64);
    L->sign = _mm512_set1_epi8((char)0x80);
}

/* Low and high bytes of 64 bf16 words -> f32: the words of 128-bit lane L
 * of unpacklo (lo, hi) are codes 16L .. 16L + 7, of unpackhi 16L + 8 ..
 * 16L + 15, then widened as BF16 weights are; so v[q] lane 4L + j takes code
 * 16L + 2j + {0, 1, 8, 9}[q] (wd_fp8_permute). */
AI void wd_fp8_bytes(__m512i lo, __m512i hi, __m512 *v)
{
    wd_bf16_split(_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi), v);
}

/* 64 codes -> f32 code × 2^-8, exact for every code: both bytes of the bf16
 * value from the tables (the sign OR-ed into the high one). */
AI void wd_fp8_split(const wd_f8lut *L, __m512i c, __m512 *v)
{
    __m512i hi = _mm512_permutex2var_epi8(L->th0, c, L->th1);
    __m512i lo = _mm512_permutex2var_epi8(L->tl0, c, L->tl1);
    hi = _mm512_ternarylogic_epi32(hi, c, L->sign, 0xF8); /* hi | (c & 0x80) */
    wd_fp8_bytes(lo, hi, v);
}

AI void wd_fp8_load64(const wd_f8lut *L, const char *p, __m512 *v)
{
    wd_fp8_split(L, _mm512_loadu_si512(p), v);
}

AI void wd_fp8_load64_tail(const wd_f8lut *L, const char *p, int64_t rem, __m512 *v)
{
    wd_fp8_split(L, _mm512_maskz_loadu_epi8(((__mmask64)1 << rem) - 1, p), v);
}

/* The same for plain codes (exponent field 1..15, not NaN) without the
 * tables (mm_f8_plain_bytes: one GF(2) affine transform per byte).  8
 * operations per 64 codes with the unpacks and the widening, against 11 for
 * the integer shifts and masks this replaced (measured: bench/RESULTS.md, "Why the code is so"). */
AI void wd_fp8_plain_split(__m512i c, __m512 *v)
{
    __m512i lo, hi;
    mm_f8_plain_bytes(c, &lo, &hi);
    wd_fp8_bytes(lo, hi, v);
}

AI void wd_fp8_load64_plain(const char *p, __m512 *v)
{
    wd_fp8_plain_split(_mm512_loadu_si512(p), v);
}

/* x[0..63] as v[4] -> the order of wd_fp8_bytes: output q, lane 4L + j
 * takes x[16L + 2j + {0, 1, 8, 9}[q]] (four lanes from each input vector). */
AI void wd_fp8_permute(const __m512 *v, float *o)
{
    const __m512i base = _mm512_setr_epi32(0, 2, 4, 6, 16, 18, 20, 22, 0, 2, 4, 6, 16, 18, 20, 22);
    static const int add[4] = {0, 1, 8, 9};
    for (int q = 0; q < 4; q++) {
        __m512i idx = _mm512_add_epi32(base, _mm512_set1_epi32(add[q]));
        __m512 a = _mm512_permutex2var_ps(v[0], idx, v[1]); /* codes 0..31 */
        __m512 b = _mm512_permutex2var_ps(v[2], idx, v[3]); /* codes 32..63 */
        _mm512_store_ps(o + 16 * q, _mm512_shuffle_f32x4(a, b, 0x44));
    }
}

/* ---- y = x·W (nn) for FP8 weights: W is [K = rows][N = cols] ----
 * MLA's absorption (q_nope · W_UK: K = 64 rows of 512 codes, one view per
 * head).  Each row's 64-code groups are converted as in x·Wᵀ (plain rows with
 * integer operations) and multiplied by the activation x[m][k] · 256 · the
 * block scale of that row and of the columns, broadcast; the sums come out in
 * the conversion's column order and are put back in order once at the end.
 * Each output takes its products in k order whatever the split.  The exact
 * kernel converts FP8 one 16-weight vector at a time (~11 operations). */

/* acc[0..3] in wd_fp8_bytes' order -> the 64 columns in order: out[r] lanes
 * 0..7 interleave acc[0] and acc[1] lanes 4r .. 4r + 3, lanes 8..15 acc[2]
 * and acc[3]. */
AI void wd_fp8_nn_unpermute(const __m512 *acc, __m512 *out)
{
    const __m512i ia = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 0, 16, 1, 17, 2, 18, 3, 19);
    for (int r = 0; r < 4; r++) {
        __m512i i = _mm512_add_epi32(ia, _mm512_set1_epi32(4 * r));
        __m512 lo = _mm512_permutex2var_ps(acc[0], i, acc[1]);
        __m512 hi = _mm512_permutex2var_ps(acc[2], i, acc[3]);
        out[r] = _mm512_mask_blend_ps(0xFF00, lo, hi);
    }
}

/* Columns [n, n + 64·CW) (rem of them valid) for activation rows
 * [m0, m0 + MB); xs[(b·4 + m)·K + k] = x[m0 + m][k] · 256 · scale for column
 * block cb0 + b. */
AI void wd_fp8_nn_chunk(const int full, const int MB, const int CW, const mm_task *t,
                        const wd_f8lut *L, const float *xs, int64_t cb0, int64_t m0, int64_t n,
                        int64_t rem, const uint8_t *plain)
{
    const ms_mat *W = t->W;
    const int64_t K = W->rows, ldw = W->ld;
    const float *xg[4][4];
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int g = 0; g < CW; g++)
            xg[m][g] = xs + (((W->c0 + n + 64 * g) / 128 - cb0) * 4 + m) * K;
    __m512 acc[4][16];
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 16
        for (int q = 0; q < 4 * CW; q++) acc[m][q] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const char *row = (const char *)W->data + k * ldw + n;
        const int fast = full && plain && plain[k] == MS_F8_ROW_PLAIN;
#pragma GCC unroll 4
        for (int g = 0; g < CW; g++) {
            __m512 v[4];
            int64_t rg = rem - 64 * g;
            if (fast)
                wd_fp8_load64_plain(row + 64 * g, v);
            else if (full || rg >= 64)
                wd_fp8_load64(L, row + 64 * g, v);
            else /* masked codes read as 0: the tables give 0.0 for them */
                wd_fp8_load64_tail(L, row + 64 * g, rg > 0 ? rg : 0, v);
#pragma GCC unroll 4
            for (int m = 0; m < MB; m++) {
                __m512 xb = _mm512_set1_ps(xg[m][g][k]);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    acc[m][4 * g + q] = _mm512_fmadd_ps(v[q], xb, acc[m][4 * g + q]);
            }
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int g = 0; g < CW; g++) {
            __m512 o[4];
            wd_fp8_nn_unpermute(&acc[m][4 * g], o);
            mm_store64(t, t->y + (m0 + m) * t->ldy + n + 64 * g, o, rem - 64 * g);
        }
}

static int wd_fp8_nn(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int64_t K = W->rows;
    if (W->c0 % 64) return -1; /* 64-column groups must not straddle scale blocks */
    if (n1 <= n0) return 0;
    const int64_t cb0 = (W->c0 + n0) / 128, nblk = (W->c0 + n1 - 1) / 128 - cb0 + 1;
    float *xs = ms_mm_scratch(MM_SCR_W, sizeof(float) * (size_t)(4 * nblk * K)); /* [nblk][4][K] */
    if (!xs) return -1;
    wd_f8lut L;
    wd_fp8_lut_init(&L);
    const uint8_t *plain = W->f8_plain ? W->f8_plain + (W->r0 - W->f8_plain_r0) : NULL;
    for (int64_t m0 = 0; m0 < t->M; m0 += 4) {
        const int mb = t->M - m0 < 4 ? (int)(t->M - m0) : 4;
        for (int64_t b = 0; b < nblk; b++)
            for (int m = 0; m < mb; m++)
                for (int64_t k = 0; k < K; k++)
                    xs[(b * 4 + m) * K + k] = t->x[(m0 + m) * t->ldx + k] * 256.0f *
                                              W->scale[((W->r0 + k) / 128) * W->scale_ld + cb0 + b];
#define C(full, mb_, cw_, n, rem) wd_fp8_nn_chunk(full, mb_, cw_, t, &L, xs, cb0, m0, n, rem, plain)
        MM_NN_COLUMNS(C, mb, n0, n1)
#undef C
    }
    return 0;
}

#define WD_FP8           1
#define WD_LUT           wd_f8lut
#define WD_FN(name)      wd_fp8_##name
#define wd_permute(v, o) wd_fp8_permute(v, o)
#include "kernels/mm_widen_tmpl.h"
#undef WD_FP8
#undef WD_LUT
#undef WD_FN
#undef wd_permute

#pragma GCC pop_options

int ms_mm_widen_nn(const mm_task *t, int64_t n0, int64_t n1)
{
    if (t->W->dtype == MS_DT_F8E4M3)
        return wd_fp8_nn(t, n0, n1); /* the caller checked VBMI, GFNI */
    return -1;
}

int ms_mm_widen_nt(const mm_task *t, int64_t n0, int64_t n1)
{
    if (t->W->dtype == MS_DT_BF16) return wd_bf16_nt(t, n0, n1);
    if (t->W->dtype == MS_DT_F8E4M3)
        return wd_fp8_nt(t, n0, n1); /* the caller checked VBMI, GFNI */
    return -1;
}
