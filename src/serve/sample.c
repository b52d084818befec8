/* sample.c — the next token of each request of a batch (sample.h). */
#include "serve/sample.h"

#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ms_sample {
    int64_t vocab;
    ms_sampler_scratch sc;
    float *pen_logits; /* [vocab] logits after penalties */
    int32_t *pen_mark; /* [vocab] */
    double sim_acc;    /* SGLANG_SIMULATE_ACC_LEN, 0: off */
};

void ms_sample_simulate_accept(ms_sample *s, double x)
{
    s->sim_acc = x > 0 ? x : 0;
}

int ms_sample_new(ms_sample **out, int64_t vocab, ms_errbuf *err)
{
    *out = NULL;
    ms_sample *s = calloc(1, sizeof *s);
    if (!s) return ms_err(err, MS_ENOMEM, "sampler: out of memory");
    s->vocab = vocab;
    s->sc.prob = malloc(sizeof(float) * (size_t)vocab);
    s->sc.idx = malloc(sizeof(int32_t) * (size_t)vocab);
    s->pen_logits = malloc(sizeof(float) * (size_t)vocab);
    s->pen_mark = malloc(sizeof(int32_t) * (size_t)vocab);
    if (!s->sc.prob || !s->sc.idx || !s->pen_logits || !s->pen_mark) {
        ms_sample_free(s);
        return ms_err(err, MS_ENOMEM, "sampler: out of memory");
    }
    *out = s;
    return 0;
}

void ms_sample_free(ms_sample *s)
{
    if (!s) return;
    free(s->sc.prob);
    free(s->sc.idx);
    free(s->pen_logits);
    free(s->pen_mark);
    free(s);
}

/* Row `row` of q: its logits after penalties (history ids[0..n_ids + row)),
 * bias and the min_new_tokens mask. */
static const float *row_logits(ms_sample *s, const ms_sample_seq *q, int row)
{
    const float *lg = q->logits + (int64_t)row * s->vocab;
    int pen = ms_sampler_has_penalties(q->params);
    int mask = row < q->mask_rows ? q->n_mask : 0;
    if (!pen && q->n_bias <= 0 && mask <= 0) return lg;
    memcpy(s->pen_logits, lg, sizeof(float) * (size_t)s->vocab);
    if (pen)
        ms_sampler_apply_penalties(s->pen_logits, s->vocab, q->params, q->ids, q->n_prompt,
                                   q->n_ids + row, s->pen_mark);
    for (int i = 0; i < q->n_bias; i++) s->pen_logits[q->bias_ids[i]] += q->bias[i];
    for (int i = 0; i < mask; i++) s->pen_logits[q->mask_ids[i]] = -INFINITY;
    return s->pen_logits;
}

/* The logprobs of a pick, from the model's own distribution of its row. */
static void report(ms_sample *s, const ms_sample_seq *q, int row, ms_sample_pick *p)
{
    p->logprob = 0;
    p->n_top = 0;
    if (q->top_logprobs < 0) return;
    const float *lg = q->logits + (int64_t)row * s->vocab;
    p->logprob = ms_sampler_logprob(lg, s->vocab, p->token);
    int n = q->top_logprobs < MS_SAMPLE_MAX_TOP ? q->top_logprobs : MS_SAMPLE_MAX_TOP;
    if (n > 0) ms_sampler_top_logprobs(lg, s->vocab, n, p->top_ids, p->top_lps);
    p->n_top = n;
}

static void pick_one(ms_sample *s, const ms_sample_seq *q, ms_sample_pick *p)
{
    p->token = -1;
    p->logprob = 0;
    p->n_top = 0;
    if (!q->logits) return;
    p->token = ms_sampler_pick(row_logits(s, q, 0), s->vocab, q->params, q->rng, &s->sc);
    report(s, q, 0, p);
}

/* A verify: rows 0..n_draft, stopping at the first rejected draft. */
static void verify(ms_sample *s, const ms_sample_seq *q, ms_sample_pick *p)
{
    int n = q->n_draft, sim_keep = -1;
    if (s->sim_acc > 0) { /* accept floor(x) - 1 or ceil(x) - 1 drafts, whatever they are */
        double u = ms_rng_uniform(q->rng);
        int len = (int)floor(s->sim_acc) + (u < s->sim_acc - floor(s->sim_acc));
        sim_keep = len - 1 < n ? len - 1 : n;
    }
    int j = 0;
    for (; j <= n; j++) {
        const float *lg = row_logits(s, q, j);
        int acc = 0;
        if (j < n && sim_keep >= 0) {
            acc = j < sim_keep;
            p[j].token =
                acc ? q->draft[j] : ms_sampler_pick(lg, s->vocab, q->params, q->rng, &s->sc);
        } else if (j < n) {
            p[j].token =
                ms_sampler_verify(lg, s->vocab, q->params, q->rng, &s->sc, q->draft[j], &acc);
        } else {
            p[j].token = ms_sampler_pick(lg, s->vocab, q->params, q->rng, &s->sc);
        }
        report(s, q, j, &p[j]);
        if (!acc) break;
    }
    if (j < n) p[j + 1].token = -1;
}

void ms_sample_batch(ms_sample *s, const ms_sample_seq *seqs, int n, ms_sample_pick *picks)
{
    for (int i = 0, at = 0; i < n; at += seqs[i].n_draft + 1, i++) {
        if (seqs[i].logits && seqs[i].n_draft > 0)
            verify(s, &seqs[i], &picks[at]);
        else
            pick_one(s, &seqs[i], &picks[at]);
    }
}
