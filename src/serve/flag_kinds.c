/* flag_kinds.c — the table of SGLang launch flags that `serve` and `generate` do not
 * parse themselves (GPU-only tuning, features not built,
 * multi-node), the screening of argv against it, the start-up warnings and refusals.
 * Implemented flags are not listed here: their parsers own them.  Main thread only.
 */
#include "serve/flag_kinds.h"

#include "base/log.h"
#include "base/util.h"
#include "model/family.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum kind { GPU_ONLY = 1, NOT_BUILT, MULTINODE, OURS /* implemented: an exception to a prefix */ };
#define FUSION_WHY                                                                                 \
    "shared-expert fusion without an all-to-all backend (it runs with --moe-a2a-backend "          \
    "deepep|megamoe at EP >= 2)"

/* name: the flag, or a prefix ending in '-' (matching every flag that starts with it);
 * the first match wins, so exceptions to a prefix come before it. */
static const struct {
    const char *name;
    enum kind kind;
    const char *why; /* NOT_BUILT: the feature that is missing */
} table[] = {
    /* GPU-only tuning: kernels, graphs and runners a CPU engine does not have */
    {"--cuda-graph-max-bs", GPU_ONLY, NULL},
    {"--cuda-graph-bs", GPU_ONLY, NULL},
    {"--cuda-graph-bs-decode", GPU_ONLY, NULL},
    {"--disable-cuda-graph", GPU_ONLY, NULL},
    {"--disable-cuda-graph-padding", GPU_ONLY, NULL},
    {"--enable-torch-compile", GPU_ONLY, NULL},
    {"--torch-compile-max-bs", GPU_ONLY, NULL},
    {"--moe-runner-backend", GPU_ONLY, NULL},
    {"--attention-backend", GPU_ONLY, NULL},
    {"--prefill-attention-backend", GPU_ONLY, NULL},
    {"--decode-attention-backend", GPU_ONLY, NULL},
    {"--sampling-backend", GPU_ONLY, NULL},
    {"--disable-flashinfer-autotune", GPU_ONLY, NULL},
    {"--flashinfer-mxfp4-moe-precision", GPU_ONLY, NULL},
    {"--trust-remote-code", GPU_ONLY, NULL}, /* no Python model code is ever run */
    {"--deepep-mode", GPU_ONLY, NULL},
    {"--enable-dp-attention-local-control-broadcast", GPU_ONLY, NULL},
    {"--disable-custom-all-reduce", GPU_ONLY, NULL},
    {"--enable-nccl-nvls", GPU_ONLY, NULL},
    {"--speculative-draft-attention-backend", GPU_ONLY, NULL},
    {"--speculative-moe-runner-backend", GPU_ONLY, NULL},
    {"--disaggregation-ib-device", GPU_ONLY, NULL},
    /* features not built */
    {"--speculative-algorithm", NOT_BUILT,
     "speculative decoding"}, /* EAGLE/NEXTN/MTP/NGRAM/none: ok */
    {"--speculative-num-steps", OURS, NULL},
    {"--speculative-eagle-topk", OURS, NULL},
    {"--speculative-num-draft-tokens", OURS, NULL},
    {"--speculative-ngram-min-match-window-size", OURS, NULL},
    {"--speculative-ngram-max-match-window-size", OURS, NULL},
    {"--speculative-ngram-max-bfs-breadth", OURS, NULL},
    {"--speculative-token-map", OURS, NULL},
    {"--speculative-", NOT_BUILT, "this speculative-decoding option"},
    {"--enable-hierarchical-cache", NOT_BUILT, "the HiCache host tier"},
    {"--hicache-", NOT_BUILT, "the HiCache host tier"},
    {"--disaggregation-mode", NOT_BUILT, "prefill/decode disaggregation"}, /* "null": ok */
    {"--disaggregation-", NOT_BUILT, "prefill/decode disaggregation"},
    {"--enable-eplb", OURS, NULL},
    {"--eplb-algorithm", OURS, NULL},
    {"--eplb-rebalance-num-iterations", OURS, NULL},
    {"--eplb-rebalance-layers-per-chunk", OURS, NULL},
    {"--eplb-min-rebalancing-utilization-threshold", OURS, NULL},
    {"--eplb-", NOT_BUILT, "this EPLB option"},
    /* built on the all-to-all path (parsed by parallel/launch.c there: fine_with_a2a) */
    {"--enforce-shared-experts-fusion", NOT_BUILT, FUSION_WHY},
    {"--enable-waterfill", NOT_BUILT, FUSION_WHY},
    {"--enable-deepep-waterfill", NOT_BUILT, FUSION_WHY},
    {"--enable-prefill-delayer", NOT_BUILT, "the prefill delayer"},
    {"--prefill-delayer-", NOT_BUILT, "the prefill delayer"},
    {"--prefill-decode-interval", NOT_BUILT, "a prefill/decode interleaving interval"},
    {"--enable-w4a4-mxfp4-megamoe", NOT_BUILT, "MXFP4 activations (W4A4 MegaMoE)"},
    {"--enable-unified-cache-external-linker", NOT_BUILT, "the UMBP external KV store"},
    {"--unified-cache-external-linker-", NOT_BUILT, "the UMBP external KV store"},
    {"--tokenizer-worker-num", NOT_BUILT,
     "tokenizer workers (requests are tokenized on their connection threads)"},
    /* multi-node: mpirun spans machines */
    {"--nnodes", MULTINODE, NULL},
    {"--node-rank", MULTINODE, NULL},
    {"--dist-init-addr", MULTINODE, NULL},
};
#define N_TABLE (sizeof table / sizeof table[0])

