/* mkmodel.c — writes seeded random checkpoints (mkmodel.h).
 *
 * Every tensor gets its own RNG stream seeded from (seed, tensor name), so
 * values do not depend on write order.  Linear weights are uniform with
 * variance 1/fan_in (activations stay O(1) through the layers); output
 * projections are halved; norm weights are 1 ± 0.1; the router's
 * e_score_correction_bias is non-zero (±0.1) so selection differs from raw
 * scores.  FP8 checkpoints quantise attention, dense and expert projections
 * to e4m3 with 128x128 block scales (amax / 448) as DeepSeek's do; embeddings,
 * router and lm_head stay BF16.
 */
#include "tools/mkmodel.h"

#include "base/log.h"
#include "base/util.h"
#include "kernels/dtype.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void base_v3(ms_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->architecture, sizeof c->architecture, "DeepseekV3ForCausalLM");
    snprintf(c->model_type, sizeof c->model_type, "deepseek_v3");
    c->moe_layer_freq = 1;
    c->first_k_dense_replace = 1;
    c->n_shared_experts = 1;
    c->topk_method = MS_TOPK_NOAUX_TC;
    c->scoring_func = MS_SCORE_SIGMOID;
    c->norm_topk_prob = true;
    c->routed_scaling_factor = 2.5f;
    c->rms_norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    c->rope_yarn = true;
    c->rope_factor = 40.0f;
    c->rope_original_max_pos = 4096;
    c->rope_beta_fast = 32.0f;
    c->rope_beta_slow = 1.0f;
    c->rope_mscale = 1.0f;
    c->rope_mscale_all_dim = 1.0f;
    c->max_position_embeddings = 16384;
    c->bos_token_id = 0;
    c->eos_token_id = 1;
}

int ms_mkmodel_preset(const char *name, ms_config *c)
{
    base_v3(c);
    if (!strcmp(name, "tiny-v3") || !strcmp(name, "tiny-v2")) {
        c->vocab_size = 1024;
        c->hidden_size = 256;
        c->intermediate_size = 512;
        c->moe_intermediate_size = 128;
        c->n_layers = 4;
        c->n_heads = c->n_kv_heads = 8;
        c->q_lora_rank = 96;
        c->kv_lora_rank = 64;
        c->qk_nope_head_dim = 32;
        c->qk_rope_head_dim = 16;
        c->v_head_dim = 32;
        c->n_routed_experts = 16;
        c->n_group = 4;
        c->topk_group = 2;
        c->n_experts_per_tok = 4;
        c->num_nextn_predict_layers = 1;
        if (!strcmp(name, "tiny-v2")) {
            snprintf(c->architecture, sizeof c->architecture, "DeepseekV2ForCausalLM");
            snprintf(c->model_type, sizeof c->model_type, "deepseek_v2");
            c->q_lora_rank = 0;
            c->scoring_func = MS_SCORE_SOFTMAX;
            c->topk_method = MS_TOPK_GROUP_LIMITED;
            c->norm_topk_prob = false;
            c->routed_scaling_factor = 1.0f;
            c->rope_mscale = c->rope_mscale_all_dim = 0.707f;
            c->num_nextn_predict_layers = 0;
        }
        return 0;
    }
    if (!strcmp(name, "small-v3")) { /* the benchmark issue's exact shape */
        c->vocab_size = 32000;
        c->hidden_size = 1024;
        c->intermediate_size = 2816;
        c->moe_intermediate_size = 512;
        c->n_layers = 8;
        c->n_heads = c->n_kv_heads = 16;
        c->q_lora_rank = 384;
        c->kv_lora_rank = 256;
        c->qk_nope_head_dim = 64;
        c->qk_rope_head_dim = 32;
        c->v_head_dim = 64;
        c->n_routed_experts = 64;
        c->n_group = 8;
        c->topk_group = 4;
        c->n_experts_per_tok = 6;
        c->max_position_embeddings = 163840;
        return 0;
    }
    return MS_ENOENT;
}

/* ---- tensor generation ---- */

struct gen {
    ms_st_writer *w;
    const ms_config *cfg;
    int dtype;
    uint64_t seed;
    ms_errbuf *err;
    float *buf; /* f32 staging */
    size_t cap;
    double route_skew; /* > 0: calibrated router bias (mkmodel_skew.c) */
};

static uint64_t name_seed(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return h;
}

static int stage(struct gen *g, size_t n)
{
    if (n <= g->cap) return 0;
    float *b = realloc(g->buf, n * sizeof(float));
    if (!b) return ms_err(g->err, MS_ENOMEM, "out of memory");
    g->buf = b;
    g->cap = n;
    return 0;
}

