/* cmd_bench.c — `moeserve bench`: the serving benchmark client's command line, flags named as
 * SGLang's bench_serving.  Parses and validates flags (every message names its flag), loads
 * the optional tokenizer, builds the dataset, runs the warmup, the run or each --sweep point
 * (bench_client.c), prints/writes the results (bench_report.c) and draws the progress bar.
 * Main thread only.
 */
#include "tools/bench.h"
#include "tools/commands.h"

#include "base/util.h"

#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct opts {
    const char *backend_name, *base_url, *host, *model, *dataset_name, *dataset_path;
    const char *slo_spec, *output_file, *extra_body, *tokenizer, *sweep, *plot_file;
    long port;
    ms_bench_backend backend;
    ms_bench_data_cfg data;
    double request_rate, timeout_s;
    long max_concurrency, warmup, seed;
    bool stream, ignore_eos, progress;
    ms_bench_slo slo;
    char sweep_axis[16];
    double sweep_values[MS_BENCH_MAX_SWEEP];
    int n_sweep;
} opts;

static void usage(FILE *f)
{
    fprintf(
        f, "usage: moeserve bench [flags]   (a serving benchmark client, flags as SGLang's "
           "bench_serving)\n"
           "\nserver:\n"
           "  --backend moeserve|sglang|openai|openai-chat  moeserve/sglang: POST /generate "
           "(moeserve sends\n"
           "                                 input_ids when --tokenizer is given); openai: "
           "/v1/completions;\n"
           "                                 openai-chat: /v1/chat/completions  (default moeserve; "
           "aliases:\n"
           "                                 sglang-native, sglang-oai, vllm, sglang-oai-chat, "
           "vllm-chat)\n"
           "  --base-url URL | --host H --port N   (default http://127.0.0.1:30000)\n"
           "  --model NAME                   \"model\" of OpenAI requests (default: first of GET "
           "/v1/models)\n"
           "  --request-timeout S            per request (default 21600)\n"
           "  --disable-stream               non-streamed replies (TTFT = E2E)\n"
           "  --disable-ignore-eos           do not send ignore_eos\n"
           "  --extra-request-body JSON      object merged into every request body\n"
           "  (OPENAI_API_KEY in the environment is sent as a Bearer token)\n"
           "dataset:\n"
           "  --dataset-name random|generated-shared-prefix|sharegpt   (default random)\n"
           "  --dataset-path FILE            ShareGPT JSON (list of {\"conversations\": [...]})\n"
           "  --num-prompts N                (default 1000; gsp uses groups x prompts-per-group)\n"
           "  --random-input-len N --random-output-len N   (default 1024 each)\n"
           "  --random-range-ratio R         lengths uniform in [max(floor(len*R),1), len] "
           "(SGLang; default 0)\n"
           "  --gsp-num-groups N (64) --gsp-prompts-per-group N (16) --gsp-system-prompt-len N "
           "(2048)\n"
           "  --gsp-question-len N (128) --gsp-output-len N (256)\n"
           "  --sharegpt-output-len N        override the completion length\n"
           "  --sharegpt-context-len N       drop prompt+output longer than N\n"
           "  --tokenizer PATH               tokenizer.json (or its folder): exact prompt lengths, "
           "output\n"
           "                                 tokens counted when the server reports none\n"
           "  --seed N                       (default 1)\n"
           "load:\n"
           "  --request-rate R               Poisson arrivals, R requests/s; inf = all at once "
           "(default)\n"
           "  --max-concurrency N            at most N requests in flight\n"
           "  --warmup-requests N            first prompt, <= 32 output tokens, before the run "
           "(default 1)\n"
           "  --sweep concurrency:1,4,16|rate:1,2,inf   one run per point, a table and a plot\n"
           "  --plot-file FILE               sweep plot, .svg or .png (default bench-sweep.svg)\n"
           "output:\n"
           "  --slo ttft:MS,tpot:MS,e2el:MS  goodput: requests meeting every given SLO per second\n"
           "  --output-file FILE             append one JSON line per run (SGLang's field names)\n"
           "  --disable-tqdm                 no progress bar\n");
}

static int parse_i64(const char *flag, const char *v, long lo, long hi, int64_t *out,
                     ms_errbuf *err)
{
    long n;
    int rc = ms_parse_long(flag, v, lo, hi, &n, err);
    if (!rc) *out = n;
    return rc;
}

