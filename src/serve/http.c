/* http.c — the libmicrohttpd front end (http.h): routing, auth, body limits,
 * timeouts, generation (blocking wait or SSE via a content-reader callback),
 * client-disconnect aborts, health, info, load, flush, abort, metrics,
 * watchdog and drain.  Threads: MHD runs one thread per connection (plus its
 * accept thread); each connection thread owns its conn + session; the live
 * list and flags are shared under fe->mu / atomics.  Never touches MPI.
 */
#include "serve/http.h"

#include "base/log.h"
#include "base/util.h"
#include "moe/expert_recorder.h"
#include "serve/metrics.h"
#include "serve/choices.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum route {
    R_CHAT,
    R_COMPLETIONS,
    R_GENERATE,
    R_MODELS,
    R_HEALTH,
    R_HEALTH_GEN,
    R_SERVER_INFO,
    R_GET_SERVER_INFO,
    R_MODEL_INFO,
    R_LOAD,
    R_FLUSH,
    R_ABORT,
    R_METRICS,
    R_REC_START,
    R_REC_STOP,
    R_REC_DUMP,
    N_ROUTES
};
enum { M_GET = 1, M_POST = 2, M_PUT = 4 };

static const struct {
    const char *path;
    int methods;
    const char *allow;
} routes[N_ROUTES] = {
    [R_CHAT] = {"/v1/chat/completions", M_POST, "POST"},
    [R_COMPLETIONS] = {"/v1/completions", M_POST, "POST"},
    [R_GENERATE] = {"/generate", M_POST | M_PUT, "POST, PUT"},
    [R_MODELS] = {"/v1/models", M_GET, "GET"},
    [R_HEALTH] = {"/health", M_GET, "GET"},
    [R_HEALTH_GEN] = {"/health_generate", M_GET, "GET"},
    [R_SERVER_INFO] = {"/server_info", M_GET, "GET"},
    [R_GET_SERVER_INFO] = {"/get_server_info", M_GET, "GET"},
    [R_MODEL_INFO] = {"/get_model_info", M_GET, "GET"},
    [R_LOAD] = {"/get_load", M_GET, "GET"},
    [R_FLUSH] = {"/flush_cache", M_GET | M_POST, "GET, POST"},
    [R_ABORT] = {"/abort_request", M_POST, "POST"},
    [R_METRICS] = {"/metrics", M_GET, "GET"},
    [R_REC_START] = {"/start_expert_distribution_record", M_GET | M_POST, "GET, POST"},
    [R_REC_STOP] = {"/stop_expert_distribution_record", M_GET | M_POST, "GET, POST"},
    [R_REC_DUMP] = {"/dump_expert_distribution_record", M_GET | M_POST, "GET, POST"},
};

struct conn {
    ms_frontend *fe;
    struct MHD_Connection *mc;
    int route;
    int responded; /* a response was queued already */
    int too_big;
    double t_start;
    char *body;
    size_t n_body, cap_body;
    ms_choices *ch; /* generation routes, once submitted */
    struct conn *prev, *next;
    int listed;
};

/* Per-socket record for the header deadline: a connection that is between
 * requests (or before its first) for longer than the header timeout is shut
 * down, however slowly it trickles bytes (slowloris). */
struct watch {
    int fd;
    int in_request;     /* a request is being handled */
    int body_done;      /* ... and its body has arrived (the body deadline is met) */
    double phase_start; /* connect time, end of the last request, or (in_request) its headers */
    struct watch *prev, *next;
};

struct ms_frontend {
    ms_frontend_opts o;
    struct MHD_Daemon *d;
    ms_serve_hub *hub;
    const ms_serve_codec *codec;
    ms_metrics *metrics;
    ms_api_config cfg;
    char model_name[512];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct conn *live;
    int n_live;
    double busy_since;
    struct watch *watches; /* under mu */
    atomic_int draining, unhealthy, stop;
    atomic_ulong seq;
    pthread_t wd;
    int wd_started;
    int port;
};

/* ------------------------------------------------------------ responses */

static enum MHD_Result queue(struct conn *c, int status, char *body, size_t len, const char *ctype)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    ms_metrics_observe_response(c->fe->metrics, c->route >= 0 ? routes[c->route].path : "other",
                                status);
    if (atomic_load(&c->fe->draining)) MHD_add_response_header(r, "Connection", "close");
    if (status == 405) MHD_add_response_header(r, "Allow", routes[c->route].allow);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    c->responded = 1;
    return ret;
}

static enum MHD_Result send_error(struct conn *c, int status, const char *msg, const char *param)
{
    char *b = ms_api_error_body(status, msg, param);
    return queue(c, status, b, b ? strlen(b) : 0, "application/json");
}

static enum MHD_Result send_json(struct conn *c, int status, json_t *o)
{
    char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!b) return send_error(c, 500, "failed to format the response", NULL);
    return queue(c, status, b, strlen(b), "application/json");
}

