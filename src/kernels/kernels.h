/* kernels.h — the numeric kernels the model calls.
 *
 * Convention: activations are FP32 row-major; weights are ms_mat views of a
 * stored matrix [rows = out features][cols = in features] kept in their stored
 * dtype and converted inside the kernel.  ms_matmul computes
 *     y[M][N] (=|+=) x[M][K] · Wᵀ      with N = W.rows, K = W.cols.
 * Every fast path has a scalar reference twin (suffix _ref) that stays forever
 * and is what the tests compare against.  Which path runs is decided by the
 * kernel context: exact = 1 (--dtype float32) forbids rounding activations
 * (to BF16, or AVX2's FP4 GEMV's int16); exact = 0 (auto) lets AVX-512 BF16
 * dot products and oneDNN run.
 * Kernels may be called from the rank's main thread only; they use the pool.
 */
#ifndef MS_KERNELS_KERNELS_H
#define MS_KERNELS_KERNELS_H

#include "base/threadpool.h"
#include "kernels/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* A view of a stored weight matrix.  Element (r, c) of the view is stored at
 * data[r * ld + c] (in dtype units); an FP8 view's block scale for it is
 * scale[((r0 + r) / 128) * scale_ld + (c0 + c) / 128] where (r0, c0) is the
 * view's origin inside the stored matrix (so TP slices need no copies).
 * F4E2M1 (FP4): element (r, c) is nibble r * ld + c counted from data (low
 * nibble first; ld, and the column of every slice, even), its scale the
 * UE8M0 byte e8scale[(r0 + r) * scale_ld + (c0 + c) / 32]:
 *     W[r][c] = ms_fp4e2m1_to_f32(code) · ms_e8m0_to_f32(scale byte). */
typedef struct ms_mat {
    ms_dtype dtype;     /* F32, BF16, F16, F8E4M3 or F4E2M1 */
    int64_t rows, cols; /* view shape: [out][in] */
    int64_t ld;         /* stored row length, elements */
    const void *data;   /* element (0, 0) of the view */
    const float *scale; /* F8E4M3: [ceil(R/128)][scale_ld] f32 multipliers of the stored matrix */
    int64_t scale_ld;
    int64_t r0, c0; /* view origin in the stored matrix */
    /* F8E4M3, optional (NULL: not known): f8_plain[r0 + r - f8_plain_r0] is
     * row r's MS_F8_ROW_* class, so kernels may convert its codes with integer
     * operations: the bf16 ones (mm_bf16.c, mm_widen.c) PLAIN rows, the FP32
     * tiles (mm_f32_tmpl.h) PLAIN and SUBN rows
     * (ms_mat_f8_scan fills it; slices keep it) */
    const uint8_t *f8_plain;
    int64_t f8_plain_r0;
    const uint8_t *e8scale; /* F4E2M1: [R][scale_ld] UE8M0 bytes of the stored matrix */
    /* BF16, optional (NULL: none): this view also in the packed-panel kernel's
     * layout (ms_kernels_panels_fill), which its products at M >= 16 then read
     * instead of packing the weights at every call; owned by whoever filled
     * it.  ms_mat_slice clears it (a copy of the whole view keeps it). */
    const void *panels;
} ms_mat;

/* Kernel context: the pool and the precision mode. */
typedef struct ms_kctx {
    ms_pool *pool;
    int exact; /* 1: FP32 activations, exact dequantisation (--dtype float32) */
    int isa;   /* MS_ISA_* chosen at start-up (ms_kernels_detect), may be lowered for tests */
    /* 1: batch-invariant products (--enable-deterministic-inference): every output
     * element's reduction order is fixed whatever M (the rows of the call), so a row's
     * result does not depend on what else is in the batch.  Auto mode (exact = 0)
     * then uses one kernel for every M: mm_bf16.c's tiles (no GEMV, no FP8 widening,
     * no oneDNN), or the exact FP32 kernels where AVX512_BF16 is missing (the
     * widening path also picks its order by M).  The exact mode is batch-invariant
     * already. */
    int batch_invariant;
} ms_kctx;