static int parse_rate(const char *flag, const char *v, double *out, ms_errbuf *err)
{
    if (v && !strcmp(v, "inf")) {
        *out = INFINITY;
        return 0;
    }
    if (ms_parse_double(flag, v, 1e-6, 1e9, out, err))
        return ms_err(err, MS_EINVAL, "%s '%s': expected requests per second > 0, or inf", flag,
                      v ? v : "");
    return 0;
}

static int parse_sweep(opts *o, const char *v, ms_errbuf *err)
{
    const char *colon = v ? strchr(v, ':') : NULL;
    if (!colon || (size_t)(colon - v) >= sizeof o->sweep_axis)
        return ms_err(err, MS_EINVAL, "--sweep '%s': expected concurrency:N,N,... or rate:R,R,...",
                      v ? v : "");
    snprintf(o->sweep_axis, sizeof o->sweep_axis, "%.*s", (int)(colon - v), v);
    bool conc = !strcmp(o->sweep_axis, "concurrency"), rate = !strcmp(o->sweep_axis, "rate");
    if (!conc && !rate)
        return ms_err(err, MS_EINVAL, "--sweep '%s': the axis must be concurrency or rate", v);
    char buf[1024];
    if (strlen(colon + 1) >= sizeof buf) return ms_err(err, MS_EINVAL, "--sweep: too long");
    snprintf(buf, sizeof buf, "%s", colon + 1);
    o->n_sweep = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_sweep >= MS_BENCH_MAX_SWEEP)
            return ms_err(err, MS_EINVAL, "--sweep: at most %d points", MS_BENCH_MAX_SWEEP);
        double d;
        if (conc) {
            long n;
            if (ms_parse_long("--sweep concurrency", t, 1, MS_BENCH_MAX_CONCURRENCY, &n, err))
                return MS_EINVAL;
            d = (double)n;
        } else if (parse_rate("--sweep rate", t, &d, err)) {
            return MS_EINVAL;
        }
        o->sweep_values[o->n_sweep++] = d;
    }
    if (!o->n_sweep) return ms_err(err, MS_EINVAL, "--sweep '%s': no points", v);
    return 0;
}

static int parse_backend(opts *o, const char *v, ms_errbuf *err)
{
    static const struct {
        const char *name;
        ms_bench_backend b;
    } names[] = {{"moeserve", MS_BENCH_MOESERVE},       {"sglang", MS_BENCH_SGLANG},
                 {"sglang-native", MS_BENCH_SGLANG},    {"openai", MS_BENCH_OPENAI},
                 {"sglang-oai", MS_BENCH_OPENAI},       {"vllm", MS_BENCH_OPENAI},
                 {"openai-chat", MS_BENCH_OPENAI_CHAT}, {"sglang-oai-chat", MS_BENCH_OPENAI_CHAT},
                 {"vllm-chat", MS_BENCH_OPENAI_CHAT}};
    for (size_t i = 0; v && i < MS_ARRAY_LEN(names); i++)
        if (!strcmp(v, names[i].name)) {
            o->backend = names[i].b;
            o->backend_name = v;
            return 0;
        }
    return ms_err(err, MS_EINVAL,
                  "--backend '%s': expected moeserve, sglang, openai or openai-chat", v ? v : "");
}

