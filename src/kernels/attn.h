/* attn.h — MLA decode attention over paged latent caches (absorbed form).
 *
 * For one sequence: scores[h][s] = scale · q[h]·row[s] over the full cached
 * row (latent + rope key), softmax over s, ctx[h] = Σ_s p[h][s] · row[s][0:vdim].
 * Rows live in pages of page_size rows (F32, BF16, or F8E4M3 for
 * --kv-cache-dtype fp8_e4m3: e4m3 values with scale 1, read exactly through
 * the FP32 path).  A scalar reference
 * twin (one sequence) is kept for the tests.
 * Main thread only (uses the pool).
 */
#ifndef MS_KERNELS_ATTN_H
#define MS_KERNELS_ATTN_H

#include "kernels/kernels.h"

#include <stdint.h>

typedef struct ms_attn_seq {
    const void *const *pages; /* [ceil(S / page_size)] first row of each page */
    int page_size;
    ms_dtype dtype;           /* MS_DT_F32, MS_DT_BF16 or MS_DT_F8E4M3 */
    int64_t row;              /* values per cached row */
    int64_t S;                /* cached rows to attend to */
} ms_attn_seq;

/* Row strides (bf16 values) of the BF16 path's rounded queries and
 * probabilities: even, with 32 values of slack for whole-vector stores. */
static inline int64_t ms_attn_ldq(int64_t row)
{
    return ((row + 1) & ~(int64_t)1) + 32;
}
static inline int64_t ms_attn_ldp(int64_t S_max)
{
    return ((S_max + 1) & ~(int64_t)1) + 32;
}

/* Scratch floats one thread of ms_attn_decode uses: a row buffer, the scores
 * of one head block (hb heads), the BF16 path's queries and probabilities of
 * that block, and S_max row addresses; even, so that the next thread's block
 * keeps the addresses 8-byte aligned. */
static inline int64_t ms_attn_thread_floats(int64_t row, int64_t hb, int64_t S_max)
{
    int64_t bf = hb * (ms_attn_ldq(row) + ms_attn_ldp(S_max)) / 2;
    return ((row + 16 + hb * S_max + bf + 1) & ~(int64_t)1) + 2 * S_max;
}

/* Scratch floats ms_attn_decode needs for a pool of n_threads, H heads and
 * sequences of up to S_max cached rows (head blocks of ceil(H / n_threads)). */
static inline int64_t ms_attn_scratch_floats(int n_threads, int64_t row, int64_t H, int64_t S_max)
{
    return (int64_t)n_threads * ms_attn_thread_floats(row, (H + n_threads - 1) / n_threads, S_max);
}

/* n sequences at once (a decode batch): q [n][H][row], ctx [n][H][vdim]
 * output.  One pool run; threads claim (sequence, head block) items, so a
 * batch of short sequences costs one hand-off, not one per sequence.
 * scratch: ms_attn_scratch_floats(pool size, row, H, max S of the batch).
 * Precision follows the kernel context: exact = 1 (or no AVX512_BF16, an F32
 * cache, row or vdim not a multiple of 32) computes in FP32 (within ~1e-6 of
 * the reference); exact = 0 rounds q and the probabilities to bf16 once and
 * uses BF16 dot products with FP32 sums (the cache is bf16 already), as the
 * matmuls of that mode do and as GPU MLA kernels do (a few 1e-3 of max|ctx|
 * on random rows, tests/test_attn.c). */
void ms_attn_decode(const ms_kctx *k, const ms_attn_seq *seqs, int n, const float *q, int64_t H,
                    int64_t vdim, float scale, float *ctx, float *scratch);
void ms_attn_decode_ref(const ms_attn_seq *a, const float *q, int64_t H, int64_t vdim, float scale,
                        float *ctx);

#endif
