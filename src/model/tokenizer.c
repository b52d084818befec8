/* tokenizer.c — loads a Hugging Face tokenizer.json (byte-level BPE: vocab,
 * merges, added tokens, empty normalizer, Sequence of Split/ByteLevel
 * pre-tokenizers, ByteLevel decoder) into an immutable ms_tokenizer, and owns
 * decoding and the id/string lookups.  Encoding lives in tokenizer_encode.c,
 * training in tokenizer_train.c.  Load/free on one thread; every other
 * function may be called from any thread concurrently after load.
 */
#include "model/tokenizer_internal.h"

#include "base/util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPT-2 byte <-> unicode table ------------------------------------- */

static bool byte_is_printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t ms_tok_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!byte_is_printable(i)) n++;
    return 256u + (uint32_t)n;
}

int ms_tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable((int)cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1; /* 68 non-printable bytes */
    int n = (int)(cp - 256);
    for (int i = 0; i < 256; i++)
        if (!byte_is_printable(i) && n-- == 0) return i;
    return -1;
}

/* ---- UTF-8 -------------------------------------------------------------- */

/* Length of the longest prefix of s that could start a valid sequence (the
 * "maximal subpart"), and whether the whole sequence is valid. */
static size_t utf8_subpart(const uint8_t *s, size_t n, bool *valid)
{
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    *valid = false;
    if (c < 0x80) {
        *valid = true;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 1;
    size_t i = 1;
    for (; i <= need; i++) {
        if (i >= n) return i;
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return i;
    }
    *valid = true;
    return need + 1;
}

size_t ms_tok_utf8_valid_len(const uint8_t *s, size_t n)
{
    bool valid;
    size_t k = utf8_subpart(s, n, &valid);
    return valid ? k : 0;
}

static size_t utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static uint32_t utf8_decode(const uint8_t *s, size_t k)
{
    if (k == 1) return s[0];
    if (k == 2) return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    if (k == 3)
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

/* ---- string pool and maps ------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k)
{
    k *= 0x9e3779b97f4a7c15ull;
    return k ^ (k >> 31);
}

static int pool_add(ms_tokenizer *t, const char *s, size_t n, uint32_t *off)
{
    if (n > UINT32_MAX || t->pool_len + n > UINT32_MAX) return MS_ETOOBIG;
    *off = (uint32_t)t->pool_len;
    if (n == 0) return 0;
    if (t->pool_len + n > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap * 2 : 65536;
        while (cap < t->pool_len + n) cap *= 2;
        char *p = realloc(t->pool, cap);
        if (!p) return MS_ENOMEM;
        t->pool = p;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, s, n);
    t->pool_len += n;
    return 0;
}

int32_t ms_tok_str_lookup(const ms_tokenizer *t, const char *s, size_t n)
{
    if (!t->strmap) return -1;
    for (size_t i = hash_bytes(s, n) & t->strmap_mask;; i = (i + 1) & t->strmap_mask) {
        const tok_strent *e = &t->strmap[i];
        if (e->id < 0) return -1;
        if (e->len == n && memcmp(t->pool + e->off, s, n) == 0) return e->id;
    }
}

/* Inserts or overwrites (later entries win, as in the reference). */
static void str_insert(ms_tokenizer *t, uint32_t off, uint32_t len, int32_t id)
{
    for (size_t i = hash_bytes(t->pool + off, len) & t->strmap_mask;;
         i = (i + 1) & t->strmap_mask) {
        tok_strent *e = &t->strmap[i];
        if (e->id < 0) {
            *e = (tok_strent){off, len, id};
            t->strmap_count++;
            return;
        }
        if (e->len == len && memcmp(t->pool + e->off, t->pool + off, len) == 0) {
            e->id = id;
            return;
        }
    }
}

const tok_pairent *ms_tok_pair_lookup(const ms_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (size_t i = hash_pair(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const tok_pairent *e = &t->pairs[i];
        if (e->key == key) return e;
        if (e->key == 0) return NULL;
    }
}

static void pair_insert(ms_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t new_id)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (size_t i = hash_pair(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        tok_pairent *e = &t->pairs[i];
        if (e->key == 0 || e->key == key) {
            *e = (tok_pairent){key, rank, new_id};
            return;
        }
    }
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* ---- added-token tries --------------------------------------------------- */

static int trie_init(tok_trie *tr)
{
    for (int i = 0; i < 256; i++) tr->root[i] = -1;
    tr->nodes = NULL;
    tr->n_nodes = tr->cap_nodes = 0;
    tr->any = false;
    return 0;
}

static int trie_new_node(tok_trie *tr, uint8_t byte, int32_t *out)
{
    if (tr->n_nodes == tr->cap_nodes) {
        size_t cap = tr->cap_nodes ? tr->cap_nodes * 2 : 256;
        tok_trie_node *p = realloc(tr->nodes, cap * sizeof(*p));
        if (!p) return MS_ENOMEM;
        tr->nodes = p;
        tr->cap_nodes = cap;
    }
    tr->nodes[tr->n_nodes] = (tok_trie_node){-1, -1, -1, byte};
    *out = (int32_t)tr->n_nodes++;
    return 0;
}

static int trie_insert(tok_trie *tr, const uint8_t *s, size_t n, int32_t added_idx)
{
    int32_t parent = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t head = parent < 0 ? tr->root[s[i]] : tr->nodes[parent].child;
        int32_t c = head;
        while (c >= 0 && tr->nodes[c].byte != s[i]) c = tr->nodes[c].sibling;
        if (c < 0) {
            int rc = trie_new_node(tr, s[i], &c);
            if (rc) return rc;
            tr->nodes[c].sibling = head;
            if (parent < 0)
                tr->root[s[i]] = c;
            else
                tr->nodes[parent].child = c;
        }
        parent = c;
    }
    tr->nodes[parent].added = added_idx; /* later duplicates win */
    tr->any = true;
    return 0;
}

/* ---- JSON loading -------------------------------------------------------- */

static bool json_flag(json_t *obj, const char *key, bool dflt)
{
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *json_type_name(json_t *obj)
{
    const char *s = json_string_value(json_object_get(obj, "type"));
    return s ? s : "(none)";
}

static int load_normalizer(json_t *n, ms_errbuf *err)
{
    if (!n || json_is_null(n)) return 0;
    const char *type = json_type_name(n);
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v)
        {
            int rc = load_normalizer(v, err);
            if (rc) return rc;
        }
        return 0;
    }
    return ms_err(err, MS_EUNSUPPORTED, "tokenizer: normalizer type '%s' is not supported", type);
}

static int compile_regex(pcre2_code **out, const char *pat, size_t len, bool literal,
                         ms_errbuf *err)
{
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return ms_err(err, MS_EFORMAT, "tokenizer: regex does not compile at offset %zu: %s",
                      (size_t)eo, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if absent */
    *out = re;
    return 0;
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pretok(ms_tokenizer *t, json_t *p, bool *have_bl, ms_errbuf *err)
{
    const char *type = json_type_name(p);
    if (*have_bl)
        return ms_err(err, MS_EUNSUPPORTED,
                      "tokenizer: pre-tokenizer '%s' after ByteLevel is not supported", type);
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list))
            return ms_err(err, MS_EFORMAT, "tokenizer: Sequence without list");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v)
        {
            int rc = load_pretok(t, v, have_bl, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        *have_bl = true;
        t->bl_prefix_space = json_flag(p, "add_prefix_space", true);
        t->bl_use_regex = json_flag(p, "use_regex", true);
        if (t->bl_use_regex)
            return compile_regex(&t->gpt2_re, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, false, err);
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        if (t->n_steps == MS_TOK_MAX_STEPS)
            return ms_err(err, MS_ETOOBIG, "tokenizer: more than %d Split steps", MS_TOK_MAX_STEPS);
        tok_split *s = &t->steps[t->n_steps];
        json_t *pat = json_object_get(p, "pattern");
        json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        json_t *ps = json_is_string(rx) ? rx : lit;
        if (!json_is_string(ps)) return ms_err(err, MS_EFORMAT, "tokenizer: Split without pattern");
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                            "MergedWithNext", "Contiguous"};
        s->behavior = -1;
        for (int i = 0; i < 5; i++)
            if (beh && strcmp(beh, names[i]) == 0) s->behavior = i;
        if (s->behavior < 0)
            return ms_err(err, MS_EUNSUPPORTED, "tokenizer: Split behavior '%s' is not supported",
                          beh ? beh : "(none)");
        s->invert = json_flag(p, "invert", false);
        int rc =
            compile_regex(&s->re, json_string_value(ps), json_string_length(ps), ps == lit, err);
        if (rc) return rc;
        t->n_steps++;
        return 0;
    }
    return ms_err(err, MS_EUNSUPPORTED, "tokenizer: pre-tokenizer type '%s' is not supported",
                  type);
}

static int load_decoder(json_t *d, ms_errbuf *err)
{
    const char *type = json_type_name(d);
    if (strcmp(type, "ByteLevel") == 0) return 0;
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(d, "decoders");
        size_t i;
        json_t *v;
        if (json_array_size(list) == 0) goto bad;
        json_array_foreach(list, i, v)
        {
            int rc = load_decoder(v, err);
            if (rc) return rc;
        }
        return 0;
    }
bad:
    return ms_err(err, MS_EUNSUPPORTED,
                  "tokenizer: decoder type '%s' is not supported (byte-level BPE needs ByteLevel)",
                  type);
}

