/* mkmodel_v4.c — seeded random DeepSeek-V4 checkpoints (mkmodel.h): the
 * presets tiny-v4 and small-v4, their config.json (HF field names, arch.md
 * §2.2) and every tensor under the official names and shapes (arch.md
 * §2.3).  Each tensor is generated at save time from its own RNG stream
 * (seed, name), so values do not depend on order and the model never sits
 * in RAM whole.  Linear weights are uniform with variance gain²/fan_in;
 * norms 1 ± 0.1; mHC, sink, ape and gate bias small offsets; tid2eid gives
 * every token k distinct experts; the tokenizer carries V4's special tokens
 * (mkmodel_tok.c).  --dtype fp8 stores the attention
 * projections, the indexer's wq_b, the experts and the MTP projections as
 * e4m3 with one UE8M0 (F8_E8M0) power-of-two scale per 128×128 block, as
 * the release does; embeddings, head, gate, compressors, weights_proj and
 * the F32 tensors stay as they are.  --dtype fp8-fp4 is fp8 with the routed
 * experts (MTP's too) in FP4 e2m1 as the release stores them: I8 bytes of two
 * codes (low nibble = even column), one UE8M0 scale 2^ceil(log2(amax / 6))
 * per 32 columns of a row (`.scale`, F8_E8M0 [rows][cols / 32]), and
 * "expert_dtype": "fp4" in config.json.  Main thread only.
 */
#include "tools/mkmodel.h"
#include "tools/mkmodel_tok.h"

#include "base/util.h"
#include "kernels/dtype.h"
#include "model/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct v4_preset {
    const char *name;
    int64_t vocab, D, max_pos, rope_orig;
    int L, H, hd, dr, q_lora, G, R, window, nI, ihd, topk, E, K, inter, n_hash, hc;
    int16_t ratios[16]; /* L entries + the MTP slot */
} v4_preset;

static const v4_preset presets[] = {
    {.name = "tiny-v4",
     .vocab = 1024,
     .D = 128,
     .max_pos = 4096,
     .rope_orig = 64,
     .L = 5,
     .H = 8,
     .hd = 64,
     .dr = 16,
     .q_lora = 64,
     .G = 4,
     .R = 32,
     .window = 8,
     .nI = 8,
     .ihd = 32,
     .topk = 4,
     .E = 16,
     .K = 4,
     .inter = 64,
     .n_hash = 2,
     .hc = 4,
     .ratios = {0, 4, 128, 4, 128, 0}},
    {.name = "small-v4",
     .vocab = 32000,
     .D = 1024,
     .max_pos = 65536,
     .rope_orig = 4096,
     .L = 8,
     .H = 16,
     .hd = 128,
     .dr = 64,
     .q_lora = 384,
     .G = 4,
     .R = 256,
     .window = 128,
     .nI = 16,
     .ihd = 64,
     .topk = 128,
     .E = 64,
     .K = 6,
     .inter = 512,
     .n_hash = 2,
     .hc = 4,
     .ratios = {0, 0, 4, 128, 4, 128, 4, 0, 0}},
};

int ms_mkmodel_v4_is_preset(const char *name)
{
    for (size_t i = 0; i < MS_ARRAY_LEN(presets); i++)
        if (!strcmp(presets[i].name, name)) return 1;
    return 0;
}

/* ---- config.json ---- */

