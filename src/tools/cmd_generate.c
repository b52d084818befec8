/* cmd_generate.c — `moeserve generate`: load a model, run prompts through
 * prefill and decode on this rank, print the text, ids, timing and
 * optionally every step's logits (--dump-logits, JSON lines).
 * All prompts run as one batch: prefill in chunks of --chunked-prefill-size
 * tokens, then one decode step for all unfinished sequences at a time.
 */
#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "cache/kv_pool.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "tools/commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROMPTS 4096
#define MAX_PROMPT_TOKENS (1 << 20)

struct opts {
    const char *model, *dump, *prompt_file;
    const char *prompts[MAX_PROMPTS];
    const char *prompt_ids[MAX_PROMPTS];
    int n_prompts, n_prompt_ids;
    long max_new;
    ms_sampling samp;
    unsigned long long seed;
    int threads, exact, print_ids, ignore_eos, page_size;
    long chunk;
};

struct seq {
    int32_t *ids;     /* prompt then generated */
    int64_t n_prompt, n_ids, cap;
    int64_t n_prefilled;
    int32_t *pages;
    int64_t n_pages;
    uint64_t rng;
    int done;
    int64_t step;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3 | "
            "--prompt-file F)... [flags]\n"
            "  --max-new-tokens N   (default 32)      --temperature T (0 = greedy, default 0)\n"
            "  --top-p P  --top-k K  --min-p P  --seed N  --threads N\n"
            "  --dtype auto|float32|bfloat16          --dump-logits FILE (JSON lines)\n"
            "  --ids (print token ids)  --ignore-eos  --page-size N (default 16)\n"
            "  --chunked-prefill-size N (default 2048)\n");
}

static int parse_long(const char *flag, const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "generate: %s must be an integer in [%ld, %ld], got '%s'\n", flag, lo, hi,
                v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_float(const char *flag, const char *v, double lo, double hi, float *out)
{
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "generate: %s must be a number in [%g, %g], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = (float)x;
    return 0;
}

static int parse_opts(struct opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->max_new = 32;
    o->samp.top_p = 1.0f;
    o->page_size = 16;
    o->chunk = 2048;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--ids")) { o->print_ids = 1; continue; }
        if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = 1; continue; }
        if (i + 1 >= argc || strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "generate: %s %s\n", a,
                    strncmp(a, "--", 2) ? "is not a flag" : "needs a value (or is unknown)");
            return -1;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--prompt")) {
            if (o->n_prompts >= MAX_PROMPTS) { fprintf(stderr, "generate: too many --prompt\n"); return -1; }
            o->prompts[o->n_prompts++] = v;
        } else if (!strcmp(a, "--prompt-ids")) {
            if (o->n_prompt_ids >= MAX_PROMPTS) { fprintf(stderr, "generate: too many --prompt-ids\n"); return -1; }
            o->prompt_ids[o->n_prompt_ids++] = v;
        } else if (!strcmp(a, "--prompt-file")) o->prompt_file = v;
        else if (!strcmp(a, "--dump-logits")) o->dump = v;
        else if (!strcmp(a, "--max-new-tokens")) {
            if (parse_long(a, v, 0, 1 << 20, &o->max_new)) return -1;
        } else if (!strcmp(a, "--temperature")) {
            if (parse_float(a, v, 0, 100, &o->samp.temperature)) return -1;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_float(a, v, 1e-6, 1, &o->samp.top_p)) return -1;
        } else if (!strcmp(a, "--min-p")) {
            if (parse_float(a, v, 0, 1, &o->samp.min_p)) return -1;
        } else if (!strcmp(a, "--top-k")) {
            if (parse_long(a, v, -1, 1 << 30, &x)) return -1;
            o->samp.top_k = (int)x;
        } else if (!strcmp(a, "--seed")) {
            if (parse_long(a, v, 0, 0x7fffffffL, &x)) return -1;
            o->seed = (unsigned long long)x;
        } else if (!strcmp(a, "--threads")) {
            if (parse_long(a, v, 0, 4096, &x)) return -1;
            o->threads = (int)x;
        } else if (!strcmp(a, "--page-size")) {
            if (parse_long(a, v, 1, 4096, &x)) return -1;
            o->page_size = (int)x;
        } else if (!strcmp(a, "--chunked-prefill-size")) {
            if (parse_long(a, v, 1, 1 << 20, &o->chunk)) return -1;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "float32")) o->exact = 1;
            else if (!strcmp(v, "auto") || !strcmp(v, "bfloat16")) o->exact = 0;
            else {
                fprintf(stderr, "generate: --dtype must be auto, float32 or bfloat16, got '%s'\n", v);
                return -1;
            }
        } else {
            fprintf(stderr, "generate: unknown flag %s\n", a);
            return -1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "generate: --model DIR is required\n");
        return -1;
    }
    if (o->n_prompts + o->n_prompt_ids == 0 && !o->prompt_file) {
        fprintf(stderr, "generate: give --prompt, --prompt-ids or --prompt-file\n");
        return -1;
    }
    return 0;
}

