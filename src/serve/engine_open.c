/* engine_open.c — start-up of one rank's engine (engine.h): the launch resolved
 * from the model's shape (one helper for ms_engine_start and ms_engine_open), the
 * shard and its groups, the model, the KV cache budget and the cache, the
 * scheduler and the router.  The step loop is engine.c, the warm-up warmup.c.
 * Main thread only.
 */
#include "serve/engine.h"
#include "serve/engine_priv.h"
#include "serve/eplb_run.h"

#include "base/log.h"
#include "base/util.h"
#include "cache/kv_budget.h"
#include "moe/expert_recorder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The launch resolved for the model's shape into *lay and checked against what the CPU
 * engine runs: the same answer on every rank, before and after the relaunch. */
static int resolve(const ms_engine_opts *o, const ms_model_shape *shape, ms_layout *lay,
                   ms_errbuf *err)
{
    ms_layout_model lm;
    ms_shape_layout_model(shape, &lm);
    int rc = ms_layout_resolve(&o->launch, &lm, lay, err);
    if (!rc) rc = ms_layout_check_engine(lay, err);
    if (!rc && lay->shared_mode != MS_SHARED_SEPARATE && shape->n_shared <= 0)
        rc = ms_err(err, MS_EUNSUPPORTED,
                    "%s: the model has no shared expert (n_shared_experts "
                    "0), so there is nothing to fuse or place",
                    lay->fusion_flag);
    return rc;
}

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
    o->recorder_window = 1000; /* SGLang's default without EPLB */
    o->recorder_max_tokens = MS_REC_MAX_TOKENS_DEFAULT;
}

/* What a max_pos-long request costs the attention on each rank of its group
 * (ms_kv_spec_cost): a decode token's cache reads by pool and FLOPs at the
 * end of its context, and the prefill's FLOPs (each position's, summed). */
static void log_cost(const ms_kv_spec *spec, int64_t max_pos)
{
    ms_kv_cost k;
    ms_kv_spec_cost(spec, max_pos, &k);
    if (k.decode_flops <= 0) return;
    char by[256] = "", pf[256] = "";
    size_t nb = 0, np = 0;
    for (int i = 0; i < spec->n_streams; i++) {
        if (k.read_bytes[i] <= 0) continue;
        nb += (size_t)snprintf(by + nb, nb < sizeof by ? sizeof by - nb : 0, "%s%s %.2f MiB",
                               nb ? ", " : "", spec->streams[i].name, k.read_bytes[i] / 1048576.0);
        np += (size_t)snprintf(pf + np, np < sizeof pf ? sizeof pf - np : 0, "%s%s %.3g",
                               np ? ", " : "", spec->streams[i].name, k.prefill_flops_of[i] / 1e15);
    }
    MS_LOG(MS_INFO, "engine",
           "a %lld-token request's attention per rank (weights not included): a decode token at "
           "its end reads %.2f MiB of KV cache (%s) and computes %.3g GFLOP; its prefill "
           "computes %.4g PFLOP (%s)",
           (long long)max_pos, k.read_bytes_total / 1048576.0, by, k.decode_flops / 1e9,
           k.prefill_flops / 1e15, pf);
}

/* The capacity lines of the start-up log: each pool per DP rank, the concurrency
 * for context-length requests and what a max_position_embeddings-long request
 * needs and whether this rank admits it. */
