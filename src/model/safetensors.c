/* safetensors.c — the safetensors reader: validation of file images, mmap of
 * single files and HF checkpoint directories, lookup by name.
 *
 * Owns the mmaps, the tensor table and its hash index.  Does not own the
 * writer (st_writer.c) and never copies tensor data.  Every header is checked
 * in full before any tensor is exposed; each error names the file and, where
 * there is one, the tensor.  Open/close from one thread; a finished store is
 * immutable and may be read from any thread.
 */
#include "model/safetensors.h"

#include "base/log.h"
#include "base/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_file {
    char *path; /* owned; what error messages and ms_tensor.file show */
    void *map;  /* read-only mapping of the whole file */
    size_t map_bytes;
} st_file;

struct ms_st_store {
    char *desc; /* the path given to open (file or directory) */
    st_file *files;
    size_t n_files, cap_files;
    ms_tensor *tensors; /* names owned (strdup) */
    size_t n_tensors, cap_tensors;
    uint32_t *slots; /* open addressing: tensor index + 1, 0 = empty */
    size_t n_slots;  /* power of two */
};

/* One tensor entry of a header while it is being validated. */
typedef struct pt {
    const char *name; /* borrowed from the JSON root */
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_ST_MAX_DIMS];
    uint64_t begin, end;
} pt;

/* Dtypes of the reference library that moeserve does not read. */
static const char *const unsupported_dtypes[] = {"BOOL",    "F4",          "F6_E2M3",     "F6_E3M2",
                                                 "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",
                                                 "U16",     "U32",         "U64",         "C64"};

