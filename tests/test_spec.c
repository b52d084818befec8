/* test_spec.c — speculative decoding's verify, accept and rollback, driven by a
 * test-only draft source: a fake target whose greedy continuation is known
 * ((last + 1) mod V at every position, history checked through a shadow of
 * the KV pages, as in test_scheduler.c) and drafts that propose that
 * continuation with chosen mistakes.  Also the target-only rejection rule
 * (ms_sampler_verify) against the target distribution by chi-square, with a
 * wrong rule shown to fail the same test. */
#include "harness.h"
#include "base/util.h"
#include "serve/scheduler.h"

#include <stdlib.h>
#include <string.h>

#define VOCAB 64
#define PS    4
#define S_MAX 4

static int32_t *shadow;

/* Writes the tokens to the shadow pages, checks the history, and gives every
 * logit row the target's next token (last + 1) % VOCAB. */
static int fake_forward(const ms_batch_seq *b, int n)
{
    for (int i = 0; i < n; i++) {
        for (int32_t j = 0; j < b[i].n_tokens; j++) {
            int64_t pos = b[i].start_pos + j;
            shadow[b[i].kv->pages[0][pos / PS] * PS + pos % PS] = b[i].tokens[j];
        }
        int64_t end = b[i].start_pos + b[i].n_tokens;
        for (int64_t pos = b[i].start_pos; pos < end; pos++)
            if (shadow[b[i].kv->pages[0][pos / PS] * PS + pos % PS] !=
                b[i].tokens[pos - b[i].start_pos])
                return -1;
        if (!b[i].logits) continue;
        int nl = b[i].n_logits > 0 ? b[i].n_logits : 1;
        for (int r = 0; r < nl; r++) {
            float *lg = b[i].logits + (int64_t)r * VOCAB;
            memset(lg, 0, sizeof(float) * VOCAB);
            lg[(b[i].tokens[b[i].n_tokens - nl + r] + 1) % VOCAB] = 5.0f;
        }
    }
    return 0;
}

struct out {
    int32_t toks[256];
    int n, finish;
};

static ms_kv_cache *pool;
static int n_verify_steps, n_bad_pages;

/* Draft mistakes: verify v of a request puts a wrong token at draft index
 * mistake_at(v) (S_MAX or more: none). */
static int mistake_at(int v)
{
    return (v * 5 + 1) % (S_MAX + 2);
}

static int run(ms_sched *s, struct out *outs, int n_req, int S, int *steps)
{
    static ms_sample *sm;
    static ms_sample_pick picks[64 * (S_MAX + 1)];
    static int vcount[16];
    ms_errbuf err;
    if (!sm && ms_sample_new(&sm, VOCAB, &err)) return -1;
    for (int step = 0; step < 1000; step++) {
        const ms_batch_seq *b;
        int n = ms_sched_build(s, &b);
        for (int i = 0; i < n; i++) n_verify_steps += b[i].kind == MS_SEQ_VERIFY;
        if (n > 0 && fake_forward(b, n)) return -1;
        const ms_sample_seq *ss;
        int ns = ms_sched_to_sample(s, &ss);
        ms_sample_batch(sm, ss, ns, picks);
        const ms_sched_event *ev;
        int ne = ms_sched_commit(s, picks, &ev);
        for (int i = 0; i < ne; i++) {
            struct out *o = &outs[ev[i].id];
            if ((int)ev[i].id >= n_req) return -2;
            if (ev[i].token >= 0) o->toks[o->n++] = ev[i].token;
            if (ev[i].finish) o->finish = ev[i].finish;
        }
        /* the test's draft source: the target's own continuation, with mistakes */
        ms_sched_draft *jobs;
        int nj = ms_sched_drafts(s, &jobs);
        for (int j = 0; j < nj; j++) {
            const ms_batch_seq *q = &jobs[j].seq;
            /* rollback: the pages cover exactly the accepted tokens + the next one */
            int64_t n_kv = q->start_pos + q->n_tokens;
            int64_t need = jobs[j].want > 1 ? n_kv + jobs[j].want - 1 : n_kv + 1;
            if (jobs[j].want > 0 && q->kv->n_pages[0] > (MS_MAX(need, n_kv + 1) + PS - 1) / PS)
                n_bad_pages++;
            int32_t d[S_MAX], last = q->tokens[q->n_tokens - 1];
            int v = vcount[jobs[j].id % 16]++;
            for (int k = 0; k < jobs[j].want; k++) {
                last = (last + 1) % VOCAB;
                d[k] = k == mistake_at(v) ? (last + 3) % VOCAB : last;
            }
            ms_sched_set_draft(s, j, d, jobs[j].want);
        }
        (void)S;
        *steps = step + 1;
        if (!ms_sched_has_work(s)) return 0;
    }
    return -3;
}

