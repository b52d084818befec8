/* mkmodel_skew.c — a router bias that skews expert load (mkmodel.h, --route-skew S):
 * expert e's share of the (token, top-k) hits ∝ (e + 1)^-S (capped at 1/k, the most
 * one expert can take), reached by calibrating e_score_correction_bias on seeded
 * unit-variance gate inputs: the bias moves by step · log(target / share) for a fixed
 * number of rounds, the step halving every quarter.  Real hidden states are not
 * Gaussian, so served skew is close to, not equal to, the target. */
#include "tools/mkmodel.h"

#include "base/util.h"
#include "moe/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SKEW_SAMPLES 2048
#define SKEW_ROUNDS  160

/* target[E]: ∝ (e + 1)^-S, no entry above 1/K (the excess spread over the rest) */
static void skew_target(int E, int K, double S, double *t)
{
    double cap = 1.0 / K;
    int *fixed = calloc((size_t)E, sizeof(int));
    for (int e = 0; e < E; e++) t[e] = pow(e + 1.0, -S);
    for (int iter = 0; iter < E; iter++) {
        double free_sum = 0, fixed_sum = 0;
        for (int e = 0; e < E; e++) {
            if (fixed && fixed[e])
                fixed_sum += cap;
            else
                free_sum += pow(e + 1.0, -S);
        }
        int changed = 0;
        for (int e = 0; e < E; e++) {
            if (fixed && fixed[e]) continue;
            t[e] = pow(e + 1.0, -S) / free_sum * (1.0 - fixed_sum);
            if (t[e] > cap && fixed) fixed[e] = changed = 1;
        }
        if (!changed) break;
    }
    for (int e = 0; e < E; e++)
        if (fixed && fixed[e]) t[e] = cap;
    free(fixed);
}

int ms_mkmodel_skew_bias(const ms_config *c, const float *gate, double S, uint64_t seed,
                         float *bias, double *max_err)
{
    int E = c->n_routed_experts, K = c->n_experts_per_tok, D = c->hidden_size;
    float *logits = malloc(sizeof(float) * (size_t)SKEW_SAMPLES * E);
    float *x = malloc(sizeof(float) * (size_t)D), *scratch = malloc(sizeof(float) * 2 * (size_t)E);
    float *w = malloc(sizeof(float) * (size_t)K);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)K);
    double *target = malloc(sizeof(double) * (size_t)E), *cnt = malloc(sizeof(double) * (size_t)E);
    int rc = 0;
    if (!logits || !x || !scratch || !w || !idx || !target || !cnt) {
        rc = MS_ENOMEM;
        goto out;
    }
    uint64_t st = seed ^ 0x5ca1ab1e5eedull;
    for (int s = 0; s < SKEW_SAMPLES; s++) {
        for (int d = 0; d < D; d += 2) { /* Box-Muller: unit-variance gate inputs */
            double u1 = ms_rng_uniform(&st), u2 = ms_rng_uniform(&st);
            double r = sqrt(-2.0 * log(u1 > 1e-300 ? u1 : 1e-300));
            x[d] = (float)(r * cos(6.283185307179586 * u2));
            if (d + 1 < D) x[d + 1] = (float)(r * sin(6.283185307179586 * u2));
        }
        for (int e = 0; e < E; e++) {
            double a = 0;
            for (int d = 0; d < D; d++) a += (double)gate[(size_t)e * D + d] * x[d];
            logits[(size_t)s * E + e] = (float)a;
        }
    }
    skew_target(E, K, S, target);
    for (int e = 0; e < E; e++) bias[e] = 0.0f;
    double step = 0.2;
    for (int round = 0; round <= SKEW_ROUNDS; round++) {
        for (int e = 0; e < E; e++) cnt[e] = 0;
        for (int s = 0; s < SKEW_SAMPLES; s++) {
            ms_moe_gate_route(c, logits + (size_t)s * E, bias, idx, w, scratch);
            for (int k = 0; k < K; k++) cnt[idx[k]] += 1.0;
        }
        double worst = 0;
        for (int e = 0; e < E; e++) {
            double share = cnt[e] / ((double)SKEW_SAMPLES * K);
            worst = fmax(worst, fabs(share - target[e]));
            if (round < SKEW_ROUNDS)
                bias[e] += (float)(step * log(target[e] / fmax(share, 0.25 / SKEW_SAMPLES)));
        }
        if (max_err) *max_err = worst;
        if ((round + 1) % (SKEW_ROUNDS / 4) == 0) step *= 0.5;
    }
out:
    free(logits);
    free(x);
    free(scratch);
    free(w);
    free(idx);
    free(target);
    free(cnt);
    return rc;
}
