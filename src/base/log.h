/* log.h — the one logging macro.
 *
 * MS_LOG(level, "subsys", fmt, ...) checks the level before evaluating its
 * arguments, checks the format at compile time, and prefixes every line with
 * time, rank and subsystem.  Only rank 0 logs INFO by default; WARN and ERROR
 * are logged on every rank.  MOESERVE_LOG=debug|info|warn|error sets the level.
 * Thread-safe (one fprintf per line).  Never log prompt text above DEBUG.
 */
#ifndef MS_BASE_LOG_H
#define MS_BASE_LOG_H

enum ms_log_level { MS_DEBUG = 0, MS_INFO = 1, MS_WARN = 2, MS_ERROR = 3, MS_QUIET = 4 };

extern int ms_log_threshold; /* lines below this level are dropped */
extern int ms_log_rank;      /* set once MPI is up; -1 before */

void ms_log_init(int rank); /* reads MOESERVE_LOG; INFO on rank 0, WARN elsewhere */
void ms_log_write(int level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define MS_LOG(level, subsys, ...)                                                                 \
    do {                                                                                           \
        if ((level) >= ms_log_threshold) ms_log_write((level), (subsys), __VA_ARGS__);             \
    } while (0)

#endif
