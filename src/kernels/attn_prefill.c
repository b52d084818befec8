/* attn_prefill.c — fused causal prefill attention (attn_prefill.h).
 *
 * Work items are (head, up to 192 query rows), claimed from one counter, the rows
 * with the most keys first.  An item walks the keys in blocks of KB: for each
 * group of RG of its rows, the scores (keys in the lanes of 4 accumulators per
 * row, each query value a broadcast: 24 accumulators, no horizontal sums),
 * each row's online-softmax update (running max m and sum l; the context
 * rescaled when m grows), then the context of the block added into the item's
 * FP32 buffer o.  A block's keys (qd · KB floats, one run: rows S apart
 * would share a few cache sets) and values (KB · dv) are read from L2 once
 * per item and from L1 by its row groups.
 */
#include "kernels/attn_prefill.h"
#include "kernels/avx2_inl.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* keys per block, rows per group; an item's context buffer (48 KiB) and most
 * rows: the more rows an item has, the more row groups share each block's one
 * read from L2 (measured from 24 to 384: bench/RESULTS.md, "Why the code is
 * so") */
enum { KB = MS_ATTN_PREFILL_KB, RG = 6, O_FLOATS = 12288, MQ_MAX = 192 };

static int64_t rows_per_item(int64_t dv)
{
    int64_t mq = O_FLOATS / dv / RG * RG;
    return mq < MQ_MAX ? mq : MQ_MAX;
}

void ms_attn_prefill_ref(const ms_attn_prefill *a)
{
    const int64_t S = a->p0 + a->n, S64 = ms_attn_prefill_keys(S), qd = a->qd, dv = a->dv;
    double *p = malloc(sizeof(double) * (size_t)S);
    if (!p) abort(); /* tests only */
    for (int64_t i = 0; i < a->n; i++)
        for (int64_t b = 0; b < a->hg; b++) {
            const float *q = a->q + i * a->ldq + b * qd;
            int64_t ns = a->p0 + i + 1;
            double mx = -INFINITY, sum = 0;
            for (int64_t s = 0; s < ns; s++) {
                double d = 0;
                for (int64_t c = 0; c < qd; c++)
                    d += (double)q[c] * a->kt[b * S64 * qd + ms_attn_prefill_kt_at(qd, c, s)];
                p[s] = a->scale * d;
                mx = fmax(mx, p[s]);
            }
            for (int64_t s = 0; s < ns; s++) sum += p[s] = exp(p[s] - mx);
            for (int64_t c = 0; c < dv; c++) {
                double acc = 0;
                for (int64_t s = 0; s < ns; s++) acc += p[s] * a->vt[(b * S + s) * dv + c];
                a->out[i * a->ldo + b * dv + c] = (float)(acc / sum);
            }
        }
    free(p);
}

int ms_attn_prefill_ok(const ms_kctx *k, int64_t dv)
{
    return k && k->isa >= MS_ISA_AVX2 && dv > 0 && dv <= MS_ATTN_PREFILL_DV_MAX;
}

#define A512  __attribute__((target("avx512f")))
#define AI512 static inline __attribute__((always_inline, target("avx512f")))

AI512 __mmask16 lanes(int64_t left)
{
    return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* Unscaled scores of R rows (query r at q + r · ldq) against the block's 64
 * keys (key s of component c at kt[c · KB + s]): x[r][j] holds keys 16j ..
 * 16j + 15.  Lanes the rows do not see are computed too and dropped by
 * row_softmax (no masks here: gcc kept them on the stack, one reload per
 * load). */
AI512 void tile_scores(const int R, const float *q, int64_t ldq, const float *kt, int64_t qd,
                       __m512 x[RG][4])
{
    __m512 acc[RG][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
    for (int64_t c = 0; c < qd; c++) {
        const float *kc = kt + c * KB;
        __m512 v0 = _mm512_loadu_ps(kc), v1 = _mm512_loadu_ps(kc + 16),
               v2 = _mm512_loadu_ps(kc + 32), v3 = _mm512_loadu_ps(kc + 48);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m512 qv = _mm512_set1_ps(q[r * ldq + c]);
            acc[r][0] = _mm512_fmadd_ps(qv, v0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(qv, v1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(qv, v2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(qv, v3, acc[r][3]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) x[r][j] = acc[r][j];
}

/* exp(x) for x <= 0 (the scores less their running max), 16 lanes: 2^t with
 * t = x·log2(e) split as n + f (|f| <= 1/2), 2^f by its Taylor series to
 * degree 7 (relative error < 1e-8), times 2^n by vscalefps; lanes outside k
 * are 0 (the keys a row does not see: exactly 0, so a row's sums do not
 * depend on the rows beside it).  Half the instructions of attn.c's exp16. */
AI512 __m512 exp_neg(__m512 x, __mmask16 k)
{
    __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)),
                             _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(k, p, n);
}

/* One row's online-softmax step over a block whose first nv keys it sees
 * (1 <= nv <= KB): probabilities into p[KB] (0 past nv), its max *m and sum
 * *l updated, its context o[dv] rescaled when the max grows. */
AI512 void row_softmax(const __m512 *x, int64_t nv, float scale, float *m, float *l, float *p,
                       float *o, int64_t dv)
{
    const __m512 vs = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 y[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) y[j] = _mm512_mask_mul_ps(ninf, lanes(nv - 16 * j), x[j], vs);
    float bm =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(y[0], y[1]), _mm512_max_ps(y[2], y[3])));
    float mn = bm > *m ? bm : *m;
    __m512 vm = _mm512_set1_ps(mn), e = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512 pj = exp_neg(_mm512_sub_ps(y[j], vm), lanes(nv - 16 * j));
        _mm512_storeu_ps(p + 16 * j, pj);
        e = _mm512_add_ps(e, pj);
    }
    float corr = expf(*m - mn); /* 0 on the first block (*m = -inf), 1 when the max held */
    *l = *l * corr + _mm512_reduce_add_ps(e);
    if (corr != 1.0f) {
        __m512 vc = _mm512_set1_ps(corr);
        for (int64_t c = 0; c < dv; c += 16) {
            __mmask16 mk = lanes(dv - c);
            _mm512_mask_storeu_ps(o + c, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, o + c), vc));
        }
    }
    *m = mn;
}