static int status_of(int rc)
{
    int s = ms_error_http_status(rc);
    return s == 499 ? 400 : s;
}

/* ------------------------------------------------------------ live list */

static void live_add(ms_frontend *fe, struct conn *c)
{
    pthread_mutex_lock(&fe->mu);
    c->next = fe->live;
    c->prev = NULL;
    if (fe->live) fe->live->prev = c;
    fe->live = c;
    if (fe->n_live++ == 0) fe->busy_since = ms_now_s();
    c->listed = 1;
    pthread_mutex_unlock(&fe->mu);
}

static void live_remove(ms_frontend *fe, struct conn *c)
{
    pthread_mutex_lock(&fe->mu);
    if (c->listed) {
        if (c->prev)
            c->prev->next = c->next;
        else
            fe->live = c->next;
        if (c->next) c->next->prev = c->prev;
        fe->n_live--;
        c->listed = 0;
        pthread_cond_broadcast(&fe->cv);
    }
    pthread_mutex_unlock(&fe->mu);
}

/* ------------------------------------------------------------ helpers */

/* True when the peer closed its side (checked while we wait for tokens). */
static int client_gone(struct conn *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return 1;
    char ch;
    return recv(ci->connect_fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static int auth_ok(ms_frontend *fe, struct MHD_Connection *mc)
{
    if (!fe->o.api_key[0]) return 1;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
    /* the scheme is case-insensitive (RFC 9110 11.1), then one or more spaces */
    if (!h || strncasecmp(h, "Bearer", 6) || (h[6] != ' ' && h[6] != '\t')) return 0;
    h += 6;
    while (*h == ' ' || *h == '\t') h++;
    size_t a = strlen(h), b = strlen(fe->o.api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned)(h[i < a ? i : 0] ^ fe->o.api_key[i]);
    return diff == 0;
}

static void make_rid(ms_frontend *fe, enum ms_api_kind kind, char *out, size_t cap)
{
    unsigned long n = atomic_fetch_add(&fe->seq, 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t st = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ n;
    uint64_t h = ms_rng_next(&st);
    snprintf(out, cap, "%s%016llx%04lx",
             kind == MS_API_CHAT         ? "chatcmpl-"
             : kind == MS_API_COMPLETION ? "cmpl-"
                                         : "",
             (unsigned long long)h, n & 0xffff);
}

/* ------------------------------------------------------------ generation */

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct conn *c = cls;
    ms_choices *ch = c->ch;
    (void)pos;
    for (;;) {
        if (ms_choices_pending(ch)) return (ssize_t)ms_choices_read(ch, buf, max);
        if (ms_choices_finished(ch) && (ch->n == 1 || ch->tail_done))
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (client_gone(c)) return MHD_CONTENT_READER_END_WITH_ERROR; /* completion aborts */
        if (ms_choices_step(ch, 250) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static enum MHD_Result do_generate(ms_frontend *fe, struct conn *c, enum ms_api_kind kind)
{
    ms_api_req api;
    ms_errbuf e = {{0}};
    const char *param = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = ms_api_parse(&api, kind, c->body ? c->body : "", c->n_body, &fe->cfg, &e, &param);
    if (rc) goto fail;
    if (api.text) {
        rc = fe->codec->encode(fe->codec->ctx, api.text, api.n_text, api.parse_special, &ids, &n,
                               &e);
        if (rc) {
            param = kind == MS_API_CHAT         ? "messages"
                    : kind == MS_API_COMPLETION ? "prompt"
                                                : "text";
            goto fail;
        }
    } else {
        ids = api.ids;
        n = api.n_ids;
        api.ids = NULL;
    }
    if ((rc = ms_api_check_input(&api, ids, n, &fe->cfg, &e))) {
        param = kind == MS_API_CHAT         ? "messages"
                : kind == MS_API_COMPLETION ? "max_tokens"
                                            : "sampling_params";
        goto fail;
    }
    int32_t dp = -1;
    const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "X-Data-Parallel-Rank");
    if (h) {
        char *end;
        long v = strtol(h, &end, 10);
        if (end == h || *end || v < 0 || v >= ms_serve_hub_info(fe->hub)->n_dp) {
            rc = ms_err(&e, MS_EINVAL, "X-Data-Parallel-Rank must be an integer in [0, %d)",
                        ms_serve_hub_info(fe->hub)->n_dp);
            goto fail;
        }
        dp = (int32_t)v;
    }
    if (atomic_load(&fe->draining)) {
        rc = ms_err(&e, MS_EBUSY, "the server is shutting down");
        goto fail;
    }
    char rid[MS_SERVE_RID_MAX];
    if (api.rid[0])
        snprintf(rid, sizeof rid, "%s", api.rid);
    else
        make_rid(fe, kind, rid, sizeof rid);
    int32_t max_new = (int32_t)api.params.max_new;
    c->ch = calloc(1, sizeof *c->ch);
    if (!c->ch) {
        rc = ms_err(&e, MS_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = ms_choices_init(c->ch, &api, ids, (int32_t)n, rid, dp, fe->hub, fe->metrics,
                              fe->codec, fe->model_name, &e))) {
        free(c->ch);
        c->ch = NULL;
        goto fail;
    }
    free(ids);
    ids = NULL;
    for (int i = 0; i < c->ch->n; i++) c->ch->s[i].stream_interval = fe->o.stream_interval;
    live_add(fe, c);
    if ((rc = ms_choices_submit(c->ch, fe->o.max_queued_requests, &e))) {
        live_remove(fe, c);
        return send_error(c, status_of(rc), e.msg, NULL);
    }
    MS_LOG(MS_DEBUG, "http", "request %s: %zu prompt tokens, max_new_tokens %d, %d choices", rid, n,
           max_new, c->ch->n);
    /* generation may take long: the idle timeout no longer applies */
    MHD_set_connection_option(c->mc, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (ms_choices_stream(c->ch)) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_cb, c, NULL);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        ms_metrics_observe_response(fe->metrics, routes[c->route].path, 200);
        enum MHD_Result ret = MHD_queue_response(c->mc, 200, resp);
        MHD_destroy_response(resp);
        c->responded = 1;
        return ret;
    }
    for (;;) {
        int d = ms_choices_step(c->ch, 250);
        if (d) break;
        if (client_gone(c)) return MHD_NO; /* completion posts the abort */
    }
    int status;
    size_t len;
    char *body = ms_choices_body(c->ch, &status, &len);
    return queue(c, status, body, len, "application/json");
fail:
    free(ids);
    ms_api_req_deinit(&api);
    return send_error(c, status_of(rc), e.msg, param);
}

/* ------------------------------------------------------------ other routes */

static enum MHD_Result do_health_generate(ms_frontend *fe, struct conn *c)
{
    if (atomic_load(&fe->draining) || atomic_load(&fe->unhealthy))
        return send_error(c, 503, "unhealthy", NULL);
    ms_req_params s;
    ms_req_params_init(&s);
    s.max_new = 1;
    s.samp.temperature = 0;
    char rid[64];
    snprintf(rid, sizeof rid, "HEALTH_CHECK_%lu", atomic_fetch_add(&fe->seq, 1));
    int32_t zero = 0;
    ms_serve_req *r = ms_serve_req_new(rid, &zero, 1, &s);
    if (!r) return send_error(c, 503, "out of memory", NULL);
    r->is_health_check = 1;
    uint64_t beats = ms_serve_hub_heartbeats(fe->hub);
    double t_end = ms_now_s() + fe->o.health_timeout_s;
    int ok = 0;
    if (ms_serve_hub_submit(fe->hub, r, 0, NULL) == 0) {
        while (!ok && ms_now_s() < t_end) {
            ms_serve_tok t;
            int fin = 0;
            size_t k = ms_serve_req_take(r, 0, &t, 1, 100, &fin);
            /* like SGLang: any engine progress after the probe started counts */
            ok = k > 0 || (fin && fin != MS_SERVE_FINISH_ERROR) ||
                 ms_serve_hub_heartbeats(fe->hub) != beats;
        }
        if (!ms_serve_req_finished(r)) ms_serve_hub_post(fe->hub, MS_MSG_ABORT, r);
    }
    ms_serve_req_unref(r);
    if (!ok) return send_error(c, 503, "the engine did not respond to a health probe", NULL);
    return queue(c, 200, NULL, 0, "text/plain");
}

static json_t *load_json(ms_frontend *fe)
{
    const ms_engine_info *in = ms_serve_hub_info(fe->hub);
    ms_dp_load ld[MS_SERVE_MAX_DP];
    ms_serve_hub_read_load(fe->hub, ld, in->n_dp);
    json_t *a = json_array();
    for (int32_t r = 0; r < in->n_dp; r++)
        json_array_append_new(
            a, json_pack(
                   "{s:i,s:i,s:i,s:i,s:I,s:I,s:f,s:f,s:f,s:I}", "dp_rank", r, "num_running_reqs",
                   ld[r].num_running_reqs, "num_waiting_reqs", ld[r].num_waiting_reqs, "num_reqs",
                   ld[r].num_running_reqs + ld[r].num_waiting_reqs, "num_used_tokens",
                   (json_int_t)ld[r].num_used_tokens, "max_total_num_tokens",
                   (json_int_t)in->max_total_num_tokens[r], "token_usage", ld[r].token_usage,
                   "cache_hit_rate", ld[r].cache_hit_rate, "gen_throughput", ld[r].gen_throughput,
                   "num_retracted_reqs", (json_int_t)ld[r].num_retracted_reqs_total));
    for (int32_t r = 0; r < in->n_dp; r++) /* 1 + accepted drafts per verify step (0: none yet) */
        json_object_set_new(json_array_get(a, (size_t)r), "avg_spec_accept_length",
                            json_real(ld[r].spec_verify_total > 0
                                          ? 1.0 + (double)ld[r].spec_accepted_total /
                                                      (double)ld[r].spec_verify_total
                                          : 0.0));
    return a;
}

/* A max_position_embeddings-long request's attention cost on each rank of its
 * attention group (cache/kv_spec.h ms_kv_spec_cost): per decode token the cache
 * bytes read and FLOPs, the prefill's FLOPs, each by pool (those read). */
static json_t *cost_json(const ms_engine_info *in)
{
    const ms_kv_cost *c = &in->max_position_cost;
    json_t *rb = json_object(), *pf = json_object();
    for (int i = 0; i < in->n_kv_streams; i++) {
        if (c->read_bytes[i] <= 0 && c->prefill_flops_of[i] <= 0) continue;
        json_object_set_new(rb, in->kv_stream_names[i], json_real(c->read_bytes[i]));
        json_object_set_new(pf, in->kv_stream_names[i], json_real(c->prefill_flops_of[i]));
    }
    return json_pack("{s:I,s:f,s:o,s:f,s:f,s:o,s:s}", "tokens",
                     (json_int_t)in->max_position_embeddings, "decode_read_bytes",
                     c->read_bytes_total, "decode_read_bytes_by_pool", rb, "decode_flops",
                     c->decode_flops, "prefill_flops", c->prefill_flops, "prefill_flops_by_pool",
                     pf, "scope", "attention and indexer over the KV cache; weights not included");
}

static json_t *server_info(ms_frontend *fe)
{
    const ms_engine_info *in = ms_serve_hub_info(fe->hub);
    json_t *cap = json_array();
    for (int32_t r = 0; r < in->n_dp; r++)
        json_array_append_new(cap, json_integer((json_int_t)in->max_total_num_tokens[r]));
    const char *rp[] = {NULL, "deepseek-r1", "deepseek-v3", "deepseek-v4"};
    const char *tp[] = {NULL, "deepseekv31", "deepseekv4"};
    json_t *o = json_pack(
        "{s:s,s:s,s:I,s:i,s:s,s:{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:b},s:o,s:i,s:i,s:i,s:i,s:i,"
        "s:b,s:i,s:i,s:s?,s:s?,s:b,s:i,s:s,s:s}",
        "model_path", in->model_path, "served_model_name", fe->model_name, "context_length",
        (json_int_t)in->context_len, "page_size", in->page_size, "dtype", in->dtype, "layout",
        "description", in->layout, "tp_size", in->tp_size, "dp_size", in->dp_size, "ep_size",
        in->ep_size, "pp_size", in->pp_size, "attn_dp_size", in->attn_dp_size, "attn_tp_size",
        in->attn_tp_size, "moe_tp_size", in->moe_tp_size, "kv_pool_replicated",
        in->kv_pool_replicated, "max_total_num_tokens_per_dp_rank", cap, "max_running_requests",
        in->max_running_requests, "max_running_requests_per_dp_rank",
        in->max_running_requests_per_rank, "chunked_prefill_size", in->chunked_prefill_size,
        "chunked_prefill_size_per_dp_rank", in->chunked_prefill_size_per_rank, "max_prefill_tokens",
        in->max_prefill_tokens, "kv_pool_replicated", in->kv_pool_replicated, "attn_dp_size",
        in->attn_dp_size, "attn_tp_size", in->attn_tp_size, "reasoning_parser",
        rp[fe->o.reasoning_parser], "tool_call_parser", tp[fe->o.tool_call_parser],
        "enable_metrics", fe->o.enable_metrics, "max_queued_requests", fe->o.max_queued_requests,
        "version", "moeserve", "load_balance_method", in->load_balance_method);
    if (o) {
        /* the per-DP-rank capacity as SGLang's scalar (every DP rank has the same pool
         * size), next to the list; the topology fields above say what it means */
        json_object_set_new(
            o, "max_total_num_tokens",
            json_integer((json_int_t)(in->n_dp > 0 ? in->max_total_num_tokens[0] : 0)));
        json_object_set_new(o, "internal_states", load_json(fe));
        json_t *pools = json_array(); /* every DP rank holds these pools (kv_pool_replicated:
                                       * the attention-TP members hold the same tokens) */
        for (int i = 0; i < in->n_kv_pools; i++) {
            const ms_kv_pool_info *p = &in->kv_pools[i];
            json_array_append_new(
                pools,
                json_pack("{s:s,s:i,s:I,s:I,s:I,s:i,s:f,s:f}", "name", p->name, "pages", p->pages,
                          "page_tokens", (json_int_t)p->page_tokens, "tokens",
                          (json_int_t)p->tokens, "window", (json_int_t)p->window, "num_layers",
                          p->n_layers, "entry_bytes", p->entry_bytes, "bytes", p->bytes));
        }
        json_object_set_new(o, "kv_pools_per_dp_rank", pools);
        json_object_set_new(o, "num_dp_ranks", json_integer(in->n_dp));
        json_object_set_new(o, "swa_full_tokens_ratio",
                            in->swa_full_tokens_ratio > 0 ? json_real(in->swa_full_tokens_ratio)
                                                          : json_null());
        json_object_set_new(o, "max_position_embeddings",
                            json_integer((json_int_t)in->max_position_embeddings));
        json_object_set_new(o, "max_concurrency_per_dp_rank",
                            json_pack("{s:I,s:f,s:I,s:f}", "context_length",
                                      (json_int_t)in->context_len, "requests",
                                      in->max_concurrency_ctx, "max_position_embeddings",
                                      (json_int_t)in->max_position_embeddings,
                                      "requests_at_max_position", in->max_concurrency_max_pos));
        json_object_set_new(o, "max_position_cost_per_attention_rank", cost_json(in));
        json_object_set_new(o, "ep_num_redundant_experts", json_integer(in->n_redundant_experts));
        json_object_set_new(o, "num_physical_experts", json_integer(in->n_physical_experts));
        json_object_set_new(o, "enable_eplb", json_boolean(in->enable_eplb));
        json_object_set_new(o, "eplb_staging_bytes",
                            json_integer((json_int_t)in->eplb_staging_bytes));
        json_object_set_new(o, "weight_bytes_per_rank",
                            json_integer((json_int_t)in->weight_bytes_rank0));
        ms_dp_load ld[MS_SERVE_MAX_DP];
        ms_serve_hub_read_load(fe->hub, ld, in->n_dp);
        int64_t v = 0, a = 0;
        for (int32_t r = 0; r < in->n_dp; r++)
            v += ld[r].spec_verify_total, a += ld[r].spec_accepted_total;
        json_object_set_new(o, "avg_spec_accept_length",
                            json_real(v > 0 ? 1.0 + (double)a / (double)v : 0.0));
    }
    return o;
}

static enum MHD_Result do_flush(ms_frontend *fe, struct conn *c)
{
    ms_req_params s;
    ms_req_params_init(&s);
    ms_serve_req *r = ms_serve_req_new("FLUSH_CACHE", NULL, 0, &s);
    if (!r) return send_error(c, 503, "out of memory", NULL);
    int fin = 0;
    if (ms_serve_hub_post(fe->hub, MS_MSG_FLUSH_CACHE, r) == 0) {
        ms_serve_tok t;
        double t_end = ms_now_s() + 10;
        while (!fin && ms_now_s() < t_end) ms_serve_req_take(r, 0, &t, 1, 100, &fin);
    }
    enum MHD_Result ret;
    if (fin == MS_SERVE_FINISH_STOP) {
        char *b = strdup("Cache flushed.\n");
        ret = queue(c, 200, b, b ? strlen(b) : 0, "text/plain");
    } else if (fin) {
        ret = send_error(c, 400,
                         ms_serve_req_finish_msg(r)[0] ? ms_serve_req_finish_msg(r)
                                                       : "cache not flushed: requests are running",
                         NULL);
    } else {
        ret = send_error(c, 503, "the engine did not answer the flush request", NULL);
    }
    ms_serve_req_unref(r);
    return ret;
}

static enum MHD_Result do_abort(ms_frontend *fe, struct conn *c)
{
    json_error_t je;
    json_t *b = json_loadb(c->body ? c->body : "", c->n_body, 0, &je);
    if (!json_is_object(b)) {
        json_decref(b);
        return send_error(c, 400, "the body must be a JSON object {\"rid\": ...}", NULL);
    }
    const json_t *rid = json_object_get(b, "rid");
    int all = json_is_true(json_object_get(b, "abort_all"));
    if (!all && !json_is_string(rid)) {
        json_decref(b);
        return send_error(c, 400, "'rid' must be a string (or send \"abort_all\": true)", "rid");
    }
    int n = 0;
    pthread_mutex_lock(&fe->mu);
    for (struct conn *x = fe->live; x; x = x->next)
        if (x->ch) n += ms_choices_abort(x->ch, all ? NULL : json_string_value(rid));
    pthread_mutex_unlock(&fe->mu);
    if (all) ms_serve_hub_post(fe->hub, MS_MSG_ABORT_ALL, NULL);
    json_decref(b);
    return send_json(c, 200, json_pack("{s:i}", "aborted", n));
}

/* SGLang's recorder endpoints; the dump is JSON in the response (SGLang writes a .pt
 * file on the server, which C cannot produce: a body naming a .pt path is refused). */
static enum MHD_Result do_recorder(ms_frontend *fe, struct conn *c)
{
    ms_expert_recorder *r = ms_serve_hub_info(fe->hub)->recorder;
    if (!r)
        return send_error(c, 400,
                          "the expert distribution recorder is off: start the server with "
                          "--expert-distribution-recorder-mode stat|per_pass|per_token",
                          NULL);
    if (c->route == R_REC_START)
        ms_expert_recorder_start(r);
    else if (c->route == R_REC_STOP)
        ms_expert_recorder_stop(r);
    else {
        if (c->n_body && memmem(c->body, c->n_body, ".pt", 3))
            return send_error(c, 400,
                              "a .pt (torch pickle) dump cannot be written here: the dump is "
                              "returned as JSON with SGLang's field names (logical_count, "
                              "physical_to_logical_map)",
                              NULL);
        return send_json(c, 200, ms_expert_recorder_dump(r));
    }
    return send_json(c, 200, json_pack("{s:b}", "success", 1));
}

static enum MHD_Result dispatch(ms_frontend *fe, struct conn *c)
{
    switch (c->route) {
    case R_CHAT:
        return do_generate(fe, c, MS_API_CHAT);
    case R_COMPLETIONS:
        return do_generate(fe, c, MS_API_COMPLETION);
    case R_GENERATE:
        return do_generate(fe, c, MS_API_GENERATE);
    case R_HEALTH:
        if (atomic_load(&fe->draining) || atomic_load(&fe->unhealthy))
            return send_error(c, 503, "unhealthy", NULL);
        return queue(c, 200, NULL, 0, "text/plain");
    case R_HEALTH_GEN:
        return do_health_generate(fe, c);
    case R_MODELS: {
        const ms_engine_info *in = ms_serve_hub_info(fe->hub);
        return send_json(c, 200,
                         json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:s,s:I}]}", "object", "list", "data",
                                   "id", fe->model_name, "object", "model", "created",
                                   (json_int_t)time(NULL), "owned_by", "moeserve", "root",
                                   in->model_path, "max_model_len", (json_int_t)in->context_len));
    }
    case R_SERVER_INFO:
    case R_GET_SERVER_INFO:
        return send_json(c, 200, server_info(fe));
    case R_MODEL_INFO:
        return send_json(c, 200,
                         json_pack("{s:s,s:s,s:b}", "model_path",
                                   ms_serve_hub_info(fe->hub)->model_path, "tokenizer_path",
                                   ms_serve_hub_info(fe->hub)->model_path, "is_generation", 1));
    case R_LOAD:
        return send_json(c, 200, load_json(fe));
    case R_FLUSH:
        return do_flush(fe, c);
    case R_ABORT:
        return do_abort(fe, c);
    case R_REC_START:
    case R_REC_STOP:
    case R_REC_DUMP:
        return do_recorder(fe, c);
    case R_METRICS: {
        char *t = NULL;
        size_t len = 0;
        if (ms_metrics_render(fe->metrics, fe->hub, &t, &len))
            return send_error(c, 500, "metrics rendering failed", NULL);
        return queue(c, 200, t, len, "text/plain; version=0.0.4");
    }
    default:
        return send_error(c, 404, "not found", NULL);
    }
}

