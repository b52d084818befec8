/* deepseek_v3.c — the DeepSeek-V2/V3 forward pass on one rank (arch.md §1,
 * §5.1): embedding, pre-norm blocks of MLA + dense MLP or MoE, final norm,
 * lm_head.  MLA reads and writes the KV cache through ms_kv_view (one
 * stream, "latent"): per token and layer it
 * caches the normalised latent c_kv (kv_lora_rank) and the roped k_pe
 * (qk_rope_head_dim).  Chunks of several new tokens use the naive form
 * (K/V expanded from the latents, GEMMs per head); single-token decode uses
 * the absorbed form over the latents.  Both are the same math.
 * Workspace is grow-only, so steady-state decode does not allocate.
 * Main thread only.
 */
#include "base/util.h"
#include "model/config_json.h"
#include "model/deepseek_v4.h"
#include "model/model.h"
#include "kernels/attn.h"
#include "kernels/attn_prefill.h"
#include "moe/mlp_layer.h"
#include "moe/moe.h"
#include "parallel/comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Optional phase timing (MOESERVE_PROFILE=1): wall seconds per phase of the
 * forward, the target's and the MTP draft layer's apart, printed when the model
 * is freed.  Costs two clock reads per phase. */
enum { PH_QKV, PH_ATTN_DEC, PH_ATTN_PRE, PH_O, PH_MLP, PH_MOE, PH_HEAD, PH_EH, PH_N };
static const char *const ph_name[PH_N] = {"qkv+rope+cache", "attn decode",  "attn prefill",
                                          "o_proj",         "dense mlp",    "moe",
                                          "lm_head",        "eh_proj+norms"};
static double ph_sec[2][PH_N]; /* [0] the target's forward, [1] the draft's */
static int ph_on = -1, ph_set;
static double ph_t;
static void ph_mark(int phase)
{
    if (ph_on < 0) ph_on = getenv("MOESERVE_PROFILE") != NULL;
    if (!ph_on) return;
    double now = ms_now_s();
    if (phase >= 0) ph_sec[ph_set][phase] += now - ph_t;
    ph_t = now;
}

void ms_model_profile_print(void)
{
    if (ph_on <= 0) return;
    double tot = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < PH_N; i++) tot += ph_sec[s][i];
    if (tot == 0) return;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < PH_N; i++)
            if (ph_sec[s][i] > 0 || (s == 0 && i < PH_EH))
                fprintf(stderr, "profile %s%-16s %8.3f s %5.1f%%\n", s ? "draft " : "", ph_name[i],
                        ph_sec[s][i], 100 * ph_sec[s][i] / tot);
    memset(ph_sec, 0, sizeof ph_sec); /* each print covers the time since the last */
}

enum { MAX_BLOCK_HEADS = 128 }; /* heads per batched product call */
/* prefill attention: rows per causal sub-block of a query block (of at most
 * QB_MAX rows, so MAX_SUB sub-blocks; MAX_BLOCK_HEADS · MAX_SUB calls fit one
 * ms_matmul_batch) */
enum { QB_MAX = 128, SUB_ROWS = 32, MAX_SUB = QB_MAX / SUB_ROWS };

struct ms_model_ws {
    int64_t cap_T;
    int64_t cap_S;  /* context rows ascr serves (the absorbed rows' attention) */
    int64_t cap_Sp; /* context rows lat, kv, sc, kh and vh serve (the naive form's) */
    float *x;       /* [T][D] residual stream */
    float *u;       /* [T][D] normed input of a sub-block */
    float *qa;      /* [T][q_lora] */
    float *q;       /* [T][H*(dn+dr)] */
    float *kva;     /* [T][c+dr] */
    float *attn;    /* [T][H*dv] */
    float *y;       /* [T][D] sub-block output */
    float *g, *up;  /* [T][inter] dense MLP scratch */
    /* prefill (naive form) attention scratch, sized by its S (cap_Sp) */
    float *lat;     /* [S][c+dr] cache rows as f32 */
    float *kv;      /* [S][H*(dn+dv)] expanded keys/values (naive form) */
    float *sc;      /* [cap_sc] prefill scores of one query block [QB][H][S_b] */
    float *qabs;    /* [T][H][c+dr] absorbed queries of the decode rows */
    float *ctx;     /* [T][H][c] attention context of the decode rows */
    float *dq;      /* [T][H][dn+dr] queries of the decode rows, packed */
    float *dout;    /* [T][H][dv] outputs of the decode rows, packed */
    float *ascr;    /* attention kernel scratch, sized by cap_S */
    int64_t cap_sc; /* floats in sc */
    float *kh;      /* [cap_kh] prefill keys of one head group, transposed [HG][dn+dr][S]
                     * (or the fused kernel's blocks, S rounded up to 64) */
    int64_t cap_kh;
    float *vh;         /* [cap_kh / (dn+dr) · dv] its values, packed [HG][S][dv] */
    const void **pptr; /* [cap_pptr] page pointers of the decode rows' sequences */
    int64_t cap_pptr;
    ms_attn_seq *aseq; /* [cap_aseq] the decode rows' sequences */
    int64_t cap_aseq;
    float *hn;          /* [T][D] final normed rows of the logit (and hidden) positions */
    float *cat;         /* [T][2D] the draft layer's [enorm(embedding), hnorm(hidden)] */
    ms_batch_seq *kseq; /* [cap_kseq] the draft's sequences cut to their output rows */
    int cap_kseq;
    float *logits; /* [cap_logits_rows][vocab] */
    int64_t cap_logits_rows;
    ms_comm_p2p *head_ops; /* [cap_head_ops] rank 0's receives of the split LM head */
    int cap_head_ops;
    ms_mat att_w[MAX_BLOCK_HEADS * MAX_SUB];         /* prefill attention's per-call weights */
    ms_mm_call att_calls[MAX_BLOCK_HEADS * MAX_SUB]; /* and calls (attn_naive) */
    ms_mlp_ws mlp;
};

void ms_model_ws_free(ms_model_ws *ws);
int ms_model_ws_new(ms_model *m, ms_errbuf *err);

void ms_model_ws_free(ms_model_ws *ws)
{
    if (!ws) return;
    float **bufs[] = {&ws->x,      &ws->u,  &ws->qa,   &ws->q,   &ws->kva, &ws->attn,
                      &ws->y,      &ws->g,  &ws->up,   &ws->lat, &ws->kv,  &ws->kh,
                      &ws->vh,     &ws->sc, &ws->qabs, &ws->ctx, &ws->hn,  &ws->cat,
                      &ws->logits, &ws->dq, &ws->dout, &ws->ascr};
    for (size_t i = 0; i < MS_ARRAY_LEN(bufs); i++) {
        ms_free_aligned(*bufs[i]);
        *bufs[i] = NULL;
    }
    ms_mlp_ws_free(&ws->mlp);
    free(ws->head_ops);
    free(ws->pptr);
    free(ws->aseq);
    free(ws->kseq);
    free(ws);
}

