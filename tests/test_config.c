/* test_config.c — config.json parsing (V3-671B, V2-Lite, Moonlight, transformers-5
 * rope_parameters, defaults), write → parse round trips, the MLA softmax scale
 * and YaRN table against reference/arch.md §0.4–0.5, and rejected configs
 * whose messages name the field. */
#include "base/util.h"
#include "harness.h"
#include "model/config.h"

#include <jansson.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fields tensor shapes depend on (required), for the tests of defaults. */
#define SHAPES                                                                                     \
    " \"vocab_size\": 1000, \"hidden_size\": 64, \"num_hidden_layers\": 4,"                        \
    " \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": " \
    "128"
#define EXPERTS                                                                                    \
    " \"n_routed_experts\": 16, \"moe_intermediate_size\": 32, \"num_experts_per_tok\": 4,"        \
    " \"intermediate_size\": 128, \"q_lora_rank\": 24, \"num_attention_heads\": 4,"

static const char *v3_json =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"auto_map\": {\"AutoConfig\": "
    "\"configuration_deepseek.DeepseekV3Config\"},"
    " \"bos_token_id\": 0, \"eos_token_id\": 1, \"ep_size\": 1, \"first_k_dense_replace\": 3,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 7168, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 18432, \"kv_lora_rank\": 512, \"max_position_embeddings\": 163840,"
    " \"model_type\": \"deepseek_v3\", \"moe_intermediate_size\": 2048, \"moe_layer_freq\": 1,"
    " \"n_group\": 8, \"n_routed_experts\": 256, \"n_shared_experts\": 1, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 61,"
    " \"num_key_value_heads\": 128, \"num_nextn_predict_layers\": 1, \"q_lora_rank\": 1536,"
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
    " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\","
    "   \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]},"
    " \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0,"
    "   \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
    " \"rope_theta\": 10000, \"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\","
    " \"tie_word_embeddings\": false, \"topk_group\": 4, \"topk_method\": \"noaux_tc\","
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.33.1\", \"use_cache\": true,"
    " \"v_head_dim\": 128, \"vocab_size\": 129280}";

static const char *v2lite_json =
    "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"aux_loss_alpha\": 0.001,"
    " \"bos_token_id\": 100000, \"eos_token_id\": 100001, \"first_k_dense_replace\": 1,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"intermediate_size\": 10944,"
    " \"kv_lora_rank\": 512, \"max_position_embeddings\": 163840, \"model_type\": \"deepseek_v2\","
    " \"moe_intermediate_size\": 1408, \"moe_layer_freq\": 1, \"n_group\": 1,"
    " \"n_routed_experts\": 64, \"n_shared_experts\": 2, \"norm_topk_prob\": false,"
    " \"num_attention_heads\": 16, \"num_experts_per_tok\": 6, \"num_hidden_layers\": 27,"
    " \"num_key_value_heads\": 16, \"q_lora_rank\": null, \"qk_nope_head_dim\": 128,"
    " \"qk_rope_head_dim\": 64, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 0.707,"
    "   \"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
    " \"rope_theta\": 10000, \"routed_scaling_factor\": 1.0, \"scoring_func\": \"softmax\","
    " \"seq_aux\": true, \"tie_word_embeddings\": false, \"topk_group\": 1,"
    " \"topk_method\": \"greedy\", \"torch_dtype\": \"bfloat16\", \"v_head_dim\": 128,"
    " \"vocab_size\": 102400}";

static const char *moonlight_json =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"aux_loss_alpha\": 0.001,"
    " \"bos_token_id\": 163584, \"eos_token_id\": 163586, \"ep_size\": 1,"
    " \"first_k_dense_replace\": 1, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
    " \"intermediate_size\": 11264, \"kv_lora_rank\": 512, \"max_position_embeddings\": 8192,"
    " \"model_type\": \"deepseek_v3\", \"moe_intermediate_size\": 1408, \"moe_layer_freq\": 1,"
    " \"n_group\": 1, \"n_routed_experts\": 64, \"n_shared_experts\": 2, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 16, \"num_experts_per_tok\": 6, \"num_hidden_layers\": 27,"
    " \"num_key_value_heads\": 16, \"num_nextn_predict_layers\": 0, \"q_lora_rank\": null,"
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 50000.0, \"routed_scaling_factor\": 2.446, \"scoring_func\": \"sigmoid\","
    " \"seq_aux\": true, \"tie_word_embeddings\": false, \"topk_group\": 1,"
    " \"topk_method\": \"noaux_tc\", \"torch_dtype\": \"bfloat16\", \"v_head_dim\": 128,"
    " \"vocab_size\": 163840}";