static int parse_args(opts *o, int argc, char **argv, bool *help, ms_errbuf *err)
{
    for (int i = 1; i < argc;) {
        char flag[64];
        const char *a = argv[i], *v;
        const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        if (eq && (size_t)(eq - a) < sizeof flag) {
            snprintf(flag, sizeof flag, "%.*s", (int)(eq - a), a);
            a = flag;
            v = eq + 1;
            i += 1;
        } else {
            v = i + 1 < argc ? argv[i + 1] : NULL;
            i += 2;
        }
        bool is_switch = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            *help = true;
        else if (!strcmp(a, "--disable-stream"))
            o->stream = false;
        else if (!strcmp(a, "--disable-ignore-eos"))
            o->ignore_eos = false;
        else if (!strcmp(a, "--disable-tqdm"))
            o->progress = false;
        else
            is_switch = false;
        if (is_switch) {
            if (eq) return ms_err(err, MS_EINVAL, "%s takes no value", a);
            i -= 1;
            continue;
        }
        if (!v) {
            static const char *const valued[] = {"--backend",
                                                 "--base-url",
                                                 "--host",
                                                 "--port",
                                                 "--model",
                                                 "--dataset-name",
                                                 "--dataset-path",
                                                 "--num-prompts",
                                                 "--num-prompt",
                                                 "--random-input-len",
                                                 "--random-input",
                                                 "--random-output-len",
                                                 "--random-output",
                                                 "--random-range-ratio",
                                                 "--gsp-num-groups",
                                                 "--gsp-prompts-per-group",
                                                 "--gsp-system-prompt-len",
                                                 "--gsp-question-len",
                                                 "--gsp-output-len",
                                                 "--sharegpt-output-len",
                                                 "--sharegpt-context-len",
                                                 "--request-rate",
                                                 "--max-concurrency",
                                                 "--warmup-requests",
                                                 "--seed",
                                                 "--request-timeout",
                                                 "--slo",
                                                 "--output-file",
                                                 "--extra-request-body",
                                                 "--tokenizer",
                                                 "--sweep",
                                                 "--plot-file"};
            for (size_t k = 0; k < MS_ARRAY_LEN(valued); k++)
                if (!strcmp(a, valued[k])) return ms_err(err, MS_EINVAL, "%s needs a value", a);
            return ms_err(err, MS_EINVAL, "unknown flag '%s' (see moeserve bench --help)", a);
        }
        int rc = 0;
        ms_bench_data_cfg *d = &o->data;
        if (!strcmp(a, "--backend"))
            rc = parse_backend(o, v, err);
        else if (!strcmp(a, "--base-url"))
            o->base_url = v;
        else if (!strcmp(a, "--host"))
            o->host = v;
        else if (!strcmp(a, "--port"))
            rc = ms_parse_long(a, v, 1, 65535, &o->port, err);
        else if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--dataset-name"))
            o->dataset_name = v;
        else if (!strcmp(a, "--dataset-path"))
            o->dataset_path = v;
        else if (!strcmp(a, "--num-prompts") || !strcmp(a, "--num-prompt"))
            rc = parse_i64(a, v, 1, MS_BENCH_MAX_PROMPTS, &d->num_prompts, err);
        else if (!strcmp(a, "--random-input-len") || !strcmp(a, "--random-input"))
            rc = parse_i64(a, v, 1, MS_BENCH_MAX_LEN, &d->random_input_len, err);
        else if (!strcmp(a, "--random-output-len") || !strcmp(a, "--random-output"))
            rc = parse_i64(a, v, 1, MS_BENCH_MAX_LEN, &d->random_output_len, err);
        else if (!strcmp(a, "--random-range-ratio"))
            rc = ms_parse_double(a, v, 0, 1, &d->random_range_ratio, err);
        else if (!strcmp(a, "--gsp-num-groups"))
            rc = parse_i64(a, v, 1, MS_BENCH_MAX_PROMPTS, &d->gsp_num_groups, err);
        else if (!strcmp(a, "--gsp-prompts-per-group"))
            rc = parse_i64(a, v, 1, MS_BENCH_MAX_PROMPTS, &d->gsp_prompts_per_group, err);
        else if (!strcmp(a, "--gsp-system-prompt-len"))
            rc = parse_i64(a, v, 1, MS_BENCH_MAX_LEN, &d->gsp_system_prompt_len, err);
        else if (!strcmp(a, "--gsp-question-len"))
            rc = parse_i64(a, v, 1, MS_BENCH_MAX_LEN, &d->gsp_question_len, err);
        else if (!strcmp(a, "--gsp-output-len"))
            rc = parse_i64(a, v, 1, MS_BENCH_MAX_LEN, &d->gsp_output_len, err);
        else if (!strcmp(a, "--sharegpt-output-len"))
            rc = parse_i64(a, v, 4, MS_BENCH_MAX_LEN, &d->sharegpt_output_len, err);
        else if (!strcmp(a, "--sharegpt-context-len"))
            rc = parse_i64(a, v, 4, MS_BENCH_MAX_LEN, &d->sharegpt_context_len, err);
        else if (!strcmp(a, "--request-rate"))
            rc = parse_rate(a, v, &o->request_rate, err);
        else if (!strcmp(a, "--max-concurrency"))
            rc = ms_parse_long(a, v, 1, MS_BENCH_MAX_CONCURRENCY, &o->max_concurrency, err);
        else if (!strcmp(a, "--warmup-requests"))
            rc = ms_parse_long(a, v, 0, MS_BENCH_MAX_CONCURRENCY, &o->warmup, err);
        else if (!strcmp(a, "--seed"))
            rc = ms_parse_long(a, v, 0, 0x7fffffffL, &o->seed, err);
        else if (!strcmp(a, "--request-timeout"))
            rc = ms_parse_double(a, v, 0.001, 1e7, &o->timeout_s, err);
        else if (!strcmp(a, "--slo")) {
            o->slo_spec = v;
            rc = ms_bench_slo_parse(v, &o->slo, err);
        } else if (!strcmp(a, "--output-file"))
            o->output_file = v;
        else if (!strcmp(a, "--extra-request-body"))
            o->extra_body = v;
        else if (!strcmp(a, "--tokenizer"))
            o->tokenizer = v;
        else if (!strcmp(a, "--sweep")) {
            o->sweep = v;
            rc = parse_sweep(o, v, err);
        } else if (!strcmp(a, "--plot-file"))
            o->plot_file = v;
        else
            return ms_err(err, MS_EINVAL, "unknown flag '%s' (see moeserve bench --help)", a);
        if (rc) return rc;
    }
    if (!o->dataset_name) o->dataset_name = "random";
    if (!strcmp(o->dataset_name, "random"))
        o->data.kind = MS_BENCH_DATA_RANDOM;
    else if (!strcmp(o->dataset_name, "generated-shared-prefix"))
        o->data.kind = MS_BENCH_DATA_GSP;
    else if (!strcmp(o->dataset_name, "sharegpt"))
        o->data.kind = MS_BENCH_DATA_SHAREGPT;
    else
        return ms_err(err, MS_EINVAL,
                      "--dataset-name '%s': expected random, "
                      "generated-shared-prefix or sharegpt",
                      o->dataset_name);
    if (o->data.kind == MS_BENCH_DATA_SHAREGPT && !o->dataset_path)
        return ms_err(err, MS_EINVAL,
                      "--dataset-name sharegpt needs --dataset-path FILE "
                      "(ShareGPT_V3_unfiltered_cleaned_split.json)");
    if (o->data.kind == MS_BENCH_DATA_GSP &&
        o->data.gsp_num_groups * o->data.gsp_prompts_per_group > MS_BENCH_MAX_PROMPTS)
        return ms_err(err, MS_EINVAL, "--gsp-num-groups x --gsp-prompts-per-group exceeds %d",
                      MS_BENCH_MAX_PROMPTS);
    if (o->base_url && (o->host || o->port))
        return ms_err(err, MS_EINVAL, "--base-url and --host/--port are exclusive");
    if (o->sweep && !strcmp(o->sweep_axis, "rate") && isfinite(o->request_rate))
        return ms_err(err, MS_EINVAL, "--sweep rate:... and --request-rate are exclusive");
    if (o->sweep && !strcmp(o->sweep_axis, "concurrency") && o->max_concurrency)
        return ms_err(err, MS_EINVAL,
                      "--sweep concurrency:... and --max-concurrency are exclusive");
    if (o->plot_file && !o->sweep) return ms_err(err, MS_EINVAL, "--plot-file needs --sweep");
    return 0;
}

