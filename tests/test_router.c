/* test_router.c — DP admission policies (serve/router.h) against the
 * semantics in reference/testing.md §2: the cache_aware threshold truth
 * table, the prefix tree (splits, partial matches, LRU eviction), vLLM's
 * score, total_requests / total_tokens with their optimistic bumps, the
 * cost model's trade of queue against cached prefix, and forced ranks. */
#include "serve/router.h"
#include "base/error.h"
#include "harness.h"

#include <stdlib.h>
#include <string.h>

static ms_router_opts opts(int policy)
{
    ms_router_opts o;
    ms_router_opts_init(&o);
    o.policy = policy;
    return o;
}

static ms_router *mk_opts(int n, const ms_router_opts *o)
{
    ms_router *r = NULL;
    return ms_router_new(&r, n, o) ? NULL : r;
}

static ms_router *mk(int n, int policy)
{
    ms_router_opts o = opts(policy);
    return mk_opts(n, &o);
}

/* Puts `count` requests in flight on rank (forced, so no policy runs). */
static void load_up(ms_router *r, int rank, int count)
{
    int32_t t = 1000000 + rank;
    for (int i = 0; i < count; i++) ms_router_pick(r, &t, 1, 1, rank);
}

TEST(parse_names)
{
    CHECK(ms_lb_parse("round_robin") == MS_LB_ROUND_ROBIN);
    CHECK(ms_lb_parse("shortest_queue") == MS_LB_TOTAL_REQUESTS);
    CHECK(ms_lb_parse("total_tokens") == MS_LB_TOTAL_TOKENS);
    CHECK(ms_lb_parse("vllm") == MS_LB_VLLM);
    CHECK(ms_lb_parse("cache_aware") == MS_LB_CACHE_AWARE);
    CHECK(ms_lb_parse("cost") == MS_LB_COST);
    CHECK(ms_lb_parse("minimum_tokens") == -1);
    CHECK(!strcmp(ms_lb_name(MS_LB_VLLM), "vllm"));
    ms_router_opts o;
    ms_router_opts_init(&o);
    ms_router *r = NULL;
    CHECK(ms_router_new(&r, 0, &o) == MS_EINVAL && !r);
    o.cache_threshold = -1;
    CHECK(ms_router_new(&r, 2, &o) == MS_EINVAL && !r);
}

TEST(round_robin_and_forced)
{
    ms_router *r = mk(3, MS_LB_ROUND_ROBIN);
    CHECK(r);
    int32_t t[2] = {5, 6};
    int got[6];
    for (int i = 0; i < 6; i++) got[i] = ms_router_pick(r, t, 2, 4, -1);
    CHECK(got[0] == 0 && got[1] == 1 && got[2] == 2 && got[3] == 0 && got[5] == 2);
    CHECK(ms_router_pick(r, t, 2, 4, 2) == 2); /* the hint wins */
    CHECK(ms_router_pick(r, t, 2, 4, 7) == 0); /* out of range: ignored, the counter goes on */
    CHECK(ms_router_inflight(r, 2) == 3);
    ms_router_finish(r, 2);
    ms_router_finish(r, 9); /* ignored */
    CHECK(ms_router_inflight(r, 2) == 2);
    ms_router_free(r);
}

TEST(total_requests_and_tokens)
{
    ms_router *r = mk(3, MS_LB_TOTAL_REQUESTS);
    CHECK(r);
    ms_router_load L[3] = {{.running = 2, .waiting = 1}, {.running = 1}, {.running = 1}};
    ms_router_update(r, L);
    int32_t t = 1;
    /* [3, 1, 1]: rank 1 (lowest index of the minimum), then the bump makes it 2 -> rank 2 */
    CHECK(ms_router_pick(r, &t, 1, 1, -1) == 1);
    CHECK(ms_router_pick(r, &t, 1, 1, -1) == 2);
    CHECK(ms_router_pick(r, &t, 1, 1, -1) == 1); /* [3, 2, 2] */
    ms_router_update(r, L);                      /* a fresh report forgets the bumps */
    CHECK(ms_router_pick(r, &t, 1, 1, -1) == 1);
    ms_router_free(r);

    r = mk(2, MS_LB_TOTAL_TOKENS);
    CHECK(r);
    ms_router_load T[2] = {{.running = 3, .used_tokens = 100}, {.running = 1, .used_tokens = 100}};
    ms_router_update(r, T);
    int32_t p[50] = {0};
    CHECK(ms_router_pick(r, p, 50, 1, -1) == 1); /* equal tokens: fewer requests */
    CHECK(ms_router_pick(r, p, 10, 1, -1) == 0); /* 100 < 150 */
    CHECK(ms_router_pick(r, p, 10, 1, -1) == 0); /* 110 < 150 */
    ms_router_free(r);
}