static json_t *config_json(const v4_preset *p, int dtype)
{
    json_t *o = json_object(), *r = json_array(), *rs = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", "DeepseekV4ForCausalLM"));
    json_object_set_new(o, "model_type", json_string("deepseek_v4"));
#define INT(k, v) json_object_set_new(o, k, json_integer(v))
#define NUM(k, v) json_object_set_new(o, k, json_real(v))
    INT("vocab_size", p->vocab);
    INT("hidden_size", p->D);
    INT("num_hidden_layers", p->L);
    INT("num_attention_heads", p->H);
    INT("num_key_value_heads", 1);
    INT("head_dim", p->hd);
    INT("qk_rope_head_dim", p->dr);
    INT("q_lora_rank", p->q_lora);
    INT("o_groups", p->G);
    INT("o_lora_rank", p->R);
    INT("sliding_window", p->window);
    INT("index_n_heads", p->nI);
    INT("index_head_dim", p->ihd);
    INT("index_topk", p->topk);
    INT("n_routed_experts", p->E);
    INT("n_shared_experts", 1);
    INT("num_experts_per_tok", p->K);
    INT("moe_intermediate_size", p->inter);
    INT("num_hash_layers", p->n_hash);
    json_object_set_new(o, "scoring_func", json_string("sqrtsoftplus"));
    json_object_set_new(o, "topk_method", json_string("noaux_tc"));
    json_object_set_new(o, "norm_topk_prob", json_true());
    NUM("routed_scaling_factor", 1.5);
    NUM("swiglu_limit", 10.0);
    json_object_set_new(o, "hidden_act", json_string("silu"));
    INT("hc_mult", p->hc);
    INT("hc_sinkhorn_iters", 20);
    NUM("hc_eps", 1e-6);
    NUM("rms_norm_eps", 1e-6);
    NUM("rope_theta", 10000.0);
    NUM("compress_rope_theta", 160000.0);
    json_object_set_new(rs, "type", json_string("yarn"));
    json_object_set_new(rs, "factor", json_real(16.0));
    json_object_set_new(rs, "original_max_position_embeddings", json_integer(p->rope_orig));
    json_object_set_new(rs, "beta_fast", json_integer(32));
    json_object_set_new(rs, "beta_slow", json_integer(1));
    json_object_set_new(o, "rope_scaling", rs);
    INT("max_position_embeddings", p->max_pos);
    INT("num_nextn_predict_layers", 1);
    for (int l = 0; l <= p->L; l++) json_array_append_new(r, json_integer(p->ratios[l]));
    json_object_set_new(o, "compress_ratios", r);
    INT("bos_token_id", 0);
    INT("eos_token_id", 1);
    json_object_set_new(o, "tie_word_embeddings", json_false());
    json_object_set_new(o, "torch_dtype",
                        json_string(dtype == MS_MK_FP32 ? "float32" : "bfloat16"));
    if (dtype == MS_MK_FP8_FP4) json_object_set_new(o, "expert_dtype", json_string("fp4"));
    if (dtype == MS_MK_FP8 || dtype == MS_MK_FP8_FP4)
        json_object_set_new(o, "quantization_config",
                            json_pack("{s:s,s:s,s:s,s:s,s:[i,i]}", "activation_scheme", "dynamic",
                                      "fmt", "e4m3", "quant_method", "fp8", "scale_fmt", "ue8m0",
                                      "weight_block_size", 128, 128));
#undef INT
#undef NUM
    return o;
}

/* ---- tensors ---- */

enum { T_UNI, T_FP8_W, T_FP8_S, T_FP4_W, T_FP4_S, T_TID };

typedef struct tensor_gen {
    char name[160]; /* the values' stream: a weight's name, also for its scales */
    int kind;
    ms_dtype dt; /* T_UNI: F32 or BF16 */
    int64_t rows, cols;
    float center, amp;
    int E, K; /* T_TID */
    uint64_t seed;
} tensor_gen;

struct v4gen {
    ms_st_writer *w;
    const v4_preset *p;
    int dtype;
    uint64_t seed;
    ms_errbuf *err;
    tensor_gen **gens;
    int64_t n_gens, cap_gens;
};

static uint64_t name_seed(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (const char *q = name; *q; q++) h = (h ^ (uint8_t)*q) * 1099511628211ull;
    return h;
}

static float *values(const tensor_gen *g)
{
    int64_t n = g->rows * g->cols;
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return NULL;
    uint64_t st = name_seed(g->seed, g->name);
    for (int64_t i = 0; i < n; i++)
        v[i] = g->center + g->amp * (float)(2.0 * ms_rng_uniform(&st) - 1.0);
    return v;
}

