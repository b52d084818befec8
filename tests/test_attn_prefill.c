/* test_attn_prefill.c — the fused causal prefill attention against its
 * reference twin at awkward shapes (one query, tails of the 64-key blocks and
 * 24-row items, dv not a multiple of 16, a chunk after a cached prefix), at one
 * and two threads; a row's output has the same bits for any chunking of the
 * prompt and thread count; the reference on cases with a known answer. */
#include "base/util.h"
#include "harness.h"
#include "kernels/attn_prefill.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One head group's keys and values at positions 0 .. S-1, and the queries of
 * positions 0 .. S-1 (rows ldq apart, padded). */
typedef struct pcase {
    int64_t hg, qd, dv, S, ldq, ldo;
    float *q, *k, *v; /* [S][ldq], [hg][S][qd], [hg][S][dv] */
} pcase;

static void pcase_init(pcase *c, int64_t hg, int64_t qd, int64_t dv, int64_t S, uint64_t seed)
{
    uint64_t rng = seed;
    *c = (pcase){hg, qd, dv, S, hg * qd + 3, hg * dv + 5, NULL, NULL, NULL};
    c->q = malloc(sizeof(float) * (size_t)(S * c->ldq));
    c->k = malloc(sizeof(float) * (size_t)(hg * S * qd));
    c->v = malloc(sizeof(float) * (size_t)(hg * S * dv));
    if (!c->q || !c->k || !c->v) abort();
    for (int64_t i = 0; i < S * c->ldq; i++) c->q[i] = (float)(2 * ms_rng_uniform(&rng) - 1);
    for (int64_t i = 0; i < hg * S * qd; i++) c->k[i] = (float)(2 * ms_rng_uniform(&rng) - 1);
    for (int64_t i = 0; i < hg * S * dv; i++) c->v[i] = (float)(2 * ms_rng_uniform(&rng) - 1);
}

static void pcase_free(pcase *c)
{
    free(c->q), free(c->k), free(c->v);
}

/* Queries [p0, p0 + n) of the case into out [n][ldo]: the kernel's layout of
 * keys (transposed, rows p0 + n apart) and values built for that length. */
static void run(const pcase *c, int64_t p0, int64_t n, int threads, int ref, int isa, float *out)
{
    int64_t S = p0 + n, S64 = ms_attn_prefill_keys(S), hg = c->hg, qd = c->qd, dv = c->dv;
    float *kt = calloc((size_t)(hg * qd * S64), sizeof(float)),
          *vt = malloc(sizeof(float) * (size_t)(hg * S * dv));
    if (!kt || !vt) abort();
    for (int64_t b = 0; b < hg; b++)
        for (int64_t s = 0; s < S; s++) {
            for (int64_t i = 0; i < qd; i++)
                kt[b * S64 * qd + ms_attn_prefill_kt_at(qd, i, s)] = c->k[(b * c->S + s) * qd + i];
            memcpy(vt + (b * S + s) * dv, c->v + (b * c->S + s) * dv, sizeof(float) * (size_t)dv);
        }
    ms_attn_prefill a = {c->q + p0 * c->ldq, c->ldq, kt, vt, out, c->ldo, hg, qd, dv, p0, n, 0.7f};
    if (ref) {
        ms_attn_prefill_ref(&a);
    } else {
        ms_pool *pool = ms_pool_new(threads);
        ms_kctx k = {pool, 1, isa, 0};
        ms_attn_prefill_run(&k, &a);
        ms_pool_free(pool);
    }
    free(kt), free(vt);
}

static double rel_err(const float *a, const float *b, int64_t rows, int64_t ld, int64_t w)
{
    double mx = 0, ref = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < w; i++) {
            mx = fmax(mx, fabs((double)a[r * ld + i] - b[r * ld + i]));
            ref = fmax(ref, fabs((double)b[r * ld + i]));
        }
    return mx / (ref > 0 ? ref : 1);
}

static float *rows_alloc(const pcase *c, int64_t n)
{
    float *p = calloc((size_t)(n * c->ldo), sizeof(float));
    if (!p) abort();
    return p;
}

/* The reference where the answer is known: one key gives its value; equal
 * keys give the mean of the values seen. */
