/* cmd_simulate.c — `moeserve simulate`: DP admission policies on a synthetic
 * workload without a model.  N attention-DP ranks, each a real scheduler
 * (serve/scheduler.c) over its own KV pool and radix prefix cache, fed by
 * the real router (serve/router.c); the forward is replaced by a step-time
 * model (a fixed cost per step, per decode row and per prefill token) and
 * the ranks step in lockstep as DP-attention ranks with expert parallelism
 * do: a step lasts as long as the busiest rank's, the others idle.  Prints
 * one row per policy: throughput, TTFT, prefix-cache hit rate, the busiest
 * rank's share of the computed tokens and the lockstep idle time.
 * Main thread only; no I/O besides stdout/stderr.
 */
#include "tools/commands.h"

#include "base/error.h"
#include "base/util.h"
#include "serve/router.h"
#include "serve/scheduler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prompt ids are drawn from [1, SIM_VOCAB): enough to keep random questions
 * apart, small enough that each rank's logits buffer stays tiny. */
enum { SIM_VOCAB = 256, SIM_MAX_DP = 256, SIM_MAX_REQS = 1000000 };
#define SIM_MAX_TOKENS ((int64_t)1 << 27) /* prompt tokens of a workload (512 MiB of ids) */

typedef struct sim_opts {
    long dp, seed, page_size, max_running, groups, per_group, sys_len, q_len, out_len;
    long num_prompts, in_len, rand_out_len, max_conc, pool_tokens, chunk;
    double rate, range_ratio, step_ms, row_ms, prefill_ms;
    int gsp, compare, json, lpm;
    ms_router_opts router;
} sim_opts;

typedef struct sim_req {
    double arrival_s, sent_s, first_s, done_s; /* sent: past --max-concurrency */
    int32_t *ids;
    int64_t n_ids, max_new, cached;
    int rank, ok;
} sim_req;

static void usage(FILE *f)
{
    fprintf(
        f, "usage: moeserve simulate [flags]   (DP admission policies on a synthetic workload)\n"
           "  --dp N                         attention-DP ranks (default 2)\n"
           "  --load-balance-method M        round_robin (default), total_requests, total_tokens,\n"
           "                                 vllm, cache_aware, cost; --compare runs every one\n"
           "  --cache-threshold F --balance-abs-threshold N --balance-rel-threshold F\n"
           "  --max-tree-size N              as `serve`\n"
           "workload (as `bench`):\n"
           "  --dataset-name generated-shared-prefix|random   (default generated-shared-prefix)\n"
           "  --gsp-num-groups N (16) --gsp-prompts-per-group N (16) --gsp-system-prompt-len N\n"
           "  (2048) --gsp-question-len N (128) --gsp-output-len N (256)\n"
           "  --num-prompts N (256) --random-input-len N (1024) --random-output-len N (256)\n"
           "  --random-range-ratio R (0)\n"
           "  --request-rate R               Poisson arrivals per second; inf = all at once\n"
           "  --max-concurrency N            at most N requests in flight (TTFT from sending)\n"
           "  --seed N                       (default 1)\n"
           "each rank:\n"
           "  --max-total-tokens N (65536) --page-size N (16) --max-running-requests N (64)\n"
           "  --chunked-prefill-size N (2048) --schedule-policy fcfs|lpm\n"
           "step time (defaults: small-v3 on this project's 2-core benchmark machine):\n"
           "  --step-ms F (4.5)  --decode-row-ms F (1.15)  --prefill-token-ms F (0.7)\n"
           "output: --json (one JSON object per policy)\n");
}

struct lflag {
    const char *name;
    long lo, hi;
    long *dst;
};
struct dflag {
    const char *name;
    double lo, hi;
    double *dst;
};

/* The entry of table t (items of `size` bytes, ending with a NULL name) named flag, or NULL. */
static const void *find_flag(const void *t, const char *flag, size_t size)
{
    for (const char *p = t; *(const char *const *)p; p += size)
        if (!strcmp(*(const char *const *)p, flag)) return p;
    return NULL;
}

