/* attn.c — paged MLA decode attention (attn.h). */
#include "kernels/attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Row s of the sequence as f32 (converted into buf when the cache is BF16). */
static const float *row_f32(const ms_attn_seq *a, int64_t s, float *buf, int isa)
{
    const char *p = (const char *)a->pages[s / a->page_size] +
                    (size_t)(s % a->page_size) * (size_t)a->row * (size_t)ms_dtype_size(a->dtype);
    if (a->dtype == MS_DT_F32) return (const float *)p;
    ms_cvt_to_f32(isa, a->dtype, p, buf, a->row);
    return buf;
}

struct job {
    const ms_kctx *k;
    const ms_attn_seq *a;
    const float *q;
    int64_t H, vdim;
    float scale;
    float *scores, *ctx, *scratch;
};

static void worker(void *arg, int tid, int nt)
{
    struct job *j = arg;
    const ms_attn_seq *a = j->a;
    int64_t h0, h1, S = a->S;
    ms_pool_range(j->H, tid, nt, 1, &h0, &h1);
    if (h0 >= h1) return;
    float *buf = j->scratch + (int64_t)tid * (a->row + 16);
    int isa = j->k ? j->k->isa : MS_ISA_SCALAR;
    for (int64_t s = 0; s < S; s++) {
        const float *r = row_f32(a, s, buf, isa);
        for (int64_t h = h0; h < h1; h++)
            j->scores[h * S + s] = j->scale * ms_dot_f32(j->q + h * a->row, r, a->row);
    }
    for (int64_t h = h0; h < h1; h++) {
        ms_softmax(j->scores + h * S, S);
        memset(j->ctx + h * j->vdim, 0, sizeof(float) * (size_t)j->vdim);
    }
    for (int64_t s = 0; s < S; s++) {
        const float *r = row_f32(a, s, buf, isa);
        for (int64_t h = h0; h < h1; h++)
            ms_axpy_f32(j->ctx + h * j->vdim, j->scores[h * S + s], r, j->vdim);
    }
}

void ms_attn_decode(const ms_kctx *k, const ms_attn_seq *a, const float *q, int64_t H,
                    int64_t vdim, float scale, float *scores, float *ctx, float *scratch)
{
    struct job j = {k, a, q, H, vdim, scale, scores, ctx, scratch};
    ms_pool_run(k ? k->pool : NULL, worker, &j);
}

void ms_attn_decode_ref(const ms_attn_seq *a, const float *q, int64_t H, int64_t vdim, float scale,
                        float *ctx)
{
    int64_t S = a->S;
    double *p = malloc(sizeof(double) * (size_t)(S > 0 ? S : 1));
    float *buf = malloc(sizeof(float) * (size_t)a->row);
    if (!p || !buf) abort();
    for (int64_t h = 0; h < H; h++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t s = 0; s < S; s++) {
            const float *r = row_f32(a, s, buf, MS_ISA_SCALAR);
            double d = 0;
            for (int64_t i = 0; i < a->row; i++) d += (double)q[h * a->row + i] * r[i];
            p[s] = d * scale;
            mx = p[s] > mx ? p[s] : mx;
        }
        for (int64_t s = 0; s < S; s++) sum += (p[s] = exp(p[s] - mx));
        for (int64_t i = 0; i < vdim; i++) {
            double acc = 0;
            for (int64_t s = 0; s < S; s++) acc += p[s] / sum * row_f32(a, s, buf, MS_ISA_SCALAR)[i];
            ctx[h * vdim + i] = (float)acc;
        }
    }
    free(p);
    free(buf);
}