static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t n = 0;
    n += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int parse_offsets(const json_t *jo, const char *f, const char *name, pt *t, ms_errbuf *err)
{
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return ms_err(err, MS_EFORMAT, "%s: tensor '%s': 'data_offsets' is not an array of 2", f,
                      name);
    json_int_t v[2];
    for (int i = 0; i < 2; i++) {
        const json_t *x = json_array_get(jo, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return ms_err(err, MS_EFORMAT,
                          "%s: tensor '%s': data_offsets entry %d is not a non-negative integer", f,
                          name, i);
        v[i] = json_integer_value(x);
    }
    t->begin = (uint64_t)v[0];
    t->end = (uint64_t)v[1];
    return 0;
}

/* Validates one tensor entry on its own (offsets against the data size). */
static int parse_tensor(const char *name, const json_t *val, const char *f, uint64_t data_bytes,
                        pt *t, ms_errbuf *err)
{
    t->name = name;
    if (!json_is_object(val))
        return ms_err(err, MS_EFORMAT, "%s: tensor '%s': entry is not a JSON object", f, name);
    const json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape");
    const json_t *jo = json_object_get(val, "data_offsets");
    if (!json_is_string(jd))
        return ms_err(err, MS_EFORMAT, "%s: tensor '%s': 'dtype' missing or not a string", f, name);
    const char *ds = json_string_value(jd);
    int dt = ms_dtype_parse(ds);
    if (dt < 0) {
        for (size_t i = 0; i < MS_ARRAY_LEN(unsupported_dtypes); i++)
            if (!strcmp(ds, unsupported_dtypes[i]))
                return ms_err(err, MS_EUNSUPPORTED, "%s: tensor '%s': dtype %s is not supported", f,
                              name, ds);
        return ms_err(err, MS_EFORMAT, "%s: tensor '%s': unknown dtype '%.40s'", f, name, ds);
    }
    t->dtype = (ms_dtype)dt;
    if (!json_is_array(js))
        return ms_err(err, MS_EFORMAT, "%s: tensor '%s': 'shape' missing or not an array", f, name);
    if (json_array_size(js) > MS_ST_MAX_DIMS)
        return ms_err(err, MS_EUNSUPPORTED, "%s: tensor '%s': %zu dimensions (limit %d)", f, name,
                      json_array_size(js), MS_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    uint64_t nel = 1;
    bool overflow = false;
    for (int i = 0; i < t->ndim; i++) {
        const json_t *x = json_array_get(js, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return ms_err(err, MS_EFORMAT,
                          "%s: tensor '%s': shape entry %d is not a non-negative integer", f, name,
                          i);
        t->shape[i] = json_integer_value(x);
        if (__builtin_mul_overflow(nel, (uint64_t)t->shape[i], &nel)) overflow = true;
    }
    uint64_t nbytes;
    char sh[160];
    fmt_shape(sh, sizeof sh, t->shape, t->ndim);
    if (overflow || __builtin_mul_overflow(nel, (uint64_t)ms_dtype_size(t->dtype), &nbytes))
        return ms_err(err, MS_ERANGE, "%s: tensor '%s': shape %s overflows 64-bit sizes", f, name,
                      sh);
    int rc = parse_offsets(jo, f, name, t, err);
    if (rc) return rc;
    if (t->begin > t->end)
        return ms_err(err, MS_EFORMAT,
                      "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before begin",
                      f, name, t->begin, t->end);
    if (t->end > data_bytes)
        return ms_err(err, MS_EFORMAT,
                      "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                      "] exceed data section of %" PRIu64 " bytes",
                      f, name, t->begin, t->end, data_bytes);
    if (t->end - t->begin != nbytes)
        return ms_err(err, MS_EFORMAT,
                      "%s: tensor '%s': dtype %s x shape %s is %" PRIu64
                      " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64,
                      f, name, ds, sh, nbytes, t->begin, t->end, t->end - t->begin);
    return 0;
}

static int cmp_pt(const void *a, const void *b)
{
    const pt *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int store_append(ms_st_store *st, const pt *t, const uint8_t *data, const char *file,
                        ms_errbuf *err)
{
    if (st->n_tensors == st->cap_tensors) {
        size_t cap = st->cap_tensors ? st->cap_tensors * 2 : 256;
        ms_tensor *n = realloc(st->tensors, cap * sizeof *n);
        if (!n) return ms_err(err, MS_ENOMEM, "%s: out of memory for the tensor table", file);
        st->tensors = n;
        st->cap_tensors = cap;
    }
    if (st->n_tensors >= UINT32_MAX - 1)
        return ms_err(err, MS_ETOOBIG, "%s: too many tensors", file);
    ms_tensor *o = &st->tensors[st->n_tensors];
    memset(o, 0, sizeof *o);
    o->name = strdup(t->name);
    if (!o->name) return ms_err(err, MS_ENOMEM, "%s: out of memory", file);
    o->dtype = t->dtype;
    o->ndim = t->ndim;
    memcpy(o->shape, t->shape, sizeof o->shape);
    o->data = data + t->begin;
    o->nbytes = (size_t)(t->end - t->begin);
    o->file = file;
    st->n_tensors++;
    return 0;
}

/* Validates a whole file image; when st is non-NULL appends its tensors
 * (pointing into buf) in data order, attributed to `file`. */
static int parse_image(const uint8_t *buf, size_t len, const char *f, ms_st_store *st,
                       ms_errbuf *err)
{
    if (len < 8)
        return ms_err(err, MS_EFORMAT,
                      "%s: file of %zu bytes is shorter than the 8-byte header length", f, len);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)buf[i] << (8 * i);
    if (n > MS_ST_MAX_HEADER_BYTES)
        return ms_err(err, MS_ETOOBIG,
                      "%s: header length %" PRIu64 " exceeds the limit of %u bytes", f, n,
                      MS_ST_MAX_HEADER_BYTES);
    if (n > len - 8)
        return ms_err(err, MS_EFORMAT,
                      "%s: header length %" PRIu64 " exceeds the %zu bytes after the length field "
                      "(truncated file?)",
                      f, n, len - 8);
    uint64_t data_bytes = len - 8 - n;
    const uint8_t *data = buf + 8 + n;
    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ms_err(err, MS_EFORMAT, "%s: header is not valid JSON: %s (line %d, column %d)", f,
                      je.text, je.line, je.column);
    int rc = 0;
    pt *v = NULL;
    if (!json_is_object(root)) {
        rc = ms_err(err, MS_EFORMAT, "%s: header is not a JSON object", f);
        goto out;
    }
    v = calloc(json_object_size(root) + 1, sizeof *v);
    if (!v) {
        rc = ms_err(err, MS_ENOMEM, "%s: out of memory for %zu header entries", f,
                    json_object_size(root));
        goto out;
    }
    size_t nv = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) {
                rc = ms_err(err, MS_EFORMAT, "%s: __metadata__ is not a JSON object", f);
                goto out;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv)
            {
                if (!json_is_string(mv)) {
                    rc = ms_err(err, MS_EFORMAT, "%s: __metadata__ entry '%s' is not a string", f,
                                mk);
                    goto out;
                }
            }
            continue;
        }
        rc = parse_tensor(key, val, f, data_bytes, &v[nv], err);
        if (rc) goto out;
        nv++;
    }
    qsort(v, nv, sizeof *v, cmp_pt);
    uint64_t covered = 0;
    for (size_t i = 0; i < nv; i++) {
        if (v[i].begin < covered) {
            rc = ms_err(err, MS_EFORMAT,
                        "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                        "] overlap tensor '%s' [%" PRIu64 ", %" PRIu64 "]",
                        f, v[i].name, v[i].begin, v[i].end, v[i - 1].name, v[i - 1].begin,
                        v[i - 1].end);
            goto out;
        }
        if (v[i].begin > covered) {
            rc = ms_err(err, MS_EFORMAT,
                        "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                        "] leave a gap of %" PRIu64 " bytes after %s%s%s",
                        f, v[i].name, v[i].begin, v[i].end, v[i].begin - covered,
                        i ? "tensor '" : "the start of the data section", i ? v[i - 1].name : "",
                        i ? "'" : "");
            goto out;
        }
        covered = v[i].end;
    }
    if (covered != data_bytes) {
        if (nv)
            rc = ms_err(err, MS_EFORMAT,
                        "%s: tensor '%s': data section has %" PRIu64
                        " bytes but the tensors end at %" PRIu64 " (%" PRIu64
                        " uncovered bytes after it)",
                        f, v[nv - 1].name, data_bytes, covered, data_bytes - covered);
        else
            rc = ms_err(err, MS_EFORMAT, "%s: no tensors but a data section of %" PRIu64 " bytes",
                        f, data_bytes);
        goto out;
    }
    for (size_t i = 0; st && i < nv; i++) {
        rc = store_append(st, &v[i], data, f, err);
        if (rc) goto out;
    }
