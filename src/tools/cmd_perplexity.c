/* cmd_perplexity.c — `moeserve perplexity`: how well a model predicts a text,
 * through the engine (engine.h) on any launch shape, dtype and KV cache
 * format, with llama.cpp's llama-perplexity semantics:
 *
 *   the file is tokenized whole (no BOS); window k holds the ctx tokens from
 *   k * stride (stride defaults to ctx), its first token replaced by BOS; the
 *   tokens at window positions ctx/2 .. ctx-1 are scored, each predicted from
 *   all window tokens before it (llama-perplexity scores ctx/2+1 .. ctx-1; one
 *   more here, so that --stride ctx/2 tiles the text exactly).
 *
 * Reported: perplexity per token, exp(mean NLL); bits per UTF-8 byte, the
 * summed -log2 p of the scored tokens over the bytes they decode to (written
 * out by --scored-text, so a compressor can be run on exactly those bytes).
 * --save-logits writes the log-probabilities of every scored position (the
 * format below); --kl-base reads such a file from a base run of the same text
 * and windows and adds llama-perplexity's --kl-divergence report: KL(base ||
 * this) per token (mean, p99), top-1 agreement, Δppl.
 *
 * Each scored position is one request (prompt = the window up to it, one
 * greedy token, logits kept); a window's requests run one after the other, so
 * the radix cache (page size 1 by default) holds the prefix and each computes
 * one token; --parallel windows run side by side.
 *
 * Saved-logits file, little-endian:
 *   header, 64 bytes: "MSLOGIT1", int32 vocab, ctx, stride, n_windows,
 *     int64 n_scored, uint64 FNV-1a of the scored (position, token id) pairs,
 *     int64 scored bytes, then zeros;
 *   per scored token, in window order: int32 argmax id, float32 NLL (nats),
 *     float32 hi = the largest log-prob, float32 lo = max(smallest, hi - 32),
 *     then vocab × uint16 q, log-prob ≈ lo + q (hi - lo) / 65535 (clamped at lo).
 * The default run with --save-logits stops after the windows that keep the
 * file under 256 MB (--chunks N chooses the number of windows).
 * Main thread of every rank; output on rank 0.
 */
#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "model/tokenizer.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "serve/engine.h"
#include "serve/flag_kinds.h"
#include "tools/commands.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOGITS_MAGIC     "MSLOGIT1"
#define LOGITS_HDR_BYTES 64
#define LOGITS_MAX_BYTES (256ll << 20) /* the default cap of --save-logits */
#define LOG_RANGE        32.0          /* nats kept below the top log-prob */
#define MAX_FILE_BYTES   (256u << 20)
#define MAX_PARALLEL     256

struct opts {
    const char *model, *file, *save, *base, *scored_text;
    long ctx, stride, chunks, parallel;
    double comm_timeout_s;
    ms_engine_opts eo;
    ms_flag_screen screen; /* GPU-only flags to warn about (argv borrowed) */
};

struct hdr {
    int32_t vocab, ctx, stride, n_windows;
    int64_t n_scored;
    uint64_t hash;
    int64_t n_bytes;
};

struct slot {
    int64_t window;  /* -1: idle */
    int64_t pos;     /* position whose logits the running request gives */
    uint64_t req_id; /* of that request: a counter times the slots, plus the slot */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve perplexity --model DIR --file F [--ctx N] [--stride N] [--chunks N]\n"
            "                           [--kl-base FILE | --save-logits FILE] [flags]\n"
            "  --ctx N          window in tokens (default 512)\n"
            "  --stride N       distance between window starts (default ctx)\n"
            "  --chunks N       windows to score (default all; with --save-logits: as many\n"
            "                   as keep the file under 256 MB)\n"
            "  --save-logits F  write every scored position's log-probs (16-bit) for --kl-base\n"
            "  --kl-base F      KL divergence, top-1 agreement and Δppl against a saved run\n"
            "  --scored-text F  write the UTF-8 bytes of the scored tokens (for compressors)\n"
            "  --parallel N     windows computed side by side (default 16)\n"
            "  --threads N  --dtype auto|float32|bfloat16  --comm-timeout-s S\n"
            "  --enable-deterministic-inference  as `serve`: each position's log-probs do not\n"
            "                   depend on the other windows run beside it (any --parallel)\n"
            "launch flags (SGLang names; --page-size defaults to 1 here):\n%s",
            ms_launch_help());
    ms_flag_kinds_print_help(f);
}

