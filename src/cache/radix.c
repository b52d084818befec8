/* radix.c — radix tree over token pages with LRU eviction (radix.h). */
#include "cache/radix.h"

#include "base/util.h"

#include <stdlib.h>
#include <string.h>

struct ms_radix_node {
    ms_radix_node *parent, *child, *next; /* first child, next sibling */
    int32_t *tokens;                      /* [n_pages * page_size] */
    int32_t *pages;                       /* [n_pages] */
    int64_t n_pages;
    int64_t lock_ref;
    uint64_t last_used;
};

struct ms_radix {
    ms_kv_pool *pool;
    ms_radix_node root;
    uint64_t clock;
    int64_t cached_pages, locked_pages;
};

int ms_radix_new(ms_radix **out, ms_kv_pool *pool)
{
    ms_radix *r = calloc(1, sizeof *r);
    if (!r) return MS_ENOMEM;
    r->pool = pool;
    r->root.lock_ref = 1; /* the root is never evicted */
    *out = r;
    return 0;
}

static void free_subtree(ms_radix *r, ms_radix_node *n)
{
    ms_radix_node *c = n->child;
    while (c) {
        ms_radix_node *next = c->next;
        free_subtree(r, c);
        c = next;
    }
    for (int64_t i = 0; i < n->n_pages; i++) ms_kv_pool_unref(r->pool, n->pages[i]);
    free(n->tokens);
    free(n->pages);
    if (n != &r->root) free(n);
}

void ms_radix_free(ms_radix *r)
{
    if (!r) return;
    free_subtree(r, &r->root);
    free(r);
}

/* Pages of a and b that agree from the start (whole pages only). */
static int64_t common_pages(const int32_t *a, const int32_t *b, int64_t max_pages, int ps)
{
    int64_t p = 0;
    while (p < max_pages && !memcmp(a + p * ps, b + p * ps, sizeof(int32_t) * (size_t)ps)) p++;
    return p;
}

static ms_radix_node *find_child(const ms_radix_node *n, const int32_t *tokens, int ps)
{
    for (ms_radix_node *c = n->child; c; c = c->next)
        if (!memcmp(c->tokens, tokens, sizeof(int32_t) * (size_t)ps)) return c;
    return NULL;
}

/* Splits node after k pages: a new node with the first k pages takes node's
 * place under its parent, and node keeps the rest below it.  node stays the
 * deeper part because requests hold it (ms_radix_lock, *last): their unlock
 * walks from node up through the new head, which therefore inherits node's
 * lock count.  (The head used to be node itself, so the tail kept the lock
 * count of requests that could never release it: those pages were never
 * evictable again.)  Returns the head, or NULL without memory (nothing changed). */
static ms_radix_node *split(ms_radix *r, ms_radix_node *node, int64_t k)
{
    int ps = r->pool->page_size;
    int64_t rest = node->n_pages - k;
    ms_radix_node *head = calloc(1, sizeof *head);
    int32_t *htok = malloc(sizeof(int32_t) * (size_t)(k * ps));
    int32_t *hpg = malloc(sizeof(int32_t) * (size_t)k);
    int32_t *ttok = malloc(sizeof(int32_t) * (size_t)(rest * ps));
    int32_t *tpg = malloc(sizeof(int32_t) * (size_t)rest);
    if (!head || !htok || !hpg || !ttok || !tpg) {
        free(head), free(htok), free(hpg), free(ttok), free(tpg);
        return NULL;
    }
    memcpy(htok, node->tokens, sizeof(int32_t) * (size_t)(k * ps));
    memcpy(hpg, node->pages, sizeof(int32_t) * (size_t)k);
    memcpy(ttok, node->tokens + k * ps, sizeof(int32_t) * (size_t)(rest * ps));
    memcpy(tpg, node->pages + k, sizeof(int32_t) * (size_t)rest);
    head->tokens = htok;
    head->pages = hpg;
    head->n_pages = k;
    head->lock_ref = node->lock_ref;
    head->last_used = node->last_used;
    ms_radix_node **pp = &node->parent->child; /* head takes node's place among its siblings */
    while (*pp != node) pp = &(*pp)->next;
    *pp = head;
    head->parent = node->parent;
    head->next = node->next;
    head->child = node;
    node->parent = head;
    node->next = NULL;
    free(node->tokens);
    free(node->pages);
    node->tokens = ttok;
    node->pages = tpg;
    node->n_pages = rest;
    return head;
}

