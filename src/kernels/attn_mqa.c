/* attn_mqa.c — sink attention of one query row over shared key/value rows
 * (attn_mqa.h), AVX2 + FMA (the build baseline).  Blocks of 8 heads keep the
 * heads in the lanes: the scores of 8 rows at a time against the block's
 * transposed query (one broadcast of a row value feeds 8 heads), the softmax
 * of 8 heads at once, then o of two heads × 32 columns over every row.  Each
 * row is read once per block for the scores and once per two heads and 32
 * columns for o, where one head at a time reads every row twice per head.
 */
#include "kernels/attn_mqa.h"

#include "kernels/avx2_inl.h"
#include "kernels/kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* One head: the reference's arithmetic in vector dots and axpys (sc: n). */
static void one_head(const float *q, int64_t hd, const float *const *rows, int64_t n, float scale,
                     float sink, float *sc, float *o)
{
    float z = -INFINITY, den = 0;
    for (int64_t i = 0; i < n; i++) {
        sc[i] = scale * ms_dot_f32(q, rows[i], hd);
        z = sc[i] > z ? sc[i] : z;
    }
    for (int64_t i = 0; i < n; i++) den += sc[i] = expf(sc[i] - z);
    den += expf(sink - z);
    memset(o, 0, sizeof(float) * (size_t)hd);
    for (int64_t i = 0; i < n; i++) ms_axpy_f32(o, sc[i] / den, rows[i], hd);
}

/* Scores of rows [i, i + R) into S[i .. i + R)[8] (lane j: head j). */
static inline __attribute__((always_inline)) void
scores(const float *qt, int64_t hd, const float *const *rows, int64_t i, const int R, float *S)
{
    __m256 a[8];
    const float *r[8];
    for (int c = 0; c < R; c++) a[c] = _mm256_setzero_ps(), r[c] = rows[i + c];
    for (int64_t d = 0; d < hd; d++) {
        __m256 qv = _mm256_loadu_ps(qt + d * 8);
        for (int c = 0; c < R; c++) a[c] = _mm256_fmadd_ps(qv, _mm256_broadcast_ss(r[c] + d), a[c]);
    }
    for (int c = 0; c < R; c++) _mm256_storeu_ps(S + (i + c) * 8, a[c]);
}

/* Heads j and j + 1 of the block, columns [d, d + 8·V). */
static inline __attribute__((always_inline)) void pv(const float *S, const float *const *rows,
                                                     int64_t n, int j, int64_t d, const int V,
                                                     int64_t hd, float *o)
{
    __m256 a[2][4];
    for (int v = 0; v < V; v++) a[0][v] = a[1][v] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i++) {
        const float *r = rows[i] + d;
        __m256 p0 = _mm256_broadcast_ss(S + i * 8 + j), p1 = _mm256_broadcast_ss(S + i * 8 + j + 1);
        for (int v = 0; v < V; v++) {
            __m256 x = _mm256_loadu_ps(r + v * 8);
            a[0][v] = _mm256_fmadd_ps(p0, x, a[0][v]);
            a[1][v] = _mm256_fmadd_ps(p1, x, a[1][v]);
        }
    }
    for (int v = 0; v < V; v++) {
        _mm256_storeu_ps(o + j * hd + d + v * 8, a[0][v]);
        _mm256_storeu_ps(o + (j + 1) * hd + d + v * 8, a[1][v]);
    }
}

/* Heads [0, 8) of q / sink / o (their first head's pointers). */
static void block8(const float *q, int64_t hd, const float *const *rows, int64_t n, float scale,
                   const float *sink, float *scratch, float *o)
{
    float *qt = scratch, *S = scratch + 8 * hd; /* qt[hd][8]: scale · q, transposed; S[n][8] */
    for (int64_t d = 0; d < hd; d++)
        for (int j = 0; j < 8; j++) qt[d * 8 + j] = scale * q[j * hd + d];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) scores(qt, hd, rows, i, 8, S);
    for (; i < n; i++) scores(qt, hd, rows, i, 1, S);
    __m256 z = _mm256_set1_ps(-INFINITY), den = _mm256_setzero_ps();
    for (i = 0; i < n; i++) z = _mm256_max_ps(z, _mm256_loadu_ps(S + i * 8));
    for (i = 0; i < n; i++) {
        __m256 e = ms_exp8(_mm256_sub_ps(_mm256_loadu_ps(S + i * 8), z));
        _mm256_storeu_ps(S + i * 8, e);
        den = _mm256_add_ps(den, e);
    }
    den = _mm256_add_ps(den, ms_exp8(_mm256_sub_ps(_mm256_loadu_ps(sink), z)));
    __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), den);
    for (i = 0; i < n; i++)
        _mm256_storeu_ps(S + i * 8, _mm256_mul_ps(_mm256_loadu_ps(S + i * 8), inv));
    for (int j = 0; j < 8; j += 2) {
        int64_t d = 0;
        for (; d + 32 <= hd; d += 32) pv(S, rows, n, j, d, 4, hd, o);
        for (; d < hd; d += 8) pv(S, rows, n, j, d, 1, hd, o);
    }
}

void ms_attn_mqa(const float *q, int64_t hd, const float *const *rows, int64_t n, int64_t h0,
                 int64_t h1, float scale, const float *sink, float *scratch, float *o)
{
    int64_t h = h0;
    if (hd % 8 == 0)
        for (; h + 8 <= h1; h += 8)
            block8(q + h * hd, hd, rows, n, scale, sink + h, scratch, o + h * hd);
    for (; h < h1; h++) one_head(q + h * hd, hd, rows, n, scale, sink[h], scratch, o + h * hd);
}
