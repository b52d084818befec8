/* test_safetensors.c — safetensors writer → reader round trips (single file,
 * shards + index, directory listing), a corpus of corrupted images each
 * rejected with a message naming the file and tensor, ms_st_expect, and the
 * V4 quantised tensors (FP4 I8 + F8_E8M0 experts, UE8M0 scales; quant_load.h). */
#include "base/util.h"
#include "harness.h"
#include "model/quant_load.h"
#include "model/safetensors.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}

/* A file image: 8-byte length (hlen, or strlen(hdr) when hlen == UINT64_MAX),
 * the header text, then data_bytes bytes of 0xab. */
static uint8_t *image(const char *hdr, uint64_t hlen, size_t data_bytes, size_t *len)
{
    size_t hl = strlen(hdr);
    if (hlen == UINT64_MAX) hlen = hl;
    *len = 8 + hl + data_bytes;
    uint8_t *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, hdr, hl);
    memset(b + 8 + hl, 0xab, data_bytes);
    return b;
}

static int write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

static int fill_iota(void *ctx, const char *name, void *buf, size_t nbytes, ms_errbuf *err)
{
    (void)name;
    (void)err;
    for (size_t i = 0; i < nbytes; i++) ((uint8_t *)buf)[i] = (uint8_t)(i * 7 + *(int *)ctx);
    return 0;
}

static int fill_fail(void *ctx, const char *name, void *buf, size_t nbytes, ms_errbuf *err)
{
    (void)ctx;
    (void)buf;
    (void)nbytes;
    return ms_err(err, MS_EIO, "generator for %s failed", name);
}

TEST(roundtrip_single_file)
{
    ms_errbuf e;
    ms_st_writer *w = ms_st_writer_new();
    CHECK(w);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t bf[5] = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0};
    uint8_t f8[15];
    for (int i = 0; i < 15; i++) f8[i] = (uint8_t)i;
    int64_t s_a[2] = {2, 3}, s_bf[1] = {5}, s_f8[2] = {3, 5}, s_z[2] = {0, 4}, s_g[3] = {2, 2, 3};
    int64_t scalar = 42;
    int seven = 7;
    CHECK(ms_st_writer_set_metadata(w, "format", "pt", &e) == 0);
    CHECK(ms_st_writer_add(w, "a.weight", MS_DT_F32, 2, s_a, a, sizeof a, &e) == 0);
    CHECK(ms_st_writer_add(w, "odd.fp8", MS_DT_F8E4M3, 2, s_f8, f8, sizeof f8, &e) == 0);
    CHECK(ms_st_writer_add_ref(w, "b.bf16", MS_DT_BF16, 1, s_bf, bf, sizeof bf, &e) == 0);
    CHECK(ms_st_writer_add(w, "scalar", MS_DT_I64, 0, NULL, &scalar, 8, &e) == 0);
    CHECK(ms_st_writer_add(w, "empty", MS_DT_F32, 2, s_z, NULL, 0, &e) == 0);
    CHECK(ms_st_writer_add_gen(w, "gen.u8", MS_DT_U8, 3, s_g, fill_iota, &seven, &e) == 0);
    CHECK(ms_st_writer_data_bytes(w) == 24 + 15 + 10 + 8 + 0 + 12);
    /* writer errors */
    CHECK(ms_st_writer_add(w, "a.weight", MS_DT_F32, 2, s_a, a, sizeof a, &e) == MS_EINVAL);
    CHECK(strstr(e.msg, "a.weight") != NULL);
    CHECK(ms_st_writer_add(w, "short", MS_DT_F32, 2, s_a, a, 20, &e) == MS_EINVAL);
    CHECK(ms_st_writer_add(w, "__metadata__", MS_DT_F32, 2, s_a, a, 24, &e) == MS_EINVAL);
    CHECK(ms_st_writer_add(w, "bad\xff", MS_DT_F32, 2, s_a, a, 24, &e) == MS_EINVAL);
    CHECK(ms_st_writer_add(w, "short", MS_DT_F32, 2, s_a, a, 24, &e) == 0); /* name freed */
    char path[512];
    path_of(path, sizeof path, "single.safetensors");
    CHECK(ms_st_writer_save(w, path, &e) == 0);
    ms_st_writer_free(w);

    char *raw;
    size_t rlen;
    CHECK(ms_read_file(path, 1 << 20, &raw, &rlen) == 0);
    uint64_t hl;
    memcpy(&hl, raw, 8);
    CHECK(hl % 8 == 0 && 8 + hl + 93 == rlen);
    CHECK(raw[8 + hl - 1] == ' ' || raw[8 + hl - 1] == '}');
    CHECK(ms_st_check_buffer((const uint8_t *)raw, rlen, &e) == 0);
    free(raw);

    ms_st_store *st;
    CHECKF(ms_st_open_file(&st, path, &e) == 0, "%s", e.msg);
    CHECK(ms_st_count(st) == 7);
    const char *order[7] = {"a.weight", "odd.fp8", "b.bf16", "scalar", "empty", "gen.u8", "short"};
    for (size_t i = 0; i < 7; i++) CHECK(strcmp(ms_st_at(st, i)->name, order[i]) == 0);
    CHECK(ms_st_at(st, 7) == NULL);
    const ms_tensor *t = ms_st_find(st, "a.weight");
    CHECK(t && t->dtype == MS_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK(t->nbytes == 24 && memcmp(t->data, a, 24) == 0 && strcmp(t->file, path) == 0);
    t = ms_st_find(st, "odd.fp8");
    CHECK(t && t->dtype == MS_DT_F8E4M3 && memcmp(t->data, f8, 15) == 0);
    t = ms_st_find(st, "b.bf16");
    CHECK(t && t->dtype == MS_DT_BF16 && memcmp(t->data, bf, 10) == 0);
    t = ms_st_find(st, "scalar");
    int64_t got; /* tensors are back to back: data may be unaligned */
    CHECK(t && t->ndim == 0 && t->nbytes == 8);
    memcpy(&got, t->data, 8);
    CHECK(got == 42);
    t = ms_st_find(st, "empty");
    CHECK(t && t->nbytes == 0 && t->shape[0] == 0);
    t = ms_st_find(st, "gen.u8");
    CHECK(t && t->nbytes == 12 && ((const uint8_t *)t->data)[11] == (uint8_t)(11 * 7 + 7));
    CHECK(ms_st_find(st, "nope") == NULL);
    ms_st_close(st);
    ms_st_close(NULL);
}

