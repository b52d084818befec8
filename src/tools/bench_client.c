/* bench_client.c — the bench client's HTTP side: builds each backend's request body, drives
 * every request from ONE thread with the libcurl multi interface (a Poisson arrival timer,
 * a max-concurrency gate), parses the SSE replies incrementally and measures per request:
 * TTFT at the first chunk with non-empty generated text, one ITL per later content chunk
 * (for /generate: k copies of Δt/k when a chunk brings k tokens, chunks with 0 new tokens
 * skipped — SGLang's rule), E2E at the last SSE event ([DONE] included), token counts from
 * the server (usage / meta_info) when it sends them.  Failures (connect errors, timeouts,
 * HTTP errors, error events, bad JSON) become results with a message.  Bench thread only.
 */
#include "tools/bench.h"

#include "base/util.h"

#include <curl/curl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR_BODY_KEEP 4096 /* bytes of a non-200 body kept for the message */

typedef struct req {
    const ms_bench_client_cfg *c;
    ms_bench_result *res;
    CURL *easy;
    char *body;
    int64_t want_out;
    ms_bench_sse sse;
    double now_s, last_s; /* time of this write; of the last content chunk */
    int64_t last_tokens;  /* /generate: completion_tokens at the last content chunk */
    int64_t server_out;   /* completion tokens reported by the server, -1 unknown */
    long status;
    bool got_content, event_error;
    char *raw; /* non-200 body (first ERR_BODY_KEEP bytes) or the non-streamed reply */
    size_t n_raw, cap_raw;
    ms_errbuf perr; /* why parsing stopped the transfer */
    char curl_err[CURL_ERROR_SIZE];
} req;

static void fail(req *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(req *q, const char *fmt, ...)
{
    q->res->ok = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->res->err, sizeof q->res->err, fmt, ap);
    va_end(ap);
}

static int buf_add(char **buf, size_t *n, size_t *cap, const char *p, size_t k, size_t max)
{
    if (k > max || *n > max - k) return MS_ETOOBIG;
    if (*n + k + 1 > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *n + k + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return MS_ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *n, p, k);
    *n += k;
    (*buf)[*n] = 0;
    return 0;
}

static int itl_add(ms_bench_result *r, double v)
{
    if (r->n_itl == r->cap_itl) {
        size_t c = r->cap_itl ? r->cap_itl * 2 : 64;
        double *p = realloc(r->itl_s, c * sizeof *p);
        if (!p) return MS_ENOMEM;
        r->itl_s = p;
        r->cap_itl = c;
    }
    r->itl_s[r->n_itl++] = v;
    return 0;
}

/* ---- request bodies ---------------------------------------------------------------------- */

