/* router.c — DP admission policies (router.h) and the approximate prefix tree
 * that cache_aware and cost consult.
 *
 * The tree is sgl-router's multi-tenant radix tree (reference/testing.md
 * §2.2) over prompt token ids instead of characters: every node carries the
 * set of DP ranks that were sent a prompt through it, and an access stamp.
 * It only remembers where prompts went; the ranks' real caches are their own
 * radix trees, which may have evicted the prefix since.  Differences from the
 * gateway, chosen for a single in-process front end: tokens, not UTF-8
 * characters; among the ranks on the deepest matched node the least loaded
 * one is taken (the gateway takes any); eviction runs on insertion when a
 * rank owns more than max_tree_tokens (no background thread).
 */
#include "serve/router.h"

#include "base/error.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_RANKS = 4096 };

typedef struct rnode rnode;
struct rnode {
    rnode *parent;
    rnode **kids; /* [n_kids] sorted by first token */
    int n_kids;
    int64_t cap_kids;
    int32_t *tok; /* [len] the edge from the parent */
    int64_t len;
    uint64_t stamp; /* last insertion through this node */
    uint64_t own[]; /* [words] bit set of ranks */
};

struct ms_router {
    ms_router_opts o;
    int n, words;
    uint64_t rr, clock;
    ms_router_load *load;                           /* [n] last reports */
    int64_t *inflight;                              /* [n] routed and not finished */
    int64_t *sent_reqs, *sent_tokens, *sent_decode; /* [n] since the last report */
    int64_t *sent_prefill; /* [n] of sent_tokens, those the rank did not hold (cost) */
    int64_t *tree_tokens;  /* [n] tokens each rank owns in the tree */
    int64_t *hit;          /* [n] scratch: prefix each rank holds */
    rnode *root;
};

/* Indexed by enum ms_lb. */
static const char *const lb_names[] = {"round_robin", "total_requests", "total_tokens",
                                       "vllm",        "cache_aware",    "cost"};

int ms_lb_parse(const char *name)
{
    if (!strcmp(name, "shortest_queue")) return MS_LB_TOTAL_REQUESTS;
    for (int i = 0; i < (int)(sizeof lb_names / sizeof *lb_names); i++)
        if (!strcmp(name, lb_names[i])) return i;
    return -1;
}

const char *ms_lb_name(int lb)
{
    return lb >= 0 && lb < (int)(sizeof lb_names / sizeof *lb_names) ? lb_names[lb] : "?";
}

void ms_router_opts_init(ms_router_opts *o)
{
    /* sgl-router's current RouterArgs defaults (testing.md §2.2) */
    *o = (ms_router_opts){.policy = MS_LB_ROUND_ROBIN,
                          .cache_threshold = 0.3,
                          .balance_abs_threshold = 64,
                          .balance_rel_threshold = 1.5,
                          .max_tree_tokens = (int64_t)1 << 22};
}

int ms_router_parse_flag(ms_router_opts *o, const char *flag, const char *value, ms_errbuf *err)
{
    long l;
    int rc;
    if (!strcmp(flag, "--load-balance-method")) {
        int lb = ms_lb_parse(value);
        if (lb < 0)
            return ms_err(err, MS_EINVAL,
                          "--load-balance-method '%s': expected round_robin, total_requests "
                          "(or shortest_queue), total_tokens, vllm, cache_aware or cost",
                          value);
        o->policy = lb;
        return 1;
    }
    if (!strcmp(flag, "--cache-threshold"))
        return (rc = ms_parse_double(flag, value, 0, 1, &o->cache_threshold, err)) ? rc : 1;
    if (!strcmp(flag, "--balance-rel-threshold"))
        return (rc = ms_parse_double(flag, value, 0, 1e9, &o->balance_rel_threshold, err)) ? rc : 1;
    if (!strcmp(flag, "--balance-abs-threshold")) {
        if ((rc = ms_parse_long(flag, value, 0, 1L << 40, &l, err))) return rc;
        o->balance_abs_threshold = l;
        return 1;
    }
    if (!strcmp(flag, "--max-tree-size")) {
        if ((rc = ms_parse_long(flag, value, 1, 1L << 40, &l, err))) return rc;
        o->max_tree_tokens = l;
        return 1;
    }
    return 0;
}

