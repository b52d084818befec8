/* tokenizer_train.c — the deterministic byte-level BPE trainer behind
 * `moeserve mkmodel`: pre-tokenizes a small corpus with DeepSeek-V3's
 * pre-tokenizer, learns merges (most frequent pair first, ties to the lowest
 * pair of ids), and writes a DeepSeek-style tokenizer.json whose vocabulary
 * is exactly the requested size: <bos> <eos> <pad>, 256 byte tokens, learned
 * merges (plus extra merges of learned tokens when the corpus runs out),
 * <｜place▁holder▁no▁N｜> fillers if still short, then DeepSeek's chat/tool/FIM special
 * tokens.  Also writes a matching tokenizer_config.json.  Any thread; no
 * global state.
 */
#include "model/tokenizer_internal.h"

#include "base/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DeepSeek-V3's pre-tokenizer regexes, byte for byte as in its tokenizer.json. */
static const char DS_RE_DIGITS[] = "\\p{N}{1,3}";
static const char DS_RE_CJK[] = "[一-龥぀-ゟ゠-ヿ]+";
static const char DS_RE_MAIN[] =
    "[!\"#$%&'()*+,\\-./"
    ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

#define BOS_TOKEN "<｜begin▁of▁sentence｜>"
#define EOS_TOKEN "<｜end▁of▁sentence｜>"
#define PAD_TOKEN "<｜▁pad▁｜>"

/* The tail of DeepSeek's added tokens: content, special flag.  <think> and
 * </think> sit just below <｜fim▁hole｜> as in DeepSeek-R1. */
static const ms_tok_added DS_TAIL[] = {
    {"<think>", false},
    {"</think>", false},
    MS_TOK_DS_FIM_CHAT_TOOLS,
};
#define N_HEAD          3
#define N_TAIL          ((int32_t)MS_ARRAY_LEN(DS_TAIL))
#define MAX_TRAIN_VOCAB (1 << 20)
#define MIN_PAIR_COUNT  2 /* a merge must be seen at least this often */

static json_t *split_step(const char *re)
{
    return json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", re,
                     "behavior", "Isolated", "invert", 0);
}