void ms_model_mlp_counters(const ms_model *m, ms_mlp_counters *out)
{
    const ms_mlp_ws *w = m->v4 ? &m->v4->ws.mlp : m->ws ? &m->ws->mlp : NULL; /* either family */
    *out = w ? (ms_mlp_counters){w->n_max_len, w->n_sum_len, w->dispatch_rows, w->expert_rows,
                                 w->shared_remote}
             : (ms_mlp_counters){0};
}

int ms_model_ws_new(ms_model *m, ms_errbuf *err)
{
    m->ws = calloc(1, sizeof *m->ws);
    return m->ws ? 0 : ms_err(err, MS_ENOMEM, "out of memory (workspace)");
}

#define REALLOC_F(ptr, n)                                                                          \
    do {                                                                                           \
        ms_free_aligned(ptr);                                                                      \
        (ptr) = ms_alloc_aligned((size_t)(n), sizeof(float));                                      \
        if (!(ptr)) return MS_ENOMEM;                                                              \
    } while (0)

/* Room for T rows, absorbed rows over contexts of up to S rows and naive
 * (prefill) rows over up to S_pre; capacities only grow (doubling).  The
 * naive form's buffers are sized by S_pre alone: sized by a decode's S they
 * grew (and were zeroed, hundreds of MB) in the step that first crossed the
 * prefill's capacity, and were never read by decode. */
static int ws_reserve(ms_model *m, int64_t T, int64_t S, int64_t S_pre)
{
    ms_model_ws *ws = m->ws;
    const ms_config *c = &m->cfg;
    int64_t D = c->hidden_size, H = c->n_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
            dv = c->v_head_dim, kvr = c->kv_lora_rank;
    if (T > ws->cap_T) {
        T = MS_MAX(T, 2 * ws->cap_T);
        REALLOC_F(ws->x, T * D);
        REALLOC_F(ws->u, T * D);
        REALLOC_F(ws->qa, T * MS_MAX(c->q_lora_rank, 1));
        REALLOC_F(ws->q, T * H * (dn + dr));
        REALLOC_F(ws->kva, T * (kvr + dr));
        REALLOC_F(ws->attn, T * H * dv);
        REALLOC_F(ws->y, T * D);
        REALLOC_F(ws->g, T * MS_MAX(c->intermediate_size, 1));
        REALLOC_F(ws->up, T * MS_MAX(c->intermediate_size, 1));
        REALLOC_F(ws->hn, T * D);
        REALLOC_F(ws->cat, T * 2 * D);
        REALLOC_F(ws->qabs, T * H * (kvr + dr));
        REALLOC_F(ws->ctx, T * H * kvr);
        REALLOC_F(ws->dq, T * H * (dn + dr));
        REALLOC_F(ws->dout, T * H * dv);
        ws->cap_T = T;
        ws->cap_Sp = 0; /* sc depends on T too */
    }
    if (S_pre > ws->cap_Sp) {
        S = MS_MAX(MS_MAX(S_pre, 2 * ws->cap_Sp), 256);
        REALLOC_F(ws->lat, S * (kvr + dr));
        REALLOC_F(ws->kv, S * H * (dn + dv));
        /* prefill scores: a block of up to 128 queries × H heads × S keys,
         * at most 16 M floats unless one query's H × S needs more */
        ws->cap_sc = MS_MAX(H * S, MS_MIN(MS_MIN(ws->cap_T, 128) * H * S, (int64_t)1 << 24));
        REALLOC_F(ws->sc, ws->cap_sc);
        /* prefill keys: every head at once up to 16 M floats, else fewer */
        int64_t S64 = ms_attn_prefill_keys(S);
        ws->cap_kh = MS_MAX(S64 * (dn + dr), MS_MIN(H * S64 * (dn + dr), (int64_t)1 << 24));
        REALLOC_F(ws->kh, ws->cap_kh);
        REALLOC_F(ws->vh, ws->cap_kh / (dn + dr) * dv);
        ws->cap_Sp = S;
    }
    if (S > ws->cap_S) {
        S = MS_MAX(MS_MAX(S, 2 * ws->cap_S), 256);
        REALLOC_F(ws->ascr, ms_attn_scratch_floats(ms_pool_size(m->pool), kvr + dr, H, S));
        ws->cap_S = S;
    }
    return 0;
}

/* Sequences whose rows take the absorbed form: decodes, and verify rows
 * (each of their positions one decode row over the context up to it: the
 * same causal attention, and a verify then costs what its rows cost).  Under
 * --enable-deterministic-inference every row does, prefill chunks too: the
 * naive form's sums (q·k over dn + dr, p·v over the expanded values) are not
 * the absorbed form's (over kvr + dr, then W_UV), so a position computed in a
 * prefill chunk would round unlike the same position decoded, and a retracted
 * request (its prompt and generated tokens recomputed as prefill chunks) or a
 * prefix hit that leaves one token would part from the request run alone.
 * In the absorbed form row j of a chunk is one decode row over positions
 * 0 .. start + j (ms_attn_decode sums each row alone, in one order), so a
 * position's attention has the same bits in a decode step, in a chunk of any
 * length and at any chunk boundary. */
static int absorbed(const ms_model *m, const ms_batch_seq *sq)
{
    if (sq->n_tokens <= 0) return 0;
    return sq->n_tokens == 1 || sq->kind == MS_SEQ_VERIFY || m->kctx.batch_invariant;
}

/* Page-table and sequence arrays for the decode rows of this batch (grown,
 * never shrunk: steady decode allocates nothing). */
static int ws_reserve_decode(ms_model *m, int page_size, const ms_batch_seq *seqs, int n_seqs)
{
    ms_model_ws *ws = m->ws;
    int64_t rows = 0;
    for (int i = 0; i < n_seqs; i++) rows += absorbed(m, &seqs[i]) ? seqs[i].n_tokens : 0;
    /* sized from the workspace's context capacity (which doubles), not from
     * this step's lengths, so a context crossing a page boundary grows nothing */
    int64_t pages = rows * (ws->cap_S / page_size + 1);
    void *pp = ws->pptr, *as = ws->aseq;
    int rc = ms_grow_array(&pp, &ws->cap_pptr, pages, sizeof(void *));
    ws->pptr = pp;
    if (!rc) rc = ms_grow_array(&as, &ws->cap_aseq, rows, sizeof(ms_attn_seq));
    ws->aseq = as;
    return rc;
}

enum { LATENT = 0 }; /* the family's one cache stream (dsv3_kv_spec) */

