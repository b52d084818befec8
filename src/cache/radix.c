/* radix.c — radix tree over token units with per-stream pages and LRU
 * eviction (radix.h). */
#include "cache/radix.h"

#include "base/util.h"

#include <stdlib.h>
#include <string.h>

struct ms_radix_node {
    ms_radix_node *parent, *child, *next; /* first child, next sibling */
    int32_t *tokens;                      /* [n_units * unit] */
    int32_t *pages[MS_KV_MAX_STREAMS];    /* [n_units * per_unit[s]], -1: not held */
    int64_t n_units;
    int64_t lock_ref;
    uint64_t last_used;
    ms_radix_residency residency;
};

struct ms_radix {
    ms_kv_cache *cache;
    int unit, n_streams;                 /* tokens per key unit; streams */
    int64_t per_unit[MS_KV_MAX_STREAMS]; /* pages of each stream per unit */
    int has_state;
    ms_radix_node root;
    uint64_t clock;
    int64_t cached_units, locked_units;
};

int ms_radix_new(ms_radix **out, ms_kv_cache *cache)
{
    ms_radix *r = calloc(1, sizeof *r);
    if (!r) return MS_ENOMEM;
    const ms_kv_spec *sp = ms_kv_cache_spec(cache);
    r->cache = cache;
    r->unit = (int)ms_kv_cache_share_unit(cache);
    r->n_streams = ms_kv_cache_n_streams(cache);
    /* with snapshots a hit restores the window from them: nodes hold no window pages */
    for (int s = 0; s < r->n_streams; s++)
        r->per_unit[s] =
            ms_kv_cache_pool(cache, s) && !(sp->state_snapshots && sp->streams[s].window > 0)
                ? r->unit / ((int64_t)ms_kv_cache_pool(cache, s)->page_size *
                             sp->streams[s].tokens_per_entry)
                : 0;
    /* state without snapshots: a hit could not restore it, so nothing matches */
    r->has_state = ms_kv_spec_state_bytes(sp, 0, sp->n_layers) > 0 && !sp->state_snapshots;
    r->root.lock_ref = 1; /* the root is never evicted */
    *out = r;
    return 0;
}

static void drop_pages(ms_radix *r, ms_radix_node *n, int64_t from_unit)
{
    for (int s = 0; s < r->n_streams; s++)
        for (int64_t i = from_unit * r->per_unit[s]; i < n->n_units * r->per_unit[s]; i++)
            if (n->pages[s][i] >= 0)
                ms_kv_pool_unref(ms_kv_cache_pool(r->cache, s), n->pages[s][i]);
}

static void free_node_arrays(ms_radix_node *n)
{
    free(n->tokens);
    for (int s = 0; s < MS_KV_MAX_STREAMS; s++) free(n->pages[s]);
}

static void free_subtree(ms_radix *r, ms_radix_node *n)
{
    ms_radix_node *c = n->child;
    while (c) {
        ms_radix_node *next = c->next;
        free_subtree(r, c);
        c = next;
    }
    drop_pages(r, n, 0);
    free_node_arrays(n);
    if (n != &r->root) free(n);
}

void ms_radix_free(ms_radix *r)
{
    if (!r) return;
    free_subtree(r, &r->root);
    free(r);
}

/* Units of a and b that agree from the start (whole units only). */
static int64_t common_units(const int32_t *a, const int32_t *b, int64_t max_units, int u)
{
    int64_t p = 0;
    while (p < max_units && !memcmp(a + p * u, b + p * u, sizeof(int32_t) * (size_t)u)) p++;
    return p;
}

static ms_radix_node *find_child(const ms_radix_node *n, const int32_t *tokens, int u)
{
    for (ms_radix_node *c = n->child; c; c = c->next)
        if (!memcmp(c->tokens, tokens, sizeof(int32_t) * (size_t)u)) return c;
    return NULL;
}

/* Copies units [u0, u0 + k) of src's arrays into fresh arrays of dst. */
static int copy_units(const ms_radix *r, ms_radix_node *dst, const int32_t *tokens,
                      int32_t *const *pages, int64_t u0, int64_t k)
{
    dst->tokens = malloc(sizeof(int32_t) * (size_t)MS_MAX(k * r->unit, 1));
    if (!dst->tokens) return MS_ENOMEM;
    memcpy(dst->tokens, tokens + u0 * r->unit, sizeof(int32_t) * (size_t)(k * r->unit));
    for (int s = 0; s < r->n_streams; s++) {
        int64_t n = k * r->per_unit[s];
        dst->pages[s] = malloc(sizeof(int32_t) * (size_t)MS_MAX(n, 1));
        if (!dst->pages[s]) return MS_ENOMEM;
        if (n) memcpy(dst->pages[s], pages[s] + u0 * r->per_unit[s], sizeof(int32_t) * (size_t)n);
    }
    dst->n_units = k;
    return 0;
}

