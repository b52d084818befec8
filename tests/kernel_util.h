/* kernel_util.h — what the kernel tests (test_kernels.c, test_kernels_avx2.c)
 * share: random values, stored matrices of each dtype (FP8 scales and
 * plain-row flags, FP4 scales, as the loader gives them), the relative error
 * against a reference, and x rounded as AVX2's int16 FP4 product holds it.
 * Include after harness.h. */
#ifndef MS_TESTS_KERNEL_UTIL_H
#define MS_TESTS_KERNEL_UTIL_H

#include "base/util.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline float frand(uint64_t *s)
{
    return (float)(ms_rng_uniform(s) * 2.0 - 1.0);
}

/* A stored [R][C] matrix of dtype dt with random values (and FP8 scales and
 * plain-row flags, as the model loader gives them). */
typedef struct stored {
    ms_mat whole;
    void *data;
    float *scale;
    uint8_t *plain;
} stored;

/* FP4: random codes (C even) and UE8M0 scales around 2^-4 (exponents 119 ..
 * 127), as a V4 expert's. */
static inline void stored_make_fp4(stored *st, int64_t R, int64_t C, uint64_t *rng)
{
    int64_t sld = (C + 31) / 32;
    st->data = malloc((size_t)(R * C / 2));
    st->scale = malloc((size_t)(R * sld)); /* UE8M0 bytes, freed by stored_free */
    for (int64_t i = 0; i < R * C / 2; i++)
        ((uint8_t *)st->data)[i] = (uint8_t)(ms_rng_next(rng) >> 24);
    for (int64_t i = 0; i < R * sld; i++)
        ((uint8_t *)st->scale)[i] = (uint8_t)(119 + ms_rng_next(rng) % 9);
    st->whole = ms_mat_fp4(R, C, st->data, (const uint8_t *)st->scale);
    st->plain = NULL;
}

static inline void stored_make(stored *st, ms_dtype dt, int64_t R, int64_t C, uint64_t *rng)
{
    if (dt == MS_DT_F4E2M1) {
        stored_make_fp4(st, R, C, rng);
        return;
    }
    int es = ms_dtype_size(dt);
    st->data = malloc((size_t)(R * C * es));
    int64_t sr = (R + 127) / 128, sc = (C + 127) / 128;
    st->scale = malloc(sizeof(float) * (size_t)(sr * sc));
    for (int64_t i = 0; i < sr * sc; i++)
        st->scale[i] = (float)(0.001 + 0.01 * ms_rng_uniform(rng));
    for (int64_t i = 0; i < R * C; i++) {
        float v = frand(rng);
        switch (dt) {
        case MS_DT_F32:
            ((float *)st->data)[i] = v;
            break;
        case MS_DT_BF16:
            ((uint16_t *)st->data)[i] = ms_f32_to_bf16(v);
            break;
        case MS_DT_F16:
            ((uint16_t *)st->data)[i] = ms_f32_to_f16(v);
            break;
        default:
            ((uint8_t *)st->data)[i] = ms_f32_to_fp8e4m3(v * 448.0f);
            break;
        }
    }
    st->whole = ms_mat_whole(dt, R, C, st->data, dt == MS_DT_F8E4M3 ? st->scale : NULL);
    st->plain = NULL;
    if (dt == MS_DT_F8E4M3) {
        st->plain = malloc((size_t)R);
        ms_mat_f8_scan(&st->whole, st->plain);
        st->whole.f8_plain = st->plain;
    }
}

static inline void stored_free(stored *st)
{
    ms_kernels_dnnl_forget(st->data);
    free(st->data);
    free(st->scale);
    free(st->plain);
}

static inline double rel_err(const float *a, const float *b, int64_t M, int64_t N, int64_t ld)
{
    double mx = 0, mref = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double d = fabs((double)a[i * ld + j] - (double)b[i * ld + j]);
            if (!(d <= mx)) mx = d; /* NaN propagates */
            if (fabs(b[i * ld + j]) > mref) mref = fabs(b[i * ld + j]);
        }
    return mref > 0 ? mx / mref : mx;
}

/* x as AVX2 auto mode's one-row FP4 GEMV holds it (mm_avx2.c): each
 * 32-value block rounded to int16 steps of amax / 32767, in the kernel's
 * float operations. */
static inline void round_i16_blocks(float *xr, const float *x, int64_t K)
{
    for (int64_t g = 0; g < K; g += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[g + i]));
        const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f, step = amax / 32767.0f;
        for (int i = 0; i < 32; i++) xr[g + i] = (float)lrintf(x[g + i] * inv) * step;
    }
}

#endif
