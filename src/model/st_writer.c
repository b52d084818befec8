/* st_writer.c — the safetensors writer of safetensors.h: single files and
 * sharded checkpoints with model.safetensors.index.json.
 *
 * Owns the tensor declarations and the copies made by ms_st_writer_add; data
 * given to _add_ref is borrowed, data from _add_gen is produced tensor by
 * tensor at save time.  Files are written incrementally (never a whole-file
 * buffer) to path.tmp and renamed into place.  Does not read files (that is
 * safetensors.c).  One thread at a time per writer.
 */
#include "model/safetensors.h"

#include "base/util.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct wr_ent {
    char *name;
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_ST_MAX_DIMS];
    size_t nbytes;
    const void *data; /* borrowed (add_ref) or == owned (add) */
    void *owned;
    ms_st_fill_fn fill; /* add_gen */
    void *ctx;
} wr_ent;

struct ms_st_writer {
    wr_ent *e;
    size_t n, cap;
    size_t data_bytes;
    json_t *names; /* set of names (UTF-8 validation and uniqueness) */
    json_t *meta;  /* __metadata__ or NULL */
};

ms_st_writer *ms_st_writer_new(void)
{
    ms_st_writer *w = calloc(1, sizeof *w);
    if (w && !(w->names = json_object())) {
        free(w);
        w = NULL;
    }
    return w;
}

void ms_st_writer_free(ms_st_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].owned);
    }
    free(w->e);
    json_decref(w->names);
    json_decref(w->meta);
    free(w);
}

size_t ms_st_writer_data_bytes(const ms_st_writer *w)
{
    return w ? w->data_bytes : 0;
}

/* Validates a declaration and appends it; returns the entry via *out. */
static int declare(ms_st_writer *w, const char *name, ms_dtype dt, int ndim, const int64_t *shape,
                   wr_ent **out, size_t *nbytes_out, ms_errbuf *err)
{
    if (!w || !name) return ms_err(err, MS_EINVAL, "writer: NULL argument");
    if (!name[0] || !strcmp(name, "__metadata__"))
        return ms_err(err, MS_EINVAL, "writer: tensor '%s': reserved or empty name", name);
    if (ms_dtype_size(dt) == 0)
        return ms_err(err, MS_EINVAL, "writer: tensor '%s': invalid dtype %d", name, (int)dt);
    if (ndim < 0 || ndim > MS_ST_MAX_DIMS || (ndim && !shape))
        return ms_err(err, MS_EINVAL, "writer: tensor '%s': %d dimensions (limit %d)", name, ndim,
                      MS_ST_MAX_DIMS);
    size_t nb = (size_t)ms_dtype_size(dt), total;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || !ms_mul_size(nb, (size_t)shape[i], &nb))
            return ms_err(err, MS_ERANGE, "writer: tensor '%s': bad or overflowing shape", name);
    }
    if (!ms_add_size(w->data_bytes, nb, &total))
        return ms_err(err, MS_ERANGE, "writer: tensor '%s': total size overflows", name);
    if (json_object_get(w->names, name))
        return ms_err(err, MS_EINVAL, "writer: tensor '%s' added twice", name);
    if (json_object_set_new(w->names, name, json_true()) != 0)
        return ms_err(err, MS_EINVAL, "writer: tensor name is not valid UTF-8");
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        wr_ent *n = realloc(w->e, cap * sizeof *n);
        if (!n) goto oom;
        w->e = n;
        w->cap = cap;
    }
    wr_ent *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) goto oom;
    e->dtype = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nb;
    w->n++;
    w->data_bytes = total;
    *out = e;
    *nbytes_out = nb;
    return 0;
oom:
    json_object_del(w->names, name);
    return ms_err(err, MS_ENOMEM, "writer: out of memory");
}

static void undeclare(ms_st_writer *w)
{
    wr_ent *e = &w->e[--w->n];
    json_object_del(w->names, e->name);
    w->data_bytes -= e->nbytes;
    free(e->name);
    free(e->owned);
}

