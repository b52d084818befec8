/* cmd_generate.c — `moeserve generate`: run prompts through the engine
 * (engine.h) on any launch shape and print the text, ids, timing and
 * optionally every step's logits (--dump-logits, JSON lines).  With --enable-eplb,
 * the decode steps' time and balancedness before the first rebalance decision, in
 * steps that decided or moved, and after (the EPLB step-time benchmark's figure).
 *
 * Prompts go to the DP ranks round robin, so DP layouts are exercised
 * (including ranks left idle); output, logits and timing come from rank 0
 * whatever rank owns a sequence.  A launch that needs W > 1 ranks started
 * without mpirun re-launches itself under `mpirun -np W`.
 */
#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "model/tokenizer.h"
#include "moe/expert_recorder.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "serve/engine.h"
#include "serve/flag_kinds.h"
#include "tools/commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROMPTS 4096

struct opts {
    const char *model, *dump, *prompt_file;
    const char *prompts[MAX_PROMPTS];
    const char *prompt_ids[MAX_PROMPTS];
    int n_prompts, n_prompt_ids;
    long max_new;
    ms_sampler_params samp;
    unsigned long long seed;
    int print_ids, ignore_eos, comm_stats;
    int skip_warmup; /* --skip-server-warmup: as `serve` */
    double comm_timeout_s;
    ms_engine_opts eo;
    ms_flag_screen screen; /* GPU-only flags to warn about (argv borrowed) */
};

struct seq {
    int32_t *ids; /* prompt, then generated */
    int64_t n_prompt, n_ids, cap;
    int64_t step;
    int done;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3 | "
            "--prompt-file F)... [flags]\n"
            "  --max-new-tokens N   (default 32)      --temperature T (0 = greedy, default 0)\n"
            "  --top-p P  --top-k K  --min-p P  --seed N  --threads N\n"
            "  --dtype auto|float32|bfloat16          --dump-logits FILE (JSON lines)\n"
            "  --ids (print token ids)  --ignore-eos\n"
            "  --max-total-tokens N (KV pool per DP rank; default: what the prompts need)\n"
            "  --ep-dispatch-dtype fp32|bf16  --comm-stats  --comm-timeout-s S\n"
            "  --skip-server-warmup (no oneDNN prepack and warm-up prompt before the prompts,\n"
            "                        as `serve`)\n"
            "  --enable-deterministic-inference (as `serve`: each prompt's output does not\n"
            "                        depend on the other prompts run beside it; slower)\n"
            "launch flags (SGLang names):\n%s",
            ms_launch_help());
    ms_flag_kinds_print_help(f);
}

static int bad(const char *flag, const char *v, const char *what)
{
    fprintf(stderr, "generate: %s must be %s, got '%s'\n", flag, what, v);
    return -1;
}

static int parse_long(const char *flag, const char *v, long lo, long hi, long *out)
{
    ms_errbuf err;
    if (ms_parse_long(flag, v, lo, hi, out, &err) == 0) return 0;
    fprintf(stderr, "generate: %s\n", err.msg);
    return -1;
}

static int parse_float(const char *flag, const char *v, double lo, double hi, float *out)
{
    ms_errbuf err;
    double d;
    if (ms_parse_double(flag, v, lo, hi, &d, &err) == 0) {
        *out = (float)d;
        return 0;
    }
    fprintf(stderr, "generate: %s\n", err.msg);
    return -1;
}

