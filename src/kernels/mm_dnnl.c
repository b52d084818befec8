/* mm_dnnl.c — oneDNN matmul for BF16 weights at large M (prefill), auto mode.
 *
 * Owns the prepack cache (each weight view reordered once into oneDNN's
 * blocked bf16 layout, keyed by data pointer and shape, checked by a sampled
 * fingerprint; at its first large-M call or ahead, ms_kernels_dnnl_prepack,
 * into chunks of 2 MiB pages), the reorder and matmul primitive caches (one
 * matmul per M, K, N, ldy, accumulate) and the bf16 copy of the activations.
 * Prepacked copies double the memory of the weights that take this path, so
 * it is opt-out (MOESERVE_DNNL=0 or ms_kernels_set_dnnl(0)) and capped
 * (MOESERVE_DNNL_MB, default 4096 MiB); past the cap, matrices use the hand
 * kernel.  oneDNN runs its own OpenMP
 * team, sized to the kernel pool; run with OMP_WAIT_POLICY=passive so its
 * threads do not spin against the pool's.  Main thread only (all state is
 * unsynchronised globals).
 */
#include "base/log.h"
#include "base/util.h"
#include "kernels/mm_internal.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

/* M is rounded up to a multiple of M_BUCKET (padding rows computed into a
 * scratch) so the grouped expert GEMMs, whose row counts change every step,
 * reuse a few primitives instead of creating one per call.  MIN_M: below it
 * the hand kernel runs, so a prefill's experts (~48 rows each) stay off
 * oneDNN, whose OpenMP threads take turns with the kernel pool's workers on
 * the same cores (measured: bench/RESULTS.md, "Why the code is so").
 * MOESERVE_DNNL_MIN_M overrides it (and ms_kernels_set_dnnl_min_m). */
enum { N_PRIMS = 128, M_BUCKET = 32, N_REORDERS = 16 };
static int64_t MIN_M = 128;

typedef struct pack_ent {
    const void *data; /* NULL: empty slot */
    int64_t n, k, ld;
    uint64_t fp;
    dnnl_memory_t mem;
    dnnl_memory_desc_t md;
    size_t bytes;
} pack_ent;

typedef struct reorder_ent {
    dnnl_memory_desc_t plain, wmd;
    dnnl_primitive_t prim; /* NULL: empty slot */
} reorder_ent;

typedef struct prim_ent {
    int64_t m, k, n, ldy;
    int acc;
    dnnl_primitive_t prim; /* NULL: empty slot */
    dnnl_memory_desc_t wmd;
    dnnl_memory_t src, dst;
} prim_ent;

/* Prepacked copies are carved from chunks of CHUNK_BYTES in 2 MiB pages: one
 * oneDNN allocation per matrix faulted its memory in 4 KiB pages, which in
 * this guest cost most of a reorder (1415 small-v3 matrices, 1426 MiB: 4.95 s).
 * Space of a copy dropped by ms_kernels_dnnl_forget is not reused before
 * ms_kernels_dnnl_clear. */
enum { CHUNK_BYTES = 64 << 20 };

static struct {
    int init, disabled, threads;
    char **chunks; /* [n_chunks] */
    size_t n_chunks, chunk_used, chunk_cap;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    pack_ent *packs;
    size_t n_packs, cap_packs, bytes, max_bytes;
    prim_ent prims[N_PRIMS];
    int next_prim;
    reorder_ent reorders[N_REORDERS];
    int next_reorder;
    uint16_t *xb;
    size_t xb_elems;
    float *yb; /* [M rounded up][N] output of a padded call */
    size_t yb_elems;
} g;

static int init(void);

int64_t ms_kernels_set_dnnl_min_m(int64_t m)
{
    (void)init(); /* the environment is read once, before any override */
    int64_t old = MIN_M;
    MIN_M = m > 0 ? m : 1;
    return old;
}

void ms_kernels_set_dnnl(int on)
{
    g.disabled = !on;
    if (!on) ms_kernels_dnnl_clear();
}

size_t ms_kernels_dnnl_bytes(void)
{
    return g.bytes;
}

int ms_kernels_dnnl_available(void)
{
    return init() == 0;
}

