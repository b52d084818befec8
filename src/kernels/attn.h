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
    ms_dtype dtype; /* MS_DT_F32, MS_DT_BF16 or MS_DT_F8E4M3 */
    int64_t row;    /* values per cached row */
    int64_t S;      /* cached rows to attend to */
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

/* Rows per partial of a long sequence: on the BF16 path (and in FP32 on AVX2
 * CPUs, ms_attn_block_f32) a sequence of more
 * than MS_ATTN_CHUNK rows is attended in blocks of at most that many rows
 * (a function of its length alone, so the result does not depend on the
 * thread count or the batch), each block read from memory once for all
 * heads; the blocks' partial softmax contexts are combined in block order
 * (flash-decoding).  512 rows (288 KiB of small-v3 rows, 576 KiB of V3's)
 * stay in a 1 MiB L2 for the context pass and halve the blocks' fixed costs
 * against 256 (measured: bench/RESULTS.md, "Why the code is so"). */
enum { MS_ATTN_CHUNK = 512 };

static inline int64_t ms_attn_item_floats(int64_t row, int64_t heads, int64_t S)
{
    return row + 16 + heads * S + heads * (ms_attn_ldq(row) + ms_attn_ldp(S)) / 2;
}

/* The BF16 path's bf16 copy of up to MS_ATTN_CHUNK rows of an FP8 cache, in
 * floats (even). */
static inline int64_t ms_attn_f8_floats(int64_t row)
{
    return ((MS_ATTN_CHUNK * row + 1) / 2 + 1) & ~(int64_t)1;
}

/* One block of a long sequence, for heads heads: on the BF16 path (heads
 * padded to Hp = a multiple of 16) scores [MS_ATTN_CHUNK][Hp] floats,
 * probability pairs [MS_ATTN_CHUNK / 2][Hp] dwords, transposed queries (room
 * for [Hp][ms_attn_ldq(row)] bf16) and a copy of 16 rows [16][row] bf16; on
 * the FP32 path (ms_attn_block_f32, heads padded to a multiple of 8) scores
 * [MS_ATTN_CHUNK][Hp], transposed queries [row][Hp] and 12 rows [12][row] as f32. */
static inline int64_t ms_attn_block_floats(int64_t row, int64_t heads)
{
    int64_t hp = (heads + 15) & ~(int64_t)15, h8 = (heads + 7) & ~(int64_t)7;
    int64_t bf = hp * (MS_ATTN_CHUNK + MS_ATTN_CHUNK / 2 + ms_attn_ldq(row) / 2) + 8 * row,
            f32 = h8 * (MS_ATTN_CHUNK + row) + 12 * row;
    return bf > f32 ? bf : f32;
}

/* Scratch floats one thread of ms_attn_decode uses: a row buffer, the scores
 * of one head block (hb heads over S_max rows), the BF16 path's queries and
 * probabilities of that block (or a long block's: ms_attn_block_floats), the
 * BF16 path's copy of up to MS_ATTN_CHUNK FP8 rows as bf16, and S_max row
 * addresses; even, so that the next thread's block keeps the addresses
 * 8-byte aligned. */
static inline int64_t ms_attn_thread_floats(int64_t row, int64_t H, int64_t hb, int64_t S_max)
{
    int64_t a = ms_attn_item_floats(row, hb, S_max),
            b = ms_attn_item_floats(row, H, S_max < MS_ATTN_CHUNK ? S_max : MS_ATTN_CHUNK);
    if (S_max > MS_ATTN_CHUNK && row + 16 + ms_attn_block_floats(row, H) > b)
        b = row + 16 + ms_attn_block_floats(row, H);
    return (((a > b ? a : b) + 1) & ~(int64_t)1) + ms_attn_f8_floats(row) + 2 * S_max;
}

/* Partial slots after the threads' blocks: one per block of MS_ATTN_CHUNK rows
 * of the longest sequence, plus two per thread (several long sequences of a
 * batch share one pool run); a slot holds H contexts [H][row] and their max
 * and sum [2][H]. */
static inline int64_t ms_attn_part_slots(int n_threads, int64_t S_max)
{
    return S_max > MS_ATTN_CHUNK ? (S_max + MS_ATTN_CHUNK - 1) / MS_ATTN_CHUNK + 2 * n_threads : 0;
}

/* Scratch floats ms_attn_decode needs for a pool of n_threads, H heads and
 * sequences of up to S_max cached rows (head blocks of ceil(H / n_threads)). */
static inline int64_t ms_attn_scratch_floats(int n_threads, int64_t row, int64_t H, int64_t S_max)
{
    return (int64_t)n_threads *
               ms_attn_thread_floats(row, H, (H + n_threads - 1) / n_threads, S_max) +
           ms_attn_part_slots(n_threads, S_max) * H * (row + 2);
}

/* n sequences at once (a decode batch): q [n][H][row], ctx [n][H][vdim]
 * output.  One pool run; threads claim (sequence, head block) items, so a
 * batch of short sequences costs one hand-off, not one per sequence.
 * scratch: ms_attn_scratch_floats(pool size, row, H, max S of the batch).
 * Precision follows the kernel context: exact = 1 (or no AVX512_BF16, an F32
 * cache, row or vdim not a multiple of 32) computes in FP32 (within ~1e-6 of
 * the reference); exact = 0 rounds q and the probabilities to bf16 once and
 * uses BF16 dot products with FP32 sums (the cache is bf16 already; an FP8
 * cache's rows are widened to bf16 exactly, a block at a time, so its result
 * has the bits of a BF16 cache holding the same values), as the
 * matmuls of that mode do and as GPU MLA kernels do (a few 1e-3 of max|ctx|
 * on random rows, tests/test_attn.c).  There, and in FP32 on CPUs with AVX2
 * but not AVX-512 (BF16 or FP8 caches, vdim a multiple of 16), sequences
 * longer than MS_ATTN_CHUNK rows are split into blocks (above) that the
 * threads share, so one long sequence keeps every thread busy reading
 * distinct rows, each row once for all heads. */
void ms_attn_decode(const ms_kctx *k, const ms_attn_seq *seqs, int n, const float *q, int64_t H,
                    int64_t vdim, float scale, float *ctx, float *scratch);
void ms_attn_decode_ref(const ms_attn_seq *a, const float *q, int64_t H, int64_t vdim, float scale,
                        float *ctx);

#endif
