/* eplb_run.h — EPLB at run time (--enable-eplb, serve/eplb_run.c): the cadence, the
 * plan from the recorder's window and the layer-by-layer expert moves between ranks.
 * Internal to the engine (engine*.c).  Main thread, every rank together.
 */
#ifndef MS_SERVE_EPLB_RUN_H
#define MS_SERVE_EPLB_RUN_H

#include "base/error.h"
#include "serve/engine.h"

#include <stddef.h>
#include <stdint.h>

/* After the model opened, before the KV pool is sized: checks the launch (EP > 1, the
 * all-to-all path, rewritable expert slots) and allocates the staging buffer.  No-op
 * without --enable-eplb.  0, or MS_EUNSUPPORTED naming the flag and the reason. */
int ms_eplb_run_open(ms_engine *e, ms_errbuf *err);
/* After each forward pass that ran (with the recorder's end of pass). */
int ms_eplb_run_step(ms_engine *e, ms_errbuf *err);
void ms_eplb_run_free(ms_engine *e);
/* Bytes of the staging buffer (0 without EPLB): counted in the KV budget. */
size_t ms_eplb_run_staging_bytes(const ms_engine *e);

#endif
