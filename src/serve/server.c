/* server.c — `moeserve serve`: flags, start-up order and the rank-0 loop that
 * bridges the HTTP front end's hub (request.h) and the engine (engine.h).
 *
 * Start-up (DESIGN.md §2): resolve the layout (every rank, same answer),
 * re-launch under mpirun when W > 1 ranks are needed, MPI init, load and slice
 * the weights, size the KV pools, then rank 0 opens the HTTP port last, so
 * /health answering means the whole world is ready.  Ranks other than 0 just
 * follow rank 0's steps.  Rank 0 sleeps on the hub's eventfd while nothing
 * runs anywhere (no CPU at idle).  SIGTERM, SIGINT (or SIGUSR1, what the
 * self-relaunch's supervisor sends through mpirun: comm_launch.c) drains: new
 * requests get 503, running ones finish (within --shutdown-timeout, default
 * no limit as SGLang), then every rank exits 0; a second signal stops at once.
 * The other ranks ignore those signals and exit when rank 0 ends the run.
 * Main thread only (and one watchdog thread at exit, finalize_watchdog).
 */
#include "base/log.h"
#include "base/util.h"
#include "model/tokenizer.h"
#include "moe/expert_recorder.h"
#include "parallel/comm.h"
#include "serve/detok.h"
#include "serve/engine.h"
#include "serve/flag_kinds.h"
#include "serve/http.h"
#include "serve/request.h"
#include "tools/commands.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct serve_opts {
    ms_flag_screen screen; /* GPU-only flags to warn about (argv borrowed) */
    ms_engine_opts eo;
    ms_frontend_opts fo;
    double comm_timeout_s;
    double shutdown_timeout_s; /* --shutdown-timeout: 0 = no limit */
    int skip_warmup;           /* --skip-server-warmup */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve serve --model-path DIR [flags]\n"
            "engine:\n"
            "  --model-path DIR (or --model)     Hugging Face checkpoint directory\n"
            "  --dtype auto|float32|bfloat16     activation precision (float32: exact)\n"
            "  --threads N                       worker threads per rank (default: all cores)\n"
            "  --max-total-tokens N              KV pool tokens per DP rank\n"
            "  --mem-fraction-static F           else: F x (MemAvailable before the load / ranks\n"
            "                                    on the host) minus weights and their oneDNN\n"
            "                                    copies (default 0.3)\n"
            "  --context-length N                default: max_position_embeddings\n"
            "  --schedule-policy fcfs|lpm        waiting-queue order (default fcfs)\n"
            "  --load-balance-method M           DP rank of a new request: round_robin (default),\n"
            "                                    total_requests, total_tokens, vllm, cache_aware,\n"
            "                                    cost\n"
            "  --cache-threshold F               cache_aware: prompt share a rank must hold (0.3)\n"
            "  --balance-abs-threshold N         cache_aware: imbalanced if max - min in flight\n"
            "                                    > N and max > min x F, F from\n"
            "  --balance-rel-threshold F         (defaults 64 and 1.5)\n"
            "  --max-tree-size N                 router prefix tree: tokens per DP rank (4194304)\n"
            "  --ep-dispatch-dtype fp32|bf16     MoE all-to-all payload precision\n"
            "  --comm-timeout-s S                deadline of one collective (default 60)\n"
            "  --shutdown-timeout S              after SIGTERM/SIGINT, running requests may take\n"
            "                                    S s to finish, then are aborted (default 0: no\n"
            "                                    limit, as SGLang; a second signal stops at once)\n"
            "  --expert-distribution-recorder-mode stat|per_pass|per_token\n"
            "                                    record routed expert hits per layer and\n"
            "                                    physical expert (/start_, /stop_,\n"
            "                                    /dump_expert_distribution_record as JSON);\n"
            "                                    per_pass: each pass's counts; per_token: each\n"
            "                                    pass's tokens and their top-k experts\n"
            "  --expert-distribution-recorder-buffer-size N  passes kept (default 1000)\n"
            "  --expert-distribution-recorder-max-tokens N   per_token: token rows kept, all\n"
            "                                    passes and ranks (default 65536; each row\n"
            "                                    4 x (3 + layers x top-k) bytes on rank 0)\n"
            "  --enable-deterministic-inference  outputs independent of the batch: fixed\n"
            "                                    reduction orders for every batch size, chunk\n"
            "                                    split and retraction, sums over ranks in rank\n"
            "                                    order; slower\n"
            "  --skip-server-warmup              start without the warm-up (prepacking the\n"
            "                                    BF16 weights for prefill GEMMs and one\n"
            "                                    2048-token prompt, else paid by the first\n"
            "                                    long prompts)\n"
            "launch flags (SGLang names):\n%s"
            "front end:\n",
            ms_launch_help());
    ms_frontend_print_flags(f);
    ms_flag_kinds_print_help(f);
}

