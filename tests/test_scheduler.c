/* test_scheduler.c — continuous batching, prefix sharing, chunked prefill,
 * retraction and abort, driven by a fake forward that "caches" token ids in a
 * shadow copy of the KV pages and checks every sequence reads back exactly its
 * own history (so wrong page tables or prefix sharing would be caught). */
#include "harness.h"
#include "serve/scheduler.h"

#include <stdlib.h>
#include <string.h>

#define VOCAB 64
#define PS    4

static int32_t *shadow; /* [n_pages][PS] token written at each slot */

/* Writes the batch's tokens to the shadow cache, verifies each sequence's
 * history, and sets logits to favour (last token + 1) % VOCAB. */
static int fake_forward(const ms_batch_seq *b, int n, int32_t *const *hist)
{
    for (int i = 0; i < n; i++) {
        for (int32_t j = 0; j < b[i].n_tokens; j++) {
            int64_t pos = b[i].start_pos + j;
            shadow[b[i].kv->pages[0][pos / PS] * PS + pos % PS] = b[i].tokens[j];
        }
        int64_t end = b[i].start_pos + b[i].n_tokens;
        for (int64_t pos = 0; pos < end; pos++)
            if (shadow[b[i].kv->pages[0][pos / PS] * PS + pos % PS] !=
                b[i].tokens[pos - b[i].start_pos])
                return -1; /* history mismatch */
        if (b[i].logits) {
            memset(b[i].logits, 0, sizeof(float) * VOCAB);
            b[i].logits[(b[i].tokens[b[i].n_tokens - 1] + 1) % VOCAB] = 5.0f;
        }
    }
    (void)hist;
    return 0;
}

/* What the engine does after a forward: serve/sample.c picks, the scheduler commits. */
static int commit(ms_sched *s, const ms_sched_event **ev)
{
    static ms_sample *sm;
    static ms_sample_pick picks[64];
    ms_errbuf err;
    if (!sm && ms_sample_new(&sm, VOCAB, &err)) return -1;
    const ms_sample_seq *ss;
    int n = ms_sched_to_sample(s, &ss);
    if (n > 64) return -1;
    ms_sample_batch(sm, ss, n, picks);
    return ms_sched_commit(s, picks, ev);
}

struct out {
    int32_t toks[256];
    int n, finish;
};

static int run(ms_sched *s, struct out *outs, int n_req, int max_steps, int *steps)
{
    for (int step = 0; step < max_steps; step++) {
        const ms_batch_seq *b;
        int n = ms_sched_build(s, &b);
        const ms_sched_event *ev;
        int ne;
        if (n > 0 && fake_forward(b, n, NULL)) return -1;
        ne = commit(s, &ev);
        for (int i = 0; i < ne; i++) {
            struct out *o = &outs[ev[i].id];
            if ((int)ev[i].id >= n_req) return -2;
            if (ev[i].token >= 0) o->toks[o->n++] = ev[i].token;
            if (ev[i].finish) o->finish = ev[i].finish;
        }
        *steps = step;
        if (!ms_sched_has_work(s)) return 0;
    }
    return -3;
}

static ms_sched *mk(ms_kv_cache **pool, int pages, int max_running, int chunk)
{
    ms_errbuf e;
    static ms_kv_spec spec; /* one stream, one value per token */
    ms_kv_spec_init(&spec, 1);
    ms_kv_stream_cover(ms_kv_spec_add(&spec, "kv", 4, 1, MS_DT_F32, 1, 0, 0), 0);
    int32_t np[MS_KV_MAX_STREAMS] = {pages};
    if (ms_kv_cache_new(pool, &spec, PS, np, MS_DT_F32, 0, &e)) return NULL;
    shadow = calloc((size_t)pages * PS, sizeof *shadow);
    ms_sched_params p = {.page_size = PS,
                         .max_running = max_running,
                         .chunk_tokens = chunk,
                         .policy = MS_SCHED_FCFS,
                         .context_len = 1000,
                         .vocab = VOCAB,
                         .eos_id = -1};
    ms_sched *s;
    if (ms_sched_new(&s, &p, *pool, &e)) return NULL;
    return s;
}

static void add(ms_sched *s, uint64_t id, int start, int len, int max_new)
{
    int32_t ids[200];
    for (int i = 0; i < len; i++) ids[i] = (start + i * 7) % VOCAB;
    ms_req_params in = {.id = id, .ids = ids, .n_ids = len, .max_new = max_new, .top_logprobs = -1};
    ms_errbuf e;
    ms_sched_add(s, &in, &e);
}

static int check_out(const struct out *o, int start, int len, int max_new)
{
    int32_t last = (start + (len - 1) * 7) % VOCAB;
    if (o->n != max_new || o->finish != MS_FINISH_LENGTH) return 0;
    for (int i = 0; i < o->n; i++) {
        last = (last + 1) % VOCAB;
        if (o->toks[i] != last) return 0;
    }
    return 1;
}

