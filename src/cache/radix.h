/* radix.h — the prefix cache of one attention rank: a radix tree over token
 * pages (SGLang's RadixCache with page granularity).
 *
 * Keys are token ids in whole pages of page_size tokens; each node holds the
 * KV pages of its key and one pool reference on each of them.  Requests lock
 * the path of the prefix they use (lock_ref), so it cannot be evicted while
 * they run.  Eviction frees least-recently-used unlocked leaves first.
 * Owns the tree; borrows the KV pool.  Single owner: the rank's scheduler.
 */
#ifndef MS_CACHE_RADIX_H
#define MS_CACHE_RADIX_H

#include "cache/kv_pool.h"

#include <stdint.h>

typedef struct ms_radix_node ms_radix_node;
typedef struct ms_radix ms_radix;

int ms_radix_new(ms_radix **out, ms_kv_pool *pool);
/* Frees the tree and drops its page references. */
void ms_radix_free(ms_radix *r);

/* Longest cached prefix of tokens[0..n) in whole pages.  Writes its pages to
 * pages_out (capacity n / page_size) and returns the matched token count;
 * *last receives the deepest matched node (the root when nothing matched),
 * which the caller locks while it uses the pages.  Marks the path as used now. */
int64_t ms_radix_match(ms_radix *r, const int32_t *tokens, int64_t n, int32_t *pages_out,
                       ms_radix_node **last);

/* The length ms_radix_match would return, without touching the tree (no
 * split, no LRU stamp): an estimate for load reports. */
int64_t ms_radix_peek(const ms_radix *r, const int32_t *tokens, int64_t n);

/* Inserts the whole pages of tokens[0..n) with their KV pages.  For the part
 * already cached, the tree keeps its own pages; for the new part it takes a
 * reference on pages[].  Returns the number of leading tokens that were
 * already cached (the caller's own pages there are duplicates).  *last
 * receives the node ending the inserted prefix.  MS_ENOMEM on failure. */
int64_t ms_radix_insert(ms_radix *r, const int32_t *tokens, int64_t n, const int32_t *pages,
                        ms_radix_node **last);

void ms_radix_lock(ms_radix *r, ms_radix_node *node);
void ms_radix_unlock(ms_radix *r, ms_radix_node *node);

/* Evicts unlocked leaves (LRU first) until at least n_pages pages were
 * released to the pool or nothing evictable remains; returns pages released. */
int64_t ms_radix_evict(ms_radix *r, int64_t n_pages);

int64_t ms_radix_cached_pages(const ms_radix *r);     /* pages held by the tree */
int64_t ms_radix_evictable_pages(const ms_radix *r);  /* held and not locked */
/* Drops every unlocked node (POST /flush_cache); returns pages released. */
int64_t ms_radix_flush(ms_radix *r);

#endif
