/* config.c — DeepSeek-V2/V3-family config.json: parse, validate, write, and
 * the derived RoPE/YaRN table and MLA softmax scale (reference/arch.md §0.4,
 * §0.5, §1.1).
 *
 * Owns only the translation between JSON text and ms_config; knows nothing
 * about tensors.  The fields tensor shapes depend on are required
 * (need_shape_fields); defaults for the other absent fields are those of
 * transformers' DeepseekV3Config / DeepseekV2Config (fields they lack come
 * from DeepSeek's own configuration_deepseek.py); each is noted where it is
 * set.  Pure
 * functions; any thread.
 */
#include "model/config.h"
#include "model/config_json.h"

#include "base/util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ms_json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* Absent or null fields keep *out = def.  Integers must be JSON integers. */
int ms_jget_int(ms_jget *g, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    const json_t *v = json_object_get(g->obj, key);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v))
        return ms_err(g->err, MS_EFORMAT, "config: '%s%s' must be an integer, not %s", g->prefix,
                      key, ms_json_type_name(v));
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ms_err(g->err, MS_ERANGE, "config: '%s%s' is %lld, must be between %lld and %lld",
                      g->prefix, key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

int ms_jget_i32(ms_jget *g, const char *key, int def, int lo, int hi, int *out)
{
    int64_t v;
    int rc = ms_jget_int(g, key, def, lo, hi, &v);
    *out = (int)v;
    return rc;
}

/* A finite number in [lo, hi] (integers accepted). */
int ms_jget_num(ms_jget *g, const char *key, double def, double lo, double hi, float *out)
{
    const json_t *v = json_object_get(g->obj, key);
    *out = (float)def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return ms_err(g->err, MS_EFORMAT, "config: '%s%s' must be a number, not %s", g->prefix, key,
                      ms_json_type_name(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) /* before the cast: a double beyond float range is UB */
        return ms_err(g->err, MS_ERANGE, "config: '%s%s' is %g, must be between %g and %g",
                      g->prefix, key, x, lo, hi);
    *out = (float)x;
    return 0;
}

int ms_jget_bool(ms_jget *g, const char *key, bool def, bool *out)
{
    const json_t *v = json_object_get(g->obj, key);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return ms_err(g->err, MS_EFORMAT, "config: '%s%s' must be true or false, not %s", g->prefix,
                      key, ms_json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

/* *out = NULL when absent or null. */
int ms_jget_str(ms_jget *g, const char *key, const char **out)
{
    const json_t *v = json_object_get(g->obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return ms_err(g->err, MS_EFORMAT, "config: '%s%s' must be a string, not %s", g->prefix, key,
                      ms_json_type_name(v));
    *out = json_string_value(v);
    return 0;
}

static int parse_arch(const json_t *root, ms_config *c, ms_errbuf *err)
{
    const json_t *a = json_object_get(root, "architectures");
    const char *mt = NULL;
    ms_jget g = {root, "", err};
    int rc = ms_jget_str(&g, "model_type", &mt);
    if (rc) return rc;
    if (mt && strlen(mt) >= sizeof c->model_type)
        return ms_err(err, MS_EFORMAT, "config: 'model_type' is too long");
    const char *arch = NULL;
    if (a && !json_is_null(a)) {
        if (!json_is_array(a) || json_array_size(a) == 0)
            return ms_err(err, MS_EFORMAT, "config: 'architectures' must be a non-empty array");
        for (size_t i = 0; i < json_array_size(a) && !arch; i++) {
            const char *s = json_string_value(json_array_get(a, i));
            if (s && (!strcmp(s, "DeepseekV2ForCausalLM") || !strcmp(s, "DeepseekV3ForCausalLM")))
                arch = s;
        }
        if (!arch) {
            const char *s = json_string_value(json_array_get(a, 0));
            return ms_err(err, MS_EUNSUPPORTED,
                          "config: 'architectures' is [\"%.60s\"%s], expected "
                          "DeepseekV2ForCausalLM or DeepseekV3ForCausalLM",
                          s ? s : "?", json_array_size(a) > 1 ? ", ..." : "");
        }
    } else if (mt && !strcmp(mt, "deepseek_v2")) {
        arch = "DeepseekV2ForCausalLM";
    } else if (mt && !strcmp(mt, "deepseek_v3")) {
        arch = "DeepseekV3ForCausalLM";
    } else {
        return ms_err(err, MS_EFORMAT,
                      "config: 'architectures' is missing and 'model_type' is not deepseek_v2 "
                      "or deepseek_v3");
    }
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    /* model_type is kept as given (Kimi-K2 ships DeepseekV3ForCausalLM with "kimi_k2") */
    snprintf(c->model_type, sizeof c->model_type, "%s",
             mt ? mt : (strstr(arch, "V2") ? "deepseek_v2" : "deepseek_v3"));
    return 0;
}

static int parse_rope(const json_t *root, ms_config *c, ms_errbuf *err)
{
    /* transformers 5 writes "rope_parameters" (with rope_theta inside) */
    const json_t *rs = json_object_get(root, "rope_scaling");
    const char *field = "rope_scaling";
    if (!rs || json_is_null(rs)) {
        rs = json_object_get(root, "rope_parameters");
        field = "rope_parameters";
    }
    c->rope_yarn = false;
    c->rope_factor = 1.0f;
    c->rope_original_max_pos = 0;
    c->rope_beta_fast = c->rope_beta_slow = 0.0f;
    c->rope_mscale = c->rope_mscale_all_dim = 0.0f;
    if (!rs || json_is_null(rs)) return 0;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", field);
    if (!json_is_object(rs))
        return ms_err(err, MS_EFORMAT, "config: '%s' must be an object or null, not %s", field,
                      ms_json_type_name(rs));
    ms_jget g = {rs, prefix, err};
    const char *type = NULL;
    int rc = ms_jget_str(&g, "type", &type);
    if (!rc && !type) rc = ms_jget_str(&g, "rope_type", &type);
    if (rc) return rc;
    if (json_object_get(rs, "rope_theta")) {
        rc = ms_jget_num(&g, "rope_theta", 10000.0, 1.0 + 1e-6, 1e12, &c->rope_theta);
        if (rc) return rc;
    }
    if (!type || !strcmp(type, "default")) {
        if (!strcmp(field, "rope_parameters")) return 0;
        return ms_err(err, MS_EFORMAT, "config: 'rope_scaling.type' is missing");
    }
    if (strcmp(type, "yarn"))
        return ms_err(err, MS_EUNSUPPORTED,
                      "config: '%stype' is \"%.40s\"; only yarn (or null) is supported", prefix,
                      type);
    c->rope_yarn = true;
    if (!json_object_get(rs, "factor"))
        return ms_err(err, MS_EFORMAT, "config: '%sfactor' is required for yarn", prefix);
    /* defaults as HF's yarn code: original length = max_position_embeddings,
     * beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 0 */
    if ((rc = ms_jget_num(&g, "factor", 1.0, 1.0, 1e6, &c->rope_factor)) ||
        (rc = ms_jget_int(&g, "original_max_position_embeddings", c->max_position_embeddings, 1,
                          MS_CONFIG_MAX_POSITIONS, &c->rope_original_max_pos)) ||
        (rc = ms_jget_num(&g, "beta_fast", 32.0, 1e-6, 1e6, &c->rope_beta_fast)) ||
        (rc = ms_jget_num(&g, "beta_slow", 1.0, 1e-6, 1e6, &c->rope_beta_slow)) ||
        (rc = ms_jget_num(&g, "mscale", 1.0, 0.0, 1e3, &c->rope_mscale)) ||
        (rc = ms_jget_num(&g, "mscale_all_dim", 0.0, 0.0, 1e3, &c->rope_mscale_all_dim)))
        return rc;
    return 0;
}

static int parse_quant(const json_t *root, ms_config *c, ms_errbuf *err)
{
    const json_t *q = json_object_get(root, "quantization_config");
    c->fp8_block = false;
    c->fp8_scale_ue8m0 = false;
    c->weight_block[0] = c->weight_block[1] = 0;
    if (!q || json_is_null(q)) return 0;
    if (!json_is_object(q))
        return ms_err(err, MS_EFORMAT, "config: 'quantization_config' must be an object");
    ms_jget g = {q, "quantization_config.", err};
    const char *method, *fmt, *act, *scale_fmt;
    int rc;
    if ((rc = ms_jget_str(&g, "quant_method", &method)) || (rc = ms_jget_str(&g, "fmt", &fmt)) ||
        (rc = ms_jget_str(&g, "activation_scheme", &act)) ||
        (rc = ms_jget_str(&g, "scale_fmt", &scale_fmt)))
        return rc;
    /* scale_fmt ue8m0 (DeepSeek-V3.1): the F32 scales hold powers of two; the
     * planner counts them as one byte each, as the deployed format stores them */
    c->fp8_scale_ue8m0 = scale_fmt && !strcmp(scale_fmt, "ue8m0");
    if (!method || strcmp(method, "fp8"))
        return ms_err(err, MS_EUNSUPPORTED,
                      "config: 'quantization_config.quant_method' is \"%.40s\"; only fp8 is "
                      "supported",
                      method ? method : "(missing)");
    if (fmt && strcmp(fmt, "e4m3"))
        return ms_err(err, MS_EUNSUPPORTED,
                      "config: 'quantization_config.fmt' is \"%.40s\"; only e4m3 is supported",
                      fmt);
    if (act && strcmp(act, "dynamic"))
        return ms_err(err, MS_EUNSUPPORTED,
                      "config: 'quantization_config.activation_scheme' is \"%.40s\"; only dynamic "
                      "is supported",
                      act);
    /* absent weight_block_size: transformers' FineGrainedFP8Config default (128, 128) */
    const json_t *b = json_object_get(q, "weight_block_size");
    int64_t bs[2] = {128, 128};
    if (b && !json_is_null(b)) {
        if (!json_is_array(b) || json_array_size(b) != 2 ||
            !json_is_integer(json_array_get(b, 0)) || !json_is_integer(json_array_get(b, 1)))
            return ms_err(err, MS_EFORMAT,
                          "config: 'quantization_config.weight_block_size' must be [rows, cols]");
        bs[0] = json_integer_value(json_array_get(b, 0));
        bs[1] = json_integer_value(json_array_get(b, 1));
    }
    if (bs[0] != 128 || bs[1] != 128)
        return ms_err(err, MS_EUNSUPPORTED,
                      "config: 'quantization_config.weight_block_size' is [%lld, %lld]; only "
                      "[128, 128] is supported",
                      (long long)bs[0], (long long)bs[1]);
    c->fp8_block = true;
    c->weight_block[0] = c->weight_block[1] = 128;
    return 0;
}

/* Enum-valued string fields. */
static int parse_enums(ms_jget *g, bool v3, ms_config *c)
{
    const char *sf, *tm, *act;
    int rc;
    if ((rc = ms_jget_str(g, "scoring_func", &sf)) || (rc = ms_jget_str(g, "topk_method", &tm)) ||
        (rc = ms_jget_str(g, "hidden_act", &act)))
        return rc;
    /* scoring_func, topk_method: not DeepseekV3Config fields; DeepSeek's V3
     * configuration defaults sigmoid / noaux_tc, V2's softmax / greedy */
    if (!sf)
        c->scoring_func = v3 ? MS_SCORE_SIGMOID : MS_SCORE_SOFTMAX;
    else if (!strcmp(sf, "softmax"))
        c->scoring_func = MS_SCORE_SOFTMAX;
    else if (!strcmp(sf, "sigmoid"))
        c->scoring_func = MS_SCORE_SIGMOID;
    else
        return ms_err(g->err, MS_EUNSUPPORTED,
                      "config: 'scoring_func' is \"%.40s\"; expected softmax or sigmoid", sf);
    if (!tm)
        c->topk_method = v3 ? MS_TOPK_NOAUX_TC : MS_TOPK_GREEDY;
    else if (!strcmp(tm, "greedy"))
        c->topk_method = MS_TOPK_GREEDY;
    else if (!strcmp(tm, "group_limited_greedy"))
        c->topk_method = MS_TOPK_GROUP_LIMITED;
    else if (!strcmp(tm, "noaux_tc"))
        c->topk_method = MS_TOPK_NOAUX_TC;
    else
        return ms_err(g->err, MS_EUNSUPPORTED,
                      "config: 'topk_method' is \"%.40s\"; expected greedy, group_limited_greedy "
                      "or noaux_tc",
                      tm);
    if (act && strcmp(act, "silu"))
        return ms_err(g->err, MS_EUNSUPPORTED, "config: 'hidden_act' is \"%.40s\"; only silu", act);
    return 0;
}

/* The fields every tensor shape depends on have no default: a config.json
 * without one is refused naming it (a silent 7168 made the error name a
 * tensor shape instead).  null_ok: null is a value of its own (q_lora_rank
 * null: a direct q_proj; n_routed_experts null: a dense model). */
static int need(ms_jget *g, const char *key, int null_ok)
{
    const json_t *v = json_object_get(g->obj, key);
    if (!v) return ms_err(g->err, MS_EFORMAT, "config: '%s' is required (absent)", key);
    if (json_is_null(v) && !null_ok)
        return ms_err(g->err, MS_EFORMAT, "config: '%s' is required (null)", key);
    return 0;
}

static int need_shape_fields(ms_jget *g)
{
    static const char *const always[] = {"vocab_size",          "hidden_size",  "num_hidden_layers",
                                         "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                                         "qk_rope_head_dim",    "v_head_dim"};
    int rc = 0;
    for (size_t i = 0; i < sizeof always / sizeof *always && !rc; i++) rc = need(g, always[i], 0);
    if (!rc) rc = need(g, "q_lora_rank", 1);
    if (!rc) rc = need(g, "n_routed_experts", 1);
    return rc;
}

/* The ones a model needs when it has routed experts, or dense layers. */
static int need_layer_fields(ms_jget *g, const ms_config *c)
{
    int rc = 0, dense = 0;
    for (int l = 0; l < c->n_layers; l++) dense |= !ms_config_layer_is_moe(c, l);
    if (c->n_routed_experts > 0) {
        if (!rc) rc = need(g, "moe_intermediate_size", 0);
        if (!rc) rc = need(g, "num_experts_per_tok", 0);
    }
    if (!rc && dense) rc = need(g, "intermediate_size", 0);
    return rc;
}

/* Token ids: absent or null -> -1 (config.h); a list (HF allows one for eos) -> its first. */
static int parse_token_id(ms_jget *g, const char *key, int64_t *out)
{
    const json_t *v = json_object_get(g->obj, key);
    if (json_is_array(v)) {
        if (json_array_size(v) == 0)
            return ms_err(g->err, MS_EFORMAT, "config: '%s' is an empty list", key);
        ms_jget one = {json_pack("{s:O}", key, json_array_get(v, 0)), "", g->err};
        if (!one.obj) return ms_err(g->err, MS_ENOMEM, "config: out of memory");
        int rc = ms_jget_int(&one, key, -1, 0, MS_CONFIG_MAX_VOCAB, out);
        json_decref((json_t *)one.obj);
        return rc;
    }
    return ms_jget_int(g, key, -1, 0, MS_CONFIG_MAX_VOCAB, out);
}

/* Cross-field consistency. */
static int check(const ms_config *c, ms_errbuf *err)
{
    if (c->first_k_dense_replace > c->n_layers)
        return ms_err(err, MS_ERANGE,
                      "config: 'first_k_dense_replace' %d exceeds num_hidden_layers %d",
                      c->first_k_dense_replace, c->n_layers);
    if (c->qk_rope_head_dim % 2)
        return ms_err(err, MS_ERANGE, "config: 'qk_rope_head_dim' %d must be even",
                      c->qk_rope_head_dim);
    if (c->rope_yarn && c->rope_theta <= 1.0f)
        return ms_err(err, MS_ERANGE, "config: 'rope_theta' must be > 1 with yarn");
    int E = c->n_routed_experts;
    if (E == 0) return 0;
    if (c->n_experts_per_tok < 1 || c->n_experts_per_tok > E)
        return ms_err(err, MS_ERANGE,
                      "config: 'num_experts_per_tok' is %d, must be between 1 and "
                      "n_routed_experts %d",
                      c->n_experts_per_tok, E);
    if (E % c->n_group)
        return ms_err(err, MS_ERANGE, "config: 'n_group' %d does not divide n_routed_experts %d",
                      c->n_group, E);
    if (c->topk_group > c->n_group)
        return ms_err(err, MS_ERANGE, "config: 'topk_group' %d exceeds n_group %d", c->topk_group,
                      c->n_group);
    int per_group = E / c->n_group;
    if (c->topk_method != MS_TOPK_GREEDY && c->n_experts_per_tok > c->topk_group * per_group)
        return ms_err(err, MS_ERANGE,
                      "config: 'num_experts_per_tok' %d exceeds the %d experts of topk_group %d "
                      "groups",
                      c->n_experts_per_tok, c->topk_group * per_group, c->topk_group);
    if (c->topk_method == MS_TOPK_NOAUX_TC && per_group < 2)
        return ms_err(err, MS_ERANGE,
                      "config: 'n_group' %d leaves %d expert per group; noaux_tc scores groups by "
                      "their top 2",
                      c->n_group, per_group);
    return 0;
}

int ms_config_parse(ms_config *cfg, const char *json_text, ms_errbuf *err)
{
    if (!cfg || !json_text) return ms_err(err, MS_EINVAL, "config: NULL argument");
    json_error_t je;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ms_err(err, MS_EFORMAT, "config: not valid JSON: %s (line %d, column %d)", je.text,
                      je.line, je.column);
    int rc = ms_config_parse_json(cfg, root, err);
    json_decref(root);
    return rc;
}

int ms_config_parse_json(ms_config *cfg, const json_t *root, ms_errbuf *err)
{
    ms_config c;
    memset(&c, 0, sizeof c);
    int rc = 0;
    if (!json_is_object(root)) return ms_err(err, MS_EFORMAT, "config: not a JSON object");
    if ((rc = parse_arch(root, &c, err))) goto out;
    bool v3 = strstr(c.architecture, "V3") != NULL;
    ms_jget g = {root, "", err};
    const int64_t W = MS_CONFIG_MAX_WIDTH;
    int64_t q_lora;
    const json_t *ql = json_object_get(root, "q_lora_rank");
    /* Defaults: V3 = transformers DeepseekV3Config, V2 = DeepseekV2Config. */
    if ((rc = need_shape_fields(&g))) goto out;
    /* Defaults below: the remaining fields, as transformers has them (the
     * shape fields' are never used: need_shape_fields). */
    if ((rc = ms_jget_int(&g, "vocab_size", v3 ? 129280 : 32000, 1, MS_CONFIG_MAX_VOCAB,
                          &c.vocab_size)) ||
        (rc = ms_jget_int(&g, "hidden_size", v3 ? 7168 : 4096, 1, W, &c.hidden_size)) ||
        (rc = ms_jget_int(&g, "intermediate_size", v3 ? 18432 : 11008, 1, W,
                          &c.intermediate_size)) ||
        (rc = ms_jget_int(&g, "moe_intermediate_size", v3 ? 2048 : 1407, 1, W,
                          &c.moe_intermediate_size)) ||
        (rc = ms_jget_i32(&g, "num_hidden_layers", v3 ? 61 : 32, 1, MS_CONFIG_MAX_LAYERS,
                          &c.n_layers)) ||
        (rc = ms_jget_i32(&g, "first_k_dense_replace", v3 ? 3 : 0, 0, MS_CONFIG_MAX_LAYERS,
                          &c.first_k_dense_replace)) ||
        /* moe_layer_freq: DeepSeek's configuration default 1 (not a transformers field) */
        (rc = ms_jget_i32(&g, "moe_layer_freq", 1, 1, MS_CONFIG_MAX_LAYERS, &c.moe_layer_freq)) ||
        (rc = ms_jget_i32(&g, "num_attention_heads", v3 ? 128 : 32, 1, MS_CONFIG_MAX_HEADS,
                          &c.n_heads)) ||
        /* num_key_value_heads: absent or null -> num_attention_heads (both) */
        (rc = ms_jget_i32(&g, "num_key_value_heads", c.n_heads, 1, MS_CONFIG_MAX_HEADS,
                          &c.n_kv_heads)) ||
        /* null n_routed_experts / n_shared_experts: a dense model (0) */
        (rc = ms_jget_i32(&g, "n_routed_experts",
                          json_is_null(json_object_get(root, "n_routed_experts")) ? 0
                          : v3                                                    ? 256
                                                                                  : 64,
                          0, MS_CONFIG_MAX_EXPERTS, &c.n_routed_experts)) ||
        (rc = ms_jget_i32(&g, "n_shared_experts",
                          json_is_null(json_object_get(root, "n_shared_experts")) ? 0
                          : v3                                                    ? 1
                                                                                  : 2,
                          0, MS_CONFIG_MAX_EXPERTS, &c.n_shared_experts)) ||
        /* V2: num_experts_per_tok, n_group, topk_group default None: 0 (error
         * below if there are experts), 1, 1 */
        (rc = ms_jget_i32(&g, "num_experts_per_tok", v3 ? 8 : 0, 0, MS_CONFIG_MAX_EXPERTS,
                          &c.n_experts_per_tok)) ||
        (rc = ms_jget_i32(&g, "n_group", v3 ? 8 : 1, 1, MS_CONFIG_MAX_EXPERTS, &c.n_group)) ||
        (rc = ms_jget_i32(&g, "topk_group", v3 ? 4 : 1, 1, MS_CONFIG_MAX_EXPERTS, &c.topk_group)) ||
        (rc = ms_jget_bool(&g, "norm_topk_prob", v3, &c.norm_topk_prob)) ||
        (rc = ms_jget_num(&g, "routed_scaling_factor", v3 ? 2.5 : 1.0, 1e-6, 1e6,
                          &c.routed_scaling_factor)) ||
        /* q_lora_rank: absent -> 1536 (both); null -> 0 (direct q_proj) */
        (rc = ms_jget_int(&g, "q_lora_rank", json_is_null(ql) ? 0 : 1536, 0, W, &q_lora)) ||
        (rc = ms_jget_i32(&g, "kv_lora_rank", 512, 1, (int)W, &c.kv_lora_rank)) ||
        (rc = ms_jget_i32(&g, "qk_nope_head_dim", 128, 0, MS_CONFIG_MAX_HEAD_DIM,
                          &c.qk_nope_head_dim)) ||
        (rc = ms_jget_i32(&g, "qk_rope_head_dim", 64, 2, MS_CONFIG_MAX_HEAD_DIM,
                          &c.qk_rope_head_dim)) ||
        (rc = ms_jget_i32(&g, "v_head_dim", 128, 1, MS_CONFIG_MAX_HEAD_DIM, &c.v_head_dim)) ||
        (rc = ms_jget_num(&g, "rms_norm_eps", 1e-6, 1e-30, 1.0, &c.rms_norm_eps)) ||
        (rc = ms_jget_num(&g, "rope_theta", 10000.0, 1.0 + 1e-6, 1e12, &c.rope_theta)) ||
        (rc = ms_jget_int(&g, "max_position_embeddings", v3 ? 4096 : 2048, 1,
                          MS_CONFIG_MAX_POSITIONS, &c.max_position_embeddings)) ||
        /* num_nextn_predict_layers: not a transformers field (it ignores MTP);
         * absent -> 0 so no MTP tensors are expected (DeepSeek's own V3 default is 1) */
        (rc = ms_jget_i32(&g, "num_nextn_predict_layers", 0, 0, MS_CONFIG_MAX_LAYERS,
                          &c.num_nextn_predict_layers)) ||
        /* bos/eos: -1 when absent (config.h), not transformers' 0/1 (V3) or 1/2 (V2) */
        (rc = parse_token_id(&g, "bos_token_id", &c.bos_token_id)) ||
        (rc = parse_token_id(&g, "eos_token_id", &c.eos_token_id)) ||
        (rc = ms_jget_bool(&g, "tie_word_embeddings", false, &c.tie_word_embeddings)) ||
        (rc = parse_enums(&g, v3, &c)) || (rc = parse_rope(root, &c, err)) ||
        (rc = parse_quant(root, &c, err)) || (rc = need_layer_fields(&g, &c)) ||
        (rc = check(&c, err)))
        goto out;
    c.q_lora_rank = (int)q_lora;
    *cfg = c;
out:
    return rc;
}

int ms_config_load(ms_config *cfg, const char *path, ms_errbuf *err)
{
    char *text = NULL;
    int rc = ms_read_file(path, MS_CONFIG_MAX_BYTES, &text, NULL);
    if (rc) return ms_err(err, rc, "%s: cannot read: %s", path, ms_strerror(rc));
    rc = ms_config_parse(cfg, text, err);
    free(text);
    if (rc && err) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        ms_err(err, rc, "%s: %s", path, msg);
    }
    return rc;
}

/* The shortest decimal that reads back as the same float, as a JSON real. */
static json_t *real_of(float f)
{
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

static const char *const score_names[] = {"softmax", "sigmoid"};
static const char *const topk_names[] = {"greedy", "group_limited_greedy", "noaux_tc"};

char *ms_config_to_json(const ms_config *c, ms_errbuf *err)
{
    if (!c || (unsigned)c->scoring_func > 1 || (unsigned)c->topk_method > 2) {
        ms_err(err, MS_EINVAL, "config: invalid ms_config");
        return NULL;
    }
    json_t *o = json_pack(
        "{s:[s], s:s, s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s,"
        " s:s, s:b, s:o, s:o, s:i, s:i, s:i, s:i, s:o, s:o, s:I, s:i, s:b, s:s}",
        "architectures", c->architecture, "model_type", c->model_type, "vocab_size",
        (json_int_t)c->vocab_size, "hidden_size", (json_int_t)c->hidden_size, "intermediate_size",
        (json_int_t)c->intermediate_size, "moe_intermediate_size",
        (json_int_t)c->moe_intermediate_size, "num_hidden_layers", c->n_layers,
        "first_k_dense_replace", c->first_k_dense_replace, "moe_layer_freq", c->moe_layer_freq,
        "num_attention_heads", c->n_heads, "num_key_value_heads", c->n_kv_heads, "n_routed_experts",
        c->n_routed_experts, "n_shared_experts", c->n_shared_experts, "num_experts_per_tok",
        c->n_experts_per_tok, "n_group", c->n_group, "topk_group", c->topk_group, "topk_method",
        topk_names[c->topk_method], "scoring_func", score_names[c->scoring_func], "norm_topk_prob",
        (int)c->norm_topk_prob, "routed_scaling_factor", real_of(c->routed_scaling_factor),
        "q_lora_rank", c->q_lora_rank ? json_integer(c->q_lora_rank) : json_null(), "kv_lora_rank",
        c->kv_lora_rank, "qk_nope_head_dim", c->qk_nope_head_dim, "qk_rope_head_dim",
        c->qk_rope_head_dim, "v_head_dim", c->v_head_dim, "rms_norm_eps", real_of(c->rms_norm_eps),
        "rope_theta", real_of(c->rope_theta), "max_position_embeddings",
        (json_int_t)c->max_position_embeddings, "num_nextn_predict_layers",
        c->num_nextn_predict_layers, "tie_word_embeddings", (int)c->tie_word_embeddings,
        "hidden_act", "silu");
    int bad = !o;
    if (!bad && c->bos_token_id >= 0)
        bad |= json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
    if (!bad && c->eos_token_id >= 0)
        bad |= json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
    if (!bad) {
        json_t *rs =
            c->rope_yarn
                ? json_pack("{s:s, s:o, s:I, s:o, s:o, s:o, s:o}", "type", "yarn", "factor",
                            real_of(c->rope_factor), "original_max_position_embeddings",
                            (json_int_t)c->rope_original_max_pos, "beta_fast",
                            real_of(c->rope_beta_fast), "beta_slow", real_of(c->rope_beta_slow),
                            "mscale", real_of(c->rope_mscale), "mscale_all_dim",
                            real_of(c->rope_mscale_all_dim))
                : json_null();
        bad |= json_object_set_new(o, "rope_scaling", rs);
    }
    if (!bad && c->fp8_block) {
        json_t *q = json_pack("{s:s, s:s, s:s, s:[i, i]}", "activation_scheme", "dynamic", "fmt",
                              "e4m3", "quant_method", "fp8", "weight_block_size",
                              c->weight_block[0], c->weight_block[1]);
        if (q && c->fp8_scale_ue8m0)
            bad |= json_object_set_new(q, "scale_fmt", json_string("ue8m0"));
        bad |= json_object_set_new(o, "quantization_config", q);
    }
    char *s = bad ? NULL : json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (!s) ms_err(err, MS_ENOMEM, "config: cannot serialize");
    return s;
}

int ms_config_write(const ms_config *cfg, const char *path, ms_errbuf *err)
{
    char *s = ms_config_to_json(cfg, err);
    if (!s) return MS_ENOMEM;
    FILE *f = fopen(path, "w");
    int rc = 0;
    if (!f) {
        rc = ms_err(err, MS_EIO, "%s: cannot create", path);
    } else {
        if (fputs(s, f) < 0 || fputc('\n', f) == EOF)
            rc = ms_err(err, MS_EIO, "%s: write failed", path);
        if (fclose(f) != 0 && !rc) rc = ms_err(err, MS_EIO, "%s: close failed", path);
    }
    free(s);
    return rc;
}

float ms_config_softmax_scale(const ms_config *c)
{
    double s = 1.0 / sqrt((double)ms_config_qk_head_dim(c));
    /* HF: mscale_all_dim (official ModelArgs.mscale holds the same value) */
    if (c->rope_yarn && c->rope_factor > 1.0f && c->rope_mscale_all_dim != 0.0f) {
        double m = 0.1 * c->rope_mscale_all_dim * log((double)c->rope_factor) + 1.0;
        s *= m * m;
    }
    return (float)s;
}

static double yarn_get_mscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

float ms_config_rope_attn_factor(const ms_config *c)
{
    if (!c->rope_yarn) return 1.0f;
    return (float)(yarn_get_mscale(c->rope_factor, c->rope_mscale) /
                   yarn_get_mscale(c->rope_factor, c->rope_mscale_all_dim));
}

/* YaRN is applied whenever rope_scaling is yarn (as HF does); DeepSeek's own
 * precompute_freqs_cis applies it iff max_seq_len > original_seq_len, which
 * holds for every shipped config.  Same table either way (arch.md §0.4). */
void ms_config_rope_inv_freq(const ms_config *c, float *out)
{
    const int d = c->qk_rope_head_dim;
    const double b = c->rope_theta, s = c->rope_factor;
    const double two_pi = 6.283185307179586476925;
    double low = 0, high = 0;
    if (c->rope_yarn) {
        /* corr(r) = d · ln(L / (2π r)) / (2 ln b); low/high floored/ceiled and clamped */
        double L = (double)c->rope_original_max_pos, lb2 = 2.0 * log(b);
        low = floor(d * log(L / (two_pi * c->rope_beta_fast)) / lb2);
        high = ceil(d * log(L / (two_pi * c->rope_beta_slow)) / lb2);
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < d / 2; i++) {
        double theta = pow(b, -2.0 * i / d);
        if (c->rope_yarn) {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            theta = theta * (1.0 - ramp) + theta / s * ramp;
        }
        out[i] = (float)theta;
    }
}
