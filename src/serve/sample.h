/* sample.h — choosing each request's next token after a forward (DESIGN.md
 * §5): the per-request seeded RNG, the penalties over its history, the
 * sampling rule and the log-probabilities it reports, and the acceptance of
 * speculative drafts (a verify row: greedy = the longest agreeing prefix
 * plus the target's own next token; temperature > 0: ms_sampler_verify's
 * target-only rule, row by row).  The numeric
 * kernels it uses — softmax, top-k/top-p/min-p filtering, argmax, log-softmax
 * — stay in model/sampler.c.
 *
 * The scheduler plans batches and never samples: it describes, for each
 * sequence of its last batch that has logits, what to sample from
 * (ms_sched_to_sample); ms_sample_batch picks; ms_sched_commit takes the
 * picks.  Owns only vocab-sized scratch.  The rank's main thread.
 */
#ifndef MS_SERVE_SAMPLE_H
#define MS_SERVE_SAMPLE_H

#include "base/error.h"
#include "model/sampler.h"

#include <stdint.h>

#define MS_SAMPLE_MAX_TOP 20 /* = MS_SCHED_MAX_TOP_LOGPROBS */

/* What one request brings to a pick (borrowed from the scheduler for one step). */
typedef struct ms_sample_seq {
    const float *logits; /* [vocab]; NULL: nothing to pick this step */
    const ms_sampler_params *params;
    uint64_t *rng;      /* the request's RNG state, advanced once per pick */
    const int32_t *ids; /* prompt + generated so far (penalties) */
    int64_t n_prompt, n_ids;
    int top_logprobs;        /* -1: none; 0: the chosen token's; n: and the n best */
    int n_bias;              /* logit_bias: bias[i] added to bias_ids[i]'s logit */
    const int32_t *bias_ids; /* [n_bias] (borrowed) */
    const float *bias;       /* [n_bias] */
    int n_mask;              /* min_new_tokens not reached: these ids (EOS, stop ids) -inf */
    const int32_t *mask_ids; /* [n_mask] (borrowed) */
    /* speculative verify: logits holds n_draft + 1 rows; row j follows draft[0..j) */
    int n_draft;          /* 0: one plain pick */
    const int32_t *draft; /* [n_draft], = ids[n_ids ..] (penalties see them) */
    int mask_rows;        /* rows (from 0) the mask applies to (min_new_tokens) */
} ms_sample_seq;

typedef struct ms_sample_pick {
    int32_t token; /* -1: not picked */
    float logprob;
    int n_top;
    int32_t top_ids[MS_SAMPLE_MAX_TOP];
    float top_lps[MS_SAMPLE_MAX_TOP];
} ms_sample_pick;

typedef struct ms_sample ms_sample;

int ms_sample_new(ms_sample **out, int64_t vocab, ms_errbuf *err);
void ms_sample_free(ms_sample *s);
/* A request's RNG state from its seed. */
static inline uint64_t ms_sample_seed(uint64_t seed)
{
    return ms_sampler_seed(seed);
}
/* Picks for seqs[0..n): seq i's n_draft + 1 slots follow those of seqs before
 * it (without drafts: picks[i]) and hold one pick (token -1
 * where logits is NULL), or for a verify the accepted drafts and the token
 * after them, then token -1 when fewer than n_draft + 1.  Logits are read,
 * never written (penalties go to scratch).  No allocation. */
void ms_sample_batch(ms_sample *s, const ms_sample_seq *seqs, int n, ms_sample_pick *picks);
/* SGLANG_SIMULATE_ACC_LEN (benchmarks only): each verify accepts its drafts as
 * if the mean accept length (accepted + 1) were x, whatever the target says,
 * drawing floor(x) or ceil(x) with the fraction's odds; x <= 0: off. */
void ms_sample_simulate_accept(ms_sample *s, double x);

#endif