/* o[r][:] += Σ_{s < nk} p[r][s] · v[s][:] for R rows (o rows dv apart, p rows
 * KB apart), 64 columns at a time; FULL (dv a multiple of 64) drops the
 * column masks. */
AI512 void tile_ctx(const int R, const int FULL, const float *p, int64_t nk, const float *v,
                    int64_t dv, float *o)
{
    for (int64_t c0 = 0; c0 < dv; c0 += 64) {
        __mmask16 mk[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) mk[j] = FULL ? 0xffff : lanes(dv - c0 - 16 * j);
        __m512 acc[RG][4];
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[r][j] = FULL ? _mm512_loadu_ps(o + r * dv + c0 + 16 * j)
                                 : _mm512_maskz_loadu_ps(mk[j], o + r * dv + c0 + 16 * j);
        for (int64_t s = 0; s < nk; s++) {
            const float *vs = v + s * dv + c0;
            __m512 vv[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                vv[j] =
                    FULL ? _mm512_loadu_ps(vs + 16 * j) : _mm512_maskz_loadu_ps(mk[j], vs + 16 * j);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                __m512 pv = _mm512_set1_ps(p[r * KB + s]);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) acc[r][j] = _mm512_fmadd_ps(pv, vv[j], acc[r][j]);
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                if (FULL)
                    _mm512_storeu_ps(o + r * dv + c0 + 16 * j, acc[r][j]);
                else
                    _mm512_mask_storeu_ps(o + r * dv + c0 + 16 * j, mk[j], acc[r][j]);
            }
    }
}

