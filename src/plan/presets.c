/* presets.c — the planner's model and device presets (data tables; a model preset is
 * config.json text, parsed by the family table like any --model-config file).  Owns
 * what a model and a device are to the planner; no arithmetic, no JSON reading.
 * Sources: reference/arch.md §1.1, §2.2, §3; the Qwen3/Llama shapes; the GPU
 * table of the issue (memory in 10^9 bytes, NVLink one direction).  Any thread.
 */
#include "plan/plan.h"

#include "base/util.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Model presets are config.json text, read by the same family parser as a
 * --model-config file or the engine's --model-path.  {R4} in a V4 preset
 * stands for its compress_ratios array (built by v4_ratios). */
#define V3_COMMON                                                                                  \
    "\"vocab_size\":129280,\"hidden_size\":7168,\"intermediate_size\":18432,"                      \
    "\"moe_intermediate_size\":2048,\"num_hidden_layers\":61,\"first_k_dense_replace\":3,"         \
    "\"moe_layer_freq\":1,\"num_attention_heads\":128,\"n_routed_experts\":256,"                   \
    "\"n_shared_experts\":1,\"num_experts_per_tok\":8,\"n_group\":8,\"topk_group\":4,"             \
    "\"topk_method\":\"noaux_tc\",\"q_lora_rank\":1536,\"kv_lora_rank\":512,"                      \
    "\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"v_head_dim\":128,"                         \
    "\"max_position_embeddings\":163840,\"num_nextn_predict_layers\":1,"                           \
    "\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","                          \
    "\"activation_scheme\":\"dynamic\",\"weight_block_size\":[128,128]}"
#define V2LITE_COMMON                                                                              \
    "\"hidden_size\":2048,\"moe_intermediate_size\":1408,\"num_hidden_layers\":27,"                \
    "\"first_k_dense_replace\":1,\"moe_layer_freq\":1,\"num_attention_heads\":16,"                 \
    "\"n_routed_experts\":64,\"n_shared_experts\":2,\"num_experts_per_tok\":6,\"n_group\":1,"      \
    "\"topk_group\":1,\"q_lora_rank\":null,\"kv_lora_rank\":512,\"qk_nope_head_dim\":128,"         \
    "\"qk_rope_head_dim\":64,\"v_head_dim\":128"
#define V4_COMMON                                                                                  \
    "\"model_type\":\"deepseek_v4\",\"vocab_size\":129280,\"first_k_dense_replace\":0,"            \
    "\"moe_layer_freq\":1,\"head_dim\":512,\"qk_rope_head_dim\":64,\"o_lora_rank\":1024,"          \
    "\"sliding_window\":128,\"index_n_heads\":64,\"index_head_dim\":128,\"n_shared_experts\":1,"   \
    "\"num_experts_per_tok\":6,\"topk_method\":\"noaux_tc\",\"num_hash_layers\":3,\"hc_mult\":4,"  \
    "\"max_position_embeddings\":1048576,\"num_nextn_predict_layers\":1,\"expert_dtype\":\"fp4\"," \
    "\"quantization_config\":{\"quant_method\":\"fp8\",\"scale_fmt\":\"ue8m0\"}"

