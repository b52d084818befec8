/* chat_dsml.c — DeepSeek-V4's DSML tool calls in generated text (chat.h,
 * --tool-call-parser deepseekv4), read incrementally:
 *
 *   content  \n\n<｜DSML｜tool_calls>
 *   <｜DSML｜invoke name="NAME">
 *   <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>
 *   </｜DSML｜invoke>
 *   </｜DSML｜tool_calls>
 *
 * SGLang's deepseekv4 detector's semantics: a call is emitted whole (name and
 * arguments in one delta) when its </｜DSML｜invoke> arrives; string="true"
 * values are strings, others JSON (kept as a string when they do not parse);
 * values are stripped of surrounding whitespace; an invoke whose body is a
 * JSON object takes that object as its arguments; arguments are serialised as
 * Python's json.dumps does (", " and ": ", UTF-8 unescaped).  The whitespace
 * just before a block is not content.  A bare <｜DSML｜invoke outside a block
 * starts a call too; an invoke cut off by the end of generation is dropped.
 * No shared state: one parser per stream.
 */
#include "serve/chat_priv.h"

#include "serve/detok.h"

#include <ctype.h>
#include <stdio.h>

enum { DS_CONTENT = 0, DS_BLOCK, DS_INVOKE };

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && isspace((unsigned char)s[i])) i++;
    return i;
}

/* Reads `key="VALUE"` at s[*i..n) (after optional whitespace); VALUE has no '"'. */
static int attr(const char *s, size_t n, size_t *i, const char *key, const char **v, size_t *nv)
{
    size_t k = skip_ws(s, *i, n), kl = strlen(key);
    if (n - k < kl + 2 || memcmp(s + k, key, kl) || s[k + kl] != '=' || s[k + kl + 1] != '"')
        return -1;
    k += kl + 2;
    const char *q = memchr(s + k, '"', n - k);
    if (!q || q == s + k) return -1;
    *v = s + k;
    *nv = (size_t)(q - (s + k));
    *i = (size_t)(q - s) + 1;
    return 0;
}

/* Trims whitespace at both ends of s[0..*n); returns the new start. */
static const char *trim(const char *s, size_t *n)
{
    size_t b = skip_ws(s, 0, *n), e = *n;
    while (e > b && isspace((unsigned char)s[e - 1])) e--;
    *n = e - b;
    return s + b;
}

/* A parameter value: string="true" text, else a JSON value or (unparsable) text. */
static json_t *param_value(const char *v, size_t nv, int is_string)
{
    v = trim(v, &nv);
    if (!is_string) {
        json_t *j = json_loadb(v, nv, JSON_DECODE_ANY, NULL);
        if (j) return j;
    }
    json_t *t = json_stringn(v, nv);
    return t ? t : json_string("");
}

/* Parses one invoke (the text after "<｜DSML｜invoke" up to its end tag) and
 * emits it as a call; a malformed head emits nothing. */
static void emit_invoke(ms_chat_parser *p, ms_chat_delta *d, const char *s, size_t n)
{
    size_t i = 0, nn = 0;
    const char *name = NULL;
    if (attr(s, n, &i, "name", &name, &nn)) return;
    i = skip_ws(s, i, n);
    if (i >= n || s[i] != '>') return;
    i++;
    json_t *args = NULL;
    size_t nb = n - i;
    const char *body = trim(s + i, &nb);
    if (nb >= 2 && body[0] == '{' && body[nb - 1] == '}') {
        args = json_loadb(body, nb, 0, NULL);
        if (args && !json_is_object(args)) {
            json_decref(args);
            args = NULL;
        }
    }
    if (!args) {
        args = json_object();
        const char *const pm[] = {MS_CHAT_DSML_PARAM};
        const char *const pe[] = {MS_CHAT_DSML_PARAM_END};
        size_t at = 0;
        while (args && ms_chat_find_first(s + i, n - i, pm, 1, &at) >= 0) {
            i += at + strlen(MS_CHAT_DSML_PARAM);
            const char *k = NULL, *isstr = NULL;
            size_t nk = 0, ns = 0;
            if (attr(s, n, &i, "name", &k, &nk) || attr(s, n, &i, "string", &isstr, &ns)) break;
            i = skip_ws(s, i, n);
            if (i >= n || s[i] != '>') break;
            i++;
            if (ms_chat_find_first(s + i, n - i, pe, 1, &at) < 0) break;
            char key[MS_CHAT_MAX_TOOL_NAME + 1];
            snprintf(key, sizeof key, "%.*s",
                     (int)(nk < MS_CHAT_MAX_TOOL_NAME ? nk : MS_CHAT_MAX_TOOL_NAME), k);
            /* a repeated name keeps the last value; a key that is not UTF-8 is dropped */
            json_object_set_new(args, key,
                                param_value(s + i, at, ns == 4 && !memcmp(isstr, "true", 4)));
            i += at + strlen(MS_CHAT_DSML_PARAM_END);
        }
    }
    /* Python json.dumps: ", " and ": " separators, non-ASCII unescaped */
    char *aj = args ? json_dumps(args, JSON_PRESERVE_ORDER) : NULL;
    json_decref(args);
    ms_chat_emit_call(p, d, name, nn < MS_CHAT_MAX_TOOL_NAME ? nn : MS_CHAT_MAX_TOOL_NAME,
                      aj ? aj : "{}");
    free(aj);
}

