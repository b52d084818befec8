/* chat_v4.c — DeepSeek-V4's chat format (chat.h ms_chat_render_v4): the rules
 * of encode_messages in the release's encoding/encoding_dsv4.py, written anew
 * in C, with SGLang's serving steps before it (an empty system message first
 * when there is none, the request's tools on it, and, with
 * add_generation_prompt, a trailing assistant message sent as a user turn;
 * without it a finished conversation renders as the release's fixtures).
 *
 *   BOS [effort prefix] system [\n\n## Tools…] <｜latest_reminder｜>…
 *   <｜User｜>text\n\n<tool_result>…</tool_result> <｜Assistant｜></think>|<think>
 *   [reasoning</think>]content[\n\n<｜DSML｜tool_calls>…</｜DSML｜tool_calls>]<｜end▁of▁sentence｜>
 *
 * Tool messages merge into the user turn before them (results sorted by the
 * order of the calls); in thinking mode earlier turns' reasoning (and earlier
 * developer turns) are dropped unless some message carries tools; the
 * reasoning-effort prefix "max" opens the prompt in thinking mode ("high" adds
 * nothing).  Internal quick-instruction tasks are not offered.
 * No shared state: any thread.
 */
#include "serve/chat_priv.h"

#include <stdio.h>

enum { R_SYSTEM, R_DEVELOPER, R_USER, R_ASSISTANT, R_REMINDER };

typedef struct block {
    int tool;       /* 1: a tool result */
    char *text;     /* malloc'ed */
    const char *id; /* tool_call_id (borrowed), or NULL */
} block;

typedef struct v4msg {
    int role;
    char *content;       /* malloc'ed ("" when absent) */
    char *reasoning;     /* malloc'ed or NULL */
    const json_t *calls; /* assistant tool_calls (borrowed) or NULL */
    const json_t *tools; /* tool definitions on this message (borrowed) or NULL */
    block *blocks;       /* user turns: text and tool-result blocks */
    int n_blocks, cap_blocks;
    int keep; /* 0: dropped (earlier developer turns in thinking mode) */
} v4msg;

/* The release's prompt texts (encoding_dsv4.py REASONING_EFFORT_MAX, TOOLS_TEMPLATE). */
static const char EFFORT_MAX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is "
    "left unchecked.\n\n";

static const char TOOLS_HEAD[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    "invoke tools by writing a \"" MS_CHAT_DSML_CALLS
    "\" block like the following:\n\n" MS_CHAT_DSML_CALLS "\n" MS_CHAT_DSML_INVOKE
    " name=\"$TOOL_NAME\">\n" MS_CHAT_DSML_PARAM
    " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE" MS_CHAT_DSML_PARAM_END
    "\n...\n" MS_CHAT_DSML_INVOKE_END "\n" MS_CHAT_DSML_INVOKE
    " name=\"$TOOL_NAME2\">\n...\n" MS_CHAT_DSML_INVOKE_END "\n" MS_CHAT_DSML_CALLS_END "\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " MS_CHAT_THINK "), you MUST output your complete "
    "reasoning inside " MS_CHAT_THINK "..." MS_CHAT_THINK_END
    " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " MS_CHAT_THINK_END
    " with tool calls or final response.\n\n### Available Tool Schemas\n\n";
static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";

/* Python's json.dumps(ensure_ascii=False): ", " and ": ", UTF-8 as is. */
static void add_json(struct sb *b, const json_t *v)
{
    char *j = json_dumps(v, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!j) {
        b->oom = 1;
        return;
    }
    sb_add(b, j);
    free(j);
}

static int render_tools(const json_t *tools, size_t idx, struct sb *b, ms_errbuf *e)
{
    if (!json_is_array(tools)) return ms_err(e, MS_EINVAL, "tools must be an array");
    if (json_array_size(tools) > MS_CHAT_MAX_TOOLS)
        return ms_err(e, MS_EINVAL, "tools: at most %d tools", MS_CHAT_MAX_TOOLS);
    sb_add(b, TOOLS_HEAD);
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
            return idx == (size_t)-1
                       ? ms_err(e, MS_EINVAL, "tools[%zu].function.name must be a string", i)
                       : ms_err(e, MS_EINVAL,
                                "messages[%zu].tools[%zu].function.name must be a string", idx, i);
        if (i) sb_add(b, "\n");
        add_json(b, fn);
    }
    sb_add(b, TOOLS_TAIL);
    return 0;
}

/* One call's arguments as DSML parameters: the JSON object's members in order,
 * strings as is (string="true"), other values as JSON (string="false"); text
 * that is not a JSON object is the one parameter "arguments". */
