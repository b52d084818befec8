/* test_v4_draft.c — speculative decoding on DeepSeek-V4 at the model seam
 * (tiny-v4, --dtype float32): the MTP block as a chain draft (an extend over
 * a 140-token prompt, crossing the window and the ratio-4 / ratio-128
 * boundaries, then two single-position steps fed its own streams) equals
 * one extend over the same rows; a verify whose drafts are rejected, rolled
 * back by truncating the cache, leaves the same window, compressed entries,
 * index keys and compressor state as plain decoding (the next steps' logits
 * equal a plain run's; the page counts of every stream equal the plain
 * run's at the same length), for verifies that cross a ratio-4 and a
 * ratio-128 boundary with their rejected positions.
 * MS_V4_DRAFT_DUMP=FILE also writes the chain's draft logits as JSON for
 * tests/ref/v4_ref.py --mtp-check (t_v4ref.sh).  The head of
 * --speculative-token-map gives the full head's logits at its ids. */
#include "harness.h"
#include "family_util.h"
#include "model/family.h"
#include "base/util.h"
#include "tools/mkmodel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 140, S = 3, PS = 16, MAXP = 64 };
static char dir[64];
static ms_model *model;
static int64_t V, HW; /* vocab, a draft hidden row's floats (hc_mult streams) */
static int32_t toks[N + 64];

/* One draft sequence: n rows from pos (tokens t, hidden_in h), logits of the
 * last nl rows and their streams into hid. */
static int draft1(const ms_kv_cache *c, const ms_kv_seq *kv, const int32_t *t, int n, int64_t pos,
                  const float *h, int nl, float *logits, float *hid)
{
    ms_batch_seq sq = {.tokens = t,
                       .n_tokens = n,
                       .start_pos = pos,
                       .kv = kv,
                       .logits = logits,
                       .n_logits = nl,
                       .kind = n == 1 ? MS_SEQ_DECODE : MS_SEQ_PREFILL,
                       .hidden = hid,
                       .hidden_in = h};
    ms_errbuf err;
    int rc = ms_model_draft_forward(model, c, &sq, 1, &err);
    if (rc) fprintf(stderr, "draft: %s\n", err.msg);
    return rc;
}

static void dump(const int32_t *drafts, const float *lg, int32_t next)
{
    const char *path = getenv("MS_V4_DRAFT_DUMP");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) return;
    fprintf(f, "{\"prompt_ids\":[");
    for (int i = 0; i < N; i++) fprintf(f, "%s%d", i ? "," : "", toks[i]);
    fprintf(f, "],\"next\":%d,\"drafts\":[%d,%d,%d],\"logits\":[", next, drafts[0], drafts[1],
            drafts[2]);
    for (int k = 0; k < S; k++) {
        fprintf(f, "%s[", k ? "," : "");
        for (int64_t j = 0; j < V; j++) fprintf(f, "%s%.9g", j ? "," : "", lg[k * V + j]);
        fprintf(f, "]");
    }
    fprintf(f, "]}\n");
    fclose(f);
}

TEST(chain_equals_extend)
{
    CHECK(model != NULL);
    if (!model) return;
    ms_kv_seq q0, q1;
    ms_kv_spec_opts o = {.elem_bytes = 4, .draft_tokens = S + 1};
    ms_kv_cache *c = fam_cache_new_opts(model, o, MS_DT_F32, PS, MAXP, 2, N + 8, &q0, &q1);
    CHECK(c != NULL);
    if (!c) return;
    float *tl = malloc(sizeof(float) * (size_t)V), *th = malloc(sizeof(float) * (size_t)(N * HW));
    float *lg = malloc(sizeof(float) * (size_t)(S * V)),
          *lx = malloc(sizeof(float) * (size_t)(S * V));
    float *hid = malloc(sizeof(float) * (size_t)((N + S) * HW));
    int32_t dt[N + S], drafts[S];
    /* the target's prefill: logits of the last row, the streams of every row */
    ms_batch_seq sq = {.tokens = toks,
                       .n_tokens = N,
                       .start_pos = 0,
                       .kv = &q0,
                       .logits = tl,
                       .n_logits = 1,
                       .kind = MS_SEQ_PREFILL,
                       .hidden = th,
                       .n_hidden = N};
    ms_errbuf err;
    CHECK(ms_model_forward(model, c, &sq, 1, &err) == 0);
    int32_t next = argmax(tl, V);
    /* the chain: the extend (position p: token p + 1, the target's streams at p) ... */
    memcpy(dt, toks + 1, sizeof(int32_t) * (N - 1));
    dt[N - 1] = next;
    memcpy(hid, th, sizeof(float) * (size_t)(N * HW));
    CHECK(draft1(c, &q0, dt, N, 0, hid, 1, lg, hid + (int64_t)N * HW) == 0);
    drafts[0] = dt[N] = argmax(lg, V);
    /* ... then single steps fed the block's own streams */
    for (int k = 1; k < S; k++) {
        float *hin = hid + (int64_t)(N + k - 1) * HW;
        CHECK(draft1(c, &q0, &dt[N + k - 1], 1, N + k - 1, hin, 1, lg + k * V, hin + HW) == 0);
        drafts[k] = dt[N + k] = argmax(lg + k * V, V);
    }
    /* one extend over the same N + S - 1 rows in the other sequence */
    float *hx = malloc(sizeof(float) * (size_t)(S * HW));
    CHECK(draft1(c, &q1, dt, N + S - 1, 0, hid, S, lx, hx) == 0);
    double e = rel_err(lg, lx, S * V), eh = rel_err(hid + (int64_t)(N + 1) * HW, hx + HW, HW);
    CHECKF(e < 1e-5 && eh < 1e-5, "chain vs extend: logits %.3g, streams %.3g", e, eh);
    for (int k = 0; k < S; k++) CHECK(argmax(lx + k * V, V) == drafts[k]);
    dump(drafts, lg, next);
    free_cache(c, &q0, &q1);
    free(tl), free(th), free(lg), free(lx), free(hid), free(hx);
}

