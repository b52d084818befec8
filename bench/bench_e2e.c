/* bench_e2e.c — end-to-end speed of the engine on the small-v3 benchmark model
 * (writes it under build/models/ on first use; ~1.6 GB in BF16).
 *
 * Rows (key=value), all measured in one run so ratios are comparable:
 *   dram      read bandwidth with the decode's thread count (GB/s), probed
 *             before and after the decode row (the roofline uses the higher)
 *   peak      register-only vdpbf16ps GFLOP/s with the same threads (FP32
 *             FMA, vfmadd231ps, on a CPU without AVX512_BF16)
 *   decode    batch 1: tokens/s, ms/token (median step), active weight bytes
 *             per token, roofline ratio = bytes / bandwidth / time per token
 *   prefill   512-token prompt: tokens/s and GFLOP/s (2 x active params per
 *             token + attention)
 *   batch     32 concurrent sequences: aggregate decode tokens/s, x a batch-1
 *             decode run just before it (both as decode tokens over decode
 *             time; also both as tokens per median step); three such pairs,
 *             the medians of their ratios and every pair (batch_row)
 *   f8b32     the batch row on small-v3-fp8 (FP8 batch 32 x FP8 batch 1)
 *   ctx       batch-1 decode at context 16 (short), 4,096 and 32,768 tokens (issue 28:
 *             32K >= 0.5x short): each prompt prefilled once (chunks of 4,096), then
 *             32 decode steps (--quick: 16), median step; short decoded before and
 *             after the long ones (x_short divides by their mean); bytes per token =
 *             active weights + the cache rows the token reads (ms_kv_spec_cost), the
 *             roofline ratio against the higher of DRAM probes right before and after
 *   fp8       the same model with FP8 projections: decode tokens/s, x BF16
 *             (BF16 and FP8 decodes alternate, two of each)
 *   det       --enable-deterministic-inference (batch-invariant products) against
 *             the default on the same BF16 model: decode batch 1 and 32 (tokens
 *             per median step) and a 512-token prefill, each mode's runs
 *             alternating (two of each), x = deterministic / default
 *   spec      speculative decoding (EAGLE, the MTP layer of small-v3-mtp: small-v3
 *             with num_nextn_predict_layers 1) at S = 1 with SGLANG_SIMULATE_ACC_LEN
 *             2 against plain decoding of the same model, batch 1, 4, 16 and 32, then
 *             the same with a 4096-id draft token map (ids 0..4095); each against
 *             plain, alternating (two each; two engines open at a time, ~2 GB
 *             each); tokens / decode time, x = spec / plain
 *   v4mtp     (not in the default rows) EAGLE on small-v4 (--model-dir's small-v4,
 *             its MTP block as the draft) against plain decoding, batch 1, 16-token
 *             prompts, 48 new tokens: the full draft head at S = 1, 2, 3 with
 *             SGLANG_SIMULATE_ACC_LEN 2, and a 4096-id --speculative-token-map (ids
 *             0..4095) at S = 1..3 x SIMULATE 1.5, 2, 3 (--quick: four of them); each
 *             alternating with plain (two runs each): x_plain = spec / plain tokens per
 *             decode second, the measured accept length, and a step's split (ms): the
 *             verify forward, the S draft rounds, the rest (sampling, acceptance, scheduler)
 *   v4curve   (not in the default rows) plain against EAGLE S = 1 with the 4096-id map
 *             and SGLANG_SIMULATE_ACC_LEN 2 on small-v4 at batch 1, 4, 16 and 32
 *             (16-token prompts, 32 new tokens; alternating, two each): x_plain
 *   dnnl      BF16 prefill of 512 and 2048 tokens with oneDNN at M >= 128
 *             (the default) against the mm_bf16 tiles at every M, in the same
 *             engine, alternating (three of each): x = tiles / oneDNN
 * Runs with OMP_WAIT_POLICY=passive (re-executes itself to set it, as
 * moeserve does): with libgomp's default, oneDNN's threads spin after each
 * call against the kernel pool and every oneDNN figure is too low.
 * Usage: bench_e2e [--threads N] [--model-dir DIR] [--quick] [--rows ...]
 * Validation: the BF16 and FP8 engines must produce finite logits and
 * non-degenerate greedy output before anything is timed.
 */
#include "base/log.h"
#include "base/util.h"
#include "cache/kv_spec.h"
#include "kernels/kernels.h"
#include "kernels/probe.h"
#include "serve/engine.h"
#include "tools/mkmodel.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

static int threads = 0, quick = 0;
static const char *rows =
    "decode,prefill,batch,ctx,fp8,f8b32,det,spec"; /* --rows: which rows to run */
