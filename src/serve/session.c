/* session.c — per-connection output processing (session.h): channel → detok →
 * stop strings → reasoning/tool split → SSE frames or a JSON body.
 * Runs only on the connection's own thread. */
#include "serve/session.h"

#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TAKE_BATCH 64

static void buf_add(char **b, size_t *n, size_t *cap, const char *s, size_t k, int *oom)
{
    if (!k || *oom) return;
    size_t need;
    if (!ms_add_size(*n, k + 1, &need)) {
        *oom = 1;
        return;
    }
    if (need > *cap) {
        size_t c = *cap ? *cap : 512;
        while (c < need) c *= 2;
        char *t = realloc(*b, c);
        if (!t) {
            *oom = 1;
            return;
        }
        *b = t;
        *cap = c;
    }
    memcpy(*b + *n, s, k);
    *n += k;
    (*b)[*n] = 0;
}

static void emit_frame(ms_session *s, json_t *obj)
{
    size_t n = 0;
    json_t *ch = json_array_get(json_object_get(obj, "choices"), 0);
    if (ch && s->index) json_object_set_new(ch, "index", json_integer(s->index));
    char *f = ms_api_sse_frame(obj, &n);
    json_decref(obj);
    if (!f) return;
    buf_add(&s->out, &s->n_out, &s->cap_out, f, n, &s->oom);
    free(f);
}

int ms_session_init(ms_session *s, ms_api_req *api, ms_serve_req *req, ms_serve_hub *hub,
                    ms_metrics *metrics, const ms_serve_codec *codec, const char *model_name,
                    int64_t n_prompt)
{
    memset(s, 0, sizeof *s);
    s->api = *api;
    memset(api, 0, sizeof *api);
    s->req = req;
    s->hub = hub;
    s->metrics = metrics;
    s->codec = codec;
    s->n_prompt = n_prompt;
    s->stop_string = -1;
    s->created = (int64_t)time(NULL);
    snprintf(s->id, sizeof s->id, "%s", req->rid);
    snprintf(s->model, sizeof s->model, "%s", s->api.model[0] ? s->api.model : model_name);
    int rc =
        ms_detok_init(&s->detok, codec, s->api.skip_special_tokens, s->api.stops, s->api.n_stops);
    if (rc) return rc;
    rc = ms_chat_parser_init(&s->chat, s->api.separate_reasoning, s->api.starts_in_reasoning,
                             s->api.parse_tools);
    if (rc) return rc;
    if (s->api.logprobs) {
        if (s->api.kind == MS_API_COMPLETION)
            s->lp = json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs",
                              "text_offset");
        else
            s->lp = json_array();
    }
    s->out_ids = json_array();
    return 0;
}

void ms_session_deinit(ms_session *s)
{
    if (!s) return;
    ms_api_req_deinit(&s->api);
    ms_serve_req_unref(s->req);
    ms_detok_deinit(&s->detok);
    ms_chat_parser_deinit(&s->chat);
    free(s->text);
    free(s->chunk);
    free(s->out);
    json_decref(s->lp);
    json_decref(s->out_ids);
    memset(s, 0, sizeof *s);
}

/* Logprob entries of one token batch, in the route's format. */
static json_t *lp_piece(ms_session *s, const ms_serve_tok *t, size_t k, const int64_t *text_off)
{
    if (!s->api.logprobs) return NULL;
    if (s->api.kind == MS_API_CHAT) {
        json_t *arr = json_array();
        for (size_t i = 0; i < k; i++)
            json_array_append_new(arr,
                                  ms_api_chat_logprob(s->codec, &t[i], s->api.top_logprobs > 0));
        json_array_extend(s->lp, arr);
        return json_pack("{s:o}", "content", arr);
    }
    if (s->api.kind == MS_API_COMPLETION) {
        json_t *p = json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs",
                              "text_offset");
        for (size_t i = 0; i < k; i++) {
            json_t *e = ms_api_chat_logprob(s->codec, &t[i], 1);
            json_array_append(json_object_get(p, "tokens"), json_object_get(e, "token"));
            json_array_append_new(json_object_get(p, "token_logprobs"), json_real(t[i].logprob));
            json_t *top = json_object();
            size_t j;
            json_t *te;
            json_array_foreach(json_object_get(e, "top_logprobs"), j, te)
                json_object_set(top, json_string_value(json_object_get(te, "token")),
                                json_object_get(te, "logprob"));
            json_array_append_new(json_object_get(p, "top_logprobs"), top);
            json_array_append_new(json_object_get(p, "text_offset"),
                                  json_integer((json_int_t)text_off[i]));
            json_decref(e);
        }
        const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
        for (int q = 0; q < 4; q++)
            json_array_extend(json_object_get(s->lp, keys[q]), json_object_get(p, keys[q]));
        return p;
    }
    for (size_t i = 0; i < k; i++) /* SGLang: [logprob, token_id, null] */
        json_array_append_new(s->lp, json_pack("[f,i,n]", (double)t[i].logprob, t[i].id));
    return NULL;
}

