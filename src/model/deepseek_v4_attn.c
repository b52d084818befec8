/* deepseek_v4_attn.c — DeepSeek-V4 attention of one layer over a batch
 * (arch.md §2.6–§2.8, §5.2): q-LoRA with a per-head unweighted RMS norm,
 * one shared K = V entry per token, RoPE on the last rope dims (plain on
 * window-only layers, YaRN at compress_rope_theta on compressed ones); the
 * compressors (ratio 4 overlapping, ratio 128) as a per-token state machine
 * whose state lives in the sequence's state slot, so a prefill chunk and
 * single decode steps run the same arithmetic; the CSA indexer (its own
 * compressor, weighted ReLU scores summed over heads in index order, top-k);
 * attention with the learned sink over the window + compressed candidates;
 * inverse RoPE on the output; the grouped low-rank output projection.
 *
 * The indexer's Hadamard rotation of q and k is left out with plain index
 * keys: it is orthogonal and applied to both, so their products are
 * unchanged.  With MXFP4 keys (--enable-deepseek-v4-fp4-indexer) or FP8 keys
 * (--kv-cache-dtype fp8_e4m3 without it) keys and queries are rotated, then
 * quantised (keys at write, queries per step), as SGLang's indexer does; --kv-cache-dtype fp8_e4m3
 * stores the main entries as FP8 ds entries (kernels/kvq.h).  Both dequantise when loaded. Cache
 * streams (deepseek_v4.h V4_S_*): window entries per token, c4 / c128 entries at the window's first
 * position, index keys per 4 tokens.  Every attention-TP member computes the shared KV, the
 * compressors and the whole indexer (replicated, the same top-k everywhere) and its own heads.
 *
 * The candidate attention runs on the pool (attend_seq): a sequence's window
 * span, C128 entries (and a prefill's C4 entries and index keys) are loaded
 * once into float rows (load_entry); a decode row's index keys are loaded 64
 * at a time by the thread that scores them (decode_index_fn), then a prefill chunk's query rows are
 * claimed by the threads, while a decode row spreads its index keys and
 * then its heads over them; either way each value is computed as the
 * reference computes it, so results equal it bit for bit whatever the
 * split (and every attention-TP member picks the same top-k).  The pool
 * jobs claim work from a counter (ms_pool_run_dynamic): a thread that an
 * oversubscribed core delays holds nothing up.  attend_rows_ref, the
 * one-row-at-a-time scalar code, stays as the twin the tests compare
 * against (ms_v4.attn_ref).  Main thread only (it drives the pool).
 */
#include "base/util.h"
#include "kernels/attn_mqa.h"
#include "kernels/kvq.h"
#include "model/deepseek_v4.h"
#include "parallel/comm.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* One cache entry of n values from src (store) or into dst (load), in its
 * stream's format: F32 or BF16 values, or packed (MS_DT_U8, kernels/kvq.h):
 * the index stream's MXFP4 keys — rotated by the normalised Hadamard matrix
 * before they are quantised, as SGLang's FP4 indexer does, so a load returns
 * the rotated key (index_rotate_q rotates the queries to match: the products
 * keep their value) — and the main streams' FP8 ds entries (e4m3 nope dims
 * with UE8M0 scales per 64, BF16 rope dims).  Quantised at write,
 * dequantised at read into float rows the attention then uses. */
/* The packed index keys are FP8 (kernels/kvq.h ms_kvq_fp8key_*), not MXFP4. */
static int index_fp8(const ms_model *m, const ms_kv_view *v)
{
    return ms_kv_view_entry_elems(v, V4_S_INDEX) == ms_kvq_fp8key_bytes(m->v4->c.idx_hd);
}

static int store_entry(const ms_model *m, const ms_kv_view *v, int stream, int layer, int64_t pos,
                       const float *src, int64_t n)
{
    void *dst = ms_kv_view_entry(v, stream, layer, pos);
    if (!dst) return MS_EINTERNAL;
    ms_dtype dt = ms_kv_view_dtype(v, stream);
    if (dt == MS_DT_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
    } else if (dt == MS_DT_BF16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = ms_f32_to_bf16(src[i]);
    } else if (stream == V4_S_INDEX) {
        float r[4096];
        if (n > 4096) return MS_EINTERNAL;
        memcpy(r, src, sizeof(float) * (size_t)n);
        ms_kvq_hadamard(r, n);
        if (index_fp8(m, v))
            ms_kvq_fp8key_pack(r, n, dst);
        else
            ms_kvq_mxfp4_pack(r, n, dst);
    } else {
        ms_kvq_fp8ds_pack(src, n, m->v4->c.dr, dst);
    }
    return 0;
}

static int load_entry(const ms_model *m, const ms_kv_view *v, int stream, int layer, int64_t pos,
                      float *dst, int64_t n)
{
    const void *src = ms_kv_view_entry(v, stream, layer, pos);
    if (!src) return MS_EINTERNAL;
    ms_dtype dt = ms_kv_view_dtype(v, stream);
    if (dt == MS_DT_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
    } else if (dt == MS_DT_BF16) {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = ms_bf16_to_f32(h[i]);
    } else if (stream == V4_S_INDEX) {
        if (index_fp8(m, v))
            ms_kvq_fp8key_unpack(src, n, dst);
        else
            ms_kvq_mxfp4_unpack(src, n, dst);
    } else {
        ms_kvq_fp8ds_unpack(src, n, m->v4->c.dr, dst);
    }
    return 0;
}

