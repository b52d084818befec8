/* eplb.h — DeepSeek's expert-parallelism load balancer (deepseek-ai/EPLB eplb.py;
 * testing.md §1): from per-layer logical expert loads, choose how many replicas each
 * expert gets and which physical slot (and so which EP rank) holds each replica.
 *
 * Semantics follow upstream exactly, in float32: replicate_experts adds one replica at
 * a time to the expert with the largest per-replica load (ties: lowest expert id);
 * balanced_packing places items heaviest first (a stable descending sort: equal loads
 * keep ascending index order) into the lightest pack that still has room, every pack
 * taking exactly n/m items (ties: lowest pack index).  The hierarchical policy packs
 * expert groups onto nodes, replicates within each node, then packs the node's slots
 * onto its GPUs; the global policy is the same with one group and one node.  Upstream
 * sorts with torch, which is not stable for rows of more than 16 items: there, ties
 * between distinct experts may resolve differently (testing.md §1.7).
 *
 * Physical slot p lives on GPU (EP rank) p / (R / num_gpus).  Pure functions; any
 * thread.
 */
#ifndef MS_PARALLEL_EPLB_H
#define MS_PARALLEL_EPLB_H

#include "base/error.h"

#include <stdint.h>

enum ms_eplb_policy {
    MS_EPLB_AUTO = 0,     /* hierarchical iff num_groups % num_nodes == 0 (SGLang "auto") */
    MS_EPLB_GLOBAL,       /* SGLang "deepseek": one group, one node */
    MS_EPLB_HIERARCHICAL, /* SGLang "deepseek_hierarchical" */
};

/* Parses "auto" | "deepseek" | "deepseek_hierarchical"; -1 for anything else. */
int ms_eplb_policy_parse(const char *s);
const char *ms_eplb_policy_name(int policy);

typedef struct ms_eplb_plan {
    int n_layers, n_logical, n_physical; /* L, E, R */
    int maxcnt;                          /* max over layers and experts of logcnt */
    int32_t *phy2log;                    /* [L][R]: logical expert of each physical slot */
    int32_t *phyrank; /* [L][R]: replica rank of each slot (0: the original copy) */
    int32_t *logcnt;  /* [L][E]: replicas of each logical expert (>= 1) */
    int32_t *log2phy; /* [L][E][maxcnt]: slot of replica rank r, -1 padded */
} ms_eplb_plan;

/* Runs the balancer on weight[L][E] (token counts; read as float32).  policy is
 * MS_EPLB_*; num_groups / num_nodes / num_gpus as upstream (num_gpus: all EP ranks).
 * Preconditions (MS_EINVAL naming the one broken): E % num_groups == 0, R >= E,
 * R % num_gpus == 0, and for the hierarchical policy num_groups % num_nodes == 0 and
 * num_gpus % num_nodes == 0.  On success *out owns its arrays (ms_eplb_plan_free). */
int ms_eplb_rebalance(const float *weight, int L, int E, int R, int num_groups, int num_nodes,
                      int num_gpus, int policy, ms_eplb_plan *out, ms_errbuf *err);
void ms_eplb_plan_free(ms_eplb_plan *p);

/* The per-GPU load of one layer's placement: gpu_load[g] = Σ over g's slots of
 * w[logical] / logcnt[logical].  gpu_load has num_gpus entries. */
void ms_eplb_gpu_load(const ms_eplb_plan *p, int layer, const float *w_layer, int num_gpus,
                      double *gpu_load);

/* Balancedness of per-rank loads (SGLang's utilization, testing.md §6.2):
 * (mean + 1e-5) / (max + 1e-5); 1 for perfect balance, 1/n when one rank has all. */
double ms_eplb_balancedness(const double *rank_load, int n);

/* Reads per-layer logical loads from a JSON file (eplb_json.c): an array of layers of
 * expert counts [L][E]; or [steps][L][E] (summed over steps); or an object whose
 * "logical_count" is either (SGLang's recorded distribution, as moeserve dumps it).
 * *w is malloc'd float[L][E].  0, or MS_EINVAL naming the file and the problem (a .pt
 * pickle is refused: moeserve reads the JSON dump). */
int ms_eplb_load_counts(const char *path, float **w, int *L, int *E, ms_errbuf *err);

/* The plan as one JSON object {"phy2log": [[..]], "logcnt": [[..]], "log2phy":
 * [[[..]]]} (log2phy padded with -1); a new reference, NULL when out of memory. */
struct json_t;
struct json_t *ms_eplb_plan_json(const ms_eplb_plan *p);

#endif
