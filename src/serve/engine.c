/* engine.c — the lockstep step loop of one rank (engine.h): control blocks,
 * batch broadcast inside attention-TP groups, token-count all-gather, forward,
 * event and load gathering to rank 0. */
#include "serve/engine.h"

#include "base/log.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CTRL_MAGIC 0x4d534354u /* "MSCT" */
enum { CF_EXIT = 1, CF_FLUSH = 2 };

struct ctrl_hdr {
    uint32_t magic, flags, n_new, n_abort;
};

struct wire_req { /* one new request in a control block, followed by n_ids int32 */
    uint64_t id, seed;
    int64_t n_ids, max_new;
    int32_t dp, top_k, ignore_eos, top_logprobs, n_stop;
    float temperature, top_p, min_p;
    float frequency_penalty, presence_penalty, repetition_penalty;
    int32_t stop_ids[MS_SCHED_MAX_STOP_IDS];
    int64_t min_new;
    int32_t n_bias, pad;
    int32_t bias_ids[MS_SCHED_MAX_LOGIT_BIAS];
    float bias[MS_SCHED_MAX_LOGIT_BIAS];
};

struct wire_ev_hdr { /* what each rank contributes to the step's event gather */
    int32_t n_events, is_leader, dp;
    int32_t pad;
    ms_sched_stats st;
};

struct ms_engine {
    ms_engine_opts o;
    int W, rank;
    ms_layout lay;
    ms_comm_groups gs;
    int have_groups;
    ms_shard shard;
    ms_model *m;
    ms_kv_pool *pool;
    ms_sched *sched;       /* DP-group leaders only */
    int is_leader, dp_index, n_dp;
    int max_running_rank;
    int64_t chunk_rank, ctx_len, pool_tokens;
    int64_t avail0;    /* MemAvailable / ranks on the host before the load, bytes */
    int64_t prepacked; /* weight views prepacked for oneDNN at open */
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
    ms_engine_load *loads;
    uint8_t *gather_buf;
    size_t cap_gather;
    size_t *g_bytes, *g_displs;
    /* per step */
    int64_t *rows_world;   /* [W][2]: rows, decode rows */
    int64_t *rows_tp;      /* [tp] */
    uint8_t *bbuf;         /* batch broadcast / event send buffer */
    size_t cap_bbuf;
    ms_batch_seq *mbatch;  /* members' copy of the batch */
    int cap_mbatch;
    int32_t *mdata;        /* members' tokens and page tables */
    size_t cap_mdata;
    ms_engine_step_stats last;
};

void ms_engine_opts_init(ms_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    ms_launch_init(&o->launch);
    ms_router_opts_init(&o->router);
    o->page_size = 16;
    o->mem_fraction_static = 0.3;
    o->schedule_policy = MS_SCHED_FCFS;
    o->max_running_default = 256;
    o->chunk_default = 2048;
}

static int grow(void **p, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    n = MS_MAX(n, 2 * *cap);
    void *q = realloc(*p, n);
    if (!q) return MS_ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

/* MemAvailable of this host in bytes (0 when unknown). */
static int64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return (int64_t)kb * 1024;
}

static int ranks_on_host(int W)
{
    const char *s = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int n = s ? atoi(s) : W;
    return n > 0 ? n : 1;
}

static int size_pool(ms_engine *e, ms_errbuf *err)
{
    const ms_config *c = &e->m->cfg;
    int64_t row = ms_model_kv_row_elems(e->m);
    ms_dtype dt = e->o.exact ? MS_DT_F32 : MS_DT_BF16;
    int64_t per_tok = (int64_t)ms_kv_bytes_per_token(c->n_layers, row, dt);
    int64_t tokens = e->o.max_total_tokens;
    int64_t weights = ms_model_local_weight_bytes(e->m), packed = (int64_t)e->prepacked_bytes;
    if (tokens <= 0) { /* SGLang's static share: weights (+ their copies) and the KV pool */
        int64_t budget = (int64_t)(e->o.mem_fraction_static * (double)e->avail0) - weights - packed;
        tokens = budget > 0 ? budget / per_tok : 0;
        if (tokens < e->o.page_size)
            return ms_err(err, MS_ENOMEM,
                          "no memory left for the KV cache: %.2f GB available to this rank × "
                          "--mem-fraction-static %.2f minus %.2f GB of weights and %.2f GB of "
                          "their oneDNN copies; use --max-total-tokens or raise "
                          "--mem-fraction-static",
                          (double)e->avail0 / 1e9, e->o.mem_fraction_static, (double)weights / 1e9,
                          (double)packed / 1e9);
    }
    /* every rank must agree (members mirror their leader's page ids): take the minimum */
    if (e->W > 1) {
        int64_t *all = calloc((size_t)e->W, sizeof *all);
        if (!all) return ms_err(err, MS_ENOMEM, "out of memory");
        int rc = ms_comm_allgather(e->gs.world, &tokens, sizeof tokens, all, err);
        if (!rc)
            for (int i = 0; i < e->W; i++) tokens = MS_MIN(tokens, all[i]);
        free(all);
        if (rc) return rc;
    }
    int32_t pages = (int32_t)MS_MIN(tokens / e->o.page_size, (int64_t)INT32_MAX - 1);
    e->pool_tokens = (int64_t)pages * e->o.page_size;
    int rc = ms_kv_pool_new(&e->pool, c->n_layers, row, e->o.page_size, pages, dt, err);
    if (rc) return rc;
    MS_LOG(MS_INFO, "engine",
           "KV pool: %lld tokens per DP rank (%d DP ranks, attention TP %d, %s), %lld B per token, "
           "weights %.2f GB on this rank (+ %.1f MiB prepacked for oneDNN)",
           (long long)e->pool_tokens, e->n_dp, e->lay.attn_tp,
           e->lay.attn_tp > 1 ? "replicated across the attention-TP group" : "not replicated",
           (long long)per_tok, (double)weights / 1e9, (double)packed / (1 << 20));
    return 0;
}