/* Floats of one compressor's state: kv and score, each [slots][c'·d]
 * (ms_v4_comp_slots: one row per position mod slots). */
static int64_t comp_state_floats(const v4_comp *cp)
{
    int64_t c = cp->overlap ? 2 : 1;
    return 2 * ms_v4_comp_slots(cp->ratio) * (c * cp->d);
}

/* The state row of position p (p >= -ratio: the empty window before 0). */
static int64_t comp_slot(const v4_comp *cp, int64_t p)
{
    int64_t R = ms_v4_comp_slots(cp->ratio);
    return (p % R + R) % R;
}

/* The compressor state of one sequence as f32 for the step: the slot itself
 * when it stores F32, else (BF16, --compress-state-dtype bf16) a copy in
 * ws->cstate that state_close rounds back.  n: floats; at: their offset in
 * the slot's values.  The state's dtype is the slot's bytes ÷ its values. */
static float *state_open(ms_model *m, const ms_kv_view *v, int64_t at, int64_t n, int *bf16)
{
    uint8_t *raw = ms_kv_view_state(v);
    int64_t values = m->v4->state_off[m->v4->c.n_layers];
    if (!raw || values <= 0) return NULL;
    *bf16 = ms_kv_view_state_bytes(v) == (size_t)values * 2;
    if (!*bf16) return (float *)raw + at;
    ms_v4_ws *w = &m->v4->ws;
    if (n > w->cap_cstate) {
        ms_free_aligned(w->cstate);
        w->cstate = ms_alloc_aligned((size_t)n, sizeof(float));
        w->cap_cstate = w->cstate ? n : 0;
        if (!w->cstate) return NULL;
    }
    const uint16_t *h = (const uint16_t *)raw + at;
    for (int64_t i = 0; i < n; i++) w->cstate[i] = ms_bf16_to_f32(h[i]);
    return w->cstate;
}

static void state_close(const ms_kv_view *v, int64_t at, int64_t n, const float *f, int bf16)
{
    if (!bf16) return;
    uint16_t *h = (uint16_t *)ms_kv_view_state(v) + at;
    for (int64_t i = 0; i < n; i++) h[i] = ms_f32_to_bf16(f[i]);
}

/* The carry snapshot (stream V4_S_CARRY) of an overlapping compressor: the
 * kv and score rows of the m positions before P (the previous window), [kv
 * m·c'd][score m·c'd] at `off` values into the entry of the share unit
 * ending at P, in the state's dtype.  Saved after a unit's last token (P =
 * pos + 1); restored when a chunk starts at a unit (P = start_pos): after a
 * prefix hit it is the state the tokens before the match left, and for a
 * sequence that just computed them it is the state it already holds (the
 * same values, so restoring changes nothing).  The ratio-128 compressor
 * needs none: at a multiple of 128 its window is empty and every slot is
 * written before it pools. */
static int64_t carry_unit(const ms_kv_view *v)
{
    const ms_kv_spec *sp = ms_kv_cache_spec(v->cache);
    return sp->n_streams > V4_S_CARRY ? sp->streams[V4_S_CARRY].tokens_per_entry : 0;
}

static void carry_copy(const ms_kv_view *v, const v4_comp *cp, int l, int64_t P, int64_t off,
                       float *kv, float *sc, int bf16, int save)
{
    uint8_t *e = ms_kv_view_entry(v, V4_S_CARRY, l, P - 1);
    if (!e) return;
    int64_t m = cp->ratio, cd = 2 * (int64_t)cp->d, n = m * cd;
    float *st[2] = {kv, sc};
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < m; i++) {
            float *row = st[k] + comp_slot(cp, P - m + i) * cd;
            int64_t at = off + k * n + i * cd;
            if (bf16) {
                uint16_t *h = (uint16_t *)e + at;
                for (int64_t j = 0; j < cd; j++)
                    if (save)
                        h[j] = ms_f32_to_bf16(row[j]);
                    else
                        row[j] = ms_bf16_to_f32(h[j]);
            } else if (save) {
                memcpy((float *)e + at, row, sizeof(float) * (size_t)cd);
            } else {
                memcpy(row, (float *)e + at, sizeof(float) * (size_t)cd);
            }
        }
}

/* The window snapshot (stream V4_S_WSNAP) at the share unit ending at `end`:
 * the window entries of tokens end − W .. end − 1 of layer l, as raw bytes in
 * the window's format.  Saved after a unit's last token; restored when a chunk
 * starts at a unit, like the carry: after a prefix hit the sequence's window
 * pages there are its own fresh ones (never shared, kv_cache.h), and for a
 * sequence that just computed them the bytes are those it holds.  A spec
 * without the stream (the planner's) does nothing. */
static int window_snapshot(const ms_model *m, const ms_kv_view *v, int l, int64_t end, int save)
{
    const ms_kv_spec *sp = ms_kv_cache_spec(v->cache);
    if (sp->n_streams <= V4_S_WSNAP || end <= 0) return 0;
    int64_t W = m->v4->c.window, unit = sp->streams[V4_S_WSNAP].tokens_per_entry;
    if (end % unit || end < W) return 0;
    uint8_t *e = ms_kv_view_entry(v, V4_S_WSNAP, l, end - 1);
    size_t b = (size_t)(sp->streams[V4_S_WSNAP].entry_elems / W);
    if (!e) return MS_EINTERNAL;
    for (int64_t k = 0; k < W; k++) {
        uint8_t *w = ms_kv_view_entry(v, V4_S_WINDOW, l, end - W + k);
        if (!w) return MS_EINTERNAL;
        if (save)
            memcpy(e + (size_t)k * b, w, b);
        else
            memcpy(w, e + (size_t)k * b, b);
    }
    return 0;
}