/* ---- the tree ---- */

static int owns(const rnode *x, int t)
{
    return (int)(x->own[t >> 6] >> (t & 63)) & 1;
}

static rnode *node_new(const ms_router *r, const int32_t *tok, int64_t len)
{
    rnode *x = calloc(1, sizeof *x + sizeof(uint64_t) * (size_t)r->words);
    int32_t *t = len ? malloc(sizeof(int32_t) * (size_t)len) : NULL;
    if (!x || (len && !t)) {
        free(x);
        free(t);
        return NULL;
    }
    if (len) memcpy(t, tok, sizeof(int32_t) * (size_t)len);
    x->tok = t;
    x->len = len;
    return x;
}

/* Node lists grown by push.  No walk of the tree recurses: a client can make
 * a path as deep as the number of requests it sends. */
typedef struct nodes {
    rnode **v;
    int64_t n, cap;
} nodes;

static int push(nodes *s, rnode *x)
{
    void *p = s->v;
    int rc = ms_grow_array(&p, &s->cap, s->n + 1, sizeof *s->v);
    s->v = p;
    if (rc) return rc;
    s->v[s->n++] = x;
    return 0;
}

static void free_one(rnode *x)
{
    free(x->kids);
    free(x->tok);
    free(x);
}

/* Frees x and everything below it, without recursion or memory: detach the
 * last kid and go down into it; free a node once it has none, go back up. */
static void node_free(rnode *x)
{
    rnode *y = x;
    while (y) {
        if (y->n_kids > 0) {
            y = y->kids[--y->n_kids];
            continue;
        }
        rnode *up = y == x ? NULL : y->parent;
        free_one(y);
        y = up;
    }
}

/* Index of the kid whose edge starts with tok, or -(insertion point) - 1. */
static int find_kid(const rnode *x, int32_t tok)
{
    int lo = 0, hi = x->n_kids;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        int32_t v = x->kids[mid]->tok[0];
        if (v == tok) return mid;
        if (v < tok)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -lo - 1;
}

static int add_kid(rnode *x, rnode *k, int at)
{
    void *p = x->kids;
    int rc = ms_grow_array(&p, &x->cap_kids, x->n_kids + 1, sizeof *x->kids);
    x->kids = p;
    if (rc) return rc;
    memmove(x->kids + at + 1, x->kids + at, sizeof *x->kids * (size_t)(x->n_kids - at));
    x->kids[at] = k;
    x->n_kids++;
    k->parent = x;
    return 0;
}

static void remove_kid(rnode *x, const rnode *k)
{
    int i = find_kid(x, k->tok[0]);
    memmove(x->kids + i, x->kids + i + 1, sizeof *x->kids * (size_t)(x->n_kids - i - 1));
    x->n_kids--;
}

/* Splits node k after m < k->len tokens: a new node with the first m
 * tokens and k's owners takes k's place, k keeps the rest below it.
 * Everything is allocated before anything changes. */
static rnode *split(ms_router *r, rnode *k, int64_t m)
{
    rnode *mid = node_new(r, k->tok, m);
    int32_t *rest = malloc(sizeof(int32_t) * (size_t)(k->len - m));
    rnode **kids = malloc(sizeof *kids * 4);
    if (!mid || !rest || !kids) {
        node_free(mid);
        free(rest);
        free(kids);
        return NULL;
    }
    rnode *x = k->parent;
    memcpy(mid->own, k->own, sizeof(uint64_t) * (size_t)r->words);
    mid->stamp = k->stamp;
    x->kids[find_kid(x, k->tok[0])] = mid;
    mid->parent = x;
    memcpy(rest, k->tok + m, sizeof(int32_t) * (size_t)(k->len - m));
    free(k->tok);
    k->tok = rest;
    k->len -= m;
    kids[0] = k;
    mid->kids = kids;
    mid->n_kids = 1;
    mid->cap_kids = 4;
    k->parent = mid;
    return mid;
}

static void claim(ms_router *r, rnode *x, int t)
{
    if (!owns(x, t)) {
        x->own[t >> 6] |= (uint64_t)1 << (t & 63);
        r->tree_tokens[t] += x->len;
    }
    x->stamp = r->clock;
}

