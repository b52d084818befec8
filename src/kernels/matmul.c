/* matmul.c — ms_matmul / ms_matmul_nn: path choice, threading and scratch.
 *
 * Picks the back end from the kernel context (exact mode, ISA) and the weight
 * dtype, splits the output columns over the pool and runs it: mm_bf16.c
 * (auto mode, BF16/FP8 weights, AVX512_BF16), mm_dnnl.c (auto mode, BF16
 * weights, large M), mm_avx512.c / mm_avx2.c (exact FP32), or the portable
 * scalar path here.  Also CPU feature detection, the per-thread scratch and
 * the bulk conversions.  Call from the rank's main thread (kernels.h).
 */
#include "base/log.h"
#include "base/util.h"
#include "kernels/mm_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

int ms_kernels_detect(void)
{
    const char *env = getenv("MOESERVE_ISA");
    __builtin_cpu_init();
    int best = MS_ISA_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = MS_ISA_AVX2;
    if (best == MS_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        best = MS_ISA_AVX512;
    if (best == MS_ISA_AVX512 && __builtin_cpu_supports("avx512bf16") &&
        __builtin_cpu_supports("avx512vbmi"))
        best = MS_ISA_AVX512BF16;
    if (env) {
        int want = !strcmp(env, "scalar") ? MS_ISA_SCALAR
                   : !strcmp(env, "avx2") ? MS_ISA_AVX2
                   : !strcmp(env, "avx512") ? MS_ISA_AVX512
                                            : MS_ISA_AVX512BF16;
        if (want < best) best = want;
    }
    return best;
}

const char *ms_isa_name(int isa)
{
    static const char *n[] = {"scalar", "avx2", "avx512", "avx512bf16"};
    return isa >= 0 && isa <= 3 ? n[isa] : "?";
}

/* ---- per-thread scratch ---- */

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local void *scratch_ptr;
static _Thread_local size_t scratch_bytes;

static void scratch_free(void *p) { free(p); }
static void scratch_key_init(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

void *ms_mm_scratch(size_t bytes)
{
    if (bytes <= scratch_bytes) return scratch_ptr;
    pthread_once(&scratch_once, scratch_key_init);
    size_t want = bytes + bytes / 4 + 4096;
    want = (want + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, want) != 0) return NULL;
    free(scratch_ptr);
    scratch_ptr = p;
    scratch_bytes = want;
    pthread_setspecific(scratch_key, p); /* freed at thread exit */
    return p;
}

/* ---- portable scalar path (MS_ISA_SCALAR) ---- */

static void scalar_nt(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    float *wrow = ms_mm_scratch(sizeof(float) * (size_t)(W->cols > 0 ? W->cols : 1));
    for (int64_t n = n0; n < n1; n++) {
        const float *w = (const float *)W->data + n * W->ld;
        if (W->dtype != MS_DT_F32) {
            if (!wrow) abort(); /* out of memory in a kernel: nothing sane to return */
            for (int64_t c = 0; c < W->cols; c++) wrow[c] = ms_mat_get(W, n, c);
            w = wrow;
        }
        for (int64_t i = 0; i < t->M; i++) {
            float s = ms_dot_f32(t->x + i * t->ldx, w, W->cols);
            float *yo = t->y + i * t->ldy + n;
            *yo = t->accumulate ? *yo + s : s;
        }
    }
}

static void scalar_nn(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    for (int64_t i = 0; i < t->M; i++) {
        float *yi = t->y + i * t->ldy;
        if (!t->accumulate) memset(yi + n0, 0, sizeof(float) * (size_t)(n1 - n0));
        for (int64_t r = 0; r < W->rows; r++) {
            float a = t->x[i * t->ldx + r];
            for (int64_t n = n0; n < n1; n++) yi[n] += a * ms_mat_get(W, r, n);
        }
    }
}

/* ---- dispatch ---- */

enum path { P_SCALAR, P_AVX2, P_AVX512, P_BF16 };

struct mm_job {
    mm_task t;
    int path, nn;
    int64_t chunk;        /* output columns claimed at a time */
    _Atomic int64_t next; /* first unclaimed output column */
};

static void run_range(const struct mm_job *j, int64_t b, int64_t e)
{
    const mm_task *t = &j->t;
    if (j->nn) {
        switch (j->path) {
        case P_AVX512:
        case P_BF16: ms_mm_avx512_nn(t, b, e); break;
        case P_AVX2: ms_mm_avx2_nn(t, b, e); break;
        default: scalar_nn(t, b, e); break;
        }
        return;
    }
    switch (j->path) {
    case P_BF16:
        if (ms_mm_bf16_nt(t, b, e) == 0) break;
        ms_mm_avx512_nt(t, b, e); /* no scratch: the exact path needs none */
        break;
    case P_AVX512: ms_mm_avx512_nt(t, b, e); break;
    case P_AVX2: ms_mm_avx2_nt(t, b, e); break;
    default: scalar_nt(t, b, e); break;
    }
}

/* Threads claim chunks of output columns until none are left, so a thread
 * that starts late (a busy or oversubscribed core) takes less work instead of
 * holding everyone up.  Each output element is computed the same way whoever
 * computes it: results do not depend on the split. */
static void mm_worker(void *arg, int tid, int nt)
{
    struct mm_job *j = arg;
    int64_t N = j->nn ? j->t.W->cols : j->t.W->rows;
    (void)tid;
    (void)nt;
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
        if (b >= N) break;
        run_range(j, b, b + j->chunk < N ? b + j->chunk : N);
    }
}

