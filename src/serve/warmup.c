/* warmup.c — the warm-up every command runs before its first request (engine.h):
 * ms_engine_boot opens the engine (prepacking the BF16 weights unless
 * told to skip) and runs one prompt through the model on every rank, so `serve`,
 * `generate` and the benchmarks start from the same warmed state.  Main thread;
 * every rank together.
 */
#include "serve/engine.h"
#include "serve/engine_priv.h"

#include "base/log.h"
#include "base/util.h"
#include "moe/expert_recorder.h"

#include <stdlib.h>
#include <string.h>

int ms_engine_warmup(ms_engine *e, int64_t max_tokens, ms_engine_warmup_stats *st, ms_errbuf *err)
{
    memset(st, 0, sizeof *st);
    st->prepacked = e->prepacked;
    st->prepacked_bytes = e->prepacked_bytes;
    st->prepack_s = e->prepack_s;
    /* one prompt of up to a prefill chunk through the model, its KV in pages
     * taken from the pool and given back.  Every rank runs the same prompt
     * (n is the same everywhere: the pool size is agreed, the chunk is the
     * launch's), so each attention group has n rows, as ms_engine_step would
     * tell the MLP layers. */
    int64_t n = MS_MIN(MS_MIN(max_tokens, e->chunk_rank),
                       MS_MIN(e->pool_tokens - e->o.page_size, e->ctx_len));
    if (n < 1) return 0;
    if (e->W > 1) {
        for (int i = 0; i < e->lay.tp; i++) e->rows_tp[i] = n;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)ms_model_shape_of(e->m)->vocab);
    ms_kv_seq kv;
    ms_kv_seq_init(&kv);
    int rc = MS_ENOMEM;
    if (!ids || !logits) {
        ms_err(err, rc, "out of memory (warm-up)");
        goto out;
    }
    if ((rc = ms_kv_cache_reserve(e->cache, &kv, n))) {
        ms_err(err, rc, "warm-up: no room for %lld tokens in the KV cache", (long long)n);
        goto out;
    }
    uint64_t rng = 1;
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(ms_rng_next(&rng) % (uint64_t)ms_model_shape_of(e->m)->vocab);
    ms_batch_seq seq = {.tokens = ids,
                        .n_tokens = (int32_t)n,
                        .start_pos = 0,
                        .kv = &kv,
                        .logits = logits,
                        .n_logits = 1};
    double t0 = ms_now_s();
    rc = ms_model_forward(e->m, e->cache, &seq, 1, err);
    st->forward_s = ms_now_s() - t0;
    if (e->rec) ms_expert_recorder_discard_pass(e->rec); /* its routing is no serving pass */
    if (!rc) st->forward_tokens = n;
out:
    ms_kv_cache_release(e->cache, &kv);
    ms_kv_seq_deinit(&kv);
    free(ids);
    free(logits);
    return rc;
}

int ms_engine_boot(ms_engine **out, ms_engine_opts *o, int skip_warmup, int64_t warmup_tokens,
                   ms_errbuf *err)
{
    o->prepack = !skip_warmup;
    int rc = ms_engine_open(out, o, err);
    if (rc || skip_warmup) return rc;
    ms_engine_warmup_stats ws;
    if ((rc = ms_engine_warmup(*out, warmup_tokens, &ws, err))) {
        ms_engine_close(*out);
        *out = NULL;
        return rc;
    }
    if ((*out)->rank == 0)
        MS_LOG(MS_INFO, "engine",
               "warm-up: %lld weight matrices prepacked (%.0f MiB) in %.2f s; "
               "a %lld-token prompt in %.2f s",
               (long long)ws.prepacked, (double)ws.prepacked_bytes / (1 << 20), ws.prepack_s,
               (long long)ws.forward_tokens, ws.forward_s);
    return 0;
}