/* A request with Transfer-Encoding is answered when its headers arrive:
 * libmicrohttpd 0.9.75 would decode a chunked body itself, and answers a
 * chunk line longer than its 64 KiB buffer with its own 500, and a huge
 * declared chunk (2^64-1, 4 GiB) with nothing until the idle timeout; it
 * cannot let the handler answer in the middle of a body.  So chunked bodies
 * get 411 (RFC 9112 6.3 allows a server to require Content-Length, which
 * every OpenAI and SGLang client sends), other codings 501. */
static enum MHD_Result refuse_coding(struct conn *c, const char *te)
{
    while (*te == ' ' || *te == '\t') te++;
    size_t n = strlen(te);
    while (n && (te[n - 1] == ' ' || te[n - 1] == '\t')) n--;
    char msg[200];
    if (n == 7 && !strncasecmp(te, "chunked", 7))
        return send_error(c, 411,
                          "a request body needs Content-Length (chunked request bodies are not "
                          "accepted)",
                          NULL);
    snprintf(msg, sizeof msg, "Transfer-Encoding '%.*s' is not supported (send Content-Length)",
             (int)(n < 64 ? n : 64), te);
    return send_error(c, 501, msg, NULL);
}

/* The body deadline is met (the watchdog stops timing it). */
static void body_arrived(ms_frontend *fe, struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *sc =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (!sc || !sc->socket_context) return;
    pthread_mutex_lock(&fe->mu);
    ((struct watch *)sc->socket_context)->body_done = 1;
    pthread_mutex_unlock(&fe->mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    ms_frontend *fe = cls;
    struct conn *c = *con_cls;
    (void)version;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        *con_cls = c;
        c->fe = fe;
        c->mc = mc;
        c->t_start = ms_now_s();
        c->route = -1;
        const union MHD_ConnectionInfo *sc =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        if (sc && sc->socket_context) {
            pthread_mutex_lock(&fe->mu);
            struct watch *w = sc->socket_context;
            w->in_request = 1;
            w->body_done = 0;
            w->phase_start = c->t_start;
            pthread_mutex_unlock(&fe->mu);
        }
        for (int i = 0; i < N_ROUTES; i++)
            if (!strcmp(url, routes[i].path)) c->route = i;
        int m = !strcmp(method, "GET")    ? M_GET
                : !strcmp(method, "POST") ? M_POST
                : !strcmp(method, "PUT")  ? M_PUT
                                          : 0;
        if (c->route < 0 || (c->route == R_METRICS && !fe->o.enable_metrics))
            return send_error(c, 404, "not found", NULL);
        if (!(routes[c->route].methods & m)) return send_error(c, 405, "method not allowed", NULL);
        if (c->route != R_HEALTH && c->route != R_HEALTH_GEN && !auth_ok(fe, mc))
            return send_error(c, 401, "invalid or missing API key", NULL);
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        const char *te = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Transfer-Encoding");
        if (cl && te) return send_error(c, 400, "both Content-Length and Transfer-Encoding", NULL);
        if (te) return refuse_coding(c, te);
        if (cl && strtoull(cl, NULL, 10) > fe->o.max_body_bytes) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes",
                     fe->o.max_body_bytes);
            return send_error(c, 413, msg, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t k = *upload_size;
        *upload_size = 0;
        if (c->responded) return MHD_YES;
        if (ms_now_s() - c->t_start > fe->o.body_timeout_s) return MHD_NO; /* too slow: close */
        if (c->too_big || c->n_body + k > fe->o.max_body_bytes) {
            c->too_big = 1;
            return MHD_YES;
        }
        if (c->n_body + k + 1 > c->cap_body) {
            size_t cap = c->cap_body ? c->cap_body : 4096;
            while (cap < c->n_body + k + 1) cap *= 2;
            char *t = realloc(c->body, cap);
            if (!t) return MHD_NO;
            c->body = t;
            c->cap_body = cap;
        }
        memcpy(c->body + c->n_body, upload, k);
        c->n_body += k;
        c->body[c->n_body] = 0;
        return MHD_YES;
    }
    body_arrived(fe, mc);
    if (c->responded) return MHD_YES;
    if (c->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes",
                 fe->o.max_body_bytes);
        return send_error(c, 413, msg, NULL);
    }
    return dispatch(fe, c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    ms_frontend *fe = cls;
    struct conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    live_remove(fe, c);
    const union MHD_ConnectionInfo *sc =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (sc && sc->socket_context) {
        pthread_mutex_lock(&fe->mu);
        struct watch *w = sc->socket_context;
        w->in_request = 0;
        w->phase_start = ms_now_s();
        pthread_mutex_unlock(&fe->mu);
    }
    if (c->ch) /* a keep-alive connection gets its idle timeout back */
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT,
                                  (unsigned)fe->o.idle_timeout_s);
    if (c->ch) {
        if (ms_choices_abandon(c->ch))
            MS_LOG(MS_INFO, "http", "client of request %s went away (code %d): aborting",
                   c->ch->s[0].id, (int)toe);
        ms_choices_deinit(c->ch);
        free(c->ch);
    }
    free(c->body);
    free(c);
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    ms_frontend *fe = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct watch *w = calloc(1, sizeof *w);
        if (!w || !ci) {
            free(w);
            return;
        }
        w->fd = ci->connect_fd;
        w->phase_start = ms_now_s();
        pthread_mutex_lock(&fe->mu);
        w->next = fe->watches;
        if (fe->watches) fe->watches->prev = w;
        fe->watches = w;
        pthread_mutex_unlock(&fe->mu);
        *socket_context = w;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        struct watch *w = *socket_context; /* removed before MHD closes the fd */
        pthread_mutex_lock(&fe->mu);
        if (w->prev)
            w->prev->next = w->next;
        else
            fe->watches = w->next;
        if (w->next) w->next->prev = w->prev;
        pthread_mutex_unlock(&fe->mu);
        free(w);
        *socket_context = NULL;
    }
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    MS_LOG(MS_DEBUG, "http", "mhd: %s", line);
}

