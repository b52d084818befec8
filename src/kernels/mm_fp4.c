/* mm_fp4.c — the auto-mode (exact = 0) matmul y = x·Wᵀ for FP4 e2m1
 * weights with per-32 UE8M0 scales (DeepSeek-V4's routed experts) on
 * AVX-512: two kernels, decode and prefill.
 *
 * AVX512_BF16 (ms_mm_fp4_bf16_nt, the default where the CPU has it):
 * activations rounded once to bf16 (as mm_bf16.c does for BF16 and FP8
 * weights), vdpbf16ps.  64 bytes of a weight row (128 codes) are read as 32
 * words; word i holds codes 4i .. 4i + 3, one per nibble, so the word
 * shifted right by 4k has code 4i + k in its low bits, and vpermw through a
 * 32-entry table of bf16(e2m1) (entries 16..31 repeat 0..15: it reads 5
 * index bits, so no mask is needed) gives 32 bf16 weights: three shifts
 * and four permutes per 128 weights, against one shift and one permute per
 * 16 in the FP32 kernel below.  The activations are prepared once per call
 * (and reused across the calls of one pool run) in the matching order
 * (f4b_prep: X_k[i] = x[4i + k]).  Dword lane j of every dot product holds
 * codes 8j .. 8j + 7, all in scale block j / 4 of the chunk, so the 128
 * codes' four dot products go into one vector, which is multiplied by the
 * lanes' scales (2^(e-127) as f32, exact; 0 gives 2^-127, 255 NaN) and
 * added to the row's sum.  Error: the rounding of x to bf16 (~1e-3
 * relative to max|y|, as the BF16 path); the weights are exact.
 *
 * AVX-512 without AVX512_BF16 (ms_mm_fp4_nt): FP32 activations and FMA.  A
 * weight row is read 64 bytes (128 codes) at a time as 16 dwords; dword i
 * holds elements 8i .. 8i + 7 of the chunk, one
 * per nibble, so shifting the vector right by 4j puts element 8i + j's code
 * in the low 4 bits of lane i, and one vpermps through the 16-entry e2m1
 * table (which reads only those bits) gives 16 weights.  That is one shift
 * and one permute per 16 weights, shared by every activation row of the
 * tile.  The activations are permuted once per call to match (xp[16j + i] =
 * x[8i + j] in each 128-column chunk, zero past K) and reused across the
 * calls of one pool run.  Lane i of a chunk stays in scale block i / 4, so
 * each 128-column sum is taken per lane over the codes and then multiplied
 * by its lane's scale; ~1e-6 relative to ms_matmul_ref.
 *
 * Both: sums per lane in chunk order, then one fixed reduction tree, each
 * (activation row, weight row) pair's arithmetic its own, so results do not
 * depend on M, the tile or the split of the output columns.  Views must
 * start at c0 % 32 == 0 with even ld and cols (every loader view and TP
 * slice of a V4 expert does); others return -1 and take the exact kernel.
 * Runs on pool threads (matmul.c).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/mm_internal.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

#define AI static inline __attribute__((always_inline))

enum {
    F4_CHUNK = 128,    /* codes per 64-byte load */
    F4_ROW_BLOCK = 64, /* weight rows per block (each pass over activation rows reuses it) */
    F4_PF_BYTES =
        1024, /* software prefetch distance along each weight row (4096, 8192: no faster) */
    F4_GEMV_AHEAD = 2, /* f4b_gemv4: the tile whose lines are prefetched, in tiles ahead */
};

/* The prepared activations on this thread (MM_SCR_F4X) and what they are. */
static _Thread_local struct f4_key {
    const float *x, *xp;
    int64_t ldx, M, K;
    uint64_t run;
} f4_prepped;

