/* openai.c — request parsing/validation and response formatting for the
 * OpenAI-compatible and SGLang-native routes (openai.h).  Every client field is
 * type- and range-checked here, with the field named in the error; sizes are
 * bounded by named limits.  Pure functions over jansson values; any thread.
 */
#include "serve/openai.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(param_, code_, ...)                                                                   \
    do {                                                                                           \
        if (param) *param = (param_);                                                              \
        rc = ms_err(e, (code_), __VA_ARGS__);                                                      \
        goto out;                                                                                  \
    } while (0)

#define FAILK(param_, code_)                                                                       \
    do {                                                                                           \
        if (param) *param = (param_);                                                              \
        rc = (code_);                                                                              \
        goto out;                                                                                  \
    } while (0)

static int get_bool(const json_t *o, const char *k, int *out, ms_errbuf *e)
{
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return ms_err(e, MS_EINVAL, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 1;
}

static int get_int(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out,
                   ms_errbuf *e)
{
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
        fabs(json_real_value(v)) < 9e15)
        *out = (int64_t)json_real_value(v);
    else if (json_is_integer(v))
        *out = json_integer_value(v);
    else
        return ms_err(e, MS_EINVAL, "'%s' must be an integer", k);
    if (*out < lo || *out > hi)
        return ms_err(e, MS_EINVAL, "'%s' must be between %lld and %lld, got %lld", k,
                      (long long)lo, (long long)hi, (long long)*out);
    return 1;
}

static int get_num(const json_t *o, const char *k, double lo, double hi, int lo_open, double *out,
                   ms_errbuf *e)
{
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return ms_err(e, MS_EINVAL, "'%s' must be a number", k);
    *out = json_number_value(v);
    if (!(*out >= lo && *out <= hi) || (lo_open && *out == lo))
        return ms_err(e, MS_EINVAL, "'%s' must be in %s%g, %g], got %g", k, lo_open ? "(" : "[", lo,
                      hi, *out);
    return 1;
}

/* Reads an integer array of token ids (bounded, in vocabulary). */
static int get_ids(const json_t *a, const char *name, int32_t vocab, int32_t **out, size_t *n,
                   ms_errbuf *e)
{
    size_t cnt = json_array_size(a);
    if (cnt > MS_SERVE_MAX_INPUT_TOKENS)
        return ms_err(e, MS_ETOOBIG, "'%s' has %zu ids, the limit is %d", name, cnt,
                      MS_SERVE_MAX_INPUT_TOKENS);
    int32_t *ids = malloc(sizeof *ids * (cnt ? cnt : 1));
    if (!ids) return ms_err(e, MS_ENOMEM, "out of memory");
    for (size_t i = 0; i < cnt; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) {
            free(ids);
            return ms_err(e, MS_EINVAL, "'%s[%zu]' must be an integer token id", name, i);
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || (vocab > 0 && id >= vocab)) {
            free(ids);
            return ms_err(e, MS_EINVAL,
                          "'%s[%zu]' = %lld is outside the vocabulary (vocab size %d)", name, i,
                          (long long)id, vocab);
        }
        ids[i] = (int32_t)id;
    }
    *out = ids;
    *n = cnt;
    return 0;
}

