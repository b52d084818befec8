/* router.h — DP admission: the attention-DP rank a new request goes to
 * (DESIGN.md §7, reference/testing.md §2).  A library with no I/O and no
 * clock: the engine reports each DP rank's load after every step, asks for a
 * rank per new request (with its prompt token ids) and says when requests
 * finish.  An in-flight request never moves; an X-Data-Parallel-Rank hint is
 * passed as `forced` and wins over every policy (the request is still
 * recorded, so the loads and the prefix tree stay true).  Rank 0's main
 * thread only.
 */
#ifndef MS_SERVE_ROUTER_H
#define MS_SERVE_ROUTER_H

#include <stdint.h>

/* --load-balance-method (SGLang / vLLM / sgl-router names). */
enum ms_lb {
    MS_LB_ROUND_ROBIN = 0, /* a counter modulo the DP ranks */
    MS_LB_TOTAL_REQUESTS,  /* fewest running + waiting (+ sent since the report); alias
                              shortest_queue */
    MS_LB_TOTAL_TOKENS, /* fewest KV tokens in use (+ prompts sent since), then fewest requests */
    MS_LB_VLLM,         /* vLLM's DP client: lowest 4 × waiting + running */
    MS_LB_CACHE_AWARE,  /* sgl-router: prefix-tree affinity unless the loads are imbalanced */
    MS_LB_COST,         /* lowest estimated work: queue + uncached prefill + decode + pressure */
};
/* A method name -> enum ms_lb; -1 when unknown. */
int ms_lb_parse(const char *name);
const char *ms_lb_name(int lb);

typedef struct ms_router_opts {
    int policy;                    /* enum ms_lb */
    double cache_threshold;        /* cache_aware: matched share of the prompt above which
                                    * (strictly) a rank holding the prefix wins; 0.3 */
    int64_t balance_abs_threshold; /* cache_aware: imbalanced when max - min in-flight > this */
    double balance_rel_threshold;  /* ... and max > min × this; 64 and 1.5 */
    int64_t max_tree_tokens;       /* tokens one rank may own in the prefix tree before its
                                    * least recently used leaves are dropped; 1 << 22 */
} ms_router_opts;
void ms_router_opts_init(ms_router_opts *o);
/* If flag is one of the router's (--load-balance-method, --cache-threshold,
 * --balance-abs-threshold, --balance-rel-threshold, --max-tree-size), parses
 * value into o and returns 1; returns 0 for other flags and MS_EINVAL with a
 * message naming the flag for a bad value.  Shared by serve and simulate. */
struct ms_errbuf;
int ms_router_parse_flag(ms_router_opts *o, const char *flag, const char *value,
                         struct ms_errbuf *err);

/* What a DP rank reported after the last step. */
typedef struct ms_router_load {
    int64_t running, waiting;          /* requests */
    int64_t used_tokens, total_tokens; /* KV pool, tokens */
    int64_t queued_prefill_tokens;     /* prompt tokens admitted but not computed yet */
    int64_t decode_tokens_left;        /* max_new not generated yet, running + waiting */
} ms_router_load;

typedef struct ms_router ms_router;

/* n_ranks DP ranks, 1..4096.  0, MS_EINVAL or MS_ENOMEM. */
int ms_router_new(ms_router **out, int n_ranks, const ms_router_opts *o);
void ms_router_free(ms_router *r);

/* New load reports for every rank (loads[n_ranks]); what was sent since the
 * previous report is forgotten (the reports now include it). */
void ms_router_update(ms_router *r, const ms_router_load *loads);

/* The rank for a new request of n_ids prompt tokens that may generate
 * max_new; forced in [0, n_ranks) bypasses the policy.  Records the request:
 * in-flight count, optimistic load until the next report, and (cache_aware,
 * cost) its prompt in the prefix tree under the chosen rank. */
int ms_router_pick(ms_router *r, const int32_t *ids, int64_t n_ids, int64_t max_new, int forced);

/* A request routed to rank finished (any reason). */
void ms_router_finish(ms_router *r, int rank);

/* For tests and /server_info: requests in flight on rank, tokens rank owns in
 * the prefix tree, and the longest prefix of ids that rank holds there. */
int64_t ms_router_inflight(const ms_router *r, int rank);
int64_t ms_router_tree_tokens(const ms_router *r, int rank);
int64_t ms_router_prefix_hit(ms_router *r, const int32_t *ids, int64_t n_ids, int rank);

#endif