/* xp[m][128c + 16j + i] = x[m][128c + 8i + j] (0 at and past K). */
static const float *f4_prep(const mm_task *t, int64_t K, int64_t ldxp)
{
    struct f4_key *p = &f4_prepped;
    if (p->xp && p->x == t->x && p->ldx == t->ldx && p->M == t->M && p->K == K && p->run == t->run)
        return p->xp;
    float *xp = ms_mm_scratch(MM_SCR_F4X, sizeof(float) * (size_t)(t->M * ldxp));
    if (!xp) return NULL;
    const __m512i lane8 =
        _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
    for (int64_t m = 0; m < t->M; m++) {
        const float *xr = t->x + m * t->ldx;
        float *o = xp + m * ldxp;
        for (int64_t c = 0; c < ldxp; c += F4_CHUNK) {
            if (c + F4_CHUNK <= K) {
                for (int j = 0; j < 8; j++)
                    _mm512_storeu_ps(o + c + 16 * j,
                                     _mm512_i32gather_ps(
                                         _mm512_add_epi32(lane8, _mm512_set1_epi32(j)), xr + c, 4));
            } else {
                for (int j = 0; j < 8; j++)
                    for (int i = 0; i < 16; i++) {
                        int64_t k = c + 8 * i + j;
                        o[c + 16 * j + i] = k < K ? xr[k] : 0.0f;
                    }
            }
        }
    }
    *p = (struct f4_key){t->x, xp, t->ldx, t->M, K, t->run};
    return xp;
}

/* 16 UE8M0 bytes (the first n valid, the rest taken as 0) as f32 2^(e-127). */
AI __m512 f4_scales16(const uint8_t *s, int64_t n)
{
    __mmask16 mk = n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mk, s));
    __m512i b = _mm512_slli_epi32(e, 23);
    b = _mm512_mask_mov_epi32(b, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                              _mm512_set1_epi32(0x00400000)); /* 2^-127, subnormal */
    b = _mm512_mask_mov_epi32(b, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)),
                              _mm512_set1_epi32(0x7fc00000)); /* NaN */
    return _mm512_castsi512_ps(b);
}

/* Weight rows [n, n + R) of W: their codes (wr) and UE8M0 scales (sr), R <= 8. */
AI void f4_row_ptrs(const ms_mat *W, int64_t n, const int R, const uint8_t **wr, const uint8_t **sr)
{
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        wr[r] = (const uint8_t *)W->data + (n + r) * (W->ld / 2);
        sr[r] = W->e8scale + (W->r0 + n + r) * W->scale_ld + W->c0 / 32;
    }
}

/* Activation rows [m0, m0 + MB) × weight rows [n, n + R), all of K. */
AI void f4_tile(const mm_task *t, const float *xp, int64_t ldxp, const int MB, const int R,
                int64_t m0, int64_t n)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols, n_chunks = ldxp / F4_CHUNK, row_bytes = K / 2, n_sb = (K + 31) / 32;
    const __m512 tbl = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 0.0f, -0.5f,
                                      -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    const __m512i sidx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const uint8_t *wr[8], *sr[8];
    f4_row_ptrs(W, n, R, wr, sr);
    __m512 acc[4][8];
    float sv[8][16] __attribute__((aligned(64))) = {{0}}; /* filled at chunk 0 */
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < n_chunks; c++) {
        if ((c & 3) == 0) /* the scales of this chunk and the next three */
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                _mm512_store_ps(sv[r], f4_scales16(sr[r] + 4 * c, n_sb - 4 * c));
        int64_t left = row_bytes - 64 * c;
        __mmask64 bm = left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
        __m512i v[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            v[r] = _mm512_maskz_loadu_epi8(bm, wr[r] + 64 * c);
            _mm_prefetch((const char *)wr[r] + 64 * c + F4_PF_BYTES, _MM_HINT_T0);
        }
        __m512 tt[4][8];
#pragma GCC unroll 4
        for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) tt[m][r] = _mm512_setzero_ps();
        const float *xc = xp + m0 * ldxp + c * F4_CHUNK;
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512 xv[4];
#pragma GCC unroll 4
            for (int m = 0; m < MB; m++) xv[m] = _mm512_loadu_ps(xc + m * ldxp + 16 * j);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512 w = _mm512_permutexvar_ps(v[r], tbl);
                v[r] = _mm512_srli_epi32(v[r], 4);
