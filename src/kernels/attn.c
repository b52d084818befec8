/* attn.c — paged MLA decode attention (attn.h). */
#include "kernels/attn.h"
#include "kernels/attn_block_f32.h"
#include "kernels/avx2_inl.h"
#include "kernels/mm_internal.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Row s of the sequence as f32 (converted into buf when the cache is BF16). */
static const float *row_f32(const ms_attn_seq *a, int64_t s, float *buf, int isa)
{
    const char *p = (const char *)a->pages[s / a->page_size] +
                    (size_t)(s % a->page_size) * (size_t)a->row * (size_t)ms_dtype_size(a->dtype);
    if (a->dtype == MS_DT_F32) return (const float *)p;
    ms_cvt_to_f32(isa, a->dtype, p, buf, a->row);
    return buf;
}

enum { WAVE_MAX = 64 }; /* long sequences per pool run */

#define AI2 static inline __attribute__((always_inline))

/* One pool run: items [0, n_short) are (sequence, head block of hb) of the
 * sequences of at most MS_ATTN_CHUNK rows (or off the BF16 path), the rest
 * (block of block_rows(S) rows, head block of hbl) of this wave's long
 * sequences: long_seq[w]'s blocks take partial slots long_c0[w] ..
 * long_c0[w + 1] - 1. */
struct job {
    const ms_kctx *k;
    const ms_attn_seq *seqs;
    const float *q;
    int64_t H, vdim, hb, S_max; /* hb: heads per short item */
    int n_items, items_per_seq, n_short, bf;
    int lf; /* long sequences in FP32 blocks (ms_attn_block_f32) where bf is 0 */
    float scale;
    float *ctx, *scratch;
    int64_t fl;   /* scratch floats per thread */
    float *parts; /* [slots][H * vdim + 2 * H]: contexts, maxima, sums */
    int64_t hbl;  /* heads per long item */
    int per_long, n_long;
    int long_seq[WAVE_MAX], long_c0[WAVE_MAX + 1];
    _Atomic int next; /* first unclaimed item */
};

/* Heads [h0, h1) of one sequence: each cached row is read (and converted)
 * once for all of them. */
static void attend(const struct job *j, const ms_attn_seq *a, const float *q, float *ctx,
                   int64_t h0, int64_t h1, float *scores, float *buf)
{
    int64_t S = a->S, vdim = j->vdim;
    int isa = j->k ? j->k->isa : MS_ISA_SCALAR;
    for (int64_t s = 0; s < S; s++) {
        const float *r = row_f32(a, s, buf, isa);
        for (int64_t h = h0; h < h1; h++)
            scores[(h - h0) * S + s] = j->scale * ms_dot_f32(q + h * a->row, r, a->row);
    }
    for (int64_t h = h0; h < h1; h++) {
        ms_softmax(scores + (h - h0) * S, S);
        memset(ctx + h * vdim, 0, sizeof(float) * (size_t)vdim);
    }
    for (int64_t s = 0; s < S; s++) {
        const float *r = row_f32(a, s, buf, isa);
        for (int64_t h = h0; h < h1; h++)
            ms_axpy_f32(ctx + h * vdim, scores[(h - h0) * S + s], r, vdim);
    }
}

/* AVX-512 form of attend (same math, FP32): each cached row is loaded (and
 * widened from BF16 in registers) once for a group of up to 8 heads.  Scores
 * take two rows per step (each query vector loaded once for both); the
 * context is built 32 columns at a time with the heads' sums kept in
 * registers over all rows, so ctx is written once.  The group size is a
 * compile-time constant (group() is instantiated for 1..8): with a runtime
 * count gcc kept the sums on the stack (perf: every FMA's result stored).
 * Row addresses are computed once per call (rp, S entries). */
#define A512  __attribute__((target("avx512f,avx512bw,avx512vl")))
#define AI512 static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl")))

AI512 __m512 load_row16(const char *p, int bf, __mmask16 mk)
{
    return bf ? _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, p)), 16))
              : _mm512_maskz_loadu_ps(mk, p);
}

enum { PF_ROWS = 6 }; /* scores: rows prefetched this far ahead */

AI512 __mmask16 tail_mask(int64_t left)
{
    return left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
}

/* Row addresses of rows [s0, s0 + n) of a sequence into rp[0..n), es bytes
 * per value: no division per row. */
static void row_addrs_at(const ms_attn_seq *a, int es, int64_t s0, int64_t n, const char **rp)
{
    for (int64_t s = 0, p = s0 / a->page_size, o = s0 % a->page_size; s < n; s++) {
        rp[s] = (const char *)a->pages[p] + o * a->row * es;
        if (++o == a->page_size) o = 0, p++;
    }
}

static void row_addrs(const ms_attn_seq *a, int es, const char **rp)
{
    row_addrs_at(a, es, 0, a->S, rp);
}

/* Rows s + PF_ROWS and s + PF_ROWS + 1 (`bytes` each) towards L1: the cache
 * is cold after the weights. */
AI512 void prefetch_rows(const char *const *rp, int64_t s, int64_t S, int64_t bytes)
{
    if (s + PF_ROWS + 1 < S)
        for (int64_t c = 0; c < bytes; c += 64) {
            _mm_prefetch(rp[s + PF_ROWS] + c, _MM_HINT_T0);
            _mm_prefetch(rp[s + PF_ROWS + 1] + c, _MM_HINT_T0);
        }
}

/* Scores of rows s and s + 1 (or s alone when a1 is NULL) for NG heads. */
AI512 void store_scores(const int NG, const __m512 *a0, const __m512 *a1, float scale, float *sc,
                        int64_t S, int64_t s)
{
#pragma GCC unroll 8
    for (int h = 0; h < NG; h++) {
        sc[h * S + s] = scale * _mm512_reduce_add_ps(a0[h]);
        if (a1) sc[h * S + s + 1] = scale * _mm512_reduce_add_ps(a1[h]);
    }
}

