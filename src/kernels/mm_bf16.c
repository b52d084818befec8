/* mm_bf16.c — the auto-mode (exact = 0) matmul for BF16 and F8E4M3 weights on
 * AVX512_BF16 CPUs: activations rounded once to BF16 into per-thread scratch,
 * weights fed to vdpbf16ps (FP8 through an exact e4m3 -> bf16 table lookup with
 * vpermi2b, or in the x·Wᵀ GEMV and tiles bf16(code × 2^-8) with one GF(2)
 * affine transform per byte for rows the model marked plain), FP32
 * accumulation.  FP8 block scales are folded into the BF16
 * activations per 128-row block (x·s rounded once, the same error as rounding
 * x), so any view origin (r0, c0) works and the inner loop has no scale work.
 * Products x·Wᵀ for both dtypes; x·W for FP8 weights (MLA's absorption).
 * Also the bulk conversions that use the same instructions (ms_cvt_*).
 * Compiled for AVX-512 BF16 + VBMI + GFNI by the pragma; called on pool
 * threads only when kctx->isa == MS_ISA_AVX512BF16 (which needs all three).
 */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,gfni")
#include <immintrin.h>
#include <string.h>

#include "kernels/mm_avx512_inl.h"
#include "kernels/mm_internal.h"

#define AI static inline __attribute__((always_inline))

enum {
    /* activation rows prepared (rounded to bf16) at once: a prefill expert's
     * ~48 rows (512 tokens × top-6 over 64) in one block, prepared once
     * (measured: bench/RESULTS.md, "Why the code is so") */
    MC = 128,
    F8_WIDEN_M = 32, /* FP8 weights at M >= this are widened to bf16 once per block */
    /* columns per pass of the tiles (a multiple of 64): in passes of KC
     * columns the prepared rows stay in L2 and the tile in L1, each pass
     * adding its sums to y (measured: bench/RESULTS.md, "Why the code is so") */
    KC = 1024,
    /* FP8 GEMV: software prefetch distance along the stream, into L2 (T1):
     * into L1 (T0) the prefetches held the few L1 miss buffers and the GEMV
     * read DRAM-cold experts at 0.6-0.8 of BF16's GB/s (measured:
     * bench/HISTORY.md, "FP8 GEMV prefetch into L2") */
    F8_PF_BYTES = 8192,
    PREP_PF_FLOATS = 512, /* prep: prefetch distance along an activation row */
    /* BF16 rows at M = 2, 3: prefetch distance along the weights, into L2
     * (prefetcht1; the non-temporal hint, which fills L1 here, was slower on
     * this AMD guest, as T0 was for the tiles: bench/HISTORY.md, "Batch 32:
     * the 2-3-row GEMV prefetch into L2") */
    MR_PF_BYTES = 4096,
    /* One line per weight row (per tile row in the tiles) prefetched this
     * far ahead, on top of the streams' own prefetching: it starts the
     * address translation of the pages the stream reaches next (page walks
     * slowed scattered expert reads; measured: bench/RESULTS.md, "Why the code is so") */
    PAGE_PF_BYTES = 16384,
    /* Tiles (BF16; FP8 shares the code) of at most this many activation rows (a batched decode's
     * experts: 32 tokens × top-6 over 64 is 4-8 rows for a third of them)
     * prefetch the next tile into L2 (prefetcht1), larger ones into L1.  At
     * a few rows the tile streams from DRAM; our reading is that an L1
     * prefetch holds one of the core's few L1 miss buffers until its line
     * arrives, capping the lines in flight (measured, not the mechanism:
     * bench/HISTORY.md, "Batch 32: tile prefetch into L2"). */
    TILE_PF_L2_MAX_M = 8,
};

/* bf16 bit pattern of e4m3 code c (c < 128; the sign is OR-ed in): high and
 * low bytes.  0x7f (NaN) maps to the quiet NaN 0x7fc0.  Checked against
 * ms_fp8e4m3_to_f32 over all 256 codes by tests/test_kernels.c. */
const uint8_t ms_f8_bf16_hi[128] = {
    0x00, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c,
    0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d,
    0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e,
    0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
    0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
    0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
    0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
    0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x7f,
};
const uint8_t ms_f8_bf16_lo[128] = {
    0x00, 0x00, 0x80, 0xc0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xc0,
};

typedef struct f8lut {
    __m512i th0, th1, tl0, tl1; /* ms_f8_bf16_hi[0..63], [64..127] (or scaled), _lo likewise */
    __m512i ia, ib;             /* byte interleaves lo/hi -> words 0..31, 32..63 */
    __m512i sign;
} f8lut;

/* scaled: the high bytes of bf16(code × 2^-8) (mm_f8_hi_scaled), the form
 * of the plain rows' conversion; the activations then carry 256. */
