/* bench_dataset.c — the bench client's prompts: `random` (SGLang's lengths, uniform in
 * [max(floor(len·ratio), 1), len]), `generated-shared-prefix` (G random system prompts, each
 * followed by P random questions, shuffled) and `sharegpt` (first two turns of each
 * conversation, shuffled, pruned as SGLang does).  With a tokenizer, prompts are random
 * non-special vocabulary ids whose decoded text re-encodes to exactly those ids (so the
 * length is exact for text and id backends alike); without one, prompts are common English
 * words (one token each in BPE vocabularies) and lengths are estimates.  Bench thread only.
 */
#include "tools/bench.h"

#include "base/util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Common English words: each is one token in GPT-2/DeepSeek-style BPE vocabularies. */
static const char *const words[] = {
    "the",     "of",       "and",    "to",     "in",       "is",     "that",   "for",     "it",
    "as",      "was",      "with",   "be",     "by",       "on",     "not",    "he",      "this",
    "are",     "or",       "his",    "from",   "at",       "which",  "but",    "have",    "an",
    "had",     "they",     "you",    "were",   "their",    "one",    "all",    "we",      "can",
    "her",     "has",      "there",  "been",   "if",       "more",   "when",   "will",    "would",
    "who",     "so",       "no",     "time",   "people",   "year",   "way",    "day",     "man",
    "thing",   "woman",    "life",   "child",  "world",    "school", "state",  "family",  "group",
    "country", "problem",  "hand",   "part",   "place",    "case",   "week",   "company", "system",
    "program", "question", "work",   "number", "night",    "point",  "home",   "water",   "room",
    "mother",  "area",     "money",  "story",  "fact",     "month",  "lot",    "right",   "study",
    "book",    "eye",      "job",    "word",   "business", "issue",  "side",   "kind",    "head",
    "house",   "service",  "friend", "father", "power",    "hour",   "game",   "line",    "end",
    "member",  "law",      "car",    "city",   "name",     "team",   "minute", "idea",    "kid",
    "body",    "back",
};

static int add_row(ms_bench_dataset *d, size_t *cap, ms_bench_prompt *row, ms_errbuf *err)
{
    if (d->n == *cap) {
        size_t c = *cap ? *cap * 2 : 64, bytes;
        if (!ms_mul_size(c, sizeof *d->rows, &bytes)) return ms_err(err, MS_ENOMEM, "dataset");
        ms_bench_prompt *r = realloc(d->rows, bytes);
        if (!r) return ms_err(err, MS_ENOMEM, "out of memory building the dataset");
        d->rows = r;
        *cap = c;
    }
    d->rows[d->n++] = *row;
    memset(row, 0, sizeof *row);
    return 0;
}

void ms_bench_dataset_deinit(ms_bench_dataset *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->n; i++) {
        free(d->rows[i].text);
        free(d->rows[i].ids);
    }
    free(d->rows);
    memset(d, 0, sizeof *d);
}

int64_t ms_bench_random_len(int64_t len, double ratio, uint64_t *rng)
{
    if (len <= 0) return 0;
    int64_t lo = (int64_t)floor((double)len * ratio);
    if (lo < 1) lo = 1;
    if (lo > len) lo = len;
    return lo + (int64_t)(ms_rng_next(rng) % (uint64_t)(len - lo + 1));
}

/* Encodes text into a new array (*ids, *n). */
static int encode_all(const ms_tokenizer *tok, const char *text, int32_t **ids, size_t *n,
                      ms_errbuf *err)
{
    size_t len = strlen(text), cap = len / 2 + 16, got = 0;
    int32_t *buf = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *b = realloc(buf, sizeof(int32_t) * cap);
        if (!b) {
            free(buf);
            return ms_err(err, MS_ENOMEM, "out of memory tokenizing");
        }
        buf = b;
        int rc = ms_tokenizer_encode(tok, text, len, 0, buf, cap, &got, err);
        if (rc) {
            free(buf);
            return rc;
        }
        if (got <= cap) break;
        cap = got;
    }
    *ids = buf;
    *n = got;
    return 0;
}

typedef struct gen {
    const ms_tokenizer *tok;
    int32_t *pool; /* non-special ids */
    size_t n_pool;
    uint64_t rng;
} gen;

/* Decodes ids[0..n) and re-encodes the text: *text (owned) and the re-encoded ids (owned). */
static int round_trip(gen *g, const int32_t *ids, size_t n, char **text, int32_t **re, size_t *n_re,
                      ms_errbuf *err)
{
    size_t tl;
    *text = NULL;
    int rc = ms_tokenizer_decode(g->tok, ids, n, 0, text, &tl, err);
    if (!rc) rc = encode_all(g->tok, *text, re, n_re, err);
    if (rc) {
        free(*text);
        *text = NULL;
    }
    return rc;
}

