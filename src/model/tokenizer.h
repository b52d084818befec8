/* tokenizer.h — Hugging Face tokenizer.json: byte-level BPE with merges,
 * added/special tokens, the pre-tokenizer's regex Split sequence (PCRE2, UTF +
 * UCP), ByteLevel mapping and decoder.
 *
 * After ms_tokenizer_load the tokenizer is immutable: encode/decode may be
 * called from any thread concurrently.  All outputs are caller-owned buffers.
 */
#ifndef MS_MODEL_TOKENIZER_H
#define MS_MODEL_TOKENIZER_H

#include "base/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ms_tokenizer ms_tokenizer;

int ms_tokenizer_load(ms_tokenizer **out, const char *path, ms_errbuf *err);
int ms_tokenizer_load_text(ms_tokenizer **out, const char *json_text, size_t len, ms_errbuf *err);
void ms_tokenizer_free(ms_tokenizer *tok);

/* Encodes UTF-8 text (len bytes; invalid UTF-8 is an error).  Added/special
 * tokens written literally in the text are matched when parse_special != 0.
 * Writes up to cap ids; *n_out receives the full count (call again with a
 * larger buffer when *n_out > cap).  Does not add BOS. */
int ms_tokenizer_encode(const ms_tokenizer *tok, const char *text, size_t len, int parse_special,
                        int32_t *ids, size_t cap, size_t *n_out, ms_errbuf *err);

/* Decodes ids into UTF-8 (NUL-terminated, caller-owned via *out, free()).
 * skip_special drops special added tokens.  Out-of-range ids are an error. */
int ms_tokenizer_decode(const ms_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                        char **out, size_t *out_len, ms_errbuf *err);

/* Bytes of one token's text as it would appear in decoded output
 * (for streaming: callers buffer incomplete UTF-8 sequences themselves). */
int ms_tokenizer_token_bytes(const ms_tokenizer *tok, int32_t id, char *buf, size_t cap,
                             size_t *n_out);

int32_t ms_tokenizer_vocab_size(const ms_tokenizer *tok); /* max id + 1, added tokens included */
/* MS_ERANGE, naming the largest id, when the tokenizer has ids at or beyond
 * the model's vocab_size (checked at start-up, not per request). */
int ms_tokenizer_check_vocab(const ms_tokenizer *tok, int64_t model_vocab, ms_errbuf *err);
/* Id of a token string (vocab or added), or -1. */
int32_t ms_tokenizer_token_id(const ms_tokenizer *tok, const char *token);
int ms_tokenizer_is_special(const ms_tokenizer *tok, int32_t id);

/* mkmodel: learns byte-level BPE merges from `corpus` (NULL: the built-in
 * corpus of tokenizer_corpus.c) and writes a
 * DeepSeek-style tokenizer.json (same pre-tokenizer and decoder as
 * DeepSeek-V3, DeepSeek's special tokens as added tokens) whose total vocab is
 * exactly vocab_size ids.  Deterministic. */
int ms_tokenizer_train_write(const char *corpus, size_t corpus_len, int32_t vocab_size,
                             const char *path, ms_errbuf *err);
/* An added token of a family's special-token table. */
typedef struct ms_tok_added {
    const char *content;
    bool special; /* skipped by decode(skip_special) */
} ms_tok_added;
/* The 15 added tokens DeepSeek-V3 and V4 both carry in this order, from
 * <｜fim▁hole｜> to <｜tool▁sep｜> (initialisers of ms_tok_added). */
#define MS_TOK_DS_FIM_CHAT_TOOLS                                                                   \
    {"<｜fim▁hole｜>", false}, {"<｜fim▁begin｜>", false}, {"<｜fim▁end｜>", false},               \
        {"<｜User｜>", false}, {"<｜Assistant｜>", false}, {"<|EOT|>", true},                      \
        {"<｜tool▁calls▁begin｜>", false}, {"<｜tool▁calls▁end｜>", false},                        \
        {"<｜tool▁call▁begin｜>", false}, {"<｜tool▁call▁end｜>", false},                          \
        {"<｜tool▁outputs▁begin｜>", false}, {"<｜tool▁outputs▁end｜>", false},                    \
        {"<｜tool▁output▁begin｜>", false}, {"<｜tool▁output▁end｜>", false},                      \
    {                                                                                              \
        "<｜tool▁sep｜>", false                                                                    \
    }
/* The same with the special tokens tail[0..n_tail) (instead of DeepSeek-V3's)
 * at ids tail_at.. when they fit above the learned tokens, else ending the
 * vocabulary; placeholders fill the rest. */
int ms_tokenizer_train_write_tail(const char *corpus, size_t corpus_len, int32_t vocab_size,
                                  const ms_tok_added *tail, int32_t n_tail, int32_t tail_at,
                                  const char *path, ms_errbuf *err);
/* Writes the tokenizer_config.json matching ms_tokenizer_train_write's output
 * (bos/eos/pad strings, add_bos_token true, LlamaTokenizerFast). */
int ms_tokenizer_config_write(const char *path, ms_errbuf *err);

#endif