static void f8lut_init(f8lut *L, int scaled)
{
    uint8_t ia[64], ib[64];
    for (int j = 0; j < 32; j++) {
        ia[2 * j] = (uint8_t)j;
        ia[2 * j + 1] = (uint8_t)(64 + j);
        ib[2 * j] = (uint8_t)(32 + j);
        ib[2 * j + 1] = (uint8_t)(96 + j);
    }
    L->th0 = scaled ? mm_f8_hi_scaled(0) : _mm512_loadu_si512(ms_f8_bf16_hi);
    L->th1 = scaled ? mm_f8_hi_scaled(1) : _mm512_loadu_si512(ms_f8_bf16_hi + 64);
    L->tl0 = _mm512_loadu_si512(ms_f8_bf16_lo);
    L->tl1 = _mm512_loadu_si512(ms_f8_bf16_lo + 64);
    L->ia = _mm512_loadu_si512(ia);
    L->ib = _mm512_loadu_si512(ib);
    L->sign = _mm512_set1_epi8((char)0x80);
}

/* 64 e4m3 codes -> 64 bf16 (in order: wa = codes 0..31, wb = 32..63), exact. */
AI void f8_to_bf16(const f8lut *L, __m512i b, __m512i *wa, __m512i *wb)
{
    __m512i hi = _mm512_permutex2var_epi8(L->th0, b, L->th1);
    __m512i lo = _mm512_permutex2var_epi8(L->tl0, b, L->tl1);
    hi = _mm512_ternarylogic_epi32(hi, b, L->sign, 0xF8); /* hi | (b & 0x80) */
    *wa = _mm512_permutex2var_epi8(lo, L->ia, hi);
    *wb = _mm512_permutex2var_epi8(lo, L->ib, hi);
}

/* The same conversion with in-lane byte interleaves instead of the two
 * cross-lane ones: wa = codes {0-7, 16-23, 32-39, 48-55}, wb = {8-15, 24-31,
 * 40-47, 56-63}.  The matmul kernels feed it activations prepared in that
 * order (prep with perm = 1), which costs two word permutes per 64
 * activations once, instead of two byte permutes per 64 weights. */
AI void f8_to_bf16_lanes(const f8lut *L, __m512i b, __m512i *wa, __m512i *wb)
{
    __m512i hi = _mm512_permutex2var_epi8(L->th0, b, L->th1);
    __m512i lo = _mm512_permutex2var_epi8(L->tl0, b, L->tl1);
    hi = _mm512_ternarylogic_epi32(hi, b, L->sign, 0xF8); /* hi | (b & 0x80) */
    *wa = _mm512_unpacklo_epi8(lo, hi);
    *wb = _mm512_unpackhi_epi8(lo, hi);
}

/* f8_to_bf16_lanes for plain codes (ms_mat.f8_plain): bf16(code × 2^-8)
 * without the tables, the same bits as the scaled tables give.  4
 * operations per 64 codes against 5, two of them vpermi2b. */
AI void f8_to_bf16_lanes_plain(__m512i b, __m512i *wa, __m512i *wb)
{
    __m512i lo, hi;
    mm_f8_plain_bytes(b, &lo, &hi);
    *wa = _mm512_unpacklo_epi8(lo, hi);
    *wb = _mm512_unpackhi_epi8(lo, hi);
}

/* 64 FP8 codes for the x·Wᵀ kernels: f8 = 1 through the tables, 2 plain. */
AI void f8_lanes(const int f8, const f8lut *L, __m512i b, __m512i *wa, __m512i *wb)
{
    if (f8 == 2)
        f8_to_bf16_lanes_plain(b, wa, wb);
    else
        f8_to_bf16_lanes(L, b, wa, wb);
}

AI __m512 dp(__m512 acc, __m512i x, __m512i w)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
}

/* The horizontal sums of v[0..15] into one vector, s[i] = the sum of v[i]'s
 * lanes, by the tree _mm512_reduce_add_ps takes (GCC's: lanes j and j + 8,
 * then j and j + 4, then j and j + 2, then 0 and 1), so every sum has the
 * same bits as reduce_add_ps(v[i]); the transposed shuffles share each step
 * among the vectors (45 operations for 16 sums against ~128).  A tile of
 * at most 4 sums still takes reduce_add_ps, so test_kernels.c's
 * matmul_batch_invariant (rows of an M-row product against M = 1, the
 * tiles' shapes differing) fails if the two trees part by a bit. */