/* The latent cache's row: c_kv then k_pe, in the pool's dtype.  FP8
 * (--kv-cache-dtype fp8_e4m3) stores both parts as e4m3 with the per-tensor
 * scale 1.0, as SGLang's MLA cache does by default (k_scale = 1: values
 * rounded to nearest even, saturated at ±448); reads are exact. */
static void store_row(const ms_kv_view *v, int layer, int64_t pos, const float *src, int64_t n)
{
    void *dst = ms_kv_view_entry(v, LATENT, layer, pos);
    ms_dtype dt = ms_kv_view_dtype(v, LATENT);
    if (dt == MS_DT_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
    } else if (dt == MS_DT_F8E4M3) {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = ms_f32_to_fp8e4m3(src[i]);
    } else {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = ms_f32_to_bf16(src[i]);
    }
}

/* Cache rows 0..S-1 of one sequence and layer as f32 [S][row]. */
static void load_rows(const ms_kv_view *v, int layer, int64_t S, float *out)
{
    int64_t row = ms_kv_view_entry_elems(v, LATENT), ps = ms_kv_view_page_size(v);
    for (int64_t s0 = 0; s0 < S; s0 += ps) {
        int64_t n = MS_MIN(ps, S - s0);
        const void *src = ms_kv_view_entry(v, LATENT, layer, s0); /* a page's rows are contiguous */
        ms_dtype dt = ms_kv_view_dtype(v, LATENT);
        if (dt == MS_DT_F32) {
            memcpy(out + s0 * row, src, sizeof(float) * (size_t)(n * row));
        } else if (dt == MS_DT_F8E4M3) {
            const uint8_t *b = src;
            for (int64_t i = 0; i < n * row; i++) out[s0 * row + i] = ms_fp8e4m3_to_f32(b[i]);
        } else {
            const uint16_t *h = src;
            for (int64_t i = 0; i < n * row; i++) out[s0 * row + i] = ms_bf16_to_f32(h[i]);
        }
    }
}

/* Softmax rows of one prefill block: row r = (i - i0)·H + h of sc [rows][S_b]
 * holds the scores of query i (position p0 + i) for head h; scaled, softmaxed
 * over the causal prefix (p0 + i + 1 keys) and zeroed after it. */
struct sm_job {
    float *sc;
    int64_t rows, hg, S_b, p0, i0; /* row r: query i0 + r / hg */
    float scale;
};

static void softmax_rows(void *arg, int tid, int nt)
{
    struct sm_job *j = arg;
    int64_t r0, r1;
    ms_pool_range(j->rows, tid, nt, 1, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        float *sr = j->sc + r * j->S_b;
        int64_t valid = j->p0 + j->i0 + r / j->hg + 1;
        for (int64_t s = 0; s < valid; s++) sr[s] *= j->scale;
        ms_softmax(sr, valid);
        memset(sr + valid, 0, sizeof(float) * (size_t)(j->S_b - valid));
    }
}

/* The keys of one head group transposed: kt[b][c][s] = component c of
 * [k_nope | k_rope] of head g0 + b at position s (blocked: in the fused
 * kernel's blocks of 64 positions, ms_attn_prefill_kt_at, heads S64 · qd
 * apart); and its values packed,
 * vt[b][s] = v of head g0 + b at position s (in kv they are H·kvd floats
 * apart, so the context product would read rows that fall in a few cache
 * sets; measured: bench/RESULTS.md, "Why the code is so").  Split by heads. */
struct kt_job {
    const float *kv, *lat; /* [S][H·kvd], [S][row] */
    float *kt;             /* [hg][qd][S] */
    float *vt;             /* [hg][S][dv] */
    int64_t S, H, g0, hg, dn, dr, dv, kvd, kvr, row;
    int blocked;
};

static void kt_heads(void *arg, int tid, int nt)
{
    const struct kt_job *j = arg;
    int64_t b0, b1, qd = j->dn + j->dr;
    ms_pool_range(j->hg, tid, nt, 1, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        int64_t S64 = ms_attn_prefill_keys(j->S);
        float *kt = j->kt + b * qd * (j->blocked ? S64 : j->S);
        /* 16 positions: one line per c; blocked, the last block's lanes past S
         * are zeroed (the kernel reads them and drops them) */
        for (int64_t s0 = 0; s0 < (j->blocked ? S64 : j->S); s0 += 16) {
            int64_t s1 = MS_MIN(j->S, s0 + 16);
            /* component c of this run of positions: 16 floats in either layout */
            for (int64_t c = 0; c < qd; c++) {
                float *d = kt + (j->blocked ? ms_attn_prefill_kt_at(qd, c, s0) : c * j->S + s0);
                if (c < j->dn)
                    for (int64_t s = s0; s < s1; s++)
                        d[s - s0] = j->kv[s * j->H * j->kvd + (j->g0 + b) * j->kvd + c];
                else
                    for (int64_t s = s0; s < s1; s++)
                        d[s - s0] = j->lat[s * j->row + j->kvr + c - j->dn];
                for (int64_t s = MS_MAX(s0, s1); s < s0 + 16 && j->blocked; s++) d[s - s0] = 0;
            }
        }
        float *vt = j->vt + b * j->S * j->dv;
        for (int64_t s = 0; s < j->S; s++)
            memcpy(vt + s * j->dv, j->kv + s * j->H * j->kvd + (j->g0 + b) * j->kvd + j->dn,
                   sizeof(float) * (size_t)j->dv);
    }
}

/* Naive MLA for n new tokens of one sequence (positions p0..p0+n-1): keys and
 * values expanded from the cached latents (kv = kv_b · c_kv); per group of
 * heads the keys [k_nope | k_rope] are laid out transposed and the values
 * packed (kt, vt, on the pool),
 * then causal attention: with AVX-512 the fused kernel (attn_prefill.h: scores,
 * softmax and context a block of keys at a time, no score matrix); otherwise
 * in blocks of queries: block [i0, i1) reads only the
 * first p0 + i1 keys (each SUB_ROWS sub-block of it only those its last row
 * sees), and three pool runs cover the group's heads (scores, one x·W
 * product per head and sub-block; softmax; context, likewise).  The
 * scores are q · kt (each q value broadcast over 16 keys, no horizontal
 * sums), faster than dot products with key rows even with the transposition.
 * FP32 throughout: rounding q and k to bf16 costs too much accuracy in the
 * golden prompt's logits (measured: bench/RESULTS.md, "Why the code is so"). */
