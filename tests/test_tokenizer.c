/* test_tokenizer.c — tests of src/model/tokenizer*.c.
 *
 * Without arguments: unit tests on small hand-written tokenizer.json files
 * (merges in both forms, rank order, added tokens, special parsing on/off,
 * Split behaviours, ByteLevel regex and prefix space, invalid UTF-8, decode
 * with skip_special, unsupported configurations) and on trained tokenizers
 * (exact vocab size, DeepSeek special-token layout, round trip, determinism,
 * concurrent encoding).
 * With `--train VOCAB PATH`: writes a trained tokenizer.json (for comparison
 * with the real one).  With `--golden TOKENIZER_JSON GOLDEN_JSONL`: checks every line's ids (made
 * by tests/tokenizer_golden.js with the JS reference encoder) and the round trip, plus the
 * U+0085/U+FEFF cases where Rust (Oniguruma) and PCRE2 agree but JavaScript differs (used by
 * tests/t_tokenizer_dsv3.sh).
 */
#include "base/util.h"
#include "harness.h"
#include "model/tokenizer_internal.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------- */

/* Builds a tokenizer.json: ids 0..255 are the bytes (GPT-2 mapped), `extra`
 * adds "token": id pairs, then merges/added tokens/pre-tokenizer as given. */
static char *make_json(const char *extra, const char *merges, const char *added, const char *pretok,
                       const char *normalizer)
{
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        uint32_t cp = ms_tok_byte_to_cp((uint8_t)b);
        char c[8] = {0};
        if (cp < 0x80)
            c[0] = (char)cp;
        else {
            c[0] = (char)(0xC0 | (cp >> 6));
            c[1] = (char)(0x80 | (cp & 0x3F));
        }
        if (c[0] == '"' || c[0] == '\\')
            n += (size_t)snprintf(s + n, cap - n, "\"\\%s\":%d,", c, b);
        else
            n += (size_t)snprintf(s + n, cap - n, "\"%s\":%d,", c, b);
    }
    n--; /* drop the last comma */
    n += (size_t)snprintf(s + n, cap - n, "%s%s},\"merges\":[%s]},\"added_tokens\":[%s],",
                          extra[0] ? "," : "", extra, merges, added);
    n += (size_t)snprintf(s + n, cap - n, "\"normalizer\":%s,\"pre_tokenizer\":%s,", normalizer,
                          pretok);
    snprintf(s + n, cap - n, "\"decoder\":{\"type\":\"ByteLevel\"}}");
    return s;
}

static const char BL_ONLY[] =
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}";

static ms_tokenizer *load(const char *json, int *rc_out, ms_errbuf *err)
{
    ms_tokenizer *t = NULL;
    int rc = ms_tokenizer_load_text(&t, json, strlen(json), err);
    if (rc_out) *rc_out = rc;
    return t;
}

static size_t enc(const ms_tokenizer *t, const char *s, int special, int32_t *ids, size_t cap)
{
    size_t n = 0;
    ms_errbuf err;
    if (ms_tokenizer_encode(t, s, strlen(s), special, ids, cap, &n, &err) != 0) return (size_t)-1;
    return n;
}

static int ids_eq(const int32_t *a, size_t n, int count, ...)
{
    va_list ap;
    va_start(ap, count);
    int ok = n == (size_t)count;
    for (int i = 0; ok && i < count; i++) ok = a[i] == va_arg(ap, int);
    va_end(ap);
    if (!ok) {
        fprintf(stderr, "  got:");
        for (size_t i = 0; i < n && n != (size_t)-1; i++) fprintf(stderr, " %d", a[i]);
        fprintf(stderr, "\n");
    }
    return ok;
}

/* Collects pre-tokenized words as "w1|w2|..." */
typedef struct words {
    char buf[1024];
    size_t n;
} words;

static int add_word(void *ctx, const uint8_t *w, size_t n)
{
    words *ws = ctx;
    if (ws->n + n + 2 >= sizeof ws->buf) return MS_ETOOBIG;
    if (ws->n) ws->buf[ws->n++] = '|';
    memcpy(ws->buf + ws->n, w, n);
    ws->n += n;
    ws->buf[ws->n] = 0;
    return 0;
}

static const char *pretok(const ms_tokenizer *t, const char *s, words *ws)
{
    ms_errbuf err;
    ws->n = 0;
    ws->buf[0] = 0;
    if (ms_tok_pretokenize(t, s, strlen(s), add_word, ws, &err) != 0) return "(error)";
    return ws->buf;
}

/* ---- hand-written tokenizers ----------------------------------------------- */