static int get_stops(ms_api_req *r, const json_t *v, ms_errbuf *e)
{
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return 0;
        if (json_string_length(v) > MS_SERVE_MAX_STOP_BYTES)
            return ms_err(e, MS_EINVAL, "'stop' strings are limited to %d bytes",
                          MS_SERVE_MAX_STOP_BYTES);
        r->stops[0] = strdup(json_string_value(v));
        if (!r->stops[0]) return ms_err(e, MS_ENOMEM, "out of memory");
        r->n_stops = 1;
        return 0;
    }
    if (!json_is_array(v))
        return ms_err(e, MS_EINVAL, "'stop' must be a string or an array of strings");
    if (json_array_size(v) > MS_SERVE_MAX_STOPS)
        return ms_err(e, MS_EINVAL, "'stop' has %zu entries, the limit is %d", json_array_size(v),
                      MS_SERVE_MAX_STOPS);
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s)
    {
        if (!json_is_string(s)) return ms_err(e, MS_EINVAL, "'stop[%zu]' must be a string", i);
        if (json_string_length(s) > MS_SERVE_MAX_STOP_BYTES)
            return ms_err(e, MS_EINVAL, "'stop[%zu]' is longer than %d bytes", i,
                          MS_SERVE_MAX_STOP_BYTES);
        if (json_string_length(s) == 0) continue;
        r->stops[r->n_stops] = strdup(json_string_value(s));
        if (!r->stops[r->n_stops]) return ms_err(e, MS_ENOMEM, "out of memory");
        r->n_stops++;
    }
    return 0;
}

/* Sampling fields this server does not have: a request that sets one is
 * refused naming it (never accepted and ignored).  Constrained decoding
 * (regex, json_schema, ebnf, structural_tag, response_format json_schema /
 * json_object) needs a grammar engine, which is not built. */
static const char *const refused[] = {"regex", "json_schema", "ebnf", "structural_tag"};

/* /generate's sampling_params keys (SGLang's SamplingParams takes no others:
 * an unknown key is a 400 there too); the OpenAI routes ignore unknown
 * top-level fields, as SGLang's request models do. */
static const char *const generate_keys[] = {"max_new_tokens",
                                            "temperature",
                                            "top_p",
                                            "top_k",
                                            "min_p",
                                            "frequency_penalty",
                                            "presence_penalty",
                                            "repetition_penalty",
                                            "seed",
                                            "ignore_eos",
                                            "skip_special_tokens",
                                            "no_stop_trim",
                                            "n",
                                            "stop",
                                            "stop_token_ids",
                                            "min_new_tokens",
                                            "logit_bias"};

static int refuse_unsupported(const json_t *o, int strict, ms_errbuf *e, const char **param)
{
    int rc = 0;
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const json_t *v = json_object_get(o, refused[i]);
        if (!v || json_is_null(v) || (json_is_object(v) && !json_object_size(v))) continue;
        FAIL(refused[i], MS_EUNSUPPORTED, "'%s' is not supported by this server", refused[i]);
    }
    const json_t *rf = json_object_get(o, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *t = json_string_value(json_object_get(rf, "type"));
        if (!t || strcmp(t, "text"))
            FAIL("response_format", MS_EUNSUPPORTED,
                 "'response_format' %s is not supported (constrained decoding is not built); "
                 "only {\"type\": \"text\"}",
                 t ? t : "without a type");
    }
    if (!strict) return 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v)
    {
        size_t j = 0;
        while (j < sizeof generate_keys / sizeof *generate_keys && strcmp(k, generate_keys[j])) j++;
        if (j == sizeof generate_keys / sizeof *generate_keys)
            FAIL("sampling_params", MS_EINVAL,
                 "sampling_params: unknown or unsupported key '%.64s'", k);
    }
out:
    return rc;
}

/* Sampling fields shared by every route, read from object o (the body or
 * /generate's sampling_params, strict: unknown keys refused).  max_key names
 * the max-tokens field. */