/* argv without the GPU-only, refused and multi-node flags (flag_kinds.h) */
static int parse_kept(void *ctx, int argc, char **argv)
{
    struct serve_opts *o = ctx;
    ms_engine_opts_init(&o->eo);
    ms_frontend_opts_init(&o->fo);
    o->comm_timeout_s = 60;
    ms_errbuf err = {{0}};
    if (ms_launch_apply_env(&o->eo.launch, &err)) {
        fprintf(stderr, "serve: %s\n", err.msg);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int lr = ms_launch_parse_arg(&o->eo.launch, argc, argv, &i, &err);
        if (lr < 0) {
            fprintf(stderr, "serve: %s\n", err.msg);
            return -1;
        }
        if (lr > 0) {
            i--;
            continue;
        }
        int fr = ms_frontend_parse_flag(&o->fo, argc, argv, i, &err);
        if (fr < 0) {
            fprintf(stderr, "serve: %s\n", err.msg);
            return -1;
        }
        if (fr > 0) {
            i += fr - 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--skip-server-warmup")) {
            o->skip_warmup = 1;
            continue;
        }
        if (!strcmp(a, "--enable-deterministic-inference")) {
            o->eo.deterministic = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "serve: %s needs a value (or is unknown)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        int rr = ms_router_parse_flag(&o->eo.router, a, v, &err);
        if (rr < 0) {
            fprintf(stderr, "serve: %s\n", err.msg);
            return -1;
        }
        if (rr > 0) continue;
        char *end = NULL;
        errno = 0;
        if (!strcmp(a, "--model-path") || !strcmp(a, "--model")) {
            o->eo.model_path = v;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "float32"))
                o->eo.exact = 1;
            else if (!strcmp(v, "auto") || !strcmp(v, "bfloat16"))
                o->eo.exact = 0;
            else
                goto bad;
        } else if (!strcmp(a, "--threads")) {
            long x = strtol(v, &end, 10);
            if (!*v || *end || x < 0 || x > 4096) goto bad;
            o->eo.threads = (int)x;
        } else if (!strcmp(a, "--max-total-tokens")) {
            long long x = strtoll(v, &end, 10);
            if (!*v || *end || errno || x < 1) goto bad;
            o->eo.max_total_tokens = x;
        } else if (!strcmp(a, "--mem-fraction-static")) {
            double x = strtod(v, &end);
            if (!*v || *end || !(x > 0 && x < 1)) goto bad;
            o->eo.mem_fraction_static = x;
        } else if (!strcmp(a, "--context-length")) {
            long long x = strtoll(v, &end, 10);
            if (!*v || *end || errno || x < 2) goto bad;
            o->eo.context_length = x;
        } else if (!strcmp(a, "--schedule-policy")) {
            if (!strcmp(v, "fcfs"))
                o->eo.schedule_policy = MS_SCHED_FCFS;
            else if (!strcmp(v, "lpm"))
                o->eo.schedule_policy = MS_SCHED_LPM;
            else
                goto bad;
        } else if (!strcmp(a, "--ep-dispatch-dtype")) {
            if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16"))
                o->eo.dispatch_bf16 = 1;
            else if (!strcmp(v, "fp32") || !strcmp(v, "float32"))
                o->eo.dispatch_bf16 = 0;
            else
                goto bad;
        } else if (!strcmp(a, "--expert-distribution-recorder-mode")) {
            if (ms_recorder_mode_parse(v, &o->eo.recorder_mode, &err)) {
                fprintf(stderr, "serve: %s\n", err.msg);
                return -1;
            }
        } else if (!strcmp(a, "--expert-distribution-recorder-buffer-size")) {
            long x = strtol(v, &end, 10);
            if (!*v || *end || x < 1 || x > 1000000) goto bad;
            o->eo.recorder_window = (int)x;
        } else if (!strcmp(a, "--expert-distribution-recorder-max-tokens")) {
            long long x = strtoll(v, &end, 10);
            if (!*v || *end || x < 1 || x > 100000000) goto bad;
            o->eo.recorder_max_tokens = x;
        } else if (!strcmp(a, "--shutdown-timeout")) {
            double x = strtod(v, &end);
            if (!*v || *end || !(x >= 0 && x <= 1e7)) goto bad;
            o->shutdown_timeout_s = x;
        } else if (!strcmp(a, "--comm-timeout-s")) {
            double x = strtod(v, &end);
            if (!*v || *end || !(x > 0)) goto bad;
            o->comm_timeout_s = x;
        } else {
            fprintf(stderr, "serve: unknown flag %s\n", a);
            return -1;
        }
        continue;
    bad:
        fprintf(stderr, "serve: bad value '%s' for %s (moeserve serve --help)\n", v, a);
        return -1;
    }
    if (!o->eo.model_path) {
        fprintf(stderr, "serve: --model-path DIR is required\n");
        return -1;
    }
    if (ms_flag_screen_check(&o->screen, &o->eo.launch, o->eo.exact, o->eo.model_path, "serve",
                             stderr))
        return -1;
    o->eo.page_size = o->eo.launch.page_size_set ? o->eo.launch.page_size : 16;
    return 0;
}