/* One token at pos into the compressor state (kv, sc: [slots][c'·d]) from its
 * projections a, g (c'·d), at row comp_slot(pos); returns 1 with the pooled
 * entry in out[d] when pos closes a window.  Overlap: the entry pools the
 * first-half channels of the previous window's m rows and the second-half
 * channels of the current window's; otherwise the current window's m rows. */
static int comp_token(const v4_comp *cp, float *kv, float *sc, const float *a, const float *g,
                      int64_t pos, float *out)
{
    int64_t m = cp->ratio, d = cp->d, cd = (cp->overlap ? 2 : 1) * d, r = pos % m;
    int64_t slot = comp_slot(cp, pos);
    memcpy(kv + slot * cd, a, sizeof(float) * (size_t)cd);
    for (int64_t i = 0; i < cd; i++) sc[slot * cd + i] = g[i] + cp->ape[r * cd + i];
    if ((pos + 1) % m) return 0;
    int64_t n = cp->overlap ? 2 * m : m, first = pos + 1 - n, rows[256];
    if (n > 256) return 0;
    for (int64_t i = 0; i < n; i++) rows[i] = comp_slot(cp, first + i) * cd;
    for (int64_t ch = 0; ch < d; ch++) {
        float mx = -INFINITY, s = 0, acc = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t col = cp->overlap && i >= m ? d + ch : ch;
            mx = fmaxf(mx, sc[rows[i] + col]);
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t col = cp->overlap && i >= m ? d + ch : ch;
            float e = expf(sc[rows[i] + col] - mx);
            s += e;
            acc += e * kv[rows[i] + col];
        }
        out[ch] = acc / s;
    }
    return 1;
}

/* Runs one compressor over the batch's rows (ws->u), writing each completed
 * entry (normed, roped at the window's first position) into `stream`.
 * state_at: the compressor's offset in the layer's state, in floats. */
static int compress(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                    int l, const v4_comp *cp, int stream, int64_t state_at, int64_t carry_at,
                    ms_errbuf *err)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    int64_t T = m->fwd_T, D = c->D, cd = (cp->overlap ? 2 : 1) * (int64_t)cp->d;
    ms_mm_call calls[2] = {{w->ca, cd, w->u, D, T, &cp->wkv, 0, 0},
                           {w->cg, cd, w->u, D, T, &cp->wgate, 0, 0}};
    ms_matmul_batch(&m->kctx, calls, 2);
    int64_t t = 0, half = comp_state_floats(cp) / 2;
    float out[4096];
    if (cp->d > 4096) return ms_err(err, MS_EUNSUPPORTED, "compressor width %d over 4096", cp->d);
    for (int i = 0; i < n_seqs; i++) {
        const ms_batch_seq *sq = &seqs[i];
        if (sq->n_tokens <= 0) continue;
        ms_kv_view v = {cache, sq->kv};
        int bf16 = 0;
        int64_t at = m->v4->state_off[l] + state_at;
        float *kv = state_open(m, &v, at, 2 * half, &bf16), *sc = kv + half;
        if (!kv) return ms_err(err, MS_EINTERNAL, "sequence %d holds no compressor state", i);
        int64_t unit = cp->overlap ? carry_unit(&v) : 0;
        if (sq->start_pos == 0) { /* a fresh sequence: empty windows */
            memset(kv, 0, sizeof(float) * (size_t)half);
            for (int64_t k = 0; k < half; k++) sc[k] = -INFINITY;
        } else if (unit && sq->start_pos % unit == 0) {
            carry_copy(&v, cp, l, sq->start_pos, carry_at, kv, sc, bf16, 0);
        }
        for (int32_t j = 0; j < sq->n_tokens; j++, t++) {
            int64_t pos = sq->start_pos + j;
            int closed = comp_token(cp, kv, sc, w->ca + t * cd, w->cg + t * cd, pos, out);
            if (unit && (pos + 1) % unit == 0)
                carry_copy(&v, cp, l, pos + 1, carry_at, kv, sc, bf16, 1);
            if (!closed) continue;
            int64_t p0 = pos + 1 - cp->ratio;
            ms_rmsnorm(out, out, cp->norm, 1, cp->d, cp->d, c->eps);
            ms_rope_interleaved(out + cp->d - c->dr, 1, cp->d, c->dr, m->v4->inv_freq_comp, p0);
            if (store_entry(m, &v, stream, l, p0, out, cp->d))
                return ms_err(err, MS_EINTERNAL, "layer %d: no cache entry for position %lld", l,
                              (long long)p0);
        }
        state_close(&v, at, 2 * half, kv, bf16);
    }
    return 0;
}

/* max(x, 0) as fmaxf(x, 0.0f) gives it (NaN: 0; a zero of either sign adds
 * nothing to the sums it enters, which start at +0), inline: gcc calls libm's
 * fmaxf without -ffast-math (~2 % of a 4K small-v4 prefill in perf). */
static inline float relu(float x)
{
    return x > 0.0f ? x : 0.0f;
}