static const struct {
    const char *name;
    const char *config;
    int v4_first, v4_pairs;      /* V4: compress_ratios [f, f] + [4, 128] × pairs + [4] */
    double recipe_min_weight_gb; /* seed 000 §7.1: the Pro recipe declares about 960 GB */
} model_presets[] = {
    {"deepseek-v3", "{\"model_type\":\"deepseek_v3\"," V3_COMMON "}", 0, 0, 0},
    {"deepseek-r1", "{\"model_type\":\"deepseek_v3\"," V3_COMMON "}", 0, 0, 0},
    {"deepseek-v4-flash",
     "{" V4_COMMON ",\"hidden_size\":4096,\"moe_intermediate_size\":2048,\"num_hidden_layers\":43,"
     "\"num_attention_heads\":64,\"q_lora_rank\":1024,\"o_groups\":8,\"n_routed_experts\":256,"
     "\"index_topk\":512,\"compress_ratios\":{R4}}",
     0, 20, 0},
    {"deepseek-v4-pro",
     "{" V4_COMMON ",\"hidden_size\":7168,\"moe_intermediate_size\":3072,\"num_hidden_layers\":61,"
     "\"num_attention_heads\":128,\"q_lora_rank\":1536,\"o_groups\":16,\"n_routed_experts\":384,"
     "\"index_topk\":1024,\"compress_ratios\":{R4}}",
     128, 29, 960.0},
    {"deepseek-v2-lite",
     "{\"model_type\":\"deepseek_v2\",\"vocab_size\":102400,\"intermediate_size\":10944,"
     "\"topk_method\":\"greedy\",\"max_position_embeddings\":163840," V2LITE_COMMON "}",
     0, 0, 0},
    {"moonlight-16b-a3b",
     "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v3\","
     "\"vocab_size\":163840,\"intermediate_size\":11264,\"topk_method\":\"noaux_tc\","
     "\"max_position_embeddings\":8192," V2LITE_COMMON "}",
     0, 0, 0},
    {"qwen3-235b-a22b",
     "{\"model_type\":\"qwen3_moe\",\"vocab_size\":151936,\"hidden_size\":4096,"
     "\"intermediate_size\":12288,\"moe_intermediate_size\":1536,\"num_hidden_layers\":94,"
     "\"num_attention_heads\":64,\"num_key_value_heads\":4,\"head_dim\":128,\"num_experts\":128,"
     "\"num_experts_per_tok\":8,\"max_position_embeddings\":40960}",
     0, 0, 0},
    {"llama-3-70b",
     "{\"model_type\":\"llama\",\"vocab_size\":128256,\"hidden_size\":8192,"
     "\"intermediate_size\":28672,\"num_hidden_layers\":80,\"num_attention_heads\":64,"
     "\"num_key_value_heads\":8,\"head_dim\":128,\"max_position_embeddings\":8192}",
     0, 0, 0},
};

const char *ms_plan_model_names(void)
{
    return "deepseek-v3 (= deepseek-r1), deepseek-v4-flash, deepseek-v4-pro, deepseek-v2-lite, "
           "moonlight-16b-a3b, qwen3-235b-a22b, llama-3-70b";
}

/* The preset's config text with {R4} replaced by its V4 layer program (arch.md §2.2:
 * Flash [0,0] + [4,128]×20 + [4]; Pro [128,128] + [4,128]×29 + [4]). */
static int preset_text(size_t i, char *buf, size_t cap)
{
    const char *t = model_presets[i].config, *r = strstr(t, "{R4}");
    if (!r) return snprintf(buf, cap, "%s", t) >= (int)cap;
    int n = snprintf(buf, cap, "%.*s[%d,%d", (int)(r - t), t, model_presets[i].v4_first,
                     model_presets[i].v4_first);
    for (int p = 0; p < model_presets[i].v4_pairs && n < (int)cap; p++)
        n += snprintf(buf + n, cap - (size_t)n, ",4,128");
    if (n < (int)cap) n += snprintf(buf + n, cap - (size_t)n, ",4]%s", r + 4);
    return n >= (int)cap;
}

int ms_plan_model_preset(const char *name, ms_plan_model *m, ms_errbuf *err)
{
    memset(m, 0, sizeof *m);
    for (size_t i = 0; i < MS_ARRAY_LEN(model_presets); i++) {
        if (strcasecmp(name, model_presets[i].name)) continue;
        char text[4096];
        if (preset_text(i, text, sizeof text))
            return ms_err(err, MS_EINTERNAL, "preset %s: config text too long", name);
        int rc = ms_family_parse(text, NULL, m, err);
        if (rc) return rc;
        snprintf(m->name, sizeof m->name, "%s", model_presets[i].name);
        m->recipe_min_weight_gb = model_presets[i].recipe_min_weight_gb;
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
    return ms_shape_layer_is_moe(m, layer);
}

int ms_plan_n_moe_layers(const ms_plan_model *m)
{
    return ms_shape_n_moe_layers(m);
}

void ms_plan_layout_model(const ms_plan_model *m, ms_layout_model *out)
{
    ms_shape_layout_model(m, out);
}

int ms_plan_model_parse(const char *text, ms_plan_model *m, ms_errbuf *err)
{
    return ms_family_parse(text, NULL, m, err);
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