out:
    free(v);
    json_decref(root);
    return rc;
}

int ms_st_check_buffer(const uint8_t *buf, size_t len, ms_errbuf *err)
{
    if (!buf && len) return ms_err(err, MS_EINVAL, "<buffer>: NULL buffer");
    static const uint8_t empty[1];
    return parse_image(buf ? buf : empty, len, "<buffer>", NULL, err);
}

/* Maps one file and appends its tensors. */
static int add_file(ms_st_store *st, const char *path, ms_errbuf *err)
{
    if (st->n_files >= MS_ST_MAX_FILES)
        return ms_err(err, MS_ETOOBIG, "%s: more than %d safetensors files", path, MS_ST_MAX_FILES);
    if (st->n_files == st->cap_files) {
        size_t cap = st->cap_files ? st->cap_files * 2 : 8;
        st_file *n = realloc(st->files, cap * sizeof *n);
        if (!n) return ms_err(err, MS_ENOMEM, "%s: out of memory", path);
        st->files = n;
        st->cap_files = cap;
    }
    st_file *sf = &st->files[st->n_files];
    memset(sf, 0, sizeof *sf);
    sf->path = strdup(path);
    if (!sf->path) return ms_err(err, MS_ENOMEM, "%s: out of memory", path);
    st->n_files++; /* from here on ms_st_close releases it */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ms_err(err, errno == ENOENT ? MS_ENOENT : MS_EIO, "%s: cannot open: %s", path,
                      strerror(errno));
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = ms_err(err, MS_EIO, "%s: not a regular file", path);
        goto out;
    }
    if (sb.st_size < 8) {
        rc = ms_err(err, MS_EFORMAT,
                    "%s: file of %lld bytes is shorter than the 8-byte header length", path,
                    (long long)sb.st_size);
        goto out;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = ms_err(err, MS_EIO, "%s: mmap of %lld bytes failed: %s", path, (long long)sb.st_size,
                    strerror(errno));
        goto out;
    }
    sf->map = m;
    sf->map_bytes = (size_t)sb.st_size;
    rc = parse_image(m, sf->map_bytes, sf->path, st, err);