/* Rows [i0, i0 + nr) (nr <= rows_per_item(dv)) of head b. */
A512 static void item(const ms_attn_prefill *a, int64_t b, int64_t i0, int64_t nr)
{
    float o[O_FLOATS] __attribute__((aligned(64))); /* [nr][dv] */
    float p[RG * KB] __attribute__((aligned(64)));  /* [RG][KB] */
    float m[MQ_MAX], l[MQ_MAX];
    const int64_t S = a->p0 + a->n, S64 = ms_attn_prefill_keys(S), qd = a->qd, dv = a->dv,
                  pos0 = a->p0 + i0;
    const float *kt = a->kt + b * S64 * qd, *vt = a->vt + b * S * dv;
    for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, l[r] = 0;
    memset(o, 0, sizeof(float) * (size_t)(nr * dv));
    for (int64_t s0 = 0; s0 < pos0 + nr; s0 += KB)
        for (int64_t r0 = 0; r0 < nr; r0 += RG) {
            const int rows = (int)(nr - r0 < RG ? nr - r0 : RG);
            int64_t nk = pos0 + r0 + rows - s0; /* keys of the block the group's last row sees */
            if (nk <= 0) continue;
            if (nk > KB) nk = KB;
            const float *qg = a->q + (i0 + r0) * a->ldq + b * qd;
            __m512 x[RG][4];
            switch (rows) {
#define T(n)                                                                                       \
    case n:                                                                                        \
        tile_scores(n, qg, a->ldq, kt + s0 * qd, qd, x);                                           \
        break;
                T(1) T(2) T(3) T(4) T(5) T(6)
#undef T
            }
            for (int r = 0; r < rows; r++) {
                int64_t nv = pos0 + r0 + r - s0 + 1; /* this row sees keys s <= its position */
                if (nv <= 0) {
                    memset(p + r * KB, 0, sizeof(float) * KB);
                    continue;
                }
                row_softmax(x[r], nv < KB ? nv : KB, a->scale, &m[r0 + r], &l[r0 + r], p + r * KB,
                            o + (r0 + r) * dv, dv);
            }
            switch (rows + (dv % 64 ? 0 : RG)) {
#define C(n)                                                                                       \
    case n:                                                                                        \
        tile_ctx(n, 0, p, nk, vt + s0 * dv, dv, o + r0 * dv);                                      \
        break;                                                                                     \
    case n + RG:                                                                                   \
        tile_ctx(n, 1, p, nk, vt + s0 * dv, dv, o + r0 * dv);                                      \
        break;
                C(1) C(2) C(3) C(4) C(5) C(6)
#undef C
            }
        }
    for (int64_t r = 0; r < nr; r++) {
        const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
        float *dst = a->out + (i0 + r) * a->ldo + b * dv;
        for (int64_t c = 0; c < dv; c += 16) {
            __mmask16 mk = lanes(dv - c);
            _mm512_mask_storeu_ps(dst + c, mk,
                                  _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, o + r * dv + c), inv));
        }
    }
}

/* ---- AVX2 (8 lanes, 16 registers): the same item, its tiles cut to fit ----
 * The scores of 2 rows × 32 keys at a time (8 sums) go to p[RG][KB] in
 * memory; the softmax reads them back; the context takes 6 rows × 16
 * columns (12 sums).  exp as above with 2^n built in the exponent field
 * (inputs clamped at -87, so 2^n stays normal; exp(-87) is 1.6e-38 of the
 * row's largest term). */

#define AI2 static inline __attribute__((always_inline))

/* Unscaled scores of R <= 2 rows against 32 keys (key j of component c at
 * kt[c · KB + j]) into sc[r · KB + j]. */