enum { MS_ISA_SCALAR = 0, MS_ISA_AVX2 = 1, MS_ISA_AVX512 = 2, MS_ISA_AVX512BF16 = 3 };

/* Best ISA of this CPU (honours MOESERVE_ISA=scalar|avx2|avx512|avx512bf16; the
 * last also where CPUID hides AVX512_BF16 but a probe executes it). */
int ms_kernels_detect(void);
const char *ms_isa_name(int isa);

/* A whole stored matrix as a view. */
ms_mat ms_mat_whole(ms_dtype dt, int64_t rows, int64_t cols, const void *data, const float *scale);
/* A whole stored FP4 matrix [rows][cols] (cols even): packed codes
 * [rows][cols / 2] and UE8M0 scales [rows][ceil(cols / 32)]. */
ms_mat ms_mat_fp4(int64_t rows, int64_t cols, const void *packed, const uint8_t *e8scale);
/* Bytes of a view's elements (rows × cols, as stored) plus the scales it
 * reads (FP8: its 128×128 blocks' f32; FP4: its rows' UE8M0 bytes). */
int64_t ms_mat_bytes(const ms_mat *m);
/* Sub-view rows [r, r+nr) x cols [c, c+nc) of a view (FP4: c even). */
ms_mat ms_mat_slice(const ms_mat *m, int64_t r, int64_t nr, int64_t c, int64_t nc);
/* The classes of an FP8 row's codes (ms_mat.f8_plain): a NaN code (0x7f /
 * 0xff) among them; none, and every exponent field >= 1 (PLAIN); none, but
 * zero or subnormal codes (exponent field 0). */
enum { MS_F8_ROW_NAN = 0, MS_F8_ROW_PLAIN = 1, MS_F8_ROW_SUBN = 2 };
/* plain[r] = the MS_F8_ROW_* class of row r of an FP8 view.  A view then
 * points f8_plain at plain with f8_plain_r0 = its r0.  AVX2 (vec.c); the
 * _ref twin is scalar. */
void ms_mat_f8_scan(const ms_mat *W, uint8_t *plain);
void ms_mat_f8_scan_ref(const ms_mat *W, uint8_t *plain);
/* Weight element (r, c) of a view as f32 (exact dequantisation). */
float ms_mat_get(const ms_mat *m, int64_t r, int64_t c);

/* y[M][ldy] (=|+=) x[M][ldx] · Wᵀ.  accumulate: 0 overwrite, 1 add.
 * Paths (matmul.c): exact = 1, or AVX2 only, or F32/F16 weights: weights
 * dequantised exactly to f32 in registers, FP32 FMA (AVX-512 or AVX2;
 * matches ms_matmul_ref to ~1e-6 relative, summation order only).
 * exact = 0 with BF16/FP8 weights on AVX512_BF16 (with VBMI and GFNI, which
 * MS_ISA_AVX512BF16 requires): activations rounded once to
 * bf16 (FP8: x·block scale rounded once), vdpbf16ps, FP32 sums (about 1e-3
 * relative to max|y|); BF16 weights at M >= 128 go through oneDNN (below),
 * views holding panels (ms_mat.panels) through the panel kernel at every M >= 16.
 * exact = 0 with BF16 (or, with AVX512_VBMI and GFNI, FP8) weights on AVX-512 without
 * AVX512_BF16: FP32 activations and FMA over weights widened exactly
 * (mm_widen.c; ~1e-7 relative, like the exact path).
 * F4E2M1 weights: exact = 1 or AVX2 only, the exact kernels above (codes
 * times the scale, one f32 product each, FP32 FMA), except exact = 0 on AVX2
 * (not batch-invariant): below 32 rows with K and c0 whole 32-column blocks,
 * x rounded once per 32-value block to int16 steps of its max |x| / 32767,
 * vpmaddwd over the codes (~2e-5 relative to max|y|), from 32 rows the
 * packed FP32 panels (exact dequantisation); exact = 0 on AVX-512 with
 * views at c0 % 32 == 0, mm_fp4.c: on AVX512_BF16 activations rounded once
 * to bf16 and vdpbf16ps over the codes (about 1e-3 relative, as BF16
 * weights), without it FP32 activations and FMA (~1e-6 relative), each
 * 32-column sum times its scale; x·W (nn) with FP4 weights runs the scalar
 * path.
 * Results do not depend on the pool size.  No allocation per call (per-thread
 * scratch is grown on demand and kept).  Any data alignment.
 * Attention fits the same calls: scores[h][t] = q[h]·cache[t] is ms_matmul
 * with the cache rows as W (an F32/BF16 ms_mat), ctx[h] = Σ p[h][t]·cache[t]
 * is ms_matmul_nn with the same rows. */
