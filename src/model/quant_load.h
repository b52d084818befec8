/* quant_load.h — binding DeepSeek-V4's quantised checkpoint tensors to
 * kernel views (arch.md §0.6, §0.7): FP4 e2m1 routed experts stored as I8
 * (two codes per byte, low nibble = even column) with per-32 F8_E8M0 (UE8M0)
 * scales, and UE8M0 128×128 block scales of FP8 e4m3 matrices as the f32
 * multipliers ms_mat takes.  Views point into the store's read-only mmap
 * (no copies); the store must outlive them.  Start-up, any one thread.
 */
#ifndef MS_MODEL_QUANT_LOAD_H
#define MS_MODEL_QUANT_LOAD_H

#include "base/error.h"
#include "kernels/kernels.h"
#include "model/safetensors.h"

#include <stdint.h>

/* The FP4 matrix `name` (ending in ".weight") of logical shape [rows][cols]:
 * checks `name` is I8 [rows][cols / 2] and its sibling "<module>.scale"
 * (".weight" replaced) is F8_E8M0 [rows][cols / 32], cols a positive
 * multiple of 32, and that no scale byte is 255 (NaN); then *out is an
 * MS_DT_F4E2M1 view (ms_mat_fp4) of both.  Errors name the file, the tensor
 * and expected vs actual (MS_ENOENT missing, MS_EFORMAT wrong shape, dtype
 * or a NaN scale at its row and column).  For V4 `ffn.experts.E.w{1,2,3}`. */
int ms_load_fp4_mat(const ms_st_store *st, const char *name, int64_t rows, int64_t cols,
                    ms_mat *out, ms_errbuf *err);

/* 1 when tensor `name` is stored as FP4 codes (I8), 0 otherwise (absent or
 * another dtype): lets a loader choose between ms_load_fp4_mat and its FP8 /
 * BF16 path for the same name. */
int ms_st_is_fp4(const ms_st_store *st, const char *name);

/* out[i] = 2^(s[i] - 127) for the n UE8M0 bytes of scale tensor s (exact);
 * MS_EFORMAT naming s and the element when a byte is 255 (NaN). */
int ms_e8m0_scales_to_f32(const ms_tensor *s, float *out, int64_t n, ms_errbuf *err);

#endif
