/* test_spec_v4.c — speculative decoding's verify, accept and rollback on a
 * real DeepSeek-V4 model (tiny-v4, --dtype float32: window 8, ratio-4 and
 * ratio-128 layers, compressor state per sequence), driven through the
 * scheduler by a test-only draft source: each request's greedy continuation
 * recorded from a plain run, proposed with chosen mistakes.  Prompts of 5,
 * 9, 126 and 139 tokens generate across the window and the 4- and
 * 128-token boundaries with rejected drafts among them; the tokens equal
 * plain decoding's, for S = 1..4; a stop id and max_tokens that fall inside
 * an accepted run end the request where plain decoding does; every draft
 * job holds pages only up to the accepted tokens + the next one, and after
 * the requests every page of every stream is back (pool counts). */
#include "harness.h"
#include "base/util.h"
#include "model/family.h"
#include "serve/scheduler.h"
#include "tools/mkmodel.h"

#include <stdlib.h>
#include <string.h>

enum { NR = 4, MAXN = 40, S_MAX = 4, PS = 16 };
static const int plen[NR] = {5, 9, 126, 139};
static ms_model *model;
static int64_t V;
static int32_t rec[NR][MAXN]; /* plain greedy continuations */
static int n_bad_pages;

struct out {
    int32_t toks[MAXN + S_MAX + 1];
    int n, finish;
};

static int mistake_at(int v)
{
    return (v * 5 + 1) % (S_MAX + 2);
}

static ms_sched *mk(ms_kv_cache **cache, int S)
{
    ms_errbuf e;
    static ms_kv_spec spec;
    ms_kv_spec_opts o = {.elem_bytes = 4, .act_bytes = 4, .page_size = PS, .attn_tp = 1};
    int32_t np[MS_KV_MAX_STREAMS];
    for (int s = 0; s < MS_KV_MAX_STREAMS; s++) np[s] = 128;
    if (ms_model_kv_spec(model, &o, &spec, &e) ||
        ms_kv_cache_new(cache, &spec, PS, np, MS_DT_F32, 8, &e)) {
        fprintf(stderr, "cache: %s\n", e.msg);
        return NULL;
    }
    ms_sched_params p = {.page_size = PS,
                         .max_running = 8,
                         .chunk_tokens = 64,
                         .policy = MS_SCHED_FCFS,
                         .context_len = 1000,
                         .vocab = V,
                         .eos_id = -1,
                         .spec_steps = S,
                         .ngram_min = 1,
                         .ngram_max = 4};
    ms_sched *s;
    if (ms_sched_new(&s, &p, *cache, &e)) return NULL;
    return s;
}

static void add(ms_sched *s, int i, int max_new, int32_t stop_id)
{
    int32_t ids[200];
    for (int j = 0; j < plen[i]; j++) ids[j] = (int32_t)((17 * i + 29 * j + 3) % 1000) + 2;
    ms_req_params in = {
        .id = (uint64_t)i, .ids = ids, .n_ids = plen[i], .max_new = max_new, .top_logprobs = -1};
    if (stop_id >= 0) in.stop_ids[in.n_stop_ids++] = stop_id;
    ms_errbuf e;
    CHECK(ms_sched_add(s, &in, &e) == 0);
}

/* Runs the scheduler to the end; drafts (when it asks for them) are the
 * recorded continuation with mistakes. */
static int run(ms_sched *s, const ms_kv_cache *cache, struct out *outs)
{
    static ms_sample *sm;
    static ms_sample_pick picks[8 * (S_MAX + 1)];
    int vcount[NR] = {0};
    ms_errbuf err;
    if (!sm && ms_sample_new(&sm, V, &err)) return -1;
    for (int step = 0; step < 2000; step++) {
        const ms_batch_seq *b;
        int n = ms_sched_build(s, &b);
        if (n > 0 && ms_model_forward(model, cache, b, n, &err)) {
            fprintf(stderr, "forward: %s\n", err.msg);
            return -1;
        }
        const ms_sample_seq *ss;
        int ns = ms_sched_to_sample(s, &ss);
        ms_sample_batch(sm, ss, ns, picks);
        const ms_sched_event *ev;
        int ne = ms_sched_commit(s, picks, &ev);
        for (int i = 0; i < ne; i++) {
            struct out *o = &outs[ev[i].id];
            if (ev[i].token >= 0 && o->n < MAXN + S_MAX) o->toks[o->n++] = ev[i].token;
            if (ev[i].finish) o->finish = ev[i].finish;
        }
        ms_sched_draft *jobs;
        int nj = ms_sched_drafts(s, &jobs);
        for (int j = 0; j < nj; j++) {
            const ms_batch_seq *q = &jobs[j].seq;
            int id = (int)jobs[j].id;
            int64_t n_kv = q->start_pos + q->n_tokens, n_out = n_kv + 1 - plen[id];
            int64_t need = MS_MAX(jobs[j].want > 1 ? n_kv + jobs[j].want - 1 : n_kv + 1, n_kv + 1);
            if (jobs[j].want > 0 && q->kv->n_tokens > need) n_bad_pages++;
            int32_t d[S_MAX];
            int v = vcount[id]++;
            for (int k = 0; k < jobs[j].want; k++) {
                int64_t at = MS_MIN(n_out + k, MAXN - 1);
                d[k] = k == mistake_at(v) ? (rec[id][at] + 3) % (int32_t)V : rec[id][at];
            }
            ms_sched_set_draft(s, j, d, jobs[j].want);
        }
        if (!ms_sched_has_work(s)) return 0;
    }
    return -3;
}

