/* kv_cache.h — a model's KV cache on one attention rank (DESIGN.md §6): one
 * paged pool per stream of its kv_spec (cache/kv_spec.h), per-request page
 * tables (ms_kv_seq), fixed-size per-sequence state slots, and the view the
 * forward reads and writes through (ms_kv_view).
 *
 * A page of stream s holds page_size entries of every layer s covers, so it
 * spans page_size × tokens_per_entry tokens (4× and 128× for V4's compressed
 * histories).  A windowed stream keeps only the pages that hold one of the
 * last window + slack tokens of a sequence: ms_kv_cache_slide frees those
 * behind it.  Pages are refcounted, so prefix sharing (the radix tree) holds
 * references on the pages of every stream.  The scheduler asks only how many
 * pages a step needs, reserves (all streams or nothing) and releases.
 * Single owner: the rank's scheduler (main thread); the forward reads
 * through a view of it during the step.
 */
#ifndef MS_CACHE_KV_CACHE_H
#define MS_CACHE_KV_CACHE_H

#include "base/error.h"
#include "cache/kv_pool.h"
#include "cache/kv_spec.h"

#include <stdint.h>

typedef struct ms_kv_cache ms_kv_cache;

/* One request's hold on the cache: a page table per stream (entry page i
 * covers entries [i·page_size, (i+1)·page_size); -1 once a window slid past
 * it), the tokens its pages cover, its state slot.  Caller storage, zeroed
 * by ms_kv_seq_init; freed by ms_kv_cache_release + ms_kv_seq_deinit. */
typedef struct ms_kv_seq {
    int32_t *pages[MS_KV_MAX_STREAMS];
    int64_t n_pages[MS_KV_MAX_STREAMS], cap_pages[MS_KV_MAX_STREAMS];
    int64_t first_live[MS_KV_MAX_STREAMS]; /* pages before it were freed by a slide */
    int64_t n_tokens;                      /* tokens [0, n_tokens) have entries reserved */
    int32_t state_slot;                    /* -1: none held */
} ms_kv_seq;

void ms_kv_seq_init(ms_kv_seq *s);
void ms_kv_seq_deinit(ms_kv_seq *s); /* frees the tables (release first) */

/* Pages of each stream for a cache of `tokens` tokens of full history and
 * `max_seqs` sequences that add at most step_tokens tokens per step (the
 * prefill chunk): whole-history streams tokens / tokens_per_entry /
 * page_size (rounded up for compressed streams, whose pages span 4 or 128
 * pages' worth of tokens).  Windowed ones: window_tokens > 0 (SGLang's
 * --swa-full-tokens-ratio × tokens) gives them that many tokens, but never
 * fewer than one sequence's window plus one step; window_tokens 0 sizes them
 * for max_seqs × 2 × (the pages of window + slack, and one partial page at each
 * end) plus the pages of one step's tokens, which the sequences share. */
void ms_kv_cache_pages_for(const ms_kv_spec *spec, int page_size, int64_t tokens, int max_seqs,
                           int64_t step_tokens, int64_t window_tokens, int32_t *pages);
/* Bytes of pages[s] pages of every stream (one page holds page_size entries of
 * each covered layer). */
double ms_kv_cache_pages_bytes(const ms_kv_spec *spec, int page_size, const int32_t *pages,
                               int window_only);

/* One pool as the start-up log and /server_info report it. */
typedef struct ms_kv_pool_info {
    char name[16];
    int32_t pages;
    int64_t page_tokens; /* tokens one page spans (page_size × tokens_per_entry) */
    int64_t tokens;      /* tokens of history its pages span (pages × page_tokens) */
    int64_t window;      /* 0: whole history; N: each sequence keeps its last N (+ slack) */
    int n_layers;
    double entry_bytes; /* one entry of one layer */
    double bytes;       /* the pool */
} ms_kv_pool_info;

/* Fills out[0..n_streams) for the streams that cover a layer; returns how many. */
int ms_kv_cache_pool_info(const ms_kv_cache *c, ms_kv_pool_info *out);
/* How many n_tokens-long sequences the pools hold at once (vLLM's "maximum
 * concurrency"): the smallest over the pools of its pages ÷ the pages one
 * such sequence holds (a windowed pool: its window, one partial page each
 * end), capped by the state slots.  Fractional. */
double ms_kv_cache_concurrency(const ms_kv_cache *c, int64_t n_tokens);

/* Builds the pools: pages[s] pages of stream s, values in dt (streams whose
 * values are a packed format, MS_DT_U8, keep their bytes; with dt F8E4M3,
 * --kv-cache-dtype fp8_e4m3, every stream keeps its spec's dtype); n_state_slots
 * sequence-state slots of the spec's state bytes (0: none). */
int ms_kv_cache_new(ms_kv_cache **out, const ms_kv_spec *spec, int page_size, const int32_t *pages,
                    ms_dtype dt, int n_state_slots, ms_errbuf *err);
void ms_kv_cache_free(ms_kv_cache *c);

