/* deepseek_v4.h — internal to src/model: the DeepSeek-V4 family (arch.md
 * §2): its config beyond the shared shape, its layer weights, its forward
 * workspace and the functions its files share.
 *
 * Files: deepseek_v4.c (the family table, config, cache streams, embed /
 * layers / head with the mHC residual), deepseek_v4_attn.c (attention,
 * compressor, indexer), deepseek_v4_load.c (tensor names, shapes, dtypes,
 * FP8 UE8M0 scales, shards).  A V4 model is an ms_model whose v4 member is
 * set (the V3 members stay empty).  Main thread only.
 */
#ifndef MS_MODEL_DEEPSEEK_V4_H
#define MS_MODEL_DEEPSEEK_V4_H

#include "model/model.h"
#include "moe/mlp_layer.h"

#include <jansson.h>
#include <stdint.h>

/* What config.json says beyond ms_model_shape (HF names, arch.md §2.2). */
typedef struct ms_v4_cfg {
    int64_t D, vocab, max_pos;
    int n_layers, H, hd, dr; /* heads, head_dim (512), rope dims (the last dr of each head) */
    int q_lora, o_groups, o_lora, window;
    int n_idx_heads, idx_hd, idx_topk;
    int E, n_shared, K, inter, n_hash;
    int hc, sinkhorn_iters;
    float hc_eps, eps;
    float rope_theta, compress_rope_theta, rope_factor, beta_fast, beta_slow;
    int64_t rope_orig; /* original_max_position_embeddings; 0: no YaRN */
    int n_mtp;
    int16_t ratio[MS_KV_MAX_LAYERS + 1]; /* per layer (and the MTP slot): 0, 4, 128 */
} ms_v4_cfg;

/* Reads the V4 fields of a config.json (defaults as the HF config's). */
int ms_v4_cfg_parse(const json_t *root, ms_v4_cfg *c, ms_errbuf *err);

/* One compressor (arch.md §2.7): ratio m, entry width d; overlap (m = 4) doubles
 * the projected width (c' = 2). */
typedef struct v4_comp {
    int ratio, d, overlap;
    ms_mat wkv, wgate; /* [c'·d][D] */
    float *ape;        /* [m][c'·d] f32 */
    float *norm;       /* [d] */
} v4_comp;

typedef struct v4_layer {
    int ratio;
    float *attn_norm, *ffn_norm;         /* [D] */
    ms_mat hc_attn_fn, hc_ffn_fn;        /* [(2+hc)·hc][hc·D] f32 */
    float *hc_attn_base, *hc_ffn_base;   /* [(2+hc)·hc] */
    float *hc_attn_scale, *hc_ffn_scale; /* [3] */
    float *sink;                         /* [H] (this rank's heads from head0) */
    ms_mat wq_a;                         /* [q_lora][D] */
    float *q_norm;                       /* [q_lora] */
    ms_mat wq_b;                         /* [H_local·hd][q_lora] */
    ms_mat wkv;                          /* [hd][D] */
    float *kv_norm;                      /* [hd] */
    ms_mat wo_a;                         /* [G_local·R][H·hd/G] */
    ms_mat wo_b;                         /* [D][G_local·R] */
    v4_comp comp;                        /* ratio != 0 */
    /* indexer (ratio 4) */
    ms_mat iwq_b;  /* [nI·ihd][q_lora] */
    ms_mat iwproj; /* [nI][D] */
    v4_comp icomp; /* d = ihd, ratio 4 */
    /* MoE */
    ms_mat router;     /* [E][D] */
    float *bias;       /* [E], NULL on hash layers */
    int32_t *tid2eid;  /* [vocab][K], hash layers only */
    ms_ffn_w *experts; /* [E] */
    ms_ffn_w shared;
    /* MTP block only */
    ms_mat e_proj, h_proj;        /* [D][D] */
    float *enorm, *hnorm, *mnorm; /* [D] */
    ms_mat hc_head_fn;            /* [hc][hc·D] */
    float *hc_head_base, *hc_head_scale;
} v4_layer;

