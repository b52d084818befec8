/* family.h — model families as a table (DESIGN.md §5), the read-only shape
 * every family parses from config.json, and the model handle the rest of
 * the program sees.
 *
 * A family (DeepSeek-V2/V3/R1/Moonlight in deepseek_v3.c; the planner-only
 * DeepSeek-V4, Qwen3-MoE and Llama-style GQA in planner_families.c) is one
 * struct of functions: match a config.json, parse its shape (no weights),
 * list its cache streams (kv_spec), open its weights for this rank's shard,
 * the forward in three pieces over one batch (embed, run_layers(first, last),
 * head), iterate its weight views, free.  ms_family_parse is the one
 * config.json reader for the engine and `moeserve plan`.  ms_model is opaque
 * outside src/model (and the MoE layer code, which reads layer weights).
 * Tables and shapes: any thread; a model: the rank's main thread.
 */
#ifndef MS_MODEL_FAMILY_H
#define MS_MODEL_FAMILY_H

#include "base/error.h"
#include "base/threadpool.h"
#include "cache/kv_cache.h"
#include "cache/kv_spec.h"
#include "kernels/kernels.h"
#include "model/shard.h"

#include <stdbool.h>
#include <stdint.h>

struct json_t; /* jansson's, kept out of this header */

typedef enum { MS_ATTN_MLA = 0, MS_ATTN_V4, MS_ATTN_GQA } ms_attn_kind;
typedef enum { MS_WEIGHTS_FP8 = 0, MS_WEIGHTS_BF16, MS_WEIGHTS_FP4_EXPERTS } ms_weights_format;

typedef struct ms_family ms_family;

/* What config.json says about a model's size, for the engine, the layout and
 * the planner.  Filled by a family's parse; read-only afterwards. */
typedef struct ms_model_shape {
    char name[64];           /* model_type, or a preset's name */
    const ms_family *family; /* the family that parsed it */
    ms_attn_kind attn;
    int64_t vocab, hidden, intermediate, moe_intermediate;
    int n_layers, first_k_dense, moe_layer_freq;
    int n_heads, n_kv_heads, head_dim; /* GQA (and V4 head_dim 512); 0 kv heads: shared */
    int q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim; /* MLA */
    int n_routed, n_shared, topk;
    bool tie_embeddings, qk_norm, router_bias;
    /* V4 */
    int o_groups, o_lora_rank, window, index_n_heads, index_head_dim, n_hash_layers, hc_mult;
    int index_topk; /* compressed entries the CSA indexer picks */
    int n_ratios;
    int16_t compress_ratios[MS_KV_MAX_LAYERS]; /* per layer: 0 window-only, 4 CSA, 128 HCA */
    int n_mtp_layers;
    int64_t max_context;
    int64_t bos_token_id, eos_token_id; /* -1 when absent */
    int fp8_scale_bytes;                /* 4: F32 per 128×128 block; 1: UE8M0 */
    ms_weights_format published;        /* the checkpoint's format */
    double recipe_min_weight_gb;        /* set by planner presets only: a recipe's minimum */
} ms_model_shape;

bool ms_shape_layer_is_moe(const ms_model_shape *s, int layer);
int ms_shape_n_moe_layers(const ms_model_shape *s);
/* The part of the shape the layout resolution needs (parallel/layout.h). */
void ms_shape_layout_model(const ms_model_shape *s, ms_layout_model *out);

typedef struct ms_model ms_model;

typedef struct ms_model_opts {
    int threads;           /* <= 0: all cores */
    int exact;             /* 1: --dtype float32 */
    int batch_invariant;   /* 1: --enable-deterministic-inference (ms_kctx.batch_invariant) */
    const ms_shard *shard; /* NULL: this rank holds the whole model */
} ms_model_opts;

/* One sequence of a forward batch (the batch contract, DESIGN.md §5):
 * n_tokens new tokens at positions start_pos .. start_pos+n_tokens-1.  Its
 * hold on the KV cache (kv, borrowed: pages of every stream) must already
 * cover every position up to start_pos+n_tokens-1; positions below
 * start_pos must already be cached.  The forward reads and writes it
 * through an ms_kv_view.
 * kind: prefill chunk, decode (one token) or verify (the last accepted token
 * plus k drafts).  The last n_logits positions (0, 1, or k+1 for a verify)
 * write their logits to logits [n_logits][vocab] and, when hidden is set,
 * their final hidden states (the rows the LM head reads: after the final
 * norm, as SGLang's captured hidden states; DeepSeek-V4: the hc_mult residual
 * streams before hc_head, ms_model_draft_hidden_width floats) to
 * hidden [n_logits][hidden];
 * n_hidden > 0 asks for the hidden states of the last n_hidden positions
 * instead (hidden [n_hidden][hidden], with or without logits: what the
 * speculative draft layer reads after a prefill chunk or a verify).
 * logits set with n_logits 0 means 1 (the last position).
 * The draft forward (ms_model_draft_forward) reads hidden_in [n_tokens][hidden]
 * too: position p's token is the one after p, hidden_in's row the target's
 * (or, further along a draft chain, the draft layer's own) state at p. */