static void log_capacity(const ms_engine *e, const ms_kv_spec *spec, int64_t max_pos)
{
    ms_kv_pool_info pi[MS_KV_MAX_STREAMS];
    int n = ms_kv_cache_pool_info(e->cache, pi);
    for (int i = 0; spec->n_streams > 1 && i < n; i++) /* V4: each pool */
        MS_LOG(MS_INFO, "engine",
               "KV pool '%s' per DP rank: %d pages of %lld tokens = %lld tokens of %s, %d layers, "
               "%.0f B per entry per layer, %.1f MiB",
               pi[i].name, pi[i].pages, (long long)pi[i].page_tokens, (long long)pi[i].tokens,
               pi[i].window ? "windows (each sequence keeps its last window + slack)"
                            : "whole history",
               pi[i].n_layers, pi[i].entry_bytes, pi[i].bytes / (1 << 20));
    int64_t L = e->ctx_len;
    MS_LOG(MS_INFO, "engine",
           "maximum concurrency for %lld-token requests: %.2fx per DP rank (%d DP ranks, "
           "--max-running-requests %d per rank)",
           (long long)L, ms_kv_cache_concurrency(e->cache, L), e->n_dp, e->max_running_rank);
    if (max_pos <= 0) return;
    double kv = ms_kv_spec_request_bytes(spec, 0, spec->n_layers, max_pos);
    double st = ms_kv_spec_state_bytes(spec, 0, spec->n_layers);
    double conc = ms_kv_cache_concurrency(e->cache, max_pos);
    char why[160];
    if (max_pos > e->ctx_len)
        snprintf(why, sizeof why, "refused: the context length is %lld (--context-length)",
                 (long long)e->ctx_len);
    else if (conc < 1)
        snprintf(why, sizeof why,
                 "refused at admission: the pools hold %.2f of it (raise --max-total-tokens or "
                 "--mem-fraction-static)",
                 conc);
    else
        snprintf(why, sizeof why, "admitted, %.2fx at once", conc);
    MS_LOG(MS_INFO, "engine",
           "a %lld-token request (max_position_embeddings) holds %.3f GiB (%.0f B per token) of "
           "KV cache + %.2f MiB of compressor state on each rank of its attention group: %s",
           (long long)max_pos, kv / 1073741824.0, kv / (double)max_pos, st / 1048576.0, why);
    log_cost(spec, max_pos);
}

static int size_pool(ms_engine *e, ms_errbuf *err)
{
    const ms_model_shape *c = ms_model_shape_of(e->m);
    char stag[64] = "";
    if (ms_eplb_run_staging_bytes(e))
        snprintf(stag, sizeof stag, ", + %.1f MiB EPLB staging",
                 (double)ms_eplb_run_staging_bytes(e) / (1 << 20));
    /* --kv-cache-dtype fp8_e4m3: e4m3 rows (the family's kv_spec sizes them
     * from elem_bytes 1: V3's latent rows, V4's packed FP8 ds entries);
     * otherwise the activations' dtype.  V4's index keys: MXFP4 with
     * --enable-deepseek-v4-fp4-indexer, else FP8 under an FP8 cache (SGLang's V4
     * keys: 128 e4m3 + an f32 scale), else the activations' dtype */
    ms_dtype dt = !strcasecmp(e->o.launch.kv_cache_dtype, "fp8_e4m3") ? MS_DT_F8E4M3
                  : e->o.exact                                        ? MS_DT_F32
                                                                      : MS_DT_BF16;
    ms_kv_spec spec;
    ms_kv_spec_opts so = {.elem_bytes = ms_dtype_size(dt),
                          .act_bytes = e->o.exact ? 4 : 2,
                          .index_key = e->o.launch.v4_fp4_indexer ? MS_KV_INDEX_MXFP4
                                       : dt == MS_DT_F8E4M3       ? MS_KV_INDEX_FP8
                                                                  : MS_KV_INDEX_PLAIN,
                          .state_bytes = e->o.launch.compress_state_bytes,
                          .page_size = e->o.page_size,
                          .attn_tp = e->lay.attn_tp,
                          .prefix_carry = 1,
                          .draft_tokens = ms_engine_spec_mtp(e) ? ms_engine_spec_steps(e) + 1 : 0};
    int rc = ms_model_kv_spec(e->m, &so, &spec, err);
    if (rc) return rc;
    int64_t per_tok = ms_kv_spec_token_bytes(&spec);
    double ratio = e->o.launch.swa_full_tokens_ratio;
    if (ratio > 0 && ms_kv_spec_window_token_bytes(&spec) <= 0)
        return ms_err(err, MS_EINVAL,
                      "--swa-full-tokens-ratio: the model has no sliding-window KV pool");
    /* the pools that do not grow with the tokens: state slots, and the windows sized by
     * the running requests when no ratio is given */
    int32_t pages[MS_KV_MAX_STREAMS];
    ms_kv_cache_pages_for(&spec, e->o.page_size, 0, e->max_running_rank, e->chunk_rank, 0, pages);
    double fixed = (double)e->max_running_rank * ms_kv_spec_state_bytes(&spec, 0, spec.n_layers) +
                   (ratio > 0 ? 0 : ms_kv_cache_pages_bytes(&spec, e->o.page_size, pages, 1));
    int64_t weights = ms_model_local_weight_bytes(e->m), packed = (int64_t)e->prepacked_bytes;
    int64_t staging = (int64_t)ms_eplb_run_staging_bytes(e);
    ms_kv_budget_in bi = {.max_total_tokens = e->o.max_total_tokens,
                          .mem_fraction_static = e->o.mem_fraction_static,
                          .avail_bytes = e->avail0,
                          .weight_bytes = weights,
                          .copy_bytes = packed + staging,
                          .fixed_bytes = (int64_t)fixed,
                          .swa_ratio = ratio,
                          .page_size = e->o.page_size};
    int64_t tokens;
    if ((rc = ms_kv_budget_tokens(&spec, &bi, &tokens, err))) return rc;
    /* every rank must agree (members mirror their leader's page ids): take the minimum */
    if (e->W > 1) {
        int64_t *all = calloc((size_t)e->W, sizeof *all);
        if (!all) return ms_err(err, MS_ENOMEM, "out of memory");
        rc = ms_comm_allgather(e->gs.world, &tokens, sizeof tokens, all, err);
        if (!rc)
            for (int i = 0; i < e->W; i++) tokens = MS_MIN(tokens, all[i]);
        free(all);
        if (rc) return rc;
    }
    ms_kv_cache_pages_for(&spec, e->o.page_size, tokens, e->max_running_rank, e->chunk_rank,
                          (int64_t)(ratio * (double)tokens), pages);
    if ((rc = ms_kv_cache_new(&e->cache, &spec, e->o.page_size, pages, dt, e->max_running_rank,
                              err)))
        return rc;
    e->pool_tokens = ms_kv_cache_tokens(e->cache);
    if (e->rank != 0) return 0;
    MS_LOG(MS_INFO, "engine",
           "KV pool: %lld tokens per DP rank (%d DP ranks, attention TP %d, %s), %lld B per token, "
           "weights %.2f GB on this rank (+ %.1f MiB prepacked%s)",
           (long long)e->pool_tokens, e->n_dp, e->lay.attn_tp,
           e->lay.attn_tp > 1 ? "replicated across the attention-TP group" : "not replicated",
           (long long)per_tok, (double)weights / 1e9, (double)packed / (1 << 20), stag);
    if (ms_kv_spec_window_token_bytes(&spec) > 0)
        MS_LOG(MS_INFO, "engine", "sliding-window pool: %s",
               ratio > 0 ? "--swa-full-tokens-ratio × the whole-history tokens (at least one "
                           "request's window)"
                         : "each running request's window (no --swa-full-tokens-ratio)");
    log_capacity(e, &spec, c->max_context);
    return 0;
}