static int parse_kept(void *ctx, int argc, char **argv)
{
    struct opts *o = ctx;
    ms_engine_opts_init(&o->eo);
    o->ctx = 512;
    o->parallel = 16;
    o->comm_timeout_s = 60;
    ms_errbuf err = {{0}};
    if (ms_launch_apply_env(&o->eo.launch, &err)) {
        fprintf(stderr, "perplexity: %s\n", err.msg);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int lr = ms_launch_parse_arg(&o->eo.launch, argc, argv, &i, &err);
        if (lr < 0) {
            fprintf(stderr, "perplexity: %s\n", err.msg);
            return -1;
        }
        if (lr > 0) {
            i--; /* the parser advanced past the flag; the loop's i++ does it again */
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--enable-deterministic-inference")) {
            o->eo.deterministic = 1;
            continue;
        }
        if (i + 1 >= argc || strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "perplexity: %s %s\n", a,
                    strncmp(a, "--", 2) ? "is not a flag" : "needs a value (or is unknown)");
            return -1;
        }
        const char *v = argv[++i];
        long x;
        double d;
        int bad = 0;
        if (!strcmp(a, "--model") || !strcmp(a, "--model-path"))
            o->model = v;
        else if (!strcmp(a, "--file"))
            o->file = v;
        else if (!strcmp(a, "--save-logits"))
            o->save = v;
        else if (!strcmp(a, "--kl-base"))
            o->base = v;
        else if (!strcmp(a, "--scored-text"))
            o->scored_text = v;
        else if (!strcmp(a, "--ctx"))
            bad = ms_parse_long(a, v, 4, 1 << 20, &o->ctx, &err);
        else if (!strcmp(a, "--stride"))
            bad = ms_parse_long(a, v, 1, 1 << 20, &o->stride, &err);
        else if (!strcmp(a, "--chunks"))
            bad = ms_parse_long(a, v, 1, 1L << 40, &o->chunks, &err);
        else if (!strcmp(a, "--parallel"))
            bad = ms_parse_long(a, v, 1, MAX_PARALLEL, &o->parallel, &err);
        else if (!strcmp(a, "--threads")) {
            bad = ms_parse_long(a, v, 0, 4096, &x, &err);
            o->eo.threads = (int)x;
        } else if (!strcmp(a, "--comm-timeout-s")) {
            bad = ms_parse_double(a, v, 0.1, 1e6, &d, &err);
            o->comm_timeout_s = d;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "float32"))
                o->eo.exact = 1;
            else if (!strcmp(v, "auto") || !strcmp(v, "bfloat16"))
                o->eo.exact = 0;
            else {
                fprintf(stderr, "perplexity: --dtype must be auto, float32 or bfloat16, got '%s'\n",
                        v);
                return -1;
            }
        } else {
            fprintf(stderr, "perplexity: unknown flag %s\n", a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "perplexity: %s\n", err.msg);
            return -1;
        }
    }
    if (!o->model || !o->file) {
        fprintf(stderr, "perplexity: --model DIR and --file F are required\n");
        return -1;
    }
    if (o->save && o->base) {
        fprintf(stderr, "perplexity: --kl-base and --save-logits exclude each other\n");
        return -1;
    }
    if (o->ctx % 2) {
        fprintf(stderr, "perplexity: --ctx must be even, got %ld\n", o->ctx);
        return -1;
    }
    if (!o->stride) o->stride = o->ctx;
    o->eo.model_path = o->model;
    if (ms_flag_screen_check(&o->screen, &o->eo.launch, o->eo.exact, o->model, "perplexity",
                             stderr))
        return -1;
    o->eo.page_size = o->eo.launch.page_size_set ? o->eo.launch.page_size : 1;
    o->eo.keep_logits = 1;
    return 0;
}