static json_t *generate_meta(ms_session *s)
{
    json_t *fr = json_null();
    if (s->finish) {
        const char *type = s->finish == MS_SERVE_FINISH_STOP     ? "stop"
                           : s->finish == MS_SERVE_FINISH_LENGTH ? "length"
                           : s->finish == MS_SERVE_FINISH_ABORT  ? "abort"
                                                                 : "error";
        fr = json_pack("{s:s}", "type", type);
        if (s->stop_string >= 0)
            json_object_set_new(fr, "matched", json_string(s->api.stops[s->stop_string]));
        else if (s->finish == MS_SERVE_FINISH_STOP && ms_serve_req_matched_stop(s->req) >= 0)
            json_object_set_new(fr, "matched", json_integer(ms_serve_req_matched_stop(s->req)));
        if (s->finish >= MS_SERVE_FINISH_ABORT)
            json_object_set_new(fr, "message", json_string(ms_serve_req_finish_msg(s->req)));
    }
    json_t *m =
        json_pack("{s:s,s:o,s:I,s:I,s:I}", "id", s->id, "finish_reason", fr, "prompt_tokens",
                  (json_int_t)s->n_prompt, "completion_tokens", (json_int_t)s->n_taken,
                  "cached_tokens", (json_int_t)ms_serve_req_cached_tokens(s->req));
    if (s->finish)
        json_object_set_new(m, "e2e_latency", json_real(ms_now_s() - s->req->t_arrival_s));
    if (s->lp) json_object_set(m, "output_token_logprobs", s->lp);
    int32_t vct, acc;
    ms_serve_req_spec(s->req, &vct, &acc);
    if (vct > 0) { /* speculative decoding (SGLang's names) */
        json_object_set_new(m, "spec_verify_ct", json_integer(vct));
        json_object_set_new(m, "spec_accepted_tokens", json_integer(acc));
    }
    return m;
}

/* The first chat chunk carries the assistant role (OpenAI's stream shape); once. */
static void send_role(ms_session *s)
{
    if (s->sent_role) return;
    s->sent_role = 1;
    emit_frame(s, ms_api_chat_chunk(s->id, s->created, s->model,
                                    json_pack("{s:s,s:s}", "role", "assistant", "content", ""),
                                    NULL, NULL));
}

/* Handles a text delta (after stop strings) for the stream and the totals. */
static void on_text(ms_session *s, const char *d, size_t n, int last, json_t *lp)
{
    buf_add(&s->text, &s->n_text, &s->cap_text, d, n, &s->oom);
    if (!s->api.stream) {
        if (s->api.kind == MS_API_CHAT) {
            ms_chat_delta cd;
            ms_chat_parser_feed(&s->chat, d, n, last, &cd);
            ms_chat_delta_clear(&cd);
        }
        json_decref(lp);
        return;
    }
    if (s->api.kind == MS_API_CHAT) {
        send_role(s);
        ms_chat_delta cd;
        ms_chat_parser_feed(&s->chat, d, n, last, &cd);
        if (cd.reasoning || cd.content || cd.tool_calls || lp) {
            json_t *delta = json_object();
            if (cd.reasoning)
                json_object_set_new(delta, "reasoning_content", json_string(cd.reasoning));
            if (cd.content) json_object_set_new(delta, "content", json_string(cd.content));
            if (cd.tool_calls) json_object_set(delta, "tool_calls", cd.tool_calls);
            emit_frame(s, ms_api_chat_chunk(s->id, s->created, s->model, delta, NULL, lp));
        }
        ms_chat_delta_clear(&cd);
        return;
    }
    if (s->api.kind == MS_API_COMPLETION) {
        if (n || lp)
            emit_frame(s, ms_api_completion_chunk(s->id, s->created, s->model, d, n, NULL, lp));
        else
            json_decref(lp);
        return;
    }
    json_decref(lp);
    if (n) /* SGLang /generate streams the cumulative text */
        emit_frame(s, json_pack("{s:s%,s:o,s:i}", "text", s->text ? s->text : "", s->n_text,
                                "meta_info", generate_meta(s), "index", 0));
}