/* Each layer's expert placement over its physical slots (routed + redundant):
 * --init-expert-location's placement or recorded distribution, else trivial.
 * Built on every rank (the same file, the same answer). */
static int build_expert_maps(ms_engine *e, const ms_model_shape *shape, ms_errbuf *err)
{
    if (shape->n_routed <= 0) return 0;
    int n = shape->n_layers + shape->n_mtp_layers; /* MTP layers after the stack */
    e->expert_maps = calloc((size_t)n, sizeof *e->expert_maps);
    if (!e->expert_maps) return ms_err(err, MS_ENOMEM, "out of memory");
    e->n_expert_maps = n;
    ms_rank_coords at;
    if (ms_layout_rank_coords(&e->lay, e->rank, &at))
        return ms_err(err, MS_EINTERNAL, "rank %d is outside the layout", e->rank);
    const char *path = e->o.launch.init_expert_location;
    int rc =
        ms_expert_map_load(e->expert_maps, n, shape->n_routed, e->lay.n_physical_experts,
                           e->lay.moe_ep, at.moe_ep_rank, e->o.launch.eplb_algorithm, path, err);
    if (!rc && e->rank == 0 && e->lay.n_physical_experts > shape->n_routed)
        MS_LOG(MS_INFO, "engine",
               "experts: %d physical slots per layer (%d routed + %d redundant), %d per EP rank; "
               "placement %s",
               e->lay.n_physical_experts, shape->n_routed,
               e->lay.n_physical_experts - shape->n_routed, e->expert_maps[0].per_rank,
               path[0] ? path : "trivial (slot p holds p mod E)");
    return rc;
}

/* The shard: {layout, this rank's coordinates, its groups}, all from the layout. */
static int build_shard(ms_engine *e, ms_errbuf *err)
{
    int rc = ms_comm_groups_init(&e->gs, &e->lay, err);
    if (rc) return rc;
    e->have_groups = 1;
    e->shard = (ms_shard){.lay = &e->lay,
                          .at = e->gs.at,
                          .attn_group = e->gs.attn_tp,
                          .tp_group = e->gs.tp,
                          .dispatch_bf16 = e->o.dispatch_bf16,
                          .experts = e->expert_maps,
                          .step = &e->step,
                          .waterfill_dynamic = e->o.launch.waterfill_dynamic};
    e->is_leader = e->gs.at.attn_tp_rank == 0;
    e->dp_index = e->gs.at.replica * e->lay.attn_dp + e->gs.at.attn_dp_rank;
    return 0;
}

