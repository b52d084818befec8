/* chat.c — DeepSeek-V3/V3.1 chat format (chat.h): renders OpenAI messages into
 * the prompt text the tokenizer encodes (special markers written literally and
 * matched as special tokens), and parses generated text back into reasoning,
 * content and tool calls, incrementally for streams (V4's DSML tool calls are
 * chat_dsml.c's; the parser hands them over after the reasoning).
 * Follows the V3.1 tokenizer_config.json template: systems joined by "\n\n"
 * plus a "## Tools" section, <｜User｜>, <｜Assistant｜> + </think>|<think> after a
 * user turn, tool results as <｜tool▁output▁begin｜>…<｜tool▁output▁end｜>.
 * No shared state: any thread, one parser per stream.
 */
#include "serve/chat_priv.h"

#include "serve/detok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ms_chat_content_text(const json_t *c, size_t idx, struct sb *out, ms_errbuf *e)
{
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        sb_addn(out, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c))
        return ms_err(e, MS_EINVAL, "messages[%zu].content must be a string or an array of parts",
                      idx);
    size_t i;
    const json_t *part;
    json_array_foreach(c, i, part)
    {
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text))
            return ms_err(e, MS_EINVAL,
                          "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} "
                          "parts are supported",
                          idx, i);
        sb_addn(out, json_string_value(text), json_string_length(text));
    }
    return 0;
}

int ms_chat_check_calls(const json_t *calls, size_t idx, ms_errbuf *e)
{
    if (!json_is_array(calls))
        return ms_err(e, MS_EINVAL, "messages[%zu].tool_calls must be an array", idx);
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c)
    {
        if (!json_is_string(json_object_get(json_object_get(c, "function"), "name")))
            return ms_err(e, MS_EINVAL,
                          "messages[%zu].tool_calls[%zu].function.name must be a string", idx, i);
    }
    return 0;
}

static int render_tools(const json_t *tools, struct sb *b, ms_errbuf *e)
{
    if (!json_is_array(tools)) return ms_err(e, MS_EINVAL, "tools must be an array");
    if (json_array_size(tools) > MS_CHAT_MAX_TOOLS)
        return ms_err(e, MS_EINVAL, "tools: at most %d tools", MS_CHAT_MAX_TOOLS);
    sb_add(b, "## Tools\nYou have access to the following tools:\n");
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function");
        const json_t *name = json_object_get(fn, "name");
        const json_t *desc = json_object_get(fn, "description");
        const json_t *params = json_object_get(fn, "parameters");
        if (!json_is_object(fn) || !json_is_string(name))
            return ms_err(e, MS_EINVAL, "tools[%zu].function.name must be a string", i);
        if (desc && !json_is_string(desc) && !json_is_null(desc))
            return ms_err(e, MS_EINVAL, "tools[%zu].function.description must be a string", i);
        sb_add(b, "\n### ");
        sb_add(b, json_string_value(name));
        if (json_is_string(desc)) { /* no Description line without one, as the template does */
            sb_add(b, "\nDescription: ");
            sb_add(b, json_string_value(desc));
        }
        sb_add(b, "\n\nParameters: ");
        char *pj = params ? json_dumps(params, JSON_PRESERVE_ORDER | JSON_ENCODE_ANY) : NULL;
        sb_add(b, pj ? pj : "{}");
        free(pj);
        sb_add(b, "\n");
    }
    sb_add(b, "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n" MS_CHAT_CALLS_BEGIN
                  MS_CHAT_CALL_BEGIN "tool_call_name" MS_CHAT_SEP
              "tool_call_arguments" MS_CHAT_CALL_END "{{additional_tool_calls}}" MS_CHAT_CALLS_END
              "\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available "
              "tools\n- `tool_call_arguments` must be valid JSON that strictly follows the tool's "
              "Parameters Schema\n- For multiple tool calls, chain them directly without "
              "separators or spaces\n");
    return 0;
}