static int parse(struct serve_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    return ms_flag_screen_then(&o->screen, argc, argv, parse_kept, o);
}

/* ---- rank 0: requests in flight, by engine id ---- */

struct live {
    uint64_t id;
    ms_serve_req *req;
    int got_first;
};

struct table {
    struct live *v;
    size_t n, cap;
};

static struct live *find_id(struct table *t, uint64_t id)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].id == id) return &t->v[i];
    return NULL;
}

static struct live *find_req(struct table *t, const ms_serve_req *r)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].req == r) return &t->v[i];
    return NULL;
}

static void drop(struct table *t, struct live *l, int kind, int32_t stop, const char *msg)
{
    ms_serve_req_finish(l->req, (enum ms_serve_finish)kind, stop, msg);
    ms_serve_req_unref(l->req);
    *l = t->v[--t->n];
}

static void fill_info(const ms_engine *e, const struct serve_opts *o, ms_engine_info *info)
{
    const ms_layout *lay = ms_engine_layout(e);
    const ms_model *m = ms_engine_model(e);
    memset(info, 0, sizeof *info);
    snprintf(info->model_path, sizeof info->model_path, "%s", o->eo.model_path);
    snprintf(info->model_family, sizeof info->model_family, "%s", ms_model_family(m)->name);
    info->context_len = ms_engine_context_length(e);
    info->page_size = o->eo.page_size;
    info->vocab_size = (int32_t)ms_model_shape_of(m)->vocab;
    ms_layout_describe(lay, info->layout, sizeof info->layout);
    info->tp_size = lay->tp;
    info->dp_size = o->eo.launch.dp;
    info->ep_size = lay->moe_ep;
    info->pp_size = lay->pp;
    info->attn_dp_size = lay->attn_dp;
    info->attn_tp_size = lay->attn_tp;
    info->moe_tp_size = lay->moe_tp;
    info->kv_pool_replicated = lay->attn_tp > 1;
    info->n_dp = MS_MIN(ms_engine_n_dp(e), MS_SERVE_MAX_DP);
    for (int i = 0; i < info->n_dp; i++) info->max_total_num_tokens[i] = ms_engine_pool_tokens(e);
    info->n_kv_pools = ms_engine_kv_pools(e, info->kv_pools);
    info->swa_full_tokens_ratio = o->eo.launch.swa_full_tokens_ratio;
    info->max_position_embeddings = ms_model_shape_of(m)->max_context;
    info->max_concurrency_ctx = ms_engine_kv_concurrency(e, info->context_len);
    info->max_concurrency_max_pos = ms_engine_kv_concurrency(e, info->max_position_embeddings);
    const ms_kv_spec *ks = ms_engine_kv_spec(e);
    ms_kv_spec_cost(ks, info->max_position_embeddings, &info->max_position_cost);
    info->n_kv_streams = ks->n_streams;
    for (int i = 0; i < ks->n_streams; i++)
        snprintf(info->kv_stream_names[i], sizeof info->kv_stream_names[i], "%s",
                 ks->streams[i].name);
    info->max_running_requests_per_rank = ms_engine_max_running_per_rank(e);
    info->max_running_requests = info->max_running_requests_per_rank * ms_engine_n_dp(e);
    info->chunked_prefill_size_per_rank = (int32_t)ms_engine_chunk_per_rank(e);
    info->chunked_prefill_size = info->chunked_prefill_size_per_rank * ms_engine_n_dp(e);
    info->max_prefill_tokens = info->chunked_prefill_size_per_rank;
    snprintf(info->dtype, sizeof info->dtype, "%s", o->eo.exact ? "float32" : "auto");
    snprintf(info->load_balance_method, sizeof info->load_balance_method, "%s",
             ms_lb_name(o->eo.router.policy));
    info->recorder = ms_engine_recorder(e);
    info->weight_bytes_rank0 = ms_model_local_weight_bytes(m);
    info->n_physical_experts = lay->n_physical_experts;
    info->n_redundant_experts = lay->n_physical_experts - lay->n_routed_experts;
    info->enable_eplb = o->eo.launch.enable_eplb;
    info->eplb_staging_bytes = (int64_t)ms_engine_eplb_staging_bytes(e);
}

