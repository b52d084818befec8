/* family_util.h — what the model-family tests (test_family.c, test_family_v4.c)
 * share: an F32 KV cache of a model's streams holding two sequences, one
 * sequence through the whole forward, and the comparisons (relative error,
 * argmax).  Include after harness.h.  Single-threaded test code. */
#ifndef MS_TESTS_FAMILY_UTIL_H
#define MS_TESTS_FAMILY_UTIL_H

#include "cache/kv_cache.h"
#include "model/family.h"

#include <math.h>
#include <stdio.h>

/* pages_per_stream pages of page_size in every stream of m's spec built with
 * o (its page_size and attn_tp set here) and values in dt, n_state
 * sequence-state slots, and q0, q1 each holding reserve tokens; NULL on failure. */
static ms_kv_cache *fam_cache_new_opts(ms_model *m, ms_kv_spec_opts o, ms_dtype dt, int page_size,
                                       int32_t pages_per_stream, int n_state, int64_t reserve,
                                       ms_kv_seq *q0, ms_kv_seq *q1)
{
    static ms_kv_spec spec;
    ms_errbuf err;
    o.page_size = page_size, o.attn_tp = 1;
    ms_kv_cache *c = NULL;
    int32_t pages[MS_KV_MAX_STREAMS];
    for (int s = 0; s < MS_KV_MAX_STREAMS; s++) pages[s] = pages_per_stream;
    if (ms_model_kv_spec(m, &o, &spec, &err) ||
        ms_kv_cache_new(&c, &spec, page_size, pages, dt, n_state, &err)) {
        fprintf(stderr, "cache: %s\n", err.msg);
        return NULL;
    }
    ms_kv_seq_init(q0), ms_kv_seq_init(q1);
    if (ms_kv_cache_reserve(c, q0, reserve) || ms_kv_cache_reserve(c, q1, reserve)) {
        ms_kv_cache_free(c);
        return NULL;
    }
    return c;
}

/* The same with F32 values (the --dtype float32 cache). */
static ms_kv_cache *fam_cache_new(ms_model *m, int page_size, int32_t pages_per_stream, int n_state,
                                  int64_t reserve, ms_kv_seq *q0, ms_kv_seq *q1)
{
    ms_kv_spec_opts o = {.elem_bytes = 4};
    return fam_cache_new_opts(m, o, MS_DT_F32, page_size, pages_per_stream, n_state, reserve, q0,
                              q1);
}

static void free_cache(ms_kv_cache *c, ms_kv_seq *q0, ms_kv_seq *q1)
{
    ms_kv_cache_release(c, q0), ms_kv_cache_release(c, q1);
    ms_kv_seq_deinit(q0), ms_kv_seq_deinit(q1);
    ms_kv_cache_free(c);
}

/* One sequence of n tokens from pos through m's forward (kind: MS_SEQ_*). */
static int fam_forward1(ms_model *m, const ms_kv_cache *c, const ms_kv_seq *kv, const int32_t *t,
                        int n, int64_t pos, int kind, int n_logits, float *logits, float *hidden)
{
    ms_batch_seq sq = {.tokens = t,
                       .n_tokens = n,
                       .start_pos = pos,
                       .kv = kv,
                       .logits = logits,
                       .n_logits = n_logits,
                       .kind = kind,
                       .hidden = hidden};
    ms_errbuf err;
    int rc = ms_model_forward(m, c, &sq, 1, &err);
    if (rc) fprintf(stderr, "forward: %s\n", err.msg);
    return rc;
}

/* max |a - b| / max |b| over n values (a NaN in a counts as an error) */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - b[i]), y = fabs((double)b[i]);
        if (!(x <= d)) d = x;
        if (y > m) m = y;
    }
    return m > 0 ? d / m : d;
}

static int32_t argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

#endif
