/* safetensors.h — read-only, memory-mapped safetensors files and HF checkpoint
 * directories (single file or shards via model.safetensors.index.json).
 *
 * Owns the mmaps and the tensor index; never copies tensor data.  Every header
 * is validated at open (length bounds, JSON, known dtype, shape overflow,
 * dtype × shape == bytes, offsets in range, no overlap, full coverage); a bad
 * file is rejected with a message naming the file and tensor.  After open the
 * object is immutable and may be read from any thread.
 */
#ifndef MS_MODEL_SAFETENSORS_H
#define MS_MODEL_SAFETENSORS_H

#include "base/error.h"
#include "kernels/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define MS_ST_MAX_DIMS 8
#define MS_ST_MAX_HEADER_BYTES (100u << 20)

typedef struct ms_tensor {
    const char *name;    /* borrowed from the store */
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_ST_MAX_DIMS];
    const void *data;    /* borrowed: inside the read-only mmap */
    size_t nbytes;
    const char *file;    /* the shard it lives in (borrowed) */
} ms_tensor;

typedef struct ms_st_store ms_st_store;

/* Opens one .safetensors file. */
int ms_st_open_file(ms_st_store **out, const char *path, ms_errbuf *err);
/* Opens a checkpoint directory: model.safetensors.index.json if present
 * (every shard it names), else every *.safetensors file in the directory. */
int ms_st_open_dir(ms_st_store **out, const char *dir, ms_errbuf *err);
/* Validates a header held in memory (the fuzz target's entry point):
 * buf = the whole file image. */
int ms_st_check_buffer(const uint8_t *buf, size_t len, ms_errbuf *err);
void ms_st_close(ms_st_store *st);

/* Looks a tensor up by name; NULL when absent.  Borrowed pointer. */
const ms_tensor *ms_st_find(const ms_st_store *st, const char *name);
size_t ms_st_count(const ms_st_store *st);
const ms_tensor *ms_st_at(const ms_st_store *st, size_t i);

/* Writer (mkmodel, tests): collects tensors, then writes one file with a
 * space-padded header (8-byte aligned data). */
typedef struct ms_st_writer ms_st_writer;
ms_st_writer *ms_st_writer_new(void);
/* Copies `data` (nbytes must equal dtype size × Π shape). */
int ms_st_writer_add(ms_st_writer *w, const char *name, ms_dtype dt, int ndim,
                     const int64_t *shape, const void *data, size_t nbytes, ms_errbuf *err);
int ms_st_writer_save(ms_st_writer *w, const char *path, ms_errbuf *err);
void ms_st_writer_free(ms_st_writer *w);

#endif