/* UE8M0 exponent byte of a block: the power of two >= amax / top (448 FP8, 6 FP4). */
static int block_exp(const float *v, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                     double top)
{
    float amax = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(v[r * cols + c]));
    if (amax == 0) return 127;
    int e = (int)ceil(log2((double)amax / top));
    return MS_MIN(MS_MAX(e + 127, 1), 254);
}

/* FP4 codes (T_FP4_W, [rows][cols / 2] bytes) or their per-32 scales (T_FP4_S). */
static void fill_fp4(const tensor_gen *g, const float *v, uint8_t *buf)
{
    int64_t nb = g->cols / 32;
    for (int64_t r = 0; r < g->rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            int e = block_exp(v, g->cols, r, r + 1, 32 * b, 32 * b + 32, 6.0);
            if (g->kind == T_FP4_S) {
                buf[r * nb + b] = (uint8_t)e;
                continue;
            }
            float s = ms_e8m0_to_f32((uint8_t)e);
            const float *x = v + r * g->cols + 32 * b;
            uint8_t *o = buf + r * (g->cols / 2) + 16 * b;
            for (int i = 0; i < 16; i++)
                o[i] = (uint8_t)(ms_f32_to_fp4e2m1(x[2 * i] / s) |
                                 ms_f32_to_fp4e2m1(x[2 * i + 1] / s) << 4);
        }
}

static int fill_tensor(void *ctx, const char *name, void *buf, size_t nbytes, ms_errbuf *err)
{
    const tensor_gen *g = ctx;
    (void)name;
    (void)nbytes;
    if (g->kind == T_TID) {
        uint64_t st = name_seed(g->seed, g->name);
        int64_t *o = buf;
        for (int64_t t = 0; t < g->rows; t++)
            for (int j = 0; j < g->K; j++) {
                int64_t e;
                int dup;
                do { /* k distinct experts per token */
                    e = (int64_t)(ms_rng_uniform(&st) * g->E) % g->E;
                    dup = 0;
                    for (int i = 0; i < j; i++) dup |= o[t * g->K + i] == e;
                } while (dup);
                o[t * g->K + j] = e;
            }
        return 0;
    }
    float *v = values(g);
    if (!v) return ms_err(err, MS_ENOMEM, "out of memory generating %s", g->name);
    int64_t n = g->rows * g->cols, br = (g->rows + 127) / 128, bc = (g->cols + 127) / 128;
    if (g->kind == T_FP4_W || g->kind == T_FP4_S) {
        fill_fp4(g, v, buf);
    } else if (g->kind == T_UNI) {
        if (g->dt == MS_DT_F32)
            memcpy(buf, v, sizeof(float) * (size_t)n);
        else
            for (int64_t i = 0; i < n; i++) ((uint16_t *)buf)[i] = ms_f32_to_bf16(v[i]);
    } else {
        for (int64_t bi = 0; bi < br; bi++)
            for (int64_t bj = 0; bj < bc; bj++) {
                int64_t r0 = bi * 128, r1 = MS_MIN(g->rows, r0 + 128), c0 = bj * 128,
                        c1 = MS_MIN(g->cols, c0 + 128);
                int e = block_exp(v, g->cols, r0, r1, c0, c1, 448.0);
                if (g->kind == T_FP8_S) {
                    ((uint8_t *)buf)[bi * bc + bj] = (uint8_t)e;
                    continue;
                }
                float s = ms_e8m0_to_f32((uint8_t)e);
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++)
                        ((uint8_t *)buf)[r * g->cols + c] =
                            ms_f32_to_fp8e4m3(v[r * g->cols + c] / s);
            }
    }
    free(v);
    return 0;
}

static tensor_gen *new_gen(struct v4gen *G, const char *name, int kind)
{
    void *p = G->gens;
    if (ms_grow_array(&p, &G->cap_gens, G->n_gens + 1, sizeof(tensor_gen *))) return NULL;
    G->gens = p;
    tensor_gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    G->gens[G->n_gens++] = g;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->kind = kind;
    g->seed = G->seed;
    return g;
}