static int parse(sim_opts *o, int argc, char **argv, int *help, ms_errbuf *err)
{
    *o = (sim_opts){.dp = 2,
                    .seed = 1,
                    .page_size = 16,
                    .max_running = 64,
                    .groups = 16,
                    .per_group = 16,
                    .sys_len = 2048,
                    .q_len = 128,
                    .out_len = 256,
                    .num_prompts = 256,
                    .in_len = 1024,
                    .rand_out_len = 256,
                    .pool_tokens = 65536,
                    .chunk = 2048,
                    .rate = INFINITY,
                    .step_ms = 4.5,
                    .row_ms = 1.15,
                    .prefill_ms = 0.7,
                    .gsp = 1};
    ms_router_opts_init(&o->router);
    const struct lflag lflags[] = {{"--dp", 1, SIM_MAX_DP, &o->dp},
                                   {"--seed", 0, 0x7fffffffL, &o->seed},
                                   {"--page-size", 1, 1024, &o->page_size},
                                   {"--max-running-requests", 1, 4096, &o->max_running},
                                   {"--max-total-tokens", 64, 1L << 30, &o->pool_tokens},
                                   {"--chunked-prefill-size", 1, 1L << 24, &o->chunk},
                                   {"--gsp-num-groups", 1, 100000, &o->groups},
                                   {"--gsp-prompts-per-group", 1, 100000, &o->per_group},
                                   {"--gsp-system-prompt-len", 0, 1L << 20, &o->sys_len},
                                   {"--gsp-question-len", 1, 1L << 20, &o->q_len},
                                   {"--gsp-output-len", 1, 1L << 20, &o->out_len},
                                   {"--num-prompts", 1, SIM_MAX_REQS, &o->num_prompts},
                                   {"--max-concurrency", 1, SIM_MAX_REQS, &o->max_conc},
                                   {"--random-input-len", 1, 1L << 20, &o->in_len},
                                   {"--random-output-len", 1, 1L << 20, &o->rand_out_len},
                                   {NULL, 0, 0, NULL}};
    const struct dflag dflags[] = {{"--random-range-ratio", 0, 1, &o->range_ratio},
                                   {"--step-ms", 0, 1e6, &o->step_ms},
                                   {"--decode-row-ms", 0, 1e6, &o->row_ms},
                                   {"--prefill-token-ms", 0, 1e6, &o->prefill_ms},
                                   {NULL, 0, 0, NULL}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = 1;
            return 0;
        }
        if (!strcmp(a, "--compare")) {
            o->compare = 1;
            continue;
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (i + 1 >= argc) return ms_err(err, MS_EINVAL, "%s needs a value", a);
        const char *v = argv[++i];
        int rr = ms_router_parse_flag(&o->router, a, v, err);
        if (rr < 0) return rr;
        if (rr > 0) continue;
        const struct lflag *lf = find_flag(lflags, a, sizeof *lf);
        const struct dflag *df = find_flag(dflags, a, sizeof *df);
        int rc = 0;
        if (lf) {
            rc = ms_parse_long(a, v, lf->lo, lf->hi, lf->dst, err);
        } else if (df) {
            rc = ms_parse_double(a, v, df->lo, df->hi, df->dst, err);
        } else if (!strcmp(a, "--dataset-name")) {
            if (!strcmp(v, "random"))
                o->gsp = 0;
            else if (!strcmp(v, "generated-shared-prefix"))
                o->gsp = 1;
            else
                return ms_err(err, MS_EINVAL,
                              "--dataset-name '%s': expected random or "
                              "generated-shared-prefix",
                              v);
        } else if (!strcmp(a, "--schedule-policy")) {
            if (!strcmp(v, "lpm"))
                o->lpm = 1;
            else if (!strcmp(v, "fcfs"))
                o->lpm = 0;
            else
                return ms_err(err, MS_EINVAL, "--schedule-policy '%s': expected fcfs or lpm", v);
        } else if (!strcmp(a, "--request-rate")) {
            if (!strcmp(v, "inf"))
                o->rate = INFINITY;
            else
                rc = ms_parse_double(a, v, 1e-6, 1e9, &o->rate, err);
        } else {
            return ms_err(err, MS_EINVAL, "unknown flag %s (moeserve simulate --help)", a);
        }
        if (rc) return rc;
    }
    int64_t n = o->gsp ? (int64_t)o->groups * o->per_group : o->num_prompts;
    int64_t len = o->gsp ? o->sys_len + o->q_len : o->in_len;
    if (n > SIM_MAX_REQS || n * len > SIM_MAX_TOKENS)
        return ms_err(err, MS_EINVAL,
                      "the workload has %lld prompts of up to %lld tokens: at "
                      "most %d prompts and %lld prompt tokens",
                      (long long)n, (long long)len, SIM_MAX_REQS, (long long)SIM_MAX_TOKENS);
    return 0;
}

