/* choices.c — the n choices of one request (choices.h): their sessions, the
 * delayed submission of choices 1..n-1, the interleaved stream and the merged
 * body.  Runs only on the connection's own thread. */
#include "serve/choices.h"

#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A copy of api for another choice: what a session reads (stop strings
 * duplicated), no prompt. */
static int copy_api(ms_api_req *dst, const ms_api_req *src)
{
    *dst = *src;
    dst->text = NULL;
    dst->ids = NULL;
    for (int i = 0; i < src->n_stops; i++) dst->stops[i] = NULL;
    for (int i = 0; i < src->n_stops; i++)
        if (!(dst->stops[i] = strdup(src->stops[i]))) return MS_ENOMEM;
    return 0;
}

int ms_choices_init(ms_choices *c, ms_api_req *api, const int32_t *ids, int32_t n_ids,
                    const char *rid, int32_t dp_hint, ms_serve_hub *hub, ms_metrics *metrics,
                    const ms_serve_codec *codec, const char *model_name, ms_errbuf *e)
{
    memset(c, 0, sizeof *c);
    int n = api->n > 1 ? api->n : 1;
    c->hub = hub;
    c->s = calloc((size_t)n, sizeof *c->s);
    if (!c->s) return ms_err(e, MS_ENOMEM, "out of memory");
    ms_api_req extra[MS_API_MAX_N];
    int n_extra = 0, rc = 0;
    for (; n_extra < n - 1; n_extra++)
        if (copy_api(&extra[n_extra], api)) {
            ms_api_req_deinit(&extra[n_extra]);
            rc = ms_err(e, MS_ENOMEM, "out of memory");
            goto out;
        }
    for (int i = 0; i < n; i++) {
        ms_api_req *a = i == 0 ? api : &extra[i - 1];
        ms_req_params sp = a->params;
        sp.seed += (uint64_t)i; /* distinct samples, reproducible for a given seed */
        char sub[MS_SERVE_RID_MAX];
        snprintf(sub, sizeof sub, i ? "%.*s-%d" : "%.*s", MS_SERVE_RID_MAX - 8, rid, i);
        ms_serve_req *r = ms_serve_req_new(sub, ids, n_ids, &sp);
        if (!r) {
            rc = ms_err(e, MS_ENOMEM, "out of memory");
            goto out;
        }
        r->dp_rank_hint = dp_hint;
        if (ms_session_init(&c->s[i], a, r, hub, metrics, codec, model_name, n_ids)) {
            ms_session_deinit(&c->s[i]); /* drops r */
            rc = ms_err(e, MS_ENOMEM, "out of memory");
            goto out;
        }
        c->n = i + 1;
        snprintf(c->s[i].id, sizeof c->s[i].id, "%s", rid); /* one response id */
        c->s[i].index = i;
        c->s[i].quiet_end = n > 1; /* usage and [DONE] once, for all (below) */
    }
out:
    for (int i = c->n > 0 ? c->n - 1 : 0; i < n_extra; i++) ms_api_req_deinit(&extra[i]);
    if (rc) ms_choices_deinit(c);
    return rc;
}

void ms_choices_deinit(ms_choices *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) ms_session_deinit(&c->s[i]);
    free(c->s);
    free(c->tail);
    memset(c, 0, sizeof *c);
}

int ms_choices_submit(ms_choices *c, int32_t max_queued, ms_errbuf *e)
{
    c->max_queued = max_queued;
    int rc = ms_serve_hub_submit(c->hub, c->s[0].req, max_queued, e);
    if (rc) {
        for (int i = 0; i < c->n; i++) c->s[i].finish = MS_SERVE_FINISH_ABORT; /* not counted */
        return rc;
    }
    c->n_submitted = 1;
    return 0;
}

/* Choices 1..n-1 once the first has a token (its prompt is cached) or ended. */
static void submit_rest(ms_choices *c)
{
    const ms_session *s0 = &c->s[0];
    if (c->n_submitted == c->n || (s0->n_taken == 0 && !s0->finish)) return;
    for (int i = c->n_submitted; i < c->n; i++) {
        ms_errbuf e = {{0}};
        if (s0->finish == MS_SERVE_FINISH_ABORT)
            ms_serve_req_finish(c->s[i].req, MS_SERVE_FINISH_ABORT, -1, "aborted");
        else if (ms_serve_hub_submit(c->hub, c->s[i].req, c->max_queued, &e))
            ms_serve_req_finish(c->s[i].req, MS_SERVE_FINISH_ERROR, -1, e.msg);
    }
    c->n_submitted = c->n;
}

int ms_choices_finished(const ms_choices *c)
{
    for (int i = 0; i < c->n; i++)
        if (!c->s[i].finish) return 0;
    return 1;
}

int ms_choices_stream(const ms_choices *c)
{
    return c->s[0].api.stream;
}

