/* main.c — the moeserve command line: dispatches to one subcommand.
 * Each subcommand lives in its own file under src/tools/ or src/serve/ and is
 * declared in tools/commands.h. */
#include "tools/commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
#define MS_CMD_ENTRY(name, fn, help) {name, fn, help},
    MS_COMMANDS(MS_CMD_ENTRY)
#undef MS_CMD_ENTRY
};

static void usage(FILE *f)
{
    fprintf(f, "usage: moeserve <command> [flags]   (moeserve <command> --help for its flags)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
    /* oneDNN's OpenMP threads must sleep, not spin, between calls (they share the
     * cores with the kernel pool); libgomp reads this only at load time, so set it
     * and re-execute once when the user has not chosen. */
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
        execv("/proc/self/exe", argv); /* on failure, go on with the default */
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "moeserve: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
