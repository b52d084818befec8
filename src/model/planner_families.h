/* planner_families.h — internal to src/model: the families whose shape and
 * cache streams are known but whose weights this engine cannot load yet
 * (planner_families.c): DeepSeek-V4 (until the V4 issue makes it loadable),
 * Qwen3-MoE and Llama-style GQA decoders.  Their open is NULL, so
 * ms_model_open refuses them naming the family.
 */
#ifndef MS_MODEL_PLANNER_FAMILIES_H
#define MS_MODEL_PLANNER_FAMILIES_H

#include "model/family.h"

extern const ms_family ms_family_deepseek_v4;
extern const ms_family ms_family_qwen3_moe;
extern const ms_family ms_family_llama;

#endif
