/* sample.c — the next token of each request of a batch (sample.h). */
#include "serve/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ms_sample {
    int64_t vocab;
    ms_sampler_scratch sc;
    float *pen_logits; /* [vocab] logits after penalties */
    int32_t *pen_mark; /* [vocab] */
};

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

static void pick_one(ms_sample *s, const ms_sample_seq *q, ms_sample_pick *p)
{
    p->token = -1;
    p->logprob = 0;
    p->n_top = 0;
    if (!q->logits) return;
    const float *lg = q->logits;
    int pen = ms_sampler_has_penalties(q->params);
    if (pen || q->n_bias > 0 || q->n_mask > 0) { /* logprobs stay the model's own */
        memcpy(s->pen_logits, lg, sizeof(float) * (size_t)s->vocab);
        if (pen)
            ms_sampler_apply_penalties(s->pen_logits, s->vocab, q->params, q->ids, q->n_prompt,
                                       q->n_ids, s->pen_mark);
        for (int i = 0; i < q->n_bias; i++) s->pen_logits[q->bias_ids[i]] += q->bias[i];
        for (int i = 0; i < q->n_mask; i++) s->pen_logits[q->mask_ids[i]] = -INFINITY;
        lg = s->pen_logits;
    }
    p->token = ms_sampler_pick(lg, s->vocab, q->params, q->rng, &s->sc);
    if (q->top_logprobs >= 0) { /* reported from the model's own distribution */
        p->logprob = ms_sampler_logprob(q->logits, s->vocab, p->token);
        int n = q->top_logprobs < MS_SAMPLE_MAX_TOP ? q->top_logprobs : MS_SAMPLE_MAX_TOP;
        if (n > 0) ms_sampler_top_logprobs(q->logits, s->vocab, n, p->top_ids, p->top_lps);
        p->n_top = n;
    }
}

void ms_sample_batch(ms_sample *s, const ms_sample_seq *seqs, int n, ms_sample_pick *picks)
{
    for (int i = 0; i < n; i++) pick_one(s, &seqs[i], &picks[i]);
}