/* Writes buf[n] as F32 or BF16. */
static int put_float(struct gen *g, const char *name, int ndim, const int64_t *shape, size_t n,
                     int as_f32)
{
    if (as_f32) return ms_st_writer_add(g->w, name, MS_DT_F32, ndim, shape, g->buf, n * 4, g->err);
    uint16_t *h = malloc(n * 2);
    if (!h) return ms_err(g->err, MS_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) h[i] = ms_f32_to_bf16(g->buf[i]);
    int rc = ms_st_writer_add(g->w, name, MS_DT_BF16, ndim, shape, h, n * 2, g->err);
    free(h);
    return rc;
}

/* Uniform(center - a, center + a) vector or matrix. */
static void fill(struct gen *g, const char *name, size_t n, float center, float a)
{
    uint64_t st = name_seed(g->seed, name);
    for (size_t i = 0; i < n; i++)
        g->buf[i] = center + a * (float)(2.0 * ms_rng_uniform(&st) - 1.0);
}

static int put_fp8(struct gen *g, const char *name, int64_t rows, int64_t cols)
{
    int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    uint8_t *q = malloc((size_t)(rows * cols));
    float *sc = malloc(sizeof(float) * (size_t)(br * bc));
    if (!q || !sc) {
        free(q);
        free(sc);
        return ms_err(g->err, MS_ENOMEM, "out of memory");
    }
    for (int64_t bi = 0; bi < br; bi++)
        for (int64_t bj = 0; bj < bc; bj++) {
            float amax = 0;
            for (int64_t r = bi * 128; r < MS_MIN(rows, bi * 128 + 128); r++)
                for (int64_t c = bj * 128; c < MS_MIN(cols, bj * 128 + 128); c++)
                    amax = fmaxf(amax, fabsf(g->buf[r * cols + c]));
            float s = amax > 0 ? amax / 448.0f : 1.0f;
            sc[bi * bc + bj] = s;
            for (int64_t r = bi * 128; r < MS_MIN(rows, bi * 128 + 128); r++)
                for (int64_t c = bj * 128; c < MS_MIN(cols, bj * 128 + 128); c++)
                    q[r * cols + c] = ms_f32_to_fp8e4m3(g->buf[r * cols + c] / s);
        }
    const int64_t shape[2] = {rows, cols}, sshape[2] = {br, bc};
    char sname[300];
    snprintf(sname, sizeof sname, "%s_scale_inv", name);
    int rc = ms_st_writer_add(g->w, name, MS_DT_F8E4M3, 2, shape, q, (size_t)(rows * cols), g->err);
    if (!rc)
        rc = ms_st_writer_add(g->w, sname, MS_DT_F32, 2, sshape, sc,
                              sizeof(float) * (size_t)(br * bc), g->err);
    free(q);
    free(sc);
    return rc;
}

/* kind: 0 = projection (fp8 when dtype fp8), 1 = always bf16/f32 (embed, router, head). */
static int linear(struct gen *g, const char *name, int64_t rows, int64_t cols, float gain,
                  int keep_bf16)
{
    size_t n = (size_t)(rows * cols);
    int rc = stage(g, n);
    if (rc) return rc;
    fill(g, name, n, 0.0f, gain * sqrtf(3.0f / (float)cols));
    if (g->dtype == MS_MK_FP8 && !keep_bf16) return put_fp8(g, name, rows, cols);
    const int64_t shape[2] = {rows, cols};
    return put_float(g, name, 2, shape, n, g->dtype == MS_MK_FP32);
}

static int vec(struct gen *g, const char *name, int64_t n, float center, float a, int as_f32)
{
    int rc = stage(g, (size_t)n);
    if (rc) return rc;
    fill(g, name, (size_t)n, center, a);
    return put_float(g, name, 1, &n, (size_t)n, as_f32 || g->dtype == MS_MK_FP32);
}

static int ffn(struct gen *g, const char *p, int64_t D, int64_t inter)
{
    char n[200];
    int rc;
    snprintf(n, sizeof n, "%s.gate_proj.weight", p);
    if ((rc = linear(g, n, inter, D, 1.0f, 0))) return rc;
    snprintf(n, sizeof n, "%s.up_proj.weight", p);
    if ((rc = linear(g, n, inter, D, 1.0f, 0))) return rc;
    snprintf(n, sizeof n, "%s.down_proj.weight", p);
    return linear(g, n, D, inter, 0.5f, 0);
}

