/* test_sample.c — serve/sample.c: the per-request pick after a forward
 * (penalties over the request's history, its seeded RNG, log-probabilities
 * from the model's own distribution), and that a sequence without logits
 * is not picked and its RNG not advanced. */
#include "harness.h"
#include "serve/sample.h"

#include <math.h>

#define V 8

TEST(greedy_penalties_and_logprobs)
{
    ms_sample *s;
    ms_errbuf err;
    CHECK(ms_sample_new(&s, V, &err) == 0);
    float lg[V] = {0, 3, 2.5f, 0, 0, 0, 0, 1};
    int32_t hist[4] = {5, 6, 1, 1}; /* prompt 5, 6; generated 1, 1 */
    ms_sampler_params greedy = {.temperature = 0, .top_p = 1};
    ms_sampler_params pen = {.temperature = 0, .top_p = 1, .frequency_penalty = 0.5f};
    uint64_t r1 = ms_sample_seed(1), r2 = ms_sample_seed(1), r3 = ms_sample_seed(1);
    ms_sample_seq q[3] = {{.logits = lg,
                           .params = &greedy,
                           .rng = &r1,
                           .ids = hist,
                           .n_prompt = 2,
                           .n_ids = 4,
                           .top_logprobs = 2},
                          /* token 1 generated twice: 3 - 2 × 0.5 = 2 < 2.5, token 2 wins */
                          {.logits = lg,
                           .params = &pen,
                           .rng = &r2,
                           .ids = hist,
                           .n_prompt = 2,
                           .n_ids = 4,
                           .top_logprobs = 0},
                          {.logits = NULL,
                           .params = &greedy,
                           .rng = &r3,
                           .ids = hist,
                           .n_prompt = 2,
                           .n_ids = 4,
                           .top_logprobs = 0}};
    ms_sample_pick p[3];
    ms_sample_batch(s, q, 3, p);
    CHECK(p[0].token == 1 && p[1].token == 2 && p[2].token == -1);
    CHECK(r3 == ms_sample_seed(1)); /* nothing picked, RNG untouched */
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(lg[i]);
    /* the reported log-probabilities are the model's, before penalties */
    CHECK_NEAR(p[1].logprob, 2.5 - log(z), 1e-5);
    CHECK(p[0].n_top == 2 && p[0].top_ids[0] == 1 && p[0].top_ids[1] == 2);
    CHECK_NEAR(p[0].top_lps[0], 3 - log(z), 1e-5);
    CHECK(lg[1] == 3); /* the logits are never written */
    ms_sample_free(s);
}

TEST(seeded_rng_reproduces)
{
    ms_sample *s;
    ms_errbuf err;
    CHECK(ms_sample_new(&s, V, &err) == 0);
    float lg[V] = {1, 1, 1, 1, 1, 1, 1, 1};
    ms_sampler_params t1 = {.temperature = 1.0f, .top_p = 1};
    uint64_t a = ms_sample_seed(42), b = ms_sample_seed(42), c = ms_sample_seed(43);
    ms_sample_seq q[3] = {{.logits = lg, .params = &t1, .rng = &a, .top_logprobs = -1},
                          {.logits = lg, .params = &t1, .rng = &b, .top_logprobs = -1},
                          {.logits = lg, .params = &t1, .rng = &c, .top_logprobs = -1}};
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 32; i++) {
        ms_sample_pick p[3];
        ms_sample_batch(s, q, 3, p);
        same_ab &= p[0].token == p[1].token;
        same_ac &= p[0].token == p[2].token;
        CHECK(p[0].token >= 0 && p[0].token < V && p[0].n_top == 0);
    }
    CHECK(same_ab && !same_ac);
    ms_sample_free(s);
}

int main(void)
{
    RUN(greedy_penalties_and_logprobs);
    RUN(seeded_rng_reproduces);
    return TEST_REPORT();
}