static int get_sampling(ms_api_req *r, const json_t *o, const char *max_key, const char *max_key2,
                        const ms_api_config *cfg, ms_errbuf *e, const char **param, int strict)
{
    int rc = 0;
    int64_t iv;
    double dv;
    ms_req_params *s = &r->params;
    if ((rc = refuse_unsupported(o, strict, e, param))) return rc;
    const char *keys[2] = {max_key, max_key2};
    for (int k = 0; k < 2; k++) {
        if (!keys[k]) continue;
        if ((rc = get_int(o, keys[k], 1, INT32_MAX, &iv, e)) < 0) FAILK(keys[k], MS_EINVAL);
        if (rc) {
            s->max_new = iv;
            r->max_tokens_given = 1;
        }
    }
    if ((rc = get_num(o, "temperature", 0, 100, 0, &dv, e)) < 0) FAILK("temperature", MS_EINVAL);
    if (rc) s->samp.temperature = (float)dv;
    if ((rc = get_num(o, "top_p", 0, 1, 1, &dv, e)) < 0) FAILK("top_p", MS_EINVAL);
    if (rc) s->samp.top_p = (float)dv;
    if ((rc = get_int(o, "top_k", -1, INT32_MAX, &iv, e)) < 0) FAILK("top_k", MS_EINVAL);
    if (rc) s->samp.top_k = iv == 0 ? -1 : (int32_t)iv;
    if ((rc = get_num(o, "min_p", 0, 1, 0, &dv, e)) < 0) FAILK("min_p", MS_EINVAL);
    if (rc) s->samp.min_p = (float)dv;
    if ((rc = get_num(o, "frequency_penalty", -2, 2, 0, &dv, e)) < 0)
        FAILK("frequency_penalty", MS_EINVAL);
    if (rc) s->samp.frequency_penalty = (float)dv;
    if ((rc = get_num(o, "presence_penalty", -2, 2, 0, &dv, e)) < 0)
        FAILK("presence_penalty", MS_EINVAL);
    if (rc) s->samp.presence_penalty = (float)dv;
    if ((rc = get_num(o, "repetition_penalty", 0, 2, 1, &dv, e)) < 0)
        FAILK("repetition_penalty", MS_EINVAL);
    if (rc) s->samp.repetition_penalty = (float)dv;
    if ((rc = get_int(o, "seed", INT64_MIN, INT64_MAX, &iv, e)) < 0) FAILK("seed", MS_EINVAL);
    if (rc) {
        s->seed = (uint64_t)iv;
        r->seed_given = 1;
    }
    if ((rc = get_bool(o, "ignore_eos", &s->ignore_eos, e)) < 0) FAILK("ignore_eos", MS_EINVAL);
    if ((rc = get_bool(o, "skip_special_tokens", &r->skip_special_tokens, e)) < 0)
        FAILK("skip_special_tokens", MS_EINVAL);
    if ((rc = get_bool(o, "no_stop_trim", &r->no_stop_trim, e)) < 0)
        FAILK("no_stop_trim", MS_EINVAL);
    r->n = 1;
    if ((rc = get_int(o, "n", 1, strict ? 1 : MS_API_MAX_N, &iv, e)) < 0)
        FAIL("n", MS_EINVAL,
             strict ? "'n' > 1 is supported on /v1/chat/completions and /v1/completions"
                    : "'n' must be between 1 and %d",
             MS_API_MAX_N);
    if (rc) r->n = (int)iv;
    if ((rc = get_stops(r, json_object_get(o, "stop"), e)) < 0) FAILK("stop", rc);
    /* min_tokens (OpenAI routes, vLLM's name) / min_new_tokens (SGLang's sampling_params) */
    const char *min_key =
        max_key && !strcmp(max_key, "max_new_tokens") ? "min_new_tokens" : "min_tokens";
    if ((rc = get_int(o, min_key, 0, INT32_MAX, &iv, e)) < 0) FAILK(min_key, MS_EINVAL);
    if (rc) s->min_new = iv;
    if (r->max_tokens_given && s->min_new > s->max_new)
        FAIL(min_key, MS_EINVAL, "'%s' (%lld) exceeds the maximum tokens (%lld)", min_key,
             (long long)s->min_new, (long long)s->max_new);
    const json_t *lb = json_object_get(o, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb))
            FAIL("logit_bias", MS_EINVAL, "'logit_bias' must be an object {\"token id\": bias}");
        if (json_object_size(lb) > MS_SERVE_MAX_LOGIT_BIAS)
            FAIL("logit_bias", MS_EINVAL, "'logit_bias' has %zu entries, the limit is %d",
                 json_object_size(lb), MS_SERVE_MAX_LOGIT_BIAS);
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)lb, k, v)
        {
            char *end;
            long long id = strtoll(k, &end, 10);
            if (!*k || *end || id < 0 || (cfg->vocab_size > 0 && id >= cfg->vocab_size))
                FAIL("logit_bias", MS_EINVAL,
                     "'logit_bias' key '%.32s' is not a token id in the vocabulary (vocab size %d)",
                     k, cfg->vocab_size);
            double b = json_number_value(v);
            if (!json_is_number(v) || !(b >= -100 && b <= 100))
                FAIL("logit_bias", MS_EINVAL,
                     "'logit_bias' values must be numbers in [-100, 100] (token %lld)", id);
            s->bias_ids[s->n_bias] = (int32_t)id;
            s->bias[s->n_bias++] = (float)b;
        }
    }
    const json_t *sid = json_object_get(o, "stop_token_ids");
    if (sid && !json_is_null(sid)) {
        if (!json_is_array(sid))
            FAIL("stop_token_ids", MS_EINVAL, "'stop_token_ids' must be an array");
        if (json_array_size(sid) > MS_SERVE_MAX_STOP_IDS)
            FAIL("stop_token_ids", MS_EINVAL, "'stop_token_ids' is limited to %d ids",
                 MS_SERVE_MAX_STOP_IDS);
        int32_t *ids = NULL;
        size_t n = 0;
        if ((rc = get_ids(sid, "stop_token_ids", cfg->vocab_size, &ids, &n, e)) < 0)
            FAILK("stop_token_ids", rc);
        memcpy(s->stop_ids, ids, n * sizeof *ids);
        s->n_stop_ids = (int)n;
        free(ids);
    }
    rc = 0;