/* Heads q[0..NG) (rows R floats apart) over rows rp[0..S): scores sc[NG][S]
 * (softmaxed), then ctx[NG][V] (rows V apart). */
AI512 void group(const int NG, const char *const *rp, int64_t S, int64_t R, int64_t V, int bf,
                 float scale, const float *q, float *sc, float *ctx)
{
    const int es = bf ? 2 : 4;
    int64_t s = 0;
    for (; s + 2 <= S; s += 2) {
        __m512 a0[8], a1[8];
#pragma GCC unroll 8
        for (int h = 0; h < NG; h++) a0[h] = a1[h] = _mm512_setzero_ps();
        prefetch_rows(rp, s, S, R * es);
        for (int64_t c = 0; c < R; c += 16) {
            __mmask16 mk = tail_mask(R - c);
            __m512 r0 = load_row16(rp[s] + c * es, bf, mk),
                   r1 = load_row16(rp[s + 1] + c * es, bf, mk);
#pragma GCC unroll 8
            for (int h = 0; h < NG; h++) {
                __m512 qv = _mm512_maskz_loadu_ps(mk, q + h * R + c);
                a0[h] = _mm512_fmadd_ps(qv, r0, a0[h]);
                a1[h] = _mm512_fmadd_ps(qv, r1, a1[h]);
            }
        }
        store_scores(NG, a0, a1, scale, sc, S, s);
    }
    if (s < S) {
        __m512 a0[8];
        for (int h = 0; h < NG; h++) a0[h] = _mm512_setzero_ps();
        for (int64_t c = 0; c < R; c += 16) {
            __mmask16 mk = tail_mask(R - c);
            __m512 r0 = load_row16(rp[s] + c * es, bf, mk);
#pragma GCC unroll 8
            for (int h = 0; h < NG; h++)
                a0[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q + h * R + c), r0, a0[h]);
        }
        store_scores(NG, a0, NULL, scale, sc, S, s);
    }
    for (int h = 0; h < NG; h++) ms_softmax(sc + h * S, S);
    for (int64_t c = 0; c < V; c += 32) {
        __mmask16 m0 = tail_mask(V - c), m1 = tail_mask(V - c - 16 > 0 ? V - c - 16 : 0);
        __m512 a0[8], a1[8];
#pragma GCC unroll 8
        for (int h = 0; h < NG; h++) a0[h] = a1[h] = _mm512_setzero_ps();
        for (int64_t t = 0; t < S; t++) {
            __m512 r0 = load_row16(rp[t] + c * es, bf, m0),
                   r1 = load_row16(rp[t] + (c + 16) * es, bf, m1);
#pragma GCC unroll 8
            for (int h = 0; h < NG; h++) {
                __m512 p = _mm512_set1_ps(sc[h * S + t]);
                a0[h] = _mm512_fmadd_ps(p, r0, a0[h]);
                a1[h] = _mm512_fmadd_ps(p, r1, a1[h]);
            }
        }
#pragma GCC unroll 8
        for (int h = 0; h < NG; h++) {
            _mm512_mask_storeu_ps(ctx + h * V + c, m0, a0[h]);
            _mm512_mask_storeu_ps(ctx + h * V + c + 16, m1, a1[h]);
        }
    }
}

A512 static void attend512(const struct job *j, const ms_attn_seq *a, const float *q, float *ctx,
                           int64_t h0, int64_t h1, float *scores, const char **rp)
{
    const int64_t S = a->S, R = a->row, V = j->vdim;
    const int bf = a->dtype == MS_DT_BF16, es = bf ? 2 : 4;
    row_addrs(a, es, rp);
    for (int64_t g0 = h0; g0 < h1; g0 += 8) {
        const float *qg = q + g0 * R;
        float *sg = scores + (g0 - h0) * S, *cg = ctx + g0 * V;
        switch (h1 - g0 < 8 ? h1 - g0 : 8) {
#define G(n)                                                                                       \
    case n:                                                                                        \
        group(n, rp, S, R, V, bf, j->scale, qg, sg, cg);                                           \
        break;
            G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
        }
    }
}

/* AVX2 form of attend (same math, FP32) for BF16 and F32 rows, 8 lanes and
 * 16 registers: scores one row per step for up to 8 heads (the row loaded
 * once for all of them), then the context in blocks of CTX_ROWS rows (so they
 * are re-read from L2, not L3), 16 columns at a time for groups of up to 4
 * heads with the sums in registers over the block.  Column tails (row, vdim
 * not multiples of 8 and 16) in scalar FMA. */
AI2 __m256 load_row8(const char *p, int bf)
{
    return bf ? ms_load_bf16x8(p) : _mm256_loadu_ps((const float *)p);
}

AI2 float row_at(const char *p, int bf, int64_t i)
{
    if (!bf) return ((const float *)p)[i];
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return ms_bf16_to_f32(h);
}

/* Scores of heads q[0..NG) (rows R floats apart) over rows rp[0..S): one
 * row per step, loaded once for all NG heads. */
AI2 void scores2(const int NG, const char *const *rp, int64_t S, int64_t R, int bf, float scale,
                 const float *q, float *sc)
{
    const int es = bf ? 2 : 4;
    const int64_t R8 = R & ~(int64_t)7;
    for (int64_t s = 0; s < S; s++) {
        const char *p0 = rp[s];
        if (s + 8 < S)
            for (int64_t c = 0; c < R * es; c += 64) _mm_prefetch(rp[s + 8] + c, _MM_HINT_T0);
        __m256 a0[8];
#pragma GCC unroll 8
        for (int h = 0; h < NG; h++) a0[h] = _mm256_setzero_ps();
        for (int64_t c = 0; c < R8; c += 8) {
            __m256 r0 = load_row8(p0 + c * es, bf);
#pragma GCC unroll 8
            for (int h = 0; h < NG; h++)
                a0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * R + c), r0, a0[h]);
        }
