/* planner_families.c — shape parsers and cache streams of the planner-only
 * families (planner_families.h): Qwen3-MoE and Llama-style GQA, and the
 * config fields every decoder shares (ms_planner_parse_common, which the
 * DeepSeek-V4 family's parser starts from).  Fields and defaults as the HF
 * configs (reference/arch.md §2.2, §3).  No weights are read.  Pure
 * functions; any thread.
 */
#include "model/planner_families.h"

#include "model/config_json.h"

#include <string.h>

#define MAX_LAYERS MS_PLANNER_MAX_LAYERS

const char *ms_json_model_type(const json_t *root)
{
    return json_string_value(json_object_get(root, "model_type"));
}

int ms_json_has_arch(const json_t *root, const char *name)
{
    const json_t *a = json_object_get(root, "architectures");
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (s && !strcmp(s, name)) return 1;
    }
    return 0;
}

int ms_planner_parse_common(const json_t *root, ms_model_shape *m, ms_errbuf *err)
{
    ms_jget g = {root, "", err};
    const char *type = ms_json_model_type(root);
    snprintf(m->name, sizeof m->name, "%s", type ? type : "config.json");
    const int64_t big = INT64_C(1) << 24;
    int64_t v;
    int rc;
#define GET(key, lo, hi, def, dst)                                                                 \
    do {                                                                                           \
        if ((rc = ms_jget_int(&g, key, def, lo, hi, &v))) return rc;                               \
        dst = v;                                                                                   \
    } while (0)
    GET("vocab_size", 1, INT64_C(1) << 22, -1, m->vocab);
    GET("hidden_size", 1, INT64_C(1) << 17, -1, m->hidden);
    GET("num_hidden_layers", 1, MAX_LAYERS, -1, m->n_layers);
    GET("num_attention_heads", 1, 1 << 14, -1, m->n_heads);
    if (m->vocab < 0 || m->hidden < 0 || m->n_layers < 0 || m->n_heads < 0)
        return ms_err(err, MS_EFORMAT,
                      "config.json: vocab_size, hidden_size, num_hidden_layers "
                      "and num_attention_heads are required");
    GET("intermediate_size", 0, big, 0, m->intermediate);
    GET("moe_intermediate_size", 0, big, 0, m->moe_intermediate);
    GET("n_routed_experts", 0, 1 << 16, 0, m->n_routed);
    if (!m->n_routed) GET("num_experts", 0, 1 << 16, 0, m->n_routed); /* Qwen3-MoE */
    GET("n_shared_experts", 0, 64, 0, m->n_shared);
    GET("num_experts_per_tok", 0, 1 << 10, 0, m->topk);
    if (m->n_routed > 0 && (m->topk < 1 || m->topk > m->n_routed))
        return ms_err(err, MS_EFORMAT,
                      "config.json: num_experts_per_tok must be in 1..n_routed_experts");
    GET("first_k_dense_replace", 0, MAX_LAYERS, m->n_routed ? 0 : m->n_layers, m->first_k_dense);
    GET("moe_layer_freq", 1, MAX_LAYERS, 1, m->moe_layer_freq);
    GET("num_key_value_heads", 1, 1 << 14, m->n_heads, m->n_kv_heads);
    GET("head_dim", 1, 1 << 14, m->hidden / m->n_heads, m->head_dim);
    GET("q_lora_rank", 0, big, 0, m->q_lora_rank);
    GET("qk_rope_head_dim", 0, 1 << 14, 0, m->qk_rope);
    GET("max_position_embeddings", 1, INT64_C(1) << 34, 4096, m->max_context);
    GET("num_nextn_predict_layers", 0, 16, 0, m->n_mtp_layers);
#undef GET
    m->tie_embeddings = json_is_true(json_object_get(root, "tie_word_embeddings"));
    const char *tm = json_string_value(json_object_get(root, "topk_method"));
    m->router_bias = tm && !strcmp(tm, "noaux_tc");
    const json_t *q = json_object_get(root, "quantization_config");
    const char *qm = q ? json_string_value(json_object_get(q, "quant_method")) : NULL;
    if (qm && !strcmp(qm, "fp8")) {
        m->published = MS_WEIGHTS_FP8;
        const char *fmt = json_string_value(json_object_get(q, "scale_fmt"));
        if (fmt && !strcmp(fmt, "ue8m0")) m->fp8_scale_bytes = 1;
    }
    return 0;
}

/* ---- Llama-style GQA and Qwen3-MoE ---- */

static int gqa_parse(const json_t *root, ms_model_shape *m, ms_errbuf *err)
{
    int rc = ms_planner_parse_common(root, m, err);
    if (rc) return rc;
    const char *type = ms_json_model_type(root);
    m->attn = MS_ATTN_GQA;
    m->qk_norm = type && !strncmp(type, "qwen3", 5);
    return 0;
}

/* K and V of the rank's KV heads: SGLang's get_num_kv_heads, max(1, kv_heads / tp)
 * (replicated once the attention-TP width exceeds the KV heads). */
static int gqa_kv_spec(const ms_model_shape *s, const ms_kv_spec_opts *o, ms_kv_spec *out,
                       ms_errbuf *err)
{
    int b = o->elem_bytes > 0 ? o->elem_bytes : 2;
    double heads = (double)s->n_kv_heads / (o->attn_tp > 0 ? o->attn_tp : 1);
    if (heads < 1) heads = 1;
    ms_kv_spec_init(out, s->n_layers);
    int64_t elems = (int64_t)(2 * heads * s->head_dim);
    ms_kv_stream *st = ms_kv_spec_add(out, "kv", 2 * heads * s->head_dim * b, elems,
                                      b == 4   ? MS_DT_F32
                                      : b == 2 ? MS_DT_BF16
                                               : MS_DT_F8E4M3,
                                      1, 0, 0);
    for (int l = 0; l < s->n_layers; l++) ms_kv_stream_cover(st, l);
    return 0;
}

static int qwen3_match(const json_t *root)
{
    const char *t = ms_json_model_type(root);
    return (t && !strncmp(t, "qwen3", 5)) || ms_json_has_arch(root, "Qwen3MoeForCausalLM");
}

static int any_match(const json_t *root)
{
    return root != NULL;
}

const ms_family ms_family_qwen3_moe = {
    .name = "qwen3_moe",
    .models = "Qwen3-MoE",
    .match = qwen3_match,
    .parse = gqa_parse,
    .kv_spec = gqa_kv_spec,
};

const ms_family ms_family_llama = {
    .name = "llama",
    .models = "Llama-style GQA decoders",
    .match = any_match,
    .parse = gqa_parse,
    .kv_spec = gqa_kv_spec,
};