/* ---- progress ----------------------------------------------------------------------------- */

typedef struct progress {
    bool tty, on;
    int last_tenth;
    double t0, last_draw;
} progress;

static void on_progress(void *ctx, size_t done, size_t failed, size_t total)
{
    progress *p = ctx;
    if (!p->on) return;
    double now = ms_now_s();
    if (p->tty) {
        if (done != total && now - p->last_draw < 0.1) return;
        p->last_draw = now;
        int w = 30, fill = total ? (int)((double)done * w / (double)total) : w;
        char bar[64];
        for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
        bar[w] = 0;
        double el = now - p->t0;
        fprintf(stderr, "\r[%s] %zu/%zu  failed %zu  %.1f s  %.2f req/s ", bar, done, total, failed,
                el, el > 0 ? (double)done / el : 0.0);
        if (done == total) fprintf(stderr, "\n");
        return;
    }
    int tenth = total ? (int)(done * 10 / total) : 10;
    if (tenth == p->last_tenth) return;
    p->last_tenth = tenth;
    fprintf(stderr, "bench: %zu/%zu requests done, %zu failed, %.1f s\n", done, total, failed,
            now - p->t0);
}

/* ---- helpers ------------------------------------------------------------------------------ */

static const char *endpoint(ms_bench_backend b)
{
    switch (b) {
    case MS_BENCH_MOESERVE:
    case MS_BENCH_SGLANG:
        return "/generate";
    case MS_BENCH_OPENAI:
        return "/v1/completions";
    case MS_BENCH_OPENAI_CHAT:
        return "/v1/chat/completions";
    }
    return "/generate";
}

