/* error.h — the one error table of moeserve.
 *
 * Errors are values: functions return int, 0 on success, a negative MS_E* code
 * on failure.  The X-macro below is the single list of codes; it also gives
 * ms_strerror() and ms_error_http_status().  Human detail ("prompt has 40123
 * tokens, context is 32768") goes into an ms_errbuf filled where the reason is
 * known.  Thread-safe: pure functions over constant tables.
 */
#ifndef MS_BASE_ERROR_H
#define MS_BASE_ERROR_H

#include <stddef.h>

/*        name            value  http  text */
#define MS_ERRORS(X)                                                                               \
    X(MS_EINVAL, -1, 400, "invalid argument")                                                      \
    X(MS_ENOMEM, -2, 503, "out of memory")                                                         \
    X(MS_EIO, -3, 500, "input/output error")                                                       \
    X(MS_ENOENT, -4, 404, "not found")                                                             \
    X(MS_EFORMAT, -5, 400, "malformed data")                                                       \
    X(MS_ERANGE, -6, 400, "value out of range")                                                    \
    X(MS_ETOOBIG, -7, 413, "too large")                                                            \
    X(MS_EUNSUPPORTED, -8, 400, "not supported")                                                   \
    X(MS_EBUSY, -9, 503, "busy")                                                                   \
    X(MS_EFULL, -10, 503, "queue full")                                                            \
    X(MS_EAUTH, -11, 401, "unauthorized")                                                          \
    X(MS_ECANCELED, -12, 499, "canceled")                                                          \
    X(MS_ETIMEOUT, -13, 504, "timed out")                                                          \
    X(MS_ECOMM, -14, 500, "communication failure")                                                 \
    X(MS_ELAYOUT, -15, 400, "invalid parallel layout")                                             \
    X(MS_ECONTEXT, -16, 400, "context length exceeded")                                            \
    X(MS_EINTERNAL, -17, 500, "internal error")

enum ms_error {
#define MS_ERR_ENUM(name, value, http, text) name = value,
    MS_ERRORS(MS_ERR_ENUM)
#undef MS_ERR_ENUM
};

/* Returns a static string for a code (0 gives "ok"); never NULL. */
const char *ms_strerror(int code);
/* The HTTP status a code maps to (200 for 0, 500 for unknown codes). */
int ms_error_http_status(int code);

/* A small buffer for the human-readable reason of the last error. */
typedef struct ms_errbuf {
    char msg[512];
} ms_errbuf;

/* Formats the reason into e (if e is non-NULL) and returns code, so callers can
 * write `return ms_err(e, MS_EINVAL, "bad shape %d", n);`. */
int ms_err(ms_errbuf *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