typedef enum { MS_SEQ_PREFILL = 0, MS_SEQ_DECODE = 1, MS_SEQ_VERIFY = 2 } ms_seq_kind;

typedef struct ms_batch_seq {
    const int32_t *tokens;
    int32_t n_tokens;
    int64_t start_pos;
    const ms_kv_seq *kv;
    float *logits;          /* [n_logits][vocab], or NULL for none */
    int32_t n_logits;       /* trailing positions wanting logits (0 with logits set: 1) */
    int32_t kind;           /* ms_seq_kind */
    float *hidden;          /* [n_logits or n_hidden][hidden_width] or NULL */
    int32_t n_hidden;       /* trailing positions wanting hidden states (0: n_logits) */
    const float *hidden_in; /* draft forward only: [n_tokens][hidden_width] */
} ms_batch_seq;

/* One view callback: a weight matrix of this rank; MS_VIEW_LM_HEAD marks the LM head. */
enum { MS_VIEW_LM_HEAD = 1 };
typedef void (*ms_view_fn)(ms_mat *w, unsigned flags, void *arg);

struct ms_family {
    const char *name;   /* "deepseek_v3" */
    const char *models; /* "DeepSeek-V2/V3/R1, Moonlight, Kimi-K2" */
    /* 1 when this config.json (its architectures / model_type / fields) is ours */
    int (*match)(const struct json_t *root);
    /* the read-only shape; errors name the field */
    int (*parse)(const struct json_t *root, ms_model_shape *out, ms_errbuf *err);
    /* the cache streams of this shape (kv_spec.h) */
    int (*kv_spec)(const ms_model_shape *s, const ms_kv_spec_opts *o, ms_kv_spec *out,
                   ms_errbuf *err);
    /* loads this rank's shard; NULL: planner-only (ms_family_open refuses, naming it) */
    int (*open)(ms_model **out, const char *dir, const ms_model_opts *o, ms_errbuf *err);
    /* the forward over one batch, writing KV entries into cache: embed fills
     * the hidden rows, run_layers(first, last) runs layers [first, last),
     * head writes the wanted logits and hidden states */
    int (*embed)(ms_model *m, const ms_batch_seq *seqs, int n_seqs, ms_errbuf *err);
    int (*run_layers)(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                      int first, int last, ms_errbuf *err);
    int (*head)(ms_model *m, const ms_batch_seq *seqs, int n_seqs, ms_errbuf *err);
    void (*each_view)(ms_model *m, ms_view_fn fn, void *arg);
    void (*free)(ms_model *m);
    /* the speculative draft layer (MTP) over one batch whose sequences carry
     * hidden_in; writes its own cache layer, logits and hidden states as head
     * does.  NULL: the family has none */
    int (*draft)(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                 ms_errbuf *err);
    /* 1: in an attention-TP group of more than one rank, head and draft split the LM head's
     * vocab rows over the group's members and write logits on the group's rank 0 only; every
     * member must then pass the same logit rows (logits set, with the leader's n_logits; the
     * members' buffers are left unwritten).  0: rank 0 alone computes them */
    int head_split;
};

/* Every registered family, in match order (NULL-terminated). */
const ms_family *const *ms_families(void);
const ms_family *ms_family_by_name(const char *name);

/* The one config.json reader: finds the family that matches and parses its
 * shape.  *fam may be NULL.  Errors name the field; an unknown model names
 * the families known. */
int ms_family_parse(const char *json_text, const ms_family **fam, ms_model_shape *out,
                    ms_errbuf *err);
/* The same for <dir>/config.json or a file path (is_dir 0). */
int ms_family_load(const char *path, int is_dir, const ms_family **fam, ms_model_shape *out,
                   ms_errbuf *err);
int ms_family_kv_spec(const ms_model_shape *s, const ms_kv_spec_opts *o, ms_kv_spec *out,
                      ms_errbuf *err);

/* Opens the model in dir with the family its config.json names; a planner-
 * only family is refused with a message naming it. */
int ms_model_open(ms_model **out, const char *dir, const ms_model_opts *opts, ms_errbuf *err);
void ms_model_free(ms_model *m);

const ms_family *ms_model_family(const ms_model *m);
const ms_model_shape *ms_model_shape_of(const ms_model *m);
int ms_model_head_split(const ms_model *m);   /* the family's head_split (ms_family) */
ms_pool *ms_model_threads(const ms_model *m); /* the rank's kernel threads */
int64_t
ms_model_active_bytes_per_token(const ms_model *m); /* weight bytes read per decoded token */
int64_t ms_model_n_params(const ms_model *m);
int ms_model_n_mtp_layers(const ms_model *m);
/* 1 when the model can run a draft forward (its MTP layer and the layer's
 * enorm, hnorm, eh_proj and shared_head.norm were loaded). */
