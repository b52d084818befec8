/* kv_budget.c — the KV cache's memory budget for one rank (kv_budget.h). */
#include "cache/kv_budget.h"

#include <stdio.h>
#include <stdlib.h>

int64_t ms_kv_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return (int64_t)kb * 1024;
}

int ms_kv_ranks_on_host(int world_size)
{
    const char *s = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int n = s ? atoi(s) : world_size;
    return n > 0 ? n : 1;
}

int64_t ms_kv_spec_token_bytes(const ms_kv_spec *s)
{
    double b = 0;
    for (int i = 0; i < s->n_streams; i++) {
        const ms_kv_stream *st = &s->streams[i];
        if (st->window > 0) continue;
        b += st->entry_bytes * st->n_layers / st->tokens_per_entry;
    }
    return (int64_t)b;
}

double ms_kv_spec_window_token_bytes(const ms_kv_spec *s)
{
    double b = 0;
    for (int i = 0; i < s->n_streams; i++) {
        const ms_kv_stream *st = &s->streams[i];
        if (st->window > 0) b += st->entry_bytes * st->n_layers / st->tokens_per_entry;
    }
    return b;
}

int ms_kv_budget_tokens(const ms_kv_spec *s, const ms_kv_budget_in *in, int64_t *tokens,
                        ms_errbuf *err)
{
    *tokens = in->max_total_tokens;
    if (*tokens > 0) return 0;
    double per_tok =
        (double)ms_kv_spec_token_bytes(s) + in->swa_ratio * ms_kv_spec_window_token_bytes(s);
    if (per_tok <= 0) return ms_err(err, MS_EINVAL, "the model's KV cache has no streams");
    /* SGLang's static share: weights (+ their copies) and the KV pools */
    int64_t budget = (int64_t)(in->mem_fraction_static * (double)in->avail_bytes) -
                     in->weight_bytes - in->copy_bytes - in->fixed_bytes;
    *tokens = budget > 0 ? (int64_t)((double)budget / per_tok) : 0;
    if (*tokens < in->page_size)
        return ms_err(err, MS_ENOMEM,
                      "no memory left for the KV cache: %.2f GB available to this rank × "
                      "--mem-fraction-static %.2f minus %.2f GB of weights, %.2f GB of "
                      "their oneDNN copies and %.3f GB of fixed pools (windows, state); use "
                      "--max-total-tokens or raise --mem-fraction-static",
                      (double)in->avail_bytes / 1e9, in->mem_fraction_static,
                      (double)in->weight_bytes / 1e9, (double)in->copy_bytes / 1e9,
                      (double)in->fixed_bytes / 1e9);
    return 0;
}
