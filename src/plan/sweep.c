/* sweep.c — the capacity curve of seed 000 §7.4 ("a curve of admitted tokens versus ...
 * cache tier, not one maximum integer"): admitted requests of each context length for the
 * given launch or a family of layouts on the same devices, device tier and (with
 * --enable-hierarchical-cache) the HiCache host tier; printed and plotted with gnuplot.
 * ms_plan_sweep_run is pure (any thread); ms_plan_sweep_plot runs the gnuplot program.
 */
#include "plan/plan.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void short_label(const ms_layout *l, char *buf, size_t cap)
{
    int n = 0;
    if (l->n_replicas > 1) n += snprintf(buf + n, cap - (size_t)n, "%dx ", l->n_replicas);
    if (l->attn_dp > 1) {
        n += snprintf(buf + n, cap - (size_t)n, "DPA%d", l->attn_dp);
        if (l->attn_tp > 1) n += snprintf(buf + n, cap - (size_t)n, "xTP%d", l->attn_tp);
    } else {
        n += snprintf(buf + n, cap - (size_t)n, "TP%d", l->attn_tp);
    }
    if (l->moe_ep > 1)
        n += snprintf(buf + n, cap - (size_t)n, "+EP%d", l->moe_ep);
    else if (l->attn_dp > 1)
        n += snprintf(buf + n, cap - (size_t)n, " MoE-TP%d", l->moe_tp);
    if (l->pp > 1) snprintf(buf + n, cap - (size_t)n, "+PP%d", l->pp);
}

static bool structural(const ms_plan_result *r)
{
    for (int i = 0; i < r->n_violations; i++) {
        const char *v = r->violations[i].rule;
        if (strcmp(v, "weights_fit") && strcmp(v, "request_fit") && strcmp(v, "kv_pool_fit") &&
            strcmp(v, "context_len"))
            return true;
    }
    return false;
}

/* Adds one layout (device tier, and host tier when HiCache is on). */
static int add_series(const ms_plan_input *base, const ms_launch *launch, const char *prefix,
                      ms_plan_sweep *out, ms_errbuf *err)
{
    static ms_plan_input in; /* large; reused (callers are single-threaded per sweep) */
    static ms_plan_result r;
    in = *base;
    in.launch = *launch;
    in.num_gpus = 0;
    bool host = launch->enable_hierarchical_cache;
    if (out->n_series + (host ? 2 : 1) > MS_PLAN_MAX_SWEEP)
        return ms_err(err, MS_ERANGE, "sweep: more than %d series", MS_PLAN_MAX_SWEEP);
    int d = out->n_series++, h = host ? out->n_series++ : -1;
    for (int c = 0; c < out->n_contexts; c++) {
        in.context_len = out->contexts[c];
        int rc = ms_plan_run(&in, &r, err);
        if (rc) return rc;
        if (c == 0) {
            char lab[64];
            short_label(&r.layout, lab, sizeof lab);
            snprintf(out->series[d].label, sizeof out->series[d].label, "%s%s", prefix, lab);
            if (h >= 0) {
                snprintf(out->series[h].label, sizeof out->series[h].label,
                         "%s%s (HiCache host tier)", prefix, lab);
                out->series[h].host_tier = true;
            }
        }
        bool bad = structural(&r);
        out->series[d].requests[c] = bad ? -1 : r.admitted_requests;
        if (h >= 0) {
            double req = r.kv_bytes_per_request;
            int64_t groups = (int64_t)r.layout.attn_dp * r.layout.n_replicas;
            out->series[h].requests[c] =
                bad       ? -1
                : req > 0 ? (int64_t)floor(r.kv_pool_bytes_per_rank * launch->hicache_ratio / req) *
                                groups
                          : 0;
        }
    }
    return 0;
}