static int parse_opts(struct opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    return ms_flag_screen_then(&o->screen, argc, argv, parse_kept, o);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static void put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void hdr_write(uint8_t out[LOGITS_HDR_BYTES], const struct hdr *h)
{
    memset(out, 0, LOGITS_HDR_BYTES);
    memcpy(out, LOGITS_MAGIC, 8);
    put32(out + 8, (uint32_t)h->vocab);
    put32(out + 12, (uint32_t)h->ctx);
    put32(out + 16, (uint32_t)h->stride);
    put32(out + 20, (uint32_t)h->n_windows);
    put64(out + 24, (uint64_t)h->n_scored);
    put64(out + 32, h->hash);
    put64(out + 40, (uint64_t)h->n_bytes);
}

static int hdr_read(const uint8_t in[LOGITS_HDR_BYTES], struct hdr *h)
{
    if (memcmp(in, LOGITS_MAGIC, 8)) return -1;
    h->vocab = (int32_t)get32(in + 8);
    h->ctx = (int32_t)get32(in + 12);
    h->stride = (int32_t)get32(in + 16);
    h->n_windows = (int32_t)get32(in + 20);
    h->n_scored = (int64_t)get64(in + 24);
    h->hash = get64(in + 32);
    h->n_bytes = (int64_t)get64(in + 40);
    return 0;
}

/* The text's tokens, scored byte counts and the identity hash of the run. */
struct text {
    int32_t *ids;
    size_t n_ids;
    int32_t bos;
    ms_tokenizer *tok;
};

static int text_load(const struct opts *o, struct text *t)
{
    char path[1200], *buf = NULL;
    size_t len;
    ms_errbuf err = {{0}};
    if (!ms_path_join(path, sizeof path, o->model, "tokenizer.json") ||
        ms_tokenizer_load(&t->tok, path, &err)) {
        fprintf(stderr, "perplexity: %s: %s\n", path, err.msg[0] ? err.msg : "cannot load");
        return -1;
    }
    t->bos = ms_tokenizer_token_id(t->tok, "<\xef\xbd\x9c"
                                           "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    if (ms_read_file(o->file, MAX_FILE_BYTES, &buf, &len)) {
        fprintf(stderr, "perplexity: --file %s: cannot read (at most %u MB)\n", o->file,
                MAX_FILE_BYTES >> 20);
        return -1;
    }
    t->ids = malloc(sizeof *t->ids * (len + 1));
    int rc = t->ids ? ms_tokenizer_encode(t->tok, buf, len, 0, t->ids, len + 1, &t->n_ids, &err)
                    : MS_ENOMEM;
    free(buf);
    if (rc) {
        fprintf(stderr, "perplexity: --file %s: %s\n", o->file,
                rc == MS_ENOMEM ? "out of memory" : err.msg);
        return -1;
    }
    return 0;
}

static void text_free(struct text *t)
{
    free(t->ids);
    ms_tokenizer_free(t->tok);
}

/* Log-softmax of logits into lp (double); returns the argmax. */
static int32_t log_softmax(const float *logits, int64_t V, double *lp)
{
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = (int32_t)i;
    double mx = logits[best], s = 0;
    for (int64_t i = 0; i < V; i++) s += exp((double)logits[i] - mx);
    double lse = mx + log(s);
    for (int64_t i = 0; i < V; i++) lp[i] = (double)logits[i] - lse;
    return best;
}

/* Writes one position's record (rec: 16 + 2V bytes). */
static void record_encode(uint8_t *rec, const double *lp, int64_t V, int32_t top1, double nll)
{
    double hi = lp[top1], lo = hi;
    for (int64_t i = 0; i < V; i++)
        if (lp[i] < lo) lo = lp[i];
    if (lo < hi - LOG_RANGE) lo = hi - LOG_RANGE;
    float fhi = (float)hi, flo = (float)lo, fnll = (float)nll;
    put32(rec, (uint32_t)top1);
    memcpy(rec + 4, &fnll, 4);
    memcpy(rec + 8, &fhi, 4);
    memcpy(rec + 12, &flo, 4);
    double span = (double)fhi - (double)flo;
    for (int64_t i = 0; i < V; i++) {
        double q = span > 0 ? (lp[i] - (double)flo) / span * 65535.0 : 65535.0;
        q = q < 0 ? 0 : q > 65535 ? 65535 : q;
        uint16_t u = (uint16_t)lrint(q);
        memcpy(rec + 16 + 2 * i, &u, 2);
    }
}

/* KL(base || this) from a base record and this position's log-probs; the base
 * log-probs are renormalised after dequantisation. */
static double record_kl(const uint8_t *rec, const double *lp, int64_t V, double *scratch,
                        int32_t *base_top1, double *base_nll)
{
    float fnll, fhi, flo;
    *base_top1 = (int32_t)get32(rec);
    memcpy(&fnll, rec + 4, 4);
    memcpy(&fhi, rec + 8, 4);
    memcpy(&flo, rec + 12, 4);
    *base_nll = fnll;
    double span = (double)fhi - (double)flo, s = 0;
    for (int64_t i = 0; i < V; i++) {
        uint16_t u;
        memcpy(&u, rec + 16 + 2 * i, 2);
        scratch[i] = (double)flo + span * u / 65535.0;
        s += exp(scratch[i]);
    }
    double lse = log(s), kl = 0;
    for (int64_t i = 0; i < V; i++) {
        double b = scratch[i] - lse;
        kl += exp(b) * (b - lp[i]);
    }
    return kl < 0 ? 0 : kl;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The request for window w at position pos (its prompt: window tokens 0..pos). */
static int submit(ms_engine *e, const struct opts *o, const struct text *t, int32_t *prompt,
                  int64_t w, int64_t pos, uint64_t id, ms_errbuf *err)
{
    size_t start = (size_t)(w * o->stride);
    prompt[0] = t->bos >= 0 ? t->bos : t->ids[start];
    for (int64_t j = 1; j <= pos; j++) prompt[j] = t->ids[start + (size_t)j];
    ms_req_params in = {.id = id,
                        .ids = prompt,
                        .n_ids = pos + 1,
                        .max_new = 1,
                        .samp = {.top_p = 1.0f},
                        .ignore_eos = 1,
                        .top_logprobs = -1,
                        .dp_rank = -1};
    return ms_engine_submit(e, &in, err);
}

struct run {
    const struct opts *o;
    struct text *t;
    int64_t V, n_windows, per_window;
    FILE *save, *base, *text_out;
    uint8_t *rec;
    double *lp, *scratch;
    double *nll, *base_nll, *kl; /* [n_windows * per_window], in text order */
    int64_t n_top1_agree;
};

/* Scores window w's k-th scored position (window position ctx/2 - 1 + k, its
 * logits predicting the token after it).  Positions finish in any order: the
 * figures go to their index, the records to their offset in the files. */
static int score(struct run *r, int64_t w, int64_t k, const float *logits, ms_errbuf *err)
{
    int64_t idx = w * r->per_window + k;
    size_t at = (size_t)(w * r->o->stride + r->o->ctx / 2 + k);
    int32_t target = r->t->ids[at];
    int32_t top1 = log_softmax(logits, r->V, r->lp);
    r->nll[idx] = -r->lp[target];
    size_t rec_bytes = 16 + 2 * (size_t)r->V;
    long long off = LOGITS_HDR_BYTES + (long long)idx * (long long)rec_bytes;
    if (r->save) {
        record_encode(r->rec, r->lp, r->V, top1, r->nll[idx]);
        if (fseeko(r->save, off, SEEK_SET) || fwrite(r->rec, 1, rec_bytes, r->save) != rec_bytes)
            return ms_err(err, MS_EIO, "--save-logits: write failed");
    }
    if (r->base) {
        if (fseeko(r->base, off, SEEK_SET) || fread(r->rec, 1, rec_bytes, r->base) != rec_bytes)
            return ms_err(err, MS_EINVAL, "--kl-base: the file ends early");
        int32_t bt;
        r->kl[idx] = record_kl(r->rec, r->lp, r->V, r->scratch, &bt, &r->base_nll[idx]);
        r->n_top1_agree += bt == top1;
    }
    return 0;
}

static uint64_t next_id(struct slot *slots, int s, int n_slots, uint64_t *n_req)
{
    slots[s].req_id = (*n_req)++ * (uint64_t)n_slots + (uint64_t)s;
    return slots[s].req_id;
}

/* Runs every window through the engine, --parallel windows at a time; a
 * slot whose window is done takes the next one. */
static int run_all(ms_engine *e, struct run *r, ms_errbuf *err)
{
    const struct opts *o = r->o;
    int64_t half = o->ctx / 2;
    int n_slots = (int)MS_MIN((int64_t)o->parallel, r->n_windows);
    struct slot *slots = calloc((size_t)n_slots, sizeof *slots);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)o->ctx);
    uint64_t n_req = 0;
    int64_t next_window = 0, done_windows = 0;
    if (!slots || !prompt) {
        free(slots);
        free(prompt);
        return ms_err(err, MS_ENOMEM, "out of memory");
    }
    int rc = 0;
    for (int s = 0; s < n_slots && !rc; s++) {
        slots[s].window = next_window++;
        slots[s].pos = half - 1;
        rc = submit(e, o, r->t, prompt, slots[s].window, slots[s].pos,
                    next_id(slots, s, n_slots, &n_req), err);
    }
    while (!rc && done_windows < r->n_windows) {
        if (!ms_engine_busy(e)) {
            rc = ms_err(err, MS_EINVAL, "engine idle with %lld windows left",
                        (long long)(r->n_windows - done_windows));
            break;
        }
        if ((rc = ms_engine_step(e, err))) break;
        const ms_engine_event *ev;
        int n_ev = ms_engine_events(e, &ev);
        for (int i = 0; i < n_ev && !rc; i++) {
            const ms_sched_event *x = &ev[i].ev;
            int s = (int)(x->id % (uint64_t)n_slots);
            if (slots[s].window < 0 || x->id != slots[s].req_id) continue;
            if (x->finish == MS_FINISH_ERROR || x->finish == MS_FINISH_ABORT) {
                rc = ms_err(err, MS_EINVAL, "window %lld: the engine ended a request (%d)",
                            (long long)slots[s].window, x->finish);
                break;
            }
            if (x->token < 0 || !ev[i].logits) continue;
            int64_t k = slots[s].pos - (half - 1);
            if ((rc = score(r, slots[s].window, k, ev[i].logits, err))) break;
            if (k + 1 < r->per_window) {
                slots[s].pos++;
            } else {
                done_windows++;
                if (next_window >= r->n_windows) {
                    slots[s].window = -1;
                    continue;
                }
                slots[s].window = next_window++;
                slots[s].pos = half - 1;
            }
            rc = submit(e, o, r->t, prompt, slots[s].window, slots[s].pos,
                        next_id(slots, s, n_slots, &n_req), err);
        }
    }
    free(slots);
    free(prompt);
    return rc;
}