#pragma GCC unroll 8
        for (int h = 0; h < NG; h++) {
            float d0 = ms_hsum8(a0[h]);
            for (int64_t c = R8; c < R; c++) d0 = fmaf(q[h * R + c], row_at(p0, bf, c), d0);
            sc[h * S + s] = scale * d0;
        }
    }
}

/* ctx[NG][V] (rows V apart; NG <= 4) (=|+=) Σ over rows [t0, t1) of
 * sc[h][t] · row t, 16 columns at a time with the sums in registers. */
AI2 void ctx2(const int NG, const char *const *rp, int64_t t0, int64_t t1, int64_t S, int64_t V,
              int bf, const float *sc, float *ctx, int add)
{
    const int es = bf ? 2 : 4;
    const int64_t V16 = V & ~(int64_t)15;
    for (int64_t c = 0; c < V16; c += 16) {
        __m256 a0[4], a1[4];
#pragma GCC unroll 4
        for (int h = 0; h < NG; h++) {
            a0[h] = add ? _mm256_loadu_ps(ctx + h * V + c) : _mm256_setzero_ps();
            a1[h] = add ? _mm256_loadu_ps(ctx + h * V + c + 8) : _mm256_setzero_ps();
        }
        for (int64_t t = t0; t < t1; t++) {
            __m256 r0 = load_row8(rp[t] + c * es, bf), r1 = load_row8(rp[t] + (c + 8) * es, bf);
#pragma GCC unroll 4
            for (int h = 0; h < NG; h++) {
                __m256 pv = _mm256_broadcast_ss(sc + h * S + t);
                a0[h] = _mm256_fmadd_ps(pv, r0, a0[h]);
                a1[h] = _mm256_fmadd_ps(pv, r1, a1[h]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < NG; h++) {
            _mm256_storeu_ps(ctx + h * V + c, a0[h]);
            _mm256_storeu_ps(ctx + h * V + c + 8, a1[h]);
        }
    }
    for (int h = 0; h < NG; h++)
        for (int64_t c = V16; c < V; c++) {
            float acc = add ? ctx[h * V + c] : 0.0f;
            for (int64_t t = t0; t < t1; t++) acc = fmaf(sc[h * S + t], row_at(rp[t], bf, c), acc);
            ctx[h * V + c] = acc;
        }
}

enum { CTX_ROWS = 128 }; /* rows per pass of the context: 72 KiB of BF16 rows (L2) */

static void attend_avx2(const struct job *j, const ms_attn_seq *a, const float *q, float *ctx,
                        int64_t h0, int64_t h1, float *scores, const char **rp)
{
    const int64_t S = a->S, R = a->row, V = j->vdim;
    const int bf = a->dtype == MS_DT_BF16, es = bf ? 2 : 4;
    row_addrs(a, es, rp);
    for (int64_t g0 = h0; g0 < h1; g0 += 8) {
        const float *qg = q + g0 * R;
        float *sg = scores + (g0 - h0) * S;
        switch (h1 - g0 < 8 ? h1 - g0 : 8) {
        case 1:
            scores2(1, rp, S, R, bf, j->scale, qg, sg);
            break;
        case 2:
            scores2(2, rp, S, R, bf, j->scale, qg, sg);
            break;
        case 3:
            scores2(3, rp, S, R, bf, j->scale, qg, sg);
            break;
        case 4:
            scores2(4, rp, S, R, bf, j->scale, qg, sg);
            break;
        case 5:
            scores2(5, rp, S, R, bf, j->scale, qg, sg);
            break;
        case 6:
            scores2(6, rp, S, R, bf, j->scale, qg, sg);
            break;
        case 7:
            scores2(7, rp, S, R, bf, j->scale, qg, sg);
            break;
        default:
            scores2(8, rp, S, R, bf, j->scale, qg, sg);
            break;
        }
    }
    for (int64_t h = h0; h < h1; h++) ms_softmax(scores + (h - h0) * S, S);
    /* the context over blocks of CTX_ROWS rows, each block's rows re-read
     * from L2 for every 16 columns and group of 4 heads */
    for (int64_t t0 = 0; t0 < S; t0 += CTX_ROWS) {
        const int64_t t1 = t0 + CTX_ROWS < S ? t0 + CTX_ROWS : S;
        for (int64_t g0 = h0; g0 < h1; g0 += 4) {
            const float *sg = scores + (g0 - h0) * S;
            float *cg = ctx + g0 * V;
            const int add = t0 > 0;
            switch (h1 - g0 < 4 ? h1 - g0 : 4) {
            case 1:
                ctx2(1, rp, t0, t1, S, V, bf, sg, cg, add);
                break;
            case 2:
                ctx2(2, rp, t0, t1, S, V, bf, sg, cg, add);
                break;
            case 3:
                ctx2(3, rp, t0, t1, S, V, bf, sg, cg, add);
                break;
            default:
                ctx2(4, rp, t0, t1, S, V, bf, sg, cg, add);
                break;
            }
        }
    }
}

/* ---- BF16 dot products (exact = 0, BF16 cache, row and vdim multiples of 32) ---- */

#define ABF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define AIBF                                                                                       \
    static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512bf16")))

AIBF __m512 dpbf(__m512 acc, __m512i a, __m512i b)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* group() with BF16 dot products: heads qb[0..NG) (bf16, rows ldq apart)
 * over rows rp[0..S): scores sc[NG][S], softmaxed and rounded into pb[NG][ldp]
 * (bf16, zero past S), then ctx[NG][V].  Scores take two rows per step, 32
 * values at a time.  The context interleaves two rows (unpacklo/hi_epi16)
 * so that one vdpbf16ps adds p[t]·r[t] + p[t+1]·r[t+1]; that interleave
 * orders the columns by 128-bit lane ({0-3, 8-11, ...} and {4-7, 12-15, ...}),
 * put back with one two-source permute per 16 columns at the store.  Against
 * the FP32 group() this halves the multiply-adds and drops the widening
 * (measured: bench/RESULTS.md, "Why the code is so"). */
AIBF void group_bf(const int NG, const char *const *rp, int64_t S, int64_t R, int64_t V,
                   float scale, const uint16_t *qb, int64_t ldq, float *sc, uint16_t *pb,
                   int64_t ldp, float *ctx)
{
    int64_t s = 0;
    for (; s + 2 <= S; s += 2) {
        __m512 a0[8], a1[8];
#pragma GCC unroll 8
        for (int h = 0; h < NG; h++) a0[h] = a1[h] = _mm512_setzero_ps();
        prefetch_rows(rp, s, S, 2 * R);
        for (int64_t c = 0; c < R; c += 32) {
            __m512i r0 = _mm512_loadu_si512(rp[s] + 2 * c),
                    r1 = _mm512_loadu_si512(rp[s + 1] + 2 * c);
#pragma GCC unroll 8
            for (int h = 0; h < NG; h++) {
                __m512i qv = _mm512_loadu_si512(qb + h * ldq + c);
                a0[h] = dpbf(a0[h], qv, r0);
                a1[h] = dpbf(a1[h], qv, r1);
            }
        }
        store_scores(NG, a0, a1, scale, sc, S, s);
    }
    if (s < S) {
        __m512 a0[8];
        for (int h = 0; h < NG; h++) a0[h] = _mm512_setzero_ps();
        for (int64_t c = 0; c < R; c += 32) {
            __m512i r0 = _mm512_loadu_si512(rp[s] + 2 * c);
#pragma GCC unroll 8
            for (int h = 0; h < NG; h++)
                a0[h] = dpbf(a0[h], _mm512_loadu_si512(qb + h * ldq + c), r0);
        }
        store_scores(NG, a0, NULL, scale, sc, S, s);
    }
    for (int h = 0; h < NG; h++) { /* probabilities as bf16, pairs (t, t + 1) in one dword */
        ms_softmax(sc + h * S, S);
        for (int64_t t = 0; t < S; t += 32) {
            __m512 lo = _mm512_maskz_loadu_ps(tail_mask(S - t), sc + h * S + t);
            __m512 hi = _mm512_maskz_loadu_ps(tail_mask(S - t - 16 > 0 ? S - t - 16 : 0),
                                              sc + h * S + t + 16);
            _mm512_storeu_si512(pb + h * ldp + t, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t c = 0; c < V; c += 32) {
        __m512 lo[8], hi[8];
#pragma GCC unroll 8
        for (int h = 0; h < NG; h++) lo[h] = hi[h] = _mm512_setzero_ps();
        for (int64_t t = 0; t < S; t += 2) {
            __m512i r0 = _mm512_loadu_si512(rp[t] + 2 * c);
            __m512i r1 = t + 1 < S ? _mm512_loadu_si512(rp[t + 1] + 2 * c) : _mm512_setzero_si512();
            __m512i ul = _mm512_unpacklo_epi16(r0, r1), uh = _mm512_unpackhi_epi16(r0, r1);
#pragma GCC unroll 8
            for (int h = 0; h < NG; h++) {
                int32_t pair;
                memcpy(&pair, pb + h * ldp + t, sizeof pair);
                __m512i pp = _mm512_set1_epi32(pair);
                lo[h] = dpbf(lo[h], pp, ul);
                hi[h] = dpbf(hi[h], pp, uh);
            }
        }
#pragma GCC unroll 8
        for (int h = 0; h < NG; h++) {
            _mm512_storeu_ps(ctx + h * V + c, _mm512_permutex2var_ps(lo[h], i0, hi[h]));
            _mm512_storeu_ps(ctx + h * V + c + 16, _mm512_permutex2var_ps(lo[h], i1, hi[h]));
        }
    }
}

/* Heads [h0, h1) over rows [s0, s0 + S) of a BF16 sequence: contexts into
 * ctx[h] (rows vdim apart), normalised over those rows. */
ABF static void attend_bf(const struct job *j, const ms_attn_seq *a, const float *q, float *ctx,
                          int64_t h0, int64_t h1, int64_t s0, int64_t S, float *scores,
                          uint16_t *qb, uint16_t *pb, int64_t ldp, const char **rp)
{
    const int64_t R = a->row, V = j->vdim, ldq = ms_attn_ldq(R);
    row_addrs_at(a, 2, s0, S, rp);
    for (int64_t h = h0; h < h1; h++) /* the block's queries rounded to bf16 once */
        for (int64_t c = 0; c < R; c += 32)
            _mm512_storeu_si512(qb + (h - h0) * ldq + c,
                                (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + h * R + c + 16),
                                                             _mm512_loadu_ps(q + h * R + c)));
    for (int64_t g0 = h0; g0 < h1; g0 += 8) {
        const uint16_t *qg = qb + (g0 - h0) * ldq;
        float *sg = scores + (g0 - h0) * S, *cg = ctx + g0 * V;
        uint16_t *pg = pb + (g0 - h0) * ldp;
        switch (h1 - g0 < 8 ? h1 - g0 : 8) {
#define G(n)                                                                                       \
    case n:                                                                                        \
        group_bf(n, rp, S, R, V, j->scale, qg, ldq, sg, pg, ldp, cg);                              \
        break;
            G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
        }
    }
}

/* ---- Long blocks (BF16 path, sequences of more than MS_ATTN_CHUNK rows) ----
 * One block of up to MS_ATTN_CHUNK rows for heads [h0, h1) (nh of them,
 * padded with zero queries to Hp = a multiple of 16), each row read from
 * memory once for all heads, arranged for L1 hits and few non-dot
 * instructions (vdpbf16ps runs 2 zmm per cycle per core on Zen 5, 1 on
 * Zen 4, latency ~6 cycles):
 * - scores: 16 rows by 16 heads per step, heads in the lanes of 16
 *   accumulators; each row's value pair is the broadcast operand of one
 *   vdpbf16ps and the queries are transposed once per sequence and head
 *   range (qt[R / 2][Hp]), so no horizontal sums; scores land as sc[s][Hp];
 * - softmax down the rows with heads in lanes; probability pairs
 *   (p[t][h], p[t + 1][h]) as bf16 dwords pd[t / 2][Hp];
 * - context: 32 columns by 8 heads per pass, column chunk outer and head
 *   group inner so that the chunk's 64 bytes of each row are read from L2
 *   once and from L1 for the other groups. */

/* exp(x) for 16 lanes: avx2_inl.h's ms_exp8 (Cody-Waite by ln 2, Cephes degree 6);
 * x < -87.3 (also -inf) gives 0. */
AI512 __m512 exp16(__m512 x)
{
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i ni = _mm512_cvtps_epi32(n), h = _mm512_srai_epi32(ni, 1); /* 2^n as two normals */
    __m512 s1 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(h, _mm512_set1_epi32(127)), 23));
    __m512 s2 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, h), _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_mul_ps(_mm512_mul_ps(y, s1), s2));
}