static int add_data(ms_st_writer *w, const char *name, ms_dtype dt, int ndim, const int64_t *shape,
                    const void *data, size_t nbytes, bool copy, ms_errbuf *err)
{
    wr_ent *e;
    size_t want;
    int rc = declare(w, name, dt, ndim, shape, &e, &want, err);
    if (rc) return rc;
    if (nbytes != want || (!data && nbytes)) {
        undeclare(w);
        return ms_err(err, MS_EINVAL,
                      "writer: tensor '%s': %zu bytes given, dtype x shape needs %zu", name, nbytes,
                      want);
    }
    if (copy && nbytes) {
        if (!(e->owned = malloc(nbytes))) {
            undeclare(w);
            return ms_err(err, MS_ENOMEM, "writer: tensor '%s': out of memory for %zu bytes", name,
                          nbytes);
        }
        memcpy(e->owned, data, nbytes);
        data = e->owned;
    }
    e->data = data;
    return 0;
}

int ms_st_writer_add(ms_st_writer *w, const char *name, ms_dtype dt, int ndim, const int64_t *shape,
                     const void *data, size_t nbytes, ms_errbuf *err)
{
    return add_data(w, name, dt, ndim, shape, data, nbytes, true, err);
}

int ms_st_writer_add_ref(ms_st_writer *w, const char *name, ms_dtype dt, int ndim,
                         const int64_t *shape, const void *data, size_t nbytes, ms_errbuf *err)
{
    return add_data(w, name, dt, ndim, shape, data, nbytes, false, err);
}

int ms_st_writer_add_gen(ms_st_writer *w, const char *name, ms_dtype dt, int ndim,
                         const int64_t *shape, ms_st_fill_fn fill, void *ctx, ms_errbuf *err)
{
    if (!fill) return ms_err(err, MS_EINVAL, "writer: tensor '%s': NULL fill function", name);
    wr_ent *e;
    size_t nb;
    int rc = declare(w, name, dt, ndim, shape, &e, &nb, err);
    if (rc) return rc;
    e->fill = fill;
    e->ctx = ctx;
    return 0;
}

int ms_st_writer_set_metadata(ms_st_writer *w, const char *key, const char *value, ms_errbuf *err)
{
    if (!w || !key || !value) return ms_err(err, MS_EINVAL, "writer: NULL metadata argument");
    if (!w->meta && !(w->meta = json_object()))
        return ms_err(err, MS_ENOMEM, "writer: out of memory");
    json_t *v = json_string(value);
    if (!v || json_object_set_new(w->meta, key, v) != 0)
        return ms_err(err, MS_EINVAL, "writer: metadata '%s' is not valid UTF-8", key);
    return 0;
}

/* The header JSON for entries [b, e), padded with spaces to a multiple of 8. */
static char *make_header(const ms_st_writer *w, size_t b, size_t e, size_t *len, ms_errbuf *err)
{
    json_t *h = json_object();
    char *s = NULL;
    int bad = !h;
    if (!bad && w->meta) bad |= json_object_set(h, "__metadata__", w->meta);
    uint64_t off = 0;
    for (size_t i = b; i < e && !bad; i++) {
        const wr_ent *t = &w->e[i];
        json_t *sh = json_array();
        for (int d = 0; sh && d < t->ndim; d++)
            bad |= json_array_append_new(sh, json_integer(t->shape[d]));
        json_t *o = json_pack("{s:s, s:o, s:[I, I]}", "dtype", ms_dtype_name(t->dtype), "shape", sh,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + t->nbytes));
        bad |= !o || json_object_set_new(h, t->name, o);
        off += t->nbytes;
    }
    char *js = bad ? NULL : json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (!js) {
        ms_err(err, MS_ENOMEM, "writer: cannot build the header");
        return NULL;
    }
    size_t n = strlen(js), padded = (n + 7) & ~(size_t)7;
    if (padded > MS_ST_MAX_HEADER_BYTES) {
        ms_err(err, MS_ETOOBIG, "writer: header of %zu bytes exceeds %u", padded,
               MS_ST_MAX_HEADER_BYTES);
    } else if ((s = malloc(padded))) {
        memcpy(s, js, n);
        memset(s + n, ' ', padded - n);
        *len = padded;
    } else {
        ms_err(err, MS_ENOMEM, "writer: out of memory");
    }
    free(js);
    return s;
}