/* The reference ByteLevel decoder: a token whose chars all map to bytes
 * decodes to those bytes, any other token to its own UTF-8. */
static int make_decoded(ms_tokenizer *t, int32_t id)
{
    tok_idinfo *info = &t->ids[id];
    size_t n = info->str_len;
    char tmp[4096];
    char *buf = n <= sizeof tmp ? tmp : malloc(n);
    if (!buf) return MS_ENOMEM;
    const uint8_t *s = (const uint8_t *)t->pool + info->str_off;
    size_t o = 0;
    bool all = true;
    for (size_t i = 0; i < n && all;) {
        size_t k = ms_tok_utf8_valid_len(s + i, n - i);
        int b = k ? ms_tok_cp_to_byte(utf8_decode(s + i, k)) : -1;
        if (b < 0)
            all = false;
        else
            buf[o++] = (char)b;
        i += k ? k : 1;
    }
    int rc = 0;
    if (all) {
        rc = pool_add(t, buf, o, &info->dec_off);
        info->dec_len = (uint32_t)o;
    } else {
        info->dec_off = info->str_off;
        info->dec_len = info->str_len;
    }
    if (buf != tmp) free(buf);
    return rc;
}

static int load_json(ms_tokenizer *t, json_t *root, ms_errbuf *err)
{
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return ms_err(err, MS_EFORMAT, "tokenizer: no 'model' object");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE") != 0)
        return ms_err(err, MS_EUNSUPPORTED, "tokenizer: model type '%s' is not supported", mtype);
    json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v) && json_number_value(v) != 0.0)
        return ms_err(err, MS_EUNSUPPORTED, "tokenizer: BPE dropout is not supported");
    if (json_flag(model, "byte_fallback", false))
        return ms_err(err, MS_EUNSUPPORTED, "tokenizer: BPE byte_fallback is not supported");
    const char *cs = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *ew = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cs && *cs) || (ew && *ew))
        return ms_err(err, MS_EUNSUPPORTED,
                      "tokenizer: continuing_subword_prefix/end_of_word_suffix not supported");
    t->fuse_unk = json_flag(model, "fuse_unk", false);
    t->ignore_merges = json_flag(model, "ignore_merges", false);

    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) return ms_err(err, MS_EFORMAT, "tokenizer: model.vocab missing");
    if (merges && !json_is_array(merges))
        return ms_err(err, MS_EFORMAT, "tokenizer: model.merges is not an array");

    /* ids */
    json_int_t max_id = -1;
    size_t max_key = 0;
    const char *key;
    json_object_foreach(vocab, key, v)
    {
        if (strlen(key) > max_key) max_key = strlen(key);
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= MS_TOK_MAX_IDS)
            return ms_err(err, MS_ERANGE, "tokenizer: vocab id of '%s' out of range", key);
        if (id > max_id) max_id = id;
    }
    size_t i;
    json_array_foreach(added, i, v)
    {
        json_t *idv = json_object_get(v, "id");
        json_t *cv = json_object_get(v, "content");
        json_int_t id = json_integer_value(idv);
        if (!json_is_integer(idv) || id < 0 || id >= MS_TOK_MAX_IDS || !json_is_string(cv) ||
            json_string_length(cv) == 0 || json_string_length(cv) > MS_TOK_MAX_ADDED_BYTES)
            return ms_err(err, MS_EFORMAT, "tokenizer: added_tokens[%zu] is malformed", i);
        if (json_flag(v, "single_word", false))
            return ms_err(err, MS_EUNSUPPORTED, "tokenizer: added token single_word not supported");
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return ms_err(err, MS_EFORMAT, "tokenizer: empty vocabulary");
    t->n_ids = (int32_t)max_id + 1;
    t->ids = calloc((size_t)t->n_ids, sizeof *t->ids);
    size_t n_str = json_object_size(vocab) + json_array_size(added);
    t->strmap_mask = pow2_at_least(n_str * 2) - 1;
    t->strmap = malloc((t->strmap_mask + 1) * sizeof *t->strmap);
    if (!t->ids || !t->strmap) return MS_ENOMEM;
    for (size_t k = 0; k <= t->strmap_mask; k++) t->strmap[k].id = -1;

    int rc;
    json_object_foreach(vocab, key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        size_t n = strlen(key); /* jansson keys cannot hold NUL in this API */
        uint32_t off;
        if ((rc = pool_add(t, key, n, &off))) return rc;
        str_insert(t, off, (uint32_t)n, id);
        if (!(t->ids[id].flags & TOK_F_PRESENT)) {
            t->ids[id] = (tok_idinfo){off, (uint32_t)n, 0, 0, TOK_F_PRESENT};
        }
    }

    /* added tokens */
    t->added = calloc(json_array_size(added) + 1, sizeof *t->added);
    if (!t->added) return MS_ENOMEM;
    trie_init(&t->trie_raw);
    trie_init(&t->trie_norm);
    json_array_foreach(added, i, v)
    {
        json_t *cv = json_object_get(v, "content");
        tok_added *a = &t->added[t->n_added];
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->special = json_flag(v, "special", false);
        a->normalized = json_flag(v, "normalized", !a->special);
        a->lstrip = json_flag(v, "lstrip", false);
        a->rstrip = json_flag(v, "rstrip", false);
        a->len = (uint32_t)json_string_length(cv);
        if ((rc = pool_add(t, json_string_value(cv), a->len, &a->off))) return rc;
        str_insert(t, a->off, a->len, a->id);
        /* added tokens override a vocab entry with the same id */
        t->ids[a->id] =
            (tok_idinfo){a->off, a->len, 0, 0,
                         (uint8_t)(TOK_F_PRESENT | TOK_F_ADDED | (a->special ? TOK_F_SPECIAL : 0))};
        tok_trie *tr = a->normalized ? &t->trie_norm : &t->trie_raw;
        if ((rc = trie_insert(tr, (const uint8_t *)t->pool + a->off, a->len, (int32_t)t->n_added)))
            return rc;
        t->n_added++;
    }

    /* single-byte tokens */
    t->unk_id = -1;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) t->unk_id = ms_tok_str_lookup(t, unk, strlen(unk));
    for (int b = 0; b < 256; b++) {
        char c[4];
        size_t k = utf8_encode(ms_tok_byte_to_cp((uint8_t)b), c);
        t->byte_id[b] = ms_tok_str_lookup(t, c, k);
    }

    /* merges */
    size_t n_merges = json_array_size(merges);
    t->pair_mask = pow2_at_least(n_merges * 2 + 2) - 1;
    t->pairs = calloc(t->pair_mask + 1, sizeof *t->pairs);
    size_t cat_cap = 2 * (max_key + 1);
    char *cat = malloc(cat_cap);
    if (!t->pairs || !cat) {
        free(cat);
        return MS_ENOMEM;
    }
    rc = 0;
    json_array_foreach(merges, i, v)
    {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(v)) {
            a = json_string_value(v);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = ms_err(err, MS_EFORMAT, "tokenizer: merge %zu is not 'a b'", i);
                break;
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(v) && json_array_size(v) == 2 &&
                   json_is_string(json_array_get(v, 0)) && json_is_string(json_array_get(v, 1))) {
            a = json_string_value(json_array_get(v, 0));
            la = json_string_length(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            lb = json_string_length(json_array_get(v, 1));
        } else {
            rc = ms_err(err, MS_EFORMAT, "tokenizer: merge %zu is malformed", i);
            break;
        }
        if (la + lb > cat_cap) {
            rc = ms_err(err, MS_ETOOBIG, "tokenizer: merge %zu is too long", i);
            break;
        }
        int32_t ia = ms_tok_str_lookup(t, a, la), ib = ms_tok_str_lookup(t, b, lb);
        memcpy(cat, a, la);
        memcpy(cat + la, b, lb);
        int32_t in = ms_tok_str_lookup(t, cat, la + lb);
        if (ia < 0 || ib < 0 || in < 0) {
            rc = ms_err(err, MS_EFORMAT, "tokenizer: merge %zu refers to a token not in vocab", i);
            break;
        }
        pair_insert(t, ia, ib, (int32_t)i, in);
    }
    free(cat);
    if (rc) return rc;

    for (int32_t id = 0; id < t->n_ids; id++)
        if ((t->ids[id].flags & TOK_F_PRESENT) && (rc = make_decoded(t, id))) return rc;

    if ((rc = load_normalizer(json_object_get(root, "normalizer"), err))) return rc;
    bool have_bl = false;
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (pre && !json_is_null(pre) && (rc = load_pretok(t, pre, &have_bl, err))) return rc;
    if (!have_bl)
        return ms_err(err, MS_EUNSUPPORTED,
                      "tokenizer: only byte-level BPE is supported (no ByteLevel pre-tokenizer)");
    json_t *dec = json_object_get(root, "decoder");
    if ((rc = load_decoder(dec, err))) return rc;
    return 0;
}