static int build_shard(ms_engine *e, ms_errbuf *err)
{
    ms_rank_coords at;
    int rc = ms_layout_rank_coords(&e->lay, e->rank, &at);
    if (rc) return ms_err(err, rc, "rank %d outside the layout", e->rank);
    ms_comm_dims d = {.tp = e->lay.tp, .attn_tp = e->lay.attn_tp, .attn_dp = e->lay.attn_dp,
                      .moe_ep = e->lay.moe_ep, .moe_tp = e->lay.moe_tp,
                      .dense_tp = e->lay.dense_tp, .n_replicas = e->lay.n_replicas};
    if ((rc = ms_comm_groups_init(&e->gs, &d, err))) return rc;
    e->have_groups = 1;
    ms_shard *s = &e->shard;
    s->lay = &e->lay;
    s->at = at;
    s->attn_tp = e->lay.attn_tp;
    s->attn_tp_rank = at.attn_tp_rank;
    s->attn_dp = e->lay.attn_dp;
    s->attn_dp_rank = at.attn_dp_rank;
    s->tp = e->lay.tp;
    s->tp_rank = at.tp_rank;
    s->moe_ep = e->lay.moe_ep;
    s->moe_ep_rank = at.moe_ep_rank;
    s->moe_tp = e->lay.moe_tp;
    s->moe_tp_rank = at.moe_tp_rank;
    s->first_expert = at.first_expert;
    s->n_local_experts = e->lay.experts_per_rank;
    s->dense_tp = e->lay.dense_tp;
    s->dense_rank = at.tp_rank % MS_MAX(e->lay.dense_tp, 1);
    s->shared_tp = e->lay.shared_tp;
    s->shared_rank = at.tp_rank % MS_MAX(e->lay.shared_tp, 1);
    s->sparse_mode = e->lay.sparse_mode;
    s->dense_mode = e->lay.dense_mode;
    s->dispatch_bf16 = e->o.dispatch_bf16;
    s->attn_group = e->gs.attn_tp;
    s->tp_group = e->gs.tp;
    e->is_leader = at.attn_tp_rank == 0;
    e->dp_index = at.replica * e->lay.attn_dp + at.attn_dp_rank;
    return 0;
}

int ms_engine_start(const char *cmd, const ms_engine_opts *o, double comm_timeout_s, int argc,
                    char **argv, ms_config *cfg, ms_layout *lay, int *world, int *rank)
{
    ms_errbuf err = {{0}};
    char path[1200];
    if (!ms_path_join(path, sizeof path, o->model_path, "config.json") ||
        ms_config_load(cfg, path, &err)) {
        fprintf(stderr, "%s: --model-path %s: %s\n", cmd, o->model_path, err.msg);
        return 1;
    }
    ms_layout_model lm = {.n_heads = cfg->n_heads, .n_routed_experts = cfg->n_routed_experts,
                          .n_layers = cfg->n_layers,
                          .n_dense_layers = MS_MIN(cfg->first_k_dense_replace, cfg->n_layers)};
    if (ms_layout_resolve(&o->launch, &lm, lay, &err) ||
        ms_comm_maybe_relaunch(lay->world_size, argc, argv, &err)) {
        fprintf(stderr, "%s: %s\n", cmd, err.msg);
        return 2;
    }
    *world = lay->world_size;
    *rank = 0;
    if (*world == 1) {
        ms_log_init(0);
        return 0;
    }
    ms_comm_opts co;
    ms_comm_opts_default(&co);
    co.timeout_s = comm_timeout_s;
    if (ms_comm_init(NULL, NULL, &co, &err)) {
        fprintf(stderr, "%s: %s\n", cmd, err.msg);
        return 1;
    }
    *rank = ms_comm_world_rank();
    return 0;
}