/* ------------------------------------------------------------ watchdog */

static void *watchdog(void *arg)
{
    ms_frontend *fe = arg;
    pthread_mutex_lock(&fe->mu);
    while (!atomic_load(&fe->stop)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&fe->cv, &fe->mu, &ts);
        double now = ms_now_s();
        for (struct watch *w = fe->watches; w; w = w->next) {
            if (w->fd < 0) continue;
            if (!w->in_request && now - w->phase_start > fe->o.header_timeout_s)
                MS_LOG(MS_DEBUG, "http",
                       "closing a connection that sent no complete request in %d s",
                       fe->o.header_timeout_s);
            else if (w->in_request && !w->body_done && now - w->phase_start > fe->o.body_timeout_s)
                MS_LOG(MS_DEBUG, "http", "closing a connection whose body took over %d s",
                       fe->o.body_timeout_s);
            else
                continue;
            shutdown(w->fd, SHUT_RDWR);
            w->fd = -1;
        }
        if (fe->o.watchdog_timeout_s <= 0 || fe->n_live == 0) continue;
        double beat = ms_serve_hub_last_heartbeat_s(fe->hub);
        double since = beat > fe->busy_since ? beat : fe->busy_since;
        if (ms_now_s() - since > fe->o.watchdog_timeout_s && !atomic_load(&fe->unhealthy)) {
            atomic_store(&fe->unhealthy, 1);
            MS_LOG(MS_ERROR, "http",
                   "watchdog: no engine step for %.0f s with %d requests in flight; exiting "
                   "(unless MOESERVE_WATCHDOG_NO_EXIT is set)",
                   ms_now_s() - since, fe->n_live);
            if (!getenv("MOESERVE_WATCHDOG_NO_EXIT")) _exit(70);
        }
    }
    pthread_mutex_unlock(&fe->mu);
    return NULL;
}

