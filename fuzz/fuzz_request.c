// FUZZ_SOURCES: src/serve/openai.c src/serve/wire.c src/serve/chat.c src/serve/chat_v4.c src/serve/chat_dsml.c src/serve/detok.c src/serve/request.c src/base/error.c src/base/util.c src/base/log.c
// FUZZ_LIBS: -ljansson -lm -pthread
/* fuzz_request.c — libFuzzer target for everything a client's body reaches
 * before the engine: the request parsers of /v1/chat/completions,
 * /v1/completions and /generate (incl. the chat template), the context check,
 * and, on the output side, the detokenizer with stop strings and the
 * reasoning/tool-call parser fed in awkward pieces.
 * Build: clang-14 -g -O1 -fsanitize=fuzzer,address,undefined -Isrc \
 *   fuzz/fuzz_request.c <FUZZ_SOURCES> -ljansson -lpthread -lm
 * The first input byte picks the route and split sizes; the rest is the body.
 */
#include "../tests/echo_engine.h"
#include "serve/chat.h"
#include "serve/openai.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void feed_output(const char *text, size_t n, unsigned sel, char *const *stops, int n_stops)
{
    /* the body bytes as generated token ids through detok → chat parser */
    ms_detok d;
    ms_chat_parser p;
    if (ms_detok_init(&d, &test_codec, sel & 1, stops, n_stops)) {
        ms_detok_deinit(&d);
        return;
    }
    if (ms_chat_parser_init(&p, (sel >> 1) & 1, (sel >> 2) & 1, (sel >> 3) & 1)) {
        ms_detok_deinit(&d);
        return;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ms_errbuf e;
    if (test_codec.encode(NULL, text, n, 1, &ids, &n_ids, &e) == 0) {
        size_t step = 1 + (sel >> 4);
        for (size_t i = 0; i < n_ids; i++) {
            const char *delta;
            size_t k;
            int rc = ms_detok_push(&d, ids[i], &delta, &k);
            ms_chat_delta cd;
            if (i % step == 0 || rc) {
                ms_chat_parser_feed(&p, delta, k, 0, &cd);
                ms_chat_delta_clear(&cd);
            }
            if (rc) break;
        }
        const char *delta;
        size_t k;
        ms_detok_flush(&d, &delta, &k);
        ms_chat_delta cd;
        ms_chat_parser_feed(&p, delta, k, 1, &cd);
        ms_chat_delta_clear(&cd);
        free(ids);
    }
    ms_chat_parser_deinit(&p);
    ms_detok_deinit(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    unsigned sel = data[0];
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    static const enum ms_api_kind kinds[] = {MS_API_CHAT, MS_API_COMPLETION, MS_API_GENERATE};
    ms_api_config cfg = {.context_len = 64 + (sel & 0x3f),
                         .vocab_size = TC_VOCAB,
                         .reasoning_parser = (int)((sel >> 2) % 3),
                         .tool_parser = (int)((sel >> 4) & 1)};
    ms_api_req r;
    ms_errbuf e;
    const char *param;
    if (ms_api_parse(&r, kinds[sel % 3], body, n, &cfg, &e, &param) == 0) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (r.text &&
            test_codec.encode(NULL, r.text, r.n_text, r.parse_special, &ids, &n_ids, &e) == 0) {
            ms_api_check_input(&r, ids, n_ids, &cfg, &e);
            free(ids);
        } else if (r.ids) {
            ms_api_check_input(&r, r.ids, r.n_ids, &cfg, &e);
        }
        if (r.text) feed_output(r.text, r.n_text, sel, r.stops, r.n_stops);
    }
    ms_api_req_deinit(&r);
    char *eb = ms_api_error_body(400, e.msg, param);
    free(eb);
    /* raw bytes as output text as well */
    char *stops[] = {"</", "\xef\xbd\x9c>"};
    feed_output(body, n, sel, stops, (int)(sel & 1) * 2);
    return 0;
}