int ms_engine_open(ms_engine **out, const ms_engine_opts *o, ms_errbuf *err)
{
    *out = NULL;
    ms_engine *e = calloc(1, sizeof *e);
    if (!e) return ms_err(err, MS_ENOMEM, "out of memory");
    e->o = *o;
    e->W = ms_comm_is_init() ? ms_comm_world_size() : 1;
    e->rank = ms_comm_is_init() ? ms_comm_world_rank() : 0;
    int rc;
    /* the model's shape decides the layout: read config.json first */
    ms_config cfg;
    char path[1200];
    if (!ms_path_join(path, sizeof path, o->model_path, "config.json")) {
        rc = ms_err(err, MS_EINVAL, "--model-path too long");
        goto fail;
    }
    if ((rc = ms_config_load(&cfg, path, err))) goto fail;
    ms_layout_model lm = {.n_heads = cfg.n_heads, .n_kv_heads = 0,
                          .n_routed_experts = cfg.n_routed_experts, .n_layers = cfg.n_layers,
                          .n_dense_layers = MS_MIN(cfg.first_k_dense_replace, cfg.n_layers)};
    if ((rc = ms_layout_resolve(&o->launch, &lm, &e->lay, err))) goto fail;
    if (e->lay.pp > 1 || e->lay.attn_cp > 1) {
        rc = ms_err(err, MS_EUNSUPPORTED, "%s is not supported by the CPU engine yet",
                    e->lay.pp > 1 ? "--pp-size > 1" : "--attn-cp-size > 1");
        goto fail;
    }
    if (e->lay.world_size != e->W) {
        rc = ms_err(err, MS_ELAYOUT, "this launch needs %d ranks, the world has %d",
                    e->lay.world_size, e->W);
        goto fail;
    }
    e->n_dp = e->lay.n_replicas * e->lay.attn_dp;
    ms_model_opts mo = {.threads = o->threads, .exact = o->exact, .shard = NULL};
    if (e->W > 1) {
        if ((rc = build_shard(e, err))) goto fail;
        mo.shard = &e->shard;
    } else {
        e->is_leader = 1;
    }
    e->avail0 = mem_available() / ranks_on_host(e->W);
    if ((rc = ms_model_open(&e->m, o->model_path, &mo, err))) goto fail;
    if (o->prepack) { /* before the pool: its copies come out of the same budget */
        double t0 = ms_now_s();
        size_t b0 = ms_kernels_dnnl_bytes();
        e->prepacked = ms_model_prepack(e->m);
        e->prepacked_bytes = ms_kernels_dnnl_bytes() - b0;
        e->prepack_s = ms_now_s() - t0;
    }
    e->ctx_len = o->context_length > 0 ? MS_MIN(o->context_length, e->m->cfg.max_position_embeddings)
                                       : e->m->cfg.max_position_embeddings;
    int max_running = e->lay.max_running_per_rank > 0
                          ? e->lay.max_running_per_rank
                          : MS_MAX(1, o->max_running_default / MS_MAX(e->lay.attn_dp, 1));
    int64_t chunk = e->lay.chunked_prefill_per_rank > 0 ? e->lay.chunked_prefill_per_rank
                    : e->lay.chunked_prefill_per_rank < 0
                        ? e->ctx_len /* chunking off */
                        : MS_MAX(1, o->chunk_default / MS_MAX(e->lay.attn_dp, 1));
    e->max_running_rank = max_running;
    e->chunk_rank = chunk;
    if ((rc = size_pool(e, err))) goto fail;
    if (e->is_leader) {
        ms_sched_params sp = {o->page_size, max_running, chunk, o->schedule_policy, e->ctx_len,
                              e->m->cfg.vocab_size, e->m->cfg.eos_token_id};
        if ((rc = ms_sched_new(&e->sched, &sp, e->pool, err))) goto fail;
    }
    e->rows_world = calloc((size_t)e->W * 2, sizeof(int64_t));
    e->rows_tp = calloc((size_t)e->lay.tp, sizeof(int64_t));
    e->loads = calloc((size_t)e->n_dp, sizeof *e->loads);
    e->rloads = calloc((size_t)e->n_dp, sizeof *e->rloads);
    e->g_bytes = calloc((size_t)e->W * 2, sizeof(size_t));
    if (!e->rows_world || !e->rows_tp || !e->loads || !e->g_bytes || !e->rloads) {
        rc = ms_err(err, MS_ENOMEM, "out of memory");
        goto fail;
    }
    if (e->rank == 0 && (rc = ms_router_new(&e->router, e->n_dp, &o->router))) {
        rc = ms_err(err, rc, "router: %d DP ranks, or a threshold out of range", e->n_dp);
        goto fail;
    }
    e->g_displs = e->g_bytes + e->W;
    for (int i = 0; i < e->n_dp; i++) e->loads[i].dp_rank = i;
    if (e->rank == 0) {
        char desc[512];
        ms_layout_describe(&e->lay, desc, sizeof desc);
        MS_LOG(MS_INFO, "engine", "layout: %s (world %d)", desc, e->W);
    }
    *out = e;
    return 0;
fail:
    ms_engine_close(e);
    return rc;
}