/* 1 when rows rp[0..16) are one run in memory, rb bytes each. */
static inline int one_run(const char *const *rp, int64_t rb)
{
    int run = 1;
    for (int r = 1; r < 16; r++) run &= rp[r] == rp[0] + r * rb;
    return run;
}

/* Scores of rows rp[0..S) for hp heads: sc[s][hp] = scale · q[h]·row[s],
 * queries qt[R / 2][hp] (dword k of lane h: head h's values 2k, 2k + 1 as
 * bf16).  Rows of a step of 16 that are not one run in memory (pages of
 * fewer than 16 rows, the tail) are copied into tmp[16][R] first.  Inlined
 * with R constant, the 16 rows are displacements of one address; the next
 * step's 16 rows (R / 2 cache lines when they are one run) are prefetched
 * one line per k. */
AIBF void scores_r(const char *const *rp, int64_t S, const int64_t R, float scale,
                   const uint32_t *qt, int64_t hp, uint16_t *tmp, float *sc)
{
    const __m512 vs = _mm512_set1_ps(scale);
    const int64_t rw = R / 2;                /* dwords per row */
    int run = S >= 16 && one_run(rp, 2 * R); /* this step's rows are one run */
    for (int64_t s = 0; s < S; s += 16) {
        const int64_t n = S - s < 16 ? S - s : 16;
        const uint32_t *b = (const uint32_t *)rp[s];
        if (!run) {
            for (int r = 0; r < 16; r++) memcpy(tmp + r * R, rp[s + (r < n ? r : n - 1)], 2 * R);
            b = (const uint32_t *)tmp;
        }
        const char *nx = (const char *)b; /* nothing ahead: re-touch this step's rows */
        run = s + 32 <= S && one_run(rp + s + 16, 2 * R); /* the next step's */
        if (run)
            nx = rp[s + 16];
        else if (s + 32 <= S) /* not one run: its rows now */
            for (int r = 0; r < 16; r++)
                for (int64_t c = 0; c < 2 * R; c += 64)
                    _mm_prefetch(rp[s + 16 + r] + c, _MM_HINT_T0);
        for (int64_t l = 0; l < hp; l += 16) {
            __m512 a[16];
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_ps();
            for (int64_t k = 0; k < rw; k++) {
                _mm_prefetch(nx + 64 * k, _MM_HINT_T0); /* rw lines = 16 rows of 2R bytes */
                __m512i qv = _mm512_loadu_si512(qt + k * hp + l);
#pragma GCC unroll 16
                for (int r = 0; r < 16; r++)
                    a[r] = dpbf(a[r], qv, _mm512_set1_epi32((int)b[r * rw + k]));
            }
            for (int r = 0; r < n; r++)
                _mm512_storeu_ps(sc + (s + r) * hp + l, _mm512_mul_ps(a[r], vs));
        }
    }
}