out:
    return rc;
}

static int parse_chat(ms_api_req *r, json_t *b, const ms_api_config *cfg, ms_errbuf *e,
                      const char **param)
{
    int rc = 0;
    if ((rc = get_sampling(r, b, "max_tokens", "max_completion_tokens", cfg, e, param, 0)))
        return rc;
    int lp = 0;
    int64_t top = 0;
    if ((rc = get_bool(b, "logprobs", &lp, e)) < 0) FAILK("logprobs", MS_EINVAL);
    if ((rc = get_int(b, "top_logprobs", 0, MS_SERVE_MAX_TOP_LOGPROBS, &top, e)) < 0)
        FAILK("top_logprobs", MS_EINVAL);
    if (top > 0 && !lp) FAIL("top_logprobs", MS_EINVAL, "'top_logprobs' requires 'logprobs': true");
    r->logprobs = lp;
    r->top_logprobs = (int)top;
    ms_chat_opts o = {.thinking = -1, .add_generation_prompt = 1, .format = cfg->chat_format};
    int explicit_thinking = cfg->reasoning_parser == MS_REASONING_DEEPSEEK_V3 ||
                            cfg->reasoning_parser == MS_REASONING_DEEPSEEK_V4;
    if (explicit_thinking || o.format == MS_CHAT_FMT_V4) o.thinking = 0;
    const char *effort = NULL;
    const json_t *re = json_object_get(b, "reasoning_effort");
    if (re && !json_is_null(re)) {
        if (!json_is_string(re))
            FAIL("reasoning_effort", MS_EINVAL, "'reasoning_effort' must be a string");
        effort = json_string_value(re);
    }
    const json_t *kw = json_object_get(b, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            FAIL("chat_template_kwargs", MS_EINVAL, "'chat_template_kwargs' must be an object");
        int th = 0;
        if ((rc = get_bool(kw, "thinking", &th, e)) < 0) FAILK("chat_template_kwargs", MS_EINVAL);
        if (rc) o.thinking = th;
        if ((rc = get_bool(kw, "enable_thinking", &th, e)) < 0)
            FAILK("chat_template_kwargs", MS_EINVAL);
        if (rc) o.thinking = th;
        /* SGLang: chat_template_kwargs.reasoning_effort overrides the top-level field */
        const json_t *kre = json_object_get(kw, "reasoning_effort");
        if (kre && !json_is_null(kre)) {
            if (!json_is_string(kre))
                FAIL("chat_template_kwargs", MS_EINVAL,
                     "'chat_template_kwargs.reasoning_effort' must be a string");
            effort = json_string_value(kre);
        }
    }
    /* V4 knows high and max (only max adds a prompt); other levels (OpenAI's
     * low/medium...) are dropped, as SGLang drops them.  Effort never turns
     * thinking on: chat_template_kwargs.thinking does. */
    if (effort && !strcmp(effort, "max"))
        o.effort = MS_CHAT_EFFORT_MAX;
    else if (effort && !strcmp(effort, "high"))
        o.effort = MS_CHAT_EFFORT_HIGH;
    int agp = 1;
    if ((rc = get_bool(b, "add_generation_prompt", &agp, e)) < 0)
        FAILK("add_generation_prompt", MS_EINVAL);
    o.add_generation_prompt = agp;
    const json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        FAIL("tools", MS_EINVAL, "'tools' must be an array");
    const json_t *tc = json_object_get(b, "tool_choice");
    int tool_none = json_is_string(tc) && !strcmp(json_string_value(tc), "none");
    if (tc && !json_is_null(tc) && !json_is_string(tc) && !json_is_object(tc))
        FAIL("tool_choice", MS_EINVAL, "'tool_choice' must be a string or an object");
    const json_t *msgs = json_object_get(b, "messages");
    if (!msgs) FAIL("messages", MS_EINVAL, "'messages' is required");
    /* V4 (SGLang's dsv4 path): the request's tools are rendered whatever tool_choice says */
    const json_t *shown = tool_none && o.format != MS_CHAT_FMT_V4 ? NULL : tools;
    if ((rc = ms_chat_render(msgs, shown, &o, &r->text, &r->n_text, e))) FAILK("messages", rc);
    r->parse_special = 1;
    int sep = 1;
    if ((rc = get_bool(b, "separate_reasoning", &sep, e)) < 0)
        FAILK("separate_reasoning", MS_EINVAL);
    r->separate_reasoning = sep && cfg->reasoning_parser != MS_REASONING_OFF;
    r->starts_in_reasoning = cfg->reasoning_parser == MS_REASONING_DEEPSEEK_R1 || o.thinking == 1;
    int syntax = cfg->tool_parser == MS_TOOL_PARSER_DEEPSEEK_V4    ? MS_TOOLS_DSML
                 : cfg->tool_parser == MS_TOOL_PARSER_DEEPSEEK_V31 ? MS_TOOLS_V31
                                                                   : MS_TOOLS_NONE;
    r->parse_tools = !tool_none && tools && json_array_size(tools) > 0 ? syntax : MS_TOOLS_NONE;
    rc = 0;
out:
    return rc;
}