static void queue_tail(ms_choices *c)
{
    char *b = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&b, &n);
    if (!f) return;
    const ms_session *s0 = &c->s[0];
    if (s0->api.include_usage) {
        int64_t gen = 0;
        for (int i = 0; i < c->n; i++) gen += (int64_t)c->s[i].n_taken;
        json_t *u = ms_api_usage(s0->n_prompt, gen, ms_serve_req_cached_tokens(s0->req));
        json_t *o = json_pack(
            "{s:s,s:s,s:I,s:s,s:[],s:o}", "id", s0->id, "object",
            s0->api.kind == MS_API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
            (json_int_t)s0->created, "model", s0->model, "choices", "usage", u);
        size_t k = 0;
        char *fr = o ? ms_api_sse_frame(o, &k) : NULL;
        json_decref(o);
        if (fr) fwrite(fr, 1, k, f);
        free(fr);
    }
    fputs("data: [DONE]\n\n", f);
    fclose(f);
    c->tail = b;
    c->n_tail = n;
}

int ms_choices_step(ms_choices *c, int timeout_ms)
{
    if (c->n == 1) return ms_session_step(&c->s[0], timeout_ms);
    int progressed = 0, first = -1;
    for (int i = 0; i < c->n_submitted; i++) {
        if (c->s[i].finish) continue;
        size_t before = c->s[i].n_taken;
        int d = ms_session_step(&c->s[i], 0);
        if (d < 0) return d;
        if (d || c->s[i].n_taken != before)
            progressed = 1;
        else if (first < 0)
            first = i;
    }
    if (!progressed && first >= 0) { /* wait on one of them */
        int d = ms_session_step(&c->s[first], timeout_ms);
        if (d < 0) return d;
    }
    submit_rest(c);
    if (!ms_choices_finished(c)) return 0;
    if (ms_choices_stream(c) && !c->tail_done) {
        queue_tail(c);
        c->tail_done = 1;
    }
    return 1;
}

int ms_choices_pending(const ms_choices *c)
{
    for (int i = 0; i < c->n; i++)
        if (ms_session_pending(&c->s[i])) return 1;
    return c->n_tail > c->tail_pos;
}

size_t ms_choices_read(ms_choices *c, char *buf, size_t max)
{
    for (int i = 0; i < c->n; i++)
        if (ms_session_pending(&c->s[i])) return ms_session_read(&c->s[i], buf, max);
    size_t k = c->n_tail - c->tail_pos;
    if (k > max) k = max;
    memcpy(buf, c->tail + c->tail_pos, k);
    c->tail_pos += k;
    return k;
}

char *ms_choices_body(ms_choices *c, int *status, size_t *len)
{
    if (c->n == 1) return ms_session_body(&c->s[0], status, len);
    json_t *all = NULL, *choices = json_array();
    int64_t gen = 0;
    for (int i = 0; i < c->n; i++) {
        char *b = ms_session_body(&c->s[i], status, len);
        if (*status != 200) { /* the first choice that failed answers for all */
            json_decref(all);
            json_decref(choices);
            return b;
        }
        json_t *o = b ? json_loads(b, 0, NULL) : NULL;
        free(b);
        json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
        if (ch) {
            json_object_set_new(ch, "index", json_integer(i));
            json_array_append(choices, ch);
        }
        gen += (int64_t)c->s[i].n_taken;
        if (!all)
            all = o;
        else
            json_decref(o);
    }
    const ms_session *s0 = &c->s[0];
    if (all) {
        json_object_set_new(all, "choices", choices);
        json_object_set_new(all, "usage",
                            ms_api_usage(s0->n_prompt, gen, ms_serve_req_cached_tokens(s0->req)));
    } else {
        json_decref(choices);
    }
    char *out = all ? json_dumps(all, JSON_COMPACT) : NULL;
    json_decref(all);
    *status = out ? 200 : 500;
    if (!out) out = ms_api_error_body(500, "failed to format the response", NULL);
    *len = out ? strlen(out) : 0;
    return out;
}

int ms_choices_abort(ms_choices *c, const char *rid)
{
    if (rid && strcmp(c->s[0].id, rid)) return 0;
    for (int i = 0; i < c->n_submitted; i++) ms_serve_hub_post(c->hub, MS_MSG_ABORT, c->s[i].req);
    for (int i = c->n_submitted; i < c->n; i++) /* never submitted: end them here */
        ms_serve_req_finish(c->s[i].req, MS_SERVE_FINISH_ABORT, -1, "aborted");
    return 1;
}

int ms_choices_abandon(ms_choices *c)
{
    int k = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->s[i].finish) continue;
        if (i < c->n_submitted) {
            ms_serve_hub_post(c->hub, MS_MSG_ABORT, c->s[i].req);
            ms_session_abandon(&c->s[i]);
        } else {
            c->s[i].finish = MS_SERVE_FINISH_ABORT; /* never reached the engine */
        }
        k++;
    }
    return k;
}
