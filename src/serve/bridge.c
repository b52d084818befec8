/* bridge.c — hub ↔ engine glue on rank 0 (bridge.h): an open-addressing map
 * from engine request id to ms_serve_req, message translation, event delivery,
 * load publishing with a per-DP-rank generation-throughput estimate.
 * Rank 0's main thread only. */
#include "serve/bridge.h"

#include "base/log.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ms_serve_bridge {
    ms_serve_hub *hub;
    ms_serve_req **slots; /* [cap], NULL or a request (one reference owned) */
    size_t cap, n, tomb;
    double t_window;
    int64_t gen_window[MS_SERVE_MAX_DP];
    double gen_rate[MS_SERVE_MAX_DP];
};

#define TOMB ((ms_serve_req *)1)

static size_t slot_of(const ms_serve_bridge *b, uint64_t id)
{
    return (size_t)(id * 0x9e3779b97f4a7c15ull >> 7) & (b->cap - 1);
}

static ms_serve_req **find(ms_serve_bridge *b, uint64_t id)
{
    for (size_t i = slot_of(b, id), k = 0; k < b->cap; i = (i + 1) & (b->cap - 1), k++) {
        if (!b->slots[i]) return NULL;
        if (b->slots[i] != TOMB && b->slots[i]->id == id) return &b->slots[i];
    }
    return NULL;
}

static int rehash(ms_serve_bridge *b, size_t cap)
{
    ms_serve_req **old = b->slots;
    size_t oc = b->cap;
    b->slots = calloc(cap, sizeof *b->slots);
    if (!b->slots) {
        b->slots = old;
        return MS_ENOMEM;
    }
    b->cap = cap;
    b->tomb = 0;
    for (size_t i = 0; i < oc; i++)
        if (old[i] && old[i] != TOMB) {
            size_t j = slot_of(b, old[i]->id);
            while (b->slots[j]) j = (j + 1) & (cap - 1);
            b->slots[j] = old[i];
        }
    free(old);
    return 0;
}

static int insert(ms_serve_bridge *b, ms_serve_req *r)
{
    if ((b->n + b->tomb + 1) * 2 > b->cap && rehash(b, b->n * 4 > b->cap ? b->cap * 2 : b->cap))
        return MS_ENOMEM;
    size_t j = slot_of(b, r->id);
    while (b->slots[j] && b->slots[j] != TOMB) j = (j + 1) & (b->cap - 1);
    if (b->slots[j] == TOMB) b->tomb--;
    b->slots[j] = r;
    b->n++;
    return 0;
}

static void drop(ms_serve_bridge *b, ms_serve_req **slot)
{
    ms_serve_req_unref(*slot);
    *slot = TOMB;
    b->n--;
    b->tomb++;
}

int ms_serve_bridge_new(ms_serve_bridge **out, ms_serve_hub *hub)
{
    ms_serve_bridge *b = calloc(1, sizeof *b);
    if (!b) return MS_ENOMEM;
    b->hub = hub;
    b->cap = 256;
    b->slots = calloc(b->cap, sizeof *b->slots);
    if (!b->slots) {
        free(b);
        return MS_ENOMEM;
    }
    b->t_window = ms_now_s();
    *out = b;
    return 0;
}

void ms_serve_bridge_free(ms_serve_bridge *b)
{
    if (!b) return;
    for (size_t i = 0; i < b->cap; i++)
        if (b->slots[i] && b->slots[i] != TOMB) {
            ms_serve_req_finish(b->slots[i], MS_SERVE_FINISH_ABORT, -1, "server shutting down");
            ms_serve_req_unref(b->slots[i]);
        }
    free(b->slots);
    free(b);
}

int ms_serve_bridge_n_live(const ms_serve_bridge *b)
{
    return (int)b->n;
}