/* A uniform tensor (1-D when rows == 1 and vec); F32 when f32 or --dtype fp32, else BF16. */
static int uni(struct v4gen *G, const char *name, int64_t rows, int64_t cols, int vec, float center,
               float amp, int f32)
{
    tensor_gen *g = new_gen(G, name, T_UNI);
    if (!g) return ms_err(G->err, MS_ENOMEM, "out of memory");
    g->rows = rows, g->cols = cols, g->center = center, g->amp = amp;
    g->dt = f32 || G->dtype == MS_MK_FP32 ? MS_DT_F32 : MS_DT_BF16;
    const int64_t shape[2] = {rows, cols};
    return ms_st_writer_add_gen(G->w, name, g->dt, vec ? 1 : 2, vec ? shape + 1 : shape,
                                fill_tensor, g, G->err);
}

enum {
    Q_NONE,
    Q_FP8,
    Q_EXPERT
}; /* linear()'s quantised: never, FP8, FP8 or FP4 (routed experts) */

/* A linear weight [rows][cols] of variance gain²/cols; FP8 (+ .scale) when
 * quantised and --dtype fp8 or fp8-fp4, FP4 (+ .scale) for a routed expert
 * under fp8-fp4. */
static int linear(struct v4gen *G, const char *name, int64_t rows, int64_t cols, float gain,
                  int quantised)
{
    float amp = gain * sqrtf(3.0f / (float)cols);
    int fp4 = quantised == Q_EXPERT && G->dtype == MS_MK_FP8_FP4;
    if (!quantised || (G->dtype != MS_MK_FP8 && G->dtype != MS_MK_FP8_FP4))
        return uni(G, name, rows, cols, 0, 0, amp, 0);
    if (fp4 && cols % 32)
        return ms_err(G->err, MS_EINVAL, "%s: FP4 needs columns in multiples of 32, not %lld", name,
                      (long long)cols);
    tensor_gen *g = new_gen(G, name, fp4 ? T_FP4_W : T_FP8_W),
               *s = new_gen(G, name, fp4 ? T_FP4_S : T_FP8_S);
    if (!g || !s) return ms_err(G->err, MS_ENOMEM, "out of memory");
    g->rows = s->rows = rows, g->cols = s->cols = cols, g->amp = s->amp = amp;
    const int64_t shape[2] = {rows, fp4 ? cols / 2 : cols},
                  sshape[2] = {fp4 ? rows : (rows + 127) / 128,
                               fp4 ? cols / 32 : (cols + 127) / 128};
    char sname[200];
    snprintf(sname, sizeof sname, "%.*s.scale", (int)strlen(name) - 7, name); /* X.weight */
    int rc = ms_st_writer_add_gen(G->w, name, fp4 ? MS_DT_I8 : MS_DT_F8E4M3, 2, shape, fill_tensor,
                                  g, G->err);
    if (!rc)
        rc = ms_st_writer_add_gen(G->w, sname, MS_DT_F8E8M0, 2, sshape, fill_tensor, s, G->err);
    return rc;
}

#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)

static int hc_site(struct v4gen *G, const char *p, int64_t M, int n_scale)
{
    const v4_preset *P = G->p;
    char n[200];
    int rc =
        uni(G, NAME("%s_fn", p), M, P->hc * P->D, 0, 0, sqrtf(3.0f / (float)(P->hc * P->D)), 1);
    if (!rc) rc = uni(G, NAME("%s_base", p), 1, M, 1, 0, 0.5f, 1);
    if (!rc) rc = uni(G, NAME("%s_scale", p), 1, n_scale, 1, 1.0f, 0.5f, 1);
    return rc;
}

static int ffn(struct v4gen *G, const char *p, int64_t inter, int routed)
{
    char n[200];
    int64_t D = G->p->D;
    int q = routed ? Q_EXPERT : Q_FP8;
    int rc = linear(G, NAME("%s.w1.weight", p), inter, D, 1, q);
    if (!rc) rc = linear(G, NAME("%s.w3.weight", p), inter, D, 1, q);
    if (!rc) rc = linear(G, NAME("%s.w2.weight", p), D, inter, 0.5f, q);
    return rc;
}