/* Splits node after k units: a new node with the first k units takes node's
 * place under its parent, and node keeps the rest below it.  node stays the
 * deeper part because requests hold it (ms_radix_lock, *last): their unlock
 * walks from node up through the new head, which therefore inherits node's
 * lock count.  (The head used to be node itself, so the tail kept the lock
 * count of requests that could never release it: those pages were never
 * evictable again.)  Returns the head, or NULL without memory (nothing changed). */
static ms_radix_node *split(ms_radix *r, ms_radix_node *node, int64_t k)
{
    ms_radix_node *head = calloc(1, sizeof *head), tail = {0};
    if (!head || copy_units(r, head, node->tokens, node->pages, 0, k) ||
        copy_units(r, &tail, node->tokens, node->pages, k, node->n_units - k)) {
        if (head) free_node_arrays(head);
        free_node_arrays(&tail);
        free(head);
        return NULL;
    }
    head->lock_ref = node->lock_ref;
    head->last_used = node->last_used;
    head->residency = node->residency;
    ms_radix_node **pp = &node->parent->child; /* head takes node's place among its siblings */
    while (*pp != node) pp = &(*pp)->next;
    *pp = head;
    head->parent = node->parent;
    head->next = node->next;
    head->child = node;
    node->parent = head;
    node->next = NULL;
    free_node_arrays(node);
    node->tokens = tail.tokens;
    memcpy(node->pages, tail.pages, sizeof node->pages);
    node->n_units = tail.n_units;
    return head;
}

/* Grows prefix's table of stream s to n pages. */
static int prefix_room(ms_kv_seq *prefix, int s, int64_t n)
{
    void *p = prefix->pages[s];
    int rc = ms_grow_array(&p, &prefix->cap_pages[s], MS_MAX(n, 1), sizeof(int32_t));
    prefix->pages[s] = p;
    return rc;
}

/* The most units of the matched prefix whose windowed streams still hold the
 * window a hit ending there needs. */
static int64_t usable_units(const ms_radix *r, const ms_kv_seq *prefix, int64_t units)
{
    const ms_kv_spec *sp = ms_kv_cache_spec(r->cache);
    int ps = ms_kv_cache_page_size(r->cache);
    for (; units > 0; units--) {
        int ok = 1;
        int64_t end = units * r->unit;
        for (int s = 0; s < r->n_streams && ok; s++) {
            const ms_kv_stream *st = &sp->streams[s];
            if (!r->per_unit[s] || st->window <= 0) continue;
            int64_t from =
                MS_MAX(end - st->window - st->window_slack, 0) / st->tokens_per_entry / ps;
            for (int64_t i = from; i < units * r->per_unit[s] && ok; i++)
                ok = prefix->pages[s][i] >= 0;
        }
        if (ok) break;
    }
    return units;
}

int64_t ms_radix_match(ms_radix *r, const int32_t *tokens, int64_t n, ms_kv_seq *prefix,
                       ms_radix_node **last)
{
    const int u = r->unit;
    int64_t want = r->has_state ? 0 : n / u, got = 0;
    ms_radix_node *node = &r->root;
    uint64_t now = ++r->clock;
    node->last_used = now;
    while (got < want) {
        ms_radix_node *c = find_child(node, tokens + got * u, u);
        if (!c) break;
        int64_t k = common_units(c->tokens, tokens + got * u, MS_MIN(c->n_units, want - got), u);
        if (k < c->n_units) {
            ms_radix_node *h = split(r, c, k);
            if (!h) break; /* out of memory: use what matched so far */
            c = h;
        }
        int room = 1;
        for (int s = 0; s < r->n_streams && room; s++)
            room = !prefix_room(prefix, s, (got + k) * r->per_unit[s]);
        if (!room) break;
        for (int s = 0; s < r->n_streams; s++)
            memcpy(prefix->pages[s] + got * r->per_unit[s], c->pages[s],
                   sizeof(int32_t) * (size_t)(k * r->per_unit[s]));
        got += k;
        c->last_used = now;
        node = c;
        if (k < c->n_units) break;
    }
    got = usable_units(r, prefix, got);
    const ms_kv_spec *sp = ms_kv_cache_spec(r->cache);
    int ps = ms_kv_cache_page_size(r->cache);
    for (int s = 0; s < r->n_streams; s++) {
        const ms_kv_stream *st = &sp->streams[s];
        prefix->n_pages[s] = got * r->per_unit[s];
        prefix->first_live[s] =
            st->window > 0 && r->per_unit[s]
                ? MS_MAX(got * u - st->window - st->window_slack, 0) / st->tokens_per_entry / ps
                : 0;
    }
    prefix->n_tokens = got * u;
    prefix->state_slot = -1;
    *last = node;
    return got * u;
}

