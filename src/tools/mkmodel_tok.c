/* mkmodel_tok.c — DeepSeek-V4's special tokens for mkmodel's V4 presets
 * (mkmodel_tok.h).  The table is the V4 release's added tokens 128800..128846
 * in id order, as its tokenizer.json has them (checked against published
 * checks of that file: <｜User｜> 128803, <｜Assistant｜> 128804, <think> 128821,
 * </think> 128822, ｜DSML｜ 128825, <｜latest_reminder｜> 128828, the task tokens
 * <｜action｜> 128829 .. <｜read_url｜> 128845).  Like DeepSeek-V3's tokenizer,
 * only BOS/EOS/pad and <|EOT|> are "special" (skipped when decoding with
 * skip_special_tokens): the chat and DSML markers reach the output parsers.
 * Main thread only.
 */
#include "tools/mkmodel_tok.h"

#include "base/util.h"
#include "model/tokenizer.h"

#include <jansson.h>

#define V4_TAIL_AT 128800 /* the first id of the table at the release's vocabulary size */

static const ms_tok_added V4_TAIL[] = {
    MS_TOK_DS_FIM_CHAT_TOOLS,
    {"<｜begin▁of▁repo▁name｜>", false},
    {"<｜end▁of▁repo▁name｜>", false},
    {"<｜begin▁of▁file▁name｜>", false},
    {"<｜end▁of▁file▁name｜>", false},
    {"<｜begin▁of▁file｜>", false},
    {"<｜end▁of▁file｜>", false},
    {"<think>", false},
    {"</think>", false},
    {"<｜place▁holder▁for▁copy｜>", false},
    {"<｜place▁holder▁for▁pointer▁replace｜>", false},
    {"｜DSML｜", false},
    {"<｜begin▁sys｜>", false},
    {"<｜end▁sys｜>", false},
    {"<｜latest_reminder｜>", false},
    {"<｜action｜>", false},
    {"<｜query｜>", false},
    {"<｜authority｜>", false},
    {"<｜domain｜>", false},
    {"<｜task｜>", false},
    {"<｜political｜>", false},
    {"<｜entity｜>", false},
    {"<｜title｜>", false},
    {"<｜safety｜>", false},
    {"<｜answer｜>", false},
    {"<｜search｜>", false},
    {"<dsml:", false},
    {"</dsml:", false},
    {"<｜search▁begin｜>", false},
    {"<｜search▁end｜>", false},
    {"<｜extracted_url｜>", false},
    {"<｜read_url｜>", false},
    {"<｜end_of_query｜>", false},
};

static int write_config(const char *dir, ms_errbuf *err)
{
    char path[1200];
    if (!ms_path_join(path, sizeof path, dir, "tokenizer_config.json"))
        return ms_err(err, MS_EINVAL, "path too long");
    json_t *root =
        json_pack("{s:b,s:b,s:s,s:s,s:s,s:I,s:s}", "add_bos_token", 1, "add_eos_token", 0,
                  "bos_token", "<｜begin▁of▁sentence｜>", "eos_token", "<｜end▁of▁sentence｜>",
                  "pad_token", "<｜end▁of▁sentence｜>", "model_max_length", (json_int_t)1048576,
                  "tokenizer_class", "LlamaTokenizerFast");
    if (!root) return ms_err(err, MS_ENOMEM, "tokenizer_config: out of memory");
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) ? MS_EIO : 0;
    json_decref(root);
    return rc ? ms_err(err, rc, "cannot write %s", path) : 0;
}

int ms_mkmodel_write_v4_tokenizer(const char *dir, int32_t vocab_size, ms_errbuf *err)
{
    char path[1200];
    if (!ms_path_join(path, sizeof path, dir, "tokenizer.json"))
        return ms_err(err, MS_EINVAL, "path too long");
    int rc = ms_tokenizer_train_write_tail(NULL, 0, vocab_size, V4_TAIL,
                                           (int32_t)MS_ARRAY_LEN(V4_TAIL), V4_TAIL_AT, path, err);
    return rc ? rc : write_config(dir, err);
}
