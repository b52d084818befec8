/* tokenizer_internal.h — the private layout of ms_tokenizer, shared by
 * tokenizer.c (loading, decoding, lookups), tokenizer_encode.c (added-token
 * split, regex pre-tokenization, BPE) and tokenizer_train.c (the trainer that
 * reuses the pre-tokenizer).  Not part of the public API; nothing outside
 * src/model/tokenizer*.c includes it.  The object is immutable after load.
 */
#ifndef MS_MODEL_TOKENIZER_INTERNAL_H
#define MS_MODEL_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MS_TOK_MAX_JSON_BYTES  ((size_t)256 << 20) /* tokenizer.json file size */
#define MS_TOK_MAX_IDS         (1 << 22)           /* highest id + 1 */
#define MS_TOK_MAX_TEXT_BYTES  ((size_t)1 << 30)   /* one encode call */
#define MS_TOK_MAX_STEPS       16                  /* pre-tokenizer steps */
#define MS_TOK_MAX_ADDED_BYTES 1024                /* one added token's content */

enum {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
};

enum { TOK_F_PRESENT = 1, TOK_F_ADDED = 2, TOK_F_SPECIAL = 4 };

typedef struct tok_split {
    pcre2_code *re;
    int behavior;
    bool invert;
} tok_split;

typedef struct tok_added {
    uint32_t off, len; /* content in pool */
    int32_t id;
    bool special, normalized, lstrip, rstrip;
} tok_added;

/* Byte trie over added-token contents: root[b] is the first node for byte b. */
typedef struct tok_trie_node {
    int32_t child;   /* first child or -1 */
    int32_t sibling; /* next sibling or -1 */
    int32_t added;   /* index into added[] ending here, or -1 */
    uint8_t byte;
} tok_trie_node;

typedef struct tok_trie {
    int32_t root[256];
    tok_trie_node *nodes;
    size_t n_nodes, cap_nodes;
    bool any;
} tok_trie;

typedef struct tok_strent { /* string -> id map entry */
    uint32_t off, len;
    int32_t id;
} tok_strent;

typedef struct tok_pairent { /* (left, right) -> (rank, new id); key 0 = empty */
    uint64_t key;
    int32_t rank, new_id;
} tok_pairent;

typedef struct tok_idinfo {
    uint32_t str_off, str_len; /* token string as stored in tokenizer.json */
    uint32_t dec_off, dec_len; /* bytes it decodes to */
    uint8_t flags;
} tok_idinfo;

struct ms_tokenizer {
    char *pool; /* all strings */
    size_t pool_len, pool_cap;
    int32_t n_ids;
    tok_idinfo *ids;    /* [n_ids] */
    tok_strent *strmap; /* open addressing, [strmap_mask + 1] */
    size_t strmap_mask, strmap_count;
    tok_pairent *pairs; /* open addressing, [pair_mask + 1] */
    size_t pair_mask;
    int32_t byte_id[256]; /* id of the single-byte token, -1 if absent */
    int32_t unk_id;       /* -1 if none */
    bool fuse_unk, ignore_merges;
    tok_split steps[MS_TOK_MAX_STEPS];
    int n_steps;
    bool bl_prefix_space, bl_use_regex;
    pcre2_code *gpt2_re; /* when ByteLevel use_regex */
    tok_added *added;
    size_t n_added;
    tok_trie trie_raw, trie_norm; /* non-normalized / normalized added tokens */
};

/* GPT-2 byte <-> unicode code point table. */
uint32_t ms_tok_byte_to_cp(uint8_t b);
int ms_tok_cp_to_byte(uint32_t cp); /* -1 if cp is not a byte char */

/* Length of the UTF-8 sequence at s (n bytes left) if valid, else 0. */
size_t ms_tok_utf8_valid_len(const uint8_t *s, size_t n);

int32_t ms_tok_str_lookup(const ms_tokenizer *t, const char *s, size_t n);
const tok_pairent *ms_tok_pair_lookup(const ms_tokenizer *t, int32_t a, int32_t b);

/* Runs the pre-tokenizer over text (no added-token split) and calls fn with
 * every byte-level word (raw bytes).  fn returns 0 or a negative error. */
typedef int (*ms_tok_word_fn)(void *ctx, const uint8_t *word, size_t n);
int ms_tok_pretokenize(const ms_tokenizer *t, const char *text, size_t len, ms_tok_word_fn fn,
                       void *ctx, ms_errbuf *err);

/* Built-in training text for mkmodel (tokenizer_corpus.c). */
extern const char ms_tokenizer_corpus[];
extern const size_t ms_tokenizer_corpus_len;

#endif