static int layer(struct gen *g, int l)
{
    const ms_config *c = g->cfg;
    int64_t D = c->hidden_size, H = c->n_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
            dv = c->v_head_dim, kvr = c->kv_lora_rank;
    char p[64], n[200];
    int rc;
    snprintf(p, sizeof p, "model.layers.%d", l);
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    if ((rc = vec(g, NAME("%s.input_layernorm.weight", p), D, 1.0f, 0.1f, 0))) return rc;
    if ((rc = vec(g, NAME("%s.post_attention_layernorm.weight", p), D, 1.0f, 0.1f, 0))) return rc;
    if (c->q_lora_rank > 0) {
        if ((rc = linear(g, NAME("%s.self_attn.q_a_proj.weight", p), c->q_lora_rank, D, 1, 0)))
            return rc;
        if ((rc = vec(g, NAME("%s.self_attn.q_a_layernorm.weight", p), c->q_lora_rank, 1.0f, 0.1f,
                      0)))
            return rc;
        if ((rc = linear(g, NAME("%s.self_attn.q_b_proj.weight", p), H * (dn + dr), c->q_lora_rank,
                         1, 0)))
            return rc;
    } else if ((rc = linear(g, NAME("%s.self_attn.q_proj.weight", p), H * (dn + dr), D, 1, 0))) {
        return rc;
    }
    if ((rc = linear(g, NAME("%s.self_attn.kv_a_proj_with_mqa.weight", p), kvr + dr, D, 1, 0)))
        return rc;
    if ((rc = vec(g, NAME("%s.self_attn.kv_a_layernorm.weight", p), kvr, 1.0f, 0.1f, 0))) return rc;
    if ((rc = linear(g, NAME("%s.self_attn.kv_b_proj.weight", p), H * (dn + dv), kvr, 1, 0)))
        return rc;
    if ((rc = linear(g, NAME("%s.self_attn.o_proj.weight", p), D, H * dv, 0.5f, 0))) return rc;
    if (!ms_config_layer_is_moe(c, l)) {
        snprintf(n, sizeof n, "%s.mlp", p);
        return ffn(g, n, D, c->intermediate_size);
    }
    if ((rc = linear(g, NAME("%s.mlp.gate.weight", p), c->n_routed_experts, D, 1.0f, 1))) return rc;
    if (g->route_skew > 0) { /* the gate as the server reads it, then its calibrated bias */
        int64_t E = c->n_routed_experts;
        float *gw = malloc(sizeof(float) * (size_t)(E * D));
        if (!gw) return ms_err(g->err, MS_ENOMEM, "out of memory");
        for (int64_t i = 0; i < E * D; i++)
            gw[i] = g->dtype == MS_MK_FP32 ? g->buf[i] : ms_round_bf16(g->buf[i]);
        double worst = 0;
        rc = ms_mkmodel_skew_bias(c, gw, g->route_skew, name_seed(g->seed, p), g->buf, &worst);
        free(gw);
        if (rc) return ms_err(g->err, rc, "out of memory");
        MS_LOG(MS_INFO, "mkmodel", "layer %d: router bias for skew %.2f (max share error %.4f)", l,
               g->route_skew, worst);
        if ((rc =
                 put_float(g, NAME("%s.mlp.gate.e_score_correction_bias", p), 1, &E, (size_t)E, 1)))
            return rc;
    } else if (c->topk_method == MS_TOPK_NOAUX_TC &&
               (rc = vec(g, NAME("%s.mlp.gate.e_score_correction_bias", p), c->n_routed_experts,
                         0.0f, 0.1f, 1)))
        return rc;
    for (int e = 0; e < c->n_routed_experts; e++) {
        snprintf(n, sizeof n, "%s.mlp.experts.%d", p, e);
        if ((rc = ffn(g, n, D, c->moe_intermediate_size))) return rc;
    }
    if (c->n_shared_experts > 0) {
        snprintf(n, sizeof n, "%s.mlp.shared_experts", p);
        return ffn(g, n, D, (int64_t)c->n_shared_experts * c->moe_intermediate_size);
    }
#undef NAME
    return 0;
}

static int write_tokenizer_config(const char *dir, ms_errbuf *err)
{
    char path[1200];
    if (!ms_path_join(path, sizeof path, dir, "tokenizer_config.json"))
        return ms_err(err, MS_EINVAL, "path too long");
    FILE *f = fopen(path, "w");
    if (!f) return ms_err(err, MS_EIO, "%s: cannot write", path);
    fprintf(f,
            "{\n  \"add_bos_token\": true,\n  \"add_eos_token\": false,\n"
            "  \"bos_token\": \"<\xef\xbd\x9c"
            "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>\",\n"
            "  \"eos_token\": \"<\xef\xbd\x9c"
            "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>\",\n"
            "  \"model_max_length\": 16384,\n  \"tokenizer_class\": \"LlamaTokenizerFast\"\n}\n");
    return fclose(f) == 0 ? 0 : ms_err(err, MS_EIO, "%s: write failed", path);
}

