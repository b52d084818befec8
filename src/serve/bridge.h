/* bridge.h — rank 0's glue between the front end's hub (request.h) and the
 * engine (engine.h): hub messages become ms_engine_submit/abort/flush calls,
 * engine events become tokens and finishes on the requests, per-DP-rank loads
 * go to the hub's snapshot.  Owns the id → request map of requests inside the
 * engine.  Rank 0's main thread only.
 *
 * The rank-0 loop (other ranks just loop on ms_engine_step):
 *   for (;;) {
 *       if (!ms_engine_busy(e)) ms_serve_hub_wait(hub, -1);   // idle: no CPU
 *       if (ms_serve_hub_stop_requested(hub)) ... ms_frontend_begin_drain(fe), keep stepping
 *           until ms_frontend_live_requests(fe) == 0, then ms_engine_shutdown + a last step;
 *       ms_serve_bridge_pull(b, e);
 *       if (ms_engine_busy(e)) { if (ms_engine_step(e, &err)) break; ms_serve_bridge_push(b, e); }
 *   }
 */
#ifndef MS_SERVE_BRIDGE_H
#define MS_SERVE_BRIDGE_H

#include "serve/engine.h"
#include "serve/request.h"

typedef struct ms_serve_bridge ms_serve_bridge;

int ms_serve_bridge_new(ms_serve_bridge **out, ms_serve_hub *hub);
/* Finishes every request still inside with ABORT ("server shutting down"). */
void ms_serve_bridge_free(ms_serve_bridge *b);
/* Drains the hub into the engine (never blocks); returns messages handled. */
int ms_serve_bridge_pull(ms_serve_bridge *b, ms_engine *e);
/* After a step: delivers its events, publishes loads, beats the heartbeat. */
void ms_serve_bridge_push(ms_serve_bridge *b, ms_engine *e);
int ms_serve_bridge_n_live(const ms_serve_bridge *b);
/* Engine info for the hub from an opened engine (model_path for display). */
void ms_serve_bridge_engine_info(const ms_engine *e, const char *model_path, ms_engine_info *out);

#endif
