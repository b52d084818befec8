// FUZZ_SOURCES: src/model/tokenizer.c src/model/tokenizer_encode.c
// FUZZ_SOURCES: src/model/tokenizer_train.c src/model/tokenizer_corpus.c
// FUZZ_SOURCES: src/base/error.c src/base/util.c src/base/log.c
// FUZZ_LIBS: -ljansson -lpcre2-8 -lm -pthread
/* fuzz_tokenizer.c — libFuzzer target for the tokenizer.
 *
 * Input byte 0 picks the mode:
 *   0..199   encode bytes[1..] with a trained 1024-id tokenizer (parse_special
 *            on for even values); valid UTF-8 must round-trip exactly through
 *            decode, invalid UTF-8 must give MS_EINVAL;
 *   200..249 decode the input read as little-endian 16-bit ids (some out of
 *            range) and fetch token bytes;
 *   250..255 load bytes[1..] as a tokenizer.json (must fail cleanly or load).
 * Built and run by tools/run_fuzz.sh (clang -fsanitize=fuzzer,address,undefined
 * with the FUZZ_SOURCES/FUZZ_LIBS above); seeds in fuzz/corpus/fuzz_tokenizer.
 */
#include "model/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ms_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char path[] = "/tmp/fuzz_tokenizer_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) abort();
    close(fd);
    ms_errbuf err;
    if (ms_tokenizer_train_write(NULL, 0, 1024, path, &err) != 0 ||
        ms_tokenizer_load(&tok, path, &err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    remove(path);
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            k = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 4;
            cp = c & 0x07;
        } else
            return 0;
        if (i + k > n) return 0;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    uint8_t mode = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    ms_errbuf err;
    if (mode < 200) {
        int32_t *ids = malloc((len + 1) * sizeof *ids);
        size_t n = 0;
        int rc = ms_tokenizer_encode(tok, text, len, mode % 2 == 0, ids, len + 1, &n, &err);
        if (!valid_utf8(data + 1, len)) {
            if (rc != MS_EINVAL) abort();
        } else {
            if (rc != 0 || n > len) abort();
            char *out = NULL;
            size_t out_len = 0;
            if (ms_tokenizer_decode(tok, ids, n, 0, &out, &out_len, &err) != 0) abort();
            if (out_len != len || memcmp(out, text, len) != 0) abort();
            free(out);
        }
        free(ids);
    } else if (mode < 250) {
        size_t n = len / 2;
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)(data[1 + 2 * i] | data[2 + 2 * i] << 8) - 2000;
        char *out = NULL;
        size_t out_len = 0;
        int rc = ms_tokenizer_decode(tok, ids, n, mode & 1, &out, &out_len, &err);
        if (rc == 0 && strlen(out) > out_len) abort();
        free(out);
        char buf[64];
        size_t k;
        for (size_t i = 0; i < n; i++) ms_tokenizer_token_bytes(tok, ids[i], buf, sizeof buf, &k);
        free(ids);
    } else {
        ms_tokenizer *t = NULL;
        if (ms_tokenizer_load_text(&t, text, len, &err) == 0) {
            int32_t ids[64];
            size_t n = 0;
            ms_tokenizer_encode(t, "Hello, world! 123 你好", 24, 1, ids, 64, &n, &err);
            ms_tokenizer_free(t);
        }
    }
    return 0;
}