/* SGLANG_* environment variables this engine reads. */
static const char *env_read[] = {"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK",
                                 "SGLANG_SIMULATE_ACC_LEN", "SGLANG_DSV4_COMPRESS_STATE_DTYPE",
                                 "SGLANG_DISABLE_STATIC_WATERFILL"};

static int lookup(const char *name, size_t len)
{
    for (size_t i = 0; i < N_TABLE; i++) {
        size_t n = strlen(table[i].name);
        int prefix = table[i].name[n - 1] == '-';
        if (prefix ? (len > n && !strncmp(name, table[i].name, n))
                   : (len == n && !strncmp(name, table[i].name, n)))
            return (int)i;
    }
    return -1;
}

/* Values of implemented flags that belong to the table's kinds after all. */
static int value_is_fine(const char *flag, const char *v)
{
    if (!strcmp(flag, "--speculative-algorithm")) /* EAGLE3 and DSPARK are refused */
        return v && (!strcasecmp(v, "none") || !strcasecmp(v, "EAGLE") || !strcasecmp(v, "NEXTN") ||
                     !strcasecmp(v, "MTP") || !strcasecmp(v, "NGRAM"));
    if (!strcmp(flag, "--disaggregation-mode"))
        return v && (!strcasecmp(v, "null") || !strcasecmp(v, "none"));
    return 0;
}

/* --kv-cache-dtype values the cache stores: the activations' dtype (fp32 under
 * --dtype float32, bf16 otherwise; auto: that one) or fp8_e4m3 (e4m3 rows). */
static int kv_dtype_stored(const char *v, int exact)
{
    static const char *const always[] = {"auto", "fp8_e4m3"}, *const fp32[] = {"fp32", "float32"},
                             *const bf16[] = {"bf16", "bfloat16"};
    const char *const *act = exact ? fp32 : bf16;
    for (int i = 0; i < 2; i++)
        if (!strcasecmp(v, always[i]) || !strcasecmp(v, act[i])) return 1;
    return 0;
}

static int screen(ms_flag_screen *s, int argc, char **argv, char **kept, int gpu_only);

int ms_flag_screen_argv(ms_flag_screen *s, int argc, char **argv, char **kept)
{
    return screen(s, argc, argv, kept, 0);
}

int ms_flag_screen_gpu_argv(ms_flag_screen *s, int argc, char **argv, char **kept)
{
    return screen(s, argc, argv, kept, 1);
}

