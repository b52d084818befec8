/* model.h — a loaded DeepSeek-V2/V3-family model on one rank: config, weight
 * views into the mmapped checkpoint, RoPE table, kernel context and the
 * forward-pass workspace.
 *
 * Owns the checkpoint store and everything derived from it; does not own the
 * KV pool (the scheduler does) nor any request state.  The forward pass is in
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
#include "model/shard.h"

#include <stdint.h>

struct ms_st_store;

typedef struct ms_ffn_w {  /* one SwiGLU FFN: dense MLP, shared expert or routed expert */
    ms_mat gate, up;       /* [inter][D] */
    ms_mat down;           /* [D][inter] */
} ms_ffn_w;

typedef struct ms_layer_w {
    float *attn_norm, *ffn_norm;  /* [D] f32 copies */
    /* MLA */
    ms_mat q_a;                   /* [q_lora][D]          (q_lora_rank > 0) */
    float *q_a_norm;              /* [q_lora] */
    ms_mat q_b;                   /* [H*(dn+dr)][q_lora]  (q_lora_rank > 0) */
    ms_mat q;                     /* [H*(dn+dr)][D]       (q_lora_rank == 0) */
    ms_mat kv_a;                  /* [c+dr][D] */
    float *kv_a_norm;             /* [c] */
    ms_mat kv_b;                  /* [H*(dn+dv)][c] */
    ms_mat o;                     /* [D][H*dv] */
    /* FFN */
    int is_moe;
    ms_ffn_w dense;               /* !is_moe */
    ms_mat router;                /* [E][D] */
    float *e_bias;                /* [E] f32, NULL when absent */
    ms_ffn_w *experts;            /* [E] */
    ms_ffn_w shared;              /* n_shared_experts > 0: width n_shared*moe_inter */
} ms_layer_w;

typedef struct ms_model_opts {
    int threads;  /* <= 0: all cores */
    int exact;    /* 1: --dtype float32 */
    const ms_shard *shard; /* NULL: this rank holds the whole model */
} ms_model_opts;

typedef struct ms_model_ws ms_model_ws; /* forward workspace (deepseek_v3.c) */

typedef struct ms_model {
    char path[1024];
    ms_config cfg;
    struct ms_st_store *st;
    ms_mat embed;        /* [vocab][D] */
    ms_mat lm_head;      /* [vocab][D] */
    float *final_norm;   /* [D] */
    ms_layer_w *layers;  /* [n_layers] (MTP layers are not loaded into the main stack) */
    int n_mtp_layers;    /* present in the checkpoint, validated, kept for later use */
    float *rope_inv_freq;/* [qk_rope_head_dim/2] */
    float softmax_scale;
    const ms_shard *shard; /* borrowed; NULL on a single rank */
    int n_local_heads, head0; /* attention heads computed here */
    ms_pool *pool;
    ms_kctx kctx;
    ms_model_ws *ws;
    int64_t n_params;    /* parameters loaded (main stack) */
    int64_t active_bytes_per_token; /* weight bytes read per decoded token (top-k experts) */
    void *arena; /* this rank's weight matrices (2 MiB pages), NULL: views into the file */
    size_t arena_bytes;
    uint8_t *f8_plain; /* FP8 views' plain-row flags (ms_mat.f8_plain), NULL: none */
} ms_model;

int ms_model_open(ms_model **out, const char *dir, const ms_model_opts *opts, ms_errbuf *err);
void ms_model_free(ms_model *m);

/* MOESERVE_PROFILE=1: prints the forward's wall seconds per phase since the
 * last print to stderr and starts counting again (also done by ms_model_free). */
void ms_model_profile_print(void);

/* MLP-layer communication choices so far on this rank: DP-gather steps that used
 * MAX_LEN / SUM_LEN, and rows dispatched to other ranks (Σ tokens × remote ranks). */
void ms_model_mlp_counters(const ms_model *m, int64_t *max_len, int64_t *sum_len,
                           int64_t *dispatch_rows);

/* Prepacks every BF16 weight view of this rank for oneDNN now (all but the
 * LM head), instead of at its first prefill of >= 128 rows (ms_kernels_dnnl_
 * prepack; the copies count against MOESERVE_DNNL_MB).  Returns the views
 * held.  Main thread only. */
int64_t ms_model_prepack(ms_model *m);

/* Bytes of the weight views this rank reads (its shard; embeddings and head included). */
int64_t ms_model_local_weight_bytes(const ms_model *m);

/* KV row width per token per layer (MLA: kv_lora_rank + qk_rope_head_dim). */
static inline int64_t ms_model_kv_row_elems(const ms_model *m)
{
    return m->cfg.kv_lora_rank + m->cfg.qk_rope_head_dim;
}

/* One sequence's slice of a forward batch: n_tokens new tokens at positions
 * start_pos .. start_pos+n_tokens-1.  Its KV pages (page_table, borrowed)
 * must already cover every position up to start_pos+n_tokens-1; positions
 * below start_pos must already be in the cache. */
typedef struct ms_batch_seq {
    const int32_t *tokens;
    int32_t n_tokens;
    int64_t start_pos;
    const int32_t *page_table;
    float *logits;       /* [vocab] logits of the last new token, or NULL for none */
} ms_batch_seq;

/* Runs the forward pass for a batch of sequences, writing their KV entries
 * into pool and the requested logits.  Returns 0 or a negative MS_E*. */
int ms_model_forward(ms_model *m, ms_kv_pool *pool, const ms_batch_seq *seqs, int n_seqs,
                     ms_errbuf *err);

#endif