int ms_api_chat_format(const char *family, int tool_parser)
{
    if (tool_parser == MS_TOOL_PARSER_DEEPSEEK_V4) return MS_CHAT_FMT_V4;
    return family && !strcmp(family, "deepseek_v4") ? MS_CHAT_FMT_V4 : MS_CHAT_FMT_V3;
}

static int parse_prompt(ms_api_req *r, const json_t *p, const char *name, const ms_api_config *cfg,
                        ms_errbuf *e)
{
    if (json_is_string(p)) {
        r->text = strdup(json_string_value(p));
        r->n_text = json_string_length(p);
        return r->text ? 0 : ms_err(e, MS_ENOMEM, "out of memory");
    }
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        return parse_prompt(r, json_array_get(p, 0), name, cfg, e);
    if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0)))
        return get_ids(p, name, cfg->vocab_size, &r->ids, &r->n_ids, e);
    if (json_is_array(p) && json_array_size(p) > 1)
        return ms_err(e, MS_EUNSUPPORTED,
                      "'%s': batches of prompts are not supported; send one "
                      "prompt per request",
                      name);
    return ms_err(e, MS_EINVAL, "'%s' must be a string or an array of token ids", name);
}

int ms_api_parse(ms_api_req *r, enum ms_api_kind kind, const char *body, size_t len,
                 const ms_api_config *cfg, ms_errbuf *e, const char **param)
{
    int rc = 0;
    memset(r, 0, sizeof *r);
    ms_req_params_init(&r->params);
    r->kind = kind;
    r->skip_special_tokens = 1;
    if (param) *param = NULL;
    json_error_t je;
    json_t *b = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!b)
        FAIL(NULL, MS_EFORMAT, "malformed JSON: %s (line %d, column %d)", je.text, je.line,
             je.column);
    if (!json_is_object(b)) FAIL(NULL, MS_EINVAL, "the request body must be a JSON object");
    const json_t *m = json_object_get(b, "model");
    if (m && !json_is_null(m) && !json_is_string(m))
        FAIL("model", MS_EINVAL, "'model' must be a string");
    if (json_is_string(m)) snprintf(r->model, sizeof r->model, "%s", json_string_value(m));
    const json_t *rid = json_object_get(b, "rid");
    if (rid && !json_is_null(rid)) {
        if (!json_is_string(rid) || json_string_length(rid) >= MS_SERVE_RID_MAX ||
            json_string_length(rid) == 0)
            FAIL("rid", MS_EINVAL, "'rid' must be a non-empty string shorter than %d bytes",
                 MS_SERVE_RID_MAX);
        snprintf(r->rid, sizeof r->rid, "%s", json_string_value(rid));
    }
    if ((rc = get_bool(b, "stream", &r->stream, e)) < 0) FAILK("stream", MS_EINVAL);
    const json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            FAIL("stream_options", MS_EINVAL, "'stream_options' must be an object");
        if ((rc = get_bool(so, "include_usage", &r->include_usage, e)) < 0)
            FAILK("stream_options", MS_EINVAL);
        if ((rc = get_bool(so, "continuous_usage_stats", &r->continuous_usage, e)) < 0)
            FAILK("stream_options", MS_EINVAL);
    }
    if (kind == MS_API_CHAT) {
        if ((rc = parse_chat(r, b, cfg, e, param))) goto out;
    } else if (kind == MS_API_COMPLETION) {
        if ((rc = get_sampling(r, b, "max_tokens", NULL, cfg, e, param, 0))) goto out;
        r->params.max_new = r->max_tokens_given ? r->params.max_new : 16;
        r->max_tokens_given = 1; /* OpenAI's completions default is 16 */
        int64_t lp = 0;
        if ((rc = get_int(b, "logprobs", 0, MS_SERVE_MAX_TOP_LOGPROBS, &lp, e)) < 0)
            FAILK("logprobs", MS_EINVAL);
        if (rc) {
            r->logprobs = 1;
            r->top_logprobs = (int)lp;
        }
        int echo = 0;
        if ((rc = get_bool(b, "echo", &echo, e)) < 0) FAILK("echo", MS_EINVAL);
        if (echo) FAIL("echo", MS_EUNSUPPORTED, "'echo' is not supported");
        const json_t *sfx = json_object_get(b, "suffix");
        if (sfx && !json_is_null(sfx) && (!json_is_string(sfx) || json_string_length(sfx)))
            FAIL("suffix", MS_EUNSUPPORTED, "'suffix' is not supported");
        int64_t bo;
        if ((rc = get_int(b, "best_of", 1, 1, &bo, e)) < 0)
            FAIL("best_of", MS_EINVAL, "only best_of=1 is supported");
        const json_t *p = json_object_get(b, "prompt");
        if (!p) FAIL("prompt", MS_EINVAL, "'prompt' is required");
        if ((rc = parse_prompt(r, p, "prompt", cfg, e))) FAILK("prompt", rc);
    } else {
        const json_t *sp = json_object_get(b, "sampling_params");
        if (sp && !json_is_null(sp) && !json_is_object(sp))
            FAIL("sampling_params", MS_EINVAL, "'sampling_params' must be an object");
        if (json_is_object(sp) &&
            (rc = get_sampling(r, sp, "max_new_tokens", NULL, cfg, e, param, 1)))
            goto out;
        int lp = 0;
        if ((rc = get_bool(b, "return_logprob", &lp, e)) < 0) FAILK("return_logprob", MS_EINVAL);
        r->logprobs = lp;
        int64_t top = 0;
        if ((rc = get_int(b, "top_logprobs_num", 0, MS_SERVE_MAX_TOP_LOGPROBS, &top, e)) < 0)
            FAILK("top_logprobs_num", MS_EINVAL);
        r->top_logprobs = lp ? (int)top : 0;
        const json_t *t = json_object_get(b, "text"), *ids = json_object_get(b, "input_ids");
        if (t && json_is_null(t)) t = NULL;
        if (ids && json_is_null(ids)) ids = NULL;
        if (!!t == !!ids)
            FAIL("text", MS_EINVAL, "exactly one of 'text' and 'input_ids' is required");
        if (t && !json_is_string(t))
            FAIL("text", MS_EINVAL, "'text' must be a string (batches are not supported)");
        if (t && (rc = parse_prompt(r, t, "text", cfg, e))) FAILK("text", rc);
        if (ids && !json_is_array(ids))
            FAIL("input_ids", MS_EINVAL, "'input_ids' must be an array of token ids");
        if (ids && json_array_size(ids) && !json_is_integer(json_array_get(ids, 0)))
            FAIL("input_ids", MS_EUNSUPPORTED,
                 "'input_ids' must be one flat array (batches are not supported)");
        if (ids && (rc = get_ids(ids, "input_ids", cfg->vocab_size, &r->ids, &r->n_ids, e)))
            FAILK("input_ids", rc);
    }
    r->params.top_logprobs = r->logprobs ? r->top_logprobs : -1;
    if (!r->seed_given) r->params.seed = ms_serve_random_seed();
    rc = 0;