#pragma GCC unroll 4
                for (int m = 0; m < MB; m++) tt[m][r] = _mm512_fmadd_ps(xv[m], w, tt[m][r]);
            }
        }
        __m512i sidx = _mm512_add_epi32(sidx0, _mm512_set1_epi32(4 * (int)(c & 3)));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 s = _mm512_permutexvar_ps(sidx, _mm512_load_ps(sv[r]));
#pragma GCC unroll 4
            for (int m = 0; m < MB; m++) acc[m][r] = _mm512_fmadd_ps(tt[m][r], s, acc[m][r]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            float s = _mm512_reduce_add_ps(acc[m][r]);
            float *yo = t->y + (m0 + m) * t->ldy + n + r;
            *yo = t->accumulate ? *yo + s : s;
        }
}

/* Weight rows [n0, n1) for activation rows [m0, m0 + MB): tiles of R rows,
 * then single rows (the same sums: each row's arithmetic is its own). */
AI void f4_rows(const mm_task *t, const float *xp, int64_t ldxp, const int MB, const int R,
                int64_t m0, int64_t n0, int64_t n1)
{
    int64_t n = n0;
    for (; n + R <= n1; n += R) f4_tile(t, xp, ldxp, MB, R, m0, n);
    for (; n < n1; n++) f4_tile(t, xp, ldxp, MB, 1, m0, n);
}

/* Both kernels' entry: -1 for a view they do not take, 1 when K = 0 (y
 * zeroed unless accumulating: done), 0 to go on. */
static int f4_view_check(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    if (W->dtype != MS_DT_F4E2M1 || W->c0 % 32 || W->ld % 2 || W->cols % 2) return -1;
    if (W->cols > 0) return 0;
    for (int64_t m = 0; m < t->M && !t->accumulate; m++)
        for (int64_t n = n0; n < n1; n++) t->y[m * t->ldy + n] = 0.0f;
    return 1;
}

/* Both kernels' loop: weight rows [n0, n1) in blocks of F4_ROW_BLOCK, each
 * taken by every group of up to 4 activation rows; ROWS(t, xp, ld, MB, R,
 * m0, nb, ne) with R = R1 .. R4 weight rows per tile for MB = 1 .. 4. */
