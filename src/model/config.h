/* config.h — a DeepSeek-V2/V3-family model configuration (HF config.json).
 *
 * Owns parsing and validating config.json into ms_config; knows nothing about
 * tensors.  Field meanings follow reference/arch.md §1.1.  Pure data; any thread.
 */
#ifndef MS_MODEL_CONFIG_H
#define MS_MODEL_CONFIG_H

#include "base/error.h"

#include <stdbool.h>
#include <stdint.h>

/* Limits on client-controlled sizes (a config.json is input). */
#define MS_CONFIG_MAX_BYTES     (1u << 20) /* config.json file size */
#define MS_CONFIG_MAX_VOCAB     (1 << 24)
#define MS_CONFIG_MAX_WIDTH     (1 << 20) /* hidden / intermediate / lora sizes */
#define MS_CONFIG_MAX_LAYERS    4096
#define MS_CONFIG_MAX_HEADS     4096
#define MS_CONFIG_MAX_EXPERTS   65536
#define MS_CONFIG_MAX_HEAD_DIM  4096
#define MS_CONFIG_MAX_POSITIONS (INT64_C(1) << 32)

enum ms_score_func {
    MS_SCORE_SOFTMAX = 0,
    MS_SCORE_SIGMOID = 1,
    MS_SCORE_SQRTSOFTPLUS = 2 /* V4 */
};
enum ms_topk_method { MS_TOPK_GREEDY = 0, MS_TOPK_GROUP_LIMITED = 1, MS_TOPK_NOAUX_TC = 2 };

typedef struct ms_config {
    char architecture[64]; /* DeepseekV2ForCausalLM | DeepseekV3ForCausalLM */
    char model_type[32];   /* deepseek_v2 | deepseek_v3 */
    int64_t vocab_size;
    int64_t hidden_size;           /* D */
    int64_t intermediate_size;     /* dense FFN width */
    int64_t moe_intermediate_size; /* routed / shared expert width */
    int n_layers;                  /* num_hidden_layers (main stack) */
    int first_k_dense_replace;
    int moe_layer_freq;
    int n_heads;          /* num_attention_heads */
    int n_kv_heads;       /* num_key_value_heads (unused by MLA) */
    int n_routed_experts; /* E (0: no MoE) */
    int n_shared_experts;
    int n_experts_per_tok; /* top-k */
    int n_group, topk_group;
    int topk_method;  /* enum ms_topk_method */
    int scoring_func; /* enum ms_score_func */
    bool norm_topk_prob;
    float routed_scaling_factor;
    float swiglu_limit; /* V4: gate = min(g, L), up = clamp(u, -L, L); 0: none */
    int q_lora_rank;    /* 0 when null: direct q_proj */
    int kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    float rms_norm_eps;
    float rope_theta;
    /* rope_scaling (yarn); rope_yarn = false means plain RoPE */
    bool rope_yarn;
    float rope_factor;
    int64_t rope_original_max_pos;
    float rope_beta_fast, rope_beta_slow;
    float rope_mscale, rope_mscale_all_dim;
    int64_t max_position_embeddings;
    int num_nextn_predict_layers;       /* MTP layers stored after the main stack */
    int64_t bos_token_id, eos_token_id; /* -1 when absent */
    bool tie_word_embeddings;
    /* quantization_config (fp8 block) */
    bool fp8_block;       /* quant_method fp8 with weight_block_size [128,128] */
    bool fp8_scale_ue8m0; /* scale_fmt "ue8m0" */
    int weight_block[2];
} ms_config;

/* Parses config.json text / file.  Unknown fields are ignored; missing required
 * fields, wrong types and inconsistent values are errors naming the field. */
int ms_config_parse(ms_config *cfg, const char *json_text, ms_errbuf *err);
int ms_config_load(ms_config *cfg, const char *path, ms_errbuf *err);

/* Writes cfg as an HF config.json (used by mkmodel); ms_config_parse reads
 * it back to an identical ms_config.  ms_config_to_json returns the same text
 * (owned by the caller, free()) or NULL with err set. */
int ms_config_write(const ms_config *cfg, const char *path, ms_errbuf *err);
char *ms_config_to_json(const ms_config *cfg, ms_errbuf *err);
/* YaRN attention factor HF applies to cos/sin: get_mscale(s, mscale) /
 * get_mscale(s, mscale_all_dim) (1.0 for every shipped config; 1.0 without YaRN). */
float ms_config_rope_attn_factor(const ms_config *c);

/* Derived quantities. */
static inline bool ms_config_layer_is_moe(const ms_config *c, int layer)
{
    return c->n_routed_experts > 0 && layer >= c->first_k_dense_replace &&
           layer % (c->moe_layer_freq > 0 ? c->moe_layer_freq : 1) == 0;
}
static inline int ms_config_qk_head_dim(const ms_config *c)
{
    return c->qk_nope_head_dim + c->qk_rope_head_dim;
}
/* MLA softmax scale: (dn+dr)^-1/2 · m², m = 0.1·mscale_all_dim·ln(factor) + 1 under YaRN. */
float ms_config_softmax_scale(const ms_config *c);
/* YaRN (or plain) inverse frequencies for the rope dims: out[qk_rope_head_dim/2]. */
void ms_config_rope_inv_freq(const ms_config *c, float *out);

#endif
