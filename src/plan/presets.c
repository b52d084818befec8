/* presets.c — the planner's model and device presets (data tables) and its reader of HF
 * config.json files (DeepSeek V2/V3/V4, Qwen3-MoE, Llama-style GQA).  Owns what a
 * model and a device are to the planner; no arithmetic beyond layer classification.
 * Sources: reference/arch.md §1.1, §2.2, §3; the Qwen3/Llama shapes; the GPU
 * table of the issue (memory in 10^9 bytes, NVLink one direction).  Any thread.
 */
#include "plan/plan.h"

#include "base/util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void v4_ratios(ms_plan_model *m, int first0, int first1, int pairs, int last)
{
    int n = 0;
    m->compress_ratios[n++] = (int16_t)first0;
    m->compress_ratios[n++] = (int16_t)first1;
    for (int i = 0; i < pairs; i++) {
        m->compress_ratios[n++] = 4;
        m->compress_ratios[n++] = 128;
    }
    m->compress_ratios[n++] = (int16_t)last;
    m->n_ratios = n;
}

static void preset_dsv3(ms_plan_model *m)
{
    snprintf(m->name, sizeof m->name, "deepseek-v3");
    m->attn = MS_PLAN_MLA;
    m->vocab = 129280, m->hidden = 7168, m->intermediate = 18432, m->moe_intermediate = 2048;
    m->n_layers = 61, m->first_k_dense = 3, m->moe_layer_freq = 1;
    m->n_heads = 128, m->n_kv_heads = 0;
    m->q_lora_rank = 1536, m->kv_lora_rank = 512, m->qk_nope = 128, m->qk_rope = 64;
    m->v_head_dim = 128;
    m->n_routed = 256, m->n_shared = 1, m->topk = 8, m->router_bias = true;
    m->n_mtp_layers = 1, m->max_context = 163840;
    m->fp8_scale_bytes = 4, m->published = MS_WEIGHTS_FP8;
}

static void preset_v4(ms_plan_model *m, bool pro)
{
    snprintf(m->name, sizeof m->name, pro ? "deepseek-v4-pro" : "deepseek-v4-flash");
    m->attn = MS_PLAN_V4;
    m->vocab = 129280, m->hidden = pro ? 7168 : 4096, m->moe_intermediate = pro ? 3072 : 2048;
    m->n_layers = pro ? 61 : 43, m->first_k_dense = 0, m->moe_layer_freq = 1;
    m->n_heads = pro ? 128 : 64, m->n_kv_heads = 0, m->head_dim = 512, m->qk_rope = 64;
    m->q_lora_rank = pro ? 1536 : 1024;
    m->o_groups = pro ? 16 : 8, m->o_lora_rank = 1024, m->window = 128;
    m->index_n_heads = 64, m->index_head_dim = 128;
    m->n_routed = pro ? 384 : 256, m->n_shared = 1, m->topk = 6, m->router_bias = true;
    m->n_hash_layers = 3, m->hc_mult = 4;
    if (pro) v4_ratios(m, 128, 128, 29, 4); /* arch.md §2.2: [128,128] + [4,128]×29 + [4] */
    else v4_ratios(m, 0, 0, 20, 4);         /* [0,0] + [4,128]×20 + [4] */
    m->n_mtp_layers = 1, m->max_context = 1048576;
    m->fp8_scale_bytes = 1, m->published = MS_WEIGHTS_FP4_EXPERTS;
    /* Seed 000 §7.1: the Pro recipe declares about 960 GB minimum model VRAM. */
    m->recipe_min_weight_gb = pro ? 960.0 : 0.0;
}

static void preset_v2lite(ms_plan_model *m, bool moonlight)
{
    snprintf(m->name, sizeof m->name, moonlight ? "moonlight-16b-a3b" : "deepseek-v2-lite");
    m->attn = MS_PLAN_MLA;
    m->vocab = moonlight ? 163840 : 102400, m->hidden = 2048;
    m->intermediate = moonlight ? 11264 : 10944, m->moe_intermediate = 1408;
    m->n_layers = 27, m->first_k_dense = 1, m->moe_layer_freq = 1;
    m->n_heads = 16, m->n_kv_heads = 0;
    m->q_lora_rank = 0, m->kv_lora_rank = 512, m->qk_nope = 128, m->qk_rope = 64;
    m->v_head_dim = 128;
    m->n_routed = 64, m->n_shared = 2, m->topk = 6, m->router_bias = moonlight;
    m->max_context = moonlight ? 8192 : 163840;
    m->fp8_scale_bytes = 4, m->published = MS_WEIGHTS_BF16;
}