/* The workload: prompts of random token ids (shared system prompts per group
 * for gsp, shuffled as SGLang's generator does) and Poisson arrivals. */
static int make_workload(const sim_opts *o, sim_req **out, int64_t *n_out, int32_t **pool_out)
{
    uint64_t rng = (uint64_t)o->seed * 0x9e3779b97f4a7c15ull + 1;
    int64_t n = o->gsp ? o->groups * o->per_group : o->num_prompts;
    int64_t max_in = o->gsp ? o->sys_len + o->q_len : o->in_len;
    sim_req *r = calloc((size_t)n, sizeof *r);
    int32_t *tok =
        malloc(sizeof(int32_t) * (size_t)(n * max_in + (o->gsp ? o->groups * o->sys_len : 0)));
    if (!r || !tok) {
        free(r);
        free(tok);
        return MS_ENOMEM;
    }
    int32_t *sys = tok + n * max_in;
    if (o->gsp)
        for (int64_t i = 0; i < o->groups * o->sys_len; i++)
            sys[i] = 1 + (int32_t)(ms_rng_next(&rng) % (SIM_VOCAB - 1));
    for (int64_t i = 0; i < n; i++) {
        r[i].ids = tok + i * max_in;
        if (o->gsp) {
            int64_t g = i / o->per_group;
            memcpy(r[i].ids, sys + g * o->sys_len, sizeof(int32_t) * (size_t)o->sys_len);
            for (int64_t j = 0; j < o->q_len; j++)
                r[i].ids[o->sys_len + j] = 1 + (int32_t)(ms_rng_next(&rng) % (SIM_VOCAB - 1));
            r[i].n_ids = max_in;
            r[i].max_new = o->out_len;
        } else { /* lengths uniform in [max(floor(len * ratio), 1), len], as bench */
            int64_t lo = MS_MAX((int64_t)floor(o->in_len * o->range_ratio), 1);
            int64_t lo2 = MS_MAX((int64_t)floor(o->rand_out_len * o->range_ratio), 1);
            r[i].n_ids = lo + (int64_t)(ms_rng_next(&rng) % (uint64_t)(o->in_len - lo + 1));
            r[i].max_new =
                lo2 + (int64_t)(ms_rng_next(&rng) % (uint64_t)(o->rand_out_len - lo2 + 1));
            for (int64_t j = 0; j < r[i].n_ids; j++)
                r[i].ids[j] = 1 + (int32_t)(ms_rng_next(&rng) % (SIM_VOCAB - 1));
        }
    }
    for (int64_t i = n - 1; i > 0; i--) { /* shuffle (Fisher-Yates) */
        int64_t j = (int64_t)(ms_rng_next(&rng) % (uint64_t)(i + 1));
        sim_req t = r[i];
        r[i] = r[j];
        r[j] = t;
    }
    double t = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(o->rate)) t += -log(1.0 - ms_rng_uniform(&rng)) / o->rate;
        r[i].arrival_s = isfinite(o->rate) ? t : 0;
    }
    *out = r;
    *n_out = n;
    *pool_out = tok;
    return 0;
}