static void attn_naive(ms_model *m, const ms_layer_w *lw, int layer, const ms_kv_view *v,
                       int64_t p0, int64_t n, const float *q, float *out)
{
    const ms_config *c = &m->cfg;
    ms_model_ws *ws = m->ws;
    int64_t H = m->n_local_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
            dv = c->v_head_dim, kvr = c->kv_lora_rank, S = p0 + n, row = kvr + dr;
    int64_t qd = dn + dr, kvd = dn + dv;
    load_rows(v, layer, S, ws->lat);
    ms_matmul(&m->kctx, ws->kv, H * kvd, ws->lat, row, S, &lw->kv_b, 0);
    const int fused = ms_attn_prefill_ok(&m->kctx, dv);
    int64_t S64 = ms_attn_prefill_keys(S);
    int64_t HG = MS_MAX(1, MS_MIN(MS_MIN(H, MAX_BLOCK_HEADS), ws->cap_kh / (S64 * qd)));
    int64_t QB = MS_MAX(1, MS_MIN(ws->cap_sc / (HG * S), QB_MAX)); /* block scores fit sc */
    /* a block's rows in causal sub-blocks of SUB_ROWS: sub-block j's scores and
     * context read only the keys its last row sees (p0 + i0 + (j + 1)·SUB_ROWS),
     * not the block's S_b; the keys it leaves out have p = 0 (softmax_rows
     * zeroes them), so each output has the bits of the whole-block product */
    ms_mat *w = ws->att_w;
    ms_mm_call *calls = ws->att_calls;
    for (int64_t g0 = 0; g0 < H; g0 += HG) {
        int hg = (int)MS_MIN(H - g0, HG);
        struct kt_job kj = {ws->kv, ws->lat, ws->kh, ws->vh, S,   H,   g0,   hg,
                            dn,     dr,      dv,     kvd,    kvr, row, fused};
        ms_pool_run(m->pool, kt_heads, &kj);
        if (fused) {
            ms_attn_prefill a = {q + g0 * qd, H * qd, ws->kh, ws->vh, out + g0 * dv,   H * dv, hg,
                                 qd,          dv,     p0,     n,      m->softmax_scale};
            ms_attn_prefill_run(&m->kctx, &a);
            continue;
        }
        for (int64_t i0 = 0; i0 < n; i0 += QB) {
            int64_t i1 = MS_MIN(n, i0 + QB), nb = i1 - i0, S_b = p0 + i1;
            int nc = 0;
            for (int64_t j0 = 0; j0 < nb;
                 j0 += SUB_ROWS) { /* scores[i][b][:] = q[i][g0 + b] · kt[b] */
                int64_t rows = MS_MIN(SUB_ROWS, nb - j0), S_j = p0 + i0 + j0 + rows;
                for (int b = 0; b < hg; b++, nc++) {
                    w[nc] = ms_mat_whole(MS_DT_F32, qd, S_j, ws->kh + b * qd * S, NULL);
                    w[nc].ld = S;
                    calls[nc] = (ms_mm_call){ws->sc + (j0 * hg + b) * S_b,
                                             hg * S_b,
                                             q + (i0 + j0) * H * qd + (g0 + b) * qd,
                                             H * qd,
                                             rows,
                                             &w[nc],
                                             0,
                                             1};
                }
            }
            ms_matmul_batch(&m->kctx, calls, nc);
            struct sm_job sj = {ws->sc, nb * hg, hg, S_b, p0, i0, m->softmax_scale};
            ms_pool_run(m->pool, softmax_rows, &sj);
            nc = 0;
            for (int64_t j0 = 0; j0 < nb; j0 += SUB_ROWS) { /* ctx = p · v */
                int64_t rows = MS_MIN(SUB_ROWS, nb - j0), S_j = p0 + i0 + j0 + rows;
                for (int b = 0; b < hg; b++, nc++) {
                    int64_t h = g0 + b;
                    w[nc] = ms_mat_whole(MS_DT_F32, S_j, dv, ws->vh + b * S * dv, NULL);
                    calls[nc] = (ms_mm_call){out + (i0 + j0) * H * dv + h * dv,
                                             H * dv,
                                             ws->sc + (j0 * hg + b) * S_b,
                                             hg * S_b,
                                             rows,
                                             &w[nc],
                                             0,
                                             1};
                }
            }
            ms_matmul_batch(&m->kctx, calls, nc);
        }
    }
}

/* MLA absorption for n packed decode rows, all heads batched into pool runs
 * of up to 128 heads: uv = 0: q̃[i][h][:kvr] = q_nope[i][h] · W_UK[h]
 * (W_UK[h] = rows h·(dn+dv) .. +dn of kv_b, [dn][kvr]); uv = 1:
 * dout[i][h] = ctx[i][h] · W_UV[h]ᵀ (W_UV[h] = the next dv rows, [dv][kvr]). */
static void absorb_heads(ms_model *m, const ms_layer_w *lw, int uv, int64_t n)
{
    const ms_config *c = &m->cfg;
    ms_model_ws *ws = m->ws;
    int64_t H = m->n_local_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
            dv = c->v_head_dim, kvr = c->kv_lora_rank, row = kvr + dr, qd = dn + dr, kvd = dn + dv;
    ms_mat w[MAX_BLOCK_HEADS];
    ms_mm_call calls[MAX_BLOCK_HEADS];
    for (int64_t h0 = 0; h0 < H; h0 += MAX_BLOCK_HEADS) {
        int nb = (int)(H - h0 < MAX_BLOCK_HEADS ? H - h0 : MAX_BLOCK_HEADS);
        for (int b = 0; b < nb; b++) {
            int64_t h = h0 + b;
            if (!uv) {
                w[b] = ms_mat_slice(&lw->kv_b, h * kvd, dn, 0, kvr);
                calls[b] = (ms_mm_call){
                    ws->qabs + h * row, H * row, ws->dq + h * qd, H * qd, n, &w[b], 0, 1};
            } else {
                w[b] = ms_mat_slice(&lw->kv_b, h * kvd + dn, dv, 0, kvr);
                calls[b] = (ms_mm_call){
                    ws->dout + h * dv, H * dv, ws->ctx + h * kvr, H * kvr, n, &w[b], 0, 0};
            }
        }
        ms_matmul_batch(&m->kctx, calls, nb);
    }
}

/* Absorbed MLA for every single-token (decode) sequence of the batch at once:
 * q̃ = q_nope·W_UK and o = W_UV·ctx run as one GEMM per head over all decode
 * rows (all heads in one pool run); the attention over each sequence's paged latents is one kernel
 * call. */
