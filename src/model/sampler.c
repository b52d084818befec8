/* sampler.c — greedy / temperature / top-k / top-p / min-p sampling (sampler.h). */
#include "model/sampler.h"

#include "base/util.h"

#include <math.h>
#include <stdlib.h>

/* The first index of the largest value (NaNs are passed over; a NaN at 0
 * gives 0).  Eight independent running maxima, then a search for the first
 * match: the single dependent compare chain took ~0.1 ms per 32k-token step. */
int32_t ms_sampler_argmax(const float *logits, int64_t vocab)
{
    if (vocab <= 0 || isnan(logits[0])) return 0;
    float mx[8];
    for (int j = 0; j < 8; j++) mx[j] = logits[0];
    int64_t i = 0;
    for (; i + 8 <= vocab; i += 8)
        for (int j = 0; j < 8; j++) mx[j] = logits[i + j] > mx[j] ? logits[i + j] : mx[j];
    for (; i < vocab; i++) mx[0] = logits[i] > mx[0] ? logits[i] : mx[0];
    float m = mx[0];
    for (int j = 1; j < 8; j++) m = mx[j] > m ? mx[j] : m;
    for (i = 0; i < vocab; i++)
        if (logits[i] == m) return (int32_t)i;
    return 0;
}

static const float *g_sort_prob; /* qsort has no context argument; main thread only */
static int by_prob_desc(const void *a, const void *b)
{
    float pa = g_sort_prob[*(const int32_t *)a], pb = g_sort_prob[*(const int32_t *)b];
    if (pa != pb) return pa > pb ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* The processed distribution of a non-greedy pick: sc->idx[0..keep) the kept
 * tokens, most likely first, with unnormalised weights sc->prob[idx]; their
 * sum in *total.  Returns keep (0: none kept, fall back to the argmax). */
static int64_t processed(const float *logits, int64_t vocab, const ms_sampler_params *s,
                         ms_sampler_scratch *sc, int32_t best, double *total_out)
{
    float inv_t = 1.0f / s->temperature, mx = logits[best] * inv_t;
    int64_t n = 0;
    for (int64_t i = 0; i < vocab; i++) {
        float p = expf(logits[i] * inv_t - mx);
        sc->prob[i] = p;
        if (p >= 1e-12f) sc->idx[n++] = (int32_t)i;
    }
    float thresh = s->min_p > 0 ? s->min_p : 0; /* relative to the best (prob 1 here) */
    g_sort_prob = sc->prob;
    qsort(sc->idx, (size_t)n, sizeof(int32_t), by_prob_desc);
    if (s->top_k > 0 && n > s->top_k) n = s->top_k;
    double total = 0;
    int64_t keep = 0;
    for (int64_t j = 0; j < n; j++) {
        if (sc->prob[sc->idx[j]] < thresh) break;
        total += sc->prob[sc->idx[j]];
        keep++;
    }
    if (s->top_p > 0 && s->top_p < 1) {
        double cum = 0, limit = s->top_p * total;
        int64_t j = 0;
        for (; j < keep; j++) {
            cum += sc->prob[sc->idx[j]];
            if (cum >= limit) {
                j++;
                break;
            }
        }
        keep = j;
        total = cum;
    }
    *total_out = total;
    return keep;
}

static int is_greedy(const ms_sampler_params *s)
{
    return !(s->temperature > 0) || s->top_k == 1;
}

/* The kept token at weight position u·total, skipping `skip` (-1: none). */
static int32_t draw(const ms_sampler_scratch *sc, int64_t keep, double total, double u,
                    int32_t skip)
{
    double r = u * total, acc = 0;
    int32_t last = -1;
    for (int64_t j = 0; j < keep; j++) {
        if (sc->idx[j] == skip) continue;
        acc += sc->prob[sc->idx[j]];
        last = sc->idx[j];
        if (r < acc) return last;
    }
    return last;
}

int32_t ms_sampler_pick(const float *logits, int64_t vocab, const ms_sampler_params *s,
                        uint64_t *rng, ms_sampler_scratch *sc)
{
    double u = ms_rng_uniform(rng); /* always advance: the stream does not depend on settings */
    int32_t best = ms_sampler_argmax(logits, vocab);
    if (is_greedy(s)) return best;
    double total;
    int64_t keep = processed(logits, vocab, s, sc, best, &total);
    if (keep <= 0) return best;
    return draw(sc, keep, total, u, -1);
}

int32_t ms_sampler_verify(const float *logits, int64_t vocab, const ms_sampler_params *s,
                          uint64_t *rng, ms_sampler_scratch *sc, int32_t draft, int *accepted)
{
    double u = ms_rng_uniform(rng), v = ms_rng_uniform(rng); /* two draws, whatever happens */
    int32_t best = ms_sampler_argmax(logits, vocab);
    *accepted = 0;
    if (is_greedy(s)) {
        *accepted = draft == best;
        return best;
    }
    double total;
    int64_t keep = processed(logits, vocab, s, sc, best, &total);
    if (keep <= 0) {
        *accepted = draft == best;
        return best;
    }
    double px = 0; /* p(draft) under the processed distribution */
    for (int64_t j = 0; j < keep; j++)
        if (sc->idx[j] == draft) px = sc->prob[draft] / total;
    if (u < px) {
        *accepted = 1;
        return draft;
    }
    double rest = total - (px > 0 ? sc->prob[draft] : 0);
    if (!(rest > 0)) return draft; /* p is all on the draft: u < 1 = px took it above */
    return draw(sc, keep, rest, v, px > 0 ? draft : -1);
}

float ms_sampler_logprob(const float *logits, int64_t vocab, int32_t token)
{
    float mx = logits[ms_sampler_argmax(logits, vocab)];
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    return (float)((double)logits[token] - mx - log(sum));
}

void ms_sampler_top_logprobs(const float *logits, int64_t vocab, int n, int32_t *ids, float *lps)
{
    if (n > 64) n = 64;
    if (n > vocab) n = (int)vocab;
    int m = 0; /* insertion into a small sorted list */
    for (int64_t i = 0; i < vocab; i++) {
        if (m == n && logits[i] <= logits[ids[m - 1]]) continue;
        int j = m < n ? m++ : n - 1;
        while (j > 0 && logits[ids[j - 1]] < logits[i]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = (int32_t)i;
    }
    float mx = logits[ids[0]];
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    for (int j = 0; j < n; j++) lps[j] = (float)((double)logits[ids[j]] - mx - log(sum));
}

int ms_sampler_has_penalties(const ms_sampler_params *s)
{
    return s->frequency_penalty != 0 || s->presence_penalty != 0 ||
           (s->repetition_penalty > 0 && s->repetition_penalty != 1);
}

void ms_sampler_apply_penalties(float *logits, int64_t vocab, const ms_sampler_params *s,
                                const int32_t *ids, int64_t n_prompt, int64_t n_ids, int32_t *mark)
{
    /* mark[t]: 0 unseen, 1 seen in the prompt only, 2 seen among generated tokens */
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] >= 0 && ids[i] < vocab) mark[ids[i]] = 0;
    for (int64_t i = 0; i < n_ids; i++) {
        int32_t t = ids[i];
        if (t < 0 || t >= vocab) continue;
        if (i >= n_prompt) {
            logits[t] -= s->frequency_penalty;
            if (mark[t] != 2) logits[t] -= s->presence_penalty;
            mark[t] = 2;
        } else if (mark[t] == 0) {
            mark[t] = 1;
        }
    }
    if (s->repetition_penalty > 0 && s->repetition_penalty != 1)
        for (int64_t i = 0; i < n_ids; i++) {
            int32_t t = ids[i];
            if (t < 0 || t >= vocab || mark[t] < 0) continue;
            logits[t] = logits[t] > 0 ? logits[t] / s->repetition_penalty
                                      : logits[t] * s->repetition_penalty;
            mark[t] = -1; /* once per distinct token */
        }
}
