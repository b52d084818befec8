/* planner_families.c — shape parsers and cache streams of the planner-only
 * families (planner_families.h): DeepSeek-V4 (compressed attention with a
 * sliding window, arch.md §2), Qwen3-MoE and Llama-style GQA.  Fields and
 * defaults as the HF configs (reference/arch.md §2.2, §3); deployed V4 entry
 * formats from arch.md §2.11 and seed 000 §7.2.  No weights are read.
 * Pure functions; any thread.
 */
#include "model/planner_families.h"

#include "model/config_json.h"

#include <string.h>

/* V4 deployed entry formats: a 584-byte main entry (448 FP8 + 64 BF16 rope +
 * 7 UE8M0 + 1 pad) and a 68-byte MXFP4 index key (64 B + 4 UE8M0). */
#define V4_MAIN_ENTRY 584.0
#define V4_INDEX_KEY 68.0
#define MAX_LAYERS 1024 /* the planner's num_hidden_layers limit */

static const char *model_type(const json_t *root)
{
    return json_string_value(json_object_get(root, "model_type"));
}

static int has_arch(const json_t *root, const char *name)
{
    const json_t *a = json_object_get(root, "architectures");
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (s && !strcmp(s, name)) return 1;
    }
    return 0;
}

/* The fields every decoder shares (as the planner has always read them). */
static int parse_common(const json_t *root, ms_model_shape *m, ms_errbuf *err)
{
    ms_jget g = {root, "", err};
    const char *type = model_type(root);
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
        return ms_err(err, MS_EFORMAT, "config.json: vocab_size, hidden_size, num_hidden_layers "
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
    int rc = parse_common(root, m, err);
    if (rc) return rc;
    const char *type = model_type(root);
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
                                      b == 4 ? MS_DT_F32 : b == 2 ? MS_DT_BF16 : MS_DT_F8E4M3, 1,
                                      0, 0);
    for (int l = 0; l < s->n_layers; l++) ms_kv_stream_cover(st, l);
    return 0;
}

static int qwen3_match(const json_t *root)
{
    const char *t = model_type(root);
    return (t && !strncmp(t, "qwen3", 5)) || has_arch(root, "Qwen3MoeForCausalLM");
}

static int any_match(const json_t *root) { return root != NULL; }

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

/* ---- DeepSeek-V4 ---- */

static int v4_match(const json_t *root)
{
    const char *t = model_type(root);
    return json_object_get(root, "compress_ratios") != NULL || (t && !strcmp(t, "deepseek_v4")) ||
           has_arch(root, "DeepseekV4ForCausalLM");
}

static int v4_parse(const json_t *root, ms_model_shape *m, ms_errbuf *err)
{
    int rc = parse_common(root, m, err);
    if (rc) return rc;
    ms_jget g = {root, "", err};
    const int64_t big = INT64_C(1) << 24;
    int64_t v;
    m->attn = MS_ATTN_V4;
    m->n_kv_heads = 0; /* one shared KV */
    GET("o_groups", 1, 1 << 10, 1, m->o_groups);
    GET("o_lora_rank", 1, big, 1024, m->o_lora_rank);
    GET("sliding_window", 0, 1 << 20, 128, m->window);
    GET("index_n_heads", 0, 1 << 10, 64, m->index_n_heads);
    GET("index_head_dim", 0, 1 << 12, 128, m->index_head_dim);
    GET("num_hash_layers", 0, MAX_LAYERS, 0, m->n_hash_layers);
    GET("hc_mult", 1, 64, 4, m->hc_mult);
#undef GET
    const json_t *r = json_object_get(root, "compress_ratios");
    if (!json_is_array(r) || json_array_size(r) < (size_t)m->n_layers ||
        json_array_size(r) > MAX_LAYERS)
        return ms_err(err, MS_EFORMAT,
                      "config.json: compress_ratios must be an array of at least "
                      "num_hidden_layers (%d) entries",
                      m->n_layers);
    m->n_ratios = (int)json_array_size(r);
    for (int i = 0; i < m->n_ratios; i++) {
        const json_t *e = json_array_get(r, (size_t)i);
        long x = json_is_integer(e) ? (long)json_integer_value(e) : -1;
        if (x != 0 && x != 4 && x != 128)
            return ms_err(err, MS_EFORMAT, "config.json: compress_ratios[%d] must be 0, 4 or 128",
                          i);
        m->compress_ratios[i] = (int16_t)x;
    }
    const char *ed = json_string_value(json_object_get(root, "expert_dtype"));
    if (ed && !strcmp(ed, "fp4")) m->published = MS_WEIGHTS_FP4_EXPERTS;
    return 0;
}

/* Every layer a window of main entries (plus the verify's draft slack); CSA
 * layers (ratio 4) one main entry and one index key per 4 tokens; HCA layers
 * (ratio 128) one main entry per 128 tokens.  State: each compressed layer's
 * kv_state + score_state, each [c'·m, c'·d] (c' = 2 for ratio 4), and the
 * CSA indexer's own pair (arch.md §2.7). */
static int v4_kv_spec(const ms_model_shape *s, const ms_kv_spec_opts *o, ms_kv_spec *out,
                      ms_errbuf *err)
{
    ms_kv_spec_init(out, s->n_layers);
    ms_kv_stream *win = ms_kv_spec_add(out, "window", V4_MAIN_ENTRY, (int64_t)V4_MAIN_ENTRY,
                                       MS_DT_U8, 1, s->window, o->draft_tokens);
    ms_kv_stream *c4 =
        ms_kv_spec_add(out, "c4", V4_MAIN_ENTRY, (int64_t)V4_MAIN_ENTRY, MS_DT_U8, 4, 0, 0);
    ms_kv_stream *c128 =
        ms_kv_spec_add(out, "c128", V4_MAIN_ENTRY, (int64_t)V4_MAIN_ENTRY, MS_DT_U8, 128, 0, 0);
    ms_kv_stream *idx =
        ms_kv_spec_add(out, "index", V4_INDEX_KEY, (int64_t)V4_INDEX_KEY, MS_DT_U8, 4, 0, 0);
    double sb = o->state_bytes;
    for (int l = 0; l < s->n_layers; l++) {
        int ratio = l < s->n_ratios ? s->compress_ratios[l] : 0;
        ms_kv_stream_cover(win, l);
        if (ratio == 4) ms_kv_stream_cover(c4, l), ms_kv_stream_cover(idx, l);
        if (ratio == 128) ms_kv_stream_cover(c128, l);
        if (!ratio) continue;
        double c = ratio == 4 ? 2 : 1, st = 2 * (c * ratio) * (c * s->head_dim);
        if (ratio == 4) st += 2 * (2.0 * 4) * (2.0 * s->index_head_dim);
        ms_kv_spec_add_state(out, l, st * sb);
    }
    return 0;
}

const ms_family ms_family_deepseek_v4 = {
    .name = "deepseek_v4",
    .models = "DeepSeek-V4 Flash/Pro",
    .match = v4_match,
    .parse = v4_parse,
    .kv_spec = v4_kv_spec,
};
