/* metrics.h — the front end's Prometheus metrics with SGLang's names
 * (sglang:*): request counters and latency histograms observed by the HTTP
 * threads, plus per-DP-rank gauges read from the hub's load snapshot at scrape
 * time.  Text exposition format 0.0.4, written directly.  Thread-safe.
 */
#ifndef MS_SERVE_METRICS_H
#define MS_SERVE_METRICS_H

#include "serve/request.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ms_metrics ms_metrics;

ms_metrics *ms_metrics_new(const char *model_name);
void ms_metrics_free(ms_metrics *m);

/* One finished request: token counts, time to first token (< 0: none),
 * end-to-end latency, finish kind (enum ms_serve_finish).  As SGLang: an
 * aborted one (client gone, /abort_request, shutdown) counts in
 * num_aborted_requests_total and its time to first token, not in
 * num_requests_total, the token totals or the e2e / per-token histograms. */
void ms_metrics_observe_request(ms_metrics *m, int64_t prompt_tokens, int64_t gen_tokens,
                                int64_t cached_tokens, double ttft_s, double e2e_s, int finish);
/* One HTTP response; endpoint is a static string (the route's path). */
void ms_metrics_observe_response(ms_metrics *m, const char *endpoint, int status);
/* count tokens that arrived together gap_s after the previous ones. */
void ms_metrics_observe_itl(ms_metrics *m, double gap_s, int64_t count);
/* Writes the exposition text (malloc'ed) using hub's load and info (hub may be NULL). */
int ms_metrics_render(ms_metrics *m, ms_serve_hub *hub, char **out, size_t *len);

#endif