typedef struct ms_v4_ws {
    int64_t cap_T;
    float *X;                 /* [T][hc][D] residual streams */
    float *Xn;                /* [T][hc][D] after a sub-block */
    float *mix;               /* [T][(2+hc)·hc] */
    float *pre, *post, *comb; /* [T][hc], [T][hc], [T][hc][hc] */
    float *u, *f;             /* [T][D] */
    float *qr;                /* [T][q_lora] */
    float *q;                 /* [T][H·hd] */
    float *kv;                /* [T][hd] */
    float *o;                 /* [T][H·hd] */
    float *z;                 /* [T][G·R] */
    float *ca, *cg;           /* [T][2·hd] compressor projections */
    float *iq;                /* [T][nI·ihd] */
    float *iw;                /* [T][nI] */
    int32_t *tok;             /* [T] token ids of the rows */
    int64_t cap_S;
    float *cand;   /* [cap_S][hd] one query's candidate entries */
    float *isc;    /* [cap_S] indexer scores */
    float *ik;     /* [cap_S][ihd] one query's index keys */
    float *iscore; /* [nI][cap_S] per-head index products */
    float *isr;    /* [2·n_th][cap_S] the index scores of a sequence's decode rows
                    * (a decode's one, a verify's S + 1: fewer than 2·n_th take that path) */
    int32_t *sel;  /* [cap_S] selected entries */
    /* the threaded path (deepseek_v4_attn.c): one sequence's entries loaded once */
    float *win; /* [cap_win][hd] window entries of a chunk's positions */
    int64_t cap_win;
    float *cbuf;         /* [cap_S][hd] its C128 entries, or a prefill's C4 entries */
    struct v4_th {       /* per pool thread: one query row's scratch (th[0].cand: a decode row's) */
        float *isc, *sc; /* [cap_S] index scores; ms_attn_mqa's scratch */
        int32_t *sel;    /* [cap_S] selected C4 entries */
        const float **cand; /* [cap_S] candidate rows */
        float *kb;          /* [64][idx_hd] a decode row's block of index keys */
    } * th;
    int n_th;
    float *cstate; /* [cap_cstate] one compressor's state in f32 (BF16-stored state) */
    int64_t cap_cstate;
    float *hn, *logits; /* [T][D], [cap_logits][vocab] */
    ms_batch_seq *kseq; /* [cap_kseq] the draft's sequences cut to their output rows */
    int cap_kseq;
    int64_t cap_logits;
    ms_mlp_ws mlp;
} ms_v4_ws;

struct ms_v4 {
    ms_v4_cfg c;
    v4_layer *layers;  /* [n_layers + n_mtp] (the MTP block: the speculative draft) */
    ms_mat hc_head_fn; /* [hc][hc·D] */
    float *hc_head_base, *hc_head_scale;
    float *inv_freq_plain, *inv_freq_comp; /* [dr/2]: ratio-0 layers, compressed layers */
    int n_local_groups, group0;
    int64_t *state_off; /* [n_layers] float offset of each layer's compressor state */
    float **scales;     /* f32 copies of UE8M0 block scales (owned) */
    int64_t n_scales, cap_scales;
    ms_v4_ws ws;
    int attn_ref; /* 1: attention by the scalar one-row-at-a-time reference (tests) */
    /* Measurement hook (bench_v4 --rows topk), NULL in the engine: called on the main
     * thread after a decode row's CSA top-k with that row's indexer queries iq
     * [n_idx_heads][idx_hd] (roped; rotated and rounded when the keys are packed),
     * head weights iw [n_idx_heads] (scaled), the nk keys it scored and the k entries
     * it chose, sel[k]. */
    void (*topk_probe)(void *ctx, int layer, int64_t pos, const float *iq, const float *iw,
                       int64_t nk, const int32_t *sel, int k);
    void *topk_probe_ctx;
};

/* Stream indices of the V4 kv_spec (V4_S_CARRY and V4_S_WSNAP: only in the engine's
 * spec, the snapshots a prefix hit restores at a share unit). */
enum {
    V4_S_WINDOW = 0,
    V4_S_C4 = 1,
    V4_S_C128 = 2,
    V4_S_INDEX = 3,
    V4_S_CARRY = 4,
    V4_S_WSNAP = 5
};

/* State values of one CSA layer's carry snapshot: the main and the indexer
 * compressor's previous window, kv and score rows [4][2·d] each. */
int64_t ms_v4_carry_values(int hd, int ihd);

/* Compressor state: each compressor's kv and score rows, one slot per token
 * position (slot = pos mod slots): the windows it pools (two for ratio 4's
 * overlap, one for ratio 128) and V4_STATE_SPILL slots past them, so the
 * rows of draft positions a verify writes and then rejects never overwrite
 * a row an accepted position still needs; the rejected rows are written
 * again when those positions are decoded, and no state needs rolling back.
 * The most draft tokens one verify may carry on V4 (--speculative-num-steps). */
enum { V4_STATE_SPILL = 4 };
static inline int64_t ms_v4_comp_slots(int ratio)
{
    return (ratio == 4 ? 8 : ratio) + V4_STATE_SPILL;
}

/* Floats of compressor state of one layer (main + indexer), 0 for ratio 0. */
int64_t ms_v4_state_floats(int ratio, int hd, int ihd);

int ms_v4_load(ms_model *m, const ms_model_opts *opts, ms_errbuf *err);
void ms_v4_free_weights(ms_model *m);
void ms_v4_each_view(ms_model *m, ms_view_fn fn, void *arg);
int64_t ms_v4_local_weight_bytes(const ms_model *m);

/* Attention of layer l over the batch: reads ws->u [T][D], writes ws->f [T][D]
 * (partial sums all-reduced over the attention-TP group); caches the window
 * entries, compressed entries, index keys and compressor state. */
int ms_v4_attention(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                    int l, ms_errbuf *err);
/* The window entries of every row of the batch for a window-only layer l
 * (ws->u [T][D] normed: its wkv, kv_norm and RoPE) and nothing else: the
 * draft block's rows whose attention output nobody reads. */
int ms_v4_store_window(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                       int l, ms_errbuf *err);
/* Candidate scratch for contexts up to S entries and n_win window rows (the
 * threaded path's shared window span), per pool thread too. */
int ms_v4_ws_attn_reserve(ms_model *m, int64_t S, int64_t n_win);

#endif