int ms_engine_start(const char *cmd, const ms_engine_opts *o, double comm_timeout_s, int argc,
                    char **argv, ms_model_shape *shape, ms_layout *lay, int *world, int *rank)
{
    ms_errbuf err = {{0}};
    if (ms_family_load(o->model_path, 1, NULL, shape, &err)) {
        fprintf(stderr, "%s: --model-path %s: %s\n", cmd, o->model_path, err.msg);
        return 1;
    }
    if (resolve(o, shape, lay, &err) || ms_comm_maybe_relaunch(lay->world_size, argc, argv, &err)) {
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
    ms_model_shape shape;
    if ((rc = ms_family_load(o->model_path, 1, NULL, &shape, err)) ||
        (rc = resolve(o, &shape, &e->lay, err)) || (rc = build_expert_maps(e, &shape, err)))
        goto fail;
    if (e->lay.world_size != e->W) {
        rc = ms_err(err, MS_ELAYOUT, "this launch needs %d ranks, the world has %d",
                    e->lay.world_size, e->W);
        goto fail;
    }
    e->n_dp = e->lay.n_replicas * e->lay.attn_dp;
    ms_model_opts mo = {.threads = o->threads,
                        .exact = o->exact,
                        .batch_invariant = o->deterministic,
                        .shard = NULL};
    if (e->W > 1) {
        ms_comm_set_fixed_order(o->deterministic); /* sums over ranks in rank order */
        if ((rc = build_shard(e, err))) goto fail;
        mo.shard = &e->shard;
    } else {
        e->is_leader = 1;
    }
    e->avail0 = ms_kv_mem_available() / ms_kv_ranks_on_host(e->W);
    if ((rc = ms_model_open(&e->m, o->model_path, &mo, err))) goto fail;
    /* before the pool: its copies come out of the same budget (batch-invariant
     * products read neither the panels nor oneDNN's copies) */
    if (o->prepack && !o->deterministic) {
        double t0 = ms_now_s();
        e->prepacked = ms_model_prepack(e->m, &e->prepacked_bytes);
        e->prepack_s = ms_now_s() - t0;
    }
    const ms_model_shape *ms = ms_model_shape_of(e->m);
    e->ctx_len =
        o->context_length > 0 ? MS_MIN(o->context_length, ms->max_context) : ms->max_context;
    int max_running = e->lay.max_running_per_rank > 0
                          ? e->lay.max_running_per_rank
                          : MS_MAX(1, o->max_running_default / MS_MAX(e->lay.attn_dp, 1));
    int64_t chunk = e->lay.chunked_prefill_per_rank > 0 ? e->lay.chunked_prefill_per_rank
                    : e->lay.chunked_prefill_per_rank < 0
                        ? e->ctx_len /* chunking off */
                        : MS_MAX(1, o->chunk_default / MS_MAX(e->lay.attn_dp, 1));
    e->max_running_rank = max_running;
    e->chunk_rank = chunk;
    if ((rc = ms_engine_spec_open(e, ms, err)) || (rc = ms_eplb_run_open(e, err)) ||
        (rc = size_pool(e, err)))
        goto fail;
    if (e->is_leader) {
        int S = ms_engine_spec_steps(e);
        ms_sched_params sp = {.page_size = o->page_size,
                              .max_running = max_running,
                              .chunk_tokens = chunk,
                              .policy = o->schedule_policy,
                              .context_len = e->ctx_len,
                              .vocab = ms->vocab,
                              .eos_id = ms->eos_token_id,
                              .spec_steps = S,
                              .spec_ngram = S > 0 && !ms_engine_spec_mtp(e),
                              .spec_hidden = ms_engine_spec_mtp(e),
                              .hidden_dim = ms_model_draft_hidden_width(e->m),
                              .ngram_min = o->launch.ngram_min > 0 ? o->launch.ngram_min : 1,
                              .ngram_max = o->launch.ngram_max > 0 ? o->launch.ngram_max : 12};
        if ((rc = ms_sched_new(&e->sched, &sp, e->cache, err)) ||
            (rc = ms_sample_new(&e->sampler, ms->vocab, err)))
            goto fail;
        if (!(e->picks = calloc(((size_t)max_running + 1) * (size_t)(S + 1), sizeof *e->picks))) {
            rc = ms_err(err, MS_ENOMEM, "out of memory");
            goto fail;
        }
        const char *sim = getenv("SGLANG_SIMULATE_ACC_LEN");
        if (S > 0 && sim && atof(sim) > 0) {
            ms_sample_simulate_accept(e->sampler, atof(sim));
            if (e->rank == 0)
                MS_LOG(MS_WARN, "spec",
                       "SGLANG_SIMULATE_ACC_LEN=%s: BENCHMARK MODE - every verify accepts drafts "
                       "as if the mean accept length were %s; the outputs are NOT the model's",
                       sim, sim);
        }
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
    e->step.rows_per_rank = e->rows_tp; /* the counts change every step, the array never */
    if (e->rank == 0 && (rc = ms_router_new(&e->router, e->n_dp, &o->router))) {
        rc = ms_err(err, rc, "router: %d DP ranks, or a threshold out of range", e->n_dp);
        goto fail;
    }
    e->g_displs = e->g_bytes + e->W;
    /* EPLB reads the recorder's window: stat unless a mode was given, at most one
     * rebalance interval of passes (SGLang's buffer size defaults to it) */
    int rec_mode = e->eplb && !o->recorder_mode ? MS_REC_STAT : o->recorder_mode;
    int rec_window = e->eplb ? MS_MIN(o->recorder_window, o->launch.eplb_rebalance_num_iterations)
                             : o->recorder_window;
    if (rec_mode && e->n_expert_maps > 0) {
        const ms_expert_map *m0 = &e->expert_maps[0];
        e->rec = ms_expert_recorder_new(rec_mode, ms->n_layers, m0->n_logical, m0->n_physical,
                                        m0->n_ranks, rec_window, ms->topk, o->recorder_max_tokens,
                                        e->W > 1 ? e->expert_maps : NULL);
        if (!e->rec) {
            rc = ms_err(err, MS_ENOMEM, "out of memory for the expert distribution recorder");
            goto fail;
        }
        ms_expert_recorder_set_active(e->rec);
        if (e->eplb) ms_expert_recorder_record_always(e->rec);
    }
    for (int i = 0; i < e->n_dp; i++) e->loads[i].dp_rank = i;
    if (e->rank == 0) {
        char desc[512];
        ms_layout_describe(&e->lay, desc, sizeof desc);
        MS_LOG(MS_INFO, "engine", "layout: %s (world %d)", desc, e->W);
        const ms_launch *l = &o->launch;
        if (e->lay.shared_mode == MS_SHARED_WATERFILL) {
            MS_LOG(MS_INFO, "engine",
                   "waterfill: the shared expert is a slot on each of the %d EP "
                   "ranks; each token's copy goes to a lightly loaded rank (%s)",
                   e->lay.moe_ep,
                   e->shard.waterfill_dynamic ? "dynamic: EP-wide loads each layer"
                                              : "static: this rank's loads");
            if (l->a2a_alias != MS_A2A_ALIAS_DEEPEP && l->a2a_alias != MS_A2A_ALIAS_MEGAMOE)
                MS_LOG(MS_WARN, "engine",
                       "--enable-waterfill with --moe-a2a-backend %s: SGLang "
                       "switches to deepep; here every backend name runs the same all-to-all",
                       ms_launch_a2a_name(l));
            if (l->disable_shared_experts_fusion)
                MS_LOG(MS_WARN, "engine",
                       "--disable-shared-experts-fusion is overridden: "
                       "--enable-waterfill needs the shared expert fused (SGLang's rule)");
        }
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
    ms_sample_free(e->sampler);
    ms_engine_spec_free(e);
    free(e->picks);
    ms_kv_cache_free(e->cache);
    ms_model_free(e->m);
    ms_expert_recorder_free(e->rec);
    ms_eplb_run_free(e);
    if (e->have_groups) ms_comm_groups_deinit(&e->gs);
    for (int l = 0; l < e->n_expert_maps; l++) ms_expert_map_deinit(&e->expert_maps[l]);
    free(e->expert_maps);
    free(e->ctrl);
    free(e->aborts);
    free(e->events);
    free(e->rej_in);
    free(e->rejects);
    free(e->req_ids);
    free(e->loads);
    ms_router_free(e->router);
    free(e->rloads);
    free(e->gather_buf);
    free(e->g_bytes);
    free(e->rows_world);
    free(e->rows_tp);
    free(e->bbuf);
    free(e->mbatch);
    free(e->mkv);
    free(e->mdata);
    free(e->mlogits);
    free(e->mlog_ptr);
    free(e);
}