static void render_params(const json_t *args, struct sb *b)
{
    json_t *obj = NULL;
    if (json_is_string(args)) {
        obj = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (!json_is_object(obj)) {
            json_decref(obj);
            obj = json_pack("{s:O}", "arguments", args);
        }
    } else if (json_is_object(args)) {
        obj = json_incref((json_t *)args);
    }
    const char *k;
    json_t *v;
    int first = 1;
    json_object_foreach(obj, k, v)
    {
        if (!first) sb_add(b, "\n");
        first = 0;
        sb_add(b, MS_CHAT_DSML_PARAM " name=\"");
        sb_add(b, k);
        sb_add(b, json_is_string(v) ? "\" string=\"true\">" : "\" string=\"false\">");
        if (json_is_string(v))
            sb_addn(b, json_string_value(v), json_string_length(v));
        else
            add_json(b, v);
        sb_add(b, MS_CHAT_DSML_PARAM_END);
    }
    json_decref(obj);
}

/* calls: checked when the message was read (ms_chat_check_calls) */
static void render_calls(const json_t *calls, struct sb *b)
{
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c)
    {
        const json_t *fn = json_object_get(c, "function");
        const json_t *name = json_object_get(fn, "name");
        sb_add(b, i ? "\n" : "\n\n" MS_CHAT_DSML_CALLS "\n");
        sb_add(b, MS_CHAT_DSML_INVOKE " name=\"");
        sb_add(b, json_string_value(name));
        sb_add(b, "\">\n");
        render_params(json_object_get(fn, "arguments"), b);
        sb_add(b, "\n" MS_CHAT_DSML_INVOKE_END);
    }
    if (json_array_size(calls)) sb_add(b, "\n" MS_CHAT_DSML_CALLS_END);
}

static void msgs_free(v4msg *m, int n)
{
    for (int i = 0; i < n; i++) {
        free(m[i].content);
        free(m[i].reasoning);
        for (int j = 0; j < m[i].n_blocks; j++) free(m[i].blocks[j].text);
        free(m[i].blocks);
    }
    free(m);
}

static int add_block(v4msg *m, int tool, char *text, const char *id)
{
    if (m->n_blocks == m->cap_blocks) {
        int cap = m->cap_blocks ? 2 * m->cap_blocks : 4;
        block *t = realloc(m->blocks, (size_t)cap * sizeof *t);
        if (!t) {
            free(text);
            return MS_ENOMEM;
        }
        m->blocks = t;
        m->cap_blocks = cap;
    }
    m->blocks[m->n_blocks++] = (block){tool, text, id};
    return 0;
}

static char *text_of(const json_t *c, size_t idx, int *rc, ms_errbuf *e)
{
    struct sb t = {0};
    if ((*rc = ms_chat_content_text(c, idx, &t, e))) {
        free(t.s);
        return NULL;
    }
    sb_addn(&t, "", 0);
    char *s = t.oom ? NULL : t.s ? t.s : strdup("");
    if (!s) *rc = ms_err(e, MS_ENOMEM, "out of memory rendering the prompt");
    return s;
}

/* The conversation after SGLang's steps and the release's merge of tool
 * results into user turns; *n_out messages. */