static void preset_qwen3(ms_plan_model *m)
{
    snprintf(m->name, sizeof m->name, "qwen3-235b-a22b");
    m->attn = MS_PLAN_GQA;
    m->vocab = 151936, m->hidden = 4096, m->intermediate = 12288, m->moe_intermediate = 1536;
    m->n_layers = 94, m->first_k_dense = 0, m->moe_layer_freq = 1;
    m->n_heads = 64, m->n_kv_heads = 4, m->head_dim = 128, m->qk_norm = true;
    m->n_routed = 128, m->n_shared = 0, m->topk = 8;
    m->max_context = 40960;
    m->fp8_scale_bytes = 4, m->published = MS_WEIGHTS_BF16;
}

static void preset_llama70(ms_plan_model *m)
{
    snprintf(m->name, sizeof m->name, "llama-3-70b");
    m->attn = MS_PLAN_GQA;
    m->vocab = 128256, m->hidden = 8192, m->intermediate = 28672;
    m->n_layers = 80, m->first_k_dense = 80, m->moe_layer_freq = 1;
    m->n_heads = 64, m->n_kv_heads = 8, m->head_dim = 128;
    m->max_context = 8192;
    m->fp8_scale_bytes = 4, m->published = MS_WEIGHTS_BF16;
}

static const struct {
    const char *name;
    void (*fn)(ms_plan_model *);
} model_presets[] = {
    {"deepseek-v3", preset_dsv3},
    {"deepseek-r1", preset_dsv3},
    {"deepseek-v4-flash", NULL},
    {"deepseek-v4-pro", NULL},
    {"deepseek-v2-lite", NULL},
    {"moonlight-16b-a3b", NULL},
    {"qwen3-235b-a22b", preset_qwen3},
    {"llama-3-70b", preset_llama70},
};

const char *ms_plan_model_names(void)
{
    return "deepseek-v3 (= deepseek-r1), deepseek-v4-flash, deepseek-v4-pro, deepseek-v2-lite, "
           "moonlight-16b-a3b, qwen3-235b-a22b, llama-3-70b";
}

int ms_plan_model_preset(const char *name, ms_plan_model *m, ms_errbuf *err)
{
    memset(m, 0, sizeof *m);
    for (size_t i = 0; i < MS_ARRAY_LEN(model_presets); i++) {
        if (strcasecmp(name, model_presets[i].name)) continue;
        if (model_presets[i].fn) model_presets[i].fn(m);
        else if (!strcasecmp(name, "deepseek-v4-flash")) preset_v4(m, false);
        else if (!strcasecmp(name, "deepseek-v4-pro")) preset_v4(m, true);
        else preset_v2lite(m, !strcasecmp(name, "moonlight-16b-a3b"));
        return 0;
    }
    return ms_err(err, MS_ENOENT, "--model '%s': unknown preset (known: %s)", name,
                  ms_plan_model_names());
}

static const ms_plan_gpu gpu_presets[] = {
    {"b200", 192, 900, MS_GPU_BLACKWELL},
    {"b300", 288, 900, MS_GPU_BLACKWELL},
    {"gb200", 186, 900, MS_GPU_BLACKWELL},
    {"gb300", 288, 900, MS_GPU_BLACKWELL},
    {"h100", 80, 450, MS_GPU_HOPPER},
    {"h200", 141, 450, MS_GPU_HOPPER},
    {"h20-96", 96, 450, MS_GPU_HOPPER},
    {"h20-141", 141, 450, MS_GPU_HOPPER},
    {"mi300x", 192, 0, MS_GPU_CDNA},
    {"mi355x", 288, 0, MS_GPU_CDNA},
    /* PCIe 5.0 x16, about 64 GB/s one direction; no NVLink on this card. */
    {"rtx-pro-6000", 96, 64, MS_GPU_BLACKWELL_DESKTOP},
    {"cpu", 0, 0, MS_GPU_CPU},
};

const char *ms_plan_gpu_names(void)
{
    return "b200, b300, gb200, gb300, h100, h200, h20-96, h20-141, mi300x, mi355x, rtx-pro-6000, "
           "cpu";
}

