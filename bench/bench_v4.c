/* bench_v4.c — DeepSeek-V4 speed on the small-v4 preset (arch.md §2; the
 * checkpoints are written under build/models/ on first use: small-v4 BF16
 * and small-v4-fp8-fp4, FP4 routed experts + FP8 elsewhere, as released).
 * The model API with a one-sequence BF16 KV cache (the engine's auto
 * dtype), --threads threads, auto precision.
 *
 * Rows (key=value), all measured in one run so ratios are comparable:
 *   dram     read bandwidth with the same threads (GB/s; the roofline's)
 *   prefill  a ctx-token prompt (512, 8192) in chunks of 2048 rows (the
 *            engine's default chunk): tokens/s
 *   decode   batch 1 at ctx 1024, 8192, 65024 (64K less room for the steps): median step (ms/token)
 * over
 *            --steps greedy-free steps, tok/s, bytes read per token (active
 *            weights + the cache entries the step reads: window, C128, all
 *            index keys, the top-k C4 entries) and the roofline ratio =
 *            bytes / bandwidth / step time.  The ctx tokens' cache entries
 *            are written with random values (fill=random: the step's cost
 *            does not depend on them; a 64K prefill would take minutes
 *            here); one row decodes after the real 8192-token prefill
 *            (fill=prefill) to check that.  x_1k = step at ctx / step at 1K
 *            (target <= 2 at 64K).  Each ctx alternates the threaded
 *            attention with its scalar twin (attn=ref, ms_v4.attn_ref), two
 *            runs each: x_ref = ref step / threaded step.
 *   fp8fp4   batch-1 decode at ctx 1024 of the FP8+FP4 checkpoint against
 *            BF16, alternating, --pairs of each (default 2): x_bf16 (target
 *            >= 1.6), and each checkpoint's weight GB/s (bytes / step)
 *   kvq      batch-1 decode at ctx 1024 and 65024 with the deployed cache
 *            formats (--kv-cache-dtype fp8_e4m3 --enable-deepseek-v4-fp4-indexer:
 *            FP8 ds entries, MXFP4 keys, dequantised as attention loads them)
 *            against the BF16 cache, alternating, two of each: x_bf16 (no target;
 *            the cost or gain of dequantising in place of reading BF16); and
 *            FP8 ds entries with SGLang's FP8 index keys (--kv-cache-dtype
 *            fp8_e4m3 alone): x_bf16_fp8keys
 *   verify   a verify step of 2, 3 and 4 rows (EAGLE S = 1..3: the last token and its
 *            drafts, every row's logits) at ctx 1024 and 65024 (random fill) against
 *            a decode step there, alternating, best of two medians: x2, x3, x4 = verify
 *            / decode (weights: the byte model's ×1.45 / ×1.86 / ×2.23 on small-v4; the
 *            rows' index scores come from one pass over the keys)
 *   idxdot   the decode indexer's scoring of 16,256 FP8 keys, then of as many MXFP4
 *            keys (64K context) on one thread: unpacked rows + ms_dot_f32 (the path
 *            before the packed-code kernels) against ms_kvq_fp8key_dots /
 *            ms_kvq_mxfp4_dots, alternating, six of each: ns per key,
 *            x_unpack = unpack time / packed time, and whether the scores are equal
 *   topk     the CSA indexer's choice at small-v4 scale: a real 4096-token prefill into
 *            an F32 cache, then --steps decode steps; at every CSA layer of every step
 *            the engine's top-k over the FP32 keys against the top-k of the same query
 *            and keys rotated and rounded as SGLang's FP8 keys and as MXFP4 keys store
 *            them (kernels/kvq.h; the queries rounded the same way), scored as the
 *            engine scores them: mean and smallest overlap |A ∩ B| / k, and the share of
 *            sets equal; the control, rotated and not rounded, should give ~1
 *            (ms_v4.topk_probe)
 *   mqa      one prefill row's sink attention on one thread (the layers' H heads over
 *            256 rows, hd 128 and V4's 512): ms_attn_mqa's blocks of 8 heads against
 *            one head at a time (the path before them), alternating, best of 40:
 *            µs per row, x_one_head
 * --rows picks the rows (a comma list of prefill, decode, verify, fp8fp4, kvq,
 * idxdot, topk, mqa; all by default; dram always).
 * Usage: bench_v4 [--threads N] [--model-dir DIR] [--steps N] [--quick]
 *                 [--rows LIST] [--pairs N]
 * Validation: every step's logits finite before a figure is printed.
 */