ABF static void block_scores(const char *const *rp, int64_t S, int64_t R, float scale,
                             const uint32_t *qt, int64_t hp, uint16_t *tmp, float *sc)
{
    if (R == 288) /* small-v3's row */
        scores_r(rp, S, 288, scale, qt, hp, tmp, sc);
    else if (R == 576) /* V2/V3's: kv_lora 512 + rope 64 */
        scores_r(rp, S, 576, scale, qt, hp, tmp, sc);
    else
        scores_r(rp, S, R, scale, qt, hp, tmp, sc);
}

/* Context of ng head groups of 8 over rows rp[0..S) with probability pairs
 * pd[t / 2][hp] (zero for t >= S): heads h < nh into ctx[h][V]. */
AIBF void block_ctx(const char *const *rp, int64_t S, int64_t V, const uint32_t *pd, int ng,
                    int64_t hp, int nh, float *ctx)
{
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t c = 0; c < V; c += 32)
        for (int g = 0; g < ng; g++) {
            const uint32_t *pg = pd + 8 * g;
            __m512 lo[8], hi[8];
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) lo[h] = hi[h] = _mm512_setzero_ps();
            for (int64_t t = 0; t < S; t += 2) {
                __m512i r0 = _mm512_loadu_si512(rp[t] + 2 * c);
                __m512i r1 =
                    t + 1 < S ? _mm512_loadu_si512(rp[t + 1] + 2 * c) : _mm512_setzero_si512();
                __m512i ul = _mm512_unpacklo_epi16(r0, r1), uh = _mm512_unpackhi_epi16(r0, r1);
                const uint32_t *pt = pg + (t / 2) * hp;
#pragma GCC unroll 8
                for (int h = 0; h < 8; h++) {
                    __m512i pp = _mm512_set1_epi32((int)pt[h]);
                    lo[h] = dpbf(lo[h], pp, ul);
                    hi[h] = dpbf(hi[h], pp, uh);
                }
            }
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++)
                if (8 * g + h < nh) {
                    float *o = ctx + (8 * g + h) * V + c;
                    _mm512_storeu_ps(o, _mm512_permutex2var_ps(lo[h], i0, hi[h]));
                    _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(lo[h], i1, hi[h]));
                }
        }
}

