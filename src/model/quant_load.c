/* quant_load.c — FP4 expert views and UE8M0 scale conversion for V4
 * checkpoints (contracts in quant_load.h). */
#include "model/quant_load.h"

#include <stdio.h>
#include <string.h>

int ms_st_is_fp4(const ms_st_store *st, const char *name)
{
    const ms_tensor *t = ms_st_find(st, name);
    return t && t->dtype == MS_DT_I8;
}

/* MS_EFORMAT for the first NaN (255) among the n UE8M0 bytes of s, else 0. */
static int check_e8m0(const ms_tensor *s, int64_t n, ms_errbuf *err)
{
    const uint8_t *b = s->data, *nan = memchr(b, 255, (size_t)n);
    if (!nan) return 0;
    int64_t i = nan - b,
            cols = s->ndim >= 2 && s->shape[s->ndim - 1] > 0 ? s->shape[s->ndim - 1] : n;
    return ms_err(err, MS_EFORMAT,
                  "%s: tensor '%s': UE8M0 scale 255 (NaN) at row %lld, column %lld", s->file,
                  s->name, (long long)(i / cols), (long long)(i % cols));
}

int ms_e8m0_scales_to_f32(const ms_tensor *s, float *out, int64_t n, ms_errbuf *err)
{
    int rc = check_e8m0(s, n, err);
    if (rc) return rc;
    const uint8_t *b = s->data;
    for (int64_t i = 0; i < n; i++) out[i] = ms_e8m0_to_f32(b[i]);
    return 0;
}

int ms_load_fp4_mat(const ms_st_store *st, const char *name, int64_t rows, int64_t cols,
                    ms_mat *out, ms_errbuf *err)
{
    size_t n = strlen(name);
    if (n < 7 || strcmp(name + n - 7, ".weight") != 0 || n - 7 + sizeof ".scale" > 300)
        return ms_err(err, MS_EINVAL, "FP4 tensor name '%s' does not end in .weight", name);
    if (rows <= 0 || cols <= 0 || cols % 32)
        return ms_err(err, MS_EFORMAT,
                      "tensor '%s': FP4 needs a column count that is a multiple of 32, not %lld",
                      name, (long long)cols);
    const int64_t wshape[2] = {rows, cols / 2}, sshape[2] = {rows, cols / 32};
    const ms_tensor *w, *s;
    int rc = ms_st_expect(st, name, 2, wshape, MS_DT_MASK(MS_DT_I8), &w, err);
    if (rc) return rc;
    char sname[300];
    snprintf(sname, sizeof sname, "%.*s.scale", (int)(n - 7), name);
    rc = ms_st_expect(st, sname, 2, sshape, MS_DT_MASK(MS_DT_F8E8M0), &s, err);
    if (rc) return rc;
    if ((rc = check_e8m0(s, rows * (cols / 32), err))) return rc;
    *out = ms_mat_fp4(rows, cols, w->data, s->data);
    return 0;
}
