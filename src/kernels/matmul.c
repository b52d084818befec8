/* matmul.c — ms_matmul / ms_matmul_nn dispatch and the portable FP32 path.
 * Splits the output columns over the pool; each thread converts one weight row
 * at a time to f32 and takes dot products with every activation row. */
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

int ms_kernels_detect(void)
{
    const char *env = getenv("MOESERVE_ISA");
    __builtin_cpu_init();
    int best = MS_ISA_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = MS_ISA_AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) best = MS_ISA_AVX512;
    if (best == MS_ISA_AVX512 && __builtin_cpu_supports("avx512bf16")) best = MS_ISA_AVX512BF16;
    if (env) {
        int want = !strcmp(env, "scalar") ? MS_ISA_SCALAR
                   : !strcmp(env, "avx2") ? MS_ISA_AVX2
                   : !strcmp(env, "avx512") ? MS_ISA_AVX512
                                            : MS_ISA_AVX512BF16;
        if (want < best) best = want;
    }
    return best;
}

const char *ms_isa_name(int isa)
{
    static const char *n[] = {"scalar", "avx2", "avx512", "avx512bf16"};
    return isa >= 0 && isa <= 3 ? n[isa] : "?";
}

struct mm_job {
    float *y;
    int64_t ldy;
    const float *x;
    int64_t ldx, M;
    const ms_mat *W;
    int accumulate;
};

static void row_to_f32(const ms_mat *W, int64_t r, float *out)
{
    for (int64_t c = 0; c < W->cols; c++) out[c] = ms_mat_get(W, r, c);
}

static void mm_worker(void *arg, int tid, int nt)
{
    struct mm_job *j = arg;
    int64_t b, e;
    ms_pool_range(j->W->rows, tid, nt, 16, &b, &e);
    float *wrow = malloc(sizeof(float) * (size_t)(j->W->cols > 0 ? j->W->cols : 1));
    if (!wrow) abort();
    for (int64_t n = b; n < e; n++) {
        const float *w = wrow;
        if (j->W->dtype == MS_DT_F32) w = (const float *)j->W->data + n * j->W->ld;
        else row_to_f32(j->W, n, wrow);
        for (int64_t i = 0; i < j->M; i++) {
            float s = ms_dot_f32(j->x + i * j->ldx, w, j->W->cols);
            float *yo = j->y + i * j->ldy + n;
            *yo = j->accumulate ? *yo + s : s;
        }
    }
    free(wrow);
}

void ms_matmul(const ms_kctx *k, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
               const ms_mat *W, int accumulate)
{
    if (M <= 0 || W->rows <= 0) return;
    struct mm_job j = {y, ldy, x, ldx, M, W, accumulate};
    ms_pool_run(k ? k->pool : NULL, mm_worker, &j);
}

void ms_matmul_nn(const ms_kctx *k, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
                  const ms_mat *W, int accumulate)
{
    (void)k;
    if (M <= 0) return;
    if (!accumulate)
        for (int64_t i = 0; i < M; i++) memset(y + i * ldy, 0, sizeof(float) * (size_t)W->cols);
    float *wrow = malloc(sizeof(float) * (size_t)(W->cols > 0 ? W->cols : 1));
    if (!wrow) abort();
    for (int64_t r = 0; r < W->rows; r++) {
        row_to_f32(W, r, wrow);
        for (int64_t i = 0; i < M; i++) ms_axpy_f32(y + i * ldy, x[i * ldx + r], wrow, W->cols);
    }
    free(wrow);
}
