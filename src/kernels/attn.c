/* attn.c — paged MLA decode attention (attn.h). */
#include "kernels/attn.h"

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

/* One pool run: items [0, n_short) are (sequence, head block of hb) of the
 * sequences of at most MS_ATTN_CHUNK rows (or off the BF16 path), the rest
 * (block of MS_ATTN_CHUNK rows, head block of hbl) of this wave's long
 * sequences: long_seq[w]'s blocks take partial slots long_c0[w] ..
 * long_c0[w + 1] - 1. */
struct job {
    const ms_kctx *k;
    const ms_attn_seq *seqs;
    const float *q;
    int64_t H, vdim, hb, S_max; /* hb: heads per short item */
    int n_items, items_per_seq, n_short, bf;
    float scale;
    float *ctx, *scratch;
    int64_t fl;                  /* scratch floats per thread */
    float *parts;                /* [slots][H * vdim + 2 * H]: contexts, maxima, sums */
    int64_t hbl;                 /* heads per long item */
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

/* ---- BF16 dot products (exact = 0, BF16 cache, row and vdim multiples of 32) ---- */

#define ABF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define AIBF                                                                                       \
    static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512bf16")))

AIBF __m512 dpbf(__m512 acc, __m512i a, __m512i b)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* Largest of x[0..n). */
AI512 float max_f32(const float *x, int64_t n)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16)
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, tail_mask(n - i), x + i));
    return _mm512_reduce_max_ps(m);
}

/* group() with BF16 dot products: heads qb[0..NG) (bf16, rows ldq apart)
 * over rows rp[0..S): scores sc[NG][S], softmaxed and rounded into pb[NG][ldp]
 * (bf16, zero past S), then ctx[NG][V].  With mx (a block of a long
 * sequence) the heads' largest scores go to mx[0..NG) and their sums of
 * exp(score - max) to sm[0..NG): the sum is 1 / the largest probability
 * (exp(0) times 1 / sum in ms_softmax).  Scores take two rows per step, 32
 * values at a time.  The context interleaves two rows (unpacklo/hi_epi16)
 * so that one vdpbf16ps adds p[t]·r[t] + p[t+1]·r[t+1]; that interleave
 * orders the columns by 128-bit lane ({0-3, 8-11, ...} and {4-7, 12-15, ...}),
 * put back with one two-source permute per 16 columns at the store.  Against
 * the FP32 group() this halves the multiply-adds and drops the widening
 * (measured: bench/RESULTS.md, "Why the code is so"). */
AIBF void group_bf(const int NG, const char *const *rp, int64_t S, int64_t R, int64_t V,
                   float scale, const uint16_t *qb, int64_t ldq, float *sc, uint16_t *pb,
                   int64_t ldp, float *ctx, float *mx, float *sm)
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
        if (mx) mx[h] = max_f32(sc + h * S, S);
        ms_softmax(sc + h * S, S);
        if (mx) sm[h] = 1.0f / max_f32(sc + h * S, S);
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
 * ctx[h] (rows vdim apart), normalised over those rows; with mx, the
 * heads' maxima and sums into mx[h], sm[h] (a long sequence's block). */
ABF static void attend_bf(const struct job *j, const ms_attn_seq *a, const float *q, float *ctx,
                          int64_t h0, int64_t h1, int64_t s0, int64_t S, float *scores,
                          uint16_t *qb, uint16_t *pb, int64_t ldp, const char **rp, float *mx,
                          float *sm)
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
        group_bf(n, rp, S, R, V, j->scale, qg, ldq, sg, pg, ldp, cg, mx ? mx + g0 : NULL,          \
                 mx ? sm + g0 : NULL);                                                             \
        break;
            G(1) G(2) G(3) G(4) G(5) G(6) G(7) G(8)
#undef G
        }
    }
}

static int is_long(int bf, const ms_attn_seq *a)
{
    return bf && a->dtype == MS_DT_BF16 && a->S > MS_ATTN_CHUNK;
}

/* One block of a long sequence: item k of the wave's long items. */
static void long_item(const struct job *j, int k, float *scores, const char **rp)
{
    int g = k / j->per_long, w = 0; /* g: the block's partial slot */
    while (j->long_c0[w + 1] <= g) w++;
    int i = j->long_seq[w];
    const ms_attn_seq *a = &j->seqs[i];
    int64_t s0 = (int64_t)(g - j->long_c0[w]) * MS_ATTN_CHUNK,
            n = a->S - s0 < MS_ATTN_CHUNK ? a->S - s0 : MS_ATTN_CHUNK;
    int64_t h0 = (k % j->per_long) * j->hbl, h1 = h0 + j->hbl < j->H ? h0 + j->hbl : j->H;
    uint16_t *qb = (uint16_t *)(scores + (h1 - h0) * MS_ATTN_CHUNK),
             *pb = qb + (h1 - h0) * ms_attn_ldq(a->row);
    float *part = j->parts + (int64_t)g * j->H * (j->vdim + 2), *mx = part + j->H * j->vdim;
    attend_bf(j, a, j->q + (int64_t)i * j->H * a->row, part, h0, h1, s0, n, scores, qb, pb,
              ms_attn_ldp(MS_ATTN_CHUNK), rp, mx, mx + j->H);
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
    int isa = j->k ? j->k->isa : MS_ISA_SCALAR;
    for (;;) {
        int it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (it >= j->n_items) break;
        if (it >= j->n_short) {
            long_item(j, it - j->n_short, scores, rp);
            continue;
        }
        int i = it / j->items_per_seq;
        const ms_attn_seq *a = &j->seqs[i];
        if (is_long(j->bf, a)) continue; /* in its wave's long items */
        int64_t h0 = (it % j->items_per_seq) * j->hb, h1 = h0 + j->hb < j->H ? h0 + j->hb : j->H;
        const float *q = j->q + (int64_t)i * j->H * row;
        float *ctx = j->ctx + (int64_t)i * j->H * j->vdim;
        if (j->bf && a->dtype == MS_DT_BF16)
            attend_bf(j, a, q, ctx, h0, h1, 0, a->S, scores, qb, pb, ms_attn_ldp(j->S_max), rp,
                      NULL, NULL);
        else if (isa >= MS_ISA_AVX512 && (a->dtype == MS_DT_BF16 || a->dtype == MS_DT_F32))
            attend512(j, a, q, ctx, h0, h1, scores, rp);
        else
            attend(j, a, q, ctx, h0, h1, scores, buf);
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
    struct job j = {.k = k, .seqs = seqs, .q = q, .H = H, .vdim = vdim, .hb = hb,
                    .S_max = S_max, .items_per_seq = per, .n_short = n * per, .scale = scale,
                    .ctx = ctx, .scratch = scratch};
    j.bf = k && !k->exact && k->isa >= MS_ISA_AVX512BF16 && row % 32 == 0 && vdim % 32 == 0 &&
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
            if (!is_long(j.bf, &seqs[i])) continue;
            int c = (int)((seqs[i].S + MS_ATTN_CHUNK - 1) / MS_ATTN_CHUNK);
            if (used + c > slots) break;
            j.long_seq[j.n_long] = i;
            j.long_c0[j.n_long++] = used;
            used += c;
        }
        j.long_c0[j.n_long] = used;
        /* all heads per block when the blocks alone keep the threads busy
         * (each row read once); a head's result is the same either way */
        j.hbl = used >= 2 * nt ? H : hb;
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