static int compressor(struct v4gen *G, const char *p, int ratio, int d)
{
    char n[200];
    int64_t w = (ratio == 4 ? 2 : 1) * (int64_t)d, D = G->p->D;
    int rc = linear(G, NAME("%s.wkv.weight", p), w, D, 1, 0);
    if (!rc) rc = linear(G, NAME("%s.wgate.weight", p), w, D, 1, 0);
    if (!rc) rc = uni(G, NAME("%s.ape", p), ratio, w, 0, 0, 0.5f, 1);
    if (!rc) rc = uni(G, NAME("%s.norm.weight", p), 1, d, 1, 1.0f, 0.1f, 0);
    return rc;
}

static int block(struct v4gen *G, const char *p, int ratio, int hash)
{
    const v4_preset *P = G->p;
    char n[200], q[200];
    int64_t D = P->D, M = (2 + P->hc) * P->hc;
    int rc = uni(G, NAME("%s.attn_norm.weight", p), 1, D, 1, 1.0f, 0.1f, 0);
    if (!rc) rc = uni(G, NAME("%s.ffn_norm.weight", p), 1, D, 1, 1.0f, 0.1f, 0);
    if (!rc) rc = hc_site(G, NAME("%s.hc_attn", p), M, 3);
    if (!rc) rc = hc_site(G, NAME("%s.hc_ffn", p), M, 3);
    if (!rc) rc = uni(G, NAME("%s.attn.attn_sink", p), 1, P->H, 1, 0, 0.5f, 1);
    if (!rc) rc = linear(G, NAME("%s.attn.wq_a.weight", p), P->q_lora, D, 1, 1);
    if (!rc) rc = uni(G, NAME("%s.attn.q_norm.weight", p), 1, P->q_lora, 1, 1.0f, 0.1f, 0);
    if (!rc) rc = linear(G, NAME("%s.attn.wq_b.weight", p), (int64_t)P->H * P->hd, P->q_lora, 1, 1);
    if (!rc) rc = linear(G, NAME("%s.attn.wkv.weight", p), P->hd, D, 1, 1);
    if (!rc) rc = uni(G, NAME("%s.attn.kv_norm.weight", p), 1, P->hd, 1, 1.0f, 0.1f, 0);
    if (!rc)
        rc = linear(G, NAME("%s.attn.wo_a.weight", p), (int64_t)P->G * P->R,
                    (int64_t)P->H * P->hd / P->G, 1, 1);
    if (!rc) rc = linear(G, NAME("%s.attn.wo_b.weight", p), D, (int64_t)P->G * P->R, 0.5f, 1);
    if (!rc && ratio) rc = compressor(G, NAME("%s.attn.compressor", p), ratio, P->hd);
    if (!rc && ratio == 4) {
        rc = linear(G, NAME("%s.attn.indexer.wq_b.weight", p), (int64_t)P->nI * P->ihd, P->q_lora,
                    1, 1);
        if (!rc) rc = linear(G, NAME("%s.attn.indexer.weights_proj.weight", p), P->nI, D, 1, 0);
        if (!rc) rc = compressor(G, NAME("%s.attn.indexer.compressor", p), 4, P->ihd);
    }
    if (!rc) rc = linear(G, NAME("%s.ffn.gate.weight", p), P->E, D, 1, 0);
    if (!rc && hash) {
        tensor_gen *g = new_gen(G, NAME("%s.ffn.gate.tid2eid", p), T_TID);
        if (!g) return ms_err(G->err, MS_ENOMEM, "out of memory");
        g->rows = P->vocab, g->K = P->K, g->E = P->E;
        const int64_t shape[2] = {P->vocab, P->K};
        rc = ms_st_writer_add_gen(G->w, n, MS_DT_I64, 2, shape, fill_tensor, g, G->err);
    } else if (!rc) {
        rc = uni(G, NAME("%s.ffn.gate.bias", p), 1, P->E, 1, 0, 0.1f, 1);
    }
    for (int e = 0; e < P->E && !rc; e++) {
        snprintf(q, sizeof q, "%s.ffn.experts.%d", p, e);
        rc = ffn(G, q, P->inter, 1);
    }
    snprintf(q, sizeof q, "%s.ffn.shared_experts", p);
    if (!rc) rc = ffn(G, q, P->inter, 0);
    return rc;
}