#define F4_BLOCKS(ROWS, xp, ld, R1, R2, R3, R4)                                                    \
    for (int64_t nb = n0; nb < n1; nb += F4_ROW_BLOCK) {                                           \
        int64_t ne = nb + F4_ROW_BLOCK < n1 ? nb + F4_ROW_BLOCK : n1;                              \
        for (int64_t m0 = 0; m0 < t->M; m0 += 4) {                                                 \
            switch (t->M - m0 < 4 ? t->M - m0 : 4) {                                               \
            case 1:                                                                                \
                ROWS(t, xp, ld, 1, R1, m0, nb, ne);                                                \
                break;                                                                             \
            case 2:                                                                                \
                ROWS(t, xp, ld, 2, R2, m0, nb, ne);                                                \
                break;                                                                             \
            case 3:                                                                                \
                ROWS(t, xp, ld, 3, R3, m0, nb, ne);                                                \
                break;                                                                             \
            default:                                                                               \
                ROWS(t, xp, ld, 4, R4, m0, nb, ne);                                                \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    }

int ms_mm_fp4_nt(const mm_task *t, int64_t n0, int64_t n1)
{
    int st = f4_view_check(t, n0, n1);
    if (st) return st < 0 ? -1 : 0;
    const int64_t K = t->W->cols, ldxp = (K + F4_CHUNK - 1) / F4_CHUNK * F4_CHUNK;
    const float *xp = f4_prep(t, K, ldxp);
    if (!xp) return -1;
    F4_BLOCKS(f4_rows, xp, ldxp, 8, 4, 2, 2);
    return 0;
}

#pragma GCC pop_options

/* ---- AVX512_BF16: bf16 activations, vdpbf16ps ---- */

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

/* The prepared activations on this thread (MM_SCR_F4B) and what they are. */
static _Thread_local struct f4_key f4b_prepped;

/* Rows x[M][ldx] as bf16 in f4b_tile's order, xq[m][ldq] (ldq: K rounded up
 * to 128): in chunk c (columns 128c ..), word 32k + i holds column 128c + 4i
 * + k (k < 4, i < 32), the code that shift 4k and the permute put there,
 * and 0 at and past K. */
static const uint16_t *f4b_prep(const mm_task *t, int64_t K, int64_t ldq)
{
    struct f4_key *p = &f4b_prepped;
    if (p->xp && p->x == t->x && p->ldx == t->ldx && p->M == t->M && p->K == K && p->run == t->run)
        return (const uint16_t *)p->xp;
    uint16_t *xq = ms_mm_scratch(MM_SCR_F4B, sizeof(uint16_t) * (size_t)(t->M * ldq));
    if (!xq) return NULL;
    /* pair h: words 0..15 of X(2h) (low half) and of X(2h + 1) (high half)
     * from 64 columns in order, (N0, N1) or (N2, N3) */
    uint16_t ia[32], ib[32];
    for (int w = 0; w < 32; w++) {
        ia[w] = (uint16_t)(4 * (w % 16) + w / 16);
        ib[w] = (uint16_t)(ia[w] + 2);
    }
    const __m512i pa = _mm512_loadu_si512(ia), pb = _mm512_loadu_si512(ib);
    for (int64_t m = 0; m < t->M; m++) {
        const float *xr = t->x + m * t->ldx;
        uint16_t *o = xq + m * ldq;
        for (int64_t c = 0; c < ldq; c += F4_CHUNK) {
            __m512i nv[4]; /* nv[j]: columns c + 32j .. c + 32j + 31 in order */
            for (int j = 0; j < 4; j++) {
                int64_t r0 = K - (c + 32 * j), r1 = r0 - 16;
                __mmask16 k0 = r0 >= 16 ? 0xffff : r0 <= 0 ? 0 : (__mmask16)((1u << r0) - 1);
                __mmask16 k1 = r1 >= 16 ? 0xffff : r1 <= 0 ? 0 : (__mmask16)((1u << r1) - 1);
                nv[j] =
                    (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(k1, xr + c + 32 * j + 16),
                                                 _mm512_maskz_loadu_ps(k0, xr + c + 32 * j));
            }
            for (int h = 0; h < 2; h++) {
                const __m512i ix = h ? pb : pa;
                __m512i a = _mm512_permutex2var_epi16(nv[0], ix, nv[1]); /* i < 16 */
                __m512i b = _mm512_permutex2var_epi16(nv[2], ix, nv[3]); /* i >= 16 */
                _mm512_storeu_si512(o + c + 64 * h, _mm512_shuffle_i64x2(a, b, 0x44));
                _mm512_storeu_si512(o + c + 64 * h + 32, _mm512_shuffle_i64x2(a, b, 0xEE));
            }
        }
    }
    *p = (struct f4_key){t->x, (const float *)(void *)xq, t->ldx, t->M, K, t->run};
    return xq;
}

/* bf16 of the e2m1 codes 0..15, twice (vpermw reads 5 index bits). */
AI __m512i f4b_table(void)
{
    return _mm512_set_epi16(
        (short)0xc0c0, (short)0xc080, (short)0xc040, (short)0xc000, (short)0xbfc0, (short)0xbf80,
        (short)0xbf00, (short)0x8000, 0x40c0, 0x4080, 0x4040, 0x4000, 0x3fc0, 0x3f80, 0x3f00, 0,
        (short)0xc0c0, (short)0xc080, (short)0xc040, (short)0xc000, (short)0xbfc0, (short)0xbf80,
        (short)0xbf00, (short)0x8000, 0x40c0, 0x4080, 0x4040, 0x4000, 0x3fc0, 0x3f80, 0x3f00, 0);
}

AI __m512 f4b_dp(__m512 acc, __m512i x, __m512i w)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
}

/* Activation rows [m0, m0 + MB) × weight rows [n, n + R), all of K. */
AI void f4b_tile(const mm_task *t, const uint16_t *xq, int64_t ldq, const int MB, const int R,
                 int64_t m0, int64_t n)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols, n_chunks = ldq / F4_CHUNK, row_bytes = K / 2, n_sb = (K + 31) / 32;
    const __m512i tbl = f4b_table();
    const __m512i sidx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const uint8_t *wr[8], *sr[8];
    f4_row_ptrs(W, n, R, wr, sr);
    /* M <= 4 (one pass over the rows): the lines of the tile F4_GEMV_AHEAD tiles on
     * in address order, as f4b_gemv4 (one forward stream for the R rows' reads) */
    const int lin = R == 4 && t->M <= 4 && n + 4 * F4_GEMV_AHEAD + 4 <= W->rows;
    const int64_t ldb = W->ld / 2;
    const char *pa = (const char *)wr[0] + 4 * F4_GEMV_AHEAD * ldb; /* its row 0 */
    int64_t pc = 0;                                                 /* its next chunk */
    if (lin)
        for (int r = 0; r < R; r++)
            _mm_prefetch((const char *)sr[r] + 4 * F4_GEMV_AHEAD * W->scale_ld, _MM_HINT_T0);
    __m512 acc[4][8];
    float sv[8][16] __attribute__((aligned(64))) = {{0}}; /* filled at chunk 0 */
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < n_chunks; c++) {
        if ((c & 3) == 0) /* the scales of this chunk and the next three */
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                _mm512_store_ps(sv[r], f4_scales16(sr[r] + 4 * c, n_sb - 4 * c));
        const int64_t left = row_bytes - 64 * c;
        const __mmask64 bm = left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
        const __m512i sidx = _mm512_add_epi32(sidx0, _mm512_set1_epi32(4 * (int)(c & 3)));
        const uint16_t *xc = xq + m0 * ldq + c * F4_CHUNK;
        __m512i xv[4]; /* one activation row: held across the R weight rows */
#pragma GCC unroll 4
        for (int k = 0; k < 4 && MB == 1; k++) xv[k] = _mm512_loadu_si512(xc + 32 * k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512i v = _mm512_maskz_loadu_epi8(bm, wr[r] + 64 * c);
            if (lin) {
                _mm_prefetch(pa + 64 * pc, _MM_HINT_T0);
                if (++pc == n_chunks) pc = 0, pa += ldb;
            } else {
                _mm_prefetch((const char *)wr[r] + 64 * c + F4_PF_BYTES, _MM_HINT_T0);
            }
            __m512i w0 = _mm512_permutexvar_epi16(v, tbl);
            __m512i w1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), tbl);
            __m512i w2 = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), tbl);
            __m512i w3 = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), tbl);
            __m512 s = _mm512_permutexvar_ps(sidx, _mm512_load_ps(sv[r]));