AI __m512 hsum16(const __m512 *v)
{
    __m512 h[8], q[4], p[2];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* lanes j + (j + 8) of v[i] and v[i + 4], i = 0-3, 8-11 */
        __m512 a = v[k < 4 ? k : k + 4], b = v[k < 4 ? k + 4 : k + 8];
        h[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    /* h[k]: the two 128-bit halves of a's 8 sums, then b's */
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) { /* j + (j + 4): lane l of q[e] holds v[e + 4l]'s 4 sums */
        __m512 a = h[e], b = h[e + 4];
        q[e] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) { /* j + (j + 2): per lane q[2i]'s 2 sums, then q[2i + 1]'s */
        __m512 a = q[2 * i], b = q[2 * i + 1];
        p[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    /* 0 + 1: element e of lane l is q[e] lane l's sum, that of v[4l + e] */
    return _mm512_add_ps(_mm512_shuffle_ps(p[0], p[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(p[0], p[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* One tile: prepared activation rows xb[MB][ldxb] (bf16, zero padded to a
 * multiple of 64) × weight rows w0 + r·ldw (bytes), r < R; writes the sums to
 * out[m * R + r].  Register blocked: per 32 columns each activation vector
 * and each weight vector is loaded once and feeds MB·R products (loading both
 * operands for every product made the loop load-bound).  Each sum takes its products in
 * k order, so the result does not depend on MB, R or the split.  isf8: 0
 * BF16, 1 FP8 through the tables, 2 FP8 rows that are all plain. */
/* the next tile's rows: into L2 for small M (pf1, TILE_PF_L2_MAX_M), else L1 */
AI void pf_next(const char *p, int pf1)
{
    if (pf1)
        _mm_prefetch(p, _MM_HINT_T1);
    else
        _mm_prefetch(p, _MM_HINT_T0);
}

AI void tile(const int isf8, const int MB, const int R, const f8lut *L, const uint16_t *xb,
             int64_t ldxb, const char *w0, int64_t ldw, int64_t K, float *out, int pf1)
{
    const int es = isf8 ? 1 : 2;
    __m512 acc[4][8];
#pragma GCC unroll 8
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    const int64_t Kf = K & ~(int64_t)63;
    int64_t k = 0;
    for (; k < Kf; k += 64) {
        if (isf8) {
            __m512i xa[4], xc[4];
#pragma GCC unroll 4
            for (int m = 0; m < MB; m++) {
                xa[m] = _mm512_loadu_si512(xb + m * ldxb + k);
                xc[m] = _mm512_loadu_si512(xb + m * ldxb + k + 32);
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const char *p = w0 + r * ldw + k;
                __m512i wa, wb;
                pf_next(p + R * ldw, pf1);
                f8_lanes(isf8, L, _mm512_loadu_si512(p), &wa, &wb);
#pragma GCC unroll 4
                for (int m = 0; m < MB; m++) acc[m][r] = dp(dp(acc[m][r], xa[m], wa), xc[m], wb);
            }
        } else {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i xv[4];
#pragma GCC unroll 4
                for (int m = 0; m < MB; m++) xv[m] = _mm512_loadu_si512(xb + m * ldxb + k + 32 * h);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const char *p = w0 + r * ldw + 2 * k + 64 * h;
                    pf_next(p + R * ldw, pf1);
                    __m512i w = _mm512_loadu_si512(p);
#pragma GCC unroll 4
                    for (int m = 0; m < MB; m++) acc[m][r] = dp(acc[m][r], xv[m], w);
                }
            }
        }
    }
    if (k < K) { /* tail: masked weight loads; the activations are zero padded */
        int64_t rem = K - k;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const char *p = w0 + r * ldw + k * es;
            __m512i wa, wb;
            if (isf8) {
                __mmask64 mk = rem >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << rem) - 1);
                f8_to_bf16_lanes(L, _mm512_maskz_loadu_epi8(mk, p), &wa, &wb);
            } else {
                __mmask32 m0 = rem >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << rem) - 1);
                __mmask32 m1 = rem <= 32 ? 0 : (((__mmask32)1 << (rem - 32)) - 1);
                wa = _mm512_maskz_loadu_epi16(m0, p);
                wb = _mm512_maskz_loadu_epi16(m1, p + 64);
            }
#pragma GCC unroll 4
            for (int m = 0; m < MB; m++) {
                const uint16_t *xp = xb + m * ldxb + k;
                acc[m][r] = dp(acc[m][r], _mm512_loadu_si512(xp), wa);
                acc[m][r] = dp(acc[m][r], _mm512_loadu_si512(xp + 32), wb);
            }
        }
    }
    if (MB * R <= 4) { /* too few to share the steps */
#pragma GCC unroll 4
        for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) out[m * R + r] = _mm512_reduce_add_ps(acc[m][r]);
        return;
    }
    /* out[i] = the sum of acc[i / R][i % R], 16 at a time (out has room for 32) */
#pragma GCC unroll 2
    for (int i0 = 0; i0 < MB * R; i0 += 16) {
        __m512 v[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            v[i] = i0 + i < MB * R ? acc[(i0 + i) / R][(i0 + i) % R] : _mm512_setzero_ps();
        __m512 s = hsum16(v);
        const int n = MB * R - i0 < 16 ? MB * R - i0 : 16;
        _mm512_mask_storeu_ps(out + i0, (__mmask16)((1u << n) - 1), s);
    }
}

/* M = 1 (decode): weight rows one after another, each read once from start
 * to end, so the weights are a single forward stream (rows are contiguous in
 * the stored matrix) that the hardware prefetcher follows at full speed; two
 * accumulators per row, one horizontal sum per row.  BF16 rows get no
 * line-by-line software prefetch (it only lowered the rate), only the
 * page-ahead line; FP8 rows, which do more work per byte, also prefetch
 * F8_PF_BYTES along the stream into L2.
 *
 * BF16 at MB = 2 or 3 activation rows (most MoE experts of a batched decode:
 * 32 tokens × top-6 over 64 experts is ~3 rows each) streams the same way,
 * each row feeding MB sums, with a prefetch into L2 MR_PF_BYTES ahead;
 * from M = 4 the tiles are as fast, so they take over.
 *
 * The tiles (BF16 from M = 4, FP8 from M = 2) do more arithmetic per weight
 * byte and prefetch the next tile.
 *
 * F8_GEMV_SUMS: an FP8 row at M = 1 takes 128 codes a step into four sums,
 * not 64 into two: with two, every step waited for the previous step's
 * vdpbf16ps (its latency, ~6 cycles per 64 bytes, held an L2-hot FP8 GEMV
 * at half the BF16 GEMV's bytes per second).  (Why these choices, measured:
 * bench/RESULTS.md, "Why the code is so".) */
AI void gemv_row(const int isf8, const int MB, const f8lut *L, const uint16_t *xb, int64_t ldxb,
                 const char *p, int64_t K, float *y, int64_t ldy, int accumulate)
{
    const int64_t Kf = K & ~(int64_t)63;
    _mm_prefetch(p + PAGE_PF_BYTES, _MM_HINT_T0);
    __m512 a[3][2];
#pragma GCC unroll 3
    for (int m = 0; m < MB; m++) a[m][0] = a[m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    __m512i wa, wb;
    if (isf8 && MB == 1) { /* 128 codes a step into two more sums (F8_GEMV_SUMS) */
        __m512 c0 = _mm512_setzero_ps(), c1 = c0;
        for (; k + 128 <= Kf; k += 128) {
            __m512i wc, wd;
            _mm_prefetch(p + k + F8_PF_BYTES, _MM_HINT_T1);
            _mm_prefetch(p + k + 64 + F8_PF_BYTES, _MM_HINT_T1);
            f8_lanes(isf8, L, _mm512_loadu_si512(p + k), &wa, &wb);
            f8_lanes(isf8, L, _mm512_loadu_si512(p + k + 64), &wc, &wd);
            a[0][0] = dp(a[0][0], _mm512_loadu_si512(xb + k), wa);
            a[0][1] = dp(a[0][1], _mm512_loadu_si512(xb + k + 32), wb);
            c0 = dp(c0, _mm512_loadu_si512(xb + k + 64), wc);
            c1 = dp(c1, _mm512_loadu_si512(xb + k + 96), wd);
        }
        a[0][0] = _mm512_add_ps(a[0][0], c0);
        a[0][1] = _mm512_add_ps(a[0][1], c1);
    }
    for (; k < Kf; k += 64) {
        if (isf8) {
            _mm_prefetch(p + k + F8_PF_BYTES, _MM_HINT_T1);
            f8_lanes(isf8, L, _mm512_loadu_si512(p + k), &wa, &wb);
        } else {
            if (MB > 1) { /* into L2, as the tiles' (MR_PF_BYTES) */
                _mm_prefetch(p + 2 * k + MR_PF_BYTES, _MM_HINT_T1);
                _mm_prefetch(p + 2 * k + 64 + MR_PF_BYTES, _MM_HINT_T1);
            }
            wa = _mm512_loadu_si512(p + 2 * k);
            wb = _mm512_loadu_si512(p + 2 * k + 64);
            if (MB > 1) __asm__("" : "+v"(wa), "+v"(wb)); /* else gcc reloads them per row */
        }
#pragma GCC unroll 3
        for (int m = 0; m < MB; m++) {
            a[m][0] = dp(a[m][0], _mm512_loadu_si512(xb + m * ldxb + k), wa);
            a[m][1] = dp(a[m][1], _mm512_loadu_si512(xb + m * ldxb + k + 32), wb);
        }
    }
    if (k < K) { /* tail: masked weight loads; the activations are zero padded */
        int64_t rem = K - k;
        if (isf8) {
            f8_to_bf16_lanes(L, _mm512_maskz_loadu_epi8(((__mmask64)1 << rem) - 1, p + k), &wa,
                             &wb);
        } else {
            __mmask32 m0 = rem >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << rem) - 1);
            __mmask32 m1 = rem <= 32 ? 0 : (((__mmask32)1 << (rem - 32)) - 1);
            wa = _mm512_maskz_loadu_epi16(m0, p + 2 * k);
            wb = _mm512_maskz_loadu_epi16(m1, p + 2 * k + 64);
        }
#pragma GCC unroll 3
        for (int m = 0; m < MB; m++) {
            a[m][0] = dp(a[m][0], _mm512_loadu_si512(xb + m * ldxb + k), wa);
            a[m][1] = dp(a[m][1], _mm512_loadu_si512(xb + m * ldxb + k + 32), wb);
        }
    }
#pragma GCC unroll 3
    for (int m = 0; m < MB; m++) {
        float sum = _mm512_reduce_add_ps(_mm512_add_ps(a[m][0], a[m][1]));
        y[m * ldy] = accumulate ? y[m * ldy] + sum : sum;
    }
}

