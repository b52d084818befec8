/* fuzz_config.c — libFuzzer target: ms_config_parse on arbitrary text never
 * crashes; an accepted config round-trips through ms_config_to_json to an
 * identical struct, and its derived quantities are finite.
 */
// FUZZ_SOURCES: src/model/config.c src/base/error.c src/base/util.c src/base/log.c
// FUZZ_LIBS: -ljansson -lm -pthread
#include "model/config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MS_CONFIG_MAX_BYTES) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    ms_config c, d;
    ms_errbuf err = {{0}};
    int rc = ms_config_parse(&c, text, &err);
    free(text);
    if (rc > 0 || (rc < 0 && err.msg[0] == 0)) abort();
    if (rc) return 0;
    static float inv[MS_CONFIG_MAX_HEAD_DIM / 2];
    ms_config_rope_inv_freq(&c, inv);
    for (int i = 0; i < c.qk_rope_head_dim / 2; i++)
        if (!isfinite(inv[i]) || inv[i] <= 0) abort();
    if (!isfinite(ms_config_softmax_scale(&c)) || !isfinite(ms_config_rope_attn_factor(&c)))
        abort();
    char *s = ms_config_to_json(&c, &err);
    if (!s) abort();
    if (ms_config_parse(&d, s, &err) != 0) abort();
    char *s2 = ms_config_to_json(&d, &err);
    if (!s2 || strcmp(s, s2)) abort(); /* write → parse → write is a fixed point */
    free(s);
    free(s2);
    return 0;
}