int ms_model_has_draft(const ms_model *m);
/* One step of the draft layer over seqs (hidden_in set on each; see
 * ms_batch_seq): its KV entries go to the cache layer after the main stack
 * (the kv_spec covers it when draft_tokens > 0).  Only a sequence's last
 * ms_draft_out_rows positions run the layer past its cache write (attention
 * output, MoE, head): the draft is a single layer, so nothing reads the other
 * positions' outputs; the MoE and its collectives see those rows only, and
 * the rows_per_rank counts of the step must be of them.  Returns 0 or MS_E*. */
int32_t ms_draft_out_rows(const ms_batch_seq *sq); /* max(1, logit rows, hidden rows) */
/* Cuts *b to its last keep positions (tokens, start_pos, and hidden_in rows of
 * hidden_width floats); nothing when it has no more. */
void ms_batch_seq_keep_last(ms_batch_seq *b, int32_t keep, int64_t hidden_width);
/* Floats of one hidden-state row the draft reads (hidden, hidden_in): the
 * hidden size, or DeepSeek-V4's hc_mult residual streams of it. */
int64_t ms_model_draft_hidden_width(const ms_model *m);
/* The most draft tokens one verify may carry (0: no limit): DeepSeek-V4's
 * compressor state keeps that many rows past its windows (deepseek_v4.h). */
int ms_model_max_spec_steps(const ms_model *m);
/* The draft's LM head over ids[0..n) only (SGLang's --speculative-token-map,
 * FR-Spec): a BF16 copy of those lm_head rows; the draft forward's logits are
 * then [n] wide, column j the logit of ids[j].  The drafts change, never the
 * output (verification).  ms_model_draft_vocab: n and the ids (0: full vocab). */
int ms_model_set_draft_vocab(ms_model *m, const int32_t *ids, int64_t n, ms_errbuf *err);
int64_t ms_model_draft_vocab(const ms_model *m, const int32_t **ids);
int ms_model_draft_forward(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs,
                           int n_seqs, ms_errbuf *err);
/* Physical expert slots (EPLB; model/expert_slots.c).  Layer l's routed experts on
 * this rank are ms_model_expert_slots(m, l) slots (0: a dense layer, or a family
 * whose slots are not built: DeepSeek-V4), slot s holding the logical expert
 * ms_shard_expert(shard, l, s).  A slot is one blob of _slot_bytes (0: not
 * rewritable: the weights are read from the file mapping, MOESERVE_WEIGHTS=mmap);
 * _slot_blob is its bytes (borrowed, read-only).  _slot_write copies a blob of
 * another slot of the layer (any rank's: same shapes and dtypes) into slot s and
 * refreshes the slot's derived copies (FP8 plain-row flags, oneDNN prepacks);
 * after the shard's map of the layer changed, _slots_bind points the compute's
 * logical views at the slots again.  Main thread, between forwards. */
int ms_model_expert_slots(const ms_model *m, int layer);
size_t ms_model_expert_slot_bytes(const ms_model *m, int layer);
const void *ms_model_expert_slot_blob(const ms_model *m, int layer, int slot);
int ms_model_expert_slot_write(ms_model *m, int layer, int slot, const void *blob, ms_errbuf *err);
void ms_model_expert_slots_bind(ms_model *m, int layer);
/* Bytes of the weight views this rank reads (its shard; embeddings and head included). */
int64_t ms_model_local_weight_bytes(const ms_model *m);
/* Prepacks every BF16 weight view of this rank now: into panels
 * (ms_kernels_panels_fill, one block the model owns; the LM head included;
 * in each_view order up to MOESERVE_PANELS_MB, default 4096 MiB),
 * or with MOESERVE_PANELS=0 for oneDNN (all but the LM head, instead of at
 * its first prefill of >= 128 rows; ms_kernels_dnnl_prepack, the copies
 * count against MOESERVE_DNNL_MB).  Returns the views held; *bytes the bytes
 * of their copies; once panels are held, a second call makes nothing (0).
 * Main thread only. */
int64_t ms_model_prepack(ms_model *m, size_t *bytes);
/* The cache streams of this model (the family's kv_spec over its shape). */
int ms_model_kv_spec(const ms_model *m, const ms_kv_spec_opts *o, ms_kv_spec *out, ms_errbuf *err);

/* The whole forward: embed, run_layers(0, n_layers), head.  Returns 0 or a
 * negative MS_E*. */
int ms_model_forward(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                     ms_errbuf *err);

/* MOESERVE_PROFILE=1: prints the forward's wall seconds per phase since the
 * last print to stderr and starts counting again (also done by ms_model_free). */
void ms_model_profile_print(void);
/* MLP-layer communication choices so far on this rank: DP-gather steps that used
 * MAX_LEN / SUM_LEN, rows dispatched to other ranks (Σ tokens × remote ranks), and on
 * the a2a path the expert rows computed here (routed entries + shared-expert rows) and
 * this rank's rows whose fused shared expert ran on another rank (waterfill). */
typedef struct ms_mlp_counters {
    int64_t max_len, sum_len, dispatch_rows, expert_rows, shared_remote;
} ms_mlp_counters;
void ms_model_mlp_counters(const ms_model *m, ms_mlp_counters *out);

#endif