/* Rows [0, nr) of the GEMV; FP8 rows marked in plain[] (when given) take the
 * conversion without tables (isf8 = 1 only). */
AI void gemv_rows(const int isf8, const int MB, const f8lut *L, const uint16_t *xb, int64_t ldxb,
                  const char *w, int64_t ldw, int64_t K, int64_t nr, const uint8_t *plain, float *y,
                  int64_t ldy, int accumulate)
{
    for (int64_t n = 0; n < nr; n++) {
        if (isf8 && plain && plain[n] == MS_F8_ROW_PLAIN)
            gemv_row(2, MB, L, xb, ldxb, w + n * ldw, K, y + n, ldy, accumulate);
        else
            gemv_row(isf8, MB, L, xb, ldxb, w + n * ldw, K, y + n, ldy, accumulate);
    }
}

/* Rounds rows x[mc][ldx] (times an FP8 block scale when srow: column k takes
 * srow[((c0 + k) / 128) · sld]) to bf16 into xb[mc][Kp], zero padding
 * columns K..Kp, in one pass.  x·Wᵀ passes the row block's scales (sld 1,
 * c0 the view's column origin); x·W one column block's scales down the row
 * blocks (sld the scale row length, c0 the view's row origin).  perm: each group of 64 in the order
 * f8_to_bf16_lanes produces weights ({0-7, 16-23, 32-39, 48-55}, then
 * {8-15, 24-31, 40-47, 56-63}).  f: the scales times f (256 where the
 * weights convert to code × 2^-8; a power of two, so bf16(x·s·f) =
 * bf16(x·s)·f).  FP8 GEMVs redo this for every 128-row block; a per-column
 * scale array and a second pass for the order took ~15 % of an L2-hot FP8
 * GEMV. */