static int open_outputs(struct run *r, struct hdr *bh)
{
    const struct opts *o = r->o;
    if (o->scored_text && !(r->text_out = fopen(o->scored_text, "wb"))) {
        fprintf(stderr, "perplexity: --scored-text %s: cannot open\n", o->scored_text);
        return -1;
    }
    if (o->save) {
        if (!(r->save = fopen(o->save, "wb"))) {
            fprintf(stderr, "perplexity: --save-logits %s: cannot open\n", o->save);
            return -1;
        }
        uint8_t h[LOGITS_HDR_BYTES] = {0}; /* rewritten at the end */
        if (fwrite(h, 1, sizeof h, r->save) != sizeof h) return -1;
    }
    if (o->base) {
        uint8_t h[LOGITS_HDR_BYTES];
        if (!(r->base = fopen(o->base, "rb")) || fread(h, 1, sizeof h, r->base) != sizeof h ||
            hdr_read(h, bh)) {
            fprintf(stderr, "perplexity: --kl-base %s: not a saved-logits file\n", o->base);
            return -1;
        }
        if (bh->vocab != r->V || bh->ctx != o->ctx || bh->stride != o->stride) {
            fprintf(stderr,
                    "perplexity: --kl-base %s: saved with vocab %d, --ctx %d, --stride %d; this "
                    "run has %lld, %ld, %ld\n",
                    o->base, bh->vocab, bh->ctx, bh->stride, (long long)r->V, o->ctx, o->stride);
            return -1;
        }
    }
    return 0;
}

