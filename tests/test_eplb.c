/* test_eplb.c — DeepSeek's load balancer (parallel/eplb.h): the upstream README golden
 * (hierarchical), its global-policy variant, the preconditions, and testing.md §1's
 * property tests on seeded random loads. */
#include "harness.h"
#include "parallel/eplb.h"
#include "parallel/ep.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const float golden_w[2][12] = {{90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
                                      {20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27}};

/* log2phy[l][e] equals want[] as a set (want: n entries, -1 padded to maxcnt) */
static int same_set(const int32_t *got, const int *want, int maxcnt)
{
    int ng = 0, nw = 0;
    for (int i = 0; i < maxcnt; i++) ng += got[i] >= 0, nw += want[i] >= 0;
    if (ng != nw) return 0;
    for (int i = 0; i < maxcnt; i++) {
        if (want[i] < 0) continue;
        int found = 0;
        for (int j = 0; j < maxcnt; j++) found |= got[j] == want[i];
        if (!found) return 0;
    }
    return 1;
}

TEST(readme_golden_hierarchical)
{
    static const int phy[2][16] = {{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1},
                                   {7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}};
    static const int cnt[2][12] = {{1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1},
                                   {1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1}};
    static const int l2p[2][12][2] = {{{12, -1},
                                       {15, 13},
                                       {11, -1},
                                       {6, -1},
                                       {7, 5},
                                       {0, 2},
                                       {1, -1},
                                       {3, -1},
                                       {4, -1},
                                       {9, -1},
                                       {8, 10},
                                       {14, -1}},
                                      {{13, -1},
                                       {15, 11},
                                       {8, -1},
                                       {14, -1},
                                       {9, -1},
                                       {10, 12},
                                       {2, 4},
                                       {0, -1},
                                       {6, 3},
                                       {7, -1},
                                       {1, -1},
                                       {5, -1}}};
    ms_eplb_plan p;
    ms_errbuf err = {{0}};
    CHECKF(!ms_eplb_rebalance(&golden_w[0][0], 2, 12, 16, 4, 2, 8, MS_EPLB_AUTO, &p, &err), "%s",
           err.msg);
    CHECK(p.maxcnt == 2);
    for (int l = 0; l < 2; l++) {
        for (int s = 0; s < 16; s++) CHECKF(p.phy2log[l * 16 + s] == phy[l][s], "l%d s%d", l, s);
        for (int e = 0; e < 12; e++) {
            CHECK(p.logcnt[l * 12 + e] == cnt[l][e]);
            CHECKF(same_set(p.log2phy + (l * 12 + e) * 2, l2p[l][e], 2), "l%d e%d", l, e);
            /* upstream's replica-rank order: [0] is the original copy */
            CHECK(p.log2phy[(l * 12 + e) * 2] == l2p[l][e][0]);
        }
    }
    ms_eplb_plan_free(&p);
    /* the explicit policy gives the same */
    CHECK(!ms_eplb_rebalance(&golden_w[0][0], 2, 12, 16, 4, 2, 8, MS_EPLB_HIERARCHICAL, &p, &err));
    for (int s = 0; s < 16; s++) CHECK(p.phy2log[s] == phy[0][s]);
    ms_eplb_plan_free(&p);
}

static const int global_phy[2][16] = {{10, 6, 10, 7, 0, 2, 11, 4, 5, 9, 5, 4, 8, 3, 1, 1},
                                      {1, 10, 2, 4, 5, 11, 5, 0, 6, 7, 6, 3, 8, 8, 9, 7}};

TEST(global_policy_fallback)
{
    static const int cnt[2][12] = {{1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1},
                                   {1, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1}};
    static const int l2p[2][12][2] = {{{4, -1},
                                       {14, 15},
                                       {5, -1},
                                       {13, -1},
                                       {11, 7},
                                       {8, 10},
                                       {1, -1},
                                       {3, -1},
                                       {12, -1},
                                       {9, -1},
                                       {0, 2},
                                       {6, -1}},
                                      {{7, -1},
                                       {0, -1},
                                       {2, -1},
                                       {11, -1},
                                       {3, -1},
                                       {4, 6},
                                       {8, 10},
                                       {15, 9},
                                       {12, 13},
                                       {14, -1},
                                       {1, -1},
                                       {5, -1}}};
    ms_eplb_plan p;
    ms_errbuf err = {{0}};
    /* 3 groups over 2 nodes: auto falls back to the global policy */
    CHECKF(!ms_eplb_rebalance(&golden_w[0][0], 2, 12, 16, 3, 2, 8, MS_EPLB_AUTO, &p, &err), "%s",
           err.msg);
    for (int l = 0; l < 2; l++) {
        for (int s = 0; s < 16; s++)
            CHECKF(p.phy2log[l * 16 + s] == global_phy[l][s], "l%d s%d", l, s);
        for (int e = 0; e < 12; e++) {
            CHECK(p.logcnt[l * 12 + e] == cnt[l][e]);
            CHECKF(same_set(p.log2phy + (l * 12 + e) * 2, l2p[l][e], 2), "l%d e%d", l, e);
        }
    }
    ms_eplb_plan_free(&p);
    /* "deepseek" is the global policy whatever the groups */
    CHECK(!ms_eplb_rebalance(&golden_w[0][0], 2, 12, 16, 4, 2, 8, MS_EPLB_GLOBAL, &p, &err));
    for (int s = 0; s < 16; s++) CHECK(p.phy2log[s] == global_phy[0][s]);
    ms_eplb_plan_free(&p);
}