static void prep(const float *x, int64_t ldx, int64_t mc, int64_t K, int64_t Kp, const float *srow,
                 int64_t c0, int64_t sld, float f, int perm, uint16_t *xb)
{
    uint16_t ia[32], ib[32];
    for (int j = 0; j < 32; j++) {
        ia[j] = (uint16_t)((j / 8) * 16 + j % 8);
        ib[j] = (uint16_t)(ia[j] + 8);
    }
    const __m512i pa = _mm512_loadu_si512(ia), pb = _mm512_loadu_si512(ib);
    for (int64_t m = 0; m < mc; m++) {
        const float *xr = x + m * ldx;
        uint16_t *o = xb + m * Kp;
        for (int64_t k = 0; k < Kp; k += 64) {
            __m512 v[4];
            for (int q = 0; q < 4; q++) {
                _mm_prefetch((const char *)(xr + k + 16 * q + PREP_PF_FLOATS), _MM_HINT_T0);
                v[q] = mm_x16(xr, k + 16 * q, K, srow, c0, sld, f);
            }
            __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]);
            __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(v[3], v[2]);
            if (perm) {
                _mm512_storeu_si512(o + k, _mm512_permutex2var_epi16(lo, pa, hi));
                _mm512_storeu_si512(o + k + 32, _mm512_permutex2var_epi16(lo, pb, hi));
            } else {
                _mm512_storeu_si512(o + k, lo);
                _mm512_storeu_si512(o + k + 32, hi);
            }
        }
    }
}

/* What MM_SCR_X holds on this thread: prep's arguments and the pool run.
 * Within one run the inputs do not change, so the slices of a product that
 * one thread computes (and products sharing their input, such as an
 * expert's gate and up) prepare the activations once: re-preparing them for
 * every claim took 7 % of a batch-32 decode step. */
static _Thread_local struct prep_key {
    const float *x;
    const uint16_t *xb;
    const float *srow;
    int64_t ldx, mc, K, c0;
    uint64_t run;
    float f;
    int perm;
} prepped;

static void prep_once(const mm_task *t, int64_t m0, int64_t mc, int64_t K, int64_t Kp,
                      const float *srow, float f, int perm, uint16_t *xb)
{
    const struct prep_key *p = &prepped;
    const float *x = t->x + m0 * t->ldx;
    int64_t c0 = srow ? t->W->c0 : 0; /* c0 matters only through the scales */
    if (t->run && p->run == t->run && p->x == x && p->xb == xb && p->srow == srow &&
        p->ldx == t->ldx && p->mc == mc && p->K == K && p->c0 == c0 && p->f == f && p->perm == perm)
        return;
    prep(x, t->ldx, mc, K, Kp, srow, t->W->c0, 1, f, perm, xb);
    prepped = (struct prep_key){x, xb, srow, t->ldx, mc, K, c0, t->run, f, perm};
}

static void store(const mm_task *t, int64_t m0, int MB, int64_t n0, int R, const float *s, int add)
{
    for (int m = 0; m < MB; m++) {
        float *yo = t->y + (m0 + m) * t->ldy + n0;
        if (add)
            for (int r = 0; r < R; r++) yo[r] += s[m * R + r];
        else
            for (int r = 0; r < R; r++) yo[r] = s[m * R + r];
    }
}

/* Dispatches a tile shape to its instantiation (the valid shapes are those
 * block() asks for). */
AI void run_tile(const int isf8, int MB, int R, const f8lut *L, const uint16_t *xb, int64_t ldxb,
                 const char *w0, int64_t ldw, int64_t K, float *s, int pf1)
{
#define T(mb, r)                                                                                   \
    if (MB == (mb) && R == (r)) {                                                                  \
        tile(isf8, mb, r, L, xb, ldxb, w0, ldw, K, s, pf1);                                        \
        return;                                                                                    \
    }
    T(1, 8)
    T(2, 8)
    T(1, 6) T(2, 6) T(3, 6) T(4, 6) T(1, 4) T(2, 4) T(3, 4) T(4, 4) T(1, 1) T(2, 1) T(3, 1) T(4, 1)
#undef T
}