int ms_plan_gpu_preset(const char *name, ms_plan_gpu *out, ms_errbuf *err)
{
    for (size_t i = 0; i < MS_ARRAY_LEN(gpu_presets); i++)
        if (!strcasecmp(name, gpu_presets[i].name)) {
            *out = gpu_presets[i];
            return 0;
        }
    return ms_err(err, MS_ENOENT, "--gpu '%s': unknown preset (known: %s)", name,
                  ms_plan_gpu_names());
}

bool ms_plan_layer_is_moe(const ms_plan_model *m, int layer)
{
    int freq = m->moe_layer_freq > 0 ? m->moe_layer_freq : 1;
    return m->n_routed > 0 && layer >= m->first_k_dense && layer % freq == 0;
}

int ms_plan_n_moe_layers(const ms_plan_model *m)
{
    int n = 0;
    for (int l = 0; l < m->n_layers; l++) n += ms_plan_layer_is_moe(m, l);
    return n;
}

void ms_plan_layout_model(const ms_plan_model *m, ms_layout_model *out)
{
    out->n_heads = m->n_heads;
    out->n_kv_heads = m->attn == MS_PLAN_GQA ? m->n_kv_heads : 0;
    out->n_routed_experts = m->n_routed;
    out->n_layers = m->n_layers;
    out->n_dense_layers = m->n_layers - ms_plan_n_moe_layers(m);
}

/* ---- config.json ---------------------------------------------------------------- */

/* Reads an integer field; absent or null gives def.  Returns -1 on a wrong type/range. */
static int get_int(json_t *o, const char *key, long lo, long hi, long def, long *out,
                   ms_errbuf *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        ms_err(err, MS_EFORMAT, "config.json: '%s' must be an integer in %ld..%ld", key, lo, hi);
        return -1;
    }
    *out = (long)json_integer_value(v);
    return 0;
}

#define GET(key, lo, hi, def, dst)                                                                 \
    do {                                                                                           \
        long v_;                                                                                   \
        if (get_int(root, key, lo, hi, def, &v_, err)) goto bad;                                   \
        dst = v_;                                                                                  \
    } while (0)