static int same_out(const struct out *a, const struct out *b)
{
    return a->n == b->n && a->finish == b->finish &&
           !memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n);
}

TEST(verify_matches_plain_decoding_and_rolls_back)
{
    CHECK(model != NULL);
    if (!model) return;
    ms_kv_cache *c;
    struct out plain[NR], outs[NR];
    memset(plain, 0, sizeof plain);
    ms_sched *s = mk(&c, 0);
    CHECK(s != NULL);
    if (!s) return;
    for (int i = 0; i < NR; i++) add(s, i, MAXN, -1);
    CHECK(run(s, c, plain) == 0);
    for (int i = 0; i < NR; i++) {
        CHECK(plain[i].n == MAXN);
        memcpy(rec[i], plain[i].toks, sizeof rec[i]);
    }
    ms_sched_free(s);
    ms_kv_cache_free(c);
    for (int S = 1; S <= S_MAX; S++) {
        memset(outs, 0, sizeof outs);
        s = mk(&c, S);
        CHECK(s != NULL);
        if (!s) return;
        int64_t free0 = ms_kv_cache_free_tokens(c);
        for (int i = 0; i < NR; i++) add(s, i, MAXN, -1);
        n_bad_pages = 0;
        CHECK(run(s, c, outs) == 0);
        for (int i = 0; i < NR; i++)
            CHECKF(same_out(&outs[i], &plain[i]), "S %d: request %d (prompt %d) differs", S, i,
                   plen[i]);
        ms_sched_stats st;
        ms_sched_get_stats(s, &st);
        CHECKF(st.spec_accepted_total > 0 && st.spec_accepted_total < st.spec_drafted_total,
               "S %d: accepted %lld of %lld", S, (long long)st.spec_accepted_total,
               (long long)st.spec_drafted_total);
        CHECKF(n_bad_pages == 0, "S %d: %d draft jobs held tokens past the accepted ones", S,
               n_bad_pages);
        CHECK(ms_sched_flush_cache(s) == 0);
        CHECKF(ms_kv_cache_free_tokens(c) == free0, "S %d: %lld tokens free after, %lld before", S,
               (long long)ms_kv_cache_free_tokens(c), (long long)free0);
        ms_sched_free(s);
        ms_kv_cache_free(c);
    }
}

TEST(stop_and_max_tokens_inside_an_accepted_run)
{
    CHECK(model != NULL);
    if (!model) return;
    for (int S = 1; S <= 3; S += 2) {
        struct out plain[NR], outs[NR];
        memset(plain, 0, sizeof plain), memset(outs, 0, sizeof outs);
        for (int pass = 0; pass < 2; pass++) {
            ms_kv_cache *c;
            ms_sched *s = mk(&c, pass ? S : 0);
            CHECK(s != NULL);
            if (!s) return;
            /* requests 0, 1: a stop id that is the continuation's 6th / 11th token;
             * requests 2, 3: max_tokens 7 and 13 */
            add(s, 0, MAXN, rec[0][5]);
            add(s, 1, MAXN, rec[1][10]);
            add(s, 2, 7, -1);
            add(s, 3, 13, -1);
            CHECK(run(s, c, pass ? outs : plain) == 0);
            ms_sched_free(s);
            ms_kv_cache_free(c);
        }
        for (int i = 0; i < NR; i++)
            CHECKF(same_out(&outs[i], &plain[i]),
                   "S %d: request %d: %d tokens (finish %d), plain "
                   "%d (finish %d)",
                   S, i, outs[i].n, outs[i].finish, plain[i].n, plain[i].finish);
        CHECK(plain[2].n == 7 && plain[3].n == 13 && plain[0].finish == MS_FINISH_STOP);
    }
}

int main(void)
{
    char dir[64];
    ms_errbuf err;
    snprintf(dir, sizeof dir, "/tmp/ms_spec_v4_XXXXXX");
    if (!mkdtemp(dir) || ms_mkmodel_v4_write("tiny-v4", MS_MK_FP32, 5, dir, 0, &err))
        fprintf(stderr, "cannot build tiny-v4\n");
    ms_model_opts mo = {.threads = 2, .exact = 1};
    if (ms_model_open(&model, dir, &mo, &err)) fprintf(stderr, "open: %s\n", err.msg), model = NULL;
    if (model) V = ms_model_shape_of(model)->vocab;
    RUN(verify_matches_plain_decoding_and_rolls_back);
    RUN(stop_and_max_tokens_inside_an_accepted_run);
    ms_model_free(model);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove the model\n");
    return TEST_REPORT();
}