static size_t collect(char *p, size_t sz, size_t nm, void *ud)
{
    json_t **acc = ud;
    size_t n = sz * nm;
    const char *cur = json_string_value(*acc);
    size_t have = cur ? strlen(cur) : 0;
    if (have + n > 1 << 20) return 0;
    char *b = malloc(have + n + 1);
    if (!b) return 0;
    memcpy(b, cur ? cur : "", have);
    memcpy(b + have, p, n);
    b[have + n] = 0;
    json_decref(*acc);
    *acc = json_stringn_nocheck(b, have + n);
    free(b);
    return n;
}

/* GET base + path → its JSON body (owned), or NULL. */
static json_t *get_json(const char *base, const char *path, const char *api_key)
{
    char url[2048];
    snprintf(url, sizeof url, "%s%s", base, path);
    CURL *e = curl_easy_init();
    if (!e) return NULL;
    json_t *acc = NULL;
    struct curl_slist *h = NULL;
    if (api_key) {
        char hb[512];
        snprintf(hb, sizeof hb, "Authorization: Bearer %s", api_key);
        h = curl_slist_append(h, hb);
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &acc);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    long status = 0;
    json_t *o = NULL;
    if (curl_easy_perform(e) == CURLE_OK &&
        !curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status) && status == 200 && acc)
        o = json_loads(json_string_value(acc), 0, NULL);
    json_decref(acc);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return o;
}

/* GET base/v1/models → data[0].id (owned), or NULL. */
static char *discover_model(const char *base, const char *api_key)
{
    json_t *o = get_json(base, "/v1/models", api_key);
    const char *s =
        json_string_value(json_object_get(json_array_get(json_object_get(o, "data"), 0), "id"));
    char *id = s ? strdup(s) : NULL;
    json_decref(o);
    return id;
}

/* The server's speculative accept length (/server_info avg_spec_accept_length), 0: none. */
static double server_accept_length(const char *base, const char *api_key)
{
    json_t *o = get_json(base, "/server_info", api_key);
    double v = json_number_value(json_object_get(o, "avg_spec_accept_length"));
    json_decref(o);
    return v > 0 ? v : 0;
}