void ms_matmul(const ms_kctx *k, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
               const ms_mat *W, int accumulate);
void ms_matmul_ref(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M, const ms_mat *W,
                   int accumulate);

/* oneDNN (auto mode, BF16 weights, M >= 128): each weight view is reordered
 * once into oneDNN's blocked layout and cached, keyed by its data pointer (a
 * second copy of those weights; MOESERVE_DNNL_MB caps it, default 4096 MiB).
 * MOESERVE_DNNL=0 or ms_kernels_set_dnnl(0) turns the path off (and frees the
 * copies).  Call ms_kernels_dnnl_forget(data) before freeing or overwriting
 * weights that may have been prepacked (a sampled fingerprint also catches
 * most reuse).  Main thread only. */
void ms_kernels_set_dnnl(int on);
/* Smallest M sent to oneDNN (default 128, see mm_dnnl.c; MOESERVE_DNNL_MIN_M);
 * returns the previous value.  Main thread only. */
int64_t ms_kernels_set_dnnl_min_m(int64_t m);
void ms_kernels_dnnl_forget(const void *data);
/* W's contents changed in place (an EPLB slot rewritten): its prepacked copy, if one is
 * held for W->data at W's shape, is reordered again into the same space (no new
 * space taken).  0: refreshed; -1: none held (or it failed and was dropped).  Main
 * thread only. */
int ms_kernels_dnnl_refresh(const ms_kctx *k, const ms_mat *W);
void ms_kernels_dnnl_clear(void);
size_t ms_kernels_dnnl_bytes(void); /* bytes held by prepacked copies */
/* 1 when oneDNN runs BF16 here (its own CPUID reading lists AVX512_BF16 and
 * its engine starts), whether or not the path is switched on. */
int ms_kernels_dnnl_available(void);
/* 1 when FP8 x·Wᵀ products under k take a kernel that reads ms_mat.f8_plain
 * (auto mode: mm_widen.c, or mm_bf16.c's GEMV and tiles; every mode: the
 * FP32 tiles of mm_f32_tmpl.h on AVX2 and AVX-512); the loader marks the rows
 * only then. */
int ms_kernels_f8_plain_used(const ms_kctx *k);
/* Reorders W now into the layout its large-M calls will use (what the first
 * such call would do), so that call does not pay for it.  0: held (now or
 * before); -1: W does not take oneDNN (dtype, exact mode, oneDNN off) or the
 * MOESERVE_DNNL_MB cap is reached. */
int ms_kernels_dnnl_prepack(const ms_kctx *k, const ms_mat *W);

/* Panel copies (mm_bf16_pack.c).  ms_kernels_panels_bytes: the bytes of W's
 * copy (rows rounded up to 64), or 0 where W's products under k never take
 * the panel kernel (not BF16, no AVX512_BF16, exact or batch-invariant mode).
 * ms_kernels_panels_fill writes it into dst (64-byte aligned, that many
 * bytes) on k's pool; point W->panels at dst after, and fill again when W's
 * data changes in place (an EPLB slot rewritten).  A view with panels takes
 * the panel kernel at every M >= 16, oneDNN never.  Main thread only. */
size_t ms_kernels_panels_bytes(const ms_kctx *k, const ms_mat *W);
void ms_kernels_panels_fill(const ms_kctx *k, const ms_mat *W, void *dst);

