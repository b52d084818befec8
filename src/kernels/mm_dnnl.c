/* mm_dnnl.c — oneDNN matmul for BF16 weights at large M (prefill). */
#include "kernels/mm_internal.h"

int ms_mm_dnnl_nt(const ms_kctx *k, const mm_task *t)
{
    (void)k;
    (void)t;
    return -1;
}