/* The queries a thread's long blocks were last scored with (attend_block and
 * ms_attn_block_f32 rebuild their transposed queries only for another
 * sequence or head range).  A thread's long items come after all its short
 * ones in a pool run (one counter hands the items out in order), so nothing
 * else writes the scratch between them. */
struct qt_key {
    const float *q;
    int64_t h0, h1;
};

/* 1 when the transposed queries in the scratch are not those of (q, h0, h1);
 * the key then names them. */
static int qt_stale(struct qt_key *key, const float *q, int64_t h0, int64_t h1)
{
    if (key->q == q && key->h0 == h0 && key->h1 == h1) return 0;
    *key = (struct qt_key){q, h0, h1};
    return 1;
}

/* Heads [h0, h1) over rows [s0, s0 + S) (S <= MS_ATTN_CHUNK) of a BF16
 * sequence: contexts ctx[h][V] normalised over those rows, the heads'
 * largest scores mx[h] and sums of exp(score - max) sm[h].  scratch:
 * ms_attn_block_floats(R, h1 - h0). */
ABF static void attend_block(const struct job *j, const ms_attn_seq *a, const float *q, float *ctx,
                             int64_t h0, int64_t h1, int64_t s0, int64_t S, float *scratch,
                             const char **rp, float *mx, float *sm, struct qt_key *key)
{
    const int64_t R = a->row, V = j->vdim, ldq = ms_attn_ldq(R), nh = h1 - h0;
    const int64_t hp = (nh + 15) & ~(int64_t)15;
    const int ng = (int)((nh + 7) / 8);
    float *sc = scratch;
    uint32_t *pd = (uint32_t *)(sc + hp * MS_ATTN_CHUNK);
    uint32_t *qt = pd + hp * MS_ATTN_CHUNK / 2;      /* [R / 2][hp] */
    uint16_t *tmp = (uint16_t *)(qt + hp * ldq / 2); /* [16][R] */
    row_addrs_at(a, 2, s0, S, rp);
    if (qt_stale(key, q, h0, h1)) { /* queries rounded to bf16, transposed */
        for (int64_t h = 0; h < hp; h++)
            for (int64_t c = 0; c < R; c += 32) {
                uint32_t d[16] = {0};
                if (h < nh) {
                    const float *qh = q + (h0 + h) * R + c;
                    _mm512_storeu_si512(d, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qh + 16),
                                                                        _mm512_loadu_ps(qh)));
                }
                for (int i = 0; i < 16; i++) qt[(c / 2 + i) * hp + h] = d[i];
            }
    }
    block_scores(rp, S, R, j->scale, qt, hp, tmp, sc);
    const __m512i ilv =
        _mm512_setr_epi32(0x00100000, 0x00110001, 0x00120002, 0x00130003, 0x00140004, 0x00150005,
                          0x00160006, 0x00170007, 0x00180008, 0x00190009, 0x001a000a, 0x001b000b,
                          0x001c000c, 0x001d000d, 0x001e000e, 0x001f000f);
    for (int64_t l = 0; l < 8 * ng; l += 16) { /* 16 heads in lanes, down the rows */
        __m512 m = _mm512_set1_ps(-INFINITY), e = _mm512_setzero_ps();
        for (int64_t t = 0; t < S; t++) m = _mm512_max_ps(m, _mm512_loadu_ps(sc + t * hp + l));
        for (int64_t t = 0; t < S; t++) {
            __m512 x = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + t * hp + l), m));
            _mm512_storeu_ps(sc + t * hp + l, x);
            e = _mm512_add_ps(e, x);
        }
        __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), e);
        for (int64_t t = 0; t < S; t += 2) {
            __m512 p0 = _mm512_mul_ps(_mm512_loadu_ps(sc + t * hp + l), inv),
                   p1 = t + 1 < S ? _mm512_mul_ps(_mm512_loadu_ps(sc + (t + 1) * hp + l), inv)
                                  : _mm512_setzero_ps();
            _mm512_storeu_si512(
                pd + (t / 2) * hp + l,
                _mm512_permutexvar_epi16(ilv, (__m512i)_mm512_cvtne2ps_pbh(p1, p0)));
        }
        float mv[16], ev[16];
        _mm512_storeu_ps(mv, m);
        _mm512_storeu_ps(ev, e);
        for (int64_t h = l; h < l + 16 && h < nh; h++)
            mx[h0 + h] = mv[h - l], sm[h0 + h] = ev[h - l];
    }
    block_ctx(rp, S, V, pd, ng, hp, (int)nh, ctx + h0 * V);
}

/* Caches the BF16 path and the FP32 long blocks read: BF16, and FP8 through a
 * bf16 copy (f8_rows). */
static int on_bf(int bf, const ms_attn_seq *a)
{
    return bf && (a->dtype == MS_DT_BF16 || a->dtype == MS_DT_F8E4M3);
}

static int is_long(const struct job *j, const ms_attn_seq *a)
{
    return on_bf(j->bf || j->lf, a) && a->S > MS_ATTN_CHUNK;
}

/* Rows per block of a long sequence of S rows: MS_ATTN_CHUNK, or a quarter
 * of S (a multiple of 16) up to 4 · MS_ATTN_CHUNK rows, so that a sequence
 * a little over one or two blocks still makes blocks of equal size for the
 * threads.  A function of S alone: the result does not depend on the
 * thread count or the batch. */