static int init(void)
{
    if (g.init) return g.eng ? 0 : -1;
    g.init = 1;
    const char *e = getenv("MOESERVE_DNNL");
    if (e && !strcmp(e, "0")) g.disabled = 1;
    e = getenv("MOESERVE_DNNL_MB");
    g.max_bytes = (size_t)(e ? atol(e) : 4096) << 20;
    e = getenv("MOESERVE_DNNL_MIN_M");
    if (e) MIN_M = atol(e);
    /* oneDNN reads CPUID itself: where AVX512_BF16 is hidden and the kernels
     * use it anyway (MOESERVE_ISA=avx512bf16, probed), it would emulate bf16,
     * slower than the hand kernel (see usable()). */
    if ((dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_bf16) !=
        dnnl_cpu_isa_avx512_core_bf16) {
        MS_LOG(MS_INFO, "kernels", "oneDNN sees no AVX512_BF16; BF16 prefill uses the hand kernel");
        return -1;
    }
    if (dnnl_engine_create(&g.eng, dnnl_cpu, 0) != dnnl_success) goto fail;
    if (dnnl_stream_create(&g.stream, g.eng, dnnl_stream_default_flags) != dnnl_success) goto fail;
    if (!getenv("OMP_WAIT_POLICY"))
        MS_LOG(MS_INFO, "kernels",
               "oneDNN in use without OMP_WAIT_POLICY=passive: its threads spin after each call");
    return 0;
fail:
    MS_LOG(MS_WARN, "kernels", "oneDNN engine unavailable; large-M BF16 uses the hand kernel");
    if (g.eng) dnnl_engine_destroy(g.eng);
    g.eng = NULL;
    return -1;
}

static void set_threads(int n)
{
    if (n == g.threads) return;
    void (*set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (set) set(n);
    g.threads = n;
}

static void pack_drop(pack_ent *p)
{
    if (p->mem) dnnl_memory_destroy(p->mem);
    g.bytes -= p->bytes;
    memset(p, 0, sizeof *p);
}

static void drop_prims(void)
{
    for (int i = 0; i < N_PRIMS; i++) {
        prim_ent *p = &g.prims[i];
        if (!p->prim) continue;
        dnnl_primitive_destroy(p->prim);
        dnnl_memory_destroy(p->src);
        dnnl_memory_destroy(p->dst);
        memset(p, 0, sizeof *p);
    }
}

/* 64-byte aligned space for a prepacked copy (NULL: out of memory). */
static void *chunk_take(size_t bytes)
{
    bytes = (bytes + 63) & ~(size_t)63;
    if (!g.n_chunks || g.chunk_used + bytes > g.chunk_cap) {
        size_t cap = bytes > CHUNK_BYTES ? bytes : CHUNK_BYTES;
        char **nc = realloc(g.chunks, sizeof *nc * (g.n_chunks + 1));
        if (!nc) return NULL;
        g.chunks = nc;
        if (!(nc[g.n_chunks] = ms_alloc_aligned(1, cap))) return NULL;
        g.n_chunks++;
        g.chunk_used = 0;
        g.chunk_cap = cap;
    }
    void *p = g.chunks[g.n_chunks - 1] + g.chunk_used;
    g.chunk_used += bytes;
    return p;
}

void ms_kernels_dnnl_clear(void)
{
    for (size_t i = 0; i < g.cap_packs; i++)
        if (g.packs[i].data) pack_drop(&g.packs[i]);
    free(g.packs);
    g.packs = NULL;
    g.n_packs = g.cap_packs = 0;
    for (int i = 0; i < N_REORDERS; i++)
        if (g.reorders[i].prim) dnnl_primitive_destroy(g.reorders[i].prim);
    memset(g.reorders, 0, sizeof g.reorders);
    for (size_t i = 0; i < g.n_chunks; i++) ms_free_aligned(g.chunks[i]);
    free(g.chunks);
    g.chunks = NULL;
    g.n_chunks = g.chunk_used = g.chunk_cap = 0;
    drop_prims();
    free(g.xb);
    g.xb = NULL;
    g.xb_elems = 0;
    free(g.yb);
    g.yb = NULL;
    g.yb_elems = 0;
}

/* 64 sampled bytes of the weights: detects a pointer reused for new data. */
static uint64_t fingerprint(const ms_mat *W)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 8; i++) {
        int64_t r = (W->rows - 1) * i / 7, c = (W->cols - 1) * (i * 5 % 8) / 7;
        uint64_t v = 0;
        memcpy(&v, (const uint16_t *)W->data + r * W->ld + c, 2);
        h = (h ^ v) * 1099511628211ull;
    }
    return h;
}