/* ids: h=104 e=101 l=108 o=111 ' '→Ġ=32; merges he(300) ll(301) hell(302) hello(303) */
static const char HELLO_VOCAB[] = "\"he\":300,\"ll\":301,\"hell\":302,\"hello\":303,\"Ġw\":304";
static const char HELLO_MERGES_STR[] = "\"h e\",\"l l\",\"he ll\",\"hell o\",\"Ġ w\"";
static const char HELLO_MERGES_ARR[] =
    "[\"h\",\"e\"],[\"l\",\"l\"],[\"he\",\"ll\"],[\"hell\",\"o\"],[\"Ġ\",\"w\"]";

TEST(merges_string_and_array_forms)
{
    int32_t ids[64];
    ms_errbuf err;
    for (int form = 0; form < 2; form++) {
        char *js =
            make_json(HELLO_VOCAB, form ? HELLO_MERGES_ARR : HELLO_MERGES_STR, "", BL_ONLY, "null");
        ms_tokenizer *t = load(js, NULL, &err);
        free(js);
        CHECKF(t != NULL, "%s", err.msg);
        size_t n = enc(t, "hello", 1, ids, 64);
        int ok = ids_eq(ids, n, 1, 303);
        n = enc(t, "hellhe wo", 1, ids, 64);
        ok = ok && ids_eq(ids, n, 4, 302, 300, 304, 111);
        CHECK(ms_tokenizer_vocab_size(t) == 305);
        ms_tokenizer_free(t);
        CHECK(ok);
    }
}