static json_t *ds_pretokenizer(void)
{
    return json_pack("{s:s, s:[o,o,o,{s:s, s:b, s:b, s:b}]}", "type", "Sequence", "pretokenizers",
                     split_step(DS_RE_DIGITS), split_step(DS_RE_CJK), split_step(DS_RE_MAIN),
                     "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
}

/* GPT-2 mapped form of bytes (each byte becomes one 1–2 byte UTF-8 char). */
static char *map_bytes(const uint8_t *b, size_t n)
{
    char *s = malloc(2 * n + 1);
    if (!s) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = ms_tok_byte_to_cp(b[i]);
        if (cp < 0x80)
            s[o++] = (char)cp;
        else {
            s[o++] = (char)(0xC0 | (cp >> 6));
            s[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    s[o] = 0;
    return s;
}

/* ---- training state ------------------------------------------------------ */

typedef struct wordref {
    const uint8_t *p;
    uint32_t n;
} wordref;

typedef struct trainer {
    wordref *refs; /* every word occurrence, then sorted */
    size_t n_refs, cap_refs;
    int32_t **syms; /* unique word -> symbol ids */
    int32_t *n_syms;
    int64_t *count;
    size_t n_words;
    /* tokens: internal id -> bytes (ids 0..255 are the bytes) */
    uint8_t **tok_bytes;
    uint32_t *tok_len;
    int32_t n_tok, cap_tok;
    int32_t *set; /* open addressing over token bytes: internal id, -1 empty */
    size_t set_mask;
    /* merges in order: (left, right) internal ids */
    int32_t (*merges)[2];
    int32_t n_merges, cap_merges;
} trainer;

/* Keeps a pointer to the word: with DeepSeek's pre-tokenizer (no prefix
 * space) every word points into the corpus itself. */
static int collect_word(void *ctx, const uint8_t *w, size_t n)
{
    trainer *tr = ctx;
    if (n > UINT32_MAX) return MS_ETOOBIG;
    if (tr->n_refs == tr->cap_refs) {
        size_t cap = tr->cap_refs ? tr->cap_refs * 2 : 1024;
        wordref *p = realloc(tr->refs, cap * sizeof *p);
        if (!p) return MS_ENOMEM;
        tr->refs = p;
        tr->cap_refs = cap;
    }
    tr->refs[tr->n_refs++] = (wordref){w, (uint32_t)n};
    return 0;
}

static int cmp_ref(const void *a, const void *b)
{
    const wordref *x = a, *y = b;
    int c = memcmp(x->p, y->p, MS_MIN(x->n, y->n));
    if (c) return c;
    return x->n < y->n ? -1 : x->n > y->n;
}

static uint64_t hash_bytes(const uint8_t *b, uint32_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

static int32_t find_token(const trainer *tr, const uint8_t *b, uint32_t n)
{
    for (size_t i = hash_bytes(b, n) & tr->set_mask;; i = (i + 1) & tr->set_mask) {
        int32_t id = tr->set[i];
        if (id < 0) return -1;
        if (tr->tok_len[id] == n && memcmp(tr->tok_bytes[id], b, n) == 0) return id;
    }
}

static void set_insert(trainer *tr, int32_t id)
{
    size_t i = hash_bytes(tr->tok_bytes[id], tr->tok_len[id]) & tr->set_mask;
    while (tr->set[i] >= 0) i = (i + 1) & tr->set_mask;
    tr->set[i] = id;
}

/* Adds a token (bytes copied); the caller checked it is new. */
static int add_token(trainer *tr, const uint8_t *b, uint32_t n)
{
    if (tr->n_tok == tr->cap_tok) {
        int32_t cap = tr->cap_tok ? tr->cap_tok * 2 : 1024;
        uint8_t **p = realloc(tr->tok_bytes, (size_t)cap * sizeof *p);
        if (!p) return MS_ENOMEM;
        tr->tok_bytes = p;
        uint32_t *q = realloc(tr->tok_len, (size_t)cap * sizeof *q);
        if (!q) return MS_ENOMEM;
        tr->tok_len = q;
        int32_t *set = malloc((size_t)cap * 2 * sizeof *set);
        if (!set) return MS_ENOMEM;
        free(tr->set);
        tr->set = set;
        tr->set_mask = (size_t)cap * 2 - 1;
        for (size_t i = 0; i <= tr->set_mask; i++) set[i] = -1;
        tr->cap_tok = cap;
        for (int32_t i = 0; i < tr->n_tok; i++) set_insert(tr, i);
    }
    uint8_t *c = malloc(n ? n : 1);
    if (!c) return MS_ENOMEM;
    memcpy(c, b, n);
    tr->tok_bytes[tr->n_tok] = c;
    tr->tok_len[tr->n_tok] = n;
    set_insert(tr, tr->n_tok);
    tr->n_tok++;
    return 0;
}

static int add_merge(trainer *tr, int32_t a, int32_t b)
{
    if (tr->n_merges == tr->cap_merges) {
        int32_t mc = tr->cap_merges ? tr->cap_merges * 2 : 1024;
        void *p = realloc(tr->merges, (size_t)mc * sizeof *tr->merges);
        if (!p) return MS_ENOMEM;
        tr->merges = p;
        tr->cap_merges = mc;
    }
    tr->merges[tr->n_merges][0] = a;
    tr->merges[tr->n_merges][1] = b;
    tr->n_merges++;
    return 0;
}

/* Pair counts in an open-addressing table, rebuilt for every merge. */
typedef struct pcount {
    uint64_t key; /* (a << 32 | b) + 1; 0 = empty */
    int64_t n;
} pcount;

/* Learns merges until `room` new tokens exist or no pair occurs twice. */
static int learn(trainer *tr, int32_t room)
{
    size_t total = 0;
    for (size_t w = 0; w < tr->n_words; w++) total += (size_t)tr->n_syms[w];
    size_t cap = 16;
    while (cap < 2 * total + 16) cap *= 2;
    pcount *tab = malloc(cap * sizeof *tab);
    if (!tab) return MS_ENOMEM;
    int rc = 0;
    while (tr->n_tok - 256 < room) {
        memset(tab, 0, cap * sizeof *tab);
        uint64_t best_key = 0;
        int64_t best_n = 0;
        for (size_t w = 0; w < tr->n_words; w++) {
            for (int32_t i = 0; i + 1 < tr->n_syms[w]; i++) {
                uint64_t key =
                    ((uint64_t)(uint32_t)tr->syms[w][i] << 32 | (uint32_t)tr->syms[w][i + 1]) + 1;
                size_t h = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
                while (tab[h].key && tab[h].key != key) h = (h + 1) & (cap - 1);
                tab[h].key = key;
                tab[h].n += tr->count[w];
                if (tab[h].n > best_n || (tab[h].n == best_n && key < best_key)) {
                    best_n = tab[h].n;
                    best_key = key;
                }
            }
        }
        if (best_n < MIN_PAIR_COUNT) break; /* the rest of the vocab is placeholders */
        int32_t a = (int32_t)((best_key - 1) >> 32), b = (int32_t)((best_key - 1) & 0xffffffffu);
        uint32_t la = tr->tok_len[a], lb = tr->tok_len[b];
        uint8_t *cat = malloc((size_t)la + lb);
        if (!cat) {
            rc = MS_ENOMEM;
            break;
        }
        memcpy(cat, tr->tok_bytes[a], la);
        memcpy(cat + la, tr->tok_bytes[b], lb);
        int32_t nid = find_token(tr, cat, la + lb);
        if (nid < 0) { /* two merge paths may build the same bytes: one token */
            rc = add_token(tr, cat, la + lb);
            nid = tr->n_tok - 1;
        }
        free(cat);
        if (rc) break;
        if ((rc = add_merge(tr, a, b))) break;
        for (size_t w = 0; w < tr->n_words; w++) { /* apply left to right */
            int32_t *s = tr->syms[w], o = 0;
            for (int32_t i = 0; i < tr->n_syms[w]; i++) {
                if (i + 1 < tr->n_syms[w] && s[i] == a && s[i + 1] == b) {
                    s[o++] = nid;
                    i++;
                } else
                    s[o++] = s[i];
            }
            tr->n_syms[w] = o;
        }
    }
    free(tab);
    return rc;
}

/* When the corpus has no pair left that occurs twice, the vocab is filled
 * with extra merges of learned tokens (most frequent first, enumerated along
 * anti-diagonals of (left, right) rank), so a large vocab still decodes to
 * text; only what remains after that becomes placeholders. */
static int synthesize(trainer *tr, int32_t room)
{
    int32_t *cand = malloc((size_t)tr->n_tok * sizeof *cand), nc = 0;
    if (!cand) return MS_ENOMEM;
    for (int32_t i = 256; i < tr->n_tok; i++) {
        const uint8_t *b = tr->tok_bytes[i];
        uint32_t n = tr->tok_len[i], k = 0;
        while (k < n) {
            size_t l = ms_tok_utf8_valid_len(b + k, n - k);
            if (!l) break;
            k += (uint32_t)l;
        }
        if (k == n) cand[nc++] = i; /* whole UTF-8 characters only */
    }
    int rc = 0;
    uint8_t *cat = NULL;
    for (int32_t d = 0; !rc && nc > 0 && d <= 2 * (nc - 1) && tr->n_tok - 256 < room; d++) {
        for (int32_t i = MS_MAX(0, d - (nc - 1)); i <= MS_MIN(d, nc - 1); i++) {
            if (tr->n_tok - 256 >= room) break;
            int32_t a = cand[i], b = cand[d - i];
            uint32_t la = tr->tok_len[a], lb = tr->tok_len[b];
            uint8_t *p = realloc(cat, (size_t)la + lb);
            if (!p) {
                rc = MS_ENOMEM;
                break;
            }
            cat = p;
            memcpy(cat, tr->tok_bytes[a], la);
            memcpy(cat + la, tr->tok_bytes[b], lb);
            if (find_token(tr, cat, la + lb) >= 0) continue;
            if ((rc = add_token(tr, cat, la + lb)) || (rc = add_merge(tr, a, b))) break;
        }
    }
    free(cat);
    free(cand);
    return rc;
}

static void trainer_deinit(trainer *tr)
{
    free(tr->set);
    free(tr->refs);
    for (size_t w = 0; w < tr->n_words; w++) free(tr->syms[w]);
    free(tr->syms);
    free(tr->n_syms);
    free(tr->count);
    for (int32_t i = 0; i < tr->n_tok; i++) free(tr->tok_bytes[i]);
    free(tr->tok_bytes);
    free(tr->tok_len);
    free(tr->merges);
}

/* A tokenizer with only the byte vocabulary, used for its pre-tokenizer. */
static int base_tokenizer(ms_tokenizer **out, ms_errbuf *err)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        char *m = map_bytes(&byte, 1);
        if (m) json_object_set_new(vocab, m, json_integer(b));
        free(m);
    }
    json_t *root =
        json_pack("{s:{s:s, s:o, s:[]}, s:o, s:{s:s}}", "model", "type", "BPE", "vocab", vocab,
                  "merges", "pre_tokenizer", ds_pretokenizer(), "decoder", "type", "ByteLevel");
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text) return ms_err(err, MS_ENOMEM, "tokenizer trainer: out of memory");
    int rc = ms_tokenizer_load_text(out, text, strlen(text), err);
    free(text);
    return rc;
}

static json_t *added_token(int32_t id, const char *content, bool special, bool normalized)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content",
                     content, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", normalized,
                     "special", special);
}

