/* attn_mqa.h — sink attention of one query row over a list of shared rows
 * (DeepSeek-V4's one KV head: each row is a key and its value).  For each head
 * h of [h0, h1): s_i = scale · q[h]·row_i, p_i = exp(s_i − z) / (Σ_j exp(s_j −
 * z) + exp(sink[h] − z)) with z = max_i s_i, o[h] = Σ_i p_i · row_i.  Pure
 * functions, any thread (no pool).  The scalar twin ms_attn_mqa_ref (ref.c) is
 * the tests' oracle.
 */
#ifndef MS_KERNELS_ATTN_MQA_H
#define MS_KERNELS_ATTN_MQA_H

#include <stdint.h>

/* Floats of scratch ms_attn_mqa needs for n rows of hd values. */
static inline int64_t ms_attn_mqa_scratch_floats(int64_t n, int64_t hd)
{
    return 8 * (n + hd);
}

/* q: [H][hd] (head h at q + h·hd), rows[0 .. n): hd floats each, sink[H], o:
 * [H][hd] (heads h0 .. h1 written).  Blocks of 8 heads take every row once
 * for all 8 (each head's scores in its own lane, so a head's result does not
 * depend on the others in its block); the heads past the last whole block
 * take one head at a time.  Needs hd % 8 == 0 for the blocks (else one head
 * at a time); scratch: ms_attn_mqa_scratch_floats(n, hd). */
void ms_attn_mqa(const float *q, int64_t hd, const float *const *rows, int64_t n, int64_t h0,
                 int64_t h1, float scale, const float *sink, float *scratch, float *o);
/* The same in scalar arithmetic (scratch: n floats). */
void ms_attn_mqa_ref(const float *q, int64_t hd, const float *const *rows, int64_t n, int64_t h0,
                     int64_t h1, float scale, const float *sink, float *scratch, float *o);

#endif