static void attn_decode(ms_model *m, const ms_layer_w *lw, int layer, const ms_kv_cache *cache,
                        const ms_batch_seq *seqs, int n_seqs)
{
    const ms_config *c = &m->cfg;
    ms_model_ws *ws = m->ws;
    int64_t H = m->n_local_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
            dv = c->v_head_dim, kvr = c->kv_lora_rank, row = kvr + dr;
    int64_t qd = dn + dr, n = 0, t = 0;
    for (int i = 0; i < n_seqs; i++) { /* pack the decode rows' queries */
        if (absorbed(m, &seqs[i]))
            for (int32_t j = 0; j < seqs[i].n_tokens; j++)
                memcpy(ws->dq + n++ * H * qd, ws->q + (t + j) * H * qd,
                       sizeof(float) * (size_t)(H * qd));
        t += seqs[i].n_tokens;
    }
    if (n == 0) return;
    for (int64_t i = 0; i < n; i++) /* the rope part of q̃ is q's own */
        for (int64_t h = 0; h < H; h++)
            memcpy(ws->qabs + (i * H + h) * row + kvr, ws->dq + (i * H + h) * qd + dn,
                   sizeof(float) * (size_t)dr);
    absorb_heads(m, lw, 0, n); /* q̃ = q_nope · W_UK, every head in one pool run */
    int64_t i = 0, np = 0;     /* every decode row's pages into one table, then one kernel call */
    for (int q = 0; q < n_seqs; q++) {
        const ms_batch_seq *sq = &seqs[q];
        if (!absorbed(m, sq)) continue;
        int64_t S_all = sq->start_pos + sq->n_tokens; /* its rows share one page table */
        const void **pp = ws->pptr + np;
        ms_kv_view v = {cache, sq->kv};
        int ps = ms_kv_view_page_size(&v);
        for (int64_t p = 0; p * ps < S_all; p++)
            ws->pptr[np++] = ms_kv_view_entry(&v, LATENT, layer, p * ps);
        for (int32_t j = 0; j < sq->n_tokens; j++) /* row j sees positions 0 .. start + j */
            ws->aseq[i++] =
                (ms_attn_seq){pp, ps, ms_kv_view_dtype(&v, LATENT), row, sq->start_pos + j + 1};
    }
    ms_attn_decode(&m->kctx, ws->aseq, (int)n, ws->qabs, H, kvr, m->softmax_scale, ws->ctx,
                   ws->ascr);
    absorb_heads(m, lw, 1, n); /* o = ctx · W_UVᵀ */
    i = t = 0;
    for (int q = 0; q < n_seqs; q++) { /* unpack into the batch's rows */
        if (absorbed(m, &seqs[q]))
            for (int32_t j = 0; j < seqs[q].n_tokens; j++)
                memcpy(ws->attn + (t + j) * H * dv, ws->dout + i++ * H * dv,
                       sizeof(float) * (size_t)(H * dv));
        t += seqs[q].n_tokens;
    }
}

/* One embedding row per token, converted whole with the SIMD conversion;
 * FP8 rows need their block scales and keep the element-wise path. */
static void embed_rows(const ms_model *m, const ms_batch_seq *seqs, int n_seqs, float *x)
{
    const ms_mat *E = &m->embed;
    int64_t D = m->cfg.hidden_size, t = 0;
    size_t esz = (size_t)ms_dtype_size(E->dtype);
    for (int i = 0; i < n_seqs; i++)
        for (int32_t j = 0; j < seqs[i].n_tokens; j++, t++) {
            int32_t tok = seqs[i].tokens[j];
            if (E->dtype == MS_DT_F8E4M3)
                for (int64_t d = 0; d < D; d++) x[t * D + d] = ms_mat_get(E, tok, d);
            else
                ms_cvt_to_f32(m->kctx.isa, E->dtype,
                              (const char *)E->data + (size_t)(tok * E->ld) * esz, x + t * D, D);
        }
}

/* Sequence i's logit rows: its last n_logits positions (logits set, n_logits 0: 1). */
static int32_t n_logit_rows(const ms_batch_seq *sq)
{
    if (!sq->logits || sq->n_tokens <= 0) return 0;
    int32_t n = sq->n_logits > 0 ? sq->n_logits : 1;
    return n < sq->n_tokens ? n : sq->n_tokens;
}

/* Validates the batch, sizes the workspace and fills the residual rows with
 * the tokens' embeddings. */
static int dsv3_embed(ms_model *m, const ms_batch_seq *seqs, int n_seqs, ms_errbuf *err)
{
    const ms_config *c = &m->cfg;
    int64_t T = 0, S = 0, S_pre = 0; /* S_pre: the naive (prefill) rows' context */
    for (int i = 0; i < n_seqs; i++) {
        const ms_batch_seq *sq = &seqs[i];
        if (sq->n_tokens <= 0) continue;
        if (sq->start_pos < 0 || sq->start_pos + sq->n_tokens > c->max_position_embeddings)
            return ms_err(err, MS_ECONTEXT, "sequence %d: positions %lld..%lld exceed %lld", i,
                          (long long)sq->start_pos, (long long)(sq->start_pos + sq->n_tokens),
                          (long long)c->max_position_embeddings);
        if (sq->logits && sq->n_logits > sq->n_tokens)
            return ms_err(err, MS_EINVAL, "sequence %d wants logits of %d positions, has %d", i,
                          sq->n_logits, sq->n_tokens);
        for (int32_t j = 0; j < sq->n_tokens; j++)
            if (sq->tokens[j] < 0 || sq->tokens[j] >= c->vocab_size)
                return ms_err(err, MS_ERANGE, "token id %d out of range [0, %lld)", sq->tokens[j],
                              (long long)c->vocab_size);
        T += sq->n_tokens;
        S = MS_MAX(S, sq->start_pos + sq->n_tokens);
        if (!absorbed(m, sq)) S_pre = MS_MAX(S_pre, sq->start_pos + sq->n_tokens);
    }
    m->fwd_T = T;
    m->fwd_S = S;
    if (T == 0 && !m->shard) return 0; /* distributed: an idle batch still joins the collectives */
    if (ws_reserve(m, MS_MAX(T, 1), S, S_pre))
        return ms_err(err, MS_ENOMEM, "out of memory (workspace)");
    embed_rows(m, seqs, n_seqs, m->ws->x);
    return 0;
}

/* The draft layer past its cache write: every sequence cut to its last
 * ms_draft_out_rows positions (family.h), their q and residual rows packed
 * to the front; *seqs and *T become the cut batch. */
static int keep_out_rows(ms_model *m, const ms_batch_seq **seqs, int n_seqs, int64_t *T)
{
    ms_model_ws *ws = m->ws;
    const ms_config *c = &m->cfg;
    int64_t D = c->hidden_size, qw = m->n_local_heads * (c->qk_nope_head_dim + c->qk_rope_head_dim);
    if (n_seqs > ws->cap_kseq) {
        void *p = realloc(ws->kseq, sizeof *ws->kseq * (size_t)n_seqs);
        if (!p) return MS_ENOMEM;
        ws->kseq = p;
        ws->cap_kseq = n_seqs;
    }
    int64_t t = 0, k = 0;
    for (int i = 0; i < n_seqs; i++) {
        ms_batch_seq b = (*seqs)[i];
        int32_t keep = ms_draft_out_rows(&b), drop = b.n_tokens > 0 ? b.n_tokens - keep : 0;
        t += drop;
        for (int32_t j = 0; j < keep; j++, t++, k++) { /* k <= t: forward moves */
            memmove(ws->q + k * qw, ws->q + t * qw, sizeof(float) * (size_t)qw);
            memmove(ws->x + k * D, ws->x + t * D, sizeof(float) * (size_t)D);
        }
        ms_batch_seq_keep_last(&b, keep, D);
        ws->kseq[i] = b;
    }
    *seqs = ws->kseq;
    *T = m->fwd_T = k;
    return 0;
}