/* The indexer's choice for the query at pos (row t of iq / iw): the top-k
 * compressed entries by Σ_h w_h · ReLU(q_h · K_j), j < (pos+1)/4, into
 * ws->sel; returns how many. */
static int64_t index_select(ms_model *m, const ms_kv_view *v, int l, int64_t t, int64_t pos,
                            int *rc)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    int64_t n = (pos + 1) / 4, nI = c->n_idx_heads, ihd = c->idx_hd;
    if (n == 0) return 0;
    for (int64_t j = 0; j < n; j++)
        if ((*rc = load_entry(m, v, V4_S_INDEX, l, j * 4, w->ik + j * ihd, ihd))) return 0;
    const float *iq = w->iq + t * nI * ihd;
    for (int64_t h = 0; h < nI; h++)
        for (int64_t j = 0; j < n; j++)
            w->iscore[h * n + j] = ms_dot_f32(iq + h * ihd, w->ik + j * ihd, ihd);
    const float *iw = w->iw + t * nI;
    for (int64_t j = 0; j < n; j++) {
        float s = 0;
        for (int64_t h = 0; h < nI; h++) s += iw[h] * relu(w->iscore[h * n + j]);
        w->isc[j] = s;
    }
    int k = (int)MS_MIN(n, (int64_t)c->idx_topk);
    ms_topk(w->isc, n, k, w->sel);
    return k;
}

/* Sink attention of heads [h0, h1) of one query row over candidate rows
 * cand[0 .. n) (ms_attn_mqa; sc: its scratch). */
static void attend_ptrs(const ms_v4_cfg *c, const float *sink, const float *q,
                        const float *const *cand, int64_t n, int64_t h0, int64_t h1, float *sc,
                        float *o)
{
    ms_attn_mqa(q, c->hd, cand, n, h0, h1, 1.0f / sqrtf((float)c->hd), sink, sc, o);
}

/* Sink attention of one query row (q: [H][hd]) over ncand entries in ws->cand,
 * every head in one ms_attn_mqa call on the calling thread (the threaded
 * path's heads go through the same blocks of 8 heads, so its bits are these). */
static void attend(ms_model *m, const float *sink, const float *q, int64_t ncand, float *o)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    int64_t H = m->n_local_heads, hd = c->hd;
    const float **rows = w->th[0].cand;
    for (int64_t i = 0; i < ncand; i++) rows[i] = w->cand + i * hd;
    attend_ptrs(c, sink, q, rows, ncand, 0, H, w->th[0].sc, o);
}

/* The reference twin of attend_all: one query row at a time on the calling
 * thread, its candidates copied into ws->cand (window, then C128, then the
 * indexer's C4 choice), attend(), inverse RoPE. */
static int attend_rows_ref(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs,
                           int n_seqs, int l)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    const v4_layer *lw = &m->v4->layers[l];
    int64_t H = m->n_local_heads, hd = c->hd, dr = c->dr, ratio = lw->ratio, W = c->window;
    const float *inv = ratio ? m->v4->inv_freq_comp : m->v4->inv_freq_plain;
    int rc = 0;
    int64_t t = 0;
    for (int i = 0; i < n_seqs; i++) {
        ms_kv_view v = {cache, seqs[i].kv};
        for (int32_t j = 0; j < seqs[i].n_tokens; j++, t++) {
            int64_t pos = seqs[i].start_pos + j, n = 0;
            for (int64_t p = MS_MAX(0, pos - W + 1); p <= pos && !rc; p++)
                rc = load_entry(m, &v, V4_S_WINDOW, l, p, w->cand + n++ * hd, hd);
            if (ratio == 128)
                for (int64_t e = 0; e < (pos + 1) / 128 && !rc; e++)
                    rc = load_entry(m, &v, V4_S_C128, l, e * 128, w->cand + n++ * hd, hd);
            if (ratio == 4 && !rc) {
                int64_t ns = index_select(m, &v, l, t, pos, &rc);
                for (int64_t e = 0; e < ns && !rc; e++)
                    rc = load_entry(m, &v, V4_S_C4, l, (int64_t)w->sel[e] * 4, w->cand + n++ * hd,
                                    hd);
            }
            if (rc) return rc;
            float *o = w->o + t * H * hd;
            attend(m, lw->sink, w->q + t * H * hd, n, o);
            ms_rope_interleaved(o + hd - dr, H, hd, dr, inv, -pos); /* de-rotate */
        }
    }
    return 0;
}

/* ---- the threaded path ---- */

/* One sequence's chunk: rows t0 .. t0 + n_rows at positions pos0 ..; its
 * entries as float rows: window positions wp0 .. (ws->win), C128 entries
 * 0 .. n128 or C4 entries 0 .. n_c4 (ws->cbuf), index keys 0 .. n_ik (ws->ik). */
struct seq_job {
    ms_model *m;
    const v4_layer *lw;
    ms_kv_view v;
    int l;
    int64_t t0, n_rows, pos0, wp0, n_win, n128, n_c4, n_ik;
    int64_t t, pos, ncand; /* the decode path's row and its candidate count */
    _Atomic int rc;
    _Atomic int64_t next; /* the next unclaimed item (ms_pool_run_dynamic) */
};

/* Runs fn over J's items claimed from J->next by whichever threads join
 * (on this thread alone when `work`, in entry rows, is under a pool
 * hand-off's worth). */