/* The fusion flags are built where an all-to-all backend is named: the argv names one. */
static int fine_with_a2a(const char *flag, int argc, char **argv)
{
    if (strcmp(flag, "--enforce-shared-experts-fusion") && strcmp(flag, "--enable-waterfill") &&
        strcmp(flag, "--enable-deepep-waterfill"))
        return 0;
    static const char opt[] = "--moe-a2a-backend";
    const size_t n = sizeof opt - 1;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (!strncmp(argv[i], opt, n) && argv[i][n] == '=')
            v = argv[i] + n + 1;
        else if (!strcmp(argv[i], opt) && i + 1 < argc)
            v = argv[i + 1];
        if (v && strcasecmp(v, "none")) return 1;
    }
    return 0;
}

static int screen(ms_flag_screen *s, int argc, char **argv, char **kept, int gpu_only)
{
    memset(s, 0, sizeof *s);
    int n = 0;
    if (argc > 0) kept[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) {
            kept[n++] = argv[i];
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        /* the first value (--flag=v or the next argument that is not a flag) */
        const char *v =
            eq ? eq + 1 : (i + 1 < argc && strncmp(argv[i + 1], "--", 2) ? argv[i + 1] : NULL);
        int k = lookup(a, len);
        if (gpu_only && k >= 0 && table[k].kind != GPU_ONLY) k = -1;
        if (k < 0 || table[k].kind == OURS || value_is_fine(table[k].name, v) ||
            fine_with_a2a(table[k].name, argc, argv)) {
            kept[n++] = argv[i];
            continue;
        }
        /* screened: skip its values (every following argument that is not a flag) */
        int j = i + 1;
        if (!eq)
            while (j < argc && strncmp(argv[j], "--", 2)) j++;
        enum kind kd = table[k].kind;
        if (kd == GPU_ONLY && s->n_gpu_only < MS_FLAG_SCREEN_MAX) {
            s->gpu_only[s->n_gpu_only++] = a;
        } else if (kd == NOT_BUILT && s->n_refused < MS_FLAG_SCREEN_MAX) {
            s->refused[s->n_refused] = a;
            s->refused_val[s->n_refused] = j > i + 1 ? argv[i + 1] : NULL;
            s->why[s->n_refused++] = table[k].why;
        } else if (kd == MULTINODE) {
            s->n_multinode++;
            if (len == 8 && !strncmp(a, "--nnodes", len) && v) s->nnodes = atoi(v);
        } else {
            s->overflow = 1; /* more than MS_FLAG_SCREEN_MAX of one kind: refused */
        }
        i = j - 1;
    }
    kept[n] = NULL;
    return n;
}

static int then(ms_flag_screen *s, int argc, char **argv, int gpu_only,
                int (*parse)(void *ctx, int argc, char **argv), void *ctx)
{
    char **kept = calloc((size_t)argc + 1, sizeof *kept);
    if (!kept) return -1;
    int rc = parse(ctx, screen(s, argc, argv, kept, gpu_only), kept);
    free(kept);
    return rc;
}

int ms_flag_screen_then(ms_flag_screen *s, int argc, char **argv,
                        int (*parse)(void *ctx, int argc, char **argv), void *ctx)
{
    return then(s, argc, argv, 0, parse, ctx);
}

int ms_flag_screen_gpu_then(ms_flag_screen *s, int argc, char **argv,
                            int (*parse)(void *ctx, int argc, char **argv), void *ctx)
{
    return then(s, argc, argv, 1, parse, ctx);
}