/* Checkpoint layers [first, last) (the MTP layers follow the main stack) over
 * the residual rows embed (or the previous range) left.  keep (the draft
 * layer): past the first layer's cache write only each sequence's output
 * rows go on, and *keep is set to the cut batch (keep_out_rows). */
static int layers(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                  int first, int last, const ms_batch_seq **keep, ms_errbuf *err)
{
    const ms_config *c = &m->cfg;
    int64_t D = c->hidden_size, H = m->n_local_heads, dn = c->qk_nope_head_dim,
            dr = c->qk_rope_head_dim, dv = c->v_head_dim, kvr = c->kv_lora_rank;
    int64_t qd = dn + dr, T = m->fwd_T;
    int rc;
    if (T == 0 && !m->shard) return 0;
    if (ws_reserve_decode(m, ms_kv_cache_page_size(cache), seqs, n_seqs))
        return ms_err(err, MS_ENOMEM, "out of memory (workspace)");
    ms_model_ws *ws = m->ws;
    const ms_kctx *k = &m->kctx;

    for (int l = first; l < last; l++) {
        const ms_layer_w *lw = &m->layers[l];
        /* --- attention --- */
        ph_mark(-1);
        ms_rmsnorm(ws->u, ws->x, lw->attn_norm, T, D, D, c->rms_norm_eps);
        { /* the two projections of the normed input share one pool run */
            ms_mm_call in[2] = {
                {ws->kva, kvr + dr, ws->u, D, T, &lw->kv_a, 0, 0},
                c->q_lora_rank > 0
                    ? (ms_mm_call){ws->qa, c->q_lora_rank, ws->u, D, T, &lw->q_a, 0, 0}
                    : (ms_mm_call){ws->q, H * qd, ws->u, D, T, &lw->q, 0, 0}};
            ms_matmul_batch(k, in, 2);
        }
        if (c->q_lora_rank > 0) {
            ms_rmsnorm(ws->qa, ws->qa, lw->q_a_norm, T, c->q_lora_rank, c->q_lora_rank,
                       c->rms_norm_eps);
            ms_matmul(k, ws->q, H * qd, ws->qa, c->q_lora_rank, T, &lw->q_b, 0);
        }
        ms_rmsnorm(ws->kva, ws->kva, lw->kv_a_norm, T, kvr, kvr + dr, c->rms_norm_eps);
        int64_t t = 0;
        for (int i = 0; i < n_seqs; i++) {
            const ms_batch_seq *sq = &seqs[i];
            for (int32_t j = 0; j < sq->n_tokens; j++, t++) {
                int64_t pos = sq->start_pos + j;
                ms_rope_interleaved(ws->q + t * H * qd + dn, H, qd, dr, m->rope_inv_freq, pos);
                ms_rope_interleaved(ws->kva + t * (kvr + dr) + kvr, 1, dr, dr, m->rope_inv_freq,
                                    pos);
                ms_kv_view v = {cache, sq->kv};
                store_row(&v, l, pos, ws->kva + t * (kvr + dr), kvr + dr);
            }
        }
        if (keep && l == first) {
            if (keep_out_rows(m, &seqs, n_seqs, &T) ||
                ws_reserve_decode(m, ms_kv_cache_page_size(cache), seqs, n_seqs))
                return ms_err(err, MS_ENOMEM, "out of memory (workspace)");
            *keep = seqs;
        }
        ph_mark(PH_QKV);
        attn_decode(m, lw, l, cache, seqs, n_seqs);
        ph_mark(PH_ATTN_DEC);
        t = 0;
        for (int i = 0; i < n_seqs; i++) {
            const ms_batch_seq *sq = &seqs[i];
            ms_kv_view v = {cache, sq->kv};
            if (!absorbed(m, sq))
                attn_naive(m, lw, l, &v, sq->start_pos, sq->n_tokens, ws->q + t * H * qd,
                           ws->attn + t * H * dv);
            t += sq->n_tokens;
        }
        ph_mark(PH_ATTN_PRE);
        if (m->n_local_heads == c->n_heads) {
            ms_matmul(k, ws->x, D, ws->attn, H * dv, T, &lw->o, 1); /* residual add */
        } else if (T > 0) { /* heads split: o_proj partial sums, all-reduced in the group */
            ms_matmul(k, ws->y, D, ws->attn, H * dv, T, &lw->o, 0);
            ms_comm_set_tag(l);
            rc = ms_comm_allreduce_f32(m->shard->attn_group, ws->y, (size_t)(T * D), err);
            if (rc) return rc;
            for (int64_t i = 0; i < T * D; i++) ws->x[i] += ws->y[i];
        }

        /* --- FFN (dense MLP or MoE; may gather, dispatch and reduce across ranks) --- */
        ms_rmsnorm(ws->u, ws->x, lw->ffn_norm, T, D, D, c->rms_norm_eps);
        ms_comm_set_tag(l);
        ph_mark(PH_O);
        ms_mlp_ctx mcx = {&m->kctx, c, m->shard};
        ms_mlp_w mw = {.layer = l,
                       .is_moe = lw->is_moe,
                       .dense = &lw->dense,
                       .moe = {&lw->router, lw->e_bias, lw->experts,
                               c->n_shared_experts > 0 ? &lw->shared : NULL}};
        rc = ms_mlp_forward(&mcx, &mw, ws->u, T, ws->y, &ws->mlp, err);
        if (rc) return rc;
        ph_mark(lw->is_moe ? PH_MOE : PH_MLP);
        for (int64_t i = 0; i < T * D; i++) ws->x[i] += ws->y[i];
    }
    ms_comm_set_tag(MS_COMM_TAG_NONE);
    return 0;
}

static int dsv3_run_layers(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs,
                           int n_seqs, int first, int last, ms_errbuf *err)
{
    if (first < 0 || last > m->cfg.n_layers || first > last)
        return ms_err(err, MS_EINVAL, "layers [%d, %d) outside the model's %d", first, last,
                      m->cfg.n_layers);
    return layers(m, cache, seqs, n_seqs, first, last, NULL, err);
}