/* Placeholder added tokens ids [from, to), named from number *no on. */
static void fill(json_t *added, int32_t from, int32_t to, int *no)
{
    for (int32_t id = from; id < to; id++) {
        char name[64];
        snprintf(name, sizeof name, "<｜place▁holder▁no▁%d｜>", (*no)++);
        json_array_append_new(added, added_token(id, name, true, false));
    }
}

static int write_json(const trainer *tr, int32_t vocab_size, const ms_tok_added *tail,
                      int32_t n_tail, int32_t tail_at, const char *path, ms_errbuf *err)
{
    /* internal id -> final id: bytes in mapped-code-point order, then merges */
    int32_t *final_id = malloc((size_t)tr->n_tok * sizeof *final_id);
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    int rc = 0;
    if (!final_id || !vocab || !merges || !added) {
        rc = MS_ENOMEM;
        goto out;
    }
    json_object_set_new(vocab, BOS_TOKEN, json_integer(0));
    json_object_set_new(vocab, EOS_TOKEN, json_integer(1));
    json_object_set_new(vocab, PAD_TOKEN, json_integer(2));
    int32_t next = N_HEAD;
    for (uint32_t cp = 0; cp < 256 + 68; cp++) {
        int b = ms_tok_cp_to_byte(cp);
        if (b < 0) continue;
        final_id[b] = next++;
    }
    for (int32_t i = 256; i < tr->n_tok; i++) final_id[i] = next++;
    for (int32_t i = 0; i < tr->n_tok; i++) {
        char *m = map_bytes(tr->tok_bytes[i], tr->tok_len[i]);
        if (!m) {
            rc = MS_ENOMEM;
            goto out;
        }
        json_object_set_new(vocab, m, json_integer(final_id[i]));
        free(m);
    }
    for (int32_t k = 0; k < tr->n_merges; k++) {
        char *ma = map_bytes(tr->tok_bytes[tr->merges[k][0]], tr->tok_len[tr->merges[k][0]]);
        char *mb = map_bytes(tr->tok_bytes[tr->merges[k][1]], tr->tok_len[tr->merges[k][1]]);
        size_t n = (ma ? strlen(ma) : 0) + (mb ? strlen(mb) : 0) + 2;
        char *line = ma && mb ? malloc(n) : NULL;
        if (line) snprintf(line, n, "%s %s", ma, mb);
        free(ma);
        free(mb);
        if (!line) {
            rc = MS_ENOMEM;
            goto out;
        }
        json_array_append_new(merges, json_string(line));
        free(line);
    }
    json_array_append_new(added, added_token(0, BOS_TOKEN, true, false));
    json_array_append_new(added, added_token(1, EOS_TOKEN, true, false));
    json_array_append_new(added, added_token(2, PAD_TOKEN, true, false));
    /* fillers up to the tail (tail_at: ms_tokenizer_train_write_tail), fillers after it */
    int32_t at = tail_at;
    int no = 0;
    fill(added, next, at, &no);
    for (int32_t k = 0; k < n_tail; k++)
        json_array_append_new(added, added_token(at + k, tail[k].content, tail[k].special, true));
    fill(added, at + n_tail, vocab_size, &no);
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o, s:{s:s, s:[]}, s:o, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:b, s:b, s:b},"
        " s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:O, s:O}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type",
        "Sequence", "normalizers", "pre_tokenizer", ds_pretokenizer(), "post_processor", "type",
        "ByteLevel", "add_prefix_space", 1, "trim_offsets", 0, "use_regex", 1, "decoder", "type",
        "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model", "type",
        "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
        "fuse_unk", 0, "byte_fallback", 0, "vocab", vocab, "merges", merges);
    added = NULL; /* stolen by json_pack ("o") */
    if (!root) {
        rc = MS_ENOMEM;
        goto out;
    }
    if (json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0)
        rc = ms_err(err, MS_EIO, "cannot write %s", path);
    json_decref(root);