TEST(generator_failure_leaves_no_file)
{
    ms_errbuf e;
    ms_st_writer *w = ms_st_writer_new();
    int64_t s[1] = {4};
    CHECK(ms_st_writer_add_gen(w, "x", MS_DT_F32, 1, s, fill_fail, NULL, &e) == 0);
    char path[512], tmp[600];
    path_of(path, sizeof path, "fail.safetensors");
    CHECK(ms_st_writer_save(w, path, &e) == MS_EIO);
    CHECK(strstr(e.msg, "generator for x failed") != NULL);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(path, F_OK) != 0 && access(tmp, F_OK) != 0);
    ms_st_writer_free(w);
}

/* n tensors "t.<i>" of i%5+1 F32 elements, each filled with its index. */
static ms_st_writer *many(int n, float **bufs)
{
    ms_st_writer *w = ms_st_writer_new();
    ms_errbuf e;
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "t.%d", i);
        int64_t s[1] = {i % 5 + 1};
        bufs[i] = malloc(sizeof(float) * 5);
        for (int j = 0; j < 5; j++) bufs[i][j] = (float)i;
        if (ms_st_writer_add_ref(w, name, MS_DT_F32, 1, s, bufs[i], (size_t)s[0] * 4, &e)) {
            ms_st_writer_free(w);
            return NULL;
        }
    }
    return w;
}

static int check_many(const ms_st_store *st, int n)
{
    if (ms_st_count(st) != (size_t)n) return 0;
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "t.%d", i);
        const ms_tensor *t = ms_st_find(st, name);
        float x0;
        if (!t || t->shape[0] != i % 5 + 1) return 0;
        memcpy(&x0, t->data, sizeof x0);
        if (x0 != (float)i) return 0;
    }
    return 1;
}

TEST(roundtrip_sharded_with_index)
{
    enum { N = 300 };
    float *bufs[N];
    ms_st_writer *w = many(N, bufs);
    CHECK(w);
    ms_errbuf e;
    char dir[512], p[600];
    path_of(dir, sizeof dir, "sharded");
    CHECKF(ms_st_writer_save_sharded(w, dir, 1000, &e) == 0, "%s", e.msg);
    ms_st_writer_free(w);
    for (int i = 0; i < N; i++) free(bufs[i]);
    /* 300 tensors of 4..20 bytes = 3600 bytes; greedy shards of ≤ 1000 bytes: 4 */
    snprintf(p, sizeof p, "%s/model-00004-of-00004.safetensors", dir);
    CHECK(access(p, F_OK) == 0);
    snprintf(p, sizeof p, "%s/%s", dir, MS_ST_INDEX_NAME);
    CHECK(access(p, F_OK) == 0);
    ms_st_store *st;
    CHECKF(ms_st_open_dir(&st, dir, &e) == 0, "%s", e.msg);
    CHECK(check_many(st, N));
    const ms_tensor *t = ms_st_find(st, "t.299");
    CHECK(t && strstr(t->file, "model-00004-of-00004.safetensors"));
    t = ms_st_find(st, "t.83"); /* the first shard ends exactly at 1000 bytes */
    CHECK(t && strstr(t->file, "model-00001-of-00004.safetensors"));
    t = ms_st_find(st, "t.84");
    CHECK(t && strstr(t->file, "model-00002-of-00004.safetensors"));
    ms_st_close(st);
}

