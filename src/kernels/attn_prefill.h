/* attn_prefill.h — causal attention of a prefill chunk in one fused pass
 * (flash attention, FP32), for the naive MLA form's expanded keys and values.
 *
 * One group of hg heads of one sequence; queries at positions p0 .. p0+n-1,
 * keys and values at positions 0 .. p0+n-1 (S = p0 + n):
 *   out[i][b] = Σ_{s ≤ p0+i} softmax_s(scale · q[i][b]·k[b][s]) · v[b][s].
 * Scores, the softmax and the context are computed a block of keys at a time
 * in L1, so no [rows][S] score matrix is written.  A scalar reference twin is
 * kept for the tests.  Main thread only (uses the pool).
 */
#ifndef MS_KERNELS_ATTN_PREFILL_H
#define MS_KERNELS_ATTN_PREFILL_H

#include "kernels/kernels.h"

#include <stdint.h>

typedef struct ms_attn_prefill {
    const float *q; /* query i, head b: q[i * ldq + b * qd], qd floats */
    int64_t ldq;
    const float *kt; /* [hg][S64 / 64][qd][64] keys transposed in blocks of 64
                      * positions (S64 = S rounded up to 64; the lanes past S
                      * are read and their values dropped):
                      * component c of head b at position s is
                      * kt[b * S64 * qd + ((s / 64) * qd + c) * 64 + s % 64] */
    const float *vt; /* [hg][S][dv] values */
    float *out;      /* row i, head b: out[i * ldo + b * dv], dv floats */
    int64_t ldo;
    int64_t hg, qd, dv;
    int64_t p0, n; /* first query position, queries (S = p0 + n) */
    float scale;
} ms_attn_prefill;

/* Largest dv the fused kernel takes (its per-item context buffer); keys per
 * block of the transposed keys. */
enum { MS_ATTN_PREFILL_DV_MAX = 256, MS_ATTN_PREFILL_KB = 64 };

/* Positions one head's transposed keys hold for S keys: S rounded up to a
 * whole block (so qd times this many floats per head). */
static inline int64_t ms_attn_prefill_keys(int64_t S)
{
    return (S + MS_ATTN_PREFILL_KB - 1) / MS_ATTN_PREFILL_KB * MS_ATTN_PREFILL_KB;
}

/* Offset of component c of position s in one head's transposed keys. */
static inline int64_t ms_attn_prefill_kt_at(int64_t qd, int64_t c, int64_t s)
{
    return ((s / MS_ATTN_PREFILL_KB) * qd + c) * MS_ATTN_PREFILL_KB + s % MS_ATTN_PREFILL_KB;
}

/* 1 when ms_attn_prefill runs under k for values of dv floats: AVX2 or
 * AVX-512, and dv <= MS_ATTN_PREFILL_DV_MAX (otherwise the caller keeps its
 * own path). */
int ms_attn_prefill_ok(const ms_kctx *k, int64_t dv);

/* The fused kernel (requires ms_attn_prefill_ok).  Keys are taken in blocks at
 * fixed positions (multiples of 64) and each query row's sums run in one order
 * whatever rows share its call, so a row's output has the same bits for any
 * chunking of the prompt and any thread count.  Within ~1e-6 of the
 * reference (FP32 sums, online softmax). */
void ms_attn_prefill_run(const ms_kctx *k, const ms_attn_prefill *a);
void ms_attn_prefill_ref(const ms_attn_prefill *a);

#endif