TEST(prefill_reference_known_answers)
{
    pcase c;
    pcase_init(&c, 2, 5, 3, 4, 1);
    float *out = rows_alloc(&c, 4);
    run(&c, 0, 1, 1, 1, 0, out);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 3; i++) CHECK(fabsf(out[b * 3 + i] - c.v[b * 4 * 3 + i]) < 1e-6f);
    for (int64_t i = 0; i < 2 * 4 * 5; i++) c.k[i] = 0.25f; /* every score equal */
    run(&c, 0, 4, 1, 1, 0, out);
    for (int64_t i = 0; i < 3; i++) { /* head 0, query 2: the mean of values 0..2 */
        float mean = (c.v[i] + c.v[3 + i] + c.v[6 + i]) / 3;
        CHECK(fabsf(out[2 * c.ldo + i] - mean) < 1e-6f);
    }
    free(out);
    pcase_free(&c);
}

/* The ISAs whose fused kernels run here: AVX2's, and AVX-512's where it exists. */
static int isas(int *out)
{
    int best = ms_kernels_detect(), n = 0;
    if (best >= MS_ISA_AVX2) out[n++] = MS_ISA_AVX2;
    if (best >= MS_ISA_AVX512) out[n++] = best;
    return n;
}

TEST(prefill_fused_matches_reference)
{
    int isa[2], ni = isas(isa);
    if (!ni) {
        fprintf(stderr, "  (no AVX2 here: the fused prefill kernel is not used)\n");
        return;
    }
    /* hg, qd, dv, p0, n: small-v3's 96 / 64, V3's 192 / 128, odd shapes */
    static const int64_t cases[][5] = {
        {1, 96, 64, 0, 1},    {2, 96, 64, 0, 100}, {3, 96, 64, 37, 200}, {2, 192, 128, 0, 130},
        {1, 33, 48, 5, 67},   {2, 17, 200, 0, 90}, {1, 96, 64, 1000, 7}, {4, 96, 64, 63, 65},
        {1, 8, 256, 129, 31}, {2, 96, 64, 0, 301},
    };
    for (int ii = 0; ii < ni; ii++)
        for (size_t t = 0; t < MS_ARRAY_LEN(cases); t++) {
            const int64_t *cs = cases[t];
            pcase c;
            pcase_init(&c, cs[0], cs[1], cs[2], cs[3] + cs[4], 100 + t);
            float *got = rows_alloc(&c, cs[4]), *want = rows_alloc(&c, cs[4]);
            run(&c, cs[3], cs[4], 1 + (int)(t % 2), 0, isa[ii], got);
            run(&c, cs[3], cs[4], 1, 1, 0, want);
            double e = rel_err(got, want, cs[4], c.ldo, c.hg * c.dv);
            free(got), free(want);
            pcase_free(&c);
            CHECKF(e < 1e-5, "isa %s case %zu (hg %lld qd %lld dv %lld p0 %lld n %lld): rel err %g",
                   ms_isa_name(isa[ii]), t, (long long)cs[0], (long long)cs[1], (long long)cs[2],
                   (long long)cs[3], (long long)cs[4], e);
        }
}

/* A prompt of 300 tokens in one chunk at one thread, against chunks of
 * 1 + 100 + 77 + 122 rows at two threads: every output has the same bits
 * (each ISA's kernel against itself). */
TEST(prefill_fused_chunking_invariant)
{
    int isa[2], ni = isas(isa);
    for (int ii = 0; ii < ni; ii++) {
        pcase c;
        pcase_init(&c, 3, 96, 64, 300, 9);
        float *whole = rows_alloc(&c, 300), *parts = rows_alloc(&c, 300);
        run(&c, 0, 300, 1, 0, isa[ii], whole);
        static const int64_t cuts[] = {0, 1, 101, 178, 300};
        for (size_t i = 0; i + 1 < MS_ARRAY_LEN(cuts); i++)
            run(&c, cuts[i], cuts[i + 1] - cuts[i], 2, 0, isa[ii], parts + cuts[i] * c.ldo);
        int same = 1;
        for (int64_t r = 0; r < 300; r++)
            same &= !memcmp(whole + r * c.ldo, parts + r * c.ldo, sizeof(float) * (size_t)(3 * 64));
        free(whole), free(parts);
        pcase_free(&c);
        CHECKF(same, "isa %s", ms_isa_name(isa[ii]));
    }
}

int main(void)
{
    RUN(prefill_reference_known_answers);
    RUN(prefill_fused_matches_reference);
    RUN(prefill_fused_chunking_invariant);
    return TEST_REPORT();
}
