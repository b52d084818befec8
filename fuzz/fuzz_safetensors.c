/* fuzz_safetensors.c — libFuzzer target: ms_st_check_buffer on arbitrary
 * bytes must return 0 or a negative code whose message names the file, and
 * never crash, leak or read outside the buffer (ASan/UBSan; libFuzzer hands
 * over exactly-sized buffers).  An accepted image is also opened as a file
 * (memfd) and every tensor must be found by name with in-bounds data.
 */
// FUZZ_SOURCES: src/model/safetensors.c src/base/error.c src/base/util.c
// FUZZ_SOURCES: src/base/log.c src/kernels/dtype.c
// FUZZ_LIBS: -ljansson -lm -pthread
#include "model/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void open_as_file(const uint8_t *data, size_t size)
{
    int fd = memfd_create("st", 0);
    if (fd < 0) return;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ms_st_store *st;
    ms_errbuf err;
    if (ms_st_open_file(&st, path, &err) != 0) abort(); /* same bytes, same verdict */
    size_t total = 0;
    for (size_t i = 0; i < ms_st_count(st); i++) {
        const ms_tensor *t = ms_st_at(st, i);
        if (ms_st_find(st, t->name) != t) abort();
        if (ms_st_expect(st, t->name, t->ndim, t->shape, MS_DT_MASK(t->dtype), NULL, &err)) abort();
        volatile uint8_t sink = 0;
        if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
        (void)sink;
        total += t->nbytes;
    }
    if (total > size) abort();
    ms_st_close(st);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ms_errbuf err = {{0}};
    int rc = ms_st_check_buffer(data, size, &err);
    if (rc > 0) abort();
    if (rc < 0 && !strstr(err.msg, "<buffer>")) abort(); /* every error names the file */
    if (rc == 0) open_as_file(data, size);
    return 0;
}