/* Weight rows [n0, n1) (row n0 at w, rows ldw bytes apart) × prepared
 * activation rows [m0, m0 + mc), K columns from w and xb; add: add the sums
 * to y instead of storing them.  FP8: a tile whose rows are all marked in
 * plain[] (rows from n0, when given) converts them without the tables. */
AI void block(const int isf8, const mm_task *t, const f8lut *L, const uint16_t *xb, int64_t Kp,
              int64_t m0, int64_t mc, int64_t n0, int64_t n1, const char *w, int64_t ldw, int64_t K,
              const uint8_t *plain, int add)
{
    /* rows per tile: as many as the registers hold (MB·R sums, MB activation
     * vectors; FP8 also holds two widened vectors and the tables) */
    const int Rfull = mc == 1 ? 8 : isf8 ? (mc <= 3 ? 6 : 4) : (mc <= 2 ? 8 : 6);
    const int pf1 = mc <= TILE_PF_L2_MAX_M; /* the next tile into L2, not L1 */
    float s[32];
    for (int64_t n = n0; n < n1;) {
        int R = n1 - n >= Rfull ? Rfull : n1 - n >= 4 ? 4 : 1;
        const char *w0 = w + (n - n0) * ldw;
        int pl = isf8 && plain;
        for (int r = 0; r < R; r++) {
            _mm_prefetch(w0 + r * ldw + PAGE_PF_BYTES, _MM_HINT_T0);
            pl = pl && plain[n - n0 + r] == MS_F8_ROW_PLAIN;
        }
        for (int64_t m = 0; m < mc; m += 4) {
            int mb = mc - m >= 4 ? 4 : (int)(mc - m);
            if (pl)
                run_tile(2, mb, R, L, xb + m * Kp, Kp, w0, ldw, K, s, pf1);
            else
                run_tile(isf8, mb, R, L, xb + m * Kp, Kp, w0, ldw, K, s, pf1);
            store(t, m0 + m, mb, n, R, s, add);
        }
        n += R;
    }
}

/* gemv_rows for the row counts it takes: FP8 1, BF16 1 to 3. */
static void rows(int isf8, int MB, const f8lut *L, const uint16_t *xb, int64_t ldxb, const char *w,
                 int64_t ldw, int64_t K, int64_t nr, const uint8_t *plain, float *y, int64_t ldy,
                 int accumulate)
{
    if (isf8)
        gemv_rows(1, 1, L, xb, ldxb, w, ldw, K, nr, plain, y, ldy, accumulate);
    else if (MB == 1)
        gemv_rows(0, 1, L, xb, ldxb, w, ldw, K, nr, NULL, y, ldy, accumulate);
    else if (MB == 2)
        gemv_rows(0, 2, L, xb, ldxb, w, ldw, K, nr, NULL, y, ldy, accumulate);
    else
        gemv_rows(0, 3, L, xb, ldxb, w, ldw, K, nr, NULL, y, ldy, accumulate);
}

/* Columns [n0, n1) of y for all M rows.  FP8 weights at M >= F8_WIDEN_M are first
 * converted to bf16 one 128-row block at a time (into scratch), so the
 * conversion is not repeated for every group of activation rows.  Below
 * that the GEMV and the tiles convert them to bf16(code × 2^-8) as they go
 * (plain rows without the tables), against activations times 256. */
