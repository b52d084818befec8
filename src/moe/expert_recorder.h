/* expert_recorder.h — SGLang's expert distribution recorder (testing.md §6.1–6.2):
 * per layer, per physical expert, the routed (token, top-k) hits of each forward pass,
 * summed over all ranks, kept over a sliding window of passes; and each pass's
 * balancedness per layer ((mean + 1e-5) / (max + 1e-5) of per-EP-rank load).
 *
 * Modes: stat (the window's sum is dumped), per_pass (each pass of the window is
 * dumped with its "global_physical_count" [L][R]) and per_token (each pass also with
 * its tokens: "input_ids", "positions", "extend_seq_lens", "forward_mode" and
 * "topk_ids_of_layer" [L][n_tokens][top-k], the physical expert each token went to;
 * at most max_tokens token rows are kept, the oldest passes' rows dropped first).  The
 * dump is JSON with SGLang's field names ("logical_count" [L][E] summed over the
 * window, "physical_to_logical_map" [L][R]; SGLang writes torch .pt pickles, which C
 * cannot: the JSON carries the same fields).
 *
 * Threads: ms_expert_recorder_add and _end_pass run on the engine's main thread (the
 * pass buffer is theirs); start / stop / dump / the statistics readers may run on any
 * thread (a mutex guards the window and the statistics).  The MLP layers find the
 * engine's recorder through ms_expert_recorder_active() (one engine per process, as
 * SGLang's global recorder).
 */
#ifndef MS_MOE_EXPERT_RECORDER_H
#define MS_MOE_EXPERT_RECORDER_H

#include "base/error.h"
#include "parallel/comm.h"
#include "parallel/ep.h"

#include <stdint.h>

enum ms_recorder_mode { MS_REC_OFF = 0, MS_REC_STAT, MS_REC_PER_PASS, MS_REC_PER_TOKEN };

#define MS_REC_MAX_TOKENS_DEFAULT 65536 /* per_token: token rows kept (all passes, all ranks) */

/* "stat" | "per_pass" | "per_token" → MS_REC_*; else MS_EINVAL, the reason in err
 * naming the flag. */
int ms_recorder_mode_parse(const char *v, int *mode, ms_errbuf *err);

typedef struct ms_expert_recorder ms_expert_recorder;

/* n_layers rows of n_physical slots, owned per_rank = n_physical / n_ranks by each EP
 * rank; window: passes kept (>= 1); top_k: the gate's k; max_tokens: per_token's cap
 * on token rows kept (>= 1; other modes ignore it).  maps[n_layers]: the placement
 * (borrowed; NULL: the identity with n_logical = n_physical).  NULL when out of memory
 * or a size is out of range. */
ms_expert_recorder *ms_expert_recorder_new(int mode, int n_layers, int n_logical, int n_physical,
                                           int n_ranks, int window, int top_k, int64_t max_tokens,
                                           const ms_expert_map *maps);
void ms_expert_recorder_free(ms_expert_recorder *r);

/* The recorder the MLP layers feed (NULL: none). */
void ms_expert_recorder_set_active(ms_expert_recorder *r);
ms_expert_recorder *ms_expert_recorder_active(void);

/* Adds n rows of top-k logical ids idx[n][K] (entries < 0 skipped) of layer l, mapped
 * to physical slots by map (NULL: identity).  Main thread. */
void ms_expert_recorder_add(ms_expert_recorder *r, int layer, const ms_expert_map *map,
                            const int32_t *idx, int64_t n, int K);

/* per_token: the pass's tokens, one sequence of n ids at positions start_pos.. of kind
 * MS_REC_SEQ_* per call, in the order the forward lays out its rows.  The first rank of
 * each DP group (attention-TP rank 0) calls it for its group's batch; no-op in the
 * other modes.  Main thread.  Across ranks, the rows the ranks route (add) and the
 * tokens their DP leaders give here both come out in world rank order: DP group 0's
 * rows first, each group's in its batch order. */
enum { MS_REC_SEQ_EXTEND = 0, MS_REC_SEQ_DECODE = 1, MS_REC_SEQ_VERIFY = 2 };
/* A pass's forward mode (SGLang's ForwardMode names): the kinds of the rows this rank's
 * DP group gave add_seq (none: IDLE). */
enum {
    MS_REC_FM_EXTEND,
    MS_REC_FM_DECODE,
    MS_REC_FM_MIXED,
    MS_REC_FM_TARGET_VERIFY,
    MS_REC_FM_IDLE,
    MS_REC_N_FM
};
/* SGLang's label value of forward_mode (ForwardMode.name.lower()): "extend", "decode", … */
const char *ms_recorder_forward_mode_name(int fm);
void ms_expert_recorder_add_seq(ms_expert_recorder *r, const int32_t *ids, int32_t n,
                                int64_t start_pos, int kind);

/* Ends a forward pass: sums the pass over world (NULL: one rank; every rank of world
 * calls it), updates the balancedness statistics, and keeps the pass in the window
 * while recording (per_token: also gathers every rank's token rows to world rank 0,
 * the rank that dumps).  0 or a communication error. */
int ms_expert_recorder_end_pass(ms_expert_recorder *r, ms_group *world, ms_errbuf *err);

/* Forgets the pass so far (a forward that is no serving pass: the warm-up).  Main thread. */
void ms_expert_recorder_discard_pass(ms_expert_recorder *r);

void ms_expert_recorder_start(ms_expert_recorder *r); /* clears the window, records */
void ms_expert_recorder_stop(ms_expert_recorder *r);
/* The window as JSON (see above; "mode", "num_passes", "forward_pass_id" too; per_pass
 * and per_token: "records", one per kept pass, and "last_physical_to_logical_map"), and
 * clears it (SGLang's dump resets).  A new reference, NULL when out of memory. */
struct json_t *ms_expert_recorder_dump(ms_expert_recorder *r);

/* EPLB's input (serve/eplb_run.c): the window's logical counts lc[L][E] (each kept pass
 * mapped through the maps at the time of the call) summed; clears the window as a dump
 * does.  Returns the passes summed. */
int ms_expert_recorder_take_window(ms_expert_recorder *r, int64_t *lc);
/* The maps (borrowed) change only under this lock (dumps on other threads read them). */
void ms_expert_recorder_lock(ms_expert_recorder *r);
void ms_expert_recorder_unlock(ms_expert_recorder *r);
/* Records from now on whatever /stop_expert_distribution_record says (EPLB's window,
 * SGLang: the EPLB manager starts recording). */
void ms_expert_recorder_record_always(ms_expert_recorder *r);

typedef struct ms_recorder_stats {
    int64_t passes;                /* forward passes seen (with routed tokens) */
    double last;                   /* the last pass's balancedness (mean over MoE layers) */
    double avg10, avg100, avg1000; /* over the last 10 / 100 / 1000 passes */
    double sum;                    /* Σ over all passes of the per-pass balancedness */
    double fm_sum[MS_REC_N_FM];    /* the same by the pass's forward mode (MS_REC_FM_*) */
    int64_t fm_count[MS_REC_N_FM]; /* passes by forward mode */
    /* the last pass, mean over MoE layers: the slots with any hit (expert weights read)
     * on the EP rank with the most of them, and on the average rank */
    double touched_max, touched_mean;
    int recording;
} ms_recorder_stats;

void ms_expert_recorder_stats(ms_expert_recorder *r, ms_recorder_stats *st);
/* The last pass's balancedness of layer l (1 for a layer with no routed tokens). */
double ms_expert_recorder_layer_balancedness(ms_expert_recorder *r, int layer);
int ms_expert_recorder_n_layers(const ms_expert_recorder *r);

#endif
