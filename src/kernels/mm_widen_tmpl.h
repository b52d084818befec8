/* mm_widen_tmpl.h — the body of mm_widen.c's kernels for one weight dtype,
 * included once for BF16 and once for FP8 (under its own target pragma).
 * Before including, mm_widen.c defines WD_FP8 (0 or 1), WD_FN(name) and, for
 * both, WD_LUT, lut_init, load64 / load64_tail (64 weights -> four f32
 * vectors in a permuted order) and wd_permute (activations into that order);
 * wd_block, wd_red1 and the prepared-activation key are shared.
 * Not a header of its own: only mm_widen.c includes it.
 */

#if WD_FP8
#define WD_ES 1 /* bytes per stored weight */
#else
#define WD_ES 2
#endif

/* The prefetches for the 64 weights at p: each line into L1 and into L2. */
AI void WD_FN(prefetch)(const char *p)
{
    for (int i = 0; i < WD_ES; i++) {
        _mm_prefetch(p + 64 * i + WD_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch(p + 64 * i + WD_PF_L2_BYTES, _MM_HINT_T1);
    }
}

/* Prepares rows x[mc][ldx] for the kernels: each group of 64 columns permuted
 * into the order load64 leaves the weights in, columns K..Kp zero,
 * FP8: times 256 × the block scale of the column (srow[(c0 + k) / 128]),
 * rounded once to f32 (the exact kernels round w·s instead; both are one
 * rounding), as the FP8 conversions give code × 2^-8. */
static void WD_FN(prep)(const float *x, int64_t ldx, int64_t mc, int64_t K, int64_t Kp,
                        const float *srow, int64_t c0, float *xp)
{
    for (int64_t m = 0; m < mc; m++) {
        const float *xr = x + m * ldx;
        float *o = xp + m * Kp;
        for (int64_t k = 0; k < Kp; k += 64) {
            __m512 v[4];
            for (int q = 0; q < 4; q++) /* FP8: the activations carry 256 · scale */
                v[q] = mm_x16(xr, k + 16 * q, K, WD_FP8 ? srow : NULL, c0, 1, 256.0f);
            wd_permute(v, o + k);
        }
    }
}

/* Activation rows [m0, m0 + mc) of t prepared into xp, unless this thread
 * already did so in this pool run (slices of one product, gate and up of
 * one expert: re-preparing them per call cost 7 % of a batch-32 step on
 * the BF16 kernels, mm_bf16.c). */
static void WD_FN(prep_once)(const mm_task *t, int64_t m0, int64_t mc, int64_t K, int64_t Kp,
                             const float *srow, float *xp)
{
    const struct wd_key *p = &wd_prepped;
    const float *x = t->x + m0 * t->ldx;
    int64_t c0 = srow ? t->W->c0 : 0;
    if (t->run && p->run == t->run && p->x == x && p->xp == xp && p->srow == srow &&
        p->ldx == t->ldx && p->mc == mc && p->K == K && p->c0 == c0 && p->fp8 == WD_FP8)
        return;
    WD_FN(prep)(x, t->ldx, mc, K, Kp, srow, c0, xp);
    wd_prepped = (struct wd_key){x, xp, srow, t->ldx, mc, K, c0, t->run, WD_FP8};
}

/* One row of the gemv, columns [k0, k1) (k0 a multiple of 64; k1 too, or
 * K): a[m][q] += the row's 64-weight groups × prepared rows m (plain: FP8
 * codes converted by wd_fp8_plain_split). */
AI void WD_FN(gemv_row)(const int MB, const int plain, const WD_LUT *L, const float *xp, int64_t Kp,
                        const char *p, int64_t k0, int64_t k1, int64_t K, __m512 (*a)[4])
{
    const int64_t Kf = MS_MIN(k1, K & ~(int64_t)63);
    __m512 v[4];
    int64_t k = k0;
    for (; k < Kf; k += 64) {
        WD_FN(prefetch)(p + k * WD_ES);
        if (plain)
            WD_FN(load64_plain)(p + k * WD_ES, v);
        else
            WD_FN(load64)(L, p + k * WD_ES, v);
#pragma GCC unroll 6
        for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                a[m][q] = _mm512_fmadd_ps(v[q], _mm512_loadu_ps(xp + m * Kp + k + 16 * q), a[m][q]);
    }
    if (k < k1) { /* tail: masked weights (the tables' path); the activations are zero padded */
        WD_FN(load64_tail)(L, p + k * WD_ES, K - k, v);
#pragma GCC unroll 6
        for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                a[m][q] = _mm512_fmadd_ps(v[q], _mm512_loadu_ps(xp + m * Kp + k + 16 * q), a[m][q]);
    }
}

/* Small M: weight rows one after another (one forward stream), each 64-weight
 * group widened in registers and fed to MB ≤ WD_GEMV_M prepared rows, four
 * sums per row and activation row; the sums of a row are added in one fixed
 * order (wd_red1), so results do not depend on the split.  FP8 rows marked
 * in plain[] (ms_mat.f8_plain) take the GFNI conversion.  Columns [k0, k1):
 * where a row is summed in several such passes (wd_gemv_kc), the sums wait in
 * part[nr][MB][4] between them, so every lane adds the same products in the
 * same order as in one pass; the last pass (k1 == K) stores y. */
AI void WD_FN(gemv)(const int MB, const WD_LUT *L, const float *xp, int64_t Kp, const char *w,
                    int64_t ldw, int64_t k0, int64_t k1, int64_t K, int64_t nr,
                    const uint8_t *plain, __m512 *part, float *y, int64_t ldy, int accumulate)
{
    for (int64_t n = 0; n < nr; n++) {
        const char *p = w + n * ldw;
        _mm_prefetch(p + k0 * WD_ES + WD_PAGE_PF_BYTES, _MM_HINT_T0);
        __m512 a[WD_GEMV_M][4];
        __m512 *pn = part + n * MB * 4;
#pragma GCC unroll 6
        for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) a[m][q] = k0 ? pn[4 * m + q] : _mm512_setzero_ps();
        if (WD_FP8 && plain && plain[n] == MS_F8_ROW_PLAIN)
            WD_FN(gemv_row)(MB, 1, L, xp, Kp, p, k0, k1, K, a);
        else
            WD_FN(gemv_row)(MB, 0, L, xp, Kp, p, k0, k1, K, a);
        if (k1 < K) {
#pragma GCC unroll 6
            for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) pn[4 * m + q] = a[m][q];
            continue;
        }
#pragma GCC unroll 6
        for (int m = 0; m < MB; m++) {
            float s = wd_red1(
                _mm512_add_ps(_mm512_add_ps(a[m][0], a[m][1]), _mm512_add_ps(a[m][2], a[m][3])));
            y[m * ldy + n] = accumulate ? y[m * ldy + n] + s : s;
        }
    }
}

