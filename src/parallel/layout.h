/* layout.h — the launch shape (SGLang's flags) and its resolution into attention and
 * expert layouts: the one function `serve`, `generate`, the MPI rank context and
 * `moeserve plan` all call (DESIGN.md §3; seeds 000 §2, 002 "DP attention").
 *
 * Owns: ms_launch (parsed flags, SGLang defaults), the flag parser shared by every
 * command, ms_layout_resolve (group sizes, per-rank budgets, validation with messages
 * naming the flag), rank coordinates and the printed description.  Does not own
 * memory, weights or communication arithmetic (src/plan) nor any MPI call.
 * Pure functions over caller storage; any thread.
 */
#ifndef MS_PARALLEL_LAYOUT_H
#define MS_PARALLEL_LAYOUT_H

#include "base/error.h"

#include <stdbool.h>
#include <stddef.h>

/* Named limits on launch values (client/command-line controlled). */
#define MS_LAUNCH_MAX_WIDTH      65536     /* tp, dp, pp, ep, cp, world size */
#define MS_LAUNCH_MAX_RUNNING    (1 << 24) /* --max-running-requests */
#define MS_LAUNCH_MAX_CHUNK      (1 << 30) /* --chunked-prefill-size */
#define MS_LAUNCH_MAX_DRAFT      64        /* --speculative-num-draft-tokens */
#define MS_LAUNCH_MAX_REDUNDANT  65536     /* --ep-num-redundant-experts */
#define MS_LAUNCH_MAX_DISPATCH   (1 << 24) /* DeepEP dispatch tokens per rank */
#define MS_LAUNCH_MAX_PAGE       65536     /* --page-size */
#define MS_LAYOUT_MAX_VIOLATIONS 24

/* The all-to-all backend the engine runs.  SGLang's names (deepep, megamoe, mooncake,
 * nixl, mori, flashinfer) are accepted as aliases of the one all-to-all backend moeserve
 * has (MPI); the alias is kept for the rules that name it. */
typedef enum { MS_A2A_NONE = 0, MS_A2A_MPI = 1 } ms_a2a_backend;
typedef enum {
    MS_A2A_ALIAS_NONE = 0,
    MS_A2A_ALIAS_MPI,
    MS_A2A_ALIAS_DEEPEP,
    MS_A2A_ALIAS_MEGAMOE,
    MS_A2A_ALIAS_MOONCAKE,
    MS_A2A_ALIAS_NIXL,
    MS_A2A_ALIAS_MORI,
    MS_A2A_ALIAS_FLASHINFER
} ms_a2a_alias;

typedef enum { MS_SPEC_NONE = 0, MS_SPEC_EAGLE, MS_SPEC_DSPARK, MS_SPEC_NGRAM } ms_spec_algorithm;
typedef enum { MS_DISAGG_NONE = 0, MS_DISAGG_PREFILL, MS_DISAGG_DECODE } ms_disagg_mode;

/* SGLang launch flags.  0 in an "unset" field means SGLang's None / auto. */
typedef struct ms_launch {
    int tp, dp, pp;           /* --tp, --dp, --pp-size (defaults 1) */
    bool enable_dp_attention; /* --enable-dp-attention */
    int ep_size;              /* --ep-size (default 1) */
    ms_a2a_backend a2a;       /* --moe-a2a-backend */
    ms_a2a_alias a2a_alias;
    int moe_dense_tp_size;            /* --moe-dense-tp-size: 0 unset (None) or 1 */
    int moe_dp_size;                  /* --moe-dp-size (default 1) */
    int attn_cp_size;                 /* --attn-cp-size (default 1) */
    int max_running_requests;         /* --max-running-requests: global; 0 = auto */
    int chunked_prefill_size;         /* --chunked-prefill-size: global; 0 = auto, -1 = off */
    ms_spec_algorithm spec;           /* --speculative-algorithm */
    int speculative_num_draft_tokens; /* --speculative-num-draft-tokens: 0 = none */
    int speculative_num_steps;        /* --speculative-num-steps: 0 = unset */
    int speculative_eagle_topk;       /* --speculative-eagle-topk: 0 = unset */
    int ngram_min, ngram_max;         /* --speculative-ngram-min/max-match-window-size (0: unset) */
    int ngram_bfs_breadth;            /* --speculative-ngram-max-bfs-breadth (0: unset) */
    char speculative_token_map[512];  /* --speculative-token-map: "" = the full vocabulary */
    int ep_num_redundant_experts;     /* --ep-num-redundant-experts */
    int deepep_max_dispatch_tokens;   /* --deepep-max-dispatch-tokens-per-rank or env
                                       * SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK (128) */
    bool enforce_shared_experts_fusion; /* --enforce-shared-experts-fusion */
    bool disable_shared_experts_fusion; /* --disable-shared-experts-fusion */
    bool enable_waterfill;    /* --enable-waterfill (SGLang < 0.5.16: --enable-deepep-waterfill) */
    bool waterfill_dynamic;   /* SGLANG_DISABLE_STATIC_WATERFILL: EP-wide loads per layer */
    bool waterfill_old_name;  /* given as --enable-deepep-waterfill (for messages) */
    bool enable_dp_lm_head;   /* --enable-dp-lm-head */
    int kv_cache_bytes;       /* --kv-cache-dtype: 0 = auto (model dtype), else bytes */
    char kv_cache_dtype[16];  /* as given ("auto" by default) */
    int page_size;            /* --page-size (default 1, SGLang's) */
    bool page_size_set;       /* --page-size given (serve/generate default to 16) */
    int compress_state_bytes; /* --compress-state-dtype / SGLANG_DSV4_COMPRESS_STATE_DTYPE:
                               * 4 (fp32, default) or 2 (bf16) */
    bool compress_state_flag; /* --compress-state-dtype given (not only the variable) */
    double swa_full_tokens_ratio;        /* --swa-full-tokens-ratio in (0, 1]: the window pool's
                                          * tokens ÷ the whole-history pools' (0: unset) */
    bool v4_fp4_indexer;                 /* --enable-deepseek-v4-fp4-indexer: MXFP4 index keys */
    bool enable_hierarchical_cache;      /* --enable-hierarchical-cache (HiCache) */
    double hicache_ratio;                /* --hicache-ratio (host/device tokens, default 2.0) */
    bool enable_umbp;                    /* --enable-unified-cache-external-linker (UMBP) */
    bool megamoe_w4a4;                   /* --enable-w4a4-mxfp4-megamoe */
    ms_disagg_mode disagg;               /* --disaggregation-mode */
    char init_expert_location[512];      /* --init-expert-location: "" = trivial (slot p holds
                                          * p mod E), else a placement or recorded JSON file */
    int eplb_algorithm;                  /* --eplb-algorithm: MS_EPLB_* (parallel/eplb.h), auto */
    bool enable_eplb;                    /* --enable-eplb: runtime rebalancing (serve/eplb_run.c) */
    int eplb_rebalance_num_iterations;   /* forward passes between rebalances (1000) */
    int eplb_rebalance_layers_per_chunk; /* layers moved per pass (0: all at once, SGLang's None) */
    double eplb_min_utilization;         /* --eplb-min-rebalancing-utilization-threshold (1.0) */
} ms_launch;

