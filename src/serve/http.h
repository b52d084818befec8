/* http.h — the HTTP front end of rank 0 (libmicrohttpd, one thread per
 * connection): routes, auth, limits, SSE, health, server info, metrics, and
 * the front-end command-line flags.  It talks to the main loop only through
 * the hub (request.h).  ms_frontend_open/close/begin_drain are called by the
 * main thread; everything else runs on MHD's threads.
 *
 * Shutdown (SIGTERM): the main loop sees ms_serve_hub_stop_requested(), calls
 * ms_frontend_begin_drain() (new generations 503, /health 503, each answer
 * with Connection: close), keeps stepping until ms_frontend_live_requests()
 * == 0 (or --shutdown-timeout, or a second signal), then ms_frontend_close().
 */
#ifndef MS_SERVE_HTTP_H
#define MS_SERVE_HTTP_H

#include "serve/detok.h"
#include "serve/request.h"

#include <stdio.h>

#define MS_HTTP_MAX_API_KEY 256

typedef struct ms_frontend_opts {
    char host[256];                    /* --host (default 127.0.0.1: loopback) */
    int port;                          /* --port (default 30000; 0 = any free port) */
    char api_key[MS_HTTP_MAX_API_KEY]; /* --api-key: "Authorization: Bearer KEY" required */
    char served_model_name[256];       /* --served-model-name (default: model path) */
    int32_t max_queued_requests;       /* --max-queued-requests (0 = unlimited) → 503 */
    int reasoning_parser;              /* --reasoning-parser deepseek-r1|deepseek-v3 */
    int tool_call_parser;              /* --tool-call-parser deepseekv31 */
    int enable_metrics;                /* --enable-metrics: GET /metrics */
    double watchdog_timeout_s;      /* --watchdog-timeout: no step while busy → exit (0 = off) */
    size_t max_body_bytes;          /* --max-body-bytes (default 32 MiB) → 413 */
    int max_connections;            /* --max-connections (default 256) */
    int max_connections_per_client; /* --max-connections-per-client: per address, more are
                                       closed at accept (0 = no cap but max_connections) */
    int idle_timeout_s;             /* --http-idle-timeout: inactive connection closed (10 s) */
    int body_timeout_s;             /* --http-body-timeout: a body must arrive within (30 s) */
    int header_timeout_s;           /* --http-header-timeout: a request's headers must arrive
                                       within (30 s) of connect or of the previous response */
    int health_timeout_s;           /* /health_generate deadline (20 s) */
    int stream_interval;            /* --stream-interval: SSE chunk every N tokens (1) */
    int decode_log_interval; /* --decode-log-interval: the decode log line every N steps (40) */
} ms_frontend_opts;

void ms_frontend_opts_init(ms_frontend_opts *o);
/* If argv[i] is a front-end flag, parses it (and its value) and returns the
 * number of argv entries used (1 or 2); returns 0 for other flags and a
 * negative MS_E* with the reason in e for a bad value.  Accepts --flag=value. */
int ms_frontend_parse_flag(ms_frontend_opts *o, int argc, char **argv, int i, ms_errbuf *e);
void ms_frontend_print_flags(FILE *f);

typedef struct ms_frontend ms_frontend;

/* Starts listening.  hub and codec are borrowed and must outlive the front end. */
int ms_frontend_open(ms_frontend **out, const ms_frontend_opts *o, ms_serve_hub *hub,
                     const ms_serve_codec *codec, ms_errbuf *e);
int ms_frontend_port(const ms_frontend *fe); /* the bound port */
void ms_frontend_begin_drain(ms_frontend *fe);
int ms_frontend_live_requests(ms_frontend *fe);
void ms_frontend_close(ms_frontend *fe); /* accepts NULL; aborts what is still live */

#endif
