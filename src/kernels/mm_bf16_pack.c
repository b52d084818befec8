/* mm_bf16_pack.c — the packed-panel broadcast matmul y = x·Wᵀ for BF16
 * weights on AVX512_BF16, auto mode only, for mid-size M (a prefill's MoE
 * experts, ~48 rows each): BLIS-style, no horizontal sums.
 *
 * Per call (output columns [n0, n1)): the activation rows are rounded once to
 * bf16 into per-thread scratch xa[M][Kq] (Kq = ceil(K / 2) bf16 pairs, one
 * uint32 each; reused across the calls of one pool run that share x, such as
 * an expert's gate and up).  The weights are packed PW = 64 output columns at
 * a time into a panel pb[Kq][64] of bf16 pairs (VNNI order: pb[kp][j] =
 * (W[n + j][2kp], W[n + j][2kp + 1]); 16×16 uint32 transposes), then
 * micro-kernels of MR = 6 rows × NV ≤ 4 vectors of 16 columns keep 24 sums
 * in lanes along n: per pair kp, each row's pair is broadcast and feeds
 * vdpbf16ps against the NV panel vectors.  Each output adds its pairs in k
 * order in one lane, so its bits do not depend on M, the split or the tile.
 * The order differs from mm_bf16.c's tiles (lanes along k, then a
 * horizontal sum): --enable-deterministic-inference (t->binv) never comes
 * here.  Scalar twin: tests/test_kernels.c's matmul_pack_vs_twin (bf16-rounded
 * x and W in double), and ms_matmul_ref.
 *
 * Panel copies (ms_kernels_panels_fill): a view's panels made once, in the
 * same layout (panel p holds rows [64p, 64p + 64), zero past the view's last
 * row), W->panels[p] at p·Kq·64 pairs.  A call whose columns start on a panel
 * reads them instead of packing (the same sums: the same bits); the pack
 * costs ~20-40 % of an M = 32 product (bench/RESULTS.md, "Why the code is so").
 */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"
#include "base/util.h"
#include "kernels/mm_internal.h"

#define AI static inline __attribute__((always_inline))

enum {
    PW = 64, /* panel width: output columns packed at once (4 vectors of 16) */
    MR = 6,  /* activation rows per micro-kernel (6 × 4 = 24 sums in registers) */
};

/* 16×16 transpose of uint32: r[i] row i -> r[c] column c. */
AI void tr16(__m512i *r)
{
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* u[4i + e] lane L: rows 4i..4i+3 at column 4L + e */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        __m512i p = _mm512_shuffle_i32x4(u[e], u[4 + e], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i q = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i p2 = _mm512_shuffle_i32x4(u[e], u[4 + e], _MM_SHUFFLE(3, 2, 3, 2));
        __m512i q2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(3, 2, 3, 2));
        r[e] = _mm512_shuffle_i32x4(p, q, _MM_SHUFFLE(2, 0, 2, 0));
        r[4 + e] = _mm512_shuffle_i32x4(p, q, _MM_SHUFFLE(3, 1, 3, 1));
        r[8 + e] = _mm512_shuffle_i32x4(p2, q2, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + e] = _mm512_shuffle_i32x4(p2, q2, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* Packs weight rows [0, nr) (row j at w + j·ldw bf16, K columns; nr ≤ PW)
 * into pb[Kq][PW] pairs; rows nr.. and the odd column K are zero. */
static void pack(const uint16_t *w, int64_t ldw, int64_t nr, int64_t K, int64_t Kq, uint32_t *pb)
{
    const int ng = (int)((nr + 15) / 16);
    for (int g = 0; g < ng; g++) {
        for (int64_t kp = 0; kp < Kq; kp += 16) {
            __m512i r[16];
            int64_t rem = K - 2 * kp; /* bf16 columns left in this 32-column block */
            __mmask32 mk = rem >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << rem) - 1);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                int64_t j = 16 * g + i;
                r[i] = j < nr ? _mm512_maskz_loadu_epi16(mk, w + j * ldw + 2 * kp)
                              : _mm512_setzero_si512();
            }
            tr16(r);
            int64_t nk = Kq - kp < 16 ? Kq - kp : 16;
            for (int64_t c = 0; c < nk; c++) _mm512_store_si512(pb + (kp + c) * PW + 16 * g, r[c]);
        }
    }
}