/* Records ids under rank t.  Out of memory only makes the tree remember less. */
static void tree_insert(ms_router *r, const int32_t *ids, int64_t n, int t)
{
    rnode *x = r->root;
    int64_t i = 0;
    r->clock++;
    while (i < n) {
        int at = find_kid(x, ids[i]);
        if (at < 0) {
            rnode *leaf = node_new(r, ids + i, n - i);
            if (!leaf || add_kid(x, leaf, -at - 1)) {
                node_free(leaf);
                return;
            }
            claim(r, leaf, t);
            return;
        }
        rnode *k = x->kids[at];
        int64_t m = 0;
        while (m < k->len && i + m < n && k->tok[m] == ids[i + m]) m++;
        if (m < k->len && !(k = split(r, k, m))) return;
        claim(r, k, t);
        i += m;
        x = k;
    }
}

/* Longest prefix of ids each rank holds (r->hit), and the deepest node
 * reached; returns the matched length (a partial edge counts its matched
 * tokens). */
static int64_t tree_match(ms_router *r, const int32_t *ids, int64_t n, const rnode **deepest)
{
    memset(r->hit, 0, sizeof *r->hit * (size_t)r->n);
    const rnode *x = r->root;
    *deepest = NULL;
    int64_t i = 0;
    while (i < n) {
        int at = find_kid(x, ids[i]);
        if (at < 0) break;
        const rnode *k = x->kids[at];
        int64_t m = 0;
        while (m < k->len && i + m < n && k->tok[m] == ids[i + m]) m++;
        i += m;
        for (int w = 0; w < r->words; w++)
            for (uint64_t b = k->own[w]; b; b &= b - 1) r->hit[w * 64 + __builtin_ctzll(b)] = i;
        *deepest = k;
        if (m < k->len) break;
        x = k;
    }
    return i;
}

/* A node rank t owns and none of whose kids it owns. */
static int leaf_for(const rnode *x, int t)
{
    if (!owns(x, t)) return 0;
    for (int i = 0; i < x->n_kids; i++)
        if (owns(x->kids[i], t)) return 0;
    return 1;
}

/* Every node other than the root that is a leaf for t, into out. */
static void collect_leaves(rnode *root, int t, nodes *out)
{
    nodes st = {0};
    if (push(&st, root)) return;
    while (st.n > 0) {
        rnode *x = st.v[--st.n];
        for (int i = 0; i < x->n_kids; i++)
            if (owns(x->kids[i], t) && push(&st, x->kids[i])) goto out;
        if (x != root && leaf_for(x, t) && push(out, x)) goto out;
    }
out:
    free(st.v);
}

static int by_stamp(const void *a, const void *b)
{
    uint64_t x = (*(rnode *const *)a)->stamp, y = (*(rnode *const *)b)->stamp;
    return x < y ? -1 : x > y;
}

/* A min-heap by stamp in a node list (a sorted list is one). */
static void heap_push(nodes *h, rnode *x)
{
    if (push(h, x)) return;
    for (int64_t i = h->n - 1; i > 0 && h->v[(i - 1) / 2]->stamp > h->v[i]->stamp;
         i = (i - 1) / 2) {
        rnode *t = h->v[i];
        h->v[i] = h->v[(i - 1) / 2];
        h->v[(i - 1) / 2] = t;
    }
}

static rnode *heap_pop(nodes *h)
{
    if (h->n == 0) return NULL;
    rnode *top = h->v[0];
    h->v[0] = h->v[--h->n];
    for (int64_t i = 0;;) {
        int64_t l = 2 * i + 1, m = i;
        if (l < h->n && h->v[l]->stamp < h->v[m]->stamp) m = l;
        if (l + 1 < h->n && h->v[l + 1]->stamp < h->v[m]->stamp) m = l + 1;
        if (m == i) break;
        rnode *t = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = t;
        i = m;
    }
    return top;
}

static int owned(const ms_router *r, const rnode *x)
{
    for (int w = 0; w < r->words; w++)
        if (x->own[w]) return 1;
    return 0;
}

/* Drops rank t from its least recently used leaves until it owns at most
 * 7/8 of max_tree_tokens (so eviction runs once per many insertions), as the
 * gateway does: oldest leaf first, and a parent that becomes a leaf for t
 * joins the candidates.  A node nobody owns any more, without kids, is
 * deleted (and so are ancestors that end up the same). */