typedef struct sim_result {
    int64_t completed, failed, prompt_tokens, cached_tokens, computed_max, computed_sum, out_tokens;
    double duration_s, ttft_mean_ms, ttft_p99_ms, e2e_mean_s, idle_share;
} sim_result;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs the workload through n_dp schedulers behind the router with `policy`. */
static int simulate(const sim_opts *o, int policy, sim_req *req, int64_t n_req, sim_result *res,
                    ms_errbuf *err)
{
    int n_dp = (int)o->dp, rc = 0;
    ms_kv_cache **pool = calloc((size_t)n_dp, sizeof *pool);
    ms_sched **sch = calloc((size_t)n_dp, sizeof *sch);
    ms_router_load *load = calloc((size_t)n_dp, sizeof *load);
    int64_t *computed = calloc((size_t)n_dp, sizeof *computed);
    double *ttft = malloc(sizeof(double) * (size_t)n_req);
    ms_router *router = NULL;
    ms_sample *sampler = NULL;
    ms_sample_pick *picks = calloc((size_t)o->max_running + 1, sizeof *picks);
    ms_router_opts ro = o->router;
    ro.policy = policy;
    memset(res, 0, sizeof *res);
    if (!pool || !sch || !load || !computed || !ttft || !picks ||
        ms_sample_new(&sampler, SIM_VOCAB, err)) {
        rc = ms_err(err, MS_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = ms_router_new(&router, n_dp, &ro))) {
        rc = ms_err(err, rc, "router options out of range");
        goto out;
    }
    int64_t pages = (o->pool_tokens + o->page_size - 1) / o->page_size;
    ms_sched_params sp = {.page_size = (int)o->page_size,
                          .max_running = (int)o->max_running,
                          .chunk_tokens = o->chunk,
                          .policy = o->lpm ? MS_SCHED_LPM : MS_SCHED_FCFS,
                          .context_len = 1L << 30,
                          .vocab = SIM_VOCAB,
                          .eos_id = -1};
    /* one stream of one value per token: the simulation needs only its pages */
    static ms_kv_spec spec;
    ms_kv_spec_init(&spec, 1);
    ms_kv_stream_cover(ms_kv_spec_add(&spec, "sim", 4, 1, MS_DT_F32, 1, 0, 0), 0);
    int32_t np[MS_KV_MAX_STREAMS] = {(int32_t)MS_MIN(pages, (int64_t)INT32_MAX - 1)};
    for (int r = 0; r < n_dp; r++)
        if ((rc = ms_kv_cache_new(&pool[r], &spec, (int)o->page_size, np, MS_DT_F32, 0, err)) ||
            (rc = ms_sched_new(&sch[r], &sp, pool[r], err)))
            goto out;
    for (int64_t i = 0; i < n_req; i++) req[i].first_s = req[i].done_s = -1, req[i].ok = 0;
    double t = 0, idle = 0, busy = 0, slot_s = 0; /* slot_s: when a slot last freed */
    int64_t next = 0, done = 0, inflight = 0, maxc = o->max_conc > 0 ? o->max_conc : n_req;
    while (done < n_req) {
        for (; next < n_req && req[next].arrival_s <= t && inflight < maxc; next++) {
            sim_req *q = &req[next];
            q->sent_s = MS_MAX(q->arrival_s, slot_s);
            inflight++;
            q->rank = ms_router_pick(router, q->ids, q->n_ids, q->max_new, -1);
            ms_req_params in = {.id = (uint64_t)next,
                                .ids = q->ids,
                                .n_ids = q->n_ids,
                                .max_new = q->max_new,
                                .ignore_eos = 1,
                                .top_logprobs = -1,
                                .samp = {.temperature = 0, .top_p = 1}};
            ms_errbuf e2;
            if (ms_sched_add(sch[q->rank], &in, &e2)) { /* never fits this rank: a failure */
                ms_router_finish(router, q->rank);
                inflight--;
                done++;
            }
        }
        double dt = 0, cost[SIM_MAX_DP];
        int any = 0;
        for (int r = 0; r < n_dp; r++) {
            const ms_batch_seq *b;
            int nb = ms_sched_build(sch[r], &b);
            int64_t dec = 0, pre = 0;
            for (int i = 0; i < nb; i++) {
                if (b[i].logits) { /* the fake forward: token 7 always */
                    memset(b[i].logits, 0, sizeof(float) * SIM_VOCAB);
                    b[i].logits[7] = 1;
                }
                if (b[i].n_tokens == 1 && b[i].start_pos > 0)
                    dec++;
                else
                    pre += b[i].n_tokens;
            }
            computed[r] += dec + pre;
            cost[r] =
                nb ? (o->step_ms + o->row_ms * (double)dec + o->prefill_ms * (double)pre) / 1e3 : 0;
            any |= nb > 0;
            if (cost[r] > dt) dt = cost[r];
        }
        if (!any) { /* nothing runs: jump to the next arrival */
            for (int r = 0; r < n_dp; r++)
                ms_sched_commit(sch[r], NULL, &(const ms_sched_event *){0});
            if (next >= n_req || inflight >= maxc) break; /* stuck: counted as failed */
            t = MS_MAX(t, req[next].arrival_s);
            continue;
        }
        t += dt;
        for (int r = 0; r < n_dp; r++) {
            idle += dt - cost[r];
            busy += dt;
            const ms_sched_event *ev;
            const ms_sample_seq *ss;
            int ns = ms_sched_to_sample(sch[r], &ss);
            ms_sample_batch(sampler, ss, ns, picks);
            int ne = ms_sched_commit(sch[r], picks, &ev);
            for (int i = 0; i < ne; i++) {
                sim_req *q = &req[ev[i].id];
                if (ev[i].token >= 0) res->out_tokens++;
                if (q->first_s < 0 && ev[i].token >= 0) q->first_s = t;
                if (ev[i].finish != MS_FINISH_NONE) {
                    q->done_s = t;
                    q->ok = ev[i].finish == MS_FINISH_LENGTH;
                    q->cached = ev[i].cached_tokens;
                    ms_router_finish(router, r);
                    if (inflight-- == maxc) slot_s = t;
                    done++;
                }
            }
            ms_sched_stats st;
            ms_sched_get_stats(sch[r], &st);
            load[r] = (ms_router_load){st.n_running,
                                       st.n_waiting,
                                       st.used_tokens,
                                       st.total_tokens,
                                       st.queued_prefill_tokens,
                                       st.decode_tokens_left};
        }
        ms_router_update(router, load);
    }
    int64_t n_ttft = 0;
    double e2e = 0;
    for (int64_t i = 0; i < n_req; i++) {
        if (!req[i].ok) continue;
        res->completed++;
        res->prompt_tokens += req[i].n_ids;
        res->cached_tokens += req[i].cached;
        ttft[n_ttft++] = (req[i].first_s - req[i].sent_s) * 1e3;
        e2e += req[i].done_s - req[i].sent_s;
    }
    res->failed = n_req - res->completed;
    qsort(ttft, (size_t)n_ttft, sizeof *ttft, cmp_double);
    for (int64_t i = 0; i < n_ttft; i++) res->ttft_mean_ms += ttft[i] / (double)n_ttft;
    res->ttft_p99_ms =
        n_ttft ? ttft[MS_MIN(n_ttft - 1, (int64_t)ceil(0.99 * (double)n_ttft) - 1)] : 0;
    res->e2e_mean_s = n_ttft ? e2e / (double)n_ttft : 0;
    res->duration_s = t - (n_req ? req[0].arrival_s : 0);
    res->idle_share = busy > 0 ? idle / busy : 0;
    for (int r = 0; r < n_dp; r++) {
        res->computed_sum += computed[r];
        res->computed_max = MS_MAX(res->computed_max, computed[r]);
    }
out:
    for (int r = 0; pool && sch && r < n_dp; r++) {
        ms_sched_free(sch[r]);
        ms_kv_cache_free(pool[r]);
    }
    ms_router_free(router);
    ms_sample_free(sampler);
    free(picks);
    free(pool);
    free(sch);
    free(load);
    free(computed);
    free(ttft);
    return rc;
}