static int64_t block_rows(int64_t S)
{
    return S > 4 * MS_ATTN_CHUNK ? MS_ATTN_CHUNK : ((S + 3) / 4 + 15) & ~(int64_t)15;
}

/* Rows [s0, s0 + n) (n <= MS_ATTN_CHUNK) of an FP8 sequence as bf16 in cv
 * [n][row] (e4m3 -> bf16 is exact, so the BF16 kernels give the bits they
 * give on a BF16 cache of these values); *v becomes a one-page BF16 view of
 * them, its page *page.  rp: scratch for the source rows' addresses. */
static void f8_rows(int isa, const ms_attn_seq *a, int64_t s0, int64_t n, uint16_t *cv,
                    const char **rp, const void **page, ms_attn_seq *v)
{
    row_addrs_at(a, 1, s0, n, rp);
    for (int64_t t = 0, e; t < n; t = e) { /* one conversion per run of rows in one page */
        for (e = t + 1; e < n && rp[e] == rp[e - 1] + a->row; e++) {
        }
        ms_cvt_fp8_to_bf16(isa, (const uint8_t *)rp[t], cv + t * a->row, (e - t) * a->row);
    }
    *page = cv;
    *v = (ms_attn_seq){page, MS_ATTN_CHUNK, MS_DT_BF16, a->row, n};
}

/* One block of a long sequence: item k of the wave's long items. */
static void long_item(const struct job *j, int k, float *scores, const char **rp, uint16_t *cv,
                      struct qt_key *key)
{
    int g = k / j->per_long, w = 0; /* g: the block's partial slot */
    while (j->long_c0[w + 1] <= g) w++;
    int i = j->long_seq[w];
    const ms_attn_seq *a = &j->seqs[i];
    int64_t br = block_rows(a->S), s0 = (int64_t)(g - j->long_c0[w]) * br,
            n = a->S - s0 < br ? a->S - s0 : br;
    int64_t h0 = (k % j->per_long) * j->hbl, h1 = h0 + j->hbl < j->H ? h0 + j->hbl : j->H;
    float *part = j->parts + (int64_t)g * j->H * (j->vdim + 2), *mx = part + j->H * j->vdim;
    const float *q = j->q + (int64_t)i * j->H * a->row;
    const void *page;
    ms_attn_seq v;
    if (a->dtype == MS_DT_F8E4M3) { /* the block's rows as bf16, attended from row 0 */
        f8_rows(j->k->isa, a, s0, n, cv, rp, &page, &v);
        a = &v, s0 = 0;
    }
    if (j->lf) {
        int fresh = qt_stale(key, q, h0, h1);
        row_addrs_at(a, 2, s0, n, rp);
        ms_attn_block_f32(rp, n, a->row, j->vdim, q + h0 * a->row, h1 - h0, j->scale, fresh, scores,
                          part + h0 * j->vdim, mx + h0, mx + j->H + h0);
        return;
    }
    attend_block(j, a, q, part, h0, h1, s0, n, scores, rp, mx, mx + j->H, key);
}

static void worker(void *arg, int tid, int nt)
{
    struct job *j = arg;
    (void)nt;
    int64_t row = j->seqs[0].row;
    float *buf = j->scratch + (int64_t)tid * j->fl;
    float *scores = buf + row + 16;
    uint16_t *qb = (uint16_t *)(scores + j->hb * j->S_max), *pb = qb + j->hb * ms_attn_ldq(row);
    const char **rp = (const char **)(buf + j->fl - 2 * j->S_max); /* 8-byte aligned: fl is even */
    uint16_t *cv = (uint16_t *)((float *)rp - ms_attn_f8_floats(row)); /* FP8 rows as bf16 */
    int isa = j->k ? j->k->isa : MS_ISA_SCALAR;
    struct qt_key key = {NULL, 0, 0};
    for (;;) {
        int it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (it >= j->n_items) break;
        if (it >= j->n_short) {
            long_item(j, it - j->n_short, scores, rp, cv, &key);
            continue;
        }
        int i = it / j->items_per_seq;
        const ms_attn_seq *a = &j->seqs[i];
        if (is_long(j, a)) continue; /* in its wave's long items */
        int64_t h0 = (it % j->items_per_seq) * j->hb, h1 = h0 + j->hb < j->H ? h0 + j->hb : j->H;
        const float *q = j->q + (int64_t)i * j->H * row;
        float *ctx = j->ctx + (int64_t)i * j->H * j->vdim;
        const void *page;
        ms_attn_seq v;
        /* an FP8 cache's rows as bf16 (exact) for the vector kernels */
        if (a->dtype == MS_DT_F8E4M3 && a->S <= MS_ATTN_CHUNK && isa >= MS_ISA_AVX2)
            f8_rows(isa, a, 0, a->S, cv, rp, &page, &v), a = &v;
        if (on_bf(j->bf, a)) {
            attend_bf(j, a, q, ctx, h0, h1, 0, a->S, scores, qb, pb, ms_attn_ldp(j->S_max), rp);
        } else if (isa >= MS_ISA_AVX512 && (a->dtype == MS_DT_BF16 || a->dtype == MS_DT_F32)) {
            attend512(j, a, q, ctx, h0, h1, scores, rp);
        } else if (isa >= MS_ISA_AVX2 && (a->dtype == MS_DT_BF16 || a->dtype == MS_DT_F32)) {
            attend_avx2(j, a, q, ctx, h0, h1, scores, rp);
        } else {
            attend(j, a, q, ctx, h0, h1, scores, buf);
        }
    }
}

/* Item (long sequence w, head h): the blocks' contexts combined in block
 * order, each weighted by exp(max - the largest max) * its sum. */