int ms_plan_sweep_run(const ms_plan_input *in, ms_sweep_kind kind, ms_plan_sweep *out,
                      ms_errbuf *err)
{
    out->n_series = 0;
    if (out->n_contexts == 0) {
        int64_t max = in->model.max_context;
        for (int64_t c = 4096; c <= max && out->n_contexts < MS_PLAN_MAX_SWEEP - 1; c *= 2)
            out->contexts[out->n_contexts++] = c;
        if (out->n_contexts == 0 || out->contexts[out->n_contexts - 1] != max)
            out->contexts[out->n_contexts++] = max;
    }
    int rc = add_series(in, &in->launch, kind == MS_SWEEP_LAYOUTS ? "launch " : "", out, err);
    if (rc || kind != MS_SWEEP_LAYOUTS) return rc;
    /* The family on the same world size: TP-only, DP-attention at each divisor (MoE TP),
     * and full DP-attention + EP through an all-to-all backend. */
    ms_layout_model lm;
    ms_plan_layout_model(&in->model, &lm);
    ms_layout given;
    ms_errbuf e2;
    (void)ms_layout_resolve(&in->launch, &lm, &given, &e2);
    int W = in->num_gpus > 0 ? in->num_gpus : given.world_size;
    if (W < 1 || W > MS_LAUNCH_MAX_WIDTH) return ms_err(err, MS_EINVAL, "sweep: no world size");
    for (int d = 1; d <= W; d++) {
        if (W % d) continue;
        for (int a2a = 0; a2a < 2; a2a++) {
            if (a2a && (d != W || in->model.n_routed == 0)) continue;
            ms_launch l = in->launch;
            l.tp = W, l.dp = d, l.pp = 1, l.enable_dp_attention = d > 1, l.attn_cp_size = 1;
            l.ep_size = 1, l.moe_dp_size = 1;
            l.a2a = a2a ? MS_A2A_MPI : MS_A2A_NONE;
            l.a2a_alias =
                a2a ? (in->launch.a2a != MS_A2A_NONE ? in->launch.a2a_alias : MS_A2A_ALIAS_DEEPEP)
                    : MS_A2A_ALIAS_NONE;
            if (!l.enable_dp_attention) l.enable_dp_lm_head = false, l.enable_umbp = false;
            ms_layout cand;
            (void)ms_layout_resolve(&l, &lm, &cand, &e2);
            if (cand.attn_tp == given.attn_tp && cand.attn_dp == given.attn_dp &&
                cand.moe_ep == given.moe_ep && cand.pp == given.pp &&
                cand.n_replicas == given.n_replicas && cand.moe_tp == given.moe_tp)
                continue; /* the launch itself */
            rc = add_series(in, &l, "", out, err);
            if (rc) return rc;
        }
    }
    return 0;
}

int ms_plan_sweep_print(FILE *f, const ms_plan_sweep *s)
{
    fprintf(f, "admitted requests (cluster) per context length; '-' = invalid layout\n");
    fprintf(f, "%-40s", "layout / tier");
    for (int c = 0; c < s->n_contexts; c++) fprintf(f, " %9lld", (long long)s->contexts[c]);
    fprintf(f, "\n");
    for (int i = 0; i < s->n_series; i++) {
        fprintf(f, "%-40.40s", s->series[i].label);
        for (int c = 0; c < s->n_contexts; c++) {
            if (s->series[i].requests[c] < 0)
                fprintf(f, " %9s", "-");
            else
                fprintf(f, " %9lld", (long long)s->series[i].requests[c]);
        }
        fprintf(f, "\n");
    }
    return 0;
}

void *ms_plan_sweep_to_json(const ms_plan_sweep *s)
{
    json_t *o = json_object(), *ctx = json_array(), *ser = json_array();
    for (int c = 0; c < s->n_contexts; c++)
        json_array_append_new(ctx, json_integer(s->contexts[c]));
    for (int i = 0; i < s->n_series; i++) {
        json_t *req = json_array();
        for (int c = 0; c < s->n_contexts; c++)
            json_array_append_new(req, s->series[i].requests[c] < 0
                                           ? json_null()
                                           : json_integer(s->series[i].requests[c]));
        json_array_append_new(ser, json_pack("{s:s,s:s,s:o}", "label", s->series[i].label, "tier",
                                             s->series[i].host_tier ? "host" : "device",
                                             "admitted_requests", req));
    }
    json_object_set_new(o, "contexts", ctx);
    json_object_set_new(o, "series", ser);
    return o;
}