int ms_tokenizer_load_text(ms_tokenizer **out, const char *json_text, size_t len, ms_errbuf *err)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json_text, len, 0, &je);
    if (!root)
        return ms_err(err, MS_EFORMAT, "tokenizer.json: %s (line %d column %d)", je.text, je.line,
                      je.column);
    ms_tokenizer *t = calloc(1, sizeof *t);
    int rc = MS_ENOMEM;
    if (t && (t->pool = malloc(65536))) { /* never NULL, even if every string is empty */
        t->pool_cap = 65536;
        rc = load_json(t, root, err);
    }
    json_decref(root);
    if (rc) {
        if (rc == MS_ENOMEM) ms_err(err, rc, "tokenizer: out of memory while loading");
        ms_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int ms_tokenizer_load(ms_tokenizer **out, const char *path, ms_errbuf *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = ms_read_file(path, MS_TOK_MAX_JSON_BYTES, &text, &len);
    if (rc) return ms_err(err, rc, "tokenizer: cannot read %s: %s", path, ms_strerror(rc));
    rc = ms_tokenizer_load_text(out, text, len, err);
    free(text);
    return rc;
}

void ms_tokenizer_free(ms_tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < MS_TOK_MAX_STEPS; i++) pcre2_code_free(t->steps[i].re);
    pcre2_code_free(t->gpt2_re);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    free(t->added);
    free(t->pairs);
    free(t->strmap);
    free(t->ids);
    free(t->pool);
    free(t);
}

