/* util.h — small helpers every floor uses: monotonic time, checked size
 * arithmetic, aligned allocation, and file reading.  All thread-safe. */
#ifndef MS_BASE_UTIL_H
#define MS_BASE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MS_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define MS_MAX(a, b)    ((a) > (b) ? (a) : (b))

/* Seconds from a monotonic clock. */
double ms_now_s(void);

/* Checked arithmetic: return false on overflow (result untouched then). */
static inline bool ms_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ms_add_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* 64-byte aligned (2 MiB from 4 MiB up, in 2 MiB pages where the kernel gives them), zeroed
 * allocation (NULL on failure or overflow); free with ms_free_aligned. */
void *ms_alloc_aligned(size_t n_items, size_t item_bytes);
void ms_free_aligned(void *p);
/* Makes the heap array *p (items of item_bytes, capacity *cap items) hold at
 * least n items: reallocates to max(n, 2 * *cap), never shrinks.  Returns 0,
 * or MS_ENOMEM with *p and *cap unchanged. */
int ms_grow_array(void **p, int64_t *cap, int64_t n, size_t item_bytes);
/* The same for an ms_alloc_aligned float buffer of scratch: its contents are not
 * kept.  Returns 0, or MS_ENOMEM with *p NULL and *cap 0. */
int ms_grow_scratch_f32(float **p, int64_t *cap, int64_t n);

/* Reads a whole file into a NUL-terminated heap buffer (owned by the caller).
 * Returns 0 or MS_ENOENT/MS_EIO/MS_ETOOBIG (max_bytes limit). */
int ms_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len);

/* Joins dir and name into buf; returns false if it does not fit. */
bool ms_path_join(char *buf, size_t cap, const char *dir, const char *name);

/* Command-line values: a whole string that is a number in [lo, hi], else
 * MS_EINVAL with "FLAG 'VALUE': expected ..." in err. */
struct ms_errbuf;
int ms_parse_double(const char *flag, const char *v, double lo, double hi, double *out,
                    struct ms_errbuf *err);
int ms_parse_long(const char *flag, const char *v, long lo, long hi, long *out,
                  struct ms_errbuf *err);

/* splitmix64: deterministic seeded random numbers (tests, mkmodel, sampler). */
static inline uint64_t ms_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double ms_rng_uniform(uint64_t *state)
{
    return (double)(ms_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