out:
    json_decref(b);
    return rc;
}

void ms_api_req_deinit(ms_api_req *r)
{
    if (!r) return;
    free(r->text);
    free(r->ids);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    memset(r, 0, sizeof *r);
}

int ms_api_check_input(ms_api_req *r, const int32_t *ids, size_t n_ids, const ms_api_config *cfg,
                       ms_errbuf *e)
{
    int64_t ctx = cfg->context_len, n = (int64_t)n_ids;
    if (n == 0) return ms_err(e, MS_EINVAL, "the prompt is empty");
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || (cfg->vocab_size > 0 && ids[i] >= cfg->vocab_size))
            return ms_err(e, MS_EINVAL, "input id %d is outside the vocabulary (vocab size %d)",
                          ids[i], cfg->vocab_size);
    if (n >= ctx)
        return ms_err(e, MS_ECONTEXT,
                      "The input (%lld tokens) is longer than the model's context length (%lld "
                      "tokens).",
                      (long long)n, (long long)ctx);
    if (!r->max_tokens_given) {
        int64_t room = ctx - 1 - n;
        if (r->kind != MS_API_GENERATE || r->params.max_new > room)
            r->params.max_new = room < 1 ? 1 : room > INT32_MAX ? INT32_MAX : room;
        return 0;
    }
    int64_t m = r->params.max_new;
    if (m + n >= ctx)
        return ms_err(e, MS_ECONTEXT,
                      "Requested token count exceeds the model's maximum context length of %lld "
                      "tokens. You requested a total of %lld tokens: %lld tokens from the input "
                      "messages and %lld tokens for the completion. Please reduce the number of "
                      "tokens in the input messages or the completion to fit within the limit.",
                      (long long)ctx, (long long)(m + n), (long long)n, (long long)m);
    return 0;
}