static void tree_evict(ms_router *r, int t)
{
    int64_t goal = r->o.max_tree_tokens - r->o.max_tree_tokens / 8;
    nodes h = {0};
    collect_leaves(r->root, t, &h);
    qsort(h.v, (size_t)h.n, sizeof *h.v, by_stamp);
    rnode *x;
    while (r->tree_tokens[t] > goal && (x = heap_pop(&h))) {
        x->own[t >> 6] &= ~((uint64_t)1 << (t & 63));
        r->tree_tokens[t] -= x->len;
        rnode *p = x->parent;
        int p_next = p != r->root && owns(p, t); /* owned: survives the deletions below */
        while (x != r->root && !owned(r, x) && x->n_kids == 0) {
            rnode *up = x->parent;
            remove_kid(up, x);
            node_free(x);
            x = up;
        }
        if (p_next && leaf_for(p, t)) heap_push(&h, p);
    }
    free(h.v);
}

/* ---- policies ---- */

int ms_router_new(ms_router **out, int n_ranks, const ms_router_opts *o)
{
    *out = NULL;
    if (n_ranks < 1 || n_ranks > MAX_RANKS || !(o->cache_threshold >= 0) ||
        o->balance_abs_threshold < 0 || !(o->balance_rel_threshold >= 0) || o->max_tree_tokens < 1)
        return MS_EINVAL;
    ms_router *r = calloc(1, sizeof *r);
    if (!r) return MS_ENOMEM;
    r->o = *o;
    r->n = n_ranks;
    r->words = (n_ranks + 63) / 64;
    r->load = calloc((size_t)n_ranks, sizeof *r->load);
    int64_t *a = calloc((size_t)n_ranks * 7, sizeof(int64_t));
    r->root = node_new(r, NULL, 0);
    if (!r->load || !a || !r->root) {
        free(a);
        ms_router_free(r);
        return MS_ENOMEM;
    }
    r->inflight = a;
    r->sent_reqs = a + n_ranks;
    r->sent_tokens = a + 2 * n_ranks;
    r->sent_decode = a + 3 * n_ranks;
    r->tree_tokens = a + 4 * n_ranks;
    r->hit = a + 5 * n_ranks;
    r->sent_prefill = a + 6 * n_ranks;
    *out = r;
    return 0;
}

void ms_router_free(ms_router *r)
{
    if (!r) return;
    node_free(r->root);
    free(r->inflight);
    free(r->load);
    free(r);
}

void ms_router_update(ms_router *r, const ms_router_load *loads)
{
    memcpy(r->load, loads, sizeof *loads * (size_t)r->n);
    for (int i = 0; i < r->n; i++)
        r->sent_reqs[i] = r->sent_tokens[i] = r->sent_decode[i] = r->sent_prefill[i] = 0;
}

/* The rank with the fewest in flight (first on ties). */
static int least_inflight(const ms_router *r)
{
    int best = 0;
    for (int i = 1; i < r->n; i++)
        if (r->inflight[i] < r->inflight[best]) best = i;
    return best;
}

/* sgl-router's cache_aware decision (testing.md §2.2), over in-flight counts. */
static int pick_cache_aware(ms_router *r, const int32_t *ids, int64_t n)
{
    int64_t lo = r->inflight[0], hi = r->inflight[0];
    for (int i = 1; i < r->n; i++) {
        if (r->inflight[i] < lo) lo = r->inflight[i];
        if (r->inflight[i] > hi) hi = r->inflight[i];
    }
    if (hi - lo > r->o.balance_abs_threshold &&
        (float)hi > (float)lo * (float)r->o.balance_rel_threshold)
        return least_inflight(r); /* imbalanced: load wins over affinity */
    const rnode *deep;
    int64_t matched = tree_match(r, ids, n, &deep);
    double rate = n > 0 ? (double)matched / (double)n : 0.0;
    if (!deep || !(rate > r->o.cache_threshold)) return least_inflight(r);
    int best = -1;
    for (int i = 0; i < r->n; i++)
        if (owns(deep, i) && (best < 0 || r->inflight[i] < r->inflight[best])) best = i;
    return best >= 0 ? best : least_inflight(r);
}

