/* attn_block_f32.h — one block of rows of MLA decode attention in FP32 with
 * AVX2 + FMA: attn.c's long blocks (at most MS_ATTN_CHUNK rows of a sequence)
 * where AVX512_BF16 is missing.  Pure function, any thread.
 */
#ifndef MS_KERNELS_ATTN_BLOCK_F32_H
#define MS_KERNELS_ATTN_BLOCK_F32_H

#include "kernels/attn.h"

#include <stdint.h>

/* Heads q[0..nh) (rows R floats apart) over the BF16 rows rp[0..n) (n <=
 * MS_ATTN_CHUNK, R values each, the first V of them the values; V a multiple
 * of 16): scores scale · q[h]·row, contexts ctx[h][V] (rows V apart)
 * normalised over the block, the heads' largest scores mx[h] and sums of
 * exp(score - max) sm[h].  FP32 arithmetic (within ~1e-6 of
 * ms_attn_decode_ref); each head in its own lane, so a head's result does not
 * depend on the others.  scratch: ms_attn_block_floats(R, nh); fresh = 0
 * keeps the transposed queries the last call left in it (the same q, R and
 * nh: the next block of the same sequence and heads). */
void ms_attn_block_f32(const char *const *rp, int64_t n, int64_t R, int64_t V, const float *q,
                       int64_t nh, float scale, int fresh, float *scratch, float *ctx, float *mx,
                       float *sm);

#endif