int ms_flag_screen_check(const ms_flag_screen *s, const ms_launch *l, int exact,
                         const char *model_path, const char *cmd, FILE *out)
{
    int bad = 0;
    ms_model_shape shape; /* the family table's reading of config.json */
    ms_errbuf e;
    const char *model_type = "a model it cannot read";
    int v4_cache = 0; /* the model has V4's window pool and compressor state */
    if ((l &&
         (l->v4_fp4_indexer || l->swa_full_tokens_ratio > 0 || l->compress_state_bytes != 4)) &&
        model_path && !ms_family_load(model_path, 1, NULL, &shape, &e)) {
        model_type = shape.name;
        v4_cache = shape.window > 0 && shape.n_ratios > 0;
    }
    char f[256];
    for (int i = 0; i < s->n_refused; i++, bad++) {
        snprintf(f, sizeof f, "%s%s%s", s->refused[i], s->refused_val[i] ? " " : "",
                 s->refused_val[i] ? s->refused_val[i] : "");
        if (!strncmp(s->refused[i], "--speculative-algorithm", 23) && strcasestr(f, "EAGLE3"))
            fprintf(out,
                    "%s: %s: not implemented (EAGLE3 needs a separate draft model; EAGLE, NEXTN "
                    "and MTP run the checkpoint's own MTP layer, NGRAM needs no weights)\n",
                    cmd, f);
        else if (!strncmp(s->refused[i], "--speculative-algorithm", 23) && strcasestr(f, "DSPARK"))
            fprintf(out,
                    "%s: %s: not implemented (the DSpark draft head ships with the DeepSeek-V4 "
                    "0731/0813 checkpoints of the V4.1 line, whose model family is not built; "
                    "use EAGLE/NEXTN/MTP or NGRAM)\n",
                    cmd, f);
        else
            fprintf(out, "%s: %s: not implemented (%s is not built in moeserve)\n", cmd, f,
                    s->why[i]);
    }
    if (l && model_path && !v4_cache && l->v4_fp4_indexer && bad++ >= 0)
        fprintf(out,
                "%s: --enable-deepseek-v4-fp4-indexer: not implemented for this model: a "
                "DeepSeek-V4 flag, and %s is %s (no indexer)\n",
                cmd, model_path, model_type);
    if (l && model_path && !v4_cache && l->swa_full_tokens_ratio > 0 && bad++ >= 0)
        fprintf(out,
                "%s: --swa-full-tokens-ratio: not implemented for this model: %s (%s) has no "
                "sliding-window "
                "KV pool (a DeepSeek-V4 setting here)\n",
                cmd, model_path, model_type);
    if (l && model_path && !v4_cache && l->compress_state_bytes != 4 && !l->compress_state_flag)
        MS_LOG(MS_WARN, cmd,
               "SGLANG_DSV4_COMPRESS_STATE_DTYPE: without effect on %s (%s): the model has no "
               "compressor state",
               model_path, model_type);
    if (l && model_path && !v4_cache && l->compress_state_flag && l->compress_state_bytes != 4 &&
        bad++ >= 0)
        fprintf(out,
                "%s: --compress-state-dtype bf16: not implemented for this model: %s (%s) has "
                "no compressor state (a DeepSeek-V4 setting)\n",
                cmd, model_path, model_type);
    if (s->n_multinode) {
        int w = l ? l->tp * (l->enable_dp_attention ? 1 : l->dp) * l->pp : 0;
        int per = s->nnodes > 0 && w % s->nnodes == 0 ? w / s->nnodes : 0;
        fprintf(out,
                "%s: --nnodes, --node-rank and --dist-init-addr are not implemented: moeserve "
                "spans machines with MPI; start all %d ranks at once with\n"
                "    mpirun -np %d --hostfile HOSTS",
                cmd, w, w);
        if (per) fprintf(out, " --map-by ppr:%d:node", per);
        fprintf(out,
                " moeserve %s <the same flags without --nnodes, --node-rank and "
                "--dist-init-addr>\n",
                cmd);
        bad++;
    }
    if (s->overflow) {
        fprintf(out, "%s: more than %d GPU-only, refused or DeepSeek-V4 flags of one kind\n", cmd,
                MS_FLAG_SCREEN_MAX);
        bad++;
    }
    if (l && (l->pp > 1 || l->attn_cp_size > 1)) {
        fprintf(out, "%s: %s %d: not implemented (%s are not built in the CPU engine)\n", cmd,
                l->pp > 1 ? "--pp-size" : "--attn-cp-size", l->pp > 1 ? l->pp : l->attn_cp_size,
                l->pp > 1 ? "pipeline stages" : "attention context-parallel groups");
        bad++;
    }
    if (l && !kv_dtype_stored(l->kv_cache_dtype, exact)) {
        fprintf(out,
                "%s: --kv-cache-dtype %s: not implemented (the KV cache stores the activation "
                "dtype, %s with --dtype %s, or fp8_e4m3)\n",
                cmd, l->kv_cache_dtype, exact ? "fp32" : "bf16", exact ? "float32" : "auto");
        bad++;
    }
    return bad ? MS_EINVAL : 0;
}