void ms_engine_close(ms_engine *e)
{
    if (!e) return;
    ms_sched_free(e->sched);
    ms_kv_pool_free(e->pool);
    ms_model_free(e->m);
    if (e->have_groups) ms_comm_groups_deinit(&e->gs);
    free(e->ctrl);
    free(e->aborts);
    free(e->events);
    free(e->loads);
    ms_router_free(e->router);
    free(e->rloads);
    free(e->gather_buf);
    free(e->g_bytes);
    free(e->rows_world);
    free(e->rows_tp);
    free(e->bbuf);
    free(e->mbatch);
    free(e->mdata);
    free(e);
}

const ms_model *ms_engine_model(const ms_engine *e) { return e->m; }

int ms_engine_warmup(ms_engine *e, int64_t max_tokens, ms_engine_warmup_stats *st, ms_errbuf *err)
{
    memset(st, 0, sizeof *st);
    st->prepacked = e->prepacked;
    st->prepacked_bytes = e->prepacked_bytes;
    st->prepack_s = e->prepack_s;
    /* one prompt of up to a prefill chunk through the model, its KV in pages
     * taken from the pool and given back.  Every rank runs the same prompt
     * (n is the same everywhere: the pool size is agreed, the chunk is the
     * launch's), so each attention group has n rows, as ms_engine_step would
     * tell the MLP layers. */
    int64_t P = e->o.page_size;
    int64_t n = MS_MIN(MS_MIN(max_tokens, e->chunk_rank), MS_MIN(e->pool_tokens - P, e->ctx_len));
    if (n < 1) return 0;
    if (e->W > 1) {
        for (int i = 0; i < e->lay.tp; i++) e->rows_tp[i] = n;
        e->shard.rows_per_rank = e->rows_tp;
    }
    int32_t np = (int32_t)((n + P - 1) / P);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n),
            *pages = malloc(sizeof(int32_t) * (size_t)np);
    float *logits = malloc(sizeof(float) * (size_t)e->m->cfg.vocab_size);
    int rc = MS_ENOMEM;
    if (!ids || !pages || !logits) {
        ms_err(err, rc, "out of memory (warm-up)");
        goto out;
    }
    if ((rc = ms_kv_pool_alloc(e->pool, np, pages))) {
        ms_err(err, rc, "warm-up: no room for %lld tokens in the KV pool", (long long)n);
        goto out;
    }
    uint64_t rng = 1;
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(ms_rng_next(&rng) % (uint64_t)e->m->cfg.vocab_size);
    ms_batch_seq seq = {ids, (int32_t)n, 0, pages, logits};
    double t0 = ms_now_s();
    rc = ms_model_forward(e->m, e->pool, &seq, 1, err);
    st->forward_s = ms_now_s() - t0;
    if (!rc) st->forward_tokens = n;
    for (int32_t i = 0; i < np; i++) ms_kv_pool_unref(e->pool, pages[i]);
out:
    free(ids);
    free(pages);
    free(logits);
    return rc;
}

const ms_layout *ms_engine_layout(const ms_engine *e) { return &e->lay; }
int ms_engine_is_rank0(const ms_engine *e) { return e->rank == 0; }
int ms_engine_n_dp(const ms_engine *e) { return e->n_dp; }
int64_t ms_engine_pool_tokens(const ms_engine *e) { return e->pool_tokens; }
int ms_engine_max_running_per_rank(const ms_engine *e) { return e->max_running_rank; }
int64_t ms_engine_chunk_per_rank(const ms_engine *e) { return e->chunk_rank; }
int64_t ms_engine_context_length(const ms_engine *e) { return e->ctx_len; }
int ms_engine_busy(const ms_engine *e)
{
    return e->inflight > 0 || e->pend_new > 0 || e->pend_abort > 0 || e->pend_flags != 0;
}

/* ---- rank 0: building the control block ---- */