static void finish_stream(ms_session *s)
{
    int tools = s->chat.n_calls > 0;
    const char *fr = ms_api_finish_str(s->finish, tools);
    if (s->finish == MS_SERVE_FINISH_ERROR && s->api.kind != MS_API_GENERATE) {
        char *eb = ms_api_error_body(ms_serve_req_error_status(s->req),
                                     ms_serve_req_finish_msg(s->req), NULL);
        if (eb) {
            buf_add(&s->out, &s->n_out, &s->cap_out, "data: ", 6, &s->oom);
            buf_add(&s->out, &s->n_out, &s->cap_out, eb, strlen(eb), &s->oom);
            buf_add(&s->out, &s->n_out, &s->cap_out, "\n\n", 2, &s->oom);
        }
        free(eb);
    } else if (s->api.kind == MS_API_CHAT) {
        send_role(s);
        emit_frame(s, ms_api_chat_chunk(s->id, s->created, s->model, json_object(), fr, NULL));
    } else if (s->api.kind == MS_API_COMPLETION) {
        emit_frame(s, ms_api_completion_chunk(s->id, s->created, s->model, "", 0, fr, NULL));
    } else {
        emit_frame(s, json_pack("{s:s%,s:o,s:i}", "text", s->text ? s->text : "", s->n_text,
                                "meta_info", generate_meta(s), "index", 0));
    }
    if (s->quiet_end) return;
    if (s->api.include_usage && s->api.kind != MS_API_GENERATE) {
        json_t *u =
            ms_api_usage(s->n_prompt, (int64_t)s->n_taken, ms_serve_req_cached_tokens(s->req));
        json_t *c =
            json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", s->id, "object",
                      s->api.kind == MS_API_CHAT ? "chat.completion.chunk" : "text_completion",
                      "created", (json_int_t)s->created, "model", s->model, "choices", "usage", u);
        emit_frame(s, c);
    }
    buf_add(&s->out, &s->n_out, &s->cap_out, "data: [DONE]\n\n", 14, &s->oom);
}

static void done(ms_session *s, int kind)
{
    s->finish = kind;
    const char *d;
    size_t n;
    ms_detok_flush(&s->detok, &d, &n);
    if (s->detok.stopped && s->stop_string < 0) s->stop_string = s->detok.stop_index;
    on_text(s, d, n, 1, NULL);
    if (s->api.no_stop_trim && s->stop_string >= 0) {
        const char *st = s->api.stops[s->stop_string];
        on_text(s, st, strlen(st), 1, NULL);
    }
    if (s->api.stream) finish_stream(s);
    double now = ms_now_s(), t1 = ms_serve_req_t_first_token(s->req);
    ms_metrics_observe_request(
        s->metrics, s->n_prompt, (int64_t)s->n_taken, ms_serve_req_cached_tokens(s->req),
        t1 > 0 ? t1 - s->req->t_arrival_s : -1.0, now - s->req->t_arrival_s, kind);
}

void ms_session_abandon(ms_session *s)
{
    if (s->finish) return;
    s->finish = MS_SERVE_FINISH_ABORT;
    double t1 = ms_serve_req_t_first_token(s->req);
    ms_metrics_observe_request(s->metrics, s->n_prompt, (int64_t)s->n_taken,
                               ms_serve_req_cached_tokens(s->req),
                               t1 > 0 ? t1 - s->req->t_arrival_s : -1.0,
                               ms_now_s() - s->req->t_arrival_s, MS_SERVE_FINISH_ABORT);
}

