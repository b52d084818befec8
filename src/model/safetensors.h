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

#define MS_ST_MAX_DIMS         8
#define MS_ST_MAX_HEADER_BYTES (100u << 20) /* the reference library's limit */
#define MS_ST_MAX_INDEX_BYTES  (256u << 20) /* model.safetensors.index.json */
#define MS_ST_MAX_FILES        100000       /* shards in one checkpoint */
#define MS_ST_INDEX_NAME       "model.safetensors.index.json"

/* Bit of a dtype in an ms_st_expect dtype mask. */
#define MS_DT_MASK(t) (1u << (unsigned)(t))

typedef struct ms_tensor {
    const char *name; /* borrowed from the store */
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_ST_MAX_DIMS];
    const void *data; /* borrowed: inside the read-only mmap; tensors lie back to back
                       * after an 8-byte aligned data section, so data may be
                       * unaligned for its dtype (use memcpy / unaligned loads) */
    size_t nbytes;
    const char *file; /* the shard it lives in (borrowed) */
} ms_tensor;

typedef struct ms_st_store ms_st_store;

/* Opens one .safetensors file. */
int ms_st_open_file(ms_st_store **out, const char *path, ms_errbuf *err);
/* Opens a checkpoint directory: model.safetensors.index.json if present
 * (every shard it names), else every *.safetensors file in the directory. */
int ms_st_open_dir(ms_st_store **out, const char *dir, ms_errbuf *err);
/* A directory goes to ms_st_open_dir, anything else to ms_st_open_file. */
int ms_st_open(ms_st_store **out, const char *path, ms_errbuf *err);
/* Validates a header held in memory (the fuzz target's entry point):
 * buf = the whole file image. */
int ms_st_check_buffer(const uint8_t *buf, size_t len, ms_errbuf *err);
void ms_st_close(ms_st_store *st);

/* Looks a tensor up by name; NULL when absent.  Borrowed pointer. */
const ms_tensor *ms_st_find(const ms_st_store *st, const char *name);
size_t ms_st_count(const ms_st_store *st);
/* Tensors in file order, and inside a file by data offset. */
const ms_tensor *ms_st_at(const ms_st_store *st, size_t i);

/* The model loader's check: finds `name` and verifies its shape and dtype.
 * ndim < 0 skips the shape check; a shape entry < 0 matches any extent;
 * dtype_mask 0 accepts any dtype (else OR of MS_DT_MASK(dt)).  Errors name the
 * file (or checkpoint), the tensor and expected vs actual: MS_ENOENT when
 * missing, MS_EFORMAT on a wrong shape or dtype.  *out (optional) is borrowed. */
int ms_st_expect(const ms_st_store *st, const char *name, int ndim, const int64_t *shape,
                 unsigned dtype_mask, const ms_tensor **out, ms_errbuf *err);

/* Writer (mkmodel, tests): collects tensor declarations, then writes one file
 * (or shards + index) with a space-padded header, so the data section starts
 * 8-byte aligned; tensors are stored in insertion order, back to back.  Data is
 * written incrementally at save time; the writer holds at most one tensor of
 * its own (for add_gen) besides what add copied.  Three ways to supply data:
 *   _add      copies `data` now (small tensors, tests);
 *   _add_ref  borrows `data`: the caller keeps it alive and unchanged until the
 *             last save returns (no second copy in RAM);
 *   _add_gen  calls fill(ctx, name, buf, nbytes) at save time with a scratch
 *             buffer of the tensor's size, written then freed (a generator:
 *             the whole model never exists in RAM).
 * nbytes must equal dtype size × Π shape; names are unique, valid UTF-8 and not
 * "__metadata__".  One thread at a time. */
typedef struct ms_st_writer ms_st_writer;
typedef int (*ms_st_fill_fn)(void *ctx, const char *name, void *buf, size_t nbytes, ms_errbuf *err);
ms_st_writer *ms_st_writer_new(void);
int ms_st_writer_add(ms_st_writer *w, const char *name, ms_dtype dt, int ndim, const int64_t *shape,
                     const void *data, size_t nbytes, ms_errbuf *err);
int ms_st_writer_add_ref(ms_st_writer *w, const char *name, ms_dtype dt, int ndim,
                         const int64_t *shape, const void *data, size_t nbytes, ms_errbuf *err);
int ms_st_writer_add_gen(ms_st_writer *w, const char *name, ms_dtype dt, int ndim,
                         const int64_t *shape, ms_st_fill_fn fill, void *ctx, ms_errbuf *err);
/* Adds a "__metadata__" string entry (e.g. "format": "pt"). */
int ms_st_writer_set_metadata(ms_st_writer *w, const char *key, const char *value, ms_errbuf *err);
/* Writes one file (via path.tmp + rename). */
int ms_st_writer_save(ms_st_writer *w, const char *path, ms_errbuf *err);
/* Writes dir/model-0000i-of-0000n.safetensors shards of at most
 * max_shard_bytes of tensor data each (a bigger tensor gets a shard of its
 * own; order kept) plus dir/model.safetensors.index.json; creates dir. */
int ms_st_writer_save_sharded(ms_st_writer *w, const char *dir, size_t max_shard_bytes,
                              ms_errbuf *err);
/* Total tensor data bytes declared so far. */
size_t ms_st_writer_data_bytes(const ms_st_writer *w);
void ms_st_writer_free(ms_st_writer *w);

#endif