TEST(merge_rank_order_and_ties)
{
    int32_t ids[64];
    ms_errbuf err;
    /* ab rank 0, bc rank 1: abc -> ab c; reversed ranks: a bc */
    char *js = make_json("\"ab\":300,\"bc\":301", "\"a b\",\"b c\"", "", BL_ONLY, "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    size_t n = enc(t, "abc", 1, ids, 64);
    int ok = ids_eq(ids, n, 2, 300, 'c');
    ms_tokenizer_free(t);
    CHECK(ok);
    js = make_json("\"ab\":300,\"bc\":301", "\"b c\",\"a b\"", "", BL_ONLY, "null");
    t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    n = enc(t, "abc", 1, ids, 64);
    ok = ids_eq(ids, n, 2, 'a', 301);
    ms_tokenizer_free(t);
    CHECK(ok);
    /* equal pairs merge leftmost first: aaa -> aa a; aaaaa with aa+aa -> aaaa a */
    js = make_json("\"aa\":300,\"aaaa\":301", "\"a a\",\"aa aa\"", "", BL_ONLY, "null");
    t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    n = enc(t, "aaa", 1, ids, 64);
    ok = ids_eq(ids, n, 2, 300, 'a');
    n = enc(t, "aaaaa", 1, ids, 64);
    ok = ok && ids_eq(ids, n, 2, 301, 'a');
    n = enc(t, "", 1, ids, 64);
    ok = ok && n == 0;
    ms_tokenizer_free(t);
    CHECK(ok);
}

TEST(long_word_merges_fast)
{
    /* 200k-letter word: the heap merge loop must not be quadratic */
    ms_errbuf err;
    char *js = make_json("\"aa\":300,\"aaaa\":301", "\"a a\",\"aa aa\"", "", BL_ONLY, "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    size_t len = 200001;
    char *s = malloc(len + 1);
    memset(s, 'a', len);
    s[len] = 0;
    int32_t *ids = malloc(len * sizeof *ids);
    double t0 = ms_now_s();
    size_t n = enc(t, s, 0, ids, len);
    double dt = ms_now_s() - t0;
    int ok = n == 50001 && ids[0] == 301 && ids[n - 1] == 'a';
    free(s);
    free(ids);
    ms_tokenizer_free(t);
    CHECKF(ok, "n=%zu", n);
    CHECKF(dt < 2.0, "took %.2f s", dt);
}

TEST(added_tokens_special_parsing)
{
    int32_t ids[64];
    ms_errbuf err;
    const char *added =
        "{\"id\":400,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
        "{\"id\":401,\"content\":\"<s>x\",\"special\":true,\"normalized\":false},"
        "{\"id\":402,\"content\":\"<｜User｜>\",\"special\":false,\"normalized\":true},"
        "{\"id\":303,\"content\":\"hello\",\"special\":false,\"normalized\":true}";
    char *js = make_json(HELLO_VOCAB, HELLO_MERGES_STR, added, BL_ONLY, "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECKF(t, "%s", err.msg);
    CHECK(ms_tokenizer_vocab_size(t) == 403);
    size_t n = enc(t, "<s>xy<s><｜User｜>he", 1, ids, 64);
    CHECK(ids_eq(ids, n, 5, 401, 'y', 400, 402, 300));
    /* parse_special off: all of it is text */
    n = enc(t, "<s>y", 0, ids, 64);
    CHECK(ids_eq(ids, n, 4, '<', 's', '>', 'y'));
    /* added token text inside a word splits the word */
    n = enc(t, "xhelloy", 1, ids, 64);
    CHECK(ids_eq(ids, n, 3, 'x', 303, 'y'));
    /* partial specials are plain text */
    n = enc(t, "<s", 1, ids, 64);
    CHECK(ids_eq(ids, n, 2, '<', 's'));
    CHECK(ms_tokenizer_token_id(t, "<s>x") == 401);
    CHECK(ms_tokenizer_token_id(t, "hell") == 302);
    CHECK(ms_tokenizer_token_id(t, "nope") == -1);
    CHECK(ms_tokenizer_is_special(t, 400) == 1);
    CHECK(ms_tokenizer_is_special(t, 402) == 0);
    CHECK(ms_tokenizer_is_special(t, 999) == 0);
    /* decode, skip_special drops special added tokens only */
    int32_t dec_ids[] = {401, 303, 402, 32, 400, 104};
    char *out = NULL;
    size_t out_len = 0;
    CHECK(ms_tokenizer_decode(t, dec_ids, 6, 0, &out, &out_len, &err) == 0);
    int ok = strcmp(out, "<s>xhello<｜User｜> <s>h") == 0 && out_len == strlen(out);
    free(out);
    CHECK(ok);
    CHECK(ms_tokenizer_decode(t, dec_ids, 6, 1, &out, &out_len, &err) == 0);
    ok = strcmp(out, "hello<｜User｜> h") == 0;
    free(out);
    CHECK(ok);
    /* out-of-range and absent ids are errors */
    int32_t bad[] = {104, 403};
    CHECK(ms_tokenizer_decode(t, bad, 2, 0, &out, &out_len, &err) == MS_ERANGE && out == NULL);
    bad[1] = 350; /* hole in the id space */
    CHECK(ms_tokenizer_decode(t, bad, 2, 0, &out, &out_len, &err) == MS_ERANGE);
    bad[1] = -1;
    CHECK(ms_tokenizer_decode(t, bad, 2, 0, &out, &out_len, &err) == MS_ERANGE);
    ms_tokenizer_free(t);
}

TEST(raw_tokens_split_before_normalized)
{
    /* Hugging Face splits non-normalized added tokens first, then normalized
     * ones in what is left: "ab" (raw) wins inside "xab" (normalized). */
    int32_t ids[16];
    ms_errbuf err;
    const char *added = "{\"id\":300,\"content\":\"xab\",\"special\":false,\"normalized\":true},"
                        "{\"id\":301,\"content\":\"ab\",\"special\":true,\"normalized\":false}";
    char *js = make_json("", "", added, BL_ONLY, "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    size_t n = enc(t, "xab xa", 1, ids, 16);
    int ok = ids_eq(ids, n, 5, 'x', 301, 32, 'x', 'a');
    ms_tokenizer_free(t);
    CHECK(ok);
}

TEST(added_tokens_lstrip_rstrip)
{
    int32_t ids[16];
    ms_errbuf err;
    const char *added = "{\"id\":400,\"content\":\"<m>\",\"special\":true,\"normalized\":false,"
                        "\"lstrip\":true,\"rstrip\":true},"
                        "{\"id\":401,\"content\":\"<n>\",\"special\":true,\"normalized\":false,"
                        "\"lstrip\":false,\"rstrip\":true}";
    char *js = make_json("", "", added, BL_ONLY, "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    size_t n = enc(t, "a \t<m>\n b", 1, ids, 16);
    int ok = ids_eq(ids, n, 3, 'a', 400, 'b');
    n = enc(t, "a\xe3\x80\x80<m>x", 1, ids, 16); /* U+3000 is whitespace */
    ok = ok && ids_eq(ids, n, 3, 'a', 400, 'x');
    n = enc(t, "<m> <m>", 1, ids, 16);
    ok = ok && ids_eq(ids, n, 2, 400, 400);
    n = enc(t, "a <n> b", 1, ids, 16);
    ok = ok && ids_eq(ids, n, 4, 'a', 32, 401, 'b');
    ms_tokenizer_free(t);
    CHECK(ok);
}

TEST(decode_bytes_and_lossy_utf8)
{
    ms_errbuf err;
    char *js = make_json("", "", "", BL_ONLY, "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    int32_t ids[8];
    size_t n = enc(t, "é", 1, ids, 8);
    CHECK(ids_eq(ids, n, 2, 0xC3, 0xA9));
    char buf[8], *out = NULL;
    size_t k = 0, out_len;
    CHECK(ms_tokenizer_token_bytes(t, 0xC3, buf, sizeof buf, &k) == 0 && k == 1 &&
          (uint8_t)buf[0] == 0xC3);
    CHECK(ms_tokenizer_token_bytes(t, 0xC3, buf, 0, &k) == MS_ETOOBIG && k == 1);
    CHECK(ms_tokenizer_token_bytes(t, 256, buf, 8, &k) == MS_ERANGE);
    /* a lone lead byte decodes to U+FFFD, followed by the rest */
    int32_t one[] = {0xC3, 'a', 0xE4, 0xBD};
    CHECK(ms_tokenizer_decode(t, one, 4, 0, &out, &out_len, &err) == 0);
    int ok = strcmp(out, "\xEF\xBF\xBD"
                         "a\xEF\xBF\xBD") == 0;
    free(out);
    CHECK(ok);
    /* encode with a small buffer reports the full count */
    n = 0;
    CHECK(ms_tokenizer_encode(t, "abcdef", 6, 1, ids, 2, &n, &err) == 0 && n == 6 && ids[1] == 'b');
    CHECK(ms_tokenizer_encode(t, "abcdef", 6, 1, NULL, 0, &n, &err) == 0 && n == 6);
    ms_tokenizer_free(t);
}

TEST(invalid_utf8_rejected)
{
    ms_errbuf err;
    char *js = make_json("", "", "", BL_ONLY, "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    static const char *const bad[] = {"\xff",
                                      "a\x80",
                                      "\xc0\x80",
                                      "\xc1\xbf",
                                      "\xe0\x80\x80",
                                      "\xed\xa0\x80",
                                      "\xe4\xbd",
                                      "\xf4\x90\x80\x80",
                                      "\xf8\x88\x80\x80\x80",
                                      "ok\xe4\xbdok",
                                      "\xf0\x8f\xbf\xbf"};
    int32_t ids[32];
    for (size_t i = 0; i < MS_ARRAY_LEN(bad); i++) {
        size_t n = 77;
        int rc = ms_tokenizer_encode(t, bad[i], strlen(bad[i]), 1, ids, 32, &n, &err);
        CHECKF(rc == MS_EINVAL && n == 0, "case %zu rc=%d", i, rc);
    }
    static const char *const good[] = {"\xf4\x8f\xbf\xbf", "\xef\xbf\xbf", "\xed\x9f\xbf",
                                       "\xee\x80\x80",     "\xc2\x80",     "\xf0\x90\x80\x80"};
    for (size_t i = 0; i < MS_ARRAY_LEN(good); i++) {
        size_t n = 0;
        CHECK(ms_tokenizer_encode(t, good[i], strlen(good[i]), 1, ids, 32, &n, &err) == 0);
        CHECK(n == strlen(good[i]));
    }
    /* NUL bytes are text like any other */
    size_t n = 0;
    CHECK(ms_tokenizer_encode(t, "a\0b", 3, 1, ids, 32, &n, &err) == 0 && n == 3 && ids[1] == 0);
    ms_tokenizer_free(t);
}

TEST(split_behaviours)
{
    /* the example of the Hugging Face docs: pattern "-" on "the-final--countdown" */
    static const struct {
        const char *behavior;
        int invert;
        const char *want;
    } cases[] = {
        {"Removed", 0, "the|final|countdown"},
        {"Isolated", 0, "the|-|final|-|-|countdown"},
        {"MergedWithPrevious", 0, "the-|final-|-|countdown"},
        {"MergedWithNext", 0, "the|-final|-|-countdown"},
        {"Contiguous", 0, "the|-|final|--|countdown"},
        {"Removed", 1, "-|-|-"},
        {"Isolated", 1, "the|-|final|-|-|countdown"},
    };
    ms_errbuf err;
    for (size_t i = 0; i < MS_ARRAY_LEN(cases); i++) {
        char pre[512];
        snprintf(pre, sizeof pre,
                 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                 "{\"String\":\"-\"},\"behavior\":\"%s\",\"invert\":%s},%s]}",
                 cases[i].behavior, cases[i].invert ? "true" : "false", BL_ONLY);
        char *js = make_json("", "", "", pre, "{\"type\":\"Sequence\",\"normalizers\":[]}");
        ms_tokenizer *t = load(js, NULL, &err);
        free(js);
        CHECKF(t, "%s", err.msg);
        words ws;
        const char *got = pretok(t, "the-final--countdown", &ws);
        int ok = strcmp(got, cases[i].want) == 0;
        ms_tokenizer_free(t);
        CHECKF(ok, "%s invert=%d: got %s", cases[i].behavior, cases[i].invert, got);
    }
}

TEST(bytelevel_regex_and_prefix_space)
{
    ms_errbuf err;
    char *js =
        make_json("", "", "",
                  "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}", "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    words ws;
    const char *got = pretok(t, "Hello world's 123  x\n", &ws);
    int ok = strcmp(got, " Hello| world|'s| 123| | x|\n") == 0;
    ms_tokenizer_free(t);
    CHECKF(ok, "got '%s'", got);
}

TEST(unsupported_and_malformed_configs)
{
    ms_errbuf err;
    int rc;
    char *js = make_json("", "", "", BL_ONLY, "{\"type\":\"NFKC\"}");
    ms_tokenizer *t = load(js, &rc, &err);
    free(js);
    CHECK(t == NULL && rc == MS_EUNSUPPORTED && strstr(err.msg, "NFKC"));
    js = make_json("", "", "", "{\"type\":\"Whitespace\"}", "null");
    t = load(js, &rc, &err);
    free(js);
    CHECK(t == NULL && rc == MS_EUNSUPPORTED && strstr(err.msg, "Whitespace"));
    js = make_json("", "", "", "null", "null");
    t = load(js, &rc, &err);
    free(js);
    CHECK(t == NULL && rc == MS_EUNSUPPORTED);
    js = make_json("", "\"x yz\"", "", BL_ONLY, "null");
    t = load(js, &rc, &err);
    free(js);
    CHECK(t == NULL && rc == MS_EFORMAT);
    js = make_json("", "\"a b c\"", "", BL_ONLY, "null");
    t = load(js, &rc, &err);
    free(js);
    CHECK(t == NULL && rc == MS_EFORMAT);
    js = make_json("", "", "",
                   "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                   "{\"Regex\":\"(\"},\"behavior\":\"Isolated\",\"invert\":false},"
                   "{\"type\":\"ByteLevel\"}]}",
                   "null");
    t = load(js, &rc, &err);
    free(js);
    CHECK(t == NULL && rc == MS_EFORMAT && strstr(err.msg, "regex"));
    const char *trunc = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0";
    t = load(trunc, &rc, &err);
    CHECK(t == NULL && rc == MS_EFORMAT);
    t = load("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", &rc, &err);
    CHECK(t == NULL && rc == MS_EUNSUPPORTED);
    t = load("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-4}}}", &rc, &err);
    CHECK(t == NULL && rc == MS_ERANGE);
    CHECK(ms_tokenizer_load(&t, "/nonexistent/tokenizer.json", &err) == MS_ENOENT && t == NULL);
    ms_tokenizer_free(NULL);
}

TEST(ignore_merges_uses_whole_word)
{
    ms_errbuf err;
    int32_t ids[8];
    /* "abc" is in vocab but no merge builds it */
    char *js = make_json("\"ab\":300,\"abc\":301", "\"a b\"", "", BL_ONLY, "null");
    ms_tokenizer *t = load(js, NULL, &err);
    free(js);
    CHECK(t);
    size_t n = enc(t, "abc", 1, ids, 8);
    int ok = ids_eq(ids, n, 2, 300, 'c');
    ms_tokenizer_free(t);
    CHECK(ok);
    js = make_json("\"ab\":300,\"abc\":301", "\"a b\"", "", BL_ONLY, "null");
    char *p = strstr(js, "\"type\":\"BPE\",");
    size_t pos = (size_t)(p - js) + strlen("\"type\":\"BPE\",");
    char *js2 = malloc(strlen(js) + 32);
    snprintf(js2, strlen(js) + 32, "%.*s\"ignore_merges\":true,%s", (int)pos, js, js + pos);
    free(js);
    t = load(js2, NULL, &err);
    free(js2);
    CHECK(t);
    n = enc(t, "abc", 1, ids, 8);
    ok = ids_eq(ids, n, 1, 301);
    ms_tokenizer_free(t);
    CHECK(ok);
}

/* ---- trained tokenizers --------------------------------------------------- */

static ms_tokenizer *train(int32_t vocab, const char *path)
{
    ms_errbuf err;
    if (ms_tokenizer_train_write(NULL, 0, vocab, path, &err) != 0) {
        fprintf(stderr, "  train: %s\n", err.msg);
        return NULL;
    }
    ms_tokenizer *t = NULL;
    if (ms_tokenizer_load(&t, path, &err) != 0) fprintf(stderr, "  load: %s\n", err.msg);
    return t;
}

static char tmpdir[64];

TEST(trained_vocab_exact_and_layout)
{
    static const int32_t sizes[] = {276, 300, 1024, 4096, 32000};
    char path[128];
    snprintf(path, sizeof path, "%s/tok.json", tmpdir);
    for (size_t i = 0; i < MS_ARRAY_LEN(sizes); i++) {
        ms_tokenizer *t = train(sizes[i], path);
        CHECK(t);
        int32_t v = ms_tokenizer_vocab_size(t);
        int ok = v == sizes[i] && ms_tokenizer_token_id(t, "<｜begin▁of▁sentence｜>") == 0 &&
                 ms_tokenizer_token_id(t, "<｜end▁of▁sentence｜>") == 1 &&
                 ms_tokenizer_token_id(t, "<｜tool▁sep｜>") == v - 1 &&
                 ms_tokenizer_token_id(t, "<think>") == v - 17 &&
                 ms_tokenizer_token_id(t, "</think>") == v - 16 &&
                 ms_tokenizer_token_id(t, "<｜User｜>") == v - 12 &&
                 ms_tokenizer_token_id(t, "<｜Assistant｜>") == v - 11 &&
                 ms_tokenizer_is_special(t, 0) && ms_tokenizer_is_special(t, 1) &&
                 !ms_tokenizer_is_special(t, v - 12) && ms_tokenizer_token_id(t, "!") == 3;
        /* every id decodes */
        for (int32_t id = 0; ok && id < v; id++) {
            char buf[512];
            size_t k;
            ok = ms_tokenizer_token_bytes(t, id, buf, sizeof buf, &k) == 0 && k > 0;
        }
        ms_tokenizer_free(t);
        CHECKF(ok, "vocab %d", (int)sizes[i]);
    }
    ms_errbuf err;
    CHECK(ms_tokenizer_train_write(NULL, 0, 275, path, &err) == MS_ERANGE);
    CHECK(ms_tokenizer_train_write("\xff", 1, 1024, path, &err) == MS_EINVAL);
}

TEST(trained_round_trip_and_specials)
{
    char path[128];
    snprintf(path, sizeof path, "%s/tok1024.json", tmpdir);
    ms_tokenizer *t = train(1024, path);
    CHECK(t);
    ms_errbuf err;
    size_t len = ms_tokenizer_corpus_len, n = 0;
    int32_t *ids = malloc(len * sizeof *ids);
    int rc = ms_tokenizer_encode(t, ms_tokenizer_corpus, len, 1, ids, len, &n, &err);
    char *out = NULL;
    size_t out_len = 0;
    if (rc == 0) rc = ms_tokenizer_decode(t, ids, n, 0, &out, &out_len, &err);
    int ok = rc == 0 && out_len == len && memcmp(out, ms_tokenizer_corpus, len) == 0 && n < len / 2;
    free(out);
    free(ids);
    const char *chat =
        "<｜begin▁of▁sentence｜>You are kind.<｜User｜>Hi there<｜Assistant｜><think>\nok\n"
        "</think>\n\nHello!<｜end▁of▁sentence｜>";
    int32_t cids[256];
    n = enc(t, chat, 1, cids, 256);
    int32_t u = ms_tokenizer_token_id(t, "<｜User｜>"),
            a = ms_tokenizer_token_id(t, "<｜Assistant｜>");
    int found_u = 0, found_a = 0;
    for (size_t i = 0; i < n; i++) {
        found_u += cids[i] == u;
        found_a += cids[i] == a;
    }
    ok = ok && n != (size_t)-1 && cids[0] == 0 && cids[n - 1] == 1 && found_u == 1 && found_a == 1;
    if (ok) {
        CHECK(ms_tokenizer_decode(t, cids, n, 1, &out, &out_len, &err) == 0);
        /* the specials bos/eos go; User/Assistant/think are not special in DeepSeek */
        ok = strcmp(
                 out,
                 "You are kind.<｜User｜>Hi there<｜Assistant｜><think>\nok\n</think>\n\nHello!") ==
             0;
        free(out);
    }
    size_t n_plain = enc(t, chat, 0, cids, 256);
    ok = ok && n_plain > n;
    for (size_t i = 0; ok && i < n_plain; i++) ok = cids[i] != 0 && cids[i] != u;
    ms_tokenizer_free(t);
    CHECK(ok);
}

TEST(trainer_is_deterministic)
{
    char p1[128], p2[128];
    snprintf(p1, sizeof p1, "%s/a.json", tmpdir);
    snprintf(p2, sizeof p2, "%s/b.json", tmpdir);
    ms_errbuf err;
    CHECK(ms_tokenizer_train_write(NULL, 0, 2000, p1, &err) == 0);
    CHECK(ms_tokenizer_train_write(NULL, 0, 2000, p2, &err) == 0);
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    CHECK(ms_read_file(p1, 1 << 26, &a, &la) == 0 && ms_read_file(p2, 1 << 26, &b, &lb) == 0);
    int same = la == lb && memcmp(a, b, la) == 0;
    free(a);
    free(b);
    CHECK(same);
    /* a given corpus works too */
    const char *corpus = "aaa bbb aaa bbb ccc aaa";
    CHECK(ms_tokenizer_train_write(corpus, strlen(corpus), 300, p1, &err) == 0);
    ms_tokenizer *t = NULL;
    CHECK(ms_tokenizer_load(&t, p1, &err) == 0);
    int32_t ids[8];
    size_t n = enc(t, "aaa", 1, ids, 8);
    int ok = n == 1 && ms_tokenizer_vocab_size(t) == 300;
    ms_tokenizer_free(t);
    CHECK(ok);
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", tmpdir);
    CHECK(ms_tokenizer_config_write(cfg, &err) == 0);
    json_error_t je;
    json_t *root = json_load_file(cfg, 0, &je);
    CHECK(root);
    ok = json_is_true(json_object_get(root, "add_bos_token")) &&
         strcmp(json_string_value(json_object_get(json_object_get(root, "bos_token"), "content")),
                "<｜begin▁of▁sentence｜>") == 0;
    json_decref(root);
    CHECK(ok);
}

typedef struct tjob {
    const ms_tokenizer *t;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    int rc;
} tjob;

static void *tjob_run(void *arg)
{
    tjob *j = arg;
    ms_errbuf err;
    for (int rep = 0; rep < 3 && j->rc == 0; rep++)
        j->rc = ms_tokenizer_encode(j->t, j->text, j->len, 1, j->ids, j->len, &j->n, &err);
    return NULL;
}

TEST(concurrent_encode_identical)
{
    char path[128];
    snprintf(path, sizeof path, "%s/tok4k.json", tmpdir);
    ms_tokenizer *t = train(4096, path);
    CHECK(t);
    size_t len = ms_tokenizer_corpus_len;
    int32_t *ref = malloc(len * sizeof *ref);
    size_t n_ref = 0;
    ms_errbuf err;
    CHECK(ms_tokenizer_encode(t, ms_tokenizer_corpus, len, 1, ref, len, &n_ref, &err) == 0);
    enum { NT = 4 };
    tjob jobs[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (tjob){t, ms_tokenizer_corpus, len, malloc(len * sizeof(int32_t)), 0, 0};
        pthread_create(&th[i], NULL, tjob_run, &jobs[i]);
    }
    int ok = 1;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        ok &= jobs[i].rc == 0 && jobs[i].n == n_ref &&
              memcmp(jobs[i].ids, ref, n_ref * sizeof *ref) == 0;
        free(jobs[i].ids);
    }
    free(ref);
    ms_tokenizer_free(t);
    CHECK(ok);
}

TEST(long_whitespace_and_digit_runs)
{
    /* exercises the PCRE2 JIT stack fallback on 1 MB runs */
    char path[128];
    snprintf(path, sizeof path, "%s/tok512.json", tmpdir);
    ms_tokenizer *t = train(512, path);
    CHECK(t);
    size_t len = 1 << 20;
    char *s = malloc(len + 1);
    int ok = 1;
    for (int kind = 0; kind < 3 && ok; kind++) {
        memset(s, kind == 0 ? ' ' : kind == 1 ? '\n' : '7', len);
        s[len - 1] = 'x';
        s[len] = 0;
        size_t n = 0;
        ms_errbuf err;
        int32_t *ids = malloc(len * sizeof *ids);
        int rc = ms_tokenizer_encode(t, s, len, 1, ids, len, &n, &err);
        char *out = NULL;
        size_t out_len = 0;
        if (rc == 0) rc = ms_tokenizer_decode(t, ids, n, 0, &out, &out_len, &err);
        ok = rc == 0 && out_len == len && memcmp(out, s, len) == 0;
        if (!ok) fprintf(stderr, "  kind %d rc=%d %s\n", kind, rc, err.msg);
        free(out);
        free(ids);
    }
    free(s);
    ms_tokenizer_free(t);
    CHECK(ok);
}

/* ---- golden mode (real DeepSeek-V3 tokenizer) ------------------------------ */

/* Cases where JavaScript's \s (no U+0085, but U+FEFF) differs from
 * Oniguruma/PCRE2: pieces derived by hand from the third regex with Rust's
 * \s, ids = BPE of each piece (JS model on the single piece). */
static const struct {
    const char *text, *pieces;
    int n;
    int32_t ids[8];
} RUST_CASES[] = {
    {"x\xc2\x85 y", "x|\xc2\x85| y", 4, {90, 129, 230, 383}},
    {"a \xc2\x85"
     "b",
     "a| |\xc2\x85"
     "b",
     5,
     {67, 223, 129, 230, 68}},
    {"a\xc2\x85\xc2\x85 b", "a|\xc2\x85\xc2\x85| b", 6, {67, 129, 230, 129, 230, 291}},
    {"a\xc2\x85\nb", "a|\xc2\x85\n|b", 5, {67, 129, 230, 201, 68}},
    {"x \xc2\x85 y", "x| \xc2\x85| y", 4, {90, 1203, 230, 383}}, /* JS: 90 223 129 230 383 */
    {"Hi\xc2\x85\xc2\x85\xc2\x85hello",
     "Hi|\xc2\x85\xc2\x85|\xc2\x85hello",
     8,
     {23166, 129, 230, 129, 230, 129, 230, 33310}},
    {"x\xef\xbb\xbf\nb", "x|\xef\xbb\xbf|\n|b", 4, {90, 15251, 201, 68}}, /* JS: x|FEFF\n|b */
    {"a\xef\xbb\xbf b", "a|\xef\xbb\xbf| b", 3, {67, 15251, 291}},
    {"x \xef\xbb\xbf", "x| |\xef\xbb\xbf", 3, {90, 223, 15251}}, /* JS: x| FEFF */
    {"\xc2\x85\xc2\x85\r\n", "\xc2\x85\xc2\x85\r\n", 6, {129, 230, 129, 230, 204, 201}},
    {"a\t\xc2\x85", "a|\t\xc2\x85", 4, {67, 200, 129, 230}},
};

static int golden(const char *tok_path, const char *jsonl, int rust_cases)
{
    ms_errbuf err;
    ms_tokenizer *t = NULL;
    if (ms_tokenizer_load(&t, tok_path, &err) != 0) {
        printf("cannot load %s: %s\n0 passed, 1 failed\n", tok_path, err.msg);
        return 1;
    }
    FILE *f = fopen(jsonl, "r");
    if (!f) {
        printf("cannot open %s\n0 passed, 1 failed\n", jsonl);
        return 1;
    }
    size_t cap_ids = 1 << 16;
    int32_t *ids = malloc(cap_ids * sizeof *ids);
    char *line = NULL;
    size_t line_cap = 0;
    int pass = 0, fail = 0, lineno = 0;
    while (getline(&line, &line_cap, f) > 0) {
        lineno++;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *tx = json_object_get(o, "text"), *ex = json_object_get(o, "ids");
        if (!json_is_string(tx) || !json_is_array(ex)) {
            printf("line %d: malformed\n", lineno);
            fail++;
            json_decref(o);
            continue;
        }
        size_t n = 0, len = json_string_length(tx);
        int rc = ms_tokenizer_encode(t, json_string_value(tx), len, 1, ids, cap_ids, &n, &err);
        if (rc == 0 && n > cap_ids) { /* grow and encode again */
            free(ids);
            cap_ids = n;
            ids = malloc(cap_ids * sizeof *ids);
            rc = ms_tokenizer_encode(t, json_string_value(tx), len, 1, ids, cap_ids, &n, &err);
        }
        int ok = rc == 0 && n == json_array_size(ex) && n <= cap_ids;
        for (size_t i = 0; ok && i < n; i++)
            ok = ids[i] == json_integer_value(json_array_get(ex, i));
        if (ok) {
            char *dec = NULL;
            size_t dl = 0;
            ok = ms_tokenizer_decode(t, ids, n, 0, &dec, &dl, &err) == 0 && dl == len &&
                 memcmp(dec, json_string_value(tx), len) == 0;
            if (!ok) printf("line %d: round trip differs\n", lineno);
            free(dec);
        } else if (fail < 10) {
            char *s = json_dumps(tx, JSON_ENCODE_ANY);
            printf("line %d: ids differ (rc=%d) for %.300s\n  want", lineno, rc, s);
            free(s);
            for (size_t i = 0; i < json_array_size(ex) && i < 40; i++)
                printf(" %lld", (long long)json_integer_value(json_array_get(ex, i)));
            printf("\n  got ");
            for (size_t i = 0; i < n && i < 40 && i < cap_ids; i++) printf(" %d", ids[i]);
            printf("\n");
        }
        ok ? pass++ : fail++;
        json_decref(o);
    }
    free(line);
    fclose(f);
    for (size_t c = 0; rust_cases && c < MS_ARRAY_LEN(RUST_CASES); c++) {
        words ws;
        const char *got = pretok(t, RUST_CASES[c].text, &ws);
        size_t n = enc(t, RUST_CASES[c].text, 1, ids, cap_ids);
        int ok = strcmp(got, RUST_CASES[c].pieces) == 0 && n == (size_t)RUST_CASES[c].n;
        for (int i = 0; ok && i < RUST_CASES[c].n; i++) ok = ids[i] == RUST_CASES[c].ids[i];
        if (!ok) printf("U+0085/U+FEFF case %zu differs (pieces '%s')\n", c, got);
        ok ? pass++ : fail++;
    }
    free(ids);
    ms_tokenizer_free(t);
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--golden") == 0) return golden(argv[2], argv[3], 1);
    if (argc == 4 && strcmp(argv[1], "--golden-plain") == 0) return golden(argv[2], argv[3], 0);
    if (argc == 4 && strcmp(argv[1], "--train") == 0) { /* for t_tokenizer_dsv3.sh */
        ms_errbuf err;
        if (ms_tokenizer_train_write(NULL, 0, atoi(argv[2]), argv[3], &err) == 0) return 0;
        fprintf(stderr, "train: %s\n", err.msg);
        return 1;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_tokenizer_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(merges_string_and_array_forms);
    RUN(merge_rank_order_and_ties);
    RUN(long_word_merges_fast);
    RUN(added_tokens_special_parsing);
    RUN(raw_tokens_split_before_normalized);
    RUN(added_tokens_lstrip_rstrip);
    RUN(decode_bytes_and_lossy_utf8);
    RUN(invalid_utf8_rejected);
    RUN(split_behaviours);
    RUN(bytelevel_regex_and_prefix_space);
    RUN(unsupported_and_malformed_configs);
    RUN(ignore_merges_uses_whole_word);
    RUN(trained_vocab_exact_and_layout);
    RUN(trained_round_trip_and_specials);
    RUN(trainer_is_deterministic);
    RUN(concurrent_encode_identical);
    RUN(long_whitespace_and_digit_runs);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_REPORT();
}
