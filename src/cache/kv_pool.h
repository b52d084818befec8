/* kv_pool.h — the paged pool of one cache stream (cache/kv_cache.h holds
 * one per stream of the model's kv_spec).
 *
 * Owns the stream's memory: n_pages pages of page_size entry slots; for every
 * layer the stream covers a slot holds row_elems values (MLA's latent:
 * kv_lora_rank + qk_rope_head_dim) in the pool's dtype (F32 under --dtype
 * float32, BF16 otherwise, F8E4M3 with --kv-cache-dtype fp8_e4m3; bytes for
 * packed formats).  Layout
 * [layer][page][slot][row_elems], so one page of one layer is a contiguous
 * matrix the attention kernels read as an ms_mat view.  Pages are refcounted
 * (the radix cache shares prefix pages between requests).  Does not know about
 * requests, streams or prefixes.  Single owner: the cache's owner, the rank's
 * scheduler (main thread).
 */
#ifndef MS_CACHE_KV_POOL_H
#define MS_CACHE_KV_POOL_H

#include "base/error.h"
#include "kernels/kernels.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ms_kv_pool {
    int n_layers;
    int64_t row_elems; /* values per token per layer */
    int page_size;     /* token slots per page */
    int32_t n_pages;
    ms_dtype dtype;    /* MS_DT_F32, MS_DT_BF16 or MS_DT_F8E4M3; MS_DT_U8 for packed formats */
    size_t page_bytes; /* one page of one layer */
    uint8_t *data;     /* [n_layers][n_pages][page_size][row_elems], lazily mapped */
    size_t data_bytes;
    int32_t *refcount;  /* [n_pages] */
    int32_t *free_list; /* stack of free page ids */
    int32_t n_free;
} ms_kv_pool;

/* Bytes of cache per token (all layers), for capacity arithmetic. */
size_t ms_kv_bytes_per_token(int n_layers, int64_t row_elems, ms_dtype dt);

int ms_kv_pool_new(ms_kv_pool **out, int n_layers, int64_t row_elems, int page_size,
                   int32_t n_pages, ms_dtype dt, ms_errbuf *err);
void ms_kv_pool_free(ms_kv_pool *p);

/* Takes n free pages (refcount 1 each) into pages[]; MS_EFULL (nothing taken)
 * when fewer than n are free. */
int ms_kv_pool_alloc(ms_kv_pool *p, int32_t n, int32_t *pages);
void ms_kv_pool_ref(ms_kv_pool *p, int32_t page);
/* Drops one reference; the page returns to the free list at zero. */
void ms_kv_pool_unref(ms_kv_pool *p, int32_t page);
static inline int32_t ms_kv_pool_n_free(const ms_kv_pool *p)
{
    return p->n_free;
}

/* Start of token slot `slot` of `page` in `layer` (row_elems values). */
static inline void *ms_kv_pool_row(const ms_kv_pool *p, int layer, int32_t page, int slot)
{
    size_t esz = (size_t)ms_dtype_size(p->dtype);
    return p->data + ((size_t)layer * (size_t)p->n_pages + (size_t)page) * p->page_bytes +
           (size_t)slot * (size_t)p->row_elems * esz;
}

/* The first n_tokens slots of a page in one layer as a matrix [n_tokens][row_elems]. */
ms_mat ms_kv_pool_page_mat(const ms_kv_pool *p, int layer, int32_t page, int n_tokens);

#endif