static void WD_FN(gemv_mb)(int MB, const WD_LUT *L, const float *xp, int64_t Kp, const char *w,
                           int64_t ldw, int64_t k0, int64_t k1, int64_t K, int64_t nr,
                           const uint8_t *plain, __m512 *part, float *y, int64_t ldy, int acc)
{
#define G(mb) WD_FN(gemv)(mb, L, xp, Kp, w, ldw, k0, k1, K, nr, plain, part, y, ldy, acc)
    switch (MB) {
    case 1:
        G(1);
        break;
    case 2:
        G(2);
        break;
    case 3:
        G(3);
        break;
    case 4:
        G(4);
        break;
    case 5:
        G(5);
        break;
    default:
        G(6);
        break;
    }
#undef G
}

/* Weight rows [0, nr) at w, columns [k0, k0 + kc) (k0 a multiple of 64),
 * widened to f32 in load64's order into out[nr][kcp], zero past K. */
static void WD_FN(widen)(const WD_LUT *L, const char *w, int64_t ldw, int64_t nr, int64_t k0,
                         int64_t kcp, int64_t K, float *out)
{
    for (int64_t r = 0; r < nr; r++) {
        const char *p = w + r * ldw;
        float *o = out + r * kcp;
        _mm_prefetch(p + (k0 + kcp) * WD_ES + WD_PAGE_PF_BYTES, _MM_HINT_T0);
        for (int64_t k = 0; k < kcp; k += 64) {
            __m512 v[4];
            int64_t rem = K - k0 - k;
            WD_FN(prefetch)(p + (k0 + k) * WD_ES);
            if (rem >= 64)
                WD_FN(load64)(L, p + (k0 + k) * WD_ES, v);
            else if (rem > 0)
                WD_FN(load64_tail)(L, p + (k0 + k) * WD_ES, rem, v);
            else
                v[0] = v[1] = v[2] = v[3] = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) _mm512_store_ps(o + k + 16 * q, v[q]);
        }
    }
}

