/* matmul.c — ms_matmul / ms_matmul_nn: path choice, threading and scratch.
 *
 * Picks the back end from the kernel context (exact mode, ISA) and the weight
 * dtype, splits the output columns over the pool and runs it: mm_bf16.c
 * (auto mode, BF16/FP8 weights, AVX512_BF16), mm_dnnl.c (auto mode, BF16
 * weights, large M), mm_widen.c (auto mode, BF16/FP8 weights, AVX-512
 * without AVX512_BF16), mm_fp4.c (auto mode, FP4 weights, AVX-512 with
 * or without AVX512_BF16),
 * mm_avx512.c / mm_avx2.c (exact FP32), or the portable
 * scalar path here.  Also CPU feature detection, the per-thread scratch and
 * the bulk conversions.  Call from the rank's main thread (kernels.h).
 */
#include "base/log.h"
#include "base/util.h"
#include "kernels/mm_internal.h"

#include <immintrin.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* AVX512_BF16 that CPUID does not list (VMs that hide it from the guest while
 * the host core executes it): run vcvtne2ps2bf16 and vdpbf16ps once under a
 * SIGILL handler and check their results.  Only when MOESERVE_ISA=avx512bf16
 * asks for it: a guest that migrates to a host without the instructions
 * would then die of SIGILL, which is why the hypervisor hides them. */
static sigjmp_buf probe_jmp;
static void probe_sigill(int sig)
{
    (void)sig;
    siglongjmp(probe_jmp, 1);
}

__attribute__((target("avx512f,avx512bf16"), noinline)) static float probe_dpbf16(float a, float b)
{
    __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    __m512bh pa = _mm512_cvtne2ps_pbh(va, va), pb = _mm512_cvtne2ps_pbh(vb, vb);
    __m512 acc = _mm512_dpbf16_ps(_mm512_set1_ps(1.0f), pa, pb);
    return _mm512_reduce_add_ps(acc);
}

static int probe_bf16(void)
{
    struct sigaction sa = {0}, old;
    sa.sa_handler = probe_sigill;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGILL, &sa, &old) != 0) return 0;
    volatile int ok = 0;              /* set between sigsetjmp and a possible siglongjmp */
    if (sigsetjmp(probe_jmp, 1) == 0) /* exact in bf16: 16 lanes x (1 + 2 x 1.5 x -2.25) */
        ok = probe_dpbf16(1.5f, -2.25f) == 16.0f * (1.0f + 2.0f * 1.5f * -2.25f);
    sigaction(SIGILL, &old, NULL);
    return ok;
}

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
    /* the AVX512_BF16 kernels also need VBMI (FP8 tables) and GFNI (plain FP8
     * rows): every CPU with AVX512_BF16 and VBMI so far (Sapphire Rapids on,
     * Zen 4 on) has GFNI */
    int vbmi_gfni = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
    if (best == MS_ISA_AVX512 && __builtin_cpu_supports("avx512bf16") && vbmi_gfni)
        best = MS_ISA_AVX512BF16;
    if (env) {
        int want = !strcmp(env, "scalar")   ? MS_ISA_SCALAR
                   : !strcmp(env, "avx2")   ? MS_ISA_AVX2
                   : !strcmp(env, "avx512") ? MS_ISA_AVX512
                                            : MS_ISA_AVX512BF16;
        if (want < best) best = want;
        static int probed = -1; /* the load calls this once per model */
        if (!strcmp(env, "avx512bf16") && best == MS_ISA_AVX512 && vbmi_gfni) {
            if (probed < 0) {
                probed = probe_bf16();
                if (probed)
                    MS_LOG(MS_WARN, "kernels",
                           "MOESERVE_ISA=avx512bf16: CPUID does not list AVX512_BF16 but this "
                           "core executes it (probed); using it (SIGILL if the VM migrates to a "
                           "host without it)");
                else
                    MS_LOG(MS_WARN, "kernels",
                           "MOESERVE_ISA=avx512bf16: this CPU does not execute AVX512_BF16; "
                           "using avx512");
            }
            if (probed) best = MS_ISA_AVX512BF16;
        }
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
static _Thread_local struct scratch {
    void *p[MM_SCR_N];
    size_t bytes[MM_SCR_N];
} scratch;

static void scratch_free(void *arg)
{
    struct scratch *s = arg;
    for (int i = 0; i < MM_SCR_N; i++) free(s->p[i]);
}
static void scratch_key_init(void)
{
    (void)pthread_key_create(&scratch_key, scratch_free);
}

void *ms_mm_scratch(int slot, size_t bytes)
{
    if (bytes <= scratch.bytes[slot]) return scratch.p[slot];
    pthread_once(&scratch_once, scratch_key_init);
    size_t want = bytes + bytes / 4 + 4096;
    want = (want + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, want) != 0) return NULL;
    free(scratch.p[slot]);
    scratch.p[slot] = p;
    scratch.bytes[slot] = want;
    pthread_setspecific(scratch_key, &scratch); /* freed at thread exit */
    return p;
}