static void run_claimed(ms_model *m, struct seq_job *J, ms_pool_fn fn, int64_t work)
{
    atomic_store(&J->next, 0);
    if (work < 256)
        fn(J, 0, 1);
    else
        ms_pool_run_dynamic(m->pool, fn, J);
}

/* Loads the chunk's entries, claimed 64 at a time. */
static void load_fn(void *arg, int tid, int nt)
{
    struct seq_job *J = arg;
    const ms_v4_cfg *c = &J->m->v4->c;
    ms_v4_ws *w = &J->m->v4->ws;
    int64_t hd = c->hd, ihd = c->idx_hd, n_c = J->n128 + J->n_c4;
    int64_t total = J->n_win + n_c + J->n_ik;
    (void)tid, (void)nt;
    for (int64_t b; (b = atomic_fetch_add(&J->next, 64)) < total;)
        for (int64_t i = b; i < MS_MIN(b + 64, total); i++) {
            int rc;
            if (i < J->n_win)
                rc = load_entry(J->m, &J->v, V4_S_WINDOW, J->l, J->wp0 + i, w->win + i * hd, hd);
            else if (i < J->n_win + n_c)
                rc = J->n128 ? load_entry(J->m, &J->v, V4_S_C128, J->l, (i - J->n_win) * 128,
                                          w->cbuf + (i - J->n_win) * hd, hd)
                             : load_entry(J->m, &J->v, V4_S_C4, J->l, (i - J->n_win) * 4,
                                          w->cbuf + (i - J->n_win) * hd, hd);
            else
                rc = load_entry(J->m, &J->v, V4_S_INDEX, J->l, (i - J->n_win - n_c) * 4,
                                w->ik + (i - J->n_win - n_c) * ihd, ihd);
            if (rc) {
                atomic_store(&J->rc, rc);
                return;
            }
        }
}

/* Index scores of row t over keys 0 .. n (the reference's sums, in its order). */
static void index_scores(const ms_v4_cfg *c, const float *ik, const float *iq, const float *iw,
                         int64_t n, float *isc)
{
    int64_t nI = c->n_idx_heads, ihd = c->idx_hd;
    for (int64_t j = 0; j < n; j++) {
        float s = 0;
        for (int64_t h = 0; h < nI; h++)
            s += iw[h] * relu(ms_dot_f32(iq + h * ihd, ik + j * ihd, ihd));
        isc[j] = s;
    }
}

/* A decode row's head items: the blocks of 8 heads ms_attn_mqa makes of [0,
 * H), then the heads past them one at a time (so each head's arithmetic is the
 * one attend() gives it).  Item i's heads: [*h0, *h1). */
static int64_t head_items(int64_t H, int64_t hd)
{
    int64_t nb = hd % 8 == 0 ? H / 8 : 0;
    return nb + (H - nb * 8);
}
static void head_item(int64_t H, int64_t hd, int64_t i, int64_t *h0, int64_t *h1)
{
    int64_t nb = hd % 8 == 0 ? H / 8 : 0;
    *h0 = i < nb ? i * 8 : nb * 8 + (i - nb);
    *h1 = i < nb ? *h0 + 8 : *h0 + 1;
}

/* Prefill rows, claimed one at a time. */
static void rows_fn(void *arg, int tid, int nt)
{
    struct seq_job *J = arg;
    ms_model *m = J->m;
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    struct v4_th *th = &w->th[tid];
    int64_t H = m->n_local_heads, hd = c->hd, dr = c->dr, ratio = J->lw->ratio, W = c->window;
    int64_t nI = c->n_idx_heads, ihd = c->idx_hd;
    const float *inv = ratio ? m->v4->inv_freq_comp : m->v4->inv_freq_plain;
    (void)nt;
    for (int64_t j; (j = atomic_fetch_add(&J->next, 1)) < J->n_rows;) {
        int64_t t = J->t0 + j, pos = J->pos0 + j, n = 0;
        for (int64_t p = MS_MAX(0, pos - W + 1); p <= pos; p++)
            th->cand[n++] = w->win + (p - J->wp0) * hd;
        if (ratio == 128)
            for (int64_t e = 0; e < (pos + 1) / 128; e++) th->cand[n++] = w->cbuf + e * hd;
        if (ratio == 4 && (pos + 1) / 4 > 0) {
            int64_t nk = (pos + 1) / 4;
            index_scores(c, w->ik, w->iq + t * nI * ihd, w->iw + t * nI, nk, th->isc);
            int k = (int)MS_MIN(nk, (int64_t)c->idx_topk);
            ms_topk(th->isc, nk, k, th->sel);
            for (int e = 0; e < k; e++) th->cand[n++] = w->cbuf + (int64_t)th->sel[e] * hd;
        }
        float *o = w->o + t * H * hd;
        attend_ptrs(c, J->lw->sink, w->q + t * H * hd, th->cand, n, 0, H, th->sc, o);
        ms_rope_interleaved(o + hd - dr, H, hd, dr, inv, -pos); /* de-rotate */
    }
}

/* The index scores of a sequence's decode rows t0 .. t0 + n_rows (a decode's
 * one, a verify's S + 1), keys claimed 64 at a time: each block is
 * dequantised (load_entry) once into the thread's own 64 rows (th->kb, in L1)
 * and scored for every row that sees it (row j: the keys of positions up to
 * pos0 + j), instead of every key of the context going through one shared
 * buffer first, or each verify row dequantising the keys again (the fused form
 * of load + score: the same values and the same sums, so the reference twin's
 * results bit for bit).  FP8 and MXFP4 keys are scored straight from their
 * codes (ms_kvq_fp8key_dots, ms_kvq_mxfp4_dots: each key made once in registers
 * for all the heads, no unpacked rows; their dots equal ms_dot_f32 of the
 * unpacked key bit for bit, so again the twin's results).  Row j's scores: ws->isr + j * cap_S. */