TEST(batches_complete_with_chunking_and_sharing)
{
    ms_kv_cache *pool;
    ms_sched *s = mk(&pool, 64, 8, 5);
    CHECK(s);
    struct out outs[6] = {0};
    for (int i = 0; i < 6; i++) add(s, (uint64_t)i, i % 2 ? 3 : 1, 9 + i, 6); /* shared starts */
    int steps;
    CHECK(run(s, outs, 6, 500, &steps) == 0);
    for (int i = 0; i < 6; i++) CHECKF(check_out(&outs[i], i % 2 ? 3 : 1, 9 + i, 6), "req %d", i);
    ms_sched_stats st;
    ms_sched_get_stats(s, &st);
    CHECK(st.cached_prompt_tokens_total > 0); /* later requests reused earlier prefixes */
    /* a repeat of request 0 hits the cache */
    struct out again[1] = {0};
    add(s, 0, 1, 9, 6);
    /* the load report counts only its uncached prompt tokens as queued, and its max_new */
    ms_sched_get_stats(s, &st);
    CHECK(st.n_waiting == 1 && st.decode_tokens_left == 6);
    CHECKF(st.queued_prefill_tokens >= 0 && st.queued_prefill_tokens < 9 - 1, "%lld",
           (long long)st.queued_prefill_tokens);
    CHECK(run(s, again, 1, 100, &steps) == 0);
    CHECK(check_out(&again[0], 1, 9, 6));
    CHECK(ms_sched_flush_cache(s) == 0);
    CHECK(ms_kv_cache_n_free(pool, 0) == 64);
    ms_sched_free(s);
    ms_kv_cache_free(pool);
    free(shadow);
}

/* A running request's prompt is in the prefix cache once its prefill is done:
 * a request with the same prompt admitted while the first still decodes
 * reuses its pages (SGLang caches unfinished requests the same way). */
TEST(running_prompt_is_shared)
{
    ms_kv_cache *pool;
    ms_sched *s = mk(&pool, 64, 8, 64);
    CHECK(s);
    struct out outs[2] = {0};
    add(s, 0, 1, 13, 20); /* 13 tokens: 3 whole pages of 4 */
    const ms_batch_seq *b;
    const ms_sched_event *ev;
    for (int step = 0; step < 3; step++) { /* the prefill, then two decode steps */
        int n = ms_sched_build(s, &b);
        CHECK(n == 1 && fake_forward(b, n, NULL) == 0);
        CHECK(b[0].kind == (step == 0 ? MS_SEQ_PREFILL : MS_SEQ_DECODE) && b[0].n_logits == 1);
        int ne = commit(s, &ev);
        for (int i = 0; i < ne; i++) outs[0].toks[outs[0].n++] = ev[i].token;
    }
    ms_sched_stats st;
    ms_sched_get_stats(s, &st);
    CHECK(st.n_running == 1 && st.cached_tokens == 12); /* its 3 prompt pages */
    add(s, 1, 1, 13, 20);
    int n = ms_sched_build(s, &b);
    CHECK(n == 2 && fake_forward(b, n, NULL) == 0);
    CHECK(b[1].start_pos == 12 && b[1].n_tokens == 1); /* only the last prompt token computed */
    int ne = commit(s, &ev);
    for (int i = 0; i < ne; i++) outs[ev[i].id].toks[outs[ev[i].id].n++] = ev[i].token;
    int steps;
    CHECK(run(s, outs, 2, 500, &steps) == 0);
    CHECK(check_out(&outs[0], 1, 13, 20) && check_out(&outs[1], 1, 13, 20));
    ms_sched_get_stats(s, &st);
    CHECK(st.cached_prompt_tokens_total == 12);
    CHECK(ms_sched_flush_cache(s) == 0);
    CHECK(ms_kv_cache_n_free(pool, 0) == 64);
    ms_sched_free(s);
    ms_kv_cache_free(pool);
    free(shadow);
}

TEST(pressure_retracts_and_nothing_is_lost)
{
    /* 10 requests of 8 + 24 tokens (8 pages each at most) in a 20-page pool */
    ms_kv_cache *pool;
    ms_sched *s = mk(&pool, 20, 10, 64);
    CHECK(s);
    struct out outs[10] = {0};
    for (int i = 0; i < 10; i++) add(s, (uint64_t)i, i * 5, 8, 24);
    int steps;
    CHECK(run(s, outs, 10, 5000, &steps) == 0);
    for (int i = 0; i < 10; i++) CHECKF(check_out(&outs[i], i * 5, 8, 24), "req %d", i);
    ms_sched_stats st;
    ms_sched_get_stats(s, &st);
    CHECK(st.n_retracted > 0);
    ms_sched_free(s);
    CHECK(ms_kv_cache_n_free(pool, 0) == 20);
    ms_kv_cache_free(pool);
    free(shadow);
}

TEST(abort_frees_pages_and_rejects_oversized)
{
    ms_kv_cache *pool;
    ms_sched *s = mk(&pool, 16, 4, 64);
    CHECK(s);
    add(s, 0, 0, 10, 20);
    add(s, 1, 0, 10, 20);
    const ms_batch_seq *b;
    int n = ms_sched_build(s, &b);
    CHECK(n == 2 && fake_forward(b, n, NULL) == 0);
    const ms_sched_event *ev;
    CHECK(commit(s, &ev) == 2);
    CHECK(ms_sched_abort(s, 0) == 0);
    CHECK(ms_sched_abort(s, 7) == MS_ENOENT);
    CHECK(ms_sched_take_pending(s, &ev) == 1 && ev[0].finish == MS_FINISH_ABORT);
    CHECK(ms_sched_abort(s, 1) == 0);
    CHECK(ms_sched_flush_cache(s) == 0);
    CHECK(ms_kv_cache_n_free(pool, 0) == 16);
    int32_t ids[70] = {0};
    ms_req_params big = {.id = 9, .ids = ids, .n_ids = 60, .max_new = 10, .top_logprobs = -1};
    ms_errbuf e;
    CHECK(ms_sched_add(s, &big, &e) == MS_ECONTEXT); /* 70 tokens > 64-token pool */
    ms_sched_free(s);
    ms_kv_cache_free(pool);
    free(shadow);
}

int main(void)
{
    RUN(batches_complete_with_chunking_and_sharing);
    RUN(running_prompt_is_shared);
    RUN(pressure_retracts_and_nothing_is_lost);
    RUN(abort_frees_pages_and_rejects_oversized);
    return TEST_REPORT();
}
