/* test_waterfill.c — SGLang's waterfill placement of the fused shared expert
 * (parallel/waterfill.h) against hand-worked examples: loads → each row's chosen rank. */
#include "harness.h"
#include "parallel/ep.h"
#include "parallel/waterfill.h"

#include <stdint.h>
#include <string.h>

enum { N_ROWS = 64, K = 2 };

/* Static plan, 3 EP ranks, home 0, loads {10, 4, 1}, k = 2: Σ = 15, target =
 * ceil((15 + 15/2) / 3) = 8; rooms 0, 4, 7; off home x10/11: 0, 3, 6 (total 9).
 * u = (t ^ 0) · 1664525 + 1013904223 mod 9: t = 0..5 → 7, 0, 2, 4, 6, 8; u < 3 → rank 1,
 * 3..8 → rank 2.  Home never wins: it is above the water. */
TEST(static_three_ranks)
{
    int64_t load[3] = {10, 4, 1};
    ms_waterfill_plan p = {.rank_load = load, .n_ranks = 3, .allow_all = 1, .target = 0};
    int32_t dest[N_ROWS * K], dst[N_ROWS];
    for (int i = 0; i < N_ROWS * K; i++)
        dest[i] = 0; /* allow_all: the routed ranks do not matter */
    ms_waterfill_choose(&p, 0, dest, N_ROWS, K, dst);
    static const int32_t want[6] = {2, 1, 1, 2, 2, 2};
    for (int t = 0; t < 6; t++)
        CHECKF(dst[t] == want[t], "row %d: rank %d, want %d", t, dst[t], want[t]);
    for (int t = 0; t < N_ROWS; t++) CHECK(dst[t] == 1 || dst[t] == 2);
}

/* Below SGLang's MIN_BATCH_FOR_BALANCE (64 rows) every copy stays home. */
TEST(small_batch_home)
{
    int64_t load[3] = {10, 4, 1};
    ms_waterfill_plan p = {.rank_load = load, .n_ranks = 3, .allow_all = 1, .target = 0};
    int32_t dest[63 * K] = {0}, dst[63];
    ms_waterfill_choose(&p, 0, dest, 63, K, dst);
    for (int t = 0; t < 63; t++) CHECK(dst[t] == 0);
}

/* Every candidate above the water (target 5, loads {10, 8}): no room anywhere, so the
 * least-loaded candidate wins with the home preference (8 · 11 = 88 < 10 · 10: rank 1)
 * — when rank 1 is a candidate.  allow_all off: candidates are home + routed ranks. */
TEST(no_room_argmin_with_preference)
{
    int64_t load[2] = {10, 8};
    ms_waterfill_plan p = {.rank_load = load, .n_ranks = 2, .allow_all = 0, .target = 5};
    int32_t dest[N_ROWS * K], dst[N_ROWS];
    for (int t = 0; t < N_ROWS; t++)
        dest[t * K] = 0, dest[t * K + 1] = t % 2; /* odd rows touch 1 */
    ms_waterfill_choose(&p, 0, dest, N_ROWS, K, dst);
    for (int t = 0; t < N_ROWS; t++) CHECKF(dst[t] == t % 2, "row %d: rank %d", t, dst[t]);
    int64_t close[2] = {10, 10}; /* 10 · 11 > 10 · 10: home kept */
    p.rank_load = close;
    ms_waterfill_choose(&p, 0, dest, N_ROWS, K, dst);
    for (int t = 0; t < N_ROWS; t++) CHECK(dst[t] == 0);
}

/* Dynamic plan: routed {30, 10}, rows {20, 20}, k = 2: eff {50, 30}, target =
 * ceil((80 + 40/2) / 2) = 50, max 50 <= 50: every rank a candidate. Home 1 (room 20,
 * undiscounted) vs rank 0 (room 0): all of rank 1's rows stay home; home 0 has no room
 * (0) and rank 1 has 20 · 10/11 = 18: all of rank 0's rows go to 1. */
TEST(dynamic_plan)
{
    int64_t routed[2] = {30, 10}, rows[2] = {20, 20}, eff[2];
    ms_waterfill_plan p;
    ms_waterfill_dynamic_plan(routed, rows, 2, K, eff, &p);
    CHECK(eff[0] == 50 && eff[1] == 30 && p.target == 50 && p.allow_all);
    int32_t dest[N_ROWS * K] = {0}, dst[N_ROWS];
    ms_waterfill_choose(&p, 1, dest, N_ROWS, K, dst);
    for (int t = 0; t < N_ROWS; t++) CHECK(dst[t] == 1);
    ms_waterfill_choose(&p, 0, dest, N_ROWS, K, dst);
    for (int t = 0; t < N_ROWS; t++) CHECK(dst[t] == 1);
    routed[0] = 90; /* eff {110, 30}, target ceil((140 + 50) / 2) = 95 < 110: home + routed */
    ms_waterfill_dynamic_plan(routed, rows, 2, K, eff, &p);
    CHECK(p.target == 95 && !p.allow_all);
}

/* The static loads: routed entries per destination rank through the expert map. */
TEST(count_by_map)
{
    ms_expert_map m;
    ms_errbuf err = {{0}};
    int32_t phys[4] = {3, 2, 1,
                       0}; /* physical p holds logical 3 - p; rank r owns p in [2r, 2r+2) */
    CHECK(ms_expert_map_init_from(&m, 4, 2, phys, &err) == 0);
    int32_t idx[3 * K] = {0, 1, 2, 3, 0, 3}; /* logical 0,1 live on rank 1; 2,3 on rank 0 */
    int64_t load[2];
    ms_waterfill_count(&m, idx, 3, K, load);
    CHECK(load[0] == 3 && load[1] == 3);
    ms_expert_map_deinit(&m);
}

int main(void)
{
    RUN(static_three_ranks);
    RUN(small_batch_home);
    RUN(no_room_argmin_with_preference);
    RUN(dynamic_plan);
    RUN(count_by_map);
    return TEST_REPORT();
}