/* The seed's C_r = queue + uncached prefill + expected decode + cache
 * pressure, every term in tokens of work on rank r: prompt tokens waiting
 * there (reported, plus those sent since), this prompt's tokens the rank does
 * not hold, decode tokens its requests may still generate (max_new, an upper
 * bound), and the tokens the pool would have to give back to admit this
 * request.  A decode token is charged like a prompt token: on this engine a
 * batched decode row costs about as much as a prefill token (bench/HISTORY.md). */
static int pick_cost(ms_router *r, const int32_t *ids, int64_t n, int64_t max_new)
{
    const rnode *deep;
    tree_match(r, ids, n, &deep);
    int best = 0;
    double best_c = 0;
    for (int i = 0; i < r->n; i++) {
        const ms_router_load *L = &r->load[i];
        int64_t uncached = n - r->hit[i];
        double queue = (double)(L->queued_prefill_tokens + r->sent_prefill[i]);
        double decode = (double)(L->decode_tokens_left + r->sent_decode[i]);
        int64_t need = L->used_tokens + r->sent_prefill[i] + uncached + max_new - L->total_tokens;
        double c = queue + (double)uncached + decode + (double)(need > 0 ? need : 0);
        if (i == 0 || c < best_c) best = i, best_c = c;
    }
    return best;
}

int ms_router_pick(ms_router *r, const int32_t *ids, int64_t n_ids, int64_t max_new, int forced)
{
    int t = 0, matched = 0; /* matched: r->hit holds this prompt's prefix per rank */
    if (forced >= 0 && forced < r->n) {
        t = forced;
    } else if (r->n == 1) {
        t = 0;
    } else {
        switch (r->o.policy) {
        case MS_LB_TOTAL_REQUESTS:
        case MS_LB_TOTAL_TOKENS:
            for (int i = 1; i < r->n; i++) {
                int64_t ri = r->load[i].running + r->load[i].waiting + r->sent_reqs[i];
                int64_t rt = r->load[t].running + r->load[t].waiting + r->sent_reqs[t];
                int64_t ki = r->load[i].used_tokens + r->sent_tokens[i];
                int64_t kt = r->load[t].used_tokens + r->sent_tokens[t];
                if (r->o.policy == MS_LB_TOTAL_REQUESTS ? ri < rt
                                                        : ki < kt || (ki == kt && ri < rt))
                    t = i;
            }
            break;
        case MS_LB_VLLM: { /* one front end: the scan starts at engine 0 */
            int64_t best = INT64_MAX;
            for (int i = 0; i < r->n; i++) {
                int64_t s = 4 * (r->load[i].waiting + r->sent_reqs[i]) + r->load[i].running;
                if (s < best) best = s, t = i;
            }
            break;
        }
        case MS_LB_CACHE_AWARE:
            t = pick_cache_aware(r, ids, n_ids);
            break;
        case MS_LB_COST:
            t = pick_cost(r, ids, n_ids, max_new);
            matched = 1;
            break;
        default:
            t = (int)(r->rr++ % (uint64_t)r->n);
            break;
        }
    }
    if (r->o.policy == MS_LB_COST && !matched) {
        const rnode *deep;
        tree_match(r, ids, n_ids, &deep);
    }
    r->inflight[t]++;
    r->sent_reqs[t]++;
    r->sent_tokens[t] += n_ids;
    r->sent_decode[t] += max_new;
    if (r->o.policy == MS_LB_COST) r->sent_prefill[t] += n_ids - r->hit[t];
    if (r->o.policy == MS_LB_CACHE_AWARE || r->o.policy == MS_LB_COST) {
        tree_insert(r, ids, n_ids, t);
        if (r->tree_tokens[t] > r->o.max_tree_tokens) tree_evict(r, t);
    }
    return t;
}

void ms_router_finish(ms_router *r, int rank)
{
    if (rank >= 0 && rank < r->n && r->inflight[rank] > 0) r->inflight[rank]--;
}

int64_t ms_router_inflight(const ms_router *r, int rank)
{
    return r->inflight[rank];
}
int64_t ms_router_tree_tokens(const ms_router *r, int rank)
{
    return r->tree_tokens[rank];
}

int64_t ms_router_prefix_hit(ms_router *r, const int32_t *ids, int64_t n_ids, int rank)
{
    const rnode *deep;
    tree_match(r, ids, n_ids, &deep);
    return r->hit[rank];
}
