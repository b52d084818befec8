/* wire.h — one request as it travels: ms_req_params (ids, sampling, stops, limits,
 * routing hint) and its versioned byte encoding (DESIGN.md §7 "Requests on the wire
 * once").
 *
 * Rank 0 encodes each new request into the step's control block and every rank
 * decodes it; the same record is meant for transfer between servers (PD).  The
 * scheduler queues ms_req_params as they are.  Owns no I/O and no allocation
 * except the decoder's id scratch.  Pure functions over caller storage; any thread.
 *
 * Record: magic "MSRQ", u16 version, u16 header bytes, u64 record bytes, then the
 * fields in a fixed order (host byte order: the ranks of one world share a build),
 * then n_stop_ids int32 stop ids, n_bias (int32 id, f32 bias) pairs, n_ids int32 ids.  A record of
 * another version is refused, never guessed at.
 */
#ifndef MS_SERVE_WIRE_H
#define MS_SERVE_WIRE_H

#include "base/error.h"
#include "model/sampler.h"

#include <stddef.h>
#include <stdint.h>

#define MS_WIRE_VERSION         2
#define MS_REQ_MAX_STOP_IDS     16        /* stop token ids per request */
#define MS_REQ_MAX_TOP_LOGPROBS 20        /* alternatives per generated token */
#define MS_REQ_MAX_IDS          (1 << 22) /* prompt ids per record */
#define MS_REQ_MAX_LOGIT_BIAS   64        /* logit_bias entries per request */

typedef struct ms_req_params {
    uint64_t id;        /* the engine's request id */
    const int32_t *ids; /* [n_ids] prompt (borrowed) */
    int64_t n_ids;
    int64_t max_new; /* max_new_tokens */
    ms_sampler_params samp;
    uint64_t seed; /* the request's RNG seed */
    int ignore_eos;
    int32_t stop_ids[MS_REQ_MAX_STOP_IDS];
    int n_stop_ids;
    int top_logprobs; /* -1: no logprobs; 0: chosen token only; n: also the n best */
    int64_t min_new;  /* min_new_tokens: EOS and stop_ids masked while fewer are generated */
    int n_bias;       /* logit_bias: bias[i] added to bias_ids[i]'s logit before sampling */
    int32_t bias_ids[MS_REQ_MAX_LOGIT_BIAS];
    float bias[MS_REQ_MAX_LOGIT_BIAS];
    int dp_rank; /* routing: -1 the router's choice (X-Data-Parallel-Rank otherwise);
                  * in a control block, the DP rank chosen */
} ms_req_params;

/* Defaults: max_new 128, temperature 1, every other sampling rule off, no
 * logprobs (-1), no stops, seed 0, dp_rank -1 (the router's choice). */
void ms_req_params_init(ms_req_params *p);

/* Bytes ms_wire_req_encode writes for p. */
size_t ms_wire_req_size(const ms_req_params *p);
/* Writes p's record at buf (cap bytes).  Returns 0, or MS_EINVAL (a count out of
 * range, or cap too small) with the reason in err. */
int ms_wire_req_encode(const ms_req_params *p, void *buf, size_t cap, ms_errbuf *err);
/* Reads one record from buf (len bytes available): *out gets every field, its ids
 * copied into *ids (grown with realloc, *cap_ids ints; the caller frees it) and
 * out->ids pointing there; *used the record's bytes.  Returns 0, MS_EINVAL for a
 * record of another version or a malformed one (message says which), MS_ENOMEM. */
int ms_wire_req_decode(const void *buf, size_t len, ms_req_params *out, int32_t **ids,
                       int64_t *cap_ids, size_t *used, ms_errbuf *err);

#endif
