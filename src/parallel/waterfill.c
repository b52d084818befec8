/* waterfill.c — the shared-expert placement of SGLang's waterfill (waterfill.h), one
 * row at a time in the order of its Triton kernel, integer for integer. */
#include "parallel/waterfill.h"

#include <string.h>

enum { PREF_NUM = 11, PREF_DEN = 10 }; /* home preference 11/10 */

void ms_waterfill_count(const ms_expert_map *map, const int32_t *idx, int64_t n, int K,
                        int64_t *load)
{
    memset(load, 0, sizeof(int64_t) * (size_t)map->n_ranks);
    for (int64_t i = 0; i < n * K; i++)
        if (idx[i] >= 0) load[ms_expert_map_owner(map, map->physical_of[idx[i]])]++;
}

void ms_waterfill_dynamic_plan(const int64_t *routed, const int64_t *rows, int N, int K,
                               int64_t *eff, ms_waterfill_plan *p)
{
    int64_t total_routed = 0, total_eff = 0, max_eff = 0;
    for (int r = 0; r < N; r++) {
        eff[r] = routed[r] + rows[r];
        total_routed += routed[r];
        total_eff += eff[r];
        max_eff = eff[r] > max_eff ? eff[r] : max_eff;
    }
    int64_t target = (total_eff + total_routed / K + N - 1) / N;
    *p = (ms_waterfill_plan){
        .rank_load = eff, .n_ranks = N, .allow_all = max_eff <= target, .target = target};
}

/* The weight of candidate r for a row of home src: the room under the water level,
 * discounted off home. */
static int32_t room(const ms_waterfill_plan *p, int64_t target, int r, int src)
{
    int64_t d = target > p->rank_load[r] ? target - p->rank_load[r] : 0;
    int32_t w = (int32_t)d; /* the kernel's int32 */
    return r == src ? w : (int32_t)((w * PREF_DEN) / PREF_NUM);
}

void ms_waterfill_choose(const ms_waterfill_plan *p, int src, const int32_t *dest, int64_t n, int K,
                         int32_t *dst)
{
    if (!p || n < MS_WATERFILL_MIN_BATCH) {
        for (int64_t t = 0; t < n; t++) dst[t] = src;
        return;
    }
    int N = p->n_ranks;
    int64_t sum = 0;
    for (int r = 0; r < N; r++) sum += p->rank_load[r];
    int64_t target = p->target > 0 ? p->target : (sum + sum / K + N - 1) / N;
    uint8_t cand[MS_EP_MAX_RANKS];
    for (int64_t t = 0; t < n; t++) {
        const int32_t *d = dest + t * K;
        int64_t best = p->rank_load[src];
        int best_rank = src, any = 0;
        memset(cand, 0, (size_t)N);
        cand[src] = 1;
        if (p->allow_all) {
            memset(cand, 1, (size_t)N);
            for (int r = 0; r < N; r++)
                if (p->rank_load[r] * PREF_NUM < best * PREF_DEN)
                    best = p->rank_load[r], best_rank = r;
        }
        for (int k = 0; k < K; k++) {
            if (d[k] < 0) continue;
            any = 1;
            if (p->allow_all) continue;
            cand[d[k]] = 1;
            if (p->rank_load[d[k]] * PREF_NUM < best * PREF_DEN)
                best = p->rank_load[d[k]], best_rank = d[k];
        }
        if (!any) { /* SGLang: no routed entry, no shared copy; here: computed at home */
            dst[t] = src;
            continue;
        }
        int32_t total = 0;
        for (int r = 0; r < N; r++)
            if (cand[r]) total += room(p, target, r, src);
        if (total > 0) {
            uint32_t seed = (uint32_t)t ^ ((uint32_t)src * 0x9E3779B9u);
            seed = seed * 1664525u + 1013904223u;
            int32_t u = (int32_t)(seed % (uint32_t)total), cum = 0;
            best_rank = src;
            for (int r = 0; r < N; r++) {
                if (!cand[r]) continue;
                int32_t w = room(p, target, r, src);
                if (u >= cum && u < cum + w) best_rank = r;
                cum += w;
            }
        }
        dst[t] = best_rank;
    }
}