static int render_calls(const json_t *calls, size_t idx, struct sb *b, ms_errbuf *e)
{
    int rc = ms_chat_check_calls(calls, idx, e);
    if (rc) return rc;
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c)
    {
        const json_t *fn = json_object_get(c, "function");
        const json_t *name = json_object_get(fn, "name");
        const json_t *args = json_object_get(fn, "arguments");
        if (i == 0) sb_add(b, MS_CHAT_CALLS_BEGIN);
        sb_add(b, MS_CHAT_CALL_BEGIN);
        sb_add(b, json_string_value(name));
        sb_add(b, MS_CHAT_SEP);
        if (json_is_string(args)) {
            sb_add(b, json_string_value(args));
        } else if (args) {
            char *aj = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
            sb_add(b, aj ? aj : "{}");
            free(aj);
        }
        sb_add(b, MS_CHAT_CALL_END);
    }
    if (json_array_size(calls)) sb_add(b, MS_CHAT_CALLS_END);
    return 0;
}

int ms_chat_render(const json_t *messages, const json_t *tools, const ms_chat_opts *o, char **out,
                   size_t *out_len, ms_errbuf *e)
{
    if (o->format == MS_CHAT_FMT_V4) return ms_chat_render_v4(messages, tools, o, out, out_len, e);
    struct sb b = {0}, tmp = {0};
    int rc = 0;
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        rc = ms_err(e, MS_EINVAL, "messages must be a non-empty array");
        goto out;
    }
    if (json_array_size(messages) > MS_CHAT_MAX_MESSAGES) {
        rc = ms_err(e, MS_EINVAL, "messages: at most %d messages", MS_CHAT_MAX_MESSAGES);
        goto out;
    }
    sb_add(&b, MS_CHAT_BOS);
    /* all system prompts first, joined by blank lines, then the tool section */
    size_t i;
    const json_t *m;
    int n_sys = 0;
    json_array_foreach(messages, i, m)
    {
        const json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            rc = ms_err(e, MS_EINVAL, "messages[%zu].role must be a string", i);
            goto out;
        }
        if (strcmp(json_string_value(role), "system") &&
            strcmp(json_string_value(role), "developer"))
            continue;
        if (n_sys++) sb_add(&b, "\n\n");
        if ((rc = ms_chat_content_text(json_object_get(m, "content"), i, &b, e))) goto out;
    }
    if (tools && !json_is_null(tools) && json_array_size(tools) > 0) {
        sb_add(&b, "\n\n"); /* even without a system prompt, as the template does */
        if ((rc = render_tools(tools, &b, e))) goto out;
    }
    int last_user = 0, is_tool = 0;
    const char *think_tag = o->thinking < 0 ? "" : o->thinking ? MS_CHAT_THINK : MS_CHAT_THINK_END;
    const char *hist_tag = o->thinking < 0 ? "" : MS_CHAT_THINK_END;
    json_array_foreach(messages, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        tmp.n = 0;
        if (tmp.s) tmp.s[0] = 0;
        if ((rc = ms_chat_content_text(json_object_get(m, "content"), i, &tmp, e))) goto out;
        const char *text = tmp.s ? tmp.s : "";
        if (!strcmp(role, "system") || !strcmp(role, "developer")) continue;
        if (!strcmp(role, "user")) {
            sb_add(&b, MS_CHAT_USER);
            sb_add(&b, text);
            last_user = 1;
            is_tool = 0;
        } else if (!strcmp(role, "assistant")) {
            const json_t *calls = json_object_get(m, "tool_calls");
            if (last_user) {
                sb_add(&b, MS_CHAT_ASSISTANT);
                sb_add(&b, hist_tag);
            }
            last_user = 0;
            const char *end = strstr(text, MS_CHAT_THINK_END);
            if (end) text = end + strlen(MS_CHAT_THINK_END);
            sb_add(&b, text);
            if (calls && !json_is_null(calls) && (rc = render_calls(calls, i, &b, e))) goto out;
            sb_add(&b, MS_CHAT_EOS);
            is_tool = 0;
        } else if (!strcmp(role, "tool")) {
            sb_add(&b, MS_CHAT_OUTPUT_BEGIN);
            sb_add(&b, text);
            sb_add(&b, MS_CHAT_OUTPUT_END);
            last_user = 0;
            is_tool = 1;
        } else {
            rc = ms_err(e, MS_EINVAL,
                        "messages[%zu].role must be system, developer, user, assistant or tool", i);
            goto out;
        }
    }
    if (o->add_generation_prompt && last_user && !is_tool) {
        sb_add(&b, MS_CHAT_ASSISTANT);
        sb_add(&b, think_tag);
    }
    if (b.oom || tmp.oom) {
        rc = ms_err(e, MS_ENOMEM, "out of memory rendering the prompt");
        goto out;
    }
    *out = b.s;
    *out_len = b.n;
    b.s = NULL;
