/* engine_priv.h — the state of one rank's engine, shared by the files that make
 * it up: engine.c (the step loop), engine_open.c (start-up: layout, shard, model,
 * KV budget), warmup.c (the warm-up).  Nothing outside src/serve/engine*.c and
 * warmup.c includes it.  Main thread only.
 */
#ifndef MS_SERVE_ENGINE_PRIV_H
#define MS_SERVE_ENGINE_PRIV_H

#include "serve/engine.h"

struct reject;  /* engine.c: a request refused by this rank's scheduler */
struct ms_spec; /* spec.c: speculative decoding's settings and draft-chain buffers */

struct ms_engine {
    ms_engine_opts o;
    int W, rank;
    ms_layout lay;
    ms_comm_groups gs;
    int have_groups;
    ms_shard shard;             /* read-only after open */
    ms_expert_map *expert_maps; /* [n_expert_maps]: per layer; the shard points here */
    int n_expert_maps;
    struct ms_expert_recorder *rec; /* NULL: no recorder */
    struct ms_eplb_run *eplb;       /* --enable-eplb (eplb_run.c); NULL: off */
    ms_step_ctx step;               /* rows of this step (the shard and the MLP layers read it) */
    ms_model *m;
    ms_kv_cache *cache;    /* this rank's KV cache (its streams' pools) */
    ms_sched *sched;       /* DP-group leaders only */
    ms_sample *sampler;    /* DP-group leaders only */
    ms_sample_pick *picks; /* [(max_running + 1) (S + 1)] */
    struct ms_spec *spec;  /* NULL: no speculative decoding */
    int is_leader, dp_index, n_dp;
    int max_running_rank;
    int64_t chunk_rank, ctx_len, pool_tokens;
    int64_t avail0;    /* MemAvailable / ranks on the host before the load, bytes */
    int64_t prepacked; /* weight views prepacked at open (ms_model_prepack) */
    size_t prepacked_bytes;
    double prepack_s;
    /* rank 0 */
    uint8_t *ctrl;
    size_t ctrl_len, ctrl_cap;
    uint32_t pend_new, pend_abort, pend_flags;
    uint64_t *aborts;
    size_t cap_aborts;
    ms_router *router;
    ms_router_load *rloads; /* [n_dp] the loads as the router takes them */
    int64_t inflight;
    ms_engine_event *events;
    int n_events, cap_events;
    struct reject *rej_in; /* rank 0: this step's rejections, events point at their msg */
    int n_rej_in;
    size_t cap_rej_in; /* bytes */
    ms_engine_load *loads;
    uint8_t *gather_buf;
    size_t cap_gather;
    size_t *g_bytes, *g_displs;
    /* per step */
    int64_t *rows_world; /* [W][2]: rows, decode rows */
    int64_t *rows_tp;    /* [tp] */
    uint8_t *bbuf;       /* batch broadcast / event send buffer */
    size_t cap_bbuf;
    ms_batch_seq *mbatch; /* members' copy of the batch */
    ms_kv_seq *mkv;       /* [cap_mbatch] their cache holds (the leader's page ids) */
    int cap_mbatch;
    int32_t *mdata; /* members' tokens and page tables */
    size_t cap_mdata;
    float *mlogits; /* members' logit rows with a split LM head (written by none) */
    size_t cap_mlogits;
    float **mlog_ptr; /* [cap_mbatch] each member sequence's rows in mlogits, or NULL */
    size_t cap_mlog_ptr;
    struct reject *rejects; /* leaders: refused while applying this step's control block */
    int n_rejects;
    size_t cap_rejects; /* bytes */
    int32_t *req_ids;   /* decoded prompt ids of the request being added */
    int64_t cap_req_ids;
    ms_engine_step_stats last;
};

/* engine.c: this step's rows all-gathered (every rank): into e->rows_tp for the
 * MLP layers, and the rows of this rank's replica, of all DP groups, and of
 * those the single-token ones. */
/* engine.c: a member's logit buffers for n shared sequences whose logit row counts are
 * rows[i * stride] (0: none), when the model splits its LM head (ms_model_head_split): out[i]
 * points into e->mlogits, which the head leaves unwritten; otherwise every out[i] is NULL. */
int ms_engine_member_logits(ms_engine *e, const int64_t *rows, int n, size_t stride, float **out,
                            ms_errbuf *err);
int ms_engine_count_rows(ms_engine *e, const ms_batch_seq *batch, int n, int64_t *replica_rows,
                         int64_t *all_rows, int64_t *all_dec, ms_errbuf *err);
/* spec.c: checks the speculative flags against the model (after it loaded, before
 * the pool is sized) and sets e->spec; the draft chain after each commit (every
 * rank, collective); S (0: off); 1 when the MTP chain runs. */
int ms_engine_spec_open(ms_engine *e, const ms_model_shape *shape, ms_errbuf *err);
int ms_engine_spec_draft(ms_engine *e, ms_errbuf *err);
void ms_engine_spec_free(ms_engine *e);
int ms_engine_spec_mtp(const ms_engine *e);
#endif