static int load_tokenizer(const char *path, ms_tokenizer **tok, ms_errbuf *err)
{
    char buf[4096];
    struct stat st;
    if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
        if (!ms_path_join(buf, sizeof buf, path, "tokenizer.json"))
            return ms_err(err, MS_EINVAL, "--tokenizer: path too long");
        path = buf;
    }
    ms_errbuf e2 = {{0}};
    int rc = ms_tokenizer_load(tok, path, &e2);
    if (rc) return ms_err(err, rc, "--tokenizer %s: %s", path, e2.msg);
    return 0;
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* One run over the dataset; fills *m and appends/prints.  Returns 0 or an error. */
static int run_once(const opts *o, const ms_bench_client_cfg *cc, const ms_bench_dataset *ds,
                    double rate, int maxc, const char *base, const char *api_key,
                    ms_bench_metrics *m, ms_errbuf *err)
{
    ms_bench_result *res = calloc(ds->n, sizeof *res);
    if (!res) return ms_err(err, MS_ENOMEM, "out of memory");
    progress pg = {.tty = isatty(2), .on = o->progress, .last_tenth = 0, .t0 = ms_now_s()};
    ms_bench_run_cfg rc = {.request_rate = rate,
                           .max_concurrency = maxc,
                           .seed = (uint64_t)o->seed,
                           .progress = on_progress,
                           .progress_ctx = &pg};
    ms_bench_run_out ro;
    int r = ms_bench_client_run(cc, &rc, ds->rows, ds->n, res, &ro, err);
    if (!r) r = ms_bench_metrics_compute(res, ds->n, ro.duration_s, &o->slo, m);
    if (!r) {
        ms_bench_run_info info = {.backend = o->backend_name,
                                  .dataset_name = o->dataset_name,
                                  .request_rate = rate,
                                  .max_concurrency = maxc,
                                  .num_prompts = (int64_t)ds->n,
                                  .random_input_len = o->data.random_input_len,
                                  .random_output_len = o->data.random_output_len,
                                  .sharegpt_output_len = o->data.sharegpt_output_len,
                                  .random_range_ratio = o->data.random_range_ratio,
                                  .slo = &o->slo,
                                  .peak_in_flight = ro.peak_in_flight,
                                  .spec_accept_length = server_accept_length(base, api_key)};
        ms_bench_report_print(stdout, &info, m);
        for (size_t i = 0, shown = 0; i < ds->n && shown < 3; i++)
            if (!res[i].ok) {
                fprintf(stdout, "failed request %zu: %s\n", i, res[i].err);
                shown++;
            }
        fflush(stdout);
        if (o->output_file) {
            json_t *row = ms_bench_report_json(&info, m, res, ds->n);
            r = row ? ms_bench_report_append(o->output_file, row, err)
                    : ms_err(err, MS_ENOMEM, "out of memory");
            json_decref(row);
        }
    }
    for (size_t i = 0; i < ds->n; i++) ms_bench_result_deinit(&res[i]);
    free(res);
    return r;
}

static int warmup(const opts *o, const ms_bench_client_cfg *cc, const ms_bench_dataset *ds,
                  ms_errbuf *err)
{
    size_t n = (size_t)o->warmup;
    ms_bench_prompt *w = calloc(n, sizeof *w);
    ms_bench_result *res = calloc(n, sizeof *res);
    int rc = 0;
    if (!w || !res) {
        rc = ms_err(err, MS_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) w[i] = ds->rows[0];
    fprintf(stderr, "bench: warmup with %zu request(s)\n", n);
    ms_bench_run_cfg rcfg = {.request_rate = INFINITY, .max_output = 32};
    ms_bench_run_out ro;
    if ((rc = ms_bench_client_run(cc, &rcfg, w, n, res, &ro, err))) goto out;
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) ok += res[i].ok;
    if (!ok)
        rc = ms_err(err, MS_EIO,
                    "warmup failed (all %zu requests) — check --backend, --base-url "
                    "and the server: %s",
                    n, res[0].err);
out:
    if (res)
        for (size_t i = 0; i < n; i++) ms_bench_result_deinit(&res[i]);
    free(res);
    free(w);
    return rc;
}

