/* cmd_plan.c — `moeserve plan`: parses the planner's flags and SGLang's launch flags (the
 * shared parser in parallel/layout.h), runs ms_plan_run or a sweep, prints a table or
 * --json.  Owns the command line only.  Main thread.
 */
#include "base/util.h"
#include "plan/plan.h"
#include "serve/flag_kinds.h"
#include "tools/commands.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: moeserve plan --model PRESET|--model-config config.json [--gpu PRESET] [flags]\n"
        "\nWhat a launch shape resolves to, and what fits, without any hardware.\n\n"
        "model and fleet:\n"
        "  --model PRESET                           %s\n"
        "  --model-config PATH                      an HF config.json instead of a preset\n"
        "  --weights fp8|bf16|fp4-experts           storage format (default: the published one)\n"
        "  --gpu PRESET                             %s\n"
        "  --gpu-mem-gb X                           memory per device in GB (required for cpu)\n"
        "  --num-gpus N | --nnodes N --gpus-per-node N\n"
        "  --reserve-gb X                           activations/workspace per device\n"
        "  --mem-fraction-static F                  weights+KV fraction of memory (default 0.88)\n"
        "  --kv-pool-gib X                          fix the KV pool per rank (GiB)\n"
        "workload:\n"
        "  --context-len N                          tokens per request (default: model max)\n"
        "  --tokens-per-step N                      global tokens per step T_g (all DP ranks)\n"
        "  --link-gb-per-s X                        link bandwidth, one direction, GB/s\n"
        "output:\n"
        "  --json                                   one JSON object\n"
        "  --sweep context|layouts                  capacity curve: admitted requests vs context\n"
        "  --sweep-contexts N,N,...                 context lengths of the sweep\n"
        "  --plot FILE                              plot file (.svg or .png; default "
        "plan-sweep.svg)\n"
        "SGLang launch flags ('plan only': modelled here, refused by serve):\n%s"
        "GPU-only SGLang tuning flags (--moe-runner-backend, --attention-backend,\n"
        "--cuda-graph-*, --trust-remote-code, ...: moeserve serve --help lists them) are\n"
        "accepted and named in one warning as not modelled.\n",
        ms_plan_model_names(), ms_plan_gpu_names(), ms_launch_help());
}

static int parse_contexts(const char *v, ms_plan_sweep *s, ms_errbuf *err)
{
    char buf[1024];
    if (strlen(v) >= sizeof buf) return ms_err(err, MS_EINVAL, "--sweep-contexts: too long");
    snprintf(buf, sizeof buf, "%s", v);
    s->n_contexts = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        long n;
        if (s->n_contexts >= MS_PLAN_MAX_SWEEP)
            return ms_err(err, MS_EINVAL, "--sweep-contexts: at most %d values", MS_PLAN_MAX_SWEEP);
        if (ms_parse_long("--sweep-contexts", t, 1, 1L << 34, &n, err)) return MS_EINVAL;
        s->contexts[s->n_contexts++] = n;
    }
    if (!s->n_contexts) return ms_err(err, MS_EINVAL, "--sweep-contexts: no values");
    return 0;
}