#pragma GCC unroll 4
            for (int m = 0; m < MB; m++) { /* MB > 1: activations from L1, not registers */
                const uint16_t *xm = xc + m * ldq;
                __m512 tt =
                    f4b_dp(_mm512_setzero_ps(), MB == 1 ? xv[0] : _mm512_loadu_si512(xm), w0);
                tt = f4b_dp(tt, MB == 1 ? xv[1] : _mm512_loadu_si512(xm + 32), w1);
                tt = f4b_dp(tt, MB == 1 ? xv[2] : _mm512_loadu_si512(xm + 64), w2);
                tt = f4b_dp(tt, MB == 1 ? xv[3] : _mm512_loadu_si512(xm + 96), w3);
                acc[m][r] = _mm512_fmadd_ps(tt, s, acc[m][r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            float s = _mm512_reduce_add_ps(acc[m][r]);
            float *yo = t->y + (m0 + m) * t->ldy + n + r;
            *yo = t->accumulate ? *yo + s : s;
        }
}

/* M = 1, one row: weight rows [n0, n1) one at a time, with what f4b_tile
 * keeps per tile hoisted out of the row loop and the scales in registers.
 * The same arithmetic as f4b_tile(MB = 1, R = 1), so the same bits.  It
 * takes the rows f4b_gemv4 leaves (fewer than 4). */
AI void f4b_gemv(const mm_task *t, const uint16_t *xq, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols, row_bytes = K / 2, n_chunks = (K + F4_CHUNK - 1) / F4_CHUNK,
                  n_full = row_bytes / 64, n_sb = (K + 31) / 32, ldb = W->ld / 2;
    const __m512i tbl = f4b_table();
    const __m512i sidx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const int64_t left = row_bytes - 64 * n_full;
    const __mmask64 tail = ((__mmask64)1 << left) - 1; /* the last, partial chunk (left < 64) */
    const uint8_t *w = (const uint8_t *)W->data + n0 * ldb;
    const uint8_t *sc = W->e8scale + (W->r0 + n0) * W->scale_ld + W->c0 / 32;
    for (int64_t n = n0; n < n1; n++, w += ldb, sc += W->scale_ld) {
        __m512 acc = _mm512_setzero_ps(), sv = _mm512_setzero_ps();
        for (int64_t c = 0; c < n_chunks; c++) {
            if ((c & 3) == 0) sv = f4_scales16(sc + 4 * c, n_sb - 4 * c);
            const __m512i v = c < n_full ? _mm512_loadu_si512(w + 64 * c)
                                         : _mm512_maskz_loadu_epi8(tail, w + 64 * c);
            _mm_prefetch((const char *)w + 64 * c + F4_PF_BYTES, _MM_HINT_T0);
            const uint16_t *xc = xq + c * F4_CHUNK;
            __m512 tt = f4b_dp(_mm512_setzero_ps(), _mm512_loadu_si512(xc),
                               _mm512_permutexvar_epi16(v, tbl));
            tt = f4b_dp(tt, _mm512_loadu_si512(xc + 32),
                        _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), tbl));
            tt = f4b_dp(tt, _mm512_loadu_si512(xc + 64),
                        _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), tbl));
            tt = f4b_dp(tt, _mm512_loadu_si512(xc + 96),
                        _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), tbl));
            const __m512i sidx = _mm512_add_epi32(sidx0, _mm512_set1_epi32(4 * (int)(c & 3)));
            acc = _mm512_fmadd_ps(tt, _mm512_permutexvar_ps(sidx, sv), acc);
        }
        float s = _mm512_reduce_add_ps(acc);
        float *yo = t->y + n;
        *yo = t->accumulate ? *yo + s : s;
    }
}