int ms_mkmodel_write_tokenizer(const char *dir, int64_t vocab, ms_errbuf *err)
{
    char path[1200];
    if (!ms_path_join(path, sizeof path, dir, "tokenizer.json"))
        return ms_err(err, MS_EINVAL, "--out path too long");
    int rc = ms_tokenizer_train_write(NULL, 0, (int32_t)vocab, path, err);
    if (!rc) rc = write_tokenizer_config(dir, err);
    return rc;
}

/* mkdir -p: creates every missing directory of path (mode 0755). */
int ms_mkmodel_mkdir_p(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int ms_mkmodel_write(const ms_config *cfg, int dtype, uint64_t seed, const char *out_dir,
                     int64_t shard_bytes, ms_errbuf *err)
{
    return ms_mkmodel_write_skewed(cfg, dtype, seed, 0.0, out_dir, shard_bytes, err);
}

int ms_mkmodel_write_skewed(const ms_config *cfg_in, int dtype, uint64_t seed, double route_skew,
                            const char *out_dir, int64_t shard_bytes, ms_errbuf *err)
{
    ms_config cfg = *cfg_in;
    if (route_skew > 0 && cfg.topk_method != MS_TOPK_NOAUX_TC)
        return ms_err(err, MS_EINVAL,
                      "--route-skew needs a router with e_score_correction_bias "
                      "(topk_method noaux_tc: tiny-v3, small-v3)");
    if (dtype == MS_MK_FP8) {
        cfg.fp8_block = true;
        cfg.weight_block[0] = cfg.weight_block[1] = 128;
    }
    if (ms_mkmodel_mkdir_p(out_dir) != 0)
        return ms_err(err, MS_EIO, "%s: cannot create directory: %s", out_dir, strerror(errno));
    char path[1200];
    int rc;
    if (!ms_path_join(path, sizeof path, out_dir, "config.json"))
        return ms_err(err, MS_EINVAL, "--out path too long");
    if ((rc = ms_config_write(&cfg, path, err))) return rc;

    struct gen g = {.w = ms_st_writer_new(),
                    .cfg = &cfg,
                    .dtype = dtype,
                    .seed = seed,
                    .err = err,
                    .route_skew = route_skew};
    if (!g.w) return ms_err(err, MS_ENOMEM, "out of memory");
    int64_t D = cfg.hidden_size;
    rc = linear(&g, "model.embed_tokens.weight", cfg.vocab_size, D, 1.0f / sqrtf(3.0f / (float)D),
                1);
    for (int l = 0; !rc && l < cfg.n_layers + cfg.num_nextn_predict_layers; l++) {
        rc = layer(&g, l);
        if (!rc && l >= cfg.n_layers) { /* MTP extras */
            char n[200];
            snprintf(n, sizeof n, "model.layers.%d.enorm.weight", l);
            rc = vec(&g, n, D, 1.0f, 0.1f, 0);
            snprintf(n, sizeof n, "model.layers.%d.hnorm.weight", l);
            if (!rc) rc = vec(&g, n, D, 1.0f, 0.1f, 0);
            snprintf(n, sizeof n, "model.layers.%d.eh_proj.weight", l);
            if (!rc) rc = linear(&g, n, D, 2 * D, 1.0f, 1);
            snprintf(n, sizeof n, "model.layers.%d.shared_head.norm.weight", l);
            if (!rc) rc = vec(&g, n, D, 1.0f, 0.1f, 0);
        }
    }
    if (!rc) rc = vec(&g, "model.norm.weight", D, 1.0f, 0.1f, 0);
    if (!rc) rc = linear(&g, "lm_head.weight", cfg.vocab_size, D, 1.0f, 1);
    if (!rc) {
        if (shard_bytes > 0)
            rc = ms_st_writer_save_sharded(g.w, out_dir, shard_bytes, err);
        else if (!ms_path_join(path, sizeof path, out_dir, "model.safetensors"))
            rc = ms_err(err, MS_EINVAL, "--out path too long");
        else
            rc = ms_st_writer_save(g.w, path, err);
    }
    ms_st_writer_free(g.w);
    free(g.buf);
    if (rc) return rc;

    return ms_mkmodel_write_tokenizer(out_dir, cfg.vocab_size, err);
}