/* Plain decoding from a prefill of n0 tokens vs a verify at n0 of [the true
 * token, 3 wrong drafts] that keeps only its first row (the cache truncated
 * to n0 + 1), then steps decode steps each: every step's logits equal, and
 * every stream holds the same pages. */
static void rollback_case(int n0, int steps)
{
    ms_kv_seq q0, q1;
    ms_kv_cache *c = fam_cache_new(model, PS, MAXP, 2, n0 + steps + 8, &q0, &q1);
    CHECK(c != NULL);
    if (!c) return;
    float *la = malloc(sizeof(float) * (size_t)(4 * V)), *lb = malloc(sizeof(float) * (size_t)V);
    CHECK(fam_forward1(model, c, &q0, toks, n0, 0, MS_SEQ_PREFILL, 1, lb, NULL) == 0);
    CHECK(fam_forward1(model, c, &q1, toks, n0, 0, MS_SEQ_PREFILL, 1, lb, NULL) == 0);
    int32_t seq[4] = {argmax(lb, V), 0, 0, 0};
    for (int k = 1; k < 4; k++) seq[k] = (seq[0] + 37 * k) % (int32_t)V; /* not the target's */
    CHECK(fam_forward1(model, c, &q0, seq, 4, n0, MS_SEQ_VERIFY, 4, la, NULL) == 0);
    ms_kv_cache_truncate(c, &q0, n0 + 1), ms_kv_cache_truncate(c, &q1, n0 + 1);
    int32_t t = seq[0];
    double worst = 0;
    int same = 1;
    for (int i = 0; i < steps; i++) {
        int64_t pos = n0 + i;
        CHECK(ms_kv_cache_reserve(c, &q0, pos + 1) == 0 &&
              ms_kv_cache_reserve(c, &q1, pos + 1) == 0);
        if (i > 0) CHECK(fam_forward1(model, c, &q0, &t, 1, pos, MS_SEQ_DECODE, 1, la, NULL) == 0);
        CHECK(fam_forward1(model, c, &q1, &t, 1, pos, MS_SEQ_DECODE, 1, lb, NULL) == 0);
        worst = MS_MAX(worst, rel_err(la, lb, V));
        same &= argmax(la, V) == argmax(lb, V);
        t = argmax(lb, V);
    }
    CHECKF(worst < 1e-5 && same, "prefill %d, verify rejected, %d steps: rel %.3g, greedy %s", n0,
           steps, worst, same ? "same" : "differs");
    for (int s = 0; s < ms_kv_cache_spec(c)->n_streams; s++)
        CHECKF(q0.n_pages[s] == q1.n_pages[s],
               "stream %d: %lld pages after the rollback, %lld plain", s, (long long)q0.n_pages[s],
               (long long)q1.n_pages[s]);
    free_cache(c, &q0, &q1);
    free(la), free(lb);
}

TEST(rejected_verify_rolls_back)
{
    CHECK(model != NULL);
    if (!model) return;
    rollback_case(9, 12);   /* rejected rows 10..12 close the window 8..11: ratio 4 */
    rollback_case(125, 12); /* rejected rows 126..128 close 0..127: ratio 128 */
    rollback_case(138, 12); /* the 140-token prompt's boundary */
}

