/* plan.h — `moeserve plan`: what a launch shape resolves to on a fleet, without hardware.
 *
 * Owns the model and device presets (config.json text read by the family table,
 * model/family.h), and the
 * arithmetic of seeds 000/002/003: weights per rank, KV bytes per token and per request,
 * pools and tokens per rank, cluster distinct tokens, DP-gather vs EP dispatch/combine
 * bytes, expert bytes streamed per step, the attention intensity trend, and the
 * hardware/memory constraints.  Layout resolution itself is src/parallel/layout.c (the
 * same function `serve` calls).  Pure functions over caller storage; any thread, except
 * ms_plan_sweep_plot, which runs gnuplot.
 */
#ifndef MS_PLAN_PLAN_H
#define MS_PLAN_PLAN_H

#include "base/error.h"
#include "model/family.h"
#include "parallel/layout.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define MS_PLAN_MAX_LAYERS       1024       /* config.json num_hidden_layers limit */
#define MS_PLAN_MAX_CONFIG_BYTES (1u << 20) /* config.json size limit */
#define MS_PLAN_MAX_SWEEP        64         /* context points or layouts in a sweep */

/* The planner's model is the family's read-only shape (model/family.h): presets
 * and config.json files go through the same family parser the engine uses. */
typedef ms_model_shape ms_plan_model;
typedef ms_weights_format ms_plan_weights;

typedef enum {
    MS_GPU_BLACKWELL = 0,
    MS_GPU_BLACKWELL_DESKTOP,
    MS_GPU_HOPPER,
    MS_GPU_CDNA,
    MS_GPU_CPU
} ms_plan_gpu_family;

typedef struct ms_plan_gpu {
    char name[32];
    double mem_gb;    /* per device, 10^9 bytes as the seeds count ("four 192-GB B200s") */
    double link_gb_s; /* one direction, 10^9 B/s; 0 = unknown */
    ms_plan_gpu_family family;
} ms_plan_gpu;

/* Presets: return 0 or MS_ENOENT with the list of names in err. */
int ms_plan_model_preset(const char *name, ms_plan_model *out, ms_errbuf *err);
int ms_plan_gpu_preset(const char *name, ms_plan_gpu *out, ms_errbuf *err);
const char *ms_plan_model_names(void);
const char *ms_plan_gpu_names(void);
/* Reads an HF config.json through the family table (ms_family_parse): DeepSeek
 * V2/V3/V4, Qwen3-MoE, Llama-style GQA. */
int ms_plan_model_load(const char *path, ms_plan_model *out, ms_errbuf *err);
int ms_plan_model_parse(const char *json_text, ms_plan_model *out, ms_errbuf *err);
bool ms_plan_layer_is_moe(const ms_plan_model *m, int layer);
int ms_plan_n_moe_layers(const ms_plan_model *m);
void ms_plan_layout_model(const ms_plan_model *m, ms_layout_model *out);

typedef struct ms_plan_input {
    ms_plan_model model;
    ms_plan_weights weights;
    bool have_gpu;
    ms_plan_gpu gpu;
    int num_gpus;        /* 0 = the layout's world size */
    double reserve_gb;   /* < 0 unset */
    double mem_fraction; /* < 0 unset; default 0.88 when neither is set */
    double kv_pool_gib;  /* < 0 unset: fixed pool per rank */
    ms_launch launch;
    int64_t context_len;     /* 0 = the model's maximum */
    int64_t tokens_per_step; /* global T_g; 0 = running ceiling × verify width, else 1024 */
    double link_gb_s;        /* 0 = the device preset's */
} ms_plan_input;

void ms_plan_input_init(ms_plan_input *in);

/* Weight components (model totals before sharding). */
enum {
    MS_WC_ATTENTION = 0,
    MS_WC_DENSE_MLP,
    MS_WC_SHARED,
    MS_WC_ROUTED,
    MS_WC_ROUTER,
    MS_WC_EMBED,
    MS_WC_LM_HEAD,
    MS_WC_OTHER,
    MS_WC_COUNT
};
const char *ms_plan_component_name(int c);

typedef struct ms_plan_bytes {
    double elem, scale; /* weight elements and quantization scales */
} ms_plan_bytes;