static int pick_path(const ms_kctx *k, const ms_mat *W)
{
    int isa = k ? k->isa : MS_ISA_SCALAR;
    if (W->dtype != MS_DT_F32 && W->dtype != MS_DT_BF16 && W->dtype != MS_DT_F16 &&
        W->dtype != MS_DT_F8E4M3)
        return P_SCALAR; /* ms_mat_get gives NaN: keep the behaviour of the reference */
    if (isa >= MS_ISA_AVX512BF16 && !k->exact &&
        (W->dtype == MS_DT_BF16 || W->dtype == MS_DT_F8E4M3))
        return P_BF16;
    if (isa >= MS_ISA_AVX512) return P_AVX512;
    if (isa >= MS_ISA_AVX2) return P_AVX2;
    return P_SCALAR;
}

/* Below this many multiply-adds a call runs on the calling thread only: the
 * pool hand-off (>= 5 µs measured here) would cost more than it saves
 * (2^18 BF16 weights take about 15 µs on one core at 35 GB/s). */
enum { MT_MIN_MACS = 1 << 18 };

static void run(const ms_kctx *k, struct mm_job *j)
{
    int64_t N = j->nn ? j->t.W->cols : j->t.W->rows;
    int64_t K = j->nn ? j->t.W->rows : j->t.W->cols;
    int nt = k ? ms_pool_size(k->pool) : 1;
    if (j->t.M * N * K < MT_MIN_MACS) nt = 1;
    /* about 4 chunks per thread, whole 128-row blocks (FP8 scales) when big */
    int64_t align = j->nn ? 64 : 16, c = (N + 4 * nt - 1) / (4 * nt);
    if (c >= 128) align = 128;
    j->chunk = nt == 1 ? N : (c + align - 1) / align * align;
    atomic_init(&j->next, 0);
    if (nt == 1) mm_worker(j, 0, 1);
    else ms_pool_run_dynamic(k->pool, mm_worker, j);
}

void ms_matmul(const ms_kctx *k, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
               const ms_mat *W, int accumulate)
{
    if (M <= 0 || W->rows <= 0) return;
    struct mm_job j = {{y, ldy, x, ldx, M, W, accumulate}, pick_path(k, W), 0, 0, 0};
    if (j.path == P_BF16 && W->dtype == MS_DT_BF16 && ms_mm_dnnl_nt(k, &j.t) == 0) return;
    run(k, &j);
}

/* ---- batches of products ---- */

#define BATCH_MAX 512
enum { ITEM_MIN_BYTES = 64 << 10 };

struct mm_batch {
    struct mm_job jobs[BATCH_MAX];
    int64_t first[BATCH_MAX + 1]; /* first work item of each job */
    int n;
    _Atomic int64_t next;         /* next unclaimed work item */
};

static void batch_worker(void *arg, int tid, int nt)
{
    struct mm_batch *b = arg;
    (void)tid;
    (void)nt;
    int j = 0;
    for (;;) {
        int64_t item = atomic_fetch_add_explicit(&b->next, 1, memory_order_relaxed);
        if (item >= b->first[b->n]) break;
        while (b->first[j + 1] <= item) j++; /* items are claimed in increasing order */
        const struct mm_job *job = &b->jobs[j];
        int64_t N = job->nn ? job->t.W->cols : job->t.W->rows,
                s0 = (item - b->first[j]) * job->chunk;
        run_range(job, s0, s0 + job->chunk < N ? s0 + job->chunk : N);
    }
}

