/* kvq.h — the packed KV-cache entry formats of DeepSeek-V4's deployed cache
 * (arch.md §2.11), their quantise-at-write and dequantise-at-read codecs, and
 * the normalised Hadamard rotation the MXFP4 indexer applies before it
 * quantises.  Owns the byte layouts only; the cache (cache/) stores the bytes
 * as MS_DT_U8 streams and the V4 forward calls these.  Pure functions; any
 * thread.
 *
 * FP8 "ds" entry of one hd-value vector whose last dr values are the rope
 * dims (vLLM's fp8_ds_mla record for V4; SGLang's DeepSeekV4SingleKVPool):
 *   bytes [0, nope)                  e4m3 codes of the nope dims (nope = hd − dr)
 *   bytes [nope, nope + 2·dr)        the rope dims as BF16, little-endian
 *   bytes [nope + 2·dr, + nb)        one UE8M0 scale per 64 nope dims (nb = ⌈nope/64⌉)
 *   1 byte                           pad (0)
 * V4-Flash (hd 512, dr 64): 448 + 128 + 7 + 1 = 584 bytes.  vLLM's kernel
 * puts the 8 scale bytes of every token of a page after the page's 576-byte
 * value rows (FlashMLA's alignment); this pool pages by entry, so the scales
 * stay in their entry — the same bytes per token, a different order.
 * Block scale: s = 2^⌈log2(max(amax, 1e-4) / 448)⌉ (vLLM's rope_quant_insert
 * recipe), code = e4m3(clamp(x / s, ±448)) rounded to nearest even.
 *
 * MXFP4 key of n values (SGLang's --enable-deepseek-v4-fp4-indexer keys):
 *   bytes [0, ⌈n/2⌉)                 e2m1 codes, two per byte, low nibble first
 *   bytes [⌈n/2⌉, + ⌈n/32⌉)          one UE8M0 scale per 32 values
 * 128 values: 64 + 4 = 68 bytes.  Block scale s = 2^⌈log2(max(amax, 1e-4) / 6)⌉.
 *
 * FP8 key of n values (SGLang's DeepSeek-V4 index keys without the FP4 indexer:
 * get_dsv4_indexer_bytes_per_token = index_head_dim + index_head_dim / 128 · 4):
 *   bytes [0, n)                     e4m3 codes
 *   bytes [n, n + 4·⌈n/128⌉)         one f32 scale per 128 values, little-endian
 * 128 values: 128 + 4 = 132 bytes.  Block scale s = max(amax, 1e-4) / 448 in f32, not
 * a power of two, and code = e4m3(clamp(x · (1/s), ±448)) rounded to nearest even, the
 * inverse 1/s and the product rounded to f32: SGLang's rule for these keys
 * (fused_store_indexer_cache, "use normal fp32 scale") and for the indexer's queries,
 * one scale per (token, head) (fused_q_indexer_rope_hadamard_quant; SGLang folds the
 * query's scale into the head weight, the same product up to f32 rounding);
 * SGLang's page puts its keys' codes first and their scales after them, this pool
 * keeps each key's scale after its codes: the same bytes per token.
 */
#ifndef MS_KERNELS_KVQ_H
#define MS_KERNELS_KVQ_H

#include <stdint.h>

/* Bytes of one FP8 ds entry of hd values, dr of them rope dims. */
int64_t ms_kvq_fp8ds_bytes(int64_t hd, int64_t dr);
/* x[hd] -> e[ms_kvq_fp8ds_bytes] and back.  The _ref pack is the scalar twin
 * (the existing search-based e4m3 encoder); ms_kvq_fp8ds_pack is the fast
 * bitwise one and gives the same bytes (tests/test_kernels.c). */
void ms_kvq_fp8ds_pack(const float *x, int64_t hd, int64_t dr, uint8_t *e);
void ms_kvq_fp8ds_pack_ref(const float *x, int64_t hd, int64_t dr, uint8_t *e);
void ms_kvq_fp8ds_unpack(const uint8_t *e, int64_t hd, int64_t dr, float *x);

/* Bytes of one MXFP4 vector of n values. */
int64_t ms_kvq_mxfp4_bytes(int64_t n);
void ms_kvq_mxfp4_pack(const float *x, int64_t n, uint8_t *e);
void ms_kvq_mxfp4_unpack(const uint8_t *e, int64_t n, float *x);
/* x[n] -> its MXFP4 value (pack then unpack), in place: the indexer's queries. */
void ms_kvq_mxfp4_round(float *x, int64_t n);

/* Bytes of one FP8 key of n values; x[n] -> e and back (_ref: the scalar twin
 * with the search-based e4m3 encoder, the same bytes); _round: pack then unpack
 * in place (the indexer's queries). */
int64_t ms_kvq_fp8key_bytes(int64_t n);
void ms_kvq_fp8key_pack(const float *x, int64_t n, uint8_t *e);
void ms_kvq_fp8key_pack_ref(const float *x, int64_t n, uint8_t *e);
void ms_kvq_fp8key_unpack(const uint8_t *e, int64_t n, float *x);
void ms_kvq_fp8key_round(float *x, int64_t n);
/* out[h] = q_h · the FP8 key e of n values for nh queries q_h = q + h·ldq, read from
 * its codes (the decode indexer's scores of one key, without an unpacked row): equal bit
 * for bit to ms_kvq_fp8key_dots_ref = ms_dot_f32(q_h, ms_kvq_fp8key_unpack(e)) (the
 * scalar twin; tests/test_kvq.c); n <= 4096. */
void ms_kvq_fp8key_dots(const float *q, int64_t nh, int64_t ldq, const uint8_t *e, int64_t n,
                        float *out);
void ms_kvq_fp8key_dots_ref(const float *q, int64_t nh, int64_t ldq, const uint8_t *e, int64_t n,
                            float *out);

/* The same for an MXFP4 key of n values (ms_kvq_mxfp4_unpack's values): equal bit for
 * bit to ms_kvq_mxfp4_dots_ref = ms_dot_f32(q_h, ms_kvq_mxfp4_unpack(e)); n <= 4096. */
void ms_kvq_mxfp4_dots(const float *q, int64_t nh, int64_t ldq, const uint8_t *e, int64_t n,
                       float *out);
void ms_kvq_mxfp4_dots_ref(const float *q, int64_t nh, int64_t ldq, const uint8_t *e, int64_t n,
                           float *out);

/* f32 -> e4m3fn code, round to nearest even, saturating to ±448: the bitwise
 * twin of ms_f32_to_fp8e4m3 (kernels/dtype.h), the same code for every f32. */
uint8_t ms_kvq_e4m3_encode(float f);

/* In-place x ← H·x / sqrt(n) for n a power of two (Sylvester order): the
 * rotation of arch.md §2.7/§2.8; orthogonal, so dot products keep their value. */
void ms_kvq_hadamard(float *x, int64_t n);

#endif