out:
    close(fd);
    return rc;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Builds the hash index; a name seen twice (two shards) is an error. */
static int build_index(ms_st_store *st, ms_errbuf *err)
{
    size_t n = 16;
    while (n < st->n_tensors * 2) n *= 2;
    st->slots = calloc(n, sizeof *st->slots);
    if (!st->slots) return ms_err(err, MS_ENOMEM, "%s: out of memory for the index", st->desc);
    st->n_slots = n;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const ms_tensor *t = &st->tensors[i];
        size_t s = (size_t)hash_name(t->name) & (n - 1);
        while (st->slots[s]) {
            const ms_tensor *o = &st->tensors[st->slots[s] - 1];
            if (!strcmp(o->name, t->name))
                return ms_err(err, MS_EFORMAT, "%s: tensor '%s' is also in %s", t->file, t->name,
                              o->file);
            s = (s + 1) & (n - 1);
        }
        st->slots[s] = (uint32_t)(i + 1);
    }
    return 0;
}

static ms_st_store *store_new(const char *desc)
{
    ms_st_store *st = calloc(1, sizeof *st);
    if (st && !(st->desc = strdup(desc))) {
        free(st);
        st = NULL;
    }
    return st;
}

int ms_st_open_file(ms_st_store **out, const char *path, ms_errbuf *err)
{
    *out = NULL;
    ms_st_store *st = store_new(path);
    if (!st) return ms_err(err, MS_ENOMEM, "%s: out of memory", path);
    int rc = add_file(st, path, err);
    if (!rc) rc = build_index(st, err);
    if (rc) {
        ms_st_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A shard name from an index must be a plain file name inside the directory. */
static bool plain_file_name(const char *s)
{
    return s[0] && strlen(s) < 256 && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

typedef struct shard_ref {
    const char *shard, *tensor; /* borrowed from the index JSON */
} shard_ref;

static int cmp_ref(const void *a, const void *b)
{
    const shard_ref *x = a, *y = b;
    int c = strcmp(x->shard, y->shard);
    return c ? c : strcmp(x->tensor, y->tensor);
}

/* Opens every shard the index names (sorted, each once), then checks that
 * every tensor it names is in that shard. */
static int open_indexed(ms_st_store *st, const char *dir, const char *index_path, ms_errbuf *err)
{
    char *text = NULL;
    shard_ref *refs = NULL;
    size_t len = 0, n_refs = 0;
    json_t *root = NULL;
    int rc = ms_read_file(index_path, MS_ST_MAX_INDEX_BYTES, &text, &len);
    if (rc) return ms_err(err, rc, "%s: cannot read: %s", index_path, ms_strerror(rc));
    json_error_t je;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    const json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
    if (!root) {
        rc = ms_err(err, MS_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", index_path,
                    je.text, je.line, je.column);
        goto out;
    }
    if (!json_is_object(root) || !json_is_object(wm)) {
        rc = ms_err(err, MS_EFORMAT, "%s: no 'weight_map' object", index_path);
        goto out;
    }
    refs = calloc(json_object_size(wm) + 1, sizeof *refs);
    if (!refs) {
        rc = ms_err(err, MS_ENOMEM, "%s: out of memory", index_path);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)wm, key, val)
    {
        if (!json_is_string(val) || !plain_file_name(json_string_value(val))) {
            rc = ms_err(err, MS_EFORMAT,
                        "%s: tensor '%s': shard is not a plain file name in the directory",
                        index_path, key);
            goto out;
        }
        refs[n_refs].shard = json_string_value(val);
        refs[n_refs++].tensor = key;
    }
    if (n_refs == 0) {
        rc = ms_err(err, MS_EFORMAT, "%s: 'weight_map' is empty", index_path);
        goto out;
    }
    qsort(refs, n_refs, sizeof *refs, cmp_ref);
    char path[4096];
    for (size_t i = 0; i < n_refs; i++) {
        if (i && !strcmp(refs[i].shard, refs[i - 1].shard)) continue;
        if (!ms_path_join(path, sizeof path, dir, refs[i].shard)) {
            rc = ms_err(err, MS_ETOOBIG, "%s: path too long", dir);
            goto out;
        }
        struct stat sb;
        if (stat(path, &sb) != 0) {
            rc = ms_err(err, MS_ENOENT, "%s: tensor '%s': shard %s does not exist", index_path,
                        refs[i].tensor, refs[i].shard);
            goto out;
        }
        rc = add_file(st, path, err);
        if (rc) goto out;
    }
    rc = build_index(st, err);
    if (rc) goto out;
    for (size_t i = 0; i < n_refs; i++) {
        const ms_tensor *t = ms_st_find(st, refs[i].tensor);
        if (!t) {
            rc = ms_err(err, MS_EFORMAT,
                        "%s: tensor '%s': the index puts it in %s, which has no such tensor",
                        index_path, refs[i].tensor, refs[i].shard);
            goto out;
        }
        if (strcmp(base_name(t->file), refs[i].shard)) {
            rc = ms_err(err, MS_EFORMAT, "%s: tensor '%s': the index puts it in %s but it is in %s",
                        index_path, refs[i].tensor, refs[i].shard, t->file);
            goto out;
        }
    }
    if (st->n_tensors != n_refs)
        MS_LOG(MS_WARN, "st", "%s: %zu tensors in the shards are not listed in the index",
               index_path, st->n_tensors - n_refs);
out:
    free(refs);
    json_decref(root);
    free(text);
    return rc;
}

/* No index: every regular *.safetensors file in the directory, sorted. */
static int open_listing(ms_st_store *st, const char *dir, ms_errbuf *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return ms_err(err, errno == ENOENT ? MS_ENOENT : MS_EIO, "%s: cannot open directory: %s",
                      dir, strerror(errno));
    char **names = NULL, path[4096];
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
        struct stat sb;
        if (!ms_path_join(path, sizeof path, dir, de->d_name) || stat(path, &sb) != 0 ||
            !S_ISREG(sb.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = cap <= MS_ST_MAX_FILES ? realloc(names, cap * sizeof *nn) : NULL;
            if (!nn) {
                rc = ms_err(err, MS_ENOMEM, "%s: too many safetensors files", dir);
                goto out;
            }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = ms_err(err, MS_ENOMEM, "%s: out of memory", dir);
            goto out;
        }
        n++;
    }
    if (n == 0) {
        rc = ms_err(err, MS_ENOENT, "%s: no *.safetensors files and no %s", dir, MS_ST_INDEX_NAME);
        goto out;
    }
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && !rc; i++) {
        if (!ms_path_join(path, sizeof path, dir, names[i]))
            rc = ms_err(err, MS_ETOOBIG, "%s: path too long", dir);
        else
            rc = add_file(st, path, err);
    }
    if (!rc) rc = build_index(st, err);
out:
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    closedir(d);
    return rc;
}

int ms_st_open_dir(ms_st_store **out, const char *dir, ms_errbuf *err)
{
    *out = NULL;
    ms_st_store *st = store_new(dir);
    if (!st) return ms_err(err, MS_ENOMEM, "%s: out of memory", dir);
    char index_path[4096];
    struct stat sb;
    int rc;
    if (!ms_path_join(index_path, sizeof index_path, dir, MS_ST_INDEX_NAME))
        rc = ms_err(err, MS_ETOOBIG, "%s: path too long", dir);
    else if (stat(index_path, &sb) == 0)
        rc = open_indexed(st, dir, index_path, err);
    else
        rc = open_listing(st, dir, err);
    if (rc) {
        ms_st_close(st);
        return rc;
    }
    MS_LOG(MS_DEBUG, "st", "%s: %zu tensors in %zu files", dir, st->n_tensors, st->n_files);
    *out = st;
    return 0;
}

int ms_st_open(ms_st_store **out, const char *path, ms_errbuf *err)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return ms_st_open_dir(out, path, err);
    return ms_st_open_file(out, path, err);
}

