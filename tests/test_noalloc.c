/* test_noalloc.c — the decode loop does not call malloc: counts every
 * malloc/calloc/realloc/aligned_alloc/posix_memalign (linked with
 * -Wl,--wrap) while a single-rank engine decodes two sequences, after a
 * few warm-up steps.  Also checks the count is non-zero when allocating, so the
 * counter itself works, and that the first decode step after a prefill
 * allocates none of the prefill's context-sized buffers. */
#include "harness.h"
#include "serve/engine.h"
#include "tools/mkmodel.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef NOALLOC_WARMUP
#define NOALLOC_WARMUP 8 /* steps that may still grow workspaces */
#endif

static _Atomic long n_alloc, n_bytes;
static _Atomic int counting;

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t al, size_t n);
int __real_posix_memalign(void **p, size_t al, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t al, size_t n);
int __wrap_posix_memalign(void **p, size_t al, size_t n);

void *__wrap_malloc(size_t n)
{
    if (counting) {
        n_alloc++;
        n_bytes += (long)n;
    }
    return __real_malloc(n);
}
void *__wrap_calloc(size_t a, size_t b)
{
    if (counting) {
        n_alloc++;
        n_bytes += (long)(a * b);
    }
    return __real_calloc(a, b);
}
void *__wrap_realloc(void *p, size_t n)
{
    if (counting) {
        n_alloc++;
        n_bytes += (long)n;
    }
    return __real_realloc(p, n);
}
void *__wrap_aligned_alloc(size_t al, size_t n)
{
    if (counting) {
        n_alloc++;
        n_bytes += (long)n;
    }
    return __real_aligned_alloc(al, n);
}
int __wrap_posix_memalign(void **p, size_t al, size_t n)
{
    if (counting) {
        n_alloc++;
        n_bytes += (long)n;
    }
    return __real_posix_memalign(p, al, n);
}

TEST(counter_counts)
{
    void *(*volatile mf)(size_t) = malloc; /* keep the compiler from eliding the call */
    counting = 1;
    void *p = mf(10);
    counting = 0;
    free(p);
    CHECK(n_alloc == 1);
    n_alloc = 0;
}

/* A tiny-v3 checkpoint in a fresh directory dir (a mkdtemp template); 0 or
 * an error in err. */
static int tiny_model(char *dir, ms_config *cfg, ms_errbuf *err)
{
    if (!mkdtemp(dir)) return ms_err(err, MS_EIO, "mkdtemp failed");
    if (ms_mkmodel_preset("tiny-v3", cfg)) return ms_err(err, MS_EINVAL, "no tiny-v3 preset");
    return ms_mkmodel_write(cfg, MS_MK_BF16, 5, dir, 0, err);
}

/* A single-rank engine over dir: 2 threads, a 1024-token pool. */
static int open_engine(const char *dir, int exact, ms_engine **e, ms_errbuf *err)
{
    ms_engine_opts o;
    ms_engine_opts_init(&o);
    o.model_path = dir;
    o.threads = 2;
    o.exact = exact;
    o.max_total_tokens = 1024;
    return ms_engine_open(e, &o, err);
}

static void close_engine(ms_engine *e)
{
    ms_errbuf err = {{0}};
    ms_engine_shutdown(e);
    ms_engine_step(e, &err);
    ms_engine_close(e);
}

static void remove_dir(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST(decode_steps_do_not_allocate)
{
    char dir[] = "/tmp/ms_noalloc_XXXXXX";
    ms_config cfg;
    ms_errbuf err = {{0}};
    CHECKF(tiny_model(dir, &cfg, &err) == 0, "%s", err.msg);
    for (int exact = 0; exact <= 1; exact++) {
        ms_engine *e;
        CHECKF(open_engine(dir, exact, &e, &err) == 0, "%s", err.msg);
        int32_t p1[] = {0, 5, 6, 7, 8, 9, 10}, p2[] = {0, 44};
        ms_req_params a = {.id = 1,
                           .ids = p1,
                           .n_ids = 7,
                           .max_new = 60,
                           .ignore_eos = 1,
                           .top_logprobs = 5,
                           .samp = {.temperature = 0.7f, .top_p = 0.9f, .top_k = 20}};
        ms_req_params b = {.id = 2,
                           .ids = p2,
                           .n_ids = 2,
                           .max_new = 60,
                           .ignore_eos = 1,
                           .top_logprobs = -1,
                           .samp = {.temperature = 0, .top_p = 1}};
        CHECK(ms_engine_submit(e, &a, &err) == 0 && ms_engine_submit(e, &b, &err) == 0);
        long worst = 0;
        for (int step = 0; step < 40; step++) {
            if (step >= NOALLOC_WARMUP) {
                n_alloc = 0;
                counting = 1;
            }
            CHECK(ms_engine_step(e, &err) == 0);
            counting = 0;
            if (step >= NOALLOC_WARMUP && n_alloc > worst) worst = n_alloc;
        }
        CHECKF(worst == 0, "%ld allocations in one decode step (exact=%d)", worst, exact);
        close_engine(e);
    }
    remove_dir(dir);
}

/* A decode over S + 1 rows needs only the absorbed form's scratch; the
 * naive form's buffers (expanded keys/values alone are S × H × (dn + dv)
 * floats) were regrown, and zeroed, in the first decode step after a prefill
 * that had set their capacity to its S (0.34 s at small-v3's 4,096 tokens). */
TEST(first_decode_after_prefill_grows_no_prefill_buffers)
{
    char dir[] = "/tmp/ms_noalloc_XXXXXX";
    ms_config cfg;
    ms_errbuf err = {{0}};
    CHECKF(tiny_model(dir, &cfg, &err) == 0, "%s", err.msg);
    ms_engine *e;
    CHECKF(open_engine(dir, 0, &e, &err) == 0, "%s", err.msg);
    enum { P = 300 }; /* above the workspace's 256-row minimum */
    int32_t ids[P];
    for (int i = 0; i < P; i++) ids[i] = 3 + (i * 37) % 1000;
    ms_req_params a = {.id = 1,
                       .ids = ids,
                       .n_ids = P,
                       .max_new = 4,
                       .ignore_eos = 1,
                       .top_logprobs = -1,
                       .samp = {.temperature = 0, .top_p = 1}};
    CHECK(ms_engine_submit(e, &a, &err) == 0);
    long first_decode = -1;
    for (int step = 0; step < 40 && ms_engine_busy(e) && first_decode < 0; step++) {
        n_bytes = 0;
        counting = 1;
        CHECK(ms_engine_step(e, &err) == 0);
        counting = 0;
        ms_engine_step_stats st;
        ms_engine_last_step(e, &st);
        if (st.decode_rows > 0 && st.rows == st.decode_rows) first_decode = n_bytes;
    }
    long kv_bytes = (long)(P + 1) * cfg.n_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * 4;
    CHECKF(first_decode >= 0 && first_decode < kv_bytes,
           "first decode step allocated %ld bytes (expanded keys/values of %d rows: %ld)",
           first_decode, P + 1, kv_bytes);
    close_engine(e);
    remove_dir(dir);
}

int main(void)
{
    RUN(counter_counts);
    RUN(decode_steps_do_not_allocate);
    RUN(first_decode_after_prefill_grows_no_prefill_buffers);
    return TEST_REPORT();
}
