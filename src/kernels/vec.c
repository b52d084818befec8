/* vec.c — the vectorised elementwise kernels: rmsnorm, softmax, silu·mul,
 * dot and axpy in FP32 with AVX2 + FMA (the build baseline, so no dispatch),
 * the router's top-k selection and the FP8 plain-row scan.
 * Their scalar twins (*_ref in ref.c) are the test oracle.  Pure functions,
 * any thread.
 */
#include "kernels/avx2_inl.h"
#include "kernels/kernels.h"

#include <immintrin.h>
#include <math.h>

float ms_dot_f32(const float *a, const float *b, int64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = ms_hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void ms_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

void ms_rmsnorm(float *y, const float *x, const float *w, int64_t M, int64_t n, int64_t ld,
                float eps)
{
    for (int64_t r = 0; r < M; r++) {
        const float *xi = x + r * ld;
        float *yi = y + r * ld;
        float inv = 1.0f / sqrtf(ms_dot_f32(xi, xi, n) / (float)n + eps);
        __m256 vi = _mm256_set1_ps(inv);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xi + i), vi);
            if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
            _mm256_storeu_ps(yi + i, v);
        }
        for (; i < n; i++) yi[i] = xi[i] * inv * (w ? w[i] : 1.0f);
    }
}

void ms_softmax(float *x, int64_t n)
{
    if (n <= 0) return;
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    float mx = ms_hmax8(vm);
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    __m256 vmx = _mm256_set1_ps(mx), vs = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = ms_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
        _mm256_storeu_ps(x + i, e);
        vs = _mm256_add_ps(vs, e);
    }
    float sum = ms_hsum8(vs);
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    __m256 vinv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
    for (; i < n; i++) x[i] *= 1.0f / sum;
}

void ms_silu_mul(float *out, const float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vg = _mm256_loadu_ps(g + i);
        __m256 e = ms_exp8(_mm256_sub_ps(_mm256_setzero_ps(), vg));
        __m256 s = _mm256_div_ps(vg, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* One pass keeping the best k so far in order (value descending, index
 * ascending on ties): the same answer as k repeated scans, in O(n·k) instead
 * of O(n·k²) with an inner search.  A NaN makes the scans' answer depend on
 * where it sits, so then the reference gives it. */
void ms_topk(const float *x, int64_t n, int k, int32_t *idx)
{
    if (k <= 0) return;
    int m = 0; /* entries kept in idx */
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (v != v) {
            ms_topk_ref(x, n, k, idx);
            return;
        }
        if (m == k && !(v > x[idx[k - 1]])) continue; /* ties keep the earlier index */
        int j = m < k ? m++ : k - 1;
        while (j > 0 && v > x[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = (int32_t)i;
    }
}

void ms_mat_f8_scan(const ms_mat *W, uint8_t *plain)
{
    const __m256i m78 = _mm256_set1_epi8(0x78), m7f = _mm256_set1_epi8(0x7f);
    const __m256i zero = _mm256_setzero_si256();
    for (int64_t r = 0; r < W->rows; r++) {
        const uint8_t *p = (const uint8_t *)W->data + r * W->ld;
        __m256i sub = zero, nan = zero; /* lanes that met exponent field 0, the NaN code */
        int64_t c = 0;
        for (; c + 32 <= W->cols; c += 32) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(p + c));
            sub = _mm256_or_si256(sub, _mm256_cmpeq_epi8(_mm256_and_si256(v, m78), zero));
            nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(_mm256_and_si256(v, m7f), m7f));
        }
        int has_sub = !_mm256_testz_si256(sub, sub), has_nan = !_mm256_testz_si256(nan, nan);
        for (; c < W->cols; c++) {
            has_sub |= (p[c] & 0x78) == 0;
            has_nan |= (p[c] & 0x7f) == 0x7f;
        }
        plain[r] = has_nan ? MS_F8_ROW_NAN : has_sub ? MS_F8_ROW_SUBN : MS_F8_ROW_PLAIN;
    }
}