/* y[m][0..nc) (= or +=) for rows m < MB: xa rows ldxa pairs apart, the
 * panel's first NV vectors. */
/* The next panel's weights, prefetched into L2 while this one computes (so
 * the DRAM reads of the pack overlap the arithmetic): npf lines from line
 * `line` of rows `rowb` bytes long, ldwb bytes apart, from base. */
typedef struct pfq {
    const char *base;
    int64_t ldwb, rowb, line, end;
} pfq;

AI void micro(const int MB, const int NV, const uint32_t *xa, int64_t ldxa, const uint32_t *pb,
              int64_t Kq, float *y, int64_t ldy, int64_t nc, int add, pfq *pf)
{
    int64_t lpr = (pf->rowb + 63) / 64, row = pf->line / lpr, col = pf->line % lpr * 64;
    const int64_t npf = pf->end - pf->line;
    __m512 acc[MR][4];
#pragma GCC unroll 6
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[m][v] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < Kq; kp++) {
        __m512i b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = _mm512_load_si512(pb + kp * PW + 16 * v);
        if (kp < npf) {
            _mm_prefetch(pf->base + row * pf->ldwb + col, _MM_HINT_T1);
            col += 64;
            if (col >= pf->rowb) col = 0, row++;
        }
#pragma GCC unroll 6
        for (int m = 0; m < MB; m++) {
            __m512i a = _mm512_set1_epi32((int)xa[m * ldxa + kp]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                acc[m][v] = _mm512_dpbf16_ps(acc[m][v], (__m512bh)a, (__m512bh)b[v]);
        }
    }
#pragma GCC unroll 6
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            int64_t left = nc - 16 * v;
            __mmask16 mk = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            float *yo = y + m * ldy + 16 * v;
            __m512 s = acc[m][v];
            if (add) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(mk, yo));
            _mm512_mask_storeu_ps(yo, mk, s);
        }
}

AI void micro_nv(const int MB, int nv, const uint32_t *xa, int64_t ldxa, const uint32_t *pb,
                 int64_t Kq, float *y, int64_t ldy, int64_t nc, int add, pfq *pf)
{
    switch (nv) {
    case 1:
        micro(MB, 1, xa, ldxa, pb, Kq, y, ldy, nc, add, pf);
        break;
    case 2:
        micro(MB, 2, xa, ldxa, pb, Kq, y, ldy, nc, add, pf);
        break;
    case 3:
        micro(MB, 3, xa, ldxa, pb, Kq, y, ldy, nc, add, pf);
        break;
    default:
        micro(MB, 4, xa, ldxa, pb, Kq, y, ldy, nc, add, pf);
        break;
    }
    pf->line = pf->line + Kq < pf->end ? pf->line + Kq : pf->end;
}

/* What MM_SCR_PKX holds on this thread (as mm_bf16.c's prep_once). */
static _Thread_local struct {
    const float *x;
    const uint32_t *xa;
    int64_t ldx, M, K;
    uint64_t run;
} packed_x;