static void decode_index_fn(void *arg, int tid, int nt)
{
    struct seq_job *J = arg;
    const ms_v4_cfg *c = &J->m->v4->c;
    ms_v4_ws *w = &J->m->v4->ws;
    float *kb = w->th[tid].kb;
    int64_t nI = c->n_idx_heads, ihd = c->idx_hd, nk = (J->pos0 + J->n_rows) / 4;
    (void)nt;
    /* packed keys (FP8, or MXFP4 under --enable-deepseek-v4-fp4-indexer): scored from
     * their codes */
    int pk = ms_kv_view_dtype(&J->v, V4_S_INDEX) == MS_DT_U8 && nI <= 256;
    int f8 = pk && index_fp8(J->m, &J->v);
    for (int64_t b; (b = atomic_fetch_add(&J->next, 64)) < nk;) {
        int64_t n = MS_MIN(64, nk - b);
        if (pk) { /* packed keys: scored from their codes (index_scores' sums, bit for bit) */
            for (int64_t j = 0; j < n; j++) {
                const uint8_t *e = ms_kv_view_entry(&J->v, V4_S_INDEX, J->l, (b + j) * 4);
                if (!e) {
                    atomic_store(&J->rc, MS_EINTERNAL);
                    return;
                }
                /* the rows that see key b + j are a suffix r0 .. n_rows - 1 and their
                 * queries are contiguous (ws->iq + t·nI·ihd): one call makes the key once
                 * for all of them (each head's dot its own lanes: the same bits) */
                int64_t r0 = 0;
                while (r0 < J->n_rows && b + j >= (J->pos0 + r0 + 1) / 4) r0++;
                for (int64_t rc = r0; rc < J->n_rows; rc += 1024 / nI) {
                    int64_t nr = MS_MIN(J->n_rows - rc, 1024 / nI), t = J->t0 + rc;
                    float d[1024];
                    if (f8)
                        ms_kvq_fp8key_dots(w->iq + t * nI * ihd, nI * nr, ihd, e, ihd, d);
                    else
                        ms_kvq_mxfp4_dots(w->iq + t * nI * ihd, nI * nr, ihd, e, ihd, d);
                    for (int64_t r = 0; r < nr; r++) {
                        const float *iw = w->iw + (t + r) * nI;
                        float s = 0;
                        for (int64_t h = 0; h < nI; h++) s += iw[h] * relu(d[r * nI + h]);
                        w->isr[(rc + r) * w->cap_S + b + j] = s;
                    }
                }
            }
            continue;
        }
        for (int64_t j = 0; j < n; j++) {
            int rc = load_entry(J->m, &J->v, V4_S_INDEX, J->l, (b + j) * 4, kb + j * ihd, ihd);
            if (rc) {
                atomic_store(&J->rc, rc);
                return;
            }
        }
        for (int64_t r = 0; r < J->n_rows; r++) {
            int64_t t = J->t0 + r, nr = MS_MIN(n, (J->pos0 + r + 1) / 4 - b);
            if (nr > 0)
                index_scores(c, kb, w->iq + t * nI * ihd, w->iw + t * nI, nr,
                             w->isr + r * w->cap_S + b);
        }
    }
}

/* A decode row's head items (head_item), claimed one at a time (candidates:
 * ws->th[0].cand). */
static void decode_heads_fn(void *arg, int tid, int nt)
{
    struct seq_job *J = arg;
    const ms_v4_cfg *c = &J->m->v4->c;
    ms_v4_ws *w = &J->m->v4->ws;
    int64_t H = J->m->n_local_heads, hd = c->hd;
    (void)nt;
    for (int64_t i, h0, h1; (i = atomic_fetch_add(&J->next, 1)) < head_items(H, hd);) {
        head_item(H, hd, i, &h0, &h1);
        attend_ptrs(c, J->lw->sink, w->q + J->t * H * hd, w->th[0].cand, J->ncand, h0, h1,
                    w->th[tid].sc, w->o + J->t * H * hd);
    }
}

/* One decode row (its index scores over the keys already in ws->isr, by
 * decode_index_fn for the sequence's rows): the top-k and its candidates on
 * this thread, then its heads on the pool (the reference's arithmetic, split). */