int ms_engine_submit(ms_engine *e, const ms_sched_input *in, int dp_rank, ms_errbuf *err)
{
    if (in->n_ids <= 0) return ms_err(err, MS_EINVAL, "the prompt is empty");
    int64_t need = in->n_ids + in->max_new;
    if (need > e->ctx_len)
        return ms_err(err, MS_ECONTEXT,
                      "the prompt has %lld tokens and max_tokens is %lld: %lld tokens exceed the "
                      "context length of %lld",
                      (long long)in->n_ids, (long long)in->max_new, (long long)need,
                      (long long)e->ctx_len);
    if (need > e->pool_tokens)
        return ms_err(err, MS_ECONTEXT,
                      "the prompt has %lld tokens and max_tokens is %lld: %lld tokens exceed the KV "
                      "pool of %lld tokens per DP rank",
                      (long long)in->n_ids, (long long)in->max_new, (long long)need,
                      (long long)e->pool_tokens);
    if (in->n_stop_ids > MS_SCHED_MAX_STOP_IDS) return ms_err(err, MS_EINVAL, "too many stop ids");
    if (in->n_bias < 0 || in->n_bias > MS_SCHED_MAX_LOGIT_BIAS)
        return ms_err(err, MS_EINVAL, "too many logit_bias entries");
    if (e->ctrl_len == 0) e->ctrl_len = sizeof(struct ctrl_hdr);
    size_t add = sizeof(struct wire_req) + sizeof(int32_t) * (size_t)in->n_ids;
    if (grow((void **)&e->ctrl, &e->ctrl_cap, e->ctrl_len + add))
        return ms_err(err, MS_ENOMEM, "out of memory");
    struct wire_req w = {.id = in->id,
                         .seed = in->seed,
                         .n_ids = in->n_ids,
                         .max_new = in->max_new,
                         .top_k = in->samp.top_k,
                         .ignore_eos = in->ignore_eos,
                         .top_logprobs = in->top_logprobs,
                         .n_stop = in->n_stop_ids,
                         .temperature = in->samp.temperature,
                         .top_p = in->samp.top_p,
                         .min_p = in->samp.min_p,
                         .frequency_penalty = in->samp.frequency_penalty,
                         .presence_penalty = in->samp.presence_penalty,
                         .repetition_penalty = in->samp.repetition_penalty};
    memcpy(w.stop_ids, in->stop_ids, sizeof w.stop_ids);
    w.min_new = in->min_new;
    w.n_bias = in->n_bias;
    memcpy(w.bias_ids, in->bias_ids, sizeof w.bias_ids);
    memcpy(w.bias, in->bias, sizeof w.bias);
    /* last, as it records the request: nothing fails after it */
    w.dp = ms_router_pick(e->router, in->ids, in->n_ids, in->max_new, dp_rank);
    memcpy(e->ctrl + e->ctrl_len, &w, sizeof w);
    memcpy(e->ctrl + e->ctrl_len + sizeof w, in->ids, sizeof(int32_t) * (size_t)in->n_ids);
    e->ctrl_len += add;
    e->pend_new++;
    e->inflight++;
    return 0;
}

void ms_engine_abort(ms_engine *e, uint64_t id)
{
    if (grow((void **)&e->aborts, &e->cap_aborts, sizeof(uint64_t) * (e->pend_abort + 1))) return;
    e->aborts[e->pend_abort++] = id;
}

int ms_engine_flush_cache(ms_engine *e)
{
    if (e->inflight > 0) return MS_EBUSY;
    e->pend_flags |= CF_FLUSH;
    return 0;
}

void ms_engine_shutdown(ms_engine *e) { e->pend_flags |= CF_EXIT; }

/* Finishes the control block: header and aborts; returns its body (e->ctrl). */
static size_t seal_ctrl(ms_engine *e)
{
    if (e->ctrl_len == 0) e->ctrl_len = sizeof(struct ctrl_hdr);
    if (grow((void **)&e->ctrl, &e->ctrl_cap, e->ctrl_len + sizeof(uint64_t) * e->pend_abort)) {
        e->pend_abort = 0; /* out of memory: aborts are retried by the caller's disconnect path */
    } else if (e->pend_abort > 0) {
        memcpy(e->ctrl + e->ctrl_len, e->aborts, sizeof(uint64_t) * e->pend_abort);
        e->ctrl_len += sizeof(uint64_t) * e->pend_abort;
    }
    struct ctrl_hdr h = {CTRL_MAGIC, e->pend_flags, e->pend_new, e->pend_abort};
    memcpy(e->ctrl, &h, sizeof h);
    size_t n = e->ctrl_len;
    e->ctrl_len = 0;
    e->pend_new = e->pend_abort = e->pend_flags = 0;
    return n;
}