out:
    if (rc == MS_ENOMEM) ms_err(err, rc, "tokenizer trainer: out of memory");
    free(final_id);
    json_decref(vocab);
    json_decref(merges);
    json_decref(added);
    return rc;
}

int ms_tokenizer_train_write(const char *corpus, size_t corpus_len, int32_t vocab_size,
                             const char *path, ms_errbuf *err)
{
    return ms_tokenizer_train_write_tail(corpus, corpus_len, vocab_size, DS_TAIL, N_TAIL, -1, path,
                                         err);
}

int ms_tokenizer_train_write_tail(const char *corpus, size_t corpus_len, int32_t vocab_size,
                                  const ms_tok_added *tail, int32_t n_tail, int32_t tail_at,
                                  const char *path, ms_errbuf *err)
{
    const int32_t min_vocab = N_HEAD + 256 + n_tail;
    if (vocab_size < min_vocab || vocab_size > MAX_TRAIN_VOCAB)
        return ms_err(err, MS_ERANGE, "tokenizer vocab_size %d must be in [%d, %d]",
                      (int)vocab_size, (int)min_vocab, (int)MAX_TRAIN_VOCAB);
    if (!corpus) {
        corpus = ms_tokenizer_corpus;
        corpus_len = ms_tokenizer_corpus_len;
    }
    ms_tokenizer *base = NULL;
    trainer tr = {0};
    int rc = base_tokenizer(&base, err);
    if (rc) goto out;
    if ((rc = ms_tok_pretokenize(base, corpus, corpus_len, collect_word, &tr, err))) goto out;
    rc = MS_ENOMEM;
    if (tr.n_refs) qsort(tr.refs, tr.n_refs, sizeof *tr.refs, cmp_ref);
    tr.syms = calloc(tr.n_refs + 1, sizeof *tr.syms);
    tr.n_syms = calloc(tr.n_refs + 1, sizeof *tr.n_syms);
    tr.count = calloc(tr.n_refs + 1, sizeof *tr.count);
    if (!tr.syms || !tr.n_syms || !tr.count) goto out;
    for (size_t i = 0; i < tr.n_refs; i++) {
        if (i > 0 && cmp_ref(&tr.refs[i - 1], &tr.refs[i]) == 0) {
            tr.count[tr.n_words - 1]++;
            continue;
        }
        int32_t *s = malloc(tr.refs[i].n * sizeof *s);
        if (!s) goto out;
        for (uint32_t k = 0; k < tr.refs[i].n; k++) s[k] = tr.refs[i].p[k];
        tr.syms[tr.n_words] = s;
        tr.n_syms[tr.n_words] = (int32_t)tr.refs[i].n;
        tr.count[tr.n_words] = 1;
        tr.n_words++;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if ((rc = add_token(&tr, &byte, 1))) goto out;
    }
    /* the learned tokens end where the tail starts */
    int32_t at =
        tail_at >= N_HEAD + 256 && tail_at <= vocab_size - n_tail ? tail_at : vocab_size - n_tail;
    if ((rc = learn(&tr, at - N_HEAD - 256))) goto out;
    if ((rc = synthesize(&tr, at - N_HEAD - 256))) goto out;
    rc = write_json(&tr, vocab_size, tail, n_tail, at, path, err);
out:
    if (rc == MS_ENOMEM) ms_err(err, rc, "tokenizer trainer: out of memory");
    trainer_deinit(&tr);
    ms_tokenizer_free(base);
    return rc;
}