AI2 void scores_2x32(const int R, const float *q, int64_t ldq, const float *kt, int64_t qd,
                     float *sc)
{
    __m256 acc[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < qd; c++) {
        const float *kc = kt + c * KB;
        __m256 v0 = _mm256_loadu_ps(kc), v1 = _mm256_loadu_ps(kc + 8),
               v2 = _mm256_loadu_ps(kc + 16), v3 = _mm256_loadu_ps(kc + 24);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            __m256 qv = _mm256_broadcast_ss(q + r * ldq + c);
            acc[r][0] = _mm256_fmadd_ps(qv, v0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(qv, v1, acc[r][1]);
            acc[r][2] = _mm256_fmadd_ps(qv, v2, acc[r][2]);
            acc[r][3] = _mm256_fmadd_ps(qv, v3, acc[r][3]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(sc + r * KB + 8 * j, acc[r][j]);
}

/* All-ones in the lanes i with i0 + i < nv. */
AI2 __m256 keep8(int64_t nv, int i0)
{
    __m256i idx =
        _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(i0));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)nv), idx));
}

AI2 __m256 exp_neg8(__m256 x, __m256 keep)
{
    __m256 t = _mm256_mul_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)),
                             _mm256_set1_ps(1.44269504088896341f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147180559945309f));
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

/* row_softmax on one row's scores p[KB] (replaced by its probabilities). */
AI2 void row_softmax8(float *p, int64_t nv, float scale, float *m, float *l, float *o, int64_t dv)
{
    const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 y[8], mx = ninf;
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        y[j] =
            _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(p + 8 * j), vs), keep8(nv, 8 * j));
        mx = _mm256_max_ps(mx, y[j]);
    }
    float bm = ms_hmax8(mx);
    float mn = bm > *m ? bm : *m;
    __m256 vm = _mm256_set1_ps(mn), e = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m256 pj = exp_neg8(_mm256_sub_ps(y[j], vm), keep8(nv, 8 * j));
        _mm256_storeu_ps(p + 8 * j, pj);
        e = _mm256_add_ps(e, pj);
    }
    float corr = expf(*m - mn); /* 0 on the first block (*m = -inf), 1 when the max held */
    *l = *l * corr + ms_hsum8(e);
    if (corr != 1.0f)
        for (int64_t c = 0; c < dv; c++) o[c] *= corr;
    *m = mn;
}

/* o[r][:] += Σ_{s < nk} p[r][s] · v[s][:] for R <= RG rows, 16 columns at a
 * time; column tails in scalar FMA (the same order: s ascending). */