/* Applies a control block on this rank; returns 1 on exit. */
static int apply_ctrl(ms_engine *e, const uint8_t *body, size_t len, ms_errbuf *err)
{
    struct ctrl_hdr h;
    if (len < sizeof h) return ms_err(err, MS_EINTERNAL, "short control block");
    memcpy(&h, body, sizeof h);
    if (h.magic != CTRL_MAGIC) return ms_err(err, MS_EINTERNAL, "bad control block");
    size_t off = sizeof h;
    for (uint32_t i = 0; i < h.n_new; i++) {
        struct wire_req w;
        if (off + sizeof w > len) return ms_err(err, MS_EINTERNAL, "truncated control block");
        memcpy(&w, body + off, sizeof w);
        off += sizeof w;
        size_t ids_bytes = sizeof(int32_t) * (size_t)w.n_ids;
        if (w.n_ids < 0 || off + ids_bytes > len)
            return ms_err(err, MS_EINTERNAL, "truncated control block");
        if (e->is_leader && w.dp == e->dp_index) {
            ms_sched_input in = {.id = w.id, .ids = (const int32_t *)(body + off),
                                 .n_ids = w.n_ids, .max_new = w.max_new, .seed = w.seed,
                                 .ignore_eos = w.ignore_eos, .n_stop_ids = w.n_stop,
                                 .top_logprobs = w.top_logprobs};
            in.samp = (ms_sampler_params){.temperature = w.temperature, .top_p = w.top_p,
                                           .top_k = w.top_k, .min_p = w.min_p,
                                           .frequency_penalty = w.frequency_penalty,
                                           .presence_penalty = w.presence_penalty,
                                           .repetition_penalty = w.repetition_penalty};
            memcpy(in.stop_ids, w.stop_ids, sizeof in.stop_ids);
            in.min_new = w.min_new;
            in.n_bias = w.n_bias;
            memcpy(in.bias_ids, w.bias_ids, sizeof in.bias_ids);
            memcpy(in.bias, w.bias, sizeof in.bias);
            int32_t *ids = malloc(ids_bytes ? ids_bytes : 1); /* body may be unaligned */
            if (!ids) return ms_err(err, MS_ENOMEM, "out of memory");
            memcpy(ids, body + off, ids_bytes);
            in.ids = ids;
            ms_errbuf e2;
            if (ms_sched_add(e->sched, &in, &e2))
                MS_LOG(MS_WARN, "engine", "request %llu rejected: %s", (unsigned long long)w.id,
                       e2.msg);
            free(ids);
        }
        off += ids_bytes;
    }
    for (uint32_t i = 0; i < h.n_abort; i++) {
        uint64_t id;
        if (off + sizeof id > len) return ms_err(err, MS_EINTERNAL, "truncated control block");
        memcpy(&id, body + off, sizeof id);
        off += sizeof id;
        if (e->is_leader) ms_sched_abort(e->sched, id);
    }
    if ((h.flags & CF_FLUSH) && e->is_leader) ms_sched_flush_cache(e->sched);
    return (h.flags & CF_EXIT) ? 1 : 0;
}

/* ---- batch broadcast inside an attention-TP group ---- */