/* ------------------------------------------------------------ lifecycle */

int ms_frontend_open(ms_frontend **out, const ms_frontend_opts *o, ms_serve_hub *hub,
                     const ms_serve_codec *codec, ms_errbuf *e)
{
    *out = NULL;
    ms_frontend *fe = calloc(1, sizeof *fe);
    if (!fe) return ms_err(e, MS_ENOMEM, "out of memory");
    fe->o = *o;
    fe->hub = hub;
    fe->codec = codec;
    const ms_engine_info *in = ms_serve_hub_info(hub);
    snprintf(fe->model_name, sizeof fe->model_name, "%s",
             o->served_model_name[0] ? o->served_model_name : in->model_path);
    fe->cfg.context_len = in->context_len;
    fe->cfg.vocab_size = in->vocab_size > 0 ? in->vocab_size : codec->vocab_size;
    fe->cfg.reasoning_parser = o->reasoning_parser;
    fe->cfg.tool_parser = o->tool_call_parser;
    fe->cfg.chat_format = ms_api_chat_format(in->model_family, o->tool_call_parser);
    pthread_mutex_init(&fe->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&fe->cv, &ca);
    pthread_condattr_destroy(&ca);
    fe->metrics = ms_metrics_new(fe->model_name);
    if (!fe->metrics) {
        ms_frontend_close(fe);
        return ms_err(e, MS_ENOMEM, "out of memory");
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, o->host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)o->port);
    } else if (inet_pton(AF_INET6, o->host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)o->port);
        flags |= MHD_USE_IPv6;
    } else {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        if (getaddrinfo(o->host, NULL, &hints, &ai) || !ai) {
            ms_frontend_close(fe);
            return ms_err(e, MS_EINVAL, "--host %s: cannot resolve", o->host);
        }
        memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        if (ai->ai_family == AF_INET6) {
            s6->sin6_port = htons((uint16_t)o->port);
            flags |= MHD_USE_IPv6;
        } else
            s4->sin_port = htons((uint16_t)o->port);
        freeaddrinfo(ai);
    }
    fe->d = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_request, fe, MHD_OPTION_SOCK_ADDR, &ss,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_connections_per_client,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->idle_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_THREAD_STACK_SIZE,
        (size_t)1 << 20, MHD_OPTION_NOTIFY_COMPLETED, on_completed, fe,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, fe, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, fe,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    if (!fe->d) {
        ms_frontend_close(fe);
        return ms_err(e, MS_EIO, "cannot listen on %s:%d (address in use or not permitted)",
                      o->host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(fe->d, MHD_DAEMON_INFO_BIND_PORT);
    fe->port = di ? di->port : o->port;
    if (pthread_create(&fe->wd, NULL, watchdog, fe) == 0) fe->wd_started = 1;
    MS_LOG(MS_INFO, "http", "listening on http://%s:%d (model '%s')", o->host, fe->port,
           fe->model_name);
    *out = fe;
    return 0;
}

int ms_frontend_port(const ms_frontend *fe)
{
    return fe->port;
}

void ms_frontend_begin_drain(ms_frontend *fe)
{
    /* still listening: a new request gets 503 (and Connection: close), as /health does */
    if (!fe || atomic_exchange(&fe->draining, 1)) return;
    MS_LOG(MS_INFO, "http", "draining: %d requests in flight", ms_frontend_live_requests(fe));
}

int ms_frontend_live_requests(ms_frontend *fe)
{
    pthread_mutex_lock(&fe->mu);
    int n = fe->n_live;
    pthread_mutex_unlock(&fe->mu);
    return n;
}

void ms_frontend_close(ms_frontend *fe)
{
    if (!fe) return;
    atomic_store(&fe->draining, 1);
    pthread_mutex_lock(&fe->mu);
    for (struct conn *x = fe->live; x; x = x->next)
        if (x->ch) ms_choices_abort(x->ch, NULL);
    atomic_store(&fe->stop, 1);
    pthread_cond_broadcast(&fe->cv);
    pthread_mutex_unlock(&fe->mu);
    if (fe->wd_started) pthread_join(fe->wd, NULL);
    if (fe->d) MHD_stop_daemon(fe->d);
    ms_metrics_free(fe->metrics);
    pthread_cond_destroy(&fe->cv);
    pthread_mutex_destroy(&fe->mu);
    free(fe);
}