static char *make_body(const ms_bench_client_cfg *c, const ms_bench_prompt *p, int64_t out_len)
{
    json_t *o = json_object();
    if (!o) return NULL;
    if (c->backend == MS_BENCH_MOESERVE || c->backend == MS_BENCH_SGLANG) {
        if (c->backend == MS_BENCH_MOESERVE && p->ids) {
            json_t *a = json_array();
            for (int64_t i = 0; i < p->n_ids; i++)
                json_array_append_new(a, json_integer(p->ids[i]));
            json_object_set_new(o, "input_ids", a);
        } else {
            json_object_set_new(o, "text", json_string(p->text));
        }
        json_object_set_new(o, "sampling_params",
                            json_pack("{s:f,s:I,s:b}", "temperature", 0.0, "max_new_tokens",
                                      (json_int_t)out_len, "ignore_eos", c->ignore_eos));
        json_object_set_new(o, "stream", json_boolean(c->stream));
    } else {
        if (c->model) json_object_set_new(o, "model", json_string(c->model));
        if (c->backend == MS_BENCH_OPENAI_CHAT)
            json_object_set_new(o, "messages",
                                json_pack("[{s:s,s:s}]", "role", "user", "content", p->text));
        else
            json_object_set_new(o, "prompt", json_string(p->text));
        json_object_set_new(o, "temperature", json_real(0.0));
        json_object_set_new(o, "max_tokens", json_integer(out_len));
        json_object_set_new(o, "stream", json_boolean(c->stream));
        if (c->ignore_eos) json_object_set_new(o, "ignore_eos", json_true());
        if (c->stream)
            json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    if (c->extra) json_object_update(o, (json_t *)c->extra);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ---- replies ------------------------------------------------------------------------------ */

static void take_usage(req *q, const json_t *u)
{
    const json_t *ct = json_object_get(u, "completion_tokens");
    const json_t *pt = json_object_get(u, "prompt_tokens");
    if (json_is_integer(ct) && json_integer_value(ct) >= 0) q->server_out = json_integer_value(ct);
    if (json_is_integer(pt) && json_integer_value(pt) >= 0)
        q->res->prompt_len_server = json_integer_value(pt);
}

static const char *error_message(const json_t *o)
{
    const json_t *e = json_object_get(o, "error");
    if (!e) return NULL;
    if (json_is_string(e)) return json_string_value(e);
    const char *m = json_string_value(json_object_get(e, "message"));
    return m ? m : "error object without a message";
}

/* A content chunk arrived at q->now_s carrying `tokens` new tokens (0: unknown, count 1). */
static int on_content(req *q, int64_t tokens)
{
    ms_bench_result *r = q->res;
    if (!q->got_content) {
        q->got_content = true;
        r->ttft_s = q->now_s - r->start_s;
    } else {
        int64_t k = tokens > 0 ? tokens : 1;
        double gap = (q->now_s - q->last_s) / (double)k;
        for (int64_t i = 0; i < k; i++)
            if (itl_add(r, gap)) return ms_err(&q->perr, MS_ENOMEM, "out of memory");
    }
    q->last_s = q->now_s;
    return 0;
}

static int add_text(req *q, const char *t, size_t n)
{
    if (buf_add(&q->res->text, &q->res->n_text, &q->res->cap_text, t, n, MS_BENCH_MAX_TEXT))
        return ms_err(&q->perr, MS_ETOOBIG, "generated text longer than %zu bytes",
                      MS_BENCH_MAX_TEXT);
    return 0;
}

/* One parsed reply object: a streamed chunk (stream) or the whole reply (!stream). */
static int on_object(req *q, const json_t *o)
{
    const char *em = error_message(o);
    if (em) {
        q->event_error = true;
        return ms_err(&q->perr, MS_EIO, "server error: %.200s", em);
    }
    const ms_bench_client_cfg *c = q->c;
    if (c->backend == MS_BENCH_MOESERVE || c->backend == MS_BENCH_SGLANG) {
        const json_t *meta = json_object_get(o, "meta_info");
        take_usage(q, meta);
        const json_t *fr = json_object_get(meta, "finish_reason");
        const char *ft = json_string_value(json_object_get(fr, "type"));
        if (ft && (!strcmp(ft, "abort") || !strcmp(ft, "error"))) {
            const char *m = json_string_value(json_object_get(fr, "message"));
            q->event_error = true;
            return ms_err(&q->perr, MS_EIO, "server %s: %.200s", ft, m ? m : "(no message)");
        }
        const json_t *tj = json_object_get(o, "text");
        const char *t = json_string_value(tj);
        size_t tl = t ? json_string_length(tj) : 0; /* generated text may hold NUL bytes */
        if (tl == 0) return 0;
        const json_t *ct = json_object_get(meta, "completion_tokens");
        int64_t cum = json_is_integer(ct) ? json_integer_value(ct) : -1;
        q->res->n_text = 0; /* /generate sends the cumulative text */
        int rc = add_text(q, t, tl);
        if (rc) return rc;
        if (!c->stream) return on_content(q, 0);
        if (!q->got_content) {
            q->last_tokens = cum;
            return on_content(q, 0);
        }
        int64_t k = cum >= 0 && q->last_tokens >= 0 ? cum - q->last_tokens : 1;
        if (k <= 0) return 0;
        q->last_tokens = cum;
        return on_content(q, k);
    }
    const json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) take_usage(q, u);
    const json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    if (!ch) return 0;
    const json_t *src = ch;
    if (c->backend == MS_BENCH_OPENAI_CHAT)
        src = json_object_get(ch, c->stream ? "delta" : "message");
    const json_t *tj =
        json_object_get(src, c->backend == MS_BENCH_OPENAI_CHAT ? "content" : "text");
    const json_t *rj =
        c->backend == MS_BENCH_OPENAI_CHAT ? json_object_get(src, "reasoning_content") : NULL;
    const char *t = json_string_value(tj), *rt = json_string_value(rj);
    size_t tl = t ? json_string_length(tj) : 0, rl = rt ? json_string_length(rj) : 0;
    if (tl == 0 && rl == 0) return 0;
    int rc = 0;
    if (rl) rc = add_text(q, rt, rl);
    if (!rc && tl) rc = add_text(q, t, tl);
    return rc ? rc : on_content(q, 0);
}

static int on_event(void *ctx, const char *data, size_t n)
{
    req *q = ctx;
    q->res->e2e_s = q->now_s - q->res->start_s;
    if (n == 0 || (n == 6 && !memcmp(data, "[DONE]", 6))) return 0;
    json_error_t je;
    json_t *o = json_loadb(data, n, JSON_ALLOW_NUL, &je); /* \u0000 is valid JSON */
    if (!o) return ms_err(&q->perr, MS_EFORMAT, "bad JSON in the stream: %s", je.text);
    int rc = on_object(q, o);
    json_decref(o);
    return rc;
}

static size_t on_write(char *p, size_t sz, size_t nm, void *ud)
{
    req *q = ud;
    size_t n = sz * nm;
    q->now_s = ms_now_s();
    if (!q->status) curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->status);
    if (q->status != 200) {
        size_t keep = q->n_raw < ERR_BODY_KEEP ? MS_MIN(n, ERR_BODY_KEEP - q->n_raw) : 0;
        if (keep && buf_add(&q->raw, &q->n_raw, &q->cap_raw, p, keep, ERR_BODY_KEEP)) return 0;
        return n;
    }
    if (!q->c->stream) {
        int rc = buf_add(&q->raw, &q->n_raw, &q->cap_raw, p, n, MS_BENCH_MAX_BODY);
        if (rc) {
            ms_err(&q->perr, rc, "reply longer than %zu bytes", MS_BENCH_MAX_BODY);
            return 0;
        }
        return n;
    }
    if (ms_bench_sse_feed(&q->sse, p, n, on_event, q, &q->perr)) return 0;
    return n;
}

