/* kv_pool.c — page allocation and refcounts for the paged KV pool (kv_pool.h). */
#include "cache/kv_pool.h"

#include "base/util.h"

#include <assert.h>
#include <stdlib.h>
#include <sys/mman.h>

size_t ms_kv_bytes_per_token(int n_layers, int64_t row_elems, ms_dtype dt)
{
    return (size_t)n_layers * (size_t)row_elems * (size_t)ms_dtype_size(dt);
}

int ms_kv_pool_new(ms_kv_pool **out, int n_layers, int64_t row_elems, int page_size,
                   int32_t n_pages, ms_dtype dt, ms_errbuf *err)
{
    *out = NULL;
    if (n_layers <= 0 || row_elems <= 0 || page_size <= 0 || n_pages <= 0 ||
        (dt != MS_DT_F32 && dt != MS_DT_BF16 && dt != MS_DT_F8E4M3 && dt != MS_DT_U8))
        return ms_err(err, MS_EINVAL, "kv pool: bad shape (layers %d, row %lld, page %d, pages %d)",
                      n_layers, (long long)row_elems, page_size, n_pages);
    ms_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return ms_err(err, MS_ENOMEM, "kv pool: out of memory");
    p->n_layers = n_layers;
    p->row_elems = row_elems;
    p->page_size = page_size;
    p->n_pages = n_pages;
    p->dtype = dt;
    size_t total;
    if (!ms_mul_size((size_t)page_size * (size_t)row_elems, (size_t)ms_dtype_size(dt),
                     &p->page_bytes) ||
        !ms_mul_size(p->page_bytes, (size_t)n_pages * (size_t)n_layers, &total))
        goto oom;
    /* anonymous mapping: pages cost memory only once a token is written there,
     * in 2 MiB pages where the kernel gives them (a first write to a 4 KiB page
     * cost ~12 µs on this machine, one per ~7 cache rows: at batch 32 the
     * rotary + cache-store loop took 145-173 µs per layer, 103-109 with 2 MiB
     * pages) */
    void *mem = mmap(NULL, total, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) goto oom;
    (void)madvise(mem, total, MADV_HUGEPAGE);
    p->data = mem;
    p->data_bytes = total;
    p->refcount = calloc((size_t)n_pages, sizeof *p->refcount);
    p->free_list = malloc((size_t)n_pages * sizeof *p->free_list);
    if (!p->data || !p->refcount || !p->free_list) goto oom;
    for (int32_t i = 0; i < n_pages; i++) p->free_list[i] = n_pages - 1 - i; /* pop 0 first */
    p->n_free = n_pages;
    *out = p;
    return 0;
oom:
    ms_kv_pool_free(p);
    return ms_err(err, MS_ENOMEM, "kv pool: cannot allocate %d pages of %d tokens", n_pages,
                  page_size);
}

void ms_kv_pool_free(ms_kv_pool *p)
{
    if (!p) return;
    if (p->data) munmap(p->data, p->data_bytes);
    free(p->refcount);
    free(p->free_list);
    free(p);
}

int ms_kv_pool_alloc(ms_kv_pool *p, int32_t n, int32_t *pages)
{
    if (n < 0 || n > p->n_free) return MS_EFULL;
    for (int32_t i = 0; i < n; i++) {
        int32_t pg = p->free_list[--p->n_free];
        assert(p->refcount[pg] == 0);
        p->refcount[pg] = 1;
        pages[i] = pg;
    }
    return 0;
}

void ms_kv_pool_ref(ms_kv_pool *p, int32_t page)
{
    assert(page >= 0 && page < p->n_pages && p->refcount[page] > 0);
    p->refcount[page]++;
}

void ms_kv_pool_unref(ms_kv_pool *p, int32_t page)
{
    assert(page >= 0 && page < p->n_pages && p->refcount[page] > 0);
    if (--p->refcount[page] == 0) p->free_list[p->n_free++] = page;
}

ms_mat ms_kv_pool_page_mat(const ms_kv_pool *p, int layer, int32_t page, int n_tokens)
{
    return ms_mat_whole(p->dtype, n_tokens, p->row_elems, ms_kv_pool_row(p, layer, page, 0), NULL);
}