int ms_plan_model_parse(const char *text, ms_plan_model *m, ms_errbuf *err)
{
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        if (root) json_decref(root);
        return ms_err(err, MS_EFORMAT, "config.json: %s (line %d)", root ? "not an object" : je.text,
                      je.line);
    }
    const char *type = json_string_value(json_object_get(root, "model_type"));
    snprintf(m->name, sizeof m->name, "%s", type ? type : "config.json");
    bool v4 = json_object_get(root, "compress_ratios") != NULL ||
              (type && !strcmp(type, "deepseek_v4"));
    bool mla = !v4 && json_object_get(root, "kv_lora_rank") &&
               !json_is_null(json_object_get(root, "kv_lora_rank"));
    m->attn = v4 ? MS_PLAN_V4 : mla ? MS_PLAN_MLA : MS_PLAN_GQA;
    const long big = 1L << 24;
    GET("vocab_size", 1, 1L << 22, -1, m->vocab);
    GET("hidden_size", 1, 1L << 17, -1, m->hidden);
    GET("num_hidden_layers", 1, MS_PLAN_MAX_LAYERS, -1, m->n_layers);
    GET("num_attention_heads", 1, 1 << 14, -1, m->n_heads);
    if (m->vocab < 0 || m->hidden < 0 || m->n_layers < 0 || m->n_heads < 0) {
        ms_err(err, MS_EFORMAT, "config.json: vocab_size, hidden_size, num_hidden_layers and "
                                "num_attention_heads are required");
        goto bad;
    }
    GET("intermediate_size", 0, big, 0, m->intermediate);
    GET("moe_intermediate_size", 0, big, 0, m->moe_intermediate);
    long experts = 0;
    GET("n_routed_experts", 0, 1 << 16, 0, experts);
    if (!experts) GET("num_experts", 0, 1 << 16, 0, experts); /* Qwen3-MoE */
    m->n_routed = (int)experts;
    GET("n_shared_experts", 0, 64, 0, m->n_shared);
    GET("num_experts_per_tok", 0, 1 << 10, 0, m->topk);
    if (m->n_routed > 0 && (m->topk < 1 || m->topk > m->n_routed)) {
        ms_err(err, MS_EFORMAT, "config.json: num_experts_per_tok must be in 1..n_routed_experts");
        goto bad;
    }
    GET("first_k_dense_replace", 0, MS_PLAN_MAX_LAYERS, m->n_routed ? 0 : m->n_layers,
        m->first_k_dense);
    GET("moe_layer_freq", 1, MS_PLAN_MAX_LAYERS, 1, m->moe_layer_freq);
    GET("num_key_value_heads", 1, 1 << 14, m->n_heads, m->n_kv_heads);
    GET("head_dim", 1, 1 << 14, m->hidden / m->n_heads, m->head_dim);
    GET("q_lora_rank", 0, big, 0, m->q_lora_rank);
    GET("kv_lora_rank", 0, big, 0, m->kv_lora_rank);
    GET("qk_nope_head_dim", 0, 1 << 14, 0, m->qk_nope);
    GET("qk_rope_head_dim", 0, 1 << 14, 0, m->qk_rope);
    GET("v_head_dim", 0, 1 << 14, 0, m->v_head_dim);
    GET("max_position_embeddings", 1, 1L << 34, 4096, m->max_context);
    GET("num_nextn_predict_layers", 0, 16, 0, m->n_mtp_layers);
    m->tie_embeddings = json_is_true(json_object_get(root, "tie_word_embeddings"));
    m->qk_norm = type && !strncmp(type, "qwen3", 5);
    const char *sf = json_string_value(json_object_get(root, "topk_method"));
    m->router_bias = sf && !strcmp(sf, "noaux_tc");
    m->fp8_scale_bytes = 4;
    m->published = MS_WEIGHTS_BF16;
    json_t *q = json_object_get(root, "quantization_config");
    const char *qm = q ? json_string_value(json_object_get(q, "quant_method")) : NULL;
    if (qm && !strcmp(qm, "fp8")) {
        m->published = MS_WEIGHTS_FP8;
        const char *fmt = json_string_value(json_object_get(q, "scale_fmt"));
        if (fmt && !strcmp(fmt, "ue8m0")) m->fp8_scale_bytes = 1;
    }
    if (m->attn != MS_PLAN_GQA) m->n_kv_heads = 0; /* one shared latent / KV */
    if (m->attn == MS_PLAN_MLA && m->kv_lora_rank < 1) {
        ms_err(err, MS_EFORMAT, "config.json: kv_lora_rank must be positive for MLA");
        goto bad;
    }
    if (v4) {
        m->n_kv_heads = 0;
        GET("o_groups", 1, 1 << 10, 1, m->o_groups);
        GET("o_lora_rank", 1, big, 1024, m->o_lora_rank);
        GET("sliding_window", 0, 1 << 20, 128, m->window);
        GET("index_n_heads", 0, 1 << 10, 64, m->index_n_heads);
        GET("index_head_dim", 0, 1 << 12, 128, m->index_head_dim);
        GET("num_hash_layers", 0, MS_PLAN_MAX_LAYERS, 0, m->n_hash_layers);
        GET("hc_mult", 1, 64, 4, m->hc_mult);
        json_t *r = json_object_get(root, "compress_ratios");
        if (!json_is_array(r) || json_array_size(r) < (size_t)m->n_layers ||
            json_array_size(r) > MS_PLAN_MAX_LAYERS) {
            ms_err(err, MS_EFORMAT, "config.json: compress_ratios must be an array of at least "
                                    "num_hidden_layers (%d) entries", m->n_layers);
            goto bad;
        }
        m->n_ratios = (int)json_array_size(r);
        for (int i = 0; i < m->n_ratios; i++) {
            json_t *e = json_array_get(r, (size_t)i);
            long v = json_is_integer(e) ? (long)json_integer_value(e) : -1;
            if (v != 0 && v != 4 && v != 128) {
                ms_err(err, MS_EFORMAT, "config.json: compress_ratios[%d] must be 0, 4 or 128", i);
                goto bad;
            }
            m->compress_ratios[i] = (int16_t)v;
        }
        const char *ed = json_string_value(json_object_get(root, "expert_dtype"));
        if (ed && !strcmp(ed, "fp4")) m->published = MS_WEIGHTS_FP4_EXPERTS;
    }
    json_decref(root);
    return 0;
bad:
    json_decref(root);
    return MS_EFORMAT;
}

int ms_plan_model_load(const char *path, ms_plan_model *m, ms_errbuf *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = ms_read_file(path, MS_PLAN_MAX_CONFIG_BYTES, &text, &len);
    if (rc) return ms_err(err, rc, "--model-config %s: %s", path, ms_strerror(rc));
    rc = ms_plan_model_parse(text, m, err);
    free(text);
    return rc;
}
