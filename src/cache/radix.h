/* radix.h — the prefix cache of one attention rank: a radix tree over token
 * units (SGLang's RadixCache with page granularity) on a KV cache of
 * streams (cache/kv_cache.h).
 *
 * Keys are token ids in whole units of ms_kv_cache_share_unit tokens (one
 * page of page_size tokens for a model whose streams all hold one entry per
 * token; page_size × 128 when a stream holds one per 128).  Each node holds,
 * for every stream, the pages of its key range with one reference on each
 * (-1 where a windowed stream's page had slid out before the insert), and a
 * residency field (the device pool now; a host/disk tier later).  A match
 * ends where a windowed stream no longer holds the window the hit needs (its
 * tail is recomputed), unless the spec snapshots the windows and the state at
 * every unit (kv_spec.h state_snapshots, V4): then nodes hold no window pages
 * and a match may end at any unit.  Requests lock the path of the prefix they use
 * (lock_ref), so it cannot be evicted while they run.  Eviction frees least-
 * recently-used unlocked leaves first.  Owns the tree; borrows the cache.
 * Single owner: the rank's scheduler.
 */
#ifndef MS_CACHE_RADIX_H
#define MS_CACHE_RADIX_H

#include "cache/kv_cache.h"

#include <stdint.h>

typedef enum { MS_RADIX_DEVICE = 0 } ms_radix_residency; /* where a node's pages live */

typedef struct ms_radix_node ms_radix_node;
typedef struct ms_radix ms_radix;

int ms_radix_new(ms_radix **out, ms_kv_cache *cache);
/* Frees the tree and drops its page references. */
void ms_radix_free(ms_radix *r);

/* Longest usable cached prefix of tokens[0..n) in whole units.  Writes the
 * pages of every stream to prefix (its tables grown as needed; no references
 * taken: ms_kv_cache_share takes them) and returns the matched token count;
 * *last receives the deepest node of the whole match (the root when nothing
 * matched), which the caller locks while it uses the pages.  Marks the path
 * as used now.  A model with per-sequence state and no snapshot streams
 * matches nothing (the state at the match point would be unknown). */
int64_t ms_radix_match(ms_radix *r, const int32_t *tokens, int64_t n, ms_kv_seq *prefix,
                       ms_radix_node **last);

/* The length ms_radix_match would return, without touching the tree (no
 * split, no LRU stamp): an estimate for load reports. */
int64_t ms_radix_peek(const ms_radix *r, const int32_t *tokens, int64_t n);

/* Inserts the whole units of tokens[0..n) with seq's pages.  For the part
 * already cached, the tree keeps its own pages; for the new part it takes a
 * reference on seq's.  Returns the number of leading tokens that were
 * already cached.  *last receives the node ending the inserted prefix.
 * MS_ENOMEM on failure. */
int64_t ms_radix_insert(ms_radix *r, const int32_t *tokens, int64_t n, const ms_kv_seq *seq,
                        ms_radix_node **last);

void ms_radix_lock(ms_radix *r, ms_radix_node *node);
void ms_radix_unlock(ms_radix *r, ms_radix_node *node);
ms_radix_residency ms_radix_node_residency(const ms_radix_node *node);

/* Evicts unlocked leaves (LRU first) until at least n_tokens tokens of keys
 * were dropped or nothing evictable remains; returns the tokens dropped. */
int64_t ms_radix_evict(ms_radix *r, int64_t n_tokens);

int64_t ms_radix_cached_tokens(const ms_radix *r);    /* keys held by the tree */
int64_t ms_radix_evictable_tokens(const ms_radix *r); /* held and not locked */
/* Drops every unlocked node (POST /flush_cache); returns the tokens dropped. */
int64_t ms_radix_flush(ms_radix *r);

#endif