static void print_row(const sim_opts *o, int policy, const sim_result *r)
{
    double hit = r->prompt_tokens ? (double)r->cached_tokens / (double)r->prompt_tokens : 0;
    double share =
        r->computed_sum ? (double)r->computed_max * (double)o->dp / (double)r->computed_sum : 0;
    double rps = r->duration_s > 0 ? (double)r->completed / r->duration_s : 0;
    double tps = r->duration_s > 0 ? (double)r->out_tokens / r->duration_s : 0;
    if (o->json) {
        printf("{\"policy\": \"%s\", \"dp\": %ld, \"completed\": %lld, \"failed\": %lld, "
               "\"duration_s\": %.3f, \"request_throughput\": %.4f, \"output_throughput\": %.2f, "
               "\"mean_ttft_ms\": %.2f, \"p99_ttft_ms\": %.2f, \"mean_e2e_latency_s\": %.4f, "
               "\"cache_hit_rate\": %.4f, \"busiest_rank_share\": %.4f, \"lockstep_idle\": %.4f}\n",
               ms_lb_name(policy), o->dp, (long long)r->completed, (long long)r->failed,
               r->duration_s, rps, tps, r->ttft_mean_ms, r->ttft_p99_ms, r->e2e_mean_s, hit, share,
               r->idle_share);
    } else {
        printf("%-15s %6lld %6lld %9.1f %8.3f %9.1f %10.0f %10.0f %6.3f %8.2f %6.1f%%\n",
               ms_lb_name(policy), (long long)r->completed, (long long)r->failed, r->duration_s,
               rps, tps, r->ttft_mean_ms, r->ttft_p99_ms, hit, share, 100 * r->idle_share);
    }
}