static void submit(ms_serve_bridge *b, ms_engine *e, ms_serve_req *r)
{
    const ms_serve_sampling *s = &r->sampling;
    ms_sched_input in = {.id = r->id,
                         .ids = r->input_ids,
                         .n_ids = r->n_input,
                         .max_new = s->max_new_tokens,
                         .samp = {.temperature = s->temperature,
                                  .top_p = s->top_p,
                                  .top_k = s->top_k,
                                  .min_p = s->min_p},
                         .seed = s->has_seed ? s->seed : r->id,
                         .ignore_eos = s->ignore_eos,
                         .n_stop_ids = s->n_stop_ids,
                         .top_logprobs = s->logprobs ? s->top_logprobs : -1};
    memcpy(in.stop_ids, s->stop_ids, sizeof(int32_t) * (size_t)s->n_stop_ids);
    ms_errbuf err = {{0}};
    int rc = ms_serve_req_aborted(r) ? MS_ECANCELED : insert(b, r);
    if (rc == 0 && (rc = ms_engine_submit(e, &in, r->dp_rank_hint, &err)) != 0) {
        ms_serve_req **slot = find(b, r->id);
        if (slot) {
            *slot = TOMB; /* the reference is released below */
            b->n--;
            b->tomb++;
        }
    }
    if (rc) {
        ms_serve_req_finish(r, rc == MS_ECANCELED ? MS_SERVE_FINISH_ABORT : MS_SERVE_FINISH_ERROR,
                            -1, err.msg[0] ? err.msg : ms_strerror(rc));
        ms_serve_req_unref(r);
    }
}

int ms_serve_bridge_pull(ms_serve_bridge *b, ms_engine *e)
{
    ms_serve_msg m;
    int n = 0;
    while (ms_serve_hub_pop(b->hub, &m)) {
        n++;
        switch (m.kind) {
        case MS_MSG_GENERATE:
            submit(b, e, m.req);
            break; /* the map keeps the reference */
        case MS_MSG_ABORT: {
            ms_serve_req **slot = find(b, m.req->id);
            if (slot) { /* answer now; late engine events for the id are ignored */
                ms_engine_abort(e, m.req->id);
                ms_serve_req_finish(m.req, MS_SERVE_FINISH_ABORT, -1, "aborted");
                drop(b, slot);
            }
            ms_serve_req_unref(m.req);
            break;
        }
        case MS_MSG_ABORT_ALL:
            for (size_t i = 0; i < b->cap; i++)
                if (b->slots[i] && b->slots[i] != TOMB) {
                    ms_engine_abort(e, b->slots[i]->id);
                    ms_serve_req_finish(b->slots[i], MS_SERVE_FINISH_ABORT, -1, "abort all");
                    drop(b, &b->slots[i]);
                }
            break;
        case MS_MSG_FLUSH_CACHE: {
            int rc = b->n ? MS_EBUSY : ms_engine_flush_cache(e);
            char msg[96];
            snprintf(msg, sizeof msg, "cache not flushed: %d requests are running", (int)b->n);
            ms_serve_req_finish(m.req, rc ? MS_SERVE_FINISH_ERROR : MS_SERVE_FINISH_STOP, -1,
                                rc ? msg : NULL);
            ms_serve_req_unref(m.req);
            break;
        }
        }
    }
    if (b->tomb > b->cap / 4) rehash(b, b->cap);
    return n;
}