static ms_sched *mk(int pages, int S)
{
    ms_errbuf e;
    static ms_kv_spec spec;
    ms_kv_spec_init(&spec, 1);
    ms_kv_stream_cover(ms_kv_spec_add(&spec, "kv", 4, 1, MS_DT_F32, 1, 0, 0), 0);
    int32_t np[MS_KV_MAX_STREAMS] = {pages};
    if (ms_kv_cache_new(&pool, &spec, PS, np, MS_DT_F32, 0, &e)) return NULL;
    free(shadow);
    shadow = calloc((size_t)pages * PS, sizeof *shadow);
    ms_sched_params p = {.page_size = PS,
                         .max_running = 8,
                         .chunk_tokens = 16,
                         .policy = MS_SCHED_FCFS,
                         .context_len = 1000,
                         .vocab = VOCAB,
                         .eos_id = -1,
                         .spec_steps = S,
                         .ngram_min = 1,
                         .ngram_max = 4};
    ms_sched *s;
    if (ms_sched_new(&s, &p, pool, &e)) return NULL;
    return s;
}

static void add(ms_sched *s, uint64_t id, int start, int len, int max_new, int32_t stop_id)
{
    int32_t ids[200];
    for (int i = 0; i < len; i++) ids[i] = (start + i * 7) % VOCAB;
    ms_req_params in = {.id = id, .ids = ids, .n_ids = len, .max_new = max_new, .top_logprobs = -1};
    if (stop_id >= 0) in.stop_ids[in.n_stop_ids++] = stop_id;
    ms_errbuf e;
    ms_sched_add(s, &in, &e);
}

/* The plain-decoding answer: the continuation, cut at the stop id (included). */
static int expect(const struct out *o, int start, int len, int max_new, int32_t stop_id)
{
    int32_t last = (start + (len - 1) * 7) % VOCAB;
    int n = 0;
    for (; n < max_new; n++) {
        last = (last + 1) % VOCAB;
        if (n >= o->n || o->toks[n] != last) return 0;
        if (last == stop_id) {
            n++;
            break;
        }
    }
    return o->n == n &&
           o->finish == (n < max_new || last == stop_id ? MS_FINISH_STOP : MS_FINISH_LENGTH);
}

TEST(verify_matches_plain_decoding_and_rolls_back)
{
    for (int S = 1; S <= S_MAX; S++) {
        ms_sched *s = mk(256, S);
        CHECK(s);
        int32_t n_free0 = ms_kv_cache_n_free(pool, 0);
        struct out outs[6];
        memset(outs, 0, sizeof outs);
        /* lengths chosen so max_tokens falls inside a would-be accepted run */
        for (int i = 0; i < 6; i++) add(s, (uint64_t)i, 3 * i + 1, 5 + 3 * i, 7 + 5 * i, -1);
        int steps;
        n_bad_pages = n_verify_steps = 0;
        CHECK(run(s, outs, 6, S, &steps) == 0);
        for (int i = 0; i < 6; i++)
            CHECKF(expect(&outs[i], 3 * i + 1, 5 + 3 * i, 7 + 5 * i, -1), "S %d req %d", S, i);
        CHECKF(n_bad_pages == 0, "S %d: %d draft jobs held pages beyond the accepted tokens", S,
               n_bad_pages);
        ms_sched_stats st;
        ms_sched_get_stats(s, &st);
        CHECK(st.spec_verify_total > 0 && st.spec_drafted_total > 0);
        CHECK(st.spec_accepted_total <= st.spec_drafted_total);
        CHECK(st.spec_accepted_total > 0 && st.spec_accepted_total < st.spec_drafted_total);
        /* every generated token: one per verify step plus each accepted draft (the
         * first of each request comes from its prefill) */
        CHECK(st.generated_tokens_total == 6 + st.spec_verify_total + st.spec_accepted_total);
        CHECK(ms_sched_flush_cache(s) == 0);
        CHECK(ms_kv_cache_n_free(pool, 0) == n_free0); /* every page back */
        ms_sched_free(s);
        ms_kv_cache_free(pool);
    }
}

