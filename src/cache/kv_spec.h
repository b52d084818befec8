/* kv_spec.h — what a model's KV cache is made of (DESIGN.md §6): a list of
 * streams, each with a name, bytes per entry per layer, the layers it covers,
 * tokens per entry (1 = one entry per token; 4 or 128 = one per 4 or 128
 * tokens, V4's compressed histories), a window (0 = the whole history; N =
 * only the last N tokens are needed, plus slack for the draft tokens a verify
 * may write) and a dtype; plus fixed-size per-sequence state.
 *
 * A model family fills one (model/family.h kv_spec); the KV cache sizes its
 * pools from it and the planner its bytes per token.  Owns only the
 * description and its arithmetic (entries and bytes per request for a layer
 * range); no memory.  Pure data; any thread.
 */
#ifndef MS_CACHE_KV_SPEC_H
#define MS_CACHE_KV_SPEC_H

#include "base/error.h"
#include "kernels/dtype.h"

#include <stdbool.h>
#include <stdint.h>

#define MS_KV_MAX_STREAMS 8
#define MS_KV_MAX_LAYERS  4096 /* = MS_CONFIG_MAX_LAYERS */

typedef struct ms_kv_stream {
    char name[16];        /* "latent", "window", "c4", "c128", "index" */
    double entry_bytes;   /* bytes of one entry of one layer on this rank */
    int64_t entry_elems;  /* values per entry (entry_bytes / dtype size when stored plainly) */
    ms_dtype dtype;       /* storage dtype of the values (F32 / BF16; U8 for packed formats) */
    int tokens_per_entry; /* 1, 4, 128 */
    int64_t window;       /* 0: whole history; N: only the last N tokens */
    int64_t window_slack; /* extra tokens kept past the window (draft tokens of a verify) */
    int page_entries;     /* entries per page; 0: the cache's page size (V4's carry
                           * snapshots: 1 per page_size × 128 tokens) */
    int n_layers;         /* layers covered (popcount of layer_mask) */
    uint64_t layer_mask[MS_KV_MAX_LAYERS / 64];
    /* what one query (a decode token) reads of it per layer: every entry it holds
     * (read_cap 0; a window: its last window tokens), at most read_cap (V4's c4:
     * the indexer's top-k) or none (-1: snapshots, read only at a prefix hit); and
     * the FLOPs one entry read costs on this rank (0: not modelled) */
    int64_t read_cap;
    double read_flops;
} ms_kv_stream;

typedef struct ms_kv_spec {
    int n_layers; /* the model's layer count (the masks' extent) */
    int n_streams;
    ms_kv_stream streams[MS_KV_MAX_STREAMS];
    /* fixed-size per-sequence state (V4's compressor carry): bytes of each layer, 0 none */
    double state_layer_bytes[MS_KV_MAX_LAYERS];
    /* streams snapshot what a prefix hit needs at every share unit (V4's 'carry': the
     * compressor state; 'wsnap': the window before the unit), so the radix tree may
     * match sequences with state at any unit, and windowed streams' pages are never
     * shared: a hit takes fresh ones, which the forward fills from the snapshot */
    bool state_snapshots;
} ms_kv_spec;

/* V4's index keys (ms_kv_spec_opts.index_key). */
enum {
    MS_KV_INDEX_DEPLOYED = 0, /* the planner's default: MXFP4 with the model's packed
                               * entries (elem_bytes 0: the seeds' 3,517 B per token), FP8
                               * with --kv-cache-dtype fp8_e4m3 (elem_bytes 1: SGLang's V4
                               * keys without its FP4 indexer), else plain values */
    MS_KV_INDEX_PLAIN,        /* plain values: elem_bytes', or act_bytes' when elem_bytes is 1 */
    MS_KV_INDEX_MXFP4,        /* --enable-deepseek-v4-fp4-indexer: e2m1 + UE8M0 per 32 */
    MS_KV_INDEX_FP8,          /* e4m3 + an f32 scale per 128 (132 B per 128 values) */
};

/* What the cache's owner chooses: the dtype of plainly stored values
 * (elem_bytes: 0 = the model's own, BF16, 2 bytes), the state dtype's bytes,
 * the page size in tokens, the attention-TP width (GQA shards its KV heads)
 * and the most draft tokens a verify may write (window slack). */
typedef struct ms_kv_spec_opts {
    int elem_bytes;  /* 0: 2 (BF16); 4 (F32), 1 (FP8: V3's e4m3 rows, V4's
                      * packed 584-byte entries) */
    int act_bytes;   /* the activations' bytes (2 BF16, 4 F32; 0: 2): values that
                      * stay plain under an FP8 cache (V4's plain index keys) */
    int index_key;   /* MS_KV_INDEX_*: V4's index-key format */
    int state_bytes; /* bytes per state value; 0: 4 (F32) */
    int page_size;
    int attn_tp;
    int draft_tokens;
    int prefix_carry; /* V4: add the 'carry' and 'wsnap' streams that make prefix hits
                       * possible (the engine; the planner leaves them out, as
                       * SGLang has none) */
} ms_kv_spec_opts;

void ms_kv_spec_init(ms_kv_spec *s, int n_layers);
/* Appends a stream covering no layers yet; returns it, or NULL when full. */
ms_kv_stream *ms_kv_spec_add(ms_kv_spec *s, const char *name, double entry_bytes,
                             int64_t entry_elems, ms_dtype dt, int tokens_per_entry, int64_t window,
                             int64_t window_slack);
void ms_kv_stream_cover(ms_kv_stream *st, int layer);
static inline bool ms_kv_stream_covers(const ms_kv_stream *st, int layer)
{
    return layer >= 0 && layer < MS_KV_MAX_LAYERS &&
           (st->layer_mask[layer / 64] >> (layer % 64) & 1u);
}
/* Adds per-sequence state of `bytes` to one layer. */
void ms_kv_spec_add_state(ms_kv_spec *s, int layer, double bytes);

/* Entries one stream holds for a sequence of n_tokens tokens (per layer):
 * floor(n / tokens_per_entry), or at most window (+ slack) tokens' worth. */
int64_t ms_kv_stream_entries(const ms_kv_stream *st, int64_t n_tokens);
/* KV bytes of one n_tokens-long sequence over layers [first, end) (all streams). */
double ms_kv_spec_request_bytes(const ms_kv_spec *s, int first, int end, int64_t n_tokens);
/* Per-sequence state bytes over layers [first, end). */
double ms_kv_spec_state_bytes(const ms_kv_spec *s, int first, int end);

/* What a request costs the attention on one rank of its attention group, from
 * the streams' read_cap and read_flops: a decode token after n_tokens tokens
 * (the query at position n_tokens − 1) reads read_bytes[s] of stream s over
 * every layer (the window's last tokens, every compressed entry or the top-k
 * of them, every index key) and computes decode_flops; a prefill of n_tokens
 * computes prefill_flops, the sum of each position's (prefill_flops_of[s] per
 * stream).  The weights' reads and GEMMs are not in it. */
typedef struct ms_kv_cost {
    double read_bytes[MS_KV_MAX_STREAMS], read_bytes_total;
    double decode_flops;
    double prefill_flops_of[MS_KV_MAX_STREAMS], prefill_flops;
} ms_kv_cost;
void ms_kv_spec_cost(const ms_kv_spec *s, int64_t n_tokens, ms_kv_cost *out);

#endif