static void admit(ms_engine *e, struct table *t, ms_serve_req *r, uint64_t id)
{
    ms_req_params in = r->params; /* the front end's, as it travels */
    in.id = id;
    in.ids = r->input_ids;
    in.n_ids = r->n_input;
    in.dp_rank = r->dp_rank_hint;
    if (r->is_health_check) {
        in.max_new = 1;
        in.samp = (ms_sampler_params){.temperature = 0, .top_p = 1};
    }
    ms_errbuf err = {{0}};
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        struct live *v = realloc(t->v, sizeof *v * cap);
        if (!v) {
            ms_serve_req_finish(r, MS_SERVE_FINISH_ERROR, -1, "out of memory");
            ms_serve_req_unref(r);
            return;
        }
        t->v = v;
        t->cap = cap;
    }
    int rc = ms_engine_submit(e, &in, &err);
    if (rc) {
        ms_serve_req_fail(r, rc, err.msg);
        ms_serve_req_unref(r);
        return;
    }
    t->v[t->n++] = (struct live){id, r, 0};
}

static void deliver(ms_engine *e, struct table *t)
{
    const ms_engine_event *ev;
    int n = ms_engine_events(e, &ev);
    for (int i = 0; i < n; i++) {
        const ms_sched_event *x = &ev[i].ev;
        struct live *l = find_id(t, x->id);
        if (!l) continue; /* aborted by the client meanwhile */
        if (!l->got_first) {
            ms_serve_req_set_cached_tokens(l->req, (int32_t)x->cached_tokens);
            l->got_first = 1;
        }
        ms_serve_req_set_spec(l->req, x->spec_verify_ct, x->spec_accepted);
        if (x->token >= 0)
            ms_serve_req_push(l->req, x->token, x->logprob, x->n_top ? x->top_ids : NULL,
                              x->n_top ? x->top_lps : NULL);
        if (ev[i].error) { /* refused by its DP rank */
            ms_serve_req_fail(l->req, ev[i].error, ev[i].error_msg);
            ms_serve_req_unref(l->req);
            *l = t->v[--t->n];
        } else if (x->finish != MS_FINISH_NONE) {
            int32_t stop = x->finish == MS_FINISH_STOP ? x->token : -1;
            drop(t, l, x->finish, stop,
                 x->finish == MS_FINISH_ERROR ? "the engine failed on this request" : NULL);
        }
    }
}

/* Generation throughput per DP rank over a sliding window of about 5 s. */
struct thr {
    double t0;
    int64_t base[MS_SERVE_MAX_DP], last[MS_SERVE_MAX_DP];
    double rate[MS_SERVE_MAX_DP];
    int64_t spec_at_step, spec_v, spec_a; /* the decode log line's last totals */
    int log_every, spec_steps;            /* --decode-log-interval; drafts per verify (S) */
};

/* SGLang's decode log line with speculative decoding's accept length and rate
 * over the steps since the last line (every --decode-log-interval steps while
 * requests decode), as SGLang's scheduler: accept len = tokens per verify,
 * accept rate = accepted drafts / (verifies x drafts per verify). */