TEST(big_tensor_gets_own_shard)
{
    ms_errbuf e;
    ms_st_writer *w = ms_st_writer_new();
    static float big[1000];
    int64_t s1[1] = {1}, sb[1] = {1000};
    float one = 1;
    CHECK(ms_st_writer_add(w, "small0", MS_DT_F32, 1, s1, &one, 4, &e) == 0);
    CHECK(ms_st_writer_add_ref(w, "big", MS_DT_F32, 1, sb, big, sizeof big, &e) == 0);
    CHECK(ms_st_writer_add(w, "small1", MS_DT_F32, 1, s1, &one, 4, &e) == 0);
    char dir[512];
    path_of(dir, sizeof dir, "bigshard");
    CHECK(ms_st_writer_save_sharded(w, dir, 100, &e) == 0);
    ms_st_writer_free(w);
    ms_st_store *st;
    CHECKF(ms_st_open_dir(&st, dir, &e) == 0, "%s", e.msg);
    CHECK(ms_st_count(st) == 3);
    CHECK(strstr(ms_st_find(st, "small0")->file, "model-00001-of-00003"));
    CHECK(strstr(ms_st_find(st, "big")->file, "model-00002-of-00003"));
    CHECK(strstr(ms_st_find(st, "small1")->file, "model-00003-of-00003"));
    ms_st_close(st);
}

TEST(many_tensors_hash_lookup)
{
    enum { N = 20000 };
    float **bufs = malloc(N * sizeof *bufs);
    ms_st_writer *w = many(N, bufs);
    CHECK(w);
    ms_errbuf e;
    char path[512];
    path_of(path, sizeof path, "many.safetensors");
    CHECK(ms_st_writer_save(w, path, &e) == 0);
    ms_st_writer_free(w);
    for (int i = 0; i < N; i++) free(bufs[i]);
    free(bufs);
    ms_st_store *st;
    double t0 = ms_now_s();
    CHECKF(ms_st_open_file(&st, path, &e) == 0, "%s", e.msg);
    double t1 = ms_now_s();
    CHECK(check_many(st, N));
    double t2 = ms_now_s();
    fprintf(stderr, "  open %d tensors: %.1f ms, %d lookups: %.1f ms\n", N, (t1 - t0) * 1e3, N,
            (t2 - t1) * 1e3);
    ms_st_close(st);
}

TEST(dir_listing_without_index)
{
    ms_errbuf e;
    char dir[512], p[600];
    path_of(dir, sizeof dir, "listing");
    mkdir(dir, 0755);
    int64_t s[1] = {2};
    float v[2] = {1, 2};
    const char *files[2] = {"b.safetensors", "a.safetensors"};
    const char *names[2] = {"from_b", "from_a"};
    for (int i = 0; i < 2; i++) {
        ms_st_writer *w = ms_st_writer_new();
        CHECK(ms_st_writer_add(w, names[i], MS_DT_F32, 1, s, v, 8, &e) == 0);
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        CHECK(ms_st_writer_save(w, p, &e) == 0);
        ms_st_writer_free(w);
    }
    snprintf(p, sizeof p, "%s/README.md", dir);
    CHECK(write_bytes(p, "hi", 2) == 0);
    ms_st_store *st;
    CHECKF(ms_st_open_dir(&st, dir, &e) == 0, "%s", e.msg);
    CHECK(ms_st_count(st) == 2);
    CHECK(strcmp(ms_st_at(st, 0)->name, "from_a") == 0); /* a.safetensors sorts first */
    ms_st_close(st);
    /* the same tensor name in two files */
    ms_st_writer *w = ms_st_writer_new();
    CHECK(ms_st_writer_add(w, "from_a", MS_DT_F32, 1, s, v, 8, &e) == 0);
    snprintf(p, sizeof p, "%s/c.safetensors", dir);
    CHECK(ms_st_writer_save(w, p, &e) == 0);
    ms_st_writer_free(w);
    CHECK(ms_st_open_dir(&st, dir, &e) == MS_EFORMAT && st == NULL);
    CHECKF(strstr(e.msg, "'from_a'") && strstr(e.msg, "a.safetensors") &&
               strstr(e.msg, "c.safetensors"),
           "%s", e.msg);
    char empty[512];
    path_of(empty, sizeof empty, "emptydir");
    mkdir(empty, 0755);
    CHECK(ms_st_open_dir(&st, empty, &e) == MS_ENOENT);
    CHECK(ms_st_open_dir(&st, "/nonexistent/dir", &e) == MS_ENOENT);
}