static int put(FILE *f, const void *p, size_t n, const char *path, ms_errbuf *err)
{
    if (n && fwrite(p, 1, n, f) != n)
        return ms_err(err, MS_EIO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

/* Writes entries [b, e) to path (through path.tmp). */
static int write_file(ms_st_writer *w, size_t b, size_t e, const char *path, ms_errbuf *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return ms_err(err, MS_ETOOBIG, "%s: path too long", path);
    size_t hlen = 0;
    char *hdr = make_header(w, b, e, &hlen, err);
    if (!hdr) return MS_ENOMEM;
    void *scratch = NULL;
    int rc = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(hdr);
        return ms_err(err, MS_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    rc = put(f, le, 8, tmp, err);
    if (!rc) rc = put(f, hdr, hlen, tmp, err);
    for (size_t i = b; i < e && !rc; i++) {
        wr_ent *t = &w->e[i];
        if (!t->fill) {
            rc = put(f, t->data, t->nbytes, tmp, err);
            continue;
        }
        scratch = malloc(t->nbytes ? t->nbytes : 1);
        if (!scratch) {
            rc = ms_err(err, MS_ENOMEM, "writer: tensor '%s': out of memory for %zu bytes", t->name,
                        t->nbytes);
            break;
        }
        rc = t->fill(t->ctx, t->name, scratch, t->nbytes, err);
        if (!rc) rc = put(f, scratch, t->nbytes, tmp, err);
        free(scratch);
        scratch = NULL;
    }
    if (fclose(f) != 0 && !rc)
        rc = ms_err(err, MS_EIO, "%s: close failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = ms_err(err, MS_EIO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) remove(tmp);
    free(hdr);
    return rc;
}

int ms_st_writer_save(ms_st_writer *w, const char *path, ms_errbuf *err)
{
    if (!w || !path) return ms_err(err, MS_EINVAL, "writer: NULL argument");
    return write_file(w, 0, w->n, path, err);
}

int ms_st_writer_save_sharded(ms_st_writer *w, const char *dir, size_t max_shard_bytes,
                              ms_errbuf *err)
{
    if (!w || !dir || !max_shard_bytes) return ms_err(err, MS_EINVAL, "writer: bad argument");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ms_err(err, MS_EIO, "%s: cannot create directory: %s", dir, strerror(errno));
    /* shard k holds entries [start[k], start[k+1]) */
    size_t *start = malloc((w->n + 2) * sizeof *start), n_shards = 0;
    if (!start) return ms_err(err, MS_ENOMEM, "writer: out of memory");
    size_t acc = 0;
    start[0] = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (i > start[n_shards] && acc + w->e[i].nbytes > max_shard_bytes) {
            start[++n_shards] = i;
            acc = 0;
        }
        acc += w->e[i].nbytes;
    }
    start[++n_shards] = w->n;
    json_t *idx = json_pack("{s:{s:I}, s:{}}", "metadata", "total_size", (json_int_t)w->data_bytes,
                            "weight_map");
    json_t *wm = idx ? json_object_get(idx, "weight_map") : NULL;
    int rc = idx ? 0 : ms_err(err, MS_ENOMEM, "writer: out of memory");
    char name[64], path[4096];
    for (size_t k = 0; k < n_shards && !rc; k++) {
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, n_shards);
        if (!ms_path_join(path, sizeof path, dir, name)) {
            rc = ms_err(err, MS_ETOOBIG, "%s: path too long", dir);
            break;
        }
        rc = write_file(w, start[k], start[k + 1], path, err);
        for (size_t i = start[k]; i < start[k + 1] && !rc; i++)
            if (json_object_set_new(wm, w->e[i].name, json_string(name)))
                rc = ms_err(err, MS_ENOMEM, "writer: out of memory");
    }
    if (!rc) {
        if (!ms_path_join(path, sizeof path, dir, MS_ST_INDEX_NAME))
            rc = ms_err(err, MS_ETOOBIG, "%s: path too long", dir);
        else if (json_dump_file(idx, path, JSON_INDENT(2)) != 0)
            rc = ms_err(err, MS_EIO, "%s: cannot write", path);
    }
    json_decref(idx);
    free(start);
    return rc;
}