TEST(vllm_score)
{
    ms_router *r = mk(2, MS_LB_VLLM);
    CHECK(r);
    /* waiting [0, 1], running [5, 0]: scores [5, 4] -> engine 1 */
    ms_router_load L[2] = {{.running = 5, .waiting = 0}, {.running = 0, .waiting = 1}};
    ms_router_update(r, L);
    int32_t t = 1;
    CHECK(ms_router_pick(r, &t, 1, 1, -1) == 1);
    /* the optimistic +1 waiting makes engine 1 score 8: engine 0 next */
    CHECK(ms_router_pick(r, &t, 1, 1, -1) == 0);
    /* ties go to the first engine */
    ms_router_load E[2] = {{0}, {0}};
    ms_router_update(r, E);
    CHECK(ms_router_pick(r, &t, 1, 1, -1) == 0);
    CHECK(ms_router_pick(r, &t, 1, 1, -1) == 1);
    ms_router_free(r);
}

/* Which branch cache_aware takes for in-flight loads (lo on rank 0, hi on
 * rank 1) when rank 1 holds the whole prompt: 1 = affinity, 0 = least load. */
static int affinity_kept(int lo, int hi, int64_t abs_t, double rel_t)
{
    ms_router_opts o = opts(MS_LB_CACHE_AWARE);
    o.balance_abs_threshold = abs_t;
    o.balance_rel_threshold = rel_t;
    ms_router *r = mk_opts(2, &o);
    if (!r) return -1;
    int32_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ms_router_pick(r, p, 8, 1, 1); /* rank 1 holds p */
    ms_router_finish(r, 1);
    load_up(r, 0, lo);
    load_up(r, 1, hi);
    int got = ms_router_pick(r, p, 8, 1, -1);
    ms_router_free(r);
    return got == 1;
}

TEST(cache_aware_threshold_table)
{
    /* testing.md §2.2 with abs 64, rel 1.5 */
    CHECK(affinity_kept(0, 65, 64, 1.5) == 0);    /* 65 > 64 and 65 > 0: imbalanced */
    CHECK(affinity_kept(0, 64, 64, 1.5) == 1);    /* 64 is not > 64 */
    CHECK(affinity_kept(200, 265, 64, 1.5) == 1); /* 265 > 300 fails */
    CHECK(affinity_kept(100, 170, 64, 1.5) == 0); /* 70 > 64, 170 > 150 */
    /* boundaries: max - min == abs balanced, abs + 1 imbalanced; max == min × rel balanced */
    CHECK(affinity_kept(10, 14, 4, 1.0) == 1);
    CHECK(affinity_kept(10, 15, 4, 1.0) == 0);
    CHECK(affinity_kept(10, 20, 4, 2.0) == 1);
    CHECK(affinity_kept(10, 21, 4, 2.0) == 0);
}

TEST(cache_aware_tree)
{
    ms_router_opts o = opts(MS_LB_CACHE_AWARE);
    o.cache_threshold = 0.5;
    ms_router *r = mk_opts(3, &o);
    CHECK(r);
    /* "hello world" as tokens under rank 2 */
    int32_t hw[11] = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
    CHECK(ms_router_pick(r, hw, 11, 1, 2) == 2);
    ms_router_finish(r, 2);
    CHECK(ms_router_tree_tokens(r, 2) == 11);
    /* "hello worl": 10/10 -> rank 2 */
    CHECK(ms_router_prefix_hit(r, hw, 10, 2) == 10);
    CHECK(ms_router_pick(r, hw, 10, 1, -1) == 2);
    ms_router_finish(r, 2);
    /* "hello there": 6/11 = 0.545 > 0.5 -> rank 2 (the edge was split after "hello worl") */
    int32_t ht[11] = {'h', 'e', 'l', 'l', 'o', ' ', 't', 'h', 'e', 'r', 'e'};
    CHECK(ms_router_prefix_hit(r, ht, 11, 2) == 6);
    CHECK(ms_router_pick(r, ht, 11, 1, -1) == 2);
    ms_router_finish(r, 2);
    CHECK(ms_router_tree_tokens(r, 2) == 16); /* "hello " + "world"... shared, plus "there" */
    /* a miss goes to the least loaded rank (1: rank 0 has one in flight), not to the holder */
    int32_t other[4] = {7, 7, 7, 7};
    load_up(r, 0, 1);
    CHECK(ms_router_pick(r, other, 4, 1, -1) == 1);
    /* after that, rank 1 holds "7 7 7 7"; a longer prompt with that prefix follows it */
    int32_t more[6] = {7, 7, 7, 7, 8, 9};
    CHECK(ms_router_prefix_hit(r, more, 6, 1) == 4);
    CHECK(ms_router_pick(r, more, 6, 1, -1) == 1);
    /* both 1 and 2 hold "hello": the less loaded holder wins */
    int32_t hel[5] = {'h', 'e', 'l', 'l', 'o'};
    ms_router_pick(r, hel, 5, 1, 1);
    CHECK(ms_router_inflight(r, 1) == 3 && ms_router_inflight(r, 2) == 0);
    CHECK(ms_router_pick(r, hel, 5, 1, -1) == 2);
    ms_router_free(r);
}