/* rank 0: the whole run once the engine is open. */
static int perplexity_rank0(ms_engine *e, const struct opts *o, struct text *t, int64_t V)
{
    struct run r = {.o = o, .t = t, .V = V};
    struct hdr bh = {0};
    ms_errbuf err = {{0}};
    int rc = 1;
    int64_t half = o->ctx / 2, per_window = o->ctx - half;
    size_t rec_bytes = 16 + 2 * (size_t)V;
    r.n_windows = t->n_ids >= (size_t)o->ctx
                      ? (int64_t)((t->n_ids - (size_t)o->ctx) / (size_t)o->stride) + 1
                      : 0;
    if (r.n_windows == 0) {
        fprintf(stderr, "perplexity: --file %s has %zu tokens; --ctx %ld needs at least %ld\n",
                o->file, t->n_ids, o->ctx, o->ctx);
        goto out;
    }
    if (open_outputs(&r, &bh)) goto out;
    if (o->chunks && o->chunks < r.n_windows) r.n_windows = o->chunks;
    if (o->save && !o->chunks) {
        int64_t cap = (LOGITS_MAX_BYTES - LOGITS_HDR_BYTES) / ((int64_t)rec_bytes * per_window);
        if (cap < 1) cap = 1;
        if (cap < r.n_windows) {
            fprintf(stderr,
                    "perplexity: --save-logits: %lld windows keep the file under 256 MB "
                    "(of %lld; --chunks N chooses)\n",
                    (long long)cap, (long long)r.n_windows);
            r.n_windows = cap;
        }
    }
    if (o->base) {
        if (bh.n_windows < r.n_windows) r.n_windows = bh.n_windows;
        if (bh.n_windows != r.n_windows) {
            fprintf(stderr, "perplexity: --kl-base %s has %d windows, this text %lld\n", o->base,
                    bh.n_windows, (long long)r.n_windows);
            goto out;
        }
    }
    size_t n_pos = (size_t)(r.n_windows * per_window);
    r.per_window = per_window;
    r.lp = malloc(sizeof(double) * (size_t)V);
    r.scratch = malloc(sizeof(double) * (size_t)V);
    r.rec = malloc(rec_bytes);
    r.nll = calloc(n_pos, sizeof *r.nll);
    r.base_nll = calloc(n_pos, sizeof *r.base_nll);
    r.kl = calloc(n_pos, sizeof *r.kl);
    if (!r.lp || !r.scratch || !r.rec || !r.nll || !r.base_nll || !r.kl) {
        fprintf(stderr, "perplexity: out of memory\n");
        goto out;
    }
    double t0 = ms_now_s();
    if (run_all(e, &r, &err)) {
        fprintf(stderr, "perplexity: %s\n", err.msg);
        goto out;
    }
    double secs = ms_now_s() - t0;
    /* in text order: the sums, the identity hash, the scored bytes */
    uint64_t hash = 0xcbf29ce484222325ull;
    double nll_sum = 0, base_nll_sum = 0;
    int64_t n_bytes = 0, n_scored = (int64_t)n_pos;
    for (int64_t w = 0; w < r.n_windows; w++)
        for (int64_t k = 0; k < per_window; k++) {
            int64_t idx = w * per_window + k, at = w * o->stride + half + k;
            int64_t key[2] = {at, t->ids[at]};
            hash = fnv1a(hash, key, sizeof key);
            nll_sum += r.nll[idx];
            base_nll_sum += r.base_nll[idx];
            char bytes[256];
            size_t nb = 0;
            if (ms_tokenizer_token_bytes(t->tok, t->ids[at], bytes, sizeof bytes, &nb)) nb = 0;
            n_bytes += (int64_t)nb;
            if (r.text_out && nb && fwrite(bytes, 1, nb, r.text_out) != nb) {
                fprintf(stderr, "perplexity: --scored-text %s: write failed\n", o->scored_text);
                goto out;
            }
        }
    if (o->base && hash != bh.hash) {
        fprintf(stderr, "perplexity: --kl-base %s was saved on other text (token hash differs)\n",
                o->base);
        goto out;
    }
    double ppl = exp(nll_sum / (double)n_scored);
    double bpb = nll_sum / log(2.0) / (double)(n_bytes ? n_bytes : 1);
    printf("perplexity: %lld windows of %ld tokens (stride %ld), %lld tokens scored (%lld bytes) "
           "in %.1f s\n",
           (long long)r.n_windows, o->ctx, o->stride, (long long)n_scored, (long long)n_bytes,
           secs);
    printf("ppl %.4f  nll %.4f nats/token  %.4f bits/byte\n", ppl, nll_sum / (double)n_scored, bpb);
    char kl_part[256] = "";
    if (o->base) {
        double s = 0;
        for (int64_t i = 0; i < n_scored; i++) s += r.kl[i];
        qsort(r.kl, n_pos, sizeof *r.kl, cmp_double);
        int64_t i99 = (int64_t)ceil(0.99 * (double)n_scored) - 1;
        double mean = s / (double)n_scored, p99 = r.kl[i99 < 0 ? 0 : i99];
        double base_ppl = exp(base_nll_sum / (double)n_scored);
        double agree = (double)r.n_top1_agree / (double)n_scored;
        printf("KL divergence vs %s: mean %.6f  p99 %.6f  top-1 agreement %.2f %%  "
               "ppl %.4f vs base %.4f (Δppl %+.4f)\n",
               o->base, mean, p99, 100 * agree, ppl, base_ppl, ppl - base_ppl);
        snprintf(kl_part, sizeof kl_part,
                 " kl_mean=%.6f kl_p99=%.6f top1=%.4f base_ppl=%.4f dppl=%.4f", mean, p99, agree,
                 base_ppl, ppl - base_ppl);
    }
    printf("result: ppl=%.4f bpb=%.4f tokens=%lld bytes=%lld windows=%lld%s\n", ppl, bpb,
           (long long)n_scored, (long long)n_bytes, (long long)r.n_windows, kl_part);
    if (r.save) {
        uint8_t h[LOGITS_HDR_BYTES];
        struct hdr sh = {
            (int32_t)V, (int32_t)o->ctx, (int32_t)o->stride, (int32_t)r.n_windows, n_scored,
            hash,       n_bytes};
        hdr_write(h, &sh);
        if (fseek(r.save, 0, SEEK_SET) || fwrite(h, 1, sizeof h, r.save) != sizeof h) {
            fprintf(stderr, "perplexity: --save-logits %s: write failed\n", o->save);
            goto out;
        }
    }
    rc = 0;
out:
    if (r.save && fclose(r.save) && !rc) {
        fprintf(stderr, "perplexity: --save-logits %s: write failed\n", o->save);
        rc = 1;
    }
    if (r.text_out && fclose(r.text_out) && !rc) {
        fprintf(stderr, "perplexity: --scored-text %s: write failed\n", o->scored_text);
        rc = 1;
    }
    if (r.base) fclose(r.base);
    free(r.lp);
    free(r.scratch);
    free(r.rec);
    free(r.nll);
    free(r.base_nll);
    free(r.kl);
    return rc;
}