/* ---- one request's life ------------------------------------------------------------------- */

static int req_start(req *q, CURLM *multi, struct curl_slist *hdr, const ms_bench_prompt *p,
                     ms_errbuf *err)
{
    ms_bench_result *r = q->res;
    r->prompt_len = p->prompt_len;
    r->prompt_len_server = -1;
    r->output_len_retok = -1;
    q->server_out = -1;
    q->last_tokens = -1;
    ms_bench_sse_init(&q->sse, MS_BENCH_MAX_SSE_LINE);
    q->body = make_body(q->c, p, q->want_out);
    q->easy = curl_easy_init();
    if (!q->body || !q->easy) return ms_err(err, MS_ENOMEM, "cannot build a request");
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, q->c->url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(q->body));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, q->curl_err);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    if (q->c->timeout_s > 0)
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)ceil(q->c->timeout_s * 1e3));
    r->start_s = ms_now_s();
    if (curl_multi_add_handle(multi, e) != CURLM_OK)
        return ms_err(err, MS_EIO, "curl_multi_add_handle failed");
    return 0;
}

static void non200_message(req *q)
{
    json_t *o = q->raw ? json_loadb(q->raw, q->n_raw, JSON_ALLOW_NUL, NULL) : NULL;
    const char *m = o ? error_message(o) : NULL;
    if (!m) m = json_string_value(json_object_get(o, "message"));
    if (!m) m = json_string_value(json_object_get(o, "detail"));
    fail(q, "HTTP %ld: %.200s", q->status, m ? m : q->raw ? q->raw : "(empty body)");
    json_decref(o);
}

static void req_finish(req *q, CURLcode cc)
{
    ms_bench_result *r = q->res;
    double now = ms_now_s();
    r->ok = true;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->status);
    if (cc == CURLE_OPERATION_TIMEDOUT) {
        fail(q, "timeout after %g s", q->c->timeout_s);
    } else if (cc == CURLE_WRITE_ERROR && q->perr.msg[0]) {
        fail(q, "%s", q->perr.msg);
    } else if (cc != CURLE_OK) {
        fail(q, "%s", q->curl_err[0] ? q->curl_err : curl_easy_strerror(cc));
    } else if (q->status != 200) {
        non200_message(q);
    } else if (q->c->stream) {
        q->now_s = now;
        if (ms_bench_sse_finish(&q->sse, on_event, q, &q->perr))
            fail(q, "%s", q->perr.msg);
        else if (!q->got_content)
            fail(q, "no generated text in the stream");
    } else {
        q->now_s = now;
        json_error_t je;
        json_t *o = json_loadb(q->raw ? q->raw : "", q->n_raw, JSON_ALLOW_NUL, &je);
        int rc = o ? on_object(q, o) : ms_err(&q->perr, MS_EFORMAT, "bad JSON reply: %s", je.text);
        json_decref(o);
        if (rc)
            fail(q, "%s", q->perr.msg);
        else if (!q->got_content)
            fail(q, "no generated text in the reply");
        r->e2e_s = now - r->start_s;
        r->ttft_s = r->e2e_s; /* non-streamed: the first token arrives with the last */
    }
    if (r->ok && q->c->tok && r->text) {
        size_t cap = r->n_text / 2 + 16, got = 0;
        int32_t *ids = malloc(sizeof(int32_t) * cap);
        if (ids && !ms_tokenizer_encode(q->c->tok, r->text, r->n_text, 0, ids, cap, &got, NULL) &&
            got > cap) {
            int32_t *b = realloc(ids, sizeof(int32_t) * got);
            if (b) ids = b, cap = got;
            if (!b || ms_tokenizer_encode(q->c->tok, r->text, r->n_text, 0, ids, cap, &got, NULL))
                got = 0;
        }
        free(ids);
        r->output_len_retok = (int64_t)got;
    }
    if (r->ok)
        r->output_len = q->server_out >= 0         ? q->server_out
                        : r->output_len_retok >= 0 ? r->output_len_retok
                                                   : q->want_out;
    else
        r->output_len = 0;
}

