/* eplb.c — DeepSeek's expert-parallelism load balancer (eplb.h): replicate, balanced
 * packing, the hierarchical and global policies, log2phy.  float32 arithmetic as
 * upstream. */
#include "parallel/eplb.h"

#include <stdlib.h>
#include <string.h>

int ms_eplb_policy_parse(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "auto")) return MS_EPLB_AUTO;
    if (!strcmp(s, "deepseek")) return MS_EPLB_GLOBAL;
    if (!strcmp(s, "deepseek_hierarchical")) return MS_EPLB_HIERARCHICAL;
    return -1;
}

const char *ms_eplb_policy_name(int policy)
{
    return policy == MS_EPLB_GLOBAL         ? "deepseek"
           : policy == MS_EPLB_HIERARCHICAL ? "deepseek_hierarchical"
                                            : "auto";
}

/* order[n]: item indices by w descending; equal loads keep ascending index order
 * (insertion sort: stable, rows are at most a few hundred items). */
static void sort_desc_stable(const float *w, int n, int32_t *order)
{
    for (int i = 0; i < n; i++) {
        int32_t v = i;
        int j = i;
        while (j > 0 && w[order[j - 1]] < w[v]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
}

/* Packs the n items w[n] into m packs of exactly n/m items each (m divides n):
 * pack[i] and rank[i] (order of arrival in the pack).  scratch: n + 2m ints. */
static void balanced_packing(const float *w, int n, int m, int32_t *pack, int32_t *rank,
                             int32_t *scratch, float *pack_w)
{
    int k = n / m;
    if (k == 1) {
        for (int i = 0; i < n; i++) pack[i] = i, rank[i] = 0;
        return;
    }
    int32_t *order = scratch, *items = scratch + n;
    sort_desc_stable(w, n, order);
    for (int p = 0; p < m; p++) pack_w[p] = 0.0f, items[p] = 0;
    for (int t = 0; t < n; t++) {
        int it = order[t], best = -1;
        for (int p = 0; p < m; p++)
            if (items[p] < k && (best < 0 || pack_w[p] < pack_w[best])) best = p;
        pack[it] = best;
        rank[it] = items[best];
        pack_w[best] += w[it];
        items[best]++;
    }
}

/* Replicates n logical experts w[n] onto num_phy >= n slots: slot e < n holds e
 * (rank 0); each further slot goes to the expert with the largest w/cnt (ties: the
 * lowest id). */
static void replicate_experts(const float *w, int n, int num_phy, int32_t *phy2log, int32_t *rank,
                              int32_t *logcnt)
{
    for (int e = 0; e < n; e++) phy2log[e] = e, rank[e] = 0, logcnt[e] = 1;
    for (int i = n; i < num_phy; i++) {
        int best = 0;
        float bv = w[0] / (float)logcnt[0];
        for (int e = 1; e < n; e++) {
            float v = w[e] / (float)logcnt[e];
            if (v > bv) bv = v, best = e;
        }
        phy2log[i] = best;
        rank[i] = logcnt[best];
        logcnt[best]++;
    }
}

typedef struct eplb_ws {
    float *fbuf;
    int32_t *ibuf;
} eplb_ws;

/* One layer of the hierarchical policy (testing.md §1.4); G = N = 1 is the global one.
 * Outputs phy2log[R], phyrank[R], logcnt[E]. */

static void hierarchical_layer(const float *w, int E, int R, int G, int N, int gpus, eplb_ws *ws,
                               int32_t *phy2log, int32_t *phyrank, int32_t *logcnt)
{
    int gsize = E / G, gpn = G / N, ppg = R / gpus, epn = E / N, rpn = R / N, gpn_gpu = gpus / N;
    float *tok_g = ws->fbuf;     /* [G] */
    float *tok_m = tok_g + G;    /* [epn] */
    float *tok_p = tok_m + epn;  /* [rpn] */
    float *pack_w = tok_p + rpn; /* [max(N, gpus)] */
    int32_t *gpack = ws->ibuf, *grank = gpack + G;
    int32_t *log2mlog = grank + G, *mlog2log = log2mlog + E;
    int32_t *mlogcnt = mlog2log + E; /* [E]: node-major */
    int32_t *phy2mlog = mlogcnt + E, *prank = phy2mlog + rpn;
    int32_t *pk = prank + rpn, *pr = pk + rpn, *pphy2phy = pr + rpn;
    int32_t *scratch = pphy2phy + rpn; /* max(G + N, rpn + gpus / N) */

    /* step 1: groups onto nodes */
    for (int g = 0; g < G; g++) {
        float s = 0.0f;
        for (int j = 0; j < gsize; j++) s += w[g * gsize + j];
        tok_g[g] = s;
    }
    balanced_packing(tok_g, G, N, gpack, grank, scratch, pack_w);
    for (int e = 0; e < E; e++) {
        int g = e / gsize;
        log2mlog[e] = (gpack[g] * gpn + grank[g]) * gsize + e % gsize;
        mlog2log[log2mlog[e]] = e;
    }
    /* steps 2 and 3, node by node */
    for (int k = 0; k < N; k++) {
        for (int j = 0; j < epn; j++) tok_m[j] = w[mlog2log[k * epn + j]];
        replicate_experts(tok_m, epn, rpn, phy2mlog, prank, mlogcnt + k * epn);
        for (int s = 0; s < rpn; s++)
            tok_p[s] = tok_m[phy2mlog[s]] / (float)mlogcnt[k * epn + phy2mlog[s]];
        balanced_packing(tok_p, rpn, gpn_gpu, pk, pr, scratch, pack_w);
        for (int s = 0; s < rpn; s++) pphy2phy[pk[s] * ppg + pr[s]] = s;
        for (int q = 0; q < rpn; q++) {
            int s = pphy2phy[q];
            phy2log[k * rpn + q] = mlog2log[k * epn + phy2mlog[s]];
            phyrank[k * rpn + q] = prank[s];
        }
    }
    for (int e = 0; e < E; e++) logcnt[e] = mlogcnt[log2mlog[e]];
}

void ms_eplb_plan_free(ms_eplb_plan *p)
{
    if (!p) return;
    free(p->phy2log);
    free(p->phyrank);
    free(p->logcnt);
    free(p->log2phy);
    memset(p, 0, sizeof *p);
}

int ms_eplb_rebalance(const float *weight, int L, int E, int R, int G, int N, int gpus, int policy,
                      ms_eplb_plan *out, ms_errbuf *err)
{
    memset(out, 0, sizeof *out);
    if (L < 1 || E < 1) return ms_err(err, MS_EINVAL, "eplb: need at least one layer and expert");
    if (G < 1 || N < 1 || gpus < 1)
        return ms_err(err, MS_EINVAL, "eplb: groups, nodes and GPUs must be at least 1");
    if (R < E) return ms_err(err, MS_EINVAL, "eplb: %d replicas cannot hold %d experts", R, E);
    if (R % gpus)
        return ms_err(err, MS_EINVAL, "eplb: %d replicas do not divide over %d GPUs", R, gpus);
    if (E % G) return ms_err(err, MS_EINVAL, "eplb: %d experts do not divide into %d groups", E, G);
    if (policy == MS_EPLB_AUTO) policy = G % N == 0 ? MS_EPLB_HIERARCHICAL : MS_EPLB_GLOBAL;
    if (policy == MS_EPLB_GLOBAL)
        G = N = 1;
    else if (policy == MS_EPLB_HIERARCHICAL) {
        if (G % N)
            return ms_err(err, MS_EINVAL,
                          "eplb: deepseek_hierarchical needs the %d groups to divide over %d "
                          "nodes (use auto or deepseek)",
                          G, N);
        if (gpus % N)
            return ms_err(err, MS_EINVAL, "eplb: %d GPUs do not divide over %d nodes", gpus, N);
    } else
        return ms_err(err, MS_EINVAL, "eplb: unknown policy %d", policy);

    size_t big = (size_t)(R > E ? R : E) + (size_t)(R > G ? R : G) + (size_t)(N > gpus ? N : gpus);
    eplb_ws ws = {
        malloc(sizeof(float) * ((size_t)G + (size_t)E + (size_t)R + big)),
        malloc(sizeof(int32_t) * (2 * (size_t)G + 3 * (size_t)E + 5 * (size_t)R + 2 * big))};
    out->phy2log = malloc(sizeof(int32_t) * (size_t)L * (size_t)R);
    out->phyrank = malloc(sizeof(int32_t) * (size_t)L * (size_t)R);
    out->logcnt = malloc(sizeof(int32_t) * (size_t)L * (size_t)E);
    if (!ws.fbuf || !ws.ibuf || !out->phy2log || !out->phyrank || !out->logcnt) {
        free(ws.fbuf);
        free(ws.ibuf);
        ms_eplb_plan_free(out);
        return ms_err(err, MS_ENOMEM, "eplb: out of memory");
    }
    out->n_layers = L, out->n_logical = E, out->n_physical = R;
    int maxcnt = 1;
    for (int l = 0; l < L; l++) {
        const float *w = weight + (size_t)l * (size_t)E;
        hierarchical_layer(w, E, R, G, N, gpus, &ws, out->phy2log + (size_t)l * R,
                           out->phyrank + (size_t)l * R, out->logcnt + (size_t)l * E);
        for (int e = 0; e < E; e++)
            if (out->logcnt[(size_t)l * E + e] > maxcnt) maxcnt = out->logcnt[(size_t)l * E + e];
    }
    free(ws.fbuf);
    free(ws.ibuf);
    out->maxcnt = maxcnt;
    out->log2phy = malloc(sizeof(int32_t) * (size_t)L * (size_t)E * (size_t)maxcnt);
    if (!out->log2phy) {
        ms_eplb_plan_free(out);
        return ms_err(err, MS_ENOMEM, "eplb: out of memory");
    }
    for (size_t i = 0; i < (size_t)L * E * maxcnt; i++) out->log2phy[i] = -1;
    for (int l = 0; l < L; l++)
        for (int p = 0; p < R; p++) {
            size_t e = (size_t)out->phy2log[(size_t)l * R + p];
            out->log2phy[((size_t)l * E + e) * maxcnt + out->phyrank[(size_t)l * R + p]] = p;
        }
    return 0;
}

void ms_eplb_gpu_load(const ms_eplb_plan *p, int layer, const float *w, int gpus, double *load)
{
    int R = p->n_physical, ppg = R / gpus;
    const int32_t *row = p->phy2log + (size_t)layer * R;
    const int32_t *cnt = p->logcnt + (size_t)layer * p->n_logical;
    for (int g = 0; g < gpus; g++) load[g] = 0.0;
    for (int s = 0; s < R; s++) load[s / ppg] += (double)w[row[s]] / cnt[row[s]];
}

double ms_eplb_balancedness(const double *load, int n)
{
    if (n < 1) return 1.0;
    double sum = 0.0, mx = 0.0;
    for (int i = 0; i < n; i++) {
        sum += load[i];
        if (load[i] > mx) mx = load[i];
    }
    return (sum / n + 1e-5) / (mx + 1e-5);
}
