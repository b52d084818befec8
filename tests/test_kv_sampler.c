/* test_kv_sampler.c — KV pool page accounting and the sampler. */
#include "base/util.h"
#include "cache/kv_pool.h"
#include "harness.h"
#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

TEST(kv_pool_alloc_ref_free)
{
    ms_kv_pool *p;
    ms_errbuf e;
    CHECK(ms_kv_pool_new(&p, 3, 10, 4, 5, MS_DT_BF16, &e) == 0);
    CHECK(ms_kv_bytes_per_token(3, 10, MS_DT_BF16) == 60);
    int32_t pg[6];
    CHECK(ms_kv_pool_alloc(p, 6, pg) == MS_EFULL);
    CHECK(ms_kv_pool_n_free(p) == 5);
    CHECK(ms_kv_pool_alloc(p, 3, pg) == 0);
    CHECK(pg[0] != pg[1] && pg[1] != pg[2] && pg[0] != pg[2]);
    CHECK(ms_kv_pool_n_free(p) == 2);
    ms_kv_pool_ref(p, pg[1]);
    ms_kv_pool_unref(p, pg[1]);
    CHECK(ms_kv_pool_n_free(p) == 2);
    ms_kv_pool_unref(p, pg[1]);
    CHECK(ms_kv_pool_n_free(p) == 3);
    /* rows of different layers/pages do not overlap */
    uint8_t *a = ms_kv_pool_row(p, 0, pg[0], 3), *b = ms_kv_pool_row(p, 1, pg[0], 0);
    CHECK(b - a >= 20);
    ms_mat m = ms_kv_pool_page_mat(p, 2, pg[2], 4);
    CHECK(m.rows == 4 && m.cols == 10 && m.dtype == MS_DT_BF16);
    ms_kv_pool_free(p);
    ms_kv_pool_free(NULL);
    CHECK(ms_kv_pool_new(&p, 0, 10, 4, 5, MS_DT_BF16, &e) == MS_EINVAL);
}

/* The blocked argmax equals the plain first-best scan, ties, NaNs and odd
 * lengths included. */
TEST(sampler_argmax_matches_scan)
{
    uint64_t rng = 7;
    float lg[1000];
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(ms_rng_next(&rng) % 1000);
        for (int i = 0; i < n; i++) lg[i] = (float)(ms_rng_next(&rng) % 50) - 25; /* many ties */
        if (trial % 3 == 1) lg[ms_rng_next(&rng) % n] = NAN;
        if (trial % 10 == 2) lg[0] = NAN;
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (lg[i] > lg[best]) best = i;
        CHECKF(ms_sampler_argmax(lg, n) == best, "trial %d n %d: %d vs %d", trial, n,
               ms_sampler_argmax(lg, n), best);
    }
}

TEST(sampler_greedy_and_seeded)
{
    float lg[6] = {0.1f, 2.0f, 2.0f, -1.0f, 0.5f, 1.9f};
    CHECK(ms_sampler_argmax(lg, 6) == 1);
    float prob[6];
    int32_t idx[6];
    ms_sampler_scratch sc = {prob, idx};
    ms_sampler_params greedy = {.temperature = 0, .top_p = 1};
    uint64_t r = ms_sampler_seed(1);
    CHECK(ms_sampler_pick(lg, 6, &greedy, &r, &sc) == 1);
    /* top-k 1 is greedy; top-p tiny keeps only the best */
    ms_sampler_params s = {.temperature = 1.0f, .top_p = 1e-3f};
    for (int i = 0; i < 50; i++) CHECK(ms_sampler_pick(lg, 6, &s, &r, &sc) == 1);
    /* top-k 3 never picks outside {1, 2, 5}; same seed -> same stream */
    ms_sampler_params k3 = {.temperature = 1.0f, .top_p = 1.0f, .top_k = 3};
    uint64_t r1 = ms_sampler_seed(7), r2 = ms_sampler_seed(7);
    int hist[6] = {0};
    for (int i = 0; i < 2000; i++) {
        int32_t a = ms_sampler_pick(lg, 6, &k3, &r1, &sc),
                b = ms_sampler_pick(lg, 6, &k3, &r2, &sc);
        CHECK(a == b);
        hist[a]++;
    }
    CHECK(hist[0] == 0 && hist[3] == 0 && hist[4] == 0);
    /* frequencies follow softmax over the kept three: e^2 : e^2 : e^1.9 */
    double z = 2 * exp(2.0) + exp(1.9);
    CHECK(fabs(hist[1] / 2000.0 - exp(2.0) / z) < 0.05);
    CHECK(fabs(hist[5] / 2000.0 - exp(1.9) / z) < 0.05);
}

TEST(sampler_logprobs)
{
    float lg[4] = {1, 2, 3, 4};
    double z = exp(1) + exp(2) + exp(3) + exp(4);
    CHECK_NEAR(ms_sampler_logprob(lg, 4, 2), 3 - log(z), 1e-6);
    int32_t ids[3];
    float lps[3];
    ms_sampler_top_logprobs(lg, 4, 3, ids, lps);
    CHECK(ids[0] == 3 && ids[1] == 2 && ids[2] == 1);
    CHECK_NEAR(lps[0], 4 - log(z), 1e-6);
}

int main(void)
{
    RUN(kv_pool_alloc_ref_free);
    RUN(sampler_argmax_matches_scan);
    RUN(sampler_greedy_and_seeded);
    RUN(sampler_logprobs);
    return TEST_REPORT();
}
