/* ref.c — scalar reference kernels (the twins every fast path is tested
 * against) and the small elementwise kernels.  Accumulation in double for the
 * matmul references, so they are an oracle and not just another float path. */
#include "kernels/attn_mqa.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

ms_mat ms_mat_whole(ms_dtype dt, int64_t rows, int64_t cols, const void *data, const float *scale)
{
    ms_mat m = {.dtype = dt,
                .rows = rows,
                .cols = cols,
                .ld = cols,
                .data = data,
                .scale = scale,
                .scale_ld = (cols + 127) / 128,
                .r0 = 0,
                .c0 = 0};
    return m;
}

ms_mat ms_mat_fp4(int64_t rows, int64_t cols, const void *packed, const uint8_t *e8scale)
{
    ms_mat m = {.dtype = MS_DT_F4E2M1,
                .rows = rows,
                .cols = cols,
                .ld = cols,
                .data = packed,
                .scale_ld = (cols + 31) / 32,
                .e8scale = e8scale};
    return m;
}

int64_t ms_mat_bytes(const ms_mat *m)
{
    int64_t b = m->rows * ms_dtype_bytes(m->dtype, m->cols);
    if (m->dtype == MS_DT_F8E4M3) b += ((m->rows + 127) / 128) * ((m->cols + 127) / 128) * 4;
    if (m->dtype == MS_DT_F4E2M1) b += m->rows * ((m->cols + 31) / 32);
    return b;
}

ms_mat ms_mat_slice(const ms_mat *m, int64_t r, int64_t nr, int64_t c, int64_t nc)
{
    ms_mat s = *m;
    s.rows = nr;
    s.cols = nc;
    s.data = (const char *)m->data + (size_t)ms_dtype_bytes(m->dtype, r * m->ld + c);
    s.r0 = m->r0 + r;
    s.c0 = m->c0 + c;
    s.panels = NULL; /* made for the whole view */
    return s;
}

void ms_mat_f8_scan_ref(const ms_mat *W, uint8_t *plain)
{
    for (int64_t r = 0; r < W->rows; r++) {
        const uint8_t *p = (const uint8_t *)W->data + r * W->ld;
        int has_sub = 0, has_nan = 0;
        for (int64_t c = 0; c < W->cols; c++) {
            if ((p[c] & 0x78) == 0) has_sub = 1;
            if ((p[c] & 0x7f) == 0x7f) has_nan = 1;
        }
        plain[r] = has_nan ? MS_F8_ROW_NAN : has_sub ? MS_F8_ROW_SUBN : MS_F8_ROW_PLAIN;
    }
}

float ms_mat_get(const ms_mat *m, int64_t r, int64_t c)
{
    int64_t off = r * m->ld + c;
    switch (m->dtype) {
    /* memcpy loads: a checkpoint mixing 1-byte and 2-byte tensors leaves views unaligned */
    case MS_DT_F32: {
        float v;
        memcpy(&v, (const char *)m->data + 4 * off, sizeof v);
        return v;
    }
    case MS_DT_BF16: {
        uint16_t v;
        memcpy(&v, (const char *)m->data + 2 * off, sizeof v);
        return ms_bf16_to_f32(v);
    }
    case MS_DT_F16: {
        uint16_t v;
        memcpy(&v, (const char *)m->data + 2 * off, sizeof v);
        return ms_f16_to_f32(v);
    }
    case MS_DT_F8E4M3: {
        float s = m->scale[((m->r0 + r) / 128) * m->scale_ld + (m->c0 + c) / 128];
        return ms_fp8e4m3_to_f32(((const uint8_t *)m->data)[off]) * s;
    }
    case MS_DT_F4E2M1: {
        uint8_t b = ((const uint8_t *)m->data)[off >> 1];
        float s = ms_e8m0_to_f32(m->e8scale[(m->r0 + r) * m->scale_ld + (m->c0 + c) / 32]);
        return ms_fp4e2m1_to_f32((uint8_t)(off & 1 ? b >> 4 : b)) * s;
    }
    default:
        return NAN;
    }
}

void ms_matmul_ref(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M, const ms_mat *W,
                   int accumulate)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < W->rows; n++) {
            double acc = 0;
            for (int64_t kk = 0; kk < W->cols; kk++)
                acc += (double)x[i * ldx + kk] * (double)ms_mat_get(W, n, kk);
            y[i * ldy + n] = accumulate ? y[i * ldy + n] + (float)acc : (float)acc;
        }
}

void ms_matmul_nn_ref(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
                      const ms_mat *W, int accumulate)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < W->cols; n++) {
            double acc = 0;
            for (int64_t kk = 0; kk < W->rows; kk++)
                acc += (double)x[i * ldx + kk] * (double)ms_mat_get(W, kk, n);
            y[i * ldy + n] = accumulate ? y[i * ldy + n] + (float)acc : (float)acc;
        }
}

void ms_rmsnorm_ref(float *y, const float *x, const float *w, int64_t M, int64_t n, int64_t ld,
                    float eps)
{
    for (int64_t i = 0; i < M; i++) {
        const float *xi = x + i * ld;
        float *yi = y + i * ld;
        double ss = 0;
        for (int64_t j = 0; j < n; j++) ss += (double)xi[j] * xi[j];
        float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t j = 0; j < n; j++) yi[j] = xi[j] * inv * (w ? w[j] : 1.0f);
    }
}

void ms_rope_interleaved(float *x, int64_t n_heads, int64_t stride, int64_t dim,
                         const float *inv_freq, int64_t pos)
{
    for (int64_t i = 0; i < dim / 2; i++) {
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        for (int64_t h = 0; h < n_heads; h++) {
            float *p = x + h * stride + 2 * i;
            float a = p[0], b = p[1];
            p[0] = a * c - b * s;
            p[1] = a * s + b * c;
        }
    }
}

void ms_softmax_ref(float *x, int64_t n)
{
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void ms_silu_mul_ref(float *out, const float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ms_topk_ref(const float *x, int64_t n, int k, int32_t *idx)
{
    /* selection by repeated scan */
    for (int j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t i = 0; i < n; i++) {
            int taken = 0;
            for (int q = 0; q < j; q++)
                if (idx[q] == i) {
                    taken = 1;
                    break;
                }
            if (taken) continue;
            if (best < 0 || x[i] > x[best]) best = i;
        }
        idx[j] = (int32_t)best;
    }
}

float ms_dot_f32_ref(const float *a, const float *b, int64_t n)
{
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void ms_axpy_f32_ref(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void ms_attn_mqa_ref(const float *q, int64_t hd, const float *const *rows, int64_t n, int64_t h0,
                     int64_t h1, float scale, const float *sink, float *scratch, float *o)
{
    for (int64_t h = h0; h < h1; h++) {
        const float *qh = q + h * hd;
        double z = -INFINITY, den = 0;
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t d = 0; d < hd; d++) s += (double)qh[d] * rows[i][d];
            scratch[i] = (float)(scale * s);
            z = scratch[i] > z ? scratch[i] : z;
        }
        for (int64_t i = 0; i < n; i++) den += scratch[i] = (float)exp(scratch[i] - z);
        den += exp(sink[h] - z);
        for (int64_t d = 0; d < hd; d++) {
            double s = 0;
            for (int64_t i = 0; i < n; i++) s += (double)scratch[i] * rows[i][d];
            o[h * hd + d] = (float)(s / den);
        }
    }
}
