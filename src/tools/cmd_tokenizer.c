/* cmd_tokenizer.c — `moeserve tokenizer`: the build-time tokenizer steps of
 * tools/train/ on the engine's own code, so training and serving tokenize
 * alike.
 *   train  --vocab N --out DIR --list FILE   learns byte-level BPE
 *          (tokenizer_train.c) on the files named in FILE (one path a line,
 *          read in that order, joined by "\n") and writes DIR/tokenizer.json;
 *   encode --model DIR --out F.bin --list FILE   writes, for each listed
 *          file in order, BOS then its ids, as little-endian int32.
 * Main thread; no state beyond one call.
 */
#include "base/error.h"
#include "base/util.h"
#include "model/tokenizer.h"
#include "tools/commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST_BYTES   (1u << 20)  /* the file list itself */
#define MAX_FILE_BYTES   (64u << 20) /* one listed file */
#define MAX_CORPUS_BYTES (256u << 20)

static void usage(FILE *f)
{
    fprintf(f, "usage: moeserve tokenizer train --vocab N --out DIR --list FILE\n"
               "       moeserve tokenizer encode --model DIR --out IDS.bin --list FILE\n"
               "FILE names one input file a line; encode writes BOS + ids per file (int32 LE)\n");
}

/* Splits the list file into paths (in place); returns the count or -1. */
static int read_list(const char *list, char **text, char ***paths)
{
    size_t len;
    if (ms_read_file(list, MAX_LIST_BYTES, text, &len)) {
        fprintf(stderr, "tokenizer: --list %s: cannot read\n", list);
        return -1;
    }
    int n = 0, cap = 0;
    *paths = NULL;
    for (char *p = *text; *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        if (*p) {
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                char **q = realloc(*paths, sizeof *q * (size_t)cap);
                if (!q) return -1;
                *paths = q;
            }
            (*paths)[n++] = p;
        }
        if (!nl) break;
        p = nl + 1;
    }
    if (n == 0) fprintf(stderr, "tokenizer: --list %s: no files\n", list);
    return n ? n : -1;
}

static int do_train(long vocab, const char *out, char **paths, int n)
{
    char *corpus = NULL;
    size_t used = 0;
    int rc = 1;
    for (int i = 0; i < n; i++) {
        char *t = NULL;
        size_t len;
        if (ms_read_file(paths[i], MAX_FILE_BYTES, &t, &len)) {
            fprintf(stderr, "tokenizer: %s: cannot read\n", paths[i]);
            goto out;
        }
        if (used + len + 1 > MAX_CORPUS_BYTES) {
            fprintf(stderr, "tokenizer: corpus over %u MB\n", MAX_CORPUS_BYTES >> 20);
            free(t);
            goto out;
        }
        char *c = realloc(corpus, used + len + 2);
        if (!c) {
            free(t);
            goto out;
        }
        corpus = c;
        memcpy(corpus + used, t, len);
        used += len;
        corpus[used++] = '\n';
        free(t);
    }
    char path[1200];
    ms_errbuf err = {{0}};
    if (!ms_path_join(path, sizeof path, out, "tokenizer.json")) {
        fprintf(stderr, "tokenizer: --out path too long\n");
        goto out;
    }
    double t0 = ms_now_s();
    if (ms_tokenizer_train_write(corpus, used, (int32_t)vocab, path, &err)) {
        fprintf(stderr, "tokenizer: %s\n", err.msg);
        goto out;
    }
    printf("tokenizer: %d files, %zu bytes, vocab %ld -> %s (%.1f s)\n", n, used, vocab, path,
           ms_now_s() - t0);
    rc = 0;
out:
    free(corpus);
    return rc;
}

static int do_encode(const char *model, const char *out, char **paths, int n)
{
    char path[1200];
    ms_errbuf err = {{0}};
    ms_tokenizer *tok = NULL;
    FILE *f = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    if (!ms_path_join(path, sizeof path, model, "tokenizer.json")) {
        fprintf(stderr, "tokenizer: --model path too long\n");
        return 1;
    }
    if (ms_tokenizer_load(&tok, path, &err)) {
        fprintf(stderr, "tokenizer: %s: %s\n", path, err.msg);
        return 1;
    }
    int32_t bos =
        ms_tokenizer_token_id(tok, "<\xef\xbd\x9c"
                                   "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    if (bos < 0) {
        fprintf(stderr, "tokenizer: %s has no <｜begin▁of▁sentence｜>\n", path);
        goto out;
    }
    if (!(f = fopen(out, "wb"))) {
        fprintf(stderr, "tokenizer: --out %s: cannot open\n", out);
        goto out;
    }
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        char *t = NULL;
        size_t len, got = 0;
        if (ms_read_file(paths[i], MAX_FILE_BYTES, &t, &len)) {
            fprintf(stderr, "tokenizer: %s: cannot read\n", paths[i]);
            goto out;
        }
        free(ids);
        ids = malloc(sizeof *ids * (len + 2));
        /* the text is code, not a prompt: special-token strings in it stay text */
        int e = ids ? ms_tokenizer_encode(tok, t, len, 0, ids + 1, len + 1, &got, &err) : MS_ENOMEM;
        free(t);
        if (e) {
            fprintf(stderr, "tokenizer: %s: %s\n", paths[i],
                    e == MS_ENOMEM ? "out of memory" : err.msg);
            goto out;
        }
        ids[0] = bos;
        if (fwrite(ids, sizeof *ids, got + 1, f) != got + 1) {
            fprintf(stderr, "tokenizer: --out %s: write failed\n", out);
            goto out;
        }
        total += (int64_t)got + 1;
    }
    if (fclose(f) != 0) {
        f = NULL;
        fprintf(stderr, "tokenizer: --out %s: write failed\n", out);
        goto out;
    }
    f = NULL;
    printf("tokenizer: %d files -> %lld ids in %s\n", n, (long long)total, out);
    rc = 0;
out:
    if (f) fclose(f);
    free(ids);
    ms_tokenizer_free(tok);
    return rc;
}

int ms_cmd_tokenizer(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *mode = argv[1], *out = NULL, *list = NULL, *model = NULL;
    long vocab = 0;
    int train = !strcmp(mode, "train");
    if (!train && strcmp(mode, "encode")) {
        fprintf(stderr, "tokenizer: unknown mode '%s' (train or encode)\n", mode);
        usage(stderr);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "tokenizer: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        ms_errbuf err = {{0}};
        if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--list"))
            list = v;
        else if (train && !strcmp(a, "--vocab")) {
            if (ms_parse_long(a, v, 1, 1 << 20, &vocab, &err)) {
                fprintf(stderr, "tokenizer: %s\n", err.msg);
                return 2;
            }
        } else if (!train && (!strcmp(a, "--model") || !strcmp(a, "--model-path")))
            model = v;
        else {
            fprintf(stderr, "tokenizer %s: unknown flag %s\n", mode, a);
            usage(stderr);
            return 2;
        }
    }
    if (!out || !list || (train ? vocab == 0 : !model)) {
        fprintf(stderr, "tokenizer %s: need --out, --list and %s\n", mode,
                train ? "--vocab" : "--model");
        return 2;
    }
    char *text = NULL, **paths = NULL;
    int n = read_list(list, &text, &paths);
    int rc = n < 0 ? 1 : train ? do_train(vocab, out, paths, n) : do_encode(model, out, paths, n);
    free(paths);
    free(text);
    return rc;
}
