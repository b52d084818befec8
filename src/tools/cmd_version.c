/* cmd_version.c — `moeserve version`: version string and CPU features. */
#include "tools/commands.h"

#include <stdio.h>

int ms_cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    __builtin_cpu_init();
    printf("moeserve 0.1.0\ncpu: avx2=%d avx512f=%d avx512bf16=%d\n",
           __builtin_cpu_supports("avx2") != 0, __builtin_cpu_supports("avx512f") != 0,
           __builtin_cpu_supports("avx512bf16") != 0);
    return 0;
}