static void decode_log(const ms_engine_load *loads, int n, int64_t steps, struct thr *th)
{
    int64_t run = 0, wait = 0, used = 0, total = 0, v = 0, a = 0;
    for (int i = 0; i < n; i++) {
        const ms_sched_stats *st = &loads[i].st;
        run += st->n_running, wait += st->n_waiting, used += st->used_tokens;
        total += st->total_tokens, v += st->spec_verify_total, a += st->spec_accepted_total;
    }
    if (v == th->spec_v || steps - th->spec_at_step < th->log_every) return;
    double g = 0, dv = (double)(v - th->spec_v), da = (double)(a - th->spec_a);
    for (int i = 0; i < n && i < MS_SERVE_MAX_DP; i++) g += th->rate[i];
    MS_LOG(MS_INFO, "sched",
           "Decode batch. #running-req: %lld, #token: %lld, token usage: %.2f, accept len: %.2f, "
           "accept rate: %.2f, gen throughput (token/s): %.2f, #queue-req: %lld",
           (long long)run, (long long)used, total ? (double)used / (double)total : 0, 1.0 + da / dv,
           th->spec_steps > 0 ? da / (dv * th->spec_steps) : 0, g, (long long)wait);
    th->spec_at_step = steps, th->spec_v = v, th->spec_a = a;
}

static void publish(ms_engine *e, ms_serve_hub *hub, int64_t steps, struct thr *th)
{
    const ms_engine_load *loads;
    int n = ms_engine_loads(e, &loads);
    double now = ms_now_s();
    if (th->t0 == 0) th->t0 = now;
    for (int i = 0; i < n && i < MS_SERVE_MAX_DP; i++)
        th->last[i] = loads[i].st.generated_tokens_total;
    if (now - th->t0 >= 1.0) {
        for (int i = 0; i < n && i < MS_SERVE_MAX_DP; i++) {
            th->rate[i] = (double)(th->last[i] - th->base[i]) / (now - th->t0);
            th->base[i] = th->last[i];
        }
        th->t0 = now;
    }
    for (int i = 0; i < n && i < MS_SERVE_MAX_DP; i++) {
        const ms_sched_stats *st = &loads[i].st;
        ms_dp_load l = {
            .num_running_reqs = st->n_running,
            .num_waiting_reqs = st->n_waiting,
            .num_used_tokens = st->used_tokens,
            .token_usage =
                st->total_tokens ? (double)st->used_tokens / (double)st->total_tokens : 0,
            .cache_hit_rate = st->prompt_tokens_total ? (double)st->cached_prompt_tokens_total /
                                                            (double)st->prompt_tokens_total
                                                      : 0,
            .gen_throughput = th->rate[i],
            .num_retracted_reqs_total = st->n_retracted,
            .num_steps_total = steps,
            .spec_verify_total = st->spec_verify_total,
            .spec_drafted_total = st->spec_drafted_total,
            .spec_accepted_total = st->spec_accepted_total};
        ms_serve_hub_publish_load(hub, i, &l);
    }
    decode_log(loads, n, steps, th);
    ms_serve_hub_heartbeat(hub);
}

/* Stop signals that arrive while the model loads (rank 0), replayed into the
 * hub once it exists.  The other ranks ignore SIGTERM, SIGINT and SIGUSR1 and
 * exit when rank 0 ends the run: a launcher that signals one rank signals them
 * all (the supervisor's SIGUSR1; Open MPI's SIGTERM on its way to SIGKILL, which
 * still ends a wedged job), and a rank that died of it would cut every stream. */
static volatile sig_atomic_t early_stops;

static void on_early_stop(int sig)
{
    (void)sig;
    early_stops++;
}

/* Open MPI's mpirun, told to stop (SIGTERM/SIGINT to it), sends every rank
 * SIGCONT first, and from then on its daemon never answers MPI_Finalize's PMIx
 * handshake (the ranks would wait there for its SIGKILL).  A rank that saw
 * SIGCONT gives the shutdown barrier and MPI_Finalize FINALIZE_GRACE_S, then
 * exits with its status; a stray SIGCONT only bounds a finalise that takes ms. */
#define FINALIZE_GRACE_S 1
static volatile sig_atomic_t saw_cont;
static int finalize_rc;

static void on_cont(int sig)
{
    (void)sig;
    saw_cont = 1;
}

