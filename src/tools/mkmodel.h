/* mkmodel.h — seeded random DeepSeek checkpoints in the Hugging Face layout
 * (config.json, safetensors, tokenizer.json), for tests and benchmarks.
 * V3 family (mkmodel.c): tiny-v3 (fast tests), tiny-v2 (V2 routing, no
 * q-LoRA), small-v3 (the benchmark shape, ~813 M parameters).  DeepSeek-V4
 * (mkmodel_v4.c, the official tensor names): tiny-v4 (tests: ratios 0/4/128,
 * window 8, hash layers, an MTP block, divisible for TP 4 and EP 4) and
 * small-v4 (the benchmark shape).  Main thread only.
 */
#ifndef MS_TOOLS_MKMODEL_H
#define MS_TOOLS_MKMODEL_H

#include "base/error.h"
#include "model/config.h"

#include <stdint.h>

enum ms_mk_dtype { MS_MK_BF16 = 0, MS_MK_FP32 = 1, MS_MK_FP8 = 2, MS_MK_FP8_FP4 = 3 };

/* Fills cfg with a named preset; MS_ENOENT for an unknown name. */
int ms_mkmodel_preset(const char *name, ms_config *cfg);
/* Writes the checkpoint directory (created if missing). */
int ms_mkmodel_write(const ms_config *cfg, int dtype, uint64_t seed, const char *out_dir,
                     int64_t shard_bytes, ms_errbuf *err);
/* The same with a skewed router (--route-skew S > 0; mkmodel_skew.c): every MoE
 * layer's e_score_correction_bias is calibrated so expert e's share of the routed
 * hits is ∝ (e + 1)^-S.  Needs the noaux_tc router (a correction bias); MS_EINVAL
 * otherwise. */
int ms_mkmodel_write_skewed(const ms_config *cfg, int dtype, uint64_t seed, double route_skew,
                            const char *out_dir, int64_t shard_bytes, ms_errbuf *err);
/* The calibration: bias[E] for the gate weights gate[E][D] (as the server reads them);
 * *max_err: the largest |share - target| on the calibration inputs.  0 or MS_ENOMEM. */
int ms_mkmodel_skew_bias(const ms_config *c, const float *gate, double S, uint64_t seed,
                         float *bias, double *max_err);

/* The tokenizer.json + tokenizer_config.json of every preset (the one place a
 * family's special tokens would be added). */
int ms_mkmodel_write_tokenizer(const char *dir, int64_t vocab, ms_errbuf *err);
int ms_mkmodel_mkdir_p(const char *path);

/* DeepSeek-V4 presets: 1 when name is one ("tiny-v4", "small-v4"). */
int ms_mkmodel_v4_is_preset(const char *name);
/* Writes a V4 preset's checkpoint (MS_MK_FP8_FP4: FP4 routed experts, FP8 elsewhere). */
int ms_mkmodel_v4_write(const char *preset, int dtype, uint64_t seed, const char *out_dir,
                        int64_t shard_bytes, ms_errbuf *err);

#endif