int ms_tokenizer_config_write(const char *path, ms_errbuf *err)
{
    json_t *root = json_pack(
        "{s:b, s:b, s:{s:s, s:s, s:b, s:b, s:b, s:b}, s:b, s:{s:s, s:s, s:b, s:b, s:b, s:b},"
        " s:b, s:i, s:{s:s, s:s, s:b, s:b, s:b, s:b}, s:n, s:s}",
        "add_bos_token", 1, "add_eos_token", 0, "bos_token", "__type", "AddedToken", "content",
        BOS_TOKEN, "lstrip", 0, "normalized", 1, "rstrip", 0, "single_word", 0,
        "clean_up_tokenization_spaces", 0, "eos_token", "__type", "AddedToken", "content",
        EOS_TOKEN, "lstrip", 0, "normalized", 1, "rstrip", 0, "single_word", 0, "legacy", 1,
        "model_max_length", (json_int_t)131072, "pad_token", "__type", "AddedToken", "content",
        EOS_TOKEN, "lstrip", 0, "normalized", 1, "rstrip", 0, "single_word", 0, "unk_token",
        "tokenizer_class", "LlamaTokenizerFast");
    if (!root) return ms_err(err, MS_ENOMEM, "tokenizer_config: out of memory");
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) ? MS_EIO : 0;
    json_decref(root);
    if (rc) return ms_err(err, rc, "cannot write %s", path);
    return 0;
}