/* ---- decoding and lookups ------------------------------------------------ */

int ms_tokenizer_decode(const ms_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                        char **out, size_t *out_len, ms_errbuf *err)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !(t->ids[ids[i]].flags & TOK_F_PRESENT))
            return ms_err(err, MS_ERANGE, "token id %d at position %zu is not in the vocabulary",
                          (int)ids[i], i);
        total += t->ids[ids[i]].dec_len;
    }
    /* invalid UTF-8 grows to at most 3 bytes per byte (U+FFFD) */
    size_t cap;
    if (!ms_mul_size(total, 3, &cap) || !ms_add_size(cap, 1, &cap))
        return ms_err(err, MS_ETOOBIG, "decode output too large");
    uint8_t *raw = malloc(total + 1);
    char *res = malloc(cap);
    if (!raw || !res) {
        free(raw);
        free(res);
        return ms_err(err, MS_ENOMEM, "decode: out of memory");
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const tok_idinfo *info = &t->ids[ids[i]];
        if (skip_special && (info->flags & TOK_F_SPECIAL)) continue;
        memcpy(raw + o, t->pool + info->dec_off, info->dec_len);
        o += info->dec_len;
    }
    size_t r = 0;
    for (size_t i = 0; i < o;) {
        bool valid;
        size_t k = utf8_subpart(raw + i, o - i, &valid);
        if (valid) {
            memcpy(res + r, raw + i, k);
            r += k;
        } else {
            memcpy(res + r, "\xEF\xBF\xBD", 3);
            r += 3;
        }
        i += k;
    }
    res[r] = 0;
    free(raw);
    *out = res;
    if (out_len) *out_len = r;
    return 0;
}

