/* kv_budget.h — how many tokens of KV cache a rank can hold (DESIGN.md §6):
 * --max-total-tokens, or --mem-fraction-static of the memory available to
 * the rank (MemAvailable before the weights were loaded, divided by the
 * ranks on its host) minus its weights and their prepacked copies, divided
 * by the bytes a token costs in every stream of the model's kv_spec.
 * Owns only this arithmetic and the two readings it needs from the system;
 * no memory.  Any thread.
 */
#ifndef MS_CACHE_KV_BUDGET_H
#define MS_CACHE_KV_BUDGET_H

#include "base/error.h"
#include "cache/kv_spec.h"

#include <stdint.h>

/* MemAvailable of this host in bytes (0 when unknown). */
int64_t ms_kv_mem_available(void);
/* MPI ranks on this host (OMPI_COMM_WORLD_LOCAL_SIZE), else world_size. */
int ms_kv_ranks_on_host(int world_size);

/* Bytes one token costs across every stream that grows with the history
 * (all layers; a windowed stream's tokens are bounded and counted apart). */
int64_t ms_kv_spec_token_bytes(const ms_kv_spec *s);
/* Bytes one token costs in the windowed streams (all layers they cover). */
double ms_kv_spec_window_token_bytes(const ms_kv_spec *s);

typedef struct ms_kv_budget_in {
    int64_t max_total_tokens; /* > 0: this many, no memory arithmetic */
    double mem_fraction_static;
    int64_t avail_bytes; /* MemAvailable / ranks on the host, before the load */
    int64_t weight_bytes, copy_bytes;
    int64_t fixed_bytes; /* pools that do not scale with the tokens: the per-sequence
                          * state slots, and the window pools when swa_ratio is 0 */
    double swa_ratio;    /* --swa-full-tokens-ratio (0: unset): the window pools hold
                          * swa_ratio × the tokens of the whole-history pools */
    int page_size;
} ms_kv_budget_in;

/* Tokens of whole history for this rank (not yet rounded to pages), SGLang's
 * DeepSeek-V4 rule: the whole-history pools (V4's c4, c128 and index keys:
 * the compressed histories span the whole context) hold N tokens and the
 * window pool swa_ratio × N, so N = (budget − fixed_bytes) ÷ (whole-history
 * bytes per token + swa_ratio × window bytes per token).  MS_ENOMEM with a
 * message naming the flags when not even one page fits. */
int ms_kv_budget_tokens(const ms_kv_spec *s, const ms_kv_budget_in *in, int64_t *tokens,
                        ms_errbuf *err);

#endif
