/* cmd_version.c — `moeserve version`: version string, CPU features and the
 * kernels' ISA (ms_kernels_detect: MOESERVE_ISA honoured). */
#include "tools/commands.h"

#include "kernels/kernels.h"

#include <stdio.h>

int ms_cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    __builtin_cpu_init();
    printf("moeserve 0.1.0\ncpu: avx2=%d avx512f=%d avx512bf16=%d\n",
           __builtin_cpu_supports("avx2") != 0, __builtin_cpu_supports("avx512f") != 0,
           __builtin_cpu_supports("avx512bf16") != 0);
    printf("kernels: %s\n", ms_isa_name(ms_kernels_detect()));
    return 0;
}