/* argv without the GPU-only, refused and multi-node flags (flag_kinds.h) */
static int parse_kept(void *ctx, int argc, char **argv)
{
    struct opts *o = ctx;
    ms_engine_opts_init(&o->eo);
    o->max_new = 32;
    o->samp.top_p = 1.0f;
    o->comm_timeout_s = 60;
    ms_errbuf err = {{0}};
    if (ms_launch_apply_env(&o->eo.launch, &err)) {
        fprintf(stderr, "generate: %s\n", err.msg);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long x;
        float f;
        int lr = ms_launch_parse_arg(&o->eo.launch, argc, argv, &i, &err);
        if (lr < 0) {
            fprintf(stderr, "generate: %s\n", err.msg);
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
        if (!strcmp(a, "--ids")) {
            o->print_ids = 1;
            continue;
        }
        if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = 1;
            continue;
        }
        if (!strcmp(a, "--skip-server-warmup")) {
            o->skip_warmup = 1;
            continue;
        }
        if (!strcmp(a, "--comm-stats")) {
            o->comm_stats = 1;
            continue;
        }
        if (!strcmp(a, "--enable-deterministic-inference")) {
            o->eo.deterministic = 1;
            continue;
        }
        if (i + 1 >= argc || strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "generate: %s %s\n", a,
                    strncmp(a, "--", 2) ? "is not a flag" : "needs a value (or is unknown)");
            return -1;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model") || !strcmp(a, "--model-path"))
            o->model = v;
        else if (!strcmp(a, "--prompt")) {
            if (o->n_prompts >= MAX_PROMPTS) return bad(a, "given at most 4096 times", "more");
            o->prompts[o->n_prompts++] = v;
        } else if (!strcmp(a, "--prompt-ids")) {
            if (o->n_prompt_ids >= MAX_PROMPTS) return bad(a, "given at most 4096 times", "more");
            o->prompt_ids[o->n_prompt_ids++] = v;
        } else if (!strcmp(a, "--prompt-file"))
            o->prompt_file = v;
        else if (!strcmp(a, "--dump-logits"))
            o->dump = v;
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
            o->eo.threads = (int)x;
        } else if (!strcmp(a, "--max-total-tokens")) {
            if (parse_long(a, v, 1, 1L << 40, &x)) return -1;
            o->eo.max_total_tokens = x;
        } else if (!strcmp(a, "--comm-timeout-s")) {
            if (parse_float(a, v, 0.1, 1e6, &f)) return -1;
            o->comm_timeout_s = f;
        } else if (!strcmp(a, "--ep-dispatch-dtype")) {
            if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16"))
                o->eo.dispatch_bf16 = 1;
            else if (!strcmp(v, "fp32") || !strcmp(v, "float32"))
                o->eo.dispatch_bf16 = 0;
            else
                return bad(a, "fp32 or bf16", v);
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "float32"))
                o->eo.exact = 1;
            else if (!strcmp(v, "auto") || !strcmp(v, "bfloat16"))
                o->eo.exact = 0;
            else
                return bad(a, "auto, float32 or bfloat16", v);
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
    o->eo.model_path = o->model;
    if (ms_flag_screen_check(&o->screen, &o->eo.launch, o->eo.exact, o->model, "generate", stderr))
        return -1;
    o->eo.page_size = o->eo.launch.page_size_set ? o->eo.launch.page_size : 16;
    o->eo.keep_logits = o->dump != NULL;
    return 0;
}