int ms_cmd_perplexity(int argc, char **argv)
{
    struct opts o;
    int prc = parse_opts(&o, argc, argv);
    if (prc) {
        if (prc < 0) fprintf(stderr, "(moeserve perplexity --help lists the flags)\n");
        return prc > 0 ? 0 : 2;
    }
    ms_errbuf err = {{0}};
    ms_model_shape cfg;
    ms_layout lay;
    int W, rank, rc;
    /* main.c passes argv + 1: argv - 1 is the program's own argument vector */
    if ((rc = ms_engine_start("perplexity", &o.eo, o.comm_timeout_s, argc + 1, argv - 1, &cfg, &lay,
                              &W, &rank)))
        return rc;
    rc = 1;
    struct text t = {0};
    ms_engine *e = NULL;
    int ok = 1;
    if (rank == 0) {
        ms_flag_screen_warn(&o.screen, "perplexity");
        ok = text_load(&o, &t) == 0;
    }
    if (o.ctx > cfg.max_context) {
        if (rank == 0)
            fprintf(stderr, "perplexity: --ctx %ld exceeds the model's context (%lld)\n", o.ctx,
                    (long long)cfg.max_context);
        ok = 0;
    }
    if (W > 1) {
        int64_t msg = ok;
        if (ms_comm_bcast(ms_comm_world(), &msg, sizeof msg, 0, &err)) goto comm_fail;
        ok = (int)msg;
    }
    if (!ok) goto out;
    if (o.eo.max_total_tokens <= 0) o.eo.max_total_tokens = (int64_t)(o.parallel + 2) * o.ctx * 2;
    if (ms_engine_open(&e, &o.eo, &err)) {
        fprintf(stderr, "perplexity: rank %d: %s\n", rank, err.msg);
        if (W > 1) ms_comm_abort(1);
        goto out;
    }
    if (rank != 0) {
        if (ms_engine_follow(e, &err)) goto comm_fail;
        rc = 0;
        goto out;
    }
    rc = perplexity_rank0(e, &o, &t, cfg.vocab);
    if (ms_engine_finish(e, &err)) goto comm_fail;
    goto out;
comm_fail:
    fprintf(stderr, "perplexity: rank %d: %s\n", rank, err.msg);
    if (W > 1) ms_comm_abort(1);
out:
    text_free(&t);
    ms_engine_close(e);
    if (W > 1 && ms_comm_deinit(&err)) {
        fprintf(stderr, "perplexity: rank %d: %s\n", rank, err.msg);
        rc = 1;
    }
    return rc;
}