void ms_matmul_batch(const ms_kctx *k, const ms_mm_call *calls, int n)
{
    int nt = k ? ms_pool_size(k->pool) : 1;
    int64_t total_macs = 0;
    for (int i = 0; i < n; i++)
        if (calls[i].M > 0) total_macs += calls[i].M * calls[i].W->rows * calls[i].W->cols;
    static struct mm_batch batch; /* kernels run on the rank's main thread only */
    struct mm_batch *b = &batch;
    if (n > BATCH_MAX || nt == 1 || total_macs < MT_MIN_MACS) {
        for (int i = 0; i < n; i++)
            (calls[i].nn ? ms_matmul_nn : ms_matmul)(k, calls[i].y, calls[i].ldy, calls[i].x,
                                                     calls[i].ldx, calls[i].M, calls[i].W,
                                                     calls[i].accumulate);
        return;
    }
    b->n = 0;
    b->first[0] = 0;
    for (int i = 0; i < n; i++) {
        const ms_mm_call *c = &calls[i];
        if (c->M <= 0 || c->W->rows <= 0 || c->W->cols <= 0) continue;
        struct mm_job *j = &b->jobs[b->n];
        *j = (struct mm_job){{c->y, c->ldy, c->x, c->ldx, c->M, c->W, c->accumulate},
                             pick_path(k, c->W), c->nn != 0, 0, 0};
        if (!c->nn && j->path == P_BF16 && c->W->dtype == MS_DT_BF16 &&
            ms_mm_dnnl_nt(k, &j->t) == 0)
            continue; /* large M: oneDNN did it on its own threads */
        int64_t N = c->nn ? c->W->cols : c->W->rows;
        int64_t align = c->nn ? 64 : j->path == P_BF16 && c->W->dtype == MS_DT_F8E4M3 ? 128 : 16;
        int64_t ch = (N + 2 * nt - 1) / (2 * nt);
        /* at least ITEM_MIN_BYTES of weights per item: small matrices (MLA's
         * per-head absorption, 32 KiB each) go whole to one thread instead of
         * in 8 KiB pieces that each restart the memory stream */
        int64_t line = (c->nn ? c->W->rows : c->W->cols) * ms_dtype_size(c->W->dtype);
        ch = MS_MAX(ch, (ITEM_MIN_BYTES + line - 1) / line);
        j->chunk = (ch + align - 1) / align * align;
        b->first[b->n + 1] = b->first[b->n] + (N + j->chunk - 1) / j->chunk;
        b->n++;
    }
    if (b->n == 0) return;
    atomic_init(&b->next, 0);
    ms_pool_run_dynamic(k->pool, batch_worker, b);
}

void ms_matmul_nn(const ms_kctx *k, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
                  const ms_mat *W, int accumulate)
{
    if (M <= 0 || W->cols <= 0) return;
    struct mm_job j = {{y, ldy, x, ldx, M, W, accumulate}, pick_path(k, W), 1, 0, 0};
    run(k, &j);
}

/* ---- bulk conversions ---- */

void ms_cvt_to_f32(int isa, ms_dtype dt, const void *in, float *out, int64_t n)
{
    if (dt != MS_DT_F32 && dt != MS_DT_BF16 && dt != MS_DT_F16 && dt != MS_DT_F8E4M3) return;
    if (isa >= MS_ISA_AVX512) {
        ms_mm_avx512_cvt(dt, in, out, n);
    } else if (isa >= MS_ISA_AVX2) {
        ms_mm_avx2_cvt(dt, in, out, n);
    } else {
        const uint8_t *b = in;
        if (dt == MS_DT_F8E4M3)
            for (int64_t i = 0; i < n; i++) out[i] = ms_fp8e4m3_to_f32(b[i]);
        else
            for (int64_t i = 0; i < n; i++) out[i] = ms_mat_get(&(ms_mat){.dtype = dt, .ld = n, .data = in}, 0, i);
    }
}

void ms_cvt_f32_to_bf16(int isa, const float *in, uint16_t *out, int64_t n)
{
    if (isa >= MS_ISA_AVX512BF16) {
        ms_mm_bf16_cvt_f32(in, out, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = ms_f32_to_bf16(in[i]);
}

void ms_cvt_fp8_to_bf16(int isa, const uint8_t *in, uint16_t *out, int64_t n)
{
    if (isa >= MS_ISA_AVX512BF16) {
        ms_mm_bf16_cvt_fp8(in, out, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = ms_f32_to_bf16(ms_fp8e4m3_to_f32(in[i]));
}