static int nt_rows(const int isf8, const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols, Kp = (K + 63) & ~(int64_t)63, M = t->M;
    const int64_t mcmax = M < MC ? M : MC;
    /* batch-invariant (t->binv): the tiles for every M, FP8 never widened (its
     * activations are permuted, so its sums are taken in another lane order) */
    const int widen = isf8 && M >= F8_WIDEN_M && !t->binv;
    uint16_t *xb = ms_mm_scratch(MM_SCR_X, (size_t)(mcmax * Kp) * 2); /* [mcmax][Kp] bf16 */
    uint16_t *wb = widen ? ms_mm_scratch(MM_SCR_W, (size_t)(128 * Kp) * 2) : NULL; /* [128][Kp] */
    if (!xb || (widen && !wb)) return -1;
    const int64_t ldw = W->ld * (isf8 ? 1 : 2);
    f8lut L;
    f8lut_init(&L, isf8 && !widen);
    const float f = isf8 && !widen ? 256.0f : 1.0f; /* the activations' factor */
    for (int64_t n = n0; n < n1;) {
        int64_t ne;
        const float *srow = NULL; /* the block's column-block scales */
        if (isf8) {               /* one 128-row scale block of the stored matrix */
            int64_t rb = (W->r0 + n) / 128;
            ne = (rb + 1) * 128 - W->r0;
            if (ne > n1) ne = n1;
            srow = W->scale + rb * W->scale_ld;
        } else {
            ne = M <= MC ? n1 : (n + 128 < n1 ? n + 128 : n1);
        }
        const char *w = (const char *)W->data + n * ldw;
        const uint8_t *plain = /* rows [n, ne) */
            isf8 && !widen && W->f8_plain ? W->f8_plain + (W->r0 + n - W->f8_plain_r0) : NULL;
        if (widen)
            for (int64_t r = n; r < ne; r++)
                ms_mm_bf16_cvt_fp8((const uint8_t *)w + (r - n) * ldw, wb + (r - n) * Kp, K);
        for (int64_t m0 = 0; m0 < M; m0 += MC) {
            int64_t mc = M - m0 < MC ? M - m0 : MC;
            prep_once(t, m0, mc, K, Kp, isf8 ? srow : NULL, f, isf8 && !widen, xb);
            if (!widen && !t->binv && mc <= (isf8 ? 1 : 3)) {
                rows(isf8, (int)mc, &L, xb, Kp, w, ldw, K, ne - n, plain, t->y + m0 * t->ldy + n,
                     t->ldy, t->accumulate);
                continue;
            }
            for (int64_t k0 = 0; k0 < K; k0 += KC) { /* KC columns at a time, sums added */
                int64_t kc = K - k0 < KC ? K - k0 : KC;
                int add = k0 > 0 || t->accumulate;
                if (widen)
                    block(0, t, &L, xb + k0, Kp, m0, mc, n, ne, (const char *)(wb + k0), Kp * 2, kc,
                          NULL, add);
                else if (isf8)
                    block(1, t, &L, xb + k0, Kp, m0, mc, n, ne, w + k0, ldw, kc, plain, add);
                else
                    block(0, t, &L, xb + k0, Kp, m0, mc, n, ne, w + 2 * k0, ldw, kc, NULL, add);
            }
        }
        n = ne;
    }
    return 0;
}

int ms_mm_bf16_nt(const mm_task *t, int64_t n0, int64_t n1)
{
    if (t->W->dtype == MS_DT_F8E4M3) return nt_rows(1, t, n0, n1);
    return nt_rows(0, t, n0, n1);
}

/* ---- y = x·W (nn) for FP8 weights: W is [K = rows][N = cols] ----
 * Used by MLA's absorption (q_nope · W_UK: K = 64 rows of 256 columns per
 * head).  Two weight rows, widened to bf16, are interleaved word by word, so
 * each vdpbf16ps adds x[k]·W[k][c] + x[k+1]·W[k+1][c] for 16 columns; the
 * activation pair (x[k]·s, x[k+1]·s rounded to bf16, s the block scale of
 * that row and of the columns) is broadcast.  64 columns per group, up to 4
 * activation rows; the accumulators hold the columns in the order the
 * unpacks leave them and are put back in order once at the end.  Each output
 * takes its products in k order whatever the split.  The exact FP32 kernel
 * widens FP8 one 16-weight vector at a time (~9 operations per vector), so
 * FP8 W_UK is faster here; BF16 weights stay on the FP32 kernel, whose
 * widening is a shift (measured: bench/RESULTS.md, "Why the code is so"). */

/* The four accumulators of a 64-column group back in column order: after
 * the word unpacks accumulator q holds, per 128-bit lane l, columns
 * 16l + 4q + {0..3} (f8_to_bf16_lanes order). */
AI void nn_unpermute(const __m512 *acc, __m512 *out)
{
    const __m512i ia = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i ib =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i ja = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i jb =
        _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    __m512 t0 = _mm512_permutex2var_ps(acc[0], ia, acc[1]); /* lanes 0, 1 of acc 0 and 1 */
    __m512 t1 = _mm512_permutex2var_ps(acc[0], ib, acc[1]); /* lanes 2, 3 */
    __m512 t2 = _mm512_permutex2var_ps(acc[2], ia, acc[3]);
    __m512 t3 = _mm512_permutex2var_ps(acc[2], ib, acc[3]);
    out[0] = _mm512_permutex2var_ps(t0, ja, t2), out[1] = _mm512_permutex2var_ps(t0, jb, t2);
    out[2] = _mm512_permutex2var_ps(t1, ja, t3), out[3] = _mm512_permutex2var_ps(t1, jb, t3);
}

AI void nn_load(const int full, const f8lut *L, const char *p, int64_t rem, __m512i *a, __m512i *b)
{
    __mmask64 mk = full || rem >= 64 ? ~(__mmask64)0
                   : rem <= 0        ? 0 /* a group past the last column: reads nothing */
                                     : (((__mmask64)1 << rem) - 1);
    f8_to_bf16_lanes(L, full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(mk, p), a, b);
}

/* Columns [n, n + 64·CW) (rem of them valid) for activation rows
 * [m0, m0 + MB); the bf16 activation pairs of row m0 + m for scale block
 * cb0 + b are xp[(b·4 + m)·Kp/2 ...].  With one activation row a pass covers
 * 256 columns, whole rows of W_UK, so W is read in order. */