int ms_tokenizer_token_bytes(const ms_tokenizer *t, int32_t id, char *buf, size_t cap,
                             size_t *n_out)
{
    if (id < 0 || id >= t->n_ids || !(t->ids[id].flags & TOK_F_PRESENT)) return MS_ERANGE;
    const tok_idinfo *info = &t->ids[id];
    *n_out = info->dec_len;
    if (info->dec_len > cap) return MS_ETOOBIG;
    memcpy(buf, t->pool + info->dec_off, info->dec_len);
    return 0;
}

int32_t ms_tokenizer_vocab_size(const ms_tokenizer *t)
{
    return t->n_ids;
}

int ms_tokenizer_check_vocab(const ms_tokenizer *t, int64_t model_vocab, ms_errbuf *err)
{
    if (t->n_ids <= model_vocab) return 0;
    return ms_err(err, MS_ERANGE,
                  "tokenizer.json has token id %d, beyond the model's vocabulary (config.json "
                  "vocab_size %lld)",
                  t->n_ids - 1, (long long)model_vocab);
}

int32_t ms_tokenizer_token_id(const ms_tokenizer *t, const char *token)
{
    return ms_tok_str_lookup(t, token, strlen(token));
}

int ms_tokenizer_is_special(const ms_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_ids) return 0;
    return (t->ids[id].flags & TOK_F_SPECIAL) != 0;
}