/* A prompt of `len` tokens: sets text (owned) and, with a tokenizer, ids and n_ids with
 * encode(text) == ids.  Random ids are decoded and re-encoded (the canonical ids c); then
 * prefixes of c of length len, len ± 1, len ± 2, ... are tried until one round-trips to
 * exactly len ids.  If none does, the closest is kept and n_ids says its true length. */
static int search_once(gen *g, size_t want, char **text, int32_t **ids, int64_t *n_ids,
                       ms_errbuf *err);

static int gen_text(gen *g, int64_t len, char **text, int32_t **ids, int64_t *n_ids, ms_errbuf *err)
{
    *text = NULL;
    *ids = NULL;
    *n_ids = len;
    if (!g->tok) {
        size_t cap = (size_t)len * 10 + 1, o = 0;
        char *t = malloc(cap);
        if (!t) return ms_err(err, MS_ENOMEM, "out of memory building a prompt");
        for (int64_t i = 0; i < len; i++) {
            const char *w = words[ms_rng_next(&g->rng) % MS_ARRAY_LEN(words)];
            o += (size_t)snprintf(t + o, cap - o, "%s%s", i ? " " : "", w);
        }
        t[o] = 0;
        *text = t;
        return 0;
    }
    /* a few fresh tries when no prefix round-trips exactly; keep the closest */
    int rc = 0;
    for (int attempt = 0; attempt < 4 && !rc; attempt++) {
        char *t = NULL;
        int32_t *id = NULL;
        int64_t n = 0;
        if ((rc = search_once(g, (size_t)len, &t, &id, &n, err))) break;
        if (!*text || llabs(n - len) < llabs(*n_ids - len)) {
            free(*text);
            free(*ids);
            *text = t, *ids = id, *n_ids = n;
        } else {
            free(t);
            free(id);
        }
        if (*n_ids == len) break;
    }
    if (rc) {
        free(*text);
        free(*ids);
        *text = NULL;
        *ids = NULL;
    }
    return rc;
}

/* One try of gen_text with a tokenizer (see there). */
static int search_once(gen *g, size_t want, char **text, int32_t **ids, int64_t *n_ids,
                       ms_errbuf *err)
{
    size_t n_raw = want + want / 8 + 8;
    int32_t *raw = NULL, *c = NULL, *best_ids = NULL;
    char *t = NULL, *best_text = NULL;
    size_t n_c = 0, best_n = 0, best_d = SIZE_MAX;
    int rc = 0;
    /* re-encoding merges neighbours: grow the random ids until the canonical ones suffice */
    for (int grow = 0; grow < 4 && !rc && n_c < want + 2; grow++, n_raw *= 2) {
        free(raw);
        free(c);
        c = NULL;
        raw = malloc(sizeof(int32_t) * n_raw);
        if (!raw) return ms_err(err, MS_ENOMEM, "out of memory building a prompt");
        for (size_t i = 0; i < n_raw; i++) raw[i] = g->pool[ms_rng_next(&g->rng) % g->n_pool];
        rc = round_trip(g, raw, n_raw, &t, &c, &n_c, err);
        free(t);
        t = NULL;
    }
    for (int d = 0; !rc && d <= 24 && best_d; d++) {
        for (int sgn = 0; sgn < (d ? 2 : 1) && best_d; sgn++) {
            int64_t k = (int64_t)want + (sgn ? -d : d);
            if (k < 1 || (size_t)k > n_c) continue;
            int32_t *re = NULL;
            size_t n_re = 0;
            if ((rc = round_trip(g, c, (size_t)k, &t, &re, &n_re, err))) break;
            size_t dist = n_re > want ? n_re - want : want - n_re;
            if (dist < best_d) {
                free(best_text);
                free(best_ids);
                best_text = t, best_ids = re, best_n = n_re, best_d = dist;
            } else {
                free(t);
                free(re);
            }
            t = NULL;
        }
    }
    free(raw);
    free(c);
    if (!rc && !best_text) rc = ms_err(err, MS_EINVAL, "--tokenizer: cannot build a prompt");
    if (rc) {
        free(best_text);
        free(best_ids);
        return rc;
    }
    *text = best_text;
    *ids = best_ids;
    *n_ids = (int64_t)best_n;
    return 0;
}