static const char *err_type(int status)
{
    switch (status) {
    case 400:
        return "BadRequestError";
    case 401:
        return "AuthenticationError";
    case 404:
        return "NotFoundError";
    case 405:
        return "MethodNotAllowedError";
    case 408:
        return "RequestTimeoutError";
    case 413:
        return "RequestTooLargeError";
    case 503:
        return "ServiceUnavailableError";
    default:
        return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}

char *ms_api_error_body(int http_status, const char *message, const char *param)
{
    json_t *o =
        json_pack("{s:s,s:{s:s?,s:s,s:s?,s:i}}", "object", "error", "error", "message", message,
                  "type", err_type(http_status), "param", param, "code", http_status);
    if (!o) /* a message that is not valid UTF-8 */
        o = json_pack("{s:s,s:{s:s,s:s,s:n,s:i}}", "object", "error", "error", "message",
                      "invalid request", "type", err_type(http_status), "param", "code",
                      http_status);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

const char *ms_api_finish_str(int kind, int has_tool_calls)
{
    switch (kind) {
    case MS_SERVE_FINISH_STOP:
        return has_tool_calls ? "tool_calls" : "stop";
    case MS_SERVE_FINISH_LENGTH:
        return "length";
    case MS_SERVE_FINISH_ABORT:
        return "abort";
    case MS_SERVE_FINISH_ERROR:
        return "error";
    default:
        return NULL;
    }
}

json_t *ms_api_usage(int64_t prompt, int64_t completion, int64_t cached)
{
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)prompt,
                     "completion_tokens", (json_int_t)completion, "total_tokens",
                     (json_int_t)(prompt + completion), "prompt_tokens_details", "cached_tokens",
                     (json_int_t)cached);
}