/* argv without the GPU-only flags (serve/flag_kinds.h) */
static int plan_main(void *ctx, int argc, char **argv)
{
    const ms_flag_screen *scr = ctx;
    ms_plan_input in;
    ms_plan_input_init(&in);
    ms_errbuf err = {{0}};
    const char *model = NULL, *config = NULL, *gpu = NULL, *weights = NULL;
    const char *plot = "plan-sweep.svg";
    double gpu_mem = -1;
    long nnodes = 0, per_node = 0, num = 0;
    bool json = false;
    ms_sweep_kind sweep = 0;
    static ms_plan_sweep sw; /* large; the command runs once */
    memset(&sw, 0, sizeof sw);
    int rc = ms_launch_apply_env(&in.launch, &err);
    if (rc) goto fail;
    for (int i = 1; i < argc;) {
        rc = ms_launch_parse_arg(&in.launch, argc, argv, &i, &err);
        if (rc < 0) goto fail;
        if (rc == 1) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = true;
            i++;
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        rc = 0;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--model-config"))
            config = v;
        else if (!strcmp(a, "--weights"))
            weights = v;
        else if (!strcmp(a, "--gpu"))
            gpu = v;
        else if (!strcmp(a, "--plot"))
            plot = v;
        else if (!strcmp(a, "--gpu-mem-gb"))
            rc = ms_parse_double(a, v, 0.001, 1e6, &gpu_mem, &err);
        else if (!strcmp(a, "--reserve-gb"))
            rc = ms_parse_double(a, v, 0, 1e6, &in.reserve_gb, &err);
        else if (!strcmp(a, "--mem-fraction-static"))
            rc = ms_parse_double(a, v, 0.01, 1.0, &in.mem_fraction, &err);
        else if (!strcmp(a, "--kv-pool-gib"))
            rc = ms_parse_double(a, v, 0, 1e6, &in.kv_pool_gib, &err);
        else if (!strcmp(a, "--link-gb-per-s"))
            rc = ms_parse_double(a, v, 0.001, 1e6, &in.link_gb_s, &err);
        else if (!strcmp(a, "--num-gpus"))
            rc = ms_parse_long(a, v, 1, MS_LAUNCH_MAX_WIDTH, &num, &err);
        else if (!strcmp(a, "--nnodes"))
            rc = ms_parse_long(a, v, 1, MS_LAUNCH_MAX_WIDTH, &nnodes, &err);
        else if (!strcmp(a, "--gpus-per-node"))
            rc = ms_parse_long(a, v, 1, MS_LAUNCH_MAX_WIDTH, &per_node, &err);
        else if (!strcmp(a, "--context-len")) {
            long n;
            rc = ms_parse_long(a, v, 1, 1L << 34, &n, &err);
            in.context_len = n;
        } else if (!strcmp(a, "--tokens-per-step")) {
            long n;
            rc = ms_parse_long(a, v, 1, 1L << 34, &n, &err);
            in.tokens_per_step = n;
        } else if (!strcmp(a, "--sweep")) {
            if (v && !strcmp(v, "context"))
                sweep = MS_SWEEP_CONTEXT;
            else if (v && !strcmp(v, "layouts"))
                sweep = MS_SWEEP_LAYOUTS;
            else
                rc = ms_err(&err, MS_EINVAL, "--sweep '%s': expected context|layouts", v ? v : "");
        } else if (!strcmp(a, "--sweep-contexts")) {
            rc = v ? parse_contexts(v, &sw, &err) : ms_err(&err, MS_EINVAL, "%s needs a value", a);
        } else {
            rc = ms_err(&err, MS_EINVAL, "unknown flag '%s' (moeserve plan --help)", a);
            goto fail;
        }
        if (rc) goto fail;
        if (!v) {
            rc = ms_err(&err, MS_EINVAL, "%s needs a value", a);
            goto fail;
        }
        i += 2;
    }
    ms_flag_screen_warn_flags(scr, "plan");
    if (in.reserve_gb >= 0 && in.mem_fraction >= 0) {
        rc = ms_err(&err, MS_EINVAL, "give --reserve-gb or --mem-fraction-static, not both");
        goto fail;
    }
    if (!model == !config) {
        rc = ms_err(&err, MS_EINVAL, "give exactly one of --model PRESET or --model-config PATH");
        goto fail;
    }
    rc = model ? ms_plan_model_preset(model, &in.model, &err)
               : ms_plan_model_load(config, &in.model, &err);
    if (rc) goto fail;
    in.weights = in.model.published;
    if (weights) {
        if (!strcmp(weights, "fp8"))
            in.weights = MS_WEIGHTS_FP8;
        else if (!strcmp(weights, "bf16"))
            in.weights = MS_WEIGHTS_BF16;
        else if (!strcmp(weights, "fp4-experts"))
            in.weights = MS_WEIGHTS_FP4_EXPERTS;
        else {
            rc = ms_err(&err, MS_EINVAL, "--weights '%s': expected fp8|bf16|fp4-experts", weights);
            goto fail;
        }
    }
    if (gpu) {
        rc = ms_plan_gpu_preset(gpu, &in.gpu, &err);
        if (rc) goto fail;
        in.have_gpu = true;
        if (gpu_mem > 0) in.gpu.mem_gb = gpu_mem;
        if (in.gpu.family == MS_GPU_CPU && gpu_mem <= 0) {
            rc = ms_err(&err, MS_EINVAL, "--gpu cpu needs --gpu-mem-gb (memory per rank)");
            goto fail;
        }
    } else if (gpu_mem > 0) {
        rc = ms_err(&err, MS_EINVAL, "--gpu-mem-gb needs --gpu");
        goto fail;
    }
    if ((nnodes > 0) != (per_node > 0) || (nnodes > 0 && num > 0)) {
        rc = ms_err(&err, MS_EINVAL, "give --num-gpus N or both --nnodes and --gpus-per-node");
        goto fail;
    }
    in.num_gpus = (int)(nnodes > 0 ? nnodes * per_node : num);
    if (in.num_gpus > MS_LAUNCH_MAX_WIDTH) {
        rc = ms_err(&err, MS_EINVAL, "--nnodes x --gpus-per-node exceeds %d", MS_LAUNCH_MAX_WIDTH);
        goto fail;
    }

    if (sweep) {
        rc = ms_plan_sweep_run(&in, sweep, &sw, &err);
        if (rc) goto fail;
        char title[160];
        snprintf(title, sizeof title, "%s on %s: admitted requests vs context", in.model.name,
                 in.have_gpu ? in.gpu.name : "fixed pool");
        int prc = ms_plan_sweep_plot(&sw, title, plot, &err);
        if (json) {
            json_t *o = ms_plan_sweep_to_json(&sw);
            json_object_set_new(o, "plot", prc ? json_null() : json_string(plot));
            char *s = json_dumps(o, JSON_INDENT(2));
            if (s) puts(s);
            free(s);
            json_decref(o);
        } else {
            ms_plan_sweep_print(stdout, &sw);
            if (!prc) printf("plot written to %s\n", plot);
        }
        if (prc) {
            fprintf(stderr, "moeserve plan: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    static ms_plan_result res;
    rc = ms_plan_run(&in, &res, &err);
    if (rc) goto fail;
    if (json) {
        json_t *o = ms_plan_to_json(&in, &res);
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        ms_plan_print(stdout, &in, &res);
    }
    return 0;
fail:
    fprintf(stderr, "moeserve plan: %s\n", err.msg[0] ? err.msg : ms_strerror(rc));
    return 2;
}

int ms_cmd_plan(int argc, char **argv)
{
    ms_flag_screen scr;
    return ms_flag_screen_gpu_then(&scr, argc, argv, plan_main, &scr);
}