static int write_all(struct v4gen *G, const char *out_dir, int64_t shard_bytes)
{
    const v4_preset *P = G->p;
    char n[200], path[1200];
    int64_t D = P->D;
    int rc = uni(G, "embed.weight", P->vocab, D, 0, 0, 1.0f, 0);
    for (int l = 0; !rc && l < P->L; l++)
        rc = block(G, NAME("layers.%d", l), P->ratios[l], l < P->n_hash);
    if (!rc) rc = block(G, "mtp.0", P->ratios[P->L], 0);
    if (!rc) rc = linear(G, "mtp.0.e_proj.weight", D, D, 1, 1);
    if (!rc) rc = linear(G, "mtp.0.h_proj.weight", D, D, 1, 1);
    if (!rc) rc = uni(G, "mtp.0.enorm.weight", 1, D, 1, 1.0f, 0.1f, 0);
    if (!rc) rc = uni(G, "mtp.0.hnorm.weight", 1, D, 1, 1.0f, 0.1f, 0);
    if (!rc) rc = uni(G, "mtp.0.norm.weight", 1, D, 1, 1.0f, 0.1f, 0);
    if (!rc) rc = hc_site(G, "mtp.0.hc_head", P->hc, 1);
    if (!rc) rc = uni(G, "norm.weight", 1, D, 1, 1.0f, 0.1f, 0);
    if (!rc) rc = hc_site(G, "hc_head", P->hc, 1);
    if (!rc) rc = linear(G, "head.weight", P->vocab, D, 1, 0);
    if (rc) return rc;
    if (shard_bytes > 0)
        return ms_st_writer_save_sharded(G->w, out_dir, (size_t)shard_bytes, G->err);
    if (!ms_path_join(path, sizeof path, out_dir, "model.safetensors"))
        return ms_err(G->err, MS_EINVAL, "--out path too long");
    return ms_st_writer_save(G->w, path, G->err);
}
#undef NAME

int ms_mkmodel_v4_write(const char *preset, int dtype, uint64_t seed, const char *out_dir,
                        int64_t shard_bytes, ms_errbuf *err)
{
    const v4_preset *P = NULL;
    for (size_t i = 0; i < MS_ARRAY_LEN(presets); i++)
        if (!strcmp(presets[i].name, preset)) P = &presets[i];
    if (!P) return ms_err(err, MS_ENOENT, "unknown V4 preset '%s'", preset);
    if (ms_mkmodel_mkdir_p(out_dir) != 0)
        return ms_err(err, MS_EIO, "%s: cannot create directory: %s", out_dir, strerror(errno));
    char path[1200];
    if (!ms_path_join(path, sizeof path, out_dir, "config.json"))
        return ms_err(err, MS_EINVAL, "--out path too long");
    json_t *cfg = config_json(P, dtype);
    int rc = json_dump_file(cfg, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10))
                 ? ms_err(err, MS_EIO, "%s: cannot write", path)
                 : 0;
    json_decref(cfg);
    if (rc) return rc;
    struct v4gen G = {.w = ms_st_writer_new(), .p = P, .dtype = dtype, .seed = seed, .err = err};
    if (!G.w) return ms_err(err, MS_ENOMEM, "out of memory");
    rc = write_all(&G, out_dir, shard_bytes);
    ms_st_writer_free(G.w);
    for (int64_t i = 0; i < G.n_gens; i++) free(G.gens[i]);
    free(G.gens);
    return rc ? rc : ms_mkmodel_write_v4_tokenizer(out_dir, (int32_t)P->vocab, err);
}