static int seq_push(struct seq *s, int32_t id)
{
    if (s->n_ids == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        int32_t *p = realloc(s->ids, sizeof(int32_t) * (size_t)cap);
        if (!p) return MS_ENOMEM;
        s->ids = p;
        s->cap = cap;
    }
    s->ids[s->n_ids++] = id;
    return 0;
}

static int parse_ids(const char *text, struct seq *s, int64_t vocab)
{
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= vocab) {
            fprintf(stderr, "generate: --prompt-ids: bad token id near '%.20s' (vocab %lld)\n", p,
                    (long long)vocab);
            return -1;
        }
        if (seq_push(s, (int32_t)v)) return -1;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    if (s->n_ids == 0) {
        fprintf(stderr, "generate: --prompt-ids: empty\n");
        return -1;
    }
    return 0;
}

static int encode_text(const ms_tokenizer *tok, const ms_config *c, const char *text,
                       struct seq *s)
{
    if (!tok) {
        fprintf(stderr, "generate: --prompt needs tokenizer.json in the model directory "
                        "(use --prompt-ids)\n");
        return -1;
    }
    if (c->bos_token_id >= 0 && seq_push(s, (int32_t)c->bos_token_id)) return -1;
    size_t len = strlen(text), n = 0;
    size_t cap = len + 16;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    ms_errbuf err = {{0}};
    if (!ids) return -1;
    int rc = ms_tokenizer_encode(tok, text, len, 1, ids, cap, &n, &err);
    if (rc) {
        fprintf(stderr, "generate: --prompt: %s\n", err.msg);
        free(ids);
        return -1;
    }
    for (size_t i = 0; i < n && i < cap; i++)
        if (seq_push(s, ids[i])) { free(ids); return -1; }
    free(ids);
    return 0;
}

static void dump_line(FILE *f, int seq, int64_t step, int32_t tok, const float *logits, int64_t V)
{
    fprintf(f, "{\"seq\": %d, \"step\": %lld, \"token\": %d, \"logits\": [", seq, (long long)step,
            tok);
    for (int64_t i = 0; i < V; i++) fprintf(f, i ? ",%.9g" : "%.9g", (double)logits[i]);
    fprintf(f, "]}\n");
}