/* Columns [n0, n1) of y for all M rows (ms_mm_widen_nt's work).
 * FP8 rows go in their 128-row scale blocks (one activation scaling each;
 * matmul.c aligns FP8 slices to them); BF16 in blocks of WD_NB rows for the
 * widened tiles.  M ≤ WD_GEMV_MAX_M streams the weights (gemv, up to six
 * activation rows per pass over 8 weight rows in L1); larger M widens
 * each block once per WD_KC columns and runs FMA-only tiles over it. */
static int WD_FN(nt)(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    const int64_t K = W->cols, Kp = (K + 63) & ~(int64_t)63, M = t->M;
    /* activation rows prepared at once.  BF16: all of them up to WD_XP_BYTES,
     * so each block is widened once per pass however many rows use it, not
     * once per WD_MC of them.  FP8 prepares them again for every 128-row
     * block (its scales), WD_MC at a time (measured: bench/RESULTS.md, "Why the code is so"). */
    const int64_t mcmax =
        MS_MIN(M, WD_FP8 ? (int64_t)WD_MC : MS_MAX((int64_t)WD_MC, WD_XP_BYTES / (Kp * 4)));
    const int tiles = M > WD_GEMV_MAX_M;
    const int64_t kcp_max = Kp < WD_KC ? Kp : WD_KC;
    float *xp = ms_mm_scratch(MM_SCR_XW, sizeof(float) * (size_t)(mcmax * Kp)); /* [mc][Kp] */
    float *wf = tiles ? ms_mm_scratch(MM_SCR_W, sizeof(float) * (size_t)(WD_NB * kcp_max)) : NULL;
    __m512 *part = tiles ? NULL /* the gemv's sums between column passes, [WD_GEMV_NB][mb][4] */
                         : ms_mm_scratch(MM_SCR_W, sizeof(__m512) * WD_GEMV_NB * WD_GEMV_M * 4);
    if (!xp || (tiles && !wf) || (!tiles && !part)) return -1;
    const int64_t ldw = W->ld * WD_ES;
    WD_LUT L;
    WD_FN(lut_init)(&L);
    for (int64_t n = n0; n < n1;) {
        int64_t ne;
        const float *srow = NULL;
#if WD_FP8
        int64_t rb = (W->r0 + n) / 128; /* one 128-row scale block of the stored matrix */
        ne = MS_MIN((rb + 1) * 128 - W->r0, n1);
        srow = W->scale + rb * W->scale_ld;
#else
        ne = tiles ? MS_MIN(n + WD_NB, n1) : n1;
#endif
        const char *w = (const char *)W->data + n * ldw;
        const uint8_t *plain = NULL; /* rows [n, ne) */
#if WD_FP8
        if (W->f8_plain) plain = W->f8_plain + (W->r0 + n - W->f8_plain_r0);
#endif
        for (int64_t m0 = 0; m0 < M; m0 += mcmax) {
            int64_t mc = MS_MIN(M - m0, mcmax);
            WD_FN(prep_once)(t, m0, mc, K, Kp, srow, xp);
            float *y0 = t->y + m0 * t->ldy;
            if (!tiles) { /* activation rows in chunks of up to six, rows in L1 between them */
                for (int64_t r = n; r < ne; r += WD_GEMV_NB) {
                    int64_t nr = MS_MIN(ne - r, (int64_t)WD_GEMV_NB);
                    for (int64_t m = 0; m < mc;) {
                        int64_t chunks = (mc - m + WD_GEMV_M - 1) / WD_GEMV_M;
                        int mb = (int)((mc - m + chunks - 1) / chunks);
                        const int64_t kc = wd_gemv_kc(mb, Kp);
                        for (int64_t k0 = 0; k0 < K; k0 += kc) WD_FN(gemv_mb)
                        (mb, &L, xp + m * Kp, Kp, w + (r - n) * ldw, ldw, k0, MS_MIN(k0 + kc, K), K,
                         nr, plain ? plain + (r - n) : NULL, part, y0 + m * t->ldy + r, t->ldy,
                         t->accumulate);
                        m += mb;
                    }
                }
                continue;
            }
            for (int64_t k0 = 0; k0 < Kp; k0 += WD_KC) {
                int64_t kcp = MS_MIN(Kp - k0, (int64_t)WD_KC);
                int add = k0 > 0 || t->accumulate;
                WD_FN(widen)(&L, w, ldw, ne - n, k0, kcp, K, wf);
                wd_block(xp + k0, Kp, mc, wf, kcp, ne - n, y0 + n, t->ldy, add);
            }
        }
        n = ne;
    }
    return 0;
}

#undef WD_ES
