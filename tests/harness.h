/* harness.h — the tiny shared test harness.
 *
 * TEST(name) { ... CHECK(cond); CHECK_NEAR(a, b, tol); ... }
 * int main(void) { RUN(name); ...; return TEST_REPORT(); }
 * A failed CHECK prints file:line and the expression, marks the test failed and
 * returns from it.  TEST_REPORT prints "N passed, N failed" and returns the exit
 * code (non-zero on failure).  Single-threaded use only.
 */
#ifndef MS_TESTS_HARNESS_H
#define MS_TESTS_HARNESS_H

#include <math.h>
#include <stdio.h>

static int th_passed, th_failed, th_cur_failed;

#define TEST(name) static void name(void)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);             \
            th_cur_failed = 1;                                                                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            th_cur_failed = 1;                                                                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double th_a = (double)(a), th_b = (double)(b);                                             \
        if (!(fabs(th_a - th_b) <= (tol))) {                                                       \
            fprintf(stderr, "  %s:%d: %s = %.9g, %s = %.9g, tol %g\n", __FILE__, __LINE__, #a,     \
                    th_a, #b, th_b, (double)(tol));                                                \
            th_cur_failed = 1;                                                                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define RUN(name)                                                                                  \
    do {                                                                                           \
        th_cur_failed = 0;                                                                         \
        name();                                                                                    \
        if (th_cur_failed) {                                                                       \
            th_failed++;                                                                           \
            fprintf(stderr, "FAIL %s\n", #name);                                                   \
        } else {                                                                                   \
            th_passed++;                                                                           \
            fprintf(stderr, "ok   %s\n", #name);                                                   \
        }                                                                                          \
    } while (0)

#define TEST_REPORT() (printf("%d passed, %d failed\n", th_passed, th_failed), th_failed ? 1 : 0)

#endif