/* A token's text as a JSON string (lossy for partial UTF-8) plus its raw bytes. */
static json_t *token_entry(const ms_serve_codec *c, int32_t id, float lp)
{
    char buf[MS_SERVE_MAX_TOKEN_BYTES];
    size_t n = 0;
    if (c->token_bytes(c->ctx, id, buf, sizeof buf, &n) || n > sizeof buf) n = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(bytes, json_integer((unsigned char)buf[i]));
    json_t *tok = json_stringn(buf, n);
    if (!tok) tok = json_string("\xef\xbf\xbd");
    return json_pack("{s:o,s:f,s:o}", "token", tok, "logprob", (double)lp, "bytes", bytes);
}

json_t *ms_api_chat_logprob(const ms_serve_codec *c, const ms_serve_tok *t, int with_top)
{
    json_t *o = token_entry(c, t->id, t->logprob);
    json_t *top = json_array();
    for (int32_t j = 0; with_top && j < t->n_top; j++)
        if (t->top_ids[j] >= 0)
            json_array_append_new(top, token_entry(c, t->top_ids[j], t->top_lps[j]));
    json_object_set_new(o, "top_logprobs", top);
    return o;
}

json_t *ms_api_chat_chunk(const char *id, int64_t created, const char *model, json_t *delta,
                          const char *finish, json_t *logprobs)
{
    json_t *choice =
        json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta ? delta : json_object(),
                  "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
                  finish ? json_string(finish) : json_null());
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", id, "object", "chat.completion.chunk",
                     "created", (json_int_t)created, "model", model, "choices", choice);
}

json_t *ms_api_completion_chunk(const char *id, int64_t created, const char *model,
                                const char *text, size_t n_text, const char *finish,
                                json_t *logprobs)
{
    json_t *choice =
        json_pack("{s:i,s:s%,s:o,s:o}", "index", 0, "text", text ? text : "",
                  text ? n_text : (size_t)0, "logprobs", logprobs ? logprobs : json_null(),
                  "finish_reason", finish ? json_string(finish) : json_null());
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", id, "object", "text_completion", "created",
                     (json_int_t)created, "model", model, "choices", choice);
}

char *ms_api_sse_frame(const json_t *obj, size_t *len)
{
    char *j = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    if (!j) return NULL;
    size_t n = strlen(j);
    char *f = malloc(n + 9);
    if (f) {
        memcpy(f, "data: ", 6);
        memcpy(f + 6, j, n);
        memcpy(f + 6 + n, "\n\n", 3);
        *len = n + 8;
    }
    free(j);
    return f;
}
