/* kv_spec.c — building a model's list of cache streams and its per-request
 * arithmetic (kv_spec.h).  Pure functions; any thread.
 */
#include "cache/kv_spec.h"

#include <stdio.h>
#include <string.h>

void ms_kv_spec_init(ms_kv_spec *s, int n_layers)
{
    memset(s, 0, sizeof *s);
    s->n_layers = n_layers < MS_KV_MAX_LAYERS ? n_layers : MS_KV_MAX_LAYERS;
}

ms_kv_stream *ms_kv_spec_add(ms_kv_spec *s, const char *name, double entry_bytes,
                             int64_t entry_elems, ms_dtype dt, int tokens_per_entry, int64_t window,
                             int64_t window_slack)
{
    if (s->n_streams >= MS_KV_MAX_STREAMS) return NULL;
    ms_kv_stream *st = &s->streams[s->n_streams++];
    memset(st, 0, sizeof *st);
    snprintf(st->name, sizeof st->name, "%s", name);
    st->entry_bytes = entry_bytes;
    st->entry_elems = entry_elems;
    st->dtype = dt;
    st->tokens_per_entry = tokens_per_entry > 0 ? tokens_per_entry : 1;
    st->window = window;
    st->window_slack = window > 0 ? window_slack : 0;
    return st;
}

void ms_kv_stream_cover(ms_kv_stream *st, int layer)
{
    if (layer < 0 || layer >= MS_KV_MAX_LAYERS || ms_kv_stream_covers(st, layer)) return;
    st->layer_mask[layer / 64] |= (uint64_t)1 << (layer % 64);
    st->n_layers++;
}

void ms_kv_spec_add_state(ms_kv_spec *s, int layer, double bytes)
{
    if (layer >= 0 && layer < MS_KV_MAX_LAYERS) s->state_layer_bytes[layer] += bytes;
}

int64_t ms_kv_stream_entries(const ms_kv_stream *st, int64_t n)
{
    if (n <= 0) return 0;
    if (st->window > 0) {
        int64_t w = st->window + st->window_slack;
        if (n > w) n = w;
    }
    return n / st->tokens_per_entry;
}

double ms_kv_spec_request_bytes(const ms_kv_spec *s, int first, int end, int64_t n)
{
    double sum = 0;
    for (int l = first; l < end && l < MS_KV_MAX_LAYERS; l++)
        for (int i = 0; i < s->n_streams; i++) {
            const ms_kv_stream *st = &s->streams[i];
            if (ms_kv_stream_covers(st, l))
                sum += (double)ms_kv_stream_entries(st, n) * st->entry_bytes;
        }
    return sum;
}

double ms_kv_spec_state_bytes(const ms_kv_spec *s, int first, int end)
{
    double sum = 0;
    for (int l = first < 0 ? 0 : first; l < end && l < MS_KV_MAX_LAYERS; l++)
        sum += s->state_layer_bytes[l];
    return sum;
}

/* Σ_{k=1..n} floor(k / t). */
static double sum_floor(int64_t n, int64_t t)
{
    if (n <= 0) return 0;
    double q = (double)(n / t), r = (double)(n % t);
    return (double)t * q * (q - 1) / 2 + q * (r + 1);
}

/* Entries a query at position k − 1 reads of st: min(cap, floor(k / tpe)), the
 * window's last min(k, window) tokens; and their sum over k = 1..n. */
static int64_t read_entries(const ms_kv_stream *st, int64_t k)
{
    int64_t e = k / st->tokens_per_entry, cap = st->window > 0 ? st->window : st->read_cap;
    return cap > 0 && e > cap ? cap : e;
}

static double read_entries_sum(const ms_kv_stream *st, int64_t n)
{
    int64_t t = st->tokens_per_entry, cap = st->window > 0 ? st->window : st->read_cap;
    if (cap <= 0) return sum_floor(n, t);
    int64_t k0 = cap * t - 1; /* floor(k / t) < cap for k <= k0 */
    if (n <= k0) return sum_floor(n, t);
    return sum_floor(k0, t) + (double)cap * (double)(n - k0);
}

void ms_kv_spec_cost(const ms_kv_spec *s, int64_t n, ms_kv_cost *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < s->n_streams; i++) {
        const ms_kv_stream *st = &s->streams[i];
        if (st->read_cap < 0 || st->n_layers == 0 || n <= 0) continue;
        double e = (double)read_entries(st, n) * st->n_layers;
        out->read_bytes[i] = e * st->entry_bytes;
        out->read_bytes_total += out->read_bytes[i];
        out->decode_flops += e * st->read_flops;
        out->prefill_flops_of[i] = read_entries_sum(st, n) * st->n_layers * st->read_flops;
        out->prefill_flops += out->prefill_flops_of[i];
    }
}
