/* sampler.h — next-token choice from logits: greedy, temperature, top-k,
 * top-p, min-p, with a per-request seeded RNG; log-probabilities.
 *
 * Stateless apart from the caller's RNG state and scratch; any thread.
 * Greedy ties go to the lowest id.  Tokens whose probability is below 1e-12
 * of the best are dropped before top-p (a lost mass under vocab × 1e-12).
 */
#ifndef MS_MODEL_SAMPLER_H
#define MS_MODEL_SAMPLER_H

#include <stdint.h>

typedef struct ms_sampler_params {
    float temperature;        /* 0: greedy */
    float top_p;              /* 1: off */
    int top_k;                /* <= 0: off */
    float min_p;              /* 0: off */
    float frequency_penalty;  /* 0: off; minus this × count of each generated token */
    float presence_penalty;   /* 0: off; minus this once for each generated token */
    float repetition_penalty; /* 0 or 1: off; HF rule over prompt and generated tokens */
} ms_sampler_params;

/* Scratch for one call: vocab floats and vocab ints (caller-owned). */
typedef struct ms_sampler_scratch {
    float *prob;  /* [vocab] */
    int32_t *idx; /* [vocab] */
} ms_sampler_scratch;

static inline uint64_t ms_sampler_seed(uint64_t seed)
{
    return seed * 0x9e3779b97f4a7c15ull + 1;
}

int32_t ms_sampler_argmax(const float *logits, int64_t vocab);
/* Chooses a token; rng is the request's state (advanced once per call). */
int32_t ms_sampler_pick(const float *logits, int64_t vocab, const ms_sampler_params *s,
                        uint64_t *rng, ms_sampler_scratch *scratch);
/* Speculative verification of one draft token (SGLang's target-only rule
 * for chain drafts): accepts draft with probability p(draft) under the
 * processed distribution p (temperature, top-k, top-p, min-p; greedy: p is
 * all on the argmax); on rejection returns a sample from p with the draft
 * removed and renormalised.  *accepted says which; the returned token is the
 * one emitted.  The output is distributed as ms_sampler_pick's.  rng advances
 * twice per call. */
int32_t ms_sampler_verify(const float *logits, int64_t vocab, const ms_sampler_params *s,
                          uint64_t *rng, ms_sampler_scratch *scratch, int32_t draft, int *accepted);
/* True when any penalty is active. */
int ms_sampler_has_penalties(const ms_sampler_params *s);
/* Applies the penalties to logits in place: repetition (HF: divide positive
 * logits, multiply negative ones) over ids[0..n_ids); frequency and presence
 * (OpenAI) over the generated ids[n_prompt..n_ids).  mark is vocab scratch
 * (caller-owned, contents ignored). */
void ms_sampler_apply_penalties(float *logits, int64_t vocab, const ms_sampler_params *s,
                                const int32_t *ids, int64_t n_prompt, int64_t n_ids, int32_t *mark);
/* log softmax(logits)[token]. */
float ms_sampler_logprob(const float *logits, int64_t vocab, int32_t token);
/* The n most likely tokens with their log-probabilities (n <= 64). */
void ms_sampler_top_logprobs(const float *logits, int64_t vocab, int n, int32_t *ids, float *lps);

#endif