static const char *model_dir = "build/models";

static int ensure_model(const char *name, int dtype, char *out, size_t cap, int mtp)
{
    snprintf(out, cap, "%s/%s", model_dir, name);
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    struct stat st;
    if (stat(cfg, &st) == 0) return 0;
    mkdir(model_dir, 0755);
    ms_config c;
    ms_errbuf err = {{0}};
    ms_mkmodel_preset("small-v3", &c);
    c.num_nextn_predict_layers = mtp;
    fprintf(stderr, "bench_e2e: writing %s ...\n", out);
    if (ms_mkmodel_write(&c, dtype, 1, out, 0, &err)) {
        fprintf(stderr, "bench_e2e: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct run {
    double prefill_s; /* time of the prefill step(s) */
    int64_t prefill_tokens;
    double step_median_s; /* median decode step */
    double decode_tok_s;  /* decode tokens / decode time */
    int64_t decode_tokens;
    int64_t decode_steps;          /* decode (and verify) steps */
    double dec_fwd_s, dec_draft_s; /* their forward and draft seconds (the rest: sample, other) */
};

/* Runs n_seq prompts of `prompt_len` tokens for `new_tokens` greedy tokens. */
static int run(ms_engine *e, int n_seq, int prompt_len, int new_tokens, struct run *r,
               uint64_t salt)
{
    ms_errbuf err = {{0}};
    static uint64_t next_id = 1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt_len);
    if (!ids) return -1;
    for (int s = 0; s < n_seq; s++) {
        uint64_t rng = 1000 + (uint64_t)s + salt * 7919; /* distinct prompts: no cache hits */
        for (int i = 0; i < prompt_len; i++) ids[i] = 3 + (int32_t)(ms_rng_next(&rng) % 30000);
        ms_req_params in = {.id = next_id++,
                            .ids = ids,
                            .n_ids = prompt_len,
                            .max_new = new_tokens,
                            .ignore_eos = 1,
                            .top_logprobs = -1,
                            .samp = {.temperature = 0, .top_p = 1},
                            .dp_rank = -1};
        if (ms_engine_submit(e, &in, &err)) {
            fprintf(stderr, "bench_e2e: %s\n", err.msg);
            free(ids);
            return -1;
        }
    }
    free(ids);
    double *steps = malloc(sizeof(double) * (size_t)(new_tokens + 16));
    int n_steps = 0;
    memset(r, 0, sizeof *r);
    double t_dec = 0;
    int64_t distinct = 0, last = -1;
    while (ms_engine_busy(e)) {
        if (ms_engine_step(e, &err)) {
            fprintf(stderr, "bench_e2e: %s\n", err.msg);
            free(steps);
            return -1;
        }
        ms_engine_step_stats st;
        ms_engine_last_step(e, &st);
        const ms_engine_event *ev;
        int n = ms_engine_events(e, &ev);
        int64_t pre = st.rows - st.decode_rows - st.verify_rows, made = 0;
        for (int i = 0; i < n; i++) made += ev[i].ev.token >= 0;
        if (pre > 0) {
            r->prefill_s += st.seconds;
            r->prefill_tokens += pre;
        } else if (st.rows > 0) { /* decode and verify rows: the tokens they emitted */
            t_dec += st.seconds;
            r->decode_tokens += made;
            r->decode_steps++;
            r->dec_fwd_s += st.forward_s;
            r->dec_draft_s += st.draft_s;
            if (n_steps < new_tokens + 16) steps[n_steps++] = st.seconds;
        }
        for (int i = 0; i < n; i++) {
            if (!isfinite(ev[i].ev.logprob)) return -1;
            if (ev[i].ev.token != last) distinct++;
            last = ev[i].ev.token;
        }
    }
    qsort(steps, (size_t)n_steps, sizeof *steps, cmp_d);
    r->step_median_s = n_steps ? steps[n_steps / 2] : 0;
    r->decode_tok_s = t_dec > 0 ? (double)r->decode_tokens / t_dec : 0;
    free(steps);
    if (new_tokens >= 8 && distinct < 3) {
        fprintf(stderr, "bench_e2e: degenerate output (%lld distinct runs)\n", (long long)distinct);
        return -1;
    }
    return 0;
}

static ms_engine *open_engine(const char *dir, int deterministic, int spec_steps,
                              const char *token_map)
{
    ms_engine_opts o;
    ms_engine_opts_init(&o);
    o.model_path = dir;
    o.deterministic = deterministic;
    if (spec_steps > 0) {
        o.launch.spec = MS_SPEC_EAGLE;
        o.launch.speculative_num_steps = spec_steps;
        if (token_map)
            snprintf(o.launch.speculative_token_map, sizeof o.launch.speculative_token_map, "%s",
                     token_map);
    }
    o.threads = threads;
    o.max_total_tokens = 65536;
    o.max_running_default = 64;
    o.chunk_default = 4096;
    o.prepack = !deterministic; /* as serve and generate start (their warm-up) */
    ms_errbuf err = {{0}};
    ms_engine *e = NULL;
    if (ms_engine_open(&e, &o, &err)) fprintf(stderr, "bench_e2e: %s\n", err.msg);
    return e;
}

/* The batch rows (issue 28: batch 32 ÷ batch 1, "in one run ... several
 * alternations, medians"): BATCH_PAIRS pairs on engine e, each a batch-1
 * decode then a batch-32 one; per pair x_batch1 = batch-32 decode tokens/s ÷
 * the batch-1 decode just before (decode tokens over decode time) and
 * x_batch1_median = the same from the median steps.  The row's x_batch1 is
 * the median of the pairs' (so one slow batch-1 half no longer decides it),
 * tok_s / batch1_tok_s the median pair's (x = their ratio still); pair_*
 * list every pair in run order.  Pair 0 keeps the prompts of the one-pair
 * row that came before (salts 8, 5). */
enum { BATCH_PAIRS = 3 };

static int cmp_pair(const void *a, const void *b, void *xs)
{
    const double *x = xs;
    int i = *(const int *)a, j = *(const int *)b;
    return x[i] < x[j] ? -1 : x[i] > x[j];
}

static int median_pair(const double *x, int n)
{
    int idx[BATCH_PAIRS];
    for (int i = 0; i < n; i++) idx[i] = i;
    qsort_r(idx, (size_t)n, sizeof idx[0], cmp_pair, (void *)x);
    return idx[n / 2];
}

static int batch_row(ms_engine *e, const char *row, const char *model, const char *dtype, int nt,
                     int new_tokens)
{
    struct run r1[BATCH_PAIRS], rb[BATCH_PAIRS];
    double x[BATCH_PAIRS], xm[BATCH_PAIRS];
    for (int i = 0; i < BATCH_PAIRS; i++) {
        uint64_t s1 = i ? 600 + 2 * (uint64_t)i : 8, s32 = i ? 601 + 2 * (uint64_t)i : 5;
        if (run(e, 1, 16, new_tokens, &r1[i], s1) || run(e, 32, 16, quick ? 16 : 48, &rb[i], s32))
            return -1;
        x[i] = rb[i].decode_tok_s / r1[i].decode_tok_s;
        xm[i] = 32 * r1[i].step_median_s / rb[i].step_median_s;
    }
    const int a = median_pair(x, BATCH_PAIRS), b = median_pair(xm, BATCH_PAIRS);
    char px[160] = "", pxm[160] = "", p1[160] = "", p32[160] = "";
    for (int i = 0; i < BATCH_PAIRS; i++) {
        const char *sep = i ? "/" : "";
        size_t o = strlen(px), om = strlen(pxm), o1 = strlen(p1), o32 = strlen(p32);
        snprintf(px + o, sizeof px - o, "%s%.2f", sep, x[i]);
        snprintf(pxm + om, sizeof pxm - om, "%s%.2f", sep, xm[i]);
        snprintf(p1 + o1, sizeof p1 - o1, "%s%.2f", sep, r1[i].decode_tok_s);
        snprintf(p32 + o32, sizeof p32 - o32, "%s%.1f", sep, rb[i].decode_tok_s);
    }
    printf("%s model=%s dtype=%s seqs=32 threads=%d tok_s=%.1f batch1_tok_s=%.2f x_batch1=%.2f "
           "median_step_tok_s=%.1f batch1_median_step_tok_s=%.2f x_batch1_median=%.2f pairs=%d "
           "pair_x_batch1=%s pair_x_batch1_median=%s pair_batch1_tok_s=%s pair_tok_s=%s "
           "(medians of the pairs; in each pair batch 1 decoded just before)\n",
           row, model, dtype, nt, rb[a].decode_tok_s, r1[a].decode_tok_s, x[a],
           32 / rb[b].step_median_s, 1.0 / r1[b].step_median_s, xm[b], BATCH_PAIRS, px, pxm, p1,
           p32);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    /* oneDNN's OpenMP threads must sleep between calls, as under moeserve (main.c) */
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
        execv("/proc/self/exe", argv); /* on failure, go on with the default */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model-dir") && i + 1 < argc)
            model_dir = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_e2e [--threads N] [--model-dir DIR] [--quick] "
                    "[--rows decode,prefill,batch,ctx,fp8,f8b32,det,spec,dnnl,v4mtp,v4curve]\n");
            return 2;
        }
    }
    ms_log_init(0);
    ms_log_threshold = MS_WARN;
    char bf16[1200], fp8[1200];
    if (ensure_model("small-v3", MS_MK_BF16, bf16, sizeof bf16, 0) ||
        ensure_model("small-v3-fp8", MS_MK_FP8, fp8, sizeof fp8, 0))
        return 1;
    int new_tokens = quick ? 32 : 96;
    ms_engine *e = open_engine(bf16, 0, 0, NULL);
    if (!e) return 1;
    const ms_model *m = ms_engine_model(e);
    int nt = ms_pool_size(ms_model_threads(m));
    double bw = ms_probe_read_gbps(ms_model_threads(m), (size_t)1 << 30, quick ? 3 : 5);
    /* the peak of the instruction the kernels compute with: vdpbf16ps, or
     * FP32 FMA on a CPU without AVX512_BF16 */
    double peak = ms_probe_bf16_gflops(ms_model_threads(m), 3);
    const char *peak_op = "vdpbf16ps";
    if (peak <= 0) peak = ms_probe_fma_gflops(ms_model_threads(m), 3), peak_op = "vfmadd231ps";
    printf("dram threads=%d read_gbps=%.2f\n", nt, bw);
    printf("peak threads=%d op=%s gflop_s=%.1f\n", nt, peak_op, peak);
    struct run r1, rp;
    if (run(e, 1, 16, 8, &r1, 1)) return 1; /* warm-up + validation */
    ms_model_profile_print();
    if (run(e, 1, 16, new_tokens, &r1, 2)) return 1;
    /* the machine's bandwidth drifts: probe again right after the decode and
     * take the better reading as the peak of this run */
    double bw2 = ms_probe_read_gbps(ms_model_threads(m), (size_t)1 << 30, quick ? 3 : 5);
    if (bw2 > bw) bw = bw2;
    printf("dram threads=%d read_gbps=%.2f (after decode; the roofline uses the higher)\n", nt,
           bw2);
    double bytes = (double)ms_model_active_bytes_per_token(m);
    double t_tok = r1.step_median_s;
    printf("decode model=small-v3 dtype=bf16 batch=1 threads=%d tok_s=%.2f ms_per_token=%.3f "
           "active_bytes=%.0f roofline_ms=%.3f roofline_ratio=%.3f\n",
           nt, 1.0 / t_tok, t_tok * 1e3, bytes, bytes / (bw * 1e9) * 1e3,
           bytes / (bw * 1e9) / t_tok);
    ms_model_profile_print();
    /* the first prefill warms up (with MOESERVE_PANELS=0: oneDNN's copies were made at open) */
    if (strstr(rows, "prefill")) {
        if (run(e, 1, 512, 2, &rp, 3)) return 1;
        ms_model_profile_print();
        if (run(e, 1, 512, 2, &rp, 4)) return 1;
        /* active parameters per token ≈ active bytes / 2 (BF16); attention adds 2·S·H·(dn+dr+dv) */
        const ms_model_shape *c = ms_model_shape_of(m);
        double attn_flop =
            2.0 * 512 / 2 * c->n_heads * (c->qk_nope + c->qk_rope + c->v_head_dim) * c->n_layers;
        double flop_tok = 2.0 * (bytes / 2) + attn_flop;
        /* gflop_s counts the LM head for every token (as in earlier rows); the
         * prefill needs it for the last token only: needed_gflop_s, of_peak */
        double head_flop = 2.0 * c->vocab * c->hidden;
        double need = ((flop_tok - head_flop) * rp.prefill_tokens + head_flop) / rp.prefill_s / 1e9;
        printf("prefill model=small-v3 dtype=bf16 tokens=%lld threads=%d tok_s=%.1f gflop_s=%.1f "
               "needed_gflop_s=%.1f of_peak=%.2f\n",
               (long long)rp.prefill_tokens, nt, rp.prefill_tokens / rp.prefill_s,
               flop_tok * rp.prefill_tokens / rp.prefill_s / 1e9, need, peak > 0 ? need / peak : 0);
        ms_model_profile_print();
    }
    /* The ratio rows divide by a BF16 batch-1 decode measured next to them,
     * not by the one above: this machine's bandwidth drifts by tens of
     * percent within a minute. */
    if (strstr(rows, "batch")) {
        /* both rates measured the same way: decode tokens over decode time
         * (x_batch1), and one step's tokens over the median step (x_batch1_median).
         * Rows before 2026-11-30 divided the batch's mean rate by batch 1's
         * median-step rate, which read 4-6 % lower (bench/HISTORY.md); rows
         * before 2026-12-03 took one pair, not the median of BATCH_PAIRS. */
        if (batch_row(e, "batch", "small-v3", "bf16", nt, new_tokens)) return 1;
        ms_model_profile_print();
    }
    if (strstr(rows, "ctx")) { /* decode at long context against short (issue 28) */
        static const int lens[] = {16, 4096, 32768, 16};
        int n_dec = quick ? 16 : 32;
        double ms_tok[4], pre_s[4];
        struct run a;
        double bwc = ms_probe_read_gbps(ms_model_threads(m), (size_t)1 << 30, quick ? 3 : 5);
        for (int l = 0; l < 4; l++) {
            if (run(e, 1, lens[l], n_dec + 1, &a, 400 + (uint64_t)l)) return 1;
            ms_tok[l] = a.step_median_s * 1e3;
            pre_s[l] = a.prefill_s;
        }
        double bwc2 = ms_probe_read_gbps(ms_model_threads(m), (size_t)1 << 30, quick ? 3 : 5);
        printf("dram threads=%d read_gbps=%.2f before_ctx=%.2f (the ctx rows use the higher)\n", nt,
               bwc2, bwc);
        if (bwc2 > bwc) bwc = bwc2;
        double short_ms = (ms_tok[0] + ms_tok[3]) / 2;
        for (int l = 0; l < 3; l++) {
            ms_kv_cost kc; /* a token at the middle of the timed steps */
            ms_kv_spec_cost(ms_engine_kv_spec(e), lens[l] + n_dec / 2, &kc);
            double b = bytes + kc.read_bytes_total, roof_ms = b / (bwc * 1e9) * 1e3;
            printf("ctx model=small-v3 dtype=bf16 batch=1 threads=%d context=%d tok_s=%.2f "
                   "ms_per_token=%.3f weight_bytes=%.0f cache_bytes=%.0f bytes_per_token=%.0f "
                   "roofline_ms=%.3f roofline_ratio=%.3f x_short=%.3f prefill_s=%.2f "
                   "(short: %.3f / %.3f ms before / after)\n",
                   nt, lens[l], 1e3 / ms_tok[l], ms_tok[l], bytes, kc.read_bytes_total, b, roof_ms,
                   roof_ms / ms_tok[l], short_ms / ms_tok[l], pre_s[l], ms_tok[0], ms_tok[3]);
        }
        fflush(stdout);
    }
    ms_errbuf err;
    if (strstr(rows, "fp8")) { /* BF16 and FP8 decodes alternate, two of each */
        ms_engine *e8 = open_engine(fp8, 0, 0, NULL);
        if (!e8) return 1;
        const ms_model *m8 = ms_engine_model(e8);
        struct run r8, rbf;
        double t8 = 0, tb = 0;
        if (run(e8, 1, 16, 8, &r8, 6)) return 1; /* warm-up + validation */
        for (int i = 0; i < 2; i++) {
            if (run(e, 1, 16, new_tokens, &rbf, 9 + 2 * (uint64_t)i) ||
                run(e8, 1, 16, new_tokens, &r8, 10 + 2 * (uint64_t)i))
                return 1;
            tb += rbf.step_median_s;
            t8 += r8.step_median_s;
        }
        double bytes8 = (double)ms_model_active_bytes_per_token(m8);
        printf("fp8 model=small-v3 dtype=fp8 batch=1 threads=%d tok_s=%.2f bf16_tok_s=%.2f "
               "x_bf16=%.2f (alternating, two each) active_bytes=%.0f bandwidth_cap_x=%.2f "
               "roofline_ratio=%.3f\n",
               nt, 2.0 / t8, 2.0 / tb, tb / t8, bytes8, bytes / bytes8,
               bytes8 / (bw * 1e9) / (t8 / 2));
        ms_engine_shutdown(e8);
        ms_engine_step(e8, &err);
        ms_engine_close(e8);
    }
    if (strstr(rows, "dnnl")) { /* oneDNN at large M against the tiles, alternating */
        static const int lens[] = {512, 2048};
        struct run a;
        if (run(e, 1, 512, 2, &a, 200)) return 1; /* warm-up: oneDNN's first reorders */
        for (int l = 0; l < 2; l++) {
            double tok_s[2][3];
            for (int i = 0; i < 3; i++)
                for (int mode = 0; mode < 2; mode++) { /* 0: default (oneDNN), 1: tiles */
                    int64_t old = mode ? ms_kernels_set_dnnl_min_m(INT64_MAX) : 0;
                    int rc = run(e, 1, lens[l], 2, &a,
                                 300 + 10 * (uint64_t)l + 2 * (uint64_t)i + (uint64_t)mode);
                    if (mode) ms_kernels_set_dnnl_min_m(old);
                    if (rc) return 1;
                    tok_s[mode][i] = (double)a.prefill_tokens / a.prefill_s;
                }
            qsort(tok_s[0], 3, sizeof(double), cmp_d);
            qsort(tok_s[1], 3, sizeof(double), cmp_d);
            printf("dnnl model=small-v3 dtype=bf16 threads=%d prompt=%d dnnl_prefill_tok_s=%.1f "
                   "tiles_prefill_tok_s=%.1f x_tiles=%.3f runs=%.0f/%.0f/%.0f,%.0f/%.0f/%.0f "
                   "(alternating, three each, medians)\n",
                   nt, lens[l], tok_s[0][1], tok_s[1][1], tok_s[1][1] / tok_s[0][1], tok_s[0][0],
                   tok_s[0][1], tok_s[0][2], tok_s[1][0], tok_s[1][1], tok_s[1][2]);
            fflush(stdout);
        }
    }
    if (strstr(rows, "f8b32")) { /* the batch row on small-v3-fp8: FP8 batch 32 ÷ FP8 batch 1 */
        ms_engine *e8 = open_engine(fp8, 0, 0, NULL);
        struct run w8;
        if (!e8 || run(e8, 1, 16, 8, &w8, 6) || /* warm-up + validation */
            batch_row(e8, "f8b32", "small-v3-fp8", "fp8", nt, new_tokens))
            return 1;
        ms_engine_shutdown(e8);
        ms_engine_step(e8, &err);
        ms_engine_close(e8);
    }
    if (strstr(rows, "det")) { /* default and deterministic runs alternate, two of each */
        ms_engine *ed = open_engine(bf16, 1, 0, NULL);
        if (!ed) return 1;
        struct run a, b;
        double d1[2] = {0}, d32[2] = {0}, pf[2] = {0}; /* [default, deterministic] seconds */
        int64_t pft[2] = {0};
        if (run(ed, 1, 16, 8, &a, 20) || run(ed, 1, 512, 2, &a, 21) || run(e, 1, 512, 2, &a, 22))
            return 1; /* warm-up + validation */
        for (int i = 0; i < 2; i++)
            for (int mode = 0; mode < 2; mode++) {
                ms_engine *x = mode ? ed : e;
                uint64_t salt = 30 + 4 * (uint64_t)i + 2 * (uint64_t)mode;
                if (run(x, 1, 16, new_tokens, &a, salt) ||
                    run(x, 32, 16, quick ? 16 : 48, &b, salt + 1))
                    return 1;
                d1[mode] += a.step_median_s;
                d32[mode] += b.step_median_s;
                if (run(x, 1, 512, 2, &a, salt + 100)) return 1;
                pf[mode] += a.prefill_s;
                pft[mode] += a.prefill_tokens;
            }
        printf("det model=small-v3 dtype=bf16 threads=%d decode1_tok_s=%.2f det_decode1_tok_s=%.2f "
               "x_decode1=%.3f decode32_tok_s=%.1f det_decode32_tok_s=%.1f x_decode32=%.3f "
               "prefill512_tok_s=%.1f det_prefill512_tok_s=%.1f x_prefill=%.3f "
               "(alternating, two each; tokens per median step)\n",
               nt, 2 / d1[0], 2 / d1[1], d1[0] / d1[1], 64 / d32[0], 64 / d32[1], d32[0] / d32[1],
               pft[0] / pf[0], pft[1] / pf[1], (pft[1] / pf[1]) / (pft[0] / pf[0]));
        ms_engine_shutdown(ed);
        ms_engine_step(ed, &err);
        ms_engine_close(ed);
    }
    if (strstr(rows, "spec")) { /* plain and speculative runs alternate at each batch size */
        ms_engine_shutdown(e);
        ms_engine_step(e, &err);
        ms_engine_close(e);
        char mtp[1200];
        if (ensure_model("small-v3-mtp", MS_MK_BF16, mtp, sizeof mtp, 1)) return 1;
        char map[1300];
        snprintf(map, sizeof map, "%s/token-map-4096.txt", model_dir);
        FILE *f = fopen(map, "w");
        for (int i = 0; f && i < 4096; i++) fprintf(f, "%d\n", i);
        if (!f || fclose(f)) return 1;
        e = open_engine(mtp, 0, 0, NULL);
        struct run a;
        if (!e || run(e, 1, 16, 8, &a, 40)) return 1; /* warm-up */
        static const int batches[] = {1, 4, 16, 32};
        for (int v = 0; v < 2; v++) { /* the full draft head, then the token map; one at a time */
            setenv("SGLANG_SIMULATE_ACC_LEN", "2", 1);
            ms_engine *es = open_engine(mtp, 0, 1, v ? map : NULL);
            unsetenv("SGLANG_SIMULATE_ACC_LEN");
            if (!es || run(es, 1, 16, 8, &a, 41)) return 1;
            for (int bi = 0; bi < 4; bi++) {
                int B = batches[bi], n_new = quick ? 16 : B > 4 ? 32 : 64;
                double t[2] = {0}, tok[2] = {0}; /* [plain, spec]: decode seconds, tokens */
                for (int i = 0; i < 2; i++)
                    for (int mode = 0; mode < 2; mode++) {
                        uint64_t salt = 50 + 20 * (uint64_t)v + 4 * (uint64_t)bi + 2 * (uint64_t)i;
                        if (run(mode ? es : e, B, 16, n_new, &a, salt + (uint64_t)mode)) return 1;
                        t[mode] += a.decode_tokens / a.decode_tok_s;
                        tok[mode] += (double)a.decode_tokens;
                    }
                printf("spec model=small-v3-mtp dtype=bf16 batch=%d threads=%d S=1 accept_len=2 "
                       "draft_head=%s plain_tok_s=%.2f spec_tok_s=%.2f x_plain=%.3f (alternating, "
                       "two each; SGLANG_SIMULATE_ACC_LEN=2)\n",
                       B, nt, v ? "map4096" : "full", tok[0] / t[0], tok[1] / t[1],
                       (tok[1] / t[1]) / (tok[0] / t[0]));
                fflush(stdout);
            }
            ms_engine_shutdown(es);
            ms_engine_step(es, &err);
            ms_engine_close(es);
        }
    }
    if (strstr(rows,
               "v4mtp")) { /* plain against EAGLE (S, accept length, draft head) on small-v4 */
        ms_engine_shutdown(e);
        ms_engine_step(e, &err);
        ms_engine_close(e);
        e = NULL;
        char v4[1200], cfg[1300], map[1300];
        struct stat st;
        snprintf(v4, sizeof v4, "%s/small-v4", model_dir);
        snprintf(cfg, sizeof cfg, "%s/config.json", v4);
        if (stat(cfg, &st)) {
            fprintf(stderr,
                    "bench_e2e: --rows v4mtp needs %s (moeserve mkmodel --preset small-v4 "
                    "--out %s)\n",
                    v4, v4);
            return 1;
        }
        snprintf(map, sizeof map, "build/v4mtp-token-map-4096.txt"); /* ids 0..4095 */
        FILE *f = fopen(map, "w");
        for (int i = 0; f && i < 4096; i++) fprintf(f, "%d\n", i);
        if (!f || fclose(f)) return 1;
        /* S, SGLANG_SIMULATE_ACC_LEN, token map: the full head at accept length 2, then
         * the 4096-id map over S 1..3 x accept length 1.5, 2, 3 (--quick: S 1, 2 at 2) */
        static const struct {
            int S;
            const char *acc;
            int map;
        } cf[] = {{1, "2", 0},   {2, "2", 0},   {1, "2", 1},   {2, "2", 1},
                  {1, "1.5", 1}, {2, "1.5", 1}, {3, "1.5", 1}, {2, "3", 1},
                  {3, "3", 1},   {3, "2", 1},   {1, "3", 1},   {3, "2", 0}};
        int n_cf = quick ? 4 : (int)(sizeof cf / sizeof cf[0]);
        ms_engine *ep = open_engine(v4, 0, 0, NULL);
        struct run a;
        if (!ep || run(ep, 1, 16, 8, &a, 60)) return 1; /* warm-up */
        int n_new = quick ? 16 : 48;
        for (int k = 0; k < n_cf; k++) {
            setenv("SGLANG_SIMULATE_ACC_LEN", cf[k].acc, 1);
            ms_engine *es = open_engine(v4, 0, cf[k].S, cf[k].map ? map : NULL);
            unsetenv("SGLANG_SIMULATE_ACC_LEN");
            if (!es || run(es, 1, 16, 8, &a, 61)) return 1; /* warm-up */
            const ms_engine_load *ld;
            ms_engine_loads(es, &ld);
            int64_t v0 = ld[0].st.spec_verify_total, a0 = ld[0].st.spec_accepted_total;
            /* [plain, spec]: decode seconds, tokens, steps, forward and draft seconds */
            double t[2] = {0}, tok[2] = {0}, ns[2] = {0}, fw[2] = {0}, dr[2] = {0};
            for (int i = 0; i < 2; i++)
                for (int mode = 0; mode < 2; mode++) {
                    if (run(mode ? es : ep, 1, 16, n_new, &a,
                            70 + 8 * (uint64_t)k + 2 * (uint64_t)i + (uint64_t)mode))
                        return 1;
                    t[mode] += a.decode_tokens / a.decode_tok_s;
                    tok[mode] += (double)a.decode_tokens;
                    ns[mode] += (double)a.decode_steps;
                    fw[mode] += a.dec_fwd_s;
                    dr[mode] += a.dec_draft_s;
                }
            ms_engine_loads(es, &ld);
            double vs = (double)(ld[0].st.spec_verify_total - v0);
            double acc = vs > 0 ? 1.0 + (double)(ld[0].st.spec_accepted_total - a0) / vs : 0;
            double r0 = tok[0] / t[0], rs = tok[1] / t[1];
            printf("v4mtp model=small-v4 dtype=bf16 batch=1 threads=%d S=%d simulate_acc_len=%s "
                   "accept_len=%.2f draft_head=%s plain_tok_s=%.2f spec_tok_s=%.2f x_plain=%.3f "
                   "plain_step_ms=%.2f spec_step_ms=%.2f verify_fwd_ms=%.2f draft_ms=%.2f "
                   "rest_ms=%.2f (EAGLE, the MTP block; alternating, two each)\n",
                   nt, cf[k].S, cf[k].acc, acc, cf[k].map ? "map4096" : "full", r0, rs, rs / r0,
                   1e3 * t[0] / ns[0], 1e3 * t[1] / ns[1], 1e3 * fw[1] / ns[1], 1e3 * dr[1] / ns[1],
                   1e3 * (t[1] - fw[1] - dr[1]) / ns[1]);
            fflush(stdout);
            ms_engine_shutdown(es);
            ms_engine_step(es, &err);
            ms_engine_close(es);
        }
        ms_engine_shutdown(ep);
        ms_engine_step(ep, &err);
        ms_engine_close(ep);
        if (!strstr(rows, "v4curve")) return 0;
    }
    if (strstr(rows, "v4curve")) { /* plain and EAGLE S 1 (4096-id map) on small-v4 by batch */
        if (e) {
            ms_engine_shutdown(e);
            ms_engine_step(e, &err);
            ms_engine_close(e);
        }
        char v4[1200], map[1300];
        snprintf(v4, sizeof v4, "%s/small-v4", model_dir);
        snprintf(map, sizeof map, "build/v4mtp-token-map-4096.txt"); /* ids 0..4095 */
        FILE *f = fopen(map, "w");
        for (int i = 0; f && i < 4096; i++) fprintf(f, "%d\n", i);
        if (!f || fclose(f)) return 1;
        ms_engine *ep = open_engine(v4, 0, 0, NULL);
        setenv("SGLANG_SIMULATE_ACC_LEN", "2", 1);
        ms_engine *es = ep ? open_engine(v4, 0, 1, map) : NULL;
        unsetenv("SGLANG_SIMULATE_ACC_LEN");
        struct run a;
        if (!es || run(ep, 1, 16, 8, &a, 90) || run(es, 1, 16, 8, &a, 91)) return 1; /* warm-up */
        static const int batches[] = {1, 4, 16, 32};
        for (int bi = 0; bi < 4; bi++) {
            int B = batches[bi], n_new = quick ? 16 : 32;
            double t[2] = {0}, tok[2] = {0}; /* [plain, spec]: decode seconds, tokens */
            for (int i = 0; i < 2; i++)
                for (int mode = 0; mode < 2; mode++) {
                    if (run(mode ? es : ep, B, 16, n_new, &a,
                            100 + 4 * (uint64_t)bi + 2 * (uint64_t)i + (uint64_t)mode))
                        return 1;
                    t[mode] += a.decode_tokens / a.decode_tok_s;
                    tok[mode] += (double)a.decode_tokens;
                }
            printf("v4curve model=small-v4 dtype=bf16 batch=%d threads=%d S=1 accept_len=2 "
                   "draft_head=map4096 plain_tok_s=%.2f spec_tok_s=%.2f x_plain=%.3f (alternating, "
                   "two each; SGLANG_SIMULATE_ACC_LEN=2)\n",
                   B, nt, tok[0] / t[0], tok[1] / t[1], (tok[1] / t[1]) / (tok[0] / t[0]));
            fflush(stdout);
        }
        ms_engine *ee[2] = {ep, es};
        for (int k = 0; k < 2; k++) {
            ms_engine_shutdown(ee[k]);
            ms_engine_step(ee[k], &err);
            ms_engine_close(ee[k]);
        }
        return 0;
    }
    ms_engine_shutdown(e);
    ms_engine_step(e, &err);
    ms_engine_close(e);
    return 0;
}