int ms_cmd_simulate(int argc, char **argv)
{
    sim_opts o;
    ms_errbuf err = {{0}};
    int help = 0;
    if (parse(&o, argc, argv, &help, &err)) {
        fprintf(stderr, "simulate: %s\n", err.msg);
        return 2;
    }
    if (help) {
        usage(stdout);
        return 0;
    }
    sim_req *req = NULL;
    int32_t *tok = NULL;
    int64_t n = 0;
    if (make_workload(&o, &req, &n, &tok)) {
        fprintf(stderr, "simulate: out of memory (workload)\n");
        return 1;
    }
    if (!o.json)
        printf("# dp=%ld %s, step %.3g ms + %.3g ms per decode row + %.3g ms per prefill token, "
               "lockstep\n%-15s %6s %6s %9s %8s %9s %10s %10s %6s %8s %7s\n",
               o.dp, o.gsp ? "generated-shared-prefix" : "random", o.step_ms, o.row_ms,
               o.prefill_ms, "policy", "done", "failed", "time_s", "req/s", "out_tok/s", "ttft_ms",
               "p99_ttft", "hit", "busiest", "idle");
    int rc = 0;
    for (int p = 0; p <= MS_LB_COST; p++) {
        if (!o.compare && p != o.router.policy) continue;
        sim_result res;
        if ((rc = simulate(&o, p, req, n, &res, &err))) {
            fprintf(stderr, "simulate: %s\n", err.msg);
            break;
        }
        print_row(&o, p, &res);
    }
    free(req);
    free(tok);
    return rc ? 1 : 0;
}