#include "base/util.h"
#include "kernels/attn_mqa.h"
#include "kernels/kvq.h"
#include "kernels/probe.h"
#include "model/deepseek_v4.h"
#include "model/family.h"
#include "model/model.h"
#include "tools/mkmodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { PS = 64, CHUNK = 2048 };

static int threads = 2, steps = 16, quick = 0, pairs = 2;
static const char *model_dir = "build/models";
static const char *rows; /* --rows: the rows to run (NULL: all) */

static int want(const char *row)
{
    return !rows || strstr(rows, row);
}

static int ensure_model(const char *name, int dtype, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", model_dir, name);
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    struct stat st;
    if (stat(cfg, &st) == 0) return 0;
    mkdir(model_dir, 0755);
    ms_errbuf err = {{0}};
    fprintf(stderr, "bench_v4: writing %s ...\n", out);
    if (ms_mkmodel_v4_write("small-v4", dtype, 1, out, 0, &err)) {
        fprintf(stderr, "bench_v4: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One sequence's cache for `tokens` positions: packed 0 BF16, 1 FP8 ds entries + MXFP4
 * keys, 2 FP8 ds entries + FP8 keys, 3 F32. */
struct seq {
    ms_kv_cache *c;
    ms_kv_seq q;
};

static int seq_open_q(ms_model *m, struct seq *s, int64_t tokens, int packed)
{
    ms_kv_spec spec;
    ms_errbuf err = {{0}};
    ms_kv_spec_opts o = {.elem_bytes = packed == 3 ? 4
                                       : packed    ? 1
                                                   : 2,
                         .act_bytes = 2,
                         .page_size = PS,
                         .attn_tp = 1,
                         .index_key = packed == 2   ? MS_KV_INDEX_FP8
                                      : packed == 3 ? MS_KV_INDEX_PLAIN
                                      : packed      ? MS_KV_INDEX_MXFP4
                                                    : MS_KV_INDEX_PLAIN};
    int32_t pages[MS_KV_MAX_STREAMS];
    if (ms_model_kv_spec(m, &o, &spec, &err)) goto fail;
    ms_kv_cache_pages_for(&spec, PS, tokens, 1, CHUNK, 0, pages);
    for (int i = 0; i < spec.n_streams; i++) /* the window stream whole: no sliding here */
        if (spec.streams[i].window > 0) pages[i] = (int32_t)((tokens + PS - 1) / PS + 2);
    ms_dtype kd = packed == 3 ? MS_DT_F32 : packed ? MS_DT_F8E4M3 : MS_DT_BF16;
    if (ms_kv_cache_new(&s->c, &spec, PS, pages, kd, 1, &err)) goto fail;
    ms_kv_seq_init(&s->q);
    if (ms_kv_cache_reserve(s->c, &s->q, tokens)) {
        snprintf(err.msg, sizeof err.msg, "cannot reserve %lld tokens", (long long)tokens);
        goto fail;
    }
    return 0;
fail:
    fprintf(stderr, "bench_v4: cache: %s\n", err.msg);
    return -1;
}

static int seq_open(ms_model *m, struct seq *s, int64_t tokens)
{
    return seq_open_q(m, s, tokens, 0);
}

static void seq_close(struct seq *s)
{
    ms_kv_cache_release(s->c, &s->q);
    ms_kv_seq_deinit(&s->q);
    ms_kv_cache_free(s->c);
}

/* Random BF16 entries for what a step at position ctx reads (the window,
 * every C4 / C128 entry and index key below ctx), a zeroed compressor state. */
static void fill_random(ms_model *m, struct seq *s, int64_t ctx)
{
    const ms_v4_cfg *c = &m->v4->c;
    ms_kv_view v = {s->c, &s->q};
    uint64_t rng = 77;
    for (int l = 0; l < c->n_layers; l++)
        for (int st = V4_S_WINDOW; st <= V4_S_INDEX; st++) {
            int64_t every = st == V4_S_WINDOW ? 1 : st == V4_S_C128 ? 128 : 4;
            int64_t p0 = st == V4_S_WINDOW ? MS_MAX(0, ctx - c->window) : 0;
            for (int64_t p = p0; p + every <= ctx; p += every) {
                uint16_t *e = ms_kv_view_entry(&v, st, l, p);
                if (!e) break; /* the stream does not cover this layer */
                int64_t n = ms_kv_view_entry_elems(&v, st);
                if (ms_kv_view_dtype(&v, st) == MS_DT_U8) { /* packed: pack random values */
                    float x[512];
                    int64_t d = st == V4_S_INDEX ? c->idx_hd : c->hd;
                    for (int64_t i = 0; i < d && i < 512; i++)
                        x[i] = (float)(2.0 * ms_rng_uniform(&rng) - 1.0) * 1.7f;
                    if (st == V4_S_INDEX && n == ms_kvq_fp8key_bytes(d))
                        ms_kvq_fp8key_pack(x, d, (uint8_t *)e);
                    else if (st == V4_S_INDEX)
                        ms_kvq_mxfp4_pack(x, d, (uint8_t *)e);
                    else
                        ms_kvq_fp8ds_pack(x, d, c->dr, (uint8_t *)e);
                    continue;
                }
                for (int64_t i = 0; i < n; i++)
                    e[i] = ms_f32_to_bf16((float)(2.0 * ms_rng_uniform(&rng) - 1.0) * 1.7f);
            }
        }
    ms_kv_spec spec = *ms_kv_cache_spec(s->c);
    double sb = ms_kv_spec_state_bytes(&spec, 0, c->n_layers);
    void *stb = ms_kv_view_state(&v);
    if (stb) memset(stb, 0, (size_t)sb);
}

static int forward(ms_model *m, struct seq *s, const int32_t *t, int n, int64_t pos, float *logits)
{
    ms_batch_seq sq = {.tokens = t,
                       .n_tokens = n,
                       .start_pos = pos,
                       .kv = &s->q,
                       .logits = logits,
                       .n_logits = 1,
                       .kind = n == 1 ? MS_SEQ_DECODE : MS_SEQ_PREFILL};
    ms_errbuf err = {{0}};
    int rc = ms_model_forward(m, s->c, &sq, 1, &err);
    if (rc) fprintf(stderr, "bench_v4: forward: %s\n", err.msg);
    int64_t V = ms_model_shape_of(m)->vocab;
    for (int64_t i = 0; !rc && i < V; i++)
        if (!isfinite(logits[i])) {
            fprintf(stderr, "bench_v4: logit %lld not finite\n", (long long)i);
            rc = -1;
        }
    return rc;
}

/* Median decode step (s) of `steps` steps from position ctx. */
static double decode_median(ms_model *m, struct seq *s, int64_t ctx, float *logits)
{
    double *t = malloc(sizeof(double) * (size_t)steps);
    if (!t) return -1;
    uint64_t rng = 5 + (uint64_t)ctx;
    for (int i = 0; i < steps; i++) {
        int32_t tok = 3 + (int32_t)(ms_rng_next(&rng) % 30000);
        double t0 = ms_now_s();
        if (forward(m, s, &tok, 1, ctx + i, logits)) {
            free(t);
            return -1;
        }
        t[i] = ms_now_s() - t0;
    }
    qsort(t, (size_t)steps, sizeof *t, cmp_d);
    double med = t[steps / 2];
    free(t);
    return med;
}

/* Median step (s) of `steps` verifies of n rows at position ctx (a decode's last
 * token and n - 1 drafts, every row's logits; the same positions each time: a
 * verify whose drafts are all rejected, which the cache takes as written). */
static double verify_median(ms_model *m, struct seq *s, int64_t ctx, int n, float *logits)
{
    double *t = malloc(sizeof(double) * (size_t)steps);
    if (!t) return -1;
    uint64_t rng = 9 + (uint64_t)ctx;
    int32_t tok[8];
    ms_errbuf err = {{0}};
    int rc = 0;
    for (int i = 0; i < steps && !rc; i++) {
        for (int j = 0; j < n; j++) tok[j] = 3 + (int32_t)(ms_rng_next(&rng) % 30000);
        ms_batch_seq sq = {.tokens = tok,
                           .n_tokens = n,
                           .start_pos = ctx,
                           .kv = &s->q,
                           .logits = logits,
                           .n_logits = n,
                           .kind = MS_SEQ_VERIFY};
        double t0 = ms_now_s();
        rc = ms_model_forward(m, s->c, &sq, 1, &err);
        t[i] = ms_now_s() - t0;
        if (rc) fprintf(stderr, "bench_v4: verify: %s\n", err.msg);
        for (int64_t k = 0; !rc && k < n * ms_model_shape_of(m)->vocab; k++)
            if (!isfinite(logits[k])) rc = -1;
    }
    qsort(t, (size_t)steps, sizeof *t, cmp_d);
    double med = rc ? -1 : t[steps / 2];
    free(t);
    return med;
}

/* Cache bytes (BF16) a decode step at ctx reads. */
static double cache_bytes(const ms_model *m, int64_t ctx)
{
    const ms_v4_cfg *c = &m->v4->c;
    double b = 0;
    for (int l = 0; l < c->n_layers; l++) {
        b += (double)MS_MIN(ctx + 1, c->window) * c->hd * 2;
        if (c->ratio[l] == 128) b += (double)((ctx + 1) / 128) * c->hd * 2;
        if (c->ratio[l] == 4)
            b += (double)((ctx + 1) / 4) * c->idx_hd * 2 +
                 (double)MS_MIN((ctx + 1) / 4, c->idx_topk) * c->hd * 2;
    }
    return b;
}

/* --rows topk: each decode row's CSA top-k over the F32 cache's index keys against the
 * top-k of the same queries and keys rotated and rounded as the packed caches store
 * them (f: 0 SGLang's FP8 keys, 1 MXFP4), scored as the engine scores them. */
struct topk_probe {
    struct seq *s;
    const ms_v4_cfg *c;
    int64_t sets, same[3];
    double sum[3], min[3];
    float *kq, *isc;
    int32_t *sel;
    uint8_t *mark;
};

static void topk_probe_fn(void *ctx, int l, int64_t pos, const float *iq, const float *iw,
                          int64_t nk, const int32_t *sel, int k)
{
    struct topk_probe *P = ctx;
    int64_t nI = P->c->n_idx_heads, d = P->c->idx_hd;
    ms_kv_view v = {P->s->c, &P->s->q};
    (void)pos;
    if (nk <= k) return; /* every entry chosen: nothing to compare */
    memset(P->mark, 0, (size_t)nk);
    for (int e = 0; e < k; e++) P->mark[sel[e]] = 1;
    for (int f = 0; f < 3; f++) { /* 0 FP8, 1 MXFP4, 2 rotated only (the control: ~1) */
        float q[64 * 512];
        if (nI * d > 64 * 512) return;
        memcpy(q, iq, sizeof(float) * (size_t)(nI * d));
        for (int64_t h = 0; h < nI; h++) {
            ms_kvq_hadamard(q + h * d, d);
            if (f == 0) ms_kvq_fp8key_round(q + h * d, d);
            if (f == 1) ms_kvq_mxfp4_round(q + h * d, d);
        }
        for (int64_t j = 0; j < nk; j++) {
            const float *key = ms_kv_view_entry(&v, V4_S_INDEX, l, j * 4);
            if (!key) return;
            memcpy(P->kq, key, sizeof(float) * (size_t)d);
            ms_kvq_hadamard(P->kq, d);
            if (f == 0) ms_kvq_fp8key_round(P->kq, d);
            if (f == 1) ms_kvq_mxfp4_round(P->kq, d);
            float sc = 0;
            for (int64_t h = 0; h < nI; h++)
                sc += iw[h] * fmaxf(ms_dot_f32(q + h * d, P->kq, d), 0.0f);
            P->isc[j] = sc;
        }
        ms_topk(P->isc, nk, k, P->sel);
        int hit = 0;
        for (int e = 0; e < k; e++) hit += P->mark[P->sel[e]];
        double ov = (double)hit / k;
        P->sum[f] += ov;
        P->min[f] = MS_MIN(P->min[f], ov);
        P->same[f] += hit == k;
    }
    P->sets++;
}

static ms_model *open_model(const char *dir)
{
    ms_model *m = NULL;
    ms_errbuf err = {{0}};
    ms_model_opts mo = {.threads = threads, .exact = 0};
    if (ms_model_open(&m, dir, &mo, &err)) fprintf(stderr, "bench_v4: %s: %s\n", dir, err.msg);
    return m;
}

/* A real ctx-token prefill into s: tokens/s. */
static double prefill(ms_model *m, struct seq *s, int64_t ctx, float *logits)
{
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)ctx);
    if (!ids) return -1;
    uint64_t rng = 1000 + (uint64_t)ctx;
    for (int64_t i = 0; i < ctx; i++) ids[i] = 3 + (int32_t)(ms_rng_next(&rng) % 30000);
    double t0 = ms_now_s();
    for (int64_t p = 0; p < ctx; p += CHUNK)
        if (forward(m, s, ids + p, (int)MS_MIN(CHUNK, ctx - p), p, logits)) {
            free(ids);
            return -1;
        }
    double dt = ms_now_s() - t0;
    free(ids);
    return (double)ctx / dt;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model-dir") && i + 1 < argc)
            model_dir = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = argv[++i];
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: bench_v4 [--threads N] [--model-dir DIR] [--steps N] [--quick] "
                    "[--rows prefill,decode,verify,fp8fp4,kvq,idxdot,topk,mqa] [--pairs N]\n");
            return 2;
        }
    }
    if (steps < 1) steps = 1;
    if (pairs < 1) pairs = 1;
    if (quick) steps = MS_MIN(steps, 6);
    char d16[1100], d4[1100];
    if (ensure_model("small-v4", MS_MK_BF16, d16, sizeof d16) ||
        ensure_model("small-v4-fp8-fp4", MS_MK_FP8_FP4, d4, sizeof d4))
        return 1;
    ms_model *m = open_model(d16), *m4 = want("fp8fp4") ? open_model(d4) : NULL;
    if (!m || (want("fp8fp4") && !m4)) return 1;
    float *logits = malloc(sizeof(float) * (size_t)ms_model_shape_of(m)->vocab);
    if (!logits) return 1;
    double bw = ms_probe_read_gbps(ms_model_threads(m), (size_t)1 << 30, 3);
    printf("dram threads=%d read_gbps=%.2f\n", threads, bw);
    fflush(stdout);

    /* prefill 512 and 8192, then decode after the real 8192 */
    const int64_t pctx[2] = {512, 8192};
    for (int i = 0; i < 2 && want("prefill"); i++) {
        struct seq s;
        if (seq_open(m, &s, pctx[i] + steps)) return 1;
        double tps = prefill(m, &s, pctx[i], logits);
        if (tps < 0) return 1;
        printf("prefill model=small-v4 dtype=bf16 ctx=%lld threads=%d tok_s=%.1f\n",
               (long long)pctx[i], threads, tps);
        if (i == 1) {
            double st = decode_median(m, &s, pctx[i], logits);
            if (st < 0) return 1;
            printf("decode model=small-v4 dtype=bf16 ctx=%lld fill=prefill attn=threaded "
                   "ms_token=%.2f tok_s=%.2f\n",
                   (long long)pctx[i], st * 1e3, 1 / st);
        }
        seq_close(&s);
        fflush(stdout);
    }

    /* the decode curve: threaded and reference alternating */
    const int64_t ctxs[3] = {1024, 8192, 65536 - 512}; /* 64K: below max_position_embeddings */
    double st1k = 0;
    for (int i = 0; i < 3 && want("decode"); i++) {
        int64_t ctx = ctxs[i];
        struct seq s;
        if (seq_open(m, &s, ctx + 4 * steps + 1)) return 1;
        fill_random(m, &s, ctx);
        double best[2][2];
        int64_t at = ctx;
        for (int rep = 0; rep < 2; rep++)
            for (int ref = 0; ref < 2; ref++) {
                m->v4->attn_ref = ref;
                /* each run decodes further on: the entries it wrote are as real as a decode's */
                best[ref][rep] = decode_median(m, &s, at, logits);
                if (best[ref][rep] < 0) return 1;
                at += steps;
            }
        m->v4->attn_ref = 0;
        double st = MS_MIN(best[0][0], best[0][1]), sr = MS_MIN(best[1][0], best[1][1]);
        if (i == 0) st1k = st;
        double bytes = (double)ms_model_active_bytes_per_token(m) + cache_bytes(m, ctx);
        printf("decode model=small-v4 dtype=bf16 ctx=%lld fill=random attn=threaded ms_token=%.2f "
               "tok_s=%.2f bytes_token=%.1fMB roofline=%.3f x_1k=%.2f ref_ms_token=%.2f "
               "x_ref=%.2f\n",
               (long long)ctx, st * 1e3, 1 / st, bytes / 1e6, bytes / (bw * 1e9) / st, st / st1k,
               sr * 1e3, sr / st);
        fflush(stdout);
        seq_close(&s);
    }

    /* verify steps of 2 and 4 rows (EAGLE S 1, 3) against a decode step, alternating */
    const int64_t vctx[2] = {1024, 65536 - 512};
    float *vlog =
        want("verify") ? malloc(sizeof(float) * 4 * (size_t)ms_model_shape_of(m)->vocab) : NULL;
    for (int i = 0; i < 2 && vlog; i++) {
        struct seq s;
        if (seq_open(m, &s, vctx[i] + steps + 8)) return 1;
        fill_random(m, &s, vctx[i]);
        double b[4] = {1e30, 1e30, 1e30, 1e30}; /* decode, verify of 2, 3, 4 rows: best median */
        for (int rep = 0; rep < 2; rep++)
            for (int k = 0; k < 4; k++) {
                double st = k ? verify_median(m, &s, vctx[i], k + 1, vlog)
                              : decode_median(m, &s, vctx[i], vlog);
                if (st < 0) return 1;
                b[k] = MS_MIN(b[k], st);
            }
        printf("verify model=small-v4 dtype=bf16 ctx=%lld threads=%d decode_ms=%.2f "
               "verify2_ms=%.2f x2=%.3f verify3_ms=%.2f x3=%.3f verify4_ms=%.2f x4=%.3f (verify "
               "of n rows / a decode step; alternating, best of two medians)\n",
               (long long)vctx[i], threads, b[0] * 1e3, b[1] * 1e3, b[1] / b[0], b[2] * 1e3,
               b[2] / b[0], b[3] * 1e3, b[3] / b[0]);
        fflush(stdout);
        seq_close(&s);
    }
    free(vlog);

    /* FP8 + FP4 experts against BF16, batch 1 at ctx 1024, alternating */
    double b16 = 1e30, b4 = 1e30;
    for (int rep = 0; rep < pairs && want("fp8fp4"); rep++)
        for (int k = 0; k < 2; k++) {
            ms_model *mm = k ? m4 : m;
            struct seq s;
            if (seq_open(mm, &s, 1024 + steps + 1)) return 1;
            fill_random(mm, &s, 1024);
            double st = decode_median(mm, &s, 1024, logits);
            seq_close(&s);
            if (st < 0) return 1;
            if (k)
                b4 = MS_MIN(b4, st);
            else
                b16 = MS_MIN(b16, st);
        }
    if (want("fp8fp4")) {
        double by16 = (double)ms_model_active_bytes_per_token(m),
               by4 = (double)ms_model_active_bytes_per_token(m4);
        printf("fp8fp4 model=small-v4 ctx=1024 pairs=%d bf16_ms_token=%.2f fp8fp4_ms_token=%.2f "
               "bf16_bytes_token=%.1fMB fp8fp4_bytes_token=%.1fMB bf16_gbs=%.1f fp8fp4_gbs=%.1f "
               "x_bf16=%.2f target=1.60 %s\n",
               pairs, b16 * 1e3, b4 * 1e3, by16 / 1e6, by4 / 1e6, by16 / b16 / 1e9, by4 / b4 / 1e9,
               b16 / b4, b16 / b4 >= 1.6 ? "met" : "not_met");
    }
    fflush(stdout);

    /* the deployed cache formats against the BF16 cache, batch 1, alternating */
    const int64_t qctx[2] = {1024, 65536 - 512};
    for (int i = 0; i < (quick ? 1 : 2) && want("kvq"); i++) {
        double bq[3] = {1e30, 1e30, 1e30};
        for (int rep = 0; rep < 2; rep++)
            for (int k = 0; k < 3; k++) {
                struct seq s;
                if (seq_open_q(m, &s, qctx[i] + steps + 1, k)) return 1;
                fill_random(m, &s, qctx[i]);
                double st = decode_median(m, &s, qctx[i], logits);
                seq_close(&s);
                if (st < 0) return 1;
                bq[k] = MS_MIN(bq[k], st);
            }
        /* the aim (issue 25): the packed cache at least as fast as BF16 entries at 64K */
        printf("kvq model=small-v4 dtype=bf16 ctx=%lld bf16_cache_ms_token=%.2f "
               "fp8_fp4_cache_ms_token=%.2f x_bf16=%.2f fp8_fp8_cache_ms_token=%.2f "
               "x_bf16_fp8keys=%.2f target=1.00%s\n",
               (long long)qctx[i], bq[0] * 1e3, bq[1] * 1e3, bq[0] / bq[1], bq[2] * 1e3,
               bq[0] / bq[2],
               i == 0                 ? " (at 64K)"
               : bq[0] / bq[1] >= 1.0 ? " met"
                                      : " not_met");
        fflush(stdout);
    }
    /* the decode indexer's key scoring alone, one thread: unpacked rows + ms_dot_f32
     * (the scoring before the packed-code dots) against ms_kvq_fp8key_dots (FP8 keys)
     * and ms_kvq_mxfp4_dots (MXFP4 keys, --enable-deepseek-v4-fp4-indexer), alternating */
    if (want("idxdot")) {
        const ms_v4_cfg *c = &m->v4->c;
        int64_t nk = (65536 - 512) / 4, nI = c->n_idx_heads, d = c->idx_hd;
        static const char *fname[2] = {"fp8", "mxfp4"};
        void (*pack[2])(const float *, int64_t, uint8_t *) = {ms_kvq_fp8key_pack,
                                                              ms_kvq_mxfp4_pack};
        void (*unpack[2])(const uint8_t *, int64_t, float *) = {ms_kvq_fp8key_unpack,
                                                                ms_kvq_mxfp4_unpack};
        void (*dots[2])(const float *, int64_t, int64_t, const uint8_t *, int64_t,
                        float *) = {ms_kvq_fp8key_dots, ms_kvq_mxfp4_dots};
        for (int f = 0; f < 2; f++) {
            int64_t kb = f ? ms_kvq_mxfp4_bytes(d) : ms_kvq_fp8key_bytes(d);
            uint8_t *keys = malloc((size_t)(nk * kb));
            float *q = malloc(sizeof(float) * (size_t)(nI * d)),
                  *sc = malloc(sizeof(float) * (size_t)nk);
            float *rowsb = malloc(sizeof(float) * (size_t)(64 * d)), w[256], dd[256];
            if (!keys || !q || !sc || !rowsb || nI > 256) return 1;
            uint64_t rng = 9;
            float x[4096];
            for (int64_t j = 0; j < nk; j++) {
                for (int64_t i = 0; i < d; i++) x[i] = (float)(2.0 * ms_rng_uniform(&rng) - 1.0);
                pack[f](x, d, keys + j * kb);
            }
            for (int64_t i = 0; i < nI * d; i++) q[i] = (float)(2.0 * ms_rng_uniform(&rng) - 1.0);
            for (int64_t h = 0; h < nI; h++) w[h] = (float)ms_rng_uniform(&rng);
            double best[2] = {1e30, 1e30}, chk[2] = {0, 0};
            for (int rep = 0; rep < 6; rep++)
                for (int k = 0; k < 2; k++) {
                    double t0 = ms_now_s();
                    for (int64_t b = 0; b < nk; b += 64) {
                        int64_t n = MS_MIN(64, nk - b);
                        if (k == 0)
                            for (int64_t j = 0; j < n; j++)
                                unpack[f](keys + (b + j) * kb, d, rowsb + j * d);
                        for (int64_t j = 0; j < n; j++) {
                            float s = 0;
                            if (k == 0)
                                for (int64_t h = 0; h < nI; h++)
                                    s +=
                                        w[h] * fmaxf(ms_dot_f32(q + h * d, rowsb + j * d, d), 0.0f);
                            else {
                                dots[f](q, nI, d, keys + (b + j) * kb, d, dd);
                                for (int64_t h = 0; h < nI; h++) s += w[h] * fmaxf(dd[h], 0.0f);
                            }
                            sc[b + j] = s;
                        }
                    }
                    best[k] = MS_MIN(best[k], ms_now_s() - t0);
                    chk[k] = 0;
                    for (int64_t j = 0; j < nk; j++) chk[k] += sc[j];
                }
            printf("idxdot model=small-v4 key=%s keys=%lld heads=%lld dim=%lld threads=1 "
                   "unpack_dot_ns_key=%.1f packed_dots_ns_key=%.1f x_unpack=%.2f same_scores=%s\n",
                   fname[f], (long long)nk, (long long)nI, (long long)d, best[0] / nk * 1e9,
                   best[1] / nk * 1e9, best[0] / best[1], chk[0] == chk[1] ? "yes" : "NO");
            fflush(stdout);
            free(keys), free(q), free(sc), free(rowsb);
        }
    }

    /* one query row's sink attention on one thread (a prefill row's, H heads over n rows):
     * ms_attn_mqa over every head (blocks of 8 heads) against one head at a time (each
     * head's dot products and axpys: the path before the blocks), alternating */
    if (want("mqa")) {
        const int64_t H = m->n_local_heads, n = 256, hds[2] = {m->v4->c.hd, 512};
        for (int hi = 0; hi < 2; hi++) {
            const int64_t hd = hds[hi];
            float *mem = malloc(sizeof(float) * (size_t)(4 * n * hd)),
                  *o = malloc(sizeof(float) * (size_t)(H * hd));
            float *q = malloc(sizeof(float) * (size_t)(H * hd)),
                  *sink = malloc(sizeof(float) * (size_t)H);
            float *scr = malloc(sizeof(float) * (size_t)ms_attn_mqa_scratch_floats(n, hd));
            const float **rp = malloc(sizeof(float *) * (size_t)n);
            if (!mem || !o || !q || !sink || !scr || !rp) return 1;
            uint64_t rng = 11;
            for (int64_t i = 0; i < 4 * n * hd; i++)
                mem[i] = (float)(2.0 * ms_rng_uniform(&rng) - 1.0);
            for (int64_t i = 0; i < H * hd; i++) q[i] = (float)(2.0 * ms_rng_uniform(&rng) - 1.0);
            for (int64_t h = 0; h < H; h++) sink[h] = 0.5f;
            for (int64_t i = 0; i < n; i++) rp[i] = mem + ((i * 13) % (4 * n)) * hd;
            const float scale = 1.0f / sqrtf((float)hd);
            double best[2] = {1e30, 1e30};
            for (int rep = 0; rep < 40; rep++)
                for (int k = 0; k < 2; k++) {
                    double t0 = ms_now_s();
                    for (int it = 0; it < 20; it++)
                        if (k == 0)
                            for (int64_t h = 0; h < H; h++)
                                ms_attn_mqa(q, hd, rp, n, h, h + 1, scale, sink, scr, o);
                        else
                            ms_attn_mqa(q, hd, rp, n, 0, H, scale, sink, scr, o);
                    best[k] = MS_MIN(best[k], (ms_now_s() - t0) / 20);
                }
            printf("mqa model=small-v4 heads=%lld hd=%lld rows=%lld threads=1 one_head_us=%.1f "
                   "blocks_us=%.1f x_one_head=%.2f\n",
                   (long long)H, (long long)hd, (long long)n, best[0] * 1e6, best[1] * 1e6,
                   best[0] / best[1]);
            fflush(stdout);
            free(mem), free(o), free(q), free(sink), free(scr), free(rp);
        }
    }

    /* the indexer's top-k: FP32 keys against FP8 and MXFP4 keys, the same queries, after a
     * real 4096-token prefill */
    if (want("topk")) {
        const ms_v4_cfg *c = &m->v4->c;
        int64_t ctx = 4096, cap = ctx + steps + 1;
        struct seq s;
        if (seq_open_q(m, &s, cap, 3)) return 1;
        struct topk_probe P = {.s = &s, .c = c, .min = {1, 1, 1}};
        P.kq = malloc(sizeof(float) * (size_t)c->idx_hd);
        P.isc = malloc(sizeof(float) * (size_t)cap);
        P.sel = malloc(sizeof(int32_t) * (size_t)c->idx_topk);
        P.mark = malloc((size_t)cap);
        if (!P.kq || !P.isc || !P.sel || !P.mark) return 1;
        double tps = prefill(m, &s, ctx, logits);
        if (tps < 0) return 1;
        m->v4->topk_probe = topk_probe_fn;
        m->v4->topk_probe_ctx = &P;
        double st = decode_median(m, &s, ctx, logits);
        m->v4->topk_probe = NULL;
        if (st < 0 || P.sets == 0) return 1;
        printf("topk model=small-v4 dtype=bf16 cache=f32 ctx=%lld steps=%d sets=%lld k=%d "
               "keys=%lld fp8_overlap_mean=%.4f fp8_overlap_min=%.4f fp8_same=%.3f "
               "mxfp4_overlap_mean=%.4f mxfp4_overlap_min=%.4f mxfp4_same=%.3f "
               "rotated_only_overlap_mean=%.4f rotated_only_same=%.3f\n",
               (long long)ctx, steps, (long long)P.sets, c->idx_topk, (long long)(ctx / 4),
               P.sum[0] / P.sets, P.min[0], (double)P.same[0] / P.sets, P.sum[1] / P.sets, P.min[1],
               (double)P.same[1] / P.sets, P.sum[2] / P.sets, (double)P.same[2] / P.sets);
        fflush(stdout);
        seq_close(&s);
        free(P.kq), free(P.isc), free(P.sel), free(P.mark);
    }
    free(logits);
    ms_model_free(m);
    ms_model_free(m4);
    return 0;
}
