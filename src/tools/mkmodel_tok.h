/* mkmodel_tok.h — the tokenizer files of mkmodel's DeepSeek-V4 presets: a
 * trained byte-level BPE tokenizer.json carrying DeepSeek-V4's special tokens
 * and its tokenizer_config.json.  Main thread only.
 */
#ifndef MS_TOOLS_MKMODEL_TOK_H
#define MS_TOOLS_MKMODEL_TOK_H

#include "base/error.h"

#include <stdint.h>

/* The V4 release's vocabulary size; at it the special tokens have V4's ids
 * (<｜User｜> 128803, <think> 128821, ｜DSML｜ 128825, ...). */
#define MS_MKMODEL_V4_VOCAB 129280

/* Writes <dir>/tokenizer.json (exactly vocab_size ids: BOS 0, EOS 1, pad 2,
 * learned tokens, V4's special tokens at V4's ids when vocab_size is the
 * release's, else in V4's order ending the vocabulary) and
 * <dir>/tokenizer_config.json. */
int ms_mkmodel_write_v4_tokenizer(const char *dir, int32_t vocab_size, ms_errbuf *err);

#endif