void ms_kernels_dnnl_forget(const void *data)
{
    for (size_t i = 0; i < g.cap_packs; i++)
        if (g.packs[i].data == data) { /* rebuild the table without it */
            pack_ent *old = g.packs;
            size_t cap = g.cap_packs;
            pack_drop(&old[i]);
            g.packs = calloc(cap, sizeof *g.packs);
            if (!g.packs) { /* keep nothing rather than a broken table */
                g.packs = old;
                ms_kernels_dnnl_clear();
                return;
            }
            g.n_packs = 0;
            for (size_t j = 0; j < cap; j++) {
                if (!old[j].data) continue;
                size_t h = ((uintptr_t)old[j].data >> 6) % cap;
                while (g.packs[h].data) h = (h + 1) % cap;
                g.packs[h] = old[j];
                g.n_packs++;
            }
            free(old);
            return;
        }
}

static dnnl_primitive_t reorder_get(const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *wmd);

int ms_kernels_dnnl_refresh(const ms_kctx *k, const ms_mat *W)
{
    for (size_t i = 0; i < g.cap_packs; i++) {
        pack_ent *p = &g.packs[i];
        if (p->data != W->data) continue;
        if (p->n != W->rows || p->k != W->cols || p->ld != W->ld) {
            ms_kernels_dnnl_forget(W->data);
            return -1;
        }
        dnnl_memory_desc_t plain;
        dnnl_dims_t dims = {W->cols, W->rows}, strides = {1, W->ld};
        dnnl_memory_t src = NULL;
        dnnl_primitive_t reorder;
        int ok =
            dnnl_memory_desc_init_by_strides(&plain, 2, dims, dnnl_bf16, strides) == dnnl_success &&
            dnnl_memory_create(&src, &plain, g.eng, (void *)W->data) == dnnl_success &&
            (reorder = reorder_get(&plain, &p->md)) != NULL;
        if (ok) {
            if (k) ms_pool_park(k->pool); /* the reorder runs on oneDNN's threads */
            dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, p->mem}};
            ok = dnnl_primitive_execute(reorder, g.stream, 2, args) == dnnl_success;
            dnnl_stream_wait(g.stream);
        }
        if (src) dnnl_memory_destroy(src);
        if (!ok) {
            ms_kernels_dnnl_forget(W->data);
            return -1;
        }
        p->fp = fingerprint(W);
        return 0;
    }
    return -1;
}

static pack_ent *pack_find(const ms_mat *W, uint64_t fp)
{
    if (!g.cap_packs) return NULL;
    size_t h = ((uintptr_t)W->data >> 6) % g.cap_packs;
    while (g.packs[h].data) {
        pack_ent *p = &g.packs[h];
        if (p->data == W->data && p->n == W->rows && p->k == W->cols && p->ld == W->ld) {
            if (p->fp == fp) return p;
            ms_kernels_dnnl_forget(W->data); /* same pointer, new contents */
            return NULL;
        }
        h = (h + 1) % g.cap_packs;
    }
    return NULL;
}

/* The reorder primitive from a plain view of this shape to wmd, made once per
 * shape (making one costs most of a small matrix's reorder). */
static dnnl_primitive_t reorder_get(const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *wmd)
{
    for (int i = 0; i < N_REORDERS; i++) {
        reorder_ent *r = &g.reorders[i];
        if (r->prim && dnnl_memory_desc_equal(&r->plain, plain) &&
            dnnl_memory_desc_equal(&r->wmd, wmd))
            return r->prim;
    }
    reorder_ent *r = &g.reorders[g.next_reorder];
    g.next_reorder = (g.next_reorder + 1) % N_REORDERS;
    if (r->prim) dnnl_primitive_destroy(r->prim);
    memset(r, 0, sizeof *r);
    dnnl_primitive_desc_t rpd = NULL;
    if (dnnl_reorder_primitive_desc_create(&rpd, plain, g.eng, wmd, g.eng, NULL) != dnnl_success)
        return NULL;
    if (dnnl_primitive_create(&r->prim, rpd) != dnnl_success) r->prim = NULL;
    dnnl_primitive_desc_destroy(rpd);
    r->plain = *plain;
    r->wmd = *wmd;
    return r->prim;
}