static void combine(void *arg, int tid, int nt)
{
    struct job *j = arg;
    (void)tid, (void)nt;
    const int64_t H = j->H, V = j->vdim, sf = H * (V + 2);
    for (;;) {
        int it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (it >= j->n_long * H) break;
        int w = (int)(it / H), g0 = j->long_c0[w], g1 = j->long_c0[w + 1];
        int64_t h = it % H;
        const float *p0 = j->parts + H * V; /* slot 0's maxima; sums H further */
        float M = -INFINITY;
        for (int g = g0; g < g1; g++) M = fmaxf(M, p0[g * sf + h]);
        double W = 0;
        for (int g = g0; g < g1; g++) W += exp((double)p0[g * sf + h] - M) * p0[g * sf + H + h];
        float *out = j->ctx + (int64_t)j->long_seq[w] * H * V + h * V;
        memset(out, 0, sizeof(float) * (size_t)V);
        for (int g = g0; g < g1; g++)
            ms_axpy_f32(out, (float)(exp((double)p0[g * sf + h] - M) * p0[g * sf + H + h] / W),
                        j->parts + g * sf + h * V, V);
    }
}

void ms_attn_decode(const ms_kctx *k, const ms_attn_seq *seqs, int n, const float *q, int64_t H,
                    int64_t vdim, float scale, float *ctx, float *scratch)
{
    if (n <= 0 || H <= 0) return;
    int nt = k ? ms_pool_size(k->pool) : 1;
    int64_t hb = (H + nt - 1) / nt, S_max = 0, row = seqs[0].row;
    for (int i = 0; i < n; i++) S_max = seqs[i].S > S_max ? seqs[i].S : S_max;
    int per = (int)((H + hb - 1) / hb);
    struct job j = {.k = k,
                    .seqs = seqs,
                    .q = q,
                    .H = H,
                    .vdim = vdim,
                    .hb = hb,
                    .S_max = S_max,
                    .items_per_seq = per,
                    .n_short = n * per,
                    .scale = scale,
                    .ctx = ctx,
                    .scratch = scratch};
    j.bf = k && !k->exact && k->isa >= MS_ISA_AVX512BF16 && row % 32 == 0 && vdim % 32 == 0 &&
           vdim <= row;
    /* AVX2 CPUs: long sequences in FP32 blocks (AVX-512 ones without the BF16
     * path keep attend512 per head block) */
    j.lf = !j.bf && k && k->isa >= MS_ISA_AVX2 && k->isa < MS_ISA_AVX512 && vdim % 16 == 0 &&
           vdim <= row;
    j.fl = ms_attn_thread_floats(row, H, hb, S_max);
    j.parts = scratch + nt * j.fl;
    /* slots of H * (vdim + 2) floats in the room sized for H * (row + 2) */
    int64_t slots = ms_attn_part_slots(nt, S_max) * (row + 2) / (vdim + 2);
    int i = 0;
    do { /* waves: the short items and as many long sequences as the slots hold */
        int used = 0;
        j.n_long = 0;
        for (; i < n && j.n_long < WAVE_MAX; i++) {
            if (!is_long(&j, &seqs[i])) continue;
            int64_t br = block_rows(seqs[i].S);
            int c = (int)((seqs[i].S + br - 1) / br);
            if (used + c > slots) break;
            j.long_seq[j.n_long] = i;
            j.long_c0[j.n_long++] = used;
            used += c;
        }
        j.long_c0[j.n_long] = used;
        /* all heads per block when the blocks alone keep the threads busy
         * (each row read once), else parts of whole 16-head lanes (a part
         * of 8 would leave half of each scores vector empty); a head's
         * result is the same either way */
        int64_t h16 = (hb + 15) & ~(int64_t)15;
        j.hbl = used >= 2 * nt || h16 > H ? H : h16;
        j.per_long = (int)((H + j.hbl - 1) / j.hbl);
        j.n_items = j.n_short + used * j.per_long;
        atomic_store_explicit(&j.next, 0, memory_order_relaxed);
        if (nt == 1 || !k)
            worker(&j, 0, 1);
        else
            ms_pool_run_dynamic(k->pool, worker, &j);
        if (j.n_long) {
            atomic_store_explicit(&j.next, 0, memory_order_relaxed);
            if (nt == 1 || !k)
                combine(&j, 0, 1);
            else
                ms_pool_run_dynamic(k->pool, combine, &j);
        }
        j.n_short = 0;
    } while (i < n);
}

void ms_attn_decode_ref(const ms_attn_seq *a, const float *q, int64_t H, int64_t vdim, float scale,
                        float *ctx)
{
    int64_t S = a->S, R = a->row;
    double *p = malloc(sizeof(double) * (size_t)(S > 0 ? S : 1));
    float *rows = malloc(sizeof(float) * (size_t)((S > 0 ? S : 1) * R)); /* [S][R] as f32 */
    if (!p || !rows) abort();
    for (int64_t s = 0; s < S; s++) {
        const float *r = row_f32(a, s, rows + s * R, MS_ISA_SCALAR);
        if (r != rows + s * R) memcpy(rows + s * R, r, sizeof(float) * (size_t)R);
    }
    for (int64_t h = 0; h < H; h++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t s = 0; s < S; s++) {
            double d = 0;
            for (int64_t i = 0; i < R; i++) d += (double)q[h * R + i] * rows[s * R + i];
            p[s] = d * scale;
            mx = p[s] > mx ? p[s] : mx;
        }
        for (int64_t s = 0; s < S; s++) sum += (p[s] = exp(p[s] - mx));
        for (int64_t i = 0; i < vdim; i++) {
            double acc = 0;
            for (int64_t s = 0; s < S; s++) acc += p[s] / sum * rows[s * R + i];
            ctx[h * vdim + i] = (float)acc;
        }
    }
    free(p);
    free(rows);
}