/* M = 1: weight rows [n0, n1) four at a time (the activations loaded once
 * per chunk for all four), and while a tile is computed, the lines of the
 * tile F4_GEMV_AHEAD tiles on (codes row by row, then its scales) are
 * prefetched in address order, one line per row-chunk step: the four rows
 * are four interleaved streams to the hardware prefetcher (DRAM-cold, 4 rows
 * per tile without this prefetch was slower than 1), the software prefetch
 * one forward stream (measured: bench/RESULTS.md, "mm_fp4.c: f4b_gemv4").
 * Each row's arithmetic is f4b_gemv's, so the same bits; the last n1 - n0
 * mod 4 rows take f4b_gemv. */
AI void f4b_gemv4(const mm_task *t, const uint16_t *xq, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols, row_bytes = K / 2, n_chunks = (K + F4_CHUNK - 1) / F4_CHUNK,
                  n_full = row_bytes / 64, n_sb = (K + 31) / 32, ldb = W->ld / 2, sld = W->scale_ld;
    const __m512i tbl = f4b_table();
    const __m512i sidx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __mmask64 tail = ((__mmask64)1 << (row_bytes - 64 * n_full)) - 1; /* partial chunk */
    const uint8_t *w = (const uint8_t *)W->data + n0 * ldb;
    const uint8_t *sc = W->e8scale + (W->r0 + n0) * sld + W->c0 / 32;
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4, w += 4 * ldb, sc += 4 * sld) {
        const int pf = n + 4 * F4_GEMV_AHEAD + 4 <= n1;             /* that tile is in the range */
        const char *pa = (const char *)w + 4 * F4_GEMV_AHEAD * ldb; /* its row 0 */
        int64_t pc = 0;                                             /* its next chunk */
        if (pf)
            for (int r = 0; r < 4; r++)
                _mm_prefetch((const char *)sc + (4 * F4_GEMV_AHEAD + r) * sld, _MM_HINT_T0);
        __m512 acc[4], sv[4];
        for (int r = 0; r < 4; r++) acc[r] = sv[r] = _mm512_setzero_ps();
        for (int64_t c = 0; c < n_chunks; c++) {
            if ((c & 3) == 0)
                for (int r = 0; r < 4; r++) sv[r] = f4_scales16(sc + r * sld + 4 * c, n_sb - 4 * c);
            const uint16_t *xc = xq + c * F4_CHUNK;
            const __m512i x0 = _mm512_loadu_si512(xc), x1 = _mm512_loadu_si512(xc + 32),
                          x2 = _mm512_loadu_si512(xc + 64), x3 = _mm512_loadu_si512(xc + 96);
            const __m512i sidx = _mm512_add_epi32(sidx0, _mm512_set1_epi32(4 * (int)(c & 3)));
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                if (pf) { /* step 4c + r: the ahead tile's line after the last one */
                    _mm_prefetch(pa + 64 * pc, _MM_HINT_T0);
                    if (++pc == n_chunks) pc = 0, pa += ldb;
                }
                const uint8_t *wr = w + r * ldb + 64 * c;
                const __m512i v =
                    c < n_full ? _mm512_loadu_si512(wr) : _mm512_maskz_loadu_epi8(tail, wr);
                __m512 tt = f4b_dp(_mm512_setzero_ps(), x0, _mm512_permutexvar_epi16(v, tbl));
                tt = f4b_dp(tt, x1, _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), tbl));
                tt = f4b_dp(tt, x2, _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), tbl));
                tt = f4b_dp(tt, x3, _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), tbl));
                acc[r] = _mm512_fmadd_ps(tt, _mm512_permutexvar_ps(sidx, sv[r]), acc[r]);
            }
        }
        for (int r = 0; r < 4; r++) {
            float s = _mm512_reduce_add_ps(acc[r]);
            float *yo = t->y + n + r;
            *yo = t->accumulate ? *yo + s : s;
        }
    }
    if (n < n1) f4b_gemv(t, xq, n, n1);
}

AI void f4b_rows(const mm_task *t, const uint16_t *xq, int64_t ldq, const int MB, const int R,
                 int64_t m0, int64_t n0, int64_t n1)
{
    int64_t n = n0;
    for (; n + R <= n1; n += R) f4b_tile(t, xq, ldq, MB, R, m0, n);
    for (; n < n1; n++) f4b_tile(t, xq, ldq, MB, 1, m0, n);
}

int ms_mm_fp4_bf16_nt(const mm_task *t, int64_t n0, int64_t n1)
{
    int st = f4_view_check(t, n0, n1);
    if (st) return st < 0 ? -1 : 0;
    const int64_t K = t->W->cols, ldq = (K + F4_CHUNK - 1) / F4_CHUNK * F4_CHUNK;
    const uint16_t *xq = f4b_prep(t, K, ldq);
    if (!xq) return -1;
    if (t->M == 1) { /* four weight rows at a time (f4b_gemv4) */
        f4b_gemv4(t, xq, n0, n1);
        return 0;
    }
    F4_BLOCKS(f4b_rows, xq, ldq, 1, 4, 4, 4);
    return 0;
}

#pragma GCC pop_options
