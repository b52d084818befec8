/* cmd_mkmodel.c — `moeserve mkmodel`: flag parsing for mkmodel.h. */
#include "base/error.h"
#include "base/util.h"
#include "tools/commands.h"
#include "tools/mkmodel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(
        f, "usage: moeserve mkmodel (--preset tiny-v3|tiny-v2|small-v3|tiny-v4|small-v4 | --config "
           "FILE) --out DIR [--seed N] [--dtype bf16|fp32|fp8|fp8-fp4] [--shard-mb N] "
           "[--route-skew S]\n"
           "  --route-skew S   router bias so expert e gets a share of tokens ~ (e+1)^-S (V3)\n");
}

int ms_cmd_mkmodel(int argc, char **argv)
{
    const char *preset = NULL, *config = NULL, *out = NULL, *dtype = "bf16";
    uint64_t seed = 0;
    long long shard_mb = 0;
    double skew = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "mkmodel: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        if (!strcmp(a, "--preset"))
            preset = v;
        else if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--dtype"))
            dtype = v;
        else if (!strcmp(a, "--seed")) {
            seed = strtoull(v, &end, 10);
            if (!*v || *end) {
                fprintf(stderr, "mkmodel: --seed must be a non-negative integer, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--route-skew")) {
            skew = strtod(v, &end);
            if (!*v || *end || !(skew >= 0 && skew <= 8)) {
                fprintf(stderr, "mkmodel: --route-skew must be a number in [0, 8], got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--shard-mb")) {
            shard_mb = strtoll(v, &end, 10);
            if (!*v || *end || shard_mb < 0) {
                fprintf(stderr, "mkmodel: --shard-mb must be a non-negative integer\n");
                return 2;
            }
        } else {
            fprintf(stderr, "mkmodel: unknown flag %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!out || (!preset == !config)) {
        fprintf(stderr, "mkmodel: need --out and exactly one of --preset / --config\n");
        usage(stderr);
        return 2;
    }
    int dt = !strcmp(dtype, "bf16")      ? MS_MK_BF16
             : !strcmp(dtype, "fp32")    ? MS_MK_FP32
             : !strcmp(dtype, "fp8")     ? MS_MK_FP8
             : !strcmp(dtype, "fp8-fp4") ? MS_MK_FP8_FP4
                                         : -1;
    if (dt < 0) {
        fprintf(stderr, "mkmodel: --dtype must be bf16, fp32, fp8 or fp8-fp4, got '%s'\n", dtype);
        return 2;
    }
    ms_config cfg;
    ms_errbuf err = {{0}};
    double t0 = ms_now_s();
    if (preset && ms_mkmodel_v4_is_preset(preset) && skew > 0) {
        fprintf(stderr, "mkmodel: --route-skew is for V3 presets (its router bias); V4 presets "
                        "route by their own gate\n");
        return 2;
    }
    if (preset && ms_mkmodel_v4_is_preset(preset)) {
        int rc = ms_mkmodel_v4_write(preset, dt, seed, out, shard_mb * 1024 * 1024, &err);
        if (rc) {
            fprintf(stderr, "mkmodel: %s\n", err.msg[0] ? err.msg : ms_strerror(rc));
            return rc == MS_EUNSUPPORTED ? 2 : 1;
        }
        fprintf(stderr, "mkmodel: wrote %s (%s, seed %llu) in %.1f s\n", out, dtype,
                (unsigned long long)seed, ms_now_s() - t0);
        return 0;
    }
    if (dt == MS_MK_FP8_FP4) {
        fprintf(stderr, "mkmodel: --dtype fp8-fp4 is for the V4 presets (tiny-v4, small-v4)\n");
        return 2;
    }
    if (preset && ms_mkmodel_preset(preset, &cfg)) {
        fprintf(stderr,
                "mkmodel: --preset: unknown preset '%s' (tiny-v3, tiny-v2, small-v3, tiny-v4, "
                "small-v4)\n",
                preset);
        return 2;
    }
    if (config && ms_config_load(&cfg, config, &err)) {
        fprintf(stderr, "mkmodel: --config %s: %s\n", config, err.msg);
        return 2;
    }
    int rc = ms_mkmodel_write_skewed(&cfg, dt, seed, skew, out, shard_mb * 1024 * 1024, &err);
    if (rc) {
        fprintf(stderr, "mkmodel: %s\n", err.msg[0] ? err.msg : ms_strerror(rc));
        return 1;
    }
    fprintf(stderr, "mkmodel: wrote %s (%s, seed %llu) in %.1f s\n", out, dtype,
            (unsigned long long)seed, ms_now_s() - t0);
    return 0;
}