out:
    free(b.s);
    free(tmp.s);
    return rc;
}

/* ------------------------------------------------------------ parser */

enum { ST_CONTENT, ST_CALLS, ST_NAME, ST_ARGS, ST_DONE };

int ms_chat_parser_init(ms_chat_parser *p, int separate_reasoning, int starts_in_reasoning,
                        int tools)
{
    memset(p, 0, sizeof *p);
    p->in_reasoning = separate_reasoning && starts_in_reasoning;
    p->saw_think_start = !separate_reasoning; /* without separation <think> stays in content */
    p->tools = tools;
    p->state = ST_CONTENT;
    p->all_calls = json_array();
    return p->all_calls ? 0 : MS_ENOMEM;
}

void ms_chat_parser_deinit(ms_chat_parser *p)
{
    if (!p) return;
    free(p->hold);
    free(p->reasoning);
    free(p->content);
    free(p->inv);
    json_decref(p->all_calls);
    memset(p, 0, sizeof *p);
}

void ms_chat_delta_clear(ms_chat_delta *d)
{
    free(d->reasoning);
    free(d->content);
    json_decref(d->tool_calls);
    memset(d, 0, sizeof *d);
}

static void cat(char **dst, const char *s, size_t n)
{
    if (!n) return;
    size_t old = *dst ? strlen(*dst) : 0;
    char *t = realloc(*dst, old + n + 1);
    if (!t) return;
    memcpy(t + old, s, n);
    t[old + n] = 0;
    *dst = t;
}

static void acc(char **dst, size_t *len, size_t *cap, const char *s, size_t n)
{
    struct sb b = {*dst, *len, *cap, 0};
    sb_addn(&b, s, n);
    *dst = b.s;
    *len = b.n;
    *cap = b.cap;
}

void ms_chat_emit_text(ms_chat_parser *p, ms_chat_delta *d, int reasoning, const char *s, size_t n)
{
    if (!n) return;
    if (reasoning) {
        cat(&d->reasoning, s, n);
        acc(&p->reasoning, &p->n_reasoning, &p->cap_reasoning, s, n);
    } else {
        cat(&d->content, s, n);
        acc(&p->content, &p->n_content, &p->cap_content, s, n);
    }
}

static json_t *call_delta(int index)
{
    return json_pack("{s:i}", "index", index);
}