static pack_ent *pack_insert(const ms_mat *W, uint64_t fp, const dnnl_memory_desc_t *wmd)
{
    size_t bytes = dnnl_memory_desc_get_size(wmd);
    if (g.bytes + bytes > g.max_bytes) return NULL;
    if ((g.n_packs + 1) * 2 > g.cap_packs) { /* grow the table */
        size_t cap = g.cap_packs ? g.cap_packs * 2 : 256;
        pack_ent *np = calloc(cap, sizeof *np);
        if (!np) return NULL;
        for (size_t j = 0; j < g.cap_packs; j++) {
            if (!g.packs[j].data) continue;
            size_t h = ((uintptr_t)g.packs[j].data >> 6) % cap;
            while (np[h].data) h = (h + 1) % cap;
            np[h] = g.packs[j];
        }
        free(g.packs);
        g.packs = np;
        g.cap_packs = cap;
    }
    /* reorder the plain [N][K] (= K×N with strides {1, ld}) bf16 view */
    dnnl_memory_desc_t plain;
    dnnl_dims_t dims = {W->cols, W->rows}, strides = {1, W->ld};
    dnnl_memory_t src = NULL, dst = NULL;
    dnnl_primitive_t reorder;
    pack_ent *ret = NULL;
    void *space;
    if (dnnl_memory_desc_init_by_strides(&plain, 2, dims, dnnl_bf16, strides) != dnnl_success)
        goto out;
    if (dnnl_memory_create(&src, &plain, g.eng, (void *)W->data) != dnnl_success) goto out;
    if (!(space = chunk_take(bytes)) || dnnl_memory_create(&dst, wmd, g.eng, space) != dnnl_success)
        goto out;
    if (!(reorder = reorder_get(&plain, wmd))) goto out;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    if (dnnl_primitive_execute(reorder, g.stream, 2, args) != dnnl_success) goto out;
    dnnl_stream_wait(g.stream);
    size_t h = ((uintptr_t)W->data >> 6) % g.cap_packs;
    while (g.packs[h].data) h = (h + 1) % g.cap_packs;
    ret = &g.packs[h];
    *ret = (pack_ent){W->data, W->rows, W->cols, W->ld, fp, dst, *wmd, bytes};
    dst = NULL;
    g.n_packs++;
    g.bytes += bytes;
out:
    if (src) dnnl_memory_destroy(src);
    if (dst) dnnl_memory_destroy(dst);
    return ret;
}

static prim_ent *prim_get(int64_t M, int64_t K, int64_t N, int64_t ldy, int acc)
{
    for (int i = 0; i < N_PRIMS; i++) {
        prim_ent *p = &g.prims[i];
        if (p->prim && p->m == M && p->k == K && p->n == N && p->ldy == ldy && p->acc == acc)
            return p;
    }
    prim_ent *p = &g.prims[g.next_prim];
    g.next_prim = (g.next_prim + 1) % N_PRIMS;
    if (p->prim) {
        dnnl_primitive_destroy(p->prim);
        dnnl_memory_destroy(p->src);
        dnnl_memory_destroy(p->dst);
        memset(p, 0, sizeof *p);
    }
    dnnl_memory_desc_t smd, wmd, dmd;
    dnnl_dims_t sd = {M, K}, wd = {K, N}, dd = {M, N}, dst_strides = {ldy, 1};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    prim_ent *ret = NULL;
    if (dnnl_memory_desc_init_by_tag(&smd, 2, sd, dnnl_bf16, dnnl_ab) != dnnl_success) goto out;
    if (dnnl_memory_desc_init_by_tag(&wmd, 2, wd, dnnl_bf16, dnnl_format_tag_any) != dnnl_success)
        goto out;
    if (dnnl_memory_desc_init_by_strides(&dmd, 2, dd, dnnl_f32, dst_strides) != dnnl_success)
        goto out;
    if (dnnl_matmul_desc_init(&desc, &smd, &wmd, NULL, &dmd) != dnnl_success) goto out;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) goto out;
    if (acc) {
        if (dnnl_post_ops_create(&po) != dnnl_success) goto out;
        if (dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success) goto out;
        if (dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success) goto out;
    }
    if (dnnl_primitive_desc_create(&pd, &desc, attr, g.eng, NULL) != dnnl_success) goto out;
    if (dnnl_primitive_create(&p->prim, pd) != dnnl_success) goto out;
    p->wmd = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (dnnl_memory_create(&p->src, &smd, g.eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&p->dst, &dmd, g.eng, DNNL_MEMORY_NONE) != dnnl_success) {
        if (p->src) dnnl_memory_destroy(p->src);
        dnnl_primitive_destroy(p->prim);
        memset(p, 0, sizeof *p);
        goto out;
    }
    p->m = M, p->k = K, p->n = N, p->ldy = ldy, p->acc = acc;
    ret = p;
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ret;
}