const ms_kv_spec *ms_kv_cache_spec(const ms_kv_cache *c);
int ms_kv_cache_n_streams(const ms_kv_cache *c);
int ms_kv_cache_page_size(const ms_kv_cache *c);
/* The pool of one stream (its layers are the stream's covered layers in order). */
ms_kv_pool *ms_kv_cache_pool(const ms_kv_cache *c, int stream);
int32_t ms_kv_cache_n_free(const ms_kv_cache *c, int stream);
int32_t ms_kv_cache_n_pages(const ms_kv_cache *c, int stream);
/* Tokens whose whole history fits (the tightest whole-history stream), and
 * of those the free ones. */
int64_t ms_kv_cache_tokens(const ms_kv_cache *c);
int64_t ms_kv_cache_free_tokens(const ms_kv_cache *c);
/* Grows seq's tables for tokens [0, upto) without taking pages, so later
 * reserves up to there do not allocate. */
int ms_kv_cache_seq_capacity(const ms_kv_cache *c, ms_kv_seq *seq, int64_t upto);

/* Pages each stream must add for seq to hold tokens [0, upto) (need[s]);
 * returns their sum.  A windowed stream needs pages only for the entries
 * inside its window. */
int64_t ms_kv_cache_pages_needed(const ms_kv_cache *c, const ms_kv_seq *seq, int64_t upto,
                                 int64_t *need);
/* True when every stream has the pages ms_kv_cache_pages_needed lists free. */
int ms_kv_cache_fits(const ms_kv_cache *c, const int64_t *need);
/* Reserves pages so seq holds [0, upto) in every stream, and a state slot
 * when the spec has state: all or nothing, MS_EFULL (nothing taken) when a
 * stream is short, MS_ENOMEM when a table cannot grow. */
int ms_kv_cache_reserve(ms_kv_cache *c, ms_kv_seq *seq, int64_t upto);
/* The same for a prompt computed in chunks: the whole-history streams up to
 * upto, the windowed ones only up to win_upto (the first chunk's end), since
 * their pages behind the window are freed between chunks (ms_kv_cache_slide)
 * and later chunks reserve theirs as they come (ms_kv_cache_reserve). */
int ms_kv_cache_reserve_prompt(ms_kv_cache *c, ms_kv_seq *seq, int64_t upto, int64_t win_upto);
/* Drops every page reference and the state slot of seq (it holds nothing after). */
void ms_kv_cache_release(ms_kv_cache *c, ms_kv_seq *seq);
/* After the sequence computed tokens [0, n_done): frees the pages of
 * windowed streams that no longer hold any of the last window + slack
 * tokens, except, without snapshot streams (spec state_snapshots), those
 * holding the window + slack before the last multiple of
 * ms_kv_cache_share_unit (a prefix hit there needs them; they go when the
 * next multiple is reached).  Returns the pages released (references
 * dropped). */
int64_t ms_kv_cache_slide(ms_kv_cache *c, ms_kv_seq *seq, int64_t n_done);
/* Rollback (rejected speculative positions): seq keeps only the pages that
 * cover tokens [0, upto) and drops its references on the rest.  Returns the
 * pages released. */
int64_t ms_kv_cache_truncate(ms_kv_cache *c, ms_kv_seq *seq, int64_t upto);
/* dst (holding nothing) takes a reference on src's pages that cover tokens
 * [0, n_tokens) of every stream (n_tokens in whole pages of every stream),
 * as a prefix hit does; with snapshot streams (spec state_snapshots) not on
 * the windowed streams' pages: dst's window starts at the first page its
 * window + slack needs before n_tokens, to be reserved as its own and filled
 * by the forward from the window snapshot.  Returns 0, MS_EINVAL when a
 * stream of src no longer holds that prefix (a window slid past it),
 * MS_ENOMEM. */
int ms_kv_cache_share(ms_kv_cache *c, ms_kv_seq *dst, const ms_kv_seq *src, int64_t n_tokens);
/* Tokens of a prefix that can be shared in whole pages of every stream. */
int64_t ms_kv_cache_share_unit(const ms_kv_cache *c);

/* What the forward reads and writes: one sequence's entries, by stream,
 * layer and token position.  Borrowed for one step. */
typedef struct ms_kv_view {
    const ms_kv_cache *cache;
    const ms_kv_seq *seq;
} ms_kv_view;

/* Start of the entry holding token `pos` of `layer` in `stream` (NULL when
 * the stream does not cover the layer or the page was freed). */
void *ms_kv_view_entry(const ms_kv_view *v, int stream, int layer, int64_t pos);
/* Values per entry and their dtype in one stream; entries per page (the
 * entries of one page of one layer are contiguous, entry_elems apart). */
int64_t ms_kv_view_entry_elems(const ms_kv_view *v, int stream);
ms_dtype ms_kv_view_dtype(const ms_kv_view *v, int stream);
int ms_kv_view_page_size(const ms_kv_view *v);
/* The sequence's state slot bytes (NULL without state), and one slot's size. */
void *ms_kv_view_state(const ms_kv_view *v);
size_t ms_kv_view_state_bytes(const ms_kv_view *v);

#endif