int64_t ms_radix_match(ms_radix *r, const int32_t *tokens, int64_t n, int32_t *pages_out,
                       ms_radix_node **last)
{
    int ps = r->pool->page_size;
    int64_t want = n / ps, got = 0;
    ms_radix_node *node = &r->root;
    uint64_t now = ++r->clock;
    node->last_used = now;
    while (got < want) {
        ms_radix_node *c = find_child(node, tokens + got * ps, ps);
        if (!c) break;
        int64_t k = common_pages(c->tokens, tokens + got * ps, MS_MIN(c->n_pages, want - got), ps);
        if (k < c->n_pages) {
            ms_radix_node *h = split(r, c, k);
            if (!h) break; /* out of memory: use what matched so far */
            c = h;
        }
        memcpy(pages_out + got, c->pages, sizeof(int32_t) * (size_t)k);
        got += k;
        c->last_used = now;
        node = c;
        if (k < c->n_pages) break;
    }
    *last = node;
    return got * ps;
}

int64_t ms_radix_peek(const ms_radix *r, const int32_t *tokens, int64_t n)
{
    int ps = r->pool->page_size;
    int64_t want = n / ps, got = 0;
    const ms_radix_node *node = &r->root;
    while (got < want) {
        const ms_radix_node *c = find_child(node, tokens + got * ps, ps);
        if (!c) break;
        int64_t k = common_pages(c->tokens, tokens + got * ps, MS_MIN(c->n_pages, want - got), ps);
        got += k;
        if (k < c->n_pages) break;
        node = c;
    }
    return got * ps;
}

int64_t ms_radix_insert(ms_radix *r, const int32_t *tokens, int64_t n, const int32_t *pages,
                        ms_radix_node **last)
{
    int ps = r->pool->page_size;
    int64_t want = n / ps, got = 0;
    ms_radix_node *node = &r->root;
    uint64_t now = ++r->clock;
    while (got < want) {
        ms_radix_node *c = find_child(node, tokens + got * ps, ps);
        if (!c) break;
        int64_t k = common_pages(c->tokens, tokens + got * ps, MS_MIN(c->n_pages, want - got), ps);
        if (k < c->n_pages && !(c = split(r, c, k))) return MS_ENOMEM;
        got += k;
        c->last_used = now;
        node = c;
    }
    int64_t cached = got * ps;
    if (got < want) {
        ms_radix_node *leaf = calloc(1, sizeof *leaf);
        int64_t np = want - got;
        if (!leaf) return MS_ENOMEM;
        leaf->tokens = malloc(sizeof(int32_t) * (size_t)(np * ps));
        leaf->pages = malloc(sizeof(int32_t) * (size_t)np);
        if (!leaf->tokens || !leaf->pages) {
            free(leaf->tokens), free(leaf->pages), free(leaf);
            return MS_ENOMEM;
        }
        memcpy(leaf->tokens, tokens + got * ps, sizeof(int32_t) * (size_t)(np * ps));
        memcpy(leaf->pages, pages + got, sizeof(int32_t) * (size_t)np);
        for (int64_t i = 0; i < np; i++) ms_kv_pool_ref(r->pool, leaf->pages[i]);
        leaf->n_pages = np;
        leaf->last_used = now;
        leaf->parent = node;
        leaf->next = node->child;
        node->child = leaf;
        r->cached_pages += np;
        node = leaf;
    }
    *last = node;
    return cached;
}

void ms_radix_lock(ms_radix *r, ms_radix_node *node)
{
    for (; node && node != &r->root; node = node->parent)
        if (node->lock_ref++ == 0) r->locked_pages += node->n_pages;
}

void ms_radix_unlock(ms_radix *r, ms_radix_node *node)
{
    for (; node && node != &r->root; node = node->parent)
        if (--node->lock_ref == 0) r->locked_pages -= node->n_pages;
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

int64_t ms_radix_evict(ms_radix *r, int64_t n_pages)
{
    int64_t freed = 0;
    while (freed < n_pages) {
        ms_radix_node *leaf = lru_leaf(&r->root, NULL);
        if (!leaf) break;
        unlink_node(leaf);
        for (int64_t i = 0; i < leaf->n_pages; i++) ms_kv_pool_unref(r->pool, leaf->pages[i]);
        freed += leaf->n_pages;
        r->cached_pages -= leaf->n_pages;
        free(leaf->tokens);
        free(leaf->pages);
        free(leaf);
    }
    return freed;
}

int64_t ms_radix_flush(ms_radix *r) { return ms_radix_evict(r, INT64_MAX); }

int64_t ms_radix_cached_pages(const ms_radix *r) { return r->cached_pages; }
int64_t ms_radix_evictable_pages(const ms_radix *r) { return r->cached_pages - r->locked_pages; }
