/* mm_internal.h — what the matmul dispatcher (matmul.c) shares with its ISA
 * back ends (mm_avx2.c, mm_avx512.c, mm_bf16.c, mm_dnnl.c).  Not part of the
 * kernel API: only files under src/kernels include it.
 *
 * A back end computes output columns [n0, n1) of y = x·Wᵀ for all M rows (the
 * dispatcher splits N over the pool threads), or columns [n0, n1) of
 * y = x·W for ms_matmul_nn.  Back ends run on pool threads; each uses only its
 * own per-thread scratch (ms_mm_scratch).
 */
#ifndef MS_KERNELS_MM_INTERNAL_H
#define MS_KERNELS_MM_INTERNAL_H

#include "kernels/kernels.h"

#include <stddef.h>

typedef struct mm_task {
    float *y; /* [M][ldy] */
    int64_t ldy;
    const float *x; /* [M][ldx] */
    int64_t ldx, M;
    const ms_mat *W;
    int accumulate;
    uint64_t run; /* the pool run it belongs to: inputs do not change within one */
    int binv;     /* kctx->batch_invariant: one reduction order for every M */
} mm_task;

/* Per-thread scratch in separate slots, 64-byte aligned, at least `bytes`;
 * grown (never shrunk, contents lost) when a call needs more, freed when the
 * thread exits.  NULL when out of memory (callers then fall back to a path
 * that needs none).  MM_SCR_X holds mm_bf16.c's prepared activations, which
 * it reuses across calls of one run, MM_SCR_XW mm_widen.c's (likewise),
 * MM_SCR_F4X and MM_SCR_F4B mm_fp4.c's two kernels' (likewise), MM_SCR_PKX
 * and MM_SCR_PKB mm_bf16_pack.c's activations (likewise) and panel, MM_SCR_A2X
 * mm_avx2_pack.c's activations (likewise), MM_SCR_A2F4 mm_avx2.c's int16
 * FP4 activations (likewise); nothing else writes them. */
enum {
    MM_SCR_X,
    MM_SCR_XW,
    MM_SCR_W,
    MM_SCR_F4X,
    MM_SCR_F4B,
    MM_SCR_PKX,
    MM_SCR_PKB,
    MM_SCR_A2X,
    MM_SCR_A2F4,
    MM_SCR_N
};
void *ms_mm_scratch(int slot, size_t bytes);

/* Packed-panel BF16 path (mm_bf16_pack.c), BF16 weights, auto mode, not
 * batch-invariant; matmul.c sends 16 <= M < oneDNN's MIN_M there (MOESERVE_PACK_MIN_M).
 * Returns 0, or -1 (nothing written) for other dtypes or without scratch. */
int ms_mm_bf16_pack_nt(const mm_task *t, int64_t n0, int64_t n1);

/* Packed-panel FP32 path on AVX2 (mm_avx2_pack.c) for BF16, F16, F32, F8E4M3
 * and F4E2M1 weights, auto mode, not batch-invariant; matmul.c sends M >= MOESERVE_PACK_MIN_M
 * there.  Returns 0, or -1 (nothing written) for other dtypes or without scratch. */
int ms_mm_avx2_pack_nt(const mm_task *t, int64_t n0, int64_t n1);

/* Exact FP32 paths (dequantise weights to f32, FP32 FMA). */
void ms_mm_avx2_nt(const mm_task *t, int64_t n0, int64_t n1);
/* The same in auto mode (FP8 GEMVs fold the block scale: not bit-exact). */
void ms_mm_avx2_nt_auto(const mm_task *t, int64_t n0, int64_t n1);
void ms_mm_avx2_nn(const mm_task *t, int64_t n0, int64_t n1);
void ms_mm_avx512_nt(const mm_task *t, int64_t n0, int64_t n1);
void ms_mm_avx512_nn(const mm_task *t, int64_t n0, int64_t n1);
void ms_mm_avx2_cvt(ms_dtype dt, const void *in, float *out, int64_t n);
void ms_mm_avx512_cvt(ms_dtype dt, const void *in, float *out, int64_t n);

/* BF16-activation path (vdpbf16ps) for BF16 and F8E4M3 weights.  Returns 0,
 * or -1 when its scratch could not be allocated (nothing written then). */
int ms_mm_bf16_nt(const mm_task *t, int64_t n0, int64_t n1);
int ms_mm_bf16_nn(const mm_task *t, int64_t n0, int64_t n1); /* FP8 W at c0 % 64 == 0 */
void ms_mm_bf16_cvt_fp8(const uint8_t *in, uint16_t *out, int64_t n);
void ms_mm_bf16_cvt_f32(const float *in, uint16_t *out, int64_t n);

/* The exact e4m3 -> bf16 table (mm_bf16.c): high and low byte of code c < 128
 * (the sign is OR-ed in). */
extern const uint8_t ms_f8_bf16_hi[128], ms_f8_bf16_lo[128];

/* Widening path (mm_widen.c) for BF16 and FP8 weights on AVX-512 without
 * AVX512_BF16, auto mode (FP8 needs AVX512_VBMI, GFNI).  Returns 0, or -1 when its
 * scratch could not be allocated (nothing written then). */
int ms_mm_widen_nt(const mm_task *t, int64_t n0, int64_t n1);
int ms_mm_widen_nn(const mm_task *t, int64_t n0, int64_t n1); /* FP8 W at c0 % 64 == 0 */

/* FP4 (e2m1, per-32 UE8M0) x·Wᵀ on AVX-512, auto mode (mm_fp4.c).  Returns
 * 0, or -1 (nothing written) for a view it does not take (c0 % 32 != 0, odd
 * ld) or when its scratch could not be allocated. */
int ms_mm_fp4_nt(const mm_task *t, int64_t n0, int64_t n1);
/* The same on AVX512_BF16 with activations rounded to bf16 (vdpbf16ps). */
int ms_mm_fp4_bf16_nt(const mm_task *t, int64_t n0, int64_t n1);

/* oneDNN path for BF16 weights at large M (mm_dnnl.c).  Returns 0 when it
 * computed the whole product, -1 when it declined (caller uses a hand
 * kernel).  Main thread only; runs its own OpenMP threads. */
int ms_mm_dnnl_nt(const ms_kctx *k, const mm_task *t);

#endif