void ms_serve_bridge_push(ms_serve_bridge *b, ms_engine *e)
{
    const ms_engine_event *ev;
    int n_ev = ms_engine_events(e, &ev);
    for (int i = 0; i < n_ev; i++) {
        const ms_sched_event *x = &ev[i].ev;
        ms_serve_req **slot = find(b, x->id);
        if (!slot) continue;
        ms_serve_req *r = *slot;
        if (x->token >= 0) {
            if (ms_serve_req_n_generated(r) == 0)
                ms_serve_req_set_cached_tokens(r, (int32_t)x->cached_tokens);
            ms_serve_req_push(r, x->token, x->logprob, x->top_ids, x->top_lps);
            if (ev[i].dp_rank >= 0 && ev[i].dp_rank < MS_SERVE_MAX_DP)
                b->gen_window[ev[i].dp_rank]++;
        }
        if (x->finish != MS_FINISH_NONE) {
            ms_serve_req_finish(r, (enum ms_serve_finish)x->finish,
                                x->finish == MS_FINISH_STOP ? x->token : -1, NULL);
            drop(b, slot);
        }
    }
    double now = ms_now_s();
    if (now - b->t_window >= 1.0) {
        for (int d = 0; d < MS_SERVE_MAX_DP; d++) {
            b->gen_rate[d] = (double)b->gen_window[d] / (now - b->t_window);
            b->gen_window[d] = 0;
        }
        b->t_window = now;
    }
    const ms_engine_load *ld;
    int n_ld = ms_engine_loads(e, &ld);
    for (int i = 0; i < n_ld; i++) {
        const ms_sched_stats *st = &ld[i].st;
        int d = ld[i].dp_rank;
        ms_dp_load l = {
            .num_running_reqs = st->n_running,
            .num_waiting_reqs = st->n_waiting,
            .num_used_tokens = st->used_tokens,
            .token_usage =
                st->total_tokens ? (double)st->used_tokens / (double)st->total_tokens : 0,
            .cache_hit_rate = st->prompt_tokens_total ? (double)st->cached_prompt_tokens_total /
                                                            (double)st->prompt_tokens_total
                                                      : 0,
            .gen_throughput = d >= 0 && d < MS_SERVE_MAX_DP ? b->gen_rate[d] : 0,
            .num_retracted_reqs_total = st->n_retracted,
        };
        ms_serve_hub_publish_load(b->hub, d, &l);
    }
    ms_serve_hub_heartbeat(b->hub);
}

void ms_serve_bridge_engine_info(const ms_engine *e, const char *model_path, ms_engine_info *out)
{
    memset(out, 0, sizeof *out);
    const ms_layout *lay = ms_engine_layout(e);
    const ms_model *m = ms_engine_model(e);
    snprintf(out->model_path, sizeof out->model_path, "%s", model_path ? model_path : "");
    out->context_len = ms_engine_context_length(e);
    out->vocab_size = (int32_t)m->cfg.vocab_size;
    out->tp_size = lay->tp;
    out->pp_size = lay->pp;
    out->dp_size = lay->attn_dp * lay->n_replicas;
    out->ep_size = lay->moe_ep;
    out->attn_dp_size = lay->attn_dp;
    out->attn_tp_size = lay->attn_tp;
    out->moe_tp_size = lay->moe_tp;
    out->kv_pool_replicated = lay->attn_tp > 1;
    out->n_dp = ms_engine_n_dp(e) < MS_SERVE_MAX_DP ? ms_engine_n_dp(e) : MS_SERVE_MAX_DP;
    for (int32_t d = 0; d < out->n_dp; d++) out->max_total_num_tokens[d] = ms_engine_pool_tokens(e);
    out->max_running_requests_per_rank = ms_engine_max_running_per_rank(e);
    out->max_running_requests = out->max_running_requests_per_rank * out->n_dp;
    out->chunked_prefill_size_per_rank = (int32_t)ms_engine_chunk_per_rank(e);
    out->chunked_prefill_size = out->chunked_prefill_size_per_rank * out->n_dp;
    snprintf(out->layout, sizeof out->layout,
             "world=%d tp=%d attn_tp=%d attn_dp=%d replicas=%d moe_tp=%d moe_ep=%d",
             lay->world_size, lay->tp, lay->attn_tp, lay->attn_dp, lay->n_replicas, lay->moe_tp,
             lay->moe_ep);
    snprintf(out->dtype, sizeof out->dtype, "auto");
}