/* Whether b[0..n) is complete, valid UTF-8 (tokens that are not make prompts drift). */
static bool utf8_ok(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t x = b[i];
        size_t k = x < 0x80 ? 1 : (x >> 5) == 6 ? 2 : (x >> 4) == 14 ? 3 : (x >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((b[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

static int gen_init(gen *g, const ms_bench_data_cfg *c, ms_errbuf *err)
{
    memset(g, 0, sizeof *g);
    g->tok = c->tok;
    g->rng = c->seed ^ 0x5eedbe9c4ull;
    if (!c->tok) return 0;
    int32_t v = ms_tokenizer_vocab_size(c->tok);
    g->pool = malloc(sizeof(int32_t) * (size_t)(v > 0 ? v : 1));
    if (!g->pool) return ms_err(err, MS_ENOMEM, "out of memory");
    for (int32_t i = 0; i < v; i++) {
        char b[64];
        size_t nb = 0;
        if (ms_tokenizer_is_special(c->tok, i)) continue;
        if (ms_tokenizer_token_bytes(c->tok, i, b, sizeof b, &nb) || nb == 0 || nb > sizeof b)
            continue;
        if (utf8_ok((const uint8_t *)b, nb)) g->pool[g->n_pool++] = i;
    }
    if (!g->n_pool) return ms_err(err, MS_EINVAL, "--tokenizer: no ordinary tokens to sample");
    return 0;
}

static int build_random(const ms_bench_data_cfg *c, gen *g, ms_bench_dataset *d, ms_errbuf *err)
{
    size_t cap = 0;
    uint64_t rng = c->seed;
    for (int64_t i = 0; i < c->num_prompts; i++) {
        ms_bench_prompt p = {0};
        int64_t in = ms_bench_random_len(c->random_input_len, c->random_range_ratio, &rng);
        p.output_len = ms_bench_random_len(c->random_output_len, c->random_range_ratio, &rng);
        int rc = gen_text(g, in, &p.text, &p.ids, &p.n_ids, err);
        p.prompt_len = p.n_ids;
        if (!p.ids) p.n_ids = 0;
        if (!rc) rc = add_row(d, &cap, &p, err);
        free(p.text);
        free(p.ids);
        if (rc) return rc;
    }
    return 0;
}

static void shuffle(ms_bench_prompt *rows, size_t n, uint64_t *rng)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(ms_rng_next(rng) % i);
        ms_bench_prompt t = rows[i - 1];
        rows[i - 1] = rows[j];
        rows[j] = t;
    }
}

/* Fills p from a ready text: token ids and length with a tokenizer, else the estimate of
 * about 4 bytes per token. */
static int set_text(const ms_tokenizer *tok, ms_bench_prompt *p, char *text, ms_errbuf *err)
{
    p->text = text;
    if (!tok) {
        p->prompt_len = (int64_t)((strlen(text) + 3) / 4);
        return 0;
    }
    size_t n;
    int rc = encode_all(tok, text, &p->ids, &n, err);
    p->n_ids = (int64_t)n;
    p->prompt_len = (int64_t)n;
    return rc;
}

static int build_gsp(const ms_bench_data_cfg *c, gen *g, ms_bench_dataset *d, ms_errbuf *err)
{
    int64_t G = c->gsp_num_groups, P = c->gsp_prompts_per_group;
    size_t cap = 0;
    int rc = 0;
    for (int64_t gi = 0; gi < G && !rc; gi++) {
        char *sys = NULL;
        int32_t *ids = NULL;
        int64_t n_ids;
        if ((rc = gen_text(g, c->gsp_system_prompt_len, &sys, &ids, &n_ids, err))) break;
        free(ids);
        for (int64_t q = 0; q < P && !rc; q++) {
            char *qt = NULL;
            if ((rc = gen_text(g, c->gsp_question_len, &qt, &ids, &n_ids, err))) break;
            free(ids);
            size_t ls = strlen(sys), lq = strlen(qt);
            char *full = malloc(ls + lq + 3);
            if (!full) {
                free(qt);
                rc = ms_err(err, MS_ENOMEM, "out of memory building a prompt");
                break;
            }
            memcpy(full, sys, ls);
            memcpy(full + ls, "\n\n", 2);
            memcpy(full + ls + 2, qt, lq + 1);
            free(qt);
            ms_bench_prompt p = {.output_len = c->gsp_output_len};
            rc = set_text(g->tok, &p, full, err);
            if (!g->tok) p.prompt_len = c->gsp_system_prompt_len + 1 + c->gsp_question_len;
            if (!rc) rc = add_row(d, &cap, &p, err);
            free(p.text);
            free(p.ids);
        }
        free(sys);
    }
    if (!rc) {
        uint64_t rng = c->seed * 31 + 7;
        shuffle(d->rows, d->n, &rng);
    }
    return rc;
}

static const char *turn_text(const json_t *conv, size_t i)
{
    const json_t *t = json_array_get(conv, i);
    const json_t *v = json_object_get(t, "value");
    if (!v) v = json_object_get(t, "content"); /* OpenAI-style messages */
    return json_string_value(v);
}

static int build_sharegpt(const ms_bench_data_cfg *c, gen *g, ms_bench_dataset *d, ms_errbuf *err)
{
    char *raw = NULL;
    size_t n_raw = 0;
    int rc = ms_read_file(c->path, MS_BENCH_MAX_DATASET, &raw, &n_raw);
    if (rc == MS_ENOENT) return ms_err(err, rc, "--dataset-path %s: no such file", c->path);
    if (rc == MS_ETOOBIG)
        return ms_err(err, rc, "--dataset-path %s: larger than %zu bytes", c->path,
                      MS_BENCH_MAX_DATASET);
    if (rc) return ms_err(err, rc, "--dataset-path %s: cannot read it", c->path);
    json_error_t je;
    json_t *root = json_loadb(raw, n_raw, 0, &je);
    free(raw);
    if (!root || !json_is_array(root)) {
        rc = ms_err(err, MS_EFORMAT,
                    "--dataset-path %s: %s (line %d): expected a ShareGPT JSON "
                    "array of {\"conversations\": [...]}",
                    c->path, root ? "not an array" : je.text, root ? 0 : je.line);
        json_decref(root);
        return rc;
    }
    size_t n = json_array_size(root), cap = 0;
    size_t *order = malloc(sizeof(size_t) * (n ? n : 1));
    if (!order) {
        json_decref(root);
        return ms_err(err, MS_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) order[i] = i;
    uint64_t rng = c->seed;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(ms_rng_next(&rng) % i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    for (size_t k = 0; k < n && (int64_t)d->n < c->num_prompts && !rc; k++) {
        const json_t *e = json_array_get(root, order[k]);
        const json_t *conv = json_object_get(e, "conversations");
        if (!conv) conv = json_object_get(e, "conversation");
        if (!json_is_array(conv) || json_array_size(conv) < 2) continue;
        const char *pt = turn_text(conv, 0), *ct = turn_text(conv, 1);
        if (!pt || !ct) continue;
        char *text = strdup(pt);
        if (!text) {
            rc = ms_err(err, MS_ENOMEM, "out of memory");
            break;
        }
        ms_bench_prompt p = {0};
        if ((rc = set_text(g->tok, &p, text, err))) {
            free(p.text);
            free(p.ids);
            break;
        }
        int64_t out_len = c->sharegpt_output_len;
        if (out_len <= 0) {
            ms_bench_prompt q = {0};
            char *ctext = strdup(ct);
            if (!ctext || (rc = set_text(g->tok, &q, ctext, err))) {
                if (!ctext) rc = ms_err(err, MS_ENOMEM, "out of memory");
                free(q.text);
                free(q.ids);
                free(p.text);
                free(p.ids);
                break;
            }
            out_len = q.prompt_len;
            free(q.text);
            free(q.ids);
        }
        p.output_len = out_len;
        bool keep =
            p.prompt_len >= 2 && out_len >= 2 &&
            !(c->sharegpt_context_len > 0 && p.prompt_len + out_len > c->sharegpt_context_len) &&
            p.prompt_len <= MS_BENCH_MAX_LEN && out_len <= MS_BENCH_MAX_LEN;
        if (keep) rc = add_row(d, &cap, &p, err);
        free(p.text);
        free(p.ids);
    }
    free(order);
    json_decref(root);
    if (!rc && d->n == 0)
        rc = ms_err(err, MS_EINVAL,
                    "--dataset-path %s: no usable conversation (need two turns "
                    "of >= 2 tokens each)",
                    c->path);
    return rc;
}

int ms_bench_dataset_build(const ms_bench_data_cfg *c, ms_bench_dataset *out, ms_errbuf *err)
{
    memset(out, 0, sizeof *out);
    gen g;
    int rc = gen_init(&g, c, err);
    if (!rc) {
        switch (c->kind) {
        case MS_BENCH_DATA_RANDOM:
            rc = build_random(c, &g, out, err);
            break;
        case MS_BENCH_DATA_GSP:
            rc = build_gsp(c, &g, out, err);
            break;
        case MS_BENCH_DATA_SHAREGPT:
            rc = build_sharegpt(c, &g, out, err);
            break;
        }
    }
    free(g.pool);
    out->exact = c->tok != NULL;
    if (rc) ms_bench_dataset_deinit(out);
    return rc;
}