/* A 5 GiB tensor in a sparse file: 64-bit offsets end to end, no data written. */
TEST(offsets_beyond_4gib)
{
    const uint64_t big = 5ull << 30;
    char hdr[256];
    snprintf(hdr, sizeof hdr,
             "{\"small\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
             "\"big\":{\"dtype\":\"BF16\",\"shape\":[%llu,2],\"data_offsets\":[8,%llu]}}",
             (unsigned long long)(big / 4), (unsigned long long)(big + 8));
    size_t len;
    uint8_t *b = image(hdr, UINT64_MAX, 8, &len);
    char path[512];
    path_of(path, sizeof path, "sparse.safetensors");
    int ok = write_bytes(path, b, len) == 0 && truncate(path, (off_t)(len + big)) == 0;
    free(b);
    CHECK(ok);
    ms_st_store *st;
    ms_errbuf e;
    CHECKF(ms_st_open_file(&st, path, &e) == 0, "%s", e.msg);
    const ms_tensor *t = ms_st_find(st, "big");
    CHECK(t && t->nbytes == big && t->shape[0] == (int64_t)(big / 4));
    CHECK(((const uint8_t *)t->data)[big - 1] == 0); /* the last byte is mapped (a hole) */
    ms_st_close(st);
    CHECK(truncate(path, (off_t)(len + big - 1)) == 0);
    CHECK(ms_st_open_file(&st, path, &e) == MS_EFORMAT);
    CHECKF(strstr(e.msg, "'big'") && strstr(e.msg, "exceed data section"), "%s", e.msg);
    unlink(path);
}

/* Images written by an independent writer (Python struct + json,
 * fuzz/gen_seeds.py; tests run from the repository root). */
TEST(python_written_images)
{
    const char *dir = "fuzz/corpus/fuzz_safetensors";
    const char *good[] = {"empty", "f32", "mixed", "unpadded", "unicode"};
    const char *bad[] = {"truncated", "overlap"};
    char p[512];
    ms_st_store *st;
    ms_errbuf e;
    for (size_t i = 0; i < MS_ARRAY_LEN(good); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, good[i]);
        CHECKF(ms_st_open(&st, p, &e) == 0, "%s", e.msg);
        if (!strcmp(good[i], "mixed")) {
            CHECK(ms_st_count(st) == 10);
            const ms_tensor *t;
            int64_t s35[2] = {3, 5}, s11[2] = {1, 1};
            CHECK(ms_st_expect(st, "model.layers.0.self_attn.q_a_proj.weight", 2, s35,
                               MS_DT_MASK(MS_DT_F8E4M3), &t, &e) == 0);
            CHECK(((const uint8_t *)t->data)[14] == 14);
            CHECK(ms_st_expect(st, "model.layers.0.self_attn.q_a_proj.weight_scale_inv", 2, s11,
                               MS_DT_MASK(MS_DT_F32), &t, &e) == 0);
            float sc;
            memcpy(&sc, t->data, 4);
            CHECK(sc == 0.5f);
            t = ms_st_find(st, "scale.e8m0");
            CHECK(t && t->dtype == MS_DT_F8E8M0 &&
                  ms_e8m0_to_f32(((const uint8_t *)t->data)[0]) == 1.0f);
            t = ms_st_find(st, "f64");
            double d;
            memcpy(&d, t->data, 8);
            CHECK(t->dtype == MS_DT_F64 && d == 1.5);
        }
        if (!strcmp(good[i], "unicode")) CHECK(ms_st_find(st, "\xc3\xa9\xe4\xb8\xad"));
        ms_st_close(st);
    }
    for (size_t i = 0; i < MS_ARRAY_LEN(bad); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, bad[i]);
        CHECK(ms_st_open(&st, p, &e) == MS_EFORMAT && strstr(e.msg, "tensor '"));
    }
    CHECK(ms_st_open(&st, dir, &e) == MS_ENOENT); /* a directory without *.safetensors */
}

typedef struct bad_case {
    const char *what;
    const char *hdr;
    uint64_t hlen; /* UINT64_MAX: strlen(hdr) */
    size_t data_bytes;
    const char *must1, *must2; /* substrings the message must contain */
} bad_case;