/* Sequence i's hidden-state rows: its last n_hidden positions (0: its logit rows). */
static int32_t n_hidden_rows(const ms_batch_seq *sq)
{
    if (!sq->hidden || sq->n_tokens <= 0) return 0;
    if (sq->n_hidden <= 0) return n_logit_rows(sq);
    return sq->n_hidden < sq->n_tokens ? sq->n_hidden : sq->n_tokens;
}

/* The vocab-parallel LM head (ms_family.head_split) of an attention-TP group g of n ranks:
 * member j computes the logits of vocab rows [V·j/n, V·(j+1)/n) of the n_want packed rows of
 * ws->u with the one-rank kernel (each logit one row's dot product: the bits of one rank),
 * into ws->logits as [j][n_want][V_j] blocks; rank 0 receives the others' blocks (one
 * point-to-point exchange, with the collectives' deadline) and writes each sequence's logits
 * rows; the other members write none. */
static int head_split(ms_model *m, ms_group *g, const ms_batch_seq *seqs, int n_seqs,
                      const ms_mat *head, int64_t n_want, ms_errbuf *err)
{
    int64_t V = head->rows, D = m->cfg.hidden_size;
    int n = g->size, me = g->rank;
    float *L = m->ws->logits; /* [n][n_want][V_j] */
    int64_t v0 = V * me / n, v1 = V * (me + 1) / n;
    ms_mat sl = ms_mat_slice(head, v0, v1 - v0, 0, D);
    if (v1 > v0) ms_matmul(&m->kctx, L + n_want * v0, v1 - v0, m->ws->u, D, n_want, &sl, 0);
    ms_comm_p2p op1, *ops = &op1;
    int n_ops = 1;
    if (me == 0 && n - 1 > m->ws->cap_head_ops) { /* grows once: no allocation per step */
        ms_comm_p2p *p = realloc(m->ws->head_ops, sizeof *p * (size_t)(n - 1));
        if (!p) return ms_err(err, MS_ENOMEM, "out of memory (LM head)");
        m->ws->head_ops = p, m->ws->cap_head_ops = n - 1;
    }
    if (me == 0) {
        ops = m->ws->head_ops;
        n_ops = n - 1;
        for (int j = 1; j < n; j++) {
            int64_t a = V * j / n, b = V * (j + 1) / n;
            ops[j - 1] =
                (ms_comm_p2p){j, 1, L + n_want * a, sizeof(float) * (size_t)(n_want * (b - a))};
        }
    } else {
        op1 = (ms_comm_p2p){0, 0, L + n_want * v0, sizeof(float) * (size_t)(n_want * (v1 - v0))};
    }
    int rc = ms_comm_exchange(g, ops, n_ops, err);
    if (rc || me != 0) return rc;
    int64_t k = 0;
    for (int i = 0; i < n_seqs; i++) { /* row r of a sequence at logits + r * V */
        int32_t nl = n_logit_rows(&seqs[i]);
        for (int32_t r = 0; r < nl; r++, k++)
            for (int j = 0; j < n; j++) {
                int64_t a = V * j / n, b = V * (j + 1) / n;
                memcpy(seqs[i].logits + (int64_t)r * V + a, L + n_want * a + k * (b - a),
                       sizeof(float) * (size_t)(b - a));
            }
    }
    return 0;
}

/* The rows whose logits or hidden states are wanted, normed by norm (the final
 * norm, or the draft layer's shared_head.norm); the logit rows as one GEMM
 * through the LM head (split by vocab rows in an attention-TP group: head_split). */
static int head_rows(ms_model *m, const ms_batch_seq *seqs, int n_seqs, const float *norm,
                     const ms_mat *head, ms_errbuf *err)
{
    const ms_config *c = &m->cfg;
    int64_t D = c->hidden_size, t = 0, n_rows = 0, n_want = 0, V = head->rows;
    ms_model_ws *ws = m->ws;
    if (m->fwd_T == 0) return 0;
    for (int i = 0; i < n_seqs; i++) { /* each sequence's trailing rows into hn */
        int32_t nr = MS_MAX(n_logit_rows(&seqs[i]), n_hidden_rows(&seqs[i]));
        t += MS_MAX(seqs[i].n_tokens, 0);
        if (nr == 0) continue;
        memcpy(ws->hn + n_rows * D, ws->x + (t - nr) * D, sizeof(float) * (size_t)(nr * D));
        n_rows += nr;
        n_want += n_logit_rows(&seqs[i]);
    }
    if (n_rows == 0) return 0;
    if (n_want > ws->cap_logits_rows) {
        int64_t rows = MS_MAX(n_want, 2 * ws->cap_logits_rows);
        ms_free_aligned(ws->logits);
        ws->logits = ms_alloc_aligned((size_t)(rows * c->vocab_size), sizeof(float));
        if (!ws->logits) {
            ws->cap_logits_rows = 0;
            return ms_err(err, MS_ENOMEM, "out of memory (logits)");
        }
        ws->cap_logits_rows = rows;
    }
    ph_mark(-1);
    ms_rmsnorm(ws->hn, ws->hn, norm, n_rows, D, D, c->rms_norm_eps);
    int64_t r = 0, k = 0; /* the logit rows packed into u (free after the layers) */
    for (int i = 0; i < n_seqs; i++) {
        int32_t nl = n_logit_rows(&seqs[i]), nh = n_hidden_rows(&seqs[i]), nr = MS_MAX(nl, nh);
        if (nl > 0)
            memcpy(ws->u + k * D, ws->hn + (r + nr - nl) * D, sizeof(float) * (size_t)(nl * D));
        if (nh > 0)
            memcpy(seqs[i].hidden, ws->hn + (r + nr - nh) * D, sizeof(float) * (size_t)(nh * D));
        r += nr;
        k += nl;
    }
    ms_group *g = m->shard ? m->shard->attn_group : NULL;
    if (n_want > 0 && g && g->size > 1) {
        int rc = head_split(m, g, seqs, n_seqs, head, n_want, err);
        ph_mark(PH_HEAD);
        return rc;
    }
    if (n_want > 0) ms_matmul(&m->kctx, ws->logits, V, ws->u, D, n_want, head, 0);
    ph_mark(PH_HEAD);
    k = 0;
    for (int i = 0; i < n_seqs; i++) { /* row r of a sequence at logits + r * V */
        int32_t nl = n_logit_rows(&seqs[i]);
        if (nl == 0) continue;
        memcpy(seqs[i].logits, ws->logits + k * V, sizeof(float) * (size_t)(nl * V));
        k += nl;
    }
    return 0;
}

static int dsv3_head(ms_model *m, const ms_batch_seq *seqs, int n_seqs, ms_errbuf *err)
{
    return head_rows(m, seqs, n_seqs, m->final_norm, &m->lm_head, err);
}