int64_t ms_radix_peek(const ms_radix *r, const int32_t *tokens, int64_t n)
{
    const int u = r->unit;
    int64_t want = r->has_state ? 0 : n / u, got = 0;
    const ms_radix_node *node = &r->root;
    while (got < want) {
        const ms_radix_node *c = find_child(node, tokens + got * u, u);
        if (!c) break;
        int64_t k = common_units(c->tokens, tokens + got * u, MS_MIN(c->n_units, want - got), u);
        got += k;
        if (k < c->n_units) break;
        node = c;
    }
    return got * u;
}

int64_t ms_radix_insert(ms_radix *r, const int32_t *tokens, int64_t n, const ms_kv_seq *seq,
                        ms_radix_node **last)
{
    const int u = r->unit;
    int64_t want = n / u, got = 0;
    for (int s = 0; s < r->n_streams; s++) /* the caller's pages must cover the units */
        if (seq->n_pages[s] < want * r->per_unit[s])
            want = seq->n_pages[s] / MS_MAX(r->per_unit[s], 1);
    ms_radix_node *node = &r->root;
    uint64_t now = ++r->clock;
    while (got < want) {
        ms_radix_node *c = find_child(node, tokens + got * u, u);
        if (!c) break;
        int64_t k = common_units(c->tokens, tokens + got * u, MS_MIN(c->n_units, want - got), u);
        if (k < c->n_units && !(c = split(r, c, k))) return MS_ENOMEM;
        got += k;
        c->last_used = now;
        node = c;
    }
    int64_t cached = got * u;
    if (got < want) {
        ms_radix_node *leaf = calloc(1, sizeof *leaf);
        int64_t nu = want - got;
        if (!leaf) return MS_ENOMEM;
        if (copy_units(r, leaf, tokens, seq->pages, got, nu)) {
            free_node_arrays(leaf);
            free(leaf);
            return MS_ENOMEM;
        }
        for (int s = 0; s < r->n_streams; s++)
            for (int64_t i = 0; i < nu * r->per_unit[s]; i++)
                if (leaf->pages[s][i] >= 0)
                    ms_kv_pool_ref(ms_kv_cache_pool(r->cache, s), leaf->pages[s][i]);
        leaf->last_used = now;
        leaf->residency = MS_RADIX_DEVICE;
        leaf->parent = node;
        leaf->next = node->child;
        node->child = leaf;
        r->cached_units += nu;
        node = leaf;
    }
    *last = node;
    return cached;
}

void ms_radix_lock(ms_radix *r, ms_radix_node *node)
{
    for (; node && node != &r->root; node = node->parent)
        if (node->lock_ref++ == 0) r->locked_units += node->n_units;
}

void ms_radix_unlock(ms_radix *r, ms_radix_node *node)
{
    for (; node && node != &r->root; node = node->parent)
        if (--node->lock_ref == 0) r->locked_units -= node->n_units;
}

ms_radix_residency ms_radix_node_residency(const ms_radix_node *node)
{
    return node->residency;
}

static void unlink_node(ms_radix_node *n)
{
    ms_radix_node **pp = &n->parent->child;
    while (*pp != n) pp = &(*pp)->next;
    *pp = n->next;
}

/* The least recently used unlocked leaf, or NULL (linear scan: trees are
 * small relative to a decode step; a heap can replace it if profiles ask). */
static ms_radix_node *lru_leaf(ms_radix_node *n, ms_radix_node *best)
{
    for (ms_radix_node *c = n->child; c; c = c->next) {
        if (!c->child) {
            if (c->lock_ref == 0 && (!best || c->last_used < best->last_used)) best = c;
        } else {
            best = lru_leaf(c, best);
        }
    }
    return best;
}

int64_t ms_radix_evict(ms_radix *r, int64_t n_tokens)
{
    int64_t freed = 0;
    while (freed < n_tokens) {
        ms_radix_node *leaf = lru_leaf(&r->root, NULL);
        if (!leaf) break;
        unlink_node(leaf);
        drop_pages(r, leaf, 0);
        freed += leaf->n_units * r->unit;
        r->cached_units -= leaf->n_units;
        free_node_arrays(leaf);
        free(leaf);
    }
    return freed;
}

int64_t ms_radix_flush(ms_radix *r)
{
    return ms_radix_evict(r, INT64_MAX);
}

int64_t ms_radix_cached_tokens(const ms_radix *r)
{
    return r->cached_units * r->unit;
}
int64_t ms_radix_evictable_tokens(const ms_radix *r)
{
    return (r->cached_units - r->locked_units) * r->unit;
}