static const bad_case bad_cases[] = {
    {"header length beyond file", "{}", 1000, 0, "header length 1000", NULL},
    {"2^40 header length", "{}", 1ull << 40, 0, "1099511627776", "limit"},
    {"invalid JSON", "{\"a\": {", UINT64_MAX, 0, "not valid JSON", NULL},
    {"trailing garbage", "{} x", UINT64_MAX, 0, "not valid JSON", NULL},
    {"not an object", "[1,2]", UINT64_MAX, 0, "not a JSON object", NULL},
    {"duplicate keys",
     "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
     "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
     UINT64_MAX, 2, "duplicate", NULL},
    {"unknown dtype", "{\"layer.w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}",
     UINT64_MAX, 1, "'layer.w'", "unknown dtype 'F7'"},
    {"unsupported dtype", "{\"layer.w\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}",
     UINT64_MAX, 1, "'layer.w'", "BOOL is not supported"},
    {"dtype not a string", "{\"layer.w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,1]}}",
     UINT64_MAX, 1, "'layer.w'", "dtype"},
    {"negative shape", "{\"neg\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}",
     UINT64_MAX, 1, "'neg'", "shape entry 0"},
    {"real shape", "{\"r\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", UINT64_MAX,
     1, "'r'", "shape entry 0"},
    {"overflowing shape",
     "{\"huge\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}",
     UINT64_MAX, 4, "'huge'", "overflow"},
    {"overflow via dtype size",
     "{\"huge\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}",
     UINT64_MAX, 8, "'huge'", "overflow"},
    {"too many dims",
     "{\"d9\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", UINT64_MAX,
     1, "'d9'", "dimensions"},
    {"dtype x shape != bytes",
     "{\"m\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", UINT64_MAX, 10, "'m'",
     "12 bytes"},
    {"offsets beyond data",
     "{\"model.layers.3.mlp.gate.weight\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}"
     "}",
     UINT64_MAX, 8, "'model.layers.3.mlp.gate.weight'", "exceed data section of 8 bytes"},
    {"begin after end", "{\"be\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[5,4]}}",
     UINT64_MAX, 8, "'be'", "end before begin"},
    {"negative offset", "{\"no\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}",
     UINT64_MAX, 1, "'no'", "data_offsets"},
    {"offsets missing", "{\"om\":{\"dtype\":\"U8\",\"shape\":[1]}}", UINT64_MAX, 1, "'om'",
     "data_offsets"},
    {"offsets of 3", "{\"o3\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}",
     UINT64_MAX, 1, "'o3'", "data_offsets"},
    {"overlap",
     "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
     "\"y\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
     UINT64_MAX, 6, "'y'", "overlap tensor 'x'"},
    {"gap",
     "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
     "\"y\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}",
     UINT64_MAX, 10, "'y'", "gap of 2 bytes"},
    {"gap at start", "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[1,5]}}", UINT64_MAX,
     5, "'x'", "gap of 1 bytes"},
    {"uncovered tail", "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
     UINT64_MAX, 7, "'x'", "3 uncovered"},
    {"data but no tensors", "{}", UINT64_MAX, 3, "no tensors", NULL},
    {"metadata not strings", "{\"__metadata__\":{\"format\":1}}", UINT64_MAX, 0, "__metadata__",
     "'format'"},
    {"metadata not object", "{\"__metadata__\":[]}", UINT64_MAX, 0, "__metadata__", NULL},
    {"entry not object", "{\"e\":[]}", UINT64_MAX, 0, "'e'", "not a JSON object"},
};

TEST(corrupted_images_rejected)
{
    for (size_t i = 0; i < MS_ARRAY_LEN(bad_cases); i++) {
        const bad_case *c = &bad_cases[i];
        size_t len;
        uint8_t *b = image(c->hdr, c->hlen, c->data_bytes, &len);
        ms_errbuf e = {{0}};
        int rc = ms_st_check_buffer(b, len, &e);
        int ok = rc < 0 && strstr(e.msg, "<buffer>") && strstr(e.msg, c->must1) &&
                 (!c->must2 || strstr(e.msg, c->must2));
        /* the same image as a file: the message names the file */
        char path[512];
        path_of(path, sizeof path, "bad.safetensors");
        ms_st_store *st = (ms_st_store *)1;
        ms_errbuf e2 = {{0}};
        int ok2 = write_bytes(path, b, len) == 0 && ms_st_open_file(&st, path, &e2) == rc &&
                  st == NULL && strstr(e2.msg, path) && strstr(e2.msg, c->must1);
        free(b);
        CHECKF(ok && ok2, "case '%s': rc %d: %s | %s", c->what, rc, e.msg, e2.msg);
    }
}