/* Fills l with SGLang's defaults. */
void ms_launch_init(ms_launch *l);
/* Applies the environment variables SGLang reads for these settings
 * (SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK, SGLANG_DSV4_COMPRESS_STATE_DTYPE,
 * SGLANG_DISABLE_STATIC_WATERFILL).
 * Call before parsing flags so flags win.  Returns 0 or MS_EINVAL naming the variable. */
int ms_launch_apply_env(ms_launch *l, ms_errbuf *err);
/* Consumes the launch flag at argv[*i] ("--flag value" or "--flag=value") and advances
 * *i past it.  Returns 1 consumed, 0 not a launch flag (*i untouched), <0 error naming
 * the flag. */
int ms_launch_parse_arg(ms_launch *l, int argc, char **argv, int *i, ms_errbuf *err);
/* One line per launch flag for --help texts. */
const char *ms_launch_help(void);
/* The SGLang name of the a2a backend as given ("none", "deepep", ...). */
const char *ms_launch_a2a_name(const ms_launch *l);

/* What resolution needs to know about the model. */
typedef struct ms_layout_model {
    int n_heads;          /* query heads */
    int n_kv_heads;       /* GQA KV heads; 0 = one shared latent/KV (MLA, V4) */
    int n_routed_experts; /* 0 = dense model */
    int n_layers;
    int n_dense_layers; /* layers with a dense MLP instead of MoE */
} ms_layout_model;

/* How a sparse (MoE) or dense MLP layer sees its tokens (SGLang's ScatterMode). */
typedef enum {
    MS_MLP_TP_ATTN_FULL = 0, /* the attention group's tokens: no gather */
    MS_MLP_FULL,             /* all tokens of all DP groups: all-gather in, reduce-scatter out */
    MS_MLP_SCATTERED         /* each rank its own tokens: a2a dispatch/combine */
} ms_mlp_mode;

/* The shared expert on the all-to-all path.  SEPARATE: computed whole on the token's
 * own rank next to the routed experts (the default).  FUSED (SGLang's shared-expert
 * fusion, --enforce-shared-experts-fusion): one more routed expert with a slot on every
 * EP rank, weight 1 in the combine, each token's copy on its own rank.  WATERFILL
 * (--enable-waterfill): the same slot, each token's copy on the rank parallel/waterfill.h
 * picks.  All three compute the same sums. */
typedef enum { MS_SHARED_SEPARATE = 0, MS_SHARED_FUSED, MS_SHARED_WATERFILL } ms_shared_mode;

typedef struct ms_layout_violation {
    char rule[32];     /* short id, e.g. "tp_mod_dp" */
    char message[224]; /* one line naming the flag(s) */
} ms_layout_violation;

