/* error.c — ms_strerror, HTTP mapping and ms_err for the table in error.h. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *ms_strerror(int code)
{
    switch (code) {
    case 0:
        return "ok";
#define MS_ERR_TEXT(name, value, http, text)                                                       \
    case value:                                                                                    \
        return text;
        MS_ERRORS(MS_ERR_TEXT)
#undef MS_ERR_TEXT
    default:
        return "unknown error";
    }
}

int ms_error_http_status(int code)
{
    switch (code) {
    case 0:
        return 200;
#define MS_ERR_HTTP(name, value, http, text)                                                       \
    case value:                                                                                    \
        return http;
        MS_ERRORS(MS_ERR_HTTP)
#undef MS_ERR_HTTP
    default:
        return 500;
    }
}

int ms_err(ms_errbuf *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}