static bool safe_text(const char *s)
{
    for (; *s; s++)
        if (*s == '\'' || *s == '"' || *s == '\n' || *s == '\r' || *s == '\\') return false;
    return true;
}

int ms_plan_sweep_plot(const ms_plan_sweep *s, const char *title, const char *path, ms_errbuf *err)
{
    if (!path || !path[0] || !safe_text(path) || strlen(path) > 1024)
        return ms_err(err, MS_EINVAL, "--plot '%s': give a path without quotes or backslashes",
                      path ? path : "");
    size_t n = strlen(path);
    bool png = n > 4 && !strcmp(path + n - 4, ".png");
    bool logy = false;
    for (int i = 0; i < s->n_series; i++)
        for (int c = 0; c < s->n_contexts; c++) logy |= s->series[i].requests[c] > 0;
    char data[] = "/tmp/moeserve-plan-XXXXXX";
    int fd = mkstemp(data);
    if (fd < 0) return ms_err(err, MS_EIO, "--plot: cannot create a temporary data file");
    FILE *df = fdopen(fd, "w");
    if (!df) {
        close(fd);
        unlink(data);
        return ms_err(err, MS_EIO, "--plot: cannot write the data file");
    }
    for (int c = 0; c < s->n_contexts; c++) {
        fprintf(df, "%lld", (long long)s->contexts[c]);
        for (int i = 0; i < s->n_series; i++) {
            int64_t v = s->series[i].requests[c];
            if (v > 0 || (!logy && v == 0))
                fprintf(df, " %lld", (long long)v);
            else
                fprintf(df, " ?");
        }
        fprintf(df, "\n");
    }
    fclose(df);
    int rc = 0;
    FILE *gp = popen("gnuplot 2>/dev/null", "w");
    if (!gp) {
        rc = ms_err(err, MS_EIO, "--plot: cannot run gnuplot (install gnuplot-nox)");
        goto out;
    }
    fprintf(gp, "set terminal %s size 960,600\n", png ? "pngcairo" : "svg dynamic");
    fprintf(gp, "set output '%s'\n", path);
    fprintf(gp, "set title '%s' noenhanced\n", safe_text(title) ? title : "moeserve plan");
    fprintf(gp, "set logscale x 2\nset xtics (");
    for (int c = 0; c < s->n_contexts; c++) {
        long long v = (long long)s->contexts[c];
        if (v % 1048576 == 0)
            fprintf(gp, "%s'%lldM' %lld", c ? ", " : "", v / 1048576, v);
        else if (v % 1024 == 0)
            fprintf(gp, "%s'%lldK' %lld", c ? ", " : "", v / 1024, v);
        else
            fprintf(gp, "%s'%lld' %lld", c ? ", " : "", v, v);
    }
    fprintf(gp, ")\n");
    if (logy) fprintf(gp, "set logscale y 10\n");
    fprintf(gp, "set xlabel 'context length (tokens per request)'\n"
                "set ylabel 'admitted requests (cluster)'\nset grid\nset key left bottom "
                "noenhanced\nset datafile missing '?'\nplot ");
    for (int i = 0; i < s->n_series; i++)
        fprintf(gp, "%s'%s' using 1:%d with linespoints %s title '%s'", i ? ", " : "", data, i + 2,
                s->series[i].host_tier ? "dashtype 2" : "lw 2",
                safe_text(s->series[i].label) ? s->series[i].label : "?");
    fprintf(gp, "\n");
    int st = pclose(gp);
    struct stat sb;
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || stat(path, &sb) || sb.st_size == 0)
        rc = ms_err(err, MS_EIO, "--plot %s: gnuplot failed (is gnuplot installed?)", path);
out:
    unlink(data);
    return rc;
}