static void *finalize_watchdog(void *arg)
{
    (void)arg;
    sleep(FINALIZE_GRACE_S);
    MS_LOG(MS_WARN, "serve",
           "MPI_Finalize unanswered after %d s (the launcher is ending the job): "
           "exiting with status %d",
           FINALIZE_GRACE_S, finalize_rc);
    fflush(stdout);
    fflush(stderr);
    _exit(finalize_rc);
}

static void install_early_signals(int rank)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = rank == 0 ? on_early_stop : SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_cont;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCONT, &sa, NULL);
}

/* Under a user-run Open MPI mpirun, SIGTERM to mpirun is its own abort: the ranks
 * get SIGTERM odls_base_sigkill_timeout seconds later and SIGKILL as long after
 * that, and mpirun exits 1 (README, "Stopping"). */
static void note_user_mpirun(int W)
{
    if (W < 2 || getenv("MOESERVE_RELAUNCHED") || !getenv("OMPI_COMM_WORLD_SIZE")) return;
    const char *g = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    MS_LOG(MS_INFO, "serve",
           "stop: SIGUSR1 to mpirun or SIGTERM to rank 0 drains (exit 0); SIGTERM to mpirun "
           "reaches the ranks after %s s and SIGKILL %s s later, so it drains within that only "
           "(mpirun --mca odls_base_sigkill_timeout S sets it) and mpirun exits 1",
           g && *g ? g : "1", g && *g ? g : "1");
}

static int rank0_loop(ms_engine *e, const struct serve_opts *o, ms_errbuf *err)
{
    int rc = 1;
    ms_tokenizer *tok = NULL;
    ms_serve_hub *hub = NULL;
    ms_frontend *fe = NULL;
    struct table t = {0};
    char path[1200];
    if (!ms_path_join(path, sizeof path, o->eo.model_path, "tokenizer.json") ||
        ms_tokenizer_load(&tok, path, err) ||
        ms_tokenizer_check_vocab(tok, ms_model_shape_of(ms_engine_model(e))->vocab, err)) {
        MS_LOG(MS_ERROR, "serve", "%s: %s (the server needs the model's tokenizer.json)", path,
               err->msg);
        goto out;
    }
    ms_serve_codec codec;
    ms_serve_codec_from_tokenizer(&codec, tok);
    ms_engine_info info;
    fill_info(e, o, &info);
    if (!(hub = ms_serve_hub_new(&info, err))) goto out;
    ms_serve_hub_install_signals(hub);
    for (int i = 0; i < early_stops && i < 2; i++) ms_serve_hub_request_stop(hub);
    struct thr th = {.log_every = o->fo.decode_log_interval, .spec_steps = ms_engine_spec_steps(e)};
    publish(e, hub, 0, &th);
    if (ms_frontend_open(&fe, &o->fo, hub, &codec, err)) {
        MS_LOG(MS_ERROR, "serve", "%s", err->msg);
        goto out;
    }
    MS_LOG(MS_INFO, "serve", "ready: http://%s:%d  (layout: %s; KV %lld tokens per DP rank x %d)",
           o->fo.host, ms_frontend_port(fe), info.layout, (long long)info.max_total_num_tokens[0],
           info.n_dp);
    uint64_t next_id = 1;
    int64_t steps = 0;
    int draining = 0;
    double drain_deadline = 0;
    for (;;) {
        if (!ms_engine_busy(e) && !draining)
            ms_serve_hub_wait(hub, 1000);
        else if (!ms_engine_busy(e)) /* the hub's wait returns at once once a stop is asked */
            nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
        ms_serve_msg m;
        while (ms_serve_hub_pop(hub, &m)) {
            if (m.kind == MS_MSG_GENERATE) {
                admit(e, &t, m.req, next_id++);
            } else if (m.kind == MS_MSG_ABORT) {
                struct live *l = find_req(&t, m.req);
                if (l) {
                    ms_engine_abort(e, l->id);
                    drop(&t, l, MS_FINISH_ABORT, -1, "aborted");
                }
                ms_serve_req_unref(m.req);
            } else if (m.kind == MS_MSG_ABORT_ALL) {
                while (t.n) {
                    ms_engine_abort(e, t.v[0].id);
                    drop(&t, &t.v[0], MS_FINISH_ABORT, -1, "aborted");
                }
            } else if (m.kind == MS_MSG_FLUSH_CACHE) {
                if (ms_engine_flush_cache(e) == 0) {
                    ms_serve_req_finish(m.req, MS_SERVE_FINISH_STOP, -1, NULL);
                } else {
                    char msg[96];
                    snprintf(msg, sizeof msg, "%zu requests are running", t.n);
                    ms_serve_req_finish(m.req, MS_SERVE_FINISH_ERROR, -1, msg);
                }
                ms_serve_req_unref(m.req);
            }
        }
        int stops = ms_serve_hub_stop_requested(hub);
        if (!draining && stops) {
            MS_LOG(MS_INFO, "serve", "stop requested: draining %zu running requests%s", t.n,
                   o->shutdown_timeout_s > 0 ? "" : " (no time limit; a second signal stops now)");
            ms_frontend_begin_drain(fe);
            draining = 1;
            drain_deadline = o->shutdown_timeout_s > 0 ? ms_now_s() + o->shutdown_timeout_s : 0;
        }
        if (draining && t.n == 0 && ms_frontend_live_requests(fe) == 0 && !ms_engine_busy(e)) break;
        if (draining && (stops > 1 || (drain_deadline > 0 && ms_now_s() > drain_deadline))) {
            MS_LOG(MS_WARN, "serve", "%s: aborting %zu running requests",
                   stops > 1 ? "second stop signal" : "--shutdown-timeout reached", t.n);
            break;
        }
        if (!ms_engine_busy(e)) continue;
        if (ms_engine_step(e, err)) {
            MS_LOG(MS_ERROR, "serve", "step failed: %s", err->msg);
            goto out;
        }
        steps++;
        deliver(e, &t);
        publish(e, hub, steps, &th);
    }
    rc = 0;
out:
    while (t.n) drop(&t, &t.v[0], MS_FINISH_ABORT, -1, "server shutting down");
    /* the connections write their final frames (finish_reason abort) before the close */
    for (double end = ms_now_s() + 2; fe && ms_frontend_live_requests(fe) && ms_now_s() < end;)
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    free(t.v);
    ms_frontend_close(fe);
    ms_serve_hub_free(hub);
    ms_tokenizer_free(tok);
    ms_errbuf e2;
    ms_engine_finish(e, &e2); /* tell the other ranks to exit */
    return rc;
}

