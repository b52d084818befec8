/* flag_kinds.h — the honesty gate of `moeserve serve` and `moeserve generate`: every
 * SGLang launch flag a recipe may carry is one of three kinds (DESIGN.md §7 "Flags are
 * honest"): implemented (left to the commands' parsers), GPU-only tuning with no meaning
 * on a CPU (accepted, named in one start-up warning), or a feature not built (refused,
 * naming the flag).  Flags of another model family and the multi-node flags (mpirun does
 * that) are refused too; SGLANG_* environment variables we do not read are named in a
 * warning.  Owns the table of kinds and the screening of argv; not the parsing of
 * implemented flags (parallel/launch.c, serve/options.c, the commands).
 * Main thread, start-up only.
 */
#ifndef MS_SERVE_FLAG_KINDS_H
#define MS_SERVE_FLAG_KINDS_H

#include "parallel/layout.h"

#include <stdio.h>

#define MS_FLAG_SCREEN_MAX 128 /* flags of one kind remembered per command line */

typedef struct ms_flag_screen {
    const char *gpu_only[MS_FLAG_SCREEN_MAX]; /* borrowed from argv / the table */
    int n_gpu_only;
    const char *refused[MS_FLAG_SCREEN_MAX];     /* "--flag" or "--flag=value" as given */
    const char *refused_val[MS_FLAG_SCREEN_MAX]; /* its separate value argument, or NULL */
    const char *why[MS_FLAG_SCREEN_MAX];         /* the reason of each (static text) */
    int n_refused;
    int n_multinode, nnodes; /* --nnodes / --node-rank / --dist-init-addr */
    int overflow;            /* more flags of one kind than fit: refused */
} ms_flag_screen;

/* Walks argv[1..argc-1]: GPU-only, refused and multi-node flags (with their
 * values) are recorded in s and left out; every other argument is copied, in order, to
 * kept (capacity argc; kept[0] = argv[0]), for the command's own parser, which still
 * rejects unknown flags.  Returns the number of kept entries. */
int ms_flag_screen_argv(ms_flag_screen *s, int argc, char **argv, char **kept);
/* For `moeserve plan`, which models the features not built and has its own --nnodes:
 * the same with only the GPU-only flags screened out. */
int ms_flag_screen_gpu_argv(ms_flag_screen *s, int argc, char **argv, char **kept);

/* The same into a temporary copy of argv, then returns parse(ctx, kept argc, kept argv)
 * (-1 when out of memory): the commands' parsers see only the kept arguments. */
int ms_flag_screen_then(ms_flag_screen *s, int argc, char **argv,
                        int (*parse)(void *ctx, int argc, char **argv), void *ctx);
/* The same with ms_flag_screen_gpu_argv. */
int ms_flag_screen_gpu_then(ms_flag_screen *s, int argc, char **argv,
                            int (*parse)(void *ctx, int argc, char **argv), void *ctx);

/* After the command parsed the kept flags: refuses (returns MS_EINVAL after printing
 * one line per refused flag to out, each naming it, prefixed by cmd) when the screen
 * found refused, family or multi-node flags, or when --kv-cache-dtype asks for a
 * dtype the cache does not store (it stores the activations' dtype, fp32 with exact
 * = --dtype float32 and bf16 otherwise, or fp8_e4m3).  The family refusals name
 * the model_type of model_path's config.json. */
int ms_flag_screen_check(const ms_flag_screen *s, const ms_launch *l, int exact,
                         const char *model_path, const char *cmd, FILE *out);

/* The start-up warnings, on rank 0 after start-up: one line naming every GPU-only flag
 * given as without effect (_flags), one naming the SGLANG_* environment variables set
 * that this engine does not read (_env); ms_flag_screen_warn gives both. */
void ms_flag_screen_warn(const ms_flag_screen *s, const char *cmd);
void ms_flag_screen_warn_flags(const ms_flag_screen *s, const char *cmd);
void ms_flag_screen_warn_env(const char *cmd);

/* --help: the GPU-only and the refused flags, and how to span machines. */
void ms_flag_kinds_print_help(FILE *f);

#endif