AI2 void ctx_6x16(const int R, const float *p, int64_t nk, const float *v, int64_t dv, float *o)
{
    const int64_t d16 = dv & ~(int64_t)15;
    for (int64_t c0 = 0; c0 < d16; c0 += 16) {
        __m256 acc[RG][2];
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            acc[r][0] = _mm256_loadu_ps(o + r * dv + c0);
            acc[r][1] = _mm256_loadu_ps(o + r * dv + c0 + 8);
        }
        for (int64_t s = 0; s < nk; s++) {
            __m256 v0 = _mm256_loadu_ps(v + s * dv + c0), v1 = _mm256_loadu_ps(v + s * dv + c0 + 8);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                __m256 pv = _mm256_broadcast_ss(p + r * KB + s);
                acc[r][0] = _mm256_fmadd_ps(pv, v0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(pv, v1, acc[r][1]);
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(o + r * dv + c0, acc[r][0]);
            _mm256_storeu_ps(o + r * dv + c0 + 8, acc[r][1]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int64_t c = d16; c < dv; c++) {
            float acc = o[r * dv + c];
            for (int64_t s = 0; s < nk; s++) acc = fmaf(p[r * KB + s], v[s * dv + c], acc);
            o[r * dv + c] = acc;
        }
}

static void ctx_rows(int R, const float *p, int64_t nk, const float *v, int64_t dv, float *o)
{
    switch (R) {
    case 1:
        ctx_6x16(1, p, nk, v, dv, o);
        break;
    case 2:
        ctx_6x16(2, p, nk, v, dv, o);
        break;
    case 3:
        ctx_6x16(3, p, nk, v, dv, o);
        break;
    case 4:
        ctx_6x16(4, p, nk, v, dv, o);
        break;
    case 5:
        ctx_6x16(5, p, nk, v, dv, o);
        break;
    default:
        ctx_6x16(6, p, nk, v, dv, o);
        break;
    }
}

/* item() on AVX2. */
static void item_avx2(const ms_attn_prefill *a, int64_t b, int64_t i0, int64_t nr)
{
    float o[O_FLOATS] __attribute__((aligned(64))); /* [nr][dv] */
    float p[RG * KB] __attribute__((aligned(64)));  /* [RG][KB] */
    float m[MQ_MAX], l[MQ_MAX];
    const int64_t S = a->p0 + a->n, S64 = ms_attn_prefill_keys(S), qd = a->qd, dv = a->dv,
                  pos0 = a->p0 + i0;
    const float *kt = a->kt + b * S64 * qd, *vt = a->vt + b * S * dv;
    for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, l[r] = 0;
    memset(o, 0, sizeof(float) * (size_t)(nr * dv));
    for (int64_t s0 = 0; s0 < pos0 + nr; s0 += KB)
        for (int64_t r0 = 0; r0 < nr; r0 += RG) {
            const int rows = (int)(nr - r0 < RG ? nr - r0 : RG);
            int64_t nk = pos0 + r0 + rows - s0; /* keys of the block the group's last row sees */
            if (nk <= 0) continue;
            if (nk > KB) nk = KB;
            const float *qg = a->q + (i0 + r0) * a->ldq + b * qd, *kb = kt + s0 * qd;
            for (int r = 0; r < rows; r += 2)
                for (int h = 0; h < KB; h += 32) {
                    if (rows - r >= 2)
                        scores_2x32(2, qg + r * a->ldq, a->ldq, kb + h, qd, p + r * KB + h);
                    else
                        scores_2x32(1, qg + r * a->ldq, a->ldq, kb + h, qd, p + r * KB + h);
                }
            for (int r = 0; r < rows; r++) {
                int64_t nv = pos0 + r0 + r - s0 + 1; /* this row sees keys s <= its position */
                if (nv <= 0) {
                    memset(p + r * KB, 0, sizeof(float) * KB);
                    continue;
                }
                row_softmax8(p + r * KB, nv < KB ? nv : KB, a->scale, &m[r0 + r], &l[r0 + r],
                             o + (r0 + r) * dv, dv);
            }
            ctx_rows(rows, p, nk, vt + s0 * dv, dv, o + r0 * dv);
        }
    for (int64_t r = 0; r < nr; r++) {
        const float inv = 1.0f / l[r];
        float *dst = a->out + (i0 + r) * a->ldo + b * dv;
        for (int64_t c = 0; c < dv; c++) dst[c] = o[r * dv + c] * inv;
    }
}

struct job {
    const ms_attn_prefill *a;
    int avx512;
    int64_t mq, n_groups, n_items; /* groups of mq rows; items = groups × heads */
    _Atomic int64_t next;          /* first unclaimed item */
};

static void worker(void *arg, int tid, int nt)
{
    (void)tid, (void)nt;
    struct job *j = arg;
    for (;;) {
        int64_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->n_items) return;
        int64_t g = j->n_groups - 1 - k / j->a->hg, i0 = g * j->mq; /* the last rows first */
        int64_t nr = j->a->n - i0 < j->mq ? j->a->n - i0 : j->mq;
        if (j->avx512)
            item(j->a, k % j->a->hg, i0, nr);
        else
            item_avx2(j->a, k % j->a->hg, i0, nr);
    }
}

void ms_attn_prefill_run(const ms_kctx *k, const ms_attn_prefill *a)
{
    if (a->n <= 0 || a->hg <= 0) return;
    int64_t mq = rows_per_item(a->dv);
    struct job j = {a, k->isa >= MS_ISA_AVX512, mq, (a->n + mq - 1) / mq, 0, 0};
    j.n_items = j.n_groups * a->hg;
    ms_pool_run_dynamic(k->pool, worker, &j);
}