static int preprocess(const json_t *messages, const json_t *tools, int gen_prompt, v4msg **out,
                      int *n_out, ms_errbuf *e)
{
    size_t n_in = json_array_size(messages);
    v4msg *m = calloc(n_in + 1, sizeof *m);
    if (!m) return ms_err(e, MS_ENOMEM, "out of memory rendering the prompt");
    int n = 0, rc = 0;
    size_t i;
    const json_t *msg;
    json_array_foreach(messages, i, msg)
    {
        const json_t *role = json_object_get(msg, "role");
        if (!json_is_object(msg) || !json_is_string(role)) {
            rc = ms_err(e, MS_EINVAL, "messages[%zu].role must be a string", i);
            goto fail;
        }
        const char *r = json_string_value(role);
        int ri = !strcmp(r, "system")            ? R_SYSTEM
                 : !strcmp(r, "developer")       ? R_DEVELOPER
                 : !strcmp(r, "user")            ? R_USER
                 : !strcmp(r, "assistant")       ? R_ASSISTANT
                 : !strcmp(r, "latest_reminder") ? R_REMINDER
                 : !strcmp(r, "tool")            ? -2
                                                 : -1;
        if (ri == -1) {
            rc = ms_err(e, MS_EINVAL,
                        "messages[%zu].role must be system, developer, user, assistant, tool or "
                        "latest_reminder",
                        i);
            goto fail;
        }
        char *text = text_of(json_object_get(msg, "content"), i, &rc, e);
        if (!text) goto fail;
        /* SGLang: a trailing assistant message (no continue_final_message) is a user turn */
        if (ri == R_ASSISTANT && i + 1 == n_in && gen_prompt) ri = R_USER;
        if (ri == -2 || ri == R_USER) { /* merge_tool_messages */
            const json_t *id = json_object_get(msg, "tool_call_id");
            if (n > 0 && m[n - 1].role == R_USER) {
                if ((rc = add_block(&m[n - 1], ri == -2, text, json_string_value(id)))) goto oom;
                continue;
            }
            m[n].role = R_USER;
            m[n].content = strdup("");
            m[n].keep = 1;
            if (!m[n].content) {
                free(text);
                goto oom;
            }
            if ((rc = add_block(&m[n++], ri == -2, text, json_string_value(id)))) goto oom;
            continue;
        }
        v4msg *o = &m[n++];
        o->role = ri;
        o->content = text;
        o->keep = 1;
        const json_t *rs = json_object_get(msg, "reasoning_content");
        if (rs && !json_is_null(rs) && !json_is_string(rs)) {
            rc = ms_err(e, MS_EINVAL, "messages[%zu].reasoning_content must be a string", i);
            goto fail;
        }
        if (ri == R_ASSISTANT && json_is_string(rs) &&
            !(o->reasoning = strdup(json_string_value(rs))))
            goto oom;
        const json_t *calls = json_object_get(msg, "tool_calls");
        if (ri == R_ASSISTANT && calls && !json_is_null(calls)) {
            if ((rc = ms_chat_check_calls(calls, i, e))) goto fail;
            o->calls = calls;
        }
        const json_t *mt = json_object_get(msg, "tools");
        if (mt && !json_is_null(mt)) o->tools = mt;
        if (ri == R_DEVELOPER && !*text) {
            rc = ms_err(e, MS_EINVAL, "messages[%zu]: a developer message needs content", i);
            goto fail;
        }
    }
    if (n == 0 || m[0].role != R_SYSTEM) { /* SGLang: an empty system turn carries the tools */
        memmove(m + 1, m, (size_t)n * sizeof *m);
        memset(m, 0, sizeof *m);
        m[0].role = R_SYSTEM;
        m[0].keep = 1;
        if (!(m[0].content = strdup(""))) {
            n++;
            goto oom;
        }
        n++;
    }
    if (tools && json_is_array(tools) && json_array_size(tools)) m[0].tools = tools;
    /* sort_tool_results_by_call_order: results follow the order of the last calls */
    const json_t *order = NULL;
    for (int k = 0; k < n; k++) {
        if (m[k].role == R_ASSISTANT && json_array_size(m[k].calls)) order = m[k].calls;
        if (m[k].role != R_USER || !order) continue;
        int n_tool = 0;
        for (int j = 0; j < m[k].n_blocks; j++) n_tool += m[k].blocks[j].tool;
        if (n_tool < 2) continue;
        block *tb = malloc((size_t)n_tool * sizeof *tb);
        int *key = malloc((size_t)n_tool * sizeof *key);
        if (!tb || !key) {
            free(tb);
            free(key);
            goto oom;
        }
        int t = 0;
        for (int j = 0; j < m[k].n_blocks; j++) {
            if (!m[k].blocks[j].tool) continue;
            key[t] = 0; /* an id not among the calls sorts as the first call */
            size_t ci;
            const json_t *c;
            json_array_foreach(order, ci, c)
            {
                const char *cid = json_string_value(json_object_get(c, "id"));
                if (!cid)
                    cid = json_string_value(json_object_get(json_object_get(c, "function"), "id"));
                if (cid && *cid && m[k].blocks[j].id && !strcmp(cid, m[k].blocks[j].id)) {
                    key[t] = (int)ci;
                    break;
                }
            }
            tb[t++] = m[k].blocks[j];
        }
        for (int a = 1; a < n_tool; a++) /* stable insertion sort */
            for (int b2 = a; b2 > 0 && key[b2 - 1] > key[b2]; b2--) {
                block x = tb[b2];
                tb[b2] = tb[b2 - 1];
                tb[b2 - 1] = x;
                int y = key[b2];
                key[b2] = key[b2 - 1];
                key[b2 - 1] = y;
            }
        t = 0;
        for (int j = 0; j < m[k].n_blocks; j++)
            if (m[k].blocks[j].tool) m[k].blocks[j] = tb[t++];
        free(tb);
        free(key);
    }
    *out = m;
    *n_out = n;
    return 0;
oom:
    rc = ms_err(e, MS_ENOMEM, "out of memory rendering the prompt");
fail:
    msgs_free(m, n);
    return rc;
}