TEST(preconditions_refused)
{
    ms_eplb_plan p;
    ms_errbuf err = {{0}};
    const float *w = &golden_w[0][0];
    CHECK(ms_eplb_rebalance(w, 2, 12, 15, 4, 2, 8, MS_EPLB_AUTO, &p, &err) == MS_EINVAL);
    CHECK(strstr(err.msg, "divide over 8 GPUs"));
    CHECK(ms_eplb_rebalance(w, 2, 12, 8, 4, 2, 8, MS_EPLB_AUTO, &p, &err) == MS_EINVAL);
    CHECK(ms_eplb_rebalance(w, 2, 12, 16, 5, 1, 8, MS_EPLB_AUTO, &p, &err) == MS_EINVAL);
    CHECK(ms_eplb_rebalance(w, 2, 12, 16, 3, 2, 8, MS_EPLB_HIERARCHICAL, &p, &err) == MS_EINVAL);
    CHECK(strstr(err.msg, "deepseek_hierarchical"));
    CHECK(ms_eplb_rebalance(w, 2, 12, 18, 2, 2, 3, MS_EPLB_HIERARCHICAL, &p, &err) == MS_EINVAL);
    CHECK(ms_eplb_policy_parse("deepseek") == MS_EPLB_GLOBAL);
    CHECK(ms_eplb_policy_parse("deepseek_hierarchical") == MS_EPLB_HIERARCHICAL);
    CHECK(ms_eplb_policy_parse("auto") == MS_EPLB_AUTO);
    CHECK(ms_eplb_policy_parse("waterfill") == -1);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* testing.md §1 property list, on seeded random shapes and loads */
TEST(properties_random)
{
    ms_errbuf err = {{0}};
    for (int it = 0; it < 300; it++) {
        int N = 1 + (int)(next_u32() % 3), gpn = 1 + (int)(next_u32() % 3), gpus = N * gpn;
        int G = N * (1 + (int)(next_u32() % 3)), gsize = 1 + (int)(next_u32() % 4), E = G * gsize;
        int ppg = (E + gpus - 1) / gpus + (int)(next_u32() % 3), R = ppg * gpus, L = 3;
        float *w = malloc(sizeof(float) * (size_t)(L * E));
        for (int i = 0; i < L * E; i++)
            w[i] = it % 5 == 0 ? (float)(next_u32() % 4) : (float)(next_u32() % 100000) / 7.0f;
        for (int pol = MS_EPLB_GLOBAL; pol <= MS_EPLB_HIERARCHICAL; pol++) {
            ms_eplb_plan p, q;
            CHECKF(!ms_eplb_rebalance(w, L, E, R, G, N, gpus, pol, &p, &err), "%s", err.msg);
            CHECKF(
                !ms_eplb_rebalance(w, L, E, E - E % gpus == E ? E : R, G, N, gpus, pol, &q, &err),
                "%s", err.msg);
            for (int l = 0; l < L; l++) {
                const int32_t *row = p.phy2log + l * R, *cnt = p.logcnt + l * E;
                int sum = 0;
                for (int e = 0; e < E; e++) {
                    CHECK(cnt[e] >= 1);
                    sum += cnt[e];
                    int seen = 0;
                    for (int s = 0; s < R; s++) seen += row[s] == e;
                    CHECK(seen == cnt[e]);
                    /* log2phy agrees with phy2log; padding after the replicas */
                    for (int r = 0; r < p.maxcnt; r++) {
                        int s = p.log2phy[(l * E + e) * p.maxcnt + r];
                        CHECK((r < cnt[e]) == (s >= 0));
                        if (s >= 0) CHECK(row[s] == e && p.phyrank[l * R + s] == r);
                    }
                    if (pol == MS_EPLB_HIERARCHICAL) {
                        /* all replicas of e, and all of e's group, on one node */
                        int node = -1;
                        for (int s = 0; s < R; s++)
                            if (row[s] / gsize == e / gsize) {
                                int nd = s / (R / N);
                                CHECK(node < 0 || nd == node);
                                node = nd;
                            }
                    }
                }
                CHECK(sum == R);
                /* replication never raises the hottest per-replica load.  (The stronger
                 * "hottest GPU never worse than without replicas" does not hold for the
                 * greedy, upstream included: seed case E 8, R 12, G 4, N 2, 4 GPUs.) */
                double mx_w = 0, mx_rep = 0;
                for (int e = 0; e < E; e++) mx_w = w[l * E + e] > mx_w ? w[l * E + e] : mx_w;
                for (int s = 0; s < R; s++) {
                    double v = (double)w[l * E + row[s]] / cnt[row[s]];
                    mx_rep = v > mx_rep ? v : mx_rep;
                }
                CHECK(mx_rep <= mx_w);
                if (q.n_physical == E) CHECK(q.maxcnt == 1);
            }
            ms_eplb_plan_free(&p);
            ms_eplb_plan_free(&q);
        }
        free(w);
    }
}

TEST(equal_loads_no_replicas)
{
    float w[2 * 16];
    for (int i = 0; i < 32; i++) w[i] = 10.0f;
    ms_eplb_plan p;
    ms_errbuf err = {{0}};
    CHECK(!ms_eplb_rebalance(w, 2, 16, 16, 4, 2, 4, MS_EPLB_AUTO, &p, &err));
    for (int i = 0; i < 32; i++) CHECK(p.logcnt[i] == 1);
    double load[4];
    ms_eplb_gpu_load(&p, 0, w, 4, load);
    CHECK_NEAR(ms_eplb_balancedness(load, 4), 1.0, 1e-9);
    ms_eplb_plan_free(&p);
    double one[4] = {200, 0, 0, 0};
    CHECK_NEAR(ms_eplb_balancedness(one, 4), 0.25, 1e-6);
}

/* relabelling groups (distinct loads, no ties) relabels the placement and nothing else */
TEST(group_permutation_relabels)
{
    enum { E = 12, G = 4, GS = 3, R = 16 };
    float w[E], wp[E];
    int perm[G] = {2, 0, 3, 1}; /* new group perm[g] holds old group g */
    for (int e = 0; e < E; e++) w[e] = 1.0f + (float)(next_u32() % 100000) / 3.0f;
    for (int e = 0; e < E; e++) wp[perm[e / GS] * GS + e % GS] = w[e];
    ms_eplb_plan p, q;
    ms_errbuf err = {{0}};
    CHECK(!ms_eplb_rebalance(w, 1, E, R, G, 2, 8, MS_EPLB_AUTO, &p, &err));
    CHECK(!ms_eplb_rebalance(wp, 1, E, R, G, 2, 8, MS_EPLB_AUTO, &q, &err));
    for (int s = 0; s < R; s++) {
        int e = p.phy2log[s];
        CHECKF(q.phy2log[s] == perm[e / GS] * GS + e % GS, "slot %d", s);
    }
    ms_eplb_plan_free(&p);
    ms_eplb_plan_free(&q);
}

/* SGLang's static dispatch over replicas: a rank's own replica, else the fair choice
 * (the ranks without a copy spread evenly, the same table on every rank) */
TEST(replica_dispatch_fair)
{
    ms_errbuf err = {{0}};
    /* 4 ranks x 2 slots; expert 0 on ranks 0 and 1, expert 1 on rank 0 only, expert 5 three times
     */
    int32_t row[8] = {0, 1, 0, 2, 3, 4, 5, 5};
    for (uint64_t seed = 0; seed < 50; seed++) {
        ms_expert_map m[4];
        int used0[8] = {0};
        for (int r = 0; r < 4; r++) {
            CHECKF(!ms_expert_map_init_replicas(&m[r], 6, 8, 4, r, seed, row, &err), "%s", err.msg);
            CHECK(m[r].logical_of[2] == 0 && m[r].per_rank == 2);
            CHECK(m[r].logical_of[m[r].physical_of[0]] == 0 &&
                  m[r].logical_of[m[r].physical_of[5]] == 5);
            used0[m[r].physical_of[0]]++;
        }
        CHECK(m[0].physical_of[0] == 0 && m[1].physical_of[0] == 2); /* own copies */
        CHECK(used0[0] == 2 && used0[2] == 2);                       /* ranks 2, 3: one each */
        CHECK(m[3].physical_of[5] == 6); /* rank 3 holds both 5s: first */
        CHECK(m[1].physical_of[1] == 1 && m[2].physical_of[1] == 1); /* one copy: everyone's */
        ms_expert_map again;
        CHECK(!ms_expert_map_init_replicas(&again, 6, 8, 4, 2, seed, row, &err));
        CHECK(again.physical_of[0] == m[2].physical_of[0]); /* deterministic */
        ms_expert_map_deinit(&again);
        for (int r = 0; r < 4; r++) ms_expert_map_deinit(&m[r]);
    }
    ms_expert_map m;
    int32_t missing[8] = {0, 1, 0, 2, 3, 4, 0, 0};
    CHECK(ms_expert_map_init_replicas(&m, 6, 8, 4, 0, 0, missing, &err) == MS_EINVAL);
    CHECK(strstr(err.msg, "logical expert 5 has no physical slot"));
    CHECK(ms_expert_map_init_replicas(&m, 6, 9, 4, 0, 0, row, &err) == MS_EINVAL);
}

int main(void)
{
    RUN(replica_dispatch_fair);
    RUN(readme_golden_hierarchical);
    RUN(global_policy_fallback);
    RUN(preconditions_refused);
    RUN(properties_random);
    RUN(equal_loads_no_replicas);
    RUN(group_permutation_relabels);
    return TEST_REPORT();
}
