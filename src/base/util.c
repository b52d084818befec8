/* util.c — time, aligned allocation, file reading (see util.h). */
#include "base/util.h"

#include "base/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

double ms_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Buffers of 4 MiB and more (the forward's workspaces) start on a 2 MiB
 * boundary and ask for 2 MiB pages: the zeroing touches every page, and first
 * touches of 4 KiB pages are far slower, a cost a fresh server would pay
 * inside its first long prompt (measured: bench/RESULTS.md, "Why the code is so"). */
enum { HUGE_PAGE = 2 << 20 };

void *ms_alloc_aligned(size_t n_items, size_t item_bytes)
{
    size_t n;
    if (!ms_mul_size(n_items, item_bytes, &n)) return NULL;
    if (n == 0) n = 64;
    size_t align = n >= 2 * (size_t)HUGE_PAGE ? HUGE_PAGE : 64;
    if (n > SIZE_MAX - align) return NULL;
    n = (n + align - 1) & ~(align - 1);
    void *p = aligned_alloc(align, n);
    if (!p) return NULL;
    if (align == HUGE_PAGE) (void)madvise(p, n, MADV_HUGEPAGE); /* best effort */
    memset(p, 0, n);
    return p;
}

void ms_free_aligned(void *p)
{
    free(p);
}

int ms_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? MS_ENOENT : MS_EIO;
    int rc = 0;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        rc = MS_EIO;
        goto out;
    }
    long len = ftell(f);
    if (len < 0) {
        rc = MS_EIO;
        goto out;
    }
    if ((size_t)len > max_bytes) {
        rc = MS_ETOOBIG;
        goto out;
    }
    rewind(f);
    buf = malloc((size_t)len + 1);
    if (!buf) {
        rc = MS_ENOMEM;
        goto out;
    }
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
        rc = MS_EIO;
        goto out;
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = (size_t)len;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}

bool ms_path_join(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n > 0 && (size_t)n < cap;
}

int ms_parse_double(const char *flag, const char *v, double lo, double hi, double *out,
                    ms_errbuf *err)
{
    char *end = NULL;
    errno = 0;
    double d = v ? strtod(v, &end) : 0;
    if (!v || errno || !v[0] || *end || !(d >= lo && d <= hi))
        return ms_err(err, MS_EINVAL, "%s '%s': expected a number in %g..%g", flag, v ? v : "", lo,
                      hi);
    *out = d;
    return 0;
}

int ms_parse_long(const char *flag, const char *v, long lo, long hi, long *out, ms_errbuf *err)
{
    char *end = NULL;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || !v[0] || *end || n < lo || n > hi)
        return ms_err(err, MS_EINVAL, "%s '%s': expected an integer in %ld..%ld", flag, v ? v : "",
                      lo, hi);
    *out = n;
    return 0;
}

int ms_grow_scratch_f32(float **p, int64_t *cap, int64_t n)
{
    if (n <= *cap) return 0;
    n = MS_MAX(n, 2 * *cap);
    ms_free_aligned(*p);
    *p = ms_alloc_aligned((size_t)n, sizeof(float));
    *cap = *p ? n : 0;
    return *p ? 0 : MS_ENOMEM;
}

int ms_grow_array(void **p, int64_t *cap, int64_t n, size_t item_bytes)
{
    if (n <= *cap) return 0;
    int64_t c = MS_MAX(n, 2 * *cap);
    void *q = realloc(*p, item_bytes * (size_t)c);
    if (!q) return MS_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}