/* One product of a batch: y[M][ldy] (=|+=) x[M][ldx] · Wᵀ, or x · W when nn
 * (the ms_matmul_nn product). */
typedef struct ms_mm_call {
    float *y;
    int64_t ldy;
    const float *x;
    int64_t ldx, M;
    const ms_mat *W;
    int accumulate;
    int nn;
} ms_mm_call;

/* Several independent ms_matmul / ms_matmul_nn products in one pool run
 * (grouped expert GEMMs, MLA's per-head absorption): each thread streams a
 * contiguous share of their output columns and steals small slices from
 * the others' at the end (matmul.c), so many small products cost one
 * hand-off instead of one each.  Results are identical to calling ms_matmul
 * (or ms_matmul_nn) on each. */
void ms_matmul_batch(const ms_kctx *k, const ms_mm_call *calls, int n);

/* y[M][W.cols] (=|+=) x[M][W.rows] · W   (no transpose; MLA absorption). */
void ms_matmul_nn(const ms_kctx *k, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
                  const ms_mat *W, int accumulate);
void ms_matmul_nn_ref(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
                      const ms_mat *W, int accumulate);

/* y[i] = w[i] * x[i] / sqrt(mean(x²) + eps) for each of M rows of n; w may be
 * NULL (unweighted).  x and y may alias. */
void ms_rmsnorm(float *y, const float *x, const float *w, int64_t M, int64_t n, int64_t ld,
                float eps);
void ms_rmsnorm_ref(float *y, const float *x, const float *w, int64_t M, int64_t n, int64_t ld,
                    float eps);

/* Interleaved (GPT-J) rotation of n_heads vectors of `dim` values, one every
 * `stride` floats: pair (x[2i], x[2i+1]) rotated by pos * inv_freq[i]. */
void ms_rope_interleaved(float *x, int64_t n_heads, int64_t stride, int64_t dim,
                         const float *inv_freq, int64_t pos);

/* In-place numerically stable softmax over n values. */
void ms_softmax(float *x, int64_t n);
void ms_softmax_ref(float *x, int64_t n);

/* out[i] = silu(g[i]) * u[i]. */
void ms_silu_mul(float *out, const float *g, const float *u, int64_t n);
void ms_silu_mul_ref(float *out, const float *g, const float *u, int64_t n);

/* Indices of the k largest values of x[n] (ties: lower index first), written
 * in descending value order.  k <= n.  The reference twin selects by repeated
 * scans (its order with NaNs is what both give). */
void ms_topk(const float *x, int64_t n, int k, int32_t *idx);
void ms_topk_ref(const float *x, int64_t n, int k, int32_t *idx);

/* Bulk conversions with the kernels' SIMD code (isa: MS_ISA_*, lower ISAs give
 * the same results).  ms_cvt_to_f32: F32/BF16/F16/F8E4M3 (FP8 unscaled) to
 * f32, exact.  ms_cvt_f32_to_bf16: round to nearest even (AVX512_BF16 flushes
 * f32 denormals to ±0).  ms_cvt_fp8_to_bf16: exact (every e4m3 value is a
 * bf16 value; NaN codes give the quiet NaN 0x7fc0 / 0xffc0). */
void ms_cvt_to_f32(int isa, ms_dtype dt, const void *in, float *out, int64_t n);
void ms_cvt_f32_to_bf16(int isa, const float *in, uint16_t *out, int64_t n);
void ms_cvt_fp8_to_bf16(int isa, const uint8_t *in, uint16_t *out, int64_t n);

/* The vector kernels below (vec.c) use AVX2 + FMA, the build baseline, with
 * FP32 sums in a different order than their _ref twins (about 1e-6
 * relative); exp is a polynomial within 2 ulp of expf. */
float ms_dot_f32(const float *a, const float *b, int64_t n);
float ms_dot_f32_ref(const float *a, const float *b, int64_t n);
/* y += a * x */
void ms_axpy_f32(float *y, float a, const float *x, int64_t n);
void ms_axpy_f32_ref(float *y, float a, const float *x, int64_t n);

#endif