TEST(tree_eviction_oldest_first)
{
    ms_router_opts o = opts(MS_LB_CACHE_AWARE);
    o.max_tree_tokens = 40;
    ms_router *r = mk_opts(2, &o);
    CHECK(r);
    int32_t p[5][10];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 10; j++) p[i][j] = 100 * i + j;
    for (int i = 0; i < 4; i++) ms_router_pick(r, p[i], 10, 1, 0);
    CHECK(ms_router_tree_tokens(r, 0) == 40);
    ms_router_pick(r, p[0], 10, 1, 0); /* touch the oldest: p[1] is now the LRU */
    ms_router_pick(r, p[4], 10, 1, 0); /* 50 > 40: evict down to 35 -> p[1] and p[2] go */
    CHECK(ms_router_tree_tokens(r, 0) == 30);
    CHECK(ms_router_prefix_hit(r, p[0], 10, 0) == 10);
    CHECK(ms_router_prefix_hit(r, p[1], 10, 0) == 0);
    CHECK(ms_router_prefix_hit(r, p[2], 10, 0) == 0);
    CHECK(ms_router_prefix_hit(r, p[3], 10, 0) == 10);
    CHECK(ms_router_prefix_hit(r, p[4], 10, 0) == 10);
    /* eviction is per rank: rank 1's copy of p[1] stays while rank 0 drops its own */
    ms_router_pick(r, p[1], 10, 1, 1);
    CHECK(ms_router_prefix_hit(r, p[1], 10, 1) == 10);
    /* a shared prefix split into a node with two kids: the leaves go before the stem */
    int32_t a[6] = {9, 9, 9, 1, 1, 1}, b[6] = {9, 9, 9, 2, 2, 2};
    ms_router_pick(r, a, 6, 1, 1);
    ms_router_pick(r, b, 6, 1, 1);
    CHECK(ms_router_tree_tokens(r, 1) == 10 + 6 + 3);
    ms_router_free(r);
}

/* Two ranks, rank 1 holding a 200-token prompt; the rank cost picks for it
 * again given rank 1's queue and decode backlog and rank 0's pool use. */
static int cost_pick(int64_t queued1, int64_t decode1, int64_t used0, int fresh)
{
    ms_router *r = mk(2, MS_LB_COST);
    if (!r) return -1;
    int32_t sys[200];
    for (int i = 0; i < 200; i++) sys[i] = (fresh ? 9000 : 3) + i;
    ms_router_load L[2] = {{.total_tokens = 100000}, {.total_tokens = 100000}};
    ms_router_update(r, L);
    int32_t held[200];
    for (int i = 0; i < 200; i++) held[i] = 3 + i;
    ms_router_pick(r, held, 200, 16, 1);
    L[1].queued_prefill_tokens = queued1;
    L[1].decode_tokens_left = decode1;
    L[0].used_tokens = used0;
    ms_router_update(r, L);
    int got = ms_router_pick(r, sys, 200, 16, -1);
    ms_router_free(r);
    return got;
}

TEST(cost_trades_queue_against_cache)
{
    CHECK(cost_pick(0, 0, 0, 0) == 1);   /* equal queues: the holder saves 200 prefill tokens */
    CHECK(cost_pick(150, 0, 0, 0) == 1); /* 150 tokens of queue cost less than 200 uncached */
    CHECK(cost_pick(250, 0, 0, 0) == 0); /* 250 outweigh the hit */
    CHECK(cost_pick(0, 250, 0, 0) == 0); /* so do 250 decode tokens still to come */
    CHECK(cost_pick(0, 0, 0, 1) == 0);   /* no hit anywhere: equal costs, first rank */
    /* cache pressure: rank 0's full pool would have to give back 216 tokens */
    CHECK(cost_pick(0, 0, 100000, 1) == 1);
    /* repeats sent before the next report charge the holder only their uncached tokens */
    ms_router *r = mk(2, MS_LB_COST);
    CHECK(r);
    ms_router_load L[2] = {{.total_tokens = 100000}, {.total_tokens = 100000}};
    ms_router_update(r, L);
    int32_t p[200];
    for (int i = 0; i < 200; i++) p[i] = 3 + i;
    CHECK(ms_router_pick(r, p, 200, 16, 1) == 1);
    ms_router_update(r, L); /* rank 1 has computed it (nothing queued) */
    CHECK(ms_router_pick(r, p, 200, 16, -1) == 1);
    CHECK(ms_router_pick(r, p, 200, 16, -1) == 1); /* charged 0 + 16, not 200 + 16 > 200 */
    ms_router_free(r);
}