void ms_flag_screen_warn_flags(const ms_flag_screen *s, const char *cmd)
{
    char line[2048];
    size_t off = 0;
    for (int i = 0; i < s->n_gpu_only && off < sizeof line; i++) {
        const char *a = s->gpu_only[i];
        const char *eq = strchr(a, '=');
        int len = eq ? (int)(eq - a) : (int)strlen(a);
        int w = snprintf(line + off, sizeof line - off, "%s%.*s", i ? ", " : "", len, a);
        if (w < 0) break;
        off += (size_t)w;
    }
    if (s->n_gpu_only)
        MS_LOG(MS_WARN, cmd, "GPU-only tuning, %s: %s",
               strcmp(cmd, "plan") ? "without effect on this engine" : "not modelled by the plan",
               line);
}

void ms_flag_screen_warn(const ms_flag_screen *s, const char *cmd)
{
    ms_flag_screen_warn_flags(s, cmd);
    ms_flag_screen_warn_env(cmd);
}

void ms_flag_screen_warn_env(const char *cmd)
{
    char line[2048];
    size_t off = 0;
    line[0] = 0;
    int n = 0;
    extern char **environ;
    for (char **e = environ; e && *e && off < sizeof line; e++) {
        if (strncmp(*e, "SGLANG_", 7)) continue;
        const char *eq = strchr(*e, '=');
        int len = eq ? (int)(eq - *e) : (int)strlen(*e);
        if (eq && !eq[1]) continue; /* set to "": not set */
        int read = 0;
        for (size_t k = 0; k < sizeof env_read / sizeof env_read[0]; k++)
            if ((int)strlen(env_read[k]) == len && !strncmp(*e, env_read[k], (size_t)len)) read = 1;
        if (read) continue;
        int w = snprintf(line + off, sizeof line - off, "%s%.*s", n++ ? ", " : "", len, *e);
        if (w < 0) break;
        off += (size_t)w;
    }
    if (n)
        MS_LOG(MS_WARN, cmd, "environment variables this engine does not read (ignored): %s", line);
}

void ms_flag_kinds_print_help(FILE *f)
{
    fprintf(f, "SGLang flags without effect on a CPU (accepted; named in a start-up warning):\n");
    int col = 0;
    for (size_t i = 0; i < N_TABLE; i++) {
        if (table[i].kind != GPU_ONLY) continue;
        int w = (int)strlen(table[i].name) + 1;
        if (col + w > 88) fprintf(f, "\n"), col = 0;
        col += fprintf(f, "%s%s", col ? " " : "  ", table[i].name);
    }
    fprintf(f, "\nSGLang flags of features not built (refused at start-up; '-' ends a prefix):\n");
    for (size_t i = 0; i < N_TABLE; i++) {
        if (table[i].kind != NOT_BUILT) continue;
        fprintf(f, "  %-44s %s\n", table[i].name, table[i].why);
    }
    fprintf(f,
            "  ('plan only' above: moeserve plan models the flag; serve and generate refuse it.)\n"
            "  --speculative-algorithm none|EAGLE|NEXTN|MTP|NGRAM and --disaggregation-mode null\n"
            "  are accepted; --kv-cache-dtype takes auto, the activation dtype (bf16; fp32 with\n"
            "  --dtype float32) or fp8_e4m3 (refused: fp16, fp8_e5m2).\n"
            "DeepSeek-V4 only (refused on other models): --swa-full-tokens-ratio,\n"
            "  --compress-state-dtype (env SGLANG_DSV4_COMPRESS_STATE_DTYPE),\n"
            "  --enable-deepseek-v4-fp4-indexer (MXFP4 index keys)\n"
            "Multi-node (--nnodes, --node-rank, --dist-init-addr): refused; run\n"
            "  mpirun -np W --hostfile HOSTS moeserve serve ... (W = tp, x dp without\n"
            "  --enable-dp-attention)\n"
            "SGLANG_* environment variables read: SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK,\n"
            "  SGLANG_DSV4_COMPRESS_STATE_DTYPE, SGLANG_SIMULATE_ACC_LEN (benchmarks only);\n"
            "  any other one set is named in a start-up warning as ignored.\n");
}