static int decode_row(struct seq_job *J)
{
    ms_model *m = J->m;
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    const v4_layer *lw = J->lw;
    int64_t H = m->n_local_heads, hd = c->hd, dr = c->dr, ratio = lw->ratio, W = c->window;
    int64_t pos = J->pos, n = 0;
    const float *inv = ratio ? m->v4->inv_freq_comp : m->v4->inv_freq_plain;
    const float **cand = w->th[0].cand;
    for (int64_t p = MS_MAX(0, pos - W + 1); p <= pos; p++) cand[n++] = w->win + (p - J->wp0) * hd;
    if (ratio == 128)
        for (int64_t e = 0; e < (pos + 1) / 128; e++) cand[n++] = w->cbuf + e * hd;
    if (ratio == 4 && (pos + 1) / 4 > 0) {
        int64_t nk = (pos + 1) / 4;
        int k = (int)MS_MIN(nk, (int64_t)c->idx_topk);
        const float *isr = w->isr + (J->t - J->t0) * w->cap_S;
        ms_topk(isr, nk, k, w->sel);
        if (m->v4->topk_probe)
            m->v4->topk_probe(m->v4->topk_probe_ctx, J->l, pos,
                              w->iq + J->t * c->n_idx_heads * c->idx_hd,
                              w->iw + J->t * c->n_idx_heads, nk, w->sel, k);
        for (int e = 0; e < k; e++) {
            int rc =
                load_entry(m, &J->v, V4_S_C4, J->l, (int64_t)w->sel[e] * 4, w->cand + e * hd, hd);
            if (rc) return rc;
            cand[n++] = w->cand + e * hd;
        }
    }
    J->ncand = n;
    run_claimed(m, J, decode_heads_fn, H * n / 8);
    ms_rope_interleaved(w->o + J->t * H * hd + hd - dr, H, hd, dr, inv, -pos); /* de-rotate */
    return 0;
}

/* Every query row of the batch, a sequence at a time. */
static int attend_all(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                      int l)
{
    const ms_v4_cfg *c = &m->v4->c;
    const v4_layer *lw = &m->v4->layers[l];
    int nt = ms_pool_size(m->pool) > 0 ? ms_pool_size(m->pool) : 1;
    int64_t t = 0;
    for (int i = 0; i < n_seqs; t += MS_MAX(seqs[i].n_tokens, 0), i++) {
        const ms_batch_seq *sq = &seqs[i];
        if (sq->n_tokens <= 0) continue;
        int64_t pos0 = sq->start_pos, last = pos0 + sq->n_tokens - 1;
        int rows = sq->n_tokens >= 2 * nt;
        struct seq_job J = {.m = m,
                            .lw = lw,
                            .v = {cache, sq->kv},
                            .l = l,
                            .t0 = t,
                            .n_rows = sq->n_tokens,
                            .pos0 = pos0,
                            .wp0 = MS_MAX(0, pos0 - c->window + 1)};
        J.n_win = last - J.wp0 + 1;
        J.n128 = lw->ratio == 128 ? (last + 1) / 128 : 0;
        J.n_c4 = lw->ratio == 4 && rows ? (last + 1) / 4 : 0;
        J.n_ik = lw->ratio == 4 && rows ? (last + 1) / 4 : 0; /* decode rows: decode_index_fn */
        atomic_init(&J.rc, 0);
        atomic_init(&J.next, 0);
        run_claimed(m, &J, load_fn, J.n_win + J.n128 + J.n_c4 + J.n_ik);
        if (atomic_load(&J.rc)) return atomic_load(&J.rc);
        if (rows) {
            run_claimed(m, &J, rows_fn, 256);
            continue;
        }
        if (lw->ratio == 4 && (last + 1) / 4 > 0) { /* every row's index scores, one pass */
            run_claimed(m, &J, decode_index_fn,
                        (last + 1) / 4 * c->n_idx_heads / 16 * sq->n_tokens);
            if (atomic_load(&J.rc)) return atomic_load(&J.rc);
        }
        for (int64_t j = 0; j < sq->n_tokens; j++) {
            J.t = t + j, J.pos = pos0 + j;
            int rc = decode_row(&J);
            if (rc) return rc;
        }
    }
    return 0;
}

int ms_v4_store_window(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                       int l, ms_errbuf *err)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    const v4_layer *lw = &m->v4->layers[l];
    int64_t T = m->fwd_T, hd = c->hd, dr = c->dr, t = 0;
    const float *inv = lw->ratio ? m->v4->inv_freq_comp : m->v4->inv_freq_plain;
    if (T == 0) return 0;
    ms_matmul(&m->kctx, w->kv, hd, w->u, c->D, T, &lw->wkv, 0);
    ms_rmsnorm(w->kv, w->kv, lw->kv_norm, T, hd, hd, c->eps);
    for (int i = 0; i < n_seqs; i++) {
        ms_kv_view v = {cache, seqs[i].kv};
        for (int32_t j = 0; j < seqs[i].n_tokens; j++, t++) {
            int64_t pos = seqs[i].start_pos + j;
            ms_rope_interleaved(w->kv + t * hd + hd - dr, 1, hd, dr, inv, pos);
            if (store_entry(m, &v, V4_S_WINDOW, l, pos, w->kv + t * hd, hd))
                return ms_err(err, MS_EINTERNAL, "layer %d: no window entry for position %lld", l,
                              (long long)pos);
        }
    }
    return 0;
}