int ms_cmd_generate(int argc, char **argv)
{
    struct opts o;
    int prc = parse_opts(&o, argc, argv);
    if (prc) {
        if (prc < 0) usage(stderr);
        return prc > 0 ? 0 : 2;
    }
    ms_log_init(0);
    ms_errbuf err = {{0}};
    ms_model *m = NULL;
    ms_tokenizer *tok = NULL;
    ms_kv_pool *pool = NULL;
    struct seq *seqs = NULL;
    ms_batch_seq *batch = NULL;
    float *logits = NULL;
    FILE *dump = NULL;
    char *file_text = NULL;
    int rc = 1, n_seqs = 0, total = 0;
    int *bseq = NULL; /* batch entry -> sequence */
    ms_model_opts mo = {.threads = o.threads, .exact = o.exact};
    if (ms_model_open(&m, o.model, &mo, &err)) {
        fprintf(stderr, "generate: --model %s: %s\n", o.model, err.msg);
        goto out;
    }
    const ms_config *c = &m->cfg;
    char path[1200];
    if (ms_path_join(path, sizeof path, o.model, "tokenizer.json")) {
        FILE *tf = fopen(path, "r");
        if (tf) {
            fclose(tf);
            if (ms_tokenizer_load(&tok, path, &err)) {
                fprintf(stderr, "generate: %s: %s\n", path, err.msg);
                goto out;
            }
        }
    }
    /* gather prompts */
    const char *lines[MAX_PROMPTS];
    int n_lines = 0;
    if (o.prompt_file) {
        size_t len;
        if (ms_read_file(o.prompt_file, 64u << 20, &file_text, &len)) {
            fprintf(stderr, "generate: --prompt-file %s: cannot read\n", o.prompt_file);
            goto out;
        }
        for (char *p = file_text; *p && n_lines < MAX_PROMPTS;) {
            char *nl = strchr(p, '\n');
            if (nl) *nl = 0;
            if (*p) lines[n_lines++] = p;
            if (!nl) break;
            p = nl + 1;
        }
    }
    total = o.n_prompts + o.n_prompt_ids + n_lines;
    if (total == 0 || total > MAX_PROMPTS) {
        fprintf(stderr, "generate: no prompts\n");
        goto out;
    }
    seqs = calloc((size_t)total, sizeof *seqs);
    batch = calloc((size_t)total, sizeof *batch);
    bseq = calloc((size_t)total, sizeof *bseq);
    logits = malloc(sizeof(float) * (size_t)(total * c->vocab_size));
    if (!seqs || !batch || !bseq || !logits) goto oom;
    for (int i = 0; i < o.n_prompts; i++, n_seqs++)
        if (encode_text(tok, c, o.prompts[i], &seqs[n_seqs])) goto out;
    for (int i = 0; i < o.n_prompt_ids; i++, n_seqs++)
        if (parse_ids(o.prompt_ids[i], &seqs[n_seqs], c->vocab_size)) goto out;
    for (int i = 0; i < n_lines; i++, n_seqs++)
        if (encode_text(tok, c, lines[i], &seqs[n_seqs])) goto out;

    /* KV pool: every sequence's prompt + max_new tokens, in pages */
    int64_t pages_total = 0;
    for (int i = 0; i < n_seqs; i++) {
        struct seq *s = &seqs[i];
        s->n_prompt = s->n_ids;
        if (s->n_prompt + o.max_new > c->max_position_embeddings) {
            fprintf(stderr, "generate: prompt %d has %lld tokens + %ld new > context %lld\n", i,
                    (long long)s->n_prompt, o.max_new, (long long)c->max_position_embeddings);
            goto out;
        }
        s->n_pages = (s->n_prompt + o.max_new + o.page_size - 1) / o.page_size;
        pages_total += s->n_pages;
        s->rng = ms_sampler_seed(o.seed + (uint64_t)i);
    }
    if (ms_kv_pool_new(&pool, c->n_layers, ms_model_kv_row_elems(m), o.page_size,
                       (int32_t)pages_total, o.exact ? MS_DT_F32 : MS_DT_BF16, &err)) {
        fprintf(stderr, "generate: %s\n", err.msg);
        goto out;
    }
    for (int i = 0; i < n_seqs; i++) {
        seqs[i].pages = malloc(sizeof(int32_t) * (size_t)seqs[i].n_pages);
        if (!seqs[i].pages || ms_kv_pool_alloc(pool, (int32_t)seqs[i].n_pages, seqs[i].pages))
            goto oom;
    }
    if (o.dump && !(dump = fopen(o.dump, "w"))) {
        fprintf(stderr, "generate: --dump-logits %s: cannot open\n", o.dump);
        goto out;
    }
    ms_sampler_scratch sc = {malloc(sizeof(float) * (size_t)c->vocab_size),
                             malloc(sizeof(int32_t) * (size_t)c->vocab_size)};
    if (!sc.prob || !sc.idx) goto oom;

    /* prefill in chunks, then decode; one forward per iteration for all sequences */
    double t_prefill = 0, t_decode = 0;
    int64_t n_prefill_tok = 0, n_decode_tok = 0;
    for (;;) {
        int nb = 0, any_prefill = 0;
        int64_t budget = o.chunk;
        for (int i = 0; i < n_seqs; i++) {
            struct seq *s = &seqs[i];
            if (s->n_prefilled < s->n_prompt && budget > 0) {
                int64_t n = MS_MIN(s->n_prompt - s->n_prefilled, budget);
                budget -= n;
                any_prefill = 1;
                int last = s->n_prefilled + n == s->n_prompt;
                bseq[nb] = i;
                batch[nb++] = (ms_batch_seq){s->ids + s->n_prefilled, (int32_t)n, s->n_prefilled,
                                             s->pages, last ? logits + (int64_t)i * c->vocab_size : NULL};
            }
        }
        if (!any_prefill)
            for (int i = 0; i < n_seqs; i++) {
                struct seq *s = &seqs[i];
                if (s->done || s->n_prefilled < s->n_prompt) continue;
                bseq[nb] = i;
                batch[nb++] = (ms_batch_seq){s->ids + s->n_ids - 1, 1, s->n_ids - 1, s->pages,
                                             logits + (int64_t)i * c->vocab_size};
            }
        if (nb == 0) break;
        double t0 = ms_now_s();
        if (ms_model_forward(m, pool, batch, nb, &err)) {
            fprintf(stderr, "generate: forward failed: %s\n", err.msg);
            goto out;
        }
        double dt = ms_now_s() - t0;
        for (int b = 0; b < nb; b++) {
            if (any_prefill) n_prefill_tok += batch[b].n_tokens;
            else n_decode_tok++;
        }
        if (any_prefill) t_prefill += dt;
        else t_decode += dt;
        for (int b = 0; b < nb; b++) { /* sample where logits were produced */
            struct seq *s = &seqs[bseq[b]];
            if (any_prefill) s->n_prefilled += batch[b].n_tokens;
            if (!batch[b].logits) continue;
            const float *lg = batch[b].logits;
            int32_t t = ms_sampler_pick(lg, c->vocab_size, &o.samp, &s->rng, &sc);
            if (dump) dump_line(dump, bseq[b], s->step, t, lg, c->vocab_size);
            s->step++;
            if (s->n_ids - s->n_prompt >= o.max_new) {
                s->done = 1;
                continue;
            }
            if (seq_push(s, t)) goto oom;
            if ((!o.ignore_eos && t == c->eos_token_id) || s->n_ids - s->n_prompt >= o.max_new)
                s->done = 1;
        }
    }
    free(sc.prob);
    free(sc.idx);

    for (int i = 0; i < n_seqs; i++) {
        struct seq *s = &seqs[i];
        if (n_seqs > 1) printf("[%d] ", i);
        if (tok) {
            char *text = NULL;
            size_t tl;
            if (ms_tokenizer_decode(tok, s->ids + s->n_prompt, (size_t)(s->n_ids - s->n_prompt), 1,
                                    &text, &tl, &err) == 0)
                printf("%s\n", text);
            free(text);
        }
        if (o.print_ids || !tok) {
            printf("ids:");
            for (int64_t j = s->n_prompt; j < s->n_ids; j++) printf(" %d", s->ids[j]);
            printf("\n");
        }
    }
    printf("timing: prefill_tokens=%lld prefill_tok_s=%.2f decode_tokens=%lld decode_tok_s=%.2f\n",
           (long long)n_prefill_tok, t_prefill > 0 ? n_prefill_tok / t_prefill : 0.0,
           (long long)n_decode_tok, t_decode > 0 ? n_decode_tok / t_decode : 0.0);
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "generate: out of memory\n");
out:
    if (dump) fclose(dump);
    if (seqs)
        for (int i = 0; i < total; i++) {
            free(seqs[i].ids);
            free(seqs[i].pages);
        }
    free(seqs);
    free(batch);
    free(bseq);
    free(logits);
    free(file_text);
    ms_kv_pool_free(pool);
    ms_tokenizer_free(tok);
    ms_model_free(m);
    return rc;
}