TEST(truncated_files_rejected)
{
    ms_errbuf e;
    ms_st_writer *w = ms_st_writer_new();
    int64_t s[1] = {16};
    float v[16] = {0};
    CHECK(ms_st_writer_add(w, "w", MS_DT_F32, 1, s, v, sizeof v, &e) == 0);
    char path[512];
    path_of(path, sizeof path, "trunc.safetensors");
    CHECK(ms_st_writer_save(w, path, &e) == 0);
    ms_st_writer_free(w);
    char *raw;
    size_t len;
    CHECK(ms_read_file(path, 1 << 20, &raw, &len) == 0);
    /* every truncation is rejected: inside the data, inside the header, inside the length */
    for (size_t cut = 0; cut < len; cut++) {
        int rc = ms_st_check_buffer((const uint8_t *)raw, cut, &e);
        CHECKF(rc < 0, "cut at %zu accepted", cut);
        if (cut >= len - 64) CHECKF(strstr(e.msg, "'w'"), "cut %zu: %s", cut, e.msg);
    }
    CHECK(write_bytes(path, raw, len - 1) == 0);
    ms_st_store *st;
    CHECK(ms_st_open_file(&st, path, &e) == MS_EFORMAT);
    CHECKF(strstr(e.msg, path) && strstr(e.msg, "'w'") && strstr(e.msg, "exceed data section"),
           "%s", e.msg);
    CHECK(write_bytes(path, raw, 4) == 0);
    CHECK(ms_st_open_file(&st, path, &e) == MS_EFORMAT && strstr(e.msg, "shorter"));
    free(raw);
    CHECK(ms_st_open_file(&st, "/nonexistent.safetensors", &e) == MS_ENOENT);
    CHECK(strstr(e.msg, "/nonexistent.safetensors") != NULL);
    CHECK(ms_st_check_buffer(NULL, 0, &e) < 0);
}

/* Writes a 2-shard checkpoint "a" (x, y) + "b" (z) and then the given index. */
static int make_indexed(const char *dir, const char *index_json)
{
    ms_errbuf e;
    char p[600];
    mkdir(dir, 0755);
    int64_t s[1] = {1};
    float v = 1;
    const char *shard[2] = {"a.safetensors", "b.safetensors"};
    for (int k = 0; k < 2; k++) {
        ms_st_writer *w = ms_st_writer_new();
        if (k == 0) {
            ms_st_writer_add(w, "x", MS_DT_F32, 1, s, &v, 4, &e);
            ms_st_writer_add(w, "y", MS_DT_F32, 1, s, &v, 4, &e);
        } else {
            ms_st_writer_add(w, "z", MS_DT_F32, 1, s, &v, 4, &e);
        }
        snprintf(p, sizeof p, "%s/%s", dir, shard[k]);
        int rc = ms_st_writer_save(w, p, &e);
        ms_st_writer_free(w);
        if (rc) return rc;
    }
    snprintf(p, sizeof p, "%s/%s", dir, MS_ST_INDEX_NAME);
    return write_bytes(p, index_json, strlen(index_json));
}

TEST(index_errors)
{
    struct {
        const char *index, *must1, *must2;
        int rc;
    } cases[] = {
        {"{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\",\"z\":\"b.safetensors\"}"
         "}",
         NULL, NULL, 0},
        {"{\"weight_map\":{\"x\":\"a.safetensors\",\"q\":\"c.safetensors\"}}", "'q'",
         "c.safetensors does not exist", MS_ENOENT},
        {"{\"weight_map\":{\"x\":\"a.safetensors\",\"w\":\"b.safetensors\"}}", "'w'",
         "no such tensor", MS_EFORMAT},
        {"{\"weight_map\":{\"x\":\"b.safetensors\",\"z\":\"a.safetensors\"}}", "'z'",
         "but it is in", MS_EFORMAT},
        {"{\"weight_map\":{\"x\":\"../a.safetensors\"}}", "'x'", "plain file name", MS_EFORMAT},
        {"{\"weight_map\":{\"x\":7}}", "'x'", "plain file name", MS_EFORMAT},
        {"{\"weight_map\":{}}", "weight_map", "empty", MS_EFORMAT},
        {"{\"weight_map\":{\"x\":\"a.safetensors\",\"x\":\"a.safetensors\"}}", "not valid JSON",
         "duplicate", MS_EFORMAT},
        {"{\"metadata\":{}}", "weight_map", NULL, MS_EFORMAT},
        {"not json", "not valid JSON", NULL, MS_EFORMAT},
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(cases); i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/idx%zu", tmpdir, i);
        CHECK(make_indexed(dir, cases[i].index) == 0);
        ms_st_store *st;
        ms_errbuf e = {{0}};
        int rc = ms_st_open_dir(&st, dir, &e);
        CHECKF(rc == cases[i].rc, "case %zu: rc %d: %s", i, rc, e.msg);
        if (rc == 0) {
            CHECK(ms_st_count(st) == 3 && ms_st_find(st, "z"));
            ms_st_close(st);
            continue;
        }
        CHECKF(strstr(e.msg, MS_ST_INDEX_NAME) && strstr(e.msg, cases[i].must1) &&
                   (!cases[i].must2 || strstr(e.msg, cases[i].must2)),
               "case %zu: %s", i, e.msg);
    }
    /* an index naming a corrupt shard: the shard's own error names it */
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/idxbad", tmpdir);
    CHECK(make_indexed(dir, "{\"weight_map\":{\"x\":\"a.safetensors\",\"z\":\"b.safetensors\"}}") ==
          0);
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    CHECK(write_bytes(p, "\x02\0\0\0\0\0\0\0{}x", 11) == 0);
    ms_st_store *st;
    ms_errbuf e;
    CHECK(ms_st_open_dir(&st, dir, &e) == MS_EFORMAT);
    CHECKF(strstr(e.msg, "b.safetensors") && strstr(e.msg, "no tensors"), "%s", e.msg);
}