static void inv_add(ms_chat_parser *p, const char *s, size_t n)
{
    struct sb b = {p->inv, p->n_inv, p->cap_inv, 0};
    sb_addn(&b, s, n);
    p->inv = b.s;
    p->n_inv = b.n;
    p->cap_inv = b.cap;
}

size_t ms_chat_dsml_step(ms_chat_parser *p, const char *cur, size_t rem, int last, ms_chat_delta *d,
                         int *more)
{
    size_t at = 0;
    *more = 0;
    if (p->state == DS_CONTENT) {
        const char *const ms[] = {MS_CHAT_DSML_CALLS, MS_CHAT_DSML_INVOKE};
        int k = p->n_calls < MS_CHAT_MAX_TOOL_CALLS ? ms_chat_find_first(cur, rem, ms, 2, &at) : -1;
        if (k >= 0) {
            size_t keep = at;
            while (keep > 0 && isspace((unsigned char)cur[keep - 1])) keep--;
            ms_chat_emit_text(p, d, 0, cur, keep);
            p->state = k == 0 ? DS_BLOCK : DS_INVOKE;
            p->n_inv = 0;
            *more = 1;
            return at + strlen(ms[k]);
        }
        if (last) {
            ms_chat_emit_text(p, d, 0, cur, rem);
            return rem;
        }
        size_t ok = rem - ms_chat_hold_len(cur, rem, ms, 2);
        while (ok > 0 && isspace((unsigned char)cur[ok - 1])) ok--; /* may precede a block */
        ok = ms_utf8_complete_prefix(cur, ok);
        ms_chat_emit_text(p, d, 0, cur, ok);
        return ok;
    }
    if (p->state == DS_BLOCK) { /* between invokes: only layout, dropped */
        const char *const ms[] = {MS_CHAT_DSML_INVOKE, MS_CHAT_DSML_CALLS_END};
        int k = ms_chat_find_first(cur, rem, ms, 2, &at);
        if (k >= 0) {
            p->state = k == 0 ? DS_INVOKE : DS_CONTENT;
            p->n_inv = 0;
            *more = 1;
            return at + strlen(ms[k]);
        }
        return last ? rem : rem - ms_chat_hold_len(cur, rem, ms, 2);
    }
    /* DS_INVOKE */
    const char *const ms[] = {MS_CHAT_DSML_INVOKE_END};
    if (ms_chat_find_first(cur, rem, ms, 1, &at) >= 0) {
        inv_add(p, cur, at);
        if (p->n_calls < MS_CHAT_MAX_TOOL_CALLS) emit_invoke(p, d, p->inv ? p->inv : "", p->n_inv);
        p->n_inv = 0;
        p->state = DS_BLOCK;
        *more = 1;
        return at + strlen(MS_CHAT_DSML_INVOKE_END);
    }
    size_t take = last ? rem : rem - ms_chat_hold_len(cur, rem, ms, 1);
    inv_add(p, cur, take); /* an invoke cut off at the end is dropped, as SGLang's */
    return take;
}