static int share_batch(ms_engine *e, const ms_batch_seq **batch, int *n, ms_errbuf *err)
{
    ms_group *g = e->gs.attn_tp;
    int64_t hdr[3] = {0, 0, 0}; /* n_seqs, tokens, pages */
    if (e->is_leader) {
        hdr[0] = *n;
        for (int i = 0; i < *n; i++) {
            const ms_batch_seq *b = &(*batch)[i];
            hdr[1] += b->n_tokens;
            hdr[2] += (b->start_pos + b->n_tokens + e->o.page_size - 1) / e->o.page_size;
        }
    }
    int rc = ms_comm_bcast(g, hdr, sizeof hdr, 0, err);
    if (rc || hdr[0] == 0) {
        if (!e->is_leader) *n = 0;
        return rc;
    }
    /* per seq: n_tokens, start_pos, n_pages, want_logits; then tokens; then page tables */
    size_t bytes = sizeof(int64_t) * 4 * (size_t)hdr[0] + sizeof(int32_t) * (size_t)(hdr[1] + hdr[2]);
    if (grow((void **)&e->bbuf, &e->cap_bbuf, bytes)) return ms_err(err, MS_ENOMEM, "out of memory");
    if (e->is_leader) {
        int64_t *meta = (int64_t *)e->bbuf;
        int32_t *p = (int32_t *)(meta + 4 * hdr[0]);
        for (int i = 0; i < *n; i++) {
            const ms_batch_seq *b = &(*batch)[i];
            int64_t np = (b->start_pos + b->n_tokens + e->o.page_size - 1) / e->o.page_size;
            meta[4 * i] = b->n_tokens;
            meta[4 * i + 1] = b->start_pos;
            meta[4 * i + 2] = np;
            meta[4 * i + 3] = b->logits != NULL;
            memcpy(p, b->tokens, sizeof(int32_t) * (size_t)b->n_tokens);
            p += b->n_tokens;
            memcpy(p, b->page_table, sizeof(int32_t) * (size_t)np);
            p += np;
        }
    }
    if ((rc = ms_comm_bcast(g, e->bbuf, bytes, 0, err))) return rc;
    if (e->is_leader) return 0;
    if ((int)hdr[0] > e->cap_mbatch) {
        free(e->mbatch);
        e->mbatch = calloc((size_t)hdr[0], sizeof *e->mbatch);
        e->cap_mbatch = e->mbatch ? (int)hdr[0] : 0;
        if (!e->mbatch) return ms_err(err, MS_ENOMEM, "out of memory");
    }
    if (grow((void **)&e->mdata, &e->cap_mdata, bytes)) return ms_err(err, MS_ENOMEM, "out of memory");
    memcpy(e->mdata, e->bbuf, bytes);
    int64_t *meta = (int64_t *)e->mdata;
    int32_t *p = (int32_t *)(meta + 4 * hdr[0]);
    for (int i = 0; i < (int)hdr[0]; i++) {
        ms_batch_seq *b = &e->mbatch[i];
        b->n_tokens = (int32_t)meta[4 * i];
        b->start_pos = meta[4 * i + 1];
        b->tokens = p;
        p += b->n_tokens;
        b->page_table = p;
        p += meta[4 * i + 2];
        b->logits = NULL; /* sampling happens on the group's first rank */
    }
    *batch = e->mbatch;
    *n = (int)hdr[0];
    return 0;
}

/* ---- events and loads to rank 0 ---- */

static int push_event(ms_engine *e, const ms_sched_event *ev, int dp, const float *logits)
{
    if (e->n_events == e->cap_events) {
        int cap = e->cap_events ? 2 * e->cap_events : 64;
        ms_engine_event *p = realloc(e->events, sizeof *p * (size_t)cap);
        if (!p) return MS_ENOMEM;
        e->events = p;
        e->cap_events = cap;
    }
    ms_engine_event *x = &e->events[e->n_events++];
    x->ev = *ev;
    x->ev.logits = NULL;
    x->dp_rank = dp;
    x->logits = logits;
    if (ev->finish != MS_FINISH_NONE) {
        e->inflight--;
        ms_router_finish(e->router, dp);
    }
    return 0;
}

static int gather_events(ms_engine *e, const ms_sched_event *ev, int n_ev, ms_errbuf *err)
{
    int64_t V = e->m->cfg.vocab_size;
    size_t per = sizeof(ms_sched_event) + (e->o.keep_logits ? sizeof(float) * (size_t)V : 0);
    struct wire_ev_hdr h = {.n_events = n_ev, .is_leader = e->is_leader, .dp = e->dp_index};
    if (e->is_leader) ms_sched_get_stats(e->sched, &h.st);
    e->n_events = 0;
    if (e->W == 1) {
        e->loads[0].st = h.st;
        for (int i = 0; i < n_ev; i++) push_event(e, &ev[i], 0, e->o.keep_logits ? ev[i].logits : NULL);
        return 0;
    }
    size_t mine = sizeof h + per * (size_t)n_ev;
    if (grow((void **)&e->bbuf, &e->cap_bbuf, mine)) return ms_err(err, MS_ENOMEM, "out of memory");
    memcpy(e->bbuf, &h, sizeof h);
    for (int i = 0; i < n_ev; i++) {
        uint8_t *p = e->bbuf + sizeof h + per * (size_t)i;
        memcpy(p, &ev[i], sizeof ev[i]);
        if (e->o.keep_logits && ev[i].logits)
            memcpy(p + sizeof ev[i], ev[i].logits, sizeof(float) * (size_t)V);
    }
    _Static_assert(sizeof(size_t) == sizeof(uint64_t), "byte counts travel as uint64");
    uint64_t my = mine, *all = (uint64_t *)e->g_bytes;
    int rc = ms_comm_gather(e->gs.world, &my, sizeof my, all, 0, err);
    if (rc) return rc;
    size_t total = 0;
    if (e->rank == 0)
        for (int i = 0; i < e->W; i++) {
            e->g_displs[i] = total;
            total += e->g_bytes[i];
        }
    if (e->rank == 0 && grow((void **)&e->gather_buf, &e->cap_gather, total + 1))
        return ms_err(err, MS_ENOMEM, "out of memory");
    rc = ms_comm_gatherv(e->gs.world, e->bbuf, mine, e->gather_buf, e->g_bytes, e->g_displs, 0, err);
    if (rc || e->rank != 0) return rc;
    for (int r = 0; r < e->W; r++) {
        const uint8_t *p = e->gather_buf + e->g_displs[r];
        struct wire_ev_hdr rh;
        memcpy(&rh, p, sizeof rh);
        if (!rh.is_leader) continue;
        if (rh.dp >= 0 && rh.dp < e->n_dp) e->loads[rh.dp].st = rh.st;
        for (int i = 0; i < rh.n_events; i++) {
            ms_sched_event x;
            const uint8_t *q = p + sizeof rh + per * (size_t)i;
            memcpy(&x, q, sizeof x);
            if (push_event(e, &x, rh.dp, e->o.keep_logits ? (const float *)(q + sizeof x) : NULL))
                return ms_err(err, MS_ENOMEM, "out of memory");
        }
    }
    return 0;
}