AI void nn_chunk(const int full, const int MB, const int CW, const mm_task *t, const f8lut *L,
                 const uint32_t *xp, int64_t Kp, int64_t cb0, int64_t m0, int64_t n, int64_t rem)
{
    const ms_mat *W = t->W;
    const int64_t K = W->rows, ldw = W->ld, npair = (K + 1) / 2;
    const char *w = (const char *)W->data + n;
    const uint32_t *xg[4][4];
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int g = 0; g < CW; g++)
            xg[m][g] = xp + (((W->c0 + n + 64 * g) / 128 - cb0) * 4 + m) * (Kp / 2);
    __m512 acc[4][16];
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 16
        for (int q = 0; q < 4 * CW; q++) acc[m][q] = _mm512_setzero_ps();
    for (int64_t pr = 0; pr < npair; pr++) {
        const char *r0 = w + 2 * pr * ldw;
        const int odd = 2 * pr + 1 < K;
#pragma GCC unroll 4
        for (int g = 0; g < CW; g++) {
            __m512i a0, b0, a1 = _mm512_setzero_si512(), b1 = a1;
            nn_load(full, L, r0 + 64 * g, rem - 64 * g, &a0, &b0);
            if (odd) nn_load(full, L, r0 + ldw + 64 * g, rem - 64 * g, &a1, &b1);
            __m512i v[4] = {_mm512_unpacklo_epi16(a0, a1), _mm512_unpackhi_epi16(a0, a1),
                            _mm512_unpacklo_epi16(b0, b1), _mm512_unpackhi_epi16(b0, b1)};
#pragma GCC unroll 4
            for (int m = 0; m < MB; m++) {
                __m512i xv = _mm512_set1_epi32((int)xg[m][g][pr]);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) acc[m][4 * g + q] = dp(acc[m][4 * g + q], xv, v[q]);
            }
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int g = 0; g < CW; g++) {
            __m512 o[4];
            nn_unpermute(&acc[m][4 * g], o);
            mm_store64(t, t->y + (m0 + m) * t->ldy + n + 64 * g, o, rem - 64 * g);
        }
}

int ms_mm_bf16_nn(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int64_t K = W->rows, Kp = (K + 63) & ~(int64_t)63;
    if (W->dtype != MS_DT_F8E4M3 || W->c0 % 64) return -1; /* groups must not straddle blocks */
    if (n1 <= n0) return 0;
    const int64_t cb0 = (W->c0 + n0) / 128, nblk = (W->c0 + n1 - 1) / 128 - cb0 + 1;
    /* [nblk][4][Kp] bf16: x·s of up to four rows for each column block */
    uint16_t *xb = ms_mm_scratch(MM_SCR_W, sizeof(uint16_t) * (size_t)(4 * nblk * Kp));
    if (!xb) return -1;
    f8lut L;
    f8lut_init(&L, 0);
    for (int64_t m0 = 0; m0 < t->M; m0 += 4) {
        const int mb = t->M - m0 < 4 ? (int)(t->M - m0) : 4;
        for (int64_t b = 0; b < nblk; b++) /* consecutive bf16 values are the k pairs */
            prep(t->x + m0 * t->ldx, t->ldx, mb, K, Kp, W->scale + cb0 + b, W->r0, W->scale_ld, 1,
                 0, xb + b * 4 * Kp);
        const uint32_t *xp = (const uint32_t *)xb;
#define C(full, mb_, cw_, n, rem) nn_chunk(full, mb_, cw_, t, &L, xp, Kp, cb0, m0, n, rem)
        MM_NN_COLUMNS(C, mb, n0, n1)
#undef C
    }
    return 0;
}

/* ---- bulk conversions (ms_cvt_*) ---- */

void ms_mm_bf16_cvt_fp8(const uint8_t *in, uint16_t *out, int64_t n)
{
    f8lut L;
    f8lut_init(&L, 0);
    for (int64_t i = 0; i < n; i += 64) {
        int64_t rem = n - i;
        __mmask64 mk = rem >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << rem) - 1);
        __m512i wa, wb;
        f8_to_bf16(&L, _mm512_maskz_loadu_epi8(mk, in + i), &wa, &wb);
        __mmask32 m0 = rem >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << rem) - 1);
        __mmask32 m1 = rem >= 64   ? ~(__mmask32)0
                       : rem <= 32 ? 0
                                   : (((__mmask32)1 << (rem - 32)) - 1);
        _mm512_mask_storeu_epi16(out + i, m0, wa);
        _mm512_mask_storeu_epi16(out + i + 32, m1, wb);
    }
}

void ms_mm_bf16_cvt_f32(const float *in, uint16_t *out, int64_t n)
{
    for (int64_t i = 0; i < n; i += 32) {
        int64_t rem = n - i;
        __mmask16 m0 = rem >= 16 ? 0xffff : (__mmask16)((1u << rem) - 1);
        __mmask16 m1 = rem >= 32 ? 0xffff : rem <= 16 ? 0 : (__mmask16)((1u << (rem - 16)) - 1);
        __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, in + i + 16),
                                                 _mm512_maskz_loadu_ps(m0, in + i));
        __mmask32 mw = (__mmask32)m0 | ((__mmask32)m1 << 16);
        _mm512_mask_storeu_epi16(out + i, mw, v);
    }
}