/* --speculative-token-map on the MTP block: the draft head over a map's ids
 * gives the full head's logits at those ids (its rows rounded to BF16: within
 * 2e-2 of the largest), so the draft's argmax through the map is the full
 * head's over the map's ids where that one leads by more than the rounding.
 * Last: the model keeps the map. */
TEST(token_map_head)
{
    CHECK(model != NULL);
    if (!model) return;
    enum { NM = 48 };
    int32_t ids[NM];
    for (int j = 0; j < NM; j++) ids[j] = (int32_t)((V - 1 - 7 * j) % V); /* not 0..NM-1 */
    float *tl = malloc(sizeof(float) * (size_t)V), *th = malloc(sizeof(float) * (size_t)(N * HW));
    float *lg = malloc(sizeof(float) * (size_t)V), *lm = malloc(sizeof(float) * NM);
    float *h1 = malloc(sizeof(float) * (size_t)HW), *h2 = malloc(sizeof(float) * (size_t)HW);
    int32_t dt[N];
    ms_kv_seq q0, q1;
    ms_kv_spec_opts o = {.elem_bytes = 4, .draft_tokens = S + 1};
    ms_kv_cache *c = fam_cache_new_opts(model, o, MS_DT_F32, PS, MAXP, 2, N + 8, &q0, &q1);
    CHECK(c && tl && th && lg && lm && h1 && h2);
    if (!c) return;
    ms_batch_seq sq = {.tokens = toks,
                       .n_tokens = N,
                       .start_pos = 0,
                       .kv = &q0,
                       .logits = tl,
                       .n_logits = 1,
                       .kind = MS_SEQ_PREFILL,
                       .hidden = th,
                       .n_hidden = N};
    ms_errbuf err;
    CHECK(ms_model_forward(model, c, &sq, 1, &err) == 0);
    memcpy(dt, toks + 1, sizeof(int32_t) * (N - 1));
    dt[N - 1] = argmax(tl, V);
    CHECK(draft1(c, &q0, dt, N, 0, th, 1, lg, h1) == 0);
    CHECK(ms_model_set_draft_vocab(model, ids, NM, &err) == 0);
    const int32_t *vm;
    CHECK(ms_model_draft_vocab(model, &vm) == NM && vm && vm[1] == ids[1]);
    CHECK(draft1(c, &q1, dt, N, 0, th, 1, lm, h2) == 0);
    double big = 0, worst = 0;
    int best = 0;
    for (int j = 0; j < NM; j++) {
        big = MS_MAX(big, fabs(lg[ids[j]]));
        worst = MS_MAX(worst, fabs(lm[j] - lg[ids[j]]));
        if (lg[ids[j]] > lg[ids[best]]) best = j;
    }
    double second = -1e30;
    for (int j = 0; j < NM; j++)
        if (j != best) second = MS_MAX(second, lg[ids[j]]);
    fprintf(stderr, "  token map head: %d ids, max |map - full| / max |full| = %.3g\n", NM,
            worst / big);
    CHECKF(worst <= 2e-2 * big, "map logits vs the full head's at its ids: %.3g of %.3g", worst,
           big);
    if (lg[ids[best]] - second > 4e-2 * big) CHECK(argmax(lm, NM) == best);
    CHECK(rel_err(h2, h1, HW) < 1e-6); /* the streams do not depend on the head */
    free_cache(c, &q0, &q1);
    free(tl), free(th), free(lg), free(lm), free(h1), free(h2);
}

int main(void)
{
    uint64_t st = 3;
    for (int i = 0; i < N + 64; i++) toks[i] = (int32_t)(ms_rng_uniform(&st) * 1000) + 2;
    ms_errbuf err;
    snprintf(dir, sizeof dir, "/tmp/ms_v4_draft_XXXXXX");
    if (!mkdtemp(dir) || ms_mkmodel_v4_write("tiny-v4", MS_MK_FP32, 5, dir, 0, &err))
        fprintf(stderr, "cannot build tiny-v4\n");
    ms_model_opts mo = {.threads = 2, .exact = 1};
    if (ms_model_open(&model, dir, &mo, &err)) fprintf(stderr, "open: %s\n", err.msg), model = NULL;
    if (model) V = ms_model_shape_of(model)->vocab, HW = ms_model_draft_hidden_width(model);
    RUN(chain_equals_extend);
    RUN(rejected_verify_rolls_back);
    RUN(token_map_head);
    ms_model_free(model);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (dir[0] && system(cmd) != 0) fprintf(stderr, "cannot remove the model\n");
    return TEST_REPORT();
}