/* The MTP layer (the first after the main stack, arch.md §1.7) over a batch
 * whose sequences carry hidden_in: u = eh_proj · [enorm(embed(t)), hnorm(h)],
 * one decoder block writing the cache layer n_layers, shared_head.norm, the
 * LM head.  As SGLang's deepseek_nextn: h is the target's state after its
 * final norm, and the returned hidden states are after shared_head.norm. */
static int dsv3_draft(ms_model *m, const ms_kv_cache *cache, const ms_batch_seq *seqs, int n_seqs,
                      ms_errbuf *err)
{
    const ms_config *c = &m->cfg;
    const ms_mtp_w *w = &m->mtp[0];
    int64_t D = c->hidden_size, t = 0;
    int rc = dsv3_embed(m, seqs, n_seqs, err);
    if (rc) return rc;
    ms_model_ws *ws = m->ws;
    int64_t T = m->fwd_T;
    ph_set = 1;
    ph_mark(-1);
    for (int i = 0; i < n_seqs; i++) {
        const ms_batch_seq *sq = &seqs[i];
        if (sq->n_tokens > 0 && !sq->hidden_in) {
            ph_set = 0;
            return ms_err(err, MS_EINVAL, "draft forward: sequence %d has no hidden_in", i);
        }
        for (int32_t j = 0; j < sq->n_tokens; j++, t++) {
            ms_rmsnorm(ws->cat + t * 2 * D, ws->x + t * D, w->enorm, 1, D, D, c->rms_norm_eps);
            ms_rmsnorm(ws->cat + t * 2 * D + D, sq->hidden_in + (int64_t)j * D, w->hnorm, 1, D, D,
                       c->rms_norm_eps);
        }
    }
    if (T > 0) ms_matmul(&m->kctx, ws->x, D, ws->cat, 2 * D, T, &w->eh_proj, 0);
    ph_mark(PH_EH);
    const ms_batch_seq *kept = seqs;
    rc = layers(m, cache, seqs, n_seqs, c->n_layers, c->n_layers + 1, &kept, err);
    if (!rc)
        rc = head_rows(m, kept, n_seqs, w->head_norm, m->draft_vocab ? &m->draft_head : &m->lm_head,
                       err);
    ph_set = 0;
    return rc;
}

/* ---- the family ---- */

static int dsv3_match(const json_t *root)
{
    const json_t *a = json_object_get(root, "architectures");
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (s && (!strcmp(s, "DeepseekV2ForCausalLM") || !strcmp(s, "DeepseekV3ForCausalLM")))
            return 1;
    }
    const char *t = json_string_value(json_object_get(root, "model_type"));
    if (t && (!strcmp(t, "deepseek_v2") || !strcmp(t, "deepseek_v3"))) return 1;
    /* an MLA config without a known name: ours, and ms_config_parse says what is missing */
    const json_t *kv = json_object_get(root, "kv_lora_rank");
    return kv && !json_is_null(kv);
}

int ms_dsv3_parse_config(const ms_config *c, ms_model_shape *m)
{
    snprintf(m->name, sizeof m->name, "%s", c->model_type);
    m->attn = MS_ATTN_MLA;
    m->vocab = c->vocab_size, m->hidden = c->hidden_size;
    m->intermediate = c->intermediate_size, m->moe_intermediate = c->moe_intermediate_size;
    m->n_layers = c->n_layers, m->first_k_dense = c->first_k_dense_replace;
    m->moe_layer_freq = c->moe_layer_freq;
    m->n_heads = c->n_heads, m->n_kv_heads = 0; /* one shared latent */
    m->head_dim = 0; /* MLA: qk_nope + qk_rope per query head, no single head_dim */
    m->q_lora_rank = c->q_lora_rank, m->kv_lora_rank = c->kv_lora_rank;
    m->qk_nope = c->qk_nope_head_dim, m->qk_rope = c->qk_rope_head_dim;
    m->v_head_dim = c->v_head_dim;
    m->n_routed = c->n_routed_experts, m->n_shared = c->n_shared_experts;
    m->topk = c->n_experts_per_tok;
    m->tie_embeddings = c->tie_word_embeddings;
    m->router_bias = c->topk_method == MS_TOPK_NOAUX_TC;
    m->n_mtp_layers = c->num_nextn_predict_layers;
    m->max_context = c->max_position_embeddings;
    m->bos_token_id = c->bos_token_id, m->eos_token_id = c->eos_token_id;
    m->published = c->fp8_block ? MS_WEIGHTS_FP8 : MS_WEIGHTS_BF16;
    m->fp8_scale_bytes = c->fp8_scale_ue8m0 ? 1 : 4;
    return 0;
}

static int dsv3_parse(const json_t *root, ms_model_shape *out, ms_errbuf *err)
{
    ms_config c;
    int rc = ms_config_parse_json(&c, root, err);
    if (!rc) rc = ms_dsv3_parse_config(&c, out);
    return rc;
}

/* One stream: the latent c_kv and the roped k_pe of every token in every
 * layer of the main stack (seed 002: L·(r_kv + d_rope)·b), replicated on
 * every attention-TP rank. */
static int dsv3_kv_spec(const ms_model_shape *s, const ms_kv_spec_opts *o, ms_kv_spec *out,
                        ms_errbuf *err)
{
    int b = o->elem_bytes > 0 ? o->elem_bytes : 2;
    int64_t row = (int64_t)s->kv_lora_rank + s->qk_rope;
    /* with drafts the MTP layer's entries ride in the same pages (SGLang's draft
     * pool shares the target's token slots) as layer n_layers */
    int n = s->n_layers + (o->draft_tokens > 0 && s->n_mtp_layers > 0);
    ms_kv_spec_init(out, n);
    ms_kv_stream *st = ms_kv_spec_add(out, "latent", (double)(row * b), row,
                                      b == 4   ? MS_DT_F32
                                      : b == 2 ? MS_DT_BF16
                                               : MS_DT_F8E4M3,
                                      1, 0, 0);
    for (int l = 0; l < n; l++) ms_kv_stream_cover(st, l);
    /* a decode query reads every row for its rank's heads, absorbed: q·[c_kv|k_pe]
     * and p·c_kv */
    st->read_flops = 2.0 * ((double)s->n_heads / (o->attn_tp > 0 ? o->attn_tp : 1)) *
                     (2.0 * s->kv_lora_rank + s->qk_rope);
    return 0;
}

const ms_family ms_family_deepseek_v3 = {
    .name = "deepseek_v3",
    .models = "DeepSeek-V2/V3/R1, Moonlight, Kimi-K2",
    .match = dsv3_match,
    .parse = dsv3_parse,
    .kv_spec = dsv3_kv_spec,
    .open = ms_dsv3_open,
    .embed = dsv3_embed,
    .run_layers = dsv3_run_layers,
    .head = dsv3_head,
    .head_split = 1,
    .each_view = ms_dsv3_each_view,
    .free = ms_dsv3_free,
    .draft = dsv3_draft,
};