int ms_engine_step(ms_engine *e, ms_errbuf *err)
{
    double t0 = ms_now_s();
    int rc, exit_now = 0;
    /* 1. control */
    if (e->rank == 0) {
        size_t n = seal_ctrl(e);
        if (e->W > 1 && (rc = ms_comm_ctrl_send(e->gs.world, e->ctrl, n, err))) return rc;
        exit_now = apply_ctrl(e, e->ctrl, n, err);
    } else {
        const void *body;
        size_t n;
        if ((rc = ms_comm_ctrl_recv(e->gs.world, &body, &n, err))) return rc;
        exit_now = apply_ctrl(e, body, n, err);
    }
    if (exit_now) return exit_now; /* 1, or an error from a bad block */
    /* 2. batch */
    const ms_batch_seq *batch = NULL;
    int n = e->is_leader ? ms_sched_build(e->sched, &batch) : 0;
    if (e->W > 1 && e->lay.attn_tp > 1 && (rc = share_batch(e, &batch, &n, err))) return rc;
    int64_t rows = 0, dec = 0;
    for (int i = 0; i < n; i++) {
        rows += batch[i].n_tokens;
        dec += batch[i].n_tokens == 1;
    }
    /* 3. token counts */
    int64_t replica_rows = rows, all_rows = rows, all_dec = dec;
    if (e->W > 1) {
        int64_t mine[2] = {rows, dec};
        if ((rc = ms_comm_allgather(e->gs.world, mine, sizeof mine, e->rows_world, err))) return rc;
        int base = e->shard.at.replica * e->lay.tp;
        replica_rows = all_rows = all_dec = 0;
        for (int i = 0; i < e->W; i++) {
            int in_rep = i >= base && i < base + e->lay.tp;
            int counted = (i % e->lay.attn_tp) == 0; /* one member per attention group */
            if (in_rep) {
                e->rows_tp[i - base] = e->rows_world[2 * i];
                replica_rows += e->rows_world[2 * i];
            }
            if (counted) {
                all_rows += e->rows_world[2 * i];
                all_dec += e->rows_world[2 * i + 1];
            }
        }
        e->shard.rows_per_rank = e->rows_tp;
    }
    /* 4. forward (idle ranks of a busy replica run 0 rows through the collectives) */
    if (replica_rows > 0 && (rc = ms_model_forward(e->m, e->pool, batch, n, err))) return rc;
    /* 5. sample and report */
    const ms_sched_event *ev = NULL;
    int n_ev = e->is_leader ? ms_sched_commit(e->sched, &ev) : 0;
    if ((rc = gather_events(e, ev, n_ev, err))) return rc;
    if (e->rank == 0) { /* every DP rank reported as of this step */
        for (int i = 0; i < e->n_dp; i++) {
            const ms_sched_stats *st = &e->loads[i].st;
            e->rloads[i] = (ms_router_load){st->n_running,
                                            st->n_waiting,
                                            st->used_tokens,
                                            st->total_tokens,
                                            st->queued_prefill_tokens,
                                            st->decode_tokens_left};
        }
        ms_router_update(e->router, e->rloads);
    }
    e->last.rows = all_rows;
    e->last.decode_rows = all_dec;
    e->last.seconds = ms_now_s() - t0;
    return 0;
}

int ms_engine_events(const ms_engine *e, const ms_engine_event **ev)
{
    *ev = e->events;
    return e->n_events;
}

void ms_engine_last_step(const ms_engine *e, ms_engine_step_stats *st) { *st = e->last; }

int ms_engine_loads(const ms_engine *e, const ms_engine_load **loads)
{
    *loads = e->loads;
    return e->n_dp;
}