TEST(expect_checks_shape_and_dtype)
{
    ms_errbuf e;
    ms_st_writer *w = ms_st_writer_new();
    int64_t s[2] = {4, 8};
    static uint16_t v[32];
    CHECK(ms_st_writer_add(w, "model.layers.0.mlp.gate.weight", MS_DT_BF16, 2, s, v, sizeof v,
                           &e) == 0);
    char path[512];
    path_of(path, sizeof path, "expect.safetensors");
    CHECK(ms_st_writer_save(w, path, &e) == 0);
    ms_st_writer_free(w);
    ms_st_store *st;
    CHECK(ms_st_open_file(&st, path, &e) == 0);
    const ms_tensor *t;
    const char *n = "model.layers.0.mlp.gate.weight";
    CHECK(ms_st_expect(st, n, 2, s, MS_DT_MASK(MS_DT_BF16) | MS_DT_MASK(MS_DT_F32), &t, &e) == 0);
    CHECK(t == ms_st_find(st, n));
    int64_t any[2] = {-1, 8};
    CHECK(ms_st_expect(st, n, 2, any, 0, NULL, &e) == 0);
    CHECK(ms_st_expect(st, n, -1, NULL, 0, NULL, &e) == 0);
    int64_t wrong[2] = {8, 4};
    CHECK(ms_st_expect(st, n, 2, wrong, 0, &t, &e) == MS_EFORMAT && t == NULL);
    CHECKF(strstr(e.msg, path) && strstr(e.msg, n) && strstr(e.msg, "[4, 8]") &&
               strstr(e.msg, "[8, 4]"),
           "%s", e.msg);
    int64_t three[3] = {4, 8, 1};
    CHECK(ms_st_expect(st, n, 3, three, 0, NULL, &e) == MS_EFORMAT);
    CHECK(ms_st_expect(st, n, 2, s, MS_DT_MASK(MS_DT_F8E4M3), NULL, &e) == MS_EFORMAT);
    CHECKF(strstr(e.msg, path) && strstr(e.msg, n) && strstr(e.msg, "BF16") &&
               strstr(e.msg, "F8_E4M3"),
           "%s", e.msg);
    CHECK(ms_st_expect(st, "model.norm.weight", 1, s, MS_DT_MASK(MS_DT_BF16), NULL, &e) ==
          MS_ENOENT);
    CHECKF(strstr(e.msg, path) && strstr(e.msg, "'model.norm.weight'") && strstr(e.msg, "[4]") &&
               strstr(e.msg, "BF16"),
           "%s", e.msg);
    ms_st_close(st);
}

/* A V4 FP4 expert (I8 codes + F8_E8M0 per-32 scales) written, loaded through
 * ms_load_fp4_mat and dequantised element by element against the
 * definition (low nibble = even column); then each malformed variant is
 * refused with a message naming the tensor. */