static int last_user(const v4msg *m, int n)
{
    for (int i = n - 1; i >= 0; i--)
        if (m[i].keep && (m[i].role == R_USER || m[i].role == R_DEVELOPER)) return i;
    return -1;
}

int ms_chat_render_v4(const json_t *messages, const json_t *tools, const ms_chat_opts *o,
                      char **out, size_t *out_len, ms_errbuf *e)
{
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return ms_err(e, MS_EINVAL, "messages must be a non-empty array");
    if (json_array_size(messages) > MS_CHAT_MAX_MESSAGES)
        return ms_err(e, MS_EINVAL, "messages: at most %d messages", MS_CHAT_MAX_MESSAGES);
    v4msg *m = NULL;
    int n = 0, rc;
    if ((rc = preprocess(messages, tools, o->add_generation_prompt, &m, &n, e))) return rc;
    int thinking = o->thinking == 1;
    int drop = 1; /* earlier reasoning is dropped unless some message carries tools */
    for (int i = 0; i < n; i++)
        if (json_array_size(m[i].tools)) drop = 0;
    if (thinking && drop) { /* _drop_thinking_messages */
        int lu = last_user(m, n);
        for (int i = 0; i < lu; i++) {
            if (m[i].role == R_ASSISTANT) {
                free(m[i].reasoning);
                m[i].reasoning = NULL;
            } else if (m[i].role == R_DEVELOPER) {
                m[i].keep = 0;
            }
        }
    }
    int lu = last_user(m, n);
    struct sb b = {0};
    sb_add(&b, MS_CHAT_BOS);
    int first = 1;
    for (int i = 0; i < n && !rc; i++) {
        const v4msg *x = &m[i];
        if (!x->keep) continue;
        if (first && thinking && o->effort == MS_CHAT_EFFORT_MAX) sb_add(&b, EFFORT_MAX);
        first = 0;
        switch (x->role) {
        case R_SYSTEM:
            sb_add(&b, x->content);
            if (json_array_size(x->tools)) {
                sb_add(&b, "\n\n");
                rc = render_tools(x->tools, x->tools == tools ? (size_t)-1 : (size_t)i, &b, e);
            }
            break;
        case R_DEVELOPER:
            sb_add(&b, MS_CHAT_USER);
            sb_add(&b, x->content);
            if (json_array_size(x->tools)) {
                sb_add(&b, "\n\n");
                rc = render_tools(x->tools, (size_t)i, &b, e);
            }
            break;
        case R_USER:
            sb_add(&b, MS_CHAT_USER);
            for (int j = 0; j < x->n_blocks; j++) {
                if (j) sb_add(&b, "\n\n");
                if (x->blocks[j].tool) sb_add(&b, "<tool_result>");
                sb_add(&b, x->blocks[j].text);
                if (x->blocks[j].tool) sb_add(&b, "</tool_result>");
            }
            break;
        case R_REMINDER:
            sb_add(&b, MS_CHAT_LATEST_REMINDER);
            sb_add(&b, x->content);
            break;
        default: /* R_ASSISTANT: [reasoning</think>]content[tool calls]EOS */
            if (thinking && (!drop || i > lu)) {
                if (x->reasoning) sb_add(&b, x->reasoning);
                sb_add(&b, MS_CHAT_THINK_END);
            }
            sb_add(&b, x->content);
            if (x->calls) render_calls(x->calls, &b);
            sb_add(&b, MS_CHAT_EOS);
            break;
        }
        /* the transition: a user or developer turn followed by an assistant or
         * reminder turn, or ending the conversation, opens the assistant's */
        int next = i + 1;
        while (next < n && !m[next].keep) next++;
        if (next < n && m[next].role != R_ASSISTANT && m[next].role != R_REMINDER) continue;
        if (x->role != R_USER && x->role != R_DEVELOPER) continue;
        sb_add(&b, MS_CHAT_ASSISTANT);
        sb_add(&b, thinking && (!drop || i >= lu) ? MS_CHAT_THINK : MS_CHAT_THINK_END);
    }
    msgs_free(m, n);
    if (!rc && b.oom) rc = ms_err(e, MS_ENOMEM, "out of memory rendering the prompt");
    if (rc) {
        free(b.s);
        return rc;
    }
    *out = b.s;
    *out_len = b.n;
    return 0;
}
