/* cmd_eplb.c — `moeserve eplb`: runs DeepSeek's load balancer (parallel/eplb.h) on
 * per-layer logical loads from a JSON file and prints phy2log, logcnt, log2phy (a
 * table, or --json).  Owns the command line only. */
#include "base/util.h"
#include "parallel/eplb.h"
#include "tools/commands.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: moeserve eplb --weights FILE.json --num-replicas R --num-groups G "
               "--num-nodes N --num-gpus K [--algorithm auto|deepseek|deepseek_hierarchical] "
               "[--json]\n\n"
               "DeepSeek's EPLB on per-layer logical expert loads.  FILE: a JSON array of layers\n"
               "of per-expert loads ([L][E], or [steps][L][E]), or a recorded distribution\n"
               "({\"logical_count\": ...}).  --num-gpus is the total number of EP ranks.\n"
               "auto (default) is hierarchical iff G divides by N, else the global policy.\n");
}

static void print_row(const int32_t *v, int n)
{
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", v[i]);
    putchar(']');
}

int ms_cmd_eplb(int argc, char **argv)
{
    const char *path = NULL, *algo = "auto";
    long R = -1, G = -1, N = -1, K = -1;
    int json = 0;
    ms_errbuf err = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "eplb: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long *dst = !strcmp(a, "--num-replicas") ? &R
                    : !strcmp(a, "--num-groups") ? &G
                    : !strcmp(a, "--num-nodes")  ? &N
                    : !strcmp(a, "--num-gpus")   ? &K
                                                 : NULL;
        if (dst) {
            if (ms_parse_long(a, v, 1, 1 << 20, dst, &err)) {
                fprintf(stderr, "eplb: %s\n", err.msg);
                return 2;
            }
        } else if (!strcmp(a, "--weights"))
            path = v;
        else if (!strcmp(a, "--algorithm"))
            algo = v;
        else {
            fprintf(stderr, "eplb: unknown flag %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    int policy = ms_eplb_policy_parse(algo);
    if (policy < 0) {
        fprintf(stderr,
                "eplb: --algorithm must be auto, deepseek or deepseek_hierarchical, got "
                "'%s'\n",
                algo);
        return 2;
    }
    if (!path || R < 0 || G < 0 || N < 0 || K < 0) {
        fprintf(stderr, "eplb: need --weights, --num-replicas, --num-groups, --num-nodes and "
                        "--num-gpus\n");
        usage(stderr);
        return 2;
    }
    float *w = NULL;
    int L = 0, E = 0;
    if (ms_eplb_load_counts(path, &w, &L, &E, &err)) {
        fprintf(stderr, "eplb: --weights %s\n", err.msg);
        return 2;
    }
    ms_eplb_plan p;
    int rc = ms_eplb_rebalance(w, L, E, (int)R, (int)G, (int)N, (int)K, policy, &p, &err);
    if (rc) {
        free(w);
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    if (json) {
        json_t *o = ms_eplb_plan_json(&p);
        char *s = o ? json_dumps(o, 0) : NULL;
        if (!s)
            rc = 1;
        else
            printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        int eff =
            policy == MS_EPLB_AUTO ? (G % N == 0 ? MS_EPLB_HIERARCHICAL : MS_EPLB_GLOBAL) : policy;
        printf("policy %s: %d layers, %d logical experts, %ld replicas, %ld GPUs (%ld slots "
               "each)\n",
               ms_eplb_policy_name(eff), L, E, R, K, R / K);
        double *load = malloc(sizeof(double) * (size_t)K);
        for (int l = 0; l < L && load; l++) {
            printf("layer %d\n  phy2log ", l);
            print_row(p.phy2log + (size_t)l * R, (int)R);
            printf("\n  logcnt  ");
            print_row(p.logcnt + (size_t)l * E, E);
            printf("\n  log2phy");
            for (int e = 0; e < E; e++) {
                printf(" e%d", e);
                print_row(p.log2phy + ((size_t)l * E + e) * p.maxcnt, p.maxcnt);
            }
            ms_eplb_gpu_load(&p, l, w + (size_t)l * E, (int)K, load);
            printf("\n  balancedness %.4f\n", ms_eplb_balancedness(load, (int)K));
        }
        free(load);
    }
    ms_eplb_plan_free(&p);
    free(w);
    return rc;
}