int ms_mm_bf16_pack_nt(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    if (W->dtype != MS_DT_BF16) return -1;
    const int64_t K = W->cols, Kq = (K + 1) / 2, M = t->M;
    const uint32_t *held = n0 % PW == 0 ? W->panels : NULL; /* the panels made ahead */
    uint32_t *xa = ms_mm_scratch(MM_SCR_PKX, sizeof(uint32_t) * (size_t)(M * Kq));
    uint32_t *scr = held ? NULL : ms_mm_scratch(MM_SCR_PKB, sizeof(uint32_t) * (size_t)(Kq * PW));
    if (!xa || (!held && !scr)) return -1;
    if (!(t->run && packed_x.run == t->run && packed_x.x == t->x && packed_x.xa == xa &&
          packed_x.ldx == t->ldx && packed_x.M == M && packed_x.K == K)) {
        for (int64_t m = 0; m < M; m++) {
            uint16_t *o = (uint16_t *)(xa + m * Kq);
            ms_mm_bf16_cvt_f32(t->x + m * t->ldx, o, K);
            if (K & 1) o[K] = 0;
        }
        packed_x.x = t->x, packed_x.xa = xa, packed_x.ldx = t->ldx, packed_x.M = M;
        packed_x.K = K, packed_x.run = t->run;
    }
    const uint16_t *w = (const uint16_t *)W->data;
    for (int64_t n = n0; n < n1; n += PW) {
        const int64_t nc = n1 - n < PW ? n1 - n : PW;
        const int nv = (int)((nc + 15) / 16);
        const int64_t nn = n1 - n - nc < PW ? n1 - n - nc : PW; /* the next panel's rows */
        const uint32_t *pb;
        pfq pf;
        if (held) { /* the next panel follows this one: into L2 while this one computes */
            pb = held + n / PW * Kq * PW;
            pf = (pfq){(const char *)(pb + Kq * PW), 0, Kq * PW * 4, 0,
                       nn > 0 ? Kq * PW * 4 / 64 : 0};
        } else {
            pack(w + n * W->ld, W->ld, nc, K, Kq, scr);
            pb = scr;
            pf = (pfq){(const char *)(w + (n + nc) * W->ld), W->ld * 2, K * 2, 0,
                       nn > 0 ? nn * ((K * 2 + 63) / 64) : 0};
        }
        int64_t m = 0;
        float *y = t->y + n;
        for (; m + MR <= M; m += MR)
            micro_nv(MR, nv, xa + m * Kq, Kq, pb, Kq, y + m * t->ldy, t->ldy, nc, t->accumulate,
                     &pf);
        switch (M - m) { /* the row tail: 1 .. MR - 1 rows */
#define C(mb)                                                                                      \
    case mb:                                                                                       \
        micro_nv(mb, nv, xa + m * Kq, Kq, pb, Kq, y + m * t->ldy, t->ldy, nc, t->accumulate, &pf); \
        break
            C(1);
            C(2);
            C(3);
            C(4);
            C(5);
#undef C
        default:
            break;
        }
    }
    return 0;
}

/* ---- panel copies ---- */

size_t ms_kernels_panels_bytes(const ms_kctx *k, const ms_mat *W)
{
    if (!k || k->exact || k->batch_invariant || k->isa < MS_ISA_AVX512BF16 ||
        W->dtype != MS_DT_BF16 || !W->data || W->rows <= 0 || W->cols <= 0)
        return 0;
    return (size_t)((W->rows + PW - 1) / PW) * (size_t)((W->cols + 1) / 2) * PW * sizeof(uint32_t);
}

struct fill_job {
    const ms_mat *W;
    uint32_t *dst;
};

static void fill_worker(void *arg, int tid, int nt)
{
    const struct fill_job *j = arg;
    const ms_mat *W = j->W;
    const int64_t K = W->cols, Kq = (K + 1) / 2, np = (W->rows + PW - 1) / PW;
    int64_t b, e;
    ms_pool_range(np, tid, nt, 1, &b, &e);
    for (int64_t p = b; p < e; p++) {
        int64_t nr = W->rows - p * PW < PW ? W->rows - p * PW : PW;
        pack((const uint16_t *)W->data + p * PW * W->ld, W->ld, nr, K, Kq, j->dst + p * Kq * PW);
    }
}

void ms_kernels_panels_fill(const ms_kctx *k, const ms_mat *W, void *dst)
{
    if (!ms_kernels_panels_bytes(k, W)) return;
    struct fill_job j = {W, dst};
    ms_pool_run(k->pool, fill_worker, &j);
}