TEST(stop_inside_an_accepted_run_ends_where_plain_does)
{
    ms_sched *s = mk(256, 3);
    CHECK(s);
    struct out outs[4];
    memset(outs, 0, sizeof outs);
    /* the stop id is the k-th token of the continuation, for k inside a run */
    for (int i = 0; i < 4; i++) {
        int32_t last = (2 * i + (6 - 1) * 7) % VOCAB;
        add(s, (uint64_t)i, 2 * i, 6, 30, (last + 3 + i) % VOCAB);
    }
    int steps;
    CHECK(run(s, outs, 4, 3, &steps) == 0);
    for (int i = 0; i < 4; i++) {
        int32_t last = (2 * i + (6 - 1) * 7) % VOCAB;
        CHECKF(expect(&outs[i], 2 * i, 6, 30, (last + 3 + i) % VOCAB), "req %d (%d tokens)", i,
               outs[i].n);
        CHECK(outs[i].n == 3 + i && outs[i].finish == MS_FINISH_STOP);
    }
    ms_sched_free(s);
    ms_kv_cache_free(pool);
}

/* ---- the rejection rule against the target distribution ---- */

/* The processed distribution of the toy logits (temperature t, top-k k). */
static void target_dist(const float *lg, int V, float t, int k, double *p)
{
    double mx = -1e30, sum = 0;
    for (int i = 0; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
    for (int i = 0; i < V; i++) p[i] = exp((lg[i] - mx) / t);
    for (int i = 0; i < V; i++) { /* top-k: keep the k largest */
        int better = 0;
        for (int j = 0; j < V; j++) better += p[j] > p[i] || (p[j] == p[i] && j < i);
        if (better >= k) p[i] = 0;
    }
    for (int i = 0; i < V; i++) sum += p[i];
    for (int i = 0; i < V; i++) p[i] /= sum;
}

static double chi2(const int *count, const double *p, int V, int N, int *dof)
{
    double c = 0;
    *dof = -1;
    for (int i = 0; i < V; i++)
        if (p[i] > 0) {
            double e = p[i] * N;
            c += (count[i] - e) * (count[i] - e) / e;
            (*dof)++;
        } else if (count[i] > 0) {
            c += 1e9; /* a token the target never picks */
        }
    return c;
}

TEST(rejection_rule_gives_the_target_distribution)
{
    enum { V = 8, N = 40000 };
    const float lg[V] = {2.0f, 1.5f, 1.2f, 0.3f, -0.5f, 0.9f, -2.0f, 0.1f};
    ms_sampler_params sp = {.temperature = 0.9f, .top_p = 1, .top_k = 6};
    double p[V];
    target_dist(lg, V, sp.temperature, sp.top_k, p);
    float prob[V];
    int32_t idx[V];
    ms_sampler_scratch sc = {prob, idx};
    /* drafts: a likely token, an unlikely one, one top-k drops */
    const int32_t drafts[3] = {0, 3, 6};
    for (int d = 0; d < 3; d++) {
        int count[V] = {0}, wrong[V] = {0};
        uint64_t rng = ms_sampler_seed(11 + (uint64_t)d);
        for (int n = 0; n < N; n++) {
            int acc;
            count[ms_sampler_verify(lg, V, &sp, &rng, &sc, drafts[d], &acc)]++;
            /* a wrong rule: on rejection, resample from p without removing the draft */
            int32_t t = ms_sampler_verify(lg, V, &sp, &rng, &sc, drafts[d], &acc);
            wrong[acc ? t : ms_sampler_pick(lg, V, &sp, &rng, &sc)]++;
        }
        int dof;
        double c = chi2(count, p, V, N, &dof), cw = chi2(wrong, p, V, N, &dof);
        /* 5 degrees of freedom: P(chi2 > 25) < 2e-4 */
        CHECKF(c < 25, "draft %d: chi2 %.1f over %d dof", drafts[d], c, dof);
        if (p[drafts[d]] > 0.05) CHECKF(cw > 25, "the wrong rule passed: chi2 %.1f", cw);
    }
    /* greedy: the argmax, accepted only when the draft is it */
    ms_sampler_params g = {.temperature = 0, .top_p = 1};
    uint64_t rng = 1;
    int acc;
    CHECK(ms_sampler_verify(lg, V, &g, &rng, &sc, 0, &acc) == 0 && acc);
    CHECK(ms_sampler_verify(lg, V, &g, &rng, &sc, 2, &acc) == 0 && !acc);
}

int main(void)
{
    RUN(verify_matches_plain_decoding_and_rolls_back);
    RUN(stop_inside_an_accepted_run_ends_where_plain_does);
    RUN(rejection_rule_gives_the_target_distribution);
    return TEST_REPORT();
}