static void emit_args(ms_chat_parser *p, ms_chat_delta *d, const char *s, size_t n)
{
    if (!n || p->n_calls == 0) return;
    int idx = p->n_calls - 1;
    if (!d->tool_calls) d->tool_calls = json_array();
    json_t *last = json_array_get(d->tool_calls, json_array_size(d->tool_calls) - 1);
    json_t *fn;
    if (!last || json_integer_value(json_object_get(last, "index")) != idx) {
        last = call_delta(idx);
        json_object_set_new(last, "function", json_pack("{s:s%}", "arguments", s, n));
        json_array_append_new(d->tool_calls, last);
    } else if ((fn = json_object_get(last, "function"))) {
        const char *old = json_string_value(json_object_get(fn, "arguments"));
        char *joined = NULL;
        cat(&joined, old ? old : "", old ? strlen(old) : 0);
        cat(&joined, s, n);
        if (joined) json_object_set_new(fn, "arguments", json_string(joined));
        free(joined);
    }
    json_t *tot = json_object_get(json_array_get(p->all_calls, (size_t)idx), "function");
    const char *old = json_string_value(json_object_get(tot, "arguments"));
    char *joined = NULL;
    cat(&joined, old ? old : "", old ? strlen(old) : 0);
    cat(&joined, s, n);
    if (joined && tot) json_object_set_new(tot, "arguments", json_string(joined));
    free(joined);
}

void ms_chat_emit_call(ms_chat_parser *p, ms_chat_delta *d, const char *name, size_t n_name,
                       const char *args)
{
    char id[48];
    snprintf(id, sizeof id, "call_%d", p->n_calls);
    json_t *full = json_pack("{s:s,s:s,s:{s:s%,s:s}}", "id", id, "type", "function", "function",
                             "name", name, n_name, "arguments", args);
    if (!full) { /* a name that is not valid UTF-8 */
        full = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name",
                         "", "arguments", args);
    }
    json_t *delta = json_deep_copy(full);
    json_object_set_new(delta, "index", json_integer(p->n_calls));
    if (!d->tool_calls) d->tool_calls = json_array();
    json_array_append_new(d->tool_calls, delta);
    json_array_append_new(p->all_calls, full);
    p->n_calls++;
}