static int parse_opts(struct opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    return ms_flag_screen_then(&o->screen, argc, argv, parse_kept, o);
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

static int parse_ids(const char *text, struct seq *s)
{
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "generate: --prompt-ids: bad token id near '%.20s'\n", p);
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

static int encode_text(const ms_tokenizer *tok, int64_t bos, const char *text, struct seq *s)
{
    if (!tok) {
        fprintf(stderr, "generate: --prompt needs tokenizer.json in the model directory "
                        "(use --prompt-ids)\n");
        return -1;
    }
    if (bos >= 0 && seq_push(s, (int32_t)bos)) return -1;
    size_t len = strlen(text), n = 0, cap = len + 16;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    ms_errbuf err = {{0}};
    if (!ids) return -1;
    if (ms_tokenizer_encode(tok, text, len, 1, ids, cap, &n, &err)) {
        fprintf(stderr, "generate: --prompt: %s\n", err.msg);
        free(ids);
        return -1;
    }
    for (size_t i = 0; i < n && i < cap; i++)
        if (seq_push(s, ids[i])) {
            free(ids);
            return -1;
        }
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

/* Reads prompts (rank 0). */
static int load_prompts(struct opts *o, const ms_model_shape *c, struct seq **out, int *n_out,
                        char **file_text)
{
    ms_tokenizer *tok = NULL;
    char path[1200];
    ms_errbuf err = {{0}};
    int rc = -1, n = 0;
    if (ms_path_join(path, sizeof path, o->model, "tokenizer.json")) {
        FILE *tf = fopen(path, "r");
        if (tf) {
            fclose(tf);
            if (ms_tokenizer_load(&tok, path, &err) ||
                ms_tokenizer_check_vocab(tok, c->vocab, &err)) {
                fprintf(stderr, "generate: %s: %s\n", path, err.msg);
                ms_tokenizer_free(tok);
                return -1;
            }
        }
    }
    const char *lines[MAX_PROMPTS];
    int n_lines = 0;
    if (o->prompt_file) {
        size_t len;
        if (ms_read_file(o->prompt_file, 64u << 20, file_text, &len)) {
            fprintf(stderr, "generate: --prompt-file %s: cannot read\n", o->prompt_file);
            goto out;
        }
        for (char *p = *file_text; *p && n_lines < MAX_PROMPTS;) {
            char *nl = strchr(p, '\n');
            if (nl) *nl = 0;
            if (*p) lines[n_lines++] = p;
            if (!nl) break;
            p = nl + 1;
        }
    }
    int total = o->n_prompts + o->n_prompt_ids + n_lines;
    if (total == 0 || total > MAX_PROMPTS) {
        fprintf(stderr, "generate: %d prompts (1 to %d allowed)\n", total, MAX_PROMPTS);
        goto out;
    }
    struct seq *seqs = calloc((size_t)total, sizeof *seqs);
    if (!seqs) goto out;
    *out = seqs;
    for (int i = 0; i < o->n_prompts; i++, n++)
        if (encode_text(tok, c->bos_token_id, o->prompts[i], &seqs[n])) goto out;
    for (int i = 0; i < o->n_prompt_ids; i++, n++)
        if (parse_ids(o->prompt_ids[i], &seqs[n])) goto out;
    for (int i = 0; i < n_lines; i++, n++)
        if (encode_text(tok, c->bos_token_id, lines[i], &seqs[n])) goto out;
    for (int i = 0; i < n; i++) {
        seqs[i].n_prompt = seqs[i].n_ids;
        for (int64_t j = 0; j < seqs[i].n_ids; j++)
            if (seqs[i].ids[j] >= c->vocab) {
                fprintf(stderr, "generate: prompt %d: token id %d outside the vocabulary (%lld)\n",
                        i, seqs[i].ids[j], (long long)c->vocab);
                goto out;
            }
    }
    rc = 0;
out:
    *n_out = n;
    ms_tokenizer_free(tok);
    return rc;
}

static void print_results(const struct opts *o, struct seq *seqs, int n)
{
    ms_tokenizer *tok = NULL;
    char path[1200];
    ms_errbuf err = {{0}};
    if (ms_path_join(path, sizeof path, o->model, "tokenizer.json")) {
        FILE *tf = fopen(path, "r");
        if (tf) {
            fclose(tf);
            ms_tokenizer_load(&tok, path, &err);
        }
    }
    for (int i = 0; i < n; i++) {
        struct seq *s = &seqs[i];
        if (n > 1) printf("[%d] ", i);
        if (tok) {
            char *text = NULL;
            size_t tl;
            if (ms_tokenizer_decode(tok, s->ids + s->n_prompt, (size_t)(s->n_ids - s->n_prompt), 1,
                                    &text, &tl, &err) == 0)
                printf("%s\n", text);
            free(text);
        }
        if (o->print_ids || !tok) {
            printf("ids:");
            for (int64_t j = s->n_prompt; j < s->n_ids; j++) printf(" %d", s->ids[j]);
            printf("\n");
        }
    }
    ms_tokenizer_free(tok);
}

int ms_cmd_generate(int argc, char **argv)
{
    struct opts o;
    int prc = parse_opts(&o, argc, argv);
    if (prc) {
        if (prc < 0) fprintf(stderr, "(moeserve generate --help lists the flags)\n");
        return prc > 0 ? 0 : 2;
    }
    ms_errbuf err = {{0}};
    ms_model_shape cfg;
    ms_layout lay;
    int W, rank, rc;
    /* main.c passes argv + 1: argv - 1 is the program's own argument vector */
    if ((rc = ms_engine_start("generate", &o.eo, o.comm_timeout_s, argc + 1, argv - 1, &cfg, &lay,
                              &W, &rank)))
        return rc;
    if (rank == 0) ms_flag_screen_warn(&o.screen, "generate");
    rc = 1;
    struct seq *seqs = NULL;
    int n_seqs = 0;
    char *file_text = NULL;
    ms_engine *e = NULL;
    FILE *dump = NULL;
    /* rank 0 reads the prompts first so the KV pool can be sized for them */
    int prompts_ok = 1;
    int64_t need = 0;
    if (rank == 0) {
        prompts_ok = load_prompts(&o, &cfg, &seqs, &n_seqs, &file_text) == 0;
        for (int i = 0; i < n_seqs; i++)
            need += (seqs[i].n_prompt + o.max_new + 2 * o.eo.page_size);
    }
    if (W > 1) { /* every rank learns whether to go on, and the pool size */
        int64_t msg[2] = {prompts_ok, need};
        if (ms_comm_bcast(ms_comm_world(), msg, sizeof msg, 0, &err)) goto comm_fail;
        prompts_ok = (int)msg[0];
        need = msg[1];
    }
    if (!prompts_ok) goto out;
    if (o.eo.max_total_tokens <= 0) o.eo.max_total_tokens = MS_MAX(need, 64);
    if (ms_engine_boot(&e, &o.eo, o.skip_warmup, MS_ENGINE_WARMUP_TOKENS, &err)) {
        fprintf(stderr, "generate: rank %d: %s\n", rank, err.msg);
        if (W > 1) ms_comm_abort(1);
        goto out;
    }
    if (rank != 0) {
        if (ms_engine_follow(e, &err)) goto comm_fail;
        rc = 0;
        goto out;
    }
    if (o.dump && !(dump = fopen(o.dump, "w"))) {
        fprintf(stderr, "generate: --dump-logits %s: cannot open\n", o.dump);
        ms_engine_finish(e, &err);
        goto out;
    }
    int n_dp = ms_engine_n_dp(e);
    for (int i = 0; i < n_seqs; i++) {
        ms_req_params in = {.id = (uint64_t)i,
                            .ids = seqs[i].ids,
                            .n_ids = seqs[i].n_prompt,
                            .max_new = o.max_new,
                            .samp = o.samp,
                            .seed = o.seed + (uint64_t)i,
                            .ignore_eos = o.ignore_eos,
                            .top_logprobs = -1,
                            .dp_rank = i % n_dp};
        if (ms_engine_submit(e, &in, &err)) {
            fprintf(stderr, "generate: prompt %d: %s\n", i, err.msg);
            ms_engine_finish(e, &err);
            goto out;
        }
    }
    int failed = 0; /* a prompt refused by its DP rank */
    double t_prefill = 0, t_decode = 0;
    int64_t n_prefill = 0, n_decode = 0, n_decode_timed = 0;
    int64_t n_dsteps = 0;
    double t_part[3] = {0, 0, 0}; /* decode steps: forward, sample, draft */
    int64_t V = cfg.vocab;
    /* --enable-eplb: decode steps before the first decision, deciding or moving, after */
    struct {
        int64_t steps, n_bal;
        double s, bal, tmax, tmean;
    } ph[3] = {{0}};
    ms_expert_recorder *rec = ms_engine_recorder(e);
    ms_recorder_stats rs0 = {0};
    while (ms_engine_busy(e)) {
        ms_engine_eplb_state es0, es1;
        ms_engine_eplb_progress(e, &es0);
        if (rec) ms_expert_recorder_stats(rec, &rs0);
        if (ms_engine_step(e, &err)) goto comm_fail;
        ms_engine_step_stats st;
        ms_engine_last_step(e, &st);
        ms_engine_eplb_progress(e, &es1);
        int64_t pre = st.rows - st.decode_rows - st.verify_rows; /* prefill-chunk rows */
        n_prefill += pre;
        const ms_engine_event *ev;
        int n_ev = ms_engine_events(e, &ev);
        int64_t made = 0; /* tokens this step decoded (a verify gives several) */
        for (int i = 0; i < n_ev; i++)
            made += ev[i].ev.token >= 0 && ev[i].ev.completion_tokens > 1;
        n_decode += made;
        if (pre > 0) {
            t_prefill += st.seconds;
        } else {
            t_decode += st.seconds;
            n_decode_timed += made;
            n_dsteps++;
            t_part[0] += st.forward_s, t_part[1] += st.sample_s, t_part[2] += st.draft_s;
            int k = es0.moving || es1.moving || es1.decisions != es0.decisions ? 1
                    : es1.decisions                                            ? 2
                                                                               : 0;
            ph[k].steps++, ph[k].s += st.seconds;
            ms_recorder_stats rs1;
            if (rec && (ms_expert_recorder_stats(rec, &rs1), rs1.passes > rs0.passes))
                ph[k].bal += rs1.last, ph[k].n_bal++, ph[k].tmax += rs1.touched_max,
                    ph[k].tmean += rs1.touched_mean;
        }
        for (int i = 0; i < n_ev; i++) {
            const ms_sched_event *x = &ev[i].ev;
            if (x->id >= (uint64_t)n_seqs) continue;
            struct seq *s = &seqs[x->id];
            if (x->token >= 0) {
                if (dump && ev[i].logits)
                    dump_line(dump, (int)x->id, s->step, x->token, ev[i].logits, V);
                s->step++;
                if (seq_push(s, x->token)) goto comm_fail;
            }
            if (x->finish != MS_FINISH_NONE) s->done = 1;
            if (ev[i].error) {
                fprintf(stderr, "generate: prompt %d: %s\n", (int)x->id, ev[i].error_msg);
                failed = 1;
            }
        }
    }
    if (ms_engine_finish(e, &err)) goto comm_fail;
    print_results(&o, seqs, n_seqs);
    printf("timing: prefill_tokens=%lld prefill_tok_s=%.2f decode_tokens=%lld decode_tok_s=%.2f\n",
           (long long)n_prefill, t_prefill > 0 ? (double)n_prefill / t_prefill : 0.0,
           (long long)n_decode, t_decode > 0 ? (double)n_decode_timed / t_decode : 0.0);
    const ms_engine_load *ld;
    int64_t sv = 0, sd = 0, sa = 0;
    for (int i = 0, nl = ms_engine_loads(e, &ld); i < nl; i++)
        sv += ld[i].st.spec_verify_total, sd += ld[i].st.spec_drafted_total,
            sa += ld[i].st.spec_accepted_total;
    if (sv > 0)
        printf("spec: verify_steps=%lld drafted=%lld accepted=%lld accept_len=%.3f\n",
               (long long)sv, (long long)sd, (long long)sa, 1.0 + (double)sa / (double)sv);
    if (n_dsteps > 0) /* where a decode step's time went, ms per step */
        printf("decode_step_ms: steps=%lld total=%.3f forward=%.3f sample=%.3f draft=%.3f "
               "other=%.3f\n",
               (long long)n_dsteps, 1e3 * t_decode / n_dsteps, 1e3 * t_part[0] / n_dsteps,
               1e3 * t_part[1] / n_dsteps, 1e3 * t_part[2] / n_dsteps,
               1e3 * (t_decode - t_part[0] - t_part[1] - t_part[2]) / n_dsteps);
    if (o.eo.launch.enable_eplb) {
        ms_engine_eplb_state es;
        ms_engine_eplb_progress(e, &es);
        double ms[3], b[3], tx[3], tm[3];
        for (int k = 0; k < 3; k++) {
            double nb = ph[k].n_bal ? (double)ph[k].n_bal : 1;
            ms[k] = ph[k].steps ? 1e3 * ph[k].s / (double)ph[k].steps : 0;
            b[k] = ph[k].bal / nb, tx[k] = ph[k].tmax / nb, tm[k] = ph[k].tmean / nb;
        }
        /* touched: expert slots with a token per MoE layer and step, on the rank with the
         * most (max) and on the average rank (mean) — the expert weights a rank reads */
        printf("eplb_decode_step_ms: before_steps=%lld before=%.3f before_balancedness=%.4f "
               "before_touched_max=%.2f before_touched_mean=%.2f moving_steps=%lld moving=%.3f "
               "after_steps=%lld after=%.3f after_balancedness=%.4f after_touched_max=%.2f "
               "after_touched_mean=%.2f decisions=%lld skipped=%lld\n",
               (long long)ph[0].steps, ms[0], b[0], tx[0], tm[0], (long long)ph[1].steps, ms[1],
               (long long)ph[2].steps, ms[2], b[2], tx[2], tm[2], (long long)es.decisions,
               (long long)es.skipped);
    }
    fflush(stdout);
    rc = failed;
    goto out;
comm_fail:
    fprintf(stderr, "generate: rank %d: %s\n", rank, err.msg);
    if (W > 1) ms_comm_abort(1);
out:
    if (o.comm_stats && W > 1 && e) {
        ms_mlp_counters mc;
        ms_model_mlp_counters(ms_engine_model(e), &mc);
        fprintf(stderr,
                "mlp rank=%d dp_gather_max_len=%lld dp_gather_sum_len=%lld dispatch_rows=%lld "
                "expert_rows=%lld shared_remote=%lld\n",
                rank, (long long)mc.max_len, (long long)mc.sum_len, (long long)mc.dispatch_rows,
                (long long)mc.expert_rows, (long long)mc.shared_remote);
        ms_comm_stats_print(stderr);
    }
    if (dump) fclose(dump);
    for (int i = 0; i < n_seqs; i++) free(seqs[i].ids);
    free(seqs);
    free(file_text);
    ms_engine_close(e);
    if (W > 1 && ms_comm_deinit(&err)) {
        fprintf(stderr, "generate: rank %d: %s\n", rank, err.msg);
        rc = 1;
    }
    return rc;
}