int ms_cmd_serve(int argc, char **argv)
{
    struct serve_opts o;
    int prc = parse(&o, argc, argv);
    if (prc) {
        if (prc < 0) fprintf(stderr, "(moeserve serve --help lists the flags)\n");
        return prc > 0 ? 0 : 2;
    }
    ms_errbuf err = {{0}};
    ms_model_shape cfg;
    ms_layout lay;
    int W, rank, rc;
    /* main.c passes argv + 1: argv - 1 is the program's own argument vector */
    if ((rc = ms_engine_start("serve", &o.eo, o.comm_timeout_s, argc + 1, argv - 1, &cfg, &lay, &W,
                              &rank)))
        return rc;
    if (rank == 0) {
        ms_flag_screen_warn(&o.screen, "serve");
        note_user_mpirun(W);
    }
    rc = 1;
    install_early_signals(rank);
    ms_engine *e = NULL;
    if (ms_engine_boot(&e, &o.eo, o.skip_warmup, MS_ENGINE_WARMUP_TOKENS, &err)) {
        MS_LOG(MS_ERROR, "serve", "rank %d: %s", rank, err.msg);
        if (W > 1) ms_comm_abort(1);
        return 1;
    }
    if (rank == 0) {
        char table[2048];
        ms_layout_describe_table(ms_engine_layout(e), table, sizeof table);
        MS_LOG(MS_INFO, "serve", "resolved layout:\n%s", table);
        rc = rank0_loop(e, &o, &err);
    } else {
        rc = ms_engine_follow(e, &err) ? 1 : 0;
        if (rc) MS_LOG(MS_ERROR, "serve", "rank %d: %s", rank, err.msg);
    }
    ms_engine_close(e);
    pthread_t wd;
    if (W > 1 && saw_cont) {
        finalize_rc = rc;
        if (pthread_create(&wd, NULL, finalize_watchdog, NULL) == 0) pthread_detach(wd);
    }
    if (W > 1 && ms_comm_deinit(&err)) rc = 1;
    return rc;
}