typedef struct ms_plan_result {
    ms_layout layout;
    char layout_line[256];
    int num_gpus;
    /* weights */
    ms_plan_bytes total[MS_WC_COUNT];    /* whole model (main stack + MTP if speculative) */
    ms_plan_bytes per_rank[MS_WC_COUNT]; /* on the fullest rank (pipeline stage) */
    double weights_total_bytes, weights_bytes_per_rank;
    double attention_replication_bytes; /* attention a DP rank holds beyond 1/tp */
    double eplb_staging_bytes_per_rank; /* --enable-eplb: one layer's slots, staged */
    double recipe_min_weight_bytes;
    /* memory */
    bool have_memory;
    double mem_bytes, budget_bytes; /* per device; budget after reserve/fraction */
    char budget_basis[64];          /* how the budget was derived */
    bool fits;
    double headroom_bytes; /* budget − weights (negative: short by) */
    /* KV */
    double kv_bytes_per_token; /* per rank, amortised over context_len */
    double kv_bytes_per_request, state_bytes_per_request;
    double kv_pool_bytes_per_rank;
    ms_kv_cost kv_cost; /* a context_len request's attention per rank,
                         * whole stack (cache/kv_spec.h) */
    double tokens_per_rank_exact;
    int64_t tokens_per_rank, cluster_distinct_tokens;
    int64_t requests_per_rank, cluster_requests; /* of context_len, memory only */
    int64_t admitted_requests;                   /* cluster, capped by max-running */
    int64_t host_tokens_per_rank;                /* HiCache tier: ratio × device tokens */
    int64_t context_len;
    /* communication, per layer per rank */
    struct {
        double tokens_global, tokens_local;
        int gather_world, ep_world;
        double ep_tokens_per_rank; /* rows each rank dispatches per step */
        double dp_allgather_bytes_per_layer, dp_gather_bytes_per_layer;
        double tp_allreduce_bytes_per_layer;
        double expected_distinct_ranks, expected_remote_ranks;
        double ep_dispatch_bytes_per_layer, ep_combine_bytes_per_layer;
        int gather_layers, moe_layers;
        const char *mode; /* "ep", "dp_gather", "tp_allreduce", "none" */
        double bytes_per_step, link_gb_s, ideal_ms_per_step; /* ideal < 0: no link figure */
    } comm;
    struct {
        double per_expert, per_expert_with_scales, per_layer, per_rank_per_layer;
        double per_rank_per_step, expected_active_experts, expected_per_rank_per_layer;
        double expected_per_rank_per_step;
    } expert;
    struct {
        double flop_per_byte_tp1, flop_per_byte_this_layout;
    } ai;
    int n_violations;
    ms_layout_violation violations[MS_LAYOUT_MAX_VIOLATIONS * 2];
} ms_plan_result;

/* Runs the whole plan.  Returns 0 (violations are reported in r, not as errors) or a
 * negative code for inputs that cannot be planned at all (no memory figure and no pool). */
int ms_plan_run(const ms_plan_input *in, ms_plan_result *r, ms_errbuf *err);

/* Pieces, exported for tests and the sweep. */
void ms_plan_weights_compute(const ms_plan_input *in, const ms_layout *lay, ms_plan_result *r);
/* Layers [*first, *end) of pipeline stage `stage` (SGLang's get_pp_indices split). */
void ms_plan_stage_layers(int n_layers, int pp, int stage, int *first, int *end);
double ms_plan_stage_weight_bytes(const ms_plan_input *in, const ms_layout *lay, int stage);
/* One routed expert's weight-element and scale bytes in the chosen format. */
void ms_plan_expert_bytes(const ms_plan_input *in, double *elem, double *scale);
/* KV and state bytes of one request over layers [first, end), from the family's kv_spec
 * (index_key: V4's index-key format, MS_KV_INDEX_*). */
double ms_plan_kv_request_bytes(const ms_plan_model *m, int kv_bytes, int index_key, int attn_tp,
                                int first_layer, int end_layer, int64_t context_len);
/* A context_len request's attention cost on one attention rank over the whole
 * stack, from the same kv_spec (ms_kv_spec_cost). */
void ms_plan_kv_cost(const ms_plan_model *m, int kv_bytes, int index_key, int attn_tp,
                     int64_t context_len, ms_kv_cost *out);
double ms_plan_state_request_bytes(const ms_plan_model *m, int state_bytes, int first_layer,
                                   int end_layer);
double ms_plan_expected_distinct_ranks(int n_experts, int topk, int n_ranks);
void ms_plan_comm_compute(const ms_plan_input *in, const ms_layout *lay, ms_plan_result *r);

/* Output. */
int ms_plan_print(FILE *f, const ms_plan_input *in, const ms_plan_result *r);
/* Returns a jansson json_t* (new reference) as void* to keep jansson out of this header. */
void *ms_plan_to_json(const ms_plan_input *in, const ms_plan_result *r);

/* Sweeps: admitted requests of each context length for a set of layouts and cache tiers. */
typedef enum { MS_SWEEP_CONTEXT = 1, MS_SWEEP_LAYOUTS = 2 } ms_sweep_kind;
typedef struct ms_plan_sweep {
    int n_contexts;
    int64_t contexts[MS_PLAN_MAX_SWEEP];
    int n_series;
    struct {
        char label[96];
        bool host_tier;
        int64_t requests[MS_PLAN_MAX_SWEEP]; /* cluster admitted requests; -1 invalid layout */
    } series[MS_PLAN_MAX_SWEEP];
} ms_plan_sweep;

int ms_plan_sweep_run(const ms_plan_input *in, ms_sweep_kind kind, ms_plan_sweep *out,
                      ms_errbuf *err);
int ms_plan_sweep_print(FILE *f, const ms_plan_sweep *s);
void *ms_plan_sweep_to_json(const ms_plan_sweep *s);
/* Writes the curve with gnuplot (svg, or png when path ends in .png). */
int ms_plan_sweep_plot(const ms_plan_sweep *s, const char *title, const char *path, ms_errbuf *err);

#endif