/* oneDNN plans its threads when a primitive is made: primitives made for
 * another pool size are dropped. */
static void match_threads(const ms_kctx *k)
{
    int nt = ms_pool_size(k->pool);
    if (nt == g.threads) return;
    drop_prims();
    set_threads(nt);
}

/* Only on AVX512_BF16 CPUs, where ms_matmul sends large-M BF16 products here
 * (matmul.c): without it oneDNN 2.6 emulates bf16, slower than the hand
 * kernels (measured: bench/RESULTS.md, "Why the code is so"), so copies made there would only cost
 * memory (and KV pool). */
static int usable(const ms_kctx *k, const ms_mat *W)
{
    if (g.disabled || W->dtype != MS_DT_BF16 || !k || k->exact || k->isa < MS_ISA_AVX512BF16)
        return 0;
    return init() == 0 && !g.disabled;
}

/* W's prepacked copy in layout wmd, made now if there is none (NULL: held in
 * another layout, or it could not be made). */
static pack_ent *pack_get(const ms_kctx *k, const ms_mat *W, const dnnl_memory_desc_t *wmd)
{
    uint64_t fp = fingerprint(W);
    pack_ent *pk = pack_find(W, fp);
    if (pk) return dnnl_memory_desc_equal(&pk->md, wmd) ? pk : NULL; /* layout differs for this M */
    ms_pool_park(k->pool); /* the reorder runs on oneDNN's threads */
    return pack_insert(W, fp, wmd);
}

int ms_kernels_dnnl_prepack(const ms_kctx *k, const ms_mat *W)
{
    if (!usable(k, W) || W->rows <= 0 || W->cols <= 0) return -1;
    match_threads(k);
    int64_t Mb = (MIN_M + M_BUCKET - 1) / M_BUCKET * M_BUCKET;
    prim_ent *pr = prim_get(Mb, W->cols, W->rows, W->rows, 0); /* a padded call's primitive */
    return pr && pack_get(k, W, &pr->wmd) ? 0 : -1;
}

int ms_mm_dnnl_nt(const ms_kctx *k, const mm_task *t)
{
    const ms_mat *W = t->W;
    if (!usable(k, W) || t->M < MIN_M) return -1;
    int64_t M = t->M, K = W->cols, N = W->rows;
    match_threads(k);
    int64_t Mb = (M + M_BUCKET - 1) / M_BUCKET * M_BUCKET;
    int direct = Mb == M;
    prim_ent *pr = direct ? prim_get(M, K, N, t->ldy, t->accumulate) : prim_get(Mb, K, N, N, 0);
    if (!pr) return -1;
    pack_ent *pk = pack_get(k, W, &pr->wmd);
    if (!pk) return -1;
    size_t need = (size_t)(Mb * K);
    if (need > g.xb_elems) {
        uint16_t *nb = malloc(need * 2);
        if (!nb) return -1;
        free(g.xb);
        g.xb = nb;
        g.xb_elems = need;
    }
    if (!direct && (size_t)(Mb * N) > g.yb_elems) {
        float *nb = malloc(sizeof(float) * (size_t)(Mb * N));
        if (!nb) return -1;
        free(g.yb);
        g.yb = nb;
        g.yb_elems = (size_t)(Mb * N);
    }
    for (int64_t i = 0; i < M; i++) ms_cvt_f32_to_bf16(k->isa, t->x + i * t->ldx, g.xb + i * K, K);
    if (!direct) memset(g.xb + M * K, 0, sizeof(uint16_t) * (size_t)((Mb - M) * K));
    dnnl_memory_set_data_handle(pr->src, g.xb);
    dnnl_memory_set_data_handle(pr->dst, direct ? (void *)t->y : (void *)g.yb);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, pr->src}, {DNNL_ARG_WEIGHTS, pk->mem}, {DNNL_ARG_DST, pr->dst}};
    ms_pool_park(k->pool); /* its workers would spin on the cores oneDNN's threads need */
    if (dnnl_primitive_execute(pr->prim, g.stream, 3, args) != dnnl_success) return -1;
    dnnl_stream_wait(g.stream);
    if (!direct)
        for (int64_t i = 0; i < M; i++) {
            float *yo = t->y + i * t->ldy;
            const float *yi = g.yb + i * N;
            if (t->accumulate)
                for (int64_t n = 0; n < N; n++) yo[n] += yi[n];
            else
                memcpy(yo, yi, sizeof(float) * (size_t)N);
        }
    return 0;
}
