/* log.c — the sink behind MS_LOG: stderr, one line per call. */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int ms_log_threshold = MS_INFO;
int ms_log_rank = -1;

void ms_log_init(int rank)
{
    ms_log_rank = rank;
    ms_log_threshold = rank > 0 ? MS_WARN : MS_INFO;
    const char *env = getenv("MOESERVE_LOG");
    if (!env) return;
    if (!strcmp(env, "debug"))
        ms_log_threshold = MS_DEBUG;
    else if (!strcmp(env, "info"))
        ms_log_threshold = MS_INFO;
    else if (!strcmp(env, "warn"))
        ms_log_threshold = MS_WARN;
    else if (!strcmp(env, "error"))
        ms_log_threshold = MS_ERROR;
    else if (!strcmp(env, "quiet"))
        ms_log_threshold = MS_QUIET;
}

void ms_log_write(int level, const char *subsys, const char *fmt, ...)
{
    static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR", "QUIET"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld [r%d] %-5s %s: ", tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, ms_log_rank < 0 ? 0 : ms_log_rank,
                     names[level < 0   ? 0
                           : level > 4 ? 4
                                       : level],
                     subsys);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