/* Longest suffix of s[0..n) that is a proper prefix of marker m. */
static size_t partial(const char *s, size_t n, const char *m)
{
    size_t lm = strlen(m);
    for (size_t k = lm - 1 < n ? lm - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

int ms_chat_find_first(const char *s, size_t n, const char *const *ms, int nm, size_t *at)
{
    int best = -1;
    for (int i = 0; i < nm; i++) {
        const char *h = memmem(s, n, ms[i], strlen(ms[i]));
        if (h && (best < 0 || (size_t)(h - s) < *at)) {
            best = i;
            *at = (size_t)(h - s);
        }
    }
    return best;
}

size_t ms_chat_hold_len(const char *s, size_t n, const char *const *ms, int nm)
{
    size_t h = 0;
    for (int i = 0; i < nm; i++) {
        size_t k = partial(s, n, ms[i]);
        if (k > h) h = k;
    }
    return h;
}

/* Emitted text ends on a whole UTF-8 character (JSON strings need them). */
static size_t whole(const char *s, size_t n)
{
    return ms_utf8_complete_prefix(s, n);
}

int ms_chat_parser_feed(ms_chat_parser *p, const char *text, size_t n, int last, ms_chat_delta *d)
{
    memset(d, 0, sizeof *d);
    struct sb b = {p->hold, p->n_hold, p->cap_hold, 0};
    sb_addn(&b, text, n);
    if (b.oom) return MS_ENOMEM;
    p->hold = b.s;
    p->n_hold = b.n;
    p->cap_hold = b.cap;
    const char *s = p->hold ? p->hold : "";
    size_t len = p->n_hold, pos = 0;
    for (;;) {
        const char *cur = s + pos;
        size_t rem = len - pos, at = 0;
        if (p->in_reasoning) {
            if (!p->saw_think_start) { /* a leading <think> is dropped */
                if (rem < strlen(MS_CHAT_THINK) && !memcmp(cur, MS_CHAT_THINK, rem) && !last) break;
                if (rem >= strlen(MS_CHAT_THINK) &&
                    !memcmp(cur, MS_CHAT_THINK, strlen(MS_CHAT_THINK)))
                    pos += strlen(MS_CHAT_THINK);
                p->saw_think_start = 1;
                continue;
            }
            const char *ms[] = {MS_CHAT_THINK_END};
            if (ms_chat_find_first(cur, rem, ms, 1, &at) >= 0) {
                ms_chat_emit_text(p, d, 1, cur, at);
                pos += at + strlen(MS_CHAT_THINK_END);
                p->in_reasoning = 0;
                continue;
            }
            size_t ok = last ? rem : whole(cur, rem - ms_chat_hold_len(cur, rem, ms, 1));
            ms_chat_emit_text(p, d, 1, cur, ok);
            pos += ok;
            break;
        }
        if (p->tools == MS_TOOLS_DSML) {
            int more = 0;
            pos += ms_chat_dsml_step(p, cur, rem, last, d, &more);
            if (more) continue;
            break;
        }
        if (p->state == ST_CONTENT || p->state == ST_DONE) {
            if (!p->tools || p->state == ST_DONE || p->n_calls >= MS_CHAT_MAX_TOOL_CALLS) {
                size_t ok = last ? rem : whole(cur, rem);
                ms_chat_emit_text(p, d, 0, cur, ok);
                pos += ok;
                break;
            }
            const char *ms[] = {MS_CHAT_CALLS_BEGIN, MS_CHAT_CALL_BEGIN};
            int k = ms_chat_find_first(cur, rem, ms, 2, &at);
            if (k >= 0) {
                ms_chat_emit_text(p, d, 0, cur, at);
                pos += at + strlen(ms[k]);
                p->state = k == 0 ? ST_CALLS : ST_NAME;
                p->n_name = 0;
                continue;
            }
            size_t ok = last ? rem : whole(cur, rem - ms_chat_hold_len(cur, rem, ms, 2));
            ms_chat_emit_text(p, d, 0, cur, ok);
            pos += ok;
            break;
        }
        if (p->state == ST_CALLS) {
            const char *ms[] = {MS_CHAT_CALL_BEGIN, MS_CHAT_CALLS_END};
            int k = ms_chat_find_first(cur, rem, ms, 2, &at);
            if (k >= 0) { /* text between calls is dropped, as the reference parsers do */
                pos += at + strlen(ms[k]);
                p->state = k == 0 ? ST_NAME : ST_DONE;
                p->n_name = 0;
                continue;
            }
            pos += rem - (last ? rem : ms_chat_hold_len(cur, rem, ms, 2));
            break;
        }
        if (p->state == ST_NAME) {
            const char *ms[] = {MS_CHAT_SEP};
            int k = ms_chat_find_first(cur, rem, ms, 1, &at);
            size_t take = k >= 0 ? at : rem - (last ? 0 : ms_chat_hold_len(cur, rem, ms, 1));
            for (size_t j = 0; j < take && p->n_name < MS_CHAT_MAX_TOOL_NAME; j++)
                p->name[p->n_name++] = cur[j];
            p->name[p->n_name] = 0;
            if (k < 0) {
                pos += take;
                break;
            }
            pos += at + strlen(MS_CHAT_SEP);
            ms_chat_emit_call(p, d, p->name, p->n_name, "");
            p->state = ST_ARGS;
            continue;
        }
        if (p->state == ST_ARGS) {
            const char *ms[] = {MS_CHAT_CALL_END, MS_CHAT_CALLS_END};
            int k = ms_chat_find_first(cur, rem, ms, 2, &at);
            if (k >= 0) {
                emit_args(p, d, cur, at);
                pos += at + strlen(ms[k]);
                p->state = k == 0 ? ST_CALLS : ST_DONE;
                continue;
            }
            size_t ok = last ? rem : whole(cur, rem - ms_chat_hold_len(cur, rem, ms, 2));
            emit_args(p, d, cur, ok);
            pos += ok;
            break;
        }
        break;
    }
    if (p->hold) {
        memmove(p->hold, s + pos, len - pos);
        p->hold[len - pos] = 0;
    }
    p->n_hold = len - pos;
    return 0;
}
