/* planner_families.h — internal to src/model: the families whose shape and
 * cache streams are known but whose weights this engine cannot load
 * (planner_families.c): Qwen3-MoE and Llama-style GQA decoders.  Their open
 * is NULL, so ms_model_open refuses them naming the family.  Also the config
 * fields every decoder shares, which the DeepSeek-V4 family reads the same way.
 */
#ifndef MS_MODEL_PLANNER_FAMILIES_H
#define MS_MODEL_PLANNER_FAMILIES_H

#include "model/family.h"

#define MS_PLANNER_MAX_LAYERS 1024 /* the planner's num_hidden_layers limit */

extern const ms_family ms_family_deepseek_v4; /* deepseek_v4.c */
extern const ms_family ms_family_qwen3_moe;
extern const ms_family ms_family_llama;

/* vocab, hidden, layers, heads, experts, head_dim, q_lora, rope, context,
 * MTP, tie, router bias, FP8 quantization: into m (errors name the field). */
struct json_t;
int ms_planner_parse_common(const struct json_t *root, ms_model_shape *m, ms_errbuf *err);
/* config.json's model_type (NULL when absent); whether architectures lists name. */
const char *ms_json_model_type(const struct json_t *root);
int ms_json_has_arch(const struct json_t *root, const char *name);

#endif