int ms_session_step(ms_session *s, int timeout_ms)
{
    if (s->finish) return 1;
    ms_serve_tok toks[TAKE_BATCH];
    int fin = 0;
    /* --stream-interval N: the first token alone, then one chunk per N tokens */
    size_t group = !s->api.stream || s->stream_interval <= 1 ? 0
                   : s->n_taken == 0                         ? 1
                                     : (size_t)MS_MIN(s->stream_interval, TAKE_BATCH);
    size_t k = ms_serve_req_take_min(s->req, s->n_taken, group ? group : 1, toks,
                                     group ? group : TAKE_BATCH, timeout_ms, &fin);
    if (group && k < group && !fin) return 0; /* timed out short of a chunk: wait on */
    if (k) {
        double now = ms_now_s();
        if (s->n_taken > 0 && s->t_prev > 0)
            ms_metrics_observe_itl(s->metrics, now - s->t_prev, (int64_t)k);
        s->t_prev = now;
    }
    int64_t offs[TAKE_BATCH]; /* completions' text_offset: characters before each token */
    int stopped = 0;
    size_t used = 0;
    const char *d;
    size_t n;
    for (size_t i = 0; i < k && !stopped; i++) {
        json_array_append_new(s->out_ids, json_integer(toks[i].id));
        for (; s->off_bytes < s->detok.n_text; s->off_bytes++) /* code points, as OpenAI's */
            s->off_chars += ((unsigned char)s->detok.text[s->off_bytes] & 0xc0) != 0x80;
        offs[used] = s->off_chars;
        used++;
        int rc = ms_detok_push(&s->detok, toks[i].id, &d, &n);
        if (rc < 0) { /* a token id outside the codec: an engine bug; end the request */
            ms_serve_hub_post(s->hub, MS_MSG_ABORT, s->req);
            s->n_taken += used;
            done(s, MS_SERVE_FINISH_ERROR);
            return 1;
        }
        stopped = rc == 1;
        if (group)
            buf_add(&s->chunk, &s->n_chunk, &s->cap_chunk, d, n, &s->oom);
        else
            on_text(s, d, n, 0, NULL);
    }
    s->n_taken += used;
    if (group) { /* one frame: the chunk's text with its logprobs */
        on_text(s, s->chunk ? s->chunk : "", s->n_chunk, 0,
                used ? lp_piece(s, toks, used, offs) : NULL);
        s->n_chunk = 0;
    } else if (used) {
        json_t *lp = lp_piece(s, toks, used, offs);
        if (lp && s->api.stream)
            on_text(s, "", 0, 0, lp);
        else
            json_decref(lp);
    }
    if (stopped) {
        s->stop_string = s->detok.stop_index;
        ms_serve_hub_post(s->hub, MS_MSG_ABORT, s->req); /* the engine stops generating */
        done(s, MS_SERVE_FINISH_STOP);
        return 1;
    }
    if (fin && k == used) {
        /* a stop token counts as generated but its text is not shown */
        done(s, fin);
        return 1;
    }
    return 0;
}

char *ms_session_body(ms_session *s, int *status, size_t *len)
{
    json_t *o = NULL;
    *status = 200;
    if (s->finish == MS_SERVE_FINISH_ERROR) {
        *status = ms_serve_req_error_status(s->req);
        char *b = ms_api_error_body(*status, ms_serve_req_finish_msg(s->req), NULL);
        *len = b ? strlen(b) : 0;
        return b;
    }
    int tools = s->chat.n_calls > 0;
    const char *fr = ms_api_finish_str(s->finish, tools);
    json_t *usage =
        ms_api_usage(s->n_prompt, (int64_t)s->n_taken, ms_serve_req_cached_tokens(s->req));
    if (s->api.kind == MS_API_CHAT) {
        json_t *msg = json_pack("{s:s}", "role", "assistant");
        json_object_set_new(msg, "content",
                            s->chat.content ? json_string(s->chat.content)
                            : tools         ? json_null()
                                            : json_string(""));
        if (s->api.separate_reasoning)
            json_object_set_new(msg, "reasoning_content",
                                s->chat.reasoning ? json_string(s->chat.reasoning) : json_null());
        if (tools) json_object_set(msg, "tool_calls", s->chat.all_calls);
        json_t *lp = s->lp ? json_pack("{s:O}", "content", s->lp) : json_null();
        json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "message", msg, "logprobs", lp,
                                   "finish_reason", fr);
        if (s->stop_string >= 0)
            json_object_set_new(choice, "matched_stop", json_string(s->api.stops[s->stop_string]));
        o = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", s->id, "object", "chat.completion",
                      "created", (json_int_t)s->created, "model", s->model, "choices", choice,
                      "usage", usage);
    } else if (s->api.kind == MS_API_COMPLETION) {
        json_t *choice =
            json_pack("{s:i,s:s%,s:O?,s:s}", "index", 0, "text", s->text ? s->text : "", s->n_text,
                      "logprobs", s->lp, "finish_reason", fr);
        if (choice && !s->lp) json_object_set_new(choice, "logprobs", json_null());
        o = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", s->id, "object", "text_completion",
                      "created", (json_int_t)s->created, "model", s->model, "choices", choice,
                      "usage", usage);
    } else {
        json_decref(usage);
        o = json_pack("{s:s%,s:O,s:o}", "text", s->text ? s->text : "", s->n_text, "output_ids",
                      s->out_ids, "meta_info", generate_meta(s));
    }
    char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!b) {
        *status = 500;
        b = ms_api_error_body(500, "failed to format the response", NULL);
    }
    *len = b ? strlen(b) : 0;
    return b;
}

size_t ms_session_read(ms_session *s, char *buf, size_t max)
{
    size_t k = s->n_out - s->out_pos;
    if (k > max) k = max;
    memcpy(buf, s->out + s->out_pos, k);
    s->out_pos += k;
    if (s->out_pos == s->n_out) s->out_pos = s->n_out = 0;
    return k;
}

int ms_session_pending(const ms_session *s)
{
    return s->n_out > s->out_pos;
}