static int same(const ms_config *a, const ms_config *b)
{
#define EQ(f)                                                                                      \
    do {                                                                                           \
        if (a->f != b->f) {                                                                        \
            fprintf(stderr, "  field %s differs: %g vs %g\n", #f, (double)a->f, (double)b->f);     \
            return 0;                                                                              \
        }                                                                                          \
    } while (0)
    // clang-format off
    EQ(vocab_size); EQ(hidden_size); EQ(intermediate_size); EQ(moe_intermediate_size); EQ(n_layers);
    EQ(first_k_dense_replace); EQ(moe_layer_freq); EQ(n_heads); EQ(n_kv_heads);
    EQ(n_routed_experts); EQ(n_shared_experts); EQ(n_experts_per_tok); EQ(n_group); EQ(topk_group);
    EQ(topk_method); EQ(scoring_func); EQ(norm_topk_prob); EQ(routed_scaling_factor);
    EQ(q_lora_rank); EQ(kv_lora_rank); EQ(qk_nope_head_dim); EQ(qk_rope_head_dim); EQ(v_head_dim);
    EQ(rms_norm_eps); EQ(rope_theta); EQ(rope_yarn); EQ(rope_factor); EQ(rope_original_max_pos);
    EQ(rope_beta_fast); EQ(rope_beta_slow); EQ(rope_mscale); EQ(rope_mscale_all_dim);
    EQ(max_position_embeddings); EQ(num_nextn_predict_layers); EQ(bos_token_id); EQ(eos_token_id);
    EQ(tie_word_embeddings); EQ(fp8_block); EQ(weight_block[0]); EQ(weight_block[1]);
    // clang-format on
#undef EQ
    return !strcmp(a->architecture, b->architecture) && !strcmp(a->model_type, b->model_type);
}

/* to_json → parse gives the same config, and a second to_json the same text. */
static int round_trips(const ms_config *c)
{
    ms_errbuf e;
    char *s = ms_config_to_json(c, &e);
    ms_config d;
    int ok = s && ms_config_parse(&d, s, &e) == 0 && same(c, &d);
    char *s2 = ok ? ms_config_to_json(&d, &e) : NULL;
    ok = ok && s2 && !strcmp(s, s2);
    if (!ok) fprintf(stderr, "  round trip failed: %s\n%s\n", e.msg, s ? s : "");
    free(s);
    free(s2);
    return ok;
}

TEST(v3_671b)
{
    ms_config c;
    ms_errbuf e;
    CHECKF(ms_config_parse(&c, v3_json, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(c.architecture, "DeepseekV3ForCausalLM") && !strcmp(c.model_type, "deepseek_v3"));
    CHECK(c.vocab_size == 129280 && c.hidden_size == 7168 && c.intermediate_size == 18432);
    CHECK(c.moe_intermediate_size == 2048 && c.n_layers == 61 && c.first_k_dense_replace == 3);
    CHECK(c.moe_layer_freq == 1 && c.n_heads == 128 && c.n_kv_heads == 128);
    CHECK(c.n_routed_experts == 256 && c.n_shared_experts == 1 && c.n_experts_per_tok == 8);
    CHECK(c.n_group == 8 && c.topk_group == 4 && c.topk_method == MS_TOPK_NOAUX_TC);
    CHECK(c.scoring_func == MS_SCORE_SIGMOID && c.norm_topk_prob &&
          c.routed_scaling_factor == 2.5f);
    CHECK(c.q_lora_rank == 1536 && c.kv_lora_rank == 512 && c.qk_nope_head_dim == 128);
    CHECK(c.qk_rope_head_dim == 64 && c.v_head_dim == 128 && c.rms_norm_eps == 1e-6f);
    CHECK(c.rope_theta == 10000.0f && c.rope_yarn && c.rope_factor == 40.0f);
    CHECK(c.rope_original_max_pos == 4096 && c.rope_beta_fast == 32.0f && c.rope_beta_slow == 1.0f);
    CHECK(c.rope_mscale == 1.0f && c.rope_mscale_all_dim == 1.0f);
    CHECK(c.max_position_embeddings == 163840 && c.num_nextn_predict_layers == 1);
    CHECK(c.bos_token_id == 0 && c.eos_token_id == 1 && !c.tie_word_embeddings);
    CHECK(c.fp8_block && c.weight_block[0] == 128 && c.weight_block[1] == 128);
    CHECK(!ms_config_layer_is_moe(&c, 2) && ms_config_layer_is_moe(&c, 3));
    CHECK(ms_config_qk_head_dim(&c) == 192);
    /* arch.md §0.5: 192^-1/2 · (0.1·ln 40 + 1)^2 */
    CHECK_NEAR(ms_config_softmax_scale(&c), 0.1352338, 1e-6);
    CHECK_NEAR(ms_config_rope_attn_factor(&c), 1.0, 1e-7);
    float f[32];
    ms_config_rope_inv_freq(&c, f);
    /* arch.md §0.4: b=10000, s=40, L=4096, d=64 → low=10, high=23 */
    CHECK_NEAR(f[0], 1.0, 1e-7);
    CHECK_NEAR(f[1] / 0.749894, 1.0, 2e-6);
    CHECK_NEAR(f[31] / 3.3338e-6, 1.0, 5e-5);
    for (int i = 0; i < 32; i++) {
        double th = pow(10000.0, -2.0 * i / 64), r = (i - 10) / 13.0;
        r = r < 0 ? 0 : r > 1 ? 1 : r;
        double want = th * (1 - r) + th / 40 * r;
        CHECK_NEAR(f[i] / want, 1.0, 1e-6);
    }
    CHECK(f[10] == (float)pow(10000.0, -20.0 / 64));          /* last kept dim */
    CHECK(f[23] == (float)(pow(10000.0, -46.0 / 64) / 40.0)); /* first fully scaled dim */
    CHECK(round_trips(&c));
}

TEST(v2_lite)
{
    ms_config c;
    ms_errbuf e;
    CHECKF(ms_config_parse(&c, v2lite_json, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(c.architecture, "DeepseekV2ForCausalLM") && !strcmp(c.model_type, "deepseek_v2"));
    CHECK(c.q_lora_rank == 0 && c.scoring_func == MS_SCORE_SOFTMAX);
    CHECK(c.topk_method == MS_TOPK_GREEDY && !c.norm_topk_prob && c.n_group == 1);
    CHECK(c.n_routed_experts == 64 && c.n_shared_experts == 2 && c.n_experts_per_tok == 6);
    CHECK(c.rope_mscale == 0.707f && c.rope_mscale_all_dim == 0.707f && !c.fp8_block);
    CHECK(c.bos_token_id == 100000 && c.eos_token_id == 100001);
    CHECK(c.num_nextn_predict_layers == 0);
    CHECK_NEAR(ms_config_softmax_scale(&c), 0.1147214, 1e-6);
    CHECK_NEAR(ms_config_rope_attn_factor(&c), 1.0, 1e-7);
    CHECK(round_trips(&c));
    /* the same model in transformers-5 form: rope_parameters with rope_theta inside */
    const char *t5json =
        "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"n_routed_experts\": 64,"
        " \"vocab_size\": 102400, \"hidden_size\": 2048, \"num_hidden_layers\": 27,"
        " \"num_attention_heads\": 16, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128,"
        " \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"moe_intermediate_size\": 1408,"
        " \"intermediate_size\": 10944,"
        " \"num_experts_per_tok\": 6, \"q_lora_rank\": null, \"rope_parameters\": {\"rope_type\":"
        " \"yarn\", \"rope_theta\": 10000.0, \"factor\": 40.0, "
        "\"original_max_position_embeddings\":"
        " 4096, \"beta_fast\": 32.0, \"beta_slow\": 1.0, \"mscale\": 0.707, \"mscale_all_dim\": "
        "0.707}}";
    ms_config d;
    CHECKF(ms_config_parse(&d, t5json, &e) == 0, "%s", e.msg);
    CHECK(d.rope_yarn && d.rope_factor == 40.0f && d.rope_mscale_all_dim == 0.707f);
    CHECK_NEAR(ms_config_softmax_scale(&d), 0.1147214, 1e-6);
    const char *t5plain =
        "{\"architectures\": [\"DeepseekV3ForCausalLM\"]," EXPERTS SHAPES ","
        " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 50000}}";
    CHECKF(ms_config_parse(&d, t5plain, &e) == 0, "%s", e.msg);
    CHECK(!d.rope_yarn && d.rope_theta == 50000.0f);
}

TEST(moonlight_plain_rope)
{
    ms_config c;
    ms_errbuf e;
    CHECKF(ms_config_parse(&c, moonlight_json, &e) == 0, "%s", e.msg);
    CHECK(!c.rope_yarn && c.rope_theta == 50000.0f && c.q_lora_rank == 0);
    CHECK(c.scoring_func == MS_SCORE_SIGMOID && c.topk_method == MS_TOPK_NOAUX_TC);
    CHECK(c.routed_scaling_factor == 2.446f && c.rms_norm_eps == 1e-5f);
    CHECK(c.max_position_embeddings == 8192 && c.vocab_size == 163840);
    CHECK_NEAR(ms_config_softmax_scale(&c), 1.0 / sqrt(192.0), 1e-8);
    CHECK_NEAR(ms_config_rope_attn_factor(&c), 1.0, 0);
    float f[32];
    ms_config_rope_inv_freq(&c, f);
    for (int i = 0; i < 32; i++) CHECK_NEAR(f[i] / pow(50000.0, -2.0 * i / 64), 1.0, 1e-6);
    CHECK(round_trips(&c));
}

TEST(defaults_of_absent_fields)
{
    ms_config c;
    ms_errbuf e;
    CHECKF(ms_config_parse(
               &c, "{\"architectures\": [\"DeepseekV3ForCausalLM\"]," EXPERTS SHAPES "}", &e) == 0,
           "%s", e.msg);
    /* transformers DeepseekV3Config defaults of the rest */
    CHECK(c.vocab_size == 1000 && c.hidden_size == 64 && c.n_layers == 4 && c.q_lora_rank == 24);
    CHECK(c.n_routed_experts == 16 && c.n_group == 8 && c.topk_group == 4);
    CHECK(c.first_k_dense_replace == 3 && c.n_shared_experts == 1);
    CHECK(c.max_position_embeddings == 4096 && !c.rope_yarn);
    CHECK(c.scoring_func == MS_SCORE_SIGMOID && c.topk_method == MS_TOPK_NOAUX_TC);
    CHECK(c.bos_token_id == -1 && c.eos_token_id == -1 && c.num_nextn_predict_layers == 0);
    CHECK(round_trips(&c));
    /* model_type alone picks the architecture; transformers DeepseekV2Config defaults */
    CHECKF(ms_config_parse(&c, "{\"model_type\": \"deepseek_v2\"," EXPERTS SHAPES "}", &e) == 0,
           "%s", e.msg);
    CHECK(!strcmp(c.architecture, "DeepseekV2ForCausalLM"));
    CHECK(c.first_k_dense_replace == 0 && c.n_shared_experts == 2);
    CHECK(c.n_group == 1 && c.topk_group == 1);
    CHECK(c.scoring_func == MS_SCORE_SOFTMAX && c.topk_method == MS_TOPK_GREEDY);
    CHECK(!c.norm_topk_prob && c.max_position_embeddings == 2048);
    /* a dense model, a list-valued eos, yarn defaults, null kv heads */
    CHECKF(ms_config_parse(&c,
                           "{\"architectures\": [\"X\", \"DeepseekV2ForCausalLM\"],"
                           " \"n_routed_experts\": null, \"eos_token_id\": [7, 8],"
                           " \"num_key_value_heads\": null, \"num_attention_heads\": 4,"
                           " \"q_lora_rank\": null, \"intermediate_size\": 128," SHAPES ","
                           " \"max_position_embeddings\": 1000,"
                           " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}}",
                           &e) == 0,
           "%s", e.msg);
    CHECK(c.n_routed_experts == 0 && c.eos_token_id == 7 && c.n_kv_heads == 4);
    CHECK(!ms_config_layer_is_moe(&c, 5));
    CHECK(c.rope_original_max_pos == 1000 && c.rope_beta_fast == 32.0f && c.rope_mscale == 1.0f);
    CHECK(c.rope_mscale_all_dim == 0.0f);
    CHECK_NEAR(ms_config_softmax_scale(&c), 1.0 / sqrt(192.0), 1e-8); /* mscale_all_dim 0 */
    CHECK_NEAR(ms_config_rope_attn_factor(&c), 0.1 * log(4.0) + 1.0, 1e-6);
    CHECK(round_trips(&c));
}

TEST(write_and_load_file)
{
    ms_config c, d;
    ms_errbuf e;
    CHECK(ms_config_parse(&c, v3_json, &e) == 0);
    char path[256];
    const char *base = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/ms_cfg_%d.json", base && *base ? base : "/tmp", (int)getpid());
    CHECKF(ms_config_write(&c, path, &e) == 0, "%s", e.msg);
    int rc = ms_config_load(&d, path, &e);
    unlink(path);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK(same(&c, &d));
    CHECK(ms_config_load(&d, "/nonexistent/config.json", &e) == MS_ENOENT);
    CHECK(strstr(e.msg, "/nonexistent/config.json") != NULL);
    CHECK(ms_config_write(&c, "/nonexistent/dir/config.json", &e) == MS_EIO);
}

/* Replaces the first `"key": <value>` of v3_json with `"key": repl` (repl NULL:
 * removes nothing, appends extra before the closing brace instead). */
static char *v3_with(const char *key, const char *repl)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(v3_json, pat);
    if (!p) return NULL;
    p += strlen(pat);
    const char *q = p;
    int depth = 0;
    while (*q && (depth > 0 || (*q != ',' && *q != '}'))) {
        if (*q == '{' || *q == '[') depth++;
        if (*q == '}' || *q == ']') depth--;
        q++;
    }
    size_t n = (size_t)(p - v3_json) + strlen(repl) + strlen(q) + 1;
    char *s = malloc(n);
    snprintf(s, n, "%.*s%s%s", (int)(p - v3_json), v3_json, repl, q);
    return s;
}

TEST(rejected_configs_name_the_field)
{
    struct {
        const char *key, *value, *must1, *must2;
    } cases[] = {
        {"architectures", "[\"LlamaForCausalLM\"]", "'architectures'", "LlamaForCausalLM"},
        {"architectures", "[]", "'architectures'", NULL},
        {"architectures", "\"DeepseekV3ForCausalLM\"", "'architectures'", NULL},
        {"hidden_size", "\"7168\"", "'hidden_size'", "integer"},
        {"hidden_size", "7168.0", "'hidden_size'", "integer"},
        {"hidden_size", "0", "'hidden_size'", "between"},
        {"vocab_size", "1099511627776", "'vocab_size'", "between"},
        {"num_attention_heads", "0", "'num_attention_heads'", NULL},
        {"num_attention_heads", "-4", "'num_attention_heads'", NULL},
        {"n_group", "3", "'n_group'", "divide"},
        {"n_group", "256", "'num_experts_per_tok' 8", "4 experts of topk_group 4"},
        {"topk_group", "9", "'topk_group'", "n_group 8"},
        {"num_experts_per_tok", "300", "'num_experts_per_tok'", NULL},
        {"num_experts_per_tok", "0", "'num_experts_per_tok'", NULL},
        {"scoring_func", "\"relu\"", "'scoring_func'", "relu"},
        {"topk_method", "\"top1\"", "'topk_method'", NULL},
        {"hidden_act", "\"gelu\"", "'hidden_act'", NULL},
        {"norm_topk_prob", "\"yes\"", "'norm_topk_prob'", NULL},
        {"rms_norm_eps", "-1", "'rms_norm_eps'", NULL},
        {"rope_theta", "\"big\"", "'rope_theta'", NULL},
        {"routed_scaling_factor", "0", "'routed_scaling_factor'", NULL},
        {"qk_rope_head_dim", "63", "'qk_rope_head_dim'", "even"},
        {"first_k_dense_replace", "100", "'first_k_dense_replace'", NULL},
        {"max_position_embeddings", "-1", "'max_position_embeddings'", NULL},
        {"bos_token_id", "[]", "'bos_token_id'", NULL},
        {"eos_token_id", "[\"a\"]", "'eos_token_id'", NULL},
        {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2}", "'rope_scaling.type'", "linear"},
        {"rope_scaling", "{\"type\": \"yarn\"}", "'rope_scaling.factor'", NULL},
        {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 0.5}", "'rope_scaling.factor'", NULL},
        {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 4, \"beta_fast\": 0}",
         "'rope_scaling.beta_fast'", NULL},
        {"rope_scaling", "{\"factor\": 4}", "'rope_scaling.type'", NULL},
        {"rope_scaling", "[]", "'rope_scaling'", NULL},
        {"quantization_config", "{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}",
         "'quantization_config.weight_block_size'", "[128, 128]"},
        {"quantization_config", "{\"quant_method\": \"awq\"}", "'quantization_config.quant_method'",
         "awq"},
        {"quantization_config", "{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}",
         "'quantization_config.fmt'", NULL},
        {"quantization_config", "{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}",
         "'quantization_config.weight_block_size'", NULL},
        {"model_type", "12", "'model_type'", NULL},
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(cases); i++) {
        char *s = v3_with(cases[i].key, cases[i].value);
        CHECKF(s, "key %s not in the V3 config", cases[i].key);
        ms_config c;
        memset(&c, 0x5a, sizeof c);
        ms_errbuf e = {{0}};
        int rc = ms_config_parse(&c, s, &e);
        free(s);
        CHECKF(rc < 0 && strstr(e.msg, cases[i].must1) &&
                   (!cases[i].must2 || strstr(e.msg, cases[i].must2)),
               "case %zu (%s = %s): rc %d: %s", i, cases[i].key, cases[i].value, rc, e.msg);
        CHECK(c.n_layers == 0x5a5a5a5a); /* output untouched on error */
    }
    ms_config c;
    ms_errbuf e;
    CHECK(ms_config_parse(&c,
                          "{\"a\": 1, \"a\": 2, \"architectures\": "
                          "[\"DeepseekV3ForCausalLM\"]}",
                          &e) == MS_EFORMAT);
    CHECK(strstr(e.msg, "duplicate") != NULL);
    CHECK(ms_config_parse(&c, "[]", &e) == MS_EFORMAT);
    CHECK(ms_config_parse(&c, "{", &e) == MS_EFORMAT && strstr(e.msg, "not valid JSON"));
    CHECK(ms_config_parse(&c, "{}", &e) == MS_EFORMAT && strstr(e.msg, "'architectures'"));
    /* the shape fields are required, each named when absent */
    static const char *const req[] = {
        "vocab_size",          "hidden_size",       "num_hidden_layers",
        "kv_lora_rank",        "qk_nope_head_dim",  "qk_rope_head_dim",
        "v_head_dim",          "n_routed_experts",  "moe_intermediate_size",
        "num_experts_per_tok", "intermediate_size", "q_lora_rank",
        "num_attention_heads"};
    for (size_t i = 0; i < sizeof req / sizeof *req; i++) {
        json_t *j = json_loads(
            "{\"architectures\": [\"DeepseekV3ForCausalLM\"]," EXPERTS SHAPES "}", 0, NULL);
        json_object_del(j, req[i]);
        char *text = json_dumps(j, 0);
        char want[64];
        snprintf(want, sizeof want, "'%s' is required", req[i]);
        int rc = ms_config_parse(&c, text, &e);
        CHECKF(rc == MS_EFORMAT && strstr(e.msg, want), "%s: rc %d: %s", req[i], rc, e.msg);
        free(text);
        json_decref(j);
    }
    /* intermediate_size is not needed without dense layers */
    CHECKF(ms_config_parse(
               &c,
               "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"first_k_dense_replace\":"
               " 0, \"n_routed_experts\": 16, \"moe_intermediate_size\": 32,"
               " \"num_experts_per_tok\": 4, \"q_lora_rank\": 24, \"n_group\": 4,"
               " \"num_attention_heads\": 4," SHAPES "}",
               &e) == 0,
           "%s", e.msg);
    CHECK(ms_config_parse(&c,
                          "{\"architectures\": [\"DeepseekV3ForCausalLM\"],"
                          " \"n_routed_experts\": 8, \"n_group\": 8, \"topk_group\": 8,"
                          " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32,"
                          " \"intermediate_size\": 128, \"q_lora_rank\": 24,"
                          " \"num_attention_heads\": 4," SHAPES "}",
                          &e) == MS_ERANGE);
    CHECK(strstr(e.msg, "'n_group'") && strstr(e.msg, "top 2"));
}

int main(void)
{
    RUN(v3_671b);
    RUN(v2_lite);
    RUN(moonlight_plain_rope);
    RUN(defaults_of_absent_fields);
    RUN(write_and_load_file);
    RUN(rejected_configs_name_the_field);
    return TEST_REPORT();
}