int ms_cmd_bench(int argc, char **argv)
{
    opts o = {.backend_name = "moeserve",
              .backend = MS_BENCH_MOESERVE,
              .request_rate = INFINITY,
              .timeout_s = 21600,
              .warmup = 1,
              .seed = 1,
              .stream = true,
              .ignore_eos = true,
              .progress = true};
    o.slo.ttft_ms = o.slo.tpot_ms = o.slo.e2el_ms = -1;
    o.data = (ms_bench_data_cfg){.num_prompts = 1000,
                                 .random_input_len = 1024,
                                 .random_output_len = 1024,
                                 .gsp_num_groups = 64,
                                 .gsp_prompts_per_group = 16,
                                 .gsp_system_prompt_len = 2048,
                                 .gsp_question_len = 128,
                                 .gsp_output_len = 256};
    ms_errbuf err = {{0}};
    bool help = false;
    ms_tokenizer *tok = NULL;
    json_t *extra = NULL;
    char *model = NULL;
    ms_bench_dataset ds = {0};
    ms_bench_sweep_point *pts = NULL;
    int rc = parse_args(&o, argc, argv, &help, &err);
    if (help) {
        usage(stdout);
        return 0;
    }
    if (rc) goto fail;
    if (o.extra_body) {
        json_error_t je;
        extra = json_loads(o.extra_body, 0, &je);
        if (!json_is_object(extra)) {
            rc = ms_err(&err, MS_EINVAL, "--extra-request-body: expected a JSON object (%s)",
                        extra ? "got another JSON value" : je.text);
            goto fail;
        }
    }
    if (o.tokenizer && (rc = load_tokenizer(o.tokenizer, &tok, &err))) goto fail;
    o.data.path = o.dataset_path;
    o.data.seed = (uint64_t)o.seed;
    o.data.tok = tok;
    if ((rc = ms_bench_dataset_build(&o.data, &ds, &err))) goto fail;
    if (ds.n == 0) {
        rc = ms_err(&err, MS_EINVAL, "the dataset is empty");
        goto fail;
    }
    char base[2048], url[2100];
    if (o.base_url)
        snprintf(base, sizeof base, "%s", o.base_url);
    else
        snprintf(base, sizeof base, "http://%s:%ld", o.host ? o.host : "127.0.0.1",
                 o.port ? o.port : 30000);
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/') base[--bl] = 0;
    snprintf(url, sizeof url, "%s%s", base, endpoint(o.backend));
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        rc = ms_err(&err, MS_EIO, "curl_global_init failed");
        goto fail;
    }
    const char *api_key = getenv("OPENAI_API_KEY");
    if (api_key && !api_key[0]) api_key = NULL;
    if (!o.model && (o.backend == MS_BENCH_OPENAI || o.backend == MS_BENCH_OPENAI_CHAT))
        model = discover_model(base, api_key);
    ms_bench_client_cfg cc = {.backend = o.backend,
                              .url = url,
                              .model = o.model ? o.model : model,
                              .stream = o.stream,
                              .ignore_eos = o.ignore_eos,
                              .extra = extra,
                              .timeout_s = o.timeout_s,
                              .api_key = api_key,
                              .tok = tok};
    int64_t sum_in = 0;
    for (size_t i = 0; i < ds.n; i++) sum_in += ds.rows[i].prompt_len;
    fprintf(stderr, "bench: %s, %zu prompts (%s), %lld input tokens%s, POST %s\n", o.backend_name,
            ds.n, o.dataset_name, (long long)sum_in, ds.exact ? "" : " (estimated: no --tokenizer)",
            url);
    if (o.warmup > 0 && (rc = warmup(&o, &cc, &ds, &err))) goto fail_curl;
    int64_t completed = 0;
    if (!o.sweep) {
        ms_bench_metrics m;
        if ((rc = run_once(&o, &cc, &ds, o.request_rate, (int)o.max_concurrency, base, api_key, &m,
                           &err)))
            goto fail_curl;
        completed = m.completed;
    } else {
        pts = calloc((size_t)o.n_sweep, sizeof *pts);
        if (!pts) {
            rc = ms_err(&err, MS_ENOMEM, "out of memory");
            goto fail_curl;
        }
        bool conc = !strcmp(o.sweep_axis, "concurrency");
        for (int i = 0; i < o.n_sweep; i++) {
            double v = o.sweep_values[i];
            pts[i].value = v;
            fprintf(stderr, "bench: sweep point %s=%g\n", o.sweep_axis, v);
            rc = run_once(&o, &cc, &ds, conc ? o.request_rate : v,
                          conc ? (int)v : (int)o.max_concurrency, base, api_key, &pts[i].m, &err);
            if (rc) goto fail_curl;
            completed += pts[i].m.completed;
        }
        ms_bench_report_sweep_table(stdout, o.sweep_axis, pts, o.n_sweep);
        const char *plot = o.plot_file ? o.plot_file : "bench-sweep.svg";
        if ((rc = ms_bench_report_sweep_plot(plot, o.sweep_axis, pts, o.n_sweep, &err)))
            goto fail_curl;
        printf("plot: %s\n", plot);
    }
    if (!completed) {
        rc = ms_err(&err, MS_EIO, "no request completed");
        goto fail_curl;
    }
    curl_global_cleanup();
    free(pts);
    free(model);
    json_decref(extra);
    ms_bench_dataset_deinit(&ds);
    ms_tokenizer_free(tok);
    return 0;
fail_curl:
    curl_global_cleanup();
fail:
    fprintf(stderr, "bench: %s\n", err.msg[0] ? err.msg : ms_strerror(rc));
    free(pts);
    free(model);
    json_decref(extra);
    ms_bench_dataset_deinit(&ds);
    ms_tokenizer_free(tok);
    return rc == MS_EINVAL ? 2 : 1;
}