TEST(fp4_expert_load)
{
    enum { R = 6, C = 96 };
    static uint8_t codes[R * C / 2], sc[R * C / 32], sc_nan[R * C / 32];
    static float scf[R * C / 32];
    for (int i = 0; i < R * C / 2; i++) codes[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < R * C / 32; i++) sc[i] = sc_nan[i] = (uint8_t)(120 + i % 9);
    sc_nan[R * C / 32 - 2] = 255;
    ms_errbuf e;
    ms_st_writer *w = ms_st_writer_new();
    const int64_t sw[2] = {R, C / 2}, ss[2] = {R, C / 32}, sbad[2] = {R, C / 16};
    const char *wn = "layers.0.ffn.experts.3.w1.weight";
    CHECK(ms_st_writer_add(w, wn, MS_DT_I8, 2, sw, codes, sizeof codes, &e) == 0);
    CHECK(ms_st_writer_add(w, "layers.0.ffn.experts.3.w1.scale", MS_DT_F8E8M0, 2, ss, sc, sizeof sc,
                           &e) == 0);
    CHECK(ms_st_writer_add(w, "nan.weight", MS_DT_I8, 2, sw, codes, sizeof codes, &e) == 0);
    CHECK(ms_st_writer_add(w, "nan.scale", MS_DT_F8E8M0, 2, ss, sc_nan, sizeof sc, &e) == 0);
    CHECK(ms_st_writer_add(w, "f32s.weight", MS_DT_I8, 2, sw, codes, sizeof codes, &e) == 0);
    CHECK(ms_st_writer_add(w, "f32s.scale", MS_DT_F32, 2, ss, scf, sizeof scf, &e) == 0);
    CHECK(ms_st_writer_add(w, "shape.weight", MS_DT_I8, 2, sw, codes, sizeof codes, &e) == 0);
    CHECK(ms_st_writer_add(w, "shape.scale", MS_DT_F8E8M0, 2, sbad, codes, sizeof sc * 2, &e) == 0);
    CHECK(ms_st_writer_add(w, "alone.weight", MS_DT_I8, 2, sw, codes, sizeof codes, &e) == 0);
    char path[512];
    path_of(path, sizeof path, "fp4.safetensors");
    CHECK(ms_st_writer_save(w, path, &e) == 0);
    ms_st_writer_free(w);
    ms_st_store *st;
    CHECKF(ms_st_open_file(&st, path, &e) == 0, "%s", e.msg);
    ms_mat m;
    CHECK(ms_st_is_fp4(st, wn) && !ms_st_is_fp4(st, "f32s.scale") && !ms_st_is_fp4(st, "none"));
    CHECKF(ms_load_fp4_mat(st, wn, R, C, &m, &e) == 0, "%s", e.msg);
    CHECK(m.dtype == MS_DT_F4E2M1 && m.rows == R && m.cols == C);
    CHECK(ms_mat_bytes(&m) == R * C / 2 + R * C / 32);
    static const float tbl[16] = {0, 0.5f,  1,  1.5f,  2,  3,  4,  6,
                                  0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    int bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            uint8_t b = codes[(r * C + c) / 2];
            float want = tbl[c % 2 ? b >> 4 : b & 15] * ldexpf(1.0f, sc[r * C / 32 + c / 32] - 127);
            if (ms_mat_get(&m, r, c) != want) bad++;
        }
    CHECKF(bad == 0, "%d FP4 values differ", bad);
    /* a TP slice of the down projection's columns keeps its scales */
    ms_mat sl = ms_mat_slice(&m, 1, 4, 32, 64);
    CHECK(ms_mat_get(&sl, 2, 5) == ms_mat_get(&m, 3, 37));
    const ms_tensor *st_s = ms_st_find(st, "layers.0.ffn.experts.3.w1.scale");
    float f[R * C / 32];
    CHECK(ms_e8m0_scales_to_f32(st_s, f, R * C / 32, &e) == 0 && f[0] == 0x1p-7f);
    CHECK(ms_load_fp4_mat(st, "nan.weight", R, C, &m, &e) == MS_EFORMAT);
    CHECKF(strstr(e.msg, "nan.scale") && strstr(e.msg, "row 5, column 1"), "%s", e.msg);
    CHECK(ms_e8m0_scales_to_f32(ms_st_find(st, "nan.scale"), f, R * C / 32, &e) == MS_EFORMAT);
    CHECK(ms_load_fp4_mat(st, "f32s.weight", R, C, &m, &e) == MS_EFORMAT);
    CHECKF(strstr(e.msg, "f32s.scale") && strstr(e.msg, "F8_E8M0"), "%s", e.msg);
    CHECK(ms_load_fp4_mat(st, "shape.weight", R, C, &m, &e) == MS_EFORMAT);
    CHECKF(strstr(e.msg, "shape.scale") && strstr(e.msg, "[6, 3]"), "%s", e.msg);
    CHECK(ms_load_fp4_mat(st, "alone.weight", R, C, &m, &e) == MS_ENOENT);
    CHECK(ms_load_fp4_mat(st, wn, R, 2 * C, &m, &e) == MS_EFORMAT); /* packed cols != K / 2 */
    CHECKF(strstr(e.msg, wn) && strstr(e.msg, "[6, 96]"), "%s", e.msg);
    CHECK(ms_load_fp4_mat(st, wn, R, C - 2, &m, &e) == MS_EFORMAT); /* K % 32 */
    CHECK(ms_load_fp4_mat(st, "layers.0.ffn.experts.3.w1.scale", R, C, &m, &e) == MS_EINVAL);
    ms_st_close(st);
    /* "F4_E2M1" is this program's name for the codes, not a file dtype */
    CHECK(ms_dtype_parse("F4_E2M1") == -1 && ms_dtype_parse("I8") == MS_DT_I8);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ms_st_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(roundtrip_single_file);
    RUN(generator_failure_leaves_no_file);
    RUN(roundtrip_sharded_with_index);
    RUN(big_tensor_gets_own_shard);
    RUN(many_tensors_hash_lookup);
    RUN(dir_listing_without_index);
    RUN(offsets_beyond_4gib);
    RUN(python_written_images);
    RUN(corrupted_images_rejected);
    RUN(truncated_files_rejected);
    RUN(index_errors);
    RUN(expect_checks_shape_and_dtype);
    RUN(fp4_expert_load);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_REPORT();
}