static void req_free(req *q, CURLM *multi)
{
    if (q->easy) {
        curl_multi_remove_handle(multi, q->easy);
        curl_easy_cleanup(q->easy);
    }
    free(q->body);
    free(q->raw);
    ms_bench_sse_deinit(&q->sse);
    memset(q, 0, sizeof *q);
}

/* ---- the run ------------------------------------------------------------------------------ */

int ms_bench_client_run(const ms_bench_client_cfg *c, const ms_bench_run_cfg *rcfg,
                        const ms_bench_prompt *prompts, size_t n, ms_bench_result *res,
                        ms_bench_run_out *out, ms_errbuf *err)
{
    memset(out, 0, sizeof *out);
    memset(res, 0, sizeof *res * n);
    int rc = 0;
    CURLM *multi = curl_multi_init();
    req *qs = calloc(n ? n : 1, sizeof *qs);
    double *arrive = calloc(n ? n : 1, sizeof *arrive);
    struct curl_slist *hdr = NULL;
    if (!multi || !qs || !arrive) {
        rc = ms_err(err, MS_ENOMEM, "out of memory starting the run");
        goto out;
    }
    hdr = curl_slist_append(hdr, "Content-Type: application/json");
    hdr = curl_slist_append(hdr, "Expect:");
    if (c->stream) hdr = curl_slist_append(hdr, "Accept: text/event-stream");
    if (c->api_key) {
        char h[512];
        snprintf(h, sizeof h, "Authorization: Bearer %s", c->api_key);
        hdr = curl_slist_append(hdr, h);
    }
    if (!hdr) {
        rc = ms_err(err, MS_ENOMEM, "out of memory");
        goto out;
    }
    /* SGLang's get_request: request 0 at t = 0, then Exp(mean 1/rate) gaps */
    bool poisson = rcfg->request_rate > 0 && isfinite(rcfg->request_rate);
    uint64_t rng = rcfg->seed * 0x9e3779b97f4a7c15ull + 12345;
    for (size_t i = 1; i < n; i++)
        arrive[i] =
            arrive[i - 1] + (poisson ? -log(1.0 - ms_rng_uniform(&rng)) / rcfg->request_rate : 0.0);
    size_t next = 0, done = 0, failed = 0;
    int in_flight = 0;
    double t0 = ms_now_s(), t_end = t0;
    while (done < n) {
        double now = ms_now_s();
        while (next < n && t0 + arrive[next] <= now &&
               (rcfg->max_concurrency <= 0 || in_flight < rcfg->max_concurrency)) {
            req *q = &qs[next];
            q->c = c;
            q->res = &res[next];
            q->want_out = prompts[next].output_len;
            if (rcfg->max_output > 0 && q->want_out > rcfg->max_output)
                q->want_out = rcfg->max_output;
            if ((rc = req_start(q, multi, hdr, &prompts[next], err))) goto out;
            next++;
            if (++in_flight > out->peak_in_flight) out->peak_in_flight = in_flight;
        }
        int running = 0;
        curl_multi_perform(multi, &running);
        int left = 0, finished = 0;
        CURLMsg *m;
        while ((m = curl_multi_info_read(multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            req *q = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&q);
            CURLcode cc = m->data.result;
            req_finish(q, cc);
            if (!q->res->ok) failed++;
            req_free(q, multi);
            in_flight--;
            done++;
            finished++;
            t_end = ms_now_s();
            if (rcfg->progress) rcfg->progress(rcfg->progress_ctx, done, failed, n);
        }
        if (finished || done == n) continue;
        int wait_ms = 100;
        if (next < n && (rcfg->max_concurrency <= 0 || in_flight < rcfg->max_concurrency)) {
            double dt = t0 + arrive[next] - ms_now_s();
            wait_ms = dt <= 0 ? 0 : (int)MS_MIN(100.0, ceil(dt * 1e3));
        }
        if (wait_ms > 0) curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
    }
    out->duration_s = t_end - t0;
out:
    if (qs)
        for (size_t i = 0; i < n; i++)
            if (qs[i].easy || qs[i].body) req_free(&qs[i], multi);
    curl_slist_free_all(hdr);
    if (multi) curl_multi_cleanup(multi);
    free(qs);
    free(arrive);
    return rc;
}