/* ---- portable scalar path (MS_ISA_SCALAR) ---- */

static void scalar_nt(const mm_task *t, int64_t n0, int64_t n1)
{
    const ms_mat *W = t->W;
    float *wrow = ms_mm_scratch(MM_SCR_W, sizeof(float) * (size_t)(W->cols > 0 ? W->cols : 1));
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

enum path { P_SCALAR, P_AVX2, P_AVX2P, P_AVX512, P_BF16, P_WIDEN, P_FP4, P_FP4BF };

struct mm_job {
    mm_task t;
    int path, nn;
};

/* x·Wᵀ at M >= this takes the packed-panel kernel in auto mode: mm_bf16_pack.c
 * (BF16 weights, below oneDNN's MIN_M) on AVX512_BF16 from 16 rows,
 * mm_avx2_pack.c on AVX2 from 32 (at 16 its panel packing costs as much as it
 * saves: bench_kernels --prefill); MOESERVE_PACK_MIN_M overrides both (a huge
 * value turns them off; measured: bench/RESULTS.md, prefill rows). */
static int64_t pack_min_m(int avx2)
{
    static int64_t v = -1; /* read once, on the first call (main thread: the first product) */
    if (v < 0) {
        const char *e = getenv("MOESERVE_PACK_MIN_M");
        v = e && atol(e) > 0 ? atol(e) : 0;
    }
    return v ? v : avx2 ? 32 : 16;
}

static void run_range(const struct mm_job *j, int64_t b, int64_t e)
{
    const mm_task *t = &j->t;
    if (j->nn && t->W->dtype == MS_DT_F4E2M1) { /* no caller multiplies x·W by FP4 weights */
        scalar_nn(t, b, e);
        return;
    }
    if (j->nn) {
        switch (j->path) {
        case P_BF16:
            if (ms_mm_bf16_nn(t, b, e) == 0) break;
            ms_mm_avx512_nn(t, b, e); /* not a case it takes: the exact path */
            break;
        case P_WIDEN:
            if (ms_mm_widen_nn(t, b, e) == 0) break;
            ms_mm_avx512_nn(t, b, e); /* BF16, or a case it does not take: the exact path */
            break;
        case P_AVX512:
            ms_mm_avx512_nn(t, b, e);
            break;
        case P_AVX2:
        case P_AVX2P:
            ms_mm_avx2_nn(t, b, e);
            break;
        default:
            scalar_nn(t, b, e);
            break;
        }
        return;
    }
    switch (j->path) {
    case P_BF16:
        if (!t->binv && t->M >= pack_min_m(0) && ms_mm_bf16_pack_nt(t, b, e) == 0) break;
        if (ms_mm_bf16_nt(t, b, e) == 0) break;
        ms_mm_avx512_nt(t, b, e); /* no scratch: the exact path needs none */
        break;
    case P_WIDEN:
        if (ms_mm_widen_nt(t, b, e) == 0) break;
        ms_mm_avx512_nt(t, b, e);
        break;
    case P_FP4:
        if (ms_mm_fp4_nt(t, b, e) == 0) break;
        ms_mm_avx512_nt(t, b, e); /* a view it does not take, or no scratch */
        break;
    case P_FP4BF:
        if (ms_mm_fp4_bf16_nt(t, b, e) == 0) break;
        ms_mm_avx512_nt(t, b, e);
        break;
    case P_AVX512:
        ms_mm_avx512_nt(t, b, e);
        break;
    case P_AVX2P:
        if (t->M >= pack_min_m(1) && ms_mm_avx2_pack_nt(t, b, e) == 0) break;
        ms_mm_avx2_nt_auto(t, b, e);
        break;
    case P_AVX2:
        ms_mm_avx2_nt(t, b, e);
        break;
    default:
        scalar_nt(t, b, e);
        break;
    }
}

static int pick_path(const ms_kctx *k, const ms_mat *W)
{
    int isa = k ? k->isa : MS_ISA_SCALAR;
    if (W->dtype != MS_DT_F32 && W->dtype != MS_DT_BF16 && W->dtype != MS_DT_F16 &&
        W->dtype != MS_DT_F8E4M3 && W->dtype != MS_DT_F4E2M1)
        return P_SCALAR; /* ms_mat_get gives NaN: keep the behaviour of the reference */
    if (W->dtype == MS_DT_F4E2M1)
        return isa >= MS_ISA_AVX512 ? (k->exact || k->batch_invariant ? P_AVX512
                                       : isa >= MS_ISA_AVX512BF16     ? P_FP4BF
                                                                      : P_FP4)
               : isa >= MS_ISA_AVX2 ? (k->exact || k->batch_invariant ? P_AVX2 : P_AVX2P)
                                    : P_SCALAR;
    if (isa >= MS_ISA_AVX512BF16 && !k->exact &&
        (W->dtype == MS_DT_BF16 || W->dtype == MS_DT_F8E4M3))
        return P_BF16;
    if (isa == MS_ISA_AVX512 && !k->exact && !k->batch_invariant && /* its order follows M */
        (W->dtype == MS_DT_BF16 ||
         (W->dtype == MS_DT_F8E4M3 && __builtin_cpu_supports("avx512vbmi") &&
          __builtin_cpu_supports("gfni"))))
        return P_WIDEN;
    if (isa >= MS_ISA_AVX512) return P_AVX512;
    if (isa >= MS_ISA_AVX2 && !k->exact && !k->batch_invariant) /* its order follows M */
        return P_AVX2P;
    if (isa >= MS_ISA_AVX2) return P_AVX2;
    return P_SCALAR;
}

int ms_kernels_f8_plain_used(const ms_kctx *k)
{
    return pick_path(k, &(ms_mat){.dtype = MS_DT_F8E4M3}) != P_SCALAR;
}

/* ---- scheduling: one pool run for one or many products ----
 *
 * The products' output columns are cut into slices of about SLICE_BYTES of
 * weights, listed in call order (for the weights of one product: memory
 * order).  Each thread owns a contiguous share of the list, equal in cost,
 * and works through it front to back, so it reads one long forward stream of
 * weights; a thread whose share is done takes single slices from the back of
 * the share with the most left.  The last thread to finish therefore waits
 * for at most about one slice, and no thread restarts its stream at every
 * claim.  (Measured against the earlier shared counter of 128-row chunks:
 * bench/HISTORY.md.)  Each output element is computed the same way whoever
 * computes it: results do not depend on the split. */

#define BATCH_MAX 512
enum {
    SLICE_BYTES = 32 << 10, /* weights per slice (small matrices stay whole) */
    MAX_SLICES = 4096,      /* slices grow beyond SLICE_BYTES to stay below half of it */
    MAX_SHARES = 64,        /* threads beyond this share the last shares' work by stealing */
    CLAIM_MAX = 8,          /* slices an owner claims at once, early in its share */
};

struct slice {
    int32_t job;
    int64_t n0, n1;
    double cost; /* weight bytes × (rows + 3): memory plus arithmetic */
};

struct share {
    _Alignas(64) _Atomic uint64_t fb; /* front << 32 | back: unclaimed slices [front, back) */
};

struct sched {
    struct mm_job jobs[BATCH_MAX];
    struct slice sl[MAX_SLICES];
    struct share share[MAX_SHARES];
    int n_jobs, n_sl, n_shares;
};

/* Claims slices from share s: the owner from the front (a few at a time while
 * plenty are left), a thief one from the back.  Returns the count (0: empty). */
static int claim(struct share *sh, int owner, int *first)
{
    uint64_t fb = atomic_load_explicit(&sh->fb, memory_order_relaxed);
    for (;;) {
        uint32_t f = (uint32_t)(fb >> 32), b = (uint32_t)fb;
        if (f >= b) return 0;
        uint32_t g = 1;
        if (owner) {
            g = (b - f) / 4;
            g = g < 1 ? 1 : g > CLAIM_MAX ? CLAIM_MAX : g;
        }
        uint64_t want = owner ? (uint64_t)(f + g) << 32 | b : (uint64_t)f << 32 | (b - 1);
        if (atomic_compare_exchange_weak_explicit(&sh->fb, &fb, want, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *first = owner ? (int)f : (int)(b - 1);
            return (int)g;
        }
    }
}

/* Runs slices [i, i + n): consecutive slices of one product as one call. */
static void run_slices(const struct sched *S, int i, int n)
{
    while (n > 0) {
        const struct slice *a = &S->sl[i];
        int64_t end = a->n1;
        int used = 1;
        while (used < n && S->sl[i + used].job == a->job) end = S->sl[i + used++].n1;
        run_range(&S->jobs[a->job], a->n0, end);
        i += used;
        n -= used;
    }
}

static void sched_worker(void *arg, int tid, int nt)
{
    struct sched *S = arg;
    (void)nt;
    int first, n;
    if (tid < S->n_shares)
        while ((n = claim(&S->share[tid], 1, &first)) > 0) run_slices(S, first, n);
    for (;;) { /* own share done (or none): steal from the fullest */
        int best = -1;
        uint32_t most = 0;
        for (int s = 0; s < S->n_shares; s++) {
            uint64_t fb = atomic_load_explicit(&S->share[s].fb, memory_order_relaxed);
            uint32_t f = (uint32_t)(fb >> 32), b = (uint32_t)fb;
            if (b > f && b - f > most) most = b - f, best = s;
        }
        if (best < 0) return;
        if ((n = claim(&S->share[best], 0, &first)) > 0) run_slices(S, first, n);
    }
}

/* Below this many multiply-adds a call runs on the calling thread only: the
 * pool hand-off would cost more than it saves.  2^15 lets the MoE router
 * (64 x 1024 BF16, read cold once per token) use both threads (measured:
 * bench/RESULTS.md, "Why the code is so"). */
enum { MT_MIN_MACS = 1 << 15 };

/* Slices the n jobs in S->jobs and runs them on the pool (or here). */
static void sched_run(const ms_kctx *k, struct sched *S)
{
    static uint64_t runs; /* main thread only */
    int nt = k ? ms_pool_size(k->pool) : 1;
    int64_t total_bytes = 0, total_macs = 0;
    runs++;
    for (int i = 0; i < S->n_jobs; i++) {
        const ms_mat *W = S->jobs[i].t.W;
        S->jobs[i].t.run = runs;
        total_bytes += W->rows * ms_dtype_bytes(W->dtype, W->cols);
        total_macs += S->jobs[i].t.M * W->rows * W->cols;
    }
    if (nt == 1 || total_macs < MT_MIN_MACS) {
        for (int i = 0; i < S->n_jobs; i++) {
            const struct mm_job *j = &S->jobs[i];
            run_range(j, 0, j->nn ? j->t.W->cols : j->t.W->rows);
        }
        return;
    }
    int64_t slice = MS_MAX((int64_t)SLICE_BYTES, 2 * total_bytes / MAX_SLICES);
    double total_cost = 0;
    S->n_sl = 0;
    for (int i = 0; i < S->n_jobs; i++) {
        const struct mm_job *j = &S->jobs[i];
        const ms_mat *W = j->t.W;
        int64_t N = j->nn ? W->cols : W->rows;
        int64_t line = ms_dtype_bytes(W->dtype, j->nn ? W->rows : W->cols); /* bytes per column */
        /* whole 128-row blocks for FP8 (one activation scaling per block), whole
         * panels where they are held */
        int64_t align = j->nn ? 64
                        : (j->path == P_BF16 || j->path == P_WIDEN) && W->dtype == MS_DT_F8E4M3
                            ? 128
                        : j->path == P_BF16 && W->panels ? 64
                                                         : 16;
        int64_t per = (slice + line - 1) / line;
        per = (per + align - 1) / align * align;
        /* at most total_bytes / slice + n_jobs <= MAX_SLICES / 2 + BATCH_MAX slices */
        for (int64_t n = 0; n < N; n += per) {
            int64_t e = n + per < N ? n + per : N;
            double cost = (double)(e - n) * line * (double)(j->t.M + 3);
            S->sl[S->n_sl++] = (struct slice){i, n, e, cost};
            total_cost += cost;
        }
    }
    /* shares of equal cost */
    int ns = nt < MAX_SHARES ? nt : MAX_SHARES, s = 0;
    double acc = 0;
    uint32_t start = 0;
    for (int i = 0; i < S->n_sl && s < ns - 1; i++) {
        acc += S->sl[i].cost;
        if (acc >= total_cost * (s + 1) / ns) {
            atomic_store_explicit(&S->share[s++].fb, (uint64_t)start << 32 | (uint32_t)(i + 1),
                                  memory_order_relaxed);
            start = (uint32_t)(i + 1);
        }
    }
    for (; s < ns; s++) { /* the last share takes the rest; any others are empty */
        atomic_store_explicit(&S->share[s].fb, (uint64_t)start << 32 | (uint32_t)S->n_sl,
                              memory_order_relaxed);
        start = (uint32_t)S->n_sl;
    }
    S->n_shares = ns;
    ms_pool_run_dynamic(k->pool, sched_worker, S);
}

/* The schedule of the current call: kernels run on the rank's main thread
 * only (kernels.h), so one is enough. */
static struct sched sched_state;

void ms_matmul_batch(const ms_kctx *k, const ms_mm_call *calls, int n)
{
    struct sched *S = &sched_state;
    if (n > BATCH_MAX) {
        for (int i = 0; i < n; i++) ms_matmul_batch(k, calls + i, 1);
        return;
    }
    S->n_jobs = 0;
    (void)pack_min_m(0); /* read here, on the main thread, before any pool thread asks */
    for (int i = 0; i < n; i++) {
        const ms_mm_call *c = &calls[i];
        if (c->M <= 0 || (c->nn ? c->W->cols : c->W->rows) <= 0) continue; /* no outputs */
        struct mm_job *j = &S->jobs[S->n_jobs];
        *j = (struct mm_job){
            {c->y, c->ldy, c->x, c->ldx, c->M, c->W, c->accumulate, 0, k && k->batch_invariant},
            pick_path(k, c->W),
            c->nn != 0};
        if (!c->nn && j->path == P_BF16 && c->W->dtype == MS_DT_BF16 && !j->t.binv &&
            !c->W->panels && ms_mm_dnnl_nt(k, &j->t) == 0)
            continue; /* large M: oneDNN did it on its own threads */
        S->n_jobs++;
    }
    sched_run(k, S);
}

void ms_matmul(const ms_kctx *k, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
               const ms_mat *W, int accumulate)
{
    ms_matmul_batch(k, &(ms_mm_call){y, ldy, x, ldx, M, W, accumulate, 0}, 1);
}

void ms_matmul_nn(const ms_kctx *k, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t M,
                  const ms_mat *W, int accumulate)
{
    ms_matmul_batch(k, &(ms_mm_call){y, ldy, x, ldx, M, W, accumulate, 1}, 1);
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
            for (int64_t i = 0; i < n; i++)
                out[i] = ms_mat_get(&(ms_mat){.dtype = dt, .ld = n, .data = in}, 0, i);
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
    /* 16 codes at a time in 16-bit lanes: normal codes shift the exponent and
     * mantissa into place and rebias (7 -> 127), the 8 codes of exponent 0
     * (zero, subnormals) come from a table, NaN codes give 0x7fc0; the sign ORed in */
    const __m256i lo8 = _mm256_setr_epi8(0, 0, (char)0x80, (char)0xc0, 0, 0x20, 0x40, 0x60, 0, 0, 0,
                                         0, 0, 0, 0, 0, 0, 0, (char)0x80, (char)0xc0, 0, 0x20, 0x40,
                                         0x60, 0, 0, 0, 0, 0, 0, 0, 0),
                  hi8 = _mm256_setr_epi8(0, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c, 0, 0,
                                         0, 0, 0, 0, 0, 0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(in + i)));
        __m256i mag = _mm256_and_si256(c, _mm256_set1_epi16(0x7f));
        __m256i nrm = _mm256_add_epi16(_mm256_slli_epi16(mag, 4), _mm256_set1_epi16(0x3c00));
        __m256i sub = _mm256_or_si256(_mm256_shuffle_epi8(lo8, mag),
                                      _mm256_slli_epi16(_mm256_shuffle_epi8(hi8, mag), 8));
        __m256i r = _mm256_blendv_epi8(nrm, sub, _mm256_cmpgt_epi16(_mm256_set1_epi16(8), mag));
        r = _mm256_blendv_epi8(r, _mm256_set1_epi16(0x7fc0),
                               _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f)));
        r = _mm256_or_si256(r, _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8));
        _mm256_storeu_si256((__m256i *)(out + i), r);
    }
    for (; i < n; i++) out[i] = ms_f32_to_bf16(ms_fp8e4m3_to_f32(in[i]));
}
