/* echo_engine.h — test doubles for the serve tests (never linked into src/):
 *  - a byte-level codec: ids 0..255 are bytes, 256.. are DeepSeek's markers;
 *  - an echo engine: a thread that runs the main-loop protocol of
 *    serve/request.h and "generates" the prompt's last user turn (or the whole
 *    prompt) byte by byte, then EOS; it honours max_new_tokens, stop ids,
 *    ignore_eos (cycles), aborts, abort-all and flush-cache, and publishes load.
 * Header-only (static functions) so each test program includes its own copy.
 */
#ifndef MS_TESTS_ECHO_ENGINE_H
#define MS_TESTS_ECHO_ENGINE_H

#include "serve/chat.h"
#include "serve/detok.h"
#include "serve/request.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    TC_BOS = 256,
    TC_EOS,
    TC_USER,
    TC_ASSISTANT,
    TC_THINK,
    TC_THINK_END,
    TC_CALLS_BEGIN,
    TC_CALLS_END,
    TC_CALL_BEGIN,
    TC_CALL_END,
    TC_SEP,
    TC_OUT_BEGIN,
    TC_OUT_END,
    TC_VOCAB
};
static const char *const tc_markers[] = {
    MS_CHAT_BOS,        MS_CHAT_EOS,       MS_CHAT_USER,        MS_CHAT_ASSISTANT,
    MS_CHAT_THINK,      MS_CHAT_THINK_END, MS_CHAT_CALLS_BEGIN, MS_CHAT_CALLS_END,
    MS_CHAT_CALL_BEGIN, MS_CHAT_CALL_END,  MS_CHAT_SEP,         MS_CHAT_OUTPUT_BEGIN,
    MS_CHAT_OUTPUT_END};

static int tc_encode(void *ctx, const char *text, size_t len, int parse_special, int32_t **ids,
                     size_t *n_ids, ms_errbuf *e)
{
    (void)ctx;
    int32_t *out = malloc(sizeof *out * (len ? len : 1));
    if (!out) return ms_err(e, MS_ENOMEM, "oom");
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        int hit = -1;
        for (int k = 0; parse_special && k < TC_VOCAB - 256; k++) {
            size_t ml = strlen(tc_markers[k]);
            if (ml <= len - i && !memcmp(text + i, tc_markers[k], ml)) {
                hit = k;
                i += ml;
                break;
            }
        }
        if (hit >= 0)
            out[n++] = 256 + hit;
        else
            out[n++] = (unsigned char)text[i++];
    }
    *ids = out;
    *n_ids = n;
    return 0;
}

static int tc_token_bytes(void *ctx, int32_t id, char *buf, size_t cap, size_t *n_out)
{
    (void)ctx;
    if (id < 0 || id >= TC_VOCAB) return MS_EINVAL;
    if (id < 256) {
        if (cap) buf[0] = (char)id;
        *n_out = 1;
        return 0;
    }
    size_t n = strlen(tc_markers[id - 256]);
    memcpy(buf, tc_markers[id - 256], n < cap ? n : cap);
    *n_out = n;
    return 0;
}

static int tc_is_special(void *ctx, int32_t id)
{
    (void)ctx;
    return id >= TC_BOS && id <= TC_ASSISTANT;
}

static int32_t tc_token_id(void *ctx, const char *tok)
{
    (void)ctx;
    for (int k = 0; k < TC_VOCAB - 256; k++)
        if (!strcmp(tok, tc_markers[k])) return 256 + k;
    return strlen(tok) == 1 ? (unsigned char)tok[0] : -1;
}

static const ms_serve_codec test_codec = {NULL,          tc_encode,   tc_token_bytes,
                                          tc_is_special, tc_token_id, TC_VOCAB};

/* ---------------------------------------------------------------- engine */

#define ECHO_MAX_ACTIVE 1024

typedef struct echo_slot {
    ms_serve_req *r;
    int32_t begin, end, n_gen;
} echo_slot;

typedef struct echo_engine {
    ms_serve_hub *hub;
    pthread_t th;
    atomic_int quit, paused, stalled;
    atomic_int step_us;
    atomic_int n_active, n_aborts, n_done, n_flush_ok, n_flush_busy, n_submitted;
    echo_slot slots[ECHO_MAX_ACTIVE];
    int n;
} echo_engine;

static void echo_drop(echo_engine *e, int i, int kind, int32_t stop, const char *msg)
{
    ms_serve_req_finish(e->slots[i].r, (enum ms_serve_finish)kind, stop, msg);
    ms_serve_req_unref(e->slots[i].r);
    e->slots[i] = e->slots[--e->n];
    atomic_store(&e->n_active, e->n);
    atomic_fetch_add(&e->n_done, 1);
}