typedef struct ms_layout {
    int world_size; /* W = tp·pp with DP-attention, dp·tp·pp without */
    int tp, pp;
    int n_replicas; /* plain DP engines (dp without DP-attention), else 1 */
    int attn_tp, attn_dp, attn_cp;
    int moe_tp, moe_ep, moe_dp;
    int dense_tp;   /* dense MLP width: 1 (replicated) or tp */
    int shared_tp;  /* shared-expert width: 1 (local under a2a / replicated) or tp */
    int lm_head_tp; /* vocab split of the LM head: attn_tp with --enable-dp-lm-head, else tp */
    int embed_tp;   /* embedding split: attn_tp under DP-attention (replicated), else tp */
    ms_a2a_backend a2a;
    ms_shared_mode shared_mode; /* where the shared expert runs (a2a path) */
    bool fusion_asked;          /* --enforce-shared-experts-fusion or --enable-waterfill */
    const char *fusion_flag;    /* the flag that asked, as given (a literal), or NULL */
    ms_mlp_mode sparse_mode, dense_mode;
    bool ep_forced;               /* an a2a backend set ep = tp */
    int n_routed_experts;         /* logical experts of the model */
    int n_physical_experts;       /* routed + redundant */
    int experts_per_rank;         /* physical experts per EP rank */
    int max_running_per_rank;     /* floor(max_running / attn_dp); 0 when unset */
    int chunked_prefill_per_rank; /* floor(chunked / attn_dp); 0 unset, -1 off */
    int tokens_per_request_step;  /* rows one request adds per step: the verify width
                                   * (draft tokens; DSpark's checkpoint default 6), else 1 */
    bool has_dense;
    int n_violations;
    ms_layout_violation violations[MS_LAYOUT_MAX_VIOLATIONS];
} ms_layout;

/* Resolves a launch for a model (DESIGN.md §3).  Every rule is checked; all violations
 * are recorded in out->violations.  Returns 0 when valid, MS_ELAYOUT with the first
 * violation's message in err otherwise (out still holds the arithmetic, for `plan`). */
int ms_layout_resolve(const ms_launch *l, const ms_layout_model *m, ms_layout *out, ms_errbuf *err);
/* Appends a violation (used by src/plan for hardware and memory rules too). */
void ms_layout_add_violation(ms_layout *out, const char *rule, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* What the CPU engine does not run yet, refused before any rank loads weights (`plan`
 * still resolves these launches): --pp-size > 1, --attn-cp-size > 1, and
 * --ep-num-redundant-experts > 0 (replicas need EPLB's expert map).  Returns 0 or
 * MS_EUNSUPPORTED with a message naming the flag. */
int ms_layout_check_engine(const ms_layout *lay, ms_errbuf *err);

/* Every coordinate of one rank: the one place they are computed (communication
 * groups, the shard and the engine all read these). */
typedef struct ms_rank_coords {
    int world_rank;
    int replica; /* plain-DP engine index */
    int pp_rank;
    int tp_rank; /* rank inside the tp group of its replica/stage */
    int attn_tp_rank, attn_cp_rank, attn_dp_rank;
    int moe_tp_rank, moe_ep_rank, moe_dp_rank;
    int dense_rank;   /* slice of the dense MLP (0 when replicated) */
    int shared_rank;  /* slice of the shared expert (0 when computed whole) */
    int first_expert; /* first physical expert owned (EP), n = experts_per_rank */
} ms_rank_coords;

/* Rank order: world_rank = ((replica·pp) + pp_rank)·tp + tp_rank; inside tp, SGLang's
 * (dp, cp, tp) with tp fastest for attention and (moe_dp, ep, moe_tp) for experts;
 * dense and shared slices are contiguous blocks of tp.  Returns 0, or MS_EINVAL for a
 * rank outside the world or group sizes that do not multiply to tp. */
int ms_layout_rank_coords(const ms_layout *lay, int world_rank, ms_rank_coords *out);

/* The communication groups of one rank, SGLang's (parallel_state) membership. */
enum ms_group_kind {
    MS_GROUP_TP = 0,  /* the replica's stage: tp ranks (MLP gathers, reductions, a2a) */
    MS_GROUP_ATTN_TP, /* attention TP: same attention dp and cp rank */
    MS_GROUP_MOE_EP,  /* expert parallel: same moe_dp and moe_tp rank */
    MS_GROUP_MOE_TP,  /* expert TP: same moe_dp and ep rank */
    MS_GROUP_DENSE,   /* dense-MLP TP block */
    MS_GROUP_DP,      /* the same stage and tp rank in every plain-DP replica */
    MS_GROUP_N
};
/* Members of the group of kind k holding the rank at c: world ranks first + i·stride
 * for i < size, in group-rank order.  Returns 0 or MS_EINVAL for a bad kind. */
int ms_layout_group_span(const ms_layout *lay, const ms_rank_coords *c, int kind, int *first,
                         int *stride, int *size);

/* The seed-style one-liner, e.g. "attention TP=1, DP=4 · routed experts TP=1, EP=4 ·
 * dense/shared replicated".  Returns the length that would have been written. */
int ms_layout_describe(const ms_layout *lay, char *buf, size_t cap);
/* A multi-line table of every group size and per-rank budget. */
int ms_layout_describe_table(const ms_layout *lay, char *buf, size_t cap);

#endif