void ms_st_close(ms_st_store *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].map_bytes);
        free(st->files[i].path);
    }
    for (size_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    free(st->files);
    free(st->tensors);
    free(st->slots);
    free(st->desc);
    free(st);
}

const ms_tensor *ms_st_find(const ms_st_store *st, const char *name)
{
    if (!st || !name || !st->n_slots) return NULL;
    size_t s = (size_t)hash_name(name) & (st->n_slots - 1);
    while (st->slots[s]) {
        const ms_tensor *t = &st->tensors[st->slots[s] - 1];
        if (!strcmp(t->name, name)) return t;
        s = (s + 1) & (st->n_slots - 1);
    }
    return NULL;
}

size_t ms_st_count(const ms_st_store *st)
{
    return st ? st->n_tensors : 0;
}

const ms_tensor *ms_st_at(const ms_st_store *st, size_t i)
{
    return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

static void fmt_mask(char *buf, size_t cap, unsigned mask)
{
    size_t n = 0;
    buf[0] = 0;
    for (int t = 0; t < MS_DT_COUNT && n < cap; t++)
        if (mask & MS_DT_MASK(t))
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? "|" : "", ms_dtype_name(t));
}

int ms_st_expect(const ms_st_store *st, const char *name, int ndim, const int64_t *shape,
                 unsigned dtype_mask, const ms_tensor **out, ms_errbuf *err)
{
    if (out) *out = NULL;
    char want[160] = "any", have[160], dts[96] = "any";
    if (ndim >= 0 && ndim <= MS_ST_MAX_DIMS && shape) fmt_shape(want, sizeof want, shape, ndim);
    if (dtype_mask) fmt_mask(dts, sizeof dts, dtype_mask);
    const ms_tensor *t = ms_st_find(st, name);
    if (!t)
        return ms_err(err, MS_ENOENT, "%s: tensor '%s' is missing (expected shape %s, dtype %s)",
                      st ? st->desc : "<no checkpoint>", name, want, dts);
    fmt_shape(have, sizeof have, t->shape, t->ndim);
    if (ndim >= 0) {
        bool ok = ndim == t->ndim && shape;
        for (int i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || shape[i] == t->shape[i];
        if (!ok)
            return ms_err(err, MS_EFORMAT, "%s: tensor '%s': shape %s, expected %s", t->file, name,
                          have, want);
    }
    if (dtype_mask && !(dtype_mask & MS_DT_MASK(t->dtype)))
        return ms_err(err, MS_EFORMAT, "%s: tensor '%s': dtype %s, expected %s", t->file, name,
                      ms_dtype_name(t->dtype), dts);
    if (out) *out = t;
    return 0;
}
