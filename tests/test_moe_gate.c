/* test_moe_gate.c — DeepSeek gate routing on hand-made cases (moe.h). */
#include "harness.h"
#include "moe/moe.h"

#include <math.h>
#include <string.h>

static ms_config gate_cfg(int E, int G, int TG, int K, int score, int method, int norm, float s)
{
    ms_config c;
    memset(&c, 0, sizeof c);
    c.n_routed_experts = E;
    c.n_group = G;
    c.topk_group = TG;
    c.n_experts_per_tok = K;
    c.scoring_func = score;
    c.topk_method = method;
    c.norm_topk_prob = norm;
    c.routed_scaling_factor = s;
    return c;
}

static float sigm(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

TEST(noaux_tc_groups_by_top2_sum_and_bias_selects_only)
{
    /* 8 experts in 4 groups of 2; keep 2 groups; top-2.
     * group sums (biased): g0 = e0+e1, ... make group 3 best by sum though e0 is the single max */
    ms_config c = gate_cfg(8, 4, 2, 2, MS_SCORE_SIGMOID, MS_TOPK_NOAUX_TC, 1, 2.5f);
    float logits[8] = {3.0f, -3.0f, 0.5f, 0.4f, -1.0f, -1.0f, 1.0f, 1.0f};
    float bias[8] = {0, 0, 0, 0, 0, 0, 0, 0.2f};
    int32_t idx[2];
    float w[2], scratch[16];
    ms_moe_gate_route(&c, logits, bias, idx, w, scratch);
    /* group sums: g0 = s(3)+s(-3) = 1.0, g1 = s(.5)+s(.4) = 1.221, g2 = 0.538, g3 = s(1)+s(1)+.2
     * = 1.662 kept groups: g3, g1 -> candidates e6 (.731), e7 (.731+.2), e2 (.622), e3 (.599) */
    CHECK(idx[0] == 7 && idx[1] == 6);
    /* weights from unbiased scores, renormalised, times 2.5 */
    CHECK_NEAR(w[0], 1.25, 1e-6);
    CHECK_NEAR(w[1], 1.25, 1e-6);
}

TEST(noaux_tc_weights_unbiased_renormalised)
{
    ms_config c = gate_cfg(8, 1, 1, 3, MS_SCORE_SIGMOID, MS_TOPK_NOAUX_TC, 1, 2.0f);
    float logits[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    float bias[8] = {1.0f, 0, 0, 0, 0, 0, 0, 0};
    int32_t idx[3];
    float w[3], scratch[16];
    ms_moe_gate_route(&c, logits, bias, idx, w, scratch);
    CHECK(idx[0] == 0 && idx[1] == 7 && idx[2] == 6);
    float s0 = sigm(0.1f), s7 = sigm(0.8f), s6 = sigm(0.7f), sum = s0 + s7 + s6;
    CHECK_NEAR(w[0], 2.0f * s0 / sum, 1e-6);
    CHECK_NEAR(w[1], 2.0f * s7 / sum, 1e-6);
    CHECK_NEAR(w[2], 2.0f * s6 / sum, 1e-6);
}

TEST(group_limited_greedy_uses_group_max_softmax_no_renorm)
{
    ms_config c = gate_cfg(6, 3, 1, 2, MS_SCORE_SOFTMAX, MS_TOPK_GROUP_LIMITED, 0, 16.0f);
    /* groups {0,1} {2,3} {4,5}: max in g1 is highest (e3) though g0 has larger sum */
    float logits[6] = {1.9f, 1.9f, -5.0f, 2.0f, 0.0f, 0.0f};
    int32_t idx[2];
    float w[2], scratch[12];
    ms_moe_gate_route(&c, logits, NULL, idx, w, scratch);
    CHECK(idx[0] == 3 && idx[1] == 2);
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(logits[i]);
    CHECK_NEAR(w[0], 16.0 * exp(2.0) / z, 1e-5);
    CHECK_NEAR(w[1], 16.0 * exp(-5.0) / z, 1e-7);
}

TEST(greedy_topk_ties_lowest_index)
{
    ms_config c = gate_cfg(4, 1, 1, 2, MS_SCORE_SOFTMAX, MS_TOPK_GREEDY, 0, 1.0f);
    float logits[4] = {1, 2, 2, 0};
    int32_t idx[2];
    float w[2], scratch[8];
    ms_moe_gate_route(&c, logits, NULL, idx, w, scratch);
    CHECK(idx[0] == 1 && idx[1] == 2);
}

int main(void)
{
    RUN(noaux_tc_groups_by_top2_sum_and_bias_selects_only);
    RUN(noaux_tc_weights_unbiased_renormalised);
    RUN(group_limited_greedy_uses_group_max_softmax_no_renorm);
    RUN(greedy_topk_ties_lowest_index);
    return TEST_REPORT();
}
