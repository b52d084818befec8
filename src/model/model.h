/* model.h — internal to src/model (and to the MoE layer code in src/moe,
 * which reads layer weights): a loaded DeepSeek-V2/V3-family model on one
 * rank: config, weight views into the mmapped checkpoint, RoPE table, kernel
 * context and the forward-pass workspace.  Everyone else sees ms_model only
 * through model/family.h.
 *
 * Owns the checkpoint store and everything derived from it; does not own the
 * KV cache (the scheduler does) nor any request state.  The forward pass is in
 * deepseek_v3.c; weight loading and validation in weights.c.  A model is used
 * by one thread at a time (the rank's main thread).
 */
#ifndef MS_MODEL_MODEL_H
#define MS_MODEL_MODEL_H

#include "base/error.h"
#include "base/threadpool.h"
#include "cache/kv_pool.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "model/family.h"
#include "model/shard.h"
#include "moe/moe.h" /* ms_ffn_w */

#include <stdint.h>

struct ms_st_store;

typedef struct ms_layer_w {
    float *attn_norm, *ffn_norm; /* [D] f32 copies */
    /* MLA */
    ms_mat q_a;       /* [q_lora][D]          (q_lora_rank > 0) */
    float *q_a_norm;  /* [q_lora] */
    ms_mat q_b;       /* [H*(dn+dr)][q_lora]  (q_lora_rank > 0) */
    ms_mat q;         /* [H*(dn+dr)][D]       (q_lora_rank == 0) */
    ms_mat kv_a;      /* [c+dr][D] */
    float *kv_a_norm; /* [c] */
    ms_mat kv_b;      /* [H*(dn+dv)][c] */
    ms_mat o;         /* [D][H*dv] */
    /* FFN */
    int is_moe;
    ms_ffn_w dense;    /* !is_moe */
    ms_mat router;     /* [E][D] */
    float *e_bias;     /* [E] f32, NULL when absent */
    ms_ffn_w *experts; /* [E] by logical id: the views the MoE compute reads; a held
                        * expert's is its slot's (expert_slots.c), the rest empty */
    ms_ffn_w *slots;   /* [n_slots] this rank's physical expert slots, each its own copy */
    int n_slots;
    size_t slot_bytes; /* one slot's bytes in the arena (0: not rewritable) */
    ms_ffn_w shared;   /* n_shared_experts > 0: width n_shared*moe_inter */
} ms_layer_w;

/* The extras of an MTP (next-n) layer around its decoder block (arch.md §1.7):
 * u = eh_proj · [enorm(embed(t_{i+1})), hnorm(h_i)]; logits =
 * lm_head(head_norm(block(u))), embedding and LM head shared with the main model. */
typedef struct ms_mtp_w {
    float *enorm, *hnorm, *head_norm; /* [D] f32 copies */
    ms_mat eh_proj;                   /* [D][2D] */
} ms_mtp_w;

typedef struct ms_model_ws ms_model_ws; /* forward workspace (deepseek_v3.c) */

struct ms_model {
    const ms_family *family;
    ms_model_shape shape;
    char path[1024];
    ms_config cfg;
    struct ms_st_store *st;
    ms_mat embed;         /* [vocab][D] */
    ms_mat lm_head;       /* [vocab][D] */
    float *final_norm;    /* [D] */
    ms_layer_w *layers;   /* [n_layers] (MTP layers are not loaded into the main stack) */
    int n_mtp_layers;     /* present in the checkpoint, validated (layers n_layers..) */
    ms_mtp_w *mtp;        /* [n_mtp_layers] their extras; NULL when absent (no draft) */
    ms_mat draft_head;    /* [n_draft_vocab][D] BF16 rows of lm_head (--speculative-token-map) */
    int32_t *draft_vocab; /* [n_draft_vocab] their token ids; NULL: the draft uses lm_head */
    int64_t n_draft_vocab;
    float *rope_inv_freq; /* [qk_rope_head_dim/2] */
    float softmax_scale;
    const ms_shard *shard;    /* borrowed; NULL on a single rank */
    int n_local_heads, head0; /* attention heads computed here */
    ms_pool *pool;
    ms_kctx kctx;
    ms_model_ws *ws;
    int64_t n_params;               /* parameters loaded (main stack) */
    int64_t active_bytes_per_token; /* weight bytes read per decoded token (top-k experts) */
    void *arena; /* this rank's weight matrices (2 MiB pages), NULL: views into the file */
    size_t arena_bytes;
    uint8_t *f8_plain; /* FP8 views' plain-row flags (ms_mat.f8_plain), NULL: none */
    void *panels;      /* BF16 views' panel copies (ms_mat.panels, ms_model_prepack), NULL: none */
    int64_t fwd_T, fwd_S; /* rows and context of the batch between embed and head */
    struct ms_v4 *v4;     /* DeepSeek-V4 (deepseek_v4.h); NULL for the V3 family */
};

/* The DeepSeek-V2/V3 family (deepseek_v3.c, weights.c). */
extern const ms_family ms_family_deepseek_v3;
int ms_dsv3_parse_config(const ms_config *c, ms_model_shape *out);
int ms_dsv3_open(ms_model **out, const char *dir, const ms_model_opts *opts, ms_errbuf *err);
void ms_dsv3_free(ms_model *m);
void ms_dsv3_each_view(ms_model *m, ms_view_fn fn, void *arg);

/* The DeepSeek-V4 family (deepseek_v4*.c). */
extern const ms_family ms_family_deepseek_v4;

/* The rank's kernel threads and context (opts->threads, opts->exact, the CPU's ISA). */
int ms_model_init_kernels(ms_model *m, const ms_model_opts *opts, ms_errbuf *err);
/* Copies the 1-D vector `fmt...` (F32/BF16/F16, n values) to a fresh f32 array,
 * refusing a NaN or infinity; adds n to *n_params when set. */
int ms_model_load_vec(const struct ms_st_store *st, float **out, int64_t n, int64_t *n_params,
                      ms_errbuf *err, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Places this rank's weight views (every family's each_view, and the embedding) in a
 * 2 MiB-page arena or faults in the file mapping (MOESERVE_WEIGHTS), refusing a NaN or
 * infinity, and marks FP8 plain rows (weights.c; m->arena, m->f8_plain: the caller frees). */
int ms_model_place(ms_model *m, ms_errbuf *err);
/* Per-slot routed experts (expert_slots.c).  _init: after the layer is loaded and
 * sharded, slot s takes the (file) views of the logical expert the shard's map puts
 * there; _place: after the weights were placed, measures each MoE layer's slot blobs
 * and binds the logical views to the slots. */
int ms_dsv3_slots_init(ms_model *m, ms_layer_w *lw, int layer, ms_errbuf *err);
void ms_dsv3_slots_place(ms_model *m);
/* Arena bytes of a placed view and of its FP8 block scales (weights.c's arithmetic). */
size_t ms_model_view_bytes(const ms_mat *w);
size_t ms_model_scale_bytes(const ms_mat *w);
/* Narrows an FFN's views to part `part` of `parts` of its intermediate width
 * (no copies); MS_ELAYOUT naming `what` and the layer when it does not divide. */
int ms_model_shard_ffn(ms_ffn_w *f, int parts, int part, const char *what, int layer,
                       ms_errbuf *err);

#endif