TEST(many_ranks_and_big_tree)
{
    /* 130 ranks (three bit-set words); 2000 prompts sharing 8-token stems */
    ms_router_opts o = opts(MS_LB_CACHE_AWARE);
    o.cache_threshold = 0.99;
    o.max_tree_tokens = 100;
    ms_router *r = mk_opts(130, &o);
    CHECK(r);
    int32_t p[16];
    for (int i = 0; i < 2000; i++) {
        for (int j = 0; j < 16; j++) p[j] = j < 8 ? i % 17 : i * 31 + j;
        CHECK(ms_router_pick(r, p, 16, 1, i % 130) == i % 130);
        ms_router_finish(r, i % 130);
    }
    for (int i = 0; i < 130; i++) CHECK(ms_router_tree_tokens(r, i) <= 100);
    CHECK(ms_router_prefix_hit(r, p, 16, 1999 % 130) == 16); /* the newest stays */
    CHECK(ms_router_pick(r, p, 16, 1, 129) == 129);
    ms_router_finish(r, 129);
    int got = ms_router_pick(r, p, 16, 1, -1); /* 16/16 > 0.99: a holder, the first of equals */
    CHECK(got == 1999 % 130);
    ms_router_free(r);
}

TEST(deep_path_no_recursion)
{
    /* prompts 1, 1 2, 1 2 3, ...: every request adds one node below the last */
    enum { N = 10000 };
    ms_router_opts o = opts(MS_LB_CACHE_AWARE);
    o.max_tree_tokens = N - 100;
    ms_router *r = mk_opts(2, &o);
    CHECK(r);
    int32_t *p = malloc(sizeof(int32_t) * N);
    CHECK(p);
    for (int i = 0; i < N; i++) p[i] = i;
    for (int n = 1; n <= N; n++) ms_router_pick(r, p, n, 1, 1);
    /* past the limit the only leaf is the path's end: eviction trims the path from there */
    CHECK(ms_router_tree_tokens(r, 1) <= N - 100);
    CHECK(ms_router_prefix_hit(r, p, N, 1) == ms_router_tree_tokens(r, 1));
    free(p);
    ms_router_free(r); /* frees a path thousands of nodes deep */
}

/* The router's command-line flags, shared by serve and simulate: values in
 * range set the option, bad ones are MS_EINVAL naming the flag, other flags
 * are left alone. */
TEST(parse_flags)
{
    ms_router_opts o;
    ms_router_opts_init(&o);
    ms_errbuf e = {{0}};
    CHECK(ms_router_parse_flag(&o, "--load-balance-method", "shortest_queue", &e) == 1);
    CHECK(o.policy == MS_LB_TOTAL_REQUESTS);
    CHECK(ms_router_parse_flag(&o, "--cache-threshold", "0.5", &e) == 1 &&
          o.cache_threshold == 0.5);
    CHECK(ms_router_parse_flag(&o, "--balance-abs-threshold", "0", &e) == 1);
    CHECK(o.balance_abs_threshold == 0);
    CHECK(ms_router_parse_flag(&o, "--balance-rel-threshold", "2.5", &e) == 1);
    CHECK(o.balance_rel_threshold == 2.5);
    CHECK(ms_router_parse_flag(&o, "--max-tree-size", "4096", &e) == 1 &&
          o.max_tree_tokens == 4096);
    CHECK(ms_router_parse_flag(&o, "--dp", "2", &e) == 0);
    const char *bad[][2] = {{"--load-balance-method", "fastest"}, {"--cache-threshold", "1.5"},
                            {"--cache-threshold", "x"},           {"--balance-abs-threshold", "-1"},
                            {"--balance-rel-threshold", ""},      {"--max-tree-size", "0"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(ms_router_parse_flag(&o, bad[i][0], bad[i][1], &e) == MS_EINVAL);
        CHECK(strstr(e.msg, bad[i][0]) != NULL);
    }
    CHECK(o.policy == MS_LB_TOTAL_REQUESTS && o.max_tree_tokens == 4096); /* unchanged */
}

int main(void)
{
    RUN(parse_names);
    RUN(round_robin_and_forced);
    RUN(total_requests_and_tokens);
    RUN(vllm_score);
    RUN(cache_aware_threshold_table);
    RUN(cache_aware_tree);
    RUN(tree_eviction_oldest_first);
    RUN(cost_trades_queue_against_cache);
    RUN(many_ranks_and_big_tree);
    RUN(deep_path_no_recursion);
    RUN(parse_flags);
    return TEST_REPORT();
}