int ms_v4_attention(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                    int l, ms_errbuf *err)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_v4_ws *w = &m->v4->ws;
    const v4_layer *lw = &m->v4->layers[l];
    const ms_kctx *k = &m->kctx;
    int64_t T = m->fwd_T, D = c->D, H = m->n_local_heads, hd = c->hd, dr = c->dr;
    int64_t nI = c->n_idx_heads, ihd = c->idx_hd, ratio = lw->ratio, W = c->window;
    int64_t G = m->v4->n_local_groups, R = c->o_lora;
    const float *inv = ratio ? m->v4->inv_freq_comp : m->v4->inv_freq_plain;
    int rc;
    if (T == 0) return 0;
    if (ms_v4_ws_attn_reserve(m, W + m->fwd_S / 4 + m->fwd_S / 128 + 8, T + W))
        return ms_err(err, MS_ENOMEM, "out of memory (attention workspace)");
    /* queries and the shared KV entry */
    ms_mm_call in[2] = {{w->qr, c->q_lora, w->u, D, T, &lw->wq_a, 0, 0},
                        {w->kv, hd, w->u, D, T, &lw->wkv, 0, 0}};
    ms_matmul_batch(k, in, 2);
    ms_rmsnorm(w->qr, w->qr, lw->q_norm, T, c->q_lora, c->q_lora, c->eps);
    ms_rmsnorm(w->kv, w->kv, lw->kv_norm, T, hd, hd, c->eps);
    ms_matmul(k, w->q, H * hd, w->qr, c->q_lora, T, &lw->wq_b, 0);
    ms_rmsnorm(w->q, w->q, NULL, T * H, hd, hd, c->eps);
    int64_t t = 0;
    for (int i = 0; i < n_seqs; i++) {
        ms_kv_view v = {cache, seqs[i].kv};
        if (seqs[i].n_tokens > 0 && window_snapshot(m, &v, l, seqs[i].start_pos, 0))
            return ms_err(err, MS_EINTERNAL, "layer %d: no window snapshot to restore at %lld", l,
                          (long long)seqs[i].start_pos);
        for (int32_t j = 0; j < seqs[i].n_tokens; j++, t++) {
            int64_t pos = seqs[i].start_pos + j;
            ms_rope_interleaved(w->q + t * H * hd + hd - dr, H, hd, dr, inv, pos);
            ms_rope_interleaved(w->kv + t * hd + hd - dr, 1, hd, dr, inv, pos);
            if (store_entry(m, &v, V4_S_WINDOW, l, pos, w->kv + t * hd, hd) ||
                window_snapshot(m, &v, l, pos + 1, 1))
                return ms_err(err, MS_EINTERNAL, "layer %d: no window entry for position %lld", l,
                              (long long)pos);
        }
    }
    /* compressed entries (and the indexer's keys and queries) before any query reads them */
    if (ratio && (rc = compress(m, cache, seqs, n_seqs, l, &lw->comp,
                                ratio == 4 ? V4_S_C4 : V4_S_C128, 0, 0, err)))
        return rc;
    if (ratio == 4) {
        if ((rc = compress(m, cache, seqs, n_seqs, l, &lw->icomp, V4_S_INDEX,
                           comp_state_floats(&lw->comp), 2 * 4 * (2 * (int64_t)hd), err)))
            return rc;
        ms_mm_call ic[2] = {{w->iq, nI * ihd, w->qr, c->q_lora, T, &lw->iwq_b, 0, 0},
                            {w->iw, nI, w->u, D, T, &lw->iwproj, 0, 0}};
        ms_matmul_batch(k, ic, 2);
        float ws_scale = 1.0f / sqrtf((float)ihd) / sqrtf((float)nI);
        for (int64_t i = 0; i < T * nI; i++) w->iw[i] *= ws_scale;
        t = 0;
        for (int i = 0; i < n_seqs; i++)
            for (int32_t j = 0; j < seqs[i].n_tokens; j++, t++)
                ms_rope_interleaved(w->iq + t * nI * ihd + ihd - dr, nI, ihd, dr, inv,
                                    seqs[i].start_pos + j);
        ms_kv_view v0 = {cache, seqs[0].kv};
        if (ms_kv_view_dtype(&v0, V4_S_INDEX) == MS_DT_U8) { /* MXFP4 / FP8 keys: rotate */
            int f8 = index_fp8(m, &v0);                      /* and quantise the queries too */
            for (int64_t r = 0; r < T * nI; r++) {
                ms_kvq_hadamard(w->iq + r * ihd, ihd);
                if (f8)
                    ms_kvq_fp8key_round(w->iq + r * ihd, ihd);
                else
                    ms_kvq_mxfp4_round(w->iq + r * ihd, ihd);
            }
        }
    }
    rc = m->v4->attn_ref ? attend_rows_ref(m, cache, seqs, n_seqs, l)
                         : attend_all(m, cache, seqs, n_seqs, l);
    if (rc)
        return ms_err(err, MS_EINTERNAL,
                      "layer %d: a cache entry of a query's candidates is missing", l);
    /* grouped low-rank output: z_g = wo_a[g] · o_g, f = wo_b · z */
    int64_t hg = H / G * hd; /* values of one group */
    ms_mat wa[64];
    ms_mm_call oc[64];
    for (int64_t g0 = 0; g0 < G; g0 += 64) {
        int n = (int)MS_MIN(64, G - g0);
        for (int b = 0; b < n; b++) {
            int64_t g = g0 + b;
            wa[b] = ms_mat_slice(&lw->wo_a, g * R, R, 0, lw->wo_a.cols);
            oc[b] = (ms_mm_call){w->z + g * R, G * R, w->o + g * hg, H * hd, T, &wa[b], 0, 0};
        }
        ms_matmul_batch(k, oc, n);
    }
    ms_matmul(k, w->f, D, w->z, G * R, T, &lw->wo_b, 0);
    if (H != c->H) { /* heads split: partial sums over the attention-TP group */
        ms_comm_set_tag(l);
        if ((rc = ms_comm_allreduce_f32(m->shard->attn_group, w->f, (size_t)(T * D), err)))
            return rc;
    }
    return 0;
}