static void echo_admit(echo_engine *e, ms_serve_req *r)
{
    if (e->n == ECHO_MAX_ACTIVE) {
        ms_serve_req_finish(r, MS_SERVE_FINISH_ERROR, -1, "echo engine full");
        ms_serve_req_unref(r);
        return;
    }
    int32_t b = 0, end = r->n_input;
    for (int32_t i = 0; i < r->n_input; i++)
        if (r->input_ids[i] == TC_USER) b = i + 1;
    for (int32_t i = b; i < r->n_input; i++)
        if (r->input_ids[i] == TC_ASSISTANT) {
            end = i;
            break;
        }
    if (b == 0 && r->n_input > 0 && r->input_ids[0] == TC_BOS) b = 1;
    e->slots[e->n++] = (echo_slot){r, b, end, 0};
    atomic_store(&e->n_active, e->n);
    atomic_fetch_add(&e->n_submitted, 1);
}

static void *echo_main(void *arg)
{
    echo_engine *e = arg;
    while (!atomic_load(&e->quit)) {
        if (atomic_load(&e->paused)) {
            usleep(2000);
            continue;
        }
        if (e->n == 0) ms_serve_hub_wait(e->hub, 200);
        ms_serve_msg m;
        while (!atomic_load(&e->paused) && ms_serve_hub_pop(e->hub, &m)) {
            if (m.kind == MS_MSG_GENERATE) {
                echo_admit(e, m.req);
            } else if (m.kind == MS_MSG_ABORT) {
                for (int i = 0; i < e->n; i++)
                    if (e->slots[i].r == m.req) {
                        echo_drop(e, i, MS_SERVE_FINISH_ABORT, -1, "aborted");
                        atomic_fetch_add(&e->n_aborts, 1);
                        break;
                    }
                ms_serve_req_unref(m.req);
            } else if (m.kind == MS_MSG_ABORT_ALL) {
                while (e->n) {
                    echo_drop(e, 0, MS_SERVE_FINISH_ABORT, -1, "abort all");
                    atomic_fetch_add(&e->n_aborts, 1);
                }
            } else if (m.kind == MS_MSG_FLUSH_CACHE) {
                if (e->n) {
                    char msg[64];
                    snprintf(msg, sizeof msg, "%d requests are running", e->n);
                    ms_serve_req_finish(m.req, MS_SERVE_FINISH_ERROR, -1, msg);
                    atomic_fetch_add(&e->n_flush_busy, 1);
                } else {
                    ms_serve_req_finish(m.req, MS_SERVE_FINISH_STOP, -1, NULL);
                    atomic_fetch_add(&e->n_flush_ok, 1);
                }
                ms_serve_req_unref(m.req);
            }
        }
        if (atomic_load(&e->stalled)) { /* a hung forward: no steps, no heartbeats */
            usleep(2000);
            continue;
        }
        for (int i = 0; i < e->n; i++) {
            echo_slot *s = &e->slots[i];
            const ms_req_params *sp = &s->r->params;
            int32_t len = s->end - s->begin, tok;
            if (s->n_gen < len)
                tok = s->r->input_ids[s->begin + s->n_gen];
            else if (sp->ignore_eos && len > 0)
                tok = s->r->input_ids[s->begin + s->n_gen % len];
            else
                tok = TC_EOS;
            int32_t top[MS_SERVE_MAX_TOP_LOGPROBS];
            float tl[MS_SERVE_MAX_TOP_LOGPROBS];
            for (int j = 0; j < sp->top_logprobs; j++) {
                top[j] = (tok + j) % TC_VOCAB;
                tl[j] = -0.5f * (float)(j + 1);
            }
            if (s->n_gen == 0) ms_serve_req_set_cached_tokens(s->r, s->r->n_input / 2);
            ms_serve_req_push(s->r, tok, -0.25f, top, tl);
            s->n_gen++;
            int stop_id = 0;
            for (int j = 0; j < sp->n_stop_ids; j++) stop_id |= sp->stop_ids[j] == tok;
            if (tok == TC_EOS || stop_id)
                echo_drop(e, i--, MS_SERVE_FINISH_STOP, tok, NULL);
            else if (s->n_gen >= sp->max_new)
                echo_drop(e, i--, MS_SERVE_FINISH_LENGTH, -1, NULL);
        }
        ms_dp_load ld = {.num_running_reqs = e->n,
                         .num_used_tokens = 10 * e->n,
                         .token_usage = 0.01 * e->n,
                         .cache_hit_rate = 0.5,
                         .gen_throughput = 100};
        ms_serve_hub_publish_load(e->hub, 0, &ld);
        ms_serve_hub_heartbeat(e->hub);
        int us = atomic_load(&e->step_us);
        if (e->n && us > 0) usleep((useconds_t)us);
    }
    while (e->n) echo_drop(e, 0, MS_SERVE_FINISH_ABORT, -1, "engine stopped");
    return NULL;
}

__attribute__((unused)) static int echo_start(echo_engine *e, ms_serve_hub *hub)
{
    memset(e, 0, sizeof *e);
    e->hub = hub;
    return pthread_create(&e->th, NULL, echo_main, e);
}

__attribute__((unused)) static void echo_stop(echo_engine *e)
{
    atomic_store(&e->quit, 1);
    ms_serve_hub_request_stop(e->hub);
    pthread_join(e->th, NULL);
}

#endif
